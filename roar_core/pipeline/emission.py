"""Build OpenLineage run events for tasks and workflow runs.

Pure functions over small records: no I/O, no transport (the spool sends). One run per task:
START at begin, COMPLETE/FAIL/ABORT at end with the task's inputs and outputs, linked to the
workflow run by the `parent` facet. Files are named by path (`file` namespace) or URI (`s3://`)
and carry their blake3 digest as `version` and `contentHash`, so consumers can join runs by
content even when paths differ.

Events are built directly as JSON-ready dicts (`Event`): exactly what the client's
`Serde.to_dict` gives for its `RunEvent` (no nulls, enums as their values, every facet with
`_producer` and `_schemaURL`), but without the client's attrs objects per dataset: their
validators and `Serde`'s rebuild of the tree cost ~75 us per file, more than a task's whole
per-file budget. The spool encodes an `Event` with plain `json.dumps`. The client's classes
appear only where an engine needs them (`input_dataset`/`output_dataset` for Airflow's
provider) and for the facets integrations pass in.

Everything that could hold a secret (command line, error text) is masked here, at the last
point before an event exists, so no caller can forget it.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cache
from importlib import metadata
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit
from uuid import UUID, uuid5

from roar_core import ids
from roar_core.pipeline.redact import redact_argv, redact_text
from roar_core.pipeline.sourcecode import CodeVersion

if TYPE_CHECKING:
    from openlineage.client.event_v2 import InputDataset, OutputDataset, RunEvent
    from openlineage.client.facet_v2 import JobFacet, RunFacet

HASH_ALGORITHM = "blake3"
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")  # blake3's default 32-byte output
# LifecycleStateChange's values (tests/core/test_emission.py holds this to the client's).
_LIFECYCLES = ("ALTER", "CREATE", "DROP", "OVERWRITE", "RENAME", "TRUNCATE")
# Symlink identifiers name the path a task actually read when it is published under the
# producer's identity (join by content hash).
SYMLINK_TYPE = "FILE"


@cache
def roar_version() -> str:
    try:
        return metadata.version("roar-core")
    except metadata.PackageNotFoundError:  # running from a source checkout
        import roar_core

        return getattr(roar_core, "__version__", "0+unknown")


@cache
def producer() -> str:
    """URI naming roar as the producer of events and facets (never the client's default)."""
    return f"https://roar.dev/roar-core/{roar_version()}"


def new_run_id() -> str:
    """A fresh run id: UUIDv7 (time-ordered)."""
    return ids.new_run_id()


# ---- inputs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRef:
    """Another run this one hangs under (the workflow run of a task, for instance)."""

    namespace: str
    job_name: str
    run_id: str


@dataclass
class Dataset:
    """A file or object as read or written by a task."""

    namespace: str
    name: str
    digest: str | None = None
    """blake3 hex digest of the content; None when unknown (e.g. deleted)."""
    size: int | None = None
    symlinks: list[tuple[str, str]] = field(default_factory=list)
    """(namespace, name) of the paths actually read, when published under another identity."""
    lifecycle: str | None = None
    """CREATE, OVERWRITE, DROP, TRUNCATE, RENAME or ALTER."""
    previous: tuple[str, str] | None = None
    """(namespace, name) before a RENAME."""
    unknown_version: str | None = None
    """Why the version (the content the task read or left) is unknown: no digest then."""
    object_version: str | None = None
    """An S3 object's own version (VersionId, else ETag): its `datasetVersion`."""


@dataclass(frozen=True)
class JobType:
    processing_type: str = "BATCH"
    integration: str = "ROAR"
    job_type: str = "TASK"


@dataclass(frozen=True)
class Engine:
    """The workflow engine that ran the job (e.g. ray 2.60)."""

    name: str
    version: str


@dataclass
class TaskInfo:
    """Fields of the `roar_task` run facet."""

    engine: str
    engine_task_id: str
    host: str
    pid: int
    attempt: int = 0
    node_id: str | None = None
    traced: bool = True
    untraced_reason: str | None = None
    dropped_events: int = 0
    command: list[str] | None = None
    parent_task_id: str | None = None
    unseen_io: list[str] | None = None  # S3 clients run whose transfers roar cannot see


@dataclass
class IOCheck:
    """Fields of the `roar_io` run facet: observed versus declared I/O."""

    undeclared_reads: list[str] | None = None
    undeclared_writes: list[str] | None = None
    declared_untouched: list[str] | None = None


@dataclass(frozen=True)
class SourceCode:
    language: str
    source: str


@dataclass(frozen=True)
class CodeLocation:
    url: str
    type: str = "git"
    repo_url: str | None = None
    path: str | None = None
    version: str | None = None
    tag: str | None = None
    branch: str | None = None


@dataclass
class _Lineage:
    namespace: str
    job_name: str
    run_id: str
    event_time: datetime | str | None = None
    """Aware datetime or ISO-8601 string with offset; None means now."""
    parent: RunRef | None = None
    root: RunRef | None = None
    """Top of the run tree; defaults to `parent` (a workflow run is normally the top)."""
    engine: Engine | None = None
    error_message: str | None = None
    """Used by FAIL and ABORT events only."""
    stack_trace: str | None = None
    error_language: str = "python"
    source_code: SourceCode | None = None
    code_location: CodeLocation | None = None
    run_facets: Mapping[str, RunFacet | Mapping[str, Any]] = field(default_factory=dict)
    """Extra run facets (integration-specific): the client's facet objects or JSON-ready dicts.
    roar's own facets win on a key clash."""
    job_facets: Mapping[str, JobFacet | Mapping[str, Any]] = field(default_factory=dict)


@dataclass
class TaskLineage(_Lineage):
    """Everything one task run's events say."""

    inputs: list[Dataset] = field(default_factory=list)
    outputs: list[Dataset] = field(default_factory=list)
    job_type: JobType = JobType()
    task: TaskInfo | None = None
    io: IOCheck | None = None
    code: list[CodeVersion] = field(default_factory=list)
    """The task's code files (the `roar_code` job facet; the first in git also gives
    `sourceCodeLocation` unless `code_location` is set)."""


@dataclass
class WorkflowLineage(_Lineage):
    """A workflow run (DAG run, Snakemake invocation, Ray job): the parent of its tasks."""

    job_type: JobType = JobType(job_type="DAG")


# ---- dataset naming -------------------------------------------------------------------------


def file_dataset(path: str, host: str | None = None) -> tuple[str, str]:
    """(namespace, name) of a local file: `file` (or `file://host` for non-shared disks)."""
    if not path or path[0] != "/":
        # A relative path would be resolved against *this* process's cwd, not the task's.
        raise ValueError(f"file dataset needs an absolute path, got {path!r}")
    namespace = f"file://{_nonempty(host, 'host')}" if host is not None else "file"
    # Nearly every path comes normal (classification normalised it): normpath only where
    # it could change something (one call per file of a task).
    if "/." in path or "//" in path or path.endswith("/"):
        path = posixpath.normpath(path)
    return namespace, path


def dataset_of(uri: str, host: str | None = None) -> tuple[str, str]:
    """(namespace, name) of a path or an s3:// URI, as recorded."""
    return s3_dataset(uri) if uri.startswith("s3://") else file_dataset(uri, host)


def s3_dataset(uri: str) -> tuple[str, str]:
    """(namespace, name) of an S3 object: `s3://bucket` and the key."""
    parts = urlsplit(uri)
    if parts.scheme not in ("s3", "s3a", "s3n"):
        raise ValueError(f"not an S3 URI (s3://bucket/key): {uri!r}")
    bucket = parts.netloc.rpartition("@")[2]  # never keep credentials from the URI
    key = parts.path.lstrip("/")
    if not bucket or not key:
        raise ValueError(f"S3 URI needs a bucket and a key: {uri!r}")
    return f"s3://{bucket}", key


# ---- events -------------------------------------------------------------------------------


class Event(dict[str, Any]):
    """A run event as JSON-ready data: what `Serde.to_dict` gives for the client's `RunEvent`.

    The type promises that the data holds only JSON types and no nulls (the client's serializer
    would drop those), so `to_json` and the spool encode it with plain `json.dumps` and sorted
    keys, byte for byte what `Serde.to_json` writes. Code that edits an Event must keep that
    promise, or hand over a plain dict instead (those go through the client's serializer).
    """

    __slots__ = ()


# roar's own facets: versioned JSON schemas shipped in roar_core/schemas/ (see facets.py).
ROAR_SCHEMA_BASE = "https://roar.dev/spec/facets"


def schema_url(version: str, facet: str) -> str:
    return f"{ROAR_SCHEMA_BASE}/{version}/{facet}.json#/$defs/{facet}"


# Schema URLs of the event and of each facet, as the client's classes give them
# (`_get_schema()`): written out, because importing the client (its transports, HTTP
# libraries, asyncio) costs ~0.2 s in every process that only records and spools. The
# client is imported where it is used: to send, and for the objects engines ask for.
# tests/core/test_emission.py holds each URL to the installed client's.
_OL = "https://openlineage.io/spec"


def _ol_facet(version: str, facet: str) -> str:
    return f"{_OL}/facets/{version}/{facet}.json#/$defs/{facet}"


_EVENT_SCHEMA = f"{_OL}/2-0-2/OpenLineage.json#/$defs/RunEvent"
_VERSION_SCHEMA = _ol_facet("1-0-1", "DatasetVersionDatasetFacet")
_LIFECYCLE_SCHEMA = _ol_facet("1-0-1", "LifecycleStateChangeDatasetFacet")
_SYMLINKS_SCHEMA = _ol_facet("1-0-1", "SymlinksDatasetFacet")
_OUTPUT_STATISTICS_SCHEMA = _ol_facet("1-0-2", "OutputStatisticsOutputDatasetFacet")
_PARENT_SCHEMA = _ol_facet("1-2-0", "ParentRunFacet")
_PROCESSING_ENGINE_SCHEMA = _ol_facet("1-1-1", "ProcessingEngineRunFacet")
_ERROR_MESSAGE_SCHEMA = _ol_facet("1-0-1", "ErrorMessageRunFacet")
_JOB_TYPE_SCHEMA = _ol_facet("2-0-4", "JobTypeJobFacet")
_SOURCE_CODE_SCHEMA = _ol_facet("1-0-1", "SourceCodeJobFacet")
_SOURCE_CODE_LOCATION_SCHEMA = _ol_facet("1-1-0", "SourceCodeLocationJobFacet")
_CONTENT_HASH_SCHEMA = schema_url("1-0-0", "ContentHashDatasetFacet")
_ROAR_TASK_SCHEMA = schema_url("1-0-0", "RoarTaskRunFacet")
_ROAR_IO_SCHEMA = schema_url("1-0-0", "RoarIORunFacet")
_UNKNOWN_VERSION_SCHEMA = schema_url("1-0-0", "RoarUnknownVersionDatasetFacet")
_CONTENT_MATCH_SCHEMA = schema_url("1-0-0", "RoarContentMatchRunFacet")
_ROAR_CODE_SCHEMA = schema_url("1-0-0", "RoarCodeJobFacet")
_ROAR_MACHINE_SCHEMA = schema_url("1-0-0", "RoarMachineRunFacet")
_ROAR_ENVIRONMENT_SCHEMA = schema_url("1-0-0", "RoarEnvironmentRunFacet")
# The job of the runs that stand for an inferred edge (see content_match_event).
CONTENT_MATCH_JOB = "roar.content_match"

START, COMPLETE, FAIL, ABORT = "START", "COMPLETE", "FAIL", "ABORT"  # RunState's values


def start_event(t: TaskLineage) -> Event:
    return _task_event(START, t)


def complete_event(t: TaskLineage) -> Event:
    return _task_event(COMPLETE, t)


def fail_event(t: TaskLineage) -> Event:
    return _task_event(FAIL, t)


def abort_event(t: TaskLineage) -> Event:
    return _task_event(ABORT, t)


def workflow_start(w: WorkflowLineage) -> Event:
    return _event(START, w, w.job_type)


def workflow_complete(w: WorkflowLineage) -> Event:
    return _event(COMPLETE, w, w.job_type)


def workflow_fail(w: WorkflowLineage) -> Event:
    return _event(FAIL, w, w.job_type)


def workflow_abort(w: WorkflowLineage) -> Event:
    return _event(ABORT, w, w.job_type)


@dataclass
class ContentMatch:
    """An inferred edge: a task read `copy`, whose bytes were produced as `source` (another
    path) by another run, and no traced run was seen making the copy."""

    namespace: str
    source: Dataset
    copy: Dataset
    producer_run_id: str
    producer_job: str
    consumer_run_id: str
    event_time: datetime | str | None = None


def content_match_event(m: ContentMatch) -> Event:
    """A COMPLETE run of `roar.content_match` from the producer's version to the copy: in
    Marquez an edge of its own, drawn and named as inferred, never a rename (`symlinks`
    would merge the two datasets for good).  One run per (source, copy, content): its id
    is derived from them, so a copy read again sends the same run again."""
    if m.copy.digest is None or m.copy.digest != m.source.digest:
        raise ValueError("a content match needs the same digest on both sides")
    key = f"{m.source.namespace}|{m.source.name}|{m.copy.namespace}|{m.copy.name}|{m.copy.digest}"
    run_id = str(uuid5(_CONTENT_MATCH_NS, key))
    info = TaskLineage(namespace=m.namespace, job_name=CONTENT_MATCH_JOB, run_id=run_id,
                       event_time=m.event_time, job_type=JobType(job_type="CONTENT_MATCH"))
    p = producer()
    return _event(
        COMPLETE, info, info.job_type, inputs=[_input(m.source, p)],
        outputs=[_output(m.copy, p)],
        run_facets={"roar_contentMatch": _facet(
            _CONTENT_MATCH_SCHEMA, inferredFrom="equal blake3 digests",
            algorithm=HASH_ALGORITHM, digest=m.copy.digest,
            producerRunId=_run_id(m.producer_run_id), producerJob=m.producer_job,
            consumerRunId=_run_id(m.consumer_run_id))},
    )


_CONTENT_MATCH_NS = UUID("6f1f3c8e-2d7a-5b4e-9c1a-0d5e7f3b2a91")


def to_dict(event: Event | RunEvent | Mapping[str, Any]) -> dict[str, Any]:
    """The event as JSON-ready data, as the client serializes it (no nulls).

    An `Event` already is that: it comes back as a plain dict (the top level copied, the
    rest shared). The client's `RunEvent` and other mappings go through its serializer.
    """
    if isinstance(event, Event):
        return dict(event)
    from openlineage.client.serde import Serde

    return Serde.to_dict(dict(event) if isinstance(event, Mapping) else event)


def to_json(event: Event | RunEvent | Mapping[str, Any]) -> str:
    """Deterministic JSON (sorted keys, no nulls), byte for byte the client's `Serde.to_json`."""
    if isinstance(event, Event):
        return json.dumps(event, sort_keys=True)
    from openlineage.client.serde import Serde

    return Serde.to_json(dict(event) if isinstance(event, Mapping) else event)


# ---- pieces of a task event, for integrations whose engine emits the event itself -----------
# (Airflow's OpenLineage provider builds the RunEvent; roar contributes datasets and facets.)


def input_dataset(d: Dataset) -> InputDataset:
    """A recorded input as the client's `InputDataset`, with roar's dataset facets.

    The facets are the JSON-ready dicts our own events carry (the client serializes dict
    facets as they are), so both paths share one builder."""
    from openlineage.client.event_v2 import InputDataset

    data = _input(d, producer())
    return InputDataset(
        namespace=data["namespace"],
        name=data["name"],
        facets=data.get("facets"),
        inputFacets=data["inputFacets"],
    )


def output_dataset(d: Dataset) -> OutputDataset:
    """A recorded output as the client's `OutputDataset`, with roar's dataset facets (dicts,
    as for `input_dataset`)."""
    from openlineage.client.event_v2 import OutputDataset

    data = _output(d, producer())
    return OutputDataset(
        namespace=data["namespace"],
        name=data["name"],
        facets=data.get("facets"),
        outputFacets=data.get("outputFacets"),
    )


def provenance_facets() -> dict[str, dict[str, Any]]:
    """`roar_machine` and `roar_environment` of this process's machine and environment."""
    from roar_core.pipeline import provenance

    machine, environment = provenance.machine(), provenance.environment()
    key = (machine.digest, environment.digest)
    facets = _PROVENANCE_FACETS.get(key)
    if facets is None:
        from openlineage.client.serde import Serde

        # As the client's serializer leaves them (nested nulls dropped too), once.
        facets = _PROVENANCE_FACETS[key] = {
            "roar_machine": _Built(Serde.to_dict(
                _facet(_ROAR_MACHINE_SCHEMA, **machine.facet))),
            "roar_environment": _Built(Serde.to_dict(
                _facet(_ROAR_ENVIRONMENT_SCHEMA, **environment.facet)))}
    return facets


_PROVENANCE_FACETS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}


