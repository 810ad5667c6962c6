"""The `roar-core` command line, run for real: the installed console script in subprocesses,
the real tracer, a real SQLite store and the file transport, each test in its own temp dirs.

One traced pipeline (gen -> transform -> stage, a `cp` to a new path -> report) is made once per
module and queried by several tests; tests that need a store of their own make one.
"""

from __future__ import annotations

import html
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import blake3
import pytest
from rich.console import Console

from roar_core.cli import commands as cli_mod
from roar_core.cli import graph as graph_mod
from roar_core.cli.views import tree_lines
from roar_core.cli.wait import SHORT_DIGEST, HashProgress
from roar_core.lineage import ArtifactNode, Edge, LineageGraph, RunNode
from tests.conftest import processes

ROAR = shutil.which("roar-core", path=str(Path(sys.executable).parent)) or shutil.which("roar-core")
SVG_NS = "{http://www.w3.org/2000/svg}"
JOBS = {"gen", "transform", "stage", "report"}


def _env(home: Path) -> dict[str, str]:
    # Nothing of the caller's roar or OpenLineage setup (CI exports ROAR_TEST_*; a developer
    # may have OPENLINEAGE_URL set): the embedded defaults, with the home in the test's tmp.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ROAR_", "OPENLINEAGE_")) and k != "LD_PRELOAD"}
    env["ROAR_HOME"] = str(home)
    return env


