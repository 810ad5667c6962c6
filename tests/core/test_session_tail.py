"""`roar-core run --wait` reads the session's logs while the command runs (run_traced's
tail), and what it has read, with the rest read once the command has ended, is the
command's whole trace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from roar_core import tracelog, tracer
from roar_core.session import SessionCollector, run_traced


def _usable() -> None:
    if not tracer.status().usable:
        pytest.skip(tracer.status().reason)


class _Watched(SessionCollector):
    """Counts the records it holds after each read made while the command runs."""

    def __init__(self, directory: Path):
        super().__init__(directory)
        self.held: list[int] = []

    def collect(self, settle: bool = False, live: bool = False) -> None:
        super().collect(settle, live)
        self.held.append(sum(len(r) for r in self._pending.values()))


def test_logs_are_read_while_the_command_runs(tmp_path: Path) -> None:
    _usable()
    session = tmp_path / "s"
    session.mkdir()
    watched = _Watched(session)
    rc = run_traced(["sh", "-c", "echo x > out.txt; sleep 0.5; echo y > late.txt"], session,
                    "T", cwd=tmp_path, tail=watched)
    assert rc == 0
    # out.txt's records were read during the half-second sleep, before the command ended.
    assert any(n > 0 for n in watched.held), watched.held
    watched.collect(settle=True)
    names = {os.path.basename(r.path) for r in watched.take_all().records}
    assert {b"out.txt", b"late.txt"} <= names


def test_a_log_still_being_created_is_not_an_error_until_the_end(tmp_path: Path) -> None:
    # The shim creates a log, then sizes it and writes its header: a read in between sees
    # a short file.  While processes may be starting it is looked at again later; once
    # the command has ended, a log still unreadable is reported (and counted).
    session = tmp_path / "s"
    session.mkdir()
    (session / "roar-4242-1.log").write_bytes(b"")
    collector = SessionCollector(session)
    collector.collect(live=True)
    assert collector.errors == []
    collector.collect(settle=True)
    assert len(collector.errors) == 1 and "roar-4242-1.log" in collector.errors[0]
    assert collector.logs_read == 0


def test_run_wait_records_the_whole_trace_read_during_and_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _usable()
    from roar_core import config
    from roar_core.api import Roar
    from roar_core.runner import run_command

    cfg = config.load(env={"ROAR_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    (tmp_path / "in.txt").write_text("in\n")
    script = ("cat in.txt > a.txt; sleep 0.3; "
              "for i in 1 2 3; do echo $i > b$i.txt; sleep 0.05; done; cat a.txt > c.txt")
    monkeypatch.chdir(tmp_path)
    roar = Roar(cfg)
    try:
        result = run_command(roar, ["sh", "-c", script], "tail")
    finally:
        roar.close(timeout=5)
    assert result.returncode == 0 and result.error is None
    io = result.recorded.io
    assert [os.path.basename(a.path) for a in io.inputs] == [b"in.txt"]
    assert sorted(os.path.basename(a.path) for a in io.outputs) == [
        b"a.txt", b"b1.txt", b"b2.txt", b"b3.txt", b"c.txt"]
    assert result.recorded.outcome.dropped == 0


def test_a_log_read_many_times_counts_its_lost_events_once(tmp_path: Path) -> None:
    # A live process's log: the shim counts the events it could not log in the header.
    session = tmp_path / "s"
    session.mkdir()
    header = tracelog._HEADER.pack(tracelog.MAGIC, tracelog.VERSION, tracelog.HEADER_SIZE,
                                   tracelog.CHUNK, 0, os.getpid(), os.getppid(), 1, 1, 0, 3,
                                   0, 0)
    (session / f"roar-{os.getpid()}-1.log").write_bytes(
        header.ljust(tracelog.HEADER_SIZE, b"\0"))
    collector = SessionCollector(session)
    for _ in range(3):
        collector.collect(live=True)
    collector.collect(settle=True)
    assert collector.take_all().dropped == 3
