"""The provider's registration and small pieces, and roar emitting when the OpenLineage
provider is disabled."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.integrations.airflow.conftest import (
    AirflowHome,
    _require_airflow,
    preloaded,
    read_events,
    stop_recorder_services,
)
from tests.olschema import validate_event


@pytest.fixture(autouse=True)
def _airflow() -> None:
    _require_airflow()


def test_provider_info_matches_airflow_schema() -> None:
    import airflow
    import jsonschema
    from roar_airflow.provider import get_provider_info

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "roar-core"  # must equal the distribution's name
    assert {"name": "roar", "class-name": "roar_airflow.decorators.roar.roar_task"} in info[
        "task-decorators"]


def test_task_roar_is_registered() -> None:
    from airflow.sdk import task
    from roar_airflow.decorators.roar import roar_task

    assert task.roar is roar_task


def test_listed_by_airflow_providers_list(airflow_home: AirflowHome, tmp_path: Path) -> None:
    out = airflow_home.airflow(airflow_home.env(tmp_path), "providers", "list", "-o", "json")
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("[{")][-1]
    listed = {p["package_name"]: p for p in json.loads(line)}
    assert "roar-core" in listed, sorted(listed)


def test_shell_exports_one_liner(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("ROAR_")}
    (tmp_path / "run").mkdir()
    env.update(ROAR_HOME=str(tmp_path / "roar"), ROAR_TASK_TAG="stale", LD_PRELOAD="",
               XDG_RUNTIME_DIR=str(tmp_path / "run"))
    py = f"{sys.executable} -c 'import roar_airflow; print(roar_airflow.shell_exports())'"
    script = f'eval "$({py})" && printf "%s\\n" "$LD_PRELOAD" "$ROAR_SESSION_DIR" ' \
             '"${ROAR_TASK_TAG-unset}" "$ROAR_HOME"'
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout.splitlines()
    preload, session, tag, home = out
    assert preload.endswith("libroar_preload.so") and " " not in preload
    # The worker's session: in memory (the runtime tmpfs), not in the roar home.
    assert Path(session).is_dir() and Path(session).parent == tmp_path / "run" / "roar"
    assert tag == "unset" and home == str(tmp_path / "roar")


def test_internal_paths(airflow_home: AirflowHome, tmp_path: Path) -> None:
    env = airflow_home.env(tmp_path)
    code = ("import json; from roar_airflow.hooks.roar import airflow_internal_paths as f; "
            "print(json.dumps(f()))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    dirs, globs = json.loads(out.stdout.strip().splitlines()[-1])
    assert str(airflow_home.home) in dirs
    assert str(airflow_home.home / "logs") in dirs
    assert str(tmp_path / "ol-events.jsonl") + "*" in globs


def test_provider_disabled_roar_emits_itself(airflow_home: AirflowHome, tmp_path: Path) -> None:
    env = preloaded(airflow_home.env(tmp_path, AIRFLOW__OPENLINEAGE__DISABLED="true"))
    try:
        airflow_home.airflow(env, "dags", "test", "roar_etl", check=False, timeout=400)
        ours = tmp_path / "roar" / "openlineage" / "events.jsonl"
        deadline = time.monotonic() + 60  # the recorder service's spool sends in background
        while time.monotonic() < deadline:
            events = read_events(ours)
            if sum(e["eventType"] in ("COMPLETE", "FAIL") for e in events) >= 8:
                break
            time.sleep(0.5)
    finally:
        stop_recorder_services(tmp_path)
    assert not (tmp_path / "ol-events.jsonl").exists()  # the provider sent nothing
    data = Path(env["ROAR_TEST_AIRFLOW_DATA"])
    by_job = {(e["job"]["name"], e["eventType"]): e for e in events}
    transform = by_job[("roar_etl.transform", "COMPLETE")]
    assert [d["name"] for d in transform["inputs"]] == [str(data / "raw.csv")]
    assert [d["name"] for d in transform["outputs"]] == [str(data / "clean.csv")]
    assert ("roar_etl.broken", "FAIL") in by_job
    parents = {e["run"]["facets"]["parent"]["run"]["runId"] for e in events}
    assert len(parents) == 1  # one DAG run, named like the provider would name it
    for e in events:
        assert e["run"]["facets"]["parent"]["job"]["name"] == "roar_etl"
        assert e["run"]["facets"]["processing_engine"]["name"] == "airflow"
        validate_event(e)  # roar's own events: every facet must have a schema


def test_a_task_writes_the_recorder_settings_again_where_its_session_was_removed(
        airflow_home: AirflowHome, tmp_path: Path) -> None:
    """A warmed worker wrote the settings once; a task that finds the session directory
    gone (and makes it again) writes them again, so a recorder can start there."""
    code = textwrap.dedent("""
        import os, shutil, sys
        from pathlib import Path
        from roar_airflow.hooks import roar as hooks
        session = Path(sys.argv[1])
        hooks.write_settings(session)
        print((session / "recorder.json").exists())
        shutil.rmtree(session)
        hooks.write_settings(session)  # once per worker: no second look
        print((session / "recorder.json").exists())
        hooks._task_log(session)
        print((session / "recorder.json").exists())
    """)
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "session")],
                         env=airflow_home.env(tmp_path), capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.stdout.split() == ["True", "False", "True"], out.stderr[-2000:]


def test_lineage_the_provider_never_asks_for_is_stored_and_nothing_waits(
        airflow_home: AirflowHome, tmp_path: Path) -> None:
    """The provider sends events but not for roar's operators (`disabled_for_operators`):
    nobody asks for their lineage.  The tasks do not wait for it, the recorder stores it,
    and no FIFO of a wait is left in the worker's session."""
    from roar_core.pipeline.store import Store

    env = preloaded(airflow_home.env(
        tmp_path, AIRFLOW__OPENLINEAGE__DISABLED_FOR_OPERATORS=(
            "roar_airflow.decorators.roar._RoarDecoratedOperator;"
            "roar_airflow.operators.roar.RoarBashOperator")))
    session = Path(env["ROAR_SESSION_DIR"])
    data = Path(env["ROAR_TEST_AIRFLOW_DATA"])
    try:
        proc = airflow_home.airflow(env, "dags", "test", "roar_etl", check=False, timeout=400)
        log = proc.stdout + proc.stderr
        # Boundary mode, said only with the lineage, which nobody asks for here.
        assert "roar: subprocess mode" not in log and "roar: untraced mode" not in log
        transform = log.split("<TaskInstance: roar_etl.transform ")[1].split(
            "[DAG TEST] running task")[0]
        assert "Done. Returned value" in transform or "Marking task as SUCCESS" in transform
        assert "roar: recorded" not in transform  # no wait
        assert list(session.glob("wait-*")) == []
        deadline = time.monotonic() + 60  # the recorder stores in its own time
        while True:
            with Store.open(home=tmp_path / "roar") as store:
                writers = {run.job_name for a, run in store.accesses_of_uri(
                    str(data / "clean.csv")) if a.role == "output"}
            if writers or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        stop_recorder_services(tmp_path)
    assert writers == {"roar_etl.transform"}


