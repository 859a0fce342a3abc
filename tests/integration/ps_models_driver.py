"""The driver of test_ps_models.py: models, data and partitioners under one ``ps_cluster``.

``python ps_models_driver.py MASTER OUT_JSON WORKDIR`` starts a SparkContext on MASTER, saves a
small DataFrame as TFRecords (``tfonspark.data.tfrecord.save_tfrecords``), then, with ONE
``tfonspark.ps_cluster(sc, num_workers=2, num_ps=2)`` (start-up is the slow part):

1. shards a Keras 3 ``Embedding(1000, 16)`` with ``MaxSizePartitioner`` and
   ``FixedShardsPartitioner`` (each its own strategy; variables only) and records each shard's
   shape and device;
2. with a ``MinSizePartitioner`` strategy: trains a Keras 3 Dense layer in a custom loop over the
   TFRecords (``coordinator.create_per_worker_dataset``), then a ``tf_keras`` model whose
   ``Embedding(1000, 16)`` is sharded, through ``model.fit`` with a ``DatasetCreator``;
3. saves a ``tf.train.Checkpoint`` and a SavedModel of that model, lists their variables and
   restores the checkpoint into the same model built outside the strategy (un-sharded);
4. runs Keras 3's ``model.fit`` under the strategy: it fails, and the error leaves the block so
   that ``ps_cluster`` adds its ``Hint:`` note.

After the block (the servers stopped, Spark's task slots free) ``tfonspark.ml.TFModel`` serves
the SavedModel on a small DataFrame. Everything measured goes to OUT_JSON; the process ends with
``os._exit`` (TF's coordinator threads do not stop within a process). A subprocess for the same
reason as ``ps_driver.py``.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
import traceback

from ps_common import write_and_exit

VOCAB, DIM = 1000, 16
IDS = 50  # the ids the data uses (of VOCAB): label = id % 2
ROWS = 2048
BATCH = 64
LOOP_STEPS = 40
FIT_EPOCHS, FIT_STEPS = 3, 20
_T0 = time.monotonic()


def _stage(name: str, out: dict) -> None:
    out["stage"] = name
    print(f"[ps_models_driver {time.monotonic() - _T0:6.1f}s] {name}", flush=True)


def write_records(sc, workdir: str) -> list[str]:
    """ROWS rows (id, x[2], y = 3*x1 + 2*x2 + 1, label = id % 2) as TFRecords, 2 part files."""
    import numpy as np
    from pyspark.sql import SparkSession

    from tfonspark.data.tfrecord import save_tfrecords

    rng = np.random.default_rng(0)
    ids = rng.integers(0, IDS, size=ROWS)
    x = rng.normal(size=(ROWS, 2))
    rows = [
        (int(i), [float(a), float(b)], float(3 * a + 2 * b + 1), float(i % 2)) for i, (a, b) in zip(ids, x, strict=True)
    ]
    spark = SparkSession.builder.getOrCreate()
    df = spark.createDataFrame(rows, "id bigint, x array<double>, y double, label double").repartition(2)
    return save_tfrecords(df, os.path.join(workdir, "records"))


def make_dataset_fn(files: list[str]):
    """The workers' dataset_fn: parse the TFRecords into ``{"id", "x"}`` features, ``y`` and ``label``."""
    import tensorflow as tf

    spec = {
        "id": tf.io.FixedLenFeature([1], tf.int64),
        "x": tf.io.FixedLenFeature([2], tf.float32),
        "y": tf.io.FixedLenFeature([1], tf.float32),
        "label": tf.io.FixedLenFeature([1], tf.float32),
    }
    local = [f.removeprefix("file://") for f in files]

    def dataset_fn(_context=None):
        records = tf.data.TFRecordDataset(local).shuffle(ROWS).repeat().batch(BATCH)
        return records.map(lambda r: tf.io.parse_example(r, spec))

    return dataset_fn


def shards(variable) -> dict:
    """Type, shard shapes and devices of a (possibly sharded) variable."""
    parts = list(getattr(variable, "variables", [variable]))
    return {
        "type": type(variable).__name__,
        "shapes": [list(p.shape) for p in parts],
        "devices": [p.device for p in parts],
    }


