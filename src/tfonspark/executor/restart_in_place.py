"""Restarting a worker's TF server in place: its port held throughout, and a standby TF process.

A worker that only serves (``ps_cluster``, ``run(..., coordinator=True)``) and dies is started
again at the same address by its supervisor (:mod:`.supervisor`). Two things make that fast and
safe:

* The port is never free. The supervisor keeps its own copy of the node's reservation for the
  node's whole life (``ports.reserve_port``: no ``SO_REUSEADDR``), and each TF process of the
  node gets that same socket as its ``port_fd``: its server binds beside it as at the first
  start (:mod:`tfonspark.ports`), and once the server listens the reservation is sealed again
  (``ports.seal_port``). So when the server dies, the reservation still holds the port, against
  sockets with ``SO_REUSEADDR`` or without, until the next server binds beside it (issue 43:
  binding the port again after the death let another user's ``SO_REUSEADDR`` socket take it in
  the gap, at once). A socket with the option can still bind in TF's own start of the new
  server, as at the first start.
* The next TF process is a **standby** (a :class:`~.warm.WarmProcess`), started once the server
  accepts: TensorFlow imported, holding the reservation as its ``port_fd`` already (passed to it
  at its start), waiting for its bootstrap. At a restart the supervisor writes the bootstrap, so
  the new server starts without a new interpreter importing TensorFlow (5-10 s of the restart
  on a busy host). It costs one idle TF process per worker; the ``spare_processes`` setting
  off, none is started.

Only a worker killed by a signal and not stopped restarts (:meth:`InPlace.may_restart`): TF's
coordinator re-runs its closures once it accepts again. A ps's variables die with it, and
anything else runs user code: those fail as before. The driver hears of each restart once the
new server accepts (a ``ServerRestarted`` event).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

from ..config import NodeConfig
from ..ports import seal_port
from ..probes import wait_accepting
from ..wire import events as ev
from ..wire import messages as m
from .relay import Relay
from .spawn import Spawner
from .warm import WarmProcess

__all__ = ["SERVER_RESTARTS", "InPlace", "restarts_in_place", "task_address"]

SERVER_RESTARTS = 3
"""How many times a worker that only serves (``ps_cluster``, ``run(..., coordinator=True)``) is
restarted in place at least; ``max_restarts`` raises it (``NodeConfig.server_restarts``)."""

log = logging.getLogger(__name__)


def restarts_in_place(config: NodeConfig, job_name: str) -> bool:
    """Whether a node of ``job_name`` restarts in place (a worker that only serves: it runs
    ``server.serve``, TF's server, never a user's ``bind``), and so its supervisor keeps the
    node's reservation across its TF processes (and keeps no spare: :mod:`.spare`)."""
    return job_name == "worker" and config.server_restarts > 0


def task_address(ready: m.ClusterReady) -> tuple[str, int]:
    """Where this node's server is reached: its address in the cluster spec."""
    host, _, port = ready.cluster_spec[ready.job_name][ready.task_index].rpartition(":")
    return host.strip("[]"), int(port)


class InPlace:
    """A node's restarts in place: how many so far, the reservation it keeps, its standby."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.restarts = 0  # how many times the TF process was restarted in place
        self.held: socket.socket | None = None  # the node's reservation, kept by a worker that restarts in place
        self._standby: WarmProcess | None = None  # the next TF process, once the server accepts
        self._lock = threading.Lock()

    def restartable(self, job_name: str) -> bool:
        """Whether a death of the TF process could still be followed by a restart in place."""
        return job_name == "worker" and self.restarts < self.config.server_restarts

    def may_restart(self, code: int, job_name: str, stop_asked: bool) -> bool:
        """Whether the TF process that just ended (``code``) restarts at its port (the module doc)."""
        if code >= 0 or stop_asked or job_name != "worker":
            return False
        if not self.restartable(job_name):
            if self.config.server_restarts:
                log.error("tfonspark supervisor: TF server died again after %d restart(s): giving up", self.restarts)
            return False
        return True

    def restarted(self) -> WarmProcess | None:
        """Count a restart; the sealed reservation stays; the standby (if alive) is the next TF process."""
        if self.held is not None:
            seal_port(self.held)  # sealed already, unless the server died in its own start
        self.restarts += 1
        return self.take_standby()

    def serving(
        self, ready: m.ClusterReady, spawner: Spawner, standby: bool, done: threading.Event, wanted: Callable[[], bool]
    ) -> None:
        """Once the TF server accepts: seal its port (``ports.seal_port``), then, with ``standby``,
        start its standby (if none waits yet and ``wanted()`` still says one is)."""
        if not wait_accepting(task_address(ready), self.config.reservation_timeout, done):
            return
        held = self.held
        if held is not None:
            with contextlib.suppress(OSError):
                seal_port(held)  # the TF process did, after its server start; a Python bind's does not
        if not standby or held is None:
            return
        with self._lock:
            if self._standby is not None or not wanted():
                return
        try:  # it holds the reservation from its start, as every TF process of the node
            spawned: WarmProcess | None = spawner.warm(ready)
        except OSError as exc:  # no standby: a restart starts a new process, as without one
            log.warning("tfonspark supervisor: cannot start a standby TF process: %s", exc)
            return
        assert spawned is not None
        try:
            spawned.give_port(held)
        except OSError as exc:  # it died at once
            log.warning("tfonspark supervisor: cannot hand the port to the standby TF process: %s", exc)
            spawned.discard()
            return
        with self._lock:
            if self._standby is None and wanted():
                self._standby, spawned = spawned, None
        if spawned is not None:
            spawned.discard()

    def take_standby(self) -> WarmProcess | None:
        """The standby, if one is alive (it then belongs to the caller)."""
        with self._lock:
            standby, self._standby = self._standby, None
        if standby is not None and not standby.alive():
            standby.discard()
            return None
        return standby

    def announce(
        self, relay: Relay, ready: m.ClusterReady, restart: int, code: int, died_at: float, done: threading.Event
    ) -> None:
        """Tell the driver (a ``ServerRestarted`` event) once the server restarted for the
        ``restart``-th time accepts, or gave up."""
        accepting = wait_accepting(task_address(ready), self.config.reservation_timeout, done)
        down_s = round(time.monotonic() - died_at, 3)
        event = ev.ServerRestarted(restart, self.config.server_restarts, code, down_s, accepting)
        log.warning("tfonspark supervisor: TF server %s restarted in place: %s", ready.job_name, event)
        relay.event(event)
