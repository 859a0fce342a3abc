"""What passes through a node's supervisor: the TF process's events and output, the heartbeats,
and the driver's word.

The TF process writes status lines (:mod:`..wire.events`) on a pipe; the supervisor forwards
them to the driver (``ProcessUp`` as ``NodeUp``, each ``NodeEvent`` as it is) and keeps the feed
socket it is told of (``FeedSocket``), to remove it if the TF process dies. What the TF process
writes is bounded before it is relayed: a status line by :data:`MAX_STATUS_LINE`, an event by
:data:`MAX_EVENT_BYTES` (the driver holds every supervisor to the same limit). Its output is teed
into the executor log, its tail kept for the error report. Both ends send a ``Heartbeat`` every
``heartbeat_secs`` from ``ClusterReady`` on; the driver's ``Stop``, a dropped connection, or
silence past ``heartbeat_timeout`` is what stops the node (:meth:`Relay.await_stop`). The Spark
task that spawned the supervisor hears of the node on its stdout (:func:`task_status`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from typing import IO

from ..errors import ProtocolError
from ..wire import events as ev
from ..wire import messages as m
from ..wire.bootstrap import STATUS_PREFIX
from ..wire.framing import Connection

__all__ = ["MAX_EVENT_BYTES", "MAX_STATUS_LINE", "Relay", "status_lines", "task_status", "tee"]

MAX_EVENT_BYTES = 65 * 1024
"""The largest ``NodeEvent`` a supervisor relays and the driver accepts, JSON-encoded as sent: a
report of ``tfprocess.report.MAX_REPORT_BYTES`` (64 KiB) and its envelope (its type). The
supervisor drops a larger one with an error in its log; so does the driver."""
MAX_STATUS_LINE = 1024 * 1024
"""The longest status line read from the TF process (an error's traceback is the longest one
that is legitimate). A longer line is skipped, not read into memory, with an error in the log;
a traceback that long still reaches the driver in the node's output tail."""
_SKIP_CHUNK = 64 * 1024  # how an overlong status line is read past

log = logging.getLogger(__name__)


def task_status(status: ev.TaskStatus) -> None:
    """Tell the spawning Spark task what happened; it may have gone already (SPARK mode)."""
    try:
        sys.stdout.write(STATUS_PREFIX + ev.to_line(status))
        sys.stdout.flush()
    except (BrokenPipeError, ValueError, OSError):
        pass


