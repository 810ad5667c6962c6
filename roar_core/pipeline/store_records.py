"""Plain records of the lineage store: what callers pass in, what queries return.

Kept apart from `store.py` (engines, migrations, queries) so emission and the CLI can use them
without thinking about databases; `roar_core.pipeline.store` re-exports every name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from roar_core.ids import host_name

Role = Literal["input", "output", "deleted", "transient"]
Status = Literal["RUNNING", "COMPLETE", "FAIL", "ABORT"]
ROLES: tuple[str, ...] = ("input", "output", "deleted", "transient")
STATUSES: tuple[str, ...] = ("RUNNING", "COMPLETE", "FAIL", "ABORT")

_DIGEST_RE = re.compile(r"(?:blake3:)?([0-9a-f]{64})")
_CANONICAL_RE = re.compile(r"blake3:[0-9a-f]{64}")
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class StoreError(Exception):
    """The store cannot be opened or written; the message is one line and names the cause."""


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class CodeFile:
    path: str
    digest: str
    # Where it is in git, when it is (roar_core.pipeline.sourcecode): the repository's URL
    # (no credentials), the commit checked out, its path there, whether it differed.
    repo: str | None = None
    commit: str | None = None
    repo_path: str | None = None
    dirty: bool | None = None


@dataclass
class WorkflowRun:
    run_id: str
    engine: str
    namespace: str
    job_name: str
    started_at: datetime
    facets: dict[str, Any] = field(default_factory=dict)


@dataclass
class TaskRun:
    run_id: str
    engine: str
    namespace: str
    job_name: str
    started_at: datetime
    workflow_run_id: str | None = None
    parent_run_id: str | None = None
    engine_task_id: str | None = None
    attempt: int = 0
    host: str = field(default_factory=host_name)
    pid: int = field(default_factory=os.getpid)
    command: list[str] = field(default_factory=list)  # already redacted by the caller
    code: list[CodeFile] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    traced: bool = True
    untraced_reason: str | None = None


@dataclass
class Access:
    """One file a task touched. `uri` is where it was observed (absolute path or scheme://);
    `path_read` the path the task used to reach it when that differs (e.g. a symlink)."""

    uri: str
    role: Role
    digest: str | None
    size: int | None = None
    mtime_ns: int | None = None
    path_read: str | None = None
    note: str | None = None  # digest None: why the version is unknown
    object_version: str | None = None  # an S3 object's VersionId, else its ETag


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class WorkflowRunRecord:
    run_id: str
    engine: str
    namespace: str
    job_name: str
    started_at: datetime
    ended_at: datetime | None
    status: str
    facets: dict[str, Any]


@dataclass(frozen=True)
class TaskRunRecord:
    run_id: str
    engine: str
    namespace: str
    job_name: str
    started_at: datetime
    ended_at: datetime | None
    status: str
    workflow_run_id: str | None
    parent_run_id: str | None
    engine_task_id: str | None
    attempt: int
    host: str
    pid: int
    exit_code: int | None
    error_message: str | None
    command: list[str]
    code: list[CodeFile]
    environment: dict[str, Any]
    traced: bool
    untraced_reason: str | None
    dropped_events: int


# Not frozen (hashed all the same): a frozen dataclass's __init__ sets each field through
# object.__setattr__, 9.7 ms for a 5,000-file task's records against 2.9 (the recorder
# makes them while the store's helper thread writes the rows, and takes the GIL from it).
@dataclass(unsafe_hash=True)
class AccessRecord:
    """A stored access. `dataset_namespace`/`dataset_name` is the OpenLineage identity to emit:
    the producer's when the content was written elsewhere, with `path_read` the path used."""

    uri: str
    role: str
    digest: str | None
    size: int | None
    mtime_ns: int | None
    path_read: str | None
    dataset_namespace: str
    dataset_name: str
    note: str | None = None  # digest None: why the version is unknown
    match: ProducedFile | None = None
    """Recording an input only: the output of another path this content was last produced
    as (an inferred edge, `roar.content_match`); never stored, the lineage finds it again."""
    object_version: str | None = None  # an S3 object's VersionId, else its ETag


@dataclass(frozen=True)
class FileVersion:
    uri: str
    digest: str
    size: int | None
    mtime_ns: int | None
    producer_run_id: str | None  # None: only ever seen as an input
    recorded_at: datetime
    last_seen_at: datetime


@dataclass(frozen=True)
class ProducedFile:
    uri: str
    digest: str
    run_id: str
    job_name: str
    dataset_namespace: str
    dataset_name: str


# ---------------------------------------------------------------------------------------------
# Pure helpers


def canonical_digest(digest: str) -> str:
    """Return "blake3:<64 lowercase hex>"; a bare 64-hex digest is accepted and prefixed."""
    if _CANONICAL_RE.fullmatch(digest):  # the usual case, the recorder's own digests
        return digest
    m = _DIGEST_RE.fullmatch(digest.lower())
    if m is None:
        raise ValueError(f"not a blake3 digest: {digest!r} (expected 'blake3:<64 hex>')")
    return f"blake3:{m.group(1)}"


def check_uri(uri: str) -> str:
    if uri.startswith("/") or _SCHEME_RE.match(uri):
        return uri
    raise ValueError(f"not an absolute path or URI: {uri!r}")


def dataset_identity(uri: str) -> tuple[str, str]:
    """OpenLineage (namespace, name): ("file", "/abs/path") or ("s3://bucket", "key")."""
    if uri.startswith("/"):
        return "file", uri
    scheme, _, rest = uri.partition("://")
    authority, _, path = rest.partition("/")
    if scheme == "file":
        return ("file" if not authority else f"file://{authority}"), "/" + path
    return f"{scheme}://{authority}", path


def check_status(status: str) -> str:
    if status not in STATUSES:
        raise ValueError(f"unknown run status {status!r} (one of {', '.join(STATUSES)})")
    return status


def check_aware(value: datetime, what: str) -> datetime:
    # Checked here rather than by the column type, whose errors would arrive wrapped as
    # database errors; naive times are ambiguous once workers on several hosts write.
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, not naive {value.isoformat()}")
    return value


def checked_access(a: Access) -> Access:
    if a.role not in ROLES:
        raise ValueError(f"unknown access role {a.role!r} (one of {', '.join(ROLES)})")
    check_uri(a.uri)
    if a.digest is None:
        return a
    digest = canonical_digest(a.digest)
    if digest is a.digest:
        return a  # one per file of a task: no copy when nothing changes
    return Access(a.uri, a.role, digest, a.size, a.mtime_ns, a.path_read, a.note,
                  a.object_version)


def checked_accesses(accesses: Iterable[Access]) -> list[Access]:
    """`checked_access` of each, in one loop: a big task's thousands are on the path to its
    answer, and nearly all are as the store takes them (the recorder's own)."""
    out: list[Access] = []
    add, canonical, scheme = out.append, _CANONICAL_RE.fullmatch, _SCHEME_RE.match
    for a in accesses:
        digest = a.digest
        if (a.role not in ROLES or not (a.uri.startswith("/") or scheme(a.uri))
                or (digest is not None and not canonical(digest))):
            a = checked_access(a)  # says what is wrong, or canonicalizes its digest
        add(a)
    return out


def code_json(code: Iterable[CodeFile]) -> list[dict[str, Any]]:
    out = []
    for c in code:
        if not isinstance(c, CodeFile):
            raise TypeError(f"code items must be CodeFile, not {type(c).__name__}")
        d: dict[str, Any] = {"path": c.path, "digest": c.digest}
        if c.commit is not None:
            d.update(repo=c.repo, commit=c.commit, repo_path=c.repo_path, dirty=c.dirty)
        out.append(d)
    return out
