"""What the `roar-core` commands print, and the heavier setup they need (store, recorder).

Kept apart from `commands.py`, which only parses arguments, so that `roar-core run --no-wait`
never imports rich, SQLAlchemy or openlineage: `commands.py` imports this module inside the
commands that need it.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from roar_core import config as config_mod
from roar_core.cli import graph as graph_mod
from roar_core.cli.commands import CLOSE_TIMEOUT_S, EXIT_USAGE, CliError
from roar_core.cli.wait import display_path, short_digest, stderr_console
from roar_core.lineage import LineageGraph, RunNode, digest_prefix, is_digest
from roar_core.pipeline.classification import display_name
from roar_core.pipeline.store import (
    DB_FILENAME,
    AccessRecord,
    Store,
    StoreError,
    TaskRunRecord,
    connect_read_only,
)

# A backlog this small is sent before `run --wait` exits (a few ms of the client's time).
INLINE_DELIVERY_BYTES = 256 * 1024
ROLE_VERBS = {
    "output": "written by",
    "input": "read by",
    "deleted": "deleted by",
    "transient": "made and removed by",
}

# ---------------------------------------------------------------------------------------------
# Small helpers


def print_table(table: Table) -> None:
    # Piped output is for grep and scripts: wide enough that rows are never folded or cut,
    # without the padding rich adds to the last column.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 1000)
    with console.capture() as captured:
        console.print(table)
    click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def shown(arg: str) -> str:
    """A command-line argument fit to print: undecodable bytes as \\xNN, like recorded names."""
    return display_name(os.fsencode(arg))


def lineage_key(arg: str, store: Any = None) -> str:
    """What the store knows a file by: a digest or URI as given, a digest prefix completed
    (with `store`: unique, else an error), a path made absolute with symlinks resolved and
    undecodable bytes escaped the way the tracer records names.  Hex that names an existing
    file is that file, unless written `blake3:...`."""
    if is_digest(arg) or "://" in arg:
        return arg
    prefix = digest_prefix(arg)
    if prefix is not None and store is not None and (
            arg.startswith("blake3:") or not os.path.lexists(arg)):
        found = store.complete_digest(prefix)
        if len(found) == 1:
            return found[0]
        if found:
            raise CliError(f"digest prefix {arg} is ambiguous (more than one recorded "
                           "version starts with it): give more digits")
        if arg.startswith("blake3:"):
            raise CliError(f"no recorded version has a digest starting with {arg}")
    return display_name(os.fsencode(os.path.realpath(arg)))


def when(dt: datetime | None) -> str:
    return dt.astimezone().strftime("%Y-%m-%d %H:%M:%S") if dt else "-"


def size_text(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def status_text(run: TaskRunRecord) -> str:
    if run.exit_code is None:
        return run.status
    if run.exit_code < 0:
        return f"{run.status} ({run.error_message or f'signal {-run.exit_code}'})"
    return f"{run.status} (exit {run.exit_code})"


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def write_atomically(path: Path, text: str) -> None:
    # A reader (a browser reloading the page) never sees half a file, and a failed write
    # leaves the previous one in place.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        # mkstemp makes it 0600: the mode any file gets here (the user's umask), so a page
        # written for others to open can be opened.
        mask = os.umask(0)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------
# Store, recorder, OpenLineage client


def ol_client(cfg: config_mod.Config, create: bool = True) -> Any:
    """The client `roar-core run` sends with (the same choice as the API's default)."""
    from roar_core.api import default_client

    try:
        return default_client(cfg, create)
    except Exception as e:  # bad openlineage.yml, unknown transport...: the user's to fix
        raise CliError(f"cannot set up the OpenLineage client: {one_line(e)}", EXIT_USAGE) from e


def store_location(cfg: config_mod.Config) -> str:
    if cfg.database_url is None:
        return os.path.join(cfg.home, DB_FILENAME)
    from sqlalchemy.engine import make_url

    try:
        return make_url(cfg.database_url).render_as_string(hide_password=True)
    except Exception:  # unparsable: say so without echoing what may hold a password
        return "(unparsable database_url)"


def store_missing(cfg: config_mod.Config) -> bool:
    return cfg.database_url is None and not os.path.isfile(os.path.join(cfg.home, DB_FILENAME))


def open_roar(cfg: config_mod.Config, progress: Callable[[int, int], None] | None = None,
              send: bool = True) -> Any:
    """The recorder, or a one-line error (exit 2) before any command runs: recording needs it."""
    from roar_core.api import Roar

    try:
        # First, so that an unusable home is reported as such, not as whatever part of the
        # setup happens to touch it first.
        os.makedirs(cfg.home, exist_ok=True)
        client = ol_client(cfg) if cfg.emit else None
        return Roar(cfg, client=client, progress=progress, send=send)
    except StoreError as e:
        raise CliError(str(e), EXIT_USAGE) from e
    except OSError as e:
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(cfg.home) else ""
        raise CliError(f"cannot use roar home {cfg.home}: {e.strerror or e}{where}",
                       EXIT_USAGE) from e


def home_read_only(cfg: config_mod.Config) -> bool:
    """The roar home is there and cannot be written (a read-only mount, another user's):
    reading commands read its store as it is."""
    return os.path.isdir(cfg.home) and not os.access(cfg.home, os.W_OK | os.X_OK)


def drain_pending(cfg: config_mod.Config, required: bool = True) -> None:
    """Record the runs that `roar-core run` left to the recorder and that are not recorded
    yet, so that what a reading command shows is complete: here, or by waiting for the
    recorder that is at it.  `required=False` (flush: the events already spooled go out
    whatever the store's state): a store that cannot be opened is a warning, and the runs
    stay pending."""
    from roar_core.cli.run import adopt_old_runs, log_dirs, pending
    from roar_core.recording import recorder, tasklog

    if home_read_only(cfg):
        waiting = len(pending(cfg))
        if waiting:
            stderr_console().print(
                f"roar-core: warning: {waiting} run(s) not recorded yet: the roar home "
                f"{cfg.home} cannot be written; they are recorded once it can be",
                style="yellow", highlight=False, soft_wrap=True)
        return
    adopt_old_runs(cfg)
    dirs = [d for d in log_dirs(cfg) if tasklog.log_paths(d)]
    if not dirs:
        return
    try:
        roar = open_roar(cfg)
    except CliError as e:
        if required:
            raise
        stderr_console().print(f"roar-core: warning: runs waiting to be recorded stay so: "
                               f"{e}", style="yellow", highlight=False, soft_wrap=True)
        return
    try:
        for d in dirs:
            # Here, unless the directory's recorder runs: then until it has recorded what
            # was there when we looked (or has exited: then here).
            while recorder.drain(roar, d) is None and recorder.wait_recorded(
                    [d], time.monotonic() + 0.25):
                pass
    finally:
        roar.close(timeout=CLOSE_TIMEOUT_S)


@contextmanager
def read_store(cfg: config_mod.Config) -> Iterator[Store]:
    """The store, for commands that only read: a missing SQLite file is not created."""
    drain_pending(cfg)
    if store_missing(cfg):
        raise CliError("nothing recorded yet: no lineage store at "
                       f"{os.path.join(cfg.home, DB_FILENAME)}")
    try:
        store = Store.open(url=cfg.database_url, home=cfg.home, read_only=home_read_only(cfg))
    except StoreError as e:
        raise CliError(str(e), EXIT_USAGE) from e
    try:
        yield store
    finally:
        store.close()


# ---------------------------------------------------------------------------------------------
# run


def deliver_or_hand_off(roar: Any, err: Console) -> None:
    """Close the recorder; send a small backlog now, hand a big one to a background sender.

    `--wait` waits for the lineage to be stored and durably spooled.  Delivering takes the
    OpenLineage client ~50 µs per dataset (its serializer walks every facet), which a run
    with thousands of files would spend with the user waiting on a transport: that backlog
    goes to the detached recorder process instead, which sends it and exits.
    """
    from roar_core.cli.run import hand_off
    from roar_core.pipeline import spoolfiles

    backlog = spoolfiles.pending_bytes(roar.spool.directory) if roar.spool else 0
    if backlog <= INLINE_DELIVERY_BYTES:
        roar.close(timeout=CLOSE_TIMEOUT_S)
        return
    roar.close(timeout=0)
    hand_off(roar.config, roar.config.sessions_dir)  # its recorder sends the spool
    err.print(f"roar-core: sending {size_text(backlog)} of OpenLineage events in the "
              "background (`roar-core flush` waits for them)", style="dim")


# ---------------------------------------------------------------------------------------------
# show


def show_runs(store: Store, limit: int) -> None:
    runs = store.task_runs(limit=limit)
    if not runs:
        click.echo("no task runs recorded yet")
        return
    table = Table(box=None, pad_edge=False)
    for col in ("started", "job", "status", "in", "out", "traced", "run id"):
        table.add_column(col, no_wrap=True, justify="right" if col in ("in", "out") else "left")
    for r in runs:
        roles = [a.role for a in store.accesses_of(r.run_id)]
        table.add_row(
            when(r.started_at), Text(r.job_name), Text(status_text(r)),
            str(roles.count("input")), str(roles.count("output")),
            "yes" if r.traced else Text("NO", style="bold red"), r.run_id,
        )
    print_table(table)


def show_run(store: Store, r: TaskRunRecord) -> None:
    lines = [
        f"run       {r.run_id}",
        f"job       {r.job_name}  (engine {r.engine}, namespace {r.namespace})",
        f"status    {status_text(r)}",
        f"started   {when(r.started_at)}" + (
            f"  ({(r.ended_at - r.started_at).total_seconds():.2f} s)" if r.ended_at else ""),
        f"host      {r.host}, pid {r.pid}",
        f"command   {shlex.join(r.command) if r.command else '-'}",
        "traced    yes" if r.traced else f"traced    NO: {r.untraced_reason}",
    ]
    if r.dropped_events:
        lines.append(f"lost      {r.dropped_events} trace event(s): file lists may be incomplete")
    if r.workflow_run_id:
        lines.append(f"workflow  {r.workflow_run_id}")
    if r.error_message and r.status != "COMPLETE":
        lines.append(f"error     {r.error_message}")
    lines.append(f"code ({len(r.code)})")
    lines += [f"  {c.path}  {graph_mod.short_digest(c.digest)}" for c in r.code]
    accesses = store.accesses_of(r.run_id)
    for role in ("input", "output", "deleted", "transient"):
        mine = [a for a in accesses if a.role == role]
        if not mine and role in ("deleted", "transient"):
            continue
        lines.append(f"{role}s ({len(mine)})")
        lines += [_access_line(a) for a in mine]
    click.echo("\n".join(lines))


def _access_line(a: AccessRecord) -> str:
    line = f"  {a.uri}"
    if a.digest:
        line += f"  {a.digest}  {size_text(a.size)}"
    elif a.note:
        line += f"  version unknown: {a.note}"
    return line


def show_file(key: str, history: list[tuple[AccessRecord, TaskRunRecord]]) -> None:
    versions: dict[str | int | None, list[tuple[AccessRecord, TaskRunRecord]]] = {}
    for i, (a, r) in enumerate(history):
        # Each unknown version apart: nothing says two of them were the same.
        versions.setdefault(a.digest or (i if a.note else None), []).append((a, r))
    lines = [key]
    for digest, uses in versions.items():
        size = next((a.size for a, _ in uses if a.size is not None), None)
        if isinstance(digest, int):
            lines.append(f"  version unknown: {uses[0][0].note}")
        else:
            title = digest or "(no content: deleted or transient)"
            lines.append(f"  version {title}" + (f"  {size_text(size)}" if digest else ""))
        for a, r in uses:
            lines.append(f"    {ROLE_VERBS.get(a.role, a.role):<19} {r.job_name}  "
                         f"{status_text(r)}  {when(r.started_at)}  run {r.run_id}")
    click.echo("\n".join(lines))


# ---------------------------------------------------------------------------------------------
# lineage and graph


def query(cfg: config_mod.Config, arg: str, directions: list[str],
          depth: int | None) -> LineageGraph:
    with read_store(cfg) as store:
        key = lineage_key(arg, store)
        graphs = [store.lineage(key, d, depth, cfg.match_min_size)  # type: ignore[arg-type]
                  for d in directions]
    g = graph_mod.merge(graphs)
    if g.root is None:
        what = shown(arg) if shown(arg) == key else f"{shown(arg)} ({key})"
        raise CliError(f"no lineage recorded for {what}")
    warn_if_changed(arg, key, g.artifacts[g.root].digest if g.root in g.artifacts else None)
    return g


def run_or_lineage_key(arg: str, store: Store) -> str:
    """A recorded run's id as given; anything else as `lineage_key` reads it."""
    from roar_core.ids import looks_like_run_id

    if looks_like_run_id(arg) and store.task_run(arg) is not None:
        return arg
    return lineage_key(arg, store)


def verify(cfg: config_mod.Config, arg: str):
    """`roar-core verify`'s report (roar_core.cli.verify)."""
    from roar_core.cli import verify as verify_mod
    from roar_core.pipeline.capture import hasher_for

    with read_store(cfg) as store:
        key = run_or_lineage_key(arg, store)
        with hasher_for(cfg, stat_cache=not home_read_only(cfg)) as hasher:
            report = verify_mod.verify(store, hasher, key, cfg.match_min_size)
    if not report.checked:  # 2, not 1: exit 1 says something no longer holds
        raise CliError(f"no lineage recorded for {shown(arg)}", EXIT_USAGE)
    return report


_STATUS_STYLE = {"ok": "green", "changed": "bold red", "missing": "bold red",
                 "not checked": "dim"}


def esc(text: str) -> str:
    """Text of the user's (a path, a command) inside rich markup: printed as it is."""
    from rich.markup import escape

    return escape(text)


def verify_lines(report) -> list[str]:
    from roar_core.cli import verify as verify_mod

    cwd = Path.cwd()
    width = max(len(display_path(c.uri, cwd)) for c in report.checked)
    lines = []
    for c in report.checked:
        style = _STATUS_STYLE.get(c.status, "")
        line = (f"  [{style}]{c.status.upper():<11}[/] {esc(display_path(c.uri, cwd)):<{width}}"
                f"  [dim]{short_digest(c.recorded)}[/]")
        if c.now:
            line += f" -> now {short_digest(c.now)}"
        lines.append(line)
    if report.stale:
        lines.append("[bold yellow]stale[/] (derived from a version that changed or is gone):")
        for st in report.stale:
            lines.append(f"  [yellow]{esc(display_path(st.uri, cwd))}[/]  "
                         f"[dim]{short_digest(st.digest)}[/]  written by {esc(st.job_name)} "
                         f"({st.run_id}), from "
                         + ", ".join(esc(display_path(b, cwd)) for b in st.because))
    n = {k: sum(c.status == k for c in report.checked) for k in (
        verify_mod.OK, verify_mod.CHANGED, verify_mod.MISSING)}
    lines.append(f"roar-core: {len(report.checked)} version(s) checked: {n['ok']} ok, "
                 f"{n['changed']} changed, {n['missing']} missing; {len(report.stale)} stale "
                 "output(s)")
    return lines


def diff(cfg: config_mod.Config, a: str, b: str):
    """`roar-core diff`'s comparison (roar_core.cli.diff)."""
    from roar_core.cli import diff as diff_mod

    with read_store(cfg) as store:
        keys = [run_or_lineage_key(k, store) for k in (a, b)]
        try:
            return diff_mod.diff(store, *keys)
        except diff_mod.NoRun as e:  # 2, not 1: exit 1 says the runs differ
            raise CliError(str(e), EXIT_USAGE) from None


def diff_lines(d) -> list[str]:
    cwd = Path.cwd()

    def shown_value(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, str) and v.startswith("blake3:"):
            return short_digest(v)
        if isinstance(v, dict) and "digest" in v:  # a script: digest, commit, dirty
            text = short_digest(v["digest"])
            if v.get("commit"):
                text += f" at {v['commit'][:12]}" + (" (dirty)" if v.get("dirty") else "")
            return text
        if isinstance(v, list):
            return " ".join(map(str, v))
        return str(v)

    lines = [f"[bold]A[/]  {esc(d.a.job_name)}  {d.a.run_id}  {when(d.a.started_at)}",
             f"[bold]B[/]  {esc(d.b.job_name)}  {d.b.run_id}  {when(d.b.started_at)}"]
    for section, changes in d.sections.items():
        if not changes:
            continue
        lines.append(f"[bold]{section}:[/]")
        for c in changes:
            mark = "[green]+[/]" if c.a is None else "[red]-[/]" if c.b is None else (
                "[yellow]~[/]")
            name = esc(display_path(c.name, cwd))
            lines.append(f"  {mark} {name}  {esc(shown_value(c.a))} -> "
                         f"{esc(shown_value(c.b))}")
    if d.same:
        lines.append("roar-core: no difference")
    return lines


def reproduce(cfg: config_mod.Config, arg: str, do_run: bool, scratch: Path | None):
    """`roar-core reproduce`'s plan, and its outcome when run (roar_core.cli.reproduce)."""
    import tempfile

    from roar_core.cli import reproduce as rep
    from roar_core.pipeline.capture import hasher_for

    with read_store(cfg) as store:
        key = lineage_key(arg, store)
        with hasher_for(cfg, stat_cache=not home_read_only(cfg)) as hasher:
            plan = rep.plan(store, hasher, key, cfg.match_min_size)
    if not plan.steps:
        raise CliError(f"no recorded run produced {shown(arg)}", EXIT_USAGE)
    if not do_run:
        return plan, None, None
    where = scratch or Path(tempfile.mkdtemp(prefix="roar-reproduce-"))
    try:
        return plan, rep.rerun(plan, where, rep.roar_core_program()), where
    except rep.CannotReproduce as e:
        raise CliError(f"cannot reproduce {shown(arg)}: {e}") from None


def reproduce_lines(plan, outcome, where) -> list[str]:
    cwd = Path.cwd()
    lines = []
    for n, s in enumerate(plan.steps, 1):
        r = s.run
        lines.append(f"[bold]{n}. {esc(r.job_name)}[/]  ({r.engine}, run {r.run_id})")
        if r.command:
            lines.append(f"   command  {esc(' '.join(r.command))}")
        if s.cwd:
            lines.append(f"   in       {esc(s.cwd)}")
        for c in r.code:
            at = f"  {c.repo} at {c.commit[:12]}" + (" (dirty)" if c.dirty else "") if (
                c.commit) else ""
            lines.append(f"   code     {esc(display_path(c.path, cwd))}  "
                         f"{short_digest('blake3:' + c.digest.removeprefix('blake3:'))}"
                         f"{esc(at)}")
        for i in s.inputs:
            state = "" if i.status == "ok" else (
                f"  [bold red]{esc('[' + i.status.upper() + ']')}[/]")
            lines.append(f"   input    {esc(display_path(i.uri, cwd))}  "
                         f"{short_digest(i.recorded)}" + state)
        for uri, digest in s.outputs:
            lines.append(f"   output   {esc(display_path(uri, cwd))}  {short_digest(digest)}")
        if r.environment.get("environment"):
            lines.append(f"   python environment {short_digest(r.environment['environment'])}"
                         f", machine {short_digest(r.environment.get('machine'))}")
    if outcome is not None:
        lines.append(f"re-executed in {esc(str(where))}:")
        for o in outcome:
            verdict = "[green]identical[/]" if o.identical else (
                "[bold red]NOT MADE[/]" if o.again is None else
                f"[bold red]DIFFERS[/]: {short_digest(o.again)}")
            lines.append(f"  {esc(display_path(o.uri, cwd))}  {short_digest(o.recorded)}  "
                         f"{verdict}")
        same = sum(o.identical for o in outcome)
        lines.append(f"roar-core: {same} of {len(outcome)} output(s) identical")
    return lines


def export(cfg: config_mod.Config, arg: str, fmt: str, output: Path,
           license_url: str | None) -> Path:
    """`roar-core export` (roar_core.cli.export): the file it wrote."""
    from roar_core.cli import export as export_mod
    from roar_core.cli import reproduce as rep
    from roar_core.pipeline.capture import hasher_for

    with read_store(cfg) as store:
        if store.task_run(arg) is not None:
            plan = export_mod.run_plan(store, arg)
        else:
            key = lineage_key(arg, store)
            with hasher_for(cfg, stat_cache=not home_read_only(cfg)) as hasher:
                plan = rep.plan(store, hasher, key, cfg.match_min_size)
    if not plan.steps:
        raise CliError(f"no recorded run produced {shown(arg)}", EXIT_USAGE)
    try:
        if fmt == "ro-crate":
            return export_mod.ro_crate(plan, output, license_url)
        return export_mod.prov_json(plan, output)
    except export_mod.MissingLibrary as e:
        raise CliError(str(e), EXIT_USAGE) from None
    except OSError as e:
        raise CliError(f"cannot write {shown(str(output))}: {e.strerror or e}") from None


def warn_if_changed(arg: str, key: str, recorded: str | None) -> None:
    """The lineage of a file is that of its last recorded version: say so on stderr when
    the file there now has other content, or is gone (one read of the file; read-only)."""
    from roar_core.pipeline.hashing import blake3_file

    if recorded is None or key != lineage_key(arg) or "://" in key or is_digest(key):
        return  # a digest, a URI, or a prefix: names content, not what is there now
    try:
        now = "blake3:" + blake3_file(arg)
    except FileNotFoundError:
        why = "it no longer exists"
    except OSError:
        return
    else:
        if now == recorded:
            return
        why = f"it now holds {graph_mod.short_digest(now)}"
    stderr_console().print(
        f"roar-core: warning: {shown(arg)} has changed since it was recorded ({why}): this "
        f"is the lineage of the recorded version, {graph_mod.short_digest(recorded)}",
        markup=False)


def _node_label(g: LineageGraph, node_id: str, cwd: Path) -> str:
    node = g.runs.get(node_id) or g.artifacts[node_id]
    if isinstance(node, RunNode):
        return f"run {node.job_name}  {node.status}  {node.run_id}"
    return f"{display_path(node.uri, cwd)}  {graph_mod.short_digest(node.digest)}"


def tree_lines(g: LineageGraph, cwd: Path | None = None) -> list[str]:
    """An indented tree from the root: producers under a file and a run's inputs under it
    (upstream), or readers under a file and a run's outputs under it (downstream). A node
    reached again is expanded once and marked "(see above)" after that."""
    cwd = cwd or Path.cwd()
    if g.root is None:
        return []
    children: dict[str, list[str]] = {}
    inferred: set[str] = set()  # reached through an inferred edge: said on its line
    for e in g.edges:
        parent, child = (e.target, e.source) if g.direction == "upstream" else (e.source, e.target)
        children.setdefault(parent, []).append(child)
        if e.kind == "inferred":
            inferred.add(child)
    for kids in children.values():
        kids.sort(key=lambda n: _node_label(g, n, cwd))
    lines = [_node_label(g, g.root, cwd)]
    expanded = {g.root}
    # Iterative depth-first walk: long pipelines must not hit the recursion limit.
    top = children.get(g.root, [])
    stack = [(k, "", i == len(top) - 1) for i, k in enumerate(top)][::-1]
    while stack:
        node, prefix, last = stack.pop()
        branch = "└── " if last else "├── "
        label = _node_label(g, node, cwd)
        if node in inferred:
            label += "  [inferred: equal content, copy not observed]"
        if node in expanded and children.get(node):
            lines.append(f"{prefix}{branch}{label}  (see above)")
            continue
        expanded.add(node)
        lines.append(f"{prefix}{branch}{label}")
        kids = children.get(node, [])
        inner = prefix + ("    " if last else "│   ")
        stack.extend((k, inner, i == len(kids) - 1) for i, k in reversed(list(enumerate(kids))))
    return lines


# ---------------------------------------------------------------------------------------------
# doctor

Check = tuple[str, str, str]  # (what, "ok" | "warn" | "FAIL", detail)


def print_checks(checks: list[Check]) -> None:
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column()
    colours = {"ok": "green", "warn": "yellow", "FAIL": "bold red"}
    for what, status, detail in checks:
        table.add_row(what, Text(status, style=colours[status]), Text(detail))
    print_table(table)


def check_tracer() -> Check:
    from roar_core.pipeline import tracer

    st = tracer.status()
    return "tracer", "ok" if st.usable else "FAIL", st.reason


def check_hasher(cfg: config_mod.Config) -> Check:
    from roar_core.pipeline import nativehash

    if not cfg.native_hash:
        return "hashing", "ok", "in Python (native_hash is off)"
    if nativehash.load() is None:
        # Correct, only slower for many small files: a warning, not a failure.
        return "hashing", "warn", (f"in Python: {nativehash.library_path()} is missing "
                                   "(reinstall with cargo on PATH to build it)")
    return "hashing", "ok", f"native batch hasher {nativehash.library_path()}"


def check_home(cfg: config_mod.Config) -> Check:
    """Whether the roar home takes a write (a full disk passes every permission check)."""
    if not os.path.exists(cfg.home):
        return "home", "ok", f"{cfg.home} (not created yet; the first run will)"
    try:
        with tempfile.NamedTemporaryFile(dir=cfg.home, prefix=".doctor-") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return "home", "FAIL", (f"{cfg.home} cannot be written ({e.strerror or e}): runs "
                                "wait in memory until it can")
    return "home", "ok", str(cfg.home)


def check_store(cfg: config_mod.Config) -> Check:
    where = store_location(cfg)
    if store_missing(cfg):
        # Not created by a check: say whether the first run will be able to.
        d = cfg.home
        while not os.path.exists(d) and d != os.path.dirname(d):
            d = os.path.dirname(d)
        if os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK):
            return "store", "ok", f"sqlite {where} (not created yet; the first run will)"
        return "store", "FAIL", f"sqlite {where} cannot be created: {d} is not a writable dir"
    read_only = home_read_only(cfg)
    try:
        Store.open(url=cfg.database_url, home=cfg.home, read_only=read_only).close()
    except StoreError as e:
        return "store", "FAIL", str(e)
    if cfg.database_url is None:
        damage = _sqlite_damage(os.path.join(cfg.home, DB_FILENAME))
        if damage:
            return "store", "FAIL", (f"sqlite {where} is damaged ({damage}): runs wait to be "
                                     "recorded until it is repaired or moved away")
    kind = "sqlite" if cfg.database_url is None else "database"
    if read_only:
        return "store", "ok", f"{kind} {where} (read-only: show, lineage and graph read it)"
    return "store", "ok", f"{kind} {where}"


