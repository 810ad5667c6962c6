"""S3 lineage through boto3, against a real S3-compatible server (moto's server mode).

The truth is what the server holds and what the test itself fed it: blake3 of the bytes put
or got, the VersionId and ETag the server reports (`head_object`, untraced, from the test).
The scripts run as users run them, under `roar-core run` with no change for roar; every
event sent is validated against the OpenLineage spec.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import blake3
import pytest

from tests.core.test_cli import Cli, make_cli
from tests.core.test_exact_lineage import events, run

MiB = 1 << 20


def b3(data: bytes) -> str:
    return "blake3:" + blake3.blake3(data).hexdigest()


@pytest.fixture
def cli(tmp_path: Path, s3_url: str) -> Cli:
    c = make_cli(tmp_path)
    c.env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                 AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL_S3=s3_url)
    c.env.pop("AWS_PROFILE", None)
    return c


def script(cli: Cli, name: str, body: str) -> str:
    (cli.cwd / name).write_text("import boto3\ns3 = boto3.client('s3')\n" +
                                textwrap.dedent(body))
    return name


def store_accesses(cli: Cli, run_id: str) -> dict[tuple[str, str], object]:
    cli.ok("show")
    from roar_core import config
    from roar_core.pipeline.store import Store

    cfg = config.load(cwd=cli.cwd, env=cli.env)
    with Store.open(cfg.database_url, cfg.home) as store:
        return {(a.role, a.uri): a for a in store.accesses_of(run_id)}


def py_run(cli: Cli, job: str, name: str) -> str:
    return run(cli, job, f"{sys.executable} {name}", wait=True)


def test_cli_script_get_transform_put_multipart_copy_delete(cli: Cli, s3) -> None:
    raw = b"station,temp\n" + b"".join(b"s%d,%d\n" % (i, i % 40) for i in range(5000))
    big = os.urandom(20 * MiB + 12345)
    s3.create_bucket(Bucket="raw")
    s3.create_bucket(Bucket="clean")
    s3.put_bucket_versioning(Bucket="clean", VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket="raw", Key="in.csv", Body=raw)
    s3.put_object(Bucket="raw", Key="old.csv", Body=b"stale\n")
    s3.put_object(Bucket="raw", Key="old2.csv", Body=b"stale too\n")
    (cli.cwd / "big.bin").write_bytes(big)
    name = script(cli, "etl.py", """
        data = s3.get_object(Bucket="raw", Key="in.csv")["Body"].read()
        s3.put_object(Bucket="clean", Key="out.csv", Body=data.upper())
        big = open("big.bin", "rb").read()
        up = s3.create_multipart_upload(Bucket="clean", Key="big.bin")
        parts = []
        for n, at in enumerate(range(0, len(big), 8 << 20), 1):
            r = s3.upload_part(Bucket="clean", Key="big.bin", UploadId=up["UploadId"],
                               PartNumber=n, Body=big[at:at + (8 << 20)])
            parts.append({"PartNumber": n, "ETag": r["ETag"]})
        s3.complete_multipart_upload(Bucket="clean", Key="big.bin", UploadId=up["UploadId"],
                                     MultipartUpload={"Parts": parts})
        s3.copy_object(Bucket="clean", Key="copy.csv",
                       CopySource={"Bucket": "clean", "Key": "out.csv"})
        s3.delete_object(Bucket="raw", Key="old.csv")
        s3.delete_objects(Bucket="raw", Delete={"Objects": [{"Key": "old2.csv"}]})
        import io
        s3.upload_fileobj(io.BytesIO(b"from memory " * 100), "clean", "mem.txt")
        with open("big.bin", "rb") as f:  # multipart, on the transfer manager's threads
            s3.upload_fileobj(f, "clean", "big2.bin")
        """)
    run_id = py_run(cli, "etl", name)
    got = store_accesses(cli, run_id)
    head = {k: s3.head_object(Bucket="clean", Key=k) for k in ("out.csv", "big.bin", "copy.csv")}
    etag_in = s3.head_object(Bucket="raw", Key="in.csv")["ETag"].strip('"')

    i = got[("input", "s3://raw/in.csv")]
    assert (i.digest, i.size, i.object_version) == (b3(raw), len(raw), etag_in)
    o = got[("output", "s3://clean/out.csv")]
    assert (o.digest, o.object_version) == (b3(raw.upper()), head["out.csv"]["VersionId"])
    m = got[("output", "s3://clean/big.bin")]
    assert (m.digest, m.size) == (b3(big), len(big))  # hashed across its three parts
    assert m.object_version == head["big.bin"]["VersionId"]
    c = got[("output", "s3://clean/copy.csv")]  # copied inside S3: the source's bytes
    assert (c.digest, c.object_version) == (b3(raw.upper()), head["copy.csv"]["VersionId"])
    assert got[("deleted", "s3://raw/old.csv")].digest is None
    assert got[("deleted", "s3://raw/old2.csv")].digest is None
    assert got[("output", "s3://clean/mem.txt")].digest == b3(b"from memory " * 100)
    assert got[("output", "s3://clean/big2.bin")].digest == b3(big)
    assert s3.get_object(Bucket="clean", Key="big.bin")["Body"].read() == big

    complete = [e for e in events(cli) if e["eventType"] == "COMPLETE"][-1]
    outs = {(d["namespace"], d["name"]): d for d in complete["outputs"]}
    out = outs[("s3://clean", "out.csv")]["facets"]
    assert out["version"]["datasetVersion"] == head["out.csv"]["VersionId"]
    assert out["contentHash"]["digest"] == b3(raw.upper()).removeprefix("blake3:")
    assert outs[("s3://raw", "old.csv")]["facets"]["lifecycleStateChange"][
        "lifecycleStateChange"] == "DROP"
    (inp,) = [d for d in complete["inputs"] if d["namespace"] == "s3://raw"]
    assert inp["name"] == "in.csv" and inp["facets"]["version"]["datasetVersion"] == etag_in


def test_download_then_traced_reader_reaches_the_object(cli: Cli, s3) -> None:
    data = os.urandom(9 * MiB)  # above the transfer manager's threshold: ranged GETs
    s3.create_bucket(Bucket="raw")
    (cli.cwd / "seed.bin").write_bytes(data)
    up = script(cli, "up.py", 's3.upload_file("seed.bin", "raw", "seed.bin")\n')
    down = script(cli, "down.py", 's3.download_file("raw", "seed.bin", "local.bin")\n')
    up_run = py_run(cli, "upload", up)
    down_run = py_run(cli, "download", down)
    run(cli, "reader", "cat local.bin > copy.bin", wait=True)
    assert (cli.cwd / "copy.bin").read_bytes() == data

    # The transfer manager's parts went out on its threads: the object is the file's bytes.
    put = store_accesses(cli, up_run)[("output", "s3://raw/seed.bin")]
    assert put.digest == b3(data)
    got = store_accesses(cli, down_run)
    assert got[("input", "s3://raw/seed.bin")].digest == b3(data)
    assert got[("output", str((cli.cwd / "local.bin").resolve()))].digest == b3(data)
    tree = cli.ok("lineage", "copy.bin")
    for node in ("reader", "download", "s3://raw/seed.bin", "upload", "seed.bin"):
        assert node in tree, tree
    assert cli.ok("lineage", "--json", "s3://raw/seed.bin")
    events(cli)


def test_a_failed_call_is_not_lineage(cli: Cli, s3) -> None:
    s3.create_bucket(Bucket="raw")
    name = script(cli, "miss.py", """
        from botocore.exceptions import ClientError
        try:
            s3.get_object(Bucket="raw", Key="missing.csv")
        except ClientError as e:
            print(e.response["Error"]["Code"])
        try:
            s3.put_object(Bucket="no-such-bucket", Key="x", Body=b"x")
        except ClientError as e:
            print(e.response["Error"]["Code"])
        """)
    proc = cli("run", "--wait", "--", sys.executable, name)
    assert proc.returncode == 0
    assert proc.stdout.decode().split() == ["NoSuchKey", "NoSuchBucket"]
    run_id = proc.stderr.decode().split(", run ")[1].split(",")[0]
    assert not [k for k in store_accesses(cli, run_id) if k[1].startswith("s3://")]


READER = """
import hashlib, sys
out = {}
for style in ("read", "chunks", "readinto", "lines", "partial"):
    body = s3.get_object(Bucket="raw", Key="data.bin")["Body"]
    if style == "read":
        data = body.read()
    elif style == "chunks":
        data = b"".join(body.iter_chunks(7000))
    elif style == "readinto":
        buf = bytearray(3 << 20)
        n = body.readinto(buf)
        data = bytes(buf[:n]) + body.read()
    elif style == "lines":
        data = b"".join(body.iter_lines(keepends=True))
    else:
        data = body.read(1000)
        body.close()
    out[style] = hashlib.sha256(data).hexdigest()
