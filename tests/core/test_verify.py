"""`roar-core verify` against what the test did to the files: a three-step pipeline of
`roar-core run`s, then an input edited in place, a file deleted, the pipeline run again."""

from __future__ import annotations

import json

import blake3

from tests.core.test_cli import Cli, make_cli
from tests.core.test_exact_lineage import run


def b3(data: bytes) -> str:
    return "blake3:" + blake3.blake3(data).hexdigest()


def pipeline(cli: Cli) -> list[str]:
    return [run(cli, "clean", "tr a-z A-Z < raw.csv > clean.csv", wait=True),
            run(cli, "count", "wc -l < clean.csv > count.txt", wait=True),
            run(cli, "report", "cat count.txt clean.csv > report.txt", wait=True)]


def report(cli: Cli, *args: str) -> tuple[int, dict]:
    proc = cli("verify", "--json", *args)
    assert proc.returncode in (0, 1), proc.stderr.decode()
    return proc.returncode, json.loads(proc.stdout)


def test_verify_finds_changed_inputs_and_stale_outputs(tmp_path) -> None:
    cli = make_cli(tmp_path)
    raw = b"a,1\nb,2\n"
    (cli.cwd / "raw.csv").write_bytes(raw)
    runs = pipeline(cli)
    w = cli.cwd.resolve()

    rc, rep = report(cli, "report.txt")
    assert rc == 0 and rep["ok"]
    assert {c["uri"]: c["status"] for c in rep["checked"]} == {
        str(w / f): "ok" for f in ("raw.csv", "clean.csv", "count.txt", "report.txt")}
    assert {c["uri"]: c["recorded"] for c in rep["checked"]}[str(w / "raw.csv")] == b3(raw)
    assert cli("verify", "report.txt").returncode == 0

    (cli.cwd / "raw.csv").write_bytes(raw + b"c,3\n")  # edited in place after the runs
    rc, rep = report(cli, "report.txt")
    assert rc == 1 and not rep["ok"]
    by = {c["uri"]: c for c in rep["checked"]}
    assert by[str(w / "raw.csv")]["status"] == "changed"
    assert by[str(w / "raw.csv")]["now"] == b3(raw + b"c,3\n")
    assert {s["uri"]: s["run_id"] for s in rep["stale"]} == {
        str(w / "clean.csv"): runs[0], str(w / "count.txt"): runs[1],
        str(w / "report.txt"): runs[2]}
    assert all(s["because"] == [str(w / "raw.csv")] for s in rep["stale"])
    text = cli("verify", "report.txt")
    assert text.returncode == 1 and b"CHANGED" in text.stdout and b"stale" in text.stdout
    # A run is checked on its own files: the second step's input and output still hold.
    rc, rep = report(cli, runs[1])
    assert rc == 0 and {c["status"] for c in rep["checked"]} == {"ok"}

    (cli.cwd / "count.txt").unlink()
    rc, rep = report(cli, "report.txt")
    assert rc == 1
    assert {c["uri"]: c["status"] for c in rep["checked"]}[str(w / "count.txt")] == "missing"

    pipeline(cli)  # made again from what is there now: true again
    rc, rep = report(cli, "report.txt")
    assert rc == 0 and rep["stale"] == []
    assert cli("verify", "nothing-here.txt").returncode == 2  # 1 would mean "not true"
