"""The driver's rendezvous server: nodes register, receive the cluster, report up/exit, get stopped.

It also answers the nodes' feed servers, which ask it before committing a training partition
whether another node delivered that partition already (its :class:`~.ledger.FeedLedger`).

Each node's supervisor keeps one authenticated connection open for the node's whole life. A
connection that drops without a ``NodeExit``, or stays silent for ``heartbeat_timeout``, means
the node (or its executor) died or hung. Both sides send a ``Heartbeat`` every
``heartbeat_secs``. Connections are accepted and authenticated by a :class:`Listener`: peers
that fail, stall or flood the handshake are dropped without a reply, and the server keeps
serving the others.

**Node events** (:class:`~tfonspark.wire.events.NodeEvent`: reports, feed-server events) take
bounded memory however long the cluster runs. Each event is at most ``MAX_EVENT_BYTES`` encoded
(larger ones, and ones with a malformed field such as a ``feed_id`` over ``MAX_FEED_ID``
characters, are refused with an error; the node goes on). An event waits here only until the
cluster's watcher takes it (:meth:`RendezvousServer.next_events`): at most ``EVENT_BACKLOG`` events and ``BACKLOG_BYTES``
of them, beyond which the oldest reports are dropped with a warning. What the cluster needs
from events later is kept as compact state as they arrive: the last epoch each node read
through for the last ``MARKED_FEEDS`` feeds (:meth:`RendezvousServer.epochs_read`), and a
terminated feed on its node (``NodeState.feed_ended``). The reports themselves are kept by
:class:`~tfonspark.driver.nodes.reports.ReportLog` (the latest ``KEEP_REPORTS``, at most ``KEEP_BYTES``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import operator
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ... import settings
from ...errors import ConfigError, ProtocolError
from ...executor.relay import MAX_EVENT_BYTES
from ...host import is_wildcard
from ...ports import listen_reusable
from ...wire import events as ev
from ...wire import messages as m
from ...wire.events import MAX_FEED_ID
from ...wire.framing import Connection
from ...wire.listener import Listener
from .ledger import FeedLedger
from .roles import NodeRole, build_cluster_spec

__all__ = [
    "BACKLOG_BYTES",
    "EVENT_BACKLOG",
    "MARKED_FEEDS",
    "MAX_EVENT_BYTES",
    "MAX_FEED_ID",
    "NodeState",
    "RendezvousServer",
    "bind_server_socket",
]

log = logging.getLogger(__name__)
_CONTROL_MAX_FRAME = 4 * 1024 * 1024
EVENT_BACKLOG = 10_000
"""The most node events waiting for the cluster's watcher; beyond it the oldest reports go."""
BACKLOG_BYTES = 16 * 1024 * 1024
"""The most bytes (encoded) of node events waiting for the cluster's watcher."""
MARKED_FEEDS = 64
"""How many feeds' epoch marks (``EpochRead``) are kept: the most recently marked."""


def _often(count: int) -> bool:
    """Whether the ``count``-th occurrence of a repeated problem is logged: the first 10, then 1 in 1,000."""
    return count <= 10 or count % 1000 == 0


def _event_refusal(event: ev.NodeEvent, size: int) -> str:
    """Why the driver refuses a node event (``""``: it does not): its size, or a field it acts on."""
    if size > MAX_EVENT_BYTES:
        return f"it is {size} bytes; an event may be at most {MAX_EVENT_BYTES} bytes (MAX_EVENT_BYTES)"
    return event.refusal()


@dataclass
class NodeState:
    """What the driver knows about one node."""

    role: NodeRole
    address: str = ""
    executor_key: str = ""
    up: m.NodeUp | None = None
    exit: m.NodeExit | None = None
    lost: str = ""
    finished_at: float = 0.0  # time.time() when the driver learnt the node exited or was lost
    feed_ended: bool = False  # its feed was terminated (DataFeed.terminate()): it takes no more data
    heard_at: float = 0.0  # time.monotonic() when its supervisor last sent anything (0: never)
    conn: Connection | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        return self.exit is not None or bool(self.lost)

    @property
    def failed(self) -> bool:
        return bool(self.lost) or (self.exit is not None and self.exit.exit_code != 0 and not self.exit.stopped)


_Pending = tuple[int, NodeState, ev.NodeEvent, int]  # (number, node, event, encoded size)

_SERVER_SETTINGS = "server_port/server_host (spark.tfonspark.serverPort/serverHost, TFOS_SERVER_PORT/TFOS_SERVER_HOST)"


