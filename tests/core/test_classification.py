"""Classification cases from DESIGN.md, on real traced runs (the shim, not fake records)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from roar_core.pipeline import classification, nativehash, tracelog, tracer
from roar_core.pipeline.attribution import attribute
from roar_core.pipeline.classification import Classifier, PathFilter, TaskIO, classify


def traced_io(tmp_path: Path, script: str, keep: PathFilter | None = None,
              setup=None) -> tuple[TaskIO, Path]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    session = tmp_path / "session"
    session.mkdir(exist_ok=True)
    if setup:
        setup(work)
    prog = work / "step.py"
    prog.write_text(textwrap.dedent(script))
    env = tracer.preload_env(session, tag="task")
    p = subprocess.run([sys.executable, str(prog)], cwd=work, env=env, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    tasks = attribute(tracelog.read_session(session).logs)
    assert set(tasks) == {"task"}
    keep = keep or PathFilter.build([session])
    records = tasks["task"].records
    io = classify(records, keep)
    # Every case through the classifier the CLI runner feeds while its command runs, a
    # few records at a time: the same classification, or None where a path it met is a
    # symlink (the one-batch form is used then).
    # Its end looks at every file through the batch hasher's library when it has many:
    # each case through both that and os.lstat, and with native_hash off (never the
    # library, however many files).
    for native_min, native in ((0, True), (1 << 60, True), (0, False)):
        fed = Classifier(deferred=True)
        for i in range(0, len(records), 3):
            fed.feed(records[i : i + 3])
        with _native_lstat_from(native_min, allowed=native):
            stepwise = fed.finish(keep, native=native)
        assert stepwise == io or (stepwise is None and _symlink_met(records))
    return io, work


@contextlib.contextmanager
def _native_lstat_from(n: int, allowed: bool = True):
    saved = classification._NATIVE_LSTAT_MIN, nativehash.BatchHasher.lstat
    classification._NATIVE_LSTAT_MIN = n
    if not allowed:
        def refused(self, paths):
            raise AssertionError("the native lstat with native_hash off")

        nativehash.BatchHasher.lstat = refused
    try:
        yield
    finally:
        classification._NATIVE_LSTAT_MIN, nativehash.BatchHasher.lstat = saved


def _symlink_met(records) -> bool:
    return any(os.path.islink(p) for r in records for p in (r.path, r.path2)
               if p and p.startswith(b"/"))


def names(accesses) -> list[str]:
    return sorted(Path(a.name).name for a in accesses)


def test_input_and_output(tmp_path):
    io, _ = traced_io(tmp_path, """
        data = open("in.txt").read()
        open("out.txt", "w").write(data.upper())
    """, setup=lambda w: (w / "in.txt").write_text("abc"))
    assert names(io.inputs) == ["in.txt"] and names(io.outputs) == ["out.txt"]
    assert not io.transient and not io.deleted


def test_rename_into_place_keeps_only_the_final_path(tmp_path):
    io, _ = traced_io(tmp_path, """
        import os
        with open("result.tmp", "w") as f:
            f.write("final")
        os.replace("result.tmp", "result.txt")
    """)
    assert names(io.outputs) == ["result.txt"]
    assert names(io.transient) == ["result.tmp"]
    assert not io.inputs and not io.deleted


def test_a_directory_moved_into_place_moves_its_files_outputs(tmp_path):
    # Written under a temporary directory, which is then renamed (and one file of a kept
    # directory read there first): each file is an output under its new name only; what
    # was read keeps its name as an input, and is a deleted one there.
    io, work = traced_io(tmp_path, """
        import os
        os.makedirs("run.tmp/sub")
        with open("run.tmp/sub/a.txt", "w") as f:
            f.write("a")
        with open("run.tmp/b.txt", "w") as f:
            f.write("b")
        with open("kept/old.txt") as f:
            f.read()
        os.rename("run.tmp", "run")
        os.rename("kept", "moved")
    """, setup=lambda w: ((w / "kept").mkdir(), (w / "kept" / "old.txt").write_text("o")))
    rel = lambda accesses: sorted(os.path.relpath(a.name, work) for a in accesses)  # noqa: E731
    assert rel(io.outputs) == ["moved/old.txt", "run/b.txt", "run/sub/a.txt"]
    assert rel(io.transient) == ["run.tmp/b.txt", "run.tmp/sub/a.txt"]
    assert rel(io.inputs) == ["kept/old.txt"] and rel(io.deleted) == ["kept/old.txt"]
    assert [a.existed for a in io.outputs] == [False, False, False]


def test_a_directory_renamed_untouched_is_no_deleted_file(tmp_path):
    # (A file renamed away is deleted there, as before.)
    io, _ = traced_io(tmp_path, """
        import os
        os.rename("olddir", "newdir")
        os.rename("old.txt", "new.txt")
    """, setup=lambda w: ((w / "olddir").mkdir(), (w / "olddir" / "f").write_text("f"),
                          (w / "old.txt").write_text("o")))
    assert names(io.deleted) == ["old.txt"] and names(io.outputs) == ["new.txt"]
    assert not io.inputs and not io.transient


def test_created_then_unlinked_is_transient(tmp_path):
    io, _ = traced_io(tmp_path, """
        import os
        open("scratch", "w").write("x")
        open("scratch").read()
        os.unlink("scratch")
    """)
    assert names(io.transient) == ["scratch"]
    assert not io.inputs and not io.outputs and not io.deleted


def test_deleting_a_pre_existing_file(tmp_path):
    io, _ = traced_io(tmp_path, """
        import os
        os.unlink("old.txt")
    """, setup=lambda w: (w / "old.txt").write_text("old"))
    assert names(io.deleted) == ["old.txt"] and not io.outputs


def test_read_modify_write_is_input_and_output_with_previous_state(tmp_path):
    def setup(w):
        (w / "counter").write_text("41")

    io, work = traced_io(tmp_path, """
        with open("counter", "r+") as f:
            n = int(f.read())
            f.seek(0)
            f.write(str(n + 1))
    """, setup=setup)
    assert names(io.inputs) == ["counter"] and names(io.outputs) == ["counter"]
    pre = io.inputs[0].pre_state
    assert pre is not None and pre.size == 2
    assert (work / "counter").read_text() == "42"


def test_open_for_update_without_writing_is_not_an_output(tmp_path):
    io, _ = traced_io(tmp_path, """
        with open("f", "r+") as f:
            f.read()
    """, setup=lambda w: (w / "f").write_text("same"))
    assert names(io.inputs) == ["f"] and not io.outputs


def test_append_is_output_not_input(tmp_path):
    io, _ = traced_io(tmp_path, """
        open("log.txt", "a").write("more")
    """, setup=lambda w: (w / "log.txt").write_text("start"))
    assert names(io.outputs) == ["log.txt"] and not io.inputs


def test_subprocess_io_belongs_to_the_task(tmp_path):
    io, _ = traced_io(tmp_path, """
        import subprocess
        subprocess.run(["cp", "a", "b"], check=True)
        subprocess.run("cat b > c", shell=True, check=True)
    """, setup=lambda w: (w / "a").write_text("A"))
    assert names(io.inputs) == ["a"] and names(io.outputs) == ["b", "c"]
    assert ["cp", "a", "b"] in io.commands


def test_symlink_read_resolves_to_target_and_keeps_the_path_used(tmp_path):
    def setup(w):
        (w / "target.txt").write_text("t")
        os.symlink("target.txt", w / "alias.txt")

    io, work = traced_io(tmp_path, "open('alias.txt').read()", setup=setup)
    (inp,) = io.inputs
    assert inp.name == str(work / "target.txt")
    assert inp.read_via == [str(work / "alias.txt")]


def test_hard_link_is_an_output(tmp_path):
    io, _ = traced_io(tmp_path, "import os; os.link('a', 'b')",
                      setup=lambda w: (w / "a").write_text("a"))
    assert names(io.outputs) == ["b"]


def test_script_is_code_not_data(tmp_path):
    def setup(w):
        (w / "helper.py").write_text("VALUE = 1\n")
        (w / "in.txt").write_text("i")

    io, _ = traced_io(tmp_path, """
        import sys; sys.path.insert(0, ".")
        import helper
        open("in.txt").read()
    """, setup=setup)
    assert names(io.code) == ["helper.py", "step.py"]
    assert names(io.inputs) == ["in.txt"]


def test_filters_system_interpreter_cache_internal_and_user_globs(tmp_path):
    internal = tmp_path / "internal"
    internal.mkdir()
    (internal / "state").write_text("s")

    def setup(w):
        (w / "keep.txt").write_text("k")
        (w / "skip.log").write_text("l")
        (w / "__pycache__").mkdir()
        (w / "__pycache__" / "x.pyc").write_bytes(b"c")

    keep = PathFilter.build([tmp_path / "session", internal], exclude=["*.log"])
    io, _ = traced_io(tmp_path, f"""
        import json, os
        for p in ["/etc/hostname", "/usr/lib/os-release", json.__file__,
                  "__pycache__/x.pyc", "skip.log", "keep.txt", {str(internal / 'state')!r}]:
            if os.path.exists(p):
                open(p, "rb").read()
        open("/dev/null", "w").write("x")
    """, keep=keep, setup=setup)
    assert names(io.inputs) == ["keep.txt"] and not io.outputs


def test_keep_decides_by_directory_as_by_full_path(tmp_path):
    # keep() looks a directory up once for all its files: the prefixes and cache parts must
    # still decide each path as if matched against all of it.
    keep = PathFilter.build([tmp_path / "roar"], exclude=["*.log"])
    root = os.fsencode(tmp_path)
    cases = {
        b"/data/a.txt": True, b"/data/x/.git/HEAD": False, b"/data/x/.gitignore": True,
        b"/data/pkg.egg-info/PKG-INFO": False, b"/data/pkg.egg-info": True,
        b"/data/m/__pycache__/m.cpython-311.pyc": False, b"/data/m.pyc": False,
        b"/data/run.log": False, b"/usr/share/x": False, b"/usrx/y": True,
        b"relative/path": False, b"/data/.cache": True, b"/home/u/.cache/pip/x": False,
        root + b"/roar/spool/s.jsonl": False, root + b"/roarx/data.csv": True,
        root + b"/roar": True, os.fsencode(os.__file__): False,
    }
    for _ in range(2):  # the second pass answers from the directory memo
        assert {p: keep.keep(p) for p in cases} == cases
    assert PathFilter(internal=(b"/srv/roar",)).keep(b"/srv/roar.txt")


def test_include_globs_restrict(tmp_path):
    def setup(w):
        (w / "data").mkdir()
        (w / "data" / "a.csv").write_text("a")
        (w / "other.txt").write_text("o")

    keep = PathFilter.build([tmp_path / "session"], include=[f"{tmp_path}/work/data/*"])
    io, _ = traced_io(tmp_path, "open('data/a.csv').read(); open('other.txt').read()",
                      keep=keep, setup=setup)
    assert names(io.inputs) == ["a.csv"]


def test_directories_are_not_datasets(tmp_path):
    io, _ = traced_io(tmp_path, """
        import os
        os.makedirs("d/e")
        os.listdir("d")
        open("d/e/f", "w").write("f")
    """)
    assert names(io.outputs) == ["f"] and not io.inputs


def test_non_utf8_names_are_escaped_text(tmp_path):
    io, work = traced_io(tmp_path, "open(b'caf\\xe9.txt', 'w').write('x')")
    (out,) = io.outputs
    assert out.path == bytes(work) + b"/caf\xe9.txt"
    assert out.name == str(work) + "/caf\\xe9.txt" and out.name.encode("utf-8")


@pytest.mark.parametrize("mode", ["w", "x"])
def test_created_file_is_never_an_input_even_if_read_back(tmp_path, mode):
    io, _ = traced_io(tmp_path, f"open('n', '{mode}').write('1'); open('n').read()")
    assert names(io.outputs) == ["n"] and not io.inputs


def test_a_removed_temp_dir_is_no_file_read(tmp_path):
    # shutil.rmtree opens the directory without O_DIRECTORY; gone by the end, it must not
    # look like an input file.
    io, _ = traced_io(tmp_path, """
        import shutil, tempfile
        d = tempfile.mkdtemp(dir=".")
        open(d + "/scratch", "w").write("x")
        shutil.rmtree(d)
    """)
    assert not io.inputs and not io.outputs and not io.deleted
    assert names(io.transient) == ["scratch"]


def test_engine_code_files_are_code_not_inputs(tmp_path):
    work = tmp_path / "work"
    io, _ = traced_io(tmp_path, """
        open("Snakefile").read()
        open("data.txt").read()
    """, setup=lambda w: ((w / "Snakefile").write_text("rule a: pass"),
                          (w / "data.txt").write_text("d")))
    assert names(io.inputs) == ["Snakefile", "data.txt"]
    session = tmp_path / "session"
    tasks = attribute(tracelog.read_session(session).logs)
    io = classify(tasks["task"].records, PathFilter.build([session]),
                  code=[os.fsencode(os.path.realpath(work / "Snakefile"))])
    assert names(io.inputs) == ["data.txt"]
    assert "Snakefile" in names(io.code)


def test_shell_start_up_files_are_environment_not_data(tmp_path, monkeypatch):
    """bash reading ~/.profile, ~/.bashrc and ~/.cargo/env as it starts (a login shell, or
    a shell whose stdin is a socket, as Airflow 3 starts tasks) reads no data."""
    home = tmp_path / "home"
    (home / ".cargo").mkdir(parents=True)
    (home / ".cargo" / "env").write_text('export PATH="$HOME/.cargo/bin:$PATH"\n')
    (home / ".bashrc").write_text('. "$HOME/.cargo/env"\n')
    (home / ".profile").write_text('. "$HOME/.bashrc"\n')
    (home / "notes.txt").write_text("data kept in the home directory is still data\n")
    work, session = tmp_path / "work", tmp_path / "session"
    work.mkdir()
    session.mkdir()
    (work / "data.txt").write_text("data\n")
    monkeypatch.setenv("HOME", str(home))
    env = {**tracer.preload_env(session, tag="task"), "HOME": str(home)}
    a, b = socket.socketpair()
    with a, b:
        p = subprocess.run(["bash", "-lc", "cat data.txt ~/notes.txt > /dev/null"], cwd=work,
                           env=env, stdin=b, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    records = attribute(tracelog.read_session(session).logs)["task"].records
    opened = {Path(os.fsdecode(r.path)).name for r in records if r.op == tracelog.OP["open"]}
    assert {".profile", ".bashrc", "env"} <= opened  # bash did read them
    io = classify(records, PathFilter.build([session]))
    assert names(io.inputs) == ["data.txt", "notes.txt"] and not io.outputs


def test_a_path_that_became_a_symlink_is_classified_as_the_end_finds_it(tmp_path):
    # Fed while the command ran, a path was its directory's real path + its name; a name
    # or a directory that is a symlink by the end is resolved by the one-batch form.
    io, work = traced_io(tmp_path, """
        import os
        os.mkdir("d")
        open("d/out.txt", "w").write("x")
        open("plain.txt", "w").write("y")
    """)
    records = attribute(tracelog.read_session(tmp_path / "session").logs)["task"].records
    keep = PathFilter.build([tmp_path / "session"])
    fed = Classifier(deferred=True)
    fed.feed(records)
    (work / "target.txt").write_text("y")
    os.replace(work / "plain.txt", work / "aside.txt")
    os.symlink(work / "target.txt", work / "plain.txt")
    assert fed.finish(keep) is None
    assert "target.txt" in names(classify(records, keep).outputs)

    fed = Classifier(deferred=True)
    fed.feed(records)
    os.replace(work / "d", work / "real-d")
    os.symlink(work / "real-d", work / "d")
    assert fed.finish(keep) is None
    assert str(work / "real-d" / "out.txt") in [a.name for a in classify(records, keep).outputs]


def test_a_file_written_through_a_descriptor_opened_before_the_task(tmp_path):
    # A long-lived worker's file (a logger's, an actor's results) opened before the task and
    # written in it with no open or close there: an output of the task, one that existed.
    session = tmp_path / "session"
    session.mkdir()
    (tmp_path / "log.txt").write_bytes(b"start\n")
    script = textwrap.dedent("""
        from roar_core.pipeline import tracer
        shim = tracer.loaded()
        log = open("log.txt", "ab", buffering=0)
        log.write(b"worker up\\n")
        shim.begin("task")
        log.write(b"task ran\\n")
        shim.end()
    """)
    p = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                       text=True, env=tracer.preload_env(session))
    assert p.returncode == 0, p.stderr
    io = classify(attribute(tracelog.read_session(session).logs)["task"].records,
                  PathFilter.build([session]))
    assert names(io.outputs) == ["log.txt"] and not io.inputs
    (out,) = io.outputs
    assert out.existed and out.state.size == len(b"start\nworker up\ntask ran\n")
