"""Ray tasks reading and writing S3 through boto3 (moto's server), on both nodes: each run
has exactly the objects its task got and put, with the blake3 of the bytes."""

from __future__ import annotations

import os

import blake3
import ray

from tests.olschema import validate_event

CREDENTIALS = {"region_name": "us-east-1", "aws_access_key_id": "testing",
               "aws_secret_access_key": "testing"}


@ray.remote(scheduling_strategy="SPREAD")
def clean(url: str, key: str) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=url, **CREDENTIALS)
    data = s3.get_object(Bucket="raw", Key=key)["Body"].read()
    s3.put_object(Bucket="clean", Key=key, Body=data.upper())


def test_tasks_get_and_put_objects(ray_job, s3, s3_url):
    keys = [f"part-{i}.csv" for i in range(6)]
    for bucket in ("raw", "clean"):
        s3.create_bucket(Bucket=bucket)
    for i, k in enumerate(keys):
        s3.put_object(Bucket="raw", Key=k, Body=f"row {i}\n".encode() * (i + 1))
    ray.get([clean.remote(s3_url, k) for k in keys])
    ray_job.finish()

    events = [e for e in ray_job.events() if e["eventType"] == "COMPLETE"
              and e["job"]["name"].endswith(".clean")]
    assert len(events) == len(keys)
    seen = set()
    for e in events:
        validate_event(e)
        (i,) = e["inputs"]
        (o,) = e["outputs"]
        assert (i["namespace"], o["namespace"]) == ("s3://raw", "s3://clean")
        assert i["name"] == o["name"]
        raw = s3.get_object(Bucket="raw", Key=i["name"])["Body"].read()
        assert i["facets"]["contentHash"]["digest"] == blake3.blake3(raw).hexdigest()
        assert o["facets"]["contentHash"]["digest"] == blake3.blake3(raw.upper()).hexdigest()
        assert o["facets"]["version"]["datasetVersion"] == s3.head_object(
            Bucket="clean", Key=o["name"])["ETag"].strip('"')
        seen.add(i["name"])
    assert seen == set(keys)

    # A Ray task run exports as PROV-JSON: the objects it used and generated.
    import subprocess
    import sys
    from pathlib import Path

    import prov

    run_id = events[0]["run"]["runId"]
    out = ray_job.home.parent / "task.prov.json"
    subprocess.run([str(Path(sys.executable).parent / "roar-core"), "export", run_id,
                    "--format", "prov", "-o", str(out)], check=True,
                   env={**os.environ, "ROAR_HOME": str(ray_job.home)})
    doc = prov.read(str(out), format="json")
    where = {str(next(iter(r.get_attribute("prov:location"))))
             for r in doc.get_records() if r.get_type().localpart == "Entity"}
    (i,), (o,) = events[0]["inputs"], events[0]["outputs"]
    assert where == {f"{i['namespace']}/{i['name']}", f"{o['namespace']}/{o['name']}"}