@dataclass
class Cli:
    cwd: Path
    env: dict[str, str]
    steps: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)

    def __call__(self, *args: str | bytes, env: dict[str, str] | None = None,
                 timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess:
        assert ROAR, "the roar-core console script is not installed next to this Python"
        return subprocess.run([ROAR, *args], cwd=cwd or self.cwd, env=env or self.env,
                              capture_output=True, timeout=timeout)

    def ok(self, *args: str | bytes) -> str:
        proc = self(*args)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        return proc.stdout.decode()


def make_cli(root: Path) -> Cli:
    work = root / "work"
    work.mkdir(parents=True)
    return Cli(work, _env(root / "home"))


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """stderr must be exactly one `roar-core: error: ...` line, with no traceback."""
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1, proc.stderr.decode()
    assert lines[0].startswith("roar-core: error: "), lines[0]
    return lines[0]


def b3(path: Path) -> str:
    return "blake3:" + blake3.blake3(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Cli:
    cli = make_cli(tmp_path_factory.mktemp("pipeline"))
    (cli.cwd / "staged").mkdir()
    steps = {
        "gen": ["bash", "-c", "seq 1 200 > raw.csv"],
        "transform": ["bash", "-c", "sort -rn raw.csv > clean.csv"],
        "stage": ["cp", "clean.csv", "staged/clean.csv"],
        "report": ["bash", "-c", "wc -l < staged/clean.csv > report.txt"],
    }
    for job, argv in steps.items():
        proc = cli("run", "--wait", "--job", job, "--", *argv)
        assert proc.returncode == 0, proc.stderr.decode()
        cli.steps[job] = proc
    return cli


# ---- the pipeline ---------------------------------------------------------------------------


def test_lineage_json_follows_the_whole_chain_across_the_copy(pipeline: Cli) -> None:
    work = pipeline.cwd
    g = json.loads(pipeline.ok("lineage", "report.txt", "--json"))
    assert g["direction"] == "upstream"
    assert sorted(r["job_name"] for r in g["runs"]) == sorted(JOBS)
    artifacts = {(a["uri"], a["digest"]) for a in g["artifacts"]}
    # The first file, by content hash, and the copy's source and target with the same content.
    assert (str(work / "raw.csv"), b3(work / "raw.csv")) in artifacts
    assert (str(work / "clean.csv"), b3(work / "clean.csv")) in artifacts
    assert (str(work / "staged" / "clean.csv"), b3(work / "clean.csv")) in artifacts
    assert g["root"] == f"artifact:{b3(work / 'report.txt')}:{work / 'report.txt'}"
    # Edge by edge: each run reads what the previous one wrote.
    run_of = {r["job_name"]: r["id"] for r in g["runs"]}
    file_of = {a["uri"]: a["id"] for a in g["artifacts"]}
    edges = {(e["source"], e["target"], e["kind"]) for e in g["edges"]}
    chain = ["gen", "raw.csv", "transform", "clean.csv", "stage", "staged/clean.csv", "report",
             "report.txt"]
    ids = [run_of.get(n) or file_of[str(work / n)] for n in chain]
    expected = {(a, b, "output" if a.startswith("run:") else "input")
                for a, b in zip(ids, ids[1:], strict=False)}
    assert edges == expected


def test_lineage_text_depth_and_digest_keys(pipeline: Cli) -> None:
    work = pipeline.cwd
    text = pipeline.ok("lineage", "report.txt")
    for job in JOBS:
        assert f"run {job}  COMPLETE" in text
    assert "staged/clean.csv  blake3:" in text and "raw.csv  blake3:" in text
    shallow = json.loads(pipeline.ok("lineage", "report.txt", "--depth", "1", "--json"))
    assert [r["job_name"] for r in shallow["runs"]] == ["report"]
    # A digest names the content wherever it lives: everything made from raw.csv's content.
    down = json.loads(pipeline.ok("lineage", b3(work / "raw.csv"), "--downstream", "--json"))
    assert sorted(r["job_name"] for r in down["runs"]) == ["report", "stage", "transform"]


def test_a_digest_prefix_as_printed_names_the_content(pipeline: Cli, tmp_path: Path) -> None:
    """The short digests roar prints (`blake3:` + 12 hex), or any unique prefix of at least
    8 hex digits, are accepted wherever a digest is."""
    work = pipeline.cwd
    full = b3(work / "raw.csv")
    printed = pipeline.steps["gen"].stderr.decode()
    short = full[: len("blake3:") + 12]
    assert short in printed  # what a person copies from the run's summary
    want = json.loads(pipeline.ok("lineage", full, "--downstream", "--json"))
    for key in (short, short[len("blake3:"):], full[: len("blake3:") + 8]):
        assert json.loads(pipeline.ok("lineage", key, "--downstream", "--json")) == want, key
    proc = pipeline("lineage", "blake3:" + "0" * 12)
    assert proc.returncode == 1
    assert "no recorded version has a digest starting with" in one_error_line(proc)
    # Hex that names a file here is that file.
    (work / short[len("blake3:"):]).write_text("a file named like a digest\n")
    try:
        proc = pipeline("lineage", short[len("blake3:"):])
        assert proc.returncode == 1 and "no lineage recorded for" in one_error_line(proc)
    finally:
        (work / short[len("blake3:"):]).unlink()


def test_an_ambiguous_digest_prefix_is_refused(tmp_path: Path) -> None:
    from datetime import datetime, timezone

    from roar_core.pipeline.store import Store
    from roar_core.pipeline.store_records import Access, TaskRun

    cli = make_cli(tmp_path)
    now = datetime.now(timezone.utc)
    with Store.open(home=Path(cli.env["ROAR_HOME"])) as store:
        for n, digest in ((1, "ab" * 32), (2, "abababab" + "cd" * 28)):
            run_id = f"00000000-0000-7000-8000-{n:012d}"
            store.finish_task_run(
                run_id, "COMPLETE", now, 0,
                accesses=[Access(str(tmp_path / f"f{n}"), "output", digest, 1, 1)],
                started=TaskRun(run_id=run_id, engine="t", namespace="t", job_name="t",
                                started_at=now))
        assert store.complete_digest("abababab") == ["blake3:" + "ab" * 32,
                                                     "blake3:" + "abababab" + "cd" * 28]
        assert store.complete_digest("ababababa") == ["blake3:" + "ab" * 32]
    proc = cli("lineage", "blake3:abababab")
    assert proc.returncode == 1 and "is ambiguous" in one_error_line(proc)
    assert cli("lineage", "ababababab", "--json").returncode == 0


def test_lineage_and_show_say_when_the_file_has_changed_since(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    f = cli.cwd / "f.txt"
    assert cli("run", "--wait", "--", "bash", "-c", "echo one > f.txt").returncode == 0
    recorded = b3(f)
    for cmd in ("lineage", "show", "graph"):
        args = (cmd, "f.txt") + (("--format", "dot", "-o", "g.dot") if cmd == "graph" else ())
        proc = cli(*args)
        assert proc.returncode == 0 and b"warning" not in proc.stderr, proc.stderr
        f.write_text("two\n")  # edited in place, not by a traced run
        proc = cli(*args)
        assert proc.returncode == 0
        line = one_warning_line(proc)
        assert "f.txt has changed since it was recorded" in line
        assert f"it now holds {b3(f)[:19]}" in line and line.endswith(recorded[:19])
        f.unlink()
        assert "it no longer exists" in one_warning_line(cli(*args))
        f.write_text("one\n")  # the recorded content again: no warning
        assert b"warning" not in cli(*args).stderr


def one_warning_line(proc: subprocess.CompletedProcess) -> str:
    lines = [x for x in proc.stderr.decode().splitlines() if "warning" in x]
    assert len(lines) == 1, proc.stderr.decode()
    return lines[0]


def test_run_summary_on_stderr_and_show(pipeline: Cli) -> None:
    work = pipeline.cwd
    summary = pipeline.steps["transform"].stderr.decode()
    assert pipeline.steps["transform"].stdout == b""
    raw_short = b3(work / "raw.csv")[: len("blake3:") + SHORT_DIGEST]
    assert "job transform, run " in summary and "COMPLETE (exit 0)" in summary
    assert "inputs (1):" in summary and f"raw.csv  {raw_short}" in summary
    assert "outputs (1):" in summary and "clean.csv  blake3:" in summary

    listing = pipeline.ok("show")
    rows = listing.splitlines()[1:]
    assert len(rows) == 4 and {row.split()[2] for row in rows} == JOBS
    run_id = next(row.split()[-1] for row in rows if row.split()[2] == "stage")
    one = pipeline.ok("show", run_id)
    assert f"run       {run_id}" in one and "command   cp clean.csv staged/clean.csv" in one
    assert f"{work / 'clean.csv'}  {b3(work / 'clean.csv')}" in one
    assert f"{work / 'staged' / 'clean.csv'}  {b3(work / 'clean.csv')}" in one

    versions = pipeline.ok("show", "staged/clean.csv")
    assert versions.splitlines()[0] == str(work / "staged" / "clean.csv")
    assert re.search(r"written by\s+stage\s", versions)
    assert re.search(r"read by\s+report\s", versions)


def test_graph_in_three_formats(pipeline: Cli) -> None:
    g = json.loads(pipeline.ok("lineage", "report.txt", "--json"))
    n_runs, n_files, n_edges = len(g["runs"]), len(g["artifacts"]), len(g["edges"])

    dot = pipeline.ok("graph", "report.txt", "--format", "dot")
    assert dot.startswith("digraph lineage {\n") and dot.endswith("}\n")
    assert len(re.findall(r'^  "run:[^"]+" \[shape=box', dot, re.M)) == n_runs
    assert len(re.findall(r'^  "artifact:[^"]+" \[shape=ellipse', dot, re.M)) == n_files
    assert len(re.findall(r'^  "[^"]+" -> "[^"]+";$', dot, re.M)) == n_edges
    if shutil.which("dot"):  # Graphviz itself, where installed, must accept it
        subprocess.run(["dot", "-Tsvg"], input=dot.encode(), check=True, capture_output=True)

    out = pipeline.cwd / "g.svg"
    pipeline.ok("graph", "report.txt", "--format", "svg", "-o", str(out))
    root = ET.parse(out).getroot()  # well-formed XML, or this raises
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask  # as any file written here, not 0600
    assert root.tag == f"{SVG_NS}svg"
    groups = [el.get("class").split() for el in root.iter(f"{SVG_NS}g")]
    assert sum("run" in c for c in groups) == n_runs
    assert sum("file" in c for c in groups) == n_files
    assert [c for c in groups if "focus" in c] == [["node", "file", "focus"]]  # report.txt
    assert len([p for p in root.iter(f"{SVG_NS}path") if "edge" in (p.get("class") or "")]) \
        == n_edges

    page = pipeline.ok("graph", "report.txt", "--format", "html")
    assert page.startswith("<!DOCTYPE html>")
    svg = page[page.index("<svg") : page.index("</svg>") + len("</svg>")]
    assert ET.fromstring(svg).tag == f"{SVG_NS}svg"
    for r in g["runs"]:
        assert r["run_id"] in page
    for a in g["artifacts"]:
        assert a["digest"] in page


def test_doctor_and_module_entry_point(pipeline: Cli) -> None:
    pipeline.ok("flush")  # the home's recorder delivers after each `--wait` returns
    proc = subprocess.run([sys.executable, "-m", "roar_core", "doctor"], cwd=pipeline.cwd,
                          env=pipeline.env, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    status = {line.split()[0]: line.split()[1] for line in proc.stdout.decode().splitlines()}
    assert status == {"tracer": "ok", "config": "ok", "hashing": "ok", "home": "ok", "store": "ok",
                      "openlineage": "ok", "spool": "ok", "recorder": "ok"}
    # The file transport of the embedded defaults got START and COMPLETE of every run.
    events = Path(pipeline.env["ROAR_HOME"]) / "openlineage" / "events.jsonl"
    kinds = [json.loads(line)["eventType"] for line in events.read_text().splitlines()]
    assert sorted(kinds) == ["COMPLETE"] * 4 + ["START"] * 4


def test_doctor_in_a_fresh_directory_creates_nothing(tmp_path: Path) -> None:
    """It made .roar-core/openlineage/ there, which made that directory the project root of
    every later command run below it."""
    cli = make_cli(tmp_path)
    env = {k: v for k, v in cli.env.items() if k != "ROAR_HOME"}  # the default home: ./.roar-core
    proc = cli("doctor", env=env)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    assert "openlineage  ok  file transport to" in proc.stdout.decode()
    assert list(cli.cwd.iterdir()) == []


def test_a_project_that_uses_roar_cli_is_left_alone(tmp_path: Path) -> None:
    """roar-cli (the peer) keeps `.roar/` with its own config.toml: every roar-core command
    failed on it ("unknown key 'output'"), and its parent became roar-core's project root."""
    cli = make_cli(tmp_path)
    peer = cli.cwd / ".roar"
    peer.mkdir()
    (peer / "config.toml").write_text('[output]\nquiet = true\n[filters]\nignore_tmp_files = 0\n')
    (peer / "roar.db").write_bytes(b"not ours")
    before = {p: p.stat().st_mtime_ns for p in [peer, *peer.iterdir()]}
    sub = cli.cwd / "steps"
    sub.mkdir()
    (sub / "in.txt").write_text("x\n")
    env = {k: v for k, v in cli.env.items() if k != "ROAR_HOME"}
    for args in (["run", "--wait", "--", "cp", "in.txt", "out.txt"], ["show"],
                 ["lineage", "out.txt"], ["doctor"]):
        proc = cli(*args, env=env, cwd=sub)
        assert proc.returncode == 0, (args, proc.stderr.decode())
        assert "unknown key" not in proc.stderr.decode()
    assert (sub / ".roar-core" / "lineage.db").is_file()  # its own home, where it ran
    assert {p: p.stat().st_mtime_ns for p in [peer, *peer.iterdir()]} == before
    assert sorted(p.name for p in peer.iterdir()) == ["config.toml", "roar.db"]


def test_doctor_says_when_the_backend_takes_no_connection(tmp_path: Path) -> None:
    import socket

    cli = make_cli(tmp_path)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        up = cli("doctor", env={**cli.env, "OPENLINEAGE_URL": f"http://127.0.0.1:{port}"})
    assert up.returncode == 0 and re.search(rb"^openlineage\s+ok\s+http transport", up.stdout,
                                            re.M), up.stdout
    # The same port, closed now.
    down = cli("doctor", env={**cli.env, "OPENLINEAGE_URL": f"http://127.0.0.1:{port}"})
    assert down.returncode == 1
    assert re.search(rb"^openlineage\s+FAIL\s+http transport .*cannot connect \(Connection "
                     rb"refused\)", down.stdout, re.M), down.stdout


def test_doctor_says_when_the_native_hasher_is_missing(pipeline: Cli) -> None:
    """A warning line for hashing (it falls back to Python), not a crash of doctor."""
    script = ("import sys; from pathlib import Path; import roar_core.pipeline.nativehash as n; "
              "n.library_path = lambda: Path('/nonexistent/libroar_hashbatch.so'); "
              "sys.argv = ['roar-core', 'doctor']; from roar_core.cli.entry import main; main()")
    proc = subprocess.run([sys.executable, "-c", script], cwd=pipeline.cwd, env=pipeline.env,
                          capture_output=True, timeout=60)
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()
    status = {line.split()[0]: line.split()[1] for line in proc.stdout.decode().splitlines()}
    assert status["hashing"] == "warn" and status["store"] == "ok"
    assert b"/nonexistent/libroar_hashbatch.so is missing" in proc.stdout


# ---- exit codes, signals, output --------------------------------------------------------------


def test_exit_codes_signals_and_output_pass_through(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    proc = cli("run", "--wait", "--", "bash", "-c", "printf 'out\\n'; printf 'err\\n' >&2; exit 3")
    assert proc.returncode == 3
    assert proc.stdout == b"out\n"  # untouched: our summary is on stderr
    assert proc.stderr.startswith(b"err\n") and b"FAIL (exit 3)" in proc.stderr

    proc = cli("run", "--wait", "--", "bash", "-c", "kill -TERM $$")
    assert proc.returncode == -signal.SIGTERM
    assert b"killed by SIGTERM" in proc.stderr

    # A death by SIGKILL (an OOM kill, for a scheduler) is passed on as such, as for
    # SIGTERM: no traceback, not exit 1.  Without --wait too (the runner's own path).
    for wait in (["--wait"], []):
        proc = cli("run", *wait, "--", "sh", "-c", "kill -KILL $$")
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert b"killed by SIGKILL" in proc.stderr and b"Traceback" not in proc.stderr

    proc = cli("run", "--wait", "--", "no-such-program-roar-test")
    assert proc.returncode == 127 and b"No such file or directory" in proc.stderr

    listing = cli.ok("show")
    assert "FAIL (killed by SIGTERM)" in listing and "FAIL (exit 3)" in listing


def test_untraced_runs_say_so_and_the_kill_switch_records_nothing(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    proc = cli("run", "--wait", "--", "touch", "a", env={**cli.env, "ROAR_TRACER_OFF": "1"})
    assert proc.returncode == 0 and (cli.cwd / "a").exists()
    assert b"roar-core: UNTRACED: ROAR_TRACER_OFF is set" in proc.stderr
    assert re.search(r"touch\s+COMPLETE \(exit 0\)\s+0\s+0\s+NO\s", cli.ok("show"))
    home = tmp_path / "off"
    proc = cli("run", "--wait", "--", "touch", "b", env={**cli.env, "ROAR_DISABLED": "1",
                                              "ROAR_HOME": str(home)})
    assert proc.returncode == 0 and (cli.cwd / "b").exists() and not home.exists()
    assert b"recording nothing" in proc.stderr


@pytest.mark.skipif(not Path("/sbin/ldconfig").is_file(), reason="needs /sbin/ldconfig")
def test_static_program_makes_the_run_untraced(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)  # Debian's ldconfig is statically linked: no LD_PRELOAD there
    proc = cli("run", "--wait", "--", "bash", "-c", "/sbin/ldconfig -p > /dev/null; echo x > f")
    assert proc.returncode == 0
    err = proc.stderr.decode()
    assert "UNTRACED: ran programs the preload tracer cannot see: /sbin/ldconfig" in err
    assert "outputs (1):\n    f  blake3:" in err  # what the traced part did is still there


def test_postgres_store_and_redacted_urls(tmp_path: Path, postgres_schema_url: str) -> None:
    cli = make_cli(tmp_path)
    env = {**cli.env, "ROAR_DATABASE_URL": postgres_schema_url}
    proc = cli("run", "--wait", "--job", "pg", "--", "bash", "-c", "echo x > f.txt", env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    g = json.loads(cli("lineage", "f.txt", "--json", env=env).stdout)
    assert [r["job_name"] for r in g["runs"]] == ["pg"]
    assert not (Path(cli.env["ROAR_HOME"]) / "lineage.db").exists()  # nothing went to SQLite
    # A password never reaches the screen, even when the server cannot be reached.
    bad = {**cli.env, "ROAR_DATABASE_URL": "postgresql://u:s3cret@127.0.0.1:9/db"}
    doctor = cli("doctor", env=bad)
    assert doctor.returncode == 1 and b"u:***@127.0.0.1:9/db" in doctor.stdout
    # The command runs all the same, and its run waits for the server.
    proc = cli("run", "--wait", "--", "touch", "later", env=bad)
    assert proc.returncode == 0 and (cli.cwd / "later").exists()
    assert b"u:***@" in proc.stderr and b"Traceback" not in proc.stderr
    assert b"s3cret" not in doctor.stdout + doctor.stderr + proc.stderr
    waiting = cli("doctor", env=bad)
    assert b"1 run(s) waiting" in waiting.stdout and b"s3cret" not in waiting.stdout


def test_no_wait_hands_off_and_readers_wait_for_the_recorder(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    for job, script in (("one", "seq 3 > a"), ("two", "cat a > b")):
        proc = cli("run", "--job", job, "--", "bash", "-c", script)
        assert proc.returncode == 0 and b"recording in the background" in proc.stderr
    proc = cli("run", "--", "bash", "-c", "exit 4")
    assert proc.returncode == 4
    # No sleep: lineage drains whatever the background recorder has not done yet.
    g = json.loads(cli.ok("lineage", "b", "--json"))
    assert sorted(r["job_name"] for r in g["runs"]) == ["one", "two"]
    assert "FAIL (exit 4)" in cli.ok("show")


# ---- bad input ------------------------------------------------------------------------------


def test_unknown_config_key_is_named_and_nothing_runs(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    (cli.cwd / ".roar-core").mkdir()
    (cli.cwd / ".roar-core" / "config.toml").write_text('namespce = "typo"\n')
    proc = cli("run", "--wait", "--", "touch", "marker")
    assert proc.returncode == 2
    assert "unknown key 'namespce'" in one_error_line(proc)
    assert not (cli.cwd / "marker").exists()


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    (cli.cwd / ".roar-core").mkdir()
    (cli.cwd / ".roar-core" / "config.toml").write_bytes(b'namespace = "caf\xe9"\n')
    proc = cli("show")
    assert proc.returncode == 2
    assert "not UTF-8" in one_error_line(proc) and "config.toml" in one_error_line(proc)


def test_a_home_that_cannot_be_created_still_runs_the_command(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    # We may be root, who can write anywhere: a path under a regular file is never writable.
    (tmp_path / "a-file").write_text("")
    env = {**cli.env, "ROAR_HOME": str(tmp_path / "a-file" / "home")}
    for wait in (["--wait"], []):
        (cli.cwd / "marker").unlink(missing_ok=True)
        proc = cli("run", *wait, "--", "touch", "marker", env=env)
        assert proc.returncode == 0 and (cli.cwd / "marker").exists(), proc.stderr
        assert b"Traceback" not in proc.stderr
        assert str(tmp_path / "a-file" / "home").encode() in proc.stderr
    doctor = cli("doctor", env=env)
    assert doctor.returncode == 1 and re.search(rb"^store\s+FAIL", doctor.stdout, re.M)
    assert b"2 of them kept in" in doctor.stdout


def test_unknown_path_or_run_is_one_line(pipeline: Cli, tmp_path: Path) -> None:
    proc = pipeline("lineage", "never-made.txt")
    assert proc.returncode == 1
    assert "no lineage recorded for never-made.txt" in one_error_line(proc)
    proc = pipeline("show", "01234567-89ab-cdef-0123-456789abcdef")
    assert proc.returncode == 1 and "no task run or file" in one_error_line(proc)
    # No store at all yet.
    proc = make_cli(tmp_path)("lineage", "x")
    assert proc.returncode == 1 and "nothing recorded yet" in one_error_line(proc)
    # ROAR_DEBUG=1 is the way to a traceback.
    proc = pipeline("lineage", "never-made.txt", env={**pipeline.env, "ROAR_DEBUG": "1"})
    assert proc.returncode == 1 and b"Traceback" in proc.stderr


def test_non_utf8_file_name(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    proc = cli("run", "--wait", "--job", "odd", "--", "bash", "-c", "printf x > $'\\xff'.txt")
    assert proc.returncode == 0, proc.stderr.decode()
    assert (cli.cwd / os.fsdecode(b"\xff.txt")).is_file()
    assert b"\\xff.txt  blake3:" in proc.stderr  # the summary escapes the byte
    run_id = cli.ok("show").splitlines()[1].split()[-1]
    assert f"{cli.cwd}/\\xff.txt  blake3:" in cli.ok("show", run_id)
    versions = cli.ok("show", b"\xff.txt")  # the path as the user's shell would pass it
    assert re.search(r"written by\s+odd\s", versions)
    g = json.loads(cli.ok("lineage", b"\xff.txt", "--json"))
    assert [r["job_name"] for r in g["runs"]] == ["odd"]


@pytest.mark.parametrize("wait", [["--wait"], []], ids=["wait", "background"])
def test_non_utf8_arguments_job_and_names_are_delivered_and_distinct(
        tmp_path: Path, wait: list[str]) -> None:
    """Bytes that are not UTF-8 in the arguments and in --job: the run is recorded and both
    its events are delivered (they were set aside as "not JSON"); a file named `caf` + E9
    and one named with the four characters `\\xe9` are two datasets, not one."""
    import orjson

    from tests.olschema import validate_event

    cli = make_cli(tmp_path)
    proc = cli("run", *wait, "--job", b"j\xe9", "--", "touch", b"caf\xe9.txt", b"caf\\xe9.txt")
    assert proc.returncode == 0, proc.stderr.decode()
    assert cli.ok("flush") in ("sent 0, pending 0\n", "sent 2, pending 0\n")
    events = Path(cli.env["ROAR_HOME"]) / "openlineage" / "events.jsonl"
    sent = [orjson.loads(line) for line in events.read_bytes().splitlines()]  # strict UTF-8
    assert [e["eventType"] for e in sent] == ["START", "COMPLETE"]
    for event in sent:
        validate_event(event)
    complete = sent[1]
    assert complete["job"]["name"] == "j\\xe9"
    names = sorted(o["name"] for o in complete["outputs"])
    assert names == [f"{cli.cwd}/caf\\\\xe9.txt", f"{cli.cwd}/caf\\xe9.txt"]
    command = complete["run"]["facets"]["roar_task"]["command"]
    assert command == ["touch", "caf\\xe9.txt", "caf\\xe9.txt"]
    assert re.search(r"j\\xe9\s+COMPLETE", cli.ok("show"))
    # Each file's own history, by the name the user's shell passes.
    assert "written by" in cli.ok("show", b"caf\xe9.txt")
    assert "written by" in cli.ok("show", b"caf\\xe9.txt")
    assert cli.ok("lineage", b"caf\xe9.txt", "--json") != cli.ok("lineage", b"caf\\xe9.txt",
                                                                  "--json")


def test_corrupt_session_log_is_not_fatal(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    # The traced command itself drops a broken log into its session directory.
    script = 'printf junk > "$ROAR_SESSION_DIR/roar-1-1.log"; echo data > out.txt'
    proc = cli("run", "--wait", "--job", "corrupt", "--", "bash", "-c", script)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"1 trace event(s) were lost" in proc.stderr
    run_id = cli.ok("show").splitlines()[1].split()[-1]
    shown = cli.ok("show", run_id)
    assert "lost      1 trace event(s)" in shown and f"{cli.cwd / 'out.txt'}  blake3:" in shown


def test_flush_sends_the_backlog(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    # Nothing listens on the discard port of loopback: the run's events stay spooled.
    down = {**cli.env, "OPENLINEAGE_URL": "http://127.0.0.1:9"}
    proc = cli("run", "--wait", "--", "true", env=down)
    assert proc.returncode == 0, proc.stderr.decode()
    proc = cli("flush", "--timeout", "0.5", env=down)
    assert proc.returncode == 1 and proc.stdout == b"sent 0, pending 2\n"
    # The spool's own warning says why (one line), then ours says what is left.
    *why, last = proc.stderr.decode().splitlines()
    assert len(why) == 1 and "unreachable" in why[0] and "Connection refused" in why[0]
    assert last.startswith("roar-core: error: 2 event(s) not delivered")
    # Back on the embedded file transport, the backlog goes out in order.
    assert cli.ok("flush") == "sent 2, pending 0\n"
    events = Path(cli.env["ROAR_HOME"]) / "openlineage" / "events.jsonl"
    kinds = [json.loads(line)["eventType"] for line in events.read_text().splitlines()]
    assert kinds == ["START", "COMPLETE"]


def _recorders_of(home: Path) -> list[int]:
    """Background recorder processes working for the roar home `home`."""
    sessions = os.fsencode(home / "sessions")
    return processes("roar_core.recording.recorder", lambda a: a == sessions)


def test_in_an_outage_background_recorders_do_not_linger(tmp_path: Path) -> None:
    """Each `run` starts a recorder when none is at work; with the backend down each used to
    wait a minute for it (a dozen alive at once): now it records, tries to send once, and
    leaves the events spooled for the next one."""
    import time

    cli = make_cli(tmp_path)
    down = {**cli.env, "OPENLINEAGE_URL": "http://127.0.0.1:9"}
    for i in range(3):
        assert cli("run", "--job", f"j{i}", "--", "true", env=down).returncode == 0
    deadline = time.monotonic() + 20
    home = Path(cli.env["ROAR_HOME"])
    while _recorders_of(home) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _recorders_of(home) == []
    assert re.search(r"^spool\s+warn\s+6 event\(s\) pending", cli("doctor", env=down)
                     .stdout.decode(), re.M)
    assert cli.ok("flush") == "sent 6, pending 0\n"  # the embedded file transport


def test_run_wait_returns_once_recorded_and_the_recorder_delivers(tmp_path: Path) -> None:
    # ~700 bytes of event per output: 1,000 outputs make a backlog nobody should wait for.
    # `--wait` returns once the home's recorder has stored the run (its summary comes from
    # the store's answer); the recorder delivers the events after.
    cli = make_cli(tmp_path)
    script = "mkdir out; for i in $(seq 1000); do echo $i > out/f$i; done"
    proc = cli("run", "--wait", "--job", "many", "--", "bash", "-c", script)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "outputs (1000):" in proc.stderr.decode()
    run_id = proc.stderr.decode().split(", run ", 1)[1].split(",", 1)[0]
    assert "many" in cli.ok("show", run_id)  # stored before `--wait` returned
    # Its 1,000 rows went in on the store's helper thread (a big task): each is the digest
    # of the bytes the command left.
    from roar_core.pipeline.store import Store

    with Store.open(home=Path(cli.env["ROAR_HOME"])) as store:
        stored = {a.uri: a.digest for a in store.accesses_of(run_id) if a.role == "output"}
    assert stored == {os.path.realpath(p): b3(p) for p in (cli.cwd / "out").iterdir()}
    assert len(stored) == 1000
    proc = cli("flush", "--timeout", "60")
    assert proc.returncode == 0 and proc.stdout.endswith(b"pending 0\n"), proc.stdout
    events = Path(cli.env["ROAR_HOME"]) / "openlineage" / "events.jsonl"
    by_kind = {e["eventType"]: e for e in map(json.loads, events.read_text().splitlines())}
    assert set(by_kind) == {"START", "COMPLETE"}
    outputs = by_kind["COMPLETE"]["outputs"]
    assert len(outputs) == 1000
    first = next(o for o in outputs if o["name"].endswith("/out/f1"))
    assert first["facets"]["version"]["datasetVersion"] == b3(cli.cwd / "out" / "f1")


# ---- in-process pieces ----------------------------------------------------------------------


def test_hash_progress_bar_appears_only_after_the_delay() -> None:
    now = [100.0]
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    bar = HashProgress(console, delay=1.0, clock=lambda: now[0])
    bar(10, 1000)
    now[0] += 0.5
    bar(20, 1000)
    assert not bar.shown and out.getvalue() == ""
    now[0] += 0.6
    bar(500, 1000)
    assert bar.shown
    bar.close()
    assert "roar-core: hashing" in out.getvalue() and "500/1000" in out.getvalue()
    # Not on a terminal: never a bar, whatever the time.
    quiet = HashProgress(Console(file=io.StringIO()), delay=0.0, clock=lambda: now[0])
    quiet(1, 10)
    assert not quiet.shown


def _graph_with_cycle() -> LineageGraph:
    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    g = LineageGraph("/d/in", "downstream")
    a = g.add_artifact(ArtifactNode("/d/in", "blake3:" + "a" * 64))
    b = g.add_artifact(ArtifactNode("/e/in", "blake3:" + "b" * 64))
    r1 = g.add_run(RunNode("00000000-0000-7000-8000-000000000001", "touch", "COMPLETE", t))
    r2 = g.add_run(RunNode("00000000-0000-7000-8000-000000000002", "cat", "FAIL", t))
    g.root = a
    # r1 reads and rewrites the same version of /d/in: a cycle a -> r1 -> a.
    g.edges |= {Edge(a, r1, "input"), Edge(r1, a, "output"), Edge(a, r2, "input"),
                Edge(r2, b, "output")}
    return g


def test_layout_and_tree_survive_cycles_and_name_clashes() -> None:
    assert cli_mod.GRAPH_FORMATS == tuple(sorted(graph_mod.FORMATS))  # kept apart on purpose
    g = _graph_with_cycle()
    lay = graph_mod.layout(g)
    assert set(lay.boxes) == set(g.artifacts) | set(g.runs)
    # Both files are named "in": their parent directory tells them apart.
    assert graph_mod.short_names({"/d/in", "/e/in", "/d/x"}) == {
        "/d/in": "d/in", "/e/in": "e/in", "/d/x": "x"}
    ET.fromstring(graph_mod.to_svg(g))
    lines = tree_lines(g, cwd=Path("/"))
    assert lines[0] == "d/in  blake3:aaaaaaaaaaaa" and len(lines) == 5
    assert any("(see above)" in line for line in lines)


def test_a_shell_script_run_is_named_by_its_first_command(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    (cli.cwd / "raw.csv").write_text("1\n3\n2\n")
    names = []
    for argv in (["sh", "-c", "sort -rn raw.csv > clean.csv"],
                 ["bash", "-euc", "LC_ALL=C /usr/bin/wc -l clean.csv; echo done"]):
        proc = cli("run", "--", *argv)
        assert proc.returncode == 0, proc.stderr.decode()
        names.append(proc.stderr.decode().split("job ", 1)[1].split(", run ")[0])
    assert names == ["sort -rn raw.csv", "wc -l clean.csv"]
    proc = cli("run", "--job", "mine", "--", "sh", "-c", "cat raw.csv > /dev/null")
    assert "job mine, run " in proc.stderr.decode()  # --job still wins
    listed = cli.ok("show")
    assert "sort -rn raw.csv" in listed and "wc -l clean.csv" in listed and "mine" in listed


def test_a_running_recorder_records_each_run_with_the_configuration_it_was_made_with(
        tmp_path: Path) -> None:
    """The home's recorder outlives a run (it waits for the next); a run made with another
    configuration (here `file_host`, the namespace of its files' datasets) rewrites the
    recorder's settings, and the running recorder records it with them, not with those of
    the run that started it."""
    import time

    cli = make_cli(tmp_path)
    home = Path(cli.env["ROAR_HOME"])
    events = home / "openlineage" / "events.jsonl"
    (cli.cwd / "a.txt").write_text("a\n")

    def outputs() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        if events.exists():
            for e in map(json.loads, events.read_text().splitlines()):
                if e["eventType"] == "COMPLETE":
                    out[e["job"]["name"]] = [d["namespace"] for d in e["outputs"]]
        return out

    assert cli("run", "--job", "first", "--", "cp", "a.txt", "b.txt").returncode == 0
    # A run still going keeps the recorder there (its producer is alive).
    long = subprocess.Popen([ROAR, "run", "--job", "long", "--", "sleep", "4"], cwd=cli.cwd,
                            env=cli.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while "first" not in outputs():
        assert time.monotonic() < deadline, "the first run was not recorded"
        time.sleep(0.05)
    running = _recorders_of(home)
    assert running, "no recorder running: the case this test is about"
    other = cli("run", "--job", "second", "--", "cp", "b.txt", "c.txt",
                env={**cli.env, "ROAR_FILE_HOST": "elsewhere"})
    assert other.returncode == 0
    assert long.wait(timeout=30) == 0
    deadline = time.monotonic() + 30
    while _recorders_of(home) and time.monotonic() < deadline:
        time.sleep(0.1)
    got = outputs()
    assert running[0] not in _recorders_of(home)
    assert got["first"] == ["file"] and got["second"] == ["file://elsewhere"], got


def test_runs_an_older_roar_core_left_pending_are_recorded_after_an_upgrade(
        tmp_path: Path) -> None:
    """Before the task log, `roar-core run` left each run as a session of its own
    (`runner.json`, `task.json`, the tracer's logs) for a background recorder: a run still
    pending when roar-core is upgraded is recorded by the next command that reads lineage,
    with the version of its output the command left."""
    from roar_core import config
    from roar_core.pipeline import tracer
    from roar_core.recording.sessions import run_traced

    if not tracer.status().usable:
        pytest.skip(tracer.status().reason)
    cli = make_cli(tmp_path)
    cfg = config.load(cwd=cli.cwd, env=cli.env)
    (cli.cwd / "in.txt").write_text("old\n")
    session = Path(cfg.sessions_dir) / "run-0123456789abcdef"
    session.mkdir(parents=True)
    run_id = "0190c000-0000-7000-8000-000000000001"
    argv = ["cp", "in.txt", "out.txt"]
    assert run_traced(argv, session, run_id, cwd=cli.cwd) == 0
    (session / "runner.json").write_text(json.dumps({
        "run_id": run_id, "job_name": "old", "argv": argv, "cwd": str(cli.cwd),
        "started_at": "2026-11-20T10:00:00+00:00", "pid": 999999999,
        "host": socket.gethostname(), "traced": True, "untraced_reason": None}))
    (session / "task.json").write_text(json.dumps(
        {"ended_at": "2026-11-20T10:00:01+00:00", "returncode": 0}))

    listing = cli.ok("show")
    (line,) = [x for x in listing.splitlines() if run_id in x]
    assert " old " in line and "COMPLETE" in line, listing
    assert f"{cli.cwd / 'out.txt'}  {b3(cli.cwd / 'out.txt')}" in cli.ok("show", run_id)
    assert not session.exists()  # recorded: its session went with it


def test_a_mistyped_option_is_a_one_line_usage_error_and_runs_nothing(tmp_path: Path) -> None:
    """`run --jb x -- cp …` used to run `--jb` as the command (and store that run);
    usage errors were click's three lines."""
    cli = make_cli(tmp_path)
    (cli.cwd / "a.txt").write_text("a\n")
    proc = cli("run", "--jb", "x", "--", "cp", "a.txt", "b.txt")
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert "'--jb'" in line and "--job" in line and "roar-core run --help" in line
    assert not (cli.cwd / "b.txt").exists()
    assert "no task runs recorded yet" in cli.ok("show")
    for args in (("show", "--limt", "3"), ("lineage",), ("nosuchcommand",),
                 ("graph", "a.txt", "--format", "png")):
        proc = cli(*args)
        assert proc.returncode == 2, args
        one_error_line(proc)
    # The command's own options stay the command's.
    assert cli("run", "cp", "-p", "a.txt", "c.txt").returncode == 0
    assert (cli.cwd / "c.txt").read_text() == "a\n"


def test_a_roar_variable_of_the_users_own_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    proc = cli("run", "--", "true", env={**cli.env, "ROAR_MY_OWN_THING": "1"})
    assert proc.returncode == 0, proc.stderr
    assert b"roar: warning: ROAR_MY_OWN_THING is not a roar setting, ignored" in proc.stderr


def test_exec_starts_one_engine_process_with_roar_attached(tmp_path: Path) -> None:
    """`eval "$(roar-core env airflow)"` preloaded the tracer into the whole interactive
    shell; `exec` attaches it to the one command (the engine named by it or by --engine),
    which then is that process: its status, its output."""
    cli = make_cli(tmp_path)
    script = 'echo "$LD_PRELOAD|$ROAR_SESSION_DIR|${ROAR_TASK_TAG-unset}|$$"; exit 5'
    proc = cli("exec", "--engine", "airflow", "--", "sh", "-c", script,
               env={**cli.env, "ROAR_TASK_TAG": "stale"})
    assert proc.returncode == 5, proc.stderr
    preload, session, tag, _ = proc.stdout.decode().strip().split("|")
    assert preload.endswith("libroar_preload.so") and Path(session).is_dir()
    assert tag == "unset"
    proc = cli("exec", "--engine", "ray", "--", "sh", "-c", "echo $RAY_RUNTIME_ENV_PLUGINS")
    assert proc.returncode == 0 and b"roar_ray.RoarPlugin" in proc.stdout
    assert "cannot tell which engine 'sh' is" in one_error_line(cli("exec", "--", "sh", "-c",
                                                                    "true"))
    assert cli("exec", "--engine", "ray", "--", "no-such-program-here").returncode == 127
    # The engine starts as from a shell: not with the SIGPIPE and SIGXFSZ Python ignores.
    show = ["sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"]
    plain = subprocess.run(show, cwd=cli.cwd, env=cli.env, capture_output=True)
    assert cli.ok("exec", "--engine", "ray", "--", *show).encode() == plain.stdout


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("ROAR_TEST_REQUIRE_CHROMIUM") == "1":
        pytest.fail("Chromium required (ROAR_TEST_REQUIRE_CHROMIUM=1) but not installed")
    pytest.skip("no chromium here (Debian: apt install chromium)")


MEASURE = """<script>
const f = document.querySelector(".node.focus").getBoundingClientRect();
document.body.dataset.m = JSON.stringify({page: document.documentElement.scrollWidth,
  vw: innerWidth, vh: innerHeight, l: f.left, r: f.right, t: f.top, b: f.bottom});
</script>"""


def test_the_html_graph_of_a_six_step_chain_fits_a_1280_px_screen(tmp_path: Path) -> None:
    """A chain was laid out in one row (1,790 px for 4 steps), cutting off the file the
    page is about.  Rendered by a real browser: no horizontal scrolling at 1,280 px, and
    the focus file within the first screen."""
    chromium = _chromium()
    cli = make_cli(tmp_path)
    (cli.cwd / "step0.csv").write_text("".join(f"{i}\n" for i in range(50)))
    for i in range(1, 7):
        proc = cli("run", "--wait", "--job", f"transform-{i}", "--", "sh", "-c",
                   f"sort -rn step{i - 1}.csv | head -n {50 - i} > step{i}.csv")
        assert proc.returncode == 0, proc.stderr
    cli.ok("graph", "step6.csv", "--format", "html", "-o", "lineage.html")
    page = (cli.cwd / "lineage.html").read_text()
    assert page.count('class="node run') == 6
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", MEASURE + "</body>"))
    dom = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'chromium'}",
         "--window-size=1280,800", "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=120)
    found = re.search(r'data-m="([^"]*)"', dom.stdout)
    assert found, dom.stderr[-2000:]
    m = json.loads(html.unescape(found.group(1)))
    assert m["vw"] == 1280 and m["page"] <= 1280, m
    assert 0 <= m["l"] < m["r"] <= 1280 and 0 <= m["t"] < m["b"] <= m["vh"], m


def test_a_long_chain_wraps_into_bands_within_the_width() -> None:
    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    g = LineageGraph("/w/f20", "upstream")
    prev = g.add_artifact(ArtifactNode("/w/f0", "blake3:" + "0" * 64))
    for i in range(1, 21):
        r = g.add_run(RunNode(f"00000000-0000-7000-8000-{i:012d}", f"step-{i}", "COMPLETE", t))
        f = g.add_artifact(ArtifactNode(f"/w/f{i}", "blake3:" + f"{i:x}" * 64))
        g.edges |= {Edge(prev, r, "input"), Edge(r, f, "output")}
        prev = f
    g.root = prev
    lay = graph_mod.layout(g)
    assert lay.width <= 1180 and len(set(lay.band.values())) > 1
    ET.fromstring(graph_mod.to_svg(g))


@pytest.mark.parametrize("deleted", [7, 0])
def test_the_summary_lists_the_first_files_and_counts_and_the_events_carry_all(
        tmp_path: Path, deleted: int) -> None:
    """`run --wait` lists five files of each kind and how many there are (its short
    answer); the COMPLETE event still carries every output, each with the digest of the
    bytes the command left, and every deleted file.  Truth: what the command did."""
    from tests.olschema import validate_event

    cli = make_cli(tmp_path)
    for i in range(deleted):
        (cli.cwd / f"old_{i}").write_text(f"old {i}\n")
    script = "for i in $(seq 0 7); do echo new $i > new_$i; done; rm -f old_*"
    proc = cli("run", "--wait", "--", "bash", "-c", script)
    assert proc.returncode == 0, proc.stderr.decode()
    summary = proc.stderr.decode()
    made = {f"new_{i}": b3(cli.cwd / f"new_{i}") for i in range(8)}
    listed = re.findall(r"^    (new_\d)  (blake3:[0-9a-f]+)$", summary, re.M)
    assert "outputs (8):" in summary and "    ... and 3 more" in summary, summary
    assert len(listed) == 5 and all(made[n].startswith(d) for n, d in listed), summary
    gone = re.findall(r"^    (old_\d)  \(no digest\)$", summary, re.M)
    if deleted:
        assert f"deleted ({deleted}):" in summary and "    ... and 2 more" in summary, summary
        assert len(gone) == 5 and len(set(gone)) == 5, summary
    else:
        assert "deleted" not in summary and not gone, summary

    assert cli.ok("flush") in ("sent 0, pending 0\n", "sent 2, pending 0\n")
    events = Path(cli.env["ROAR_HOME"]) / "openlineage" / "events.jsonl"
    complete = [e for e in map(json.loads, events.read_text().splitlines())
                if e["eventType"] == "COMPLETE"]
    assert len(complete) == 1
    validate_event(complete[0])
    outputs = {Path(o["name"]).name: o["facets"] for o in complete[0]["outputs"]}
    assert {n: f["contentHash"]["digest"] for n, f in outputs.items()
            if n.startswith("new_")} == {n: d.removeprefix("blake3:") for n, d in made.items()}
    assert {n for n, f in outputs.items()
            if f.get("lifecycleStateChange", {}).get("lifecycleStateChange") == "DROP"
            } == {f"old_{i}" for i in range(deleted)}
