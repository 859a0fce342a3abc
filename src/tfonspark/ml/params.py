"""Spark ML Params of :class:`TFEstimator` and :class:`TFModel`, named and defaulted as in TFoS.

Each ``Has<Name>`` mixin holds one (``HasNumPS``: two) Params with TFoS's camel-case setter and
getter (``setInputMapping`` / ``getInputMapping``). Values are checked when they are set: a bad
value raises :class:`~tfonspark.errors.ConfigError` naming the Param, the value received and what
is valid. ``None`` is accepted everywhere (Spark ML skips the check for it) and means "not given".
Defaults are set by the stage that mixes the Params in (``ESTIMATOR_DEFAULTS``, ``MODEL_DEFAULTS``).

Each Param is declared once, by one line in its mixin::

    batch_size, setBatchSize, getBatchSize = _has("batch_size", "Number of records per batch", _integer(1))

:func:`_has` builds the Param (name, doc, converter) and its setter and getter, typed from the
check (``_integer(1)`` takes and returns ``int``). The mixins stay ``class`` statements, rather
than classes a factory makes from a table (as Spark's ``_shared_params_code_gen.py`` generates
its shared Params), so that mypy sees every Param, setter and getter with its type without a
second, hand-kept stub block; pyspark finds the Params as class attributes (via ``dir()``) as
before. The names on the left must follow the ``set<Name>``/``get<Name>`` convention; the unit
tests check them against the class name.

:class:`TFParams` merges the user's ``tf_args`` with every Param into one :class:`Namespace`:
that is the ``args`` a TFoS ``train_fn(args, ctx)`` receives.
"""

from __future__ import annotations

import argparse
import copy
import numbers
from collections.abc import Callable, Iterator, Mapping
from types import FunctionType
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

S = TypeVar("S")
T = TypeVar("T")
_P = TypeVar("_P", bound="TFParams")
#: Checks a value when it is set and returns it in the type the Param holds.
Converter = Callable[[Any], T]
#: ``check(param_name, value)``: the value in the Param's type, or ConfigError naming the Param.
#: ``S`` is what the setter takes, ``T`` what the getter returns.
_Check = Callable[[str, S], T]
_Setter = Callable[[Params, S], Any]
_Getter = Callable[[Params], T]


# ---- checks: a value, when it is set ---------------------------------------------------------


def _mapping(name: str, value: Mapping[str, str]) -> dict[str, str]:
    """A dict of str -> str (column -> tensor, or tensor -> column); copied so later edits don't leak."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be a dict of str -> str. Received: {name}={value!r} ({type(value).__name__})")
    bad = {k: v for k, v in value.items() if not isinstance(k, str) or not isinstance(v, str)}
    if bad:
        raise ConfigError(
            f"{name} must map strings to strings. Received: {name}={dict(value)!r} with non-string entries {bad!r}"
        )
    return dict(value)


def _integer(minimum: int) -> _Check[int, int]:
    """An int >= ``minimum`` (bool refused although it is an int)."""

    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
            raise ConfigError(f"{name} must be an integer >= {minimum}. Received: {name}={value!r}")
        return int(value)

    return check


def _seconds(*, positive: bool) -> _Check[float, float]:
    """A number of seconds (> 0 or >= 0), stored as float."""

    def check(name: str, value: Any) -> float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not ok or (value <= 0 if positive else value < 0):
            bound = "> 0" if positive else ">= 0"
            raise ConfigError(f"{name} must be a number of seconds {bound}. Received: {name}={value!r}")
        return float(value)

    return check


def _input_mode(name: str, value: int) -> int:
    """InputMode.TENSORFLOW (0) or InputMode.SPARK (1), stored as a plain int (JSON-friendly)."""
    try:
        return int(InputMode(value))
    except (ValueError, TypeError):
        raise ConfigError(
            f"{name} must be InputMode.TENSORFLOW (0) or InputMode.SPARK (1). Received: {name}={value!r}"
        ) from None


def _master_node(name: str, value: str | None) -> str | None:
    """``'chief'`` or ``'master'`` (None, for no chief, is accepted before the check)."""
    if value not in ("chief", "master"):
        raise ConfigError(f"{name} must be 'chief', 'master' or None. Received: {name}={value!r}")
    return str(value)


def _string(name: str, value: str) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name} must be a non-empty string. Received: {name}={value!r}")
    return value


#: :func:`_string` for a Param whose default is None ("not given"): its getter says ``str | None``.
_string_or_none: _Check[str, str | None] = _string


class TFTypeConverters:
    """TFoS name: ``TFTypeConverters.toDict`` checks a dict Param value."""

    @staticmethod
    def toDict(value: Any) -> dict[str, str]:  # noqa: N802 (TFoS name)
        return _mapping("value", value)


# ---- the factory: one Param with its setter and getter ---------------------------------------


def _has(name: str, doc: str, check: _Check[S, T]) -> tuple[Param[T], _Setter[S], _Getter[T]]:
    """The Param ``name`` checked by ``check`` (None let through: "not given"), its setter and getter.

    Spark's ``Params.set`` converts None too, hence the converter lets it through itself.
    """

    def convert(value: Any) -> Any:
        return None if value is None else check(name, value)

    return _accessors(Param(Params._dummy(), name, doc, typeConverter=convert))


def _has_flag(name: str, doc: str) -> tuple[Param[bool], _Setter[bool], _Getter[bool]]:
    """A boolean Param with Spark's own converter, as in TFoS (a non-bool raises TypeError)."""
    return _accessors(Param(Params._dummy(), name, doc, typeConverter=TypeConverters.toBoolean))


