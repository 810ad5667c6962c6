"""Reader for the preload tracer's per-process logs (format: tracer-bins/preload/roar_log.h).

A log can be read while its process is still writing it (`final=False`: stop at the
first record not yet committed and resume there later) or after the process is gone
(`final=True`: skip torn records left by a kill and count them as dropped).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Iterator

from roar_core.slotted import Frozen, Slotted

MAGIC = b"ROARLOG\0"
VERSION = 1
HEADER_SIZE = 4096
CHUNK = 256 * 1024
RECORD_FIXED = 112
STATE_RESERVED = 0x5253
STATE_COMMITTED = 0x4D43

ORIGIN_EXEC = 1
ORIGIN_FORK = 2

OP_NAMES = {
    0: "pad", 1: "open", 2: "close", 3: "rename", 4: "link", 5: "symlink", 6: "unlink",
    7: "truncate", 8: "mkdir", 9: "rmdir", 10: "exec", 11: "exec_fail", 12: "spawn",
    13: "fork", 14: "chdir", 15: "task_begin", 16: "task_end", 17: "start", 18: "exit",
    19: "dup", 20: "object",
}
OP = {name: code for code, name in OP_NAMES.items()}
# Records whose second string is an argv, NUL-separated (`Record.argv`).
_ARGV_OPS = frozenset(OP[n] for n in ("exec", "exec_fail", "spawn", "start"))
# Records whose second string is NUL-separated too: argv, or an object's key=value fields.
_LIST_OPS = _ARGV_OPS | {OP["object"]}
# The operations classification makes lineage of: on files and objects, and programs run.  A task
# without any (a Ray task that computes in memory) has nothing to classify or hash.
LINEAGE_OPS = frozenset(OP[n] for n in (
    "open", "close", "rename", "link", "symlink", "unlink", "truncate", "mkdir", "rmdir",
    "exec", "spawn", "object"))

# Kinds of object-store access (flags of an "object" record: roar_core.pipeline.s3trace).
OBJ_READ = 1
OBJ_WRITE = 2
OBJ_DELETE = 3
OBJ_DIGEST = 4
OBJ_UNSEEN = 5

RF_STAT = 0x1
RF_EXISTED = 0x2
RF_MODIFIED = 0x4
RF_UNTRACEABLE = 0x8
RF_SETUID = 0x10
RF_PATH_TRUNC = 0x20
RF_ARGV_TRUNC = 0x40
RF_TAG_INHERITED = 0x80
RF_FOPEN = 0x100
RF_DIRFD_UNKNOWN = 0x200
RENAME_EXCHANGE = 0x2  # a rename record's flags are renameat2's (linux/fs.h)

_HEADER = struct.Struct("<8sIIIIIIQQQQII")
_RECORD = struct.Struct("<IHHIIIiqIIiIQQQQQqqHHHH")
assert _RECORD.size == RECORD_FIXED


class TraceLogError(ValueError):
    """A file that is not a readable roar trace log; the message is one line."""


class LogHeader(Frozen):
    __slots__ = ("version", "origin", "pid", "ppid", "start_mono_ns", "start_wall_ns",
                 "reserved", "dropped", "flags")

    def __init__(self, version: int, origin: int, pid: int, ppid: int, start_mono_ns: int,
                 start_wall_ns: int, reserved: int, dropped: int, flags: int) -> None:
        self._set(version=version, origin=origin, pid=pid, ppid=ppid,
                  start_mono_ns=start_mono_ns, start_wall_ns=start_wall_ns,
                  reserved=reserved, dropped=dropped, flags=flags)


class Record(Slotted):
    """One traced operation (roar_log.h's record)."""

    __slots__ = ("op", "pid", "ppid", "tid", "result", "err", "flags", "mode", "fd",
                 "rflags", "mono_ns", "wall_ns", "st_dev", "st_ino", "st_size",
                 "st_mtime_ns", "st_ctime_ns", "tag", "path", "path2")

    def __init__(self, op: int, pid: int, ppid: int, tid: int, result: int, err: int,
                 flags: int, mode: int, fd: int, rflags: int, mono_ns: int, wall_ns: int,
                 st_dev: int, st_ino: int, st_size: int, st_mtime_ns: int,
                 st_ctime_ns: int, tag: str | None, path: bytes, path2: bytes) -> None:
        self.op = op
        self.pid = pid
        self.ppid = ppid
        self.tid = tid
        self.result = result
        self.err = err
        self.flags = flags
        self.mode = mode
        self.fd = fd
        self.rflags = rflags
        self.mono_ns = mono_ns
        self.wall_ns = wall_ns
        self.st_dev = st_dev
        self.st_ino = st_ino
        self.st_size = st_size
        self.st_mtime_ns = st_mtime_ns
        self.st_ctime_ns = st_ctime_ns
        self.tag = tag
        self.path = path
        self.path2 = path2

    @property
    def op_name(self) -> str:
        return OP_NAMES.get(self.op, f"op{self.op}")

    @property
    def argv(self) -> list[bytes]:
        """argv of exec/spawn/start records (path2 holds it NUL-separated)."""
        return self.path2.split(b"\0") if self.path2 else []

    @property
    def ok(self) -> bool:
        return self.err == 0 and self.result >= 0

    def has(self, rflag: int) -> bool:
        return bool(self.rflags & rflag)


class TraceLog(Slotted):
    __slots__ = ("path", "header", "records", "torn", "next_offset", "final")

    def __init__(self, path: str, header: LogHeader, records: list[Record] | None = None,
                 torn: int = 0, next_offset: int = 0, final: bool = True) -> None:
        self.path = path
        self.header = header
        self.records = [] if records is None else records
        self.torn = torn  # records the reader found half-written (killed mid-record)
        self.next_offset = next_offset  # where an incremental read resumes
        self.final = final  # read as a whole log (its process gone), not to resume

    @property
    def dropped(self) -> int:
        """Events lost: counted by the shim, plus torn records."""
        return self.header.dropped + self.torn


def _header(buf: bytes | mmap.mmap, path: str) -> LogHeader:
    if len(buf) < _HEADER.size:
        raise TraceLogError(f"{path}: not a roar trace log (file too short: {len(buf)} bytes)")
    (magic, version, header_size, chunk, origin, pid, ppid, mono, wall, reserved, dropped,
     flags, _pad) = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise TraceLogError(f"{path}: not a roar trace log (bad magic {magic[:8]!r})")
    if version != VERSION:
        raise TraceLogError(f"{path}: trace log version {version}, this roar reads {VERSION}")
    if header_size != HEADER_SIZE or chunk != CHUNK:
        raise TraceLogError(f"{path}: corrupt trace log header (sizes {header_size}/{chunk})")
    return LogHeader(version, origin, pid, ppid, mono, wall, reserved, dropped, flags)


def _decode_tag(raw: bytes) -> str | None:
    return raw.decode("utf-8", "surrogateescape") if raw else None


_HEAD = struct.Struct("<IHH")


def _records(buf, end: int, start: int, final: bool,
             base: int = HEADER_SIZE) -> Iterator[tuple[int, Record | None]]:
    """Yield (offset after, record or None for a torn/skipped one) from data offset start
    (at `buf[base + start]`)."""
    off = start
    unpack, head = _RECORD.unpack_from, _HEAD.unpack_from
    # A task's records carry one of a handful of tags: decode each once (this loop runs
    # once per traced file operation, so it is kept to one unpack and three slices).
    tags: dict[bytes, str | None] = {b"": None}
    while off + 8 <= end:
        size, op, state = head(buf, base + off)
        if size == 0:
            if not final:
                return  # a writer has reserved this space and not yet written it
            # The writer died right after reserving: find the next record.
            nxt = off + 8
            while nxt + 8 <= end and buf[base + nxt: base + nxt + 8] == b"\0" * 8:
                nxt += 8
            off = nxt
            yield off, None
            continue
        if size % 8 or size < 8 or (off % CHUNK) + size > CHUNK or off + size > end:
            if final:
                yield end, None  # garbage where a record should be: stop, count one drop
            return
        if state != STATE_COMMITTED:
            if not final:
                return
            off += size
            yield off, None
            continue
        if op == 0:  # pad to a chunk boundary
            off += size
            continue
        if size < RECORD_FIXED:
            off += size
            yield off, None
            continue
        f = unpack(buf, base + off)
        tag_len, path_len, path2_len = f[19], f[20], f[21]
        p = base + off + RECORD_FIXED
        raw_tag = buf[p: p + tag_len]
        tag = tags.get(raw_tag)
        if tag is None and raw_tag:
            tag = tags[raw_tag] = _decode_tag(raw_tag)
        p += tag_len + 1
        path = buf[p: p + path_len]
        p += path_len + 1
        path2 = buf[p: p + path2_len] if path2_len else b""
        off += size
        # A record the shim wrote never has its strings past its end nor a NUL inside a
        # name; one that does is damaged (a bit flip, a stray write): lost, like a torn
        # one, rather than handed on as a name no system call accepts.  (`0 in`, the byte
        # value: `b"\0" in` first tries the bytes as an integer, a TypeError raised and
        # cleared each time: ~0.2 us, three times a record.)
        if RECORD_FIXED + tag_len + path_len + path2_len + 2 > size or 0 in path or \
                0 in raw_tag or (path2_len and op not in _LIST_OPS and 0 in path2):
            yield off, None
            continue
        yield off, Record(
            op, f[3], f[4], f[5], f[7], f[6], f[8], f[9], f[10], f[11], f[12], f[13],
            f[14], f[15], f[16], f[17], f[18], tag, path, path2,
        )


def read_log(path: str | os.PathLike, start: int = 0,
             final: bool | Callable[[LogHeader], bool] = True) -> TraceLog:
    """Read one log.  With final=False, reading stops before the first record that is
    not committed yet, and `next_offset` says where to resume.  `final` may be decided
    from the log's header (e.g. whether its process is gone), read from the same mapping
    as the records, not opened apart: the log's `final` says what it was."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise _unreadable(path, e) from None
    try:
        size = os.fstat(fd).st_size
        _check_size(path, size)
        if start and not final:
            # Read on from `start` (a task's end reads its own process's log from where it
            # began, in a process just forked): the header and what follows `start` only,
            # where the read below copied the log's first 64 KiB (~0.1 ms more there).
            header = _header(os.pread(fd, _HEADER.size, 0), path)
            more = min(header.reserved, size - HEADER_SIZE) - start
            if more <= _READ_SMALL:
                body = os.pread(fd, max(more, 0), HEADER_SIZE + start)
                return _parse(path, body, size, start, final, header, base=-start)
        # A log whose records fit in its first _READ_SMALL bytes (most processes': a shell,
        # a `cat`) is read, not mapped: mapping and unmapping it cost more than the copy
        # (bench/bench_logs.py: ~26 -> ~18 us a log; with another thread of the reader
        # busy on the other core, whose TLB each unmap must flush: ~44 -> ~18).
        head = os.pread(fd, min(size, _READ_SMALL), 0)
        if len(head) == size or (len(head) >= HEADER_SIZE and HEADER_SIZE
                                 + _header(head, path).reserved <= len(head)):
            return _parse(path, head, len(head), start, final)
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as buf:
            return _parse(path, buf, size, start, final)
    except OSError as e:
        raise _unreadable(path, e) from None
    finally:
        os.close(fd)


_READ_SMALL = 1 << 16


def _check_size(path: str, size: int) -> None:
    if size < HEADER_SIZE:
        raise TraceLogError(f"{path}: not a roar trace log (file too short: {size} bytes)")


def _unreadable(path: str | os.PathLike, e: OSError) -> TraceLogError:
    return TraceLogError(f"{path}: cannot read trace log ({e.strerror or e})")


def _parse(path: str, buf: bytes | mmap.mmap, size: int, start: int,
           final: bool | Callable[[LogHeader], bool], header: LogHeader | None = None,
           base: int = HEADER_SIZE) -> TraceLog:
    """The records from data offset `start`, at `buf[base + start]` (`buf` holds the log
    from its beginning, or from `start` with its `header` read apart)."""
    if header is None:
        header = _header(buf, path)
    if callable(final):
        final = bool(final(header))
    # The file may have been cut (copied, disk full): never read past it.
    end = min(header.reserved, size - HEADER_SIZE)
    log = TraceLog(path, header, next_offset=start, final=final)
    last_torn = False
    for off, rec in _records(buf, end, start, final, base):
        log.next_offset = off
        last_torn = rec is None
        if last_torn:
            log.torn += 1
        else:
            log.records.append(rec)
    if final and not last_torn and log.next_offset < header.reserved:
        log.torn += 1  # the file was cut short at a record boundary
    return log


class LiveLog:
    """A log kept open and mapped between incremental reads: a long-lived process reads
    its own log once per task, where an open, a map and an unmap each time cost more than
    the few records it finds.  The mapping follows the file as the shim extends it."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            self._f = open(self.path, "rb")
        except OSError as e:
            raise _unreadable(self.path, e) from None
        self._map: mmap.mmap | None = None
        self._size = 0

    def read(self, start: int = 0) -> TraceLog:
        """What the process has committed since `start` (as read_log with final=False)."""
        try:
            size = os.fstat(self._f.fileno()).st_size
            if self._map is None or size != self._size:
                _check_size(self.path, size)
                if self._map is not None:
                    self._map.close()
                self._map = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)
                self._size = size
        except OSError as e:
            raise _unreadable(self.path, e) from None
        return _parse(self.path, self._map, size, start, False)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        self._f.close()


