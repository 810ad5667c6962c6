"""Hashing step: blake3 content digests of the files a task read and wrote.

Every file is identified by its ``os.stat`` state before and after it is read. A state found in
the stat cache is answered without opening the file; a state that changes while the file is
read means the digest may mix two versions, so the file is hashed again, and reported
``stable=False`` (and never cached) if it keeps changing.
"""

from __future__ import annotations

import errno
import functools
import math
import mmap
import os
import stat
import threading
import time
from collections import namedtuple
from collections.abc import Callable, Collection, Iterable, Mapping

from blake3 import blake3

from roar_core.lazylog import LazyLogger

from . import nativehash, tracer
from .statcache import FileState, StatCache, reset_after_fork

TYPE_CHECKING = False  # not typing's (see roar_core.slotted)
if TYPE_CHECKING:  # concurrent.futures is imported where a pool is first made
    from concurrent.futures import ThreadPoolExecutor

__all__ = ["BIG_FILE", "FileState", "HashResult", "Hasher", "StatCache", "blake3_file"]

_log = LazyLogger(__name__)

Path = str | bytes

# At this size one file is worth all cores (blake3's rayon mode); below it, whole-file reads
# hashed on one core each, many files at a time, are faster.
BIG_FILE = 16 * 1024 * 1024
# Below this size hash_files hashes files in the calling thread rather than on the pool.
_INLINE_MAX = 64 * 1024
# Files per cache transaction and per progress report.
_BATCH = 256
# Fewer small files than this are not worth loading the native hasher or splitting work.
_NATIVE_MIN = 16
# Files per native call when a batch is spread over the pool (see hash_files).
_NATIVE_CHUNK = 640
# Read size when a big file cannot be mmap'ed.
_CHUNK = 8 * 1024 * 1024
# A file whose ctime is this recent when we start reading it may still get a write stamped with
# the same ctime (timestamps advance by the kernel's 1-10 ms tick; kernels >= 6.13 refine this),
# which no later stat could tell apart. Such digests are returned but never cached.
RACY_WINDOW_NS = 100_000_000
# File systems whose timestamps the kernel refines once read (multigrain timestamps, Linux
# 6.13): after a stat has read a file's ctime, its next change gets a ctime of its own, even
# within the same clock tick.  There a stat taken before a read and found again later proves
# the content unchanged since the read, however recent the ctime; elsewhere only a ctime
# older than RACY_WINDOW_NS at the read does.  (Measured here, ext4 and tmpfs, 6.18: a file
# stat'ed, then rewritten with as many bytes at once, got the same ctime 0 times in 2,000.)
_REFINED_FS = frozenset({"ext4", "xfs", "btrfs", "tmpfs"})
_REFINED_SINCE = (6, 13)
# O_NONBLOCK: should a FIFO replace the file between stat and open, open() must not hang.
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK


# One per file hashed: cheaper to make than a dataclass.  collections' named tuple, not
# typing's: importing typing is ~4 ms of a `roar-core run` that takes versions.
class HashResult(namedtuple("HashResult", ("path", "digest", "size", "state", "stable",
                                           "cached"))):
    __slots__ = ()
    path: Path
    digest: str  # 64 lowercase hex chars (blake3, 32 bytes)
    size: int  # bytes hashed
    state: FileState  # the stat taken after hashing; equal to the one before if stable
    stable: bool  # False if the file kept changing while it was hashed
    cached: bool  # True when the digest came from the stat cache (file not read)


def _regular_state(path: Path) -> FileState | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # ValueError: embedded NUL in the path
        return None
    return FileState.of(st) if stat.S_ISREG(st.st_mode) else None


@functools.lru_cache(maxsize=1)
def refined_devices() -> frozenset[int]:
    """The devices (st_dev) mounted now whose file system refines timestamps once read
    (see _REFINED_FS); none on an older kernel or where the mount table cannot be read.
    A device mounted later is not among them: its files get the stricter rule."""
    try:
        kernel = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    except ValueError:
        return frozenset()
    if kernel < _REFINED_SINCE:
        return frozenset()
    found = set()
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                # id parent major:minor root mountpoint options [optional...] - fstype ...
                fields = line.split()
                try:
                    fstype = fields[fields.index(b"-") + 1].decode()
                    major, minor = fields[2].split(b":")
                except (ValueError, IndexError):
                    continue
                if fstype in _REFINED_FS:
                    found.add(os.makedev(int(major), int(minor)))
    except OSError:
        return frozenset()
    return frozenset(found)


