"""In-memory sessions (tmpfs: RAM until the next reboot) left behind by an engine or a
worker that died are swept away when a new one is made; sessions in use are not."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path

import pytest

from roar_core import config
from roar_core.recording.sessions import (
    OWNER_LOCK,
    STALE_AFTER_S,
    hold_owner_lock,
    new_session_dir,
    sweep_stale_sessions,
)

OLD = time.time() - STALE_AFTER_S - 60


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _session(base: Path, name: str, logs: list[int] = (), old: bool = True,
             sub: str | None = None) -> Path:
    d = base / name
    where = d / sub if sub else d
    where.mkdir(parents=True)
    for pid in logs:
        (where / f"roar-{pid}-12345.log").write_bytes(b"\0" * 4096)
    if old:
        for p in (where, d):
            os.utime(p, (OLD, OLD))
    return d


def test_left_by_dead_processes_is_swept_in_use_is_kept(tmp_path: Path) -> None:
    dead = _dead_pid()
    gone = _session(tmp_path, "airflow-h-1", logs=[dead])
    gone_remote = _session(tmp_path, "remote-1", logs=[dead], sub="run-1")
    empty_remote = _session(tmp_path, "remote-2")
    live = _session(tmp_path, "airflow-h-2", logs=[dead, os.getpid()])
    live_child = _session(tmp_path, "remote-3", logs=[os.getpid()], sub="run-3")
    fresh = _session(tmp_path, "airflow-h-3", old=False)  # exported, worker not started yet
    removed = list(map(Path, sweep_stale_sessions(tmp_path)))
    assert sorted(removed) == sorted([gone, gone_remote, empty_remote])
    for d in (live, live_child, fresh):
        assert d.is_dir()
    assert not gone.exists() and not gone_remote.exists()


def test_a_held_lock_keeps_a_session(tmp_path: Path) -> None:
    # An engine's owner.lock (RemoteRoar), or a recorder service's lock.
    owned = _session(tmp_path, "remote-9")
    fd = hold_owner_lock(owned)
    os.utime(owned, (OLD, OLD))
    service = _session(tmp_path, "airflow-h-9")
    sfd = os.open(service / "recorder-abc.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(sfd, fcntl.LOCK_EX)
    os.utime(service, (OLD, OLD))
    try:
        assert sweep_stale_sessions(tmp_path) == []
    finally:
        os.close(fd)
        os.close(sfd)
    # Their holders gone (the lock files stay behind): stale.
    assert (owned / OWNER_LOCK).exists()
    for d in (owned, service):
        os.utime(d, (OLD, OLD))
    assert sorted(map(Path, sweep_stale_sessions(tmp_path))) == sorted([owned, service])


def test_new_in_memory_session_sweeps_first(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    cfg = config.load(env={"ROAR_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    first = Path(new_session_dir(cfg, "airflow-h-1", in_memory=True))
    assert first.parent == run / "roar"
    (first / f"roar-{_dead_pid()}-1.log").write_bytes(b"")
    os.utime(first, (OLD, OLD))
    second = Path(new_session_dir(cfg, "airflow-h-2", in_memory=True))
    assert second.is_dir() and not first.exists()


def test_a_finished_engines_unrecorded_session_is_recorded_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A Snakemake run on a full disk keeps its jobs' lineage in its session, in RAM, for
    # the next recorder.  The sweep started one only for sessions untouched for an hour:
    # the lineage waited that long, and a reboot meanwhile lost it.
    from roar_core.api import Roar
    from roar_core.recording import recorder, tasklog
    from tests.core.test_recording_contract import Producer, engine_session

    base = tmp_path / "memory"
    cfg, session = engine_session(tmp_path, monkeypatch, base / "snakemake-1")
    (tmp_path / "in.txt").write_text("data\n")
    producer = Producer(session, tmp_path)
    try:
        producer.task(1, tmp_path / "in.txt", tmp_path / "out.txt", "x")
    finally:
        producer.kill()  # (as an engine whose recorder failed: its task left in its log)
    assert tasklog.log_paths(session)
    assert sweep_stale_sessions(base) == []  # not stale: kept, and recorded
    deadline = time.monotonic() + 60
    while tasklog.log_paths(session):
        assert time.monotonic() < deadline, "not recorded"
        time.sleep(0.05)
    recorder.wait_gone(session, time.monotonic() + 30, exited=True)
    roar = Roar(cfg, send=False)
    try:
        (run,) = roar.store.task_runs()
    finally:
        roar.close(timeout=0)
    assert run.run_id == "0190b000-0000-7000-8000-000000000001" and run.status == "COMPLETE"
    assert session.is_dir()  # removed by a later sweep, once stale
