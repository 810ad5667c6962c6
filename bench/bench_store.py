"""A store that grows: big tasks recorded one after another into one SQLite store.

    python bench/bench_store.py [--tasks 8] [--files 5000] [--rounds 2] [--tmp DIR]
    python bench/bench_store.py --page-sizes 16384,8192 [--small 1000] [--rounds 3]
    python bench/bench_store.py --floor [--tasks 6] [--files 5000] [--rounds 3]
    python bench/bench_store.py --memory 160
    python bench/bench_store.py --statement-rows 2048,512,128,64,32 128,64,32 [--rounds 4]
    python bench/bench_store.py --checkpoints [--tasks 8] [--files 5000] [--small 1000]
    python bench/bench_store.py --earlier [--tasks 4] [--files 5000] [--rounds 10]
    python bench/bench_store.py --small-floor [--small 2000] [--batch 100] [--rounds 5]

Each task's end goes in as the recorder writes it (`Store.finish_task_run` in a batch: its
start row, its accesses, its versions), with random digests (every file new content).
Each round records the same sequence twice, interleaved: with roar's writer settings, and
with SQLite's default page cache (the baseline); it prints ms per task, in order, and
the ratio of the last half's medians.  What it shows: how a task's cost grows with the
store beneath it (the bench_core figures use a fresh store per run).

--floor: the same big tasks, interleaved with the rows roar writes for them (one artifact,
one file version and one access per file) inserted with roar's statements through sqlite3
itself (executemany, one transaction per task) into a store roar made, with all its
indexes and without the secondary ones (`ix_*`): per new file, what roar's store costs and
what SQLite itself costs for those rows -- the floor of the store's share of a task's
end-to-end figure.

--memory N: a long-lived recorder's store taking N tasks of as many sizes (600 files, 637, ...)
one after the other, in a process of its own: its size (RSS) after every 32 tasks, with
roar's statement sizes and, as the baseline, statements of up to 500 rows and one for the
rest (the driver keeps the statements it ran: one per remainder piled up).

--statement-rows: the same big tasks written with each list of rows per multi-row statement
(`_STATEMENT_ROWS`), the first the baseline, interleaved, a new store each; the medians of
the last half and of the first task (its connection's first: it compiles each statement
size it runs, the largest not before it has written as many rows).

--checkpoints: the same big tasks, and --small 2-file tasks committed one by one, with
SQLite's checkpoints in the commit that takes the log past 1,000 pages (the baseline), and
as a recorder's store (`idle_checkpoints`) checkpointed between tasks: after each big one,
after every 100 small ones (a busy recorder's CHECKPOINT_S); interleaved, a new store each.
Per task: what its commit path took (what an answer waits for) and, apart, the checkpoints.

--earlier: the same big tasks into roar's store as it was before revision 0006 (SQLite
checked each foreign key per row; every access, outputs too, went into a digest index), with
the keys checked alone, and as it is; interleaved, a new store each.

--small-floor: --small 2-file tasks (each reads the previous one's output), --batch of them a
transaction (a busy recorder's pass), with roar's store and, interleaved, with the same
statements run by sqlite3 itself on values it is given ready (the task's row, the latest
producer of what it read, its artifacts, versions and accesses): CPU per task (thread time),
what roar's Python costs above SQLite's own work for a small task's rows.

--page-sizes: the same sequence of big tasks, and --small tasks of 2 files each (one reads
the previous one's output) committed one by one as a recorder answering each task as it
ends does, into stores made with each page size, interleaved; per task medians (small:
the mean too, which holds the WAL checkpoints) and ratios to the first size.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import event  # noqa: E402

from roar_core.pipeline import store as S  # noqa: E402
from roar_core.pipeline.store_records import Access, TaskRun  # noqa: E402


def record(home: Path, tasks: int, files: int, default_cache: bool,
           checkpoints: list[float] | None = None, *, checked: bool = False,
           every_digest: bool = False) -> list[float]:
    """Seconds per task; `checkpoints`: the store checkpoints between tasks (as a recorder's
    does), each one's seconds appended there.  As roar's store was before: `checked`,
    SQLite checks each foreign key per row; `every_digest`, the accesses' digest index
    holds every access (0005's `(digest, role)`), not inputs alone."""
    made = S._sqlite_engine

    def engine(url, *args):
        e = made(url, *args)
        if default_cache or checked:
            @event.listens_for(e, "connect")
            def _default(dbapi_conn, _record) -> None:
                if default_cache:
                    dbapi_conn.execute("PRAGMA cache_size = -2000")  # SQLite's default
                if checked:
                    dbapi_conn.execute("PRAGMA foreign_keys = ON")
        return e

    if every_digest:
        S.Store.open(home=home).close()
        import sqlite3

        (path,) = home.glob("*.db")
        con = sqlite3.connect(path)
        con.execute("DROP INDEX ix_accesses_input_digest")
        con.execute("CREATE INDEX ix_accesses_digest_role ON accesses (digest, role)")
        con.commit()
        con.close()
    S._sqlite_engine = engine
    try:
        store = S.Store.open(home=home, idle_checkpoints=checkpoints is not None)
    finally:
        S._sqlite_engine = made
    took = []
    try:
        for t in range(tasks):
            run_id = f"0190b000-0000-7000-8000-{t:012d}"
            now = datetime.now(timezone.utc)
            accesses = [Access(uri=f"/data/t{t}/f{k:06d}", role="output",
                               digest="blake3:" + os.urandom(32).hex(), size=4096,
                               mtime_ns=1) for k in range(files)]
            t0 = time.perf_counter()
            with store.batch():
                store.finish_task_run(run_id, "COMPLETE", now, accesses=accesses,
                                      started=TaskRun(run_id, "cli", "bench", "job", now))
            took.append(time.perf_counter() - t0)
            if checkpoints is not None:
                _checkpoint(store, checkpoints)
    finally:
        store.close()
    return took


def _checkpoint(store: S.Store, took: list[float]) -> None:
    t0 = time.perf_counter()
    store.checkpoint()
    took.append(time.perf_counter() - t0)


def small(home: Path, tasks: int, checkpoints: list[float] | None = None) -> list[float]:
    """Seconds per task of `tasks` 2-file tasks, a commit each; `checkpoints`: as `record`'s,
    after every 100 tasks."""
    store = S.Store.open(home=home, idle_checkpoints=checkpoints is not None)
    took = []
    try:
        prev = None
        for t in range(tasks):
            run_id = f"0190c000-0000-7000-8000-{t:012d}"
            now = datetime.now(timezone.utc)
            out = Access(uri=f"/data/{t}.txt", role="output",
                         digest="blake3:" + os.urandom(32).hex(), size=64, mtime_ns=t)
            accesses = [out] if prev is None else [
                Access(uri=prev.uri, role="input", digest=prev.digest, size=64,
                       mtime_ns=prev.mtime_ns), out]
            t0 = time.perf_counter()
            with store.batch():
                store.finish_task_run(run_id, "COMPLETE", now, accesses=accesses,
                                      started=TaskRun(run_id, "cli", "bench", "job", now))
            took.append(time.perf_counter() - t0)
            prev = out
            if checkpoints is not None and t % 100 == 99:
                _checkpoint(store, checkpoints)
    finally:
        store.close()
    return took


def raw_rows(home: Path, tasks: int, files: int, secondary: bool) -> list[float]:
    """Seconds per task of the rows `record` has roar write, inserted with roar's statements
    through sqlite3's executemany into a store roar made (its schema, page size and
    connection settings); `secondary`: with its non-unique indexes, else dropped first."""
    import sqlite3

    from sqlalchemy.dialects import sqlite as sqlite_dialect

    def sql(bulk) -> str:
        return str(bulk.stmt.compile(dialect=sqlite_dialect.dialect()))

    artifact, version, access = sql(S._NEW_ARTIFACT), sql(S._PRODUCED_VERSION), sql(S._ACCESS)
    S.Store.open(home=home).close()  # the schema, as roar makes it
    (path,) = home.glob("*.db")
    con = sqlite3.connect(path, isolation_level=None)
    for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "foreign_keys = OFF",
                   f"cache_size = -{S.SQLITE_CACHE_KIB}"):
        con.execute(f"PRAGMA {pragma}")
    if not secondary:
        for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'index' "
                                   "AND name LIKE 'ix_%'").fetchall():
            con.execute(f"DROP INDEX {name}")
    took = []
    try:
        for t in range(tasks):
            run_id = f"0190b000-0000-7000-8000-{t:012d}"
            now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
            rows = [(f"/data/t{t}/f{k:06d}", "blake3:" + os.urandom(32).hex())
                    for k in range(files)]
            t0 = time.perf_counter()
            con.execute("BEGIN")
            con.execute(
                "INSERT INTO task_runs (run_id, engine, namespace, job_name, attempt, host, "
                "pid, started_at, status, command, code, environment, traced, "
                "dropped_events) VALUES (?, 'cli', 'bench', 'job', 0, 'h', 1, ?, 'COMPLETE', "
                "'[]', '[]', '{}', 1, 0)", (run_id, now))
            con.executemany(artifact, [(d, 4096, now) for _, d in rows])
            con.executemany(version, [(u, d, 4096, 1, run_id, now, now) for u, d in rows])
            con.executemany(access, [(run_id, u, d, "output", 4096, 1, None, "file", u, None,
                                      None) for u, d in rows])
            con.execute("COMMIT")
            took.append(time.perf_counter() - t0)
    finally:
        con.close()
    return took


