"""The recorder: one process per session directory, following the producers' task logs
(roar_core.recording.follower) and recording every task -- classification, hashing,
store, spool -- off the producers.

A producer that finds none running starts it (`ensure`); a lock in the directory keeps it
to one, and the settings it records with are in the directory (`recorder.json`, written by
the first producer), so any producer, or a later recorder, starts the same one.  It runs at
the lowest CPU priority (the tasks come first), untraced, in a session of its own (nobody's
child: an engine's clean-up of a dying worker's children leaves it alone), and exits once
every producer of the directory is gone or closed and all they ran is recorded.  Killed,
it is resumed by the next one from the marks in the task logs.  Its events are delivered by
a child process of its own (`Sender`): recording and answering never wait on the
OpenLineage backend.

    python -m roar_core.recording.recorder DIRECTORY
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import sys
import threading
import time

from roar_core.lazylog import LazyLogger
from roar_core.recording import tasklog
from roar_core.recording.sessions import lock_held, no_wakeup_preemption, yield_cpu

TYPE_CHECKING = False  # not typing's (see roar_core.slotted)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    Dir = str | os.PathLike[str]

log = LazyLogger(__name__)

LOCK = "recorder.lock"
SETTINGS = "recorder.json"
ENDING = "job-ending"  # written at the end of a job: `lifetime` tasks dying now simply ended
LOG = "recorder.log"
STATUS = "recorder.status"  # when the last pass that held nothing back began (time.time())
START_DIR = "ROAR_START_DIR"  # the working directory a detached process enters (see below)
# The store's write-ahead log is copied into the database (`Store.checkpoint`; tasks'
# commits do not, see `Store.open`) once no task was recorded for QUIET_S, and at most every
# CHECKPOINT_S while tasks keep ending (where anything was written since): one after each
# small task would copy and fsync its few pages each time, where SQLite's waits for 1,000.
QUIET_S = 1.0
CHECKPOINT_S = 2.0
SEND_EVERY_S = 0.25  # how often a recorder of several nodes' workflow moves its mark on
FINAL_SEND_S = 30.0  # as the recorder exits: how long its sender tries to deliver what is left
# While tasks keep ending, the spool is synced once a second, not once a pass: on a
# journaling file system every fsync also writes out the files the tasks just wrote, and
# the tasks wait on that (measured: Ray io10 on ext4 1.14 with a sync per pass, 1.08
# without).  An OS crash may lose the last second of events; the task logs, in memory,
# go with it anyway.  A task a producer waits for is synced at once.
SYNC_S = 1.0
PASS_S = 0.05  # idle: how soon a task that ended is found (no producer woke us)
# While tasks keep ending: passes this far apart unless a producer waits (it wakes us).  A
# pass has fixed costs (the logs listed and read, a store commit, the spool looked at): a
# Snakemake job ends every ~20 ms here, and at 0.05 s apart each pass recorded ~4 jobs,
# at 2.6 ms of recorder CPU per job; at 0.25 s, ~17 jobs and 2.1 ms.
BUSY_PASS_S = 0.25
HOLD_START_S = 1.0  # a task ended within it: its START recorded with its end
IDLE_EXIT_S = 5.0  # with every task log done: how long to wait for a new producer first
SWITCH_S = 0.0005  # the recorder's threads' GIL switch interval (sys.setswitchinterval)
_SPAWN_LOCK = threading.Lock()


def running(directory: Dir) -> bool:
    return lock_held(os.path.join(directory, LOCK))


def write_settings(directory: Dir, cfg, internal: list[str] | tuple[str, ...] = (),
                   order: str | None = None, idle_exit_s: float = IDLE_EXIT_S,
                   waited: bool = False, replace: bool = False) -> None:
    """What the directory's recorder records with, unless a producer said it first: the
    configuration, roar-internal directories (never lineage), for a workflow run
    recorded on several nodes its run id (`order`: keep the nodes' events causal), how
    long it waits for a new producer once all are done, and whether producers wait for
    it (`waited`: it runs at their priority, not below it).  `replace`: these settings
    win over different ones written before (the CLI's directory, one per home, whose
    configuration the user may change between two runs); a running recorder takes them
    up at its next pass."""
    from roar_core import config

    path = os.path.join(directory, SETTINGS)
    if not replace and os.path.exists(path):
        return
    data = {"root": cfg.project_root, "config": config.values(cfg),
            "internal": [os.fspath(p) for p in internal], "order": order,
            "idle_exit_s": idle_exit_s, "waited": waited}
    text = json.dumps(data)
    if replace:
        try:
            with open(path, "rb") as f:
                if f.read() == text.encode():
                    return
        except (OSError, UnicodeError):
            pass
    tmp = os.path.join(directory, f".{SETTINGS}.{os.getpid()}.{threading.get_ident()}")
    os.makedirs(directory, exist_ok=True)  # only where settings are written
    with open(tmp, "w") as f:
        f.write(text)
    try:
        if replace:
            os.replace(tmp, path)  # never half-written
        else:
            os.link(tmp, path)  # the first producer's settings win; never half-written
    except FileExistsError:
        pass
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def read_settings(directory: Dir) -> dict[str, Any]:
    with open(os.path.join(directory, SETTINGS), "rb") as f:
        return json.loads(f.read())


def ensure(directory: Dir) -> None:
    """Start the directory's recorder unless one runs (a second one exits at once)."""
    if running(directory):
        return
    from roar_core.pipeline import tracer

    with _SPAWN_LOCK:
        if tracer.loaded() is None:  # no tracer in this process (`roar-core run`)
            _spawn(directory)
            return
        # From a thread the tracer ignores: the shim then leaves the child's environment
        # alone (no LD_PRELOAD put back), so the recorder is not traced.
        t = threading.Thread(target=_spawn, args=(directory,), name="roar-spawn")
        t.start()
        t.join()


def _spawn(directory: Dir) -> None:
    from roar_core.pipeline import tracer
    from roar_core.recording import forkserver

    tracer.ignore_this_thread()
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", tracer.ENV_SESSION, tracer.ENV_TAG)}
    env[tracer.ENV_TRACER_OFF] = "1"  # should the shim come back anyway, it records nothing
    if forkserver.start(directory, env):
        return  # forked, imports done, by the installation's warm server
    start_detached("roar_core.recording.recorder", [os.fspath(directory)],
                   os.path.join(directory, LOG), env)


def start_detached(module: str, args: list[str], log: str, env: dict[str, str]) -> None:
    """`python -m module args...` in the background, its stderr appended to `log`: through
    a shell that backgrounds it and exits, so that it is nobody's child, in a session of
    its own (an engine's clean-up of a dying worker's children leaves it alone).

    It starts in `/` and enters this process's working directory (`START_DIR`) once its
    imports are done (`enter_start_dir`): `-m` puts the directory it starts in first on
    the import path, where a project's own `json.py` or `select.py` shadowed the standard
    library's in the recorder (the server died of it, and the run went unrecorded).  The
    OpenLineage client finds the project's `openlineage.yml` in the directory entered, and
    relative entries of PYTHONPATH (a project's `PYTHONPATH=src`, with its own transport
    class) are made absolute from there.  (-P, 3.11+, keeps even `/` off the path.)"""
    script = '"$@" </dev/null >/dev/null 2>>"$0" &'
    env = dict(env)
    try:
        env[START_DIR] = cwd = os.getcwd()
    except OSError:  # removed meanwhile: it stays in /
        pass
    else:
        if env.get("PYTHONPATH"):
            env["PYTHONPATH"] = absolute_pythonpath(env["PYTHONPATH"], cwd)
    safe = ["-P"] if sys.version_info >= (3, 11) else []
    subprocess.run(["/bin/sh", "-c", script, log, sys.executable, *safe, "-m", module,
                    *args], env=env, cwd="/", stdin=subprocess.DEVNULL, start_new_session=True,
                   check=False)


def absolute_pythonpath(value: str, cwd: str) -> str:
    """PYTHONPATH with its entries relative to `cwd` made absolute (an empty one is `cwd`
    itself, as Python reads it)."""
    return os.pathsep.join(os.path.join(cwd, p) for p in value.split(os.pathsep))


def enter_start_dir() -> None:
    """Enter the directory `start_detached` was called from, where it still exists (else
    stay in /)."""
    where = os.environ.pop(START_DIR, None)
    if where is not None:
        try:
            os.chdir(where)
        except OSError:
            pass


def status_time(directory: Dir) -> float:
    """When the recorder's last pass that recorded all it found began (0: none yet)."""
    try:
        with open(os.path.join(directory, STATUS), "rb") as f:
            return float(f.read())
    except (OSError, ValueError):
        return 0.0


def wait_recorded(directories: Sequence[Dir], deadline: float) -> list[Dir]:
    """Wait until everything the producers in each directory logged so far is recorded: a
    recorder pass there that began after now has completed (a pass records all it reads).
    The directories waited on together; returns those not caught up by the deadline."""
    since = time.time()
    for directory in directories:
        tasklog.poke(os.path.join(directory, tasklog.WAKE), tasklog.RETRY_NOW)
    left = list(directories)
    while True:
        left = [d for d in left if status_time(d) <= since and tasklog.log_paths(d)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)


def wait_gone(directory: Dir, deadline: float, exited: bool = False) -> bool:
    """Wait until the recorder has recorded what the dead producers left and exited
    (`exited`: and its last events are sent: it has exited)."""
    tasklog.poke(os.path.join(directory, tasklog.WAKE))
    while time.monotonic() < deadline:
        if not running(directory) or not (exited or tasklog.log_paths(directory)):
            return True
        time.sleep(0.002)  # a probe costs ~10 us; the engine's exit waits on this one
    return False


def finish_own(tasks: tasklog.TaskLog, directory: Dir, what: str, *, wait_s: float,
               owner: int | None = None) -> bool:
    """The end of a session an engine's process made for its own log (Snakemake's
    invocation, a Ray driver's job run): the log closed and recorded by the session's
    recorder, started if none runs; with none possible, by this process (the last resort);
    the recorder gone, its last events sent; the log and `owner` (its owner lock) let go.
    The session is removed, or kept where some of it is not recorded yet (the next
    recorder, the sweep's, records it once the cause is gone).  `what` names the lineage
    in messages.  True when all of it was recorded."""
    fd = tasks.closed(wait=True)
    try:
        ensure(directory)
    except OSError as e:
        log.warning("roar: cannot start the recorder of %s: %s", what, e)
    if not tasks.wait_for(tasks.name, fd, wait_s) and not running(directory):
        log.warning("roar: no recorder process: recording %s here", what)
        try:
            record_here(directory)
        except Exception as e:
            # (Not lost: what is not recorded stays in its log, kept below.)
            log.error("roar: %s not recorded here either: %s: %s", what, type(e).__name__, e)
    # It leaves once nothing is left to follow, its last events sent.
    open(os.path.join(directory, ENDING), "a").close()
    wait_gone(directory, time.monotonic() + 60, exited=True)
    tasks.read_results()  # (what it, or this process, marked since the wait)
    tasks.close()
    if owner is not None:
        os.close(owner)
    if tasklog.log_paths(directory):
        log.warning("roar: %s not recorded yet is kept in %s", what, directory)
        return False
    import shutil  # (not on `roar-core run`'s path)

    shutil.rmtree(directory, ignore_errors=True)
    return True


def open_roar(directory: Dir, settings: dict[str, Any] | None = None, send: bool = False):
    """The Roar a recorder of `directory` records with (also a producer's last resort).
    Its store's commits do not checkpoint it: the recorder does when quiet (`main`), and
    closing does."""
    from roar_core import config
    from roar_core.api import Roar

    settings = settings or read_settings(directory)
    cfg = config.load(cwd=settings["root"], env={}, **settings["config"])
    # The directory itself is roar's: a producer's task log, written on a task's own
    # thread, is never the task's lineage.
    return Roar(cfg, internal=[*(settings.get("internal") or ()), directory], send=send,
                idle_checkpoints=True)


def record_here(directory: Dir, lifetime_status: str = "ABORT") -> int:
    """A producer's last resort, with no recorder possible: record, in this process, what
    the producers of `directory` left (with the directory's settings).  Waits for a
    recorder that holds the directory to exit; returns how many tasks."""
    roar = open_roar(directory)
    try:
        return drain(roar, directory, blocking=True, lifetime_status=lifetime_status) or 0
    finally:
        roar.close(timeout=0)


def drain(roar, directory: Dir, *, blocking: bool = False, lifetime_status: str = "ABORT",
          given: dict | None = None) -> int | None:
    """Record in this process, with `roar`, every task of `directory` that has ended (and
    what dead producers left): a reader that needs all recorded now, or a producer that
    records its own task (`roar-core run --wait`: `given`, see Follower).  None when a
    recorder holds the directory (`blocking`: wait for it to exit instead); else how many
    tasks were recorded."""
    from roar_core.recording.follower import Follower

    try:
        lock = os.open(os.path.join(directory, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                       0o644)
    except FileNotFoundError:
        return 0  # no directory: nothing to record
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return None
        follower = Follower(roar, directory, lifetime_status=lambda: lifetime_status,
                            given=given)
        try:
            return follower.poll()
        finally:
            try:
                follower.sync()  # (raises NotSynced: nothing of it marked)
            finally:
                follower.close()
    finally:
        os.close(lock)


def main(argv: list[str]) -> int:
    enter_start_dir()
    directory = argv[0]
    lock = os.open(os.path.join(directory, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another one follows this directory
    # ROAR_DEBUG: what this recorder imports itself (forked from the fork server, nothing:
    # each module its warm-up missed costs every recorder its import).
    imported = set(sys.modules) if os.environ.get("ROAR_DEBUG") else None
    settings = read_settings(directory)
    if settings.get("waited"):
        no_wakeup_preemption()  # at the producers' priority: they wait for answers
    else:
        yield_cpu()  # the tasks come first; who needs the lineage waits for it to catch up
    import logging
    from datetime import datetime, timezone

    from roar_core.heap import freeze_heap
    from roar_core.pipeline.spoolfiles import NotSynced
    from roar_core.pipeline.store import StoreError
    from roar_core.recording.follower import CausalOrder, Follower, tell_unrecorded

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    # No sender thread: its `Sender` child process delivers (forked once it has spooled).
    try:
        roar = open_roar(directory, settings)
    except StoreError as e:
        # Its producers are told now, not when they give up waiting (a Snakemake run's end
        # waited 5 minutes for a recorder that had died here with a traceback).
        log.error(
            "roar: nothing recorded: %s (the tasks are kept in %s, for the next recorder)",
            e, directory)
        tell_unrecorded(directory, f"{type(e).__name__}: {e}")
        return 1
    ending = os.path.join(directory, ENDING)
    # The workflow run's recorders on other nodes: a consumer's events after its producer's.
    order = (CausalOrder(roar.store, settings["order"], os.path.basename(directory))
             if settings.get("order") else None)
    follower = Follower(roar, directory, lifetime_status=lambda: (
        "COMPLETE" if os.path.exists(ending) else "ABORT"), sync_every=SYNC_S, order=order,
        # Where a producer waits for each task's end, the START goes in while the task
        # runs, not on the task's path with its end.
        hold_start_s=0.0 if settings.get("waited") else HOLD_START_S)
    wake = tasklog._mkfifo(os.path.join(directory, tasklog.WAKE))
    freeze_heap()
    # The store's helper thread writes a big task's rows while this one goes on (its
    # accesses, its events): with the default 5 ms between forced GIL switches, it began
    # ~5 ms after it was handed them (measured, a task of 5,000 files), and each of its
    # statements waited for the GIL again.
    sys.setswitchinterval(SWITCH_S)
    idle_since = time.monotonic()
    # Rewritten in place, padded to one length, never renamed over: a new entry in the
    # directory would make every Ray worker there list it again for its next task.
    status = os.open(os.path.join(directory, STATUS), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC,
                     0o644)
    next_mark = 0.0
    total = 0
    sender = Sender(roar.spool, directory, lock, fifo_fd=wake) if roar.spool is not None else None
    idle_exit_s = float(settings.get("idle_exit_s") or IDLE_EXIT_S)
    recorded_at = checkpointed = time.monotonic()
    settings_path = os.path.join(directory, SETTINGS)
    settings_id = _file_id(settings_path)
    try:
        while True:
            hinted = tasklog.drain_fifo(wake)
            if tasklog.RETRY_NOW in hinted:
                follower.retry_now()
                hinted = [h for h in hinted if h != tasklog.RETRY_NOW]
            if _file_id(settings_path) != settings_id:
                # A producer changed the settings (the CLI's, its configuration): what
                # ended from now on is recorded with them.
                try:
                    follower.sync()
                except NotSynced:  # (said) not before what the old spool holds is synced
                    select.select([wake], [], [], PASS_S)
                    continue
                if sender is not None:
                    sender.close(0)  # it finishes on its own (reaped later); the next goes on
                roar.close(timeout=0)
                settings_id = _file_id(settings_path)
                roar = follower.roar = open_roar(directory)
                sender = (Sender(roar.spool, directory, lock, fifo_fd=wake)
                          if roar.spool is not None else None)
                follower.forget_rows()
            reap_senders()
            began = time.time()
            try:
                recorded = follower.poll(hinted)
            except NotSynced:  # (said by the follower) its next sync tries again
                recorded = 0
            total += recorded
            if follower.held_from is None:  # all that ended before `began` is recorded
                os.pwrite(status, f"{began:<24.6f}".encode(), 0)
            if sender is not None:
                sender.wake()
            if order is not None and began >= next_mark and (
                    sender is None or sender.delivered()):
                # Everything recorded so far out of the spool: our mark can move on.
                mark = datetime.fromtimestamp(began, timezone.utc)
                order.advance(min(mark, follower.held_from or mark))
                next_mark = began + SEND_EVERY_S
            now = time.monotonic()
            if recorded:
                recorded_at = now
            if now - recorded_at >= QUIET_S or now - checkpointed >= CHECKPOINT_S:
                try:  # (nothing to do where nothing was written since)
                    roar.store.checkpoint()
                except StoreError as e:  # loses nothing: the log keeps what it holds
                    logging.getLogger(__name__).warning("roar: %s", e)
                checkpointed = now
            if recorded:
                idle_since = now
                # Passes at least BUSY_PASS_S apart unless a producer waits: a pass has
                # fixed costs, which passes of one or two tasks each paid per task.
                select.select([wake], [], [], max(0.0, began + BUSY_PASS_S - time.time()))
                continue
            if not os.path.isdir(directory):
                return 0  # the session was removed: nothing of it is left to record
            if not follower.pending():  # (logs of tasks that failed wait for the next one)
                if os.path.exists(ending) or time.monotonic() - idle_since > idle_exit_s:
                    return 0
            else:
                idle_since = time.monotonic()
            select.select([wake], [], [], PASS_S)
    finally:
        try:
            follower.sync()
        except NotSynced:  # (said) left to the next recorder
            pass
        follower.close()
        os.close(status)
        if sender is not None:
            sender.wake()  # (one dead since: another, for the last try)
            # Its last try, and a send its thread had in flight (the transport's timeout).
            sender.close(FINAL_SEND_S + 15)
        if order is not None:
            order.advance(datetime.now(timezone.utc), done=True)
        roar.close(timeout=0)  # its events: sent above, before the mark said so
        if os.environ.get("ROAR_DEBUG"):
            cpu = os.times()
            print(f"roar recorder: {total} tasks, {cpu.user + cpu.system:.3f} s CPU "
                  f"({cpu.user:.3f} user)", file=sys.stderr)
            if imported is not None:
                print(f"roar recorder: imported {sorted(set(sys.modules) - imported)}",
                      file=sys.stderr)
        os.close(lock)
        # A producer that began while we held the lock found a recorder running and
        # started none: look again now that it is released.
        if _left_over(directory):
            ensure(directory)


class Sender:
    """Delivers the recorder's events from a child process forked from it, with the client
    and the spool it has: the spool's own sender thread there (its backoff, its rescans of
    dead processes' segments), woken through a pipe after each pass that spooled.

    Sending between passes, in turn with recording, held every answer behind the send in
    progress: a backend slow to answer held `run --wait` for the transport's timeout, and a
    5,000-file task's COMPLETE took ~0.4 s of the client's serializer, which the next
    task's answer waited out.  A thread beside the recording one costs both the GIL at
    every SQLite call and file write; another process costs neither.  Its end of file
    (the recorder exiting, or killed) makes it try once more what is left, and exit."""

    def __init__(self, spool: Any, directory: str, lock_fd: int, fifo_fd: int = -1) -> None:
        self.spool = spool
        self.directory = directory
        self._lock_fd = lock_fd  # the directory's lock: the recorder's alone, not the child's
        # The recorder's own wake-up FIFO (not `_wake_fd`, the pipe that wakes the child): a
        # producer that can poke it takes that as a recorder listening (an Airflow task's
        # end), which a sender outliving its recorder must not fake.
        self._recorder_fifo = fifo_fd
        self._pid = 0
        self._wake_fd = -1
        self._woken_at: tuple[Any, int] | None = None

    def wake(self) -> None:
        """New events spooled since the last call: the sender delivers them."""
        at = self.spool.position()
        if at[1] == 0 or at == self._woken_at:
            return
        self._woken_at = at
        if not self._alive():
            self._start()
        try:
            os.write(self._wake_fd, b"\0")
        except OSError:  # a full pipe: it has wake-ups enough to read
            pass

    def delivered(self) -> bool:
        """All this recorder spooled so far delivered (or held for good)?"""
        return self.spool.delivered(self.spool.position())

    def close(self, timeout: float) -> None:
        """Tell the sender to make its last try (`FINAL_SEND_S` at most, once for each
        event: no retrying through an outage) and exit; wait up to `timeout` s for it."""
        if self._pid <= 0:
            return
        os.close(self._wake_fd)
        deadline = time.monotonic() + timeout
        while not _exited(self._pid):
            if time.monotonic() >= deadline:
                # Left to finish on its own (nothing waits on it); reaped then.
                _LEFT_SENDERS.append(self._pid)
                break
            time.sleep(0.01)
        self._pid = 0

    def _alive(self) -> bool:
        if self._pid <= 0:
            return False
        if not _exited(self._pid):
            return True
        os.close(self._wake_fd)  # it died: another is started
        self._pid = 0
        return False

    def _start(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        pid = os.fork()
        if pid == 0:  # (the spool forgot the recorder's segment and thread as it forked)
            try:
                from roar_core.recording.forkserver import set_title

                # Not a recorder to whoever looks for the directory's (it holds no lock).
                set_title("roar_core.recording.recorder-sender", self.directory)
                os.close(w)
                os.close(self._lock_fd)
                if self._recorder_fifo >= 0:
                    os.close(self._recorder_fifo)
                os.setpriority(os.PRIO_PROCESS, 0, 19)  # after the recorder's own work
                _send_until_closed(self.spool, r)
            finally:
                os._exit(0)
        os.close(r)
        self._pid, self._wake_fd = pid, w


# Senders closed without waiting for them (`Sender.close`): reaped once they have exited,
# not left as zombies for the recorder's lifetime (one per change of its settings).
_LEFT_SENDERS: list[int] = []


def reap_senders() -> None:
    _LEFT_SENDERS[:] = [pid for pid in _LEFT_SENDERS if not _exited(pid)]


def _exited(pid: int) -> bool:
    """Whether our child `pid` has exited (reaped now if so)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:  # reaped already
        return True


def _send_until_closed(spool: Any, fd: int) -> None:
    spool.start_sender()
    while os.read(fd, 4096):
        spool.wake()
    # No retrying: in an outage each recorder would wait the timeout out (and an engine
    # that waits for it to exit with it); the next sender tries again.
    spool.flush(FINAL_SEND_S, retry=False)
    spool.close()


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _left_over(directory: Dir) -> bool:
    """Work in `directory` for a recorder: a task not recorded that no recorder has
    failed on yet, or a live producer."""
    live: list[str] = []
    return any(t.error is None for t in tasklog.outstanding(directory, live)) or bool(live)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
