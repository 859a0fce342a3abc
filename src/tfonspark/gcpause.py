"""Holding off Python's cyclic GC through bursts of allocations that it cannot free.

A collection that runs while many new objects are alive traverses them all and promotes them,
so that full collections, which traverse everything, follow. Two such bursts are ours: a chunk
of rows alive while a feed task packs it (:mod:`tfonspark.executor.feeder`), and TensorFlow's
first import in a TF process, ~400k objects that live as long as the process. With the GC on,
that import cost ~1.2 s more CPU in every TF process, standby and spare (``import tensorflow;
tf.constant(1)`` in 8 fresh interpreters, 2 cores: median 6.3 against 5.2 s).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from types import ModuleType

from .importhook import AfterImport

__all__ = ["freeze_tensorflow_on_import", "paused"]


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


def _freeze(_module: ModuleType) -> None:
    gc.freeze()  # O(1): the module's objects move to the permanent generation


_HOOK = AfterImport(("tensorflow",), _freeze, around=paused)


def freeze_tensorflow_on_import() -> None:
    """Install (once, first in ``sys.meta_path``) the hook that runs TensorFlow's first import
    with the GC :func:`paused`, then freezes (``gc.freeze``) the objects alive once it
    succeeded, so later collections, in training too, skip them. Objects made later are
    collected as usual; an import that fails freezes nothing. No effect once TF is imported."""
    _HOOK.install()
