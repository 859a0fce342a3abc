"""The TFoS face's Keras 2, on the driver as on the nodes, and ``lr=`` as Keras 2 meant it.

TFoS programs are Keras 2 code, so the TFoS face (``TFCluster.run``, ``pipeline.TFEstimator``)
starts its TF processes with ``TF_USE_LEGACY_KERAS=1`` where ``tf_keras`` is installed
(:mod:`tfonspark.executor.tfos_env`). This module makes the rest of a TFoS program agree:

* **The driver.** A face module the program imports (``from tfonspark import compat``,
  ``from tfonspark.pipeline import TFEstimator``...; not the package's own imports of them
  during ``import tfonspark``, which is the Keras 3 API) sets ``TF_USE_LEGACY_KERAS=1`` in the
  driver too, before TensorFlow is imported, so the Keras classes a TFoS program imports at
  module level (``from tensorflow.keras import Sequential``) are the nodes' Keras 2 classes when
  ``map_fun`` carries them there. ``TFCluster.run`` and ``TFEstimator.fit`` check again before
  they start Keras 2 nodes. Said in one INFO line. When it is too late (TensorFlow was imported
  with Keras 3, or the driver's environment sets ``TF_USE_LEGACY_KERAS`` to something else),
  one WARNING says what breaks. ``legacy_keras=off`` (``TFONSPARK_LEGACY_KERAS=off``,
  ``spark.tfonspark.legacyKeras=off``) keeps Keras 3 on both sides.
* **lr=.** Keras 2 optimizers took ``lr=`` as the learning rate (deprecated, with a warning).
  tf_keras 2.11+ optimizers log a line and drop it: ``Adam(lr=0.2)`` trains at 0.001. In the
  face's Keras 2 processes (this driver, and nodes through :class:`FaceMapFun`) tf_keras
  optimizers pass ``lr`` on as ``learning_rate`` again, with Keras 2's deprecation warning.
  tf_keras is patched when it is imported (an import hook), never imported from here.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any

from . import settings
from .errors import ConfigError
from .executor.spawn import ATTEMPT_ENV
from .executor.tfos_env import LEGACY_KERAS_ENV
from .importhook import AfterImport

__all__ = ["FaceMapFun", "face_imported", "face_used", "install_lr_shim"]

_log = logging.getLogger(__name__)

_TF_TRUE = ("true", "True", "1")  # the values TensorFlow reads as Keras 2 (tensorflow/__init__.py)
_OPTIMIZERS = "tf_keras.src.optimizers.optimizer"  # defines _BaseOptimizer, which every optimizer extends
_STASH = "_tfonspark_lr"  # an optimizer's lr=, kept from _process_kwargs until _build_learning_rate
_NOT_DRIVERS = ("pyspark.", "tfonspark.executor.", "tfonspark.tfprocess.")  # __main__ of executor processes

_SWITCHED = (
    "TFoS face: this driver uses Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1) like its TF processes, so Keras "
    "classes imported here work in map_fun; TFONSPARK_LEGACY_KERAS=off (or spark.tfonspark.legacyKeras=off) "
    "keeps Keras 3 on the driver and in the TF processes"
)
_MIXED = (
    "the TF processes run Keras 2 (tf_keras): Keras objects made on the driver (e.g. 'from tensorflow.keras "
    "import Sequential' at module level) fail when map_fun uses them on the nodes. "
)
_TOO_LATE = (
    "TFoS face: TensorFlow was imported with Keras 3 before the face was, and "
    + _MIXED
    + "Import the face (from tfonspark import ...) before TensorFlow, or set TF_USE_LEGACY_KERAS=1 in the "
    "driver's environment, or keep Keras 3 everywhere with TFONSPARK_LEGACY_KERAS=off (legacy_keras=False)"
)
_USER_KERAS_3 = (
    "TFoS face: TF_USE_LEGACY_KERAS=%r in this driver's environment keeps Keras 3 here, but "
    + _MIXED
    + "Unset it, or keep Keras 3 everywhere with TFONSPARK_LEGACY_KERAS=off (legacy_keras=False)"
)
_DRIVER_KERAS_2 = (
    "legacy_keras=off: the TF processes run Keras 3, but this driver already imported TensorFlow with Keras 2 "
    "(the TFoS face set TF_USE_LEGACY_KERAS=1 when it was imported), so Keras objects made on the driver fail "
    "in map_fun. Set TFONSPARK_LEGACY_KERAS=off before the face is imported"
)
_LR_DEPRECATED = (
    "The `lr` argument is deprecated, use `learning_rate` instead. tfonspark's TFoS face passes lr=%r on "
    "as the learning rate, as Keras 2 did (tf_keras on its own ignores it and keeps its default)."
)


class _State:
    lock = threading.RLock()
    switched = False  # this module set TF_USE_LEGACY_KERAS=1 in this process
    said: set[str] = set()  # the log lines already given (each once per process)


# ---- the driver's Keras -------------------------------------------------------------------------


def face_imported() -> None:
    """Called by each TFoS face module as it is imported: the driver takes the nodes' Keras 2.

    Does nothing while ``import tfonspark`` imports the faces it re-exports: the program asked
    for the package (the Keras 3 API), not for a face.
    """
    package = sys.modules.get(__package__ or "tfonspark")
    if getattr(getattr(package, "__spec__", None), "_initializing", False):
        return
    _choose(_active_conf(), None)


def face_used(sc: Any, legacy_keras: object = None) -> None:
    """Called by ``TFCluster.run`` / ``pipeline.TFEstimator.fit`` before they start their nodes,
    with the ``legacy_keras`` argument and the Spark conf they start them with."""
    get_conf = getattr(sc, "getConf", None)
    _choose(get_conf() if get_conf is not None else None, legacy_keras)


def _choose(conf: Any, legacy_keras: object) -> None:
    if not _on_driver():
        return  # a node's Keras is the supervisor's choice (executor/tfos_env.py)
    try:
        mode = settings.resolve({"legacy_keras": legacy_keras}, conf).legacy_keras
    except ConfigError:
        return  # run() raises it, naming the setting and the value
    with _State.lock:
        if mode == "off":
            _keep_keras_3()
        elif _tf_keras_installed():
            _use_keras_2()
        # else: the nodes run Keras 3 too; launch says so when the cluster starts


def _use_keras_2() -> None:
    chosen = _tensorflow_keras()
    value = os.environ.get(LEGACY_KERAS_ENV, "")
    if chosen == "tf_keras" or (not chosen and value in _TF_TRUE):
        install_lr_shim()  # Keras 2 already: the user's TF_USE_LEGACY_KERAS=1, or ours
    elif chosen == "keras":
        _say(logging.WARNING, _TOO_LATE)
    elif value:
        _say(logging.WARNING, _USER_KERAS_3 % value)  # the user set it: theirs to change
    else:
        os.environ[LEGACY_KERAS_ENV] = "1"
        _State.switched = True
        install_lr_shim()
        _say(logging.INFO, _SWITCHED)


def _keep_keras_3() -> None:
    """``legacy_keras=off`` given to run(): take back our switch while TensorFlow is not imported."""
    if not _State.switched:
        return
    if not _tensorflow_keras():
        os.environ.pop(LEGACY_KERAS_ENV, None)
        _State.switched = False
    else:
        _say(logging.WARNING, _DRIVER_KERAS_2)


def _tf_keras_installed() -> bool:
    return importlib.util.find_spec("tf_keras") is not None  # finds it, never imports it


def _tensorflow_keras() -> str:
    """Which Keras ``tensorflow.keras`` is in this process: ``""`` while TensorFlow is not imported
    (it decides at import: ``from tensorflow.keras import X`` follows that choice), else
    ``"tf_keras"`` or ``"keras"`` (Keras 3)."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return ""
    legacy = getattr(tf, "_tf_uses_legacy_keras", None)
    if not isinstance(legacy, bool):
        legacy = os.environ.get(LEGACY_KERAS_ENV) in _TF_TRUE
    return "tf_keras" if legacy else "keras"


