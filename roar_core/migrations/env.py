"""Alembic environment for the roar store.

`roar_core.pipeline.store.Store.open` runs the migrations programmatically and hands over a
connection that already holds the migration lock and an open transaction (see `store.py`);
the command-line path (`alembic -c roar_core/alembic.ini -x url=...`) exists for developers
writing revisions.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from roar_core.pipeline.store_schema import VERSION_TABLE, Base


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        # SQLite cannot ALTER most things; batch mode rebuilds tables instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations() -> None:
    if context.is_offline_mode():
        raise SystemExit("roar migrations run online only (pass -x url=... or use Store.open)")
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("no database: pass -x url=sqlite:///path/lineage.db")
    engine = create_engine(url)
    with engine.connect() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations()
