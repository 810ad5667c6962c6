"""Task logs: how whatever marks task boundaries hands tasks to the recorder.

A producer -- the `roar-core run` runner, a Ray worker, Snakemake's scheduler, an Airflow
task process -- appends one line when a task begins and one when it ends, to its own log in
the session directory, next to the tracer's logs.  One write(2) into the page cache each,
which outlives a SIGKILL like the tracer's own logs; no store, no thread, nothing imported
but the standard library.  The recorder process of the directory (roar_core.recording
.recorder) reads the logs and the tracer logs and records each task, then marks it in the
same log; a producer that needs the answer (Airflow's provider, Snakemake's temp() files)
`wait`s for that mark.

One file per producer process, `tasks-<pid>-<boot>.jsonl` (CLOCK_BOOTTIME when it was made,
which tells a dead process from a later one that got the same pid: that one started after):

    {"v": 1, "pid": 123, "start": 0, "boot": 456,                 first line, by the producer
     "host": "node-1", "common": {...}}                          (fields all its tasks share)
    {"wb": {...workflow run...}}                                  a workflow run began
                                                                 ("started": the producer
                                                                 stored it, sent its START)
    {"b": {...TaskMeta...}, "lifetime": false, "d": "<dir>"}     a task began   (producer)
    {"e": "<run id>", "s": "COMPLETE", "t": "<iso>", ...}        it ended       (producer;
                                                                 "lf": the states it left
                                                                 its files in, see `ended`)
    {"we": "<run id>", "s": "COMPLETE", "t": "<iso>", "m": null} the workflow run ended
    {"closed": 1}                                                nothing more comes
    {"started": "<run id>"}                                      START recorded (recorder)
    {"r": "<run id>", "res": {...}}                               recorded       (recorder)
    {"a": "<run id>", "res": {...}}                               its lineage, before the
                                                                 store (recorder, `early`)

Every line is one O_APPEND write, so the two writers never interleave.  A task's own
tracer session (`"d"`, a subdirectory: the task's processes are its alone) is read whole
when it ends and removed once it is recorded; without one, the task's records are those
its tag marks in the directory's logs.
"""

from __future__ import annotations

import errno
import json
import json.encoder
import os
import select
import stat
import threading
import time
from collections import namedtuple

from roar_core.ids import host_name
from roar_core.lazylog import LazyLogger
from roar_core.slotted import Slotted

TYPE_CHECKING = False  # not typing's (see roar_core.slotted)
if TYPE_CHECKING:  # the writing side stays light: producers import only this module
    from datetime import datetime
    from typing import Any

    from roar_core.pipeline.writer import TaskMeta, TaskOutcome
    from roar_core.recording.sessions import WholeSession


log = LazyLogger(__name__)

VERSION = 1
PREFIX = "tasks-"
SUFFIX = ".jsonl"
WAKE = "recorder.wake"  # a FIFO the recorder waits on between passes
# A wake-up's note from a reader that waits for everything to be recorded: tasks whose
# recording failed are tried again now, not after their pause (the reader may have mended
# the store).  Never a task log's name (those hold no slash).
RETRY_NOW = "/retry"
READ_FIRST, READ_MAX = 1 << 16, 1 << 24  # a producer's reads of the recorder's marks
WAIT_PREFIX = "wait-"  # FIFOs of producers waiting for one task, or for their whole log
# The lines `TaskLog.read_results` reads: its own begins and the recorder's marks.
_MARK_PREFIXES = (b'{"b"', b'{"r"', b'{"a"', b'{"fail"')
SHORT_ANSWER = 5  # files of each kind in a short answer (`ended(short_answer=True)`)
_META_FIELDS = ("run_id", "engine", "namespace", "job_name", "engine_task_id", "attempt",
                "parent_run_id", "command", "host", "pid", "node_id", "traced",
                "untraced_reason", "cwd")
_OPEN_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
_OPEN_READ = os.O_RDONLY | os.O_CLOEXEC
# Task logs a follower holds open at most: a backlog of thousands of dead producers' logs
# must not take the descriptors the store, the spool and the tracer logs need.
_HOLD_MAX = 256
_held = 0


