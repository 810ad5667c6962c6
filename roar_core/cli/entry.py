"""The `roar-core` console script.

`roar-core run CMD` sits in front of every traced command, so it is parsed here without
importing click (which alone costs more than the rest of a run); anything else, and any
`run` form this small parser does not know (--wait, --help), goes to the full CLI.
"""

from __future__ import annotations

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


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["run"] and (parsed := _parse_run(args[1:])) is not None:
        from roar_core.cli.run import main_fast

        main_fast(*parsed)
    from roar_core.cli.commands import main as cli_main

    cli_main()
