"""Epoch checkpoints and SavedModel export that are safe under MultiWorkerMirroredStrategy.

Multi-worker rule (from the TensorFlow MWMS guide): every worker runs the *same* save, because
reading a distributed variable for saving may be a collective op that needs all workers; only
the chief keeps what it wrote. Other workers write to a private temporary directory that is
removed right away. ``model_dir`` must be on a filesystem every worker can read (HDFS, S3, NFS, or
local disk when all workers share one host): on restart every worker restores the chief's latest
checkpoint, and the workers check with a collective that they all resumed from the same epoch.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any

import tensorflow as tf

from ..errors import ConfigError
from .strategies import keras_flavor, sum_across_replicas, task_info_of

__all__ = ["CHECKPOINT_SUBDIR", "EpochCheckpoint", "export_saved_model"]

CHECKPOINT_SUBDIR = "checkpoints"
"""Checkpoints live in ``<model_dir>/checkpoints``, named ``ckpt-<completed epochs>``."""

_log = logging.getLogger(__name__)


class EpochCheckpoint:
    """Model + optimizer + completed-epoch counter, saved by a ``tf.train.CheckpointManager``."""

    def __init__(
        self,
        model: Any,
        model_dir: str | os.PathLike[str],
        *,
        strategy: tf.distribute.Strategy,
        max_to_keep: int = 3,
    ) -> None:
        if max_to_keep < 1:
            raise ConfigError(f"max_to_keep must be >= 1. Received: max_to_keep={max_to_keep!r}")
        self._strategy = strategy
        self._task = task_info_of(strategy)
        self.directory = os.path.join(os.fspath(model_dir), CHECKPOINT_SUBDIR)
        self._epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="completed_epochs")
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, completed_epochs=self._epoch)
        self._checkpoint.save_counter  # noqa: B018  created now so that restore fills it in
        self._manager: tf.train.CheckpointManager | None = None
        if self._task.is_chief:
            self._manager = tf.train.CheckpointManager(self._checkpoint, self.directory, max_to_keep=max_to_keep)

    def restore(self) -> int:
        """Load the latest checkpoint if any; return the number of completed epochs.

        A collective: all workers must call it. Raises ConfigError when the checkpoint does not
        fit the model, or when workers found different checkpoints (``model_dir`` not shared).
        """
        path = tf.train.latest_checkpoint(self.directory)
        epochs = 0
        if path:
            try:
                self._checkpoint.restore(path).assert_existing_objects_matched()
            except (AssertionError, ValueError) as err:
                raise ConfigError(
                    f"The checkpoint {path} does not match the model (different layers or "
                    f"optimizer); use a new model_dir. Details: {err}"
                ) from err
            epochs = int(self._epoch.numpy())
            _log.info("restored %s: %d epoch(s) already completed", path, epochs)
        self._check_workers_agree(epochs)
        return epochs

    def save(self, completed_epochs: int) -> str | None:
        """Save after an epoch (a collective: all workers call it); the chief's path, else None."""
        self._epoch.assign(completed_epochs)
        if self._manager is not None:
            return str(self._manager.save(checkpoint_number=completed_epochs))
        scratch = tempfile.mkdtemp(prefix=f"tfonspark-ckpt-{self._task.task_type}{self._task.task_id}-")
        try:
            scratch_manager = tf.train.CheckpointManager(self._checkpoint, scratch, max_to_keep=1)
            scratch_manager.save(checkpoint_number=completed_epochs)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None

    def _check_workers_agree(self, epochs: int) -> None:
        """All replicas restored the same epoch iff (sum e)^2 == n * sum e^2 (Cauchy-Schwarz)."""
        total, squares, count = sum_across_replicas(self._strategy, [float(epochs), float(epochs) ** 2, 1.0])
        if total * total != count * squares:
            raise ConfigError(
                "Workers restored different checkpoints from model_dir; it must be on a filesystem "
                f"that every worker can read (HDFS, S3, NFS). Received: model_dir checkpoints="
                f"{self.directory!r}, this worker restored epoch {epochs}, "
                f"mean over workers {total / count:g}"
            )


def export_saved_model(
    model: Any,
    export_dir: str | os.PathLike[str],
    *,
    strategy: tf.distribute.Strategy | None = None,
    input_signature: Any = None,
    signatures: Any = None,
    is_chief: bool | None = None,
) -> str | None:
    """Export ``model`` (Keras 3, tf_keras or ``tf.Module``) as a SavedModel; return where it went.

    The one export of tfonspark: ``tfonspark.keras.export_saved_model``,
    ``tfonspark.distribute.export_saved_model``, ``ctx.export_saved_model`` and TFoS's
    ``TFNode.export_saved_model`` all call it. Who writes:

    * **every worker exports, the chief keeps it** (the multi-worker rule, as for checkpoints:
      reading a distributed variable may be a collective op) when ``is_chief`` is None, and
      always for a Keras model built under a distribution strategy without ``signatures``
      (whatever ``is_chief`` says). The chief is ``strategy``'s, else the model's, else that of
      the current strategy (``TF_CONFIG``). Non-chief workers write into a temporary directory
      that is removed;
    * otherwise **the caller decides**: only where ``is_chief`` is true (TFoS semantics).

    How: with ``signatures``, ``tf.saved_model.save(model, dir, signatures=...)``; a Keras 3
    model with ``model.export`` (a ``serve`` endpoint; ``input_signature`` optional); a
    tf_keras model with ``model.export`` (no ``input_signature``); anything else
    ``tf.saved_model.save``. Load with ``tf.saved_model.load(export_dir).serve(x)``.

    Returns ``export_dir`` where this process wrote it, else None.
    """
    if signatures is not None and input_signature is not None:
        raise ConfigError(
            "pass either signatures (tf.saved_model.save) or input_signature (model.export), not both. "
            f"Received: signatures={signatures!r}, input_signature={input_signature!r}"
        )
    built_under_strategy = signatures is None and getattr(model, "_distribute_strategy", None) is not None
    if is_chief is not None and not built_under_strategy:
        if not is_chief:
            return None
        _export(model, os.fspath(export_dir), input_signature, signatures)
        return os.fspath(export_dir)
    if strategy is None:
        strategy = getattr(model, "_distribute_strategy", None) or tf.distribute.get_strategy()
    task = task_info_of(strategy)
    target = os.fspath(export_dir)
    if not task.is_chief:
        target = tempfile.mkdtemp(prefix=f"tfonspark-export-{task.task_type}{task.task_id}-")
    try:
        _export(model, target, input_signature, signatures)
    finally:
        if not task.is_chief:
            shutil.rmtree(target, ignore_errors=True)
    if task.is_chief:
        _log.info("exported SavedModel to %s", target)
        return target
    return None


def _export(model: Any, path: str, input_signature: Any, signatures: Any = None) -> None:
    """``signatures``: tf.saved_model; Keras 3 and tf_keras >= 2.13 have ``model.export``; older
    objects use tf.saved_model."""
    export = getattr(model, "export", None)
    if signatures is not None or export is None:
        tf.saved_model.save(model, path, signatures=signatures)
    elif keras_flavor(model) == "keras3":
        export(path, format="tf_saved_model", verbose=False, input_signature=input_signature)
    elif input_signature is not None:
        raise ConfigError("input_signature is only supported for Keras 3 models")
    else:
        export(path)
