"""Whether a server listens yet: one address (:func:`accepts`, :func:`wait_accepting`) or every
task of a cluster spec (:func:`servers_accepting`, :func:`wait_for_servers`).

Base layer: the driver (``ps_cluster``, ``data_service``: return once every server listens),
the supervisor (a restarted server accepts again) and the TF process (the coordinator waits for
its ps and workers, a tf.data worker for its dispatcher) all ask it. A probe is a plain TCP
connect that is closed at once; it reads nothing and sends nothing.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from .errors import ReservationTimeout

__all__ = ["accepts", "servers_accepting", "wait_accepting", "wait_for_servers"]

_PROBE_SECS = 0.05  # between connection attempts to a server that (re)starts
_SPEC_PROBE_SECS = 0.1  # between rounds over a cluster spec's servers while they start


def accepts(address: tuple[str, int], timeout: float = 1.0) -> bool:
    """Whether ``address`` (a host, brackets allowed, and a port) accepts a TCP connection now."""
    try:
        with socket.create_connection((address[0].strip("[]"), address[1]), timeout=timeout):
            return True
    except OSError:
        return False


def wait_accepting(address: tuple[str, int], timeout: float, done: threading.Event) -> bool:
    """Whether ``address`` accepts a TCP connection within ``timeout`` (False at once once ``done``)."""
    deadline = time.monotonic() + timeout
    while not done.is_set() and time.monotonic() < deadline:
        if accepts(address):
            return True
        done.wait(_PROBE_SECS)
    return False


def servers_accepting(spec: Mapping[str, Sequence[str]], jobs: Sequence[str] = ("ps", "worker")) -> dict[str, bool]:
    """For each task of ``jobs`` (``"worker:0"``), whether its address accepts a TCP connection now."""
    out = {}
    for job in jobs:
        for index, address in enumerate(spec.get(job, ())):
            host, _, port = address.rpartition(":")
            out[f"{job}:{index}"] = accepts((host, int(port)), timeout=2)
    return out


def wait_for_servers(
    spec: Mapping[str, Sequence[str]], timeout: float, failed: Callable[[], object] = lambda: False
) -> None:
    """Wait until every ps and worker server of ``spec`` listens, or until ``failed()`` says a node
    failed (the caller then raises that); raise ReservationTimeout naming the others after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not failed():
        accepting = servers_accepting(spec)
        waiting = [task for task, ok in accepting.items() if not ok]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise ReservationTimeout(
                f"the TensorFlow servers of {', '.join(waiting)} did not accept connections within {timeout:.0f}s "
                "(raise reservation_timeout, or check the executor logs)",
                registered=len(accepting) - len(waiting),
                required=len(accepting),
            )
        time.sleep(_SPEC_PROBE_SECS)
