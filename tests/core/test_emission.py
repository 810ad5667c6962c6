from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from uuid import UUID

import attr
import pytest
from jsonschema.exceptions import ValidationError

from roar_core.pipeline import emission as em
from roar_core.pipeline import facets
from tests.olschema import ROAR_SCHEMAS, facet_schemas, schemas, validate_event

GOLDEN = Path(__file__).parent / "golden"
WF_RUN = "01890f6e-5b7a-7cc0-9c1b-0123456789ab"
TASK_RUN = "01890f6e-5b7b-7d00-8a2c-0123456789ab"
T0 = datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=timezone(timedelta(hours=1)))
D_IN = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
D_OUT = "0c5b1e5f2f2b4e1d9a7c3e8f6d4b2a1908172635445362718293a4b5c6d7e8f9"
SECRETS = ("hunter2", "s3cr3t-tok", "AKIAXYZSECRET", "pw-in-url", "stack-pw")


def workflow(**kw: Any) -> em.WorkflowLineage:
    base: dict[str, Any] = dict(
        namespace="roar-test", job_name="pipeline", run_id=WF_RUN, event_time=T0,
        engine=em.Engine("snakemake", "9.27.1"),
    )  # fmt: skip
    return em.WorkflowLineage(**{**base, **kw})


def task(**kw: Any) -> em.TaskLineage:
    base: dict[str, Any] = dict(
        namespace="roar-test",
        job_name="pipeline.train",
        run_id=TASK_RUN,
        event_time=T0 + timedelta(seconds=5),
        parent=em.RunRef("roar-test", "pipeline", WF_RUN),
        engine=em.Engine("snakemake", "9.27.1"),
        job_type=em.JobType(integration="SNAKEMAKE"),
        inputs=[
            em.Dataset(
                *em.file_dataset("/data/raw.csv"), digest=D_IN, size=1234,
                symlinks=[em.file_dataset("/scratch/copy-of-raw.csv")],
            )
        ],
        outputs=[
            em.Dataset(*em.file_dataset("/data/model.pt"), digest=D_OUT, size=99,
                       lifecycle="CREATE"),
            em.Dataset(*em.s3_dataset("s3://bucket/models/v1.pt"), digest=D_OUT, size=99,
                       lifecycle="OVERWRITE"),
            em.Dataset(*em.file_dataset("/data/old.tmp"), lifecycle="DROP"),
        ],
        task=em.TaskInfo(
            engine="snakemake", engine_task_id="job-17", host="node1", pid=4242, attempt=1,
            node_id="n1", dropped_events=0,
            command=["python", "train.py", "--password", "hunter2", "--lr", "0.1"],
        ),
        io=em.IOCheck(undeclared_reads=["/data/extra.csv"], declared_untouched=["/data/x"]),
        code_location=em.CodeLocation(url="https://github.com/acme/pipe", path="Snakefile"),
        source_code=em.SourceCode("python", "print('train')"),
    )  # fmt: skip
    return em.TaskLineage(**{**base, **kw})


def as_dict(event: em.Event) -> dict[str, Any]:
    return json.loads(em.to_json(event))


TASK_EVENTS: dict[str, Callable[[em.TaskLineage], em.Event]] = {
    "START": em.start_event,
    "COMPLETE": em.complete_event,
    "FAIL": em.fail_event,
    "ABORT": em.abort_event,
}
WORKFLOW_EVENTS: dict[str, Callable[[em.WorkflowLineage], em.Event]] = {
    "START": em.workflow_start,
    "COMPLETE": em.workflow_complete,
    "FAIL": em.workflow_fail,
    "ABORT": em.workflow_abort,
}


@pytest.mark.parametrize("state", TASK_EVENTS)
def test_task_events_validate(state: str) -> None:
    t = task(error_message="boom", stack_trace="Traceback ...")
    event = as_dict(TASK_EVENTS[state](t))
    validate_event(event)
    assert event["eventType"] == state
    assert event["run"]["runId"] == TASK_RUN
    assert event["job"] == {
        "namespace": "roar-test",
        "name": "pipeline.train",
        "facets": event["job"]["facets"],
    }
    run_facets = event["run"]["facets"]
    assert {"parent", "processing_engine", "roar_task", "roar_io"} <= run_facets.keys()
    assert ("errorMessage" in run_facets) == (state in ("FAIL", "ABORT"))
    assert event["job"]["facets"]["jobType"]["jobType"] == "TASK"
    assert event["job"]["facets"]["jobType"]["integration"] == "SNAKEMAKE"


