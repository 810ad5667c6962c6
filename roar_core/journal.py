"""Task journals: long-lived workers say which tasks they began and ended; another process
records them.

A worker that runs thousands of short tasks can afford neither a store round trip when a
task begins (the START row and its fsynced event cost ~1 ms) nor a recorder thread beside
its tasks (in CPython the two take turns on the GIL: measured, a task's thread then waits
milliseconds each time it comes back from I/O).  So such a worker only appends a line to
its journal when a task begins and when it ends -- one write(2) into the page cache, which
outlives a SIGKILL like the tracer's own log -- and a `Follower` in a separate process
(one per directory, e.g. per node) reads the journals and the tracer logs next to them
and records each task: START when it begins, the lineage when it ends.  When a worker
dies, the follower records what it left: ended tasks as they ended, the others as ABORT
(or, for a `lifetime` task such as an actor, with the caller's `lifetime_status`), each
with the lineage its tracer logs hold.  `recover` does the dead-process part alone, for a
process that finds no follower running.

One file per worker process, `tasks-<pid>-<starttime>.jsonl` next to its tracer logs (the
start time, from /proc, tells a dead process from a later one that got the same pid):

    {"v": 1, "pid": 123, "start": 456, "host": "node-1",         first line, by the worker
     "common": {...}}                                            (fields all its tasks share)
    {"b": {...TaskMeta...}, "lifetime": false}                  a task began   (worker)
    {"e": "<run id>", "s": "COMPLETE", "t": "<iso>", ...}        it ended       (worker)
    {"started": "<run id>"}                                      START recorded (follower)
    {"r": "<run id>"}                                            recorded       (follower)

Every line is one O_APPEND write, so the two writers never interleave.  Custom run facets
and declared files are not journaled: a journaled task has neither.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roar_core.attribution import UNATTRIBUTED
from roar_core.store_records import StoreError

if TYPE_CHECKING:  # the writing side stays light: workers import only this module
    from roar_core.api import Roar
    from roar_core.capture import Capture
    from roar_core.recorder import EndedTask, RecordedTask, TaskMeta, TaskOutcome

log = logging.getLogger(__name__)

VERSION = 1
PREFIX = "tasks-"
SUFFIX = ".jsonl"
_META_FIELDS = ("run_id", "engine", "namespace", "job_name", "engine_task_id", "attempt",
                "parent_run_id", "command", "host", "pid", "node_id", "traced",
                "untraced_reason")
_OPEN_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC


def process_start(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 where /proc cannot say)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # The command name (field 2) may hold spaces and parentheses: split after it.
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def process_alive(pid: int, start: int) -> bool:
    """Is the process that wrote a journal still running (on this host)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not start or process_start(pid) in (0, start)


def _meta_to_json(meta: TaskMeta) -> dict:
    d = {f: getattr(meta, f) for f in _META_FIELDS}
    d["started_at"] = meta.started_at.isoformat()
    d["workflow"] = asdict(meta.workflow) if meta.workflow else None
    d["engine_version"] = asdict(meta.engine_version) if meta.engine_version else None
    return d


def _meta_from_json(d: dict) -> TaskMeta:
    from roar_core import emission
    from roar_core.recorder import TaskMeta

    wf, eng = d.get("workflow"), d.get("engine_version")
    return TaskMeta(
        **{f: d.get(f) for f in _META_FIELDS},
        started_at=datetime.fromisoformat(d["started_at"]),
        workflow=emission.RunRef(**wf) if wf else None,
        engine_version=emission.Engine(**eng) if eng else None,
    )


def _append(fd: int, entry: dict) -> None:
    line = json.dumps(entry, separators=(",", ":"), default=str) + "\n"
    os.write(fd, line.encode("utf-8", "surrogateescape"))


