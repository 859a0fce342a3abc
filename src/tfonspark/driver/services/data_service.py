"""The tf.data service on Spark: :func:`data_service`, the dispatcher here, a worker per executor.

The workers start as :func:`tfonspark.ps_cluster`'s servers do: one barrier gang through
:func:`tfonspark.driver.launch.start`, each node running
:func:`tfonspark.tfprocess.data_worker.serve_data` (a ``WorkerServer``, no user code) at the
address its supervisor reserved. Order matters for static sharding (FILE, DATA, HINT), where
the dispatcher must be told every worker's address (``DispatcherConfig(worker_addresses=...)``)
before any registers:

1. reserve the dispatcher's port here (bound, not listening: nobody else takes it);
2. start the gang: every node registers its reserved address, gets the dispatcher's, and waits
   until that port accepts connections;
3. start the ``DispatchServer`` on the reserved port with the nodes' addresses (the reservation
   is shared with gRPC's socket for the bind and closed right after, as in
   :mod:`tfonspark.ports`);
4. each worker registers and reports it; :func:`data_service` returns once all have.

``shutdown()`` stops the nodes (SIGTERM, SIGKILL after the grace period) and then the
dispatcher (TF 2.21's ``DispatchServer.stop()``), so no process is left and no port accepts.

``run(..., data_service=N, data_service_on="nodes")`` needs the dispatcher alone
(:func:`reserve_dispatcher`, then :func:`dispatcher_for` with the addresses the TF nodes
reported): its workers live in the nodes' TF processes and end with them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ...config import InputMode
from ...errors import ClusterError, ConfigError, ReservationTimeout
from ...ports import PortHandover, reserve_port
from ...settings import Settings
from ...tfprocess.data_worker import REGISTERED, DataWorkerArgs, distribute, watched
from ...tfprocess.server import wait_for_servers
from ..cluster import Cluster
from ..options import ClusterOptions, SettingKeywords
from ..plan import driver_host, prepare
from .ps import chief_address

if TYPE_CHECKING:
    from typing import Unpack

    from pyspark import SparkContext

    from ..nodes.launcher import Launcher

__all__ = ["DataService", "data_service", "dispatcher_for", "reserve_dispatcher"]

_log = logging.getLogger(__name__)
_POLL_SECS = 0.05


class DataService:
    """A running tf.data service: the dispatcher in this process, one ``WorkerServer`` per executor.

    Made by :func:`data_service`; a context manager that stops every server when the block ends.

    Examples
    --------
    >>> with tfonspark.data_service(sc, num_workers=2) as svc:  # doctest: +SKIP
    ...     ds = svc.distribute(tf.data.Dataset.range(10), job_name="train")
    """

    def __init__(self, cluster: Cluster | None, dispatcher: Any, target: str, worker_addresses: list[str]) -> None:
        """Made by :func:`data_service`, once the workers and the dispatcher run."""
        #: the workers' :class:`~tfonspark.Cluster` (``cluster_info``, ``reports``); None where they
        #: run in a training cluster's nodes (:func:`dispatcher_for`)
        self.cluster = cluster
        self.dispatcher = dispatcher  #: TF's ``DispatchServer``, in this process
        self.target = target  #: ``"grpc://host:port"`` of the dispatcher
        self.worker_addresses = worker_addresses  #: ``["host:port", ...]`` of the workers, by task index
        self._stopped = False

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
        hanging (:func:`tfonspark.tfprocess.data_worker.watched` with this cluster's failures).

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
        cluster = self.cluster
        return watched(dataset, cluster.server.failures if cluster else list, poll_secs)

    def shutdown(self, grace_secs: float = 2.0) -> None:
        """Stop every worker (SIGTERM, SIGKILL after ``grace_secs``), then the dispatcher; idempotent.

        Raises NodeFailed if a worker had failed before (after stopping everything).

        Parameters
        ----------
        grace_secs : float
            How long each worker's TF process gets between SIGTERM and SIGKILL.

        Examples
        --------
        >>> svc.shutdown()  # doctest: +SKIP
        """
        if self._stopped:
            return
        self._stopped = True
        started = time.monotonic()
        try:
            if self.cluster is not None:
                self.cluster.stop(grace_secs)
        finally:
            self.dispatcher.stop()
            _log.info("tf.data service stopped in %.1fs", time.monotonic() - started)

    def __enter__(self) -> DataService:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.shutdown()
        except Exception as error:
            if exc is None:
                raise
            # the block's own error is the one to see; a worker failure behind it is logged
            _log.warning("while stopping the tf.data service after %r: %s", exc, error)


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
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise ConfigError(f"data_service needs num_workers >= 1. Received: {num_workers!r}")
    chosen = (settings or Settings()).merged(setting_keywords)
    options = ClusterOptions(input_mode=InputMode.TENSORFLOW, reservation_timeout=reservation_timeout)
    handover, address = reserve_dispatcher(sc)
    args = DataWorkerArgs(address, heartbeat_interval_ms, wait_secs=float(reservation_timeout))
    try:
        # the dispatcher as a driver-held task: a serve-only node, so its supervisor restarts a killed
        # WorkerServer in place at the same address (the dispatcher's worker list stays right)
        tasks = {"dispatcher": [address]}
        plan = prepare(
            sc, None, args, num_workers, options, chosen, program="data_worker", launcher=launcher, driver_tasks=tasks
        )
        cluster = plan.start(Cluster)
    except ReservationTimeout as error:
        handover.release()
        raise _named(error, num_workers) from error
    except BaseException:
        handover.release()
        raise
    try:
        return _serve(cluster, handover, address, _Dispatch(work_dir, worker_timeout_ms), float(reservation_timeout))
    finally:
        handover.release()  # no-op once the dispatcher took the port


def reserve_dispatcher(sc: SparkContext) -> tuple[PortHandover, str]:
    """The dispatcher's port, reserved here until its server binds it, and its ``host:port`` for executors.

    Examples
    --------
    >>> handover, address = reserve_dispatcher(sc)  # doctest: +SKIP
    """
    handover = PortHandover(reserve_port())
    return handover, chief_address(driver_host(sc), handover.port)


def dispatcher_for(handover: PortHandover, address: str, workers: list[str]) -> DataService:
    """A service whose workers run elsewhere (the TF nodes): its dispatcher, told ``workers``' addresses.

    Starts the ``DispatchServer`` on ``handover``'s port (:func:`reserve_dispatcher`); its
    ``shutdown()`` stops the dispatcher only.

    Examples
    --------
    >>> svc = dispatcher_for(handover, address, ["10.0.0.5:41234"])  # doctest: +SKIP
    """
    try:
        dispatcher = _dispatcher(handover, workers, _Dispatch())
    finally:
        handover.release()
    return DataService(None, dispatcher, f"grpc://{address}", list(workers))


@dataclass(frozen=True)
class _Dispatch:
    """The dispatcher's own options: its journal and how long it waits for a silent worker."""

    work_dir: str | None = None
    worker_timeout_ms: int | None = None


