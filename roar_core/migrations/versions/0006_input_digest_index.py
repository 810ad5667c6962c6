"""The accesses' digest index holds inputs only (`ix_accesses_input_digest`, partial): the
one query that looks accesses up by digest asks who read a content (downstream lineage),
and a task's outputs, most rows of a big one, paid a random-key insert each into an index
nobody read them from (~2 us per output file, measured).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INPUTS = sa.text("role = 'input'")


def upgrade() -> None:
    op.drop_index("ix_accesses_digest_role", table_name="accesses")
    op.create_index("ix_accesses_input_digest", "accesses", ["digest"],
                    sqlite_where=_INPUTS, postgresql_where=_INPUTS)


def downgrade() -> None:
    op.drop_index("ix_accesses_input_digest", table_name="accesses")
    op.create_index("ix_accesses_digest_role", "accesses", ["digest", "role"])
