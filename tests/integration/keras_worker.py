"""One TF node for test_keras_multiworker.py: trains y = 3*x1 + 2*x2 + 1 under MWMS.

Run with ``TF_CONFIG`` set: ``python keras_worker.py {train|resume|legacy} MODEL_DIR EXPORT_DIR OUT_JSON``.

* ``train``: a tf.data.Dataset with the global batch size (auto-sharded by DATA), validation
  data, ``model_dir`` checkpoints, 4 epochs, then every node calls export_saved_model.
* ``legacy``: a tf_keras model (``TF_USE_LEGACY_KERAS=1``) trained through its own model.fit.
* ``resume``: fresh processes, a ``dataset_fn`` where worker 1 has one batch fewer than worker 0
  (uneven input), ``epochs=5``: only the 5th epoch runs, starting from the checkpoint.

Writes what it saw (weights, history, progress, export result) to OUT_JSON.
"""

from __future__ import annotations

import json
import logging
import sys

GLOBAL_BATCH = 64
ROWS = 512


def main(phase: str, model_dir: str, export_dir: str, out_path: str) -> None:
    from tfonspark import distribute  # imports TensorFlow, runs no op

    strategy = distribute.strategy()  # before any other TensorFlow op
    import keras
    import numpy as np
    import tensorflow as tf

    import tfonspark.keras as tfk

    task = distribute.task_info()
    if phase == "legacy":
        _legacy(strategy, model_dir, out_path)
        return
    x = np.random.default_rng(0).normal(size=(ROWS, 2)).astype("float32")
    y = (3.0 * x[:, :1] + 2.0 * x[:, 1:] + 1.0).astype("float32")
    full = tf.data.Dataset.from_tensor_slices((x, y))

    keras.utils.set_random_seed(10 + task.task_id)  # different init per worker: MWMS syncs it
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])

    class StartWeights(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.weights = [w.tolist() for w in self.model.get_weights()]

    start = StartWeights()
    reports: list[dict] = []

    def on_progress(p: tfk.Progress) -> None:
        if p.epoch_end:
            reports.append({"epoch": p.epoch, "step": p.step, "global_rows": p.global_rows})

    if phase == "train":
        history = tfk.fit(
            model,
            full.batch(GLOBAL_BATCH),
            epochs=4,
            validation_data=full.take(128).batch(GLOBAL_BATCH),
            model_dir=model_dir,
            callbacks=[start],
            on_progress=on_progress,
        )
        exported = tfk.export_saved_model(model, export_dir)
    else:

        def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            shard = full.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
            batch = ctx.get_per_replica_batch_size(GLOBAL_BATCH)
            rows = ROWS // ctx.num_input_pipelines - batch * ctx.input_pipeline_id
            return shard.take(rows).batch(batch)

        history = tfk.fit(
            model,
            dataset_fn,
            epochs=5,
            model_dir=model_dir,
            callbacks=[start],
            on_progress=on_progress,
        )
        exported = None
    result = {
        "task_id": task.task_id,
        "is_chief": task.is_chief,
        "weights": [w.tolist() for w in model.get_weights()],
        "iterations": int(model.optimizer.iterations.numpy()),
        "start_weights": start.weights,
        "history": history.history,
        "epochs_run": history.epoch,
        "progress": reports,
        "exported": exported,
    }
    with open(out_path, "w") as out:
        json.dump(result, out)


def _legacy(strategy, model_dir: str, out_path: str) -> None:
    """A tf_keras model (TF_USE_LEGACY_KERAS=1) goes through tfonspark.keras.fit to model.fit."""
    import numpy as np
    import tensorflow as tf
    import tf_keras

    import tfonspark.keras as tfk

    x = np.random.default_rng(0).normal(size=(ROWS, 2)).astype("float32")
    y = (3.0 * x[:, :1] + 2.0 * x[:, 1:] + 1.0).astype("float32")
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(2,))])
        model.compile(optimizer=tf_keras.optimizers.SGD(0.1), loss="mse")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    history = tfk.fit(model, ds, epochs=3, model_dir=model_dir, shard_policy="data")
    result = {
        "uses_tf_keras": tf.keras.Model is tf_keras.Model,
        "weights": [w.tolist() for w in model.get_weights()],
        "history": history.history,
    }
    with open(out_path, "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main(*sys.argv[1:5])
