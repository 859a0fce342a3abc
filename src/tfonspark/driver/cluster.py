"""The handles on a running cluster: :class:`Cluster` (TFoS ``TFCluster``): feed it, watch it, shut it down.

:meth:`tfonspark.driver.plan.Plan.start` wires a started cluster's parts once (:class:`Running`)
and hands them to a handle. :class:`ClusterHandle` is what every handle offers (the nodes, their
reports and restarts, the failure, ``stop``); :class:`Cluster` adds ``run()``'s feeding and
``shutdown``, the serve-only handles (:mod:`tfonspark.driver.services.serving`) their servers.
Collaborators do the work: the running :class:`~tfonspark.driver.nodes.gang.Gang` (the control
plane: nodes, server, watcher), :class:`~tfonspark.driver.nodes.restarts.Attempts`,
:class:`~tfonspark.driver.feeds.feeding.Feeds` and :class:`~tfonspark.driver.feeds.streaming.Streams`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import InputMode
from ..errors import ConfigError, NodeFailed
from ..ports import PortHandover
from .ending import finish, stop_now
from .feeds.epochs import train_epochs
from .feeds.feeding import Feeds
from .feeds.streaming import Streams, is_dstream, is_streaming_df
from .nodes.node_events import ServerRestart
from .nodes.rendezvous import RendezvousServer
from .nodes.reports import Report, ReportLog
from .nodes.restarts import Attempts, Restart
from .nodes.stopping import write_stop_file

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = ["Cluster", "ClusterHandle", "Reserved", "Running"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reserved:
    """A task of every node's spec that the driver holds itself (``ps_cluster``'s ``chief``, the
    ``dispatcher``): its port, reserved (bound, not listening: :mod:`tfonspark.ports`) until the
    driver's own server binds it. :func:`tfonspark.driver.plan.reserve_task` makes one."""

    task: str
    handover: PortHandover
    address: str  #: ``host:port`` executors reach

    def release(self) -> None:
        """Free the port (idempotent; a no-op once the driver's server took it)."""
        self.handover.release()


@dataclass(frozen=True)
class Running:
    """A started cluster's parts, as :meth:`~tfonspark.driver.plan.Plan.start` wired them: what a handle holds.

    ``on_end()`` runs once after the nodes stop, also on errors (``run(data_service=N)``'s service);
    ``held`` is the task of every spec the driver holds itself, if any (``ps_cluster``'s chief).
    """

    sc: SparkContext
    input_mode: InputMode
    attempts: Attempts
    feeds: Feeds
    streams: Streams
    reports: ReportLog
    on_end: Callable[[], None] | None = None
    held: Reserved | None = None


