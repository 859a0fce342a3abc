"""A fake driver for one node supervisor: the control channel's other end, without Spark."""

from __future__ import annotations

import socket
import threading
import time
from typing import TypeVar

from ..wire import framing as f
from ..wire import messages as m

__all__ = ["FakeDriver"]

M = TypeVar("M", bound=m.Message)


class FakeDriver:
    """The driver's side of one supervisor's control connection, for supervisor tests.

    Accepts one supervisor, tells it it is ``worker:0`` of a one-node cluster, records every
    message it sends and, with ``heartbeat_secs``, sends heartbeats.
    """

    def __init__(self, secret_hex: str, heartbeat_secs: float = 0.0) -> None:
        self.secret = bytes.fromhex(secret_hex)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.heartbeat_secs = heartbeat_secs
        self.received: list[m.Message] = []
        self.closed = threading.Event()
        self.conn: f.Connection | None = None
        self._cond = threading.Condition()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        sock, _ = self.sock.accept()
        conn = self.conn = f.server_handshake(sock, self.secret)
        try:
            reg = m.recv_message(conn, m.Register)
            if not isinstance(reg, m.Register):
                return
            self._record(reg)
            m.send_message(conn, m.ClusterReady("worker", 0, {"worker": [f"{reg.host}:{reg.port}"]}))
            if self.heartbeat_secs:
                threading.Thread(target=self._beat, args=(conn,), daemon=True).start()
            while True:
                self._record(m.recv_message(conn))
        except Exception:  # the supervisor went away or sent garbage: the test reads `closed`
            pass
        finally:
            self.closed.set()
            with self._cond:
                self._cond.notify_all()

    def _beat(self, conn: f.Connection) -> None:
        while not self.closed.wait(self.heartbeat_secs):
            try:
                m.send_message(conn, m.Heartbeat())
            except OSError:
                return

    def _record(self, msg: m.Message) -> None:
        with self._cond:
            self.received.append(msg)
            self._cond.notify_all()

    def wait_for(self, kind: type[M], timeout: float = 60) -> M:
        """The first message of type ``kind``; AssertionError once the deadline passes or it hung up."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for msg in self.received:
                    if isinstance(msg, kind):
                        return msg
                left = deadline - time.monotonic()
                if left <= 0 or self.closed.is_set():
                    raise AssertionError(f"no {kind.__name__} within {timeout}s (received {self.received})")
                self._cond.wait(min(left, 0.5))

    def of(self, kind: type[M]) -> list[M]:
        with self._cond:
            return [x for x in self.received if isinstance(x, kind)]

    def close(self) -> None:
        self.sock.close()
        if self.conn is not None:
            self.conn.close()
