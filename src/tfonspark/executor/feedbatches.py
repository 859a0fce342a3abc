"""A feed task's source as ~4 MB column batches, with the rows it took from Spark counted.

Three sources: an RDD's rows (:func:`row_batches`: packed in chunks, or row by row as Spark's
iterator gives them where they are like the first, into frames of about 4 MB), a stored RDD's
pickled batches (:func:`decoded_batches`: read as columns without unpickling where
:class:`~tfonspark.wire.pickled.PickledRows` knows them), and a DataFrame's Arrow record batches
(:func:`arrow_batches`). Each counts the rows it takes in a :class:`Tally`, apart from how they
are packed, so that the node can check that every row arrived. Batches reuse memory: each must
be sent before the next is asked for. :mod:`.feeder` sends them.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import InputError
from ..gcpause import paused
from ..wire.arrow import arrow_to_columns
from ..wire.codec import ColumnBatch
from ..wire.packing import RowPlan, Scratch, fill_frame, pack_rows, rebuilt_rows, row_plan
from ..wire.pickled import PickledRows

__all__ = ["Tally", "arrow_batches", "decoded_batches", "row_batches"]

_TARGET_BYTES = 4 * 1024 * 1024
#: Python objects in one chunk of rows at most: a chunk of list rows is unpickled (or made by
#: an uncached ``map``), held alive and packed, and the larger it is, the more of it has left
#: the CPU caches by the time it is packed and freed. Unpickle + pack + drop, CPU us per row:
#: 784-float list rows 27.8 in chunks of 262,144 values, 23.5 of 32,768, 24.8 of 16,384; 32-float
#: rows 1.72, 1.37, 1.48 (unpickle alone: 14.9 and 0.75). Chunks are joined into frames of
#: about ``_TARGET_BYTES`` (:func:`_frames`): each frame costs the TF process ~0.5 ms
#: (784-float rows in 83-row frames: 8-15 us/row there, in 333-row frames 4-6)
_CHUNK_VALUES = 32768


class Tally:
    """The rows taken from one partition's source (Spark's iterator of rows, its pickled batches
    or Arrow record batches), counted where they are taken, a chunk at a time, apart from how
    they are packed: ``FeedEnd`` says this number, so a row lost in packing shows on the node as
    a count mismatch (``FeedServer._end``), not as a shorter partition."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows = 0


