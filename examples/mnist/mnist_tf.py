"""MNIST with InputMode.TENSORFLOW: every node reads the idx files itself and keeps its shard.

    python examples/mnist/mnist_tf.py --data /path/to/mnist --epochs 5

Spark only places the TensorFlow nodes (one per executor); no data goes through Spark. Each node
loads the four idx files from ``--data`` (a path every executor can read), keeps the rows
``task_index, task_index + num_workers, ...`` of the training and test sets, and trains the demo
CNN with :func:`tfonspark.keras.fit` under ``MultiWorkerMirroredStrategy``: the global batch
(``--batch-size``) is split across the nodes and the gradients are all-reduced at every step.
An epoch is ``train rows // global batch`` steps (as in ``mnist_spark.py``) over each node's
shard, shuffled and repeated, so that no epoch ends by running out of data (that often stalled
TensorFlow for 14-36 s at an epoch end under this strategy: see ``_dataset_fn``). The test
shards are the validation data, so the last epoch's ``val_accuracy`` (summed over the nodes) is
the accuracy on the whole test set.

Every node exports the model (the chief keeps it) to ``<output-dir>/export``, a SavedModel for
``mnist_inference.py``; the chief writes ``<output-dir>/metrics.json`` (history, accuracy,
timings), which the driver prints. Under ``spark-submit`` the submitted master and settings
are used, as on any cluster::

    spark-submit --master spark://master-host:7077 --archives env.tar.gz#env \
      --conf spark.pyspark.python=./env/bin/python examples/mnist/mnist_tf.py --data /path/to/mnist

(``env.tar.gz``: the driver's virtualenv, packed with ``venv-pack``; README, "Running on a
cluster"). Run with ``python`` instead, ``--master`` defaults to an embedded
``local-cluster[2,1,1024]``; ``local[N]`` and ``spark://127.0.0.1:PORT`` run on this host, and
another host's master gets a plain SparkContext (nothing pinned to this host). The chief reports each epoch's
metrics to the driver with ``ctx.report``, which prints them; the nodes' own output goes to the
executors' stderr logs.
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
        help="directory of the MNIST idx files, readable by every executor (default: $TFONSPARK_DATA)",
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
    parser.add_argument(
        "--seed", type=int, default=0, help="random seed for weights, shuffling and dropout (default: 0)"
    )
    parser.add_argument(
        "--output-dir",
        default="mnist_output",
        help="export/ and metrics.json go here; a path every executor can write (default: ./mnist_output)",
    )
    parser.add_argument("--model-dir", help="keep epoch checkpoints here and resume from them")
    args = parser.parse_args(argv)
    if not args.data:
        parser.error("--data is required (or set TFONSPARK_DATA)")
    args.data = os.path.abspath(args.data)  # executors run in other working directories
    args.output_dir = os.path.abspath(args.output_dir)
    args.model_dir = os.path.abspath(args.model_dir) if args.model_dir else None
    return args


def main_fun(args: argparse.Namespace, ctx: Any) -> None:
    """Runs on every node: load, shard, train, export; the chief writes metrics.json."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    from tfonspark import distribute

    strategy = distribute.strategy()  # before any other TensorFlow op
    import keras

    keras.utils.set_random_seed(args.seed)
    from tfonspark.demo import build_model
    from tfonspark.demo.datasets import load_mnist
    from tfonspark.keras import export_saved_model, fit

    started = time.monotonic()
    data = load_mnist(args.data)
    rows = args.max_train_rows or len(data.train_images)
    train = _shard(data.train_images[:rows], data.train_labels[:rows], ctx)
    test = _shard(data.test_images, data.test_labels, ctx)
    steps = max(1, rows // args.batch_size)  # global steps per epoch, as in mnist_spark.py
    with strategy.scope():
        model = build_model(data.image_shape, data.num_classes, total_steps=args.epochs * steps)
    history = fit(
        model,
        _dataset_fn(*train, args.batch_size, training=True),
        epochs=args.epochs,
        steps_per_epoch=steps,
        validation_data=_dataset_fn(*test, args.batch_size),
        model_dir=args.model_dir,
        on_progress=_epoch_reporter(ctx),
        verbose=0,
    )
    export_saved_model(model, os.path.join(args.output_dir, "export"))
    if ctx.is_chief:
        _write_metrics(
            args.output_dir,
            {
                "mode": "tensorflow",
                "nodes": ctx.num_workers,
                "train_rows": rows,
                "epochs": args.epochs,
                "steps_per_epoch": steps,
                "history": history.history,
                "test_accuracy": history.history["val_accuracy"][-1],
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


def _shard(images: Any, labels: Any, ctx: Any) -> tuple[Any, Any]:
    """This node's rows as flat float32 features in [0, 1] and int64 labels."""
    mine = slice(ctx.task_index, None, ctx.num_workers)
    features = images[mine].reshape(-1, images.shape[1] * images.shape[2]).astype("float32") / 255
    return features, labels[mine].astype("int64")


def _dataset_fn(features: Any, labels: Any, global_batch: int, training: bool = False) -> Any:
    """A dataset_fn for fit: this node's rows in per-node batches (already sharded).

    Training data is shuffled and repeated: ``fit`` runs ``steps_per_epoch`` steps on it and
    never reaches its end. An epoch that ends by running out of data ends with an
    ``OutOfRangeError`` raised inside a step function that holds collectives; under
    ``MultiWorkerMirroredStrategy`` (TF 2.21) the next collective then often stalled 14-36 s at
    the epoch end (``benchmarks/README.md``, accuracy). An infinite dataset also spares every
    step the all-reduce by which the workers agree that one of them still has data.
    """
    import tensorflow as tf

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices((features, labels))
        if training:
            ds = ds.shuffle(len(features), seed=context.input_pipeline_id).repeat()
        return ds.batch(context.get_per_replica_batch_size(global_batch)).prefetch(2)

    return dataset_fn


def _write_metrics(output_dir: str, metrics: dict[str, Any]) -> None:
    """metrics.json in ``output_dir`` (local or any filesystem TensorFlow can write)."""
    import tensorflow as tf

    tf.io.gfile.makedirs(output_dir)
    with tf.io.gfile.GFile(os.path.join(output_dir, "metrics.json"), "w") as f:
        f.write(json.dumps(metrics, indent=1))


def train(sc: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Run the cluster on ``sc``; return the chief's metrics plus the driver's wall time."""
    import tfonspark

    args.threads = max(1, sc.defaultParallelism // args.nodes)  # cores per node
    started = time.monotonic()
    cluster = tfonspark.run(
        sc,
        main_fun,
        args,
        args.nodes,
        input_mode=tfonspark.InputMode.TENSORFLOW,
        reservation_timeout=300,
        on_report=print_epoch,
    )
    cluster.shutdown(timeout=7200)
    return _add_metrics(args.output_dir, cluster_seconds=time.monotonic() - started)


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
    sc = spark_context(args.master, "mnist_tf")
    try:
        metrics = train(sc, args)
    finally:
        stop_spark(sc)
    print(
        f"test accuracy: {metrics['test_accuracy']:.4f} ({args.nodes} nodes, "
        f"{args.epochs} epochs x {metrics['steps_per_epoch']} steps, {metrics['train_rows']} training rows, "
        f"{metrics['cluster_seconds']:.0f} s); model exported to {args.output_dir}/export"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
