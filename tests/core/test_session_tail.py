"""`roar-core run --wait` reads the session's logs while the command runs (run_traced's
tail), and what it has read, with the rest read once the command has ended, is the
command's whole trace."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from roar_core.pipeline import tracelog, tracer
from roar_core.recording.sessions import SessionCollector, run_traced


def _usable() -> None:
    if not tracer.status().usable:
        pytest.skip(tracer.status().reason)


class _Watched(SessionCollector):
    """Counts the records it holds after each read made while the command runs."""

    def __init__(self, directory: Path):
        super().__init__(directory)
        self.held: list[int] = []

    def collect(self, settle: bool = False, live: bool = False, seen=None) -> int:
        found = super().collect(settle, live, seen)
        self.held.append(sum(len(r) for r in self._pending.values()))
        return found


def test_logs_are_read_while_the_command_runs(tmp_path: Path) -> None:
    _usable()
    session = tmp_path / "s"
    session.mkdir()
    watched = _Watched(session)
    rc = run_traced(["sh", "-c", "echo x > out.txt; sleep 0.5; echo y > late.txt"], session,
                    "T", cwd=tmp_path, tail=watched)
    assert rc == 0
    # out.txt's records were read during the half-second sleep, before the command ended.
    assert any(n > 0 for n in watched.held), watched.held
    watched.collect(settle=True)
    names = {os.path.basename(r.path) for r in watched.take_all().records}
    assert {b"out.txt", b"late.txt"} <= names


def test_no_thread_for_the_tail_leaves_the_command_waited_for(tmp_path: Path,
                                                            monkeypatch) -> None:
    # Under a process limit (threads count as processes) the tail thread may not start:
    # the logs are read whole at the end, and the command is still waited for and its
    # exit code returned (the RuntimeError left it running, and the run exited 1).
    _usable()
    session = tmp_path / "s"
    session.mkdir()
    start = threading.Thread.start

    def refused(self):
        if self.name == "roar-tail":
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", refused)
    watched = _Watched(session)
    rc = run_traced(["sh", "-c", "echo x > out.txt; sleep 0.3; echo y > late.txt; exit 7"],
                    session, "T", cwd=tmp_path, tail=watched)
    assert rc == 7
    assert (tmp_path / "late.txt").read_text() == "y\n"  # it ran to its end
    assert watched.held == []  # nothing read while it ran
    watched.collect(settle=True)
    names = {os.path.basename(r.path) for r in watched.take_all().records}
    assert {b"out.txt", b"late.txt"} <= names


def test_a_quiet_command_is_read_less_and_less_often(tmp_path: Path) -> None:
    _usable()
    session = tmp_path / "s"
    session.mkdir()
    watched = _Watched(session)
    assert run_traced(["sh", "-c", "echo x > out.txt; sleep 1.5"], session, "T", cwd=tmp_path,
                      tail=watched) == 0
    # Every 10 ms, that would be ~150 reads; backing off to 0.25 s, about a dozen.
    assert 2 <= len(watched.held) <= 20, len(watched.held)


def test_a_log_still_being_created_is_not_an_error_until_the_end(tmp_path: Path) -> None:
    # The shim creates a log, then sizes it and writes its header: a read in between sees
    # a short file.  While processes may be starting it is looked at again later; once
    # the command has ended, a log still unreadable is reported (and counted).
    session = tmp_path / "s"
    session.mkdir()
    (session / "roar-4242-1.log").write_bytes(b"")
    collector = SessionCollector(session)
    collector.collect(live=True)
    assert collector.errors == []
    collector.collect(settle=True)
    assert len(collector.errors) == 1 and "roar-4242-1.log" in collector.errors[0]
    assert collector.logs_read == 0


def test_run_wait_records_the_whole_trace_read_during_and_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _usable()
    from roar_core import config
    from roar_core.api import Roar
    from roar_core.cli.run import run_command

    cfg = config.load(env={"ROAR_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    (tmp_path / "in.txt").write_text("in\n")
    script = ("cat in.txt > a.txt; sleep 0.3; "
              "for i in 1 2 3; do echo $i > b$i.txt; sleep 0.05; done; cat a.txt > c.txt")
    monkeypatch.chdir(tmp_path)
    roar = Roar(cfg)
    try:
        result = run_command(roar, ["sh", "-c", script], "tail")
    finally:
        roar.close(timeout=5)
    assert result.returncode == 0 and result.error is None
    rec = result.recorded
    assert [os.path.basename(d.name) for d in rec.inputs] == ["in.txt"]
    assert sorted(os.path.basename(d.name) for d in rec.outputs) == [
        "a.txt", "b1.txt", "b2.txt", "b3.txt", "c.txt"]
    assert rec.data["dropped"] == 0


def test_a_log_read_many_times_counts_its_lost_events_once(tmp_path: Path) -> None:
    # A live process's log: the shim counts the events it could not log in the header.
    session = tmp_path / "s"
    session.mkdir()
    header = tracelog._HEADER.pack(tracelog.MAGIC, tracelog.VERSION, tracelog.HEADER_SIZE,
                                   tracelog.CHUNK, 0, os.getpid(), os.getppid(), 1, 1, 0, 3,
                                   0, 0)
    (session / f"roar-{os.getpid()}-1.log").write_bytes(
        header.ljust(tracelog.HEADER_SIZE, b"\0"))
    collector = SessionCollector(session)
    for _ in range(3):
        collector.collect(live=True)
    collector.collect(settle=True)
    assert collector.take_all().dropped == 3


# A traced process that writes a file, waits for a line on stdin, writes another, exits.
TWO_STEPS = (
    "import sys\n"
    "open(sys.argv[1] + '/a.txt', 'w').close()\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "open(sys.argv[1] + '/b.txt', 'w').close()\n"
)
_DROPPED_AT = 56  # offset of `dropped` in the log header (tracelog._HEADER)


def _set_dropped(log: Path, n: int) -> None:
    fd = os.open(log, os.O_WRONLY)
    try:
        os.pwrite(fd, n.to_bytes(8, "little"), _DROPPED_AT)
    finally:
        os.close(fd)


def test_losses_are_charged_once_to_the_tasks_reading_a_live_log(tmp_path: Path) -> None:
    _usable()
    import subprocess
    import sys

    session = tmp_path / "s"
    session.mkdir()
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", TWO_STEPS, str(tmp_path)],
                            env=tracer.preload_env(session, tag="T"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        (log,) = map(Path, tracelog.log_files(session))
        assert tracelog._HEADER.unpack_from(
            log.read_bytes()[:tracelog._HEADER.size])[10] == 0
        _set_dropped(log, 5)  # the shim lost 5 events before now
        collector = SessionCollector(session)
        collector.collect()
        first = collector.take("T")
        assert b"a.txt" in {os.path.basename(r.path) for r in first.records}
        assert first.dropped == 5
        _set_dropped(log, 7)  # and 2 more since
        proc.communicate("go\n", timeout=30)
    finally:
        proc.kill()
        proc.wait()
    collector.collect()
    second = collector.take("T")
    assert b"b.txt" in {os.path.basename(r.path) for r in second.records}
    assert second.dropped == 2


def test_losses_before_a_task_began_are_not_its_own(tmp_path: Path) -> None:
    _usable()
    import subprocess
    import sys

    session = tmp_path / "s"
    session.mkdir()
    subprocess.run([sys.executable, "-I", "-S", "-c",
                    "open(__import__('sys').argv[1] + '/c.txt', 'w').close()", str(tmp_path)],
                   env=tracer.preload_env(session, tag="T"), check=True)
    (log,) = tracelog.log_files(session)
    _set_dropped(log, 4)
    collector = SessionCollector(session)
    collector.skip(log, 0, dropped=4)  # all 4 lost before the task (its begin saw 4)
    collector.collect()
    t = collector.take("T")
    assert b"c.txt" in {os.path.basename(r.path) for r in t.records} and t.dropped == 0


TASKS_IN_ONE_WORKER = r"""
import json, os, subprocess, sys, time
from pathlib import Path
from roar_core.pipeline import tracer
from roar_core.recording.sessions import SessionCollector

