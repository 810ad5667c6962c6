"""A real deployment: LocalExecutor scheduler, api-server and dag-processor on 127.0.0.1, the
scheduler started by `roar-core exec -- airflow scheduler` (tracer preloaded), so every task
process it forks is traced in place.  A producer publishes its traced output through an
AssetAlias; the consumer DAG, scheduled on that alias, must run after it and see the digest.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import blake3
import pytest

from tests.integrations.airflow.conftest import (
    BIN,
    AirflowHome,
    read_events,
    stop_recorder_services,
)
from tests.integrations.airflow.olcheck import validate_provider_event

PRODUCER, CONSUMER = "roar_producer", "roar_consumer"
DEADLINE_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, check, timeout: float, procs: dict[str, subprocess.Popen], logs: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, p in procs.items():
            if p.poll() is not None:
                tail = (logs / f"{name}.log").read_text()[-3000:]
                raise AssertionError(f"airflow {name} exited ({p.returncode}):\n{tail}")
        value = check()
        if value:
            return value
        time.sleep(1.0)
    tails = "\n".join(f"--- {n}\n{(logs / f'{n}.log').read_text()[-2000:]}" for n in procs)
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


@dataclass
class Deployment:
    home: AirflowHome
    env: dict[str, str]
    work: Path
    procs: dict[str, subprocess.Popen]

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.home.home / "airflow.db", timeout=30)

    def runs(self, dag_id: str, since: str) -> list[tuple]:
        with self.db() as con:
            return con.execute(
                "select run_id, state, run_type, start_date, end_date from dag_run "
                "where dag_id = ? and created_at >= ? order by created_at", (dag_id, since)
            ).fetchall()


@pytest.fixture(scope="module")
def deployment(airflow_home: AirflowHome, tmp_path_factory) -> Iterator[Deployment]:
    work = tmp_path_factory.mktemp("local-executor")
    port = _free_port()
    home = work / "home"  # shell start-up files bash reads; the marker says it did
    (home / ".cargo").mkdir(parents=True)
    (home / ".cargo" / "env").write_text("export ROAR_TEST_CARGO=1\n")
    (home / ".bashrc").write_text('. "$HOME/.cargo/env"; echo read >> "$HOME/.bashrc-read"\n')
    env = airflow_home.env(
        work,
        HOME=str(home),
        AIRFLOW__CORE__EXECUTOR="LocalExecutor",
        AIRFLOW__CORE__PARALLELISM="4",
        AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
        AIRFLOW__API__HOST="127.0.0.1",
        AIRFLOW__API__PORT=str(port),
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
        AIRFLOW__API_AUTH__JWT_SECRET=os.urandom(16).hex(),
        AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
    )
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, args: list[str], penv: dict[str, str], via: tuple[str, ...] = ()
              ) -> None:
        with open(work / f"{name}.log", "wb") as log:
            procs[name] = subprocess.Popen([*via, str(BIN / "airflow"), *args], env=penv,
                                           cwd=work,
                                           stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)

    try:
        start("api-server", ["api-server"], env)
        start("dag-processor", ["dag-processor"], env)
        # Only the scheduler (which forks the LocalExecutor workers and their task processes)
        # runs with the tracer: `roar-core exec -- airflow scheduler` (the engine told by
        # the program's name).  Started by a service manager, not from a shell (no SHLVL):
        # the bash of a bash task then reads ~/.bashrc, its stdin being the task runner's
        # socket.
        start("scheduler", ["scheduler"], {k: v for k, v in env.items() if k != "SHLVL"},
              via=(str(BIN / "roar-core"), "exec", "--"))

        def api_up() -> bool:
            try:
                url = f"http://127.0.0.1:{port}/api/v2/monitor/health"
                with urllib.request.urlopen(url, timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        _wait("the api-server", api_up, 120, procs, work)
        dep = Deployment(airflow_home, env, work, procs)

        def dags_parsed() -> bool:
            with dep.db() as con:
                found = {r[0] for r in con.execute(
                    "select dag_id from dag where dag_id in (?, ?)", (PRODUCER, CONSUMER))}
            return found == {PRODUCER, CONSUMER}

        _wait("the dag-processor to parse the DAGs", dags_parsed, 120, procs, work)
        for dag_id in (PRODUCER, CONSUMER):
            airflow_home.airflow(env, "dags", "unpause", dag_id)
        yield dep
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        stop_recorder_services(work)


@pytest.fixture(scope="module")
def produced(deployment: Deployment) -> dict:
    """Trigger the producer once; wait for the consumer run the alias schedules."""
    dep = deployment
    since = datetime.now(timezone.utc).replace(tzinfo=None).isoformat(sep=" ")
    dep.home.airflow(dep.env, "dags", "trigger", PRODUCER)

    def consumer_done():
        runs = dep.runs(CONSUMER, since)
        return runs if runs and runs[-1][1] in ("success", "failed") else None

    consumer = _wait("the consumer DAG run", consumer_done, DEADLINE_S, dep.procs, dep.work)
    return {"producer": dep.runs(PRODUCER, since), "consumer": consumer}


def test_consumer_runs_after_producer_on_the_alias(deployment: Deployment, produced) -> None:
    (prod,) = produced["producer"]
    cons = produced["consumer"][-1]
    assert prod[1] == "success", prod
    assert cons[1] == "success", (cons, (deployment.work / "scheduler.log").read_text()[-3000:])
    assert cons[2] == "asset_triggered"
    assert cons[3] >= prod[3]  # started after the producer did
    data = Path(deployment.env["ROAR_TEST_AIRFLOW_DATA"])
    digest = blake3.blake3((data / "produced.txt").read_bytes()).hexdigest()
    seen = json.loads((data / "consumed.json").read_text())
    assert {"uri": f"file://{data}/produced.txt",
            "extra": {"digest": f"blake3:{digest}", "size": 22}} in seen


def test_task_processes_traced_in_place(deployment: Deployment, produced) -> None:
    data = Path(deployment.env["ROAR_TEST_AIRFLOW_DATA"])
    events = read_events(deployment.work / "ol-events.jsonl")
    (complete,) = [e for e in events
                   if e["job"]["name"] == f"{PRODUCER}.produce" and e["eventType"] == "COMPLETE"]
    (out,) = complete["outputs"]
    digest = blake3.blake3((data / "produced.txt").read_bytes()).hexdigest()
    assert out["name"] == str(data / "produced.txt")
    assert out["facets"]["version"]["datasetVersion"] == f"blake3:{digest}"
    dag_run = [e for e in events if e["job"]["name"] == PRODUCER][0]["run"]["runId"]
    assert complete["run"]["facets"]["parent"]["run"]["runId"] == dag_run
    # roar stored the task under the provider's run id (made in the task process itself)
    from roar_core.pipeline.store import Store

    with Store.open(home=deployment.work / "roar") as store:
        stored = store.task_run(complete["run"]["runId"])
    assert stored is not None and stored.job_name == f"{PRODUCER}.produce"
    (cons,) = [e for e in events
               if e["job"]["name"] == f"{CONSUMER}.consume" and e["eventType"] == "COMPLETE"]
    assert [d["name"] for d in cons["outputs"]] == [str(data / "consumed.json")]
    logs = deployment.home.home / "logs"
    for task_log in [*logs.glob(f"dag_id={PRODUCER}/**/*.log"),
                     *logs.glob(f"dag_id={CONSUMER}/**/*.log")]:
        text = task_log.read_text()
        if "roar:" in text:
            assert "boundary mode" in text and "roar: subprocess mode" not in text, task_log
    for ev in events:
        validate_provider_event(ev)


def test_bash_start_up_files_are_not_inputs(deployment: Deployment, produced) -> None:
    data = Path(deployment.env["ROAR_TEST_AIRFLOW_DATA"])
    assert (deployment.work / "home" / ".bashrc-read").exists()  # bash did read ~/.bashrc
    events = read_events(deployment.work / "ol-events.jsonl")
    (shell,) = [e for e in events
                if e["job"]["name"] == f"{PRODUCER}.shell" and e["eventType"] == "COMPLETE"]
    assert [d["name"] for d in shell["inputs"]] == [str(data / "produced.txt")]
    assert [d["name"] for d in shell["outputs"]] == [str(data / "size.txt")]


def test_the_dag_run_ends_in_the_store(deployment: Deployment, produced) -> None:
    from roar_core.pipeline.store import Store

    events = read_events(deployment.work / "ol-events.jsonl")
    dag_run = [e for e in events if e["job"]["name"] == PRODUCER][0]["run"]["runId"]
    deadline = time.monotonic() + 30  # the scheduler ends the DAG run after its last task
    while True:
        with Store.open(home=deployment.work / "roar") as store:
            wf = store.workflow_run(dag_run)
        if (wf is not None and wf.ended_at is not None) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert wf is not None and (wf.status, wf.ended_at is not None) == ("COMPLETE", True)
