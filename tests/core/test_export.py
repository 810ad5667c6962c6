"""`roar-core export` of a `roar-core run` pipeline: the RO-Crate passes rocrate-validator
with the Process Run Crate profile (offline, tests/rocrate_offline.py) and holds one
CreateAction per run with the files' blake3 (of the bytes, computed here); the PROV-JSON
parses with the `prov` package and says which run used and generated which version."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import blake3

from tests.core.test_cli import make_cli
from tests.core.test_exact_lineage import run

HERE = Path(__file__).resolve().parents[1]


def b3(path: Path) -> str:
    return "blake3:" + blake3.blake3(path.read_bytes()).hexdigest()


def validate_crate(crate: Path) -> dict:
    report = crate.parent / "validation.json"
    # As a module from the repository root: run as a script, tests/ would come first on
    # sys.path and tests/packaging would hide the `packaging` library.
    out = subprocess.run([sys.executable, "-m", "tests.rocrate_offline", "validate",
                          "-p", "process-run-crate-0.5", "--no-paging", "--output-format",
                          "json", "--output-file", str(report), str(crate)],
                         cwd=HERE.parent, capture_output=True, text=True, timeout=300)
    assert report.exists(), out.stdout + out.stderr
    return json.loads(report.read_text())


def test_export_ro_crate_and_prov(tmp_path) -> None:
    cli = make_cli(tmp_path)
    w = cli.cwd.resolve()
    (cli.cwd / "raw.csv").write_text("b,2\na,1\n")
    runs = [run(cli, "sort", "sort raw.csv > sorted.csv", wait=True),
            run(cli, "report", "wc -l sorted.csv > report.txt", wait=True)]
    truth = {str(w / n): b3(cli.cwd / n) for n in ("raw.csv", "sorted.csv", "report.txt")}

    cli.ok("export", "report.txt", "--format", "ro-crate", "-o", str(tmp_path / "crate"))
    report = validate_crate(tmp_path / "crate")
    assert report["passed"], report["issues"]
    graph = json.loads((tmp_path / "crate" / "ro-crate-metadata.json").read_text())["@graph"]
    by_id = {e["@id"]: e for e in graph}
    actions = [e for e in graph if e["@type"] == "CreateAction"]
    assert sorted(a["identifier"] for a in actions) == sorted(runs)

    def files(ref) -> dict:
        refs = ref if isinstance(ref, list) else [ref]
        return {by_id[r["@id"]]["@id"].removeprefix("file://"): by_id[r["@id"]]["identifier"]
                for r in refs}

    sort = next(a for a in actions if a["identifier"] == runs[0])
    assert files(sort["object"]) == {str(w / "raw.csv"): truth[str(w / "raw.csv")]}
    assert files(sort["result"]) == {str(w / "sorted.csv"): truth[str(w / "sorted.csv")]}
    assert sort["actionStatus"]["@id"] == "http://schema.org/CompletedActionStatus"
    assert by_id[sort["instrument"]["@id"]]["@type"] == "SoftwareApplication"

    cli.ok("export", runs[1], "--format", "prov", "-o", str(tmp_path / "prov.json"))
    import prov

    doc = prov.read(str(tmp_path / "prov.json"), format="json")
    records = list(doc.get_records())
    acts = [r for r in records if r.get_type().localpart == "Activity"]
    assert [a.identifier.localpart for a in acts] == [runs[1]]
    located = {str(e.identifier): str(next(iter(e.get_attribute("prov:location"))))
               for e in records if e.get_type().localpart == "Entity"}
    used = {located[str(r.get_attribute("prov:entity").pop())]
            for r in records if r.get_type().localpart == "Usage"}
    made = {located[str(r.get_attribute("prov:entity").pop())]
            for r in records if r.get_type().localpart == "Generation"}
    assert used == {"file://" + str(w / "sorted.csv")}
    assert made == {"file://" + str(w / "report.txt")}
    digests = {str(next(iter(e.get_attribute("roar:digest"))))
               for e in records if e.get_type().localpart == "Entity"}
    assert digests == {truth[str(w / "sorted.csv")], truth[str(w / "report.txt")]}
