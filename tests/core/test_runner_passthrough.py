"""`roar-core run CMD` hands CMD what a shell would: every inherited descriptor, and each
signal once (issue 17, items 4 and 5).  The real console script, the real tracer."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from tests.core.test_cli import ROAR, make_cli

MODES = [pytest.param(["--wait"], id="wait"), pytest.param([], id="background")]


@pytest.mark.parametrize("wait", MODES)
def test_fd_3_reaches_the_command(tmp_path: Path, wait: list[str]) -> None:
    cli = make_cli(tmp_path)
    script = f'"{ROAR}" run {" ".join(wait)} -- sh -c "echo hi >&3" 3>f'
    proc = subprocess.run(["bash", "-c", script], cwd=cli.cwd, env=cli.env,
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert (cli.cwd / "f").read_bytes() == b"hi\n"


@pytest.mark.parametrize("wait", MODES)
def test_a_process_substitution_reaches_the_command(tmp_path: Path, wait: list[str]) -> None:
    cli = make_cli(tmp_path)
    (cli.cwd / "x").write_text("b\na\n")
    (cli.cwd / "y").write_text("a\nb\n")
    script = f'"{ROAR}" run {" ".join(wait)} -- diff <(sort x) <(sort y)'
    proc = subprocess.run(["bash", "-c", script], cwd=cli.cwd, env=cli.env,
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert b"/dev/fd/" not in proc.stderr


# The program under test: cleans up on ^C and exits 0; a second SIGINT during the
# cleanup kills it (as it would untraced).
CLEANS_UP = """
import sys, time
try:
    print("ready", flush=True)
    time.sleep(30)
except KeyboardInterrupt:
    time.sleep(0.5)
    print("cleaned", flush=True)
    sys.exit(0)
