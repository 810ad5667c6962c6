"""Task journals: a traced worker journals its tasks, a follower in another process records
them, and what a killed worker left is recorded as ABORT with its partial lineage."""

from __future__ import annotations

import os
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
from roar_core.recording import follower as following
from roar_core.recording import tasklog
from roar_core.recording.sessions import SessionCollector

pytestmark = pytest.mark.skipif(not tracer.status().usable, reason=tracer.status().reason)

# A long-lived "worker": runs the tasks it is told on stdin, one line each.
WORKER = textwrap.dedent('''
    import os, sys, subprocess
    from datetime import datetime, timezone
    from roar_core.pipeline import tracer
    from roar_core.recording.tasklog import TaskLog, left_states, trace_mark
    shim = tracer.loaded()
    j = TaskLog(os.environ["ROAR_SESSION_DIR"])
    print("ready", flush=True)
    for n, line in enumerate(sys.stdin):
        cmd, *args = line.split()
        run_id = f"0190a000-0000-7000-8000-{n:012d}"
        j.begun({"run_id": run_id, "engine": "test", "namespace": "ns",
                 "job_name": f"w.{cmd}", "engine_task_id": str(n), "attempt": 0,
                 "parent_run_id": None, "command": None, "host": os.uname().nodename,
                 "pid": os.getpid(), "node_id": None, "traced": True,
                 "untraced_reason": None, "workflow": None, "engine_version": None,
                 "started_at": datetime.now(timezone.utc).isoformat()},
                lifetime=cmd == "actor")
        held = open(args[0], "a") if cmd == "leftheld" else None  # opened before the task
        mark = trace_mark()
        shim.begin(run_id)
        if held is not None:  # written and closed in the task
            held.write("more\\n")
            held.close()
            shim.end()
            j.ended(run_id, "COMPLETE", left=left_states(*mark))
            print("done", flush=True)
            continue
        if cmd in ("left", "leftcp"):  # copy args[0] to args[1] and args[2]
            for out in args[1:]:
                if cmd == "leftcp":
                    subprocess.run(["cp", args[0], out], check=True)
                else:
                    with open(args[0]) as f, open(out, "w") as g:
                        g.write(f.read())
            shim.end()
            left = left_states(*mark)
            j.ended(run_id, "COMPLETE", left=left)
            # The next task, before the recorder has taken the versions: args[2] rewritten
            # in place, as many bytes.
            with open(args[2], "rb+") as g:
                data = g.read()
                g.seek(0)
                g.write(data.swapcase())
            print("done", left is not None, flush=True)
            continue
        if cmd == "copy":
            with open(args[0]) as f, open(args[1], "w") as g:
                g.write(f.read())
        elif cmd == "cp":
            subprocess.run(["cp", *args], check=True)
        elif cmd in ("die", "actor"):
            with open(args[0]) as f, open(args[1], "w") as g:
                g.write(f.read()[:2])
            if cmd == "die":
                os.kill(os.getpid(), 9)
        shim.end()
        if cmd != "actor":
            j.ended(run_id, "COMPLETE")
        print("done", flush=True)
''')


def _digest(p: Path) -> str:
    return "blake3:" + blake3.blake3(p.read_bytes()).hexdigest()


@pytest.fixture
def roar(tmp_path):
    r = Roar(config.load(cwd=tmp_path, env={}, home=str(tmp_path / "home")))
    yield r
    r.close()


