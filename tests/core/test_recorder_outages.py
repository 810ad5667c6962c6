"""The recorder process against outages: a spool it cannot write (a full disk under the
home while the store still takes rows: a PostgreSQL server, free pages in SQLite's file)
and an OpenLineage backend that takes an event and does not answer.  A stored task must
be neither lost nor stored twice, and no answer may wait on the backend.  And a change of
its settings (a run with another configuration) under a recorder that runs on, and the
store's checkpoints, which it takes between tasks."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import blake3
import pytest

from roar_core import config
from roar_core.api import Roar
from roar_core.cli import run as runner
from roar_core.pipeline import spoolfiles
from roar_core.pipeline.spoolfiles import NotSynced
from roar_core.recording import follower as following
from roar_core.recording import recorder, tasklog
from tests.core.test_cli import make_cli
from tests.core.test_recorder_kills import left_pending
from tests.core.test_recording_contract import Producer, engine_session
from tests.core.test_spool import Endpoint
from tests.core.test_store import _in_database_file
from tests.olschema import validate_event

RECORDER = ("import sys\nfrom roar_core.recording import recorder\n"
            "sys.exit(recorder.main(sys.argv[1:]))")


def _rows(home: Path) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """The store's task runs of the job "copy" (run id, status), and each one's accesses;
    nothing while the store is not made yet."""
    if not (home / "lineage.db").exists():
        return [], {}
    db = sqlite3.connect(f"file:{home / 'lineage.db'}?mode=ro", uri=True)
    try:
        runs = db.execute("SELECT run_id, status FROM task_runs WHERE job_name = 'copy'"
                          ).fetchall()
        counts = dict(db.execute("SELECT task_run_id, count(*) FROM accesses GROUP BY "
                                 "task_run_id").fetchall())
    except sqlite3.OperationalError:  # its tables not made yet
        return [], {}
    finally:
        db.close()
    return runs, counts


def _children(pid: int) -> dict[int, str]:
    """The child processes of `pid`, each with its state ("Z": exited, not reaped)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        if int(ppid) == pid:
            out[int(d.name)] = state
    return out


