"""``fit`` for compiled Keras 3 models under ``MultiWorkerMirroredStrategy``.

Why this exists: on TF 2.21 / Keras 3.15, ``model.fit`` under MWMS fails inside Keras
(``_maybe_symbolic_build`` converts ``PerReplica`` batches, and ``reduce_per_replica`` reduces
scalar metrics along axis 0). This module keeps everything the model defines (its own
``train_step``/``test_step``, hence its optimizer, compiled loss and metrics) and replaces only the
loop around it:

* each step runs ``strategy.run(model.train_step, ...)`` in a ``tf.function`` (guarded against
  0-row batches, :mod:`.replica_steps`); Keras already
  scales the loss by the replica count and the optimizer all-reduces the gradients, so the
  variables stay identical on all workers. The step's updates wait for its batch, so the call
  that finds the data exhausted changes nothing (``optimizer.iterations`` counts trained
  batches, as under Keras' own ``fit``);
* batch-level logs are this worker's running metric values (no extra collective per step);
  epoch-level logs are read from the metrics' sync-on-read variables in cross-replica context,
  which sums the metric state over all workers: they are global and identical on every node, so
  callbacks such as ``EarlyStopping`` take the same decision everywhere;
* ``model.stop_training`` is honoured at epoch boundaries, agreed by all workers (any worker
  asking to stop stops all), because a worker leaving mid-epoch would hang the others.

Contract (the model must live in the strategy's scope):

1. Create the strategy first: ``strategy = tfonspark.distribute.strategy()`` (MWMS from
   ``TF_CONFIG``; a one-worker MWMS without it). It must run before any other TensorFlow op.
2. Either build *and compile* the model inside ``with strategy.scope():`` and pass it, or pass a
   zero-argument ``build_fn`` returning a compiled model; ``fit`` then calls it in the scope (and
   creates the strategy itself if none is given). A model created or compiled outside the scope
   is refused with :class:`~tfonspark.errors.ConfigError`.

Input: a ``tf.data.Dataset`` of ``(x, y)`` or ``(x, y, sample_weight)`` batches whose batch size
is the *global* batch size (it is split across the replicas), or a ``dataset_fn(input_context)``
returning this worker's dataset batched with
``input_context.get_per_replica_batch_size(global_batch_size)``; it must shard itself, e.g.
``ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)``.

``shard_policy`` (a ``tf.data.experimental.AutoShardPolicy`` or its name) applies to a Dataset:

* ``"auto"`` (TensorFlow's default): ``file`` when the dataset reads files, else ``data``;
* ``"file"``: each worker reads its own subset of the input files (fast; needs at least as many
  files as workers);
* ``"data"``: every worker reads all input and keeps its part of every global batch (correct for
  any source, but each worker pays for reading everything);
* ``"off"``: no sharding, each worker consumes its whole local input. Right when each node's
  input already is its own shard (a tfonspark data feed, per-node files); wrong (every example
  seen once per worker) when all workers read the same data.

Every worker must run the same number of steps: without ``steps_per_epoch`` an epoch ends when
all workers ran out of data. Workers that ran out earlier get 0-row batches meanwhile: their
replicas skip the model (oneDNN's Conv2D rejects 0 rows, BatchNormalization would turn them into
NaNs) and join each step's all-reduce with zero gradients and no metric update, so the result
equals training on the real rows only (:mod:`.replica_steps`);
an infinite dataset needs ``steps_per_epoch``. With ``steps_per_epoch`` the iterator carries over
between epochs, as in Keras; if it runs out the epoch ends early and the next one restarts it.

With ``model_dir``, ``<model_dir>/checkpoints`` receives a checkpoint (model, optimizer, epoch and
step within the epoch) every ``checkpoint_every_steps`` training steps of an epoch (default
:data:`DEFAULT_CHECKPOINT_EVERY_STEPS`, 100: they cost the MNIST demo CNN 0.3-0.5% per step,
``benchmarks/checkpoint.py``) and at every epoch end; the latest ``max_to_keep`` are kept.
A later ``fit`` with the same ``model_dir`` (e.g. in the TF process the driver starts again after
a node failure, ``ctx.attempt > 0``) restores the latest one and goes on from there, as Keras'
``BackupAndRestore`` does: ``epochs`` is the total to reach, not a number to add, and a failure
loses at most ``checkpoint_every_steps`` steps. The interrupted epoch's first steps are not
trained again: their batches are read from a fresh iterator and dropped, so the input must give
the same batches in the same order again (no unseeded shuffle) for the resumed epoch to see
exactly the rest of its data; with ``steps_per_epoch`` the position reached by earlier epochs
is not restored either. The resumed epoch's logs cover only the steps run after the resume.
Checkpoints are collectives under MWMS: every worker saves at the same steps, the chief keeps
the files. Before anything else, ``fit`` checks that every worker sees the same ``model_dir``
(each writes a marker file, then looks for everyone's): a directory on each node's local disk
raises ConfigError instead of letting the workers diverge silently. tf_keras models get
``BackupAndRestore(<model_dir>/backup, save_freq=checkpoint_every_steps)``.

Keras callbacks run on every worker. Callbacks that write files (``ModelCheckpoint``,
``TensorBoard``, ``CSVLogger``) need a different path per worker, or should only be added on the
chief (see ``DistributedTrainer.is_chief``); prefer ``model_dir`` for checkpoints.

``jit_compile`` on the model is not used (the step runs as a plain ``tf.function``).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import keras
import numpy as np
import tensorflow as tf

from ..errors import ConfigError, InputError
from .checkpoint import EpochCheckpoint, Position, check_shared_dir, export_saved_model
from .replica_steps import batch_rows, guard_legacy_steps, guarded_test_step, guarded_train_step
from .strategies import check_model_strategy, keras_flavor, sum_across_replicas, task_info_of
from .strategies import strategy as process_strategy

if TYPE_CHECKING:
    from typing import Unpack

__all__ = ["DEFAULT_CHECKPOINT_EVERY_STEPS", "DatasetFn", "DistributedTrainer", "FitOptions", "Progress", "fit"]

_log = logging.getLogger(__name__)

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]
"""``dataset_fn(input_context) -> tf.data.Dataset`` for ``distribute_datasets_from_function``."""

_SHARD_POLICIES = {
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
    "hint": tf.data.experimental.AutoShardPolicy.HINT,
}
_OUT_OF_DATA = (tf.errors.OutOfRangeError, StopIteration)

DEFAULT_CHECKPOINT_EVERY_STEPS = 100
"""Steps between checkpoints within an epoch when ``model_dir`` is given without an interval."""


@dataclass(frozen=True)
class Progress:
    """A progress report: every ``log_every_steps`` steps and once at the end of each epoch.

    ``epoch`` is 0-based (as in Keras callbacks) and ``step`` counts the steps done in it
    (including those trained before a resume from a mid-epoch checkpoint).
    ``rows`` counts the examples this worker trained on in this epoch; ``global_rows`` is the sum
    over all workers and is only set on the epoch-end report, whose ``logs`` are the global epoch
    logs (including ``val_*``). Step reports carry this worker's running values.
    """

    epoch: int
    step: int
    steps: int | None
    logs: Mapping[str, float]
    rows: int
    seconds: float
    epoch_end: bool = False
    global_rows: int | None = None
    worker: int = 0

    @property
    def loss(self) -> float | None:
        """The running (or, at epoch end, the epoch's) loss, if the model reports one."""
        return self.logs.get("loss")

    @property
    def rows_per_sec(self) -> float:
        """Examples per second: all workers' at epoch end, this worker's otherwise."""
        rows = self.global_rows if self.global_rows is not None else self.rows
        return rows / self.seconds if self.seconds > 0 else 0.0


ProgressFn = Callable[[Progress], None]


class DistributedTrainer:
    """Holds a model, its strategy and its checkpoint directory; trains with :meth:`fit`.

    ``model`` is a compiled Keras 3 model created under ``strategy.scope()``, or a
    zero-argument callable that builds and compiles one (called here inside the scope). A
    compiled tf_keras model (``TF_USE_LEGACY_KERAS=1``) is trained by its own ``model.fit``, with the same 0-row guard.
    With ``model_dir``, a checkpoint is saved every ``checkpoint_every_steps`` steps (default
    :data:`DEFAULT_CHECKPOINT_EVERY_STEPS`) and at every epoch end, and ``fit`` resumes from it.
    """

    def __init__(
        self,
        model: Any,
        *,
        strategy: tf.distribute.Strategy | None = None,
        model_dir: str | os.PathLike[str] | None = None,
        max_to_keep: int = 3,
        shard_policy: str | tf.data.experimental.AutoShardPolicy | None = None,
        on_progress: ProgressFn | None = None,
        log_every_steps: int = 100,
        checkpoint_every_steps: int | None = None,
    ) -> None:
        if log_every_steps < 0:
            raise ConfigError(f"log_every_steps must be >= 0. Received: {log_every_steps!r}")
        self._checkpoint_every = _checkpoint_interval(checkpoint_every_steps, model_dir)
        self.model, self.strategy = _model_and_strategy(model, strategy)
        self.flavor = keras_flavor(self.model)
        if self.flavor == "tf_keras" and on_progress is not None:
            raise ConfigError(
                "on_progress is not supported for tf_keras models (they train with their own "
                "model.fit); pass a tf_keras callback in `callbacks` instead."
            )
        self.model_dir = None if model_dir is None else os.fspath(model_dir)
        self._max_to_keep = max_to_keep
        self._shard_policy = _shard_policy(shard_policy)
        self._on_progress = on_progress
        self._log_every = log_every_steps
        self._checkpoint: EpochCheckpoint | None = None
        self._train_fn: Callable[[Any], Any] | None = None
        self._test_fn: Callable[[Any], Any] | None = None
        self._skip_fn: Callable[[Any], Any] | None = None

    @property
    def is_chief(self) -> bool:
        """Whether this process is the chief (it keeps checkpoints and exports)."""
        return task_info_of(self.strategy).is_chief

    def fit(
        self,
        dataset: tf.data.Dataset | DatasetFn,
        *,
        epochs: int = 1,
        steps_per_epoch: int | None = None,
        validation_data: tf.data.Dataset | DatasetFn | None = None,
        validation_steps: int | None = None,
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        verbose: str | int = "auto",
    ) -> keras.callbacks.History:
        """Train until ``epochs`` epochs are completed; return the History (same on all nodes).

        ``verbose``: 0 silent, 1 progress bar, 2 one line per epoch; ``"auto"`` is 2 on the
        chief and 0 on other workers. All workers must call ``fit`` with the same arguments.
        """
        _check_count("epochs", epochs)
        _check_count("steps_per_epoch", steps_per_epoch, optional=True)
        _check_count("validation_steps", validation_steps, optional=True)
        level = _verbosity(verbose, self.is_chief)
        if self.flavor == "tf_keras":
            return self._fit_tf_keras(
                dataset,
                epochs,
                steps_per_epoch,
                validation_data,
                validation_steps,
                callbacks,
                level,
            )
        train = _Input(self.strategy, dataset, "dataset", steps_per_epoch, self._shard_policy)
        val = None
        if validation_data is not None:
            val = _Input(
                self.strategy,
                validation_data,
                "validation_data",
                validation_steps,
                self._shard_policy,
            )
        self._build(train.local_spec)
        start = self._restore()
        history, callback_list = _callbacks(self.model, callbacks, level, epochs, train.known_steps)
        self.model.stop_training = False
        callback_list.on_train_begin()
        if start.epoch >= epochs:
            _log.info("model_dir already holds %d completed epoch(s); nothing to train", start.epoch)
        logs: dict[str, Any] = {}
        for epoch in range(start.epoch, epochs):
            done = start.step if epoch == start.epoch else 0
            logs, stop = self._fit_epoch(epoch, train, val, callback_list, done)
            if stop:
                break
        callback_list.on_train_end(logs)
        return history

    def export(self, export_dir: str | os.PathLike[str], *, input_signature: Any = None) -> str | None:
        """Export a SavedModel (all workers call; the chief keeps it). See export_saved_model."""
        return export_saved_model(self.model, export_dir, strategy=self.strategy, input_signature=input_signature)

    # -- one epoch -------------------------------------------------------------------------

    def _fit_epoch(
        self, epoch: int, train: _Input, val: _Input | None, callback_list: Any, done: int = 0
    ) -> tuple[dict[str, Any], bool]:
        """Train one epoch (its first ``done`` steps were trained before a resume), validate,
        run callbacks, checkpoint; (logs, all agree to stop)."""
        started = time.perf_counter()
        callback_list.on_epoch_begin(epoch)
        self.model.reset_metrics()
        steps, rows, last = self._train_steps(epoch, train, callback_list, started, done)
        logs = self._global_logs(last)
        if val is not None:
            logs.update({f"val_{k}": v for k, v in self._evaluate(val, callback_list).items()})
        callback_list.on_epoch_end(epoch, logs)
        if self._checkpoint is not None:
            self._checkpoint.save(epoch + 1)
        local_replicas = len(self.strategy.extended.worker_devices)
        stop_votes, global_rows = sum_across_replicas(
            self.strategy, [1.0 if self.model.stop_training else 0.0, rows / local_replicas]
        )
        self._report(
            Progress(
                epoch=epoch,
                step=steps,
                steps=train.known_steps,
                logs=dict(logs),
                rows=rows,
                seconds=time.perf_counter() - started,
                epoch_end=True,
                global_rows=int(round(global_rows)),
                worker=self._worker,
            )
        )
        return logs, stop_votes > 0

    def _train_steps(
        self, epoch: int, train: _Input, callback_list: Any, started: float, done: int = 0
    ) -> tuple[int, int, Mapping[str, Any]]:
        """Run the epoch's steps after the first ``done``, whose batches are read and dropped;
        return (steps including those, rows trained on this worker, last local logs)."""
        train_fn = self._step_fn("train")
        train.start_epoch()
        step = self._skip(train, done, epoch) if done else 0
        rows = 0
        logs: Mapping[str, Any] = {}
        while train.iterator is not None and (train.steps is None or step < train.steps):
            callback_list.on_train_batch_begin(step)
            result = _next_step(train_fn, train, step)
            if result is None:
                break
            outputs, batch_rows = result
            logs = self._local(outputs)
            rows += int(sum(self.strategy.experimental_local_results(batch_rows)))
            callback_list.on_train_batch_end(step, logs)
            step += 1
            if self._log_every and step % self._log_every == 0:
                self._report_step(epoch, step, train.known_steps, logs, rows, started)
            self._maybe_save_step(epoch, step, train.steps)
        if step == 0:
            raise InputError(f"The training dataset produced no batches in epoch {epoch}.")
        return step, rows, logs

    def _skip(self, train: _Input, count: int, epoch: int) -> int:
        """Read and drop ``count`` batches (trained before the resume); return how many there were.

        A collective under MWMS, like a training step: every worker skips the same count.
        """
        skip_fn = self._skip_fn
        if skip_fn is None:
            strategy = self.strategy

            def skip_one(iterator: Any) -> Any:
                return strategy.run(batch_rows, args=(next(iterator),))

            skip_fn = self._skip_fn = skip_one if self.model.run_eagerly else tf.function(skip_one)
        for skipped in range(count):
            try:
                skip_fn(train.iterator)
            except _OUT_OF_DATA:
                _log.warning(
                    "resuming epoch %d at step %d, but the training data ended after %d batches; "
                    "the epoch ends here (the input must give the same batches again to resume exactly)",
                    epoch + 1,
                    count,
                    skipped,
                )
                train.ran_out(skipped)
                return skipped
        _log.info("resumed epoch %d at step %d: skipped the batches trained before", epoch + 1, count)
        return count

    def _maybe_save_step(self, epoch: int, step: int, steps: int | None) -> None:
        """Checkpoint every ``checkpoint_every_steps`` steps (same decision on every worker).

        Not on an epoch's last step when ``steps_per_epoch`` says it is: the epoch-end save follows.
        """
        every = self._checkpoint_every
        if self._checkpoint is None or every is None or step % every or step == steps:
            return
        self._checkpoint.save(epoch, step)

    def _evaluate(self, val: _Input, callback_list: Any) -> dict[str, Any]:
        """Run the model's test_step over the validation data; global metric values."""
        test_fn = self._step_fn("test")
        self.model.reset_metrics()
        callback_list.on_test_begin()
        val.start_epoch()
        step = 0
        logs: Mapping[str, Any] = {}
        while val.steps is None or step < val.steps:
            callback_list.on_test_batch_begin(step)
            try:
                outputs, _ = test_fn(val.iterator)
            except _OUT_OF_DATA:
                break
            logs = self._local(outputs)
            callback_list.on_test_batch_end(step, logs)
            step += 1
        result = self._global_logs(logs)
        callback_list.on_test_end(result)
        return result

    # -- building blocks -------------------------------------------------------------------

    def _step_fn(self, kind: str) -> Callable[[Any], Any]:
        """A (cached) function running one train or test step on every replica."""
        cached = self._train_fn if kind == "train" else self._test_fn
        if cached is not None:
            return cached
        replica_step = guarded_train_step(self.model) if kind == "train" else guarded_test_step(self.model)
        strategy = self.strategy

        def one_step(iterator: Any) -> Any:
            return strategy.run(replica_step, args=(next(iterator),))

        fn: Callable[[Any], Any] = one_step
        if not self.model.run_eagerly:
            fn = tf.function(one_step, reduce_retracing=True)
        if kind == "train":
            self._train_fn = fn
        else:
            self._test_fn = fn
        return fn

    def _build(self, spec: Any) -> None:
        """Create model, compiled-loss, metric and optimizer variables in the scope.

        They must exist before the first step: variables cannot be created inside
        ``strategy.run``. Keras' own symbolic build does it from shapes alone.
        """
        batch = tf.nest.map_structure(_keras_tensor, spec)
        symbolic_build = getattr(self.model, "_symbolic_build", None)
        with self.strategy.scope():
            if symbolic_build is not None:
                symbolic_build(data_batch=batch)
            elif not self.model.optimizer.built:
                self.model.optimizer.build(self.model.trainable_variables)
        check_model_strategy(self.model, self.strategy)

    def _restore(self) -> Position:
        """Where ``model_dir``'s latest checkpoint was taken (0, 0 without one); a collective."""
        if self.model_dir is None:
            return Position(0, 0)
        check_shared_dir(self.model_dir, self.strategy)
        if self._checkpoint is None:
            self._checkpoint = EpochCheckpoint(
                self.model, self.model_dir, strategy=self.strategy, max_to_keep=self._max_to_keep
            )
        return self._checkpoint.restore()

    def _local(self, outputs: Any) -> Mapping[str, Any]:
        """This worker's first replica's values of a step's outputs."""
        local = tf.nest.map_structure(lambda v: self.strategy.experimental_local_results(v)[0], outputs)
        return local if isinstance(local, Mapping) else {"outputs": local}

    def _global_logs(self, last: Mapping[str, Any]) -> dict[str, Any]:
        """Metric results summed over all workers (cross-replica read: a collective)."""
        merged = {**last, **self.model.get_metrics_result()}
        return {key: _pythonify(value) for key, value in merged.items()}

    @property
    def _worker(self) -> int:
        return task_info_of(self.strategy).task_id

    def _report_step(
        self,
        epoch: int,
        step: int,
        steps: int | None,
        logs: Mapping[str, Any],
        rows: int,
        started: float,
    ) -> None:
        self._report(
            Progress(
                epoch=epoch,
                step=step,
                steps=steps,
                logs={k: _pythonify(v) for k, v in logs.items()},
                rows=rows,
                seconds=time.perf_counter() - started,
                worker=self._worker,
            )
        )

    def _report(self, progress: Progress) -> None:
        """Hand a report to ``on_progress``, or log it at INFO."""
        if self._on_progress is not None:
            self._on_progress(progress)
            return
        loss = progress.loss
        _log.info(
            "worker %d epoch %d step %d/%s loss=%s rows/s=%.1f%s",
            progress.worker,
            progress.epoch + 1,
            progress.step,
            progress.steps if progress.steps is not None else "?",
            f"{loss:.6g}" if isinstance(loss, float) else loss,
            progress.rows_per_sec,
            " (epoch end, all workers)" if progress.epoch_end else "",
        )

    # -- tf_keras ----------------------------------------------------------------------------

    def _fit_tf_keras(
        self,
        dataset: Any,
        epochs: int,
        steps_per_epoch: int | None,
        validation_data: Any,
        validation_steps: int | None,
        callbacks: Sequence[Any] | None,
        verbose: int,
    ) -> Any:
        """tf_keras' own ``model.fit`` works under MWMS; add BackupAndRestore for model_dir."""
        legacy = _legacy_keras_module(self.model)
        callback_list = list(callbacks or [])
        if self.model_dir is not None:
            check_shared_dir(self.model_dir, self.strategy)
            backup = os.path.join(self.model_dir, "backup")
            callback_list.append(
                legacy.callbacks.BackupAndRestore(backup_dir=backup, save_freq=self._checkpoint_every or "epoch")
            )
        with guard_legacy_steps(self.model):  # no model call on a 0-row batch, as for Keras 3
            return self.model.fit(
                _legacy_input(legacy, dataset, self._shard_policy),
                epochs=epochs,
                steps_per_epoch=steps_per_epoch,
                validation_data=_legacy_input(legacy, validation_data, self._shard_policy),
                validation_steps=validation_steps,
                callbacks=callback_list,
                verbose=verbose,
            )


class FitOptions(TypedDict, total=False):
    """:func:`fit`'s less common keyword arguments (each also a keyword argument of ``fit``).

    ``strategy`` (default: the model's, else :func:`tfonspark.distribute.strategy`),
    ``shard_policy`` (a ``tf.data.experimental.AutoShardPolicy`` or its name, for a Dataset),
    ``on_progress`` (called with a :class:`Progress` every ``log_every_steps`` steps, default
    100), ``max_to_keep`` (checkpoints kept in ``model_dir``, default 3) and
    ``checkpoint_every_steps`` (default :data:`DEFAULT_CHECKPOINT_EVERY_STEPS`; needs ``model_dir``).
    """

    strategy: tf.distribute.Strategy | None
    shard_policy: str | tf.data.experimental.AutoShardPolicy | None
    on_progress: ProgressFn | None
    log_every_steps: int
    max_to_keep: int
    checkpoint_every_steps: int | None


def fit(
    model: Any,
    dataset: tf.data.Dataset | DatasetFn,
    *,
    epochs: int = 1,
    steps_per_epoch: int | None = None,
    validation_data: tf.data.Dataset | DatasetFn | None = None,
    validation_steps: int | None = None,
    callbacks: Sequence[keras.callbacks.Callback] | None = None,
    model_dir: str | os.PathLike[str] | None = None,
    verbose: str | int = "auto",
    **options: Unpack[FitOptions],
) -> keras.callbacks.History:
    """Train a compiled Keras model on every node of the cluster; see the module docstring.

    With ``model_dir`` (shared by all workers), checkpoints every ``checkpoint_every_steps``
    steps and at each epoch end, and resumes from the latest; ``checkpoint_every_steps`` without
    ``model_dir`` is a ConfigError.

    Parameters
    ----------
    model : keras.Model or callable
        A compiled model made under ``strategy.scope()``, or a ``build_fn`` returning one.
    dataset : tf.data.Dataset or callable
        A ``tf.data.Dataset`` of global batches, or a ``dataset_fn(input_context)``.
    epochs : int
        The total number of epochs to reach (a resumed ``fit`` goes on from its checkpoint).
    steps_per_epoch : int, optional
        Steps per epoch; needed for an infinite dataset.
    validation_data : tf.data.Dataset or callable, optional
        Like ``dataset``, evaluated at each epoch end.
    validation_steps : int, optional
        Steps of each validation.
    callbacks : sequence of keras.callbacks.Callback, optional
        Keras callbacks, run on every worker.
    model_dir : str or PathLike, optional
        A directory all workers share, for checkpoints.
    verbose : str or int
        As in Keras' ``model.fit``.
    **options : FitOptions
        ``strategy``, ``shard_policy``, ``on_progress``, ``log_every_steps``, ``max_to_keep``,
        ``checkpoint_every_steps``: see :class:`FitOptions`.

    Returns a ``keras.callbacks.History`` (``.history``: per-epoch lists of ``loss``, metrics and
    ``val_*``; ``.epoch``: the epoch indices run; ``.model``: the model).

    Examples
    --------
    >>> history = tfonspark.keras.fit(build_model, ds, epochs=3, model_dir=args.model_dir)  # doctest: +SKIP
    """
    unknown = sorted(set(options) - set(FitOptions.__annotations__))
    if unknown:
        raise TypeError(f"fit() got unexpected keyword arguments: {', '.join(unknown)}")
    trainer = DistributedTrainer(model, model_dir=model_dir, **options)
    return trainer.fit(
        dataset,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        validation_data=validation_data,
        validation_steps=validation_steps,
        callbacks=callbacks,
        verbose=verbose,
    )


class _Input:
    """A distributed dataset with its per-epoch iterator policy and its local element spec."""

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        data: Any,
        name: str,
        steps: int | None,
        shard_policy: tf.data.experimental.AutoShardPolicy | None,
    ) -> None:
        self.steps = steps
        self._name = name
        if isinstance(data, tf.data.Dataset):
            self.dataset = strategy.experimental_distribute_dataset(_with_policy(data, shard_policy))
        elif isinstance(data, tf.distribute.DistributedDataset):
            self.dataset = data
        elif callable(data):
            if shard_policy is not None:
                raise ConfigError(
                    f"shard_policy applies to a tf.data.Dataset only; a dataset_fn shards its "
                    f"own input with input_context. Received: {name}={data!r}"
                )
            self.dataset = strategy.distribute_datasets_from_function(data)
        else:
            raise ConfigError(
                f"{name} must be a tf.data.Dataset of (x, y) batches or a "
                f"dataset_fn(input_context). Received: {type(data).__name__}"
            )
        self.local_spec = _local_spec(self.dataset.element_spec)
        cardinality = _cardinality(self.dataset, data)
        if steps is None and cardinality == int(tf.data.INFINITE_CARDINALITY):
            raise ConfigError(
                f"{name} is infinite; pass {'steps_per_epoch' if name == 'dataset' else 'validation_steps'}."
            )
        self.known_steps = steps if steps is not None else (cardinality if cardinality >= 0 else None)
        self.carries_over = steps is not None and name == "dataset"
        self.iterator: Iterator[Any] | None = None

    def start_epoch(self) -> None:
        """A new iterator per epoch, or keep the carried-over one when ``steps`` is set."""
        if not self.carries_over or self.iterator is None:
            self.iterator = iter(self.dataset)

    def restart(self) -> Iterator[Any]:
        """Start the data again (it ran out at an epoch boundary)."""
        self.iterator = iter(self.dataset)
        return self.iterator

    def ran_out(self, step: int) -> None:
        """Note that the data ended; with ``steps`` set, warn and restart next epoch."""
        if self.steps is not None and step > 0:
            _log.warning(
                "%s ran out of data after %d of %d steps; the epoch ends early and the next "
                "epoch starts the data again (repeat the dataset to avoid this)",
                self._name,
                step,
                self.steps,
            )
        self.iterator = None


