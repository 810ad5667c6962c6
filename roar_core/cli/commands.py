"""`roar-core`: trace commands, look at what was recorded, send what is spooled.

    roar-core run [--job NAME] [--wait] -- CMD...   trace CMD as one task; exits like CMD
    roar-core show [RUN_ID|PATH]             recent runs, one run, or one file's versions
    roar-core lineage PATH|DIGEST            upstream (default) or downstream, text or JSON
    roar-core graph PATH --format html|svg|dot [-o FILE]
    roar-core flush [--timeout S]            send the OpenLineage spool backlog
    roar-core doctor                         is everything needed here working?
    roar-core env ray|airflow                shell exports that attach roar to those workers

Errors are one line, `roar-core: error: ...`, with exit code 2 for usage and configuration
(including a store the configuration points at that cannot be opened) and 1 otherwise;
ROAR_DEBUG=1 shows the traceback instead. Everything `run` itself says goes to stderr, so the
command's own output stays untouched on stdout.

This module parses arguments and imports little: `run` (without --wait) must cost the command
milliseconds, not the ~0.5 s that SQLAlchemy, Alembic, rich and openlineage take to import.
Output and the heavier setup live in `views`, imported by the commands that need it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from roar_core import config as config_mod

EXIT_FAILURE = 1
EXIT_USAGE = 2
# `run` gives the spool this long to deliver its events before exiting; what is not sent by
# then stays spooled for the next run or `roar-core flush`. Kept short: an unreachable
# backend must not make every traced command seconds slower.
CLOSE_TIMEOUT_S = 2.0
_RUN_ID_LEN = 36  # a UUID in its text form


class CliError(Exception):
    """A failure to report as one line with this exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


def _debug() -> bool:
    return os.environ.get("ROAR_DEBUG", "").lower() not in ("", "0", "false")


def _load_config() -> config_mod.Config:
    return config_mod.load()  # ConfigError: reported by main() with exit code 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="roar-core", prog_name="roar-core")
def cli() -> None:
    """Observed lineage: trace what commands really read and write, by content hash.

    Configuration: [tool.roar-core] in pyproject.toml, .roar-core/config.toml, ROAR_* variables
    (ROAR_HOME, ROAR_DATABASE_URL, ...). OpenLineage: OPENLINEAGE_URL or openlineage.yml;
    without them events go to a file under the roar home.
    """


# ---- run ------------------------------------------------------------------------------------


