"""`roar-core reproduce PATH`: the plan to make a file again, and (`--run`) doing it.

The plan is the file's recorded ancestry as runs in order (every producer before the runs
that read what it wrote), each with its command or engine task, working directory, code
(scripts and their digests) and inputs, each input marked with whether it still holds the
recorded content.  `--run` re-executes a pipeline of `roar-core run` commands in a scratch
directory: the files no run of the plan produced (its sources) and the scripts are copied
there under the same relative paths, each command runs where it ran, with the pipeline's
paths moved into the scratch directory, recorded by `roar-core run` into a home of its own
there; then every output is compared with the digest recorded for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roar_core.cli import verify as verify_mod
from roar_core.pipeline.hashing import Hasher, blake3_file
from roar_core.pipeline.store import Store, TaskRunRecord


class CannotReproduce(Exception):
    """The plan cannot be re-executed (the message says why, in one line)."""


@dataclass
class Step:
    run: TaskRunRecord
    cwd: str | None
    inputs: list[verify_mod.Checked]
    outputs: list[tuple[str, str]]  # (uri, digest)

    def to_dict(self) -> dict[str, Any]:
        r = self.run
        return {"run_id": r.run_id, "job_name": r.job_name, "engine": r.engine,
                "command": r.command, "cwd": self.cwd,
                "code": [vars(c) for c in r.code],
                "environment": r.environment.get("environment"),
                "machine": r.environment.get("machine"),
                "inputs": [vars(i) for i in self.inputs],
                "outputs": [{"uri": u, "digest": d} for u, d in self.outputs]}


@dataclass
class Plan:
    key: str
    steps: list[Step]
    sources: list[verify_mod.Checked] = field(default_factory=list)  # produced by no step

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "steps": [s.to_dict() for s in self.steps],
                "sources": [vars(c) for c in self.sources]}


def step(store: Store, run_id: str, hasher: Hasher | None) -> Step:
    """A recorded run as a step, its inputs checked on disk (`hasher`) or not (None)."""
    run = store.task_run(run_id)
    assert run is not None
    accesses = store.accesses_of(run_id)
    ins = sorted({(a.uri, a.digest) for a in accesses if a.role == "input" and a.digest})
    outs = sorted({(a.uri, a.digest) for a in accesses if a.role == "output" and a.digest})
    checked = (verify_mod.check(hasher, ins) if hasher is not None else
               [verify_mod.Checked(u, d, verify_mod.UNCHECKED) for u, d in ins])
    return Step(run, run.environment.get("cwd"), checked, outs)


def plan(store: Store, hasher: Hasher, key: str, min_size: int | None) -> Plan:
    g = store.lineage(key, "upstream", None, min_size)
    makes: dict[str, set[str]] = {}  # run id -> artifact ids it wrote
    reads: dict[str, set[str]] = {}  # run id -> artifact ids it read
    for e in g.edges:
        if e.kind == "output":
            makes.setdefault(g.runs[e.source].run_id, set()).add(e.target)
        elif e.kind == "input":
            reads.setdefault(g.runs[e.target].run_id, set()).add(e.source)
    runs = sorted({n.run_id for n in g.runs.values()},
                  key=lambda r: g.runs[f"run:{r}"].started_at)
    made = set().union(*makes.values()) if makes else set()
    order, done = [], set()
    while len(order) < len(runs):  # producers first; ties by start time
        ready = [r for r in runs if r not in done and not any(
            a in makes.get(p, ()) for a in reads.get(r, ()) for p in runs if p not in done
            and p != r)]
        first = ready[0] if ready else next(r for r in runs if r not in done)  # a cycle
        order.append(first)
        done.add(first)
    steps = [step(store, run_id, hasher) for run_id in order]
    sources = sorted({(a.uri, a.digest) for i, a in g.artifacts.items()
                      if i not in made and a.digest})
    return Plan(key, steps, verify_mod.check(hasher, sources))


@dataclass
class Outcome:
    uri: str
    recorded: str
    again: str | None  # the digest made again; None: not made

    @property
    def identical(self) -> bool:
        return self.again == self.recorded


def rerun(p: Plan, scratch: Path, roar_core: str) -> list[Outcome]:
    """Re-execute a plan of `roar-core run` commands in `scratch`; the outputs' outcomes."""
    for s in p.steps:
        if s.run.engine != "cli" or not s.cwd:
            raise CannotReproduce(f"run {s.run.run_id} ({s.run.job_name}) ran under "
                                  f"{s.run.engine}, not `roar-core run`: only a pipeline of "
                                  "`roar-core run` commands can be re-executed")
    bad = [c for c in p.sources if c.status != verify_mod.OK and c.uri.startswith("/")]
    if bad:
        raise CannotReproduce(f"{bad[0].uri} no longer holds the recorded content "
                              f"({bad[0].status}): the sources must be as they were")
    paths = [c.uri for c in p.sources if c.uri.startswith("/")] + [
        s.cwd for s in p.steps if s.cwd] + [c.path for s in p.steps for c in s.run.code]
    root = os.path.commonpath(paths) if paths else "/"
    if root == "/":
        raise CannotReproduce("the pipeline's files have no common directory but /")
    scratch = scratch.resolve()

    def moved(path: str) -> Path:
        return scratch / os.path.relpath(path, root)

    for c in p.sources:
        if c.uri.startswith("/"):
            _copy(c.uri, moved(c.uri))
    for s in p.steps:
        for code in s.run.code:
            if code.path.startswith(root + os.sep):
                _copy(code.path, moved(code.path))
    env = {**os.environ, "ROAR_HOME": str(scratch / ".roar-core")}
    for s in p.steps:
        cwd = moved(s.cwd)
        cwd.mkdir(parents=True, exist_ok=True)
        argv = [a.replace(root + os.sep, str(scratch) + os.sep) for a in s.run.command]
        done = subprocess.run([roar_core, "run", "--wait", "--job", s.run.job_name, "--",
                               *argv], cwd=cwd, env=env, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise CannotReproduce(f"{s.run.job_name} exited with {done.returncode} this time")
    out = []
    for s in p.steps:
        for uri, digest in s.outputs:
            again = moved(uri)
            try:
                got = "blake3:" + blake3_file(again)
            except OSError:
                got = None
            out.append(Outcome(uri, digest, got))
    return out


def _copy(src: str, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)


def roar_core_program() -> str:
    here = Path(sys.executable).parent / "roar-core"
    return str(here) if here.exists() else shutil.which("roar-core") or "roar-core"
