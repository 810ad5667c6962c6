"""Lineage graphs over the store, joined by content hash.

An input is linked to the run that produced its *content*: the candidates are all recorded
outputs with the input's digest, and `pick_producer` chooses one (same path first, then the
latest run that started no later than the reader). Where that output has another path, the copy
was never observed: the graph keeps both files under their own paths and joins them with an
edge of kind "inferred" (what `roar.content_match` runs publish), for contents of at least
`min_size` bytes only (smaller ones, empty files first, are equal by chance; None: no inferred
edges). The same rule finds the match when an input is recorded (`Store.record_accesses`), so
the graph and the emitted OpenLineage events agree.

Traversal is breadth-first with a fixed number of indexed queries per level (accesses by run or
by digest, outputs by digest), which works the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from sqlalchemy import Connection, bindparam, func, literal_column, select

from roar_core.pipeline.direct import Direct
from roar_core.pipeline.store_schema import AccessRow, FileVersionRow, TaskRunRow

Direction = Literal["upstream", "downstream"]

# SQLite before 3.32 allows 999 bound parameters per statement.
_CHUNK = 900
_DIGEST_RE = re.compile(r"(?:blake3:)?[0-9a-fA-F]{64}")
# What people copy from roar's output: the short digests it prints (12 hex), or longer.
_PREFIX_RE = re.compile(r"(?:blake3:)?([0-9a-fA-F]{8,63})")


@dataclass(frozen=True)
class ArtifactNode:
    uri: str
    digest: str | None

    @property
    def id(self) -> str:
        return f"artifact:{self.digest or '-'}:{self.uri}"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "uri": self.uri, "digest": self.digest}


@dataclass(frozen=True)
class RunNode:
    run_id: str
    job_name: str
    status: str
    started_at: datetime

    @property
    def id(self) -> str:
        return f"run:{self.run_id}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "job_name": self.job_name,
            "status": self.status,
            "started_at": self.started_at.isoformat(),
        }


@dataclass(frozen=True)
class Edge:
    """artifact -> run for "input", run -> artifact for "output", producer's artifact ->
    copy for "inferred" (equal content, the copying unobserved); ids of the nodes."""

    source: str
    target: str
    kind: Literal["input", "output", "inferred"]


@dataclass
class LineageGraph:
    key: str
    direction: Direction
    root: str | None = None
    artifacts: dict[str, ArtifactNode] = field(default_factory=dict)
    runs: dict[str, RunNode] = field(default_factory=dict)
    edges: set[Edge] = field(default_factory=set)

    def add_artifact(self, node: ArtifactNode) -> str:
        self.artifacts.setdefault(node.id, node)
        return node.id

    def add_run(self, node: RunNode) -> str:
        self.runs.setdefault(node.id, node)
        return node.id

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready and deterministic (sorted), so two queries of one store print the same."""
        return {
            "key": self.key,
            "direction": self.direction,
            "root": self.root,
            "artifacts": [self.artifacts[k].to_dict() for k in sorted(self.artifacts)],
            "runs": [self.runs[k].to_dict() for k in sorted(self.runs)],
            "edges": [
                {"source": e.source, "target": e.target, "kind": e.kind}
                for e in sorted(self.edges, key=lambda e: (e.source, e.target, e.kind))
            ],
        }


@dataclass(frozen=True)
class Candidate:
    """A recorded output: one possible producer of some content."""

    uri: str
    digest: str
    version_id: int
    run: RunNode


def latest_version(columns, condition):
    """The query for the latest file version matching `condition`: the one last written or
    read, the later record on a tie.  The one place that rule is written."""
    return (
        select(*columns)
        .where(condition)
        .order_by(FileVersionRow.last_seen_at.desc(), FileVersionRow.id.desc())
        .limit(1)
    )


def is_digest(key: str) -> bool:
    return _DIGEST_RE.fullmatch(key) is not None


def digest_prefix(key: str) -> str | None:
    """The hex of a digest prefix (8 to 63 hex digits, `blake3:` or not), else None."""
    m = _PREFIX_RE.fullmatch(key)
    return m.group(1).lower() if m else None


