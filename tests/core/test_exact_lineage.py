"""Exact lineage through the real CLI: every digest is the content a run really read or left,
in the sequences users run (rapid reruns, in-place edits, a file deleted or rewritten by the
next command, an untraced copy, equal contents in unrelated files).

The truth each test compares with is blake3 of the bytes the command really wrote or saw,
computed here from what the test fed it; never what roar recorded elsewhere.  Runs go
through `roar-core run` without `--wait` where the sequence is about timing (the recorder
then works after the next command has already changed the file), and every event sent is
validated against the OpenLineage spec.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import blake3
import pytest

from tests.core.test_cli import Cli, make_cli
from tests.olschema import validate_event


def b3(data: bytes) -> str:
    return "blake3:" + blake3.blake3(data).hexdigest()


def run(cli: Cli, job: str, script: str, wait: bool = False) -> str:
    """`roar-core run` of a shell script; the run id it printed."""
    proc = cli("run", *(["--wait"] if wait else []), "--job", job, "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr.decode()
    line = next(ln for ln in proc.stderr.decode().splitlines() if ", run " in ln)
    return line.split(", run ")[1].split()[0].rstrip(":,")


def accesses(cli: Cli, run_id: str) -> dict[str, dict[str, tuple[str | None, str | None]]]:
    """role -> path -> (digest, why unknown), from the store (after the recorder drained)."""
    cli.ok("show")  # drains whatever the background recorder has not recorded yet
    from roar_core import config
    from roar_core.pipeline.store import Store

    cfg = config.load(cwd=cli.cwd, env=cli.env)
    with Store.open(cfg.database_url, cfg.home) as store:
        out: dict[str, dict[str, tuple[str | None, str | None]]] = {}
        for a in store.accesses_of(run_id):
            out.setdefault(a.role, {})[a.uri] = (a.digest, a.note)
        return out


def events(cli: Cli) -> list[dict]:
    cli.ok("flush")
    path = Path(cli.env["ROAR_HOME"]) / "openlineage" / "events.jsonl"
    evs = [json.loads(line) for line in path.read_text().splitlines()]
    for e in evs:
        validate_event(e)
    return evs


def completes(cli: Cli, job: str) -> list[dict]:
    return [e for e in events(cli) if e["job"]["name"] == job and e["eventType"] == "COMPLETE"]


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return make_cli(tmp_path)


def test_three_quick_runs_rewriting_one_file_each_get_their_own_content(cli: Cli) -> None:
    f = cli.cwd / "f.txt"
    ids = [run(cli, f"w{i}", f"echo content-{i} > f.txt") for i in (1, 2, 3)]
    for i, run_id in enumerate(ids, 1):
        got = accesses(cli, run_id)["output"][str(f)]
        assert got == (b3(f"content-{i}\n".encode()), None), i
    # The events say the same, version by version.
    versions = [e["outputs"][0]["facets"]["version"]["datasetVersion"]
                for i in (1, 2, 3) for e in completes(cli, f"w{i}")]
    assert versions == [b3(f"content-{i}\n".encode()) for i in (1, 2, 3)]


def test_a_background_run_that_rewrites_what_was_hashed_meanwhile_gets_what_it_left(
        cli: Cli) -> None:
    # `roar-core run` reads the command's logs while it runs and hashes what it wrote in
    # the pause (run --wait did; the background run now too): ten files are rewritten
    # with as many bytes right after, one is deleted, and the next command rewrites them
    # all.  Every output's digest is the content the run left: the bytes the script wrote.
    script = ("for i in $(seq 1 40); do printf 'first-%02d' $i > f$i.txt; done; sleep 0.5; "
              "for i in $(seq 1 10); do printf 'again-%02d' $i > f$i.txt; done; rm f40.txt")
    run_id = run(cli, "rewrites", script)
    run(cli, "next", "for f in f*.txt; do echo later > $f; done")
    got = accesses(cli, run_id)
    truth = {str(cli.cwd / f"f{i}.txt"): (b3((b"again-%02d" if i <= 10 else b"first-%02d") % i),
                                          None) for i in range(1, 40)}
    assert got["output"] == truth
    assert set(got["transient"]) == {str(cli.cwd / "f40.txt")}


def test_a_file_deleted_by_the_next_command_stays_its_writers_output(cli: Cli) -> None:
    writer = run(cli, "writer", "printf 'short-lived\\n' > gone.txt")
    run(cli, "remover", "rm gone.txt")
    assert accesses(cli, writer)["output"] == {
        str(cli.cwd / "gone.txt"): (b3(b"short-lived\n"), None)}


def test_sed_in_place_records_the_content_it_read_never_the_new_one(cli: Cli) -> None:
    seen, unseen = cli.cwd / "seen.cfg", cli.cwd / "unseen.cfg"
    seen.write_bytes(b"colour = red\n")
    unseen.write_bytes(b"colour = red\n...\n")
    run(cli, "look", "cat seen.cfg > /dev/null")  # roar has seen this version before
    edit = run(cli, "edit", "sed -i s/red/blue/ seen.cfg unseen.cfg")
    got = accesses(cli, edit)
    # A version roar saw before: its digest.  One never hashed before sed replaced it:
    # unknown, with the reason, never the new content's digest.
    assert got["input"][str(seen)] == (b3(b"colour = red\n"), None)
    digest, why = got["input"][str(unseen)]
    assert digest is None and "changed it before" in why
    assert got["output"][str(seen)] == (b3(b"colour = blue\n"), None)
    assert got["output"][str(unseen)] == (b3(b"colour = blue\n...\n"), None)
    (event,) = completes(cli, "edit")
    facets = {i["name"]: i.get("facets", {}) for i in event["inputs"]}
    assert facets[str(seen)]["version"]["datasetVersion"] == b3(b"colour = red\n")
    assert "version" not in facets[str(unseen)]
    assert "changed it before" in facets[str(unseen)]["roar_unknownVersion"]["reason"]
    # The CLI says so too.
    assert "version unknown: the task changed it before" in cli.ok("show", edit)


def test_an_input_rewritten_after_its_reader_ended_keeps_the_version_read(cli: Cli) -> None:
    run(cli, "v1", "printf 'v1 of the data\\n' > data.txt")
    reader = run(cli, "reader", "cat data.txt > copy.txt")
    run(cli, "v2", "printf 'v2, written right after\\n' > data.txt")
    got = accesses(cli, reader)
    assert got["input"][str(cli.cwd / "data.txt")] == (b3(b"v1 of the data\n"), None)
    assert got["output"][str(cli.cwd / "copy.txt")] == (b3(b"v1 of the data\n"), None)


def test_an_untraced_copy_is_an_inferred_edge_and_both_keep_their_names(cli: Cli) -> None:
    body = b"".join(b"row %d,%d\n" % (i, i * i) for i in range(40))  # well over 64 bytes
    run(cli, "make", "for i in $(seq 0 39); do echo \"row $i,$((i*i))\"; done > orig.csv",
        wait=True)
    orig, copy = cli.cwd / "orig.csv", cli.cwd / "copy.csv"
    assert orig.read_bytes() == body
    subprocess.run(["cp", orig, copy], check=True)  # not traced: roar never sees the copy
    reader = run(cli, "use", "wc -l < copy.csv > n.txt", wait=True)
    assert accesses(cli, reader)["input"][str(copy)] == (b3(body), None)

    (use,) = completes(cli, "use")
    (inp,) = use["inputs"]
    assert inp["name"] == str(copy)  # the path really read, not the producer's
    assert "symlinks" not in inp.get("facets", {})
    (match,) = [e for e in events(cli) if e["job"]["name"] == "roar.content_match"]
    assert [d["name"] for d in match["inputs"]] == [str(orig)]
    assert [d["name"] for d in match["outputs"]] == [str(copy)]
    facet = match["run"]["facets"]["roar_contentMatch"]
    assert facet["inferredFrom"] == "equal blake3 digests" and facet["digest"] == b3(body)[7:]
    # Before the reader's COMPLETE, so the copy has a producer when the reader arrives.
    order = [(e["run"]["runId"], e["eventType"]) for e in events(cli)]
    assert order.index((match["run"]["runId"], "COMPLETE")) < order.index(
        (use["run"]["runId"], "COMPLETE"))

    g = json.loads(cli.ok("lineage", "n.txt", "--json"))
    edges = {(e["source"], e["target"], e["kind"]) for e in g["edges"]}
    a_orig, a_copy = (f"artifact:{b3(body)}:{orig}", f"artifact:{b3(body)}:{copy}")
    assert (a_orig, a_copy, "inferred") in edges
    assert any(s.startswith("run:") and t == a_orig and k == "output" for s, t, k in edges)
    assert "[inferred: equal content" in cli.ok("lineage", "n.txt")

    # Rewriting the copy leaves the original's versions alone.
    run(cli, "rewrite", "printf 'another content entirely, long enough to match: %064d' 0 "
        "> copy.csv", wait=True)
    history = cli.ok("show", str(orig))
    assert history.count("  version ") == 1 and b3(body) in history
    assert "rewrite" not in history


def test_equal_small_or_empty_files_infer_nothing(cli: Cli) -> None:
    run(cli, "mark", ": > done.marker; echo ok > status.txt", wait=True)
    (cli.cwd / "settings.cfg").write_bytes(b"")
    (cli.cwd / "status-copy.txt").write_bytes(b"ok\n")
    reader = run(cli, "configure", "cat settings.cfg status-copy.txt > /dev/null", wait=True)
    got = accesses(cli, reader)["input"]
    assert got[str(cli.cwd / "settings.cfg")] == (b3(b""), None)
    assert not [e for e in events(cli) if e["job"]["name"] == "roar.content_match"]
    (event,) = completes(cli, "configure")
    assert sorted(i["name"] for i in event["inputs"]) == sorted(
        [str(cli.cwd / "settings.cfg"), str(cli.cwd / "status-copy.txt")])
    g = json.loads(cli.ok("lineage", "settings.cfg", "--json"))
    assert g["runs"] == [] and all(e["kind"] != "inferred" for e in g["edges"])


def test_content_match_can_be_turned_off(cli: Cli) -> None:
    run(cli, "make", "seq 1 100 > a.txt", wait=True)
    subprocess.run(["cp", cli.cwd / "a.txt", cli.cwd / "b.txt"], check=True)
    off = {**cli.env, "ROAR_CONTENT_MATCH": "false"}
    proc = cli("run", "--wait", "--job", "use", "--", "cat", "b.txt", env=off)
    assert proc.returncode == 0, proc.stderr.decode()
    assert not [e for e in events(cli) if e["job"]["name"] == "roar.content_match"]
    proc = cli("lineage", "b.txt", "--json", env=off)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout)["runs"] == []


GIB = 1 << 30


def test_a_1_gib_output_overwritten_right_after_its_run_keeps_its_digest(cli: Cli) -> None:
    """The digest is taken by `roar-core run` before it returns, so the next command cannot
    change what the first left (the answer is the right digest, not *unknown*)."""
    block = os.urandom(1 << 20)
    expected = blake3.blake3(block * 1024, max_threads=blake3.blake3.AUTO).hexdigest()
    (cli.cwd / "block.bin").write_bytes(block)
    writer = run(cli, "big", "for i in $(seq 1024); do cat block.bin; done > big.bin")
    run(cli, "overwrite", "echo small > big.bin")
    got = accesses(cli, writer)["output"][str(cli.cwd / "big.bin")]
    assert got == ("blake3:" + expected, None)
    assert (cli.cwd / "big.bin").stat().st_size < GIB


def test_a_tasks_code_goes_out_with_its_git_commit_and_digest(cli: Cli) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=cli.cwd, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "0")
    git("remote", "add", "origin", "https://alice:s3cr3t-token@example.com/org/repo.git")
    script = cli.cwd / "step.py"
    script.write_text("open('out.txt', 'w').write('made by step.py\\n')\n")
    git("add", "step.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "step")
    commit = git("rev-parse", "HEAD")
    run(cli, "clean", "python3 step.py", wait=True)
    script.write_text(script.read_text() + "# edited, not committed\n")
    run(cli, "edited", "python3 step.py", wait=True)

    for job, dirty in (("clean", False), ("edited", True)):
        (event,) = completes(cli, job)
        loc = event["job"]["facets"]["sourceCodeLocation"]
        assert (loc["type"], loc["url"], loc["path"], loc["version"]) == (
            "git", "https://example.com/org/repo.git", "step.py", commit)
        (f,) = event["job"]["facets"]["roar_code"]["files"]
        assert (f["path"], f["commit"], f["dirty"]) == (str(script), commit, dirty)
        assert f["digest"] == b3(script.read_bytes()) or job == "clean"
        assert "s3cr3t" not in json.dumps(event)
    (first,) = completes(cli, "clean")
    assert first["job"]["facets"]["roar_code"]["files"][0]["digest"] == b3(
        b"open('out.txt', 'w').write('made by step.py\\n')\n")


def test_a_long_lived_recorder_sees_each_new_commit_of_a_tasks_code(tmp_path: Path) -> None:
    """One process records many tasks (a Ray node's or Airflow worker's recorder): each gets
    the commit its code is at then, not the first one seen."""
    from roar_core.pipeline import sourcecode

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    script = tmp_path / "step 1.py"  # a space: paths are read from git's NUL-separated output
    got = []
    for body in ("v1\n", "v2\n"):
        script.write_text(body)
        git("add", "-A")
        git("commit", "-q", "-m", body)
        (v,) = sourcecode.versions([(str(script), b3(body.encode()))])
        got.append((v.repo.commit, v.repo_path, v.dirty))
        script.write_text(body + "# edited\n")
        (v,) = sourcecode.versions([(str(script), "blake3:" + "0" * 64)])
        assert (v.repo.commit, v.dirty) == (got[-1][0], True)
    assert got[0][0] != got[1][0]
    assert [c for c, _, _ in got] == [got[0][0], git("rev-parse", "HEAD")]
    assert [(p, d) for _, p, d in got] == [("step 1.py", False)] * 2


def test_two_files_exchanged_are_both_outputs_each_with_the_others_bytes(cli: Cli) -> None:
    """renameat2(RENAME_EXCHANGE) (`mv --exchange`, an atomic swap of a live file with its
    new version): each name now holds the other's bytes, both written by the run; before,
    only the second name was an output, and the first's new content had no producer."""
    (cli.cwd / "live.txt").write_bytes(b"live v1\n")
    (cli.cwd / "next.txt").write_bytes(b"live v2\n")
    swap = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
            "assert libc.renameat2(-100, b'live.txt', -100, b'next.txt', 2) == 0, "
            "os.strerror(ctypes.get_errno())")
    run_id = run(cli, "swap", f'python3 -c "{swap}"', wait=True)
    assert (cli.cwd / "live.txt").read_bytes() == b"live v2\n"  # (the swap happened)
    got = accesses(cli, run_id)
    assert {Path(u).name: d for u, (d, _) in got.get("output", {}).items()} == {
        "live.txt": b3(b"live v2\n"), "next.txt": b3(b"live v1\n")}
    assert "deleted" not in got
    [complete] = completes(cli, "swap")
    lifecycle = {Path(o["name"]).name: o["facets"].get("lifecycleStateChange", {}).get(
        "lifecycleStateChange") for o in complete["outputs"]}
    assert lifecycle == {"live.txt": "OVERWRITE", "next.txt": "OVERWRITE"}


