"""Real `snakemake --executor roar` runs in temp dirs, each with its own roar home.

Fixtures:
  smk    smk(workdir, *args, ok=True) -> CompletedProcess: runs Snakemake there with
         ROAR_HOME=<workdir>/.roar-home and no OpenLineage settings (so events go to the
         file transport under that home)
  lineage(home) -> Lineage: every event of the home (each one validated against the
         OpenLineage spec) and the store, with lookups by job name
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.olschema import validate_event

if os.environ.get("ROAR_TEST_REQUIRE_SNAKEMAKE") == "1":
    import snakemake  # noqa: F401 - CI must fail, never skip, without Snakemake
else:
    pytest.importorskip("snakemake")

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def snakemake_env(home: Path) -> dict[str, str]:
    keep = ("ROAR_TRACER_OFF", "ROAR_PRELOAD_LIB")  # how the tracer runs, not where lineage goes
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and (
        k in keep or not k.startswith(("OPENLINEAGE", "ROAR_")))}
    env["ROAR_HOME"] = str(home)
    # Snakemake finds executor plugins with pkgutil, which does not see an editable install.
    if not any(m.name == "snakemake_executor_plugin_roar" for m in pkgutil.iter_modules()):
        extra = str(REPO / "integrations" / "snakemake")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture(scope="session")
def smk():
    def run(workdir: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(BIN / "snakemake"), "--executor", "roar", *args]
        done = subprocess.run(cmd, cwd=workdir, env=snakemake_env(workdir / ".roar-home"),
                              capture_output=True, text=True, timeout=240)
        if ok and done.returncode != 0:
            pytest.fail(f"snakemake failed ({done.returncode}):\n{done.stderr[-6000:]}")
        if not ok and done.returncode == 0:
            pytest.fail(f"snakemake succeeded, expected a failure:\n{done.stderr[-3000:]}")
        return done

    return run


@dataclass
class Lineage:
    home: Path
    events: list[dict] = field(default_factory=list)

    def terminal(self, job: str | None = None) -> list[dict]:
        """COMPLETE/FAIL/ABORT events of task runs (of `job` when given)."""
        return [e for e in self.events if e["eventType"] in ("COMPLETE", "FAIL", "ABORT")
                and "roar_task" in e["run"]["facets"]
                and (job is None or e["job"]["name"] == job)]

    def workflow_events(self) -> list[dict]:
        return [e for e in self.events if "roar_task" not in e["run"]["facets"]
                and e["job"]["facets"]["jobType"]["jobType"] == "DAG"]

    def store(self):
        from roar_core.pipeline.store import Store

        return Store.open(home=self.home)


@pytest.fixture(scope="session")
def lineage():
    def read(home: Path) -> Lineage:
        path = home / "openlineage" / "events.jsonl"
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for e in events:
            validate_event(e)
        return Lineage(home, events)

    return read
