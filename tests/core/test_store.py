"""Store tests, each run against SQLite and a real PostgreSQL server (see tests/conftest.py)."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import sqlite3
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event, inspect, text

from roar_core.pipeline import store as store_module
from roar_core.pipeline.store import (
    SCHEMA_HEAD,
    Access,
    CodeFile,
    Store,
    StoreError,
    TaskRun,
    WorkflowRun,
    _alembic_config,
    _normalize_url,
)
from roar_core.pipeline.store_schema import VERSION_TABLE, Base

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)


def digest(n: int) -> str:
    return "blake3:" + f"{n:064x}"


D0, D1, D2, D3 = (digest(n) for n in (0xD0, 0xD1, 0xD2, 0xD3))


@dataclass
class Where:
    """Where a test's store lives; `open()` may be called again (or in another process)."""

    url: str | None = None
    home: Path | None = None

    def open(self) -> Store:
        return Store.open(url=self.url, home=self.home)

    def sa_url(self) -> str:
        if self.url is not None:
            return _normalize_url(self.url).render_as_string(hide_password=False)
        return f"sqlite:///{self.home / 'lineage.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    if request.param == "sqlite":
        return Where(home=tmp_path / "roar-home" / ".roar")
    return Where(url=request.getfixturevalue("postgres_schema_url"))


@pytest.fixture
def store(where: Where):
    with where.open() as s:
        yield s


def task(store: Store, job: str, minute: int, **kw) -> str:
    run_id = str(uuid.uuid4())
    store.start_task_run(TaskRun(run_id, "cli", "test", job, T0 + timedelta(minutes=minute), **kw))
    return run_id


def finish(store: Store, run_id: str, minute: int, status: str = "COMPLETE") -> None:
    store.finish_task_run(run_id, status, T0 + timedelta(minutes=minute), exit_code=0)


def pipeline(store: Store, d: Path) -> dict[str, str]:
    """gen -> a.txt; cp a.txt b.txt; transform b.txt -> c.txt; report c.txt -> report.txt."""
    a, b, c, r = (str(d / n) for n in ("a.txt", "b.txt", "c.txt", "report.txt"))
    runs = {}
    steps = [
        ("gen", [], [(a, D1)]),
        ("cp", [(a, D1)], [(b, D1)]),
        ("transform", [(b, D1)], [(c, D2)]),
        ("report", [(c, D2)], [(r, D3)]),
    ]
    for minute, (job, ins, outs) in enumerate(steps):
        run_id = task(store, job, minute * 10)
        store.record_accesses(
            run_id,
            [Access(u, "input", dg, size=5) for u, dg in ins]
            + [Access(u, "output", dg, size=5, mtime_ns=1) for u, dg in outs],
        )
        finish(store, run_id, minute * 10 + 1)
        runs[job] = run_id
    return runs


# ---------------------------------------------------------------------------------------------


def test_migrates_empty_database_to_head_matching_models(where: Where) -> None:
    where.open().close()
    where.open().close()  # second open: already at head, nothing to do
    engine = create_engine(where.sa_url())
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            assert {
                "workflow_runs",
                "task_runs",
                "artifacts",
                "file_versions",
                "accesses",
            } <= tables
            ctx = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
            )
            head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
            assert ctx.get_current_revision() == head == SCHEMA_HEAD
            # The hand-written revision and store_schema.py must describe the same tables.
            assert compare_metadata(ctx, Base.metadata) == []
    finally:
        engine.dispose()


def test_opening_a_store_at_head_does_not_import_alembic(tmp_path: Path) -> None:
    home = tmp_path / "home"
    Store.open(home=home).close()
    code = ("import sys; from pathlib import Path; from roar_core.pipeline.store import Store; "
            f"Store.open(home=Path({str(home)!r})).close(); "
            "print('alembic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_database_from_a_newer_roar_is_refused(where: Where) -> None:
    where.open().close()
    engine = create_engine(where.sa_url())
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = 'fffffff'"))
    engine.dispose()
    with pytest.raises(StoreError, match="revision fffffff is unknown.*newer") as info:
        where.open()
    assert "\n" not in str(info.value)


def _open_and_write(where: Where, barrier, n: int) -> None:
    barrier.wait(timeout=30)
    with where.open() as s:
        s.start_workflow_run(WorkflowRun(f"wf-{n}", "cli", "test", f"job{n}", T0))


def test_concurrent_opens_of_a_new_database(where: Where) -> None:
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_open_and_write, args=(where, barrier, n)) for n in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    with where.open() as s:
        assert {s.workflow_run(f"wf-{n}").job_name for n in range(4)} == {
            "job0",
            "job1",
            "job2",
            "job3",
        }


