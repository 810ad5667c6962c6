"""Capture: a task's file versions as they were when they mattered.

Runs where a task ends, before control goes back to the engine or the shell (the CLI runner
once its command has exited, the process an engine waits on for the task's end): the
classification looks at the file system once, and the digests are taken now.  An output's
version is the content the task left; an input's is the content of the version the task
opened, identified by the state the tracer took at open.  Whatever a later command does to
the file cannot change either, however late the rest of the recording (store, events) runs,
in this process or another: a `Capture` travels as JSON (`to_json` / `from_json`).

An input whose state now differs from its state at open (the task rewrote it, another
process changed it, it is gone) gets the digest recorded for its state at open in the stat
cache (put there by its producer's capture, or an earlier read), or none: an *unknown*
version, with the reason.  It never gets the digest of another version.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import namedtuple
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from pathlib import Path

from roar_core.pipeline import declared as declared_mod
from roar_core.pipeline.classification import (
    O_ACCMODE,
    O_RDONLY,
    O_RDWR,
    O_TMPFILE,
    OP_CLOSE,
    OP_OPEN,
    Classifier,
    FileAccess,
    PathFilter,
    TaskIO,
    _Resolver,
    classify,
)
from roar_core.pipeline.objects import ObjectVersion
from roar_core.pipeline.statcache import FileState
from roar_core.pipeline.tracelog import RF_MODIFIED, Record
from roar_core.slotted import Slotted

# Not typing's (nor dataclasses): with typing, dataclasses and logging, the capture's
# imports were ~20 ms more of each `roar-core run` of a command that touched a file.
TYPE_CHECKING = False
if TYPE_CHECKING:  # imported when there are files to hash: blake3 and the native hasher
    from typing import Any

    from roar_core.pipeline.hashing import Hasher, HashResult

CHANGED_BY_TASK = "the task changed it before the version it read could be hashed"
CHANGED_AFTER_OPEN = "it changed after the task opened it"
GONE = "it was gone before it could be hashed"
UNSTABLE = "it kept changing while it was hashed"
CHANGED_AFTER_END = "it changed after the task ended, before it could be hashed"


class Version(namedtuple("Version", ("digest", "size", "state", "why"), defaults=(None,))):
    """One file's version as a task saw it: a digest, or why there is none."""

    __slots__ = ()
    digest: str | None  # 64 hex chars; None: unknown
    size: int | None
    state: FileState | None  # the state that digest (or that unknown) is of
    why: str | None  # unknown: the reason (None: known)


class Capture(Slotted):
    __slots__ = ("io", "inputs", "outputs", "code")

    def __init__(self, io: TaskIO, inputs: dict[bytes, Version] | None = None,
                 outputs: dict[bytes, Version] | None = None,
                 code: dict[bytes, Version] | None = None) -> None:
        self.io = io
        self.inputs = {} if inputs is None else inputs  # the content opened
        self.outputs = {} if outputs is None else outputs  # the content left
        self.code = {} if code is None else code


def _known(r: HashResult) -> Version:
    return Version(r.digest, r.size, r.state)


def capture(records: Iterable[Record], keep: PathFilter, hasher: Hasher, *,
            declared: declared_mod.Declared | None = None, traced: bool = True,
            settle: bool = True, progress: Callable[[int, int], None] | None = None
            ) -> Capture:
    """Classify a task's records and take its versions, now.  Call it as the task ends.
    `progress(done, total)`: as files are hashed."""
    return versions(classified(records, keep, declared=declared, traced=traced), hasher,
                    settle=settle, progress=progress)


def classified(records: Iterable[Record], keep: PathFilter, *,
               declared: declared_mod.Declared | None = None, traced: bool = True) -> TaskIO:
    """The task's files as it leaves them (classification looks at the file system)."""
    code = [os.fsencode(os.path.realpath(p)) for p in declared.code] if declared else []
    io = classify(records, keep, code) if traced else TaskIO()
    if declared is not None:
        declared_mod.apply(io, declared, keep)
    return io


