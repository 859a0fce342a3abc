"""Loaded SavedModel signatures, cached per Spark Python worker.

Loading a SavedModel takes seconds (plus ``import tensorflow`` the first time), so each Python
worker loads a model once and keeps it for later tasks, keyed by the id the driver made from the
model's location and content (:func:`tfonspark.ml.savedmodel.model_key`). Like Spark's own
``pyspark.ml.model_cache``, this relies on ``spark.python.worker.reuse=true`` (the default); an
idle worker that Spark stops takes its cache with it. At most :attr:`ModelCache.capacity` models
are kept, least recently used dropped first.
"""

from __future__ import annotations

import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .inference import ServingPlan

__all__ = ["LoadedSignature", "ModelCache", "load_signature"]


class LoadedSignature:
    """A signature function with the loaded SavedModel object that must outlive it."""

    def __init__(self, saved_model: Any, fn: Any) -> None:
        self.saved_model = saved_model  # the signature's variables live as long as this object
        self.fn = fn

    def __call__(self, **inputs: Any) -> Any:
        return self.fn(**inputs)


class ModelCache:
    """A process-wide LRU of loaded models; ``loads`` counts loads per key (for diagnostics)."""

    capacity: int = 3
    _models: OrderedDict[str, Any] = OrderedDict()
    _lock = threading.Lock()
    loads: Counter[str] = Counter()

    @classmethod
    def get_or_load(cls, key: str, loader: Callable[[], Any]) -> Any:
        """The cached value for ``key``, loading it (once, under the lock) if missing."""
        with cls._lock:
            if key in cls._models:
                cls._models.move_to_end(key)
                return cls._models[key]
            value = loader()
            cls.loads[key] += 1
            cls._models[key] = value
            while len(cls._models) > cls.capacity:
                cls._models.popitem(last=False)
            return value

    @classmethod
    def clear(cls) -> None:
        with cls._lock:
            cls._models.clear()

    @classmethod
    def stats(cls) -> dict[str, Any]:
        """This process's id, cached keys and load counts."""
        with cls._lock:
            return {"pid": os.getpid(), "cached": list(cls._models), "loads": dict(cls.loads)}


def _load(plan: ServingPlan) -> LoadedSignature:
    """``tf.saved_model.load`` the plan's SavedModel and pick its signature."""
    import tensorflow as tf

    saved_model = tf.saved_model.load(plan.export_dir, tags=list(plan.tags) if plan.tags else None)
    return LoadedSignature(saved_model, saved_model.signatures[plan.signature_def_key])


def load_signature(plan: ServingPlan) -> LoadedSignature:
    """The plan's signature, loaded at most once per Python worker."""
    return ModelCache.get_or_load(plan.model_key, lambda: _load(plan))  # type: ignore[no-any-return]
