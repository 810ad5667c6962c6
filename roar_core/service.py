"""Recorder service: one warm `Roar` for the short-lived task processes of a traced worker.

Airflow's LocalExecutor and Celery workers (like multiprocessing pools) fork a fresh process
for every task from a worker started with the shim preloaded.  Recording in that process
means a cold Roar each time -- imports, store connection, statement compilation, threads:
~100 ms before the task's lineage is known, against a budget of a few.  Instead, task
processes hand their tasks to this service, one per session directory and configuration,
over a Unix socket:

    begin  {"op": "begin", "task": {...}}        sent when the task starts, not answered
                                                 (TaskSpec: which logs are the task's)
    end    {"op": "end", "status": ..., "error": ...}
           -> {"ok": true, "inputs": [...], "outputs": [...], "task": {...}, "io": {...}}

One connection per task, open from begin to end: a task process that dies in between is
recorded as ABORT, with what its processes did.  The first task that finds no service
starts one (detached, untraced, in its own session) and records itself in-process; the
service exits after `IDLE_EXIT_S` without tasks.  It also removes the logs of finished
processes that no running task can need, so a worker's session does not grow forever.

Client side (`ServiceClient`, `spawn`) imports only the standard library and the light
core modules: it runs inside every task.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roar_core import tracer
from roar_core.session import pid_alive

if TYPE_CHECKING:
    from roar_core.api import Roar
    from roar_core.emission import Dataset, IOCheck, RunRef, TaskInfo
    from roar_core.recorder import TaskMeta
    from roar_core.session import SessionCollector

log = logging.getLogger("roar.service")

IDLE_EXIT_S = 600.0
SWEEP_EVERY_S = 30.0
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path, minus the NUL


# ---- what both sides agree on ---------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """How the service builds its Roar: `config.load(cwd, **overrides)`, plus exclude globs
    and internal directories.  Tasks with other settings get another service."""

    cwd: str
    overrides: dict[str, Any] = field(default_factory=dict)
    exclude: tuple[str, ...] = ()
    internal: tuple[str, ...] = ()

    def to_json(self) -> str:
        d = asdict(self)
        d["exclude"], d["internal"] = list(self.exclude), list(self.internal)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Settings:
        d = json.loads(text)
        return cls(d["cwd"], d["overrides"], tuple(d["exclude"]), tuple(d["internal"]))

    def key(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


@dataclass
class TaskSpec:
    """What `Roar.begin_task` needs, JSON-able; `pid` and `began_mono_ns` say which logs
    are the task's (its process tree, created after it began)."""

    job_name: str
    engine: str
    run_id: str
    pid: int
    began_mono_ns: int
    workflow: dict[str, str] | None = None  # RunRef fields; its row is made if missing
    engine_task_id: str | None = None
    attempt: int = 0
    engine_version: dict[str, str] | None = None  # Engine fields
    own_log: str | None = None  # the task process's log, and where it stood at begin
    own_log_offset: int = 0
    own_log_dropped: int = 0  # its header's count of lost events at begin
    session: str | None = None  # a session of the task's own (all its logs are the task's)
    secrets: list[str] = field(default_factory=list)  # values to mask (TaskMeta.secrets)


class Result:
    """A recorded task, as an integration needs it to report lineage: the JSON the service
    answers with, turned into emission records only when asked (the task process may never
    need the OpenLineage client; importing it costs ~0.2 s)."""

    def __init__(self, data: dict[str, Any]):
        self.data = data

    @classmethod
    def failed(cls, status: str, error: str) -> Result:
        return cls({"ok": False, "status": status, "error": error})

    @classmethod
    def of(cls, status: str, inputs: list[Dataset], outputs: list[Dataset],
           task: TaskInfo | None, io: IOCheck | None, error: str | None = None) -> Result:
        return cls({"ok": error is None, "status": status, "error": error,
                    "inputs": [asdict(d) for d in inputs],
                    "outputs": [asdict(d) for d in outputs],
                    "task": asdict(task) if task else None, "io": asdict(io) if io else None})

    @property
    def status(self) -> str:
        return self.data.get("status", "ABORT")

    @property
    def error(self) -> str | None:
        return self.data.get("error")

    @property
    def counts(self) -> tuple[int, int]:
        return len(self.data.get("inputs") or []), len(self.data.get("outputs") or [])

    @property
    def inputs(self) -> list[Dataset]:
        return [_dataset(x) for x in self.data.get("inputs") or []]

    @property
    def outputs(self) -> list[Dataset]:
        return [_dataset(x) for x in self.data.get("outputs") or []]

    @property
    def task(self) -> TaskInfo | None:
        from roar_core.emission import TaskInfo

        return TaskInfo(**self.data["task"]) if self.data.get("task") else None

    @property
    def io(self) -> IOCheck | None:
        from roar_core.emission import IOCheck

        return IOCheck(**self.data["io"]) if self.data.get("io") else None


