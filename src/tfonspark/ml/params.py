"""Spark ML Params of :class:`TFEstimator` and :class:`TFModel`, named and defaulted as in TFoS.

Each ``Has<Name>`` mixin declares one (or, for ``num_ps``, two) Params with TFoS's camel-case
setter and getter (``setInputMapping`` / ``getInputMapping``). Values are checked when they are
set: a bad value raises :class:`~tfonspark.errors.ConfigError` naming the Param, the value
received and what is valid. ``None`` is accepted everywhere (Spark ML skips the check for it) and
means "not given".

:class:`TFParams` merges the user's ``tf_args`` with every Param into one :class:`Namespace`:
that is the ``args`` a TFoS ``train_fn(args, ctx)`` receives.
"""

from __future__ import annotations

import argparse
import copy
import numbers
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from pyspark.ml.param import Param, Params, TypeConverters

from ..config import InputMode
from ..errors import ConfigError

__all__ = [
    "HasBatchSize",
    "HasClusterSize",
    "HasEpochs",
    "HasExportDir",
    "HasFeedTimeout",
    "HasGraceSecs",
    "HasInputMapping",
    "HasInputMode",
    "HasMasterNode",
    "HasMaxRestarts",
    "HasModelDir",
    "HasNumPS",
    "HasOutputMapping",
    "HasProtocol",
    "HasReaders",
    "HasSignatureDefKey",
    "HasSteps",
    "HasTFRecordDir",
    "HasTagSet",
    "HasTensorboard",
    "Namespace",
    "TFParams",
    "TFTypeConverters",
]

T = TypeVar("T")
#: Checks a value when it is set and returns it in the type the Param holds.
Converter = Callable[[Any], T]


# ---- converters: check a value when it is set -----------------------------------------------


def _mapping(name: str) -> Converter[dict[str, str]]:
    """A dict of str -> str (column -> tensor, or tensor -> column); copied so later edits don't leak."""

    def convert(value: Any) -> dict[str, str]:
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{name} must be a dict of str -> str. Received: {name}={value!r} ({type(value).__name__})"
            )
        bad = {k: v for k, v in value.items() if not isinstance(k, str) or not isinstance(v, str)}
        if bad:
            raise ConfigError(
                f"{name} must map strings to strings. Received: {name}={dict(value)!r} with non-string entries {bad!r}"
            )
        return dict(value)

    return convert


def _integer(name: str, minimum: int) -> Converter[int]:
    """An int >= ``minimum`` (bool refused although it is an int)."""

    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
            raise ConfigError(f"{name} must be an integer >= {minimum}. Received: {name}={value!r}")
        return int(value)

    return convert


def _seconds(name: str, *, positive: bool) -> Converter[float]:
    """A number of seconds (> 0 or >= 0), stored as float."""

    def convert(value: Any) -> float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not ok or (value <= 0 if positive else value < 0):
            bound = "> 0" if positive else ">= 0"
            raise ConfigError(f"{name} must be a number of seconds {bound}. Received: {name}={value!r}")
        return float(value)

    return convert


def _input_mode(value: Any) -> int:
    """InputMode.TENSORFLOW (0) or InputMode.SPARK (1), stored as a plain int (JSON-friendly)."""
    try:
        return int(InputMode(value))
    except (ValueError, TypeError):
        raise ConfigError(
            f"input_mode must be InputMode.TENSORFLOW (0) or InputMode.SPARK (1). Received: input_mode={value!r}"
        ) from None


def _master_node(value: Any) -> str:
    """``'chief'`` or ``'master'`` (None, for no chief, is accepted before conversion)."""
    if value not in ("chief", "master"):
        raise ConfigError(f"master_node must be 'chief', 'master' or None. Received: master_node={value!r}")
    return str(value)


