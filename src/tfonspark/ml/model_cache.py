"""A process-wide LRU of loaded models, keyed by an id the driver made.

Loading a model takes seconds, so an executor's Python worker keeps what it loaded for later
tasks. The caller makes the key on the driver (a UUID, or a string naming the model's location
and content) and passes the loader; this module knows nothing of what it caches. Like Spark's
``pyspark.ml.model_cache.ModelCache``, this relies on ``spark.python.worker.reuse=true`` (the
default): an idle worker that Spark stops takes its cache with it, and large models may need
more ``spark.executor.memoryOverhead``. At most :attr:`ModelCache.capacity` values are kept,
least recently used dropped first.

Thread-safe: a value is loaded at most once per key even when several threads ask for it at
the same time, and loading one key does not hold up lookups or loads of others.
"""

from __future__ import annotations

import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

__all__ = ["ModelCache"]

T = TypeVar("T")


class ModelCache:
    """Class-level (process-wide) cache; ``loads`` counts loads per key, for diagnostics."""

    capacity: int = 3
    loads: Counter[Hashable] = Counter()
    _values: OrderedDict[Hashable, Any] = OrderedDict()
    _loading: dict[Hashable, threading.Lock] = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, key: Hashable) -> Any | None:
        """The value cached under ``key`` (now the most recently used), or None."""
        with cls._lock:
            if key not in cls._values:
                return None
            cls._values.move_to_end(key)
            return cls._values[key]

    @classmethod
    def add(cls, key: Hashable, value: Any) -> None:
        """Cache ``value`` under ``key``, dropping the least recently used beyond ``capacity``."""
        with cls._lock:
            cls._store(key, value)

    @classmethod
    def get_or_load(cls, key: Hashable, loader: Callable[[], T]) -> T:
        """The value for ``key``, calling ``loader()`` if it is not cached (once, whatever the threads)."""
        with cls._lock:
            if key in cls._values:
                cls._values.move_to_end(key)
                return cast(T, cls._values[key])
            gate = cls._loading.setdefault(key, threading.Lock())
        with gate:  # one loader per key; the others wait for it, then find the value cached
            with cls._lock:
                if key in cls._values:
                    return cast(T, cls._values[key])
            try:
                value = loader()
                with cls._lock:
                    cls.loads[key] += 1
                    cls._store(key, value)
            finally:
                with cls._lock:
                    if cls._loading.get(key) is gate:
                        del cls._loading[key]
            return value

    @classmethod
    def _store(cls, key: Hashable, value: Any) -> None:
        """Insert as most recently used and evict beyond ``capacity`` (the caller holds the lock)."""
        cls._values[key] = value
        cls._values.move_to_end(key)
        while len(cls._values) > cls.capacity:
            cls._values.popitem(last=False)

    @classmethod
    def clear(cls) -> None:
        """Drop every cached value (load counts are kept)."""
        with cls._lock:
            cls._values.clear()

    @classmethod
    def stats(cls) -> dict[str, Any]:
        """This process's id, the cached keys and the load counts (keys as text, JSON-ready)."""
        with cls._lock:
            return {
                "pid": os.getpid(),
                "cached": [str(k) for k in cls._values],
                "loads": {str(k): n for k, n in cls.loads.items()},
            }
