"""Roar's listener: ends a DAG run's workflow run in roar's store when Airflow ends the
DAG run, and takes a @task.roar task's lineage when Airflow ends the task.

The recorder made the workflow run's row with the first @task.roar task of the run;
nothing else would close it.  Airflow calls the DAG run hooks in the process that ends the
DAG run (the scheduler, or `airflow dags test`); DAG runs that ran no @task.roar task have
no row and are left alone.  The task hooks run in the task process.  A failure here is
logged, never raised into Airflow.
"""

from __future__ import annotations

import logging
from typing import Any

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


# First (tryfirst): before the OpenLineage provider's, which forks a child that asks the
# task's operator for its lineage.
@hookimpl(tryfirst=True)
def on_task_instance_success(previous_state: Any, task_instance: Any) -> None:
    _take_answer(task_instance)


@hookimpl(tryfirst=True)
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    _take_answer(task_instance)


def _take_answer(task_instance: Any) -> None:
    """A @task.roar task's lineage, taken in the task process if the recorder has answered
    (RoarOperatorMixin.roar_take_answer); never waits, never raises into Airflow."""
    take = getattr(getattr(task_instance, "task", None), "roar_take_answer", None)
    if take is None:
        return
    try:
        take()
    except Exception as e:
        log.warning("roar: %s", e)
