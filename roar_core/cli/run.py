"""`roar-core run`: trace one command as one task.

The runner is a producer like an engine's worker (roar_core.recording): it appends the
run's begin to its task log in the home's sessions directory, runs the command into a
tracer session of its own there, takes the versions of the files it read and wrote as it
ends, appends its end with them, and leaves the rest to the directory's recorder process,
started if none runs; `roar-core run` then exits like its command.  `run --wait` and
`run_command` record in this process instead when no recorder holds the directory, or wait
for its answer.  Every command that reads lineage records what is pending first.

The fast path imports only light modules, and paths are strings (pathlib and its
urllib.parse cost ~4 ms to import): the command starts within a few milliseconds.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from roar_core.config import Config
from roar_core.pipeline import tracer
from roar_core.recording import tasklog
from roar_core.recording.sessions import SessionCollector, run_traced
from roar_core.recording.tasklog import Given, TaskLog
from roar_core.slotted import Slotted

TYPE_CHECKING = False  # not typing's (see roar_core.slotted)
if TYPE_CHECKING:  # imported when a run touched files: not on `roar-core run true`'s path
    from typing import Any

    from roar_core.pipeline.capture import Capture, WhileRunning
    from roar_core.pipeline.classification import PathFilter
    from roar_core.pipeline.hashing import Hasher

RUN_PREFIX = "run-"  # a run's own tracer session, in the log's directory
RECORDER_IDLE_S = 2.0  # the recorder waits this long for the next run before it exits


def tracer_usable(cfg: Config) -> tuple[bool, str | None]:
    """Cheap check (no probe process): the run itself shows whether the tracer worked,
    and a session that left no log is recorded as untraced by the recorder."""
    if cfg.disabled:
        return False, "roar is disabled (ROAR_DISABLED)"
    if tracer.disabled_by_env():
        return False, tracer.DISABLED_REASON
    lib = tracer.library_path()
    if not os.path.isfile(lib):
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


def log_dirs(cfg: Config) -> list[str]:
    """Where `roar-core run`'s task logs are: under the home, and in the spare directory."""
    spare = spare_dir(cfg)
    return [cfg.sessions_dir] if spare is None else [cfg.sessions_dir, spare]


def spare_dir(cfg: Config) -> str | None:
    """Where runs go while the roar home cannot be written: this user's in-memory
    directory, one per home.  It outlives the processes (not a reboot), and the sweep of
    stale in-memory sessions leaves it alone."""
    from roar_core.recording.sessions import SPARE_PREFIX, memory_sessions_dir

    memory = memory_sessions_dir()
    if memory is None:
        return None
    import zlib  # not hashlib: ~2.6 ms to import, on every `roar-core run`

    home = os.fsencode(cfg.home)
    return os.path.join(memory, f"{SPARE_PREFIX}{zlib.crc32(home):08x}{zlib.adler32(home):08x}")


class NoSession(OSError):
    """Neither the roar home nor the spare directory can take a run: it runs untraced."""


class Begun(Slotted):
    """A run whose begin is in a task log."""

    __slots__ = ("run_id", "job_name", "log", "own", "traced", "untraced_reason")

    def __init__(self, run_id: str, job_name: str, log: TaskLog, own: str, traced: bool,
                 untraced_reason: str | None = None) -> None:
        self.run_id = run_id
        self.job_name = job_name
        self.log = log
        self.own = own  # its tracer session
        self.traced = traced
        self.untraced_reason = untraced_reason

    @property
    def directory(self) -> str:
        return self.log.directory


_logs: dict[str, TaskLog] = {}  # this process's task log in each directory


def _task_log(directory: str) -> TaskLog:
    log = _logs.get(directory)
    if log is None or log.pid != os.getpid():
        log = _logs[directory] = TaskLog(directory, warn=False)
    return log


def _drop_log(directory: str) -> None:
    log = _logs.pop(directory, None)
    if log is None:
        return
    try:
        if os.fstat(log._fd).st_size == 0:  # not even its header: nothing to follow
            os.unlink(log.path)
    except OSError:
        pass
    log.close()


