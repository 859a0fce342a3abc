"""What every TF node runs in the demo: train on the Spark feed, report to the driver's console.

Epochs and steps with a feed (``InputMode.SPARK``): the driver calls
``cluster.train(df, num_epochs=E)``, which streams the DataFrame E times to the nodes as one
continuous, finite feed; each partition goes to the node on the executor that runs its feed
task, so the nodes receive about, not exactly, half the rows each. The nodes therefore run
``fit(..., epochs=E, steps_per_epoch=rows // global_batch)``:

* one Keras epoch is one pass's worth of *global* steps, the same count on every node (which
  ``MultiWorkerMirroredStrategy`` needs, as every step is an all-reduce); the input iterator
  carries over from epoch to epoch, so Keras epochs need not line up with Spark's passes;
* a node whose feed runs dry a little early gets 0-row batches while the other finishes
  (``tf.distribute``'s handling of uneven input): ``fit`` skips the model on them and adds zero
  gradients to the all-reduce (oneDNN's Conv2D kernels reject 0 rows);
* what is left after the last step (the imbalance between nodes plus ``rows % global_batch``
  per pass, a few hundred rows on MNIST) is read and dropped with
  :meth:`~tfonspark.tfprocess.datafeed.DataFeed.drain`, so that ``cluster.train`` always
  completes; the driver reports rows fed minus rows trained.

Progress goes to the driver with ``ctx.report`` (:mod:`.progress` says what is in a report);
the chief's last report carries the history and the test set's confusion matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .data import shard, to_features
from .model import build_model
from .plots import confusion_matrix
from .progress import progress_message, result_message

__all__ = ["NodeArgs", "configure_threads", "predict_classes", "train_on_feed"]

_SHUFFLE_ROWS = 10_000
_FEED_BATCH = 1024  # rows per read from the feed
_EVAL_BATCH = 1000


@dataclass(frozen=True)
class NodeArgs:
    """The demo's arguments to every node (shipped, pickled, in the Spark task)."""

    epochs: int
    global_batch: int
    steps_per_epoch: int
    image_shape: tuple[int, int]
    num_classes: int
    test_images: np.ndarray
    test_labels: np.ndarray
    log_every_steps: int
    threads: int = 0
    export_dir: str | None = None


def configure_threads(threads: int) -> None:
    """Give TensorFlow's op-level parallelism ``threads`` threads (0 keeps its default).

    Must run before the first TensorFlow op, i.e. before ``tfonspark.distribute.strategy()``.
    """
    if threads > 0:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)


def train_on_feed(args: NodeArgs, ctx: Any) -> None:
    """``map_fun``: train the demo CNN on the fed rows; the chief reports history and test results."""
    configure_threads(args.threads)
    from .. import distribute

    strategy = distribute.strategy()  # before any other TensorFlow op
    from ..keras import export_saved_model, fit

    feed = ctx.get_data_feed()
    with strategy.scope():
        model = build_model(args.image_shape, args.num_classes, total_steps=args.epochs * args.steps_per_epoch)
    history = fit(
        model,
        _feed_input(feed, args.global_batch),
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        validation_data=_test_input(args, ctx.task_index, ctx.num_workers),
        on_progress=lambda progress: ctx.report(progress_message(progress)),
        log_every_steps=args.log_every_steps,
        verbose=0,
    )
    feed.drain()
    if args.export_dir:
        export_saved_model(model, args.export_dir)
    if ctx.is_chief:
        predictions = predict_classes(model, to_features(args.test_images))
        matrix = confusion_matrix(args.test_labels, predictions, args.num_classes)
        ctx.report(result_message(history.history, matrix))


def _feed_input(feed: Any, global_batch: int) -> Any:
    """A ``dataset_fn``: this node's fed rows, shuffled, in per-node batches."""
    import tensorflow as tf

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(global_batch)
        rows = feed.as_dataset(_FEED_BATCH).unbatch()  # elements: (image, label)
        return rows.shuffle(_SHUFFLE_ROWS).batch(batch).prefetch(2)

    return dataset_fn


def _test_input(args: NodeArgs, index: int, count: int) -> Any:
    """A ``dataset_fn``: this node's shard of the test set (global validation metrics)."""
    import tensorflow as tf

    images = to_features(shard(args.test_images, index, count))
    labels = shard(args.test_labels, index, count).astype(np.int64)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(args.global_batch)
        return tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch)

    return dataset_fn


def predict_classes(model: Any, features: np.ndarray) -> np.ndarray:
    """argmax of the model's logits for every row, in batches (no collective: chief only)."""
    parts = [
        np.argmax(np.asarray(model(features[i : i + _EVAL_BATCH], training=False)), axis=1)
        for i in range(0, len(features), _EVAL_BATCH)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