# Options end at the command's name (its own options are its own); an unknown option before
# it is a usage error, never the start of the command (`run --jb x -- cp a b` ran `--jb`).
@cli.command(context_settings={"allow_interspersed_args": False})
@click.option("--job", "job_name", metavar="NAME", help="Job name (default: the program's name).")
@click.option("--wait/--no-wait", default=False, show_default=True,
              help="Record before exiting and print the full summary (digests), instead of "
                   "handing the run to a background recorder and exiting as soon as the "
                   "command has (what `show`, `lineage` and `graph` see is complete either "
                   "way: they finish pending recordings first).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(job_name: str | None, wait: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND traced, as one task, and record what it read and wrote.

    COMMAND's stdout and stderr are left alone; a short summary follows on stderr.
    roar-core exits with COMMAND's exit code, or dies of the same signal.
    """
    from roar_core.cli import run as runner

    argv = list(command)
    cfg = _load_config()
    if cfg.disabled:
        rc = runner.run_untraced(argv)
    elif wait:
        from roar_core.cli.wait import run_and_record

        rc = run_and_record(cfg, argv, job_name)
    else:
        rc = runner.run_detached(cfg, argv, job_name)
    sys.stdout.flush()
    sys.stderr.flush()
    # After --wait the recorder is closed: its store, stat cache and spool are on disk.
    runner.exit_like(rc, finalize=not wait)


# ---- show, lineage, graph ---------------------------------------------------------------------


@cli.command()
@click.argument("target", required=False, metavar="[RUN_ID|PATH]")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=1),
              help="How many recent runs to list.")
def show(target: str | None, limit: int) -> None:
    """List recent task runs, or show one run, or the recorded versions of one file."""
    from roar_core.cli import views

    cfg = _load_config()
    if target is None:
        views.drain_pending(cfg)
        if views.store_missing(cfg):
            click.echo(f"no task runs recorded yet (no store at {views.store_location(cfg)})")
            return
    with views.read_store(cfg) as store:
        if target is None:
            views.show_runs(store, limit)
            return
        run_ = store.task_run(target) if len(target) == _RUN_ID_LEN else None
        if run_ is not None:
            views.show_run(store, run_)
            return
        key = views.lineage_key(target, store)
        history = store.accesses_of_uri(key)
        if not history:
            raise CliError(f"no task run or file recorded as {views.shown(target)} ({key})")
        views.warn_if_changed(target, key, history[-1][0].digest)
        views.show_file(key, history)


@cli.command()
@click.argument("key", metavar="PATH|DIGEST")
@click.option("--upstream/--downstream", default=True,
              help="Where it came from (default), or what was made from it.")
@click.option("--depth", type=click.IntRange(min=0), metavar="N",
              help="Stop N task runs away (default: no limit).")
@click.option("--json", "as_json", is_flag=True, help="LineageGraph.to_dict() as JSON.")
def lineage(key: str, upstream: bool, depth: int | None, as_json: bool) -> None:
    """Ancestry (or descendants) of a file or a content digest, linked by content hash."""
    from roar_core.cli import views

    g = views.query(_load_config(), key, ["upstream" if upstream else "downstream"], depth)
    if as_json:
        click.echo(json.dumps(g.to_dict(), indent=2))
    else:
        click.echo("\n".join(views.tree_lines(g)))


@cli.command()
@click.argument("key", metavar="PATH|DIGEST|RUN")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
def verify(key: str, as_json: bool) -> None:
    """Whether a file's recorded lineage (or a run's files) still holds on disk, and which
    outputs are stale because a version they derive from changed. Exit 1 if any is."""
    from roar_core.cli import views

    report = views.verify(_load_config(), key)
    _answer(as_json, report.to_dict, lambda: views.verify_lines(report), report.ok)


def _answer(as_json: bool, data: Callable[[], Any], lines: Callable[[], list[str]],
            ok: bool) -> None:
    """A checking command's answer, as JSON or text (rich markup: colours on a terminal);
    exit 1 when what it checks is not so."""
    if as_json:
        click.echo(json.dumps(data(), indent=2, default=str))
    else:
        from rich.console import Console

        console = Console(highlight=False, soft_wrap=True)
        for line in lines():
            console.print(line)
    if not ok:
        sys.exit(1)


@cli.command()
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--json", "as_json", is_flag=True, help="The differences as JSON.")
def diff(a: str, b: str, as_json: bool) -> None:
    """What differs between two task runs (run ids, or the runs that produced two versions
    of a file: paths or digests): inputs, outputs, code, parameters, environment, machine.
    Exit 1 when they differ."""
    from roar_core.cli import views

    d = views.diff(_load_config(), a, b)
    _answer(as_json, d.to_dict, lambda: views.diff_lines(d), d.same)


@cli.command()
@click.argument("key", metavar="PATH|DIGEST")
@click.option("--run", "do_run", is_flag=True,
              help="Re-execute the pipeline (of `roar-core run` commands) in a scratch "
                   "directory and compare the outputs' digests.")
@click.option("--scratch", type=click.Path(file_okay=False, path_type=Path),
              help="Where to re-execute (default: a new temporary directory).")
@click.option("--json", "as_json", is_flag=True, help="The plan (and outcome) as JSON.")
def reproduce(key: str, do_run: bool, scratch: Path | None, as_json: bool) -> None:
    """The plan to make a file again: its runs in order, with commands, code, inputs (still
    there?) and environment; `--run` does it. Exit 1 when an output came out different."""
    from roar_core.cli import views

    plan, outcome, where = views.reproduce(_load_config(), key, do_run, scratch)

    def data() -> dict:
        d = plan.to_dict()
        if outcome is not None:
            d["scratch"] = str(where)
            d["outcome"] = [{"uri": o.uri, "recorded": o.recorded, "again": o.again,
                             "identical": o.identical} for o in outcome]
        return d

    _answer(as_json, data, lambda: views.reproduce_lines(plan, outcome, where),
            outcome is None or all(o.identical for o in outcome))


@cli.command()
@click.argument("key", metavar="RUN|PATH|DIGEST")
@click.option("--format", "fmt", type=click.Choice(["ro-crate", "prov"]), required=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="ro-crate: the crate's directory; prov: the PROV-JSON file.")
@click.option("--license", "license_url", metavar="URL",
              help="The crate's license (an SPDX URL, for instance).")
def export(key: str, fmt: str, output: Path, license_url: str | None) -> None:
    """A run, or a file's recorded lineage, as a Workflow Run RO-Crate (Process Run Crate
    profile) or W3C PROV-JSON."""
    from roar_core.cli import views

    written = views.export(_load_config(), key, fmt, output, license_url)
    print(f"roar-core: wrote {fmt} of {views.shown(key)} to {views.shown(str(written))}",
          file=sys.stderr)


GRAPH_FORMATS = ("dot", "html", "svg")  # roar_core.cli.graph.FORMATS, without importing it here


@cli.command()
@click.argument("key", metavar="PATH|DIGEST")
@click.option("--format", "fmt", type=click.Choice(GRAPH_FORMATS), default="html",
              show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="File to write (default: stdout).")
@click.option("--direction", type=click.Choice(["upstream", "downstream", "both"]),
              default="both", show_default=True)
@click.option("--depth", type=click.IntRange(min=0), metavar="N")
def graph(key: str, fmt: str, output: Path | None, direction: str, depth: int | None) -> None:
    """A picture of a file's lineage: self-contained HTML, SVG, or Graphviz DOT."""
    from roar_core.cli import graph as graph_mod
    from roar_core.cli import views

    directions = ["upstream", "downstream"] if direction == "both" else [direction]
    g = views.query(_load_config(), key, directions, depth)
    text = graph_mod.FORMATS[fmt](g)
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        views.write_atomically(output, text)
    except OSError as e:
        raise CliError(f"cannot write {output}: {e.strerror or e}") from e
    print(f"roar-core: wrote {fmt} lineage graph of {views.shown(key)} ({len(g.runs)} runs, "
          f"{len(g.artifacts)} files) to {views.shown(str(output))}", file=sys.stderr)


