"""Sessions: the directory the tracer writes into, and getting each task's events out.

A session directory holds one log per traced process.  `SessionCollector` reads them
incrementally (a long-lived worker's own log is read while it is still being written)
and hands out each task's records by tag; `run_traced` runs one command under the
tracer with its exit status and signals passed through.
"""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import subprocess
import threading
import time
from collections import defaultdict, namedtuple
from collections.abc import Callable

from roar_core.config import Config, clean_path
from roar_core.pipeline import tracelog, tracer
from roar_core.pipeline.attribution import Context, TaskEvents, attribute

TYPE_CHECKING = False  # not typing's (see roar_core.slotted)
if TYPE_CHECKING:
    from roar_core.pipeline.capture import WhileRunning


def new_session_dir(config: Config, name: str | None = None, *,
                    in_memory: bool = False) -> str:
    """A session directory under the roar home; `in_memory`: for a session that lives only
    as long as the process that makes it, in `memory_sessions_dir()` where there is one
    (where sessions left by processes that died are swept away first)."""
    memory = memory_sessions_dir() if in_memory else None
    if memory is not None:
        sweep_stale_sessions(memory)
    base = memory or config.sessions_dir
    d = os.path.join(base, name or os.urandom(16).hex())
    os.makedirs(d, exist_ok=True)
    return d


# An in-memory session is stale once nothing has changed in it for this long, no process
# that logs into it is alive and no lock in it is held (a recorder's, an engine's
# owner.lock).  The wait spares a worker's session exported by `roar-core env airflow` and
# not used yet: nothing shows whether a shell still means to start a worker with it.
STALE_AFTER_S = 3600.0
OWNER_LOCK = "owner.lock"
# `roar-core run`'s sessions kept while its home could not be written (runner.spare_dir):
# not stale, whatever their age, until recorded.
SPARE_PREFIX = "unrecorded-"


def sweep_stale_sessions(base: str | os.PathLike, now: float | None = None) -> list[str]:
    """Remove the sessions under `base` that the processes which used them left behind
    when they died (a killed engine or worker): RAM, on tmpfs, until the next reboot."""
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        if entry.name.startswith(SPARE_PREFIX):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime < STALE_AFTER_S:
                # Not stale yet, but what a finished engine left unrecorded (its recorder
                # could not store it: a full disk) is recorded now, not an hour later: it
                # is in RAM, which a reboot empties.
                if _has_task_logs(entry.path) and not _in_use(entry.path):
                    _unrecorded(entry.path)
                continue
            if _in_use(entry.path):
                continue
            if _unrecorded(entry.path):
                continue
        except OSError:
            continue
        remove_session_dir(entry.path)
        removed.append(entry.path)
    return removed


def _has_task_logs(d: str) -> bool:
    from roar_core.recording import tasklog

    return bool(tasklog.log_paths(d))


def _unrecorded(d: str) -> bool:
    """Task logs are left here that no recorder follows (their producer and its recorder
    were killed): start one to record them, and keep the session until it has."""
    from roar_core.recording import recorder, tasklog

    if not tasklog.log_paths(d) or not os.path.exists(os.path.join(d, recorder.SETTINGS)):
        return False
    try:
        recorder.ensure(d)
    except OSError:
        pass
    return True


def _in_use(d: str, depth: int = 2) -> bool:
    """A live process logs here, or someone holds a lock here (depth: an engine keeps each
    task's session one level down)."""
    locks = []
    for entry in os.scandir(d):
        name = entry.name
        if entry.is_dir(follow_symlinks=False):
            if depth > 1 and _in_use(entry.path, depth - 1):
                return True
        elif name.endswith(".lock"):
            locks.append(entry.path)
        elif name.startswith("roar-") and name.endswith(".log"):
            pid = name[5:].partition("-")[0]
            if not pid.isdigit() or pid_alive(int(pid)):
                return True
    # Locks last: probing one takes it for an instant, which a recorder starting right
    # then would read as another recorder holding it.
    return any(lock_held(p) for p in locks)