class Relay:
    """The supervisor's connection to the driver, and what it forwards on it for ``executor_id``."""

    def __init__(self, conn: Connection, executor_id: int) -> None:
        self.conn = conn
        self.executor_id = executor_id
        self.data_path = ""  # the TF process's feed socket, removed after it exits
        self.skipped = 0  # status lines from the TF process skipped (malformed, or nested too deep)

    def status(self, status: IO[str], pid: int, gpus: list[str]) -> str:
        """Forward the events of TF process ``pid`` to the driver; return the traceback it reports, if any.

        Ends when the TF process exits (EOF on the status pipe). A driver that is gone is seen
        by :meth:`await_stop`; sends that fail here are dropped. A malformed line is skipped,
        and so is an event nested too deep to be encoded again for the driver (``metrics``
        nested some 500-990 deep decode, then ``dataclasses.asdict`` raised RecursionError here,
        which ended the relay and the node with it): the node goes on, with a rate-limited error.
        """
        error = ""
        for line in status_lines(status):
            try:
                event = ev.from_line(line, ev.FeedSocket, ev.ProcessUp, ev.ProcessError, ev.NodeEvent)
            except ProtocolError as exc:
                self._skipped(str(exc))
                continue
            try:
                match event:
                    case ev.FeedSocket(data_path=path):  # ours to remove if the TF process dies
                        self.data_path = path
                    case ev.ProcessUp():
                        self._node_up(event, pid, gpus)
                    case ev.NodeEvent():
                        self.event(event)
                    case ev.ProcessError(traceback=text):
                        error = text
            except RecursionError:
                self._skipped(
                    f"a {event.TYPE!r} event nested too deep to encode for the driver (RecursionError at "
                    f"Python's recursion limit, {sys.getrecursionlimit()}); received: {line[:120]!r}..."
                )
        return error

    def _skipped(self, why: str) -> None:
        """Log a status line skipped for ``why``: the first 10, then 1 in 1,000 (the driver's rule)."""
        self.skipped += 1
        if self.skipped <= 10 or self.skipped % 1000 == 0:
            log.error(
                "tfonspark supervisor: skipped a status line from the TF process: %s. The node goes on "
                "(%d skipped so far)",
                why,
                self.skipped,
            )

    def _node_up(self, event: ev.ProcessUp, pid: int, gpus: list[str]) -> None:
        """The TF process is ready: tell the driver where its feed listens, and the task that it runs."""
        up = m.NodeUp(
            self.executor_id, pid, event.host, event.data_port, event.tensorboard_url, event.data_path, list(gpus)
        )
        self.data_path = up.data_path or self.data_path
        self.send(up)
        task_status(ev.TaskUp(pid))

    def event(self, event: ev.NodeEvent) -> None:
        """Send one node event on to the driver, unless it is over ``MAX_EVENT_BYTES``."""
        payload = m.encode(event)
        if len(payload) > MAX_EVENT_BYTES:
            log.error(
                "tfonspark supervisor: dropped a %r event of %d bytes from the TF process; an event may "
                "be at most %d bytes (MAX_EVENT_BYTES). Received: %r...",
                event.TYPE,
                len(payload),
                MAX_EVENT_BYTES,
                payload[:120].decode("utf-8", "replace"),
            )
            return
        with contextlib.suppress(OSError, ProtocolError):
            self.conn.send(payload)

    def send(self, message: m.Message) -> None:
        """Send ``message`` to the driver; a driver that is gone is :meth:`await_stop`'s to see."""
        with contextlib.suppress(OSError, ProtocolError):
            m.send_message(self.conn, message)

    def heartbeats(self, interval: float, done: threading.Event) -> None:
        """Tell the driver we are alive every ``interval`` seconds until ``done`` (the node exited)."""
        if interval <= 0:
            return
        while not done.wait(interval):
            try:
                m.send_message(self.conn, m.Heartbeat())
            except (OSError, ProtocolError):
                return  # the driver is gone: await_stop sees it

    def await_stop(self, timeout: float) -> m.Stop | None:
        """The driver's ``Stop``; None once the driver is gone: its connection dropped, or no
        message at all (the driver sends heartbeats) within ``timeout`` (0: no limit)."""
        try:
            self.conn.settimeout(timeout if timeout > 0 else None)
            while True:
                msg = m.recv_message(self.conn, m.Stop, m.Heartbeat)
                if isinstance(msg, m.Stop):
                    return msg
        except (OSError, ProtocolError):  # socket.timeout is an OSError
            return None


def tee(stream: IO[bytes] | None, tail: collections.deque[str]) -> None:
    """Copy the TF process's output to our stderr (the executor log), keeping its ``tail``."""
    if stream is None:
        return
    out = sys.stderr.buffer
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        tail.append(line)
        try:
            out.write(raw)
            out.flush()
        except (OSError, ValueError):
            pass


def status_lines(status: IO[str]) -> Iterator[str]:
    """The TF process's status lines; one longer than ``MAX_STATUS_LINE`` is skipped with an error.

    An overlong line is read past in chunks, so it never sits in memory whole.
    """
    while True:
        line = status.readline(MAX_STATUS_LINE + 1)
        if not line:
            return
        if len(line) <= MAX_STATUS_LINE:
            yield line
            continue
        head, size = line[:120], len(line)
        while not line.endswith("\n"):
            line = status.readline(_SKIP_CHUNK)
            if not line:
                break
            size += len(line)
        log.error(
            "tfonspark supervisor: skipped a status line of %d characters from the TF process; a status line "
            "may be at most %d (MAX_STATUS_LINE). Received: %r...",
            size,
            MAX_STATUS_LINE,
            head,
        )
