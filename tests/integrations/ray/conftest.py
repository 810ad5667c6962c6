"""One real 2-node Ray cluster for the whole session (`ray.cluster_utils.Cluster`, no
dashboard), started with the roar plugin registered; each test runs its own Ray job
against it with a fresh roar home (`ray_job`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

if os.environ.get("ROAR_TEST_REQUIRE_RAY") == "1":
    import ray  # CI: a missing Ray must fail the run, never skip its tests silently
else:
    ray = pytest.importorskip("ray")

import roar_ray  # noqa: E402

from roar_core.pipeline.store import Store  # noqa: E402

CPUS_PER_NODE = 2


@pytest.fixture(scope="session")
def cluster() -> Iterator[object]:
    from ray.cluster_utils import Cluster

    saved = dict(os.environ)
    # Nodes started from here inherit the plugin registration; drivers get the hook.
    roar_ray.enable()
    os.environ["RAY_AUTH_MODE"] = "disabled"  # quieter; nothing to protect in a test
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": CPUS_PER_NODE, "include_dashboard": False})
    c.add_node(num_cpus=CPUS_PER_NODE)
    # A third node started without the plugin registered (for tasks asking for "noplugin").
    plugins = os.environ.pop("RAY_RUNTIME_ENV_PLUGINS")
    c.add_node(num_cpus=0, resources={"noplugin": 1})
    os.environ["RAY_RUNTIME_ENV_PLUGINS"] = plugins
    c.wait_for_nodes()
    try:
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()
        os.environ.clear()
        os.environ.update(saved)


@dataclass
class RayJob:
    home: Path
    data: Path
    name: str

    def finish(self) -> None:
        roar_ray.finish(timeout=60)

    def store(self) -> Store:
        return Store.open(home=self.home)

    def runs(self, store: Store, suffix: str = "") -> list:
        """This job's task runs whose job name ends with `suffix`."""
        runs = store.task_runs(None, limit=100_000)
        assert len({r.workflow_run_id for r in runs}) <= 1, "one Ray job per roar home"
        return [r for r in runs if r.job_name.endswith(suffix)]

    def events(self) -> list[dict]:
        path = self.home / "openlineage" / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def ray_job(cluster, tmp_path, request) -> Iterator[RayJob]:
    """A Ray job traced by roar into a fresh home; `job.finish()` ends its lineage."""
    name = request.node.name.replace("[", "_").rstrip("]")
    job = RayJob(tmp_path / "roar", tmp_path / "data", name)
    job.data.mkdir()
    ray.init(address=cluster.address, log_to_driver=True, runtime_env={
        "roar": {"home": str(job.home), "job_name": name}})
    try:
        yield job
    finally:
        roar_ray.finish(timeout=60)
        ray.shutdown()