# ---- flush, doctor --------------------------------------------------------------------------


@cli.command()
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(min=0),
              metavar="S", help="Give up after S seconds; the rest stays spooled.")
def flush(timeout: float) -> None:
    """Send the OpenLineage events still in the spool. Exit 0 when none is left."""
    from roar_core.cli import views
    from roar_core.pipeline.spool import Spool

    cfg = _load_config()
    views.drain_pending(cfg, required=False)  # runs being recorded have events to spool
    if not os.path.isdir(cfg.spool_dir):
        click.echo("sent 0, pending 0")
        return
    # The same transport as `run`; a bare Spool would hold the events when nothing is
    # configured, where `run` writes them to the embedded default file.
    spool = Spool(cfg.spool_dir, client=views.ol_client(cfg), start=False)
    try:
        result = spool.flush(timeout)
    finally:
        spool.close()
    click.echo(f"sent {result.sent}, pending {result.pending}")
    if result.pending:
        raise CliError(f"{result.pending} event(s) not delivered; they stay in {cfg.spool_dir}")


# Engines whose long-lived workers are started with the tracer attached: the module that
# knows which environment variables their launchers need.
ENGINE_ENV = {"ray": "roar_ray", "airflow": "roar_airflow"}


@cli.command()
@click.argument("engine", type=click.Choice(sorted(ENGINE_ENV)))
def env(engine: str) -> None:
    """Print the shell exports that attach roar to ENGINE's workers.

    For a shell that only starts them (`eval "$(roar-core env ray)"` before `ray start`):
    every later command of that shell is traced too.  `roar-core exec` starts one
    process with them instead.
    """
    click.echo(_engine_module(engine).shell_exports(), nl=False)


def _engine_module(engine: str):  # noqa: ANN202 (roar_ray or roar_airflow)
    import importlib

    try:
        return importlib.import_module(ENGINE_ENV[engine])
    except ImportError as e:
        raise CliError(f"roar's {engine} integration needs {engine}: "
                       f'pip install "roar-core[{engine}]" ({e})', EXIT_USAGE) from e


@cli.command("exec", context_settings={"allow_interspersed_args": False})
@click.option("--engine", type=click.Choice(sorted(ENGINE_ENV)),
              help="Whose processes CMD starts (default: CMD's program name).")