def _worker(session: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", WORKER], env=tracer.preload_env(session),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"
    return p


def _do(p: subprocess.Popen, line: str) -> str:
    p.stdin.write(line + "\n")
    p.stdin.flush()
    return p.stdout.readline()


def _io(roar, run_id):
    acc = roar.store.accesses_of(run_id)
    return ({a.uri: a.digest for a in acc if a.role == "input"},
            {a.uri: a.digest for a in acc if a.role == "output"})


def test_follower_records_a_live_worker_and_what_a_killed_one_left(tmp_path, roar):
    session = tmp_path / "session"
    session.mkdir()
    src, a, b, part = (tmp_path / n for n in ("src", "a", "b", "part"))
    src.write_text("hello world\n")
    follower = following.Follower(roar, session)
    w = _worker(session)
    try:
        assert _do(w, f"copy {src} {a}") == "done\n"
        assert _do(w, f"cp {a} {b}") == "done\n"
        assert follower.poll() == 2
        assert follower.pending() == 1  # the worker lives on
        runs = {r.job_name: r for r in roar.store.task_runs(None)}
        assert runs["w.copy"].status == runs["w.cp"].status == "COMPLETE"
        assert _io(roar, runs["w.copy"].run_id) == ({str(src): _digest(src)},
                                                   {str(a): _digest(a)})
        # The subprocess's I/O is its task's.
        assert _io(roar, runs["w.cp"].run_id) == ({str(a): _digest(a)}, {str(b): _digest(b)})
        assert follower.poll() == 0  # nothing twice
        assert _do(w, f"die {src} {part}") == ""  # SIGKILL mid-task
    finally:
        w.kill()
        w.wait()
    assert follower.poll() == 1
    (dead,) = [r for r in roar.store.task_runs(None) if r.job_name == "w.die"]
    assert dead.status == "ABORT" and "died while it ran" in dead.error_message
    assert _io(roar, dead.run_id) == ({str(src): _digest(src)}, {str(part): _digest(part)})
    assert follower.pending() == 0
    assert not list(session.iterdir())  # journal and tracer logs recorded, then removed
    assert _held_logs(tmp_path) == []  # and let go


def test_a_pass_writes_its_tasks_stat_cache_entries_in_one_transaction(
        tmp_path, roar, monkeypatch):
    """The recorder hashes the files of every task its pass records, then writes their
    stat cache entries at once: one write transaction per pass, not one per task.  The
    entries are those of the bytes each task wrote."""
    session = tmp_path / "session"
    session.mkdir()
    src = tmp_path / "src"
    src.write_text("hello world\n")
    outs = [tmp_path / n for n in ("a", "b", "c")]
    follower = following.Follower(roar, session)
    cache = roar.writer.hasher.cache
    written: list[list] = []
    put_many = cache.put_many

    def seen(items) -> None:
        items = list(items)
        if items:
            written.append(items)
        put_many(items)

    monkeypatch.setattr(cache, "put_many", seen)
    w = _worker(session)
    try:
        for out in outs:
            assert _do(w, f"copy {src} {out}") == "done\n"
        # Past the racy window: the cache takes their entries on any kernel and file system
        # (a younger file's only where timestamps are refined once read, see test_hashing).
        time.sleep(0.2)
        assert follower.poll() == 3
    finally:
        w.kill()
        w.wait()
    assert len(written) == 1
    from roar_core.pipeline.statcache import FileState

    found = cache.get_many([FileState.of(os.stat(p)) for p in outs])
    assert ["blake3:" + d for d in found] == [_digest(p) for p in outs]


def test_a_version_taken_after_its_producer_went_on_is_the_content_the_task_left(
        tmp_path, roar):
    """A producer that goes on before the recorder has taken its task's versions (Airflow's,
    which hands the task back to Airflow at once) says in its end line what state the task
    left each written file in, from its own tracer log.  A file rewritten before the
    recorder gets to it (the next task) is recorded as unknown, never with the next task's
    bytes; one left alone gets the digest of the bytes the task wrote.  A task that started
    a process gets no states: its producer must wait instead."""
    session = tmp_path / "session"
    session.mkdir()
    src, kept, rewritten = (tmp_path / n for n in ("src", "kept", "rewritten"))
    src.write_text("hello world\n")
    left_by_task = "blake3:" + blake3.blake3(src.read_bytes()).hexdigest()
    follower = following.Follower(roar, session)
    w = _worker(session)
    try:
        assert _do(w, f"left {src} {kept} {rewritten}") == "done True\n"
        assert rewritten.read_text() == "HELLO WORLD\n"  # the next task's bytes
        assert follower.poll() == 1
        (run,) = roar.store.task_runs(None)
        outputs = {a.uri: a for a in roar.store.accesses_of(run.run_id) if a.role == "output"}
        assert outputs[str(kept)].digest == left_by_task
        assert outputs[str(rewritten)].digest is None
        assert "changed after the task ended" in outputs[str(rewritten)].note
        # With a process started in the task, its log alone cannot say what was written.
        assert _do(w, f"leftcp {src} {tmp_path / 'a'} {tmp_path / 'b'}") == "done False\n"
        # A file opened before the task began, written and closed in it, is known too.
        log = tmp_path / "log"
        log.write_text("first\n")
        assert _do(w, f"leftheld {log}") == "done\n"
        assert follower.poll() == 2  # (leftcp's too)
        (held,) = [r for r in roar.store.task_runs(None) if r.job_name == "w.leftheld"]
        (out,) = [a for a in roar.store.accesses_of(held.run_id) if a.role == "output"]
        assert out.uri == str(log) and out.digest == _digest(log)
    finally:
        w.kill()
        w.wait()


def test_recover_without_a_follower_and_lifetime_tasks(tmp_path, roar):
    session = tmp_path / "session"
    session.mkdir()
    src, out = tmp_path / "src", tmp_path / "out"
    src.write_text("data\n")
    w = _worker(session)
    _do(w, f"actor {src} {out}")  # begun, never ended: lasts as long as its process
    assert following.recover(roar, session) == 0  # alive: left alone
    w.kill()
    w.wait()
    assert following.recover(roar, session, lifetime_status="COMPLETE") == 1
    (run,) = roar.store.task_runs(None)
    assert run.status == "COMPLETE" and _io(roar, run.run_id)[1] == {str(out): _digest(out)}
    assert following.recover(roar, session) == 0


def _held_logs(under: Path) -> list[str]:
    """Task logs under `under` this process holds open."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if os.path.basename(target).startswith(tasklog.PREFIX) and target.startswith(
                f"{under}/"):
            held.append(target)
    return held


@pytest.mark.parametrize("hold", [False, True], ids=["opened-per-read", "held"])
def test_journal_lines_are_read_incrementally(tmp_path, hold):
    j = tasklog.TaskLog(tmp_path)
    f = tasklog.TaskLogFile.open(j.path, hold=hold)
    assert f.pid == os.getpid() and f.entries == {}
    meta = {"run_id": "r1", "engine": "e", "namespace": "n", "job_name": "j",
            "started_at": "2026-01-01T00:00:00+00:00", "workflow": {
                "namespace": "n", "job_name": "wf", "run_id": "w1"}}
    j.begun(meta)
    with open(j.path, "a") as fh:
        fh.write('{"e": "r1", "s": "COMP')  # a line still being written
    assert [e.meta.run_id for e in f.read_more()] == ["r1"]
    assert f.entries["r1"].outcome is None and f.entries["r1"].meta.workflow.run_id == "w1"
    with open(j.path, "a") as fh:
        fh.write('LETE", "t": "2026-01-01T00:00:01+00:00"}\n')
    f.read_more()
    assert f.entries["r1"].outcome.status == "COMPLETE" and f.ended_unrecorded() == 1
    assert _held_logs(tmp_path) == [j.path] * (2 if hold else 1)  # (and j's own)
    f.close()
    j.close()
    assert _held_logs(tmp_path) == []


def test_logs_past_the_held_limit_are_read_all_the_same(tmp_path, monkeypatch):
    """A follower holds at most `_HOLD_MAX` logs open (a backlog of thousands of dead
    producers' logs must leave descriptors to the rest); the others are opened per read."""
    monkeypatch.setattr(tasklog, "_HOLD_MAX", 2)
    monkeypatch.setattr(tasklog, "_held", 0)  # (logs earlier tests' followers hold)
    logs = [tasklog.TaskLog(tmp_path / str(n)) for n in range(4)]
    files = [tasklog.TaskLogFile.open(j.path, hold=True) for j in logs]
    for n, j in enumerate(logs):
        j.begun({"run_id": f"r{n}", "engine": "e", "namespace": "n", "job_name": "j",
                 "started_at": "2026-01-01T00:00:00+00:00"})
        j.close()
    assert sorted(_held_logs(tmp_path)) == sorted(j.path for j in logs[:2])
    assert [[e.meta.run_id for e in f.read_more()] for f in files] == [["r0"], ["r1"], ["r2"],
                                                                       ["r3"]]
    for f in files:
        f.close()
    assert _held_logs(tmp_path) == [] and tasklog._held == 0
    # Let go, another may be held.
    again = tasklog.TaskLogFile.open(logs[3].path, hold=True)
    assert _held_logs(tmp_path) == [logs[3].path] and list(again.entries) == ["r3"]
    again.close()
    j.close()


def test_collector_reads_only_its_process_tree(tmp_path):
    session = tmp_path / "s"
    session.mkdir()
    code = ("import subprocess, sys, time; open(sys.argv[1], 'w').write('x');"
            "subprocess.run(['cp', sys.argv[1], sys.argv[1] + '.copy'])")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / f"f{i}")],
                              env=tracer.preload_env(session, tag=f"t{i}")) for i in range(2)]
    for p in procs:
        p.wait()
    c = SessionCollector(session, root_pid=procs[0].pid)
    c.collect()
    mine = c.take("t0")
    assert mine.records and not c.take("t1").records
    written = {r.path for r in mine.records if r.op_name == "open"}
    assert str(tmp_path / "f0.copy").encode() in written  # cp, a child, is in the tree
    assert len(c.owned()) >= 2