def _port_candidates(spec: str | None) -> list[int]:
    """The ``server_port`` setting: ``""`` -> any free port; ``5000`` or a range ``5000-5010``."""
    low, high = settings.port_range(settings.check("server_port", spec or "", "port_spec"))
    return list(range(low, high + 1))


def bind_server_socket(host: str, port_spec: str | None = None, backlog: int = 4096) -> socket.socket:
    """A listening socket on ``host`` at the first free port of ``port_spec`` (any port if empty).

    The bind itself is :func:`tfonspark.ports.listen_reusable` (``SO_REUSEADDR``, never
    ``SO_REUSEPORT``: a fixed ``server_port`` is bound again after a restart, a node's
    reservation is never taken); here the setting is read and a failure named.
    """
    try:
        return listen_reusable(host, _port_candidates(port_spec), backlog)
    except OSError as last:
        raise ConfigError(
            f"the rendezvous server cannot listen on {host} at port(s) {port_spec!r}: {last}; "
            f"choose another port range or address with {_SERVER_SETTINGS}, or with port_range "
            "(spark.tfonspark.portRange, TFONSPARK_PORT_RANGE) where server_port is not set"
        ) from None


def _on(node: NodeState) -> str:
    """`` on <host>`` of a node that registered (its advertised address), else nothing."""
    host = node.address.rsplit(":", 1)[0] if node.address else ""
    return f" on {host}" if host else ""