def test_workflow_task_access_round_trip(store: Store) -> None:
    cest = timezone(timedelta(hours=2))
    store.start_workflow_run(
        WorkflowRun("wf", "snakemake", "ns", "pipeline", T0.astimezone(cest), facets={"x": 1})
    )
    run_id = str(uuid.uuid4())
    store.start_task_run(
        TaskRun(
            run_id,
            "snakemake",
            "ns",
            "pipeline.rule_a",
            T0 + timedelta(seconds=1),
            workflow_run_id="wf",
            engine_task_id="7",
            attempt=2,
            host="node1",
            pid=1234,
            command=["python", "a.py", "--token", "***"],
            code=[CodeFile("/src/a.py", D0)],
            environment={"python": "3.11"},
        )
    )
    rec = store.task_run(run_id)
    assert rec.status == "RUNNING" and rec.ended_at is None
    store.record_accesses(
        run_id,
        [
            Access("/data/in.csv", "input", D0.removeprefix("blake3:"), size=10),
            Access("s3://bucket/out/part-0.parquet", "output", D1, size=20, mtime_ns=5),
            Access("/data/old.csv", "deleted", None),
            Access("/tmp/scratch", "transient", None),
        ],
    )
    store.finish_task_run(
        run_id,
        "FAIL",
        T0 + timedelta(seconds=9),
        3,
        "boom",
        dropped_events=4,
        code=[CodeFile("/src/a.py", D0), CodeFile("/src/lib.py", D1)],
        traced=False,
        untraced_reason="ran a static binary",
    )
    store.finish_workflow_run("wf", "FAIL", T0 + timedelta(seconds=10))

    rec = store.task_run(run_id)
    assert (rec.status, rec.exit_code, rec.error_message, rec.dropped_events) == (
        "FAIL",
        3,
        "boom",
        4,
    )
    assert (rec.attempt, rec.host, rec.pid, rec.engine_task_id) == (2, "node1", 1234, "7")
    assert rec.started_at == T0 + timedelta(seconds=1) and rec.started_at.tzinfo is not None
    assert rec.command == ["python", "a.py", "--token", "***"]
    assert rec.code == [CodeFile("/src/a.py", D0), CodeFile("/src/lib.py", D1)]
    assert (rec.traced, rec.untraced_reason) == (False, "ran a static binary")
    assert rec.environment == {"python": "3.11"}
    wf = store.workflow_run("wf")
    assert (wf.status, wf.started_at, wf.facets) == ("FAIL", T0, {"x": 1})
    assert [r.run_id for r in store.task_runs(workflow_run_id="wf")] == [run_id]
    assert [r.run_id for r in store.task_runs(limit=1)] == [run_id]

    acc = store.accesses_of(run_id)
    assert [(a.uri, a.role, a.digest) for a in acc] == [
        ("/data/in.csv", "input", D0),
        ("s3://bucket/out/part-0.parquet", "output", D1),
        ("/data/old.csv", "deleted", None),
        ("/tmp/scratch", "transient", None),
    ]
    assert (acc[0].dataset_namespace, acc[0].dataset_name) == ("file", "/data/in.csv")
    assert (acc[1].dataset_namespace, acc[1].dataset_name) == ("s3://bucket", "out/part-0.parquet")
    out = store.latest_version("s3://bucket/out/part-0.parquet")
    assert (out.digest, out.size, out.mtime_ns, out.producer_run_id) == (D1, 20, 5, run_id)
    seen = store.latest_version("/data/in.csv")
    assert (seen.digest, seen.producer_run_id) == (D0, None)
    assert store.latest_version("/nowhere") is None


def test_a_task_started_and_ended_in_one_commit_keeps_every_field(store: Store) -> None:
    """A recorder stores a short task's start with its end (one row, written through the
    driver): the row reads back as `start_task_run` + `finish_task_run` would leave it."""
    run_id = str(uuid.uuid4())
    cest = timezone(timedelta(hours=2))
    started = TaskRun(run_id, "ray", "ns", "job.f", (T0 + timedelta(seconds=1)).astimezone(cest),
                      engine_task_id="t1", attempt=1, host="node2", pid=77,
                      command=["python", "-c", "x", "--password", "***"],
                      code=[CodeFile("/src/f.py", D0)], environment={"python": "3.12", "n": 2},
                      untraced_reason=None)
    recorded = store.finish_task_run(
        run_id, "COMPLETE", T0 + timedelta(seconds=2), 0, dropped_events=3, started=started,
        accesses=[Access("/d/in", "input", D1, size=4), Access("/d/out", "output", D2, size=6,
                                                              mtime_ns=9)])
    assert [(r.uri, r.role, r.digest) for r in recorded] == [("/d/in", "input", D1),
                                                            ("/d/out", "output", D2)]
    rec = store.task_run(run_id)
    assert (rec.status, rec.exit_code, rec.dropped_events, rec.error_message) == (
        "COMPLETE", 0, 3, None)
    assert rec.started_at == T0 + timedelta(seconds=1) and rec.started_at.tzinfo is not None
    assert rec.ended_at == T0 + timedelta(seconds=2)
    assert (rec.engine, rec.namespace, rec.job_name, rec.engine_task_id, rec.attempt,
            rec.host, rec.pid) == ("ray", "ns", "job.f", "t1", 1, "node2", 77)
    assert rec.command == ["python", "-c", "x", "--password", "***"]
    assert rec.code == [CodeFile("/src/f.py", D0)]
    assert rec.environment == {"python": "3.12", "n": 2}
    assert (rec.traced, rec.untraced_reason) == (True, None)
    assert store.latest_version("/d/out").producer_run_id == run_id


def test_untraced_runs_are_counted_by_reason_within_their_workflow_run(store: Store) -> None:
    for wf in ("wf1", "wf2"):
        store.start_workflow_run(WorkflowRun(wf, "ray", "ns", "job", T0))
    runs = [("wf1", True, None), ("wf1", False, "static binary"), ("wf1", False, "static binary"),
            ("wf1", False, None), ("wf1", False, "setuid"), ("wf2", False, "setuid")]
    for wf, traced, reason in runs:
        task(store, "job.f", 1, workflow_run_id=wf, traced=traced, untraced_reason=reason)
    assert store.untraced("wf1") == {"static binary": 2, "?": 1, "setuid": 1}
    assert store.untraced("wf2") == {"setuid": 1}
    assert store.untraced("none") == {}


