"""Everything that differs between the Airflow versions we support, in one place.

roar-core[airflow] needs Airflow 3 (task SDK, forked task runner, asset aliases).  The SDK
names come through the common.compat provider, as the Apache providers do, so a move inside
the SDK between minor versions is absorbed there and not here.
"""

from __future__ import annotations


def get_base_airflow_version_tuple() -> tuple[int, int, int]:
    from airflow import __version__
    from packaging.version import Version

    v = Version(__version__)
    return v.major, v.minor, v.micro


AIRFLOW_V_3_0_PLUS: bool = get_base_airflow_version_tuple() >= (3, 0, 0)

if not AIRFLOW_V_3_0_PLUS:  # pragma: no cover - the extra pins apache-airflow>=3.0
    raise ImportError("roar-core's Airflow provider needs Apache Airflow 3.0 or newer")

from airflow.providers.common.compat.sdk import (  # noqa: E402
    AirflowPlugin,
    Asset,
    AssetAlias,
    BaseHook,
    BaseOperator,
    TaskDecorator,
    task_decorator_factory,
)

__all__ = [
    "AIRFLOW_V_3_0_PLUS",
    "AirflowPlugin",
    "Asset",
    "AssetAlias",
    "BaseHook",
    "BaseOperator",
    "TaskDecorator",
    "task_decorator_factory",
]
