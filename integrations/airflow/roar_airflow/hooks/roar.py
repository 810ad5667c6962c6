"""The client layer: attach roar-core's tracer to an Airflow task and record it.

Three ways a task can run, picked per task at execute time (`RoarHook.mode`):

* boundary   -- the worker was started with the shim preloaded (`eval "$(roar-core env
  airflow)"` before `airflow scheduler` or `airflow celery worker`).  Airflow forks every task
  from that worker, so the shim is already in the task process: the task's boundaries are
  marked through the shim's API and nothing else changes.
* subprocess -- no shim here: the work runs in a traced child process (the Python callable
  like `@task.external_python` does; a classic operator's own child processes, e.g. bash),
  which logs into a session of the task's own.
* untraced   -- the tracer cannot work here (missing, refused by the loader): the task runs
  as usual and is recorded as untraced, with the reason.

In every mode the task process appends the task's begin and end to its task log, and the
session's recorder process (roar_core.recording: one warm recorder for all the worker's task
processes) answers with the lineage, which the provider needs before the task process exits:
a FIFO wake-up, not a cold start.  The versions must be those the task left, and once
Airflow has the task's state a downstream task may rewrite its files: so the task waits for
the answer at its end, unless its end line can say in which state it left each file it may
have written (boundary mode, no process started in the task: its own tracer log names
them).  Then the recorder checks each version it takes against that state (another one:
unknown), and the task waits only when the provider asks for the lineage, after Airflow's
own end of the task (its XCom and state sent to the API server), which the recorder's work
overlaps.  Roar's listener, called there first, takes the answer in the task process if it
has come (it has, mostly): the provider's request then finds it.

Identity follows the OpenLineage provider exactly (job `<dag_id>.<task_id>`, its run ids for
task and DAG run), so what roar stores and what the provider emits name the same runs.
Nothing here hashes, classifies or builds events: that is roar-core's.
"""

from __future__ import annotations

import atexit
import enum
import glob
import os
import select
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roar_airflow.version_compat import BaseHook
from roar_core.ids import host_name
from roar_core.pipeline import tracer
from roar_core.recording import tasklog
from roar_core.recording.tasklog import Result, TaskLog

# The tracer and the task log, light (the standard library; ctypes once the tracer is
# asked for), are imported here, not in the functions: there `from package import module`
# runs importlib's Python code at each call, which in a task process just forked first
# touched ~20 pages of the worker's memory.  The recorder's side is imported where needed
# (`import package.module as module`: no importlib code run).
try:
    from _sha1 import sha1 as _sha1  # CPython's own SHA-1 (see `_OWN_RUN_IDS`)
except ImportError:  # a Python built without it
    _sha1 = None

if TYPE_CHECKING:
    from roar_core.config import Config
    from roar_core.pipeline.emission import RunRef

ENGINE = "airflow"
# Where _BasePythonVirtualenvOperator writes the script, arguments and result it hands to
# its child (tempfile.TemporaryDirectory(prefix="venv-call")): plumbing, never lineage.
SUBPROCESS_PLUMBING = "venv-call"
# How long a task waits for its lineage: the first task of a worker waits for the recorder
# to start (~1 s of imports).  Past it the task goes on without lineage in its events; the
# recorder still records it.
WAIT_S = 30.0
# The provider asks for the lineage in a child it gives `[openlineage] execution_timeout`
# (10 s) and then kills, events unsent: the wait there must end well before.
PROVIDER_WAIT_SHARE = 0.8
RECORDER_IDLE_EXIT_S = 600.0  # a worker's recorder waits this long for its next task


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
        from roar_core.pipeline.emission import RunRef

        return RunRef(**self.workflow)


