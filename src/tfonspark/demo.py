"""``python -m tfonspark.demo``: train a CNN on an embedded two-executor Spark and report accuracy.

What it does, offline, on one machine:

1. loads MNIST-style idx files from ``--data`` (or ``$TFONSPARK_DATA``), or else scikit-learn's
   bundled 8x8 digits upsampled to 28x28, and says which;
2. starts Spark on ``--master`` (default ``local-cluster[2,1,1024]``: two executor JVMs) and turns
   the training images into a DataFrame (``image array<float>``, ``label bigint``);
3. starts one TensorFlow node per executor (``InputMode.SPARK``) and feeds them the DataFrame for
   ``--epochs`` epochs; the nodes train the same Keras model under
   ``MultiWorkerMirroredStrategy`` with :func:`tfonspark.keras.fit`, and send progress lines
   (epoch, step, loss, rows/s) to this console over a small authenticated channel
   (:mod:`tfonspark._demo.progress`);
4. prints the test accuracy and writes ``training_curves.png`` and ``confusion_matrix.png`` to
   ``--out`` (default ``./demo_output``).

How epochs and steps work with a feed is explained in :mod:`tfonspark._demo.node`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._demo.data import images_to_dataframe, limit_rows
from ._demo.feed import DrainableFeed
from ._demo.model import build_model
from ._demo.node import NodeArgs, train_on_feed
from ._demo.progress import Message, ProgressServer, format_progress
from .datasets import DATA_ENV_VAR, Dataset, load_for_demo
from .errors import ClusterError, ConfigError, TFoSError

__all__ = [
    "DEFAULT_MASTER",
    "DrainableFeed",
    "build_model",
    "images_to_dataframe",
    "main",
    "spark_context",
    "stop_spark",
]

DEFAULT_MASTER = "local-cluster[2,1,1024]"
_SMALL_DATA_ROWS = 10_000  # below this (the digits fallback), smaller batches and more epochs


@dataclass
class _Console:
    """Prints the nodes' progress messages and keeps the chief's final result."""

    epochs: int
    rates: dict[int, float] = field(default_factory=dict)
    trained_rows: int = 0
    result: Message | None = None

    def __call__(self, message: Message) -> None:
        """Handle one message from a node (called from the progress server's threads)."""
        if message.get("kind") == "result":
            self.result = message
            return
        if message.get("kind") != "progress":
            return
        worker = int(message.get("worker", 0))
        if message.get("epoch_end") and worker == 0:
            self.trained_rows += int(message.get("global_rows") or 0)
        elif not message.get("epoch_end"):
            self.rates[worker] = float(message.get("rows_per_sec", 0.0))
        if worker == 0 and (message.get("epoch_end") or message["step"] != message.get("steps")):
            print("  " + format_progress(message, self.epochs, self.rates), flush=True)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; see ``python -m tfonspark.demo --help``."""
    parser = argparse.ArgumentParser(
        prog="python -m tfonspark.demo",
        description="Train a CNN on an embedded 2-executor Spark cluster with tfonspark "
        "(InputMode.SPARK, MultiWorkerMirroredStrategy) and report its test accuracy.",
    )
    parser.add_argument(
        "--data",
        help=f"directory of MNIST-style idx files (default: ${DATA_ENV_VAR}; without either, scikit-learn's digits)",
    )
    parser.add_argument("--out", default="demo_output", help="where the PNG plots go (default: %(default)s)")
    parser.add_argument("--epochs", type=int, help="training epochs (default: 3 for idx data, 10 for the digits)")
    parser.add_argument(
        "--batch-size", type=int, help="global batch size (default: 128 for idx data, 64 for the digits)"
    )
    parser.add_argument(
        "--max-train-rows", type=int, help="train on at most this many rows, drawn at random (default: all)"
    )
    parser.add_argument(
        "--master",
        help="Spark master URL, e.g. spark://127.0.0.1:7077 "
        f"(default: spark-submit's, else an embedded {DEFAULT_MASTER})",
    )
    parser.add_argument(
        "--nodes", type=int, default=2, help="TensorFlow nodes, one per executor (default: %(default)s)"
    )
    parser.add_argument(
        "--export-dir", help="also export the trained model as a SavedModel here (a path every executor can write)"
    )
    return parser.parse_args(argv)


def _check_counts(args: argparse.Namespace) -> None:
    """Positive integers where given."""
    for name in ("epochs", "batch_size", "max_train_rows", "nodes"):
        value = getattr(args, name)
        if value is not None and value < 1:
            option = "--" + name.replace("_", "-")
            raise ConfigError(f"{option} must be >= 1. Received: {option}={value}")


def _node_args(args: argparse.Namespace, dataset: Dataset, rows: int, server: ProgressServer, threads: int) -> NodeArgs:
    """The nodes' settings: recipe defaults by data size, the channel, the test set."""
    small = rows < _SMALL_DATA_ROWS
    epochs = args.epochs or (10 if small else 3)
    batch = args.batch_size or (64 if small else 128)
    steps = max(1, rows // batch)
    export_dir = os.path.abspath(args.export_dir) if args.export_dir else None
    return NodeArgs(
        epochs=epochs,
        global_batch=batch,
        steps_per_epoch=steps,
        image_shape=dataset.image_shape,
        num_classes=dataset.num_classes,
        test_images=dataset.test_images,
        test_labels=dataset.test_labels,
        progress_address=server.address,
        progress_secret=server.secret_hex,
        log_every_steps=max(10, steps // 4),
        threads=threads,
        export_dir=export_dir,
    )


def spark_context(master: str | None = None, app_name: str = "tfonspark-demo") -> Any:
    """The SparkContext of the demo and of ``examples/mnist``.

    ``master=None`` means: the master ``spark-submit`` set up when run under it, else
    :data:`DEFAULT_MASTER`. Other masters get a context tuned for one machine by
    :class:`tfonspark.testing.SparkManager`: ``local[N]``, ``local-cluster[N,cores,MB]`` (its
    executors start here) or ``spark://127.0.0.1:PORT`` (a standalone cluster on this host).
    """
    from pyspark import SparkContext

    from .testing import SparkManager

    if master is None and os.environ.get("PYSPARK_GATEWAY_PORT"):  # launched by spark-submit
        return SparkContext.getOrCreate()
    return SparkManager.instance().get(master or DEFAULT_MASTER, spark__app__name=app_name)


def stop_spark(sc: Any) -> None:
    """Stop ``sc`` (and, for an embedded cluster, its executors)."""
    from .testing import SparkManager

    manager = SparkManager.instance()
    if manager.sc is sc:
        manager.stop()
    else:
        sc.stop()


def _train(sc: Any, args: argparse.Namespace, dataset: Dataset) -> Message:
    """Feed the training rows to the TF nodes; return the chief's result message."""
    from pyspark.sql import SparkSession

    from .config import InputMode
    from .driver.launch import run

    images, labels = limit_rows(dataset.train_images, dataset.train_labels, args.max_train_rows)
    df = images_to_dataframe(SparkSession.builder.getOrCreate(), images, labels)
    threads = max(1, sc.defaultParallelism // args.nodes)
    console = _Console(epochs=0)
    with ProgressServer(sc.getConf().get("spark.driver.host", "127.0.0.1"), console) as server:
        node_args = _node_args(args, dataset, len(images), server, threads)
        console.epochs = node_args.epochs
        print(f"Starting {args.nodes} TensorFlow nodes ...", flush=True)
        cluster = run(sc, train_on_feed, node_args, args.nodes, input_mode=InputMode.SPARK, reservation_timeout=300)
        print(
            f"Training {_plural(node_args.epochs, 'epoch')} x {node_args.steps_per_epoch} steps "
            f"(global batch {node_args.global_batch}) on {len(images)} rows, "
            f"{args.nodes} nodes:",
            flush=True,
        )
        fed = cluster.train(df, num_epochs=node_args.epochs)
        cluster.shutdown(timeout=1800)
    if console.result is None:
        from .testing import spark_home

        raise ClusterError(
            "training ended but the chief node sent no result; its output is in "
            f"the executor logs (for an embedded cluster: {spark_home()}/work)"
        )
    if fed > console.trained_rows:
        print(f"({fed} rows fed, {console.trained_rows} trained: the rest came after the last step and was dropped)")
    return console.result


def _plural(count: int, noun: str) -> str:
    """``1 epoch``, ``3 epochs``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _report(result: Message, dataset: Dataset, out: Path) -> float:
    """Print the test accuracy and write the two PNG files; return the accuracy."""
    from .plots import save_confusion_matrix, save_training_curves

    predictions = np.asarray(result["predictions"], dtype=np.int64)
    labels = dataset.test_labels.astype(np.int64)
    accuracy = float(np.mean(predictions == labels))
    curves = save_training_curves(
        result["history"], out / "training_curves.png", title=f"tfonspark demo: {dataset.name}"
    )
    matrix = save_confusion_matrix(
        labels, predictions, out / "confusion_matrix.png", dataset.class_names, title=f"{dataset.name} test set"
    )
    print(f"Test accuracy: {accuracy:.2%} on {len(labels)} {dataset.name} test images")
    print(f"Wrote {curves} and {matrix}")
    return accuracy


def _run(args: argparse.Namespace) -> int:
    """The demo, start to end."""
    _check_counts(args)
    started = time.monotonic()
    dataset, description = load_for_demo(args.data)
    print(f"Data: {description}", flush=True)
    print(f"Starting Spark ({args.master or DEFAULT_MASTER}) ...", flush=True)
    sc = spark_context(args.master)
    try:
        result = _train(sc, args, dataset)
    finally:
        stop_spark(sc)
    _report(result, dataset, Path(args.out))
    print(f"Done in {time.monotonic() - started:.0f} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return the process exit status (0 on success)."""
    args = _parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")
    try:
        return _run(args)
    except TFoSError as err:
        print(f"demo failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
