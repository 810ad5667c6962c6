"""Ray: each task's versions are the content it read or left at its end, not what the next
task made of the file before the node's recorder got to it (the truth: blake3 of the bytes
each call wrote or saw, computed here)."""

from __future__ import annotations

import blake3
import ray

from tests.integrations.ray.helpers import io_of
from tests.olschema import validate_event


def b3(data: bytes) -> str:
    return "blake3:" + blake3.blake3(data).hexdigest()


@ray.remote
class Appender:
    def __init__(self, path: str):
        self.path = path

    def append(self, line: str) -> int:
        with open(self.path, "a") as f:
            f.write(line)
        return len(line)


@ray.remote
def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@ray.remote
def write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def test_an_actor_appending_over_five_calls_records_each_calls_file(ray_job):
    path = ray_job.data / "journal.txt"
    actor = Appender.remote(str(path))
    lines = [f"line {i} of the journal\n" for i in range(5)]
    for line in lines:  # one after another: each call leaves one more line
        ray.get(actor.append.remote(line))
    ray_job.finish()

    store = ray_job.store()
    calls = sorted(ray_job.runs(store, ".Appender.append"), key=lambda r: r.started_at)
    assert len(calls) == 5
    left = [io_of(store, r.run_id)[1][str(path)] for r in calls]
    assert left == [b3("".join(lines[: i + 1]).encode()) for i in range(5)]
    events = ray_job.events()
    for e in events:
        validate_event(e)
    workflow = [e for e in events if "roar_task" not in e["run"]["facets"]]
    assert [e["eventType"] for e in workflow] == ["START", "COMPLETE"]
    for e in workflow:  # the Ray job's run names its engine
        assert e["run"]["facets"]["processing_engine"]["name"] == "ray"


def test_a_read_then_overwrite_by_the_next_task_keeps_the_version_read(ray_job):
    path = str(ray_job.data / "shared.bin")
    ray.get(write.remote(path, b"v1: the version the reader saw\n"))
    assert ray.get(read.remote(path)) == b"v1: the version the reader saw\n"
    ray.get(write.remote(path, b"v2, written right after\n"))
    ray_job.finish()

    store = ray_job.store()
    (reader,) = ray_job.runs(store, ".read")
    assert io_of(store, reader.run_id)[0] == {path: b3(b"v1: the version the reader saw\n")}
    writes = sorted(ray_job.runs(store, ".write"), key=lambda r: r.started_at)
    assert [io_of(store, r.run_id)[1][path] for r in writes] == [
        b3(b"v1: the version the reader saw\n"), b3(b"v2, written right after\n")]


def test_flush_records_what_ended_so_far_and_the_job_goes_on(ray_job):
    """`roar_ray.flush()`: the tasks that ended are in the store (and their events out)
    while the job runs; later tasks are recorded too."""
    first = ray_job.data / "first.bin"
    ray.get(write.remote(str(first), b"first version of the file"))
    import roar_ray

    roar_ray.flush(timeout=60)
    store = ray_job.store()
    (run,) = ray_job.runs(store, ".write")
    assert run.status == "COMPLETE"
    assert io_of(store, run.run_id)[1] == {str(first): b3(b"first version of the file")}
    assert [e["eventType"] for e in ray_job.events()
            if e["run"]["runId"] == run.run_id] == ["START", "COMPLETE"]
    assert store.workflow_run(run.workflow_run_id).status == "RUNNING"  # the job goes on
    second = ray_job.data / "second.bin"
    ray.get(write.remote(str(second), b"second"))
    ray_job.finish()
    assert {r.status for r in ray_job.runs(store, ".write")} == {"COMPLETE"}
    assert len(ray_job.runs(store, ".write")) == 2
