"""Declared versus observed I/O (the roar_io facet), declared code and engine-made outputs."""

from __future__ import annotations

import os
from pathlib import Path

from roar_core.pipeline.classification import FileAccess, PathFilter, TaskIO
from roar_core.pipeline.declared import Declared, apply, check


def acc(path: Path, role: str, via: list[str] | None = None) -> FileAccess:
    p = os.fsencode(os.path.realpath(path))
    return FileAccess(p, os.fsdecode(p), role, via or [])


def test_nothing_declared_means_no_check(tmp_path):
    assert check(TaskIO(), Declared()) is None


def test_undeclared_reads_writes_and_untouched(tmp_path):
    (tmp_path / "out").mkdir()
    io = TaskIO(
        inputs=[acc(tmp_path / "in.txt", "input"), acc(tmp_path / "ref.txt", "input")],
        outputs=[acc(tmp_path / "out" / "a.txt", "output"), acc(tmp_path / "stray", "output")],
        deleted=[acc(tmp_path / "old.txt", "deleted")],
    )
    got = check(io, Declared(
        inputs=[str(tmp_path / "in.txt"), str(tmp_path / "never.txt")],
        outputs=[str(tmp_path / "out"), str(tmp_path / "missing.txt")],  # out/ is a directory
    ))
    assert got.undeclared_reads == [str(tmp_path / "ref.txt")]
    assert got.undeclared_writes == [str(tmp_path / "old.txt"), str(tmp_path / "stray")]
    assert got.declared_untouched == [str(tmp_path / "missing.txt"), str(tmp_path / "never.txt")]


def test_symlinked_names_count_as_declared(tmp_path):
    (tmp_path / "real.txt").write_text("x")
    (tmp_path / "link.txt").symlink_to(tmp_path / "real.txt")
    io = TaskIO(inputs=[acc(tmp_path / "real.txt", "input", [str(tmp_path / "link.txt")])])
    got = check(io, Declared(inputs=[str(tmp_path / "link.txt")], outputs=[]))
    assert (got.undeclared_reads, got.declared_untouched) == ([], [])


def test_apply_adds_declared_code_and_engine_outputs(tmp_path):
    (tmp_path / "script.py").write_text("print()")
    (tmp_path / "done.flag").write_text("")
    io = TaskIO()
    decl = Declared(inputs=[], outputs=[], code=[str(tmp_path / "script.py")],
                    engine_outputs=[str(tmp_path / "done.flag"), str(tmp_path / "gone.flag")])
    apply(io, decl, PathFilter.build([]))
    assert [a.name for a in io.code] == [str((tmp_path / "script.py").resolve())]
    assert [a.name for a in io.outputs] == [str((tmp_path / "done.flag").resolve())]
    # made by the engine: declared, neither an undeclared write nor untouched
    assert check(io, decl).undeclared_writes == []
