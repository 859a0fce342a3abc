"""Spark ML persistence (``save``/``load``, inside a ``Pipeline`` too) for TFEstimator and TFModel.

The standard ``metadata`` file of Spark ML holds the Params; what is not a Param travels in the
same JSON as extra fields:

* ``tf_args``: as JSON when it is JSON-serializable, else cloudpickled (base64);
* ``train_fn`` / ``export_fn`` of an estimator: cloudpickled (base64). Functions from importable
  modules are stored by reference, others (notebooks, ``__main__``) by value.

Loading a saved *estimator* unpickles its functions, which runs code: only load estimators from
places you trust. A saved TFModel with JSON ``tf_args`` holds no pickle. The SavedModel itself is
not copied: a TFModel stores ``export_dir``, which must still hold the model when it is used.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from ..errors import ConfigError
from .params import Namespace

__all__ = [
    "TFPersistence",
    "decode_args",
    "decode_function",
    "encode_args",
    "encode_function",
]


def _pickle(value: Any) -> str:
    from pyspark import cloudpickle

    return base64.b64encode(cloudpickle.dumps(value)).decode("ascii")


def _unpickle(text: str) -> Any:
    import pickle

    return pickle.loads(base64.b64decode(text))


def encode_args(args: Namespace) -> dict[str, Any]:
    """``tf_args`` as ``{"json": ...}`` when JSON can hold it, else ``{"pickle": base64}``."""
    value = args.to_dict()
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        return {"pickle": _pickle(value)}
    return {"json": value}


def decode_args(encoded: dict[str, Any] | None) -> Namespace:
    """The Namespace :func:`encode_args` wrote (an argv list comes back as an argv)."""
    if not encoded:
        return Namespace()
    value = encoded["json"] if "json" in encoded else _unpickle(encoded["pickle"])
    if set(value) == {"argv"}:
        return Namespace(list(value["argv"]))
    return Namespace(value)


def encode_function(fn: Any) -> str | None:
    """A function cloudpickled to base64 text (None stays None)."""
    return None if fn is None else _pickle(fn)


def decode_function(text: str | None) -> Any:
    """The function :func:`encode_function` wrote."""
    return None if text is None else _unpickle(text)


class _Writer(DefaultParamsWriter):
    """Writes the Params metadata plus the instance's ``_extra_metadata()``."""

    def saveImpl(self, path: str) -> None:  # noqa: N802 (Spark name)
        extra = self.instance._extra_metadata()  # type: ignore[attr-defined]
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession, extraMetadata=extra)


class _Reader(DefaultParamsReader):
    """Rebuilds an instance with ``cls._from_metadata`` and restores its uid and Params."""

    def load(self, path: str) -> Any:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        expected = f"{self.cls.__module__}.{self.cls.__name__}"
        if metadata["class"] != expected:
            raise ConfigError(f"{path!r} holds a saved {metadata['class']}, not a {expected}; load it "
                              "with that class (or pyspark.ml.Pipeline(Model).load for a pipeline)")
        instance = self.cls._from_metadata(metadata)  # type: ignore[attr-defined]
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        return instance


class TFPersistence(MLWritable, MLReadable[Any]):
    """``write()``/``read()`` for classes with ``_extra_metadata()`` and ``_from_metadata()``."""

    def write(self) -> MLWriter:
        """A writer: ``model.write().overwrite().save(path)``."""
        return _Writer(self)  # type: ignore[arg-type]

    @classmethod
    def read(cls) -> MLReader[Any]:
        """A reader: ``TFModel.read().load(path)`` (``TFModel.load(path)`` for short)."""
        return _Reader(cls)  # type: ignore[arg-type]