def complete_digest(conn: Connection, prefix: str) -> list[str]:
    """The recorded digests starting with the hex `prefix`: up to two (two: ambiguous)."""
    low = f"blake3:{prefix}"
    rows = conn.execute(
        select(FileVersionRow.digest).distinct()
        .where(FileVersionRow.digest >= low, FileVersionRow.digest < low + "g")  # hex < "g"
        .order_by(FileVersionRow.digest).limit(2))
    return [r.digest for r in rows]


def _chunks(items: Iterable[str]) -> Iterator[list[str]]:
    batch = sorted(set(items))
    for i in range(0, len(batch), _CHUNK):
        yield batch[i : i + _CHUNK]


# Written out, not a parameter: the partial index of inputs' digests
# (`ix_accesses_input_digest`) serves only a query that implies its condition, and
# PostgreSQL's generic plan of a prepared statement cannot know a parameter's value.
_INPUT = literal_column("'input'")


def _run_node(row: Any) -> RunNode:
    return RunNode(row.run_id, row.job_name, row.status, row.started_at)


# What a producer candidate is made of: the version, and the run that wrote it.
_CANDIDATE = (
    FileVersionRow.uri,
    FileVersionRow.digest,
    FileVersionRow.id,
    TaskRunRow.run_id,
    TaskRunRow.job_name,
    TaskRunRow.status,
    TaskRunRow.started_at,
)
# Built once: constructing a select costs more than running it on an indexed column.
_PRODUCERS_OF = (
    select(*_CANDIDATE)
    .join(TaskRunRow, FileVersionRow.producer_run_id == TaskRunRow.run_id)
    .where(FileVersionRow.digest.in_(bindparam("digests", expanding=True)))
)
# The latest version under each path of each content a reader may have got it from: what
# pick_producer chooses among for one reader, without fetching every version ever made
# (a step rerun daily writes the same bytes each time; fetching them all made recording
# grow with the store's history).
_RANKED = (
    select(
        *_CANDIDATE,
        func.row_number().over(
            partition_by=(FileVersionRow.digest, FileVersionRow.uri),
            order_by=(TaskRunRow.started_at.desc(), FileVersionRow.id.desc()),
        ).label("rank"),
    )
    .join(TaskRunRow, FileVersionRow.producer_run_id == TaskRunRow.run_id)
    .where(
        FileVersionRow.digest.in_(bindparam("digests", expanding=True)),
        TaskRunRow.run_id != bindparam("reader"),
        TaskRunRow.started_at <= bindparam("started_by"),
    )
    .subquery()
)
_LATEST_PER_PATH = select(_RANKED).where(_RANKED.c.rank == 1)


def latest_per_path(conn: Connection, digests: Iterable[str], reader: str,
                    started_by: datetime) -> dict[str, list[Candidate]]:
    """For one reader (a run id, and its start): the candidates `pick_producer` can choose
    among, one per (content, path), the latest; its choice among these is its choice
    among all `producer_candidates`."""
    digests = sorted(set(digests))
    if len(digests) > _FEW:
        return _candidates(conn, _LATEST_PER_PATH, digests, reader=reader,
                           started_by=started_by)
    # A task reading a few files, most tasks: the statement through the driver, compiled
    # once per count.  SQLAlchemy's execution of it (expanding the IN list, typing the
    # parameters and rows) took ~3/4 of the query's time, ~10 % of a small task's
    # recording.
    out: dict[str, list[Candidate]] = defaultdict(list)
    if not digests:
        return out
    params: dict[str, Any] = {f"digests_{i}": d for i, d in enumerate(digests, 1)}
    params.update(reader=reader, started_by=started_by)
    for uri, digest, version_id, run_id, job_name, status, at, _ in \
            _latest_of(len(digests)).run(conn, params).rows:
        out[digest].append(Candidate(uri, digest, version_id,
                                     RunNode(run_id, job_name, status, at)))
    return out


_FEW = 16  # digests: at most this many, `latest_per_path` runs its statement directly