def test_bulk_rows_store_timestamps_like_every_other_write(store: Store, where: Where) -> None:
    # Every row's statement runs on the driver's cursor: its timestamps must be converted
    # exactly as SQLAlchemy converts them (SQLite: naive UTC text).
    run_id = task(store, "bulk", 0)
    before = datetime.now(timezone.utc)
    store.finish_task_run(run_id, "COMPLETE", T0 + timedelta(minutes=1),
                          accesses=[Access("/data/bulk.txt", "output", D1, size=3, mtime_ns=1)])
    v = store.latest_version("/data/bulk.txt")
    assert v.recorded_at.tzinfo is not None and before <= v.recorded_at <= datetime.now(
        timezone.utc)
    engine = create_engine(where.sa_url())
    with engine.connect() as conn:
        recorded = conn.exec_driver_sql("SELECT recorded_at FROM file_versions").scalar_one()
        first_seen = conn.exec_driver_sql("SELECT first_seen FROM artifacts").scalar_one()
        started, ended = conn.exec_driver_sql(
            "SELECT started_at, ended_at FROM task_runs").one()
    engine.dispose()
    if engine.dialect.name == "sqlite":
        for raw in (recorded, first_seen, started, ended):
            assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}", raw), raw
    else:
        assert recorded.tzinfo is not None and first_seen.tzinfo is not None
    # The run's row (its start, then its end's update) read back as written.
    assert (store.task_run(run_id).started_at, store.task_run(run_id).ended_at) == (
        T0, T0 + timedelta(minutes=1))


def test_sqlite_timestamps_are_the_text_sqlalchemy_makes_of_them() -> None:
    """`UTCDateTime` converts a timestamp for SQLite in one step: the text of its UTC time
    exactly as SQLAlchemy's own two steps (the UTC time, then SQLite's DATETIME text)."""
    import random

    from sqlalchemy.dialects import sqlite as sqlite_dialect
    from sqlalchemy.types import TypeDecorator

    from roar_core.pipeline.store_schema import UTCDateTime

    dialect = sqlite_dialect.dialect()
    ours = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
    theirs = TypeDecorator.bind_processor(UTCDateTime().dialect_impl(dialect), dialect)
    rnd = random.Random(7)
    zones = [timezone.utc, timezone(timedelta(hours=5, minutes=30)),
             timezone(timedelta(hours=-11, seconds=17, microseconds=3))]
    values = [datetime(1, 1, 2, tzinfo=timezone.utc), datetime(999, 12, 31, 23, 59, 59, 999999,
                                                               tzinfo=zones[1]),
              T0, datetime.now(timezone.utc).replace(microsecond=0)]
    values += [datetime.fromtimestamp(rnd.uniform(-2e9, 6e10), rnd.choice(zones))
               for _ in range(2000)]
    for v in values:
        assert ours(v) == theirs(v), v
    assert ours(None) is theirs(None) is None
    for refused in (ours, theirs):
        with pytest.raises(ValueError, match="naive datetime"):
            refused(datetime(2026, 1, 1))


