"""A warm parent for recorders: one long-lived process per installation, user and control
group that has imported what a recorder needs and forks one per request.

A recorder is started once per session directory: per `snakemake` invocation, per Ray
job on each node, per CLI home.  Started from a fresh interpreter, each paid ~0.4 s of
CPU importing SQLAlchemy and the OpenLineage client before recording anything (measured:
0.54 s of CPU for a one-task recorder, 0.40 s of it imports) -- more than the lineage of a
small workflow costs, taken from the tasks on a small machine.  Forked from this server, a
recorder starts with all of it imported.

A producer asks over a Unix socket (`start`), passing its working directory and
environment (the recorder runs as if the producer had started it); with no server it
starts one (detached, like a recorder), which then serves that first request.  Anything
wrong here -- no usable runtime directory, a server that does not answer -- and the
producer starts the recorder the old way, from a fresh interpreter.  The server serves
only its own user and only the code it imported: the socket's name carries the
interpreter, the import path, the installed roar_core's files' times, the cgroup and the
mount and PID namespaces, so after an upgrade or an edit producers start a new server and
the old one idles out, and a recorder always sees the files and processes its producer does.

    python -m roar_core.recording.forkserver SOCKET DIRECTORY
"""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import struct
import sys
import time
import zlib

TYPE_CHECKING = False  # not typing's (see roar_core.slotted)
if TYPE_CHECKING:  # a producer never imports socket (see _ask); the server does
    import socket

IDLE_EXIT_S = 900.0  # no request for this long: exit (the next producer starts another)
ANSWER_S = 5.0  # a producer waits this long for the server's answer, then starts its own
_REQUEST_MAX = 1 << 20

_socket_path: str | None = None


def socket_path() -> str | None:
    """This installation's server socket (None: no private runtime directory here)."""
    global _socket_path
    if _socket_path is None:
        # Not $TMPDIR: tools (and tests) point it at short-lived directories, and a server
        # there would be one per directory.
        base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
        d = os.path.join(base, f"roar-{os.getuid()}")
        try:
            try:
                os.mkdir(d, 0o700)  # not its parents: a missing runtime dir is no place
            except FileExistsError:
                pass
            d = os.path.realpath(d)
            st = os.stat(d)
        except OSError:
            return None
        # Another user's directory, or one others can write: a socket there could be theirs.
        if st.st_uid != os.getuid() or st.st_mode & 0o077 or not stat.S_ISDIR(st.st_mode):
            return None
        _socket_path = os.path.join(d, f"fork-{_code_key()}.sock")
    return _socket_path


def _code_key() -> str:
    import roar_core
    from roar_core.recording.recorder import absolute_pythonpath

    # PYTHONPATH as the server will have it: `PYTHONPATH=src` in two projects is two paths.
    pythonpath = os.environ.get("PYTHONPATH", "")
    if pythonpath:
        try:
            pythonpath = absolute_pythonpath(pythonpath, os.getcwd())
        except OSError:
            pass
    parts = [os.path.realpath(sys.executable), sys.prefix, pythonpath,
             os.environ.get("PYTHONHOME", ""), sys.version, _cgroup(), _namespaces()]
    top = os.path.dirname(roar_core.__file__)
    with os.scandir(top) as entries:
        subs = [e.path for e in entries if e.is_dir() and not e.name.startswith("_")]
    for d in (top, *sorted(subs)):
        for entry in os.scandir(d):
            if entry.name.endswith(".py"):
                st = entry.stat()
                parts.append(f"{entry.path}\0{st.st_mtime_ns}\0{st.st_size}")
    # A name, not a secret (the directory is private): two cheap checksums, no hashlib
    # import (OpenSSL's, ~3 ms) on a producer's path.
    data = "\0".join(parts).encode("utf-8", "surrogateescape")
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"


def _cgroup() -> str:
    """The control group we run in.  A server serves its own only: a batch system (Slurm)
    kills every process of a job's cgroup when the job ends, so recorders forked for
    another job from this job's server would go with it."""
    try:
        with open("/proc/self/cgroup") as f:
            return f.read()
    except OSError:
        return ""


def _namespaces() -> str:
    """The mount and PID namespaces we run in.  A recorder must see the files (a mount
    namespace of the producer's own: `unshare -m`, a container sharing the runtime
    directory) and the processes of its producers as they do: one forked by a server in
    another namespace recorded into a home that, for the producer, was mounted read-only."""
    out = []
    for ns in ("mnt", "pid"):
        try:
            out.append(os.readlink(f"/proc/self/ns/{ns}"))
        except OSError:
            out.append("")
    return " ".join(out)