def read_header(path: str | os.PathLike) -> LogHeader:
    """Only the header of a log (which process wrote it, where its next record goes),
    without mapping the records.  os calls, no file object: a process marking where a task
    begins in its own log reads it on the task's path."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            buf = os.pread(fd, _HEADER.size, 0)
        finally:
            os.close(fd)
    except OSError as e:
        raise _unreadable(path, e) from None
    return _header(buf, os.fspath(path))


_STARTS = frozenset(OP[n] for n in ("fork", "spawn", "exec", "exec_fail"))
_ONTO = frozenset(OP[n] for n in ("rename", "link"))


def written_since(path: str | os.PathLike, offset: int) -> set[bytes] | None:
    """Every path a process may have written since `offset` of its log (its own, read as
    it runs): opened to write, created or truncated, renamed or linked onto (both names of
    an exchange), closed modified (a descriptor opened before `offset`).  None where
    the log alone cannot say: records lost, or a process started (its writes are in a
    log of its own), or a path relative to a directory the tracer could not name, or a
    record not committed yet.  The shim reads the same from its own process's mapping
    (`Shim.written_since`)."""
    log = read_log(path, start=offset, final=False)
    if log.dropped or log.torn or log.next_offset < log.header.reserved:
        return None  # (the last: a record not committed yet, the rest unread)
    written: set[bytes] = set()
    for r in log.records:
        op = r.op
        if op in _STARTS or r.rflags & RF_DIRFD_UNKNOWN:
            return None
        if op == _OPEN:
            if r.flags & os.O_ACCMODE != os.O_RDONLY or r.flags & (os.O_CREAT | os.O_TRUNC):
                written.add(r.path)
        elif op in _ONTO:
            written.add(r.path2)
            if r.flags & RENAME_EXCHANGE and op == _RENAME:  # (each name holds the other's)
                written.add(r.path)
        elif op == _TRUNCATE or (op == _CLOSE and r.rflags & RF_MODIFIED):
            written.add(r.path)
    return written


_OPEN, _TRUNCATE, _CLOSE, _RENAME = OP["open"], OP["truncate"], OP["close"], OP["rename"]


def log_files(session_dir: str | os.PathLike, since_mono_ns: int | None = None,
              pid: int | None = None) -> list[str]:
    """The logs of a session, in creation order (pid then monotonic start).

    `since_mono_ns` (CLOCK_MONOTONIC): only the logs created since then, and `pid`'s own,
    told by name (roar-<pid>-<mono_ns>.log); a log not named that way is kept."""
    # scandir, and names filtered before anything is stat'ed: a long-lived worker's session
    # holds a log for every process it ever forked, where a stat each (glob + is_file) and
    # a pathlib.Path each were most of the time it took to find a task's few.
    return [p for _, p in _scan(session_dir, since_mono_ns, pid)]


def _scan(session_dir: str | os.PathLike, since_mono_ns: int | None = None,
          pid: int | None = None) -> list[tuple[tuple[int, int], str]]:
    keyed = []
    try:
        with os.scandir(session_dir) as entries:
            for e in entries:
                if not (e.name.startswith("roar-") and e.name.endswith(".log")):
                    continue
                key = _log_key(e.name)
                if since_mono_ns is not None and not in_window(key, since_mono_ns, pid):
                    continue
                if e.is_file():
                    keyed.append((key or (0, 0), e.path))
    except OSError:  # gone or unreadable: no logs, as glob says
        return []
    keyed.sort()
    return keyed


def in_window(key: tuple[int, int] | None, since_mono_ns: int, pid: int | None) -> bool:
    """Whether the log named by `key` ((mono_ns, pid) from its name; None or (0, 0): not
    named so, kept) was created since `since_mono_ns` or is `pid`'s own: an older one is
    another process's that had a pid of the tree since reused."""
    return key is None or key == (0, 0) or key[0] >= since_mono_ns or key[1] == pid


