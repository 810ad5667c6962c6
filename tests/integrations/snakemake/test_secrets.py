"""A rule's parameter named like a secret is masked in the params facet and wherever
Snakemake put its value: the job's command, in the events and the store (issue 17,
item 11)."""

from __future__ import annotations

import textwrap

CANARY = "smk-cnry-4f2a9"

SNAKEFILE = textwrap.dedent(f'''
    rule upload:
        input: "in.txt"
        output: "sent.txt"
        params: api_key="{CANARY}", bucket="public-bucket"
        shell: "echo {{params.bucket}} {{params.api_key}} > /dev/null; cp {{input}} {{output}}"
''')


def test_a_secret_param_leaves_nothing(tmp_path, smk, lineage):
    wd = tmp_path.resolve()
    (wd / "Snakefile").write_text(SNAKEFILE)
    (wd / "in.txt").write_text("data\n")
    home = wd / ".roar-home"
    smk(wd, "-j1")
    lin = lineage(home)
    (done,) = lin.terminal(f"{wd.name}.upload")
    facets = done["run"]["facets"]
    assert facets["roar_snakemake"]["params"] == {"api_key": "***", "bucket": "public-bucket"}
    script = facets["roar_task"]["command"][-1]
    assert "echo public-bucket *** > /dev/null; cp in.txt sent.txt" in script, script
    leaks = [p for p in home.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]
    assert leaks == []
