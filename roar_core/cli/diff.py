"""`roar-core diff A B`: what differs between two task runs.

A and B are run ids, or versions of files (a path: its latest recorded version; a digest
or a prefix of one), each standing for the run that produced it.  Compared: the inputs
and outputs (by path, with their digests), the code (each script's digest), the
parameters (the command line, secrets masked as stored), the Python environment (its
packages, from the store's facts) and the machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from roar_core.ids import looks_like_run_id
from roar_core.pipeline.store import Store, TaskRunRecord


class NoRun(LookupError):
    """A side of the diff names no recorded run."""


@dataclass
class Change:
    name: str
    a: Any  # None: absent in A
    b: Any  # None: absent in B


@dataclass
class Diff:
    a: TaskRunRecord
    b: TaskRunRecord
    sections: dict[str, list[Change]] = field(default_factory=dict)

    @property
    def same(self) -> bool:
        return not any(self.sections.values())

    def to_dict(self) -> dict[str, Any]:
        return {"a": {"run_id": self.a.run_id, "job_name": self.a.job_name},
                "b": {"run_id": self.b.run_id, "job_name": self.b.job_name},
                "same": self.same,
                **{k: [{"name": c.name, "a": c.a, "b": c.b} for c in v]
                   for k, v in self.sections.items()}}


def run_of(store: Store, key: str) -> TaskRunRecord:
    """The run a key names: a run id, else the run that produced a version of a file."""
    run = store.task_run(key) if looks_like_run_id(key) else None
    if run is not None:
        return run
    digest = key
    if not key.startswith("blake3:") and not _hex64(key):
        latest = store.latest_version(key)
        if latest is None:
            raise NoRun(f"no lineage recorded for {key}")
        digest = latest.digest
    produced = store.producer_of(digest)
    run = store.task_run(produced.run_id) if produced is not None else None
    if run is None:
        raise NoRun(f"no recorded run produced {key}")
    return run


def code_version(c) -> dict[str, Any]:
    """A script as run: its digest, and its commit and dirty flag when it is in git."""
    v: dict[str, Any] = {"digest": _canonical(c.digest)}
    if c.commit:
        v.update(repo=c.repo, commit=c.commit, dirty=c.dirty)
    return v


def _canonical(digest: str) -> str:
    return digest if digest.startswith("blake3:") else "blake3:" + digest


def _hex64(key: str) -> bool:
    return len(key) == 64 and all(c in "0123456789abcdef" for c in key.lower())


def _compare(a: dict[str, Any], b: dict[str, Any]) -> list[Change]:
    return [Change(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys())
            if a.get(k) != b.get(k)]


def diff(store: Store, key_a: str, key_b: str) -> Diff:
    a, b = run_of(store, key_a), run_of(store, key_b)
    d = Diff(a, b)
    for role in ("input", "output"):
        files = [{x.uri: x.digest for x in store.accesses_of(r.run_id) if x.role == role}
                 for r in (a, b)]
        d.sections[role + "s"] = _compare(*files)
    d.sections["code"] = _compare(*({c.path: code_version(c) for c in r.code}
                                    for r in (a, b)))
    d.sections["parameters"] = _compare({"command": a.command, "job": a.job_name},
                                        {"command": b.command, "job": b.job_name})
    d.sections["environment"] = _facts_diff(store, a, b, "environment")
    d.sections["machine"] = _facts_diff(store, a, b, "machine")
    return d


def _facts_diff(store: Store, a: TaskRunRecord, b: TaskRunRecord, kind: str) -> list[Change]:
    ids = [r.environment.get(kind) for r in (a, b)]
    if ids[0] == ids[1]:
        return []
    facts = [store.facts(i) if i else None for i in ids]
    if None in facts:
        return [Change(kind, ids[0], ids[1])]
    fa, fb = (dict(f) for f in facts)
    changes = []
    if kind == "environment":  # the package lists: name -> version
        pa, pb = (dict(p.split("==", 1) for p in f.pop("packages", [])) for f in (fa, fb))
        changes += [Change(f"package {c.name}", c.a, c.b) for c in _compare(pa, pb)]
    return _compare(fa, fb) + changes