class LogListing:
    """One listing of a directory's logs for every collector that reads it, taken when its
    owner says the directory may have changed, with the logs indexed by process.

    A recorder follows one producer per task process, each with a collector of its own
    tree; each listing the directory itself, at every pass, scanned it once per producer
    with tasks outstanding: with a backlog of 50 that was half of the recorder's CPU, and
    a recorder catching up on 2,000 dead producers' logs took 35 s for one pass.  The
    owner marks it stale after reading the end lines it is about to record (a task's logs
    all exist by its end), and the first collector to look lists the directory again;
    each collector then finds its tree's logs through `related`, not by reading them all.
    `headers`: logs' headers read so far (kept across listings, each read once; its owner
    drops those of the logs it removes)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = directory
        self.headers: dict[str, LogHeader] = {}
        self.version = 0
        self._stale = True
        self._keys: dict[str, tuple[int, int]] = {}
        self._related: dict[int, list[tuple[str, LogHeader]]] = {}

    def invalidate(self) -> None:
        self._stale = True

    def current(self) -> int:
        """The listing's version, listed again first if it is stale."""
        if self._stale:
            self._refresh()
        return self.version

    def _refresh(self) -> None:
        headers = self.headers
        keys: dict[str, tuple[int, int]] = {}
        related: dict[int, list[tuple[str, LogHeader]]] = {}
        for key, path in _scan(self.directory):
            keys[path] = key
            head = headers.get(path)
            if head is None:
                try:
                    head = headers[path] = read_header(path)
                except TraceLogError:
                    continue  # being created: its header is not written yet (next time)
            related.setdefault(head.pid, []).append((path, head))
            if head.ppid != head.pid:
                related.setdefault(head.ppid, []).append((path, head))
        self._keys, self._related = keys, related
        self.version += 1
        self._stale = False

    def related(self, pid: int) -> list[tuple[str, LogHeader]]:
        """The logs of process `pid` and of its children, with their headers."""
        return self._related.get(pid, [])

    def key(self, path: str) -> tuple[int, int] | None:
        """(mono_ns, pid) from a listed log's name ((0, 0): not named so); None: not
        listed."""
        return self._keys.get(path)


def _log_key(name: str) -> tuple[int, int] | None:
    """(mono_ns, pid) from roar-<pid>-<mono_ns>.log, or None."""
    parts = name[:-4].split("-")
    try:
        return int(parts[2]), int(parts[1])
    except (IndexError, ValueError):
        return None


class SessionTrace(Slotted):
    __slots__ = ("logs", "errors")

    def __init__(self, logs: list[TraceLog], errors: list[str]) -> None:
        self.logs = logs
        self.errors = errors  # one line per unreadable log

    @property
    def dropped(self) -> int:
        return sum(log.dropped for log in self.logs) + len(self.errors)


def read_session(session_dir: str | os.PathLike) -> SessionTrace:
    """Read every log of a finished session; unreadable ones are reported, not fatal."""
    logs, errors = [], []
    for p in log_files(session_dir):
        try:
            logs.append(read_log(p, final=True))
        except TraceLogError as e:
            errors.append(str(e))
    return SessionTrace(logs, errors)