def _small_accesses(t: int) -> list[Access]:
    """Task t's: it read task t-1's output, and wrote its own (a digest per number)."""
    def digest(n: int) -> str:
        return "blake3:" + f"{n * 7919 + 13:064x}"

    return [Access(f"/data/{t - 1}.txt", "input", digest(t - 1), 64, t - 1),
            Access(f"/data/{t}.txt", "output", digest(t), 64, t)]


def _cpu_per_task(run: Callable[[int], None], tasks: int) -> float:
    """CPU seconds per task of `run(first)`'s `tasks` tasks, after as many untimed."""
    run(1)
    t0 = time.thread_time()
    run(1 + tasks)
    return (time.thread_time() - t0) / tasks


def small_batched(home: Path, tasks: int, batch: int) -> float:
    """CPU seconds per task of `tasks` 2-file tasks, `batch` a transaction (after as many
    untimed, for a warm store)."""
    store = S.Store.open(home=home, idle_checkpoints=True)
    try:
        def run(first: int) -> None:
            for b in range(first, first + tasks, batch):
                with store.batch():
                    for t in range(b, b + batch):
                        run_id = f"0190d000-0000-7000-8000-{t:012d}"
                        now = datetime.now(timezone.utc)
                        store.finish_task_run(run_id, "COMPLETE", now,
                                              accesses=_small_accesses(t),
                                              started=TaskRun(run_id, "cli", "bench", "job", now))

        return _cpu_per_task(run, tasks)
    finally:
        store.close()


