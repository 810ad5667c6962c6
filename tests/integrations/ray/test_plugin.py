"""The plugin's context edits, the settings, and the registration exports (no cluster)."""

from __future__ import annotations

import json
import shlex

import pytest
from roar_ray import _env
from roar_ray.plugin import RoarPlugin, agent_node_id, preload_value, worker_env

from roar_core.pipeline import tracer

LIB = str(tracer.library_path())


def _job(tmp_path, **config):
    return {"run_id": "01234567-89ab-7def-8123-456789abcdef", "job_name": "etl",
            "namespace": "ns", "root": str(tmp_path),
            "config": {"home": str(tmp_path / "home"), **config}}


def test_worker_env_preloads_our_shim_first_and_sets_the_session(tmp_path):
    job = _job(tmp_path)
    env = worker_env({}, {_env.JOB_VAR: json.dumps(job)}, "node1")
    assert env["LD_PRELOAD"] == f"{LIB} ${{LD_PRELOAD}}"  # expanded by Ray at worker start
    session = tmp_path / "home" / "sessions" / f"ray-{job['run_id']}" / "node1"
    assert env[tracer.ENV_SESSION] == str(session) and session.is_dir()
    assert env[tracer.ENV_TAG] == ""
    assert env[_env.PLUGIN_VAR] == "node1"
    assert env[_env.RAY_SETUP_HOOK_VAR] == _env.WORKER_HOOK


def test_worker_env_prepends_to_the_tasks_own_ld_preload(tmp_path):
    env = worker_env({}, {_env.JOB_VAR: json.dumps(_job(tmp_path)),
                          "LD_PRELOAD": f"/opt/libjemalloc.so:{LIB}"}, "n")
    assert env["LD_PRELOAD"] == f"{LIB} /opt/libjemalloc.so"
    assert preload_value(LIB, "") == LIB


def test_worker_env_chains_the_users_setup_hook(tmp_path):
    user = "ray_runtime_env_func::abc"
    env = worker_env({}, {_env.RAY_SETUP_HOOK_VAR: user}, "n")
    assert env[_env.RAY_SETUP_HOOK_VAR] == _env.WORKER_HOOK
    assert env[_env.USER_HOOK_VAR] == user
    # The driver hook already chained it: left alone.
    env = worker_env({}, {_env.RAY_SETUP_HOOK_VAR: user, _env.HOOKED_VAR: "1"}, "n")
    assert _env.RAY_SETUP_HOOK_VAR not in env and _env.USER_HOOK_VAR not in env


def test_disabled_preloads_nothing(tmp_path):
    env = worker_env({"disabled": True}, {_env.JOB_VAR: json.dumps(_job(tmp_path))}, "n")
    assert "LD_PRELOAD" not in env and tracer.ENV_SESSION not in env


def test_settings_are_checked_by_name():
    assert _env.check_settings(None) == {}
    assert _env.check_settings({"namespace": "x", "job_name": "j"}) == {
        "namespace": "x", "job_name": "j"}
    with pytest.raises(ValueError, match="unknown key 'hom'.*valid keys: .*home"):
        RoarPlugin.validate({"roar": {"hom": "/x"}})
    with pytest.raises(ValueError, match="must be a dict"):
        _env.check_settings(["home"])


def test_agent_node_id_from_its_command_line():
    assert agent_node_id(["agent", "--node-id=abc", "--x"]) == "abc"
    assert agent_node_id(["agent", "--node-id", "def"]) == "def"


def test_shell_exports_add_the_plugin_and_chain_an_existing_hook():
    other = json.dumps([{"class": "other.Plugin", "priority": 5}])
    env = {_env.RAY_PLUGINS_VAR: other, _env.RAY_ENV_HOOK_VAR: "my.hook"}
    lines = _env.shell_exports(env).splitlines()
    exported = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1)
                    for line in lines)
    assert json.loads(exported[_env.RAY_PLUGINS_VAR]) == [
        {"class": "other.Plugin", "priority": 5}, {"class": _env.PLUGIN_CLASS}]
    assert exported[_env.RAY_ENV_HOOK_VAR] == _env.ENV_HOOK
    assert exported[_env.NEXT_ENV_HOOK_VAR] == "my.hook"
    # Idempotent: exporting again in that environment changes nothing.
    again = {**env, **exported}
    assert _env.exports(again)[_env.RAY_PLUGINS_VAR] == exported[_env.RAY_PLUGINS_VAR]
    assert _env.NEXT_ENV_HOOK_VAR not in _env.exports(again)  # still exported from before
    with pytest.raises(ValueError, match="not valid JSON"):
        _env.exports({_env.RAY_PLUGINS_VAR: "[{"})
