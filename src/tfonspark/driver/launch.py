"""Start a cluster: resolve its settings, plan its roles, open the rendezvous, launch the nodes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

from ..config import InputMode, NodeConfig
from ..errors import ConfigError, ReservationTimeout
from ..executor.host import local_ip_towards
from ..wire.framing import new_secret
from .cluster import SPARK_SETTINGS, Cluster
from .jobs import barrier_supported, wait_for_slots
from .plan import CHIEF_ROLES, plan_roles
from .rendezvous import RendezvousServer
from .reports import Report, ReportLog

__all__ = ["run"]


def _int_env(name: str) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else 0
    except ValueError:
        raise ConfigError(f"{name} must be an integer. Received: {value!r}") from None


def _float_env(name: str) -> float:
    value = os.environ.get(name, "")
    try:
        number = float(value) if value else 0.0
    except ValueError:
        number = -1.0
    if number < 0 or number != number:
        raise ConfigError(f"{name} must be a number of seconds > 0. Received: {value!r}")
    return number


def _driver_host(sc: Any) -> str:
    host = sc.getConf().get("spark.driver.host", None)
    return host or local_ip_towards("8.8.8.8")


def _default_fs(sc: Any) -> str:
    try:
        return str(sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file://")
    except Exception:
        return "file://"


def run(
    sc: Any,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int,
    num_ps: int = 0,
    tensorboard: bool = False,
    input_mode: InputMode | int = InputMode.TENSORFLOW,
    log_dir: str | None = None,
    driver_ps_nodes: bool = False,
    master_node: str | None = None,
    reservation_timeout: float = 600,
    queues: Any = None,
    eval_node: bool = False,
    release_port: bool = True,
    *,
    on_report: Callable[[Report], Any] | None = None,
) -> Cluster:
    """Start a TensorFlow cluster of ``num_executors`` nodes on Spark executors (TFoS ``TFCluster.run``).

    ``map_fun(tf_args, ctx)`` runs in one TF process per node. Returns a :class:`Cluster` once
    every node is up; raises ReservationTimeout if the executors cannot be reserved in time.
    ``on_report(report)`` is called on the driver for each ``ctx.report({...})`` a node makes
    (default: logged at INFO on the ``tfonspark.report`` logger; all are in ``cluster.reports``).
    """
    from pyspark import cloudpickle

    if not callable(map_fun):
        raise ConfigError(f"map_fun must be callable. Received: {type(map_fun).__name__}")
    roles = plan_roles(num_executors, num_ps, master_node, eval_node, driver_ps_nodes)
    mode = InputMode(input_mode)
    secret = new_secret()
    cluster_id = uuid.uuid4().hex
    heartbeat_timeout = _float_env("TFONSPARK_HEARTBEAT_TIMEOUT") or 60.0
    heartbeat_secs = min(5.0, heartbeat_timeout / 4)
    server = RendezvousServer(
        cluster_id, roles, secret, _driver_host(sc), heartbeat_secs=heartbeat_secs, heartbeat_timeout=heartbeat_timeout
    )
    config = NodeConfig(
        cluster_id=cluster_id,
        driver_host=server.address[0],
        driver_port=server.address[1],
        secret_hex=secret.hex(),
        input_mode=mode,
        tensorboard=tensorboard,
        log_dir=log_dir,
        release_port=release_port,
        reservation_timeout=float(reservation_timeout),
        default_fs=_default_fs(sc),
        chief_job=master_node if master_node in CHIEF_ROLES else "worker",
        tensorboard_port=_int_env("TENSORBOARD_PORT"),
        feed_buffer_bytes=_int_env("TFOS_FEED_BUFFER_BYTES") or 64 * 1024 * 1024,
        bind_host=os.environ.get("TFONSPARK_BIND_HOST", ""),
        heartbeat_secs=heartbeat_secs,
        heartbeat_timeout=heartbeat_timeout,
    )
    cluster = Cluster(sc, roles, server, config, mode, reports=ReportLog(on_report))
    spark_nodes = sum(1 for r in roles if not r.on_driver)
    use_barrier = barrier_supported(sc)
    try:
        if use_barrier:
            slots = wait_for_slots(sc, spark_nodes, float(reservation_timeout))
            if slots < spark_nodes:
                raise ReservationTimeout(
                    f"the cluster needs {spark_nodes} Spark task slots for its TensorFlow nodes but "
                    f"only {slots} were available after {reservation_timeout}s; check {SPARK_SETTINGS} "
                    "or lower num_executors.",
                    registered=slots,
                    required=spark_nodes,
                )
        cluster._start(cloudpickle.dumps((map_fun, tf_args)), use_barrier)
    except BaseException:
        cluster._teardown(grace_secs=0)
        raise
    return cluster
