"""SavedModel inference on a DataFrame: ``TFModel.transform`` vs ``predict_batch_udf``.

Both variants serve the same Keras 3 SavedModel (an MLP exported with
``TFNode.export_saved_model``) on the same cached DataFrame (``id long, features array<float>``)
on one fresh ``local-cluster[2,1,1024]`` (two executor JVMs), with the same batch size, and keep
every input column:

- ``tfmodel``: ``tfonspark.ml.TFModel(...).transform(df)`` (a scalar-iterator Arrow UDF on
  Spark >= 4.1: Arrow arrays straight to numpy; model cached per Python worker);
- ``udf``: ``df.withColumn("pred", predict_batch_udf(make_predict_fn, ...)("features"))``
  (Spark's own batched inference: a pandas UDF; model cached per Python worker).

The predictions of both variants are compared first; then each variant runs once untimed
(Python workers import TensorFlow and load the model); then the variants alternate for
``--reps`` repetitions (order rotated every repetition), every run writing all rows to Spark's
``noop`` sink. Prints rows/s per run, the medians and their ratio, and a Markdown table. The
machine's load average is printed too: on a shared machine, compare ratios, not absolute rates.

    python benchmarks/inference_tfmodel.py             # defaults: about 2-3 minutes on 2 cores
    python benchmarks/inference_tfmodel.py --rows 50000 --width 784 --reps 3   # MNIST-wide rows
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

MASTER = "local-cluster[2,1,1024]"


def export_model(path: str, width: int, hidden: int) -> str:
    """An MLP ``width -> hidden (relu) -> 1`` with a scalar output, exported as a SavedModel."""
    import keras

    from tfonspark import TFNode

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((width,), name="features"),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(1),
            keras.layers.Reshape(()),
        ]
    )
    TFNode.export_saved_model(model, path)
    return path


def make_frame(spark: Any, rows: int, width: int, partitions: int) -> Any:
    """A cached DataFrame ``id long, features array<float>`` with deterministic values."""
    from pyspark.sql import functions as F

    features = F.array(*[F.rand(seed=i).cast("float") for i in range(width)]).alias("features")
    df = spark.range(0, rows, numPartitions=partitions).select("id", features).cache()
    if df.count() != rows:
        raise RuntimeError("the cached DataFrame lost rows")
    return df


def tfmodel_variant(export_dir: str, batch_size: int) -> Callable[[Any], Any]:
    """``df -> df + pred`` with TFModel."""
    from tfonspark.ml import TFModel

    model = (
        TFModel()
        .setExportDir(export_dir)
        .setInputMapping({"features": "features"})
        .setOutputMapping({"output_0": "pred"})
        .setBatchSize(batch_size)
    )
    return model.transform


def udf_variant(export_dir: str, batch_size: int, width: int) -> Callable[[Any], Any]:
    """``df -> df + pred`` with pyspark.ml.functions.predict_batch_udf on the same signature."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import FloatType

    def make_predict_fn() -> Callable[[np.ndarray], np.ndarray]:
        import tensorflow as tf

        signature = tf.saved_model.load(export_dir).signatures["serving_default"]

        def predict(features: np.ndarray) -> np.ndarray:
            return signature(features=tf.constant(features, tf.float32))["output_0"].numpy()

        return predict

    udf = predict_batch_udf(
        make_predict_fn, return_type=FloatType(), batch_size=batch_size, input_tensor_shapes=[[width]]
    )
    return lambda df: df.withColumn("pred", udf("features"))


@contextlib.contextmanager
def stage(label: str) -> Iterator[None]:
    """Say on stderr how long a set-up step took (stdout stays the report)."""
    start = time.perf_counter()
    yield
    print(f"# {label}: {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)


def run_once(transform: Callable[[Any], Any], df: Any) -> float:
    """Seconds to compute every row of ``transform(df)`` into the noop sink."""
    start = time.perf_counter()
    transform(df).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def check_same_predictions(variants: dict[str, Callable[[Any], Any]], df: Any) -> None:
    """Both variants must predict the same values (rows with id < 200).

    A filter, not ``orderBy().limit()``: no sort of the whole frame, and every Python worker
    reads its input to the end (Spark does not reuse a worker stopped mid-stream).
    """
    sample = df.where("id < 200")
    preds = {
        name: np.array([r.pred for r in sorted(fn(sample).select("id", "pred").collect())])
        for name, fn in variants.items()
    }
    first, second = preds.values()
    np.testing.assert_allclose(first, second, rtol=1e-5, atol=1e-5)


def report(args: argparse.Namespace, times: dict[str, list[float]]) -> None:
    """rows/s per run, medians, the ratio, and a Markdown table."""
    rates = {name: [args.rows / t for t in runs] for name, runs in times.items()}
    medians = {name: statistics.median(r) for name, r in rates.items()}
    print(
        f"\n# {args.rows:,} rows x {args.width} floats, {args.partitions} partitions, batch_size "
        f"{args.batch_size}, {args.reps} reps, {MASTER}; load average {os.getloadavg()[0]:.2f}"
    )
    for name, r in rates.items():
        print(f"{name:8s} rows/s per run: {', '.join(f'{x:,.0f}' for x in r)}  median {medians[name]:,.0f}")
    ratio = medians["tfmodel"] / medians["udf"]
    print(f"ratio TFModel.transform / predict_batch_udf (median rows/s): {ratio:.2f}x\n")
    print("| variant | median rows/s | runs (s) |")
    print("|---|---|---|")
    labels = {"tfmodel": "TFModel.transform", "udf": "predict_batch_udf"}
    for name in ("tfmodel", "udf"):
        runs = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"| {labels[name]} | {medians[name]:,.0f} | {runs} |")
    print(f"| ratio | {ratio:.2f}x | |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--width", type=int, default=32, help="features per row")
    parser.add_argument("--hidden", type=int, default=64, help="hidden units of the MLP")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions (>= 2)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20,000 rows, 2 repetitions")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.reps = 20_000, 2
    if args.reps < 2:
        parser.error(f"--reps must be >= 2. Received: {args.reps}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from pyspark.sql import SparkSession

    from tfonspark.testing import SparkManager

    manager = SparkManager.instance()
    manager.stop()
    try:
        with stage("start Spark"):
            manager.get(MASTER)
        spark = SparkSession.builder.getOrCreate()
        with stage("export the model"):
            export_dir = export_model(
                os.path.join(tempfile.mkdtemp(prefix="tfos-bench-"), "mlp"), args.width, args.hidden
            )
        with stage("cache the DataFrame"):
            df = make_frame(spark, args.rows, args.width, args.partitions)
        variants = {
            "tfmodel": tfmodel_variant(export_dir, args.batch_size),
            "udf": udf_variant(export_dir, args.batch_size, args.width),
        }
        with stage("compare predictions"):
            check_same_predictions(variants, df)
        for name, fn in variants.items():  # warm-up: TF import and model load in the workers
            print(f"# warm-up {name}: {run_once(fn, df):.1f}s", file=sys.stderr, flush=True)
        times: dict[str, list[float]] = {name: [] for name in variants}
        order = list(variants)
        for rep in range(args.reps):
            for name in order[rep % 2 :] + order[: rep % 2]:
                seconds = run_once(variants[name], df)
                times[name].append(seconds)
                print(
                    f"# rep {rep + 1} {name}: {seconds:.2f}s ({args.rows / seconds:,.0f} rows/s)",
                    file=sys.stderr,
                    flush=True,
                )
        report(args, times)
    finally:
        manager.stop()


if __name__ == "__main__":
    main()
