"""The recorder's reading side: follows the task logs of one directory and records each
task exactly once -- START when it begins, its lineage when it ends, and what a dead or
closed producer left open as ABORT (or, for a `lifetime` task such as an actor, with the
caller's `lifetime_status`), each with the lineage the tracer logs hold.  A task is marked
recorded in its log only once its events are durable in the spool, so a recorder that dies
mid-pass is resumed by the next one from those marks: a task it had stored already is
spooled from the store's record of it, never stored twice.  A spool that refuses events
(a full disk) leaves the tasks stored and unmarked, their events kept, staged and offered
again, in order, until it takes them.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Collection
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import TYPE_CHECKING, NamedTuple

from roar_core.config import clean_path
from roar_core.heap import gc_paused
from roar_core.ids import host_name
from roar_core.pipeline.attribution import UNATTRIBUTED
from roar_core.pipeline.spoolfiles import NotSynced, write_all
from roar_core.pipeline.store_records import StoreError
from roar_core.pipeline.tracelog import LogListing
from roar_core.recording.sessions import SessionCollector, WholeSession, summarized
from roar_core.recording.tasklog import (
    SHORT_ANSWER,
    SUFFIX,
    WAIT_PREFIX,
    Entry,
    Given,
    TaskLogFile,
    log_paths,
    poke,
    process_alive,
)

if TYPE_CHECKING:
    from roar_core.api import Roar
    from roar_core.pipeline.capture import Capture
    from roar_core.pipeline.writer import EndedTask, RecordedTask, TaskOutcome

log = logging.getLogger(__name__)
_OPEN_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
# How long, and how many, tasks answered ahead of their recording wait for it
# (`_answered_ahead`): each adds a task log to every pass until then.
ANSWER_AHEAD_S = 1.0
ANSWER_AHEAD_MAX = 8
RETRY_S = 5.0  # a task that could not be recorded is tried again after this, doubling
RETRY_MAX_S = 300.0
# Events the spool refused are offered again after this, doubling (up to RETRY_MAX_S): a
# failed offer costs a failed open, and the tasks' events wait for nothing else.
RESPOOL_S = 1.0
# Tasks' events between the store's commit and the spool's sync: a recorder killed in
# between leaves them for the next one to send (storing the task again would fail, and a
# task stored without its events would never be sent).
STAGED = "recorder.staged"


def _died(j: TaskLogFile, entry: Entry, lifetime_status: str) -> TaskOutcome:
    from roar_core.pipeline.writer import TaskOutcome, now

    status = lifetime_status if entry.lifetime else "ABORT"
    outcome = TaskOutcome(status, now())
    if status != "COMPLETE":
        outcome.error = ("never ended: its producer closed its log (the engine went away)"
                         if j.closed else f"its process ({j.host} pid {j.pid}) died while "
                         "it ran; lineage up to then")
    return outcome


def result_of(r: RecordedTask, short: bool = False) -> dict:
    """What a waiting producer is told of a recorded task (tasklog.Result reads it).
    `short`: the first SHORT_ANSWER inputs, outputs and deleted files, and how many of
    each there are (5,000 files each way made and read back only to show five)."""
    from roar_core.pipeline.writer import task_info

    # Not `lineage_of`: its run facets (the machine's and environment's provenance, ~0.1 s
    # the first time in a process) are not part of the answer.
    meta = r.meta
    task = task_info(meta, r.outcome.dropped)
    inputs, outputs, counts = r.inputs, r.outputs, None
    if short:
        kept = [d for d in outputs if d.lifecycle != "DROP"]
        deleted = [d for d in outputs if d.lifecycle == "DROP"]
        counts = {"inputs": len(inputs), "outputs": len(kept), "deleted": len(deleted)}
        inputs, outputs = inputs[:SHORT_ANSWER], kept[:SHORT_ANSWER] + deleted[:SHORT_ANSWER]
    answer = {"ok": True, "status": r.outcome.status, "error": None,
              "run_id": r.meta.run_id, "job_name": r.meta.job_name, "traced": r.meta.traced,
              "untraced_reason": r.meta.untraced_reason, "dropped": r.outcome.dropped,
              "inputs": [_plain(d) for d in inputs], "outputs": [_plain(d) for d in outputs],
              "task": _fields(task), "io": _fields(meta.io_check) if meta.io_check else None}
    if counts is not None:
        answer["counts"] = counts
    return answer


def _fields(x) -> dict:
    """A flat dataclass of plain values and lists of them (TaskInfo, IOCheck) as
    `dataclasses.asdict` gives it: 0.4 us where asdict's deep copy took 13 (both, a task)."""
    return {k: list(v) if isinstance(v, list) else v for k, v in vars(x).items()}


