"""The driver's view of one TensorFlow cluster: start it, feed it, watch it, shut it down."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..config import InputMode, NodeConfig
from ..errors import ConfigError, FeedError, FeedTimeout, NodeFailed, ReservationTimeout, ShutdownTimeout
from ..executor.feeder import FeedTarget
from ..wire import messages as m
from ..wire.errors import reraise, summary
from .feeding import Feeds
from .launcher import Launcher, LaunchHandle, LocalLauncher, SparkLauncher
from .plan import DATA_ROLES, NodeRole
from .rendezvous import NodeState, RendezvousServer
from .reports import Report, ReportLog
from .stopping import StopFile, write_stop_file
from .streaming import Streams, is_dstream, is_streaming_df

__all__ = ["SPARK_SETTINGS", "Cluster"]

log = logging.getLogger(__name__)
_TAIL_LINES = 40
_SETTLE_SECS = 1.0  # how long other nodes get to report their own failure
SPARK_SETTINGS = (
    "spark.executor.instances, spark.executor.cores, spark.cores.max, spark.task.cpus (or the N in local[N])"
)


def _describe_exit(node: NodeState) -> tuple[str, int | None, str]:
    """How one node failed (``"was killed by signal 9 (SIGKILL)"``), its exit code and output tail."""
    if node.lost:
        return f"was lost: {node.lost}", None, ""
    assert node.exit is not None
    code = node.exit.exit_code
    if code < 0:
        try:
            how = f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"failed with exit code {code}"
    tail = node.exit.traceback.strip() or node.exit.output_tail.strip()
    return how, code, "\n".join(tail.splitlines()[-_TAIL_LINES:])


def node_failed(failed: list[NodeState]) -> NodeFailed:
    """The error the driver raises for failed nodes: every one by role, index and output tail.

    ``role``/``index``/``exit_code``/``traceback`` describe the first failure (a node that exited
    before one that was lost, then by executor id); ``failures`` holds all of them.
    """
    ordered = sorted(failed, key=lambda n: (n.exit is None, n.role.executor_id))
    described = [(n, *_describe_exit(n)) for n in ordered]
    first, how, code, tail = described[0]
    where = f"TensorFlow node {first.role.name} (executor {first.role.executor_id})"
    message = f"{where} {how}"
    if len(described) > 1:
        others = "; ".join(f"{n.role.name} {h}" for n, h, _, _ in described[1:])
        message += f" (and {len(described) - 1} more: {others})"
    failures = {n.role.name: t or h for n, h, _, t in described}
    return NodeFailed(
        message,
        role=first.role.job_name,
        index=first.role.task_index,
        exit_code=code,
        traceback=tail,
        failures=failures,
    )


class Cluster:
    """A running TensorFlow cluster on Spark executors (TFoS ``TFCluster``).

    It owns the rendezvous server (who the nodes are, how they are doing), the feed jobs
    (:class:`~tfonspark.driver.feeding.Feeds`), the node reports and the :class:`Launcher`
    that started the node supervisors.
    """

    def __init__(
        self,
        sc: Any,
        roles: list[NodeRole],
        server: RendezvousServer,
        config: NodeConfig,
        input_mode: InputMode,
        reports: ReportLog | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        self.sc = sc
        self.roles = roles
        self.server = server
        self.config = config
        self.input_mode = input_mode
        self.cluster_id = config.cluster_id
        self.cluster_info: list[dict[str, Any]] = []
        self.launcher = launcher or SparkLauncher(sc, barrier=False)
        self.launches: list[LaunchHandle] = []
        self.feeds = Feeds(sc, config.secret_hex, self)
        self.report_log = reports or ReportLog()
        self.streams = Streams(self.feeds, self, label=self.cluster_id[:8])
        self.failure: NodeFailed | None = None  # the node failure that tore the cluster down
        self._stop_files: list[str] = []
        self._closed = False
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="tfos-watch")

    # ---- what the feed jobs see of the nodes (feeding.FeedNodes) ---------------------------
    def targets(self) -> list[FeedTarget]:
        """The data nodes that take data now."""
        out = []
        for node in self.server.nodes.values():
            up = node.up
            if node.role.job_name in DATA_ROLES and up is not None and up.data_port and not node.finished:
                out.append(FeedTarget(node.role.name, node.executor_key, up.data_host, up.data_port, up.data_path))
        return out

    def all_done(self) -> bool:
        """True once no data node takes data any more (each terminated its feed or exited cleanly)."""
        return all(n.finished for n in self.server.nodes.values() if n.role.job_name in DATA_ROLES)

    # ---- failure handling ------------------------------------------------------------------
    def _watch(self) -> None:
        """Follow node events; on a node failure or a stalled feed, cancel the feed jobs at once."""
        seen = 0
        while True:
            self.server.wait_for(functools.partial(self._new_events, seen), None)
            events = self.server.events_since(seen)
            seen += len(events)
            for node, event in events:
                self._on_event(node, event)
            if self.server.failures() or self._closed or self.server.closed:
                break
        if self.server.failures():
            self.feeds.cancel()

    def _new_events(self, seen: int, nodes: Iterable[NodeState]) -> bool:
        return self._closed or len(self.server.events) > seen

    def _on_event(self, node: NodeState, event: m.NodeEvent) -> None:
        if event.kind == "report" and isinstance(event.detail, dict):
            self.report_log.add(node.role.job_name, node.role.task_index, event.detail)
        elif event.kind == "feed_stalled":
            self._on_stall(node, event.detail)
        else:
            log.info("node %s reported %s: %s", node.role.name, event.kind, event.detail)

    def _on_stall(self, node: NodeState, detail: dict[str, Any]) -> None:
        error = FeedTimeout(
            f"partition {detail.get('partition')}: its feeder sent nothing to node {node.role.name} "
            f"for feed_timeout={float(detail.get('timeout', 0)):.0f}s after {detail.get('received', 0)} "
            "rows (a stalled Spark task or executor); the feed was cancelled. Raise feed_timeout if "
            "computing a partition's rows can take longer."
        )
        log.warning("%s", error)
        self.feeds.stalled(str(detail.get("feed_id", "")), bool(detail.get("train", True)), error)

    def check(self) -> None:
        """Raise NodeFailed (after tearing the cluster down) naming every node that has failed."""
        failed = self.server.failures()
        if failed:
            # nodes often fail together (one bad input, a lost peer): give the others a moment to
            # report, so the error names all of them and not only the fastest
            if not self._closed:
                self.server.wait_for(lambda nodes: all(n.finished for n in nodes), _SETTLE_SECS, until_failure=False)
            failed = self.server.failures() or failed
            self._teardown(grace_secs=0)
            self.failure = error = node_failed(failed)
            raise error

    def _launch_error(self) -> BaseException | None:
        return next((h.error for h in self.launches if h.done.is_set() and h.error is not None), None)

    # ---- start-up --------------------------------------------------------------------------
    def _await(self, what: str, predicate: Callable[[Iterable[NodeState]], bool], timeout: float) -> None:
        ok = self.server.wait_for(lambda nodes: predicate(nodes) or self._launch_error() is not None, timeout)
        self.check()
        error = self._launch_error()
        if error is not None and not predicate(self.server.nodes.values()):
            self._teardown(grace_secs=0)
            reraise(error)
            raise NodeFailed(f"starting the TensorFlow nodes failed before {what}: {summary(error)}") from error
        if not ok:
            registered = self.server.registered()
            self._teardown(grace_secs=0)
            raise ReservationTimeout(
                f"{what}: {registered} of {len(self.roles)} TensorFlow nodes registered within "
                f"{timeout:.0f}s. Each node needs its own Spark task slot; check {SPARK_SETTINGS}, "
                "that dynamic allocation can reach that many executors, or raise reservation_timeout.",
                registered=registered,
                required=len(self.roles),
            )

    def _start(self, payload: bytes) -> None:
        self._watcher.start()
        on_driver = [r.executor_id for r in self.roles if r.on_driver]
        if on_driver:  # driver-side ps nodes: supervisors started from here, waited for until they exit
            self.launches.append(
                LocalLauncher(wait_for_exit=True).launch(self.config, payload, on_driver, self.server.notify)
            )
        on_spark = [r.executor_id for r in self.roles if not r.on_driver]
        self.launches.append(self.launcher.launch(self.config, payload, on_spark, self.server.notify))
        timeout = self.config.reservation_timeout
        self._await("reservation", lambda nodes: all(n.address for n in nodes), timeout)
        self._await("start-up", lambda nodes: all(n.up or n.finished for n in nodes), timeout)
        self.cluster_info = [self._info(n) for n in self.server.nodes.values()]

    @staticmethod
    def _info(node: NodeState) -> dict[str, Any]:
        up = node.up
        return {
            "executor_id": node.role.executor_id,
            "job_name": node.role.job_name,
            "task_index": node.role.task_index,
            "address": node.address,
            "executor_key": node.executor_key,
            "data_address": (up.data_host, up.data_port) if up and up.data_port else None,
            "tb_url": up.tensorboard_url if up else "",
        }

    # ---- public API ------------------------------------------------------------------------
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

        Returns the number of rows the nodes received for an RDD/DataFrame (less than fed if a
        node terminated). A DStream (TFoS) is fed micro-batch by micro-batch (``foreachRDD``) once
        its StreamingContext starts, and returns None; a streaming DataFrame starts a query that
        feeds each micro-batch (``foreachBatch``; ``trigger``, ``checkpoint_location`` and
        ``query_name`` configure it) and returns its ``StreamingQuery``. Streams are stopped by
        ``shutdown(ssc_or_query)``.
        """
        self._require_spark_mode("train")
        self.check()
        options = {"trigger": trigger, "checkpoint_location": checkpoint_location, "query_name": query_name}
        if is_dstream(data) or is_streaming_df(data):
            if num_epochs != 1:
                raise ConfigError(
                    f"a stream is fed once, as it arrives: num_epochs must be 1. Received: {num_epochs!r}"
                )
            return self.streams.train(data, feed_timeout, qname, options)
        given = sorted(k for k, v in options.items() if v is not None)
        if given:
            raise ConfigError(f"{', '.join(given)} apply to a streaming DataFrame. Received: {type(data).__name__}")
        return self.feeds.train(data, num_epochs, feed_timeout, qname, label=self.cluster_id[:8])

    def inference(self, data: Any, feed_timeout: float = 600, qname: str = "input", output_schema: Any = None) -> Any:
        """Feed ``data`` to the nodes and return one result per input row, lazily.

        An RDD for an RDD, a DataFrame for a DataFrame, a DStream for a DStream and a streaming
        DataFrame for a streaming DataFrame (``output_schema`` required: pick its sink and
        checkpoint location yourself).
        """
        self._require_spark_mode("inference")
        self.check()
        if is_dstream(data) or is_streaming_df(data):
            return self.streams.inference(data, feed_timeout, qname, output_schema)
        return self.feeds.inference(data, feed_timeout, qname, output_schema)

    def request_stop(self, reason: str = "request_stop() on the driver") -> None:
        """Ask the cluster's streams to stop, as a stop request from outside does (see write_stop_file)."""
        self.server.request_stop(reason)

    def write_stop_file(self, path: str | os.PathLike[str] | None = None) -> str:
        """Write a stop file (address, cluster id, secret; mode 0600) and return its path.

        Whoever can read it can stop this cluster's streams from any machine that reaches the
        driver: ``python -m tfonspark.stop FILE`` or ``tfonspark.request_stop(FILE)``. It is
        removed when the cluster shuts down. ``path`` None: a new file in the temp directory.
        """
        host, port = self.server.address
        written = write_stop_file(path, StopFile(host, port, self.cluster_id, self.server.secret))
        self._stop_files.append(written)
        log.info("to stop this cluster's streams: python -m tfonspark.stop %s", written)
        return written

    def stop_condition(self, timeout: float) -> tuple[str, bool]:
        """Why the streams must stop now, and whether gracefully; waits up to ``timeout`` for one."""
        server = self.server
        self.server.wait_for(lambda nodes: bool(server.stop_reason) or self._closed or self.all_done(), timeout)
        failed = server.failures()
        if failed:
            return f"TensorFlow node {failed[0].role.name} failed", False
        if self._closed or server.closed:
            return "the cluster was shut down", False
        if server.stop_reason:
            return f"stop requested: {server.stop_reason}", True
        if self.all_done():
            return "every data node has finished", True
        return "", True

    def _require_spark_mode(self, what: str) -> None:
        if self.input_mode != InputMode.SPARK:
            raise ConfigError(
                f"{what}() feeds Spark data and needs input_mode=InputMode.SPARK. "
                f"Received: input_mode={InputMode(self.input_mode).name}"
            )

    @property
    def reports(self) -> list[Report]:
        """Every ``ctx.report({...})`` the nodes made (the last 10,000), oldest first."""
        return self.report_log.all()

    def tensorboard_url(self) -> str | None:
        """The TensorBoard URL of the chief (or worker 0), if ``tensorboard=True``."""
        for node in self.server.nodes.values():
            if node.up is not None and node.up.tensorboard_url:
                return node.up.tensorboard_url
        return None

    def shutdown(self, ssc: Any = None, grace_secs: float = 0, timeout: float = 259200) -> None:
        """Stop the streams, end the feed, wait for the chief/workers to finish, stop ps/evaluator nodes.

        ``ssc`` (a StreamingContext or a StreamingQuery) is waited for, as in TFoS: until every
        data node has finished, a stop is requested (``request_stop``, ``python -m
        tfonspark.stop``), a node fails or the stream ends by itself; then every stream of the
        cluster is stopped gracefully (the running micro-batch completes). Without ``ssc`` the
        cluster's streams are stopped at once. ``grace_secs`` is how long ps/evaluator nodes get
        to exit after SIGTERM before SIGKILL.

        Raises NodeFailed if any node failed, ShutdownTimeout if streams or workers are still
        running after ``timeout`` seconds (they are stopped either way), and the error a stream
        ended with.
        """
        deadline = time.monotonic() + (timeout if timeout and timeout > 0 else 1e9)
        if self._closed:
            self.streams.join(30)
            if ssc is not None and self.failure is not None:
                raise self.failure  # the stream's node failure, torn down while feeding a micro-batch
            return
        in_time, stream_error = self.streams.finish(ssc, max(deadline - time.monotonic(), 0))
        self.check()
        if not in_time:
            self._teardown(grace_secs=0)
            self.streams.join(30)
            raise ShutdownTimeout(
                f"the stream was still running after timeout={timeout}s; it and the TensorFlow nodes have "
                "been stopped. Request a stop (cluster.request_stop(), python -m tfonspark.stop) or raise "
                "shutdown(timeout=...)."
            )
        if self.input_mode == InputMode.SPARK:
            self.feeds.close()
        trainers = lambda nodes: all(n.finished for n in nodes if n.role.job_name in DATA_ROLES)  # noqa: E731
        done = self.server.wait_for(trainers, max(deadline - time.monotonic(), 0))
        self.check()
        if not done:
            self._teardown(grace_secs=0)
            raise ShutdownTimeout(
                f"TensorFlow workers were still running after timeout={timeout}s; "
                "they have been stopped. Raise shutdown(timeout=...) if training "
                "needs longer."
            )
        # every chief/worker has exited, so there is nothing left to wait for: grace_secs is the
        # time ps/evaluator nodes get between SIGTERM and SIGKILL (TFoS slept it unconditionally)
        self.check()
        self._teardown(grace_secs=max(grace_secs, 2.0))
        self.streams.join(30)
        if stream_error is not None:
            reraise(stream_error)
            raise FeedError(f"the stream ended with an error: {summary(stream_error)}") from stream_error

    def _teardown(self, grace_secs: float) -> None:
        """Stop every node, wait for their supervisors, cancel jobs, close the server."""
        if self._closed:
            return
        self._closed = True
        for node in self.server.nodes.values():
            self.server.stop_node(node, grace_secs)
        self.server.wait_for(lambda nodes: all(n.finished or not n.address for n in nodes), grace_secs + 15)
        self.feeds.cancel()
        # a lost node's task may never return (its supervisor is frozen or its host gone):
        # then there is nothing to wait for, and the node job is cancelled at once
        lost = any(n.lost for n in self.server.nodes.values())
        for launch in self.launches:
            if lost or not launch.join(10):
                launch.cancel()
                launch.join(10)
        self.server.close()  # also wakes the streams' watcher, which stops them
        for path in self._stop_files:
            with contextlib.suppress(OSError):
                os.unlink(path)
        # the watcher hands out the last reports and events before it ends: once shutdown()
        # returns, every report a node made is in cluster.reports and has reached on_report
        if self._watcher.is_alive() and threading.current_thread() is not self._watcher:
            self._watcher.join(10)