"""


def _under_a_terminal(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, bytes]:
    """Run argv as the foreground job of a new terminal, press ^C once it says "ready";
    returns its status and what it printed."""
    master, slave = os.openpty()

    def take_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        # As a shell starts its foreground job: ^C at its default, even where this test
        # runs as a background job of a script (which starts with SIGINT ignored).
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=take_terminal)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 30
    try:
        while b"ready" not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                seen += os.read(master, 4096)
        assert b"ready" in seen, seen
        os.write(master, b"\x03")  # the terminal sends SIGINT to its foreground group
        rc = proc.wait(timeout=30)
        while select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's last user is gone
                break
            if not chunk:
                break
            seen += chunk
    finally:
        proc.kill()
        os.close(master)
    return rc, seen


@pytest.mark.parametrize("wait", MODES)
def test_ctrl_c_reaches_the_command_once(tmp_path: Path, wait: list[str]) -> None:
    cli = make_cli(tmp_path)
    program = [sys.executable, "-c", CLEANS_UP]
    rc, seen = _under_a_terminal(program, cli.cwd, cli.env)
    assert rc == 0 and b"cleaned" in seen, seen  # untraced, as the reference
    rc, seen = _under_a_terminal([ROAR, "run", *wait, "--", *program], cli.cwd, cli.env)
    assert rc == 0 and b"cleaned" in seen, seen


def test_a_signal_sent_to_roar_alone_is_relayed(tmp_path: Path) -> None:
    """A scheduler's SIGTERM to roar-core's pid (not the group) reaches the command."""
    cli = make_cli(tmp_path)
    proc = subprocess.Popen([ROAR, "run", "--", "sh", "-c", "echo ready; exec sleep 30"],
                            cwd=cli.cwd, env=cli.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert b"killed by SIGTERM" in proc.stderr.read()


@pytest.mark.parametrize("ignored", ["", "HUP INT QUIT"], ids=["none-ignored", "nohup"])
@pytest.mark.parametrize("wait", MODES)
def test_the_command_starts_with_a_shells_signal_dispositions(tmp_path: Path, wait: list[str],
                                                              ignored: str) -> None:
    """Python ignores SIGPIPE and SIGXFSZ and roar-core blocks signals while it waits:
    the command gets neither, as from a shell (an ignored SIGPIPE turns `yes | head`
    into "Broken pipe" errors).  What roar-core was started ignoring (`nohup`'s SIGHUP,
    a script's background job's SIGINT and SIGQUIT) the command ignores too: relayed,
    those reached it with their default action (killed by the hang-up nohup was for)."""
    cli = make_cli(tmp_path)
    show = ["sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"]
    parent = ["bash", "-c", f"trap '' {ignored}; \"$@\"" if ignored else '"$@"', "bash"]
    plain = subprocess.run([*parent, *show], cwd=cli.cwd, env=cli.env, capture_output=True)
    traced = subprocess.run([*parent, ROAR, "run", *wait, "--", *show], cwd=cli.cwd,
                            env=cli.env, capture_output=True)
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout and b"SigIgn" in plain.stdout, traced.stdout
    if ignored:  # (the parent's trap did its part; without one, whatever we inherited)
        assert int(plain.stdout.split(b"SigIgn:")[1].split()[0], 16) & 1, plain.stdout
    pipe = subprocess.run([ROAR, "run", *wait, "--", "sh", "-c", "yes | head -n 1"],
                          cwd=cli.cwd, env=cli.env, capture_output=True)
    assert pipe.returncode == 0 and pipe.stdout == b"y\n", pipe.stderr
    assert b"Broken pipe" not in pipe.stderr, pipe.stderr


@pytest.mark.parametrize("wait", MODES)
def test_a_command_that_cannot_run_answers_as_a_shell(tmp_path: Path, wait: list[str]) -> None:
    cli = make_cli(tmp_path)
    (cli.cwd / "script.sh").write_text("#!/bin/sh\necho ran\n")  # not executable
    shell = subprocess.run(["bash", "-c", "./script.sh"], cwd=cli.cwd, env=cli.env,
                           capture_output=True)
    proc = cli("run", *wait, "--", "./script.sh")
    assert (proc.returncode, shell.returncode) == (126, 126), proc.stderr
    assert b"Permission denied" in proc.stderr and proc.stdout == b""
    proc = cli("run", *wait, "--", "no-such-program-roar-test")
    assert proc.returncode == 127 and b"No such file or directory" in proc.stderr


@pytest.mark.parametrize("wait", MODES)
def test_stopped_and_continued_the_run_ends_as_its_command(tmp_path: Path,
                                                           wait: list[str]) -> None:
    """^Z then `fg` (or a profiler or debugger attaching) stops roar-core in its wait
    for the command: the command's status and output are still its own."""
    cli = make_cli(tmp_path)
    program = ["sh", "-c", "echo ready; sleep 2; echo done; exit 3"]
    proc = subprocess.Popen([ROAR, "run", *wait, "--", *program], cwd=cli.cwd, env=cli.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"ready\n"
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGSTOP)  # as the terminal stops its foreground group
    time.sleep(1.5)  # longer than any of roar-core's waits for a signal
    os.killpg(proc.pid, signal.SIGCONT)
    assert proc.wait(timeout=30) == 3, proc.stderr.read()
    assert proc.stdout.read() == b"done\n"
    assert b"exit 3" in proc.stderr.read()


# Says which of the first ten descriptors it has (into the file named by argv[1]: its
# stdout may be closed), writes to both streams, and exits 3.
SEES_ITS_FDS = """
import os, sys
def has(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
with open(sys.argv[1], "w") as f:
    f.write(" ".join(str(fd) for fd in range(10) if has(fd)))
for fd, text in ((1, b"out"), (2, b"err")):
    try:
        os.write(fd, text + b"\\n")
    except OSError:
        pass
sys.exit(3)
"""