class Journal:
    """This process's journal (thread-safe: every line is a single O_APPEND write)."""

    def __init__(self, directory: str | os.PathLike, common: dict[str, Any] | None = None):
        """`common`: journal-form TaskMeta fields shared by every task of this process,
        written once (a task's own fields win)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.pid = os.getpid()
        self.start = process_start(self.pid)
        self.path = directory / f"{PREFIX}{self.pid}-{self.start}{SUFFIX}"
        self._fd = os.open(self.path, _OPEN_APPEND | os.O_CREAT, 0o644)
        self._failed = False
        self._write({"v": VERSION, "pid": self.pid, "start": self.start,
                     "host": socket.gethostname(), "common": common or {}})

    def _write(self, entry: dict) -> None:
        try:
            _append(self._fd, entry)
        except OSError as e:  # lineage must never fail the task; say it once
            if not self._failed:
                self._failed = True
                log.warning("roar: cannot write the task journal %s: %s (tasks are not "
                            "recorded)", self.path, e)

    def begun(self, meta: TaskMeta | dict[str, Any], lifetime: bool = False) -> None:
        """`meta`: a TaskMeta, or its journal form (a dict of TaskMeta's journaled fields,
        `started_at` as ISO-8601, `workflow` and `engine_version` as dicts) for writers
        that do not want to import the recording side."""
        fields = meta if isinstance(meta, dict) else _meta_to_json(meta)
        self._write({"b": fields, "lifetime": lifetime})

    def ended(self, run_id: str, status: str, *, error: str | None = None,
              exit_code: int | None = None, ended_at: datetime | None = None,
              captured: dict[str, Any] | None = None) -> None:
        """`captured`: the task's versions as it ended (`capture.to_dict`), taken by the
        writer; without them the recorder takes them when it records the task."""
        ended_at = ended_at or datetime.now(timezone.utc)
        entry = {"e": run_id, "s": status, "t": ended_at.isoformat(), "x": exit_code,
                 "m": error}
        if captured is not None:
            entry["c"] = captured
        self._write(entry)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass
class Entry:
    """One task as a journal tells it."""

    meta: TaskMeta
    lifetime: bool = False
    outcome: TaskOutcome | None = None  # None: not ended (yet)
    started: bool = False  # START recorded
    recorded: bool = False
    captured: dict[str, Any] | None = None  # its versions, taken as it ended


@dataclass
class JournalFile:
    """A journal as read so far (`read_more` picks up what was appended since)."""

    path: Path
    pid: int
    start: int
    host: str
    entries: dict[str, Entry] = field(default_factory=dict)  # by run id, in begin order
    common: dict[str, Any] = field(default_factory=dict)
    _offset: int = 0

    @classmethod
    def open(cls, path: str | os.PathLike) -> JournalFile | None:
        """None while the header line is not complete (or not a journal)."""
        path = Path(path)
        try:
            with open(path, "rb") as f:
                first = f.readline()
        except OSError:
            return None
        if not first.endswith(b"\n"):
            return None
        try:
            head = json.loads(first)
            j = cls(path, int(head["pid"]), int(head["start"]), str(head["host"]),
                    common=dict(head.get("common") or {}))
        except (ValueError, KeyError, TypeError):
            log.warning("roar: %s is not a task journal", path)
            return None
        j._offset = len(first)
        j.read_more()
        return j

    def read_more(self) -> list[Entry]:
        """Apply the complete lines appended since the last read; returns tasks begun."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line not complete yet waits for the next read
        self._offset += end
        begun = []
        for raw in data[:end].splitlines():
            try:
                d = json.loads(raw)
                if "b" in d:
                    meta = _meta_from_json({**self.common, **d["b"]})
                    entry = self.entries[meta.run_id] = Entry(meta, bool(d.get("lifetime")))
                    begun.append(entry)
                elif "e" in d and d["e"] in self.entries:
                    from roar_core.recorder import TaskOutcome

                    entry = self.entries[d["e"]]
                    entry.outcome = TaskOutcome(
                        d["s"], datetime.fromisoformat(d["t"]), d.get("x"), d.get("m"))
                    entry.captured = d.get("c")
                elif "started" in d and d["started"] in self.entries:
                    self.entries[d["started"]].started = True
                elif "r" in d and d["r"] in self.entries:
                    self.entries[d["r"]].recorded = True
            except (ValueError, KeyError, TypeError) as e:
                log.warning("roar: skipping a bad line of %s: %s", self.path, e)
        return begun

    def unrecorded(self) -> list[Entry]:
        return [e for e in self.entries.values() if not e.recorded]

    def ended_unrecorded(self) -> int:
        """Tasks that ended and wait for the recorder (what a drain waits for)."""
        return sum(1 for e in self.entries.values() if e.outcome and not e.recorded)

    def alive(self) -> bool:
        return process_alive(self.pid, self.start)


def journal_paths(directory: str | os.PathLike) -> list[Path]:
    return sorted(Path(directory).glob(f"{PREFIX}*{SUFFIX}"))


def journals(directory: str | os.PathLike) -> list[JournalFile]:
    """Every readable journal in a directory."""
    return [j for p in journal_paths(directory) if (j := JournalFile.open(p)) is not None]


