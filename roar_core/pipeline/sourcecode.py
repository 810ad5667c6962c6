"""Where a task's code came from: the git repository, commit and path of each code file.

Looked up with `git` when a task is recorded (never on a task's path): the work tree and its
remote once per directory (a worker records many tasks of one checkout), the commit, branch
and whether the files differ from it once per task and work tree (a long-lived recorder
sees the commits made meanwhile).  A file outside any work tree, or a
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
def _work_tree(directory: str) -> tuple[str, str] | None:
    """(root, url) of the work tree holding `directory`: where it is does not change, so
    it is looked up once per directory."""
    top = _git(directory, "rev-parse", "--show-toplevel")
    if not top:
        return None
    remote = _git(top, "config", "--get", "remote.origin.url")
    return top, strip_credentials(remote) if remote else "file://" + top


def _state(top: str, url: str, rels: list[str]) -> tuple[Repo, set[str]] | None:
    """The work tree's commit and branch now, and which of `rels` differ from it,
    in one `git status`: a long-lived recorder sees the commits made since its last task."""
    out = _git(top, "status", "--porcelain=v2", "--branch", "-z", "--", *rels)
    if out is None:
        return None
    commit = branch = None
    changed: set[str] = set()
    fields = iter(out.split("\0"))
    for f in fields:
        kind, _, rest = f.partition(" ")
        if kind == "#":
            key, _, value = rest.partition(" ")
            if key == "branch.oid":
                commit = value
            elif key == "branch.head" and value != "(detached)":
                branch = value
        elif kind in ("1", "u"):  # changed (or unmerged): its path is the last field
            changed.add(rest.split(" ", 7 if kind == "1" else 9)[-1])
        elif kind == "2":  # renamed: the path, then the path it came from
            changed.add(rest.split(" ", 8)[-1])
            next(fields, None)
        elif kind == "?":
            changed.add(rest)
    if commit is None or commit == "(initial)":
        return None
    return Repo(top, commit, url, branch), changed


def versions(files: list[tuple[str, str]]) -> list[CodeVersion]:
    """(path, digest) of a task's code files -> where each is in git."""
    by_tree: dict[tuple[str, str], list[tuple[str, str, str]]] = defaultdict(list)
    out: dict[str, CodeVersion] = {}
    for path, digest in files:
        tree = _work_tree(os.path.dirname(path))
        if tree is None:
            out[path] = CodeVersion(path, digest)
        else:
            by_tree[tree].append((path, digest, os.path.relpath(path, tree[0])))
    for (top, url), found in by_tree.items():
        state = _state(top, url, [rel for _, _, rel in found])
        for path, digest, rel in found:
            out[path] = (CodeVersion(path, digest) if state is None else
                         CodeVersion(path, digest, state[0], rel, rel in state[1]))
    return [out[p] for p, _ in files]