def lock_held(path: str | os.PathLike) -> bool:
    """Whether a process holds an flock on `path` (a missing file: no).  The probe takes
    the lock for an instant when it is free; an unexpected error answers "held", the side
    on which nobody removes or starts anything twice."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also releases the lock if we just took it
    return False


def hold_owner_lock(d: str | os.PathLike) -> int:
    """Mark `d` in use for as long as the calling process lives (or until the returned
    descriptor is closed): sweep_stale_sessions leaves it alone."""
    fd = os.open(os.path.join(d, OWNER_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def memory_sessions_dir() -> str | None:
    """A RAM-backed directory of this user's for sessions that live only as long as the
    process that made them, or None where there is none.

    Each traced process writes its log through a shared mapping of a file.  On a disk file
    system, creating, mapping, writing and removing those files goes through its journal:
    measured with Snakemake's 200 small jobs on ext4, about 1.5 ms more per job than on
    tmpfs, and a 1.25 wall-time ratio against 1.09.  What must survive a reboot stays
    under the roar home: `roar-core run`'s task logs, whose end lines hold the versions
    its runner took (its tracer logs come here).  The shim reserves a log's pages on
    tmpfs, so a full one drops events instead of raising SIGBUS in the traced program."""
    uid = os.getuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    for base, name in ((runtime, "roar"), ("/dev/shm", f"roar-{uid}")):
        if not base or not os.path.isdir(base):
            continue
        d = os.path.join(base, name)
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError:
            continue
        st = os.lstat(d)
        # /dev/shm is shared by every user: only a real directory of ours, closed to others.
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077:
            return d
    return None


def remove_session_dir(d: str | os.PathLike) -> None:
    import shutil  # with its compressors ~1.5 ms: not on `roar-core run true`'s path

    shutil.rmtree(d, ignore_errors=True)


def _process_gone(head: tracelog.LogHeader) -> bool:
    return not pid_alive(head.pid)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (on this host)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, just not ours
        return True
    return True


def yield_cpu(nice: int = 19) -> None:
    """Make the calling process (a background recorder) give the CPU to the tasks first.

    Nice alone does not do it: the recorder runs in a session of its own, and with the
    kernel's autogroup scheduling (on by default) a session gets an equal share of the CPU
    against every other session, whatever its processes' nice values, so a nice 19
    recorder still took half a saturated node from the engine's session.  The session's
    own nice value (/proc/self/autogroup) is what weighs against the others.  Nice, not
    SCHED_IDLE: on a node that is always busy the lineage must still make progress."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        pass
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:  # no autogroup here (or not allowed): nice is what there is
        pass


_MTIME_TICK_NS = 50_000_000  # coarser than any file system's timestamp tick


