"""A real Airflow 3 for the tests: one temp AIRFLOW_HOME, `airflow db migrate` once per session.

Airflow runs as subprocesses (`airflow dags test`, the LocalExecutor trio), with the
OpenLineage provider writing its events to a file transport the tests read back.  Without
Airflow installed the tests skip, or fail when ROAR_TEST_REQUIRE_AIRFLOW=1 (CI sets it, so
a missing install can never pass silently).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DAGS = HERE / "dags"
BIN = Path(sys.executable).parent


def _require_airflow() -> None:
    try:
        import airflow  # noqa: F401
        import airflow.providers.openlineage  # noqa: F401
    except ImportError as e:
        if os.environ.get("ROAR_TEST_REQUIRE_AIRFLOW") == "1":
            pytest.fail(f"Airflow required (ROAR_TEST_REQUIRE_AIRFLOW=1) but: {e}")
        pytest.skip(f"Airflow tests skipped: {e} (pip install 'roar-core[airflow]')")


@dataclass
class AirflowHome:
    """One AIRFLOW_HOME with its metadata DB; `env()` for the commands run against it."""

    root: Path
    fork_servers: Path | None = None  # the session's (tests/conftest.py)
    home: Path = field(init=False)

    def __post_init__(self) -> None:
        self.home = self.root / "airflow"

    def env(self, work: Path, **extra: str) -> dict[str, str]:
        """Environment for one test: its own data dir, roar home and OpenLineage file."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AIRFLOW", "OPENLINEAGE", "ROAR_"))
               and k not in ("LD_PRELOAD",)}
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "roar-test",
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(work / "ol-events.jsonl"), "append": True}),
            "ROAR_HOME": str(work / "roar"),
            "ROAR_TEST_AIRFLOW_DATA": str(work / "data"),
            # The worker's in-memory session goes here, not into the machine's /dev/shm,
            # where a test's would outlive it (stop_recorder_services removes it).
            "XDG_RUNTIME_DIR": str(work / "run"),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            # Other tests' ROAR_OPENLINEAGE_SPEC etc. are not for Airflow's processes.
        })
        for k in ("ROAR_OPENLINEAGE_SPEC",):
            if k in os.environ:
                env[k] = os.environ[k]
        (work / "data").mkdir(parents=True, exist_ok=True)
        (work / "run").mkdir(mode=0o700, exist_ok=True)
        # The session's recorder fork server (tests/conftest.py), not one per test.
        link = work / "run" / f"roar-{os.getuid()}"
        if self.fork_servers is not None and not link.exists():
            link.symlink_to(self.fork_servers)
        env.update(extra)
        return env

    def airflow(self, env: dict[str, str], *args: str, timeout: float = 300,
                check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(BIN / "airflow"), *args], env=env, cwd=self.root,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        return proc


def preloaded(env: dict[str, str]) -> dict[str, str]:
    """env after the documented one-liner, `eval "$(roar-core env airflow)"` (whose text is
    roar_airflow.shell_exports(); the CLI wiring is tested with the CLI)."""
    py = f"{sys.executable} -c 'import roar_airflow; print(roar_airflow.shell_exports())'"
    out = subprocess.run(["bash", "-c", f'eval "$({py})" && env -0'], env=env,
                         capture_output=True, check=True, cwd=env["ROAR_TEST_AIRFLOW_DATA"])
    new = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    assert "libroar_preload" in new.get("LD_PRELOAD", ""), out.stderr.decode()
    return new


def stop_recorder_services(work: Path) -> None:
    """The recorder service exits once its session directory is gone."""
    for sessions in (work / "run" / "roar", work / "roar" / "sessions"):
        for d in sessions.glob("airflow-*"):
            shutil.rmtree(d, ignore_errors=True)


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def airflow_home(_fork_servers: Path) -> Iterator[AirflowHome]:
    _require_airflow()
    root = Path(tempfile.mkdtemp(prefix="roar-airflow-"))
    home = AirflowHome(root, _fork_servers)
    try:
        home.airflow(home.env(root / "migrate"), "db", "migrate", timeout=600)
        yield home
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    stop_recorder_services(tmp_path)
