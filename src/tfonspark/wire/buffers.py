"""Memory for received frames: buffers not zero-filled first, and a pool reused once no view remains.

:mod:`.framing` receives large frames into these (``Connection.buffers``); the feed server reads
spilled batches back into them and ``DataFeed`` joins batches that span two frames in them.
Both cut a pass over fresh memory (zero-filling, page faults) from every frame.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["RecvBuffers", "new_buffer"]


def _load_empty() -> Any:
    """``_pack.empty_bytearray`` (a bytearray not zero-filled), or ``bytearray`` without the C part."""
    try:
        from ._pack import empty_bytearray
    except ImportError:
        return bytearray
    return empty_bytearray


_make_bytearray: Any = _load_empty()


def new_buffer(size: int) -> bytearray:
    """A bytearray of ``size`` bytes for a receive (or a join) to fill.

    Its contents are not set where the optional C part is built: ``bytearray(n)`` zero-fills
    fresh memory first, a pass over every byte (and a page fault a page) that the receive then
    overwrites. It is allocated one byte longer, then shortened, so that :func:`_unused`'s probe
    fits in place: else the probe's first append moves the whole buffer to fresh memory.
    """
    if size < 0:  # else size + 1 would make an empty buffer that pop() cannot shorten
        raise ValueError(f"new_buffer: size must be >= 0. Received: {size}")
    buf = _make_bytearray(size + 1)
    buf.pop()
    return buf  # type: ignore[no-any-return]


def _unused(buf: bytearray) -> bool:
    """True when no memoryview (so no numpy array made from one) of ``buf`` is alive.

    A bytearray cannot be resized while a view exports it. The append fits in the spare byte
    :func:`new_buffer` leaves (any other buffer gets spare room at its first probe), so the
    probe costs no copy.
    """
    try:
        buf.append(0)
    except BufferError:
        return False
    buf.pop()
    return True


class RecvBuffers:
    """Buffers for large frames, reused once nothing refers to them (also where ``DataFeed``
    joins a batch that spans two received frames).

    Decoded batches are numpy views of the received frame, so a frame's memory can be reused
    only after the consumer has dropped every view of it: :func:`_unused` checks exactly that.
    A fresh multi-MB buffer is zero-filled and page-faulted in: ~1 us per 3 KB row, half of
    what a TF process spent per fed row. The pool holds at most ``capacity`` bytes, in use or
    free; frames beyond it, and small ones, get fresh buffers.
    """

    MIN_SIZE = 256 * 1024

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._bufs: list[bytearray] = []
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes held by the pool, in use or free."""
        return sum(len(b) for b in self._bufs)

    def take(self, size: int) -> memoryview:
        """A writable view of exactly ``size`` bytes."""
        view = self.reuse(size)
        if view is None:
            view = memoryview(new_buffer(size))
            self.adopt(view.obj)  # type: ignore[arg-type]
        return view

    def reuse(self, size: int) -> memoryview | None:
        """A free pooled buffer for ``size`` bytes, or None (nothing is allocated here)."""
        if not self._pooled(size):
            return None
        with self._lock:
            fits = [b for b in self._bufs if size <= len(b) <= 2 * size and _unused(b)]
            return memoryview(min(fits, key=len))[:size] if fits else None

    def adopt(self, buf: bytearray) -> None:
        """Keep ``buf`` (just filled) for reuse, dropping free buffers that do not fit to make room."""
        size = len(buf)
        if not self._pooled(size):
            return
        with self._lock:
            held = self.nbytes
            for old in sorted((b for b in self._bufs if _unused(b)), key=len):
                if held + size <= self.capacity:
                    break
                self._bufs.remove(old)
                held -= len(old)
            if held + size <= self.capacity:
                self._bufs.append(buf)

    def _pooled(self, size: int) -> bool:
        return self.MIN_SIZE <= size <= self.capacity
