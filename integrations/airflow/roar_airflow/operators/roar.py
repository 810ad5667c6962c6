"""The operator layer: run the work traced and hand its lineage to OpenLineage.

`RoarOperatorMixin` goes in front of any operator.  Its `execute` marks the task's
boundaries (or runs the work in a traced child), and once the task has ended roar-core has
recorded its real inputs and outputs, with content hashes; the OpenLineage provider then asks
`get_openlineage_facets_on_complete/failure` and puts them into the events it sends for the
task (parent: the DAG run).  With `roar_asset_alias`, the outputs are also published as asset
events through that alias, with the digest in `extra`, so other DAGs can be scheduled on them.

    RoarPythonOperator  -- the callable in place (boundary mode) or in a traced Python child
                           process, like ExternalPythonOperator (subprocess mode);
    RoarBashOperator    -- BashOperator, its bash process traced;
    roar_operator(Cls)  -- the same for any other classic operator (subprocess mode traces the
                           processes it starts; boundary mode traces everything it does).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.python import ExternalPythonOperator, PythonOperator

from roar_airflow.hooks.roar import (
    Mode,
    RoarHook,
    TaskRun,
    provider_emits,
    provider_wait_s,
    shared_hook,
)
from roar_airflow.version_compat import Asset, AssetAlias, BaseOperator

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

    from roar_core.pipeline.emission import Dataset

# Environment a traced child needs (the rest of os.environ is inherited as usual).
_TRACER_ENV = ("LD_PRELOAD", "ROAR_SESSION_DIR", "ROAR_TASK_TAG")


class RoarOperatorMixin(BaseOperator):
    """Trace the operator this is mixed in front of, and report its file I/O as lineage.

    :param roar_asset_alias: publish the task's output files as asset events through the
        `AssetAlias` of this name (digest and size in `extra`); downstream DAGs can be
        scheduled on `AssetAlias(roar_asset_alias)`.
    """

    _roar_run: TaskRun | None = None

    def __init__(self, *, roar_asset_alias: str | None = None, **kwargs: Any) -> None:
        if roar_asset_alias is not None:
            outlets = kwargs.get("outlets") or []
            outlets = list(outlets) if isinstance(outlets, list | tuple) else [outlets]
            kwargs["outlets"] = [*outlets, AssetAlias(roar_asset_alias)]
        super().__init__(**kwargs)
        self.roar_asset_alias = roar_asset_alias

    # ---- execution -------------------------------------------------------------------

    def execute(self, context: Any) -> Any:
        t0 = time.perf_counter()
        hook = shared_hook()
        try:
            mode, why = hook.mode()
            if mode is Mode.DISABLED:
                return self.roar_execute(context, None)
            # Boundary mode, the usual one, is said with the lineage, at the task's end: a line
            # here took ~0.2 ms of the task's path.
            if mode is Mode.UNTRACED:
                self.log.warning("roar: %s mode: %s", mode.value, why)
            elif mode is not Mode.BOUNDARY:
                self.log.info("roar: %s mode: %s", mode.value, why)
            run = self._roar_run = hook.begin(
                context, mode, untraced_reason=why if mode is Mode.UNTRACED else None)
        except Exception as e:  # lineage must never fail the task
            self.log.error("roar: cannot trace this task, it runs untraced: %s: %s",
                           type(e).__name__, e, exc_info=True)
            return self.roar_execute(context, None)
        # roar's time on the task's path: all of it, here with the mode and its log line
        run.roar_seconds = run.begin_seconds = time.perf_counter() - t0
        try:
            result = self.roar_execute(context, run)
        except BaseException as e:
            self._roar_end(hook, run, _status_of(e), f"{type(e).__name__}: {e}")
            raise
        self._roar_end(hook, run, "COMPLETE")
        if self.roar_asset_alias and run.result is not None and not run.result.error:
            publish_assets(context, self.roar_asset_alias, run.result.outputs)
        return result

    def roar_execute(self, context: Any, run: TaskRun | None) -> Any:
        """Do the operator's work (`run` None: untraced, in place).  In subprocess mode,
        every process it starts is traced (its own Python code, in the task process, not)."""
        if run is None or run.mode is not Mode.SUBPROCESS:
            return super().execute(context)
        with _environ(shared_hook().child_env(run)):
            return super().execute(context)

    def _roar_end(self, hook: RoarHook, run: TaskRun, status: str,
                  error: str | None = None) -> None:
        # The provider asks for the lineage once Airflow has sent the task's XCom and state:
        # the task may wait for it then, not now (the hook says whether it can).  Its asset
        # events are needed now, and without the provider nobody asks.
        t0 = time.perf_counter()
        wait = bool(self.roar_asset_alias) or not provider_emits()
        try:
            hook.end(run, status, error=error, wait=wait)
        except Exception as e:  # lineage must never fail the task
            self.log.error("roar: lineage of this task lost: %s: %s", type(e).__name__, e,
                           exc_info=True)
            return
        if run.result is None:
            self.log.debug("roar: ended; the recorder takes the task's versions while Airflow "
                           "ends it (files changed before it does are recorded as unknown)")
        run.roar_seconds += time.perf_counter() - t0
        if run.result is not None:
            self._roar_log(run)

    def _roar_log(self, run: TaskRun) -> None:
        r = run.result
        if r is None:
            return
        run.logged = True
        if r.error:
            self.log.error("roar: lineage not recorded: %s", r.error)
            return
        self.log.info("roar: recorded %d inputs, %d outputs (run %s, %s mode, %s); roar took "
                      "%.1f ms (begin %.1f, end %.1f)", *r.counts, run.run_id, run.mode.value,
                      run.recorded_by, run.roar_seconds * 1e3, run.begin_seconds * 1e3,
                      (run.roar_seconds - run.begin_seconds) * 1e3)

    # ---- OpenLineage (called by the provider's listener) -----------------------------

    def get_openlineage_facets_on_start(self) -> OperatorLineage:
        from airflow.providers.openlineage.extractors import OperatorLineage

        return OperatorLineage()  # the files are known once the task has run

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
        return self._roar_lineage()

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> OperatorLineage:
        return self._roar_lineage()  # what the task did before it failed

    def roar_take_answer(self) -> None:
        """Roar's listener, at Airflow's end of the task: take the lineage now if it is
        there (`RoarHook.take_answer`); the provider's request, in its child, then finds it."""
        run = self._roar_run
        if run is not None and run.result is None:
            t0 = time.perf_counter()
            shared_hook().take_answer(run)
            run.roar_seconds += time.perf_counter() - t0

    def _roar_lineage(self) -> OperatorLineage:
        run = self._roar_run
        if run is not None and not run.logged:
            if run.result is None:
                t0 = time.perf_counter()
                shared_hook().answer(run, timeout=provider_wait_s())
                run.roar_seconds += time.perf_counter() - t0
            self._roar_log(run)
        t0 = time.perf_counter()
        lineage = operator_lineage(run)
        self.log.info("roar: reported %d inputs, %d outputs to OpenLineage in %.1f ms",
                      len(lineage.inputs), len(lineage.outputs),
                      (time.perf_counter() - t0) * 1e3)
        return lineage


