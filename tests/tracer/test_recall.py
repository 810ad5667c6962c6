"""Recall of the preload shim, judged by strace.

Each program runs ONCE, under `strace -f` with the shim preloaded into the tracees.  Why
one run and not an untraced strace run followed by a traced run in an identical fresh
directory: these programs name files nondeterministically (gcc's /tmp/ccXXXXXX.s, git's
tmp_obj_XXXXXX and lock files, Python's tempfile), so two runs cannot be compared path by
path; and strace sees the kernel's system calls, below the libc layer the shim
interposes, so it is an independent observer of the very same execution.  Its cost is
that strace also sees the shim's own system calls: they go to the session directory
(kept outside the test's directory, so filtered out) and, before an exec or after a
posix_spawn, to the program being executed (a read-only O_CLOEXEC open of the file that
an exec record of ours names), which is discounted only in exactly that form.  (The
shim's first try of an O_CREAT open with O_EXCL added also shows up; when it fails the
program's own open follows, and when it succeeds it is the program's open.)

Every regular file under the test's directory (the "not a system path" filter; /proc,
/dev and /sys are dropped too) that strace saw successfully opened or created must
appear in our log: as the path of an open record, or as a path of a rename/link/symlink
record.  Also: namespace operations (rename, link, symlink, unlink, mkdir, rmdir,
truncate) are checked one by one; every thread that strace saw opening a file must have
recorded that open under its own pid or tid, and no process may have chdir records
strace did not see it make; and every program image strace saw exec'd successfully must
have a log of its own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from roar_core.pipeline import tracelog, tracer

PY = os.path.realpath(sys.executable)
SYSCALLS = ("open,openat,creat,rename,renameat,renameat2,link,linkat,symlink,symlinkat,"
            "unlink,unlinkat,mkdir,mkdirat,rmdir,truncate,execve,chdir,fchdir")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Roar Test", "GIT_AUTHOR_EMAIL": "roar@example.com",
    "GIT_AUTHOR_DATE": "2020-09-13T12:26:40+00:00",
    "GIT_COMMITTER_NAME": "Roar Test", "GIT_COMMITTER_EMAIL": "roar@example.com",
    "GIT_COMMITTER_DATE": "2020-09-13T12:26:40+00:00",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_PAGER": "cat",
}


def strace_path() -> str:
    path = shutil.which("strace") or ("/usr/bin/strace" if os.path.exists("/usr/bin/strace")
                                      else None)
    if path is None:
        if os.environ.get("ROAR_TEST_REQUIRE_STRACE"):
            pytest.fail("strace is required (ROAR_TEST_REQUIRE_STRACE is set) but not found")
        pytest.skip("strace is not installed (apt-get install strace); "
                    "set ROAR_TEST_REQUIRE_STRACE=1 to make this a failure")
    return path


# ------------------------------------------------------------------ strace output parser

_ESC = re.compile(rb"\\(x[0-9a-fA-F]{2}|[0-7]{1,3}|.)", re.S)
_SIMPLE = {b"n": b"\n", b"t": b"\t", b"r": b"\r", b"v": b"\v", b"f": b"\f", b"a": b"\a",
           b"b": b"\b", b"e": b"\x1b"}


def _unescape(s: str) -> bytes:
    """Undo strace's C-style quoting (octal, \\xHH, \\n, \\", \\\\)."""
    def rep(m: re.Match) -> bytes:
        e = m.group(1)
        if e[:1] == b"x" and len(e) == 3:
            return bytes([int(e[1:], 16)])
        if e[:1].isdigit():
            return bytes([int(e, 8) & 0xFF])
        return _SIMPLE.get(e, e)

    return _ESC.sub(rep, s.encode("utf-8", "surrogateescape"))


@dataclass
class Arg:
    text: str  # raw
    string: bytes | None = None  # a quoted string argument, unescaped
    fd_path: bytes | None = None  # the <path> strace -y appended to an fd