def process_start(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 where /proc cannot say)."""
    try:
        # os.open/os.read, not open(): no buffered file object (in an Airflow task process
        # just forked, 0.13 -> 0.09 ms, on every task's path).
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            stat_ = os.read(fd, 4096)
        finally:
            os.close(fd)
        # The command name (field 2) may hold spaces and parentheses: split after it.
        return int(stat_[stat_.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def trace_mark() -> tuple[str, int] | None:
    """This process's tracer log and where its next record goes (a task beginning now
    begins there); None without the tracer."""
    # (`import a.b as b`, not `from a import b`: the latter runs importlib's Python code at
    # each call, on a task's path in an Airflow task process just forked.)
    import roar_core.pipeline.tracer as tracer

    shim = tracer.loaded()
    if shim is None:
        return None
    # From the shim: reading the log's header back took ~0.23 ms in a task process Airflow
    # had just forked (its pages first touched there), a fifth of the task's begin.
    mark = shim.log_mark()
    if mark is not None:
        return mark
    path = shim.log_path()
    if path is None:
        return None
    from roar_core.pipeline import tracelog

    try:
        return path, tracelog.read_header(path).reserved
    except tracelog.TraceLogError:
        return None


def left_states(log: str, offset: int) -> dict[str, list[int] | None] | None:
    """The state (device, inode, size, mtime, ctime; None: missing) in which a task that
    has just ended in this process (its records from `offset` of `log`) left each file
    it may have written (`TaskLog.ended(left=)`).  None where its log cannot say which."""
    import roar_core.pipeline.tracer as tracer  # (see trace_mark)

    shim = tracer.loaded()
    if shim is not None and shim.reads_written and shim.log_path() == log:
        # This process's own log, read by the shim from its mapping: in a task process
        # just forked (Airflow's), opening, copying and parsing the file here took ~0.4 ms.
        written = shim.written_since(offset)
    else:
        from roar_core.pipeline import tracelog

        try:
            written = tracelog.written_since(log, offset)
        except tracelog.TraceLogError:
            return None
    if written is None:
        return None
    states: dict[str, list[int] | None] = {}
    for p in written:
        try:
            st = os.stat(p)  # (classification follows a symlink to the file itself)
        except OSError:
            states[os.fsdecode(p)] = None
            continue
        if stat.S_ISDIR(st.st_mode):
            return None  # a directory renamed into place: the files in it are not named
        states[os.fsdecode(p)] = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                  st.st_ctime_ns]
    return states


def process_alive(pid: int, start: int, boot: int | None = None) -> bool:
    """Is the process that wrote a task log still running (on this host)?  `start`: its
    start time as /proc says it (0: unknown; -1: gone); `boot`: instead, CLOCK_BOOTTIME
    when it wrote the log's head, after it started: a process now under its pid that
    started later is another one (/proc's start time is that clock's, in ticks)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start or not boot:
        return not start or process_start(pid) in (0, start)
    now = process_start(pid)
    return now * (1_000_000_000 // _CLK_TCK) <= boot


_CLK_TCK = os.sysconf("SC_CLK_TCK")


# A task's own session as its producer read it (WholeSession), and the versions it took
# then (Capture or None): for the follower when the producer records its task in its own
# process (no second read, no round trip of the versions through JSON).
Given = namedtuple("Given", ["session", "capture"])


def meta_to_json(meta: TaskMeta) -> dict:
    """A TaskMeta in its log form."""
    d = {f: getattr(meta, f) for f in _META_FIELDS}
    d["started_at"] = meta.started_at.isoformat()
    from dataclasses import asdict  # TaskMeta's parts are dataclasses: imported already

    d["workflow"] = asdict(meta.workflow) if meta.workflow else None
    d["engine_version"] = asdict(meta.engine_version) if meta.engine_version else None
    return d


def read_summary(session: WholeSession) -> dict[str, Any]:
    """What a whole read of a task's own session found, but its records: for an end line
    that carries the task's versions (`captured`), which are all the recorder needs of
    the records (it would read and attribute every one of them again)."""
    return {"logs": session.logs_read, "dropped": session.events.dropped,
            "errors": session.errors}


def now_iso() -> str:
    """`datetime.now(timezone.utc).isoformat()` to the microsecond, without importing
    datetime (~0.8 ms, on every `roar-core run`)."""
    us = time.time_ns() // 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us // 1_000_000)) + \
        f".{us % 1_000_000:06d}+00:00"


def meta_from_json(d: dict) -> TaskMeta:
    from datetime import datetime

    from roar_core.pipeline import emission
    from roar_core.pipeline.declared import Declared
    from roar_core.pipeline.writer import TaskMeta

    if d.get("run_facets"):  # (the OpenLineage client, ~0.2 s to import: only for them)
        from roar_core.pipeline.facets import RUN_FACETS

    wf, eng, decl = d.get("workflow"), d.get("engine_version"), d.get("declared")
    return TaskMeta(
        # A field a producer left out (or null) takes TaskMeta's default.
        **{f: d[f] for f in _META_FIELDS if d.get(f) is not None},
        started_at=datetime.fromisoformat(d["started_at"]),
        workflow=emission.RunRef(**wf) if wf else None,
        engine_version=emission.Engine(**eng) if eng else None,
        # roar's own run facets by key, as plain fields (the producer loads no client)
        run_facets={key: RUN_FACETS[key](**fields, producer=emission.producer())
                    for key, fields in d["run_facets"].items()} if d.get("run_facets") else {},
        declared=Declared(**decl) if decl else None,
        secrets=tuple(d.get("secrets") or ()),
    )


# A task's end whose versions are of more files than this is encoded with orjson (~5x
# faster: 8.8 -> 1.6 ms at 5,000 files) where the producer has it, as roar-core's runner does.
_BIG_CAPTURE = 256


def _line(entry: dict) -> bytes:
    captured = entry.get("c")
    if captured is not None and sum(
            len(v) for v in captured.values() if isinstance(v, list)) > _BIG_CAPTURE:
        try:
            import orjson

            # Datetimes as json writes them (default=str), never orjson's own format.
            return orjson.dumps(entry, default=str, option=orjson.OPT_APPEND_NEWLINE
                                | orjson.OPT_PASSTHROUGH_DATETIME)
        except (ImportError, TypeError):  # a name that is not UTF-8, an int past 64 bits
            pass
    text = "".join(_encode(entry, 0)) + "\n"
    return text.encode("utf-8", "surrogateescape")


# One encoder for every line, the C one called directly: json.dumps and JSONEncoder.encode
# make a new one in Python at each call, whose first call in a task process just forked
# (Airflow's) first touched ~25 more pages of the parent's memory (~0.08 ms of the task's
# path).  Same output as JSONEncoder(separators=(",", ":"), default=str); no check for
# circular references (a line is plain data: one would end in RecursionError).
_encode = (json.encoder.c_make_encoder(None, str, json.encoder.encode_basestring_ascii,
                                       None, ":", ",", False, False, True)
           if json.encoder.c_make_encoder is not None else
           json.JSONEncoder(separators=(",", ":"), default=str,
                            check_circular=False).iterencode)


def _loads(raw: bytes) -> Any:
    """A line of a task log.  A big one (a task's end with the versions of thousands of
    files) through orjson, ~3x faster, where the reader has it (the recorder does)."""
    if len(raw) > 1 << 16:
        try:
            import orjson

            return orjson.loads(raw)
        except (ImportError, ValueError):  # e.g. an integer past 64 bits: json's turn
            pass
    return json.loads(raw)


def end_entry(run_id: str, status: str, *, error: str | None = None,
              exit_code: int | None = None, ended_at: datetime | None = None,
              captured: dict[str, Any] | None = None, pid: int | None = None,
              shadow: tuple[str, str] | None = None,
              read: dict[str, Any] | None = None) -> dict[str, Any]:
    """A task's end line (see `TaskLog.ended`)."""
    entry: dict[str, Any] = {"e": run_id, "s": status,
                             "t": ended_at.isoformat() if ended_at else now_iso()}
    for key, value in (("x", exit_code), ("m", error), ("c", captured), ("p", pid),
                       ("sh", shadow), ("rd", read)):
        if value is not None:
            entry[key] = value
    return entry


def write_gone(directory: str | os.PathLike, name: str, pid: int, host: str, meta: dict[str, Any],
               own_dir: str, end: dict[str, Any] | None) -> None:
    """The whole task log of one task whose producer is gone (a run an older roar-core
    left): written under a hidden name, then renamed, so a recorder sees all of it or
    nothing.  Start time -1: the producer is dead, whatever process has its pid now."""
    lines = [{"v": VERSION, "pid": pid, "start": -1, "host": host, "common": {}},
             {"b": meta, "d": own_dir}] + ([end] if end is not None else [])
    tmp = os.path.join(directory, f".{PREFIX}{name}{SUFFIX}")
    with open(tmp, "wb") as f:
        f.write(b"".join(_line(x) for x in lines))
    os.replace(tmp, os.path.join(directory, f"{PREFIX}{name}{SUFFIX}"))


def _mkfifo(path: str | os.PathLike) -> int:
    """A FIFO at `path` (made if missing), opened for reading without ever seeing EOF."""
    try:
        os.mkfifo(path, 0o600)
    except FileExistsError:
        if not stat.S_ISFIFO(os.lstat(path).st_mode):
            raise
    return os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)


