"""Shared fixtures. `postgres_url`: a throwaway PostgreSQL server for the whole session.

Order: ROAR_TEST_DATABASE_URL (an existing server) > a cluster initdb'ed in a temp dir from the
PostgreSQL binaries found on this machine > skip, or fail when ROAR_TEST_REQUIRE_POSTGRES=1
(CI sets it so a missing server can never pass silently).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def _fork_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One directory for the recorders' fork servers of the whole session (a server per
    test would be hundreds of idle processes), whose servers are stopped at its end
    instead of idling out minutes later."""
    d = tmp_path_factory.mktemp("fork")
    d.chmod(0o700)
    yield d
    for pid in fork_servers(d):
        try:
            os.kill(pid, 15)
        except OSError:
            pass


def processes(module: str, arg_matches) -> list[int]:
    """Processes running `python -m module` with an argument `arg_matches(arg)` accepts
    (/proc; a recorder forked by the fork server has its command line as one title, words
    apart, so the words are what is looked at)."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().replace(b"\0", b" ").split()
        except OSError:
            continue
        if module.encode() in argv and any(arg_matches(a) for a in argv):
            found.append(int(pid))
    return found


def fork_servers(runtime: Path) -> list[int]:
    """The recorder fork servers serving from under `runtime`."""
    needle = os.fsencode(runtime.resolve())
    return processes("roar_core.recording.forkserver", lambda a: a.startswith(needle))


@pytest.fixture(autouse=True)
def _runtime_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                 _fork_servers: Path) -> None:
    """In-memory trace sessions (Snakemake's jobs', Airflow workers') go to a directory of
    the test's, not the machine's /dev/shm: a test that kills an engine on purpose would
    leave its session there, in RAM, for an hour (roar's sweep) or until a reboot."""
    d = tmp_path_factory.mktemp("run")
    d.chmod(0o700)
    (d / f"roar-{os.getuid()}").symlink_to(_fork_servers)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(d))


PG_USER = "roar"
PG_DB = "roar_test"


def _pg_bindir() -> Path | None:
    # Debian/Ubuntu keep initdb/pg_ctl off PATH, under one directory per major version.
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _unavailable(reason: str) -> None:
    if os.environ.get("ROAR_TEST_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"PostgreSQL required (ROAR_TEST_REQUIRE_POSTGRES=1) but {reason}")
    pytest.skip(f"PostgreSQL tests skipped: {reason}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Cluster:
    def __init__(self, bindir: Path, root: Path, as_user: str | None) -> None:
        self.bindir, self.root, self.as_user = bindir, root, as_user
        self.data, self.log = root / "data", root / "server.log"
        self.port = _free_port()

    def run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bindir / tool), *args]
        if self.as_user:
            cmd = ["runuser", "-u", self.as_user, "--", *cmd]
        # cwd: the postgres user may not be allowed into ours.
        done = subprocess.run(cmd, cwd=self.root, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr[-2000:]}{log}")

    def start(self) -> str:
        self.run(
            "initdb", "-D", str(self.data), "-U", PG_USER, "--auth=trust",
            "--encoding=UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        # Durability is irrelevant for a throwaway cluster and fsync is slow on shared disks.
        opts = (
            f"-h 127.0.0.1 -p {self.port} -k {self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "start")
        self.run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER, PG_DB)
        return f"postgresql+psycopg://{PG_USER}@127.0.0.1:{self.port}/{PG_DB}"

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a PostgreSQL database this test session may create schemas in."""
    existing = os.environ.get("ROAR_TEST_DATABASE_URL")
    if existing:
        yield existing
        return
    bindir = _pg_bindir()
    if bindir is None:
        _unavailable("no initdb/pg_ctl in /usr/lib/postgresql/*/bin or on PATH")
    as_user = None
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root.
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("running as root and there is no 'postgres' user to run the server as")
        as_user = "postgres"
    root = Path(tempfile.mkdtemp(prefix="roar-pg-"))
    if as_user:
        os.chown(root, pw.pw_uid, pw.pw_gid)
    cluster = _Cluster(bindir, root, as_user)
    try:
        try:
            url = cluster.start()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            _unavailable(f"could not start a server from {bindir}: {exc}")
        yield url
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_schema_url(postgres_url: str) -> Iterator[str]:
    """A fresh, empty schema per test (cheaper than a database, needs no CREATEDB right)."""
    import psycopg
    from sqlalchemy.engine import make_url

    schema = f"t_{uuid.uuid4().hex[:12]}"
    base = make_url(postgres_url).set(drivername="postgresql")
    dsn = base.render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = make_url(postgres_url).update_query_dict({"options": f"-csearch_path={schema}"})
    yield url.render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


# ---- S3: moto's server mode on loopback ------------------------------------------------------


def _s3_unavailable(reason: str) -> None:
    if os.environ.get("ROAR_TEST_REQUIRE_S3") == "1":
        pytest.fail(f"an S3 server is required (ROAR_TEST_REQUIRE_S3=1) but {reason}")
    pytest.skip(f"S3 tests skipped: {reason}")


@pytest.fixture(scope="session")
def s3_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a real S3-compatible HTTP server (moto's server mode) on 127.0.0.1."""
    import importlib.util
    import urllib.request

    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("boto3") is None:
        _s3_unavailable("moto[server] and boto3 are not installed")
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                 "-p", str(port)], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                _s3_unavailable(f"moto's server did not start: {log.read_text()[-500:]}")
            time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _empty(client) -> None:
    for bucket in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
        versions = client.list_object_versions(Bucket=bucket)
        for v in versions.get("Versions", []) + versions.get("DeleteMarkers", []):
            client.delete_object(Bucket=bucket, Key=v["Key"], VersionId=v["VersionId"])
        client.delete_bucket(Bucket=bucket)


@pytest.fixture
def s3(s3_url: str) -> Iterator[object]:
    """A boto3 client of the S3 server, with no bucket in it (before and after the test)."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    _empty(client)
    yield client
    _empty(client)


@pytest.fixture(autouse=True)
def _stores_hold_no_dangling_reference(request: pytest.FixtureRequest) -> Iterator[None]:
    """SQLite's connections do not check foreign keys per row (roar_core.pipeline.store:
    the writer makes each row a reference points to first): every SQLite store a test
    leaves under its tmp_path, whatever wrote it (a recorder, an engine's suite), must
    hold no reference to a row that is not there."""
    root = (request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames
            else None)
    yield
    if root is None:
        return
    import sqlite3

    # os.walk, not rglob: a process the test left (a fork server going away) may remove a
    # directory of it during the walk, which rglob raises on.
    found = (os.path.join(d, "lineage.db") for d, _, files in os.walk(root)
             if "lineage.db" in files)
    for db in found:
        try:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        except sqlite3.Error:
            continue
        try:
            dangling = conn.execute("PRAGMA foreign_key_check").fetchall()
        except sqlite3.Error:  # not a store (a test's garbage on purpose), or locked
            continue
        finally:
            conn.close()
        assert not dangling, f"{db}: rows referencing no row: {dangling[:5]}"