def start(directory: str | os.PathLike, env: dict[str, str]) -> bool:
    """Have the server fork `directory`'s recorder with the environment `env`, starting
    the server if none runs.  False: no server can be used here (the caller starts the
    recorder itself)."""
    path = socket_path()
    if path is None:
        return False
    request = json.dumps({"dir": os.fspath(directory), "cwd": os.getcwd(), "env": env,
                          "umask": _umask()}).encode("utf-8", "surrogateescape")
    if _ask(path, request):
        return True
    _spawn_server(path, directory, env)
    return True


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _ask(path: str, request: bytes) -> bool:
    # _socket's: the socket module's own import (its enums) cost every `roar-core run` ~2 ms.
    import _socket

    try:
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    except OSError:
        return False
    try:
        s.settimeout(ANSWER_S)
        s.connect(path)
        s.sendall(struct.pack("!I", len(request)) + request)
        return s.recv(16).startswith(b"ok")
    except OSError:
        return False
    finally:
        s.close()


def _spawn_server(path: str, directory: str | os.PathLike, env: dict[str, str]) -> None:
    from roar_core.recording.recorder import start_detached

    start_detached("roar_core.recording.forkserver", [path, os.fspath(directory)],
                   _beside(path, ".log"), env)


def _beside(socket: str, suffix: str) -> str:
    """The server's log or lock: the socket's name with another suffix."""
    return os.path.splitext(socket)[0] + suffix


# ---------------------------------------------------------------------------------------------
# The server


def _warm() -> None:
    """Import what a recorder imports (no connection, thread or file opened: all of it is
    shared with every child, copy-on-write)."""
    import logging  # noqa: F401
    import tempfile

    import openlineage.client  # noqa: F401
    import openlineage.client.serde  # noqa: F401
    import openlineage.client.transport.file  # noqa: F401
    import openlineage.client.transport.http  # noqa: F401
    import sqlalchemy.dialects.sqlite.pysqlite  # noqa: F401

    import roar_core.api  # noqa: F401
    import roar_core.pipeline.delivery  # noqa: F401
    import roar_core.pipeline.facets  # noqa: F401 - a task's begin line names its facets
    import roar_core.pipeline.writer  # noqa: F401
    import roar_core.recording.follower  # noqa: F401
    import roar_core.recording.recorder  # noqa: F401

    try:
        from roar_core.pipeline import emission

        emission.provenance_facets()  # the machine and package set, taken once here
        with tempfile.TemporaryDirectory(prefix="roar-warm-") as d:
            _rehearse(d)
    except Exception as exc:  # noqa: BLE001 - a warm-up: its children only do more work
        print(f"roar: fork server warm-up: {type(exc).__name__}: {exc}", file=sys.stderr)


def _rehearse(d: str) -> None:
    """Record a write and a read of one file into a throwaway store, and serialize an
    event: what a recorder first does once per process -- SQLAlchemy's mapper set-up and
    the memos on our prebuilt statements, roar's bulk-insert plans, the client's event
    types -- is then done here once, not in every child (measured, per recorder: ~30 of
    ~65 ms of CPU were these)."""
    from datetime import datetime, timezone

    from openlineage.client.serde import Serde

    from roar_core.pipeline import delivery, emission
    from roar_core.pipeline.store import Store
    from roar_core.pipeline.store_records import Access, TaskRun

    now = datetime.now(timezone.utc)
    digest = "0" * 64
    store = Store.open(home=os.path.join(d, "home"))
    f = os.path.join(d, "f")
    try:
        for n, role in ((1, "output"), (2, "input")):
            run_id = f"00000000-0000-7000-8000-{n:012d}"
            store.finish_task_run(
                run_id, "COMPLETE", now, 0, accesses=[Access(f, role, digest, 1, 1)],
                started=TaskRun(run_id=run_id, engine="warm", namespace="warm",
                                job_name="warm", started_at=now))
    finally:
        store.close()
    data = emission.Dataset(*emission.file_dataset(f, None), digest=digest, size=1)
    event = emission.complete_event(emission.TaskLineage(
        namespace="warm", job_name="warm", run_id=run_id, inputs=[data], outputs=[data]))
    Serde.to_json(delivery.rebuild_event(event))


