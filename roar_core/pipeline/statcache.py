"""Persistent stat cache: one file version's identity (from ``os.stat``) -> its blake3 digest.

Shared by every task on a node so that an unchanged input is never read twice. A cache is only
an optimisation: every failure here is logged and degrades to a miss, never to an exception in
the traced job.
"""

from __future__ import annotations

import functools
import itertools
import os
import sqlite3
import threading
import weakref
from collections import namedtuple
from collections.abc import Iterable, Sequence

from roar_core.lazylog import LazyLogger

_log = LazyLogger(__name__)

# Bump when the table layout changes; an old file is then dropped and rebuilt (it is a cache).
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS stat_cache (
    dev INTEGER NOT NULL, ino INTEGER NOT NULL,
    size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
    digest BLOB NOT NULL,
    PRIMARY KEY (dev, ino)
) WITHOUT ROWID
"""
# Looked up in slices of this many states: 2 parameters each stays under the 999-parameter
# limit of SQLite before 3.32.
_GET_SLICE = 256


@functools.lru_cache(maxsize=8)
def _get_sql(n: int) -> str:
    # A join on a VALUES list is one statement per slice that still uses the primary key (a
    # row-value IN scans the table); 2.5x faster than a query per state.
    values = ",".join(["(?, ?)"] * n)
    return (
        "SELECT s.dev, s.ino, s.size, s.mtime_ns, s.ctime_ns, s.digest"
        f" FROM (VALUES {values}) AS v"
        " JOIN stat_cache AS s ON s.dev = v.column1 AND s.ino = v.column2"
    )


# As the lineage store's (pipeline.store.SQLITE_PAGE_SIZE): a commit writes each page it
# dirtied whole to the WAL.  Measured, a store of 20,000 entries: 2 new entries a commit,
# 48 us with 16 KiB pages, 36 with 8 KiB (4 KiB: 32); 5,000 at once 15.6, 14.8 (14.6) ms.
PAGE_SIZE = 8192

# Written in slices of this many rows, one multi-row statement each (6 parameters a row:
# under the 999-parameter limit too); one statement step per slice instead of one per row.
_PUT_SLICE = 160


@functools.lru_cache(maxsize=8)
def _put_sql(n: int) -> str:
    # Keyed by inode, so a file's new version replaces its old one and the table stays one row
    # per inode. The WHERE keeps a slow writer from replacing a newer version with an older one.
    values = ",".join(["(?, ?, ?, ?, ?, ?)"] * n)
    return (
        f"INSERT INTO stat_cache VALUES {values}"
        " ON CONFLICT (dev, ino) DO UPDATE SET size = excluded.size,"
        " mtime_ns = excluded.mtime_ns, ctime_ns = excluded.ctime_ns, digest = excluded.digest"
        " WHERE excluded.ctime_ns >= stat_cache.ctime_ns"
    )


class FileState(namedtuple("FileState", ("dev", "ino", "size", "mtime_ns", "ctime_ns"))):
    """Identity of one version of a file: a write changes size or ctime, a replace changes ino.

    A named tuple: two are made and compared per file hashed (measured: 0.24 us to make one,
    0.04 to compare, against 0.64 and 0.16 for a frozen dataclass).  collections', not
    typing's: importing typing is ~4 ms of a `roar-core run` that takes versions."""

    __slots__ = ()
    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileState:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _i64(n: int) -> int:
    # st_dev/st_ino are unsigned 64-bit (overlayfs xino sets the top bits); SQLite is signed.
    return n - (1 << 64) if n >= (1 << 63) else n


def _row(state: FileState) -> tuple[int, int, int, int, int]:
    return (_i64(state.dev), _i64(state.ino), state.size, state.mtime_ns, state.ctime_ns)


# A connection or lock carried across fork() is unusable in the child (SQLite forbids the first;
# the second may be held by a thread that no longer exists). Objects register here to reset.
_FORK_AWARE: weakref.WeakSet = weakref.WeakSet()
# Inherited connections are kept alive, never closed, so the child cannot disturb the parent's
# WAL files while closing them.
_INHERITED: list[sqlite3.Connection] = []


def reset_after_fork(obj: object) -> None:
    """Have ``obj._after_fork_in_child()`` called in every child forked from now on."""
    _FORK_AWARE.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_FORK_AWARE):
        obj._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


