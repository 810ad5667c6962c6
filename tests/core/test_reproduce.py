"""`roar-core reproduce` of a three-step pipeline of `roar-core run`s: the plan in order,
re-executed in a scratch directory with identical digests (blake3 of the files made there,
computed here); a step that is not deterministic comes out different; a changed source
is refused."""

from __future__ import annotations

import json
from pathlib import Path

import blake3

from tests.core.test_cli import make_cli
from tests.core.test_exact_lineage import run


def b3(path: Path) -> str:
    return "blake3:" + blake3.blake3(path.read_bytes()).hexdigest()


def test_reproduce_plans_and_reruns_a_pipeline(tmp_path) -> None:
    cli = make_cli(tmp_path)
    w = cli.cwd.resolve()
    (cli.cwd / "raw.csv").write_text("b,2\na,1\nc,3\n")
    runs = [run(cli, "sort", "sort raw.csv > sorted.csv", wait=True),
            run(cli, "upper", "tr a-z A-Z < sorted.csv > upper.csv", wait=True),
            run(cli, "report", "wc -l upper.csv sorted.csv > report.txt", wait=True)]

    plan = json.loads(cli.ok("reproduce", "--json", "report.txt"))
    assert [s["run_id"] for s in plan["steps"]] == runs  # producers first
    assert all(s["cwd"] == str(w) and s["engine"] == "cli" for s in plan["steps"])
    assert plan["steps"][0]["command"] == ["sh", "-c", "sort raw.csv > sorted.csv"]
    assert [(c["uri"], c["status"]) for c in plan["sources"]] == [(str(w / "raw.csv"), "ok")]

    scratch = tmp_path / "again"
    proc = cli("reproduce", "--run", "--json", "--scratch", str(scratch), "report.txt")
    assert proc.returncode == 0, proc.stderr.decode()
    outcome = {o["uri"]: o for o in json.loads(proc.stdout)["outcome"]}
    for name in ("sorted.csv", "upper.csv", "report.txt"):
        made = scratch / name
        assert outcome[str(w / name)]["again"] == b3(made) == b3(cli.cwd / name)
        assert outcome[str(w / name)]["identical"]

    # A step whose output is not a function of its inputs.
    run(cli, "stamp", "cat report.txt > stamped.txt; date +%N >> stamped.txt", wait=True)
    again = cli("reproduce", "--run", "--scratch", str(tmp_path / "again2"), "stamped.txt")
    assert again.returncode == 1
    assert b"DIFFERS" in again.stdout and b"3 of 4 output(s) identical" in again.stdout

    (cli.cwd / "raw.csv").write_text("changed\n")
    text = cli.ok("reproduce", "report.txt")
    assert "[CHANGED]" in text
    refused = cli("reproduce", "--run", "--scratch", str(tmp_path / "again3"), "report.txt")
    assert refused.returncode == 1 and b"no longer holds" in refused.stderr