def test_tasks_of_a_node_are_recorded_in_the_order_they_ended(roar, tmp_path):
    """A consumer's end line sits in a journal read before its producer's: the producer's
    COMPLETE is still spooled (and delivered) first."""
    import json
    import socket
    from datetime import datetime, timedelta, timezone

    session = tmp_path / "node"
    session.mkdir()
    t0 = datetime.now(timezone.utc)
    ids = {}
    for pid, job, ended in ((100, "combine", t0 + timedelta(seconds=2)),
                            (200, "split", t0 + timedelta(seconds=1))):
        run_id = ids[job] = f"0190a000-0000-7000-8000-{pid:012d}"
        meta = {"run_id": run_id, "engine": "test", "namespace": "ns", "job_name": job,
                "engine_task_id": str(pid), "attempt": 0, "parent_run_id": None,
                "command": None, "host": socket.gethostname(), "pid": pid, "node_id": None,
                "traced": True, "untraced_reason": None, "workflow": None,
                "engine_version": None, "started_at": t0.isoformat()}
        lines = [{"v": tasklog.VERSION, "pid": pid, "start": 1, "host": socket.gethostname(),
                  "common": {}},
                 {"b": meta, "lifetime": False},
                 {"e": run_id, "s": "COMPLETE", "t": ended.isoformat(), "x": None, "m": None}]
        path = session / f"{tasklog.PREFIX}{pid}-1{tasklog.SUFFIX}"
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert [os.path.basename(p) for p in tasklog.log_paths(session)][0].startswith(
        f"{tasklog.PREFIX}100-")  # the consumer's journal is read first
    follower = following.Follower(roar, session, alive=lambda *_: True)
    assert follower.poll() == 2
    roar.spool.flush(10)
    events = [json.loads(line) for line in
              (Path(roar.config.home) / "openlineage" / "events.jsonl").read_text().splitlines()]
    completes = [e["job"]["name"] for e in events if e["eventType"] == "COMPLETE"]
    assert completes == ["split", "combine"]