def _dataset(x: dict[str, Any]) -> Dataset:
    from roar_core.emission import Dataset

    x = dict(x)
    x["symlinks"] = [tuple(s) for s in x.get("symlinks") or []]
    x["previous"] = tuple(x["previous"]) if x.get("previous") else None
    return Dataset(**x)


def socket_path(session_dir: str | os.PathLike, settings: Settings) -> str:
    path = os.path.join(os.fspath(session_dir), f"recorder-{settings.key()}.sock")
    if len(os.fsencode(path)) > _SUN_PATH_MAX:  # deep session dirs: a short name in tmp
        digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:16]
        path = os.path.join(tempfile.gettempdir(), f"roar-{os.getuid()}-{digest}.sock")
    return path


def _lock_path(session_dir: str | os.PathLike, settings: Settings) -> Path:
    return Path(session_dir) / f"recorder-{settings.key()}.lock"


# ---- client ---------------------------------------------------------------------------------


class ServiceError(RuntimeError):
    """The service went away or answered nonsense; the message is one line."""


class ServiceClient:
    """One task's connection to the service (begin ... end)."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._file = sock.makefile("rb")

    @classmethod
    def connect(cls, session_dir: str | os.PathLike, settings: Settings) -> ServiceClient | None:
        """A connection, or None when no service is listening (start one with `spawn`)."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(socket_path(session_dir, settings))
        except OSError:
            s.close()
            return None
        return cls(s)

    def _send(self, msg: dict[str, Any]) -> None:
        try:
            self._sock.sendall(json.dumps(msg).encode() + b"\n")
        except OSError as e:
            raise ServiceError(f"recorder service unreachable: {e.strerror or e}") from None

    def begin(self, spec: TaskSpec) -> None:
        self._send({"op": "begin", "task": asdict(spec)})

    def end(self, status: str, error: str | None = None) -> Result:
        """Wait until the service has recorded the task; its lineage."""
        self._send({"op": "end", "status": status, "error": error})
        line = self._file.readline()
        if not line:
            raise ServiceError("recorder service closed the connection before answering")
        try:
            data = json.loads(line)
        except ValueError as e:
            raise ServiceError(f"recorder service answered nonsense: {e}") from None
        if not isinstance(data, dict):
            raise ServiceError("recorder service answered nonsense: not an object")
        return Result(data)

    def close(self) -> None:
        self._file.close()
        self._sock.close()


def spawn(session_dir: str | os.PathLike, settings: Settings) -> None:
    """Start the service for this session and settings, detached and untraced, unless one
    holds its lock.  Returns at once; tasks use it once it listens."""
    lock = _lock_path(session_dir, settings)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # running (or starting)
    finally:
        os.close(fd)  # released: the service takes it itself
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", tracer.ENV_SESSION, tracer.ENV_TAG)}
    with open(Path(session_dir) / "recorder.log", "ab") as out:
        subprocess.Popen(
            [sys.executable, "-m", "roar_core.service", os.fspath(session_dir),
             settings.to_json()],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd=settings.cwd,
            start_new_session=True, close_fds=True)


# ---- server ---------------------------------------------------------------------------------


def ensure_workflow(roar: Roar, ref: RunRef, engine: str) -> None:
    """The workflow run's row in the store, made by the first of its tasks to get here."""
    from roar_core.recorder import now
    from roar_core.store import StoreError, WorkflowRun

    if roar.store.workflow_run(ref.run_id) is not None:
        return
    try:
        roar.store.start_workflow_run(
            WorkflowRun(ref.run_id, engine, ref.namespace, ref.job_name, now(), {}))
    except StoreError:
        if roar.store.workflow_run(ref.run_id) is None:  # not a lost race with a sibling
            raise


def result_of(job, status: str) -> Result:
    """A Result from what `Roar.end_task` handed back."""
    from roar_core.recorder import lineage_of

    if job.result is None:
        return Result.failed(status, job.error or "not recorded")
    r = job.result
    lineage = lineage_of(r.meta, r.outcome, r.inputs, r.outputs)
    return Result.of(r.outcome.status, r.inputs, r.outputs, lineage.task, lineage.io, job.error)