def test_a_tree_written_under_a_temporary_name_then_moved_into_place_is_the_output(
        cli: Cli) -> None:
    """A directory written whole, then renamed into place at once (checkpoint savers,
    `mktemp -d` + `mv`): its files are the run's outputs under the name they have now,
    each with the bytes written; the temporary names are not outputs.  Before, the run
    had no outputs at all, and the next run's input had no producer."""
    (cli.cwd / "in.txt").write_bytes(b"source\n")
    producer = run(cli, "save", "mkdir -p ckpt.tmp/shard && cat in.txt > ckpt.tmp/meta && "
                   "printf w1 > ckpt.tmp/shard/0 && printf w2 > ckpt.tmp/shard/1 && "
                   "mv ckpt.tmp ckpt", wait=True)
    got = accesses(cli, producer)
    assert {u.removeprefix(f"{cli.cwd}/"): d for u, (d, _) in got["output"].items()} == {
        "ckpt/meta": b3(b"source\n"), "ckpt/shard/0": b3(b"w1"), "ckpt/shard/1": b3(b"w2")}
    assert {Path(u).name for u in got["input"]} == {"in.txt"}
    assert all("ckpt.tmp/" in u for u in got.get("transient", {})), got
    reader = run(cli, "load", "cat ckpt/shard/1 > loaded.txt", wait=True)
    assert {Path(u).name: d for u, (d, _) in accesses(cli, reader)["input"].items()} == {
        "1": b3(b"w2")}
    assert "written by" in cli.ok("show", "ckpt/shard/1") and "save" in cli.ok(
        "show", "ckpt/shard/1")