def small_raw(home: Path, tasks: int, batch: int) -> float:
    """`small_batched`'s statements (as roar compiles them for SQLite) run by sqlite3 on
    ready values, into a store roar made, with its connection settings."""
    import sqlite3

    from roar_core import lineage

    store = S.Store.open(home=home)
    with store._writer.connect() as conn:
        def rows(bulk: S._Bulk, n: int) -> str:
            head, group, tail = bulk._plan(conn).multirow
            return head + ", ".join([group] * n) + tail

        task, query = rows(S._NEW_TASK_RUN, 1), lineage._latest_of(1)._plan(conn)
        artifacts, seen = rows(S._NEW_ARTIFACT, 2), rows(S._SEEN_VERSION, 1)
        produced, access = rows(S._PRODUCED_VERSION, 1), rows(S._ACCESS, 2)
    store.close()
    (path,) = home.glob("*.db")
    con = sqlite3.connect(path, isolation_level=None)
    for pragma in ("synchronous = NORMAL", "foreign_keys = OFF", "wal_autocheckpoint = 0",
                   f"cache_size = -{S.SQLITE_CACHE_KIB}"):
        con.execute(f"PRAGMA {pragma}")
    columns = S._NEW_TASK_RUN.columns

    def run(first: int) -> None:
        for b in range(first, first + tasks, batch):
            con.execute("BEGIN IMMEDIATE")
            for t in range(b, b + batch):
                run_id = f"0190d000-0000-7000-8000-{t:012d}"
                now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
                values = {"run_id": run_id, "engine": "cli", "namespace": "bench",
                          "job_name": "job", "attempt": 0, "host": "h", "pid": 1,
                          "started_at": now, "ended_at": now, "status": "COMPLETE",
                          "command": "[]", "code": "[]", "environment": "{}", "traced": 1,
                          "dropped_events": 0}
                con.execute(task, tuple(values.get(c) for c in columns))
                read, wrote = _small_accesses(t)
                params = {**query.fixed, "digests_1": read.digest, "reader": run_id,
                          "started_by": now}
                con.execute(query.sql, tuple(params[n] for n in query.order)).fetchall()
                con.execute(artifacts, (read.digest, 64, now, wrote.digest, 64, now))
                con.execute(seen, (read.uri, read.digest, 64, read.mtime_ns, None, now, now))
                con.execute(produced, (wrote.uri, wrote.digest, 64, wrote.mtime_ns, run_id,
                                       now, now))
                con.execute(access, tuple(
                    x for a in (read, wrote) for x in (
                        run_id, a.uri, a.digest, a.role, 64, a.mtime_ns, None, "file", a.uri,
                        None, None)))
            con.execute("COMMIT")

    try:
        return _cpu_per_task(run, tasks)
    finally:
        con.close()


