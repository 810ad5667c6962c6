"""Handing a traced command's session to the recorder (the CLI's background queue).

A session directory is the unit of hand-off: `runner.json` is written before the command
starts, the tracer's logs while it runs, and `task.json` when it has ended.  `roar-core
run` then starts a detached recorder process (unless one is already draining) and exits
like its command, so a run costs the command plus a few milliseconds; the recorder does
the classification, hashing, store and spool.  Any command that reads lineage drains
pending sessions first, so what it shows is complete.  A session whose runner died
before writing `task.json` is recorded as ABORT with whatever its logs hold: nothing
traced is lost.

This module is imported on the `roar-core run` fast path: keep its imports light.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from roar_core.config import Config
from roar_core.session import pid_alive

RUNNER = "runner.json"
DONE = "task.json"
CAPTURE = "capture.json"  # the run's file versions, taken as its command ended
STAGED = "events.jsonl"  # the run's events, between the store's commit and the spool
ERROR = "error.txt"  # why the last attempt to record the session failed
LOCK = ".recorder.lock"


@dataclass
class RunnerInfo:
    run_id: str
    job_name: str
    argv: list[str]
    cwd: str
    started_at: str  # ISO-8601 with offset
    pid: int
    host: str
    traced: bool
    untraced_reason: str | None = None


@dataclass
class TaskDone:
    ended_at: str
    returncode: int


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _write_json(path: Path, data: dict) -> None:
    _write_durably(path, json.dumps(data).encode())


def _write_durably(path: Path, data: bytes) -> None:
    """`path` holds `data`, whole and on disk, or is as it was (nothing half-written is
    left behind: a full disk)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class NoSession(OSError):
    """Neither the roar home nor the spare directory can hold a session: the command runs
    untraced."""


def begin(cfg: Config, argv: list[str], job_name: str, traced: bool,
          untraced_reason: str | None = None) -> tuple[Path, RunnerInfo]:
    """A new session for one command: under the roar home; where that cannot be written
    (a full disk, a read-only mount), in the spare directory (`spare_dir`), recorded once
    the home can be written again.  NoSession: nowhere."""
    from roar_core.ids import new_run_id

    info = RunnerInfo(new_run_id(), job_name, list(argv), os.getcwd(), _now(), os.getpid(),
                      socket.gethostname(), traced, untraced_reason)
    name = f"run-{uuid.uuid4().hex}"
    problems = []
    for base in (cfg.sessions_dir, spare_dir(cfg)):
        if base is None:
            continue
        try:
            _new_session(base / name, info)
        except OSError as e:
            problems.append(f"{base}: {e.strerror or e}")
            continue
        if problems:
            print(f"roar-core: warning: cannot write the roar home ({problems[0]}); this run "
                  f"is kept in {base} and recorded once the home can be written",
                  file=sys.stderr)
        return base / name, info
    raise NoSession("; ".join(problems))


def _new_session(session: Path, info: RunnerInfo) -> None:
    session.mkdir(parents=True, exist_ok=True)
    try:
        _write_json(session / RUNNER, asdict(info))
    except OSError:
        import shutil

        shutil.rmtree(session, ignore_errors=True)  # nothing half-written left behind
        raise


def _session_bases(cfg: Config) -> list[Path]:
    """Where `roar-core run`'s sessions are: under the home, and in the spare directory."""
    spare = spare_dir(cfg)
    return [cfg.sessions_dir] if spare is None else [cfg.sessions_dir, spare]


def spare_dir(cfg: Config) -> Path | None:
    """Where sessions go while the roar home cannot be written: this user's in-memory
    directory, one per home.  It outlives the processes (not a reboot), and the sweep of
    stale in-memory sessions leaves it alone."""
    from roar_core.session import SPARE_PREFIX, memory_sessions_dir

    memory = memory_sessions_dir()
    if memory is None:
        return None
    import zlib  # not hashlib: ~2.6 ms to import, on every `roar-core run`

    home = os.fsencode(cfg.home)
    return memory / f"{SPARE_PREFIX}{zlib.crc32(home):08x}{zlib.adler32(home):08x}"


def read_runner(session: Path) -> RunnerInfo:
    return RunnerInfo(**json.loads((session / RUNNER).read_text()))


def end(session: Path, returncode: int) -> None:
    _write_json(session / DONE, asdict(TaskDone(_now(), returncode)))


def _records(session: Path):
    """(records in time order, the session's trace) of a session's logs: every process
    there belongs to the one command that was run."""
    from roar_core import tracelog
    from roar_core.attribution import attribute

    trace = tracelog.read_session(session)
    records = sorted((r for t in attribute(trace.logs).values() for r in t.records),
                     key=lambda r: r.mono_ns)
    return records, trace


