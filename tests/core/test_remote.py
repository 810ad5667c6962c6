"""RemoteRoar: a Roar in a helper process, driven through a pipe."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from roar_core import config, tracer
from roar_core.declared import Declared
from roar_core.remote import RemoteRoar
from tests.olschema import validate_event


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith("OPENLINEAGE"):
            monkeypatch.delenv(k)
    return config.load(cwd=tmp_path, env={}, home=str(tmp_path / "home"))


def drop_reads_of(name: str):
    """A records filter (must be a picklable module-level callable)."""
    import functools

    return functools.partial(_drop, name=os.fsencode(name))


def _drop(records, name):
    return [r for r in records if not r.path.endswith(name)]


def test_tasks_recorded_in_the_helper_process(tmp_path, cfg):
    if not tracer.status().usable:
        pytest.skip(tracer.status().reason)
    (tmp_path / "in.txt").write_text("hello\n")
    (tmp_path / "ref.txt").write_text("ref\n")
    remote = RemoteRoar(cfg)
    wf = remote.start_workflow("wf", engine="test", facets={"k": "v"})
    results = []
    for i, drop in enumerate((None, "ref.txt")):
        run_id, session = remote.begin_task(
            "wf.step", "test", workflow=wf, engine_task_id=str(i),
            run_facets={"roar_snakemake": {"rule": "step", "jobid": i, "kind": "shell"}},
            declared=Declared([str(tmp_path / "in.txt")], [str(tmp_path / f"out{i}.txt")]),
            engine_version=("test", "1.0"))
        subprocess.run(["bash", "-c", f"cat in.txt ref.txt > out{i}.txt"], cwd=tmp_path,
                       env=tracer.preload_env(session, tag=run_id), check=True)
        results.append(remote.end_task(run_id, "COMPLETE", session=session, wait=True,
                                       records_filter=drop_reads_of(drop) if drop else None))
        assert not session.exists()  # read and removed
    assert results[0].undeclared_reads == (str(tmp_path / "ref.txt"),)
    assert results[1].undeclared_reads == ()  # filtered out before classification
    remote.finish_workflow(wf, "COMPLETE")
    final = remote.close()
    assert [r.run_id for r in final] == [r.run_id for r in results]
    assert all(r.error is None and r.traced for r in final)
    events = [json.loads(line) for line in
              (cfg.home / "openlineage" / "events.jsonl").read_text().splitlines()]
    for e in events:
        validate_event(e)
    assert [e["eventType"] for e in events if e["job"]["name"] == "wf"] == ["START", "COMPLETE"]
    done = [e for e in events if e["job"]["name"] == "wf.step" and e["eventType"] == "COMPLETE"]
    assert {e["run"]["facets"]["parent"]["run"]["runId"] for e in done} == {wf}
    assert done[0]["run"]["facets"]["roar_snakemake"]["rule"] == "step"
    assert done[0]["run"]["facets"]["processing_engine"]["version"] == "1.0"


def test_a_dead_helper_loses_lineage_not_the_caller(tmp_path, cfg, caplog):
    remote = RemoteRoar(cfg)
    remote._proc.kill()
    remote._proc.wait()
    run_id, session = remote.begin_task("t", "test", traced=False)
    assert session is None
    assert remote.end_task(run_id, "COMPLETE", wait=True) is None
    assert remote.close() == []
    assert "recorder process" in (remote.error or "")


def test_tasks_of_an_engine_that_died_are_aborted_with_their_lineage(tmp_path, cfg):
    if not tracer.status().usable:
        pytest.skip(tracer.status().reason)
    remote = RemoteRoar(cfg)
    wf = remote.start_workflow("wf", engine="test")
    run_id, session = remote.begin_task("wf.step", "test", workflow=wf)
    subprocess.run(["bash", "-c", "echo partial > out.txt"], cwd=tmp_path,
                   env=tracer.preload_env(session, tag=run_id), check=True)
    # The engine is killed: its end of the pipe closes without a word.
    remote._outbox.put(None)
    remote._writer.join(timeout=10)
    assert remote._proc.wait(timeout=60) == 0
    events = [json.loads(line) for line in
              (cfg.home / "openlineage" / "events.jsonl").read_text().splitlines()]
    aborted = [e for e in events if e["eventType"] == "ABORT"]
    for e in aborted:
        validate_event(e)
    assert [e["run"]["runId"] for e in aborted] == [run_id, wf]
    aborted = aborted[0]
    assert [d["name"] for d in aborted["outputs"]] == [str((tmp_path / "out.txt").resolve())]


def test_task_sessions_live_in_memory_when_the_host_has_a_runtime_tmpfs(tmp_path, cfg,
                                                                        monkeypatch):
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    remote = RemoteRoar(cfg)
    try:
        run_id, session = remote.begin_task("wf.step", "test")
        assert session is not None and session.is_relative_to(runtime / "roar")
        assert not cfg.sessions_dir.exists() or not any(cfg.sessions_dir.iterdir())
        assert (runtime / "roar").stat().st_mode & 0o777 == 0o700
        remote.end_task(run_id, "COMPLETE", session=session, wait=True)
    finally:
        remote.close()
    assert not list((runtime / "roar").iterdir())  # nothing left behind


def test_a_shared_memory_dir_not_ours_alone_is_never_used(tmp_path, monkeypatch):
    from roar_core import session as session_mod

    runtime = tmp_path / "runtime"
    (runtime / "roar").mkdir(parents=True)
    (runtime / "roar").chmod(0o777)  # another user could plant files or symlinks in it
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    got = session_mod.memory_sessions_dir()
    assert got is None or not got.is_relative_to(runtime)
    (runtime / "roar").chmod(0o700)
    assert session_mod.memory_sessions_dir() == runtime / "roar"
