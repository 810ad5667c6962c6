"""Sessions: the directory the tracer writes into, and getting each task's events out.

A session directory holds one log per traced process.  `SessionCollector` reads them
incrementally (a long-lived worker's own log is read while it is still being written)
and hands out each task's records by tag; `run_traced` runs one command under the
tracer with its exit status and signals passed through.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import uuid
from collections import defaultdict
from pathlib import Path

from roar_core import tracelog, tracer
from roar_core.attribution import TaskEvents, attribute
from roar_core.config import Config


def new_session_dir(config: Config, name: str | None = None) -> Path:
    d = config.sessions_dir / (name or uuid.uuid4().hex)
    d.mkdir(parents=True, exist_ok=True)
    return d


def remove_session_dir(d: Path) -> None:
    shutil.rmtree(d, ignore_errors=True)


class SessionCollector:
    """Incremental reader of a session's logs.  Logs of processes still running are read
    up to their last committed record; the rest is picked up by the next collect()."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._offsets: dict[Path, int] = {}
        self._headers: dict[Path, tracelog.LogHeader] = {}
        self._pending: dict[str, list[tracelog.Record]] = defaultdict(list)
        self._dropped: dict[str, int] = defaultdict(int)
        self.errors: list[str] = []
        self._lock = threading.Lock()

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def collect(self) -> None:
        with self._lock:
            logs = []
            for path in tracelog.log_files(self.directory):
                start = self._offsets.get(path, 0)
                try:
                    head = self._headers.get(path)
                    final = head is not None and not self._alive(head.pid)
                    log = tracelog.read_log(path, start=start, final=final)
                except tracelog.TraceLogError as e:
                    if path not in self._offsets:
                        self.errors.append(str(e))
                        self._offsets[path] = 1 << 62  # never again
                    continue
                self._headers[path] = log.header
                self._offsets[path] = log.next_offset
                if log.records or log.torn:
                    logs.append(log)
            for tag, events in attribute(logs).items():
                self._pending[tag].extend(events.records)
                self._dropped[tag] += events.dropped

    def take(self, tag: str) -> TaskEvents:
        with self._lock:
            t = TaskEvents(tag, self._pending.pop(tag, []))
            t.dropped = self._dropped.pop(tag, 0)
        t.pids = {r.pid for r in t.records}
        t.sort()
        return t


def _forward_signals(proc: subprocess.Popen) -> dict[int, object]:
    """While the child runs, signals we receive are the child's (like a shell would)."""
    previous = {}

    def forward(signum, _frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            previous[s] = signal.signal(s, forward)
    return previous


def run_traced(argv: list[str], session_dir: Path | None, tag: str | None,
               cwd: Path | None = None) -> int:
    """Run argv (traced when session_dir is given) and return its status the way
    subprocess does: >= 0 exit code, < 0 the signal that killed it."""
    env = tracer.preload_env(session_dir, tag=tag) if session_dir else dict(os.environ)
    proc = subprocess.Popen(argv, env=env, cwd=cwd)
    previous = _forward_signals(proc)
    try:
        return proc.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
