"""Durable event spool with a background sender: no OpenLineage event is ever lost.

`append` writes the event to the spool directory and fsyncs it before returning; a sender
thread then delivers events oldest first through the openlineage-python client and records
the deliveries durably, once per pass (or per _ACK_EVERY events). An unreachable backend
costs one warning line per outage and a retry with capped exponential backoff; undelivered
events survive restarts, and `flush()` (what `roar-core flush` calls) sends the backlog of
every process that used the directory.

Order: the sender merges all segments by append time and stops at the first event that could
not be delivered, so the events of a run go out in the order they were appended, even when two
processes appended them. One sender at a time per directory (an flock), so nothing is sent twice
by two processes. Delivery is at least once: a crash between a send and its ack resends the
events sent since the last ack (at most _ACK_EVERY). Delivered segments are deleted, so the
spool holds only the backlog.
File format and crash recovery: see spoolfiles.py.
"""

from __future__ import annotations

import atexit
import fcntl
import heapq
import json
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from roar_core.pipeline import tracer
from roar_core.pipeline.emission import Event
from roar_core.pipeline.redact import redact_text
from roar_core.pipeline.spoolfiles import (
    REJECTED,
    SENDER_LOCK,
    NotSynced,
    Record,
    Segment,
    SegmentWriter,
    append_synced,
    count_slow_try,
    pending_count,
    read_ack,
    remove_stale,
    segment_paths,
)

if TYPE_CHECKING:
    from openlineage.client import OpenLineageClient
    from openlineage.client.event_v2 import RunEvent

log = logging.getLogger(__name__)


class FlushResult(NamedTuple):
    sent: int
    pending: int


# Events delivered between two acks at most (one ack per pass otherwise).
_ACK_EVERY = 256
# Sends of one event that a backend took and did not answer in time (delivery.TooSlow),
# counted across processes: then it is set aside, and the events behind it go.
SLOW_TRIES = 5
# `flush` while another process holds the sender lock: how soon it looks again.
_BUSY_POLL_S = 0.01


class _Outcome(Enum):
    DONE = "done"  # everything visible was handled
    FAILED = "failed"  # transient failure: back off and retry
    BUSY = "busy"  # another process is sending from this directory
    HOLD = "hold"  # no transport configured: keep the events, check again later
    TIMEOUT = "timeout"


