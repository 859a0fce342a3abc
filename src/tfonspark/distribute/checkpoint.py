"""Checkpoints and SavedModel export that are safe under MultiWorkerMirroredStrategy.

Multi-worker rule (from the TensorFlow MWMS guide): every worker runs the *same* save, because
reading a distributed variable for saving may be a collective op that needs all workers; only
the chief keeps what it wrote. Other workers write to a private temporary directory that is
removed right away. ``model_dir`` must be on a filesystem every worker can read (HDFS, S3, GCS,
NFS, or local disk when all workers share one host): :func:`check_shared_dir` proves it at the
start of training (a marker file per worker, a barrier, then every worker looks for all
markers), and on restart every worker restores the chief's latest checkpoint and the workers
check with a collective that they all resumed from the same position.

A checkpoint holds the model, its optimizer and a :class:`Position`: the completed epochs and
the steps of the next epoch already trained (0 for a save at an epoch's end), so training can
resume in the middle of an epoch.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from ..errors import ConfigError
from .strategies import keras_flavor, sum_across_replicas, task_info_of

__all__ = ["CHECKPOINT_SUBDIR", "EpochCheckpoint", "Position", "check_shared_dir", "export_saved_model"]

CHECKPOINT_SUBDIR = "checkpoints"
"""Checkpoints live in ``<model_dir>/checkpoints``, named ``ckpt-<n>`` (n counts the saves)."""

_log = logging.getLogger(__name__)

Reduce = Callable[[tf.distribute.Strategy, Sequence[float]], list[float]]
"""``sum_across_replicas``'s signature: the collective :func:`check_shared_dir` runs (a seam)."""


class Position(NamedTuple):
    """Where a checkpoint was taken: ``epoch`` epochs completed, ``step`` steps of the next done."""

    epoch: int
    step: int


class EpochCheckpoint:
    """Model + optimizer + :class:`Position`, saved by a ``tf.train.CheckpointManager``.

    Saved at every epoch end and, with ``checkpoint_every_steps``, within epochs; the manager
    keeps the latest ``max_to_keep`` and deletes older ones.
    """

    def __init__(
        self,
        model: Any,
        model_dir: str | os.PathLike[str],
        *,
        strategy: tf.distribute.Strategy,
        max_to_keep: int = 3,
    ) -> None:
        if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise ConfigError(f"max_to_keep must be an integer >= 1. Received: max_to_keep={max_to_keep!r}")
        self._strategy = strategy
        self._task = task_info_of(strategy)
        self.directory = os.path.join(os.fspath(model_dir), CHECKPOINT_SUBDIR)
        self._epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="completed_epochs")
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step_in_epoch")
        self._checkpoint = tf.train.Checkpoint(
            model=model, optimizer=model.optimizer, completed_epochs=self._epoch, step_in_epoch=self._step
        )
        self._checkpoint.save_counter  # noqa: B018  created now so that restore fills it in
        self._manager: tf.train.CheckpointManager | None = None
        if self._task.is_chief:
            self._manager = tf.train.CheckpointManager(self._checkpoint, self.directory, max_to_keep=max_to_keep)

    def restore(self) -> Position:
        """Load the latest checkpoint if any; return its position (``(0, 0)`` without one).

        A collective: all workers must call it. Raises ConfigError when the checkpoint does not
        fit the model, or when workers found different checkpoints (``model_dir`` not shared).
        """
        path = tf.train.latest_checkpoint(self.directory)
        position = Position(0, 0)
        if path:
            try:
                self._checkpoint.restore(path).assert_existing_objects_matched()
            except (AssertionError, ValueError) as err:
                raise ConfigError(
                    f"The checkpoint {path} does not match the model (different layers or "
                    f"optimizer); use a new model_dir. Details: {err}"
                ) from err
            position = Position(int(self._epoch.numpy()), int(self._step.numpy()))
            _log.info("restored %s: %d epoch(s) and %d step(s) of the next already done", path, *position)
        self._check_workers_agree(position)
        return position

    def save(self, completed_epochs: int, step: int = 0) -> str | None:
        """Save the model at ``(completed_epochs, step)``; a collective: all workers call it.

        Returns the chief's checkpoint path, None on other workers (they write to a scratch
        directory that is removed at once).
        """
        self._epoch.assign(completed_epochs)
        self._step.assign(step)
        if self._manager is not None:
            return str(self._manager.save())
        scratch = tempfile.mkdtemp(prefix=f"tfonspark-ckpt-{self._task.task_type}{self._task.task_id}-")
        try:
            tf.train.CheckpointManager(self._checkpoint, scratch, max_to_keep=1).save()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None

    def _check_workers_agree(self, position: Position) -> None:
        """All replicas restored the same position iff (sum p)^2 == n * sum p^2 for each part."""
        epoch, step = (float(v) for v in position)
        total_e, squares_e, total_s, squares_s, count = sum_across_replicas(
            self._strategy, [epoch, epoch**2, step, step**2, 1.0]
        )
        if total_e * total_e != count * squares_e or total_s * total_s != count * squares_s:
            raise ConfigError(
                "Workers restored different checkpoints from model_dir; it must be on a filesystem "
                f"that every worker can read (HDFS, S3, GCS, NFS). Received: model_dir checkpoints="
                f"{self.directory!r}, this worker restored epoch {position.epoch} step {position.step}, "
                f"mean over workers epoch {total_e / count:g} step {total_s / count:g}"
            )


