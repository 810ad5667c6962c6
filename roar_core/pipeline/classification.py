"""Classification: a task's events -> inputs, outputs, transient and deleted files (and S3
objects: `objects`).

input     = read, and not created by the task first (an O_RDWR open of an existing file
            reads its previous version: read-modify-write is an input *and* an output);
output    = created, truncated, modified or renamed/linked into place, existing at the end;
transient = created and gone again by the end (rename-into-place keeps only the final name);
deleted   = existed before, removed by the task.
Paths are normalised and symlinks resolved here (the shim records them as used); the
path actually used is kept in `read_via` when it differs.  System, interpreter, cache and
engine paths and our own files are filtered out; the task's code files are listed apart.
"""

from __future__ import annotations

import fnmatch
import os
import re
import site
import stat
import sys
from collections.abc import Iterable, Sequence

from roar_core.pipeline import objects
from roar_core.pipeline.objects import ObjectVersion
from roar_core.pipeline.statcache import FileState
from roar_core.pipeline.tracelog import (
    OP,
    RENAME_EXCHANGE,
    RF_EXISTED,
    RF_MODIFIED,
    RF_STAT,
    RF_UNTRACEABLE,
    Record,
)
from roar_core.slotted import Frozen, Slotted

O_ACCMODE = os.O_RDONLY | os.O_WRONLY | os.O_RDWR
O_TMPFILE = getattr(os, "O_TMPFILE", 0o20200000)
# Plain module constants: the record loop below runs for every event of a task.
O_RDONLY, O_RDWR, O_CREAT, O_TRUNC, O_DIRECTORY = (
    os.O_RDONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_DIRECTORY)
OP_OPEN, OP_CLOSE, OP_RENAME, OP_LINK = OP["open"], OP["close"], OP["rename"], OP["link"]
OP_UNLINK, OP_TRUNCATE, OP_MKDIR, OP_RMDIR = OP["unlink"], OP["truncate"], OP["mkdir"], OP["rmdir"]
OP_START, OP_OBJECT = OP["start"], OP["object"]
_COMMAND_OPS = frozenset((OP["exec"], OP["spawn"], OP_START))

SYSTEM_PREFIXES = (
    b"/usr/", b"/lib/", b"/lib64/", b"/lib32/", b"/bin/", b"/sbin/", b"/etc/", b"/proc/",
    b"/sys/", b"/dev/", b"/run/", b"/var/lib/", b"/var/cache/", b"/snap/", b"/nix/store/",
)
# Package metadata too: importlib.metadata reads every installed distribution's (an
# editable install's lives next to its sources, outside site-packages).
CACHE_PARTS = (b"/__pycache__/", b"/.cache/", b"/.git/", b"/.ipython/", b"/.ruff_cache/",
               b"/.pytest_cache/", b"/.mypy_cache/", b".egg-info/", b".dist-info/")
CACHE_SUFFIXES = (b".pyc", b".pyo")
_CACHE_PART = re.compile(b"|".join(re.escape(p) for p in CACHE_PARTS))
CODE_SUFFIXES = (b".py", b".sh", b".bash", b".r", b".R", b".pl", b".rb", b".jl", b".js",
                 b".smk", b".ipynb", b".Rmd")


# Under the home directory, environment rather than data (a shell reads these when it
# starts: bash when its stdin is a socket, as Airflow 3 starts tasks): every dotfile directly
# in it (~/.bashrc, ~/.profile, ~/.bash_profile, ~/.zshrc, ~/.inputrc...) and these
# directories of tool set-ups (~/.cargo/env...) and user settings.
HOME_ENV_DIRS = (b".cargo/", b".rustup/", b".nvm/", b".sdkman/", b".config/", b".local/bin/",
                 b".bashrc.d/", b".profile.d/")


def _home_env() -> tuple[bytes, tuple[bytes, ...]]:
    home = os.fsencode(os.path.join(os.path.realpath(os.path.expanduser("~")), ""))
    return home, tuple(home + d for d in HOME_ENV_DIRS)


# Directories a PathFilter remembers its answer for (a long-lived worker meets many).
_DIRS_MAX = 4096


