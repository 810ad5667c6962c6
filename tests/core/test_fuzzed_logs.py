"""A corrupt trace log costs its own events, never the run (issue 17, item 6).

One real session (a shell and two `cat`s, one log each) is recorded again and again with
the first `cat`'s log damaged at random: bytes flipped, cut short, runs of NULs written
over it.  Every variant must record (no exception), with the shell's log's files found:
the outputs of its redirections do not depend on the damaged log."""

from __future__ import annotations

import os
import random
import shutil
from datetime import datetime, timezone

import pytest

from roar_core import config
from roar_core.api import Roar
from roar_core.pipeline import tracelog, tracer
from roar_core.recording import recorder
from roar_core.recording.sessions import run_traced
from roar_core.recording.tasklog import Result, TaskLog

VARIANTS = int(os.environ.get("ROAR_FUZZ_VARIANTS", "300"))


def _damage(data: bytearray, rng: random.Random) -> bytearray:
    body = tracelog.HEADER_SIZE  # a broken header is a separate, simpler case (below)
    kind = rng.choice(("flip", "flip", "nul", "cut", "mixed"))
    if kind in ("flip", "mixed"):
        for _ in range(rng.randint(1, 40)):
            i = rng.randrange(body, len(data))
            data[i] ^= 1 << rng.randrange(8)
    if kind in ("nul", "mixed"):
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(body, len(data))
            n = rng.randint(1, 64)
            data[i:i + n] = bytes(len(data[i:i + n]))
    if kind == "cut":
        del data[rng.randrange(body, len(data)):]
    return data


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory):
    if not tracer.status().usable:
        pytest.skip(tracer.status().reason)
    root = tmp_path_factory.mktemp("fuzz")
    cfg = config.load(cwd=root, env={"ROAR_HOME": str(root / "home")})
    (root / "in.txt").write_text("data\n")
    argv = ["sh", "-c", "cat in.txt > a.txt; cat a.txt > b.txt; echo x > c.txt"]
    session = root / "session"
    session.mkdir()
    assert run_traced(argv, session, "fuzzed", cwd=root) == 0
    logs = tracelog.read_session(session).logs
    # The first cat's log: it read in.txt (the shell's holds the redirections' opens).
    victim = next(os.path.basename(log.path) for log in logs
                  if {r.path.rsplit(b"/", 1)[-1] for r in log.records} >= {b"in.txt"}
                  and not any(r.path.endswith(b"/c.txt") for r in log.records))
    return cfg, root, session, victim


def _aimed(data: bytes) -> list[bytearray]:
    """Damage that random flips find rarely (about 1 log in 600), in the record of the
    open of in.txt: a NUL inside its name; its name's length past its record."""
    name = data.index(b"/in.txt", tracelog.HEADER_SIZE)
    at = tracelog.HEADER_SIZE
    while (size := int.from_bytes(data[at:at + 4], "little")) and at + size <= name:
        at += size
    record = at
    nul = bytearray(data)
    nul[name + 3] = 0
    long = bytearray(data)
    long[record + 106:record + 108] = b"\xf0\x00"  # path_len, u16 at offset 106
    return [nul, long]


def _record(roar: Roar, session, directory, run_id: str, damaged) -> Result:
    """Record `session` as `roar-core run` leaves a run: its begin and end in a task log,
    the session its own, one log replaced by `damaged` (name, bytes); returns what the
    recorder answered."""
    shutil.copytree(session, directory / "run")
    (directory / "run" / damaged[0]).write_bytes(damaged[1])
    log = TaskLog(directory, results=True)
    try:
        log.begun({"run_id": run_id, "engine": "cli", "namespace": "fuzz",
                   "job_name": "fuzzed", "command": ["sh"],
                   "started_at": datetime.now(timezone.utc).isoformat()}, own_dir="run")
        log.ended(run_id, "COMPLETE", exit_code=0)
        assert recorder.drain(roar, directory) == 1
        log.read_results()
        return Result(log.results[run_id])
    finally:
        log.close()