def _plain(d) -> dict:
    """A Dataset as JSON-ready fields (asdict's deep copy took 40 ms for 5,000 files)."""
    return {**vars(d), "symlinks": [list(s) for s in d.symlinks]}


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
    """Records the tasks that other processes log in `directory`, from this process.

    `poll()` does one pass: START for tasks begun since the last pass, the lineage of tasks
    that ended, and everything a dead process left (then its task log is removed).  Run one
    follower per directory (the caller holds a lock); task logs of other hosts are skipped.
    `lifetime_status()` says how a `lifetime` task ends when its process dies with it open.
    """

    def __init__(self, roar: Roar, directory: str | os.PathLike, *,
                 lifetime_status: Callable[[], str] = lambda: "ABORT",
                 alive: Callable[[int, int, int | None], bool] = process_alive,
                 sync_every: float = 0.0, order: CausalOrder | None = None,
                 hold_start_s: float = 0.0, given: dict[str, Given] | None = None):
        """`sync_every`: while passes keep finding tasks, sync the spool at most this often
        (seconds; 0: after every pass).  An idle pass, and `sync()`, sync at once.
        `order`: other recorders of the same workflow run (other nodes) to keep behind.
        `hold_start_s`: how long a task's START may wait to go in with its end.  `given`:
        run id -> a task's own session and its capture, as its producer in this process
        read and took them."""
        self.roar = roar
        self.given = dict(given or {})
        self.hold_start_s = hold_start_s
        self.order = order
        # The earliest end among the tasks the last pass held back for `order` (None:
        # none): this recorder's own mark must not pass it.
        self.held_from: datetime | None = None
        self._horizon = datetime.min.replace(tzinfo=timezone.utc)  # the others' mark, seen
        self.directory = clean_path(os.fspath(directory))  # as its collectors spell it
        self.lifetime_status = lifetime_status
        self._alive = alive
        self.sync_every = sync_every
        self._host = host_name()  # (the name its task logs carry)
        self._files: dict[str, _Followed] = {}
        self._foreign: set[str] = set()
        # Since the last sync: the spool's open batch, and the task logs whose marks wait
        # on it (a task is marked recorded only once its events are durable).
        self._window: ExitStack | None = None
        self._window_since = 0.0
        self._unsynced: dict[str, _Followed] = {}
        self._urgent = False  # a producer waits for a task of this window
        self._workflow_rows: set[str] = set()  # workflow runs known to be in the store
        # Workflow runs whose start the store refused -> when to try again.
        self._refused_starts: dict[str, float] = {}
        # The tracer logs, listed once a pass and their headers read once, for all the
        # producers' collectors.
        self._listing = LogListing(self.directory)
        # Logs made after this moment were never seen by a recorder before us (it held the
        # directory's lock until it died, and we hold it now).
        self._born_mono = time.monotonic_ns()
        self._unopened = 0  # logs listed whose header was not complete yet
        self._staged_fd = -1
        # Run id -> events a killed recorder staged; the runs (tasks, workflow runs) whose
        # start it had stored with its START maybe not spooled.
        self._restaged, self._staged_starts = self._read_staged()
        # Tasks of this pass whose producers asked for an early answer (`_answer_early`),
        # and those whose producers wait for them to be stored (`_answer_stored`).
        self._early: dict[str, tuple[_Followed, Entry]] = {}
        self._waiting: dict[str, tuple[_Followed, Entry]] = {}
        self._answered_now: set[str] = set()  # run ids `_answer_first` answered this pass
        # Stored tasks' events the spool has not taken yet, in the order they were made
        # (`_keep_unspooled`): while any is kept, no later event is offered before it.
        self._unspooled: list[_Unspooled] = []
        self._respool_at = 0.0
        self._respool_failures = 0
        self._not_synced = False  # the last sync failed (`sync`)
        # What was staged since the last sync that succeeded: staged again where one fails
        # (`_unstage` cleared it once it was written to the spool, which a kill keeps and a
        # disk's write error may not).
        self._staged_window: list[list[bytes]] = []

    def poll(self, hinted: Collection[str] = ()) -> int:
        """One pass; returns how many tasks it recorded (lineage, not STARTs).  Everything
        logged before the pass began is recorded when it returns (durable and marked in
        the task logs at the next sync).  `hinted`: names of task logs whose producers
        woke us for an early answer (`drain_fifo`): answered first."""
        if self._window is None:
            self._open_window()
        followed: list[_Followed] = []
        done = 0
        try:
            # The whole pass, not only each task's recording: reading a big task's end
            # line and rebuilding its capture allocate ~20 objects per file, which survive
            # until the task is stored, and the collections they set off walked them again
            # and again (a 5,000-file task's pass: ~6 % of it).
            with gc_paused():
                done = self._pass(followed, hinted)
            self._restaged.clear()  # the first pass took what it could
        finally:
            for f in followed:
                self._unsynced[f.tasklog.path] = f
            if (not done or self._urgent
                    or time.monotonic() - self._window_since >= self.sync_every):
                self.sync()
        return done

    def retry_now(self) -> None:
        """Tasks whose recording failed are tried again by the next pass, not after their
        pause: someone waits for everything to be recorded (`recorder.wait_recorded`).
        The store is opened afresh for them: what failed them may have been mended."""
        failed = [e for f in self._files.values() for e in f.tasklog.entries.values()
                  if e.failures]
        for e in failed:
            e.retry_at = 0.0
        if failed:
            self.roar.store.reconnect()

    def _open_window(self) -> None:
        """What is spooled until the next `sync` is made durable there, once."""
        self._window = ExitStack()
        if self.roar.spool is not None:
            self._window.enter_context(self.roar.spool.batch(strict=True))
        self._window_since = time.monotonic()

    def forget_rows(self) -> None:
        """The store may have changed (new settings): look for workflow rows again."""
        self._workflow_rows.clear()

    def _read_staged(self) -> tuple[dict[str, list | None], set[str]]:
        """Run id -> the events a killed recorder staged for it; None: it was to make them
        after its commit (the last line of a run id is what it got to).  And the runs
        whose start it staged (`_stage_start`)."""
        try:
            with open(os.path.join(self.directory, STAGED), "rb") as f:
                data = f.read()
        except OSError:
            return {}, set()
        import orjson

        staged, starts = {}, set()
        for raw in data.splitlines(keepends=True):
            if not raw.endswith(b"\n"):
                break  # cut short by a kill: its tasks were not committed
            try:
                d = orjson.loads(raw)
                if d.get("s"):
                    starts.add(d["r"])
                else:
                    staged[d["r"]] = d["ev"]
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        return staged, starts

    def _stage_start(self, run_id: str) -> bool:
        """Before the store has a run's start (a task's, a workflow run's), until its START
        is spooled and synced: a recorder that dies meanwhile leaves its start stored and
        unmarked, and the next one cannot tell from those whether the START went out.
        False where it cannot be staged (said why)."""
        if self.roar.spool is None:
            return True
        import orjson

        try:
            self._write_staged([b'{"r":', orjson.dumps(run_id), b',"s":1}\n'])
        except OSError as e:
            log.warning("roar: cannot stage the start of run %s: %s", run_id, e)
            return False
        return True

    def _stage(self, tasks: list[tuple[str, list[bytes] | None]]) -> None:
        """Keep tasks' events (encoded), before the store commits them, until the spool is
        synced (an error here fails the commit: the tasks are tried again).  None for a
        task's events: made after its commit (`LineageWriter.record`'s `stored`), so the
        next recorder makes them should this one die before it stages them."""
        if self.roar.spool is None:
            return  # no events of ours (the engine's integration sends them)
        import orjson

        # Pieces, not one concatenation (see write_all): in a recorder just forked, the
        # copies of a 5,000-file task's events were ~4,000 page faults, ~6 ms.
        parts: list[bytes] = []
        for run_id, events in tasks:
            if events is None:
                parts += (b'{"r":', orjson.dumps(run_id), b',"ev":null}\n')
                continue
            parts += (b'{"r":', orjson.dumps(run_id), b',"ev":[')
            for i, event in enumerate(events):
                if i:
                    parts.append(b",")
                parts.append(event)
            parts.append(b"]}\n")
        self._write_staged(parts)

    def _write_staged(self, parts: list[bytes]) -> None:
        self._open_staged()
        write_all(self._staged_fd, parts)
        self._staged_window.append(parts)

    def _restage(self) -> None:
        """Stage again what was staged since the last good sync: its events may be gone from
        the spool's disk, and a recorder that dies before a sync succeeds leaves them to the
        next one (sent twice where the disk kept them)."""
        lines = [p for parts in self._staged_window for p in parts]
        if not lines:
            return
        try:
            self._open_staged()
            write_all(self._staged_fd, lines)
        except OSError as e:
            log.error("roar: cannot stage events again (%s): if this recorder dies before "
                      "the spool syncs, they may be lost", e)

    def _open_staged(self) -> None:
        if self._staged_fd < 0:
            self._staged_fd = os.open(os.path.join(self.directory, STAGED),
                                      os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                                      0o644)

    def close(self) -> None:
        """Let go of the files it holds open (call `sync` first)."""
        for f in self._files.values():
            f.close()
        self._close_staged()

    def _close_staged(self) -> None:
        if self._staged_fd >= 0:
            os.close(self._staged_fd)
            self._staged_fd = -1

    def _unstage(self) -> None:
        """The staged events are in the spool (written: a kill keeps them); not while the
        spool refuses some (`_unspooled`) or cannot sync (`sync`): a next recorder needs
        them staged."""
        if self._staged_fd >= 0 and not self._unspooled and not self._not_synced:
            try:
                os.ftruncate(self._staged_fd, 0)
            except OSError as e:  # sent again by a next recorder, at worst: not a failure
                log.debug("roar: staged events not cleared: %s", e)

    def sync(self) -> None:
        """Make what the passes since the last sync spooled durable, then mark it.  Raises
        `NotSynced` where the spool could not be made durable: then nothing is marked (nor
        unstaged, nor removed) until a later sync succeeds."""
        if self._window is None and self._not_synced:
            self._open_window()  # no pass since: its close tries the sync again
        window, self._window = self._window, None
        if window is not None:
            try:
                window.close()
            except NotSynced as e:
                if not self._not_synced:
                    log.error("roar: %s: what it holds is marked recorded once synced", e)
                    self._not_synced = True
                    self._restage()
                raise
        self._staged_window = []
        if self._not_synced:
            log.warning("roar: the OpenLineage spool is synced again")
            self._not_synced = False
        self._unstage()  # (those a killed recorder staged: sent again by the first pass)
        unsynced, self._unsynced = list(self._unsynced.values()), {}
        self._urgent = False
        for f in unsynced:
            # All it left is recorded: the log can go (one a task failed in stays, for the
            # next attempt, by us or by the next recorder).
            f.done = self._all_recorded(f)
            f.flush_marks()
        for f in unsynced:
            if f.done and self._files.get(f.tasklog.path) is f:
                self._forget(f)
        if not self._files and self._staged_fd >= 0:  # nothing left to follow
            self._close_staged()
            try:
                os.unlink(os.path.join(self.directory, STAGED))
            except OSError:
                pass

    def _pass(self, followed: list[_Followed], hinted: Collection[str] = ()) -> int:
        self._answered_now = self._answer_first(hinted) if hinted else set()
        ready: list[tuple[_Followed, Entry, TaskOutcome]] = []
        paths = log_paths(self.directory)
        self._unopened = 0
        if len(paths) < len(self._files):  # removed by someone else: nothing to follow
            listed = set(paths)
            for gone in [f for p, f in self._files.items() if p not in listed]:
                gone.close()
                del self._files[gone.tasklog.path]
        for path in paths:
            if path in self._foreign:
                continue
            f = self._files.get(path) or self._follow(path)
            if f is None or self._settled(f):
                continue
            followed.append(f)
            self._advance(f)
        # Causal order: a task that read another's output ended after it.  The end lines
        # read above may include a consumer's whose producer's line (in another task log,
        # read earlier) was appended meanwhile: read every task log once more, then record
        # all ended tasks of the node in the order they ended, so no COMPLETE is spooled
        # before its inputs' producers'.
        begun = [f.tasklog.read_more() for f in followed]
        self._listing.invalidate()  # after the end lines: the logs of those tasks exist
        for f, entries in zip(followed, begun, strict=True):
            ready += self._ready(f, entries)
        done = self._record_in_order(ready)
        for f in followed:
            self._workflows(f, starting=False)
        return done

    def _record_in_order(self, ready: list[tuple[_Followed, Entry, TaskOutcome]]) -> int:
        from roar_core.pipeline.writer import EndedTask

        # Tasks whose events are kept are stored: offered again, never recorded again.
        kept = {u.entry.meta.run_id for u in self._unspooled if u.answer is not None
                and u.entry is not None}
        self._respool()
        ordered = sorted((r for r in ready if r[1].meta.run_id not in kept),
                         key=lambda r: r[2].ended_at)
        self.held_from = None
        if self.order is not None and ordered:
            ordered = self._hold(ordered)
        tasks = []
        inherited = [e.meta.run_id for f, e, _ in ordered if e.meta.run_id in f.inherited]
        stored = self.roar.store.task_statuses(inherited) if inherited else {}
        for f, entry, outcome in ordered:
            if self._recorded_before(f, entry, outcome, stored):
                continue
            try:
                self._ensure_workflow(entry.meta)
            except Exception as e:  # its task is recorded anyway (the store says why not)
                log.error("roar: workflow run of task %s not stored: %s", entry.meta.job_name, e)
            self._take_records(f, entry, outcome)
            tasks.append((f, entry, EndedTask(entry.meta, outcome, entry.records,
                                              start=not entry.started)))
        if self._answered_ahead(tasks):
            return 0
        self._early = {e.meta.run_id: (f, e) for f, e, _ in tasks
                       if e.waited and e.early and not e.answered}
        self._waiting = {e.meta.run_id: (f, e) for f, e, _ in tasks
                         if e.waited and not e.early and not e.answered}
        if len(tasks) > 1:  # one commit for all
            try:
                with self.roar.writer.cache_held():
                    for _, entry, task in tasks:
                        task.captured = self._captured(entry, task)
                # (Without producers waiting for early answers, no answer is made: a big
                # task's output datasets are then made while its rows are written.)
                recorded = self.roar.writer.record_many(
                    [task for _, _, task in tasks], before_commit=self._stage,
                    answer=self._answer_early if self._early else None,
                    stored=self._answer_stored if self._waiting else None,
                    hold=bool(self._unspooled))
            except Exception as e:  # nothing of them stored: one by one, to lose none
                log.info("roar: %d tasks not recorded at once (%s); one by one",
                         len(tasks), e)
            else:
                for (f, entry, _), r in zip(tasks, recorded, strict=True):
                    self._stored(f, entry, r)
                self._unstage()
                return len(recorded)
        return sum(self._record(f, entry, task) is not None for f, entry, task in tasks)

    def _follow(self, path: str) -> _Followed | None:
        """Start following a task log (None: its header is not complete yet, or it is
        another host's)."""
        j = TaskLogFile.open(path, hold=True)
        if j is None:
            self._unopened += 1
            return None
        if j.host != self._host:
            j.close()
            self._foreign.add(path)
            return None
        f = self._files[path] = _Followed(j, self.directory, self._listing)
        if j.mono is not None and j.mono > self._born_mono:
            f.inherited.clear()
        f.begun = [e for e in j.entries.values() if not e.started]
        return f

    def _take_records(self, f: _Followed, entry: Entry, outcome: TaskOutcome) -> None:
        """The task's tracer records, taken once (a retry records the same)."""
        if entry.records is not None:
            return
        given = self.given.pop(entry.meta.run_id, None)
        read = given and given.session
        if given is not None and entry.captured is not None:
            entry.taken = given.capture  # as it is, not from its JSON
        elif entry.captured is not None and entry.read is not None and \
                entry.own_dir and entry.shadow is None:
            # Its versions came with its end: its records are not needed, only what its
            # producer's read of them found.
            read = summarized(entry.read)
        entry.records, entry.dropped = f.events(entry, read)
        outcome.dropped += entry.dropped

    def _answer_first(self, hinted: Collection[str]) -> set[str]:
        """Answer the tasks of the named logs whose producers wait for an early answer,
        before the pass reads every other log and stores what ended (measured, Airflow:
        that came first and took ~1 ms of each answer's ~2 ms).  A log not followed yet is
        from now on (a task's process makes its log as the task begins: many end before
        a pass has seen it); whatever cannot be answered here is left to the pass, as if
        unnamed.  Returns the run ids answered."""
        from roar_core.pipeline.writer import EndedTask

        answered: set[str] = set()
        if self.order is not None:  # answered in the order of the node's events
            return answered
        for name in dict.fromkeys(hinted):
            path = os.path.join(self.directory, f"{name}{SUFFIX}")
            if path in self._foreign:
                continue
            f = self._files.get(path) or self._follow(path)
            if f is None:
                continue
            f.begun += f.tasklog.read_more()  # the pass looks at them (`_advance`)
            self._listing.invalidate()
            ready = [e for e in f.tasklog.entries.values()
                     if e.outcome is not None and e.waited and e.early and not e.answered
                     and not e.recorded and not e.failures]
            if not ready:
                continue
            try:
                f.collector.collect()
                f.collector.take(UNATTRIBUTED)  # I/O outside any task: never lineage
                for entry in ready:
                    self._take_records(f, entry, entry.outcome)
                    task = EndedTask(entry.meta, entry.outcome, entry.records,
                                     start=not entry.started)
                    if self._answer_ahead(f, entry, task):
                        answered.add(entry.meta.run_id)
            except Exception as e:  # the pass records it, failing as storing it fails
                log.debug("roar: early answer from %s left to the pass: %s", name, e)
        return answered

    def _recorded_before(self, f: _Followed, entry: Entry, outcome: TaskOutcome,
                         stored: dict[str, str]) -> bool:
        """Was the task recorded by a recorder that died before marking it?  Only a task
        the log held when this follower first read it can have been: the lock kept any
        other recorder out since.  Its events, staged before its commit, are spooled (again:
        they may have been), or made now where it was to make them after its commit, and
        it is marked.  `stored`: the statuses in the store of the inherited tasks at
        hand."""
        run_id = entry.meta.run_id
        if run_id not in f.inherited:
            return False
        f.inherited.discard(run_id)
        status = stored.get(run_id)
        if status is None or status == "RUNNING":
            return False
        start, entry.started = not entry.started, True
        if run_id in self._restaged and self._restaged[run_id] is None:
            self._restaged[run_id] = self._made_again(f, entry, outcome, start)
        events = self._restaged.pop(run_id, None) or []
        if events and start and run_id in self._staged_starts:
            # Its START went in apart, before its end, and may not be out.
            events = [self.roar.writer.start_event(entry.meta), *events]
        # What this recorder can say without the predecessor's answer.
        answer = {"ok": True, "status": status, "error": None, "inputs": [], "outputs": [],
                  "note": "recorded by an earlier recorder"}
        if events and self.roar.spool is not None:  # staged, maybe not spooled: sent now
            from roar_core.pipeline.emission import Event

            # (Made again here: encoded already.)
            events = [e if isinstance(e, bytes) else Event(e) for e in events]
            left = self.roar.writer.spool_events(events, hold=bool(self._unspooled))
            if left:
                self._keep_unspooled(f, entry, left, answer)
                return True
        self._recorded(f, entry, answer)
        return True

    def _made_again(self, f: _Followed, entry: Entry, outcome: TaskOutcome,
                    start: bool) -> list[bytes] | None:
        """The events of a task stored by a recorder that died before it made them,
        made as that recorder would have (`LineageWriter.stored_events`)."""
        from roar_core.pipeline.writer import EndedTask

        try:
            self._take_records(f, entry, outcome)
            captured = self._captured(entry, EndedTask(entry.meta, outcome, entry.records))
            return self.roar.writer.stored_events(entry.meta, outcome, captured, start)
        except Exception as e:  # noqa: BLE001 - it is stored: marked, with what it lost
            log.error("roar: task %s (%s) stored by a recorder that died, its events lost: "
                      "%s: %s", entry.meta.job_name, entry.meta.run_id, type(e).__name__, e)
            return None

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
        from roar_core.pipeline.capture import input_digests

        start = entry.meta.started_at
        return any(self.roar.store.producer_of(d, started_by=start) is None
                   for d in input_digests(entry.captured))

    def pending(self) -> int:
        """Logs with work to come: their producers alive, or tasks not recorded and not
        failed yet (a recorder left with only failed tasks may leave: the next one tries
        them again), logs with events kept for them, and logs not readable yet; and what
        the spool could not sync yet (`sync`)."""
        return self._not_synced + self._unopened + sum(
            1 for f in self._files.values()
            if not f.dead or any(not e.failures for e in f.tasklog.entries.values())
            or self._spooling(f))

    def _spooling(self, f: _Followed) -> bool:
        """Events of its tasks wait for the spool (their marks are to come)."""
        return any(u.f is f for u in self._unspooled)

    def _all_recorded(self, f: _Followed) -> bool:
        """Its producer is gone (or closed the log) and all the log holds is recorded."""
        return (f.dead and not f.tasklog.entries and not self._spooling(f)
                and all(w.done for w in f.tasklog.workflows.values()))

    def _settled(self, f: _Followed) -> bool:
        """Read to its end by a pass that found its producer gone, and all of it recorded:
        no line can come, and all that is left is the sync that marks it and lets it go.
        (Until then a log was read and looked over by every pass, ~4 a task.)"""
        return (self._unsynced.get(f.tasklog.path) is f and not f.unstarted and not f.begun
                and self._all_recorded(f))

    def _advance(self, f: _Followed) -> None:
        j = f.tasklog
        # Before reading: no line can come later.  (Gone once, gone: no /proc read again.)
        dead = f.dead or not self._alive(j.pid, j.start, j.boot)
        begun = f.begun + j.read_more()
        f.begun = []
        f.dead = dead or j.closed
        if j.close_waited:  # its producer waits for the marks: synced this pass, not later
            self._urgent = True
        self._workflows(f, starting=True)
        self._due_starts(f, begun)

    def _due_starts(self, f: _Followed, begun: list[Entry]) -> None:
        """Record the STARTs of tasks running for `hold_start_s` already.  One that ends
        sooner has its START recorded with its end: one commit and one spool sync, where
        two would be most of the work for engines of many short tasks."""
        for entry in begun:
            if not entry.started:
                f.unstarted[entry.meta.run_id] = entry
        if not f.unstarted:
            return
        due = datetime.now(timezone.utc).timestamp() - self.hold_start_s
        for run_id, entry in list(f.unstarted.items()):
            if entry.started or entry.recorded or entry.outcome is not None:
                del f.unstarted[run_id]
            elif entry.meta.started_at.timestamp() <= due:
                del f.unstarted[run_id]
                self._start(f, entry)

    def _ready(self, f: _Followed, begun: list[Entry]) -> list[
            tuple[_Followed, Entry, TaskOutcome]]:
        """The tasks of `f` to record now, with their outcomes; the STARTs that are due
        (an ended task's START goes in with its end: one commit)."""
        j = f.tasklog
        self._due_starts(f, begun)
        now_s = time.monotonic()
        ready = [e for e in j.entries.values() if not e.recorded and e.retry_at <= now_s
                 and (f.dead or e.outcome is not None)]
        if ready:
            f.collector.collect()
            f.collector.take(UNATTRIBUTED)  # I/O outside any task: never lineage
        for e in ready:
            if e.outcome is None:  # its producer went away with it open
                e.outcome, e.died = _died(j, e, self.lifetime_status()), True
        return [(f, e, e.outcome) for e in ready]

    def _workflows(self, f: _Followed, starting: bool) -> None:
        """Workflow runs the log began (`starting`: their starts, before their tasks'),
        or ended (after all their tasks the log holds: their events come last); a dead
        producer's open ones end ABORT."""
        from roar_core.pipeline import emission

        for run_id, w in list(f.tasklog.workflows.items()):
            if w.done:
                continue
            run = w.run
            engine = emission.Engine(**run["engine_version"]) if run.get(
                "engine_version") else None
            if starting:
                if not w.started and time.monotonic() >= self._refused_starts.get(run_id, 0):
                    ref = emission.RunRef(run["namespace"], run["job_name"], run_id)
                    start = functools.partial(
                        self.roar.workflow_started, ref, run["engine"], run.get("facets"),
                        engine, datetime.fromisoformat(run["started_at"]))
                    left: list = []
                    self._stage_start(run_id)  # (unstaged: as before this staging)
                    try:
                        left = start(hold=bool(self._unspooled),
                                     stored=run.get("started") == "stored")
                    except Exception as e:
                        if not _in_store(self.roar.store.workflow_run, run_id):
                            # Not stored (a full disk, a database down): tried again later;
                            # its tasks and its end wait for it (`_ensure_workflow`).
                            if run_id not in self._refused_starts:
                                log.warning("roar: workflow run %s (%s) not started yet "
                                            "(tried again): %s", run["job_name"], run_id, e)
                            self._refused_starts[run_id] = time.monotonic() + RETRY_S
                            continue
                        # Stored by a recorder that died before marking it.
                        left = self._start_again(
                            run_id, f"workflow run {run['job_name']} ({run_id})",
                            functools.partial(start, stored=True,
                                              hold=bool(self._unspooled)))
                    self._refused_starts.pop(run_id, None)
                    w.started = True
                    self._mark_spooled(f, None, {"ws": run_id}, left)
                continue
            if (w.ended is None and not f.dead) or not w.started:
                continue
            if any(not e.recorded for e in f.tasklog.entries.values()
                   if e.meta.workflow and e.meta.workflow.run_id == run_id):
                continue
            status, error, when = w.ended or ("ABORT", "the engine went away", None)
            left = []
            try:
                left = self.roar.workflow_finished(
                    emission.RunRef(run["namespace"], run["job_name"], run_id), status,
                    error=error, engine_version=engine, ended_at=when,
                    hold=bool(self._unspooled))
            except Exception as e:
                log.error("roar: end of workflow run %s (%s) lost: %s", run["job_name"],
                          run_id, e)
            w.done = True
            self._mark_spooled(f, None, {"r": run_id}, left)

    def _forget(self, f: _Followed) -> None:
        f.close()
        del self._files[f.tasklog.path]
        for path in [f.tasklog.path, *f.collector.owned()]:
            self._listing.headers.pop(path, None)
            try:
                os.unlink(path)
            except OSError:
                pass

    def _ensure_workflow(self, meta) -> None:
        """The row of the workflow run a task names, made by the first of its tasks to get
        here when no log began it (Airflow: the provider sends the DAG run's events)."""
        ref = meta.workflow
        if ref is None or ref.run_id in self._workflow_rows:
            return
        if ref.run_id in self._refused_starts:  # not a row of its own: its start, later
            raise StoreError(f"its workflow run {ref.run_id} is not started yet")
        from roar_core.pipeline.store import WorkflowRun
        from roar_core.pipeline.writer import now

        store = self.roar.store
        if store.workflow_run(ref.run_id) is None:
            try:
                store.start_workflow_run(WorkflowRun(ref.run_id, meta.engine, ref.namespace,
                                                     ref.job_name, now(), {}))
            except StoreError:
                if store.workflow_run(ref.run_id) is None:  # not a lost race
                    raise
        self._workflow_rows.add(ref.run_id)

    def _start(self, f: _Followed, entry: Entry) -> None:
        if not self._stage_start(entry.meta.run_id):
            return  # its START goes in with its end
        left: list = []
        try:
            self._ensure_workflow(entry.meta)
            left = self.roar.writer.started(entry.meta, hold=bool(self._unspooled))
        except Exception as e:
            if not _in_store(self.roar.store.task_run, entry.meta.run_id):
                # Not stored (a full disk): it goes in with the task's end, once the store
                # takes rows again.  Marked started, the end would be recorded without its
                # row, and refused ("unknown task run") on every try.
                log.warning("roar: START of task %s (%s) not recorded, kept for its end: %s",
                            entry.meta.job_name, entry.meta.run_id, e)
                return
            left = self._task_start_again(entry)  # stored by a recorder that died before
        entry.started = True
        # Marked once spooled: a recorder that dies with it kept leaves it unmarked, to
        # the next one (its end's events follow it).
        self._mark_spooled(f, entry, {"started": entry.meta.run_id}, left)

    def _task_start_again(self, entry: Entry) -> list:
        return self._start_again(
            entry.meta.run_id, f"task {entry.meta.job_name} ({entry.meta.run_id})",
            functools.partial(self.roar.writer.spool_start, entry.meta,
                              hold=bool(self._unspooled)))

    def _start_again(self, run_id: str, what: str, spool: Callable[[], list]) -> list:
        """The START of a run (a task, a workflow run) whose start a recorder that died
        before marking it had stored: spooled again (`spool()`) where that recorder had
        not synced it (sent twice, at worst: the spool may have taken it); returns it
        where it is not spooled."""
        if run_id not in self._staged_starts:
            return []  # spooled, synced, then the recorder died before its marks
        self._stage_start(run_id)  # (ours now, until spooled)
        self._staged_starts.discard(run_id)
        try:
            return spool()
        except Exception as e:  # noqa: BLE001 - the run is recorded without it
            log.error("roar: START of %s lost: %s", what, e)
            return []

    def _mark_spooled(self, f: _Followed, entry: Entry | None, mark: dict,
                      unspooled: list) -> None:
        """Mark a START (a task's, a workflow run's) or a workflow run's end in its log
        now, or once the spool has taken what it refused of its events."""
        if unspooled:
            self._keep_unspooled(f, entry, unspooled, None, mark)
        else:
            f.mark(mark)

    def _record(self, f: _Followed, entry: Entry, task: EndedTask) -> RecordedTask | None:
        result = None
        try:
            task.captured = self._captured(entry, task)
            run_id = entry.meta.run_id
            try:
                result = self.roar.writer.record(
                    task.meta, task.outcome, task.records, captured=task.captured,
                    start=task.start, before_commit=lambda ev: self._stage([(run_id, ev)]),
                    answer=self._answer_early if self._early else None,
                    stored=self._answer_stored if self._waiting else None,
                    hold=bool(self._unspooled))
            except StoreError:
                # Its START may be stored already: by a follower that died before marking
                # it in the task log.  Else the error stands.
                if entry.started or self.roar.store.task_run(entry.meta.run_id) is None:
                    raise
                self._mark_spooled(f, entry, {"started": run_id},
                                   self._task_start_again(entry))
                entry.started = True
                result = self.roar.writer.record(
                    task.meta, task.outcome, task.records, captured=task.captured,
                    before_commit=lambda ev: self._stage([(run_id, ev)]),
                    hold=bool(self._unspooled))
        except Exception as e:  # kept and tried again later; never the follower's end
            if not entry.started:
                self._start(f, entry)  # its START at least, as a task that began
            self._failed(f, entry, f"{type(e).__name__}: {e}")
            return None
        self._stored(f, entry, result)
        self._unstage()
        return result

    def _stored(self, f: _Followed, entry: Entry, task: RecordedTask) -> None:
        """A task the store has committed: recorded, or kept until the spool takes its
        events."""
        if task.unspooled:
            self._keep_unspooled(f, entry, task.unspooled, task)
        else:
            self._recorded(f, entry, task)

    def _keep_unspooled(self, f: _Followed, entry: Entry | None, events: list,
                        answer: RecordedTask | dict | None, mark: dict | None = None
                        ) -> None:
        """Keep a stored task's events the spool refused (or was not offered: an earlier
        one's are kept), staged as well, and offer them again later (`_respool`): storing
        the task again would record it twice, and marking it recorded would lose them.
        `answer`: to mark the task recorded with once they are spooled; `mark`: what to
        mark then instead (a START, a workflow run's: see `_mark_spooled`).  `entry`
        None: a workflow run's."""
        if not self._unspooled:
            self._respool_at = time.monotonic() + RESPOOL_S
            self._respool_failures = 1
        self._unspooled.append(_Unspooled(f, entry, list(events), answer, mark))
        what = (f"task {entry.meta.job_name} ({entry.meta.run_id})" if entry is not None
                else f"workflow run {next(iter(mark.values())) if mark else ''}")
        log.error("roar: %s stored; %d of its events kept until the OpenLineage spool "
                  "takes them", what, len(events))

    def _respool(self) -> None:
        """Offer the kept events again, in order, when due; a task whose events are all
        in is marked recorded (durable with the pass's sync, as any other)."""
        if not self._unspooled or time.monotonic() < self._respool_at:
            return
        while self._unspooled:
            u = self._unspooled[0]
            left = self.roar.writer.spool_events(u.events)
            if left:
                u.events[:] = left
                delay = min(RESPOOL_S * 2 ** self._respool_failures, RETRY_MAX_S)
                self._respool_failures += 1
                self._respool_at = time.monotonic() + delay
                return
            del self._unspooled[0]
            if u.mark is not None:
                u.f.mark(u.mark)
            if u.answer is not None:
                self._recorded(u.f, u.entry, u.answer)
        log.warning("roar: the OpenLineage spool takes events again: the kept ones are in")

    def _answer_early(self, task: RecordedTask) -> None:
        """A producer waiting for its task's lineage that asked for it as soon as it is
        known (`early`: Airflow's, whose provider sends the events) has it now, before the
        store: its versions and datasets are settled.  Recorded or not, the task stays in
        its log until it is (its recorded mark follows)."""
        found = self._early.pop(task.meta.run_id, None)
        if found is not None:
            self._answer(*found, task)

    def _answer_stored(self, task: RecordedTask) -> None:
        """A producer waiting for its task to be recorded (`run --wait`, Snakemake's for
        its temp() outputs) has the answer as soon as the store has committed the task, not
        after its events are spooled and synced (a 5,000-file task: ~6 ms).  Its events
        were staged before the commit: a recorder killed before it spools them leaves them
        to the next one, as it would after a sync."""
        found = self._waiting.pop(task.meta.run_id, None)
        if found is not None:
            self._answer(*found, task)

    def _answer_ahead(self, f: _Followed, entry: Entry, task: EndedTask) -> bool:
        """Answer the task's producer before the task is stored: its versions taken now
        (kept for the store), its lineage as `record` will store it.  False where that
        needs the store (`LineageWriter.answer`)."""
        task.captured = entry.taken = self._captured(entry, task)
        answer = self.roar.writer.answer(task.meta, task.outcome, task.captured)
        if answer is None:
            return False
        self._answer(f, entry, answer)
        return True

    def _answer(self, f: _Followed, entry: Entry, task: RecordedTask) -> None:
        entry.answered = time.monotonic()
        f.answer({"a": entry.meta.run_id, "res": result_of(task, short=entry.short)},
                 entry.meta.run_id)

    def _answered_ahead(self, tasks: list[tuple[_Followed, Entry, EndedTask]]) -> bool:
        """Answer the producers waiting for their tasks' lineage before storing anything;
        True when the tasks are left to a later pass to store, with those that end
        meanwhile: when every task of the pass is one whose producer waits for its early
        answer (an Airflow worker's) and other tasks are running, whose producers may
        wait next.

        Each such task was a pass and a store commit of its own: ~2 ms of the recorder's
        CPU after its answer, in which the answer of a task that ended next waited (four
        run at once).  The tasks are stored, in the order they ended, at the first pass
        with nothing to answer or no task running (within PASS_S of the last answer),
        ANSWER_AHEAD_S after the first answer, or once ANSWER_AHEAD_MAX wait.  Until then
        they are held: the recorder's mark says nothing after them is recorded
        (`held_from`).  A task whose lineage needs the store (an input version only it
        knows), or one that cannot be taken, is answered as it is stored, now."""
        if self.order is not None or not tasks or not all(
                e.waited and e.early and not e.failures for _, e, _ in tasks):
            return False
        # (Answered by `_answer_first` in this pass: new all the same, to hold or store.)
        new = [(f, e, t) for f, e, t in tasks
               if not e.answered or e.meta.run_id in self._answered_now]
        for f, entry, task in new:
            if entry.meta.run_id in self._answered_now:
                task.captured = entry.taken
                continue
            try:
                if not self._answer_ahead(f, entry, task):
                    return False
            except Exception:  # stored now, failing as storing it fails
                return False
        now = time.monotonic()
        if not new or len(tasks) > ANSWER_AHEAD_MAX or any(
                now - e.answered > ANSWER_AHEAD_S for _, e, _ in tasks):
            return False
        if not any(e.outcome is None and not e.lifetime for g in self._files.values()
                   for e in g.tasklog.entries.values()):  # (a worker's lifetime: no task)
            return False  # no task runs that may end next: stored now, while none waits
        self.held_from = min(t.outcome.ended_at for _, _, t in tasks)
        return True

    def _captured(self, entry: Entry, task: EndedTask) -> Capture:
        """Taken by the producer as the task ended; else taken now: as of its end when
        its producer died first (an output changed since is unknown), as they are when
        the producer said it ended and left them to us (Snakemake, which reports a job
        once it has made its touch() outputs)."""
        if entry.taken is not None:
            return entry.taken
        if entry.captured is None:
            if entry.died:
                return self.roar.writer.capture_late(task.meta, task.outcome,
                                                       task.records)
            taken = self.roar.writer.capture(task.meta, task.records)
            if entry.left is not None:  # its producer went on: as the task left them
                from roar_core.pipeline.capture import as_left

                taken = as_left(taken, entry.left)
            return taken
        from roar_core.pipeline.capture import from_dict

        return from_dict(entry.captured)

    def _failed(self, f: _Followed, entry: Entry, error: str) -> None:
        """One failed attempt to record a task (a store that cannot be written, a full
        disk): it stays in its log, marked with why (a waiting producer is told), and is
        tried again after a growing pause, by this recorder or the next one."""
        entry.failures += 1
        delay = min(RETRY_S * 2 ** (entry.failures - 1), RETRY_MAX_S)
        entry.retry_at = time.monotonic() + delay
        log.error("roar: task %s (%s) not recorded (kept, tried again in %.0f s): %s",
                  entry.meta.job_name, entry.meta.run_id, delay, error)
        f.mark({"fail": entry.meta.run_id, "m": error})
        if entry.waited:
            f.waiters.append(entry.meta.run_id)
            self._urgent = True

    def _recorded(self, f: _Followed, entry: Entry, answer: RecordedTask | dict) -> None:
        """Mark the task recorded; `answer`: what was recorded, or what to say of it."""
        entry.started = entry.recorded = True
        mark: dict = {"r": entry.meta.run_id}
        if (f.tasklog.results or entry.waited) and not entry.answered:
            mark["res"] = answer if isinstance(answer, dict) else result_of(
                answer, short=entry.short)
        f.mark(mark)
        if entry.waited:
            f.waiters.append(entry.meta.run_id)
            self._urgent = True
        if entry.own_dir:
            f.own_dirs.append(entry.own_dir)
        del f.tasklog.entries[entry.meta.run_id]  # a long-lived worker runs many tasks