class _Turns:
    """Recording in the service takes turns, a task process's end first.

    The GIL runs one thread at a time anyway: recordings taking turns finish one after the
    other instead of all of them late, and the service's store writers never meet (SQLite
    makes a writer that finds the database locked sleep in its busy handler: 1, 2, 5 ... ms).
    A task process waits for the answer to its end; nothing waits for a begin (its row only
    has to be written before its end's, and the same connection sends both), for a dead
    task's ABORT or for the log sweep: those go when no end is waiting."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._urgent = 0  # ends waiting for their turn

    @contextmanager
    def take(self, urgent: bool) -> Iterator[None]:
        with self._cond:
            if urgent:
                self._urgent += 1
                while self._busy:
                    self._cond.wait()
                self._urgent -= 1
            else:
                while self._busy or self._urgent:
                    self._cond.wait()
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, roar: Roar, session_dir: Path):
        self.roar, self.session_dir = roar, session_dir
        self.active: dict[str, int] = {}  # run id -> began_mono_ns
        self.workflows: set[str] = set()  # workflow runs known to be in the store
        self.turns = _Turns()
        self.last_activity = time.monotonic()
        self.last_sweep = 0.0
        self.state = threading.Lock()
        super().__init__(path, _Handler)

    def begin(self, spec: TaskSpec) -> TaskMeta:
        with self.state:
            self.active[spec.run_id] = spec.began_mono_ns
            self.last_activity = time.monotonic()
        try:
            with self.turns.take(urgent=False):  # nobody waits for a begin
                return self._begin(spec)
        except BaseException:
            self._finished(spec)
            raise

    def _begin(self, spec: TaskSpec) -> TaskMeta:
        from roar_core.emission import Engine, RunRef

        workflow = RunRef(**spec.workflow) if spec.workflow else None
        if workflow is not None and workflow.run_id not in self.workflows:
            # Once per workflow run: every task of a DAG run names it.
            ensure_workflow(self.roar, workflow, spec.engine)
            self.workflows.add(workflow.run_id)
        return self.roar.begin_task(
            spec.job_name, spec.engine, workflow=workflow, engine_task_id=spec.engine_task_id,
            attempt=spec.attempt, pid=spec.pid, run_id=spec.run_id,
            engine_version=Engine(**spec.engine_version) if spec.engine_version else None,
            secrets=tuple(spec.secrets))

    def end(self, spec: TaskSpec, meta: TaskMeta, status: str, error: str | None,
            waited: bool = True) -> Result:
        """`waited`: a task process is waiting for the answer (not for a dead one's ABORT)."""
        from roar_core.session import SessionCollector

        if spec.session:
            collector = SessionCollector(Path(spec.session))
        else:
            collector = SessionCollector(self.session_dir, root_pid=spec.pid,
                                         since_mono_ns=spec.began_mono_ns)
            if spec.own_log:
                collector.skip(spec.own_log, spec.own_log_offset, spec.own_log_dropped)
        try:
            with self.turns.take(urgent=waited):
                return self._record(meta, status, error, collector)
        finally:
            self._finished(spec)

    def _finished(self, spec: TaskSpec) -> None:
        with self.state:
            self.active.pop(spec.run_id, None)
            self.last_activity = time.monotonic()

    def _record(self, meta: TaskMeta, status: str, error: str | None,
                collector: SessionCollector) -> Result:
        """Record in this (the connection's) thread: the task process is waiting, and a
        hand-off to Roar's recorder thread costs two more wake-ups on a busy machine.  The
        Recorder is thread-safe; failures are answered, never raised (as in Roar._work)."""
        from roar_core.recorder import TaskOutcome, lineage_of, now

        try:
            collector.collect()
            events = collector.take(meta.run_id)
            outcome = TaskOutcome(status, now(), None, error, events.dropped)
            r = self.roar.recorder.record(meta, outcome, events.records)
        except Exception as e:  # lineage must never take the service down
            log.error("roar: lineage of task %s lost: %s: %s", meta.job_name,
                      type(e).__name__, e)
            return Result.failed(status, f"{type(e).__name__}: {e}")
        lineage = lineage_of(r.meta, r.outcome, r.inputs, r.outputs)
        return Result.of(r.outcome.status, r.inputs, r.outputs, lineage.task, lineage.io)

    def sweep(self) -> None:
        """Remove logs that no running or future task can need: their process is gone and
        they were created before every running task began."""
        with self.state:
            if time.monotonic() - self.last_sweep < SWEEP_EVERY_S:
                return
            self.last_sweep = time.monotonic()
            horizon = min(self.active.values(), default=time.monotonic_ns())
        from roar_core import tracelog

        with self.turns.take(urgent=False):
            for path in tracelog.log_files(self.session_dir):
                parts = path.stem.split("-")
                try:
                    pid, mono = int(parts[1]), int(parts[2])
                except (IndexError, ValueError):
                    continue
                if mono < horizon and not pid_alive(pid):
                    path.unlink(missing_ok=True)


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        spec = meta = None
        failure: str | None = None
        for line in self.rfile:
            try:
                msg = json.loads(line)
                if msg.get("op") == "begin":
                    spec = TaskSpec(**msg["task"])
                    meta = self.server.begin(spec)
                    short_slice()  # from now on, the task process waits for this thread
                    continue
                if msg.get("op") != "end":
                    raise ValueError(f"unknown op {msg.get('op')!r} (valid: begin, end)")
            except Exception as e:  # a bad begin is answered at end
                failure = f"{type(e).__name__}: {e}"
                continue
            if meta is None:
                result = Result.failed("ABORT", failure or "end before begin")
            else:
                result = self.server.end(spec, meta, msg.get("status", "COMPLETE"),
                                         msg.get("error"))
            self.wfile.write(json.dumps(result.data).encode() + b"\n")
            self.wfile.flush()
            spec = meta = None
            break
        if meta is not None:  # the task process went away mid-task
            self.server.end(spec, meta, "ABORT", "the task process died before the task ended",
                            waited=False)
        self.server.sweep()


def serve(session_dir: Path, settings: Settings, idle_exit_s: float = IDLE_EXIT_S) -> None:
    from dataclasses import replace

    from roar_core import config
    from roar_core.api import Roar

    fd = os.open(_lock_path(session_dir, settings), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # another service won the race
    cfg = config.load(cwd=Path(settings.cwd), **settings.overrides)
    cfg = replace(cfg, exclude=(*cfg.exclude, *settings.exclude))
    roar = Roar(cfg, internal=settings.internal)
    from roar_core.recorder import freeze_heap

    freeze_heap()
    path = socket_path(session_dir, settings)
    if os.path.exists(path):
        os.unlink(path)  # we hold the lock: whoever made it is gone
    old = os.umask(0o177)
    try:
        server = _Server(path, roar, session_dir)
    finally:
        os.umask(old)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                              daemon=True)
    thread.start()
    log.info("roar recorder service for %s listening on %s", session_dir, path)
    ours = os.stat(path).st_ino

    def still_ours() -> bool:  # the session was removed, or another service took over
        try:
            return os.stat(path).st_ino == ours
        except OSError:
            return False

    try:
        while session_dir.is_dir() and still_ours():
            time.sleep(min(5.0, idle_exit_s / 2))
            with server.state:
                idle = not server.active and time.monotonic() - server.last_activity > idle_exit_s
            if idle:
                break
    finally:
        server.shutdown()
        server.server_close()
        if still_ours():
            os.unlink(path)
        roar.close()
        os.close(fd)


# Linux's EEVDF scheduler (6.6+) lets a thread that wakes up preempt a busy core sooner the
# shorter its slice; since 6.12 a thread may ask for its own (sched_attr.sched_runtime, no
# privilege needed).
SLICE_NS = 100_000  # the shortest the kernel grants
_SYS_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}
_SCHED_FLAG_KEEP_POLICY = 0x08


