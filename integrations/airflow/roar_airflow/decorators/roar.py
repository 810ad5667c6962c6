"""`@task.roar`: `@task` with the task's real file I/O as its OpenLineage lineage.

Same arguments as `@task` (plus `roar_asset_alias`, and ExternalPythonOperator's for
subprocess mode); works with `.override`, `.partial` and `.expand`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from airflow.providers.standard.decorators.python import _PythonDecoratedOperator

from roar_airflow.operators.roar import RoarPythonOperator
from roar_airflow.version_compat import task_decorator_factory

if TYPE_CHECKING:
    from roar_airflow.version_compat import TaskDecorator


class _RoarDecoratedOperator(_PythonDecoratedOperator, RoarPythonOperator):
    """Wraps a Python callable and captures args/kwargs when called for execution."""

    template_fields: Sequence[str] = RoarPythonOperator.template_fields
    custom_operator_name: str = "@task.roar"


def roar_task(
    python_callable: Callable | None = None,
    multiple_outputs: bool | None = None,
    **kwargs,
) -> TaskDecorator:
    """Wrap a function into a traced Airflow task (registered as `@task.roar`).

    :param python_callable: Function to decorate
    :param multiple_outputs: unroll a returned dict into one XCom per key (as `@task`)
    :param roar_asset_alias: publish the output files as asset events through this alias
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_RoarDecoratedOperator,
        **kwargs,
    )