session, data = Path(sys.argv[1]), sys.argv[2]
shim = tracer.loaded()
collector = SessionCollector(session, root_pid=os.getpid(), since_mono_ns=time.monotonic_ns())
found = {}
for i in range(40):
    tag = f"t{i}"
    shim.begin(tag)
    if i % 3 == 2:  # a child process does this task's I/O: its log is new
        subprocess.run(["/bin/sh", "-c", f"echo x > {data}/child{i}"], check=True)
    else:
        open(f"{data}/own{i}", "w").close()
    shim.end()
    with shim.ignoring():
        collector.collect(live=True)
        found[tag] = sorted({os.path.basename(r.path).decode() for r in
                             collector.take(tag).records if r.op_name == "open"})
collector.close()
print(json.dumps(found))
"""


def test_a_worker_reading_its_tree_per_task_finds_each_new_childs_log(tmp_path: Path) -> None:
    """A long-lived worker lists the directory again only when it changed: tasks in quick
    succession (within one timestamp tick) alternate between I/O of their own and I/O of
    a child process, whose log is new; every task gets its own file, never another's."""
    _usable()
    import json
    import subprocess
    import sys

    session, data = tmp_path / "s", tmp_path / "d"
    session.mkdir()
    data.mkdir()
    out = subprocess.run([sys.executable, "-c", TASKS_IN_ONE_WORKER, str(session), str(data)],
                         env=tracer.preload_env(session), capture_output=True, text=True,
                         check=True)
    found = json.loads(out.stdout)
    for i in range(40):
        want = f"child{i}" if i % 3 == 2 else f"own{i}"
        assert found[f"t{i}"] == [want], (i, found[f"t{i}"])