@dataclass
class Call:
    pid: int
    name: str
    args: list[Arg]
    ret: int | None
    ret_path: bytes | None
    errno: str | None
    line: str
    cwd: bytes | None = None  # the process's cwd when the call was made, as best known


def _scan_string(s: str, i: int) -> int:
    """s[i] == '"': return the index after the closing quote (and a '...' cut marker)."""
    i += 1
    while s[i] != '"':
        i += 2 if s[i] == "\\" else 1
    i += 1
    if s.startswith("...", i):
        i += 3
    return i


def _scan_angle(s: str, i: int) -> int:
    """s[i] == '<' after an fd: index after the matching '>' (strace escapes '>')."""
    i += 1
    while s[i] != ">":
        i += 2 if s[i] == "\\" else 1
    return i + 1


def _parse_args(s: str, start: int) -> tuple[list[Arg], int]:
    """Arguments from s[start:] up to the matching ')'; return them and the index after."""
    args: list[Arg] = []
    cur_start, depth, i = start, 0, start
    strings: list[str] = []
    angle: list[str] = []

    def close_arg(end: int) -> None:
        text = s[cur_start:end].strip()
        if text or args:
            a = Arg(text)
            if strings and text.startswith('"'):
                a.string = _unescape(strings[0])
            if angle:
                a.fd_path = _unescape(angle[-1])
            args.append(a)

    while i < len(s):
        c = s[i]
        if c == '"':
            j = _scan_string(s, i)
            if depth == 0:
                strings.append(s[i + 1: j - 1 - (3 if s[j - 3: j] == "..." else 0)])
            i = j
            continue
        if c == "<" and depth == 0 and i > start and (s[i - 1].isdigit() or s[i - 1] == "D"):
            j = _scan_angle(s, i)
            angle.append(s[i + 1: j - 1])
            i = j
            continue
        if c in "[{(":
            depth += 1
        elif c in "]})":
            if depth == 0:
                close_arg(i)
                return args, i + 1
            depth -= 1
        elif c == "," and depth == 0:
            close_arg(i)
            cur_start, strings, angle = i + 1, [], []
        i += 1
    raise ValueError(f"unterminated argument list: {s!r}")


_LINE = re.compile(r"^(\d+)\s+(.*)$")
_RET = re.compile(r"^\s*=\s*(-?\d+|\?)(?:<(.*)>)?(?:\s+(E[A-Z0-9]+)\b.*)?$")
_CALL = re.compile(r"^([a-z_0-9]+)\(")


def parse_strace(text: str) -> list[Call]:
    pending: dict[int, str] = {}
    calls: list[Call] = []
    for raw in text.splitlines():
        m = _LINE.match(raw)
        if not m:
            continue
        pid, body = int(m.group(1)), m.group(2)
        if body.startswith(("---", "+++")):
            continue
        if body.endswith("<unfinished ...>"):
            pending[pid] = body[: -len("<unfinished ...>")].rstrip()
            continue
        if body.startswith("<..."):
            head = pending.pop(pid, None)
            if head is None:
                continue
            body = head + body.split("resumed>", 1)[1]
        cm = _CALL.match(body)
        if not cm:
            continue
        args, end = _parse_args(body, cm.end())
        rm = _RET.match(body[end:])
        if not rm:
            continue  # "= ?" and friends: the call did not complete
        ret = None if rm.group(1) == "?" else int(rm.group(1))
        calls.append(Call(pid, cm.group(1), args, ret,
                          _unescape(rm.group(2)) if rm.group(2) is not None else None,
                          rm.group(3), raw))
    _assign_cwds(calls)
    return calls