@click.argument("command", nargs=-1, required=True, metavar="-- CMD...")
def exec_(engine: str | None, command: tuple[str, ...]) -> None:
    """Start CMD, an engine's long-lived process, with roar attached to it and to every
    process it starts: `roar-core exec -- airflow scheduler`, `roar-core exec -- ray start
    --head`.  The environment is `roar-core env ENGINE`'s, for CMD only: the shell it is
    typed in stays untraced."""
    engine = engine or os.path.basename(command[0])
    if engine not in ENGINE_ENV:
        raise CliError(f"cannot tell which engine {command[0]!r} is: name it with --engine "
                       f"({', '.join(sorted(ENGINE_ENV))})", EXIT_USAGE)
    from roar_core.pipeline import tracer

    env = tracer.with_changes(_engine_module(engine).exports(), os.environ)
    sys.stdout.flush()
    # Python ignores these (exec keeps what is ignored); a shell's command, and one
    # subprocess starts, gets them back at their defaults.
    import signal

    ignored = {s: signal.signal(s, signal.SIG_DFL) for s in (signal.SIGPIPE, signal.SIGXFSZ)}
    try:
        os.execvpe(command[0], list(command), env)  # CMD is this process from here on
    except OSError as e:
        for signum, handler in ignored.items():
            signal.signal(signum, handler)
        raise CliError(f"{command[0]}: {e.strerror}", 127 if isinstance(
            e, FileNotFoundError) else 126) from e


@cli.command()
def doctor() -> None:
    """Check the tracer, the store, OpenLineage and the spool. Exit 1 if one is broken."""
    from roar_core.cli import views

    checks = [views.check_tracer()]
    try:
        cfg = _load_config()
    except config_mod.ConfigError as e:
        views.print_checks([*checks, ("config", "FAIL", str(e))])
        raise SystemExit(EXIT_USAGE) from None
    off = " (DISABLED: nothing is recorded)" if cfg.disabled else ""
    checks += [
        ("config", "ok", f"project {cfg.project_root}, home {cfg.home}, "
                         f"namespace {cfg.namespace}{off}"),
        views.check_hasher(cfg),
        views.check_home(cfg),
        views.check_store(cfg),
        views.check_openlineage(cfg),
        views.check_spool(cfg),
        views.check_sessions(cfg),
    ]
    views.print_checks(checks)
    if any(status == "FAIL" for _, status, _ in checks):
        raise SystemExit(EXIT_FAILURE)


# ---------------------------------------------------------------------------------------------
# Entry point


def _fail(message: str, code: int) -> NoReturn:
    sys.stdout.flush()
    print(f"roar-core: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(code)


def _report(e: Exception) -> NoReturn:
    """One line and an exit code for anything a command raised."""
    from roar_core.pipeline.store_records import StoreError
    from roar_core.pipeline.tracelog import TraceLogError

    if isinstance(e, CliError):
        _fail(str(e), e.code)
    if isinstance(e, config_mod.ConfigError):
        _fail(str(e), EXIT_USAGE)
    if isinstance(e, StoreError | TraceLogError):
        _fail(str(e), EXIT_FAILURE)
    if isinstance(e, OSError):
        _fail(f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else ""), EXIT_FAILURE)
    _fail(f"internal error: {type(e).__name__}: {' '.join(str(e).split())} "
          "(ROAR_DEBUG=1 shows the traceback)", EXIT_FAILURE)


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2


def main(argv: list[str] | None = None) -> None:
    debug = _debug()
    logging.basicConfig(format="%(message)s", level=logging.WARNING, stream=sys.stderr)
    if debug:
        for name in ("roar", "roar_core"):
            logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        rc = cli.main(args=argv, prog_name="roar-core", standalone_mode=False)
    except _NO_ARGS_IS_HELP as e:  # bare `roar-core`: the help, as click prints it
        click.echo(e.format_message())
        raise SystemExit(EXIT_USAGE) from None
    except click.UsageError as e:
        # One line, like every other error (click's own is three: usage, hint, error).
        where = f"roar-core {e.ctx.info_name}" if e.ctx and e.ctx.parent else "roar-core"
        _fail(f"{' '.join(e.format_message().split())} (see `{where} --help`)", EXIT_USAGE)
    except click.ClickException as e:
        _fail(" ".join(e.format_message().split()), e.exit_code)
    except click.Abort:
        _fail("aborted", EXIT_FAILURE)
    except Exception as e:
        if debug:
            raise
        _report(e)
    raise SystemExit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