def task_run_facets(t: TaskLineage) -> dict[str, dict[str, Any]]:
    """roar's own run facets of a task event (`roar_task`, `roar_io`), without the envelope
    facets (parent, processing engine, error) that the emitting engine adds itself.

    JSON-ready dicts, as in our events; the client serializes dict facets as they are."""
    run_facets: dict[str, dict[str, Any]] = {}
    if t.task is not None:
        run_facets["roar_task"] = _task_facet(t.task)
    if (io := t.io) is not None:
        run_facets["roar_io"] = _facet(
            _ROAR_IO_SCHEMA,
            undeclaredReads=_copy(io.undeclared_reads),
            undeclaredWrites=_copy(io.undeclared_writes),
            declaredUntouched=_copy(io.declared_untouched),
        )
    return run_facets


def _task_event(state: str, t: TaskLineage) -> Event:
    p = producer()
    return _event(
        state,
        t,
        t.job_type,
        inputs=[_input(d, p) for d in t.inputs],
        outputs=[_output(d, p) for d in t.outputs],
        run_facets=task_run_facets(t),
    )


def _event(
    state: str,
    info: _Lineage,
    job_type: JobType,
    *,
    inputs: list[dict[str, Any]] | None = None,
    outputs: list[dict[str, Any]] | None = None,
    run_facets: dict[str, dict[str, Any]] | None = None,
) -> Event:
    namespace = _nonempty(info.namespace, "job namespace")
    job_name = _nonempty(info.job_name, "job name")
    facets = {**_plain_facets(info.run_facets), **(run_facets or {})}
    if info.parent is not None:
        facets["parent"] = _parent_facet(info.parent, info.root or info.parent)
    elif info.root is not None:
        raise ValueError("root run given without a parent run")
    if info.engine is not None:
        facets["processing_engine"] = _facet(
            _PROCESSING_ENGINE_SCHEMA,
            version=_nonempty(info.engine.version, "engine version"),
            name=_nonempty(info.engine.name, "engine name"),
            openlineageAdapterVersion=roar_version(),
        )
    if state in (FAIL, ABORT) and info.error_message:
        facets["errorMessage"] = _facet(
            _ERROR_MESSAGE_SCHEMA,
            message=redact_text(info.error_message),
            programmingLanguage=info.error_language,
            stackTrace=redact_text(info.stack_trace) if info.stack_trace else None,
        )
    return Event(
        eventTime=_event_time(info.event_time),
        eventType=state,
        producer=producer(),
        schemaURL=_EVENT_SCHEMA,
        run={"runId": _run_id(info.run_id), "facets": facets},
        job={"namespace": namespace, "name": job_name, "facets": _job_facets(info, job_type)},
        inputs=inputs or [],
        outputs=outputs or [],
    )


