"""Hashing throughput: roar's Hasher against the blake3 package's own best single call.

    python bench/bench_hashing.py [--dir /tmp] [--size-mib 1024] [--repeat 5] [--files 5000]

Big file: a --size-mib file is written, read once so it sits in the page cache, then hashed
--repeat times by (a) ``blake3(max_threads=AUTO).update_mmap`` and (b) ``Hasher().hash_file``
(no cache); medians are compared. Small files: --files files of 4 KiB hashed by
``hash_files`` with a cold stat cache (all read and hashed) and a warm one (stat + lookup only).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from blake3 import blake3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from roar_core.pipeline.hashing import Hasher, StatCache  # noqa: E402


def seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def write_random(path: Path, size: int) -> None:
    block = os.urandom(16 * 1024 * 1024)
    with open(path, "wb") as f:
        for offset in range(0, size, len(block)):
            f.write(block[: size - offset])
    with open(path, "rb") as f:  # warm the page cache
        while f.read(64 * 1024 * 1024):
            pass


def bench_big(root: Path, size: int, repeat: int) -> None:
    path = root / "big.bin"
    write_random(path, size)
    reference = blake3(max_threads=blake3.AUTO).update_mmap(str(path)).hexdigest()
    hasher = Hasher(racy_window_ns=0)
    if hasher.hash_file(str(path)).digest != reference:
        sys.exit("digest mismatch")
    # Interleaved rounds, so load from other processes hits both sides alike.
    base: list[float] = []
    ours: list[float] = []
    for _ in range(repeat):
        base.append(seconds(lambda: blake3(max_threads=blake3.AUTO).update_mmap(str(path))))
        ours.append(seconds(lambda: hasher.hash_file(str(path))))
    gb = size / 1e9
    b, o = statistics.median(base), statistics.median(ours)
    print(f"big file {size / 2**30:.2f} GiB, median of {repeat}:")
    print(f"  blake3 update_mmap(AUTO)   {gb / b:6.2f} GB/s")
    print(f"  Hasher.hash_file           {gb / o:6.2f} GB/s   ratio {b / o:.1%}")
    path.unlink()


def bench_small(root: Path, count: int, repeat: int) -> None:
    tree = root / "small"
    tree.mkdir()
    paths = []
    for i in range(count):
        p = tree / f"f{i:05d}"
        p.write_bytes(os.urandom(4096))
        paths.append(str(p))
    time.sleep(0.2)  # let every file age past the racy window, or none would be cached
    cold: list[float] = []
    for i in range(repeat):
        with StatCache(root / f"cache{i}.sqlite") as cache, Hasher(cache) as hasher:
            cold.append(seconds(lambda: hasher.hash_files(paths)))
    with StatCache(root / "cache0.sqlite") as cache, Hasher(cache) as hasher:
        warm = statistics.median(seconds(lambda: hasher.hash_files(paths)) for _ in range(repeat))
        results = hasher.hash_files(paths)
    if len(results) != count or not all(r.cached for r in results.values()):
        sys.exit("warm run was not served by the stat cache")
    print(f"{count} files of 4 KiB, hash_files, median of {repeat}:")
    print(f"  cold stat cache  {statistics.median(cold) / count * 1e6:7.1f} µs/file")
    print(f"  warm stat cache  {warm / count * 1e6:7.1f} µs/file")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where to create test files")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--files", type=int, default=5000)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="roar-bench-hash-", dir=args.dir))
    try:
        print(f"cores usable: {len(os.sched_getaffinity(0))}, load avg: {os.getloadavg()[0]:.2f}")
        bench_big(root, args.size_mib * 2**20, args.repeat)
        bench_small(root, args.files, args.repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
