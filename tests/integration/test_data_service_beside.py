"""``tfonspark.run(..., data_service=1)`` on real Spark: an MWMS trainer reads its batches from the service.

The session's ``local-cluster[2,1,1024]`` has two task slots: one trainer node (``tfonspark.keras.fit``
under MultiWorkerMirroredStrategy) and one tf.data worker beside it. The node's ``dataset_fn``
builds the pipeline with ``ctx.distribute_dataset``, so every batch it trains on came from the
service. It reports the target it saw, the steps trained and the serialization guard's error.
After ``shutdown()``: no node process of either cluster, and no service port accepting.
"""

from __future__ import annotations

import time

import tfonspark
from tfonspark.driver.services import data_service
from tfonspark.probes import servers_accepting

from .conftest import by_value

by_value(__name__)

BATCH, STEPS, EPOCHS = 8, 4, 2


def _train_from_service(args, ctx):
    """Fit y = 3*x1 + 2*x2 + 1 on batches the tf.data service makes; report what was read."""
    from tfonspark import distribute

    strategy = distribute.strategy()  # before any other TensorFlow op
    import keras
    import tensorflow as tf

    import tfonspark.keras as tfk
    from tfonspark.errors import ConfigError

    def row(i):  # runs on the service's worker, not here
        x = tf.stack([tf.cast(i % 7, tf.float32) / 7.0, tf.cast(i % 5, tf.float32) / 5.0])
        return x, 3.0 * x[:1] + 2.0 * x[1:] + 1.0

    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(BATCH)
        return ctx.distribute_dataset(tf.data.Dataset.range(10_000).map(row).batch(batch).repeat())

    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    tfk.fit(model, dataset_fn, epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
    try:
        ctx.distribute_dataset(tf.data.Dataset.range(3).map(lambda x: tf.py_function(lambda v: v, [x], tf.int64)))
        guard = ""
    except ConfigError as error:
        guard = str(error)
    steps = int(model.optimizer.iterations.numpy())
    ctx.report({"target": ctx.data_service, "steps": steps, "elements": steps * BATCH, "guard": guard})


def test_mwms_fit_reads_from_a_service_beside_the_cluster(sc, no_leftovers, monkeypatch):
    made = []
    real = data_service.data_service
    monkeypatch.setattr(data_service, "data_service", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    began = time.monotonic()
    cluster = tfonspark.run(sc, _train_from_service, None, 1, data_service=1, reservation_timeout=120)
    up = time.monotonic()
    (svc,) = made
    addresses = {"dispatcher": [svc.target.split("://")[1]], "worker": svc.worker_addresses}
    assert all(servers_accepting(addresses, ("dispatcher", "worker")).values())
    cluster.shutdown(timeout=120)
    print(f"run(data_service=1): up {up - began:.1f}s, fit + shutdown {time.monotonic() - up:.1f}s")
    (report,) = [r.metrics for r in cluster.reports if "steps" in r.metrics]
    assert report["target"] == svc.target
    assert report["steps"] == STEPS * EPOCHS and report["elements"] == STEPS * EPOCHS * BATCH
    assert "cannot serialize" in report["guard"] and "tf.py_function" in report["guard"], report["guard"]
    assert not any(servers_accepting(addresses, ("dispatcher", "worker")).values())  # the service ended too
