"""Attribution: which task caused each traced event.

A record's own tag wins (the shim stamps the thread's task, or the process fallback).
An untagged record belongs to the task that created its process: the tag on the
fork/spawn/exec record that made that pid, else the creator's creator, and so on.  A
process started where the shim cannot see the spawn (glibc's system() and popen() spawn
internally) and without a tag in its environment belongs to the task that was active in
its parent when it started, if exactly one was: the shim's own fallback rule, applied
after the fact from the parent's task_begin/task_end records.

`Context` keeps what one batch of records says about processes and task windows, so that
incremental reads (a worker's live log, a child's log read later) are attributed alike.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable

from roar_core.pipeline.tracelog import OP, RF_UNTRACEABLE, Record, TraceLog
from roar_core.slotted import Slotted

UNATTRIBUTED = ""

# Operation codes, compared as such: these loops run once per traced operation (a name
# looked up through `Record.op_name` for each was ~10 % of reading a session).
_CREATE = frozenset((OP["fork"], OP["spawn"]))
_EXEC, _TASK_BEGIN = OP["exec"], OP["task_begin"]
_MARKS = frozenset((_TASK_BEGIN, OP["task_end"]))
_RUNS = frozenset((_EXEC, OP["spawn"]))  # may name a program the shim cannot trace


class TaskEvents(Slotted):
    __slots__ = ("tag", "records", "pids", "untraceable", "dropped")

    def __init__(self, tag: str, records: list[Record] | None = None,
                 pids: set[int] | None = None, untraceable: list[Record] | None = None,
                 dropped: int = 0) -> None:
        self.tag = tag
        self.records = [] if records is None else records
        self.pids = set() if pids is None else pids
        self.untraceable = [] if untraceable is None else untraceable  # static/setuid execs
        self.dropped = dropped  # events lost in logs of this task's processes

    def sort(self) -> None:
        self.records.sort(key=lambda r: r.mono_ns)


class Context(Slotted):
    __slots__ = ("created_by", "parent", "marks")

    def __init__(self) -> None:
        self.created_by: dict[int, str | None] = {}  # pid -> creator's tag
        self.parent: dict[int, int] = {}  # pid -> parent pid
        self.marks: dict[int, list[Record]] = defaultdict(list)

    def learn(self, logs: Iterable[TraceLog]) -> None:
        for log in logs:
            self.parent.setdefault(log.header.pid, log.header.ppid)
            for r in log.records:
                op = r.op
                if op in _CREATE and r.result > 0:
                    self.created_by.setdefault(r.result, r.tag)
                    self.parent.setdefault(r.result, r.pid)
                elif op == _EXEC and r.tag is not None:
                    # The pid keeps its identity across exec: the exec'ing task owns it.
                    self.created_by.setdefault(r.pid, r.tag)
                elif op in _MARKS:
                    self.marks[r.pid].append(r)

    def inherited(self, pid: int) -> str | None:
        seen = set()
        while pid and pid not in seen:
            seen.add(pid)
            tag = self.created_by.get(pid)
            if tag:
                return tag
            pid = self.parent.get(pid, 0)
        return None

    def active_in(self, pid: int, at_ns: int) -> str | None:
        """The one task active in process `pid` at time `at_ns`, if exactly one was."""
        active: dict[int, str | None] = {}
        for r in sorted(self.marks.get(pid, ()), key=lambda r: r.mono_ns):
            if r.mono_ns > at_ns:
                break
            if r.op == _TASK_BEGIN:
                active[r.tid] = r.tag
            else:
                active.pop(r.tid, None)
        tags = set(active.values())
        return tags.pop() if len(tags) == 1 else None

    def owner(self, log: TraceLog) -> str | None:
        h = log.header
        return self.inherited(h.pid) or self.active_in(h.ppid, h.start_mono_ns)


def attribute(logs: list[TraceLog], only: set[str] | None = None,
              context: Context | None = None) -> dict[str, TaskEvents]:
    """Group the records of a session by task tag.  Records nobody can claim go under
    UNATTRIBUTED.  With `only`, other tasks' records are skipped early; pass the same
    `context` to successive calls over a growing session."""
    ctx = context if context is not None else Context()
    ctx.learn(logs)

    tasks: dict[str, TaskEvents] = defaultdict(lambda: TaskEvents(UNATTRIBUTED))
    for log in logs:
        fallback: str | None = None
        fallback_done = False
        log_tags: set[str] = set()
        for r in log.records:
            tag = r.tag
            if tag is None:
                if not fallback_done:
                    fallback, fallback_done = ctx.owner(log), True
                tag = fallback
            key = tag or UNATTRIBUTED
            if only is not None and key not in only:
                continue
            t = tasks[key]
            t.tag = key
            t.records.append(r)
            t.pids.add(r.pid)
            log_tags.add(key)
            if r.op in _RUNS and r.rflags & RF_UNTRACEABLE:
                t.untraceable.append(r)
        # Drops cannot be attributed to one task: charge every task seen in that log.
        if log.dropped:
            for key in log_tags:
                tasks[key].dropped += log.dropped
    for t in tasks.values():
        t.sort()
    return dict(tasks)


def unshadow(records: list[Record], shadow_root: str, workdir: str) -> list[Record]:
    """Name files by where Snakemake puts them, not by the job's shadow directory.

    A shadow job runs in `<shadow_root>/<tmpdir>/`, over symlinks (or copies) of its inputs,
    and Snakemake moves its outputs to the working directory afterwards.  The path inside the
    shadow directory is rewritten to the workdir path; Snakemake's own shadow bookkeeping
    (moving outputs out, deleting the shadow tree) is dropped, so it neither hides outputs
    nor reads as deletions.
    """
    root = os.fsencode(shadow_root).rstrip(b"/") + b"/"
    workdir_b = os.fsencode(workdir)

    def strip(path: bytes) -> tuple[bytes, bool]:
        if not path.startswith(root):
            return path, False
        _tmp, sep, rest = path[len(root):].partition(b"/")
        return (os.path.join(workdir_b, rest) if sep else path), bool(sep)

    out = []
    for r in records:
        path, inside = strip(r.path) if r.path else (r.path, False)
        two = r.op_name in ("rename", "link", "symlink")  # path2 is a path (else argv)
        path2, inside2 = strip(r.path2) if two and r.path2 else (r.path2, False)
        if not (inside or inside2):
            out.append(r)
            continue
        if r.op_name in ("unlink", "rmdir", "symlink", "mkdir"):
            continue  # building or clearing the shadow tree
        if r.op_name in ("rename", "link") and path == path2:
            continue  # unshadowing an output: already named by its final path
        out.append(r.replace(path=path, path2=path2))
    return out
