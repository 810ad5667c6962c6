"""Lineage store: runs, content-addressed artifacts, file versions and accesses.

SQLite (WAL) under the roar home by default, PostgreSQL when a URL is given. The schema is
owned by the Alembic revisions in `roar_core/migrations/`, applied by `Store.open` under a lock
so that many workers may open one database at once. Digests are stored as "blake3:<64 hex>",
the same string OpenLineage's dataset version facet carries.

Every database failure surfaces as `StoreError` with a one-line message, so callers (which must
never fail the user's job over lineage) have one exception to catch and log.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, NamedTuple
from urllib.parse import quote

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    Table,
    TextClause,
    bindparam,
    create_engine,
    event,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from roar_core import lineage as _lineage
from roar_core.lineage import LineageGraph
from roar_core.pipeline.direct import Direct, bind_processors
from roar_core.pipeline.store_records import (
    ROLES,
    STATUSES,
    Access,
    AccessRecord,
    CodeFile,
    FileVersion,
    ProducedFile,
    Role,
    Status,
    StoreError,
    TaskRun,
    TaskRunRecord,
    WorkflowRun,
    WorkflowRunRecord,
    canonical_digest,
    check_aware,
    check_status,
    checked_accesses,
    code_json,
    dataset_identity,
)
from roar_core.pipeline.store_schema import (
    VERSION_TABLE,
    AccessRow,
    ArtifactRow,
    FileVersionRow,
    ProvenanceFactsRow,
    RecorderMarkRow,
    TaskRunRow,
    WorkflowRunRow,
)

__all__ = [
    "ROLES",
    "STATUSES",
    "Access",
    "AccessRecord",
    "CodeFile",
    "FileVersion",
    "LineageGraph",
    "ProducedFile",
    "Role",
    "Status",
    "Store",
    "StoreError",
    "TaskRun",
    "TaskRunRecord",
    "WorkflowRun",
    "WorkflowRunRecord",
    "canonical_digest",
    "dataset_identity",
]

DB_FILENAME = "lineage.db"
MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"
# Writers queue behind each other in SQLite; a whole node's workers may be finishing tasks at
# once, so wait long rather than drop a record.
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Arbitrary constant shared by every roar process: serialises migrations on one PostgreSQL DB.
PG_MIGRATION_LOCK = 0x726F6172_6D696772  # "roarmigr"


def _one_line(exc: BaseException) -> str:
    inner = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = [ln.strip() for ln in str(inner).splitlines() if ln.strip()]
    return lines[0] if lines else type(inner).__name__


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


# ---------------------------------------------------------------------------------------------
# Engines and migrations

# Pooled connections must not be shared with a forked child (Airflow runs every task in a fork
# of its worker): the child drops its inherited pool without closing the parent's sockets.
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def _forget_pools_after_fork() -> None:
    for engine in list(_ENGINES):
        engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools_after_fork)


def _prepare_home(home: Path) -> Path:
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create roar home {home}: {exc.strerror or exc}") from exc
    if not os.access(home, os.W_OK | os.X_OK):
        raise StoreError(f"roar home {home} is not writable")
    return home / DB_FILENAME


# Every page a commit dirties goes to the WAL whole, and a small task dirties a page in
# most tables and indexes.  `bench/bench_store.py --page-sizes 16384,8192`: a 2-file task
# committed alone 16-33 % cheaper with 8 KiB pages than with 16 KiB, a 5,000-file task the
# same (0.99 x over 6 rounds; single rounds 0.89-1.26 x); 4 KiB no better for the first
# and slower for the second.  Only a new store takes it.
SQLITE_PAGE_SIZE = 8192
# The writer's page cache, KiB (SQLite's default: 2,000). A task's thousands of rows land on
# index pages spread over the whole store (digests are random): with the default, a grown
# store's pages are evicted and read again within one task. Measured, 5,000-file tasks into
# one store (`bench/bench_store.py`): the 8th took 127-134 ms with the default, 82-86 with
# 16 MiB (64 MiB: no better at that size); the first, into a fresh store, 55 ms with both.
SQLITE_CACHE_KIB = 16384


def _ensure_wal(cur: sqlite3.Cursor) -> None:
    """Switch a new database to WAL; the mode is persistent, so later opens only read it.

    The switch needs an exclusive lock and SQLite does not run the busy handler for it: when
    several processes create the database at once the losers get "database is locked" at once,
    so they retry until the winner's switch is visible.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cur.execute("PRAGMA journal_mode = WAL").fetchone()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))