class RoarPythonOperator(RoarOperatorMixin, ExternalPythonOperator):
    """A Python callable, traced.  In boundary mode it runs in place like PythonOperator;
    in subprocess mode in a traced interpreter like ExternalPythonOperator (the callable
    must then be self-contained: its imports inside, no closures)."""

    def __init__(self, *, python: str | None = None, **kwargs: Any) -> None:
        super().__init__(python=python or sys.executable, **kwargs)

    def roar_execute(self, context: Any, run: TaskRun | None) -> Any:
        if run is not None and run.mode is Mode.SUBPROCESS:
            env = self.env_vars
            self.env_vars = {**(env or {}), **_tracer_delta(shared_hook().child_env(run))}
            try:
                return ExternalPythonOperator.execute(self, context)
            finally:
                self.env_vars = env
        return PythonOperator.execute(self, context)

    def execute_callable(self) -> Any:
        run = self._roar_run
        if run is not None and run.mode is Mode.SUBPROCESS:
            return super().execute_callable()
        return PythonOperator.execute_callable(self)


class RoarBashOperator(RoarOperatorMixin, BashOperator):
    """BashOperator with its bash process (and everything it runs) traced."""

    def get_env(self, context: Any) -> dict:
        env = super().get_env(context)
        run = self._roar_run
        if run is not None and run.mode is Mode.SUBPROCESS:
            # `env=` without `append_env` replaces os.environ: add the tracer back.
            env.update(_tracer_delta(shared_hook().child_env(run)))
        return env


