"""Multi-worker training helpers: the per-process strategy, Keras 3 ``fit``, checkpoints, export.

Typical ``main_fun`` on every node::

    from tfonspark import distribute

    strategy = distribute.strategy()          # first TensorFlow call in the process
    with strategy.scope():
        model = make_model()                  # build *and* compile inside the scope
    history = distribute.fit(model, dataset, epochs=3, model_dir=shared_dir)
    distribute.export_saved_model(model, export_dir)   # every node calls; the chief writes

Names are loaded on first use (PEP 562), so ``tfonspark.distribute.tf_config`` (``TF_CONFIG``
written and read without TensorFlow) can be imported by the supervisor and on a driver; the
other submodules import TensorFlow and Keras but run no TensorFlow op at import. Submodules
import each other, never this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .checkpoint import EpochCheckpoint, export_saved_model
    from .keras_fit import DatasetFn, DistributedTrainer, Progress, fit
    from .strategies import check_model_strategy, strategy, task_info_of
    from .tf_config import TaskInfo, is_chief, task_info

__all__ = [
    "DatasetFn",
    "DistributedTrainer",
    "EpochCheckpoint",
    "Progress",
    "TaskInfo",
    "check_model_strategy",
    "export_saved_model",
    "fit",
    "is_chief",
    "strategy",
    "task_info",
    "task_info_of",
]

_HOMES = {
    "DatasetFn": "keras_fit",
    "DistributedTrainer": "keras_fit",
    "EpochCheckpoint": "checkpoint",
    "Progress": "keras_fit",
    "TaskInfo": "tf_config",
    "check_model_strategy": "strategies",
    "export_saved_model": "checkpoint",
    "fit": "keras_fit",
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