@pytest.mark.parametrize("state", WORKFLOW_EVENTS)
def test_workflow_events_validate(state: str) -> None:
    event = as_dict(WORKFLOW_EVENTS[state](workflow(error_message="3 jobs failed")))
    validate_event(event)
    assert event["eventType"] == state
    assert event["inputs"] == [] and event["outputs"] == []
    assert "parent" not in event["run"]["facets"]
    assert event["run"]["facets"]["processing_engine"]["name"] == "snakemake"
    assert event["job"]["facets"]["jobType"]["jobType"] == "DAG"


def test_parent_and_root_link_task_to_workflow() -> None:
    parent = as_dict(em.start_event(task()))["run"]["facets"]["parent"]
    assert parent["run"] == {"runId": WF_RUN, "facets": {}}
    assert parent["job"]["name"] == "pipeline"
    # root defaults to the parent: the workflow run is the top of the tree.
    assert parent["root"]["run"]["runId"] == WF_RUN
    root = em.RunRef("airflow", "dag", "01890f6e-0000-7000-8000-000000000001")
    nested = as_dict(em.start_event(task(root=root)))
    validate_event(nested)
    assert nested["run"]["facets"]["parent"]["root"]["job"] == {
        "namespace": "airflow",
        "name": "dag",
        "facets": {},
    }


def test_digest_facets_on_inputs_and_outputs() -> None:
    event = as_dict(em.complete_event(task()))
    raw = event["inputs"][0]
    assert raw["namespace"] == "file" and raw["name"] == "/data/raw.csv"
    assert raw["facets"]["version"]["datasetVersion"] == f"blake3:{D_IN}"
    content = raw["facets"]["contentHash"]
    assert (content["algorithm"], content["digest"], content["size"]) == ("blake3", D_IN, 1234)
    model, s3_model, dropped = event["outputs"]
    assert model["facets"]["version"]["datasetVersion"] == f"blake3:{D_OUT}"
    assert model["facets"]["contentHash"]["digest"] == D_OUT
    assert model["outputFacets"]["outputStatistics"] == {
        **model["outputFacets"]["outputStatistics"],
        "size": 99,
        "fileCount": 1,
    }
    assert model["facets"]["lifecycleStateChange"]["lifecycleStateChange"] == "CREATE"
    assert (s3_model["namespace"], s3_model["name"]) == ("s3://bucket", "models/v1.pt")
    assert s3_model["facets"]["lifecycleStateChange"]["lifecycleStateChange"] == "OVERWRITE"
    # A deleted file has no content: a lifecycle facet only, no digest or statistics.
    assert set(dropped["facets"]) == {"lifecycleStateChange"}
    assert "outputFacets" not in dropped or dropped["outputFacets"] in ({}, None)


def test_symlinks_name_the_path_actually_read() -> None:
    raw = as_dict(em.complete_event(task()))["inputs"][0]
    assert raw["facets"]["symlinks"]["identifiers"] == [
        {"namespace": "file", "name": "/scratch/copy-of-raw.csv", "type": "FILE"}
    ]


def test_rename_carries_previous_identifier() -> None:
    renamed = em.Dataset(
        *em.file_dataset("/data/final.csv"), digest=D_OUT, size=1,
        lifecycle="RENAME", previous=em.file_dataset("/data/.final.csv.part"),
    )  # fmt: skip
    event = as_dict(em.complete_event(task(outputs=[renamed])))
    validate_event(event)
    change = event["outputs"][0]["facets"]["lifecycleStateChange"]
    assert change["previousIdentifier"] == {"namespace": "file", "name": "/data/.final.csv.part"}