def check_partitioners(resolver, out: dict) -> None:
    """Max and Fixed: a Keras 3 Embedding's shards, each strategy only creating variables."""
    import keras
    import tensorflow as tf

    partitioners = tf.distribute.experimental.partitioners
    chosen = {
        "MaxSizePartitioner": partitioners.MaxSizePartitioner(max_shard_bytes=8 << 10, max_shards=5),
        "FixedShardsPartitioner": partitioners.FixedShardsPartitioner(2),
    }
    for name, partitioner in chosen.items():
        strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
        with strategy.scope():
            layer = keras.layers.Embedding(VOCAB, DIM)
            layer.build((None,))
        out["partitioners"][name] = shards(layer.embeddings.value)


def custom_loop(strategy, coordinator, dataset_fn, out: dict) -> None:
    """Keras 3 Dense layer, custom loop, per-worker datasets over the TFRecords."""
    import keras
    import tensorflow as tf

    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.05)
        optimizer.build(model.trainable_variables)
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step(it):
        def replica(batch):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(batch["x"], training=True) - batch["y"]))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.run(replica, args=(next(it),))

    started = time.monotonic()
    results = [coordinator.schedule(step, args=(iterator,)) for _ in range(LOOP_STEPS)]
    coordinator.join()
    out["loop"] = {
        "seconds": time.monotonic() - started,
        "losses": [float(r.fetch()) for r in results],
        "weights": [float(w) for w in model.layers[0].kernel.numpy().ravel()]
        + [float(model.layers[0].bias.numpy()[0])],
    }


def build_embedding_model():
    """id -> Embedding(1000, 16) -> Dense(1, sigmoid): a tf_keras model."""
    import tf_keras

    return tf_keras.Sequential(
        [
            tf_keras.Input((1,), dtype="int64"),
            tf_keras.layers.Embedding(VOCAB, DIM),
            tf_keras.layers.Flatten(),
            tf_keras.layers.Dense(1, activation="sigmoid"),
        ]
    )


def fit_tf_keras(strategy, dataset_fn, out: dict):
    """tf_keras model.fit with a DatasetCreator: the sharded embedding learns label = id % 2."""
    import tf_keras

    with strategy.scope():
        model = build_embedding_model()
        model.compile(tf_keras.optimizers.Adam(0.05), "binary_crossentropy", metrics=["accuracy"])
    started = time.monotonic()
    creator = tf_keras.utils.experimental.DatasetCreator(
        lambda ctx: dataset_fn(ctx).map(lambda b: (b["id"], b["label"]))
    )
    history = model.fit(creator, epochs=FIT_EPOCHS, steps_per_epoch=FIT_STEPS, verbose=0)
    out["fit"] = {
        "seconds": time.monotonic() - started,
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "embedding": shards(model.layers[0].embeddings),
    }
    out["partitioners"]["MinSizePartitioner"] = out["fit"]["embedding"]
    return model


def save_and_restore(model, workdir: str, out: dict) -> str:
    """A checkpoint and a SavedModel of the PS model; the checkpoint restored into a plain model."""
    import numpy as np
    import tensorflow as tf

    sharded = model.layers[0].embeddings
    full = tf.concat([v.read_value() for v in sharded.variables], axis=0).numpy()
    path = tf.train.Checkpoint(model=model).save(os.path.join(workdir, "ckpt", "ckpt"))
    plain = build_embedding_model()  # outside the strategy's scope: one ordinary variable
    tf.train.Checkpoint(model=plain).restore(path).assert_existing_objects_matched()
    restored = plain.layers[0].embeddings
    kernel, bias = (w.numpy() for w in plain.layers[-1].weights)
    out["checkpoint"] = {
        "variables": [(n, s) for n, s in tf.train.list_variables(path) if "embeddings" in n],
        "restored": shards(restored),
        "restored_equal": bool(np.allclose(restored.numpy(), full)),
        "dense": [float(k) for k in kernel.ravel()] + [float(bias[0])],
        "embedding_rows": full[:IDS].tolist(),
    }
    export = os.path.join(workdir, "export")

    class Serving(tf.Module):
        def __init__(self, keras_model) -> None:
            super().__init__()
            self.model = keras_model

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
        def serve(self, ids):
            return {"prob": tf.squeeze(self.model(ids[:, None]), -1)}

    module = Serving(model)
    tf.saved_model.save(module, export, signatures={"serving_default": module.serve})
    listed = tf.train.list_variables(os.path.join(export, "variables", "variables"))
    out["saved_model"] = {"variables": [(n, s) for n, s in listed if n.startswith("model/") or "embeddings" in n]}
    return export


