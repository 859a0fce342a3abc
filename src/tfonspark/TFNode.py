"""TFoS-compatible helpers for code running inside a TF node (``map_fun(args, ctx)``)."""

from __future__ import annotations

from typing import Any

from .tfprocess.context import NodeContext, hdfs_path
from .tfprocess.datafeed import DataFeed

__all__ = [
    "DataFeed",
    "batch_results",
    "export_saved_model",
    "hdfs_path",
    "next_batch",
    "release_port",
    "start_cluster_server",
    "terminate",
]


def release_port(ctx: NodeContext) -> None:
    """Free the port reserved for this node (needed before starting a TF server yourself)."""
    ctx.release_port()


def start_cluster_server(ctx: NodeContext, num_gpus: int = 1, rdma: bool = False) -> tuple[Any, Any]:
    """Start this node's ``tf.distribute.Server``; return ``(tf.train.ClusterSpec, server)``.

    ps nodes typically call ``server.join()``; ``Cluster.shutdown()`` stops them.
    """
    import tensorflow as tf

    ctx.release_port()
    cluster = tf.train.ClusterSpec(ctx.cluster_spec)
    server = tf.distribute.Server(
        cluster, job_name=ctx.job_name, task_index=ctx.task_index, protocol="grpc+verbs" if rdma else "grpc"
    )
    return cluster, server


def next_batch(mgr: Any, batch_size: int, qname: str = "input") -> Any:
    """TFoS ``TFNode.next_batch``: up to ``batch_size`` rows from the feed."""
    return DataFeed(mgr, True, qname).next_batch(batch_size)


def batch_results(mgr: Any, results: Any, qname: str = "output") -> None:
    """TFoS ``TFNode.batch_results``: return inference results for the last batch."""
    DataFeed(mgr, False, qname_out=qname).batch_results(results)


def terminate(mgr: Any, qname: str = "input") -> None:
    """TFoS ``TFNode.terminate``: stop the feed early."""
    DataFeed(mgr, True, qname).terminate()


def export_saved_model(model: Any, export_dir: str, signatures: Any = None, is_chief: bool = True) -> str | None:
    """Export a Keras 3 model or ``tf.Module`` as a SavedModel (TF 2 meaning of the TFoS helper).

    A Keras model built under a distribution strategy is exported through
    :func:`tfonspark.distribute.checkpoint.export_saved_model`: every worker must call it (the
    save runs collective ops) and only the chief keeps the result, whatever ``is_chief`` says.
    Other Keras models without ``signatures`` use ``model.export``; anything else goes through
    ``tf.saved_model.save``, written only where ``is_chief`` is true. Returns the directory
    where this node wrote, or None.
    """
    import tensorflow as tf

    if signatures is None and getattr(model, "_distribute_strategy", None) is not None:
        from .distribute.checkpoint import export_saved_model as export_distributed

        return export_distributed(model, export_dir)
    if not is_chief:
        return None
    if signatures is None and hasattr(model, "export"):
        model.export(export_dir, verbose=False)
    else:
        tf.saved_model.save(model, export_dir, signatures=signatures)
    return export_dir