@dataclass
class TaskRun:
    """One task instance as roar sees it, from begin to end."""

    ident: TaskIdentity
    mode: Mode
    # The session its task log is in (its recorder's).  A string: in a task process just
    # forked, making a pathlib.Path first touched ~55 pages of the worker's memory (~0.2 ms
    # of the task's path).
    directory: str
    result: Result | None = None  # its recorded lineage, once ended
    session: Path | None = None  # the task's own session dir (subprocess mode)
    # Time roar spent on the task's critical path, timed by the operator (all of roar's work
    # there, the hook's calls among it); of which at its begin (the rest: its end, the
    # answer's wait).
    roar_seconds: float = 0.0
    begin_seconds: float = 0.0
    recorded_by: str = "recorder"
    status: str | None = None  # as it ended
    log_from: tuple[str, int] | None = None  # the shim's log and where the task began in it
    # Ended, its answer not taken yet: the log it ended in (the provider may ask in a
    # process forked from the task's, whose own task log it is not) and the FIFO the
    # recorder pokes once it has answered.
    ended_in: TaskLog | None = None
    answer_fd: int | None = None
    logged: bool = False  # its lineage said in the task's log

    @property
    def run_id(self) -> str:
        return self.ident.run_id


@dataclass(frozen=True)
class Settings:
    """How the recorder records this worker's tasks: roar's configuration from `cwd` with
    `overrides`, plus exclude globs and internal directories."""

    cwd: str
    overrides: dict[str, Any]
    exclude: tuple[str, ...] = ()
    internal: tuple[str, ...] = ()


# Per process: Airflow forks a new task process from its worker for every task, and
# `airflow dags test` runs all tasks in one process.
_TASKS: tuple[int, str, TaskLog] | None = None
# Tasks ended whose answer nobody took (the provider did not ask): their FIFOs, closed
# and removed at the next task's end or at exit.
_UNANSWERED: dict[str, tuple[int, TaskRun]] = {}
_AT_EXIT_PID: int | None = None
_SETTINGS: Settings | None = None
_CONFIG: Config | None = None


