"""One test per interposed call, plus the path, thread, process and crash cases.

The C driver (ops_helper.c) performs exactly the calls named on its command line, so
each test can predict the records the shim must write."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from roar_core.pipeline import tracelog, tracer

HERE = Path(__file__).parent
O_ACC = os.O_RDONLY | os.O_WRONLY | os.O_RDWR


@pytest.fixture(scope="session")
def ops(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("bin") / "ops_helper"
    subprocess.run(["cc", "-O1", "-o", str(out), str(HERE / "ops_helper.c")], check=True)
    return str(out)


@pytest.fixture(scope="session")
def static_true(tmp_path_factory) -> str | None:
    src = tmp_path_factory.mktemp("static") / "s.c"
    src.write_text(
        "#include <fcntl.h>\nint main(void){return open(\"x\", O_RDONLY) >= 0 ? 3 : 4;}\n"
    )
    out = src.with_suffix("")
    r = subprocess.run(["cc", "-static", "-o", str(out), str(src)], capture_output=True)
    return str(out) if r.returncode == 0 else None


@pytest.fixture
def work(tmp_path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.fixture
def session(tmp_path) -> Path:
    d = tmp_path / "session"
    d.mkdir()
    return d


def run(cmd, session: Path, cwd: Path, tag: str | None = None, env_extra=None, **kw):
    env = tracer.preload_env(session, tag=tag)
    env.update(env_extra or {})
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, **kw)


def records(session: Path, under: Path | None = None, op: str | None = None):
    trace = tracelog.read_session(session)
    assert not trace.errors
    out = []
    for log in trace.logs:
        for r in log.records:
            if op and r.op_name != op:
                continue
            if under is not None and not (
                r.path.startswith(bytes(under)) or r.path2.startswith(bytes(under))
            ):
                continue
            out.append(r)
    return out


def norm(p: bytes) -> bytes:
    # The shim joins without normalising ("dir/./f"); the reader's users normalise.
    return os.path.normpath(p) if p.startswith(b"/") else p


def one(recs, op, path: Path | bytes, path2: Path | bytes | None = None):
    p = path if isinstance(path, bytes) else os.fsencode(path)
    found = [r for r in recs if r.op_name == op and norm(r.path) == p]
    if path2 is not None:
        p2 = path2 if isinstance(path2, bytes) else os.fsencode(path2)
        found = [r for r in found if norm(r.path2) == p2]
    assert len(found) == 1, f"expected one {op} {path} {path2}, got {found} in {recs}"
    return found[0]


# ---------------------------------------------------------------- open family


@pytest.mark.parametrize(
    "call", ["open", "open64", "__open_2", "__open64_2", "openat", "openat64", "__openat_2",
             "__openat64_2"],
)
def test_open_variants_relative_paths(ops, work, session, call):
    (work / "in.txt").write_text("data")
    sub = work / "sub"
    sub.mkdir()
    (sub / "f.txt").write_text("x")
    at = "at" in call
    cmd = [ops, "dir", "sub", call, "f.txt", "r"] if at else [ops, call, "in.txt", "r"]
    p = run(cmd, session, work)
    assert p.returncode == 0 and "ERR" not in p.stdout, p.stdout
    r = one(records(session, work, "open"), "open", sub / "f.txt" if at else work / "in.txt")
    assert r.ok and r.result >= 3 and r.flags & O_ACC == os.O_RDONLY
    # The state of the version opened, which is what its digest must be of.
    st = os.stat(sub / "f.txt" if at else work / "in.txt")
    assert r.has(tracelog.RF_STAT)
    assert (r.st_dev, r.st_ino, r.st_size, r.st_mtime_ns, r.st_ctime_ns) == (
        st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def test_open_failure_keeps_errno(ops, work, session):
    p = run([ops, "open", "missing", "r", "open", ".", "w", "open", "e", "wc", "open", "e", "wcx"],
            session, work)
    assert p.stdout.splitlines() == ["ERR open 2", "ERR open 21", "ERR open 17"]
    recs = records(session, work, "open")
    miss = one(recs, "open", work / "missing")
    assert miss.result == -1 and miss.err == 2
    excl = [r for r in recs if r.path == bytes(work / "e")]
    assert [r.err for r in excl] == [0, 17]


def test_creat_is_output_and_existed_flag(ops, work, session):
    (work / "old").write_text("previous")
    p = run([ops, "creat", "new", "close", "creat64", "old", "close"], session, work)
    assert p.returncode == 0, p.stdout
    recs = records(session, work)
    new = one(recs, "open", work / "new")
    old = one(recs, "open", work / "old")
    assert new.flags & os.O_CREAT and new.flags & os.O_TRUNC
    assert not new.has(tracelog.RF_EXISTED)
    # Learnt with an O_EXCL probe: no stat is spent on a truncating open.
    assert old.has(tracelog.RF_EXISTED) and not old.has(tracelog.RF_STAT)
    # Created or truncated: the open record already says "written"; no close record.
    assert not [r for r in recs if r.op_name == "close"]


def test_o_excl_o_trunc_o_append(ops, work, session):
    (work / "t").write_text("0123456789")
    (work / "a").write_text("abc")
    p = run([ops, "open", "x", "wcx", "close", "open", "t", "wt", "close",
             "open", "a", "wa", "write", "def", "close"], session, work)
    assert "ERR" not in p.stdout
    recs = records(session, work)
    assert not one(recs, "open", work / "x").has(tracelog.RF_EXISTED)
    t = one(recs, "open", work / "t")
    assert t.has(tracelog.RF_EXISTED) and t.flags & os.O_TRUNC
    # Created (x) or truncated (t): written by the open itself, no close record.
    assert {r.path for r in recs if r.op_name == "close"} == {bytes(work / "a")}
    a_open = one(recs, "open", work / "a")
    assert a_open.flags & os.O_APPEND and a_open.st_size == 3
    a_close = one(recs, "close", work / "a")
    assert a_close.has(tracelog.RF_MODIFIED) and a_close.st_size == 6


def test_o_rdwr_modified_vs_not(ops, work, session):
    (work / "same").write_text("keep")
    (work / "changed").write_text("keep")
    p = run([ops, "open", "same", "+", "close", "open", "changed", "+", "write", "K", "close"],
            session, work)
    assert "ERR" not in p.stdout
    recs = records(session, work)
    assert not one(recs, "close", work / "same").has(tracelog.RF_MODIFIED)
    assert one(recs, "close", work / "changed").has(tracelog.RF_MODIFIED)
    assert (work / "changed").read_text() == "Keep"


@pytest.mark.parametrize("call", ["fopen", "fopen64"])
def test_fopen_modes_and_buffered_fclose(ops, work, session, call):
    (work / "r.txt").write_text("hello")
    (work / "u.txt").write_text("0123456789")
    p = run([ops, call, "r.txt", "r", "fclose", call, "w.txt", "w", "fputs", "buffered",
             "fclose", call, "r.txt", "a", "fclose", call, "u.txt", "r+", "fputs", "xy",
             "fclose"], session, work)
    assert "ERR" not in p.stdout
    recs = records(session, work)
    opens = [r for r in recs if r.op_name == "open"]
    assert [(r.path, r.flags & (O_ACC | os.O_CREAT | os.O_TRUNC | os.O_APPEND)) for r in opens] == [
        (bytes(work / "r.txt"), os.O_RDONLY),
        (bytes(work / "w.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (bytes(work / "r.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND),
        (bytes(work / "u.txt"), os.O_RDWR),
    ]
    assert all(r.has(tracelog.RF_FOPEN) for r in opens)
    assert not [r for r in recs if r.op_name == "close" and r.path == bytes(work / "w.txt")]
    assert not one(recs, "close", work / "r.txt").has(tracelog.RF_MODIFIED)
    # "xy" sits in the stdio buffer until fclose: the shim flushes before its fstat, so
    # the same-size overwrite is seen (by mtime/ctime).
    u = one(recs, "close", work / "u.txt")
    assert u.has(tracelog.RF_MODIFIED) and u.st_size == 10
    assert (work / "u.txt").read_text() == "xy23456789"


def test_freopen(ops, work, session):
    (work / "a").write_text("a")
    p = run([ops, "fopen", "a", "r", "freopen", "b", "w", "fputs", "bb", "fclose"], session, work)
    assert "ERR" not in p.stdout
    recs = records(session, work)
    one(recs, "open", work / "a")
    b = one(recs, "open", work / "b")  # created: written by the open, no close record
    assert b.flags & os.O_CREAT and not b.has(tracelog.RF_EXISTED)
    assert not [r for r in recs if r.op_name == "close"]
    assert (work / "b").read_text() == "bb"


# ---------------------------------------------------------------- namespace ops


@pytest.mark.parametrize("call", ["rename", "renameat", "renameat2"])
def test_rename_into_place(ops, work, session, call):
    pre = ["dir", "."] if "at" in call else []
    p = run([ops, *pre, "open", "out.tmp", "wct", "write", "v", "close", call, "out.tmp", "out"],
            session, work)
    assert "ERR" not in p.stdout
    recs = records(session, work)
    one(recs, "rename", work / "out.tmp", work / "out")
    assert (work / "out").read_text() == "v"


@pytest.mark.parametrize("call", ["link", "linkat"])
def test_hard_links(ops, work, session, call):
    (work / "a").write_text("a")
    pre = ["dir", "."] if call == "linkat" else []
    run([ops, *pre, call, "a", "b"], session, work)
    r = one(records(session, work), "link", work / "a", work / "b")
    assert r.ok and os.path.samefile(work / "a", work / "b")


@pytest.mark.parametrize("call", ["symlink", "symlinkat"])
def test_symlinks_keep_target_text(ops, work, session, call):
    (work / "t").write_text("t")
    pre = ["dir", "."] if call == "symlinkat" else []
    run([ops, *pre, call, "t", "l", "open", "l", "r"], session, work)
    recs = records(session, work)
    s = [r for r in recs if r.op_name == "symlink"]
    assert len(s) == 1 and s[0].path == b"t" and norm(s[0].path2) == bytes(work / "l")
    one(recs, "open", work / "l")  # resolution to the target is the reader's job


@pytest.mark.parametrize("call", ["unlink", "unlinkat", "remove"])
def test_create_then_unlink(ops, work, session, call):
    pre = ["dir", "."] if call == "unlinkat" else []
    run([ops, *pre, "open", "tmp", "wc", "close", call, "tmp"], session, work)
    recs = records(session, work)
    assert one(recs, "unlink", work / "tmp").ok
    assert not (work / "tmp").exists()


@pytest.mark.parametrize("call", ["truncate", "truncate64"])
def test_truncate(ops, work, session, call):
    (work / "f").write_text("0123456789")
    run([ops, call, "f", "3"], session, work)
    assert one(records(session, work), "truncate", work / "f").ok
    assert (work / "f").read_text() == "012"


def test_directories(ops, work, session):
    p = run([ops, "mkdir", "d1", "dir", ".", "mkdirat", "d2", "rmdir", "d1",
             "unlinkat-dir", "d2", "rmdir", "nonexistent"], session, work)
    assert p.stdout.strip() == "ERR rmdir 2"
    recs = records(session, work)
    assert one(recs, "mkdir", work / "d1").ok and one(recs, "mkdir", work / "d2").ok
    assert one(recs, "rmdir", work / "d1").ok and one(recs, "rmdir", work / "d2").ok
    assert one(recs, "rmdir", work / "nonexistent").err == 2


def test_chdir_and_fchdir_update_relative_paths(ops, work, session):
    (work / "a").mkdir()
    (work / "b").mkdir()
    for d in "ab":
        (work / d / "f").write_text(d)
    run([ops, "chdir", "a", "open", "f", "r", "dir", "../b", "fchdir", "open", "f", "r"],
        session, work)
    recs = records(session, work)
    one(recs, "open", work / "a" / "f")
    # After fchdir the cwd is re-read from the kernel: no ".." left in it.
    one(recs, "open", work / "b" / "f")
    assert [r.path for r in recs if r.op_name == "chdir"] == [bytes(work / "a"), bytes(work / "b")]


@pytest.mark.parametrize("call", ["dup", "dup2", "dup3"])
def test_writes_through_a_dup_are_seen(ops, work, session, call):
    (work / "f").write_text("old")
    arg = [] if call == "dup" else ["9"]
    # Close the original first: the write goes through the duplicate only.
    run([ops, "open", "f", "+", "dup" if call == "dup" else call, *arg, "write", "N"],
        session, work)
    recs = records(session, work)
    dups = records(session, op="dup")
    assert len(dups) == 1 and dups[0].result == (9 if call != "dup" else dups[0].result)
    # The process exits with both fds open: the exit scan records their final state.
    closes = [r for r in recs if r.op_name == "close"]
    assert closes and all(r.path == bytes(work / "f") for r in closes)
    assert any(r.has(tracelog.RF_MODIFIED) for r in closes)


def test_dup2_over_a_tracked_fd_records_its_close(ops, work, session):
    """The shell pattern: a written fd 5 is replaced by dup2(other, 5)."""
    (work / "b").write_text("b")
    (work / "w").write_text("0")  # updated in place: tracked to its close
    run([ops, "open", "w", "w", "write", "1", "dup2", "5", "open", "b", "r", "dup2", "5"],
        session, work)
    recs = records(session, work)
    closes = [r for r in recs if r.op_name == "close" and r.path == bytes(work / "w")]
    # fd 5 (a dup of w) is closed by the second dup2; the original fd at exit.
    assert len(closes) == 2 and all(r.has(tracelog.RF_MODIFIED) for r in closes)
    assert {r.fd for r in closes} == {5, next(r.result for r in recs if r.op_name == "open"
                                              and r.path == bytes(work / "w"))}


# ---------------------------------------------------------------- paths


@pytest.mark.parametrize(
    "name",
    [b"with space.txt", b"new\nline.txt", b"latin1-\xe9\xff.txt", b"\xc3\x28-invalid-utf8"],
)
def test_odd_path_bytes(ops, work, session, name):
    p = run([ops, "open", os.fsdecode(name), "wct", "write", "z", "close"], session, work)
    assert p.returncode == 0
    one(records(session, work), "open", bytes(work) + b"/" + name)


def test_long_paths(ops, work, session):
    # ~4,000 bytes absolute: nest directories of 200 bytes.
    d = work
    while len(bytes(d)) < 3800:
        d = d / ("d" * 200)
    d.mkdir(parents=True)
    target = d / ("f" * 150)
    assert len(bytes(target)) > 3900
    rel = os.path.relpath(target, work)
    p = run([ops, "open", rel, "wct", "write", "q", "close"], session, work)
    assert "ERR" not in p.stdout
    r = one(records(session, work), "open", target)
    assert not r.has(tracelog.RF_PATH_TRUNC)


# ---------------------------------------------------------------- exec / spawn / fork


def child_logs(session: Path, exe_suffix: bytes):
    trace = tracelog.read_session(session)
    return [
        log for log in trace.logs
        if log.records and log.records[0].op_name == "start"
        and log.records[0].path.endswith(exe_suffix)
    ]


@pytest.mark.parametrize("call", ["execve", "execv", "execvp", "execvpe", "execl", "execlp"])
def test_exec_family_passes_the_tag(ops, work, session, call):
    (work / "in").write_text("in")
    prog = "cat" if call.endswith("p") or call == "execvpe" else shutil.which("cat")
    argv = [prog, "in"] if call.startswith("execl") else [prog, "cat", "in"]
    p = run([ops, call, *argv], session, work, tag="task-7")
    assert p.returncode == 0 and p.stdout == "in", (p.stdout, p.stderr)
    recs = records(session, op="exec")
    assert len(recs) == 1 and recs[0].path == os.fsencode(shutil.which("cat"))
    assert recs[0].argv[-1] == b"in" and recs[0].tag == "task-7"
    (log,) = child_logs(session, b"/cat")
    reads = [r for r in log.records if r.op_name == "open" and r.path == bytes(work / "in")]
    assert len(reads) == 1 and reads[0].tag == "task-7"


def test_exec_with_sanitised_env_is_still_traced(ops, work, session):
    """execle with an environment that drops LD_PRELOAD: the shim re-adds itself."""
    (work / "in").write_text("in")
    p = run([ops, "execle", shutil.which("cat"), "in"], session, work, tag="t-env")
    assert p.stdout == "in"
    (log,) = child_logs(session, b"/cat")
    assert any(r.path == bytes(work / "in") and r.tag == "t-env" for r in log.records)


def test_exec_failure_recorded(ops, work, session):
    p = run([ops, "execve", str(work / "nope"), "nope"], session, work)
    assert p.stdout.strip() == "ERR execve 2" and p.returncode == 127
    fails = records(session, op="exec_fail")
    assert len(fails) == 1 and fails[0].err == 2


@pytest.mark.parametrize("call", ["posix_spawn", "posix_spawnp"])
def test_posix_spawn(ops, work, session, call):
    (work / "in").write_text("in")
    prog = shutil.which("cat") if call == "posix_spawn" else "cat"
    p = run([ops, call, prog, "cat", "in"], session, work, tag="sp")
    child = int(p.stdout.split("CHILD ")[1].split()[0])
    spawn = records(session, op="spawn")
    assert len(spawn) == 1 and spawn[0].result == child and spawn[0].tag == "sp"
    (log,) = child_logs(session, b"/cat")
    assert log.header.pid == child
    assert any(r.path == bytes(work / "in") and r.tag == "sp" for r in log.records)


def test_fork_child_has_own_log_and_inherits_tag(ops, work, session):
    (work / "c").write_text("c")
    p = run([ops, "fork-open", "c"], session, work, tag="parent-task")
    child = int(p.stdout.split("CHILD ")[1].split()[0])
    trace = tracelog.read_session(session)
    forks = [r for log in trace.logs for r in log.records if r.op_name == "fork"]
    assert [r.result for r in forks] == [child]
    (clog,) = [log for log in trace.logs if log.header.pid == child]
    assert clog.header.origin == tracelog.ORIGIN_FORK
    opens = [r for r in clog.records if r.op_name == "open" and r.path == bytes(work / "c")]
    assert len(opens) == 1 and opens[0].tag == "parent-task" and opens[0].pid == child


def test_vfork_exec(ops, work, session):
    (work / "in").write_text("v")
    p = run([ops, "vfork-exec", shutil.which("cat"), "cat", "in"], session, work, tag="vf")
    # The parent's "CHILD" line and cat's output may come in either order.
    assert p.returncode == 0 and re.sub(r"CHILD \d+\n", "", p.stdout) == "v"
    execs = records(session, op="exec")
    # The exec happens in the vfork child (sharing the parent's memory, so its record
    # lands in the parent's log) and carries the child's own pid.
    (log,) = child_logs(session, b"/cat")
    assert len(execs) == 1 and execs[0].pid == log.header.pid and execs[0].tag == "vf"
    assert f"CHILD {log.header.pid}" in p.stdout
    assert any(r.path == bytes(work / "in") and r.tag == "vf" for r in log.records)


def test_fork_exec_chain_five_deep_keeps_the_tag(work, session):
    script = work / "chain.py"
    script.write_text(textwrap.dedent("""
        import os, subprocess, sys
        depth = int(sys.argv[1])
        with open(f"level{depth}.txt", "w") as f:
            f.write(str(depth))
        if depth < 5:
            pid = os.fork()
            if pid == 0:
                os.execv(sys.executable, [sys.executable, sys.argv[0], str(depth + 1)])
            os.waitpid(pid, 0)
    """))
    p = run([sys.executable, str(script), "1"], session, work, tag="deep")
    assert p.returncode == 0, p.stderr
    recs = records(session, work, "open")
    levels = {r.path: r for r in recs if r.path.endswith(b".txt") and b"level" in r.path}
    assert sorted(levels) == [bytes(work / f"level{i}.txt") for i in range(1, 6)]
    assert {r.tag for r in levels.values()} == {"deep"}
    assert len({r.pid for r in levels.values()}) == 5


def test_static_binary_is_recorded_as_untraceable(work, session, static_true):
    if static_true is None:
        pytest.skip("no static libc to link a static test binary (libc6-dev static archive)")
    script = f"import subprocess,sys; sys.exit(subprocess.run([{static_true!r}]).returncode)"
    p = run([sys.executable, "-c", script], session, work)
    assert p.returncode == 4  # the program still ran, exactly as untraced
    execs = [r for r in records(session, op="exec") if r.path == os.fsencode(static_true)]
    assert len(execs) == 1 and execs[0].has(tracelog.RF_UNTRACEABLE)
    assert not child_logs(session, os.fsencode(static_true).split(b"/")[-1])


def test_dynamic_binary_is_not_flagged(ops, work, session):
    run([ops, "execv", shutil.which("true"), "true"], session, work)
    (e,) = records(session, op="exec")
    assert not e.has(tracelog.RF_UNTRACEABLE)


# ---------------------------------------------------------------- threads, tags, crashes


THREADS = textwrap.dedent("""
    import threading, sys
    N = 64
    barrier = threading.Barrier(N)
    def work(i):
        barrier.wait()
        for j in range(50):
            with open(f"t{i}_{j}.txt", "w") as f:
                f.write("x")
    ts = [threading.Thread(target=work, args=(i,)) for i in range(N)]
    [t.start() for t in ts]
    [t.join() for t in ts]