def keras3_fit(strategy, dataset_fn) -> None:
    """Keras 3's model.fit under ParameterServerStrategy: fails on TF 2.21 (the error leaves the block)."""
    import keras

    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.05), "mse")
    dataset = dataset_fn().map(lambda b: (b["x"], b["y"]))
    model.fit(dataset, epochs=1, steps_per_epoch=2, verbose=0)


def serve(spark_ids: list[int], export: str) -> list[dict]:
    """TFModel serves the SavedModel on a DataFrame of ids (in Spark's Python workers)."""
    from pyspark.sql import SparkSession

    from tfonspark.ml import TFModel

    spark = SparkSession.builder.getOrCreate()
    df = spark.createDataFrame([(i,) for i in spark_ids], "id bigint")
    model = TFModel().setExportDir(export).setInputMapping({"id": "ids"}).setOutputMapping({"prob": "prob"})
    return [row.asDict() for row in model.transform(df).collect()]


def in_block(cluster, files: list[str], workdir: str, out: dict) -> None:
    import tensorflow as tf

    out["startup_s"] = time.monotonic() - out.pop("starting")
    out["spec"] = cluster.cluster_spec
    resolver = cluster.cluster_resolver()
    _stage("partitioners", out)
    check_partitioners(resolver, out)
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(min_shard_bytes=24 << 10, max_shards=4)
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    dataset_fn = make_dataset_fn(files)
    _stage("custom loop", out)
    custom_loop(strategy, coordinator, dataset_fn, out)
    _stage("tf_keras fit", out)
    model = fit_tf_keras(strategy, dataset_fn, out)
    _stage("checkpoint and SavedModel", out)
    out["export"] = save_and_restore(model, workdir, out)
    _stage("keras 3 fit", out)
    out["stopping"] = time.monotonic()
    keras3_fit(strategy, dataset_fn)


def main(master: str, out_path: str, workdir: str) -> None:
    import tfonspark
    from tfonspark.testing import SparkManager

    faulthandler.dump_traceback_later(200, exit=True)  # a hang shows where, before the test's timeout
    sc = SparkManager.instance().get(master)
    out: dict = {"partitioners": {}}
    _stage("TFRecords", out)
    started = time.monotonic()
    files = write_records(sc, workdir)
    out["records"] = {"files": files, "seconds": time.monotonic() - started}
    _stage("ps_cluster", out)
    out["starting"] = time.monotonic()
    try:
        with tfonspark.ps_cluster(sc, num_workers=2, num_ps=2, reservation_timeout=120) as cluster:
            in_block(cluster, files, workdir, out)
    except Exception as error:  # Keras 3's fit: ps_cluster's __exit__ added a Hint note
        out["error"] = {
            "stage": out.get("stage"),
            "type": type(error).__name__,
            "message": str(error),
            "notes": getattr(error, "__notes__", []),
            "traceback": traceback.format_exc()[-3000:],
        }
    out["shutdown_s"] = time.monotonic() - out.pop("stopping", time.monotonic())
    _stage("TFModel", out)
    if "export" in out:
        started = time.monotonic()
        out["served"] = serve(list(range(IDS)), out["export"])
        out["serve_s"] = time.monotonic() - started
    out["total_s"] = time.monotonic() - _T0
    _stage("done", out)
    write_and_exit(out, out_path, sc)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