class RoarHook(BaseHook):
    """Marks task boundaries for roar-core and hands it the finished task."""

    hook_name = "roar"  # no connection: roar is configured like roar-core itself

    # ---- mode ------------------------------------------------------------------------

    # What a warmed-up worker found: its pid, its mode and its tracer session.  The task
    # processes it forks, whose environment is its own, take them as theirs: looking
    # again, at os.environ, first touched ~25 pages of the worker's memory in each.
    _warm: tuple[int, tuple[Mode, str], str] | None = None

    def mode(self) -> tuple[Mode, str]:
        """How this task can be traced here, and a sentence saying why (for the task log)."""
        warm = self._warm
        if warm is not None and warm[0] != os.getpid():
            return warm[1]
        return self._mode()

    def remember(self) -> None:
        """Keep this worker's mode and session for the task processes it forks (its
        warm-up, in boundary mode)."""
        mode = self._mode()
        if mode[0] is Mode.BOUNDARY:
            self._warm = (os.getpid(), mode, os.environ[tracer.ENV_SESSION])

    def _session(self) -> str:
        """The tracer's session, where a task in boundary mode logs."""
        warm = self._warm
        if warm is not None and warm[0] != os.getpid():
            return warm[2]
        return os.environ[tracer.ENV_SESSION]

    def _mode(self) -> tuple[Mode, str]:
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
        cfg = _config()
        ident = task_identity(context, cfg.namespace)
        if mode is Mode.BOUNDARY:
            directory = self._session()
        else:
            # The host's session for tasks of workers started without the tracer.
            directory = os.path.join(cfg.sessions_dir, f"airflow-{host_name()}")
        run = TaskRun(ident, mode, directory)
        tasks = _task_log(directory)
        own = None
        if mode is Mode.SUBPROCESS:
            # The child writes its logs into a session of its own (read whole at its end).
            run.session = Path(directory, ident.run_id)
            run.session.mkdir()
            own = ident.run_id
        tasks.begun(begin_meta(ident, mode, untraced_reason), own_dir=own)
        if mode is not Mode.BOUNDARY:
            # (In boundary mode, where the task's path is short, its end finds out whether
            # a recorder listens, which it must wake anyway: `end`.)
            self._ensure_recorder(directory)
        if mode is Mode.BOUNDARY:
            run.log_from = tasklog.trace_mark()
            tracer.loaded().begin(ident.run_id)
        return run

    def child_env(self, run: TaskRun, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment that makes a child process of the task traced (subprocess mode)."""
        if run.mode is not Mode.SUBPROCESS or run.session is None:
            return dict(os.environ if base is None else base)
        return tracer.preload_env(run.session, tag=run.run_id, base=base)

    def end(self, run: TaskRun, status: str, error: str | None = None, *,
            wait: bool = True) -> TaskRun:
        """Close the task: its end line asks the recorder for its lineage at once.  `wait`
        False: where the task's files can be checked later, wait for it only in `answer`
        (the provider asks for it after Airflow's own end of the task, which the recorder's
        work overlaps); else, and with `wait`, now."""
        left = None
        if run.mode is Mode.BOUNDARY:
            tracer.loaded().end()
            if not wait and run.log_from is not None:
                left = tasklog.left_states(*run.log_from)
        tasks = run.ended_in = _task_log(run.directory)
        run.status = status
        # Early: the provider needs the lineage, not the store's commit of it.
        run.answer_fd = tasks.ended(run.run_id, status, error=error, wait=True, early=True,
                                    left=left)
        if not tasks.heard:
            # No recorder listened (none started yet, it died, it left when idle): one now,
            # which finds the task in its log.
            self._ensure_recorder(run.directory)
        if left is None:
            # The recorder must take the versions before Airflow hears of the task's end
            # (and may start a task that rewrites them): the task waits for them now.
            self.answer(run)
        else:
            _unanswered(run)
        return run

    def _ensure_recorder(self, directory: str) -> None:
        import roar_core.recording.recorder as recorder

        try:
            recorder.ensure(directory)
        except OSError as e:  # recorded at the task's end, in this process
            self.log.warning("roar: cannot start the recorder process: %s", e)

    def take_answer(self, run: TaskRun) -> bool:
        """The ended task's lineage if the recorder has answered already (never waits):
        roar's listener asks at Airflow's end of the task, in the task process, before the
        provider forks the child that asks for it.  In that child, a process just forked,
        reading the answer first touched ~130 pages of memory (~0.45 ms of the task's
        path); here, where the task's begin and end touched most of them, ~40.  False:
        not answered yet (the provider's request waits for it)."""
        if run.result is not None:
            return True
        if run.answer_fd is None or not select.select([run.answer_fd], [], [], 0)[0]:
            return False
        self.answer(run, timeout=0)
        return True

    def answer(self, run: TaskRun, timeout: float = WAIT_S) -> Result:
        """The ended task's lineage, waited for up to `timeout` if the recorder has not
        answered yet (then: a failed Result saying so; the recorder records it later)."""
        import roar_core.recording.recorder as recorder

        if run.result is not None:
            return run.result
        tasks = run.ended_in or _task_log(run.directory)
        fd, run.answer_fd = run.answer_fd, None
        _UNANSWERED.pop(run.run_id, None)
        recorded = tasks.wait_for(run.run_id, fd, timeout)
        if not recorded and not recorder.running(run.directory):
            # No recorder could start: the last resort, recording here.
            self.log.warning("roar: no recorder process for %s; recording in the task "
                             "process", run.directory)
            try:
                recorder.record_here(run.directory)
            except Exception as e:
                self.log.error("roar: cannot record here: %s: %s", type(e).__name__, e)
            tasks.read_results()
            run.recorded_by = "in-process"
        found = tasks.results.get(run.run_id)
        run.result = Result(found) if found is not None else Result.failed(
            run.status or "FAIL", f"not recorded within {timeout:.0f} s (the recorder records "
            "it later; see recorder.log in the session)")
        return run.result


# ---- configuration, identity, internals (plain functions) -----------------------------


_HOOK: RoarHook | None = None


def shared_hook() -> RoarHook:
    """The process's RoarHook, made once: by a traced worker at its warm-up, which the task
    processes it forks inherit (making one in a task process just forked took ~0.25 ms,
    ~100 pages copied).  Its log is its own logger's, in the task's log."""
    global _HOOK
    if _HOOK is None:
        _HOOK = RoarHook()
    return _HOOK


def begin_meta(ident: TaskIdentity, mode: Mode, untraced_reason: str | None) -> dict[str, Any]:
    """The task's begin line (TaskLog.begun's log form)."""
    return {
        "run_id": ident.run_id, "engine": ENGINE, "namespace": ident.namespace,
        "job_name": ident.job_name, "started_at": datetime.now(timezone.utc).isoformat(),
        "engine_task_id": ident.engine_task_id, "attempt": ident.attempt,
        "host": host_name(), "pid": os.getpid(),
        "traced": mode is not Mode.UNTRACED, "untraced_reason": untraced_reason,
        "workflow": ident.workflow, "secrets": list(ident.secrets),
        "engine_version": {"name": ENGINE, "version": airflow_version()},
    }


REHEARSALS = 10  # (CPython 3.11 quickens a function at its 8th call)


def rehearse(times: int = REHEARSALS) -> None:
    """Run the code of a task's begin and end `times` over, for a made-up task in a scratch
    directory, in a worker about to fork task processes (the plugin's warm-up).  CPython
    rewrites a function's bytecode in place over its first calls (a warm-up count, then
    quickened and specialized instructions): each task process forked from a worker that
    had never run them wrote into the code objects of all the functions its begin and end
    ran, each write a copy of a 4 KiB page shared with the worker (~3.5 us each here; ~75
    of the ~430 a task's begin, end and answer copied).  Nothing here tags the tracer or
    reaches a recorder: the scratch directory has none; and the tracer does not record
    it (a task process forked later must not find it in the log it inherits)."""
    shim = tracer.loaded()
    if shim is None:
        return
    try:
        with shim.ignoring():
            _rehearse(times)
    except RuntimeError:  # a shim that cannot ignore a thread for a while: no rehearsal
        pass


def _rehearse(times: int) -> None:
    from types import SimpleNamespace

    context = {
        "ti": SimpleNamespace(dag_id="roar_rehearsal", task_id="task", try_number=1,
                              map_index=-1, id="roar-rehearsal"),
        "dag_run": SimpleNamespace(logical_date=datetime.now(timezone.utc), run_after=None,
                                   clear_number=0),
        "params": {},
    }
    namespace = _config().namespace
    hook = shared_hook()
    scratch = tempfile.mkdtemp(prefix="roar-rehearsal-")
    try:
        for _ in range(times):
            hook.mode()
            ident = task_identity(context, namespace)
            tasks = TaskLog(scratch, head_with_first=True)
            tasks.begun(begin_meta(ident, Mode.BOUNDARY, None))
            mark = tasklog.trace_mark()
            left = tasklog.left_states(*mark) if mark is not None else None
            # (no recorder listens here: nothing is recorded, none is started)
            fd = tasks.ended(ident.run_id, "COMPLETE", wait=True, early=True, left=left)
            tasks.wait_for(ident.run_id, fd, 0)
            tasks.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def provider_emits() -> bool:
    """Whether Airflow's OpenLineage provider sends the task events (else roar does)."""
    try:
        import airflow.providers.openlineage.conf as ol_conf
    except ImportError:
        return False
    return not ol_conf.is_disabled()


def provider_wait_s() -> float:
    """How long the provider's request for a task's lineage may wait for the answer."""
    import airflow.providers.openlineage.conf as ol_conf

    return min(WAIT_S, PROVIDER_WAIT_SHARE * ol_conf.execution_timeout())


def settings() -> Settings:
    """How this worker's tasks are recorded: roar's own configuration, except that when
    the provider sends the events roar only stores, under the provider's namespace; and
    Airflow's own files excluded."""
    global _SETTINGS
    if _SETTINGS is None:
        overrides: dict[str, Any] = {}
        if provider_emits():
            import airflow.providers.openlineage.conf as ol_conf

            overrides = {"emit": False, "namespace": ol_conf.namespace()}
        dirs, globs = airflow_internal_paths()
        _SETTINGS = Settings(os.getcwd(), overrides, tuple(globs), tuple(dirs))
    return _SETTINGS


def _config() -> Config:
    """roar's configuration for this worker's tasks (what its recorder records with)."""
    global _CONFIG
    if _CONFIG is None:
        from roar_core import config

        st = settings()
        cfg = config.load(cwd=Path(st.cwd), **st.overrides)
        _CONFIG = cfg.replace(exclude=(*cfg.exclude, *st.exclude))
    return _CONFIG


def _unanswered(run: TaskRun) -> None:
    """Note the ended task's FIFO; let go of those of this process's earlier tasks (`airflow
    dags test` runs every task in one process) whose answer nobody took."""
    global _AT_EXIT_PID
    _let_go_all()
    if run.answer_fd is not None:
        _UNANSWERED[run.run_id] = (os.getpid(), run)
        if _AT_EXIT_PID != os.getpid():  # (Airflow clears atexit in the processes it forks)
            atexit.register(_let_go_all)
            _AT_EXIT_PID = os.getpid()


def _let_go_all() -> None:
    for pid, run in _UNANSWERED.values():
        fd, run.answer_fd = run.answer_fd, None
        if pid == os.getpid() and fd is not None and run.ended_in is not None:
            run.ended_in.done_waiting(run.run_id, fd)
    _UNANSWERED.clear()


def _task_log(directory: str | Path) -> TaskLog:
    """This process's task log in `directory` (a forked task process makes its own)."""
    global _TASKS
    if _TASKS is None or _TASKS[0] != os.getpid() or _TASKS[1] != str(directory):
        # (the recorder is started after: settings first)
        tasks = TaskLog(directory, head_with_first=True)  # (its first line: the task's begin)
        write_settings(directory, again=tasks.made_directory)
        _TASKS = (os.getpid(), str(directory), tasks)
    return _TASKS[2]


def write_settings(directory: str | Path, again: bool = False) -> None:
    """The settings of the directory's recorder, once per worker: a worker warmed up
    (roar_airflow.plugins.roar) writes them before it forks its tasks, which then need
    not look (~0.1 ms of each task's path).  `again`: the directory was made anew."""
    if str(directory) not in _SETTINGS_WRITTEN:
        shim = tracer.loaded()
        if shim is not None:
            # Airflow's files and roar's home (Airflow's database's WAL, say) are written
            # on the task's thread through descriptors held open: the tracer need not look
            # at them as each task begins and ends.  The tasks forked from here inherit it.
            # (`directory`, with the task log, is the tracer's session: quiet already.)
            shim.quiet([_config().home, *settings().internal])
    if again or str(directory) not in _SETTINGS_WRITTEN:
        import roar_core.recording.recorder as recorder

        # It makes the directory where it is missing (a mkdir each time cost ~0.1 ms).
        recorder.write_settings(directory, _config(), settings().internal,
                                idle_exit_s=RECORDER_IDLE_EXIT_S, waited=True)
        _SETTINGS_WRITTEN.add(str(directory))


_SETTINGS_WRITTEN: set[str] = set()


def _dag_run_id(dag_id: str, dag_run: Any) -> str:
    """The provider's run id of a DAG run: roar's workflow run for it."""
    return run_ids(dag_id, dag_run.logical_date or dag_run.run_after,
                   getattr(dag_run, "clear_number", 0))[0]


def run_ids(dag_id: str, date: datetime, clear_number: int,
            task: tuple[str, int, int] | None = None) -> tuple[str, str | None]:
    """The provider's OpenLineage run ids of a DAG run and, given `task` (task id, try
    number, map index), of that task instance in it."""
    if _OWN_RUN_IDS:
        import airflow.providers.openlineage.conf as ol_conf

        return _own_run_ids(ol_conf.namespace(), dag_id, date, clear_number, task)
    from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter as adapter

    dag_run = str(adapter.build_dag_run_id(dag_id=dag_id, logical_date=date,
                                           clear_number=clear_number))
    if task is None:
        return dag_run, None
    task_id, try_number, map_index = task
    return dag_run, str(adapter.build_task_instance_run_id(
        dag_id=dag_id, task_id=task_id, try_number=try_number, logical_date=date,
        map_index=map_index))


# The run ids made here, not by the provider: set by a worker's warm-up where they are the
# provider's (`check_run_ids`).  The provider's take SHA-1 from hashlib, OpenSSL's, whose
# first use in a task process just forked took ~0.15 ms (its method store's locks and
# counts first touched); CPython's own SHA-1 (`_sha1`) gives the same digest in ~0.03.
_OWN_RUN_IDS = False


def check_run_ids() -> bool:
    """Make the run ids here from now on if, on a few made-up tasks, they are the
    provider's (else, or without CPython's SHA-1, the provider makes them)."""
    global _OWN_RUN_IDS
    _OWN_RUN_IDS = False
    samples = [("roar_check", datetime.now(timezone.utc), 0, ("task", 1, -1)),
               ("dag.é-1", datetime(2024, 2, 29, 23, 59, 59, 999999,
                                    tzinfo=timezone(timedelta(hours=-5))), 3, ("t.x", 4, 17))]
    try:
        import airflow.providers.openlineage.conf as ol_conf

        ours = [_own_run_ids(ol_conf.namespace(), *x) for x in samples]
        _OWN_RUN_IDS = ours == [run_ids(*x) for x in samples]  # (those: the provider's)
    except Exception:  # (no _sha1 in this Python, a provider that changed): still False
        pass
    return _OWN_RUN_IDS


def _own_run_ids(namespace: str, dag_id: str, date: datetime, clear_number: int,
                 task: tuple[str, int, int] | None) -> tuple[str, str | None]:
    """As the provider makes them (airflow.providers.openlineage.utils.utils
    .build_dag_run_ol_run_id, build_task_instance_ol_run_id)."""
    dag_run = _static_uuid(date, f"{namespace}.{dag_id}.{clear_number}")
    if task is None:
        return dag_run, None
    task_id, try_number, map_index = task
    return dag_run, _static_uuid(
        date, f"{namespace}.{dag_id}.{task_id}.{try_number}.{map_index}")


def _static_uuid(instant: datetime, data: str) -> str:
    """openlineage.client.uuid.generate_static_uuid(instant, data.encode()), as a string:
    a UUIDv7 of the instant's milliseconds whose other bits are SHA-1's of the instant
    and the data."""
    utc = instant.astimezone(timezone.utc)
    node = int.from_bytes(_sha1((utc.isoformat() + data).encode()).digest()[:10], "big") >> 4
    n = (int(utc.timestamp() * 1000) & 0xFFFF_FFFF_FFFF) << 80 | node
    n = (n & ~(0xF000 << 64) | 7 << 76) & ~(0xC000 << 48) | 0x8000 << 48  # version, variant
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def finish_dag_run(dag_run: Any, status: str) -> None:
    """Close the DAG run's workflow run in the store, if a traced task of it made one."""
    from datetime import datetime, timezone

    from roar_core.pipeline.store import DB_FILENAME, Store

    cfg = _config()
    if cfg.database_url is None and not os.path.exists(os.path.join(cfg.home, DB_FILENAME)):
        return  # no task of any DAG was traced here: nothing to close (and no store made)
    run_id = _dag_run_id(dag_run.dag_id, dag_run)
    with Store.open(cfg.database_url, cfg.home) as store:
        wf = store.workflow_run(run_id)
        if wf is not None and wf.ended_at is None:
            ended = getattr(dag_run, "end_date", None) or datetime.now(timezone.utc)
            store.finish_workflow_run(run_id, status, ended)


def task_identity(context: Any, namespace: str) -> TaskIdentity:
    """The provider's names for this task instance and its DAG run (same UUIDs)."""
    ti, dag_run = context["ti"], context["dag_run"]
    dag_run_id, run_id = run_ids(ti.dag_id, dag_run.logical_date or dag_run.run_after,
                                 getattr(dag_run, "clear_number", 0),
                                 (ti.task_id, ti.try_number, ti.map_index))
    return TaskIdentity(
        namespace=namespace, job_name=f"{ti.dag_id}.{ti.task_id}", run_id=str(run_id),
        dag_id=ti.dag_id, dag_run_id=dag_run_id,
        engine_task_id=str(getattr(ti, "id", None) or f"{ti.dag_id}/{ti.run_id}/{ti.task_id}"),
        attempt=ti.try_number, secrets=_secrets(context),
    )


def _secrets(context: Any) -> tuple[str, ...]:
    """The task's keyword arguments and DAG params named like a secret (`api_key=...`):
    their values are masked wherever the task's commands carry them."""
    from roar_core.pipeline.redact import is_secret_name

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
        import airflow.providers.openlineage.conf as ol_conf
    except ImportError:
        return dirs, globs
    transport = ol_conf.transport()
    if transport.get("type") == "file" and transport.get("log_file_path"):
        # Without append, the transport writes <path>-<timestamp>.json files beside it.
        globs.append(glob.escape(os.path.abspath(transport["log_file_path"])) + "*")
    if ol_conf.config_path():
        globs.append(glob.escape(os.path.abspath(ol_conf.config_path())))
    return dirs, globs
