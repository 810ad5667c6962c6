"""The driver side: the Ray job's run, and the end of the job's lineage.

`runtime_env_hook` is Ray's RAY_RUNTIME_ENV_HOOK (exported by `roar-core env ray`): when
`ray.init(runtime_env=...)` has a `"roar"` field it resolves the configuration, starts the
job's run, passes the job context to every worker through `env_vars` (which task- and
actor-level runtime_envs inherit), installs the worker setup hook on every node -- so that
a node without the plugin says so instead of running the job untraced in silence -- and
registers the plugin for a local cluster that this `ray.init` is about to start.

`finish` ends the job's lineage: each node drains its workers' pending recordings and
recovers what dead workers left (this host's nodes from here, each other node in a small
task pinned to it), then the job's run ends.  It runs at exit by itself, before Ray's own
shutdown; tests and notebooks call it.
`flush` waits for the nodes to record what ended so far, the job going on.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from roar_core import config
from roar_core.api import Roar
from roar_core.pipeline.emission import Engine, RunRef
from roar_core.recording import follower, recorder, tasklog
from roar_core.recording.sessions import hold_owner_lock, new_session_dir
from roar_ray import _env

log = logging.getLogger("roar.ray")

_jobs: list[DriverJob] = []
_lock = threading.Lock()
_atexit_registered = False
_failed = False


def runtime_env_hook(runtime_env: dict | None) -> dict | None:
    """RAY_RUNTIME_ENV_HOOK: called by ray.init with the job's runtime_env."""
    following = os.environ.get(_env.NEXT_ENV_HOOK_VAR)
    if following:
        from ray._common.utils import load_class

        runtime_env = load_class(following)(runtime_env)
    if not runtime_env or "roar" not in runtime_env:
        return runtime_env
    settings = _env.check_settings(runtime_env["roar"])
    cfg = config.load(**{k: v for k, v in settings.items() if k not in _env.RAY_KEYS})
    if cfg.disabled:
        log.warning("roar: disabled by its configuration: this Ray job is not traced")
        return runtime_env
    _register_plugin_for_local_cluster()
    job = DriverJob.start(cfg, settings)
    env_vars = dict(runtime_env.get("env_vars") or {})
    env_vars[_env.JOB_VAR] = json.dumps(job.context, separators=(",", ":"))
    user_hook = runtime_env.get("worker_process_setup_hook")
    if callable(user_hook):
        runtime_env["worker_process_setup_hook"] = _chained(user_hook)
    else:
        if user_hook:
            env_vars[_env.USER_HOOK_VAR] = user_hook
        runtime_env["worker_process_setup_hook"] = _env.WORKER_HOOK
    env_vars[_env.HOOKED_VAR] = "1"
    runtime_env["env_vars"] = env_vars
    return runtime_env


def _chained(user_hook):
    """The user's callable setup hook, with ours first (Ray pickles this closure)."""

    def roar_then_user_setup_hook():
        from roar_ray import worker

        worker.setup()
        user_hook()

    roar_then_user_setup_hook.__name__ = f"roar+{getattr(user_hook, '__name__', 'hook')}"
    return roar_then_user_setup_hook


def _register_plugin_for_local_cluster() -> None:
    """A local cluster started by this ray.init inherits our environment: register the
    plugin there (an existing cluster's nodes must have been started with it)."""
    current = os.environ.get(_env.RAY_PLUGINS_VAR)
    value = _env.plugins_value(current)
    if value != current:
        os.environ[_env.RAY_PLUGINS_VAR] = value


def _driver_name() -> str:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv else "")
    stem = Path(path).stem if path and path not in ("-c", "-m") else ""
    return stem or "ray-job"


