"""``ctx.cluster_resolver()`` on real Spark resolves as ``TFConfigClusterResolver`` and drives MWMS.

One MWMS cluster (2 workers) whose nodes build the strategy from their ``SparkClusterResolver`` and
all-reduce once, and one parameter-server cluster (ps on the driver, 2 workers on the executors)
whose nodes only compare the two resolvers: building ``ParameterServerStrategy`` needs a
coordinator, which is not what these nodes are for.
"""

from __future__ import annotations

import os
import time

import tfonspark

from .conftest import by_value

by_value(__name__)


def _compare(ctx):
    """What ctx.cluster_resolver() and TFConfigClusterResolver (from TF_CONFIG) each resolve.

    TF's resolver has no rpc_layer unless given one (bare ``host:port`` masters), so masters are
    compared both ways. No TensorFlow op runs here: MWMS must still be creatable afterwards.
    """
    import tensorflow as tf

    ours = ctx.cluster_resolver()
    theirs = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    grpc = tf.distribute.cluster_resolver.TFConfigClusterResolver(rpc_layer="grpc")
    spec = ours.cluster_spec().as_dict()
    tasks = [(job, i) for job, addresses in spec.items() for i in range(len(addresses))]
    return (
        ours,
        theirs,
        {
            "spec": spec,
            "tf_spec": theirs.cluster_spec().as_dict(),
            "spec_equal": ours.cluster_spec() == theirs.cluster_spec(),
            "task": [ours.task_type, ours.task_id],
            "tf_task": [theirs.task_type, theirs.task_id],
            "master": ours.master(),
            "tf_master": grpc.master(),
            "bare_master": ours.master(rpc_layer=""),
            "tf_bare_master": theirs.master(),
            "masters": [ours.master(job, i) for job, i in tasks],
            "tf_masters": [grpc.master(job, i) for job, i in tasks],
            "rpc_layer": [ours.rpc_layer, theirs.rpc_layer],
            "gpus": ctx.gpus,
        },
    )


def _accelerators(result, ours, theirs):
    result["accelerators"] = dict(ours.num_accelerators())
    result["tf_accelerators"] = dict(theirs.num_accelerators())  # lists the devices: a TF op
    return result


def _mwms_node(args, ctx):
    import tensorflow as tf

    ours, theirs, result = _compare(ctx)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=ctx.cluster_resolver())
    mine = float(ctx.task_index + 1)

    @tf.function
    def step():
        def replica():
            return tf.distribute.get_replica_context().all_reduce("sum", tf.constant(mine))

        return strategy.run(replica)

    result["all_reduce"] = float(strategy.experimental_local_results(step())[0])
    result["replicas"] = strategy.num_replicas_in_sync
    result["strategy_resolver"] = type(strategy.cluster_resolver).__name__
    ctx.report(_accelerators(result, ours, theirs))


def _assert_same(reports, expected_nodes):
    nodes = {r.node: r.metrics for r in reports}
    assert sorted(nodes) == sorted(expected_nodes)
    for node, r in nodes.items():
        assert r["spec_equal"] and r["spec"] == r["tf_spec"], node
        assert r["task"] == r["tf_task"] == node.split(":")[:1] + [int(node.split(":")[1])]
        assert r["master"] == r["tf_master"] and r["bare_master"] == r["tf_bare_master"], node
        assert r["master"] == "grpc://" + r["bare_master"]
        assert r["masters"] == r["tf_masters"], node
        assert r["rpc_layer"] == ["grpc", None]  # TF's: None, which its strategies read as "grpc"
        assert r["accelerators"] == r["tf_accelerators"] == ({"GPU": len(r["gpus"])} if r["gpus"] else {}), node
    print(f"[measured] resolvers agree on {sorted(nodes)}: {nodes[expected_nodes[0]]}")
    return nodes


def test_mwms_from_cluster_resolver(sc, tmp_path, no_leftovers):
    start = time.monotonic()
    cluster = tfonspark.run(sc, _mwms_node, None, 2, reservation_timeout=120)
    cluster.shutdown(timeout=300)
    nodes = _assert_same(cluster.reports, ["worker:0", "worker:1"])
    for r in nodes.values():
        assert r["strategy_resolver"] == "SparkClusterResolver"
        assert (r["replicas"], r["all_reduce"]) == (2, 3.0)  # 1 + 2, summed over both workers
    print(f"[measured] MWMS resolver cluster: {time.monotonic() - start:.1f}s")


def _ps_cluster_node(args, ctx):
    """Compare and report; workers wait for the ps's report so that shutdown never stops it first."""
    ours, theirs, result = _compare(ctx)
    ctx.report(_accelerators(result, ours, theirs))
    marker = os.path.join(args, "ps0.reported")
    if ctx.job_name == "ps":
        open(marker, "w").close()
        return
    deadline = time.monotonic() + 120
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_ps_cluster_nodes_resolve_as_tf_config(sc, tmp_path, no_leftovers):
    start = time.monotonic()
    cluster = tfonspark.run(
        sc, _ps_cluster_node, str(tmp_path), 3, num_ps=1, driver_ps_nodes=True, reservation_timeout=120
    )
    cluster.shutdown(timeout=300)
    nodes = _assert_same(cluster.reports, ["ps:0", "worker:0", "worker:1"])
    assert sorted(nodes["ps:0"]["spec"]) == ["ps", "worker"]
    assert len(nodes["ps:0"]["spec"]["worker"]) == 2
    print(f"[measured] ps resolver cluster: {time.monotonic() - start:.1f}s")
