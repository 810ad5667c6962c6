"""The events and store rows of one Snakemake workflow (a temp() output, a secret
parameter, an undeclared read) are those roar produced before its recording moved from a
helper process fed through a pipe (roar_core.remote) to the task log and the one recorder:
golden/workflow.json was written by that earlier version (commit d8b4259)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.golden_stream import stream

GOLDEN = Path(__file__).parent / "golden"


def test_the_stream_is_the_one_before_the_recorder_moved(tmp_path, smk):
    wd = tmp_path / "wf"  # the workflow's name comes from the directory's
    wd.mkdir()
    shutil.copy(GOLDEN / "Snakefile", wd / "Snakefile")
    (wd / "in.txt").write_text("hello\n")
    smk(wd, "-j1")
    got = stream(wd / ".roar-home", wd)
    want = json.loads((GOLDEN / "workflow.json").read_text())
    assert got["runs"] == want["runs"]
    assert got["events"] == want["events"]