class RendezvousServer:
    """Serves one cluster: ``roles`` are the nodes expected, ``secret`` authenticates them.

    It listens on ``bind_host`` (default: ``host``) at the first free port of ``port_spec``
    (default: any), the resolved ``server_host``/``server_port`` settings, and advertises
    ``address``: the bound address, or ``host`` where the bind address is a wildcard.
    ``fixed_tasks`` are added to the cluster spec as they are (``{"chief": ["driver:port"]}``).
    """

    def __init__(
        self,
        cluster_id: str,
        roles: Sequence[NodeRole],
        secret: bytes,
        host: str,
        port_spec: str | None = None,
        *,
        bind_host: str | None = None,
        heartbeat_secs: float = 5.0,
        heartbeat_timeout: float = settings.DEFAULT_HEARTBEAT_TIMEOUT,
        handshake_timeout: float = 10.0,
        fixed_tasks: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        if not 0 < heartbeat_secs < heartbeat_timeout:
            raise ConfigError(
                "heartbeats need 0 < heartbeat_secs < heartbeat_timeout. Received: "
                f"heartbeat_secs={heartbeat_secs!r}, heartbeat_timeout={heartbeat_timeout!r}"
            )
        self.cluster_id = cluster_id
        self.secret = secret
        self.nodes = {r.executor_id: NodeState(r) for r in roles}
        self.cluster_spec: dict[str, list[str]] | None = None
        self.fixed_tasks = dict(fixed_tasks or {})  # tasks in the spec that no node runs (the driver's chief)
        self.event_count = 0  # node events accepted so far (each refused one counts in ``refused``)
        self.refused = 0  # node events refused: over MAX_EVENT_BYTES or with a malformed field
        self.dropped = 0  # node events dropped because the watcher fell behind (EVENT_BACKLOG, BACKLOG_BYTES)
        # events waiting for take_events(): (number, node, event, size); reports apart, as they go first
        self._reports: collections.deque[_Pending] = collections.deque()
        self._notices: collections.deque[_Pending] = collections.deque()
        self._backlog_bytes = 0
        self._marks: collections.OrderedDict[str, dict[str, int]] = collections.OrderedDict()
        self.heartbeat_secs = heartbeat_secs
        self.heartbeat_timeout = heartbeat_timeout
        self.handshake_timeout = handshake_timeout
        self._ready: set[int] = set()  # executor ids sent ClusterReady: they get heartbeats
        self._cond = threading.Condition()
        self._closed = False
        self._winding_down = False  # torn down: a supervisor registering now is told to stop
        self.stop_reason = ""  # set by request_stop(): why the cluster's streams should stop
        self._stopping = threading.Event()
        self.ledger = FeedLedger()  # which node delivered each training partition, for all nodes
        sock, self.address = self._bind(host, port_spec, bind_host)
        self._listener = Listener(
            sock,
            secret,
            self._serve,
            max_frame=_CONTROL_MAX_FRAME,
            handshake_timeout=handshake_timeout,
            max_pending=max(128, 2 * len(self.nodes)),
            max_connections=max(1024, 4 * len(self.nodes)),
            name="tfos-rendezvous",
        )
        self._beat = threading.Thread(target=self._heartbeats, name="tfos-rdv-heartbeat", daemon=True)
        self._beat.start()

    @staticmethod
    def _bind(host: str, port_spec: str | None, bind_host: str | None) -> tuple[socket.socket, tuple[str, int]]:
        """The listening socket and the address nodes are told to connect to."""
        if bind_host is None:
            bind_host = host
        sock = bind_server_socket(bind_host, port_spec)
        bound, port = sock.getsockname()[:2]
        if not is_wildcard(bind_host) and not is_wildcard(bound):
            return sock, (bound, port)
        if is_wildcard(host):
            sock.close()
            raise ConfigError(
                f"the rendezvous server binds to the wildcard {bind_host!r} and needs "
                f"a real address to advertise to executors. Received: host={host!r}"
            )
        return sock, (host, port)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def rejected(self) -> int:
        """Connections dropped before or at authentication."""
        return self._listener.rejected

    # ---- serving -------------------------------------------------------------------------
    def _serve(self, conn: Connection) -> bool:
        """One supervisor's connection, for its node's whole life (then closed: returns False)."""
        node: NodeState | None = None
        try:
            conn.settimeout(self.handshake_timeout)  # Register must follow authentication at once
            msg = m.recv_message(conn, m.Register, m.StopRequest, m.FeedClaim)
            if isinstance(msg, m.StopRequest):
                self._stop_request(conn, msg)
                return False
            if isinstance(msg, m.FeedClaim):  # a node's feed server: may it commit a partition?
                self.ledger.serve(conn, msg)
                return False
            assert isinstance(msg, m.Register)
            node = self._register(conn, msg)
            if node is not None:
                self._follow(conn, node)
        except (OSError, ProtocolError) as exc:
            if node is not None:
                self._lost(
                    node, f"the connection to its supervisor{_on(node)} broke ({exc}): its process or its host died?"
                )
        return False

    def _stop_request(self, conn: Connection, msg: m.StopRequest) -> None:
        """An authenticated peer asks the cluster's streams to stop (``tfonspark.request_stop``)."""
        if msg.cluster_id and msg.cluster_id != self.cluster_id:
            m.send_message(conn, m.Reject(f"this driver serves cluster {self.cluster_id}, not {msg.cluster_id}"))
            return
        self.request_stop(msg.reason or "a stop request")
        m.send_message(conn, m.Ack())

    def request_stop(self, reason: str) -> None:
        """Record a stop request (the first reason is kept) and wake every waiter."""
        with self._cond:
            if not self.stop_reason:
                self.stop_reason = reason
                log.info("rendezvous: stop requested: %s", reason)
            self._cond.notify_all()

    def _register(self, conn: Connection, msg: m.Register) -> NodeState | None:
        """Record a registration, wait for the whole cluster, then send it the spec."""
        with self._cond:
            winding_down = self._winding_down
        if winding_down:  # a late supervisor of a gang being torn down: it exits as stopped
            m.send_message(conn, m.Stop(0.0, True))
            return None
        with self._cond:
            node = self.nodes.get(msg.executor_id)
            reason = self._refusal(msg, node) or ("" if node is not None else "unknown executor id")
            if not reason and node is not None:
                node.address = f"{msg.host}:{msg.port}"
                node.heard_at = time.monotonic()
                node.executor_key, node.conn = msg.executor_key, conn
                self._maybe_form_cluster()
        if reason or node is None:
            m.send_message(conn, m.Reject(reason))  # outside the lock: a slow peer stalls no one
            return None
        with self._cond:
            while self.cluster_spec is None and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            spec = self.cluster_spec
        assert spec is not None
        m.send_message(conn, m.ClusterReady(node.role.job_name, node.role.task_index, spec))
        with self._cond:
            self._ready.add(node.role.executor_id)
        return node

    def _maybe_form_cluster(self) -> None:
        """Once every node has registered, build the cluster spec and wake the waiters."""
        if all(n.address for n in self.nodes.values()):
            self.cluster_spec = build_cluster_spec(
                [n.role for n in self.nodes.values()],
                {i: n.address for i, n in self.nodes.items()},
                self.fixed_tasks,
            )
            self._cond.notify_all()

    def _refusal(self, msg: m.Register, node: NodeState | None) -> str:
        if msg.cluster_id != self.cluster_id:
            return "registration for another cluster"
        if node is None:
            return f"executor id {msg.executor_id} is not part of this cluster"
        if self.cluster_spec is not None or node.conn is not None:
            return (
                f"executor id {msg.executor_id} registered twice (a retried Spark task?); the cluster is already formed"
            )
        return ""

    def _follow(self, conn: Connection, node: NodeState) -> None:
        """Read lifecycle events from a node's supervisor until it reports its exit or goes silent."""
        conn.settimeout(self.heartbeat_timeout)
        while True:
            try:
                payload = conn.recv()
                node.heard_at = time.monotonic()
            except TimeoutError:
                self._lost(
                    node,
                    f"unreachable: no heartbeat from its supervisor{_on(node)} for {self.heartbeat_timeout:g}s "
                    "(its host cut off, or the executor lost or hung; heartbeat_timeout sets the wait)",
                )
                return
            try:
                msg = m.decode(payload)
            except ProtocolError as exc:
                name = ev.is_node_event(payload)
                if not name:
                    raise
                self._refuse(node, name, str(exc))  # a malformed event: refused, the node goes on
                continue
            if not isinstance(msg, (m.NodeUp, m.NodeExit, m.Heartbeat, ev.NodeEvent)):
                raise ProtocolError(f"expected node_up, node_exit, heartbeat or a node event, received {msg.TYPE}")
            if self._record(node, msg, len(payload)):
                return

    def _record(self, node: NodeState, msg: m.Message, size: int) -> bool:
        """Note one message (``size`` bytes) from a node's supervisor; True once the node has exited."""
        if isinstance(msg, m.Heartbeat):
            return False
        if isinstance(msg, ev.NodeEvent):
            why = _event_refusal(msg, size)
            if why:
                self._refuse(node, msg.TYPE, why)
                return False
        dropped = 0
        with self._cond:
            if isinstance(msg, m.NodeUp):
                node.up = msg
            elif isinstance(msg, ev.NodeEvent):
                dropped = self._add_event(node, msg, size)
            elif isinstance(msg, m.NodeExit):
                node.exit = msg
                node.finished_at = time.time()
            self._cond.notify_all()
        if dropped and _often(dropped):
            log.warning(
                "rendezvous: the driver's event watcher fell behind by over %d events or %d bytes "
                "(EVENT_BACKLOG, BACKLOG_BYTES; a slow on_report callback?): dropped the oldest waiting "
                "event, reports first (%d dropped so far)",
                EVENT_BACKLOG,
                BACKLOG_BYTES,
                dropped,
            )
        return isinstance(msg, m.NodeExit)

    def _refuse(self, node: NodeState, event_type: str, why: str) -> None:
        with self._cond:
            self.refused += 1
            count = self.refused
        if _often(count):
            log.error(
                "rendezvous: refused a %r event from node %s: %s. The event was dropped; the node goes on "
                "(%d refused so far)",
                event_type[:64],
                node.role.name,
                why,
                count,
            )

    def _add_event(self, node: NodeState, event: ev.NodeEvent, size: int) -> int:
        """Keep what the cluster needs of an event, queue it for the watcher; the drop count if one went."""
        self.event_count += 1
        match event:
            case ev.EpochRead(feed_id=feed_id, epoch=epoch):
                self._mark(node, feed_id, epoch)
            case ev.FeedTerminated():
                node.feed_ended = True  # it takes no more data (Gang.all_done)
        queue = self._reports if isinstance(event, ev.Reported) else self._notices
        queue.append((self.event_count, node, event, size))
        self._backlog_bytes += size
        dropped = 0
        while len(self._reports) + len(self._notices) > EVENT_BACKLOG or self._backlog_bytes > BACKLOG_BYTES:
            oldest = (self._reports or self._notices).popleft()
            self._backlog_bytes -= oldest[3]
            self.dropped += 1
            dropped = self.dropped
        return dropped

    def _mark(self, node: NodeState, feed_id: str, epoch: int) -> None:
        marks = self._marks.get(feed_id)
        if marks is None:
            marks = self._marks[feed_id] = {}
            while len(self._marks) > MARKED_FEEDS:
                self._marks.popitem(last=False)
        else:
            self._marks.move_to_end(feed_id)
        name = node.role.name
        marks[name] = max(marks.get(name, -1), epoch)

    def _heartbeats(self) -> None:
        """Every ``heartbeat_secs``, tell each running node's supervisor that the driver lives."""
        while not self._stopping.wait(self.heartbeat_secs):
            with self._cond:
                targets = [
                    (n, n.conn)
                    for n in self.nodes.values()
                    if n.role.executor_id in self._ready and n.conn is not None and not n.finished
                ]
            for node, conn in targets:
                try:
                    m.send_message(conn, m.Heartbeat())
                except OSError as exc:
                    self._lost(node, f"a heartbeat to its supervisor{_on(node)} failed ({exc}): unreachable?")
                    conn.close()

    def silent(self, nodes: Iterable[NodeState], longer_than: float) -> list[tuple[NodeState, float]]:
        """Running nodes whose supervisor has sent nothing for more than ``longer_than`` seconds
        (with how long): a healthy one sends a heartbeat every ``heartbeat_secs``."""
        now = time.monotonic()
        with self._cond:
            return [
                (n, now - n.heard_at) for n in nodes if n.heard_at and not n.finished and now - n.heard_at > longer_than
            ]

    def mark_lost(self, node: NodeState, why: str) -> None:
        """Record ``node`` as lost (``why``) before its heartbeat_timeout runs out, as the gang
        judges from another node's failure; no-op once it has finished."""
        self._lost(node, why)

    def _lost(self, node: NodeState, why: str) -> None:
        with self._cond:
            lost = not node.finished and not self._closed
            if lost:
                node.lost = why
                node.finished_at = time.time()
            self._cond.notify_all()
        if lost:
            log.warning("rendezvous: node %s lost: %s", node.role.name, why)

    # ---- driver-side queries ---------------------------------------------------------------
    def wait_for(
        self, predicate: Callable[[Iterable[NodeState]], object], timeout: float | None, until_failure: bool = True
    ) -> bool:
        """Wait until ``predicate(nodes)`` holds or (``until_failure``) any node fails; True if it holds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not predicate(self.nodes.values()):
                if (until_failure and self.failures()) or self._closed:
                    return bool(predicate(self.nodes.values()))
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def failures(self) -> list[NodeState]:
        return [n for n in self.nodes.values() if n.failed]

    def registered(self) -> int:
        with self._cond:
            return sum(1 for n in self.nodes.values() if n.address)

    def notify(self) -> None:
        """Wake every waiter (e.g. after a Spark job failed) so it can re-check its conditions."""
        with self._cond:
            self._cond.notify_all()

    def stop_node(self, node: NodeState, grace_secs: float, final: bool = False) -> None:
        """Ask a node's supervisor to stop its TF process (``final``: no restart follows); no-op if it has gone."""
        if node.conn is None or node.finished:
            return
        with contextlib.suppress(OSError):
            m.send_message(node.conn, m.Stop(grace_secs, final))
        with self._cond:
            if self.cluster_spec is None and not node.finished:
                # registered, waiting for a cluster that will not form: it has no TF process to
                # stop, and its supervisor exits on the Stop (nothing more comes on its connection)
                node.exit = m.NodeExit(node.role.executor_id, 0, stopped=True)
                node.finished_at = time.time()
                self._cond.notify_all()

    def take_events(self) -> list[tuple[NodeState, ev.NodeEvent]]:
        """The events nodes reported since the last call, oldest first; the server keeps none of them.

        One consumer takes them: the cluster's watcher. If it falls ``EVENT_BACKLOG`` events (or
        ``BACKLOG_BYTES``) behind, the oldest reports are dropped (``dropped``).
        """
        with self._cond:
            pending = [*self._notices, *self._reports]
            self._reports.clear()
            self._notices.clear()
            self._backlog_bytes = 0
        pending.sort(key=operator.itemgetter(0))
        return [(node, event) for _, node, event, _ in pending]

    def next_events(self, stop: Callable[[], bool]) -> list[tuple[NodeState, ev.NodeEvent]]:
        """Wait for node events, then take them (:meth:`take_events`); ``[]`` once ``stop()`` or the
        server closed with none waiting. The cluster's watcher calls it in a loop until the server closes."""
        with self._cond:
            while not (self._reports or self._notices or stop() or self._closed):
                self._cond.wait()
        return self.take_events()

    def epochs_read(self, feed_id: str) -> dict[str, int]:
        """For each node, the last epoch of feed ``feed_id`` it read to the end (its ``EpochRead`` mark).

        Kept for the last ``MARKED_FEEDS`` feeds marked; ``{}`` for one older or never marked.
        """
        with self._cond:
            return dict(self._marks.get(feed_id, {}))

    def wind_down(self) -> None:
        """The gang is being torn down: a supervisor that registers from now on (one that started
        late) gets ``Stop`` instead of waiting for a cluster that will not form, so its Spark task
        returns at once rather than holding the node job until it is cancelled."""
        with self._cond:
            self._winding_down = True

    def close(self) -> None:
        """Stop serving: close every connection, release every waiter, stop the heartbeats."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._stopping.set()
        self._listener.close()
        self.ledger.close()
        for node in self.nodes.values():
            if node.conn is not None:
                node.conn.close()
        if self._beat is not threading.current_thread():
            self._beat.join(2.0)
