"""MNIST with InputMode.SPARK: the driver turns the idx files into a DataFrame and feeds it.

    python examples/mnist/mnist_spark.py --data /path/to/mnist --epochs 5

The driver loads the idx files and builds a DataFrame ``image array<float>`` (784 values in
[0, 1]) + ``label bigint``; ``cluster.train(df, num_epochs=E)`` streams it E times to the
TensorFlow nodes (one per executor) as Arrow batches. Each node reads its feed with
``ctx.get_data_feed().as_dataset(...)`` and trains the demo CNN with
:func:`tfonspark.keras.fit` under ``MultiWorkerMirroredStrategy``.

Epochs and steps with a feed. The feed is finite (E passes, then the end of the feed) and is
*not* split evenly: each partition goes to the node on the executor that runs its feed task,
so one node may get a few thousand rows more than another, and neither sees where a pass ends.
Every step is an all-reduce, so all nodes must run the same number of steps. Therefore:

* ``steps_per_epoch = train_rows // global_batch`` (one pass's worth of global steps, known on
  the driver) and ``epochs = E``; ``fit`` keeps the input iterator from one epoch to the next, so
  a Keras epoch need not start where a Spark pass starts;
* a node whose feed runs dry before the last step trains on empty batches until the others are
  done (``tf.distribute``'s handling of uneven input), instead of hanging them;
* after ``fit``, each node reads and drops what is left of its feed (the imbalance plus
  ``rows % global_batch`` per pass) with ``DataFeed.drain()``, so that ``cluster.train``
  always completes. ``tf.data`` may still be prefetching from the feed on its own threads
  then: a ``DataFeed`` is safe to read from several threads.

The test set travels to the nodes in the arguments (7.8 MB of uint8) and is the validation
data, sharded by ``task_index``: the last ``val_accuracy`` is the accuracy on the whole test set.
The chief reports each epoch's metrics to the driver with ``ctx.report``, which prints them.
Outputs and ``--master`` are as in ``mnist_tf.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        default=os.environ.get("TFONSPARK_DATA"),
        help="directory of the MNIST idx files, read on the driver (default: $TFONSPARK_DATA)",
    )
    parser.add_argument(
        "--master", help="Spark master URL (default: spark-submit's, else an embedded local-cluster[2,1,1024])"
    )
    parser.add_argument("--nodes", type=int, default=2, help="TensorFlow nodes (default: 2)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs (default: 5)")
    parser.add_argument(
        "--batch-size", type=int, default=128, help="global batch size, split across the nodes (default: 128)"
    )
    parser.add_argument("--max-train-rows", type=int, help="use only the first N training rows (default: all)")
    parser.add_argument("--partitions", type=int, help="DataFrame partitions (default: Spark's default parallelism)")
    parser.add_argument(
        "--seed", type=int, default=0, help="random seed for weights, shuffling and dropout (default: 0)"
    )
    parser.add_argument(
        "--output-dir",
        default="mnist_output",
        help="export/ and metrics.json go here; a path every executor can write (default: ./mnist_output)",
    )
    args = parser.parse_args(argv)
    if not args.data:
        parser.error("--data is required (or set TFONSPARK_DATA)")
    args.output_dir = os.path.abspath(args.output_dir)
    return args


def main_fun(args: dict[str, Any], ctx: Any) -> None:
    """Runs on every node: train on the feed, drop its leftovers, export, write metrics."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args["threads"])
    from tfonspark import distribute

    strategy = distribute.strategy()  # before any other TensorFlow op
    import keras

    keras.utils.set_random_seed(args["seed"])
    from tfonspark.demo import build_model
    from tfonspark.keras import export_saved_model, fit

    started = time.monotonic()
    feed = ctx.get_data_feed()
    steps = args["train_rows"] // args["batch_size"]
    with strategy.scope():
        model = build_model(total_steps=args["epochs"] * steps)
    history = fit(
        model,
        _feed_dataset_fn(feed, args["batch_size"]),
        epochs=args["epochs"],
        steps_per_epoch=steps,
        validation_data=_test_dataset_fn(args, ctx),
        on_progress=_epoch_reporter(ctx),
        verbose=0,
    )
    feed.drain()  # drop what is left after the last step
    export_saved_model(model, os.path.join(args["output_dir"], "export"))
    if ctx.is_chief:
        _write_metrics(
            args["output_dir"],
            {
                "mode": "spark",
                "nodes": ctx.num_workers,
                "train_rows": args["train_rows"],
                "epochs": args["epochs"],
                "steps_per_epoch": steps,
                "history": history.history,
                "test_accuracy": history.history["val_accuracy"][-1],
                "trained_rows": args["epochs"] * steps * args["batch_size"],
                "node_seconds": time.monotonic() - started,
            },
        )