def _sqlite_damage(path: Path) -> str | None:
    """SQLite's own quick check of every page (opening a file reads only its first)."""
    import sqlite3

    try:
        with closing(connect_read_only(path)) as db:
            rows = db.execute("PRAGMA quick_check(3)").fetchall()
    except sqlite3.Error as e:
        return str(e)
    problems = [r[0] for r in rows if r[0] != "ok"]
    return "; ".join(problems) or None


def check_openlineage(cfg: config_mod.Config) -> Check:
    if not cfg.emit:
        return "openlineage", "warn", "emission off (emit = false): no events are spooled or sent"
    try:
        # Nothing created: a .roar-core/ made here would make this directory the project root
        # of every later command below it.
        client = ol_client(cfg, create=False)
    except CliError as e:
        return "openlineage", "FAIL", str(e)
    where = describe_transport(client.transport)
    down = unreachable(client.transport)
    if down:
        return "openlineage", "FAIL", f"{where}: cannot connect ({down}); events wait in the spool"
    return "openlineage", "ok", where


def unreachable(transport: Any, timeout: float = 2.0) -> str | None:
    """Why an HTTP transport's server (each of a composite's) takes no connection, or
    None.  A connection only: sending a test event would put it in the user's lineage."""
    import socket
    from urllib.parse import urlsplit

    kind = getattr(transport, "kind", None)
    if kind == "composite":
        return next((why for t in transport.transports if (why := unreachable(t, timeout))),
                    None)
    if kind != "http":
        return None
    parts = urlsplit(str(getattr(transport, "url", "")))
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "localhost", port), timeout=timeout).close()
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def describe_transport(transport: Any) -> str:
    """Which transport the client uses and where it sends, with no credential in it."""
    kind = getattr(transport, "kind", None) or type(transport).__name__
    if kind == "http":
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(str(getattr(transport, "url", "")))
        netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")  # no user:pw@
        return f"http transport to {urlunsplit(parts._replace(netloc=netloc, query=''))}"
    if kind == "file":
        return f"file transport to {transport.config.log_file_path}"
    if kind == "composite":
        inner = ", ".join(describe_transport(t) for t in transport.transports)
        return f"composite transport: {inner}"
    if kind == "console":
        return "console transport (events are logged, not sent anywhere)"
    if kind == "noop":
        return "noop transport (OPENLINEAGE_DISABLED): events are dropped"
    return f"{kind} transport"


