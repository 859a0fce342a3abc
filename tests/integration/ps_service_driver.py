"""The driver of test_data_service_ps.py: a ``ps_cluster`` trainer reads its data from ``data_service``.

``python ps_service_driver.py MASTER OUT_JSON`` starts a SparkContext on MASTER, a tf.data service
of one executor worker, then ``ps_cluster(sc, num_workers=1, num_ps=1)``. The worker's
per-worker dataset is ``distributed_epoch`` over the service; a custom loop fits ``y = 3x + 1``
and counts, on the ps, the elements the steps consumed. After both blocks it records whether any
server still accepts. A subprocess for the same reason as ``ps_driver.py``.
"""

from __future__ import annotations

import sys
import time

from ps_common import alive, node_pids, write_and_exit

STEPS, BATCH = 64, 16


def train(cluster, target: str, out: dict) -> None:
    import tensorflow as tf

    strategy = tf.distribute.ParameterServerStrategy(cluster.cluster_resolver())
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    def dataset_fn():
        ds = tf.data.Dataset.range(100_000).map(lambda i: tf.cast(i % 7, tf.float32)).map(lambda x: (x, 3 * x + 1))
        return ds.batch(BATCH).apply(
            tf.data.experimental.service.distribute("distributed_epoch", target, job_name="ps")
        )

    with strategy.scope():
        w, b, seen = tf.Variable(0.0), tf.Variable(0.0), tf.Variable(0, dtype=tf.int64)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((w * x + b - y) ** 2)
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(0.01 * gw)
        b.assign_sub(0.01 * gb)
        seen.assign_add(tf.cast(tf.size(x), tf.int64))  # one atomic op on the ps
        return loss

    @tf.function
    def step(iterator):
        x, y = next(iterator)
        return strategy.run(replica_step, args=(x, y))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    first = float(coordinator.fetch(coordinator.schedule(step, args=(iterator,))))
    for _ in range(STEPS - 2):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    last = float(coordinator.fetch(coordinator.schedule(step, args=(iterator,))))
    out.update(first_loss=first, last_loss=last, elements=int(seen.numpy()), w=float(w.numpy()), b=float(b.numpy()))


def main(master: str, out_path: str) -> None:
    import tfonspark
    from tfonspark.driver.services.ps import servers_accepting
    from tfonspark.testing import SparkManager

    sc = SparkManager.instance().get(master)
    out: dict = {"steps": STEPS, "batch": BATCH}
    started = time.monotonic()
    with (
        tfonspark.data_service(sc, num_workers=1, reservation_timeout=120) as svc,
        tfonspark.ps_cluster(sc, num_workers=1, num_ps=1, reservation_timeout=120) as cluster,
    ):
        out["startup_s"] = time.monotonic() - started
        spec = {**cluster.cluster_spec, "data": svc.worker_addresses}
        out["node_pids"] = node_pids([cluster.cluster.cluster_id, svc.cluster.cluster_id])
        train(cluster, svc.target, out)
    out["accepting"] = servers_accepting(spec, ("ps", "worker", "data"))
    out["alive"] = [p for p in out["node_pids"] if alive(p)]
    write_and_exit(out, out_path, sc)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
