"""Spark ML persistence (``save``/``load``, inside a ``Pipeline`` too) for TFEstimator and TFModel.

The standard ``metadata`` file of Spark ML holds the Params; what is not a Param travels in the
same JSON as extra fields. By default that JSON holds **no pickle**, and loading never unpickles:

* ``tf_args`` is saved as ``{"json": ...}``. ``tf_args`` that JSON cannot hold (a set, an object)
  are refused at save time with a :class:`~tfonspark.errors.ConfigError` naming the arguments,
  rather than silently dropped;
* ``train_fn`` / ``export_fn`` of an estimator are saved by reference, ``{"ref": "module:qualname"}``,
  when the function is defined at the top level of an importable module (or is a class's static
  method). Loading imports that module and looks the name up; the result must be a callable
  whose own ``__module__``/``__qualname__`` are the reference, so a reference cannot name an
  attribute path other than a definition. Functions from ``__main__`` (notebooks, scripts),
  lambdas, nested functions and ``functools.partial`` objects have no such reference: saving
  them is refused with a ConfigError unless pickling is allowed.

Pickling is opt-in, at save *and* at load, in one of three ways (all equivalent)::

    model.save(path, allow_pickle=True)                 # or model.write().allowPickle().save(path)
    TFModel.load(path, allow_pickle=True)               # or TFModel.read().allowPickle().load(path)
    with allow_pickle():                                # Pipeline/PipelineModel save and load
        PipelineModel.load(path)                        # call the stages' read()/write() for you

:func:`allow_pickle` is a context manager that holds a :mod:`contextvars` flag: it applies to the
saves and loads made in the same thread (or asyncio task) while the ``with`` block runs, and to
no other thread. With pickling allowed, values JSON cannot hold are cloudpickled (base64,
``{"pickle": ...}``). Without it, a saved file holding a pickle (this includes estimators saved
by earlier tfonspark versions, which pickled their functions) is refused *before* anything is
unpickled, with a ConfigError naming the field and the opt-in. Only opt in for files you trust:
unpickling runs arbitrary code.

Trust: loading a saved *estimator* imports the modules its functions are referenced from (as
Spark imports the class named in every stage's metadata), and ``fit`` then calls those
functions. A reference must name a function (or a static or class method) of a module outside
the standard library: ``builtins:exec``, ``posix:system``, ``subprocess:call`` and every other
module of ``sys.stdlib_module_names`` are refused before anything is imported, and classes and
builtins are refused wherever they live. A tampered file can still name any function of any
other installed module, so fit loaded estimators only from places you trust; loading alone
calls none of them. A saved TFModel holds no function.
The SavedModel itself is not copied: a TFModel stores ``export_dir``, which must still hold the
model when it is used.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import importlib
import inspect
import json
import re
import sys
from collections.abc import Iterator
from typing import Any

from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLWritable,
)

from ..errors import ConfigError
from .params import Namespace

__all__ = [
    "TFPersistence",
    "allow_pickle",
    "decode_args",
    "decode_function",
    "encode_args",
    "encode_function",
    "pickle_allowed",
    "pickled_fields",
]

#: The extra metadata fields that hold functions (an old save has them as a bare base64 pickle).
FUNCTION_FIELDS = ("train_fn", "export_fn")

_ALLOW_PICKLE: contextvars.ContextVar[bool] = contextvars.ContextVar("tfonspark_allow_pickle", default=False)
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_REFERENCE = re.compile(rf"({_NAME}(?:\.{_NAME})*):({_NAME}(?:\.{_NAME})*)")


_VALID_REFERENCE = (
    "a function defined at the top level (or as a static or class method) of an importable module "
    "outside the standard library, e.g. {'ref': 'mypackage.training:train'}"
)


def _stdlib_refusal(module: str) -> str:
    """Why a reference into ``module`` is refused without importing it (``""``: it is not).

    Every module of the standard library (``sys.stdlib_module_names``: ``builtins``, ``os``,
    ``posix``, ``subprocess``, ``pickle``, ``ctypes`` ...) is refused: no training function lives
    there, and those modules hold what a tampered file would name (``builtins:exec``,
    ``posix:system``), some act when imported (``antigravity``, ``this``).
    """
    top = module.partition(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return f"{module!r} is a module of the standard library"
    return ""


def _function_refusal(fn: Any) -> str:
    """Why ``fn`` is not a function a reference may name (``""``: it is one): classes, builtins
    and other callables are refused; plain functions and static or class methods are not."""
    if inspect.isfunction(fn) or (inspect.ismethod(fn) and inspect.isfunction(fn.__func__)):
        return ""
    return f"it is a {type(fn).__name__}, not a function"


def _parse_reference(text: Any) -> tuple[str, str] | None:
    """``(module, qualname)`` of a ``module:qualname`` text of plain, non-dunder names; else None."""
    match = _REFERENCE.fullmatch(text) if isinstance(text, str) else None
    if match is None or any(p.startswith("__") for p in re.split(r"[.:]", text)):
        return None
    return match.group(1), match.group(2)


_OPT_IN_LOAD = (
    "load it with {cls}.load(path, allow_pickle=True) or "
    "{cls}.read().allowPickle().load(path); inside a Pipeline/PipelineModel, load "
    "within `with tfonspark.ml.persistence.allow_pickle(): PipelineModel.load(path)`"
)
_OPT_IN_SAVE = (
    "save with allow_pickle=True: stage.save(path, allow_pickle=True), "
    "stage.write().allowPickle().save(path), or for a Pipeline/PipelineModel "
    "`with tfonspark.ml.persistence.allow_pickle(): pipeline.save(path)` (loading it "
    "then needs the same opt-in, since unpickling runs code)"
)


@contextlib.contextmanager
def allow_pickle(allow: bool = True) -> Iterator[None]:
    """Allow (or, with ``allow=False``, forbid) pickles in saves and loads within the block.

    For ``Pipeline``/``PipelineModel`` ``save``/``load``, which call each stage's
    ``write()``/``read()`` themselves::

        with tfonspark.ml.persistence.allow_pickle():
            model = PipelineModel.load(path)

    Applies to the current thread (or asyncio task) only, until the block ends; blocks nest.
    Only load files you trust this way: unpickling runs arbitrary code.
    """
    token = _ALLOW_PICKLE.set(bool(allow))
    try:
        yield
    finally:
        _ALLOW_PICKLE.reset(token)


def pickle_allowed() -> bool:
    """Whether an :func:`allow_pickle` block is active in this thread (or asyncio task)."""
    return _ALLOW_PICKLE.get()


def _pickle(value: Any) -> str:
    from pyspark import cloudpickle

    # pyspark's vendored cloudpickle has no annotations; dumps returns bytes
    payload: bytes = cloudpickle.dumps(value)  # type: ignore[no-untyped-call]
    return base64.b64encode(payload).decode("ascii")


def _unpickle(text: str) -> Any:
    import pickle

    return pickle.loads(base64.b64decode(text))  # noqa: S301 (only reached with allow_pickle)


def _refused(field: str) -> ConfigError:
    return ConfigError(
        f"saved field {field!r} holds a pickle, and unpickling runs arbitrary code, "
        "so it is refused unless you opt in with allow_pickle=True (only for files "
        "you trust)"
    )


# ---- tf_args ------------------------------------------------------------------------------------


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        return False
    return True


def encode_args(args: Namespace, allow_pickle: bool = False) -> dict[str, Any]:
    """``tf_args`` as ``{"json": ...}``; what JSON cannot hold needs ``allow_pickle`` (a pickle).

    Raises ConfigError naming the arguments JSON cannot hold when ``allow_pickle`` is False.
    """
    value = args.to_dict()
    if _json_safe(value):
        return {"json": value}
    if allow_pickle:
        return {"pickle": _pickle(value)}
    bad = {k: type(v).__name__ for k, v in value.items() if not _json_safe({k: v})}
    raise ConfigError(
        f"tf_args cannot be saved as JSON: {bad} (argument: type) are not "
        "JSON-serializable. Make them JSON values (e.g. a list instead of a set, a "
        f"string instead of an object), or {_OPT_IN_SAVE}"
    )


def decode_args(encoded: dict[str, Any] | None, allow_pickle: bool = False) -> Namespace:
    """The Namespace :func:`encode_args` wrote (an argv list comes back as an argv).

    A ``{"pickle": ...}`` value raises ConfigError, without being unpickled, unless
    ``allow_pickle`` is True.
    """
    if not encoded:
        return Namespace()
    if not isinstance(encoded, dict) or ("json" not in encoded and "pickle" not in encoded):
        raise ConfigError(f"saved field 'tf_args' is not {{'json': ...}}. Received: {encoded!r:.200}")
    if "json" in encoded:
        value = encoded["json"]
    elif not allow_pickle:
        raise _refused("tf_args")
    else:
        value = _unpickle(encoded["pickle"])
    if not isinstance(value, dict):
        raise ConfigError(f"saved field 'tf_args' must hold a dict. Received: {type(value).__name__}")
    if set(value) == {"argv"}:
        return Namespace(list(value["argv"]))
    return Namespace(value)


# ---- functions ----------------------------------------------------------------------------------


def _resolve(module: str, qualname: str) -> Any:
    """``module.qualname`` after importing ``module`` (AttributeError/ImportError if absent)."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _reference(fn: Any) -> tuple[str | None, str]:
    """``("module:qualname", "")`` when ``fn`` can be saved by reference, else ``(None, why)``."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None, f"{type(fn).__name__} objects have no module-level name"
    if module in ("__main__", "__mp_main__"):
        return None, "it is defined in __main__ (a notebook or script), which a loader cannot import"
    if _parse_reference(f"{module}:{qualname}") is None:
        return None, (f"{qualname!r} is a lambda, nested in a function or a dunder name, not a plain module-level name")
    why = _stdlib_refusal(module) or _function_refusal(fn)
    if why:
        return None, f"{module}:{qualname} cannot be loaded by reference: {why}; a reference names {_VALID_REFERENCE}"
    try:
        resolved = _resolve(module, qualname)
    except (ImportError, AttributeError) as err:
        return None, f"{module}:{qualname} does not resolve to it ({err})"
    if resolved is not fn and not (inspect.ismethod(fn) and resolved == fn):
        return None, f"{module}:{qualname} names a different object (a bound method or wrapper?)"
    return f"{module}:{qualname}", ""


def encode_function(fn: Any, allow_pickle: bool = False, field: str = "function") -> dict[str, str] | None:
    """``{"ref": "module:qualname"}`` for an importable function; else a pickle if allowed.

    None stays None. Raises ConfigError saying why ``fn`` has no reference when ``allow_pickle``
    is False and it has none.
    """
    if fn is None:
        return None
    reference, why = _reference(fn)
    if reference is not None:
        return {"ref": reference}
    if allow_pickle:
        return {"pickle": _pickle(fn)}
    raise ConfigError(
        f"{field}={fn!r} cannot be saved without pickling it: {why}. Define it at "
        "the top level of an importable module (it is then saved as module:qualname "
        f"and imported on load), or {_OPT_IN_SAVE}"
    )


def decode_function(encoded: Any, allow_pickle: bool = False, field: str = "function") -> Any:
    """The function :func:`encode_function` wrote (None stays None).

    ``{"ref": "module:qualname"}`` imports ``module`` and must resolve to a function (or a
    static or class method) whose own ``__module__``/``__qualname__`` are the reference (no
    dunder names). A module of the standard library is refused before it is imported. A pickle (``{"pickle":
    ...}``, or a bare base64 string from earlier versions) raises ConfigError, without being
    unpickled, unless ``allow_pickle`` is True.
    """
    if encoded is None:
        return None
    if isinstance(encoded, str) or (isinstance(encoded, dict) and "pickle" in encoded):
        if not allow_pickle:
            raise _refused(field)
        return _unpickle(encoded if isinstance(encoded, str) else encoded["pickle"])
    reference = encoded.get("ref") if isinstance(encoded, dict) else None
    parsed = _parse_reference(reference)
    if parsed is None:
        raise ConfigError(
            f"saved field {field!r} is not {{'ref': 'module:qualname'}} (plain, "
            f"non-dunder names). Received: {encoded!r:.200}"
        )
    module, qualname = parsed
    why = _stdlib_refusal(module)
    if why:  # before importing it: an import can act
        raise ConfigError(f"saved {field} {reference!r} is refused: {why}. A saved {field} names {_VALID_REFERENCE}")
    try:
        fn = _resolve(module, qualname)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"saved {field} {reference!r} cannot be loaded: {err}. The module must "
            "be importable where the estimator is loaded"
        ) from err
    why = _function_refusal(fn)
    if why or getattr(fn, "__module__", None) != module or getattr(fn, "__qualname__", None) != qualname:
        raise ConfigError(
            f"saved {field} {reference!r} does not name a function defined there (found {type(fn).__name__}"
            f"{', ' + why if why else ''}). A saved {field} names {_VALID_REFERENCE}"
        )
    return fn


def pickled_fields(metadata: dict[str, Any]) -> list[str]:
    """The top-level fields of saved metadata that hold a pickle (checked before decoding)."""
    return sorted(
        name
        for name, value in metadata.items()
        if (isinstance(value, dict) and "pickle" in value) or (name in FUNCTION_FIELDS and isinstance(value, str))
    )


# ---- reader and writer --------------------------------------------------------------------------


class _Writer(DefaultParamsWriter):
    """Writes the Params metadata plus the instance's ``_extra_metadata(allow_pickle)``."""

    def __init__(self, instance: Any) -> None:
        super().__init__(instance)
        self._allow_pickle = False

    def allowPickle(self, allow: bool = True) -> _Writer:  # noqa: N802 (Spark style)
        """Save values JSON cannot hold as pickles (loading them then needs the opt-in too)."""
        self._allow_pickle = bool(allow)
        return self

    def saveImpl(self, path: str) -> None:  # noqa: N802 (Spark name)
        allow = self._allow_pickle or pickle_allowed()
        extra = self.instance._extra_metadata(allow_pickle=allow)  # type: ignore[attr-defined]
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession, extraMetadata=extra)