def poke(path: str | os.PathLike, note: str = "") -> bool:
    """Wake whoever waits on the FIFO at `path`; False when nobody does (no FIFO, no
    reader).  Never blocks: a full FIFO has a wake-up pending already.  `note`: one line
    for the reader (`drain_fifo`), written whole (a FIFO's writes of up to PIPE_BUF bytes
    are never interleaved)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, f"{note}\n".encode())
    except BlockingIOError:
        pass
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def drain_fifo(fd: int) -> list[str]:
    """Empty the FIFO; returns the notes the pokes carried (see `poke`)."""
    data = b""
    try:
        while chunk := os.read(fd, 4096):
            data += chunk
    except BlockingIOError:
        pass
    return [n for n in data.decode("utf-8", "replace").split("\n") if n]


class TaskLog:
    """This process's task log (thread-safe: every line is a single O_APPEND write)."""

    def __init__(self, directory: str | os.PathLike, common: dict[str, Any] | None = None,
                 *, wake: bool = False, results: bool = False, warn: bool = True,
                 head_with_first: bool = False):
        """`common`: log-form TaskMeta fields shared by every task of this process,
        written once (a task's own fields win).  `wake`: wake the recorder at each task's
        end instead of letting it find the task at its next pass (tens of ms later).
        `results`: the recorder marks every task with what it recorded (`Result`), not
        only those waited for.  `warn=False`: a line that cannot be written is not
        logged (the caller checks `ok` and says what it does about it).
        `head_with_first`: the first line is written with the next one, in one write,
        for a producer that writes one at once (a reader takes a log without its first
        line for one not begun yet)."""
        # Paths as strings: in a task process just forked (Airflow's), pathlib's joins
        # first touched ~30 pages of the parent's memory, ~0.1 ms of the task's begin.
        self.directory = self._dir = os.fspath(directory)
        self.pid = os.getpid()
        # Which process wrote the log, for a recorder that finds its pid taken by another:
        # the time now, not the process's start time from /proc, whose read stalled for
        # milliseconds in a task process Airflow had just forked (p90 2 ms, up to 17).
        self.boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        self.name = f"{PREFIX}{self.pid}-{self.boot}"
        self._path = f"{self._dir}/{self.name}{SUFFIX}"
        # Read and append: the producer reads the recorder's marks (results) through it,
        # also once the recorder has removed the file.  The directory is made only when it
        # is missing: in a task process just forked (Airflow's), mkdir's FileExistsError
        # alone cost 0.2 ms of the task's path.
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        self.made_directory = False  # it was missing (removed since the producer began?)
        try:
            self._fd = os.open(self._path, flags, 0o644)
        except FileNotFoundError:
            os.makedirs(self._dir, exist_ok=True)
            self.made_directory = True
            self._fd = os.open(self._path, flags, 0o644)
        self._wake = wake
        self._said = not warn  # a lost line is logged once
        self._lost = False
        self._read_at = 0
        # Threads of one producer wait for their tasks at once (Snakemake's job threads):
        # two reads from the same offset would each advance it, past lines neither read.
        self._reading = threading.Lock()
        self.results: dict[str, dict | None] = {}  # run id -> what the recorder said
        # `mono`: the processes of its tasks start after it (their tracer logs are newer)
        head = {"v": VERSION, "pid": self.pid, "start": 0, "boot": self.boot,
                "mono": time.monotonic_ns(),
                "host": host_name(), "common": common or {}}
        if results:
            head["results"] = 1
        self._head: bytes | None = None
        # Whether a recorder listened when this log last woke it (`ended` with `wait`):
        # nobody holds the directory's wake-up FIFO but its recorder.
        self.heard = False
        if head_with_first:
            self._head = _line(head)
        else:
            self._write(head)

    @property
    def ok(self) -> bool:
        """Every line so far was written (a full disk, a read-only mount: not)."""
        return not self._lost

    @property
    def path(self) -> str:
        return self._path

    def _write(self, entry: dict) -> None:
        line = _line(entry)
        if self._head is not None:
            line, self._head = self._head + line, None
        try:
            if os.write(self._fd, line) != len(line):
                raise OSError(errno.ENOSPC, "short write")
        except OSError as e:  # lineage must never fail the task; say it once
            self._lost = True
            if not self._said:
                self._said = True
                log.warning("roar: cannot write the task log %s: %s (tasks are not "
                            "recorded)", self.path, e)

    def workflow_begun(self, run: dict[str, Any]) -> None:
        """`run`: namespace, job_name, run_id, engine, started_at (ISO-8601), facets,
        engine_version ({name, version}); `started`: True where this producer has stored
        the run and spooled its START itself (the recorder then only ends it: as logged, or
        ABORT should the producer die first); "stored": stored, but the spool refused its
        START, which the recorder then sends (`Roar.hand_over_kept`)."""
        self._write({"wb": run})

    def workflow_ended(self, run_id: str, status: str, error: str | None = None) -> None:
        self._write({"we": run_id, "s": status, "m": error,
                     "t": now_iso()})

    def begun(self, meta: TaskMeta | dict[str, Any], lifetime: bool = False,
              own_dir: str | None = None) -> None:
        """`meta`: a TaskMeta, or its log form (TaskMeta's logged fields, `started_at` as
        ISO-8601, `workflow` and `engine_version` as dicts, `run_facets` as key ->
        fields, `declared` as Declared's fields, `secrets` a list) for producers that do
        not import the recording side.  `own_dir`: the task's own tracer session, a
        subdirectory of the log's directory."""
        entry: dict[str, Any] = {"b": meta if isinstance(meta, dict) else meta_to_json(meta)}
        if lifetime:
            entry["lifetime"] = True
        if own_dir is not None:
            entry["d"] = own_dir
        self._write(entry)

    def ended(self, run_id: str, status: str, *, error: str | None = None,
              exit_code: int | None = None, ended_at: datetime | None = None,
              captured: dict[str, Any] | None = None, pid: int | None = None,
              shadow: tuple[str, str] | None = None, read: dict[str, Any] | None = None,
              wait: bool = False, short_answer: bool = False,
              early: bool = False, left: dict[str, Any] | None = None) -> int | None:
        """`captured`: the task's versions as it ended (`capture.to_dict`), taken by the
        producer; without them the recorder takes them when it records the task.  `pid`:
        the task's own process, known only now.  `shadow`: (shadow root, workdir) -- the
        task ran in a shadow directory whose paths name files of the workdir.  `read`:
        with `captured`, what the producer's whole read of the task's own session found
        (`read_summary`): the recorder then need not read it again.  `wait`: returns a
        descriptor for `wait_for` (call it: it closes the descriptor); `short_answer`:
        the answer lists the first SHORT_ANSWER files of each kind and counts the rest
        (what `run --wait` shows), not all of them; `early`: the answer comes as soon as
        the task's lineage is known, before the recorder has stored it (`{"a": ...}`:
        for a producer that needs the lineage, not the store), then its recorded mark.
        `left`: the state each file the task may have written was in as it ended (path ->
        [device, inode, size, mtime, ctime], or None: missing), for a producer that goes
        on before the recorder has taken the versions: an output found in another state
        then is recorded as unknown (capture.as_left)."""
        entry = end_entry(run_id, status, error=error, exit_code=exit_code,
                          ended_at=ended_at, captured=captured, pid=pid, shadow=shadow,
                          read=read)
        if left is not None:
            entry["lf"] = left
        fd = None
        if wait:
            entry["w"] = 2 if short_answer else 1
            if early:
                entry["ea"] = 1
            fd = self._waiter(run_id)
        self._write(entry)
        if self._wake or wait:
            # An early answer's wake names this log: the recorder answers from it first,
            # before the rest of its pass (every other log read, ended tasks stored).
            self.heard = poke(f"{self._dir}/{WAKE}", self.name if early else "")
        return fd

    def closed(self, wait: bool = False) -> int | None:
        """Nothing more comes from this log: tasks begun and not ended are ABORT.  `wait`:
        returns a descriptor for `wait_for`, poked once every task of the log is
        recorded."""
        fd = self._waiter(self.name) if wait else None
        self._write({"closed": 1, "w": 1} if wait else {"closed": 1})
        poke(f"{self._dir}/{WAKE}")
        return fd

    def _waiter(self, key: str) -> int | None:
        try:
            return _mkfifo(f"{self._dir}/{WAIT_PREFIX}{key}")
        except OSError:
            return None

    def wait_for(self, key: str, fd: int | None, timeout: float | None, *,
                 keep: bool = False) -> bool:
        """Wait until the recorder pokes `fd` (from `ended`/`closed` with wait) or the
        timeout; then read its marks into `results`.  True when `key` (a run id, or this
        log's name for `closed`) is recorded.  `keep`: the descriptor stays open, to wait
        again (close it with `done_waiting`)."""
        try:
            if fd is not None:
                select.select([fd], [], [], timeout)
                if keep:
                    drain_fifo(fd)
        finally:
            if fd is not None and not keep:
                os.close(fd)
                try:
                    os.unlink(f"{self._dir}/{WAIT_PREFIX}{key}")
                except OSError:
                    pass
        self.read_results()
        if key == self.name:
            return bool(self.results) and all(r is not None for r in self.results.values())
        return self.results.get(key) is not None

    def done_waiting(self, key: str, fd: int | None) -> None:
        """Close a descriptor kept by `wait_for(keep=True)`."""
        if fd is not None:
            os.close(fd)
            try:
                os.unlink(f"{self._dir}/{WAIT_PREFIX}{key}")
            except OSError:
                pass

    def read_results(self) -> None:
        """The recorder's marks appended since the last read."""
        with self._reading:
            self._read_results()

    def _read_results(self) -> None:
        # Small reads first: os.pread allocates all it may return (16 MiB took ~0.1 ms in
        # a process just forked), and what follows our last read is mostly a few marks.
        size = READ_FIRST
        while True:
            try:
                data = os.pread(self._fd, size, self._read_at)
            except OSError:
                return
            end = data.rfind(b"\n") + 1
            self._read_at += end
            for raw in data[:end].splitlines():
                # Only these lines matter here (an end line may be megabytes: not parsed).
                if raw.startswith(_MARK_PREFIXES):
                    try:
                        self._apply(json.loads(raw))
                    except (ValueError, KeyError, TypeError):
                        pass
            if len(data) < size:
                return
            if end == 0:  # a line longer than the read: a bigger one
                if size == READ_MAX:
                    return
                size = min(size * 16, READ_MAX)

    def _apply(self, d: dict[str, Any]) -> None:
        """One begin line of ours or one mark of the recorder's, into `results`."""
        results = self.results
        kind = next(iter(d))
        if kind == "b":
            results.setdefault(d["b"]["run_id"], None)
        elif kind == "r":
            if d["r"] in results:  # a task's (not a workflow run's)
                # (Without "res" after an early answer: that stays the answer.)
                results[d["r"]] = d.get("res") or results[d["r"]] or {}
        elif kind == "a":  # an early answer (`ended(early=True)`)
            if d["a"] in results and not results[d["a"]]:
                results[d["a"]] = d["res"]
        elif kind == "fail":  # not recorded (yet): the recorder keeps it and tries again
            if d["fail"] in results and not results[d["fail"]]:
                results[d["fail"]] = {"ok": False, "status": "ABORT", "error": d.get("m"),
                                      "kept": True}

    def remove(self) -> None:
        """Done with it, every task recorded: the file goes (the recorder would remove it
        once this process is gone)."""
        try:
            os.unlink(self._path)
        except OSError:
            pass

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Entry(Slotted):
    """One task as a log tells it."""

    __slots__ = ("meta", "lifetime", "outcome", "started", "recorded", "captured", "own_dir",
                 "shadow", "waited", "died", "records", "dropped", "failures", "retry_at",
                 "error", "taken", "read", "short", "early", "answered", "left")

    def __init__(self, meta: TaskMeta, lifetime: bool = False, *,
                 own_dir: str | None = None) -> None:
        self.meta = meta
        self.lifetime = lifetime
        self.outcome: TaskOutcome | None = None  # None: not ended (yet)
        self.started = False  # START recorded
        self.recorded = False
        self.captured: dict[str, Any] | None = None  # its versions, taken as it ended
        self.own_dir = own_dir
        self.shadow: tuple[str, str] | None = None
        self.waited = False
        self.short = False  # its waiting producer wants a short answer
        self.early = False  # ... as soon as its lineage is known (before the store)
        self.answered = 0.0  # when that early answer was given (time.monotonic()), or 0
        # the states the task left its files in (`TaskLog.ended(left=)`): the versions are
        # taken after its producer went on
        self.left: dict[str, Any] | None = None
        self.died = False  # its producer went away before it ended (outcome made for it)
        self.records: list | None = None  # its tracer records, once taken (for a retry)
        self.dropped = 0
        self.failures = 0  # attempts to record it that failed (it is kept and retried)
        self.retry_at = 0.0  # time.monotonic() of its next attempt
        self.error: str | None = None  # why the last attempt failed, as marked in its log
        # its Capture, when its producer records it in-process (`captured`)
        self.taken: Any = None
        # its own session as its producer read it whole (`read_summary`), with `captured`
        self.read: dict[str, Any] | None = None


