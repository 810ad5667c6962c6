"""Ray: what tracing every task costs, against untraced tasks and per-command tracing.

    python bench/bench_ray.py [--tasks 1000] [--trivial 2000] [--rounds 2]
                              [--wrapped 1000] [--roar-cli-tasks N]
                              [--roar-cli-venv VENV | env ROAR_CLI_VENV=VENV] [--no-peer]

One 2-node `ray.cluster_utils.Cluster` (2 CPUs per node, no dashboard) started with the roar
plugin registered; every variant is a Ray job of its own on that cluster (the in-process
ones one per workload, so that each workload's lineage drain is its own), in this run:

  untraced            the tasks, no `"roar"` in the runtime_env
  traced              the same tasks, `runtime_env={"roar": {...}}`: the tracer attached to
                      each worker for its lifetime, each task a run (wall until the results,
                      then `roar_ray.finish()`: until every run is in the store and spooled)
  subprocess          (untraced job) each task runs the work as a command: the cost of a
                      process per task, without any tracing, for reference
  roar-core run       each task runs the command under `roar-core run`
  roar run            each task runs it under roar-cli's `roar run --tracer preload`

Workloads: `io10` = ~10 ms per task (write a 64 KiB file, then wait the rest of 10 ms, as a
task waiting on I/O or a service would; the machine's CPUs are not the bottleneck), and
`trivial` = a task that returns None.  The command of the wrapped variants is
`sh -c 'head -c 65536 /dev/zero > OUT; sleep 0.01'`.  Workers are warmed up before timing
(worker start-up, including roar's per-worker set-up, and the start of each node's
recorder, waited for with `roar_ray.flush()`, are reported apart).  Each round runs
untraced and traced alternately; the table shows the median over rounds.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import ray  # noqa: E402
import results  # noqa: E402
import roar_ray  # noqa: E402

CPUS_PER_NODE = 2
PAYLOAD = bytes(range(256)) * 256  # 64 KiB
SH_WORK = "head -c 65536 /dev/zero > \"$1\"; sleep 0.01"
LIMIT_RATIO = 1.10
LIMIT_ADDED_MS = 2.0


@ray.remote
def io10(path: str) -> None:
    end = time.perf_counter() + 0.010
    with open(path, "wb") as f:
        f.write(PAYLOAD)
    left = end - time.perf_counter()
    if left > 0:
        time.sleep(left)


@ray.remote
def trivial() -> None:
    return None


def _run_wrapped(argv: list[str], out: str, cwd: str, env: dict[str, str]) -> int:
    full = dict(os.environ)
    for k in ("LD_PRELOAD", "ROAR_SESSION_DIR", "ROAR_TASK_TAG"):
        full.pop(k, None)
    full.update(env)
    return subprocess.run([*argv, "sh", "-c", SH_WORK, "sh", out], cwd=cwd, env=full,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


@ray.remote
def wrapped(argv: list[str], out: str, cwd: str, env: dict[str, str]) -> int:
    return _run_wrapped(argv, out, cwd, env)


@ray.remote
def wrapped_in_project(argv: list[str], out: str, base: str, env: dict[str, str],
                       venv: str) -> int:
    """In this worker's own roar-cli project (made up front by roar_cli_init; a worker
    those calls did not reach makes its own at its first task: 988 of 1,000 tasks once
    failed for want of one)."""
    return _run_wrapped(argv, out, _roar_cli_project(venv, base), env)


@ray.remote
def roar_cli_init(venv: str, base: str) -> str:
    return _roar_cli_project(venv, base)


def _roar_cli_project(venv: str, base: str) -> str:
    """A roar-cli project per worker process (one SQLite per project, no lock contention)."""
    d = Path(base) / f"w{os.getpid()}"
    if not (d / ".roar").exists():
        d.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, DO_NOT_TRACK="1")
        roar = str(Path(venv) / "bin" / "roar")
        subprocess.run([roar, "init", "--no-gitignore"], cwd=d, env=env, check=True,
                       capture_output=True)
        subprocess.run([roar, "config", "set", "filters.ignore_tmp_files", "false"], cwd=d,
                       env=env, check=True, capture_output=True)
    return str(d)


def _warm(n: int = 40) -> float:
    t0 = time.perf_counter()
    ray.get([trivial.remote() for _ in range(n)])
    ray.get([io10.remote(os.devnull) for _ in range(n)])
    return time.perf_counter() - t0


def _timed(refs_fn) -> float:
    t0 = time.perf_counter()
    ray.get(refs_fn())
    return time.perf_counter() - t0


class Bench:
    def __init__(self, args, root: Path, address: str):
        self.args, self.root, self.address = args, root, address
        self.results: dict[str, list[float]] = {}
        self.failed: set[str] = set()  # variants whose commands failed: no figure
        self.notes: list[str] = []
        self.count = 0
        self.jobs = 0

    def add(self, key: str, seconds: float) -> None:
        self.results.setdefault(key, []).append(seconds)

    def job(self, runtime_env: dict | None = None) -> None:
        ray.init(address=self.address, runtime_env=runtime_env, log_to_driver=False)

    def data_dir(self) -> Path:
        self.count += 1
        d = self.root / f"data{self.count}"
        d.mkdir()
        return d

    def in_process(self, traced: bool) -> None:
        """Each workload a job of its own, traced or not, its lineage drained apart: the
        io10 drain is io10's lineage alone, not the trivial tasks' run after it."""
        a = self.args
        for workload, count in (("io10", a.tasks), ("trivial", a.trivial)):
            self._job_of(traced, workload, count)

    def _job_of(self, traced: bool, workload: str, count: int) -> None:
        self.jobs += 1
        home = self.root / f"home{self.jobs}"  # each job's lineage alone
        label = "traced" if traced else "untraced"
        self.job({"roar": {"home": str(home), "job_name": "bench"}} if traced else None)
        try:
            t0 = time.perf_counter()
            _warm()
            if traced:
                # Each node's recorder starts with the job's first task there (~1 s of
                # imports and set-up): per-node set-up, timed apart like the workers'.
                roar_ray.flush(timeout=600)
            self.add(f"{label} {workload} warm-up", time.perf_counter() - t0)
            if workload == "io10":
                d = self.data_dir()
                wall = _timed(lambda: [io10.remote(str(d / f"o{i}.bin")) for i in range(count)])
            else:
                wall = _timed(lambda: [trivial.remote() for _ in range(count)])
            self.add(f"{label} {workload}", wall)
            if traced:
                # Two phases: every run in the store with its events spooled (flush), then
                # the job's end with the spool delivered (finish).
                t0 = time.perf_counter()
                roar_ray.flush(timeout=600)
                self.add(f"traced {workload} lineage recorded", time.perf_counter() - t0)
                roar_ray.finish(timeout=600)
                self.add(f"traced {workload} lineage drain", time.perf_counter() - t0)
                self._check_traced(home, workload, count)
        finally:
            ray.shutdown()

    def _check_traced(self, home: Path, workload: str, count: int) -> None:
        from roar_core.pipeline.store import Store

        store = Store.open(home=home)
        runs = store.task_runs(None, limit=10_000_000)
        done = [r for r in runs if r.job_name == f"bench.{workload}"]
        ok = [r for r in done if r.status == "COMPLETE" and r.traced]
        note = f"traced {workload} job: {len(runs)} runs recorded ({len(ok)} COMPLETE+traced"
        if workload == "io10":
            outs = sum(1 for r in ok[:50] for x in store.accesses_of(r.run_id)
                       if x.role == "output" and x.uri.endswith(".bin"))
            note += f"; {outs}/50 sampled with their output"
        self.notes.append(note + ")")
        store.close()
        want = count + 80  # and the warm-up's
        if len(runs) != want:
            self.notes.append(f"WARNING: expected {want} runs, found {len(runs)}")

    def wrapped(self, kind: str, n: int, peer: Path | None = None) -> None:
        self.job()
        try:
            d = self.data_dir()
            env: dict[str, str] = {"DO_NOT_TRACK": "1"}
            cwd = str(d)
            if kind == "roar-core run":
                home = self.root / "cli-home"
                env["ROAR_HOME"] = str(home)
                argv = [str(Path(sys.executable).parent / "roar-core"), "run", "--"]
            elif kind == "roar run":
                assert peer
                argv = [str(peer / "bin" / "roar"), "run", "-q", "--tracer", "preload",
                        "--no-tracer-fallback"]
            else:
                argv = []
            ray.get([wrapped.remote(["true"], os.devnull, cwd, env)
                     for _ in range(4 * CPUS_PER_NODE)])
            if kind == "roar run":
                # Tasks land on any worker: give every worker its own project up front.
                base = str(self.root / "roarcli")
                dirs = set(ray.get([roar_cli_init.remote(str(peer), base) for _ in range(64)]))
                self.notes.append(f"roar run: {len(dirs)} roar-cli projects (one per worker)")
                refs_fn = lambda: [wrapped_in_project.remote(  # noqa: E731
                    argv, str(d / f"o{i}.bin"), base, env, str(peer)) for i in range(n)]
            else:
                refs_fn = lambda: [wrapped.remote(argv, str(d / f"o{i}.bin"), cwd, env)  # noqa: E731
                                   for i in range(n)]
            t0 = time.perf_counter()
            rcs = ray.get(refs_fn())
            wall = time.perf_counter() - t0
            if any(rcs):
                self.notes.append(f"WARNING: {kind}: {sum(1 for r in rcs if r)} commands failed")
                self.failed.add(kind)
            self.add(f"{kind} io10", wall)
            self.results.setdefault(f"{kind} n", []).append(n)
            if kind == "roar-core run":
                # The runs were handed to background recorders: wait until all are recorded.
                t0 = time.perf_counter()
                subprocess.run([argv[0], "show", "--limit", "1"], cwd=cwd, env=dict(
                    os.environ, ROAR_HOME=str(self.root / "cli-home")),
                    capture_output=True, check=False)
                self.add(f"{kind} lineage drain", time.perf_counter() - t0)
        finally:
            ray.shutdown()


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def report(b: Bench, args) -> int:
    r = {k: _median(v) for k, v in b.results.items()}
    n, t = args.tasks, args.trivial
    rows = []

    def row(name, wall, count, base=None, extra=""):
        per = wall / count * 1000
        if base is None:
            rows.append((name, f"{wall:8.2f}", f"{count:6d}", f"{per:8.3f}", "", "", extra))
        else:
            added = (wall - base) / count * 1000
            rows.append((name, f"{wall:8.2f}", f"{count:6d}", f"{per:8.3f}",
                         f"{wall / base:6.3f}", f"{added:+8.3f}", extra))

    u10, t10 = r["untraced io10"], r["traced io10"]
    row("io10 untraced", u10, n)
    row("io10 traced", t10, n, u10)
    drain = r.get("traced io10 lineage drain", 0.0)
    recorded = r.get("traced io10 lineage recorded", 0.0)
    row("io10 traced + lineage drained", t10 + drain, n, u10,
        f"drain after the results: {drain:.2f} s, of which stored and spooled: "
        f"{recorded:.2f} s, then delivered")
    ut, tt = r["untraced trivial"], r["traced trivial"]
    row("trivial untraced", ut, t)
    row("trivial traced", tt, t, ut)
    tdrain = r.get("traced trivial lineage drain", 0.0)
    row("trivial traced + lineage drained", tt + tdrain, t, ut,
        f"drain after the results: {tdrain:.2f} s, of which stored and spooled: "
        f"{r.get('traced trivial lineage recorded', 0.0):.2f} s")
    for kind in ("subprocess", "roar-core run", "roar run"):
        key = f"{kind} io10"
        if key in r:
            count = int(r[f"{kind} n"])
            base = u10 * count / n
            extra = ""
            if f"{kind} lineage drain" in r:
                extra = f"+ {r[kind + ' lineage drain']:.2f} s until recorded"
            row(f"io10 in `{kind}`" if kind != "subprocess" else "io10 as a plain subprocess",
                r[key], count, base, extra)

    head = ("variant", "wall s", "tasks", "ms/task", "ratio", "+ms/task", "")
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(6)]
    lines = ["| " + " | ".join(str(h).ljust(w) for h, w in zip(head, widths, strict=False))
             + " | note |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|------|"]
    for x in rows:
        lines.append("| " + " | ".join(str(c).ljust(w) for c, w in zip(x, widths, strict=False))
                     + f" | {x[6]} |")
    print()
    print(f"Ray {ray.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"cluster: 2 nodes x {CPUS_PER_NODE} CPUs; {args.rounds} round(s), medians")
    print(f"warm-up of each job (worker start, 80 tasks; traced: and the node recorders' "
          f"start): untraced {r['untraced io10 warm-up']:.2f} s, "
          f"traced {r['traced io10 warm-up']:.2f} s")
    print("\n".join(lines))
    for note in b.notes:
        print("note:", note)
    res = b.results
    per_task = lambda key, count: [1e3 * w / count for w in res.get(key, [])]  # noqa: E731
    drained = [w + d for w, d in zip(res["traced io10"],
                                      res.get("traced io10 lineage drain", []), strict=False)]
    scenarios = [
        results.scenario(f"Ray, {n:,} tasks writing 64 KiB each, 2 nodes", "ms/task",
                         ("untraced", per_task("untraced io10", n)),
                         [("runtime_env roar", per_task("traced io10", n)),
                          ("runtime_env roar, lineage drained",
                           [1e3 * w / n for w in drained])],
                         "wall time until the results (and until the lineage is delivered)"),
        results.scenario(f"Ray, {t:,} trivial tasks", "ms/task",
                         ("untraced", per_task("untraced trivial", t)),
                         [("runtime_env roar", per_task("traced trivial", t))]),
    ]
    if "subprocess n" in r:
        scenarios.append(results.scenario(
            "Ray tasks each running a command (64 KiB written)", "ms/task",
            ("plain subprocess", per_task("subprocess io10", int(r["subprocess n"]))),
            [(f"`{k}`", per_task(f"{k} io10", int(r[f"{k} n"])))
             for k in ("roar-core run", "roar run") if f"{k} n" in r and k not in b.failed]))
    results.write(args.json, "ray", f"Ray {ray.__version__}", scenarios)
    ratio = t10 / u10
    added = (t10 - u10) / n * 1000
    ok = ratio <= LIMIT_RATIO and added <= LIMIT_ADDED_MS
    print(f"\nacceptance (io10): ratio {ratio:.3f} (limit {LIMIT_RATIO}), added "
          f"{added:+.3f} ms/task (limit {LIMIT_ADDED_MS}): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--trivial", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--wrapped", type=int, default=1000, help="tasks per wrapped variant")
    ap.add_argument("--roar-cli-tasks", type=int, default=None,
                    help="tasks for `roar run` (default: --wrapped; ~0.7 s of CPU each)")
    ap.add_argument("--roar-cli-venv", default=os.environ.get("ROAR_CLI_VENV"))
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--json", help="also write the raw numbers here (for bench/report)")
    args = ap.parse_args()

    from ray.cluster_utils import Cluster

    roar_ray.enable()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    root = Path(tempfile.mkdtemp(prefix="roar-bench-ray-", dir=args.tmp))
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": CPUS_PER_NODE, "include_dashboard": False})
    cluster.add_node(num_cpus=CPUS_PER_NODE)
    cluster.wait_for_nodes()
    b = Bench(args, root, cluster.address)
    try:
        for i in range(args.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            for traced in order:
                b.in_process(traced)
            print(f"round {i + 1}: " + ", ".join(
                f"{k} {v[-1]:.2f}s" for k, v in b.results.items() if not k.endswith(" n")),
                flush=True)
        if args.wrapped:
            b.wrapped("subprocess", args.wrapped)
            b.wrapped("roar-core run", args.wrapped)
        peer = None if args.no_peer or not args.roar_cli_venv else Path(args.roar_cli_venv)
        if peer and (peer / "bin" / "roar").exists() and (args.roar_cli_tasks or args.wrapped):
            b.wrapped("roar run", args.roar_cli_tasks or args.wrapped, peer)
        elif not args.no_peer:
            b.notes.append("roar-cli not compared (no --roar-cli-venv / ROAR_CLI_VENV)")
        return report(b, args)
    finally:
        cluster.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
