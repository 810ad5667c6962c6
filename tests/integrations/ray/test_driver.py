"""The Ray driver's own failure: a driver killed mid-job leaves its run to a recorder, which
ends it ABORT, as it ends any dead producer's open work (issue 21's one failure policy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from roar_core.pipeline.store import Store
from tests.olschema import validate_event

DRIVER = """
import os, signal, ray

if {refused!r}:  # the spool's directory a plain file: it refuses every event (a full disk)
    os.makedirs({home!r}, exist_ok=True)
    open(os.path.join({home!r}, "spool"), "w").close()

ray.init(address={address!r}, runtime_env={{"roar": {{"home": {home!r}, "job_name": "killed"}}}})

@ray.remote
def work(dst):
    with open(dst, "w") as f:
        f.write("made before the driver died\\n")

ray.get(work.remote({out!r}))
os.kill(os.getpid(), signal.SIGKILL)  # no atexit, no roar_ray.finish: a real crash
"""


def _events(home) -> list[dict]:
    path = home / "openlineage" / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _stored_status(home) -> str | None:
    """The status of the one workflow run the store holds, once it holds one."""
    import sqlite3

    if not (home / "lineage.db").exists():
        return None
    db = sqlite3.connect(f"file:{home / 'lineage.db'}?mode=ro", uri=True, timeout=30)
    try:
        rows = db.execute("SELECT status FROM workflow_runs").fetchall()
    except sqlite3.OperationalError:  # not made yet
        return None
    finally:
        db.close()
    return rows[0][0] if rows else None


@pytest.mark.parametrize("refused", [False, True], ids=["spooled", "start-refused"])
def test_a_killed_driver_leaves_its_run_to_end_abort(cluster, tmp_path, refused):
    """`refused`: the spool refuses the run's START too, so the driver hands the START to
    the recorder with the run; once the spool takes events again, nothing is missing."""
    home, data = tmp_path / "roar", tmp_path / "data"
    data.mkdir()
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER.format(
        address=cluster.address, home=str(home), out=str(data / "out.txt"), refused=refused)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert (data / "out.txt").exists()
    if refused:
        deadline = time.monotonic() + 90
        while _stored_status(home) != "ABORT":
            assert time.monotonic() < deadline, "the recorder did not end the run"
            time.sleep(0.2)
        assert not _events(home)
        (home / "spool").unlink()  # the spool takes events again

    # (The node's recorder records the task on its own time: its events may come after
    # the run's end, which no drain by the dead driver orders.)
    deadline = time.monotonic() + 120
    while True:
        events = _events(home)
        jobs = [e for e in events if e["job"]["name"] == "killed"]
        kinds = {(e["job"]["name"], e["eventType"]) for e in events}
        if {("killed", "ABORT"), ("killed.work", "COMPLETE")} <= kinds or \
                time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [e["eventType"] for e in jobs] == ["START", "ABORT"], [
        (e["job"]["name"], e["eventType"]) for e in events]
    for e in events:
        validate_event(e)
    (run_id,) = {e["run"]["runId"] for e in jobs}
    # The task it ran before it died: recorded, under the job's run.
    (task,) = [e for e in events if e["job"]["name"].endswith("work")
               and e["eventType"] == "COMPLETE"]
    assert task["run"]["facets"]["parent"]["run"]["runId"] == run_id
    assert [o["name"] for o in task["outputs"]] == [str(data / "out.txt")]
    with Store.open(home=home) as store:
        run = store.workflow_run(run_id)
        assert run is not None and run.status == "ABORT" and run.ended_at is not None