def _assign_cwds(calls: list[Call]) -> None:
    """A process's cwd at each call: strace -y shows it on every AT_FDCWD argument; chdir
    and fchdir move it.  Before a process's first such hint, its first hint is used (a
    process that has not chdir'd yet is still where it started)."""
    first: dict[int, bytes] = {}
    for c in calls:
        for a in c.args:
            if a.text.startswith("AT_FDCWD") and a.fd_path and c.pid not in first:
                first[c.pid] = a.fd_path
        if c.name in ("chdir", "fchdir") and c.pid not in first:
            first[c.pid] = b""  # unknown before this: do not guess across a chdir
    cwd: dict[int, bytes] = {}
    for c in calls:
        for a in c.args:
            if a.text.startswith("AT_FDCWD") and a.fd_path:
                cwd[c.pid] = a.fd_path
        c.cwd = cwd.get(c.pid) or first.get(c.pid) or None
        if c.ret == 0 and c.name == "chdir" and c.args[0].string is not None:
            base = c.cwd or b""
            cwd[c.pid] = os.path.normpath(os.path.join(base, c.args[0].string))
        elif c.ret == 0 and c.name == "fchdir" and c.args[0].fd_path:
            cwd[c.pid] = c.args[0].fd_path


def _abs(c: Call, dirfd: Arg | None, path: bytes) -> bytes | None:
    if path.startswith(b"/"):
        return path
    if dirfd is not None and dirfd.fd_path and dirfd.fd_path.startswith(b"/"):
        return os.path.join(dirfd.fd_path, path)
    if (dirfd is None or dirfd.text.startswith("AT_FDCWD")) and c.cwd:
        return os.path.join(c.cwd, path)
    return None


def canon(p: bytes) -> bytes:
    """Normalise, resolving symlinks in the directory part but not the last component."""
    p = os.path.normpath(p)
    d, b = os.path.split(p)
    return os.path.join(os.path.realpath(d), b)


# Which argument holds which path, per call: (dirfd index or None, path index).
_PATHS = {
    "rename": [(None, 0), (None, 1)], "renameat": [(0, 1), (2, 3)],
    "renameat2": [(0, 1), (2, 3)], "link": [(None, 0), (None, 1)],
    "linkat": [(0, 1), (2, 3)], "symlink": [(None, 1)], "symlinkat": [(1, 2)],
    "unlink": [(None, 0)], "unlinkat": [(0, 1)], "mkdir": [(None, 0)],
    "mkdirat": [(0, 1)], "rmdir": [(None, 0)], "truncate": [(None, 0)],
}
_OP_OF = {"rename": "rename", "renameat": "rename", "renameat2": "rename", "link": "link",
          "linkat": "link", "symlink": "symlink", "symlinkat": "symlink", "unlink": "unlink",
          "unlinkat": "unlink", "mkdir": "mkdir", "mkdirat": "mkdir", "rmdir": "rmdir",
          "truncate": "truncate"}


@dataclass
class Observed:
    opened: dict[bytes, set[int]] = field(default_factory=lambda: defaultdict(set))
    created: set[bytes] = field(default_factory=set)  # rename/link/symlink names
    ops: set[tuple] = field(default_factory=set)  # (op, path[, path2])
    probe_opens: list[tuple[int, bytes]] = field(default_factory=list)
    mkstemp_opens: set[tuple[int, bytes]] = field(default_factory=set)
    unresolved: list[str] = field(default_factory=list)
    chdirs: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    execs: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # pid -> images


def _inside(p: bytes, root: bytes) -> bool:
    if any(p == s or p.startswith(s + b"/") for s in (b"/proc", b"/dev", b"/sys")):
        return False
    return p.startswith(root + b"/")