def test_a_task_with_thousands_of_files_keeps_every_row(store: Store) -> None:
    # More rows than one multi-row INSERT holds (SQLite), across roles, digests and NULLs;
    # a second reader of the same files moves their seen versions on (the upsert, per row).
    n = 1011
    reads = [Access(f"/in/{i:05d}", "input", digest(i), size=i, mtime_ns=i) for i in range(n)]
    writes = [Access(f"/out/{i:05d}", "output", digest(10**6 + i), size=i, mtime_ns=i)
              for i in range(n)]
    gone = [Access(f"/tmp/{i:05d}", "transient", None) for i in range(3)]
    first = task(store, "many", 0)
    many = []

    def seen_executemany(conn, cursor, statement, params, context, executemany) -> None:
        if executemany:
            many.append(statement)

    event.listen(store._engine, "before_cursor_execute", seen_executemany)
    store.finish_task_run(first, "COMPLETE", T0 + timedelta(minutes=1),
                          accesses=[*reads, *writes, *gone])
    event.remove(store._engine, "before_cursor_execute", seen_executemany)
    if store._engine.dialect.name == "sqlite":
        assert many == []  # every bulk write went in as multi-row statements
    got = store.accesses_of(first)
    assert [(a.uri, a.role, a.digest, a.size) for a in got] == [
        (a.uri, a.role, a.digest, a.size) for a in [*reads, *writes, *gone]]
    for a in (writes[0], writes[n // 2], writes[-1]):
        v = store.latest_version(a.uri)
        assert (v.digest, v.size, v.mtime_ns, v.producer_run_id) == (
            a.digest, a.size, a.mtime_ns, first)
    seen = store.latest_version(reads[-1].uri)
    second = task(store, "again", 2)
    store.finish_task_run(second, "COMPLETE", T0 + timedelta(minutes=3), accesses=reads)
    later = store.latest_version(reads[-1].uri)
    assert later.producer_run_id is None and later.last_seen_at > seen.last_seen_at
    assert len(store.accesses_of(second)) == n


def _in_database_file(home: Path, run_id: str) -> int:
    """The task's accesses that the database file itself holds: a copy of it alone, without
    its write-ahead log, is what checkpoints have copied so far (maybe not even the
    tables)."""
    copy = home.parent / "alone.db"
    copy.write_bytes((home / "lineage.db").read_bytes())
    try:
        with sqlite3.connect(copy) as db:
            if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'accesses'").fetchone():
                return 0
            return db.execute("SELECT count(*) FROM accesses WHERE task_run_id = ?",
                              (run_id,)).fetchone()[0]
    except sqlite3.DatabaseError:
        return -1  # copied while a checkpoint wrote it: look again
    finally:
        for p in home.parent.glob("alone.db*"):
            p.unlink()


@pytest.mark.parametrize("idle", [False, True])
def test_an_idle_checkpointed_store_leaves_big_commits_in_its_log(
        tmp_path: Path, idle: bool) -> None:
    # The commit that takes SQLite's log past 1,000 pages copies them into the database
    # before it returns; a recorder's store leaves that to its `checkpoint` between tasks.
    # The rows are the store's at the commit either way (in its log), for every reader.
    home = tmp_path / "roar-home"
    n = 5000
    with Store.open(home=home, idle_checkpoints=idle) as s:
        runs = []
        for k in range(2):
            writes = [Access(f"/out/{k}/{i:05d}.bin", "output", digest(k * 10**6 + i),
                             size=i, mtime_ns=i) for i in range(n)]
            runs.append(task(s, f"big{k}", 2 * k))
            s.finish_task_run(runs[-1], "COMPLETE", T0 + timedelta(minutes=2 * k + 1),
                              accesses=writes)
        # past one checkpoint's worth: without `idle`, the second commit did one
        assert (home / "lineage.db-wal").stat().st_size > 1000 * store_module.SQLITE_PAGE_SIZE
        with Store.open(home=home) as reader:
            assert [len(reader.accesses_of(r)) for r in runs] == [n, n]
        assert [_in_database_file(home, r) for r in runs] == ([0, 0] if idle else [n, n])
        s.checkpoint()
        assert [_in_database_file(home, r) for r in runs] == [n, n]
        small = task(s, "small", 9)
        s.finish_task_run(small, "COMPLETE", T0 + timedelta(minutes=10), accesses=writes[:3])
        assert _in_database_file(home, small) == 0  # below 1,000 pages: no commit copies
    assert _in_database_file(home, small) == 3  # the last connection closed: checkpointed


def _statements_sqlite_runs(monkeypatch) -> list[str]:
    """The statements SQLite itself runs, as it ran them, on the stores opened from now."""
    ran: list[str] = []
    made = store_module._sqlite_engine

    def engine(url, *args):
        e = made(url, *args)

        @event.listens_for(e, "connect")
        def _trace(dbapi_conn, _record) -> None:
            dbapi_conn.set_trace_callback(ran.append)

        return e

    monkeypatch.setattr(store_module, "_sqlite_engine", engine)
    return ran


def test_a_connections_first_big_task_compiles_no_statement_of_the_largest_size(
        tmp_path: Path, monkeypatch) -> None:
    # SQLite compiles a multi-row statement the first time a connection runs it, at more
    # per row than running it: a new recorder's first big task writes its rows in
    # statements of the next size, and a connection that wrote as many rows before (a
    # long-lived recorder) uses the largest.  Seen here: the statements SQLite itself ran.
    ran = _statements_sqlite_runs(monkeypatch)
    n = 5000
    largest = []
    with Store.open(home=tmp_path / "home") as s:
        for k in range(3):
            writes = [Access(f"/out/{k}/{i:05d}.bin", "output", digest(k * 10**6 + i),
                             size=i, mtime_ns=i) for i in range(n)]
            run_id = task(s, f"big{k}", k)
            ran.clear()
            s.finish_task_run(run_id, "COMPLETE", T0 + timedelta(minutes=k + 1),
                              accesses=writes)
            rows = [q.count("'output'") for q in ran if q.startswith("INSERT INTO accesses")]
            assert sum(rows) == n
            largest.append(max(rows))
            assert len(s.accesses_of(run_id)) == n
    # (Capped by the parameters a statement may hold: 999 where the driver cannot ask.)
    db = sqlite3.connect(":memory:")
    limit = (db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) if hasattr(db, "getlimit")
             else 999)
    most = limit // len(store_module._ACCESS.columns)
    first, later = store_module._STATEMENT_ROWS[1], store_module._STATEMENT_ROWS[0]
    assert largest == [min(first, most)] + [min(later, most)] * 2


def test_a_new_sqlite_store_uses_large_pages(tmp_path: Path) -> None:
    with Store.open(home=tmp_path / "new") as s:
        task(s, "t", 0)
    old = tmp_path / "old"
    old.mkdir()
    with sqlite3.connect(old / "lineage.db") as db:  # made by an earlier roar: 4 KiB pages
        db.execute("PRAGMA page_size = 4096")
        db.execute("PRAGMA journal_mode = WAL")
    with Store.open(home=old) as s:
        task(s, "t", 0)
    pages = [sqlite3.connect(d / "lineage.db").execute("PRAGMA page_size").fetchone()[0]
             for d in (tmp_path / "new", old)]
    assert pages == [store_module.SQLITE_PAGE_SIZE, 4096] and pages[0] > 4096


def test_bad_inputs_are_refused_with_clear_errors(store: Store) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        store.start_task_run(TaskRun("r", "cli", "ns", "j", datetime(2026, 1, 1)))
    with pytest.raises(StoreError, match="cannot record task run r"):
        store.start_task_run(TaskRun("r", "cli", "ns", "j", T0, workflow_run_id="missing"))
    with pytest.raises(StoreError, match="unknown task run nope"):
        store.record_accesses("nope", [Access("/x", "input", D0)])
    with pytest.raises(StoreError, match="unknown task run nope"):
        store.finish_task_run("nope", "COMPLETE", T0)
    run_id = task(store, "j", 0)
    with pytest.raises(ValueError, match="role"):
        store.record_accesses(run_id, [Access("/x", "read", D0)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="absolute"):
        store.record_accesses(run_id, [Access("rel/x", "input", D0)])
    with pytest.raises(ValueError, match="blake3"):
        store.record_accesses(run_id, [Access("/x", "input", "sha256:abc")])
    with pytest.raises(ValueError, match="status"):
        store.finish_task_run(run_id, "DONE", T0)
    assert store.accesses_of(run_id) == []  # nothing half-written


def test_producer_of_is_latest_output_with_that_content(store: Store, tmp_path: Path) -> None:
    runs = pipeline(store, tmp_path)
    prod = store.producer_of(D1)
    assert (prod.uri, prod.run_id, prod.job_name) == (str(tmp_path / "b.txt"), runs["cp"], "cp")
    older = store.producer_of(D1.removeprefix("blake3:"), exclude_run=runs["cp"])
    assert (older.uri, older.run_id) == (str(tmp_path / "a.txt"), runs["gen"])
    assert store.producer_of(D0) is None


def test_upstream_lineage_follows_content_across_a_copy(store: Store, tmp_path: Path) -> None:
    runs = pipeline(store, tmp_path)
    graph = store.lineage(str(tmp_path / "report.txt"))
    assert {r.run_id for r in graph.runs.values()} == set(runs.values())
    uris = {(a.uri, a.digest) for a in graph.artifacts.values()}
    assert uris == {
        (str(tmp_path / "a.txt"), D1),
        (str(tmp_path / "b.txt"), D1),
        (str(tmp_path / "c.txt"), D2),
        (str(tmp_path / "report.txt"), D3),
    }
    a_txt = f"artifact:{D1}:{tmp_path / 'a.txt'}"
    assert {(e.source, e.target, e.kind) for e in graph.edges} >= {
        (f"run:{runs['gen']}", a_txt, "output"),
        (a_txt, f"run:{runs['cp']}", "input"),
    }
    assert graph.root == f"artifact:{D3}:{tmp_path / 'report.txt'}"
    data = graph.to_dict()
    assert len(data["runs"]) == 4 and len(data["edges"]) == 7
    # depth counts runs: report and what it read, nothing above.
    shallow = store.lineage(str(tmp_path / "report.txt"), depth=1)
    assert [r.job_name for r in shallow.runs.values()] == ["report"]
    by_digest = store.lineage(D3)
    assert set(by_digest.runs) == set(graph.runs)
    assert json.loads(json.dumps(data)) == data
    unknown = store.lineage(str(tmp_path / "never-seen"))
    assert (unknown.root, unknown.runs, unknown.edges) == (None, {}, set())


def test_downstream_lineage_from_a_source_file(store: Store, tmp_path: Path) -> None:
    runs = pipeline(store, tmp_path)
    graph = store.lineage(str(tmp_path / "a.txt"), "downstream")
    assert {r.job_name for r in graph.runs.values()} == {"cp", "transform", "report"}
    a_txt = f"artifact:{D1}:{tmp_path / 'a.txt'}"
    # transform read b.txt (same content as a.txt): it hangs off cp's output, not off a.txt.
    assert {e.target for e in graph.edges if e.source == a_txt} == {f"run:{runs['cp']}"}
    assert f"artifact:{D3}:{tmp_path / 'report.txt'}" in graph.artifacts
    one = store.lineage(str(tmp_path / "a.txt"), "downstream", depth=1)
    assert {r.job_name for r in one.runs.values()} == {"cp"}


def test_every_reference_sqlite_does_not_check_points_to_a_row(tmp_path: Path) -> None:
    """SQLite's connections do not check foreign keys per row (the writer makes each row a
    reference points to first): the rows of every write path must still leave
    `PRAGMA foreign_key_check` with nothing to report."""
    home = tmp_path / "home"
    with Store.open(home=home) as s:
        s.start_workflow_run(WorkflowRun("wf-1", "snakemake", "test", "wf", T0))
        pipeline(s, tmp_path / "p")
        made = [Access(f"/big/{i:05d}", "output", digest(10**6 + i), size=i) for i in range(700)]
        read = [Access(f"/big/{i:05d}", "input", digest(10**6 + i), size=i) for i in range(700)]
        for k, accesses in enumerate((made, read + [Access("/big/new", "output", D0)])):
            run_id = str(uuid.uuid4())
            started = TaskRun(run_id, "snakemake", "test", f"big{k}", T0 + timedelta(minutes=k),
                              workflow_run_id="wf-1")
            with s.batch():  # (a recorder's path: the rows on the store's helper thread)
                s.finish_task_run(run_id, "COMPLETE", T0 + timedelta(minutes=k, seconds=1),
                                  accesses=accesses, started=started)
        s.set_recorder_mark("wf-1", "node-1", T0, False)
        s.finish_workflow_run("wf-1", "COMPLETE", T0 + timedelta(hours=1))
    db = sqlite3.connect(home / store_module.DB_FILENAME)
    try:
        assert db.execute("SELECT count(*) FROM accesses").fetchone()[0] > 1400
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        # (The check can see one: a version of a content no artifact row holds.)
        db.execute("INSERT INTO file_versions (uri, digest, recorded_at, last_seen_at) "
                   "VALUES ('/x', 'blake3:nope', '2026-01-01', '2026-01-01')")
        assert [r[0] for r in db.execute("PRAGMA foreign_key_check")] == ["file_versions"]
        db.rollback()
    finally:
        db.close()


def _accesses_indexes(where: Where) -> set[str]:
    engine = create_engine(where.sa_url())
    try:
        with engine.connect() as conn:
            return {ix["name"] for ix in inspect(conn).get_indexes("accesses")}
    finally:
        engine.dispose()


def test_a_store_of_the_last_schema_keeps_its_lineage_with_the_index_of_inputs(
        where: Where, tmp_path: Path) -> None:
    """Revision 0006 replaced the accesses' (digest, role) index by one of inputs' digests
    alone: a store written before it answers the same lineage after it, either way."""
    with where.open() as s:
        pipeline(s, tmp_path)
        before = (s.lineage(str(tmp_path / "a.txt"), "downstream"),
                  s.lineage(str(tmp_path / "report.txt")))
    engine = create_engine(where.sa_url())
    try:
        from alembic import command

        with engine.begin() as conn:
            cfg = _alembic_config()
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0005")
    finally:
        engine.dispose()
    assert {"ix_accesses_digest_role"} <= _accesses_indexes(where)
    assert "ix_accesses_input_digest" not in _accesses_indexes(where)
    with where.open() as s:  # migrated to head again
        after = (s.lineage(str(tmp_path / "a.txt"), "downstream"),
                 s.lineage(str(tmp_path / "report.txt")))
    indexes = _accesses_indexes(where)
    assert "ix_accesses_input_digest" in indexes and "ix_accesses_digest_role" not in indexes
    for old, new in zip(before, after, strict=True):
        assert (new.runs, new.artifacts, new.edges) == (old.runs, old.artifacts, old.edges)
    assert {r.job_name for r in after[0].runs.values()} == {"cp", "transform", "report"}


def test_downstream_lineage_looks_readers_up_in_the_index_of_inputs(
        tmp_path: Path, monkeypatch) -> None:
    # The index holds inputs only (outputs never pay for it): the readers of a content,
    # the one lookup of accesses by digest, must still be found through it, not a scan.
    ran = _statements_sqlite_runs(monkeypatch)
    with Store.open(home=tmp_path / "home") as s:
        pipeline(s, tmp_path)
        ran.clear()
        graph = s.lineage(str(tmp_path / "a.txt"), "downstream")
    assert {r.job_name for r in graph.runs.values()} == {"cp", "transform", "report"}
    readers = [q for q in ran if q.lstrip().startswith("SELECT") and "FROM accesses JOIN"
               in q.replace("\n", " ") and "accesses.digest IN" in q]
    assert readers, ran
    db = sqlite3.connect(tmp_path / "home" / store_module.DB_FILENAME)
    try:
        for q in readers:
            plan = " / ".join(row[-1] for row in db.execute("EXPLAIN QUERY PLAN " + q))
            assert "USING INDEX ix_accesses_input_digest" in plan, plan
    finally:
        db.close()


def test_read_modify_write_keeps_the_version_read(store: Store, tmp_path: Path) -> None:
    f = str(tmp_path / "f.json")
    writer = task(store, "init", 0)
    store.record_accesses(writer, [Access(f, "output", D0)])
    rmw = task(store, "bump", 5)
    store.record_accesses(rmw, [Access(f, "input", D0), Access(f, "output", D1)])
    assert [(a.role, a.digest) for a in store.accesses_of(rmw)] == [("input", D0), ("output", D1)]
    latest = store.latest_version(f)
    assert (latest.digest, latest.producer_run_id) == (D1, rmw)
    graph = store.lineage(f)
    assert {r.job_name for r in graph.runs.values()} == {"init", "bump"}
    assert (f"artifact:{D0}:{f}", f"run:{rmw}", "input") in {
        (e.source, e.target, e.kind) for e in graph.edges
    }


def test_input_copied_outside_roar_keeps_its_name_and_matches_as_an_inferred_edge(
    store: Store, tmp_path: Path
) -> None:
    runs = pipeline(store, tmp_path)
    c, manual = str(tmp_path / "c.txt"), str(tmp_path / "manual-copy.txt")  # `cp` by hand
    reader = task(store, "reader", 100)
    (rec,) = store.record_accesses(reader, [Access(manual, "input", D2, size=5)])
    # The match is returned for the recorder to publish, never stored as the identity.
    assert (rec.match.uri, rec.match.run_id) == (c, runs["transform"])
    (acc,) = store.accesses_of(reader)
    assert (acc.uri, acc.digest, acc.path_read) == (manual, D2, None)
    assert (acc.dataset_namespace, acc.dataset_name) == ("file", manual)
    up = store.lineage(manual, min_size=1)
    assert up.root == f"artifact:{D2}:{manual}"
    assert f"run:{runs['transform']}" in up.runs and f"run:{reader}" not in up.runs
    assert (f"artifact:{D2}:{c}", f"artifact:{D2}:{manual}", "inferred") in {
        (e.source, e.target, e.kind) for e in up.edges}
    # Downstream of the copy: its own readers, not c.txt's (`report`).
    down = store.lineage(manual, "downstream", min_size=1)
    assert down.root == f"artifact:{D2}:{manual}"
    assert {r.job_name for r in down.runs.values()} == {"reader"}
    # Downstream of c.txt: its reader, and the copy's reader through the inferred edge.
    down = store.lineage(c, "downstream", min_size=1)
    assert {r.job_name for r in down.runs.values()} == {"report", "reader"}
    # Too small to infer from (5 bytes here), or matching off: the copy has no producer.
    for min_size in (6, None):
        assert store.lineage(manual, min_size=min_size).runs == {}
        assert {r.job_name for r in store.lineage(c, "downstream", min_size=min_size)
                .runs.values()} == {"report"}


def test_a_readers_producers_are_the_same_through_the_driver_as_through_sqlalchemy(
    store: Store, tmp_path: Path
) -> None:
    """`latest_per_path` runs its statement on the driver's cursor for a few contents (its
    own parameters, times converted by hand) and through SQLAlchemy for many: both must
    find the same candidates, among versions written twice under one path, a run that
    started after the reader, one at the very microsecond it started, and its own."""
    from roar_core import lineage

    paths = [str(tmp_path / f"p{i}") for i in range(3)]
    at = T0 + timedelta(minutes=30, microseconds=123457)
    reader = str(uuid.uuid4())
    store.start_task_run(TaskRun(reader, "cli", "test", "reader", at))
    for minute, out in [(1, [(paths[0], D0), (paths[1], D0)]), (2, [(paths[0], D0)]),
                        (3, [(paths[2], D1)]), (40, [(paths[1], D1), (paths[0], D2)]),
                        (5, [(paths[1], D2)])]:
        run_id = task(store, f"w{minute}", minute)
        store.record_accesses(run_id, [Access(p, "output", d) for p, d in out])
    tie = str(uuid.uuid4())  # started at the reader's very start: a possible producer
    store.start_task_run(TaskRun(tie, "cli", "test", "tie", at))
    store.record_accesses(tie, [Access(paths[2], "output", D3)])
    store.record_accesses(reader, [Access(paths[1], "output", D3)])
    # The reader's start as another zone gives it: the same instant.
    there = at.astimezone(timezone(timedelta(hours=2)))
    everything = (D0, D1, D2, D3, digest(0xEE))

    def key(found: dict) -> list:
        return sorted((d, c.uri, c.version_id, c.run.run_id, c.run.started_at)
                      for d, cs in found.items() for c in cs)

    with store._transaction("test", write=False) as conn:
        for digests in [everything, (D0,), (D3,), (digest(0xEE),), (D1, D2)]:
            fast = lineage.latest_per_path(conn, digests, reader, there)
            slow = lineage._candidates(conn, lineage._LATEST_PER_PATH, digests,
                                       reader=reader, started_by=there)
            assert key(fast) == key(slow), digests
        found = lineage.latest_per_path(conn, everything, reader, there)
    # The later of two versions under one path; nothing from after the reader began, nor
    # from the reader; the run of the same microsecond.
    assert {(c.uri, c.run.job_name) for c in found[D0]} == {(paths[0], "w2"), (paths[1], "w1")}
    assert [c.run.job_name for c in found[D1]] == ["w3"]
    assert [c.run.job_name for c in found[D2]] == ["w5"]
    assert [(c.run.job_name, c.run.started_at) for c in found[D3]] == [("tie", at)]
    assert found[D3][0].run.started_at.tzinfo is not None


def test_unwritable_home_is_a_one_line_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError) as info:
        Store.open(home=blocker / ".roar")
    assert str(blocker / ".roar") in str(info.value) and "\n" not in str(info.value)


def test_read_only_home_is_a_one_line_store_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "ro"
    home.mkdir(mode=0o500)
    if os.geteuid() == 0:
        # Root writes through directory permissions; pretend the check sees what others would.
        monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != home)
    with pytest.raises(StoreError, match="not writable") as info:
        Store.open(home=home)
    assert str(home) in str(info.value) and "\n" not in str(info.value)


