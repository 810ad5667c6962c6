"""Ray: each task's versions are the content it read or left at its end, not what the next
task made of the file before the node's recorder got to it (the truth: blake3 of the bytes
each call wrote or saw, computed here)."""

from __future__ import annotations

import blake3
import ray

from tests.conftest import processes
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


@ray.remote(num_cpus=0)
def where() -> str:
    return ray.get_runtime_context().get_node_id()


def _recorder_of(node_id: str) -> int:
    found = processes("roar_core.recording.recorder", lambda a: a.endswith(node_id.encode()))
    assert found, f"no recorder for node {node_id}"
    return found[0]


def test_a_consumer_on_another_node_goes_out_after_its_producer(ray_job):
    """The producer's node records late (its recorder stopped for 3 s); the consumer's
    node holds the consumer back until then: its COMPLETE is never delivered first."""
    import os
    import signal
    import time

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")]
    assert len(nodes) == 2

    def on(fn, node):
        return fn.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))

    a, b = nodes
    assert ray.get([on(where, a).remote(), on(write, b).remote(
        str(ray_job.data / "warm"), b"warm")])[0] == a  # both nodes' recorders up
    ray.get(on(write, a).remote(str(ray_job.data / "warm-a"), b"warm"))
    import roar_ray

    roar_ray.flush(timeout=60)  # both recorders started (a loaded machine: seconds)
    time.sleep(1.0)  # and each has said how far it got
    recorder_a = _recorder_of(a)
    os.kill(recorder_a, signal.SIGSTOP)
    try:
        made, copy = ray_job.data / "made.bin", ray_job.data / "copy.bin"
        ray.get(on(write, a).remote(str(made), b"the producer's output, long enough" * 4))
        data = ray.get(on(read, b).remote(str(made)))
        ray.get(on(write, b).remote(str(copy), data))
        time.sleep(3.0)  # node b's recorder has had every chance to record its tasks
    finally:
        os.kill(recorder_a, signal.SIGCONT)
    ray_job.finish()
    completes = [e for e in ray_job.events() if e["eventType"] == "COMPLETE"]
    for e in completes:
        validate_event(e)

    def first(job: str, dataset: str) -> int:
        return next(i for i, e in enumerate(completes) if e["job"]["name"].endswith(job)
                    and any(d["name"].endswith(dataset)
                            for d in e.get("inputs", []) + e.get("outputs", [])))

    assert first(".write", "made.bin") < first(".read", "made.bin")


@ray.remote
class HeldAppender:
    """Opens its file once, as a logger or a results writer does, and writes through that
    descriptor in every call: no call opens or closes anything."""

    def __init__(self, path: str):
        self.f = open(path, "ab")

    def append(self, line: bytes) -> int:
        self.f.write(line)
        self.f.flush()
        return len(line)


def test_calls_writing_through_a_file_the_actor_opened_once_each_leave_a_version(ray_job):
    path = ray_job.data / "held.txt"
    actor = HeldAppender.remote(str(path))
    lines = [f"record {i}\n".encode() for i in range(4)]
    for line in lines:
        ray.get(actor.append.remote(line))
    ray_job.finish()

    store = ray_job.store()
    calls = sorted(ray_job.runs(store, ".HeldAppender.append"), key=lambda r: r.started_at)
    assert len(calls) == 4
    left = [io_of(store, r.run_id)[1].get(str(path)) for r in calls]
    assert left == [b3(b"".join(lines[: i + 1])) for i in range(4)]