def observe(calls: list[Call], root: bytes) -> Observed:
    obs = Observed()
    for c in calls:
        if c.ret is None or c.ret < 0:
            continue
        if c.name in ("chdir", "fchdir"):
            obs.chdirs[c.pid] += 1
        if c.name == "execve":
            obs.execs[c.pid] += 1
        if c.name in ("open", "openat", "creat"):
            if c.ret_path is None or not c.ret_path.startswith(b"/"):
                continue
            flags = c.args[2 if c.name == "openat" else 1].text if c.name != "creat" else ""
            p = os.path.normpath(c.ret_path)
            if not _inside(p, root) or "O_DIRECTORY" in flags or os.path.isdir(p):
                continue
            if flags == "O_RDONLY|O_CLOEXEC" and len(c.args) == (3 if c.name == "openat" else 2):
                obs.probe_opens.append((c.pid, p))  # maybe the shim's exec probe: see below
            if flags == "O_RDWR|O_CREAT|O_EXCL" and c.args[-1].text == "0600":
                obs.mkstemp_opens.add((c.pid, p))  # glibc's mkstemp family: see KNOWN_GAPS
            obs.opened[p].add(c.pid)
        elif c.name in _PATHS:
            paths = []
            for dfd_i, p_i in _PATHS[c.name]:
                s = c.args[p_i].string
                full = _abs(c, c.args[dfd_i] if dfd_i is not None else None, s or b"")
                if s is None or full is None:
                    obs.unresolved.append(c.line)
                    break
                paths.append(canon(full))
            else:
                op = _OP_OF[c.name]
                if c.name == "unlinkat" and "AT_REMOVEDIR" in c.args[2].text:
                    op = "rmdir"
                if not any(_inside(p, root) for p in paths):
                    continue
                obs.ops.add((op, *paths))
                if op in ("rename", "link"):
                    obs.created.update(p for p in paths if not os.path.isdir(p))
                elif op == "symlink":
                    obs.created.add(paths[0])
    return obs


# ------------------------------------------------------------------ our side


@dataclass
class Logged:
    opened: dict[bytes, set[int]] = field(default_factory=lambda: defaultdict(set))
    named: set[bytes] = field(default_factory=set)  # any path of rename/link/symlink
    ops: set[tuple] = field(default_factory=set)
    exec_paths: set[bytes] = field(default_factory=set)
    chdirs: dict[int, int] = field(default_factory=lambda: defaultdict(int))


def logged(trace: tracelog.SessionTrace) -> Logged:
    out = Logged()
    for log in trace.logs:
        for r in log.records:
            op = r.op_name
            if op in ("exec", "spawn") and r.path.startswith(b"/"):
                out.exec_paths.add(os.path.realpath(r.path))
            if not r.ok:
                continue
            # strace's "pid" is the thread's id: threads of one process (git's
            # pack-objects) are told apart by the record's tid.
            if op == "chdir":
                out.chdirs[r.tid] += 1
            if op == "open":
                for p in {os.path.normpath(r.path), os.path.realpath(r.path), canon(r.path)}:
                    out.opened[p].update((r.pid, r.tid))
            elif op in ("rename", "link"):
                a, b = canon(r.path), canon(r.path2)
                out.named.update((a, b))
                out.ops.add((op, a, b))
            elif op == "symlink":
                b = canon(r.path2)
                out.named.add(b)
                out.ops.add((op, b))
            elif op in ("unlink", "mkdir", "rmdir", "truncate"):
                out.ops.add((op, canon(r.path)))
    return out


# ------------------------------------------------------------------ the programs

