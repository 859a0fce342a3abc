"""Uneven input on two real MWMS workers with Conv2D models, TensorFlow's oneDNN kernels on.

Worker 0 has 3 batches, worker 1 has 7: for 4 steps of every epoch worker 0's replica gets
0-row batches. oneDNN's Conv2D rejects those, and BatchNormalization turns them into NaN
weights, so ``tfonspark.keras.fit`` must never run the model on them while worker 0 still joins
every all-reduce with a zero contribution. The test replays the same steps on the real rows
only, in this process, and compares the weights (each worker's BatchNormalization statistics
are its own, as under any MWMS training).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from . import uneven_worker as uw
from .conftest import run_tf_workers

WORKER = Path(uw.__file__)


def _replay(start: list) -> tuple[list[list[np.ndarray]], dict[str, list[float]]]:
    """The BN model's training on the real rows only: each step sums, over the workers that
    still have a batch, the gradient of that batch's mean loss scaled by 1/2 (Keras' scaling by
    the replica count); returns each worker's final weights and the epochs' loss and accuracy."""
    import keras
    import tensorflow as tf

    models = [uw.bn_model(), uw.bn_model()]
    for model in models:
        model.set_weights([np.asarray(w, dtype="float32") for w in start])
    data = [uw.worker_data(0), uw.worker_data(1)]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    history: dict[str, list[float]] = {"loss": [], "accuracy": []}
    for _ in range(uw.BN_EPOCHS):
        losses, correct = [], 0
        for step in range(max(uw.BATCHES)):
            total = None
            for index, model in enumerate(models):
                if step >= uw.BATCHES[index]:
                    continue  # this worker's replica has an empty batch: no contribution
                rows = slice(step * uw.PER_REPLICA, (step + 1) * uw.PER_REPLICA)
                x, y = data[index][0][rows], data[index][1][rows]
                with tf.GradientTape() as tape:
                    logits = model(x, training=True)
                    loss = loss_fn(y, logits)
                grads = [g * 0.5 for g in tape.gradient(loss, model.trainable_variables)]
                total = grads if total is None else [a + b for a, b in zip(total, grads, strict=True)]
                losses.append(float(loss))
                correct += int(np.sum(np.argmax(logits.numpy(), axis=1) == y))
            updated = [v - uw.LEARNING_RATE * g for v, g in zip(models[0].trainable_variables, total, strict=True)]
            for model in models:
                for variable, value in zip(model.trainable_variables, updated, strict=True):
                    variable.assign(value)
        history["loss"].append(float(np.mean(losses)))
        history["accuracy"].append(correct / (sum(uw.BATCHES) * uw.PER_REPLICA))
    return [model.get_weights() for model in models], history


@pytest.mark.slow
def test_conv2d_and_batchnorm_train_on_uneven_input_as_on_the_real_rows(tmp_path):
    pytest.importorskip("tensorflow")
    nodes = run_tf_workers(
        WORKER, lambda i: [tmp_path / f"uneven-{i}.json"], tmp_path, timeout=180, TF_ENABLE_ONEDNN_OPTS="1"
    )
    real_rows = sum(uw.BATCHES) * uw.PER_REPLICA
    steps = max(uw.BATCHES)

    # every worker ran every step of every epoch; only real rows were counted
    assert [n["bn_iterations"] for n in nodes] == [steps * uw.BN_EPOCHS] * 2
    assert [n["cnn_iterations"] for n in nodes] == [steps] * 2
    assert [n["rows"] for n in nodes] == [{"bn": [real_rows] * uw.BN_EPOCHS, "cnn": [real_rows]}] * 2

    # the BN model equals training on the real rows only, weights and epoch logs
    assert nodes[0]["bn_start"] == nodes[1]["bn_start"]  # MWMS broadcasts worker 0's values
    expected, history = _replay(nodes[0]["bn_start"])
    for node in nodes:
        got = [np.asarray(w) for w in node["bn_weights"]]
        assert all(np.isfinite(w).all() for w in got)
        for have, want in zip(got, expected[node["task_id"]], strict=True):
            np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(node["bn_history"]["loss"], history["loss"], rtol=1e-4)
        np.testing.assert_allclose(node["bn_history"]["accuracy"], history["accuracy"], rtol=1e-6)

    # the demo CNN (Conv2D, Dropout, Adam) trains, validates and stays identical on both workers
    assert all(n["cnn_finite"] for n in nodes)
    np.testing.assert_allclose(nodes[0]["cnn_weights_sum"], nodes[1]["cnn_weights_sum"], rtol=1e-6)
    assert nodes[0]["cnn_history"] == nodes[1]["cnn_history"]
    assert set(nodes[0]["cnn_history"]) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert all(np.isfinite(v) for v in nodes[0]["cnn_history"]["val_loss"])


@pytest.mark.slow
def test_a_tf_keras_conv2d_model_trains_through_its_own_fit_on_uneven_input(tmp_path):
    """tf_keras' own model.fit fails the same way on a 0-row batch; through tfonspark.keras.fit
    it gets the same guarded steps. The last global batch has 1 row: one worker's share is empty."""
    pytest.importorskip("tf_keras")
    nodes = run_tf_workers(
        WORKER,
        lambda i: ["legacy", tmp_path / f"legacy-{i}.json"],
        tmp_path,
        timeout=180,
        TF_USE_LEGACY_KERAS="1",
        TF_ENABLE_ONEDNN_OPTS="1",
    )
    assert all(n["uses_tf_keras"] and n["finite"] for n in nodes)
    assert [n["iterations"] for n in nodes] == [2 * 4] * 2  # 4 steps an epoch, the last 1 row
    np.testing.assert_allclose(nodes[0]["weights_sum"], nodes[1]["weights_sum"], rtol=1e-6)
    assert nodes[0]["history"] == nodes[1]["history"]
    for key in ("accuracy", "val_accuracy"):  # counted over the real rows: a multiple of 1/49
        counts = np.asarray(nodes[0]["history"][key]) * uw.LEGACY_ROWS
        np.testing.assert_allclose(counts, np.round(counts), atol=1e-3)
