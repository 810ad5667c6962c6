"""The client layer: attach roar-core's tracer to an Airflow task and record it.

Three ways a task can run, picked per task at execute time (`RoarHook.mode`):

* boundary   -- the worker was started with the shim preloaded (`eval "$(roar-core env
  airflow)"` before `airflow scheduler` or `airflow celery worker`).  Airflow forks every task
  from that worker, so the shim is already in the task process: the task's boundaries are
  marked through the shim's API and nothing else changes.  The task is recorded by the
  session's recorder service (roar_core.service: one warm Roar for all the worker's task
  processes), so the task process pays a socket round trip, not a cold start.
* subprocess -- no shim here: the work runs in a traced child process (the Python callable
  like `@task.external_python` does; a classic operator's own child processes, e.g. bash),
  which logs into a session of the task's own; the host's recorder service records it.
* untraced   -- the tracer cannot work here (missing, refused by the loader): the task runs
  as usual and is recorded as untraced, with the reason.

Identity follows the OpenLineage provider exactly (job `<dag_id>.<task_id>`, its run ids for
task and DAG run), so what roar stores and what the provider emits name the same runs.
Nothing here hashes, classifies or builds events: that is roar-core's.
"""

from __future__ import annotations

import enum
import glob
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roar_airflow.version_compat import BaseHook

if TYPE_CHECKING:
    from roar_core.api import Roar
    from roar_core.config import Config
    from roar_core.emission import RunRef
    from roar_core.recorder import TaskMeta
    from roar_core.service import Result, ServiceClient, Settings

ENGINE = "airflow"
# Where _BasePythonVirtualenvOperator writes the script, arguments and result it hands to
# its child (tempfile.TemporaryDirectory(prefix="venv-call")): plumbing, never lineage.
SUBPROCESS_PLUMBING = "venv-call"
SERVICE_START_S = 15.0  # how long the first task waits for the recorder service to listen


class Mode(str, enum.Enum):
    BOUNDARY = "boundary"
    SUBPROCESS = "subprocess"
    UNTRACED = "untraced"
    DISABLED = "disabled"  # ROAR_DISABLED: run as the plain operator, record nothing


@dataclass(frozen=True)
class TaskIdentity:
    namespace: str
    job_name: str
    run_id: str
    dag_id: str
    dag_run_id: str  # the provider's OpenLineage run id of the DAG run
    engine_task_id: str
    attempt: int
    secrets: tuple[str, ...] = ()  # values of its arguments named like a secret

    @property
    def workflow(self) -> dict[str, str]:
        return {"namespace": self.namespace, "job_name": self.dag_id, "run_id": self.dag_run_id}

    def workflow_ref(self) -> RunRef:
        from roar_core.emission import RunRef

        return RunRef(**self.workflow)


@dataclass
class TaskRun:
    """One task instance as roar sees it, from begin to end."""

    ident: TaskIdentity
    mode: Mode
    result: Result | None = None  # its recorded lineage, once ended
    session: Path | None = None  # the task's own session dir (subprocess mode)
    roar_seconds: float = 0.0  # time roar spent on the task's critical path
    _meta: TaskMeta | None = field(default=None, repr=False)  # recorded in this process
    _client: ServiceClient | None = field(default=None, repr=False)  # ... or by the service

    @property
    def run_id(self) -> str:
        return self.ident.run_id

    @property
    def recorded_by(self) -> str:
        return "service" if self._client is not None else "in-process"


# Per process: Airflow forks a new task process from its worker for every task, and
# `airflow dags test` runs all tasks in one process (kept warm there).
_ROAR: tuple[int, Roar] | None = None
_SETTINGS: Settings | None = None
_CONFIG: Config | None = None