PY_SCRIPT = textwrap.dedent(
    """\
    import json, os, shutil, subprocess, sys, tempfile
    from pathlib import Path

    text = Path("in/data.txt").read_text()
    nums = [int(x) for x in open("in/numbers.txt")]
    os.makedirs("out/deep", exist_ok=True)
    with open("out/summary.json", "w") as f:
        json.dump({"n": len(text.split()), "sum": sum(nums)}, f)
    fd = os.open("out/raw.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"raw")
    os.close(fd)
    dfd = os.open("in", os.O_RDONLY | os.O_DIRECTORY)
    with open(os.open("numbers.txt", os.O_RDONLY, dir_fd=dfd)) as f:
        f.read()
    os.close(dfd)
    shutil.copy("in/data.txt", "out/deep/copy.txt")
    shutil.copytree("in", "out/tree")
    with tempfile.NamedTemporaryFile("w", dir="out", delete=False) as t:
        t.write(text.upper())
    os.replace(t.name, "out/upper.txt")
    with tempfile.NamedTemporaryFile("w") as t:  # in $TMPDIR, deleted at close
        t.write("scratch")
    os.rename("out/raw.bin", "out/raw2.bin")
    os.link("out/raw2.bin", "out/hard.bin")
    os.symlink("raw2.bin", "out/sym.bin")
    open("out/sym.bin").read()
    os.truncate("out/hard.bin", 1)
    os.unlink("out/hard.bin")
    os.mkdir("out/gone")
    os.rmdir("out/gone")
    subprocess.run(
        [sys.executable, "-c",
         "import sys; open(sys.argv[2], 'w').write(open(sys.argv[1]).read()[::-1])",
         "in/data.txt", "out/reversed.txt"], check=True)
    subprocess.run("cat in/numbers.txt | sort -n > out/sorted.txt", shell=True, check=True)
    with open("out/child-stdout.txt", "w") as f:
        subprocess.run(["cat", "in/data.txt"], stdout=f, check=True)
    os.chdir("out")
    open("after-chdir.txt", "w").write("x")
    os.chdir("..")
    Path("out/pathlib.txt").write_bytes(b"pathlib")
    """
)

PY_SUBPROCESS_CWD = textwrap.dedent(
    """\
    import os, subprocess
    os.mkdir("sub")
    subprocess.run(["true"], cwd="sub", check=True)
    open("after.txt", "w").write("written by the parent, in its own cwd")
    """
)

BASH_SCRIPT = textwrap.dedent(
    """\
    set -eu
    mkdir -p out/sub
    cat in/a.txt in/b.txt > out/ab.txt
    cp out/ab.txt "out/sub/with space.txt"
    mv out/ab.txt out/moved.txt
    echo appended >> out/moved.txt
    sort < in/b.txt > out/sorted.txt 2> out/err.txt
    cat <<EOF > out/heredoc.txt
    line $((6 * 7))
    EOF
    ( cd out/sub && cat "with space.txt" | tr a-z A-Z > upper.txt )
    cd out
    ln -s moved.txt link.txt
    ln moved.txt hard.txt
    cat link.txt > via-link.txt
    cd ..
    exec 3> out/fd3.txt
    echo "via fd 3" >&3
    exec 3>&-
    rm out/sorted.txt out/hard.txt
    touch out/touched.txt
    truncate -s 2 out/heredoc.txt
    mkdir out/tmpdir && rmdir out/tmpdir
    cp -r in out/in-copy
    sed -i s/apple/APPLE/ out/moved.txt
    """
)

HELLO_C = textwrap.dedent(
    """\
    #include <stdio.h>
    #include "hello.h"
    int main(int argc, char **argv) {
        FILE *in = fopen(argv[1], "r"), *out = fopen(argv[2], "w");
        int c;
        if (!in || !out) return 1;
        while ((c = fgetc(in)) != EOF) fputc(c, out);
        fclose(in);
        fclose(out);
        puts(GREETING);
        return 0;
    }
    """
)


@dataclass
class Program:
    cmds: list[list[str]]
    files: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)
    tools: tuple[str, ...] = ()
    must_see: tuple[str, ...] = ()  # relative paths strace must report (sanity of the test)


