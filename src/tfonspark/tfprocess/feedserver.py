"""The TF process's data server: feed tasks connect here and stream columnar batches in.

Each connection carries one partition (``FeedStart`` .. batches .. ``FeedEnd``). Batches go into
a per-queue buffer bounded in bytes: when it is full the receiving thread stops reading, TCP
flow control stalls the sender, and memory stays bounded whatever the partition size. For
inference the connection stays open and results flow back on it, in order.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from ..errors import FeedError, ProtocolError
from ..wire import messages as m
from ..wire.codec import BATCH_KIND, ColumnBatch, decode_batch, encode_batch
from ..wire.framing import (
    Connection,
    RecvBuffers,
    listen_unix,
    remove_unix_socket,
    server_handshake,
)

__all__ = ["END_FEED", "ByteQueue", "FeedServer", "Stream"]

log = logging.getLogger(__name__)
END_FEED = object()


class Stream:
    """One partition arriving over one connection."""

    def __init__(self, conn: Connection, start: m.FeedStart) -> None:
        self.conn = conn
        self.partition = start.partition
        self.train = start.train
        self.columns = start.columns
        self.received = 0
        self.answered = 0
        self.ended = False
        self.closed = threading.Event()
        self._lock = threading.Lock()

    def end(self, count: int) -> None:
        if count != self.received:
            raise ProtocolError(f"partition {self.partition}: feeder sent {count} rows, "
                                f"{self.received} arrived")
        with self._lock:
            self.ended = True
        self.maybe_finish()

    def answer(self, results: ColumnBatch) -> None:
        """Send results back to the feeder of this partition."""
        try:
            self.conn.send(*encode_batch(results))
        except OSError as exc:
            # the feed task is gone (it failed, was cancelled, or its executor died) and Spark
            # reports or retries it; map_fun must keep serving the other partitions
            log.warning("feed server: results for partition %s dropped, its feeder is gone (%s)",
                        self.partition, exc)
            self.closed.set()
            return
        with self._lock:
            self.answered += results.count
        self.maybe_finish()

    def maybe_finish(self) -> None:
        """After the last result of an inference partition, tell the feeder and close."""
        with self._lock:
            done = not self.train and self.ended and self.answered == self.received
            if not done or self.closed.is_set():
                return
            self.closed.set()
        try:
            m.send_message(self.conn, m.ResultsEnd(self.answered))
        except OSError:
            pass
        finally:
            self.conn.close()  # the partition is complete; nothing more travels on it


class ByteQueue:
    """A FIFO bounded by the bytes it holds (always admits one item, however large)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.nbytes = 0
        self._items: collections.deque[tuple[Any, Any, int]] = collections.deque()
        self._cond = threading.Condition()
        self.aborted = False

    def put(self, stream: Any, item: Any, nbytes: int = 0) -> bool:
        """Block while full; False if the queue was aborted (item dropped)."""
        with self._cond:
            while self.nbytes and self.nbytes + nbytes > self.capacity and not self.aborted:
                self._cond.wait()
            if self.aborted:
                return False
            self._items.append((stream, item, nbytes))
            self.nbytes += nbytes
            self._cond.notify_all()
            return True

    def get(self, timeout: float | None = None) -> tuple[Any, Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._items or self.aborted, timeout):
                raise TimeoutError("no data arrived")
            if not self._items:
                return None, END_FEED
            stream, item, nbytes = self._items.popleft()
            self.nbytes -= nbytes
            self._cond.notify_all()
            return stream, item

    def abort(self) -> None:
        """Drop everything queued and release blocked producers (``terminate``)."""
        with self._cond:
            self.aborted = True
            self._items.clear()
            self.nbytes = 0
            self._cond.notify_all()