def check_shared_dir(
    model_dir: str | os.PathLike[str], strategy: tf.distribute.Strategy, *, reduce: Reduce = sum_across_replicas
) -> None:
    """Raise ConfigError unless every worker of ``strategy`` sees the same ``model_dir``.

    Each worker writes ``.tfonspark-shared-<token>-<worker>`` (the token is drawn by the chief
    and agreed by a collective, so markers of an earlier run never count), waits for the others
    (a second collective), looks for every worker's marker and shares what it missed (a third),
    then removes its marker. Every worker raises the same error, so none is left waiting in a
    collective. A collective: all workers must call it; one worker returns at once.
    """
    task = task_info_of(strategy)
    workers = task.training_tasks
    name = f"{task.task_type}:{task.task_id}"
    if len(workers) <= 1 or name not in workers:  # alone, or not a training task (evaluator)
        return
    me = workers.index(name)
    share = 1.0 / len(strategy.extended.worker_devices)  # each local replica adds its values
    directory = os.fspath(model_dir)
    token = round(reduce(strategy, [secrets.randbits(40) * share if me == 0 else 0.0])[0])
    written = _write_marker(directory, token, me, f"{workers[me]} {_address(task.cluster, workers[me])}")
    try:
        reduce(strategy, [share])  # barrier: every marker is written
        n = len(workers)
        missing = [0.0] * (n * n)
        for other in range(n):
            if not _exists(_marker(directory, token, other)):
                missing[me * n + other] = share
        seen = reduce(strategy, missing)
    finally:
        if written is None:
            _remove(_marker(directory, token, me))
    blind = {workers[w]: [workers[o] for o in range(n) if seen[w * n + o] > 0.5] for w in range(n)}
    blind = {name: others for name, others in blind.items() if others}
    if blind:
        cause = f" This worker could not write its marker: {written}" if written is not None else ""
        raise ConfigError(_unshared_message(directory, task.cluster, blind) + cause)


def _write_marker(directory: str, token: int, worker: int, text: str) -> str | None:
    """Write this worker's marker; the error's text if that failed (reported after the barrier)."""
    try:
        tf.io.gfile.makedirs(directory)
        with tf.io.gfile.GFile(_marker(directory, token, worker), "w") as out:
            out.write(text + "\n")
    except (OSError, tf.errors.OpError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def _exists(path: str) -> bool:
    """Whether ``path`` exists; a filesystem error counts as not seen."""
    try:
        return bool(tf.io.gfile.exists(path))
    except (OSError, tf.errors.OpError):
        return False


def _remove(path: str) -> None:
    """Remove a marker; a failure is logged, not raised (the check's answer stands)."""
    try:
        tf.io.gfile.remove(path)
    except (OSError, tf.errors.OpError) as err:
        _log.warning("could not remove the marker %s: %s", path, err)


def _address(cluster: Any, name: str) -> str:
    """The ``host:port`` of task ``role:index`` in the cluster spec."""
    role, index = name.split(":")
    return str(cluster[role][int(index)])


def _marker(directory: str, token: int, worker: int) -> str:
    """The marker file of ``worker`` for the check with ``token``."""
    return os.path.join(directory, f".tfonspark-shared-{token:x}-{worker}")


def _unshared_message(directory: str, cluster: Any, blind: dict[str, list[str]]) -> str:
    """The ConfigError text: which worker misses whose markers, and the fix."""
    who = "; ".join(
        f"{name} ({_address(cluster, name)}) cannot see the marker files of {', '.join(others)}"
        for name, others in blind.items()
    )
    return (
        f"model_dir {directory!r} is not shared by all workers: {who}. Each worker would write and "
        "restore its own checkpoints and the workers would silently diverge. Put model_dir on a "
        "filesystem every worker reads and writes (HDFS, S3, GCS, NFS), e.g. "
        "model_dir='hdfs:///user/me/model', or leave it out to train without checkpoints."
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

    The one export of tfonspark: ``tfonspark.keras.export_saved_model`` (its door),
    ``ctx.export_saved_model`` and TFoS's ``TFNode.export_saved_model`` all call it. Who writes:

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
