"""roar's custom OpenLineage facets.

Each class points at a versioned JSON schema shipped in `roar_core/schemas/` (the same layout as
the official facet schemas: `$defs/<Facet>` extends OpenLineage's base facet, and `properties`
names the key the facet is stored under). A field change means a new schema version, so
consumers can always resolve the `_schemaURL` of an event they received long ago.
"""

from __future__ import annotations

import attr
from openlineage.client.generated.base import DatasetFacet, RunFacet

from roar_core.pipeline.emission import schema_url


@attr.define
class ContentHashDatasetFacet(DatasetFacet):
    """Content identity of a file: the same digest means the same bytes, whatever the path."""

    digest: str
    """Lowercase hex digest of the whole content."""
    algorithm: str = attr.field(default="blake3")
    size: int | None = attr.field(default=None)
    """Content length in bytes."""

    @staticmethod
    def _get_schema() -> str:
        return schema_url("1-0-0", "ContentHashDatasetFacet")


@attr.define
class RoarTaskRunFacet(RunFacet):
    """Which engine task this run is, where it ran and how complete its trace is."""

    engine: str
    """Workflow engine, e.g. ray, airflow, snakemake, cli."""
    engineTaskId: str
    host: str
    pid: int
    traced: bool
    """False when the task's file I/O could not be observed (see untracedReason)."""
    attempt: int = attr.field(default=0)
    droppedEvents: int = attr.field(default=0)
    """Trace records the tracer had to drop; non-zero means inputs/outputs may be missing."""
    nodeId: str | None = attr.field(default=None)
    untracedReason: str | None = attr.field(default=None)
    command: list[str] | None = attr.field(default=None)
    """argv of the task, secrets already masked."""
    parentTaskId: str | None = attr.field(default=None)
    unseenObjectIO: list[str] | None = attr.field(default=None)
    """S3 clients the task ran that roar cannot see (not boto3/botocore)."""

    @staticmethod
    def _get_schema() -> str:
        return schema_url("1-0-0", "RoarTaskRunFacet")


@attr.define
class RoarIORunFacet(RunFacet):
    """Observed versus declared I/O, for engines where tasks declare their files."""

    undeclaredReads: list[str] | None = attr.field(default=None)
    undeclaredWrites: list[str] | None = attr.field(default=None)
    declaredUntouched: list[str] | None = attr.field(default=None)
    """Declared inputs never read and declared outputs never written."""

    @staticmethod
    def _get_schema() -> str:
        return schema_url("1-0-0", "RoarIORunFacet")


@attr.define
class RoarMachineRunFacet(RunFacet):
    """The machine a task ran on (roar_core.pipeline.provenance)."""

    host: str
    cores: int
    cpuModel: str | None = attr.field(default=None)
    memoryBytes: int | None = attr.field(default=None)
    numaNodes: int | None = attr.field(default=None)
    gpus: list[dict] | None = attr.field(default=None)
    gpuTopology: str | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return schema_url("1-0-0", "RoarMachineRunFacet")


@attr.define
class RoarEnvironmentRunFacet(RunFacet):
    """The Python environment a task ran in; its package list is in roar's store."""

    python: str
    packagesDigest: str
    implementation: str | None = attr.field(default=None)
    executable: str | None = attr.field(default=None)
    packageCount: int | None = attr.field(default=None)
    containerImage: str | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return schema_url("1-0-0", "RoarEnvironmentRunFacet")


@attr.define
class RoarSnakemakeRunFacet(RunFacet):
    """A Snakemake job as the workflow declared it: rule, wildcards, params, resources, files."""

    rule: str
    jobid: int
    kind: str
    """How the job runs: shell, script, run, wrapper, notebook, cwl or template_engine."""
    wildcards: dict[str, str] = attr.field(factory=dict)
    params: dict | None = attr.field(default=None)
    """Named params, JSON-ready (other objects as their repr), secrets masked."""
    threads: int = attr.field(default=1)
    resources: dict | None = attr.field(default=None)
    input: list[str] = attr.field(factory=list)
    """Declared input files, absolute paths."""
    output: list[str] = attr.field(factory=list)
    log: list[str] | None = attr.field(default=None)
    benchmark: str | None = attr.field(default=None)
    flags: dict[str, list[str]] | None = attr.field(default=None)
    """Declared file -> its Snakemake flags (temp, protected, touch, directory, pipe...)."""
    checkpoint: bool = attr.field(default=False)
    shadow: str | None = attr.field(default=None)
    """Shadow depth of the rule (minimal, shallow, full, copy-minimal)."""
    group: str | None = attr.field(default=None)
    storage: list[str] | None = attr.field(default=None)
    """Declared files kept in a storage provider (their URIs); the job reads a local copy."""

    @staticmethod
    def _get_schema() -> str:
        return schema_url("1-0-0", "RoarSnakemakeRunFacet")


# Run facets by the key they are stored under, for callers that pass plain fields
# (roar_core.remote: the engine's process does not load the OpenLineage client).
RUN_FACETS: dict[str, type[RunFacet]] = {
    "roar_task": RoarTaskRunFacet,
    "roar_io": RoarIORunFacet,
    "roar_snakemake": RoarSnakemakeRunFacet,
}
