"""This node's TF server: ``ctx.start_cluster_server()`` (TFoS's ``TFNode.start_cluster_server``)
and the programs of nodes that only serve (:func:`serve`, :class:`ChiefCoordinator`,
:class:`ServeBesideEvaluator`).

Only programs that drive TensorFlow's servers themselves need ``start_cluster_server`` (parameter
servers, TF 1-style graphs). ``MultiWorkerMirroredStrategy`` and ``ParameterServerStrategy``
start their own from ``TF_CONFIG``, which the node already has. The port reserved for the node
goes to the server as TF binds it: :mod:`tfonspark.ports` (the hand-over, and what it leaves).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..ports import release_handovers
from ..probes import wait_for_servers

__all__ = [
    "ChiefCoordinator",
    "ServeBesideEvaluator",
    "ServerNode",
    "coordinator_spec",
    "leave_out_evaluator",
    "run_evaluator",
    "serve",
    "start_cluster_server",
]

_log = logging.getLogger(__name__)


class ServerNode(Protocol):
    """What starting a server needs of a node (a :class:`~tfonspark.tfprocess.context.NodeContext`)."""

    cluster_spec: dict[str, list[str]]
    job_name: str
    task_index: int

    def release_port(self) -> None: ...


def start_cluster_server(ctx: ServerNode, num_gpus: int = 1, rdma: bool = False) -> tuple[Any, Any]:
    """Start this node's ``tf.distribute.Server``; return ``(tf.train.ClusterSpec, server)``.

    The port reserved for the node goes to the server as it binds it (``ports.hand_over_port``);
    whatever happens, nothing stays reserved once this returns. ps nodes typically call
    ``server.join()``; ``Cluster.shutdown()`` stops them. ``num_gpus`` is accepted for TFoS
    compatibility: GPUs are chosen when the node starts (``CUDA_VISIBLE_DEVICES``). ``rdma``
    selects the ``grpc+verbs`` protocol.
    """
    import tensorflow as tf

    cluster = tf.train.ClusterSpec(ctx.cluster_spec)
    ctx.release_port()
    try:
        server = tf.distribute.Server(
            cluster, job_name=ctx.job_name, task_index=ctx.task_index, protocol="grpc+verbs" if rdma else "grpc"
        )
    finally:
        release_handovers()
    return cluster, server


def serve(tf_args: Any, ctx: ServerNode) -> None:
    """A node of :func:`tfonspark.ps_cluster` (or a worker/ps of ``run(..., coordinator=True)``): start
    this task's server and serve until stopped.

    No user code runs here: the coordinator's ``ClusterCoordinator`` sends the work. The node's
    supervisor ends the process (SIGTERM, then SIGKILL) when the driver stops the cluster.
    ``tf_args`` is unused.
    """
    del tf_args
    _, server = start_cluster_server(ctx, num_gpus=0)
    _log.info("serving %s:%d until the cluster stops", ctx.job_name, ctx.task_index)
    server.join()


@dataclass(frozen=True)
class ChiefCoordinator:
    """The program of a ``run(..., coordinator=True)`` cluster: ``map_fun`` on the chief and on the
    evaluator (``eval_node=True``), :func:`serve` elsewhere.

    On the chief, ``map_fun(tf_args, ctx)`` is ``ParameterServerStrategy``'s coordinator: it
    starts once every ps and worker server accepts connections (up to ``timeout`` seconds), so
    the strategy's first connection finds them, and its cluster spec leaves out the evaluator
    (:func:`coordinator_spec`). On the evaluator, ``map_fun`` is a sidecar evaluator
    (:func:`run_evaluator`). Every other node serves until the driver stops it, after the chief
    has returned.
    """

    map_fun: Callable[[Any, Any], Any]
    timeout: float

    def __call__(self, tf_args: Any, ctx: ServerNode) -> Any:
        if ctx.job_name == "evaluator":
            return run_evaluator(self.map_fun, tf_args, ctx)
        if ctx.job_name != "chief":
            return serve(tf_args, ctx)
        wait_for_servers(ctx.cluster_spec, self.timeout)
        leave_out_evaluator(ctx)
        return self.map_fun(tf_args, ctx)


@dataclass(frozen=True)
class ServeBesideEvaluator:
    """The program of a ``ps_cluster(..., evaluator=fn)`` cluster: ``fn`` on the evaluator
    (:func:`run_evaluator`), :func:`serve` on every worker and ps."""

    evaluator: Callable[[Any, Any], Any]

    def __call__(self, tf_args: Any, ctx: ServerNode) -> Any:
        if ctx.job_name == "evaluator":
            return run_evaluator(self.evaluator, tf_args, ctx)
        return serve(tf_args, ctx)


def run_evaluator(fn: Callable[[Any, Any], Any], tf_args: Any, ctx: ServerNode) -> Any:
    """``fn(tf_args, ctx)`` on the evaluator of a parameter-server cluster: no TF server (TF's
    coordinator never connects to it), and SIGTERM, the driver's stop once training is done, a
    stop request that ``tfonspark.keras.sidecar_evaluate`` answers by evaluating the last
    checkpoint and returning (:func:`tfonspark.distribute.sidecar.stop_on_sigterm`)."""
    from ..distribute.sidecar import stop_on_sigterm

    stop_on_sigterm()
    _log.info("evaluator %s:%d: sidecar evaluation until the cluster stops", ctx.job_name, ctx.task_index)
    return fn(tf_args, ctx)


def coordinator_spec(spec: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """``spec`` as TF's coordinator must see it: without the ``evaluator`` job.

    ``ParameterServerStrategy`` connects to every task of its cluster spec and waits for each;
    the sidecar evaluator runs no server, so it is left out (TF's own layout: the evaluator
    reads checkpoints and is no part of the training cluster).
    """
    return {job: list(hosts) for job, hosts in spec.items() if job != "evaluator"}


def leave_out_evaluator(ctx: ServerNode) -> None:
    """The chief's ``ctx.cluster_spec`` and ``TF_CONFIG`` as :func:`coordinator_spec` (no-op without an evaluator)."""
    if "evaluator" not in ctx.cluster_spec:
        return
    from ..distribute.tf_config import TF_CONFIG_ENV, build_tf_config

    ctx.cluster_spec = coordinator_spec(ctx.cluster_spec)
    if TF_CONFIG_ENV in os.environ:
        os.environ[TF_CONFIG_ENV] = build_tf_config(ctx.cluster_spec, ctx.job_name, ctx.task_index)
