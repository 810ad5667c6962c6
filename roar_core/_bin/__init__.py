"""The native libraries built with the package (the preload shim, the batch hasher)."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def directory() -> Path:
    """Where they are, resolved once: a Snakemake job, a Ray worker and every `roar-core run`
    ask, and resolving the path took ~25 us (an lstat per component)."""
    return Path(__file__).resolve().parent