def test_roar_facets_content() -> None:
    run_facets = as_dict(em.complete_event(task()))["run"]["facets"]
    assert run_facets["roar_task"] == {
        **run_facets["roar_task"],
        "engine": "snakemake",
        "engineTaskId": "job-17",
        "attempt": 1,
        "host": "node1",
        "pid": 4242,
        "nodeId": "n1",
        "traced": True,
        "droppedEvents": 0,
    }
    assert run_facets["roar_io"]["undeclaredReads"] == ["/data/extra.csv"]
    untraced = em.TaskInfo(
        engine="cli", engine_task_id="1", host="h", pid=1, traced=False,
        untraced_reason="exec of static binary /bin/busybox",
    )  # fmt: skip
    event = as_dict(em.complete_event(task(task=untraced, io=None)))
    validate_event(event)
    assert event["run"]["facets"]["roar_task"]["traced"] is False
    assert "roar_io" not in event["run"]["facets"]


def test_event_time_keeps_offset_and_run_ids_are_uuids() -> None:
    event = as_dict(em.start_event(task()))
    assert event["eventTime"] == "2026-03-01T12:00:05.123000+01:00"
    assert as_dict(em.start_event(task(event_time="2026-03-01T11:00:00Z")))["eventTime"] == (
        "2026-03-01T11:00:00+00:00"
    )
    now = datetime.fromisoformat(as_dict(em.start_event(task(event_time=None)))["eventTime"])
    assert now.tzinfo is not None
    rid = em.new_run_id()
    assert UUID(rid).version == 7
    assert em.new_run_id() != rid


@pytest.mark.parametrize(
    "bad",
    [
        datetime(2026, 3, 1, 12, 0),  # naive: Marquez would misplace it
        "2026-03-01T12:00:00",
        "2026-03-01",
        "yesterday",
    ],
)
def test_event_time_without_offset_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="event time"):
        em.start_event(task(event_time=bad))


