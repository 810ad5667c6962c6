"""A roar home that cannot be written (a full disk, a read-only mount) or a damaged store:
the command runs as untraced, roar says so in one line, `doctor` finds it, and the run is
recorded once the cause is gone (issue 17, item 7).

The home is a real 2 MiB tmpfs, filled up and remounted read-only, in a mount namespace of
its own (`unshare`): nothing outside the test sees it."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import blake3
import pytest

from tests.core.test_cli import ROAR, _recorders_of, make_cli

SCENARIO = r"""
set -u
home=$1 out=$2 roar=$3
mount -t tmpfs -o size=2m tmpfs "$home" || exit 99
step() {  # name, then the roar-core arguments: its status, stdout and stderr kept
    local name=$1; shift
    "$roar" "$@" >"$out/$name.out" 2>"$out/$name.err"; echo $? >"$out/$name.rc"
}
step setup run --wait --job setup -- sh -c 'echo setup > setup.txt'
recorder_gone() {  # the home's recorder (it idles out): nothing else writes there meanwhile
    for _ in $(seq 200); do
        grep -qas -- "$home/sessions" /proc/[0-9]*/cmdline || return 0
        sleep 0.05
    done
}
recorder_gone
dd if=/dev/zero of="$home/filler" bs=64k 2>/dev/null
step full run --job full -- sh -c 'echo full > full.txt'
step fullwait run --wait --job fullwait -- sh -c 'echo fullwait > fullwait.txt'
step doctorfull doctor
rm "$home/filler"
step freed show
mount -o remount,ro "$home"
step ro run --job ro -- sh -c 'echo ro > ro.txt'
step rowait run --wait --job rowait -- sh -c 'echo rowait > rowait.txt'
step doctorro doctor
mount -o remount,rw "$home"
step writable show
step flush flush
cp "$home/openlineage/events.jsonl" "$out/events.jsonl"
"""


def _namespace() -> list[str]:
    if os.geteuid() == 0:
        return ["unshare", "-m"]
    return ["unshare", "-rm"]  # an unprivileged user's own user and mount namespaces


def _in_namespace(script: str, home: Path, tmp_path: Path, cwd: Path, env: dict[str, str],
                  timeout: float) -> Path:
    """Run a scenario in a mount namespace of its own; the directory of its steps' output."""
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([*_namespace(), "bash", "-c", script, "scenario", str(home),
                           str(out), ROAR], cwd=cwd, env=env, capture_output=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr.decode()
    return out


def _step(out: Path, name: str) -> tuple[int, str, str]:
    return (int((out / f"{name}.rc").read_text()), (out / f"{name}.out").read_text(),
            (out / f"{name}.err").read_text())


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_full_and_read_only_home(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or subprocess.run(
            [*_namespace(), "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare)")
    cli = make_cli(tmp_path)
    home = Path(cli.env["ROAR_HOME"])
    home.mkdir()
    out = _in_namespace(SCENARIO, home, tmp_path, cli.cwd, cli.env, 300)
    assert _step(out, "setup")[0] == 0

    # Full: every command ran, as untraced would; one line said why and what happens.
    for name in ("full", "fullwait", "ro", "rowait"):
        rc, _, err = _step(out, name)
        assert rc == 0 and (cli.cwd / f"{name}.txt").read_text() == f"{name}\n", err
    for name in ("full", "ro"):
        line = _one_line(_step(out, name)[2])
        assert "cannot write the roar home" in line and "recorded once" in line, line
    for name in ("doctorfull", "doctorro"):
        rc, report, _ = _step(out, name)
        assert rc == 1, report
        home_line = next(line for line in report.splitlines() if line.startswith("home"))
        assert "FAIL" in home_line and "cannot be written" in home_line
        assert "until the home can be written" in report

    # Space freed, then the home writable again: the next command records what waited.
    _, listing, err = _step(out, "freed")
    assert "Traceback" not in err
    for job in ("full", "fullwait"):
        assert any(line.split()[2:4] == [job, "COMPLETE"] for line in listing.splitlines()), \
            listing
    _, listing, _ = _step(out, "writable")
    jobs = [line.split()[2] for line in listing.splitlines()[1:]]
    assert sorted(jobs) == sorted(["setup", "full", "fullwait", "ro", "rowait"]), listing
    assert _step(out, "flush")[0] == 0
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    for job in ("full", "fullwait", "ro", "rowait"):
        kinds = [e["eventType"] for e in events if e["job"]["name"] == job]
        assert kinds == ["START", "COMPLETE"], (job, kinds)
        complete = next(e for e in events if e["job"]["name"] == job
                        and e["eventType"] == "COMPLETE")
        assert [o["name"] for o in complete["outputs"]] == [str(cli.cwd / f"{job}.txt")]
        truth = blake3.blake3(f"{job}\n".encode()).hexdigest()  # what its echo wrote
        assert complete["outputs"][0]["facets"]["version"]["datasetVersion"] == \
            f"blake3:{truth}"


def _damage(home: Path) -> bytes:
    """Zero every page of the home's store but the first (SQLite opens it, and nothing in it
    can be read); returns its bytes as they were, a backup."""
    db = home / "lineage.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    saved = db.read_bytes()
    db.write_bytes(saved[:4096] + bytes(len(saved) - 4096))
    return saved


def _mend(home: Path, saved: bytes) -> None:
    """The backup put back over the damaged store, its write-ahead log gone."""
    (home / "lineage.db").write_bytes(saved)
    for name in ("lineage.db-wal", "lineage.db-shm"):
        (home / name).unlink(missing_ok=True)


def test_a_damaged_store_keeps_the_runs_and_flush_sends_what_was_spooled(
        tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    home = Path(cli.env["ROAR_HOME"])
    down = {**cli.env, "OPENLINEAGE_URL": "http://127.0.0.1:9"}  # nothing listens there
    for i in range(3):
        proc = cli("run", "--wait", "--job", f"before{i}", "--", "true", env=down)
        assert proc.returncode == 0, proc.stderr
    saved = _damage(home)

    proc = cli("run", "--job", "after", "--", "sh", "-c", "echo x > after.txt", env=down)
    assert proc.returncode == 0 and (cli.cwd / "after.txt").exists(), proc.stderr
    doctor = cli("doctor", env=down)
    report = doctor.stdout.decode()
    assert doctor.returncode == 1
    assert "damaged" in next(line for line in report.splitlines() if line.startswith("store"))

    # The 6 events spooled before the damage go out; the run after it waits for a store.
    flushed = cli("flush")
    assert flushed.stdout == b"sent 6, pending 0\n", flushed.stdout + flushed.stderr
    assert b"stay so" in flushed.stderr  # one warning: the run is kept, not dropped

    _mend(home, saved)
    listing = cli.ok("show")
    assert "after" in listing.split() and "COMPLETE" in listing, listing
    assert cli.ok("flush").endswith("pending 0\n")
    events = home / "openlineage" / "events.jsonl"
    kinds = [(e["job"]["name"], e["eventType"])
             for e in map(json.loads, events.read_text().splitlines())]
    assert kinds[-2:] == [("after", "START"), ("after", "COMPLETE")], kinds
    assert len(kinds) == 8


def test_a_store_mended_while_its_recorder_runs_is_used_by_the_next_reader(
        tmp_path: Path) -> None:
    """The recorder that failed to record a run in a damaged store is still running when the
    store is mended: `show` has it try again at once, on the store as it is now (not after
    its pause, and not through its connection's pages of the damaged file)."""
    from roar_core.recording import recorder
    from roar_core.recording.tasklog import TaskLog

    cli = make_cli(tmp_path)
    home = Path(cli.env["ROAR_HOME"])
    cli.ok("run", "--wait", "--job", "before", "--", "true")
    saved = _damage(home)
    sessions = home / "sessions"
    # A live producer's log: the recorder stays (with only failed runs left it would leave
    # after RECORDER_IDLE_S, and the reader would record in its own process).
    keeper = TaskLog(sessions)
    try:
        cli.ok("run", "--job", "after", "--", "sh", "-c", "echo x > after.txt")
        deadline = time.monotonic() + 30
        while not any(b'{"fail"' in p.read_bytes() for p in sessions.glob("tasks-*.jsonl")
                      if p.name != Path(keeper.path).name):
            assert time.monotonic() < deadline, "the recorder never tried the run"
            time.sleep(0.05)
        assert recorder.running(sessions)

        _mend(home, saved)
        listing = cli.ok("show")
        assert recorder.running(sessions)  # it recorded the run, not the reader
    finally:
        keeper.remove()
        keeper.close()
    assert "after" in listing.split() and "COMPLETE" in listing, listing


READ_ONLY = r"""
set -u
home=$1 out=$2 roar=$3
mount --bind "$home" "$home" && mount -o remount,bind,ro "$home" || exit 99
for c in show "lineage b.txt" "graph b.txt --format dot" doctor; do
    name=${c%% *}
    $roar $c >"$out/$name.out" 2>"$out/$name.err"; echo $? >"$out/$name.rc"
done
"""


def test_reading_commands_read_a_read_only_store_and_write_nothing(tmp_path: Path) -> None:
    """`show`, `lineage`, `graph` refused a store they could not write ("roar home ... is
    not writable"): a read-only mount, another user's home."""
    if shutil.which("unshare") is None or subprocess.run(
            [*_namespace(), "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare)")
    cli = make_cli(tmp_path)
    home = Path(cli.env["ROAR_HOME"])
    (cli.cwd / "a.txt").write_text("a\n")
    for step in (["cp", "a.txt", "b.txt"], ["sh", "-c", "tr a b < b.txt > c.txt"]):
        proc = cli("run", "--wait", "--", *step)
        assert proc.returncode == 0, proc.stderr
    deadline = time.monotonic() + 30
    while _recorders_of(home) and time.monotonic() < deadline:  # it idles out
        time.sleep(0.05)
    before = {p.relative_to(home): p.stat().st_mtime_ns for p in home.rglob("*")}
    out = _in_namespace(READ_ONLY, home, tmp_path, cli.cwd, cli.env, 120)
    for name in ("show", "lineage", "graph"):
        rc, text, err = _step(out, name)
        assert rc == 0 and "Traceback" not in err, (name, err)
    rc, text, _ = _step(out, "show")
    assert sorted(line.split()[2] for line in text.splitlines()[1:]) == ["cp", "tr"], text
    _, text, _ = _step(out, "lineage")
    assert "run cp" in text and "a.txt" in text
    _, text, _ = _step(out, "graph")
    assert text.startswith("digraph") and str(cli.cwd / "a.txt") in text
    rc, report, _ = _step(out, "doctor")
    store = next(line for line in report.splitlines() if line.startswith("store"))
    assert " ok " in store and "read-only" in store, report
    assert {p.relative_to(home): p.stat().st_mtime_ns for p in home.rglob("*")} == before
