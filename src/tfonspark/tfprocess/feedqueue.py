"""The feed's queue on a node: a FIFO bounded in bytes, and each training partition staged until its end.

``ByteQueue`` holds what map_fun has yet to read (``DataFeed``), queued batches and the bytes of
partitions still arriving alike; map_fun's reads are told to it (:meth:`ByteQueue.note_read`),
which the server's pacing watches. :class:`Staging` keeps a training partition back until its
end marker, so a failed attempt is never read: in memory while the queue has room, then in an
unlinked temporary file (:class:`SpilledBatch`, read back as map_fun takes it). The items a
reader gets besides batches: ``None`` (a partition's end), :data:`END_FEED` and
:class:`EpochMark`.
"""

from __future__ import annotations

import collections
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ProtocolError
from ..wire.buffers import RecvBuffers, new_buffer
from ..wire.codec import ColumnBatch, decode_batch

__all__ = ["END_FEED", "ByteQueue", "ConsumerStalled", "EpochMark", "SpilledBatch", "Staging"]

END_FEED = object()


@dataclass(frozen=True)
class EpochMark:
    """Queued after the last row of an epoch of a restartable train feed (``max_restarts``)."""

    feed_id: str
    epoch: int


class ConsumerStalled(TimeoutError):
    """``map_fun`` took no data for the feed's timeout while a feeder waited to deliver."""


class ByteQueue:
    """A FIFO bounded by the bytes it holds, staged or queued (always admits one item).

    ``nbytes`` counts queued (committed, not yet read) bytes; ``reserved`` the bytes of training
    partitions still arriving, held in memory until their end marker (see :class:`Staging`);
    ``partitions`` the committed training partitions whose end map_fun has not read yet.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.nbytes = 0
        self.reserved = 0
        self._reads = 0  # map_fun's reads that took rows (note_read): its progress, for pacing
        self._items: collections.deque[tuple[Any, Any, int]] = collections.deque()
        self._ends: collections.deque[object] = collections.deque()  # committed partitions' markers
        self._cond = threading.Condition()
        self.aborted = False

    @property
    def partitions(self) -> int:
        """Committed training partitions whose end marker map_fun has not read yet."""
        return len(self._ends)

    @property
    def empty(self) -> bool:
        """Nothing is queued for map_fun to read."""
        return not self._items

    def note_read(self) -> None:
        """map_fun read rows: progress, which keeps paced feeders waiting (``FeedServer._pace``)."""
        self._reads += 1

    @property
    def reads(self) -> int:
        """How many reads took rows so far (:meth:`note_read`): the pacing's sign of progress."""
        return self._reads

    def wake(self) -> None:
        """Wake every waiter to look at its condition again (a release of held Acks)."""
        with self._cond:
            self._cond.notify_all()

    def _used(self) -> int:
        return self.nbytes + self.reserved

    def _wait(self, full: Callable[[], bool], deadline: float | None) -> None:
        while full() and not self.aborted:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ConsumerStalled("map_fun read no data while the feed waited")
            self._cond.wait(left)

    def put(self, stream: Any, item: Any, nbytes: int = 0, timeout: float | None = None) -> bool:
        """Block while full (up to ``timeout``); False if the queue was aborted (item dropped)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._wait(
                lambda: nbytes > 0 and self.nbytes > 0 and self.nbytes + self.reserved + nbytes > self.capacity,
                deadline,
            )
            if self.aborted:
                return False
            self._items.append((stream, item, nbytes))
            self.nbytes += nbytes
            self._cond.notify_all()
            return True

    def reserve(self, nbytes: int, timeout: float) -> bool | None:
        """Room to stage ``nbytes`` in memory: True, False (spill: waiting frees nothing), None (aborted).

        Waits (up to ``timeout``, then ConsumerStalled) only while map_fun has queued data to
        read, so the wait ends when it reads; staged bytes alone cannot shrink by waiting.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            self._wait(lambda: self.nbytes > 0 and self._used() + nbytes > self.capacity, deadline)
            if self.aborted:
                return None
            if self._used() + nbytes <= self.capacity or self._used() == 0:
                self.reserved += nbytes
                return True
            return False

    def release(self, nbytes: int) -> None:
        """Give back staged bytes of a partition attempt that will never be committed."""
        if nbytes:
            with self._cond:
                self.reserved -= nbytes
                self._cond.notify_all()

    def commit(self, stream: Any, items: list[tuple[Any, int]], staged: int) -> bool:
        """Queue a whole partition at once (its ``staged`` bytes were reserved); never blocks."""
        with self._cond:
            self.reserved -= staged
            if self.aborted:
                self._cond.notify_all()
                return False
            for batch, nbytes in items:
                self._items.append((stream, batch, nbytes))
                self.nbytes += nbytes
            end = (stream, None, 0)  # partition boundary marker
            self._items.append(end)
            self._ends.append(end)
            self._cond.notify_all()
            return True

    def wait_behind(self, ahead: int, timeout: float, released: Callable[[], bool] = lambda: False) -> bool:
        """Wait (at most ``timeout``) until at most ``ahead`` committed partitions are unread, the
        queue was aborted or ``released()`` (looked at on :meth:`wake`); False if none is so.

        Never raises: it paces feeders to map_fun's reading, it does not detect stalls.
        """
        with self._cond:
            return self._cond.wait_for(lambda: self.partitions <= ahead or self.aborted or released(), timeout)

    def get(self, timeout: float | None = None) -> tuple[Any, Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._items or self.aborted, timeout):
                raise TimeoutError("no data arrived")
            if not self._items:
                return None, END_FEED
            entry = self._items.popleft()
            stream, item, nbytes = entry
            self.nbytes -= nbytes
            if self._ends and self._ends[0] is entry:
                self._ends.popleft()
            self._cond.notify_all()
        if isinstance(item, SpilledBatch):
            item = item.load()
        return stream, item

    def abort(self) -> None:
        """Drop everything queued and release blocked producers (``terminate``)."""
        with self._cond:
            self.aborted = True
            self._items.clear()
            self._ends.clear()
            self.nbytes = 0
            self._cond.notify_all()


