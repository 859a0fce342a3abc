"""Parameter-server training with the driver as coordinator: :func:`ps_cluster`.

TF 2's ``ParameterServerStrategy`` is driven by one program, the coordinator, which holds the
``chief`` task and sends functions to ``worker`` tasks whose variables live on ``ps`` tasks. On
Spark that program is the driver. :func:`ps_cluster` starts ``num_workers + num_ps`` nodes as one
barrier gang, the serve-only start of :mod:`.serving`, each running
:func:`tfonspark.tfprocess.server.serve` (a ``tf.distribute.Server`` for its task, no user code:
the ``ps`` row of :mod:`tfonspark.driver.programs`), and adds a ``chief`` task at the driver's
address to every node's cluster spec. The port of that task is reserved here and handed to the
coordinator's own server as it binds it (:func:`tfonspark.ports.hand_over_port`), so no other
process takes it meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...config import InputMode
from ...errors import ConfigError
from ...probes import servers_accepting, wait_for_servers
from ...settings import Settings
from ...tfprocess.hints import add_ps_hint
from ...tfprocess.server import coordinator_spec
from ..cluster import Running
from ..options import ClusterOptions, SettingKeywords
from .serving import ServeOnly, ServingCluster, check_count, start_serving

if TYPE_CHECKING:
    from typing import Unpack

    from pyspark import SparkContext

    from ..nodes.launcher import Launcher

__all__ = ["PSCluster", "ps_cluster", "servers_accepting"]


class PSCluster(ServingCluster):
    """A running parameter-server cluster whose coordinator (``chief``) is this driver process.

    Made by :func:`ps_cluster`; a context manager that stops every node when the block ends. It is
    the cluster's handle (``cluster_info``, ``reports``, ``server_restarts``); ``cluster`` is
    the handle itself, for code that read ``cluster.cluster.reports``. ``shutdown()`` stops the
    nodes and frees the chief's port; the coordinator's own server, in this process, stays bound
    until the process ends: TensorFlow cannot stop it.

    Examples
    --------
    >>> with tfonspark.ps_cluster(sc, num_workers=2, num_ps=1) as cluster:  # doctest: +SKIP
    ...     strategy = tf.distribute.ParameterServerStrategy(cluster.cluster_resolver())
    """

    what = "parameter-server cluster"
    failure_causes_block_error = True  # a ps died: TF's error in the block is its effect

    def __init__(self, running: Running) -> None:
        """Made by :func:`ps_cluster` once the nodes are up."""
        super().__init__(running)
        self.chief = self.reserved.address  #: ``host:port`` of the driver's ``chief`` task

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

    def wait_serving(self, timeout: float) -> None:
        """Wait until every ps and worker server listens (or a node failed: the caller raises that).

        Parameters
        ----------
        timeout : float
            Seconds to wait before a ReservationTimeout names the servers that do not listen.

        Examples
        --------
        >>> cluster.wait_serving(60)  # doctest: +SKIP
        """
        wait_for_servers(self.cluster_spec, timeout, self._attempts.gang.failures)

    def _explain(self, exc: BaseException) -> None:
        add_ps_hint(exc)  # e.g. Keras 3's model.fit under PS: name the route that works


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
        in ``cluster.reports``.
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
    for name, value in (("num_workers", num_workers), ("num_ps", num_ps)):
        check_count("ps_cluster", name, value, " (ParameterServerStrategy)")
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
    where = "ps on the driver" if driver_ps_nodes else "each its own Spark task slot"
    job = ServeOnly(
        f"ps_cluster(num_workers={num_workers}, num_ps={num_ps}, {where})",
        "ps" if evaluator is None else "ps_evaluator",
        num_workers + num_ps + int(evaluator is not None),
        options,
        "chief",
        hand_over=True,  # the chief's port: held until the coordinator's server (TF's, in this process) binds it
        fn=evaluator,
    )
    return start_serving(sc, job, chosen, launcher, PSCluster)
