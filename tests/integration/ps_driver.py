"""The driver of test_ps_cluster.py: a parameter-server cluster on Spark, this process the coordinator.

``python ps_driver.py MASTER OUT_JSON [--driver-ps] [--raise]`` starts a SparkContext on MASTER, then
``tfonspark.ps_cluster(sc, num_workers=2, num_ps=1)``, and trains y = 3*x1 + 2*x2 + 1 with a
Keras 3 Dense layer in a custom training loop (``ParameterServerStrategy`` +
``ClusterCoordinator``, a per-worker dataset). It writes to OUT_JSON: losses, the variables'
devices, the cluster spec, the node processes' pids, the timings and (``--raise``: after an
exception left the block) whether the servers still accept; then ends with
``os._exit`` (TF's coordinator threads do not stop within a process).

A subprocess, not the pytest process: TensorFlow's coordinator, its threads and its in-process
server stay for the life of the process, and the other tests' drivers must not have them.
"""

from __future__ import annotations

import os
import sys
import time

from ps_common import alive, node_pids, write_and_exit

STEPS = 50
BATCH = 16


def _spawned_here(address: str) -> bool:
    """Whether the TF process listening at ``address`` was started from this process (its
    supervisor's parent is us: a driver-side node), not from a Spark Python worker."""
    import psutil

    port = int(address.rpartition(":")[2])
    pids = [c.pid for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == "LISTEN"]
    for pid in pids:
        supervisor = psutil.Process(pid).parent()
        if supervisor is not None and supervisor.ppid() == os.getpid():
            return True
    return False


def train(cluster, out: dict) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=1)
    strategy = tf.distribute.ParameterServerStrategy(cluster.cluster_resolver(), variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    def dataset_fn(_context=None):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(256, 2)).astype("float32")
        y = (3.0 * x[:, :1] + 2.0 * x[:, 1:] + 1.0).astype("float32")
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256).repeat().batch(BATCH)

    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.05)
        optimizer.build(model.trainable_variables)

    per_worker = coordinator.create_per_worker_dataset(dataset_fn)
    iterator = iter(per_worker)

    @tf.function
    def step(it):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        x, y = next(it)
        return strategy.run(replica, args=(x, y))

    started = time.monotonic()
    results = [coordinator.schedule(step, args=(iterator,)) for _ in range(STEPS)]
    coordinator.join()
    out["train_s"] = time.monotonic() - started
    out["losses"] = [float(r.fetch()) for r in results]
    out["devices"] = {v.path: str(getattr(v.value, "device", "")) for v in model.variables}
    out["steps"] = len(results)


class _Boom(Exception):
    """Raised in the block with ``--raise``: the cluster must stop on the way out all the same."""


def main(master: str, out_path: str, driver_ps: bool, fail: bool) -> None:
    import tfonspark
    from tfonspark.driver.services.ps import servers_accepting
    from tfonspark.testing import SparkManager

    sc = SparkManager.instance().get(master)
    out: dict = {}
    started = time.monotonic()
    try:
        _in_block(
            tfonspark.ps_cluster(sc, 2, 1, driver_ps_nodes=driver_ps, reservation_timeout=120), out, started, fail
        )
    except _Boom:
        out["raised"] = True
    out["shutdown_s"] = time.monotonic() - out.pop("stopping")
    out["after_block"] = {
        "accepting": servers_accepting(out["spec"]),
        "alive": [p for p in out["node_pids"] if alive(p)],
    }
    write_and_exit(out, out_path, sc)


def _in_block(cluster, out: dict, started: float, fail: bool) -> None:
    with cluster as c:
        out["startup_s"] = time.monotonic() - started
        out["spec"] = c.cluster_spec
        out["chief"] = c.chief
        out["node_pids"] = node_pids([c.cluster.cluster_id])
        out["ps_on_driver"] = _spawned_here(c.cluster_spec["ps"][0])
        out["worker_on_driver"] = _spawned_here(c.cluster_spec["worker"][0])
        train(c, out)
        out["stopping"] = time.monotonic()
        if fail:
            raise _Boom("an error in the with block")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--driver-ps" in sys.argv[3:], "--raise" in sys.argv[3:])