def small_floor(args: argparse.Namespace, root: Path) -> None:
    kinds = {"roar's store": small_batched, "sqlite3, same statements": small_raw}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for i, (name, run) in enumerate(kinds.items()):
            home = root / f"{r}-{i}"
            cpu[name].append(run(home, args.small, args.batch))
            shutil.rmtree(home)
        print(f"round {r + 1} done", file=sys.stderr)
    print(f"{args.small} tasks of 2 files, {args.batch} a transaction, after as many "
          f"untimed; {args.rounds} rounds: CPU us per task, median (each round), and the "
          f"median of the rounds' ratios to sqlite3's (steadier on a busy machine)")
    base = cpu["sqlite3, same statements"]
    for name, xs in cpu.items():
        ratio = statistics.median(x / b for x, b in zip(xs, base, strict=True))
        print(f"  {name:<26} {1e6 * statistics.median(xs):6.0f}  "
              f"({', '.join(f'{1e6 * x:.0f}' for x in xs)})   {ratio:.2f} x sqlite3's")


def floor(args: argparse.Namespace, root: Path) -> None:
    kinds = {"roar's store": lambda h: record(h, args.tasks, args.files, False),
             "sqlite3, same rows": lambda h: raw_rows(h, args.tasks, args.files, True),
             "sqlite3, no ix_* indexes": lambda h: raw_rows(h, args.tasks, args.files, False)}
    per_file: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for i, (name, run) in enumerate(kinds.items()):
            home = root / f"{r}-{i}"
            took = run(home)
            shutil.rmtree(home)
            per_file[name] += [x / args.files for x in took[1:]]  # (the first: an empty store)
        print(f"round {r + 1} done", file=sys.stderr)
    print(f"{args.tasks} tasks of {args.files:,} new files each, tasks 2-{args.tasks} of "
          f"{args.rounds} rounds: us per file, median (quartiles)")
    base = statistics.median(per_file["sqlite3, same rows"])
    for name, xs in per_file.items():
        q = statistics.quantiles(xs, n=4)
        print(f"  {name:<26} {1e6 * statistics.median(xs):6.2f} ({1e6 * q[0]:.2f}-"
              f"{1e6 * q[2]:.2f})   {statistics.median(xs) / base:.2f} x sqlite3's")


def memory(args: argparse.Namespace, root: Path) -> None:
    import subprocess

    for name, sizes in (("500 rows and the rest (baseline)", "500"), ("roar", "")):
        p = subprocess.run([sys.executable, __file__, "--memory-child", sizes, "--tasks",
                            str(args.memory), "--tmp", str(root)], capture_output=True,
                           text=True, check=True)
        print(f"{name:<33} RSS MiB after every 32 tasks: {p.stdout.strip()}")


def memory_child(args: argparse.Namespace, root: Path) -> None:
    if args.memory_child:
        S._STATEMENT_ROWS = tuple(int(x) for x in args.memory_child.split(","))
    store = S.Store.open(home=root / "memory")
    seen = []
    try:
        for t in range(args.tasks):
            run_id = f"0190d000-0000-7000-8000-{t:012d}"
            now = datetime.now(timezone.utc)
            accesses = [Access(uri=f"/data/t{t}/f{k:06d}", role="output",
                               digest="blake3:" + os.urandom(32).hex(), size=1, mtime_ns=1)
                        for k in range(600 + 37 * t)]
            with store.batch():
                store.finish_task_run(run_id, "COMPLETE", now, accesses=accesses,
                                      started=TaskRun(run_id, "cli", "bench", "job", now))
            del accesses
            if t % 32 == 31:
                with open("/proc/self/statm") as f:
                    seen.append(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20)
    finally:
        store.close()
    print(" ".join(f"{x:.0f}" for x in seen))