def _digest_fd(
    fd: int, size: int, big_file: int = BIG_FILE, use_mmap: bool = True
) -> tuple[str, int]:
    """(hex digest, bytes hashed) of the open file ``fd``, whose fstat size was ``size``.

    Hashing the descriptor rather than a path (as ``blake3.update_mmap`` does) guarantees the
    bytes belong to the inode that was stat'ed, and works for bytes paths, which update_mmap
    rejects.
    """
    if size < big_file:
        # One read of size+1: a short read is EOF, and growth after it shows up in the re-stat.
        data = os.read(fd, size + 1)
        if len(data) <= size:
            return blake3(data).hexdigest(), len(data)
        hasher = blake3(data)
        n = len(data)
        while block := os.read(fd, _CHUNK):
            hasher.update(block)
            n += len(block)
        return hasher.hexdigest(), n
    hasher = blake3(max_threads=blake3.AUTO)
    if use_mmap:
        # Same speed as update_mmap (measured). Caveat of any mmap hashing: should another
        # process truncate the file meanwhile, touching the lost pages raises SIGBUS.
        try:
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
                hasher.update(mapped)
                return hasher.hexdigest(), len(mapped)
        except (OSError, ValueError):  # no mmap on this filesystem, or the file became empty
            pass
    n = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while got := os.readv(fd, [buf]):
        hasher.update(view[:got])
        n += got
    return hasher.hexdigest(), n


