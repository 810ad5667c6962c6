"""Helpers for the Ray tests: what a run read and wrote, and content digests."""

from __future__ import annotations

from pathlib import Path

from roar_core.pipeline.store import Store


def io_of(store: Store, run_id: str) -> tuple[dict[str, str], dict[str, str]]:
    """(inputs, outputs) of a run: path -> digest."""
    ins, outs = {}, {}
    for a in store.accesses_of(run_id):
        if a.role == "input":
            ins[a.uri] = a.digest
        elif a.role == "output":
            outs[a.uri] = a.digest
    return ins, outs


def digest(path) -> str:
    import blake3

    return "blake3:" + blake3.blake3(Path(path).read_bytes()).hexdigest()
