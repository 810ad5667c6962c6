"""The native libraries built with the package (the preload shim, the batch hasher)."""

from __future__ import annotations

import functools
import os


@functools.cache
def directory() -> str:
    """Where they are, resolved once: a Snakemake job, a Ray worker and every `roar-core run`
    ask, and resolving the path took ~25 us (an lstat per component)."""
    return os.path.dirname(os.path.realpath(__file__))
