"""This node's ``tf.distribute.Server``: ``ctx.start_cluster_server()`` (and TFoS's ``TFNode.start_cluster_server``).

Only programs that drive TensorFlow's servers themselves need it (parameter servers, TF 1-style
graphs). ``MultiWorkerMirroredStrategy`` and ``ParameterServerStrategy`` start their own from
``TF_CONFIG``, which the node already has.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["ServerNode", "start_cluster_server"]


class ServerNode(Protocol):
    """What starting a server needs of a node (a :class:`~tfonspark.tfprocess.context.NodeContext`)."""

    cluster_spec: dict[str, list[str]]
    job_name: str
    task_index: int

    def release_port(self) -> None: ...


def start_cluster_server(ctx: ServerNode, num_gpus: int = 1, rdma: bool = False) -> tuple[Any, Any]:
    """Start this node's ``tf.distribute.Server``; return ``(tf.train.ClusterSpec, server)``.

    The port reserved for the node is released first, so that the server can bind it. ps nodes
    typically call ``server.join()``; ``Cluster.shutdown()`` stops them. ``num_gpus`` is
    accepted for TFoS compatibility: GPUs are chosen when the node starts (``CUDA_VISIBLE_DEVICES``).
    ``rdma`` selects the ``grpc+verbs`` protocol.
    """
    import tensorflow as tf

    ctx.release_port()
    cluster = tf.train.ClusterSpec(ctx.cluster_spec)
    server = tf.distribute.Server(
        cluster, job_name=ctx.job_name, task_index=ctx.task_index, protocol="grpc+verbs" if rdma else "grpc"
    )
    return cluster, server
