"""Recording one finished task: capture (classification, hashing) -> store -> emission.

Pure plumbing between the steps: each step's module does the work.  The capture runs as
the task ends (`LineageWriter.capture`, or `record` itself when called then); the rest may run
later.  The join by content hash lives here because it needs both the store and the
emitter: an input whose digest was recorded as an output under another path stays under
its own path, and the match is published as an inferred edge of its own
(`roar.content_match`), never as a rename.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import NamedTuple

from roar_core.heap import gc_paused
from roar_core.pipeline import capture as capture_mod
from roar_core.pipeline import declared as declared_mod
from roar_core.pipeline import emission, provenance, sourcecode
from roar_core.pipeline.capture import Capture, Version
from roar_core.pipeline.classification import PathFilter, TaskIO, shown_text
from roar_core.pipeline.hashing import Hasher
from roar_core.pipeline.redact import redact_argv, redact_name
from roar_core.pipeline.sourcecode import CodeVersion
from roar_core.pipeline.spool import Spool, encode
from roar_core.pipeline.store import Access, AccessRecord, CodeFile, Store, TaskRun
from roar_core.pipeline.tracelog import Record

log = logging.getLogger(__name__)


@dataclass
class TaskMeta:
    """What the integration knows about a task (identity and naming); the core does the rest."""

    run_id: str  # also the tracer tag
    engine: str
    namespace: str
    job_name: str
    started_at: datetime
    engine_task_id: str | None = None
    attempt: int = 0
    workflow: emission.RunRef | None = None
    parent_run_id: str | None = None
    command: list[str] | None = None
    host: str | None = None
    pid: int | None = None
    node_id: str | None = None
    traced: bool = True
    untraced_reason: str | None = None
    engine_version: emission.Engine | None = None
    run_facets: dict = field(default_factory=dict)
    io_check: emission.IOCheck | None = None
    declared: declared_mod.Declared | None = None
    """Files the engine declared (inputs/outputs compared with the trace into `io_check`)."""
    unseen_io: list[str] = field(default_factory=list)
    """S3 clients the task ran whose transfers roar cannot see (set from the trace)."""
    cwd: str | None = None
    """The working directory its command started in (`roar-core reproduce` runs it there)."""
    secrets: tuple[str, ...] = ()
    """Values the engine knows to be secret (parameters named like one): masked wherever
    they appear in the command, in events and in the store."""

    def __post_init__(self) -> None:
        # Valid text from here on: a `--job` or an argument with bytes that are not UTF-8
        # (surrogate escapes in Python) cannot go into JSON or the store as they are.
        self.job_name = shown_text(self.job_name)
        # The name goes out with every event: masked as the command is.
        self.job_name = redact_name(self.job_name, tuple(self.secrets))
        if self.command is not None:
            self.command = [shown_text(a) for a in self.command]


@dataclass
class TaskOutcome:
    status: str  # COMPLETE | FAIL | ABORT
    ended_at: datetime
    exit_code: int | None = None
    error: str | None = None
    dropped: int = 0


@dataclass
class EndedTask:
    """A task to record (`LineageWriter.record_many`): as `LineageWriter.record`'s arguments."""

    meta: TaskMeta
    outcome: TaskOutcome
    records: list[Record]
    captured: Capture | None = None
    start: bool = False  # its START is not stored yet: it goes in with its end


@dataclass
class RecordedTask:
    meta: TaskMeta
    outcome: TaskOutcome
    captured: Capture
    inputs: list[emission.Dataset]
    outputs: list[emission.Dataset]
    # Its events (encoded) that the spool could not take (a full disk), or was not to be
    # offered (`record`'s `hold`): stored, the task is not done until they are spooled,
    # in order, by the caller (the recorder keeps them, see Follower._keep_unspooled).
    unspooled: list[bytes] = field(default_factory=list)

    @property
    def io(self) -> TaskIO:
        return self.captured.io


def _ns(t: datetime) -> int:
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


def now() -> datetime:
    return datetime.now(timezone.utc)


