"""Recording: what one small task costs the recorder (CPU) and a producer that waits for it.

A worker process with the tracer preloaded (as an Airflow LocalExecutor worker after `eval
"$(roar-core env airflow)"`) forks task processes, --parallel at a time; each does what a
producer that needs the answer does (roar_airflow's RoarHook in boundary mode): append the
task's begin to its task log, tag itself through the shim, read one file an earlier task
wrote and write one (2 files), untag, append the end and wait for the session's recorder
process to mark it recorded.  The recorder stores (SQLite) and, with --emit, spools the
events to a file transport.  Everything lives in a temporary ROAR_HOME, except the session:
in memory for forked task processes, as an Airflow worker's, under the home for --parallel 0,
as a Ray node's.

    python bench/bench_recording.py [--tasks 200] [--parallel 1] [--warmup 20] [--emit]
                                    [--no-wait] [--answer early|recorded] [--profile OUT]
    python bench/bench_recording.py --backlog 2000

--parallel 0: the tasks run one after the other in the worker itself, one task log for all
(as in a Ray worker); otherwise each in a forked process with a log of its own (Airflow).

Prints the producer's time on the task path (begin + end + wait; median, p95) and the
recorder's CPU per task over the measured tasks (its /proc utime + stime before and after,
with those of its sender child, which delivers the events: both, and each),
the figure issue 21 bounds at 1 ms.  --no-wait: producers do not wait (as Ray workers and
Snakemake do); the recorder's CPU per task is then measured once it has caught up (and,
with --emit, sent the events).

--backlog N: a recorder catching up (after an outage, or started late): N task processes
run and exit with no recorder, then one recorder pass (`Follower.poll`, in this process)
records them all; timed for N/4 and for N producers' logs, with the ratio of their costs
per task (1: linear in the backlog).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

WORKER = textwrap.dedent('''
    import json, os, sys, time
    from datetime import datetime, timezone
    from roar_core.pipeline import tracer
    from roar_core.recording import recorder
    from roar_core.recording.tasklog import TaskLog
    session, data, tasks, parallel, wait, early, ensure = (
        sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1",
        sys.argv[6] == "1", sys.argv[7] == "1")
    shim = tracer.loaded()
    assert shim is not None, "the tracer is not preloaded"

    shared = None

    def task(n):
        global shared
        t0 = time.perf_counter()
        if parallel == 0:  # one long-lived producer, as a Ray worker
            shared = shared or TaskLog(session)
            log = shared
        else:
            log = TaskLog(session)
        run_id = f"0190a000-0000-7000-8000-{n:012d}"
        log.begun({"run_id": run_id, "engine": "bench", "namespace": "bench",
                   "job_name": "bench.task", "started_at": datetime.now(timezone.utc).isoformat(),
                   "host": os.uname().nodename, "pid": os.getpid(), "traced": True})
        if ensure:  # (--backlog: no recorder while the tasks run)
            recorder.ensure(Path(session))
        shim.begin(run_id)
        t1 = time.perf_counter()
        # The previous task's output; tasks running side by side read the seed instead (the
        # previous one may not have written its file yet).
        src = os.path.join(data, f"{max(0, n - 1) if parallel < 2 else 0}.txt")
        with open(src) as f:
            text = f.read()
        with open(os.path.join(data, f"{n}.txt"), "w") as f:
            f.write(text[:64] + str(n) + "\\n")
        t2 = time.perf_counter()
        shim.end()
        fd = log.ended(run_id, "COMPLETE", wait=wait, early=early)
        ok = log.wait_for(run_id, fd, 60) if wait else True
        t3 = time.perf_counter()
        return {"roar_ms": 1e3 * ((t1 - t0) + (t3 - t2)), "ok": ok}

    from pathlib import Path
    print("ready", flush=True)
    for line in sys.stdin:
        first, count = map(int, line.split())
        results, running = [], {}
        if parallel == 0:
            print(json.dumps([task(n) for n in range(first, first + count)]), flush=True)
            continue
        n = first
        while n < first + count or running:
            while n < first + count and len(running) < parallel:
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(r)
                    out = json.dumps(task(n)).encode()
                    os.write(w, out)
                    os._exit(0)
                os.close(w)
                running[pid] = r
                n += 1
            pid, _ = os.wait()
            r = running.pop(pid)
            results.append(json.loads(os.read(r, 65536)))
            os.close(r)
        print(json.dumps(results), flush=True)
''')


def backlog(n: int) -> tuple[float, int]:
    """CPU seconds of one recorder pass over `n` dead producers' task logs, and how many
    tasks it recorded."""
    from roar_core import config
    from roar_core.api import Roar
    from roar_core.pipeline import tracer
    from roar_core.recording.follower import Follower

    root = Path(tempfile.mkdtemp(prefix="roar-bench-backlog-"))
    try:
        session, data = root / "session", root / "data"
        session.mkdir()
        data.mkdir()
        (data / "0.txt").write_text("seed\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "ROAR_"))}
        # The tasks of the timed bench, each in a process of its own, one after the other.
        subprocess.run([sys.executable, "-c", WORKER, str(session), str(data), "0", "1", "0",
                        "0", "0"], input=f"1 {n}\n", text=True, stdout=subprocess.DEVNULL,
                       env=tracer.preload_env(session, base=env), check=True, cwd=root)
        roar = Roar(config.load(cwd=root, env={}, home=str(root / "home")), send=False)
        follower = Follower(roar, session)
        cpu = time.process_time()
        done = follower.poll()
        cpu = time.process_time() - cpu
        follower.close()
        roar.close(timeout=0)
        return cpu, done
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def _stat(pid: int | str) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # fields from the 3rd (state) on


def _cpu_s(pid: int) -> tuple[float, float]:
    """CPU of the recorder, and of its children: its sender (the events' delivery through
    the OpenLineage client), alive (/proc) or reaped (the recorder's cutime and cstime)."""
    fields = _stat(pid)
    own, children = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    for child in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            st = _stat(child)
        except OSError:
            continue
        if int(st[1]) == pid:
            children += int(st[11]) + int(st[12])
    tick = os.sysconf("SC_CLK_TCK")
    return own / tick, children / tick


def _recorder_pid(session: Path) -> int:
    from bench_tracer import recorder_pids

    for pid in recorder_pids(session):
        return pid
    raise SystemExit("no recorder process (see recorder.log in the session)")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> None:
    import json

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--emit", action="store_true", help="spool events (file transport)")
    ap.add_argument("--no-wait", action="store_true")
    ap.add_argument("--answer", choices=("early", "recorded"), default="early",
                    help="what a waiting producer waits for: its lineage (as the Airflow "
                         "hook, the default) or its recorded mark (after the store)")
    ap.add_argument("--profile", metavar="OUT", help="py-spy the recorder (collapsed stacks)")
    ap.add_argument("--backlog", type=int, metavar="N",
                    help="time one pass catching up on N (and N/4) dead producers instead")
    args = ap.parse_args()
    if args.backlog:
        per = {}
        for n in (args.backlog // 4, args.backlog):
            cpu, done = backlog(n)
            per[n] = cpu / n
            print(f"backlog of {n} producers: one pass recorded {done}, {cpu:.2f} s CPU, "
                  f"{1e3 * cpu / n:.2f} ms per task" + ("" if done == n else "; TASKS MISSED"))
        small, big = per
        print(f"per task at {big} / at {small}: {per[big] / per[small]:.2f} (1: linear)")
        return

    from roar_core import config
    from roar_core.pipeline import tracer
    from roar_core.recording import recorder, tasklog
    from roar_core.recording.sessions import new_session_dir, remove_session_dir

    root = Path(tempfile.mkdtemp(prefix="roar-bench-rec-"))
    data = root / "data"
    data.mkdir()
    (data / "0.txt").write_text("seed\n" * 10)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "ROAR_"))}
    cfg = config.load(cwd=root, env={}, home=str(root / "home"), emit=args.emit)
    # Where each engine's session is: a Ray node's under the roar home, an Airflow
    # worker's in memory (`roar-core env airflow`); on ext4 here, creating, mapping and
    # removing each task process's logs cost the recorder ~0.3 ms more per task.
    session = new_session_dir(cfg, f"bench-{os.getpid()}", in_memory=args.parallel > 0)
    recorder.write_settings(session, cfg, waited=not args.no_wait, idle_exit_s=60)
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(session), str(data), "0", str(args.parallel),
         "0" if args.no_wait else "1", "1" if args.answer == "early" else "0", "1"],
        env=tracer.preload_env(session, base=env), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, cwd=root)
    assert worker.stdout.readline() == "ready\n"

    def run(first: int, count: int) -> list[dict]:
        worker.stdin.write(f"{first} {count}\n")
        worker.stdin.flush()
        return json.loads(worker.stdout.readline())

    def caught_up() -> None:
        """Every task recorded and, with --emit, every event delivered: the recorder sends
        once it has recorded, and the CPU of a window that ended before its sending would
        leave out ~0.3 ms a task (what the 2026-11-26 figure of 0.47 ms did)."""
        from roar_core.pipeline.spoolfiles import pending_count

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            logs = [tasklog.TaskLogFile.open(p) for p in tasklog.log_paths(session)]
            if not any(j is not None and j.unrecorded() for j in logs) and not (
                    args.emit and pending_count(cfg.spool_dir)):
                return
            time.sleep(0.02)

    run(1, args.warmup)
    caught_up()
    pid = _recorder_pid(session)
    spy = None
    if args.profile:  # py-spy's collapsed stacks of the recorder over the measured tasks
        spy = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "-r", "1000", "-f",
                                "raw", "-o", args.profile], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        time.sleep(1.0)
    own0, sent0 = _cpu_s(pid)
    results = run(1 + args.warmup, args.tasks)
    caught_up()
    own, sent = _cpu_s(pid)
    own, sent = own - own0, sent - sent0
    cpu = own + sent
    if spy is not None:
        spy.send_signal(2)
        spy.wait()
    worker.stdin.close()
    worker.wait()
    lost = sum(not r["ok"] for r in results)
    times = [r["roar_ms"] for r in results]
    print(f"{args.tasks} tasks of 2 files, {args.parallel} at a time, "
          f"{'waiting for the ' + args.answer + ' answer' if not args.no_wait else 'not waiting'}, "
          f"events {'spooled' if args.emit else 'off'}")
    print(f"producer's time on the task path: median {statistics.median(times):.2f} ms, "
          f"p95 {_pct(times, 0.95):.2f} ms, max {max(times):.2f} ms"
          + (f"; {lost} not answered" if lost else ""))
    print(f"recorder CPU per task: {1e3 * cpu / args.tasks:.2f} ms "
          f"({cpu:.2f} s for {args.tasks}; clock tick {1e3 / os.sysconf('SC_CLK_TCK'):.0f} ms)"
          + (f": recording {1e3 * own / args.tasks:.2f} ms, delivery (its sender) "
             f"{1e3 * sent / args.tasks:.2f} ms" if args.emit else ""))
    if not os.environ.get("BENCH_KEEP"):
        remove_session_dir(session)
        subprocess.run(["rm", "-rf", str(root)], check=False)
    else:
        print(root, session)


if __name__ == "__main__":
    main()