def test_an_ended_task_is_started_and_ended_once_even_after_a_follower_died(roar, tmp_path):
    """A task whose end is read with its begin is stored in one commit (START and end);
    one whose START an earlier follower stored but did not mark (it died in between) is
    ended, not refused as a duplicate, and neither event is sent twice."""
    import json
    import socket
    from datetime import datetime, timedelta, timezone

    session = tmp_path / "node"
    session.mkdir()
    t0 = datetime.now(timezone.utc)
    pid, host = 300, socket.gethostname()
    lines: list[dict] = [{"v": tasklog.VERSION, "pid": pid, "start": 1, "host": host,
                          "common": {}}]
    ids = []
    for n in range(2):
        run_id = f"0190a000-0000-7000-8000-{n:012d}"
        ids.append(run_id)
        lines.append({"b": {"run_id": run_id, "engine": "test", "namespace": "ns",
                            "job_name": f"t{n}", "engine_task_id": str(n), "attempt": 0,
                            "parent_run_id": None, "command": None, "host": host,
                            "pid": pid, "node_id": None, "traced": True,
                            "untraced_reason": None, "workflow": None,
                            "engine_version": None, "started_at": t0.isoformat()},
                      "lifetime": False})
        lines.append({"e": run_id, "s": "COMPLETE",
                      "t": (t0 + timedelta(seconds=n + 1)).isoformat(), "x": None, "m": None})
    path = session / f"{tasklog.PREFIX}{pid}-1{tasklog.SUFFIX}"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    earlier = tasklog.TaskLogFile.open(path)
    roar.writer.started(earlier.entries[ids[0]].meta)  # then that follower died

    follower = following.Follower(roar, session, alive=lambda *_: True)
    assert follower.poll() == 2
    assert {r.run_id: r.status for r in roar.store.task_runs(None)} == {
        ids[0]: "COMPLETE", ids[1]: "COMPLETE"}
    roar.spool.flush(10)
    events = [json.loads(line) for line in
              (Path(roar.config.home) / "openlineage" / "events.jsonl").read_text().splitlines()]
    for run_id in ids:
        assert [e["eventType"] for e in events if e["run"]["runId"] == run_id] == [
            "START", "COMPLETE"]


