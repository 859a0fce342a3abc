"""tfonspark: distributed TensorFlow training and inference on Apache Spark."""

from __future__ import annotations

from . import errors

__version__ = "0.1.0"

__all__ = ["__version__", "errors"]
