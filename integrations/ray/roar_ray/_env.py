"""What the driver hook, the runtime_env plugin and the worker hook share: the names of
the variables they pass each other, the `"roar"` settings, and the environment that
registers the plugin.  Imported by Ray's runtime-env agent: keep it light (no Ray import).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from roar_core import config

PLUGIN_CLASS = "roar_ray.RoarPlugin"
ENV_HOOK = "roar_ray.runtime_env_hook"
WORKER_HOOK = "roar_ray.worker.setup"

RAY_PLUGINS_VAR = "RAY_RUNTIME_ENV_PLUGINS"  # read by each node's runtime-env agent at start
RAY_ENV_HOOK_VAR = "RAY_RUNTIME_ENV_HOOK"  # read by ray.init in the driver
RAY_SETUP_HOOK_VAR = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"  # Ray's worker_process_setup_hook

# Ours.  Not ROAR_*: those are roar configuration keys, and unknown ones are an error.
JOB_VAR = "_ROAR_RAY_JOB"  # the job's lineage context (JSON), set by the driver hook
SETTINGS_VAR = "_ROAR_RAY_SETTINGS"  # runtime_env["roar"] of the task or actor (JSON)
PLUGIN_VAR = "_ROAR_RAY_PLUGIN"  # set by the plugin: the node id it ran on
HOOKED_VAR = "_ROAR_RAY_HOOKED"  # the driver hook already chained the user's setup hook
USER_HOOK_VAR = "_ROAR_RAY_USER_HOOK"  # the user's own worker_process_setup_hook
NEXT_ENV_HOOK_VAR = "_ROAR_RAY_NEXT_ENV_HOOK"  # a RAY_RUNTIME_ENV_HOOK that was there before

KV_NAMESPACE = "roar"  # Ray internal KV: "<job run id>:<child task id>" -> parent run id
RAY_KEYS = ("job_name",)  # settings of this integration, beside roar's configuration keys
CONFIG_KEYS = config.KEYS
DOCS = "integrations/ray/README.md"


def check_settings(value: Any) -> dict[str, Any]:
    """runtime_env["roar"]: None or {} for the defaults, else roar configuration keys
    (home, database_url, namespace, include, exclude, ...) and `job_name`."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f'runtime_env["roar"] must be a dict, got {type(value).__name__}')
    for key in value:
        if key not in CONFIG_KEYS and key not in RAY_KEYS:
            valid = ", ".join(sorted(CONFIG_KEYS + RAY_KEYS))
            raise ValueError(f'runtime_env["roar"]: unknown key {key!r} (valid keys: {valid})')
    return dict(value)


def load_config(settings: dict[str, Any], job: dict[str, Any] | None) -> config.Config:
    """The configuration a worker records with: the job's, resolved by the driver, with
    this task's or actor's settings on top (no job context: resolved here)."""
    values = dict(job["config"]) if job else {}
    values.update({k: v for k, v in settings.items() if k not in RAY_KEYS})
    if job:
        return config.load(cwd=Path(job["root"]), env={}, **values)
    return config.load(**values)


def job_context(env: dict[str, str] | os._Environ) -> dict[str, Any] | None:
    raw = env.get(JOB_VAR)
    return json.loads(raw) if raw else None


def session_dir(cfg: config.Config, job: dict[str, Any] | None, node_id: str) -> Path:
    """Where a node's workers of one job log: one directory per job and node."""
    return Path(cfg.sessions_dir, f"ray-{job['run_id'] if job else 'nojob'}", node_id)


def plugins_value(existing: str | None) -> str:
    """RAY_RUNTIME_ENV_PLUGINS with our plugin added to whatever is registered already."""
    plugins = []
    if existing:
        try:
            plugins = json.loads(existing)
        except ValueError:
            raise ValueError(f"{RAY_PLUGINS_VAR} is not valid JSON: {existing!r}") from None
        if not isinstance(plugins, list):
            raise ValueError(f"{RAY_PLUGINS_VAR} must be a JSON list: {existing!r}")
    if not any(isinstance(p, dict) and p.get("class") == PLUGIN_CLASS for p in plugins):
        plugins.append({"class": PLUGIN_CLASS})
    return json.dumps(plugins, separators=(",", ":"))


def exports(env: dict[str, str] | os._Environ | None = None) -> dict[str, str]:
    """The variables that register roar with Ray: the plugin for the nodes started in
    this environment, and the driver hook for the drivers started in it."""
    env = os.environ if env is None else env
    out = {RAY_PLUGINS_VAR: plugins_value(env.get(RAY_PLUGINS_VAR)), RAY_ENV_HOOK_VAR: ENV_HOOK}
    previous = env.get(RAY_ENV_HOOK_VAR)
    if previous and previous != ENV_HOOK:
        out[NEXT_ENV_HOOK_VAR] = previous  # we call it first, then do our part
    return out


def shell_exports(env: dict[str, str] | os._Environ | None = None) -> str:
    """`export` lines for `eval "$(roar-core env ray)"` before `ray start` and drivers."""
    from roar_core.pipeline import tracer

    return tracer.shell_lines(exports(env))


def enable() -> None:
    """Register roar in this process, like `eval "$(roar-core env ray)"` would: a local
    cluster that `ray.init()` starts from here gets the plugin, and `ray.init` calls the
    driver hook.  Call it before `ray.init()`."""
    os.environ.update(exports())