""")


def test_64_threads_no_lost_or_torn_records(work, session):
    p = run([sys.executable, "-c", THREADS], session, work)
    assert p.returncode == 0, p.stderr
    trace = tracelog.read_session(session)
    assert trace.dropped == 0
    opens = [r for log in trace.logs for r in log.records
             if r.op_name == "open" and r.path.startswith(bytes(work) + b"/t")]
    assert len(opens) == 64 * 50
    assert {r.path for r in opens} == {bytes(work / f"t{i}_{j}.txt")
                                       for i in range(64) for j in range(50)}
    assert len({r.tid for r in opens}) == 64


TAGS = textwrap.dedent("""
    import threading, sys
    from roar_core.pipeline import tracer
    shim = tracer.loaded()
    assert shim is not None and shim.active() and shim.version() == 1
    def task(name, ev_in, ev_out):
        shim.begin(name)
        ev_in.set(); ev_out.wait()
        open(name + ".own", "w").close()
        shim.end()
    def helper_thread(fname):
        open(fname, "w").close()
    # one task active: a helper thread is attributed to it through the fallback
    shim.begin("solo")
    t = threading.Thread(target=helper_thread, args=("solo.helper",)); t.start(); t.join()
    shim.end()
    # two tasks active on two threads: an untagged thread cannot be attributed
    a_in, a_out, b_in, b_out = (threading.Event() for _ in range(4))
    ta = threading.Thread(target=task, args=("A", a_in, a_out))
    tb = threading.Thread(target=task, args=("B", b_in, b_out))
    ta.start(); tb.start(); a_in.wait(); b_in.wait()
    t = threading.Thread(target=helper_thread, args=("ambiguous.helper",)); t.start(); t.join()
    a_out.set(); b_out.set(); ta.join(); tb.join()
    # a process tag (e.g. an actor) covers threads outside any task
    shim.process_tag("actor-1")
    t = threading.Thread(target=helper_thread, args=("actor.helper",)); t.start(); t.join()
    shim.process_tag(None)
    open("none.helper", "w").close()
    assert shim.dropped() == 0 and shim.flush()
    print(shim.log_path())
