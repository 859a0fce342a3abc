"""The driver's view of one TensorFlow cluster: start it, feed it, watch it, shut it down."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..config import InputMode, NodeConfig
from ..errors import ConfigError, FeedTimeout, NodeFailed, ReservationTimeout, ShutdownTimeout
from ..executor.node import node_task, start_node
from ..wire import messages as m
from .jobs import BackgroundJob
from .plan import DATA_ROLES, NodeRole
from .rendezvous import NodeState, RendezvousServer
from .reports import Report, ReportLog

__all__ = ["SPARK_SETTINGS", "Cluster"]

log = logging.getLogger(__name__)
SPARK_SETTINGS = (
    "spark.executor.instances, spark.executor.cores, spark.cores.max, spark.task.cpus (or the N in local[N])"
)


def _describe_exit(node: NodeState) -> NodeFailed:
    """The error the driver raises for a failed node, naming its role, index and output tail."""
    role = node.role
    where = f"TensorFlow node {role.name} (executor {role.executor_id})"
    if node.lost:
        return NodeFailed(f"{where} was lost: {node.lost}", role=role.job_name, index=role.task_index)
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
    return NodeFailed(
        f"{where} {how}",
        role=role.job_name,
        index=role.task_index,
        exit_code=code,
        traceback="\n".join(tail.splitlines()[-40:]),
    )


class Cluster:
    """A running TensorFlow cluster on Spark executors (TFoS ``TFCluster``)."""

    def __init__(
        self,
        sc: Any,
        roles: list[NodeRole],
        server: RendezvousServer,
        config: NodeConfig,
        input_mode: InputMode,
        reports: ReportLog | None = None,
    ) -> None:
        self.sc = sc
        self.roles = roles
        self.server = server
        self.config = config
        self.input_mode = input_mode
        self.cluster_id = config.cluster_id
        self.cluster_info: list[dict[str, Any]] = []
        self.launcher: BackgroundJob | None = None
        self.driver_nodes: list[threading.Thread] = []
        self.feed_groups: set[str] = set()
        self.feed_errors: list[FeedTimeout] = []  # stalled feeds the nodes reported
        self.feeding = ""  # feed_id of the running train(), if any
        self.report_log = reports or ReportLog()
        self._closed = False
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="tfos-watch")

    # ---- failure handling ------------------------------------------------------------------
    def _watch(self) -> None:
        """Follow node events; on a node failure or a stalled feed, cancel the feed jobs at once."""
        seen = 0
        while True:
            self.server.wait_for(lambda nodes, seen=seen: self._closed or len(self.server.events) > seen, None)
            events = self.server.events_since(seen)
            seen += len(events)
            for node, event in events:
                self._on_event(node, event)
            if self.server.failures() or self._closed or self.server.closed:
                break
        if self.server.failures():
            self._cancel_feeds()

    def _on_event(self, node: NodeState, event: m.NodeEvent) -> None:
        if event.kind == "report" and isinstance(event.detail, dict):
            self.report_log.add(node.role.job_name, node.role.task_index, event.detail)
            return
        if event.kind != "feed_stalled":
            log.info("node %s reported %s: %s", node.role.name, event.kind, event.detail)
            return
        detail = event.detail
        error = FeedTimeout(
            f"partition {detail.get('partition')}: its feeder sent nothing to node {node.role.name} "
            f"for feed_timeout={float(detail.get('timeout', 0)):.0f}s after {detail.get('received', 0)} "
            "rows (a stalled Spark task or executor); the feed was cancelled. Raise feed_timeout if "
            "computing a partition's rows can take longer."
        )
        log.warning("%s", error)
        # only the running train() is cancelled: a late report about an earlier feed is logged
        if detail.get("train", True) and detail.get("feed_id", "") in ("", self.feeding):
            self.feed_errors.append(error)
            self._cancel_feeds()

    def _cancel_feeds(self) -> None:
        for group in list(self.feed_groups):
            self.sc.cancelJobGroup(group)

    def check(self) -> None:
        """Raise NodeFailed (after tearing the cluster down) if any node has failed."""
        failed = self.server.failures()
        if failed:
            first = min(failed, key=lambda n: (n.exit is None, n.role.executor_id))
            self._teardown(grace_secs=0)
            raise _describe_exit(first)

    def _launch_error(self) -> BaseException | None:
        job = self.launcher
        return job.error if job is not None and job.done.is_set() else None

    # ---- start-up --------------------------------------------------------------------------
    def _await(self, what: str, predicate: Callable[[Iterable[NodeState]], bool], timeout: float) -> None:
        ok = self.server.wait_for(lambda nodes: predicate(nodes) or self._launch_error() is not None, timeout)
        self.check()
        error = self._launch_error()
        if error is not None and not predicate(self.server.nodes.values()):
            self._teardown(grace_secs=0)
            raise NodeFailed(
                f"the Spark job that starts the TensorFlow nodes failed before {what}: {_first_line(error)}"
            ) from error
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

    def _start(self, payload: bytes, use_barrier: bool) -> None:
        self._watcher.start()
        for role in self.roles:
            if role.on_driver:
                t = threading.Thread(target=self._driver_node, args=(role, payload), daemon=True)
                t.start()
                self.driver_nodes.append(t)
        spark_roles = [r.executor_id for r in self.roles if not r.on_driver]
        rdd = self.sc.parallelize(spark_roles, len(spark_roles))
        if use_barrier:
            rdd = rdd.barrier()
        task = node_task(self.config, payload)
        self.launcher = BackgroundJob(
            self.sc,
            f"tfonspark nodes {self.cluster_id[:8]}",
            lambda: rdd.mapPartitions(task).collect(),
            self.server.notify,
        )
        timeout = self.config.reservation_timeout
        self._await("reservation", lambda nodes: all(n.address for n in nodes), timeout)
        self._await("start-up", lambda nodes: all(n.up or n.finished for n in nodes), timeout)
        self.cluster_info = [self._info(n) for n in self.server.nodes.values()]

    def _driver_node(self, role: NodeRole, payload: bytes) -> None:
        try:
            start_node(self.config, role.executor_id, payload, [], wait_for_exit=True)
        except Exception as exc:
            log.error("driver-side node %s failed to start: %s", role.name, exc)

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
    def train(self, data: Any, num_epochs: int = 1, feed_timeout: float = 600, qname: str = "input") -> int:
        """Feed ``data`` (an RDD or DataFrame) to the nodes for ``num_epochs`` epochs.

        Returns the number of rows the nodes received (less than fed if a node terminated).
        """
        from .feeding import train

        self._require_spark_mode("train")
        self.check()
        return train(self, data, num_epochs, feed_timeout, qname)

    def inference(self, data: Any, feed_timeout: float = 600, qname: str = "input", output_schema: Any = None) -> Any:
        """Feed ``data`` to the nodes and return one result per input row (RDD or DataFrame)."""
        from .feeding import inference

        self._require_spark_mode("inference")
        self.check()
        return inference(self, data, feed_timeout, qname, output_schema)

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
        """End the feed, wait for the chief/workers to finish, stop ps/evaluator nodes.

        ``grace_secs`` is how long ps/evaluator nodes get to exit after SIGTERM before SIGKILL.

        Raises NodeFailed if any node failed, ShutdownTimeout if workers are still running after
        ``timeout`` seconds (they are stopped either way).
        """
        if self._closed:
            return
        if ssc is not None:
            ssc.awaitTermination()
        if self.input_mode == InputMode.SPARK:
            from .feeding import close_feeds

            close_feeds(self)
        trainers = lambda nodes: all(n.finished for n in nodes if n.role.job_name in DATA_ROLES)  # noqa: E731
        done = self.server.wait_for(trainers, timeout if timeout and timeout > 0 else None)
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

    def _teardown(self, grace_secs: float) -> None:
        """Stop every node, wait for their supervisors, cancel jobs, close the server."""
        if self._closed:
            return
        self._closed = True
        for node in self.server.nodes.values():
            self.server.stop_node(node, grace_secs)
        self.server.wait_for(lambda nodes: all(n.finished or not n.address for n in nodes), grace_secs + 15)
        self._cancel_feeds()
        # a lost node's task may never return (its supervisor is frozen or its host gone):
        # then there is nothing to wait for, and the node job is cancelled at once
        lost = any(n.lost for n in self.server.nodes.values())
        if self.launcher is not None and (lost or not self.launcher.join(10)):
            self.launcher.cancel()
            self.launcher.join(10)
        self.server.close()
        for t in self.driver_nodes:
            t.join(5)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return next((line for line in text if "Error" in line or "Exception" in line), text[0] if text else repr(error))
