"""Free TCP ports on 127.0.0.1, for tests and demos that must name a port before a server binds it."""

from __future__ import annotations

import socket
from contextlib import ExitStack

__all__ = ["free_ports"]


def free_ports(count: int = 1) -> list[int]:
    """``count`` distinct ports that are free now.

    All are held open together while they are picked, so none repeats; another process may still
    take one before the caller binds it.
    """
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