class Workflow(Slotted):
    """A workflow run a log began."""

    __slots__ = ("run", "ended", "started", "done")

    def __init__(self, run: dict[str, Any]) -> None:
        self.run = run
        # (status, error, when)
        self.ended: tuple[str, str | None, datetime] | None = None
        # Stored and its START spooled by the producer itself (Ray's driver, before its
        # tasks may name it): the recorder only ends it.  ("stored": it sends the START.)
        self.started = run.get("started") is True
        self.done = False


def _pread_all(fd: int, offset: int) -> bytes:
    """What the file holds from `offset` on (a producer may be appending meanwhile: what
    a read returns short of its size is the end, for now)."""
    chunks = []
    while True:
        chunk = os.pread(fd, 65536, offset)
        chunks.append(chunk)
        if len(chunk) < 65536:
            return b"".join(chunks) if len(chunks) > 1 else chunk
        offset += len(chunk)


class TaskLogFile(Slotted):
    """A task log as read so far (`read_more` picks up what was appended since)."""

    __slots__ = ("path", "pid", "start", "boot", "host", "entries", "common", "workflows",
                 "closed", "close_waited", "results", "mono", "_offset", "_fd")

    def __init__(self, path: str, pid: int, start: int, host: str, *,
                 common: dict[str, Any] | None = None, results: bool = False,
                 mono: int | None = None, boot: int | None = None) -> None:
        self.path = path
        self.pid = pid
        self.start = start
        self.boot = boot
        self.host = host
        # Tasks not recorded yet, by run id, in begin order (a recorded one is dropped)
        self.entries: dict[str, Entry] = {}
        self.common = {} if common is None else common
        self.workflows: dict[str, Workflow] = {}
        self.closed = False
        self.close_waited = False
        self.results = results  # mark every task with its Result
        self.mono = mono  # CLOCK_MONOTONIC at its creation
        self._offset = 0
        self._fd = -1  # held open by a follower (`open(hold=True)`) until `close`

    @property
    def name(self) -> str:
        return os.path.basename(self.path)[:-len(SUFFIX)]

    @classmethod
    def open(cls, path: str | os.PathLike, *, hold: bool = False) -> TaskLogFile | None:
        """None while the header line is not complete (or not a task log).  `hold`: keep
        the log open for the reads to come (a follower reads each log a few times a task:
        one read is then one pread, not an open, six calls about it and a close), while
        fewer than `_HOLD_MAX` are held; `close` lets it go."""
        global _held
        path = os.fspath(path)
        try:
            fd = os.open(path, _OPEN_READ)
        except OSError:
            return None
        try:
            data = _pread_all(fd, 0)
        except OSError:
            os.close(fd)
            return None
        first, nl, rest = data.partition(b"\n")
        j = None
        if nl:
            try:
                head = json.loads(first)
                j = cls(path, int(head["pid"]), int(head["start"]), str(head["host"]),
                        common=dict(head.get("common") or {}),
                        results=bool(head.get("results")), mono=head.get("mono"),
                        boot=head.get("boot"))
            except (ValueError, KeyError, TypeError):
                log.warning("roar: %s is not a task log", path)
        if j is not None and hold and _held < _HOLD_MAX:
            j._fd, _held = fd, _held + 1
        else:
            os.close(fd)
        if j is not None:
            j._offset = len(first) + 1
            j._apply(rest)
        return j

    def close(self) -> None:
        global _held
        if self._fd >= 0:
            os.close(self._fd)
            self._fd, _held = -1, _held - 1

    def __del__(self) -> None:  # a follower dropped without its close: its places back
        try:
            self.close()
        except Exception:  # (at the interpreter's exit: nothing to give back to)
            pass

    def read_more(self) -> list[Entry]:
        """Apply the complete lines appended since the last read; returns tasks begun."""
        try:
            if self._fd >= 0:
                data = _pread_all(self._fd, self._offset)
            else:
                fd = os.open(self.path, _OPEN_READ)
                try:
                    data = _pread_all(fd, self._offset)
                finally:
                    os.close(fd)
        except OSError:
            return []
        return self._apply(data)

    def _apply(self, data: bytes) -> list[Entry]:
        from datetime import datetime

        end = data.rfind(b"\n") + 1  # a line not complete yet waits for the next read
        if not end:
            return []
        self._offset += end
        begun = []
        for raw in data[:end].splitlines():
            try:
                d = _loads(raw)
                if "b" in d:
                    meta = meta_from_json({"host": self.host, **self.common, **d["b"]})
                    entry = self.entries[meta.run_id] = Entry(
                        meta, bool(d.get("lifetime")), own_dir=d.get("d"))
                    begun.append(entry)
                elif "e" in d and d["e"] in self.entries:
                    from roar_core.pipeline.writer import TaskOutcome

                    entry = self.entries[d["e"]]
                    entry.outcome = TaskOutcome(
                        d["s"], datetime.fromisoformat(d["t"]), d.get("x"), d.get("m"))
                    entry.captured = d.get("c")
                    entry.read = d.get("rd")
                    if d.get("p") is not None:
                        entry.meta.pid = d["p"]
                    entry.shadow = tuple(d["sh"]) if d.get("sh") else None
                    entry.waited = bool(d.get("w"))
                    entry.short = d.get("w") == 2
                    entry.early = bool(d.get("ea"))
                    entry.left = d.get("lf")
                elif "fail" in d and d["fail"] in self.entries:
                    self.entries[d["fail"]].error = d.get("m")
                elif "started" in d and d["started"] in self.entries:
                    self.entries[d["started"]].started = True
                elif "r" in d:
                    if d["r"] in self.entries:  # recorded: no longer work left
                        self.entries.pop(d["r"]).recorded = True
                    elif d["r"] in self.workflows:
                        self.workflows[d["r"]].done = True
                elif "wb" in d:
                    self.workflows[d["wb"]["run_id"]] = Workflow(d["wb"])
                elif "ws" in d and d["ws"] in self.workflows:
                    self.workflows[d["ws"]].started = True
                elif "we" in d and d["we"] in self.workflows:
                    self.workflows[d["we"]].ended = (d["s"], d.get("m"),
                                                     datetime.fromisoformat(d["t"]))
                elif "closed" in d:
                    self.closed = True
                    self.close_waited = bool(d.get("w"))
            except (ValueError, KeyError, TypeError) as e:
                log.warning("roar: skipping a bad line of %s: %s", self.path, e)
        return begun

    def unrecorded(self) -> list[Entry]:
        return list(self.entries.values())

    def ended_unrecorded(self) -> int:
        """Tasks that ended and wait for the recorder (what a drain waits for)."""
        return sum(1 for e in self.entries.values() if e.outcome)

    def alive(self) -> bool:
        return process_alive(self.pid, self.start, self.boot)