def checkpoints(args: argparse.Namespace, root: Path) -> None:
    kinds = ("in the commit (SQLite's default)", "between tasks (a recorder's store)")
    res = {k: {"small": [], "big": [], "small ckpt": [], "big ckpt": []} for k in kinds}
    for r in range(args.rounds):
        for i, k in enumerate(kinds if r % 2 == 0 else kinds[::-1]):
            idle = k == kinds[1]
            home = root / f"{r}-{i}"
            got = res[k]
            got["small"] += small(home / "small", args.small,
                                  got["small ckpt"] if idle else None)
            got["big"] += record(home / "big", args.tasks, args.files, False,
                                 got["big ckpt"] if idle else None)
            shutil.rmtree(home)
        print(f"round {r + 1} done", file=sys.stderr)
    med, mean = statistics.median, statistics.mean

    def line(xs: list[float], ck: list[float], n: int, unit: float) -> str:
        q = statistics.quantiles(xs, n=100, method="inclusive")
        return (f"median {unit * med(xs):7.1f}  mean {unit * mean(xs):7.1f}  p99 "
                f"{unit * q[98]:7.1f}  max {unit * max(xs):7.1f}  (+ checkpoints apart: "
                f"{unit * sum(ck) / n:.1f} per task)")

    print(f"checkpoints: {args.rounds} rounds, a new store each")
    for what, n, unit, name in (("small", args.small, 1e6, f"{args.small} tasks of 2 files "
                                 "(us per task)"),
                                ("big", args.tasks, 1e3, f"{args.tasks} tasks of "
                                 f"{args.files:,} new files (ms per task)")):
        print(f" {name}")
        for k in kinds:
            got = res[k]
            print(f"  {k:<36} {line(got[what], got[what + ' ckpt'], n * args.rounds, unit)}")


def page_sizes(args: argparse.Namespace, root: Path) -> None:
    sizes = [int(x) for x in args.page_sizes.split(",")]
    res: dict[int, dict[str, list[float]]] = {n: {"small": [], "big": []} for n in sizes}
    kept = S.SQLITE_PAGE_SIZE
    try:
        for r in range(args.rounds):
            for n in sizes:
                S.SQLITE_PAGE_SIZE = n  # what a new store is made with
                home = root / f"{r}-{n}"
                res[n]["small"] += small(home / "small", args.small)
                res[n]["big"] += record(home / "big", args.tasks, args.files, False)
                shutil.rmtree(home)
            print(f"round {r + 1} done", file=sys.stderr)
    finally:
        S.SQLITE_PAGE_SIZE = kept
    base = res[sizes[0]]
    print(f"page size   {args.small} tasks of 2 files, a commit each (us per task)   "
          f"{args.tasks} tasks of {args.files:,} files (ms per task)")
    med, mean = statistics.median, statistics.mean
    for n in sizes:
        sm, bg = res[n]["small"], res[n]["big"]
        print(f"{n:>9}   median {1e6 * med(sm):6.0f} ({med(sm) / med(base['small']):.2f} x), "
              f"mean {1e6 * mean(sm):6.0f} ({mean(sm) / mean(base['small']):.2f} x)"
              f"   median {1e3 * med(bg):7.1f} ({med(bg) / med(base['big']):.2f} x)")


