"""TFoS-compatible face: ``from tfonspark import compat`` (TFoS's ``tensorflowonspark.compat``).

TFoS programs call these helpers from ``main_fun``; they keep TFoS's meaning on TF 2.16+:

- ``export_saved_model(model, export_dir, is_chief=False)``: every worker calls it (under
  ``MultiWorkerMirroredStrategy`` saving runs collective ops); the chief writes ``export_dir``,
  the others write a throwaway local directory that is removed. The export itself is tfonspark's
  one export, :func:`tfonspark.distribute.checkpoint.export_saved_model`.
- ``disable_auto_shard(options)``: turn off ``tf.data`` auto-sharding on a ``tf.data.Options``
  (fed data is already split between the workers).
- ``is_gpu_available()``: whether TensorFlow sees a GPU in this process.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from . import _tfos_keras

__all__ = ["disable_auto_shard", "export_saved_model", "is_gpu_available"]


def export_saved_model(model: Any, export_dir: str | bytes | os.PathLike[str], is_chief: bool = False) -> None:
    """Export ``model`` as a SavedModel to ``export_dir`` on the chief; elsewhere to a throwaway dir.

    A Keras model built under a distribution strategy decides who the chief is from the strategy
    (``TF_CONFIG``), as TFoS programs expect ``is_chief`` to say anyway. A tf_keras (Keras 2)
    model is written as TFoS wrote it, ``model.save(dir, save_format="tf")``: its
    ``serving_default`` signature keeps the layer names TFoS programs map (``conv2d_input``,
    ``dense_1``). ``export_dir`` may be bytes, as ``get_timestamped_export_dir`` returns it.
    """
    from .distribute.checkpoint import export_saved_model as export
    from .distribute.strategies import keras_flavor, task_info_of

    path = os.fsdecode(export_dir)
    tf_keras = keras_flavor(model) == "tf_keras"
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is not None and not tf_keras:
        export(model, path)  # every worker saves, the strategy's chief keeps it
        return
    if strategy is not None:
        is_chief = task_info_of(strategy).is_chief
    target = path if is_chief else tempfile.mkdtemp(prefix="tfonspark-worker-model-")
    try:
        if tf_keras:
            model.save(target, save_format="tf")
        else:
            export(model, target, is_chief=True)
    finally:
        if not is_chief:
            shutil.rmtree(target, ignore_errors=True)


def disable_auto_shard(options: Any) -> None:
    """Set ``options.experimental_distribute.auto_shard_policy`` to ``OFF`` (a ``tf.data.Options``)."""
    import tensorflow as tf

    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF


def is_gpu_available() -> bool:
    """True if TensorFlow in this process sees at least one GPU."""
    import tensorflow as tf

    return len(tf.config.list_logical_devices("GPU")) > 0


_tfos_keras.face_imported()  # a TFoS program: the driver takes the nodes' Keras 2
