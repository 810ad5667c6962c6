"""Tracer control: where the preload shim is, whether it works here, how to attach it
to a child process, and the task-tag API of a shim already loaded in this process."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from roar_core.slotted import Frozen

# ctypes, subprocess, shlex, tempfile and the log reader are imported where they are used, and
# paths are strings (pathlib: ~4 ms to import, with urllib.parse): this module is on
# `roar-core run`'s path, which must start the command within milliseconds.

LIB_NAME = "libroar_preload.so"
ENV_SESSION = "ROAR_SESSION_DIR"
ENV_TAG = "ROAR_TASK_TAG"
ENV_TRACER_OFF = "ROAR_TRACER_OFF"


def library_path() -> str:
    """The shim built with this package (`ROAR_PRELOAD_LIB` overrides, for development)."""
    override = os.environ.get("ROAR_PRELOAD_LIB")
    if override:
        return override
    from roar_core import _bin

    return os.path.join(_bin.directory(), LIB_NAME)


DISABLED_REASON = f"{ENV_TRACER_OFF} is set: the tracer is switched off"


def disabled_by_env() -> bool:
    """ROAR_TRACER_OFF as the shim reads it (env_true() in roar_preload.c)."""
    return os.environ.get(ENV_TRACER_OFF, "").lower() not in ("", "0", "false")


class TracerStatus(Frozen):
    __slots__ = ("path", "usable", "reason")

    def __init__(self, path: str, usable: bool, reason: str) -> None:
        # reason: why not, or a short description of what was checked
        self._set(path=path, usable=usable, reason=reason)


@functools.lru_cache(maxsize=1)
def status() -> TracerStatus:
    """Check, once per process, that the shim loads and writes a log here."""
    import subprocess
    import tempfile

    from roar_core.pipeline import tracelog

    lib = library_path()
    if disabled_by_env():
        # The shim would load and record nothing, which the probe below would misreport
        # as "wrote no trace log".
        return TracerStatus(lib, False, DISABLED_REASON)
    if not os.path.isfile(lib):
        return TracerStatus(lib, False, f"{lib} is missing (reinstall roar-core to build it)")
    with tempfile.TemporaryDirectory(prefix="roar-probe-") as d:
        env = preload_env(d, base=os.environ)
        try:
            proc = subprocess.run(
                # -I -S: no site import, a third of the start-up (engines probe at start).
                [sys.executable, "-I", "-S", "-c", "open('/dev/null').close()"],
                env=env, capture_output=True, timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return TracerStatus(lib, False, f"probe failed to run: {e}")
        if b"cannot be preloaded" in proc.stderr or b"ERROR: ld.so" in proc.stderr:
            line = proc.stderr.decode(errors="replace").strip().splitlines()[0]
            return TracerStatus(lib, False, f"the loader refused the shim: {line}")
        trace = tracelog.read_session(d)
        if not trace.logs:
            return TracerStatus(lib, False, "the shim loaded but wrote no trace log")
        seen = any(r.path == b"/dev/null" for log in trace.logs for r in log.records)
        if not seen:
            return TracerStatus(lib, False, "the shim did not record the probe's open()")
    return TracerStatus(lib, True, f"{lib} records file events")


def shell_lines(changes: Mapping[str, str | None]) -> str:
    """Shell lines making these environment changes (`roar-core env ENGINE`): `export`, or
    `unset` where the value is None."""
    import shlex

    return "".join(f"export {k}={shlex.quote(v)}\n" if v is not None else f"unset {k}\n"
                   for k, v in changes.items())


def with_changes(changes: Mapping[str, str | None], base: Mapping[str, str]) -> dict[str, str]:
    """`base` with these environment changes made (`roar-core exec`): None unsets."""
    env = dict(base)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def preload_env(
    session_dir: str | os.PathLike,
    tag: str | None = None,
    base: dict[str, str] | os._Environ | None = None,
) -> dict[str, str]:
    """Environment for a traced child: our shim first in LD_PRELOAD, the session dir,
    and the task tag the child starts in."""
    env = dict(os.environ if base is None else base)
    lib = library_path()
    existing = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p != lib]
    env["LD_PRELOAD"] = " ".join([lib, *existing])
    env[ENV_SESSION] = str(session_dir)
    if tag:
        env[ENV_TAG] = tag
    else:
        env.pop(ENV_TAG, None)
    return env


class Shim:
    """The task-tag API of the shim preloaded into this process (ctypes, no new load)."""

    def __init__(self, lib):
        import ctypes

        self._lib = lib
        lib.roar_task_begin.argtypes = [ctypes.c_char_p]
        lib.roar_task_begin.restype = ctypes.c_int
        lib.roar_task_end.argtypes = []
        lib.roar_task_end.restype = ctypes.c_int
        lib.roar_process_tag.argtypes = [ctypes.c_char_p]
        lib.roar_process_tag.restype = ctypes.c_int
        lib.roar_flush.restype = ctypes.c_int
        lib.roar_thread_ignore.restype = ctypes.c_int
        self._unignore = getattr(lib, "roar_thread_unignore", None)  # an older shim: none
        if self._unignore is not None:
            self._unignore.restype = ctypes.c_int
        lib.roar_dropped.restype = ctypes.c_uint64
        lib.roar_version.restype = ctypes.c_int
        lib.roar_active.restype = ctypes.c_int
        lib.roar_log_path.restype = ctypes.c_char_p
        self._reserved = getattr(lib, "roar_log_reserved", None)  # an older shim: none
        if self._reserved is not None:
            self._reserved.restype = ctypes.c_uint64
        self._written = getattr(lib, "roar_written_since", None)  # an older shim: none
        if self._written is not None:
            self._written.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
            self._written.restype = ctypes.c_long
            # Made here, once: a new array type took ~0.2 ms in a task process just forked.
            self._names = ctypes.c_char * _WRITTEN_FIRST
        self._buffer = ctypes.create_string_buffer
        self._object = getattr(lib, "roar_object", None)  # an older shim: none
        if self._object is not None:
            self._object.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_char_p,
                                     ctypes.c_size_t, ctypes.c_int64]
            self._object.restype = ctypes.c_int
            lib.roar_thread_tag.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            lib.roar_thread_tag.restype = ctypes.c_int
            lib.roar_thread_adopt.argtypes = [ctypes.c_char_p]
            lib.roar_thread_adopt.restype = ctypes.c_int

    def begin(self, tag: str) -> None:
        if self._lib.roar_task_begin(tag.encode("utf-8", "surrogateescape")) != 0:
            raise ValueError(f"task tag rejected (empty or longer than 255 bytes): {tag!r}")

    def end(self) -> None:
        self._lib.roar_task_end()

    def quiet(self, dirs: Iterable[bytes | str]) -> None:
        """Files in `dirs` (an engine's own logs, roar's own files) are never lineage: a
        descriptor held open to one is not looked at as each task begins and ends."""
        import ctypes

        quiet_dir = getattr(self._lib, "roar_quiet_dir", None)  # an older shim: none
        if quiet_dir is None:
            return
        quiet_dir.argtypes = [ctypes.c_char_p]
        quiet_dir.restype = ctypes.c_int
        for d in dirs:
            quiet_dir(os.fsencode(d))

    def process_tag(self, tag: str | None) -> None:
        self._lib.roar_process_tag(tag.encode("utf-8", "surrogateescape") if tag else None)

    def ignore_thread(self) -> None:
        """This thread is roar's own: its file operations are never recorded."""
        self._lib.roar_thread_ignore()

    @contextmanager
    def ignoring(self) -> Iterator[None]:
        """This thread's file operations are not recorded within the block (roar's own
        work on a task's thread, as the task ends)."""
        if self._unignore is None:
            raise RuntimeError("this shim cannot ignore a thread for a while")
        self._lib.roar_thread_ignore()
        try:
            yield
        finally:
            self._unignore()

    def has_objects(self) -> bool:
        """Whether this shim takes object-store records (roar_core.pipeline.s3trace)."""
        return self._object is not None

    def object(self, kind: int, uri: bytes, fields: bytes, size: int) -> None:
        """An object-store access, into this process's trace log under this thread's tag."""
        self._object(kind, uri, fields, len(fields), size)

    def thread_tag(self) -> bytes | None:
        """The tag this thread's records get now (its task's, or the process fallback)."""
        buf = self._buffer(256)  # one per call: ctypes releases the GIL during it
        n = self._lib.roar_thread_tag(buf, len(buf))
        return buf.raw[:n] if n > 0 else None

    def adopt(self, tag: bytes | None) -> int:
        """This pool thread records under `tag` (None: gives it back); -1 if it has a
        task of its own."""
        return self._lib.roar_thread_adopt(tag)

    def flush(self) -> bool:
        return self._lib.roar_flush() == 0

    def dropped(self) -> int:
        return int(self._lib.roar_dropped())

    def version(self) -> int:
        return int(self._lib.roar_version())

    def active(self) -> bool:
        return bool(self._lib.roar_active())

    @property
    def reads_written(self) -> bool:
        """Whether this shim can say what this process wrote (`written_since`)."""
        return self._written is not None

    def written_since(self, offset: int) -> set[bytes] | None:
        """What tracelog.written_since reads from this process's own log from `offset`,
        read by the shim from its mapping of the log (no file opened, no record parsed
        here); None where the log cannot say."""
        size = _WRITTEN_FIRST
        while size <= _WRITTEN_MAX:
            buf = self._names() if size == _WRITTEN_FIRST else self._buffer(size)
            n = self._written(offset, buf, size)
            if n != -2:  # (-2: the names did not fit)
                return None if n < 0 else set(buf.raw[:n].split(b"\0")[:-1])
            size *= 16
        return None

    def log_path(self) -> str | None:
        p = self._lib.roar_log_path()
        return os.fsdecode(p) if p else None

    def log_mark(self) -> tuple[str, int] | None:
        """This process's log and where its next record goes; None without a log (or with
        an older shim, which cannot say)."""
        p = self._lib.roar_log_path()
        if not p or self._reserved is None:
            return None
        return os.fsdecode(p), self._reserved()


# Bytes of names `written_since` takes from the shim: first, and at most.
_WRITTEN_FIRST, _WRITTEN_MAX = 1 << 12, 1 << 24


def ignore_this_thread() -> None:
    """Called by roar's own threads (recorder, hashing, spool sender): in a process that
    runs traced tasks, their file I/O must not land in a task's lineage."""
    shim = loaded()
    if shim is not None:
        shim.ignore_thread()


@functools.lru_cache(maxsize=1)
def loaded() -> Shim | None:
    """The shim if it was preloaded into this process, else None.  Never loads it:
    a late dlopen would not interpose anything."""
    if not _mapped(os.path.basename(library_path())):
        return None  # the common case of roar's own processes, without importing ctypes
    import ctypes

    from roar_core.pipeline import tracelog

    try:
        lib = ctypes.CDLL(library_path(), mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError:
        return None
    shim = Shim(lib)
    return shim if shim.version() == tracelog.VERSION else None


def _mapped(name: str) -> bool:
    """Whether a library of that file name may be mapped into this process (True where
    /proc cannot say: the caller then asks the dynamic loader, which decides)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f"/{name}".encode() in f.read()
    except OSError:
        return True