def _exited(pid: int) -> bool:
    """Gone, or a zombie (an orphan waits for whoever reaps it here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def _until(what, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return found


@pytest.mark.parametrize("then", ["spool-back", "recorder-killed"])
def test_events_the_spool_refuses_are_kept_and_the_task_is_stored_once(
        tmp_path: Path, then: str) -> None:
    # A full disk under the home's spool (or any spool that cannot be written) while the
    # store can be (a PostgreSQL server; free pages in SQLite's file): the recorder stores
    # the task and cannot spool its events.  It must neither mark the task recorded (its
    # events would be lost) nor store it again later (its accesses twice).
    cli, cfg = left_pending(tmp_path)
    home = Path(cli.env["ROAR_HOME"])
    spool = Path(cfg.spool_dir)
    shutil.rmtree(spool, ignore_errors=True)
    spool.write_text("")  # no directory: every write into it fails, even as root

    rec = subprocess.Popen([sys.executable, "-c", RECORDER, str(cfg.sessions_dir)],
                           cwd=cli.cwd, env=cli.env, stderr=subprocess.PIPE)
    try:
        ((run_id, status),) = _until(lambda: _rows(home)[0])
        _until(lambda: _rows(home)[1].get(run_id))
        time.sleep(1.5)  # an offer again at least (RESPOOL_S), refused as well
        assert rec.poll() is None, rec.stderr.read() if rec.stderr else ""
        assert status == "COMPLETE" and _rows(home)[1][run_id] == 2
        # Stored, and not recorded: its task log still holds it, for whoever spools it.
        assert [o.run_id for _, o in runner.pending(cfg)] == [run_id]
        if then == "recorder-killed":
            rec.kill()
        spool.unlink()
        spool.mkdir()
        if then == "spool-back":
            _until(lambda: runner.pending(cfg) == [])  # the recorder spooled them itself
    finally:
        rec.kill()
        _, err = rec.communicate(timeout=30)
    assert b"could not spool an OpenLineage event" in err, err.decode()
    assert b"Traceback" not in err, err.decode()

    listing = cli("show")  # the next reader drains what is pending
    assert listing.returncode == 0 and b"Traceback" not in listing.stderr, listing.stderr
    assert runner.pending(cfg) == [] and tasklog.log_paths(cfg.sessions_dir) == []
    assert cli.ok("flush").endswith("pending 0\n")
    events = home / "openlineage" / "events.jsonl"
    mine = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["eventType"] for e in mine if e["run"]["runId"] == run_id] == [
        "START", "COMPLETE"]
    # Stored once: one run, its two accesses once each.
    assert _rows(home) == ([(run_id, "COMPLETE")], {run_id: 2})
    complete = next(e for e in mine if e["eventType"] == "COMPLETE")
    truth = blake3.blake3((cli.cwd / "out.txt").read_bytes()).hexdigest()
    assert complete["outputs"][0]["facets"]["version"]["datasetVersion"] == f"blake3:{truth}"


# A recorder whose syncs of spool segments fail as a disk's write errors do: the kernel
# reports EIO once and drops the pages it could not write (here: the segment is cut back
# to what the last good sync covered), and a later fdatasync of that file succeeds.  The
# first one fails, or all of them while the file argv[1] names exists (each failure then
# appends a line to argv[1] + ".failed", for the test to wait on).
SYNC_FAILS = """
import errno, os, sys
from roar_core.recording import recorder
real, synced, failed = os.fdatasync, {}, []
def fdatasync(fd):
    path = os.readlink(f"/proc/self/fd/{fd}")
    if path.endswith(".jsonl") and "/spool/" in path and (
            os.path.exists(sys.argv[1]) if sys.argv[1] else not failed):
        failed.append(path)
        os.ftruncate(fd, synced.get(path, 0))
        if sys.argv[1]:
            with open(sys.argv[1] + ".failed", "a") as f:
                f.write(path + "\\n")
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    real(fd)
    synced[path] = os.fstat(fd).st_size
