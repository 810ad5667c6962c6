"""What taking a version at the moment it matters costs (issue: exact lineage).

    python bench/bench_capture.py [--reps 9] [--base REV] [--tmp DIR] [--no-big]

1. The tracer: a read-only open now records the opened file's state (one fstat).  The shim
   of `--base` (default HEAD~1 of the checkout; its source from git, compiled here with the
   package's flags) and this checkout's, interleaved in one run: bench/workload.c `files N`
   (write N files of 4 KiB, then read each back), untraced vs each shim; the per-file cost
   is (traced - untraced) / N at N = 5000.
2. The capture a task's end now waits for (`roar-core run` before it returns; a Ray worker
   before it hands the result back): classification and hashing of a real traced session,
   timed in-process (the recorder used to do the same work later, after the command had
   returned): per task and per file for N small files, and for one 1 GiB output.

Every figure is a median over `--reps` rounds, variants interleaved within each round.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
from roar_core import config  # noqa: E402
from roar_core.cli import run as runner  # noqa: E402
from roar_core.pipeline import tracer  # noqa: E402
from roar_core.recording.sessions import SessionCollector  # noqa: E402

CFLAGS = ["-O2", "-std=gnu11", "-fvisibility=hidden", "-fno-strict-aliasing", "-shared",
          "-fPIC"]
N_TRACER = 5000
N_CAPTURE = (0, 10, 1000, 5000)
GIB = 1 << 30


def build_shim(rev: str, out: Path) -> Path:
    """The preload shim as it was at `rev`."""
    src = out / "src"
    src.mkdir(parents=True, exist_ok=True)
    for name in ("roar_preload.c", "roar_log.h"):
        text = subprocess.run(["git", "show", f"{rev}:tracer-bins/preload/{name}"], cwd=REPO,
                              check=True, capture_output=True).stdout
        (src / name).write_bytes(text)
    lib = out / "libroar_preload.so"
    subprocess.run([os.environ.get("CC", "cc"), *CFLAGS, "-I", str(src), "-o", str(lib),
                    str(src / "roar_preload.c"), "-ldl", "-pthread"], check=True)
    return lib


def build_workload(out: Path) -> Path:
    exe = out / "workload"
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-o", str(exe), str(HERE / "workload.c")],
                   check=True)
    return exe


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def bench_tracer(reps: int, base: str, tmp: Path) -> None:
    libs = {"untraced": None, f"shim at {base}": build_shim(base, tmp / "base"),
            "shim now": tracer.library_path()}
    exe = build_workload(tmp / "base")
    times: dict[str, list[float]] = {k: [] for k in libs}
    for rnd in range(reps):
        names = list(libs)
        names = names[rnd % len(names):] + names[: rnd % len(names)]  # rotate the order
        for name in names:
            data, session = tmp / f"d-{rnd}-{name[:4]}", tmp / f"s-{rnd}-{name[:4]}"
            session.mkdir()
            env = dict(os.environ)
            if libs[name] is not None:
                env = tracer.preload_env(session, tag="bench", base=env)
                env["LD_PRELOAD"] = str(libs[name])
            times[name].append(timed([str(exe), "files", str(N_TRACER), str(data)], env))
            shutil.rmtree(data)
            shutil.rmtree(session)
    plain = statistics.median(times["untraced"])
    print(f"\n== 1. tracer: write {N_TRACER} files of 4 KiB, read each back "
          f"(median of {reps}) ==")
    print(f"  {'untraced':<22} {plain * 1e3:8.1f} ms")
    for name in list(libs)[1:]:
        t = statistics.median(times[name])
        per_file = (t - plain) / N_TRACER * 1e6
        print(f"  {name:<22} {t * 1e3:8.1f} ms   +{per_file:5.2f} us/file (limit 2.00)")


def traced_session(tmp: Path, script: str, name: str) -> tuple[Path, Path]:
    work, session = tmp / f"w-{name}", tmp / f"s-{name}"
    work.mkdir()
    session.mkdir()
    env = {**os.environ, **tracer.preload_env(session, tag="bench")}
    subprocess.run(["sh", "-c", script], cwd=work, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return work, session


def bench_capture(reps: int, tmp: Path, big: bool) -> None:
    home = tmp / "home"
    cfg = config.load(cwd=tmp, env={"ROAR_HOME": str(home)})
    home.mkdir(exist_ok=True)
    exe = build_workload(tmp)
    # One process writes N files of 4 KiB (bench/workload.c) and reads each back: N outputs.
    cases = [(f"{n} files of 4 KiB", n, f"{exe} files {n} out") for n in N_CAPTURE]
    # A fresh session per rep: the capture classifies and hashes what the command left.
    print(f"\n== 2. capture at a task's end: read + classify + hash (median of {reps}) ==")
    for label, n, script in cases:
        t, read = timed_capture(cfg, tmp, script, f"{n}", reps)
        per = f"{t / n * 1e6:7.1f} us/file" if n else ""
        print(f"  {label:<22} {t * 1e3:8.1f} ms per task  {per}"
              f"   (of which reading the logs {read * 1e3:.1f} ms"
              + (f", {read / n * 1e6:.2f} us/file)" if n else ")"))
    if big:
        # 1 GiB of distinct blocks (the page cache holds it, as right after a write).
        t, _ = timed_capture(cfg, tmp, "head -c 1048576 /dev/urandom > b; i=0; while [ $i -lt "
                             "1024 ]; do cat b; i=$((i+1)); done > big.bin; rm b", "big",
                             max(3, reps // 3))
        print(f"  {'one 1 GiB output':<22} {t * 1e3:8.1f} ms per task  "
              f"{GIB / t / 1e9:5.2f} GB/s")


def timed_capture(cfg: config.Config, tmp: Path, script: str, name: str, reps: int
                  ) -> tuple[float, float]:
    """Median seconds of the runner's capture (reading its session, classifying,
    hashing) of a fresh traced run of `script`, and of its first step alone: reading
    the logs and attributing their records to the task."""
    runs, reads = [], []
    for rep in range(reps):
        work, session = traced_session(tmp, script, f"{name}-{rep}")
        t0 = time.perf_counter()
        collector = SessionCollector(session)
        collector.collect(settle=True)
        records = collector.take_all().records
        reads.append(time.perf_counter() - t0)
        _, hasher = runner.capture_now(cfg, records)
        if hasher is not None:
            hasher.close()  # its stat cache entries, which `roar-core run` writes after
        runs.append(time.perf_counter() - t0)
        shutil.rmtree(work)
        shutil.rmtree(session)
    return statistics.median(runs), statistics.median(reads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--base", default="HEAD~1", help="git revision of the shim before")
    ap.add_argument("--tmp", default=None, help="where data goes (default: a temp dir)")
    ap.add_argument("--no-big", action="store_true", help="skip the 1 GiB output")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="roar-bench-capture-", dir=args.tmp))
    try:
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, tmp {tmp}")
        bench_tracer(args.reps, args.base, tmp)
        bench_capture(args.reps, tmp, not args.no_big)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