def test_plugin_warms_only_a_traced_process(airflow_home: AirflowHome, tmp_path: Path) -> None:
    """Loaded in the scheduler, the plugin imports the task path there when the scheduler
    runs with the tracer, writes its session's recorder settings and rehearses a task's
    begin and end, so forked tasks inherit all three; elsewhere it does nothing.  The
    rehearsal leaves nothing behind: no file, no task log, no recorder."""
    code = textwrap.dedent("""
        import os, sys, tempfile
        from airflow.plugins_manager import ensure_plugins_loaded
        ensure_plugins_loaded()
        from roar_airflow.plugins.roar import WARM
        d = os.environ.get("ROAR_SESSION_DIR")
        made = sorted(os.listdir(d)) if d and os.path.isdir(d) else []
        print(WARM, "roar_core.recording.tasklog" in sys.modules,
              bool(d) and os.path.exists(os.path.join(d, "recorder.json")),
              [n for n in made if not n.startswith("roar-")],  # (the tracer's own logs)
              os.listdir(tempfile.gettempdir()))
        from roar_airflow.hooks import roar as hooks
        print("made here:", hooks._OWN_RUN_IDS, hooks.shared_hook()._warm is not None)
        if d:
            from roar_core.pipeline import tracelog, tracer
            from roar_core.recording import recorder
            print("recorder running:", recorder.running(d))
            tracer.loaded().flush()
            scratch = ("roar-" + "rehearsal-").encode()  # (not this code's own text)
            seen = [r.path for log in tracelog.read_session(d).logs for r in log.records
                    if scratch in r.path + r.path2]
            print("rehearsal traced:", seen)
    """)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    plain = airflow_home.env(tmp_path, TMPDIR=str(tmp))
    for env, expected, made_here in (
            (plain, "False False False [] []", "made here: False False"),
            (preloaded(plain), "True True True ['recorder.json'] []", "made here: True True")):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True, cwd=tmp_path)
        lines = out.stdout.strip().splitlines()
        assert expected in lines, out.stdout[-2000:] + out.stderr[-2000:]
        # The run ids and the mode its task processes take from the warm-up
        assert made_here in lines, lines
        assert "recorder running: True" not in lines
        assert not any(x.startswith("rehearsal traced: [b") for x in lines), lines