class _Unspooled(NamedTuple):
    """A stored task's events the spool has not taken (`Follower._keep_unspooled`)."""

    f: _Followed
    entry: Entry | None  # None: a workflow run's
    events: list
    answer: RecordedTask | dict | None
    mark: dict | None = None


class _Followed:
    def __init__(self, tasklog: TaskLogFile, directory: str,
                 listing: LogListing | None = None):

        self.tasklog = tasklog
        # Tasks not marked recorded when first read: a recorder that died may have stored
        # them without marking them.
        self.inherited = {run_id for run_id, e in tasklog.entries.items() if not e.recorded}
        # Only its process's tree, and only processes started after the log was (a worker's
        # session holds a log for every process it ever forked).
        self.collector = SessionCollector(directory, root_pid=tasklog.pid,
                                          since_mono_ns=tasklog.mono, listing=listing)
        self.dead = False  # its process had exited (or closed its log) when this pass began
        self.done = False
        self._marks: list[dict] = []
        self._fd = -1
        self.waiters: list[str] = []  # run ids recorded for a waiting producer
        self.unstarted: dict[str, Entry] = {}  # begun, START not recorded (held)
        self.own_dirs: list[str] = []  # tasks' own tracer sessions, recorded
        self.begun: list[Entry] = []  # begun, read and not looked at by a pass yet

    def events(self, entry: Entry, read: WholeSession | None = None) -> tuple[list, int]:
        """The task's tracer records (and how many were lost): from its own session
        when it has one (read whole: its processes are done; `read`: as its producer read
        it), else by its tag."""
        if entry.own_dir:
            # Every process there is the task's (a runner's command tags only its first:
            # one that clears its environment is the task's all the same).
            # (absolute where in memory)
            own = os.path.join(self.collector.directory, entry.own_dir)
            t, logs_read, errors = read or SessionCollector(own).read_whole()
            for err in errors:
                log.warning("roar: task %s: %s", entry.meta.job_name, err)
            t.dropped += len(errors)
            if entry.meta.traced and logs_read == 0 and not errors:
                program = (entry.meta.command or [entry.meta.job_name])[0]
                entry.meta.traced = False
                if read is None and not os.path.isdir(own):
                    entry.meta.untraced_reason = (
                        f"the trace of {program} is gone: its logs were in memory ({own}), "
                        "and the machine restarted, or they were removed, before it was "
                        "recorded")
                else:
                    entry.meta.untraced_reason = (
                        f"{program} left no trace: a static or setuid program, or the "
                        "loader refused the preload library")
        else:
            t = self.collector.take(entry.meta.run_id)
        records = t.records
        if entry.shadow is not None:
            from roar_core.pipeline.attribution import unshadow

            records = unshadow(records, *entry.shadow)
        return records, t.dropped

    def mark(self, entry: dict) -> None:
        self._marks.append(entry)

    def answer(self, mark: dict, run_id: str) -> None:
        """Write one mark now, not at the next sync, and wake the producer waiting on it."""
        if self._append([mark]):
            poke(os.path.join(self.collector.directory, f"{WAIT_PREFIX}{run_id}"))

    def _append(self, marks: list[dict]) -> bool:
        """One O_APPEND write of the marks (never interleaved with the producer's lines);
        False when the log is gone: nothing left to mark, nobody waits on it."""
        try:
            if self._fd < 0:
                self._fd = os.open(self.tasklog.path, _OPEN_APPEND)
            os.write(self._fd, _mark_lines(marks))
        except OSError:
            return False
        return True

    def flush_marks(self) -> None:
        marks, self._marks = self._marks, []
        if marks and not (self.done and not self.tasklog.closed):
            # (A dead producer's log is removed once done: no one reads its marks.  A closed
            # one's producer may be waiting to read them.)
            self._append(marks)
        directory = self.collector.directory
        waiters, self.waiters = self.waiters, []
        for run_id in waiters:
            poke(os.path.join(directory, f"{WAIT_PREFIX}{run_id}"))
        if self.tasklog.close_waited and self.dead and all(
                e.failures for e in self.tasklog.entries.values()):
            # Every task answered: recorded, or failed and kept for another attempt.
            poke(os.path.join(directory, f"{WAIT_PREFIX}{self.tasklog.name}"))
        own, self.own_dirs = self.own_dirs, []
        for d in own:
            shutil.rmtree(os.path.join(directory, d), ignore_errors=True)

    def close(self) -> None:
        self.tasklog.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _mark_lines(marks: list[dict]) -> bytes:
    """Marks as task-log lines (one O_APPEND write of them is never interleaved)."""
    return "".join(json.dumps(m, separators=(",", ":"), default=str) + "\n"
                   for m in marks).encode()