PROGRAMS = {
    "python3": Program(
        cmds=[[PY, "script.py"]],
        files={"script.py": PY_SCRIPT, "in/data.txt": "alpha beta\ngamma\n",
               "in/numbers.txt": "3\n1\n2\n"},
        tools=("cat", "sort"),
        must_see=("in/data.txt", "out/summary.json", "out/reversed.txt", "out/sorted.txt",
                  "out/after-chdir.txt", "out/upper.txt", "out/tree/numbers.txt"),
    ),
    "bash": Program(
        cmds=[["bash", "script.sh"]],
        files={"script.sh": BASH_SCRIPT, "in/a.txt": "apple\n", "in/b.txt": "cherry\nfig\n"},
        tools=("cp", "mv", "sort", "tr", "ln", "rm", "touch", "truncate", "sed"),
        must_see=("in/a.txt", "out/moved.txt", "out/sub/with space.txt", "out/sub/upper.txt",
                  "out/via-link.txt", "out/fd3.txt", "out/in-copy/b.txt"),
    ),
    "tar": Program(
        cmds=[["tar", "cf", "a.tar", "src"], ["tar", "czf", "a.tgz", "src"],
              ["mkdir", "x", "y"], ["tar", "xf", "a.tar", "-C", "x"],
              ["tar", "xzf", "a.tgz", "-C", "y"], ["tar", "rf", "a.tar", "extra.txt"]],
        files={"src/a.txt": "a" * 100, "src/sub/b.txt": "b", "extra.txt": "e"},
        tools=("gzip",),
        must_see=("a.tar", "a.tgz", "src/a.txt", "x/src/sub/b.txt", "y/src/a.txt", "extra.txt"),
    ),
    "gcc": Program(
        cmds=[["gcc", "-O1", "-c", "-o", "hello.o", "hello.c"],
              ["gcc", "-o", "hello", "hello.o"],
              ["gcc", "-O1", "-o", "hello2", "hello.c", "-save-temps"],
              ["./hello", "hello.h", "copy.h"]],
        files={"hello.c": HELLO_C, "hello.h": '#define GREETING "hello"\n'},
        tools=("gcc",),
        must_see=("hello.c", "hello.h", "hello.o", "hello", "hello2", "copy.h", "hello2-hello.s"),
    ),
    "git": Program(
        cmds=[["git", "-c", "init.defaultBranch=main", "init", "-q"],
              ["git", "add", "."], ["git", "commit", "-q", "-m", "one"],
              ["git", "mv", "a.txt", "b.txt"], ["git", "commit", "-q", "-m", "two"],
              ["git", "tag", "v1"], ["git", "gc", "-q"],
              ["git", "log", "--oneline"]],
        files={"a.txt": "hello\n", "dir/c.txt": "c\n"},
        env=GIT_ENV, tools=("git",),
        must_see=("a.txt", ".git/index", ".git/HEAD", ".git/refs/tags/v1", ".git/packed-refs"),
    ),
}


def _run_under_strace(tmp_path: Path, prog: Program, session: Path, plain_env) -> tuple:
    strace = strace_path()
    for tool in prog.tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    root = tmp_path / "root"
    work = root / "work"
    for rel, content in prog.files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(content)
    env = plain_env(root, {**prog.env, "GIT_CEILING_DIRECTORIES": str(root)})
    shim_env = tracer.preload_env(session, base={})
    out = tmp_path / "strace"
    out.mkdir()
    for i, cmd in enumerate(prog.cmds):
        # The shim's variables go to the tracees only (-E): strace itself stays untraced.
        full = [strace, "-f", "-qq", "-y", "-e", f"trace={SYSCALLS}", "-o", str(out / f"{i}"),
                *(a for k, v in shim_env.items() for a in ("-E", f"{k}={v}")), "--", *cmd]
        p = subprocess.run(full, cwd=work, env=env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=120)
        assert p.returncode == 0, f"{cmd} failed under strace: {p.stderr[-3000:]}"
    text = "\n".join((out / f"{i}").read_text(errors="surrogateescape")
                     for i in range(len(prog.cmds)))
    return work, parse_strace(text), tracelog.read_session(session)


# Shim gaps, excused here while they are known, so that everything else about these
# programs stays checked.  None is known now: glibc's mkstemp family (which opens its
# file internally) is interposed directly, and `test_recall_mkstemp_created_files` runs
# sed -i without any excuse.
KNOWN_GAPS: frozenset[str] = frozenset()


