"""A line that names the fix, for the known ways TFoS-era code fails on today's TF/Keras/numpy.

Appended to the traceback a failing ``map_fun`` reports, so it reaches the driver's error
(``NodeFailed``) as the last line of the node's traceback tail.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Iterator, Mapping

__all__ = ["add_ps_hint", "hint_for", "ps_hint_for"]

_KERAS3_MWMS = (
    "Keras 3 cannot run model.fit under MultiWorkerMirroredStrategy on this TensorFlow. Fix: pip install "
    "'tfonspark[tfos]' (tf_keras) and start the cluster with TFCluster.run or legacy_keras='on' "
    "(Keras 2, TF_USE_LEGACY_KERAS=1), or train with tfonspark.keras.fit (Keras 3)."
)
_DRIVER_KERAS3 = (
    "Keras 3 code raised this on a node that runs Keras 2 (TF_USE_LEGACY_KERAS=1): Keras 3 classes "
    "were imported on the driver (e.g. 'from tensorflow.keras import Sequential' at module level) and "
    "map_fun carried them along, next to the node's tf.keras (Keras 2). Fix: set TF_USE_LEGACY_KERAS=1 "
    "in the driver's environment before TensorFlow is imported, or import tf.keras inside map_fun."
)
_NO_TF_KERAS = (
    "TF_USE_LEGACY_KERAS=1 asks for Keras 2 but tf_keras is not installed in the executors' Python. "
    "Fix: pip install 'tfonspark[tfos]', or set spark.tfonspark.legacyKeras=off for Keras 3."
)
_NO_ESTIMATOR = (
    "tensorflow_estimator was removed with tf.estimator in TensorFlow 2.16. TFCluster.run provides its "
    "export_lib.get_timestamped_export_dir for TFoS programs; elsewhere use "
    "os.path.join(export_dir, str(int(time.time())))."
)
_EMPTY_BATCH = (
    "A replica's batch had 0 rows, and TensorFlow's oneDNN CPU kernels reject a Conv2D on 0 rows. Under "
    "MultiWorkerMirroredStrategy this happens with uneven input: a worker ran out of data before the "
    "others, or the last global batch had fewer rows than there are workers. Fix: train with "
    "tfonspark.keras.fit (Keras 3 or tf_keras models), which never runs the model on an empty batch; or "
    "give every worker the same number of full batches (batch(..., drop_remainder=True), a "
    "steps_per_epoch every worker's data reaches). TF_ENABLE_ONEDNN_OPTS=0 also avoids it, at a speed cost."
)
_EMPTY_BATCH_ERRORS = ("input depth must be evenly divisible by filter depth", "Incompatible shapes: [0,")
_KERAS3_PS = (
    "Keras 3's model.fit (and evaluate/predict) cannot feed ParameterServerStrategy on this TensorFlow: "
    "the strategy takes data only through ClusterCoordinator.create_per_worker_dataset. Fix: train in a "
    "custom loop (coordinator.create_per_worker_dataset(dataset_fn), coordinator.schedule(step); see "
    "docs/ps.md), or use tf_keras (pip install 'tfonspark[tfos]') and its model.fit with "
    "tf_keras.utils.experimental.DatasetCreator(dataset_fn) and steps_per_epoch."
)
_KERAS3_PS_ERROR = "pass this dataset to ClusterCoordinator.create_per_worker_dataset"
_NP_ALIAS = (
    "numpy 1.24 removed the aliases np.int, np.float, np.bool and np.object (TFoS-era code uses them). "
    "Fix: use int, float, bool, object or np.int64/np.float64 instead."
)


def _collective_timeout(environ: Mapping[str, str]) -> str:
    """What a collective's ``DeadlineExceededError`` means: the peers it waited on, named from ``TF_CONFIG``."""
    try:
        config = json.loads(environ.get("TF_CONFIG", "") or "{}")
        task = config.get("task", {})
        me = f"{task.get('type')}:{task.get('index')}"
        peers = [
            f"{role}:{i} at {address}"
            for role, addresses in config.get("cluster", {}).items()
            if role in ("chief", "worker")
            for i, address in enumerate(addresses)
            if f"{role}:{i}" != me
        ]
    except (ValueError, AttributeError, TypeError):
        peers = []
    waited = f" ({', '.join(peers)})" if peers else ""
    limit = environ.get("TFONSPARK_COLLECTIVE_TIMEOUT", "")
    return (
        f"A collective (an all-reduce of the step) waited {limit + ' s, ' if limit else ''}its timeout_seconds, for "
        f"the other workers{waited} and one of them did not take part: its host is unreachable or its process "
        "died (the driver's NodeFailed names it first once its supervisor has gone silent), or its steps are slower "
        "than the timeout. Fix: raise collective_timeout (run(collective_timeout=...) or "
        "tfonspark.distribute.strategy(timeout_seconds=...)) if the steps are slow."
    )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _hint(exc: BaseException, legacy: bool, environ: Mapping[str, str]) -> str:
    text = str(exc)
    if type(exc).__name__ == "DeadlineExceededError" and (
        "ollective" in text or environ.get("TFONSPARK_COLLECTIVE_TIMEOUT")
    ):
        return _collective_timeout(environ)
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "tensorflow_estimator":
        return _NO_ESTIMATOR
    if isinstance(exc, ImportError) and legacy and ("tf_keras" in text or "Keras cannot be imported" in text):
        return _NO_TF_KERAS
    aliases = ("'int'", "'float'", "'bool'", "'object'", "'str'", "'long'")
    if (
        isinstance(exc, AttributeError)
        and "module 'numpy' has no attribute" in text
        and any(a in text for a in aliases)
    ):
        return _NP_ALIAS
    if type(exc).__name__ == "InvalidArgumentError" and any(e in text for e in _EMPTY_BATCH_ERRORS):
        return _EMPTY_BATCH
    if _is_ps_dataset_error(exc):
        return _KERAS3_PS
    if legacy and _raised_in_keras3(exc):
        return _DRIVER_KERAS3
    if isinstance(exc, ValueError) and not legacy and ("PerReplica" in text or "Invalid reduction dimension" in text):
        return _KERAS3_MWMS
    return ""


