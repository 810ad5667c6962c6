"""The batch hasher built from tracer-bins/hashbatch (Rust), loaded with ctypes.

It hashes a list of small files in one call with the GIL released, one attempt per file;
`roar_core.pipeline.hashing` decides from each result whether the file stayed put and redoes the
rest itself.  It also lstats a task's files at its end (`Classifier.finish`) in one call.
Optional: where the package was built without cargo, `load()` is None and hashing stays in
Python.
"""

from __future__ import annotations

import functools
import os
import struct
from array import array
from collections.abc import Sequence

TYPE_CHECKING = False  # not typing's (see roar_core.slotted)
if TYPE_CHECKING:
    from typing import Any

LIB_NAME = "libroar_hashbatch.so"
ABI = 3
# struct StatOut: (errno, mode, dev, ino, size, mtime_ns, ctime_ns).
_STAT = struct.Struct("<iIQQqqq")
# struct HashOut in tracer-bins/hashbatch/src/lib.rs, unpacked as (status, errno, nbytes,
# read_at_ns, dev, ino, size, mtime_ns, ctime_ns, hex digest).
_OUT = struct.Struct("<iiQqQQqqq64s")


def library_path() -> str:
    from roar_core import _bin

    return os.path.join(_bin.directory(), LIB_NAME)


class BatchHasher:
    def __init__(self, lib: Any) -> None:
        import ctypes

        self._ctypes = ctypes
        self._fn = lib.roar_hash_files
        self._fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.c_void_p]
        self._fn.restype = None
        self._exited = lib.roar_hash_files_exited
        self._exited.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int64,
                                 ctypes.c_void_p]
        self._exited.restype = None
        self._lstat = lib.roar_lstat_files
        self._lstat.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p]
        self._lstat.restype = None

    def hash(self, paths: Sequence[bytes], sizes: Sequence[int]) -> list[tuple[Any, ...]]:
        """One HashOut tuple per path (fields: see _OUT above).  Paths are bytes
        without NUL; `sizes` are their sizes as last stat'ed (one read then suffices)."""
        n = len(paths)
        if not n:
            return []
        ctypes = self._ctypes
        joined = b"\0".join(paths) + b"\0"
        sz = array("q", sizes)
        out = ctypes.create_string_buffer(_OUT.size * n)
        # ctypes drops the GIL for the call: another thread can hash another batch.
        self._fn(joined, sz.buffer_info()[0], n, out)
        return list(_OUT.iter_unpack(out.raw))

    def hash_exited(self, paths: Sequence[bytes], max_size: int) -> list[tuple[Any, ...]]:
        """As `hash`, for paths not stat'ed: each is stat'ed before it is opened (status 5:
        it changed during the read; 6: more than `max_size` bytes, not read)."""
        n = len(paths)
        if not n:
            return []
        out = self._ctypes.create_string_buffer(_OUT.size * n)
        self._exited(b"\0".join(paths) + b"\0", n, max_size, out)
        return list(_OUT.iter_unpack(out.raw))

    def lstat(self, paths: Sequence[bytes]) -> list[tuple[int, ...]]:
        """One (errno, mode, dev, ino, size, mtime_ns, ctime_ns) per path, as lstat(2)
        gave it (errno 0: it succeeded), in one call with the GIL released."""
        n = len(paths)
        if not n:
            return []
        out = self._ctypes.create_string_buffer(_STAT.size * n)
        self._lstat(b"\0".join(paths) + b"\0", n, out)
        return list(_STAT.iter_unpack(out.raw))


@functools.lru_cache(maxsize=1)
def load() -> BatchHasher | None:
    """The batch hasher, or None where it was not built or is not this version's."""
    import ctypes

    try:
        lib = ctypes.CDLL(library_path())
        if lib.roar_hashbatch_abi() != ABI:
            return None
    except (OSError, AttributeError):
        return None
    return BatchHasher(lib)
