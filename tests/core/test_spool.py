"""The spool against a real local OpenLineage HTTP endpoint that tests stop and restart."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import RunEvent
from openlineage.client.transport.http import HttpConfig, HttpTransport

from roar_core.pipeline import emission as em
from roar_core.pipeline.spool import Spool
from roar_core.pipeline.spoolfiles import SENDER_LOCK
from tests.olschema import validate_event

REPO = Path(__file__).resolve().parents[2]
LINEAGE_PATH = "/api/v1/lineage"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


class Endpoint:
    """A tiny OpenLineage endpoint on 127.0.0.1 recording the events posted to it."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.events: list[dict[str, Any]] = []
        self.posts = 0
        # Maps a posted event to the HTTP status to answer (2xx records it).
        self.status: Callable[[dict[str, Any]], int] = lambda event: 201
        self.read_rate: float | None = None  # bytes/s a slow backend reads a body at
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self._body(int(self.headers["Content-Length"]))
                if body is None:
                    return
                event = json.loads(body)
                with endpoint._lock:
                    endpoint.posts += 1
                    status = endpoint.status(event) if self.path == LINEAGE_PATH else 404
                    if status < 300:
                        endpoint.events.append(event)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _body(self, size: int) -> bytes | None:
                if endpoint.read_rate is None:
                    return self.rfile.read(size)
                body = b""
                try:
                    while len(body) < size:
                        body += self.rfile.read(min(65536, size - len(body)))
                        time.sleep(65536 / endpoint.read_rate)
                except OSError:  # the client gave up
                    return None
                return body

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def received(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)


@pytest.fixture(autouse=True)
def isolated_openlineage_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No OpenLineage settings from outside; restore os.environ fully afterwards, as the
    client itself writes to it (OPENLINEAGE_URL is aliased into OPENLINEAGE__TRANSPORT__*)."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith("OPENLINEAGE"):
            del os.environ[name]
    monkeypatch.chdir(tmp_path)  # no stray openlineage.yml, no git repo for the client to read
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    ep = Endpoint()
    ep.start()
    yield ep
    ep.stop()


@pytest.fixture
def make_spool(tmp_path: Path, endpoint: Endpoint) -> Iterator[Callable[..., Spool]]:
    spools: list[Spool] = []

    def make(directory: Path | None = None, *, client: bool = True, **kw: Any) -> Spool:
        ol = OpenLineageClient(transport=HttpTransport(HttpConfig(url=endpoint.url, timeout=2)))
        kw = {"backoff_initial": 0.02, "backoff_max": 0.2, "exit_flush_timeout": 0, **kw}
        spool = Spool(directory or tmp_path / "spool", ol if client else None, **kw)
        spools.append(spool)
        return spool

    yield make
    for spool in spools:
        spool.close()


def lineage_events(runs: int = 3) -> list[em.Event]:
    """A workflow run and `runs` tasks, their START and COMPLETE events interleaved."""
    clock = iter(T0 + timedelta(seconds=i) for i in range(100))
    wf = em.WorkflowLineage(namespace="ns", job_name="wf", run_id=em.new_run_id())
    tasks = [
        em.TaskLineage(
            namespace="ns",
            job_name=f"wf.task{i}",
            run_id=em.new_run_id(),
            parent=em.RunRef("ns", "wf", wf.run_id),
            outputs=[em.Dataset("file", f"/data/out{i}", digest=f"{i:064x}", size=i)],
        )
        for i in range(runs)
    ]
    events = [em.workflow_start(_at(wf, next(clock)))]
    events += [em.start_event(_at(t, next(clock))) for t in tasks]
    events += [em.complete_event(_at(t, next(clock))) for t in tasks]
    events.append(em.workflow_complete(_at(wf, next(clock))))
    return events


def _at(lineage: Any, when: datetime) -> Any:
    lineage.event_time = when
    return lineage


def sent_form(event: RunEvent | dict[str, Any]) -> dict[str, Any]:
    """An event as we spooled it: without the `tags` facet the client adds when emitting."""
    data = em.to_dict(event) if isinstance(event, RunEvent) else json.loads(json.dumps(event))
    data["run"]["facets"].pop("tags", None)
    return data


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def spool_warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("roar_core")
        and r.levelno >= logging.WARNING
        and text in r.getMessage()
    ]


