"""`roar-core run`: trace one command as one task and record its lineage."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from roar_core import tracelog, tracer
from roar_core.api import Roar
from roar_core.attribution import attribute
from roar_core.recorder import RecordedTask
from roar_core.session import new_session_dir, remove_session_dir, run_traced


@dataclass
class RunResult:
    returncode: int  # as subprocess reports it: < 0 means killed by that signal
    recorded: RecordedTask | None
    error: str | None  # lineage that could not be recorded (the command still ran)


def run_command(roar: Roar, argv: list[str], job_name: str | None = None) -> RunResult:
    status = tracer.status()
    job = job_name or Path(argv[0]).name
    meta = roar.begin_task(job, engine="cli", command=argv, traced=status.usable,
                           untraced_reason=None if status.usable else status.reason)
    session = new_session_dir(roar.config, meta.run_id) if status.usable else None
    try:
        rc = run_traced(argv, session, meta.run_id)
    except OSError as e:  # e.g. command not found: behave like a shell (127/126)
        rc = 127 if isinstance(e, FileNotFoundError) else 126
        print(f"roar-core: {argv[0]}: {e.strerror}", file=sys.stderr)

    def source(_tag: str):
        if session is None:
            return [], 0
        trace = tracelog.read_session(session)
        # Every process in this session belongs to the one command we ran.
        records = [r for t in attribute(trace.logs).values() for r in t.records]
        records.sort(key=lambda r: r.mono_ns)
        return records, trace.dropped

    outcome = "COMPLETE" if rc == 0 else "FAIL"
    error = None
    if rc < 0:
        error = f"killed by {signal.Signals(-rc).name}"
    elif rc:
        error = f"exit code {rc}"
    job_ = roar.end_task(meta, outcome, exit_code=rc, error=error, source=source, wait=True)
    if session is not None and job_.error is None:
        remove_session_dir(session)
    return RunResult(rc, job_.result, job_.error)


def exit_like(returncode: int) -> None:
    """Leave the way the command did: same exit code, or the same signal."""
    if returncode < 0:
        sig = -returncode
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    raise SystemExit(returncode)
