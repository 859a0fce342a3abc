"""Where a node runs: its executor's identity, its reachable address, and its reserved port."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import ipaddress
import os
import shutil
import socket
import sys
from typing import NamedTuple

__all__ = [
    "SCRATCH_PREFIX",
    "Listener",
    "bind_address",
    "foreign_listeners",
    "process_alive",
    "executor_key",
    "executor_pid",
    "is_wildcard",
    "local_ip_towards",
    "remove_scratch",
    "reserve_port",
    "seal_port",
    "share_port",
]


def is_wildcard(host: str) -> bool:
    """True for an address that means "every interface": never one to advertise to peers."""
    address = host.strip().removeprefix("[").removesuffix("]")
    try:
        return not address or ipaddress.ip_address(address).is_unspecified
    except ValueError:  # a host name
        return False


def executor_key() -> str:
    """A key shared by all Python workers of one Spark executor, distinct between executors.

    Spark gives every executor JVM its own block-manager directory and passes it to its Python
    workers as ``SPARK_LOCAL_DIRS``; together with the host name it identifies the executor even
    when several executors share a host. Outside Spark, the process id stands in.
    """
    local_dirs = os.environ.get("SPARK_LOCAL_DIRS") or f"pid-{os.getpid()}"
    raw = f"{socket.gethostname()}|{local_dirs}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def local_ip_towards(peer_host: str) -> str:
    """The local address this host uses to reach ``peer_host`` (no packet is sent).

    ``SPARK_LOCAL_IP`` wins when it names one address; a wildcard there is a bind setting, not
    an address peers can reach, so it is ignored.
    """
    configured = os.environ.get("SPARK_LOCAL_IP", "")
    if configured and not is_wildcard(configured):
        return configured
    family = socket.AF_INET6 if ":" in peer_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((peer_host, 9))
            found = str(probe.getsockname()[0])
            if not is_wildcard(found):
                return found
        except OSError:
            pass
    return socket.gethostbyname(socket.gethostname())


def bind_address(bind_host: str, advertised: str) -> str:
    """Where a node's servers bind: ``bind_host`` (``NodeConfig.bind_host``) or, when that is
    empty, the node's advertised address. Peers are always told ``advertised``."""
    return bind_host or advertised


def reserve_port(port: int = 0, ipv6: bool = True) -> socket.socket:
    """Bind (without listening) a TCP port so no other process takes it before TF does.

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
    started, that nobody else got the port in TF's own window (``tfprocess/server.py``).
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


#: prefix of a TF process's private temp directory (its TMPDIR), made by its supervisor
SCRATCH_PREFIX = "tfos-node-"


def remove_scratch(path: str) -> None:
    """Remove a TF process's private temp directory (only one named by SCRATCH_PREFIX)."""
    if path and os.path.basename(path.rstrip(os.sep)).startswith(SCRATCH_PREFIX):
        shutil.rmtree(path, ignore_errors=True)


def _proc_field(pid: int, name: str) -> str:
    """``/proc/<pid>/<name>`` as text ("" where unreadable or not Linux)."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after "pid (comm)": state, ppid, ... ([] where unreadable)."""
    return _proc_field(pid, "stat").rsplit(")", 1)[-1].split()


def _parent_of(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else 0


def executor_pid() -> int:
    """The pid of the Spark JVM this Python worker serves (its parent, or pyspark.daemon's), else 0.

    A node's processes run in their own session so a finished Spark task does not take them
    down; the supervisor watches this pid instead, so that they go when their executor goes.
    """
    pid = os.getppid()
    for _ in range(2):
        if pid <= 1:
            return 0
        cmdline = _proc_field(pid, "cmdline")
        if "java" in cmdline and "org.apache.spark" in cmdline:
            return pid
        pid = _parent_of(pid)
    return 0


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, killed but not yet reaped, does not): the
    supervisor's Spark executor, an adopted spare TF process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _stat_fields(pid)[:1] != ["Z"]