def test_unreachable_server_is_a_one_line_store_error() -> None:
    with pytest.raises(StoreError) as info:
        Store.open(url="postgresql://nobody:secret@127.0.0.1:1/none?connect_timeout=2")
    msg = str(info.value)
    assert "127.0.0.1:1/none" in msg and "secret" not in msg and "\n" not in msg


def test_sqlite_rows_go_in_as_statements_of_a_few_sizes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tasks of any number of files go into SQLite as multi-row statements of a few sizes
    (the connection keeps the last 128 statements it ran prepared, the longer the bigger):
    every row stored, in statements of the fixed sizes and, below the smallest, one of the
    rest's size."""
    statements: list[str] = []
    bulk_run = store_module._Bulk.run

    def counted(self, conn, rows, converted=()) -> None:
        raw = conn.connection.dbapi_connection
        raw.set_trace_callback(statements.append)
        try:
            bulk_run(self, conn, rows, converted)
        finally:
            raw.set_trace_callback(None)

    monkeypatch.setattr(store_module._Bulk, "run", counted)
    with Store.open(home=tmp_path / ".roar") as store:
        tasks = (1, 7, 100, 777, 1234, 2049, 3333, 4321, 5003)
        for n in tasks:
            run_id = str(uuid.uuid4())
            outputs = [Access(f"/out/{n}/{i:05d}", "output", digest(n * 10**5 + i), size=i)
                       for i in range(n)]
            with store.batch():
                store.finish_task_run(run_id, "COMPLETE", T0 + timedelta(minutes=1),
                                      accesses=outputs,
                                      started=TaskRun(run_id, "cli", "test", "job", T0))
            assert [a.uri for a in store.accesses_of(run_id)] == [a.uri for a in outputs]
    accesses = [sql for sql in statements if sql.startswith("INSERT INTO accesses")]
    sizes = {sql.count("), (") + 1 for sql in accesses}
    # Of 32 rows or more: a handful of sizes, whatever the tasks' (before: one per remainder)
    assert len({n for n in sizes if n >= 32}) <= 5, sorted(sizes)
    # A statement per chunk, never one per row (a build allowing 999 parameters per
    # statement, as Python 3.10's gives no way to ask for more: 90 rows of 11 columns)
    assert len(accesses) <= sum(tasks) // 50