def _sqlite_engine(url: URL, idle_checkpoints: bool = False) -> Engine:
    engine = create_engine(url)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control from the sqlite3 module so BEGIN IMMEDIATE is possible.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        # Takes effect only while the file is still empty, so only new stores get it: a task's
        # thousands of rows touch (and commit to the WAL) a quarter of the pages of 4 KiB.
        cur.execute(f"PRAGMA page_size = {SQLITE_PAGE_SIZE}")
        cur.execute(f"PRAGMA cache_size = -{SQLITE_CACHE_KIB}")  # allocated as used
        _ensure_wal(cur)
        # In WAL mode NORMAL stays consistent after a crash; only the last commits may be lost.
        cur.execute("PRAGMA synchronous = NORMAL")
        # Declared, not checked per row: SQLite's check is a parent lookup per reference,
        # ~17 % of a 5,000-file task's store time (measured alternated).  The writer makes
        # each row a reference points to first, in the same transaction (a task's run row
        # and its artifacts before its versions and accesses); the one reference a caller
        # gives, a task's workflow run, is looked up (`_new_task_run`); PostgreSQL checks
        # them all, and the tests check every SQLite store they leave.  (Set per connection,
        # never toggled: the pragma makes SQLite compile its prepared statements again.)
        cur.execute("PRAGMA foreign_keys = OFF")
        if idle_checkpoints:
            # The commit that takes the WAL past 1,000 pages copies them all into the
            # database (fsyncs included) before it returns: ~10 of the ~20 ms of a
            # 5,000-file task's commit on tmpfs, on the path to its answer.  The owner
            # checkpoints between tasks instead (`Store.checkpoint`).
            cur.execute("PRAGMA wal_autocheckpoint = 0")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Writers take the lock up front: a deferred transaction that later tries to write
        # fails at once with SQLITE_BUSY (no busy wait) when another writer got in first.
        mode = conn.get_execution_options().get("roar_sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def connect_read_only(path: str | Path) -> sqlite3.Connection:
    """A connection that writes nothing: `mode=ro`, or, where SQLite cannot read a WAL
    database that way (its -shm file is gone and cannot be made in a read-only directory),
    `immutable=1`, which reads the file as it is."""
    uri = "file:" + quote(str(path))
    conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        conn.close()
    return sqlite3.connect(f"{uri}?immutable=1", uri=True, check_same_thread=False)


def _sqlite_reader(url: URL) -> Engine:
    engine = create_engine("sqlite://", creator=functools.partial(connect_read_only,
                                                                  url.database))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        dbapi_conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        dbapi_conn.execute("PRAGMA query_only = ON")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN DEFERRED")

    return engine


def _normalize_url(url: str) -> URL:
    parsed = make_url(url)
    # "postgresql://" means psycopg2 to SQLAlchemy; psycopg 3 is what roar-core[postgres] ships.
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


# The revision `roar_core/migrations/` ends at (a test keeps the two equal).  Checked before
# Alembic is imported: every process that opens the store would otherwise pay ~0.1 s of
# imports to learn that there is nothing to migrate.
SCHEMA_HEAD = "0006"


def _alembic_config() -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def _current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        if not inspect(conn).has_table(VERSION_TABLE):
            return None
        return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def _check_head(engine: Engine) -> None:
    current = _current_revision(engine)
    if current != SCHEMA_HEAD:
        raise StoreError(f"schema revision {current} is not this roar-core's ({SCHEMA_HEAD}) "
                         "and a store that cannot be written cannot be migrated")


def _migrate(engine: Engine, writer: Engine) -> None:
    if _current_revision(engine) == SCHEMA_HEAD:
        return
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    cfg = _alembic_config()
    scripts = ScriptDirectory.from_config(cfg)
    head = scripts.get_current_head()
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        current = ctx.get_current_revision()
    if current == head:
        return
    if current is not None and current not in {s.revision for s in scripts.walk_revisions()}:
        raise StoreError(
            f"schema revision {current} is unknown to this roar-core (written by a newer one?)"
        )
    with writer.connect() as conn, conn.begin():
        # Whoever gets the lock first migrates; the others then find the schema at head.
        if conn.dialect.name == "postgresql":
            conn.execute(select(func.pg_advisory_xact_lock(PG_MIGRATION_LOCK)))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


# ---------------------------------------------------------------------------------------------
# The store


class Store:
    """Use `Store.open`; one instance per process is enough (it pools connections)."""

    def __init__(self, engine: Engine, writer: Engine, where: str,
                 wal: str | None = None) -> None:
        self._engine = engine
        self._writer = writer
        self._where = where
        self._wal = wal  # SQLite's write-ahead log, where its owner checkpoints it
        self._checkpointed: tuple[int, int] | None = None  # the log's state then
        self._batch = threading.local()  # .conn: this thread's open batch, if any
        # (.writing: a batch's writes queued on the helper thread, see `_write_later`)
        self._helper: ThreadPoolExecutor | None = None
        self._helper_pid = 0

    @classmethod
    def open(cls, url: str | None = None, home: Path | None = None,
             read_only: bool = False, idle_checkpoints: bool = False) -> Store:
        """Open (creating and migrating to head if needed) the store at `url`, else at
        `<home>/lineage.db`. Safe to call from many processes at once.  `read_only`: for
        reading an existing store whose home cannot be written (a read-only mount, another
        user's); nothing is created, set or migrated.  `idle_checkpoints` (SQLite): no
        commit checkpoints the write-ahead log, the caller does, with `checkpoint`, when
        no task waits (a recorder between passes); closing does too."""
        if url is None:
            if home is None:
                raise StoreError("no store location: pass a database URL or a roar home")
            path = Path(home) / DB_FILENAME if read_only else _prepare_home(Path(home))
            db_url = URL.create("sqlite", database=str(path))
            where = str(path)
        else:
            db_url = _normalize_url(url)
            where = db_url.render_as_string(hide_password=True)
        try:
            if db_url.get_backend_name() == "sqlite":
                engine = (_sqlite_reader(db_url) if read_only
                          else _sqlite_engine(db_url, idle_checkpoints))
                writer = engine.execution_options(roar_sqlite_begin="IMMEDIATE")
            else:
                # Long-lived workers outlive server-side idle timeouts.
                engine = writer = create_engine(db_url, pool_pre_ping=True)
        except (SQLAlchemyError, ImportError) as exc:
            raise StoreError(f"cannot open lineage store at {where}: {_one_line(exc)}") from exc
        try:
            if read_only:
                _check_head(engine)
            else:
                _migrate(engine, writer)
        except StoreError as exc:
            engine.dispose()
            raise StoreError(f"cannot open lineage store at {where}: {exc}") from None
        except (SQLAlchemyError, OSError) as exc:
            engine.dispose()
            raise StoreError(f"cannot open lineage store at {where}: {_one_line(exc)}") from exc
        except Exception as exc:  # Alembic's CommandError, without importing Alembic to catch it
            if type(exc).__name__ != "CommandError":
                raise
            engine.dispose()
            raise StoreError(f"cannot open lineage store at {where}: {_one_line(exc)}") from exc
        _ENGINES.add(engine)
        wal = (f"{db_url.database}-wal" if idle_checkpoints and not read_only
               and db_url.get_backend_name() == "sqlite" else None)
        return cls(engine, writer, where, wal)

    def close(self) -> None:
        self._engine.dispose()

    def reconnect(self) -> None:
        """Let the pooled connections go: the next statement opens the store afresh.  A
        store mended behind this process's back (a backup put back over a damaged one) is
        then read as it is, not through a connection's pages and index of the damaged one."""
        self._engine.dispose()

    def checkpoint(self) -> None:
        """Copy what the write-ahead log holds into the database, if anything was written
        since the last time (`idle_checkpoints`; else nothing to do).  Passive: waits for
        no reader or writer, and what a reader still needs stays for the next one."""
        if self._wal is None:
            return
        try:
            st = os.stat(self._wal)
        except OSError:
            return  # none: every connection closed, which checkpointed
        state = (st.st_mtime_ns, st.st_size)
        if state == self._checkpointed:
            return
        with self._errors_as("cannot checkpoint the store"):
            raw = self._writer.raw_connection()
            try:
                raw.driver_connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            finally:
                raw.close()
        self._checkpointed = state

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self._where!r})"

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Every call this thread makes inside is part of one transaction, committed at the
        end: all of them or, on any error, none (then the caller makes them one by one).
        Readers on this thread see the batch's writes, others see them at the commit.  A
        recorder catching up with many short tasks commits once, not once a task
        (SQLite: a commit per task wrote its few rows' pages, 16 KiB each, to the WAL)."""
        if getattr(self._batch, "conn", None) is not None:
            yield  # inside another batch: that one commits
            return
        with self._errors_as("cannot record"), self._writer.begin() as conn:
            self._batch.conn = conn
            try:
                yield
                self._settle()  # its rows written, before the commit
            finally:
                self._batch.conn = None
                self._settle(quiet=True)  # on an error: before the rollback

    @contextmanager
    def _transaction(self, what: str, *, write: bool) -> Iterator[Connection]:
        # Core connections, not ORM sessions: the unit-of-work machinery costs more than the
        # few statements each call runs, and every call is one short transaction anyway.
        batch = getattr(self._batch, "conn", None)
        if batch is not None:
            self._settle()  # the connection is ours again
            yield batch  # an error fails the whole batch, which says so
            return
        with self._errors_as(what), (self._writer if write else self._engine).begin() as conn:
            yield conn

    @contextmanager
    def _errors_as(self, what: str) -> Iterator[None]:
        """Database errors as one-line StoreErrors saying `what` failed (and where)."""
        # The driver's own errors too: the recording path's statements run on its cursor
        # directly (`_Bulk`, `pipeline.direct.Direct`), outside SQLAlchemy's wrapping.
        driver = self._engine.dialect.loaded_dbapi
        try:
            yield
        except (IntegrityError, driver.IntegrityError) as exc:
            raise StoreError(f"{what}: {_one_line(exc)}") from exc
        except (SQLAlchemyError, driver.Error) as exc:
            raise StoreError(f"{what} in {self._where}: {_one_line(exc)}") from exc

    def _write_later(self, write: Callable[[], None]) -> None:
        """Run a batch's big writes on a helper thread while this one goes on (a task of
        thousands of files: the database's own work, which holds no GIL, beside the
        caller's building of its events).  Writes given in turn run in that order (the
        caller leaves the connection to the helper meanwhile); the batch's next use of the
        store, and its commit, wait for them, and fail with the first that fails."""
        if self._helper is None or self._helper_pid != os.getpid():  # none, or a parent's
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="roar-store")
            self._helper_pid = os.getpid()
        writing: list[Future] | None = getattr(self._batch, "writing", None)
        if writing is None:
            writing = self._batch.writing = []
        writing.append(self._helper.submit(write))

    def _settle(self, quiet: bool = False) -> None:
        writing: list[Future] | None = getattr(self._batch, "writing", None)
        if writing is None:
            return
        self._batch.writing = None
        failed = None
        for w in writing:  # all of them done before the connection is used again
            try:
                w.result()
            except Exception as e:
                failed = failed or e
        if failed is not None and not quiet:
            raise failed

    # -- runs ---------------------------------------------------------------------------------

    def start_workflow_run(self, run: WorkflowRun) -> None:
        check_aware(run.started_at, "started_at")
        with self._transaction(f"cannot record workflow run {run.run_id}", write=True) as conn:
            conn.execute(
                insert(_WORKFLOW_RUNS),
                {
                    "run_id": run.run_id,
                    "engine": run.engine,
                    "namespace": run.namespace,
                    "job_name": run.job_name,
                    "started_at": run.started_at,
                    "ended_at": None,
                    "status": "RUNNING",
                    "facets": dict(run.facets),
                },
            )

    def finish_workflow_run(self, run_id: str, status: str, ended_at: datetime) -> None:
        check_status(status)
        check_aware(ended_at, "ended_at")
        with self._transaction(f"cannot finish workflow run {run_id}", write=True) as conn:
            done = conn.execute(
                update(_WORKFLOW_RUNS)
                .where(_WORKFLOW_RUNS.c.run_id == run_id)
                .values(status=status, ended_at=ended_at)
            )
            if done.rowcount == 0:
                raise StoreError(f"unknown workflow run {run_id}")

    def start_task_run(self, run: TaskRun) -> None:
        row = _task_run_row(run)
        with self._transaction(f"cannot record task run {run.run_id}", write=True) as conn:
            _new_task_run(conn, row)


    def finish_task_run(
        self,
        run_id: str,
        status: str,
        ended_at: datetime,
        exit_code: int | None = None,
        error_message: str | None = None,
        dropped_events: int = 0,
        *,
        code: Sequence[CodeFile] | None = None,
        traced: bool | None = None,
        untraced_reason: str | None = None,
        accesses: Sequence[Access] = (),
        started: TaskRun | None = None,
    ) -> list[AccessRecord]:
        """Close a task run. `code`, `traced` and `untraced_reason` (None: keep what
        `start_task_run` stored) are often known only once the trace has been read.

        `accesses` are recorded in the same transaction (see `record_accesses`, whose result
        this returns): a task's end is one commit, not two.  `started`: the run, when its
        start was not stored yet (a short task: its start and end are one commit)."""
        check_status(status)
        check_aware(ended_at, "ended_at")
        values: dict[str, Any] = {
            "status": status,
            "ended_at": ended_at,
            "exit_code": exit_code,
            "error_message": error_message,
            "dropped_events": dropped_events,
        }
        if code is not None:
            values["code"] = code_json(code)
        if traced is not None:
            values["traced"] = traced
            values["untraced_reason"] = untraced_reason
        elif untraced_reason is not None:
            values["untraced_reason"] = untraced_reason
        checked = checked_accesses(accesses)
        # Inside a batch (it commits later), a big task's rows are written on the helper.
        later = (self._write_later if len(checked) >= _WRITE_LATER_MIN
                 and getattr(self._batch, "conn", None) is not None else None)
        with self._transaction(f"cannot finish task run {run_id}", write=True) as conn:
            if started is not None:
                # Started and ended in one commit: its row goes in as it ends (one statement,
                # not an insert and an update), and its start time is known.
                row = {**_task_run_row(started), **values}
                _new_task_run(conn, row)
                return (_record_accesses(conn, run_id, checked, started.started_at, later)
                        if checked else [])
            done = _finish_task(tuple(sorted(values))).run(
                conn, {**values, "finished_run_id": run_id})
            if done.rowcount == 0:
                raise StoreError(f"unknown task run {run_id}")
            return _record_accesses(conn, run_id, checked, write=later) if checked else []

    # -- accesses -----------------------------------------------------------------------------

    def record_accesses(self, task_run_id: str, accesses: Sequence[Access]) -> list[AccessRecord]:
        """Record what a task touched, in one transaction; returns the rows written.

        Every digest becomes an artifact; outputs become file versions produced by this run,
        inputs versions seen at that path.  Every access keeps its own path as its dataset
        identity; an input whose content was last produced under another path names that
        output in `match` (an inferred edge, for the caller to publish as such).
        """
        checked = checked_accesses(accesses)
        if not checked:
            return []
        with self._transaction(f"cannot record accesses of {task_run_id}", write=True) as conn:
            return _record_accesses(conn, task_run_id, checked)

    def recorded_accesses(self, task_run_id: str, accesses: Sequence[Access]
                          ) -> list[AccessRecord]:
        """What `finish_task_run` returned for these accesses of a task stored already,
        found again without writing: for the events of a task whose recorder died after
        storing it and before making them."""
        checked = checked_accesses(accesses)
        if not checked:
            return []
        with self._transaction(f"cannot read task run {task_run_id}", write=False) as conn:
            inputs = _unique_sorted(a for a in checked if a.role == "input" and a.digest)
            started_at, candidates = _producers(conn, task_run_id, inputs)
            return _matched(task_run_id, checked, started_at, candidates)

    # -- queries ------------------------------------------------------------------------------

    def producer_of(self, digest: str, exclude_run: str | None = None,
                    started_by: datetime | None = None) -> ProducedFile | None:
        """The latest recorded output with this content (any path), or None.
        `started_by`: of a run that had started by then (a reader's start)."""
        digest = canonical_digest(digest)
        with self._transaction("cannot query producers", write=False) as conn:
            cands = _lineage.producer_candidates(conn, [digest])[digest]
            prod = _lineage.pick_producer(cands, consumer_run_id=exclude_run,
                                          consumer_started_at=started_by)
        if prod is None:
            return None
        ns, name = dataset_identity(prod.uri)
        return ProducedFile(prod.uri, digest, prod.run.run_id, prod.run.job_name, ns, name)

    def latest_version(self, uri: str) -> FileVersion | None:
        """The version of `uri` last written or read (ties: the later record), with the run
        that wrote that content there if one did."""
        with self._transaction("cannot query file versions", write=False) as conn:
            row = conn.execute(
                _lineage.latest_version((FileVersionRow.__table__,), FileVersionRow.uri == uri)
            ).one_or_none()
            if row is None:
                return None
            producer = row.producer_run_id
            if producer is None:
                # Reads are kept apart from writes of the same content; name the writer.
                producer = conn.scalars(
                    select(FileVersionRow.producer_run_id)
                    .where(
                        FileVersionRow.uri == uri,
                        FileVersionRow.digest == row.digest,
                        FileVersionRow.producer_run_id.is_not(None),
                    )
                    .order_by(FileVersionRow.id.desc())
                    .limit(1)
                ).one_or_none()
            return FileVersion(
                row.uri,
                row.digest,
                row.size,
                row.mtime_ns,
                producer,
                row.recorded_at,
                row.last_seen_at,
            )

    def object_digest(self, uri: str, object_version: str) -> tuple[str, int | None] | None:
        """(digest, size) recorded for this version of an S3 object, by whichever task
        had its bytes pass through (an upload, a whole read)."""
        with self._transaction("cannot query object versions", write=False) as conn:
            row = conn.execute(
                select(AccessRow.digest, AccessRow.size)
                .where(AccessRow.uri == uri, AccessRow.object_version == object_version,
                       AccessRow.digest.is_not(None))
                .order_by(AccessRow.id.desc())
                .limit(1)
            ).one_or_none()
            return None if row is None else (row.digest, row.size)

    # -- recorder marks (cross-node causal order) -----------------------------------------------

    def put_facts(self, facts: Sequence[tuple[str, str, dict[str, Any]]]) -> None:
        """(kind, digest, data) of machines and environments (`provenance`), kept once."""
        now = _utcnow()
        with self._transaction("cannot record provenance facts", write=True) as conn:
            for kind, digest, data in facts:
                conn.execute(_PUT_FACTS, {"digest": digest, "kind": kind, "data": data,
                                          "first_seen": now})

    def facts(self, digest: str) -> dict[str, Any] | None:
        """The machine's or environment's facts recorded under `digest`."""
        with self._transaction("cannot query provenance facts", write=False) as conn:
            return conn.execute(select(ProvenanceFactsRow.data).where(
                ProvenanceFactsRow.digest == digest)).scalar_one_or_none()

    def set_recorder_mark(self, workflow_run_id: str, recorder: str, mark: datetime,
                          done: bool = False) -> None:
        """`recorder` has recorded (and delivered) every task of its own that ended before
        `mark`; `done`: it has exited."""
        check_aware(mark, "mark")
        with self._transaction(f"cannot record the mark of {recorder}", write=True) as conn:
            conn.execute(_SET_MARK, {"workflow_run_id": workflow_run_id, "recorder": recorder,
                                     "mark": mark, "alive_at": _utcnow(), "done": done})

    def recorder_marks(self, workflow_run_id: str) -> list[RecorderMark]:
        with self._transaction("cannot query recorder marks", write=False) as conn:
            rows = conn.execute(select(_MARKS).where(_MARKS.c.workflow_run_id == workflow_run_id))
            return [RecorderMark(r.recorder, r.mark, r.alive_at, r.done) for r in rows]

    def workflow_run(self, run_id: str) -> WorkflowRunRecord | None:
        with self._transaction("cannot query workflow runs", write=False) as conn:
            row = conn.execute(
                select(WorkflowRunRow.__table__).where(WorkflowRunRow.run_id == run_id)
            ).one_or_none()
            if row is None:
                return None
            return WorkflowRunRecord(
                row.run_id,
                row.engine,
                row.namespace,
                row.job_name,
                row.started_at,
                row.ended_at,
                row.status,
                row.facets,
            )

    def task_run(self, run_id: str) -> TaskRunRecord | None:
        with self._transaction("cannot query task runs", write=False) as conn:
            row = conn.execute(
                select(TaskRunRow.__table__).where(TaskRunRow.run_id == run_id)
            ).one_or_none()
            return None if row is None else _task_record(row)

    def task_statuses(self, run_ids: Iterable[str]) -> dict[str, str]:
        """run id -> status of those of `run_ids` stored (one query per 500: a recorder
        resuming a dead one's logs asks about each task they hold)."""
        ids = sorted(set(run_ids))
        out: dict[str, str] = {}
        with self._transaction("cannot query task runs", write=False) as conn:
            for i in range(0, len(ids), 500):
                rows = conn.execute(select(TaskRunRow.run_id, TaskRunRow.status)
                                    .where(TaskRunRow.run_id.in_(ids[i:i + 500])))
                out.update((run_id, status) for run_id, status in rows)
        return out

    def task_runs(self, workflow_run_id: str | None = None, limit: int = 50) -> list[TaskRunRecord]:
        """Most recent first; all engines when no workflow run is given."""
        query = select(TaskRunRow.__table__).order_by(TaskRunRow.started_at.desc()).limit(limit)
        if workflow_run_id is not None:
            query = query.where(TaskRunRow.workflow_run_id == workflow_run_id)
        with self._transaction("cannot query task runs", write=False) as conn:
            return [_task_record(row) for row in conn.execute(query)]

    def untraced(self, workflow_run_id: str) -> dict[str, int]:
        """How many task runs of a workflow run ran untraced, by reason ("?": none given).
        Counted by the database: a job of thousands of tasks loaded every row (0.2 s at
        3,000, where its lineage waited)."""
        query = (select(TaskRunRow.untraced_reason, func.count())
                 .where(TaskRunRow.workflow_run_id == workflow_run_id,
                        TaskRunRow.traced.is_(False))
                 .group_by(TaskRunRow.untraced_reason))
        with self._transaction("cannot query task runs", write=False) as conn:
            counts: dict[str, int] = {}
            for reason, n in conn.execute(query):
                counts[reason or "?"] = counts.get(reason or "?", 0) + n
            return counts

    def accesses_of(self, task_run_id: str) -> list[AccessRecord]:
        with self._transaction("cannot query accesses", write=False) as conn:
            rows = conn.execute(
                select(AccessRow.__table__)
                .where(AccessRow.task_run_id == task_run_id)
                .order_by(AccessRow.id)
            )
            return [_access_record(r) for r in rows]

    def complete_digest(self, prefix: str) -> list[str]:
        """The recorded digests that start with the hex `prefix` (at most two)."""
        with self._transaction("cannot query digests", write=False) as conn:
            return _lineage.complete_digest(conn, prefix)

    def accesses_of_uri(self, uri: str) -> list[tuple[AccessRecord, TaskRunRecord]]:
        """Every recorded access of `uri` (the path as observed), with its run, oldest first:
        the versions of one file and who wrote or read each."""
        with self._transaction("cannot query accesses", write=False) as conn:
            rows = conn.execute(
                select(AccessRow.__table__).where(AccessRow.uri == uri).order_by(AccessRow.id)
            ).all()
            runs: dict[str, TaskRunRecord] = {}
            for chunk in _lineage._chunks(r.task_run_id for r in rows):
                query = select(TaskRunRow.__table__).where(TaskRunRow.run_id.in_(chunk))
                runs.update((row.run_id, _task_record(row)) for row in conn.execute(query))
        pairs = [(_access_record(r), runs[r.task_run_id]) for r in rows]
        pairs.sort(key=lambda p: p[1].started_at)  # stable: accesses of one run keep their order
        return pairs

    def lineage(
        self,
        key: str,
        direction: Literal["upstream", "downstream"] = "upstream",
        depth: int | None = None,
        min_size: int | None = None,
    ) -> LineageGraph:
        """Ancestry or descendants of an absolute path / URI (its latest version) or a digest,
        linked by content: `depth` counts task runs away from the key (None: no limit).
        `min_size`: equal content under another path of at least this size is an inferred
        edge (None: never)."""
        if direction not in ("upstream", "downstream"):
            raise ValueError(f"unknown direction {direction!r} (upstream or downstream)")
        if depth is not None and depth < 0:
            raise ValueError(f"depth must be >= 0, not {depth}")
        walk = _lineage.upstream if direction == "upstream" else _lineage.downstream
        with self._transaction("cannot query lineage", write=False) as conn:
            return walk(conn, key, depth, min_size)


