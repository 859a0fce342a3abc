"""What one ``fit`` call steps through: its schedule, and each input distributed and stepped by epoch.

:class:`FitCall` is a call's checked arguments (the training and validation data, the epochs
and steps, the callbacks and verbosity), handed whole to the Keras 3 loop
(:mod:`.trainer`) or to tf_keras' own ``model.fit`` (:mod:`.tf_keras`). :class:`EpochInput`
distributes one dataset over the strategy's replicas (a ``tf.data.Dataset`` with its
auto-shard policy, or a ``dataset_fn(input_context)``), knows this worker's per-replica element
spec and steps per epoch, and keeps the iterator policy: a new iterator each epoch, or, with a
step count, the one that carries over, started again when it runs out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import keras
import tensorflow as tf

from ...errors import ConfigError

__all__ = [
    "OUT_OF_DATA",
    "DatasetFn",
    "EpochInput",
    "FitCall",
    "FitData",
    "next_step",
    "parse_shard_policy",
    "with_policy",
]

_log = logging.getLogger(__name__)

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]
"""``dataset_fn(input_context) -> tf.data.Dataset`` for ``distribute_datasets_from_function``."""

#: what ``fit`` is given as data: a Dataset of global batches, or a dataset_fn
FitData: TypeAlias = tf.data.Dataset | DatasetFn

_SHARD_POLICIES = {
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
    "hint": tf.data.experimental.AutoShardPolicy.HINT,
}
#: one step on every replica, taking its batch from the input's iterator
StepFn: TypeAlias = Callable[[Iterator[Any] | None], Any]
#: what a step raises when its iterator has no batch left
OUT_OF_DATA = (tf.errors.OutOfRangeError, StopIteration)


@dataclass(frozen=True)
class FitCall:
    """One ``fit`` call's arguments, checked: what it trains and validates on, for how long, and
    what it tells (``verbose`` is Keras' level, resolved from ``"auto"``)."""

    dataset: FitData
    epochs: int
    steps_per_epoch: int | None
    validation_data: FitData | None
    validation_steps: int | None
    callbacks: Sequence[keras.callbacks.Callback] | None
    verbose: int


class EpochInput:
    """A distributed dataset with its per-epoch iterator policy and its local element spec."""

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        data: FitData | tf.distribute.DistributedDataset,
        name: str,
        steps: int | None,
        shard_policy: tf.data.experimental.AutoShardPolicy | None,
    ) -> None:
        self.steps = steps
        self._name = name
        if isinstance(data, tf.data.Dataset):
            self.dataset = strategy.experimental_distribute_dataset(with_policy(data, shard_policy))
        elif isinstance(data, tf.distribute.DistributedDataset):
            self.dataset = data
        elif callable(data):
            if shard_policy is not None:
                raise ConfigError(
                    f"shard_policy applies to a tf.data.Dataset only; a dataset_fn shards its "
                    f"own input with input_context. Received: {name}={data!r}"
                )
            self.dataset = strategy.distribute_datasets_from_function(data)
        else:
            raise ConfigError(
                f"{name} must be a tf.data.Dataset of (x, y) batches or a "
                f"dataset_fn(input_context). Received: {type(data).__name__}"
            )
        self.local_spec = _local_spec(self.dataset.element_spec)
        cardinality = _cardinality(self.dataset, data)
        if steps is None and cardinality == int(tf.data.INFINITE_CARDINALITY):
            raise ConfigError(
                f"{name} is infinite; pass {'steps_per_epoch' if name == 'dataset' else 'validation_steps'}."
            )
        self.known_steps = steps if steps is not None else (cardinality if cardinality >= 0 else None)
        self.carries_over = steps is not None and name == "dataset"
        self.iterator: Iterator[Any] | None = None

    def start_epoch(self) -> None:
        """A new iterator per epoch, or keep the carried-over one when ``steps`` is set."""
        if not self.carries_over or self.iterator is None:
            self.iterator = iter(self.dataset)

    def restart(self) -> Iterator[Any]:
        """Start the data again (it ran out at an epoch boundary)."""
        self.iterator = iter(self.dataset)
        return self.iterator

    def ran_out(self, step: int) -> None:
        """Note that the data ended; with ``steps`` set, warn and restart next epoch."""
        if self.steps is not None and step > 0:
            _log.warning(
                "%s ran out of data after %d of %d steps; the epoch ends early and the next "
                "epoch starts the data again (repeat the dataset to avoid this)",
                self._name,
                step,
                self.steps,
            )
        self.iterator = None


def next_step(step_fn: StepFn, data: EpochInput, step: int) -> Any:
    """Run one step; None when the data ran out.

    A carried-over iterator that is exhausted right at the start of an epoch is restarted once,
    so ``steps_per_epoch`` equal to the data's length works epoch after epoch.
    """
    try:
        return step_fn(data.iterator)
    except OUT_OF_DATA:
        if step == 0 and data.carries_over:
            try:
                return step_fn(data.restart())
            except OUT_OF_DATA:
                pass
        data.ran_out(step)
        return None


def _local_spec(spec: Any) -> Any:
    """The element spec of one replica's batch (unwraps tf.distribute's PerReplicaSpec)."""

    def unwrap(component: Any) -> Any:
        value_specs = getattr(component, "_value_specs", None)
        return value_specs[0] if value_specs else component

    return tf.nest.map_structure(unwrap, spec)


def _cardinality(distributed: tf.distribute.DistributedDataset, original: object) -> int:
    """Steps per epoch on this worker if TensorFlow knows them; negative: unknown/infinite."""
    for source in (distributed, original):
        value = getattr(source, "cardinality", None)
        if value is not None:
            return int(value() if callable(value) else value)
    return int(tf.data.UNKNOWN_CARDINALITY)


def with_policy(dataset: tf.data.Dataset, policy: tf.data.experimental.AutoShardPolicy | None) -> tf.data.Dataset:
    """Set the auto-shard policy on the dataset's options (if one was asked for)."""
    if policy is None:
        return dataset
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)


def parse_shard_policy(value: object) -> tf.data.experimental.AutoShardPolicy | None:
    """Accept an AutoShardPolicy or its lower-case name."""
    if value is None or isinstance(value, tf.data.experimental.AutoShardPolicy):
        return value
    if isinstance(value, str) and value.lower() in _SHARD_POLICIES:
        return _SHARD_POLICIES[value.lower()]
    raise ConfigError(
        f"shard_policy must be one of {', '.join(_SHARD_POLICIES)} or a "
        f"tf.data.experimental.AutoShardPolicy. Received: shard_policy={value!r}"
    )
