"""A job's START and COMPLETE carry the times the job really began and ended (not when the
recorder process, still starting, got to them), and its own pid, not the recorder's."""

from __future__ import annotations

import textwrap
from datetime import datetime

SNAKEFILE = textwrap.dedent('''
    rule all:
        input: "slow.txt", "quick.txt"

    rule slow:
        output: "slow.txt"
        shell: "date +%s.%N > slow.start; echo $$ > slow.pid; sleep 3; "
               "echo done > {output}; date +%s.%N > slow.end"

    rule quick:
        output: "quick.txt"
        shell: "echo $$ > quick.pid; echo quick > {output}"
''')


def _t(e: dict) -> float:
    return datetime.fromisoformat(e["eventTime"]).timestamp()


def test_a_sleep_3_job_is_recorded_at_its_real_times_and_pid(tmp_path, smk, lineage):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    smk(tmp_path, "-j2", "--roar-workflow-name", "times")
    lin = lineage(tmp_path / ".roar-home")
    for job in ("slow", "quick"):
        (done,) = lin.terminal(f"times.{job}")
        pid = int((tmp_path / f"{job}.pid").read_text())
        assert done["run"]["facets"]["roar_task"]["pid"] == pid, job
    (done,) = lin.terminal("times.slow")
    (start,) = [e for e in lin.events if e["eventType"] == "START"
                and e["run"]["runId"] == done["run"]["runId"]]
    began = float((tmp_path / "slow.start").read_text())
    ended = float((tmp_path / "slow.end").read_text())
    assert ended - began >= 3
    # The shell's first and last commands run a few ms inside the job's own span.
    assert abs(_t(start) - began) < 0.1, (_t(start) - began)
    assert abs(_t(done) - ended) < 0.1, (_t(done) - ended)