def _facet(schema_url: str, **fields: Any) -> dict[str, Any]:
    """A facet as the client serializes it: base fields, and the fields that are not None
    (the client drops nulls). For the few facets of an event, not the per-file ones."""
    facet: dict[str, Any] = {"_producer": producer(), "_schemaURL": schema_url}
    facet.update((key, value) for key, value in fields.items() if value is not None)
    return facet


def _copy(items: list[str] | None) -> list[str] | None:
    # The event must not share a list the caller may still change.
    return None if items is None else list(items)


def _plain_facets(facets: Mapping[str, Any]) -> dict[str, Any]:
    # Facets from integrations, a few per event: the client's objects or dicts of unknown
    # content, both through its serializer so that the event stays null-free.
    if not facets:
        return {}
    return {key: _plain_facet(f) for key, f in facets.items()}


def _plain_facet(f: Any) -> dict[str, Any]:
    # The serializer rebuilds a facet whole (~20 us each), and the same ones come in event
    # after event: the machine's and environment's, which roar built null-free (`_Built`),
    # go as they are; a task's own facet objects, in its START and its end, are serialized
    # once (kept for the object; events never change a facet: they are encoded as built).
    # A dict of unknown content is serialized every time: its owner may change it.
    if type(f) is _Built:
        return f
    from openlineage.client.serde import Serde

    if isinstance(f, Mapping):
        return Serde.to_dict(dict(f))
    got = _PLAIN.get(id(f))
    if got is not None and got[0] is f:
        return got[1]
    plain = Serde.to_dict(f)
    if len(_PLAIN) >= 64:
        _PLAIN.clear()
    _PLAIN[id(f)] = (f, plain)  # (holding f: its id is not reused meanwhile)
    return plain