os.fdatasync = fdatasync
sys.exit(recorder.main(sys.argv[2:]))
"""


@pytest.mark.parametrize("failing", ["once", "until-fixed", "until-killed"])
def test_events_a_failed_spool_sync_may_have_lost_are_written_again(
        tmp_path: Path, failing: str) -> None:
    # Marking a task recorded after its events' fdatasync failed lost them: the failure was
    # a warning, and the disk had dropped what it could not write.  (The backend is down
    # meanwhile: a sender that took them before the sync failed would have hidden that.)
    # until-killed: the recorder dies while its spool cannot sync; the next one, on a
    # disk that works again, sends what it had staged.
    up = threading.Event()
    endpoint = Endpoint()
    endpoint.status = lambda event: 201 if up.is_set() else 503
    endpoint.start()
    broken = tmp_path / "disk-broken"
    try:
        cli, cfg = left_pending(tmp_path)
        env = dict(cli.env, OPENLINEAGE_URL=endpoint.url)
        if failing != "once":
            broken.touch()
        rec = subprocess.Popen([sys.executable, "-c", SYNC_FAILS,
                                str(broken) if failing != "once" else "",
                                str(cfg.sessions_dir)],
                               cwd=cli.cwd, env=env, stderr=subprocess.PIPE)
        try:
            if failing != "once":
                # Its first sync, and a second one 1 s later, failed.  (A fixed 2.5 s was
                # too short on a loaded machine: the recorder had stored the task, and its
                # first sync came after the disk was back.)
                failed = Path(f"{broken}.failed")
                _until(lambda: failed.exists() and len(failed.read_text().splitlines()) >= 2)
                assert rec.poll() is None
                # Stored, not marked: its task log holds it until its events are synced.
                ((_, held),) = runner.pending(cfg)
                assert _rows(Path(cli.env["ROAR_HOME"]))[0] == [(held.run_id, "COMPLETE")]
                if failing == "until-killed":
                    rec.kill()
                broken.unlink()
            _until(lambda: runner.pending(cfg) == [] or rec.poll() is not None)
            assert failing == "until-killed" or rec.poll() is None
        finally:
            rec.kill()
            _, err = rec.communicate(timeout=30)
        assert b"Traceback" not in err, err.decode()
        if failing == "until-killed":
            assert runner.pending(cfg) != []
            rec = subprocess.Popen([sys.executable, "-c", RECORDER, str(cfg.sessions_dir)],
                                   cwd=cli.cwd, env=env, stderr=subprocess.PIPE)
            try:
                _until(lambda: runner.pending(cfg) == [] or rec.poll() is not None)
            finally:
                rec.kill()
                _, next_err = rec.communicate(timeout=30)
            assert b"Traceback" not in next_err, next_err.decode()
        up.set()
        flushed = cli("flush", env=env)
        assert flushed.returncode == 0, flushed.stderr
        assert flushed.stdout.decode().endswith("pending 0\n")
        mine = list(endpoint.events)
    finally:
        endpoint.stop()
    for e in mine:
        validate_event(e)
    home = Path(cli.env["ROAR_HOME"])
    ((run_id, status),), accesses = _rows(home)
    assert [e["eventType"] for e in mine if e["run"]["runId"] == run_id] == [
        "START", "COMPLETE"]
    assert status == "COMPLETE" and accesses == {run_id: 2}  # stored once
    complete = next(e for e in mine if e["eventType"] == "COMPLETE")
    truth = blake3.blake3((cli.cwd / "out.txt").read_bytes()).hexdigest()
    assert complete["outputs"][0]["facets"]["version"]["datasetVersion"] == f"blake3:{truth}"
    # Said: what failed, what was done about it; while it lasts, once, and when it is over.
    said = [line.split(" roar: ", 1)[1] for line in err.decode().splitlines()
            if "OpenLineage spool" in line and "backend" not in line]
    assert said[0].endswith("its last events are written again into a new segment")
    if failing == "until-killed":
        assert len(said) == 2 and "cannot sync the OpenLineage spool" in said[1], said
    elif failing == "until-fixed":
        assert len(said) == 3, said
        assert "cannot sync the OpenLineage spool" in said[1], said
        assert said[2] == "the OpenLineage spool is synced again"
    else:
        assert len(said) == 1, said


# A recorder whose store takes no task rows while the file argv[1] names exists, as a full
# disk refuses them (each refusal appends a line to argv[1] + ".failed"); a task that could
# not be recorded is tried again after 0.3 s, not 5.
STORE_FULL = """
import os, sys
from roar_core.pipeline.store import Store, StoreError
from roar_core.recording import follower, recorder
follower.RETRY_S = 0.3
def full(real):
    def write(self, run, *args, **kwargs):
        if os.path.exists(sys.argv[1]):
            with open(sys.argv[1] + ".failed", "a") as f:
                f.write(real.__name__ + "\\n")
            raise StoreError(f"cannot record in {self._where}: database or disk is full")
        return real(self, run, *args, **kwargs)
    return write
for name in ("start_task_run", "finish_task_run", "start_workflow_run", "finish_workflow_run"):
    setattr(Store, name, full(getattr(Store, name)))