class FeedServer:
    """Accepts authenticated feed connections and fills one ByteQueue per queue name.

    It listens on TCP (signed frames, for feeders on other executors) and, where the platform
    allows, on a Unix socket in a private directory (``unix_path``; unsigned frames after the
    handshake, for feeders on this executor: see :mod:`..wire.framing`).
    """

    def __init__(self, secret: bytes, buffer_bytes: int = 64 * 1024 * 1024, host: str = "127.0.0.1",
                 on_event: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.secret = secret
        self.buffer_bytes = buffer_bytes
        self.on_event = on_event or (lambda kind, detail: None)
        self.terminated = False
        self._queues: dict[str, ByteQueue] = {}
        self._streams: set[Stream] = set()
        self._lock = threading.Lock()
        # frame memory is reused once consumed; the pool holds the queue's bytes + frames in flight
        self._buffers = RecvBuffers(buffer_bytes + 8 * 1024 * 1024)
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self._sock.listen(256)
        self.port = int(self._sock.getsockname()[1])
        self._unix = listen_unix("tfos-feed-")
        self.unix_path = self._unix.getsockname() if self._unix is not None else ""
        threading.Thread(target=self._accept, args=(self._sock, True), daemon=True, name="tfos-feed").start()
        if self._unix is not None:
            threading.Thread(target=self._accept, args=(self._unix, False), daemon=True,
                             name="tfos-feed-unix").start()

    def queue(self, qname: str) -> ByteQueue:
        with self._lock:
            if qname not in self._queues:
                self._queues[qname] = ByteQueue(self.buffer_bytes)
            return self._queues[qname]

    def _accept(self, listener: socket.socket, signed: bool) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock, signed), daemon=True).start()

    def _serve(self, sock: socket.socket, signed: bool) -> None:
        try:
            conn = server_handshake(sock, self.secret, signed=signed)
        except (OSError, ProtocolError):
            log.warning("feed server: dropped a connection that failed authentication")
            sock.close()
            return
        conn.buffers = self._buffers
        keep_open = False
        try:
            msg = m.recv_message(conn, m.FeedStart, m.FeedClose)
            if isinstance(msg, m.FeedClose):
                self.queue(msg.qname).put(None, END_FEED)
                m.send_message(conn, m.Ack())
            else:
                assert isinstance(msg, m.FeedStart)
                keep_open = self._receive(conn, msg)
        except (OSError, ProtocolError) as exc:
            log.warning("feed server: feed connection failed: %s", exc)
        finally:
            if not keep_open:
                conn.close()

    def _receive(self, conn: Connection, start: m.FeedStart) -> bool:
        """Read one partition into the queue; True if the connection must stay open for results."""
        stream = Stream(conn, start)
        queue = self.queue(start.qname)
        with self._lock:
            # inference streams stay here until answered, so terminate() reaches their feeders
            self._streams = {s for s in self._streams if not s.closed.is_set()}
            self._streams.add(stream)
        keep_open = False
        try:
            while True:
                payload = conn.recv()
                if self.terminated:
                    return self._drain(stream, payload)
                if bytes(payload[:1]) == BATCH_KIND:
                    batch = decode_batch(payload)
                    stream.received += batch.count
                    if not queue.put(stream, batch, len(payload)):
                        return self._drain(stream, None)
                    continue
                end = m.decode(payload)
                if not isinstance(end, m.FeedEnd):
                    raise ProtocolError(f"expected a batch or feed_end, received {end.TYPE}")
                queue.put(stream, None)  # partition boundary marker
                stream.end(end.count)
                if start.train:
                    m.send_message(conn, m.Ack(end.count))
                    return False
                keep_open = True
                return True
        finally:
            if not keep_open:
                with self._lock:
                    self._streams.discard(stream)

    def _drain(self, stream: Stream, payload: memoryview | None) -> bool:
        """After terminate(): tell the feeder to stop, discard what it already sent."""
        try:
            m.send_message(stream.conn, m.Terminate())
        except OSError:
            return False
        while payload is None or bytes(payload[:1]) == BATCH_KIND:
            try:
                payload = stream.conn.recv()
            except (OSError, ProtocolError):
                return False
        return False

    def terminate(self) -> None:
        """Stop accepting data: queued batches are dropped, feeders told to stop sending."""
        self.terminated = True
        with self._lock:
            queues = list(self._queues.values())
            streams = [s for s in self._streams if not s.closed.is_set()]
        for q in queues:
            q.abort()
        for stream in streams:
            with contextlib.suppress(OSError):
                m.send_message(stream.conn, m.Terminate())

    def close(self) -> None:
        self.terminate()
        for listener in (self._sock, self._unix):
            if listener is None:
                continue
            with contextlib.suppress(OSError):  # wakes the thread in accept(); close() alone does not
                listener.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                listener.close()
        remove_unix_socket(self.unix_path)


def require_server(mgr: Any) -> FeedServer:
    if not isinstance(mgr, FeedServer):
        raise FeedError("this node has no data feed: get_data_feed() needs a cluster started with "
                        "input_mode=InputMode.SPARK, on a chief/master/worker node. "
                        f"Received: ctx.mgr={type(mgr).__name__}")
    return mgr