def versions(io: TaskIO, hasher: Hasher, settle: bool = True,
             progress: Callable[[int, int], None] | None = None,
             early: Mapping[bytes, HashResult] | None = None) -> Capture:
    """The versions of the files in `io`, now (see the module docstring).  `settle`: the
    outputs' digests go into the stat cache, for the next tasks that open them (without:
    the recorder's store finds them by size and mtime, later).  `early`: outputs' digests
    taken while the task ran (`WhileRunning`), each used where the output's state now is
    the one it was read at."""
    written = {a.path for a in io.outputs if a.obj is None}
    # Inputs the task itself rewrote: the version read is its state at open, never the
    # content now.  Every other file: hashed now, and checked against the state it had.
    # S3 objects come with their versions (s3trace), taken as the task read or sent them.
    read = [a for a in io.inputs if a.obj is None] + io.code
    outputs = [a for a in io.outputs if a.obj is None]
    confirmed: dict[bytes, HashResult] = {}
    if early:
        for a in outputs:
            e = early.get(a.path)
            if e is not None and a.state is not None and e.state == a.state:
                confirmed[a.path] = e
    hashed = [a for a in read if a.path not in written] + [
        a for a in outputs if a.path not in confirmed]
    known = {a.path: a.state for a in hashed if a.state is not None}
    hashes = hasher.hash_files([a.path for a in hashed], progress, known=known,
                               written=written,
                               settled=written if settle else ()) if hashed else {}
    if confirmed:
        hashes.update(confirmed)
        if settle:
            hasher.remember(confirmed.values())
    out = Capture(io)
    for a in outputs:
        h = hashes.get(a.path)
        if h is None:
            out.outputs[a.path] = Version(None, None, a.state, GONE)
        elif not h.stable:
            out.outputs[a.path] = Version(None, h.size, h.state, UNSTABLE)
        else:
            out.outputs[a.path] = _known(h)
    _drop_unchanged(io, out, hasher)
    opened = _opened_versions(read, hashes, written, hasher)
    for a in read:
        (out.code if a.role == "code" else out.inputs)[a.path] = opened[a.path]
    _object_versions(io, out)
    return out


def as_left(capture: Capture, left: Mapping[str, list[int] | None]) -> Capture:
    """The outputs of `capture`, taken after the task's producer went on, as the task left
    them: one whose state now is not the one it was left in (`left`: raw path -> [device,
    inode, size, mtime, ctime] or None, taken as the task ended) holds another's content
    now, and its version is unknown.  So is one `left` does not name."""
    resolve = _Resolver()
    was: dict[bytes, FileState | None] = {}
    for raw, st in left.items():
        was[resolve(_unpath(raw))[0]] = None if st is None else FileState(*st)
    for path, v in list(capture.outputs.items()):
        if v.digest is not None and was.get(path) != v.state:
            capture.outputs[path] = Version(None, v.size, v.state, CHANGED_AFTER_END)
    return capture


def _drop_unchanged(io: TaskIO, out: Capture, hasher: Hasher) -> None:
    """A file written only in place (`touch`, a descriptor opened to update) that the task
    left with the content it had before is no output: that content has its producer
    already, which a new version by this task would hide.  Known only where the version
    before has a digest on record (else it stays an output, as the task opened it to
    write)."""
    in_place = [a for a in io.outputs if a.pre_state is not None and a.obj is None
                and out.outputs[a.path].digest is not None]
    if not in_place or hasher.cache is None:
        return
    before = hasher.cache.get_many([a.pre_state for a in in_place])
    same = {a.path for a, d in zip(in_place, before, strict=True)
            if d == out.outputs[a.path].digest}
    if same:
        io.outputs = [a for a in io.outputs if a.path not in same]
        for p in same:
            del out.outputs[p]


