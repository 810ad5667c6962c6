"""What an engine declares about a task's files, and how that compares with what it did.

Engines such as Snakemake declare each task's inputs and outputs.  The trace shows what the
task really read and wrote; `check` compares the two (undeclared reads and writes, declared
files never touched), which the engine's own metadata cannot tell.  A declared path names a
file or a directory: anything observed below a declared directory counts as declared.

Two more things only the engine knows: the task's code (a script the engine copies before
running it, so the trace sees the copy, not the file the user wrote) and outputs the engine
makes itself on the task's behalf (Snakemake's `touch()`).  `apply` adds both to a task's
classified I/O.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence

from roar_core.slotted import Slotted

TYPE_CHECKING = False  # not typing's (see roar_core.slotted)
if TYPE_CHECKING:
    from typing import Any

    from roar_core.pipeline.classification import FileAccess, PathFilter, TaskIO
    from roar_core.pipeline.emission import IOCheck

# `Declared` is built in the engine's process (Snakemake's scheduler), which must not load the
# recorder's modules: `apply` and `check` import them when called, in the recorder.


class Declared(Slotted):
    """Absolute paths an engine declared for one task.  Not a dataclass: the capture that
    imports this runs on `roar-core run`'s path (see roar_core.slotted)."""

    __slots__ = ("inputs", "outputs", "code", "engine_outputs")

    def __init__(self, inputs: Sequence[str] | None = None,
                 outputs: Sequence[str] | None = None, code: Sequence[str] = (),
                 engine_outputs: Sequence[str] = ()) -> None:
        # None: the engine declares none (no comparison is made).
        self.inputs = inputs
        self.outputs = outputs
        # The task's code files: recorded as code, never as data, whether or not traced.
        self.code = code
        # Outputs the engine itself creates for the task (not the task's processes).
        self.engine_outputs = engine_outputs

    def as_dict(self) -> dict[str, Any]:
        """Its fields, for a task log's begin line (read back with `Declared(**d)`)."""
        return {n: getattr(self, n) for n in self.fields()}


def _real(paths: Iterable[str]) -> list[bytes]:
    return [os.fsencode(os.path.realpath(p)) for p in paths]


def _under(path: bytes, roots: Sequence[bytes]) -> bool:
    return any(path == r or path.startswith(r + b"/") for r in roots)


def apply(io: TaskIO, declared: Declared, keep: PathFilter) -> None:
    """Add the declared code files and engine-made outputs to `io` (in place)."""
    from roar_core.pipeline.classification import FileAccess, display_name

    code = {a.path for a in io.code}
    for path in _real(declared.code):
        if path not in code and os.path.isfile(path):
            code.add(path)
            io.code.append(FileAccess(path, display_name(path), "code"))
    outputs = {a.path for a in io.outputs}
    for path in _real(declared.engine_outputs):
        if path in outputs or not keep.keep(path):
            continue
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                continue
        except OSError:
            continue
        outputs.add(path)
        io.outputs.append(FileAccess(path, display_name(path), "output"))


def check(io: TaskIO, declared: Declared) -> IOCheck | None:
    """Observed versus declared I/O; None when the engine declared nothing to compare."""
    from roar_core.pipeline.classification import display_name
    from roar_core.pipeline.emission import IOCheck

    if declared.inputs is None and declared.outputs is None:
        return None
    ins, outs = _real(declared.inputs or ()), _real(declared.outputs or ())
    made = _real(declared.engine_outputs)  # written by the engine: declared, never "untouched"

    def names(accesses: Iterable[FileAccess]) -> set[bytes]:
        # A file read through a symlink is declared under either name.
        found = set()
        for a in accesses:
            found.add(a.path)
            found.update(os.fsencode(v) for v in a.read_via)
        return found

    def declared_as(a: FileAccess, roots: Sequence[bytes]) -> bool:
        return _under(a.path, roots) or any(_under(os.fsencode(v), roots) for v in a.read_via)

    reads = [a for a in io.inputs if not declared_as(a, ins + outs)]
    writes = [a for a in io.outputs + io.deleted if not declared_as(a, outs + made)]
    read, written = names(io.inputs), names(io.outputs + io.deleted)
    untouched = [p for p in ins if not any(_under(o, [p]) for o in read)]
    untouched += [p for p in outs if not any(_under(o, [p]) for o in written)]
    return IOCheck(
        undeclared_reads=sorted({a.name for a in reads}),
        undeclared_writes=sorted({a.name for a in writes}),
        declared_untouched=sorted({display_name(p) for p in untouched}),
    )