def _accessors(param: Param[T]) -> tuple[Param[T], _Setter[Any], _Getter[T]]:
    """``param`` with a chaining setter and a getter; they are named by :func:`_name_accessors`."""
    name = param.name

    def setter(self: Params, value: Any) -> Any:
        return self._set(**{name: value})

    def getter(self: Params) -> T:
        value: T = self.getOrDefault(name)
        return value

    _PARAM_OF_SETTER[setter] = name
    setter.__doc__ = f"Sets ``{name}``: {param.doc}."
    getter.__doc__ = f"``{name}``: {param.doc} (its default when not set)."
    return param, setter, getter


#: setter function -> the name of the Param it sets (filled by :func:`_accessors`)
_PARAM_OF_SETTER: dict[Callable[..., Any], str] = {}
#: Param name -> its setter's name (``batch_size`` -> ``setBatchSize``), for messages
_SETTER_NAMES: dict[str, str] = {}


def _name_accessors(*mixins: type[Params]) -> None:
    """Give each mixin's setters and getters their attribute names (tracebacks, help, pickle)."""
    for mixin in mixins:
        for attr, value in vars(mixin).items():
            if isinstance(value, FunctionType) and value.__name__ in ("setter", "getter"):
                value.__name__, value.__qualname__ = attr, f"{mixin.__qualname__}.{attr}"
                if value in _PARAM_OF_SETTER:
                    _SETTER_NAMES[_PARAM_OF_SETTER[value]] = attr


# ---- one mixin per Param, TFoS names ---------------------------------------------------------


class HasBatchSize(Params):
    """``batch_size``: rows per batch (training feed in ``train_fn``; inference calls in TFModel)."""

    batch_size, setBatchSize, getBatchSize = _has("batch_size", "Number of records per batch", _integer(1))


class HasClusterSize(Params):
    """``cluster_size``: number of TensorFlow nodes (Spark executors) for training."""

    cluster_size, setClusterSize, getClusterSize = _has("cluster_size", "Number of nodes in the cluster", _integer(1))


class HasEpochs(Params):
    """``epochs``: how many times the DataFrame is fed (InputMode.SPARK)."""

    epochs, setEpochs, getEpochs = _has("epochs", "Number of epochs to train", _integer(1))


class HasFeedTimeout(Params):
    """``feed_timeout``: seconds a node may take no data before feeding fails (tfonspark)."""

    feed_timeout, setFeedTimeout, getFeedTimeout = _has(
        "feed_timeout", "Seconds a node may accept no data before the feed fails", _seconds(positive=True)
    )


class HasMaxRestarts(Params):
    """``max_restarts``: restarts of the training cluster after a node failure (tfonspark; 0 = none)."""

    max_restarts, setMaxRestarts, getMaxRestarts = _has(
        "max_restarts",
        "Times the cluster is restarted after a node failure (train_fn resumes from its checkpoints)",
        _integer(0),
    )


class HasGraceSecs(Params):
    """``grace_secs``: seconds to wait after the workers finished, before stopping the cluster."""

    grace_secs, setGraceSecs, getGraceSecs = _has(
        "grace_secs",
        "Number of seconds to wait after feeding data (for final tasks like exporting a saved_model)",
        _seconds(positive=False),
    )


class HasInputMapping(Params):
    """``input_mapping``: DataFrame column -> tensor name (feed names, or signature inputs)."""

    input_mapping, setInputMapping, getInputMapping = _has(
        "input_mapping", "Mapping of input DataFrame column to input tensor", _mapping
    )


class HasInputMode(Params):
    """``input_mode``: InputMode.SPARK feeds the DataFrame; TENSORFLOW writes it as TFRecords."""

    input_mode, setInputMode, getInputMode = _has(
        "input_mode", "Input data feeding mode (0=TENSORFLOW, 1=SPARK)", _input_mode
    )


class HasMasterNode(Params):
    """``master_node``: job name of the chief node (``'chief'``), or None for workers only."""

    master_node, setMasterNode, getMasterNode = _has(
        "master_node", "Job name of master/chief worker node", _master_node
    )


class HasModelDir(Params):
    """``model_dir``: where ``train_fn`` keeps checkpoints (passed on in ``args``)."""

    model_dir, setModelDir, getModelDir = _has("model_dir", "Path to save/load model checkpoints", _string_or_none)


