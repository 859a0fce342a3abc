"""Inference results on their way back: one result per row, to the partition the rows came from.

``DataFeed.batch_results`` makes a batch of its argument (:func:`results_batch`) and hands it to
:class:`HeldResults`, which holds the answers to the reads of one received frame and sends them
as one frame to the partition's feeder (``Stream.answer``).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..wire.codec import ColumnBatch
from ..wire.packing import pack_rows
from .batchjoin import concat
from .feedserver import Stream

__all__ = ["HeldResults", "results_batch"]

#: most result rows held back to travel as one frame (see ``DataFeed.batch_results``)
_MAX_HELD_RESULTS = 65_536
_MAX_HELD_BYTES = 4 << 20  # as big as a feeder's frames


def results_batch(results: Any) -> ColumnBatch:
    """``batch_results``' argument as one column; a list of Python floats without numpy's type probe."""
    if isinstance(results, np.ndarray):
        return ColumnBatch([results], "scalar")
    if type(results) is list and set(map(type, results)) == {float}:  # TFoS's ``preds.tolist()``
        return ColumnBatch([np.fromiter(results, np.float64, len(results))], "scalar", None, "--")
    return pack_rows(list(results))


def _same_columns(a: ColumnBatch, b: ColumnBatch) -> bool:
    """``a`` and ``b`` join into one batch without changing a value's type or shape."""
    if (a.layout, a.names, a.kinds, len(a.columns)) != (b.layout, b.names, b.kinds, len(b.columns)):
        return False
    for x, y in zip(a.columns, b.columns):
        if isinstance(x, np.ndarray) != isinstance(y, np.ndarray):
            return False
        if isinstance(x, np.ndarray) and (x.dtype != y.dtype or x.shape[1:] != y.shape[1:]):
            return False
    return True


class HeldResults:
    """Results of the reads of one received frame, sent back as one frame.

    A feeder sends a partition in frames of thousands of rows; ``map_fun`` reads them
    ``batch_size`` rows at a time. Answering each read with its own frame costs a frame's
    fixed price (header, syscall, and on the executor an Arrow batch) per read; holding the
    answers until the frame's last row is answered costs one. Results are held only while the
    reader has more of the same frame in hand (it does not wait for data in between), and go
    out in order, at once, when a read ends a frame, the types change, or the feed is terminated.
    Only numeric columns (copied) are held, up to 4 MB: other results are pickled at once, as
    they were, and so are results of 4 MB or more.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # terminate() flushes from another thread
        self._stream: Stream | None = None
        self._batches: list[ColumnBatch] = []
        self._rows = 0
        self._nbytes = 0

    def add(self, stream: Stream, batch: ColumnBatch, flush: bool) -> None:
        """Hold ``batch`` for ``stream``; send what is held if ``flush`` (or it cannot join)."""
        numeric = all(isinstance(c, np.ndarray) and c.dtype.kind in "biufc" for c in batch.columns)
        with self._lock:
            if self._batches and (stream is not self._stream or not _same_columns(self._batches[0], batch)):
                earlier = self._take()
            else:
                earlier = None
            if not numeric or batch.nbytes >= _MAX_HELD_BYTES:
                # objects the caller may still change (pickled now, as before), or a frame's worth
                later, alone = self._take(), batch
            else:
                if not flush:  # the caller may reuse its array for the next batch
                    batch = ColumnBatch([np.array(c) for c in batch.columns], batch.layout, batch.names, batch.kinds)
                self._stream = stream
                self._batches.append(batch)
                self._rows += batch.count
                self._nbytes += batch.nbytes
                full = self._rows >= _MAX_HELD_RESULTS or self._nbytes >= _MAX_HELD_BYTES
                later, alone = (self._take() if flush or full else None), None
        for held in (earlier, later):  # sent outside the lock: a send may wait up to feed_timeout
            if held is not None:
                held[0].answer(held[1])
        if alone is not None:
            stream.answer(alone)

    def flush(self) -> None:
        """Send whatever is held."""
        with self._lock:
            held = self._take()
        if held is not None:
            held[0].answer(held[1])

    def _take(self) -> tuple[Stream, ColumnBatch] | None:
        """What is held, joined, and the stream it answers; nothing is held afterwards."""
        held = (self._stream, concat(self._batches)) if self._batches and self._stream is not None else None
        self._stream, self._batches, self._rows, self._nbytes = None, [], 0, 0
        return held
