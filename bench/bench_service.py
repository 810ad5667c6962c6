"""Recorder service: roar's critical-path time per task in boundary mode, without Airflow.

Reproduces what an Airflow LocalExecutor worker started after `eval "$(roar-core env
airflow)"` does with `@task.roar` tasks: a worker process with the shim preloaded forks
task processes (--parallel at a time); each one does what `RoarHook.begin` / `end` do in
boundary mode -- connect to the session's recorder service (the first task spawns it),
send a `TaskSpec` as `RoarHook._service_begin` builds it, tag itself through the shim, read
two files written by earlier tasks and write one, untag, and wait for the service's answer
-- and measures begin + end the way `TaskRun.roar_seconds` does ("roar took X ms" in the
task log).  Settings as when Airflow's OpenLineage provider emits the events: overrides
{"emit": False, "namespace": ...}, so the service stores (SQLite) but spools nothing.  Like
Airflow's, the worker has not imported roar: each task process does, before it begins.
Everything lives in a temporary ROAR_HOME.

    python bench/bench_service.py [--tasks 60] [--parallel 4] [--warmup 8] [--busy-ms 30]
                                  [--json out.json] [--hold]

Prints the median, p95, min and max of the per-task roar time (and of its begin and end
parts, in ms) over --tasks tasks, after --warmup tasks (the first spawns the service);
--json writes the per-task times.
--busy-ms: CPU each task process burns before begin and after end, standing in for
Airflow's own work in the task process (parsing the DAG, the provider's events) that
competes with the service for the CPU.  --hold: print the service's pid and wait for Enter
before the measured tasks (to attach `py-spy record -p PID`).
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
import time
from pathlib import Path


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def _burn(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


# ---- one task process (forked from the worker) -------------------------------------------


def _connect(session: str, st):
    """As RoarHook._service_begin: connect, spawning the service when none listens."""
    from roar_core.service import ServiceClient, spawn

    client = ServiceClient.connect(session, st)
    if client is None:
        spawn(session, st)
        deadline = time.monotonic() + 30
        while client is None and time.monotonic() < deadline:
            time.sleep(0.05)
            client = ServiceClient.connect(session, st)
    if client is None:
        raise SystemExit("the recorder service did not start (see recorder.log)")
    return client


def _task(i: int, session: str, data: Path, wf_run: str, busy_ms: float,
          parallel: int) -> dict:
    # What the task process does before RoarHook.begin, untimed: import roar (Airflow's
    # task process imports the provider itself), RoarHook.mode() (settings, the shim).
    from roar_core import tracelog, tracer
    from roar_core.ids import new_run_id
    from roar_core.service import Settings, TaskSpec

    st = Settings(os.getcwd(), {"emit": False, "namespace": "bench"}, (), ())
    shim = tracer.loaded()
    if shim is None:
        raise RuntimeError("the shim is not preloaded into the task process")
    _burn(busy_ms)
    run_id = new_run_id()
    t0 = time.perf_counter()
    client = _connect(session, st)
    own_log, offset = shim.log_path(), 0
    if own_log is not None:
        try:
            offset = tracelog.read_header(own_log).reserved
        except tracelog.TraceLogError:
            own_log = None
    client.begin(TaskSpec(
        job_name=f"bench.t{i}", engine="airflow", run_id=run_id, pid=os.getpid(),
        began_mono_ns=time.monotonic_ns(),
        workflow={"namespace": "bench", "job_name": "bench", "run_id": wf_run},
        engine_task_id=f"bench/run/t{i}", attempt=1,
        engine_version={"name": "airflow", "version": "3.0.0"},
        own_log=os.fspath(own_log) if own_log else None, own_log_offset=offset))
    shim.begin(run_id)
    t1 = time.perf_counter()

    acc = str(i)
    for j in (i - parallel, i - parallel - 1):  # finished before this one started
        with open(data / f"out{j}.txt") as f:
            acc += f.read()[:64]
    with open(data / f"out{i}.txt", "w") as f:
        f.write(acc * 16)

    t2 = time.perf_counter()
    shim.end()
    result = client.end("COMPLETE")
    client.close()
    t3 = time.perf_counter()
    _burn(busy_ms)
    return {"begin": t1 - t0, "end": t3 - t2, "error": result.error,
            "counts": list(result.counts)}


def _fork_task(i: int, session: str, data: Path, wf_run: str, busy_ms: float,
               parallel: int):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = _task(i, session, data, wf_run, busy_ms, parallel)
        except BaseException as e:  # reported by the worker
            out = {"error": f"{type(e).__name__}: {e}"}
        os.write(w, json.dumps(out).encode())
        os._exit(0)  # as Airflow's task processes leave
    os.close(w)
    return pid, r


def _collect(pid: int, fd: int) -> dict:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b'{"error": "task process died"}')


def _service_pid(session: str) -> int | None:
    out = subprocess.run(["pgrep", "-f", f"roar_core.service {session} "],
                         capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    return pids[0] if pids else None


def worker(args: argparse.Namespace) -> None:
    """The traced worker (started with the shim preloaded): forks the tasks.  Like an
    Airflow worker, it has not imported roar: its task processes do."""
    import uuid

    session, data = os.environ["ROAR_SESSION_DIR"], Path(args.data)
    for j in range(-args.parallel - 1, 0):  # what the first tasks read
        (data / f"out{j}.txt").write_text(f"seed {j}\n")
    wf_run = str(uuid.uuid4())
    total = args.warmup + args.tasks
    results: list[dict] = []
    running: list[tuple[int, int]] = []
    for i in range(total):
        if i == 1:  # the first task spawns the service: wait for it before going parallel
            results.append(_collect(*running.pop()))
        if i == args.warmup and args.hold:
            while running:
                results.append(_collect(*running.pop(0)))
            print(f"service pid {_service_pid(session)}; press Enter", file=sys.stderr)
            sys.stdin.readline()
        if len(running) >= args.parallel:  # also: the files task i reads are written
            results.append(_collect(*running.pop(0)))
        running.append(_fork_task(i, session, data, wf_run, args.busy_ms, args.parallel))
    while running:
        results.append(_collect(*running.pop(0)))
    json.dump(results[args.warmup:], sys.stdout)


# ---- driver ---------------------------------------------------------------------------------


def _stats(xs: list[float]) -> str:
    ms = [x * 1e3 for x in xs]
    return (f"median {statistics.median(ms):5.2f}  p95 {_pct(ms, 0.95):5.2f}  "
            f"min {min(ms):5.2f}  max {max(ms):6.2f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=60)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--busy-ms", type=float, default=30.0)
    p.add_argument("--json", type=Path)
    p.add_argument("--hold", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    from roar_core import tracer

    if not tracer.status().usable:
        raise SystemExit(f"the tracer cannot run here: {tracer.status().reason}")
    with tempfile.TemporaryDirectory(prefix="roar-bench-service-") as tmp:
        home, data = Path(tmp) / "roar", Path(tmp) / "data"
        session = home / "sessions" / "worker"
        session.mkdir(parents=True)
        data.mkdir()
        env = tracer.preload_env(session, base={**os.environ, "ROAR_HOME": str(home)})
        env["PYTHONPATH"] = os.pathsep.join(sys.path)
        argv = [sys.executable, os.path.abspath(__file__), "--worker", "--data", str(data),
                *sys.argv[1:]]
        out = subprocess.run(argv, env=env, cwd=tmp, stdout=subprocess.PIPE,
                             stdin=None if args.hold else subprocess.DEVNULL, text=True)
        if out.returncode != 0:
            raise SystemExit(f"worker failed ({out.returncode})")
        results = json.loads(out.stdout)
        shutil.rmtree(session)  # the service leaves once its session directory is gone
    errors = [r["error"] for r in results if r.get("error")]
    if errors:
        raise SystemExit(f"{len(errors)} task(s) not recorded: {errors[0]}")
    ok = [r for r in results if "begin" in r]
    print(f"{len(ok)} tasks, {args.parallel} at a time, busy {args.busy_ms:g} ms "
          f"(inputs/outputs {ok[0]['counts']})")
    print(f"roar  {_stats([r['begin'] + r['end'] for r in ok])}")
    print(f"begin {_stats([r['begin'] for r in ok])}")
    print(f"end   {_stats([r['end'] for r in ok])}")
    if args.json:
        args.json.write_text(json.dumps(ok))


if __name__ == "__main__":
    main()
