"""An in-process feed for testing ``map_fun`` without Spark (TFoS's ``TFManager.start`` seam).

``feeds = LocalFeeds(["input", "output"])`` is what a :class:`~tfonspark.tfprocess.datafeed.DataFeed`
reads from, filled by your test instead of Spark feed tasks::

    q = feeds.get_queue("input")
    for row in rows:
        q.put(row)
    q.put(None)                       # the end of the feed (TFoS's marker)
    feed = DataFeed(feeds, train_mode=False)
    batch = feed.next_batch(10)
    feed.batch_results([...])         # one result per row ...
    feeds.get_queue("output").get()   # ... read back in order

Rows go through the same columnar packing and byte-bounded queue as fed Spark data, so a
``map_fun`` sees exactly what it will see on a cluster.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable
from typing import Any

from ..settings import DEFAULT_FEED_BUFFER_BYTES
from ..wire.codec import ColumnBatch
from ..wire.packing import pack_rows
from .feedqueue import END_FEED, ByteQueue, ConsumerStalled

__all__ = ["LocalFeeds", "LocalQueue"]


class _LocalStream:
    """The one "partition" of a local feed: its results go to the results queue, in order."""

    partition = 0
    train = True  # never skipped as an abandoned inference attempt

    def __init__(self, results: queue.Queue[Any]) -> None:
        self.results = results
        self.closed = threading.Event()

    def answer(self, batch: ColumnBatch) -> None:
        for row in batch.rows(as_fed=True):
            self.results.put(row)

    def maybe_finish(self) -> None:
        """Nothing to tell: there is no feeder waiting for an end-of-results message."""


class LocalQueue:
    """One named queue: ``put`` rows in (``None`` ends the feed), ``get`` results out."""

    def __init__(self, data: ByteQueue, stream: _LocalStream, results: queue.Queue[Any], name: str = "") -> None:
        self._data = data
        self._stream = stream
        self._results = results
        self._name = name

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Feed one row (any shape a Spark row may have); ``None`` marks the end of the feed.

        As TFoS's queue: blocks while the queue is full, and raises ``queue.Full`` when it is
        full and ``block`` is False, or still full after ``timeout`` seconds.
        """
        if item is None:
            self._data.put(None, END_FEED)
            return
        batch = pack_rows([item])
        try:
            self._data.put(self._stream, batch, batch.nbytes, timeout if block else 0.0)
        except ConsumerStalled:
            waited = "put(block=False)" if not block else f"put(timeout={timeout})"
            raise queue.Full(
                f"queue {self._name!r} is full ({self._data.capacity:,} bytes, the buffer_bytes of "
                f"LocalFeeds): {waited} found no room; a DataFeed reading it makes room"
            ) from None

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next result ``batch_results`` returned (``queue.Empty`` after ``timeout``)."""
        return self._results.get(block, timeout)

    def empty(self) -> bool:
        return self._results.empty()

    def qsize(self) -> int:
        return self._results.qsize()


class LocalFeeds:
    """Named in-process queues a ``DataFeed`` reads; results of every queue go to ``results_queue``."""

    def __init__(
        self,
        qnames: Iterable[str] = ("input", "output"),
        *,
        results_queue: str = "output",
        buffer_bytes: int = DEFAULT_FEED_BUFFER_BYTES,
    ) -> None:
        self.buffer_bytes = buffer_bytes
        self.results_queue = results_queue
        self._queues: dict[str, LocalQueue] = {}
        self._data: dict[str, ByteQueue] = {}
        self._answers: queue.Queue[Any] = queue.Queue()  # every stream's results, in order
        self._lock = threading.Lock()
        for name in qnames:
            self.get_queue(name)

    def get_queue(self, qname: str) -> LocalQueue:
        """The queue named ``qname`` (made on first use, as TFoS's manager made them at start)."""
        with self._lock:
            if qname not in self._queues:
                readable = self._answers if qname == self.results_queue else queue.Queue()
                self._data[qname] = ByteQueue(self.buffer_bytes)
                self._queues[qname] = LocalQueue(self._data[qname], _LocalStream(self._answers), readable, qname)
            return self._queues[qname]

    def queue(self, qname: str) -> ByteQueue:
        """What ``DataFeed`` reads (the same interface as the node's feed server)."""
        self.get_queue(qname)
        return self._data[qname]

    def terminate(self) -> None:
        """``DataFeed.terminate()``: queued rows are dropped, readers see the end of the feed."""
        with self._lock:
            queues = list(self._data.values())
        for q in queues:
            q.abort()