def task_info(meta: TaskMeta, dropped: int) -> emission.TaskInfo:
    """The task's `roar_task` fields: in its events (`lineage_of`) and in the answer a
    waiting producer gets; its command with secrets masked."""
    command = redact_argv(meta.command, meta.secrets) if meta.command else None
    return emission.TaskInfo(
        engine=meta.engine, engine_task_id=meta.engine_task_id or meta.run_id,
        host=meta.host or "", pid=meta.pid or 0, attempt=meta.attempt, node_id=meta.node_id,
        traced=meta.traced, untraced_reason=meta.untraced_reason, dropped_events=dropped,
        command=command, parent_task_id=meta.parent_run_id,
        unseen_io=meta.unseen_io or None,
    )


def lineage_of(meta: TaskMeta, outcome: TaskOutcome | None = None,
               inputs: list[emission.Dataset] | None = None,
               outputs: list[emission.Dataset] | None = None,
               code: list[CodeVersion] | None = None) -> emission.TaskLineage:
    return emission.TaskLineage(
        namespace=meta.namespace, job_name=meta.job_name, run_id=meta.run_id,
        event_time=outcome.ended_at if outcome else meta.started_at,
        parent=meta.workflow, root=meta.workflow, engine=meta.engine_version,
        error_message=outcome.error if outcome else None,
        run_facets={**emission.provenance_facets(), **meta.run_facets},
        inputs=inputs or [], outputs=outputs or [],
        task=task_info(meta, outcome.dropped if outcome else 0), io=meta.io_check,
        code=code or [],
    )


def _task_run(meta: TaskMeta) -> TaskRun:
    machine, env = provenance.machine(), provenance.environment()
    named = {"machine": machine.digest, "environment": env.digest}
    if meta.cwd:
        named["cwd"] = meta.cwd
    return TaskRun(
        environment=named,
        run_id=meta.run_id, engine=meta.engine, namespace=meta.namespace,
        job_name=meta.job_name, started_at=meta.started_at,
        workflow_run_id=meta.workflow.run_id if meta.workflow else None,
        parent_run_id=meta.parent_run_id, engine_task_id=meta.engine_task_id,
        attempt=meta.attempt, host=meta.host or "", pid=meta.pid or 0,
        command=redact_argv(meta.command or [], meta.secrets), traced=meta.traced,
        untraced_reason=meta.untraced_reason,
    )


_GONE = Version(None, None, None, capture_mod.GONE)


def _stored(digest: str | None) -> str | None:
    # The store's canonical form, so that it takes each Access as it is (no copy per file).
    return None if digest is None else "blake3:" + digest