def _next_step(step_fn: Callable[[Any], Any], data: _Input, step: int) -> Any:
    """Run one step; None when the data ran out.

    A carried-over iterator that is exhausted right at the start of an epoch is restarted once,
    so ``steps_per_epoch`` equal to the data's length works epoch after epoch.
    """
    try:
        return step_fn(data.iterator)
    except _OUT_OF_DATA:
        if step == 0 and data.carries_over:
            try:
                return step_fn(data.restart())
            except _OUT_OF_DATA:
                pass
        data.ran_out(step)
        return None


def _model_and_strategy(model: Any, strategy: tf.distribute.Strategy | None) -> tuple[Any, Any]:
    """Resolve the contract: a scoped compiled model, or a build_fn called in the scope."""
    flavor = keras_flavor(model)
    if flavor == "tf_keras":
        return model, strategy or model.distribute_strategy
    if flavor == "keras3":
        strategy = strategy or getattr(model, "_distribute_strategy", None)
        if strategy is None:
            raise ConfigError(
                "The model was not created under a strategy scope. Build and compile it inside "
                "`with tfonspark.distribute.strategy().scope():`, or pass a build_fn that "
                "returns a compiled model."
            )
        check_model_strategy(model, strategy)
        return model, strategy
    if not callable(model):
        raise ConfigError(
            f"model must be a compiled Keras model or a build_fn returning one. Received: {type(model).__name__}"
        )
    strategy = strategy or process_strategy()
    with strategy.scope():
        built = model()
    if keras_flavor(built) == "":
        raise ConfigError(f"build_fn must return a compiled Keras model. Received: {type(built).__name__}")
    return _model_and_strategy(built, strategy)


