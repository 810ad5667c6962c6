"""One Snakemake invocation's lineage: the workflow run, one task per job, the summary.

The executor calls `begin` on the thread that runs a job, `fail` there when the job raised
(before Snakemake deletes its partial outputs), `complete` once Snakemake has post-processed
a job (outputs moved out of the shadow directory, touch() done, temp files still there), and
`close` at shutdown.  Each is one line in this process's task log; the recording is
done by roar_core's recorder process (roar_core.recording): Snakemake's scheduler holds the
GIL, so recording in its process would slow every job.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import roar_core
from roar_core import config as config_mod
from roar_core.ids import host_name, new_run_id
from roar_core.pipeline import tracer
from roar_core.recording import recorder
from roar_core.recording.sessions import hold_owner_lock, new_session_dir
from roar_core.recording.tasklog import Result, TaskLog
from snakemake_executor_plugin_roar import jobs, tracing

log = logging.getLogger("roar")
ENGINE = "snakemake"
WAIT_S = 60.0  # for one job's lineage (temp() outputs hashed before Snakemake deletes them)
CLOSE_WAIT_S = 300.0  # for every job's, at the end of the run


class SetupError(Exception):
    """The executor cannot start as configured; the message names what to change."""


@dataclass
class _Task:
    run_id: str
    binding: tracing.Binding | None
    unshadow: bool
    temp_outputs: bool
    early: bool  # record as soon as its processes are done (see `finished`)
    ended_at: datetime | None = None  # when its processes were done


@dataclass
class Lineage:
    tasks: TaskLog
    directory: Path
    config: config_mod.Config
    workflow_run: str
    name: str
    traced: bool
    untraced_reason: str | None
    shadow_root: str
    workdir: str
    engine_version: tuple[str, str]
    in_process_run: bool
    namespace: str
    _owner: int | None = None
    _detach: object = None
    _tasks: dict[int, _Task] = field(default_factory=dict)
    _jobs: dict[str, str] = field(default_factory=dict)  # run id -> "rule x (jobid n, ...)"
    _failed: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False

    # ---- setup ---------------------------------------------------------------------------

    @classmethod
    def start(cls, workflow, settings) -> Lineage:
        status = tracer.status()
        if not status.usable and settings.require_tracer:
            raise SetupError(
                f"roar: the tracer cannot be used here ({status.reason}); drop "
                "--roar-require-tracer to run the jobs untraced (recorded as such)")
        workdir = os.getcwd()
        try:
            cfg = config_mod.load(cwd=Path(workdir), home=settings.home,
                                  namespace=settings.namespace)
        except config_mod.ConfigError as e:
            raise SetupError(f"roar: {e} (or set --roar-home / --roar-namespace)") from None
        if cfg.disabled:
            raise SetupError("roar is disabled (ROAR_DISABLED / disabled = true): use "
                             "--executor local, or enable roar")
        persistence = workflow.persistence
        internal = [persistence.path, persistence.shadow_path,
                    workflow.sourcecache.cache_path, workflow.sourcecache.runtime_cache_path,
                    # roar's own code (a spawned `python -m snakemake` imports this plugin)
                    Path(roar_core.__file__).parent, Path(jobs.__file__).parent]
        # Local copies of storage files and conda environments, wherever they were put.
        internal.append(getattr(workflow.storage_settings, "local_storage_prefix", None))
        internal.append(getattr(workflow.deployment_settings, "conda_prefix", None))
        import snakemake

        name = settings.workflow_name or os.path.basename(workdir) or "snakemake"
        engine = {"name": ENGINE, "version": snakemake.__version__}
        wf = new_run_id()
        try:
            # This invocation's sessions: its task log, and a tracer session per job.
            directory = Path(new_session_dir(cfg, f"snakemake-{wf}", in_memory=True))
            owner = hold_owner_lock(directory)  # never swept while we live
            recorder.write_settings(directory, cfg, [*(p for p in internal if p), directory])
            tasks = TaskLog(directory, results=True, common={
                "engine": ENGINE, "namespace": cfg.namespace, "host": host_name(),
                "workflow": {"namespace": cfg.namespace, "job_name": name, "run_id": wf},
                "engine_version": engine})
        except OSError as e:
            raise SetupError(f"roar: cannot set up the lineage session: {e}") from None
        tasks.workflow_begun({
            "namespace": cfg.namespace, "job_name": name, "run_id": wf, "engine": ENGINE,
            "started_at": datetime.now(timezone.utc).isoformat(), "engine_version": engine,
            "facets": {"snakefile": str(workflow.main_snakefile), "workdir": workdir}})
        _start_recorder(directory)
        if not status.usable:
            log.warning("roar: jobs run UNTRACED: %s", status.reason)
        self = cls(
            tasks=tasks, directory=directory, config=cfg, workflow_run=wf, name=name,
            traced=status.usable, untraced_reason=None if status.usable else status.reason,
            shadow_root=os.path.abspath(persistence.shadow_path), workdir=workdir,
            engine_version=(ENGINE, snakemake.__version__),
            in_process_run=bool(workflow.execution_settings.use_threads),
            namespace=cfg.namespace, _owner=owner,
        )
        self._detach = tracing.attach()
        return self

    # ---- jobs ----------------------------------------------------------------------------

    def _untraced_reason(self, kind: str) -> str | None:
        if not self.traced:
            return self.untraced_reason
        if kind == "template_engine":
            return "template_engine: rendering runs inside the Snakemake process"
        if kind == "run" and self.in_process_run:
            return ("run: block executed inside the Snakemake process (--force-use-threads); "
                    "without it Snakemake runs it in a traced subprocess")
        return None

    def begin(self, job, workflow, spawned: bool) -> tracing.Binding | None:
        kind = jobs.kind(job)
        reason = self._untraced_reason(kind)
        run_id = new_run_id()
        session = None
        if reason is None:
            session = self.directory / run_id  # the job's own tracer session
            session.mkdir()
        declared = jobs.declared(job, workflow, spawned)
        self.tasks.begun({
            "run_id": run_id, "job_name": f"{self.name}.{job.rule.name}",
            # Taken here, when Snakemake begins the job: its process may still be starting.
            "started_at": datetime.now(timezone.utc).isoformat(),
            "engine_task_id": str(job.jobid), "attempt": int(job.attempt),
            "traced": reason is None, "untraced_reason": reason,
            "run_facets": {"roar_snakemake": jobs.facet(job, kind)},
            "declared": declared.as_dict() if declared else None,
            "command": jobs.command(job), "secrets": list(jobs.secrets(job)),
            "pid": os.getpid(),  # until the job's own process is known (its end says)
        }, own_dir=run_id if session is not None else None)
        if reason is not None:
            log.warning("roar: task %s.%s runs UNTRACED: %s", self.name, job.rule.name,
                        reason)
        binding = tracing.Binding(session, run_id) if session is not None else None
        out_flags = [jobs.flags(f) for f in job.output]
        temp = any("temp" in f for f in out_flags)
        # Outputs final when the job's processes end: no touch() still to come, no shadow
        # directory for Snakemake to empty afterwards (a spawned job empties its own).
        final_at_end = not any("touch" in f for f in out_flags) and (
            spawned or not job.is_shadow)
        early = jobs.streams(job) or (temp and final_at_end)
        with self._lock:
            self._tasks[job.jobid] = _Task(run_id, binding, bool(job.is_shadow), temp, early)
            self._jobs[run_id] = _describe(job)
        return binding

    def _end(self, job, status: str, error: str | None = None,
             exit_code: int | None = None, wait: bool = False) -> None:
        with self._lock:
            task = self._tasks.pop(job.jobid, None)
            if task is None:
                return
            if status == "COMPLETE":
                self._failed.discard(job.jobid)
            else:
                self._failed.add(job.jobid)
        pids = task.binding.pids if task.binding else []
        # temp() files may be deleted as soon as their consumers are done: hash first.
        wait = wait or task.temp_outputs
        fd = self.tasks.ended(
            task.run_id, status, exit_code=exit_code, error=error,
            shadow=(self.shadow_root, self.workdir) if task.unshadow else None,
            pid=pids[0] if pids else None, ended_at=task.ended_at, wait=wait)
        if wait and not self.tasks.wait_for(task.run_id, fd, WAIT_S):
            log.warning("roar: lineage of %s not recorded within %.0f s; the workflow goes "
                        "on (it is recorded later)", self._jobs.get(task.run_id), WAIT_S)
            _start_recorder(self.directory)  # had it died?

    def _task(self, job) -> _Task | None:
        with self._lock:
            return self._tasks.get(job.jobid)

    def fail(self, job, exc: BaseException) -> None:
        """The job raised: record it now, while its partial outputs still exist."""
        code = _exit_code(exc)
        self._end(job, "FAIL", error=_error_text(exc, code), exit_code=code, wait=True)

    def finished(self, job) -> None:
        """The job's processes are done (its thread; Snakemake has not post-processed it).
        Recorded now, on the job's thread, when waiting for Snakemake could lose files:
        named pipes, which Snakemake removes once the group is done, and temp() outputs,
        which it deletes once their consumers are done (recording waits for the hashes, and
        better here than on Snakemake's scheduling thread)."""
        task = self._task(job)
        if task is None:
            return
        # The job's end, not Snakemake's later handling of it.
        task.ended_at = datetime.now(timezone.utc)
        if task.early:
            self._end(job, "COMPLETE", wait=True)

    def complete(self, job) -> None:
        self._end(job, "COMPLETE")

    def rejected(self, job) -> None:
        """Snakemake failed a job that had not raised (e.g. missing outputs)."""
        with self._lock:
            self._failed.add(job.jobid)  # also when it was recorded early, as COMPLETE
        self._end(job, "FAIL", error="Snakemake rejected the job after it ran "
                  "(e.g. missing output files); see Snakemake's log")

    # ---- end of run ----------------------------------------------------------------------

    def close(self, aborted: bool = False, summary: bool = True) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            still_open = list(self._tasks.values())
            self._tasks.clear()
        for task in still_open:  # cancelled or killed before Snakemake reported back
            self.tasks.ended(task.run_id, "ABORT", error="cancelled")
        status = "ABORT" if aborted else ("FAIL" if self._failed else "COMPLETE")
        error = f"{len(self._failed)} job(s) failed" if status == "FAIL" else None
        try:
            self.tasks.workflow_ended(self.workflow_run, status, error=error)
            results = self._finish()
            if summary:
                print(self.summary(results), file=sys.stderr)
        finally:
            if self._detach:
                self._detach()

    def _finish(self) -> dict[str, Result]:
        """Every job's lineage recorded (by the recorder; by this process as a last
        resort), the recorder gone, the session removed; what each job's recording said."""
        recorder.finish_own(self.tasks, self.directory, "this run's lineage",
                            wait_s=CLOSE_WAIT_S, owner=self._owner)
        self._owner = None
        return {k: Result(v) if v is not None else Result.failed("ABORT", "not recorded")
                for k, v in self.tasks.results.items()}

    def summary(self, results: dict[str, Result]) -> str:
        lines, lost, why = [], 0, None
        for run_id, r in results.items():
            if not r.ok:
                lost += 1
                why = why or r.error
                continue
            parts = []
            # The answer's plain fields: `Result.io`/`task` import the emission records for
            # them (~10 ms of every invocation's end).
            io, task = r.data.get("io") or {}, r.data.get("task") or {}
            if io.get("undeclared_reads"):
                parts.append("undeclared reads: " + ", ".join(io["undeclared_reads"]))
            if io.get("undeclared_writes"):
                parts.append("undeclared writes: " + ", ".join(io["undeclared_writes"]))
            if task and not task.get("traced", True):
                parts.append(f"UNTRACED ({task.get('untraced_reason')})")
            if parts:
                lines.append(f"  {self._jobs.get(run_id, run_id)}: " + "; ".join(parts))
        head = (f"roar: lineage of {len(results) - lost} job(s) recorded under workflow run "
                f"{self.name} {self.workflow_run} (store: {self.config.home})")
        if lost:
            why = why or "see the errors above"
            head += (f"; lineage of {lost} job(s) NOT RECORDED yet ({why}), kept in "
                     f"{self.directory} to retry")
        if not lines:
            if lost == len(results):
                return head
            return head + ("\nroar: every job read and wrote only its declared files" if not lost
                           else "\nroar: every job recorded read and wrote only its declared files")
        return head + "\nroar: undeclared I/O (read or written but not declared):\n" + "\n".join(
            lines)


def _describe(job) -> str:
    wildcards = ", ".join(f"{k}={v}" for k, v in job.wildcards.items())
    return f"rule {job.rule.name} (jobid {job.jobid}{', ' + wildcards if wildcards else ''})"


def _exit_code(exc: BaseException | None) -> int | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, subprocess.CalledProcessError):
            return exc.returncode
        exc = exc.__cause__ or exc.__context__
    return None


def _error_text(exc: BaseException, code: int | None) -> str:
    text = str(exc).strip() or type(exc).__name__
    if code is not None and f"exit status {code}" not in text:
        text = f"exit code {code}: {text}"
    return text[:4000]


def _start_recorder(directory: Path) -> None:
    try:
        recorder.ensure(directory)
    except OSError as e:  # the jobs go on; what they did is recorded at the end, here
        log.warning("roar: cannot start the lineage recorder process: %s", e)
