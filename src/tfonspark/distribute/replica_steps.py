"""One replica's train and test step that never runs the model on an empty batch.

Why: under ``MultiWorkerMirroredStrategy`` a worker whose input ran out while another's has
not receives 0-row batches (``tf.distribute``'s handling of uneven input), and every worker
must still join each step's gradient all-reduce. TensorFlow's default oneDNN CPU kernels reject
a ``Conv2D`` on 0 rows, and ``BatchNormalization`` turns the batch statistics of 0 rows into
NaN weights. So a replica step here runs the model's own ``train_step`` (or ``test_step``)
inside ``tf.cond(rows > 0, ...)``; on an empty batch it skips the model and contributes zero
gradients, and no metric, loss-tracker or layer-state update.

The cond branch cannot hold the all-reduce (a collective must run on every worker, every
step), so the optimizer update is deferred: while ``train_step`` is traced, the optimizer's
``apply`` (Keras 3; tf_keras: ``apply_gradients``) only records the gradients and variables it
is given; the branch returns those gradients (zeros on an empty batch), and the recorded calls
are made after the cond, in the same order, on every replica. Nothing changes at run time but
a cond. This keeps every part of the model's own step (its loss, metrics, custom
``train_step``); what runs after the optimizer call inside a custom ``train_step`` and reads
the updated weights would see them before the update (the stock steps read none).
:func:`guard_legacy_steps` gives a tf_keras model's own ``fit`` the same steps.

The result equals training on the real rows only: with Keras' loss scaling (each replica's
mean loss divided by the replica count) the all-reduced gradient of a step in which only some
replicas have rows is the sum of those replicas' terms, exactly what it is when the others
add zeros, and the epoch's metrics count only real rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

__all__ = ["batch_rows", "guard_legacy_steps", "guarded_test_step", "guarded_train_step"]

ReplicaStep = Callable[[Any], tuple[Any, tf.Tensor]]


def batch_rows(data: Any) -> tf.Tensor:
    """Rows in one replica's batch: the leading dimension of its first component."""
    return tf.shape(tf.nest.flatten(data)[0])[0]


def guarded_train_step(model: Any, *, metrics_after: bool = False) -> ReplicaStep:
    """``replica_step(data) -> (logs, rows)``: the model's train_step, skipped on 0 rows.

    ``metrics_after``: the logs are ``model.get_metrics_result()`` read after the cond (tf_keras,
    whose metric results are a cross-replica ``merge_call``, which no cond branch may hold).
    """
    train_step = model.train_step  # bound now: guard_legacy_steps replaces the attribute

    def replica_step(data: Any) -> tuple[Any, tf.Tensor]:
        rows = batch_rows(data)
        with tf.control_dependencies(tf.nest.flatten(data)):  # no update when next() fails
            calls = _ApplyCalls(_apply_method(model.optimizer))
            logs_spec: list[Any] = []

            def real() -> list[Any]:
                with calls.deferring(model.optimizer), _no_metric_results(model, metrics_after):
                    logs = train_step(data)
                logs_spec.append(logs)
                return [calls.gradients(), 0 if metrics_after else logs]

            def empty() -> list[Any]:
                return [calls.zero_gradients(), 0 if metrics_after else _unchanged_logs(model, logs_spec[0])]

            if tf.executing_eagerly():  # run_eagerly: only one branch would be traced
                return _eager_train_step(model, train_step, data, rows), rows
            gradients, logs = tf.cond(rows > 0, real, empty)
            calls.replay(model.optimizer, gradients)
        return (model.get_metrics_result() if metrics_after else logs), rows

    return replica_step


def guarded_test_step(model: Any, *, metrics_after: bool = False) -> ReplicaStep:
    """``replica_step(data) -> (logs, rows)``: the model's test_step, skipped on 0 rows."""
    test_step = model.test_step

    def replica_step(data: Any) -> tuple[Any, tf.Tensor]:
        rows = batch_rows(data)
        logs_spec: list[Any] = []

        def real() -> Any:
            with _no_metric_results(model, metrics_after):
                logs = test_step(data)
            logs_spec.append(logs)
            return 0 if metrics_after else logs

        def empty() -> Any:
            return 0 if metrics_after else _unchanged_logs(model, logs_spec[0])

        if tf.executing_eagerly():
            return (test_step(data) if int(rows) else model.get_metrics_result()), rows
        with tf.control_dependencies(tf.nest.flatten(data)):
            logs = tf.cond(rows > 0, real, empty)
        return (model.get_metrics_result() if metrics_after else logs), rows

    return replica_step


@contextmanager
def _no_metric_results(model: Any, active: bool) -> Iterator[None]:
    """While tracing a cond branch, ``get_metrics_result`` returns nothing (read after the cond)."""
    if not active:
        yield
        return
    model.get_metrics_result = dict
    try:
        yield
    finally:
        del model.get_metrics_result