def _callbacks(
    model: Any, callbacks: Sequence[Any] | None, verbose: int, epochs: int, steps: int | None
) -> tuple[keras.callbacks.History, keras.callbacks.CallbackList]:
    """Keras CallbackList with a History (the user's, if given) and a progress bar if verbose."""
    user = list(callbacks or [])
    history = next((c for c in user if isinstance(c, keras.callbacks.History)), None)
    if history is None:
        history = keras.callbacks.History()
        user.append(history)
    callback_list = keras.callbacks.CallbackList(
        user,
        add_history=False,
        add_progbar=verbose != 0,
        model=model,
        verbose=verbose,
        epochs=epochs,
        steps=steps,
    )
    return history, callback_list


def _keras_tensor(spec: Any) -> keras.KerasTensor:
    """A symbolic stand-in for one component of a batch, for Keras' build."""
    if not isinstance(spec, tf.TensorSpec) or spec.shape.rank is None:
        raise ConfigError(
            "Dataset elements must be dense tensors of known rank (x, y[, sample_weight]). "
            f"Received: element spec {spec!r}"
        )
    return keras.KerasTensor(shape=tuple(spec.shape.as_list()), dtype=spec.dtype.name)


def _local_spec(spec: Any) -> Any:
    """The element spec of one replica's batch (unwraps tf.distribute's PerReplicaSpec)."""

    def unwrap(component: Any) -> Any:
        value_specs = getattr(component, "_value_specs", None)
        return value_specs[0] if value_specs else component

    return tf.nest.map_structure(unwrap, spec)


