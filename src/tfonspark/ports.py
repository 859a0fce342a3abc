"""A node's port, from its reservation to the server that serves on it (driver, executor and
TF process alike): reserving it, sharing and sealing it, passing it to another process, handing
it to TF's server in this process, checking who else listens on it, and the other binds.

**The reservation** (:func:`reserve_port`): the supervisor binds the node's port without
listening and without ``SO_REUSEADDR``/``SO_REUSEPORT``, on one dual-stack ``[::]`` socket
wherever the host has IPv6 (else ``0.0.0.0``): nobody else can bind it on any address.
:func:`share_port` and :func:`seal_port` are the one place that option is turned on and off:
on for the moment a server binds beside the reservation, off once it listens.

**To another process** (:func:`send_port`, :func:`receive_port`): the reservation itself passes
(``SCM_RIGHTS``) to the warm TF process that serves the port next (``executor/warm.py``), never
closed and bound again, so no other process can take the port in between.

**The hand-over to TF's server.** Releasing the reservation before ``map_fun`` runs, as TFoS
did, left it free for seconds (unpickling, imports, model set-up) until TF's server bound it,
and another local user spinning on ``bind()`` took it. TF cannot take over a bound socket, and
it turns ``SO_REUSEPORT`` off for its gRPC server (``NoReusePortOption`` in
``grpc_server_lib.cc``): TF 2.21 binds ``[::]:port`` with ``SO_REUSEADDR`` only (checked with
strace). So :func:`hand_over_port` keeps the reservation and hooks the calls where TF starts a
server (``TF_NewServer``: ``tf.distribute.Server``; ``TFE_EnableCollectiveOps``:
``MultiWorkerMirroredStrategy``; ``TFE_ContextSetServerDef*`` and ``TFE_ContextUpdateServerDef*``:
``connect_to_cluster``, ``ParameterServerStrategy``'s coordinator), plus ``socket.bind`` of the
port from Python. Right before such a call it sets ``SO_REUSEADDR`` on the reservation, so the
server's socket (which sets it too) can bind the port while the reservation still holds it, and
closes the reservation once the call returns.

What that leaves, on Linux: a socket *without* ``SO_REUSEADDR`` can never bind the port
before the server has it (no gap; it could for 7-12 s before, from the release ahead of
``map_fun`` to TF's bind). A socket *with* ``SO_REUSEADDR``, any user's, can in one window,
which no code of ours can close: from the start of that TF call to the server's ``listen()``,
TF's own set-up before it binds (TF binds the wildcard ``0.0.0.0:port``, which gRPC makes
``[::]:port``, with no option for another address; our reservation cannot stay exclusive, nor
listen, and still let TF's socket bind beside it). Measured with strace (TF 2.21 on CPU, 2
shared cores at load 2-5): 6-64 ms from our ``SO_REUSEADDR`` to TF's ``listen`` for
``tf.distribute.Server`` and for MWMS (on a GPU node ``tf.distribute.Server`` also creates its
GPU devices in it). Another user spinning on ``bind()`` + ``listen()`` with the option, at the
node's own priority, one process per address, gets in nearly every time: in 7 of 8 starts
(4 ``tf.distribute.Server``, 4 MWMS) and in 8 of 8 in a second series
(``tests/integration/test_port_handover.py``). What it got, before: TF's server failed ("Could
not start gRPC server": 6 of 8, no word of who holds the port), or, on ``[::1]`` (an address
TF's ``[::]`` socket then leaves to it: gRPC falls back to ``0.0.0.0``), TF started beside it
and it had the ``::1`` peers (1 of 8). Now, right after the call, :func:`_refuse_intruders`
reads who listens on the port (:func:`foreign_listeners`) and fails the node with a
``ClusterError`` that names each other listener and its user: 8 of 8, none served beside one.
Peers that connected to the intruder before the node's failure stopped the cluster still
reached it; only running each job where no other user has processes closes that
(docs/architecture.md, "Ports and binds"). Once TF listens the reservation is sealed again
(:func:`seal_port`) and closed. The reservation never sets ``SO_REUSEPORT``, so outside that
window no socket of another user gets in; a process of the *same* user can always take the
port (it could also ptrace the node). The first TF server started in the process takes the
port, whatever port it binds, and so does a Python ``bind()`` of the port; a server started any
other way (a child process, a library outside Python and TF) needs ``ctx.release_port(now=True)``.

**Other binds**: :func:`listen_reusable` is the rendezvous server's listening socket
(``SO_REUSEADDR``, so that a fixed ``server_port`` binds again while the last attempt's
connections are in TIME-WAIT). Whether a server listens yet is :mod:`tfonspark.probes`' question.

**The port range** (the ``port_range`` setting, for a firewall): every server of tfonspark and
of its TF processes takes its port from it, on its own host: :func:`reserve_port` and
:func:`bind_within` try each port of the range in turn, from its low end, until one binds, so
two servers on one host (two nodes on one executor host, a node beside the driver) never
collide, whatever order they start in, and they skip a port this process holds for a TF
server (:func:`held_for_servers`: the coordinator's, reserved before the rendezvous server
binds); :func:`free_port_within` finds one for a server that binds it itself (TensorBoard). A range with no port left is a
:class:`~tfonspark.errors.ConfigError` naming the setting, the range, the host and what needed
the port (:func:`range_exhausted`). A TF process confines itself once, from its ``NodeConfig``
(:func:`confine`): its listeners that are not given a range take this one (:func:`confined`).
docs/ports.md lists every port.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any, NamedTuple

from . import settings
from .errors import ClusterError, ConfigError
from .importhook import AfterImport

__all__ = [
    "PORT_RANGE_KEYS",
    "SERVER_STARTS",
    "Listener",
    "PortHandover",
    "bind_within",
    "confine",
    "confined",
    "foreign_listeners",
    "free_port_within",
    "hand_over_port",
    "held_for_servers",
    "listen_reusable",
    "pending_handovers",
    "range_exhausted",
    "range_ports",
    "receive_port",
    "release_handovers",
    "reserve_port",
    "seal_port",
    "send_port",
    "share_port",
]

_log = logging.getLogger(__name__)

_PORT_MESSAGE = b"P"  # what comes with a port's socket on a Unix socket (send_port)


# ---- the port range -------------------------------------------------------------------------------

#: how the setting is given, for the errors that name it
PORT_RANGE_KEYS = "port_range (spark.tfonspark.portRange, TFONSPARK_PORT_RANGE)"

#: errors of a bind that mean "this port is taken here, try the next one"
_TAKEN = (errno.EADDRINUSE, errno.EACCES)


class _Confined:
    port_range = ""  #: this process's range (a TF process's ``NodeConfig.port_range``); "": none


def confine(port_range: str) -> None:
    """Confine this process's listeners that are given no range of their own to ``port_range``
    (a TF process does, from its ``NodeConfig``; ``""``: any free port). ConfigError for a bad one."""
    _Confined.port_range = settings.check("port_range", port_range)


def confined() -> str:
    """The range :func:`confine` set for this process (``""``: none)."""
    return _Confined.port_range


def range_ports(port_range: str) -> list[int]:
    """The ports of ``port_range``, low to high; ``[0]`` (any free port) where it is ``""``."""
    low, high = settings.port_range(settings.check("port_range", port_range))
    return list(range(low, high + 1))


def range_exhausted(port_range: str, what: str, error: BaseException | None = None) -> ConfigError:
    """The ConfigError of a range that has no free port left on this host for ``what``."""
    ports = range_ports(port_range)
    size = f"its {len(ports)} ports are" if len(ports) > 1 else "its one port is"
    why = f" (the last bind: {error})" if error is not None else ""
    return ConfigError(
        f"port_range {port_range!r} has no free port left for {what} on host {socket.gethostname()}: "
        f"{size} taken there{why}. Every server of the cluster on one host takes its own port of the "
        f"range (docs/ports.md); widen the range with {PORT_RANGE_KEYS}"
    )


def bind_within(sock: socket.socket, host: str, what: str, port_range: str | None = None) -> int:
    """Bind ``sock`` to ``host`` at the first port of ``port_range`` free on this host; its port.

    ``port_range``: None = this process's (:func:`confined`); ``""`` = any free port. The socket
    keeps its options (a listener without ``SO_REUSEADDR`` never takes a port another socket
    holds, a node's reservation or a TIME-WAIT connection included). ConfigError naming the
    range and ``what`` where every port of it is taken (:func:`range_exhausted`).
    """
    spec = confined() if port_range is None else port_range
    last: OSError | None = None
    held = held_for_servers()
    for port in range_ports(spec):
        if port in held:  # reserved in this process for a TF server: the hook would hand it over
            continue
        try:
            sock.bind((host, port))
        except OSError as exc:
            if not spec or exc.errno not in _TAKEN:
                raise
            last = exc
            continue
        return int(sock.getsockname()[1])
    raise range_exhausted(spec, what, last)


def free_port_within(host: str, what: str, port_range: str | None = None) -> int:
    """A port of ``port_range`` free on ``host`` now, for a server that binds it itself (TensorBoard).

    Another process may take it before that server binds it: the caller tries the next one then.
    ``port_range`` as for :func:`bind_within`.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        return bind_within(probe, host.strip("[]") or "0.0.0.0", what, port_range)


# ---- the reservation ------------------------------------------------------------------------------
def reserve_port(port: int = 0, ipv6: bool = True, *, port_range: str = "", what: str = "a port") -> socket.socket:
    """Bind (without listening) a TCP port so no other process takes it before TF does.

    ``port`` 0 with a ``port_range`` (the setting): the first port of the range that can be
    reserved on this host; ConfigError naming the range and ``what`` where none can
    (:func:`range_exhausted`). A fixed ``port`` is that port, whatever the range.

    The socket binds the wildcard address with neither ``SO_REUSEADDR`` nor ``SO_REUSEPORT``:
    on Linux any other bind of that port, on any local address and whatever options the other
    socket sets, then fails with ``EADDRINUSE`` until the reservation is closed (a socket that
    never listened or connected leaves no TIME_WAIT behind, so TF binds the port right after).

    Where the host has IPv6 it is one dual-stack ``[::]`` socket (``IPV6_V6ONLY`` off), so the
    port is held on both families: an IPv4-only reservation left ``[::1]:port`` to anyone.
    Without IPv6 (no ``AF_INET6``, or a stack that cannot be dual) it holds ``0.0.0.0:port``.
    ``ipv6`` is accepted for older callers and ignored: the reservation covers IPv6 wherever
    the host has it, whatever the node's own address family.

    The socket is inheritable so the TF process can hold it until it hands the port over.
    """
    del ipv6  # both families are held wherever the host can
    if port or not port_range:
        return _reserve(port)
    last: OSError | None = None
    for candidate in range_ports(port_range):
        try:
            return _reserve(candidate)
        except OSError as exc:
            if exc.errno not in _TAKEN:
                raise
            last = exc
    raise range_exhausted(port_range, what, last)


def _reserve(port: int) -> socket.socket:
    """:func:`reserve_port` of one port (0: any free port)."""
    sock = _dual_stack(port)
    if sock is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("0.0.0.0", port))
        except BaseException:
            sock.close()
            raise
    sock.set_inheritable(True)
    return sock


