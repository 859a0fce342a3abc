"""Clusters whose nodes only serve: one start (:func:`start_serving`) and one handle (:class:`ServingCluster`).

:func:`tfonspark.ps_cluster` and :func:`tfonspark.data_service` are two uses of the same script.
Their nodes run no user code (a TF server, a tf.data worker: the ``ps`` and ``data_worker`` rows
of :mod:`tfonspark.driver.programs`), and the driver holds one task of every node's cluster spec
itself (the coordinator's ``chief``, the ``dispatcher``). So a start:

1. prepares the nodes the usual way (:func:`tfonspark.driver.plan.prepare`);
2. starts them holding that task (``plan.start(..., hold="chief")``: its port reserved, bound,
   not listening, so nobody else takes it until the driver's own server binds it;
   :func:`tfonspark.driver.plan.reserve_task`), and hands the running nodes to the handle;
3. waits until every server listens (:meth:`ServingCluster.wait_serving`), stopping everything
   if they do not; a ReservationTimeout names the call that needed the slots.

The handle is a :class:`~tfonspark.driver.cluster.ClusterHandle` itself (``reports``,
``cluster_info``, ``server_restarts``, ``stop``), a context manager whose ``shutdown`` stops the
nodes and then what the driver holds (the reserved port; the dispatcher).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from ...errors import ConfigError, NodeFailed, ReservationTimeout
from ..cluster import ClusterHandle, Reserved, Running
from ..options import ClusterOptions
from ..plan import prepare
from ..programs import ProgramKind

if TYPE_CHECKING:
    from typing import Self

    from pyspark import SparkContext

    from ...settings import Settings
    from ..nodes.launcher import Launcher

__all__ = ["ServeOnly", "ServingCluster", "check_count", "start_serving"]

_log = logging.getLogger(__name__)
_H = TypeVar("_H", bound="ServingCluster")


def check_count(call: str, name: str, value: object, why: str = "") -> None:
    """``value`` of ``call``'s ``name`` must be a whole number >= 1 (``why``: for what)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{call} needs {name} >= 1{why}. Received: {value!r}")


@dataclass(frozen=True)
class ServeOnly:
    """One serve-only start: what its ``nodes`` run, the driver's own task, how errors name the call."""

    call: str  #: ``ps_cluster(num_workers=2, num_ps=1, each its own Spark task slot)``
    program: ProgramKind
    nodes: int
    options: ClusterOptions
    task: str  #: the job of the driver's own task in every spec: ``chief``, ``dispatcher``
    hand_over: bool = False  #: see :func:`~tfonspark.driver.plan.reserve_task`
    fn: Callable[[Any, Any], Any] | None = None  #: the user's function (the evaluator), if any
    tf_args: Any = None


def start_serving(
    sc: SparkContext,
    job: ServeOnly,
    chosen: Settings,
    launcher: Launcher | None,
    handle: Callable[[Running], _H],
) -> _H:
    """Start ``job``'s nodes, the driver's task reserved in every spec; the handle, once every server listens.

    Whatever fails releases the port and stops what had started; a ReservationTimeout names
    ``job.call``.
    """
    started = time.monotonic()
    plan = prepare(sc, job.fn, job.tf_args, job.nodes, job.options, chosen, program=job.program, launcher=launcher)
    try:
        served = plan.start(handle, hold=job.task, hand_over=job.hand_over)  # its port: released if it fails
    except ReservationTimeout as error:
        raise ReservationTimeout(
            f"{job.call}: {error}", registered=error.registered, required=error.required
        ) from error
    try:
        served.wait_serving(float(job.options.reservation_timeout))
    except BaseException:
        served.shutdown(grace_secs=0)
        raise
    _log.info("%s up in %.1fs: %s", served.what, time.monotonic() - started, served.summary())
    return served


class ServingCluster(ClusterHandle):
    """A running cluster whose nodes only serve, the driver holding one task of its spec (:attr:`reserved`).

    A context manager: leaving the block stops every node, then what the driver holds.

    Examples
    --------
    >>> with tfonspark.ps_cluster(sc, num_workers=2, num_ps=1) as cluster:  # doctest: +SKIP
    ...     print(cluster.cluster_spec, cluster.reports)
    """

    what = "serve-only cluster"  #: for log lines: "parameter-server cluster", "tf.data service"
    #: a NodeFailed at the block's end is the cause of the block's error (a dead ps behind TF's
    #: ``UnavailableError``) and is raised from it; otherwise it is logged behind the block's error
    failure_causes_block_error = False

    def __init__(self, running: Running) -> None:
        """Made by :func:`start_serving`, once the nodes are up."""
        super().__init__(running)
        assert running.held is not None  # start_serving holds the driver's task
        self.reserved: Reserved = running.held
        self._stopped = False

    @property
    def cluster(self) -> Self:
        """This handle itself: code written when the handle wrapped a ``Cluster`` reads ``svc.cluster.reports``."""
        return self

    @property
    def cluster_spec(self) -> dict[str, list[str]]:
        """``{"chief": [driver], "ps": [...], "worker": [...]}``: what every node's ``TF_CONFIG`` has."""
        return self._attempts.gang.cluster_spec()

    def wait_serving(self, timeout: float) -> None:
        """Wait until every node's server listens (:func:`start_serving` calls it once; again, it returns at once).

        Parameters
        ----------
        timeout : float
            Seconds to wait before a ReservationTimeout names the servers that do not listen.

        Examples
        --------
        >>> cluster.wait_serving(60)  # doctest: +SKIP
        """

    def summary(self) -> str:
        """What the "up" log line says of the cluster: its spec.

        Examples
        --------
        >>> cluster.summary()  # doctest: +SKIP
        "{'chief': ['10.0.0.1:4321'], 'ps': ['10.0.0.2:2222'], 'worker': ['10.0.0.3:2222']}"
        """
        return str(self.cluster_spec)

    def shutdown(self, grace_secs: float = 2.0) -> None:
        """Stop every node's server (SIGTERM, then SIGKILL after ``grace_secs``), then what the driver holds.

        Raises NodeFailed if a node had failed before (after stopping everything). A second call
        does nothing.

        Parameters
        ----------
        grace_secs : float
            How long each node's TF process gets between SIGTERM and SIGKILL.

        Examples
        --------
        >>> cluster.shutdown()  # doctest: +SKIP
        """
        if self._stopped:
            return
        self._stopped = True
        started = time.monotonic()
        try:
            self.stop(grace_secs)
        finally:
            self._close()
            _log.info("%s stopped in %.1fs", self.what, time.monotonic() - started)

    def _close(self) -> None:
        """After the nodes: free what the driver holds (the reserved port: a no-op once its server took it)."""
        self.reserved.release()

    def _explain(self, exc: BaseException) -> None:
        """Add what helps to the error that leaves the block (a hint), before the nodes stop."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.shutdown()
            return
        self._explain(exc)
        try:
            self.shutdown()
        except NodeFailed as failed:
            if self.failure_causes_block_error and isinstance(exc, Exception):  # not KeyboardInterrupt
                raise failed from exc
            _log.warning("while stopping the %s after %r: %s", self.what, exc, failed)
        except Exception as error:  # the block's own error is the one to see
            _log.warning("while stopping the %s after %r: %s", self.what, exc, error)