""")


def test_task_tag_api_thread_local_and_fallback(work, session):
    p = run([sys.executable, "-c", TAGS], session, work)
    assert p.returncode == 0, p.stderr
    recs = {r.path.rsplit(b"/", 1)[-1]: r for r in records(session, work, "open")}
    assert recs[b"A.own"].tag == "A" and recs[b"B.own"].tag == "B"
    assert recs[b"solo.helper"].tag == "solo" and recs[b"solo.helper"].has(
        tracelog.RF_TAG_INHERITED)
    assert recs[b"ambiguous.helper"].tag is None
    assert recs[b"actor.helper"].tag == "actor-1"
    assert recs[b"none.helper"].tag is None
    assert Path(p.stdout.strip()).parent == session
    begins = [r.tag for r in records(session, op="task_begin")]
    assert sorted(begins) == ["A", "B", "solo"]


def test_sigkill_mid_run_keeps_records(ops, work, session):
    (work / "f").write_text("f")
    env = tracer.preload_env(session)
    proc = subprocess.Popen([ops, "loop-open", "f"], cwd=work, env=env, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"READY"
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    trace = tracelog.read_session(session)
    (log,) = trace.logs
    opens = [r for r in log.records if r.op_name == "open" and r.path == bytes(work / "f")]
    assert len(opens) > 1000  # everything up to the kill, across several chunks too
    assert not any(r.op_name == "exit" for r in log.records)
    # At most the records being written at the moment of the kill can be torn.
    assert log.torn <= 1


def test_truncated_log_is_read_up_to_the_cut(ops, work, session):
    run([ops, "open", "a", "wct", "close", "open", "b", "wct", "close"], session, work)
    (path,) = map(Path, tracelog.log_files(session))
    full = tracelog.read_log(path)
    data = path.read_bytes()
    header_end = tracelog.HEADER_SIZE
    last = full.next_offset
    cut = path.parent / "cut.log"
    cut.write_bytes(data[: header_end + last - 20])  # inside the final record
    part = tracelog.read_log(cut)
    assert len(part.records) == len(full.records) - 1 and part.torn == 1
    bad = path.parent / "bad.log"
    bad.write_bytes(b"garbage" * 1000)
    with pytest.raises(tracelog.TraceLogError, match="not a roar trace log"):
        tracelog.read_log(bad)


def test_disable_switch_and_unwritable_session(ops, work, session, tmp_path):
    (work / "f").write_text("f")
    p = run([ops, "open", "f", "r"], session, work, env_extra={"ROAR_TRACER_OFF": "1"})
    assert p.returncode == 0 and not tracelog.log_files(session)
    ro = tmp_path / "ro"
    ro.mkdir()
    p = run([ops, "open", "f", "r", "open", "missing", "r"], ro / "does-not-exist", work)
    assert p.returncode == 0 and p.stdout.strip() == "ERR open 2"


def _in_private_tmpfs(size: str, mnt: Path, cmd: list[str]) -> list[str] | None:
    """`cmd` run with a fresh tmpfs of `size` mounted on `mnt`, in a mount namespace of its
    own (as root, or through a user namespace); None where neither is allowed here."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    script = 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"'
    for flags in (["-m"], ["-r", "-m"]):
        run = [unshare, *flags, "sh", "-c", script, "sh", size, str(mnt)]
        if subprocess.run([*run, "true"], capture_output=True).returncode == 0:
            return [*run, *cmd]
    return None


