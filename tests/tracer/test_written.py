"""What a task wrote, as its process's own log says at its end (`left_states`: the state
each file it may have written was left in).  The shim reads it from its own mapping of the
log (`Shim.written_since`); `tracelog.written_since` reads the same from the log file and
stays the reference: both must name exactly the files the task wrote, and both must say
"cannot tell" where the log cannot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from roar_core.pipeline import tracelog, tracer

pytestmark = pytest.mark.skipif(not tracer.status().usable, reason=tracer.status().reason)

# A traced process that runs one task and prints, as hex, what each reader says it wrote.
TASK = textwrap.dedent('''
    import json, os, subprocess, sys
    from roar_core.pipeline import tracelog, tracer
    from roar_core.recording.tasklog import left_states, trace_mark
    work, what = sys.argv[1], sys.argv[2]
    os.chdir(work)
    shim = tracer.loaded()
    open("held.txt", "w").write("held")
    held = open("held.txt", "a")  # opened before the task, written and closed in it
    open("old.txt", "w").write("old")
    open("in.txt", "w").write("in")
    open("rdwr.txt", "w").write("rdwr")
    open("cut.txt", "w").write("cut")
    open("swap_a.txt", "w").write("a")
    open("swap_b.txt", "w").write("b")
    # Opened and written before the task; the first written through again in it, with no
    # open or close there (a logger's file, an actor's results over its calls).
    kept = open("kept.txt", "ab", buffering=0)
    kept.write(b"before the task")
    quiet = open("quiet.txt", "ab", buffering=0)
    quiet.write(b"before the task")
    os.mkdir("engine")  # an engine's own directory (never lineage), its log held open
    engine_log = open("engine/worker.out", "ab", buffering=0)
    shim.quiet([os.path.join(work, "engine")])
    if what == "two":  # a first task makes a file and leaves it open to the second
        shim.begin("first")
        made = open("made.txt", "ab", buffering=0)
        made.write(b"first")
        shim.end()
        made.write(b" between")  # neither task's
    mark = trace_mark()
    shim.begin("task")
    if what in ("ops", "spawn"):
        with open("in.txt") as f:  # read only: not written
            f.read()
        with open("out.txt", "w") as f:
            f.write("out")
        os.close(os.open("rdwr.txt", os.O_RDWR))  # opened to write, left as it was
        with open("tmp.part", "w") as f:
            f.write("new")
        os.rename("tmp.part", "renamed.txt")
        os.link("out.txt", "linked.txt")
        os.truncate("cut.txt", 1)
        import ctypes  # renameat2(RENAME_EXCHANGE), as `mv --exchange`: both names written
        assert ctypes.CDLL(None, use_errno=True).renameat2(-100, b"swap_a.txt", -100,
                                                           b"swap_b.txt", 2) == 0
        held.write("more")
        held.close()
        kept.write(b" and in it")
        engine_log.write(b":task_name:task")
        os.symlink("in.txt", "sym.txt")  # a new name, no content written
        os.unlink("old.txt")
        os.mkdir("sub")
        with open(os.path.join(os.fsencode(work), b"odd\\xff name.txt"), "wb") as f:
            f.write(b"odd")
        if what == "spawn":
            subprocess.run(["true"], check=True)
    elif what == "tree":  # a directory written, then renamed into place
        os.makedirs("tree.tmp/sub")
        with open("tree.tmp/sub/f.txt", "w") as f:
            f.write("f")
        os.rename("tree.tmp", "tree")
    elif what == "two":
        made.write(b" second")
    elif what == "many":  # more names than the shim's first buffer holds
        for i in range(120):
            with open(f"{'long-name-' * 6}{i:04d}.txt", "w") as f:
                f.write(str(i))
    shim.end()
    hexed = lambda s: None if s is None else sorted(p.hex() for p in s)
    print(json.dumps({"shim": hexed(shim.written_since(mark[1])),
                      "file": hexed(tracelog.written_since(*mark)),
                      "left": hexed(None if (ls := left_states(*mark)) is None
                                    else {os.fsencode(p) for p in ls}),
                      "log": mark[0]}))
''')


def _task(tmp_path: Path, what: str) -> dict:
    work = tmp_path / "work"
    work.mkdir()
    session = tmp_path / "session"
    session.mkdir()
    out = subprocess.run([sys.executable, "-c", TASK, str(work), what], capture_output=True,
                         text=True, env=tracer.preload_env(session), check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for k in ("shim", "file"):
        if got[k] is not None:
            got[k] = {bytes.fromhex(h) for h in got[k]}
    if got["left"] is not None:
        got["left"] = {bytes.fromhex(h) for h in got["left"]}
    return got


def test_the_shim_and_the_file_name_what_the_task_wrote(tmp_path) -> None:
    got = _task(tmp_path, "ops")
    work = os.fsencode(tmp_path / "work")
    wrote = {work + b"/" + n for n in (
        b"out.txt", b"rdwr.txt", b"tmp.part", b"renamed.txt", b"linked.txt", b"cut.txt",
        b"held.txt", b"odd\xff name.txt", b"swap_a.txt", b"swap_b.txt", b"kept.txt")}
    assert got["shim"] == wrote
    assert got["file"] == wrote
    assert got["left"] == wrote  # (tmp.part: its state as left, missing)


def test_neither_says_what_a_task_that_started_a_process_wrote(tmp_path) -> None:
    # The child's writes are in a log of its own: this one cannot tell them.
    got = _task(tmp_path, "spawn")
    assert got["shim"] is None and got["file"] is None and got["left"] is None


def test_more_names_than_the_first_buffer_holds(tmp_path) -> None:
    got = _task(tmp_path, "many")
    work = os.fsencode(tmp_path / "work")
    wrote = {work + b"/" + f"{'long-name-' * 6}{i:04d}.txt".encode() for i in range(120)}
    assert sum(len(p) + 1 for p in wrote) > 4096
    assert got["shim"] == wrote and got["file"] == wrote


def test_a_record_not_committed_yet_means_the_file_cannot_tell(tmp_path) -> None:
    # A record reserved by another thread, not yet committed, ahead of the task's own: what
    # follows it is not read, so the log cannot say everything the task wrote (before, the
    # file reader said "only what came before it", here nothing at all).
    got = _task(tmp_path, "many")
    log = Path(got["log"])
    data = bytearray(log.read_bytes())
    at = tracelog.HEADER_SIZE + int.from_bytes(data[48:56], "little") // 2
    start = tracelog.HEADER_SIZE
    while start + int.from_bytes(data[start:start + 4], "little") <= at:
        start += int.from_bytes(data[start:start + 4], "little")
    data[start + 6:start + 8] = tracelog.STATE_RESERVED.to_bytes(2, "little")
    copy = tmp_path / "roar-1-1.log"
    copy.write_bytes(data)
    assert tracelog.written_since(copy, 0) is None


def test_a_directory_renamed_into_place_leaves_states_it_cannot_name(tmp_path) -> None:
    # The files now in it are named by no record of the log: the task's end cannot give
    # their states (its recorder takes them), rather than none for them.
    got = _task(tmp_path, "tree")
    work = os.fsencode(tmp_path / "work")
    assert got["shim"] == got["file"] == {work + b"/tree.tmp/sub/f.txt", work + b"/tree"}
    assert got["left"] is None


def test_a_file_made_by_one_task_and_written_on_by_the_next_is_the_nexts(tmp_path) -> None:
    # Written through a descriptor the first task opened and left open: the second task
    # opens and closes nothing.  Its end says what the file holds then, under its tag; the
    # write between the tasks is charged as the second begins, to no task.
    got = _task(tmp_path, "two")
    made = os.fsencode(tmp_path / "work" / "made.txt")
    assert got["shim"] == got["file"] == {made}
    changed = [(r.tag, r.st_size) for r in tracelog.read_log(got["log"]).records
               if r.op == tracelog.OP["close"] and r.path == made
               and r.rflags & tracelog.RF_MODIFIED]
    assert changed == [(None, len(b"first between")), ("task", len(b"first between second"))]
