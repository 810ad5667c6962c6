"""The answer of a `run --wait` that comes right after a big one's, against the same run alone.

    python bench/bench_answer.py [--reps 7] [--files 5000] [--tmp DIR]

The big run (`workload files N`, answered once stored) leaves its events to be delivered:
a 5,000-file task's COMPLETE is a multi-megabyte event, which the OpenLineage client's
serializer takes a good part of a second to write (a file transport here, in the home).  A
small `run --wait -- cp` started at once must not wait for that delivery, nor for a backend
slow to answer.  Timed: the small run's wall time, right after the big run returned
("after a big run") and alone, the big run's events delivered first ("alone"); the runs
alternate, each pair in a fresh home, and every figure is a median.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_core import ROAR_CORE, timed, wait_delivered  # noqa: E402
from bench_tracer import build_workload, clean_env  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--files", type=int, default=5000, help="files the big run writes")
    ap.add_argument("--tmp", default=None, help="where homes and data go (default: a temp dir)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-answer-", dir=args.tmp))
    workload = build_workload("c", root)
    base = {k: v for k, v in clean_env().items() if not k.startswith("OPENLINEAGE")}
    res: dict[str, list[float]] = {"alone": [], "after a big run": [], "big run": []}
    try:
        for rep in range(args.reps):
            for after in (rep % 2 == 0, rep % 2 == 1):
                d = root / f"r{rep}-{int(after)}"
                d.mkdir()
                (d / "openlineage.yml").write_text(
                    f"transport:\n  type: file\n  log_file_path: {d / 'events.jsonl'}\n"
                    "  append: true\n")
                (d / "in.txt").write_text("small\n")
                env = dict(base, ROAR_HOME=str(d / ".roar"))
                big = [ROAR_CORE, "run", "--wait", "--", *workload, "files",
                       str(args.files), str(d / "data")]
                res["big run"].append(timed(big, env, d, args.files))
                if not after:
                    wait_delivered(d / ".roar")
                small = [ROAR_CORE, "run", "--wait", "--", "cp", "in.txt", "out.txt"]
                res["after a big run" if after else "alone"].append(timed(small, env, d))
                wait_delivered(d / ".roar")
                shutil.rmtree(d, ignore_errors=True)
            print(f"  rep {rep + 1}/{args.reps} done", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: 1e3 * statistics.median(v) for k, v in res.items()}
    print(f"big run ({args.files} files, run --wait): {med['big run']:.0f} ms")
    print(f"small run --wait alone:           {med['alone']:.0f} ms "
          f"(range {1e3 * min(res['alone']):.0f}-{1e3 * max(res['alone']):.0f})")
    print(f"small run --wait after a big run: {med['after a big run']:.0f} ms "
          f"(range {1e3 * min(res['after a big run']):.0f}-"
          f"{1e3 * max(res['after a big run']):.0f})")
    print(f"  -> waits {med['after a big run'] - med['alone']:+.0f} ms for the big run's "
          f"events ({args.reps} reps)")
    return 0


if __name__ == "__main__":
    t0 = time.monotonic()
    rc = main()
    print(f"({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    sys.exit(rc)