@functools.cache
def _latest_of(n: int) -> Direct:
    # Rendering the IN list compiles the other parameters too: placeholders, given at run.
    return Direct(_LATEST_PER_PATH.params(digests=[""] * n, reader="",
                                          started_by=datetime.now(timezone.utc)), expanded=True)


def producer_candidates(conn: Connection, digests: Iterable[str]) -> dict[str, list[Candidate]]:
    return _candidates(conn, _PRODUCERS_OF, digests)


def _candidates(conn: Connection, query: Any, digests: Iterable[str],
                **params: Any) -> dict[str, list[Candidate]]:
    out: dict[str, list[Candidate]] = defaultdict(list)
    for chunk in _chunks(digests):
        for r in conn.execute(query, {"digests": chunk, **params}):
            out[r.digest].append(Candidate(r.uri, r.digest, r.id, _run_node(r)))
    return out


def pick_producer(
    candidates: Iterable[Candidate],
    *,
    uri: str | None = None,
    consumer_run_id: str | None = None,
    consumer_started_at: datetime | None = None,
    other_paths: bool = True,
) -> Candidate | None:
    """The producer a reader of this content most plausibly got it from.

    A run never produces its own input, and one that started after the reader cannot have
    written what the reader saw; among the rest the same path wins (a file read where it was
    written), then the most recent run.  `other_paths=False`: the same path only (no
    content match may be inferred for this file).
    """
    pool = [
        c
        for c in candidates
        if c.run.run_id != consumer_run_id
        and (consumer_started_at is None or c.run.started_at <= consumer_started_at)
        and (other_paths or uri is None or c.uri == uri)
    ]
    if not pool:
        return None
    return max(pool, key=lambda c: (c.uri == uri, c.run.started_at, c.version_id))


def may_infer(size: int | None, min_size: int | None) -> bool:
    """Whether equal content of this size under another path is an inferred edge."""
    return min_size is not None and size is not None and size >= min_size


def _producer_of_read(candidates: list[Candidate], read: Any, reader: RunNode,
                      min_size: int | None) -> Candidate | None:
    """The producer `reader`'s read (an access row: uri, size) is linked to."""
    return pick_producer(candidates, uri=read.uri, consumer_run_id=reader.run_id,
                         consumer_started_at=reader.started_at,
                         other_paths=may_infer(read.size, min_size))


def _link(graph: LineageGraph, artifact: ArtifactNode, prod: Candidate) -> None:
    """`prod` made `artifact`'s content: an output edge, through an inferred one when it
    wrote it under another path."""
    made = artifact if prod.uri == artifact.uri else ArtifactNode(prod.uri, artifact.digest)
    graph.edges.add(Edge(graph.add_run(prod.run), graph.add_artifact(made), "output"))
    if made is not artifact:
        graph.edges.add(Edge(made.id, graph.add_artifact(artifact), "inferred"))


def start_node(
    conn: Connection, key: str, min_size: int | None
) -> tuple[ArtifactNode, Candidate | None] | None:
    """The artifact a query key names (a path: that path; a digest: where its producer wrote
    it), and the producer of its content."""
    if is_digest(key):
        digest = key.lower() if key.startswith("blake3:") else f"blake3:{key.lower()}"
        uri, size = None, None
    else:
        latest = conn.execute(
            latest_version((FileVersionRow.digest, FileVersionRow.size), FileVersionRow.uri == key)
        ).one_or_none()
        if latest is None:
            return None
        (digest, size), uri = latest, key
    producer = pick_producer(producer_candidates(conn, [digest])[digest], uri=uri,
                             other_paths=uri is None or may_infer(size, min_size))
    if uri is None:
        if producer is not None:
            return ArtifactNode(producer.uri, digest), producer
        uri = conn.execute(
            latest_version((FileVersionRow.uri,), FileVersionRow.digest == digest)
        ).scalar_one_or_none()
        if uri is None:
            return None
    return ArtifactNode(uri, digest), producer


