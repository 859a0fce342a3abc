"""A window of consecutive ports free on this host, for tests of the ``port_range`` setting."""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack

from tfonspark import ports


def free_range(count: int, low: int = 20000, high: int = 32000) -> str:
    """``"a-b"``: ``count`` consecutive ports that can all be reserved now (below Linux's
    ephemeral ports, so a random port of another test rarely lands inside); another process may
    still take one before the test binds it."""
    for _ in range(200):
        start = random.randrange(low, high - count)
        with ExitStack() as held:
            try:
                for port in range(start, start + count):
                    held.enter_context(ports.reserve_port(port))
            except OSError:
                continue
        return f"{start}-{start + count - 1}"
    raise RuntimeError(f"no {count} consecutive free ports between {low} and {high}")


def listening(port: int, host: str = "127.0.0.1") -> socket.socket:
    """A socket listening at ``host:port`` (the caller closes it)."""
    sock = socket.socket()
    sock.bind((host, port))
    sock.listen(1)
    return sock