class Result:
    """A recorded task as its producer is told (the recorder's `res` mark): read as plain
    JSON, turned into emission records only when asked (a task process may never need the
    OpenLineage client; importing it costs ~0.2 s)."""

    def __init__(self, data: dict[str, Any] | None):
        self.data = data or {}

    @classmethod
    def failed(cls, status: str, error: str) -> Result:
        return cls({"ok": False, "status": status, "error": error})

    @property
    def ok(self) -> bool:
        return bool(self.data.get("ok"))

    @property
    def status(self) -> str:
        return self.data.get("status", "ABORT")

    @property
    def error(self) -> str | None:
        return self.data.get("error")

    @property
    def counts(self) -> tuple[int, int]:
        """(inputs, outputs): outputs with the deleted files, which are DROP outputs."""
        if (n := self.data.get("counts")) is not None:  # a short answer
            return n["inputs"], n["outputs"] + n["deleted"]
        return len(self.data.get("inputs") or []), len(self.data.get("outputs") or [])

    @property
    def inputs(self) -> list:
        return [_dataset(x) for x in self.data.get("inputs") or []]

    @property
    def outputs(self) -> list:
        return [_dataset(x) for x in self.data.get("outputs") or []]

    @property
    def task(self):
        from roar_core.pipeline.emission import TaskInfo

        return TaskInfo(**self.data["task"]) if self.data.get("task") else None

    @property
    def io(self):
        from roar_core.pipeline.emission import IOCheck

        return IOCheck(**self.data["io"]) if self.data.get("io") else None