def capture(cfg: Config, session: Path) -> None:
    """Take the run's file versions now, as its command has ended and before `roar-core
    run` returns to the shell: the next command may rewrite or delete them at once, and the
    recorder, running later, must record what this one left (roar_core.capture)."""
    from roar_core.tracelog import LINEAGE_OPS

    records, _ = _records(session)
    if not any(r.op in LINEAGE_OPS for r in records):
        return  # nothing a capture could hold (`true`): the recorder finds that too
    from roar_core import capture as capture_mod
    from roar_core.classification import PathFilter

    io = capture_mod.classified(records, PathFilter.for_config(cfg))
    if io.inputs or io.outputs or io.code:
        with capture_mod.hasher_for(cfg, stat_cache=session.parent == cfg.sessions_dir) \
                as hasher:
            taken = capture_mod.versions(io, hasher)
    else:
        taken = capture_mod.Capture(io)
    tmp = session / (CAPTURE + ".tmp")
    tmp.write_text(capture_mod.to_json(taken))
    os.replace(tmp, session / CAPTURE)


def _lock(cfg: Config, blocking: bool):
    cfg.sessions_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(cfg.sessions_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def recorder_running(cfg: Config) -> bool:
    fd = _lock(cfg, blocking=False)
    if fd is None:
        return True
    os.close(fd)
    return False


def spawn_recorder(cfg: Config) -> None:
    """Start a detached recorder unless one is running.  The lock is taken here and its fd
    handed to the recorder, so there is no moment at which a second one could start (a
    recorder re-scans before it exits, so a session that ends meanwhile is not missed)."""
    fd = _lock(cfg, blocking=False)
    if fd is None:
        return
    try:
        log = open(cfg.home / "recorder.log", "ab")
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "ROAR_SESSION_DIR", "ROAR_TASK_TAG")}
        subprocess.Popen([sys.executable, "-m", "roar_core.handoff", str(cfg.project_root),
                          str(fd)],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                         cwd=cfg.project_root, start_new_session=True, pass_fds=(fd,))
        log.close()
    finally:
        os.close(fd)  # the recorder's copy of the descriptor keeps the lock


def pending(cfg: Config) -> list[Path]:
    """Sessions ready to record: ended, or orphaned by a runner that died (under the home,
    and in the spare directory)."""
    found = [d for base in _session_bases(cfg) for d in base.glob("run-*")]
    out = []
    for d in sorted(found, key=_mtime_ns):
        runner = d / RUNNER
        if (d / DONE).exists():
            out.append(d)
        elif runner.exists():
            try:
                info = json.loads(runner.read_text())
            except (OSError, ValueError):
                continue
            if info.get("host") == socket.gethostname() and not pid_alive(int(info["pid"])):
                out.append(d)
    return out


def _mtime_ns(d: Path) -> int:
    # A recorder in another process removes the sessions it has recorded, also between
    # our listing and this stat: such a one sorts first, and is skipped as not ended.
    try:
        return d.stat().st_mtime_ns
    except FileNotFoundError:
        return 0


def _record_session(roar, d: Path, collector=None):
    """Record one session through the core (imports the heavy steps lazily).  `collector`:
    the SessionCollector that read its logs while the command ran (`run --wait`).  None:
    a recorder that died had stored it; its events are spooled now."""
    from roar_core import capture as capture_mod
    from roar_core.recorder import TaskMeta, TaskOutcome

    info = read_runner(d)
    stored = roar.store.task_run(info.run_id)
    if stored is not None and stored.status != "RUNNING":
        _resume(roar, d)
        return None
    done_path = d / DONE
    done = TaskDone(**json.loads(done_path.read_text())) if done_path.exists() else None
    meta = TaskMeta(
        run_id=info.run_id, engine="cli", namespace=roar.config.namespace,
        job_name=info.job_name, started_at=datetime.fromisoformat(info.started_at),
        command=info.argv, host=info.host, pid=info.pid, traced=info.traced,
        untraced_reason=info.untraced_reason,
    )
    # Every process of the session belongs to the one command that was run.
    if collector is not None:
        collector.collect(settle=True)  # what was logged since its last read
        events = collector.take_all()
        errors = collector.errors
        # An unreadable log counts as one lost event, as in read_session.
        records, dropped = events.records, events.dropped + len(errors)
        no_logs = collector.logs_read == 0
    else:
        records, trace = _records(d)
        dropped, errors, no_logs = trace.dropped, trace.errors, not trace.logs
    if info.traced and no_logs and not errors:
        meta.traced = False
        meta.untraced_reason = (f"{info.argv[0]} left no trace: a static or setuid program, "
                                "or the loader refused the preload library")
    for err in errors:
        print(f"roar-core: warning: {err}", file=sys.stderr)
    if done is None:
        outcome = TaskOutcome("ABORT", datetime.now(timezone.utc), None,
                              "the roar-core runner died before the command ended",
                              dropped)
    else:
        rc = done.returncode
        error = None
        if rc < 0:
            import signal

            error = f"killed by {signal.Signals(-rc).name}"
        elif rc:
            error = f"exit code {rc}"
        outcome = TaskOutcome("COMPLETE" if rc == 0 else "FAIL",
                              datetime.fromisoformat(done.ended_at), rc, error, dropped)
    # Taken by the runner as the command ended; without it (a runner that died, or
    # `run --wait`, which records right away) the versions are taken now.
    if (d / CAPTURE).exists() and meta.traced:
        captured = capture_mod.from_json((d / CAPTURE).read_text())
    else:
        captured = roar.recorder.capture_late(meta, outcome, records)
    # Its start and end in one commit, its events kept in the session until spooled.
    # (A run stored RUNNING: its start only, by a recorder of an older roar.)
    recorded = roar.recorder.record(meta, outcome, records, captured=captured,
                                    start=stored is None,
                                    before_commit=lambda events: _stage_events(d, events))
    _unstage(d)
    return recorded