def test_every_other_log_is_recorded_whatever_the_damage(made) -> None:
    cfg, root, session, victim = made
    roar = Roar(cfg)
    rng = random.Random(17)
    aimed = _aimed((session / victim).read_bytes())
    try:
        for i in range(VARIANTS + len(aimed)):
            d = root / f"variant-{i}"
            d.mkdir()
            damaged = aimed[i - VARIANTS] if i >= VARIANTS else _damage(
                bytearray((session / victim).read_bytes()), rng)
            # A fresh run id per variant: each is its own run in the store.
            recorded = _record(roar, session, d, f"01900000-0000-7000-8000-{i:012d}",
                               damaged=(victim, damaged))
            outputs = {o.name.rsplit("/", 1)[-1] for o in recorded.outputs}
            assert {"b.txt", "c.txt"} <= outputs, (i, outputs)
            assert recorded.status == "COMPLETE"
    finally:
        roar.close()


def test_a_log_with_a_broken_header_is_one_lost_event(made) -> None:
    cfg, root, session, victim = made
    roar = Roar(cfg)
    try:
        data = bytearray((session / victim).read_bytes())
        data[0:8] = b"NOTALOG\0"
        d = root / "variant-header"
        d.mkdir()
        recorded = _record(roar, session, d, "01900000-0000-7000-8000-ffffffffffff",
                           damaged=(victim, data))
        assert {"b.txt", "c.txt"} <= {o.name.rsplit("/", 1)[-1] for o in recorded.outputs}
        assert recorded.data["dropped"] >= 1
    finally:
        roar.close()


def _read_both(path, monkeypatch, start: int = 0, final: bool = True) -> tuple:
    """The log as read (first) from a copy of its first bytes (from `start` on: of the
    header and of what follows `start`) and (then) mapped whole."""
    def read(small: int):
        monkeypatch.setattr(tracelog, "_READ_SMALL", small)
        try:
            log = tracelog.read_log(path, start=start, final=final)
        except tracelog.TraceLogError as e:
            return str(e)
        return (log.header, log.records, log.torn, log.next_offset, log.final)

    return read(1 << 16), read(0)


def test_a_log_reads_the_same_copied_or_mapped_whatever_the_damage(
        made, tmp_path, monkeypatch) -> None:
    # A small log is read with one copy of its first bytes, a bigger one mapped: both
    # readers find the same records, losses and end, in every damaged variant (among them
    # a header whose reserved size points past the copy, read mapped then), with the
    # aimed damage and a header cut short.
    _, _, session, victim = made
    rng = random.Random(21)
    original = (session / victim).read_bytes()
    variants = [bytearray(original), *_aimed(original), bytearray(original[:100])]
    reserved_far = bytearray(original)
    reserved_far[48:56] = (1 << 17).to_bytes(8, "little")  # the header's `reserved`
    variants.append(reserved_far)
    variants += [_damage(bytearray(original), rng) for _ in range(200)]
    path = tmp_path / "roar-1-1.log"
    for i, data in enumerate(variants):
        path.write_bytes(data)
        copied, mapped = _read_both(path, monkeypatch)
        assert copied == mapped, i


def test_a_log_read_on_from_an_offset_reads_the_same_copied_or_mapped(
        made, tmp_path, monkeypatch) -> None:
    # A task's end reads its own process's log on from where the task began, copying only
    # the header and what follows (not the log's first 64 KiB): the same records, losses
    # and resume offset as the mapped read, from every record boundary of the log and from
    # offsets inside records, in damaged variants too.
    _, _, session, victim = made
    rng = random.Random(28)
    original = (session / victim).read_bytes()
    starts, at = [], 0
    while (size := int.from_bytes(original[tracelog.HEADER_SIZE + at:][:4], "little")):
        at += size
        starts.append(at)
    assert len(starts) >= 3, starts  # the cat's start, open(s), close(s)...
    starts += [8, 16, starts[0] + 8]
    reserved_far = bytearray(original)
    reserved_far[48:56] = (1 << 17).to_bytes(8, "little")
    variants = [bytearray(original), *_aimed(original), reserved_far]
    variants += [_damage(bytearray(original), rng) for _ in range(60)]
    path = tmp_path / "roar-1-1.log"
    for i, data in enumerate(variants):
        path.write_bytes(data)
        for start in starts:
            copied, mapped = _read_both(path, monkeypatch, start=start, final=False)
            assert copied == mapped, (i, start)
