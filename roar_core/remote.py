"""Roar in a helper process, for engines whose scheduler is Python and holds the GIL.

An engine like Snakemake schedules jobs from one Python thread; anything else running in its
process (importing the OpenLineage client and SQLAlchemy, the store, hashing, the spool)
takes the GIL from the scheduler and adds to the workflow's wall time one for one.
`RemoteRoar` keeps in the engine's process only what has to be there -- run ids, per-task
session directories, a pickle written to a pipe -- and runs a `Roar` in a child process
(`python -m roar_core.remote`) that does the rest on another core.

    remote = RemoteRoar(cfg, internal=[".snakemake"])
    wf = remote.start_workflow("my_workflow", engine="snakemake")
    run_id, session = remote.begin_task("my_workflow.rule", "snakemake", workflow=wf)
    ...the task's processes run with tracer.preload_env(session, tag=run_id)...
    remote.end_task(run_id, "COMPLETE", session=session)     # returns at once
    remote.finish_workflow(wf, "COMPLETE")
    results = remote.close()                                 # waits for everything

Calls only queue requests, in order, to the child; `end_task(wait=True)` and `close()` wait
for its answer.  Requests are pickles over a private pipe between a process and its own child.
If the child dies, lineage from then on is lost with one error line; the engine's jobs go on.
Import this module from the engine's process without loading the recorder: it imports only
light modules at the top.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import shutil
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from roar_core.config import Config
from roar_core.declared import Declared
from roar_core.ids import new_run_id
from roar_core.session import hold_owner_lock, new_session_dir

log = logging.getLogger("roar")

_LEN = struct.Struct("<I")
RecordsFilter = Callable[[list], list]  # records -> records (picklable: a module function)


@dataclass(frozen=True)
class TaskResult:
    """What became of one task's lineage (from the child, at `end_task(wait=True)`/`close`)."""

    run_id: str
    job_name: str
    status: str
    traced: bool
    untraced_reason: str | None = None
    undeclared_reads: tuple[str, ...] = ()
    undeclared_writes: tuple[str, ...] = ()
    declared_untouched: tuple[str, ...] = ()
    error: str | None = None
    """Why the lineage could not be recorded; None when it was."""


def _write_frame(out: BinaryIO, obj: Any) -> None:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_LEN.pack(len(body)) + body)
    out.flush()


def _read_frame(inp: BinaryIO) -> Any:
    head = inp.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError
    (size,) = _LEN.unpack(head)
    body = inp.read(size)
    if len(body) < size:
        raise EOFError
    return pickle.loads(body)


def _child_env() -> dict[str, str]:
    # The recorder is never traced, whatever the engine's own environment holds.
    return {k: v for k, v in os.environ.items()
            if k not in ("LD_PRELOAD", "ROAR_SESSION_DIR", "ROAR_TASK_TAG")}


@dataclass
class _Pending:
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None