class Spool:
    """Append OpenLineage events durably and deliver them in the background.

    `client`: the `OpenLineageClient` to send with; by default one is made on first send,
    configured the standard ways. `start=False`: no background thread (for `roar-core flush`,
    which only calls `flush`). Delivery problems are logged, never raised.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        client: OpenLineageClient | None = None,
        *,
        start: bool = True,
        fsync: bool = True,
        segment_bytes: int = 1 << 20,
        backoff_initial: float = 0.5,
        backoff_max: float = 60.0,
        idle_rescan: float = 30.0,
        exit_flush_timeout: float = 1.0,
    ) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # appends will fail (and say so); the caller's task must not
            log.warning("roar: cannot create the OpenLineage spool %s: %s", self.directory, e)
        if client is not None:
            from roar_core.pipeline import delivery

            delivery.limit_retries(client.transport)
        self._client = client
        self._client_given = client is not None
        self._start = start
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._idle_rescan = idle_rescan
        self._exit_flush_timeout = exit_flush_timeout
        self._writer = SegmentWriter(self.directory, segment_bytes, fsync)
        self._closed = False
        self._sent_total = 0
        self._failing = False
        self._hold_logged = False
        self._init_process_state()
        ref = weakref.ref(self)
        atexit.register(_at_exit, ref)
        os.register_at_fork(after_in_child=lambda: _after_fork(ref))

    def _init_process_state(self) -> None:
        # Per process: a forked child has no sender thread, and a lock held by another thread
        # at fork time would never be released there.
        self._pid = os.getpid()
        self._pass_lock = threading.Lock()
        self._client_lock = threading.Lock()
        self._thread_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def append(self, event: RunEvent | Mapping[str, Any] | bytes) -> bool:
        """Durably spool one event (or its `encode`d bytes) and wake the sender.

        Returns False after a one-line warning if the spool cannot be written (disk full...):
        lineage must never fail the user's task. After `close`, events are still spooled for
        the next sender or `roar-core flush`, only not sent from this process.
        """
        data = event if isinstance(event, bytes) else encode(event)
        try:
            self._writer.write(data)
        except OSError as e:
            log.warning("roar: could not spool an OpenLineage event in %s: %s", self.directory, e)
            return False
        self._ensure_sender()
        self._wake.set()
        return True

    @contextmanager
    def batch(self, strict: bool = False) -> Iterator[None]:
        """Append many events with one fsync, when the block ends: a recorder catching up
        with many tasks pays one disk flush instead of one per event.  The events are
        durable only once the block has ended; where its fsync fails they are written again
        (`SegmentWriter.sync_deferred`), and until that succeeds a `strict` block raises
        `NotSynced` as it ends (else: a warning)."""
        self._writer.defer_sync()
        try:
            yield
        finally:
            try:
                self._writer.sync_deferred()
            except OSError as e:
                if strict:
                    raise NotSynced(e.errno, f"cannot sync the OpenLineage spool "
                                    f"{self.directory}: {e.strerror or e}") from e
                log.warning("roar: could not sync the OpenLineage spool %s: %s",
                            self.directory, e)

    def flush(self, timeout: float | None = 10.0, *, retry: bool = True) -> FlushResult:
        """Send the backlog until it is empty or `timeout` seconds have passed.

        Transient failures are retried with backoff within the timeout; `retry=False`:
        not at all (a process that exits next leaves the backlog to the next sender,
        rather than linger through an outage). Returns how many events were sent meanwhile
        (by this call or the background thread) and how many are still pending.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        before = self._sent_total
        failures = 0
        while True:
            outcome = self._pass(deadline)
            if outcome in (_Outcome.DONE, _Outcome.HOLD, _Outcome.TIMEOUT) or not retry:
                break
            if outcome is _Outcome.BUSY:
                # Another process is sending this backlog (a recorder's sender):
                # nothing failed, and its pass ends once it has sent what it found; a
                # backoff's sleep here (0.25-0.5 s) was most of a Ray job's lineage drain.
                delay = _BUSY_POLL_S
            else:
                failures += 1
                delay = self._backoff(failures)
            if deadline is not None:
                delay = min(delay, deadline - time.monotonic())
                if delay <= 0:
                    break
            time.sleep(delay)
        return FlushResult(self._sent_total - before, self.pending())

    def position(self) -> tuple[Path | None, int]:
        """Where this process's spooling has got to (its segment, bytes written): what
        `delivered` asks about."""
        return self._writer.position()

    def delivered(self, position: tuple[Path | None, int]) -> bool:
        """Is everything this process spooled up to `position` delivered (by whichever
        process sends from the directory), or held for good (no transport configured)?"""
        if self._delivered(*position):
            return True
        try:
            return self._get_client() is None
        except Exception:  # noqa: BLE001 - a bad configuration: nothing is delivered
            return False

    def start_sender(self) -> None:
        """Deliver from a thread of this process from now on (a spool made `start=False`,
        in a process that does nothing else: the recorder's sender)."""
        self._start = True
        self._ensure_sender()

    def wake(self) -> None:
        """New events from another process of this directory: the sender looks now."""
        self._wake.set()

    @staticmethod
    def _delivered(segment: Path | None, upto: int) -> bool:
        """Is `segment` delivered up to `upto`?  The sender goes in order, so all that
        this process spooled before is too; a segment gone was delivered whole."""
        if segment is None or upto == 0:
            return True
        try:
            return read_ack(segment) >= upto or not segment.exists()
        except OSError:
            return False

    def pending(self) -> int:
        """Events spooled (by any process) and not yet delivered."""
        return pending_count(self.directory)

    def close(self, timeout: float = 0.0) -> None:
        """Try to deliver for up to `timeout` s, stop the sender and seal our segment.

        Whatever is undelivered stays spooled for the next sender or `roar-core flush`.
        """
        if self._closed:
            return
        if timeout > 0:
            self.flush(timeout)
        self._closed = True
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            # A send in flight is bounded by the transport's timeout; waiting longer gains
            # nothing (the thread is a daemon and the event is safe on disk).
            thread.join(timeout=max(timeout, 1.0))
        self._writer.seal()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- sender -------------------------------------------------------------------------------

    def _ensure_sender(self) -> None:
        if not self._start or self._closed:
            return
        with self._thread_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=f"roar-spool-sender:{self.directory}", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        tracer.ignore_this_thread()  # in a traced worker, sending is not a task's I/O
        failures = 0
        while not self._stop.is_set():
            self._wake.clear()
            outcome = self._pass(None)
            if outcome in (_Outcome.FAILED, _Outcome.BUSY):
                failures += 1
                # Sleep the backoff out whatever gets appended meanwhile: retrying on every
                # new event would hammer a backend that is struggling to come back.
                self._stop.wait(self._backoff(failures))
                continue
            failures = 0
            if outcome is _Outcome.HOLD:
                self._stop.wait(self._idle_rescan)
            else:
                # Also wake now and then: segments of dead processes are ours to deliver.
                self._wake.wait(self._idle_rescan)

    def _ack_sync(self) -> bool:
        # While appends are batched (a recorder syncing its events once a second), acks are
        # not synced either: each fdatasync on a journaling file system also forces out the
        # tasks' own freshly written files, which the tasks then wait on (measured, Ray io10
        # on ext4: 1.14 against 1.08 without).  An OS crash then re-sends a second's events.
        return not self._writer.deferring

    def _backoff(self, failures: int) -> float:
        delay = min(self._backoff_max, self._backoff_initial * 2 ** min(failures - 1, 30))
        return delay * random.uniform(0.5, 1.0)  # jitter: a node's workers must not retry in step

    def _pass(self, deadline: float | None) -> _Outcome:
        wait = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._pass_lock.acquire(timeout=wait):
            return _Outcome.TIMEOUT
        try:
            if not self.directory.is_dir():
                return _Outcome.DONE  # removed (or never created): nothing to send
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
            lock_fd = os.open(self.directory / SENDER_LOCK, flags, 0o600)
            try:
                try:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return _Outcome.BUSY
                return self._send_all(deadline)
            finally:
                os.close(lock_fd)  # releases the flock
        except Exception as e:  # an I/O error or a bug must never reach the caller
            self._note_failure("the spool sender failed", e)
            log.debug("roar: spool sender failure", exc_info=True)
            return _Outcome.FAILED
        finally:
            self._pass_lock.release()

    def _send_all(self, deadline: float | None) -> _Outcome:
        segments: list[Segment] = []
        for path in segment_paths(self.directory):
            seg = Segment.load(path, own=path == self._writer.path)
            if seg is None:
                continue
            if not seg.delivered:
                segments.append(seg)
            elif seg.sealed:
                seg.remove()
        remove_stale(self.directory)
        if not segments:
            return _Outcome.DONE
        try:
            client = self._get_client()
        except Exception as e:  # bad configuration: say so once, keep the events
            self._note_failure("cannot create the OpenLineage client", e)
            return _Outcome.FAILED
        if client is None:
            return _Outcome.HOLD
        # Where each segment is delivered up to: written (synced) once per pass, not once per
        # event; a sender busy with many small tasks' events spends far less on its acks.
        done: dict[Segment, int] = {}
        unacked = 0
        try:
            for rec in heapq.merge(*(s.records() for s in segments), key=lambda r: r.t):
                if deadline is not None and time.monotonic() >= deadline:
                    return _Outcome.TIMEOUT
                if rec.problem is not None:
                    self._report_unreadable(rec, rec.problem)
                elif not self._deliver(client, rec):
                    return _Outcome.FAILED
                done[rec.segment] = rec.end
                unacked += 1
                if unacked >= _ACK_EVERY:  # a long backlog: bounded resends after a crash
                    _ack(done, self._ack_sync())
                    unacked = 0
        finally:
            _ack(done, self._ack_sync())
            for seg in segments:
                if seg.sealed and seg.delivered:
                    seg.remove()
        if self._failing:
            self._failing = False
            log.info("roar: OpenLineage backend reachable again; %s delivered", self.directory)
        return _Outcome.DONE

    def _deliver(self, client: OpenLineageClient, rec: Record) -> bool:
        """Send one record: True when done with it (delivered or set aside), False to retry."""
        from roar_core.pipeline import delivery  # the client's import (~0.2 s): only where we send

        try:
            data = orjson.loads(rec.body)
        except ValueError as e:
            self._report_unreadable(rec, f"not JSON ({e})")
            return True
        try:
            delivery.send(client, data)
        except delivery.Rejected as e:
            self._set_aside(rec, str(e))
            return True
        except delivery.TooSlow as e:
            tries = count_slow_try(self.directory, rec.segment.path, rec.start)
            if tries >= SLOW_TRIES:
                self._set_aside(rec, f"{e} ({tries} tries; {len(rec.body)} bytes): too big "
                                     "or too slow for the backend")
                return True
            self._note_failure("OpenLineage backend too slow for an event", e)
            return False
        except Exception as e:
            self._note_failure("OpenLineage backend unreachable", e)
            return False
        self._sent_total += 1
        return True

    def _set_aside(self, rec: Record, reason: str) -> None:
        """Never deliverable as it is: kept in REJECTED (a `doctor` finding), out of the
        way of the events behind it."""
        path = self.directory / REJECTED
        log.warning("roar: OpenLineage event set aside in %s: %s", path, reason)
        append_synced(path, b'{"reason":%s,"event":%s}\n' % (json.dumps(reason).encode(),
                                                              rec.body))

    def _report_unreadable(self, rec: Record, problem: str) -> None:
        log.warning(
            "roar: skipped unreadable spool record %s at byte %d: %s",
            rec.segment.path, rec.start, problem.replace("\n", " "),
        )  # fmt: skip

    def _note_failure(self, what: str, exc: BaseException) -> None:
        # One warning per outage, not one per retry: the events are safe on disk.
        if self._failing:
            return
        self._failing = True
        reason = redact_text(f"{type(exc).__name__}: {exc}".replace("\n", " "))[:300]
        log.warning("roar: %s; events kept in %s and retried: %s", what, self.directory, reason)

    def _get_client(self) -> OpenLineageClient | None:
        from roar_core.pipeline import delivery

        with self._client_lock:
            if self._client is None:
                self._client = delivery.make_client()
            if self._client_given:
                return self._client
            reason = delivery.hold_reason(self._client)
            if reason is None:
                return self._client
            if not self._hold_logged:
                self._hold_logged = True
                log.warning("roar: %s; OpenLineage events kept in %s", reason, self.directory)
            return None


