"""Start a cluster: resolve its settings, plan its roles, open the rendezvous, launch the nodes."""

from __future__ import annotations

import importlib.util
import logging
import uuid
from collections.abc import Callable
from typing import Any

from .. import settings
from ..config import InputMode, NodeConfig
from ..errors import ConfigError, ReservationTimeout
from ..executor.gpus import requested_gpus
from ..fs import default_fs
from ..host import local_ip_towards
from ..wire.framing import new_secret
from .cluster import SPARK_SETTINGS, Cluster
from .jobs import barrier_supported, wait_for_slots
from .launcher import Launcher, SparkLauncher
from .plan import CHIEF_ROLES, plan_roles
from .rendezvous import RendezvousServer
from .reports import Report, ReportLog
from .restarts import check_max_restarts

__all__ = ["run"]

_log = logging.getLogger(__name__)
_LEGACY_KERAS_KEYS = "legacy_keras=False (or spark.tfonspark.legacyKeras=off, or TFONSPARK_LEGACY_KERAS=off)"


def _driver_host(sc: Any) -> str:
    host = sc.getConf().get("spark.driver.host", None)
    return host or local_ip_towards("8.8.8.8")


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
    launcher: Launcher | None = None,
    server_host: str | None = None,
    server_port: int | str | None = None,
    feed_buffer_bytes: int | None = None,
    tensorboard_port: int | None = None,
    bind_host: str | None = None,
    heartbeat_timeout: float | None = None,
    collective: str | None = None,
    legacy_keras: bool | str | None = None,
    max_restarts: int = 0,
    _tfos_face: bool = False,
) -> Cluster:
    """Start a TensorFlow cluster of ``num_executors`` nodes on Spark executors (TFoS ``TFCluster.run``).

    ``map_fun(tf_args, ctx)`` runs in one TF process per node. Returns a :class:`Cluster` once
    every node is up; raises ReservationTimeout if the executors cannot be reserved in time.
    ``on_report(report)`` is called on the driver for each ``ctx.report({...})`` a node makes
    (default: logged at INFO on the ``tfonspark.report`` logger; all are in ``cluster.reports``).
    ``launcher`` starts the node supervisors (default: a Spark job, a barrier stage where
    possible); ``tfonspark.testing.LocalLauncher`` starts them without Spark, for tests.
    ``max_restarts`` > 0: after a node fails, tear the cluster down, reserve the executors again
    and start ``map_fun`` again on every node (``ctx.attempt`` counts), up to that many times
    (README, "Surviving node loss").

    The keyword arguments from ``server_host`` on are the settings of :mod:`tfonspark.settings`
    (README, "Settings"): each one left at ``None`` is read from the Spark conf key
    ``spark.tfonspark.<camelCase name>``, else from its environment variable, else its default.
    """
    from pyspark import cloudpickle

    if not callable(map_fun):
        raise ConfigError(f"map_fun must be callable. Received: {type(map_fun).__name__}")
    check_max_restarts(max_restarts)
    roles = plan_roles(num_executors, num_ps, master_node, eval_node, driver_ps_nodes)
    mode = InputMode(input_mode)
    num_gpus = requested_gpus(tf_args)  # TFoS's tf_args.num_gpus: how many GPUs each node takes
    chosen = {
        "server_host": server_host,
        "server_port": server_port,
        "feed_buffer_bytes": feed_buffer_bytes,
        "tensorboard_port": tensorboard_port,
        "bind_host": bind_host,
        "heartbeat_timeout": heartbeat_timeout,
        "collective": collective,
        "legacy_keras": legacy_keras,
    }
    resolved = settings.resolve(chosen, sc.getConf())
    cluster_id = uuid.uuid4().hex
    heartbeat_secs = min(5.0, resolved.heartbeat_timeout / 4)
    keras = _node_keras(resolved.legacy_keras, _tfos_face)

    def form(attempt: int) -> tuple[RendezvousServer, NodeConfig]:
        """A rendezvous server with a fresh secret, and the nodes' config for ``attempt``."""
        secret = new_secret()
        server = RendezvousServer(
            cluster_id,
            roles,
            secret,
            _driver_host(sc),
            resolved.server_port,
            bind_host=resolved.server_host or None,
            heartbeat_secs=heartbeat_secs,
            heartbeat_timeout=resolved.heartbeat_timeout,
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
            default_fs=default_fs(sc),
            chief_job=master_node if master_node in CHIEF_ROLES else "worker",
            heartbeat_secs=heartbeat_secs,
            legacy_keras=keras,
            tfos_face=_tfos_face,
            num_gpus=num_gpus,
            attempt=attempt,
            **resolved.node_fields(),
        )
        return server, config

    server, config = form(0)
    use_barrier = launcher is None and barrier_supported(sc)
    launcher = launcher or SparkLauncher(sc, barrier=use_barrier)
    needed = sum(1 for r in roles if not r.on_driver)
    reserve = (lambda: _reserve_slots(sc, needed, float(reservation_timeout))) if use_barrier else None
    cluster = Cluster(
        sc,
        roles,
        server,
        config,
        mode,
        reports=ReportLog(on_report),
        launcher=launcher,
        max_restarts=max_restarts,
        reform=form,
        reserve=reserve,
    )
    try:
        if reserve is not None:
            reserve()
        payload: bytes = cloudpickle.dumps((map_fun, tf_args))  # type: ignore[no-untyped-call]  # untyped in pyspark
        cluster._begin(payload)
    except BaseException:
        cluster._teardown(grace_secs=0)
        raise
    return cluster


def _reserve_slots(sc: Any, needed: int, timeout: float) -> None:
    """Barrier stages need every task slot at once: wait for them, or say which settings to change."""
    slots = wait_for_slots(sc, needed, timeout)
    if slots < needed:
        raise ReservationTimeout(
            f"the cluster needs {needed} Spark task slots for its TensorFlow nodes but only {slots} were "
            f"available after {timeout}s; check {SPARK_SETTINGS} or lower num_executors.",
            registered=slots,
            required=needed,
        )


def _node_keras(mode: str, tfos_face: bool) -> str:
    """``NodeConfig.legacy_keras`` for the ``legacy_keras`` setting, said in one log line."""
    if mode == "off" or (mode == "auto" and not tfos_face):
        return ""
    if mode == "on":
        _log.info("TF processes use Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1): legacy_keras=on")
        return "on"
    if importlib.util.find_spec("tf_keras") is None:
        _log.warning(
            "TFoS face: tf_keras is not installed, so TF processes use Keras 3, where model.fit under "
            "MultiWorkerMirroredStrategy fails; pip install 'tfonspark[tfos]' to run TFoS Keras programs unchanged"
        )
    else:
        _log.info(
            "TFoS face: TF processes use Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1) as TFoS programs expect; "
            "%s keeps Keras 3",
            _LEGACY_KERAS_KEYS,
        )
    return "auto"