def begin(cfg: Config, argv: list[str], job_name: str, traced: bool,
          untraced_reason: str | None = None) -> Begun:
    """A run's begin, in the task log under the roar home, its tracer session in memory
    (`memory_for_traces`) or beside the log; where the home cannot be written (a full
    disk, a read-only mount), in the spare directory (`spare_dir`), recorded once the home
    can be written again.  NoSession: nowhere."""
    from roar_core.ids import host_name, new_run_id

    meta = {"run_id": new_run_id(), "engine": "cli", "namespace": cfg.namespace,
            "job_name": job_name, "started_at": tasklog.now_iso(),
            "command": list(argv), "host": host_name(), "pid": os.getpid(),
            "traced": traced, "untraced_reason": untraced_reason, "cwd": os.getcwd()}
    own_name = f"{RUN_PREFIX}{os.urandom(16).hex()}"
    problems = []
    from roar_core.recording import recorder

    # The run's tracer logs go in memory where there is room, its task log under the home:
    # every traced process makes, maps and leaves a log, and on a disk file system that
    # goes through its journal (measured, ext4: a shell loop of 100 `cat`s took 103 ms,
    # 220 under `roar-core run` with them under the home, 192 with them in memory).  The
    # end line holds all the recorder needs of a run that ended; a restart of the machine
    # during the run loses only the partial trace of the run it killed, recorded ABORT
    # all the same.
    memory = memory_for_traces()
    for base in log_dirs(cfg):
        own = os.path.join(base, own_name)
        try:
            log = _task_log(base)
            # (The spare directory's runs keep theirs beside them: they wait for the home.)
            own = _trace_dir(own, memory if base == cfg.sessions_dir else None)
            # The configuration this run is recorded with, before its begin line: a
            # recorder running there takes it up before it can read the run's end (written
            # after the end, a pass in between recorded the run with the settings before).
            recorder.write_settings(base, cfg, idle_exit_s=RECORDER_IDLE_S, replace=True)
            log.begun(meta, own_dir=own_name if os.path.dirname(own) == base else own)
            if not log.ok:
                raise OSError(f"cannot write {log.path}")
        except OSError as e:
            problems.append(f"{base}: {e.strerror or e}")
            _drop_log(base)
            try:
                os.rmdir(own)
            except OSError:
                pass
            continue
        if problems:
            print(f"roar-core: warning: cannot write the roar home ({problems[0]}); this run "
                  f"is kept in {base} and recorded once the home can be written",
                  file=sys.stderr)
        return Begun(meta["run_id"], job_name, log, own, traced, untraced_reason)
    raise NoSession("; ".join(problems))


# A run's tracer logs go in memory only where this much of it is free: ~12,000 short
# processes' logs (the shim allocates a log's pages on tmpfs, 20 KiB for a few records, and
# drops what a full one cannot hold), where a container's /dev/shm has 64 MiB.
MEMORY_FREE_MIN = 256 << 20


def memory_for_traces() -> str | None:
    """The in-memory sessions directory, if it has room for a run's tracer logs."""
    from roar_core.recording.sessions import memory_sessions_dir

    memory = memory_sessions_dir()
    if memory is None:
        return None
    try:
        st = os.statvfs(memory)
    except OSError:
        return None
    return memory if st.f_bavail * st.f_frsize >= MEMORY_FREE_MIN else None


def _trace_dir(beside_log: str, memory: str | None) -> str:
    """The run's tracer session, made: in `memory` if it can be made there."""
    if memory is not None:
        in_memory = os.path.join(memory, os.path.basename(beside_log))
        try:
            os.mkdir(in_memory)
            return in_memory
        except OSError:
            pass
    os.mkdir(beside_log)
    return beside_log


class Ran(Slotted):
    __slots__ = ("returncode", "begun", "read", "wait_fd")

    def __init__(self, returncode: int, begun: Begun | None, read: Given | None = None,
                 wait_fd: int | None = None) -> None:
        self.returncode = returncode  # as subprocess reports it: < 0: killed by that signal
        self.begun = begun  # None: nowhere to write the run, it ran untraced
        self.read = read  # its session as read here, and the versions taken
        self.wait_fd = wait_fd