# ---------------------------------------------------------------------------------------------
# Write helpers


_TASK_RUNS = TaskRunRow.__table__
_MARKS = RecorderMarkRow.__table__
_WORKFLOW_RUNS = WorkflowRunRow.__table__
_VERSIONS = FileVersionRow.__table__


def _written_columns(table: Table) -> list[Any]:
    # Every column but a surrogate key the database numbers itself.
    return [c for c in table.columns if not (c.primary_key and c.autoincrement is True)]


def _insert(table: Table) -> Any:
    return insert(table).values({c.name: bindparam(c.name) for c in _written_columns(table)})


def _upsert(table: Table, conflict: str) -> TextClause:
    """`INSERT ... ON CONFLICT <conflict>` for every column but the surrogate key.

    Written out because the dialect `insert(...).on_conflict_*()` constructs have no cache
    key: SQLAlchemy compiles them again on every execution (~0.1 ms each, four per task).
    SQLite (>= 3.24) and PostgreSQL accept the same ON CONFLICT syntax; typed bind
    parameters keep the columns' conversions (UTC timestamps)."""
    cols = _written_columns(table)
    names = ", ".join(c.name for c in cols)
    values = ", ".join(f":{c.name}" for c in cols)
    return text(
        f"INSERT INTO {table.name} ({names}) VALUES ({values}) ON CONFLICT {conflict}"
    ).bindparams(*(bindparam(c.name, type_=c.type) for c in cols))


