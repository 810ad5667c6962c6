"""roar's Airflow provider: `@task.roar` and traced operators.

    pip install "roar-core[airflow]"
    eval "$(roar-core env airflow)"     # then start the scheduler (LocalExecutor) or
    airflow scheduler                   # `airflow celery worker` in this shell

With the tracer preloaded into the worker, every task Airflow forks from it is traced in
place and `@task.roar` only marks its boundaries; without, it runs the work in a traced
subprocess.  The task's real inputs and outputs, with blake3 content hashes, go into the
OpenLineage events of Airflow's provider (or roar's own, if that provider is disabled).

This module is imported when Airflow discovers providers: keep its imports light.
"""

from __future__ import annotations

import os
import shlex
import socket

__all__ = ["shell_exports"]


def shell_exports() -> str:
    """Shell lines for `roar-core env airflow`: export the tracer (LD_PRELOAD), a session
    directory for this worker's lifetime, and the roar home, so every Airflow process
    started afterwards from this shell -- the scheduler with LocalExecutor, or a Celery
    worker -- and all the task processes it forks are traced.  Start the api-server and
    dag-processor from another shell: they run no tasks."""
    from roar_core import config
    from roar_core.pipeline import tracer
    from roar_core.recording.sessions import new_session_dir

    q = shlex.quote
    st = tracer.status()
    if not st.usable:
        msg = f"roar-core: the tracer cannot run here ({st.reason}); tasks will run untraced"
        return f"echo {q(msg)} >&2\n"
    cfg = config.load()
    # The worker's session lives as long as the worker (its recorder removes the
    # logs of finished processes).
    session = new_session_dir(cfg, f"airflow-{socket.gethostname()}-{os.getpid()}",
                              in_memory=True)
    env = tracer.preload_env(session)
    return "".join([
        f"export ROAR_HOME={q(str(cfg.home))}\n",
        f"export {tracer.ENV_SESSION}={q(str(session))}\n",
        f"export LD_PRELOAD={q(env['LD_PRELOAD'])}\n",
        f"unset {tracer.ENV_TAG}\n",
    ])