def test_a_batch_is_one_commit_seen_by_its_own_readers_and_all_or_nothing(
        store: Store, where: Where, tmp_path: Path) -> None:
    """Many tasks' writes, one transaction: the batch's own reads see them, another
    connection sees them at the commit; one failing write leaves none of them."""
    f = str(tmp_path / "out.bin")
    other = where.open()
    try:
        with store.batch():
            writer = task(store, "writer", 0)
            store.finish_task_run(writer, "COMPLETE", T0 + timedelta(minutes=1),
                                  accesses=[Access(f, "output", D1)])
            assert store.latest_version(f).producer_run_id == writer  # its own reader
            assert other.task_run(writer) is None  # not committed yet
        assert other.task_run(writer).status == "COMPLETE"
        with pytest.raises(StoreError), store.batch():
            reader = task(store, "reader", 2)
            store.finish_task_run(reader, "COMPLETE", T0 + timedelta(minutes=3),
                                  accesses=[Access(f, "input", D1)])
            store.start_task_run(TaskRun(writer, "cli", "test", "duplicate", T0))  # exists
        assert store.task_run(reader) is None  # nothing of the failed batch
        assert [a.uri for a in store.accesses_of(writer)] == [f]
    finally:
        other.close()


def test_a_big_task_in_a_batch_is_written_beside_its_caller_and_fails_the_batch_with_it(
        store: Store, where: Where, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task of thousands of files recorded in a batch has its rows written on the store's
    helper thread while the caller goes on (making its accesses' records, then its events):
    its versions' rows, then its accesses'.  The batch's own reads and its commit wait for
    them, the rows are those a plain recording writes, and a failure of either fails the
    batch, which then stores nothing."""
    import threading

    n = 1200
    accesses = ([Access(f"/in/{i:05d}", "input", digest(i), size=i, mtime_ns=i)
                 for i in range(n // 2)]
                + [Access(f"/out/{i:05d}", "output", digest(10**6 + i), size=i, mtime_ns=i)
                   for i in range(n // 2)])
    writers: set[int] = set()
    versions: set[int] = set()
    # The rows' statements run on the driver's cursor (no SQLAlchemy event sees them):
    # where each runs, seen at its bulk statement.
    bulk_run = store_module._Bulk.run

    def seen(self, conn, rows, converted=()) -> None:
        if self is store_module._ACCESS:
            writers.add(threading.get_ident())
        elif self is store_module._PRODUCED_VERSION:
            versions.add(threading.get_ident())
        bulk_run(self, conn, rows, converted)

    with monkeypatch.context() as m:
        m.setattr(store_module._Bulk, "run", seen)
        plain = str(uuid.uuid4())
        store.finish_task_run(plain, "COMPLETE", T0 + timedelta(minutes=1), accesses=accesses,
                              started=TaskRun(plain, "cli", "test", "plain", T0))
        assert writers == versions == {threading.get_ident()}  # outside a batch: here
        writers.clear()
        versions.clear()
        other = where.open()
        try:
            with store.batch():
                big = str(uuid.uuid4())
                recorded = store.finish_task_run(
                    big, "COMPLETE", T0 + timedelta(minutes=3), accesses=accesses,
                    started=TaskRun(big, "cli", "test", "big", T0 + timedelta(minutes=2)))
                assert len(recorded) == n
                assert len(store.accesses_of(big)) == n  # its own reads wait for the rows
                assert other.task_run(big) is None  # not committed yet
            assert writers and threading.get_ident() not in writers  # the helper wrote them
            assert versions == writers
            assert other.task_run(big).status == "COMPLETE"
        finally:
            other.close()

    def rows(run_id: str) -> list[tuple]:
        return [(a.uri, a.role, a.digest, a.size, a.mtime_ns) for a in store.accesses_of(run_id)]

    assert rows(big) == rows(plain)
    for a in (accesses[-1], accesses[n // 2]):
        assert store.latest_version(a.uri).producer_run_id == big

    def broken(conn, rows, converted=()) -> None:
        from sqlalchemy.exc import OperationalError

        raise OperationalError("INSERT", {}, Exception("disk I/O error"))

    for statement in (store_module._ACCESS, store_module._PRODUCED_VERSION):
        with monkeypatch.context() as m:
            m.setattr(statement, "run", broken)
            failed = str(uuid.uuid4())
            with pytest.raises(StoreError, match="disk I/O error"), store.batch():
                store.finish_task_run(failed, "COMPLETE", T0 + timedelta(minutes=5),
                                      accesses=accesses,
                                      started=TaskRun(failed, "cli", "test", "failed", T0))
            assert store.task_run(failed) is None  # nothing of the failed batch
            assert not store.accesses_of(failed)
