"""The public API the integrations (and the CLI) call.

    roar = Roar()                                   # config from the standard chain
    wf = roar.start_workflow("my_dag", engine="airflow")
    task = roar.begin_task("my_dag.extract", engine="airflow", workflow=wf)
    ...the task runs; its processes carry task.run_id as their tracer tag...
    roar.end_task(task, "COMPLETE")                 # returns at once
    roar.finish_workflow(wf, "COMPLETE")
    roar.finalize(timeout=30)                       # wait for hashing/store/spool

end_task hands the task to a background thread behind a bounded queue: collecting its
events, classification, hashing, the store and the spool all happen there, so the next
task is never kept waiting on lineage.  A lineage failure is logged, never raised into
the user's task.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

from roar_core import config as config_mod
from roar_core import emission, tracer
from roar_core.classification import PathFilter
from roar_core.declared import Declared
from roar_core.hashing import Hasher, StatCache
from roar_core.recorder import RecordedTask, Recorder, TaskMeta, TaskOutcome, gc_paused, now
from roar_core.session import SessionCollector
from roar_core.spool import Spool
from roar_core.store import Store, StoreError, WorkflowRun
from roar_core.tracelog import Record

log = logging.getLogger("roar")

RecordsSource = Callable[[str], tuple[list[Record], int]]  # tag -> (records, dropped)
_RELEASE_HELD = object()  # a queue item: record every held start now (finalize)


@dataclass
class _Job:
    meta: TaskMeta
    outcome: TaskOutcome
    source: RecordsSource | None
    done: threading.Event
    result: RecordedTask | None = None
    error: str | None = None


def default_client(cfg: config_mod.Config):
    """The OpenLineage client: configured the standard ways when the user configured it;
    otherwise (embedded defaults) a file transport under the roar home."""
    from openlineage.client import OpenLineageClient
    from openlineage.client.transport.file import FileConfig, FileTransport

    # The client's own search (OPENLINEAGE_CONFIG, ./openlineage.yml,
    # ~/.openlineage/openlineage.yml) decides whether a config file exists.
    configured = any(k.startswith("OPENLINEAGE_") and k != "OPENLINEAGE_NAMESPACE"
                     for k in os.environ) or OpenLineageClient._find_yaml_config_path()
    if configured:
        return OpenLineageClient()
    out = cfg.home / "openlineage" / "events.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    return OpenLineageClient(transport=FileTransport(
        FileConfig(log_file_path=str(out), append=True)))


class Roar:
    def __init__(self, cfg: config_mod.Config | None = None, *,
                 internal: Iterable[str | os.PathLike] = (), client=None,
                 progress: Callable[[int, int], None] | None = None,
                 max_pending: int = 256, use_mmap: bool = True, send: bool = True,
                 hold_start_s: float = 0.0):
        """`hold_start_s`: how long a begun task's start may wait to be recorded.  Ended
        within it, a task's start and end are recorded together (one commit, one spool
        sync): for engines of many short tasks, half the recording work.  Its START event is
        that much later for a long task."""
        self.config = cfg or config_mod.load()
        c = self.config
        try:
            c.home.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create roar home {c.home}: {e.strerror or e}") from None
        self.store = Store.open(url=c.database_url, home=c.home)
        # send=False: no sender thread; events are delivered by `spool.flush` (or later by
        # another process) only.
        self.spool = (Spool(c.spool_dir, client=client or default_client(c), start=send)
                      if c.emit else None)
        self.cache = StatCache(c.statcache_path)
        self.hasher = Hasher(self.cache, workers=c.hash_workers or None, use_mmap=use_mmap,
                             native=c.native_hash)
        keep = PathFilter.for_config(c, internal)
        self.recorder = Recorder(self.store, self.spool, self.hasher, keep, c.file_host, progress,
                                 match_min_size=c.match_min_size)
        self.host = socket.gethostname()
        self._queue: queue.Queue[_Job | object | None] = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.hold_start_s = hold_start_s
        # Begun tasks whose start is not recorded yet -> when it must be.  Only the recorder
        # thread records them, so a task's START always precedes its end.
        self._held: dict[str, tuple[TaskMeta, float]] = {}
        self._engines: dict[str, emission.Engine] = {}  # workflow run -> its engine

    # ---- workflow runs ---------------------------------------------------------------

    def start_workflow(self, job_name: str, engine: str, run_id: str | None = None,
                       facets: dict | None = None,
                       engine_version: emission.Engine | None = None,
                       started_at: datetime | None = None) -> emission.RunRef:
        """`engine_version`: the engine that runs the workflow, its `processing_engine`
        facet on the workflow run's events."""
        ref = emission.RunRef(self.config.namespace, job_name, run_id or emission.new_run_id())
        started = started_at or now()
        self.store.start_workflow_run(WorkflowRun(ref.run_id, engine, ref.namespace, job_name,
                                                  started, facets or {}))
        if engine_version is not None:
            self._engines[ref.run_id] = engine_version
        self.recorder.emit(emission.workflow_start(emission.WorkflowLineage(
            namespace=ref.namespace, job_name=job_name, run_id=ref.run_id, event_time=started,
            engine=engine_version)))
        return ref

    def finish_workflow(self, ref: emission.RunRef, status: str = "COMPLETE",
                        error: str | None = None,
                        engine_version: emission.Engine | None = None,
                        ended_at: datetime | None = None) -> None:
        self.finalize()  # tasks first: their COMPLETE events precede the workflow's
        ended = ended_at or now()
        self.store.finish_workflow_run(ref.run_id, status, ended)
        engine = self._engines.pop(ref.run_id, None) or engine_version
        w = emission.WorkflowLineage(namespace=ref.namespace, job_name=ref.job_name,
                                     run_id=ref.run_id, event_time=ended, error_message=error,
                                     engine=engine)
        make = {"COMPLETE": emission.workflow_complete, "FAIL": emission.workflow_fail,
                "ABORT": emission.workflow_abort}[status]
        self.recorder.emit(make(w))

    # ---- tasks -----------------------------------------------------------------------

    def begin_task(self, job_name: str, engine: str, *, workflow: emission.RunRef | None = None,
                   engine_task_id: str | None = None, attempt: int = 0,
                   parent_run_id: str | None = None, command: list[str] | None = None,
                   pid: int | None = None, node_id: str | None = None, traced: bool = True,
                   untraced_reason: str | None = None, run_id: str | None = None,
                   run_facets: dict | None = None,
                   declared: Declared | None = None,
                   engine_version: emission.Engine | None = None,
                   started_at: datetime | None = None,
                   secrets: tuple[str, ...] = ()) -> TaskMeta:
        """`declared`: the files the engine declared for the task; the recorder compares
        them with the trace (the `roar_io` facet) and adds declared code and engine-made
        outputs.  `started_at`: when the engine started it (default: now).  `secrets`:
        values known to be secret (redact.redact_argv)."""
        meta = TaskMeta(
            run_id=run_id or emission.new_run_id(), engine=engine,
            namespace=self.config.namespace, job_name=job_name,
            started_at=started_at or now(),
            engine_task_id=engine_task_id, attempt=attempt, workflow=workflow,
            parent_run_id=parent_run_id, command=command, host=self.host,
            pid=pid or os.getpid(), node_id=node_id, traced=traced,
            untraced_reason=untraced_reason, run_facets=run_facets or {}, declared=declared,
            engine_version=engine_version, secrets=tuple(secrets),
        )
        if not traced:
            log.warning("roar: task %s runs UNTRACED: %s", job_name, untraced_reason)
        if self.hold_start_s > 0:
            with self._lock:
                self._held[meta.run_id] = (meta, time.monotonic() + self.hold_start_s)
            self._ensure_thread()  # its wait ends when the start is due
        else:
            self.recorder.started(meta)
        return meta

    def end_task(self, meta: TaskMeta, status: str = "COMPLETE", *, exit_code: int | None = None,
                 error: str | None = None, source: RecordsSource | None = None,
                 wait: bool = False, ended_at: datetime | None = None) -> _Job:
        """Hand a finished task to the background recorder.  `source` gives its records
        (by tag); without one the task is recorded with no file I/O.  `ended_at`: when
        the engine saw it end (default: now)."""
        job = _Job(meta, TaskOutcome(status, ended_at or now(), exit_code, error), source,
                   threading.Event())
        self._ensure_thread()
        self._queue.put(job)
        if wait:
            job.done.wait()
        return job

    def collector_source(self, collector: SessionCollector) -> RecordsSource:
        def source(tag: str) -> tuple[list[Record], int]:
            collector.collect()
            t = collector.take(tag)
            return t.records, t.dropped
        return source

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="roar-recorder",
                                                daemon=True)
                self._thread.start()

    def _work(self) -> None:
        tracer.ignore_this_thread()  # recording is not the I/O of a task running meanwhile
        while True:
            # A start held after this wait began is due within two holds at most.
            due = self._release_held()
            try:
                job = self._queue.get(timeout=(self.hold_start_s or None) if due is None else due)
            except queue.Empty:
                continue
            try:
                if job is None:
                    return
                if job is _RELEASE_HELD:
                    self._release_held(everything=True)
                    continue
                with self._lock:
                    held = self._held.pop(job.meta.run_id, None) is not None
                with gc_paused():
                    records, dropped = job.source(job.meta.run_id) if job.source else ([], 0)
                    job.outcome.dropped += dropped
                    job.result = self.recorder.record(job.meta, job.outcome, records,
                                                      start=held)
            except Exception as e:  # lineage must never take the worker down
                job.error = f"{type(e).__name__}: {e}"
                log.error("roar: lineage of task %s lost: %s", job.meta.job_name, job.error,
                          exc_info=log.isEnabledFor(logging.DEBUG))
            finally:
                if isinstance(job, _Job):
                    job.done.set()
                self._queue.task_done()

    def _release_held(self, everything: bool = False) -> float | None:
        """Record the held starts that are due (all of them: `everything`); the seconds
        until the next one is, or None when none is held."""
        now_s = time.monotonic()
        with self._lock:
            due = [m for m, at in self._held.values() if everything or at <= now_s]
            for meta in due:
                del self._held[meta.run_id]
            nxt = min((at for _, at in self._held.values()), default=None)
        for meta in due:
            try:
                self.recorder.started(meta)
            except Exception as e:  # its end still records the task (without a start row)
                log.error("roar: start of task %s not recorded: %s: %s", meta.job_name,
                          type(e).__name__, e)
        return None if nxt is None else max(0.0, nxt - time.monotonic())

    def pending(self) -> int:
        return self._queue.unfinished_tasks

    def finalize(self, timeout: float | None = 60.0) -> bool:
        """Wait until every handed-off task is recorded, and the held starts of tasks
        still running; True if all were in time."""
        with self._lock:
            held = bool(self._held)
        if held:
            self._ensure_thread()
            self._queue.put(_RELEASE_HELD)
        deadline = None if timeout is None else datetime.now(timezone.utc).timestamp() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = None if deadline is None else deadline - datetime.now(
                    timezone.utc).timestamp()
                if left is not None and left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    def close(self, timeout: float = 10.0) -> None:
        self.finalize(timeout)
        if self.spool is not None:
            if timeout > 0:
                self.spool.flush(timeout)
            self.spool.close()
        self.hasher.close()
        self.cache.close()
        self.store.close()

