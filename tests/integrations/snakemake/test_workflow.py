"""A 6-rule workflow run with `--executor roar -j2`: shell, script, run:, wildcards, temp(),
directory(), a checkpoint and a shadow rule.  Every job's observed files are its declared
files, plus one undeclared read (`cat ref.txt`) that the roar_io facet and the end-of-run
summary report; digests are the files' blake3; every task hangs under the workflow run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import blake3
import pytest

SNAKEFILE = textwrap.dedent('''
    SAMPLES = ["A", "B"]

    rule all:
        input: "final.txt"

    rule make:                      # shell, wildcards, temp(), an undeclared read
        input: "samples.txt"
        output: temp("raw/{s}.txt")
        params: tag="p-{s}"
        threads: 1
        resources: mem_mb=10
        shell: "cat {input} ref.txt > {output}; echo {wildcards.s} >> {output}"

    rule upper:                     # script:
        input: "raw/{s}.txt"
        output: "up/{s}.txt"
        script: "scripts/upper.py"

    rule joined:                    # run: (Snakemake spawns it as a subprocess)
        input: expand("up/{s}.txt", s=SAMPLES)
        output: "joined.txt"
        run:
            with open(output[0], "w") as out:
                for path in input:
                    with open(path) as f:
                        out.write(f.read())

    rule shadowed:                  # shadow: runs in .snakemake/shadow/<tmp>/
        input: "joined.txt"
        output: "counted.txt"
        shadow: "minimal"
        shell: "cp {input} scratch.txt; wc -l < scratch.txt > {output}"

    checkpoint split:               # checkpoint, directory()
        input: "counted.txt"
        output: directory("parts")
        shell: "mkdir -p {output}; cat {input} > {output}/p1.txt; echo two > {output}/p2.txt"

    def parts(wildcards):
        d = checkpoints.split.get().output[0]
        return expand("parts/{p}.txt", p=sorted(glob_wildcards(d + "/{p}.txt").p))

    rule final:
        input: parts
        output: "final.txt"
        shell: "cat {input} > {output}"
''')

UPPER = """\
with open(snakemake.input[0]) as f, open(snakemake.output[0], "w") as g:
    g.write(f.read().upper())
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory, smk, lineage):
    """Run the workflow once for all tests of this module."""
    wd = tmp_path_factory.mktemp("wf")
    (wd / "Snakefile").write_text(SNAKEFILE)
    (wd / "scripts").mkdir()
    (wd / "scripts" / "upper.py").write_text(UPPER)
    (wd / "samples.txt").write_text("s1\ns2\n")
    (wd / "ref.txt").write_text("reference\n")
    done = smk(wd, "-j2", "--roar-workflow-name", "wf6")
    return wd.resolve(), done, lineage(wd / ".roar-home")


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _names(datasets: list[dict]) -> set[str]:
    return {d["name"] for d in datasets}


def _digest(d: dict) -> str:
    return d["facets"]["version"]["datasetVersion"].removeprefix("blake3:")


def test_one_run_per_job_under_the_workflow_run(run):
    wd, _done, lin = run
    wf = lin.workflow_events()
    assert [e["eventType"] for e in wf] == ["START", "COMPLETE"]
    wf_run = wf[0]["run"]["runId"]
    assert wf[0]["job"]["name"] == "wf6"
    for e in wf:  # the workflow run names its engine too
        assert e["run"]["facets"]["processing_engine"]["name"] == "snakemake"
    done = lin.terminal()
    names = sorted(e["job"]["name"] for e in done)
    assert names == sorted(["wf6.make", "wf6.make", "wf6.upper", "wf6.upper", "wf6.joined",
                            "wf6.shadowed", "wf6.split", "wf6.final"])
    for e in done:
        assert e["eventType"] == "COMPLETE"
        parent = e["run"]["facets"]["parent"]
        assert parent["run"]["runId"] == wf_run
        assert (parent["job"]["namespace"], parent["job"]["name"]) == (
            wf[0]["job"]["namespace"], "wf6")
        assert parent["root"]["run"]["runId"] == wf_run
        task = e["run"]["facets"]["roar_task"]
        assert task["engine"] == "snakemake" and task["traced"] is True
        assert task["droppedEvents"] == 0
        assert e["run"]["facets"]["processing_engine"]["name"] == "snakemake"
    starts = [e for e in lin.events if e["eventType"] == "START" and "roar_task" in
              e["run"]["facets"]]
    assert {e["run"]["runId"] for e in starts} == {e["run"]["runId"] for e in done}


def test_observed_io_is_declared_io_plus_the_undeclared_read(run):
    wd, _done, lin = run
    ref = str(wd / "ref.txt")
    for e in lin.terminal():
        sm = e["run"]["facets"]["roar_snakemake"]
        io = e["run"]["facets"]["roar_io"]
        ins, outs = _names(e["inputs"]), _names(e["outputs"])
        expected_reads = {ref} if sm["rule"] == "make" else set()
        assert io["undeclaredReads"] == sorted(expected_reads), sm["rule"]
        assert io["undeclaredWrites"] == [], sm["rule"]
        assert io["declaredUntouched"] == [], sm["rule"]
        assert ins - expected_reads == set(sm["input"]), sm["rule"]
        # directory() outputs are observed as the files written inside them
        assert all(_under(o, sm["output"]) for o in outs), sm["rule"]
        assert all(any(_under(o, [d]) for o in outs) for d in sm["output"]), sm["rule"]