def _died(j: JournalFile, entry: Entry, lifetime_status: str) -> TaskOutcome:
    from roar_core.recorder import TaskOutcome, now

    status = lifetime_status if entry.lifetime else "ABORT"
    outcome = TaskOutcome(status, now())
    if status != "COMPLETE":
        outcome.error = (f"its process ({j.host} pid {j.pid}) died while it ran; "
                         "lineage up to then")
    return outcome


class CausalOrder:
    """Keeps a workflow run's recorders on several nodes (one store) in causal order: a
    consumer's events never go out before those of the producer of its input, recorded
    on another node.

    The producer ended before the consumer began.  Each recorder publishes its mark
    (`advance`): every task of its own that ended before it is recorded and its events
    delivered.  A recorder records a task once every other live recorder's mark has
    passed the task's start (`horizon`).  A recorder that stopped saying it is alive
    (`stale_s`) is no longer waited for, and no task waits longer than `hold_max_s`.
    Assumes the nodes' clocks agree to better than the time between a producer's end and
    its consumer's start."""

    def __init__(self, store, workflow_run_id: str, me: str, *, stale_s: float = 10.0,
                 hold_max_s: float = 10.0):
        self.store, self.workflow_run_id, self.me = store, workflow_run_id, me
        self.stale_s, self.hold_max_s = stale_s, hold_max_s
        self._failed = False  # said once; the others stop waiting for us after stale_s

    def advance(self, mark: datetime, done: bool = False) -> None:
        try:
            self.store.set_recorder_mark(self.workflow_run_id, self.me, mark, done)
        except Exception as e:
            self._fail(e)

    def horizon(self) -> datetime | None:
        """The others' earliest mark (None: no other live recorder)."""
        try:
            marks = self.store.recorder_marks(self.workflow_run_id)
        except Exception as e:
            self._fail(e)
            return None
        now = datetime.now(timezone.utc)
        live = [m.mark for m in marks if m.recorder != self.me and not m.done
                and (now - m.alive_at).total_seconds() < self.stale_s]
        return min(live, default=None)

    def _fail(self, e: Exception) -> None:
        if not self._failed:
            self._failed = True
            log.warning("roar: recorders of other nodes not kept in order: %s", e)


