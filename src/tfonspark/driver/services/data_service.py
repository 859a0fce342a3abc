"""The tf.data service on Spark: :func:`data_service`, the dispatcher here, a worker per executor.

The workers start as :func:`tfonspark.ps_cluster`'s servers do, the serve-only start of
:mod:`.serving`: one barrier gang, each node running
:func:`tfonspark.tfprocess.data_worker.serve_data` (a ``WorkerServer``, no user code: the
``data_worker`` row of :mod:`tfonspark.driver.programs`) at the address its supervisor reserved.
Order matters for static sharding (FILE, DATA, HINT), where the dispatcher must be told every
worker's address (``DispatcherConfig(worker_addresses=...)``) before any registers:

1. reserve the dispatcher's port here (bound, not listening: nobody else takes it);
2. start the gang: every node registers its reserved address, gets the dispatcher's, and waits
   until that port accepts connections;
3. start the ``DispatchServer`` on the reserved port with the nodes' addresses (the reservation
   is shared with gRPC's socket for the bind and closed right after, as in
   :mod:`tfonspark.ports`): the handle, :class:`DataService`, is made with it;
4. each worker registers and reports it; :func:`data_service` returns once all have.

``shutdown()`` stops the nodes (SIGTERM, SIGKILL after the grace period) and then the
dispatcher (TF 2.21's ``DispatchServer.stop()``), so no process is left and no port accepts.

``run(..., data_service=N, data_service_on="nodes")`` needs the dispatcher alone
(:class:`Dispatcher`, on a port :func:`~tfonspark.driver.plan.reserve_task` reserved, told the addresses the
TF nodes reported): its workers live in the nodes' TF processes and end with them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...config import InputMode
from ...errors import ClusterError, ReservationTimeout
from ...probes import wait_for_servers
from ...settings import Settings
from ...tfprocess.data_worker import ADDRESS, REGISTERED, DataWorkerArgs, distribute
from ..cluster import Cluster, Reserved, Running
from ..options import ClusterOptions, SettingKeywords
from ..plan import reserve_task
from .serving import ServeOnly, ServingCluster, check_count, start_serving
from .watch import watched

if TYPE_CHECKING:
    from typing import Unpack

    from pyspark import SparkContext

    from ...ports import PortHandover
    from ..nodes.launcher import Launcher

__all__ = ["DataService", "Dispatcher", "DispatcherForNodes", "ServiceForCluster", "data_service", "stop_logged"]

_log = logging.getLogger(__name__)
_POLL_SECS = 0.05


@dataclass(frozen=True)
class _Dispatch:
    """The dispatcher's own options: its journal and how long it waits for a silent worker."""

    work_dir: str | None = None
    worker_timeout_ms: int | None = None


class Dispatcher:
    """TF's ``DispatchServer`` in this process, on ``reserved``'s port, told every worker's address.

    Alone, it is the service beside a cluster whose nodes run the workers
    (``data_service_on="nodes"``); a :class:`DataService` has one for its own workers.

    Examples
    --------
    >>> dispatcher = Dispatcher(reserve_task(plan.host, "dispatcher"), ["10.0.0.5:41234"])  # doctest: +SKIP
    """

    def __init__(self, reserved: Reserved, workers: Sequence[str], opts: _Dispatch = _Dispatch()) -> None:
        self.server = _dispatcher(reserved.handover, list(workers), opts)  #: TF's ``DispatchServer``
        self.target = f"grpc://{reserved.address}"  #: ``"grpc://host:port"`` of the dispatcher
        self.worker_addresses = list(workers)  #: ``["host:port", ...]`` of the workers, by task index

    def shutdown(self) -> None:
        """Stop the dispatcher (its workers are someone else's)."""
        self.server.stop()


