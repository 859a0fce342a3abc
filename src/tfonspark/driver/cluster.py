"""The driver's view of one TensorFlow cluster: start it, feed it, watch it, shut it down."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ..config import InputMode, NodeConfig
from ..errors import ConfigError, FeedError, FeedTimeout, NodeFailed, ReservationTimeout, ShutdownTimeout
from ..executor.feeder import FeedTarget
from ..wire import messages as m
from ..wire.errors import reraise, summary
from .feeding import Feeds, check_num_epochs
from .launcher import Launcher, LaunchHandle, LocalLauncher, SparkLauncher
from .plan import DATA_ROLES, NodeRole
from .rendezvous import NodeState, RendezvousServer
from .reports import Report, ReportLog
from .restarts import Restart, check_max_restarts, exhausted, log_restart
from .stopping import StopFile, write_stop_file
from .streaming import Streams, is_dstream, is_streaming_df

__all__ = ["SPARK_SETTINGS", "Cluster", "Reform"]

log = logging.getLogger(__name__)
_TAIL_LINES = 40
_SETTLE_SECS = 1.0  # how long other nodes get to report their own failure
_T = TypeVar("_T")
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


#: makes the next attempt's rendezvous server and node config (a fresh port and secret, ``attempt`` n)
Reform = Callable[[int], "tuple[RendezvousServer, NodeConfig]"]


def node_failed(failed: list[NodeState]) -> NodeFailed:
    """The error the driver raises for failed nodes: every one by role, index and output tail.

    ``role``/``index``/``exit_code``/``traceback`` describe the first failure: the node the driver
    heard from first (a SIGKILLed worker, not the peer whose collective then broke), then by
    executor id; ``failures`` holds all of them.
    """
    ordered = sorted(failed, key=lambda n: (n.finished_at or float("inf"), n.exit is None, n.role.executor_id))
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
        *,
        max_restarts: int = 0,
        reform: Reform | None = None,
        reserve: Callable[[], None] | None = None,
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
        self.max_restarts = check_max_restarts(max_restarts)
        if self.max_restarts and reform is None:
            raise ConfigError("max_restarts > 0 needs a way to re-form the cluster (tfonspark.run passes one)")
        self.restart_log: list[Restart] = []  # one record per restart, oldest first
        self._reform = reform
        self._reserve = reserve  # waits for the executors a (barrier) node job needs
        self._causes: list[NodeFailed] = []  # each failed attempt's error, oldest first
        self._payload = b""
        self._seen_at = 0.0  # time.time() when check() saw the last failure
        self._teardown_s = 0.0  # how long tearing down after it took
        self._phases = (0.0, 0.0)  # the last start: seconds to every node registered, then up
        self._failed_at = 0.0  # time.time() when the first failed node of the last failure was seen
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
        return all(n.finished or n.feed_ended for n in self.server.nodes.values() if n.role.job_name in DATA_ROLES)

    # ---- failure handling ------------------------------------------------------------------
    def _watch(self) -> None:
        """Follow node events; on a node failure or a stalled feed, cancel the feed jobs at once."""
        server = self.server  # this attempt's server: a restart gives the next its own watcher
        while True:
            server.wait_for(functools.partial(self._new_events, server), None)
            for node, event in server.take_events():
                self._on_event(node, event)
            if server.failures() or self._closed or server.closed:
                break
        if server.failures():
            self.feeds.cancel()

    def _new_events(self, server: RendezvousServer, nodes: Iterable[NodeState]) -> bool:
        return self._closed or server.has_events()

    def _on_event(self, node: NodeState, event: m.NodeEvent) -> None:
        if event.kind == "report" and isinstance(event.detail, dict):
            self.report_log.add(node.role.job_name, node.role.task_index, event.detail)
        elif event.kind == "feed_stalled":
            self._on_stall(node, event.detail)
        elif event.kind in ("feed_terminated", "epoch_read"):
            pass  # the server keeps these as it records them: node.feed_ended, epochs_read() (_marks_read)
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
            if not self._closed:  # the first to see it: let the others report, tear down, time both
                # nodes often fail together (one bad input, a lost peer): give the others a moment
                # to report, so the error names all of them and not only the fastest
                self.server.wait_for(lambda nodes: all(n.finished for n in nodes), _SETTLE_SECS, until_failure=False)
                failed = self.server.failures() or failed
                self._seen_at = time.time()
                self._failed_at = min((n.finished_at for n in failed if n.finished_at), default=self._seen_at)
                started = time.monotonic()
                self._teardown(grace_secs=0)
                self._teardown_s = time.monotonic() - started
            self.failure = error = node_failed(failed)
            raise error

    def _launch_error(self) -> BaseException | None:
        return next((h.error for h in self.launches if h.done.is_set() and h.error is not None), None)

    # ---- restarts (max_restarts) -------------------------------------------------------------
    @property
    def restarts(self) -> int:
        """How many times the cluster was restarted after a node failure (see ``restart_log``)."""
        return len(self.restart_log)

    @property
    def attempt(self) -> int:
        """The running attempt: 0 until the first restart (the nodes' ``ctx.attempt``)."""
        return self.config.attempt

    def _attempts(self, action: Callable[[], _T]) -> _T:
        """``action()``; after a node failure, restart the cluster and call it again while restarts last."""
        while True:
            try:
                return action()
            except NodeFailed as error:
                self._restart(error)

    def _restartable(self) -> bool:
        return self._reform is not None and not (self.streams.queries or self.streams.contexts)

    def _restart(self, error: NodeFailed) -> None:
        """Start the next attempt after ``error`` (the cluster is torn down), or raise, naming every attempt."""
        self._causes.append(error)
        while len(self._causes) <= self.max_restarts and self._restartable():
            attempt = len(self._causes)
            log_restart(self._causes[-1], attempt, self.max_restarts)
            record = Restart(
                attempt,
                self._causes[-1],
                self._failed_at,
                detect_s=max(self._seen_at - self._failed_at, 0.0),
                teardown_s=self._teardown_s,
            )
            self.restart_log.append(record)
            try:
                self._start_attempt(attempt, record)
                return
            except NodeFailed as again:
                self._causes.append(again)
        self.failure = exhausted(self._causes, self.max_restarts)
        raise self.failure from None

    def _start_attempt(self, attempt: int, record: Restart) -> None:
        """A fresh rendezvous server and secret, executors reserved again, ``map_fun`` started again."""
        assert self._reform is not None
        started = time.monotonic()
        self.server, self.config = self._reform(attempt)
        self.feeds.secret_hex = self.config.secret_hex
        self.launches = []
        self.failure = None
        self._closed = False
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="tfos-watch")
        try:
            if self._reserve is not None:
                self._reserve()
        except BaseException:
            self._teardown(grace_secs=0)
            raise
        reserved = time.monotonic() - started
        self._start(self._payload)
        record.reserve_s = reserved + self._phases[0]
        record.startup_s = self._phases[1]
        record.total_s = time.time() - record.failed_at
        log.info(
            "TensorFlow cluster restarted (attempt %d): %.1fs after the failure (teardown %.1fs, "
            "reservation %.1fs, start-up %.1fs)",
            attempt,
            record.total_s,
            record.teardown_s,
            record.reserve_s,
            record.startup_s,
        )

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

    def _begin(self, payload: bytes) -> None:
        """Start the nodes; a node failing while they start uses a restart like any other failure."""
        self._payload = payload
        try:
            self._start(payload)
        except NodeFailed as error:
            self._restart(error)  # which starts the next attempt, or raises

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
        started = time.monotonic()
        self._await("reservation", lambda nodes: all(n.address for n in nodes), timeout)
        registered = time.monotonic()
        self._await("start-up", lambda nodes: all(n.up or n.finished for n in nodes), timeout)
        self._phases = (registered - started, time.monotonic() - registered)
        self.cluster_info = [self._info(n) for n in self.server.nodes.values()]
        gpus = {f"{i['job_name']}:{i['task_index']}": i["gpus"] for i in self.cluster_info if i["gpus"]}
        if gpus:
            log.info("GPUs of the TensorFlow nodes: %s", ", ".join(f"{k} {v}" for k, v in sorted(gpus.items())))

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
            "gpus": list(up.gpus) if up else [],
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
        if self.max_restarts:
            return self._train_epochs(data, num_epochs, feed_timeout, qname)
        return self.feeds.train(data, num_epochs, feed_timeout, qname, label=self.cluster_id[:8])

    def _train_epochs(self, data: Any, num_epochs: int, feed_timeout: float, qname: str) -> int:
        """``train`` of a restartable cluster: one feed job per epoch, each followed by its end mark.

        After a restart the feed goes on from the first epoch that some data node had not read
        through (its end mark not reached): completed epochs are never fed again.
        """
        check_num_epochs(num_epochs)
        feed_id, epoch, read = uuid.uuid4().hex[:12], 0, -1  # read: the last epoch every node read through
        delivered: dict[int, int] = {}  # epoch -> rows its last feed delivered
        while True:
            try:
                if epoch < num_epochs and not self.all_done():
                    self.check()
                    label = f"{self.cluster_id[:8]} epoch {epoch + 1}/{num_epochs}"
                    delivered[epoch] = self.feeds.train(data, 1, feed_timeout, qname, label=label)
                    self.feeds.mark_epoch(feed_id, epoch, qname)
                    epoch += 1
                    continue
                # fed is not read: a node failing on the rows still in its buffer needs them again
                self._await_read_through(feed_id, num_epochs - 1, feed_timeout)
                return sum(delivered.values())
            except NodeFailed as error:
                # the failed attempt's marks (a new attempt's nodes start from the epoch re-fed)
                marks = self._marks_read(self.server, feed_id)
                read = max(read, min((marks.get(name, -1) for name in self._data_nodes()), default=-1))
                self._restart(error)
                epoch = self.restart_log[-1].refeed_epoch = read + 1
                log.info("re-feeding epochs %d-%d of %d after the restart", epoch + 1, num_epochs, num_epochs)

    def _data_nodes(self) -> set[str]:
        return {r.name for r in self.roles if r.job_name in DATA_ROLES}

    @staticmethod
    def _marks_read(server: RendezvousServer, feed_id: str) -> dict[str, int]:
        """For each data node, the last epoch of a train feed it read to the end (its end mark)."""
        return server.epochs_read(feed_id)

    def _await_read_through(self, feed_id: str, epoch: int, timeout: float) -> None:
        """Wait until every data node has read ``epoch`` of a train feed to its end (or has finished).

        Gives up, with a warning, once no node has read an epoch mark or reported anything for
        ``timeout`` seconds (a ``map_fun`` that stopped reading): the data was delivered.
        """
        names, server = self._data_nodes(), self.server

        def read(nodes: Iterable[NodeState]) -> bool:
            done = {n.role.name for n in nodes if n.finished or n.feed_ended}
            done |= {name for name, last in self._marks_read(server, feed_id).items() if last >= epoch}
            return names <= done

        progress = -1
        while not server.wait_for(read, timeout):
            self.check()
            if server.event_count == progress:
                log.warning(
                    "train(): the data nodes have not read the last epoch to its end after feed_timeout=%.0fs "
                    "without progress; a node failing now restarts without it being fed again",
                    timeout,
                )
                return
            progress = server.event_count
        self.check()

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
        """The ``ctx.report({...})`` calls the nodes made, oldest first: the last 10,000
        (``reports.KEEP_REPORTS``), fewer where they hold over 32 MiB as JSON (``KEEP_BYTES``)."""
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
        if not self._restartable():
            self.check()  # else _wait_for_workers checks, and restarts
        if not in_time:
            self._teardown(grace_secs=0)
            self.streams.join(30)
            raise ShutdownTimeout(
                f"the stream was still running after timeout={timeout}s; it and the TensorFlow nodes have "
                "been stopped. Request a stop (cluster.request_stop(), python -m tfonspark.stop) or raise "
                "shutdown(timeout=...)."
            )
        done = self._attempts(lambda: self._wait_for_workers(deadline))
        if not done:
            self._teardown(grace_secs=0)
            raise ShutdownTimeout(
                f"TensorFlow workers were still running after timeout={timeout}s; "
                "they have been stopped. Raise shutdown(timeout=...) if training "
                "needs longer."
            )
        # every chief/worker has exited, so there is nothing left to wait for: grace_secs is the
        # time ps/evaluator nodes get between SIGTERM and SIGKILL (TFoS slept it unconditionally)
        try:
            self.check()
        except NodeFailed as error:  # after the workers: nothing to restart for, but name every attempt
            self._causes.append(error)
            self.failure = exhausted(self._causes, self.max_restarts)
            raise self.failure from None
        self._teardown(grace_secs=max(grace_secs, 2.0))
        self.streams.join(30)
        if stream_error is not None:
            reraise(stream_error)
            raise FeedError(f"the stream ended with an error: {summary(stream_error)}") from stream_error

    def _wait_for_workers(self, deadline: float) -> bool:
        """End the feed (SPARK mode) and wait for every chief/worker to exit; False at the deadline.

        A restarted SPARK-mode cluster's nodes get the end of feed at once: its data was fed.
        """
        if self.input_mode == InputMode.SPARK:
            self.feeds.close()
        trainers = lambda nodes: all(n.finished for n in nodes if n.role.job_name in DATA_ROLES)  # noqa: E731
        done = self.server.wait_for(trainers, max(deadline - time.monotonic(), 0))
        self.check()
        return done

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
