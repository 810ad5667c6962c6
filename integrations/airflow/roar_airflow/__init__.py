"""roar's Airflow provider: `@task.roar` and traced operators.

    pip install "roar-core[airflow]"
    roar-core exec -- airflow scheduler    # (LocalExecutor), or `-- airflow celery worker`

With the tracer preloaded into the worker, every task Airflow forks from it is traced in
place and `@task.roar` only marks its boundaries; without, it runs the work in a traced
subprocess.  The task's real inputs and outputs, with blake3 content hashes, go into the
OpenLineage events of Airflow's provider (or roar's own, if that provider is disabled).

This module is imported when Airflow discovers providers: keep its imports light.
"""

from __future__ import annotations

import os
import sys

from roar_core.ids import host_name

__all__ = ["exports", "shell_exports"]


def exports() -> dict[str, str | None]:
    """The environment that traces every Airflow process started in it -- the scheduler
    with LocalExecutor, or a Celery worker -- and all the task processes it forks: the
    tracer (LD_PRELOAD), a session directory for this worker's lifetime, and the roar home
    (None: a variable to unset).  `roar-core exec -- airflow scheduler` starts a process
    with it; `roar-core env airflow` prints it as shell lines.  The api-server and the
    dag-processor need nothing: they run no tasks.  Tracer unusable: {}, and a warning."""
    from roar_core import config
    from roar_core.pipeline import tracer
    from roar_core.recording.sessions import new_session_dir

    st = tracer.status()
    if not st.usable:
        print(f"roar-core: the tracer cannot run here ({st.reason}); tasks will run untraced",
              file=sys.stderr)
        return {}
    cfg = config.load()
    # The worker's session lives as long as the worker (its recorder removes the
    # logs of finished processes).
    session = new_session_dir(cfg, f"airflow-{host_name()}-{os.getpid()}",
                              in_memory=True)
    return {"ROAR_HOME": str(cfg.home), tracer.ENV_SESSION: str(session),
            "LD_PRELOAD": tracer.preload_env(session)["LD_PRELOAD"], tracer.ENV_TAG: None}


def shell_exports() -> str:
    """`exports()` as lines for `eval "$(roar-core env airflow)"`: for a shell that only
    starts Airflow; every later command of that shell is traced too."""
    from roar_core.pipeline import tracer

    return tracer.shell_lines(exports())