def share_port(sock: socket.socket) -> None:
    """Let a socket that sets ``SO_REUSEADDR`` bind the reservation ``sock``'s port beside it.

    Only for the moment a server is about to bind the port (TF's gRPC server sets the option and
    cannot bind beside a reservation without it); any other user's socket with the option can do
    the same meanwhile. A socket *without* the option still cannot (Linux).
    """
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)


def seal_port(sock: socket.socket) -> None:
    """Let no other socket bind the reservation ``sock``'s port again, whatever its options
    (``SO_REUSEADDR`` off): after :func:`share_port`, once the server that bound it *listens*.

    A server bound beside the reservation but not yet listening could not listen after this
    (Linux checks again at ``listen``), so it comes only after the server's ``listen()``. While
    the server listens, nobody binds the port anyway; this one keeps it so once the server is
    gone, until the next server of the port (a restart in place) takes it.
    """
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)


def _dual_stack(port: int) -> socket.socket | None:
    """``[::]:port`` bound with ``IPV6_V6ONLY`` off, or None where the host cannot have that.

    A port already taken (``EADDRINUSE``) raises: holding only its IPv4 half would not do.
    """
    v6only = getattr(socket, "IPV6_V6ONLY", None)
    if not socket.has_ipv6 or v6only is None:
        return None
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:  # no IPv6 in this kernel
        return None
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, v6only, 0)
        if sock.getsockopt(socket.IPPROTO_IPV6, v6only):
            raise OSError(errno.EOPNOTSUPP, "IPV6_V6ONLY cannot be turned off")
        sock.bind(("::", port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise
        return None
    except BaseException:
        sock.close()
        raise
    return sock


# ---- passing it to another process ----------------------------------------------------------------
def send_port(channel: socket.socket, sock: socket.socket) -> None:
    """Pass ``sock``, a port's socket, to the process at the other end of the Unix socket
    ``channel`` (:func:`receive_port` there). The socket itself passes (``SCM_RIGHTS``): still
    bound, with no moment where the port is free; the caller may close its copy once this
    returns. OSError where that process is gone."""
    socket.send_fds(channel, [_PORT_MESSAGE], [sock.fileno()])


def receive_port(port_fd: int, channel_fd: int = 0) -> bool:
    """Wait for a port's socket (:func:`send_port`) on the Unix socket ``channel_fd`` (a warm TF
    process's stdin) and put it at ``port_fd`` (the number its bootstrap names); False at EOF.

    Reads exactly the one byte the socket comes with, so what follows (the environment line,
    the bootstrap) stays for ``sys.stdin``.
    """
    channel = socket.socket(fileno=channel_fd)
    try:
        message, fds, _, _ = socket.recv_fds(channel, len(_PORT_MESSAGE), 1)
    finally:
        channel.detach()  # the descriptor stays open: the entry reads its bootstrap there
    if message != _PORT_MESSAGE or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return False
    os.dup2(fds[0], port_fd)
    os.close(fds[0])
    return True


# ---- who else listens, who accepts, and the other binds ---------------------------------------


class Listener(NamedTuple):
    """A TCP socket listening on this host (``/proc/net/tcp``, ``tcp6``): its address, owner, inode."""

    address: str
    port: int
    uid: int
    inode: int


def foreign_listeners(port: int) -> list[Listener]:
    """The TCP sockets that listen on ``port`` on this host (its network namespace) and that
    this process does not hold: another process's server beside, or instead of, ours.

    ``[]`` where ``/proc`` cannot tell (not Linux). Used to verify, right after TF's server
    started, that nobody else got the port in TF's own window (:func:`_refuse_intruders`).
    """
    found = [entry for name in ("tcp", "tcp6") for entry in _proc_listeners(name, port)]
    if not found:
        return []
    mine = set()
    try:
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # a descriptor closed while listed
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target.startswith("socket:["):
                    mine.add(int(target[len("socket:[") : -1]))
    except OSError:
        return []
    return [entry for entry in found if entry.inode not in mine]


def _proc_listeners(table: str, port: int) -> list[Listener]:
    """The LISTEN entries (state ``0A``) of ``/proc/net/<table>`` on ``port``."""
    try:
        with open(f"/proc/net/{table}") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split()
        if len(fields) < 10 or fields[3] != "0A":
            continue
        address, _, hex_port = fields[1].partition(":")
        if int(hex_port, 16) != port:
            continue
        raw = bytes.fromhex(address)  # 32-bit words, each printed in host order
        if sys.byteorder == "little":
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
        family = socket.AF_INET6 if len(raw) == 16 else socket.AF_INET
        out.append(Listener(socket.inet_ntop(family, raw), port, int(fields[7]), int(fields[9])))
    return out


def listen_reusable(host: str, ports: Iterable[int], backlog: int) -> socket.socket:
    """A socket listening on ``host`` at the first of ``ports`` it can bind (``0``: any free port).

    ``SO_REUSEADDR`` lets a fixed port be bound again while connections of the last server on it
    are in TIME-WAIT (the rendezvous server of a restarted cluster). On POSIX it never lets two
    live listeners share a port, nor takes a port another socket holds without the option (a
    node's reservation); ``SO_REUSEPORT``, which would, is never set. Raises the last OSError
    where no port of ``ports`` can be had.
    """
    last: OSError = OSError(errno.EINVAL, "no port to listen on")
    held = held_for_servers()
    for port in ports:
        if port and port in held:  # this process holds it for a TF server (the coordinator's)
            last = OSError(errno.EADDRINUSE, f"port {port} is reserved in this process for a TF server")
            continue
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
    raise last


# ---- the hand-over to TF's server in this process ------------------------------------------------

#: where TF 2.x starts a gRPC server, by module: every call TF's Python makes to one of these
#: goes through the module attribute (``pywrap_tfe.X(...)``, ``c_api.X(...)``), so replacing the
#: attribute sees it. The first name of each module must exist, else the hand-over cannot see
#: that TF's server start and the port is released at once (the old behaviour) with a warning.
SERVER_STARTS: dict[str, tuple[str, ...]] = {
    "tensorflow.python.client.pywrap_tf_session": ("TF_NewServer",),
    "tensorflow.python.pywrap_tfe": (
        "TFE_EnableCollectiveOps",
        "TFE_ContextSetServerDef",
        "TFE_ContextSetServerDefWithTimeout",
        "TFE_ContextSetServerDefWithTimeoutAndRetries",
        "TFE_ContextUpdateServerDef",
        "TFE_ContextUpdateServerDefWithTimeout",
    ),
}


class PortHandover:
    """A node's reserved port, held until a server in this process binds it (see the module doc)."""

    def __init__(self, sock: socket.socket) -> None:
        self.port: int = sock.getsockname()[1]
        self._sock: socket.socket | None = sock
        self._lock = threading.Lock()

    def share_with_server(self) -> None:
        """Let a socket that sets ``SO_REUSEADDR`` bind the port too (a server about to bind it)."""
        with self._lock:
            if self._sock is not None:
                share_port(self._sock)

    def release(self, listening: bool = False) -> None:
        """Close the reservation (idempotent); the last one released removes the hooks.

        ``listening``: the server that took the port listens now, so the reservation is sealed
        first (:func:`seal_port`): where the supervisor holds it too (a worker that restarts in
        place), nobody else binds the port once the server is gone. Not after a Python
        ``bind()``: its socket listens only later, and could not beside a sealed reservation.
        """
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is None:
            return
        if listening:
            seal_port(sock)
        sock.close()
        _forget(self)


def hand_over_port(sock: socket.socket) -> PortHandover:
    """Hold ``sock``'s port until this process's TF server (or a Python ``bind``) takes it.

    Takes ownership of ``sock``: it is closed here and a private, non-inheritable duplicate
    holds the port (children forked from Python close theirs at once). Returns the hand-over;
    its ``release()`` frees the port now.
    """
    try:
        held = sock.dup()  # not inheritable: a child process would keep the port from TF's server
    except OSError:  # no descriptor to spare: hold the original
        sock.set_inheritable(False)
        held = sock
    else:
        sock.close()
    handover = PortHandover(held)
    with _state.lock:
        _state.pending.append(handover)
        _install()
    _patch_loaded_modules()
    return handover


def pending_handovers() -> list[PortHandover]:
    """The reservations this process still holds for a server."""
    with _state.lock:
        return list(_state.pending)


def held_for_servers() -> set[int]:
    """The ports this process reserved for a server of its own (:func:`hand_over_port`).

    tfonspark's own listeners skip them when they look for a free port of a range
    (:func:`bind_within`, :func:`listen_reusable`): a Python ``bind()`` of such a port while it
    is pending gets it (the hand-over's hook), and the driver's rendezvous server, which binds
    after the coordinator's port is reserved, took that port from ``ParameterServerStrategy``'s
    server, which then failed with "Could not start gRPC server".
    """
    return {h.port for h in pending_handovers()}


def release_handovers() -> None:
    """Free every port still held for a server (a server that was just started has it)."""
    for handover in pending_handovers():
        handover.release()


# ---- the hooks: installed while a hand-over is pending, removed with the last one ----------------


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pending: list[PortHandover] = []
        self.patched: list[tuple[Any, str, Any]] = []  # (owner, attribute, the original)
        self.finder: AfterImport | None = None
        self.bind: Callable[[socket.socket, Any], None] = socket.socket.bind  # the bind that was there
        self.at_fork = False


_state = _State()


def _install() -> None:
    """Hook Python's ``socket.bind`` and TF's modules as they load (with ``_state.lock`` held)."""
    if _state.finder is None:
        _state.finder = AfterImport(SERVER_STARTS, _patch_module)
        _state.finder.install()
        _state.bind = socket.socket.bind
        _patch(socket.socket, "bind", _python_bind)
    if not _state.at_fork:
        _state.at_fork = True
        os.register_at_fork(after_in_child=_forget_all_in_child)


def _forget(handover: PortHandover) -> None:
    with _state.lock:
        if handover in _state.pending:
            _state.pending.remove(handover)
        if not _state.pending:
            _uninstall()


def _uninstall() -> None:
    """Put back every attribute replaced (with ``_state.lock`` held), unless replaced again since."""
    for owner, name, original in reversed(_state.patched):
        current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if getattr(current, "_tfos_handover", False):
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
    _state.patched.clear()
    if _state.finder is not None:
        _state.finder.remove()
        _state.finder = None


def _forget_all_in_child() -> None:
    """In a child forked from Python: close its copies of the reservations (never the parent's).

    Locks another thread held at the fork stay held in the child: they are made anew first."""
    _state.lock = threading.RLock()
    for handover in _state.pending:
        handover._lock = threading.Lock()
    release_handovers()


_ABSENT = object()


def _patch(owner: Any, name: str, replacement: Callable[..., Any]) -> None:
    original = owner.__dict__.get(name, _ABSENT) if isinstance(owner, type) else getattr(owner, name)
    replacement._tfos_handover = True  # type: ignore[attr-defined]
    setattr(owner, name, replacement)
    _state.patched.append((owner, name, original))


def _python_bind(sock: socket.socket, address: Any) -> None:
    """``socket.socket.bind`` while a hand-over is pending: a bind of the held port gets it."""
    original = _state.bind
    handovers = [h for h in pending_handovers() if sock.family in _INET and _port_of(address) == h.port]
    if not handovers:
        original(sock, address)
        return
    for handover in handovers:
        handover.share_with_server()
    try:
        original(sock, address)  # co-binds where ``sock`` sets SO_REUSEADDR: no gap
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        for handover in handovers:  # a socket without SO_REUSEADDR: free the port right before
            handover.release()
        original(sock, address)
    finally:
        for handover in handovers:
            handover.release()


_INET = (socket.AF_INET, socket.AF_INET6)


def _port_of(address: Any) -> int | None:
    if isinstance(address, tuple) and len(address) >= 2 and isinstance(address[1], int):
        return address[1]
    return None


def _server_start(start: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``start`` (a TF call that creates and binds a gRPC server) with the hand-over around it."""

    def handing_over(*args: Any, **kwargs: Any) -> Any:
        handovers = pending_handovers()
        for handover in handovers:
            handover.share_with_server()
        shared = time.monotonic()
        try:
            started = start(*args, **kwargs)
        except BaseException as exc:
            _refuse_intruders(handovers, name, exc)
            raise
        finally:
            for handover in handovers:
                handover.release(listening=True)
            if handovers:
                ms = (time.monotonic() - shared) * 1000
                _log.debug(
                    "port(s) %s handed over to TF's server (%s): shared %.1f ms", [h.port for h in handovers], name, ms
                )
        _refuse_intruders(handovers, name, None)
        return started

    handing_over.__name__ = getattr(start, "__name__", name)
    handing_over.__doc__ = getattr(start, "__doc__", None)
    return handing_over


def _refuse_intruders(handovers: Sequence[PortHandover], name: str, error: BaseException | None) -> None:
    """Raise ClusterError where another process listens on a port just handed to TF's server.

    TF's own start leaves a window (the module doc): a socket with ``SO_REUSEADDR`` that binds
    and listens in it either makes TF's server fail (``error``: named here, with who took the
    port) or, on an address TF's does not cover (``[::1]`` when TF falls back to ``0.0.0.0``),
    serves beside it. Either way the node must not go on: peers would reach the other process.
    """
    for handover in handovers:
        others = foreign_listeners(handover.port)
        if others:
            raise ClusterError(
                f"another process also listens on this node's port {handover.port}: {_named(others)}. It took "
                f"the port in the milliseconds of TensorFlow's own server start ({name}), where TF's "
                "SO_REUSEADDR lets any local user's SO_REUSEADDR socket bind beside ours; the node refuses to "
                "run beside it, since its peers would reach that process. Run each job's executors where no "
                "other user has processes (their own user and host, or a container with its own network "
                "namespace): see docs/architecture.md, Ports and binds"
                + (f". TensorFlow's own error: {error}" if error is not None else "")
            ) from error


def _named(listeners: Sequence[Listener]) -> str:
    """``[::1]:8470 (uid 65534), 0.0.0.0:8470 (uid 0)``."""
    where = (f"[{x.address}]" if ":" in x.address else x.address for x in listeners)
    return ", ".join(f"{address}:{x.port} (uid {x.uid})" for address, x in zip(where, listeners, strict=True))


def _patch_module(module: ModuleType) -> None:
    """Hook TF's server starts in ``module`` (one of :data:`SERVER_STARTS`)."""
    names: Sequence[str] = SERVER_STARTS.get(module.__name__, ())
    with _state.lock:
        if not _state.pending:
            return
        if any(owner is module for owner, _, _ in _state.patched):
            return
        if not names or not callable(getattr(module, names[0], None)):
            missing = True
        else:
            missing = False
            for name in names:
                start = getattr(module, name, None)
                if callable(start):
                    _patch(module, name, _server_start(start, name))
    if missing:  # a TF whose server start we cannot see: free the port rather than block its server
        _log.warning(
            "%s has no %s: cannot hand the node's port to TF's server as it binds; releasing it now",
            module.__name__,
            names[0] if names else "server start",
        )
        release_handovers()


def _patch_loaded_modules() -> None:
    for name in SERVER_STARTS:
        module = sys.modules.get(name)
        if module is not None:
            _patch_module(module)
