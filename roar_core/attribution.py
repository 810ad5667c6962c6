"""Attribution: which task caused each traced event.

A record's own tag wins (the shim stamps the thread's task, or the process fallback).
An untagged record belongs to the task that created its process: the tag on the
fork/spawn/exec record that made that pid, else the creator's creator, and so on.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from roar_core.tracelog import RF_UNTRACEABLE, Record, TraceLog

UNATTRIBUTED = ""


@dataclass
class TaskEvents:
    tag: str
    records: list[Record] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)
    untraceable: list[Record] = field(default_factory=list)  # exec of static/setuid programs
    dropped: int = 0  # events lost in logs of this task's processes

    def sort(self) -> None:
        self.records.sort(key=lambda r: r.mono_ns)


def _creators(logs: Iterable[TraceLog]) -> tuple[dict[int, str | None], dict[int, int]]:
    """pid -> tag on the record that created it, and pid -> parent pid."""
    created_by: dict[int, str | None] = {}
    parent: dict[int, int] = {}
    for log in logs:
        parent.setdefault(log.header.pid, log.header.ppid)
        for r in log.records:
            if r.op_name in ("fork", "spawn") and r.result > 0:
                created_by.setdefault(r.result, r.tag)
                parent.setdefault(r.result, r.pid)
            elif r.op_name == "exec" and r.tag is not None:
                # The pid keeps its identity across exec: the exec'ing task owns it.
                created_by.setdefault(r.pid, r.tag)
    return created_by, parent


def attribute(logs: list[TraceLog], only: set[str] | None = None) -> dict[str, TaskEvents]:
    """Group the records of a session by task tag.  Records nobody can claim go under
    UNATTRIBUTED.  With `only`, other tasks' records are skipped early."""
    created_by, parent = _creators(logs)

    def inherited(pid: int) -> str | None:
        seen = set()
        while pid and pid not in seen:
            seen.add(pid)
            tag = created_by.get(pid)
            if tag:
                return tag
            pid = parent.get(pid, 0)
        return None

    tasks: dict[str, TaskEvents] = defaultdict(lambda: TaskEvents(UNATTRIBUTED))
    for log in logs:
        fallback: str | None = None
        fallback_done = False
        log_tags: set[str] = set()
        for r in log.records:
            tag = r.tag
            if tag is None:
                if not fallback_done:
                    fallback, fallback_done = inherited(log.header.pid), True
                tag = fallback
            key = tag or UNATTRIBUTED
            if only is not None and key not in only:
                continue
            t = tasks[key]
            t.tag = key
            t.records.append(r)
            t.pids.add(r.pid)
            log_tags.add(key)
            if r.op_name in ("exec", "spawn") and r.has(RF_UNTRACEABLE):
                t.untraceable.append(r)
        # Drops cannot be attributed to one task: charge every task seen in that log.
        if log.dropped:
            for key in log_tags:
                tasks[key].dropped += log.dropped
    for t in tasks.values():
        t.sort()
    return dict(tasks)
