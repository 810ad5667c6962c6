"""The events and store rows of a 3-task Ray job (a -> b -> a `cp` of b) are those roar
produced before its recording moved to the one recorder (roar_core.recording): golden_job.json
was written by that earlier version (commit d8b4259, its per-node `roar_ray.recorder`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import ray
import roar_ray

from tests.golden_stream import stream


@ray.remote
def upper(src: str, dst: str) -> None:
    with open(src) as f, open(dst, "w") as g:
        g.write(f.read().upper())


@ray.remote
def double(src: str, dst: str) -> None:
    with open(src) as f, open(dst, "w") as g:
        g.write(f.read() * 2)


@ray.remote
def copy(src: str, dst: str) -> None:
    subprocess.run(["cp", src, dst], check=True)


def test_the_stream_is_the_one_before_the_recorder_moved(cluster, tmp_path):
    data, home = tmp_path / "data", tmp_path / "roar"
    data.mkdir()
    (data / "in.txt").write_text("hello ray\n")
    ray.init(address=cluster.address, runtime_env={"roar": {"home": str(home),
                                                            "job_name": "gold"}})
    try:
        ray.get(upper.remote(str(data / "in.txt"), str(data / "a.txt")))
        ray.get(double.remote(str(data / "a.txt"), str(data / "b.txt")))
        ray.get(copy.remote(str(data / "b.txt"), str(data / "c.txt")))
    finally:
        roar_ray.finish(timeout=60)
        ray.shutdown()
    got = stream(home, data)
    want = json.loads((Path(__file__).parent / "golden_job.json").read_text())
    assert got["runs"] == want["runs"]
    assert got["events"] == want["events"]