def test_threads_reading_the_recorders_marks_at_once_lose_no_task(tmp_path):
    """Snakemake's job threads each wait for their own task's answer, so several read the
    log's marks at once while others begin tasks: every task begun is in the results."""
    import threading

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        log = tasklog.TaskLog(tmp_path, results=True)
        ids = [f"0190a000-0000-7000-8000-{n:012d}" for n in range(4000)]

        def begin(mine: list[str]) -> None:
            for run_id in mine:
                log.begun({"run_id": run_id, "job_name": "w.t"})
                log.read_results()

        threads = [threading.Thread(target=begin, args=(ids[k::4],)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    log.read_results()
    assert set(log.results) == set(ids)
    log.close()


@pytest.mark.parametrize("name", ["plain", "not-utf8-\udcff"])
def test_a_big_end_line_reads_back_as_written(tmp_path, name):
    """A task's end with thousands of files' versions is a line of megabytes, which the
    reader parses with orjson; a path that is not UTF-8 (a surrogate escape, which orjson
    refuses) reads back all the same."""
    log = tasklog.TaskLog(tmp_path)
    run_id = "0190a000-0000-7000-8000-000000000001"
    log.begun({"run_id": run_id, "engine": "test", "namespace": "ns", "job_name": "w.big",
               "engine_task_id": "1", "attempt": 0, "parent_run_id": None, "command": None,
               "host": os.uname().nodename, "pid": os.getpid(), "node_id": None,
               "traced": True, "untraced_reason": None, "workflow": None,
               "engine_version": None, "started_at": "2026-11-26T12:00:00+00:00"})
    captured = {"outputs": [[f"/data/{name}/{i:06d}", i] for i in range(5000)]}
    log.ended(run_id, "COMPLETE", captured=captured)
    assert os.path.getsize(log.path) > 1 << 16
    (entry,) = tasklog.TaskLogFile.open(log.path).unrecorded()
    assert entry.captured == captured and entry.outcome.status == "COMPLETE"
    log.close()


def test_the_recorders_marks_are_read_past_lines_longer_than_a_read(tmp_path):
    """The producer reads the recorder's marks in small reads first: a mark that follows
    an end line of megabytes (and one of a task begun after it) is read all the same."""
    import json

    log = tasklog.TaskLog(tmp_path)
    ids = [f"0190a000-0000-7000-8000-00000000000{n}" for n in (1, 2)]
    for run_id in ids:
        log.begun({"run_id": run_id, "engine": "test", "namespace": "ns", "job_name": "w.big",
                   "engine_task_id": "1", "attempt": 0, "parent_run_id": None,
                   "command": None, "host": os.uname().nodename, "pid": os.getpid(),
                   "node_id": None, "traced": True, "untraced_reason": None,
                   "workflow": None, "engine_version": None,
                   "started_at": "2026-11-26T12:00:00+00:00"})
    log.ended(ids[0], "COMPLETE", captured={"outputs": [[f"/d/{i:07d}", i] for i in range(
        100_000)]})
    assert os.path.getsize(log.path) > 16 * tasklog.READ_FIRST
    log.read_results()
    assert log.results == {ids[0]: None, ids[1]: None}
    with open(log.path, "a") as f:  # the recorder's marks, as it appends them
        f.write(json.dumps({"a": ids[0], "res": {"ok": True, "n": 1}}) + "\n")
        f.write(json.dumps({"r": ids[1], "res": {"ok": True, "n": 2}}) + "\n")
    log.read_results()
    assert log.results == {ids[0]: {"ok": True, "n": 1}, ids[1]: {"ok": True, "n": 2}}
    log.close()


def test_a_log_is_alive_while_its_own_process_runs_not_one_that_took_its_pid(tmp_path):
    """A task log names its writer by pid and the time it was made (CLOCK_BOOTTIME), not by
    the process's start time from /proc (whose read stalled in Airflow's task processes).
    A process found under that pid which started after the log was made is another one."""
    import time

    child = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.05)  # /proc's start times are in ticks (10 ms): well past the child's
        after = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        assert tasklog.process_alive(child.pid, 0, after)
        # A log made before this process existed was written by an earlier one of its pid.
        assert not tasklog.process_alive(child.pid, 0, after - 10**9)
        # Logs of earlier versions (the start time from /proc) are still told apart.
        start = tasklog.process_start(child.pid)
        assert tasklog.process_alive(child.pid, start)
        assert not tasklog.process_alive(child.pid, start + 1)
    finally:
        child.kill()
        child.wait()
    assert not tasklog.process_alive(child.pid, 0, after)
    own = tasklog.TaskLog(tmp_path)
    found = tasklog.TaskLogFile.open(own.path)
    assert found is not None and found.boot == own.boot and found.alive()
    assert own.name == f"{tasklog.PREFIX}{os.getpid()}-{own.boot}"


def test_the_shims_mark_is_where_its_log_says_the_next_record_goes(tmp_path):
    """`trace_mark` asks the shim (no read of the log back): the same offset as the log's
    header says, after records of this process and of a thread of it."""
    script = textwrap.dedent('''
        import os, threading
        from roar_core.pipeline import tracelog, tracer
        from roar_core.recording.tasklog import trace_mark
        shim = tracer.loaded()
        marks = []
        for n in range(3):
            open(os.path.join(os.environ["DATA"], f"f{n}"), "w").close()
            t = threading.Thread(target=lambda: open(os.environ["DATA"] + "/t", "w").close())
            t.start()
            t.join()
            path = shim.log_path()
            mark = trace_mark()
            with shim.ignoring():  # (reading it back is not a record of its own)
                header = tracelog.read_header(path)
            assert mark == (str(path), header.reserved), (mark, header.reserved)
            marks.append(mark[1])
        assert marks[0] < marks[1] < marks[2], marks
        print("ok")
    ''')
    session = tmp_path / "session"
    session.mkdir()
    (tmp_path / "data").mkdir()
    env = tracer.preload_env(session)
    env["DATA"] = str(tmp_path / "data")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout == "ok\n", done.stderr