def display_name(path: bytes) -> str:
    """The dataset name for a path: UTF-8, with undecodable bytes escaped as \\xNN so that
    events and the store (which need valid text) can carry any file name.  A backslash
    of the name itself is doubled: else a file named `caf\\xe9.txt` (those 12 characters)
    and one named `caf` + byte E9 + `.txt` would be one dataset.  Names without either
    (nearly all) are the path as it is."""
    try:
        text = path.decode()
    except UnicodeDecodeError:
        return path.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")
    return text.replace("\\", "\\\\") if "\\" in text else text


def shown(data: bytes) -> str:
    """Bytes as text to show (a command's arguments): undecodable bytes as \\xNN."""
    return data.decode("utf-8", "backslashreplace")


def shown_text(text: str) -> str:
    """A str that may hold surrogate escapes (os.fsdecode's, for undecodable bytes of an
    argument or a name) as valid text, the way `shown` writes the bytes."""
    try:
        return shown(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # a lone surrogate that is not an escaped byte
        return text.encode("utf-8", "replace").decode()


def _interpreter_prefixes() -> tuple[bytes, ...]:
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:  # pragma: no cover - virtualenv's old site module
        pass
    if site.ENABLE_USER_SITE and site.USER_SITE:
        dirs.add(site.USER_SITE)
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    dirs.add(pyenv)
    # roar-core's own package, wherever it is installed (an editable install: the
    # checkout): a traced Python imports part of it at start (its S3 tracer).
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return tuple(os.fsencode(os.path.join(os.path.realpath(d), "")) for d in dirs if d)


class PathFilter(Frozen):
    """Which paths can be lineage.  `internal` holds engine/roar directories (session dir,
    spool, store, `.snakemake/`, Ray session dirs, AIRFLOW_HOME...).  The classes here are
    not dataclasses: the capture that imports them runs on `roar-core run`'s path (see
    roar_core.slotted)."""

    __slots__ = ("internal", "include", "exclude", "prefixes", "home_env", "_dirs")
    _not_compared = ("_dirs",)

    def __init__(self, internal: tuple[bytes, ...] = (), include: tuple[str, ...] = (),
                 exclude: tuple[str, ...] = (), prefixes: tuple[bytes, ...] | None = None,
                 home_env: tuple[bytes, tuple[bytes, ...]] | None = None) -> None:
        # Directories, so that a prefix never matches a sibling ("/a/b" is not "/a/bc/").
        def as_dirs(ds: tuple[bytes, ...]) -> tuple[bytes, ...]:
            return tuple(d if d.endswith(b"/") else d + b"/" for d in ds)

        self._set(internal=as_dirs(internal), include=include, exclude=exclude,
                  prefixes=as_dirs(_interpreter_prefixes() if prefixes is None else prefixes),
                  home_env=_home_env() if home_env is None else home_env,
                  # Directory ("/a/b/") -> whether its files can be lineage, as far as the
                  # prefixes and cache parts say: a task's thousands of files sit in a few
                  # directories.
                  _dirs={})

    @classmethod
    def build(cls, internal: Iterable[str | bytes | os.PathLike] = (),
              include: Sequence[str] = (), exclude: Sequence[str] = ()) -> PathFilter:
        dirs = tuple(os.path.join(os.fsencode(os.path.realpath(d)), b"") for d in internal)
        return cls(dirs, tuple(include), tuple(exclude))

    @classmethod
    def for_config(cls, cfg, internal: Iterable[str | bytes | os.PathLike] = ()) -> PathFilter:
        """The filter of a `roar_core.config.Config`: its home is internal, and so are the
        engine's directories in `internal`."""
        return cls.build([cfg.home, *internal], cfg.include, cfg.exclude)

    def keep(self, path: bytes) -> bool:
        if not path.startswith(b"/") or path.endswith(CACHE_SUFFIXES):
            return False
        # Every prefix and cache part ends with "/", so none can match past the last one:
        # the directory decides them for all its files.
        cut = path.rfind(b"/") + 1
        head = path[:cut]
        ok = self._dirs.get(head)
        if ok is None:
            if len(self._dirs) >= _DIRS_MAX:
                self._dirs.clear()
            ok = self._dirs[head] = not (
                head.startswith(SYSTEM_PREFIXES) or head.startswith(self.prefixes)
                or head.startswith(self.internal) or _CACHE_PART.search(head)
                or head.startswith(self.home_env[1]))
        if not ok:
            return False
        if head == self.home_env[0] and path.startswith(b".", cut):
            return False  # a dotfile of the home directory: environment
        if self.include or self.exclude:
            text = os.fsdecode(path)
            if self.include and not any(fnmatch.fnmatch(text, g) for g in self.include):
                return False
            if any(fnmatch.fnmatch(text, g) for g in self.exclude):
                return False
        return True


class FileAccess(Slotted):
    __slots__ = ("path", "name", "role", "read_via", "pre_state", "first_ns", "existed",
                 "state", "obj")

    def __init__(self, path: bytes, name: str, role: str, read_via: list[str] | None = None,
                 pre_state: FileState | None = None, first_ns: int = 0, existed: bool = False,
                 state: FileState | None = None, obj: ObjectVersion | None = None) -> None:
        self.path = path  # resolved absolute path (what is hashed)
        self.name = name  # its dataset name (display_name)
        self.role = role  # "input" | "output" | "transient" | "deleted"
        self.read_via = [] if read_via is None else read_via  # other names it was used under
        # Inputs: the state of the version the task opened first (the tracer's stat at
        # open), which is the version its digest must be, whatever the file holds later.
        self.pre_state = pre_state
        self.first_ns = first_ns
        self.existed = existed  # the path existed before the task (outputs: an overwrite)
        self.state = state  # a regular file's stat at classification (the task's end)
        self.obj = obj  # an S3 object (path and name: its URI): its version


class TaskIO(Slotted):
    __slots__ = ("inputs", "outputs", "transient", "deleted", "code", "commands",
                 "untraceable", "unseen")

    def __init__(self, inputs: list[FileAccess] | None = None,
                 outputs: list[FileAccess] | None = None,
                 transient: list[FileAccess] | None = None,
                 deleted: list[FileAccess] | None = None, code: list[FileAccess] | None = None,
                 commands: list[list[str]] | None = None, untraceable: list[str] | None = None,
                 unseen: list[str] | None = None) -> None:
        self.inputs = [] if inputs is None else inputs
        self.outputs = [] if outputs is None else outputs
        self.transient = [] if transient is None else transient
        self.deleted = [] if deleted is None else deleted
        self.code = [] if code is None else code
        self.commands = [] if commands is None else commands  # argv of each program run
        # Static/setuid programs executed; S3 clients run whose I/O is unseen.
        self.untraceable = [] if untraceable is None else untraceable
        self.unseen = [] if unseen is None else unseen

    def all(self) -> list[FileAccess]:
        return self.inputs + self.outputs + self.transient + self.deleted


class _State:
    # One per file a task touches: no per-instance containers until one is needed.
    __slots__ = ("read_first", "existed", "created", "written", "removed", "directory",
                 "baselines", "pre_state", "via", "first_ns", "moved_to", "replaced")

    def __init__(self, first_ns: int = 0) -> None:
        self.read_first = False
        self.existed: bool | None = None
        self.created = False
        self.written = False
        self.removed = False
        self.directory = False
        self.baselines: list[tuple[int, int, int]] | None = None
        self.pre_state: FileState | None = None
        self.via: set[bytes] | None = None
        self.first_ns = first_ns
        self.moved_to: bytes | None = None  # renamed to (its last rename's new name)
        # Its content made anew (created, truncated, renamed or linked onto), not only
        # written in place through a descriptor opened on the version before.
        self.replaced = False


class _Resolver:
    """normpath + symlink resolution with a per-directory cache (tasks touch many files in
    few directories).  Maps a raw path to (resolved path, normalised path).

    `deferred`: for records read while the task still runs, the file itself is not looked
    at (its state then is not the one at the end): a path is its real directory + its name,
    and `Classifier.finish` tells whether that name became a symlink."""

    def __init__(self, deferred: bool = False) -> None:
        self.deferred = deferred
        self._dirs: dict[bytes, bytes] = {}
        self._paths: dict[bytes, tuple[bytes, bytes]] = {}  # a file is opened, closed, reopened
        # lstat results of resolved non-symlinks.  Classification runs after the task has
        # ended, so they are also the final state the end-of-task pass needs: one syscall
        # per file instead of two.
        self.stats: dict[bytes, os.stat_result] = {}

    def __call__(self, raw: bytes) -> tuple[bytes, bytes]:
        got = self._paths.get(raw)
        if got is None:
            got = self._paths[raw] = self._resolve(raw)
        return got

    def _resolve(self, raw: bytes) -> tuple[bytes, bytes]:
        # Most paths a program builds are already normal: skip normpath for those.  (find,
        # not `in`: bytes' `in` tries its operand as an integer first, an error each time.)
        path = os.path.normpath(raw) if raw.find(b"/.") >= 0 or raw.find(b"//") >= 0 or \
            raw.endswith(b"/") else raw
        head, _, tail = path.rpartition(b"/")
        head = head or b"/"
        real_head = self._dirs.get(head)
        if real_head is None:
            real_head = self._dirs[head] = os.path.join(os.path.realpath(head), b"")
        full = real_head + tail
        if self.deferred:
            return full, path
        try:
            st = os.lstat(full)
        except OSError:
            return full, path
        if stat.S_ISLNK(st.st_mode):
            return os.path.realpath(full), path
        self.stats[full] = st
        return full, path

    def heads(self) -> Iterable[bytes]:
        """The real directories (with a trailing slash) of the paths resolved so far."""
        return self._dirs.values()

    def dirs_moved(self) -> bool:
        """Whether a directory resolved earlier resolves elsewhere now (a symlink made or
        changed since): what was resolved then is not what the end would resolve."""
        return any(os.path.join(os.path.realpath(head), b"") != real
                   for head, real in self._dirs.items())


_MISSING = _State()


def _arrived(s: _State) -> None:
    """A name renamed or linked onto: written, there at the end unless removed later;
    created there unless it was before."""
    s.written, s.removed, s.replaced = True, False, True
    if s.existed is None:
        s.existed = False
    s.created = s.created or not s.existed


def _left(s: _State) -> None:
    """A name renamed away: gone; it was there before the task unless the task made it."""
    if s.existed is None:
        s.existed = not (s.created or s.written)
    s.removed = True


def _is_dir(path: bytes) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _stat_of(r: Record) -> FileState | None:
    if not r.has(RF_STAT):
        return None
    return FileState(r.st_dev, r.st_ino, r.st_size, r.st_mtime_ns, r.st_ctime_ns)


def classify(records: Iterable[Record], keep: PathFilter,
             code: Iterable[bytes] = ()) -> TaskIO:
    """Classify one task's records (time-ordered).  Looks at the file system once at the
    end (existence, final stat), so call it right after the task ends.  `code`: resolved
    paths the engine names as the task's code (read, they are code, not inputs)."""
    c = Classifier()
    c.feed(records)
    io = c.finish(keep, code)
    assert io is not None  # only a deferred classifier declines
    return io


class Classifier:
    """`classify` in steps: `feed` the task's records in time order, in one batch or many,
    then `finish` once it has ended.  `deferred`: fed while the task still runs (the CLI
    runner's tail), so the file system is looked at only in `finish`, which returns None
    where a file or directory became a symlink meanwhile: classify the records at once then
    (the one-batch form resolves each path as the end finds it)."""

    def __init__(self, deferred: bool = False) -> None:
        self.resolve = _Resolver(deferred)
        self.states: dict[bytes, _State] = {}
        # raw path -> its state: a file is opened, closed and reopened under one name, so
        # most records cost one lookup here (this loop runs for every record of a task).
        self.by_raw: dict[bytes, _State | None] = {}
        self.object_records: list[Record] = []
        self.io = TaskIO()

    def _state(self, raw: bytes, ns: int) -> _State | None:
        s = self.by_raw.get(raw, _MISSING)
        if s is not _MISSING:
            return s
        if not raw.startswith(b"/"):
            s = None  # relative to an unknown directory: cannot be placed
        else:
            real, norm = self.resolve(raw)
            s = self.states.get(real)
            if s is None:
                s = self.states[real] = _State(first_ns=ns)
            if norm != real:
                if s.via is None:
                    s.via = set()
                s.via.add(norm)
        self.by_raw[raw] = s
        return s

    def feed(self, records: Iterable[Record]) -> None:
        state, by_raw, io = self._state, self.by_raw, self.io
        object_records = self.object_records
        for r in records:
            op = r.op
            if op in _COMMAND_OPS:
                argv = r.argv
                if argv and op != OP_START:
                    io.commands.append([shown(a) for a in argv])
                if r.path and op != OP_START and r.rflags & RF_UNTRACEABLE:
                    io.untraceable.append(shown(r.path))
                continue
            if op == OP_OBJECT:
                object_records.append(r)
                continue
            path = r.path
            if r.err or r.result < 0 or not path:
                continue
            if op == OP_OPEN:
                flags = r.flags
                if flags & O_TMPFILE == O_TMPFILE:
                    continue
                s = by_raw.get(path, _MISSING)  # state(), inlined for the common case
                if s is _MISSING:
                    s = state(path, r.mono_ns)
                if s is None:
                    continue
                if flags & O_DIRECTORY:
                    s.directory = True
                    continue
                acc = flags & O_ACCMODE
                if acc == O_RDONLY:
                    if not (s.written or s.created):
                        s.read_first = True
                        if s.existed is None:
                            s.existed = True
                        if s.pre_state is None and r.rflags & RF_STAT:
                            s.pre_state = _stat_of(r)  # the version the task opened
                    continue
                existed = r.rflags & RF_EXISTED
                if existed:
                    if s.existed is None:
                        s.existed = True
                    if (acc == O_RDWR and not (flags & O_TRUNC)
                            and not (s.written or s.created)):
                        s.read_first = True
                    if s.pre_state is None and not (s.written or s.created):
                        s.pre_state = _stat_of(r)
                elif flags & O_CREAT:
                    if s.existed is None:
                        s.existed = False
                    s.created = True
                s.removed = False
                if flags & O_TRUNC or not existed:
                    s.written = s.replaced = True
                elif r.rflags & RF_STAT:
                    if s.baselines is None:
                        s.baselines = []
                    s.baselines.append((r.st_size, r.st_mtime_ns, r.st_ctime_ns))
            elif op == OP_CLOSE:
                if r.rflags & RF_MODIFIED:
                    s = by_raw.get(path, _MISSING)
                    if s is _MISSING:
                        s = state(path, r.mono_ns)
                    if s is not None:
                        s.written = True
                        if s.existed is None:  # opened before the task: there already
                            s.existed = True
            elif op == OP_RENAME and r.flags & RENAME_EXCHANGE:
                # Each name now holds the other's file (`mv --exchange`): both written,
                # neither created nor removed; both were there, from before unless made.
                for s in (state(r.path, r.mono_ns), state(r.path2, r.mono_ns)):
                    if s:
                        s.written, s.removed, s.replaced = True, False, True
                        if s.existed is None:
                            s.existed = True
            elif op == OP_RENAME or op == OP_LINK:
                src, d = state(r.path, r.mono_ns), state(r.path2, r.mono_ns)
                if d:
                    _arrived(d)
                if src and op == OP_RENAME:
                    _left(src)
                    src.moved_to = r.path2
                    if self._moved(r.path, r.path2, r.mono_ns):
                        src.directory = True  # (not a deleted file)
            elif op == OP_UNLINK:
                if s := state(r.path, r.mono_ns):
                    if s.existed is None:
                        s.existed = True
                    s.removed = True
            elif op == OP_TRUNCATE:
                if s := state(r.path, r.mono_ns):
                    if s.existed is None:
                        s.existed = True
                    s.written, s.removed, s.replaced = True, False, True
            elif op == OP_MKDIR or op == OP_RMDIR:
                # A directory, even when it is gone by the end (a temp dir removed with
                # shutil.rmtree, which opens it without O_DIRECTORY): never a file.
                if s := state(r.path, r.mono_ns):
                    s.directory = True

    def _moved(self, src: bytes, dst: bytes, ns: int) -> bool:
        """A directory renamed (a tree written under a temporary name, then moved into
        place at once): each file the task touched in it is now under `dst`, as if renamed
        itself: its old name removed, its new one written (the task's output).  Returns
        whether `src` held any (a directory, then)."""
        if not (src.startswith(b"/") and dst.startswith(b"/")):
            return False
        old, new = self.resolve(src)[0] + b"/", self.resolve(dst)[0] + b"/"
        # The directories of every path seen are resolved (and kept) once: a file's rename
        # finds none under it, in a loop over few.
        if old == new or not any(d.startswith(old) for d in self.resolve.heads()):
            return False
        for path, s in [(p, s) for p, s in self.states.items() if p.startswith(old)]:
            if s.removed or s.directory:
                continue
            moved = self._state(new + path[len(old):], ns)
            if moved is not None:
                _arrived(moved)
                _left(s)
        return True

    def finish(self, keep: PathFilter, code: Iterable[bytes] = (), *,
               native: bool = True) -> TaskIO | None:
        """The task's files as the end finds them (deferred: None where a path it met
        became a symlink).  `native`: the batch hasher's library may look at them
        (`native_hash`)."""
        resolve, io = self.resolve, self.io
        deferred = resolve.deferred
        if deferred and resolve.dirs_moved():
            return None
        code_paths = frozenset(code)
        files = [(path, s) for path, s in self.states.items()
                 if not s.directory and keep.keep(path)]
        if deferred:  # the end's look at each file: what resolving it would have seen
            stats = _lstat_all([path for path, _ in files], native)
        else:
            stats = [_looked(resolve.stats.get(path), path) for path, _ in files]
        for (path, s), st in zip(files, stats, strict=True):
            # st: (mode, dev, ino, size, mtime_ns, ctime_ns), None where it is missing.
            if st is None:
                exists = False
            elif deferred and stat.S_ISLNK(st[0]):
                return None
            elif stat.S_ISDIR(st[0]):
                continue
            else:
                exists = True
            if not s.written and s.baselines and st is not None:
                now = st[3:6]
                s.written = any(b != now for b in s.baselines)
            via = sorted(display_name(v) for v in s.via if keep.keep(v)) if s.via else []
            name = display_name(path)
            final = FileState(*st[1:]) if st is not None and stat.S_ISREG(st[0]) else None

            existed = bool(s.existed)
            is_input = s.read_first and s.existed is not False
            if is_input:
                # Code is what the task runs, not what it processes: scripts it read and
                # never wrote go to the job's code facet.
                if (path.endswith(CODE_SUFFIXES) or path in code_paths) and not s.written:
                    io.code.append(FileAccess(path, name, "code", via, None, s.first_ns,
                                              existed, final))
                    continue
                io.inputs.append(FileAccess(path, name, "input", via, s.pre_state, s.first_ns,
                                            existed, final))
            if s.written and exists and not s.removed:
                # Written in place only: the version it was opened at, which the task may
                # have left as it was (`touch`: timestamps only), and then made nothing.
                io.outputs.append(FileAccess(path, name, "output", via,
                                             None if s.replaced else s.pre_state,
                                             s.first_ns, existed, final))
            elif not exists and (s.removed or s.written or s.created):
                if s.existed and s.moved_to is not None and _is_dir(s.moved_to):
                    continue  # a directory renamed, none of its files touched: no file
                if s.existed:
                    io.deleted.append(FileAccess(path, name, "deleted", via, None, s.first_ns,
                                                 existed, final))
                elif s.created or s.written:
                    io.transient.append(FileAccess(path, name, "transient", via, None,
                                                   s.first_ns, existed, final))
        if self.object_records:
            for uri, role, first_ns, existed, version in objects.classify(self.object_records):
                getattr(io, _ROLE_LISTS[role]).append(FileAccess(
                    os.fsencode(uri), uri, role, [], None, first_ns, existed, None, version))
        if io.commands:
            io.unseen = objects.unseen_clients(io.commands)
        return io


# Files at a task's end past which their lstat is one call into the batch hasher's library,
# with the GIL released and split over threads (5,000 files on tmpfs: 28 -> 13 ms); fewer
# are not worth loading it.
_NATIVE_LSTAT_MIN = 64


def _lstat_all(paths: list[bytes], native: bool = True) -> list[tuple[int, ...] | None]:
    """Each path's lstat as (mode, dev, ino, size, mtime_ns, ctime_ns), None where it
    failed."""
    if native and len(paths) >= _NATIVE_LSTAT_MIN:
        from roar_core.pipeline import nativehash

        lib = nativehash.load()
        if lib is not None:
            return [None if r[0] else r[1:] for r in lib.lstat(paths)]
    out: list[tuple[int, ...] | None] = []
    for path in paths:
        try:
            out.append(_fields(os.lstat(path)))
        except OSError:
            out.append(None)
    return out


def _looked(st: os.stat_result | None, path: bytes) -> tuple[int, ...] | None:
    """The file's stat (following a symlink) as `_lstat_all` gives it: the one taken as
    its path was resolved, else one now."""
    if st is None:
        try:
            st = os.stat(path)
        except OSError:
            return None
    return _fields(st)


def _fields(st: os.stat_result) -> tuple[int, ...]:
    """(mode, dev, ino, size, mtime_ns, ctime_ns): the native lstat's fields."""
    return (st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_ROLE_LISTS = {"input": "inputs", "output": "outputs", "deleted": "deleted",
               "transient": "transient"}
