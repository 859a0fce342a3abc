"""The MNIST CNN through ``tfonspark.tensorfx``, in either input mode (or in this process).

    python examples/tensorfx/mnist.py --data /path/to/mnist --mode spark --job-dir mnist_fx
    python examples/tensorfx/mnist.py --data /path/to/mnist --mode tensorflow --job-dir mnist_fx
    python examples/tensorfx/mnist.py --data /path/to/mnist --mode local --job-dir mnist_fx

:class:`MnistBuilder` is the demo's CNN (two 5x5 convolutions, a hidden dense layer, Adam with
a cosine decay over the planned steps) as a ``ModelBuilder``. Its rows are ``(image, label)``:
784 floats in [0, 1] and the digit. ``--mode spark`` builds a DataFrame of the training idx
files on the driver and feeds it to ``--nodes`` nodes (``InputMode.SPARK``); ``--mode
tensorflow`` has each node read the idx files and keep its shard (``InputMode.TENSORFLOW``).
Every node reads the test files as the ``"eval"`` source (sharded), so the last epoch's
``val_accuracy`` is the accuracy on the whole test set: it is printed as the test accuracy.
``<job-dir>/model`` serves ``label`` and ``probabilities`` from an ``image`` input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from tfonspark.tensorfx import ModelArguments, ModelBuilder


class MnistArgs(ModelArguments):
    """The MNIST job's arguments: the standard ones, the data and where it runs."""

    @classmethod
    def build_parser(cls) -> argparse.ArgumentParser:
        parser = super().build_parser()
        parser.set_defaults(epochs=5, batch_size=128, learning_rate=2e-3)
        parser.add_argument("--data", default=os.environ.get("TFONSPARK_DATA"), help="the MNIST idx files")
        parser.add_argument("--mode", choices=("spark", "tensorflow", "local"), default="spark")
        parser.add_argument("--nodes", type=int, default=2, help="TensorFlow nodes (default: 2)")
        parser.add_argument("--master", help="Spark master (default: an embedded local-cluster[2,1,1024])")
        parser.add_argument("--max-train-rows", type=int, help="train on the first N rows only")
        parser.add_argument("--max-test-rows", type=int, help="evaluate on the first N test rows only")
        parser.add_argument("--filters", type=int, default=16, help="first conv's filters, the second's x2 (16)")
        parser.add_argument("--dense", type=int, default=128, help="hidden dense units (default: 128)")
        return parser

    def process(self) -> None:
        super().process()
        if not self.data or not os.path.isdir(self.data):
            self.fail("data", "must be a directory of MNIST idx files (or set TFONSPARK_DATA)", self.data)
        self.data = os.path.abspath(self.data)
        if self.nodes < 1:
            self.fail("nodes", "must be >= 1", self.nodes)
        for name in ("filters", "dense"):
            if getattr(self, name) < 1:
                self.fail(name, "must be >= 1", getattr(self, name))
        if self.mode == "spark" and self.steps_per_epoch is None:
            self.steps_per_epoch = max(1, train_rows(self) // self.batch_size)


def train_rows(args: Any) -> int:
    """How many training rows the job uses."""
    return min(60_000, args.max_train_rows or 60_000)


def read_rows(args: Any, split: str) -> tuple[Any, Any]:
    """``(images, labels)`` of ``split`` from its idx files: 784 floats in [0, 1], int64 digits."""
    from tfonspark.demo import to_features
    from tfonspark.demo.datasets import MNIST_FILES, read_idx

    def read(kind: str) -> Any:
        path = os.path.join(args.data, MNIST_FILES[f"{split}_{kind}"])
        return read_idx(path if os.path.exists(path) else path + ".gz")

    limit = args.max_train_rows if split == "train" else args.max_test_rows
    return to_features(read("images")[:limit]), read("labels")[:limit].astype("int64")


class MnistBuilder(ModelBuilder):
    """The demo CNN, served as ``{"label", "probabilities"}`` from an ``image`` input."""

    def build_input(self, source: str, batch: int, epochs: int | None, shuffle: bool) -> Any:
        import tensorflow as tf

        def named(image: Any, label: Any) -> Any:
            return {"image": tf.cast(image, tf.float32)}, label

        rows = self.rows(source).map(named)
        if shuffle:
            rows = rows.shuffle(10_000, seed=self.args.seed)
        return rows.repeat(epochs).batch(batch).prefetch(2)

    def build_inference(self, inputs: Any, training: bool | None) -> Any:
        import keras

        layers = keras.layers
        x = layers.Reshape((28, 28, 1))(inputs["image"])
        filters = self.args.filters
        x = layers.Conv2D(filters, 5, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D()(x)
        x = layers.Conv2D(2 * filters, 5, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D()(x)
        x = layers.Flatten()(x)
        x = layers.Dropout(0.3)(x)
        x = layers.Dense(self.args.dense, activation="relu")(x)
        return layers.Dense(10, name="logits")(x)

    def build_training(self, global_steps: int, inputs: Any, inferences: Any) -> tuple[Any, Any]:
        import keras

        schedule = keras.optimizers.schedules.CosineDecay(self.args.learning_rate, max(1, global_steps), alpha=0.05)
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True), keras.optimizers.Adam(schedule)

    def build_evaluation(self, inputs: Any, outputs: Any) -> list[Any]:
        return ["accuracy"]

    def build_output(self, inferences: Any) -> dict[str, Any]:
        import keras

        return {"label": keras.ops.argmax(inferences, axis=-1), "probabilities": keras.ops.softmax(inferences)}


def main_fun(node_args: dict[str, Any], ctx: Any) -> None:
    """Every node (or this process, with ctx None): train, and the chief writes metrics.json."""
    import tensorflow as tf

    from tfonspark import InputMode
    from tfonspark.tensorfx import ModelTrainer

    args = node_args["args"]
    tf.config.threading.set_intra_op_parallelism_threads(node_args.get("threads", 0))
    dataset = {"eval": lambda: tf.data.Dataset.from_tensor_slices(read_rows(args, "test"))}
    if args.mode != "spark":
        dataset["train"] = lambda: tf.data.Dataset.from_tensor_slices(read_rows(args, "train"))
    mode = InputMode.SPARK if args.mode == "spark" else InputMode.TENSORFLOW
    started = time.monotonic()
    result = ModelTrainer(ctx=ctx, input_mode=mode).train(MnistBuilder(args, dataset), node_args["job_dir"])
    if result.export_dir is not None:
        metrics = {
            "mode": args.mode,
            "history": result.history,
            "test_accuracy": result.history["val_accuracy"][-1],
            "node_seconds": time.monotonic() - started,
        }
        with open(os.path.join(node_args["job_dir"], "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=1)


def train(sc: Any, args: MnistArgs, job_dir: str) -> dict[str, Any]:
    """Train in ``args.mode`` (on ``sc``'s cluster unless local); the chief's metrics."""
    import tfonspark

    started = time.monotonic()
    node_args = {"args": args, "job_dir": job_dir}
    if args.mode == "local":
        main_fun(node_args, None)
    else:
        node_args["threads"] = max(1, sc.defaultParallelism // args.nodes)
        mode = tfonspark.InputMode.SPARK if args.mode == "spark" else tfonspark.InputMode.TENSORFLOW
        cluster = tfonspark.run(sc, main_fun, node_args, args.nodes, input_mode=mode, reservation_timeout=300)
        if args.mode == "spark":
            cluster.train(training_dataframe(args), num_epochs=args.epochs)
        cluster.shutdown(timeout=7200)
    with open(os.path.join(job_dir, "metrics.json")) as f:
        return {**json.load(f), "seconds": time.monotonic() - started}


def training_dataframe(args: MnistArgs) -> Any:
    """The training idx files as a DataFrame ``image array<float>, label bigint`` (shuffled once)."""
    from pyspark.sql import SparkSession

    from tfonspark.demo import images_to_dataframe
    from tfonspark.demo.datasets import load_mnist

    data = load_mnist(args.data)
    rows = train_rows(args)
    spark = SparkSession.builder.getOrCreate()
    return images_to_dataframe(spark, data.train_images[:rows], data.train_labels[:rows], seed=args.seed)


def main(argv: Sequence[str] | None = None) -> int:
    """Train in the chosen mode and print the test accuracy."""
    from tfonspark.demo import spark_context, stop_spark

    args, job_dir = MnistArgs.parse(argv, parse_job=True)
    job_dir = os.path.abspath(job_dir)
    os.makedirs(job_dir, exist_ok=True)
    sc = None if args.mode == "local" else spark_context(args.master, "tensorfx_mnist")
    try:
        metrics = train(sc, args, job_dir)
    finally:
        if sc is not None:
            stop_spark(sc)
    print(
        f"test accuracy: {metrics['test_accuracy']:.4f} (mode {args.mode}, {args.epochs} epochs, "
        f"{metrics['seconds']:.0f} s); model in {job_dir}/model"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
