"""Holding off Python's cyclic GC through bursts of allocations that it cannot free.

A collection that runs while many new objects are alive traverses them all and promotes them,
so that full collections, which traverse everything, follow. Two such bursts are ours: a chunk
of rows alive while a feed task packs it (:mod:`tfonspark.executor.feeder`), and TensorFlow's
first import in a TF process (:mod:`tfonspark.tfimport`).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["paused"]


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside; the GC's previous state is restored on the way out."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
