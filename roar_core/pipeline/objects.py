"""Classification of a task's object-store records (written by `s3trace`): its S3 inputs,
outputs and deletions, each with the version the task read or left.

An object's version is S3's own (the VersionId on a versioned bucket, else the ETag) and,
when the body passed through the task's process whole, the blake3 of its bytes; or the
local file it was moved to or from (`file`), whose version the capture takes anyway.  The
same rules as for files: an input is the first version read before the task wrote the
object; an output is the last version written; an object the task created and deleted is
transient.
"""

from __future__ import annotations

import os
from collections import namedtuple
from collections.abc import Iterable

from roar_core.pipeline.tracelog import OBJ_DELETE, OBJ_DIGEST, OBJ_READ, OBJ_WRITE, Record

RANGED = "the task read it in byte ranges, not whole"
PARTIAL = "the task did not read the whole object"
OPAQUE = "its response body was not a stream roar can hash"
STREAMED = "its body was streamed from a source roar cannot hash"
COPIED = "copied inside S3 from a version roar has no digest of"

# Programs that move S3 objects with their own code, not botocore's: their I/O is unseen.
UNSEEN_CLIENTS = frozenset({"s5cmd", "rclone", "s3cmd", "mc", "goofys", "mountpoint-s3",
                            "mount-s3", "aws"})


# collections' named tuple, not typing's: importing typing is ~4 ms of a `roar-core run`.
class ObjectVersion(namedtuple("ObjectVersion", ("version", "digest", "size", "file", "why",
                                                 "source"), defaults=(None,))):
    __slots__ = ()
    version: str | None  # VersionId, else ETag
    digest: str | None  # blake3 hex of the bytes
    size: int | None
    file: bytes | None  # the resolved local file with the same bytes
    why: str | None  # why there is no digest
    source: tuple[str, str | None] | None  # a copy's source: (uri, version); else None


def _fields(r: Record) -> dict[str, str]:
    out = {}
    for item in r.path2.split(b"\0") if r.path2 else ():
        k, _, v = item.decode("utf-8", "surrogateescape").partition("=")
        if k:
            out[k] = v
    return out


class _Object:
    __slots__ = ("uri", "first_ns", "read", "written", "deleted", "existed")

    def __init__(self, uri: str, ns: int):
        self.uri, self.first_ns = uri, ns
        self.read: ObjectVersion | None = None  # the first version read before any write
        self.written: ObjectVersion | None = None  # the last version written
        self.deleted = False
        self.existed: bool | None = None


def _file(f: dict[str, str]) -> bytes | None:
    path = f.get("file")
    return os.fsencode(os.path.realpath(path)) if path else None


def _read_version(f: dict[str, str], size: int | None) -> ObjectVersion:
    why = (RANGED if "ranged" in f else OPAQUE if "opaque" in f else
           COPIED if "copied" in f else PARTIAL)
    return ObjectVersion(f.get("vid") or f.get("etag"), None, size, _file(f), why)


def _written_version(f: dict[str, str], size: int | None) -> ObjectVersion:
    digest = f.get("digest")
    source = (f["src"], f.get("src_vid") or f.get("src_etag")) if f.get("src") else None
    return ObjectVersion(f.get("vid") or f.get("etag"), digest, size, _file(f),
                         None if digest else COPIED if source else STREAMED, source)


def classify(records: Iterable[Record]) -> list[tuple[str, str, int, bool, ObjectVersion]]:
    """(uri, role, first_ns, existed, version) of each object: role input, output, deleted
    or transient (an input can also be an output: read, then overwritten)."""
    objects: dict[str, _Object] = {}
    for r in records:
        uri = r.path.decode("utf-8", "surrogateescape")
        o = objects.get(uri)
        if o is None:
            o = objects[uri] = _Object(uri, r.mono_ns)
        f = _fields(r)
        size = r.result if r.result >= 0 else None
        kind = r.flags
        if kind == OBJ_READ:
            if o.read is None and o.written is None and not o.deleted:
                o.read, o.existed = _read_version(f, size), True
        elif kind == OBJ_DIGEST:
            v = o.read
            if v is not None and v.digest is None and v.version == (f.get("vid") or
                                                                    f.get("etag")):
                o.read = v._replace(digest=f.get("digest"), size=size, why=None)
        elif kind == OBJ_WRITE:
            if o.existed is None:
                o.existed = False  # S3 says nothing of a previous version: a CREATE
            o.written, o.deleted = _written_version(f, size), False
        elif kind == OBJ_DELETE:
            if o.existed is None:
                o.existed = True
            o.written, o.deleted = None, True
    out = []
    for o in objects.values():
        if o.read is not None:
            out.append((o.uri, "input", o.first_ns, True, o.read))
        if o.written is not None:
            out.append((o.uri, "output", o.first_ns, bool(o.existed), o.written))
        elif o.deleted:
            role = "deleted" if o.existed else "transient"
            out.append((o.uri, role, o.first_ns, bool(o.existed),
                        ObjectVersion(None, None, None, None, None)))
    return out


def unseen_clients(commands: Iterable[list[str]]) -> list[str]:
    """The S3 clients among the programs a task ran (argv) whose transfers roar cannot
    see: they speak to S3 with their own code, not through botocore."""
    found: list[str] = []
    for argv in commands:
        name = os.path.basename(argv[0]) if argv else ""
        if name not in UNSEEN_CLIENTS or name in found:
            continue
        if name == "aws" and (argv[1:2] not in (["s3"], ["s3api"])
                              or _is_python_script(argv[0])):
            continue  # not S3; or AWS CLI v1, on botocore, whose own process is traced
        if name == "mc" and argv[1:2] not in [[c] for c in _MC_TRANSFERS]:
            continue  # Midnight Commander has the same name
        found.append(name)
    return found


_MC_TRANSFERS = ("cp", "mv", "mirror", "cat", "pipe", "put", "get", "rm", "sync")


def _is_python_script(program: str) -> bool:
    try:
        with open(program, "rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first