def upstream(conn: Connection, key: str, depth: int | None,
             min_size: int | None = None) -> LineageGraph:
    graph = LineageGraph(key, "upstream")
    start = start_node(conn, key, min_size)
    if start is None:
        return graph
    node, producer = start
    graph.root = graph.add_artifact(node)
    if producer is None or depth == 0:
        return graph
    _link(graph, node, producer)
    frontier = {producer.run.run_id: producer.run}
    visited = set(frontier)
    level = 1
    while frontier:
        expand = depth is None or level < depth
        inputs = []
        for chunk in _chunks(frontier):
            inputs.extend(
                conn.execute(
                    select(AccessRow.task_run_id, AccessRow.uri, AccessRow.digest,
                           AccessRow.size).where(
                        AccessRow.task_run_id.in_(chunk), AccessRow.role == "input"
                    )
                )
            )
        candidates = producer_candidates(conn, {i.digest for i in inputs if i.digest})
        nxt: dict[str, RunNode] = {}
        for inp in inputs:
            consumer = frontier[inp.task_run_id]
            prod = None
            if inp.digest is not None:
                prod = _producer_of_read(candidates[inp.digest], inp, consumer, min_size)
            artifact = ArtifactNode(inp.uri, inp.digest)
            graph.edges.add(Edge(graph.add_artifact(artifact), consumer.id, "input"))
            if prod is None or not expand:
                continue
            _link(graph, artifact, prod)
            if prod.run.run_id not in visited:
                visited.add(prod.run.run_id)
                nxt[prod.run.run_id] = prod.run
        frontier = nxt
        level += 1
    return graph


def downstream(conn: Connection, key: str, depth: int | None,
               min_size: int | None = None) -> LineageGraph:
    graph = LineageGraph(key, "downstream")
    start = start_node(conn, key, min_size)
    if start is None:
        return graph
    node, _ = start
    graph.root = graph.add_artifact(node)
    frontier = {node}
    # A digest key names the content wherever it lives, so its first readers match by digest.
    any_path = {node.digest} if is_digest(key) else set()
    seen_artifacts = {node}
    visited: set[str] = set()
    level = 1
    while frontier and (depth is None or level <= depth):
        digests = {n.digest for n in frontier if n.digest}
        readers = []
        for chunk in _chunks(digests):
            readers.extend(
                conn.execute(
                    select(
                        AccessRow.uri,
                        AccessRow.digest,
                        AccessRow.size,
                        TaskRunRow.run_id,
                        TaskRunRow.job_name,
                        TaskRunRow.status,
                        TaskRunRow.started_at,
                    )
                    .join(TaskRunRow, AccessRow.task_run_id == TaskRunRow.run_id)
                    .where(AccessRow.digest.in_(chunk), AccessRow.role == _INPUT)
                )
            )
        candidates = producer_candidates(conn, digests)
        new_runs: list[RunNode] = []
        for r in readers:
            run = _run_node(r)
            read = ArtifactNode(r.uri, r.digest)
            if read not in frontier and r.digest not in any_path:
                # Read under another path: the frontier's version only if it is the
                # producer this reader's content is inferred from.
                prod = _producer_of_read(candidates[r.digest], r, run, min_size)
                made = ArtifactNode(prod.uri, r.digest) if prod is not None else None
                if made is None or made == read or made not in frontier:
                    continue
                graph.edges.add(Edge(made.id, graph.add_artifact(read), "inferred"))
            graph.edges.add(Edge(graph.add_artifact(read), graph.add_run(run), "input"))
            if run.run_id not in visited:
                visited.add(run.run_id)
                new_runs.append(run)
        any_path = set()
        by_id = {run.run_id: run for run in new_runs}
        nxt: set[ArtifactNode] = set()
        for chunk in _chunks(by_id):
            outputs = conn.execute(
                select(AccessRow.task_run_id, AccessRow.uri, AccessRow.digest).where(
                    AccessRow.task_run_id.in_(chunk), AccessRow.role == "output"
                )
            )
            for o in outputs:
                artifact = ArtifactNode(o.uri, o.digest)
                graph.edges.add(
                    Edge(by_id[o.task_run_id].id, graph.add_artifact(artifact), "output")
                )
                if artifact.digest and artifact not in seen_artifacts:
                    seen_artifacts.add(artifact)
                    nxt.add(artifact)
        frontier = nxt
        level += 1
    return graph