def test_a_full_tmpfs_drops_events_instead_of_killing_the_program(ops, work, tmp_path):
    # Pages of a shared mapping that tmpfs cannot back raise SIGBUS when first touched: the
    # shim reserves them when it creates the log, and goes without a log when it cannot.
    (work / "f").write_text("data")
    mnt = tmp_path / "small"
    mnt.mkdir()
    cmd = _in_private_tmpfs("4k", mnt, [str(ops), "open", "f", "r"])
    if cmd is None:
        pytest.skip("no mount namespace here (unshare -m / -r -m refused)")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ROAR_TASK_TAG")}
    env.update(tracer.preload_env(mnt, base={}))
    p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, (p.returncode, p.stderr)  # -SIGBUS before
    assert p.stdout == ""  # the open itself worked (the helper prints only failures)


_FILL_AND_READ = textwrap.dedent("""
    import json, os, subprocess, sys
    from roar_core.pipeline import tracelog
    mnt, work, env = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    # Thousands of records: far more than the room left on the tmpfs after the log's start.
    child = "for i in range(3000): open('f%d' % i, 'w').close()"
    rc = subprocess.run([sys.executable, "-c", child], cwd=work, env=env).returncode
    trace = tracelog.read_session(mnt)
    opened = [r.path for log in trace.logs for r in log.records if r.op_name == "open"
              and r.path.startswith(os.fsencode(work))]
    print(json.dumps({"rc": rc, "errors": trace.errors, "logs": len(trace.logs),
                      "opened": len(opened), "dropped": trace.dropped,
                      "first": os.fsdecode(opened[0]) if opened else None}))
""")


