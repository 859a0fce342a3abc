"""``fit`` for compiled Keras 3 models under ``MultiWorkerMirroredStrategy``.

Why this exists: on TF 2.21 / Keras 3.15, ``model.fit`` under MWMS fails inside Keras
(``_maybe_symbolic_build`` converts ``PerReplica`` batches, and ``reduce_per_replica`` reduces
scalar metrics along axis 0). This package keeps everything the model defines (its own
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
:data:`~.trainer.DEFAULT_CHECKPOINT_EVERY_STEPS`, 100: they cost the MNIST demo CNN 0.3-0.5% per step,
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

The package: :func:`fit` and :class:`FitOptions` here; the Keras 3 loop in :mod:`.trainer`
(:class:`~.trainer.DistributedTrainer`, :class:`~.trainer.Progress`); each input, distributed and
stepped epoch by epoch, in :mod:`.epoch_input`; tf_keras models' own ``model.fit`` in
:mod:`.tf_keras`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import keras
import tensorflow as tf

from .epoch_input import DatasetFn
from .trainer import DistributedTrainer, ProgressFn

if TYPE_CHECKING:
    from typing import Unpack

__all__ = ["FitOptions", "fit"]


class FitOptions(TypedDict, total=False):
    """:func:`fit`'s less common keyword arguments (each also a keyword argument of ``fit``).

    ``strategy`` (default: the model's, else :func:`tfonspark.distribute.strategy`),
    ``shard_policy`` (a ``tf.data.experimental.AutoShardPolicy`` or its name, for a Dataset),
    ``on_progress`` (called with a :class:`Progress` every ``log_every_steps`` steps, default
    100), ``max_to_keep`` (checkpoints kept in ``model_dir``, default 3) and
    ``checkpoint_every_steps`` (default :data:`~.trainer.DEFAULT_CHECKPOINT_EVERY_STEPS`; needs ``model_dir``).
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
