"""`snakemake --executor roar`: Snakemake's local executor, with each job traced and recorded.

Jobs run exactly as with `--executor local` (same thread pool, same spawned `python -m
snakemake` for run: and shadow jobs); the differences are
- each job's processes, and only them, carry the tracer (LD_PRELOAD, session, the job's tag);
  the Snakemake process itself is never traced;
- each job is one roar task (`<workflow>.<rule>`) under one workflow run per invocation;
- Snakemake's own file work stays out of the trace: outputs of spawned jobs are deleted here,
  before the job starts, like the local executor does for threaded jobs; shadow paths are
  renamed to the workdir; `.snakemake/` and the source cache are internal to roar.
"""

# No `from __future__ import annotations` here: Snakemake builds the --roar-* options from
# the runtime types of the ExecutorSettings fields (a string annotation breaks bool flags).

import logging
import subprocess
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Optional

from snakemake.exceptions import SpawnedJobError, WorkflowError
from snakemake.executors.local import Executor as LocalExecutor
from snakemake.executors.local import run_wrapper
from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase

log = logging.getLogger("roar")

# Same as the local executor's: jobs run here, on the shared file system.
common_settings = CommonSettings(
    non_local_exec=False,
    implies_no_shared_fs=False,
    job_deploy_sources=False,
    pass_envvar_declarations_to_cmd=True,
    auto_deploy_default_storage_provider=False,
)


# Optional[...], not `X | None`: Snakemake's option builder only unwraps typing.Union.
@dataclass
class ExecutorSettings(ExecutorSettingsBase):
    workflow_name: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata={"help": "Name of the workflow run in the lineage (OpenLineage job name); "
                          "jobs are named <name>.<rule>. Default: the working directory's name."},
    )
    namespace: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata={"help": "OpenLineage namespace of the workflow and its jobs "
                          "(default: roar's configuration, 'roar')."},
    )
    home: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata={"help": "roar home: lineage store, event spool and trace sessions "
                          "(default: roar's configuration, .roar-core/ in the project)."},
    )
    require_tracer: bool = field(
        default=False,
        metadata={"help": "Refuse to start when the tracer cannot run here, instead of "
                          "running the jobs untraced (they are recorded as untraced)."},
    )
    quiet: bool = field(
        default=False,
        metadata={"help": "Do not print the end-of-run summary of undeclared reads/writes."},
    )


class Executor(LocalExecutor):
    def __post_init__(self):
        super().__post_init__()
        from snakemake_executor_plugin_roar.lineage import Lineage, SetupError

        settings = self.workflow.executor_settings or ExecutorSettings()
        self.quiet = settings.quiet
        try:
            self.lineage = Lineage.start(self.workflow, settings)
        except SetupError as e:
            super().shutdown()
            raise WorkflowError(str(e)) from None

    # ---- running jobs (the local executor's, with a task around each job) ---------------

    def run_single_job(self, job):
        if job.is_norun:  # a target rule: nothing runs, nothing to record
            return super().run_single_job(job)
        spawned = not (self.use_threads or (not job.is_shadow and not job.is_run)
                       or job.is_template_engine)
        if spawned:
            # What the spawned Snakemake would do first, done here so that deleting the old
            # outputs is never traced as the job's own deletion.
            self.workflow.async_run(_clear_outputs(job))
            return self.pool.submit(self._traced, job, True, self.cached_or_run, job,
                                    self.spawn_job, job)
        args = self.job_args_and_prepare(job)
        return self.pool.submit(self._traced, job, False, self.cached_or_run, job,
                                run_wrapper, *args)

    def _traced(self, job, spawned, run, *args):
        from snakemake_executor_plugin_roar import tracing

        binding = _safely(self.lineage.begin, job, self.workflow, spawned)
        try:
            with tracing.bound(binding) if binding is not None else nullcontext():
                run(*args)
        except BaseException as e:
            _safely(self.lineage.fail, job, e)
            raise
        _safely(self.lineage.finished, job)

    def spawn_job(self, job):
        from snakemake_executor_plugin_roar import tracing

        cmd = self.format_job_exec(job)
        log.debug("spawned job: %s", cmd)
        try:
            tracing.run_spawned(cmd, tracing.current())
        except subprocess.CalledProcessError as e:
            raise SpawnedJobError() from e

    # ---- Snakemake reports back --------------------------------------------------------

    def handle_job_success(self, job):
        # Called after Snakemake post-processed the job (shadow outputs moved, touch()
        # files made) and before it deletes temp() files its consumers are done with.
        for j in _members(job):
            _safely(self.lineage.complete, j)

    def handle_job_error(self, job):
        for j in _members(job):
            _safely(self.lineage.rejected, j)  # no-op for jobs already recorded as failed

    def shutdown(self):
        super().shutdown()
        _safely(self.lineage.close, summary=not self.quiet)

    def cancel(self):
        super().cancel()
        _safely(self.lineage.close, aborted=True, summary=not self.quiet)


def _safely(call, *args, **kwargs):
    """Lineage never fails a job or the workflow: a bug here costs lineage, loudly."""
    try:
        return call(*args, **kwargs)
    except Exception as e:
        log.error("roar: lineage error in %s (the workflow goes on): %s: %s",
                  getattr(call, "__name__", call), type(e).__name__, e,
                  exc_info=log.isEnabledFor(logging.DEBUG))
        return None


def _members(job):
    return list(job) if job.is_group() else [job]


async def _clear_outputs(job):
    await job.check_protected_output()
    await job.remove_existing_output()