def no_wakeup_preemption() -> None:
    """Never take a core from a running task on waking (SCHED_BATCH: same share of the
    CPU, no privilege needed); best effort.

    For a recorder whose producers ask for answers (Airflow's task processes): a task's
    end wakes it from the task process itself, and with a short slice the woken recorder
    took that process's core at once, for its whole answer (measured on 2 busy cores:
    the end line's wake-up took 3.6 ms at p90; 0.05 ms without).  A task in place asks for
    the answer tens of ms later (after Airflow's own end of the task); one that waits at
    its end blocks at once, and the recorder gets its core then."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (OSError, AttributeError):
        pass


# A task's own session read whole: its events (TaskEvents), how many logs were read
# (0 with no error: its program left no trace, static or setuid) and the logs that could
# not be read (each one a lost event).  collections' namedtuple, not typing's: see
# roar_core.slotted.
WholeSession = namedtuple("WholeSession", ["events", "logs_read", "errors"])


def summarized(read: dict) -> WholeSession:
    """A task's own session as its producer's whole read of it found it
    (tasklog.read_summary), without its records."""
    return WholeSession(TaskEvents("", dropped=int(read["dropped"])), int(read["logs"]),
                        [str(e) for e in read["errors"]])


class SessionCollector:
    """Incremental reader of a session's logs.  Logs of processes still running are read
    up to their last committed record; the rest is picked up by the next collect()."""

    def __init__(self, directory: str | os.PathLike, root_pid: int | None = None,
                 since_mono_ns: int | None = None,
                 listing: tracelog.LogListing | None = None):
        """`root_pid`: read only the logs of that process and its descendants (a worker
        sharing the directory with other workers reads its own tree, not theirs).
        `since_mono_ns` (CLOCK_MONOTONIC, with root_pid): the tree's processes started after
        that moment, so older logs other than root_pid's own are skipped by name, unopened
        (a long-lived session holds a log for every task process ever forked).
        `listing` (with root_pid): the directory's listing and logs' headers, shared by
        the collectors of one directory and made stale by their owner, instead of its own
        (each would otherwise list the directory, and read every other live process's
        header once)."""
        # Spelled as pathlib would (the tracer's own log paths and the listing's agree).
        self.directory = clean_path(os.fspath(directory))
        self._tree: set[int] | None = None if root_pid is None else {root_pid}
        self._root_pid = root_pid
        self._since = since_mono_ns
        self._others: dict[str, tracelog.LogHeader] = {}  # logs outside the tree so far
        self._mine: set[str] = set()
        self._offsets: dict[str, int] = {}
        self._headers: dict[str, tracelog.LogHeader] = {}
        self._finished: set[str] = set()  # read to the end after its process was gone
        self._torn = 0  # records found half-written, over all reads (for take_all)
        # For take: the part of each log's header count already charged to tasks (the
        # count only grows; a log read again must not charge its old losses again).
        self._charged: dict[str, int] = {}
        self._pending: dict[str, list[tracelog.Record]] = defaultdict(list)
        self._dropped: dict[str, int] = defaultdict(int)
        self.errors: list[str] = []
        self._lock = threading.Lock()
        # With a root pid (a long-lived worker reading its tree once per task): the live
        # logs stay mapped, and the directory is listed again only when it changed.
        self._live: dict[str, tracelog.LiveLog] = {}
        # (the directory's mtime, or the shared listing's version; the tree's logs)
        self._listed: tuple[int, list[str]] | None = None
        self._shared = listing
        # What earlier reads said about processes and task windows: a task's system() or
        # popen() child whose log is read in a later batch than its parent's task_begin
        # is still that task's.
        self._context = Context()

    def _tree_logs(self) -> list[str]:
        """Our tree's logs.  A new log is a new directory entry, which changes the
        directory's mtime; a listing is reused while that mtime is unchanged and older
        than a file system's timestamp tick (a file created within the tick of the
        listing could keep the same mtime).  With a shared listing: that listing's, as of
        its owner's last invalidate()."""
        shared = self._shared
        if shared is not None:
            version = shared.current()
            if self._listed is None or self._listed[0] != version:
                self._listed = (version, self._shared_tree(shared))
            return self._listed[1]
        try:
            mtime = os.stat(self.directory).st_mtime_ns
        except OSError:
            mtime = -1
        listed = self._listed
        if listed is None or listed[0] != mtime or time.time_ns() - mtime < _MTIME_TICK_NS:
            listed = self._listed = (mtime, self._in_tree(
                tracelog.log_files(self.directory, self._since, self._root_pid)))
        return listed[1]

    def _read(self, path: str, start: int,
              final: bool | Callable[[tracelog.LogHeader], bool]) -> tracelog.TraceLog:
        live = self._live.pop(path, None) if final else self._live.get(path)
        if final or self._tree is None:
            if live is not None:
                live.close()
            return tracelog.read_log(path, start=start, final=final)
        if live is None:
            live = self._live[path] = tracelog.LiveLog(path)
        return live.read(start)

    def close(self) -> None:
        """Unmap the logs kept mapped (a worker's, at its exit)."""
        with self._lock:
            for live in self._live.values():
                live.close()
            self._live.clear()

    def _shared_tree(self, shared: tracelog.LogListing) -> list[str]:
        """Our tree's logs in a shared listing, in its order: from each process of the
        tree, its own logs and its children's (`_in_tree`'s rule, by the listing's index:
        a collector among hundreds reads only its own few)."""
        tree, mine, since = self._tree, self._mine, self._since
        assert tree is not None
        todo = list(tree)
        while todo:
            for path, head in shared.related(todo.pop()):
                if path in mine or since is not None and not tracelog.in_window(
                        shared.key(path), since, self._root_pid):
                    continue
                self._headers[path] = head
                mine.add(path)
                if head.pid not in tree:
                    tree.add(head.pid)
                    todo.append(head.pid)
        return sorted((p for p in mine if shared.key(p) is not None), key=shared.key)

    def _in_tree(self, paths: list[str]) -> list[str]:
        """The logs of processes in our tree.  A log is ours when its process or its parent
        is; a parent's log may appear after its child's (a forked process creates its log
        at its first record), so logs not ours yet are kept and looked at again."""
        tree = self._tree
        assert tree is not None
        for path in paths:
            if path not in self._mine and path not in self._others:
                try:
                    self._others[path] = tracelog.read_header(path)
                except tracelog.TraceLogError:
                    continue  # being created: its header is not written yet
        grew = True
        while grew:
            grew = False
            for path, head in list(self._others.items()):
                if head.pid in tree or head.ppid in tree:
                    tree.add(head.pid)
                    del self._others[path]
                    self._mine.add(path)
                    self._headers[path] = head  # a dead process's log is read as final
                    grew = True
        return [p for p in paths if p in self._mine]

    def collect(self, settle: bool = False, live: bool = False,
                seen: Callable[[list[tracelog.Record]], None] | None = None) -> int:
        """Read what the logs hold now.  `settle`: the session's command has ended, so a
        log first seen now is read to its end too when its process is gone (a record it
        left half-written counts as dropped), as read_session would.  `live`: processes
        may be starting: a log without its header yet is looked at again next time
        instead of being reported as unreadable (the shim creates it, then writes it).
        `seen`: called with the records read (of all logs).  Returns how many records it
        read."""
        with self._lock:
            logs = []
            if self._tree is None:
                paths = tracelog.log_files(self.directory)
            else:
                paths = self._tree_logs()
            for path in paths:
                if path in self._finished:
                    continue
                start = self._offsets.get(path, 0)
                try:
                    head = self._headers.get(path)
                    # A log first seen as the command has ended: whether its process is
                    # gone, from the header read with its records (one open, not two).
                    final = (not pid_alive(head.pid) if head is not None
                             else _process_gone if settle else False)
                    log = self._read(path, start, final)
                    if log.final:
                        self._finished.add(path)
                except tracelog.TraceLogError as e:
                    if live:
                        continue
                    if path not in self._offsets:
                        self.errors.append(str(e))
                        self._offsets[path] = 1 << 62  # never again
                    continue
                self._headers[path] = log.header
                self._offsets[path] = log.next_offset
                self._torn += log.torn
                if log.records or log.torn:
                    # Attribution charges a log's losses to the tasks of the records read
                    # with it: only those not charged yet (a log without new records
                    # keeps them for its next read).
                    total = log.header.dropped
                    if total:
                        log.header = log.header.replace(
                            dropped=max(0, total - self._charged.get(path, 0)))
                        self._charged[path] = total
                    logs.append(log)
            if seen is not None and logs:
                seen([r for log in logs for r in log.records])
            for tag, events in attribute(logs, context=self._context).items():
                self._pending[tag].extend(events.records)
                self._dropped[tag] += events.dropped
            return sum(len(log.records) for log in logs)

    def skip(self, path: str | os.PathLike, offset: int, dropped: int = 0) -> None:
        """Start reading `path` at `offset`: a position in a live log taken before a task
        began, so what precedes it cannot be that task's (a long-lived process's log is
        not re-read from the start for each of its tasks); `dropped`: its header's count
        of lost events then, lost before the task."""
        with self._lock:
            p = clean_path(os.fspath(path))
            self._offsets[p] = max(self._offsets.get(p, 0), offset)
            self._charged[p] = max(self._charged.get(p, 0), dropped)

    def owned(self) -> list[str]:
        """With a root pid: the logs of its tree found so far."""
        return sorted(self._mine)

    @property
    def logs_read(self) -> int:
        """How many logs have been found and read so far."""
        return len(self._headers)

    def read_whole(self, seen: Callable[[list[tracelog.Record]], None] | None = None
                   ) -> WholeSession:
        """What a session whose command has ended holds: every record, whatever its tag (a
        session that is one task's), how many logs were read and which could not be; then
        the logs are let go.  `seen`: as `collect`'s."""
        self.collect(settle=True, seen=seen)
        whole = WholeSession(self.take_all(), self.logs_read, list(self.errors))
        self.close()
        return whole

    def take_all(self) -> TaskEvents:
        """Every record collected so far, whatever its tag, in time order (a session that
        is one task: `roar-core run`'s)."""
        with self._lock:
            t = TaskEvents("", [r for records in self._pending.values() for r in records])
            # Per log, not per task: a log read many times counts its header's drops once
            # (the count only grows: the header of its latest read has them all).
            t.dropped = sum(h.dropped for h in self._headers.values()) + self._torn
            self._pending.clear()
            self._dropped.clear()
        t.pids = {r.pid for r in t.records}
        t.sort()
        return t

    def take(self, tag: str) -> TaskEvents:
        with self._lock:
            t = TaskEvents(tag, self._pending.pop(tag, []))
            t.dropped = self._dropped.pop(tag, 0)
        t.pids = {r.pid for r in t.records}
        t.sort()
        return t


