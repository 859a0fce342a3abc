"""A tabular model through ``tfonspark.tensorfx``: scikit-learn's breast-cancer table as a DataFrame.

    python examples/tensorfx/tabular.py --mode spark --job-dir tabular_output
    python examples/tensorfx/tabular.py --mode tensorflow --job-dir tabular_output
    python examples/tensorfx/tabular.py --mode local --job-dir tabular_output

The table (569 rows, 30 numeric columns and a 0/1 diagnosis) ships with scikit-learn, so
nothing is downloaded. It becomes a Spark DataFrame with snake_case column names, split into
train and test. ``--mode spark`` feeds the training rows to ``--nodes`` TensorFlow nodes
(``InputMode.SPARK``); ``--mode tensorflow`` lets each node read its shard of the same rows
(``InputMode.TENSORFLOW``); ``--mode local`` trains in this process. In every mode the same
:class:`TabularBuilder` is trained by :class:`tfonspark.tensorfx.ModelTrainer`, which writes
``<job-dir>/checkpoints``, ``<job-dir>/summaries`` and the SavedModel ``<job-dir>/model``; the
test accuracy is then measured by :class:`tfonspark.ml.TFModel` serving that SavedModel on the
test DataFrame, one signature input per column.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from tfonspark.tensorfx import ModelArguments, ModelBuilder

LABEL = "diagnosis"


def load_table(test_fraction: float = 0.25, seed: int = 0) -> tuple[Any, Any]:
    """scikit-learn's breast-cancer table as (train, test) pandas frames, snake_case columns."""
    from sklearn.datasets import load_breast_cancer

    frame = load_breast_cancer(as_frame=True).frame
    frame.columns = [c.replace(" ", "_") for c in frame.columns[:-1]] + [LABEL]
    frame = frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)
    cut = int(len(frame) * (1 - test_fraction))
    return frame.iloc[:cut], frame.iloc[cut:]


class TabularArgs(ModelArguments):
    """The tabular model's arguments; process() adds the features and their statistics."""

    @classmethod
    def build_parser(cls) -> argparse.ArgumentParser:
        parser = super().build_parser()
        parser.set_defaults(epochs=60, batch_size=32, learning_rate=3e-3)
        parser.add_argument("--hidden", type=int, default=32, help="hidden units (default: 32)")
        parser.add_argument("--mode", choices=("spark", "tensorflow", "local"), default="spark")
        parser.add_argument("--nodes", type=int, default=2, help="TensorFlow nodes (default: 2)")
        parser.add_argument("--master", help="Spark master (default: an embedded local-cluster[2,1,1024])")
        parser.add_argument("--test-fraction", type=float, default=0.25)
        return parser

    def process(self) -> None:
        super().process()
        if self.hidden < 1:
            self.fail("hidden", "must be >= 1", self.hidden)
        if not 0 < self.test_fraction < 1:
            self.fail("test_fraction", "must be between 0 and 1", self.test_fraction)
        train, _ = load_table(self.test_fraction, self.seed)
        self.features = [c for c in train.columns if c != LABEL]
        self.mean = train[self.features].mean().to_numpy(np.float32).tolist()
        self.variance = train[self.features].var().to_numpy(np.float32).tolist()
        self.train_rows = len(train)
        if self.mode == "spark" and self.steps_per_epoch is None:
            self.steps_per_epoch = max(1, self.train_rows // self.batch_size)


class TabularBuilder(ModelBuilder):
    """A small MLP on the 30 columns: one named input per column, a 0/1 prediction served."""

    def build_input(self, source: str, batch: int, epochs: int | None, shuffle: bool) -> Any:
        import tensorflow as tf

        names = self.args.features

        def split(*columns: Any) -> Any:  # rows: (feature columns..., label), fed or read
            features = {name: tf.cast(column, tf.float32) for name, column in zip(names, columns)}
            return features, tf.cast(columns[-1], tf.float32)

        rows = self.rows(source).map(split)
        if shuffle:
            rows = rows.shuffle(1024, seed=self.args.seed)
        return rows.repeat(epochs).batch(batch)

    def build_inference(self, inputs: Any, training: bool | None) -> Any:
        import keras

        columns = [keras.layers.Reshape((1,))(inputs[name]) for name in self.args.features]
        x = keras.layers.Concatenate()(columns)
        x = keras.layers.Normalization(mean=self.args.mean, variance=self.args.variance)(x)
        x = keras.layers.Dense(self.args.hidden, activation="relu")(x)
        x = keras.layers.Dropout(0.2)(x)
        return keras.layers.Dense(1, name="logit")(x)

    def build_training(self, global_steps: int, inputs: Any, inferences: Any) -> tuple[Any, Any]:
        import keras

        return keras.losses.BinaryCrossentropy(from_logits=True), keras.optimizers.Adam(self.args.learning_rate)

    def build_evaluation(self, inputs: Any, outputs: Any) -> list[Any]:
        import keras

        return [keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0)]

    def build_output(self, inferences: Any) -> dict[str, Any]:
        import keras

        logit = keras.ops.squeeze(inferences, axis=-1)
        return {"probability": keras.ops.sigmoid(logit), "prediction": keras.ops.cast(logit > 0, "int64")}