def _on_driver() -> bool:
    """Not a TF process, a node supervisor or a Spark Python worker (unpickling a function can
    import a face module there)."""
    if ATTEMPT_ENV in os.environ or "pyspark.worker" in sys.modules or "pyspark.daemon" in sys.modules:
        return False
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return not (getattr(spec, "name", None) or "").startswith(_NOT_DRIVERS)


def _active_conf() -> Any:
    """The running SparkContext's conf (``spark.tfonspark.legacyKeras``), if there is one; never
    imports pyspark."""
    pyspark = sys.modules.get("pyspark")
    context = getattr(getattr(pyspark, "SparkContext", None), "_active_spark_context", None)
    return context.getConf() if context is not None else None


def _say(level: int, message: str) -> None:
    if message not in _State.said:
        _State.said.add(message)
        _log.log(level, "%s", message)


# ---- the nodes ---------------------------------------------------------------------------------


class FaceMapFun:
    """A TFoS-face ``map_fun``/``train_fn``: in a Keras 2 TF process, tf_keras optimizers take
    ``lr=`` before the user's function runs. Pickled by reference to this class."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if os.environ.get(LEGACY_KERAS_ENV) in _TF_TRUE:
            install_lr_shim()
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FaceMapFun({self.fn!r})"


# ---- lr= for tf_keras optimizers -------------------------------------------------------------------


def install_lr_shim() -> None:
    """tf_keras optimizers take ``lr=`` as the learning rate: now if tf_keras is imported, else
    when it is (an import hook that patches its optimizer module once, then removes itself)."""
    with _State.lock:
        module = sys.modules.get(_OPTIMIZERS)
        if module is not None and hasattr(module, "_BaseOptimizer"):
            _patch(module)
        else:
            _LR_HOOK.install()


def _patch_once(module: ModuleType) -> None:
    """The import hook's patch: once tf_keras' optimizer module ran, patch it and unhook."""
    with _State.lock:
        _patch(module)
        _LR_HOOK.remove()


_LR_HOOK = AfterImport({_OPTIMIZERS}, _patch_once)


def _patch(module: ModuleType) -> None:
    base = getattr(module, "_BaseOptimizer", None)
    originals: list[Any] = [getattr(base, name, None) for name in ("_process_kwargs", "_build_learning_rate", "build")]
    if base is None or not all(callable(f) for f in originals):
        _say(
            logging.WARNING,
            f"TFoS face: tfonspark cannot pass lr= on as the learning rate in this tf_keras ({module.__name__} "
            "lacks _BaseOptimizer._process_kwargs/_build_learning_rate/build): lr= is ignored; use learning_rate=",
        )
        return
    if getattr(base, "_tfonspark_patched", False):
        return
    process_kwargs, build_learning_rate, build = originals

    def _process_kwargs(self: Any, kwargs: dict[str, Any]) -> Any:
        lr = kwargs.pop("lr", None)
        if lr is not None:  # tf_keras ignores lr=None too
            warnings.warn(_LR_DEPRECATED % (lr,), UserWarning, stacklevel=_user_stacklevel())
            self.__dict__[_STASH] = lr  # not setattr: tf.Module would track it
        return process_kwargs(self, kwargs)

    def _build_learning_rate(self: Any, learning_rate: Any) -> Any:
        return build_learning_rate(self, self.__dict__.pop(_STASH, learning_rate))  # lr= wins, as in Keras 2

    def guarded_build(self: Any, var_list: Any) -> Any:
        if _STASH in self.__dict__:  # an optimizer whose __init__ never built its learning rate
            raise ConfigError(
                f"{type(self).__name__} was given lr={self.__dict__[_STASH]!r}, but its __init__ never builds a "
                "learning rate from it (it does not call _build_learning_rate); pass learning_rate= instead"
            )
        return build(self, var_list)

    base._process_kwargs = _process_kwargs
    base._build_learning_rate = _build_learning_rate
    base.build = guarded_build
    base._tfonspark_patched = True


def _user_stacklevel() -> int:
    """The warning's stacklevel that points at the user's line, past tf_keras' own frames."""
    frame: FrameType | None = sys._getframe(2)  # the optimizer's __init__ chain starts above _process_kwargs
    level = 2
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("tf_keras."):
        frame = frame.f_back
        level += 1
    return level
