"""The recorder service: forked task processes of a traced worker hand their tasks to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import blake3
import pytest

from roar_core import service, tracer
from roar_core.emission import Dataset
from roar_core.store import Store

# A worker with the shim preloaded: forks one task process per task, as Airflow does.  Each
# task talks to the service (begin, file I/O, end) and prints what the service answered.
WORKER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from roar_core import tracelog, tracer
    from roar_core.ids import new_run_id
    from roar_core.service import ServiceClient, Settings, TaskSpec, spawn

    session, settings, data, n, mode = sys.argv[1], Settings.from_json(sys.argv[2]), \\
        sys.argv[3], int(sys.argv[4]), sys.argv[5]
    client = ServiceClient.connect(session, settings)
    if client is None:
        spawn(session, settings)
        deadline = time.monotonic() + 30
        while client is None and time.monotonic() < deadline:
            time.sleep(0.05)
            client = ServiceClient.connect(session, settings)
    client.close()
    shim = tracer.loaded()

    def task(i):
        c = ServiceClient.connect(session, settings)
        own = shim.log_path()
        run_id = new_run_id()
        c.begin(TaskSpec(job_name=f"job{i}", engine="test", run_id=run_id, pid=os.getpid(),
                         began_mono_ns=time.monotonic_ns(),
                         workflow={"namespace": "ns", "job_name": "wf", "run_id": WF},
                         own_log=str(own) if own else None,
                         own_log_offset=tracelog.read_header(own).reserved if own else 0))
        shim.begin(run_id)
        with open(os.path.join(data, f"in{i}.txt"), "w") as f:
            f.write(f"input {i}\\n")
        with open(os.path.join(data, f"in{i}.txt")) as f:
            text = f.read()
        if mode == "die":
            with open(os.path.join(data, f"out{i}.txt"), "w") as f:
                f.write(text)
            os._exit(3)  # no end: the service must record the task as ABORT
        subprocess.run(f"cat {data}/in{i}.txt > {data}/out{i}.txt", shell=True, check=True)
        shim.end()
        r = c.end("COMPLETE")
        return {"run_id": run_id, "data": r.data}

    WF = new_run_id()
    for i in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.write(w, json.dumps(task(i)).encode())
            os._exit(0)
        os.close(w)
        out = b"".join(iter(lambda: os.read(r, 65536), b""))
        os.waitpid(pid, 0)
        print(out.decode() or json.dumps({"died": True}), flush=True)
""")


@pytest.fixture
def settings(tmp_path: Path) -> service.Settings:
    return service.Settings(str(tmp_path), {"home": str(tmp_path / "roar"), "emit": False})


