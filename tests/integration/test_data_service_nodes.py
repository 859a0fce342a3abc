"""``run(..., data_service=2, data_service_on="nodes")`` on real Spark: the workers live in the TF nodes.

The session's ``local-cluster[2,1,1024]`` has two task slots, both taken by the two MWMS nodes:
with executors of their own the service would need two more. Each node's TF process runs a
``WorkerServer`` beside ``map_fun``; both nodes read one ``distributed_epoch`` job (each element
exactly once across them, counted) and one ``DATA``-sharded job (which works only if the
dispatcher was told every worker's address). Then both read an endless job and worker:1's TF
process, and with it its tf.data worker, is SIGKILLed: TF cannot go on without it (worker:0's
reader would wait for it forever), so ``shutdown()`` raises ``NodeFailed`` naming worker:1, timed
from the kill. After that: no node process, and neither the dispatcher's nor a worker's port accepts.
"""

from __future__ import annotations

import collections
import os
import signal
import time

import pytest

import tfonspark
from tfonspark.errors import NodeFailed
from tfonspark.probes import servers_accepting
from tfonspark.tfprocess.data_worker import ADDRESS

from .conftest import by_value, wait_until

by_value(__name__)

N = 60


def _read_beside(args, ctx):
    """Read two jobs from the service whose workers run in these nodes, report them, then read forever."""
    from tfonspark import distribute

    strategy = distribute.strategy()  # MWMS first: the in-process worker must not get in its way
    import tensorflow as tf

    def sync():  # MWMS's all-reduce as a barrier: no node stops its worker while the other still reads
        return int(strategy.reduce("SUM", strategy.run(lambda: tf.constant(1)), axis=None))

    sync()
    epoch = [int(x) for x in ctx.distribute_dataset(tf.data.Dataset.range(N)).as_numpy_iterator()]
    data = tf.data.experimental.service.ShardingPolicy.DATA
    sharded = [int(x) for x in ctx.distribute_dataset(tf.data.Dataset.range(N), data).as_numpy_iterator()]
    ctx.report({"epoch": epoch, "sharded": sharded, "target": ctx.data_service, "nodes": sync()})
    for i, _ in enumerate(ctx.distribute_dataset(tf.data.Dataset.range(10**9), job_name="endless")):
        if i == 20:
            ctx.report({"endless": True})


def test_workers_in_the_tf_nodes_need_no_extra_slots(sc, no_leftovers):
    began = time.monotonic()
    cluster = tfonspark.run(sc, _read_beside, None, 2, data_service=2, data_service_on="nodes", reservation_timeout=60)
    up = time.monotonic()
    try:
        assert wait_until(lambda: sum("endless" in r.metrics for r in cluster.reports) == 2, 60, 0.05)
        read = time.monotonic()
        (victim,) = [n for n in cluster.server.nodes.values() if n.role.name == "worker:1"]
        os.kill(victim.up.tf_pid, signal.SIGKILL)  # its tf.data worker dies with it
        killed = time.monotonic()
    finally:
        with pytest.raises(NodeFailed) as info:
            cluster.shutdown(timeout=60)
    failed = time.monotonic()
    assert (info.value.role, info.value.index) == ("worker", 1), info.value
    print(
        f"run(data_service=2, data_service_on='nodes'): up {up - began:.1f}s, read {read - up:.1f}s; "
        f"worker:1 killed: NodeFailed {failed - killed:.2f}s after"
    )
    assert failed - killed < 10, failed - killed
    reports = [r.metrics for r in cluster.reports if "epoch" in r.metrics]
    assert len(reports) == 2 and {r["nodes"] for r in reports} == {2}
    for key in ("epoch", "sharded"):
        counts = collections.Counter(x for r in reports for x in r[key])
        assert counts == collections.Counter(range(N)), (key, [len(r[key]) for r in reports], counts)
    print("distributed_epoch / DATA read by the 2 nodes:", [(len(r["epoch"]), len(r["sharded"])) for r in reports])
    workers = sorted(r.metrics[ADDRESS] for r in cluster.reports if ADDRESS in r.metrics)
    addresses = {"dispatcher": [reports[0]["target"].split("://")[1]], "worker": workers}
    assert len(workers) == 2 and not any(servers_accepting(addresses, ("dispatcher", "worker")).values())
