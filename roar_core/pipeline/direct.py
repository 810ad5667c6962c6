"""Statements run on the database driver's own cursor, in SQLAlchemy's transaction.

A small task's recording is a handful of one-row statements; SQLAlchemy's execution
context around each (compiling or fetching the cached form, expanding IN lists, typing
parameters and rows) cost more than the database's own work (~40-70 us a statement here).
A statement here is built with SQLAlchemy as usual, compiled once per dialect, and its
parameters and a query's values converted by the columns' own types.  Errors are the
driver's: `Store._errors_as` maps them like SQLAlchemy's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

from sqlalchemy import Connection


def bind_processors(compiled: Any, names: Any) -> dict[str, Callable[[Any], Any]]:
    """The driver's conversion of each named parameter's values, where its type has one.

    `dialect_impl`: a TypeDecorator's own bind_processor skips its dialect's conversion
    (SQLite's datetime -> text), which SQLAlchemy chains only there.
    """
    dialect = compiled.dialect
    return {n: proc for n in names if n in compiled.binds
            and (proc := compiled.binds[n].type.dialect_impl(dialect).bind_processor(dialect))
            is not None}


class Ran(NamedTuple):
    rowcount: int
    rows: list[tuple[Any, ...]]  # a query's, its values as the columns' types give them


class _Plan(NamedTuple):
    sql: str
    order: tuple[str, ...] | None  # positional drivers: the parameters' order
    fixed: dict[str, Any]  # the values the statement carries (literals, `.params()`)
    procs: dict[str, Callable[[Any], Any]]
    results: list[Callable[[Any], Any] | None]


class Direct:
    """One statement with named parameters, run for one set of values.

    `expanded=True`: IN lists are rendered at compile time (`render_postcompile`) for the
    lists the statement was given with `.params()`, one instance per list length; the
    items are then the parameters `<name>_1 ... <name>_n`.
    """

    def __init__(self, stmt: Any, *, expanded: bool = False) -> None:
        self.stmt = stmt
        self._kwargs = {"render_postcompile": True} if expanded else {}
        self._plans: dict[str, _Plan] = {}

    def _plan(self, conn: Connection) -> _Plan:
        dialect = conn.dialect
        plan = self._plans.get(dialect.name)
        if plan is None:
            compiled = self.stmt.compile(dialect=dialect, compile_kwargs=self._kwargs)
            order = tuple(compiled.positiontup) if compiled.positional else None
            # (Not construct_params: SQLAlchemy 2.1 refuses it on a statement compiled with
            # render_postcompile.  Named drivers: the names as rendered, IN items included.)
            names = order or tuple(dict.fromkeys(re.findall(r"%\((\w+)\)s", compiled.string)))
            fixed = {n: b.effective_value for n in names
                     if (b := compiled.binds.get(n)) is not None and not b.required}
            results = [c.type.dialect_impl(dialect).result_processor(dialect, None)
                       for c in getattr(self.stmt, "selected_columns", ())]
            plan = self._plans[dialect.name] = _Plan(
                compiled.string, order, fixed, bind_processors(compiled, names), results)
        return plan

    def run(self, conn: Connection, params: dict[str, Any]) -> Ran:
        sql, order, fixed, procs, results = self._plan(conn)
        values = {**fixed, **params}
        for n, proc in procs.items():
            if (v := values[n]) is not None:
                values[n] = proc(v)
        cursor = conn.connection.cursor()
        try:
            cursor.execute(sql, values if order is None else tuple(values[n] for n in order))
            if not results:
                return Ran(cursor.rowcount, [])
            rows = [tuple(v if proc is None or v is None else proc(v)
                          for proc, v in zip(results, row, strict=True))
                    for row in cursor.fetchall()]
            return Ran(len(rows), rows)
        finally:
            cursor.close()