def _string(name: str) -> Converter[str]:
    """A non-empty string."""

    def convert(value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{name} must be a non-empty string. Received: {name}={value!r}")
        return value

    return convert


class TFTypeConverters:
    """TFoS name: ``TFTypeConverters.toDict`` checks a dict Param value."""

    @staticmethod
    def toDict(value: Any) -> dict[str, str]:  # noqa: N802 (TFoS name)
        return _mapping("value")(value)


def _param(name: str, doc: str, converter: Converter[T]) -> Param[T]:
    """A Param holding ``converter``'s type, whose converter lets None through.

    Spark's ``Params.set`` converts None too; None means "not given". The getters of Params
    whose default is None say so (``str | None``); the others return the converter's type.
    """

    def convert(value: Any) -> Any:
        return None if value is None else converter(value)

    return Param(Params._dummy(), name, doc, typeConverter=convert)


# ---- one mixin per Param, TFoS names ---------------------------------------------------------


class HasBatchSize(Params):
    """``batch_size``: rows per batch (training feed in ``train_fn``; inference calls in TFModel)."""

    batch_size = _param("batch_size", "Number of records per batch", _integer("batch_size", 1))

    def setBatchSize(self, value: int) -> Any:  # noqa: N802
        return self._set(batch_size=value)

    def getBatchSize(self) -> int:  # noqa: N802
        return self.getOrDefault(self.batch_size)


class HasClusterSize(Params):
    """``cluster_size``: number of TensorFlow nodes (Spark executors) for training."""

    cluster_size = _param("cluster_size", "Number of nodes in the cluster", _integer("cluster_size", 1))

    def setClusterSize(self, value: int) -> Any:  # noqa: N802
        return self._set(cluster_size=value)

    def getClusterSize(self) -> int:  # noqa: N802
        return self.getOrDefault(self.cluster_size)


class HasEpochs(Params):
    """``epochs``: how many times the DataFrame is fed (InputMode.SPARK)."""

    epochs = _param("epochs", "Number of epochs to train", _integer("epochs", 1))

    def setEpochs(self, value: int) -> Any:  # noqa: N802
        return self._set(epochs=value)

    def getEpochs(self) -> int:  # noqa: N802
        return self.getOrDefault(self.epochs)


class HasFeedTimeout(Params):
    """``feed_timeout``: seconds a node may take no data before feeding fails (tfonspark)."""

    feed_timeout = _param(
        "feed_timeout",
        "Seconds a node may accept no data before the feed fails",
        _seconds("feed_timeout", positive=True),
    )

    def setFeedTimeout(self, value: float) -> Any:  # noqa: N802
        return self._set(feed_timeout=value)

    def getFeedTimeout(self) -> float:  # noqa: N802
        return self.getOrDefault(self.feed_timeout)


class HasMaxRestarts(Params):
    """``max_restarts``: restarts of the training cluster after a node failure (tfonspark; 0 = none)."""

    max_restarts = _param(
        "max_restarts",
        "Times the cluster is restarted after a node failure (train_fn resumes from its checkpoints)",
        _integer("max_restarts", 0),
    )

    def setMaxRestarts(self, value: int) -> Any:  # noqa: N802
        return self._set(max_restarts=value)

    def getMaxRestarts(self) -> int:  # noqa: N802
        return self.getOrDefault(self.max_restarts)


class HasGraceSecs(Params):
    """``grace_secs``: seconds to wait after the workers finished, before stopping the cluster."""

    grace_secs = _param(
        "grace_secs",
        "Number of seconds to wait after feeding data (for final tasks like exporting a saved_model)",
        _seconds("grace_secs", positive=False),
    )

    def setGraceSecs(self, value: float) -> Any:  # noqa: N802
        return self._set(grace_secs=value)

    def getGraceSecs(self) -> float:  # noqa: N802
        return self.getOrDefault(self.grace_secs)


class HasInputMapping(Params):
    """``input_mapping``: DataFrame column -> tensor name (feed names, or signature inputs)."""

    input_mapping = _param(
        "input_mapping", "Mapping of input DataFrame column to input tensor", _mapping("input_mapping")
    )

    def setInputMapping(self, value: Mapping[str, str]) -> Any:  # noqa: N802
        return self._set(input_mapping=value)

    def getInputMapping(self) -> dict[str, str]:  # noqa: N802
        return self.getOrDefault(self.input_mapping)


class HasInputMode(Params):
    """``input_mode``: InputMode.SPARK feeds the DataFrame; TENSORFLOW writes it as TFRecords."""

    input_mode = _param("input_mode", "Input data feeding mode (0=TENSORFLOW, 1=SPARK)", _input_mode)

    def setInputMode(self, value: int) -> Any:  # noqa: N802
        return self._set(input_mode=value)

    def getInputMode(self) -> int:  # noqa: N802
        return self.getOrDefault(self.input_mode)


class HasMasterNode(Params):
    """``master_node``: job name of the chief node (``'chief'``), or None for workers only."""

    master_node = _param("master_node", "Job name of master/chief worker node", _master_node)

    def setMasterNode(self, value: str | None) -> Any:  # noqa: N802
        return self._set(master_node=value)

    def getMasterNode(self) -> str | None:  # noqa: N802
        return self.getOrDefault(self.master_node)


class HasModelDir(Params):
    """``model_dir``: where ``train_fn`` keeps checkpoints (passed on in ``args``)."""

    model_dir = _param("model_dir", "Path to save/load model checkpoints", _string("model_dir"))

    def setModelDir(self, value: str) -> Any:  # noqa: N802
        return self._set(model_dir=value)

    def getModelDir(self) -> str | None:  # noqa: N802
        return self.getOrDefault(self.model_dir)


class HasNumPS(Params):
    """``num_ps`` and ``driver_ps_nodes``: parameter servers, and whether they run on the driver."""

    num_ps = _param("num_ps", "Number of PS nodes in cluster", _integer("num_ps", 0))
    driver_ps_nodes = Param(
        Params._dummy(), "driver_ps_nodes", "Run PS nodes on driver locally", typeConverter=TypeConverters.toBoolean
    )

    def setNumPS(self, value: int) -> Any:  # noqa: N802
        return self._set(num_ps=value)

    def getNumPS(self) -> int:  # noqa: N802
        return self.getOrDefault(self.num_ps)

    def setDriverPSNodes(self, value: bool) -> Any:  # noqa: N802
        return self._set(driver_ps_nodes=value)

    def getDriverPSNodes(self) -> bool:  # noqa: N802
        return self.getOrDefault(self.driver_ps_nodes)


class HasOutputMapping(Params):
    """``output_mapping``: signature output name -> new DataFrame column."""

    output_mapping = _param(
        "output_mapping", "Mapping of output tensor to output DataFrame column", _mapping("output_mapping")
    )

    def setOutputMapping(self, value: Mapping[str, str]) -> Any:  # noqa: N802
        return self._set(output_mapping=value)

    def getOutputMapping(self) -> dict[str, str]:  # noqa: N802
        return self.getOrDefault(self.output_mapping)


class HasProtocol(Params):
    """``protocol``: TFoS's network protocol (grpc|rdma); passed on in ``args`` only."""

    protocol = _param("protocol", "Network protocol for Tensorflow (grpc|rdma)", _string("protocol"))

    def setProtocol(self, value: str) -> Any:  # noqa: N802
        return self._set(protocol=value)

    def getProtocol(self) -> str:  # noqa: N802
        return self.getOrDefault(self.protocol)


class HasReaders(Params):
    """``readers``: number of reader threads (passed on in ``args``)."""

    readers = _param("readers", "number of reader/enqueue threads", _integer("readers", 1))

    def setReaders(self, value: int) -> Any:  # noqa: N802
        return self._set(readers=value)

    def getReaders(self) -> int:  # noqa: N802
        return self.getOrDefault(self.readers)


class HasSteps(Params):
    """``steps``: maximum number of training steps (passed on in ``args``)."""

    steps = _param("steps", "Maximum number of steps to train", _integer("steps", 0))

    def setSteps(self, value: int) -> Any:  # noqa: N802
        return self._set(steps=value)

    def getSteps(self) -> int:  # noqa: N802
        return self.getOrDefault(self.steps)


class HasTensorboard(Params):
    """``tensorboard``: start TensorBoard on the chief."""

    tensorboard = Param(
        Params._dummy(), "tensorboard", "Launch tensorboard process", typeConverter=TypeConverters.toBoolean
    )

    def setTensorboard(self, value: bool) -> Any:  # noqa: N802
        return self._set(tensorboard=value)

    def getTensorboard(self) -> bool:  # noqa: N802
        return self.getOrDefault(self.tensorboard)


class HasTFRecordDir(Params):
    """``tfrecord_dir``: where InputMode.TENSORFLOW writes the DataFrame as TFRecords."""

    tfrecord_dir = _param(
        "tfrecord_dir",
        "Path to temporarily export a DataFrame as TFRecords (for InputMode.TENSORFLOW apps)",
        _string("tfrecord_dir"),
    )

    def setTFRecordDir(self, value: str) -> Any:  # noqa: N802
        return self._set(tfrecord_dir=value)

    def getTFRecordDir(self) -> str | None:  # noqa: N802
        return self.getOrDefault(self.tfrecord_dir)


class HasExportDir(Params):
    """``export_dir``: the SavedModel directory (written by ``train_fn``, served by TFModel)."""

    export_dir = _param("export_dir", "Directory to export saved_model", _string("export_dir"))

    def setExportDir(self, value: str) -> Any:  # noqa: N802
        return self._set(export_dir=value)

    def getExportDir(self) -> str | None:  # noqa: N802
        return self.getOrDefault(self.export_dir)


class HasSignatureDefKey(Params):
    """``signature_def_key``: the SavedModel signature to serve (default ``serving_default``)."""

    signature_def_key = _param(
        "signature_def_key", "Identifier for a specific saved_model signature", _string("signature_def_key")
    )

    def setSignatureDefKey(self, value: str) -> Any:  # noqa: N802
        return self._set(signature_def_key=value)

    def getSignatureDefKey(self) -> str | None:  # noqa: N802
        return self.getOrDefault(self.signature_def_key)


class HasTagSet(Params):
    """``tag_set``: comma-separated tags of the MetaGraph to load (None: the only one)."""

    tag_set = _param("tag_set", "Comma-delimited list of tags identifying a saved_model metagraph", _string("tag_set"))

    def setTagSet(self, value: str) -> Any:  # noqa: N802
        return self._set(tag_set=value)

    def getTagSet(self) -> str | None:  # noqa: N802
        return self.getOrDefault(self.tag_set)


# ---- args: tf_args merged with the Params ----------------------------------------------------


class Namespace:
    """Attribute access to TF arguments (TFoS ``pipeline.Namespace``).

    Built from a dict, an ``argparse.Namespace``, another Namespace, or None (empty). A list is
    taken as an argv: kept in ``.argv`` and handed to ``train_fn`` as that list, as in TFoS.
    ``'name' in ns`` and iteration work on the argument names (or the argv items).
    """

    argv: list[str] | None = None

    def __init__(self, d: Any = None) -> None:
        if d is None:
            return
        if isinstance(d, list):
            self.argv = list(d)
        elif isinstance(d, Mapping):
            self.__dict__.update(d)
        elif isinstance(d, (argparse.Namespace, Namespace)):
            self.__dict__.update(copy.copy(vars(d)))
        else:
            raise ConfigError(
                "tf_args must be a dict, an argparse.Namespace, a Namespace, an argv "
                f"list or None. Received: {type(d).__name__}"
            )

    def __getattr__(self, name: str) -> Any:
        """Only reached for a missing argument: say which arguments there are."""
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"args has no {name!r}; it has {sorted(self.__dict__)}")

    def __setattr__(self, name: str, value: Any) -> None:  # any argument name may be set
        object.__setattr__(self, name, value)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.argv) if self.argv else iter(list(self.__dict__))

    def __contains__(self, item: object) -> bool:
        return item in (self.argv if self.argv else self.__dict__)

    def __eq__(self, other: object) -> bool:
        if self.argv:
            return self.argv == (other.argv if isinstance(other, Namespace) else other)
        return isinstance(other, (Namespace, argparse.Namespace)) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        if self.argv:
            return repr(self.argv)
        items = ", ".join(f"{k}={v!r}" for k, v in sorted(self.__dict__.items()))
        return f"{type(self).__name__}({items})"

    def to_dict(self) -> dict[str, Any]:
        """The arguments as a plain dict (``{'argv': [...]}`` for an argv)."""
        return {"argv": list(self.argv)} if self.argv else dict(self.__dict__)


class TFParams(Params):
    """Holds ``tf_args`` next to the Spark ML Params and merges them (TFoS ``TFParams``)."""

    args: Namespace = Namespace()

    def merge_args_params(self) -> Namespace:
        """A copy of ``tf_args`` with every Param's value set as an attribute of the same name.

        Params win over ``tf_args`` keys of the same name, as in TFoS.
        """
        merged = Namespace(self.args)
        for param in self.params:
            if self.hasDefault(param) or self.isSet(param):
                setattr(merged, param.name, self.getOrDefault(param))
        return merged
