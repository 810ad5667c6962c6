"""Shared helpers for the tracer tests: run a real program with the preload shim and
read what it recorded.

Fixtures (no imports between test files are needed; helpers are handed out as fixtures):
  session_dir   a fresh, empty session directory (never inside a test's work dir)
  traced_run    traced_run(cmd, cwd, tag=None, *, session_dir=None, env=None, **kw)
                -> (CompletedProcess, SessionTrace); a fresh session dir per call unless
                one is given; stdout/stderr captured (bytes unless text=True is passed)
  plain_env     plain_env(root) -> a small, fixed environment with no tracer variables,
                HOME and TMPDIR under `root`, C locale, UTC
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from roar_core.pipeline import tracelog, tracer

# Variables that would change how a child is traced (or traced at all): never inherited
# from the environment pytest itself runs in (it may be running under roar).
TRACER_VARS = ("LD_PRELOAD", tracer.ENV_SESSION, tracer.ENV_TAG, tracer.ENV_TRACER_OFF,
               "ROAR_PRELOAD_LIB")


def plain_env(root: str | os.PathLike, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A deterministic environment for a child: PATH from ours, everything else fixed."""
    root = Path(root)
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(root / "home"),
        "TMPDIR": str(root / "tmp"),
        "LANG": "C",
        "LC_ALL": "C",
        "TZ": "UTC",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "GCC_COLORS": "",
        "TERM": "dumb",
    }
    for d in ("home", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    env.update(extra or {})
    for k in TRACER_VARS:
        env.pop(k, None)
    return env


def run_traced(
    cmd, cwd, session_dir, tag: str | None = None, *, env: Mapping[str, str] | None = None,
    **kw,
) -> tuple[subprocess.CompletedProcess, tracelog.SessionTrace]:
    """Run `cmd` with the shim preloaded into session_dir; return the result and the
    session's logs (read after the process tree has exited)."""
    if env is None:
        base = {k: v for k, v in os.environ.items() if k not in TRACER_VARS}
    else:
        base = dict(env)
    full_env = tracer.preload_env(session_dir, tag=tag, base=base)
    kw.setdefault("capture_output", True)
    kw.setdefault("stdin", subprocess.DEVNULL)
    kw.setdefault("timeout", 120)
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, **kw)
    return proc, tracelog.read_session(session_dir)


def all_records(trace: tracelog.SessionTrace) -> list[tracelog.Record]:
    return [r for log in trace.logs for r in log.records]


@pytest.fixture(scope="session")
def shim_ready() -> Path:
    """The shim must load here: the tracer tests fail (never skip) when it does not."""
    st = tracer.status()
    assert st.usable, f"preload shim unusable: {st.reason}"
    return st.path


@pytest.fixture
def session_dir(tmp_path_factory, shim_ready) -> Path:
    return tmp_path_factory.mktemp("roar-session")


@pytest.fixture
def traced_run(tmp_path_factory, shim_ready) -> Callable[..., tuple]:
    def _run(cmd, cwd, tag: str | None = None, *, session_dir=None, env=None, **kw):
        sd = session_dir if session_dir is not None else tmp_path_factory.mktemp("roar-session")
        return run_traced(cmd, cwd, sd, tag, env=env, **kw)

    return _run


@pytest.fixture(name="plain_env")
def plain_env_fixture() -> Callable[..., dict[str, str]]:
    return plain_env


@pytest.fixture(name="all_records")
def all_records_fixture() -> Callable[[tracelog.SessionTrace], list[tracelog.Record]]:
    return all_records