def check_spool(cfg: config_mod.Config) -> Check:
    from roar_core.pipeline.spoolfiles import REJECTED, pending_count

    if not os.path.isdir(cfg.spool_dir):
        return "spool", "ok", f"empty ({cfg.spool_dir} not created yet)"
    n = pending_count(cfg.spool_dir)
    detail = f"{n} event(s) pending in {cfg.spool_dir}"
    rejected = os.path.join(cfg.spool_dir, REJECTED)
    if os.path.isfile(rejected):
        with open(rejected, "rb") as f:
            detail += f"; {sum(1 for _ in f)} set aside as undeliverable in {rejected}"
        return "spool", "warn", detail
    return "spool", "warn" if n else "ok", detail + (" (roar-core flush sends them)" if n else "")


def check_sessions(cfg: config_mod.Config) -> Check:
    from roar_core.cli.run import failures, pending, spare_dir

    waiting = pending(cfg)
    failed = failures(cfg)
    spare = spare_dir(cfg)
    kept = sum(1 for d, _ in waiting if d == spare)
    detail = f"{len(waiting)} run(s) waiting for the background recorder"
    if kept:
        detail += f", {kept} of them kept in {spare} until the home can be written"
    if failed:
        detail += (f"; {len(failed)} could not be recorded yet and will be retried (last: "
                   f"{failed[-1][1]})")
    return "recorder", "warn" if failed or kept else "ok", detail