class _SpillFile:
    """An unlinked temporary file holding spilled batch frames; closed after its last read."""

    def __init__(self, buffers: RecvBuffers | None = None) -> None:
        self.file = tempfile.TemporaryFile(prefix="tfos-spill-")  # noqa: SIM115 (closed below)
        self.buffers = buffers  # read back into reused memory, as received frames are
        self.size = 0
        self.unread = 0
        self._lock = threading.Lock()

    def append(self, payload: memoryview) -> SpilledBatch:
        self.file.write(payload)
        self.unread += 1
        batch = SpilledBatch(self, self.size, len(payload))
        self.size += len(payload)
        return batch

    def read(self, offset: int, length: int) -> memoryview:
        buf = self.buffers.take(length) if self.buffers is not None else memoryview(new_buffer(length))
        with self._lock:
            got = os.preadv(self.file.fileno(), [buf], offset)
            self.unread -= 1
            if self.unread == 0:
                self.file.close()
        if got != length:
            raise ProtocolError(f"spilled batch: read {got} of {length} bytes")
        return buf

    def close(self) -> None:
        self.file.close()


class SpilledBatch:
    """A staged batch that went to disk; read back (and decoded) when map_fun takes it."""

    def __init__(self, spill: _SpillFile, offset: int, length: int) -> None:
        self.spill, self.offset, self.length = spill, offset, length

    def load(self) -> ColumnBatch:
        return decode_batch(self.spill.read(self.offset, self.length))


class Staging:
    """A training partition held back until its end marker, so a failed attempt is never read.

    Batches stay in memory while the queue has room; a partition that alone outgrows the buffer
    continues into an unlinked temporary file (gone with the process, whatever happens), read
    back one batch at a time as map_fun takes them, so memory stays bounded.
    """

    def __init__(self, queue: ByteQueue, buffers: RecvBuffers | None = None) -> None:
        self.queue = queue
        self.buffers = buffers
        self.staged = 0  # bytes reserved in the queue
        self.parts: list[tuple[ColumnBatch | SpilledBatch, int]] = []
        self._spill: _SpillFile | None = None

    def add(self, payload: memoryview, timeout: float) -> bool:
        """Stage one batch frame; False if the queue was aborted (``terminate``)."""
        nbytes = len(payload)
        if self._spill is None:  # once spilling, keep order: everything after goes to the file too
            room = self.queue.reserve(nbytes, timeout)
            if room is None:
                return False
            if room:
                self.staged += nbytes
                self.parts.append((decode_batch(payload), nbytes))
                return True
            self._spill = _SpillFile(self.buffers)
        self.parts.append((self._spill.append(payload), nbytes))
        return True

    def commit(self, stream: Any) -> bool:
        """Queue the staged batches as one partition of ``stream`` (:meth:`ByteQueue.commit`);
        False if the queue was aborted (``terminate``)."""
        if not self.queue.commit(stream, self._batches(), self.staged):
            return False
        self.staged = 0  # the queue holds those bytes now
        return True

    def _batches(self) -> list[tuple[ColumnBatch | SpilledBatch, int]]:
        """The staged batches in order, handed over to the queue."""
        if self._spill is not None:
            self._spill.file.flush()
            self._spill = None  # the queue's SpilledBatch items own it now
        parts, self.parts = self.parts, []
        return parts

    def discard(self) -> None:
        """Drop the attempt: give its memory back, close (and so delete) its file."""
        self.queue.release(self.staged)
        self.staged = 0
        self.parts = []
        if self._spill is not None:
            self._spill.close()
            self._spill = None
