"""The runtime_env plugin: attaches the tracer to the workers of tasks and actors whose
runtime_env has a `"roar"` field.

It runs in each node's runtime-env agent (registered by `RAY_RUNTIME_ENV_PLUGINS`, see
`roar-core env ray`) and only edits the worker's context: the shim first in LD_PRELOAD,
the session directory, the settings, and the worker setup hook (chained in front of the
user's own).  Nothing else is ever preloaded: Ray's daemons start without it.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from ray._private.runtime_env.plugin import RuntimeEnvPlugin

from roar_core.ids import host_name
from roar_core.pipeline import tracer
from roar_ray import _env


def agent_node_id(argv: list[str] | None = None) -> str:
    """The node this agent serves: Ray passes it on the agent's command line."""
    argv = sys.argv if argv is None else argv
    for i, arg in enumerate(argv):
        if arg.startswith("--node-id="):
            return arg.split("=", 1)[1]
        if arg == "--node-id" and i + 1 < len(argv):
            return argv[i + 1]
    return host_name()


def preload_value(lib: str, existing: str | None) -> str:
    """Our shim first, then what the task asked for, else what the worker would inherit."""
    rest = existing if existing is not None else "${LD_PRELOAD}"
    rest = " ".join(p for p in rest.replace(":", " ").split() if p != lib)
    return f"{lib} {rest}".strip()


def worker_env(settings: dict[str, Any], env_vars: dict[str, str], node_id: str) -> dict[str, str]:
    """The variables to add to a worker's environment (free of Ray, for tests)."""
    job = _env.job_context(env_vars)
    cfg = _env.load_config(settings, job)
    out = {_env.PLUGIN_VAR: node_id, _env.SETTINGS_VAR: json.dumps(settings)}
    if cfg.disabled:
        return out  # the kill switch: nothing preloaded, the worker hook records nothing
    lib = tracer.library_path()
    out["LD_PRELOAD"] = preload_value(lib, env_vars.get("LD_PRELOAD"))
    session = _env.session_dir(cfg, job, node_id)
    session.mkdir(parents=True, exist_ok=True)  # the shim logs there from the worker's exec
    out[tracer.ENV_SESSION] = str(session)
    out[tracer.ENV_TAG] = ""  # workers start outside any task, whatever the raylet had
    if not env_vars.get(_env.HOOKED_VAR):
        existing = env_vars.get(_env.RAY_SETUP_HOOK_VAR)
        if existing and existing != _env.WORKER_HOOK:
            out[_env.USER_HOOK_VAR] = existing
        out[_env.RAY_SETUP_HOOK_VAR] = _env.WORKER_HOOK
    return out


class RoarPlugin(RuntimeEnvPlugin):
    name = "roar"
    # After the plugins that install code or set variables, so that we see their result.
    priority = 90

    @staticmethod
    def validate(runtime_env_dict: dict) -> None:
        _env.check_settings(runtime_env_dict.get(RoarPlugin.name))

    def modify_context(self, uris, runtime_env, context, logger: logging.Logger) -> None:
        settings = _env.check_settings(runtime_env.get(self.name))
        added = worker_env(settings, context.env_vars, agent_node_id())
        context.env_vars.update(added)
        logger.info("roar: tracing this worker (session %s)",
                    added.get(tracer.ENV_SESSION, "disabled"))