def statement_rows(args: argparse.Namespace, root: Path) -> None:
    """The same big tasks with each list of statement sizes (the first: the baseline),
    interleaved, each into a new store: ms per task, its last half's medians."""
    lists = [tuple(int(x) for x in rows.split(",")) for rows in args.statement_rows]
    late: dict[tuple[int, ...], list[float]] = {rows: [] for rows in lists}
    first: dict[tuple[int, ...], list[float]] = {rows: [] for rows in lists}
    kept = S._STATEMENT_ROWS
    try:
        for r in range(args.rounds):
            for rows in lists if r % 2 == 0 else lists[::-1]:
                S._STATEMENT_ROWS = rows
                home = root / f"{r}-{len(rows)}"
                took = record(home, args.tasks, args.files, False)
                shutil.rmtree(home)
                late[rows] += took[len(took) // 2:]
                first[rows].append(took[0])
            print(f"round {r + 1} done", file=sys.stderr)
    finally:
        S._STATEMENT_ROWS = kept
    base = statistics.median(late[lists[0]])
    base_first = statistics.median(first[lists[0]])
    print(f"{args.tasks} tasks of {args.files:,} new files each, a store per list and round "
          f"({args.rounds} rounds); median ms per task of the last half of each sequence, "
          "and of its first task (a new connection: every statement size compiled):")
    for rows in lists:
        m, f = statistics.median(late[rows]), statistics.median(first[rows])
        print(f"  statements of {','.join(map(str, rows)):<22} {1e3 * m:7.1f} ms"
              f"  ({m / base:.2f} x)   first {1e3 * f:7.1f} ms  ({f / base_first:.2f} x)")


def earlier(args: argparse.Namespace, root: Path) -> None:
    """The same big tasks into roar's store as it was before 0006 (the baseline: foreign
    keys checked per row, every access in the digest index), with the keys checked alone,
    and as it is; interleaved, a new store each: medians of the first task (a new store's,
    what `roar-core run --wait` pays) and of the rest."""
    kinds = {"before: keys checked, every access's digest indexed": dict(checked=True,
                                                                         every_digest=True),
             "keys checked, inputs' digests indexed": dict(checked=True),
             "roar's store": {}}
    first: dict[str, list[float]] = {k: [] for k in kinds}
    rest: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for i, name in enumerate(kinds if r % 2 == 0 else list(kinds)[::-1]):
            home = root / f"{r}-{i}"
            took = record(home, args.tasks, args.files, False, **kinds[name])
            shutil.rmtree(home)
            first[name].append(took[0])
            rest[name] += took[1:]
        print(f"round {r + 1} done", file=sys.stderr)
    base = list(kinds)[0]
    b_first, b_rest = statistics.median(first[base]), statistics.median(rest[base])
    print(f"{args.tasks} tasks of {args.files:,} new files each, a store per kind and round "
          f"({args.rounds} rounds): median ms per task, and us per file less than before")
    for name in kinds:
        f, m = statistics.median(first[name]), statistics.median(rest[name])
        print(f"  {name:<54} first {1e3 * f:6.1f} ({1e6 * (b_first - f) / args.files:5.2f})"
              f"   later {1e3 * m:6.1f} ({1e6 * (b_rest - m) / args.files:5.2f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--page-sizes", metavar="N,N...",
                    help="compare new stores made with these page sizes (the first: baseline)")
    ap.add_argument("--small", type=int, default=1000,
                    help="with --page-sizes, --checkpoints, --small-floor: 2-file tasks "
                         "per round")
    ap.add_argument("--small-floor", action="store_true",
                    help="small tasks in batches: roar's store against sqlite3 running the "
                         "same statements, CPU per task")
    ap.add_argument("--batch", type=int, default=100,
                    help="with --small-floor: tasks per transaction")
    ap.add_argument("--checkpoints", action="store_true",
                    help="checkpoints in the commit against between tasks (a recorder's)")
    ap.add_argument("--floor", action="store_true",
                    help="roar's store against sqlite3 inserting the same rows, per file")
    ap.add_argument("--memory", type=int, metavar="N",
                    help="a long-lived store's size over N tasks of as many sizes")
    ap.add_argument("--memory-child", metavar="ROWS", help=argparse.SUPPRESS)
    ap.add_argument("--earlier", action="store_true",
                    help="roar's store against itself as it was before revision 0006")
    ap.add_argument("--statement-rows", nargs="+", metavar="N,N...",
                    help="compare these lists of rows per statement (the first: baseline)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="roar-bench-store-", dir=args.tmp))
    mode = (page_sizes if args.page_sizes else floor if args.floor else memory if args.memory
            else memory_child if args.memory_child is not None
            else statement_rows if args.statement_rows
            else checkpoints if args.checkpoints else earlier if args.earlier
            else small_floor if args.small_floor else None)
    if mode is not None:
        try:
            mode(args, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return 0
    late = {"roar": [], "SQLite default cache": []}
    try:
        for r in range(args.rounds):
            for name, default in (("SQLite default cache", True), ("roar", False)):
                home = root / f"{r}-{default}"
                took = record(home, args.tasks, args.files, default)
                shutil.rmtree(home)
                late[name] += took[len(took) // 2:]
                print(f"round {r + 1} {name:<21} ms per task: "
                      + " ".join(f"{1e3 * x:.1f}" for x in took))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(late["SQLite default cache"])
    ours = statistics.median(late["roar"])
    print(f"last half of each sequence, median: default {1e3 * base:.1f} ms, roar "
          f"{1e3 * ours:.1f} ms ({ours / base:.2f} x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
