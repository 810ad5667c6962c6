"""The recorders' fork server (roar_core.recording.forkserver): a recorder forked from it
records as one started from a fresh interpreter would, in the environment of the producer
that asked for it, not the server's; with no usable server, recorders start the old way."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.conftest import fork_servers
from tests.core.test_cli import _recorders_of, b3, make_cli


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _wait(what, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (got := what()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return got


@pytest.fixture
def runtime(tmp_path: Path):
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    yield d
    for pid in fork_servers(d):
        os.kill(pid, signal.SIGTERM)


def _run_and_catch_recorder(cli, name: str) -> int:
    """A run whose recorder is caught alive (it waits for the next run a while)."""
    (cli.cwd / "a.txt").write_text(f"{name}\n")
    assert cli("run", "--job", name, "--", "cp", "a.txt", "b.txt").returncode == 0
    home = Path(cli.env["ROAR_HOME"])
    return _wait(lambda: _recorders_of(home))[0]


def _outputs(cli, events: Path | None = None) -> dict[str, str]:
    """The outputs of the run's COMPLETE event, once delivered (its START may come first,
    in a delivery of its own) to `events`, by default the home's file transport's."""
    events = events or Path(cli.env["ROAR_HOME"]) / "openlineage" / "events.jsonl"

    def complete() -> dict[str, str]:
        out = {}
        text = events.read_text() if events.exists() else ""
        for e in map(json.loads, text.split("\n")[:-1]):  # whole lines only
            if e["eventType"] == "COMPLETE":
                for d in e["outputs"]:
                    out[d["name"]] = d["facets"]["version"]["datasetVersion"]
        return out

    return _wait(complete)


def test_a_forked_recorder_records_in_its_producers_environment(tmp_path: Path,
                                                                 runtime: Path) -> None:
    first = make_cli(tmp_path / "first")
    first.env.update(XDG_RUNTIME_DIR=str(runtime), ROAR_DEBUG="1")
    pid = _run_and_catch_recorder(first, "first")
    server = _wait(lambda: fork_servers(runtime))
    assert len(server) == 1
    assert _parent(pid) == server[0]

    # The server was started from the first producer's environment (ROAR_DEBUG=1: the
    # recorder reports its CPU time on exit); the second producer's has none.
    second = make_cli(tmp_path / "second")
    second.env.update(XDG_RUNTIME_DIR=str(runtime))
    pid = _run_and_catch_recorder(second, "second")
    assert _parent(pid) == server[0], "not forked by the running server"
    assert fork_servers(runtime) == server
    for cli in (first, second):
        _wait(lambda cli=cli: not _recorders_of(Path(cli.env["ROAR_HOME"])))
    logs = [Path(cli.env["ROAR_HOME"]) / "sessions" / "recorder.log" for cli in (first, second)]
    assert "roar recorder: 1 tasks" in logs[0].read_text()
    # The server's warm-up imported all a recorder needs to record a run: it imports
    # nothing itself (each module missed cost every recorder its import, ~5 ms each).
    assert "roar recorder: imported []" in logs[0].read_text()
    assert "roar recorder:" not in (logs[1].read_text() if logs[1].exists() else "")
    # ...and what it recorded is the truth: the output's digest is that of its bytes.
    for cli in (first, second):
        out = cli.cwd / "b.txt"
        got = _outputs(cli)
        assert got == {str(out): b3(out)}


def test_a_server_started_from_a_directory_removed_meanwhile_serves(
        tmp_path: Path, runtime: Path) -> None:
    """A run from a scratch directory that is removed as soon as it returns (`cd $(mktemp
    -d) && roar-core run ...; rm -rf` in a script): the fork server it started, still
    importing then, must not need that directory.  It used to ask for its working
    directory after its imports and die there, so that run's recorder never started, and
    every run after it found the dead server's socket, waited for an answer, and started
    another server."""
    import shutil

    scratch = tmp_path / "scratch"
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("made in a scratch directory\n")
    cli = make_cli(tmp_path)
    cli.env.update(XDG_RUNTIME_DIR=str(runtime))
    scratch.mkdir()
    proc = cli("run", "--job", "scratch", "--", "cp", str(data / "a.txt"), str(data / "b.txt"),
               cwd=scratch)
    assert proc.returncode == 0, proc.stderr.decode()
    shutil.rmtree(scratch)
    out = data / "b.txt"
    assert _outputs(cli) == {str(out): b3(out)}
    server = _wait(lambda: fork_servers(runtime))
    pid = _run_and_catch_recorder(cli, "after")
    assert _parent(pid) == server[0], "not forked by the server the first run started"
    assert fork_servers(runtime) == server


def test_a_projects_own_modules_never_shadow_the_recorders(tmp_path: Path,
                                                           runtime: Path) -> None:
    """A project with a `json.py` at its top (any module named like one of the standard
    library's): the fork server and recorder started from it import the standard
    library's, not the project's.  `python -m` puts the directory it starts in first on
    the import path; there the server died importing the project's module (Python 3.10,
    which has no -P, until they started in /), and the run was not recorded.  They still
    work in the project's directory: the OpenLineage client reads its openlineage.yml."""
    cli = make_cli(tmp_path)
    cli.env.update(XDG_RUNTIME_DIR=str(runtime))
    marker = tmp_path / "imported"
    (cli.cwd / "json.py").write_text(
        f"open({str(marker)!r}, 'w').write('the project json.py')\n"
        "raise ImportError('the project json.py, not the standard library json')\n")
    sent = tmp_path / "project-events.jsonl"
    (cli.cwd / "openlineage.yml").write_text(
        f"transport:\n  type: file\n  log_file_path: {sent}\n  append: true\n")
    (cli.cwd / "a.txt").write_text("a project with its own json.py\n")
    assert cli("run", "--job", "shadow", "--", "cp", "a.txt", "b.txt").returncode == 0
    out = cli.cwd / "b.txt"
    assert _outputs(cli, sent) == {str(out): b3(out)}
    assert not marker.exists()


