"""``ModelTrainer``: trains a ``ModelBuilder`` on one process or on every node of a cluster.

TensorFX's trainer in TF 2 terms. ``train(model_builder, output)`` runs the same builder

* **alone** (no ``TF_CONFIG``): TensorFlow's default strategy and Keras' own ``model.fit``;
* **on a tfonspark node** (``TF_CONFIG`` from the supervisor): under
  ``MultiWorkerMirroredStrategy`` with :func:`tfonspark.keras.fit` (Keras 3's ``model.fit``
  fails under MWMS on TF 2.21), in either input mode:

  - ``InputMode.TENSORFLOW``: each node reads its shard of the builder's ``"train"`` rows
    (``rows.shard(workers, index)``), repeated (``build_input``'s ``epochs`` is None): an
    epoch is ``args.steps_per_epoch`` steps, by default the smallest shard's rows // the
    per-worker batch, the same on every node, so no epoch ends by running out of data (which
    stalled MWMS for seconds at epoch ends). Where TensorFlow does not know the number of rows
    (a filter, files), a ConfigError asks for ``--steps-per-epoch``;
  - ``InputMode.SPARK``: the ``"train"`` rows are the node's Spark feed
    (``ctx.get_data_feed()``), fed by ``cluster.train(df, num_epochs=E)``. A feed is uneven
    and endless to the node, so ``args.steps_per_epoch`` is required (rows // global batch);
    what is left after the last step is drained, so ``cluster.train`` completes.

  The ``"eval"`` source, when the builder has one, is the validation data, sharded the same
  way: the epoch's ``val_*`` metrics are those of the whole set.

What lands under ``output`` (a directory every node can reach):

* ``checkpoints/``: model, optimizer and position, each epoch (and every
  ``args.checkpoint_every_steps`` steps on a cluster); a later ``train`` resumes from them;
* ``summaries/``: TensorBoard scalars of the chief (epoch logs; step logs every
  ``args.log_every_steps``);
* ``model/``: the SavedModel of ``build_output``'s named outputs (``serve`` and
  ``serving_default``), which :class:`tfonspark.ml.TFModel` serves;
* ``debug/<role>-<index>/``: Debugger V2 dumps, with ``dump_debug_info``.

Debugging, per node and off by default: ``check_numerics`` (the first op that makes a NaN or
an Inf fails the node with :class:`NumericsError` naming the op, the role and the index), ``dump_debug_info`` (``tf.debugging.experimental.enable_dump_debug_info``,
for TensorBoard's Debugger V2) and ``log_device_placement``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from ..config import InputMode
from ..distribute.checkpoint import EpochCheckpoint, export_saved_model
from ..distribute.keras_fit import fit
from ..errors import ConfigError
from ..tfprocess.debugging import Debug, NumericsError, debugging
from .builder import ModelBuilder, element_inputs, serving_input_signature
from .config import Configuration

__all__ = ["DebugOptions", "ModelTrainer", "NumericsError", "Summaries", "TrainedModel"]

_log = logging.getLogger(__name__)

#: the sub-directories of ``output``
CHECKPOINTS, SUMMARIES, MODEL, DEBUG = "checkpoints", "summaries", "model", "debug"
_FEED_BATCH = 1024


@dataclass(frozen=True)
class DebugOptions:
    """``tf.debugging`` per node, all off by default (no cost when off)."""

    #: fail at the first op that makes a NaN or an Inf, naming the op, the role and the index
    check_numerics: bool = False
    #: Debugger V2 dumps under ``<output>/debug/<role>-<index>`` (TensorBoard's Debugger V2 reads them)
    dump_debug_info: bool = False
    #: log each op's device (``tf.debugging.set_log_device_placement``)
    log_device_placement: bool = False


@dataclass(frozen=True)
class TrainedModel:
    """What ``train`` returns: the SavedModel's path (on the chief; None elsewhere), the
    history (epoch -> metric lists, the same on every node) and the trained Keras model."""

    export_dir: str | None
    history: dict[str, list[float]]
    model: Any


class ModelTrainer:
    """Trains a :class:`ModelBuilder` where ``config`` says (module docstring).

    Parameters
    ----------
    config : Configuration, optional
        Where this process trains; default :meth:`Configuration.environment` (``TF_CONFIG``).
    ctx : NodeContext, optional
        The tfonspark node's context (``map_fun``'s ``ctx``): needed for ``InputMode.SPARK``.
    input_mode : InputMode
        ``InputMode.TENSORFLOW`` (the builder reads its sources) or ``InputMode.SPARK``
        (the ``"train"`` rows are the node's feed).
    debug : DebugOptions, optional
        ``tf.debugging`` options; all off by default.

    Examples
    --------
    >>> def main_fun(args, ctx):  # doctest: +SKIP
    ...     builder = MnistBuilder(MnistArgs.parse(args["argv"]), {"eval": test_rows})
    ...     ModelTrainer(ctx=ctx, input_mode=InputMode.SPARK).train(builder, args["output"])
    """

    def __init__(
        self,
        config: Configuration | None = None,
        *,
        ctx: Any = None,
        input_mode: InputMode = InputMode.TENSORFLOW,
        debug: DebugOptions | None = None,
    ) -> None:
        if input_mode == InputMode.SPARK and ctx is None:
            raise ConfigError("ModelTrainer: input_mode=InputMode.SPARK needs the node's ctx (map_fun's ctx)")
        self._config = config
        self._ctx = ctx
        self._input_mode = InputMode(input_mode)
        self._debug = debug or DebugOptions()

    @property
    def config(self) -> Configuration:
        """The training configuration (``TF_CONFIG``'s unless one was given)."""
        if self._config is None:
            self._config = Configuration.environment()
        return self._config

    def train(self, model_builder: ModelBuilder, output: str | os.PathLike[str]) -> TrainedModel:
        """Train ``model_builder``'s model; write checkpoints, summaries and the SavedModel.

        Every node of a cluster calls it (the chief keeps the files).

        Parameters
        ----------
        model_builder : ModelBuilder
            The model; its ``args`` give ``batch_size`` (global), ``epochs``,
            ``steps_per_epoch``, ``checkpoint_every_steps``, ``log_every_steps`` and ``seed``.
        output : str or PathLike
            The job's output directory, shared by all nodes.

        Returns
        -------
        TrainedModel
            The SavedModel's path (chief), the history and the model.

        Examples
        --------
        >>> result = ModelTrainer().train(builder, "/tmp/job")  # doctest: +SKIP
        >>> result.history["accuracy"][-1]  # doctest: +SKIP
        """
        config = self.config
        output = os.fspath(output)
        strategy = config.create_strategy()  # first TensorFlow op of the process (MWMS)
        with debugging(self._node_debug(output), config.task.type, config.task.index):
            return self._train(model_builder, config, strategy, output)

    def _train(self, builder: ModelBuilder, config: Configuration, strategy: Any, output: str) -> TrainedModel:
        """Plan this node's input, build the model in the scope, fit, drain the feed, export."""
        args = builder.args
        keras.utils.set_random_seed(int(getattr(args, "seed", 0) or 0))
        plan = _Plan.of(builder, config, strategy, self._input_mode, self._ctx)
        with strategy.scope():
            model, serving = plan.builder.build_model(plan.input_spec, plan.global_steps)
        history = plan.fit(model, strategy, output, self._summaries(config, output, args))
        plan.finish()
        export = export_saved_model(
            serving,
            os.path.join(output, MODEL),
            strategy=strategy,
            input_signature=[serving_input_signature(serving)],
        )
        return TrainedModel(export, history, model)

    def _node_debug(self, output: str) -> Debug:
        """The trainer's :class:`DebugOptions` as the node's :class:`~tfonspark.tfprocess.debugging.Debug`."""
        options = self._debug
        return Debug(
            check_numerics=options.check_numerics,
            dump_dir=os.path.join(output, DEBUG) if options.dump_debug_info else None,
            log_device_placement=options.log_device_placement,
        )

    def _summaries(self, config: Configuration, output: str, args: Any) -> list[keras.callbacks.Callback]:
        """The chief's TensorBoard summaries callback; none on other nodes."""
        if not config.master:
            return []
        return [Summaries(os.path.join(output, SUMMARIES), int(getattr(args, "log_every_steps", 100) or 0))]


class Summaries(keras.callbacks.Callback):  # type: ignore[misc]  # keras ships no types
    """TensorBoard scalars: every epoch's logs, and the step logs every ``every`` steps."""

    def __init__(self, log_dir: str, every: int = 100) -> None:
        super().__init__()
        self.log_dir = log_dir
        self.every = every
        self.writer = tf.summary.create_file_writer(log_dir)
        self.steps = 0

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        """Write the step's logs every ``every`` steps (``step/<name>``)."""
        self.steps += 1
        if self.every and self.steps % self.every == 0:
            self._write("step/", logs, self.steps)

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        """Write the epoch's (global) logs (``epoch/<name>``)."""
        self._write("epoch/", logs, epoch + 1)

    def _write(self, prefix: str, logs: Mapping[str, Any] | None, step: int) -> None:
        with self.writer.as_default(step=step):
            for name, value in (logs or {}).items():
                try:
                    tf.summary.scalar(prefix + name, float(value))
                except (TypeError, ValueError):
                    continue
        self.writer.flush()


class _SaveEpochs(keras.callbacks.Callback):  # type: ignore[misc]  # keras ships no types
    """Keras ``model.fit`` (one process): an :class:`EpochCheckpoint` at every epoch end."""

    def __init__(self, checkpoint: EpochCheckpoint) -> None:
        super().__init__()
        self.checkpoint = checkpoint

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        self.checkpoint.save(epoch + 1)


@dataclass(frozen=True)
class _Plan:
    """One node's training: its view of the builder's data, batch, steps and the input spec."""

    builder: ModelBuilder
    input_spec: Any
    global_steps: int
    batch: int
    steps: int | None
    alone: bool
    #: ``build_input``'s ``epochs`` for the training data on a cluster: None (repeat) in
    #: ``InputMode.TENSORFLOW``, whose epochs are ``steps`` long; 1 for a feed (it ends itself)
    repeat: int | None = 1
    #: validation steps that read every eval row once and stop before its end (TENSORFLOW mode)
    eval_steps: int | None = None
    feed: Any = None

    @classmethod
    def of(cls, builder: ModelBuilder, config: Configuration, strategy: Any, mode: InputMode, ctx: Any) -> _Plan:
        """This node's data (a shard or its feed), the per-replica batch and the model's input spec."""
        args = builder.args
        batch = _per_replica_batch(args.batch_size, strategy.num_replicas_in_sync)
        workers, position = _training_position(config)
        steps = getattr(args, "steps_per_epoch", None)
        alone = config.cluster is None
        sources: dict[str, Any] = {}
        feed = None
        if mode == InputMode.SPARK:
            if steps is None:
                raise ConfigError(
                    f"{type(args).__name__}: --steps-per-epoch is required with InputMode.SPARK (a feed is "
                    "uneven and ends only with the feed): pass train rows // global batch size"
                )
            feed = ctx.get_data_feed()
            sources["train"] = feed.as_dataset(_FEED_BATCH).unbatch()
        elif not alone:  # every worker runs the same fixed steps over its shard, repeated
            rows = builder.rows("train")
            steps = steps or _derived_steps(rows, workers, int(args.batch_size), type(args).__name__)
            sources["train"] = rows.shard(workers, position) if workers > 1 else rows
        eval_steps = None
        if not alone and "eval" in builder.dataset:
            eval_rows = builder.rows("eval")
            sources["eval"] = eval_rows.shard(workers, position) if workers > 1 else eval_rows
            if mode == InputMode.TENSORFLOW:
                eval_steps = _eval_steps(eval_rows, workers, int(args.batch_size))
        node = builder.with_dataset(sources) if sources else builder
        sample = node.build_input("train", batch, 1, True)
        spec = element_inputs(sample, type(builder).__name__)
        per_epoch = steps or int(sample.cardinality())
        global_steps = max(0, per_epoch) * int(args.epochs)
        repeat = None if mode == InputMode.TENSORFLOW and not alone else 1
        return cls(node, spec, global_steps, batch, steps, alone, repeat, eval_steps, feed)

    def fit(self, model: Any, strategy: Any, output: str, callbacks: list[Any]) -> dict[str, list[float]]:
        """Train: Keras' ``model.fit`` alone, :func:`tfonspark.keras.fit` on a cluster."""
        args = self.builder.args
        has_eval = "eval" in self.builder.dataset
        if self.alone:
            return self._fit_alone(model, strategy, output, callbacks, has_eval)
        history = fit(
            model,
            self._dataset_fn("train", True),
            epochs=int(args.epochs),
            steps_per_epoch=self.steps,
            validation_data=self._dataset_fn("eval", False) if has_eval else None,
            validation_steps=self.eval_steps if has_eval else None,
            callbacks=callbacks,
            model_dir=output,
            strategy=strategy,
            checkpoint_every_steps=getattr(args, "checkpoint_every_steps", None),
            verbose=0,
        )
        return {k: [float(v) for v in values] for k, values in history.history.items()}

    def _fit_alone(
        self, model: Any, strategy: Any, output: str, callbacks: list[Any], has_eval: bool
    ) -> dict[str, list[float]]:
        """One process: Keras' own fit, resuming at the last completed epoch of ``output``."""
        checkpoint = EpochCheckpoint(model, output, strategy=strategy)
        start = checkpoint.restore()
        repeat = None if self.steps else 1  # Keras stops on exhausted data with steps_per_epoch
        history = model.fit(
            self.builder.build_input("train", self.batch, repeat, True),
            epochs=int(self.builder.args.epochs),
            initial_epoch=start.epoch,
            steps_per_epoch=self.steps,
            validation_data=self.builder.build_input("eval", self.batch, 1, False) if has_eval else None,
            callbacks=[*callbacks, _SaveEpochs(checkpoint)],
            shuffle=False,  # build_input shuffles
            verbose=2,
        )
        return {k: [float(v) for v in values] for k, values in history.history.items()}

    def _dataset_fn(self, source: str, shuffle: bool) -> Any:
        """A ``dataset_fn(input_context)`` building ``source``'s input with the per-replica batch."""
        builder = self.builder
        global_batch = int(builder.args.batch_size)

        repeat = self.repeat if source == "train" else 1  # eval data stays finite

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            return builder.build_input(source, context.get_per_replica_batch_size(global_batch), repeat, shuffle)

        return dataset_fn

    def finish(self) -> None:
        """Drop what is left of the feed after the last step, so ``cluster.train`` completes."""
        if self.feed is not None:
            dropped = self.feed.drain()
            _log.info("drained %d fed rows left after the last step", dropped)


def _per_replica_batch(batch_size: int, replicas: int) -> int:
    """The global batch split over the replicas; ConfigError when it does not split evenly."""
    if batch_size % replicas:
        raise ConfigError(
            f"--batch-size must be a multiple of the {replicas} replicas training together. Received: {batch_size}"
        )
    return batch_size // replicas


def _derived_steps(rows: tf.data.Dataset, workers: int, global_batch: int, owner: str) -> int:
    """Steps per epoch in ``InputMode.TENSORFLOW`` on a cluster when ``--steps-per-epoch`` was not given.

    The smallest shard's rows (``rows // workers``) over the per-worker batch (``global_batch //
    workers``): every worker runs the same steps and none runs dry. The data is then repeated:
    an epoch that ends by running out of data ends with an ``OutOfRangeError`` in a step holding
    collectives, after which MWMS often stalled 14-36 s (``examples/mnist/mnist_tf.py``), and a
    finite dataset costs every step an all-reduce of "any data left". ConfigError, naming
    ``--steps-per-epoch``, where TensorFlow does not know the number of rows.
    """
    count = int(rows.cardinality())
    if count < 0:
        length = "infinite" if count == int(tf.data.INFINITE_CARDINALITY) else "unknown to TensorFlow"
        raise ConfigError(
            f'{owner}: the number of "train" rows is {length} (a filter, or files read), so the steps '
            f"per epoch cannot be derived: pass --steps-per-epoch (train rows // global batch size "
            f"{global_batch}), as with InputMode.SPARK"
        )
    if count < workers:
        raise ConfigError(
            f'{owner}: {count} "train" rows cannot be shared by {workers} workers: every worker needs one at least'
        )
    return max(1, (count // workers) // max(1, global_batch // workers))


def _eval_steps(rows: tf.data.Dataset, workers: int, global_batch: int) -> int | None:
    """Validation steps that read every eval row once and never ask past the end: the largest
    shard's batches (a smaller shard gives empty batches meanwhile). Asking past the end raises
    ``OutOfRangeError`` inside a step holding collectives, after which the epoch's next collective
    (its global logs) stalled MWMS for 10-20 s at some epoch ends. None where the number of rows
    is unknown (the eval then runs to the end of its data, as before)."""
    count = int(rows.cardinality())
    if count <= 0:
        return None
    largest = -(-count // workers)
    return -(-largest // max(1, global_batch // workers))


def _training_position(config: Configuration) -> tuple[int, int]:
    """How many tasks train together and this task's place among them (chief first)."""
    cluster = config.cluster or {}
    tasks = [f"{role}:{i}" for role in ("chief", "master", "worker") for i in range(len(cluster.get(role, ())))]
    me = f"{config.task.type}:{config.task.index}"
    return max(1, len(tasks)), tasks.index(me) if me in tasks else 0
