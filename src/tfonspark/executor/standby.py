"""Restarting a worker's TF server in place: its port held throughout, and a standby TF process.

A worker that only serves (``ps_cluster``, ``run(..., coordinator=True)``) and dies is started
again at the same address by its supervisor (:mod:`.supervisor`). Two things make that fast and
safe:

* The port is never free. The supervisor keeps its own copy of the node's reservation for the
  node's whole life (``host.reserve_port``: no ``SO_REUSEADDR``), and each TF process of the
  node gets that same socket as its ``port_fd``: its server binds beside it as at the first
  start (:mod:`tfonspark.tfprocess.server`), and once the server listens the reservation is
  sealed again (``host.seal_port``). So when the server dies, the reservation still holds the
  port, against sockets with ``SO_REUSEADDR`` or without, until the next server binds beside it
  (issue 43: binding the port again after the death let another user's ``SO_REUSEADDR`` socket
  take it in the gap, at once). A socket with the option can still bind in TF's own start of
  the new server, as at the first start.
* A :class:`Standby` is the next TF process, started once the server accepts: TensorFlow
  imported, waiting on stdin for its bootstrap, holding the reservation as its ``port_fd``
  already. At a restart the supervisor writes the bootstrap, so the new server starts without
  a new interpreter importing TensorFlow (5-10 s of the restart on a busy host). It costs one
  idle TF process per worker; the ``spare_processes`` setting off, none is started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

from ..host import remove_scratch

__all__ = ["WARM_CODE", "Standby", "wait_accepting"]

_PROBE_SECS = 0.05  # between connection attempts to a restarting server

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
    """A started TF process waiting for its bootstrap; ``port_fd`` is the node's reservation in it.

    ``status_fd`` is the write end of its status pipe as numbered in it; ``status_r`` our read end.
    """

    proc: subprocess.Popen[bytes]
    port_fd: int
    status_r: int
    status_fd: int
    scratch: str

    def alive(self) -> bool:
        return self.proc.poll() is None

    def discard(self) -> None:
        """Stop it (its whole process group) and free what it holds (the port stays the supervisor's)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        with contextlib.suppress(OSError):
            os.close(self.status_r)
        remove_scratch(self.scratch)


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