def _cardinality(distributed: Any, original: Any) -> int:
    """Steps per epoch on this worker if TensorFlow knows them; negative: unknown/infinite."""
    for source in (distributed, original):
        value = getattr(source, "cardinality", None)
        if value is not None:
            return int(value() if callable(value) else value)
    return int(tf.data.UNKNOWN_CARDINALITY)


def _with_policy(dataset: tf.data.Dataset, policy: tf.data.experimental.AutoShardPolicy | None) -> tf.data.Dataset:
    """Set the auto-shard policy on the dataset's options (if one was asked for)."""
    if policy is None:
        return dataset
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)


def _shard_policy(value: Any) -> tf.data.experimental.AutoShardPolicy | None:
    """Accept an AutoShardPolicy or its lower-case name."""
    if value is None or isinstance(value, tf.data.experimental.AutoShardPolicy):
        return value
    if isinstance(value, str) and value.lower() in _SHARD_POLICIES:
        return _SHARD_POLICIES[value.lower()]
    raise ConfigError(
        f"shard_policy must be one of {', '.join(_SHARD_POLICIES)} or a "
        f"tf.data.experimental.AutoShardPolicy. Received: shard_policy={value!r}"
    )


def _check_count(name: str, value: Any, *, optional: bool = False) -> None:
    """Positive int (or None when optional); bool is refused although it is an int."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1. Received: {name}={value!r}")


def _checkpoint_interval(every: int | None, model_dir: Any) -> int | None:
    """Steps between checkpoints: ``every``, the default with a ``model_dir``, else None."""
    if every is None:
        return DEFAULT_CHECKPOINT_EVERY_STEPS if model_dir is not None else None
    _check_count("checkpoint_every_steps", every)
    if model_dir is None:
        raise ConfigError(
            "checkpoint_every_steps needs a model_dir to write the checkpoints to (a directory every "
            f"worker shares: HDFS, S3, GCS, NFS). Received: checkpoint_every_steps={every!r}, model_dir=None"
        )
    return int(every)


def _verbosity(verbose: str | int, chief: bool) -> int:
    """Keras verbosity; ``"auto"`` prints one line per epoch on the chief only."""
    if verbose == "auto":
        return 2 if chief else 0
    if verbose in (0, 1, 2) and not isinstance(verbose, bool):
        return int(verbose)
    raise ConfigError(f"verbose must be 'auto', 0, 1 or 2. Received: verbose={verbose!r}")


def _pythonify(value: Any) -> Any:
    """A scalar tensor as a Python float; anything else unchanged."""
    array = np.asarray(value)
    return float(array) if array.size == 1 and array.dtype.kind in "fiub" else value


def _legacy_keras_module(model: Any) -> Any:
    """The top-level package (tf_keras, or keras 2) that a legacy model's classes come from."""
    for cls in type(model).__mro__:
        root = cls.__module__.split(".")[0]
        if root in ("tf_keras", "keras"):
            return sys.modules[root]
    raise ConfigError(f"Not a tf_keras model. Received: {type(model).__name__}")


def _legacy_input(legacy: Any, data: Any, policy: Any) -> Any:
    """Datasets get the shard policy; a dataset_fn is wrapped in tf_keras' DatasetCreator."""
    if data is None:
        return None
    if isinstance(data, tf.data.Dataset):
        return _with_policy(data, policy)
    if callable(data):
        return legacy.utils.experimental.DatasetCreator(data)
    return data
