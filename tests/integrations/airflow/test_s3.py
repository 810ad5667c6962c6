"""`airflow dags test` of a @task.roar task reading and writing S3 through boto3 (moto's
server), with the tracer preloaded into the Airflow process (boundary mode): its COMPLETE
event, sent by Airflow's OpenLineage provider, has the objects with their blake3 and
S3 version."""

from __future__ import annotations

import blake3

from tests.integrations.airflow.conftest import (
    AirflowHome,
    preloaded,
    read_events,
    stop_recorder_services,
)
from tests.integrations.airflow.olcheck import validate_provider_event


def test_a_task_getting_and_putting_objects(airflow_home: AirflowHome, tmp_path, s3, s3_url):
    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": s3_url}
    raw = b"id,name\n" + b"7,seven\n" * 500
    for bucket in ("raw", "clean"):
        s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket="raw", Key="in.csv", Body=raw)
    env = preloaded(airflow_home.env(tmp_path, **aws))
    try:
        airflow_home.airflow(env, "dags", "test", "roar_s3", timeout=400)
        events = read_events(tmp_path / "ol-events.jsonl")
    finally:
        stop_recorder_services(tmp_path)
    (done,) = [e for e in events if e["job"]["name"] == "roar_s3.clean"
               and e["eventType"] == "COMPLETE"]
    validate_provider_event(done)
    ins = {(d["namespace"], d["name"]): d["facets"] for d in done["inputs"]}
    outs = {(d["namespace"], d["name"]): d["facets"] for d in done["outputs"]}
    assert set(ins) == {("s3://raw", "in.csv")} and set(outs) == {("s3://clean", "out.csv")}
    assert ins[("s3://raw", "in.csv")]["contentHash"]["digest"] == blake3.blake3(
        raw).hexdigest()
    out = outs[("s3://clean", "out.csv")]
    assert out["contentHash"]["digest"] == blake3.blake3(raw.upper()).hexdigest()
    assert out["version"]["datasetVersion"] == s3.head_object(
        Bucket="clean", Key="out.csv")["ETag"].strip('"')