def _object_versions(io: TaskIO, out: Capture) -> None:
    """S3 objects: the digest of the body the task streamed, else that of the local file
    it was moved to or from (the version of that file this task left or read)."""
    own: dict[tuple[str, str | None], Version] = {}  # (uri, version) -> what it holds
    for got, accesses in ((out.inputs, io.inputs), (out.outputs, io.outputs)):
        for a in accesses:
            o = a.obj
            if o is None:
                continue
            v = Version(o.digest, o.size, None, o.why)
            if o.digest is None and o.file is not None:
                f = out.outputs.get(o.file) or out.inputs.get(o.file)
                if f is not None and f.digest is not None:
                    v = Version(f.digest, f.size, None)
            if v.digest is None and o.source is not None:  # a copy of what the task saw
                v = own.get(o.source) or v
            if v.digest is not None:
                own[(a.name, o.version)] = v
            got[a.path] = v


def _opened_versions(read: list[FileAccess], hashes: dict[bytes, HashResult],
                     written: set[bytes], hasher: Hasher) -> dict[bytes, Version]:
    """The version each file read was opened at: hashed now when its state still is the
    one it was opened with, else recorded for that state, else unknown."""
    found: dict[bytes, Version] = {}
    lookup: list[FileAccess] = []
    for a in read:
        h = hashes.get(a.path)
        at_open = a.pre_state
        if at_open is None:  # no state at open (an older trace): the content now
            found[a.path] = _known(h) if h and h.stable else Version(
                None, None, a.state, GONE if h is None else UNSTABLE)
        elif h is not None and h.stable and h.state == at_open:
            found[a.path] = _known(h)
        else:
            lookup.append(a)
    if lookup:
        cache = hasher.cache
        digests = cache.get_many([a.pre_state for a in lookup]) if cache else [None] * len(
            lookup)
        for a, digest in zip(lookup, digests, strict=True):
            st = a.pre_state
            if digest is not None:
                found[a.path] = Version(digest, st.size, st)
            else:
                why = (CHANGED_BY_TASK if a.path in written
                       else GONE if a.state is None else CHANGED_AFTER_OPEN)
                found[a.path] = Version(None, st.size, st, why)
    return found


