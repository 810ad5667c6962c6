"""The S3 tracer: botocore's S3 calls in a traced Python process, as records of its trace log.

The preload shim sees files; an S3 object travels over a socket it cannot read.  This hook
watches the calls through botocore's own event system and writes one record per object a
call read, wrote or deleted into the process's trace log (`roar_object` in the shim), where
the recorder attributes it to its task like any file record.  Versions are S3's own
(VersionId on a versioned bucket, else the ETag) plus the blake3 of the body whenever the
bytes pass through this process: hashed as the task reads the response stream or from the
request body already in memory, never by reading anything a second time.  An object the
transfer manager moves to or from a local file is linked to that file (`file=`): its
digest is the file's version, which the capture takes anyway.

`roar_core_s3.pth` calls `install()` at interpreter start when the process is traced
(ROAR_SESSION_DIR set): it only adds an import watch, so that a process that never
imports botocore pays nothing more.  When botocore's handlers module is imported the
handlers go into its built-in list, which every session copies at creation: boto3's
default session, other `boto3.Session()`s and aiobotocore's all get them.  Failed calls
are not lineage: a record is written after a call succeeded (status < 300), never before.
"""

from __future__ import annotations

import io
import os
import sys

ENV_SESSION = "ROAR_SESSION_DIR"
ENV_TRACER_OFF = "ROAR_TRACER_OFF"


_installed = False


def install() -> None:
    """Watch for botocore and s3transfer being imported (or patch them now if they are)."""
    global _installed
    # Once: a venv's site-packages is often scanned twice (lib64 -> lib), and so the .pth.
    if _installed or not os.environ.get(ENV_SESSION) or os.environ.get(
            ENV_TRACER_OFF, "").lower() not in ("", "0", "false"):
        return
    _installed = True
    watch = _Watch({"botocore.handlers": _patch_botocore,
                    "s3transfer.futures": _patch_executor,
                    "s3transfer.manager": _patch_manager})
    for name in list(watch.after):
        if name in sys.modules:
            watch.after.pop(name)(sys.modules[name])
    if watch.after:
        sys.meta_path.insert(0, watch)


class _Watch:
    """A finder that finds nothing itself: it runs `after[name](module)` once that module
    has been executed by whichever finder and loader really import it."""

    def __init__(self, after):
        self.after = after

    def find_spec(self, name, path=None, target=None):
        patch = self.after.pop(name, None)
        if patch is None:
            return None
        if not self.after:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        execute = getattr(loader, "exec_module", None)
        if execute is None:
            return spec

        def exec_module(module):
            execute(module)
            try:
                patch(module)
            except Exception as e:  # never break the user's import
                print(f"roar: S3 tracing is off in this process: {e}", file=sys.stderr)

        loader.exec_module = exec_module
        return spec


# ---- what the hook records -------------------------------------------------------------------

_shim = None


def _emit(kind: int, uri: str, fields: dict[str, str | None], size: int | None) -> None:
    data = "\0".join([f"{k}={v}" for k, v in fields.items() if v is not None])
    _shim.object(kind, uri.encode("utf-8", "surrogateescape"),
                 data.encode("utf-8", "surrogateescape"), -1 if size is None else size)


