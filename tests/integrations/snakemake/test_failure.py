"""A failing job emits FAIL with the outputs it had written (hashed before Snakemake deletes
them) and fails the workflow run; after the fix, the rerun's lineage joins the outputs of
the earlier run by content hash."""

from __future__ import annotations

import textwrap

import blake3

SNAKEFILE = textwrap.dedent('''
    rule all:
        input: "b.txt"

    rule a:
        input: "in.txt"
        output: "a.txt"
        shell: "tr a-z A-Z < {input} > {output}"

    rule b:
        input: "a.txt"
        output: "b.txt", "b.log"
        shell: "echo started > {output[1]}; cat {input} > {output[0]}; BROKEN"
''')


def test_failed_job_then_fixed_rerun(tmp_path, smk, lineage):
    wd = tmp_path.resolve()
    (wd / "Snakefile").write_text(SNAKEFILE)
    (wd / "in.txt").write_text("hello\n")
    home = wd / ".roar-home"

    failed = smk(wd, "-j2", ok=False)
    assert "roar: lineage of 2 job(s) recorded" in failed.stderr
    lin = lineage(home)
    wf = lin.workflow_events()
    assert [e["eventType"] for e in wf] == ["START", "FAIL"]
    assert "1 job(s) failed" in wf[1]["run"]["facets"]["errorMessage"]["message"]
    (a_done,) = lin.terminal(f"{wd.name}.a")
    (b_fail,) = lin.terminal(f"{wd.name}.b")
    assert a_done["eventType"] == "COMPLETE"
    assert b_fail["eventType"] == "FAIL"
    assert b_fail["run"]["facets"]["roar_task"]["command"][0].endswith("bash")
    assert "exit status 127" in b_fail["run"]["facets"]["errorMessage"]["message"]
    # Partial outputs, as they were when the job failed (Snakemake deleted them since).
    partial = {d["name"]: d for d in b_fail["outputs"]}
    assert set(partial) == {str(wd / "b.txt"), str(wd / "b.log")}
    assert not (wd / "b.txt").exists()
    assert partial[str(wd / "b.log")]["facets"]["version"]["datasetVersion"] == (
        "blake3:" + blake3.blake3(b"started\n").hexdigest())
    a_txt = a_done["outputs"][0]
    assert a_txt["name"] == str(wd / "a.txt")
    store = lin.store()
    failed_run = store.task_run(b_fail["run"]["runId"])
    assert (failed_run.status, failed_run.exit_code) == ("FAIL", 127)

    # Fix the rule and run again: only b runs; it reads a.txt made by the first run.
    (wd / "Snakefile").write_text(SNAKEFILE.replace("; BROKEN", ""))
    smk(wd, "-j2")
    lin = lineage(home)
    wf_runs = [e for e in lin.workflow_events() if e["eventType"] == "START"]
    assert len(wf_runs) == 2
    b_runs = lin.terminal(f"{wd.name}.b")
    assert [e["eventType"] for e in b_runs] == ["FAIL", "COMPLETE"]
    b_ok = b_runs[1]
    assert b_ok["run"]["facets"]["parent"]["run"]["runId"] == wf_runs[1]["run"]["runId"]
    (a_in,) = b_ok["inputs"]
    assert a_in["name"] == str(wd / "a.txt")
    assert a_in["facets"]["version"] == a_txt["facets"]["version"]  # same content
    graph = lin.store().lineage(str(wd / "b.txt"), "upstream")
    runs = {r.run_id: r for r in graph.runs.values()}
    assert a_done["run"]["runId"] in runs  # joined to the first invocation's producer
    assert b_ok["run"]["runId"] in runs
    assert b_fail["run"]["runId"] not in runs
