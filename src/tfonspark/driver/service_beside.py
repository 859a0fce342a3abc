"""``run(..., data_service=N)``: a tf.data service beside a training cluster, ended with it.

The service (:func:`tfonspark.data_service`: the dispatcher on the driver, ``N`` workers on
executors of their own) starts first, so the nodes' ``NodeConfig.data_service`` can name its
target (``ctx.data_service``, ``ctx.distribute_dataset``). The cluster then starts as
:func:`tfonspark.run` always does; if it cannot, the service stops before the error goes on.
Once running, the cluster stops the service after its nodes (``begin``'s ``on_end``), in
``shutdown()`` and ``stop()`` alike, also when they raise: no worker process or port is left.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import ConfigError, ReservationTimeout
from ..settings import Settings
from .cluster import SPARK_SETTINGS, Cluster
from .data_service import DataService, data_service
from .jobs import wait_for_slots
from .launch import Begin, ClusterOptions

if TYPE_CHECKING:
    from pyspark import SparkContext

    from .launcher import Launcher

__all__ = ["start_beside"]

_log = logging.getLogger(__name__)


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
    or ``begin`` raise (after stopping what had started).

    Examples
    --------
    >>> cluster = start_beside(sc, ClusterOptions(data_service=1), Settings(), None, begin, 2)  # doctest: +SKIP
    """
    count = options.data_service
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ConfigError(f"data_service must be a whole number of executors >= 0. Received: {count!r}")
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
