"""The worker hook: every task and actor method this worker runs becomes one roar task.

`setup()` is the worker_process_setup_hook (set by the plugin or the driver hook, chained
in front of the user's own).  It wraps the functions Ray's
`FunctionActorManager.get_execution_info` hands to the task loop -- the one path behind
normal tasks, actor creation and actor methods -- so that each call marks its boundaries:
the tracer tag (`Shim.begin/end`, thread-local) and the task's identity (one line each in
the worker's task log, roar_core.recording.tasklog).  As a task ends, before its result
goes back to Ray, the core takes its file versions (roar_core.pipeline.capture
.WorkerCapture: its files classified and hashed now, so the next task cannot change them);
the node's recorder process (roar_core.recording.recorder) follows the task logs and does
the rest (store, events).

- Normal and threaded-actor calls set the tag on their thread for the whole call.
- Async actor calls set it around each coroutine step (roar_ray._steps).
- Generator tasks (streaming, Ray Data) keep it until the last item; send() is forwarded.
- An actor is a run of its own, `<job>.<Class>`, from creation to exit: its `__init__` and
  whatever runs outside any method call (a training thread) are its lineage, through the
  process tag; its method calls are runs with the actor's run as parent.
- Threads the task did not start on its own thread (pyarrow's I/O pool, user threads) are
  attributed by the shim's process fallback while exactly one task runs in the process.
- A task (or actor) submitted by a traced task has that task's run as parent: the
  submitting worker puts child task id -> parent run id in Ray's internal KV (from a
  background thread), and a nested task (depth > 1) looks it up when it begins.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import json
import logging
import os
import queue
import sys
import threading
import time
from contextvars import ContextVar
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import ray

from roar_core.ids import host_name, new_run_id
from roar_core.pipeline import tracer
from roar_core.pipeline.capture import WorkerCapture
from roar_core.recording import recorder
from roar_core.recording.tasklog import TaskLog
from roar_ray import _env, _steps

log = logging.getLogger("roar.ray")

ENGINE = "ray"
_worker: _Worker | None = None
_setup_lock = threading.Lock()
_current: ContextVar[str | None] = ContextVar("roar_ray_run", default=None)


def setup() -> None:
    """Ray's worker_process_setup_hook: attach lineage recording, then run the user's hook."""
    global _worker
    with _setup_lock:
        if _worker is None:
            try:
                _worker = _Worker.start()
            except Exception as e:  # lineage must never keep the worker from running
                print(f"roar: ERROR: lineage recording is off in this worker "
                      f"(pid {os.getpid()}): {type(e).__name__}: {e}", file=sys.stderr)
                log.debug("roar worker setup failed", exc_info=True)
    user_hook = os.environ.get(_env.USER_HOOK_VAR)
    if user_hook:
        from ray._private.runtime_env.setup_hook import load_and_execute_setup_hook

        error = load_and_execute_setup_hook(user_hook)
        if error is not None:
            raise RuntimeError(error)


def current() -> _Worker | None:
    """This worker's lineage recorder, if setup() attached one."""
    return _worker


def _untraced_reason(node_id: str) -> str | None:
    if not os.environ.get(_env.PLUGIN_VAR):
        return (f"the roar runtime_env plugin is not registered on Ray node {node_id} "
                f'(start that node with `eval "$(roar-core env ray)"` before `ray start`; '
                f"see {_env.DOCS})")
    shim = tracer.loaded()
    if shim is None or not shim.active():
        return (f"the tracer is not attached to this worker (LD_PRELOAD="
                f"{os.environ.get('LD_PRELOAD', '')!r}, session "
                f"{os.environ.get(tracer.ENV_SESSION, '')!r}); `roar-core doctor` says why")
    return None


