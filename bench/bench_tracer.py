"""Tracer overhead: the preload shim against untraced runs (and roar-cli's preload tracer).

    python bench/bench_tracer.py [--reps 5] [--quick] [--workload c|python] [--tmp DIR]
                                 [--roar-cli-venv VENV | env ROAR_CLI_VENV=VENV] [--no-peer]

Workloads (bench/workload.c, compiled here with ``cc -O2`` so that we time the tracer, not
Python's per-file overhead; ``--workload python`` runs the same loops in Python instead):

  files N   write N files of 4 KiB into a fresh dir (open O_WRONLY|O_CREAT|O_TRUNC, write,
            close), then read each back (open O_RDONLY, read, close); N = 0 .. 5000
  rw K      8 files opened once; K pwrite/pread calls of 4 KiB spread over them

Variants: ``untraced``; ``roar-core`` (LD_PRELOAD of our shim, fresh session dir per run);
with a roar-cli venv also ``roar-cli tracer`` (its ``roar-tracer-preload`` launcher plus
``libroar_tracer_preload.so``: the tracer alone) and ``roar-cli run`` (``roar run --tracer
preload --no-tracer-fallback`` in a freshly ``roar init``-ed dir: the whole command,
including roar's startup and its post-processing).

Every run is one process timed from spawn to exit (e2e); the workload also reports its own
spawn-to-main time (launch: exec, loader, preload constructor) and the time of its loop
(work), so startup and per-operation costs can be told apart.  Runs are interleaved (each
round runs every variant once per point, the point order shuffled with a fixed seed and the
variant order rotated), the first points get more repetitions, and every number is a median.
A least-squares line through the medians gives startup (intercept) and per-op (slope) costs;
the tracer's cost is traced minus untraced.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import math
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from roar_core.pipeline import tracelog, tracer  # noqa: E402

FILES_N = (0, 500, 1000, 2000, 3000, 4000, 5000)
RW_K = (400, 1600, 6400, 25600)
QUICK_FILES_N = (0, 1000, 3000)
QUICK_RW_K = (400, 6400)

LIMIT_STARTUP_MS = 1.0
LIMIT_PER_FILE_US = 3.0
GOAL_PER_FILE_US = 2.0
LIMIT_PER_RW_US = 0.2

UNTRACED = "untraced"
CORE = "roar-core"
CLI_TRACER = "roar-cli tracer"
CLI_RUN = "roar-cli run"

RESULT_RE = re.compile(rb"ROARBENCH launch_ns=(-?\d+) work_ns=(\d+) ops=(\d+)")

PY_WORKLOAD = r'''
import os, sys, time
t_main = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
kind, n, d = sys.argv[1], int(sys.argv[2]), sys.argv[3]
size = int(sys.argv[4]) if len(sys.argv) > 4 else 4096
buf = bytes(97 + i % 26 for i in range(size))
t0s = os.environ.get("ROARBENCH_T0_NS")
launch = t_main - int(t0s) if t0s else -1
t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
os.makedirs(d, exist_ok=True)
if kind == "files":
    for i in range(n):
        fd = os.open(f"{d}/f{i:06d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, buf)
        os.close(fd)
    for i in range(n):
        fd = os.open(f"{d}/f{i:06d}", os.O_RDONLY)
        os.read(fd, size)
        os.close(fd)
    ops = 2 * n
else:
    fds = []
    for f in range(8):
        fd = os.open(f"{d}/rw{f}", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(fd, size * 16)
        fds.append(fd)
    for i in range(n):
        fd, off = fds[i % 8], ((i // 16) % 16) * size
        if (i // 8) & 1:
            os.pread(fd, size, off)
        else:
            os.pwrite(fd, buf, off)
    for fd in fds:
        os.close(fd)
    ops = n
work = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - t0
print(f"ROARBENCH launch_ns={launch} work_ns={work} ops={ops}", flush=True)
'''


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def sh(cmd: list[str], **kw) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"? ({e})"
    return (p.stdout or p.stderr).strip()


class BenchError(RuntimeError):
    pass


@dataclass
class Sample:
    e2e: int  # ns, spawn to exit as seen by the parent
    launch: int  # ns, spawn to main as seen by the workload (-1: unknown)
    work: int  # ns, the workload's loop


@dataclass
class Peer:
    venv: Path
    roar: Path
    launcher: Path
    library: Path
    version: str


# --------------------------------------------------------------------------- setup


def build_workload(kind: str, cache: Path) -> list[str]:
    if kind == "python":
        script = cache / "workload.py"
        script.write_text(PY_WORKLOAD)
        return [sys.executable, "-I", "-S", str(script)]
    cc = os.environ.get("CC", "cc")
    exe = cache / "workload"
    cmd = [cc, "-O2", "-o", str(exe), str(HERE / "workload.c")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return [str(exe)]


def find_peer(venv_arg: str | None, env: dict[str, str]) -> tuple[Peer | None, str]:
    if not venv_arg:
        return None, "ROAR_CLI_VENV not set (and no --roar-cli-venv): roar-cli not compared"
    venv = Path(venv_arg)
    roar, py = venv / "bin" / "roar", venv / "bin" / "python"
    if not roar.exists() or not py.exists():
        return None, f"{venv} has no bin/roar (pip install roar-cli into it)"
    probe = (
        "import importlib.metadata as m, pathlib, roar\n"
        "from roar.execution.runtime import tracer_backends as tb\n"
        "p = pathlib.Path(roar.__file__).parent\n"
        "print(m.version('roar-cli'))\n"
        "print(tb.find_preload_tracer(p))\n"
        "print(tb.find_preload_library(p))\n"
    )
    p = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, env=env)
    lines = p.stdout.split()
    if p.returncode != 0 or len(lines) != 3:
        return None, f"could not locate roar-cli's preload tracer: {p.stderr.strip()[-300:]}"
    version, launcher, library = lines
    if launcher == "None" or library == "None":
        return None, f"roar-cli {version} has no preload tracer here ({launcher}, {library})"
    return Peer(venv, roar, Path(launcher), Path(library), version), ""


def default_tmp() -> str | None:
    """A tmpfs (/dev/shm) when there is one: the tracer's µs per file would drown in a disk
    filesystem's noise (ext4 on a VM disk here: 10-300 µs per create, varying run to run)."""
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[1] == "/dev/shm" and parts[2] == "tmpfs":
                return "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None
    except OSError:
        pass
    return None