def _check(work: Path, calls: list[Call], trace: tracelog.SessionTrace, prog: Program,
           known_gaps: frozenset[str] = KNOWN_GAPS):
    root = os.fsencode(os.path.realpath(work.parent))
    obs = observe(calls, root)
    ours = logged(trace)
    assert not trace.errors, trace.errors
    assert trace.logs, "the shim wrote no logs: nothing was traced"
    assert not obs.unresolved, "strace lines whose paths could not be resolved:\n" + "\n".join(
        obs.unresolved)
    rel = {os.fsencode(os.path.realpath(work / r)) for r in prog.must_see}
    seen = set(obs.opened) | obs.created
    assert rel <= seen, f"strace did not see {sorted(rel - seen)}: the test is broken"

    # The shim's exec probe (see the module docstring): a read-only O_CLOEXEC open of a
    # file that our log names as exec'd, and nothing else, is not the program's.  And the
    # known gaps, while they are known.
    excused = {(pid, p) for pid, p in obs.probe_opens if p in ours.exec_paths}
    if "mkstemp" in known_gaps:
        excused |= obs.mkstemp_opens

    def show(paths):
        return "\n  " + "\n  ".join(os.fsdecode(p) for p in sorted(paths))

    missing = [p for p in obs.opened
               if p not in ours.opened and p not in ours.named
               and not all((pid, p) in excused for pid in obs.opened[p])]
    missing += [p for p in obs.created if p not in ours.opened and p not in ours.named]
    assert not missing, (f"{len(missing)} file(s) strace saw opened/created that are not "
                         f"in our log:{show(set(missing))}")

    missing_ops = obs.ops - ours.ops
    assert not missing_ops, "namespace operations missing from our log:\n  " + "\n  ".join(
        " ".join(os.fsdecode(x) for x in op) for op in sorted(missing_ops))

    # Attribution: each process strace saw open a file recorded that open itself.
    wrong_pid = sorted(
        (pid, p) for p, pids in obs.opened.items() for pid in pids
        if (pid, p) not in excused and pid not in ours.opened.get(p, set()))
    assert not wrong_pid, "opens not recorded under the pid that made them:" + show(
        {f"pid {pid}: ".encode() + p for pid, p in wrong_pid})
    images = defaultdict(int)
    for log in trace.logs:
        if log.header.origin == tracelog.ORIGIN_EXEC:
            images[log.header.pid] += 1
    untraced = {pid: n for pid, n in obs.execs.items() if images.get(pid, 0) < n}
    assert not untraced, f"exec'd images without a log of their own (pid: images): {untraced}"
    spurious_chdir = {pid: n for pid, n in ours.chdirs.items() if n > obs.chdirs.get(pid, 0)}
    assert not spurious_chdir, f"chdir records of pids that did not chdir: {spurious_chdir}"


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_recall_against_strace(name, tmp_path, session_dir, plain_env):
    prog = PROGRAMS[name]
    work, calls, trace = _run_under_strace(tmp_path, prog, session_dir, plain_env)
    _check(work, calls, trace, prog)


def test_recall_python_subprocess_cwd(tmp_path, session_dir, plain_env):
    prog = Program(cmds=[[PY, "script.py"]], files={"script.py": PY_SUBPROCESS_CWD},
                   tools=("true",), must_see=("after.txt",))
    work, calls, trace = _run_under_strace(tmp_path, prog, session_dir, plain_env)
    _check(work, calls, trace, prog)


def test_recall_mkstemp_created_files(tmp_path, session_dir, plain_env):
    prog = Program(cmds=[["sed", "-i", "s/a/b/", "f.txt"]], files={"f.txt": "a\n"},
                   tools=("sed",), must_see=("f.txt",))
    work, calls, trace = _run_under_strace(tmp_path, prog, session_dir, plain_env)
    assert (work / "f.txt").read_text() == "b\n"
    _check(work, calls, trace, prog)