class DriverJob:
    def __init__(self, roar: Roar, run: RunRef, context: dict[str, Any]):
        self.roar, self.run, self.context = roar, run, context
        self.root = Path(roar.config.sessions_dir, f"ray-{run.run_id}")
        # The job's run in a task log of the driver's own (`_log_run`), and the lock that
        # keeps its session from being swept while the driver lives.
        self.tasks: tasklog.TaskLog | None = None
        self.log_dir: Path | None = None
        self._owner: int | None = None

    @classmethod
    def start(cls, cfg: config.Config, settings: dict[str, Any]) -> DriverJob:
        global _atexit_registered
        roar = Roar(cfg)
        name = settings.get("job_name") or _driver_name()
        import ray

        started = datetime.now(timezone.utc)
        run = roar.start_workflow(name, engine="ray", started_at=started,
                                  engine_version=Engine("ray", ray.__version__))
        context = {"run_id": run.run_id, "job_name": name, "namespace": run.namespace,
                   "config": config.values(cfg), "root": str(cfg.project_root)}
        job = cls(roar, run, context)
        job._log_run(cfg, {"name": "ray", "version": ray.__version__}, started)
        with _lock:
            _jobs.append(job)
            if not _atexit_registered:
                # Registered after Ray's own atexit shutdown, so it runs before it.
                atexit.register(_at_exit)
                _watch_failures()
                _atexit_registered = True
        return job

    def finish(self, status: str, timeout: float, shutdown: bool) -> None:
        deadline = time.monotonic() + timeout
        ending = shutdown and status == "COMPLETE"
        try:
            self._drain_nodes(timeout, ending)
            self._forget_links()
        except Exception as e:
            log.warning("roar: could not drain the nodes' pending lineage: %s", e)
        if shutdown:
            import ray

            if ray.is_initialized():
                ray.shutdown()
            # The workers are going: the recorders of this host's nodes (the others' are
            # out of reach) record what they left, actors' runs included.
            for node_dir in self._node_dirs():
                if ending:
                    (node_dir / recorder.ENDING).touch()
                recorder.wait_gone(node_dir, min(deadline, time.monotonic() + 30))
        lifetime = "COMPLETE" if status == "COMPLETE" else "ABORT"
        for node_dir in self._node_dirs():
            if not recorder.running(node_dir):
                # No recorder there (it failed, or this host's node is gone): do its part.
                try:
                    follower.recover(self.roar, node_dir, lifetime_status=lifetime)
                except Exception as e:
                    log.warning("roar: could not recover dead workers' tasks in %s: %s",
                                node_dir, e)
        self._warn_untraced()
        if not self._end_logged_run(status, deadline):
            self.roar.finish_workflow(self.run, status)
        self.roar.close()
        if shutdown and not any(tasklog.log_paths(d) or recorder.running(d)
                                for d in self._node_dirs()):
            shutil.rmtree(self.root, ignore_errors=True)

    def _log_run(self, cfg: config.Config, engine: dict[str, str], started: datetime) -> None:
        """The job's run, stored and its START sent, goes into a task log of the driver's
        own, which a recorder follows: a driver that dies (killed, its host gone) leaves
        the run to it, to end ABORT as any dead producer's open work; `finish` ends it
        there, under the recorder's failure policy (its events kept until the spool takes
        them).  Without it (no session could be made), `finish` ends the run itself."""
        try:
            d = Path(new_session_dir(cfg, f"ray-{self.run.run_id}-driver", in_memory=True))
            self._owner = hold_owner_lock(d)
            recorder.write_settings(d, cfg, [d])
            tasks = tasklog.TaskLog(d)
        except OSError as e:
            log.warning("roar: the job's run is not handed to a recorder (%s): should this "
                        "driver be killed, it is never ended", e)
            return
        # A START the spool refused goes to the recorder with the run: kept in this
        # process only, a killed driver would lose it.
        refused = self.roar.hand_over_kept()
        tasks.workflow_begun({
            "namespace": self.run.namespace, "job_name": self.run.job_name,
            "run_id": self.run.run_id, "engine": "ray", "engine_version": engine,
            "started_at": started.isoformat(), "started": "stored" if refused else True})
        self.tasks, self.log_dir = tasks, d
        try:
            recorder.ensure(d)
        except OSError as e:  # started again at the end; else the run ends here
            log.warning("roar: cannot start the recorder of the job's run: %s", e)

    def _end_logged_run(self, status: str, deadline: float) -> bool:
        """End the job's run through its task log (`_log_run`): its recorder records the end
        and exits; with no recorder possible, this process records it (the last resort).
        False where the run was not logged."""
        tasks, d = self.tasks, self.log_dir
        if tasks is None or d is None:
            return False
        tasks.workflow_ended(self.run.run_id, status)
        recorder.finish_own(tasks, d, f"the end of Ray job {self.run.job_name}'s run",
                            wait_s=max(deadline - time.monotonic(), 30), owner=self._owner)
        self._owner = None
        return True

    def _node_dirs(self) -> list[Path]:
        try:
            return sorted(p for p in self.root.iterdir() if p.is_dir())
        except OSError:
            return []

    def _drain_nodes(self, timeout: float, ending: bool) -> None:
        """Each alive node waits until its recorder has caught up with the tasks that ended
        and with dead workers.  A node of this host whose recorder runs is waited on from
        here; each other node runs a zero-CPU task pinned to it, which needs a worker
        there: one started for it took ~0.4 s (Ray stops idle workers beyond a node's CPU
        count, so that of an earlier drain was often gone), most of a drain's time."""
        import ray
        from ray.util import get_node_ip_address
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if not ray.is_initialized():
            return
        deadline = time.monotonic() + timeout
        here = get_node_ip_address()
        alive = [n for n in ray.nodes() if n.get("Alive")]
        # (Without a recorder, the node's task starts one there, with its workers' environment.)
        local = [n for n in alive if n.get("NodeManagerAddress") == here
                 and recorder.running(self.root / n["NodeID"])]
        drain = ray.remote(num_cpus=0, max_retries=0)(drain_node)
        refs = [drain.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                    n["NodeID"], soft=False)).remote(str(self.root), timeout, ending)
                for n in alive if n not in local]
        results = _drain_here([self.root / n["NodeID"] for n in local], deadline, ending)
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout + 30)
        for ref in ready:
            try:
                results.append(ray.get(ref))
            except Exception as e:
                log.warning("roar: draining a node failed: %s", e)
        for result in results:
            if not result.get("done"):
                log.warning("roar: node %s had not recorded all its tasks after %.0f s",
                            result["node"], timeout)
        if pending:
            log.warning("roar: %d node(s) did not answer the lineage drain", len(pending))

    def _forget_links(self) -> None:
        """The parent links of nested tasks (see worker.py): no longer needed."""
        import ray
        from ray.experimental.internal_kv import _internal_kv_del

        if ray.is_initialized():
            _internal_kv_del(f"{self.run.run_id}:", del_by_prefix=True,
                             namespace=_env.KV_NAMESPACE)

    def _warn_untraced(self) -> None:
        for reason, n in self.roar.store.untraced(self.run.run_id).items():
            print(f"roar: WARNING: {n} task(s) of Ray job {self.run.job_name} ran UNTRACED "
                  f"(their file I/O is not in the lineage): {reason}", file=sys.stderr,
                  flush=True)