PROJECT_TRANSPORT = """
import os
from openlineage.client.transport.file import FileTransport


class ProjectTransport(FileTransport):
    \"\"\"A project's own transport: the file transport, saying whose module sent.\"\"\"

    def emit(self, event):
        open(os.path.join(os.path.dirname(__file__), "used"), "w").close()
        return super().emit(event)
"""


def test_a_relative_pythonpath_is_the_projects_in_the_recorder(tmp_path: Path,
                                                              runtime: Path) -> None:
    """Two projects, each run with `PYTHONPATH=lib` and its own OpenLineage transport class
    there, named by its openlineage.yml: the fork server, started in /, imports each
    project's own (a server per project: the same relative path is two directories)."""
    for name in ("a", "b"):
        cli = make_cli(tmp_path / name)
        pythonpath = os.pathsep.join(p for p in ("lib", os.environ.get("PYTHONPATH")) if p)
        cli.env.update(XDG_RUNTIME_DIR=str(runtime), PYTHONPATH=pythonpath)
        (cli.cwd / "lib").mkdir()
        (cli.cwd / "lib" / "projtransport.py").write_text(PROJECT_TRANSPORT)
        sent = tmp_path / name / "events.jsonl"
        (cli.cwd / "openlineage.yml").write_text(
            f"transport:\n  type: projtransport.ProjectTransport\n  log_file_path: {sent}\n"
            "  append: true\n")
        (cli.cwd / "a.txt").write_text(f"project {name}\n")
        assert cli("run", "--", "cp", "a.txt", "b.txt").returncode == 0
        out = cli.cwd / "b.txt"
        assert _outputs(cli, sent) == {str(out): b3(out)}
        assert (cli.cwd / "lib" / "used").exists(), f"project {name}'s transport not used"
    assert len(fork_servers(runtime)) == 2


def test_a_dead_servers_socket_is_taken_over(tmp_path: Path, runtime: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from roar_core.recording import forkserver

    cli = make_cli(tmp_path)
    cli.env.update(XDG_RUNTIME_DIR=str(runtime))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setattr(forkserver, "_socket_path", None)
    path = forkserver.socket_path()  # (the CLI's: same interpreter, import path and code)
    assert path is not None and Path(path).parent == (runtime / f"roar-{os.getuid()}").resolve()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(os.fspath(path))  # left behind, nobody listening: a dead server's
    pid = _run_and_catch_recorder(cli, "after")
    server = _wait(lambda: fork_servers(runtime))
    assert _parent(pid) == server[0]
    with open(f"/proc/{server[0]}/cmdline", "rb") as f:
        assert os.fsencode(path) in f.read()  # serving on the dead one's socket
    out = cli.cwd / "b.txt"
    assert _outputs(cli) == {str(out): b3(out)}


def test_without_a_private_runtime_directory_a_recorder_starts_the_old_way(
        tmp_path: Path, runtime: Path) -> None:
    (runtime / f"roar-{os.getuid()}").mkdir(mode=0o777)
    os.chmod(runtime / f"roar-{os.getuid()}", 0o777)  # others could plant a server there
    cli = make_cli(tmp_path)
    cli.env.update(XDG_RUNTIME_DIR=str(runtime))
    pid = _run_and_catch_recorder(cli, "plain")
    assert not fork_servers(runtime)
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    assert b"roar_core.recording.recorder" in argv  # a fresh interpreter's command line
    out = cli.cwd / "b.txt"
    assert _outputs(cli) == {str(out): b3(out)}


def test_a_producer_in_another_mount_namespace_gets_a_server_of_its_own() -> None:
    """A recorder forked by a server outside the producer's mount namespace saw the files
    as the server did: it recorded into a home the producer had mounted read-only."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    code = "from roar_core.recording import forkserver; print(forkserver.socket_path())"
    here = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout
    ns = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
    there = subprocess.run([*ns, sys.executable, "-c", code], capture_output=True, text=True)
    if there.returncode != 0:
        pytest.skip(f"no mount namespace here: {there.stderr.strip()}")
    assert here.strip() and there.stdout.strip() and here != there.stdout
