"""A background recorder killed at any point leaves a run that the next recorder
finishes exactly once (issue 17, item 1; issue 21: the CLI's runs go through the task log
and the recorder process every engine uses).

`roar-core run` leaves its run to the recorder; here that recorder is a real process
running the real loop, killed by SIGKILL at one point of recording: before the store,
inside its transaction, after its commit, between two events spooled, after the spool's
sync and before the run is marked recorded in its task log; and, as when a producer waits
for the run (its events made after the commit), after the commit and before the events are
made, and after they are staged; and after a START stored alone (a task running long)
and before it is spooled.  Then the user's next command
(`roar-core show`, which records what is pending) and `roar-core flush` must leave the run
stored once, ended, with its START and COMPLETE delivered."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import blake3
import pytest

from roar_core import config
from roar_core.cli import run as runner
from roar_core.recording import recorder, tasklog
from tests.core.test_cli import Cli, make_cli

KILLED_RECORDER = r"""
import os, signal, sys
from roar_core.pipeline import spool, store
from roar_core.recording import follower, recorder

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

def after(original):
    def run(*args, **kwargs):
        result = original(*args, **kwargs)
        die()
        return result
    return run

point = sys.argv[1]
if point == "before-store":
    store.Store.finish_task_run = die
elif point == "mid-store":  # the accesses are written, the transaction not committed
    store._record_accesses = after(store._record_accesses)
elif point == "after-store":  # committed, nothing spooled
    spool.Spool.append = die
elif point == "mid-spool":  # START spooled, COMPLETE not
    appended = spool.Spool.append
    calls = []
    def second_dies(self, event):
        calls.append(event)
        if len(calls) == 2:
            die()
        return appended(self, event)
    spool.Spool.append = second_dies
elif point == "after-spool":  # both events spooled and synced, the run not marked yet
    follower._Followed.flush_marks = die
elif point.startswith("waited-"):
    # As for a producer that waits for the task (`run --wait`): the recorder answers it at
    # the commit and makes the task's events after that.
    from roar_core.pipeline import writer as core

    record = core.LineageWriter.record
    def waited(self, *args, stored=None, **kwargs):
        return record(self, *args, stored=stored or (lambda task: None), **kwargs)
    core.LineageWriter.record = waited
    if point == "waited-after-commit":  # stored and answered, its events not made yet
        core.LineageWriter._events = die
    else:  # "waited-after-stage": its events made and staged, none spooled
        spool.Spool.append = die
elif point == "start-stored":  # a START stored alone (a task that ran long), not spooled
    def start_only(self, f, entry, task):
        self._start(f, entry)
    follower.Follower._record = start_only
    spool.Spool.append = die
elif point == "older-start":  # as a recorder of an older roar did: its START stored alone
    from roar_core.pipeline import writer as core

    def start_alone(self, meta, *args, **kwargs):
        self.started(meta)
        die()
    core.LineageWriter.record = start_alone
recorder.main(sys.argv[2:])
print("not killed")
"""

POINTS = ["before-store", "mid-store", "after-store", "mid-spool", "after-spool",
          "start-stored", "older-start", "waited-after-commit", "waited-after-stage"]


def left_pending(root: Path) -> tuple[Cli, config.Config]:
    """`roar-core run --job copy -- cp in.txt out.txt` that left its run to a recorder and
    started none (the recorder's lock held meanwhile: one seemed at it)."""
    cli = make_cli(root)
    cfg = config.load(cwd=cli.cwd, env=cli.env)
    (cli.cwd / "in.txt").write_text("data\n")
    os.makedirs(cfg.sessions_dir)
    held = os.open(os.path.join(cfg.sessions_dir, recorder.LOCK), os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        proc = cli("run", "--job", "copy", "--", "cp", "in.txt", "out.txt")
        assert proc.returncode == 0, proc.stderr
    finally:
        os.close(held)
    assert len(runner.pending(cfg)) == 1
    return cli, cfg


@pytest.mark.parametrize("point", POINTS)
def test_the_next_recorder_finishes_the_run_exactly_once(tmp_path: Path, point: str) -> None:
    cli, cfg = left_pending(tmp_path)

    killed = subprocess.run([sys.executable, "-c", KILLED_RECORDER, point,
                             str(cfg.sessions_dir)], cwd=cli.cwd, env=cli.env,
                            capture_output=True, timeout=60)
    assert killed.returncode == -9, killed.stdout + killed.stderr

    listing = cli("show")  # the next reader drains what is pending
    assert listing.returncode == 0, listing.stderr
    assert b"Traceback" not in listing.stderr and b"cannot record" not in listing.stderr
    runs = [line for line in listing.stdout.decode().splitlines() if " copy " in f" {line} "]
    assert len(runs) == 1 and "COMPLETE" in runs[0], listing.stdout.decode()
    run_id = runs[0].split()[-1]
    assert f"{cli.cwd / 'out.txt'}  blake3:" in cli.ok("show", run_id)
    assert runner.pending(cfg) == [] and not list(Path(cfg.sessions_dir).glob("run-*"))
    assert tasklog.log_paths(cfg.sessions_dir) == []

    assert cli.ok("flush").endswith("pending 0\n")
    events = Path(cli.env["ROAR_HOME"]) / "openlineage" / "events.jsonl"
    mine = [json.loads(line) for line in events.read_text().splitlines()]
    kinds = [e["eventType"] for e in mine if e["run"]["runId"] == run_id]
    if point in ("mid-spool", "after-spool"):
        # Killed with some of its events spooled: those go out again (at least once, in
        # order: nothing of the run after its COMPLETE).
        assert list(dict.fromkeys(kinds)) == ["START", "COMPLETE"] and kinds[-1] == "COMPLETE"
    else:
        assert kinds == ["START", "COMPLETE"]
    complete = next(e for e in mine if e["eventType"] == "COMPLETE")
    assert [o["name"] for o in complete["outputs"]] == [str(cli.cwd / "out.txt")]
    # The version is the bytes cp left, whoever recorded it.
    truth = blake3.blake3((cli.cwd / "out.txt").read_bytes()).hexdigest()
    assert complete["outputs"][0]["facets"]["version"]["datasetVersion"] == f"blake3:{truth}"