def _as_run_wait(where: Path, argv: list[str], between=None, hashed: list | None = None):
    """argv run the way `run --wait` runs it (the tail feeding a WhileRunning, then the
    runner's end): (the WhileRunning, its early digests by file name, taken while the
    command ran and as it exited, the outputs' digests by file name).  `between()`:
    called once the early digests are taken, before the end's classification; `hashed`:
    gets the paths the end hashes itself."""
    from roar_core.pipeline import hashing
    from roar_core.pipeline.capture import WhileRunning, versions
    from roar_core.pipeline.classification import PathFilter

    session, out = where / "s", where / "out"
    session.mkdir(parents=True)
    out.mkdir()
    keep = PathFilter.build([session])
    hasher = hashing.Hasher()
    running = WhileRunning(lambda: (keep, hasher))
    collector = SessionCollector(session)
    try:
        assert run_traced(argv, session, "T", cwd=out, tail=collector, running=running) == 0
        running.ended()
        records = collector.read_whole(running.seen).events.records
        running.ended()
        early = {os.path.basename(p): r.digest for p, r in running.found.items()}
        if between is not None:
            between()
        if hashed is not None:
            real = hasher.hash_files

            def spy(paths, *a, **k):
                paths = list(paths)
                hashed.extend(os.path.basename(p) for p in paths)
                return real(paths, *a, **k)

            hasher.hash_files = spy  # type: ignore[method-assign]
        taken = versions(running.classified(records), hasher, early=running.found)
    finally:
        hasher.close()
    return running, early, {os.path.basename(p): v.digest for p, v in taken.outputs.items()}


def _refined(where: Path) -> bool:
    from roar_core.pipeline import hashing

    return os.stat(where).st_dev in hashing.refined_devices()


def test_outputs_hashed_while_the_command_runs_are_the_content_it_left(tmp_path: Path) -> None:
    # The runner's tail hashes the files the command writes while it runs (WhileRunning);
    # at the end a digest stands only where the file's state is the one it was read at.
    # The command rewrites some of them with as many bytes after they were hashed, right
    # away (within a clock tick of each other), and deletes one: every output's digest is
    # the content it left, the truth computed here from the bytes the script wrote.
    _usable()
    import blake3

    script = ("for i in $(seq 1 40); do printf 'first-%02d' $i > f$i.txt; done; sleep 0.5; "
              "for i in $(seq 1 10); do printf 'again-%02d' $i > f$i.txt; done; rm f40.txt")
    _, first, got = _as_run_wait(tmp_path, ["sh", "-c", script])
    if _refined(tmp_path):
        # Read during the half-second pause: the first contents, all of them (those
        # rewritten may have been read again as the command ended).
        assert set(first) == {f"f{i}.txt".encode() for i in range(1, 41)}
        assert all(first[f"f{i}.txt".encode()] == blake3.blake3(b"first-%02d" % i).hexdigest()
                   for i in range(11, 41))
    truth = {f"f{i}.txt".encode(): blake3.blake3(
        (b"again-%02d" if i <= 10 else b"first-%02d") % i).hexdigest() for i in range(1, 40)}
    assert got == truth