_PLAIN: dict[int, tuple[Any, dict[str, Any]]] = {}


class _Built(dict):
    """A facet roar built itself, null-free (`_facet`), that the events share."""


def _job_facets(info: _Lineage, job_type: JobType) -> dict[str, Any]:
    facets = _plain_facets(info.job_facets)
    facets["jobType"] = _facet(
        _JOB_TYPE_SCHEMA,
        processingType=job_type.processing_type,
        integration=job_type.integration,
        jobType=job_type.job_type,
    )
    if info.source_code is not None:
        facets["sourceCode"] = _facet(
            _SOURCE_CODE_SCHEMA,
            language=info.source_code.language,
            sourceCode=info.source_code.source,
        )
    code = getattr(info, "code", None)
    loc = info.code_location
    if code:
        facets["roar_code"] = _code_facet(code)
        if loc is None:
            loc = next((_location(c) for c in code if c.repo is not None), None)
    if loc is not None:
        facets["sourceCodeLocation"] = _facet(
            _SOURCE_CODE_LOCATION_SCHEMA,
            type=loc.type,
            url=redact_text(loc.url),
            repoUrl=redact_text(loc.repo_url) if loc.repo_url else None,
            path=loc.path,
            version=loc.version,
            tag=loc.tag,
            branch=loc.branch,
        )
    return facets


