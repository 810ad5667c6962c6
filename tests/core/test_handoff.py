"""What a run's end line hands the recorder, and what the recorder answers a waiting runner.

- The versions (capture format 2) come back from the line exactly as they were taken, for a
  real traced command that reads, edits in place, writes, renames, deletes and names a file
  with bytes that are not UTF-8; a line of format 1 (written before an upgrade) still reads.
- The line carries what the runner's whole read of its session found: the recorder records
  the run from it without reading the tracer logs again (here they are gone by then).
- `run --wait` gets a short answer (five files of each kind and the counts); the API, which
  hands the whole result to its caller, still gets every file.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path

import blake3
import pytest

from roar_core import config
from roar_core.api import Roar
from roar_core.cli.run import answer, result_of
from roar_core.cli.run import run as run_cli
from roar_core.pipeline import capture as capture_mod
from roar_core.pipeline import tracer
from roar_core.pipeline.classification import PathFilter
from roar_core.recording import recorder
from roar_core.recording.sessions import SessionCollector, memory_sessions_dir, run_traced
from tests.core.test_cli import ROAR, make_cli
from tests.core.test_exact_lineage import accesses, b3, run

ODD = b"caf\xe9-\xff.txt"  # not UTF-8: carried with surrogate escapes


def _usable() -> None:
    if not tracer.status().usable:
        pytest.skip(tracer.status().reason)


def _traced_capture(tmp_path: Path) -> capture_mod.Capture:
    """The versions a real traced command left, taken as `roar-core run` takes them."""
    _usable()
    work = tmp_path / "work"
    work.mkdir()
    (work / "in.txt").write_text("input\n")
    (work / "edit.txt").write_text("before\n")
    (work / "old.txt").write_text("deleted by the task\n")
    session = tmp_path / "session"
    session.mkdir()
    script = (
        "cat in.txt > out.txt; cat edit.txt >> out.txt; echo after >> edit.txt; "
        "echo tmp > tmp.txt; rm tmp.txt; rm old.txt; echo part > part.txt; "
        "mv part.txt whole.txt; printf odd > \"$(printf 'caf\\351-\\377.txt')\""
    )
    rc = run_traced(["sh", "-c", script], session, "T", cwd=work)
    assert rc == 0
    records = SessionCollector(session).read_whole().events.records
    cfg = config.load(cwd=work, env={"ROAR_HOME": str(tmp_path / "home")})
    with capture_mod.hasher_for(cfg, stat_cache=False) as hasher:
        c = capture_mod.capture(records, PathFilter.for_config(cfg), hasher)
    # The command's files are all there, as the truth the round trip must keep.
    outs = {os.path.basename(p) for p in c.outputs}
    assert {b"out.txt", b"edit.txt", b"whole.txt", ODD} <= outs, outs
    assert c.outputs[os.path.join(os.fsencode(work), ODD)].digest == blake3.blake3(
        b"odd").hexdigest()
    assert any(os.path.basename(a.path) == b"old.txt" for a in c.io.deleted)
    assert any(os.path.basename(a.path) == b"tmp.txt" for a in c.io.transient)
    return c


def _as_logged(data: dict) -> dict:
    """Through a task log line and back, as the recorder reads it."""
    line = json.dumps({"e": "x", "c": data}, separators=(",", ":"), default=str)
    return json.loads(line.encode("utf-8", "surrogateescape"))["c"]


def test_versions_come_back_from_the_line_as_taken(tmp_path: Path) -> None:
    c = _traced_capture(tmp_path)
    data = capture_mod.to_dict(c)
    assert capture_mod.from_dict(_as_logged(data)) == c
    # A path is in the line once per access (edit.txt: read, then written); its versions
    # name it by its access.
    text = json.dumps(data)
    every = [a.path for a in c.io.all() + c.io.code]
    for a in c.io.outputs:
        assert text.count(json.dumps(os.fsdecode(a.path))) == every.count(a.path), a.path


def test_a_line_with_a_broken_file_state_is_refused(tmp_path: Path) -> None:
    # Never a state of other fields (compared with the stat cache's and the file's): the
    # line is refused as a whole, as the named tuple's own constructor refused it.
    data = capture_mod.to_dict(_traced_capture(tmp_path))
    broken = next(a for a in data["outputs"] if a[7] is not None)
    broken[7] = broken[7][:3]
    with pytest.raises(ValueError, match="not a file state"):
        capture_mod.from_dict(_as_logged(data))


def _format_1(c: capture_mod.Capture) -> dict:
    """A capture as roar-core wrote it before format 2 (paths and states in full)."""
    def state(s):
        return None if s is None else list(s)

    def access(a):
        return [os.fsdecode(a.path), a.name, a.role, a.read_via, state(a.pre_state),
                a.first_ns, a.existed, state(a.state)]

    io = c.io
    data = {k: [access(a) for a in getattr(io, k)]
            for k in ("inputs", "outputs", "transient", "deleted", "code")}
    data["commands"], data["untraceable"] = io.commands, io.untraceable
    for k in ("inputs", "outputs", "code"):
        data["v_" + k] = [[os.fsdecode(p), v.digest, v.size, state(v.state), v.why]
                          for p, v in getattr(c, k).items()]
    return data


def test_a_line_of_format_1_still_reads(tmp_path: Path) -> None:
    c = _traced_capture(tmp_path)
    assert capture_mod.from_dict(_as_logged(_format_1(c))) == c


def test_the_recorder_records_from_the_runners_read_not_the_logs_again(tmp_path: Path) -> None:
    """The run's tracer logs are removed after `roar-core run` ended and before any
    recorder could look at them: the run is recorded as traced, with its output's digest,
    from its end line alone.  (A recorder that reads the session again finds no log and
    records the run as untraced: its program 'left no trace'.)"""
    _usable()
    cli = make_cli(tmp_path)
    sessions = Path(config.load(cwd=cli.cwd, env=cli.env).sessions_dir)
    sessions.mkdir(parents=True)
    lock = os.open(sessions / recorder.LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)  # the recorder `run` starts finds it held and leaves
    try:
        run_id = run(cli, "w", "printf data > out.txt")
        (own,) = [d for d in Path(memory_sessions_dir()).iterdir() if d.name.startswith("run-")]
        logs = [p for p in own.iterdir() if p.name.endswith(".log")]
        assert logs, "the command left no tracer log"
        for p in logs:
            p.unlink()
    finally:
        os.close(lock)
    digests = accesses(cli, run_id)  # `show` first: the recorder records it now
    assert digests == {"output": {str(cli.cwd / "out.txt"): (b3(b"data"), None)}}
    from roar_core.pipeline.store import Store

    cfg = config.load(cwd=cli.cwd, env=cli.env)
    with Store.open(cfg.database_url, cfg.home) as store:
        assert store.task_run(run_id).traced is True


def test_a_runs_trace_is_in_memory_its_task_log_under_the_home(tmp_path: Path) -> None:
    """The run's tracer logs go to the in-memory sessions directory, its task log stays
    under the roar home; once recorded, neither is left."""
    _usable()
    cli = make_cli(tmp_path)
    sessions = Path(config.load(cwd=cli.cwd, env=cli.env).sessions_dir)
    sessions.mkdir(parents=True)
    memory = Path(memory_sessions_dir())
    lock = os.open(sessions / recorder.LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)  # no recorder records it meanwhile
    try:
        run_id = run(cli, "w", "printf data > out.txt")
        assert not [d for d in sessions.iterdir() if d.name.startswith("run-")]
        (own,) = [d for d in memory.iterdir() if d.name.startswith("run-")]
        assert [p for p in own.iterdir() if p.name.endswith(".log")]
        (log,) = [p for p in sessions.iterdir() if p.name.startswith("tasks-")]
        begun = json.loads(log.read_text().splitlines()[1])
        assert begun["b"]["run_id"] == run_id and begun["d"] == str(own)
    finally:
        os.close(lock)
    assert accesses(cli, run_id) == {"output": {str(cli.cwd / "out.txt"): (b3(b"data"), None)}}
    assert not [d for d in memory.iterdir() if d.name.startswith("run-")]
    assert not [p for p in sessions.iterdir() if p.name.startswith("tasks-")]


def test_a_runs_trace_stays_beside_its_log_where_memory_has_no_room(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A container's /dev/shm (64 MiB) would fill with a big run's tracer logs and drop
    their events: with less than MEMORY_FREE_MIN free there, they go beside the task log."""
    from roar_core.cli import run as runner

    cfg = config.load(cwd=tmp_path, env={}, home=str(tmp_path / "home"))
    free = runner.MEMORY_FREE_MIN
    real = os.statvfs

    def statvfs(path):
        st = real(path)
        blocks = free // st.f_frsize
        return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, blocks, blocks,
                                  st.f_files, st.f_ffree, st.f_favail, st.f_flag,
                                  st.f_namemax))

    monkeypatch.setattr(os, "statvfs", statvfs)
    roomy = runner.begin(cfg, ["true"], "t", True)
    free -= 1 << 20
    short = runner.begin(cfg, ["true"], "t", True)
    assert os.path.dirname(roomy.own) == memory_sessions_dir() and os.path.isdir(roomy.own)
    assert os.path.dirname(short.own) == cfg.sessions_dir and os.path.isdir(short.own)
    begun = [json.loads(line)["d"] for line in Path(short.log.path).read_text().splitlines()
             if '"b"' in line]
    assert begun == [roomy.own, os.path.basename(short.own)]


