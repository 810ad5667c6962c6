"""Airflow's task path in freshly forked task processes: pages copied and time taken by
roar's begin, end and answer, from a worker warmed up with and without the rehearsal.

    python bench/bench_airflow_fork.py [--tasks 40]

Airflow forks every task process from a long-lived worker.  The pages of memory a task
process writes first (a refcount, a code object CPython quickens, a new object in a shared
pool) are copied then, one page fault each: in roar's ~1 ms on a task's path these copies
are most of the time.  Two workers, each with Airflow and roar imported, the tracer
preloaded and its own session and recorder, as `eval "$(roar-core env airflow)"` starts a
scheduler; the plugin's warm-up (settings, imports) in both, and its rehearsal of a task's
begin and end (roar_airflow.hooks.roar.rehearse) in one.  Each forks --tasks task
processes in turn, which do what RoarOperatorMixin does and times: take the process's
hook and the mode and mark a made-up task's begin; write a file; end it as a traced task
does (its left states); wait for the recorder's answer and take it as roar's listener
does.  Page copies (minor faults) and ms, median per step; the worker's first task, which
starts the recorder, left out.  The same process runs both workers, one after
the other: compare within a run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STEPS = ("begin", "end", "answer")


def worker(rehearse: bool, tasks: int, data: str) -> None:
    """Run in the worker process: warm up, then fork `tasks` task processes."""
    import resource
    import select
    import time
    from datetime import datetime, timezone
    from types import SimpleNamespace

    import roar_airflow.hooks.roar as hooks

    if not rehearse:
        hooks.rehearse = lambda times=0: None
    # The plugins, as a scheduler loads them: the OpenLineage provider's listener, and
    # roar's with its warm-up (with or without its rehearsal of a task's begin and end).
    from airflow.plugins_manager import ensure_plugins_loaded

    ensure_plugins_loaded()
    from roar_airflow.plugins.roar import WARM

    assert WARM, "the tracer is not preloaded"

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    out = sys.stdout.fileno()
    for i in range(tasks):
        pid = os.fork()
        if pid:
            os.waitpid(pid, 0)
            continue
        try:
            ti = SimpleNamespace(dag_id="bench", task_id=f"t{i}", try_number=1, map_index=-1,
                                 id=f"bench-{i}")
            dag_run = SimpleNamespace(logical_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
                                      run_after=None, clear_number=0)
            context = {"ti": ti, "dag_run": dag_run, "params": {}}
            row = {}
            # What RoarOperatorMixin does and times: the process's hook, the mode, the
            # begin; the end (the provider emits: no wait); the listener's take.
            f0, t0 = faults(), time.perf_counter()
            hook = hooks.shared_hook()
            mode, _ = hook.mode()
            run = hook.begin(context, mode)
            row["begin"] = (faults() - f0, 1e3 * (time.perf_counter() - t0))
            with open(os.path.join(data, f"out-{os.getpid()}.txt"), "w") as f:
                f.write("x" * 100)
            f0, t0 = faults(), time.perf_counter()
            hook.end(run, "COMPLETE", wait=not hooks.provider_emits())
            row["end"] = (faults() - f0, 1e3 * (time.perf_counter() - t0))
            select.select([run.answer_fd], [], [], 30)  # (Airflow's own end of the task)
            f0, t0 = faults(), time.perf_counter()
            taken = hook.take_answer(run)
            row["answer"] = (faults() - f0, 1e3 * (time.perf_counter() - t0))
            row["ok"] = taken and run.result is not None and run.result.ok
            os.write(out, (json.dumps(row) + "\n").encode())
        finally:
            os._exit(0)


def measure(rehearse: bool, tasks: int, root: Path) -> list[dict]:
    work = root / ("rehearsed" if rehearse else "plain")
    (work / "data").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "OPENLINEAGE", "ROAR_")) and k != "LD_PRELOAD"}
    env.update(AIRFLOW_HOME=str(work / "airflow"), ROAR_HOME=str(work / "roar"),
               AIRFLOW__CORE__LOAD_EXAMPLES="False",
               # The provider sends the task events (as in bench_airflow): its listener,
               # loaded with the plugins, is in the worker too.
               AIRFLOW__OPENLINEAGE__NAMESPACE="roar-bench",
               AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(
                   {"type": "file", "log_file_path": str(work / "events.jsonl"),
                    "append": True}))
    exports = subprocess.run(
        [sys.executable, "-c", "import roar_airflow; print(roar_airflow.shell_exports())"],
        env=env, capture_output=True, text=True, check=True, cwd=work).stdout
    shell = f'{exports}\nexec "$@"'
    proc = subprocess.run(
        ["bash", "-c", shell, "bench", sys.executable, __file__, "--worker",
         "--tasks", str(tasks + 1), "--data", str(work / "data")]
        + (["--rehearse"] if rehearse else []),
        env=env, capture_output=True, text=True, cwd=work, timeout=600)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if len(rows) != tasks + 1:
        raise SystemExit(f"the worker failed:\n{proc.stderr[-3000:]}")
    return rows[1:]  # the first one started the recorder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rehearse", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.rehearse, args.tasks, args.data)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-airflow-fork-") as tmp:
        res = {r: measure(r, args.tasks, Path(tmp)) for r in (False, True)}
        for d in Path(tmp).glob("*/roar/sessions/airflow-*"):  # its recorder then exits
            shutil.rmtree(d, ignore_errors=True)
    print(f"\n{args.tasks} task processes forked from each worker; median per task\n")
    print("| step | pages copied, no rehearsal | rehearsed | ms, no rehearsal | rehearsed |")
    print("|---|---|---|---|---|")
    total = {r: ([0.0] * args.tasks, [0.0] * args.tasks) for r in res}
    for step in STEPS:
        cells = []
        for r in (False, True):
            pages = [row[step][0] for row in res[r]]
            ms = [row[step][1] for row in res[r]]
            for i in range(args.tasks):
                total[r][0][i] += pages[i]
                total[r][1][i] += ms[i]
            cells.append((statistics.median(pages), statistics.median(ms)))
        print(f"| {step} | {cells[0][0]:.0f} | {cells[1][0]:.0f} | {cells[0][1]:.3f} "
              f"| {cells[1][1]:.3f} |")
    p = [statistics.median(total[r][0]) for r in (False, True)]
    m = [statistics.median(total[r][1]) for r in (False, True)]
    print(f"| all three | {p[0]:.0f} | {p[1]:.0f} | {m[0]:.3f} | {m[1]:.3f} |")
    print(f"\nrehearsed / not: pages {p[1] / p[0]:.2f}, time {m[1] / m[0]:.2f}")
    bad = sum(not row["ok"] for r in res for row in res[r])
    if bad:
        print(f"{bad} tasks got no lineage", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
