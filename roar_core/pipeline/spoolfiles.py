"""The spool's on-disk format: segments of records, delivery logs, crash recovery.

One directory, shared by every process of a node:

    <ns>-<pid>-<rand>.jsonl   a segment: one record per line, `{"t":<ns>,"event":{...}}`,
                              written by exactly one process, which holds an flock on it while
                              it may still append. A segment nobody locks is sealed (its writer
                              closed it or died) and will never grow again.
    <segment>.ack             append-only delivery log: byte offsets up to which the segment
                              is delivered; the largest complete one counts.
    .sender.lock              flock'd by the process that is sending (see spool.py).
    rejected.jsonl            events the backend refused as invalid, kept with the reason.

A record is one write(2) of a whole line followed by fdatasync, so a crash leaves at most a
truncated last line, in a segment that is then sealed; readers report it and keep every complete
line. Writers never reopen a segment, so nothing is ever appended after such garbage.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".jsonl"
ACK_SUFFIX = ".ack"
SENDER_LOCK = ".sender.lock"
REJECTED = "rejected.jsonl"
SLOW = "slow-tries"  # one line per timed-out send of an event: "<segment> <offset>"
_SEGMENT_NAME = re.compile(r"^\d{20}-\d+-[0-9a-f]+\.jsonl$")
# The append time comes first so ordering needs no JSON parse of the whole line.
_RECORD = re.compile(rb'\{"t":(\d+),"event":(.*)\}$', re.DOTALL)
_CHUNK = 64 * 1024
# After a failed fdatasync, how soon the records it was to make durable are written again
# into a new segment (doubling, up to the most): a broken disk is not hammered.
RESYNC_S = 1.0
RESYNC_MAX_S = 60.0
_TMP_GRACE_S = 60.0


@dataclass
class Record:
    t: int
    """Append time (ns); orders records across segments."""
    segment: Segment
    start: int
    end: int
    body: bytes
    """The event's JSON, or the raw bytes of an unreadable line."""
    problem: str | None = None


class NotSynced(OSError):
    """Events were written but could not be made durable (`Spool.batch(strict=True)`):
    whoever would mark them spooled must not yet."""


