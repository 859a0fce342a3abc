"""Where a node runs: its executor's identity, its reachable address, and its reserved port."""

from __future__ import annotations

import hashlib
import os
import socket

__all__ = ["executor_key", "local_ip_towards", "reserve_port"]


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
    """The local address this host uses to reach ``peer_host`` (no packet is sent)."""
    if os.environ.get("SPARK_LOCAL_IP"):
        return os.environ["SPARK_LOCAL_IP"]
    family = socket.AF_INET6 if ":" in peer_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((peer_host, 9))
            return str(probe.getsockname()[0])
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def reserve_port(port: int = 0) -> socket.socket:
    """Bind (without listening) a TCP port so no other process takes it before TF does.

    The socket is inheritable so the TF process can hold it until it releases the port.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("", port))
    sock.set_inheritable(True)
    return sock