class ClusterHandle:
    """What every handle on a running cluster offers: its nodes, their reports and restarts, ``stop``.

    ``sc``, ``cluster_id``, ``input_mode`` and ``cluster_info`` are TFoS's attributes.

    Examples
    --------
    >>> cluster = prepare(sc, main_fun, args, 2, ClusterOptions(), Settings()).start(Cluster)  # doctest: +SKIP
    >>> cluster.reports, cluster.server_restarts  # doctest: +SKIP
    """

    def __init__(self, running: Running) -> None:
        """Made by :meth:`~tfonspark.driver.plan.Plan.start`, once the nodes are up."""
        self.sc = running.sc
        self.input_mode = running.input_mode
        self.cluster_id = running.attempts.gang.config.cluster_id
        self._attempts, self._feeds, self._streams = running.attempts, running.feeds, running.streams
        self._reports = running.reports
        self._on_end = running.on_end

    # ---- state ---------------------------------------------------------------------------------
    @property
    def cluster_info(self) -> list[dict[str, Any]]:
        """One dict per node (TFoS): ``job_name``, ``task_index``, ``address``, ``gpus``, e.g. ``cluster.cluster_info[0]``."""
        return self._attempts.gang.cluster_info

    @property
    def failure(self) -> NodeFailed | None:
        """The node failure that tore the cluster down, if any: ``if cluster.failure: ...``."""
        return self._attempts.failure

    @property
    def restarts(self) -> int:
        """How many times the cluster was restarted after a node failure: ``cluster.restarts == 1``."""
        return len(self._attempts.log)

    @property
    def restart_log(self) -> list[Restart]:
        """One :class:`Restart` per restart, oldest first: ``cluster.restart_log[0].cause``."""
        return self._attempts.log

    @property
    def server_restarts(self) -> list[ServerRestart]:
        """Workers' TF servers restarted in place (docs/ps.md), oldest first: ``server_restarts[0].down_s``."""
        return list(self._attempts.gang.server_restarts)

    @property
    def attempt(self) -> int:
        """The running attempt: 0 until the first restart (the nodes' ``ctx.attempt``), e.g. ``cluster.attempt``."""
        return self._attempts.gang.config.attempt

    @property
    def reports(self) -> list[Report]:
        """The ``ctx.report({...})`` calls the nodes made, oldest first: the last 10,000
        (``reports.KEEP_REPORTS``), fewer where they hold over 32 MiB as JSON (``KEEP_BYTES``).

        Examples
        --------
        >>> [r.metrics["loss"] for r in cluster.reports if r.node == "worker:0"]
        """
        return self._reports.all()

    # ---- stopping ------------------------------------------------------------------------------
    def stop(self, grace_secs: float = 2.0) -> None:
        """Stop every node now, without waiting for the chief/workers to finish (no restart).

        For clusters whose nodes only serve (:func:`tfonspark.ps_cluster`). Raises NodeFailed,
        after stopping the rest, if a node had failed before.

        Parameters
        ----------
        grace_secs
            How long each node's TF process gets to exit after SIGTERM before SIGKILL.

        Examples
        --------
        >>> cluster.stop(grace_secs=5)
        """
        try:
            stop_now(self._attempts, self._streams, grace_secs)
        finally:
            self._end()

    def _end(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end()


class Cluster(ClusterHandle):
    """A running TensorFlow cluster on Spark executors (TFoS ``TFCluster``), made by :func:`tfonspark.run`.

    ``sc``, ``cluster_id``, ``input_mode``, ``cluster_info`` and ``server`` are TFoS's attributes.

    Examples
    --------
    >>> cluster = tfonspark.run(sc, main_fun, args, num_executors=2, input_mode=InputMode.SPARK)
    >>> cluster.train(rdd, num_epochs=2)
    >>> cluster.shutdown()
    """

    @property
    def server(self) -> RendezvousServer:
        """The running attempt's rendezvous server (TFoS ``TFCluster.server``), e.g. ``cluster.server.address``."""
        return self._attempts.gang.server

    # ---- feeding -------------------------------------------------------------------------------
    def train(
        self,
        data: Any,
        num_epochs: int = 1,
        feed_timeout: float = 600,
        qname: str = "input",
        *,
        trigger: str | dict[str, Any] | None = None,
        checkpoint_location: str | None = None,
        query_name: str | None = None,
    ) -> Any:
        """Feed ``data`` to the nodes: an RDD or DataFrame for ``num_epochs`` epochs, or a stream.

        Parameters
        ----------
        data
            An RDD or DataFrame; a DStream (TFoS: fed micro-batch by micro-batch once its
            StreamingContext starts) or a streaming DataFrame (a query feeds each micro-batch).
        num_epochs
            How many times an RDD/DataFrame is fed (1 for a stream).
        feed_timeout
            Seconds a feed may make no progress before it fails with ``FeedTimeout``.
        qname
            The node's queue (``ctx.get_data_feed(qname=...)``).
        trigger, checkpoint_location, query_name
            The streaming DataFrame's query settings.

        Returns the number of rows the nodes received for an RDD/DataFrame (less than fed if a
        node terminated), None for a DStream, the ``StreamingQuery`` for a streaming DataFrame.
        Streams are stopped by ``shutdown(ssc_or_query)``.

        Examples
        --------
        >>> cluster.train(df.select("image", "label"), num_epochs=3)
        """
        self._require_spark_mode("train")
        self._attempts.gang.check()
        options = {"trigger": trigger, "checkpoint_location": checkpoint_location, "query_name": query_name}
        if is_dstream(data) or is_streaming_df(data):
            if num_epochs != 1:
                raise ConfigError(
                    f"a stream is fed once, as it arrives: num_epochs must be 1. Received: {num_epochs!r}"
                )
            return self._streams.train(data, feed_timeout, qname, options)
        given = sorted(k for k, v in options.items() if v is not None)
        if given:
            raise ConfigError(f"{', '.join(given)} apply to a streaming DataFrame. Received: {type(data).__name__}")
        label = self.cluster_id[:8]
        if self._attempts.max_restarts:
            read_wait = self._attempts.gang.config.epoch_end_timeout  # the epoch_end_timeout setting
            return train_epochs(self._attempts, self._feeds, data, num_epochs, feed_timeout, qname, label, read_wait)
        return self._feeds.train(data, num_epochs, feed_timeout, qname, label=label)

    def inference(self, data: Any, feed_timeout: float = 600, qname: str = "input", output_schema: Any = None) -> Any:
        """Feed ``data`` to the nodes and return one result per input row, lazily.

        Parameters
        ----------
        data
            An RDD (results: an RDD), a DataFrame (a DataFrame), a DStream (a DStream) or a
            streaming DataFrame (a streaming DataFrame: pick its sink and checkpoint yourself).
        feed_timeout
            Seconds a feed may make no progress before it fails with ``FeedTimeout``.
        qname
            The node's queue (``ctx.get_data_feed(qname=...)``).
        output_schema
            The results' Spark schema; required for a streaming DataFrame.

        Examples
        --------
        >>> predictions = cluster.inference(test_df).collect()
        """
        self._require_spark_mode("inference")
        self._attempts.gang.check()
        if is_dstream(data) or is_streaming_df(data):
            return self._streams.inference(data, feed_timeout, qname, output_schema)
        return self._feeds.inference(data, feed_timeout, qname, output_schema)

    def _require_spark_mode(self, what: str) -> None:
        if self.input_mode != InputMode.SPARK:
            raise ConfigError(
                f"{what}() feeds Spark data and needs input_mode=InputMode.SPARK. "
                f"Received: input_mode={InputMode(self.input_mode).name}"
            )

    # ---- stopping ------------------------------------------------------------------------------
    def request_stop(self, reason: str = "request_stop() on the driver") -> None:
        """Ask the cluster's streams to stop, as a stop request from outside does (see ``write_stop_file``).

        Parameters
        ----------
        reason
            Logged, and named when ``shutdown(ssc)`` stops the streams.

        Examples
        --------
        >>> cluster.request_stop("enough data")
        """
        self._attempts.gang.request_stop(reason)

    def write_stop_file(self, path: str | os.PathLike[str] | None = None) -> str:
        """Write a stop file (address, cluster id, secret; mode 0600) and return its path.

        Whoever can read it can stop this cluster's streams from any machine that reaches the
        driver: ``python -m tfonspark.stop FILE`` or ``tfonspark.request_stop(FILE)``. It is
        removed when the cluster shuts down.

        Parameters
        ----------
        path
            Where to write it; None: a new file in the temp directory.

        Examples
        --------
        >>> path = cluster.write_stop_file()
        """
        gang = self._attempts.gang
        written = write_stop_file(path, gang.stop_file())
        gang.remove_at_teardown(written)
        log.info("to stop this cluster's streams: python -m tfonspark.stop %s", written)
        return written

    def tensorboard_url(self) -> str | None:
        """The TensorBoard URL of the chief (or worker 0), if ``tensorboard=True``; else None.

        Examples
        --------
        >>> print(cluster.tensorboard_url())
        """
        return self._attempts.gang.tensorboard_url()

    def shutdown(self, ssc: Any = None, grace_secs: float = 0, timeout: float = 259200) -> None:
        """Stop the streams, end the feed, wait for the chief/workers to finish, stop ps/evaluator nodes.

        Raises NodeFailed if any node failed, ShutdownTimeout if streams or workers are still
        running after ``timeout`` seconds (they are stopped either way), and the error a stream
        ended with.

        Parameters
        ----------
        ssc
            A StreamingContext or StreamingQuery, waited for as in TFoS: until every data node
            has finished, a stop is requested, a node fails or the stream ends; then every stream
            of the cluster stops gracefully. None: the cluster's streams are stopped at once.
        grace_secs
            How long ps/evaluator nodes get to exit after SIGTERM before SIGKILL.
        timeout
            Seconds to wait for the streams and the workers (0 or less: no limit).

        Examples
        --------
        >>> cluster.shutdown(grace_secs=5)
        """
        try:
            finish(self._attempts, self._streams, self._close_feed, ssc, grace_secs, timeout)
        finally:
            self._end()

    def _close_feed(self) -> None:
        """End the feed (SPARK mode): the chief/workers' DataFeeds see its end."""
        if self.input_mode == InputMode.SPARK:
            self._feeds.close()
