"""`roar-core diff` of runs that differ in what the test changed between them: an input,
the script's code, the command line; and of a run with itself."""

from __future__ import annotations

import json
import sys

import blake3

from tests.core.test_cli import make_cli
from tests.core.test_exact_lineage import run


def b3(data: bytes) -> str:
    return "blake3:" + blake3.blake3(data).hexdigest()


def test_diff_names_what_changed(tmp_path) -> None:
    cli = make_cli(tmp_path)
    w = cli.cwd.resolve()
    script = "import sys\nsys.stdout.write(open('in.txt').read().upper())\n"
    (cli.cwd / "step.py").write_text(script)
    (cli.cwd / "in.txt").write_text("one\n")
    a = run(cli, "step", f"{sys.executable} step.py > out.txt", wait=True)
    out_a = (cli.cwd / "out.txt").read_bytes()
    (cli.cwd / "in.txt").write_text("two\n")  # one input changed
    (cli.cwd / "step.py").write_text(script + "sys.stdout.write('!')\n")  # and the code
    b = run(cli, "step", f"{sys.executable} step.py > out.txt", wait=True)
    out_b = (cli.cwd / "out.txt").read_bytes()

    proc = cli("diff", "--json", a, b)
    assert proc.returncode == 1, proc.stderr.decode()
    d = json.loads(proc.stdout)
    assert d["inputs"] == [{"name": str(w / "in.txt"), "a": b3(b"one\n"), "b": b3(b"two\n")}]
    assert d["outputs"] == [{"name": str(w / "out.txt"), "a": b3(out_a), "b": b3(out_b)}]
    code = (cli.cwd / "step.py").read_bytes()
    assert d["code"] == [{"name": str(w / "step.py"), "a": {"digest": b3(script.encode())},
                          "b": {"digest": b3(code)}}]  # not in git: no commit
    assert d["parameters"] == [] and d["environment"] == [] and d["machine"] == []

    # The same two runs, named by the versions of out.txt they produced.
    by_version = json.loads(cli("diff", "--json", b3(out_a), "out.txt").stdout)
    assert (by_version["a"]["run_id"], by_version["b"]["run_id"]) == (a, b)
    text = cli("diff", a, b).stdout.decode()
    assert "inputs:" in text and "~ in.txt" in text and "code:" in text

    c = run(cli, "other", "cat in.txt > out2.txt", wait=True)
    params = json.loads(cli("diff", "--json", b, c).stdout)["parameters"]
    assert {p["name"] for p in params} == {"command", "job"}
    same = cli("diff", a, a)
    assert same.returncode == 0 and b"no difference" in same.stdout
    assert cli("diff", a, "no-such-file").returncode == 2  # 1 would mean "they differ"


def git(cwd, *args: str) -> str:
    import subprocess

    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def test_diff_and_reproduce_name_the_code_commit(tmp_path) -> None:
    """Runs of a script in a git repository: each run records the commit checked out and
    whether the script differed from it; a commit between two runs is what diff shows."""
    cli = make_cli(tmp_path)
    w = cli.cwd.resolve()
    git(cli.cwd, "init", "-q")
    (cli.cwd / "step.py").write_text("print(open('in.txt').read().upper())\n")
    (cli.cwd / "in.txt").write_text("same input\n")
    git(cli.cwd, "add", "step.py")
    git(cli.cwd, "commit", "-qm", "first")
    first = git(cli.cwd, "rev-parse", "HEAD")
    a = run(cli, "step", f"{sys.executable} step.py > out.txt", wait=True)
    (cli.cwd / "step.py").write_text("print(open('in.txt').read().lower())\n")  # edited...
    dirty = run(cli, "step", f"{sys.executable} step.py > out.txt", wait=True)
    git(cli.cwd, "commit", "-qam", "second")  # ...then committed
    second = git(cli.cwd, "rev-parse", "HEAD")
    (cli.cwd / "in.txt").write_text("another input\n")  # and one input changed
    b = run(cli, "step", f"{sys.executable} step.py > out.txt", wait=True)

    d = json.loads(cli("diff", "--json", a, b).stdout)
    assert [(c["name"], c["a"]["commit"], c["a"]["dirty"], c["b"]["commit"], c["b"]["dirty"])
            for c in d["code"]] == [(str(w / "step.py"), first, False, second, False)]
    assert d["inputs"] == [{"name": str(w / "in.txt"), "a": b3(b"same input\n"),
                            "b": b3(b"another input\n")}]
    edited = json.loads(cli("diff", "--json", a, dirty).stdout)
    assert (edited["code"][0]["b"]["commit"], edited["code"][0]["b"]["dirty"]) == (first, True)
    assert edited["inputs"] == []  # the same input, the script edited but not committed
    text = cli("diff", a, b).stdout.decode()
    assert f"at {first[:12]}" in text and f"at {second[:12]}" in text
    steps = json.loads(cli.ok("reproduce", "--json", "out.txt"))["steps"]
    assert [(s["code"][0]["commit"], s["code"][0]["dirty"]) for s in steps] == [(second, False)]