class SegmentWriter:
    """Appends records to this process's own segment, rotating it by size. Thread-safe."""

    def __init__(self, directory: Path, segment_bytes: int, fsync: bool) -> None:
        self.directory = directory
        self._segment_bytes = segment_bytes
        self._fsync = fsync
        self._lock = threading.Lock()
        self._fd: int | None = None
        self.path: Path | None = None
        self._size = 0
        self._last_t = 0
        self._deferred = 0  # open sync_once() blocks
        self._dirty = False  # written since the last fdatasync
        # While deferring: the records written since the last sync that made them all
        # durable, to write again into a new segment should an fdatasync fail (the disk may
        # have dropped what it could not write, and a later fdatasync would not say so).
        self._unsynced: list[tuple[bytes, bytes, bytes]] = []
        self._failed = False  # an fdatasync of those failed
        # Their events, once one failed (`write`): made from `_unsynced` then.
        self._unsynced_events: set[bytes] | None = None
        self._retry_at = 0.0
        self._retry_s = RESYNC_S

    def write(self, event_json: bytes) -> None:
        """Append one record durably; raises OSError (and seals the segment) on failure."""
        with self._lock:
            # Strictly increasing per process, even if the wall clock steps back.
            t = self._last_t = max(time.time_ns(), self._last_t + 1)
            # The event as it is, between its envelope's pieces: no copy of megabytes (see
            # write_all).
            line = (b'{"t":%d,"event":' % t, event_json, b"}\n")
            size = len(line[0]) + len(event_json) + 2
            if self._failed and self._deferred:
                # Written with the rest by the next sync (`_write_again`), not into a segment
                # that would then hold it twice; an event kept already (one a follower sent
                # again from what it had staged) is not kept twice.
                if self._unsynced_events is None:
                    self._unsynced_events = {rec[1] for rec in self._unsynced}
                if event_json not in self._unsynced_events:
                    self._unsynced_events.add(event_json)
                    self._unsynced.append(line)
                return
            try:
                if self._fd is not None and self._size + size > self._segment_bytes:
                    self._seal()
                if self._fd is None:
                    self._open()
                assert self._fd is not None
                write_all(self._fd, line)
                if self._fsync and self._deferred:
                    self._dirty = True
                    self._unsynced.append(line)
                elif self._fsync:
                    os.fdatasync(self._fd)
                self._size += size
            except OSError:
                # The segment may now end in a partial line: seal it so no later record is
                # glued onto the garbage; the next write starts a fresh segment.
                self._seal()
                raise

    def seal(self) -> None:
        with self._lock:
            self._seal()

    def defer_sync(self) -> None:
        """Until the matching `sync_deferred`, records are written without an fdatasync each."""
        with self._lock:
            self._deferred += 1

    @property
    def deferring(self) -> bool:
        return self._deferred > 0

    def position(self) -> tuple[Path | None, int]:
        """This process's segment and how much of it is written so far."""
        with self._lock:
            return self.path, self._size

    def sync_deferred(self) -> None:
        """One fdatasync for everything written since `defer_sync`.  Where it fails, those
        records are written again into a new segment and synced there; raises OSError when
        that fails too, or is not tried yet (`RESYNC_S`): they stay to be tried again by the
        next sync."""
        with self._lock:
            self._deferred -= 1
            if self._deferred or not self._dirty:
                return
            if not self._failed and self._fd is not None:
                try:
                    os.fdatasync(self._fd)
                except OSError as e:
                    self._failed = True
                    log.warning("roar: the OpenLineage spool %s could not be synced (%s): "
                                "its last events are written again into a new segment",
                                self.directory, e.strerror or e)
                else:
                    self._synced()
                    return
            self._write_again()

    def _synced(self) -> None:
        self._dirty = self._failed = False
        self._unsynced = []
        self._unsynced_events = None
        self._retry_s = RESYNC_S

    def _write_again(self) -> None:
        now = time.monotonic()
        if now < self._retry_at:
            raise OSError(errno.EIO, "an earlier fdatasync failed, its events are written "
                          f"again in {self._retry_at - now:.0f} s")
        self._seal()  # the segment that failed (whatever it holds), or one opened since
        try:
            self._open()
            assert self._fd is not None
            for line in self._unsynced:
                write_all(self._fd, line)
                self._size += sum(map(len, line))
            os.fdatasync(self._fd)
        except OSError:
            self._seal()
            self._retry_at = time.monotonic() + self._retry_s
            self._retry_s = min(2 * self._retry_s, RESYNC_MAX_S)
            raise
        self._synced()

    def forget(self) -> None:
        """In a forked child: drop the parent's segment without touching the parent's lock."""
        if self._fd is not None:
            # The flock lives on the open file shared with the parent; closing our copy
            # leaves it held by the parent.
            os.close(self._fd)
        self._lock = threading.Lock()
        self._fd, self.path, self._size = None, None, 0
        self._synced()

    def _open(self) -> None:
        name = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(4)}{SEGMENT_SUFFIX}"
        final = self.directory / name
        tmp = self.directory / f".{name}.tmp"
        # Locked before the name is visible: a sender must never see our segment unlocked
        # (it would take it as sealed, deliver it and delete it under us).
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o600)
        except FileNotFoundError:
            # The directory is gone, or was never made (a file stood in its way, since
            # removed): made now, or every later event would be refused until a restart.
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # Known as ours before it is visible, for lock emulations (NFS) where our own
            # flock would not exclude our own sender.
            self.path = final
            os.rename(tmp, final)
            _fsync_dir(self.directory)
        except OSError:
            os.close(fd)
            self.path = None
            raise
        self._fd, self._size = fd, 0

    def _seal(self) -> None:
        if self._fd is not None:
            if self._dirty and not self._failed:
                try:
                    os.fdatasync(self._fd)
                except OSError:
                    # Sealed anyway, the next segment starts clean; what was written since
                    # the last sync is written again at the next (`sync_deferred`).
                    self._failed = True
            os.close(self._fd)  # drops the flock: the segment is sealed
        self._fd, self.path, self._size = None, None, 0


