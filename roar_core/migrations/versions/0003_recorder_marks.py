"""Recorder marks: how far each recorder of a workflow run has recorded and delivered, so
that recorders on other nodes keep a consumer's events after its producer's.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "recorder_marks",
        sa.Column("workflow_run_id", sa.String(36), nullable=False),
        sa.Column("recorder", sa.String(255), nullable=False),
        sa.Column("mark", _TS, nullable=False),
        sa.Column("alive_at", _TS, nullable=False),
        sa.Column("done", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["workflow_run_id"], ["workflow_runs.run_id"],
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("workflow_run_id", "recorder"),
    )


def downgrade() -> None:
    op.drop_table("recorder_marks")