class WhileRunning:
    """What the CLI runner takes of its command while it runs, on the core the command
    leaves free (its tail thread: `seen` with the records of each read of the logs, then
    `work`): the records classified as they come (the loop of `Classifier`), and the
    files written hashed early.  At the end `classified` finishes the classification
    (one look at the file system, as always at the end) and `versions` uses an early
    digest where the file's state is still the one it was read at: the same capture,
    less to do between the command's end and the shell's next command.

    The classification fed so far is used only where it saw every record of the command
    in the order `classify` would (time order, no tie between processes) and no path
    became a symlink meanwhile; else the records are classified at once, at the end.

    The tracer logs no close of a file created or truncated, so a file is due for hashing
    as soon as its open is read: one still being written changes its state and is hashed
    again at the end.  Only small files: a big one being written would be read for
    nothing, and is hashed at the speed of reading anyway.

    No early digest stands once the command has opened a file for reading and writing: a
    write through a shared mapping (which needs such a descriptor) to a page written
    before changes the bytes and leaves size, mtime and ctime as they were (measured:
    tmpfs and ext4, 6.18), where a write(2) always shows.  Any file, not only that one: a
    file has other names (a symlink, /proc/self/fd/N)."""

    CHUNK = 64  # files per hashing call: the command's end waits for at most one
    MAX_SIZE = 1 << 20

    def __init__(self, make: Callable[[], tuple[PathFilter, Hasher]]) -> None:
        self._make = make
        # Made when first needed: a command that writes nothing never loads the hasher.
        self.keep: PathFilter | None = None
        self.hasher: Hasher | None = None
        self._classifier: Classifier | None = Classifier(deferred=True)
        self._fed = 0
        self._last: tuple[int, int] = (-1, -1)  # (mono_ns, pid) of the last record fed
        self._due: dict[bytes, None] = {}  # opened for writing (or closed after a write)
        self._found: dict[bytes, HashResult] = {}
        self._mappable = False  # a file was opened O_RDWR (see above)
        self._exited: list[Callable[[], dict[bytes, HashResult]]] = []  # see ended

    def ended(self) -> None:
        """The command has exited: the files due so far are hashed on the hasher's pool
        while this thread goes on in Python.  Called as it exits (beside the read of the
        logs' rest) and again once they are read (beside the classification): measured
        (`bench_core.py`, alternated), 2.8 us per file less end to end at 5,000 files.
        Checked as every early digest is: one stands where the state `classified` finds
        is the one read before and after its read."""
        if self._due and not self._mappable:
            keep, hasher = self.tools()
            paths = [p for p in self._due if keep.keep(p)]
            self._due.clear()
            exited = hasher.start_exited(paths, self.MAX_SIZE)
            if exited is not None:
                self._exited.append(exited)

    def tools(self) -> tuple[PathFilter, Hasher]:
        if self.keep is None or self.hasher is None:
            self.keep, self.hasher = self._make()
        return self.keep, self.hasher

    def seen(self, records: list[Record]) -> None:
        if self._classifier is not None:
            try:
                self._feed(records)
            except Exception:  # noqa: BLE001 - classified at once at the end instead
                self._classifier = None
        due = self._due
        for r in records:
            op = r.op
            if op == OP_OPEN:
                flags = r.flags
                acc = flags & O_ACCMODE
                if acc == O_RDONLY or r.result < 0 or r.err:
                    continue
                # (An O_TMPFILE file too: linked into place later, it is an output.)
                if acc == O_RDWR and not r.path.startswith(_NOT_MAPPED):
                    self._mappable = True
                if flags & O_TMPFILE != O_TMPFILE and r.path.startswith(b"/"):
                    due[r.path] = None
            elif op == OP_CLOSE and r.rflags & RF_MODIFIED:
                due[r.path] = None

    def _feed(self, records: list[Record]) -> None:
        batch = sorted(records, key=_mono_ns)  # stable, as the end's sort of all of them
        last_ns, last_pid = self._last
        for r in batch:
            ns = r.mono_ns
            if ns < last_ns or (ns == last_ns and r.pid != last_pid):
                self._classifier = None  # out of order, or a tie the end may order apart
                return
            last_ns, last_pid = ns, r.pid
        self._last = (last_ns, last_pid)
        assert self._classifier is not None
        self._classifier.feed(batch)
        self._fed += len(batch)

    def work(self, stop: Callable[[], bool], until: float) -> None:
        """Hash the files due, a chunk at a time, until `stop()` or time.monotonic() reaches
        `until`: the next records come first (each one left unread when the command ends
        is read at its end; a file left unhashed is only hashed then)."""
        while self._due and not self._mappable and not stop() and time.monotonic() < until:
            keep, hasher = self.tools()
            paths = []
            for p in list(islice(self._due, self.CHUNK)):
                del self._due[p]
                self._found.pop(p, None)  # opened for writing again: that digest is old
                if keep.keep(p):
                    paths.append(p)
            for r in hasher.hash_early(paths, self.MAX_SIZE):
                self._found[r.path] = r

    @property
    def found(self) -> dict[bytes, HashResult]:
        """The early digests that may stand (each still checked against the state at the
        end, by `versions`): none once a file was opened for reading and writing."""
        for exited in self._exited:  # (in order: a file due again, hashed again)
            self._found.update(exited())
        self._exited.clear()
        return {} if self._mappable else self._found

    def classified(self, records: list[Record]) -> TaskIO:
        """The command's files as it left them, from all its `records` (time-ordered)."""
        keep, hasher = self.tools()
        c = self._classifier
        if c is not None and self._fed == len(records):
            io = c.finish(keep, native=hasher.native)
            if io is not None:
                return io
        return classify(records, keep)


# Devices opened read-write by many programs (a shell's terminal): no file's other name.
_NOT_MAPPED = (b"/dev/null", b"/dev/tty", b"/dev/zero", b"/dev/ptmx", b"/dev/pts/",
               b"/dev/urandom", b"/dev/random")


def _mono_ns(r: Record) -> int:
    return r.mono_ns


def taken_late(c: Capture, ended_ns: int) -> Capture:
    """A capture taken after its task ended (its process was killed; an engine that does
    not wait for lineage): an output whose inode changed after the end (ctime: a clock
    that never runs ahead) has an unknown version, never the later content."""
    for path, v in c.outputs.items():
        if v.digest is not None and v.state is not None and v.state.ctime_ns > ended_ns:
            c.outputs[path] = Version(None, v.size, v.state, CHANGED_AFTER_END)
    return c