class StatCache:
    """Persistent (dev, ino, size, mtime_ns, ctime_ns) -> digest map, shared by all tasks of a node.

    ``path=None`` keeps the map in memory. Otherwise it is a small SQLite file in WAL mode, safe
    for several processes (busy timeout) and threads (one connection behind a lock). Keep it on a
    local disk: WAL needs shared memory, which network filesystems do not provide.
    """

    def __init__(self, path: os.PathLike | str | None, busy_timeout: float = 30.0) -> None:
        self.path = None if path is None else os.fspath(path)
        self._busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._mem: dict[tuple[int, int], tuple[FileState, str]] | None = None
        self._db: sqlite3.Connection | None = None
        self._warned = False
        self._reopen = False
        self._open()
        reset_after_fork(self)

    def _open(self) -> None:
        if self.path is None:
            self._mem = {}
            return
        try:
            self._db = _connect(self.path, self._busy_timeout)
        except (sqlite3.Error, OSError) as exc:
            _log.warning("stat cache %s unusable (%s); using an in-memory cache", self.path, exc)
            self._mem = {}

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        if self._db is not None:
            _INHERITED.append(self._db)
            self._db = None
            self._reopen = True  # on first use: most forked children never touch the cache

    def _conn(self) -> sqlite3.Connection | None:
        if self._reopen:  # called under self._lock
            self._reopen = False
            self._open()
        return self._db

    def get(self, state: FileState) -> str | None:
        return self.get_many([state])[0]

    def get_many(self, states: Sequence[FileState]) -> list[str | None]:
        """Look up several states under one lock acquisition (hash_files does this per chunk)."""
        with self._lock:
            db = self._conn()
            if self._mem is not None:
                entries = [self._mem.get((s.dev, s.ino)) for s in states]
                return [
                    e[1] if e and e[0] == s else None for e, s in zip(entries, states, strict=True)
                ]
            if db is None:
                return [None] * len(states)
            keys = [_row(s) for s in states]
            found: dict[tuple[int, int], tuple] = {}
            try:
                for i in range(0, len(keys), _GET_SLICE):
                    part = keys[i : i + _GET_SLICE]
                    args = [n for key in part for n in key[:2]]
                    for row in db.execute(_get_sql(len(part)), args):
                        found[row[0], row[1]] = row
            except sqlite3.Error as exc:
                self._warn(exc)
                return [None] * len(states)
        # A row for the inode holds its last hashed version; it answers only if that is this one.
        return [
            row[5].hex() if (row := found.get(key[:2])) and row[2:5] == key[2:] else None
            for key in keys
        ]

    def put(self, state: FileState, digest: str) -> None:
        self.put_many([(state, digest)])

    def put_many(self, items: Iterable[tuple[FileState, str]]) -> None:
        """Store several entries in one transaction: one WAL commit instead of one per file."""
        items = list(items)
        if not items:
            return
        with self._lock:
            db = self._conn()
            if self._mem is not None:
                for state, digest in items:
                    self._mem[(state.dev, state.ino)] = (state, digest)
                return
            if db is None:
                return
            try:
                _write(db, [(*_row(s), bytes.fromhex(d)) for s, d in items])
            except sqlite3.Error as exc:
                self._warn(exc)

    def _warn(self, exc: Exception) -> None:
        # Once per cache: a full disk would otherwise log on every file.
        if not self._warned:
            self._warned = True
            _log.warning("stat cache %s failed (%s); continuing without it", self.path, exc)

    def close(self) -> None:
        with self._lock:
            self._reopen = False
            if self._db is not None:
                self._db.close()
                self._db = None
            self._mem = None

    def __enter__(self) -> StatCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write(db: sqlite3.Connection, rows: list[tuple]) -> None:
    # Explicit BEGIN: in autocommit mode executemany would otherwise commit row by row.
    # IMMEDIATE takes the write lock up front, where the busy timeout applies.
    db.execute("BEGIN IMMEDIATE")
    try:
        for i in range(0, len(rows), _PUT_SLICE):
            part = rows[i : i + _PUT_SLICE]
            db.execute(_put_sql(len(part)), tuple(itertools.chain.from_iterable(part)))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    # isolation_level=None: autocommit, so a lookup never holds a read transaction open and
    # blocks WAL checkpoints; _write() groups writes itself.
    db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    try:
        # As the lineage store's (pipeline.store.SQLITE_PAGE_SIZE): only a new file takes it.
        db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        db.execute("PRAGMA journal_mode=WAL")
        # A lost last commit after a power cut costs a re-hash, not a wrong digest.
        db.execute("PRAGMA synchronous=NORMAL")
        if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
            db.execute("BEGIN IMMEDIATE")  # serialises concurrent first opens
            try:
                if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                    db.execute("DROP TABLE IF EXISTS stat_cache")
                    db.execute(_SCHEMA)
                    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
    except BaseException:
        db.close()
        raise
    return db