def short_slice() -> None:
    """Ask for a short scheduling slice for the calling thread (best effort).

    A connection's thread, once the task has begun, sleeps until the task process sends its
    end, then runs ~1 ms while that process waits.  On a worker whose cores are busy with
    other tasks, with the default slice it often waits for a running task's slice to end
    first (measured on 2 busy cores, bench/bench_service.py: the answer came 0.3-0.5 ms
    later at the median, 2 ms at p95).  A short slice changes when the thread gets a core, not its
    share of the CPU.  Not for the rest of the service: recording a begin is not urgent, and
    it would take the core from the task process, which is sending it and running."""
    import struct

    setattr_ = _sched_setattr()
    if setattr_ is None:
        return
    try:
        nice = os.getpriority(os.PRIO_PROCESS, 0)  # sched_attr sets it too: keep it
    except OSError:
        return
    # struct sched_attr, SCHED_ATTR_SIZE_VER1: size, policy (kept), flags, nice, priority,
    # runtime (the slice), deadline, period, util_min, util_max.
    setattr_(struct.pack("IIQiIQQQII", 56, 0, _SCHED_FLAG_KEEP_POLICY, nice, 0, SLICE_NS,
                         0, 0, 0, 0))


@functools.lru_cache(maxsize=1)
def _sched_setattr() -> Callable[[bytes], int] | None:
    """sched_setattr(2) for the calling thread, or None where there is none to call."""
    import ctypes
    import platform

    nr = _SYS_SCHED_SETATTR.get(platform.machine())
    if nr is None or not sys.platform.startswith("linux"):
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    return lambda attr: syscall(nr, 0, ctypes.c_char_p(attr), 0)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    log.setLevel(logging.INFO)
    serve(Path(sys.argv[1]), Settings.from_json(sys.argv[2]))


if __name__ == "__main__":
    main()