def roar_operator(operator_class: type[BaseOperator]) -> type[BaseOperator]:
    """A traced version of a classic operator class: `roar_operator(SomeOperator)(...)`.
    Assign it to a module-level name so the class has a stable, importable identity."""
    name = f"Roar{operator_class.__name__}"
    module = sys._getframe(1).f_globals.get("__name__", __name__)  # the caller's (a DAG file)
    return type(name, (RoarOperatorMixin, operator_class),
                {"__module__": module, "__qualname__": name})


# ---- helpers (plain functions) ----------------------------------------------------------


def operator_lineage(run: TaskRun | None) -> OperatorLineage:
    """The provider's OperatorLineage for a recorded task: its inputs and outputs with
    roar's dataset facets, and roar's run facets (traced?, dropped events, command...)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    from roar_core.pipeline import emission

    if run is None or run.result is None:
        return OperatorLineage()
    r = run.result
    lineage = emission.TaskLineage(namespace=run.ident.namespace, job_name=run.ident.job_name,
                                   run_id=run.run_id, task=r.task, io=r.io)
    return OperatorLineage(
        inputs=[emission.input_dataset(d) for d in r.inputs],
        outputs=[emission.output_dataset(d) for d in r.outputs],
        run_facets=emission.task_run_facets(lineage),
    )


def publish_assets(context: Any, alias: str, outputs: list[Dataset]) -> None:
    """One asset event per output file through the alias, its digest in `extra`."""
    events = context["outlet_events"][AssetAlias(alias)]
    for d in outputs:
        if d.lifecycle == "DROP" or d.digest is None:
            continue
        events.add(Asset(uri=dataset_uri(d), name=d.name),
                   extra={"digest": f"blake3:{d.digest}", "size": d.size})


def dataset_uri(d: Dataset) -> str:
    """URI of a recorded dataset: file:///path (or file://host/path), s3://bucket/key."""
    if d.namespace == "file":
        return "file://" + d.name
    return f"{d.namespace.rstrip('/')}/{d.name.lstrip('/')}"


def _status_of(e: BaseException) -> str:
    from airflow.providers.common.compat.sdk import AirflowSkipException, TaskDeferred

    if isinstance(e, AirflowSkipException):
        return "COMPLETE"  # skipping is not failing; what it did before is lineage
    if isinstance(e, TaskDeferred):
        return "ABORT"  # the resumed part runs in another process, not traced here
    return "FAIL"


def _tracer_delta(env: dict[str, str]) -> dict[str, str]:
    return {k: env[k] for k in _TRACER_ENV if k in env}


@contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """os.environ's tracer variables set to those of `env` for the duration."""
    saved = {k: os.environ.get(k) for k in _TRACER_ENV}
    try:
        for k in _TRACER_ENV:
            if k in env:
                os.environ[k] = env[k]
            else:
                os.environ.pop(k, None)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


__all__: list[str] = ["RoarBashOperator", "RoarOperatorMixin", "RoarPythonOperator",
                      "roar_operator"]
