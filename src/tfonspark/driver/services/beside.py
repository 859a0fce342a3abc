"""``run(..., data_service=N)``: a tf.data service beside a training cluster, ended with it.

The service (:func:`tfonspark.data_service`: the dispatcher on the driver, ``N`` workers on
executors of their own) starts first, so the nodes' ``NodeConfig.data_service`` can name its
target (``ctx.data_service``, ``ctx.distribute_dataset``). The cluster then starts as
:func:`tfonspark.run` always does (``plan.start``); if it cannot, the service stops before the
error goes on. Once running, the cluster stops the service after its nodes (``start``'s
``on_end``), in ``shutdown()`` and ``stop()`` alike, also when they raise: no worker process or
port is left.

With ``data_service_on="nodes"`` no executor is added: the plan's nodes run ``map_fun`` as an
:class:`~tfonspark.tfprocess.data_worker.OnNodes` (the ``data_on_nodes`` row of
:mod:`tfonspark.driver.programs`), so the first ``N`` nodes run a ``WorkerServer`` in their TF
process; the driver reserves the dispatcher's port, starts the nodes, and starts the dispatcher
once they reported their workers' addresses. The workers end with the nodes' TF processes, the
dispatcher with the cluster.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from ...errors import ReservationTimeout
from ..cluster import Cluster
from ..jobs import wait_for_slots
from ..nodes.gang import SPARK_SETTINGS
from .data_service import DispatcherForNodes, ServiceForCluster

if TYPE_CHECKING:
    from pyspark import SparkContext

    from ..plan import Plan

__all__ = ["start_beside"]

_log = logging.getLogger(__name__)


def start_beside(plan: Plan) -> Cluster:
    """Start ``plan.options.data_service`` tf.data workers, then ``plan``'s cluster, tied together.

    On Spark (no ``plan.launcher``) it first waits, up to ``reservation_timeout``, until there
    are task slots for both: the plan's nodes and the service's workers. Raises
    ReservationTimeout naming both numbers when there are not, and whatever
    :func:`tfonspark.data_service` or ``plan.start`` raise (after stopping what had started).
    With ``data_service_on="nodes"`` the nodes need no more slots than their own, and the
    dispatcher starts after them. (``prepare`` checked ``data_service``: a whole number >= 0.)

    Examples
    --------
    >>> cluster = start_beside(prepare(sc, main_fun, args, 2, ClusterOptions(data_service=1), Settings()))  # doctest: +SKIP
    """
    options = plan.options
    count, timeout, on_nodes = (
        options.data_service,
        float(options.reservation_timeout),
        options.data_service_on == "nodes",
    )
    if not on_nodes and plan.launcher is None:
        _reserve(plan.sc, plan.num_executors, count, timeout)
    service: _Beside
    if on_nodes:
        service = DispatcherForNodes(plan.host, count, timeout, plan.resolved.port_range)
    else:
        service = ServiceForCluster(plan.sc, count, plan.settings, timeout, plan.launcher)
    try:
        cluster = plan.start(Cluster, service.target, service.end)
    except BaseException:
        service.abandon()
        raise
    service.follow(cluster)
    return cluster


class _Beside(Protocol):
    """A tf.data service beside a cluster (:mod:`.data_service`): started before it, then told
    that it started (``follow``), that it could not (``abandon``) or that its nodes stopped (``end``)."""

    target: str  #: its dispatcher, ``"grpc://host:port"``: every node's ``ctx.data_service``

    def end(self) -> None: ...

    def abandon(self) -> None: ...

    def follow(self, cluster: Cluster) -> None: ...


def _reserve(sc: SparkContext, nodes: int, workers: int, timeout: float) -> None:
    """Wait for the task slots of the cluster's nodes and the service's workers together."""
    slots = wait_for_slots(sc, nodes + workers, timeout)
    if slots < nodes + workers:
        raise ReservationTimeout(
            f"run(num_executors={nodes}, data_service={workers}) needs {nodes + workers} Spark task slots "
            f"({nodes} TensorFlow nodes + {workers} tf.data workers) but only {slots} were available after "
            f"{timeout}s; check {SPARK_SETTINGS} or lower num_executors or data_service.",
            registered=slots,
            required=nodes + workers,
        )
