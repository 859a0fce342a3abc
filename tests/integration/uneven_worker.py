"""One TF node for test_uneven_input.py: Conv2D models under MWMS with uneven input, oneDNN on.

Run with ``TF_CONFIG`` set: ``python uneven_worker.py OUT_JSON`` (Keras 3), or
``python uneven_worker.py legacy OUT_JSON`` with ``TF_USE_LEGACY_KERAS=1`` (tf_keras, below). Worker 0 has
``BATCHES[0]`` = 3 batches of ``PER_REPLICA`` rows, worker 1 has 7, so from step 4 on worker 0
gets 0-row batches (``tf.distribute``'s handling of uneven input) while it joins every step's
all-reduce. Two models train, one after the other, through ``tfonspark.keras.fit``:

* ``bn``: Conv2D + BatchNormalization + Dense with plain SGD, 2 epochs; its start weights are
  recorded so that the test can replay the same steps in one process and compare weights;
* ``cnn``: the demo CNN (Conv2D x2, Dropout, Adam with cosine decay), 1 epoch, with validation
  data that is uneven too.

``legacy``: a tf_keras Conv2D + BatchNormalization model through ``tfonspark.keras.fit`` (its own
``model.fit`` underneath), all workers reading one dataset of ``LEGACY_ROWS`` = 3 global batches
and 1 row, DATA-sharded: the last step gives one worker 1 row and the other 0 rows.

Writes what it saw (weights, history, optimizer iterations, rows) to OUT_JSON.
"""

from __future__ import annotations

import json
import sys

import numpy as np

BATCHES = (3, 7)
PER_REPLICA = 8
LEARNING_RATE = 0.05
BN_EPOCHS = 2


def worker_data(index: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker ``index``'s rows: ``BATCHES[index] * PER_REPLICA`` MNIST-shaped images and labels."""
    rng = np.random.default_rng(100 + index)
    rows = BATCHES[index] * PER_REPLICA
    return rng.random((rows, 784), dtype=np.float32), rng.integers(0, 10, rows).astype(np.int64)


def bn_model(seed: int = 7):
    """Conv2D + BatchNormalization, compiled with SGD (its steps can be replayed exactly)."""
    import keras

    keras.utils.set_random_seed(seed)
    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input((784,)),
            layers.Reshape((28, 28, 1)),
            layers.Conv2D(4, 3, strides=2),
            layers.BatchNormalization(),
            layers.ReLU(),
            layers.Flatten(),
            layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(LEARNING_RATE),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


LEGACY_ROWS = 3 * 2 * PER_REPLICA + 1


def legacy(out_path: str) -> None:
    """tf_keras (``TF_USE_LEGACY_KERAS=1``): its own fit under MWMS, through tfonspark.keras.fit."""
    from tfonspark import distribute

    strategy = distribute.strategy()
    import tensorflow as tf
    import tf_keras

    import tfonspark.keras as tfk

    rng = np.random.default_rng(0)
    x, y = rng.random((LEGACY_ROWS, 784), dtype=np.float32), rng.integers(0, 10, LEGACY_ROWS)
    layers = tf_keras.layers
    with strategy.scope():
        model = tf_keras.Sequential(
            [
                layers.Reshape((28, 28, 1), input_shape=(784,)),
                layers.Conv2D(8, 5, padding="same", activation="relu"),
                layers.MaxPooling2D(),
                layers.Conv2D(8, 5, padding="same", activation="relu"),
                layers.BatchNormalization(),
                layers.Flatten(),
                layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=tf_keras.optimizers.SGD(LEARNING_RATE),
            loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(2 * PER_REPLICA)
    history = tfk.fit(model, ds, epochs=2, validation_data=ds, shard_policy="data", verbose=0)
    result = {
        "uses_tf_keras": tf.keras.Model is tf_keras.Model,
        "weights_sum": [float(np.abs(w).sum()) for w in model.trainable_weights],
        "finite": bool(all(np.isfinite(w).all() for w in model.get_weights())),
        "history": history.history,
        "iterations": int(model.optimizer.iterations.numpy()),
    }
    with open(out_path, "w") as out:
        json.dump(result, out)


def main(out_path: str) -> None:
    from tfonspark import distribute

    strategy = distribute.strategy()  # before any other TensorFlow op
    import keras
    import tensorflow as tf

    import tfonspark.keras as tfk
    from tfonspark.demo.model import build_model

    task = distribute.task_info()
    x, y = worker_data(task.task_id)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(ctx.get_per_replica_batch_size(2 * PER_REPLICA))

    rows: dict[str, list[int]] = {"bn": [], "cnn": []}

    def counter(name):
        return lambda p: rows[name].append(p.global_rows) if p.epoch_end else None

    with strategy.scope():
        bn = bn_model()
    start = [w.tolist() for w in bn.get_weights()]
    bn_history = tfk.fit(bn, dataset_fn, epochs=BN_EPOCHS, on_progress=counter("bn"), verbose=0)

    with strategy.scope():
        cnn = build_model(total_steps=20)
    cnn_history = tfk.fit(cnn, dataset_fn, epochs=1, validation_data=dataset_fn, on_progress=counter("cnn"), verbose=0)
    result = {
        "task_id": task.task_id,
        "bn_start": start,
        "bn_weights": [w.tolist() for w in bn.get_weights()],
        "bn_history": bn_history.history,
        "bn_iterations": int(bn.optimizer.iterations.numpy()),
        "cnn_weights_sum": [float(np.abs(w).sum()) for w in cnn.get_weights()],
        "cnn_finite": bool(all(np.isfinite(w).all() for w in cnn.get_weights())),
        "cnn_history": cnn_history.history,
        "cnn_iterations": int(cnn.optimizer.iterations.numpy()),
        "rows": rows,
        "keras": keras.__version__,
    }
    with open(out_path, "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    legacy(sys.argv[2]) if sys.argv[1] == "legacy" else main(sys.argv[1])
