"""Mask secrets in command lines, environments and free text before they leave in an event.

Over-masking is the safe failure: a hidden non-secret costs a little lineage detail, a leaked
token costs a credential rotation. So names are matched loosely and values are never inspected
for "looking random".
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping

MASK = "***"

# Words that make a flag's value secret (`--api-key`, `--client_secret`, `--auth-token`).
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pass",
        "token",
        "secret",
        "key",
        "apikey",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "sig",
        "signature",
        "privatekey",
        "passphrase",
        "pw",
        "pwd",
        "bearer",
    }
)
# ...unless the value only points at the secret (`--password-file`, `--token-env`,
# `--password-stdin` is a switch whose next argument is not its value).
_INDIRECT_WORDS = frozenset({"file", "path", "stdin", "env", "prompt", "dir", "length", "len"})
# Environment variable and KEY=VALUE names: a substring match, as these are usually one word
# (`AWS_SECRET_ACCESS_KEY`, `GITHUB_TOKEN`, `PGPASSWORD`).
# `*_PWD`/`*_PW` (MYSQL_PWD) but not PWD or OLDPWD, the working directories.
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|KEY|CREDENTIAL|AUTH|"
                          r"[_.-]PWD?$", re.IGNORECASE)
# A whole argument `NAME=value` (env's, make's); with whitespace it is a script (`sh -c`),
# masked word by word (redact_text) so that its commands stay.
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)=(\S*)$")

# scheme://user:password@host or scheme://token@host: the whole userinfo may be a credential.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/@\s?#]+)@")
# ?token=...&X-Amz-Signature=... in URLs (presigned S3 links, SAS tokens).
_QUERY_SECRET = re.compile(r"(?P<lead>[?&;](?P<name>[A-Za-z0-9_.-]*)=)(?P<value>[^&;#\s]*)")
# "Authorization: Bearer ..." and "X-Api-Key: ..." as passed to curl -H.
_HEADER_SECRET = re.compile(
    r"^(?P<name>(?:proxy-)?authorization|x-[a-z0-9-]*(?:key|token|secret)[a-z0-9-]*|cookie)"
    r"(?P<sep>\s*:\s*).+$",
    re.IGNORECASE,
)
# The same inside a shell string (`sh -c 'curl -H "Authorization: Bearer x" ...'`): the
# value runs to the quote that closes the header's word.
_TEXT_HEADER_SECRET = re.compile(
    r"""(?<![\w-])(?P<name>(?:proxy-)?authorization|x-[a-z0-9-]*(?:key|token|secret)"""
    r"""[a-z0-9-]*|cookie)(?P<sep>\s*:\s*)(?P<value>[^'"\n]+)""",
    re.IGNORECASE,
)


# Flags and assignments inside free text: shell strings (`bash -c "... --token x"`) and error
# messages quoting argv (CalledProcessError prints "['psql', '--password', 'x']").
# A value ends where a shell word does: masking keeps the command's shape (`--token X; echo`
# stays two commands).
_TEXT_FLAG = re.compile(
    r"""(?<![\w-])(?P<flag>--?[A-Za-z][\w.-]*)(?P<sep>=|\s+|['"],\s*['"])"""
    r"""(?P<value>[^\s'",\];&|<>()`]+)"""
)
_TEXT_ASSIGNMENT = re.compile(
    r"""(?<![\w.-])(?P<name>[A-Za-z_][\w.]*)=(?P<value>[^\s'",;&|<>()`]+)""")
# `curl -u user:password`, `--user=user:password`: the part after the colon.
_USER_FLAGS = frozenset({"-u", "--user", "--proxy-user"})
_TEXT_USER = re.compile(r"""(?<![\w-])(?P<flag>-u|--user|--proxy-user)(?P<sep>=|\s+)"""
                        r"""(?P<q>['"]?)(?P<user>[^\s:'"]+):(?P<value>[^\s'";&|<>()`]+)""")
# MySQL's clients take the password glued to -p (`mysql -pX`); -p alone prompts.
_MYSQL_CLIENT = re.compile(r"^(mysql|mariadb)[\w-]*$")
_TEXT_MYSQL_P = re.compile(r"""(?P<lead>\b(?:mysql|mariadb)[\w-]*\b[^;&|\n]*?\s)-p"""
                           r"""(?P<value>[^\s'";&|<>()`]+)""")


def _is_secret_flag(flag: str) -> bool:
    # Split camelCase too: Java properties spell it keyStorePassword.
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", flag.lstrip("-"))
    words = [w for w in re.split(r"[-_.]+", spaced.lower()) if w]
    if not words or _INDIRECT_WORDS.intersection(words):
        return False
    joined = "".join(words)
    return bool(_SECRET_WORDS.intersection(words)) or joined in _SECRET_WORDS


def is_secret_name(name: str) -> bool:
    """True for environment-style names that usually hold a secret."""
    return bool(_SECRET_NAME.search(name))


def redact_text(text: str) -> str:
    """Mask credentials embedded in URLs and HTTP headers anywhere in `text`."""
    text = _URL_USERINFO.sub(_mask_userinfo, text)
    text = _QUERY_SECRET.sub(_mask_query, text)
    text = _HEADER_SECRET.sub(lambda m: f"{m['name']}{m['sep']}{MASK}", text)
    text = _TEXT_HEADER_SECRET.sub(lambda m: f"{m['name']}{m['sep']}{MASK}", text)
    text = _TEXT_FLAG.sub(
        lambda m: f"{m['flag']}{m['sep']}{MASK}" if _is_secret_flag(m["flag"]) else m[0], text
    )
    text = _TEXT_USER.sub(lambda m: f"{m['flag']}{m['sep']}{m['q']}{m['user']}:{MASK}", text)
    text = _TEXT_MYSQL_P.sub(lambda m: f"{m['lead']}-p{MASK}", text)
    return _TEXT_ASSIGNMENT.sub(
        lambda m: f"{m['name']}={MASK}" if is_secret_name(m["name"]) else m[0], text
    )


def _mask_userinfo(m: re.Match[str]) -> str:
    user, sep, _password = m["userinfo"].partition(":")
    # Keep a user name next to a password (useful, not secret); a lone userinfo is
    # typically a token (https://<token>@github.com) and is masked whole.
    return f"{m['scheme']}{user}:{MASK}@" if sep else f"{m['scheme']}{MASK}@"


def _mask_query(m: re.Match[str]) -> str:
    if _is_secret_flag(m["name"]) or is_secret_name(m["name"]):
        return f"{m['lead']}{MASK}"
    return m.group(0)


def redact_argv(argv: Iterable[str], secrets: Iterable[str] = ()) -> list[str]:
    """Return a copy of `argv` with secret values replaced by ``***``.

    Handles ``--password X``, ``--password=X``, ``-token=X``, ``PASSWORD=X``, ``-u user:X``,
    MySQL's ``-pX`` and credentials inside URLs, query strings and header arguments. Other
    two-character flags (``-p X``) are left alone: their meaning differs per program (port,
    path, password) and guessing would hide ordinary arguments.  `secrets`: values known to
    be secret (an engine's parameters named like one), masked wherever they appear.
    """
    # A task's command is redacted for its run's row, its START and end events and its
    # answer (~25 us each for a shell command line): once.
    return list(_redacted(tuple(argv), tuple(secrets)))


@functools.lru_cache(maxsize=256)
def _redacted(argv: tuple[str, ...], secrets: tuple[str, ...]) -> tuple[str, ...]:
    known = sorted({s for s in secrets if len(s) >= _MIN_KNOWN}, key=len, reverse=True)
    mysql = bool(argv) and bool(_MYSQL_CLIENT.match(argv[0].rsplit("/", 1)[-1]))
    out: list[str] = []
    mask_next = mask_password = False
    for arg in argv:
        for value in known:
            arg = arg.replace(value, MASK)
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        if mask_password:
            user, colon, _ = arg.partition(":")
            out.append(f"{user}:{MASK}" if colon else arg)
            mask_password = False
            continue
        if arg in _USER_FLAGS:
            mask_password = True
            out.append(arg)
            continue
        if mysql and arg.startswith("-p") and len(arg) > 2 and not arg.startswith("--"):
            out.append(f"-p{MASK}")
            continue
        # Long flags, including single-dash ones (`-token=x`, Java's `-Dkey.password=x`).
        if arg.startswith("-") and len(arg) > 2:
            flag, eq, _value = arg.partition("=")
            if _is_secret_flag(flag):
                if eq:
                    out.append(f"{flag}={MASK}")
                else:
                    mask_next = True
                    out.append(arg)
                continue
        elif (m := _ASSIGNMENT.match(arg)) and is_secret_name(m[1]):
            out.append(f"{m[1]}={MASK}")
            continue
        out.append(redact_text(arg))
    return tuple(out)


@functools.lru_cache(maxsize=256)
def redact_name(name: str, secrets: tuple[str, ...] = ()) -> str:
    """A job name masked as a command is: a run without `--job` is named by its command's
    first words (`curl -u bob:pw`).  Its words, then the whole: a header's value is words
    of its own there.  Cached: a recorder meets the same few names task after task."""
    return redact_text(" ".join(_redacted(tuple(name.split(" ")), secrets)))


# A known secret shorter than this is not looked for inside arguments: masking every "1"
# of a command would hide it all and protect nothing.
_MIN_KNOWN = 4


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Return a copy of `env` with secret-named variables masked and URL credentials removed."""
    return {
        name: MASK if is_secret_name(name) else redact_text(value) for name, value in env.items()
    }
