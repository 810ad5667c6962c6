from __future__ import annotations

import pytest

from roar_core.pipeline.redact import MASK, redact_argv, redact_env, redact_text


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--password", "hunter2"], ["--password", MASK]),
        (["--password=hunter2"], [f"--password={MASK}"]),
        (["--api-key", "k1", "--client_secret=s1"], ["--api-key", MASK, f"--client_secret={MASK}"]),
        (["--auth-token", "t1", "--token", "t2"], ["--auth-token", MASK, "--token", MASK]),
        (["-token=t1", "-Djavax.net.ssl.keyStorePassword=p1"],
         [f"-token={MASK}", f"-Djavax.net.ssl.keyStorePassword={MASK}"]),
        (["env", "AWS_SECRET_ACCESS_KEY=s1", "PGPASSWORD=p1", "make"],
         ["env", f"AWS_SECRET_ACCESS_KEY={MASK}", f"PGPASSWORD={MASK}", "make"]),
        (["psql", "postgresql://alice:p1@db/x"], ["psql", f"postgresql://alice:{MASK}@db/x"]),
        (["git", "clone", "https://ghp_t1@github.com/o/r"],
         ["git", "clone", f"https://{MASK}@github.com/o/r"]),
        (["--db=mysql://u:p1@h/x"], [f"--db=mysql://u:{MASK}@h/x"]),
        (["curl", "-H", "Authorization: Bearer t1"], ["curl", "-H", f"Authorization: {MASK}"]),
        (["wget", "https://b.s3/k?X-Amz-Signature=s1&X-Amz-Date=d"],
         ["wget", f"https://b.s3/k?X-Amz-Signature={MASK}&X-Amz-Date=d"]),
        (["gpg", "--passphrase", "s1", "--pw", "s2", "--pwd=s3", "--bearer", "s4"],
         ["gpg", "--passphrase", MASK, "--pw", MASK, f"--pwd={MASK}", "--bearer", MASK]),
        (["curl", "-u", "alice:s1", "--proxy-user=bob:s2"],
         ["curl", "-u", f"alice:{MASK}", f"--proxy-user=bob:{MASK}"]),
        (["env", "MYSQL_PWD=s1", "mysqldump", "-ps2", "-P", "3306"],
         ["env", f"MYSQL_PWD={MASK}", "mysqldump", "-ps2", "-P", "3306"]),
        (["/usr/bin/mysqldump", "-ps2", "-p", "db"],
         ["/usr/bin/mysqldump", f"-p{MASK}", "-p", "db"]),
        # A value in a shell string ends where the shell word does: the shape stays.
        (["sh", "-c", "deploy --token s1; echo done"],
         ["sh", "-c", f"deploy --token {MASK}; echo done"]),
        (["sh", "-c", "A_TOKEN=s1 sh -c 'x|y'"], ["sh", "-c", f"A_TOKEN={MASK} sh -c 'x|y'"]),
        # A header in a shell string: to the quote that ends its word.
        (["sh", "-c", 'curl -s -H "Authorization: Bearer t1" https://h/x; echo done'],
         ["sh", "-c", f'curl -s -H "Authorization: {MASK}" https://h/x; echo done']),
        (["bash", "-c", "curl -H 'X-Api-Key: k1' -H 'Accept: json' -b 'Cookie: c=1' u"],
         ["bash", "-c", f"curl -H 'X-Api-Key: {MASK}' -H 'Accept: json' -b 'Cookie: {MASK}' u"]),
    ],
)  # fmt: skip
def test_redact_argv_masks_secret_values(argv: list[str], expected: list[str]) -> None:
    assert redact_argv(argv) == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "train.py", "--epochs", "3", "--out=/data/model.pt"],
        ["--password-file", "/run/secrets/pw"],  # points at the secret, is not it
        ["docker", "login", "--password-stdin", "registry.example"],
        ["mysql", "-p", "3306"],  # two-character flags mean different things per program
        ["OUT=/data/x", "https://example.com/path?page=2"],
        ["env", "PWD=/work", "OLDPWD=/tmp", "make"],  # working directories, not passwords
        ["python", "-u", "train.py", "-p", "8080"],
    ],
)
def test_redact_argv_keeps_ordinary_arguments(argv: list[str]) -> None:
    assert redact_argv(argv) == argv


def test_redact_argv_does_not_mutate_input() -> None:
    argv = ["--token", "t1"]
    redact_argv(argv)
    assert argv == ["--token", "t1"]



def test_redact_argv_gives_each_caller_its_own_list() -> None:
    # Redactions are kept per command (a task's is asked for four times or more): what one
    # caller does with its list must not reach the next one's.
    argv = ["curl", "--token", "s3cr3t-tok", "https://example.com"]
    first = redact_argv(argv)
    first.append("changed")
    first[2] = "s3cr3t-tok"
    assert redact_argv(argv) == ["curl", "--token", MASK, "https://example.com"]
    assert redact_argv(argv, ["example"]) == ["curl", "--token", MASK, f"https://{MASK}.com"]

def test_redact_env() -> None:
    env = {
        "GITHUB_TOKEN": "t1",
        "AWS_SECRET_ACCESS_KEY": "s1",
        "DB_PASSWORD": "p1",
        "GOOGLE_APPLICATION_CREDENTIALS_JSON": "c1",
        "API_KEY": "k1",
        "DATABASE_URL": "postgres://u:p2@h/db",
        "PATH": "/usr/bin",
        "PWD": "/work",
    }
    out = redact_env(env)
    assert out == {
        "GITHUB_TOKEN": MASK,
        "AWS_SECRET_ACCESS_KEY": MASK,
        "DB_PASSWORD": MASK,
        "GOOGLE_APPLICATION_CREDENTIALS_JSON": MASK,
        "API_KEY": MASK,
        "DATABASE_URL": f"postgres://u:{MASK}@h/db",
        "PATH": "/usr/bin",
        "PWD": "/work",
    }


def test_redact_text_in_error_messages() -> None:
    msg = "connect to https://bob:p1@minio:9000/b failed; retry https://t9@h/x?token=t2&n=1"
    out = redact_text(msg)
    for secret in ("p1", "t9", "t2"):
        assert secret not in out
    assert "bob" in out and "n=1" in out


def test_redact_text_flags_inside_strings() -> None:
    # What CalledProcessError prints, and a shell string passed as one argument.
    err = "Command '['psql', '--password', 'p1', '-h', 'db']' returned non-zero exit status 2."
    assert redact_text(err) == err.replace("'p1'", f"'{MASK}'")
    assert redact_argv(["bash", "-c", "curl --token=t1 -o out PGPASSWORD=p2 x"]) == [
        "bash", "-c", f"curl --token={MASK} -o out PGPASSWORD={MASK} x",
    ]  # fmt: skip


def test_known_secret_values_are_masked_wherever_they_appear() -> None:
    argv = ["sh", "-c", "curl -H 'X-Key: v4lue' https://h/x?k=v4lue", "v4lue", "1"]
    assert redact_argv(argv, secrets=["v4lue", "1"]) == [
        "sh", "-c", f"curl -H 'X-Key: {MASK}' https://h/x?k={MASK}", MASK, "1"]
