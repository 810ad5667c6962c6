"""Warm-up for traced workers, as an Airflow plugin.

Airflow loads provider plugins in its long-lived processes (the scheduler does so when it
starts, before it forks the LocalExecutor workers that fork every task process).  When this
process runs with roar's tracer preloaded, the modules a task needs are imported here, once,
and the worker-wide settings computed, so each forked task process inherits them instead of
paying ~20 ms for them.  Anywhere else this plugin does nothing.
"""

from __future__ import annotations

import logging
import os

from roar_airflow.plugins import listener
from roar_airflow.version_compat import AirflowPlugin

log = logging.getLogger(__name__)


def warm() -> bool:
    """Import the task path and settle the settings if this process is traced."""
    if not os.environ.get("ROAR_SESSION_DIR") or "libroar_preload" not in os.environ.get(
            "LD_PRELOAD", ""):
        return False
    if os.environ.get("ROAR_TASK_TAG"):
        return False  # one task's own traced process (subprocess mode): it forks no tasks
    try:
        from roar_core.pipeline import tracer

        if tracer.loaded() is None:
            return False

        import roar_core.ids  # noqa: F401
        import roar_core.pipeline.emission  # noqa: F401  (the provider's listener asks for lineage)
        import roar_core.pipeline.tracelog  # noqa: F401
        import roar_core.recording.recorder  # noqa: F401
        import roar_core.recording.tasklog  # noqa: F401
        from roar_airflow.decorators import roar  # noqa: F401  (operators, hook)
        from roar_airflow.hooks.roar import (
            _config,
            check_run_ids,
            rehearse,
            settings,
            shared_hook,
            write_settings,
        )

        settings()  # plain data: the same for every task this worker forks
        _config()
        write_settings(os.environ["ROAR_SESSION_DIR"])  # as the tasks name it
        shared_hook().remember()  # the mode and session its task processes take as theirs
        check_run_ids()  # their run ids made in them, where ours are the provider's
        rehearse()  # the task path's code run here, not first in every task (its docstring)
        roar_core.pipeline.emission.producer()  # reads package metadata: ~10 ms the first time
    except Exception:  # a warm-up must never break the scheduler
        log.debug("roar: warm-up failed", exc_info=True)
        return False
    return True


WARM = warm()


class RoarPlugin(AirflowPlugin):
    name = "roar"
    listeners = [listener]
