"""Recording cost as a store fills with reruns of one step whose content never changes.

    python bench/bench_reruns.py [--runs 2000] [--tmp DIR]

A deterministic pipeline rerun daily writes the same bytes again and again: every version
of its output has one digest.  One real `roar-core run` session (a shell reading in.txt
into a.txt and b.txt) is recorded `--runs` times, each as a new run, through the
recorder's own path (a task log with its begin and end, recorder.drain).  Printed: the
median time to record one run among the first 100 and among the last 100, and their ratio
(1.0: the cost does not grow with the store's history).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from datetime import datetime, timezone  # noqa: E402

from roar_core import config  # noqa: E402
from roar_core.api import Roar  # noqa: E402
from roar_core.recording import recorder  # noqa: E402
from roar_core.recording.sessions import run_traced  # noqa: E402
from roar_core.recording.tasklog import TaskLog  # noqa: E402

WINDOW = 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--tmp", type=Path, default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="roar-reruns-", dir=args.tmp))
    try:
        cfg = config.load(cwd=root, env={"ROAR_HOME": str(root / "home")})
        (root / "in.txt").write_text("the same content, every day\n" * 8)
        argv = ["sh", "-c", "cat in.txt > a.txt; cat in.txt > b.txt"]
        template = root / "template"
        template.mkdir()
        assert run_traced(argv, template, "daily", cwd=root) == 0
        roar = Roar(cfg, send=False)
        times = []
        try:
            for i in range(args.runs):
                d = root / "runs" / str(i)
                shutil.copytree(template, d / "run")
                log = TaskLog(d)
                run_id = f"01900000-0000-7000-8000-{i:012d}"
                log.begun({"run_id": run_id, "engine": "cli", "namespace": cfg.namespace,
                           "job_name": "daily", "command": argv,
                           "started_at": datetime.now(timezone.utc).isoformat()},
                          own_dir="run")
                log.ended(run_id, "COMPLETE", exit_code=0)
                log.close()
                t0 = time.perf_counter()
                recorder.drain(roar, d)
                times.append(time.perf_counter() - t0)
        finally:
            roar.close(timeout=0)
        first = statistics.median(times[:WINDOW]) * 1e3
        last = statistics.median(times[-WINDOW:]) * 1e3
        print(f"runs {args.runs}: record one run, first {WINDOW}: {first:.2f} ms, "
              f"last {WINDOW}: {last:.2f} ms, ratio {last / first:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
