"""Airflow: a 20-task DAG under LocalExecutor, untraced vs traced (boundary) vs subprocess mode.

One Airflow deployment (temp AIRFLOW_HOME, SQLite, api-server + dag-processor on 127.0.0.1);
the scheduler is started twice: plain, then after `eval "$(roar-core env airflow)"` (tracer
preloaded).  Two DAGs with the same 20 tasks (4 layers of 5; each task reads the files of
its layer's parents and writes one), one with `@task`, one with `@task.roar`:

    untraced    @task DAG,       plain scheduler
    subprocess  @task.roar DAG,  plain scheduler      (callables in traced Python children)
    boundary    @task.roar DAG,  preloaded scheduler  (tasks traced in place)
    ambient     @task DAG,       preloaded scheduler  (the shim's cost with no task tagged)

Reported per mode, over --runs DAG runs each (interleaved per scheduler): DAG run wall time,
mean task-instance duration as Airflow measures it (fork to exit: every cost roar adds to a
task is inside it), its difference to `untraced`, and -- traced modes -- the time roar itself
spent on each task's critical path ("roar took", from the task logs: begin + end including
the wait for the recorder process) and building the OpenLineage lineage for the provider.

The baseline of that time: every task, in every mode, first times a fixed piece of CPU work
with nothing of roar in it (`sum(range(n))`, n sized here, on an idle core, to take
--window-ms), measured as roar's time is, in the task process under the same load.  On 2
CPUs with 4 tasks at a time any short window is sometimes preempted: its p95 is the floor
under the p95 of roar's time.

    python bench/bench_airflow.py [--runs 3] [--json bench/results/airflow.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

BIN = Path(sys.executable).parent
LAYERS, WIDTH = 4, 5
sys.path.insert(0, str(Path(__file__).resolve().parent))

import results as bench_results  # noqa: E402

STEP = """
@{deco}
def {name}(layer: int, i: int, parents: list) -> str:
    import os

    import time

    t0 = time.perf_counter()
    sum(range({window}))  # the baseline's CPU window (see the module's docstring)
    print(f"bench: CPU window took {{1e3 * (time.perf_counter() - t0):.3f}} ms")
    data = os.environ["BENCH_AIRFLOW_DATA"]
    acc = str(layer * 100 + i)
    for p in parents:
        with open(p) as f:
            acc += f.read()[:64]
    out = os.path.join(data, f"l{{layer}}_t{{i}}_{name}.txt")
    with open(out, "w") as f:
        f.write(acc * 16)
    return out
"""

# The decorator must be written out (`@task.roar`): subprocess mode runs the function's
# source, as @task.external_python does.
DAG_HEAD = """
import pendulum
from airflow.sdk import dag, task
"""
DAG_TAIL = """

def build(step, dag_id):
    @dag(dag_id=dag_id, schedule=None, start_date=pendulum.datetime(2024, 1, 1),
         catchup=False, max_active_runs=1)
    def bench():
        prev = []
        for layer in range({layers}):
            prev = [step.override(task_id=f"l{{layer}}_t{{i}}")(layer, i, prev)
                    for i in range({width})]

    return bench()


