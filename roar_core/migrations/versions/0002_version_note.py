"""Accesses say why a version is unknown (`version_note`): the content a task opened or left
could not be hashed at that moment, and no other version's digest stands in for it.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("accesses") as batch:
        batch.add_column(sa.Column("version_note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("accesses") as batch:
        batch.drop_column("version_note")
