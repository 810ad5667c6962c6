"""`roar-core run`: trace one command as one task.

The fast path imports only light modules: the command starts within a few milliseconds
and `roar-core run` exits as soon as it has ended, handing the session to the recorder
(roar_core.handoff).  `wait=True` records in this process instead and returns the result.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from roar_core import handoff, tracer
from roar_core.config import Config
from roar_core.session import SessionCollector, run_traced


def tracer_usable(cfg: Config) -> tuple[bool, str | None]:
    """Cheap check (no probe process): the run itself shows whether the tracer worked,
    and a session that left no log is recorded as untraced by the recorder."""
    if cfg.disabled:
        return False, "roar is disabled (ROAR_DISABLED)"
    if tracer.disabled_by_env():
        return False, tracer.DISABLED_REASON
    lib = tracer.library_path()
    if not lib.is_file():
        return False, f"{lib} is missing (reinstall roar-core to build it)"
    return True, None


SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox"})
_SHELL_OPERATORS = frozenset(";&|<>()")
_NAME_WORDS = 3  # of a shell script's first command
_NAME_MAX = 60


def default_job_name(argv: list[str]) -> str:
    """The job name of a run without `--job`: the program's name; for a shell's `-c SCRIPT`
    (`sh -c "sort -rn raw.csv > clean.csv"`), the first command of the script, up to three
    words, its program by its base name (`sort -rn raw.csv`): every such run would
    otherwise be named `sh`."""
    prog = os.path.basename(argv[0]) or argv[0]
    script = _shell_script(prog, argv)
    if script is None:
        return prog
    import shlex

    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    words: list[str] = []
    try:
        for token in lexer:
            if token[0] in _SHELL_OPERATORS or len(words) == _NAME_WORDS:
                break
            if not words and "=" in token and not token.startswith("="):
                continue  # VAR=value before the command
            words.append(os.path.basename(token) if not words else token)
    except ValueError:  # unbalanced quotes: the shell will say so; name it by its start
        words = script.split()[:_NAME_WORDS]
    name = " ".join(words)[:_NAME_MAX].strip()
    return name or prog


def _shell_script(prog: str, argv: list[str]) -> str | None:
    if prog not in SHELLS:
        return None
    for i, arg in enumerate(argv[1:], 1):
        if not arg.startswith("-") or arg == "--":
            return None  # a script file, not -c
        if "c" in arg[1:] and not arg.startswith("--"):
            return argv[i + 1] if i + 1 < len(argv) else None
    return None


def run(cfg: Config, argv: list[str], job_name: str | None = None,
        tail: bool = False) -> tuple[int, Path | None, SessionCollector | None]:
    """Run argv traced; returns (returncode as subprocess reports it, session dir (None:
    none could be written, the command ran untraced), and with `tail` the collector that
    read its logs while it ran)."""
    usable, reason = tracer_usable(cfg)
    try:
        session, info = handoff.begin(cfg, argv, job_name or default_job_name(argv), usable,
                                      reason)
    except handoff.NoSession as e:  # nowhere to trace into: the command still runs
        print(f"roar-core: UNTRACED: no session can be written ({e}): this run is not "
              "recorded", file=sys.stderr)
        return _run_plain(argv), None, None
    collector = SessionCollector(session) if tail and usable else None
    try:
        rc = run_traced(argv, session if usable else None, info.run_id, tail=collector)
    except OSError as e:  # e.g. command not found: answer like a shell (127/126)
        rc = 127 if isinstance(e, FileNotFoundError) else 126
        print(f"roar-core: {argv[0]}: {e.strerror}", file=sys.stderr)
    if usable and not tail:  # `tail`: recorded right away, in this process
        try:
            handoff.capture(cfg, session)
        except Exception as e:  # the recorder takes the versions later, as best it can
            print(f"roar-core: warning: file versions not taken at the command's end: "
                  f"{type(e).__name__}: {e}", file=sys.stderr)
    try:
        handoff.end(session, rc)
    except OSError as e:  # recorded as a run whose runner died: ABORT, with its trace
        print(f"roar-core: warning: cannot write the run's end in {session}: "
              f"{e.strerror or e}", file=sys.stderr)
    return rc, session, collector


@dataclass
class RunResult:
    returncode: int  # as subprocess reports it: < 0 means killed by that signal
    recorded: object | None  # recorder.RecordedTask of this run
    error: str | None  # why its lineage could not be recorded (the command still ran)


def how_it_ended(returncode: int) -> str:
    """A subprocess-style status in words: "exit 3", "killed by SIGTERM"."""
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit {returncode}"


def run_detached(cfg: Config, argv: list[str], job_name: str | None = None) -> int:
    """`roar-core run`: the command, then a detached recorder does the rest.  The command
    runs whatever state the roar home is in: a session that cannot go there waits in the
    spare directory (handoff.begin) for a home that can be written."""
    rc, session, _ = run(cfg, argv, job_name)
    if session is None:
        return rc
    info = handoff.read_runner(session)
    if session.parent == cfg.sessions_dir:
        handoff.spawn_recorder(cfg)
        print(f"roar-core: job {info.job_name}, run {info.run_id} ({how_it_ended(rc)}): "
              f"recording in the background; `roar-core show {info.run_id}` waits for it",
              file=sys.stderr)
        failed = handoff.failures(cfg)
        if failed:  # the background recorder's failures are said where someone looks
            print(f"roar-core: warning: {len(failed)} earlier run(s) not recorded yet, kept "
                  f"to retry: {failed[-1][1]}", file=sys.stderr)
    if not info.traced:
        print(f"roar-core: UNTRACED: {info.untraced_reason}", file=sys.stderr)
    return rc


def run_untraced(argv: list[str]) -> int:
    """The kill switch (ROAR_DISABLED): the command runs, nothing is traced or recorded."""
    print("roar-core: disabled by configuration (ROAR_DISABLED): running untraced, "
          "recording nothing", file=sys.stderr)
    return _run_plain(argv)


def _run_plain(argv: list[str]) -> int:
    try:
        return run_traced(argv, None, None)
    except OSError as e:  # answer like a shell would
        print(f"roar-core: {argv[0]}: {e.strerror}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126


def main_fast(job_name: str | None, argv: list[str]) -> None:
    """`roar-core run` without the click CLI (see roar_core.entry)."""
    from roar_core import config

    try:
        cfg = config.load()
        rc = run_untraced(argv) if cfg.disabled else run_detached(cfg, argv, job_name)
    except config.ConfigError as e:
        print(f"roar-core: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    sys.stdout.flush()
    sys.stderr.flush()
    exit_like(rc)


def run_command(roar, argv: list[str], job_name: str | None = None) -> RunResult:
    """Run and record in this process (the API, `run --wait`)."""
    rc, session, collector = run(roar.config, argv, job_name, tail=True)
    if session is None:
        return RunResult(rc, None, "no session could be written (see above)")
    run_id = handoff.read_runner(session).run_id
    read = {session: collector} if collector is not None else None
    mine = [r for r in handoff.drain(roar, collected=read) if r.meta.run_id == run_id]
    return RunResult(rc, mine[0] if mine else None,
                     None if mine else "the recorder could not record this run (see above)")


def exit_like(returncode: int, *, finalize: bool = True) -> None:
    """Leave the way the command did: same exit code, or the same signal.

    `finalize=False` once everything is closed and flushed: skips the interpreter's
    teardown, which in a process that has imported SQLAlchemy and the OpenLineage client
    costs ~150 ms (a last full collection over every module's objects) for nothing."""
    if returncode < 0:
        sig = -returncode
        try:
            if sig not in (signal.SIGKILL, signal.SIGSTOP):  # no handler can be set for those
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)
        except (OSError, ValueError):
            pass
        returncode = 128 + sig  # still here: a shell's status for a death by that signal
    if not finalize:
        os._exit(returncode & 0xFF)
    raise SystemExit(returncode)