def run(cfg: Config, argv: list[str], job_name: str | None = None, *,
        roar: Any = None, wait: bool = False, short_answer: bool = False,
        progress: Callable[[int, int], None] | None = None,
        exited: Callable[[Begun], None] | None = None,
        ended: Callable[[Begun], None] | None = None) -> Ran:
    """Run argv traced and log its begin and end; its logs are read while it runs (the
    records classified and the files written hashed meanwhile: `WhileRunning`, made once
    it has touched a file where no one waits: `OnceTouched`).  `wait`: someone waits for
    the run to be recorded (`answer`): its end asks for the recorder's answer
    (`short_answer`: listing a few files of each kind, with counts);
    `roar`: that someone may record it in this process, its files are hashed with roar's
    hasher; `progress`: of the hashing, without one; `exited(begun)`: called as soon as the
    command has exited, before its versions are taken (a recorder started then starts up
    meanwhile); `ended(begun)`: called once its end is written, or could not be (to start
    the recorder), before the stat cache is written."""
    wait = wait or roar is not None
    usable, reason = tracer_usable(cfg)
    try:
        begun = begin(cfg, argv, job_name or default_job_name(argv), usable, reason)
    except NoSession as e:  # nowhere to trace into: the command still runs
        print(f"roar-core: UNTRACED: no session can be written ({e}): this run is not "
              "recorded", file=sys.stderr)
        return Ran(_run_plain(argv), None)
    collector = SessionCollector(begun.own) if usable else None
    stat_cache = begun.directory == cfg.sessions_dir
    running: WhileRunning | OnceTouched | None = None
    if collector is not None and roar is None:
        running = (_while_running(cfg, stat_cache) if wait
                   else OnceTouched(lambda: _while_running(cfg, stat_cache)))
    try:
        rc = run_traced(argv, begun.own if usable else None, begun.run_id,
                        tail=collector, running=running)
    except OSError as e:  # e.g. command not found: answer like a shell (127/126)
        rc = 127 if isinstance(e, FileNotFoundError) else 126
        print(f"roar-core: {argv[0]}: {e.strerror}", file=sys.stderr)
    if isinstance(running, OnceTouched):
        running = running.made  # None: the command ended before it touched a file
    if exited is not None:
        exited(begun)
    if running is not None:
        running.ended()  # (its hashing goes on beside what follows)
    read = captured = summary = None
    hasher = None
    if collector is not None:
        try:
            whole = collector.read_whole(running.seen if running is not None else None)
            if running is not None:
                running.ended()  # and what the logs' rest made due
            taken, hasher = capture_now(cfg, whole.events.records, roar,
                                        stat_cache=stat_cache, progress=progress,
                                        running=running)
            read = Given(whole, taken)
            if taken is not None:
                from roar_core.pipeline.capture import to_dict

                captured = to_dict(taken)
                summary = tasklog.read_summary(whole)
        except Exception as e:  # the recorder takes the versions later, as best it can
            print(f"roar-core: warning: file versions not taken at the command's end: "
                  f"{type(e).__name__}: {e}", file=sys.stderr)
    note_missing_hasher()
    status, error = _outcome(rc)
    fd = begun.log.ended(begun.run_id, status, error=error, exit_code=rc, captured=captured,
                         read=summary, wait=wait, short_answer=short_answer)
    if ended is not None:
        ended(begun)
    if hasher is None and running is not None and running.hasher is not None:
        hasher = running.hasher  # the end had nothing to hash: its cache is still held
    if hasher is not None:
        # The stat cache entries of the files hashed, written while the recorder reads the
        # end (5,000 files: ~10 ms), and before this returns: the next command of the shell
        # finds them.
        hasher.close()
    if not begun.log.ok:  # recorded as a run whose runner died: ABORT, with its trace
        print(f"roar-core: warning: cannot write the run's end in {begun.log.path}",
              file=sys.stderr)
    return Ran(rc, begun, read, fd)


def note_missing_hasher() -> None:
    """An installation built without cargo has no native batch hasher, and pip shows no
    build output: said on the first run of each user and installation (a stamp in the
    user's cache), not only by `doctor`."""
    import zlib

    from roar_core.pipeline import nativehash

    lib = nativehash.library_path()
    if os.path.exists(lib):
        return

    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    stamp = os.path.join(cache, "roar-core", f"no-hasher-{zlib.crc32(os.fsencode(lib)):08x}")
    if os.path.exists(stamp):
        return
    print("roar-core: note: this installation has no native batch hasher (it was built "
          "without cargo): many small files are hashed in Python, slower. Install Rust "
          "(https://rustup.rs) and reinstall, or install a prebuilt wheel.", file=sys.stderr)
    try:
        os.makedirs(os.path.dirname(stamp), exist_ok=True)
        open(stamp, "x").close()
    except OSError:
        pass


