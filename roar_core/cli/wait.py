"""`roar-core run --wait`: the run, then the recorder's answer, summarised on stderr.

Apart from `views` (the reading commands: store, lineage graphs, SQLAlchemy), because a
waited run normally needs none of that: the directory's recorder records it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from roar_core import config as config_mod
from roar_core.cli.run import RunResult, how_it_ended
from roar_core.recording import tasklog

if TYPE_CHECKING:
    from rich.progress import Progress

PROGRESS_DELAY_S = 1.0  # hashing shorter than this shows no progress bar
LIST_MAX = tasklog.SHORT_ANSWER  # files per role listed in the summary after `run`
SHORT_DIGEST = 12  # hex digits shown; the full digest is in tooltips and tables


def stderr_console() -> Console:
    # soft_wrap: a long line stays one line in a log, whatever the terminal's width.
    return Console(stderr=True, highlight=False, soft_wrap=True)


def display_path(uri: str, cwd: Path | None = None) -> str:
    """A recorded path as a person would type it here: relative when under the cwd."""
    base = str(cwd or Path.cwd()).rstrip("/") + "/"
    return uri[len(base) :] if uri.startswith(base) else uri


def short_digest(digest: str | None) -> str:
    if not digest:
        return "(no digest)"
    algo, _, hexdigest = digest.rpartition(":")
    return f"{algo or 'blake3'}:{hexdigest[:SHORT_DIGEST]}"


class HashProgress:
    """`progress(done, total)` for `Roar`: a bar on stderr once hashing has gone on for
    `delay` seconds, counted from its first report (the recorder reports per batch of files;
    none at all for quick runs, and none when stderr is not a terminal, where a bar would
    only litter logs). May be called from any thread; `close` when the run is recorded."""

    def __init__(self, console: Console, delay: float = PROGRESS_DELAY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.delay, self.clock = console, delay, clock
        self._t0: float | None = None
        self._bar: Progress | None = None
        self._task: Any = None

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if self._t0 is None:
            self._t0 = now
        if self._bar is None:
            if now - self._t0 < self.delay or done >= total or not self.console.is_terminal:
                return
            # Here, not with the module: rich.progress (its tables, spinners, fractions)
            # was ~8 ms of every `run --wait`, most of which show no bar.
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                TextColumn("roar-core: hashing"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=self.console, transient=True,
            )
            self._task = self._bar.add_task("hashing", total=total)
            self._bar.start()
        self._bar.update(self._task, completed=done, total=total)

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _listing(label: str, items: list[tuple[str, str | None]], cwd: Path,
             total: int) -> list[Text]:
    lines = [Text(f"  {label} ({total})" + (":" if total else ""))]
    shown = items[:LIST_MAX]
    for name, digest in shown:
        line = Text(f"    {display_path(name, cwd)}  ")
        line.append(short_digest(digest), style="dim")
        lines.append(line)
    if total > len(shown):
        lines.append(Text(f"    ... and {total - len(shown)} more"))
    return lines


def _uri(d: dict[str, Any]) -> str:
    """A dataset (its answer's fields) as the user names it: a path, or an object's
    s3://bucket/key."""
    ns, name = d["namespace"], d["name"]
    return f"{ns}/{name}" if ns.startswith("s3://") else name


def summary_lines(result: RunResult, job: str, cwd: Path | None = None) -> list[Text]:
    """What `run` says on stderr after the command: job, run id, status, files, problems."""
    cwd = cwd or Path.cwd()
    how = how_it_ended(result.returncode)
    rec = result.recorded
    if rec is None:
        return [
            Text(f"roar-core: {job}: {how}"),
            Text(f"roar-core: lineage NOT recorded: {result.error}", style="bold red"),
        ]
    data = rec.data
    head = Text("roar-core: ", style="bold")
    head.append(f"job {data['job_name']}, run {data['run_id']}, {rec.status} ({how})")
    lines = [head]
    if not data.get("traced", True):
        lines.append(Text(f"roar-core: UNTRACED: {data.get('untraced_reason')} -- files it "
                          "read or wrote are missing below", style="bold red"))
    # From the answer's plain fields, not Result.outputs: a Dataset made for each of 5,000
    # files (and the OpenLineage client imported for it) took 80 ms to list five.
    ins, outputs = data.get("inputs") or [], data.get("outputs") or []
    outs = [d for d in outputs if d.get("lifecycle") != "DROP"]
    gone = [d for d in outputs if d.get("lifecycle") == "DROP"]
    # A short answer (tasklog.SHORT_ANSWER files of each kind) says how many there are.
    counts = data.get("counts") or {"inputs": len(ins), "outputs": len(outs),
                                    "deleted": len(gone)}
    lines += _listing("inputs", [(_uri(d), d.get("digest")) for d in ins], cwd,
                      counts["inputs"])
    lines += _listing("outputs", [(_uri(d), d.get("digest")) for d in outs], cwd,
                      counts["outputs"])
    if counts["deleted"]:
        lines += _listing("deleted", [(_uri(d), None) for d in gone], cwd, counts["deleted"])
    if unseen := (data.get("task") or {}).get("unseen_io"):
        lines.append(Text(f"roar-core: warning: it ran {', '.join(unseen)}: its S3 transfers "
                          "are not in the lineage (only boto3/botocore's are seen)",
                          style="yellow"))
    if data.get("dropped"):
        lines.append(Text(f"roar-core: warning: {data['dropped']} trace event(s) were lost "
                          "(unreadable or torn trace logs): the file lists may be incomplete",
                          style="yellow"))
    return lines


def run_and_record(cfg: config_mod.Config, argv: list[str], job_name: str | None) -> int:
    """`run --wait`: run, wait until the run is recorded, summarise on stderr; returns the
    command's status.  The directory's recorder records it (started if none runs: forked
    by the warm fork server, it has the store and the OpenLineage client imported, which
    here would cost ~0.7 s); only where no recorder runs is it recorded in this process."""
    from roar_core.cli.commands import CliError
    from roar_core.cli.run import (
        RECORDER_START_S,
        Begun,
        answer,
        default_job_name,
        hand_off,
        result_of,
        run,
    )

    def recorded_here() -> Any:  # only where no recorder runs: the heavy imports
        from roar_core.cli.views import open_roar

        return open_roar(cfg, progress, send=False)

    from roar_core import heap

    heap.one_shot()
    err = stderr_console()
    progress = HashProgress(err)
    # The recorder is started as soon as the command has exited: it starts up (a fork, the
    # store opened) while this process takes the run's versions and writes its end (and
    # again at the end, should it have gone meanwhile).
    def recorder(begun: Begun) -> None:
        hand_off(cfg, begun.directory)

    ran = run(cfg, argv, job_name, wait=True, short_answer=True, progress=progress,
              exited=recorder, ended=recorder)
    progress.close()
    if ran.begun is None:
        result = result_of(ran)  # which says so
    else:
        roar = None  # recorded here: no sender thread, delivery is decided below
        try:
            roar = answer(ran, recorded_here, RECORDER_START_S)
            result = result_of(ran)
        except CliError as e:  # no recorder, and no store here: the run waits for one
            result = RunResult(ran.returncode, None, f"cannot record now ({e}); the run is "
                               "recorded once that is fixed (`roar-core doctor`)",
                               ran.begun.run_id)
        finally:
            progress.close()
            if roar is not None:
                from roar_core.cli.views import deliver_or_hand_off

                deliver_or_hand_off(roar, err)
    for line in summary_lines(result, job_name or default_job_name(argv)):
        err.print(line)
    return result.returncode
