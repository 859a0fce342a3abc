"""Parameter-server training on real Spark with the coordinator on the chief executor.

``tfonspark.run(sc, coordinate, args, 4, num_ps=1, coordinator=True)`` on ``local[4]``: 1 ps, the
chief and 2 workers. ``coordinate`` runs on the chief only: it builds ``ParameterServerStrategy``
and ``ClusterCoordinator`` from ``ctx.cluster_resolver()``, trains a Keras 3 Dense layer in a custom
loop for 30 scheduled steps on a per-worker synthetic dataset, reports its losses and returns.
The workers and the ps only serve; the driver's ``cluster.shutdown()`` returns once the chief is
done and stops them. Then no node process is left and no task's port accepts.

Unlike ``ps_cluster`` (``test_ps_cluster.py``), the coordinator lives in the chief's TF process,
which ends with ``map_fun``: this test can drive the cluster from the pytest process.
"""

from __future__ import annotations

import time

import tfonspark
from tfonspark.tfprocess.server import servers_accepting

from .conftest import by_value, wait_until

by_value(__name__)

STEPS = 30
BATCH = 16


def _dataset_fn(_context=None):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 2)).astype("float32")
    y = (3.0 * x[:, :1] + 2.0 * x[:, 1:] + 1.0).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256).repeat().batch(BATCH)


def coordinate(args, ctx):
    """The chief's program: the PS strategy and coordinator from the node's resolver, then train."""
    import keras
    import tensorflow as tf

    started, began_at = time.monotonic(), time.time()
    strategy = tf.distribute.ParameterServerStrategy(ctx.cluster_resolver())
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.05)
        optimizer.build(model.trainable_variables)
    iterator = iter(coordinator.create_per_worker_dataset(_dataset_fn))

    @tf.function
    def step(it):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.run(replica, args=next(it))

    ready = time.monotonic()
    results = [coordinator.schedule(step, args=(iterator,)) for _ in range(args["steps"])]
    coordinator.join()
    losses = [float(r.fetch()) for r in results]
    ctx.report(
        {
            "task": [ctx.job_name, ctx.task_index],
            "resolver": [ctx.cluster_resolver().task_type, ctx.cluster_resolver().task_id],
            "spec": ctx.cluster_spec,
            "steps": len(losses),
            "first_loss": losses[0],
            "last_loss": losses[-1],
            "losses": losses,
            "devices": [str(getattr(v.value, "device", "")) for v in model.variables],
            "setup_s": ready - started,
            "train_s": time.monotonic() - ready,
            "began_at": began_at,
            "ended_at": time.time(),
        }
    )


def test_the_chief_coordinates_workers_that_only_serve(spark_manager, no_leftovers):
    sc = spark_manager.get("local[4]")  # a barrier stage of 4 tasks: 1 ps, the chief, 2 workers
    started, started_at = time.monotonic(), time.time()
    cluster = tfonspark.run(sc, coordinate, {"steps": STEPS}, 4, num_ps=1, coordinator=True, reservation_timeout=120)
    up = time.monotonic()
    roles = sorted((i["job_name"], i["task_index"]) for i in cluster.cluster_info)
    assert roles == [("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    cluster.shutdown(timeout=120)
    done, done_at = time.monotonic(), time.time()

    (report,) = cluster.reports  # only the chief ran user code
    r = report.metrics
    assert (report.role, report.index) == ("chief", 0)
    assert r["task"] == r["resolver"] == ["chief", 0]
    assert sorted(r["spec"]) == ["chief", "ps", "worker"] and len(r["spec"]["worker"]) == 2
    assert r["steps"] == STEPS
    assert sum(r["losses"][-5:]) / 5 < 0.2 * sum(r["losses"][:5]) / 5, r["losses"]
    assert r["devices"] and all("/job:ps" in d for d in r["devices"]), r["devices"]
    # shutdown() returned: every task's server stopped, the chief's too (its process ended)
    assert wait_until(lambda: not any(servers_accepting(r["spec"], ("chief", "ps", "worker")).values()), 10)
    assert wait_until(lambda: not sc.statusTracker().getActiveJobsIds(), 20)
    print(
        f"[measured] coordinator on the chief, local[4] (1 ps, chief, 2 workers): run() {up - started:.1f}s, "
        f"map_fun started {r['began_at'] - started_at:.1f}s after run() (servers listening), "
        f"strategy+model {r['setup_s']:.1f}s, {STEPS} steps {r['train_s']:.2f}s, "
        f"loss {r['first_loss']:.3f} -> {r['last_loss']:.5f}, shutdown() {done - up:.1f}s "
        f"of which {done_at - r['ended_at']:.1f}s after map_fun returned"
    )