def _location(c: CodeVersion) -> CodeLocation:
    repo = c.repo
    assert repo is not None
    return CodeLocation(url=repo.url, repo_url=repo.url, path=c.repo_path,
                        version=repo.commit, branch=repo.branch)


def _code_facet(code: list[CodeVersion]) -> dict[str, Any]:
    files = []
    for c in code:
        f: dict[str, Any] = {"path": c.path, "digest": c.digest}
        if c.repo is not None:
            f.update(repository=redact_text(c.repo.url), commit=c.repo.commit,
                     repoPath=c.repo_path)
            if c.dirty is not None:
                f["dirty"] = c.dirty
        files.append(f)
    return _facet(_ROAR_CODE_SCHEMA, files=files)


def _task_facet(task: TaskInfo) -> dict[str, Any]:
    return _facet(
        _ROAR_TASK_SCHEMA,
        engine=_nonempty(task.engine, "task engine"),
        engineTaskId=_nonempty(task.engine_task_id, "engine task id"),
        host=_nonempty(task.host, "task host"),
        pid=task.pid,
        traced=task.traced,
        attempt=task.attempt,
        droppedEvents=task.dropped_events,
        nodeId=task.node_id,
        untracedReason=redact_text(task.untraced_reason) if task.untraced_reason else None,
        # Callers should pass a redacted argv already; masking twice is harmless and means
        # a caller that forgot cannot leak.
        command=redact_argv(task.command) if task.command is not None else None,
        parentTaskId=task.parent_task_id,
        unseenObjectIO=task.unseen_io,
    )