def _outcome(rc: int) -> tuple[str, str | None]:
    if rc == 0:
        return "COMPLETE", None
    return "FAIL", how_it_ended(rc).replace("exit ", "exit code ", 1)


def _capture_tools(cfg: Config, stat_cache: bool) -> tuple[PathFilter, Hasher]:
    """The runner's path filter, and a hasher holding its stat cache's new entries until
    it is closed (see `capture_now`)."""
    from roar_core.pipeline import capture
    from roar_core.pipeline.classification import PathFilter

    keep = PathFilter.for_config(cfg)  # first: nothing to close should it fail
    hasher = capture.hasher_for(cfg, stat_cache=stat_cache)
    hasher.hold_cache()
    return keep, hasher


class OnceTouched(Slotted):
    """A `WhileRunning` for a run no one waits for, made by the runner's tail at its first
    read of the command's logs that finds a file touched: its imports (~45 ms of the
    capture's modules), classification and hashing then go on while the command runs, on
    the core it leaves free, not between its end and the shell's next command (where a
    command writing one file spent them).  A command that has ended before (`true`, or
    anything done within the tail's first 10 ms) is captured at its end as before."""

    __slots__ = ("make", "made", "_before")

    def __init__(self, make: Callable[[], WhileRunning]) -> None:
        self.make = make
        self.made: WhileRunning | None = None
        self._before: list = []  # records read before: the classification needs them all

    def seen(self, records: list) -> None:
        if self.made is None:
            from roar_core.pipeline.tracelog import LINEAGE_OPS

            self._before += records
            if not any(r.op in LINEAGE_OPS for r in records):
                return
            self.made = self.make()
            records, self._before = self._before, []
        self.made.seen(records)

    def work(self, stop: Callable[[], bool], until: float) -> None:
        if self.made is not None:
            self.made.work(stop, until)


def _while_running(cfg: Config, stat_cache: bool) -> WhileRunning:
    """What is taken while the command runs, with the filter and hasher `capture_now`
    would make (and then uses), made once first needed."""
    from roar_core.pipeline.capture import WhileRunning

    return WhileRunning(lambda: _capture_tools(cfg, stat_cache))


def capture_now(cfg: Config, records: list, roar: Any = None, stat_cache: bool = True,
                progress: Callable[[int, int], None] | None = None,
                running: WhileRunning | None = None
                ) -> tuple[Capture | None, Hasher | None]:
    """The run's file versions, taken now that its command has ended and before `roar-core
    run` returns to the shell: the next command may rewrite or delete them at once, and
    the recorder, running later, must record what this one left (roar_core.pipeline.capture).
    `roar`: with its hasher (and progress); else with one of `cfg`'s, its stat cache on disk
    unless `stat_cache=False` (the home cannot be written), returned holding the cache's
    new entries: close it once the run's end is logged.  `running`: what was taken while
    the command ran (its hasher is the one used and returned)."""
    from roar_core.pipeline.tracelog import LINEAGE_OPS

    if not any(r.op in LINEAGE_OPS for r in records):
        return None, None  # nothing to hash (`true`): the recorder finds that too
    from roar_core.pipeline import capture

    if roar is not None:
        rec = roar.writer
        return capture.capture(records, rec.keep, rec.hasher, progress=rec.progress), None
    if running is not None:  # its hasher: closed by run()
        hasher = running.tools()[1]
        return capture.versions(running.classified(records), hasher, progress=progress,
                                early=running.found), hasher
    keep, hasher = _capture_tools(cfg, stat_cache)
    try:
        return capture.capture(records, keep, hasher, progress=progress), hasher
    except BaseException:
        hasher.close()
        raise