def finish(status: str | None = None, *, timeout: float = 120.0, shutdown: bool = False) -> None:
    """End the lineage of the Ray jobs this driver started: every node records what its
    workers ran, what dead workers left is recovered (ABORT, with their partial lineage),
    and the job's run ends (COMPLETE, or FAIL after an uncaught exception).  Runs at exit
    by itself; call it to have the lineage complete sooner.  `shutdown`: also shut Ray
    down first, so that actors' runs end too."""
    with _lock:
        jobs, _jobs[:] = list(_jobs), []
    for job in jobs:
        try:
            job.finish(status or ("FAIL" if _failed else "COMPLETE"), timeout, shutdown)
        except Exception as e:  # lineage must never fail the user's program
            print(f"roar: ERROR: could not finish the lineage of Ray job "
                  f"{job.run.job_name}: {type(e).__name__}: {e}", file=sys.stderr)


def flush(timeout: float = 120.0) -> None:
    """Wait until every node has recorded the tasks that ended so far (in the store, their
    events spooled); the job goes on.  For lineage to look at while the driver runs."""
    with _lock:
        jobs = list(_jobs)
    for job in jobs:
        try:
            job._drain_nodes(timeout, ending=False)
        except Exception as e:  # lineage must never fail the user's program
            log.warning("roar: could not wait for the nodes' lineage: %s", e)


def _at_exit() -> None:
    finish(shutdown=True)


def _watch_failures() -> None:
    previous = sys.excepthook

    def hook(kind, value, tb):
        global _failed
        _failed = True
        previous(kind, value, tb)

    sys.excepthook = hook


def drain_node(session_root: str, timeout: float, ending: bool = False) -> dict[str, Any]:
    """On one node: wait until its recorder has recorded what the job's workers there ran
    and what dead ones left.  Runs as a task of the job, not itself traced (worker.py)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    return _drain_here([Path(session_root) / node], time.monotonic() + timeout, ending)[0]


def _drain_here(node_dirs: list[Path], deadline: float, ending: bool) -> list[dict[str, Any]]:
    """`drain_node` on this host, for the nodes whose sessions are `node_dirs`, at once."""
    busy = [d for d in node_dirs if tasklog.log_paths(d)]
    for node_dir in busy:
        recorder.ensure(node_dir)
    late = recorder.wait_recorded(busy, deadline) if busy else []
    if ending:
        for node_dir in node_dirs:
            (node_dir / recorder.ENDING).touch()
    return [{"node": d.name, "done": d not in late} for d in node_dirs]
