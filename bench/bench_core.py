"""End-to-end cost of the core: `roar-core run` against the bare command (and `roar run`).

    python bench/bench_core.py [--reps 7] [--tmp DIR] [--roar-cli-venv V | env ROAR_CLI_VENV]
                               [--files 0,1000,5000] [--no-hash] [--recorder-up]
                               [--install NAME=VENV ...]

1. Startup: `roar-core run -- true` vs `true`.  `roar-core run` exits when the command has
   ended and leaves the run to the recorder process; the time until that recorder has
   stored the lineage is measured too (not part of the command's wall time, and the
   next sample starts only when it is done, so it never overlaps a timed run).  With
   `--install NAME=VENV`, the roar-core of that installation too, interleaved (e.g. a
   wheel of this checkout, as users install it: a dev venv's editable install adds its
   import finder, ~10-20 ms here, to every Python start).
2. The N-file workload end to end (trace + classify + hash + store + spool): `roar-core
   run --wait` (records in-process before exiting) vs untraced, N = 0, 1,000, 5,000,
   a fresh data dir and a fresh ROAR_HOME per run (cold stat cache).  Per-file cost =
   slope(traced) - slope(untraced).  The recorder starts as the command exits, while the
   runner takes the versions: a big run's capture hides that start, N = 0's cannot, so
   the slope leaves part of a fixed cost out.  `--recorder-up` also times each N with the
   recorder already running (a run before, untimed): the slope without that start.
   `--wait` returns once the lineage is stored and spooled; a backlog too big to send in a
   few ms goes to a background sender, whose delivery time is reported apart ("delivered
   after", waited for untimed).
3. Hashing throughput on a 1 GiB page-cached file vs the blake3 package's best single
   call (bench_hashing.bench_big).
4. With a roar-cli venv: `roar run true` and the N-file workload under `roar run`
   (preload backend, a fresh `roar init` per run) side by side.

Runs are interleaved (untraced, traced, peer, ...) and every number is a median.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import results  # noqa: E402
from bench_tracer import (  # noqa: E402
    build_workload,
    clean_env,
    find_peer,
    fit,
    recorder_pids,
)

ROOT = HERE.parent
ROAR_CORE = str(Path(sys.executable).parent / "roar-core")


def timed(cmd: list[str], env: dict[str, str], cwd: Path, outputs: int | None = None
          ) -> float:
    """Wall time of cmd.  `outputs`: `roar-core run --wait` must say it recorded that many
    (a data directory roar does not record, such as one under /dev, would make a figure
    of nothing)."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-500:]!r}")
    if outputs and f"outputs ({outputs}):".encode() not in p.stderr:
        raise SystemExit(f"{' '.join(cmd)} did not record its {outputs} outputs: "
                         f"{p.stderr[-500:]!r}")
    return dt


def wait_recorded(home: Path, timeout: float = 120.0) -> float:
    """Seconds until the background recorder has recorded the run (its task log is gone);
    then, untimed, until it has exited (it waits a moment for a next run first), so that
    it never shares the CPU with the next timed run."""
    sys.path.insert(0, str(ROOT))
    from roar_core import config
    from roar_core.recording import tasklog

    cfg = config.load(env={"ROAR_HOME": str(home)})
    t0 = time.perf_counter()
    took = None
    while time.perf_counter() - t0 < timeout:
        if took is None and not tasklog.log_paths(cfg.sessions_dir):
            took = time.perf_counter() - t0
        if took is not None and not background_recorders():
            return took
        time.sleep(0.005)
    raise SystemExit(f"the recorder did not finish within {timeout}s ({home})")


def wait_delivered(home: Path, timeout: float = 300.0) -> float:
    """Seconds until every spooled event of `home` is delivered (by the background sender
    `run --wait` hands a large backlog to) and no recorder process is left."""
    sys.path.insert(0, str(ROOT))
    from roar_core import config
    from roar_core.pipeline import spoolfiles

    cfg = config.load(env={"ROAR_HOME": str(home)})
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if (not os.path.isdir(cfg.spool_dir) or spoolfiles.pending_count(cfg.spool_dir) == 0) and \
                not background_recorders():
            return time.perf_counter() - t0
        time.sleep(0.005)
    raise SystemExit(f"events were not delivered within {timeout}s ({home})")


def background_recorders() -> list[int]:
    """Detached recorder processes still alive (one may still be exiting after its last
    delivery: the next timed run must not share the CPU with it)."""
    return recorder_pids()


def peer_run(peer, argv: list[str], env: dict[str, str], cwd: Path) -> list[str]:
    subprocess.run([str(peer.roar), "init", "--no-gitignore"], cwd=cwd, env=env,
                   capture_output=True, check=True)
    subprocess.run([str(peer.roar), "config", "set", "filters.ignore_tmp_files", "false"],
                   cwd=cwd, env=env, capture_output=True)
    return [str(peer.roar), "run", "--tracer", "preload", "--no-tracer-fallback", *argv]