def adopt_old_runs(cfg: Config) -> int:
    """Runs that a roar-core before the task log left unrecorded (`run-*/runner.json`, a
    session of their own each, ended or whose runner died): each gets a task log of its
    own, with its begin and end, for the recorder to record like any run (an upgrade loses
    nothing).  Returns how many."""
    from roar_core.ids import host_name
    from roar_core.recording.sessions import pid_alive

    adopted = 0
    host = host_name()
    for base in log_dirs(cfg):
        try:
            with os.scandir(base) as entries:
                found = [e.path for e in entries if e.name.startswith(RUN_PREFIX)]
        except OSError:
            continue
        for d in found:
            try:
                info = _read_json(d, "runner.json")
                done = _read_json(d, "task.json", optional=True)
                if done is None and (info["host"] != host or pid_alive(int(info["pid"]))):
                    continue  # its command still runs (under the older roar-core)
                meta = {"run_id": info["run_id"], "engine": "cli", "namespace": cfg.namespace,
                        "job_name": info["job_name"], "started_at": info["started_at"],
                        "command": info["argv"], "host": info["host"], "pid": info["pid"],
                        "traced": info["traced"], "untraced_reason": info.get("untraced_reason")}
                end = None
                if done is not None:
                    from datetime import datetime  # here: most homes have no old runs

                    rc = int(done["returncode"])
                    status, error = _outcome(rc)
                    end = tasklog.end_entry(
                        info["run_id"], status, error=error, exit_code=rc,
                        ended_at=datetime.fromisoformat(done["ended_at"]),
                        captured=_read_json(d, "capture.json", optional=True))
                name = os.path.basename(d)
                tasklog.write_gone(base, f"adopted-{name}", info["pid"], info["host"],
                                   meta, name, end)
                os.rename(os.path.join(d, "runner.json"),
                          os.path.join(d, "runner.json.adopted"))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            adopted += 1
    return adopted