_PUT_FACTS = _upsert(ProvenanceFactsRow.__table__, "(digest) DO NOTHING")
_SET_MARK = _upsert(_MARKS, "(workflow_run_id, recorder) DO UPDATE SET mark = excluded.mark,"
                   " alive_at = excluded.alive_at, done = excluded.done")


class RecorderMark(NamedTuple):
    recorder: str
    mark: datetime
    alive_at: datetime
    done: bool


# Rows per multi-row statement, largest first; fewer than the last go in as one statement
# of their own size, so a task of up to 31 files writes a statement per table, as before
# (at most 9 statements for any number of rows below 2,048).  The driver keeps the last
# 128 statements it ran, each the bigger the more rows it has (measured: 0.5 MiB for 500
# rows of 11 columns, 2 MiB for 2,048): sizes from a short list keep a long-lived
# recorder's few, where a statement for each remainder of a batch (any of 1-499 rows, per
# table) piled up (`bench/bench_store.py --memory 160`: the process grew from 99 to 121
# MiB, now from 82 to 92).  A 5,000-file task's rows, with the recorder's events built
# meanwhile at its GIL switch interval: 191 ms against 203 in statements of 500 (medians
# of 20).
_STATEMENT_ROWS = (2048, 512, 128, 64, 32)
# A connection compiles each statement size the first time it runs it: ~2 us per row for
# the largest (11 columns; running it, ~1.4).  A recorder's first big task (and each CLI
# run's big one, in a recorder of its own) would pay that for one use: its rows go in
# statements of the next size, and the largest is used once the connection has written as
# many rows with that statement before.  Measured, `bench_core.py` (a fresh recorder per
# 5,000-file run, alternated): ~2 us per file less; a long-lived recorder's later tasks
# as before.
_WRITTEN = "roar_bulk_rows"
_PARAMETER_LIMIT = "roar_sqlite_parameter_limit"