@pytest.fixture
def session(tmp_path: Path):
    if not tracer.status().usable:
        pytest.skip(f"tracer unusable: {tracer.status().reason}")
    d = tmp_path / "roar" / "sessions" / "worker"
    d.mkdir(parents=True)
    yield d
    # The service leaves when its session directory does.
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def _worker(session: Path, settings: service.Settings, data: Path, n: int, mode: str = "ok"):
    data.mkdir(exist_ok=True)
    env = tracer.preload_env(session)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = subprocess.run([sys.executable, "-c", WORKER, str(session), settings.to_json(),
                          str(data), str(n), mode], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_settings_round_trip_and_key() -> None:
    s = service.Settings("/w", {"emit": False}, ("/x/*",), ("/airflow",))
    assert service.Settings.from_json(s.to_json()) == s
    assert s.key() == service.Settings.from_json(s.to_json()).key()
    assert s.key() != service.Settings("/w", {"emit": True}).key()


def test_result_round_trip() -> None:
    d = Dataset("file", "/a", digest="0" * 64, size=3, symlinks=[("file", "/b")],
                lifecycle="CREATE")
    r = service.Result(json.loads(json.dumps(service.Result.of("COMPLETE", [d], [], None,
                                                                None).data)))
    assert r.inputs == [d] and r.counts == (1, 0) and r.error is None


def test_forked_tasks_recorded_by_the_service(tmp_path, session, settings) -> None:
    data = tmp_path / "data"
    results = _worker(session, settings, data, 3)
    assert len(results) == 3
    for i, r in enumerate(results):
        assert r["data"]["ok"], r
        ins = {d["name"]: d["digest"] for d in r["data"]["inputs"]}
        outs = {d["name"]: d["digest"] for d in r["data"]["outputs"]}
        digest = blake3.blake3(f"input {i}\n".encode()).hexdigest()
        # in<i> was written then read by the task: an output, not an input.
        assert ins == {}
        assert outs == {str(data / f"in{i}.txt"): digest, str(data / f"out{i}.txt"): digest}
        assert r["data"]["task"]["traced"] is True and r["data"]["task"]["pid"] > 0
    with Store.open(home=tmp_path / "roar") as store:
        runs = [store.task_run(r["run_id"]) for r in results]
        assert all(run.status == "COMPLETE" for run in runs)
        assert len({run.workflow_run_id for run in runs}) == 1  # made by the first task
    assert os.path.exists(service.socket_path(session, settings))


def test_task_process_dying_is_recorded_as_abort(tmp_path, session, settings) -> None:
    data = tmp_path / "data"
    _worker(session, settings, data, 1, mode="die")
    home = tmp_path / "roar"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with Store.open(home=home) as store:
            runs = store.task_runs(limit=5)
            if runs and runs[0].status != "RUNNING":
                break
        time.sleep(0.2)
    assert runs[0].status == "ABORT"
    with Store.open(home=home) as store:
        outs = [a.uri for a in store.accesses_of(runs[0].run_id) if a.role == "output"]
    assert outs and str(data / "out0.txt") in outs


def test_sweep_removes_only_logs_no_task_can_need(tmp_path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    now = time.monotonic_ns()
    old_dead = tmp_path / f"roar-{dead.pid}-{now - 10**9}.log"
    new_dead = tmp_path / f"roar-{dead.pid}-{now + 10**9}.log"  # after a running task began
    old_alive = tmp_path / f"roar-{os.getpid()}-{now - 10**9}.log"
    for p in (old_dead, new_dead, old_alive):
        p.write_bytes(b"")
    fake = SimpleNamespace(state=threading.Lock(), last_sweep=0.0, session_dir=tmp_path,
                           turns=service._Turns(), active={"run": now})
    service._Server.sweep(fake)  # type: ignore[arg-type]
    assert not old_dead.exists()
    assert new_dead.exists() and old_alive.exists()


def test_turns_let_an_end_go_before_waiting_begins() -> None:
    turns, order = service._Turns(), []
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with turns.take(urgent=False):
            holding.set()
            release.wait(10)

    def take(name: str, urgent: bool) -> None:
        with turns.take(urgent=urgent):
            order.append(name)

    threads = [threading.Thread(target=hold)]
    threads[0].start()
    holding.wait(10)
    for name, urgent in (("begin", False), ("sweep", False), ("end", True)):
        threads.append(threading.Thread(target=take, args=(name, urgent)))
        threads[-1].start()
        time.sleep(0.05)  # queued behind the holder, in this order
    release.set()
    for t in threads:
        t.join(10)
    assert order[0] == "end" and sorted(order) == ["begin", "end", "sweep"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduler only")
def test_connection_threads_get_short_slices() -> None:
    # In a child: the slice is the calling thread's only.
    code = textwrap.dedent("""
        import ctypes, platform, struct, threading
        from roar_core import service
        def slice_ns():
            buf = ctypes.create_string_buffer(56)
            nr = {"x86_64": 315, "aarch64": 275}.get(platform.machine())
            if nr is None or ctypes.CDLL(None).syscall(nr, 0, buf, 56, 0) != 0:
                raise SystemExit("no sched_getattr")
            return struct.unpack("IIQiIQQQII", buf.raw)[5]
        def thread():
            service.short_slice()
            seen.append(slice_ns())
        before, seen = slice_ns(), []
        t = threading.Thread(target=thread)
        t.start(); t.join()
        print(before, seen[0], slice_ns())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    if "no sched_getattr" in out.stderr:
        pytest.skip("no sched_getattr here")
    assert out.returncode == 0, out.stderr
    before, thread, after = map(int, out.stdout.split())
    if before == 0:
        pytest.skip("this kernel has no per-thread slices (Linux < 6.12)")
    assert thread == service.SLICE_NS and after == before