def _stage_events(d: Path, events: list) -> None:
    """Keep a run's events in its session, durably, before the store commits the run: a
    recorder killed after the commit leaves them for the next one to send (storing the
    run again would fail, and a run stored without its events would never be sent)."""
    import orjson

    _write_durably(d / STAGED, b"".join(orjson.dumps(e) + b"\n" for e in events))


def _unstage(d: Path) -> None:
    """The session is recorded and its events spooled: gone (its staged events first, so
    that a recorder killed meanwhile does not send them twice)."""
    import shutil

    try:
        os.unlink(d / STAGED)
    except FileNotFoundError:
        pass
    shutil.rmtree(d, ignore_errors=True)


def _resume(roar, d: Path) -> None:
    """Finish a session whose run a recorder that died has stored already: spool the
    events it staged, once."""
    staged = d / STAGED
    if staged.exists() and roar.recorder.spool is not None:
        import orjson

        from roar_core.emission import Event

        lines = staged.read_bytes().splitlines()
        with roar.recorder.spool.batch():
            for line in lines:
                roar.recorder.emit(Event(orjson.loads(line)))
    _unstage(d)


def drain(roar, blocking: bool = True, locked_fd: int | None = None,
          collected: dict | None = None) -> list:
    """Record every pending session; returns the RecordedTasks.  With blocking=False,
    returns [] at once if another recorder is draining.  `locked_fd`: the lock is already
    held through this descriptor (handed over by spawn_recorder); it is released here.
    `collected`: session dir -> the SessionCollector that has read (part of) its logs."""
    from roar_core.recorder import gc_paused

    fd = locked_fd if locked_fd is not None else _lock(roar.config, blocking)
    if fd is None:
        return []
    done = []
    failed: set[Path] = set()
    try:
        while batch := [d for d in pending(roar.config) if d not in failed]:
            for d in batch:
                try:
                    with gc_paused():
                        recorded = _record_session(roar, d, (collected or {}).get(d))
                except Exception as e:  # noqa: BLE001 - kept for the next recorder
                    failed.add(d)
                    _note_failure(d, f"{type(e).__name__}: {e}")
                    continue
                if recorded is not None:
                    done.append(recorded)
    finally:
        os.close(fd)
    return done


def _note_failure(d: Path, why: str) -> None:
    """A session that could not be recorded stays pending, for the next recorder (the
    cause may go away: a store repaired, space freed), with why in it for `doctor`."""
    print(f"roar-core: warning: cannot record {d.name} (kept, to retry later): {why}",
          file=sys.stderr)
    try:
        (d / ERROR).write_text(why + "\n")
    except OSError:
        pass


def failures(cfg: Config) -> list[tuple[Path, str]]:
    """Sessions whose last attempt to be recorded failed, and why (for `doctor`)."""
    out = []
    found = [e for base in _session_bases(cfg) for e in base.glob(f"run-*/{ERROR}")]
    for err in sorted(found, key=_mtime_ns):
        try:
            out.append((err.parent, err.read_text().strip()))
        except OSError:
            continue
    return out


def main() -> None:
    """The detached recorder: drain, flush the spool briefly, exit."""
    from roar_core import config
    from roar_core.api import Roar

    cfg = config.load(cwd=Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    fd = int(sys.argv[2]) if len(sys.argv) > 2 else None
    roar = Roar(cfg, send=False)
    try:
        drain(roar, locked_fd=fd) if fd is not None else drain(roar, blocking=False)
        # A runner that finished while we held the lock did not start a recorder: look
        # again after releasing it.
        while pending(cfg) and drain(roar, blocking=False):
            pass
    finally:
        spool = roar.spool
        roar.close(timeout=0)
        if spool is not None:
            # Up to a minute for a large backlog, but no retrying: in an outage each `run`
            # started a recorder that waited the minute out (a dozen alive at once, 70 MiB
            # each); the next recorder or `roar-core flush` tries again.
            spool.flush(60.0, retry=False)


if __name__ == "__main__":
    main()