@pytest.mark.parametrize("closed", ["<&-", ">&-", "2>&-", "<&- >&- 2>&-"],
                         ids=["stdin", "stdout", "stderr", "all"])
@pytest.mark.parametrize("wait", MODES)
def test_a_closed_standard_descriptor_stays_closed_and_the_run_ends_as_its_command(
        tmp_path: Path, wait: list[str], closed: str) -> None:
    """`cmd 2>&-`, a daemon's closed stdin: the command has the descriptors it would have
    untraced, and roar-core exits with its status, writing nothing into the command's
    output (with stderr closed, its messages went to stdout; a flush of the missing
    stream failed the run as exit 1, with a traceback)."""
    cli = make_cli(tmp_path)
    program = f'"{sys.executable}" -c "$1" "$2"'
    plain = subprocess.run(["bash", "-c", f"{program} {closed}", "bash", SEES_ITS_FDS,
                            "plain.txt"], cwd=cli.cwd, env=cli.env, capture_output=True)
    traced = subprocess.run(["bash", "-c", f'"{ROAR}" run {" ".join(wait)} -- {program} '
                             f"{closed}", "bash", SEES_ITS_FDS, "traced.txt"],
                            cwd=cli.cwd, env=cli.env, capture_output=True)
    assert plain.returncode == 3, plain.stderr
    assert traced.returncode == 3, traced.stderr
    assert (cli.cwd / "traced.txt").read_text() == (cli.cwd / "plain.txt").read_text()
    assert traced.stdout == plain.stdout
    assert b"Traceback" not in traced.stderr and b"Error" not in traced.stderr


def _core_of(path: Path) -> str:
    """The program name in an ELF core file's NT_PRPSINFO note (x86-64 and aarch64
    layouts agree up to pr_fname)."""
    import struct

    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[16] == 4, "not an ELF core file"
    phoff, = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data,
                                                                 phoff + i * phentsize)
        at, end = p_offset, p_offset + p_filesz
        while p_type == 4 and at < end:  # PT_NOTE
            namesz, descsz, n_type = struct.unpack_from("<III", data, at)
            desc = at + 12 + (namesz + 3) // 4 * 4
            if n_type == 3:  # NT_PRPSINFO: pr_fname at 40, 16 bytes
                return data[desc + 40 : desc + 56].split(b"\0")[0].decode()
            at = desc + (descsz + 3) // 4 * 4
    raise AssertionError("no NT_PRPSINFO note")


@pytest.mark.parametrize("wait", MODES)
def test_a_command_that_dumps_core_keeps_its_core(tmp_path: Path, wait: list[str]) -> None:
    """roar-core dies of the command's signal to end as it did, without a core of its own:
    its Python's core took the place of the command's (the `core` file of the pattern)."""
    import resource

    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if "/" in pattern or pattern.startswith("|") or "%" in pattern:
        pytest.skip(f"core files do not go to the working directory here ({pattern!r})")
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("reads the x86-64/aarch64 layout of a core file's process note")
    cli = make_cli(tmp_path)
    program = ["sh", "-c", "kill -ABRT $$"]  # (not a Python: its core is told from ours)

    def unlimited_cores() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,) * 2)

    for argv, name in ((program, "untraced"), ([ROAR, "run", *wait, "--", *program], "traced")):
        core = cli.cwd / pattern
        core.unlink(missing_ok=True)
        proc = subprocess.Popen(argv, cwd=cli.cwd, env=cli.env, stderr=subprocess.DEVNULL,
                                preexec_fn=unlimited_cores)
        _, status = os.waitpid(proc.pid, 0)
        proc.returncode = 0  # (reaped here)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGABRT, (name, status)
        if name == "untraced":
            if not core.exists():
                pytest.skip("no core file is written here")
            expected = _core_of(core)
            assert os.WCOREDUMP(status)
        else:
            assert not os.WCOREDUMP(status), "roar-core dumped a core of its own"
            assert core.exists() and _core_of(core) == expected
