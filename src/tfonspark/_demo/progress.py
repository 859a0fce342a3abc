"""Progress from the TF nodes to the driver's console, over one authenticated TCP channel.

Why: the TF process output is tee'd into the executor's stderr, and in ``local-cluster`` and
standalone mode every executor is its own JVM whose stderr goes to a log file under ``work/``,
not to the console where the demo runs. So the driver opens a :class:`ProgressServer`; each node
connects with a :class:`ProgressSender` and sends JSON messages in tfonspark's HMAC-signed frames
(:mod:`tfonspark.wire.framing`), keyed by a random secret made on the driver and shipped in the
node's arguments, like the cluster secret. Nothing is unpickled; a message that is not a JSON
object is dropped.

Messages are flat JSON objects with a ``kind``: ``"progress"`` (from
:func:`progress_message`), ``"result"`` (the chief's history and test predictions) or anything
else the caller likes. A sender never raises into training: if the driver cannot be reached, it
logs once and goes quiet.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import AuthenticationError, ProtocolError
from ..wire.framing import Connection, connect, new_secret, server_handshake

__all__ = ["ProgressSender", "ProgressServer", "format_progress", "progress_message"]

_log = logging.getLogger(__name__)
_MAX_FRAME = 16 * 1024 * 1024  # a result carries at most a few MB of predictions

Message = dict[str, Any]


class ProgressServer:
    """Accepts node connections and hands every message to ``on_message`` (in its own thread).

    ``address`` and ``secret_hex`` are what a :class:`ProgressSender` needs. ``on_message`` is
    called from connection threads, one message at a time (calls are serialised by a lock).
    """

    def __init__(self, host: str, on_message: Callable[[Message], None]) -> None:
        self._secret = new_secret()
        self._on_message = on_message
        self._lock = threading.Lock()
        self._sock = socket.create_server((host, 0))
        self.address: tuple[str, int] = (host, int(self._sock.getsockname()[1]))
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True, name="demo-progress")
        self._accepter.start()

    @property
    def secret_hex(self) -> str:
        """The channel's secret, for the nodes' arguments (never logged)."""
        return self._secret.hex()

    def _accept(self) -> None:
        """Accept connections until closed; one reader thread each."""
        while not self._closed.is_set():
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            reader = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            reader.start()
            self._threads.append(reader)

    def _serve(self, sock: socket.socket) -> None:
        """Authenticate one node, then read its messages until it hangs up."""
        try:
            conn = server_handshake(sock, self._secret, max_frame=_MAX_FRAME)
        except (OSError, ProtocolError) as err:
            _log.warning("progress channel: refused a connection: %s", err)
            sock.close()
            return
        with conn:
            while True:
                try:
                    message = json.loads(bytes(conn.recv()))
                except (OSError, ProtocolError, ValueError):
                    return
                if isinstance(message, dict):
                    with self._lock:
                        self._on_message(message)

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting and wait (up to ``timeout``) for open connections to be read to the end."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        for thread in self._threads:
            thread.join(timeout)

    def __enter__(self) -> ProgressServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProgressSender:
    """The node's end: ``send(message)``; also usable as ``tfonspark.keras.fit(on_progress=...)``."""

    def __init__(self, address: tuple[str, int], secret_hex: str, worker: int) -> None:
        self.address = address
        self.worker = worker
        self._secret = bytes.fromhex(secret_hex)
        self._conn: Connection | None = None
        self._broken = False

    def send(self, message: Mapping[str, Any]) -> bool:
        """Send one JSON message (``worker`` added); False if the driver cannot be reached."""
        if self._broken:
            return False
        try:
            if self._conn is None:
                self._conn = connect(self.address, self._secret, max_frame=_MAX_FRAME)
            self._conn.send(json.dumps({"worker": self.worker, **message}).encode())
            return True
        except (OSError, ProtocolError, AuthenticationError) as err:
            _log.warning("progress channel to %s:%s lost (%s); no more progress is sent", *self.address, err)
            self._broken = True
            self.close()
            return False

    def __call__(self, progress: Any) -> None:
        """An ``on_progress`` callback for :func:`tfonspark.keras.fit`."""
        self.send(progress_message(progress))

    def close(self) -> None:
        """Hang up (the driver reads what was sent before)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def progress_message(progress: Any) -> Message:
    """A :class:`tfonspark.keras.Progress` report as a JSON-ready message."""
    return {
        "kind": "progress",
        "epoch": progress.epoch,
        "step": progress.step,
        "steps": progress.steps,
        "epoch_end": progress.epoch_end,
        "rows_per_sec": round(progress.rows_per_sec, 1),
        "global_rows": progress.global_rows,
        "logs": {k: float(v) for k, v in progress.logs.items() if isinstance(v, (int, float))},
    }


def format_progress(message: Mapping[str, Any], epochs: int, node_rates: Mapping[int, float]) -> str:
    """One console line for a progress message.

    Step lines show the chief's running loss and accuracy, and rows/s summed over the latest
    report of each node; epoch-end lines show the global epoch metrics (``val_*`` included).
    """
    logs = message.get("logs", {})
    steps = message.get("steps")
    head = f"epoch {message['epoch'] + 1}/{epochs}  step {message['step']}/{steps or '?'}"
    if message.get("epoch_end"):
        metrics = "  ".join(f"{k} {v:.4f}" for k, v in logs.items())
        return f"{head}  done: {metrics}  {message['rows_per_sec']:.0f} rows/s (all nodes, with validation)"
    loss, accuracy = logs.get("loss"), logs.get("accuracy")
    parts = [head]
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    if accuracy is not None:
        parts.append(f"accuracy {accuracy:.4f}")
    nodes = len(node_rates)
    parts.append(f"{sum(node_rates.values()):.0f} rows/s ({nodes} node{'' if nodes == 1 else 's'})")
    return "  ".join(parts)