class _Worker:
    def __init__(self, session: Path, namespace: str, job: dict[str, Any] | None,
                 settings: dict[str, Any], node_id: str, reason: str | None):
        self.node_id = node_id
        self.traced = reason is None
        self.reason = reason
        self.shim = (tracer.loaded() if self.traced else None) or _steps.NoShim()
        self.prefix = (settings.get("job_name") or (job["job_name"] if job else "ray")) + "."
        self.job_run = job["run_id"] if job else None
        self._links: queue.SimpleQueue[tuple[str, str]] | None = None
        self._links_lock = threading.Lock()
        self.core_worker = ray._private.worker.global_worker.core_worker
        self.actor: str | None = None  # run id of this worker's actor, if it hosts one
        self.capture: WorkerCapture | None = None  # takes each task's versions at its end
        # The log form of roar_core.pipeline.writer.TaskMeta (the worker imports nothing of
        # the recording side): what every task of this worker shares, written once.
        self.tasks = TaskLog(session, common={
            "engine": ENGINE, "namespace": namespace, "command": None,
            "host": host_name(), "pid": os.getpid(), "node_id": node_id,
            "traced": self.traced, "untraced_reason": reason,
            "workflow": {"namespace": job["namespace"], "job_name": job["job_name"],
                         "run_id": job["run_id"]} if job else None,
            "engine_version": {"name": ENGINE, "version": ray.__version__},
        })

    # ---- setup ---------------------------------------------------------------------

    @classmethod
    def start(cls) -> _Worker | None:
        job = _env.job_context(os.environ)
        raw = os.environ.get(_env.SETTINGS_VAR)
        settings = _env.check_settings(json.loads(raw) if raw else None)
        cfg = _env.load_config(settings, job)
        if cfg.disabled:
            return None
        gw = ray._private.worker.global_worker
        node_id = gw.current_node_id.hex()
        reason = _untraced_reason(node_id)
        if reason is not None:
            print(f"roar: WARNING: tasks of this worker (pid {os.getpid()}) run UNTRACED: "
                  f"{reason}", file=sys.stderr, flush=True)
        # Where the plugin pointed the tracer; else (no plugin here) where it would have.
        session = Path(os.environ.get(tracer.ENV_SESSION) or _env.session_dir(cfg, job, node_id))
        w = cls(session, cfg.namespace, job, settings, node_id, reason)
        internal = [gw.node.get_temp_dir_path()] if gw.node else []
        if w.traced:
            w.capture = WorkerCapture.for_config(cfg, session, internal)
        w._install(gw.function_actor_manager)
        if w.job_run:
            w._install_links()
        atexit.register(w.close)
        recorder.write_settings(session, cfg, internal, order=w.job_run)
        recorder.ensure(session)
        return w

    def _install(self, manager) -> None:
        original = manager.get_execution_info
        wrapped: dict[Any, tuple[Any, Any]] = {}

        @functools.wraps(original)
        def get_execution_info(job_id, function_descriptor):
            info = original(job_id, function_descriptor)
            key = function_descriptor.function_id
            hit = wrapped.get(key)
            if hit is None or hit[0] is not info:
                hit = (info, self._wrap_info(info, function_descriptor))
                wrapped[key] = hit
            return hit[1]

        manager.get_execution_info = get_execution_info

    # ---- parents of nested tasks ------------------------------------------------------

    def _install_links(self) -> None:
        """Submissions made from inside a traced task name it as their children's parent."""
        from ray.actor import ActorClass, ActorMethod
        from ray.remote_function import RemoteFunction

        def linking(original):
            @functools.wraps(original)
            def _remote(this, *args, **kwargs):
                out = original(this, *args, **kwargs)
                parent = _current.get()
                if parent is not None:
                    child = _task_id_of(out)
                    if child is not None:
                        self._link(child, parent)
                return out

            _remote._roar_links = True
            return _remote

        for cls in (RemoteFunction, ActorMethod, ActorClass):
            if not getattr(cls._remote, "_roar_links", False):
                cls._remote = linking(cls._remote)

    def _link(self, child: str, parent: str) -> None:
        if self._links is None:
            with self._links_lock:
                if self._links is None:
                    links: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
                    threading.Thread(target=self._put_links, args=(links,), name="roar-links",
                                     daemon=True).start()
                    self._links = links
        self._links.put((child, parent))

    def _put_links(self, links: queue.SimpleQueue[tuple[str, str]]) -> None:
        from ray.experimental.internal_kv import _internal_kv_put

        tracer.ignore_this_thread()
        while True:
            child, parent = links.get()
            try:
                _internal_kv_put(f"{self.job_run}:{child}", parent, namespace=_env.KV_NAMESPACE)
            except Exception as e:  # the child then has no parent in its lineage
                log.debug("roar: could not link task %s to its parent: %s", child, e)

    def _parent(self, task_id: str) -> str | None:
        """The run of the traced task that submitted this one (a nested task)."""
        if not self.job_run or self.core_worker.get_task_depth() <= 1:
            return None
        from ray.experimental.internal_kv import _internal_kv_get

        key = f"{self.job_run}:{task_id}"
        for delay in (0, 0.001, 0.002, 0.004, 0.008):  # the parent's put may be in flight
            time.sleep(delay)
            value = _internal_kv_get(key, namespace=_env.KV_NAMESPACE)
            if value:
                return value.decode()
        return None

    def close(self) -> None:
        """At a graceful exit: the actor's run ends with the process."""
        if self.actor is not None:
            self._end_actor(None)

    # ---- task boundaries -----------------------------------------------------------

    def begin(self, name: str, *, lifetime: bool = False) -> str:
        """Log a task's start; returns its run id (also its tracer tag)."""
        cw = self.core_worker
        run_id = new_run_id()
        task_id = cw.get_current_task_id().hex()
        parent = self.actor if self.actor is not None else self._parent(task_id)
        self.tasks.begun({
            "run_id": run_id, "job_name": self.prefix + name,
            "started_at": datetime.now(timezone.utc).isoformat(), "engine_task_id": task_id,
            "attempt": cw.get_current_task_attempt_number(), "parent_run_id": parent,
        }, lifetime)
        return run_id

    def end(self, run_id: str, error: BaseException | None) -> None:
        # The task's versions now, before its result goes back to Ray: the next task may
        # rewrite its files at once.
        captured = None
        if self.capture is not None:
            try:
                captured = self.capture.take(run_id)
            except Exception as e:  # the node's recorder takes them later, as best it can
                log.warning("roar: versions of task %s not taken at its end: %s: %s",
                            run_id, type(e).__name__, e)
        if error is None:
            self.tasks.ended(run_id, "COMPLETE", captured=captured)
        else:
            self.tasks.ended(run_id, "FAIL" if isinstance(error, Exception) else "ABORT",
                               error=f"{type(error).__name__}: {error}", captured=captured)

    def _finisher(self, run_id: str, untag: bool):
        """Called once when the task is over; until then, what this context submits has
        the task as parent."""
        done = []
        previous = _current.get()
        _current.set(run_id)

        def finish(error: BaseException | None) -> None:
            if done:
                return
            done.append(True)
            _current.set(previous)
            if untag:
                self.shim.end()
            self.end(run_id, error)
        return finish

    # ---- wrappers ------------------------------------------------------------------

    def _wrap_info(self, info, descriptor):
        if descriptor.module_name.startswith("roar_ray."):
            return info  # our own tasks (the end-of-job drain) are not lineage
        if not descriptor.is_actor_method():
            return info._replace(function=self._sync(info.function, descriptor.function_name))
        method, cls = descriptor.function_name, descriptor.class_name
        if method == "__init__":
            fn = self._actor_init(info.function, cls)
        elif method == "__ray_terminate__":
            fn = self._actor_terminate(info.function)
        elif method.startswith("__ray"):
            return info  # Ray's own (ready checks, calls on the actor's behalf)
        else:
            target = getattr(info.function, "method", None)
            name = f"{cls}.{method}"
            if inspect.iscoroutinefunction(target):
                fn = self._async(info.function, name)
            elif inspect.isasyncgenfunction(target):
                fn = self._async_gen(info.function, name)
            else:
                fn = self._sync(info.function, name)
        # Ray's async-actor path looks at these attributes of the executor.
        for attr in ("name", "method"):
            if hasattr(info.function, attr):
                setattr(fn, attr, getattr(info.function, attr))
        return info._replace(function=fn)

    def _sync(self, function, name: str):
        @functools.wraps(function)
        def run(*args, **kwargs):
            run_id = self.begin(name)
            self.shim.begin(run_id)
            finish = self._finisher(run_id, untag=True)
            try:
                out = function(*args, **kwargs)
            except BaseException as e:
                finish(e)
                raise
            if inspect.isgenerator(out):
                return _steps.generator(out, finish)
            finish(None)
            return out
        return run

    def _async(self, function, name: str):
        async def run(*args, **kwargs):
            run_id = self.begin(name)
            finish = self._finisher(run_id, untag=False)
            return await _steps.coroutine(function(*args, **kwargs), run_id, self.shim,
                                          finish)
        return run

    def _async_gen(self, function, name: str):
        def run(*args, **kwargs):
            run_id = self.begin(name)
            finish = self._finisher(run_id, untag=False)
            return _steps.async_generator(function(*args, **kwargs), run_id, self.shim,
                                          finish)
        return run

    def _actor_init(self, function, cls: str):
        """The actor's run begins with its creation and lasts until it exits; __init__'s
        I/O and anything the actor does outside its method calls belong to it."""

        @functools.wraps(function)
        def run(*args, **kwargs):
            run_id = self.begin(cls, lifetime=True)
            self.actor = run_id
            self.shim.process_tag(run_id)
            self.shim.begin(run_id)
            previous = _current.set(run_id)
            try:
                out = function(*args, **kwargs)
            except BaseException as e:
                self.shim.end()
                self._end_actor(e)
                raise
            finally:
                _current.reset(previous)
            self.shim.end()
            return out
        return run

    def _actor_terminate(self, function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            self.close()  # the process exits right after
            return function(*args, **kwargs)
        return run

    def _end_actor(self, error: BaseException | None) -> None:
        run_id, self.actor = self.actor, None
        if run_id is None:
            return
        self.shim.process_tag(None)
        self.end(run_id, error)


def _task_id_of(submitted: Any) -> str | None:
    """The task id behind what a submission returned (a ref, refs, a generator, a handle)."""
    if isinstance(submitted, list | tuple):
        submitted = submitted[0] if submitted else None
    ref = getattr(submitted, "_generator_ref", None) or submitted
    if hasattr(ref, "task_id"):
        return ref.task_id().hex()
    actor_id = getattr(submitted, "_actor_id", None)
    if actor_id is not None:
        return "f" * 16 + actor_id.hex()  # the actor creation task's id
    return None