def test_a_log_that_fills_its_tmpfs_keeps_what_it_holds(work, tmp_path):
    # The log's pages are allocated an extent at a time, ahead of its records: when tmpfs
    # cannot give the next one, later events are dropped (counted), the program runs on, and
    # the log stays readable to its end (a reader touching an unbacked page would SIGBUS too).
    mnt = tmp_path / "small"
    mnt.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ROAR_TASK_TAG")}
    traced = {**env, **tracer.preload_env(mnt, base={})}
    import json

    cmd = _in_private_tmpfs("48k", mnt, [sys.executable, "-c", _FILL_AND_READ, str(mnt),
                                         str(work), json.dumps(traced)])
    if cmd is None:
        pytest.skip("no mount namespace here (unshare -m / -r -m refused)")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0 and len(list(work.iterdir())) == 3000  # the program ran on
    assert got["errors"] == [] and got["logs"] >= 1
    # What fitted was kept, from the start; the rest is counted as lost, not silently gone.
    assert 0 < got["opened"] < 3000 and got["first"] == str(work / "f0")
    assert got["dropped"] >= 3000 - got["opened"]


def test_a_short_process_log_allocates_an_extent_not_a_chunk(work):
    # Most traced processes write a few records; allocating (then zeroing and freeing) a
    # whole chunk of tmpfs pages for each was a third of their tracing cost.
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.statvfs(shm).f_bsize == 0:
        pytest.skip("no /dev/shm")
    probe = subprocess.run(["stat", "-f", "-c", "%T", str(shm)], capture_output=True, text=True)
    if probe.stdout.strip() != "tmpfs":
        pytest.skip("/dev/shm is not tmpfs here")
    import tempfile

    with tempfile.TemporaryDirectory(dir=shm) as d:
        p = subprocess.run(["/bin/true"], cwd=work, env=tracer.preload_env(Path(d)))
        assert p.returncode == 0
        logs = tracelog.log_files(d)
        assert len(logs) == 1
        log = tracelog.read_log(logs[0])
        assert [r.op_name for r in log.records][:1] == ["start"] and log.dropped == 0
        allocated = os.stat(logs[0]).st_blocks * 512
        assert allocated <= tracelog.HEADER_SIZE + 16 * 1024, allocated
        assert os.path.getsize(logs[0]) == tracelog.HEADER_SIZE + tracelog.CHUNK