def serve(path: str, first: str) -> int:
    import fcntl

    lock = os.open(_beside(path, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        # Another server started at the same moment: this process records the directory
        # it was started for itself.
        os.close(lock)
        return _record(first)
    try:
        listener = _listen(path)
    except OSError as exc:
        print(f"roar: no recorder fork server at {path}: {exc}", file=sys.stderr)
        os.close(lock)
        return _record(first)
    ident = os.stat(path).st_ino
    set_title("roar_core.recording.forkserver", path)
    # The directory it was started for is that producer's (`start_detached` starts it in
    # /), and may be a scratch one removed as soon as the producer returns: the first
    # recorder goes there (if it still exists), and the server itself holds no directory.
    from roar_core.recording.recorder import START_DIR

    cwd = os.environ.pop(START_DIR, None)
    if cwd is None:  # started by hand
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = "/"
    os.chdir("/")
    # Its children get sessions (and autogroups) of their own; while it imports, the tasks
    # starting beside it come first.
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write("19")
    except OSError:
        pass
    _warm()
    import threading

    from roar_core.heap import freeze_heap

    if threading.active_count() > 1:  # a fork would copy their locks, held or not
        print("roar: threads after the fork server's warm-up: not serving", file=sys.stderr)
        listener.close()
        return _record(first, cwd)
    try:
        # Serving in a session, and so an autogroup, of its own at the default weight: the
        # niced one above was for the imports; a producer waits for each answer.
        os.setsid()
    except OSError:
        pass

    freeze_heap()  # (and out of the children's collections, and so their pages stay shared)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    if not _fork(listener, {"dir": os.fspath(first), "cwd": cwd,
                            "env": dict(os.environ), "umask": _umask()}):
        listener.close()
        return _record(first, cwd)
    last = time.monotonic()
    while True:
        if time.monotonic() - last >= IDLE_EXIT_S:
            # Our files go with us (a server per code version would leave three each).
            for p in (path, _beside(path, ".log"), _beside(path, ".lock")):
                try:
                    if not p.endswith(".log") or not os.stat(p).st_size:
                        os.unlink(p)
                except OSError:
                    pass
            return 0
        ready, _, _ = select.select([listener], [], [], 30.0)
        try:
            if os.stat(path).st_ino != ident:
                return 0  # our socket was removed (a clean /tmp): leave it to a new server
        except FileNotFoundError:
            return 0
        if not ready:
            continue
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        with conn:
            request = _read_request(conn)
            if request is None:
                continue
            try:
                # Answered before the fork (a few ms for a process this size), which the
                # producer need not wait for.
                conn.sendall(b"ok")
            except OSError:
                pass
            _fork(listener, request, conn)
        last = time.monotonic()


def _record(directory: str, cwd: str | None = None) -> int:
    """No serving after all: this process is the directory's recorder (in `cwd`, as a
    forked one would be, where it still exists)."""
    from roar_core.recording import recorder

    if cwd is not None:
        try:
            os.chdir(cwd)
        except OSError:
            pass

    set_title("roar_core.recording.recorder", directory)
    return recorder.main([directory])


def _listen(path: str) -> socket.socket:
    import socket

    try:
        os.unlink(path)  # a dead server's (we hold the lock: no live one's)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        listener.bind(path)
        listener.listen(64)
    except OSError:
        listener.close()
        raise
    return listener


def _read_request(conn: socket.socket) -> dict | None:
    import socket

    conn.settimeout(2.0)
    try:
        uid = struct.unpack("3i", conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
        if uid != os.getuid():
            return None
        head = _recv_exactly(conn, 4)
        size = struct.unpack("!I", head)[0]
        if size > _REQUEST_MAX:
            return None
        return json.loads(_recv_exactly(conn, size).decode("utf-8", "surrogateescape"))
    except (OSError, ValueError, struct.error):
        return None


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise OSError("short request")
        data += chunk
    return data


def _fork(listener: socket.socket, request: dict, conn: socket.socket | None = None) -> int:
    try:
        pid = os.fork()
    except OSError:
        return 0
    if pid:
        return pid
    # The child: becomes the recorder the producer would have started.
    code = 1
    try:
        listener.close()
        if conn is not None:
            conn.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        directory = request["dir"]
        os.umask(int(request["umask"]))
        try:
            os.chdir(request["cwd"])
        except OSError:
            os.chdir("/")  # (a removed directory: the recorder uses absolute paths)
        os.environ.clear()
        os.environ.update(request["env"])
        set_title("roar_core.recording.recorder", directory)
        fd = os.open(os.devnull, os.O_RDWR)
        os.dup2(fd, 0)
        os.dup2(fd, 1)
        os.close(fd)
        from roar_core.recording import recorder

        fd = os.open(os.path.join(directory, recorder.LOG),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        code = recorder.main([directory])
    except BaseException:  # noqa: BLE001 - a child never returns into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code or 0)


def set_title(module: str, arg: str) -> None:
    """The command line `python -m module arg` (what `ps` shows, and how tools find a
    directory's recorder, forked or not)."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(f"{sys.executable} -m {module} {arg}")


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], sys.argv[2]))
