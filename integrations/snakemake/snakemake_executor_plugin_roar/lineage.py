"""One Snakemake invocation's lineage: the workflow run, one task per job, the summary.

The executor calls `begin` on the thread that runs a job, `fail` there when the job raised
(before Snakemake deletes its partial outputs), `complete` once Snakemake has post-processed
a job (outputs moved out of the shadow directory, touch() done, temp files still there), and
`close` at shutdown.  Recording is roar_core's, in a helper process (roar_core.remote):
Snakemake's scheduler holds the GIL, so recording in its process would slow every job.
"""

from __future__ import annotations

import functools
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
from roar_core import tracer
from roar_core.remote import RemoteRoar, TaskResult
from snakemake_executor_plugin_roar import jobs, tracing

log = logging.getLogger("roar")
ENGINE = "snakemake"


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
    remote: RemoteRoar
    workflow_run: str
    name: str
    traced: bool
    untraced_reason: str | None
    shadow_root: str
    workdir: str
    engine_version: tuple[str, str]
    in_process_run: bool
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
        try:
            remote = RemoteRoar(cfg, internal=[p for p in internal if p])
        except OSError as e:
            raise SetupError(f"roar: cannot start the lineage recorder process: {e}") from None
        name = settings.workflow_name or os.path.basename(workdir) or "snakemake"
        import snakemake

        wf = remote.start_workflow(name, engine=ENGINE, facets={
            "snakefile": str(workflow.main_snakefile), "workdir": workdir},
            engine_version=(ENGINE, snakemake.__version__))
        if not status.usable:
            log.warning("roar: jobs run UNTRACED: %s", status.reason)
        self = cls(
            remote=remote, workflow_run=wf, name=name, traced=status.usable,
            untraced_reason=None if status.usable else status.reason,
            shadow_root=os.path.abspath(persistence.shadow_path), workdir=workdir,
            engine_version=(ENGINE, snakemake.__version__),
            in_process_run=bool(workflow.execution_settings.use_threads),
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
        run_id, session = self.remote.begin_task(
            f"{self.name}.{job.rule.name}", ENGINE, workflow=self.workflow_run,
            engine_task_id=str(job.jobid), attempt=int(job.attempt),
            traced=reason is None, untraced_reason=reason,
            run_facets={"roar_snakemake": jobs.facet(job, kind)},
            declared=jobs.declared(job, workflow, spawned),
            engine_version=self.engine_version, command=jobs.command(job),
            secrets=jobs.secrets(job),
            pid=os.getpid(),  # until the job's own process is known (its end says)
        )
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
        unshadow = None
        if task.unshadow:
            unshadow = functools.partial(tracing.unshadow, shadow_root=self.shadow_root,
                                         workdir=self.workdir)
        pids = task.binding.pids if task.binding else []
        self.remote.end_task(
            task.run_id, status, session=task.binding.session if task.binding else None,
            exit_code=exit_code, error=error, records_filter=unshadow,
            pid=pids[0] if pids else None, ended_at=task.ended_at,
            # temp() files may be deleted as soon as their consumers are done: hash first.
            wait=wait or task.temp_outputs)

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
            self.remote.end_task(task.run_id, "ABORT", error="cancelled",
                                 session=task.binding.session if task.binding else None)
        status = "ABORT" if aborted else ("FAIL" if self._failed else "COMPLETE")
        error = f"{len(self._failed)} job(s) failed" if status == "FAIL" else None
        try:
            self.remote.finish_workflow(self.workflow_run, status, error=error)
            results = self.remote.close()
            if summary:
                print(self.summary(results), file=sys.stderr)
        finally:
            if self._detach:
                self._detach()

    def summary(self, results: list[TaskResult]) -> str:
        lines, lost = [], 0
        for r in results:
            if r.error is not None:
                lost += 1
                continue
            parts = []
            if r.undeclared_reads:
                parts.append("undeclared reads: " + ", ".join(r.undeclared_reads))
            if r.undeclared_writes:
                parts.append("undeclared writes: " + ", ".join(r.undeclared_writes))
            if not r.traced:
                parts.append(f"UNTRACED ({r.untraced_reason})")
            if parts:
                lines.append(f"  {self._jobs.get(r.run_id, r.job_name)}: " + "; ".join(parts))
        head = (f"roar: lineage of {len(results)} job(s) recorded under workflow run "
                f"{self.name} {self.workflow_run} (store: {self.remote.config.home})")
        if self.remote.error:
            head += f"; recording FAILED: {self.remote.error}"
        if lost:
            head += f"; lineage of {lost} job(s) LOST (see the errors above)"
        if not lines:
            return head + "\nroar: every job read and wrote only its declared files"
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
