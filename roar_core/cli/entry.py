"""The `roar-core` console script.

`roar-core run CMD` sits in front of every traced command, so it is parsed here without
importing click (which alone costs more than the rest of a run); anything else, and any
`run` form this small parser does not know (--wait, --help), goes to the full CLI.
"""

from __future__ import annotations

import os
import sys


def _parse_run(args: list[str]) -> tuple[str | None, list[str]] | None:
    """(job, command) for `run [--job NAME] [--no-wait] [--] CMD...`, else None."""
    job = None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return (job, args[i + 1:]) if i + 1 < len(args) else None
        if a == "--job" and i + 1 < len(args):
            job, i = args[i + 1], i + 2
        elif a.startswith("--job="):
            job, i = a[len("--job="):], i + 1
        elif a == "--no-wait":
            i += 1
        elif a.startswith("-"):
            return None
        else:
            return job, args[i:]  # options end at the command (as in the click CLI)
    return None


def _hold_closed_stdio() -> None:
    """A standard descriptor we were started without (`cmd 2>&-`, a daemon's closed
    stdin) stays closed for the command, as it would be untraced, and roar's own words
    for it go nowhere: it is held by /dev/null, close-on-exec, for this process alone.
    Python leaves such a stream None: roar's messages to stderr went into the command's
    stdout (`print(file=None)`), and a flush of it failed the run as exit 1."""
    streams = (sys.stdin, sys.stdout, sys.stderr)
    if all(s is not None for s in streams):  # (Python found every descriptor valid)
        return
    for fd, (name, mode) in enumerate((("stdin", "r"), ("stdout", "w"), ("stderr", "w"))):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        # The lowest free descriptor: this one (those below it are open, or held already),
        # so no file roar opens later takes its place.
        held = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        if streams[fd] is None:
            setattr(sys, name, open(held, mode, closefd=False))  # noqa: SIM115 - for life


def main() -> None:
    _hold_closed_stdio()
    args = sys.argv[1:]
    if args[:1] == ["run"] and (parsed := _parse_run(args[1:])) is not None:
        from roar_core.cli.run import main_fast

        main_fast(*parsed)
    from roar_core.cli.commands import main as cli_main

    cli_main()
