"""Restarting a worker's TF server in place: its port reserved again, and a standby TF process.

A worker that only serves (``ps_cluster``, ``run(..., coordinator=True)``) and dies is started
again at the same address by its supervisor (:mod:`.supervisor`). Two things make that fast and
safe:

* :func:`bind_again` reserves the dead server's port again. The server's connections linger
  (``TIME_WAIT``, ``FIN_WAIT``), which a bind without ``SO_REUSEADDR`` refuses; so it binds with
  the option, then turns it off on the bound socket, after which no other socket, with the
  option or not, binds the port beside it (Linux). The hand-over to the new server then works as
  at the first start (:mod:`tfonspark.tfprocess.server`).
* A :class:`Standby` is the next TF process, started once the server accepts: TensorFlow
  imported, waiting on stdin for its bootstrap, holding an unbound socket as its ``port_fd``.
  At a restart the supervisor binds its own copy of that socket (the same socket: the standby's
  descriptor is bound with it) and writes the bootstrap, so the new server starts without a
  new interpreter importing TensorFlow (5-10 s of the restart on a busy host). It costs one idle
  TF process per worker; the ``spare_processes`` setting off, none is started.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

from ..host import remove_scratch

__all__ = ["REBIND_SECS", "WARM_CODE", "Standby", "bind_again", "reserve_again", "unbound_socket", "wait_accepting"]

REBIND_SECS = 5.0  # how long a restart tries to bind its port again (a dying process group may hold it)
_PROBE_SECS = 0.05  # between tries, and between connection attempts to a restarting server

#: what a standby runs: TensorFlow imported first, then the TF process's entry, which waits for its
#: bootstrap. A supervisor that dies first leaves EOF instead: the standby then removes its TMPDIR
#: (the entry's own clean-up starts only after the bootstrap) and exits.
WARM_CODE = """\
import os, runpy
import tfonspark.tfimport
tfonspark.tfimport.prepare_tensorflow_import()
import tensorflow
try:
    runpy.run_module("tfonspark.tfprocess.entry", run_name="__main__", alter_sys=True)
except BaseException:
    from tfonspark.host import remove_scratch
    remove_scratch(os.environ.get("TMPDIR", ""))
    raise
"""


@dataclass
class Standby:
    """A started TF process waiting for its bootstrap; ``sock`` is its ``port_fd``, unbound until a restart.

    ``status_fd`` is the write end of its status pipe as numbered in it; ``status_r`` our read end.
    """

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    status_r: int
    status_fd: int
    scratch: str

    def alive(self) -> bool:
        return self.proc.poll() is None

    def discard(self) -> None:
        """Stop it (its whole process group) and free what it holds."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.sock.close()
        with contextlib.suppress(OSError):
            os.close(self.status_r)
        remove_scratch(self.scratch)


def unbound_socket() -> socket.socket:
    """A TCP socket for a reservation: ``[::]`` dual-stack where the host can have it, else IPv4."""
    v6only = getattr(socket, "IPV6_V6ONLY", None)
    if socket.has_ipv6 and v6only is not None:
        with contextlib.suppress(OSError):
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.IPPROTO_IPV6, v6only, 0)
                if not sock.getsockopt(socket.IPPROTO_IPV6, v6only):
                    return sock
            except OSError:
                pass
            sock.close()
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM)


def bind_again(sock: socket.socket, port: int, wait: float = REBIND_SECS) -> None:
    """Bind ``sock`` (from :func:`unbound_socket`) to ``port``, which a server that just died held.

    Retried for up to ``wait`` seconds while the port is in use; then ``EADDRINUSE`` is raised.
    """
    address = "::" if sock.family == socket.AF_INET6 else "0.0.0.0"
    deadline = time.monotonic() + wait
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the dead server's connections
    while True:
        try:
            sock.bind((address, port))
            break
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise
        time.sleep(_PROBE_SECS)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)  # and no one binds it beside us


def reserve_again(port: int, wait: float = REBIND_SECS) -> socket.socket:
    """A new inheritable socket bound to ``port`` by :func:`bind_again` (no standby to hand it to)."""
    sock = unbound_socket()
    try:
        bind_again(sock, port, wait)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)  # handed to the TF process, as at the first start
    return sock


def wait_accepting(address: tuple[str, int], timeout: float, done: threading.Event) -> bool:
    """Whether ``address`` accepts a TCP connection within ``timeout`` (False at once once ``done``)."""
    deadline = time.monotonic() + timeout
    while not done.is_set() and time.monotonic() < deadline:
        try:
            with socket.create_connection(address, timeout=1):
                return True
        except OSError:
            done.wait(_PROBE_SECS)
    return False