sys.exit(recorder.main(sys.argv[2:]))
"""


def test_a_task_whose_start_the_store_refused_is_recorded_once_it_takes_rows(
        tmp_path: Path) -> None:
    # The store refused the task's end (with its start), then its START alone.  The START
    # was marked done all the same: every later try recorded the end without the task's
    # row, "unknown task run", long after the disk had room again.  The task was never
    # recorded.
    cli, cfg = left_pending(tmp_path)
    full = tmp_path / "disk-full"
    full.touch()
    rec = subprocess.Popen([sys.executable, "-c", STORE_FULL, str(full),
                            str(cfg.sessions_dir)],
                           cwd=cli.cwd, env=cli.env, stderr=subprocess.PIPE)
    try:
        refused = Path(f"{full}.failed")
        # Its end (with its start), its START alone, and its end tried again.
        _until(lambda: refused.exists() and len(refused.read_text().splitlines()) >= 3)
        assert "start_task_run" in refused.read_text().splitlines()
        assert rec.poll() is None
        assert len(runner.pending(cfg)) == 1  # kept
        full.unlink()
        _until(lambda: runner.pending(cfg) == [] or rec.poll() is not None)
        assert rec.poll() is None
    finally:
        rec.kill()
        _, err = rec.communicate(timeout=30)
    assert b"Traceback" not in err and b"unknown task run" not in err, err.decode()
    home = Path(cli.env["ROAR_HOME"])
    ((run_id, status),), accesses = _rows(home)
    assert status == "COMPLETE" and accesses == {run_id: 2}  # stored once
    assert cli.ok("flush").endswith("pending 0\n")
    mine = [json.loads(line) for line in
            (home / "openlineage" / "events.jsonl").read_text().splitlines()]
    for e in mine:
        validate_event(e)
    assert [e["eventType"] for e in mine if e["run"]["runId"] == run_id] == [
        "START", "COMPLETE"]
    complete = next(e for e in mine if e["eventType"] == "COMPLETE")
    truth = blake3.blake3((cli.cwd / "out.txt").read_bytes()).hexdigest()
    assert complete["outputs"][0]["facets"]["version"]["datasetVersion"] == f"blake3:{truth}"


def test_a_workflow_run_whose_start_the_store_refused_starts_before_its_tasks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A workflow run (Snakemake's) the store refused to start was marked started all the
    # same: its START never went out, its task made a row of its own for it when the disk
    # had room again (begun then, with none of its facets), and had it no task, its end
    # would have been refused too ("lost").
    cfg, session = engine_session(tmp_path, monkeypatch)
    (tmp_path / "in.txt").write_text("data\n")
    producer = Producer(session, tmp_path)
    workflow = "0190b000-0000-7000-8000-00000000000f"
    try:
        producer.do(f"wbegin {workflow}")
        producer.task(1, tmp_path / "in.txt", tmp_path / "out.txt", "x")
        producer.do(f"wend {workflow}")
    finally:
        producer.kill()
    full = tmp_path / "disk-full"
    full.touch()
    rec = subprocess.Popen([sys.executable, "-c", STORE_FULL, str(full), str(session)],
                           cwd=tmp_path, env=os.environ, stderr=subprocess.PIPE)
    try:
        refused = Path(f"{full}.failed")
        _until(lambda: refused.exists()
               and refused.read_text().splitlines().count("start_workflow_run") >= 3)
        assert rec.poll() is None
        full.unlink()
        _until(lambda: not tasklog.log_paths(session) or rec.poll() is not None)
        assert rec.poll() is None
    finally:
        rec.kill()
        _, err = rec.communicate(timeout=30)
    assert b"Traceback" not in err and b"lost" not in err, err.decode()
    roar = Roar(cfg, send=False)
    try:
        assert roar.spool.flush(10).pending == 0
        run = roar.store.workflow_run(workflow)
        (task,) = roar.store.task_runs(workflow)
    finally:
        roar.close(timeout=0)
    assert run.status == "COMPLETE" and task.status == "COMPLETE"
    assert run.started_at <= task.started_at  # as the producer began them
    mine = [json.loads(line) for line in
            (Path(cfg.home) / "openlineage" / "events.jsonl").read_text().splitlines()]
    for e in mine:
        validate_event(e)
    assert [(e["run"]["runId"] == workflow, e["eventType"]) for e in mine] == [
        (True, "START"), (False, "START"), (False, "COMPLETE"), (True, "COMPLETE")]
    assert err.decode().count("not started yet (tried again)") == 1  # said once


def test_a_recorder_that_cannot_open_its_store_tells_the_waiting_producer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A recorder whose store could not be opened (a full disk) died with a traceback; its
    # waiting producers waited out their whole timeout (a Snakemake run's end: 5 minutes)
    # for an answer nobody would give.  It must tell them (not recorded, kept), keep the
    # task, and the next recorder, once the store opens, record it once.
    cfg, session = engine_session(tmp_path, monkeypatch)
    db = Path(cfg.home) / "lineage.db"
    db.mkdir(parents=True)  # no database can be opened there
    src = tmp_path / "in.txt"
    src.write_text("data\n")
    producer = Producer(session, tmp_path)
    task = "0190b000-0000-7000-8000-000000000001"
    try:
        producer.do(f"begin {task} t1")
        producer.do(f"copy {src} {tmp_path / 'out.txt'} x")
        producer.proc.stdin.write(f"end {task} 120\n")  # waits up to 120 s for the answer
        producer.proc.stdin.flush()
        recorder.ensure(session)
        said = json.loads(producer.proc.stdout.readline())
    finally:
        producer.kill()
    assert said["ok"] is True, said  # answered (not a wait that timed out) ...
    assert said["result"]["ok"] is False and said["result"]["kept"] is True, said  # kept
    assert "cannot open lineage store" in said["result"]["error"], said  # ... and why
    recorder.wait_gone(session, time.monotonic() + 30, exited=True)
    log_text = (session / recorder.LOG).read_text()
    assert "Traceback" not in log_text and "nothing recorded: cannot open" in log_text, log_text
    assert len(tasklog.log_paths(session)) == 1  # kept

    db.rmdir()
    recorder.ensure(session)
    _until(lambda: not tasklog.log_paths(session))
    recorder.wait_gone(session, time.monotonic() + 30, exited=True)
    roar = Roar(cfg, send=False)
    try:
        (run,) = roar.store.task_runs()
        accesses = roar.store.accesses_of(run.run_id)
    finally:
        roar.close(timeout=0)
    assert run.run_id == task and run.status == "COMPLETE"
    out = {a.uri: a.digest for a in accesses if a.role == "output"}
    truth = blake3.blake3((tmp_path / "out.txt").read_bytes()).hexdigest()
    assert out == {str(tmp_path / "out.txt"): f"blake3:{truth}"}


@pytest.mark.parametrize("how", ["drain", "recover"])
def test_a_recording_in_process_marks_nothing_its_spool_could_not_sync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    # `drain` (a reader, or `run --wait` where no recorder can run) syncs once more as it
    # ends, with no pass in between: that must try the failed sync again, not mark.
    # `recover` (Ray's driver, for a node whose recorder is gone) passes no window at all.
    record = recorder.drain if how == "drain" else following.recover
    cli, cfg = left_pending(tmp_path)
    roar = recorder.open_roar(cfg.sessions_dir)
    real, synced, broken = os.fdatasync, {}, [True]

    def fdatasync(fd: int) -> None:  # as SYNC_FAILS, in this process
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(".jsonl") and "/spool/" in path and broken[0]:
            os.ftruncate(fd, synced.get(path, 0))
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)
        synced[path] = os.fstat(fd).st_size

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    try:
        with pytest.raises(NotSynced):
            record(roar, cfg.sessions_dir)
        ((_, held),) = runner.pending(cfg)  # stored, and not marked
        home = Path(cli.env["ROAR_HOME"])
        assert _rows(home)[0] == [(held.run_id, "COMPLETE")]
        broken[0] = False
        time.sleep(spoolfiles.RESYNC_S)  # (not tried again before)
        record(roar, cfg.sessions_dir)
        assert runner.pending(cfg) == []
        assert roar.spool.flush(10).pending == 0
    finally:
        roar.close(timeout=0)
    mine = [json.loads(line) for line in
            (home / "openlineage" / "events.jsonl").read_text().splitlines()]
    for e in mine:
        validate_event(e)
    assert [e["eventType"] for e in mine] == ["START", "COMPLETE"]
    assert {e["run"]["runId"] for e in mine} == {held.run_id}
    assert _rows(home) == ([(held.run_id, "COMPLETE")], {held.run_id: 2})


def test_a_backend_that_does_not_answer_holds_no_answer(tmp_path: Path) -> None:
    # The backend takes the first event and answers only when the test says so (a Marquez
    # under load, a proxy that hangs), with a transport timeout longer than the test waits.
    # The recorder sent between its passes: the next `run --wait` waited for that send.
    held, release = threading.Event(), threading.Event()

    def answer(event: dict) -> int:
        held.set()
        release.wait(120)
        return 201

    endpoint = Endpoint()
    endpoint.status = answer
    endpoint.start()
    try:
        cli = make_cli(tmp_path)
        (cli.cwd / "openlineage.yml").write_text(
            f"transport:\n  type: http\n  url: {endpoint.url}\n  timeout: 120\n")
        (cli.cwd / "in.txt").write_text("data\n")
        first = cli("run", "--wait", "--job", "first", "--", "cp", "in.txt", "a.txt")
        assert first.returncode == 0, first.stderr
        assert held.wait(30), "the first run's events were never sent"
        # The backend holds the first event: the next run is recorded and answered anyway.
        second = cli("run", "--wait", "--job", "second", "--", "cp", "a.txt", "b.txt",
                     timeout=60)
        assert second.returncode == 0, second.stderr
        assert b"b.txt" in second.stderr and not release.is_set()
        release.set()
        assert cli.ok("flush").endswith("pending 0\n")
        got = endpoint.received()
    finally:
        release.set()
        endpoint.stop()
    for e in got:
        validate_event(e)
    jobs = [(e["job"]["name"], e["eventType"]) for e in got]
    assert jobs == [("first", "START"), ("first", "COMPLETE"), ("second", "START"),
                    ("second", "COMPLETE")]
    complete = got[-1]
    assert complete["outputs"][0]["facets"]["version"]["datasetVersion"] == "blake3:" + (
        blake3.blake3((cli.cwd / "b.txt").read_bytes()).hexdigest())


def test_a_change_of_settings_leaves_no_sender_unreaped(tmp_path: Path) -> None:
    # A run with another configuration rewrites the session's settings: the recorder goes
    # on with a new spool and a new sender, and lets the old sender finish on its own.  It
    # must reap it then, not keep it as a zombie for its lifetime (one per change).
    cli, cfg = left_pending(tmp_path)
    rec = subprocess.Popen([sys.executable, "-c", RECORDER, str(cfg.sessions_dir)],
                           cwd=cli.cwd, env=cli.env, stderr=subprocess.PIPE)
    try:
        _until(lambda: runner.pending(cfg) == [])
        (first,) = _until(lambda: list(_children(rec.pid)))  # its sender
        other = dict(cli.env, ROAR_NAMESPACE="elsewhere")
        again = cli("run", "--wait", "--job", "again", "--", "cp", "in.txt", "again.txt",
                    env=other)
        assert again.returncode == 0, again.stderr
        _until(lambda: first not in _children(rec.pid) or rec.poll() is not None)
        assert rec.poll() is None, "the old sender was reaped only as the recorder exited"
        assert "Z" not in _children(rec.pid).values()
    finally:
        senders = list(_children(rec.pid))
        rec.kill()
        _, err = rec.communicate(timeout=30)
    assert b"Traceback" not in err, err.decode()
    # The new sender may still be writing what it took: it goes as its recorder ends.
    _until(lambda: all(_exited(pid) for pid in senders))
    assert cli.ok("flush").endswith("pending 0\n")
    events = Path(cli.env["ROAR_HOME"]) / "openlineage" / "events.jsonl"
    jobs = [(e["job"]["namespace"], e["job"]["name"], e["eventType"])
            for e in map(json.loads, events.read_text().splitlines())]
    assert jobs == [("roar", "copy", "START"), ("roar", "copy", "COMPLETE"),
                    ("elsewhere", "again", "START"), ("elsewhere", "again", "COMPLETE")]


def test_only_the_recorder_holds_its_wake_up_fifo(tmp_path: Path) -> None:
    # A producer that can wake the directory's recorder takes it as listening (an Airflow
    # task's end starts one only when that fails): the recorder's sender, a child that may
    # outlive it, must not hold the FIFO open.
    cli, cfg = left_pending(tmp_path)
    rec = subprocess.Popen([sys.executable, "-c", RECORDER, str(cfg.sessions_dir)],
                           cwd=cli.cwd, env=cli.env, stderr=subprocess.PIPE)
    wake = os.path.join(cfg.sessions_dir, tasklog.WAKE)

    def holds(pid: int) -> bool:
        fds = Path(f"/proc/{pid}/fd")
        return any(os.path.realpath(fd) == wake for fd in fds.iterdir())

    try:
        _until(lambda: runner.pending(cfg) == [])
        (sender,) = _until(lambda: list(_children(rec.pid)))
        assert holds(rec.pid)
        assert not holds(sender)
        assert tasklog.poke(wake)
        os.kill(rec.pid, 9)
        rec.wait(30)
        assert not tasklog.poke(wake), "something still listens with the recorder gone"
    finally:
        rec.kill()
        rec.communicate(timeout=30)


def test_the_recorder_checkpoints_its_store_once_idle(tmp_path: Path) -> None:
    # Its commits leave the write-ahead log as it is (`Store.open(idle_checkpoints=True)`):
    # the recorder itself copies it into the database once a pass finds nothing to do,
    # not only when it exits (the last connection closed).
    cli, cfg = left_pending(tmp_path)
    settings = Path(cfg.sessions_dir) / recorder.SETTINGS
    values = json.loads(settings.read_text())
    settings.write_text(json.dumps(dict(values, idle_exit_s=120)))  # it stays to be seen
    home = Path(cli.env["ROAR_HOME"])
    rec = subprocess.Popen([sys.executable, "-c", RECORDER, str(cfg.sessions_dir)],
                           cwd=cli.cwd, env=cli.env, stderr=subprocess.PIPE)
    try:
        _until(lambda: runner.pending(cfg) == [])
        ((run_id, status),), _ = _rows(home)
        assert status == "COMPLETE"
        _until(lambda: _in_database_file(home, run_id) == 2 or rec.poll() is not None, 15)
        assert rec.poll() is None, "checkpointed only as the recorder exited"
    finally:
        rec.kill()
        _, err = rec.communicate(timeout=30)
    assert b"Traceback" not in err, err.decode()


def test_an_in_process_workflow_start_the_spool_refuses_goes_out_before_its_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Ray's driver starts and ends its workflow run itself (`Roar.start_workflow`).  A START
    # the spool refuses is kept and offered again before the run's end, not dropped; what
    # is still refused when the Roar closes is said to be lost.
    for k in list(os.environ):
        if k.startswith("OPENLINEAGE"):
            monkeypatch.delenv(k)
    cfg = config.load(cwd=tmp_path, env={}, home=str(tmp_path / "home"))
    spool = Path(cfg.spool_dir)
    spool.parent.mkdir(parents=True)
    spool.write_text("")  # no directory: every write into it fails, even as root
    roar = Roar(cfg, send=False)
    try:
        back = roar.start_workflow("driver", engine="ray")
        spool.unlink()
        spool.mkdir()
        roar.finish_workflow(back, "COMPLETE")
        assert roar.spool.flush(10).pending == 0
    finally:
        roar.close(timeout=0)
    shutil.rmtree(spool)
    spool.write_text("")
    roar = Roar(cfg, send=False)  # (a new spool: none of its segments is open)
    try:
        lost = roar.start_workflow("driver", engine="ray")
        roar.finish_workflow(lost, "FAIL")
    finally:
        with caplog.at_level(logging.ERROR):
            roar.close(timeout=0)
    got = [json.loads(line) for line in
           (Path(cfg.home) / "openlineage" / "events.jsonl").read_text().splitlines()]
    for e in got:
        validate_event(e)
    assert [(e["run"]["runId"], e["eventType"]) for e in got] == [
        (back.run_id, "START"), (back.run_id, "COMPLETE")]
    assert "2 workflow event(s) lost" in caplog.text
    spool.unlink()
    roar = Roar(cfg, send=False)
    try:
        assert roar.store.workflow_run(back.run_id).status == "COMPLETE"
        assert roar.store.workflow_run(lost.run_id).status == "FAIL"  # stored all the same
    finally:
        roar.close(timeout=0)
