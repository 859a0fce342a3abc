"""Data sources for TensorFlow on Spark; each has its own door, this package re-exports none.

- :mod:`tfonspark.data.tfrecord`: TFRecord files <-> DataFrames (no JVM jar needed).

TFoS programs keep ``dfutil.saveAsTFRecords``/``loadTFRecords`` through :mod:`tfonspark.dfutil`.
"""

from __future__ import annotations

__all__: list[str] = []