def spool_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith((".jsonl", ".ack")))


def test_delivers_in_background_then_compacts(
    make_spool: Callable[..., Spool], endpoint: Endpoint, tmp_path: Path
) -> None:
    spool = make_spool()
    events = lineage_events()
    for event in events:
        assert spool.append(event)
    wait_until(lambda: len(endpoint.received()) == len(events))
    received = endpoint.received()
    for event in received:
        validate_event(event)  # what really went out, client's additions included
    assert [sent_form(e) for e in received] == [sent_form(e) for e in events]
    spool.close()
    assert spool.flush(timeout=2) == (0, 0)
    assert spool_files(tmp_path / "spool") == []  # delivered segments and acks are deleted


def test_endpoint_down_loses_nothing_and_keeps_order(
    make_spool: Callable[..., Spool], endpoint: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint.stop()
    spool = make_spool()
    events = lineage_events(runs=4)
    for event in events:
        assert spool.append(event)  # never raises, even with the backend down
    wait_until(lambda: len(spool_warnings(caplog, "unreachable")) >= 1)
    time.sleep(0.3)  # several retries with backoff meanwhile
    assert spool.pending() == len(events)
    warnings = spool_warnings(caplog, "unreachable")
    assert len(warnings) == 1, "one warning per outage, not one per retry"
    assert "\n" not in warnings[0]

    endpoint.start()
    result = spool.flush(timeout=10)
    assert result.pending == 0
    received = endpoint.received()
    assert len(received) == len(events), "each event delivered exactly once"
    assert [sent_form(e) for e in received] == [sent_form(e) for e in events]
    by_run: dict[str, list[str]] = {}
    for event in received:
        by_run.setdefault(event["run"]["runId"], []).append(event["eventType"])
    assert all(types == ["START", "COMPLETE"] for types in by_run.values())


def test_backlog_survives_a_killed_process(
    make_spool: Callable[..., Spool], endpoint: Endpoint, tmp_path: Path
) -> None:
    endpoint.stop()
    directory = tmp_path / "spool"
    child = textwrap.dedent(
        f"""
        import os
        from roar_core.pipeline.spool import Spool
        from tests.core.test_spool import lineage_events
        spool = Spool({str(directory)!r}, backoff_initial=0.01)
        for event in lineage_events(runs=2):
            assert spool.append(event)
        os._exit(0)  # like SIGKILL: no atexit, no close, sender thread mid-retry
        """
    )
    env = {**os.environ, "OPENLINEAGE_URL": endpoint.url, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", child], cwd=REPO, env=env, check=True, timeout=60)

    endpoint.start()
    result = make_spool(directory, start=False).flush(timeout=10)
    assert result == (6, 0)
    received = endpoint.received()
    assert [e["eventType"] for e in received] == ["START"] * 3 + ["COMPLETE"] * 3
    assert received[0]["job"]["name"] == "wf" and received[-1]["job"]["name"] == "wf"


def test_truncated_last_line_keeps_complete_records(
    make_spool: Callable[..., Spool],
    endpoint: Endpoint,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer = make_spool(start=False)
    events = lineage_events(runs=1)
    for event in events:
        writer.append(event)
    writer.close()  # the writer is gone: its segment is sealed
    (segment,) = (tmp_path / "spool").glob("*.jsonl")
    with open(segment, "ab") as f:  # a crash in the middle of writing a record
        f.write(b'{"t":99,"event":{"eventTime":"2026-03-01T12:00:09+00:00","eventTy')

    result = make_spool(start=False).flush(timeout=10)
    assert result == (len(events), 0)
    assert [sent_form(e) for e in endpoint.received()] == [sent_form(e) for e in events]
    reports = spool_warnings(caplog, "unreadable spool record")
    assert len(reports) == 1 and "\n" not in reports[0]
    assert "truncated" in reports[0] and segment.name in reports[0]
    assert spool_files(tmp_path / "spool") == []


def test_malformed_line_is_skipped_and_reported(
    make_spool: Callable[..., Spool],
    endpoint: Endpoint,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = lineage_events(runs=0)
    writer = make_spool(start=False)
    writer.append(first)
    (segment,) = (tmp_path / "spool").glob("*.jsonl")
    with open(segment, "ab") as f:
        f.write(b"\x00\x00garbage\n")  # not a record at all
        f.write(b'{"t":5,"event":{not json}}\n')  # a record whose event is unreadable
    writer.append(em.to_dict(second))  # plain dicts are accepted too
    writer.close()
    assert make_spool(start=False).flush(timeout=10) == (2, 0)
    assert [sent_form(e) for e in endpoint.received()] == [sent_form(first), sent_form(second)]
    reports = spool_warnings(caplog, "unreadable spool record")
    assert len(reports) == 2
    assert "malformed record" in reports[0] and "not JSON" in reports[1]


def test_partial_line_of_a_live_writer_is_not_touched(
    make_spool: Callable[..., Spool],
    endpoint: Endpoint,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Another process holds its segment (flock) and is in the middle of writing a record.
    directory = tmp_path / "spool"
    directory.mkdir()
    first, second = (
        b'{"t":%d,"event":%s}\n' % (i, em.to_json(e).encode())
        for i, e in enumerate(lineage_events(runs=0), 1)
    )
    segment = directory / f"{time.time_ns():020d}-1-abcd.jsonl"
    fd = os.open(segment, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, first + second[:40])
    spool = make_spool(directory, start=False)
    assert spool.flush(timeout=10) == (1, 0)
    assert spool_warnings(caplog, "unreadable") == []
    os.write(fd, second[40:])
    os.close(fd)  # the writer finishes and goes away
    assert spool.flush(timeout=10) == (1, 0)
    assert [e["eventType"] for e in endpoint.received()] == ["START", "COMPLETE"]
    assert spool_files(directory) == []


def test_records_straddling_read_chunks_come_back_whole_with_their_offsets(
    tmp_path: Path,
) -> None:
    # Records of many sizes, some bigger than a read chunk, so that lines start, end and
    # span chunk boundaries anywhere; then a torn last line of a writer that is gone.
    from roar_core.pipeline import spoolfiles

    directory = tmp_path / "spool"
    directory.mkdir()
    bodies = [orjson.dumps({"n": i, "pad": "x" * (i * 997 % (3 * spoolfiles._CHUNK))})
              for i in range(60)]
    segment = directory / f"{time.time_ns():020d}-1-abcd.jsonl"
    lines = [b'{"t":%d,"event":%s}\n' % (i + 1, body) for i, body in enumerate(bodies)]
    torn = b'{"t":99,"event":{"half'
    segment.write_bytes(b"".join(lines) + torn)
    assert segment.stat().st_size > 20 * spoolfiles._CHUNK

    seg = spoolfiles.Segment(segment, sealed=True, size=segment.stat().st_size, acked=0)
    records = list(seg.records())
    assert [r.body for r in records[:-1]] == bodies
    assert [r.t for r in records[:-1]] == list(range(1, 61))
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    spans = list(zip(starts[:-1], starts[1:], strict=True))
    assert [(r.start, r.end) for r in records[:-1]] == spans
    last = records[-1]
    assert last.problem is not None and "truncated" in last.problem
    assert (last.start, last.end, last.body) == (starts[-1], starts[-1] + len(torn), torn)
    # From an ack in the middle: the rest, at the same offsets.
    seg = spoolfiles.Segment(segment, sealed=False, size=starts[-1] + 10, acked=starts[30])
    assert [(r.t, r.start) for r in seg.records()] == [(i + 1, starts[i]) for i in range(30, 60)]


def test_records_many_chunks_long_and_ending_on_a_chunk_edge_come_back_whole(
    tmp_path: Path,
) -> None:
    # A task of thousands of files is one record of megabytes: lines of several whole
    # chunks without a newline, a newline that is a chunk's last byte, one that is its
    # first, and a torn tail of several chunks.
    from roar_core.pipeline import spoolfiles

    chunk = spoolfiles._CHUNK
    envelope = len(b'{"t":1,"event":}\n')
    # (line lengths: 5 chunks, 1 chunk, 1 chunk and a byte, short, 3 chunks and more)
    sizes = [5 * chunk - envelope, chunk - envelope, chunk + 1 - envelope, 7, 3 * chunk + 5]
    bodies = [orjson.dumps({"pad": "x" * (n - 10)}) for n in sizes]
    lines = [b'{"t":%d,"event":%s}\n' % (i + 1, body) for i, body in enumerate(bodies)]
    torn = b'{"t":9,"event":{"pad":"' + b"y" * (3 * chunk)
    segment = tmp_path / f"{time.time_ns():020d}-1-abcd.jsonl"
    segment.write_bytes(b"".join(lines) + torn)
    ends, edge = [], 0
    for line in lines:
        edge += len(line)
        ends.append(edge)
    assert any(e % chunk == 0 for e in ends) and any(e % chunk == 1 for e in ends)

    seg = spoolfiles.Segment(segment, sealed=True, size=segment.stat().st_size, acked=0)
    *whole, last = seg.records()
    assert [r.body for r in whole] == bodies
    assert [r.problem for r in whole] == [None] * len(bodies)
    assert [r.end for r in whole] == ends
    assert last.problem is not None and "truncated" in last.problem
    assert (last.start, last.end, last.body) == (ends[-1], ends[-1] + len(torn), torn)


def test_invalid_event_is_set_aside_not_retried_forever(
    make_spool: Callable[..., Spool],
    endpoint: Endpoint,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    endpoint.status = lambda event: 400 if event["job"]["name"] == "wf.task0" else 201
    events = lineage_events(runs=2)
    spool = make_spool(start=False)
    for event in events:
        spool.append(event)
    assert spool.flush(timeout=10) == (len(events) - 2, 0)
    assert {e["job"]["name"] for e in endpoint.received()} == {"wf", "wf.task1"}
    rejected = (tmp_path / "spool" / "rejected.jsonl").read_text().splitlines()
    assert len(rejected) == 2
    assert all("HTTP 400" in json.loads(line)["reason"] for line in rejected)
    assert json.loads(rejected[0])["event"]["job"]["name"] == "wf.task0"
    assert len(spool_warnings(caplog, "set aside")) == 2


def test_server_errors_are_retried_in_order(
    make_spool: Callable[..., Spool], endpoint: Endpoint
) -> None:
    failures = iter([503, 500, 502])
    endpoint.status = lambda event: next(failures, 201)
    events = lineage_events(runs=1)
    spool = make_spool(start=False)
    for event in events:
        spool.append(event)
    assert spool.flush(timeout=10) == (len(events), 0)
    assert endpoint.posts == len(events) + 3
    assert [sent_form(e) for e in endpoint.received()] == [sent_form(e) for e in events]


@pytest.mark.parametrize(
    "settings",
    [
        {"OPENLINEAGE_URL": "{url}"},
        {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": "{url}"},
    ],
)
def test_client_configured_the_standard_ways(
    settings: dict[str, str], endpoint: Endpoint, tmp_path: Path
) -> None:
    for name, value in settings.items():
        os.environ[name] = value.format(url=endpoint.url)
    with Spool(tmp_path / "spool", exit_flush_timeout=0) as spool:
        spool.append(lineage_events(runs=0)[0])
        wait_until(lambda: len(endpoint.received()) == 1)


def test_openlineage_yml_is_read(endpoint: Endpoint, tmp_path: Path) -> None:
    (tmp_path / "openlineage.yml").write_text(f"transport:\n  type: http\n  url: {endpoint.url}\n")
    with Spool(tmp_path / "spool", start=False) as spool:
        spool.append(lineage_events(runs=0)[0])
        assert spool.flush(timeout=10) == (1, 0)


def test_unconfigured_client_holds_events(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # With no configuration the client would "deliver" by printing: keep the events instead.
    with Spool(tmp_path / "spool", start=False) as spool:
        for event in lineage_events(runs=0):
            spool.append(event)
        assert spool.flush(timeout=1) == (0, 2)
        assert spool.flush(timeout=1) == (0, 2)
    assert len(spool_warnings(caplog, "no OpenLineage transport configured")) == 1


def test_openlineage_disabled_consumes_events(tmp_path: Path) -> None:
    os.environ["OPENLINEAGE_DISABLED"] = "true"
    with Spool(tmp_path / "spool", start=False) as spool:
        for event in lineage_events(runs=0):
            spool.append(event)
        assert spool.flush(timeout=1) == (2, 0)


def test_unwritable_spool_warns_instead_of_raising(
    make_spool: Callable[..., Spool], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = make_spool()
    (tmp_path / "spool").rmdir()
    (tmp_path / "spool").write_text("")  # not a directory any more (works even as root)
    assert spool.append(lineage_events(runs=0)[0]) is False
    assert len(spool_warnings(caplog, "could not spool")) == 1


def test_a_spool_whose_directory_was_in_the_way_takes_events_once_it_is_cleared(
    make_spool: Callable[..., Spool], endpoint: Endpoint, tmp_path: Path
) -> None:
    """A file where the spool's directory goes (a full disk's stand-in) refuses events; once
    it is gone, the same spool makes its directory and takes them (a long-lived recorder
    kept refusing them until it restarted)."""
    (tmp_path / "spool").write_text("")
    spool = make_spool()
    events = lineage_events(runs=1)
    assert spool.append(events[0]) is False
    assert spool.flush(timeout=5) == (0, 0)  # nothing to send, and no error
    (tmp_path / "spool").unlink()
    assert all(spool.append(e) for e in events)
    assert spool.flush(timeout=5).pending == 0
    wait_until(lambda: len(endpoint.received()) == len(events))
    assert [sent_form(e) for e in endpoint.received()] == [sent_form(e) for e in events]


def test_forked_child_writes_its_own_segment(
    make_spool: Callable[..., Spool], endpoint: Endpoint, tmp_path: Path
) -> None:
    first, second = lineage_events(runs=0)
    spool = make_spool(start=False)
    spool.append(first)
    pid = os.fork()
    if pid == 0:  # Airflow runs tasks in a fork of the worker: the child spools too
        os._exit(0 if spool.append(second) else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert len(list((tmp_path / "spool").glob("*.jsonl"))) == 2
    assert spool.flush(timeout=10) == (2, 0)
    assert [e["eventType"] for e in endpoint.received()] == ["START", "COMPLETE"]


def test_a_pass_acks_each_segment_once(
    make_spool: Callable[..., Spool], endpoint: Endpoint, tmp_path: Path
) -> None:
    # A flush delivers the whole backlog in one pass: one durable ack for the segment, not
    # one per event (a sender of many small tasks' events would sync twice per task).
    spool = make_spool(start=False)
    events = lineage_events(runs=4)
    for event in events:
        assert spool.append(event)
    (segment,) = (tmp_path / "spool").glob("*.jsonl")
    assert spool.flush(timeout=5) == (len(events), 0)
    assert [sent_form(e) for e in endpoint.received()] == [sent_form(e) for e in events]
    ack = segment.with_name(segment.name + ".ack").read_bytes()
    assert ack == b"%d\n" % segment.stat().st_size


def test_flush_waits_out_another_sender_without_a_backoff(
    make_spool: Callable[..., Spool], endpoint: Endpoint, tmp_path: Path
) -> None:
    """A flush that finds another process sending from the spool (a recorder between its
    passes holds the sender lock) looks again as soon as that sender is done: nothing
    failed, so no backoff (here one far longer than the flush's timeout, which used to
    run it out and return with the backlog unsent)."""
    spool = make_spool(start=False, backoff_initial=30.0, backoff_max=30.0)
    events = lineage_events()
    for event in events:
        assert spool.append(event)
    other = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import fcntl, os, sys, time
        fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(0.3)
        """), str(tmp_path / "spool" / SENDER_LOCK)], stdout=subprocess.PIPE, text=True)
    assert other.stdout.readline() == "held\n"
    result = spool.flush(timeout=10)
    other.wait()
    assert result.pending == 0 and result.sent == len(events)
    assert [sent_form(e) for e in endpoint.received()] == [sent_form(e) for e in events]


def test_an_event_too_slow_for_the_backend_is_set_aside_and_the_rest_go(
    endpoint: Endpoint, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A backend reading at 1 MB/s, a client that waits 0.5 s: a 1.5 MB COMPLETE times out
    every time.  It is tried SLOW_TRIES times, then set aside; the events behind it go
    (they were blocked for good)."""
    from roar_core.pipeline.spool import SLOW_TRIES

    endpoint.read_rate = 1_000_000
    big = em.complete_event(em.TaskLineage(
        namespace="ns", job_name="big", run_id=em.new_run_id(), event_time=T0,
        outputs=[em.Dataset("file", f"/data/{i:06d}/" + "x" * 60, digest=f"{i:064x}", size=i)
                 for i in range(8000)]))
    small = lineage_events(runs=1)
    ol = OpenLineageClient(transport=HttpTransport(HttpConfig(url=endpoint.url, timeout=0.5)))
    spool = Spool(tmp_path / "spool", ol, start=False, backoff_initial=0.02, backoff_max=0.2)
    try:
        spool.append(big)
        for event in small:
            spool.append(event)
        assert len(orjson.dumps(big)) > 1_200_000
        assert spool.flush(timeout=30) == (len(small), 0)
    finally:
        spool.close()
    assert [sent_form(e) for e in endpoint.received()] == [sent_form(e) for e in small]
    rejected = (tmp_path / "spool" / "rejected.jsonl").read_text().splitlines()
    assert len(rejected) == 1
    assert json.loads(rejected[0])["event"]["job"]["name"] == "big"
    assert f"{SLOW_TRIES} tries" in json.loads(rejected[0])["reason"]
    assert len(spool_warnings(caplog, "too big or too slow")) == 1


@pytest.mark.parametrize("damage", [b"99999999999\n", b"7\n", b"\x00\xff\x13garbage\n12",
                                    b"40\n2\n"])
def test_a_damaged_ack_file_costs_resends_never_events(
    make_spool: Callable[..., Spool], endpoint: Endpoint, tmp_path: Path, damage: bytes
) -> None:
    """An offset past the segment, or inside a record: the events are sent (it read as
    all delivered, and every pending event was dropped)."""
    events = lineage_events(runs=2)
    spool = make_spool(start=False)
    for event in events:
        spool.append(event)
    spool.close()
    (segment,) = sorted((tmp_path / "spool").glob("*.jsonl"))
    (tmp_path / "spool" / (segment.name + ".ack")).write_bytes(damage)
    again = make_spool(start=False)
    assert again.pending() == len(events)
    assert again.flush(timeout=10) == (len(events), 0)
    assert [sent_form(e) for e in endpoint.received()] == [sent_form(e) for e in events]


def test_a_big_event_goes_out_whole_through_short_writes(tmp_path: Path, monkeypatch) -> None:
    """Events are written as pieces (no copy of a megabyte event per envelope): whatever
    the kernel takes of each writev, the spooled line is the event, whole and in order,
    and the staged copy a recorder keeps is too."""
    from roar_core.pipeline import spoolfiles

    real = os.writev
    calls = []

    def short(fd: int, buffers: list) -> int:  # at most 4 KiB, and never a whole call
        calls.append(len(buffers))
        data = b"".join(bytes(b) for b in buffers)
        return real(fd, [data[: max(1, min(4096, len(data) - 1))]])

    monkeypatch.setattr(spoolfiles.os, "writev", short)
    event = em.complete_event(em.TaskLineage(
        namespace="ns", job_name="job", run_id="01a2b3c4-0000-7000-8000-000000000001",
        outputs=[em.Dataset("file", f"/data/f{i:06d}", digest="ab" * 32, size=4096)
                 for i in range(3000)]))
    encoded = em_encode(event)
    assert len(encoded) > 1 << 20
    spool = Spool(tmp_path / "spool", start=False)
    try:
        assert spool.append(encoded)
    finally:
        spool.close()
    assert len(calls) > 100  # it did go out in short writes
    (segment,) = sorted((tmp_path / "spool").glob("*.jsonl"))
    lines = segment.read_bytes().splitlines()
    assert len(lines) == 1
    assert orjson.loads(lines[0])["event"] == orjson.loads(encoded)

    parts = [b"x" * 5000, b"", b"yz", *(bytes([65 + i % 26]) for i in range(2500))]
    monkeypatch.setattr(spoolfiles, "_IOV_MAX", 7)
    fd = os.open(tmp_path / "staged", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        spoolfiles.write_all(fd, parts)
    finally:
        os.close(fd)
    assert (tmp_path / "staged").read_bytes() == b"".join(parts)


def em_encode(event: Any) -> bytes:
    from roar_core.pipeline.spool import encode

    return encode(event)