class HasNumPS(Params):
    """``num_ps`` and ``driver_ps_nodes``: parameter servers, and whether they run on the driver."""

    num_ps, setNumPS, getNumPS = _has("num_ps", "Number of PS nodes in cluster", _integer(0))
    driver_ps_nodes, setDriverPSNodes, getDriverPSNodes = _has_flag("driver_ps_nodes", "Run PS nodes on driver locally")


class HasOutputMapping(Params):
    """``output_mapping``: signature output name -> new DataFrame column."""

    output_mapping, setOutputMapping, getOutputMapping = _has(
        "output_mapping", "Mapping of output tensor to output DataFrame column", _mapping
    )


class HasProtocol(Params):
    """``protocol``: TFoS's network protocol (grpc|rdma); passed on in ``args`` only."""

    protocol, setProtocol, getProtocol = _has("protocol", "Network protocol for Tensorflow (grpc|rdma)", _string)


class HasReaders(Params):
    """``readers``: number of reader threads (passed on in ``args``)."""

    readers, setReaders, getReaders = _has("readers", "number of reader/enqueue threads", _integer(1))


class HasSteps(Params):
    """``steps``: maximum number of training steps (passed on in ``args``)."""

    steps, setSteps, getSteps = _has("steps", "Maximum number of steps to train", _integer(0))


class HasTensorboard(Params):
    """``tensorboard``: start TensorBoard on the chief."""

    tensorboard, setTensorboard, getTensorboard = _has_flag("tensorboard", "Launch tensorboard process")


class HasTFRecordDir(Params):
    """``tfrecord_dir``: where InputMode.TENSORFLOW writes the DataFrame as TFRecords."""

    tfrecord_dir, setTFRecordDir, getTFRecordDir = _has(
        "tfrecord_dir",
        "Path to temporarily export a DataFrame as TFRecords (for InputMode.TENSORFLOW apps)",
        _string_or_none,
    )


class HasExportDir(Params):
    """``export_dir``: the SavedModel directory (written by ``train_fn``, served by TFModel)."""

    export_dir, setExportDir, getExportDir = _has("export_dir", "Directory to export saved_model", _string_or_none)


class HasSignatureDefKey(Params):
    """``signature_def_key``: the SavedModel signature to serve (default ``serving_default``)."""

    signature_def_key, setSignatureDefKey, getSignatureDefKey = _has(
        "signature_def_key", "Identifier for a specific saved_model signature", _string_or_none
    )


class HasTagSet(Params):
    """``tag_set``: comma-separated tags of the MetaGraph to load (None: the only one)."""

    tag_set, setTagSet, getTagSet = _has(
        "tag_set", "Comma-delimited list of tags identifying a saved_model metagraph", _string_or_none
    )


_name_accessors(*(mixin for mixin in Params.__subclasses__() if mixin.__module__ == __name__))


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
            if isinstance(self.__dict__.get("argv"), list):
                self.argv = list(self.__dict__["argv"])  # a copy's argv is its own
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

        A Param the user set wins over a ``tf_args`` key of the same name, as in TFoS. A Param
        left at its default never replaces a ``tf_args`` value silently: TFoS did, so ``train_fn``
        (and the estimator's own feed, which reads the Params) ran with a default nobody chose
        while the user's ``tf_args`` said otherwise. A ``tf_args`` key that names an unset Param
        and differs from its default is a ConfigError naming both and the setter to call.

        Raises
        ------
        ConfigError
            For each such key (all of them, in one message).
        """
        merged = Namespace(self.args)
        given = {} if self.args.argv else vars(self.args)
        clashes = []
        for param in self.params:
            if not (self.hasDefault(param) or self.isSet(param)):
                continue
            value = self.getOrDefault(param)
            if param.name in given and not self.isSet(param) and not _same(given[param.name], value):
                setter = _SETTER_NAMES.get(param.name, f"set({param.name!r}, ...)")
                clashes.append(
                    f"tf_args[{param.name!r}]={given[param.name]!r} names the Param {param.name}, which is not "
                    f"set: its default {value!r} would replace it; call {setter}({given[param.name]!r}) "
                    f"or remove {param.name!r} from tf_args"
                )
            setattr(merged, param.name, value)
        if clashes:
            raise ConfigError(f"{type(self).__name__}: " + "; ".join(clashes))
        return merged

    def copy(self: _P, extra: Any = None) -> _P:
        """Spark ML's copy (the Params, ``extra`` applied), with ``tf_args`` of its own.

        Spark's ``copy`` is shallow: a copy shared the original's ``args``, so
        ``copy().args.lr = 0.5`` changed the original's learning rate too.
        """
        copied = super().copy(extra)
        copied.args = Namespace(self.args)
        return copied


def _same(a: Any, b: Any) -> bool:
    """``a == b`` as a plain bool (False where comparing fails or is ambiguous, e.g. arrays)."""
    try:
        return bool(a == b)
    except Exception:
        return False
