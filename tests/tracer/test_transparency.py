"""The shim must be invisible to the programs it traces.

Each case runs real programs twice, once plain and once with the shim preloaded, in two
fresh directories with the same layout and the same fixed environment, and compares exit
status, stdout and stderr (only the directory's own path is normalised) and the files the
programs wrote, byte for byte.  Failing programs (non-zero exits, signals, errno values
of failed calls, errno left alone by successful ones) are compared too.  Every traced run
is also checked to have really been traced: the session has logs of the programs named by
the case, with records of the files they used; otherwise a shim that silently did nothing
would pass.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from roar_core.pipeline import tracelog

PY = os.path.realpath(sys.executable)  # the python3 running the tests: a real interpreter
FIXED_TIME = 1_600_000_000  # mtimes of the inputs, so archives and listings agree
TAR_REPRO = ["--sort=name", "--mtime=@1600000000", "--owner=0", "--group=0",
             "--numeric-owner", "--format=gnu"]
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Roar Test", "GIT_AUTHOR_EMAIL": "roar@example.com",
    "GIT_AUTHOR_DATE": "2020-09-13T12:26:40+00:00",
    "GIT_COMMITTER_NAME": "Roar Test", "GIT_COMMITTER_EMAIL": "roar@example.com",
    "GIT_COMMITTER_DATE": "2020-09-13T12:26:40+00:00",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_PAGER": "cat",
    "PAGER": "cat", "GIT_TERMINAL_PROMPT": "0",
}


@dataclass
class Case:
    cmds: list[list[str]]  # run in order in the work dir; all are compared
    files: dict[str, str | bytes] = field(default_factory=dict)  # inputs (relative path)
    dirs: tuple[str, ...] = ()
    rcs: list[int] | None = None  # expected return codes (the case must fail as designed)
    outputs: tuple[str, ...] = ()  # files that must be byte-identical afterwards
    exes: tuple[str, ...] = ()  # programs whose logs must exist (basename prefix of exe)
    opened: tuple[str, ...] = ()  # relative paths that must appear in open records
    env: dict[str, str] = field(default_factory=dict)
    tools: tuple[str, ...] = ()
    expect: tuple[bytes, ...] = ()  # in the plain run's output: the case tests what it says


PY_SCRIPT = textwrap.dedent(
    """\
    import json, os, shutil, subprocess, sys, tempfile
    from pathlib import Path

    data = Path("in/data.txt").read_text()
    numbers = [int(x) for x in open("in/numbers.txt")]
    os.makedirs("out/deep", exist_ok=True)
    with open("out/summary.json", "w") as f:
        json.dump({"words": len(data.split()), "sum": sum(numbers)}, f, sort_keys=True)
    fd = os.open("out/raw.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, bytes(range(256)))
    os.close(fd)
    shutil.copy("in/data.txt", "out/deep/copy.txt")
    with tempfile.NamedTemporaryFile("w", dir="out", delete=False) as t:
        t.write(data.upper())
    os.replace(t.name, "out/upper.txt")
    child = subprocess.run(
        [sys.executable, "-c",
         "import sys; d = open(sys.argv[1]).read(); open(sys.argv[2], 'w').write(d[::-1]);"
         "print(len(d)); print('child note', file=sys.stderr)",
         "in/data.txt", "out/reversed.txt"],
        capture_output=True, text=True, check=True)
    sh = subprocess.run("cat in/numbers.txt | sort -n > out/sorted.txt; echo shell-done",
                        shell=True, capture_output=True, text=True)
    with open("out/append.log", "a") as f:
        f.write("first\\n")
    with open("out/append.log", "a") as f:
        f.write("second\\n")
    print("child said", child.stdout.strip(), child.stderr.strip(), sh.stdout.strip())
    print("listing", sorted(os.listdir("out")))
    print("warning: done", file=sys.stderr)
    """
)

BASH_SCRIPT = textwrap.dedent(
    """\
    set -u
    mkdir -p out/sub
    cat in/a.txt in/b.txt > out/ab.txt
    cp out/ab.txt "out/sub/with space.txt"
    mv out/ab.txt out/moved.txt
    echo appended >> out/moved.txt
    sort < in/b.txt > out/sorted.txt 2> out/err.txt
    wc -l < out/moved.txt
    cat <<EOF > out/heredoc.txt
    line one
    line $((6 * 7))
    EOF
    ( cd out/sub && cat "with space.txt" | tr a-z A-Z > upper.txt )
    ln -s moved.txt out/link.txt
    cat out/link.txt | head -n 2
    exec 3> out/fd3.txt
    echo "via fd 3" >&3
    exec 3>&-
    rm out/sorted.txt
    ls out out/sub
    echo "to stderr" >&2
    x=$(cat out/heredoc.txt | wc -c)
    echo "heredoc bytes: $x"
    """
)

HELLO_C = textwrap.dedent(
    """\
    #include <ctype.h>
    #include <stdio.h>
    int main(int argc, char **argv) {
        if (argc != 3) { fprintf(stderr, "usage: hello IN OUT\\n"); return 2; }
        FILE *in = fopen(argv[1], "r"), *out = fopen(argv[2], "w");
        if (!in || !out) { perror("fopen"); return 1; }
        int c; long n = 0;
        while ((c = fgetc(in)) != EOF) { fputc(toupper(c), out); n++; }
        fclose(in); fclose(out);
        printf("copied %ld bytes\\n", n);
        fprintf(stderr, "hello: done\\n");
        return 3;
    }
    """
)

# Every interposed call, failing and succeeding, with errno set to 777 beforehand: a
# failure must leave the same errno as untraced, a success must leave 777 untouched (the
# shim's own syscalls must not leak into errno), and returned fds must be the same
# numbers (the shim must not hold fds of its own).
ERRNO_C = textwrap.dedent(
    """\
    #define _GNU_SOURCE
    #include <errno.h>
    #include <fcntl.h>
    #include <spawn.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <sys/stat.h>
    #include <sys/wait.h>
    #include <unistd.h>
    extern char **environ;
    #define T(expr) do { errno = 777; long r_ = (long)(expr); \\
        printf("%-50s r=%ld errno=%d\\n", #expr, r_, errno); } while (0)
    #define TP(expr) do { errno = 777; void *p_ = (void *)(expr); \\
        printf("%-50s %s errno=%d\\n", #expr, p_ ? "ok" : "NULL", errno); } while (0)
    int main(void) {
        char *argv[] = {"x", NULL};
        int fd, d, st = 0; FILE *f; pid_t pid;
        T(fd = open("exists.txt", O_RDONLY)); T(close(fd));
        T(open("missing", O_RDONLY));
        T(open("adir", O_WRONLY));
        T(open("exists.txt", O_CREAT | O_EXCL | O_WRONLY, 0644));
        T(open("exists.txt/x", O_RDONLY));
        T(fd = open("exists.txt", O_WRONLY | O_APPEND)); T(write(fd, "+", 1)); T(close(fd));
        /* O_CREAT without O_EXCL on an existing file, a directory, a dangling symlink. */
        T(fd = open("exists.txt", O_WRONLY | O_CREAT | O_APPEND, 0644)); T(close(fd));
        T(open("adir", O_WRONLY | O_CREAT, 0644));
        T(open("nodir/x", O_WRONLY | O_CREAT, 0644));
        T(symlink("dangling-target.txt", "dangling"));
        T(fd = open("dangling", O_WRONLY | O_CREAT | O_TRUNC, 0644)); T(close(fd));
        T(fd = creat("exists-too.txt", 0644)); T(close(fd));
        T(fd = creat("exists-too.txt", 0644)); T(close(fd));
        T(fd = openat(AT_FDCWD, "adir/inner.txt", O_RDONLY)); T(close(fd));
        T(d = open("adir", O_RDONLY | O_DIRECTORY));
        T(openat(d, "nope", O_RDONLY));
        T(fd = openat(d, "inner.txt", O_RDONLY)); T(close(fd));
        T(fd = openat(d, "made.txt", O_WRONLY | O_CREAT | O_TRUNC, 0600)); T(close(fd));
        T(close(d));
        T(fd = creat("new.txt", 0644)); T(write(fd, "new", 3)); T(close(fd));
        T(creat("nodir/x", 0644));
        TP(fopen("missing", "r"));
        TP(fopen("adir", "w"));
        TP(f = fopen("exists.txt", "r")); T(fclose(f));
        TP(f = fopen("out.txt", "w")); T(fputs("written\\n", f)); T(fclose(f));
        TP(f = fopen("out.txt", "a")); T(fputs("again\\n", f)); T(fclose(f));
        TP(f = fopen("exists.txt", "w+")); T(fputs("exists\\n", f)); T(fclose(f));
        TP(fopen("nodir/x", "w"));
        TP(f = fopen("exists.txt", "r")); TP(freopen("missing", "r", f));
        TP(f = fopen("exists.txt", "r")); TP(f = freopen("out.txt", "a", f));
        T(fputs("more\\n", f)); T(fclose(f));
        T(rename("missing", "x")); T(rename("new.txt", "renamed.txt"));
        T(rename("adir", "adir/sub"));
        T(renameat(AT_FDCWD, "renamed.txt", AT_FDCWD, "renamed2.txt"));
        T(renameat2(AT_FDCWD, "renamed2.txt", AT_FDCWD, "exists.txt", RENAME_NOREPLACE));
        T(link("exists.txt", "exists.txt")); T(link("exists.txt", "hard.txt"));
        T(linkat(AT_FDCWD, "missing", AT_FDCWD, "hard2.txt", 0));
        T(symlink("exists.txt", "hard.txt")); T(symlink("exists.txt", "sym.txt"));
        T(symlinkat("exists.txt", AT_FDCWD, "sym2.txt"));
        T(unlink("missing")); T(unlink("adir")); T(unlink("hard.txt"));
        T(unlinkat(AT_FDCWD, "adir", 0)); T(unlinkat(AT_FDCWD, "sym2.txt", 0));
        T(remove("missing")); T(remove("sym.txt"));
        T(mkdir("adir", 0755)); T(mkdir("newdir", 0755)); T(mkdirat(AT_FDCWD, "newdir2", 0755));
        T(rmdir("adir")); T(rmdir("newdir")); T(unlinkat(AT_FDCWD, "newdir2", AT_REMOVEDIR));
        T(truncate("missing", 0)); T(truncate("renamed2.txt", 1)); T(truncate("adir", 0));
        T(chdir("missing")); T(chdir("adir")); T(open("inner.txt", O_RDONLY)); T(chdir(".."));
        T(d = open("adir", O_RDONLY)); T(fchdir(d)); T(fchdir(999)); T(chdir("..")); T(close(d));
        T(dup(999)); T(dup2(999, 50)); T(dup3(1, 1, 0));
        T(fd = dup(1)); T(close(fd)); T(dup2(1, 20)); T(close(20)); T(dup3(1, 21, O_CLOEXEC));
        T(close(21)); T(close(999));
        T(execve("missing", argv, environ)); T(execvp("no-such-program-roar", argv));
        T(execl("exists.txt", "x", (char *)NULL)); T(execv("adir", argv));
        T(posix_spawn(&pid, "missing", NULL, NULL, argv, environ));
        T(posix_spawnp(&pid, "true", NULL, NULL, argv, environ)); T(waitpid(pid, &st, 0) > 0);
        printf("spawned status %d\\n", st);
        fflush(stdout);
        errno = 777; pid = fork();
        printf("fork %s errno=%d\\n", pid > 0 ? "parent" : pid ? "failed" : "child", errno);
        if (pid == 0) { _exit(errno == 777 ? 5 : 6); }
        T(waitpid(pid, &st, 0) > 0);
        printf("fork child status %d\\n", WEXITSTATUS(st));
        T(open("exists.txt", O_RDONLY));  /* the next free fd: nothing leaked */
        return 0;
    }
    """
)

PY_ERRNO = textwrap.dedent(
    """\
    import os
    def e(name, fn, *args):
        try:
            r = fn(*args)
            print(name, "ok", r if isinstance(r, int) else "")
        except OSError as exc:
            print(name, "errno", exc.errno)
    e("open-missing", os.open, "missing", os.O_RDONLY)
    e("open-dir-wronly", os.open, "adir", os.O_WRONLY)
    e("open-excl-existing", os.open, "exists.txt", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    e("open-notdir", os.open, "exists.txt/x", os.O_RDONLY)
    e("open-ok", os.open, "exists.txt", os.O_RDONLY)
    e("rename-missing", os.rename, "missing", "x")
    e("mkdir-existing", os.mkdir, "adir")
    e("rmdir-nonempty", os.rmdir, "adir")
    e("unlink-dir", os.unlink, "adir")
    e("link-existing", os.link, "exists.txt", "exists.txt")
    e("symlink-existing", os.symlink, "x", "exists.txt")
    e("truncate-missing", os.truncate, "missing", 0)
    e("chdir-missing", os.chdir, "missing")
    e("execv-missing", os.execv, "missing", ["missing"])
    e("builtin-open", lambda: open("missing/deeper").read())
    """
)


def _exit_kill_script() -> str:
    return ("import os, signal\n"
            "open('before-kill.txt', 'w').write('written')\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")


CASES: dict[str, Case] = {
    "python3_script": Case(
        cmds=[[PY, "script.py"]],
        files={"script.py": PY_SCRIPT, "in/data.txt": "alpha beta gamma\ndelta\n",
               "in/numbers.txt": "5\n3\n11\n1\n"},
        rcs=[0],
        outputs=("out/summary.json", "out/raw.bin", "out/deep/copy.txt", "out/upper.txt",
                 "out/reversed.txt", "out/sorted.txt", "out/append.log"),
        exes=("python3", "sh", "cat", "sort"),
        opened=("script.py", "in/data.txt", "in/numbers.txt", "out/summary.json",
                "out/raw.bin", "out/deep/copy.txt", "out/reversed.txt", "out/sorted.txt",
                "out/append.log"),
        tools=("sort", "cat"),
    ),
    "python3_exit7": Case(cmds=[[PY, "-c", "import sys; sys.exit(7)"]], rcs=[7],
                          exes=("python3",)),
    "python3_exception": Case(
        cmds=[[PY, "-c", "print('before'); open('missing.txt')"]], rcs=[1], exes=("python3",),
        opened=("missing.txt",),
    ),
    "python3_sigkill": Case(
        cmds=[[PY, "-c", _exit_kill_script()]], rcs=[-9], outputs=("before-kill.txt",),
        exes=("python3",), opened=("before-kill.txt",),
    ),
    "python3_errno": Case(
        cmds=[[PY, "errno_probe.py"]], files={"errno_probe.py": PY_ERRNO, "exists.txt": "x",
                                              "adir/inner.txt": "i"},
        rcs=[0], exes=("python3",), opened=("errno_probe.py", "missing", "adir", "exists.txt"),
        expect=(b"open-missing errno 2", b"open-dir-wronly errno 21",
                b"open-excl-existing errno 17", b"execv-missing errno 2"),
    ),
    "bash_script": Case(
        cmds=[["bash", "script.sh"]],
        files={"script.sh": BASH_SCRIPT, "in/a.txt": "apple\nbanana\n",
               "in/b.txt": "cherry\napricot\nbanana\n"},
        rcs=[0],
        outputs=("out/moved.txt", "out/sub/with space.txt", "out/err.txt", "out/heredoc.txt",
                 "out/sub/upper.txt", "out/fd3.txt"),
        exes=("bash", "cat", "cp", "mv", "sort", "ln", "rm", "ls", "tr"),
        opened=("script.sh", "in/a.txt", "in/b.txt", "out/moved.txt", "out/sorted.txt",
                "out/heredoc.txt", "out/fd3.txt", "out/sub/upper.txt"),
        tools=("cp", "mv", "sort", "tr", "head", "wc", "ls", "ln"),
    ),
    "bash_exit42": Case(cmds=[["bash", "-c", "echo out; echo err >&2; exit 42"]], rcs=[42],
                        exes=("bash",)),
    "bash_sigterm": Case(cmds=[["bash", "-c", "echo before; kill -TERM $$; echo after"]],
                         rcs=[-15], exes=("bash",), expect=(b"before",)),
    "bash_redirect_fail": Case(
        cmds=[["bash", "-c", "cat < missing.txt; echo x > adir; echo rc=$?"]], rcs=[0],
        dirs=("adir",), exes=("bash",), opened=("missing.txt", "adir"),
    ),
    "tar_create_list_extract": Case(
        cmds=[["tar", "cf", "archive.tar", *TAR_REPRO, "src"],
              ["tar", "tvf", "archive.tar"],
              ["mkdir", "extracted"],
              ["tar", "xvf", "archive.tar", "-C", "extracted"],
              ["tar", "czf", "archive.tgz", *TAR_REPRO, "src"],
              ["tar", "dvf", "archive.tar", "-C", "extracted"]],
        files={"src/a.txt": "aaa\n", "src/sub/b.txt": "b" * 5000, "src/sub/c.bin": bytes(300)},
        rcs=[0, 0, 0, 0, 0, 0],
        outputs=("archive.tar", "extracted/src/a.txt", "extracted/src/sub/b.txt",
                 "extracted/src/sub/c.bin"),
        exes=("tar", "mkdir", "gzip"),
        opened=("archive.tar", "src/a.txt", "src/sub/b.txt", "extracted/src/sub/c.bin",
                "archive.tgz"),
        tools=("gzip",),
    ),
    "tar_missing_file": Case(
        cmds=[["tar", "cf", "x.tar", "missing_file"], ["tar", "xf", "missing.tar"],
              ["tar", "tf", "not-a-tar.txt"]],
        files={"not-a-tar.txt": "this is not an archive\n" * 40},
        rcs=[2, 2, 2], exes=("tar",), opened=("x.tar", "missing.tar", "not-a-tar.txt"),
        expect=(b"missing_file: Cannot stat: No such file or directory",
                b"This does not look like a tar archive"),
    ),
    "gcc_compile_run": Case(
        cmds=[["gcc", "-O1", "-Wall", "-o", "hello", "hello.c"],
              ["./hello", "in.txt", "out.txt"], ["./hello"]],
        files={"hello.c": HELLO_C, "in.txt": "make me loud\n"},
        rcs=[0, 3, 2], outputs=("hello", "out.txt"),
        exes=("gcc", "cc1", "as", "collect2", "ld", "hello"),
        opened=("hello.c", "hello", "in.txt", "out.txt"), tools=("gcc",),
    ),
    "gcc_errno_probe": Case(
        cmds=[["gcc", "-O0", "-o", "probe", "probe.c"], ["./probe"]],
        files={"probe.c": ERRNO_C, "exists.txt": "exists\n", "adir/inner.txt": "inner\n"},
        rcs=[0, 0],
        outputs=("probe", "out.txt", "exists.txt", "renamed2.txt", "dangling-target.txt"),
        expect=(b'open("missing", O_RDONLY)', b"r=-1 errno=2\n", b"r=-1 errno=21\n",
                b"r=-1 errno=17\n", b"r=-1 errno=39\n", b"r=-1 errno=13\n",
                b"fork parent errno=777", b"fork child status 5"),
        exes=("gcc", "cc1", "probe"),
        opened=("probe.c", "exists.txt", "missing", "adir/inner.txt", "out.txt"),
        tools=("gcc", "true"),
    ),
    "gcc_syntax_error": Case(
        cmds=[["gcc", "-c", "bad.c"]], files={"bad.c": "int main(void) { return 0 }\n"},
        rcs=[1], exes=("gcc", "cc1"), opened=("bad.c",), tools=("gcc",),
        expect=(b"bad.c:1:",),
    ),
    "git_init_add_commit_log": Case(
        cmds=[["git", "-c", "init.defaultBranch=main", "init"],
              ["git", "add", "."],
              ["git", "commit", "-m", "first commit"],
              ["git", "mv", "a.txt", "renamed.txt"],
              ["git", "rm", "-q", "sub/b.txt"],
              ["git", "commit", "-m", "second"],
              ["git", "log", "--stat", "--format=fuller"],
              ["git", "cat-file", "-p", "HEAD"],
              ["git", "show", "HEAD~1:sub/b.txt"],
              ["git", "status", "--porcelain=v1", "--branch"],
              ["git", "show", "HEAD:no-such-file"]],
        files={"a.txt": "hello git\n", "sub/b.txt": "bee\n", "c.bin": bytes(range(256))},
        rcs=[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 128],
        outputs=("renamed.txt", "c.bin", ".git/HEAD", ".git/refs/heads/main"),
        exes=("git",),
        opened=("a.txt", "c.bin", ".git/index", ".git/HEAD", ".git/refs/heads/main"),
        env=GIT_ENV, tools=("git",),
    ),
    "git_not_a_repo": Case(
        cmds=[["git", "log"], ["git", "add", "nothing"]], rcs=[128, 128], exes=("git",),
        expect=(b"fatal: not a git repository",),
        env=GIT_ENV, tools=("git",),
    ),
}


def _populate(work: Path, case: Case) -> None:
    work.mkdir(parents=True)
    for d in case.dirs:
        (work / d).mkdir(parents=True, exist_ok=True)
    for rel, content in case.files.items():
        p = work / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    for p in [work, *work.rglob("*")]:
        os.utime(p, (FIXED_TIME, FIXED_TIME))


def _norm(data: bytes, root: Path) -> bytes:
    for r in {str(root), os.path.realpath(root)}:
        data = data.replace(os.fsencode(r), b"<ROOT>")
    return data


def _run_world(root: Path, case: Case, plain_env, traced_run, session: Path | None):
    work = root / "work"
    _populate(work, case)
    env = plain_env(root, {**case.env, "GIT_CEILING_DIRECTORIES": str(root)})
    results = []
    for cmd in case.cmds:
        if session is None:
            p = subprocess.run(cmd, cwd=work, env=env, capture_output=True,
                               stdin=subprocess.DEVNULL, timeout=120)
        else:
            p, _ = traced_run(cmd, work, session_dir=session, env=env)
        results.append((p.returncode, _norm(p.stdout, root), _norm(p.stderr, root)))
    return work, results


def _exe_names(trace: tracelog.SessionTrace) -> set[str]:
    names = set()
    for log in trace.logs:
        for r in log.records:
            if r.op_name == "start" and r.result == tracelog.ORIGIN_EXEC:
                names.add(os.path.basename(os.fsdecode(r.path)))
                if r.argv:
                    names.add(os.path.basename(os.fsdecode(r.argv[0])))
    return names


@pytest.mark.parametrize("name", list(CASES))
def test_traced_equals_untraced(name, tmp_path, plain_env, traced_run, session_dir):
    case = CASES[name]
    for tool in (*case.tools, "bash", "tar"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    # Same-length roots, so even column-aligned output could not differ by path length.
    plain_work, plain = _run_world(tmp_path / "u", case, plain_env, traced_run, None)
    traced_work, traced = _run_world(tmp_path / "t", case, plain_env, traced_run, session_dir)

    if case.rcs is not None:
        assert [r[0] for r in plain] == case.rcs, f"the case itself misbehaves: {plain}"
    plain_out = b"".join(o + e for _, o, e in plain)
    for want in case.expect:
        assert want in plain_out, f"the case itself misbehaves: no {want!r} in {plain_out!r}"
    if name == "bash_sigterm":
        assert b"after" not in plain_out
    for cmd, p, t in zip(case.cmds, plain, traced, strict=True):
        assert t[0] == p[0], f"{cmd}: exit status {t[0]} traced, {p[0]} plain\n{t}\n{p}"
        assert t[1] == p[1], f"{cmd}: stdout differs\ntraced: {t[1]!r}\nplain:  {p[1]!r}"
        assert t[2] == p[2], f"{cmd}: stderr differs\ntraced: {t[2]!r}\nplain:  {p[2]!r}"
    for rel in case.outputs:
        a, b = plain_work / rel, traced_work / rel
        assert a.is_file(), f"the case did not produce {rel}"
        assert b.read_bytes() == a.read_bytes(), f"{rel} differs traced vs plain"
    plain_tree = sorted(str(p.relative_to(plain_work)) for p in plain_work.rglob("*"))
    traced_tree = sorted(str(p.relative_to(traced_work)) for p in traced_work.rglob("*"))
    assert traced_tree == plain_tree

    # It really was traced.
    trace = tracelog.read_session(session_dir)
    assert not trace.errors, trace.errors
    assert trace.dropped == 0
    assert trace.logs, "the traced run wrote no logs"
    names = _exe_names(trace)
    for exe in case.exes:
        assert any(re.fullmatch(re.escape(exe) + r"[0-9.]*", n) for n in names), (
            f"no log of {exe}: logs of {sorted(names)}")
    opened = {os.path.normpath(r.path) for log in trace.logs for r in log.records
              if r.op_name == "open"}
    for rel in case.opened:
        p = os.fsencode(os.path.realpath(traced_work / rel))
        q = os.fsencode(traced_work / rel)
        assert p in opened or q in opened, f"no open record of {rel}"
    # And the plain run really was not: nothing may leak into the session dir from it.
    assert not any(os.fsencode(str(tmp_path / "u")) in r.path
                   for log in trace.logs for r in log.records)

