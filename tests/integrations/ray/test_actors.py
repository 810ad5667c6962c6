"""Actors: every method call is its own run with exactly its own I/O, whether calls run on
concurrent threads (max_concurrency > 1) or interleave as coroutines (async actors); the
actor's own run holds what it does outside any call."""

from __future__ import annotations

import asyncio
import threading
import time

import ray

from tests.integrations.ray.helpers import digest, io_of
from tests.olschema import validate_event

CALLS = 8


@ray.remote(max_concurrency=4)
class ThreadedWriter:
    def __init__(self, log_path: str):
        with open(log_path, "w") as f:
            f.write("created\n")
        self._go = threading.Event()
        self._bg = None

    def write(self, path: str, text: str) -> str:
        time.sleep(0.05)  # the calls overlap on the actor's 4 threads
        with open(path, "w") as f:
            f.write(text)
        time.sleep(0.02)
        return path

    def start_background(self, path: str) -> None:
        """A thread of the actor's own, working while no call runs (like Ray Train's)."""

        def work():
            self._go.wait()
            time.sleep(0.2)  # after release_background() has returned: no call runs
            with open(path, "w") as f:
                f.write("written outside any call\n")

        self._bg = threading.Thread(target=work)
        self._bg.start()

    def release_background(self) -> None:
        self._go.set()

    def background_done(self) -> bool:
        self._bg.join(timeout=10)
        return not self._bg.is_alive()


@ray.remote
class AsyncWriter:
    async def write(self, path: str, text: str) -> str:
        await asyncio.sleep(0.05)  # all calls are in flight at once on one thread
        with open(path, "w") as f:
            f.write(text)
        await asyncio.sleep(0.02)
        with open(path) as f:
            assert f.read() == text
        return path


def _check_calls(job, store, suffix, paths, parent):
    runs = job.runs(store, suffix)
    assert len(runs) == CALLS
    outputs = []
    for r in runs:
        assert r.status == "COMPLETE" and r.traced
        assert r.parent_run_id == parent
        ins, outs = io_of(store, r.run_id)
        assert len(outs) == 1, outs
        (path, d), = outs.items()
        assert d == digest(path)
        assert set(ins) <= {path}  # the async writer reads back its own file
        outputs.append(path)
    assert sorted(outputs) == sorted(paths)


def test_threaded_actor_calls_and_the_actors_own_run(ray_job):
    log_path = ray_job.data / "actor.log"
    actor = ThreadedWriter.remote(str(log_path))
    paths = [str(ray_job.data / f"t{i}.txt") for i in range(CALLS)]
    ray.get([actor.write.remote(p, f"threaded call {i}\n") for i, p in enumerate(paths)])
    bg = ray_job.data / "background.txt"
    ray.get(actor.start_background.remote(str(bg)))
    ray.get(actor.release_background.remote())
    time.sleep(0.5)  # the thread writes while no call runs
    assert ray.get(actor.background_done.remote())
    actor.__ray_terminate__.remote()  # a graceful exit: the actor's run ends with it
    deadline = time.time() + 30
    store = ray_job.store()
    while time.time() < deadline and not [
            r for r in ray_job.runs(store, ".ThreadedWriter") if r.ended_at]:
        time.sleep(0.2)
    ray_job.finish()

    (own,) = ray_job.runs(store, ".ThreadedWriter")
    assert own.status == "COMPLETE"
    ins, outs = io_of(store, own.run_id)
    assert outs == {str(log_path): digest(log_path), str(bg): digest(bg)}
    _check_calls(ray_job, store, ".ThreadedWriter.write", paths, own.run_id)


def test_async_actor_concurrent_calls(ray_job):
    actor = AsyncWriter.remote()
    paths = [str(ray_job.data / f"a{i}.txt") for i in range(CALLS)]
    ray.get([actor.write.remote(p, f"async call {i}\n") for i, p in enumerate(paths)])
    ray_job.finish()

    store = ray_job.store()
    (own,) = ray_job.runs(store, ".AsyncWriter")
    _check_calls(ray_job, store, ".AsyncWriter.write", paths, own.run_id)
    for e in ray_job.events():
        validate_event(e)