def test_incremental_read_of_a_live_log(work, session):
    code = textwrap.dedent("""
        import sys
        from roar_core.pipeline import tracer
        shim = tracer.loaded()
        print(shim.log_path(), flush=True)
        sys.stdin.readline()
        open("second", "w").close()
        print("done", flush=True)
        sys.stdin.readline()
    """)
    env = tracer.preload_env(session)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=work, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    log_path = proc.stdout.readline().strip()
    first = tracelog.read_log(log_path, final=False)
    assert not any(r.path == bytes(work / "second") for r in first.records)
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "done"
    more = tracelog.read_log(log_path, start=first.next_offset, final=False)
    assert [r.path for r in more.records if r.op_name == "open"] == [bytes(work / "second")]
    proc.stdin.write("\n")
    proc.stdin.close()
    proc.wait()


def test_tracer_status_reports_usable():
    st = tracer.status()
    assert st.usable, st.reason
    assert os.path.basename(st.path) == "libroar_preload.so" and os.path.isfile(st.path)


def test_create_probe_keeps_semantics(ops, work, session):
    """O_CREAT opens are first tried with O_EXCL: the program must not see a difference."""
    (work / "exists").write_text("keep")
    os.symlink("target-not-yet", work / "dangling")
    p = run([ops, "open", "nodir/x", "wc", "open", "exists", "wc", "close",
             "open", "dangling", "wc", "write", "t", "close", "open", "dir", "wcd"],
            session, work)
    assert p.stdout.splitlines() == ["ERR open 2", "ERR open 22"], p.stdout
    assert (work / "exists").read_text() == "keep"  # O_CREAT alone never truncates
    assert (work / "target-not-yet").read_text() == "t"  # created through the symlink
    recs = records(session, work, "open")
    assert [r.err for r in recs if r.path.endswith(b"nodir/x")] == [2]
    ex = one(recs, "open", work / "exists")
    assert ex.has(tracelog.RF_EXISTED) and ex.has(tracelog.RF_STAT) and ex.st_size == 4
    assert not one(records(session, work), "close", work / "exists").has(tracelog.RF_MODIFIED)
    # One record per open call, probe or not.
    assert len(recs) == 4