def _is_ps_dataset_error(exc: BaseException) -> bool:
    """TF's refusal of a dataset not made by the coordinator: what Keras 3's fit meets under PS."""
    return isinstance(exc, ValueError) and _KERAS3_PS_ERROR in str(exc)


def _raised_in_keras3(exc: BaseException) -> bool:
    """Whether Keras 3's own code (``keras/src/``) is on ``exc``'s traceback."""
    return any(
        f"{os.sep}keras{os.sep}src{os.sep}" in frame.filename for frame in traceback.extract_tb(exc.__traceback__)
    )


def hint_for(exc: BaseException, environ: Mapping[str, str] | None = None) -> str:
    """The fix for ``exc`` (or an exception it was raised from), or ``""`` if it is not a known case."""
    environ = os.environ if environ is None else environ
    legacy = environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")
    for link in _chain(exc):
        found = _hint(link, legacy, environ)
        if found:
            return found
    return ""


def ps_hint_for(exc: BaseException) -> str:
    """The fix for ``exc`` if it is a known way a parameter-server coordinator fails, else ``""``.

    Narrower than :func:`hint_for`: the coordinator is the user's driver program, where the
    MWMS and TFoS-era hints would mislead.
    """
    return _KERAS3_PS if any(_is_ps_dataset_error(link) for link in _chain(exc)) else ""


def add_ps_hint(exc: BaseException) -> None:
    """Add ``Hint: <fix>`` to ``exc``'s notes (Python >= 3.11) when :func:`ps_hint_for` knows one."""
    hint = ps_hint_for(exc)
    note = f"Hint: {hint}"
    if hint and hasattr(exc, "add_note") and note not in getattr(exc, "__notes__", ()):
        exc.add_note(note)
