"""The one recording path's contract, whatever the engine: each task a producer logs is
recorded exactly once, with the lineage its tracer logs hold, through the failures users
meet -- a producer killed mid-task, a recorder killed between its store commit and its marks,
an engine that exits without closing its log, no recorder at all, a wait that times out.

The producer here is a plain traced Python process driven over stdin (each engine's adapter
does the same few calls); the recorder is the real one (`python -m
roar_core.recording.recorder`).  Truth is checked against the files' bytes (blake3) and the
events the file transport received, not against roar's own log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import blake3
import pytest

from roar_core import config
from roar_core.api import Roar
from roar_core.pipeline import tracer
from roar_core.recording import recorder
from roar_core.recording.follower import Follower
from roar_core.recording.tasklog import TaskLogFile, log_paths
from tests.olschema import validate_event

pytestmark = pytest.mark.skipif(not tracer.status().usable, reason=tracer.status().reason)

PRODUCER = textwrap.dedent('''
    import json, os, subprocess, sys
    from datetime import datetime, timezone
    from roar_core.pipeline import tracer
    from roar_core.recording.tasklog import TaskLog
    shim = tracer.loaded()
    log = TaskLog(os.environ["ROAR_SESSION_DIR"])
    workflow = None  # the tasks' workflow run, once one began
    print("ready", flush=True)
    for line in sys.stdin:
        op, *args = line.split()
        if op == "wbegin":  # RUN_ID [NAMESPACE: stored and its START sent by the test
            # [stored: its START refused, handed to the recorder]]
            workflow = {"namespace": args[1] if len(args) > 1 else "contract",
                        "job_name": "w", "run_id": args[0]}
            started = (args[2] if len(args) > 2 else True) if len(args) > 1 else False
            log.workflow_begun({**workflow, "engine": "test", "started": started,
                                "started_at": datetime.now(timezone.utc).isoformat()})
        elif op == "wend":
            log.workflow_ended(args[0], "COMPLETE")
        elif op == "begin":
            log.begun({"run_id": args[0], "engine": "test", "namespace": "contract",
                       "job_name": f"w.{args[1]}", "host": os.uname().nodename,
                       "pid": os.getpid(), "workflow": workflow,
                       "started_at": datetime.now(timezone.utc).isoformat()})
            shim.begin(args[0])
        elif op == "copy":
            with open(args[0], "rb") as f, open(args[1], "wb") as g:
                g.write(f.read() + args[2].encode())
        elif op == "shcopy":  # by a child, whose own children do the work
            subprocess.run(["sh", "-c", '(cat "$0") > "$1"; (printf %s "$2") >> "$1"', *args],
                           check=True)
        elif op == "end":
            shim.end()
            fd = log.ended(args[0], "COMPLETE", wait=len(args) > 1, early=len(args) > 2)
            if len(args) > 1:
                ok = log.wait_for(args[0], fd, float(args[1]))
                print(json.dumps({"ok": ok, "result": log.results.get(args[0])}), flush=True)
                continue
        elif op == "results":
            log.read_results()
            print(json.dumps(log.results), flush=True)
            continue
        elif op == "exit":
            sys.exit(0)
        print("done", flush=True)
''')


def run_id(n: int) -> str:
    return f"0190b000-0000-7000-8000-{n:012d}"


def digest(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def engine_session(tmp_path: Path, monkeypatch, where: Path | None = None
                   ) -> tuple[config.Config, Path]:
    """A configuration with its home under tmp_path (none of the caller's OpenLineage
    variables), and a session directory for it (`where`, else tmp_path/session), its
    recorder's settings written, as an engine makes one."""
    for k in list(os.environ):
        if k.startswith("OPENLINEAGE"):
            monkeypatch.delenv(k)
    cfg = config.load(cwd=tmp_path, env={}, home=str(tmp_path / "home"))
    session = where or tmp_path / "session"
    session.mkdir(parents=True)
    recorder.write_settings(session, cfg, idle_exit_s=1.0)
    return cfg, session


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith("OPENLINEAGE"):
            monkeypatch.delenv(k)
    return config.load(cwd=tmp_path, env={}, home=str(tmp_path / "home"))


@pytest.fixture
def session(tmp_path, cfg):
    d = tmp_path / "session"
    d.mkdir()
    recorder.write_settings(d, cfg, idle_exit_s=1.0)
    yield d
    # The recorder leaves once its session is gone.
    import shutil

    shutil.rmtree(d, ignore_errors=True)


