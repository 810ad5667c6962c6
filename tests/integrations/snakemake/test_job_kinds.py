"""More job kinds: touch() (made by Snakemake, taken from the job), protected(), log:, a
local wrapper (its script recorded as code), a pipe() group; and untraced runs, which say so."""

from __future__ import annotations

import textwrap

SNAKEFILE = textwrap.dedent('''
    rule all:
        input: "done.flag", "prot.txt", "y.txt", "w.txt"

    rule flag:
        input: "in.txt"
        output: touch("done.flag"), protected("prot.txt")
        log: "logs/flag.log"
        shell: "cat {input} > {output[1]}; echo ok > {log}"

    rule p1:
        input: "in.txt"
        output: pipe("x.pipe")
        shell: "cat {input} > {output}"

    rule p2:
        input: "x.pipe"
        output: "y.txt"
        shell: "cat {input} > {output}"

    rule wrap:
        input: "in.txt"
        output: "w.txt"
        wrapper: "mywrap"
''')

WRAPPER = """\
from snakemake.shell import shell
shell("wc -c < {snakemake.input} > {snakemake.output}")
"""


def _workflow(wd):
    (wd / "Snakefile").write_text(SNAKEFILE)
    (wd / "in.txt").write_text("data\n")
    w = wd / "wrappers" / "mywrap"
    w.mkdir(parents=True)
    (w / "wrapper.py").write_text(WRAPPER)
    (w / "environment.yaml").write_text("channels: []\ndependencies: []\n")


def test_touch_protected_log_wrapper_and_pipe_group(tmp_path, smk, lineage):
    wd = tmp_path.resolve()
    _workflow(wd)
    done = smk(wd, "-j3", "--wrapper-prefix", f"file://{wd}/wrappers/")
    assert "every job read and wrote only its declared files" in done.stderr
    lin = lineage(wd / ".roar-home")
    by_rule = {e["run"]["facets"]["roar_snakemake"]["rule"]: e for e in lin.terminal()}
    assert set(by_rule) == {"flag", "p1", "p2", "wrap"}
    for e in by_rule.values():
        assert e["eventType"] == "COMPLETE"
        io = e["run"]["facets"]["roar_io"]
        assert io == {**io, "undeclaredReads": [], "undeclaredWrites": [],
                      "declaredUntouched": []}
    flag = {d["name"]: d for d in by_rule["flag"]["outputs"]}
    # touch() is Snakemake's write, taken from the job object; the log is the job's.
    assert set(flag) == {str(wd / "done.flag"), str(wd / "prot.txt"), str(wd / "logs/flag.log")}
    assert by_rule["flag"]["run"]["facets"]["roar_snakemake"]["flags"] == {
        str(wd / "done.flag"): ["touch"], str(wd / "prot.txt"): ["protected"]}
    # the pipe links the two members of the group (a stream: no content digest)
    assert [d["name"] for d in by_rule["p1"]["outputs"]] == [str(wd / "x.pipe")]
    assert [d["name"] for d in by_rule["p2"]["inputs"]] == [str(wd / "x.pipe")]
    store = lin.store()
    wrap = store.task_run(by_rule["wrap"]["run"]["runId"])
    assert [c.path for c in wrap.code] == [str(wd / "wrappers/mywrap/wrapper.py")]


def test_untraced_jobs_say_so(tmp_path, smk, lineage, monkeypatch):
    wd = tmp_path.resolve()
    (wd / "Snakefile").write_text('rule a:\n    output: "a.txt"\n    shell: "echo a > {output}"\n')
    monkeypatch.setenv("ROAR_TRACER_OFF", "1")  # the tracer records nothing: say so, loudly
    refused = smk(wd, "-j1", "--roar-require-tracer", ok=False)
    assert "--roar-require-tracer" in refused.stderr
    done = smk(wd, "-j1")
    assert "UNTRACED (ROAR_TRACER_OFF is set" in done.stderr
    (e,) = lineage(wd / ".roar-home").terminal()
    task = e["run"]["facets"]["roar_task"]
    assert e["eventType"] == "COMPLETE" and task["traced"] is False
    assert "ROAR_TRACER_OFF" in task["untracedReason"]
    assert "roar_io" not in e["run"]["facets"]  # nothing observed: nothing to compare
