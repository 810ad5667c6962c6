"""Identities: run ids, UUIDv7 (time-ordered, so runs sort by start), without importing
the OpenLineage client on the CLI's fast path; this host's name."""

from __future__ import annotations

import os
import time


def new_run_id() -> str:
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | (rand >> 68 & 0xFFF) << 64
    value |= 0b10 << 62 | rand & ((1 << 62) - 1)
    h = f"{value:032x}"  # str(uuid.UUID(int=value)), without uuid's import (~1.6 ms)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def looks_like_run_id(key: str) -> bool:
    """Whether a command-line key has a run id's shape (36 characters, four dashes): worth
    looking up as a run before reading it as a path."""
    return len(key) == 36 and key.count("-") == 4


def host_name() -> str:
    """This host's name, as `socket.gethostname()` gives it on Linux (the kernel's node
    name), without importing socket (~2 ms of its enums, on every `roar-core run`).  The
    one spelling for task logs, runs, machine facets and the engines' task metadata: a
    recorder records only the task logs of its own host."""
    return os.uname().nodename
