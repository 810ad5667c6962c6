"""The node's recorder: one process per node and job, following the workers' task journals
(roar_core.journal.Follower) and recording every task -- classification, hashing, store,
spool -- off the workers.

A worker that finds none running starts it (`ensure`); a lock in the node's session
directory keeps it to one.  It runs at the lowest CPU priority (the tasks come first; the
end-of-job drain waits for it to catch up), outside any task and untraced, and exits once
every worker of the directory is gone and all they ran is recorded.

    python -m roar_ray.recorder NODE_SESSION_DIR [INTERNAL_DIR...]
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from roar_core import journal
from roar_core.session import lock_held, yield_cpu

LOCK = "recorder.lock"
ENDING = "job-ending"  # written at the end of the job: actors dying now simply ended
LOG = "recorder.log"
STATUS = "recorder.status"  # when the last pass that held nothing back began (time.time())
SEND_S = 1.0  # at most this long sending events between two passes
SEND_EVERY_S = 0.25  # while tasks keep ending: events sent in batches, each with fixed costs
# While tasks keep ending, the spool is synced once a second, not once a pass: on a
# journaling file system every fsync also writes out the files the tasks just wrote, and
# the tasks wait on that (measured: Ray io10 on ext4 1.14 with a sync per pass, 1.08
# without).  An OS crash may lose the last second of events; the journals, in memory,
# go with it anyway.
SYNC_S = 1.0
PASS_S = 0.05
IDLE_EXIT_S = 5.0  # with every journal done: how long to wait for a new worker first
_SPAWN_LOCK = threading.Lock()


def running(node_dir: Path) -> bool:
    return lock_held(node_dir / LOCK)


def ensure(node_dir: Path, internal: list[str]) -> None:
    """Start the node's recorder unless one runs (a second one exits at once)."""
    if running(node_dir):
        return
    with _SPAWN_LOCK:
        # From a thread the tracer ignores: the shim then leaves the child's environment
        # alone (no LD_PRELOAD put back), so the recorder is not traced.
        t = threading.Thread(target=_spawn, args=(node_dir, internal), name="roar-spawn")
        t.start()
        t.join()


def _spawn(node_dir: Path, internal: list[str]) -> None:
    from roar_core import tracer

    tracer.ignore_this_thread()
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", tracer.ENV_SESSION, tracer.ENV_TAG)}
    env[tracer.ENV_DISABLE] = "1"  # should the shim come back anyway, it records nothing
    # Through a shell that backgrounds it and exits: the recorder is nobody's child then,
    # in a session of its own, so Ray's clean-up of a dying worker's children and process
    # group leaves it alone (it has the job's dead workers to record).
    script = '"$@" </dev/null >/dev/null 2>>"$0" &'
    subprocess.run(["/bin/sh", "-c", script, str(node_dir / LOG), sys.executable, "-m",
                    "roar_ray.recorder", str(node_dir), *internal],
                   env=env, stdin=subprocess.DEVNULL, start_new_session=True, check=False)


def status_time(node_dir: Path) -> float:
    """When the recorder's last pass that recorded all it found began (0: none yet)."""
    try:
        return float((node_dir / STATUS).read_text())
    except (OSError, ValueError):
        return 0.0


def wait_recorded(node_dir: Path, deadline: float) -> bool:
    """Wait until everything the workers there journaled so far is recorded: a recorder
    pass that began after now has completed (a pass records all it reads).  False at the
    deadline."""
    since = time.time()
    while time.monotonic() < deadline:
        if status_time(node_dir) > since or not journal.journal_paths(node_dir):
            return True
        time.sleep(0.05)
    return False


def wait_gone(node_dir: Path, deadline: float) -> bool:
    """After the job: wait until the recorder has recorded what the dead workers left and
    exited."""
    while time.monotonic() < deadline:
        if not running(node_dir) or not journal.journal_paths(node_dir):
            return True
        time.sleep(0.05)
    return False


def drain_node(session_root: str, timeout: float, ending: bool = False) -> dict[str, Any]:
    """On one node: wait until its recorder has recorded what the job's workers there ran
    and what dead ones left.  Runs as a task of the job, not itself traced (worker.py)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    node_dir = Path(session_root) / node
    done = True
    if journal.journal_paths(node_dir):
        gw = ray._private.worker.global_worker
        ensure(node_dir, [gw.node.get_temp_dir_path()] if gw.node else [])
        done = wait_recorded(node_dir, time.monotonic() + timeout)
    if ending:
        (node_dir / ENDING).touch()
    return {"node": node, "done": done}


def main(argv: list[str]) -> int:
    node_dir = Path(argv[0])
    lock = os.open(node_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another one follows this directory
    yield_cpu()
    import json
    import logging

    from roar_core.api import Roar
    from roar_core.journal import CausalOrder, Follower, journal_paths
    from roar_ray import _env

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    job = _env.job_context(os.environ)
    raw = os.environ.get(_env.SETTINGS_VAR)
    cfg = _env.load_config(_env.check_settings(json.loads(raw) if raw else None), job)
    # It sends the events itself, between passes (Spool.send_some): no sender thread.
    roar = Roar(cfg, internal=argv[1:], send=False)
    ending = node_dir / ENDING
    # The job's other nodes' recorders: a consumer's events after its producer's.
    order = CausalOrder(roar.store, job["run_id"], node_dir.name) if job else None
    follower = Follower(roar, node_dir, lifetime_status=lambda: (
        "COMPLETE" if ending.exists() else "ABORT"), sync_every=SYNC_S, order=order)
    idle_since = time.monotonic()
    # Rewritten in place, padded to one length, never renamed over: a new entry in the
    # directory would make every worker there list it again for its next task.
    status = os.open(node_dir / STATUS, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    next_send = next_mark = 0.0
    try:
        while True:
            began = time.time()
            recorded = follower.poll()
            if follower.held_from is None:  # all that ended before `began` is recorded
                os.pwrite(status, f"{began:<24.6f}".encode(), 0)
            if not recorded or began >= next_send:
                # Everything recorded so far out of the spool: our mark can move on.
                sent = roar.spool.send_some(SEND_S) if roar.spool is not None else True
                next_send = began + SEND_EVERY_S
                if order is not None and sent and began >= next_mark:
                    mark = datetime.fromtimestamp(began, timezone.utc)
                    order.advance(min(mark, follower.held_from or mark))
                    next_mark = began + SEND_EVERY_S
            if recorded:
                idle_since = time.monotonic()
                # Passes at least PASS_S apart: a pass has fixed costs (journals, logs and
                # spool looked at), which passes of one or two tasks each paid per task.
                time.sleep(max(0.0, began + PASS_S - time.time()))
                continue
            if not follower.pending() and not journal_paths(node_dir):
                if ending.exists() or time.monotonic() - idle_since > IDLE_EXIT_S:
                    return 0
            else:
                idle_since = time.monotonic()
            time.sleep(0.05)
    finally:
        follower.sync()
        os.close(status)
        if roar.spool is not None:
            roar.spool.flush(30)
        if order is not None:
            order.advance(datetime.now(timezone.utc), done=True)
        roar.close(timeout=0)  # its events: flushed above, before the mark said so


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