def test_a_touched_file_keeps_its_producer_and_an_edit_in_place_is_a_version(
        cli: Cli) -> None:
    """`touch` opens an existing file to write and changes only its timestamps: the bytes
    are still the ones its producer left, so `touch` produced nothing (it was recorded as
    their writer, which hid the run that made them).  A write in place that changes them
    (`dd conv=notrunc`) makes a version, and a rewrite of the same bytes from scratch is
    its run's too."""
    target = str(cli.cwd / "f.txt")
    maker = run(cli, "make", "printf 'made\\n' > f.txt", wait=True)
    toucher = run(cli, "stamp", "touch f.txt", wait=True)
    assert "output" not in accesses(cli, toucher)
    shown = cli.ok("show", "f.txt")
    assert "make" in shown and "stamp" not in shown, shown
    upstream = json.loads(cli.ok("lineage", "f.txt", "--json"))
    assert maker in json.dumps(upstream) and toucher not in json.dumps(upstream)
    editor = run(cli, "patch", "printf M | dd of=f.txt conv=notrunc status=none", wait=True)
    assert accesses(cli, editor)["output"] == {target: (b3(b"Made\n"), None)}
    again = run(cli, "remake", "printf 'Made\\n' > f.txt", wait=True)
    assert accesses(cli, again)["output"] == {target: (b3(b"Made\n"), None)}
