"""What capturing a run's machine and Python environment costs (roar_core.pipeline.provenance).

    python bench/bench_provenance.py [--tasks 20000]

First: the one-time capture in a fresh process (machine facts from /proc and /sys,
nvidia-smi where there is one, the installed distributions and their digest).  Then per
task: the two cached facts and their facets, as `writer._task_run` and `writer.lineage_of`
take them for every task, against the same calls with the facts left out.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FIRST = """
import time
from roar_core.pipeline import emission, provenance
t = time.perf_counter()
provenance.machine(); provenance.environment(); emission.provenance_facets()
print((time.perf_counter() - t) * 1e3)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=20000)
    args = ap.parse_args()
    firsts = sorted(float(subprocess.run([sys.executable, "-c", FIRST], capture_output=True,
                                         text=True, check=True).stdout) for _ in range(5))
    print(f"first capture in a process (imports done): {firsts[2]:.1f} ms (median of 5; "
          "a recorder forked by the fork server inherits it)")

    from roar_core.pipeline import emission, provenance

    provenance.machine(), provenance.environment(), emission.provenance_facets()
    run_facets = {"roar_snakemake": {"rule": "x"}}

    def with_facts() -> None:
        m, e = provenance.machine(), provenance.environment()
        {"machine": m.digest, "environment": e.digest}  # noqa: B018 - what _task_run builds
        {**emission.provenance_facets(), **run_facets}  # noqa: B018 - what lineage_of builds

    def without() -> None:
        {**run_facets}  # noqa: B018

    best = {}
    for name, fn in (("with", with_facts), ("without", without)):
        times = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(args.tasks):
                fn()
            times.append((time.perf_counter() - t) / args.tasks)
        best[name] = min(times)
    print(f"per task after the first: {(best['with'] - best['without']) * 1e6:.2f} us "
          f"({args.tasks} tasks, best of 5)")


if __name__ == "__main__":
    main()