build(step_untraced, "bench_untraced")
build(step_traced, "bench_traced")
"""


def dag_file(window: int) -> str:
    return (DAG_HEAD + STEP.format(deco="task", name="step_untraced", window=window)
            + STEP.format(deco="task.roar", name="step_traced", window=window)
            + DAG_TAIL.format(layers=LAYERS, width=WIDTH))


def window_size(ms: float) -> int:
    """n for which sum(range(n)) takes `ms` here (the median of a few tries, idle)."""
    n = 100_000
    took = []
    for _ in range(15):
        t0 = time.perf_counter()
        sum(range(n))
        took.append(time.perf_counter() - t0)
    return max(1, round(n * ms / (1e3 * statistics.median(took))))


ROAR_TOOK = re.compile(r"roar: recorded .*?; roar took ([0-9.]+) ms")
# Of it: the task's begin, and its end with the wait for the recorder's answer.
ROAR_SPLIT = re.compile(
    r"roar: recorded .*?; roar took [0-9.]+ ms \(begin ([0-9.]+), end ([0-9.]+)\)")
REPORTED = re.compile(r"roar: reported .*? to OpenLineage in ([0-9.]+) ms")
WINDOW = re.compile(r"bench: CPU window took ([0-9.]+) ms")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Deployment:
    def __init__(self, root: Path, window: int):
        self.root = root
        self.home = root / "airflow"
        self.data = root / "data"
        self.data.mkdir(parents=True)
        (root / "dags").mkdir()
        (root / "dags" / "bench_dag.py").write_text(dag_file(window))
        self.port = _free_port()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AIRFLOW", "OPENLINEAGE", "ROAR_")) and k != "LD_PRELOAD"}
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL":
                f"http://127.0.0.1:{self.port}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": os.urandom(16).hex(),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "roar-bench",
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(root / "ol-events.jsonl"),
                 "append": True}),
            "ROAR_HOME": str(root / "roar"),
            "BENCH_AIRFLOW_DATA": str(self.data),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        })
        self.env = env
        self.procs: dict[str, subprocess.Popen] = {}
        self.sessions: list[Path] = []  # in-memory worker sessions made by preloaded_env

    def airflow(self, *args: str, env: dict | None = None) -> str:
        out = subprocess.run([str(BIN / "airflow"), *args], env=env or self.env, cwd=self.root,
                             capture_output=True, text=True, timeout=600)
        if out.returncode:
            raise RuntimeError(f"airflow {' '.join(args)}: {out.stderr[-2000:]}")
        return out.stdout

    def start(self, name: str, args: list[str], env: dict) -> None:
        with open(self.root / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [str(BIN / "airflow"), *args], env=env, cwd=self.root, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, name: str) -> None:
        p = self.procs.pop(name)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def wait(self, what: str, check, timeout: float = 300):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited; see {self.root / (name + '.log')}")
            if (value := check()):
                return value
            time.sleep(0.5)
        raise RuntimeError(f"timed out waiting for {what}")

    def db(self):
        return sqlite3.connect(self.home / "airflow.db", timeout=30)

    def preloaded_env(self) -> dict:
        py = f"{sys.executable} -c 'import roar_airflow; print(roar_airflow.shell_exports())'"
        out = subprocess.run(["bash", "-c", f'eval "$({py})" && env -0'], env=self.env,
                             capture_output=True, check=True, cwd=self.root)
        env = dict(i.split("=", 1) for i in out.stdout.decode().split("\0") if "=" in i)
        if "ROAR_SESSION_DIR" in env:  # in memory (/dev/shm): removed when the bench ends
            self.sessions.append(Path(env["ROAR_SESSION_DIR"]))
        return env

    def run_dag(self, dag_id: str) -> dict:
        out = self.airflow("dags", "trigger", dag_id, "-o", "json")
        line = [ln for ln in out.splitlines() if ln.startswith("[{")][-1]
        run_id = json.loads(line)[0]["dag_run_id"]

        def done():
            with self.db() as con:
                row = con.execute("select state, start_date, end_date from dag_run "
                                  "where dag_id=? and run_id=?", (dag_id, run_id)).fetchone()
            return row if row and row[0] in ("success", "failed") else None

        state, start, end = self.wait(f"{dag_id} {run_id}", done, timeout=900)
        if state != "success":
            raise RuntimeError(f"{dag_id} run {run_id} {state}; see {self.home / 'logs'}")
        with self.db() as con:
            durations = [r[0] for r in con.execute(
                "select duration from task_instance where dag_id=? and run_id=?",
                (dag_id, run_id))]
        logs = "".join(p.read_text() for p in
                       (self.home / "logs" / f"dag_id={dag_id}").glob(
                           f"run_id={run_id}/**/*.log"))
        wall = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
        return {"dag_id": dag_id, "run_id": run_id, "wall_s": wall,
                "task_s": durations,
                "roar_ms": [float(x) for x in ROAR_TOOK.findall(logs)],
                "roar_split_ms": [(float(b), float(e)) for b, e in ROAR_SPLIT.findall(logs)],
                "report_ms": [float(x) for x in REPORTED.findall(logs)],
                "window_ms": [float(x) for x in WINDOW.findall(logs)]}


def _stats(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    values = sorted(values)
    return statistics.median(values), values[min(len(values) - 1, int(0.95 * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="DAG runs per mode")
    ap.add_argument("--subprocess-runs", type=int, default=1,
                    help="DAG runs in subprocess mode (slow: a Python process per task)")
    ap.add_argument("--json", help="also write the raw numbers here (for bench/report)")
    ap.add_argument("--keep", action="store_true", help="keep the temp deployment")
    ap.add_argument("--window-ms", type=float, default=1.5,
                    help="the baseline's CPU window (about roar's median time on the path)")
    args = ap.parse_args()

    load0 = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="roar-bench-airflow-"))
    window = window_size(args.window_ms)
    dep = Deployment(root, window)
    results: dict[str, list[dict]] = {m: [] for m in
                                      ("untraced", "subprocess", "boundary", "ambient")}
    try:
        dep.airflow("db", "migrate")
        dep.start("api-server", ["api-server"], dep.env)
        dep.start("dag-processor", ["dag-processor"], dep.env)

        def api_up():
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{dep.port}/api/v2/monitor/health", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        dep.wait("api-server", api_up)

        def parsed():
            with dep.db() as con:
                return con.execute("select count(*) from dag where dag_id like 'bench_%'"
                                   ).fetchone()[0] == 2

        dep.wait("DAG parsing", parsed)
        for dag_id in ("bench_untraced", "bench_traced"):
            dep.airflow("dags", "unpause", dag_id)

        plan = [("plain", dep.env, [("untraced", "bench_untraced"),
                                    ("subprocess", "bench_traced")]),
                ("preloaded", dep.preloaded_env(), [("boundary", "bench_traced"),
                                                    ("ambient", "bench_untraced")])]
        for label, env, modes in plan:
            dep.start("scheduler", ["scheduler"], env)
            # One warm-up run per DAG (first parse, recorder service start), not counted.
            for _, dag_id in modes:
                dep.run_dag(dag_id)
            for i in range(args.runs):
                for mode, dag_id in modes:
                    if mode == "subprocess" and i >= args.subprocess_runs:
                        continue
                    r = dep.run_dag(dag_id)
                    results[mode].append(r)
                    print(f"  {label:9} {mode:10} run {i + 1}: wall {r['wall_s']:.1f} s, "
                          f"task mean {1e3 * statistics.mean(r['task_s']):.0f} ms",
                          file=sys.stderr, flush=True)
            dep.stop("scheduler")
    finally:
        for name in list(dep.procs):
            dep.stop(name)
        # The recorder service leaves with its session.
        for session in [*dep.sessions, root / "roar" / "sessions"]:
            shutil.rmtree(session, ignore_errors=True)
        if not args.keep:
            time.sleep(6)
            shutil.rmtree(root, ignore_errors=True)

    base = statistics.mean(t for r in results["untraced"] for t in r["task_s"])
    rows = []
    from airflow import __version__ as airflow_version

    print(f"\nAirflow {airflow_version} LocalExecutor, {LAYERS * WIDTH}-task DAG "
          f"(parallelism 4), {args.runs} runs per mode ({args.subprocess_runs} in subprocess "
          f"mode), {os.cpu_count()} CPUs, load average {load0:.1f} at start, "
          f"{os.getloadavg()[0]:.1f} at end\n")
    head = ("| mode | DAG runs | DAG wall (median) | task duration (mean) | vs untraced per task "
            "| roar on task path (median / p95) | lineage for provider (median) |")
    print(head)
    print("|" + "---|" * 7)
    for mode, runs in results.items():
        tasks = [t for r in runs for t in r["task_s"]]
        if not tasks:  # a mode not run (--subprocess-runs 0)
            continue
        mean = statistics.mean(tasks)
        roar_med, roar_p95 = _stats([x for r in runs for x in r["roar_ms"]])
        rep_med, _ = _stats([x for r in runs for x in r["report_ms"]])
        roar_col = "-" if roar_med != roar_med else f"{roar_med:.1f} / {roar_p95:.1f} ms"
        rep_col = "-" if rep_med != rep_med else f"{rep_med:.1f} ms"
        wall = statistics.median(r["wall_s"] for r in runs)
        delta = "-" if mode == "untraced" else f"{1e3 * (mean - base):+.0f} ms"
        print(f"| {mode} | {len(runs)} | {wall:.1f} s | {1e3 * mean:.0f} ms | {delta} "
              f"| {roar_col} | {rep_col} |")
        rows.append({"mode": mode, "runs": runs})
    for row in rows:  # where roar's time on the task path goes
        split = [x for r in row["runs"] for x in r.get("roar_split_ms", [])]
        if split:
            b_med, b_p95 = _stats([b for b, _ in split])
            e_med, e_p95 = _stats([e for _, e in split])
            print(f"  {row['mode']}: roar on task path, median / p95: begin {b_med:.1f} / "
                  f"{b_p95:.1f} ms, end (with the wait for the recorder's answer) "
                  f"{e_med:.1f} / {e_p95:.1f} ms")
    for row in rows:  # the baseline: a CPU window with nothing of roar in it
        w_med, w_p95 = _stats([x for r in row["runs"] for x in r.get("window_ms", [])])
        if w_med == w_med:
            print(f"  {row['mode']}: a {args.window_ms:.1f} ms CPU window in each task "
                  f"(no roar in it), median / p95: {w_med:.1f} / {w_p95:.1f} ms")

    def ms(mode: str, key: str) -> list[float]:
        scale = 1e3 if key == "task_s" else 1.0
        return [scale * x for r in results_by.get(mode, []) for x in r[key]]

    results_by = {row["mode"]: row["runs"] for row in rows}
    labels = {"subprocess": "@task.roar, plain scheduler (traced subprocess)",
              "boundary": "@task.roar, roar-core exec scheduler (boundary)",
              "ambient": "@task, roar-core exec scheduler (ambient)"}
    bench_results.write(args.json, "airflow", f"Airflow {airflow_version}", [
        bench_results.scenario(f"Airflow LocalExecutor, {LAYERS * WIDTH}-task DAG: task duration",
                         "ms", ("@task, plain scheduler", ms("untraced", "task_s")),
                         [(labels[m], ms(m, "task_s")) for m in labels]),
        bench_results.scenario("Airflow: roar's own time on the task path", "ms", None,
                         [(f"for comparison: a {args.window_ms:.1f} ms CPU window with no "
                           "roar in it, @task, plain scheduler", ms("untraced", "window_ms")),
                          *[(labels[m], ms(m, "roar_ms")) for m in labels]],
                         "measured inside each task process (the CPU window: a fixed piece "
                         "of work, timed the same way under the same load)"),
    ])


if __name__ == "__main__":
    main()