@pytest.mark.parametrize(
    "change",
    [
        {"namespace": ""},
        {"job_name": "  "},
        {"parent": em.RunRef("", "pipeline", WF_RUN)},
        {"parent": em.RunRef("roar-test", "", WF_RUN)},
        {"inputs": [em.Dataset("", "/data/x")]},
        {"inputs": [em.Dataset("file", "")]},
        {"outputs": [em.Dataset("file", " ")]},
        {"inputs": [em.Dataset("file", "/a", symlinks=[("file", "")])]},
        {"engine": em.Engine("", "1.0")},
        {"task": em.TaskInfo(engine="ray", engine_task_id="", host="h", pid=1)},
    ],
)
def test_empty_names_rejected(change: dict[str, Any]) -> None:
    # Marquez accepts empty names and then its API breaks for everyone.
    with pytest.raises(ValueError, match="non-empty"):
        em.complete_event(task(**change))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"run_id": "task-17"}, "UUID"),
        ({"parent": em.RunRef("ns", "wf", "not-a-uuid")}, "UUID"),
        ({"inputs": [em.Dataset("file", "/a", digest="ABC")]}, "digest"),
        ({"inputs": [em.Dataset("file", "/a", digest=D_IN, size=-1)]}, "size"),
        ({"outputs": [em.Dataset("file", "/a", lifecycle="MOVED")]}, "CREATE"),
        ({"parent": None, "root": em.RunRef("ns", "wf", WF_RUN)}, "parent"),
    ],
)
def test_invalid_values_rejected_early(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        em.complete_event(task(**change))


def test_dataset_naming() -> None:
    assert em.file_dataset("/data//a/./b.csv") == ("file", "/data/a/b.csv")
    assert em.file_dataset("/data/a", host="node7") == ("file://node7", "/data/a")
    assert em.s3_dataset("s3://bkt/dir/obj.parquet") == ("s3://bkt", "dir/obj.parquet")
    assert em.s3_dataset("s3a://bkt/k") == ("s3://bkt", "k")
    # Credentials in a URI never become part of a dataset name.
    assert em.s3_dataset("s3://AKIAXYZSECRET:pw@bkt/k") == ("s3://bkt", "k")
    for bad in ("data/a", "", "./a"):
        with pytest.raises(ValueError, match="absolute"):
            em.file_dataset(bad)
    with pytest.raises(ValueError, match="host"):
        em.file_dataset("/a", host="")
    for bad in ("s3://bkt", "s3:///k", "gs://bkt/k", "/local/path"):
        with pytest.raises(ValueError, match="S3"):
            em.s3_dataset(bad)


def test_no_secret_leaves_in_serialized_events() -> None:
    t = task(
        task=em.TaskInfo(
            engine="ray", engine_task_id="t", host="h", pid=1,
            command=["aws", "s3", "cp", "--token", "s3cr3t-tok", "PASSWORD=hunter2",
                     "AWS_SECRET_ACCESS_KEY=AKIAXYZSECRET", "https://me:pw-in-url@host/x"],
        ),
        error_message="login to https://bob:pw-in-url@db failed with --password hunter2",
        stack_trace="File x.py\n  connect('postgres://u:stack-pw@h/db')",
        code_location=em.CodeLocation(url="https://ci:s3cr3t-tok@git.example/repo.git"),
    )  # fmt: skip
    for build in (em.start_event, em.complete_event, em.fail_event, em.abort_event):
        text = em.to_json(build(t))
        validate_event(json.loads(text))
        leaked = [s for s in SECRETS if s in text]
        assert not leaked, f"{build.__name__} leaked {leaked}"


def test_to_json_is_deterministic_without_nulls() -> None:
    t = task()
    first, second = em.to_json(em.complete_event(t)), em.to_json(em.complete_event(t))
    assert first == second
    assert "null" not in first
    assert list(json.loads(first)) == sorted(json.loads(first))


def test_golden_complete_event() -> None:
    """The exact event we emit for a task, so a change in shape is a visible diff."""
    event = as_dict(em.complete_event(task()))
    golden = json.loads((GOLDEN / "task_complete.json").read_text())
    assert _without_producer(event) == golden


def _without_producer(node: Any) -> Any:
    # The producer URI carries roar's version; everything else must match exactly.
    if isinstance(node, dict):
        skip = ("producer", "_producer")
        return {k: _without_producer(v) for k, v in node.items() if k not in skip}
    if isinstance(node, list):
        return [_without_producer(v) for v in node]
    return node


def test_extra_facets_do_not_override_roar_facets() -> None:
    from openlineage.client.facet_v2 import nominal_time_run

    nominal = nominal_time_run.NominalTimeRunFacet(nominalStartTime="2026-03-01T00:00:00+00:00")
    fake = facets.RoarTaskRunFacet(engine="x", engineTaskId="x", host="x", pid=0, traced=True,
                                   command=["--token", "s3cr3t-tok"])  # fmt: skip
    event = as_dict(em.complete_event(task(run_facets={"nominalTime": nominal, "roar_task": fake})))
    validate_event(event)
    assert event["run"]["facets"]["nominalTime"]["nominalStartTime"].startswith("2026-03-01")
    assert event["run"]["facets"]["roar_task"]["engine"] == "snakemake"



def test_facets_serialized_once_are_the_clients_and_a_dict_is_read_each_time() -> None:
    """An integration's facet objects are serialized once for a task's START and end, and
    the machine's and environment's once per process: the events must carry what the
    client's serializer gives every time, and a dict facet (its owner may change it
    between two events) as it is when each event is made."""
    from openlineage.client.facet_v2 import nominal_time_run
    from openlineage.client.serde import Serde

    nominal = nominal_time_run.NominalTimeRunFacet(nominalStartTime="2026-03-01T00:00:00+00:00")
    custom = {"_producer": "p", "_schemaURL": "https://example.com/x.json", "n": 1, "gone": None}
    lineage = task(run_facets={**em.provenance_facets(), "nominalTime": nominal,
                               "custom": custom})
    start, end = as_dict(em.start_event(lineage)), as_dict(em.complete_event(lineage))
    for key, facet in em.provenance_facets().items():
        assert start["run"]["facets"][key] == end["run"]["facets"][key] == Serde.to_dict(
            dict(facet))
    for event in (start, end):
        assert event["run"]["facets"]["nominalTime"] == Serde.to_dict(nominal)
        assert event["run"]["facets"]["custom"] == {k: v for k, v in custom.items() if v}
    custom["n"] = 2
    later = as_dict(em.complete_event(lineage))
    assert later["run"]["facets"]["custom"]["n"] == 2


# ---- the custom facets and their schemas ------------------------------------------------------

CUSTOM = {
    "contentHash": (facets.ContentHashDatasetFacet, "DatasetFacet"),
    "roar_task": (facets.RoarTaskRunFacet, "RunFacet"),
    "roar_io": (facets.RoarIORunFacet, "RunFacet"),
    "roar_snakemake": (facets.RoarSnakemakeRunFacet, "RunFacet"),
    "roar_machine": (facets.RoarMachineRunFacet, "RunFacet"),
    "roar_environment": (facets.RoarEnvironmentRunFacet, "RunFacet"),
}


@pytest.mark.parametrize("key", CUSTOM)
def test_custom_facet_matches_its_schema(key: str) -> None:
    cls, slot = CUSTOM[key]
    url = cls._get_schema()
    base, fragment = url.split("#")
    assert base.startswith("https://roar.dev/spec/facets/1-0-0/")
    doc = schemas()[base]
    assert (ROAR_SCHEMAS / base.rsplit("/", 1)[1]).is_file()
    assert facet_schemas()[slot][key] == base
    name = fragment.rsplit("/", 1)[1]
    props = doc["$defs"][name]["allOf"][1]["properties"]
    fields = {a.name for a in attr.fields(cls) if not a.name.startswith("_")}
    assert fields == set(props), "facet class and schema disagree: bump the schema version"


def test_validator_rejects_unknown_and_invalid_facets() -> None:
    event = as_dict(em.complete_event(task()))
    validate_event(event)
    unknown = json.loads(json.dumps(event))
    unknown["run"]["facets"]["roarTask"] = unknown["run"]["facets"]["roar_task"]
    with pytest.raises(ValidationError, match="unknown"):
        validate_event(unknown)
    bad_digest = json.loads(json.dumps(event))
    bad_digest["inputs"][0]["facets"]["contentHash"]["digest"] = "NOT-HEX"
    with pytest.raises(ValidationError):
        validate_event(bad_digest)
    naive = {**event, "eventTime": "2026-03-01T12:00:00"}
    with pytest.raises(ValidationError):
        validate_event(naive)
    wrong_slot = json.loads(json.dumps(event))
    stats = wrong_slot["outputs"][0]["outputFacets"]["outputStatistics"]
    wrong_slot["inputs"][0]["inputFacets"] = {"outputStatistics": stats}
    with pytest.raises(ValidationError, match="unknown"):
        validate_event(wrong_slot)


def test_written_out_schema_urls_and_values_are_the_clients() -> None:
    """emission spells out what it once read from the client's classes (so that recording
    never imports the client): each must still be what the installed client says."""
    from openlineage.client.event_v2 import RunEvent, RunState
    from openlineage.client.facet_v2 import (
        dataset_version_dataset,
        error_message_run,
        job_type_job,
        lifecycle_state_change_dataset,
        output_statistics_output_dataset,
        parent_run,
        processing_engine_run,
        source_code_job,
        source_code_location_job,
        symlinks_dataset,
    )

    assert em._EVENT_SCHEMA == RunEvent._get_schema()
    pairs = {
        em._VERSION_SCHEMA: dataset_version_dataset.DatasetVersionDatasetFacet,
        em._LIFECYCLE_SCHEMA: lifecycle_state_change_dataset.LifecycleStateChangeDatasetFacet,
        em._SYMLINKS_SCHEMA: symlinks_dataset.SymlinksDatasetFacet,
        em._OUTPUT_STATISTICS_SCHEMA:
            output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet,
        em._PARENT_SCHEMA: parent_run.ParentRunFacet,
        em._PROCESSING_ENGINE_SCHEMA: processing_engine_run.ProcessingEngineRunFacet,
        em._ERROR_MESSAGE_SCHEMA: error_message_run.ErrorMessageRunFacet,
        em._JOB_TYPE_SCHEMA: job_type_job.JobTypeJobFacet,
        em._SOURCE_CODE_SCHEMA: source_code_job.SourceCodeJobFacet,
        em._SOURCE_CODE_LOCATION_SCHEMA: source_code_location_job.SourceCodeLocationJobFacet,
        em._CONTENT_HASH_SCHEMA: facets.ContentHashDatasetFacet,
        em._ROAR_TASK_SCHEMA: facets.RoarTaskRunFacet,
        em._ROAR_IO_SCHEMA: facets.RoarIORunFacet,
    }
    assert {url: cls._get_schema() for url, cls in pairs.items()} == {u: u for u in pairs}
    assert em._LIFECYCLES == tuple(
        s.value for s in lifecycle_state_change_dataset.LifecycleStateChange)
    assert {em.START, em.COMPLETE, em.FAIL, em.ABORT} <= {s.value for s in RunState}