class _Reader(DefaultParamsReader[Any]):
    """Rebuilds an instance with ``cls._from_metadata`` and restores its uid and Params."""

    def __init__(self, cls: Any) -> None:
        super().__init__(cls)
        self._allow_pickle = False

    def allowPickle(self, allow: bool = True) -> _Reader:  # noqa: N802 (Spark style)
        """Unpickle saved fields that hold a pickle. Only for files you trust: it runs code."""
        self._allow_pickle = bool(allow)
        return self

    def load(self, path: str) -> Any:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        expected = f"{self.cls.__module__}.{self.cls.__name__}"
        if metadata["class"] != expected:
            raise ConfigError(
                f"{path!r} holds a saved {metadata['class']}, not a {expected}; load it "
                "with that class (or pyspark.ml.Pipeline(Model).load for a pipeline)"
            )
        allow = self._allow_pickle or pickle_allowed()
        pickled = pickled_fields(metadata)
        if pickled and not allow:
            opt_in = _OPT_IN_LOAD.format(cls=self.cls.__name__)
            raise ConfigError(
                f"{path!r} holds a saved {self.cls.__name__} whose field(s) "
                f"{pickled} hold a pickle. Unpickling runs arbitrary code (a tampered "
                "file can run any command), so it is refused by default. If you "
                f"trust this file, {opt_in}"
            )
        instance = self.cls._from_metadata(metadata, allow_pickle=allow)  # type: ignore[attr-defined]
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        return instance


class TFPersistence(MLWritable, MLReadable[Any]):
    """``write()``/``read()`` for classes with ``_extra_metadata()`` and ``_from_metadata()``."""

    def write(self) -> _Writer:
        """A writer: ``model.write().overwrite().save(path)`` (``.allowPickle()`` to pickle)."""
        return _Writer(self)

    def save(self, path: str, allow_pickle: bool = False) -> None:
        """Save to ``path``; ``allow_pickle=True`` pickles what JSON or a reference cannot hold."""
        self.write().allowPickle(allow_pickle).save(path)

    @classmethod
    def read(cls) -> _Reader:
        """A reader: ``TFModel.read().load(path)``; ``.allowPickle()`` opts in to unpickling."""
        return _Reader(cls)

    @classmethod
    def load(cls, path: str, allow_pickle: bool = False) -> Any:
        """Load from ``path``; ``allow_pickle=True`` unpickles (runs code): trusted files only."""
        return cls.read().allowPickle(allow_pickle).load(path)