def startup(args, base_env, peer, root: Path) -> dict[str, list[float]]:
    res: dict[str, list[float]] = {"true": [], "roar-core run": [], "recorded after": []}
    # Other installations (--install NAME=VENV), each in a home of its own, the order of
    # the installations turned round every other sample.
    others = [(f"roar-core run ({name})", str(Path(venv) / "bin" / "roar-core"))
              for name, _, venv in (x.partition("=") for x in args.install)]
    res.update((key, []) for key, _ in others)
    if peer:
        res["roar run"] = []
    true = shutil.which("true")
    for i in range(args.reps * 2):
        d = root / f"s{i}"
        d.mkdir()
        env = dict(base_env, ROAR_HOME=str(d / ".roar"))
        res["true"].append(timed([true], env, d))
        installs = [("roar-core run", ROAR_CORE), *others]
        for n, (key, exe) in enumerate(installs[::-1] if i % 2 else installs):
            home = d / f".roar-{n}" if key != "roar-core run" else d / ".roar"
            res[key].append(timed([exe, "run", "--", true], dict(env, ROAR_HOME=str(home)),
                                  d))
            recorded = wait_recorded(home)
            if key == "roar-core run":
                res["recorded after"].append(recorded)
        if peer:
            cmd = peer_run(peer, [true], env, d)
            res["roar run"].append(timed(cmd, env, d))
        shutil.rmtree(d, ignore_errors=True)
    return res