def test_run_facets_carry_the_job_as_declared(run):
    wd, _done, lin = run
    by_rule = {}
    for e in lin.terminal():
        sm = e["run"]["facets"]["roar_snakemake"]
        by_rule.setdefault(sm["rule"], []).append(sm)
    make = sorted(by_rule["make"], key=lambda s: s["wildcards"]["s"])
    assert [m["wildcards"] for m in make] == [{"s": "A"}, {"s": "B"}]
    assert make[0]["params"] == {"tag": "p-A"}
    assert make[0]["threads"] == 1 and make[0]["resources"]["mem_mb"] == 10
    assert make[0]["kind"] == "shell"
    assert make[0]["flags"] == {str(wd / "raw" / "A.txt"): ["temp"]}
    assert by_rule["upper"][0]["kind"] == "script"
    assert by_rule["joined"][0]["kind"] == "run"
    assert by_rule["shadowed"][0]["shadow"] == "minimal"
    split = by_rule["split"][0]
    assert split["checkpoint"] is True
    assert split["flags"] == {str(wd / "parts"): ["directory"]}


def test_digests_are_the_files_content(run):
    wd, _done, lin = run
    for e in lin.terminal():
        for d in e["outputs"]:
            path = Path(d["name"])
            if path.parent.name == "raw":  # temp(): deleted once `upper` had read it
                assert not path.exists()
                s = path.stem
                data = b"s1\ns2\nreference\n" + f"{s}\n".encode()
            else:
                data = path.read_bytes()
            assert _digest(d) == blake3.blake3(data).hexdigest(), d["name"]
            assert d["facets"]["contentHash"]["size"] == len(data)
        for d in e["inputs"]:  # the version read is the version its producer wrote
            producer = [o for x in lin.terminal() for o in x["outputs"] if o["name"] == d["name"]]
            if producer:
                assert _digest(d) == _digest(producer[0])


def test_store_has_the_same_lineage_and_the_code(run):
    wd, _done, lin = run
    store = lin.store()
    wf_run = lin.workflow_events()[0]["run"]["runId"]
    assert store.workflow_run(wf_run).status == "COMPLETE"
    tasks = store.task_runs(workflow_run_id=wf_run)
    assert len(tasks) == 8
    events = {e["run"]["runId"]: e for e in lin.terminal()}
    for t in tasks:
        assert t.status == "COMPLETE"
        acc = store.accesses_of(t.run_id)
        e = events[t.run_id]
        assert {a.uri for a in acc if a.role == "input"} == _names(e["inputs"])
        assert {a.uri for a in acc if a.role == "output"} == _names(e["outputs"])
        code = {c.path for c in t.code}
        if t.job_name == "wf6.upper":  # the script itself, not Snakemake's copy of it
            assert code == {str(wd / "scripts" / "upper.py")}
        if t.job_name == "wf6.joined":  # a spawned run: block: the Snakefile is its code
            assert str(wd / "Snakefile") in code
    # final.txt's ancestry reaches back to samples.txt through every rule
    graph = store.lineage(str(wd / "final.txt"), "upstream")
    jobs = {r.job_name for r in graph.runs.values()}
    assert jobs == {"wf6.final", "wf6.split", "wf6.shadowed", "wf6.joined", "wf6.upper",
                    "wf6.make"}


def test_summary_lists_the_undeclared_read(run):
    wd, done, _lin = run
    err = done.stderr
    assert "roar: lineage of 8 job(s) recorded under workflow run wf6" in err, err[-4000:]
    lines = [ln for ln in err.splitlines() if "undeclared reads:" in ln]
    assert len(lines) == 2 and all("rule make" in ln for ln in lines)
    assert all(ln.endswith(str(wd / "ref.txt")) for ln in lines)


def test_temp_inputs_keep_the_version_their_consumer_read(run):
    """temp() files are deleted once their consumers are done, before roar records those
    consumers: the version each read is the one its producer left, found by the state the
    tracer saw at open, and `roar-core lineage` goes through it."""
    wd, _done, lin = run
    uppers = lin.terminal("wf6.upper")
    assert len(uppers) == 2
    for e in uppers:
        (d,) = e["inputs"]
        path = Path(d["name"])
        assert path.parent.name == "raw" and not path.exists()
        data = b"s1\ns2\nreference\n" + f"{path.stem}\n".encode()
        assert _digest(d) == blake3.blake3(data).hexdigest(), d
        assert "roar_unknownVersion" not in d["facets"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROAR_", "OPENLINEAGE"))}
    env["ROAR_HOME"] = str(wd / ".roar-home")
    out = subprocess.run([str(Path(sys.executable).parent / "roar-core"), "lineage",
                          str(wd / "up" / "A.txt")], cwd=wd, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "run wf6.make  COMPLETE" in out.stdout and "samples.txt" in out.stdout
