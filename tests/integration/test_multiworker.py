"""Multi-worker proof: Keras 3 model, MultiWorkerMirroredStrategy, custom strategy.run loop."""

from __future__ import annotations

import json
import os

import numpy as np

import tfonspark

from .conftest import by_value

by_value(__name__)


def _train_mwms(args, ctx):
    """Fit y = 3*x1 + 2*x2 + 1 on node-local data; all-reduce gradients across the nodes."""
    import keras
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    rng = np.random.default_rng(ctx.task_index)
    x = rng.normal(size=(256, 2)).astype("float32")
    y = (x @ np.array([[3.0], [2.0]], "float32") + 1.0).astype("float32")

    @tf.function
    def step(xb, yb):
        def replica(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb) - yb))
            grads = tape.gradient(loss, model.trainable_variables)
            grads = tf.distribute.get_replica_context().all_reduce("mean", grads)
            for var, grad in zip(model.trainable_variables, grads):
                var.assign_sub(0.1 * grad)
            return loss

        return strategy.run(replica, args=(xb, yb))

    for i in range(150):
        j = (i * 32) % 256
        step(tf.constant(x[j : j + 32]), tf.constant(y[j : j + 32]))
    weights = [w.tolist() for w in model.get_weights()]
    with open(os.path.join(args, f"weights{ctx.task_index}.json"), "w") as f:
        json.dump(weights, f)


def test_two_node_mwms_custom_loop(sc, tmp_path, no_leftovers):
    cluster = tfonspark.run(sc, _train_mwms, str(tmp_path), 2, reservation_timeout=120)
    cluster.shutdown(timeout=300)
    w0 = json.loads((tmp_path / "weights0.json").read_text())
    w1 = json.loads((tmp_path / "weights1.json").read_text())
    assert w0 == w1, "all-reduced training must leave identical weights on every node"
    kernel, bias = np.array(w0[0]).ravel(), np.array(w0[1])
    np.testing.assert_allclose(kernel, [3.0, 2.0], atol=0.05)
    np.testing.assert_allclose(bias, [1.0], atol=0.05)