@contextmanager
def guard_legacy_steps(model: Any) -> Iterator[None]:
    """A tf_keras model's own ``fit`` calls the guarded steps while the block runs.

    tf_keras runs ``model.train_step`` inside ``strategy.run`` itself and fails on 0-row batches
    under oneDNN the same way; its step functions are rebuilt on entry and on exit.
    """
    train = guarded_train_step(model, metrics_after=True)
    test = guarded_test_step(model, metrics_after=True)
    model.train_step = lambda data: train(data)[0]
    model.test_step = lambda data: test(data)[0]
    model.train_function = model.test_function = None
    try:
        yield
    finally:
        del model.train_step, model.test_step
        model.train_function = model.test_function = None


def _eager_train_step(model: Any, train_step: Callable[[Any], Any], data: Any, rows: tf.Tensor) -> Any:
    """``run_eagerly``: a Python branch; an empty batch applies zeros to every trainable weight."""
    if int(rows):
        return train_step(data)
    variables = list(model.trainable_variables)
    zeros = [tf.zeros_like(v) for v in variables]
    if _apply_method(model.optimizer) == "apply":
        model.optimizer.apply(zeros, variables)
    else:
        model.optimizer.apply_gradients(zip(zeros, variables))
    return model.get_metrics_result()


def _apply_method(optimizer: Any) -> str:
    """The optimizer method every update goes through: Keras 3's ``apply`` (which
    ``apply_gradients`` calls), else ``apply_gradients`` (tf_keras, both optimizer kinds)."""
    return "apply" if hasattr(optimizer, "apply") and _is_keras3(optimizer) else "apply_gradients"


def _is_keras3(obj: Any) -> bool:
    return any(cls.__module__.startswith("keras.src.") for cls in type(obj).__mro__)


@dataclass
class _ApplyCalls:
    """The optimizer calls one traced ``train_step`` made, to be made again later."""

    method: str
    calls: list[tuple[list[Any], list[Any], dict[str, Any]]] = field(default_factory=list)

    @contextmanager
    def deferring(self, optimizer: Any) -> Iterator[None]:
        """While tracing, the optimizer's update method only records what it is given."""

        def record_apply(grads: Any, trainable_variables: Any = None) -> None:
            if trainable_variables is None:
                trainable_variables = optimizer._trainable_variables  # Keras' own default
            self.calls.append((list(grads), list(trainable_variables), {}))

        def record_apply_gradients(grads_and_vars: Any, *args: Any, **kwargs: Any) -> None:
            if args:
                kwargs["name"] = args[0]
            pairs = list(grads_and_vars)
            self.calls.append(([g for g, _ in pairs], [v for _, v in pairs], kwargs))

        setattr(optimizer, self.method, record_apply if self.method == "apply" else record_apply_gradients)
        try:
            yield
        finally:
            delattr(optimizer, self.method)

    def gradients(self) -> list[Any]:
        """Every recorded gradient that exists (a None gradient stays None, statically)."""
        return [g for g, _ in self._flowing()]

    def zero_gradients(self) -> list[Any]:
        """Zeros for :meth:`gradients`, shaped by their variables (read after the real branch
        was traced; a cond branch may not touch the other branch's tensors)."""
        return [_zeros_for(g, v) for g, v in self._flowing()]

    def _flowing(self) -> list[tuple[Any, Any]]:
        return [
            (g, v) for grads, variables, _ in self.calls for g, v in zip(grads, variables, strict=True) if g is not None
        ]

    def replay(self, optimizer: Any, gradients: list[Any]) -> None:
        """Make each recorded call again with the cond's gradients, Nones where they were."""
        flowing: Iterator[Any] = iter(gradients)
        for grads, variables, kwargs in self.calls:
            given = [None if g is None else next(flowing) for g in grads]
            pairs = [(g, v) for g, v in zip(given, variables, strict=True) if g is not None]
            if not pairs:
                continue
            if self.method == "apply":
                optimizer.apply([g for g, _ in pairs], [v for _, v in pairs])
            else:
                optimizer.apply_gradients(pairs, **kwargs)


def _unchanged_logs(model: Any, traced: Any) -> Any:
    """The logs a skipped step returns: the running metric values, or zeros shaped like the
    real step's logs when a custom step returns something else."""
    current = model.get_metrics_result()
    try:
        tf.nest.assert_same_structure(current, traced)
        return tf.nest.map_structure(lambda now, was: tf.cast(now, was.dtype), current, traced)
    except (TypeError, ValueError):
        return tf.nest.map_structure(lambda was: tf.zeros(was.shape, was.dtype), traced)


def _zeros_for(gradient: Any, variable: Any) -> Any:
    """Zeros standing for ``gradient`` of ``variable``: dense, or an empty IndexedSlices."""
    shape = tf.TensorShape(variable.shape)
    if isinstance(gradient, tf.IndexedSlices):
        values = tf.zeros([0, *shape[1:].as_list()], gradient.values.dtype)
        dense_shape = (
            tf.constant(shape.as_list(), gradient.dense_shape.dtype) if gradient.dense_shape is not None else None
        )
        return tf.IndexedSlices(values, tf.zeros([0], gradient.indices.dtype), dense_shape)
    return tf.zeros(shape, gradient.dtype)