class Follower:
    """Records the tasks that other processes journal in `directory`, from this process.

    `poll()` does one pass: START for tasks begun since the last pass, the lineage of tasks
    that ended, and everything a dead process left (then its journal is removed).  Run one
    follower per directory (the caller holds a lock); journals of other hosts are skipped.
    `lifetime_status()` says how a `lifetime` task ends when its process dies with it open.
    """

    def __init__(self, roar: Roar, directory: str | os.PathLike, *,
                 lifetime_status: Callable[[], str] = lambda: "ABORT",
                 alive: Callable[[int, int], bool] = process_alive,
                 sync_every: float = 0.0, order: CausalOrder | None = None):
        """`sync_every`: while passes keep finding tasks, sync the spool at most this often
        (seconds; 0: after every pass).  An idle pass, and `sync()`, sync at once.
        `order`: other recorders of the same workflow run (other nodes) to keep behind."""
        self.roar = roar
        self.order = order
        # The earliest end among the tasks the last pass held back for `order` (None:
        # none): this recorder's own mark must not pass it.
        self.held_from: datetime | None = None
        self._horizon = datetime.min.replace(tzinfo=timezone.utc)  # the others' mark, seen
        self.directory = Path(directory)
        self.lifetime_status = lifetime_status
        self._alive = alive
        self.sync_every = sync_every
        self._host = socket.gethostname()
        self._files: dict[Path, _Followed] = {}
        self._foreign: set[Path] = set()
        # Since the last sync: the spool's open batch, and the journals whose marks wait
        # on it (a task is marked recorded only once its events are durable).
        self._window: ExitStack | None = None
        self._window_since = 0.0
        self._unsynced: dict[Path, _Followed] = {}

    def poll(self) -> int:
        """One pass; returns how many tasks it recorded (lineage, not STARTs).  Everything
        journaled before the pass began is recorded when it returns (durable and marked in
        the journals at the next sync)."""
        if self._window is None:
            self._window = ExitStack()
            if self.roar.spool is not None:  # one fsync of the spool per window
                self._window.enter_context(self.roar.spool.batch())
            self._window_since = time.monotonic()
        followed: list[_Followed] = []
        done = 0
        try:
            done = self._pass(followed)
        finally:
            for f in followed:
                self._unsynced[f.journal.path] = f
            if not done or time.monotonic() - self._window_since >= self.sync_every:
                self.sync()
        return done

    def sync(self) -> None:
        """Make what the passes since the last sync spooled durable, then mark it."""
        window, self._window = self._window, None
        if window is not None:
            window.close()
        unsynced, self._unsynced = list(self._unsynced.values()), {}
        for f in unsynced:
            f.flush_marks()
        for f in unsynced:
            if f.done and self._files.get(f.journal.path) is f:
                self._forget(f)

    def _pass(self, followed: list[_Followed]) -> int:
        ready: list[tuple[_Followed, Entry, TaskOutcome]] = []
        for path in journal_paths(self.directory):
            if path in self._foreign:
                continue
            f = self._files.get(path)
            if f is None:
                j = JournalFile.open(path)
                if j is None:
                    continue
                if j.host != self._host:
                    self._foreign.add(path)
                    continue
                f = self._files[path] = _Followed(j, self.directory)
                begun = [e for e in j.entries.values() if not e.started]
            else:
                begun = []
            followed.append(f)
            self._advance(f, begun)
        # Causal order: a task that read another's output ended after it.  The end lines
        # read above may include a consumer's whose producer's line (in another journal,
        # read earlier) was appended meanwhile: read every journal once more, then record
        # all ended tasks of the node in the order they ended, so no COMPLETE is spooled
        # before its inputs' producers'.
        for f in followed:
            ready += self._ready(f, f.journal.read_more())
        return self._record_in_order(ready)

    def _record_in_order(self, ready: list[tuple[_Followed, Entry, TaskOutcome]]) -> int:
        from roar_core.recorder import EndedTask

        ordered = sorted(ready, key=lambda r: r[2].ended_at)
        self.held_from = None
        if self.order is not None and ordered:
            ordered = self._hold(ordered)
        tasks = []
        for f, entry, outcome in ordered:
            t = f.collector.take(entry.meta.run_id)
            outcome.dropped += t.dropped
            tasks.append((f, entry, EndedTask(entry.meta, outcome, t.records,
                                              start=not entry.started)))
        if len(tasks) > 1:  # one commit for all
            try:
                for _, entry, task in tasks:
                    task.captured = self._captured(entry, task)
                recorded = self.roar.recorder.record_many([task for _, _, task in tasks])
            except Exception as e:  # nothing of them stored: one by one, to lose none
                log.info("roar: %d tasks not recorded at once (%s); one by one",
                         len(tasks), e)
            else:
                for f, entry, _ in tasks:
                    self._recorded(f, entry)
                return len(recorded)
        return sum(self._record(f, entry, task) is not None for f, entry, task in tasks)

    def _hold(self, ordered: list[tuple[_Followed, Entry, TaskOutcome]]) -> list[
            tuple[_Followed, Entry, TaskOutcome]]:
        """The tasks to record now: not those that began after the other recorders' mark
        (one of them may yet record a producer of their inputs, which ended before they
        began), unless held for `order.hold_max_s` already."""
        assert self.order is not None
        latest = max(entry.meta.started_at for _, entry, _ in ordered)
        # The others' mark only grows: below the one last seen, nothing is held.
        horizon = self.order.horizon() if latest > self._horizon else None
        if horizon is None:
            return ordered
        self._horizon = horizon
        now = datetime.now(timezone.utc)
        keep = []
        for f, entry, outcome in ordered:
            if entry.meta.started_at > horizon and self._unproduced_input(entry) and (
                    now - outcome.ended_at).total_seconds() < self.order.hold_max_s:
                f.done = False  # its journal stays: the task is recorded by a later pass
                if self.held_from is None:
                    self.held_from = outcome.ended_at
                continue
            keep.append((f, entry, outcome))
        return keep

    def _unproduced_input(self, entry: Entry) -> bool:
        """Did the task read content whose producer is not in the store (yet)?  Only
        such a task can be a consumer recorded before its producer; one that read nothing,
        or only recorded outputs, never waits."""
        if entry.captured is None:
            return True  # what it read is unknown yet: as if it read such content
        from roar_core.capture import input_digests

        start = entry.meta.started_at
        return any(self.roar.store.producer_of(d, started_by=start) is None
                   for d in input_digests(entry.captured))

    def pending(self) -> int:
        """Journals still followed (their processes alive, or not all recorded yet)."""
        return len(self._files)

    def _advance(self, f: _Followed, begun: list[Entry]) -> None:
        j = f.journal
        f.dead = not self._alive(j.pid, j.start)  # before reading: no line can come later
        begun += j.read_more()
        for entry in begun:
            if not entry.started and entry.outcome is None:
                self._start(f, entry)

    def _ready(self, f: _Followed, begun: list[Entry]) -> list[
            tuple[_Followed, Entry, TaskOutcome]]:
        """The tasks of `f` to record now, with their outcomes; STARTs of `begun` that
        have not ended first (an ended task's START goes in with its end: one commit)."""
        j = f.journal
        for entry in begun:
            if not entry.started and entry.outcome is None:
                self._start(f, entry)
        ready = j.unrecorded() if f.dead else [e for e in j.entries.values()
                                              if e.outcome is not None and not e.recorded]
        if ready:
            f.collector.collect()
            f.collector.take(UNATTRIBUTED)  # I/O outside any task: never lineage
        f.done = f.dead  # all it left is recorded once this pass ends: the journal can go
        return [(f, e, e.outcome or _died(j, e, self.lifetime_status())) for e in ready]

    def _forget(self, f: _Followed) -> None:
        f.close()
        del self._files[f.journal.path]
        for path in [f.journal.path, *f.collector.owned()]:
            try:
                path.unlink()
            except OSError:
                pass

    def _start(self, f: _Followed, entry: Entry) -> None:
        try:
            self.roar.recorder.started(entry.meta)
        except Exception as e:  # e.g. a restarted follower: the row is there already
            if self.roar.store.task_run(entry.meta.run_id) is None:
                log.error("roar: START of task %s (%s) lost: %s", entry.meta.job_name,
                          entry.meta.run_id, e)
        entry.started = True
        f.mark({"started": entry.meta.run_id})

    def _record(self, f: _Followed, entry: Entry, task: EndedTask) -> RecordedTask | None:
        result = None
        try:
            task.captured = self._captured(entry, task)
            try:
                result = self.roar.recorder.record(task.meta, task.outcome, task.records,
                                                   captured=task.captured, start=task.start)
            except StoreError:
                # Its START may be stored already: by a follower that died before marking
                # it in the journal.  Else the error stands.
                if entry.started or self.roar.store.task_run(entry.meta.run_id) is None:
                    raise
                result = self.roar.recorder.record(task.meta, task.outcome, task.records,
                                                   captured=task.captured)
        except Exception as e:  # lineage of one task lost, never the follower
            if not entry.started:
                self._start(f, entry)  # its START at least, as a task that began
            log.error("roar: lineage of task %s (%s) lost: %s", entry.meta.job_name,
                      entry.meta.run_id, e)
        self._recorded(f, entry)
        return result

    def _captured(self, entry: Entry, task: EndedTask) -> Capture:
        """Taken by the worker as the task ended; else (it died first) taken now."""
        if entry.captured is None:
            return self.roar.recorder.capture_late(task.meta, task.outcome, task.records)
        from roar_core.capture import from_dict

        return from_dict(entry.captured)

    def _recorded(self, f: _Followed, entry: Entry) -> None:
        entry.started = entry.recorded = True
        f.mark({"r": entry.meta.run_id})
        del f.journal.entries[entry.meta.run_id]  # a long-lived worker runs many tasks