class Segment:
    """A segment as a sender sees it: how far it is delivered, whether it can still grow."""

    def __init__(self, path: Path, sealed: bool, size: int, acked: int) -> None:
        self.path = path
        self.sealed = sealed
        self.size = size
        self.acked = acked

    @classmethod
    def load(cls, path: Path, own: bool) -> Segment | None:
        """`own`: the caller's writer is appending to it (never sealed, whatever locks say)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            # Lock test first, size second: once the lock is ours the writer is gone and the
            # size is final. The other order could miss a last append and delete it unsent.
            sealed = not own and _try_lock(fd)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        return cls(path, sealed, size, min(read_ack(path), size))

    @property
    def delivered(self) -> bool:
        return self.acked >= self.size

    def records(self) -> Iterator[Record]:
        """Undelivered records, read lazily in chunks (a backlog can be large)."""
        # The lines of each chunk are split off at once: slicing each line off the rest of
        # the buffer copied the rest every time (a 64 KiB chunk of ~40 events copied ~1 MiB).
        # A line longer than a chunk (a task of thousands of files: megabytes) is gathered
        # in pieces and joined once: adding each chunk to it and splitting it again was
        # quadratic (a 5 MB event took 0.1 s to read, a 50 MB one would take ~10 s).
        pieces: list[bytes] = []  # the start of a line whose newline is not read yet
        at = read_to = self.acked  # file offsets of `pieces` and of the end of what was read
        last_t = 0
        while read_to < self.size:
            with open(self.path, "rb") as f:
                f.seek(read_to)
                chunk = f.read(min(_CHUNK, self.size - read_to))
            if not chunk:
                break
            read_to += len(chunk)
            if b"\n" not in chunk:
                pieces.append(chunk)
                continue
            lines = (b"".join((*pieces, chunk)) if pieces else chunk).split(b"\n")
            tail = lines.pop()
            pieces = [tail] if tail else []
            for line in lines:
                start = at
                at += len(line) + 1
                m = _RECORD.match(line)
                if m is None:
                    yield Record(last_t, self, start, at, line + b"\n", "malformed record")
                    continue
                last_t = int(m[1])
                yield Record(last_t, self, start, at, m[2])
        # A line without its newline: being written right now, or torn by a crash.
        tail = b"".join(pieces)
        if tail and self.sealed:
            problem = f"truncated record ({len(tail)} bytes, its writer is gone)"
            yield Record(last_t, self, at, at + len(tail), tail, problem)

    def ack(self, offset: int, sync: bool = True) -> None:
        """`sync=False`: durable against a killed process, not an OS crash (after which
        the events it covers are sent again)."""
        append_synced(ack_path(self.path), b"%d\n" % offset, sync)
        self.acked = offset

    def remove(self) -> None:
        # Segment first: an ack without its segment is harmless and cleaned up later, a
        # segment without its ack would be sent again.
        _unlink(self.path)
        _unlink(ack_path(self.path))


def segment_paths(directory: str | os.PathLike) -> list[Path]:
    """Segments in creation order (none where the directory is missing, or a file stands
    in its place: its appends have failed, and said so)."""
    try:
        return sorted(p for p in Path(directory).iterdir() if _SEGMENT_NAME.match(p.name))
    except (FileNotFoundError, NotADirectoryError):
        return []


def pending_count(directory: str | os.PathLike) -> int:
    """Complete records not yet delivered, over all segments."""
    count = 0
    for path in segment_paths(directory):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        count += data.count(b"\n", read_ack(path))
    return count


def pending_bytes(directory: str | os.PathLike) -> int:
    """Bytes of records not yet delivered, over all segments (what a flush would send)."""
    total = 0
    for path in segment_paths(directory):
        try:
            total += max(0, path.stat().st_size - read_ack(path))
        except FileNotFoundError:
            continue
    return total


def remove_stale(directory: str | os.PathLike) -> None:
    """Delete leftovers of removed segments and of writers that died while creating one."""
    try:
        paths = list(Path(directory).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return
    for path in paths:
        name = path.name
        if name.endswith(ACK_SUFFIX):
            if not path.with_suffix("").exists():
                _unlink(path)
        elif name.startswith(".") and name.endswith(".tmp") and _abandoned(path):
            _unlink(path)
        elif name == SLOW and not _names_a_segment(path):
            _unlink(path)


def _names_a_segment(slow: Path) -> bool:
    try:
        lines = slow.read_bytes().splitlines()
    except FileNotFoundError:
        return False
    names = {line.partition(b" ")[0] for line in lines}
    return any((slow.parent / os.fsdecode(n)).exists() for n in names)


def count_slow_try(directory: Path, segment: Path, offset: int) -> int:
    """Count one more timed-out send of the event at `offset` of `segment`; returns how
    many there have been (by any process)."""
    path = directory / SLOW
    key = b"%s %d\n" % (os.fsencode(segment.name), offset)
    append_synced(path, key)
    with open(path, "rb") as f:
        return sum(1 for line in f if line == key)


def ack_path(segment: Path) -> Path:
    return segment.with_name(segment.name + ACK_SUFFIX)


def read_ack(segment: Path) -> int:
    """How far `segment` is delivered: the largest offset in its ack file that can be one.

    Offsets only grow, and the last line may be torn by a crash.  An offset is believed
    only where a record ends in the segment as it is (0, or just after a newline): a
    damaged ack file (a stray write, a bad disk block) must cost resent events, never
    events taken for delivered that were not (it read as "all of it" and the whole backlog
    was dropped)."""
    try:
        data = ack_path(segment).read_bytes()
    except FileNotFoundError:
        return 0
    offsets = sorted({int(x) for x in data.split(b"\n")[:-1] if x.isdigit()}, reverse=True)
    if not offsets:
        return 0
    try:
        with open(segment, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            for offset in offsets:
                if offset == 0:
                    return 0
                if offset <= size and os.pread(f.fileno(), 1, offset - 1) == b"\n":
                    return offset
    except FileNotFoundError:  # delivered whole and removed
        return offsets[0]
    return 0


def append_synced(path: Path, data: bytes, sync: bool = True) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, (data,))
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _abandoned(path: Path) -> bool:
    # Old and unlocked: a live writer holds it for microseconds between create and rename.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        return time.time() - os.fstat(fd).st_mtime > _TMP_GRACE_S and _try_lock(fd)
    finally:
        os.close(fd)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


_IOV_MAX = 1024  # Linux's (sysconf(_SC_IOV_MAX))


def write_all(fd: int, parts: Sequence[bytes]) -> None:
    """All of `parts`, in order, in as few writev calls as the kernel takes.  Pieces, not
    one concatenation: a task of thousands of files has events of megabytes, and each copy
    of them goes to fresh pages (in a recorder just forked, a page fault every 4 KiB)."""
    views = [memoryview(p) for p in parts if p]
    i = 0
    while i < len(views):
        n = os.writev(fd, views[i : i + _IOV_MAX])
        if n == 0:
            raise OSError(errno.EIO, "short write")
        while n:  # what went out: whole pieces, then the start of the next one
            if n >= len(views[i]):
                n -= len(views[i])
                i += 1
            else:
                views[i], n = views[i][n:], 0


def _fsync_dir(directory: Path) -> None:
    # The new segment's name must survive a crash too, not only its content.
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
