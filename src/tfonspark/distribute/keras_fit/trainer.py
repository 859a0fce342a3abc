"""The Keras 3 training loop of ``fit``: :class:`DistributedTrainer`, and the :class:`Progress` it reports.

The trainer holds the model, its strategy and its checkpoint directory. Each step runs the
model's own ``train_step`` on every replica (guarded against 0-row batches,
:mod:`..replica_steps`); an epoch trains, validates, runs the callbacks, checkpoints
(:mod:`..checkpoint`) and agrees with every worker whether to stop. Its inputs are
:class:`~.epoch_input.EpochInput`s; a tf_keras model goes to its own ``model.fit``
(:mod:`.tf_keras`). The contract, inputs and checkpoints are described in :mod:`.` (the
``keras_fit`` package).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ...errors import ConfigError, InputError
from ..checkpoint import EpochCheckpoint, Position, check_shared_dir, export_saved_model
from ..replica_steps import batch_rows, guarded_test_step, guarded_train_step
from ..strategies import check_model_strategy, keras_flavor, sum_across_replicas, task_info_of
from ..strategies import strategy as process_strategy
from .epoch_input import OUT_OF_DATA, DatasetFn, EpochInput, FitCall, StepFn, next_step, parse_shard_policy
from .tf_keras import fit_tf_keras

__all__ = ["DEFAULT_CHECKPOINT_EVERY_STEPS", "DistributedTrainer", "Progress", "ProgressFn"]

_log = logging.getLogger(__name__)

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
        self._shard_policy = parse_shard_policy(shard_policy)
        self._on_progress = on_progress
        self._log_every = log_every_steps
        self._checkpoint: EpochCheckpoint | None = None
        self._train_fn: StepFn | None = None
        self._test_fn: StepFn | None = None
        self._skip_fn: StepFn | None = None

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
        call = FitCall(dataset, epochs, steps_per_epoch, validation_data, validation_steps, callbacks, level)
        if self.flavor == "tf_keras":
            return fit_tf_keras(
                self.model,
                call,
                strategy=self.strategy,
                model_dir=self.model_dir,
                checkpoint_every=self._checkpoint_every,
                shard_policy=self._shard_policy,
            )
        return self._fit_keras3(call)

    def export(self, export_dir: str | os.PathLike[str], *, input_signature: Any = None) -> str | None:
        """Export a SavedModel (all workers call; the chief keeps it). See export_saved_model."""
        return export_saved_model(self.model, export_dir, strategy=self.strategy, input_signature=input_signature)

    # -- the Keras 3 loop --------------------------------------------------------------------

    def _fit_keras3(self, call: FitCall) -> keras.callbacks.History:
        """The epochs of ``call`` (after a resume: from the checkpoint's epoch and step)."""
        train = EpochInput(self.strategy, call.dataset, "dataset", call.steps_per_epoch, self._shard_policy)
        val = None
        if call.validation_data is not None:
            val = EpochInput(
                self.strategy,
                call.validation_data,
                "validation_data",
                call.validation_steps,
                self._shard_policy,
            )
        self._build(train.local_spec)
        start = self._restore()
        history, callback_list = _callbacks(self.model, call.callbacks, call.verbose, call.epochs, train.known_steps)
        self.model.stop_training = False
        callback_list.on_train_begin()
        if start.epoch >= call.epochs:
            _log.info("model_dir already holds %d completed epoch(s); nothing to train", start.epoch)
        logs: dict[str, Any] = {}
        for epoch in range(start.epoch, call.epochs):
            done = start.step if epoch == start.epoch else 0
            logs, stop = self._fit_epoch(epoch, train, val, callback_list, done)
            if stop:
                break
        callback_list.on_train_end(logs)
        return history

    # -- one epoch -------------------------------------------------------------------------

    def _fit_epoch(
        self,
        epoch: int,
        train: EpochInput,
        val: EpochInput | None,
        callback_list: keras.callbacks.CallbackList,
        done: int = 0,
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
        self, epoch: int, train: EpochInput, callback_list: keras.callbacks.CallbackList, started: float, done: int = 0
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
            result = next_step(train_fn, train, step)
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

    def _skip(self, train: EpochInput, count: int, epoch: int) -> int:
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
            except OUT_OF_DATA:
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

    def _evaluate(self, val: EpochInput, callback_list: keras.callbacks.CallbackList) -> dict[str, Any]:
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
            except OUT_OF_DATA:
                break
            logs = self._local(outputs)
            callback_list.on_test_batch_end(step, logs)
            step += 1
        result = self._global_logs(logs)
        callback_list.on_test_end(result)
        return result

    # -- building blocks -------------------------------------------------------------------

    def _step_fn(self, kind: str) -> StepFn:
        """A (cached) function running one train or test step on every replica."""
        cached = self._train_fn if kind == "train" else self._test_fn
        if cached is not None:
            return cached
        replica_step = guarded_train_step(self.model) if kind == "train" else guarded_test_step(self.model)
        strategy = self.strategy

        def one_step(iterator: Any) -> Any:
            return strategy.run(replica_step, args=(next(iterator),))

        fn: StepFn = one_step
        if not self.model.run_eagerly:
            fn = tf.function(one_step, reduce_retracing=True)
        if kind == "train":
            self._train_fn = fn
        else:
            self._test_fn = fn
        return fn

    def _build(self, spec: object) -> None:
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


def _model_and_strategy(model: Any, strategy: tf.distribute.Strategy | None) -> tuple[Any, tf.distribute.Strategy]:
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
    model: Any, callbacks: Sequence[keras.callbacks.Callback] | None, verbose: int, epochs: int, steps: int | None
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


def _keras_tensor(spec: object) -> keras.KerasTensor:
    """A symbolic stand-in for one component of a batch, for Keras' build."""
    if not isinstance(spec, tf.TensorSpec) or spec.shape.rank is None:
        raise ConfigError(
            "Dataset elements must be dense tensors of known rank (x, y[, sample_weight]). "
            f"Received: element spec {spec!r}"
        )
    return keras.KerasTensor(shape=tuple(spec.shape.as_list()), dtype=spec.dtype.name)


def _check_count(name: str, value: object, *, optional: bool = False) -> None:
    """Positive int (or None when optional); bool is refused although it is an int."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1. Received: {name}={value!r}")


def _checkpoint_interval(every: int | None, model_dir: str | os.PathLike[str] | None) -> int | None:
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


def _pythonify(value: object) -> Any:
    """A scalar tensor as a Python float; anything else unchanged."""
    array = np.asarray(value)
    return float(array) if array.size == 1 and array.dtype.kind in "fiub" else value