def _in_store(lookup: Callable[[str], object], run_id: str) -> bool:
    """Whether the store has the run (`lookup`: its `task_run` or `workflow_run`); one that
    cannot say, no: its start is tried again (a task's with its end, which finds out)."""
    try:
        return lookup(run_id) is not None
    except StoreError:
        return False


def tell_unrecorded(directory: str | os.PathLike, error: str) -> None:
    """No store to record in (it cannot be opened: a full disk, a database down): every
    ended task of the directory's logs, and every task of a closed log, is marked with
    why, as a failed attempt is, and the producers waiting on them are woken.  The tasks
    stay in their logs, for the next recorder.  (Call it holding the recorder's lock.)"""
    directory = os.fspath(directory)
    for path in log_paths(directory):
        j = TaskLogFile.open(path)
        if j is None:
            continue
        told = [e for e in j.unrecorded() if e.outcome is not None or j.closed]
        if told:
            try:
                fd = os.open(path, _OPEN_APPEND)
                try:
                    os.write(fd, _mark_lines([{"fail": e.meta.run_id, "m": error}
                                              for e in told]))
                finally:
                    os.close(fd)
            except OSError:
                continue  # gone, or not ours to write: nobody to tell there
        for e in told:
            if e.waited:
                poke(os.path.join(directory, f"{WAIT_PREFIX}{e.meta.run_id}"))
        if j.close_waited:
            poke(os.path.join(directory, f"{WAIT_PREFIX}{j.name}"))


def recover(roar: Roar, directory: str | os.PathLike, *,
            lifetime_status: str = "ABORT") -> int:
    """Record what the dead processes of `directory` left unrecorded, without a follower
    (the caller makes sure none runs on this directory); returns how many tasks.  Task logs
    of live processes and of other hosts are left alone."""
    follower = Follower(roar, directory, lifetime_status=lambda: lifetime_status)
    follower._open_window()
    done = 0
    try:
        for path in log_paths(follower.directory):
            j = TaskLogFile.open(path)
            if j is None or j.host != follower._host or j.alive():
                continue
            f = follower._files[path] = _Followed(j, follower.directory, follower._listing)
            f.begun = [e for e in j.entries.values() if not e.started]
            follower._advance(f)
            done += follower._record_in_order(follower._ready(f, []))
            follower._workflows(f, starting=False)
            follower._unsynced[path] = f
    finally:
        try:
            # Marked, and removed once all it left is recorded; raises NotSynced where
            # the spool cannot be made durable (then nothing is marked).
            follower.sync()
        finally:
            follower.close()
    return done