_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_SI_KERNEL = 0x80  # si_code of a signal the kernel sent: a terminal's ^C, ^\, hang-up


class _Relay:
    """Python-level handlers relaying signals to the child; set before it is started (a
    signal arriving between its start and our handlers would kill us by its default
    action, leaving the command running alone), holding what comes before it exists.
    Exec resets caught signals to their defaults: the child does not inherit these.  A
    signal we were started ignoring (`nohup`'s SIGHUP, SIGINT and SIGQUIT of a script's
    background job) stays ignored, for us and so for the command, as it would be untraced:
    caught here, it reached the command with its default action (`nohup roar-core run`'s
    command died of the hang-up)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.early: list[int] = []
        self.previous: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            for s in _FORWARDED:
                if signal.getsignal(s) is not signal.SIG_IGN:
                    self.previous[s] = signal.signal(s, self._forward)

    def _forward(self, signum: int, _frame: object) -> None:
        if self.proc is None:
            self.early.append(signum)
            return
        try:
            self.proc.send_signal(signum)
        except ProcessLookupError:
            pass

    def started(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        for signum in self.early:
            self._forward(signum, None)

    def restore(self) -> None:
        for s, h in self.previous.items():
            signal.signal(s, h)


def _sent_to_us_alone(info: signal.struct_siginfo) -> bool:
    """Whether the child has not had this signal already.  A terminal's ^C goes to its
    whole foreground process group, which the child shares with us (forwarding it made
    two SIGINTs: a program cleaning up in `except KeyboardInterrupt` was killed by the
    second); so does a signal that a process of our own group sent to the group.  The
    rule sudo follows: relay only what a process outside our group sent."""
    if info.si_code == _SI_KERNEL:
        return False
    try:
        return os.getpgid(info.si_pid) != os.getpgrp()
    except OSError:  # the sender is gone: it was not one of ours
        return info.si_pid != 0


_WAITED = (*_FORWARDED, signal.SIGCHLD)


def _wait_forwarding(proc: subprocess.Popen, soon: Callable[[], None] | None = None) -> int:
    """proc.wait(), relaying the signals sent to us alone.  Python's handlers do not say
    who sent a signal, so the signals are blocked (by run_traced) and taken here with
    sigtimedwait; SIGCHLD, blocked too, wakes us as the child ends.  `soon`: called once,
    should the command still run TAIL_INTERVAL after it started."""
    while proc.poll() is None:
        info = signal.sigtimedwait(_WAITED, TAIL_INTERVAL if soon is not None else 1.0)
        if info is not None and info.si_signo not in _WAITED:
            # CPython returns a siginfo never filled in when the wait was interrupted (we
            # were stopped and continued: ^Z then fg, a debugger or profiler attaching)
            # past its timeout: relayed, its garbage signal number failed the run as 126
            # with the command left running.
            info = None
        if info is None and soon is not None and proc.poll() is None:
            soon()
            soon = None
        elif (info is not None and info.si_signo != signal.SIGCHLD
              and _sent_to_us_alone(info)):
            try:
                proc.send_signal(info.si_signo)
            except ProcessLookupError:
                pass
    return proc.returncode


def run_traced(argv: list[str], session_dir: str | os.PathLike | None, tag: str | None,
               cwd: str | os.PathLike | None = None, *, tail: SessionCollector | None = None,
               running: WhileRunning | None = None) -> int:
    """Run argv (traced when session_dir is given) and return its status the way
    subprocess does: >= 0 exit code, < 0 the signal that killed it.  `tail`: a collector
    of the session, kept reading the logs while the command runs (on the core it leaves
    free), so that little is left to read once it has ended; `running`: fed the records it
    reads, and working on them meanwhile.

    The command inherits every descriptor we inherited (fd 3 of `cmd 3>f`, bash's
    `<(...)` pipes, make's jobserver); roar's own are close-on-exec."""
    env = tracer.preload_env(session_dir, tag=tag) if session_dir else dict(os.environ)
    # Python's handlers relay what arrives until the signals are blocked (in the main
    # thread only: elsewhere Python sets no handlers, and nothing is relayed).
    relay = _Relay()
    try:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, close_fds=False)
    except BaseException:
        relay.restore()
        raise
    relay.started(proc)
    # Blocked only now: the child inherits a signal mask.  The tail thread, started
    # after, has them blocked too, as sigtimedwait needs in every thread.
    main = threading.current_thread() is threading.main_thread()
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED) if main else None
    stop = threading.Event()
    tailer = None
    if tail is not None and session_dir is not None:
        # Started once the command has run TAIL_INTERVAL (its first read is due then): one
        # that ends sooner (`true`) costs no thread.
        tailer = threading.Thread(target=_tail, args=(tail, stop, running, 0.0 if main
                                                      else TAIL_INTERVAL),
                                  name="roar-tail", daemon=True)
    start_tail = None if tailer is None else lambda: _start_tail(tailer)
    try:
        if not main:
            if start_tail is not None:
                start_tail()
            return proc.wait()
        return _wait_forwarding(proc, start_tail)
    finally:
        stop.set()
        if tailer is not None and tailer.ident is not None:  # (started)
            tailer.join()
        if old_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        relay.restore()


def _start_tail(tailer: threading.Thread) -> None:
    """Start the tail thread, or go on without it where no thread can be made (a process
    limit: threads count as processes): the logs are then read whole at the end, the same
    lineage a little later.  Its RuntimeError left the command running with nobody
    waiting for it, and the run exited 1 instead of with the command's code."""
    try:
        tailer.start()
    except RuntimeError:
        pass


# Between reads of a running command's logs: long enough that a quiet command costs
# nothing, short enough that reading keeps pace with one that logs fast.
TAIL_INTERVAL = 0.01
# A read that finds nothing new doubles the wait, up to this: a long quiet command (hours
# of computing, a few files) is looked at a few times a second, not a hundred.
TAIL_INTERVAL_MAX = 0.25


def _tail(collector: SessionCollector, stop: threading.Event,
          running: WhileRunning | None = None, first: float = TAIL_INTERVAL) -> None:
    """`first`: the wait before the first read."""
    tracer.ignore_this_thread()
    interval = TAIL_INTERVAL
    seen = running.seen if running is not None else None
    wait = first
    while not stop.wait(wait):
        began = time.monotonic()
        try:
            found = collector.collect(live=True, seen=seen)
        except Exception:  # noqa: BLE001 - the final read after the command reports it
            return
        interval = TAIL_INTERVAL if found else min(2 * interval, TAIL_INTERVAL_MAX)
        if running is not None:
            try:
                running.work(stop.is_set, began + interval)
            except Exception:  # noqa: BLE001 - the command's end hashes what is left
                running = None
        # From the read's start: time spent hashing is not added to the pause.
        wait = max(0.0, interval - (time.monotonic() - began))