def columns(frame: Any, features: Sequence[str]) -> tuple[np.ndarray, ...]:
    """A frame as a tuple of column arrays, the features then the label: the rows' layout."""
    return (*(frame[c].to_numpy(np.float32) for c in features), frame[LABEL].to_numpy(np.float32))


def main_fun(node_args: dict[str, Any], ctx: Any) -> None:
    """Every node (or this process, with ctx None): train the builder, write metrics.json."""
    from tfonspark import InputMode
    from tfonspark.tensorfx import ModelTrainer

    args = node_args["args"]
    train, test = load_table(args.test_fraction, args.seed)
    dataset = {"eval": columns(test, args.features)}
    if args.mode != "spark":
        dataset["train"] = columns(train, args.features)
    mode = InputMode.SPARK if args.mode == "spark" else InputMode.TENSORFLOW
    started = time.monotonic()
    result = ModelTrainer(ctx=ctx, input_mode=mode).train(TabularBuilder(args, dataset), node_args["job_dir"])
    if result.export_dir is not None:
        metrics = {"history": result.history, "node_seconds": time.monotonic() - started}
        with open(os.path.join(node_args["job_dir"], "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=1)


def train(sc: Any, args: TabularArgs, job_dir: str) -> float:
    """Train in ``args.mode`` (on ``sc``'s cluster unless local); return the seconds it took."""
    import tfonspark

    started = time.monotonic()
    node_args = {"args": args, "job_dir": job_dir}
    if args.mode == "local":
        main_fun(node_args, None)
        return time.monotonic() - started
    mode = tfonspark.InputMode.SPARK if args.mode == "spark" else tfonspark.InputMode.TENSORFLOW
    cluster = tfonspark.run(sc, main_fun, node_args, args.nodes, input_mode=mode, reservation_timeout=300)
    if args.mode == "spark":
        cluster.train(dataframe(sc, load_table(args.test_fraction, args.seed)[0]), num_epochs=args.epochs)
    cluster.shutdown(timeout=1800)
    return time.monotonic() - started


def dataframe(sc: Any, frame: Any) -> Any:
    """A pandas frame as a Spark DataFrame (double features, bigint label), two partitions."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    return spark.createDataFrame(frame.astype({LABEL: "int64"})).repartition(max(2, sc.defaultParallelism))


def test_accuracy(sc: Any, args: TabularArgs, job_dir: str) -> float:
    """TFModel serves ``<job_dir>/model`` on the test DataFrame: the share of right predictions."""
    from tfonspark.ml import TFModel

    test = dataframe(sc, load_table(args.test_fraction, args.seed)[1])
    model = (
        TFModel({})
        .setExportDir(os.path.join(job_dir, "model"))
        .setInputMapping({c: c for c in args.features})
        .setOutputMapping({"prediction": "prediction"})
    )
    rows = model.transform(test).select(LABEL, "prediction").collect()
    return float(np.mean([int(r[LABEL]) == int(np.ravel(r["prediction"])[0]) for r in rows]))


def main(argv: Sequence[str] | None = None) -> int:
    """Train in the chosen mode, then print the test accuracy TFModel measures."""
    from tfonspark.demo import spark_context, stop_spark

    args, job_dir = TabularArgs.parse(argv, parse_job=True)
    job_dir = os.path.abspath(job_dir)
    sc = spark_context(args.master, "tensorfx_tabular")
    try:
        seconds = train(sc, args, job_dir)
        accuracy = test_accuracy(sc, args, job_dir)
    finally:
        stop_spark(sc)
    print(
        f"test accuracy: {accuracy:.4f} (mode {args.mode}, {args.epochs} epochs, {seconds:.0f} s); model in {job_dir}/model"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