def _read_json(directory: str, name: str, optional: bool = False) -> Any:
    """A JSON file of an old run's directory (`optional`: None where it has none)."""
    import json

    try:
        with open(os.path.join(directory, name), "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        if not optional:
            raise
        return None


def hand_off(cfg: Config, directory: str | None = None) -> None:
    """Have the recorder of the home's sessions directory record what is there (started if
    none runs), with this configuration; and that of the spare directory, where runs wait
    that were made while the home could not be written."""
    from roar_core.recording import recorder

    for d in [directory] if directory is not None else log_dirs(cfg):
        if d != cfg.sessions_dir and not tasklog.log_paths(d):
            continue
        try:
            os.makedirs(d, exist_ok=True)
            recorder.write_settings(d, cfg, idle_exit_s=RECORDER_IDLE_S, replace=True)
            recorder.ensure(d)
        except OSError as e:
            print(f"roar-core: warning: cannot start the recorder in {d}: {e.strerror or e}",
                  file=sys.stderr)


def pending(cfg: Config) -> list[tuple[str, tasklog.Outstanding]]:
    """Runs ended (or whose runner died) and not recorded yet, with their directory."""
    return [(base, t) for base in log_dirs(cfg) for t in tasklog.outstanding(base)
            if t.ended or t.dead]


def failures(cfg: Config) -> list[tuple[str, str]]:
    """Runs whose last attempt to be recorded failed, and why (for `doctor`)."""
    return [(t.run_id, t.error) for _, t in pending(cfg) if t.error]


class RunResult(Slotted):
    __slots__ = ("returncode", "recorded", "error", "run_id")

    def __init__(self, returncode: int, recorded: tasklog.Result | None, error: str | None,
                 run_id: str | None = None) -> None:
        self.returncode = returncode  # as subprocess reports it: < 0: killed by that signal
        self.recorded = recorded  # what the recorder said of this run
        self.error = error  # why its lineage could not be recorded (the command still ran)
        self.run_id = run_id


def how_it_ended(returncode: int) -> str:
    """A subprocess-style status in words: "exit 3", "killed by SIGTERM"."""
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit {returncode}"


def run_detached(cfg: Config, argv: list[str], job_name: str | None = None) -> int:
    """`roar-core run`: the command, then the recorder process does the rest.  The command
    runs whatever state the roar home is in: a run that cannot go there waits in the
    spare directory (`begin`) for a home that can be written."""
    def ended(begun: Begun) -> None:
        if begun.directory == cfg.sessions_dir:
            adopt_old_runs(cfg)
            hand_off(cfg)

    ran = run(cfg, argv, job_name, ended=ended)
    begun = ran.begun
    if begun is None:
        return ran.returncode
    if begun.directory == cfg.sessions_dir:
        print(f"roar-core: job {begun.job_name}, run {begun.run_id} "
              f"({how_it_ended(ran.returncode)}): recording in the background; "
              f"`roar-core show {begun.run_id}` waits for it", file=sys.stderr)
        failed = failures(cfg)
        if failed:  # the background recorder's failures are said where someone looks
            print(f"roar-core: warning: {len(failed)} earlier run(s) not recorded yet, kept "
                  f"to retry: {failed[-1][1]}", file=sys.stderr)
    if not begun.traced:
        print(f"roar-core: UNTRACED: {begun.untraced_reason}", file=sys.stderr)
    return ran.returncode


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
    """`roar-core run` without the click CLI (see roar_core.cli.entry)."""
    from roar_core import config, heap

    heap.one_shot()

    try:
        cfg = config.load()
        rc = run_untraced(argv) if cfg.disabled else run_detached(cfg, argv, job_name)
    except config.ConfigError as e:
        print(f"roar-core: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    sys.stdout.flush()
    sys.stderr.flush()
    if rc >= 0 and threading.active_count() == 1:
        # The recorder process records the run: nothing of roar's is left to close or
        # flush here, and the interpreter's teardown of every module imported cost ~7 ms
        # of each run (of ~56 for these imports and Python's start, here).  Exit handlers
        # registered by whoever embeds this (none of roar's) still run, as at any exit.
        import atexit

        atexit._run_exitfuncs()
        exit_like(rc, finalize=False)
    exit_like(rc)


def run_command(roar, argv: list[str], job_name: str | None = None) -> RunResult:
    """Run and record (the API): in this process, or by the directory's recorder when one
    is running."""
    ran = run(roar.config, argv, job_name, roar=roar)
    if ran.begun is not None:
        answer(ran, lambda: roar)
    return result_of(ran)


# A recorder just started (forked) takes its directory's lock within milliseconds; one
# started from a fresh interpreter, within a second.  Until then the run is not recorded
# here, which would import what the recorder already has.
RECORDER_START_S = 3.0


def answer(ran: Ran, get_roar: Callable[[], Any], recorder_start_s: float = 0.0) -> Any:
    """Wait until the run is recorded: by the directory's recorder while one holds the
    directory (or may still take it, `recorder_start_s`), else here, with `get_roar()`.
    Returns the Roar this used, or None."""
    from roar_core.pipeline.spoolfiles import NotSynced
    from roar_core.recording import recorder

    begun = ran.begun
    assert begun is not None
    log, run_id = begun.log, begun.run_id
    given = {run_id: ran.read} if ran.read is not None else None
    roar = None
    until = time.monotonic() + recorder_start_s
    try:
        while log.results.get(run_id) is None:
            if time.monotonic() < until or recorder.running(begun.directory):
                log.wait_for(run_id, ran.wait_fd, 0.05, keep=True)
                continue
            roar = roar or get_roar()
            try:
                drained = recorder.drain(roar, begun.directory, given=given)
            except NotSynced as e:  # stored, not marked: its events are spooled again
                from roar_core.cli.commands import CliError

                raise CliError(str(e)) from None
            if drained is not None:
                log.read_results()
                break
    finally:
        log.done_waiting(run_id, ran.wait_fd)
    return roar


def result_of(ran: Ran) -> RunResult:
    """What the recorder answered of an `answer`ed run."""
    begun = ran.begun
    if begun is None:
        return RunResult(ran.returncode, None, "no session could be written (see above)")
    log, run_id = begun.log, begun.run_id
    said = log.results.get(run_id)
    if said is not None and said.get("ok") and all(log.results.values()):
        log.remove()  # every run it holds is recorded
        _drop_log(begun.directory)
    if not said or not said.get("ok"):
        why = (said or {}).get("error") or "the recorder could not record this run"
        return RunResult(ran.returncode, None, f"{why} (kept, to retry)", run_id)
    return RunResult(ran.returncode, tasklog.Result(said), None, run_id)


def _no_core() -> None:
    """No core of our own as we die of the command's signal (SIGSEGV, SIGABRT, ^\\): it
    replaced the command's, in the same file where the pattern is `core`, as coreutils'
    timeout knows."""
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (OSError, ValueError):
        pass


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
            _no_core()
            os.kill(os.getpid(), sig)
        except (OSError, ValueError):
            pass
        returncode = 128 + sig  # still here: a shell's status for a death by that signal
    if not finalize:
        os._exit(returncode & 0xFF)
    raise SystemExit(returncode)