class _Followed:
    def __init__(self, journal: JournalFile, directory: Path):
        from roar_core.session import SessionCollector

        self.journal = journal
        self.collector = SessionCollector(directory, root_pid=journal.pid)
        self.dead = False  # its process had exited when this pass began reading it
        self.done = False
        self._marks: list[dict] = []
        self._fd = -1

    def mark(self, entry: dict) -> None:
        self._marks.append(entry)

    def flush_marks(self) -> None:
        marks, self._marks = self._marks, []
        if not marks or self.done:
            return
        try:
            if self._fd < 0:
                self._fd = os.open(self.journal.path, _OPEN_APPEND)
            lines = "".join(json.dumps(m, separators=(",", ":")) + "\n" for m in marks)
            os.write(self._fd, lines.encode())  # one O_APPEND write: never interleaved
        except OSError:
            pass  # the journal is gone: nothing left to mark

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def recover(roar: Roar, directory: str | os.PathLike, *,
            lifetime_status: str = "ABORT") -> int:
    """Record what the dead processes of `directory` left unrecorded, without a follower
    (the caller makes sure none runs on this directory); returns how many tasks.  Journals
    of live processes and of other hosts are left alone."""
    follower = Follower(roar, directory, lifetime_status=lambda: lifetime_status)
    done = 0
    for path in journal_paths(directory):
        j = JournalFile.open(path)
        if j is None or j.host != follower._host or j.alive():
            continue
        f = follower._files[path] = _Followed(j, follower.directory)
        follower._advance(f, [e for e in j.entries.values() if not e.started])
        done += follower._record_in_order(follower._ready(f, []))
        follower._forget(f)
    return done
