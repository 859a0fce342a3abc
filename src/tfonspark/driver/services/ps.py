"""Parameter-server training with the driver as coordinator: :func:`ps_cluster`.

TF 2's ``ParameterServerStrategy`` is driven by one program, the coordinator, which holds the
``chief`` task and sends functions to ``worker`` tasks whose variables live on ``ps`` tasks. On
Spark that program is the driver. :func:`ps_cluster` starts ``num_workers + num_ps`` nodes as one
barrier gang (the usual start path: :func:`tfonspark.driver.launch.start`), each running
:func:`tfonspark.tfprocess.server.serve` (a ``tf.distribute.Server`` for its task, no user code),
and adds a ``chief`` task at the driver's address to every node's cluster spec. The port of that
task is reserved here and handed to the coordinator's own server as it binds it
(:func:`tfonspark.ports.hand_over_port`), so no other process takes it meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ...config import InputMode
from ...errors import ConfigError, NodeFailed, ReservationTimeout
from ...ports import PortHandover, hand_over_port, reserve_port
from ...settings import Settings
from ...tfprocess.hints import add_ps_hint
from ...tfprocess.server import (
    coordinator_spec,
    servers_accepting,
    wait_for_servers,
)
from ..cluster import Cluster
from ..nodes.node_events import ServerRestart
from ..options import ClusterOptions, SettingKeywords
from ..plan import driver_host, prepare
from ..programs import ProgramKind

if TYPE_CHECKING:
    from typing import Unpack

    from pyspark import SparkContext

    from ..nodes.launcher import Launcher

__all__ = ["PSCluster", "chief_address", "ps_cluster", "servers_accepting"]

_log = logging.getLogger(__name__)


def chief_address(host: str, port: int) -> str:
    """The ``host:port`` of the driver's ``chief`` task, as TF's cluster specs write it (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class PSCluster:
    """A running parameter-server cluster whose coordinator (``chief``) is this driver process.

    Made by :func:`ps_cluster`; a context manager that stops every node when the block ends.
    ``cluster`` is the underlying :class:`~tfonspark.Cluster` (``cluster_info``, ``reports``).

    Examples
    --------
    >>> with tfonspark.ps_cluster(sc, num_workers=2, num_ps=1) as cluster:  # doctest: +SKIP
    ...     strategy = tf.distribute.ParameterServerStrategy(cluster.cluster_resolver())
    """

    def __init__(self, cluster: Cluster, chief: str, handover: PortHandover) -> None:
        """Made by :func:`ps_cluster`, which starts the nodes first."""
        self.cluster = cluster
        self.chief = chief  #: ``host:port`` of the driver's ``chief`` task
        self._handover = handover

    @property
    def cluster_spec(self) -> dict[str, list[str]]:
        """``{"chief": [driver], "ps": [...], "worker": [...]}``: what every node's ``TF_CONFIG`` has."""
        spec = self.cluster.server.cluster_spec
        assert spec is not None  # the nodes are up, so the spec was formed
        return {job: list(hosts) for job, hosts in spec.items()}

    @property
    def server_restarts(self) -> list[ServerRestart]:
        """Worker servers restarted in place after they died (docs/ps.md), oldest first:
        ``cluster.server_restarts[0].down_s``."""
        return self.cluster.server_restarts

    def cluster_resolver(self, rpc_layer: str = "grpc") -> Any:
        """The driver's ``SparkClusterResolver``: task ``chief`` 0 of this cluster.

        Parameters
        ----------
        rpc_layer : str
            The protocol TF's servers speak ("grpc").

        Examples
        --------
        >>> resolver = cluster.cluster_resolver()  # doctest: +SKIP
        >>> strategy = tf.distribute.ParameterServerStrategy(resolver)  # doctest: +SKIP
        """
        from ...distribute import resolver  # the module: its class is built (TensorFlow imported) on access

        spec = coordinator_spec(self.cluster_spec)  # TF's coordinator would wait for an evaluator
        return resolver.SparkClusterResolver(spec, "chief", 0, rpc_layer=rpc_layer)

    def shutdown(self, grace_secs: float = 2.0) -> None:
        """Stop every node's server (SIGTERM, then SIGKILL after ``grace_secs``) and free the chief's port.

        Raises NodeFailed if a node had failed before. The coordinator's own server, in this
        process, stays bound until the process ends: TensorFlow cannot stop it.

        Parameters
        ----------
        grace_secs : float
            How long each node's TF process gets between SIGTERM and SIGKILL.

        Examples
        --------
        >>> cluster.shutdown()  # doctest: +SKIP
        """
        started = time.monotonic()
        try:
            self.cluster.stop(grace_secs)
        finally:
            self._handover.release()  # no-op once the coordinator's server took the port
            _log.info("parameter-server cluster stopped in %.1fs", time.monotonic() - started)

    def __enter__(self) -> PSCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.shutdown()
            return
        add_ps_hint(exc)  # e.g. Keras 3's model.fit under PS: name the route that works
        try:
            self.shutdown()
        except NodeFailed as failed:  # the cause of TF's error in the block (a ps died): raise it, chained
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: theirs goes on
                _log.warning("while stopping the parameter-server cluster after %r: %s", exc, failed)
                return
            raise failed from exc
        except Exception as error:  # the block's own error is the one to see
            _log.warning("while stopping the parameter-server cluster after %r: %s", exc, error)


def ps_cluster(
    sc: SparkContext,
    num_workers: int,
    num_ps: int = 1,
    *,
    settings: Settings | None = None,
    driver_ps_nodes: bool = False,
    reservation_timeout: float = 600,
    max_restarts: int = 0,
    launcher: Launcher | None = None,
    evaluator: Callable[[Any, Any], Any] | None = None,
    **setting_keywords: Unpack[SettingKeywords],
) -> PSCluster:
    """Start ``num_workers`` worker and ``num_ps`` ps servers on Spark executors, with this driver as ``chief``.

    Every node runs a ``tf.distribute.Server`` for its task and nothing else; the driver's
    ``ParameterServerStrategy`` and ``ClusterCoordinator`` send them the work. Returns once
    every server accepts connections. Leaving the ``with`` block (or ``shutdown()``) stops them.

    Parameters
    ----------
    sc : pyspark.SparkContext
        The Spark context: ``num_workers + num_ps`` task slots are reserved at once (a barrier
        stage), ``num_workers`` of them with ``driver_ps_nodes``.
    num_workers : int
        Worker tasks (at least 1).
    num_ps : int
        Parameter-server tasks (at least 1).
    settings : Settings, optional
        Cluster settings, as for :func:`tfonspark.run` (``heartbeat_timeout``, ``bind_host`` ...).
    driver_ps_nodes : bool
        Run the ps tasks as processes on the driver's host, as TFoS did.
    reservation_timeout : float
        Seconds to wait for the task slots and for every node to register.
    max_restarts : int
        As for :func:`tfonspark.run`: a node failing while the cluster starts restarts the
        whole start (fresh addresses). Later, a worker server that dies is restarted in place
        (same address; at most ``max(3, max_restarts)`` times) and TF's coordinator re-runs
        its closures; a ps that dies is not: TF's error leaves the block, and NodeFailed
        naming the ps is raised from it (docs/ps.md, "Failures").
    launcher : Launcher, optional
        Starts the node supervisors (tests: ``tfonspark.testing.LocalLauncher``).
    evaluator : callable, optional
        ``evaluator(None, ctx)`` runs on one more executor, task ``evaluator`` 0, while the
        driver coordinates: a sidecar evaluator (``tfonspark.keras.sidecar_evaluate``) reading
        the checkpoints the driver saves. It runs no TF server and is left out of the driver's
        resolver; leaving the block stops it with SIGTERM, after which ``sidecar_evaluate``
        evaluates the last checkpoint (within ``shutdown(grace_secs=...)``). Its reports are
        in ``cluster.cluster.reports``.
    **setting_keywords : SettingKeywords
        Fields of ``Settings`` by name, merged into ``settings``.

    Raises ReservationTimeout when Spark cannot give the task slots in time (naming the numbers
    and the Spark settings to change), ConfigError for a bad argument.

    Examples
    --------
    >>> with tfonspark.ps_cluster(sc, num_workers=2, num_ps=1) as cluster:  # doctest: +SKIP
    ...     strategy = tf.distribute.ParameterServerStrategy(cluster.cluster_resolver())
    ...     coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    ...     coordinator.schedule(train_step, args=(iter(per_worker_dataset),))
    ...     coordinator.join()
    """
    _check_counts(num_workers, num_ps)
    if evaluator is not None and not callable(evaluator):
        raise ConfigError(f"evaluator must be callable or None. Received: {type(evaluator).__name__}")
    chosen = (settings or Settings()).merged(setting_keywords)
    options = ClusterOptions(
        num_ps=num_ps,
        input_mode=InputMode.TENSORFLOW,
        driver_ps_nodes=driver_ps_nodes,
        reservation_timeout=reservation_timeout,
        max_restarts=max_restarts,
        eval_node=evaluator is not None,
    )
    held = reserve_port()  # the chief's port: held until the coordinator's server binds it
    chief = chief_address(driver_host(sc), held.getsockname()[1])
    handover = hand_over_port(held)
    started = time.monotonic()
    try:
        program: ProgramKind = "ps" if evaluator is None else "ps_evaluator"
        nodes = num_workers + num_ps + int(evaluator is not None)
        tasks = {"chief": [chief]}
        plan = prepare(
            sc, evaluator, None, nodes, options, chosen, program=program, launcher=launcher, driver_tasks=tasks
        )
        cluster = plan.start(Cluster)
    except ReservationTimeout as error:
        handover.release()
        raise _named(error, num_workers, num_ps, driver_ps_nodes) from error
    except BaseException:
        handover.release()
        raise
    ps = PSCluster(cluster, chief, handover)
    try:
        wait_for_servers(ps.cluster_spec, float(reservation_timeout), cluster.server.failures)
    except BaseException:
        ps.shutdown(grace_secs=0)
        raise
    _log.info("parameter-server cluster up in %.1fs: %s", time.monotonic() - started, ps.cluster_spec)
    return ps


def _check_counts(num_workers: int, num_ps: int) -> None:
    for name, value in (("num_workers", num_workers), ("num_ps", num_ps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"ps_cluster needs {name} >= 1 (ParameterServerStrategy). Received: {value!r}")


def _named(error: ReservationTimeout, num_workers: int, num_ps: int, driver_ps_nodes: bool) -> ReservationTimeout:
    """``error`` saying which ``ps_cluster`` call needed the slots."""
    where = "ps on the driver" if driver_ps_nodes else "each its own Spark task slot"
    return ReservationTimeout(
        f"ps_cluster(num_workers={num_workers}, num_ps={num_ps}, {where}): {error}",
        registered=error.registered,
        required=error.required,
    )