def test_a_killed_run_whose_trace_is_gone_is_abort_and_says_why(tmp_path: Path) -> None:
    """A run killed with its runner (the machine restarting), whose in-memory tracer logs
    are gone by the time it is recorded: ABORT, untraced, saying its trace is gone -- not
    that its program is static."""
    _usable()
    cli = make_cli(tmp_path)
    proc = subprocess.Popen([ROAR, "run", "--job", "k", "--", "sh", "-c",
                             "printf x > out.txt; exec sleep 60"], cwd=cli.cwd, env=cli.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    memory = Path(memory_sessions_dir())
    deadline = time.monotonic() + 30
    while not list(cli.cwd.glob("out.txt")) and time.monotonic() < deadline:
        time.sleep(0.02)
    (own,) = [d for d in memory.iterdir() if d.name.startswith("run-")]
    os.killpg(proc.pid, 9)  # the runner and its command, as a restart would
    proc.wait()
    import shutil

    shutil.rmtree(own)  # the memory went with it
    from roar_core.pipeline.store import Store

    cli.ok("show")
    cfg = config.load(cwd=cli.cwd, env=cli.env)
    with Store.open(cfg.database_url, cfg.home) as store:
        (row,) = store.task_runs()
    assert row.status == "ABORT" and row.traced is False
    assert "gone" in row.untraced_reason and "static" not in row.untraced_reason


def test_a_reader_waits_while_the_recorder_holds_the_directory(tmp_path: Path) -> None:
    """`roar-core show` while the directory's recorder holds it and has not recorded a run
    yet: it waits for that recorder (poking it), and once the recorder has let go without
    recording the run, records it itself.  (It crashed there, "internal error: TypeError",
    once wait_recorded took a list of directories and its caller here passed one.)"""
    _usable()
    cli = make_cli(tmp_path)
    sessions = Path(config.load(cwd=cli.cwd, env=cli.env).sessions_dir)
    sessions.mkdir(parents=True)
    lock = os.open(sessions / recorder.LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a recorder that holds the directory, records nothing
    try:
        run_id = run(cli, "w", "printf data > out.txt")
        reader = subprocess.Popen([ROAR, "show"], cwd=cli.cwd, env=cli.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(1.0)
        waiting = reader.poll() is None
    finally:
        os.close(lock)
    out, err = reader.communicate(timeout=60)
    assert waiting, err.decode()
    assert reader.returncode == 0, err.decode()
    assert run_id in out.decode()
    assert accesses(cli, run_id) == {"output": {str(cli.cwd / "out.txt"): (b3(b"data"), None)}}


def test_run_wait_shows_five_files_and_counts_the_rest(tmp_path: Path) -> None:
    _usable()
    cli = make_cli(tmp_path)
    proc = cli("run", "--wait", "--", "sh", "-c", "for i in 1 2 3 4 5 6 7; do echo $i > f$i; done")
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    lines = err.splitlines()
    at = lines.index("  outputs (7):")
    listed = lines[at + 1: at + 6]
    assert all(ln.startswith("    f") and "blake3:" in ln for ln in listed), err
    assert lines[at + 6] == "    ... and 2 more", err
    # Every output is recorded all the same.
    for i in range(1, 8):
        assert blake3.blake3(f"{i}\n".encode()).hexdigest()[:12] in cli.ok(
            "lineage", str(cli.cwd / f"f{i}"))


def test_a_short_answer_lists_five_of_each_kind_and_counts_them(tmp_path: Path,
                                                                monkeypatch) -> None:
    """What the recorder answers: five outputs and the counts when asked for a short answer
    (`run --wait`), every output otherwise (the API hands them all to its caller)."""
    _usable()
    for k in list(os.environ):
        if k.startswith("OPENLINEAGE"):
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".roar-core").mkdir()
    roar = Roar(config.load(cwd=tmp_path, env={}))
    script = "for i in 1 2 3 4 5 6 7; do echo $i > f$i; done"
    truth = {f"f{i}": blake3.blake3(f"{i}\n".encode()).hexdigest() for i in range(1, 8)}
    try:
        for short, listed in ((True, 5), (False, 7)):
            ran = run_cli(roar.config, ["sh", "-c", script], "w", roar=roar,
                          short_answer=short)
            answer(ran, lambda: roar)
            said = ran.begun.log.results[ran.begun.run_id]
            assert len(said["outputs"]) == listed, said
            got = {os.path.basename(d["name"]): d["digest"] for d in said["outputs"]}
            assert got.items() <= truth.items()
            r = result_of(ran)
            assert r.recorded is not None and r.recorded.counts == (0, 7), r.error
            if not short:
                assert {os.path.basename(d.name): d.digest
                        for d in r.recorded.outputs} == truth
    finally:
        roar.close()
