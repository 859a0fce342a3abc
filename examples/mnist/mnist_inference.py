"""Parallel batch inference with an exported SavedModel; predictions written as Parquet.

    python examples/mnist/mnist_inference.py --data /path/to/mnist \\
        --export-dir mnist_output/export --output mnist_output/predictions

The driver turns the test (or training) idx files into a DataFrame ``id, image array<float>,
label``; :func:`pyspark.ml.functions.predict_batch_udf` then runs the model on every executor in
batches of ``--batch-size``: each Spark Python worker loads the SavedModel once and keeps it
for all the partitions it serves. The result, one row per input row (``id``, ``label``,
``prediction``, ``confidence``), is written to ``--output`` as Parquet; the driver reads it
back and prints the row count and the accuracy. ``--export-dir`` is what ``mnist_tf.py`` or
``mnist_spark.py`` wrote (``<output-dir>/export``) and must be readable by every executor.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        default=os.environ.get("TFONSPARK_DATA"),
        help="directory of the MNIST idx files (default: $TFONSPARK_DATA)",
    )
    parser.add_argument(
        "--split", choices=("test", "train"), default="test", help="which images to label (default: test)"
    )
    parser.add_argument("--max-rows", type=int, help="label only the first N images")
    parser.add_argument(
        "--export-dir", default="mnist_output/export", help="the SavedModel (default: ./mnist_output/export)"
    )
    parser.add_argument(
        "--output",
        default="mnist_output/predictions",
        help="Parquet output directory, replaced if it exists (default: ./mnist_output/predictions)",
    )
    parser.add_argument(
        "--master", help="Spark master URL (default: spark-submit's, else an embedded local-cluster[2,1,1024])"
    )
    parser.add_argument("--batch-size", type=int, default=1000, help="rows per model call (default: 1000)")
    args = parser.parse_args(argv)
    if not args.data:
        parser.error("--data is required (or set TFONSPARK_DATA)")
    args.export_dir = os.path.abspath(args.export_dir)
    args.output = os.path.abspath(args.output)
    return args


def make_predict_fn(export_dir: str) -> Callable[[], Callable[[np.ndarray], dict[str, Any]]]:
    """For predict_batch_udf: loads the SavedModel (once per Python worker) and returns
    ``predict(images) -> {"prediction", "confidence"}``."""

    def make() -> Callable[[np.ndarray], dict[str, Any]]:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        model = tf.saved_model.load(export_dir)  # keep the object: it owns the variables

        def predict(images: np.ndarray) -> dict[str, Any]:
            logits = model.serve(tf.constant(images, tf.float32)).numpy()
            probabilities = tf.nn.softmax(logits).numpy()
            return {
                "prediction": np.argmax(logits, axis=1).astype(np.int64),
                "confidence": probabilities.max(axis=1).astype(np.float32),
            }

        return predict

    return make


def predict(df: Any, width: int, export_dir: str, batch_size: int) -> Any:
    """``df`` (``id``, ``image`` of ``width`` floats, ``label``) with ``prediction`` and
    ``confidence`` columns."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    result = T.StructType([T.StructField("prediction", T.LongType()), T.StructField("confidence", T.FloatType())])
    classify = predict_batch_udf(
        make_predict_fn(export_dir), return_type=result, batch_size=batch_size, input_tensor_shapes=[[width]]
    )
    return df.withColumn("out", classify("image")).select(
        "id", "label", F.col("out.prediction"), F.col("out.confidence")
    )


def load_images(spark: Any, args: argparse.Namespace) -> tuple[Any, int]:
    """The chosen split as a DataFrame ``id``, ``image``, ``label`` (ids in file order), and
    the number of values in an image."""
    from pyspark.sql import functions as F

    from tfonspark.demo import images_to_dataframe
    from tfonspark.demo.datasets import load_mnist

    data = load_mnist(args.data)
    images = getattr(data, f"{args.split}_images")[: args.max_rows]
    labels = getattr(data, f"{args.split}_labels")[: args.max_rows]
    df = images_to_dataframe(spark, images, labels, seed=None)  # keep the file order
    width = images.shape[1] * images.shape[2]
    return df.select(F.monotonically_increasing_id().alias("id"), "image", "label"), width


def main(argv: Sequence[str] | None = None) -> int:
    """Label the images, write Parquet, print rows and accuracy."""
    from pyspark.sql import SparkSession

    from tfonspark.demo import spark_context, stop_spark

    args = parse_args(argv)
    sc = spark_context(args.master, "mnist_inference")
    try:
        spark = SparkSession.builder.getOrCreate()
        df, width = load_images(spark, args)
        labelled = predict(df, width, args.export_dir, args.batch_size)
        labelled.write.mode("overwrite").parquet(args.output)
        rows, correct = spark.read.parquet(args.output).selectExpr("count(*)", "count_if(prediction = label)").first()
    finally:
        stop_spark(sc)
    print(f"wrote {rows} predictions to {args.output}; accuracy {correct / max(rows, 1):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