def _dataset(x: dict[str, Any]):
    from roar_core.pipeline.emission import Dataset

    x = dict(x)
    x["symlinks"] = [tuple(s) for s in x.get("symlinks") or []]
    x["previous"] = tuple(x["previous"]) if x.get("previous") else None
    return Dataset(**x)


def log_paths(directory: str | os.PathLike) -> list[str]:
    # scandir and a prefix test, not glob: a worker's session holds a tracer log for every
    # process it ever forked, each of which glob would match against the pattern.
    try:
        with os.scandir(directory) as entries:
            names = [e.name for e in entries
                     if e.name.startswith(PREFIX) and e.name.endswith(SUFFIX)]
    except OSError:  # gone: no logs
        return []
    return [os.path.join(directory, n) for n in sorted(names)]


def task_logs(directory: str | os.PathLike) -> list[TaskLogFile]:
    """Every readable task log in a directory."""
    return [j for p in log_paths(directory) if (j := TaskLogFile.open(p)) is not None]


class Outstanding(Slotted):
    """A task of a log not recorded yet, as a light reading tells it (no TaskMeta made:
    that imports the OpenLineage client, which `roar-core run` must not wait for)."""

    __slots__ = ("run_id", "ended", "dead", "error")

    def __init__(self, run_id: str, ended: bool, dead: bool, error: str | None) -> None:
        self.run_id = run_id
        self.ended = ended
        self.dead = dead  # its producer is gone (or closed the log)
        self.error = error  # why the recorder's last attempt failed