def test_files_left_as_the_command_exits_are_hashed_while_its_end_is_read(
        tmp_path: Path) -> None:
    # A command that writes its files and exits before the tail's first read: all of them
    # are hashed as it exits (`ended`), beside the end's read and classification, and the
    # end uses those digests instead of hashing again.  Each is the content left: the
    # truth is the bytes the script wrote; one file is rewritten between the exit's hash
    # and the end's look (another process, with as many bytes): its digest is the new one.
    _usable()
    import time

    import blake3

    n = 200
    script = f"for i in $(seq 1 {n}); do printf 'left-%03d' $i > f$i.txt; done"
    out = tmp_path / "out"

    def rewrite() -> None:
        time.sleep(0.02)  # a clock tick on, whatever the file system's timestamps
        (out / "f7.txt").write_bytes(b"late-007")

    hashed: list = []
    running, early, got = _as_run_wait(tmp_path, ["sh", "-c", script], rewrite, hashed)
    names = {f"f{i}.txt".encode() for i in range(1, n + 1)}
    truth = {f"f{i}.txt".encode(): blake3.blake3(b"left-%03d" % i).hexdigest()
             for i in range(1, n + 1)}
    assert set(early) == names
    assert early == truth  # as they were when the command exited
    truth[b"f7.txt"] = blake3.blake3(b"late-007").hexdigest()
    assert got == truth
    assert hashed == [b"f7.txt"]  # the only one whose state moved since


def test_records_read_out_of_time_order_are_classified_at_once_at_the_end(
        tmp_path: Path) -> None:
    # Two processes' logs read apart: a later read may bring records older than those
    # fed already.  Fed in that order, an input read before the file was rewritten would
    # look like a file the task wrote first; the end classifies all records at once then.
    _usable()
    from roar_core.pipeline.attribution import attribute
    from roar_core.pipeline.capture import WhileRunning
    from roar_core.pipeline.classification import PathFilter, classify

    session = tmp_path / "s"
    session.mkdir()
    (tmp_path / "data.txt").write_text("old\n")
    env = tracer.preload_env(session, tag="T")
    import subprocess

    subprocess.run(["sh", "-c", "cat data.txt > copy.txt; echo new > data.txt"],
                   cwd=tmp_path, env=env, check=True)
    records = attribute(tracelog.read_session(session).logs)["T"].records
    keep = PathFilter.build([session])
    truth = classify(records, keep)
    assert "data.txt" in {os.path.basename(a.name) for a in truth.inputs}
    running = WhileRunning(lambda: (keep, None))  # type: ignore[arg-type]
    cut = next(i for i, r in enumerate(records) if r.path.endswith(b"/data.txt")
               and r.flags & os.O_ACCMODE != os.O_RDONLY)
    running.seen(records[cut:])
    running.seen(records[:cut])
    assert running.classified(records) == truth


def test_no_early_digest_stands_once_a_file_could_be_written_through_a_mapping(
        tmp_path: Path) -> None:
    # A page written through a shared mapping and written again later changes the bytes
    # and none of size, mtime, ctime: an early digest of the first bytes would pass the
    # end's check.  Mapping a file for writing needs an O_RDWR descriptor, which the
    # tracer sees: the end hashes every file then.  The truth: the bytes the script left.
    _usable()
    import sys

    import blake3

    script = ("import mmap, time\n"
              "open('plain.txt', 'wb').write(b'written once')\n"
              "open('m.bin', 'wb').write(bytes(4096))\n"
              "f = open('m.bin', 'r+b')\n"
              "m = mmap.mmap(f.fileno(), 4096)\n"
              "m[0:5] = b'first'\n"
              "time.sleep(0.5)\n"
              "m[0:5] = b'again'\n"
              "m.close()\n")
    running, _, got = _as_run_wait(tmp_path, [sys.executable, "-c", script])
    assert got == {b"plain.txt": blake3.blake3(b"written once").hexdigest(),
                   b"m.bin": blake3.blake3(b"again" + bytes(4091)).hexdigest()}
    assert running.found == {}


def test_an_anonymous_temp_file_opened_read_write_also_stops_early_digests(
        tmp_path: Path) -> None:
    # tempfile.TemporaryFile is O_TMPFILE | O_RDWR on Linux: mappable, and a file linked
    # into place later is an output like any other.
    _usable()
    import sys

    script = ("import tempfile, time\n"
              "open('plain.txt', 'wb').write(b'x')\n"
              "time.sleep(0.3)\n"  # plain.txt is hashed meanwhile
              "t = tempfile.TemporaryFile(dir='.')\n"
              "t.write(b'y')\n"
              "time.sleep(0.3)\n")
    _, without, _ = _as_run_wait(tmp_path / "a", [sys.executable, "-c",
                                                  script.split("t = ")[0]])
    running, _, _ = _as_run_wait(tmp_path / "b", [sys.executable, "-c", script])
    assert running.found == {}
    assert bool(without) is _refined(tmp_path)  # the same script without it: they stand
