"""Ends a DAG run's workflow run in roar's store when Airflow ends the DAG run.

The recorder made the row with the first @task.roar task of the run; nothing else would
close it.  Airflow calls these hooks in the process that ends the DAG run (the
scheduler, or `airflow dags test`); DAG runs that ran no @task.roar task have no row and
are left alone.  A failure here is logged, never raised into Airflow.
"""

from __future__ import annotations

import logging

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)


@hookimpl
def on_dag_run_success(dag_run, msg: str) -> None:
    _finish(dag_run, "COMPLETE")


@hookimpl
def on_dag_run_failed(dag_run, msg: str) -> None:
    _finish(dag_run, "FAIL")


def _finish(dag_run, status: str) -> None:
    try:
        from roar_airflow.hooks.roar import finish_dag_run

        finish_dag_run(dag_run, status)
    except Exception as e:  # lineage must never break the scheduler
        log.warning("roar: the end of DAG run %s was not recorded: %s: %s",
                    getattr(dag_run, "run_id", "?"), type(e).__name__, e)