def outstanding(directory: str | os.PathLike, live: list[str] | None = None
                ) -> list[Outstanding]:
    """The tasks of the directory's logs (of this host) that are not recorded.  `live`:
    given a list, the logs whose producers are alive and have not closed them are added
    to it."""
    host = host_name()
    out = []
    for path in log_paths(directory):
        try:
            with open(path, "rb") as f:
                lines = f.read().splitlines()
            head = json.loads(lines[0])
            if head["host"] != host:
                continue
            dead = not process_alive(int(head["pid"]), int(head["start"]), head.get("boot"))
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue
        tasks: dict[str, Outstanding] = {}
        for raw in lines[1:]:
            try:
                d = json.loads(raw)
                if "b" in d:
                    run_id = d["b"]["run_id"]
                    tasks[run_id] = Outstanding(run_id, False, dead, None)
                elif "e" in d and d["e"] in tasks:
                    tasks[d["e"]].ended = True
                elif "r" in d:
                    tasks.pop(d["r"], None)
                elif "fail" in d and d["fail"] in tasks:
                    tasks[d["fail"]].error = d.get("m")
                elif "closed" in d:
                    dead = True
            except (ValueError, KeyError, TypeError):
                continue
        for t in tasks.values():
            t.dead = dead
        out += tasks.values()
        if live is not None and not dead:
            live.append(path)
    return out