def encode(event: RunEvent | Mapping[str, Any]) -> bytes:
    """The event as the spool keeps it: what the client's serializer would write."""
    if isinstance(event, Event):
        # roar's own events are JSON-ready and null-free by construction: encoded as they
        # are, they say exactly what the client's serializer would, at a fraction of its
        # cost (it rebuilds the whole tree to drop nulls, ~40 us per file of a big task;
        # orjson then takes ~1 us per file where json.dumps takes ~6).
        try:
            return orjson.dumps(event, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # a str not valid UTF-8 (a surrogate escape)
            return orjson.dumps(_valid_text(event), option=orjson.OPT_SORT_KEYS)
    # The client's `RunEvent`, or a mapping of unknown content: its own serializer, so that
    # what we spool is exactly what it would send.
    from openlineage.client.serde import Serde

    data = Serde.to_json(
        dict(event) if isinstance(event, Mapping) else event, separators=(",", ":")
    ).encode()
    if b"\\ud" in data:  # maybe a lone surrogate's escape: made valid, as above
        data = orjson.dumps(_valid_text(json.loads(data)))
    return data


def _valid_text(value: Any) -> Any:
    """`value` with every str made valid text (json would write a lone surrogate as an
    escape that no strict reader, orjson's or Marquez's, accepts)."""
    from roar_core.pipeline.classification import shown_text

    if isinstance(value, str):
        return shown_text(value)
    if isinstance(value, Mapping):
        return {_valid_text(k): _valid_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_valid_text(v) for v in value]
    return value


def _ack(done: dict[Segment, int], sync: bool) -> None:
    for seg, end in done.items():
        if end > seg.acked:
            seg.ack(end, sync)
    done.clear()


def _at_exit(ref: weakref.ref[Spool]) -> None:
    spool = ref()
    if spool is not None and not spool._closed and spool._pid == os.getpid():
        try:
            # One short last try for the events of the final task; the rest stays spooled.
            spool.close(timeout=spool._exit_flush_timeout)
        except Exception:  # never turn interpreter exit into a traceback
            log.debug("roar: spool close at exit failed", exc_info=True)


def _after_fork(ref: weakref.ref[Spool]) -> None:
    spool = ref()
    if spool is not None:
        spool._writer.forget()
        spool._init_process_state()
