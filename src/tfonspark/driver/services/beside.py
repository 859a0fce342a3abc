"""``run(..., data_service=N)``: a tf.data service beside a training cluster, ended with it.

The service (:func:`tfonspark.data_service`: the dispatcher on the driver, ``N`` workers on
executors of their own) starts first, so the nodes' ``NodeConfig.data_service`` can name its
target (``ctx.data_service``, ``ctx.distribute_dataset``). The cluster then starts as
:func:`tfonspark.run` always does; if it cannot, the service stops before the error goes on.
Once running, the cluster stops the service after its nodes (``begin``'s ``on_end``), in
``shutdown()`` and ``stop()`` alike, also when they raise: no worker process or port is left.

With ``data_service_on="nodes"`` no executor is added: :func:`node_program` makes ``map_fun``
an :class:`~tfonspark.tfprocess.data_worker.OnNodes`, so the first ``N`` nodes run a
``WorkerServer`` in their TF process; the driver reserves the dispatcher's port, starts the
nodes, and starts the dispatcher once they reported their workers' addresses. The workers end
with the nodes' TF processes, the dispatcher with the cluster.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError, ReservationTimeout
from ...settings import Settings
from ...tfprocess.data_worker import ADDRESS, OnNodes
from ..cluster import SPARK_SETTINGS, Cluster
from ..jobs import wait_for_slots
from ..launch import Begin, ClusterOptions
from .data_service import DataService, data_service, dispatcher_for, reserve_dispatcher

if TYPE_CHECKING:
    from pyspark import SparkContext

    from ..nodes.launcher import Launcher

__all__ = ["PLACES", "node_program", "start_beside"]

_log = logging.getLogger(__name__)
#: ``data_service_on``: workers on executors of their own, or in the TF nodes' processes
PLACES = ("executors", "nodes")


def node_program(map_fun: Callable[[Any, Any], Any], options: ClusterOptions, nodes: int) -> Callable[[Any, Any], Any]:
    """``map_fun``, or for ``data_service_on="nodes"`` an :class:`OnNodes` of it, after checking the options.

    Raises ConfigError for an unknown ``data_service_on``, and for ``"nodes"`` with a count that
    is not 1..``nodes`` or with options whose nodes do not run ``map_fun`` once each
    (``coordinator``, ``max_restarts``, ``driver_ps_nodes``).

    Examples
    --------
    >>> program = node_program(main_fun, ClusterOptions(data_service=2, data_service_on="nodes"), 2)  # doctest: +SKIP
    """
    place = options.data_service_on
    if place not in PLACES:
        raise ConfigError(f"data_service_on must be one of {', '.join(map(repr, PLACES))}. Received: {place!r}")
    if place == "executors":
        return map_fun
    count = _count(options.data_service)
    why = _not_on_nodes(options, count, nodes)
    if why:
        raise ConfigError(f"data_service_on='nodes' {why}; or use data_service_on='executors' (executors of their own)")
    return OnNodes(map_fun, count, float(options.reservation_timeout))


def _not_on_nodes(options: ClusterOptions, count: int, nodes: int) -> str:
    """Why ``count`` workers cannot run in ``nodes`` TF nodes under ``options`` ("": they can)."""
    if not 1 <= count <= nodes:
        return f"runs one tf.data worker in each of the first data_service nodes: give 1..{nodes}. Received: {count}"
    if options.coordinator:
        return "needs map_fun on every node, but coordinator=True runs it on the chief only"
    if options.max_restarts:
        return "keeps the dispatcher's worker list for one start of the nodes: max_restarts must be 0"
    if options.driver_ps_nodes:
        return "runs workers on the nodes' executors, not on the driver: driver_ps_nodes must be False"
    return ""


def _count(count: Any) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ConfigError(f"data_service must be a whole number of executors >= 0. Received: {count!r}")
    return count


def start_beside(
    sc: SparkContext,
    options: ClusterOptions,
    chosen: Settings,
    launcher: Launcher | None,
    begin: Begin,
    nodes: int,
) -> Cluster:
    """Start ``options.data_service`` tf.data workers, then the cluster (``begin(target, on_end)``), tied together.

    On Spark (no ``launcher``) it first waits, up to ``reservation_timeout``, until there are
    task slots for both: the ``nodes`` executors of the cluster and the service's workers.
    Raises ReservationTimeout naming both numbers when there are not, ConfigError for a
    ``data_service`` that is not a whole number >= 0, and whatever :func:`tfonspark.data_service`
    or ``begin`` raise (after stopping what had started). With ``data_service_on="nodes"`` the
    nodes need no more slots than their own: see :func:`node_program`.

    Examples
    --------
    >>> cluster = start_beside(sc, ClusterOptions(data_service=1), Settings(), None, begin, 2)  # doctest: +SKIP
    """
    count = _count(options.data_service)
    if options.data_service_on == "nodes":
        return _on_nodes(sc, begin, count, float(options.reservation_timeout))
    if launcher is None:
        _reserve(sc, nodes, count, float(options.reservation_timeout))
    svc = data_service(
        sc, count, settings=chosen, reservation_timeout=float(options.reservation_timeout), launcher=launcher
    )
    try:
        cluster = begin(svc.target, lambda: _stop(svc, "its training cluster stopped"))
    except BaseException:
        _stop(svc, "the training cluster did not start")
        raise
    _log.info("tf.data service %s beside cluster %s", svc.target, cluster.cluster_id[:12])
    return cluster


def _on_nodes(sc: SparkContext, begin: Begin, count: int, timeout: float) -> Cluster:
    """Start the nodes (``count`` of them with a tf.data worker), then the dispatcher with their addresses."""
    handover, address = reserve_dispatcher(sc)
    started: list[DataService] = []

    def end() -> None:
        handover.release()
        for svc in started:
            _stop(svc, "its training cluster stopped")

    try:
        cluster = begin(f"grpc://{address}", end)
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
