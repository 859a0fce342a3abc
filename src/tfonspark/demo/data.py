"""Images as the demo's features: flat float32 rows, Spark DataFrames, per-node shards."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["images_to_dataframe", "limit_rows", "shard", "to_features"]


def to_features(images: np.ndarray) -> np.ndarray:
    """uint8 images (N x rows x cols) as float32 rows (N x rows*cols) in [0, 1]."""
    return (images.reshape(len(images), -1).astype(np.float32)) / np.float32(255.0)


def limit_rows(
    images: np.ndarray, labels: np.ndarray, max_rows: int | None, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_rows`` examples, drawn at random (so every class stays represented)."""
    if max_rows is None or max_rows >= len(images):
        return images, labels
    if max_rows < 1:
        raise ConfigError(f"max_rows must be >= 1. Received: max_rows={max_rows!r}")
    keep = np.sort(np.random.default_rng(seed).permutation(len(images))[:max_rows])
    return images[keep], labels[keep]


def shard(array: np.ndarray, index: int, count: int) -> np.ndarray:
    """Rows ``index, index + count, ...``: this node's part when ``count`` nodes split the data."""
    if not 0 <= index < count:
        raise ConfigError(f"shard index must be in [0, {count}). Received: index={index!r}")
    return array[index::count]


def images_to_dataframe(
    spark: Any,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    num_partitions: int | None = None,
    seed: int | None = 0,
) -> Any:
    """A DataFrame ``image array<float>`` (flat, in [0, 1]) + ``label bigint``, built via Arrow.

    Rows are shuffled once with ``seed`` (None keeps the order), so that every partition holds
    every class. ``num_partitions`` defaults to Spark's default parallelism.
    """
    import pyarrow as pa

    if len(images) != len(labels):
        raise ConfigError(
            f"images and labels must have the same length. Received: {len(images)} images, {len(labels)} labels"
        )
    order = np.random.default_rng(seed).permutation(len(images)) if seed is not None else None
    if order is not None:
        images, labels = images[order], labels[order]
    features = to_features(images)
    width = features.shape[1]
    offsets = pa.array(np.arange(0, features.size + 1, width, dtype=np.int32))
    table = pa.table(
        {
            "image": pa.ListArray.from_arrays(offsets, pa.array(features.reshape(-1))),
            "label": pa.array(labels.astype(np.int64)),
        }
    )
    df = _arrow_dataframe(spark, table)
    parts = num_partitions or spark.sparkContext.defaultParallelism
    return df if df.rdd.getNumPartitions() == parts else df.repartition(parts)


def _arrow_dataframe(spark: Any, table: Any) -> Any:
    """``createDataFrame`` from an Arrow table (Spark 4), or from pandas on Spark 3.5."""
    try:
        return spark.createDataFrame(table)
    except TypeError:
        return spark.createDataFrame(table.to_pandas(), "image array<float>, label bigint")