class RoarHook(BaseHook):
    """Marks task boundaries for roar-core and hands it the finished task."""

    hook_name = "roar"  # no connection: roar is configured like roar-core itself

    # ---- mode ------------------------------------------------------------------------

    def mode(self) -> tuple[Mode, str]:
        """How this task can be traced here, and a sentence saying why (for the task log)."""
        from roar_core import tracer

        if _config().disabled:
            return Mode.DISABLED, "roar is disabled (ROAR_DISABLED)"
        if tracer.loaded() is not None and os.environ.get(tracer.ENV_SESSION):
            return Mode.BOUNDARY, "the worker runs with the roar tracer preloaded"
        st = tracer.status()
        if st.usable:
            return Mode.SUBPROCESS, (
                "the worker was not started with the roar tracer preloaded, so the task's work "
                "runs in a traced subprocess; start the scheduler or worker after "
                "`eval \"$(roar-core env airflow)\"` to trace tasks in place")
        return Mode.UNTRACED, st.reason

    # ---- task boundaries -------------------------------------------------------------

    def begin(self, context: Any, mode: Mode, untraced_reason: str | None = None) -> TaskRun:
        t0 = time.perf_counter()
        ident = task_identity(context, _config().namespace)
        run = TaskRun(ident, mode)
        if mode is Mode.BOUNDARY:
            from roar_core import tracer

            run._client = self._service_begin(ident, os.environ[tracer.ENV_SESSION])
            if run._client is None:
                run._meta = self._local_begin(ident, traced=True)
            tracer.loaded().begin(ident.run_id)
        elif mode is Mode.SUBPROCESS:
            from roar_core.session import new_session_dir

            # The child writes its logs into a session of its own; the host's recorder
            # service (no worker session here) records it from there.
            cfg = _config()
            run.session = new_session_dir(cfg, ident.run_id)
            service_dir = cfg.sessions_dir / f"airflow-{socket.gethostname()}"
            service_dir.mkdir(parents=True, exist_ok=True)
            run._client = self._service_begin(ident, service_dir, task_session=run.session)
            if run._client is None:
                run._meta = self._local_begin(ident, traced=True)
        else:
            run._meta = self._local_begin(ident, traced=False, untraced_reason=untraced_reason)
        run.roar_seconds += time.perf_counter() - t0
        return run

    def child_env(self, run: TaskRun, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment that makes a child process of the task traced (subprocess mode)."""
        from roar_core import tracer

        if run.mode is not Mode.SUBPROCESS or run.session is None:
            return dict(os.environ if base is None else base)
        return tracer.preload_env(run.session, tag=run.run_id, base=base)

    def end(self, run: TaskRun, status: str, error: str | None = None) -> TaskRun:
        """Close the task and record it (before the provider asks for its lineage)."""
        t0 = time.perf_counter()
        if run.mode is Mode.BOUNDARY:
            from roar_core import tracer

            tracer.loaded().end()
        if run._client is not None:
            from roar_core.service import Result, ServiceError

            try:
                run.result = run._client.end(status, error)
            except ServiceError as e:
                run.result = Result.failed(status, str(e))
            finally:
                run._client.close()
            if run.session is not None and not run.result.error:
                from roar_core.session import remove_session_dir

                remove_session_dir(run.session)
        elif run._meta is not None:
            run.result = self._local_end(run, status, error)
        run.roar_seconds += time.perf_counter() - t0
        return run

    # ---- through the recorder service --------------------------------------------------

    def _service_begin(self, ident: TaskIdentity, session: str | os.PathLike,
                       task_session: Path | None = None) -> ServiceClient | None:
        """Hand the task to the recorder service of `session` (started if need be).  Its
        records: this process's tree in that session, or every log in `task_session`."""
        from roar_core import tracelog, tracer
        from roar_core.service import ServiceClient, TaskSpec, spawn

        st = settings()
        client = ServiceClient.connect(session, st)
        if client is None:
            spawn(session, st)
            deadline = time.monotonic() + SERVICE_START_S
            while client is None and time.monotonic() < deadline:
                time.sleep(0.05)
                client = ServiceClient.connect(session, st)
            if client is None:
                self.log.warning("roar: the recorder service did not start (see %s); "
                                 "recording in the task process", Path(session) / "recorder.log")
                return None
        shim = tracer.loaded()
        own_log, offset, dropped = (
            shim.log_path() if shim and task_session is None else None), 0, 0
        if own_log is not None:
            try:
                head = tracelog.read_header(own_log)
                offset, dropped = head.reserved, head.dropped
            except tracelog.TraceLogError:
                own_log = None
        client.begin(TaskSpec(
            job_name=ident.job_name, engine=ENGINE, run_id=ident.run_id, pid=os.getpid(),
            began_mono_ns=time.monotonic_ns(), workflow=ident.workflow,
            engine_task_id=ident.engine_task_id, attempt=ident.attempt,
            engine_version={"name": "airflow", "version": airflow_version()},
            own_log=os.fspath(own_log) if own_log else None, own_log_offset=offset,
            own_log_dropped=dropped, secrets=list(ident.secrets),
            session=os.fspath(task_session) if task_session else None))
        return client

    # ---- in this process (subprocess and untraced modes; fallback) --------------------

    def _local_begin(self, ident: TaskIdentity, traced: bool,
                     untraced_reason: str | None = None) -> TaskMeta:
        from roar_core.emission import Engine
        from roar_core.service import ensure_workflow

        roar = _roar()
        workflow = ident.workflow_ref()
        ensure_workflow(roar, workflow, ENGINE)
        return roar.begin_task(
            ident.job_name, ENGINE, workflow=workflow, engine_task_id=ident.engine_task_id,
            attempt=ident.attempt, run_id=ident.run_id, traced=traced,
            untraced_reason=untraced_reason, engine_version=Engine("airflow", airflow_version()),
            secrets=ident.secrets,
        )

    def _local_end(self, run: TaskRun, status: str, error: str | None) -> Result:
        from roar_core import tracer
        from roar_core.service import result_of
        from roar_core.session import SessionCollector, remove_session_dir

        roar = _roar()
        source = None
        if run.session is not None:
            source = roar.collector_source(SessionCollector(run.session))
        elif run.mode is Mode.BOUNDARY:  # the service did not start
            session = Path(os.environ[tracer.ENV_SESSION])
            source = roar.collector_source(SessionCollector(session, root_pid=os.getpid()))
        job = roar.end_task(run._meta, status, error=error, source=source, wait=True)
        if run.session is not None and job.error is None:
            remove_session_dir(run.session)
        if roar.spool is not None:
            # Task processes leave with os._exit: send now what roar emits itself.
            roar.spool.flush(timeout=10.0)
        return result_of(job, status)


# ---- configuration, identity, internals (plain functions) -----------------------------


def provider_emits() -> bool:
    """Whether Airflow's OpenLineage provider sends the task events (else roar does)."""
    try:
        from airflow.providers.openlineage import conf as ol_conf
    except ImportError:
        return False
    return not ol_conf.is_disabled()


def settings() -> Settings:
    """The Roar this worker's tasks record with: roar's own configuration, except that when
    the provider sends the events roar only stores, under the provider's namespace; and
    Airflow's own files excluded."""
    global _SETTINGS
    if _SETTINGS is None:
        from roar_core.service import Settings

        overrides: dict[str, Any] = {}
        if provider_emits():
            from airflow.providers.openlineage import conf as ol_conf

            overrides = {"emit": False, "namespace": ol_conf.namespace()}
        dirs, globs = airflow_internal_paths()
        _SETTINGS = Settings(os.getcwd(), overrides, tuple(globs), tuple(dirs))
    return _SETTINGS


def _config() -> Config:
    """roar's configuration for this worker's tasks (what the recorder service uses too)."""
    global _CONFIG
    if _CONFIG is None:
        from roar_core import config

        st = settings()
        cfg = config.load(cwd=Path(st.cwd), **st.overrides)
        _CONFIG = replace(cfg, exclude=(*cfg.exclude, *st.exclude))
    return _CONFIG


def _roar() -> Roar:
    global _ROAR
    if _ROAR is None or _ROAR[0] != os.getpid():
        from roar_core.api import Roar

        _ROAR = (os.getpid(), Roar(_config(), internal=settings().internal))
    return _ROAR[1]


def _dag_run_id(dag_id: str, dag_run: Any) -> str:
    """The provider's run id of a DAG run: roar's workflow run for it."""
    from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter

    return str(OpenLineageAdapter.build_dag_run_id(
        dag_id=dag_id, logical_date=dag_run.logical_date or dag_run.run_after,
        clear_number=getattr(dag_run, "clear_number", 0)))


def finish_dag_run(dag_run: Any, status: str) -> None:
    """Close the DAG run's workflow run in the store, if a traced task of it made one."""
    from datetime import datetime, timezone

    from roar_core.store import DB_FILENAME, Store

    cfg = _config()
    if cfg.database_url is None and not (cfg.home / DB_FILENAME).exists():
        return  # no task of any DAG was traced here: nothing to close (and no store made)
    run_id = _dag_run_id(dag_run.dag_id, dag_run)
    with Store.open(cfg.database_url, cfg.home) as store:
        wf = store.workflow_run(run_id)
        if wf is not None and wf.ended_at is None:
            ended = getattr(dag_run, "end_date", None) or datetime.now(timezone.utc)
            store.finish_workflow_run(run_id, status, ended)


def task_identity(context: Any, namespace: str) -> TaskIdentity:
    """The provider's names for this task instance and its DAG run (same UUIDs)."""
    from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter

    ti, dag_run = context["ti"], context["dag_run"]
    date = dag_run.logical_date or dag_run.run_after
    dag_run_id = _dag_run_id(ti.dag_id, dag_run)
    run_id = OpenLineageAdapter.build_task_instance_run_id(
        dag_id=ti.dag_id, task_id=ti.task_id, try_number=ti.try_number, logical_date=date,
        map_index=ti.map_index)
    return TaskIdentity(
        namespace=namespace, job_name=f"{ti.dag_id}.{ti.task_id}", run_id=str(run_id),
        dag_id=ti.dag_id, dag_run_id=str(dag_run_id),
        engine_task_id=str(getattr(ti, "id", None) or f"{ti.dag_id}/{ti.run_id}/{ti.task_id}"),
        attempt=ti.try_number, secrets=_secrets(context),
    )


def _secrets(context: Any) -> tuple[str, ...]:
    """The task's keyword arguments and DAG params named like a secret (`api_key=...`):
    their values are masked wherever the task's commands carry them."""
    from roar_core.redact import is_secret_name

    task = context.get("task")
    named = {**(context.get("params") or {}), **(getattr(task, "op_kwargs", None) or {})}
    return tuple(v for k, v in named.items()
                 if isinstance(v, str) and v and is_secret_name(str(k)))


def airflow_version() -> str:
    from airflow import __version__

    return __version__


def airflow_internal_paths() -> tuple[list[str], list[str]]:
    """Airflow's own files, never lineage: (directories, globs).  AIRFLOW_HOME, the log
    folders, the OpenLineage provider's file transport and config file, and the plumbing
    of subprocess mode."""
    from airflow.configuration import AIRFLOW_HOME, conf

    dirs = [AIRFLOW_HOME]
    for section, key in (("logging", "base_log_folder"),
                         ("logging", "dag_processor_child_process_log_directory")):
        value = conf.get(section, key, fallback="")
        if value:
            dirs.append(os.path.abspath(value))
    globs = [os.path.join(tempfile.gettempdir(), SUBPROCESS_PLUMBING + "*", "*")]
    try:
        from airflow.providers.openlineage import conf as ol_conf
    except ImportError:
        return dirs, globs
    transport = ol_conf.transport()
    if transport.get("type") == "file" and transport.get("log_file_path"):
        # Without append, the transport writes <path>-<timestamp>.json files beside it.
        globs.append(glob.escape(os.path.abspath(transport["log_file_path"])) + "*")
    if ol_conf.config_path():
        globs.append(glob.escape(os.path.abspath(ol_conf.config_path())))
    return dirs, globs
