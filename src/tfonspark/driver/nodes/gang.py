"""One start of a cluster's nodes (an attempt): its rendezvous server, node launches and event watcher.

The gang is the control plane of its attempt (:class:`~tfonspark.driver.nodes.plane.ControlPlane`):
the rest of the driver asks it, never its server. A :class:`~tfonspark.driver.cluster.Cluster`
holds one :class:`Gang` at a time; a restart
(:class:`~tfonspark.driver.nodes.restarts.Attempts`) tears it down and forms the next. The gang starts
the nodes, answers what the feed jobs and streams ask about them (through :class:`LiveNodes`,
which always asks the running gang), raises :func:`node_failed` after tearing down on a node
failure, and tears down.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ...config import NodeConfig
from ...errors import ExecutorEnvironmentError, NodeFailed, ReservationTimeout
from ...executor.feeder import FeedTarget
from ...wire.errors import reraise, summary
from ...wire.events import NodeEvent, ServerRestarted
from .launcher import Launcher, LaunchHandle, LocalLauncher, ended_tasks
from .node_events import ServerRestart
from .rendezvous import NodeState, RendezvousServer
from .roles import DATA_ROLES, NodeRole
from .stopping import StopFile

__all__ = ["KEEP_SERVER_RESTARTS", "SPARK_SETTINGS", "Gang", "LiveNodes", "ServerRestarts", "node_failed"]

log = logging.getLogger(__name__)
_TAIL_LINES = 40
_SETTLE_SECS = 1.0  # how long other nodes get to report their own failure
_ENDED_POLL_SECS = 1.0  # how often the reservation asks whether a node task has already returned
SPARK_SETTINGS = (
    "spark.executor.instances, spark.executor.cores, spark.cores.max, spark.task.cpus (or the N in local[N])"
)
KEEP_SERVER_RESTARTS = 1_000
"""How many restarts in place a gang keeps (``cluster.server_restarts``): the latest."""
_LOGGED_RESTARTS = 100  # restarts handed on to be logged one by one; then 1 in 1,000


def _often(count: int) -> bool:
    """Whether the ``count``-th refused restart is logged: the first 10, then 1 in 1,000 (and each node's first)."""
    return count <= 10 or count % 1000 == 0


class ServerRestarts:
    """The restarts in place a gang's workers announced (``ServerRestarted``), oldest first; bounded.

    The TF process can write any event on its node's connection, so a ``ServerRestarted`` is
    accepted only where a supervisor could have sent it (:meth:`refusal`): from a worker, in a
    cluster whose workers restart in place (``limit`` = ``NodeConfig.server_restarts`` > 0), as
    its next restart (numbers rise per node, 1 to ``limit``), after a death by a signal. So a node
    adds at most ``limit`` records. Of those, the latest ``keep`` are kept (``dropped`` counts
    the older ones) and ``refused`` counts the rest, logged at a bounded rate (each node's first,
    the first 10, then 1 in 1,000).
    """

    def __init__(self, roles: Sequence[NodeRole], limit: int, keep: int = KEEP_SERVER_RESTARTS) -> None:
        self.limit = limit
        self.refused = 0  # events refused: no supervisor could have sent them
        self.dropped = 0  # accepted records past ``keep``, oldest first
        self.accepted = 0
        self._jobs = {role.name: role.job_name for role in roles}
        self._last: dict[str, int] = {}  # node -> the last restart number accepted from it
        self._refused_from: set[str] = set()  # nodes with a refused event: each one's first is logged
        self._kept: collections.deque[ServerRestart] = collections.deque(maxlen=max(keep, 1))

    def refusal(self, node: str, event: ServerRestarted) -> str:
        """Why no supervisor could have sent ``event`` from ``node`` (``""``: one could)."""
        if self._jobs.get(node) != "worker":
            return "only a worker restarts in place, never a ps, chief or evaluator"
        if self.limit <= 0:
            return "this cluster's workers do not restart in place (server_restarts=0)"
        if event.limit != self.limit:
            return f"limit {event.limit}; this cluster's is {self.limit}"
        last = self._last.get(node, 0)
        if not last < event.restart <= self.limit:
            return (
                f"restart {event.restart} of a limit of {self.limit}; the next of this node can only be "
                f"{last + 1} to {self.limit}"
                if last < self.limit
                else f"restart {event.restart}; this node has had all {self.limit}"
            )
        if event.exit_code >= 0:
            return f"exit code {event.exit_code}; only a server killed by a signal (exit code < 0) restarts"
        return ""

    def add(self, node: str, event: ServerRestarted) -> bool:
        """Record ``event`` from ``node``, or refuse it (logged at a bounded rate); whether it was recorded."""
        why = self.refusal(node, event)
        if why:
            self.refused += 1
            first = node not in self._refused_from
            self._refused_from.add(node)
            if first or _often(self.refused):
                log.warning(
                    "refused a ServerRestarted event from node %s: %s. Only the node's supervisor sends "
                    "one, after restarting a worker's TF server in place (%d refused so far)",
                    node,
                    why,
                    self.refused,
                )
            return False
        self._last[node] = event.restart
        if len(self._kept) == self._kept.maxlen:
            self.dropped += 1
        self._kept.append(ServerRestart.of(node, event))
        self.accepted += 1
        return True

    def loud(self) -> bool:
        """Whether the restart just added is logged on its own: the first 100 of a gang, then 1 in 1,000."""
        if self.accepted == _LOGGED_RESTARTS + 1:
            log.warning(
                "over %d TF servers restarted in place: from now on 1 in 1,000 is logged; "
                "cluster.server_restarts keeps the latest %d",
                _LOGGED_RESTARTS,
                self._kept.maxlen,
            )
        return self.accepted <= _LOGGED_RESTARTS or self.accepted % 1000 == 0

    def __iter__(self) -> Iterator[ServerRestart]:
        return iter(list(self._kept))

    def __len__(self) -> int:
        return len(self._kept)


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


def collective_timed_out(node: NodeState) -> bool:
    """Whether ``node`` failed because one of its collectives ran out of ``timeout_seconds``
    (``DeadlineExceededError`` of an all-reduce): then it is the peer it waited on that failed."""
    text = _exit_text(node)
    return "DeadlineExceededError" in text and "ollective" in text


def aborted_by_peer(node: NodeState) -> bool:
    """Whether ``node``'s collective was aborted because a peer's connection broke (``Collective
    ops is aborted by: Socket closed``, ``Error received from peer``): then the peer failed first,
    even where the driver heard of the peer's end a moment later."""
    if node.exit is None or node.exit.exit_code < 0:
        return False
    return "Collective ops is aborted by" in _exit_text(node) and not collective_timed_out(node)


def _exit_text(node: NodeState) -> str:
    """What ``node``'s TF process left to read: its traceback and its output's tail ("" if none)."""
    if node.exit is None:
        return ""
    return f"{node.exit.traceback}\n{node.exit.output_tail[-4000:]}"


def node_failed(failed: list[NodeState]) -> NodeFailed:
    """The error the driver raises for failed nodes: every one by role, index and output tail.

    ``role``/``index``/``exit_code``/``traceback`` describe the first failure: the node the driver
    heard from first (a SIGKILLed worker, not the peer whose collective then broke), then by
    executor id; a node whose collective a peer aborted comes after the others, and one whose
    collective timed out after every other (the peer it waited on is the cause, even where the
    driver learnt of it later); ``failures`` holds all of them.
    """
    ordered = sorted(
        failed,
        key=lambda n: (
            collective_timed_out(n),
            aborted_by_peer(n),
            n.finished_at or float("inf"),
            n.exit is None,
            n.role.executor_id,
        ),
    )
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


def _info(node: NodeState) -> dict[str, Any]:
    """One entry of ``cluster.cluster_info`` (TFoS's shape, plus what tfonspark knows)."""
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


class Gang:
    """The nodes of one attempt: ``server`` serves them, ``config`` started them, ``launcher`` launches them.

    ``on_event`` gets every node event (on the watcher thread); ``cancel_feeds`` stops the feed
    jobs at once when a node fails or the gang is torn down.
    """

    def __init__(
        self,
        server: RendezvousServer,
        config: NodeConfig,
        roles: list[NodeRole],
        launcher: Launcher,
        on_event: Callable[[NodeState, NodeEvent], None],
        cancel_feeds: Callable[[], None],
    ) -> None:
        self.server, self.config, self.roles, self.launcher = server, config, roles, launcher
        self.cluster_info: list[dict[str, Any]] = []
        self.failure: NodeFailed | None = None  # the node failure that tore this gang down
        self.phases = (0.0, 0.0)  # seconds to every node registered, then to every node up
        self.failed_at = 0.0  # time.time() when the first failed node was seen
        self.detect_s = 0.0  # from then until check() saw it
        self.teardown_s = 0.0  # how long tearing down after it took
        self.closed = False
        # workers' TF servers restarted in place, oldest first (bounded; forged ones refused)
        self.server_restarts = ServerRestarts(roles, config.server_restarts)
        self._launches: list[LaunchHandle] = []
        self._stop_files: list[str] = []
        self._on_event, self._cancel_feeds = on_event, cancel_feeds
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="tfos-watch")

    # ---- start-up ------------------------------------------------------------------------------
    def start(self, payload: bytes) -> None:
        """Launch every node's supervisor and wait until all registered, then until all are up."""
        self._watcher.start()
        on_driver = [r.executor_id for r in self.roles if r.on_driver]
        if on_driver:  # driver-side ps nodes: supervisors started from here, waited for until they exit
            local = LocalLauncher(wait_for_exit=True)
            self._launches.append(local.launch(self.config, payload, on_driver, self.server.notify))
        on_spark = [r.executor_id for r in self.roles if not r.on_driver]
        self._launches.append(self.launcher.launch(self.config, payload, on_spark, self.server.notify))
        timeout = self.config.reservation_timeout
        started = time.monotonic()
        self._await("reservation", lambda nodes: all(n.address for n in nodes), timeout, watch_tasks=True)
        registered = time.monotonic()
        self._await("start-up", lambda nodes: all(n.up or n.finished for n in nodes), timeout)
        self.phases = (registered - started, time.monotonic() - registered)
        self.cluster_info = [_info(n) for n in self.server.nodes.values()]
        gpus = {f"{i['job_name']}:{i['task_index']}": i["gpus"] for i in self.cluster_info if i["gpus"]}
        if gpus:
            log.info("GPUs of the TensorFlow nodes: %s", ", ".join(f"{k} {v}" for k, v in sorted(gpus.items())))

    def _launch_error(self) -> BaseException | None:
        return next((h.error for h in self._launches if h.done.is_set() and h.error is not None), None)

    def _ended_early(self) -> int:
        """Node tasks that have returned already: while the nodes are being reserved none may
        (a task runs until its node is up, or until it exits), so each one's node will not come."""
        return sum(ended_tasks(launch) for launch in self._launches)

    def _wait(self, done: Callable[[Iterable[NodeState]], bool], timeout: float, watch_tasks: bool) -> tuple[bool, int]:
        """Wait until ``done(nodes)``, a node failure or ``timeout``; with ``watch_tasks`` also
        until a node task has returned early (polled each second). (held, early tasks)."""
        if not watch_tasks:
            return self.server.wait_for(done, timeout), 0
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            ok = self.server.wait_for(done, max(0.0, min(left, _ENDED_POLL_SECS)))
            if ok or left <= _ENDED_POLL_SECS or self.server.failures() or self.server.closed:
                return ok, 0
            early = self._ended_early()
            if early and not done(self.server.nodes.values()):
                return False, early

    def _await(
        self, what: str, predicate: Callable[[Iterable[NodeState]], bool], timeout: float, watch_tasks: bool = False
    ) -> None:
        ok, early = self._wait(lambda nodes: predicate(nodes) or self._launch_error() is not None, timeout, watch_tasks)
        self.check()
        error = self._launch_error()
        if early and error is None:
            # stop the nodes that came: their tasks return too, and the node job's results say
            # why the others did not (an executor without tfonspark: ExecutorEnvironmentError)
            registered = self.server.registered()
            self.teardown(grace_secs=0)
            error = self._launch_error()
            if error is None:
                raise NodeFailed(
                    f"{what}: {early} Spark node task{'s' if early != 1 else ''} returned before "
                    f"{'their nodes' if early != 1 else 'its node'} registered ({registered} of "
                    f"{len(self.roles)} registered), so the cluster cannot form; see the executors' logs "
                    "for why (a task runs until its node is up or has exited)."
                )
        if error is not None and not predicate(self.server.nodes.values()):
            self.teardown(grace_secs=0)
            if isinstance(error, ExecutorEnvironmentError):  # found on the driver: says it all already
                raise error
            reraise(error)
            raise NodeFailed(f"starting the TensorFlow nodes failed before {what}: {summary(error)}") from error
        if not ok:
            registered = self.server.registered()
            self.teardown(grace_secs=0)
            raise ReservationTimeout(
                f"{what}: {registered} of {len(self.roles)} TensorFlow nodes registered within "
                f"{timeout:.0f}s. Each node needs its own Spark task slot; check {SPARK_SETTINGS}, "
                "that dynamic allocation can reach that many executors, or raise reservation_timeout.",
                registered=registered,
                required=len(self.roles),
            )

    # ---- what the feed jobs and streams ask (through LiveNodes) ------------------------------------
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

    def check(self) -> None:
        """Raise NodeFailed (after tearing the gang down) naming every node that has failed."""
        failed = self.server.failures()
        if not failed:
            return
        if not self.closed:  # the first to see it: let the others report, tear down, time both
            # nodes often fail together (one bad input, a lost peer): give the others a moment
            # to report, so the error names all of them and not only the fastest
            self.server.wait_for(lambda nodes: all(n.finished for n in nodes), _SETTLE_SECS, until_failure=False)
            self._name_waited_on(self.server.failures() or failed)
            failed = self.server.failures() or failed
            seen_at = time.time()
            self.failed_at = min((n.finished_at for n in failed if n.finished_at), default=seen_at)
            self.detect_s = max(seen_at - self.failed_at, 0.0)
            started = time.monotonic()
            self.teardown(grace_secs=0)
            self.teardown_s = time.monotonic() - started
        self.failure = error = node_failed(failed)
        raise error

    def stop_condition(self, timeout: float) -> tuple[str, bool]:
        """Why the streams must stop now, and whether gracefully; waits up to ``timeout`` for one."""
        server = self.server
        server.wait_for(lambda nodes: bool(server.stop_reason) or self.closed or self.all_done(), timeout)
        failed = server.failures()
        if failed:
            return f"TensorFlow node {failed[0].role.name} failed", False
        if self.closed or server.closed:
            return "the cluster was shut down", False
        if server.stop_reason:
            return f"stop requested: {server.stop_reason}", True
        if self.all_done():
            return "every data node has finished", True
        return "", True

    # ---- the control plane (plane.ControlPlane): what the cluster, feeds and services ask ---------
    def nodes(self) -> list[NodeState]:
        """Every node's state, in executor-id order."""
        return list(self.server.nodes.values())

    def cluster_spec(self) -> dict[str, list[str]]:
        """The cluster spec every node was given (the driver's own tasks too); ``{}`` until formed."""
        spec = self.server.cluster_spec
        return {job: list(hosts) for job, hosts in spec.items()} if spec else {}

    def failures(self) -> list[NodeState]:
        """The nodes that failed, now."""
        return self.server.failures()

    @property
    def event_count(self) -> int:
        """Node events the server accepted so far."""
        return self.server.event_count

    def request_stop(self, reason: str) -> None:
        """Ask the cluster's streams to stop (``Cluster.request_stop``, a stop file's request)."""
        self.server.request_stop(reason)

    def stop_node(self, node: NodeState, grace_secs: float, final: bool = False) -> None:
        """Ask ``node``'s supervisor to stop its TF process; no-op once it has gone."""
        self.server.stop_node(node, grace_secs, final)

    def wait_for(
        self, predicate: Callable[[Iterable[NodeState]], object], timeout: float | None, until_failure: bool = True
    ) -> bool:
        """Wait until ``predicate(nodes)`` holds or (``until_failure``) a node fails; whether it holds."""
        return self.server.wait_for(predicate, timeout, until_failure)

    def data_nodes(self) -> set[str]:
        """The names (``"worker:0"``) of the nodes that take data."""
        return {r.name for r in self.roles if r.job_name in DATA_ROLES}

    def marks_read(self, feed_id: str) -> dict[str, int]:
        """For each data node, the last epoch of a train feed it read to the end (its end mark)."""
        return self.server.epochs_read(feed_id)

    def wait_for_trainers(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for every chief/worker running ``map_fun`` to exit; then raise if a node failed."""
        done = self.server.wait_for(lambda nodes: all(n.finished for n in nodes if n.role.trains), max(timeout, 0))
        self.check()
        return done

    def tensorboard_url(self) -> str | None:
        """The TensorBoard URL a node (the chief, or worker 0) reported, if any."""
        return next((n.up.tensorboard_url for n in self.server.nodes.values() if n.up and n.up.tensorboard_url), None)

    def stop_file(self) -> StopFile:
        """What a stop file for this gang holds: its server's address, the cluster id, the secret."""
        host, port = self.server.address
        return StopFile(host, port, self.config.cluster_id, self.server.secret)

    def remove_at_teardown(self, path: str) -> None:
        """Delete the file at ``path`` when the gang is torn down (a stop file)."""
        self._stop_files.append(path)

    # ---- events and teardown -------------------------------------------------------------------
    def _watch(self) -> None:
        """Follow node events until the server closes; on a node failure, cancel the feed jobs at once.

        Teardown closes the server only once every node exited (or its wait timed out): a report
        a node sends while it is stopped (a ps or evaluator's last one) still reaches ``on_event``.
        """
        server = self.server
        failed = server.failures
        while not server.closed and not failed():
            self._hand_out(server.next_events(lambda: bool(failed())))
        if failed():
            self._cancel_feeds()
        while not server.closed:
            self._hand_out(server.next_events(lambda: False))
        self._hand_out(server.take_events())  # those that came with the nodes' last messages

    def _hand_out(self, events: list[tuple[NodeState, NodeEvent]]) -> None:
        """Hand each event to ``on_event``, noting a worker server's restart first.

        A ``ServerRestarted`` no supervisor could have sent is refused and not handed on; past
        the first 100 restarts only 1 in 1,000 is (each is logged there).
        """
        for node, event in events:
            restarts = self.server_restarts
            if isinstance(event, ServerRestarted) and not (restarts.add(node.role.name, event) and restarts.loud()):
                continue
            self._on_event(node, event)

    def _name_waited_on(self, failed: list[NodeState]) -> None:
        """Where a node's collective timed out, the peers it waited on that have gone silent
        (nothing from their supervisor for two heartbeats: host cut off, executor hung) are
        recorded as lost now, not after heartbeat_timeout, so the error names them first."""
        timed_out = [n for n in failed if collective_timed_out(n)]
        if not timed_out:
            return
        waiters = ", ".join(n.role.name for n in timed_out)
        peers = [n for n in self.server.nodes.values() if n.role.job_name in ("chief", "worker")]
        for node, quiet in self.server.silent(peers, 2 * self.server.heartbeat_secs):
            host = node.address.rsplit(":", 1)[0] or "?"
            self.server.mark_lost(
                node,
                f"unreachable: the collective of {waiters} timed out waiting for it, and its supervisor on {host} "
                f"has sent nothing for {quiet:.1f}s (its host cut off, or the executor lost or hung)",
            )

    def teardown(self, grace_secs: float, final: bool = False) -> None:
        """Stop every node, wait for their supervisors, cancel jobs, close the server.

        ``final``: no restart follows (``Cluster.stop``, the end), so the nodes' warm spares go at once.
        """
        if self.closed:
            return
        self.closed = True
        self.server.wind_down()  # a supervisor that registers from now on is told to stop
        for node in self.server.nodes.values():
            self.server.stop_node(node, grace_secs, final)
        self.server.wait_for(lambda nodes: all(n.finished or not n.address for n in nodes), grace_secs + 15)
        self._cancel_feeds()
        # a lost node's task may never return (its supervisor is frozen or its host gone):
        # then there is nothing to wait for, and the node job is cancelled at once
        lost = any(n.lost for n in self.server.nodes.values())
        for launch in self._launches:
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


class LiveNodes:
    """The running gang's nodes as the feed jobs (``FeedNodes``) and streams (``StreamCluster``) see them.

    It asks ``current()`` each time, so a restart's new gang answers from then on.
    """

    def __init__(self, current: Callable[[], Gang]) -> None:
        self._current = current

    def targets(self) -> list[FeedTarget]:
        return self._current().targets()

    def all_done(self) -> bool:
        return self._current().all_done()

    def check(self) -> None:
        self._current().check()

    def stop_condition(self, timeout: float) -> tuple[str, bool]:
        return self._current().stop_condition(timeout)
