"""Tables of the lineage store (SQLAlchemy 2 declarative models).

The migrations in `roar_core/migrations/versions/` create exactly these tables; a test compares
the two so they cannot drift. Only `roar_core.pipeline.store` should touch these classes:
callers use its dataclasses instead.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# Alembic's default "alembic_version" would collide with other tools' migrations when a
# PostgreSQL database is shared (Airflow's metadata database uses that name).
VERSION_TABLE = "roar_alembic_version"

# "blake3:" + 64 hex digits, the same string OpenLineage's version facet carries.
DIGEST_LEN = 71

# SQLite has no BIGINT autoincrement: only "INTEGER PRIMARY KEY" aliases the rowid.
BigId = BigInteger().with_variant(Integer(), "sqlite")
Json = JSON().with_variant(JSONB(), "postgresql")


def _utc(value: datetime) -> datetime:
    """The same moment in UTC; a naive datetime is refused (its meaning depends on the host
    that wrote it)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value.isoformat()} (pass a timezone-aware one)")
    return value.astimezone(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on every backend.

    SQLite stores no offset, so values are normalised to UTC on the way in and get their
    tzinfo back on the way out; naive datetimes are refused because their meaning depends on
    the host that wrote them (workers of one workflow run on many hosts).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = _utc(value)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def bind_processor(self, dialect: Dialect) -> Any:
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)

        # SQLite: this method and the dialect's text conversion after it (a dict-formatted
        # string) in one step, the same text: 'YYYY-MM-DD HH:MM:SS.ffffff', in UTC.  A small
        # task's recording converts five timestamps; the two steps took ~15 us each.
        def process(value: datetime | None) -> str | None:
            if value is None:
                return None
            return _utc(value).replace(tzinfo=None).isoformat(" ", "microseconds")

        return process

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: Json, list[Any]: Json}


class WorkflowRunRow(Base):
    __tablename__ = "workflow_runs"

    run_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    engine: Mapped[str] = mapped_column(String(32))
    namespace: Mapped[str] = mapped_column(String(255))
    job_name: Mapped[str] = mapped_column(String(1024))
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    status: Mapped[str] = mapped_column(String(16))
    facets: Mapped[dict[str, Any]]


class TaskRunRow(Base):
    __tablename__ = "task_runs"
    __table_args__ = (
        Index("ix_task_runs_workflow_run_id", "workflow_run_id", "started_at"),
        Index("ix_task_runs_parent_run_id", "parent_run_id"),
        Index("ix_task_runs_started_at", "started_at"),
    )

    run_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    workflow_run_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("workflow_runs.run_id", ondelete="CASCADE")
    )
    # Not a foreign key: the parent may be a run roar never traced (an Airflow task, a Ray
    # actor created before tracing started).
    parent_run_id: Mapped[str | None] = mapped_column(String(36))
    engine: Mapped[str] = mapped_column(String(32))
    namespace: Mapped[str] = mapped_column(String(255))
    job_name: Mapped[str] = mapped_column(String(1024))
    engine_task_id: Mapped[str | None] = mapped_column(String(255))
    attempt: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    status: Mapped[str] = mapped_column(String(16))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    error_message: Mapped[str | None] = mapped_column(Text)
    command: Mapped[list[Any]]
    code: Mapped[list[Any]]
    environment: Mapped[dict[str, Any]]
    traced: Mapped[bool] = mapped_column(Boolean)
    untraced_reason: Mapped[str | None] = mapped_column(Text)
    dropped_events: Mapped[int] = mapped_column(Integer)


class ArtifactRow(Base):
    __tablename__ = "artifacts"

    digest: Mapped[str] = mapped_column(String(DIGEST_LEN), primary_key=True)
    size: Mapped[int | None] = mapped_column(BigInteger)
    first_seen: Mapped[datetime]


class FileVersionRow(Base):
    """One observed (uri, content) pair: produced by a run, or only seen as an input."""

    __tablename__ = "file_versions"
    __table_args__ = (
        UniqueConstraint("uri", "digest", "producer_run_id", name="uq_file_versions_produced"),
        # NULLs are distinct in unique constraints on both backends, so versions only seen as
        # inputs (no producer) need their own partial index to stay one row per (uri, digest).
        Index(
            "uq_file_versions_observed",
            "uri",
            "digest",
            unique=True,
            sqlite_where=text("producer_run_id IS NULL"),
            postgresql_where=text("producer_run_id IS NULL"),
        ),
        Index("ix_file_versions_digest", "digest"),
        Index("ix_file_versions_uri", "uri", "last_seen_at"),
        Index("ix_file_versions_producer_run_id", "producer_run_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    uri: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(String(DIGEST_LEN), ForeignKey("artifacts.digest"))
    size: Mapped[int | None] = mapped_column(BigInteger)
    mtime_ns: Mapped[int | None] = mapped_column(BigInteger)
    producer_run_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("task_runs.run_id", ondelete="CASCADE")
    )
    recorded_at: Mapped[datetime]
    # Moves forward each time a run reads this version again, so "latest version of a path"
    # follows what was last seen there, not only what was last written.
    last_seen_at: Mapped[datetime]


class AccessRow(Base):
    __tablename__ = "accesses"
    __table_args__ = (
        Index("ix_accesses_task_run_id", "task_run_id"),
        # Inputs only: who read a content (downstream lineage) is the one lookup by
        # digest, and outputs, most rows of a big task, would each pay a random-key insert.
        # (`lineage` writes `role = 'input'` out: see `_INPUT` there.)
        Index("ix_accesses_input_digest", "digest", sqlite_where=text("role = 'input'"),
              postgresql_where=text("role = 'input'")),
        Index("ix_accesses_uri", "uri"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    task_run_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("task_runs.run_id", ondelete="CASCADE")
    )
    uri: Mapped[str] = mapped_column(Text)
    digest: Mapped[str | None] = mapped_column(String(DIGEST_LEN), ForeignKey("artifacts.digest"))
    role: Mapped[str] = mapped_column(String(16))
    size: Mapped[int | None] = mapped_column(BigInteger)
    mtime_ns: Mapped[int | None] = mapped_column(BigInteger)
    path_read: Mapped[str | None] = mapped_column(Text)
    dataset_namespace: Mapped[str] = mapped_column(Text)
    dataset_name: Mapped[str] = mapped_column(Text)
    # Why `digest` is None: the version the task opened or left could not be hashed then.
    version_note: Mapped[str | None] = mapped_column(Text)
    # An S3 object's own version identity (VersionId, else ETag), beside its blake3.
    object_version: Mapped[str | None] = mapped_column(Text)


class ProvenanceFactsRow(Base):
    """A machine's or a Python environment's facts (roar_core.pipeline.provenance), once per
    content: task runs name theirs in `task_runs.environment`."""

    __tablename__ = "provenance_facts"

    digest: Mapped[str] = mapped_column(String(DIGEST_LEN), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    data: Mapped[dict[str, Any]]
    first_seen: Mapped[datetime]


class RecorderMarkRow(Base):
    """How far each recorder of a workflow run has got: every task of its own that ended
    before `mark` is recorded and its events delivered.  Recorders of other nodes read it
    to record a task only after whatever could have produced its inputs."""

    __tablename__ = "recorder_marks"

    workflow_run_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("workflow_runs.run_id", ondelete="CASCADE"), primary_key=True
    )
    recorder: Mapped[str] = mapped_column(String(255), primary_key=True)
    mark: Mapped[datetime]
    alive_at: Mapped[datetime]  # when it last said so: a dead recorder stops being waited for
    done: Mapped[bool] = mapped_column(Boolean)  # exited: nothing more will come from it
