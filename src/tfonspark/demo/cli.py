"""``python -m tfonspark.demo``'s command line: load data, start Spark and the nodes, train, report.

The steps are described in :mod:`tfonspark.demo`; how epochs and steps work with a feed in
:mod:`.node`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ClusterError, ConfigError, TFoSError
from .data import images_to_dataframe, limit_rows
from .datasets import DATA_ENV_VAR, Dataset, load_for_demo
from .node import NodeArgs, train_on_feed
from .progress import Console, Message
from .spark import DEFAULT_MASTER, spark_context, stop_spark

__all__ = ["main"]

_SMALL_DATA_ROWS = 10_000  # below this (the digits fallback), smaller batches and more epochs
_RESULT_WAIT_SECS = 10.0  # the chief's last report may be handled just after shutdown() returns


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


def _node_args(args: argparse.Namespace, dataset: Dataset, rows: int, threads: int) -> NodeArgs:
    """The nodes' settings: recipe defaults by data size, the test set."""
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
        log_every_steps=max(10, steps // 4),
        threads=threads,
        export_dir=export_dir,
    )


def _train(sc: Any, args: argparse.Namespace, dataset: Dataset) -> Message:
    """Feed the training rows to the TF nodes; return the chief's result report."""
    from pyspark.sql import SparkSession

    from ..config import InputMode
    from ..driver.runner import run

    images, labels = limit_rows(dataset.train_images, dataset.train_labels, args.max_train_rows)
    df = images_to_dataframe(SparkSession.builder.getOrCreate(), images, labels)
    threads = max(1, sc.defaultParallelism // args.nodes)
    node_args = _node_args(args, dataset, len(images), threads)
    console = Console(epochs=node_args.epochs)
    print(f"Starting {args.nodes} TensorFlow nodes ...", flush=True)
    cluster = run(
        sc,
        train_on_feed,
        node_args,
        args.nodes,
        input_mode=InputMode.SPARK,
        reservation_timeout=300,
        on_report=console,
    )
    print(
        f"Training {_plural(node_args.epochs, 'epoch')} x {node_args.steps_per_epoch} steps "
        f"(global batch {node_args.global_batch}) on {len(images)} rows, "
        f"{args.nodes} nodes:",
        flush=True,
    )
    fed = cluster.train(df, num_epochs=node_args.epochs)
    cluster.shutdown(timeout=1800)
    result = console.wait_for_result(_RESULT_WAIT_SECS)
    if result is None:
        from ..testing import spark_home

        raise ClusterError(
            "training ended but the chief node sent no result; its output is in "
            f"the executor logs (for an embedded cluster: {spark_home()}/work)"
        )
    if fed > console.trained_rows:
        print(f"({fed} rows fed, {console.trained_rows} trained: the rest came after the last step and was dropped)")
    return result


def _plural(count: int, noun: str) -> str:
    """``1 epoch``, ``3 epochs``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _pairs(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """True and predicted labels with exactly these confusion-matrix counts (in cell order)."""
    classes = counts.shape[0]
    cells = np.repeat(np.arange(classes * classes), counts.ravel())
    return cells // classes, cells % classes


def _show_results(result: Message, dataset: Dataset, out: Path) -> float:
    """Print the test accuracy and write the two PNG files; return the accuracy."""
    from .plots import save_confusion_matrix, save_training_curves

    counts = np.asarray(result["confusion"], dtype=np.int64)
    total = int(counts.sum())
    accuracy = float(np.trace(counts)) / total if total else float("nan")
    curves = save_training_curves(
        result["history"], out / "training_curves.png", title=f"tfonspark demo: {dataset.name}"
    )
    labels, predictions = _pairs(counts)
    matrix = save_confusion_matrix(
        labels, predictions, out / "confusion_matrix.png", dataset.class_names, title=f"{dataset.name} test set"
    )
    print(f"Test accuracy: {accuracy:.2%} on {total} {dataset.name} test images")
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
    _show_results(result, dataset, Path(args.out))
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