def _parent_facet(parent: RunRef, root: RunRef) -> dict[str, Any]:
    # The client's Run/Job/RootRun/RootJob of this facet serialize with empty `facets`.
    return _facet(
        _PARENT_SCHEMA,
        run={"runId": _run_id(parent.run_id), "facets": {}},
        job={
            "namespace": _nonempty(parent.namespace, "parent namespace"),
            "name": _nonempty(parent.job_name, "parent job name"),
            "facets": {},
        },
        root={
            "run": {"runId": _run_id(root.run_id), "facets": {}},
            "job": {
                "namespace": _nonempty(root.namespace, "root namespace"),
                "name": _nonempty(root.job_name, "root job name"),
                "facets": {},
            },
        },
    )


# Per file of a task (thousands of them): literal dicts, no per-facet helper calls. `p` is
# `producer()`, looked up once per event.


def _dataset_facets(d: Dataset, p: str) -> dict[str, Any]:
    size = d.size
    if size is not None and (not isinstance(size, int) or size < 0):
        raise ValueError(f"dataset {d.name!r}: size must be a non-negative int, got {size!r}")
    facets: dict[str, Any] = {}
    if d.object_version is not None:  # S3's identity of the version; the blake3 beside it
        facets["version"] = {
            "_producer": p,
            "_schemaURL": _VERSION_SCHEMA,
            "datasetVersion": _nonempty(d.object_version, "object version"),
        }
    if (digest := d.digest) is not None:
        if not _HEX_DIGEST.fullmatch(digest):
            raise ValueError(
                f"dataset {d.name!r}: digest must be 64 lowercase hex chars, got {digest!r}"
            )
        if d.object_version is None:
            facets["version"] = {
                "_producer": p,
                "_schemaURL": _VERSION_SCHEMA,
                "datasetVersion": f"{HASH_ALGORITHM}:{digest}",
            }
        content: dict[str, Any] = {
            "_producer": p,
            "_schemaURL": _CONTENT_HASH_SCHEMA,
            "digest": digest,
            "algorithm": HASH_ALGORITHM,
        }
        if size is not None:
            content["size"] = size
        facets["contentHash"] = content
    elif d.unknown_version is not None:
        facets["roar_unknownVersion"] = {
            "_producer": p,
            "_schemaURL": _UNKNOWN_VERSION_SCHEMA,
            "reason": d.unknown_version,
        }
    if d.lifecycle is not None:
        facets["lifecycleStateChange"] = _lifecycle_facet(d, p)
    if d.symlinks:
        facets["symlinks"] = {
            "_producer": p,
            "_schemaURL": _SYMLINKS_SCHEMA,
            "identifiers": [
                {
                    "namespace": _nonempty(ns, "symlink namespace"),
                    "name": _nonempty(name, "symlink name"),
                    "type": SYMLINK_TYPE,
                }
                for ns, name in d.symlinks
            ],
        }
    return facets


