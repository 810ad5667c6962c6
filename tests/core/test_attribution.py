"""Attribution on real traces: tags, process ancestry, and children the shim could not tag
(glibc's system() spawns internally, outside the exec hooks)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from roar_core.pipeline import tracelog, tracer
from roar_core.pipeline.attribution import UNATTRIBUTED, Context, attribute

SCRIPT = textwrap.dedent("""
    import os, threading
    from roar_core.pipeline import tracer
    shim = tracer.loaded()
    # One task active: system()'s shell and its cat belong to it.
    shim.begin("solo")
    os.system("cat in.txt > solo.out")
    shim.end()
    # Two tasks active on two threads: a system() child cannot be placed.
    go, hold = threading.Event(), threading.Event()
    def other():
        shim.begin("other"); go.set(); hold.wait(); shim.end()
    t = threading.Thread(target=other); t.start(); go.wait()
    shim.begin("main")
    os.system("cat in.txt > ambiguous.out")
    shim.end()
    hold.set(); t.join()
    # Nothing active: the child is nobody's.
    os.system("cat in.txt > idle.out")
""")


def outputs_by_tag(tasks) -> dict[str, set[str]]:
    out = {}
    for tag, t in tasks.items():
        names = {r.path.rsplit(b"/", 1)[-1].decode() for r in t.records
                 if r.op_name == "open" and r.path.endswith(b".out")}
        if names:
            out[tag] = names
    return out


def run_script(tmp_path):
    work, session = tmp_path / "w", tmp_path / "s"
    work.mkdir()
    session.mkdir()
    (work / "in.txt").write_text("x")
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=work, capture_output=True,
                       text=True, env=tracer.preload_env(session))
    assert p.returncode == 0, p.stderr
    return tracelog.read_session(session)


def test_system_children_go_to_the_single_active_task(tmp_path):
    trace = run_script(tmp_path)
    by_tag = outputs_by_tag(attribute(trace.logs))
    assert by_tag["solo"] == {"solo.out"}
    assert by_tag[UNATTRIBUTED] == {"ambiguous.out", "idle.out"}
    assert "main" not in by_tag and "other" not in by_tag


def test_context_carries_across_incremental_batches(tmp_path):
    trace = run_script(tmp_path)
    # The parent's log (holding task_begin/end) is seen in one batch, the children's later.
    parent = [log for log in trace.logs if any(r.op_name == "task_begin" for r in log.records)]
    children = [log for log in trace.logs if log not in parent]
    ctx = Context()
    attribute(parent, context=ctx)
    later = outputs_by_tag(attribute(children, context=ctx))
    assert later["solo"] == {"solo.out"}
    # Without the context the later batch cannot place them.
    assert "solo" not in outputs_by_tag(attribute(children))


def test_a_collector_places_a_system_child_read_in_a_later_batch(tmp_path):
    """SessionCollector keeps its attribution context between reads: a task's system()
    child whose log is read after its parent's task_begin is still the task's (Ray's
    follower dropped such children as nobody's)."""
    from roar_core.recording.sessions import SessionCollector

    trace = run_script(tmp_path)
    session = tmp_path / "s"
    aside = tmp_path / "aside"
    aside.mkdir()
    parents = {os.path.basename(log.path) for log in trace.logs
               if any(r.op_name == "task_begin" for r in log.records)}
    for log in trace.logs:
        name = os.path.basename(log.path)
        if name not in parents:
            os.rename(log.path, aside / name)
    collector = SessionCollector(session)
    collector.collect(settle=True)  # the parent's log alone
    for moved in aside.iterdir():
        moved.rename(session / moved.name)
    collector.collect(settle=True)  # the children's logs, now
    solo = collector.take("solo")
    names = {r.path.rsplit(b"/", 1)[-1] for r in solo.records if r.op_name == "open"}
    assert b"solo.out" in names
