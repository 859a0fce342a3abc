"""Multi-worker helpers, the door for the per-process strategy and ``TF_CONFIG``.

Typical ``main_fun`` on every node::

    import tfonspark.keras
    from tfonspark.distribute import strategy

    with strategy().scope():                  # strategy(): first TensorFlow call in the process
        model = make_model()                  # build *and* compile inside the scope
    history = tfonspark.keras.fit(model, dataset, epochs=3, model_dir=shared_dir)
    tfonspark.keras.export_saved_model(model, export_dir)   # every node calls; the chief writes

``SparkClusterResolver`` is TensorFlow's cluster resolver for a tfonspark cluster (a node's own:
``ctx.cluster_resolver()``), for the strategies' ``cluster_resolver=`` argument.

The Keras training API (``fit``, ``Progress``, ``DistributedTrainer``, ``export_saved_model``),
defined in :mod:`.keras_fit` and :mod:`.checkpoint`, has its one door in :mod:`tfonspark.keras`.

Names are loaded on first use (PEP 562), so ``tfonspark.distribute.tf_config`` (``TF_CONFIG``
written and read without TensorFlow) can be imported by the supervisor and on a driver; the
other submodules import TensorFlow and Keras but run no TensorFlow op at import. Submodules
import each other, never this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .checkpoint import EpochCheckpoint
    from .resolver import SparkClusterResolver
    from .strategies import check_model_strategy, strategy, task_info_of
    from .tf_config import TaskInfo, is_chief, task_info

__all__ = [
    "EpochCheckpoint",
    "SparkClusterResolver",
    "TaskInfo",
    "check_model_strategy",
    "is_chief",
    "strategy",
    "task_info",
    "task_info_of",
]

_HOMES = {
    "EpochCheckpoint": "checkpoint",
    "SparkClusterResolver": "resolver",
    "TaskInfo": "tf_config",
    "check_model_strategy": "strategies",
    "is_chief": "tf_config",
    "strategy": "strategies",
    "task_info": "tf_config",
    "task_info_of": "strategies",
}


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first access (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
