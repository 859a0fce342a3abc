"""The sidecar evaluator: evaluate each checkpoint training writes, as it appears (TF's
``SidecarEvaluator``, which Keras 3 lacks; TFoS's ``eval_node``). Door: ``tfonspark.keras``.

:func:`sidecar_evaluate` polls ``checkpoint_dir`` (``tf.train.latest_checkpoint``), restores
each new checkpoint into ``model`` (``tf.train.Checkpoint(model=model)``, partial: the
optimizer's slots are not needed), runs ``model.evaluate`` and sends the metrics two ways:
scalars for TensorBoard under ``log_dir`` (step: the checkpoint's training step) and
``ctx.report({...})`` to the driver. Keras 3 and ``tf_keras`` models alike.

**How it ends.** After ``max_evaluations``; when no new checkpoint appeared for ``timeout``
seconds (an error if none appeared at all); or when the node is asked to stop: the driver
stops the evaluator with SIGTERM once training is done (the chief returned, or ``ps_cluster``'s
block ended), and :func:`stop_on_sigterm` turns that signal into a request the loop reads
between evaluations. The loop then evaluates the newest checkpoint if it has not yet (the
final one: the coordinator saved it before it returned) and returns; the node's grace period
(``shutdown(grace_secs=...)``, at least 2 s) must cover that evaluation.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from ..errors import CheckpointTimeout, ConfigError

__all__ = [
    "DEFAULT_POLL_SECS",
    "DEFAULT_TIMEOUT",
    "Reports",
    "checkpoint_step",
    "sidecar_evaluate",
    "stop_on_sigterm",
    "stop_requested",
]

_log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 3600.0
"""Seconds :func:`sidecar_evaluate` waits for a new checkpoint before it ends (or, if none ever
appeared, raises CheckpointTimeout)."""
DEFAULT_POLL_SECS = 0.5
"""How often the checkpoint directory is looked at while waiting."""

#: checkpoint keys that hold the training step, in order of preference: an explicit ``step``
#: (``tf.train.Checkpoint(step=...)``), the optimizer's iterations (Keras 3 and tf_keras)
_STEP_KEYS = (
    re.compile(r"^step/\.ATTRIBUTES/VARIABLE_VALUE$"),
    re.compile(r"(^|/)optimizer/_?iterations/\.ATTRIBUTES/VARIABLE_VALUE$"),
    re.compile(r"^save_counter/\.ATTRIBUTES/VARIABLE_VALUE$"),
)


class Reports(Protocol):
    """Where the metrics go: a node's context (``ctx.report``)."""

    def report(self, metrics: Mapping[str, Any]) -> None: ...


class _Stop:
    """SIGTERM seen (set from the signal handler: a plain flag, no lock a handler could deadlock on)."""

    requested = False
    installed = False


def _on_sigterm(signum: int, frame: Any) -> None:
    del signum, frame
    _Stop.requested = True


def stop_on_sigterm() -> bool:
    """Make SIGTERM a stop request for :func:`sidecar_evaluate` in this process, instead of death.

    Only the main thread can set signal handlers: elsewhere this does nothing and returns False.
    The evaluator node calls it before the user's function runs, so a stop that arrives during
    set-up still lets the loop evaluate the last checkpoint.

    Examples
    --------
    >>> from tfonspark.distribute.sidecar import stop_on_sigterm
    >>> stop_on_sigterm()  # doctest: +SKIP
    True
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    _Stop.installed = True
    return True


def stop_requested() -> bool:
    """Whether this process was asked to stop (SIGTERM after :func:`stop_on_sigterm`).

    Examples
    --------
    >>> from tfonspark.distribute.sidecar import stop_requested
    >>> stop_requested()
    False
    """
    return _Stop.requested


def checkpoint_step(path: str) -> int:
    """The training step a checkpoint was written at: its ``step`` variable, else its optimizer's
    iterations, else its save counter, else the number ending its path (``ckpt-7``: 7).

    Parameters
    ----------
    path : str
        A checkpoint prefix, as ``tf.train.latest_checkpoint`` returns it.

    Examples
    --------
    >>> checkpoint_step("/shared/ckpt/ckpt-3")  # doctest: +SKIP
    1500
    """
    import tensorflow as tf

    return _step_of(tf.train.load_checkpoint(path), path)


def _step_of(reader: Any, path: str) -> int:
    keys = list(reader.get_variable_to_shape_map())
    for pattern in _STEP_KEYS:
        for key in sorted(keys, key=len):  # the root's optimizer before one nested in the model
            if pattern.search(key):
                return int(reader.get_tensor(key))
    number = re.search(r"-(\d+)$", path)
    return int(number.group(1)) if number else 0


def _root_children(reader: Any) -> set[str]:
    """The names the checkpoint's root object saved (``{"model", "optimizer", "save_counter"}``)."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return {child.local_name for child in graph.nodes[0].children} if graph.nodes else set()


