"""A Snakemake job that reads and writes S3 through boto3 (moto's server): its run has the
objects it got and put, with the blake3 of the bytes and S3's own version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import blake3

from tests.integrations.snakemake.conftest import BIN

SNAKEFILE = textwrap.dedent(f'''
    rule all:
        input: "done.txt"

    rule clean:
        output: "done.txt"
        shell: "{sys.executable} clean.py && echo ok > {{output}}"
''')

CLEAN = """\
import boto3
s3 = boto3.client("s3")
data = s3.get_object(Bucket="raw", Key="in.csv")["Body"].read()
s3.put_object(Bucket="clean", Key="out.csv", Body=data.upper())
"""


def test_a_job_reading_and_writing_s3(tmp_path, smk, lineage, s3, s3_url, monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": s3_url}.items():
        monkeypatch.setenv(k, v)
    raw = b"a,b\n" + b"x,1\n" * 1000
    for bucket in ("raw", "clean"):
        s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket="raw", Key="in.csv", Body=raw)
    wd = tmp_path.resolve()
    (wd / "Snakefile").write_text(SNAKEFILE)
    (wd / "clean.py").write_text(CLEAN)
    smk(wd, "-j1")
    (job,) = lineage(wd / ".roar-home").terminal()
    assert job["eventType"] == "COMPLETE"
    ins = {(d["namespace"], d["name"]): d["facets"] for d in job["inputs"]}
    outs = {(d["namespace"], d["name"]): d["facets"] for d in job["outputs"]}
    got = ins[("s3://raw", "in.csv")]
    assert got["contentHash"]["digest"] == blake3.blake3(raw).hexdigest()
    assert got["version"]["datasetVersion"] == s3.head_object(
        Bucket="raw", Key="in.csv")["ETag"].strip('"')
    put = outs[("s3://clean", "out.csv")]
    assert put["contentHash"]["digest"] == blake3.blake3(raw.upper()).hexdigest()
    assert ("file", str(wd / "done.txt")) in outs
    # S3 objects are not declared files: the I/O check names them, truthfully.
    io = job["run"]["facets"]["roar_io"]
    assert "s3://raw/in.csv" in io["undeclaredReads"]

    # The job's lineage exports: a Process Run Crate with the objects as data entities.
    from tests.core.test_export import validate_crate

    env = {**os.environ, "ROAR_HOME": str(wd / ".roar-home")}
    subprocess.run([str(BIN / "roar-core"), "export", "done.txt", "--format", "ro-crate",
                    "-o", str(tmp_path / "crate")], cwd=wd, env=env, check=True)
    assert validate_crate(tmp_path / "crate")["passed"]
    graph = json.loads((tmp_path / "crate" / "ro-crate-metadata.json").read_text())["@graph"]
    (action,) = [e for e in graph if e["@type"] == "CreateAction"]
    assert action["identifier"] == job["run"]["runId"]
    ids = {e["@id"]: e for e in graph}
    assert ids["s3://raw/in.csv"]["identifier"] == "blake3:" + blake3.blake3(raw).hexdigest()