def blake3_file(path: os.PathLike | Path) -> str:
    """Hex blake3 digest of a file's content, read once, with no stat cache or change check."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a FIFO would read as empty, a device forever
            raise OSError(errno.EINVAL, "not a regular file", path)
        return _digest_fd(fd, st.st_size)[0]
    finally:
        os.close(fd)


def _default_workers() -> int:
    try:
        cores = len(os.sched_getaffinity(0))  # the cores we may use, not the machine's
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(2, cores)


class Hasher:
    """Hashes files with blake3, through an optional :class:`StatCache`. Thread-safe.

    ``hash_files`` spreads files of 64 KiB or more over a pool of ``workers`` threads (blake3
    and reads release the GIL) and hashes smaller ones in the calling thread meanwhile. A file
    of ``big_file`` bytes or more is mmap'ed and hashed with all cores. Symlinks are followed;
    results keep the path as given. The cache is the caller's: ``close()`` shuts the pool down
    and leaves the cache open.

    With ``native`` (and the batch hasher built, see :mod:`roar_core.pipeline.nativehash`), the
    small files go through it in chunks on the pool: a file it could not read, or whose stat after
    the read differs from the one before, is done again in Python.
    """

    def __init__(
        self,
        cache: StatCache | None = None,
        workers: int | None = None,
        big_file: int = BIG_FILE,
        max_retries: int = 2,
        *,
        use_mmap: bool = True,
        racy_window_ns: int = RACY_WINDOW_NS,
        native: bool = True,
        owns_cache: bool = False,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.cache = cache
        self.workers = workers or _default_workers()
        self.big_file = big_file
        self.max_retries = max_retries
        self.use_mmap = use_mmap
        self.racy_window_ns = racy_window_ns
        self.native = native
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.owns_cache = owns_cache  # close() closes the cache too
        self._held: list[tuple[FileState, str]] | None = None  # see hold_cache
        reset_after_fork(self)

    def _after_fork_in_child(self) -> None:
        # The parent's pool threads do not exist here; an inherited executor would never run.
        self._pool = None
        self._pool_lock = threading.Lock()

    def hash_file(self, path: Path) -> HashResult | None:
        """Digest of ``path``; None if it is missing, not a regular file, or unreadable."""
        if self.cache is not None:
            state = _regular_state(path)
            if state is None:
                return None
            digest = self.cache.get(state)
            if digest is not None:
                return HashResult(path, digest, state.size, state, stable=True, cached=True)
        # Without a cache there is nothing to look up: the fstat after open() is the first stat.
        result, cacheable = self._hash_uncached(path)
        if cacheable and self.cache is not None:
            self.cache.put(result.state, result.digest)
        return result

    def hash_files(
        self,
        paths: Iterable[Path],
        progress: Callable[[int, int], None] | None = None,
        known: Mapping[Path, FileState] | None = None,
        written: Collection[Path] = (),
        settled: Collection[Path] = (),
    ) -> dict[Path, HashResult]:
        """Digests keyed by the paths as given; paths ``hash_file`` would answer None are left out.

        ``progress(done, total)`` is called from the calling thread as files complete.
        ``known``: a stat of regular files taken just before (classification's, once the task
        has ended), used as the "before" stat instead of taking another: the stat after the
        read still has to agree with it, so a change in between is caught as any other.
        ``written``: paths the task that just ended wrote.  The cache cannot hold their new
        state yet (only a hash taken since could have put it there), so they are not looked
        up: for a task's thousands of outputs, thousands of certain misses.
        ``settled``: paths whose writers are done (a task's outputs hashed at its end): their
        digests are cached even when their ctime is recent.  What a later write within the
        same timestamp tick could hide, the stat taken here exposes on kernels that refine
        timestamps once read (>= 6.13); the other readers of this version are the next
        tasks, which look it up by the state they opened.
        """
        unique = list(dict.fromkeys(paths))
        total = len(unique)
        results: dict[Path, HashResult] = {}
        known = known or {}
        states = [known.get(p) or _regular_state(p) for p in unique]
        hits = self._lookup(
            [None if p in written else s for p, s in zip(unique, states, strict=True)]
            if written else states)
        small: list[Path] = []
        large: list[Path] = []
        before: dict[Path, FileState] = {}
        for path, state, digest in zip(unique, states, hits, strict=True):
            if state is None:
                continue
            if digest is not None:
                results[path] = HashResult(path, digest, state.size, state, True, True)
            else:
                before[path] = state
                (small if state.size < _INLINE_MAX else large).append(path)
        done = total - len(small) - len(large)
        if progress is not None and done:
            progress(done, total)
        fresh: list[tuple[FileState, str]] = []

        def collect(batch: list[tuple[Path, HashResult | None, bool]]) -> None:
            nonlocal done
            for path, result, cacheable in batch:
                if result is not None:
                    results[path] = result
                    if cacheable or (result.stable and path in settled):
                        fresh.append((result.state, result.digest))
            if len(fresh) >= _BATCH:
                self._store(fresh)
            done += len(batch)
            if progress is not None:
                progress(done, total)

        if len(large) < 2:  # a pool round trip costs more than it could save
            small += large
            large = []
        # Files of _INLINE_MAX or more go to the pool one each: their read and hash release the
        # GIL. Smaller ones are mostly Python and syscall overhead, where threads contending for
        # the GIL are slower than this thread alone (measured: 4 KiB files, 2 cores: 17 µs/file
        # inline, 31 µs on 2 threads); without the native hasher they are hashed here meanwhile.
        futures = [self._get_pool().submit(self._hash_many, [p], before) for p in large]
        batch = self._native_batch(len(small))
        if batch is not None:
            # The native calls drop the GIL, so the pool's threads hash on every core. In
            # chunks, a few per thread: one thread turns its finished chunk into results
            # (Python, under the GIL) while another is still hashing, where two halves
            # would finish together and then queue for the GIL (measured, 5000 files of
            # 4 KiB on 2 cores: 33 ms against 41).
            n = len(small)
            chunks = min(n // _NATIVE_MIN, max(self.workers, math.ceil(n / _NATIVE_CHUNK)))
            step = math.ceil(n / chunks)
            futures += [self._get_pool().submit(self._hash_native, batch, small[i : i + step],
                                                before) for i in range(0, n, step)]
            small = []
        for i in range(0, len(small), _BATCH):
            collect(self._hash_many(small[i : i + _BATCH], before))
        if futures:  # as_completed() of nothing still costs a lock and a waiter
            from concurrent.futures import as_completed

            for future in as_completed(futures):
                collect(future.result())
        self._store(fresh)
        return results

    def hash_early(self, paths: list[Path], max_size: int) -> list[HashResult]:
        """Digests of files a running task has finished writing, hashed in this thread
        (one core: the task has the other), each with the state it was read at; kept only
        where no later change of the file can leave that state as it is (its ctime was old
        enough at the read, or its file system refines timestamps once read and the state
        was read before the content).  A state found again at the task's end then stands
        for the content the task left.  Files gone, changing, unreadable or of more than
        `max_size` bytes are left out."""
        before = {p: s for p in paths
                  if (s := _regular_state(p)) is not None and s.size <= max_size}
        if not before:
            return []
        todo = list(before)
        batch = self._native_batch(len(todo))
        rows = (self._hash_native(batch, todo, before) if batch is not None
                else self._hash_many(todo, before))
        refined = refined_devices()
        return [r for _, r, settled in rows
                if r is not None and r.stable and (settled or r.state.dev in refined)]

    def start_exited(self, paths: list[Path], max_size: int
                     ) -> Callable[[], dict[Path, HashResult]] | None:
        """Start hashing files a command left as it exited, on the pool, in native calls
        without the GIL: the caller goes on in Python meanwhile (its classification), where
        a Python stat per file on another thread would wait for the caller's switch
        interval each time.  Returns what waits for them: the digests of the files whose
        stat before the read and after it agree, each with that state (for the caller to
        check against the state it finds); files that failed, changed, are not regular or
        hold more than `max_size` bytes are left out, for the usual path.  Nothing is
        cached here.  None without the native hasher."""
        # (NUL: see _hash_native.  A task's paths come as bytes: no copy of each.)
        todo = [(p, n) for p in paths
                if b"\0" not in (n := p if isinstance(p, bytes) else os.fsencode(p))]
        # Any number of files, not `_native_batch`'s 16 at least: on the pool, beside the
        # caller's Python, a few files are no dearer native, and the Python path for them
        # is the end's own hashing (a command whose last files the tail had not read yet
        # left them all to it).
        batch = nativehash.load() if self.native and todo else None
        if batch is None:
            return None
        parts = max(1, min(self.workers, len(todo) // _NATIVE_MIN))
        step = math.ceil(len(todo) / parts)
        chunks = [todo[i : i + step] for i in range(0, len(todo), step)]
        pool = self._get_pool()
        futures = [pool.submit(batch.hash_exited, [n for _, n in c], max_size) for c in chunks]

        def results() -> dict[Path, HashResult]:
            out: dict[Path, HashResult] = {}
            for chunk, future in zip(chunks, futures, strict=True):
                try:
                    rows = future.result()
                except Exception:  # noqa: BLE001 - (memory) left to the usual path
                    continue
                for (path, _), row in zip(chunk, rows, strict=True):
                    status, _, nbytes, _, dev, ino, size, mtime_ns, ctime_ns, hexd = row
                    if status == 0:
                        state = FileState(dev, ino, size, mtime_ns, ctime_ns)
                        out[path] = HashResult(path, hexd.decode(), nbytes, state, True, False)
            return out

        return results

    def remember(self, results: Iterable[HashResult]) -> None:
        """Put digests taken earlier (`hash_early`'s, confirmed since) in the stat cache."""
        self._store([(r.state, r.digest) for r in results])

    def _lookup(self, states: list[FileState | None]) -> list[str | None]:
        hits: list[str | None] = [None] * len(states)
        if self.cache is None:
            return hits
        known = [i for i, s in enumerate(states) if s is not None]
        # In slices, so a huge list does not hold the cache lock away from other threads.
        for start in range(0, len(known), _BATCH):
            part = known[start : start + _BATCH]
            for i, digest in zip(part, self.cache.get_many([states[i] for i in part]), strict=True):
                hits[i] = digest
        return hits

    def _store(self, fresh: list[tuple[FileState, str]]) -> None:
        # One transaction per batch: a commit per file would cost more than hashing it.
        if fresh and self.cache is not None:
            if self._held is not None:
                self._held += fresh
            else:
                self.cache.put_many(fresh)
        fresh.clear()

    def hold_cache(self) -> None:
        """Keep the stat cache entries of the files hashed from now on until `write_cache`
        (a runner logs its run's end first: the recorder reads it while they are written)."""
        if self._held is None:
            self._held = []

    @property
    def holding(self) -> bool:
        """Whether its stat cache entries are held (`hold_cache`)."""
        return self._held is not None

    def write_cache(self) -> None:
        held, self._held = self._held, None
        if held and self.cache is not None:
            self.cache.put_many(held)

    def _hash_many(
        self, paths: list[Path], known: Mapping[Path, FileState] | None = None
    ) -> list[tuple[Path, HashResult | None, bool]]:
        known = known or {}
        return [(p, *self._hash_uncached(p, known.get(p))) for p in paths]

    def _native_batch(self, n: int) -> nativehash.BatchHasher | None:
        return nativehash.load() if self.native and n >= _NATIVE_MIN else None

    def _hash_native(
        self, batch: nativehash.BatchHasher, paths: list[Path], before: Mapping[Path, FileState]
    ) -> list[tuple[Path, HashResult | None, bool]]:
        out: list[tuple[Path, HashResult | None, bool]] = []
        names = [os.fsencode(p) for p in paths]
        # open() would refuse those: left to Python.  (The byte value: see tracelog._records.)
        ok = [0 not in n for n in names]
        rows = iter(batch.hash([n for n, k in zip(names, ok, strict=True) if k],
                               [before[p].size for p, k in zip(paths, ok, strict=True) if k]))
        window = self.racy_window_ns
        for path, k in zip(paths, ok, strict=True):
            if k:  # fields of nativehash's HashOut, in order
                status, _, nbytes, read_at_ns, dev, ino, size, mtime_ns, ctime_ns, hexd = next(rows)
                b = before[path]
                after = FileState(dev, ino, size, mtime_ns, ctime_ns)
                if status == 0 and after == b:
                    result = HashResult(path, hexd.decode(), nbytes, after, True, False)
                    out.append((path, result, read_at_ns - b.ctime_ns >= window))
                    continue
            # Failed, or changed since `before`: the Python path retries and reports.
            out.append((path, *self._hash_uncached(path, before[path])))
        return out

    def _hash_uncached(
        self, path: Path, known: FileState | None = None
    ) -> tuple[HashResult | None, bool]:
        """Read and hash ``path`` until two stats around the read agree; (result, cacheable).
        ``known``: a stat of the regular file taken just before, standing in for the first
        "before" stat (it was taken earlier, so it can only make a change more visible)."""
        for attempt in range(self.max_retries + 1):
            try:
                fd = os.open(path, _OPEN_FLAGS)
            except (OSError, ValueError) as exc:
                _log.debug("cannot open %r: %s", path, exc)
                return None, False
            try:
                if known is not None and attempt == 0:
                    before = known
                else:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        return None, False
                    before = FileState.of(st)
                settled = time.time_ns() - before.ctime_ns >= self.racy_window_ns
                digest, nbytes = self._hash_fd(fd, before.size)
            except OSError as exc:  # EIO, or a filesystem that refuses reads
                _log.debug("cannot read %r: %s", path, exc)
                return None, False
            finally:
                os.close(fd)
            # Re-stat the path, not the fd: it also catches a replacement (rename over it).
            after = _regular_state(path)
            if after is None:
                return None, False
            if after == before:
                return HashResult(path, digest, nbytes, after, True, False), settled
            _log.debug("%r changed while hashing (attempt %d)", path, attempt + 1)
        return HashResult(path, digest, nbytes, after, False, False), False

    def _hash_fd(self, fd: int, size: int) -> tuple[str, int]:
        # A method, so tests can interpose on the moment between the two stats.
        return _digest_fd(fd, size, self.big_file, self.use_mmap)

    def _get_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                # In a traced worker, hashing must not count as the running task's reads.
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="roar-hash",
                                                initializer=tracer.ignore_this_thread)
            return self._pool

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.write_cache()
        if self.owns_cache and self.cache is not None:
            self.cache.close()

    def __enter__(self) -> Hasher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