class LineageWriter:
    """Turns finished tasks into stored lineage and spooled events (thread-safe)."""

    def __init__(self, store: Store, spool: Spool | None, hasher: Hasher, keep: PathFilter,
                 file_host: str | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 match_min_size: int | None = 64):
        """`match_min_size`: the smallest input whose equal content under another path is
        published as an inferred edge; None: never."""
        self.store, self.spool, self.hasher, self.keep = store, spool, hasher, keep
        self.file_host = file_host
        self.progress = progress
        self.match_min_size = match_min_size
        self._facts_put = False

    def emit(self, event) -> bool:
        """Spool one event; False where the spool could not take it (it said why)."""
        return self.spool is None or self.spool.append(event)

    def spool_events(self, events: list, hold: bool = False) -> list:
        """Spool `events` in order; returns those it did not take: the first the spool
        refused and every one after it (an event never goes out before an earlier one).
        `hold`: none is offered (the caller keeps an earlier one the spool refused)."""
        if hold:
            return list(events)
        for i, event in enumerate(events):
            if not self.emit(event):
                return list(events[i:])
        return []

    def _put_facts(self) -> None:
        """This process's machine and environment, into the store once."""
        if not self._facts_put:
            self.store.put_facts([(f.kind, f.digest, f.data) for f in (
                provenance.machine(), provenance.environment())])
            self._facts_put = True

    def started(self, meta: TaskMeta, hold: bool = False) -> list[bytes]:
        """Store the task's start and spool its START; returns the START where it is
        not spooled (refused, or `hold`: see `RecordedTask.unspooled`)."""
        self._put_facts()
        self.store.start_task_run(_task_run(meta))
        return self.spool_start(meta, hold)

    def spool_start(self, meta: TaskMeta, hold: bool = False) -> list[bytes]:
        """Spool the START of a task whose start is stored (by `started`, or by a recorder
        that died before it could say the START was spooled); returns it where it is not
        spooled."""
        if self.spool is None:  # the engine's own integration sends the events
            return []
        return self.spool_events([self.start_event(meta)], hold)

    def start_event(self, meta: TaskMeta) -> bytes:
        """The task's START, encoded."""
        return encode(emission.start_event(lineage_of(meta)))

    def _dataset(self, name: str, digest: str | None, size: int | None,
                 lifecycle: str | None = None, via: list[str] | None = None,
                 unknown: str | None = None, object_version: str | None = None
                 ) -> emission.Dataset:
        ns, ds_name = emission.dataset_of(name, self.file_host)
        symlinks = [emission.file_dataset(v, self.file_host) for v in via] if via else []
        return emission.Dataset(ns, ds_name, digest=digest, size=size, symlinks=symlinks,
                                lifecycle=lifecycle, unknown_version=unknown,
                                object_version=object_version)

    def _outputs(self, made: list[tuple]) -> list[emission.Dataset]:
        """The output datasets of `_lineage`'s fields."""
        dataset = self._dataset
        return [dataset(*fields) for fields in made]

    def _input_datasets(self, recorded: list[AccessRecord] | list[Access]
                        ) -> list[emission.Dataset]:
        """Inputs under the path the task used (`symlinks`: the link it went through)."""
        out = []
        for rec in recorded:
            if rec.role != "input":
                continue
            digest = rec.digest.removeprefix("blake3:") if rec.digest else None
            out.append(self._dataset(rec.uri, digest, rec.size, via=[rec.path_read]
                                     if rec.path_read else None, unknown=rec.note,
                                     object_version=rec.object_version))
        return out

    def _stored_version(self, uri: str, v: Version) -> Version:
        """An input's unknown version found in the store: the version last recorded at this
        path with the state the task opened (size and mtime: all the store keeps)."""
        st = v.state
        if st is None:
            return v
        got = self.store.latest_version(uri)
        if got is not None and got.size == st.size and got.mtime_ns == st.mtime_ns:
            return Version(got.digest.removeprefix("blake3:"), st.size, st)
        return v

    def _stored_object(self, uri: str, object_version: str | None, v: Version) -> Version:
        """An S3 object version whose bytes did not pass through this task: the digest
        recorded for that version (VersionId or ETag) when some task's did."""
        if object_version is None:
            return v
        got = self.store.object_digest(uri, object_version)
        return v if got is None else Version(got[0].removeprefix("blake3:"), got[1], None)

    def _content_matches(self, meta: TaskMeta, recorded: list[AccessRecord]) -> list:
        """`roar.content_match` events: an input whose bytes were produced under another
        path, the copy unobserved.  Trivial contents (shorter than `content_match_min_size`,
        empty files among them) match by chance, and infer nothing."""
        if self.match_min_size is None:
            return []
        events = []
        for rec in recorded:
            m = rec.match
            if m is None or rec.size is None or rec.size < self.match_min_size:
                continue
            digest = m.digest.removeprefix("blake3:")
            source = emission.Dataset(*emission.dataset_of(m.uri, self.file_host),
                                      digest=digest, size=rec.size)
            copy = self._dataset(rec.uri, digest, rec.size)
            events.append(emission.content_match_event(emission.ContentMatch(
                namespace=meta.namespace, source=source, copy=copy,
                producer_run_id=m.run_id, producer_job=m.job_name,
                consumer_run_id=meta.run_id, event_time=meta.started_at)))
        return events

    def record(self, meta: TaskMeta, outcome: TaskOutcome, records: list[Record],
               untraceable: list[str] | None = None, *, start: bool = False,
               captured: Capture | None = None,
               before_commit: Callable[[list | None], None] | None = None,
               answer: Callable[[RecordedTask], None] | None = None,
               stored: Callable[[RecordedTask], None] | None = None,
               hold: bool = False) -> RecordedTask:
        """`start`: the task's start was not recorded (`started`) yet: its row goes in with
        its end, one commit, and its START event right before its end's, one spool sync.
        `captured`: the task's versions, taken as it ended (`capture.capture`); without
        one they are taken now, so call this right as the task ends.  `before_commit`:
        given the task's events (`spool.encode`d) after it is staged and before the store
        commits it (a recorder that may die between the commit and the spool keeps them
        there, to send without storing the task twice).  `answer`: given the task's
        lineage as soon as it is known, before the store (see `_stage`).

        `stored`: given the task once the store has committed it.  Its events are made
        after that, not before the commit: `before_commit` gets None, to keep that they
        are still to be made (`stored_events` makes them for a recorder killed before
        they were), then the events once made, before they are spooled.  A waiting
        producer's answer then waits for the store's rows alone: a 5,000-file task's
        events are ~25 ms of Python that held the GIL from the store's helper thread
        while it wrote the rows.

        Events the spool does not take are returned in `unspooled`, with all after them;
        `hold`: none is offered (the caller still holds an earlier task's)."""
        with gc_paused():
            # With before_commit, its stage is one transaction that commits after it.
            with self.store.batch() if before_commit is not None else nullcontext():
                staged = self._store_task(meta, outcome, records, untraceable, start,
                                          captured, answer)
                events = None if stored is not None else self._events(staged)
                if before_commit is not None:
                    before_commit(events)
            task = staged.task
            if events is None:
                stored(task)
                events = self._events_after_commit(staged, before_commit)
            if self.spool is not None:
                with self.spool.batch():  # its START and end: one sync
                    task.unspooled = self.spool_events(events, hold)
            return task

    def _events_after_commit(self, staged: _Staged,
                             before_commit: Callable[[list | None], None] | None
                             ) -> list[bytes]:
        """A stored task's events (see `record`'s `stored`).  It is stored and answered:
        a failure here can no longer send it back to be recorded again (that would store
        it twice), so it is logged, and what the events could not say is lost."""
        meta = staged.task.meta
        try:
            events = self._events(staged)
        except Exception as e:  # noqa: BLE001 - see above
            log.error("roar: task %s (%s) stored, its events not made: %s: %s",
                      meta.job_name, meta.run_id, type(e).__name__, e)
            return []
        if before_commit is not None:
            try:
                before_commit(events)
            except Exception as e:  # noqa: BLE001 - only a recorder killed now would lose them
                log.warning("roar: events of task %s not staged (%s); spooled now",
                            meta.run_id, e)
        return events

    def stored_events(self, meta: TaskMeta, outcome: TaskOutcome, captured: Capture,
                      start: bool = False) -> list[bytes]:
        """The events of a task stored by a recorder that died before it made them (see
        `record`'s `stored`), made as it would have: from the task's capture, with its
        inputs' producers found in the store again (its own rows left out, as then).
        `start`: its START was to go with them."""
        start_event = emission.start_event(lineage_of(meta)) if start and self.spool else None
        accesses, made = self._lineage(meta, captured, None)
        recorded = self.store.recorded_accesses(meta.run_id, accesses)
        io = captured.io
        task = RecordedTask(meta, outcome, captured,
                            self._input_datasets(recorded) if io.inputs else [],
                            self._outputs(made))
        return self._events(_Staged(task, recorded, self._code(captured), start_event))

    def record_many(self, tasks: list[EndedTask],
                    before_commit: Callable[[list], None] | None = None,
                    answer: Callable[[RecordedTask], None] | None = None,
                    stored: Callable[[RecordedTask], None] | None = None,
                    hold: bool = False) -> list[RecordedTask]:
        """Ended tasks, in one store commit, then their events, in order: for a recorder
        catching up with many short tasks, where a commit each was most of the work (and
        of the disk writes).  All or nothing: a failure (StoreError, or any other) stores
        and sends none of them; record them one by one then (`record`).  `before_commit`:
        given [(run id, its events)] once staged, before the commit; `answer`, `stored` and
        `hold`: as `record`'s (a task's events the spool refused hold all that follow)."""
        with gc_paused():
            # Hashed before the store's write lock is taken (a task without a capture).
            captures = [t.captured or self.capture(t.meta, t.records) for t in tasks]
            with self.store.batch():
                staged = [self._stage(t.meta, t.outcome, t.records, None, t.start, c, answer)
                          for t, c in zip(tasks, captures, strict=True)]
                # (Their events are made before the commit: small tasks, made on this
                # thread either way, and `record`'s later events would add a staging.)
                if before_commit is not None:
                    before_commit([(task.meta.run_id, events) for task, events in staged])
            if stored is not None:
                for task, _ in staged:
                    stored(task)
            if self.spool is not None:
                for task, events in staged:
                    task.unspooled = self.spool_events(events, hold)
                    hold = hold or bool(task.unspooled)
        return [task for task, _ in staged]

    def capture(self, meta: TaskMeta, records: list[Record]) -> Capture:
        """The task's file versions, now: for the process that marks a task's end."""
        with gc_paused():
            return capture_mod.capture(records, self.keep, self.hasher, declared=meta.declared,
                                       traced=meta.traced)

    @contextmanager
    def cache_held(self) -> Iterator[None]:
        """The stat cache entries of the files hashed inside written once, at its end: a
        recorder taking the versions of a pass's tasks commits to the cache once, not once
        per task (a write transaction each, ~3 % of a small task's recording)."""
        if self.hasher.holding:  # someone else's hold: theirs to write
            yield
            return
        self.hasher.hold_cache()
        try:
            yield
        finally:
            self.hasher.write_cache()

    def capture_late(self, meta: TaskMeta, outcome: TaskOutcome,
                     records: list[Record]) -> Capture:
        """The versions of a task that ended a while ago, with nobody there to take them
        (its runner or worker died): an output changed since its end is unknown."""
        return capture_mod.taken_late(self.capture(meta, records), _ns(outcome.ended_at))

    def answer(self, meta: TaskMeta, outcome: TaskOutcome, captured: Capture
               ) -> RecordedTask | None:
        """The task's lineage as `record` will store it (what `answer` gives), without
        storing it: for a producer waiting for it, before the task is recorded (with others,
        later).  None when it needs the store: an input whose version is known only there,
        or an object copy's source -- what an earlier task not stored yet may change."""
        lineage = self._lineage(meta, captured, None, ahead=True)
        if lineage is None:
            return None
        accesses, outputs = lineage
        return RecordedTask(meta, outcome, captured, self._input_datasets(accesses),
                            self._outputs(outputs))

    def _lineage(self, meta: TaskMeta, captured: Capture, untraceable: list[str] | None,
                 ahead: bool = False) -> tuple[list[Access], list[tuple]] | None:
        """The task's accesses and its output datasets' fields (`_outputs` makes them:
        for a task of thousands of files, after its rows have gone to the store); settles
        what its capture says of `meta` (untraced, unseen S3, declared I/O, command).
        `ahead`: None where a version would come from the store (see `answer`)."""
        io, decl = captured.io, meta.declared
        if untraceable:
            io.untraceable.extend(untraceable)
        if io.untraceable and meta.traced:
            meta.traced = False
            meta.untraced_reason = "ran programs the preload tracer cannot see: " + ", ".join(
                sorted(set(io.untraceable)))
            log.warning("roar: task %s %s", meta.job_name, meta.untraced_reason)
        if io.unseen and meta.unseen_io != io.unseen:  # (said once: `answer` came first)
            meta.unseen_io = io.unseen
            log.warning("roar: task %s ran %s: its S3 transfers are not in the lineage "
                        "(only boto3/botocore's are seen)", meta.job_name, ", ".join(io.unseen))
        if decl is not None and meta.traced and meta.io_check is None:
            meta.io_check = declared_mod.check(io, decl)
        if meta.command is None and io.commands:
            meta.command = io.commands[0]

        accesses: list[Access] = []
        outputs: list[tuple] = []
        for a in io.inputs:
            v = captured.inputs.get(a.path) or _GONE
            if v.digest is None:
                if ahead:
                    return None
                v = (self._stored_object(a.name, a.obj.version, v) if a.obj
                     else self._stored_version(a.name, v))
            accesses.append(Access(uri=a.name, role="input", digest=_stored(v.digest),
                                   size=v.size, mtime_ns=v.state.mtime_ns if v.state else None,
                                   path_read=a.read_via[0] if a.read_via else None,
                                   note=v.why if v.digest is None else None,
                                   object_version=a.obj and a.obj.version))
        # (Names bound once: a big task's thousands of outputs are on the path to its answer.)
        taken, made, add = captured.outputs.get, outputs.append, accesses.append
        for a in io.outputs:
            v = taken(a.path) or _GONE
            obj = a.obj
            obj_version = obj and obj.version
            if v.digest is None and obj and obj.source:  # a copy: its source's bytes
                if ahead:
                    return None
                v = self._stored_object(*obj.source, v)
            digest, state = v.digest, v.state
            made((a.name, digest, v.size, "OVERWRITE" if a.existed else "CREATE", None, v.why,
                  obj_version))
            add(Access(a.name, "output", _stored(digest), v.size,
                       state.mtime_ns if state else None, None,
                       v.why if digest is None else None, obj_version))
        for a in io.deleted:
            outputs.append((a.name, None, None, "DROP"))
            accesses.append(Access(uri=a.name, role="deleted", digest=None))
        for a in io.transient:
            accesses.append(Access(uri=a.name, role="transient", digest=None))
        return accesses, outputs

    def _stage(self, meta: TaskMeta, outcome: TaskOutcome, records: list[Record],
               untraceable: list[str] | None, start: bool = False,
               captured: Capture | None = None,
               answer: Callable[[RecordedTask], None] | None = None
               ) -> tuple[RecordedTask, list]:
        """Store the task; returns it and its events, to emit in order once stored."""
        staged = self._store_task(meta, outcome, records, untraceable, start, captured, answer)
        return staged.task, self._events(staged)

    def _code(self, captured: Capture) -> list[CodeVersion]:
        """Where each of the task's scripts is in git: stored with the run (diff,
        reproduce) and sent."""
        found = [(a.name, "blake3:" + v.digest) for a in captured.io.code
                 if (v := captured.code.get(a.path)) is not None and v.digest is not None]
        return sourcecode.versions(found) if found else []

    def _store_task(self, meta: TaskMeta, outcome: TaskOutcome, records: list[Record],
                    untraceable: list[str] | None, start: bool = False,
                    captured: Capture | None = None,
                    answer: Callable[[RecordedTask], None] | None = None) -> _Staged:
        """Store the task (in the caller's batch: committed with it); returns what its
        events are made of (`_events`).  `answer`: given the task as it will be stored,
        before the store: its versions and datasets are settled by then (what a producer
        waiting for its lineage needs, which need not wait for the store's statements and
        commit)."""
        # As begun: the trace may yet find the task untraced, which its end records.
        self._put_facts()
        started = _task_run(meta) if start else None
        start_event = emission.start_event(lineage_of(meta)) if start and self.spool else None
        if captured is None:
            captured = self.capture(meta, records)
        accesses, made = self._lineage(meta, captured, untraceable)
        outputs = None
        if answer is not None:
            # The inputs as the store will record them (one access each, as given).
            outputs = self._outputs(made)
            answer(RecordedTask(meta, outcome, captured, self._input_datasets(accesses),
                                outputs))
        versions = self._code(captured)
        code = [CodeFile(c.path, c.digest.removeprefix("blake3:"),
                         c.repo.url if c.repo else None, c.repo.commit if c.repo else None,
                         c.repo_path, c.dirty) for c in versions]
        recorded = self.store.finish_task_run(
            meta.run_id, outcome.status, outcome.ended_at, exit_code=outcome.exit_code,
            error_message=outcome.error, dropped_events=outcome.dropped, code=code,
            traced=meta.traced, untraced_reason=meta.untraced_reason, accesses=accesses,
            started=started)
        if outputs is None:  # (its rows written meanwhile, on the store's helper thread)
            outputs = self._outputs(made)
        inputs = self._input_datasets(recorded) if captured.io.inputs else []
        return _Staged(RecordedTask(meta, outcome, captured, inputs, outputs), recorded,
                       versions, start_event)

    def _events(self, staged: _Staged) -> list[bytes]:
        """The stored task's events, in the order they go out, each encoded once (for the
        recorder's staging and the spool alike)."""
        task = staged.task
        meta, outcome = task.meta, task.outcome
        events = []
        if staged.start_event is not None:
            events.append(staged.start_event)
        if self.spool is not None:
            # The inferred edges first: the copy has a producer before the task reads it.
            events += self._content_matches(meta, staged.recorded)
            make = {"COMPLETE": emission.complete_event, "FAIL": emission.fail_event,
                    "ABORT": emission.abort_event}[outcome.status]
            events.append(make(lineage_of(meta, outcome, task.inputs, task.outputs,
                                          staged.versions)))
        return [encode(e) for e in events]


class _Staged(NamedTuple):
    """A task as `LineageWriter._store_task` stored it: what its events are made of."""

    task: RecordedTask
    recorded: list[AccessRecord]
    versions: list[CodeVersion]
    start_event: emission.Event | None
