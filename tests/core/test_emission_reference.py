"""Events built as dicts equal what the client's classes serialize to.

`emission` builds JSON-ready dicts directly, for speed; `reference_event` below is the
construction it replaced, with the client's attrs classes. Both must give the same data, and
the same bytes through `to_json`/the spool as `Serde.to_json` of the reference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    dataset_version_dataset,
    documentation_job,
    error_message_run,
    job_type_job,
    lifecycle_state_change_dataset,
    nominal_time_run,
    output_statistics_output_dataset,
    parent_run,
    processing_engine_run,
    source_code_job,
    source_code_location_job,
    symlinks_dataset,
)
from openlineage.client.serde import Serde

from roar_core.pipeline import emission as em
from roar_core.pipeline.facets import (
    ContentHashDatasetFacet,
    RoarIORunFacet,
    RoarSnakemakeRunFacet,
    RoarTaskRunFacet,
)
from roar_core.pipeline.redact import redact_argv, redact_text
from roar_core.pipeline.spool import Spool
from roar_core.pipeline.spoolfiles import _RECORD
from tests.core.test_emission import D_IN, D_OUT, T0, WF_RUN, task
from tests.olschema import validate_event

ROOT_RUN = "01890f6e-0000-7000-8000-000000000001"

# ---- the reference: the client's classes, as emission used them before ------------------------


def reference_event(state: RunState, t: em.TaskLineage) -> RunEvent:
    p = em.producer()
    facets: dict[str, Any] = dict(t.run_facets)
    if t.task is not None:
        facets["roar_task"] = reference_task_facet(t.task)
    if t.io is not None:
        facets["roar_io"] = RoarIORunFacet(
            undeclaredReads=t.io.undeclared_reads, undeclaredWrites=t.io.undeclared_writes,
            declaredUntouched=t.io.declared_untouched, producer=p,
        )  # fmt: skip
    if t.parent is not None:
        parent, root = t.parent, t.root or t.parent
        facets["parent"] = parent_run.ParentRunFacet(
            run=parent_run.Run(runId=parent.run_id),
            job=parent_run.Job(namespace=parent.namespace, name=parent.job_name),
            root=parent_run.Root(
                run=parent_run.RootRun(runId=root.run_id),
                job=parent_run.RootJob(namespace=root.namespace, name=root.job_name),
            ),
            producer=p,
        )
    if t.engine is not None:
        facets["processing_engine"] = processing_engine_run.ProcessingEngineRunFacet(
            version=t.engine.version, name=t.engine.name,
            openlineageAdapterVersion=em.roar_version(), producer=p,
        )  # fmt: skip
    if state in (RunState.FAIL, RunState.ABORT) and t.error_message:
        facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=redact_text(t.error_message), programmingLanguage=t.error_language,
            stackTrace=redact_text(t.stack_trace) if t.stack_trace else None, producer=p,
        )  # fmt: skip
    job_facets: dict[str, Any] = dict(t.job_facets)
    job_facets["jobType"] = job_type_job.JobTypeJobFacet(
        processingType=t.job_type.processing_type, integration=t.job_type.integration,
        jobType=t.job_type.job_type, producer=p,
    )  # fmt: skip
    if t.source_code is not None:
        job_facets["sourceCode"] = source_code_job.SourceCodeJobFacet(
            language=t.source_code.language, sourceCode=t.source_code.source, producer=p
        )
    if (loc := t.code_location) is not None:
        job_facets["sourceCodeLocation"] = source_code_location_job.SourceCodeLocationJobFacet(
            type=loc.type, url=redact_text(loc.url),
            repoUrl=redact_text(loc.repo_url) if loc.repo_url else None, path=loc.path,
            version=loc.version, tag=loc.tag, branch=loc.branch, producer=p,
        )  # fmt: skip
    return RunEvent(
        eventType=state,
        eventTime=em._event_time(t.event_time),
        run=Run(runId=t.run_id, facets=facets),
        job=Job(namespace=t.namespace, name=t.job_name, facets=job_facets),
        inputs=[reference_input(d) for d in t.inputs],
        outputs=[reference_output(d) for d in t.outputs],
        producer=p,
    )


def reference_task_facet(task: em.TaskInfo) -> RoarTaskRunFacet:
    return RoarTaskRunFacet(
        engine=task.engine, engineTaskId=task.engine_task_id, host=task.host, pid=task.pid,
        traced=task.traced, attempt=task.attempt, droppedEvents=task.dropped_events,
        nodeId=task.node_id,
        untracedReason=redact_text(task.untraced_reason) if task.untraced_reason else None,
        command=redact_argv(task.command) if task.command is not None else None,
        parentTaskId=task.parent_task_id, producer=em.producer(),
    )  # fmt: skip


def reference_dataset_facets(d: em.Dataset) -> dict[str, Any]:
    p = em.producer()
    facets: dict[str, Any] = {}
    if d.digest is not None:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
            datasetVersion=f"blake3:{d.digest}", producer=p
        )
        facets["contentHash"] = ContentHashDatasetFacet(
            digest=d.digest, algorithm="blake3", size=d.size, producer=p
        )
    if d.lifecycle is not None:
        lsc = lifecycle_state_change_dataset
        previous = None
        if d.previous is not None:
            previous = lsc.PreviousIdentifier(namespace=d.previous[0], name=d.previous[1])
        facets["lifecycleStateChange"] = lsc.LifecycleStateChangeDatasetFacet(
            lifecycleStateChange=lsc.LifecycleStateChange(d.lifecycle),
            previousIdentifier=previous, producer=p,
        )  # fmt: skip
    if d.symlinks:
        facets["symlinks"] = symlinks_dataset.SymlinksDatasetFacet(
            identifiers=[
                symlinks_dataset.Identifier(namespace=ns, name=name, type="FILE")
                for ns, name in d.symlinks
            ],
            producer=p,
        )
    return facets


def reference_input(d: em.Dataset) -> InputDataset:
    return InputDataset(
        namespace=d.namespace, name=d.name, facets=reference_dataset_facets(d) or None
    )


def reference_output(d: em.Dataset) -> OutputDataset:
    stats = None
    if d.size is not None:
        stats = {
            "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                size=d.size, fileCount=1, producer=em.producer()
            )
        }
    return OutputDataset(
        namespace=d.namespace, name=d.name, facets=reference_dataset_facets(d) or None,
        outputFacets=stats,
    )  # fmt: skip


# ---- a task event with every facet emission can write -----------------------------------------


def full_task() -> em.TaskLineage:
    snakemake = RoarSnakemakeRunFacet(
        rule="train", jobid=3, kind="shell", wildcards={"s": "a"}, params={"lr": 0.1},
        input=["/data/raw.csv"], output=["/data/model.pt"], producer=em.producer(),
    )  # fmt: skip
    return task(
        root=em.RunRef("airflow", "dag", ROOT_RUN),
        inputs=[
            em.Dataset(*em.file_dataset("/data/raw.csv"), digest=D_IN, size=1234,
                       symlinks=[em.file_dataset("/scratch/a.csv"),
                                 em.file_dataset("/scratch/b.csv", host="n2")]),
            em.Dataset(*em.file_dataset("/data/unhashed.csv")),  # no facets at all
            em.Dataset(*em.s3_dataset("s3://bkt/in/x.parquet"), digest=D_OUT),  # no size
        ],
        outputs=[
            em.Dataset(*em.file_dataset("/data/model.pt"), digest=D_OUT, size=99,
                       lifecycle="CREATE"),
            em.Dataset(*em.s3_dataset("s3://bucket/models/v1.pt"), digest=D_OUT, size=0,
                       lifecycle="OVERWRITE"),
            em.Dataset(*em.file_dataset("/data/old.tmp"), lifecycle="DROP"),
            em.Dataset(*em.file_dataset("/data/final.csv"), digest=D_IN, size=7,
                       lifecycle="RENAME", previous=em.file_dataset("/data/.final.csv.part")),
        ],
        task=em.TaskInfo(
            engine="snakemake", engine_task_id="job-17", host="node1", pid=4242, attempt=1,
            node_id="n1", traced=False, untraced_reason="static binary, --token s3cr3t-tok",
            dropped_events=3, command=["python", "train.py", "--password", "hunter2"],
            parent_task_id="job-16",
        ),
        io=em.IOCheck(undeclared_reads=["/data/extra.csv"], undeclared_writes=[],
                      declared_untouched=["/data/x"]),
        error_message="failed: https://bob:pw-in-url@db", stack_trace="Traceback ...",
        code_location=em.CodeLocation(
            url="https://ci:s3cr3t-tok@git.example/repo.git", repo_url="https://git.example/r",
            path="Snakefile", version="abc123", branch="main", tag="v1",
        ),
        source_code=em.SourceCode("python", "print('train')"),
        run_facets={
            "roar_snakemake": snakemake,
            "nominalTime": nominal_time_run.NominalTimeRunFacet(
                nominalStartTime="2026-03-01T00:00:00+00:00", producer=em.producer()
            ),
        },
        job_facets={
            "documentation": documentation_job.DocumentationJobFacet(
                description="trains the model", producer=em.producer()
            )
        },
    )  # fmt: skip


EVENTS = {
    RunState.START: em.start_event,
    RunState.COMPLETE: em.complete_event,
    RunState.FAIL: em.fail_event,
    RunState.ABORT: em.abort_event,
}


@pytest.mark.parametrize("state", EVENTS)
def test_event_dict_equals_the_client_serialization(state: RunState) -> None:
    t = full_task()
    event, reference = EVENTS[state](t), reference_event(state, t)
    assert isinstance(event, em.Event)
    assert Serde.to_dict(reference) == event
    assert em.to_json(event) == Serde.to_json(reference)  # byte for byte
    assert em.to_dict(event) == Serde.to_dict(reference)
    validate_event(json.loads(em.to_json(event)))


def test_workflow_event_dict_equals_the_client_serialization() -> None:
    w = em.WorkflowLineage(namespace="ns", job_name="wf", run_id=WF_RUN, event_time=T0,
                           engine=em.Engine("ray", "2.9"), error_message="3 tasks failed")
    ref = RunEvent(
        eventType=RunState.FAIL, eventTime=T0.isoformat(), producer=em.producer(),
        run=Run(runId=WF_RUN, facets={
            "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
                version="2.9", name="ray", openlineageAdapterVersion=em.roar_version(),
                producer=em.producer()),
            "errorMessage": error_message_run.ErrorMessageRunFacet(
                message="3 tasks failed", programmingLanguage="python", producer=em.producer()),
        }),
        job=Job(namespace="ns", name="wf", facets={"jobType": job_type_job.JobTypeJobFacet(
            processingType="BATCH", integration="ROAR", jobType="DAG", producer=em.producer())}),
    )  # fmt: skip
    assert em.to_json(em.workflow_fail(w)) == Serde.to_json(ref)


def test_datasets_for_the_engine_equal_the_client_construction() -> None:
    t = full_task()
    for d in t.inputs:
        assert Serde.to_dict(em.input_dataset(d)) == Serde.to_dict(reference_input(d))
    for d in t.outputs:
        assert Serde.to_dict(em.output_dataset(d)) == Serde.to_dict(reference_output(d))
    facets = em.task_run_facets(t)
    assert t.task is not None
    assert Serde.to_dict(facets["roar_task"]) == Serde.to_dict(reference_task_facet(t.task))


def test_dict_facets_from_integrations_lose_their_nulls() -> None:
    # A dict facet of unknown content must not bring a null into a null-free Event.
    base = {"_producer": em.producer(), "_schemaURL": "https://x.example/f.json#/$defs/F"}
    facet = {**base, "a": None, "b": [1, None], "c": {"d": None}}
    event = em.start_event(task(run_facets={"custom": facet}))
    assert event["run"]["facets"]["custom"] == {**base, "b": [1], "c": {}}
    assert "null" not in em.to_json(event)
    assert facet["a"] is None and facet["b"] == [1, None]  # the caller's dict is left alone


def test_spool_writes_what_the_client_would(tmp_path: Path) -> None:
    t = full_task()
    event, reference = em.fail_event(t), reference_event(RunState.FAIL, t)
    with Spool(tmp_path / "spool", start=False, fsync=False) as spool:
        assert spool.append(event)  # the fast path: json.dumps
        assert spool.append(reference)  # the client's serializer
    (segment,) = (tmp_path / "spool").glob("*.jsonl")
    records = [_RECORD.match(line) for line in segment.read_bytes().splitlines()]
    bodies = [m.group(2) for m in records if m is not None]
    assert bodies == [Serde.to_json(reference, separators=(",", ":")).encode()] * 2
