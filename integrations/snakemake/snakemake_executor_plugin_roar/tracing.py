"""Attaching the tracer to a job's processes, and only to them.

shell:, script:, wrapper:, notebook: and cwl: jobs run on worker threads of the Snakemake
process, and every process they start goes through `snakemake.shell.shell`, which calls
`subprocess.Popen` with an environment it builds from `os.environ`.  Snakemake's own process
must stay untraced and `os.environ` is shared by all threads, so the job's tracer settings
(LD_PRELOAD, session dir, task tag) are kept per thread and added to the environment of the
Popen calls made from the thread that runs the job.  `snakemake.shell` reaches `subprocess`
through its module attribute `sp`; `attach()` swaps in a stand-in that forwards everything
and only edits `env` while a job is bound to the calling thread.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from roar_core.pipeline import tracer

_local = threading.local()


@dataclasses.dataclass(frozen=True)
class Binding:
    session: Path
    tag: str
    # The job's processes started here, first first: the job's pid in its lineage.
    pids: list[int] = dataclasses.field(default_factory=list, compare=False, hash=False)

    def env(self, base: dict[str, str] | os._Environ | None = None) -> dict[str, str]:
        return tracer.preload_env(self.session, tag=self.tag, base=base)


@contextmanager
def bound(binding: Binding) -> Iterator[None]:
    """Processes this thread starts through snakemake.shell while in the block are traced
    under `binding`."""
    previous = getattr(_local, "binding", None)
    _local.binding = binding
    try:
        yield
    finally:
        _local.binding = previous


def current() -> Binding | None:
    return getattr(_local, "binding", None)


class _SubprocessForJobs:
    """Stands in for the `subprocess` module inside `snakemake.shell`."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def Popen(self, *args, **kwargs):  # noqa: N802 - the name snakemake.shell calls
        binding = current()
        if binding is not None:
            kwargs["env"] = binding.env(kwargs.get("env"))
        proc = self._real.Popen(*args, **kwargs)
        if binding is not None:
            binding.pids.append(proc.pid)
        return proc


def attach() -> Callable[[], None]:
    """Route snakemake.shell's process starts through the per-thread binding; returns the
    function that undoes it."""
    # The module, not the `shell` class that the snakemake package exports by that name.
    shell_module = importlib.import_module("snakemake.shell")
    original = shell_module.sp
    if isinstance(original, _SubprocessForJobs):  # attached already (a second executor)
        return lambda: None
    shell_module.sp = _SubprocessForJobs(original)

    def detach() -> None:
        if isinstance(shell_module.sp, _SubprocessForJobs):
            shell_module.sp = original

    return detach


def run_spawned(cmd: str, binding: Binding | None) -> None:
    """Run a spawned `python -m snakemake` job command (run: and shadow jobs), traced."""
    env = binding.env() if binding is not None else None
    with subprocess.Popen(cmd, shell=True, env=env) as proc:
        if binding is not None:
            binding.pids.append(proc.pid)
        if proc.wait():
            raise subprocess.CalledProcessError(proc.returncode, cmd)
