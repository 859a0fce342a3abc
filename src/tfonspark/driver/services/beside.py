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
import time
from typing import TYPE_CHECKING

from ...errors import ReservationTimeout
from ...tfprocess.data_worker import ADDRESS
from ..cluster import Cluster
from ..jobs import wait_for_slots
from ..nodes.gang import SPARK_SETTINGS
from ..options import service_workers
from .data_service import DataService, data_service, dispatcher_for, reserve_dispatcher

if TYPE_CHECKING:
    from pyspark import SparkContext

    from ..plan import Plan

__all__ = ["start_beside"]

_log = logging.getLogger(__name__)


def start_beside(plan: Plan) -> Cluster:
    """Start ``plan.options.data_service`` tf.data workers, then ``plan``'s cluster, tied together.

    On Spark (no ``plan.launcher``) it first waits, up to ``reservation_timeout``, until there
    are task slots for both: the plan's nodes and the service's workers. Raises
    ReservationTimeout naming both numbers when there are not, ConfigError for a
    ``data_service`` that is not a whole number >= 0, and whatever :func:`tfonspark.data_service`
    or ``plan.start`` raise (after stopping what had started). With ``data_service_on="nodes"``
    the nodes need no more slots than their own.

    Examples
    --------
    >>> cluster = start_beside(prepare(sc, main_fun, args, 2, ClusterOptions(data_service=1), Settings()))  # doctest: +SKIP
    """
    options = plan.options
    count = service_workers(options)
    timeout = float(options.reservation_timeout)
    if options.data_service_on == "nodes":
        return _on_nodes(plan, count, timeout)
    if plan.launcher is None:
        _reserve(plan.sc, plan.num_executors, count, timeout)
    svc = data_service(plan.sc, count, settings=plan.settings, reservation_timeout=timeout, launcher=plan.launcher)
    try:
        cluster = plan.start(Cluster, svc.target, lambda: _stop(svc, "its training cluster stopped"))
    except BaseException:
        _stop(svc, "the training cluster did not start")
        raise
    _log.info("tf.data service %s beside cluster %s", svc.target, cluster.cluster_id[:12])
    return cluster


def _on_nodes(plan: Plan, count: int, timeout: float) -> Cluster:
    """Start the nodes (``count`` of them with a tf.data worker), then the dispatcher with their addresses."""
    handover, address = reserve_dispatcher(plan.sc)
    started: list[DataService] = []

    def end() -> None:
        handover.release()
        for svc in started:
            _stop(svc, "its training cluster stopped")

    try:
        cluster = plan.start(Cluster, f"grpc://{address}", end)
    except BaseException:
        handover.release()
        raise
    try:
        started.append(dispatcher_for(handover, address, _reported(cluster, count, timeout)))
    except BaseException:
        try:
            cluster.stop(grace_secs=0)
        except Exception as error:  # the failure that stopped the start-up is the one to raise
            _log.warning("stopping cluster %s after its tf.data service failed: %s", cluster.cluster_id[:12], error)
        raise
    _log.info("tf.data dispatcher grpc://%s for the workers in nodes %s", address, started[0].worker_addresses)
    return cluster


def _reported(cluster: Cluster, count: int, timeout: float) -> list[str]:
    """The addresses of the ``count`` workers in ``cluster``'s nodes, once each reported its own."""
    deadline = time.monotonic() + timeout
    while True:
        if cluster.failure is not None:
            raise cluster.failure
        found = {r.node: str(r.metrics[ADDRESS]) for r in cluster.reports if ADDRESS in r.metrics}
        if len(found) >= count:
            return [found[node] for node in sorted(found)]
        if time.monotonic() > deadline:
            raise ReservationTimeout(
                f"only {len(found)} of the {count} TF nodes that run a tf.data worker "
                f"(data_service_on='nodes') reported its address within {timeout:g}s; check the executor logs",
                registered=len(found),
                required=count,
            )
        time.sleep(0.05)


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


def _stop(svc: DataService, why: str) -> None:
    """Stop ``svc``; a worker's failure is logged, so the cluster's own outcome is the one raised."""
    try:
        svc.shutdown()
    except Exception as error:
        _log.warning("tf.data service %s stopped after %s; a worker had failed: %s", svc.target, why, error)