def _serve(cluster: Cluster, handover: PortHandover, address: str, opts: _Dispatch, timeout: float) -> DataService:
    """Start the dispatcher for ``cluster``'s workers and wait until each has registered."""
    started = time.monotonic()
    spec = cluster.server.cluster_spec
    workers = list(spec["worker"]) if spec else []
    try:
        dispatcher = _dispatcher(handover, workers, opts)
    except BaseException:
        cluster.stop(grace_secs=0)
        raise
    svc = DataService(cluster, dispatcher, f"grpc://{address}", workers)
    try:
        wait_for_servers({"worker": workers}, timeout, cluster.server.failures)
        _wait_registered(cluster, len(workers), started + timeout)
    except BaseException:
        svc.shutdown(grace_secs=0)
        raise
    if cluster.server.failures():
        svc.shutdown(grace_secs=0)  # raises NodeFailed naming the worker
        raise ClusterError("a tf.data worker failed while the service started")
    _log.info("tf.data service up in %.1fs: %s, workers %s", time.monotonic() - started, svc.target, workers)
    return svc


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


def _wait_registered(cluster: Cluster, count: int, deadline: float) -> None:
    """Wait until ``count`` workers reported their registration with the dispatcher."""
    while not cluster.server.failures():
        done = {r.index for r in cluster.reports if REGISTERED in r.metrics}
        if len(done) >= count:
            return
        if time.monotonic() > deadline:
            raise ReservationTimeout(
                f"only {len(done)} of {count} tf.data workers registered with the dispatcher in time "
                "(raise reservation_timeout, or check the executor logs)",
                registered=len(done),
                required=count,
            )
        time.sleep(_POLL_SECS)


def _named(error: ReservationTimeout, num_workers: int) -> ReservationTimeout:
    """``error`` saying which ``data_service`` call needed the slots."""
    return ReservationTimeout(
        f"data_service(num_workers={num_workers}, each its own Spark task slot): {error}",
        registered=error.registered,
        required=error.required,
    )