print(out)
"""


def test_the_task_receives_the_same_bytes_with_and_without_roar(cli: Cli, s3) -> None:
    s3.create_bucket(Bucket="raw")
    data = b"".join(b"line %d %s\n" % (i, os.urandom(20).hex().encode()) for i in range(40000))
    s3.put_object(Bucket="raw", Key="data.bin", Body=data)
    s3.put_object(Bucket="raw", Key="empty.bin", Body=b"")
    name = script(cli, "reader.py", READER + """
print(repr(s3.get_object(Bucket="raw", Key="empty.bin")["Body"].read()))
""")
    plain = subprocess.run([sys.executable, name], cwd=cli.cwd, env=cli.env,
                           capture_output=True, check=True).stdout
    traced = cli("run", "--wait", "--", sys.executable, name)
    assert traced.returncode == 0, traced.stderr.decode()
    assert traced.stdout == plain
    run_id = traced.stderr.decode().split(", run ")[1].split(",")[0]
    # Read whole (the first read): its digest, taken from the stream as the task read it.
    got = store_accesses(cli, run_id)
    assert got[("input", "s3://raw/data.bin")].digest == b3(data)
    assert got[("input", "s3://raw/empty.bin")].digest == b3(b"")  # an empty body too


def test_an_s3_client_roar_cannot_see_is_said(cli: Cli, s3, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A stand-in: only its name matters (s5cmd moves objects with its own Go code).
    (bin_dir / "s5cmd").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "s5cmd").chmod(0o755)
    env = {**cli.env, "PATH": f"{bin_dir}:{cli.env['PATH']}"}
    proc = cli("run", "--wait", "--", "sh", "-c", "s5cmd cp s3://raw/a s3://raw/b", env=env)
    assert proc.returncode == 0
    assert "s5cmd" in proc.stderr.decode() and "not in the lineage" in proc.stderr.decode()
    complete = [e for e in events(cli) if e["eventType"] == "COMPLETE"][-1]
    assert complete["run"]["facets"]["roar_task"]["unseenObjectIO"] == ["s5cmd"]


TWO_TASKS = """
import threading
from roar_core.pipeline import tracer
shim = tracer.loaded()
ready = threading.Barrier(2)