def _epoch_reporter(ctx: Any) -> Any:
    """An ``on_progress`` for fit: the chief reports each epoch's global metrics to the driver."""

    def on_progress(progress: Any) -> None:
        if progress.epoch_end and ctx.is_chief:
            ctx.report({"epoch": progress.epoch + 1, **progress.logs})

    return on_progress


def print_epoch(report: Any) -> None:
    """``on_report`` on the driver: one line per epoch report."""
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in report.metrics.items() if k != "epoch")
    print(f"epoch {report.metrics.get('epoch')} ({report.node}): {metrics}", flush=True)


def _feed_dataset_fn(feed: Any, global_batch: int) -> Any:
    """A dataset_fn for fit: this node's fed rows, shuffled, in per-node batches."""
    import tensorflow as tf

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        rows = feed.as_dataset(1024).unbatch()  # fed batches of (image, label) -> rows
        batch = context.get_per_replica_batch_size(global_batch)
        return rows.shuffle(10_000).batch(batch).prefetch(2)

    return dataset_fn


def _test_dataset_fn(args: dict[str, Any], ctx: Any) -> Any:
    """A dataset_fn for validation: this node's shard of the test set."""
    import tensorflow as tf

    mine = slice(ctx.task_index, None, ctx.num_workers)
    images = args["test_images"][mine].reshape(-1, 784).astype("float32") / 255
    labels = args["test_labels"][mine].astype("int64")

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(args["batch_size"])
        return tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch)

    return dataset_fn


def _write_metrics(output_dir: str, metrics: dict[str, Any]) -> None:
    """metrics.json in ``output_dir`` (local or any filesystem TensorFlow can write)."""
    import tensorflow as tf

    tf.io.gfile.makedirs(output_dir)
    with tf.io.gfile.GFile(os.path.join(output_dir, "metrics.json"), "w") as f:
        f.write(json.dumps(metrics, indent=1))


def train(sc: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Load on the driver, feed the cluster on ``sc``; return the chief's metrics + wall time."""
    from pyspark.sql import SparkSession

    import tfonspark
    from tfonspark.demo import images_to_dataframe
    from tfonspark.demo.datasets import load_mnist

    data = load_mnist(args.data)
    rows = args.max_train_rows or len(data.train_images)
    # rows shuffled once (so every partition holds every digit), built through Arrow
    df = images_to_dataframe(
        SparkSession.builder.getOrCreate(),
        data.train_images[:rows],
        data.train_labels[:rows],
        num_partitions=args.partitions,
        seed=args.seed,
    )
    node_args = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "train_rows": rows,
        "seed": args.seed,
        "output_dir": args.output_dir,
        "test_images": data.test_images,
        "test_labels": data.test_labels,
        "threads": max(1, sc.defaultParallelism // args.nodes),
    }
    started = time.monotonic()
    cluster = tfonspark.run(
        sc,
        main_fun,
        node_args,
        args.nodes,
        input_mode=tfonspark.InputMode.SPARK,
        reservation_timeout=300,
        on_report=print_epoch,
    )
    fed = cluster.train(df, num_epochs=args.epochs)
    cluster.shutdown(timeout=7200)
    return _add_metrics(args.output_dir, cluster_seconds=time.monotonic() - started, fed_rows=fed)


def _add_metrics(output_dir: str, **driver_side: Any) -> dict[str, Any]:
    """The chief's metrics.json plus what the driver measured (written back to the file)."""
    path = os.path.join(output_dir, "metrics.json")
    with open(path) as f:
        metrics = {**json.load(f), **driver_side}
    with open(path, "w") as f:
        json.dump(metrics, f, indent=1)
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    """Train on the cluster and print the test accuracy."""
    from tfonspark.demo import spark_context, stop_spark

    args = parse_args(argv)
    sc = spark_context(args.master, "mnist_spark")
    try:
        metrics = train(sc, args)
    finally:
        stop_spark(sc)
    print(
        f"test accuracy: {metrics['test_accuracy']:.4f} ({args.nodes} nodes, "
        f"{args.epochs} epochs x {metrics['steps_per_epoch']} steps, {metrics['fed_rows']} "
        f"rows fed, {metrics['trained_rows']} trained, {metrics['cluster_seconds']:.0f} s); model exported to "
        f"{args.output_dir}/export"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
