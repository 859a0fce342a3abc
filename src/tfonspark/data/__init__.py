"""Data sources for TensorFlow on Spark: TFRecord files <-> DataFrames (no JVM jar needed)."""

from __future__ import annotations

from .tfrecord import (
    crc32c,
    infer_schema,
    is_loaded_df,
    isLoadedDF,
    load_tfrecords,
    loaded_dfs,
    loaded_from,
    loadTFRecords,
    masked_crc32c,
    read_tfrecord_file,
    save_tfrecords,
    saveAsTFRecords,
    write_tfrecord_file,
)

__all__ = [
    "crc32c",
    "infer_schema",
    "isLoadedDF",
    "is_loaded_df",
    "loadTFRecords",
    "load_tfrecords",
    "loaded_dfs",
    "loaded_from",
    "masked_crc32c",
    "read_tfrecord_file",
    "saveAsTFRecords",
    "save_tfrecords",
    "write_tfrecord_file",
]