def test_run_ids_made_here_are_the_providers(airflow_home: AirflowHome,
                                            tmp_path: Path) -> None:
    """A warmed-up worker's task processes make the provider's OpenLineage run ids
    themselves (CPython's SHA-1, not OpenSSL's), only where the warm-up found them to be
    the provider's; they are, for DAG runs and task instances of any date, time zone,
    clear number, try and map index.  Made any other way (a provider that changed), the
    check says so and the provider makes them."""
    code = textwrap.dedent("""
        import random
        from datetime import datetime, timedelta, timezone
        from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter as A
        import roar_airflow.hooks.roar as h

        def providers(dag, date, clear, task):
            return (str(A.build_dag_run_id(dag_id=dag, logical_date=date,
                                           clear_number=clear)),
                    str(A.build_task_instance_run_id(
                        dag_id=dag, task_id=task[0], try_number=task[1],
                        logical_date=date, map_index=task[2])))

        assert not h._OWN_RUN_IDS  # (no warm-up here)
        assert h.check_run_ids() and h._OWN_RUN_IDS
        rnd = random.Random(7)
        for i in range(3000):
            date = datetime(1990, 1, 1, tzinfo=timezone.utc) + timedelta(
                seconds=rnd.random() * 2e9, microseconds=rnd.randrange(10**6))
            date = date.astimezone(timezone(timedelta(minutes=rnd.randrange(-720, 720))))
            args = (f"dag_{rnd.randrange(10**9)}.é", date, rnd.randrange(4),
                    (f"t-{i}", rnd.randrange(1, 9), rnd.randrange(-1, 99)))
            assert h.run_ids(*args) == providers(*args), (args, h.run_ids(*args))
        mine = h._static_uuid
        h._static_uuid = lambda instant, data: mine(instant, data + ".")
        assert not h.check_run_ids()
        assert h.run_ids(*args) == providers(*args)
        print("checked")
    """)
    out = subprocess.run([sys.executable, "-c", code], env=airflow_home.env(tmp_path),
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.strip().endswith("checked"), out.stdout[-2000:] + out.stderr[-3000:]


def test_a_task_in_place_starts_the_recorder_at_its_end_if_none_listens(
        airflow_home: AirflowHome, tmp_path: Path) -> None:
    """In boundary mode a task's begin does not look for the recorder: its end, which
    wakes it anyway, starts one if none listened (none yet, one dead, one gone idle), and
    the task gets its lineage.  Twice: a fresh session, then after its recorder's death."""
    task = textwrap.dedent("""
        import os, signal, sys, time
        from datetime import datetime, timezone
        from types import SimpleNamespace
        from roar_airflow.hooks.roar import RoarHook
        from roar_core.recording import recorder

        data = sys.argv[1]
        hook = RoarHook()
        for i in range(2):
            ti = SimpleNamespace(dag_id="late", task_id=f"t{i}", try_number=1, map_index=-1,
                                 id=f"0190b6e0-0000-7000-8000-00000000000{i}")
            dag_run = SimpleNamespace(dag_id="late", run_after=None, clear_number=0,
                                      logical_date=datetime(2024, 1, 1, tzinfo=timezone.utc))
            mode, _ = hook.mode()
            run = hook.begin({"ti": ti, "dag_run": dag_run, "params": {}}, mode)
            time.sleep(1)  # (time enough for one started as it began to take its lock)
            begun = recorder.running(run.directory)
            out = os.path.join(data, f"out{i}.txt")
            with open(out, "w") as f:
                f.write(str(i))
            hook.end(run, "COMPLETE", wait=False)
            result = hook.answer(run, timeout=60)
            print("said:", mode.value, begun, recorder.running(run.directory),
                  result.ok and [d.name for d in result.outputs] == [out])
            lock = os.path.join(run.directory, recorder.LOCK)
            for pid in filter(str.isdigit, os.listdir("/proc")):  # the recorder: killed
                try:
                    fds = os.listdir(f"/proc/{pid}/fd")
                    if any(os.path.realpath(f"/proc/{pid}/fd/{fd}") == lock for fd in fds):
                        os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
            while recorder.running(run.directory):
                time.sleep(0.01)
    """)
    lines, out, _ = _run_preloaded(airflow_home, tmp_path, task, timeout=180)
    assert lines == ["boundary False True True"] * 2, out.stdout[-3000:] + out.stderr[-3000:]


def _run_preloaded(airflow_home: AirflowHome, tmp_path: Path, script: str, timeout: float
                   ) -> tuple[list[str], subprocess.CompletedProcess, str]:
    """Run `script` (its argument: the data directory) in a process traced as a worker
    started by `roar-core exec` is; its lines "said: ..." (the prefix cut), the process,
    and the data directory."""
    env = preloaded(airflow_home.env(tmp_path))
    data = env["ROAR_TEST_AIRFLOW_DATA"]
    try:
        out = subprocess.run([sys.executable, "-c", script, data], env=env,
                             capture_output=True, text=True, cwd=tmp_path, timeout=timeout)
    finally:
        stop_recorder_services(tmp_path)
    lines = [x[len("said: "):] for x in out.stdout.splitlines() if x.startswith("said: ")]
    return lines, out, data


def test_roar_takes_the_answer_in_the_task_process_before_the_provider_asks(
        airflow_home: AirflowHome, tmp_path: Path) -> None:
    """At Airflow's end of a task, roar's listener is called before the OpenLineage
    provider's, and takes the recorder's answer in the task process if it has come: the
    provider's request, from the child it forks, finds the lineage there.  If the answer has
    not come, the listener goes on at once (the provider's request waits for it)."""
    order = textwrap.dedent("""
        import json
        from airflow.sdk.listener import get_listener_manager
        impls = get_listener_manager().hook.on_task_instance_success.get_hookimpls()
        print(json.dumps([getattr(i.plugin, "__name__", type(i.plugin).__name__)
                          for i in reversed(impls)]))  # (pluggy calls the last one first)
    """)
    out = subprocess.run([sys.executable, "-c", order], env=airflow_home.env(tmp_path),
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.strip(), out.stderr[-2000:]
    called = json.loads(out.stdout.strip().splitlines()[-1])
    assert "roar_airflow.plugins.listener" in called, out.stderr[-2000:]
    assert "OpenLineageListener" in called, called
    assert called.index("roar_airflow.plugins.listener") < called.index("OpenLineageListener")

    task = textwrap.dedent("""
        import os, select, sys
        from datetime import datetime, timezone
        from types import SimpleNamespace
        from roar_airflow.hooks.roar import Mode, RoarHook, TaskRun
        from roar_airflow.operators.roar import RoarBashOperator
        from roar_airflow.plugins import listener
        from roar_core.recording import tasklog

        data = sys.argv[1]
        op = RoarBashOperator(task_id="produce", bash_command="true")
        ti = SimpleNamespace(dag_id="answers", task_id="produce", try_number=1, map_index=-1,
                             id="0190b6e0-0000-7000-8000-000000000001", task=op)
        dag_run = SimpleNamespace(dag_id="answers", run_after=None, clear_number=0,
                                  logical_date=datetime(2024, 1, 1, tzinfo=timezone.utc))
        context = {"ti": ti, "dag_run": dag_run, "task": op, "params": {}}
        hook = RoarHook()
        mode, _ = hook.mode()
        run = op._roar_run = hook.begin(context, mode)
        with open(os.path.join(data, "answer.txt"), "w") as f:
            f.write("answered")
        hook.end(run, "COMPLETE", wait=False)
        fifo = os.path.join(run.directory, tasklog.WAIT_PREFIX + run.run_id)
        print("said:", mode.value, run.result is None, os.path.exists(fifo))
        select.select([run.answer_fd], [], [], 30)  # the recorder has answered
        listener.on_task_instance_success(previous_state=None, task_instance=ti)
        print("said:", run.result is not None and run.result.ok, run.answer_fd is None,
              os.path.exists(fifo), [d.name for d in run.result.outputs])
        r, w = os.pipe()
        if os.fork() == 0:  # the provider's request, from the child it forks
            lineage = op.get_openlineage_facets_on_complete(ti)
            os.write(w, repr([d.name for d in lineage.outputs]).encode())
            os._exit(0)
        os.wait()
        print("said:", os.read(r, 65536).decode())

        # A task whose answer has not come: nothing taken, nothing waited for.
        fd = tasklog._mkfifo(os.path.join(run.directory, tasklog.WAIT_PREFIX + "late"))
        late = RoarBashOperator(task_id="late", bash_command="true")
        late._roar_run = TaskRun(run.ident, Mode.BOUNDARY, run.directory, answer_fd=fd)
        listener.on_task_instance_success(previous_state=None,
                                          task_instance=SimpleNamespace(task=late))
        print("said:", late._roar_run.result is None, late._roar_run.answer_fd == fd)
    """)
    lines, out, data = _run_preloaded(airflow_home, tmp_path, task, timeout=120)
    assert len(lines) == 4, out.stdout[-3000:] + out.stderr[-3000:]
    written = str(Path(data) / "answer.txt")
    assert lines[-4] == "boundary True True"  # ended: the answer not taken yet
    assert lines[-3] == f"True True False {[written]!r}"  # taken by the listener
    assert lines[-2] == repr([written])  # what the provider's request got
    assert lines[-1] == "True True"
