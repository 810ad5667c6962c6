"""What roar's own processes ask of Python's cyclic garbage collector.

Recording allocates a few objects per traced operation and per file (records, states,
accesses, rows, event dicts), none of them in cycles, and keeps them until the task is
stored; every collection those allocations set off walks all of them again.  Reference
counting frees them all at once when the task is done.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def one_shot() -> None:
    """For a process that runs one command and exits (`roar-core run`, with or without
    --wait): no cyclic collection at all.  The command's records and the versions taken
    at its end stay alive until it exits, and the collections their allocations set off
    walked them again and again (a 5,000-file command: 415 -> 337 ms)."""
    gc.disable()


def freeze_heap() -> None:
    """For roar's own long-lived recorder processes, once set up: move every object alive
    now (the imported libraries, hundreds of thousands) out of the collector's reach, so the
    full collections between tasks walk only what tasks created.  No collection first: it
    would walk all of them once (40-80 ms of CPU, taken from the engine starting beside
    us) to free the little garbage importing leaves."""
    gc.freeze()


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a task is recorded (measured, in a process that
    has imported SQLAlchemy and the OpenLineage client: half the time spent reading a
    15,000-record trace went on collections).  Nested or concurrent pauses are fine: only
    the one that found GC enabled re-enables it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
