"""Normal Ray tasks on a real 2-node cluster: each task is one run with exactly its own
inputs and outputs, subprocesses included, and runs chain by content hash."""

from __future__ import annotations

import os
import signal
import subprocess

import ray
import roar_ray

from tests.integrations.ray.helpers import digest, io_of
from tests.olschema import validate_event


@ray.remote(scheduling_strategy="SPREAD")
def reverse(src: str, dst: str) -> str:
    with open(src, "rb") as f:
        data = f.read()
    with open(dst, "wb") as f:
        f.write(data[::-1])
    return ray.get_runtime_context().get_node_id()


def test_200_tasks_on_both_nodes_each_own_input_and_output(ray_job):
    pairs = []
    for i in range(200):
        src, dst = ray_job.data / f"in{i:03d}.txt", ray_job.data / f"out{i:03d}.txt"
        src.write_text(f"input number {i}\n" * (i + 1))
        pairs.append((str(src), str(dst)))
    nodes = ray.get([reverse.remote(s, d) for s, d in pairs])
    assert len(set(nodes)) == 2, "SPREAD should use both nodes with CPUs"
    ray_job.finish()

    store = ray_job.store()
    runs = ray_job.runs(store, ".reverse")
    assert len(runs) == 200
    seen = set()
    for r in runs:
        assert r.status == "COMPLETE" and r.traced, (r.status, r.untraced_reason)
        assert r.job_name == f"{ray_job.name}.reverse"
        ins, outs = io_of(store, r.run_id)
        assert len(ins) == 1 and len(outs) == 1, (ins, outs)
        (src, d_in), (dst, d_out) = next(iter(ins.items())), next(iter(outs.items()))
        assert (src, dst) in pairs
        assert d_in == digest(src) and d_out == digest(dst)
        seen.add((src, dst))
    assert seen == set(pairs)
    # Node id, worker pid, task id and attempt are in each run's roar_task facet.
    facets = [e["run"]["facets"]["roar_task"] for e in ray_job.events()
              if e["eventType"] == "COMPLETE" and e["job"]["name"].endswith(".reverse")]
    assert len(facets) == 200
    assert {f["nodeId"] for f in facets} == set(nodes)
    assert all(f["engine"] == "ray" and f["pid"] > 0 and len(f["engineTaskId"]) == 48
               and f["attempt"] == 0 for f in facets)


