"""SessionCollector for one task process of a long-lived traced worker: only logs created
since the task began (plus the process's own, from where it stood), read by name first."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from roar_core.pipeline import tracelog, tracer
from roar_core.recording.sessions import SessionCollector

# Before the task: an untagged write and a child; then the task: a write and a child.
SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, time
    from roar_core.pipeline import tracelog, tracer
    data = sys.argv[1]
    shim = tracer.loaded()
    open(os.path.join(data, "before.txt"), "w").close()
    subprocess.run(["touch", os.path.join(data, "before-child.txt")], check=True)
    own = shim.log_path()
    print(own, tracelog.read_header(own).reserved, time.monotonic_ns(), os.getpid(), flush=True)
    shim.begin("T")
    open(os.path.join(data, "during.txt"), "w").close()
    subprocess.run(["touch", os.path.join(data, "during-child.txt")], check=True)
    shim.end()
""")


def test_started_since_reads_the_name(tmp_path: Path) -> None:
    names = ["roar-10-500.log", "roar-11-1500.log", "roar-11-500.log", "roar-x.log",
             "other.log"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "roar-12-2000.log").mkdir()  # not a file
    found = [os.path.basename(p) for p in tracelog.log_files(tmp_path, since_mono_ns=1000, pid=10)]
    # The root's own log, one created since, and one not named by the shim (kept).
    assert found == ["roar-x.log", "roar-10-500.log", "roar-11-1500.log"]
    assert [os.path.basename(p) for p in tracelog.log_files(tmp_path)] == [
        "roar-x.log", "roar-10-500.log", "roar-11-500.log", "roar-11-1500.log"]
    assert tracelog.log_files(tmp_path / "gone") == []


def test_task_of_a_long_lived_process(tmp_path: Path) -> None:
    if not tracer.status().usable:
        pytest.skip(tracer.status().reason)
    session, data = tmp_path / "s", tmp_path / "d"
    session.mkdir()
    data.mkdir()
    env = tracer.preload_env(session)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(data)], env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()
    own, offset, began, pid = out[0], int(out[1]), int(out[2]), int(out[3])
    time.sleep(0.05)
    collector = SessionCollector(session, root_pid=pid, since_mono_ns=began)
    collector.skip(own, offset)
    collector.collect()
    task = collector.take("T")
    paths = {os.path.basename(r.path) for r in task.records}
    assert {b"during.txt", b"during-child.txt"} <= paths
    everything = {os.path.basename(r.path) for r in collector.take("").records}
    assert not {b"before.txt", b"before-child.txt"} & (paths | everything)
