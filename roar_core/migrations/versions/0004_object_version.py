"""Accesses of S3 objects keep S3's own version identity (`object_version`: the VersionId on
a versioned bucket, else the ETag) beside the blake3 digest of the bytes.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("accesses") as batch:
        batch.add_column(sa.Column("object_version", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("accesses") as batch:
        batch.drop_column("object_version")