def sidecar_evaluate(
    ctx: Reports | None,
    model: Any,
    data: Any,
    checkpoint_dir: str,
    *,
    steps: int | None = None,
    log_dir: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    max_evaluations: int | None = None,
    poll_secs: float = DEFAULT_POLL_SECS,
) -> list[dict[str, Any]]:
    """Evaluate every new checkpoint in ``checkpoint_dir`` until training ends; the reports made.

    For each checkpoint: restore ``model``'s variables, ``model.evaluate(data, steps=steps)``,
    write each metric as a TensorBoard scalar under ``log_dir`` (step: :func:`checkpoint_step`)
    and ``ctx.report({**metrics, "checkpoint": path, "step": step})``. It ends after
    ``max_evaluations``, when no new checkpoint appeared for ``timeout`` seconds, or when the
    node is stopped (SIGTERM: the newest checkpoint is evaluated first). See the module doc.

    Parameters
    ----------
    ctx : NodeContext or None
        Where reports go (``ctx.report``); None sends none.
    model : keras.Model or tf_keras.Model
        Compiled (its metrics are reported) and built, with the trained model's architecture.
    data : tf.data.Dataset, or tuple
        What ``model.evaluate`` reads: a dataset, or ``(x, y)``. Finite, or give ``steps``.
    checkpoint_dir : str
        Where the coordinator saves ``tf.train.Checkpoint(model=model, ...)`` (a ``CheckpointManager``
        or ``Checkpoint.save``: the directory's ``checkpoint`` file names the newest).
    steps : int, optional
        Batches per evaluation (``model.evaluate(steps=...)``).
    log_dir : str, optional
        TensorBoard summaries; default ``<checkpoint_dir>/eval``; ``""`` writes none.
    timeout : float
        Seconds to wait for a new checkpoint (the first one too) before ending.
    max_evaluations : int, optional
        End after this many evaluations.
    poll_secs : float
        How often ``checkpoint_dir`` is looked at while waiting.

    Raises CheckpointTimeout if no checkpoint appeared within ``timeout``, ConfigError for a
    bad argument or a checkpoint that matches nothing in ``model``.

    Examples
    --------
    >>> def map_fun(args, ctx):  # doctest: +SKIP
    ...     if ctx.job_name == "evaluator":
    ...         model = build_model()  # compiled, with the trained model's layers
    ...         return tfonspark.keras.sidecar_evaluate(ctx, model, test_data, args["ckpt_dir"])
    """
    _check_args(model, timeout, max_evaluations, poll_secs)
    loop = _Loop(ctx, model, data, steps, _log_dir(checkpoint_dir, log_dir))
    previous = None if _Stop.installed else signal.getsignal(signal.SIGTERM)
    mine = previous is not None and stop_on_sigterm()
    try:
        return loop.run(checkpoint_dir, timeout, max_evaluations, poll_secs)
    finally:
        loop.close()
        if mine:  # installed for this call only (outside a cluster): put the old handler back
            signal.signal(signal.SIGTERM, previous)
            _Stop.installed = _Stop.requested = False


def _check_args(model: Any, timeout: float, max_evaluations: int | None, poll_secs: float) -> None:
    if not callable(getattr(model, "evaluate", None)):
        raise ConfigError(f"sidecar_evaluate needs a Keras model (model.evaluate). Received: {type(model).__name__}")
    if getattr(model, "built", True) is False:
        raise ConfigError("sidecar_evaluate needs a built model: give it a keras.Input or call model.build(...)")
    if not timeout > 0:
        raise ConfigError(f"sidecar_evaluate needs timeout > 0 seconds. Received: timeout={timeout!r}")
    if max_evaluations is not None and max_evaluations < 1:
        raise ConfigError(f"max_evaluations must be >= 1 or None. Received: max_evaluations={max_evaluations!r}")
    if not poll_secs > 0:
        raise ConfigError(f"poll_secs must be > 0. Received: poll_secs={poll_secs!r}")