def task(tag, key):
    shim.begin(tag)
    ready.wait()
    s3.upload_file("big.bin", "raw", key)  # multipart: on the transfer manager's threads
    s3.download_file("raw", key, key + ".local")
    shim.end()

threads = [threading.Thread(target=task, args=(f"task-{k}", k)) for k in ("a", "b")]
[t.start() for t in threads]
[t.join() for t in threads]
"""


def test_transfer_threads_keep_the_task_tag(cli: Cli, s3, tmp_path: Path) -> None:
    """Two tasks in one process at once (a threaded actor): each transfer's objects and
    files, moved on the transfer manager's pool threads, belong to the task that asked."""
    from roar_core.pipeline import tracelog, tracer

    s3.create_bucket(Bucket="raw")
    (cli.cwd / "big.bin").write_bytes(os.urandom(17 * MiB))
    name = script(cli, "two.py", TWO_TASKS)
    session = tmp_path / "session"
    session.mkdir()
    env = tracer.preload_env(session, base=cli.env)
    subprocess.run([sys.executable, name], cwd=cli.cwd, env=env, check=True)
    tags: dict[str, set[str | None]] = {}
    for log in session.glob("*.log"):
        for r in tracelog.read_log(log).records:
            if r.op == tracelog.OP["object"]:
                tags.setdefault(os.fsdecode(r.path), set()).add(r.tag)
            elif r.op == tracelog.OP["rename"] and r.path2.endswith(b".local"):
                tags.setdefault(os.fsdecode(r.path2), set()).add(r.tag)
    assert tags["s3://raw/a"] == {"task-a"} and tags["s3://raw/b"] == {"task-b"}
    assert tags[str(cli.cwd / "a.local")] == {"task-a"}
    assert tags[str(cli.cwd / "b.local")] == {"task-b"}
