"""The per-process ``MultiWorkerMirroredStrategy`` and checks that a model belongs to it.

``MultiWorkerMirroredStrategy`` (MWMS) configures collective ops in the TensorFlow runtime, which
is only possible before the first TensorFlow op runs. So :func:`strategy` must be the first
TensorFlow call of a node's ``main_fun``; it creates the strategy from ``TF_CONFIG`` once and
returns the same object afterwards. Without ``TF_CONFIG`` it returns a one-worker MWMS over the
local devices, so single-process runs take the same code path as clusters.

The collective implementation comes from ``communication``, else ``$TFONSPARK_COLLECTIVE``: in a
tfonspark node the supervisor sets that variable from the resolved ``collective`` setting
(:mod:`tfonspark.settings`); outside tfonspark a user sets it, or nothing (``auto``). The other
two of TF's ``CommunicationOptions`` come the same way: ``bytes_per_pack`` (gradients all-reduced
in packs of about that many bytes, 0: TF's choice) and ``timeout_seconds`` (how long a collective
waits for its peers; unset, it waits forever). Across hosts a collective waiting on a peer whose
host is cut off then ends with ``DeadlineExceededError`` instead of hanging; the node's error
names the peers it waited on (:mod:`tfonspark.tfprocess.hints`).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from .. import settings
from ..errors import ConfigError
from ..settings import BYTES_PER_PACK_ENV, COLLECTIVE_ENV, COLLECTIVE_TIMEOUT_ENV
from .tf_config import TF_CONFIG_ENV, TaskInfo, task_info

__all__ = [
    "BYTES_PER_PACK_ENV",
    "COLLECTIVE_ENV",
    "COLLECTIVE_TIMEOUT_ENV",
    "check_model_strategy",
    "keras_flavor",
    "strategy",
    "sum_across_replicas",
    "task_info_of",
]

_IMPLEMENTATIONS = {
    name: getattr(tf.distribute.experimental.CommunicationImplementation, name.upper()) for name in settings.COLLECTIVES
}

_lock = threading.Lock()
_cached: tuple[tf.distribute.Strategy, tuple[str, str, int, float | None]] | None = None


def strategy(
    *, communication: str | None = None, bytes_per_pack: int | None = None, timeout_seconds: float | None = None
) -> tf.distribute.Strategy:
    """Return this process's MWMS, creating it from ``TF_CONFIG`` on the first call.

    ``communication`` (default: ``$TFONSPARK_COLLECTIVE``, else ``"auto"``) picks the collective
    implementation: one of :data:`tfonspark.settings.COLLECTIVES`. ``bytes_per_pack`` (default:
    ``$TFONSPARK_COLLECTIVE_BYTES_PER_PACK``, else 0, TF's choice) and ``timeout_seconds``
    (default: ``$TFONSPARK_COLLECTIVE_TIMEOUT``, else none: a collective waits for its peers
    forever) are the rest of TF's ``CommunicationOptions``. Raises
    :class:`~tfonspark.errors.ConfigError` when called after other TensorFlow ops in a
    multi-worker process, for an option out of range, or when ``TF_CONFIG`` or an option
    changed since the strategy was created (a process holds one strategy for its lifetime).
    """
    global _cached
    config = os.environ.get(TF_CONFIG_ENV, "")
    name = _collective(communication)
    pack, timeout = _bytes_per_pack(bytes_per_pack), _timeout_seconds(timeout_seconds)
    key = (config, name, pack, timeout)
    with _lock:
        if _cached is not None:
            if _cached[1] != key:
                raise ConfigError(
                    "tfonspark.distribute.strategy() was already created in this process with a "
                    "different TF_CONFIG or communication options; a process holds one strategy. "
                    f"Created with: {_cached[1]!r}. Received: {key!r}"
                )
            return _cached[0]
        task_info(config)  # a malformed TF_CONFIG fails here, with the field named
        options = tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=pack, timeout_seconds=timeout, implementation=_IMPLEMENTATIONS[name]
        )
        created = _create_mwms(options)
        _cached = (created, key)
        return created


def _collective(communication: str | None) -> str:
    """The collective's name from ``communication``, else the environment, else the default;
    checked by the ``collective`` setting's own parser, whose error names where it came from."""
    if communication:
        return str(settings.check("collective", communication, "communication"))
    return str(settings.node_value("collective", settings.DEFAULT_COLLECTIVE, source="the environment"))


def _bytes_per_pack(given: int | None) -> int:
    """``bytes_per_pack`` as given, else ``$TFONSPARK_COLLECTIVE_BYTES_PER_PACK``, else 0."""
    raw: object = given if given is not None else os.environ.get(BYTES_PER_PACK_ENV, "0")
    where = "bytes_per_pack" if given is not None else BYTES_PER_PACK_ENV
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = -1
    if value < 0 or isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
        raise ConfigError(f"{where} must be a whole number of bytes >= 0 (0: TF's choice). Received: {raw!r}")
    return value


def _timeout_seconds(given: float | None) -> float | None:
    """``timeout_seconds`` as given, else ``$TFONSPARK_COLLECTIVE_TIMEOUT``, else None (no timeout)."""
    raw: object = given if given is not None else os.environ.get(COLLECTIVE_TIMEOUT_ENV, "")
    if given is None and str(raw).strip() in ("", "0", "0.0"):  # the setting's 0: no timeout
        return None
    where = "timeout_seconds" if given is not None else COLLECTIVE_TIMEOUT_ENV
    try:
        value = float(str(raw).strip())
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf") or isinstance(raw, bool):
        raise ConfigError(f"{where} must be a number of seconds > 0 (unset: no timeout). Received: {raw!r}")
    return value


def _create_mwms(options: Any) -> tf.distribute.Strategy:
    """Create the MWMS, turning the runtime's startup-order error into a ConfigError."""
    try:
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except RuntimeError as err:
        if "must be configured at program startup" not in str(err):
            raise
        raise ConfigError(
            "MultiWorkerMirroredStrategy must be created before any other TensorFlow op in the "
            "process: call tfonspark.distribute.strategy() first in main_fun, before building "
            "models or datasets."
        ) from err


def task_info_of(strategy: tf.distribute.Strategy) -> TaskInfo:
    """Where this process sits in ``strategy``'s cluster; one-process strategies are chief."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or resolver.task_type is None:
        return TaskInfo(task_type=None, task_id=0, cluster={})
    spec = resolver.cluster_spec().as_dict()
    cluster = {role: _addresses(tasks) for role, tasks in spec.items()}
    return TaskInfo(task_type=resolver.task_type, task_id=int(resolver.task_id or 0), cluster=cluster)


def _addresses(tasks: Sequence[str] | Mapping[int, str]) -> tuple[str, ...]:
    """A cluster-spec role entry (list, or dict for sparse specs) as a tuple of addresses."""
    if isinstance(tasks, Mapping):
        return tuple(tasks[i] for i in sorted(tasks))
    return tuple(tasks)


def check_model_strategy(model: Any, strategy: tf.distribute.Strategy) -> None:
    """Raise ConfigError unless ``model`` was created *and* compiled under ``strategy.scope()``.

    Keras 3 remembers the strategy whose scope was active when the model and when its optimizer
    were created; variables made outside the scope are plain (not mirrored) and would silently
    drift apart between workers.
    """
    model_strategy = getattr(model, "_distribute_strategy", strategy)
    if model_strategy is not strategy:
        raise ConfigError(
            "The model was not created under this strategy's scope. Build and compile it inside "
            "`with tfonspark.distribute.strategy().scope():`, or pass a build_fn that returns "
            f"a compiled model. Received: model strategy={model_strategy!r}, strategy={strategy!r}"
        )
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not getattr(model, "compiled", True):
        raise ConfigError(
            "The model is not compiled: call model.compile(optimizer=..., loss=..., metrics=...) "
            "inside the strategy scope before training."
        )
    optimizer_strategy = getattr(optimizer, "_distribution_strategy", strategy)
    if optimizer_strategy is not strategy:
        raise ConfigError(
            "The model was compiled outside the strategy scope, so its optimizer is not "
            "distributed. Call model.compile(...) inside `with strategy.scope():`."
        )
    plain = [getattr(v, "path", v.name) for v in model.variables if not _is_distributed(v)]
    if plain:
        raise ConfigError(
            "Some model variables were created outside the strategy scope and are not "
            f"mirrored: {plain[:5]}. Create the model inside `with strategy.scope():`."
        )


def _is_distributed(variable: Any) -> bool:
    """Whether a Keras or TF variable is backed by a tf.distribute variable."""
    value = getattr(variable, "value", variable)
    return isinstance(value, tf.distribute.DistributedValues)


def sum_across_replicas(strategy: tf.distribute.Strategy, values: Sequence[float]) -> list[float]:
    """Sum ``values`` over every replica of the cluster (a collective: all workers must call).

    Each worker contributes its values once per local replica, so callers that need one
    contribution per worker divide by their local replica count first.
    """
    reduce = _reducers.get(strategy)
    if reduce is None:
        reduce = _reducers[strategy] = _make_reducer(strategy)
    return [float(v) for v in reduce(tf.constant(list(values), dtype=tf.float64)).numpy()]


def _make_reducer(strategy: tf.distribute.Strategy) -> Callable[[tf.Tensor], tf.Tensor]:
    """One traced all-reduce of a float64 vector per strategy (no retracing per call)."""

    def reduce(tensor: tf.Tensor) -> tf.Tensor:
        per_replica = strategy.run(tf.identity, args=(tensor,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    # tf.function is untyped (TensorFlow ships no annotations): name the traced function's type here
    traced: Callable[[tf.Tensor], tf.Tensor] = tf.function(
        reduce, autograph=False, input_signature=[tf.TensorSpec([None], tf.float64)]
    )
    return traced


_reducers: weakref.WeakKeyDictionary[Any, Callable[[tf.Tensor], tf.Tensor]] = weakref.WeakKeyDictionary()


def keras_flavor(model: Any) -> str:
    """``"keras3"`` for a Keras 3 model, ``"tf_keras"`` for a legacy (Keras 2) one, else ``""``.

    tf_keras is what ``tf.keras`` means under ``TF_USE_LEGACY_KERAS=1``; it is never imported
    here, only recognised by the package its classes come from.
    """
    import keras

    if isinstance(model, keras.Model):
        return "keras3" if int(keras.__version__.split(".")[0]) >= 3 else "tf_keras"
    if any(cls.__module__.split(".")[0] == "tf_keras" for cls in type(model).__mro__):
        return "tf_keras"
    return ""
