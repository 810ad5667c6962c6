"""Reading the spool back: one task's event of thousands of files is one record of megabytes.

    python bench/bench_spool.py [--files 500,5000,20000] [--reps 5] [--tmp DIR]

For each size, a COMPLETE event with that many output files (as the recorder builds it) is
spooled three times by the spool's own writer, and its segment read back as the sender reads
it (`Segment.records`); the baseline, in the same run, reads the same file with one `read`
and splits its lines (the least any reader of these bytes does).  Prints ms per MB for both
(best of --reps) and their ratio: a reader linear in the record's size keeps the ratio flat
as the records grow.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from roar_core.pipeline import emission  # noqa: E402
from roar_core.pipeline.spool import encode  # noqa: E402
from roar_core.pipeline.spoolfiles import Segment, SegmentWriter, segment_paths  # noqa: E402


def big_event(files: int) -> bytes:
    outputs = [emission.Dataset("file", f"/data/run/out/f{i:06d}.parquet", digest=f"{i:064x}",
                                size=4096 + i, lifecycle="CREATE") for i in range(files)]
    task = emission.TaskLineage(namespace="bench", job_name="big", run_id=emission.new_run_id(),
                                outputs=outputs)
    return encode(emission.complete_event(task))


def best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def spooled(segment: Segment) -> None:
    assert sum(1 for r in segment.records() if r.problem is None) == 3


def one_read(path: Path) -> None:
    assert len(path.read_bytes().split(b"\n")) == 4


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", default="500,5000,20000")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tmp", default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="roar-bench-spool-", dir=args.tmp))
    print(f"{'files':>7} {'record MB':>10} {'spool ms/MB':>12} {'one read ms/MB':>15} {'ratio':>6}")
    try:
        for files in (int(n) for n in args.files.split(",")):
            directory = root / str(files)
            directory.mkdir()
            event = big_event(files)
            writer = SegmentWriter(directory, segment_bytes=1 << 40, fsync=False)
            for _ in range(3):
                writer.write(event)
            writer.seal()
            (path,) = segment_paths(directory)
            size = path.stat().st_size
            segment = Segment(path, sealed=True, size=size, acked=0)

            mb = size / 1e6
            s = best(lambda seg=segment: spooled(seg), args.reps)
            b = best(lambda p=path: one_read(p), args.reps)
            print(f"{files:>7} {len(event) / 1e6:>10.2f} {1e3 * s / mb:>12.2f} "
                  f"{1e3 * b / mb:>15.2f} {s / b:>6.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