def clean_env() -> dict[str, str]:
    """This environment minus anything that would trace the untraced runs."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "LD_PRELOAD" and not k.startswith(("ROAR_", "ROARBENCH_"))
    }
    env["DO_NOT_TRACK"] = "1"  # roar-cli's telemetry
    return env


# --------------------------------------------------------------------------- one run


class Runner:
    def __init__(self, workload: list[str], root: Path, peer: Peer | None, timeout: float):
        self.workload = workload
        self.root = root
        self.peer = peer
        self.timeout = timeout
        self.env = clean_env()
        self.count = 0
        self.notes: list[str] = []

    def _roar(self, args: list[str], cwd: Path) -> None:
        assert self.peer
        cmd = [str(self.peer.roar), *args]
        p = subprocess.run(cmd, cwd=cwd, env=self.env, capture_output=True, text=True,
                           timeout=self.timeout)
        if p.returncode != 0:
            raise BenchError(f"{' '.join(args)} failed ({p.returncode}): {p.stderr[-500:]}")

    def run(self, variant: str, kind: str, n: int, inspect=None) -> Sample:
        self.count += 1
        run_dir = self.root / f"run{self.count:06d}"
        run_dir.mkdir()
        try:
            data = run_dir / "data"
            args = [*self.workload, kind, str(n), str(data)]
            env = dict(self.env)
            if variant == UNTRACED:
                cmd = args
            elif variant == CORE:
                session = run_dir / "session"
                session.mkdir()
                env = tracer.preload_env(session, base=env)
                cmd = args
            elif variant == CLI_TRACER:
                assert self.peer
                env["ROAR_PRELOAD_LIB"] = str(self.peer.library)
                cmd = [str(self.peer.launcher), str(run_dir / "report.msgpack"), *args]
            elif variant == CLI_RUN:
                assert self.peer
                self._roar(["init", "--no-gitignore"], run_dir)
                # roar ignores files under /tmp by default: make it track (and hash) them.
                self._roar(["config", "set", "filters.ignore_tmp_files", "false"], run_dir)
                v = ["-v"] if inspect else ["-q"]
                cmd = [str(self.peer.roar), "run", *v, "--tracer", "preload",
                       "--no-tracer-fallback", *args]
            else:
                raise ValueError(variant)
            t0 = now_ns()
            env["ROARBENCH_T0_NS"] = str(t0)
            p = subprocess.run(cmd, env=env, cwd=run_dir, capture_output=True,
                               timeout=self.timeout)
            t1 = now_ns()
            m = RESULT_RE.search(p.stdout)
            if p.returncode != 0 or not m:
                tail = (p.stderr or p.stdout).decode(errors="replace").strip()[-800:]
                raise BenchError(f"{variant} {kind} {n}: exit {p.returncode}: {tail}")
            if inspect:
                inspect(run_dir, p)
            return Sample(t1 - t0, int(m.group(1)), int(m.group(2)))
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)


def sanity(runner: Runner, variant: str) -> str:
    """One untimed traced run of `files 100`: did the tracer see the files?"""
    n = 100
    seen: list[str] = []

    def check(run_dir: Path, proc: subprocess.CompletedProcess) -> None:
        data = str(run_dir / "data").encode()
        if variant == CORE:
            trace = tracelog.read_session(run_dir / "session")
            recs = [r for log in trace.logs for r in log.records]
            hits = sum(1 for r in recs if r.path.startswith(data) and r.op_name == "open")
            seen.append(f"{len(trace.logs)} log(s), {len(recs)} records, {hits} opens under "
                        f"data/ (expect {2 * n}), {trace.dropped} dropped")
            if hits < 2 * n or trace.dropped:
                raise BenchError(f"{variant} sanity check failed: {seen[-1]}")
        elif variant == CLI_TRACER:
            report = (run_dir / "report.msgpack").read_bytes()
            hits = report.count(data + b"/f0")
            seen.append(f"report {len(report)} bytes, {hits} mentions of data/f* (expect >= {n})")
            if hits < n:
                raise BenchError(f"{variant} sanity check failed: {seen[-1]}")
        elif variant == CLI_RUN:
            out = (proc.stdout + proc.stderr).decode(errors="replace")
            hits = len(set(re.findall(r"data/f\d{6}", out)))
            done = [ln.strip() for ln in out.splitlines() if "roar: done" in ln]
            ignored = [ln.strip(" ·") for ln in out.splitlines() if "ignored i/o" in ln]
            seen.append(f"`roar run -v` listed {hits} distinct data/f* files (expect {n}); "
                        + "; ".join(ignored + done))
            if hits >= n:
                return
            if ignored and "system" in ignored[0]:
                # roar hard-codes /dev/ and /dev/shm/ as system paths: it traces the files
                # but drops them before hashing and storing.
                runner.notes.append(
                    f"{CLI_RUN}: roar treats files under {runner.root} as system paths and "
                    "drops them after tracing (no hashing/storing), so its per-file number "
                    "is a lower bound; use --tmp on a disk path to include that work")
                seen[-1] += " -- files ignored as system paths (see note)"
                return
            raise BenchError(f"{variant} sanity check failed: {seen[-1]}\n{out[-1500:]}")

    if variant == UNTRACED:
        runner.run(variant, "files", n)
        return "ok"
    runner.run(variant, "files", n, inspect=check)
    return seen[0]


# --------------------------------------------------------------------------- stats


@dataclass
class Fit:
    a: float  # intercept, ns
    b: float  # slope, ns per unit
    se_b: float  # standard error of the slope (nan with fewer than 3 points)


def fit(xs: list[float], ys: list[float]) -> Fit:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    if n > 2:
        ssr = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
        se = math.sqrt(ssr / (n - 2) / sxx)
    else:
        se = math.nan
    return Fit(a, b, se)


def med(samples: list[Sample], attr: str) -> float:
    return statistics.median(getattr(s, attr) for s in samples)


def pm(value: float, se: float, fmt: str = "{:+.2f}") -> str:
    s = fmt.format(value)
    return s if math.isnan(se) else f"{s} ±{se:.2f}"


# --------------------------------------------------------------------------- main


def machine_facts(args, peer: Peer | None, peer_note: str, root: Path, workload: list[str]):
    cpu = "?"
    mem = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    shim = tracer.library_path()
    try:
        digest = hashlib.sha256(shim.read_bytes()).hexdigest()[:12]
        shim_desc = f"{shim} (sha256 {digest}, {shim.stat().st_size} bytes)"
    except OSError as e:
        shim_desc = f"{shim} ({e})"
    rev = sh(["git", "-C", str(HERE.parent), "describe", "--always", "--dirty"])
    la = " ".join(f"{x:.2f}" for x in os.getloadavg())
    facts = [
        ("date", datetime.datetime.now().astimezone().isoformat(timespec="seconds")),
        ("host", platform.node()),
        ("cpu", cpu),
        ("nproc", f"{os.cpu_count()} online, {len(os.sched_getaffinity(0))} usable; mem {mem}"),
        ("kernel", f"{platform.system()} {platform.release()} {platform.machine()}"),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("cc", sh([os.environ.get("CC", "cc"), "--version"]).splitlines()[0]),
        ("loadavg", f"{la} (at start)"),
        ("tmp", f"{root} ({sh(['stat', '-f', '-c', '%T', str(root)])})"),
        ("roar-core", f"git {rev}; shim {shim_desc}"),
        ("roar-cli", f"{peer.version} in {peer.venv}; launcher {peer.launcher.name}, "
                     f"library {peer.library.name}" if peer else peer_note),
        ("workload", " ".join(workload)),
    ]
    print("== machine ==")
    for k, v in facts:
        print(f"{k:10s} {v}")


def schedule(points: list[tuple[str, int]], variants: list[str], reps: int, seed: int):
    """Rounds of (variant, kind, n).  The first point of each workload gets 4x the
    repetitions and the second 2x (they are cheap and the small-N end pins the intercept);
    `roar run` costs ~1 s a run and stays at `reps`."""

    def reps_for(kind: str, n: int, variant: str) -> int:
        if variant == CLI_RUN:
            return reps
        same = [x for k, x in points if k == kind]
        rank = same.index(n)
        return reps * (4 if rank == 0 else 2 if rank == 1 else 1)

    rng = random.Random(seed)
    rounds = max(reps_for(k, n, v) for k, n in points for v in variants)
    out = []
    for r in range(rounds):
        order = list(points)
        rng.shuffle(order)
        rot = variants[r % len(variants):] + variants[: r % len(variants)]
        jobs = [(v, k, n) for k, n in order for v in rot if r < reps_for(k, n, v)]
        out.append(jobs)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=None, help="repetitions per point (5; quick 3)")
    ap.add_argument("--quick", action="store_true", help="fewer points and repetitions")
    ap.add_argument("--workload", choices=("c", "python"), default="c")
    ap.add_argument("--tmp", default=default_tmp(),
                    help="where run dirs go (default: /dev/shm if tmpfs, else system temp)")
    ap.add_argument("--roar-cli-venv", default=os.environ.get("ROAR_CLI_VENV"),
                    help="venv with roar-cli installed (default: $ROAR_CLI_VENV)")
    ap.add_argument("--no-peer", action="store_true", help="skip roar-cli even if available")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = ap.parse_args()
    reps = args.reps or (3 if args.quick else 5)
    if reps < 1:
        ap.error("--reps must be >= 1")
    files_n = QUICK_FILES_N if args.quick else FILES_N
    rw_k = QUICK_RW_K if args.quick else RW_K

    st = tracer.status()
    if not st.usable:
        print(f"roar-core tracer unusable here: {st.reason}", file=sys.stderr)
        return 1

    root = Path(tempfile.mkdtemp(prefix="roar-bench-tracer-", dir=args.tmp))
    try:
        workload = build_workload(args.workload, root)
        peer, peer_note = (None, "skipped (--no-peer)") if args.no_peer else find_peer(
            args.roar_cli_venv, clean_env())
        machine_facts(args, peer, peer_note, root, workload)
        runner = Runner(workload, root, peer, args.timeout)

        variants = [UNTRACED, CORE] + ([CLI_TRACER, CLI_RUN] if peer else [])
        print("\n== sanity (one untimed `files 100` per variant; also a warm-up) ==")
        for v in list(variants):
            try:
                print(f"{v:16s} {sanity(runner, v)}")
            except (BenchError, OSError, subprocess.TimeoutExpired) as e:
                if v in (UNTRACED, CORE):
                    raise
                print(f"{v:16s} cannot run here, dropped: {e}")
                variants.remove(v)
        sys.stdout.flush()

        points = [("files", n) for n in files_n] + [("rw", k) for k in rw_k]
        rounds = schedule(points, variants, reps, args.seed)
        results: dict[tuple[str, str, int], list[Sample]] = {}
        total = sum(len(r) for r in rounds)
        done, started = 0, time.monotonic()
        failed: dict[str, str] = {}
        for i, jobs in enumerate(rounds):
            for v, k, n in jobs:
                if v in failed:
                    continue
                try:
                    s = runner.run(v, k, n)
                except (BenchError, subprocess.TimeoutExpired) as e:
                    if v in (UNTRACED, CORE):
                        raise
                    failed[v] = str(e)
                    print(f"{v} failed, dropped from here on: {e}", file=sys.stderr)
                    continue
                results.setdefault((v, k, n), []).append(s)
                done += 1
            tty = sys.stderr.isatty()
            print(f"{chr(13) if tty else ''}  round {i + 1}/{len(rounds)}, {done}/{total} runs, "
                  f"{time.monotonic() - started:.0f} s", end="" if tty else "\n",
                  file=sys.stderr, flush=True)
        if sys.stderr.isatty():
            print(file=sys.stderr)
        for v, why in failed.items():
            print(f"\n{v}: dropped during the runs: {why}")
        variants = [v for v in variants if v not in failed]
        report(results, variants, files_n, rw_k, started)
        for note in runner.notes:
            print(f"note: {note}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def report(results, variants: list[str], files_n, rw_k, started: float) -> None:
    def reps_of(kind: str, n: int) -> str:
        counts = sorted({len(results.get((v, kind, n), [])) for v in variants})
        return "/".join(map(str, counts))

    # ---- raw medians
    for kind, xs, unit in (("files", files_n, "N"), ("rw", rw_k, "K")):
        print(f"\n== medians: {kind} {unit} (ms; e2e = spawn to exit, work = the workload's "
              f"own loop) ==")
        head = f"{unit:>6s} {'reps':>6s}"
        for v in variants:
            head += f" | {v + ' e2e':>19s} {'work':>8s}"
        print(head)
        for x in xs:
            row = f"{x:6d} {reps_of(kind, x):>6s}"
            for v in variants:
                ss = results[(v, kind, x)]
                row += f" | {med(ss, 'e2e') / 1e6:19.3f} {med(ss, 'work') / 1e6:8.3f}"
            print(row)

    # ---- startup breakdown at N=0
    summary: dict[str, dict[str, tuple[float, float]]] = {v: {} for v in variants}
    x0 = files_n[0]
    print(f"\n== startup: files {x0} (medians, ms; launch = spawn to main, exit = e2e - "
          f"launch - work) ==")
    print(f"{'variant':16s} {'e2e':>9s} {'launch':>9s} {'work':>9s} {'exit':>9s} "
          f"{'e2e added':>10s} {'launch added':>13s}")
    base = results[(UNTRACED, "files", x0)]
    for v in variants:
        ss = results[(v, "files", x0)]
        e2e, launch, work = (med(ss, a) / 1e6 for a in ("e2e", "launch", "work"))
        ex = statistics.median((s.e2e - s.launch - s.work) / 1e6 for s in ss)
        added = e2e - med(base, "e2e") / 1e6
        l_added = launch - med(base, "launch") / 1e6
        summary[v]["startup"] = (added, math.nan)
        summary[v]["startup_launch"] = (l_added, math.nan)
        print(f"{v:16s} {e2e:9.3f} {launch:9.3f} {work:9.3f} {ex:9.3f} "
              f"{added:+10.3f} {l_added:+13.3f}")

    # ---- fits
    for kind, xs, unit, key in (("files", files_n, "file", "per_file"),
                                ("rw", rw_k, "op", "per_rw")):
        print(f"\n== fit: {kind}: time = a + b * {'N' if kind == 'files' else 'K'} "
              f"(least squares through the medians; ± = standard error) ==")
        print(f"{'variant':16s} {'e2e a ms':>9s} {'e2e b µs/' + unit:>16s} "
              f"{'work b µs/' + unit:>16s} | {'added: a ms':>11s} {'b µs/' + unit:>14s} "
              f"{'work b':>13s} {'paired b':>13s}")
        fits = {}
        for v in variants:
            e = fit(list(xs), [med(results[(v, kind, x)], "e2e") for x in xs])
            w = fit(list(xs), [med(results[(v, kind, x)], "work") for x in xs])
            fits[v] = (e, w)
        ue, uw = fits[UNTRACED]
        for v in variants:
            e, w = fits[v]
            line = (f"{v:16s} {e.a / 1e6:9.3f} {pm(e.b / 1e3, e.se_b / 1e3, '{:.3f}'):>16s} "
                    f"{pm(w.b / 1e3, w.se_b / 1e3, '{:.3f}'):>16s}")
            if v != UNTRACED:
                db = (e.b - ue.b) / 1e3
                dse = math.hypot(e.se_b, ue.se_b) / 1e3
                dw = (w.b - uw.b) / 1e3
                dwse = math.hypot(w.se_b, uw.se_b) / 1e3
                # paired: per round, traced minus the untraced run of the same round
                pairs = []
                for x in xs:
                    t, u = results[(v, kind, x)], results[(UNTRACED, kind, x)]
                    pairs.append(
                        statistics.median(a.e2e - b.e2e for a, b in zip(t, u, strict=False))
                    )
                pf = fit(list(xs), pairs)
                line += (f" | {(e.a - ue.a) / 1e6:+11.3f} {pm(db, dse, '{:+.3f}'):>14s} "
                         f"{pm(dw, dwse, '{:+.3f}'):>13s} "
                         f"{pm(pf.b / 1e3, pf.se_b / 1e3, '{:+.3f}'):>13s}")
                summary[v][key] = (db, dse)
                summary[v][key + "_work"] = (dw, dwse)
            print(line)

    # ---- final table
    traced = [v for v in variants if v != UNTRACED]
    print("\n== summary: cost added by the tracer (traced - untraced, medians; "
          "e2e unless marked 'in-process') ==")
    rows = [
        ("startup ms (files 0, e2e)", "startup", f"<= {LIMIT_STARTUP_MS:g}", LIMIT_STARTUP_MS),
        ("startup ms (spawn to main)", "startup_launch", "", None),
        ("per file µs (e2e slope)", "per_file",
         f"<= {LIMIT_PER_FILE_US:g} (goal {GOAL_PER_FILE_US:g})", LIMIT_PER_FILE_US),
        ("per file µs (in-process)", "per_file_work", "", None),
        ("per read/write µs (e2e)", "per_rw", f"<= {LIMIT_PER_RW_US:g}", LIMIT_PER_RW_US),
        ("per read/write µs (in-proc)", "per_rw_work", "", None),
    ]
    head = f"{'metric':28s} {'limit':>16s}"
    for v in traced:
        head += f" | {v:>18s}"
    head += " | roar-core verdict"
    print(head)
    for label, key, limit_s, limit in rows:
        row = f"{label:28s} {limit_s:>16s}"
        for v in traced:
            val, se = summary[v].get(key, (math.nan, math.nan))
            row += f" | {pm(val, se, '{:+.3f}'):>18s}"
        val, se = summary[CORE][key]
        if limit is None:
            verdict = ""
        elif val <= limit:
            verdict = "PASS"
            if key == "per_file":
                verdict += " (goal met)" if val <= GOAL_PER_FILE_US else " (goal not met)"
        else:
            verdict = "FAIL" + (" (within 2 SE)" if not math.isnan(se) and val - 2 * se <= limit
                                else "")
        print(row + f" | {verdict}")
    la = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nloadavg {la} (at end); {time.monotonic() - started:.0f} s of runs")


def recorder_pids(directory: Path | None = None) -> list[int]:
    """roar's recorder processes alive now (of `directory` only, when given), from /proc."""
    needle = None if directory is None else os.fsencode(directory)
    pids = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                # (one title, words apart, for a recorder the fork server forked)
                argv = f.read().replace(b"\0", b" ").split()
        except OSError:
            continue
        if b"roar_core.recording.recorder" in argv and (needle is None or needle in argv):
            pids.append(int(pid))
    return pids


if __name__ == "__main__":
    sys.exit(main())