def test_close_range_records_writable_fds(work, session):
    code = textwrap.dedent("""
        import os
        fd = os.open("x", os.O_WRONLY)    # existing files, updated in place: their
        os.write(fd, b"data")              # fds are tracked to the close
        os.closerange(fd, fd + 1)          # close_range(2) in glibc >= 2.34
        fd2 = os.open("y", os.O_WRONLY)    # reuses the fd number
        os.close(fd2)
    """)
    (work / "x").write_text("old")
    (work / "y").write_text("old")
    p = run([sys.executable, "-c", code], session, work)
    assert p.returncode == 0, p.stderr
    recs = records(session, work, "close")
    assert [Path(os.fsdecode(r.path)).name for r in recs] == ["x", "y"]
    assert recs[0].has(tracelog.RF_MODIFIED)


def test_fcntl_dupfd_is_tracked(work, session):
    (work / "x").write_text("old")
    code = textwrap.dedent("""
        import fcntl, os
        fd = os.open("x", os.O_WRONLY)
        d = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(fd)
        os.write(d, b"NEW CONTENT")
        os.close(d)
    """)
    p = run([sys.executable, "-c", code], session, work)
    assert p.returncode == 0, p.stderr
    closes = records(session, work, "close")
    assert len(closes) == 2 and not closes[0].has(tracelog.RF_MODIFIED)
    assert closes[1].fd >= 10 and closes[1].has(tracelog.RF_MODIFIED)
    assert closes[1].st_size == len("NEW CONTENT")


def test_mkstemp_family_is_recorded(work, session):
    code = "import tempfile; [tempfile.mkstemp(dir='.') for _ in range(2)]"
    # Python's tempfile uses os.open; C programs use glibc's mkstemp: use sed -i too.
    (work / "f.txt").write_text("a\n")
    run([sys.executable, "-c", code], session, work)
    run(["sed", "-i", "s/a/b/", "f.txt"], session, work)
    opens = [r for r in records(session, work, "open") if r.flags & os.O_EXCL]
    sed_tmp = [r for r in opens if b"/sed" in r.path]
    assert len(opens) == 3 and len(sed_tmp) == 1
    (ren,) = records(session, work, "rename")
    assert ren.path == sed_tmp[0].path and norm(ren.path2) == bytes(work / "f.txt")
