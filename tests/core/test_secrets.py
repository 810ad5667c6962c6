"""Secrets never leave in an event, nor rest in the spool or the store (issue 17, item 11):
canaries passed every way the users pass them, through the real CLI; the command keeps
its shape where a value is masked."""

from __future__ import annotations

import json
from pathlib import Path

from tests.core.test_cli import make_cli

# Each canary is unique, so that any leak names the form that leaked it.
FORMS = {
    "passphrase": ["tool", "--passphrase", "cnry-passphrase"],
    "pw": ["tool", "--pw", "cnry-pw"],
    "pwd": ["tool", "--pwd=cnry-pwd"],
    "bearer": ["tool", "--bearer", "cnry-bearer"],
    "curl-u": ["curl", "-u", "alice:cnry-curl-u", "http://127.0.0.1:9/"],
    "env-mysql-pwd": ["env", "MYSQL_PWD=cnry-mysql-pwd", "tool"],
    "mysql-p": ["mysql", "-pcnry-mysql-p", "db"],
    "token-in-shell": ["sh", "-c", "tool --token cnry-shell; echo done"],
    "mysql-in-shell": ["sh", "-c", "mysql -uroot -pcnry-shell-mysql db && echo ok"],
}


def _leaks(home: Path, canaries: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in home.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for c in canaries:
                if c.encode() in data:
                    found.setdefault(c, []).append(path.name)
    return found


def test_secret_canaries_leave_nothing_and_keep_the_shape(tmp_path: Path) -> None:
    cli = make_cli(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("tool", "mysql", "curl"):  # stand-ins that do nothing: the argv matters
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    env = {**cli.env, "PATH": f"{bin_dir}:{cli.env['PATH']}"}
    for name, argv in FORMS.items():
        proc = cli("run", "--wait", "--job", name, "--", *argv, env=env)
        assert proc.returncode == 0, (name, proc.stderr)
    home = Path(cli.env["ROAR_HOME"])
    cli.ok("flush")  # the recorder delivers after `--wait` returns
    canaries = [a.split("cnry-", 1)[1] for argv in FORMS.values() for a in argv
                if "cnry-" in a]
    canaries = ["cnry-" + c.split()[0].split(";")[0] for c in canaries]
    assert _leaks(home, canaries) == {}

    events = [json.loads(line) for line in
              (home / "openlineage" / "events.jsonl").read_text().splitlines()]
    commands = {e["job"]["name"]: e["run"]["facets"]["roar_task"]["command"]
                for e in events if e["eventType"] == "COMPLETE"}
    assert commands["token-in-shell"] == ["sh", "-c", "tool --token ***; echo done"]
    assert commands["mysql-in-shell"][2] == "mysql -uroot -p*** db && echo ok"
    assert commands["curl-u"][2] == "alice:***"
    assert commands["mysql-p"] == ["mysql", "-p***", "db"]


def test_a_run_named_by_its_command_leaves_no_secret_in_its_name(tmp_path: Path) -> None:
    """Without `--job`, a run is named by its command's first words (`curl -u alice:X`,
    a script's `export API_KEY=X`): the name goes out with every event, masked as the
    command is.  (The test above names every run: these names leaked.)"""
    cli = make_cli(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("tool", "mysql", "curl"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    env = {**cli.env, "PATH": f"{bin_dir}:{cli.env['PATH']}"}
    forms = {  # the name each gets -> its command (a shell's script: its first words)
        "curl -u alice:***": ["sh", "-c", "curl -u alice:cnry-name-curl http://127.0.0.1:9/"],
        "mysql -p*** db": ["sh", "-c", "mysql -pcnry-name-mysql db"],
        "export API_KEY=***": ["sh", "-c", "export API_KEY=cnry-name-export; tool"],
        "tool --token ***": ["sh", "-c", "tool --token cnry-name-shell"],
        "curl -H Authorization: ***": [
            "sh", "-c", 'curl -H "Authorization: Bearer cnry-name-header" http://h/'],
    }
    for argv in forms.values():
        proc = cli("run", "--wait", "--", *argv, env=env)
        assert proc.returncode == 0, (argv, proc.stderr)
    home = Path(cli.env["ROAR_HOME"])
    cli.ok("flush")
    assert _leaks(home, [f"cnry-name-{k}" for k in
                         ("curl", "mysql", "export", "shell", "header")]) == {}
    events = [json.loads(line) for line in
              (home / "openlineage" / "events.jsonl").read_text().splitlines()]
    assert {e["job"]["name"] for e in events} == set(forms)