def _lifecycle_facet(d: Dataset, p: str) -> dict[str, Any]:
    if d.lifecycle not in _LIFECYCLES:
        raise ValueError(
            f"dataset {d.name!r}: lifecycle {d.lifecycle!r} is not one of {', '.join(_LIFECYCLES)}"
        )
    facet = {"_producer": p, "_schemaURL": _LIFECYCLE_SCHEMA, "lifecycleStateChange": d.lifecycle}
    if d.previous is not None:
        ns, name = d.previous
        facet["previousIdentifier"] = {
            "name": _nonempty(name, "previous name"),
            "namespace": _nonempty(ns, "previous namespace"),
        }
    return facet


def _dataset(d: Dataset, p: str) -> dict[str, Any]:
    data: dict[str, Any] = {
        "namespace": _nonempty(d.namespace, "dataset namespace"),
        "name": _nonempty(d.name, "dataset name"),
    }
    if facets := _dataset_facets(d, p):
        data["facets"] = facets
    return data


def _input(d: Dataset, p: str) -> dict[str, Any]:
    data = _dataset(d, p)
    data["inputFacets"] = {}  # the client's InputDataset serializes an empty one
    return data


def _output(d: Dataset, p: str) -> dict[str, Any]:
    data = _dataset(d, p)
    if d.size is not None:
        data["outputFacets"] = {
            "outputStatistics": {
                "_producer": p,
                "_schemaURL": _OUTPUT_STATISTICS_SCHEMA,
                "size": d.size,
                "fileCount": 1,
            }
        }
    return data


def _nonempty(value: str | None, what: str) -> str:
    # Marquez accepts an empty namespace or name and then its API breaks for everyone:
    # refuse here, where the caller can still see which field it was.
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _run_id(value: str) -> str:
    try:
        return str(UUID(value))
    except (TypeError, ValueError, AttributeError):
        raise ValueError(f"run id must be a UUID, got {value!r}") from None


def _event_time(value: datetime | str | None) -> str:
    if value is None:
        return datetime.now(timezone.utc).isoformat()
    if isinstance(value, str):
        try:
            # Python 3.10's fromisoformat does not take a trailing "Z".
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"event time is not ISO-8601: {value!r}") from None
    else:
        parsed = value
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValueError(f"event time needs a UTC offset (Marquez misreads naive times): {value!r}")
    return parsed.isoformat()
