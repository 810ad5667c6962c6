"""Initial lineage store: workflow runs, task runs, artifacts, file versions, accesses.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the column types as they were at this revision: a migration must not change
# meaning when `store_schema.py` evolves later.
_TS = sa.DateTime(timezone=True)
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_RUN_ID = sa.String(36)
_DIGEST = sa.String(71)


def upgrade() -> None:
    op.create_table(
        "workflow_runs",
        sa.Column("run_id", _RUN_ID, primary_key=True),
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("job_name", sa.String(1024), nullable=False),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("ended_at", _TS, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("facets", _JSON, nullable=False),
    )
    op.create_table(
        "task_runs",
        sa.Column("run_id", _RUN_ID, primary_key=True),
        sa.Column(
            "workflow_run_id",
            _RUN_ID,
            sa.ForeignKey("workflow_runs.run_id", ondelete="CASCADE"),
            nullable=True,
        ),
        sa.Column("parent_run_id", _RUN_ID, nullable=True),
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("job_name", sa.String(1024), nullable=False),
        sa.Column("engine_task_id", sa.String(255), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("ended_at", _TS, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("command", _JSON, nullable=False),
        sa.Column("code", _JSON, nullable=False),
        sa.Column("environment", _JSON, nullable=False),
        sa.Column("traced", sa.Boolean(), nullable=False),
        sa.Column("untraced_reason", sa.Text(), nullable=True),
        sa.Column("dropped_events", sa.Integer(), nullable=False),
    )
    op.create_index("ix_task_runs_workflow_run_id", "task_runs", ["workflow_run_id", "started_at"])
    op.create_index("ix_task_runs_parent_run_id", "task_runs", ["parent_run_id"])
    op.create_index("ix_task_runs_started_at", "task_runs", ["started_at"])

    op.create_table(
        "artifacts",
        sa.Column("digest", _DIGEST, primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("first_seen", _TS, nullable=False),
    )

    op.create_table(
        "file_versions",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("digest", _DIGEST, sa.ForeignKey("artifacts.digest"), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("mtime_ns", sa.BigInteger(), nullable=True),
        sa.Column(
            "producer_run_id",
            _RUN_ID,
            sa.ForeignKey("task_runs.run_id", ondelete="CASCADE"),
            nullable=True,
        ),
        sa.Column("recorded_at", _TS, nullable=False),
        sa.Column("last_seen_at", _TS, nullable=False),
        sa.UniqueConstraint("uri", "digest", "producer_run_id", name="uq_file_versions_produced"),
    )
    op.create_index(
        "uq_file_versions_observed",
        "file_versions",
        ["uri", "digest"],
        unique=True,
        sqlite_where=sa.text("producer_run_id IS NULL"),
        postgresql_where=sa.text("producer_run_id IS NULL"),
    )
    op.create_index("ix_file_versions_digest", "file_versions", ["digest"])
    op.create_index("ix_file_versions_uri", "file_versions", ["uri", "last_seen_at"])
    op.create_index("ix_file_versions_producer_run_id", "file_versions", ["producer_run_id"])

    op.create_table(
        "accesses",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column(
            "task_run_id",
            _RUN_ID,
            sa.ForeignKey("task_runs.run_id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("digest", _DIGEST, sa.ForeignKey("artifacts.digest"), nullable=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("mtime_ns", sa.BigInteger(), nullable=True),
        sa.Column("path_read", sa.Text(), nullable=True),
        sa.Column("dataset_namespace", sa.Text(), nullable=False),
        sa.Column("dataset_name", sa.Text(), nullable=False),
    )
    op.create_index("ix_accesses_task_run_id", "accesses", ["task_run_id"])
    op.create_index("ix_accesses_digest_role", "accesses", ["digest", "role"])
    op.create_index("ix_accesses_uri", "accesses", ["uri"])


def downgrade() -> None:
    op.drop_table("accesses")
    op.drop_table("file_versions")
    op.drop_table("artifacts")
    op.drop_table("task_runs")
    op.drop_table("workflow_runs")