class RemoteRoar:
    def __init__(self, cfg: Config, *, internal: Iterable[str | os.PathLike] = (),
                 python: str = sys.executable):
        self.config = cfg
        # The tasks' sessions die with this object (each is read, then removed, as soon as
        # its task ends).
        self.sessions = new_session_dir(cfg, f"remote-{new_run_id()}", in_memory=True)
        self._owner: int | None = hold_owner_lock(self.sessions)  # never swept while we live
        internal = [*internal, self.sessions]
        self._proc = subprocess.Popen(
            [python, "-m", "roar_core.remote"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            # Its own session: a Ctrl-C meant for the engine must not kill the recorder
            # mid-write; it ends when the engine closes the pipe (or exits, or dies).
            env=_child_env(), close_fds=True, start_new_session=True)
        # Requests go out from a writer thread, so that the engine's thread never blocks on
        # a full pipe while the recorder is busy (an unbounded queue, in call order).
        self._outbox: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # the fields below
        self._pending: dict[int, _Pending] = {}
        self._next = 0
        self._dead: str | None = None
        self._closed = False
        self._send("init", cfg=cfg, internal=[os.fspath(p) for p in internal])
        self._writer = threading.Thread(target=self._write, name="roar-remote-writer",
                                        daemon=True)
        self._reader = threading.Thread(target=self._read, name="roar-remote-reader",
                                        daemon=True)
        self._writer.start()
        self._reader.start()

    # ---- the pipe ------------------------------------------------------------------------

    def _send(self, op: str, _wait: bool = False, **kwargs: Any) -> Any:
        pending = _Pending() if _wait else None
        with self._lock:
            if self._dead is not None:
                return None
            self._next += 1
            req = self._next if _wait else 0
            if pending is not None:
                self._pending[req] = pending
        self._outbox.put((op, req, kwargs))
        if pending is None:
            return None
        pending.done.wait()
        return pending.value

    def _died(self, why: str) -> None:
        # Called with self._lock held.
        if self._dead is None:
            self._dead = why
            log.error("roar: %s; lineage of the tasks from now on is LOST (jobs go on)", why)
        for p in self._pending.values():
            p.done.set()
        self._pending.clear()

    def _write(self) -> None:
        while (item := self._outbox.get()) is not None:
            try:
                _write_frame(self._proc.stdin, item)
            except (OSError, ValueError) as e:
                with self._lock:
                    self._died(f"cannot reach the recorder process: {e}")
                return
            except Exception as e:  # e.g. an argument that does not pickle: drop that one
                log.error("roar: cannot send %s to the recorder: %s: %s", item[0],
                          type(e).__name__, e)
                with self._lock:
                    p = self._pending.pop(item[1], None)
                if p is not None:
                    p.done.set()
        try:
            self._proc.stdin.close()
        except OSError:
            pass

    def _read(self) -> None:
        try:
            while True:
                req, value = _read_frame(self._proc.stdout)
                with self._lock:
                    p = self._pending.pop(req, None)
                if p is not None:
                    p.value = value
                    p.done.set()
        except (EOFError, OSError):
            pass
        except Exception as e:  # a reply we cannot read: treat the recorder as gone
            log.error("roar: bad reply from the recorder process: %s: %s", type(e).__name__, e)
            self._proc.kill()
        status = self._proc.wait()
        with self._lock:
            if not self._closed:
                self._died(f"the recorder process exited (status {status})")
            for p in self._pending.values():
                p.done.set()

    # ---- the API -------------------------------------------------------------------------

    def start_workflow(self, job_name: str, engine: str, run_id: str | None = None,
                       facets: dict | None = None,
                       engine_version: tuple[str, str] | None = None) -> str:
        """`engine_version`: (name, version) of the engine, for `processing_engine`."""
        run_id = run_id or new_run_id()
        self._send("start_workflow", job_name=job_name, engine=engine, run_id=run_id,
                   facets=facets, engine_version=engine_version)
        return run_id

    def finish_workflow(self, run_id: str, status: str = "COMPLETE",
                        error: str | None = None) -> None:
        self._send("finish_workflow", run_id=run_id, status=status, error=error)

    def begin_task(self, job_name: str, engine: str, *, workflow: str | None = None,
                   run_facets: dict[str, dict] | None = None,
                   declared: Declared | None = None,
                   engine_version: tuple[str, str] | None = None,
                   traced: bool = True, **kwargs: Any) -> tuple[str, Path | None]:
        """Returns (run id = tracer tag, the task's own session directory or None when
        untraced).  `run_facets`: facet key -> fields, for roar's own facets
        (roar_core.facets.RUN_FACETS); `workflow`: the run id from start_workflow; the
        rest as `Roar.begin_task`."""
        run_id = kwargs.pop("run_id", None) or new_run_id()
        # Taken here, when the engine begins the task: the child may still be starting.
        kwargs.setdefault("started_at", datetime.now(timezone.utc))
        session = None
        if traced:
            session = self.sessions / run_id
            session.mkdir()
        self._send("begin_task", job_name=job_name, engine=engine, workflow=workflow,
                   run_facets=run_facets, declared=declared, engine_version=engine_version,
                   traced=traced, run_id=run_id, session=session, kwargs=kwargs)
        return run_id, session

    def end_task(self, run_id: str, status: str = "COMPLETE", *,
                 session: Path | None = None, exit_code: int | None = None,
                 error: str | None = None, records_filter: RecordsFilter | None = None,
                 wait: bool = False, pid: int | None = None,
                 ended_at: datetime | None = None) -> TaskResult | None:
        """Record the task from its session directory (then removed).  With wait, return
        once it is recorded: its files have been classified and hashed.  `pid`: the
        task's own process, when known only now; `ended_at`: when it ended (default:
        now, not when the recorder process gets to it)."""
        return self._send("end_task", _wait=wait, run_id=run_id, status=status,
                          session=session, exit_code=exit_code, error=error,
                          records_filter=records_filter, pid=pid,
                          ended_at=ended_at or datetime.now(timezone.utc))

    def close(self, timeout: float | None = None) -> list[TaskResult]:
        """Wait for every task to be recorded and the child to exit; the results of all
        tasks ended through this instance."""
        results = self._send("close", _wait=True, timeout=timeout)
        with self._lock:
            self._closed = True
        self._outbox.put(None)
        self._writer.join(timeout=30)
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        shutil.rmtree(self.sessions, ignore_errors=True)
        if self._owner is not None:
            os.close(self._owner)
            self._owner = None
        return results or []

    @property
    def error(self) -> str | None:
        """Why the recorder process is gone, if it is."""
        return self._dead


# ---- the child ---------------------------------------------------------------------------


# How long a job's start may wait to be recorded with its end (its START event that much
# later for a longer job).
HOLD_START_S = 1.0


class _Server:
    def __init__(self, out: BinaryIO, cfg: Config, internal: list[str]):
        from roar_core.api import Roar

        self.out = out
        self.out_lock = threading.Lock()
        # Snakemake's jobs are often shell one-liners: one commit and one spool sync each,
        # where a separate start would take two.
        self.roar = Roar(cfg, internal=internal, hold_start_s=HOLD_START_S)
        self.workflows: dict[str, Any] = {}
        self.metas: dict[str, Any] = {}
        self.sessions: dict[str, Path | None] = {}
        self.jobs: list[Any] = []

    def reply(self, req: int, value: Any) -> None:
        if req:
            with self.out_lock:
                _write_frame(self.out, (req, value))

    def start_workflow(self, job_name, engine, run_id, facets, engine_version=None):
        from roar_core import emission

        self.workflows[run_id] = self.roar.start_workflow(
            job_name, engine, run_id=run_id, facets=facets,
            engine_version=emission.Engine(*engine_version) if engine_version else None)

    def finish_workflow(self, run_id, status, error):
        self.roar.finish_workflow(self.workflows.pop(run_id), status, error=error)

    def begin_task(self, job_name, engine, workflow, run_facets, declared, engine_version,
                   traced, run_id, session, kwargs):
        from roar_core import emission
        from roar_core.facets import RUN_FACETS

        facets = {key: RUN_FACETS[key](**fields, producer=emission.producer())
                  for key, fields in (run_facets or {}).items()}
        self.metas[run_id] = self.roar.begin_task(
            job_name, engine, workflow=self.workflows.get(workflow) if workflow else None,
            run_facets=facets, declared=declared, traced=traced, run_id=run_id,
            engine_version=emission.Engine(*engine_version) if engine_version else None,
            **kwargs)
        self.sessions[run_id] = session

    def end_task(self, req, run_id, status, session, exit_code, error, records_filter,
                 pid=None, ended_at=None):
        from roar_core.session import SessionCollector, remove_session_dir

        meta = self.metas.pop(run_id)
        if pid is not None:
            meta.pid = pid
        self.sessions.pop(run_id, None)
        source = None
        if session is not None:
            collect = self.roar.collector_source(SessionCollector(session))

            def source(tag: str):
                records, dropped = collect(tag)
                remove_session_dir(session)  # read: the task's processes are gone
                if records_filter is not None:
                    records = records_filter(records)
                return records, dropped

        job = self.roar.end_task(meta, status, exit_code=exit_code, error=error, source=source,
                                 ended_at=ended_at)
        self.jobs.append(job)
        if req:
            def answer() -> None:
                job.done.wait()
                self.reply(req, _result(job))

            threading.Thread(target=answer, daemon=True).start()

    def close(self, req, timeout, engine_gone: bool = False):
        # Tasks begun and never ended (the engine was killed, or did not say): ABORT, with
        # whatever their processes did.
        for run_id in list(self.metas):
            self.end_task(0, run_id, "ABORT", self.sessions.get(run_id), None,
                          "the engine went away before the task ended" if engine_gone
                          else "never ended", None)
        for ref in list(self.workflows.values()):
            self.roar.finish_workflow(ref, "ABORT", error="the engine went away")
        self.workflows.clear()
        self.roar.finalize(timeout)
        results = [_result(j) for j in self.jobs]
        self.roar.close()
        self.reply(req, results)


def _result(job) -> TaskResult:
    meta, check = job.meta, job.meta.io_check
    return TaskResult(
        run_id=meta.run_id, job_name=meta.job_name, status=job.outcome.status,
        traced=meta.traced, untraced_reason=meta.untraced_reason,
        undeclared_reads=tuple(check.undeclared_reads or ()) if check else (),
        undeclared_writes=tuple(check.undeclared_writes or ()) if check else (),
        declared_untouched=tuple(check.declared_untouched or ()) if check else (),
        error=job.error if job.done.is_set() else "not recorded in time",
    )


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    op, _req, kwargs = _read_frame(inp)
    if op != "init":
        raise SystemExit(f"roar recorder: expected init, got {op!r}")
    server = _Server(out, **kwargs)
    from roar_core.recorder import freeze_heap

    freeze_heap()
    while True:
        try:
            op, req, kwargs = _read_frame(inp)
        except EOFError:  # the engine is gone: record what we have
            server.close(0, None, engine_gone=True)
            return
        try:
            if op in ("end_task", "close"):
                getattr(server, op)(req, **kwargs)
            else:
                getattr(server, op)(**kwargs)
                server.reply(req, None)
        except Exception as e:  # one bad request never takes the recorder down
            log.error("roar: recorder: %s failed: %s: %s", op, type(e).__name__, e)
            server.reply(req, None)
        if op == "close":
            return


def main() -> None:
    # The pipe is ours: anything else printing to stdout would corrupt it.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    # Run the imported module's main, so that what we pickle (TaskResult) is named
    # roar_core.remote.TaskResult, not __main__.TaskResult.
    from roar_core import remote

    remote.main()