# ---- as JSON, for a recorder in another process ---------------------------------------------
# Paths are bytes: carried as str with surrogate escapes (json escapes those losslessly).


# os.fsdecode/fsencode, without their Python-level wrapper (2.5 us a call, twice per file).
_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


def _path(p: bytes) -> str:
    return p.decode(_FS_ENCODING, _FS_ERRORS)


def _unpath(p: str) -> bytes:
    return p.encode(_FS_ENCODING, _FS_ERRORS)


def _state(s: FileState | None) -> list[int] | None:
    return None if s is None else list(s)


# The named tuples' own __new__ is Python: per file of a big task's end read by its
# recorder, tuple.__new__ makes each in half the time (from_dict, 5,000 files: 7.0 -> 5.5 ms).
_new = tuple.__new__


def _unstate(s: list[int] | None) -> FileState | None:
    if s is None:
        return None
    if len(s) != 5:  # (what FileState(*s) would have refused)
        raise ValueError(f"not a file state: {s!r}")
    return _new(FileState, s)


def _unversion(v: list[Any]) -> Version:
    return Version(v[0], v[1], _unstate(v[2]), v[3])


def _access(a: FileAccess) -> list[Any]:
    path = _path(a.path)
    out = [path, None if a.name == path else a.name, a.role, a.read_via,
           _state(a.pre_state), a.first_ns, a.existed, _state(a.state)]
    if (o := a.obj) is not None:
        out.append([o.version, o.digest, o.size, o.file and _path(o.file), o.why,
                    list(o.source) if o.source else None])
    return out


def _unaccess(x: list[Any]) -> FileAccess:
    obj = None
    if len(x) > 8:
        o = x[8]
        obj = ObjectVersion(o[0], o[1], o[2], o[3] and _unpath(o[3]), o[4],
                            tuple(o[5]) if o[5] else None)
    # A null name is the path's (format 2).
    return FileAccess(_unpath(x[0]), x[0] if x[1] is None else x[1], x[2], x[3],
                      _unstate(x[4]), x[5], x[6], _unstate(x[7]), obj)


_LISTS = ("inputs", "outputs", "transient", "deleted", "code")


# Format 2 (`"f": 2`): a version names its file by its index in the list of accesses of its
# kind, and its state as the access's (AT_END, AT_OPEN) where it is one of those; a name
# equal to its path is null.  Each file's path and state went into the line three and two
# times: half of a 5,000-file task's hand-off was copies.  Format 1 (no "f") is still read:
# a task log written before an upgrade.
FORMAT = 2
_VERSIONS = (("inputs", "v_inputs"), ("outputs", "v_outputs"), ("code", "v_code"))
AT_END, AT_OPEN = 1, 2


def to_dict(c: Capture) -> dict[str, Any]:
    """JSON-ready (a task log's end line, a file)."""
    io = c.io
    data: dict[str, Any] = {k: [_access(a) for a in getattr(io, k)] for k in _LISTS}
    data["f"] = FORMAT
    data["commands"], data["untraceable"] = io.commands, io.untraceable
    if io.unseen:
        data["unseen"] = io.unseen
    for kind, key in _VERSIONS:
        accesses = getattr(io, kind)
        index = {a.path: i for i, a in enumerate(accesses)}
        out = data[key] = []
        for path, v in getattr(c, kind).items():
            i = index.get(path)
            a = accesses[i] if i is not None else None
            st = v.state
            state = (None if st is None else AT_END if a is not None and st == a.state
                     else AT_OPEN if a is not None and st == a.pre_state else list(st))
            out.append([_path(path) if i is None else i, v.digest, v.size, state, v.why])
    return data