class DispatcherForNodes:
    """The dispatcher of ``run(..., data_service=N, data_service_on="nodes")``: workers in the first ``N`` nodes.

    Its port is reserved at ``host`` now, so every node's ``ctx.data_service`` can name it; the
    dispatcher itself starts once the cluster runs and its nodes reported their workers'
    addresses (:meth:`follow`); it stops with the cluster's nodes (:meth:`end`).
    """

    def __init__(self, host: str, count: int, timeout: float, port_range: str = "") -> None:
        self.count, self.timeout = count, timeout
        self.reserved = reserve_task(host, "dispatcher", port_range=port_range)  # port_range: the setting
        self.target = f"grpc://{self.reserved.address}"
        self.started: list[Dispatcher] = []

    def end(self) -> None:
        """The cluster's nodes stopped (their workers with them): the dispatcher stops too."""
        self.reserved.release()
        for dispatcher in self.started:
            stop_logged(dispatcher, "its training cluster stopped")

    def abandon(self) -> None:
        self.reserved.release()

    def follow(self, cluster: Cluster) -> None:
        """Start the dispatcher with the addresses the nodes reported; stop the cluster if it cannot."""
        try:
            self.started.append(Dispatcher(self.reserved, _reported(cluster, self.count, self.timeout)))
        except BaseException:
            try:
                cluster.stop(grace_secs=0)
            except Exception as error:  # the failure that stopped the start-up is the one to raise
                _log.warning("stopping cluster %s after its tf.data service failed: %s", cluster.cluster_id[:12], error)
            raise
        _log.info("tf.data dispatcher %s for the workers in nodes %s", self.target, self.started[0].worker_addresses)


class ServiceForCluster:
    """``run(..., data_service=N)``'s service: a :func:`data_service` of ``count`` executors of its own.

    It starts here, before the cluster; it stops once the cluster's nodes stopped (:meth:`end`)
    or the cluster could not start (:meth:`abandon`), a worker's failure logged, not raised.
    """

    def __init__(
        self, sc: SparkContext, count: int, settings: Settings, timeout: float, launcher: Launcher | None
    ) -> None:
        self.svc = data_service(sc, count, settings=settings, reservation_timeout=timeout, launcher=launcher)
        self.target = self.svc.target

    def end(self) -> None:
        stop_logged(self.svc, "its training cluster stopped")

    def abandon(self) -> None:
        stop_logged(self.svc, "the training cluster did not start")

    def follow(self, cluster: Cluster) -> None:
        _log.info("tf.data service %s beside cluster %s", self.target, cluster.cluster_id[:12])


def stop_logged(svc: DataService | Dispatcher, why: str) -> None:
    """Stop ``svc``; a worker's failure is logged, so the cluster's own outcome is the one raised."""
    try:
        svc.shutdown()
    except Exception as error:
        _log.warning("tf.data service %s stopped after %s; a worker had failed: %s", svc.target, why, error)


