"""`airflow dags test` of extract -> transform -> load with @task.roar, in both modes.

boundary:   the `airflow dags test` process runs with the tracer preloaded (the one-liner),
            like a worker started after `eval "$(roar-core env airflow)"`;
subprocess: no tracer in the process: the callables run in traced Python children.

The OpenLineage provider writes its events to a file; each task's COMPLETE (or FAIL) event
must carry the files the task really read and wrote, with blake3 digests, under the DAG run.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import blake3
import pytest

from roar_core.pipeline.store import Store
from tests.integrations.airflow.conftest import (
    AirflowHome,
    preloaded,
    read_events,
    stop_recorder_services,
)
from tests.integrations.airflow.olcheck import validate_provider_event

DAG = "roar_etl"
NAMESPACE = "roar-test"
# Provider facets with no schema anywhere; and where the provider's facets do not match the
# provider's own shipped schemas (apache-airflow-providers-openlineage 2.20.3).
EXPECTED_UNCHECKED: set[str] = {
    "run.facets.airflow_mappedTask",  # START of a mapped task (deprecated by the provider)
    "run.facets.unknownSourceAttribute",  # the plain @task: the provider knows no lineage
}
KNOWN_PROVIDER_ERRORS = (
    "run.facets.airflow.taskInstance: 'pool' is a required property",
    "run.facets.airflow.task.retry_exponential_backoff: 0 is not of type 'boolean'",
)


@dataclass
class EtlRun:
    mode: str
    work: Path
    data: Path
    proc: subprocess.CompletedProcess
    events: list[dict]

    def task_events(self, task_id: str, event_type: str) -> list[dict]:
        return [e for e in self.events
                if e["job"]["name"] == f"{DAG}.{task_id}" and e["eventType"] == event_type]

    def one(self, task_id: str, event_type: str = "COMPLETE") -> dict:
        found = self.task_events(task_id, event_type)
        assert len(found) == 1, (task_id, event_type, [e["job"]["name"] for e in self.events])
        return found[0]

    def digest(self, name: str) -> str:
        return blake3.blake3((self.data / name).read_bytes()).hexdigest()


@pytest.fixture(scope="module", params=["boundary", "subprocess"])
def etl(request, airflow_home: AirflowHome, tmp_path_factory) -> EtlRun:
    work = tmp_path_factory.mktemp(f"etl-{request.param}")
    env = airflow_home.env(work)
    if request.param == "boundary":
        env = preloaded(env)
    try:
        # The DAG run fails: `broken` fails on purpose.
        proc = airflow_home.airflow(env, "dags", "test", DAG, check=False, timeout=400)
        yield EtlRun(request.param, work, Path(env["ROAR_TEST_AIRFLOW_DATA"]), proc,
                     read_events(work / "ol-events.jsonl"))
    finally:
        stop_recorder_services(work)


def _names(datasets: list[dict]) -> set[str]:
    return {d["name"] for d in datasets}


def _check_dataset(run: EtlRun, d: dict) -> None:
    name = Path(d["name"]).name
    assert d["namespace"] == "file"
    digest = run.digest(name)
    assert d["facets"]["version"]["datasetVersion"] == f"blake3:{digest}", name
    ch = d["facets"]["contentHash"]
    assert (ch["algorithm"], ch["digest"]) == ("blake3", digest), name
    assert ch["size"] == (run.data / name).stat().st_size


def test_complete_events_carry_real_io_with_digests(etl: EtlRun) -> None:
    assert "Task failed with exception" in etl.proc.stdout + etl.proc.stderr
    p = lambda name: str(etl.data / name)  # noqa: E731
    expected = {
        "extract": (set(), {p("raw.csv")}),
        "transform": ({p("raw.csv")}, {p("clean.csv")}),
        "load_report": ({p("clean.csv")}, {p("report.txt")}),  # `.override(task_id=...)`
        "count_lines": ({p("clean.csv")}, {p("lines.txt")}),  # RoarBashOperator
    }
    for task_id, (ins, outs) in expected.items():
        ev = etl.one(task_id)
        assert (_names(ev["inputs"]), _names(ev["outputs"])) == (ins, outs), task_id
        for d in ev["inputs"] + ev["outputs"]:
            _check_dataset(etl, d)
        created = {d["name"]: d["facets"]["lifecycleStateChange"]["lifecycleStateChange"]
                   for d in ev["outputs"]}
        assert set(created.values()) == {"CREATE"}, created
        assert ev["outputs"][0]["outputFacets"]["outputStatistics"]["size"] > 0
    # `.expand` over two files: one run per map index, each with its own I/O.
    mapped = {(tuple(_names(e["inputs"])), tuple(_names(e["outputs"])))
              for e in etl.task_events("checksum", "COMPLETE")}
    assert mapped == {((p("raw.csv"),), (p("raw.csv.len"),)),
                      ((p("clean.csv"),), (p("clean.csv.len"),))}


def test_failing_task_emits_fail_with_partial_lineage(etl: EtlRun) -> None:
    ev = etl.one("broken", "FAIL")
    assert _names(ev["inputs"]) == {str(etl.data / "clean.csv")}
    assert _names(ev["outputs"]) == {str(etl.data / "partial.txt")}
    for d in ev["inputs"] + ev["outputs"]:
        _check_dataset(etl, d)
    assert "the transform broke half-way" in ev["run"]["facets"]["errorMessage"]["message"]
    assert not etl.task_events("broken", "COMPLETE")


def test_copy_nobody_traced_is_joined_by_content(etl: EtlRun) -> None:
    """`summarize` read staged/clean_copy.csv, made by an untraced task: its input keeps the
    path it really read (never the producer's name, never `symlinks`), and roar's lineage
    joins it to transform's clean.csv, whose bytes it has, by an inferred edge."""
    ev = etl.one("summarize")
    (inp,) = ev["inputs"]
    copy = str(etl.data / "staged" / "clean_copy.csv")
    assert inp["name"] == copy and "symlinks" not in inp["facets"]
    assert inp["facets"]["version"]["datasetVersion"] == f"blake3:{etl.digest('clean.csv')}"
    assert _names(ev["outputs"]) == {str(etl.data / "summary.txt")}
    assert not etl.one("stage")["inputs"]  # the plain @task reports nothing
    from roar_core.pipeline.store import Store

    with Store.open(home=etl.work / "roar") as store:
        g = store.lineage(str(etl.data / "summary.txt"), min_size=1)
    inferred = {(g.artifacts[e.source].uri, g.artifacts[e.target].uri)
                for e in g.edges if e.kind == "inferred"}
    assert inferred == {(str(etl.data / "clean.csv"), copy)}
    assert {r.job_name for r in g.runs.values()} >= {f"{DAG}.transform", f"{DAG}.summarize"}


def test_parent_is_the_dag_run(etl: EtlRun) -> None:
    dag_events = [e for e in etl.events if e["job"]["name"] == DAG]
    assert dag_events and {e["eventType"] for e in dag_events} == {"FAIL"}
    dag_run_id = dag_events[0]["run"]["runId"]
    tasks = [e for e in etl.events if e["job"]["name"].startswith(f"{DAG}.")]
    assert len(tasks) == 2 * 10  # START + COMPLETE/FAIL for 9 tasks, one mapped twice
    for ev in tasks:
        parent = ev["run"]["facets"]["parent"]
        assert parent["run"]["runId"] == dag_run_id
        assert parent["job"] == {"namespace": NAMESPACE, "name": DAG, "facets": {}}


def test_roar_facets_and_mode(etl: EtlRun) -> None:
    log = etl.proc.stdout + etl.proc.stderr
    if etl.mode == "subprocess":
        assert "roar: subprocess mode" in log  # said as the task begins, with the advice
        assert "runs in a traced subprocess" in log
    else:
        assert "roar: subprocess mode" not in log  # said with the lineage:
        # recorded by the session's recorder process
        assert f"{etl.mode} mode, recorder); roar took" in log
        # Its time on the task path, split into the begin and the end (with the wait for
        # the recorder's answer), as bench_airflow reports it: the parts make the whole.
        took = re.findall(r"roar took ([0-9.]+) ms \(begin ([0-9.]+), end ([0-9.]+)\)", log)
        assert took
        for total, begin, end in took:
            assert float(begin) > 0 and float(end) > 0
            assert abs(float(begin) + float(end) - float(total)) <= 0.15, (total, begin, end)
    for ev in etl.events:
        if ev["eventType"] in ("COMPLETE", "FAIL") and ev["job"]["name"] not in (
                DAG, f"{DAG}.stage"):  # stage is a plain @task
            facet = ev["run"]["facets"]["roar_task"]
            assert facet["engine"] == "airflow" and facet["traced"] is True, facet
            assert facet["droppedEvents"] == 0


def test_a_task_goes_on_before_its_lineage_only_where_its_versions_can_be_checked(
        etl: EtlRun) -> None:
    """An output's version is the content the task left; Airflow, once it has the task's
    XCom and state, may start a task that rewrites it.  In place (boundary mode), a task's
    end line carries the state it left each written file in (from its own tracer log), so
    the recorder can take the versions later and the task goes on at once: it logs its
    lineage when the provider asks, after its XCom.  A task that started a process (bash:
    count_lines), or whose work ran in a traced child (subprocess mode), waits for its
    versions before it returns, the child's log not being the task process's: its lineage
    comes before its XCom.  No FIFO of a wait is left in the session."""
    log = etl.proc.stdout + etl.proc.stderr
    parts = re.split(r"\[DAG TEST\] running task <TaskInstance: " + DAG + r"\.", log)[1:]
    checked = 0
    for part in parts:
        task_id = part.split(" ", 1)[0]
        if "Pushing xcom" not in part or "roar: recorded" not in part:
            continue  # failed, returned nothing, or a plain @task
        recorded, pushed = part.index("roar: recorded"), part.index("Pushing xcom")
        went_on = etl.mode == "boundary" and task_id != "count_lines"
        assert (recorded > pushed) == went_on, (etl.mode, task_id)
        checked += 1
    assert checked >= 4
    sessions = [*(etl.work / "run" / "roar").glob("airflow-*"),
                *(etl.work / "roar" / "sessions").glob("airflow-*")]
    assert sessions
    assert [p for d in sessions for p in d.rglob("wait-*")] == []


def test_airflow_internals_are_never_lineage(etl: EtlRun, airflow_home: AirflowHome) -> None:
    for ev in etl.events:
        for d in ev.get("inputs", []) + ev.get("outputs", []):
            assert d["name"].startswith(str(etl.data) + "/"), (ev["job"]["name"], d["name"])
    assert str(airflow_home.home) not in str(etl.events)


def test_store_names_the_same_runs(etl: EtlRun) -> None:
    with Store.open(home=etl.work / "roar") as store:
        for ev in etl.events:
            if ev["job"]["name"] == DAG:
                wf = store.workflow_run(ev["run"]["runId"])
                assert wf is not None and wf.job_name == DAG and wf.namespace == NAMESPACE
                # Ended with the DAG run (`broken` fails it), not RUNNING for ever.
                assert wf.status == "FAIL" and wf.ended_at is not None
            elif ev["eventType"] != "START" and ev["job"]["name"] != f"{DAG}.stage":
                run = store.task_run(ev["run"]["runId"])
                assert run is not None, ev["job"]["name"]
                assert run.job_name == ev["job"]["name"] and run.status == ev["eventType"]


def test_every_event_validates(etl: EtlRun) -> None:
    unchecked: set[str] = set()
    provider_errors: set[str] = set()
    for ev in etl.events:
        report = validate_provider_event(ev)  # raises on anything of ours or official
        unchecked.update(report.unchecked)
        provider_errors.update(report.provider_errors)
    assert unchecked <= EXPECTED_UNCHECKED, unchecked
    assert provider_errors <= set(KNOWN_PROVIDER_ERRORS), provider_errors


def test_secret_arguments_leave_nothing(etl: EtlRun) -> None:
    """`passphrase=` of call_tool: in no event (the provider's included), nor in roar's
    store or spool, though the task ran programs with it in their arguments."""
    canary = b"af-cnry-77e1d"
    (done,) = etl.task_events("call_tool", "COMPLETE")
    assert canary.decode() not in json.dumps(etl.events)
    leaks = [p for p in (etl.work / "roar").rglob("*")
             if p.is_file() and canary in p.read_bytes()]
    assert leaks == []
    if etl.mode == "boundary":  # the task's own process ran `true`: its command
        assert done["run"]["facets"]["roar_task"]["command"] == ["true", "***"]


def test_the_lineage_is_the_one_before_the_recorder_moved(etl: EtlRun) -> None:
    """What roar adds to the provider's events (inputs, outputs, versions, roar's facets)
    and what it stores are those of the version that recorded through a socket service
    (roar_core.service, commit d8b4259): golden_etl.json was written by that version."""
    import json

    from tests.golden_stream import task_lineage

    golden = json.loads((Path(__file__).parent / "golden_etl.json").read_text())[etl.mode]
    got = task_lineage(etl.events, etl.data, etl.work / "roar")
    assert got["runs"] == golden["runs"]
    assert got["events"] == golden["events"]
