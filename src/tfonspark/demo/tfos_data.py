"""MNIST in the layouts TFoS's ``mnist_data_setup.py`` writes, from local idx files.

TFoS examples read ``<output>/csv/{train,test}`` (text files of ``label,pixel0,...,pixel783``)
and ``<output>/tfr/{train,test}`` (TFRecords of tf.train.Example with int64 ``image`` (784) and
``label`` (1)). TFoS made them with ``tensorflow_datasets``, which downloads; this writes the
same files from the idx files a user already has (``load_mnist``), with no network::

    python -m tfonspark.demo.tfos_data --mnist /path/to/mnist --output data/mnist
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .datasets import load_mnist

__all__ = ["main", "write_tfos_mnist"]


def _csv_line(label: int, image: np.ndarray) -> str:
    return f"{label}," + ",".join(map(str, image.tolist()))


def write_tfos_mnist(
    sc: Any, mnist_dir: str | os.PathLike[str], output: str, *, num_partitions: int = 10, limit: int | None = None
) -> dict[str, int]:
    """Write ``csv/`` and ``tfr/`` train and test sets under ``output``; return rows per split.

    ``limit`` keeps the first ``limit`` rows of each split (for quick runs).
    """
    from pyspark.sql import SparkSession

    from ..data.tfrecord import save_tfrecords

    spark = SparkSession(sc)
    data = load_mnist(mnist_dir)
    counts = {}
    for split in ("train", "test"):
        images = getattr(data, f"{split}_images")[:limit].reshape(-1, 784)
        labels = getattr(data, f"{split}_labels")[:limit]
        rows = [(int(label), image) for label, image in zip(labels, images)]
        rdd = sc.parallelize(rows, num_partitions)
        rdd.map(lambda r: _csv_line(*r)).saveAsTextFile(os.path.join(output, "csv", split))
        frame = spark.createDataFrame(rdd.map(lambda r: (r[1].astype(np.int64).tolist(), [r[0]])), ["image", "label"])
        save_tfrecords(frame, os.path.join(output, "tfr", split))
        counts[split] = len(rows)
    return counts


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``--mnist DIR --output DIR [--num_partitions N] [--limit N]`` (local Spark)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mnist", required=True, help="directory of the four MNIST idx files (.gz or not)")
    parser.add_argument("--output", required=True, help="where csv/ and tfr/ go (must not exist yet)")
    parser.add_argument("--num_partitions", type=int, default=10)
    parser.add_argument("--limit", type=int, default=None, help="rows per split (default: all)")
    args = parser.parse_args(argv)
    from pyspark import SparkConf, SparkContext

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers import tfonspark too
    sc = SparkContext(conf=SparkConf().setMaster("local[2]").setAppName("tfos_mnist_data"))
    try:
        counts = write_tfos_mnist(sc, args.mnist, args.output, num_partitions=args.num_partitions, limit=args.limit)
    finally:
        sc.stop()
    print(f"wrote {counts} rows as csv/ and tfr/ under {args.output}")


if __name__ == "__main__":
    main()
