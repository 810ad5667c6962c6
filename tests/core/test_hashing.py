"""Tests for roar_core.pipeline.hashing and its stat cache, on real files."""

from __future__ import annotations

import errno
import json
import logging
import mmap
import operator
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from blake3 import blake3

from roar_core.pipeline import hashing, statcache
from roar_core.pipeline.hashing import FileState, Hasher, HashResult, StatCache, blake3_file

REPO = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024


def b3(data: bytes) -> str:
    return blake3(data).hexdigest()


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def pseudo_random(size: int) -> bytes:
    # Repeating 1 MiB of urandom: large files without paying for urandom or a simple pattern.
    block = os.urandom(min(size, MiB))
    return (block * (size // MiB + 1))[:size]


@pytest.fixture
def cache(tmp_path: Path):
    with StatCache(tmp_path / "cache" / "stat.sqlite") as c:
        yield c


# --- digests --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, MiB])
def test_digest_matches_blake3(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = write(tmp_path / "f.bin", data)
    with Hasher() as hasher:
        result = hasher.hash_file(path)
        assert result is not None
        assert result.digest == b3(data)
        assert (result.size, result.stable, result.cached) == (size, True, False)
        assert result.state == FileState.of(os.stat(path))
        assert hasher.hash_files([path])[path].digest == b3(data)
    assert blake3_file(path) == b3(data)


def test_big_file_uses_mmap_and_matches(tmp_path: Path, monkeypatch) -> None:
    data = pseudo_random(100 * MiB)
    path = write(tmp_path / "big.bin", data)
    expected = b3(data)
    maps = []
    real_mmap = mmap.mmap

    def spy(*args, **kwargs):
        maps.append(args)
        return real_mmap(*args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", spy)
    with Hasher() as hasher:
        result = hasher.hash_file(path)
    assert result is not None and result.digest == expected and result.size == len(data)
    assert len(maps) == 1, "a 100 MiB file must take the big-file (mmap) path"
    with Hasher(use_mmap=False) as hasher:  # chunked-read fallback
        assert hasher.hash_file(path).digest == expected
    assert len(maps) == 1


@pytest.mark.parametrize("use_mmap", [True, False])
def test_big_file_path_odd_sizes(tmp_path: Path, use_mmap: bool) -> None:
    # A tiny big_file threshold sends page-unaligned sizes through the mmap and chunked paths.
    with Hasher(big_file=4096, use_mmap=use_mmap) as hasher:
        for size in (4096, 4097, 10_007, 3 * 4096 + 1):
            data = os.urandom(size)
            path = write(tmp_path / f"f{size}", data)
            assert hasher.hash_file(path).digest == b3(data), size


def test_file_growing_beyond_stat_size_is_hashed_to_eof(tmp_path: Path) -> None:
    data = os.urandom(5000)
    path = write(tmp_path / "f", data)
    fd = os.open(path, os.O_RDONLY)
    try:
        # fstat said 100 bytes, the file holds 5000: the read must not stop at 100.
        assert hashing._digest_fd(fd, 100) == (b3(data), 5000)
    finally:
        os.close(fd)


# --- paths that are not regular files -------------------------------------------------------


@pytest.mark.timeout(10)  # opening a FIFO without O_NONBLOCK would hang
def test_missing_directory_fifo_return_none(tmp_path: Path, cache: StatCache) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    good = write(tmp_path / "ok", b"ok")
    odd = [str(tmp_path / "missing"), str(tmp_path / "dir"), str(fifo), "bad\0path"]
    for hasher in (Hasher(), Hasher(cache)):
        with hasher:
            for path in odd:
                assert hasher.hash_file(path) is None, path  # a FIFO must not block either
            assert list(hasher.hash_files([*odd, good])) == [good]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_returns_none(tmp_path: Path) -> None:
    path = write(tmp_path / "secret", b"x")
    os.chmod(path, 0)
    with Hasher() as hasher:
        assert hasher.hash_file(path) is None


def test_read_error_returns_none(tmp_path: Path, cache: StatCache) -> None:
    path = write(tmp_path / "f", b"x")

    class FailingDisk(Hasher):
        def _hash_fd(self, fd: int, size: int):
            raise OSError(errno.EIO, "Input/output error")

    with FailingDisk(cache) as hasher:
        assert hasher.hash_file(path) is None
        assert hasher.hash_files([path]) == {}


def test_blake3_file_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path / "fifo", tmp_path, tmp_path / "missing"):
        with pytest.raises(OSError):
            blake3_file(path)


def test_non_utf8_bytes_paths_keep_their_type(tmp_path: Path, cache: StatCache) -> None:
    root = os.fsencode(tmp_path)
    raw = os.path.join(root, b"caf\xe9-\xff\xfe.bin")  # latin-1 name, invalid UTF-8
    with open(raw, "wb") as f:
        f.write(b"bytes name")
    text = write(tmp_path / "plain.txt", b"str name")
    with Hasher(cache, racy_window_ns=0) as hasher:
        result = hasher.hash_file(raw)
        assert result.path == raw and result.digest == b3(b"bytes name")
        results = hasher.hash_files([raw, text])
        assert set(results) == {raw, text}
        assert isinstance(results[raw].path, bytes) and isinstance(results[text].path, str)
        assert results[raw].cached  # same inode as the first call
        assert results[text].digest == b3(b"str name")
    assert blake3_file(raw) == b3(b"bytes name")


# --- stat cache -----------------------------------------------------------------------------

HASH_TWICE = """
import json, sys
from roar_core.pipeline.hashing import Hasher, StatCache
path, cache_path, times = sys.argv[1], sys.argv[2], int(sys.argv[3])
with StatCache(cache_path) as cache, Hasher(cache, racy_window_ns=0) as hasher:
    results = [hasher.hash_file(path) for _ in range(times)]
print(json.dumps([[r.digest, r.cached] for r in results]))
"""


def traced_opens(tmp_path: Path, target: str, cache_path: Path, times: int, tag: str):
    """Run HASH_TWICE under strace; (its results, how often it opened ``target``)."""
    log = tmp_path / f"strace-{tag}.txt"
    cmd = ["strace", "-f", "-qq", "-e", "trace=openat,open", "-o", str(log)]
    cmd += [sys.executable, "-c", HASH_TWICE, target, str(cache_path), str(times)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    if proc.returncode != 0 and "ptrace" in proc.stderr.lower():
        pytest.skip(f"strace cannot trace here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    opens = [line for line in log.read_text().splitlines() if f'"{target}"' in line]
    return json.loads(proc.stdout), opens


@pytest.mark.skipif(
    shutil.which("strace") is None and not os.environ.get("ROAR_TEST_REQUIRE_STRACE"),
    reason="needs strace (CI sets ROAR_TEST_REQUIRE_STRACE to make this a failure)",
)
def test_cache_hit_opens_nothing_even_across_processes(tmp_path: Path) -> None:
    data = os.urandom(10_000)
    target = write(tmp_path / "input-7f3a.bin", data)
    cache_path = tmp_path / "node-cache.sqlite"

    results, opens = traced_opens(tmp_path, target, cache_path, times=2, tag="first")
    assert results == [[b3(data), False], [b3(data), True]]
    assert len(opens) == 1, opens

    # A second process sharing the cache file gets the hit without opening the file at all.
    results, opens = traced_opens(tmp_path, target, cache_path, times=1, tag="second")
    assert results == [[b3(data), True]]
    assert opens == []


def test_modified_file_misses_the_cache(tmp_path: Path, cache: StatCache) -> None:
    path = write(tmp_path / "f", b"version 1")
    with Hasher(cache, racy_window_ns=0) as hasher:
        first = hasher.hash_file(path)
        assert not first.cached and hasher.hash_file(path).cached
        st = os.stat(path)
        Path(path).write_bytes(b"version 2")  # same size
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old mtime, as rsync -t
        second = hasher.hash_file(path)
    # Only ctime tells the versions apart; it must be part of the key.
    assert second.state.mtime_ns == first.state.mtime_ns
    assert (second.digest, second.cached) == (b3(b"version 2"), False)


def test_recently_changed_file_is_not_cached(tmp_path: Path, cache: StatCache) -> None:
    path = write(tmp_path / "f", b"fresh")
    with Hasher(cache, racy_window_ns=10**12) as hasher:  # everything counts as recent
        assert hasher.hash_file(path).stable
        assert not hasher.hash_file(path).cached
    with Hasher(cache, racy_window_ns=0) as hasher:
        hasher.hash_file(path)
        assert hasher.hash_file(path).cached


def test_hash_files_uses_and_fills_the_cache(tmp_path: Path, cache: StatCache) -> None:
    sizes = [0, 1, 100, 70_000, 200_000, 300_000]  # some go to the pool (>= 64 KiB)
    files = {write(tmp_path / f"f{i}", os.urandom(s)): s for i, s in enumerate(sizes)}
    seen = []
    with Hasher(cache, workers=3, racy_window_ns=0) as hasher:
        cold = hasher.hash_files(files, progress=lambda d, t: seen.append((d, t)))
        warm = hasher.hash_files(list(files) * 2, progress=lambda d, t: seen.append((d, t)))
    assert not any(r.cached for r in cold.values()) and all(r.cached for r in warm.values())
    for path in files:
        assert cold[path].digest == warm[path].digest == blake3_file(path)
    first = [d for d, t in seen if t == len(files)]
    assert first == sorted(first) and seen[-1] == (len(files), len(files))


class CountingCache(StatCache):
    """A real cache that remembers which states were looked up."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.looked_up: list[FileState] = []

    def get_many(self, states):
        self.looked_up.extend(states)
        return super().get_many(states)


def test_files_the_task_wrote_are_not_looked_up(tmp_path: Path) -> None:
    read = [write(tmp_path / f"in{i}", b"input %d" % i) for i in range(3)]
    wrote = [write(tmp_path / f"out{i}", b"output %d" % i) for i in range(40)]
    with CountingCache(tmp_path / "c.db") as cache, Hasher(cache, racy_window_ns=0) as hasher:
        hasher.hash_files(read)  # cached now
        cache.looked_up.clear()
        got = hasher.hash_files(read + wrote, written=wrote)
        # Only the inputs were looked up (and found); the outputs were hashed, and cached.
        assert sorted(s.ino for s in cache.looked_up) == sorted(os.stat(p).st_ino for p in read)
        assert all(got[p].cached for p in read) and not any(got[p].cached for p in wrote)
        assert {p: got[p].digest for p in wrote} == {p: blake3_file(p) for p in wrote}
        assert all(hasher.hash_file(p).cached for p in wrote)


def test_in_memory_cache(tmp_path: Path) -> None:
    path = write(tmp_path / "f", b"abc")
    with Hasher(StatCache(None), racy_window_ns=0) as hasher:
        assert not hasher.hash_file(path).cached
        assert hasher.hash_file(path).cached


def test_statcache_edge_values(tmp_path: Path) -> None:
    huge = FileState(dev=2**64 - 1, ino=2**63 + 5, size=1, mtime_ns=-(10**18), ctime_ns=10)
    digest = b3(b"x")
    db = tmp_path / "c.sqlite"
    with StatCache(db) as c:
        c.put(huge, digest)
        assert c.get(huge) == digest
        # A stale writer must not replace a newer version of the same inode.
        newer = FileState(huge.dev, huge.ino, 2, 0, 20)
        c.put(newer, b3(b"y"))
        c.put(huge, digest)
        assert c.get(newer) == b3(b"y") and c.get(huge) is None
    with StatCache(db) as c:
        assert c.get(newer) == b3(b"y")
        other_dev = FileState(7, huge.ino, 2, 0, 20)
        c.put(other_dev, b3(b"z"))
        assert c.get_many([newer, other_dev, huge, FileState(7, 1, 1, 1, 1)]) == [
            b3(b"y"),
            b3(b"z"),
            None,
            None,
        ]


def test_statcache_put_many_spans_several_statements(tmp_path: Path) -> None:
    # More rows than one multi-row statement holds, with one inode twice in a slice: the
    # later, newer version wins as it would row by row, and the stale one cannot come back.
    n = statcache._PUT_SLICE * 2 + 3
    states = [FileState(9, i, i, i, 100 + i) for i in range(n)]
    items = [(s, format(i, "064x")) for i, s in enumerate(states)]
    again = FileState(9, 5, 77, 77, 10_000)
    stale = FileState(9, 6, 1, 1, 1)
    with StatCache(tmp_path / "c.sqlite") as c:
        c.put_many([*items[:10], (again, b3(b"again")), (stale, b3(b"stale")), *items[10:]])
        want = [format(i, "064x") for i in range(n)]
        want[5] = None  # replaced by `again` within the same statement
        assert c.get_many(states) == want
        assert c.get_many([again, stale]) == [b3(b"again"), None]


def test_a_new_statcache_uses_large_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    old = tmp_path / "old.sqlite"
    with sqlite3.connect(old) as db:
        db.execute("PRAGMA page_size = 4096")
        db.execute("CREATE TABLE t (x)")
    for path in (tmp_path / "new.sqlite", old):
        with StatCache(path) as c:
            c.put(FileState(1, 2, 3, 4, 5), b3(b""))
    pages = {p.name: sqlite3.connect(p).execute("PRAGMA page_size").fetchone()[0]
             for p in (tmp_path / "new.sqlite", old)}
    assert pages == {"new.sqlite": statcache.PAGE_SIZE, "old.sqlite": 4096}
    assert statcache.PAGE_SIZE > 4096


def test_statcache_rebuilds_old_schema_and_survives_garbage(tmp_path: Path, caplog) -> None:
    old = tmp_path / "old.sqlite"
    with sqlite3.connect(old) as db:
        db.execute("CREATE TABLE stat_cache (x)")
        db.execute("PRAGMA user_version = 999")
    state = FileState(1, 2, 3, 4, 5)
    with StatCache(old) as c:
        c.put(state, b3(b""))
        assert c.get(state) == b3(b"")

    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with caplog.at_level(logging.WARNING), StatCache(junk) as c:
        c.put(state, b3(b""))  # degraded to memory, still works
        assert c.get(state) == b3(b"")
    assert "unusable" in caplog.text


PUT_MANY = """
import sys
from roar_core.pipeline.statcache import FileState, StatCache
base = int(sys.argv[2])
with StatCache(sys.argv[1], busy_timeout=30) as c:
    for i in range(base, base + 200):
        c.put(FileState(1, i, i, i, i), format(i, "064x"))
"""


def test_statcache_concurrent_processes(tmp_path: Path) -> None:
    db = tmp_path / "shared.sqlite"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", PUT_MANY, str(db), str(base)], env=env)
        for base in (0, 200, 400)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    with StatCache(db) as c:
        states = [FileState(1, i, i, i, i) for i in range(600)]
        assert c.get_many(states) == [format(i, "064x") for i in range(600)]


# --- files that change while they are hashed ------------------------------------------------


class MutatingHasher(Hasher):
    """Rewrites the file right after each read, before the re-stat: the race made deterministic."""

    def __init__(self, path: str, versions: list[bytes], **kwargs) -> None:
        super().__init__(**kwargs)
        self.path, self.versions, self.reads = path, list(versions), 0

    def _hash_fd(self, fd: int, size: int) -> tuple[str, int]:
        result = super()._hash_fd(fd, size)
        self.reads += 1
        if self.versions:
            st = os.stat(self.path)
            # In place, same size, old mtime: only ctime can reveal it. In place (no truncate)
            # because truncating a file that is mmap'ed elsewhere raises SIGBUS there.
            with open(self.path, "r+b") as f:
                f.write(self.versions.pop(0))
            os.utime(self.path, ns=(st.st_atime_ns, st.st_mtime_ns))
        return result


@pytest.mark.parametrize("big_file", [hashing.BIG_FILE, 1024], ids=["read", "mmap"])
def test_change_during_hashing_is_rehashed(tmp_path: Path, cache: StatCache, big_file) -> None:
    v1, v2 = os.urandom(4096), os.urandom(4096)
    path = write(tmp_path / "out.bin", v1)
    with MutatingHasher(path, [v2], cache=cache, big_file=big_file, racy_window_ns=0) as h:
        result = h.hash_file(path)
    assert h.reads == 2
    assert result.stable and result.digest == b3(v2)
    assert result.state == FileState.of(os.stat(path))
    assert cache.get(result.state) == b3(v2)


@pytest.mark.parametrize("big_file", [hashing.BIG_FILE, 1024], ids=["read", "mmap"])
def test_file_that_keeps_changing_is_unstable(tmp_path: Path, cache: StatCache, big_file) -> None:
    versions = [os.urandom(4096) for _ in range(5)]
    path = write(tmp_path / "out.bin", versions[0])
    kwargs = dict(cache=cache, big_file=big_file, max_retries=2, racy_window_ns=0)
    with MutatingHasher(path, versions[1:], **kwargs) as h:
        result = h.hash_file(path)
    assert h.reads == 3  # one read + max_retries
    assert not result.stable and not result.cached
    assert result.digest == b3(versions[2])  # what the last read saw
    assert cache.get(FileState.of(os.stat(path))) is None  # unstable digests are never cached
    with MutatingHasher(path, [], **kwargs) as h:  # once it holds still, it is hashed again
        again = h.hash_files([path])[path]
    assert h.reads == 1 and again.stable and again.digest == b3(versions[3])


def test_known_state_stands_in_for_the_first_stat_but_a_change_is_caught(
    tmp_path: Path, cache: StatCache
) -> None:
    # The recorder passes classification's stat instead of a fresh one; a file written after
    # that stat (same size) must come out with its new content, cached under its new state.
    v1, v2 = os.urandom(4096), os.urandom(4096)
    path = write(tmp_path / "out.bin", v1)
    stale = FileState.of(os.stat(path))
    os.utime(path, ns=(stale.mtime_ns + 10**9, stale.mtime_ns + 10**9))
    with open(path, "r+b") as f:
        f.write(v2)
    with Hasher(cache, racy_window_ns=0) as h:
        got = h.hash_files([path], known={path: stale})[path]
    assert got.digest == b3(v2) and got.stable
    assert got.state == FileState.of(os.stat(path)) != stale
    assert cache.get(stale) is None and cache.get(got.state) == b3(v2)
    # Unchanged since the known stat: hashed once, from that stat, and cached under it.
    other = write(tmp_path / "in.bin", v1)
    known = FileState.of(os.stat(other))
    with Hasher(cache, racy_window_ns=0) as h:
        res = h.hash_files([other], known={other: known})[other]
    assert res.digest == b3(v1) and res.state == known and cache.get(known) == b3(v1)


def test_file_replaced_during_hashing(tmp_path: Path) -> None:
    path = write(tmp_path / "f", b"old")

    class Replacing(Hasher):
        def _hash_fd(self, fd: int, size: int):
            result = super()._hash_fd(fd, size)
            if not hasattr(self, "done"):
                self.done = True
                write(tmp_path / "new", b"new")
                os.replace(tmp_path / "new", path)  # rename over: a new inode
            return result

    with Replacing() as h:
        result = h.hash_file(path)
    assert result.stable and result.digest == b3(b"new")


# --- threads and fork -----------------------------------------------------------------------


def test_concurrent_callers_share_one_hasher(tmp_path: Path, cache: StatCache) -> None:
    files = {write(tmp_path / f"f{i}", os.urandom(i * 997)): None for i in range(120)}
    files.update({write(tmp_path / f"g{i}", os.urandom(100_000)): None for i in range(6)})
    expected = {p: blake3_file(p) for p in files}
    errors: list[BaseException] = []
    with Hasher(cache, workers=4, racy_window_ns=0) as hasher:

        def worker() -> None:
            try:
                for _ in range(3):
                    got = hasher.hash_files(list(files))
                    assert {p: r.digest for p, r in got.items()} == expected
                    assert all(isinstance(r, HashResult) for r in got.values())
            except BaseException as exc:  # noqa: BLE001 - surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_usable_in_a_forked_child(tmp_path: Path, cache: StatCache) -> None:
    files = [write(tmp_path / f"f{i}", os.urandom(100_000)) for i in range(4)]
    hasher = Hasher(cache, workers=2, racy_window_ns=0)
    hasher.hash_files(files)  # the pool and the connection now exist in the parent
    # Written after the parent's hashing: >= 2 uncached files of >= 64 KiB need the pool.
    late = [write(tmp_path / f"late{i}", os.urandom(100_000)) for i in range(2)]
    pid = os.fork()
    if pid == 0:  # child: must neither hang on the dead pool nor reuse the parent's connection
        code = 1
        try:
            signal.alarm(20)
            got = hasher.hash_files([*files, *late])
            ok = all(got[p].cached for p in files)
            ok = ok and all(got[p].digest == blake3_file(p) and not got[p].cached for p in late)
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    hasher.close()
    assert os.waitstatus_to_exitcode(status) == 0
    for path in late:  # what the child learnt is in the shared cache
        assert cache.get(FileState.of(os.stat(path))) is not None


# --- the native batch hasher ------------------------------------------------------------------


@pytest.fixture
def native_batch():
    from roar_core.pipeline import nativehash

    batch = nativehash.load()
    if batch is None:
        if os.environ.get("ROAR_TEST_REQUIRE_NATIVE"):
            pytest.fail(f"{nativehash.library_path()} was not built (cargo missing?)")
        pytest.skip("the native batch hasher was not built")
    return batch


def _python_calls(monkeypatch) -> list:
    calls: list = []
    real = Hasher._hash_uncached

    def spy(self, path, known=None):
        calls.append(path)
        return real(self, path, known)

    monkeypatch.setattr(Hasher, "_hash_uncached", spy)
    return calls


def test_native_batch_gives_the_python_results(tmp_path: Path, native_batch, monkeypatch) -> None:
    sizes = [0, 1, 31, 1024, 4096, 4097, 65_535] * 5
    files = [write(tmp_path / f"f{i}", os.urandom(s)) for i, s in enumerate(sizes)]
    odd = os.fsencode(str(tmp_path)) + b"/caf\xe9"  # not UTF-8: bytes all the way
    Path(os.fsdecode(odd)).write_bytes(b"latin-1 name")
    os.symlink(files[3], tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    paths = [*files, odd, str(tmp_path / "link"), str(tmp_path / "fifo"), str(tmp_path / "dir"),
             str(tmp_path / "missing")]
    known = {p: hashing._regular_state(p) for p in paths if hashing._regular_state(p)}
    calls = _python_calls(monkeypatch)
    with Hasher(racy_window_ns=0) as h:
        got = h.hash_files(paths, known=known)
    assert calls == []  # every regular file went through the batch
    with Hasher(racy_window_ns=0, native=False) as h:
        want = h.hash_files(paths, known=known)
    assert got == want
    assert set(got) == {*files, odd, str(tmp_path / "link")}
    assert got[odd].digest == b3(b"latin-1 name") and isinstance(got[odd].path, bytes)
    assert all(got[p].digest == blake3_file(p) for p in files)


def test_native_lstat_gives_what_os_lstat_gives(tmp_path: Path, native_batch) -> None:
    # A task's end looks at each of its files with one call into the library: the same
    # fields os.lstat gives, and a failure (missing, not a directory) where it fails.
    from roar_core.pipeline.classification import _NATIVE_LSTAT_MIN, _lstat_all

    root = os.fsencode(str(tmp_path))
    write(tmp_path / "plain", b"abc")
    Path(os.fsdecode(root + b"/caf\xe9")).write_bytes(b"latin-1 name")
    os.symlink(tmp_path / "plain", tmp_path / "link")
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    names = [b"plain", b"caf\xe9", b"link", b"dangling", b"fifo", b"dir", b"missing",
             b"plain/under-a-file"]
    # Enough to be split over threads (1,024 a thread): each answer in its path's place.
    paths = [root + b"/" + n for n in names] * 300
    assert len(paths) > 2 * 1024 and len(paths) > _NATIVE_LSTAT_MIN
    got = [None if r[0] else r[1:] for r in native_batch.lstat(paths)]
    fields = operator.attrgetter("st_mode", "st_dev", "st_ino", "st_size", "st_mtime_ns",
                                 "st_ctime_ns")
    want = [fields(os.lstat(p)) if os.path.lexists(p) else None for p in paths]
    assert got == want
    assert [st is None for st in want[:len(names)]] == [False] * 6 + [True] * 2
    assert _lstat_all(paths) == want  # through the library: enough paths for it
    assert _lstat_all(paths[:len(names)]) == want[:len(names)]  # os.lstat: too few
    errnos = [r[0] for r in native_batch.lstat(paths[:len(names)])]
    assert errnos[-2:] == [errno.ENOENT, errno.ENOTDIR]


# Run without a thread to spare (RLIMIT_NPROC 1): only the library and ctypes, so that an
# unprivileged user's system Python can run it.
_NO_THREADS_CHILD = """
import ctypes, os, struct, sys, threading
try:
    threading.Thread(target=lambda: None).start()
    sys.exit(3)  # a thread could be made: the limit did not hold
except RuntimeError:
    pass
lib = ctypes.CDLL(sys.argv[1])
paths = [os.fsencode(os.path.join(sys.argv[2], f"f{i}")) for i in range(int(sys.argv[3]))]
out = ctypes.create_string_buffer(48 * len(paths))
lib.roar_lstat_files(b"\\0".join(paths) + b"\\0", ctypes.c_size_t(len(paths)), out)
got = [(r[0], r[3]) for r in struct.iter_unpack("<iIQQqqq", out.raw)]
sys.exit(0 if got == [(0, os.lstat(p).st_ino) for p in paths] else 4)
"""


def test_native_lstat_where_no_thread_can_be_made(native_batch) -> None:
    # Many paths are split over threads.  Where none can be made (a job's pids limit), the
    # caller's thread does them all: a failed spawn must not abort the process, which would
    # make `roar-core run` exit with SIGABRT's code instead of its command's (it did).
    import tempfile

    from roar_core.pipeline import nativehash

    prlimit = shutil.which("prlimit")
    if prlimit is None:
        pytest.skip("no prlimit (util-linux)")
    d = Path(tempfile.mkdtemp(prefix="roar-nproc-"))  # readable by the unprivileged user
    try:
        d.chmod(0o755)
        files = d / "files"
        files.mkdir()
        n = 3 * 1024
        for i in range(n):
            (files / f"f{i}").write_bytes(b"x")
        lib = d / "lib.so"
        shutil.copyfile(nativehash.library_path(), lib)
        lib.chmod(0o755)
        child = d / "child.py"
        child.write_text(_NO_THREADS_CHILD)
        child.chmod(0o644)
        cmd = [prlimit, "--nproc=1", sys.executable, str(child), str(lib), str(files), str(n)]
        if os.geteuid() == 0:  # root's own processes are not limited: nobody's are
            setpriv, python = shutil.which("setpriv"), "/usr/bin/python3"
            if setpriv is None or not os.access(python, os.X_OK):
                pytest.skip("root: no setpriv or /usr/bin/python3 to run as nobody")
            cmd = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                   prlimit, "--nproc=1", python, *cmd[3:]]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_native_batch_redoes_a_file_changed_since_its_known_stat(
    tmp_path: Path, native_batch, monkeypatch
) -> None:
    files = [write(tmp_path / f"f{i}", b"v1 %d" % i) for i in range(20)]
    known = {p: hashing._regular_state(p) for p in files}
    with open(files[4], "ab") as f:  # grew after classification's stat
        f.write(b" and more")
    os.replace(write(tmp_path / "new", b"replacement"), files[7])  # replaced since
    calls = _python_calls(monkeypatch)
    with Hasher(racy_window_ns=0) as h:
        got = h.hash_files(files, known=known)
    assert sorted(calls) == sorted([files[4], files[7]])  # only those two, again in Python
    assert got[files[4]].digest == b3(b"v1 4 and more") and got[files[4]].stable
    assert got[files[7]].digest == b3(b"replacement")
    assert got[files[0]].digest == b3(b"v1 0")


def test_native_batch_leaves_recent_files_out_of_the_cache(
    tmp_path: Path, cache: StatCache, native_batch
) -> None:
    files = [write(tmp_path / f"f{i}", b"x%d" % i) for i in range(20)]
    with Hasher(cache) as h:  # default window: files written just now are racy
        h.hash_files(files)
    assert all(d is None for d in cache.get_many([hashing._regular_state(p) for p in files]))
    with Hasher(cache, racy_window_ns=0) as h:
        h.hash_files(files)
    assert all(d for d in cache.get_many([hashing._regular_state(p) for p in files]))


def test_native_batch_runs_on_the_pool_in_chunks(tmp_path: Path, native_batch, monkeypatch) -> None:
    # Never in the calling thread (in a traced worker that may be a task's thread, whose
    # reads the tracer would count), and in more chunks than threads, so that one thread's
    # results are built while another still hashes.
    files = [write(tmp_path / f"f{i:04d}", b"%d" % i) for i in range(2000)]
    threads: list[str] = []
    real = type(native_batch).hash

    def spy(self, paths, sizes):
        threads.append(threading.current_thread().name)
        return real(self, paths, sizes)

    monkeypatch.setattr(type(native_batch), "hash", spy)
    with Hasher(racy_window_ns=0, workers=2) as h:
        got = h.hash_files(files)
    assert {p: r.digest for p, r in got.items()} == {p: b3(b"%d" % i)
                                                    for i, p in enumerate(files)}
    assert len(threads) > 2 and all(t.startswith("roar-hash") for t in threads), threads


# ---- files a command left as it exited (start_exited) ----------------------------------------


def test_files_left_at_exit_are_hashed_on_the_pool_with_their_state(
        tmp_path: Path, native_batch, monkeypatch) -> None:
    # The caller goes on in Python meanwhile: the native calls run on the pool's threads.
    # Each digest is the file's bytes, with its state; what is not a regular file of at
    # most max_size bytes, or is gone, is left out (for the usual path).
    sizes = [0, 1, 31, 1024, 4096, 65_535] * 10
    files = [write(tmp_path / f"f{i}", os.urandom(s)) for i, s in enumerate(sizes)]
    odd = os.fsencode(str(tmp_path)) + b"/caf\xe9"  # not UTF-8: bytes all the way
    Path(os.fsdecode(odd)).write_bytes(b"latin-1 name")
    big = write(tmp_path / "big", b"x" * 70_000)
    os.symlink(files[3], tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    paths = [*files, odd, big, str(tmp_path / "link"), str(tmp_path / "fifo"),
             str(tmp_path / "dir"), str(tmp_path / "missing")]
    threads: list[str] = []
    real = type(native_batch).hash_exited

    def spy(self, names, max_size):
        threads.append(threading.current_thread().name)
        return real(self, names, max_size)

    monkeypatch.setattr(type(native_batch), "hash_exited", spy)
    with Hasher(workers=2) as h:
        got = h.start_exited(paths, 65_536)()
    assert set(got) == {*files, odd, str(tmp_path / "link")}
    assert len(threads) == 2 and all(t.startswith("roar-hash") for t in threads), threads
    for p, r in got.items():
        with open(p, "rb") as f:
            assert (r.digest, r.size, r.stable) == (b3(f.read()), os.stat(p).st_size, True)
        assert r.state == FileState.of(os.stat(p)) and r.path is p
    assert Hasher(native=False).start_exited(files, 65_536) is None  # the usual path only
    assert Hasher().start_exited([b"/a\0b"] * 20, 65_536) is None  # none it could open


def test_files_left_at_exit_are_stated_before_they_are_opened(
        tmp_path: Path, native_batch) -> None:
    # A FIFO is never opened: a reader's open would let a writer blocked in its own open
    # go on (and get EPIPE once we closed it).  The writer here stays blocked.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    opened = threading.Event()

    def writer() -> None:
        fd = os.open(fifo, os.O_WRONLY)  # blocks until a reader opens it
        opened.set()
        os.close(fd)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    with Hasher() as h:  # (16 paths at least: fewer go the usual path)
        assert h.start_exited([str(fifo)] * 20, 1 << 20)() == {}
    assert not opened.wait(0.3)
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # what an open would have done
    assert opened.wait(5)
    t.join(5)


def test_a_file_growing_while_hashed_at_exit_gets_only_digests_of_its_state(
        tmp_path: Path, native_batch) -> None:
    # A writer still at work (a child the command left behind): any digest given is the
    # bytes its state says (the file only grows, by one known byte at a time), never of
    # bytes read while its size moved.
    f = tmp_path / "growing"
    f.write_bytes(b"")
    stop = threading.Event()

    def grow() -> None:
        with open(f, "ab", buffering=0) as out:
            while not stop.is_set() and out.tell() < 60_000:
                out.write(b"x")

    t = threading.Thread(target=grow, daemon=True)
    t.start()
    given = 0
    try:
        with Hasher() as h:
            for _ in range(300):  # (16 paths at least: fewer go the usual path)
                for r in h.start_exited([str(f)] * 16, 1 << 20)().values():
                    assert r.digest == b3(b"x" * r.size) and r.state.size == r.size
                    given += 1
    finally:
        stop.set()
        t.join(5)
    assert given  # (results for the same path: the last of each call)


# ---- digests taken while the task runs (hash_early) -----------------------------------------


@pytest.mark.parametrize("native", [True, False])
def test_an_early_digest_is_kept_only_where_a_later_write_must_change_the_state(
        tmp_path: Path, native: bool) -> None:
    # A task's output hashed while the task runs, then rewritten at once with as many bytes:
    # within one clock tick a kernel that does not refine timestamps gives the rewrite the
    # same ctime, so the digest taken must not come back with a state that rewrite leaves.
    hasher = Hasher(native=native)
    files = [tmp_path / f"f{i}.txt" for i in range(64)]
    kept = 0
    for rnd in range(20):
        for f in files:
            f.write_bytes(b"a%05d" % rnd * 20)
        results = hasher.hash_early([os.fsencode(f) for f in files], 1 << 20)
        for f in files:
            f.write_bytes(b"b%05d" % rnd * 20)
        for r in results:
            assert r.digest == b3(b"a%05d" % rnd * 20)
            assert r.state != FileState.of(os.stat(r.path)), r.path
        kept += len(results)
    refined = os.stat(tmp_path).st_dev in hashing.refined_devices()
    assert kept == (20 * len(files) if refined else 0)  # recent ctimes: trusted only there


def test_without_refined_timestamps_an_early_digest_needs_an_old_ctime(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hashing, "refined_devices", lambda: frozenset())
    hasher = Hasher(racy_window_ns=50_000_000)
    f = tmp_path / "out.txt"
    f.write_bytes(b"left by the task")
    assert hasher.hash_early([str(f)], 1 << 20) == []  # its ctime is within the window
    os.utime(f, ns=(1, 1))  # mtime can be set; ctime only moves on: now, still recent
    assert hasher.hash_early([str(f)], 1 << 20) == []
    import time

    time.sleep(0.08)
    (r,) = hasher.hash_early([str(f)], 1 << 20)
    assert (r.digest, r.size, r.stable) == (b3(b"left by the task"), 16, True)


def test_early_digests_leave_out_big_missing_and_unreadable_files(tmp_path: Path) -> None:
    hasher = Hasher()
    small, big = tmp_path / "small", tmp_path / "big"
    small.write_bytes(b"x" * 10)
    big.write_bytes(b"x" * 2048)
    (tmp_path / "dir").mkdir()
    got = hasher.hash_early([str(small), str(big), str(tmp_path / "gone"),
                             str(tmp_path / "dir")], 1024)
    assert [r.path for r in got] in ([], [str(small)])  # [] where the ctime is not trusted