def row_batches(
    partition: int, rows: Iterator[Any], first_row: int = 0, tally: Tally | None = None
) -> Iterator[ColumnBatch]:
    """Pack rows into batches of about 4 MB, from chunks of at most 32,768 Python values;
    a small first chunk measures the row size. Chunks of rows like the first (numbers, flat
    lists/tuples of numbers, arrays) are packed row by row as the rows come (:func:`_frames`).
    ``tally`` counts the rows taken from ``rows`` (see :class:`Tally`).

    Columns reuse buffers (:class:`Scratch`): each batch must be sent before the next is
    asked for.
    """
    # PySpark may hand a partition as a re-iterable (a ``range`` from ``parallelize``, the
    # list a user's ``mapPartitions`` returned): islice on it would restart at row 0 forever
    rows, tally = iter(rows), tally if tally is not None else Tally()
    with paused():
        first = list(itertools.islice(rows, 16))
        tally.rows += len(first)
        if not first:
            return
        head = pack_rows(first, partition, first_row, Scratch())  # an empty row: InputError
    values = max(_python_values(first[0]), 1)  # the rows are like the first
    per_row = max(head.nbytes // len(first), 1)
    frame_rows = max(1, min(65536, _TARGET_BYTES // per_row))
    size = max(1, min(frame_rows, _CHUNK_VALUES // values))
    plan = row_plan(head, first[0])
    first_row += len(first)
    del first
    yield head
    yield from _frames(partition, rows, first_row, (size, frame_rows), plan, tally)


def decoded_batches(partition: int, blobs: Iterator[bytes], tally: Tally | None = None) -> Iterator[ColumnBatch]:
    """Batches of about 4 MB from a partition's pickled batches of rows.

    Batches whose rows :class:`PickledRows` recognises become columns without unpickling; from
    the first one it does not, the rest of the partition is unpickled (as PySpark does) and
    packed as rows, so results, errors and their row numbers are those of ``train_rdd``.
    ``tally`` counts the rows of each pickled batch as it is read (see :class:`Tally`).
    """
    blobs, decoder, scratch = iter(blobs), PickledRows(), Scratch()
    tally = tally if tally is not None else Tally()
    pending: list[ColumnBatch] = []
    first_row = 0
    for blob in blobs:
        batch = decoder.decode(blob)
        if pending and (batch is None or not _same_layout(pending[0], batch)):
            yield _joined(pending, scratch)
            first_row += sum(b.count for b in pending)
            pending = []
        if batch is None:
            rows = itertools.chain.from_iterable(map(_unpickle, itertools.chain([blob], blobs)))
            yield from row_batches(partition, rows, first_row, tally)
            return
        tally.rows += batch.count
        pending.append(batch)
        if sum(b.nbytes for b in pending) >= _TARGET_BYTES:
            yield _joined(pending, scratch)
            first_row += sum(b.count for b in pending)
            pending = []
    if pending:
        yield _joined(pending, scratch)


def _frames(
    partition: int,
    rows: Iterator[Any],
    first_row: int,
    sizes: tuple[int, int],
    plan: RowPlan | None = None,
    tally: Tally | None = None,
) -> Iterator[ColumnBatch]:
    """``rows`` packed in chunks of ``size`` rows, joined into batches of ``frame_rows`` rows
    (``sizes``); with ``plan``, chunks of rows like it row by row (:meth:`_Frames.stream`).
    ``tally`` counts the rows taken from ``rows``, a call or chunk at a time."""
    size, frame_rows = sizes
    frames, tally = _Frames(partition, frame_rows, size), tally if tally is not None else Tally()
    while True:
        # live row tuples would be traversed and promoted by every collection meanwhile (~1 us a
        # tabular row, a quarter of the feed); they hold no cycles and die right after packing
        with paused():
            count, chunk, ended, taken = (
                frames.stream(rows, plan) if plan is not None and frames.streams(plan) else (0, [], False, 0)
            )
            first_row += count
            if chunk is None:  # packed as they came, up to a full frame or the end of the rows
                tally.rows += taken
                done = ended
                ready = frames.flush() if done else frames.full()
            else:
                held = len(chunk)  # the rows fill_frame left over (taken: counted in ``taken``)
                chunk.extend(itertools.islice(rows, size - held))
                tally.rows += taken + len(chunk) - held
                done = len(chunk) < size  # the rows ended: the frame ends here too
                ready = frames.add(chunk, first_row) if chunk else []
                ready += frames.flush() if done else []
                first_row += len(chunk)
            del chunk  # the rows die here, by reference counting, before the GC runs again
        yield from ready
        if done:
            return


class _Frames:
    """Chunks of rows packed into the frame being built (two, used in turn): row by row as they
    come where the rows are like a :class:`RowPlan` (:meth:`stream`); else a chunk at a time
    into one reused :class:`Scratch` (it stays in the CPU caches), then copied into the frame.
    Frames, errors and their row numbers are the same either way.

    A chunk that does not pack like the first row of its frame (an ``InputError``, another
    layout or dtype) is packed again behind that row, as one chunk of both would be packed: the
    error then names the row and what it differs from, as before; else the frame is cut there.
    A chunk of a whole frame's rows (array rows: few Python values), and one with a column of
    Python values (strings, objects) are frames of their own, sent from where they were packed.
    """

    def __init__(self, partition: int, frame_rows: int, size: int) -> None:
        self.partition, self.frame_rows, self.size, self.capacity = partition, frame_rows, size, frame_rows + size
        self.chunk, self.frame, self.other = Scratch(), Scratch(), Scratch()
        self.first: ColumnBatch | None = None  # the frame's first chunk, as packed
        self.columns: list[np.ndarray] = []  # the frame's columns, ``capacity`` rows each
        self.rows = 0
        self.ref: Any = None  # the frame's first row

    def streams(self, plan: RowPlan) -> bool:
        """The next chunk may be packed row by row: the frame is empty or laid out as ``plan``."""
        return self.first is None or self.first is plan.like or _same_layout(self.first, plan.like)

    def stream(self, rows: Iterator[Any], plan: RowPlan) -> tuple[int, list[Any] | None, bool, int]:
        """Rows pulled from ``rows`` into the frame until it is full, each packed as it comes (in
        the CPU caches still, with no second copy) and dropped, exactly as :meth:`add` would pack
        them chunk by chunk: (rows packed, None, whether ``rows`` ended, rows taken); or, from a
        row it does not handle, (the whole chunks packed before it, that row's chunk so far with
        that row, False, rows taken), for :meth:`add` to pack as before. Rows taken: those
        ``fill_frame`` pulled from ``rows``, as it counts them, whatever it packed."""
        new = self.first is None
        if new:
            self._allocate(plan.like)
        start, stop = self.rows, -(-self.frame_rows // self.size) * self.size
        end, leftover = fill_frame(rows, plan, self.columns, (start, stop), self.size)
        done = end - end % self.size if leftover is not None else end  # whole chunks, or all rows
        if new and done > 0:  # the frame's first row, for _recheck: rebuilt, as it was dropped
            self.first, self.ref = plan.like, rebuilt_rows(plan, self.columns, 0, 1)[0]
        self.rows = done
        if leftover is None:
            return done - start, None, end < stop, end - start
        return done - start, [*rebuilt_rows(plan, self.columns, done, end), *leftover], False, end - start + 1

    def add(self, chunk: list[Any], first_row: int) -> list[ColumnBatch]:
        """Pack ``chunk``; the frames now complete, to be sent before the next ``add``."""
        try:
            batch = pack_rows(chunk, self.partition, first_row, self.chunk)
        except InputError:
            self._recheck(chunk, first_row)
            raise
        ready = []
        if self.first is not None and not _same_layout(self.first, batch):
            self._recheck(chunk, first_row)
            ready = self.flush()
        if (self.first is None and batch.count >= self.frame_rows) or not all(
            isinstance(col, np.ndarray) for col in batch.columns
        ):
            return [*ready, batch]  # a frame already (array rows): sent before the next chunk reuses its memory
        if self.first is None:
            self._allocate(batch)
            self.first, self.ref = batch, chunk[0]
        for dest, col in zip(self.columns, batch.columns):
            dest[self.rows : self.rows + len(col)] = col
        self.rows += batch.count
        return ready + self.full()

    def full(self) -> list[ColumnBatch]:
        """The frame, once it holds ``frame_rows`` rows (else none yet); valid until the next chunk."""
        return self.flush() if self.rows >= self.frame_rows else []

    def _allocate(self, like: ColumnBatch) -> None:
        """Columns for a new frame of ``like``'s dtypes and per-row shapes."""
        self.columns = [
            self.frame.buffer(j, self.capacity * col[0:1].nbytes).view(col.dtype).reshape(-1, *col.shape[1:])
            for j, col in enumerate(like.columns)
        ]

    def flush(self) -> list[ColumnBatch]:
        """The frame built so far (none if it is empty); valid until the next ``add``."""
        if self.first is None:
            return []
        first, rows = self.first, self.rows
        self.first, self.rows, self.ref = None, 0, None
        self.frame, self.other = self.other, self.frame  # two frames may be ready at once
        return [ColumnBatch([col[:rows] for col in self.columns], first.layout, first.names, first.kinds)]

    def _recheck(self, chunk: list[Any], first_row: int) -> None:
        """Raise the ``InputError`` of the frame's first row and ``chunk`` packed as one chunk."""
        if self.ref is not None:
            pack_rows([self.ref, *chunk], self.partition, first_row - 1)


def _same_layout(a: ColumnBatch, b: ColumnBatch) -> bool:
    """The batches' columns can be joined: same layout, dtypes and per-row shapes."""
    return (
        a.layout == b.layout
        and a.kinds == b.kinds
        and a.names == b.names
        and len(a.columns) == len(b.columns)
        and all(
            isinstance(x, np.ndarray)
            and isinstance(y, np.ndarray)
            and x.dtype == y.dtype
            and x.shape[1:] == y.shape[1:]
            for x, y in zip(a.columns, b.columns)
        )
    )


def _unpickle(blob: bytes) -> Any:
    """One batch of rows, as PySpark's pickle serializer loads it."""
    return pickle.loads(blob, encoding="bytes")


def _joined(batches: list[ColumnBatch], scratch: Scratch) -> ColumnBatch:
    """Decoded batches of one layout as one batch, in ``scratch`` memory (valid until the next)."""
    if len(batches) == 1:
        return batches[0]
    columns = []
    for j, first in enumerate(batches[0].columns):
        parts = [b.columns[j] for b in batches]
        count = sum(len(p) for p in parts)
        out = scratch.buffer(j, count * first[0:1].nbytes).view(first.dtype).reshape((count, *first.shape[1:]))
        np.concatenate(parts, out=out)
        columns.append(out)
    return ColumnBatch(columns, batches[0].layout, batches[0].names, batches[0].kinds)


def _python_values(row: Any) -> int:
    """Python objects in a row, through its lists, tuples and dict values (an array counts 0)."""
    if isinstance(row, dict):
        return 1 + sum(map(_python_values, row.values()))
    if isinstance(row, (list, tuple)):
        return 1 + sum(map(_python_values, row))
    return 0 if isinstance(row, np.ndarray) else 1


def arrow_batches(partition: int, batches: Iterator[Any], tally: Tally) -> Iterator[ColumnBatch]:
    """Each non-empty Arrow record batch as columns; ``tally`` counts its rows as it comes."""
    first_row = 0
    for rb in batches:
        tally.rows += rb.num_rows
        if rb.num_rows:
            yield arrow_to_columns(rb, partition, first_row)
            first_row += rb.num_rows