class Producer:
    def __init__(self, session: Path, cwd: Path):
        env = tracer.preload_env(session, base={k: v for k, v in os.environ.items()
                                                if not k.startswith("ROAR_")})
        self.proc = subprocess.Popen([sys.executable, "-c", PRODUCER], env=env, cwd=cwd,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline() == "ready\n"

    def do(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline()

    def task(self, n: int, src: Path, dst: Path, extra: str) -> None:
        self.do(f"begin {run_id(n)} t{n}")
        self.do(f"copy {src} {dst} {extra}")
        self.do(f"end {run_id(n)}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def wait_recorded(session: Path, timeout: float = 60) -> None:
    """Until the recorder has recorded and removed every task log (its producers gone)."""
    recorder.ensure(session)
    deadline = time.monotonic() + timeout
    while log_paths(session):
        assert time.monotonic() < deadline, "the recorder did not record everything"
        time.sleep(0.05)
    recorder.wait_gone(session, time.monotonic() + timeout, exited=True)


def runs(cfg) -> dict[str, tuple[str, dict[str, str]]]:
    """Stored runs: run id -> (status, output name -> digest)."""
    roar = Roar(cfg, send=False)
    try:
        return {r.run_id: (r.status, {a.uri: a.digest for a in roar.store.accesses_of(r.run_id)
                                      if a.role == "output"})
                for r in roar.store.task_runs(limit=100)}
    finally:
        roar.close(timeout=0)


def unrecorded(session: Path) -> set[str]:
    """The tasks the session's logs hold that are not marked recorded."""
    return {e.meta.run_id for p in log_paths(session) for e in TaskLogFile.open(p).unrecorded()}


def spooled(spool: Path) -> list[dict]:
    """The events in the spool's segments, in order, each valid against the schemas."""
    sent = [json.loads(line)["event"] for seg in sorted(spool.glob("*.jsonl"))
            for line in seg.read_text().splitlines()]
    for e in sent:
        validate_event(e)
    return sent


def terminal_events(cfg) -> dict[str, list[str]]:
    """run id -> its terminal event types, as delivered to the file transport."""
    path = Path(cfg.home) / "openlineage" / "events.jsonl"
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        e = json.loads(line)
        validate_event(e)
        if e["eventType"] != "START":
            out.setdefault(e["run"]["runId"], []).append(e["eventType"])
    return out


def test_a_killed_producers_open_task_is_abort_with_what_it_wrote(tmp_path, cfg, session):
    src = tmp_path / "in.txt"
    src.write_bytes(b"input\n")
    p = Producer(session, tmp_path)
    p.task(1, src, tmp_path / "a.txt", "one")
    p.do(f"begin {run_id(2)} t2")
    p.do(f"copy {src} {tmp_path / 'b.txt'} two")
    p.kill()  # mid-task: no end line, no exit handlers
    wait_recorded(session)

    stored = runs(cfg)
    assert set(stored) == {run_id(1), run_id(2)}
    assert stored[run_id(1)][0] == "COMPLETE"
    assert stored[run_id(2)][0] == "ABORT"
    (a,) = [d for n, d in stored[run_id(1)][1].items() if n.endswith("/a.txt")]
    (b,) = [d for n, d in stored[run_id(2)][1].items() if n.endswith("/b.txt")]
    assert a.removeprefix("blake3:") == digest(b"input\none")
    assert b.removeprefix("blake3:") == digest(b"input\ntwo")
    assert terminal_events(cfg) == {run_id(1): ["COMPLETE"], run_id(2): ["ABORT"]}


@pytest.mark.parametrize("refused", [False, True], ids=["spooled", "start-refused"])
def test_a_workflow_run_its_producer_started_ends_abort_when_the_producer_dies(
        tmp_path, cfg, session, refused):
    """Ray's driver stores its job's run and sends the START itself (before any task may
    name the run), then logs it as started: killed mid-job, it leaves the run to the
    recorder, which ends it ABORT and sends no START of its own.  `refused`: the spool
    refused that START (a full disk): the driver hands it to the recorder with the run,
    so nothing is lost; once the spool takes events again, START then ABORT go out."""
    spool = Path(cfg.spool_dir)
    if refused:
        spool.parent.mkdir(parents=True, exist_ok=True)
        spool.write_text("")  # the spool's directory a plain file: it refuses every event
    roar = Roar(cfg)
    ref = roar.start_workflow("w", engine="test", run_id=run_id(90))
    assert roar.hand_over_kept() == refused
    roar.close()  # (its START delivered, where spooled)
    p = Producer(session, tmp_path)
    p.do(f"wbegin {ref.run_id} {ref.namespace}" + (" stored" if refused else ""))
    p.kill()
    if refused:
        spool.unlink()
    wait_recorded(session)
    roar = Roar(cfg, send=False)
    try:
        run = roar.store.workflow_run(ref.run_id)
        roar.spool.flush(30)
    finally:
        roar.close(timeout=0)
    assert run is not None and run.status == "ABORT" and run.ended_at is not None
    path = Path(cfg.home) / "openlineage" / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    for e in events:
        validate_event(e)
    assert [(e["run"]["runId"], e["eventType"]) for e in events] == [
        (ref.run_id, "START"), (ref.run_id, "ABORT")]
    assert {e["job"]["namespace"] for e in events} == {ref.namespace}


def test_an_engine_that_exits_without_closing_is_recorded(tmp_path, cfg, session):
    src = tmp_path / "in.txt"
    src.write_bytes(b"x\n")
    p = Producer(session, tmp_path)
    p.task(1, src, tmp_path / "a.txt", "a")
    p.do(f"begin {run_id(2)} t2")
    p.proc.stdin.write("exit\n")
    p.proc.stdin.close()
    assert p.proc.wait() == 0
    wait_recorded(session)
    stored = runs(cfg)
    assert {k: v[0] for k, v in stored.items()} == {run_id(1): "COMPLETE",
                                                     run_id(2): "ABORT"}
    assert terminal_events(cfg) == {run_id(1): ["COMPLETE"], run_id(2): ["ABORT"]}


def test_a_recorder_killed_before_its_marks_is_resumed_without_recording_twice(
        tmp_path, cfg, session):
    """The first recorder stores and spools the tasks, then dies before it marks them in
    the log (its marks wait for the spool's sync); the next one finds them stored."""
    src = tmp_path / "in.txt"
    src.write_bytes(b"y\n")
    p = Producer(session, tmp_path)
    for n in (1, 2, 3):
        p.task(n, src, tmp_path / f"{n}.txt", str(n))

    first = Roar(cfg, send=False)
    dying = Follower(first, session, sync_every=3600)  # its marks are never flushed
    assert dying.poll() == 3
    assert not any('"r"' in line for line in Path(log_paths(session)[0]).read_text().splitlines())
    first.spool._writer.sync_deferred()  # what a SIGKILL leaves: written, not marked
    first.store.close()

    p.task(4, src, tmp_path / "4.txt", "4")
    p.kill()
    wait_recorded(session)  # the real recorder resumes

    stored = runs(cfg)
    assert {k: v[0] for k, v in stored.items()} == {run_id(n): "COMPLETE" for n in (1, 2, 3, 4)}
    for n in (1, 2, 3, 4):
        (d,) = stored[run_id(n)][1].values()
        assert d.removeprefix("blake3:") == digest(b"y\n" + str(n).encode())
    roar = Roar(cfg, send=False)
    roar.spool.flush(30)
    roar.close(timeout=0)
    assert terminal_events(cfg) == {run_id(n): ["COMPLETE"] for n in (1, 2, 3, 4)}


def test_with_no_recorder_the_producer_records_here(tmp_path, cfg, session):
    src = tmp_path / "in.txt"
    src.write_bytes(b"z\n")
    p = Producer(session, tmp_path)
    p.task(1, src, tmp_path / "a.txt", "a")
    p.kill()
    # Nothing started a recorder (say it cannot start): the last resort, in this process.
    assert not recorder.running(session)
    assert recorder.record_here(session) == 1
    assert recorder.record_here(session) == 0  # once
    stored = runs(cfg)
    assert list(stored) == [run_id(1)]
    roar = Roar(cfg, send=False)
    roar.spool.flush(30)
    roar.close(timeout=0)
    assert terminal_events(cfg) == {run_id(1): ["COMPLETE"]}


def test_a_wait_that_times_out_leaves_the_task_to_the_recorder(tmp_path, cfg, session):
    src = tmp_path / "in.txt"
    src.write_bytes(b"w\n")
    p = Producer(session, tmp_path)
    p.do(f"begin {run_id(1)} t1")
    p.do(f"copy {src} {tmp_path / 'a.txt'} a")
    answer = json.loads(p.do(f"end {run_id(1)} 0.2"))  # no recorder is running
    assert answer == {"ok": False, "result": None}
    recorder.ensure(session)
    deadline = time.monotonic() + 60
    while not (results := json.loads(p.do("results"))).get(run_id(1)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert results[run_id(1)]["ok"] and results[run_id(1)]["status"] == "COMPLETE"
    (out,) = results[run_id(1)]["outputs"]
    assert out["digest"] == digest(b"w\na")
    p.kill()
    wait_recorded(session)
    assert list(runs(cfg)) == [run_id(1)]


def test_a_waiting_producer_gets_its_tasks_lineage(tmp_path, cfg, session):
    src = tmp_path / "in.txt"
    src.write_bytes(b"v\n")
    recorder.ensure(session)
    p = Producer(session, tmp_path)
    p.do(f"begin {run_id(1)} t1")
    p.do(f"copy {src} {tmp_path / 'a.txt'} a")
    answer = json.loads(p.do(f"end {run_id(1)} 60"))
    assert answer["ok"]
    r = answer["result"]
    assert [i["digest"] for i in r["inputs"]] == [digest(b"v\n")]
    assert [o["digest"] for o in r["outputs"]] == [digest(b"v\na")]
    p.proc.send_signal(signal.SIGTERM)
    p.proc.wait()
    wait_recorded(session)


@pytest.mark.parametrize("named", [False, True], ids=["plain-wake", "named-wake"])
def test_waiting_producers_are_answered_ahead_and_their_tasks_recorded_together(
        tmp_path, cfg, session, named):
    """Producers that wait for their lineage as soon as it is known (Airflow's task
    processes) get it from a pass that stores nothing while other tasks run (whose
    producers may wait next); their tasks are stored at the first pass with nothing to
    answer, in one commit, with the versions the answers gave.  The last running task's
    answer comes first, then everything is stored; a task ended without a wait is stored
    at once, with those answered before it.  `named`: the wakes name the producers'
    logs, as the recorder process reads them (answered first in each pass): the same."""
    import select

    from roar_core.recording import tasklog

    wake = tasklog._mkfifo(session / tasklog.WAKE) if named else None
    roar = Roar(cfg, send=False)
    f = Follower(roar, session)

    def answered(p: Producer, n: int) -> tuple[dict, int]:
        """End task n waiting for its early answer; pass until the producer has it.
        Returns the answer and how many tasks the passes stored."""
        p.proc.stdin.write(f"end {run_id(n)} 60 early\n")
        p.proc.stdin.flush()
        deadline, stored = time.monotonic() + 60, 0
        while not select.select([p.proc.stdout], [], [], 0.01)[0]:
            assert time.monotonic() < deadline, "never answered"
            stored += f.poll(tasklog.drain_fifo(wake) if wake is not None else ())
        answer = json.loads(p.proc.stdout.readline())
        assert answer["ok"]
        (out,) = answer["result"]["outputs"]
        assert out["digest"] == digest(b"q\n" + str(n).encode())
        assert [i["digest"] for i in answer["result"]["inputs"]] == [digest(b"q\n")]
        return answer["result"], stored

    def status(n: int) -> str | None:
        r = roar.store.task_run(run_id(n))
        return r and r.status

    def work(p: Producer, n: int) -> None:
        p.do(f"begin {run_id(n)} t{n}")
        p.do(f"copy {src} {tmp_path / f'{n}.txt'} {n}")

    src = tmp_path / "in.txt"
    src.write_bytes(b"q\n")
    ps = [Producer(session, tmp_path) for _ in range(3)]
    results = {}
    for n, p in enumerate(ps, 1):
        work(p, n)
    for n in (1, 2):  # task 3 runs on
        results[n], stored = answered(ps[n - 1], n)
        assert stored == 0 and status(1) != "COMPLETE" and status(2) != "COMPLETE"
        assert f.held_from is not None  # the recorder's mark stays before them
    assert f.poll() == 2  # nothing new to answer: both, in one pass
    assert status(1) == status(2) == "COMPLETE" and f.held_from is None
    results[3], stored = answered(ps[2], 3)  # none runs after it: answered, then stored
    assert stored == 1 and status(3) == "COMPLETE"
    # Answered ahead (task 5 runs), then task 5 ends without a wait: both stored at once.
    work(ps[0], 4)
    work(ps[1], 5)
    results[4], stored = answered(ps[0], 4)
    assert stored == 0 and status(4) != "COMPLETE"
    ps[1].do(f"end {run_id(5)}")
    deadline = time.monotonic() + 60
    while (done := f.poll()) == 0:
        assert time.monotonic() < deadline
    assert done == 2 and status(4) == status(5) == "COMPLETE"
    f.sync()
    for p in ps:
        p.kill()
    stored_runs = {run: outs for run, (_, outs) in runs(cfg).items()}
    for n, result in results.items():  # stored as answered
        assert {o["name"]: "blake3:" + o["digest"] for o in result["outputs"]} == \
            stored_runs[run_id(n)]
    assert stored_runs[run_id(5)] == {str(tmp_path / "5.txt"): "blake3:" + digest(b"q\n5")}
    f.close()
    roar.close(timeout=0)
    if wake is not None:
        os.close(wake)


def test_a_wake_that_names_its_log_is_answered_before_the_rest_of_the_pass(
        tmp_path, cfg, session, monkeypatch):
    """A producer waiting for its early answer names its task log in the recorder's wake:
    the pass answers from that log first, before it lists and reads the others and stores
    what ended; the task is then stored once, with the versions it was answered."""
    import select

    from roar_core.recording import follower as following
    from roar_core.recording import tasklog

    wake = tasklog._mkfifo(session / tasklog.WAKE)  # the recorder's end, open to read
    roar = Roar(cfg, send=False)
    f = Follower(roar, session)
    src = tmp_path / "in.txt"
    src.write_bytes(b"n\n")
    other = Producer(session, tmp_path)
    other.task(2, src, tmp_path / "2.txt", "2")  # ended, no wait: stored by the pass
    f.poll()  # its log followed, task 2 stored
    # A task whose log no pass has seen yet (an Airflow task process's, made as it began).
    waiting = Producer(session, tmp_path)
    waiting.do(f"begin {run_id(1)} t1")
    waiting.do(f"copy {src} {tmp_path / '1.txt'} 1")
    (log1,) = [p for p in log_paths(session) if f"-{waiting.proc.pid}-" in os.path.basename(p)]
    assert tasklog.drain_fifo(wake) == []  # a plain wake names nothing
    waiting.proc.stdin.write(f"end {run_id(1)} 60 early\n")
    waiting.proc.stdin.flush()
    assert select.select([wake], [], [], 60)[0]
    hinted = tasklog.drain_fifo(wake)
    assert hinted == [os.path.basename(log1).removesuffix(tasklog.SUFFIX)]

    seen = []

    def listed(directory):  # the pass's first look at the directory
        seen.append(any(json.loads(line).get("a") == run_id(1)
                        for line in Path(log1).read_text().splitlines()))
        return log_paths(directory)

    monkeypatch.setattr(following, "log_paths", listed)
    f.poll(hinted)
    assert seen == [True]  # answered before the pass listed the logs
    answer = json.loads(waiting.proc.stdout.readline())
    assert answer["ok"]
    (out,) = answer["result"]["outputs"]
    assert out["digest"] == digest(b"n\n1")
    deadline = time.monotonic() + 60
    while roar.store.task_run(run_id(1)) is None or \
            roar.store.task_run(run_id(1)).status != "COMPLETE":
        assert time.monotonic() < deadline
        f.poll()
    f.sync()
    for p in (waiting, other):
        p.kill()
    stored = {run: outs for run, (_, outs) in runs(cfg).items()}
    assert stored[run_id(1)] == {out["name"]: "blake3:" + out["digest"]}
    assert stored[run_id(2)] == {str(tmp_path / "2.txt"): "blake3:" + digest(b"n\n2")}
    f.close()
    roar.close(timeout=0)
    os.close(wake)


def test_a_task_that_cannot_be_recorded_is_kept_and_recorded_once_later(
        tmp_path, cfg, session, monkeypatch):
    """A store that fails (a full disk, a locked database) costs time, never lineage: the
    waiting producer is told, the task stays in its log, and the next attempt records it."""
    from roar_core.pipeline.store_records import StoreError
    from roar_core.recording import follower as following

    src = tmp_path / "in.txt"
    src.write_bytes(b"f\n")
    p = Producer(session, tmp_path)
    p.task(1, src, tmp_path / "a.txt", "a")
    p.kill()

    roar = Roar(cfg, send=False)
    real = roar.writer.record
    broken = {"on": True}

    def record(*args, **kwargs):
        if broken["on"]:
            raise StoreError("database or disk is full")
        return real(*args, **kwargs)

    monkeypatch.setattr(roar.writer, "record", record)
    monkeypatch.setattr(following, "RETRY_S", 0.0)
    f = Follower(roar, session)
    assert f.poll() == 0
    f.sync()
    (log,) = map(Path, log_paths(session))  # kept, with why
    assert '"fail"' in log.read_text() and "disk is full" in log.read_text()
    assert f.pending() == 0  # a recorder may leave: the next one tries again
    assert f.poll() == 0
    broken["on"] = False
    assert f.poll() == 1
    f.sync()
    assert f.poll() == 0
    assert not log_paths(session)
    roar.spool.flush(30)
    roar.close(timeout=0)
    stored = runs(cfg)
    assert list(stored) == [run_id(1)] and stored[run_id(1)][0] == "COMPLETE"
    (d,) = stored[run_id(1)][1].values()
    assert d.removeprefix("blake3:") == digest(b"f\na")
    assert terminal_events(cfg) == {run_id(1): ["COMPLETE"]}


def test_a_log_with_tasks_marked_by_an_earlier_recorder_is_finished_and_removed(
        tmp_path, cfg, session):
    """A recorder that marked some of a log's tasks, then died: the next one records the
    rest, once, removes the log and leaves (the marked tasks are not work left)."""
    src = tmp_path / "in.txt"
    src.write_bytes(b"m\n")
    p = Producer(session, tmp_path)
    p.task(1, src, tmp_path / "a.txt", "a")
    first = Roar(cfg, send=False)
    earlier = Follower(first, session)
    assert earlier.poll() == 1  # recorded and marked (synced after the pass)
    first.close(timeout=0)
    p.task(2, src, tmp_path / "b.txt", "b")
    p.kill()
    wait_recorded(session)  # times out if the marked task counts as work left
    assert not recorder.running(session)
    stored = runs(cfg)
    assert {k: v[0] for k, v in stored.items()} == {run_id(1): "COMPLETE",
                                                     run_id(2): "COMPLETE"}
    roar = Roar(cfg, send=False)
    roar.spool.flush(30)
    roar.close(timeout=0)
    assert terminal_events(cfg) == {run_id(1): ["COMPLETE"], run_id(2): ["COMPLETE"]}


def test_a_pass_lists_the_tracer_logs_once_whatever_its_backlog(tmp_path, cfg, session,
                                                                 monkeypatch):
    """A recorder behind many producers (a task process each, as Airflow's) lists the
    directory once per pass for all of them, not once per producer (a pass then cost the
    backlog squared: half of the recorder's CPU with 50 tasks behind), and each task still
    gets exactly what its own processes did, its children's and grandchildren's too."""
    src = tmp_path / "in.txt"
    src.write_bytes(b"q\n")
    ps = [Producer(session, tmp_path) for _ in range(12)]
    for n, p in enumerate(ps, 1):
        if n % 2:
            p.task(n, src, tmp_path / f"{n}.txt", str(n))
        else:  # its processes' logs are found from the producer's through its children's
            p.do(f"begin {run_id(n)} t{n}")
            assert p.do(f"shcopy {src} {tmp_path / f'{n}.txt'} {n}") == "done\n"
            p.do(f"end {run_id(n)}")
    scans: list[str] = []
    real = os.scandir

    def scandir(path="."):
        if Path(path) == session:
            scans.append(str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    roar = Roar(cfg, send=False)
    f = Follower(roar, session)
    assert f.poll() == 12
    assert len(scans) <= 2, f"{len(scans)} listings of the directory in one pass"
    f.sync()
    f.close()
    roar.close(timeout=0)
    monkeypatch.undo()
    for p in ps:
        p.kill()
    stored = runs(cfg)
    for n in range(1, 13):
        assert stored[run_id(n)] == ("COMPLETE", {
            str(tmp_path / f"{n}.txt"): "blake3:" + digest(b"q\n" + str(n).encode())})
    roar = Roar(cfg, send=False)
    try:  # what the children read is each task's too
        for n in range(2, 13, 2):
            assert {a.uri for a in roar.store.accesses_of(run_id(n)) if a.role == "input"} \
                == {str(src)}, n
    finally:
        roar.close(timeout=0)


def differences(got: list[bytes], expected: list[bytes]) -> list[str]:
    """Where encoded events differ: (event index) path: got / expected."""
    out: list[str] = []

    def walk(a, b, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), f"{path}/{k}")
        elif a != b:
            out.append(f"{path}: {a!r:.200} / {b!r:.200}")

    for i, (a, b) in enumerate(zip(got, expected, strict=False)):
        walk(json.loads(a), json.loads(b), f"({i})")
    if len(got) != len(expected):
        out.append(f"{len(got)} events against {len(expected)}")
    return out


def end_waiting(waiting: Producer, f: Follower, seen: list) -> None:
    """End task 1 of `waiting`, which waits for it to be recorded (not early), and run the
    follower's passes until `seen` holds what the test looks at."""
    waiting.proc.stdin.write(f"end {run_id(1)} 60\n")
    waiting.proc.stdin.flush()
    deadline = time.monotonic() + 60
    # No pass before the end is in the log: on a slow machine the begin is older than the
    # recorder's hold by then, and a pass that saw it alone would record the start apart
    # (its own staging line, which these tests do not look at).
    (log,) = [p for p in log_paths(f.directory) if f"-{waiting.proc.pid}-" in os.path.basename(p)]
    while not any(json.loads(line).get("e") == run_id(1)
                  for line in Path(log).read_text().split("\n")[:-1]):  # (whole lines)
        assert time.monotonic() < deadline, "task 1 never ended"
        time.sleep(0.001)
    while not seen:
        assert time.monotonic() < deadline, "never recorded"
        f.poll()


@pytest.mark.parametrize("together", [False, True], ids=["alone", "with-another"])
def test_a_producer_waiting_for_the_store_is_answered_once_its_task_is_committed(
        tmp_path, cfg, session, together):
    """A producer that waits for its task to be recorded (`run --wait`, Snakemake's for its
    temp() outputs) is answered as soon as the store has committed the task: before its
    events are spooled and synced, which for a task of thousands of files takes
    milliseconds more.  `together`: recorded in one commit with another task."""
    import select

    roar = Roar(cfg, send=False)
    f = Follower(roar, session)
    src = tmp_path / "in.txt"
    src.write_bytes(b"w\n")
    waiting, other = Producer(session, tmp_path), Producer(session, tmp_path)
    waiting.do(f"begin {run_id(1)} t1")
    waiting.do(f"copy {src} {tmp_path / '1.txt'} 1")
    if together:
        other.task(2, src, tmp_path / "2.txt", "2")
    (log1,) = [p for p in log_paths(session) if f"-{waiting.proc.pid}-" in os.path.basename(p)]
    at_spool = []
    spool_append = roar.spool.append

    def append(event) -> bool:  # what the producer and the store have as task 1's end goes
        e = json.loads(event)
        if e["run"]["runId"] == run_id(1) and e["eventType"] == "COMPLETE":
            marks = [json.loads(line) for line in Path(log1).read_text().splitlines()]
            task = roar.store.task_run(run_id(1))
            at_spool.append((any(m.get("a") == run_id(1) for m in marks),
                             task and task.status))
        return spool_append(event)

    roar.spool.append = append
    end_waiting(waiting, f, at_spool)
    assert at_spool == [(True, "COMPLETE")]  # answered, stored: then spooled
    assert select.select([waiting.proc.stdout], [], [], 60)[0]
    answer = json.loads(waiting.proc.stdout.readline())
    assert answer["ok"]
    (out,) = answer["result"]["outputs"]
    assert out["digest"] == digest(b"w\n1")
    f.sync()
    waiting.kill()
    other.kill()
    stored = {run: outs for run, (_, outs) in runs(cfg).items()}
    assert stored[run_id(1)] == {out["name"]: "blake3:" + out["digest"]}
    f.close()
    roar.close(timeout=0)


def test_a_waiting_producer_is_answered_before_its_tasks_events_are_made(
        tmp_path, cfg, session, monkeypatch):
    """The answer a waiting producer gets needs the store's commit, not the task's events:
    those are made after it (for a task of thousands of files, tens of ms of Python that
    held the GIL from the store's helper thread while it wrote the rows).  Until they are
    staged, the recorder's staging file says they are still to be made; a next recorder,
    should this one die meanwhile, makes them from the task's capture and the store
    (test_recorder_kills): the same events, its content match found again."""
    import copy
    import shutil

    from roar_core.pipeline import emission, provenance
    from roar_core.pipeline.writer import LineageWriter
    from roar_core.recording.follower import STAGED

    # The environment's facts as taken once: not taken again between the events and their
    # remaking below, should a site-packages directory change meanwhile.
    monkeypatch.setattr(provenance, "RECHECK_S", 1e9)
    roar = Roar(cfg, send=False)
    f = Follower(roar, session)
    src = tmp_path / "in.txt"
    src.write_bytes(b"w" * 100 + b"\n")  # (a content match needs 64 bytes or more)
    Producer(session, tmp_path).task(2, src, tmp_path / "a.txt", "2")
    while f.poll() == 0:
        pass
    shutil.copy(tmp_path / "a.txt", tmp_path / "b.txt")  # a copy roar does not see
    waiting = Producer(session, tmp_path)
    waiting.do(f"begin {run_id(1)} t1")
    waiting.do(f"copy {tmp_path / 'b.txt'} {tmp_path / '1.txt'} 1")
    (log1,) = [p for p in log_paths(session) if f"-{waiting.proc.pid}-" in os.path.basename(p)]
    at_complete, told = [], []
    complete_event = emission.complete_event

    def made(lineage):  # what the producer, the store and the staging hold as it is made
        if lineage.run_id == run_id(1):
            marks = [json.loads(line) for line in Path(log1).read_text().splitlines()]
            staging = Path(session) / STAGED
            staged = [json.loads(line) for line in
                      (staging.read_text().splitlines() if staging.exists() else [])]
            task = roar.store.task_run(run_id(1))
            at_complete.append((any(m.get("a") == run_id(1) for m in marks),
                                task and task.status, staged))
        return complete_event(lineage)

    monkeypatch.setattr(emission, "complete_event", made)
    events_made = []  # (with its START?, the events) as the recorder made them
    make_events = LineageWriter._events

    def keep_events(self, staged):
        events = make_events(self, staged)
        if staged.task.meta.run_id == run_id(1):
            events_made.append((staged.start_event is not None, events))
        return events

    monkeypatch.setattr(LineageWriter, "_events", keep_events)
    as_begun = {}  # run id -> its meta as its task log has it (recording settles it)
    store_task = LineageWriter._store_task

    def keep_meta(self, meta, *args, **kwargs):
        as_begun.setdefault(meta.run_id, copy.deepcopy(meta))
        return store_task(self, meta, *args, **kwargs)

    monkeypatch.setattr(LineageWriter, "_store_task", keep_meta)
    answer_stored = f._answer_stored
    monkeypatch.setattr(f, "_answer_stored", lambda task: (told.append(task),
                                                           answer_stored(task)))
    end_waiting(waiting, f, at_complete)
    assert at_complete == [(True, "COMPLETE", [{"r": run_id(1), "ev": None}])]
    answer = json.loads(waiting.proc.stdout.readline())
    (out,) = answer["result"]["outputs"]
    assert out["digest"] == digest(b"w" * 100 + b"\n21")
    f.sync()
    waiting.kill()
    f.close()
    roar.spool.flush(30)
    # The events went out all the same: the inferred edge to the copy's producer, then the
    # COMPLETE with the version the producer was told.
    path = Path(cfg.home) / "openlineage" / "events.jsonl"
    mine = [e for e in map(json.loads, path.read_text().splitlines())
            if run_id(1) in (e["run"]["runId"], e["run"]["facets"].get(
                "roar_contentMatch", {}).get("consumerRunId"))]
    assert [(e["eventType"], e["job"]["name"]) for e in mine] == [
        ("START", "w.t1"), ("COMPLETE", "roar.content_match"), ("COMPLETE", "w.t1")]
    for e in mine:
        validate_event(e)
    (o,) = mine[-1]["outputs"]
    assert o["facets"]["version"]["datasetVersion"] == "blake3:" + out["digest"]
    # Made again from the task's capture and the store, as a next recorder would (from the
    # task's meta as its log has it).
    (task,) = told
    ((start, made_then),) = events_made
    again = roar.writer.stored_events(as_begun[run_id(1)], task.outcome, task.captured,
                                      start=start)
    assert again == made_then, differences(again, made_then)  # byte for byte
    roar.close(timeout=0)


def test_events_a_spool_refuses_go_out_later_once_and_in_the_order_made(
        tmp_path, cfg, session, monkeypatch):
    """A spool that cannot be written (its directory a plain file: a full disk, as root
    too) while the store can: task 1's START is recorded as it runs, task 2 then runs
    whole, then task 1 ends.  Both tasks are stored, neither is marked recorded, nothing
    is spooled; once the spool takes events again, each event goes out once, in the order
    made (a later one never before a kept one), and the tasks are marked only then."""
    from roar_core.recording import follower as follower_mod

    monkeypatch.setattr(follower_mod, "RESPOOL_S", 0.0)  # offered again at every pass
    spool = Path(cfg.spool_dir)
    spool.parent.mkdir(parents=True, exist_ok=True)
    spool.write_text("")  # before the spool is made: no segment of it is open
    roar = Roar(cfg, send=False)
    f = Follower(roar, session)  # (hold_start_s 0: a START as soon as a pass sees it)
    src = tmp_path / "in.txt"
    src.write_bytes(b"s\n")
    first, second = Producer(session, tmp_path), Producer(session, tmp_path)
    try:
        first.do(f"begin {run_id(1)} t1")
        first.do(f"copy {src} {tmp_path / '1.txt'} 1")
        f.poll()
        second.task(2, src, tmp_path / "2.txt", "2")
        f.poll()
        first.do(f"end {run_id(1)}")
        f.poll()
        f.poll()  # offered again, refused again
        stored = runs(cfg)
        assert {r: s for r, (s, _) in stored.items()} == {run_id(1): "COMPLETE",
                                                          run_id(2): "COMPLETE"}
        assert unrecorded(session) == {run_id(1), run_id(2)}
        spool.unlink()
        spool.mkdir()
        f.poll()
        f.sync()
        assert not unrecorded(session)
    finally:
        first.kill()
        second.kill()
        f.close()
        roar.close(timeout=0)
    sent = spooled(spool)
    assert [(e["run"]["runId"], e["eventType"]) for e in sent] == [
        (run_id(1), "START"), (run_id(2), "START"), (run_id(2), "COMPLETE"),
        (run_id(1), "COMPLETE")]
    out = {o["name"]: o["facets"]["version"]["datasetVersion"] for e in sent
           if e["eventType"] == "COMPLETE" for o in e["outputs"]}
    assert out == {str(tmp_path / "1.txt"): "blake3:" + digest(b"s\n1"),
                   str(tmp_path / "2.txt"): "blake3:" + digest(b"s\n2")}
    assert runs(cfg) == stored  # stored once: nothing of them again


@pytest.mark.parametrize("then", ["spool-back", "recorder-killed", "ended-recorder-killed"])
def test_starts_the_spool_refuses_are_neither_lost_nor_marked(tmp_path, cfg, session,
                                                               monkeypatch, then):
    """A workflow run and its task begin while the spool refuses events: both STARTs are
    stored and kept, and neither is marked in the task log before the spool takes it (a
    recorder killed meanwhile would leave a start marked whose event nobody has).  The
    next recorder (killed as the task runs, or once its end is stored and kept too), or the
    same one once the spool is back, sends the workflow's START, then the task's, then its
    end and the workflow's, each once."""
    from roar_core.recording import follower as follower_mod

    monkeypatch.setattr(follower_mod, "RESPOOL_S", 0.0)  # offered again at every pass
    spool = Path(cfg.spool_dir)
    spool.parent.mkdir(parents=True, exist_ok=True)
    spool.write_text("")  # before the spool is made: no segment of it is open
    wf = run_id(100)
    roar = Roar(cfg, send=False)
    f = Follower(roar, session)  # (hold_start_s 0: a START as soon as a pass sees it)
    src = tmp_path / "in.txt"
    src.write_bytes(b"s\n")
    p = Producer(session, tmp_path)
    try:
        p.do(f"wbegin {wf}")
        p.do(f"begin {run_id(1)} t1")
        p.do(f"copy {src} {tmp_path / '1.txt'} 1")
        f.poll()
        f.poll()  # offered again, refused again
        f.sync()  # (what the recorder does after each pass: marks what is spooled)
        (log,) = [TaskLogFile.open(path) for path in log_paths(session)]
        assert [e.started for e in log.entries.values()] == [False]
        assert [w.started for w in log.workflows.values()] == [False]
        assert runs(cfg)[run_id(1)][0] == "RUNNING"
        if then == "ended-recorder-killed":
            p.do(f"end {run_id(1)}")
            f.poll()
            f.sync()
            assert runs(cfg)[run_id(1)][0] == "COMPLETE"
        if then != "spool-back":
            f.close()  # its kept events die with it
            roar.close(timeout=0)
            roar = Roar(cfg, send=False)
        spool.unlink()
        spool.mkdir()
        if then != "spool-back":
            f = Follower(roar, session)
        f.poll()
        if then != "ended-recorder-killed":
            p.do(f"end {run_id(1)}")
        p.do(f"wend {wf}")
        f.poll()
        f.sync()
        assert not unrecorded(session)
    finally:
        p.kill()
        f.close()
        roar.close(timeout=0)
    assert [(e["run"]["runId"], e["eventType"]) for e in spooled(spool)] == [
        (wf, "START"), (run_id(1), "START"), (run_id(1), "COMPLETE"), (wf, "COMPLETE")]
    assert runs(cfg) == {run_id(1): ("COMPLETE", {
        str(tmp_path / "1.txt"): "blake3:" + digest(b"s\n1")})}


@pytest.mark.parametrize("case", ["recorder", "none-possible", "recording-fails"])
def test_an_engine_process_ends_its_own_session_through_one_path(
        tmp_path, cfg, session, monkeypatch, case):
    """`finish_own`, the end both Snakemake's invocation and a Ray driver's job take: the
    log's workflow run and task recorded (by the session's recorder; with none possible, by
    this process), the recorder gone and the session removed.  Where even that fails, the
    session is kept, and the next recorder records what it holds, once."""
    from roar_core.recording.tasklog import TaskLog

    tasks = TaskLog(session)
    workflow = {"namespace": "contract", "job_name": "w", "run_id": run_id(80)}
    tasks.workflow_begun({**workflow, "engine": "test",
                          "started_at": "2026-11-30T00:00:00+00:00"})
    tasks.begun({"run_id": run_id(1), "engine": "test", "namespace": "contract",
                 "job_name": "w.t1", "host": os.uname().nodename, "pid": os.getpid(),
                 "workflow": workflow, "started_at": "2026-11-30T00:00:01+00:00"})
    tasks.ended(run_id(1), "COMPLETE")
    tasks.workflow_ended(run_id(80), "COMPLETE")
    if case != "recorder":
        def cannot(directory):
            raise OSError("no recorder can start here")

        monkeypatch.setattr(recorder, "ensure", cannot)
    if case == "recording-fails":
        def fails(directory):
            raise RuntimeError("database or disk is full")

        monkeypatch.setattr(recorder, "record_here", fails)
    recorded = recorder.finish_own(tasks, session, "the test's lineage", wait_s=2)
    assert not recorder.running(session)
    assert recorded == (case != "recording-fails")
    assert session.exists() == (case == "recording-fails")
    if case == "recording-fails":
        assert tasks.results == {run_id(1): None}
        monkeypatch.undo()
        wait_recorded(session)  # the next recorder (the sweep's)
    else:
        assert tasks.results[run_id(1)] is not None  # (its mark: recorded)
    roar = Roar(cfg, send=False)
    try:
        run = roar.store.workflow_run(run_id(80))
        assert run is not None and (run.status, run.ended_at is not None) == ("COMPLETE", True)
    finally:
        roar.spool.flush(30)
        roar.close(timeout=0)
    assert {k: v[0] for k, v in runs(cfg).items()} == {run_id(1): "COMPLETE"}
    assert terminal_events(cfg) == {run_id(1): ["COMPLETE"], run_id(80): ["COMPLETE"]}
