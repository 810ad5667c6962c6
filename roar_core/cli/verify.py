"""`roar-core verify`: is the recorded lineage still true of the files on disk?

For a file (or a content digest), every version in its recorded ancestry is checked; for a
run, the files it read and wrote.  Each local file is hashed now (the stat cache first: an
unchanged file is not read) and compared with the digest recorded: ok, changed or missing.
An output is *stale* when it was derived, at any distance, from a version that changed or
is gone, and nobody has written that output again since: re-running its producers would
make something else.  S3 objects are named but not fetched (re-hashing one would download
it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roar_core.ids import looks_like_run_id
from roar_core.lineage import LineageGraph
from roar_core.pipeline.hashing import Hasher
from roar_core.pipeline.store import Store

OK, CHANGED, MISSING, UNCHECKED = "ok", "changed", "missing", "not checked"


@dataclass
class Checked:
    uri: str
    recorded: str  # blake3:<hex>
    status: str  # OK, CHANGED, MISSING or UNCHECKED
    now: str | None = None  # the digest on disk now, when changed


@dataclass
class Stale:
    uri: str
    digest: str
    run_id: str
    job_name: str
    because: list[str] = field(default_factory=list)  # the changed versions it derives from


@dataclass
class Report:
    key: str
    checked: list[Checked]
    stale: list[Stale]

    @property
    def ok(self) -> bool:
        return not self.stale and all(c.status in (OK, UNCHECKED) for c in self.checked)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "ok": self.ok,
                "checked": [vars(c) for c in self.checked],
                "stale": [vars(s) for s in self.stale]}


def verify(store: Store, hasher: Hasher, key: str, min_size: int | None) -> Report:
    """`key`: a run id, or what `Store.lineage` takes (an absolute path, a URI, a digest)."""
    run = store.task_run(key) if looks_like_run_id(key) else None
    if run is not None:
        versions = {(a.uri, a.digest) for a in store.accesses_of(run.run_id)
                    if a.digest and a.role in ("input", "output")}
    else:
        g = store.lineage(key, "upstream", None, min_size)
        versions = {(a.uri, a.digest) for a in g.artifacts.values() if a.digest}
    checked = check(hasher, sorted(versions))
    return Report(key, checked, _stale(store, checked, min_size))


def check(hasher: Hasher, versions: list[tuple[str, str]]) -> list[Checked]:
    local = [Path(uri) for uri, _ in versions if uri.startswith("/")]
    found = hasher.hash_files(local) if local else {}
    out = []
    for uri, digest in versions:
        if not uri.startswith("/"):
            out.append(Checked(uri, digest, UNCHECKED))
            continue
        h = found.get(Path(uri))
        if h is None:
            out.append(Checked(uri, digest, MISSING))
        elif "blake3:" + h.digest == digest:
            out.append(Checked(uri, digest, OK))
        else:
            out.append(Checked(uri, digest, CHANGED, "blake3:" + h.digest))
    return out


def _stale(store: Store, checked: list[Checked], min_size: int | None) -> list[Stale]:
    """Outputs derived from a changed or missing version, still the latest at their path."""
    stale: dict[tuple[str, str], Stale] = {}
    for c in checked:
        if c.status not in (CHANGED, MISSING):
            continue
        g = store.lineage(c.recorded, "downstream", None, min_size)
        for uri, digest, run_id, job in _outputs(g):
            if (uri, digest) == (c.uri, c.recorded):
                continue
            s = stale.get((uri, digest))
            if s is None:
                latest = store.latest_version(uri)
                if latest is None or latest.digest != digest:
                    continue  # written again since: that version is what holds now
                s = stale[(uri, digest)] = Stale(uri, digest, run_id, job)
            if c.uri not in s.because:
                s.because.append(c.uri)
    return sorted(stale.values(), key=lambda s: s.uri)


def _outputs(g: LineageGraph) -> list[tuple[str, str, str, str]]:
    out = []
    for e in g.edges:
        if e.kind != "output":
            continue
        a, r = g.artifacts[e.target], g.runs[e.source]
        if a.digest:
            out.append((a.uri, a.digest, r.run_id, r.job_name))
    return out