def files(args, base_env, peer, root: Path, workload: list[str]) -> dict[str, dict[int, list]]:
    variants = (["untraced", "roar-core run --wait"] + (["recorder up"] if args.recorder_up
                                                         else [])
                + (["roar run"] if peer else []))
    res: dict[str, dict[int, list[float]]] = {v: {n: [] for n in args.files}
                                              for v in [*variants, "delivered after"]}
    for rep in range(args.reps):
        for n in args.files:
            for v in variants:
                # roar-cli records ~75 files/s here: one rep, and only up to --peer-max-files.
                if v == "roar run" and (rep >= args.peer_reps or n > args.peer_max_files):
                    continue
                d = root / f"f{rep}-{n}-{v.split()[0]}"
                d.mkdir()
                env = dict(base_env, ROAR_HOME=str(d / ".roar"))
                cmd = [*workload, "files", str(n), str(d / "data")]
                if v == "recorder up":
                    # The home's recorder started and its store made by a run before, untimed
                    # (it waits RECORDER_IDLE_S for the next): the steady state of a session.
                    subprocess.run([ROAR_CORE, "run", "--wait", "--", "true"], env=env, cwd=d,
                                   capture_output=True, check=True)
                if v in ("roar-core run --wait", "recorder up"):
                    cmd = [ROAR_CORE, "run", "--wait", "--", *cmd]
                elif v == "roar run":
                    cmd = peer_run(peer, cmd, env, d)
                ours = v in ("roar-core run --wait", "recorder up")
                res[v][n].append(timed(cmd, env, d, n if ours else None))
                if ours:
                    # Not part of the timed run, and never overlapping the next one.
                    res["delivered after"][n].append(wait_delivered(d / ".roar"))
                shutil.rmtree(d, ignore_errors=True)
            print(f"  rep {rep + 1}/{args.reps} N={n} done", file=sys.stderr)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tmp", default=None, help="where data dirs go (default: a temp dir)")
    ap.add_argument("--roar-cli-venv", default=os.environ.get("ROAR_CLI_VENV"))
    ap.add_argument("--files", default="0,1000,5000")
    ap.add_argument("--no-hash", action="store_true", help="skip the 1 GiB hashing bench")
    ap.add_argument("--recorder-up", action="store_true",
                    help="also time each N with the home's recorder already running (a run "
                    "before it, untimed): per file without the recorder's start, which a big "
                    "run's capture hides and a small one's cannot")
    ap.add_argument("--install", action="append", default=[], metavar="NAME=VENV",
                    help="also time `roar-core run -- true` of another installation of "
                    "roar-core (a venv), interleaved: e.g. a wheel of this checkout, as "
                    "users install it (this venv's editable install adds its import "
                    "finder to every Python start)")
    ap.add_argument("--peer-max-files", type=int, default=1000)
    ap.add_argument("--peer-reps", type=int, default=1)
    ap.add_argument("--json", help="also write the raw numbers here (for bench/report)")
    args = ap.parse_args()
    args.files = [int(x) for x in args.files.split(",")]
    # As installed: where PYTHONDONTWRITEBYTECODE is set nothing would write roar's
    # bytecode, and every `roar-core run` would compile roar from source (~20 ms of it).
    compileall.compile_dir(ROOT / "roar_core", quiet=1)
    base_env = clean_env()
    peer, note = find_peer(args.roar_cli_venv, base_env)
    root = Path(tempfile.mkdtemp(prefix="roar-bench-core-", dir=args.tmp))
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(root)], capture_output=True,
                        text=True).stdout.strip()
    print("== machine ==")
    print(f"date     {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
    print(f"cpu      {os.cpu_count()} cpus; load {os.getloadavg()}")
    print(f"data     {root} ({fs})")
    print(f"peer     {peer.version if peer else note}")
    try:
        workload = build_workload("c", root)

        print("\n== 1. startup: `roar-core run -- true` vs `true` (ms, medians) ==")
        st = startup(args, base_env, peer, root)
        base = statistics.median(st["true"])
        for k, v in st.items():
            m = statistics.median(v)
            extra = "" if k in ("true", "recorded after") else f"   added {1e3 * (m - base):+8.1f}"
            print(f"  {k:<28} {1e3 * m:9.1f}{extra}   (n={len(v)})")
        added = statistics.median(st["roar-core run"]) - base
        print(f"  -> roar-core run adds {1e3 * added:.1f} ms (limit 100 ms)"
              + (f"; roar run adds {1e3 * (statistics.median(st['roar run']) - base):.0f} ms"
                 if peer else ""))

        print("\n== 2. N-file workload end to end (trace+hash+store+spool), ms medians ==")
        fr = files(args, base_env, peer, root, workload)
        ns = args.files
        def med(v: str, n: int) -> float:
            return statistics.median(fr[v][n]) if fr[v][n] else float("nan")

        print("  N      " + "".join(f"{v:>22}" for v in fr))
        for n in ns:
            print(f"  {n:<6} " + "".join(f"{1e3 * med(v, n):22.1f}" for v in fr))
        if len(ns) > 1:  # slopes need two sizes (--files 0: the fixed cost alone)
            slopes = {v: fit([n for n in ns if fr[v][n]], [med(v, n) for n in ns if fr[v][n]])
                      for v in fr if v != "delivered after"}
            base_b = slopes["untraced"].b
            for v, f in slopes.items():
                if v == "untraced":
                    continue
                print(f"  {v:<22} adds {1e6 * (f.b - base_b):7.1f} µs/file "
                      f"(±{1e6 * f.se_b:.1f}), "
                      f"intercept {1e3 * (f.a - slopes['untraced'].a):+.0f} ms")
            big = max(ns)
            per_file_big = (statistics.median(fr["roar-core run --wait"][big])
                            - statistics.median(fr["untraced"][big])
                            - statistics.median(fr["roar-core run --wait"][0])
                            + statistics.median(fr["untraced"][0])) / big
            print(f"  -> at N={big}: roar-core adds {1e6 * per_file_big:.1f} µs/file end to end "
                  "(limit 50)")
            # The same difference within each rep (its four runs ran minutes apart at most):
            # how much the figure above moves with the machine's drift.
            for v in ("roar-core run --wait", "recorder up"):
                if v not in fr:
                    continue
                paired = sorted((fr[v][big][i] - fr["untraced"][big][i] - fr[v][0][i]
                                 + fr["untraced"][0][i]) / big
                                for i in range(min(len(fr[v][big]), len(fr[v][0]))))
                if len(paired) >= 3:
                    q = statistics.quantiles(paired, n=4)
                    print(f"     {v}, per rep: median {1e6 * statistics.median(paired):.1f}, "
                          f"quartiles {1e6 * q[0]:.1f}-{1e6 * q[2]:.1f}, range "
                          f"{1e6 * paired[0]:.1f}-{1e6 * paired[-1]:.1f} µs/file "
                          f"({len(paired)} reps)")

        ms = lambda xs: [1e3 * x for x in xs]  # noqa: E731
        results.write(args.json, "core", "roar-core run, one command", [
            results.scenario("`roar-core run -- true`, wall time", "ms", ("true", ms(st["true"])),
                             [("roar-core run", ms(st["roar-core run"])),
                              ("roar run (roar-cli)", ms(st.get("roar run", [])))],
                             "the command exits; a recorder stores the run after it"),
            *[results.scenario(
                f"{n:,} files written, traced, hashed, stored and spooled", "ms",
                ("untraced", ms(fr["untraced"][n])),
                [("roar-core run --wait", ms(fr["roar-core run --wait"][n])),
                 ("roar run (roar-cli)", ms(fr.get("roar run", {}).get(n, [])))],
                "fresh data directory and roar home per run")
              for n in ns if n > 0],
        ])

        if not args.no_hash:
            print("\n== 3. hashing a 1 GiB page-cached file ==")
            sys.path.insert(0, str(ROOT))
            from bench_hashing import bench_big

            bench_big(root, 1 << 30, 5)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