def _log_dir(checkpoint_dir: str, log_dir: str | None) -> str:
    return os.path.join(checkpoint_dir, "eval") if log_dir is None else log_dir


class _Loop:
    """One evaluator's state: the model's checkpoint object, the summary writer, what was evaluated."""

    def __init__(self, ctx: Reports | None, model: Any, data: Any, steps: int | None, log_dir: str) -> None:
        import tensorflow as tf

        self.ctx, self.model, self.data, self.steps = ctx, model, data, steps
        self.checkpoint = tf.train.Checkpoint(model=model)
        self.writer = tf.summary.create_file_writer(log_dir) if log_dir else None
        self.reports: list[dict[str, Any]] = []
        self.seen: str | None = None

    def run(self, checkpoint_dir: str, timeout: float, max_evaluations: int | None, poll_secs: float) -> list[Any]:
        """Evaluate new checkpoints until one of the ends (module doc)."""
        import tensorflow as tf

        deadline = time.monotonic() + timeout
        while True:
            stopping = _Stop.requested  # read before looking: a stop means the newest is on disk
            latest = tf.train.latest_checkpoint(checkpoint_dir)
            if latest and latest != self.seen:
                self.seen = latest
                if self.evaluate(latest):
                    deadline = time.monotonic() + timeout
                    if max_evaluations and len(self.reports) >= max_evaluations:
                        return self.reports
                continue
            if stopping:
                _log.info("sidecar evaluator stopped after %d evaluations", len(self.reports))
                return self.reports
            left = deadline - time.monotonic()
            if left <= 0:
                return self.timed_out(checkpoint_dir, timeout)
            time.sleep(min(poll_secs, left))

    def timed_out(self, checkpoint_dir: str, timeout: float) -> list[dict[str, Any]]:
        if not self.reports:
            raise CheckpointTimeout(
                f"sidecar_evaluate: no checkpoint appeared in {checkpoint_dir!r} within timeout={timeout:g}s "
                "(check that the coordinator saves there, or raise timeout)"
            )
        _log.warning(
            "sidecar evaluator: no new checkpoint in %r within timeout=%gs; ending after %d evaluations",
            checkpoint_dir,
            timeout,
            len(self.reports),
        )
        return self.reports

    def evaluate(self, path: str) -> bool:
        """Restore, evaluate, write and report one checkpoint; False if it vanished meanwhile."""
        import tensorflow as tf

        started = time.monotonic()
        try:
            reader = tf.train.load_checkpoint(path)
            saved = _root_children(reader)
            step = _step_of(reader, path)
            if "model" in saved:
                self.checkpoint.restore(path).expect_partial()
        except tf.errors.NotFoundError as exc:  # deleted by a CheckpointManager's max_to_keep
            _log.warning("sidecar evaluator: checkpoint %s is gone, skipped: %s", path, exc)
            return False
        except ValueError as exc:  # a variable's shape differs: another architecture
            raise ConfigError(f"checkpoint {path} does not fit the model: {exc}") from None
        if "model" not in saved:
            raise ConfigError(
                f"checkpoint {path} holds none of the model's variables: save it as "
                f"tf.train.Checkpoint(model=model, ...). Received: {sorted(saved)}"
            )
        metrics = {name: float(value) for name, value in self.run_evaluate().items()}
        self.write(metrics, step)
        report = {**metrics, "checkpoint": path, "step": step}
        if self.ctx is not None:
            self.ctx.report(report)
        self.reports.append(report)
        _log.info("sidecar evaluator: %s (step %d) in %.2fs: %s", path, step, time.monotonic() - started, metrics)
        return True

    def run_evaluate(self) -> Mapping[str, Any]:
        if isinstance(self.data, tuple) and len(self.data) == 2:
            x, y = self.data
            result = self.model.evaluate(x, y, steps=self.steps, verbose=0, return_dict=True)
        else:
            result = self.model.evaluate(self.data, steps=self.steps, verbose=0, return_dict=True)
        return dict(result)

    def write(self, metrics: Mapping[str, float], step: int) -> None:
        if self.writer is None:
            return
        import tensorflow as tf

        with self.writer.as_default():
            for name, value in metrics.items():
                tf.summary.scalar(name, value, step=step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
