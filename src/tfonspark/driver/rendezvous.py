"""The driver's rendezvous server: nodes register, receive the cluster, report up/exit, get stopped.

Each node's supervisor keeps one authenticated connection open for the node's whole life. A
connection that drops without a ``NodeExit``, or stays silent for ``heartbeat_timeout``, means
the node (or its executor) died or hung. Both sides send a ``Heartbeat`` every
``heartbeat_secs``. Connections are accepted and authenticated by a :class:`Listener`: peers
that fail, stall or flood the handshake are dropped without a reply, and the server keeps
serving the others.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .. import settings
from ..errors import ConfigError, ProtocolError
from ..executor.host import is_wildcard
from ..wire import messages as m
from ..wire.framing import Connection
from ..wire.listener import Listener
from .plan import NodeRole, build_cluster_spec

__all__ = ["NodeState", "RendezvousServer", "bind_server_socket"]

log = logging.getLogger(__name__)
_CONTROL_MAX_FRAME = 4 * 1024 * 1024


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
    conn: Connection | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        return self.exit is not None or bool(self.lost)

    @property
    def failed(self) -> bool:
        return bool(self.lost) or (self.exit is not None and self.exit.exit_code != 0 and not self.exit.stopped)


_SERVER_SETTINGS = "server_port/server_host (spark.tfonspark.serverPort/serverHost, TFOS_SERVER_PORT/TFOS_SERVER_HOST)"


def _port_candidates(spec: str | None) -> list[int]:
    """The ``server_port`` setting: ``""`` -> any free port; ``5000`` or a range ``5000-5010``."""
    low, high = settings.port_range(settings.check("server_port", spec or "", "port_spec"))
    return list(range(low, high + 1))


def bind_server_socket(host: str, port_spec: str | None = None, backlog: int = 4096) -> socket.socket:
    """A listening socket on ``host`` at the first free port of ``port_spec`` (any port if empty).

    ``SO_REUSEADDR`` lets a fixed ``server_port`` be bound again while connections of the last
    server on it are in TIME-WAIT (a restart with ``max_restarts``). On POSIX it never lets two
    live listeners share a port, nor takes a port another socket holds without the option (a
    node's reservation); ``SO_REUSEPORT``, which would, is never set.
    """
    last: OSError | None = None
    for port in _port_candidates(port_spec):
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            if os.name == "posix":  # on Windows the option means what SO_REUSEPORT means on Linux
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(backlog)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise ConfigError(
        f"cannot listen on {host} at port(s) {port_spec!r}: {last}; "
        f"choose another port range or address with {_SERVER_SETTINGS}"
    )


class RendezvousServer:
    """Serves one cluster: ``roles`` are the nodes expected, ``secret`` authenticates them.

    It listens on ``bind_host`` (default: ``host``) at the first free port of ``port_spec``
    (default: any), the resolved ``server_host``/``server_port`` settings, and advertises
    ``address``: the bound address, or ``host`` where the bind address is a wildcard.
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
        heartbeat_timeout: float = 60.0,
        handshake_timeout: float = 10.0,
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
        self.events: list[tuple[NodeState, m.NodeEvent]] = []
        self.heartbeat_secs = heartbeat_secs
        self.heartbeat_timeout = heartbeat_timeout
        self.handshake_timeout = handshake_timeout
        self._ready: set[int] = set()  # executor ids sent ClusterReady: they get heartbeats
        self._cond = threading.Condition()
        self._closed = False
        self.stop_reason = ""  # set by request_stop(): why the cluster's streams should stop
        self._stopping = threading.Event()
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
            msg = m.recv_message(conn, m.Register, m.StopRequest)
            if isinstance(msg, m.StopRequest):
                self._stop_request(conn, msg)
                return False
            assert isinstance(msg, m.Register)
            node = self._register(conn, msg)
            if node is not None:
                self._follow(conn, node)
        except (OSError, ProtocolError) as exc:
            if node is not None:
                self._lost(node, f"connection to its supervisor broke: {exc}")
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
            node = self.nodes.get(msg.executor_id)
            reason = self._refusal(msg, node) or ("" if node is not None else "unknown executor id")
            if not reason and node is not None:
                node.address = f"{msg.host}:{msg.port}"
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
                [n.role for n in self.nodes.values()], {i: n.address for i, n in self.nodes.items()}
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
                msg = m.recv_message(conn, m.NodeUp, m.NodeExit, m.Heartbeat, m.NodeEvent)
            except TimeoutError:
                self._lost(
                    node, f"no heartbeat from its supervisor for {self.heartbeat_timeout:g}s (executor lost or hung?)"
                )
                return
            if self._record(node, msg):
                return

    def _record(self, node: NodeState, msg: m.Message) -> bool:
        """Note one message from a node's supervisor; True once the node has exited."""
        if isinstance(msg, m.Heartbeat):
            return False
        with self._cond:
            if isinstance(msg, m.NodeUp):
                node.up = msg
            elif isinstance(msg, m.NodeEvent):
                self.events.append((node, msg))
            elif isinstance(msg, m.NodeExit):
                node.exit = msg
                node.finished_at = time.time()
            self._cond.notify_all()
        return isinstance(msg, m.NodeExit)

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
                    self._lost(node, f"heartbeat to its supervisor failed: {exc}")
                    conn.close()

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

    def stop_node(self, node: NodeState, grace_secs: float) -> None:
        """Ask a node's supervisor to stop its TF process; no-op if it has already gone."""
        if node.conn is None or node.finished:
            return
        with contextlib.suppress(OSError):
            m.send_message(node.conn, m.Stop(grace_secs))

    def events_since(self, index: int) -> list[tuple[NodeState, m.NodeEvent]]:
        """Events nodes reported, from the ``index``-th on (pass the count already seen)."""
        with self._cond:
            return self.events[index:]

    def close(self) -> None:
        """Stop serving: close every connection, release every waiter, stop the heartbeats."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._stopping.set()
        self._listener.close()
        for node in self.nodes.values():
            if node.conn is not None:
                node.conn.close()
        if self._beat is not threading.current_thread():
            self._beat.join(2.0)