class DataService(ServingCluster):
    """A running tf.data service: the dispatcher in this process, one ``WorkerServer`` per executor.

    Made by :func:`data_service`; a context manager that stops every server when the block ends.
    It is the workers' cluster handle (``cluster_info``, ``reports``, ``server_restarts``);
    ``cluster`` is the handle itself, for code that read ``svc.cluster.server_restarts``.

    Examples
    --------
    >>> with tfonspark.data_service(sc, num_workers=2) as svc:  # doctest: +SKIP
    ...     ds = svc.distribute(tf.data.Dataset.range(10), job_name="train")
    """

    what = "tf.data service"

    def __init__(self, running: Running, dispatcher: Dispatcher) -> None:
        """Made by :func:`data_service`, once the workers and the dispatcher run."""
        super().__init__(running)
        self._dispatch = dispatcher
        self.dispatcher = dispatcher.server  #: TF's ``DispatchServer``, in this process
        self.target = dispatcher.target  #: ``"grpc://host:port"`` of the dispatcher
        self.worker_addresses = dispatcher.worker_addresses  #: ``["host:port", ...]`` of the workers, by task index

    def distribute(
        self,
        dataset: Any,
        processing_mode: Any = "distributed_epoch",
        *,
        job_name: str | None = None,
        sharding_policy: Any = None,
        max_outstanding_requests: int | None = None,
    ) -> Any:
        """``dataset`` read through this service, after checking the workers can run it.

        Parameters
        ----------
        dataset : tf.data.Dataset
            What the workers run; a ``py_function``/``numpy_function``/``from_generator`` in it
            raises ConfigError here, before any job starts.
        processing_mode : str
            ``"distributed_epoch"`` (every element once per epoch, split across the workers) or
            ``"parallel_epochs"`` (every worker produces the whole dataset).
        job_name : str, optional
            Readers that give the same name share one job (and split its elements).
        sharding_policy : tf.data.experimental.service.ShardingPolicy, optional
            OFF, DYNAMIC, FILE, DATA, FILE_OR_DATA or HINT; replaces ``processing_mode``.
        max_outstanding_requests : int, optional
            As for ``tf.data.experimental.service.distribute``.

        Examples
        --------
        >>> ds = svc.distribute(ds, "parallel_epochs", job_name="train")  # doctest: +SKIP
        """
        mode = processing_mode if sharding_policy is None else sharding_policy
        return distribute(
            dataset, self.target, mode, job_name=job_name, max_outstanding_requests=max_outstanding_requests
        )

    def watch(self, dataset: Iterable[Any], poll_secs: float = 1.0) -> Iterator[Any]:
        """``dataset``'s elements, raising NodeFailed within ``poll_secs`` once a worker is lost for good.

        TF's reader is never told that a worker is gone for good (its executor lost, its restarts
        in place used up): it retries the dead address forever. Read through this instead of
        hanging (:func:`tfonspark.driver.services.watch.watched` with this cluster's failures).

        Parameters
        ----------
        dataset : iterable
            What to read: a dataset made by :meth:`distribute`.
        poll_secs : float
            How often the driver's view of lost workers is checked while waiting.

        Examples
        --------
        >>> for batch in svc.watch(svc.distribute(ds)):  # doctest: +SKIP
        ...     train_step(batch)
        """
        return watched(dataset, self._attempts.gang.failures, poll_secs)

    def wait_serving(self, timeout: float) -> None:
        """Wait until every worker listens and has reported its registration with the dispatcher.

        Raises ClusterError if a worker failed meanwhile (``shutdown()`` then names it).

        Parameters
        ----------
        timeout : float
            Seconds to wait for the servers, and for the registrations, before a ReservationTimeout.

        Examples
        --------
        >>> svc.wait_serving(60)  # doctest: +SKIP
        """
        deadline = time.monotonic() + timeout
        failed = self._attempts.gang.failures
        wait_for_servers({"worker": self.worker_addresses}, timeout, failed)
        count = len(self.worker_addresses)
        while not failed():
            done = {r.index for r in self.reports if REGISTERED in r.metrics}
            if len(done) >= count:
                break
            if time.monotonic() > deadline:
                raise ReservationTimeout(
                    f"only {len(done)} of {count} tf.data workers registered with the dispatcher in time "
                    "(raise reservation_timeout, or check the executor logs)",
                    registered=len(done),
                    required=count,
                )
            time.sleep(_POLL_SECS)
        if failed():
            raise ClusterError("a tf.data worker failed while the service started")  # shutdown() names it

    def summary(self) -> str:
        """The dispatcher and its workers.

        Examples
        --------
        >>> svc.summary()  # doctest: +SKIP
        "grpc://10.0.0.1:5050, workers ['10.0.0.5:41234']"
        """
        return f"{self.target}, workers {self.worker_addresses}"

    def _close(self) -> None:
        """After the workers: stop the dispatcher."""
        self._dispatch.shutdown()


