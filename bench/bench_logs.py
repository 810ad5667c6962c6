"""Reading a finished process's trace log, as a recorder reads each job's session (a
Snakemake job's shell and its `cat`: a few small logs each).

    python bench/bench_logs.py [--logs 20] [--rounds 9] [--tmp DIR] [--json OUT]

A real traced session of `--logs` small processes is read whole (`tracelog.read_log` per
log) the way the reader does it now (a log whose records fit in its first 64 KiB is read
with one copy) and the way it did before (every log mapped, then unmapped), interleaved
in each round: quiet, and with another thread of the reader busy on the other core (a
recorder's helper thread writing a big task's rows), where each unmap must also flush that
core's TLB.  Medians of µs per log, and their ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import results  # noqa: E402

from roar_core.pipeline import tracelog, tracer  # noqa: E402

READERS = {"copied (now)": 1 << 16, "mapped (before)": 0}


def session(root: Path, n: int) -> list[str]:
    """The logs of `n` traced `sh -c 'cat ... > ...'` processes."""
    d = root / "session"
    d.mkdir()
    (root / "in.txt").write_text("data\n")
    env = tracer.preload_env(d, tag="bench")
    for i in range(n // 2):
        subprocess.run(["sh", "-c", f"cat in.txt > out{i}.txt"], cwd=root, env=env, check=True)
    return sorted(str(p) for p in d.iterdir())


def per_log(paths: list[str], small: int, repeat: int = 20) -> float:
    tracelog._READ_SMALL = small
    t = time.perf_counter()
    for _ in range(repeat):
        for p in paths:
            tracelog.read_log(p)
    return (time.perf_counter() - t) / (repeat * len(paths)) * 1e6


def _keep_busy(stop: threading.Event) -> None:
    big = b"x" * (1 << 24)
    while not stop.is_set():
        hashlib.sha256(big).digest()  # drops the GIL: only the other core is kept busy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not tracer.status().usable:
        print(f"the tracer is not usable: {tracer.status().reason}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="roar-bench-logs-", dir=args.tmp))
    scenarios = []
    try:
        paths = session(root, args.logs)
        print(f"{len(paths)} logs, {statistics.median(os.path.getsize(p) for p in paths):.0f} "
              f"bytes each (median), {args.rounds} rounds")
        for busy in (False, True):
            stop = threading.Event()
            if busy:
                threading.Thread(target=_keep_busy, args=(stop,), daemon=True).start()
            got: dict[str, list[float]] = {k: [] for k in READERS}
            for r in range(args.rounds):
                order = list(READERS.items())
                for name, small in order[::-1] if r % 2 else order:
                    got[name].append(per_log(paths, small))
            stop.set()
            now, before = (statistics.median(got[k]) for k in READERS)
            where = "another core busy" if busy else "quiet"
            print(f"  {where:18s} copied {now:6.1f} µs per log, mapped {before:6.1f}: "
                  f"{now / before:.2f} of before")
            scenarios.append(results.scenario(
                f"reading a small trace log ({where})", "µs",
                ("mapped (before)", got["mapped (before)"]),
                [("copied (now)", got["copied (now)"])]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results.write(args.json, "logs", "Reading small trace logs", scenarios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