def test_flush_waits_for_each_node_from_here_or_in_a_task_there(ray_job):
    """`roar_ray.flush` returns once every node has recorded the tasks that ended: the
    nodes of the driver's host it waits on itself, a node of another host in a task pinned
    there (`drain_node`, run here on each node as the driver runs it for one elsewhere).
    Either way every run is in the store when it returns, the job going on."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from roar_ray import driver

    def run_tasks(first: int) -> set[str]:
        pairs = []
        for i in range(first, first + 60):
            src, dst = ray_job.data / f"in{i:03d}.txt", ray_job.data / f"out{i:03d}.txt"
            src.write_text(f"input number {i}\n")
            pairs.append((str(src), str(dst)))
        return set(ray.get([reverse.remote(s, d) for s, d in pairs]))

    nodes = run_tasks(0)
    roar_ray.flush(timeout=60)
    assert len(ray_job.runs(ray_job.store(), ".reverse")) == 60

    assert run_tasks(60) == nodes
    root = str(driver._jobs[0].root)
    drain = ray.remote(num_cpus=0, max_retries=0)(driver.drain_node)
    answers = ray.get([drain.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node, soft=False)).remote(root, 60.0) for node in nodes])
    assert sorted(a["node"] for a in answers) == sorted(nodes)
    assert all(a["done"] for a in answers)
    assert len(ray_job.runs(ray_job.store(), ".reverse")) == 120
    ray_job.finish()


@ray.remote
def copy_with_cp(src: str, dst: str) -> None:
    subprocess.run(["cp", src, dst], check=True)


@ray.remote
def step_a(src: str, dst: str) -> None:
    with open(src) as f, open(dst, "w") as g:
        g.write(f.read().upper())


@ray.remote
def step_b(src: str, dst: str) -> None:
    with open(src) as f, open(dst, "w") as g:
        g.write(f"{len(f.read())}\n")


def test_subprocess_io_and_a_chain_by_content_hash(ray_job):
    raw, mid, end = ray_job.data / "raw.txt", ray_job.data / "mid.txt", ray_job.data / "n.txt"
    raw.write_text("some words\n")
    ray.get(step_a.remote(str(raw), str(mid)))
    ray.get(step_b.remote(str(mid), str(end)))
    copied = ray_job.data / "copy.txt"
    ray.get(copy_with_cp.remote(str(end), str(copied)))
    ray_job.finish()

    store = ray_job.store()
    (a,) = ray_job.runs(store, ".step_a")
    (b,) = ray_job.runs(store, ".step_b")
    (c,) = ray_job.runs(store, ".copy_with_cp")
    assert io_of(store, a.run_id) == ({str(raw): digest(raw)}, {str(mid): digest(mid)})
    assert io_of(store, b.run_id) == ({str(mid): digest(mid)}, {str(end): digest(end)})
    # The subprocess's reads and writes are the task's.
    assert io_of(store, c.run_id) == ({str(end): digest(end)}, {str(copied): digest(copied)})

    events = ray_job.events()
    for e in events:
        validate_event(e)
    done = {e["job"]["name"].rsplit(".", 1)[1]: e for e in events
            if e["eventType"] == "COMPLETE" and "roar_task" in e["run"]["facets"]}
    # One connected chain: what A wrote is what B read, by name and by content.
    (a_out,), (b_in,) = done["step_a"]["outputs"], done["step_b"]["inputs"]
    assert (a_out["namespace"], a_out["name"]) == (b_in["namespace"], b_in["name"])
    assert a_out["facets"]["version"]["datasetVersion"] == b_in["facets"]["version"][
        "datasetVersion"] == digest(mid)
    (b_out,), (c_in,) = done["step_b"]["outputs"], done["copy_with_cp"]["inputs"]
    assert b_out["name"] == c_in["name"] == str(end)
    # Every task run hangs under the Ray job's run.
    jobs = [e for e in events if "roar_task" not in e["run"]["facets"]]
    job_run = {e["run"]["runId"] for e in jobs}
    assert len(job_run) == 1 and {e["eventType"] for e in jobs} == {"START", "COMPLETE"}
    for e in done.values():
        assert e["run"]["facets"]["parent"]["run"]["runId"] in job_run


@ray.remote(max_retries=1)
def dies_once(src: str, partial: str, dst: str) -> None:
    with open(src) as f:
        data = f.read()
    worker = ray._private.worker.global_worker
    if worker.core_worker.get_current_task_attempt_number() == 0:
        with open(partial, "w") as f:
            f.write(data[:3])
        os.kill(os.getpid(), signal.SIGKILL)  # no atexit, no destructor: a real crash
    with open(dst, "w") as f:
        f.write(data)


def test_worker_killed_on_attempt_0_then_retried(ray_job):
    src, partial, dst = (ray_job.data / n for n in ("src.txt", "partial.txt", "dst.txt"))
    src.write_text("content of the input\n")
    ray.get(dies_once.remote(str(src), str(partial), str(dst)))
    ray_job.finish()

    store = ray_job.store()
    runs = sorted(ray_job.runs(store, ".dies_once"), key=lambda r: r.attempt)
    assert [(r.attempt, r.status) for r in runs] == [(0, "ABORT"), (1, "COMPLETE")]
    assert runs[0].engine_task_id == runs[1].engine_task_id
    assert "died while it ran" in runs[0].error_message
    # The dead attempt's lineage up to the kill: what it read and the partial file.
    assert io_of(store, runs[0].run_id) == ({str(src): digest(src)},
                                            {str(partial): digest(partial)})
    assert io_of(store, runs[1].run_id) == ({str(src): digest(src)}, {str(dst): digest(dst)})
    aborts = [e for e in ray_job.events() if e["eventType"] == "ABORT"]
    assert [e["run"]["runId"] for e in aborts] == [runs[0].run_id]
    validate_event(aborts[0])


@ray.remote
def inner(src: str, dst: str) -> None:
    with open(src) as f, open(dst, "w") as g:
        g.write(f.read()[::-1])


@ray.remote
def outer(src: str, mid: str, dst: str) -> None:
    with open(src) as f, open(mid, "w") as g:
        g.write(f.read() * 2)
    ray.get(inner.remote(mid, dst))


def test_nested_task_has_its_submitter_as_parent(ray_job):
    src, mid, dst = (ray_job.data / n for n in ("src", "mid", "dst"))
    src.write_text("abc\n")
    ray.get(outer.remote(str(src), str(mid), str(dst)))
    ray_job.finish()

    store = ray_job.store()
    (o,) = ray_job.runs(store, ".outer")
    (i,) = ray_job.runs(store, ".inner")
    assert o.parent_run_id is None and i.parent_run_id == o.run_id
    # Each has only its own I/O, though `outer` waited while `inner` ran.
    assert io_of(store, o.run_id) == ({str(src): digest(src)}, {str(mid): digest(mid)})
    assert io_of(store, i.run_id) == ({str(mid): digest(mid)}, {str(dst): digest(dst)})
    (event,) = [e for e in ray_job.events() if e["eventType"] == "COMPLETE"
                and e["job"]["name"].endswith(".inner")]
    assert event["run"]["facets"]["roar_task"]["parentTaskId"] == o.run_id


@ray.remote(num_cpus=0, resources={"noplugin": 1})
def on_a_node_without_the_plugin(dst: str) -> None:
    with open(dst, "w") as f:
        f.write("x")


def test_a_node_without_the_plugin_is_not_silent(ray_job, capfd):
    ray.get(on_a_node_without_the_plugin.remote(str(ray_job.data / "x")))
    ray_job.finish()

    (run,) = ray_job.runs(ray_job.store(), ".on_a_node_without_the_plugin")
    assert run.status == "COMPLETE" and not run.traced
    assert "plugin is not registered on Ray node" in run.untraced_reason
    assert "ran UNTRACED" in capfd.readouterr().err  # the driver says so at the end


def test_nodes_record_into_a_shared_postgresql_store(cluster, tmp_path, postgres_schema_url):
    """A cluster's store: each node's recorder writes the job's lineage to one database."""
    import roar_ray

    from roar_core.pipeline.store import Store

    data = tmp_path / "data"
    data.mkdir()
    ray.init(address=cluster.address, runtime_env={"roar": {
        "home": str(tmp_path / "roar"), "database_url": postgres_schema_url, "job_name": "pg"}})
    try:
        pairs = []
        for i in range(20):
            src = data / f"in{i}"
            src.write_text(f"{i}\n")
            pairs.append((str(src), str(data / f"out{i}")))
        nodes = set(ray.get([reverse.remote(s, d) for s, d in pairs]))
        roar_ray.finish(timeout=60)
    finally:
        ray.shutdown()
    assert len(nodes) == 2
    with Store.open(url=postgres_schema_url) as store:
        runs = [r for r in store.task_runs(None, limit=100) if r.job_name == "pg.reverse"]
        assert len(runs) == 20 and all(r.status == "COMPLETE" for r in runs)
        assert {tuple(io_of(store, r.run_id)[0]) + tuple(io_of(store, r.run_id)[1])
                for r in runs} == set(pairs)
        assert not (tmp_path / "roar" / "lineage.db").exists()


def _children(pid: int) -> list[int]:
    import glob

    out = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def test_rays_own_daemons_are_never_preloaded(ray_job, cluster):
    from roar_core.pipeline import tracer

    ray.get(reverse.remote(__file__, str(ray_job.data / "x")))  # a traced worker runs
    daemons = {}
    for node in cluster.list_all_nodes():
        for kind, proc in node.live_processes():
            daemons[proc.pid] = kind
            for child in _children(proc.pid):  # the agents, the log monitor, workers
                try:
                    with open(f"/proc/{child}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                # Workers retitle themselves ray::<task> or ray::IDLE (one still starting
                # shows its default_worker.py command line); agents ray::<X>Agent.
                if "default_worker.py" in cmd:
                    continue
                if not cmd.startswith("ray::") or cmd.split()[0].endswith("Agent"):
                    daemons[child] = cmd.split()[0]
    assert "ray::RuntimeEnvAgent" in daemons.values(), daemons
    lib = str(tracer.library_path()).encode()
    for pid, kind in daemons.items():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        assert lib not in env.get(b"LD_PRELOAD", b""), (pid, kind)
        assert b"ROAR_SESSION_DIR" not in env, (pid, kind)