def data_service(
    sc: SparkContext,
    num_workers: int,
    *,
    work_dir: str | None = None,
    settings: Settings | None = None,
    reservation_timeout: float = 600,
    heartbeat_interval_ms: int | None = None,
    worker_timeout_ms: int | None = None,
    launcher: Launcher | None = None,
    **setting_keywords: Unpack[SettingKeywords],
) -> DataService:
    """Start a tf.data service: the dispatcher in this driver, ``num_workers`` workers on executors.

    Returns once every worker has registered with the dispatcher. No training cluster is
    needed: any process that reaches ``svc.target`` reads from it. The service's gRPC has no
    authentication (docs/data_service.md).

    Parameters
    ----------
    sc : pyspark.SparkContext
        The Spark context: ``num_workers`` task slots are reserved at once (a barrier stage).
    num_workers : int
        ``WorkerServer``s, one per Spark task slot (at least 1).
    work_dir : str, optional
        A directory the dispatcher journals its state in (``fault_tolerant_mode=True``).
    settings : Settings, optional
        Cluster settings, as for :func:`tfonspark.run` (``heartbeat_timeout`` ...).
    reservation_timeout : float
        Seconds to wait for the task slots, and then for every worker to register.
    heartbeat_interval_ms : int, optional
        How often workers heartbeat to the dispatcher (TF's default: 30 s).
    worker_timeout_ms : int, optional
        How long the dispatcher waits for a worker's heartbeat before dropping it (TF's default:
        10 min); readers of a lost worker's tasks wait that long before going on without it.
    launcher : Launcher, optional
        Starts the node supervisors (tests: ``tfonspark.testing.LocalLauncher``).
    **setting_keywords : SettingKeywords
        Fields of ``Settings`` by name, merged into ``settings``.

    Raises ReservationTimeout when Spark cannot give the task slots in time (naming the numbers
    and the Spark settings to change), ConfigError for a bad argument.

    Examples
    --------
    >>> with tfonspark.data_service(sc, num_workers=2) as svc:  # doctest: +SKIP
    ...     ds = ds.apply(tf.data.experimental.service.distribute("distributed_epoch", svc.target))
    """
    check_count("data_service", "num_workers", num_workers)
    chosen = (settings or Settings()).merged(setting_keywords)
    options = ClusterOptions(input_mode=InputMode.TENSORFLOW, reservation_timeout=reservation_timeout)
    # the dispatcher as a driver-held task of every spec (the workers find it there): a serve-only
    # node, so its supervisor restarts a killed WorkerServer in place at the same address (the
    # dispatcher's worker list stays right)
    args = DataWorkerArgs(heartbeat_interval_ms=heartbeat_interval_ms, wait_secs=float(reservation_timeout))
    job = ServeOnly(
        f"data_service(num_workers={num_workers}, each its own Spark task slot)",
        "data_worker",
        num_workers,
        options,
        "dispatcher",
        tf_args=args,
    )
    opts = _Dispatch(work_dir, worker_timeout_ms)

    def serve(running: Running) -> DataService:
        assert running.held is not None  # the dispatcher's port
        workers = running.attempts.gang.cluster_spec().get("worker", [])
        return DataService(running, Dispatcher(running.held, workers, opts))

    return start_serving(sc, job, chosen, launcher, serve)


def _dispatcher(handover: PortHandover, workers: list[str], opts: _Dispatch) -> Any:
    """TF's ``DispatchServer`` on the reserved port, told every worker's address."""
    import tensorflow as tf

    config = tf.data.experimental.service.DispatcherConfig(
        port=handover.port,
        work_dir=opts.work_dir,
        fault_tolerant_mode=bool(opts.work_dir),
        worker_addresses=workers,
        worker_timeout_ms=opts.worker_timeout_ms,
    )
    handover.share_with_server()  # gRPC's socket (SO_REUSEADDR) binds beside the reservation: no gap
    try:
        return tf.data.experimental.service.DispatchServer(config)
    finally:
        handover.release()


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
        time.sleep(_POLL_SECS)