def from_dict(data: dict[str, Any]) -> Capture:
    c = Capture(_task_io(data))
    if data.get("f") != FORMAT:  # format 1: every version with its path and state
        for k in ("inputs", "outputs", "code"):
            getattr(c, k).update((_unpath(x[0]), _unversion(x[1:])) for x in data["v_" + k])
        return c
    io = c.io
    for kind, key in _VERSIONS:
        accesses = getattr(io, kind)
        got = getattr(c, kind)
        for ref, digest, size, state, why in data[key]:
            if isinstance(ref, int):
                a = accesses[ref]
                path = a.path
                st = (a.state if state == AT_END else a.pre_state if state == AT_OPEN
                      else _unstate(state))
            else:
                path, st = _unpath(ref), _unstate(state)
            got[path] = _new(Version, (digest, size, st, why))
    return c


def _task_io(data: dict[str, Any]) -> TaskIO:
    return TaskIO(**{k: [_unaccess(a) for a in data[k]] for k in _LISTS},
                  commands=data["commands"], untraceable=data["untraceable"],
                  unseen=data.get("unseen", []))


def input_digests(data: dict[str, Any]) -> set[str]:
    """The digests of the inputs in a capture's JSON form (`to_dict`), known versions only."""
    return {v[1] for v in data["v_inputs"] if v[1]}


def to_json(c: Capture) -> str:
    return json.dumps(to_dict(c))


def from_json(text: str) -> Capture:
    return from_dict(json.loads(text))


def hasher_for(cfg, stat_cache: bool = True) -> Hasher:
    """A hasher with the stat cache of a `roar_core.config.Config` (closing it closes both);
    `stat_cache=False`: with one in memory (the home cannot be written)."""
    from roar_core.pipeline.hashing import Hasher, StatCache

    return Hasher(StatCache(cfg.statcache_path if stat_cache else None),
                  workers=cfg.hash_workers or None, native=cfg.native_hash, owns_cache=True)


# ---- in a long-lived traced worker ----------------------------------------------------------


class WorkerCapture:
    """Each task's versions at its end, taken in the traced worker that ran it (Ray's), from
    the logs of this process and its children: the worker calls `take(tag)` as a task ends,
    before it hands the result back to the engine, and sends the capture along with the
    task's end (the node's recorder records it later).

    It runs on the task's thread with the tracer ignoring that thread meanwhile (reading the
    logs, the stat cache and the files hashed are not the I/O of the task, nor of an actor
    whose process tag is set)."""

    @classmethod
    def for_config(cls, cfg, session: str | os.PathLike,
                   internal: Iterable[str] = ()) -> WorkerCapture:
        return cls(session, PathFilter.for_config(cfg, internal), hasher_for(cfg))

    def __init__(self, session: str | os.PathLike, keep: PathFilter, hasher: Hasher):
        import time

        from roar_core.pipeline import tracer
        from roar_core.recording.sessions import SessionCollector

        self.keep, self.hasher = keep, hasher
        self._shim = tracer.loaded()
        if self._shim is not None:
            self._shim.quiet(keep.internal)
        self._collector = SessionCollector(Path(session), root_pid=os.getpid(),
                                           since_mono_ns=time.monotonic_ns())

    def take(self, tag: str) -> dict[str, Any]:
        """The capture of the task tagged `tag`, JSON-ready."""
        if self._shim is None:
            return self._take(tag)
        with self._shim.ignoring():
            return self._take(tag)

    def _take(self, tag: str) -> dict[str, Any]:
        from roar_core.pipeline.attribution import UNATTRIBUTED
        from roar_core.pipeline.tracelog import LINEAGE_OPS

        self._collector.collect(live=True)
        records = self._collector.take(tag).records
        self._collector.take(UNATTRIBUTED)  # no task's: not kept for the worker's lifetime
        if not any(r.op in LINEAGE_OPS for r in records):
            return _EMPTY  # computed in memory: nothing to classify or hash
        # Outputs not put in the stat cache: a transaction per task on the task's path
        # (~50 us); a reader that needs them later finds them in the store, recorded by
        # the node's recorder in the order tasks ended.
        return to_dict(capture(records, self.keep, self.hasher, settle=False))


_EMPTY = to_dict(Capture(TaskIO()))