def _uri(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


def _version(parsed: dict) -> tuple[str | None, str | None]:
    """(VersionId, ETag without quotes) of a response."""
    etag = parsed.get("ETag") or (parsed.get("CopyObjectResult") or {}).get("ETag")
    return parsed.get("VersionId"), etag.strip('"') if etag else None


def _hash_bytes(data) -> str:
    import blake3

    # One thread: the call waits on the network far longer than this takes, and blake3's
    # threads would take CPU from the task's own threads for no gain in its wall time.
    return blake3.blake3(data).hexdigest()


def _in_memory(body, start: int | None):
    """The bytes of a request body held in memory, from where the request started
    (botocore turns bytes into a BytesIO), else None."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, io.BytesIO) and start is not None:
        # getvalue(), not getbuffer(): the bytes botocore wrapped, shared (getbuffer would
        # copy them first).
        return memoryview(body.getvalue())[start:]
    return None


def _body_digest(body, start: int | None) -> tuple[str, int] | None:
    """(blake3, size) of a request body held in memory, else None."""
    data = _in_memory(body, start)
    return None if data is None else (_hash_bytes(data), len(data))


def _body_file(body) -> str | None:
    """The local file a request body streams whole from (an open file at its start)."""
    name = getattr(body, "name", None)
    if not isinstance(name, str) or not os.path.isabs(name):
        return None
    try:
        if body.tell() != 0:
            return None
    except (AttributeError, OSError, ValueError):
        return None
    return name


# Objects the transfer manager is moving to or from local files: (bucket, key) -> path.
# Written by the calling thread, read by the transfer's I/O threads.
_links: dict[tuple[str, str], str] = {}
_LINKS_MAX = 4096


# Bodies the transfer manager uploads from memory (a BytesIO): (bucket, key) -> (blake3, size),
# hashed as the upload starts (its parts go out on pool threads, in any order).
_held: dict[tuple[str, str], tuple[str, int]] = {}


def _link(bucket: str, key: str, fileobj, upload: bool = False) -> None:
    for table in (_links, _held):
        if len(table) >= _LINKS_MAX:
            table.pop(next(iter(table)))
    if upload and isinstance(fileobj, io.BytesIO):
        got = _body_digest(fileobj, fileobj.tell())
        if got is not None:
            _held[(bucket, key)] = got
        return
    path = fileobj if isinstance(fileobj, str) else getattr(fileobj, "name", None)
    if isinstance(path, str):
        _links[(bucket, key)] = os.path.abspath(path)


class _Upload:
    """A multipart upload, hashed across its parts as long as they come in order."""

    __slots__ = ("uri", "hasher", "next", "why", "size")

    def __init__(self, uri: str):
        import blake3

        self.uri, self.hasher, self.next, self.why = uri, blake3.blake3(), 1, None
        self.size = 0

    def add(self, body, start: int | None) -> bool:
        """The next part's body, if it is in memory."""
        data = _in_memory(body, start)
        if data is None:
            return False
        self.hasher.update(data)
        self.size += len(data)
        self.next += 1
        return True


_uploads: dict[str, _Upload] = {}


class _HashingStream:
    """The raw stream under a GetObject's StreamingBody: hashes the body as it arrives, and
    writes the digest record once the whole object has come through.

    Small reads are served from blocks read ahead: `iter_lines` reads 1 KiB at a time, and
    hashing per 1 KiB read ran blake3 at a fifth of its speed (a Python call each), where a
    block read once costs less than the small reads it replaces.  The task gets the same
    bytes in the same sizes; a small read waits for a block (or the end of the body)
    rather than for the few bytes it asked for."""

    AHEAD = 256 << 10
    SMALL = 64 << 10  # reads smaller than this are served from blocks read ahead

    def __init__(self, raw, uri: str, fields: dict, length: int):
        import blake3

        self._raw, self._uri, self._fields, self._length = raw, uri, fields, length
        self._hasher = blake3.blake3()
        self._seen = 0  # bytes hashed; -1 once the digest is out
        self._buf, self._off = b"", 0  # read ahead, from _off on not handed out yet

    def _hash(self, data) -> None:
        if self._seen < 0:
            return
        self._hasher.update(data)
        self._seen += len(data)
        if self._seen == self._length:
            self._seen = -1
            _emit(OBJ_DIGEST, self._uri, {**self._fields,
                                          "digest": self._hasher.hexdigest()}, self._length)

    def read(self, amt=None, **kwargs):
        buf, off = self._buf, self._off
        have = len(buf) - off
        if amt is not None and 0 <= amt <= have:
            self._off = off + amt
            return buf[off:off + amt]
        if amt is None or amt < 0:
            data = self._raw.read(**kwargs)
        elif amt < self.SMALL and not have:  # a block, to hand out in small reads
            data = self._raw.read(self.AHEAD, **kwargs)
        else:  # as asked: cutting large reads out of blocks would only copy them
            data = self._raw.read(amt - have, **kwargs)
        if data:
            self._hash(data)
        if have:
            data = buf[off:] + data
        if amt is not None and 0 <= amt < len(data):
            self._buf, self._off = data, amt
            return data[:amt]
        self._buf, self._off = b"", 0
        return data

    def readinto(self, b):
        data = self.read(len(b))
        n = len(data)
        memoryview(b)[:n] = data
        return n

    def readlines(self, *args):
        return io.BytesIO(self.read()).readlines(*args)

    def tell(self):
        return self._raw.tell() - (len(self._buf) - self._off)

    def __getattr__(self, name):
        return getattr(self._raw, name)


OBJ_READ, OBJ_WRITE, OBJ_DELETE, OBJ_DIGEST = 1, 2, 3, 4  # = tracelog.OBJ_*


def _params(params, context, **kwargs) -> None:
    """before-parameter-build: the call's own parameters (Bucket, Key, Range...), for
    after-call; the dict itself, not a copy (botocore only adds to it)."""
    context["roar_s3"] = params


def _request(params, context, model, **kwargs) -> None:
    """before-call: the request body as it will be sent (PutObject, UploadPart)."""
    if model.name in _BODY_OPS and "roar_s3" in context:
        body = params.get("body")
        try:
            start = body.tell() if isinstance(body, io.BytesIO) else None
        except ValueError:
            start = None
        context["roar_body"] = body, start


_BODY_OPS = frozenset({"PutObject", "UploadPart"})


def _copy_source(src) -> tuple[str | None, str | None]:
    """(s3:// URI, VersionId) of a CopySource parameter (a dict or "bucket/key?versionId=")."""
    if isinstance(src, dict):
        if src.get("Bucket") and src.get("Key"):
            return _uri(src["Bucket"], src["Key"]), src.get("VersionId")
        return None, None
    if not isinstance(src, str):
        return None, None
    from urllib.parse import unquote

    path, _, query = src.lstrip("/").partition("?")
    bucket, _, key = path.partition("/")
    vid = query.partition("versionId=")[2].partition("&")[0] or None
    return (_uri(bucket, unquote(key)) if bucket and key else None), vid


def _done(http_response, parsed, model, context, **kwargs) -> None:
    """after-call: a successful call's objects, as records."""
    p = context.get("roar_s3")
    if p is None or http_response is None or http_response.status_code >= 300:
        return
    op, bucket, key = model.name, p.get("Bucket"), p.get("Key")
    uri = _uri(bucket, key) if bucket and key else None
    if op == "GetObject" and uri:
        vid, etag = _version(parsed)
        fields = {"vid": vid, "etag": etag, "file": _links.get((bucket, key))}
        size = parsed.get("ContentLength")
        body = parsed.get("Body")
        if p.get("Range") or p.get("PartNumber") or parsed.get("ContentRange"):
            fields["ranged"] = "1"
        elif size is not None and hasattr(body, "_raw_stream"):
            body._raw_stream = _HashingStream(body._raw_stream, uri, fields, size)
        else:
            fields["opaque"] = "1"
        _emit(OBJ_READ, uri, fields, None if fields.get("ranged") else size)
        if size == 0 and isinstance(getattr(body, "_raw_stream", None), _HashingStream):
            body._raw_stream._hash(b"")  # nothing to read: its digest, after its read
    elif op == "PutObject" and uri:
        vid, etag = _version(parsed)
        fields = {"vid": vid, "etag": etag, "file": _links.get((bucket, key))}
        body, start = context.get("roar_body") or (None, None)
        got = _body_digest(body, start) or _held.pop((bucket, key), None)
        size = None
        if got is not None:
            fields["digest"], size = got
        elif fields["file"] is None:
            fields["file"] = _body_file(body)
        _emit(OBJ_WRITE, uri, fields, size)
    elif op == "CreateMultipartUpload" and uri and parsed.get("UploadId"):
        _uploads[parsed["UploadId"]] = _Upload(uri)
    elif op == "UploadPart":
        up = _uploads.get(p.get("UploadId"))
        if up is not None and up.why is None:
            body, start = context.get("roar_body") or (None, None)
            if p.get("PartNumber") != up.next:
                up.why = "parts uploaded out of order"
            elif not up.add(body, start):
                up.why = "parts streamed from files"
    elif op == "UploadPartCopy":
        src, src_vid = _copy_source(p.get("CopySource"))
        if src:
            _emit(OBJ_READ, src, {"vid": parsed.get("CopySourceVersionId") or src_vid,
                                  "ranged": "1"}, None)
        up = _uploads.get(p.get("UploadId"))
        if up is not None:
            up.why = "parts copied from other objects"
    elif op == "CompleteMultipartUpload" and uri:
        up = _uploads.pop(p.get("UploadId"), None)
        vid, etag = _version(parsed)
        fields = {"vid": vid, "etag": etag, "file": _links.get((bucket, key))}
        size = None
        if up is not None and up.why is None and up.next > 1 and len(
                (p.get("MultipartUpload") or {}).get("Parts") or ()) == up.next - 1:
            fields["digest"], size = up.hasher.hexdigest(), up.size
        elif (held := _held.pop((bucket, key), None)) is not None:
            fields["digest"], size = held
        _emit(OBJ_WRITE, uri, fields, size)
    elif op == "AbortMultipartUpload":
        _uploads.pop(p.get("UploadId"), None)
    elif op == "CopyObject" and uri:
        src, src_vid = _copy_source(p.get("CopySource"))
        vid, etag = _version(parsed)
        src_vid = parsed.get("CopySourceVersionId") or src_vid
        if src:
            # A single-part source keeps its ETag in the copy: the source's version too.
            _emit(OBJ_READ, src, {"vid": src_vid, "etag": None if src_vid else etag,
                                  "copied": "1"}, None)
        _emit(OBJ_WRITE, uri, {"vid": vid, "etag": etag, "src": src,
                               "src_vid": src_vid, "src_etag": etag}, None)
    elif op == "DeleteObject" and uri:
        _emit(OBJ_DELETE, uri, {"vid": p.get("VersionId")}, None)
    elif op == "DeleteObjects" and bucket:
        for d in parsed.get("Deleted") or ():
            if d.get("Key"):
                _emit(OBJ_DELETE, _uri(bucket, d["Key"]), {"vid": d.get("VersionId")}, None)


# ---- patches, each applied once its module is imported ----------------------------------------


def _patch_botocore(handlers) -> None:
    global _shim
    from roar_core.pipeline import tracer

    shim = tracer.loaded()
    if shim is None or not shim.has_objects():
        return  # not traced after all (ROAR_SESSION_DIR without the shim), or an old shim
    _shim = shim
    handlers.BUILTIN_HANDLERS.extend([
        ("before-parameter-build.s3", _params),
        ("before-call.s3", _request),
        ("after-call.s3", _done),
    ])


class _Lent:
    """A transfer task run by a pool thread under the tag of the thread that submitted it:
    the transfer's files and objects belong to the task that asked for the transfer."""

    def __init__(self, task, tag: bytes):
        self._task, self._tag = task, tag

    def __call__(self, *args, **kwargs):
        if _shim.adopt(self._tag) != 0:  # a thread with a task of its own keeps it
            return self._task(*args, **kwargs)
        try:
            return self._task(*args, **kwargs)
        finally:
            _shim.adopt(None)

    def __getattr__(self, name):
        return getattr(self._task, name)


def _patch_executor(futures) -> None:
    submit = futures.BoundedExecutor.submit

    def submit_lent(self, task, tag=None, block=True):
        lent = _shim.thread_tag() if _shim is not None else None
        return submit(self, _Lent(task, lent) if lent else task, tag, block)

    futures.BoundedExecutor.submit = submit_lent


def _patch_manager(manager) -> None:
    cls = manager.TransferManager
    upload, download = cls.upload, cls.download

    def linked_upload(self, fileobj, bucket, key, *args, **kwargs):
        _link(bucket, key, fileobj, upload=True)
        return upload(self, fileobj, bucket, key, *args, **kwargs)

    def linked_download(self, bucket, key, fileobj, *args, **kwargs):
        _link(bucket, key, fileobj)
        return download(self, bucket, key, fileobj, *args, **kwargs)

    cls.upload, cls.download = linked_upload, linked_download
