"""``fit`` for tf_keras (Keras 2) models: their own ``model.fit``, which works under MWMS.

Only what ``fit`` promises on top is added here: a ``BackupAndRestore(<model_dir>/backup,
save_freq=checkpoint_every_steps)`` callback for ``model_dir`` (after the same shared-directory
check as Keras 3 models get), the shard policy on a Dataset (a ``dataset_fn`` becomes tf_keras'
``DatasetCreator``), and the 0-row guard around the model's own steps (:mod:`..replica_steps`).
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

import tensorflow as tf

from ...errors import ConfigError
from ..checkpoint import check_shared_dir
from ..replica_steps import guard_legacy_steps
from .epoch_input import FitCall, FitData, with_policy

__all__ = ["fit_tf_keras"]


def fit_tf_keras(
    model: Any,
    call: FitCall,
    *,
    strategy: tf.distribute.Strategy,
    model_dir: str | None,
    checkpoint_every: int | None,
    shard_policy: tf.data.experimental.AutoShardPolicy | None,
) -> Any:
    """tf_keras' own ``model.fit`` works under MWMS; add BackupAndRestore for model_dir.

    Returns tf_keras' ``History``."""
    legacy = _legacy_keras_module(model)
    callback_list = list(call.callbacks or [])
    if model_dir is not None:
        check_shared_dir(model_dir, strategy)
        backup = os.path.join(model_dir, "backup")
        callback_list.append(
            legacy.callbacks.BackupAndRestore(backup_dir=backup, save_freq=checkpoint_every or "epoch")
        )
    with guard_legacy_steps(model):  # no model call on a 0-row batch, as for Keras 3
        return model.fit(
            _legacy_input(legacy, call.dataset, shard_policy),
            epochs=call.epochs,
            steps_per_epoch=call.steps_per_epoch,
            validation_data=_legacy_input(legacy, call.validation_data, shard_policy),
            validation_steps=call.validation_steps,
            callbacks=callback_list,
            verbose=call.verbose,
        )


def _legacy_keras_module(model: object) -> ModuleType:
    """The top-level package (tf_keras, or keras 2) that a legacy model's classes come from."""
    for cls in type(model).__mro__:
        root = cls.__module__.split(".")[0]
        if root in ("tf_keras", "keras"):
            return sys.modules[root]
    raise ConfigError(f"Not a tf_keras model. Received: {type(model).__name__}")


def _legacy_input(
    legacy: ModuleType, data: FitData | None, policy: tf.data.experimental.AutoShardPolicy | None
) -> object:
    """Datasets get the shard policy; a dataset_fn is wrapped in tf_keras' DatasetCreator."""
    if data is None:
        return None
    if isinstance(data, tf.data.Dataset):
        return with_policy(data, policy)
    if callable(data):
        return legacy.utils.experimental.DatasetCreator(data)
    return data