def _max_rows(conn: Connection, columns: int) -> int:
    # SQLite builds before 3.32 allow 999 parameters per statement; Python 3.11+ can ask
    # (once per driver connection).
    info = conn.connection.info
    limit = info.get(_PARAMETER_LIMIT)
    if limit is None:
        getlimit = getattr(conn.connection.dbapi_connection, "getlimit", None)
        limit = info[_PARAMETER_LIMIT] = (
            getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) if getlimit else 999)
    return max(1, limit // columns)


def _chunks(n: int, most: int) -> Iterator[int]:
    """The sizes of the statements `n` rows go in as (see _STATEMENT_ROWS)."""
    for size in _STATEMENT_ROWS:
        size = min(size, most)
        while n >= size:
            yield size
            n -= size
    if n:
        yield n


class _Plan(NamedTuple):
    sql: str
    positional: bool
    procs: dict[str, Any]  # column -> the driver's conversion of its values
    places: dict[str, int]  # column -> its place in a row, for those of `procs`
    multirow: tuple[str, str, str] | None  # SQLite: (before, one row's "(?, ...)", after)


class _Bulk:
    """A write statement run for many rows at once, through the driver itself.

    A task with thousands of files writes thousands of rows per statement; SQLAlchemy's
    executemany builds and type-converts every row's parameters in Python (measured: more
    than the database's own insert).  Here the statement is compiled once per dialect, and
    rows come as tuples in `columns` order: no dict per row.  A column whose type converts
    values in Python (UTC timestamps on SQLite) holds, in most batches, one value for every
    row: the caller converts it once with `driver_value` and names it in `converted`;
    values of other such columns are converted here, each distinct value once.

    On SQLite (positional `?` parameters) rows go in as multi-row VALUES statements of
    `_STATEMENT_ROWS` rows: one statement step per chunk instead of one per row
    (measured, 5000 rows into each lineage table: 31 ms against 43 with executemany).
    """

    def __init__(self, stmt: Any, table: Table) -> None:
        self.stmt = stmt
        self.columns = tuple(c.name for c in _written_columns(table))
        self._plans: dict[str, _Plan] = {}
        self._sized: dict[int, str] = {}  # SQLite's multi-row statements by row count

    def _plan(self, conn: Connection) -> _Plan:
        dialect = conn.dialect
        plan = self._plans.get(dialect.name)
        if plan is None:
            compiled = self.stmt.compile(dialect=dialect)
            names = list(compiled.positiontup) if compiled.positional else list(compiled.binds)
            if sorted(names) != sorted(self.columns) or (
                compiled.positional and tuple(names) != self.columns
            ):
                raise AssertionError(f"{self.stmt}: binds {names} are not {self.columns}")
            procs = bind_processors(compiled, names)
            # SQLite: the statement around its one VALUES group, to repeat the group per row.
            group = "(" + ", ".join("?" * len(names)) + ")"
            rows = None
            sqlite = compiled.positional and dialect.name == "sqlite"
            if sqlite and compiled.string.count(group) == 1:
                head, _, tail = compiled.string.partition(group)
                rows = (head, group, tail)
            plan = self._plans[dialect.name] = _Plan(
                compiled.string, compiled.positional, procs,
                {n: self.columns.index(n) for n in procs}, rows)
        return plan

    def driver_value(self, conn: Connection, column: str, value: Any) -> Any:
        proc = self._plan(conn).procs.get(column)
        return value if proc is None or value is None else proc(value)

    def run(self, conn: Connection, rows: Sequence[tuple[Any, ...]],
            converted: Iterable[str] = ()) -> None:
        if not rows:
            return
        sql, positional, procs, places, multirow = plan = self._plan(conn)
        todo = [(places[n], proc) for n, proc in procs.items() if n not in converted]
        params: list[Any] = list(rows)
        if todo:
            memo: dict[tuple[int, Any], Any] = {}
            params = [list(r) for r in params]
            for i, proc in todo:
                for p in params:
                    if isinstance(v := p[i], list | dict):  # JSON: unhashable, seldom repeated
                        p[i] = proc(v)
                    elif v is not None:
                        key = (i, v)
                        if key not in memo:
                            memo[key] = proc(v)
                        p[i] = memo[key]
            if positional:
                params = [tuple(p) for p in params]
        if not positional:
            params = [dict(zip(self.columns, p, strict=True)) for p in params]
        # On the driver's connection, in the connection's transaction: SQLAlchemy's
        # execution context around each statement cost more than a small task's rows (~40
        # us a statement here, five statements a task).  Its errors: `Store._errors_as`.
        if multirow is None:
            cursor = conn.connection.cursor()
            try:
                cursor.executemany(sql, params)
            finally:
                cursor.close()
            return
        # SQLite: each statement's text is made once per row count, and runs on the driver
        # connection's own execute.  (Measured, bench of the store alone: ~60 us of a small
        # task's ~0.5 ms went to building the text again, the driver's cursor and asking
        # the connection its parameter limit, each statement.)
        fairy = conn.connection
        driver = fairy.dbapi_connection
        written = fairy.info.setdefault(_WRITTEN, {})  # per driver connection
        before = written.get(self, 0)
        written[self] = before + len(params)
        most = _max_rows(conn, len(self.columns))
        if len(params) < min(most, _STATEMENT_ROWS[-1]):
            # One statement, as `_chunks` gives, without it: a small task's few rows, most
            # statements a recorder runs (~4 us less a statement here).
            driver.execute(self._rows_sql(plan, len(params)),
                           params[0] if len(params) == 1
                           else tuple(itertools.chain.from_iterable(params)))
            return
        if before < _STATEMENT_ROWS[0]:
            most = min(most, _STATEMENT_ROWS[1])
        i = 0
        for size in _chunks(len(params), most):
            driver.execute(self._rows_sql(plan, size),
                           tuple(itertools.chain.from_iterable(params[i : i + size])))
            i += size

    def _rows_sql(self, plan: _Plan, size: int) -> str:
        """The multi-row statement of `size` rows (`plan.multirow`), made once."""
        sql = self._sized.get(size)
        if sql is None:
            head, group, tail = plan.multirow
            sql = self._sized[size] = head + ", ".join([group] * size) + tail
        return sql


# Reads of a path keep one row per content there (producer NULL), moved forward on every
# read; the partial unique index makes concurrent first reads collapse too.
_NEW_ARTIFACT = _Bulk(_upsert(ArtifactRow.__table__, "DO NOTHING"), ArtifactRow.__table__)
_SEEN_VERSION = _Bulk(_upsert(
    _VERSIONS,
    "(uri, digest) WHERE producer_run_id IS NULL"
    " DO UPDATE SET last_seen_at = excluded.last_seen_at",
), _VERSIONS)
_PRODUCED_VERSION = _Bulk(_upsert(_VERSIONS, "DO NOTHING"), _VERSIONS)
_ACCESS = _Bulk(_insert(AccessRow.__table__), AccessRow.__table__)
# A task recorded at its end, start and end in one row: a statement per task of a recorder's
# pass, where SQLAlchemy's own insert cost more than the row (0.1 ms).
_NEW_TASK_RUN = _Bulk(_insert(_TASK_RUNS), _TASK_RUNS)
# The tuples below are built in these orders (a change of either table fails here, at import).
assert _NEW_ARTIFACT.columns == ("digest", "size", "first_seen")
assert _PRODUCED_VERSION.columns == (
    "uri", "digest", "size", "mtime_ns", "producer_run_id", "recorded_at", "last_seen_at")
assert _ACCESS.columns == ("task_run_id", "uri", "digest", "role", "size", "mtime_ns",
                           "path_read", "dataset_namespace", "dataset_name", "version_note",
                           "object_version")
_WORKFLOW_KNOWN = Direct(select(_WORKFLOW_RUNS.c.run_id)
                         .where(_WORKFLOW_RUNS.c.run_id == bindparam("run_id")))


def _new_task_run(conn: Connection, row: dict[str, Any]) -> None:
    """A task run's row; refused (as PostgreSQL's foreign key refuses it) where it names a
    workflow run the store does not hold: SQLite checks no foreign key (`_sqlite_engine`)."""
    wf = row["workflow_run_id"]
    if wf is not None and conn.dialect.name == "sqlite" and not _WORKFLOW_KNOWN.run(
            conn, {"run_id": wf}).rows:
        raise StoreError(f"cannot record task run {row['run_id']}: unknown workflow run {wf}")
    _NEW_TASK_RUN.run(conn, [tuple(row[c] for c in _NEW_TASK_RUN.columns)])


_STARTED_AT = Direct(select(_TASK_RUNS.c.started_at)
                      .where(_TASK_RUNS.c.run_id == bindparam("run_id")))


@functools.cache
def _finish_task(columns: tuple[str, ...]) -> Direct:
    # One statement per set of columns updated (a handful): built and compiled once.
    return Direct(
        update(_TASK_RUNS)
        .where(_TASK_RUNS.c.run_id == bindparam("finished_run_id"))
        .values({c: bindparam(c) for c in columns})
    )


_TIMES = ("recorded_at", "last_seen_at")
# A task with this many accesses, recorded in a batch, has its rows written on the store's
# helper thread (`Store._write_later`).
_WRITE_LATER_MIN = 512


def _record_accesses(
    conn: Connection, task_run_id: str, checked: list[Access],
    started_at: datetime | None = None,
    write: Callable[[Callable[[], None]], None] | None = None,
) -> list[AccessRecord]:
    """`write`: runs the rows' statements (`Store._write_later`), else they run here."""
    # One row per (uri, digest): a batch may repeat a file (e.g. read by two processes).
    # Sorted, so concurrent PostgreSQL writers lock shared rows in one order (no deadlock).
    inputs = _unique_sorted(a for a in checked if a.role == "input" and a.digest)
    outputs = _unique_sorted(a for a in checked if a.role == "output" and a.digest)
    now = _utcnow()
    started_at, candidates = _producers(conn, task_run_id, inputs, started_at)
    sizes: dict[str, int | None] = {}
    for a in checked:
        if a.digest:
            sizes[a.digest] = sizes.get(a.digest) or a.size
    # The batch's timestamp, converted once for all its rows.
    t = _PRODUCED_VERSION.driver_value(conn, "recorded_at", now)
    first = _NEW_ARTIFACT.driver_value(conn, "first_seen", now)

    def versions() -> None:
        _NEW_ARTIFACT.run(conn, [(d, n, first) for d, n in sorted(sizes.items())],
                          converted=("first_seen",))
        # Inputs before outputs: on a timestamp tie, the version written by this run (a
        # later id) is the latest one of a file it also read.
        _SEEN_VERSION.run(conn, [(a.uri, a.digest, a.size, a.mtime_ns, None, t, t)
                                 for a in inputs], converted=_TIMES)
        _PRODUCED_VERSION.run(
            conn, [(a.uri, a.digest, a.size, a.mtime_ns, task_run_id, t, t) for a in outputs],
            converted=_TIMES)

    # The versions' rows need nothing of what follows: on the helper (`write`), they are
    # written while the accesses are made.
    if write is None:
        versions()
    else:
        write(versions)
    records = _matched(task_run_id, checked, started_at, candidates)

    def rows() -> None:
        _ACCESS.run(conn, [(task_run_id, r.uri, r.digest, r.role, r.size, r.mtime_ns,
                            r.path_read, r.dataset_namespace, r.dataset_name, r.note,
                            r.object_version) for r in records])

    if write is None:
        rows()
    else:
        write(rows)
    return records


def _producers(conn: Connection, task_run_id: str, inputs: list[Access],
               started_at: datetime | None = None) -> tuple[datetime, dict[str, Any]]:
    """The task's start, and the latest versions of what it read (`latest_per_path`).
    Before its own rows go in, or after: the query leaves the reader's own versions out,
    so they could not change its answer."""
    if started_at is None:
        found = _STARTED_AT.run(conn, {"run_id": task_run_id}).rows
        started_at = found[0][0] if found else None
    if started_at is None:
        raise StoreError(f"unknown task run {task_run_id}")
    read = {a.digest for a in inputs}
    return started_at, (_lineage.latest_per_path(conn, read, task_run_id, started_at)
                        if read else {})


def _matched(task_run_id: str, checked: list[Access], started_at: datetime,
             candidates: dict[str, Any]) -> list[AccessRecord]:
    """The task's access records: each input whose content was last produced under
    another path names that output (`match`)."""
    records = []
    for a in checked:
        # Always the path the task used: equal content elsewhere is an edge (`match`), never
        # this dataset's name.
        ns, name = dataset_identity(a.uri)
        match = None
        if a.role == "input" and a.digest:
            prod = _lineage.pick_producer(
                candidates.get(a.digest, ()),
                uri=a.uri,
                consumer_run_id=task_run_id,
                consumer_started_at=started_at,
            )
            if prod is not None and prod.uri != a.uri:
                match = ProducedFile(prod.uri, a.digest, prod.run.run_id, prod.run.job_name,
                                     *dataset_identity(prod.uri))
        records.append(AccessRecord(a.uri, a.role, a.digest, a.size, a.mtime_ns, a.path_read,
                                    ns, name, a.note, match, a.object_version))
    return records


def _task_run_row(run: TaskRun) -> dict[str, Any]:
    """The row of a task run as it starts: running, no end, nothing dropped yet."""
    check_aware(run.started_at, "started_at")
    return {
        "run_id": run.run_id,
        "workflow_run_id": run.workflow_run_id,
        "parent_run_id": run.parent_run_id,
        "engine": run.engine,
        "namespace": run.namespace,
        "job_name": run.job_name,
        "engine_task_id": run.engine_task_id,
        "attempt": run.attempt,
        "host": run.host,
        "pid": run.pid,
        "started_at": run.started_at,
        "ended_at": None,
        "status": "RUNNING",
        "exit_code": None,
        "error_message": None,
        "command": list(run.command),
        "code": code_json(run.code),
        "environment": dict(run.environment),
        "traced": run.traced,
        "untraced_reason": run.untraced_reason,
        "dropped_events": 0,
    }


def _unique_sorted(accesses: Iterable[Access]) -> list[Access]:
    by_key = {(a.uri, a.digest or ""): a for a in accesses}
    return [by_key[k] for k in sorted(by_key)]


def _access_record(r: Row[Any]) -> AccessRecord:
    return AccessRecord(
        r.uri, r.role, r.digest, r.size, r.mtime_ns, r.path_read, r.dataset_namespace,
        r.dataset_name, r.version_note, object_version=r.object_version,
    )


def _task_record(row: Row[Any]) -> TaskRunRecord:
    return TaskRunRecord(
        run_id=row.run_id,
        engine=row.engine,
        namespace=row.namespace,
        job_name=row.job_name,
        started_at=row.started_at,
        ended_at=row.ended_at,
        status=row.status,
        workflow_run_id=row.workflow_run_id,
        parent_run_id=row.parent_run_id,
        engine_task_id=row.engine_task_id,
        attempt=row.attempt,
        host=row.host,
        pid=row.pid,
        exit_code=row.exit_code,
        error_message=row.error_message,
        command=list(row.command),
        code=[CodeFile(**c) for c in row.code],
        environment=dict(row.environment),
        traced=row.traced,
        untraced_reason=row.untraced_reason,
        dropped_events=row.dropped_events,
    )
