"""One replica's train and test step that never runs the model on an empty batch.

Why: under ``MultiWorkerMirroredStrategy`` a worker whose input ran out while another's has
not receives 0-row batches (``tf.distribute``'s handling of uneven input), and every worker
must still join each step's gradient all-reduce. TensorFlow's default oneDNN CPU kernels reject
a ``Conv2D`` on 0 rows, and ``BatchNormalization`` turns the batch statistics of 0 rows into
NaN weights. So a replica step here runs the model's own ``train_step`` (or ``test_step``)
inside ``tf.cond(rows > 0, ...)``; on an empty batch it skips the model and contributes zero
gradients, and no metric, loss-tracker or layer-state update.

The cond branch cannot hold the all-reduce (a collective must run on every worker, every
step), so the optimizer's ``apply`` is deferred: while ``train_step`` is traced, the
optimizer's ``apply`` only records the gradients and variables it is given; the branch
returns those gradients (zeros on an empty batch), and the recorded ``apply`` calls are made
after the cond, in the same order, on every replica. Nothing changes at run time but a cond.
This keeps every part of the model's own step (its loss, metrics, custom ``train_step``);
what runs after the optimizer call inside a custom ``train_step`` and reads the updated
weights would see them before the update (the stock step reads none).

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

__all__ = ["batch_rows", "guarded_test_step", "guarded_train_step"]

ReplicaStep = Callable[[Any], tuple[Any, tf.Tensor]]


def batch_rows(data: Any) -> tf.Tensor:
    """Rows in one replica's batch: the leading dimension of its first component."""
    return tf.shape(tf.nest.flatten(data)[0])[0]


def guarded_train_step(model: Any) -> ReplicaStep:
    """``replica_step(data) -> (logs, rows)``: the model's train_step, skipped on 0 rows."""

    def replica_step(data: Any) -> tuple[Any, tf.Tensor]:
        rows = batch_rows(data)
        with tf.control_dependencies(tf.nest.flatten(data)):  # no update when next() fails
            calls = _ApplyCalls()
            logs_spec: list[Any] = []

            def real() -> list[Any]:
                with _deferred_apply(model.optimizer, calls):
                    logs = model.train_step(data)
                logs_spec.append(logs)
                return [calls.gradients(), logs]

            def empty() -> list[Any]:
                return [calls.zero_gradients(), _unchanged_logs(model, logs_spec[0])]

            if tf.executing_eagerly():  # run_eagerly: only one branch would be traced
                return _eager_train_step(model, data, rows), rows
            gradients, logs = tf.cond(rows > 0, real, empty)
            calls.replay(model.optimizer, gradients)
        return logs, rows

    return replica_step


def guarded_test_step(model: Any) -> ReplicaStep:
    """``replica_step(data) -> (logs, rows)``: the model's test_step, skipped on 0 rows."""

    def replica_step(data: Any) -> tuple[Any, tf.Tensor]:
        rows = batch_rows(data)
        logs_spec: list[Any] = []

        def real() -> Any:
            logs = model.test_step(data)
            logs_spec.append(logs)
            return logs

        def empty() -> Any:
            return _unchanged_logs(model, logs_spec[0])

        if tf.executing_eagerly():
            return (model.test_step(data) if int(rows) else model.get_metrics_result()), rows
        with tf.control_dependencies(tf.nest.flatten(data)):
            return tf.cond(rows > 0, real, empty), rows

    return replica_step


def _eager_train_step(model: Any, data: Any, rows: tf.Tensor) -> Any:
    """``run_eagerly``: a Python branch; an empty batch applies zeros to every trainable weight."""
    if int(rows):
        return model.train_step(data)
    variables = list(model.trainable_variables)
    model.optimizer.apply([tf.zeros_like(v) for v in variables], variables)
    return model.get_metrics_result()


@dataclass
class _ApplyCalls:
    """The optimizer ``apply`` calls one traced ``train_step`` made, to be made again later."""

    calls: list[tuple[list[Any], list[Any]]] = field(default_factory=list)

    def record(self, grads: Any, variables: Any) -> None:
        self.calls.append((list(grads), list(variables)))

    def gradients(self) -> list[Any]:
        """Every recorded gradient that exists (a None gradient stays None, statically)."""
        return [g for g, _ in self._flowing()]

    def zero_gradients(self) -> list[Any]:
        """Zeros for :meth:`gradients`, shaped by their variables (read after the real branch
        was traced; a cond branch may not touch the other branch's tensors)."""
        return [_zeros_for(g, v) for g, v in self._flowing()]

    def _flowing(self) -> list[tuple[Any, Any]]:
        return [
            (g, v) for grads, variables in self.calls for g, v in zip(grads, variables, strict=True) if g is not None
        ]

    def replay(self, optimizer: Any, gradients: list[Any]) -> None:
        """Make each recorded call again with the cond's gradients, Nones where they were."""
        flowing: Iterator[Any] = iter(gradients)
        for grads, variables in self.calls:
            given = [None if g is None else next(flowing) for g in grads]
            pairs = [(g, v) for g, v in zip(given, variables, strict=True) if g is not None]
            if pairs:
                optimizer.apply([g for g, _ in pairs], [v for _, v in pairs])


@contextmanager
def _deferred_apply(optimizer: Any, calls: _ApplyCalls) -> Iterator[None]:
    """While tracing, the optimizer's ``apply`` (which ``apply_gradients`` calls) only records."""

    def record(grads: Any, trainable_variables: Any = None) -> None:
        if trainable_variables is None:
            trainable_variables = optimizer._trainable_variables  # Keras' own default
        calls.record(grads, trainable_variables)

    optimizer.apply = record
    try:
        yield
    finally:
        del optimizer.apply


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
