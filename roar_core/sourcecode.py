"""Where a task's code came from: the git repository, commit and path of each code file.

Looked up with `git` when a task is recorded (never on a task's path), once per directory
for the repository and commit (a worker records many tasks of one checkout), and once per
task for whether the files differ from that commit.  A file outside any work tree, or a
machine without git, simply has no location.  Credentials in a remote's URL never leave:
the user-info part is dropped.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

_GIT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Repo:
    top: str  # the work tree's root
    commit: str
    url: str  # the `origin` remote (without credentials), or file://<top>
    branch: str | None


@dataclass(frozen=True)
class CodeVersion:
    """One code file as a task ran it: its digest, and its place in git when it has one."""

    path: str
    digest: str  # blake3:<hex>
    repo: Repo | None = None
    repo_path: str | None = None  # relative to the work tree's root
    dirty: bool | None = None  # differs from the commit (or is not committed)


def _git(cwd: str, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", cwd, *args], capture_output=True, text=True,
                              timeout=_GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.rstrip("\n") if done.returncode == 0 else None


def strip_credentials(url: str) -> str:
    """`https://user:token@host/x.git` -> `https://host/x.git` (scp-like `git@host:x` kept:
    `git` names the account every reader uses, not a secret)."""
    parts = urlsplit(url)
    if not parts.scheme or "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


@functools.lru_cache(maxsize=256)
def repo_of(directory: str) -> Repo | None:
    out = _git(directory, "rev-parse", "--show-toplevel", "HEAD", "--abbrev-ref", "HEAD")
    if out is None:
        return None
    lines = out.splitlines()
    if len(lines) != 3:
        return None
    top, commit, branch = lines
    remote = _git(top, "config", "--get", "remote.origin.url")
    url = strip_credentials(remote) if remote else "file://" + top
    return Repo(top, commit, url, None if branch == "HEAD" else branch)


def versions(files: list[tuple[str, str]]) -> list[CodeVersion]:
    """(path, digest) of a task's code files -> where each is in git."""
    by_repo: dict[Repo, list[tuple[str, str, str]]] = defaultdict(list)
    out: dict[str, CodeVersion] = {}
    for path, digest in files:
        repo = repo_of(os.path.dirname(path))
        if repo is None:
            out[path] = CodeVersion(path, digest)
        else:
            by_repo[repo].append((path, digest, os.path.relpath(path, repo.top)))
    for repo, found in by_repo.items():
        # One status per repository and task: what differs from the commit now.
        status = _git(repo.top, "status", "--porcelain", "--", *(rel for _, _, rel in found))
        changed = {line[3:] for line in status.splitlines()} if status else set()
        for path, digest, rel in found:
            out[path] = CodeVersion(path, digest, repo, rel,
                                    None if status is None else rel in changed)
    return [out[p] for p, _ in files]