def test_vfork_child_fd_ops_not_recorded_as_parent(tmp_path, traced_run, plain_env):
    work = tmp_path / "work"
    work.mkdir()
    (work / "out.txt").write_text("")  # updated in place ('r+'): the fd is tracked to its close
    script = ("import subprocess\n"
              "with open('out.txt', 'r+') as f:\n"
              "    subprocess.run(['echo', 'hello'], stdout=f, check=True)\n")
    stdout = tmp_path / "stdout.txt"
    with open(stdout, "wb") as out:
        p, trace = traced_run([PY, "-c", script], work, env=plain_env(tmp_path), stdout=out,
                              stderr=subprocess.PIPE, capture_output=False)
    assert p.returncode == 0, p.stderr
    assert (work / "out.txt").read_text() == "hello\n"
    target = os.fsencode(work / "out.txt")
    ino = os.stat(work / "out.txt").st_ino
    py_logs = [log for log in trace.logs
               if any(r.op_name == "start" and b"python" in r.path for r in log.records)]
    assert len(py_logs) == 1, [log.path for log in trace.logs]
    recs = py_logs[0].records
    opened_on = {r.result for r in recs
                 if r.op_name == "open" and r.ok and os.path.normpath(r.path) == target}
    assert opened_on, "no open record of out.txt in the Python parent's log"
    closes = [r for r in recs if r.op_name == "close" and os.path.normpath(r.path) == target]
    assert closes, "no close record of out.txt"
    bad_fd = [r.fd for r in closes if r.fd not in opened_on]
    assert not bad_fd, (f"the parent opened out.txt on fd {opened_on} only, yet has close "
                        f"records of it for fds {bad_fd}")
    bad_stat = [(r.fd, r.st_ino) for r in closes
                if r.has(tracelog.RF_STAT) and r.st_ino != ino]
    assert not bad_stat, f"close records of out.txt (inode {ino}) with another stat: {bad_stat}"
    dups = [r for r in recs if r.op_name == "dup"]
    assert not dups, f"the Python parent never called dup*, yet its log has {dups}"


# ------------------------------------------------------------------ the parser itself


def test_parser_on_strace_syntax():
    text = textwrap.dedent(
        """\
        10 openat(AT_FDCWD</w>, "a \\"b\\"\\303\\251,c", O_RDONLY) = 3</w/a "b"\\303\\251,c>
        10 rename("x", "y")        = 0
        11 openat(AT_FDCWD</w/s>, "p", O_WRONLY|O_CREAT|O_TRUNC, 0666 <unfinished ...>
        10 renameat2(AT_FDCWD</w>, "q", 4</w/d\\76>, "r", RENAME_NOREPLACE) = 0
        11 <... openat resumed>) = 5</w/s/p>
        11 open("missing", O_RDONLY) = -1 ENOENT (No such file or directory)
        11 chdir("..") = 0
        11 unlink("z") = 0
        11 +++ exited with 0 +++
        """
    )
    calls = parse_strace(text)
    assert [c.name for c in calls] == ["openat", "rename", "renameat2", "openat", "open",
                                       "chdir", "unlink"]
    assert calls[0].args[1].string == 'a "b"é,c'.encode()
    assert calls[0].ret == 3 and calls[0].ret_path == '/w/a "b"é,c'.encode()
    assert calls[1].cwd == b"/w" and calls[1].args[1].string == b"y"
    assert calls[2].args[2].fd_path == b"/w/d>"
    assert calls[3].ret_path == b"/w/s/p" and calls[3].args[3].text == "0666"
    assert calls[4].ret == -1 and calls[4].errno == "ENOENT"
    assert calls[6].cwd == b"/w" and _abs(calls[6], None, b"z") == b"/w/z"
