"""Feed tasks: stream one partition to a TF node as columnar batches (and read results back).

A feed task prefers the node on its own executor (same executor key) and falls back to the
others by partition index. RDD rows are packed into numpy columns here, and a stored RDD's
pickled batches are read as columns without unpickling (:func:`rdd_feed`); DataFrame
partitions arrive as Arrow record batches (``mapInArrow``) and never become Python rows.
"""

from __future__ import annotations

import gc
import itertools
import pickle
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FeedError, FeedTimeout, InputError, ProtocolError
from ..gcpause import paused
from ..host import executor_key
from ..wire import messages as m
from ..wire.arrow import arrow_to_columns, columns_to_arrow
from ..wire.codec import BATCH_KIND, ColumnBatch, decode_batch, encode_batch
from ..wire.framing import Connection, connect, connect_unix
from ..wire.packing import RowPlan, Scratch, fill_frame, pack_rows, rebuilt_rows, row_plan
from ..wire.pickled import PickledRows

__all__ = ["FeedTarget", "Feeder", "choose_target", "decoded_batches", "pickled_batches", "rdd_feed"]

_TARGET_BYTES = 4 * 1024 * 1024
#: Python objects in one chunk of rows at most: a chunk of list rows is unpickled (or made by
#: an uncached ``map``), held alive and packed, and the larger it is, the more of it has left
#: the CPU caches by the time it is packed and freed. Unpickle + pack + drop, CPU us per row:
#: 784-float list rows 27.8 in chunks of 262,144 values, 23.5 of 32,768, 24.8 of 16,384; 32-float
#: rows 1.72, 1.37, 1.48 (unpickle alone: 14.9 and 0.75). Chunks are joined into frames of
#: about ``_TARGET_BYTES`` (:func:`_frames`): each frame costs the TF process ~0.5 ms
#: (784-float rows in 83-row frames: 8-15 us/row there, in 333-row frames 4-6)
_CHUNK_VALUES = 32768
#: feed ids made here are ``<this driver>:<n>``, n counting up: a node keeps one number per
#: such stream of feeds, not every id (tfprocess/delivered.py ``Delivered``)
_DRIVER_FEEDS = uuid.uuid4().hex[:16]
_FEED_NUMBERS = itertools.count()


class _Tally:
    """The rows taken from one partition's source (Spark's iterator of rows, its pickled batches
    or Arrow record batches), counted where they are taken, a chunk at a time, apart from how
    they are packed: ``FeedEnd`` says this number, so a row lost in packing shows on the node as
    a count mismatch (``FeedServer._end``), not as a shorter partition."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows = 0


@dataclass(frozen=True)
class FeedTarget:
    """A node that accepts fed data."""

    name: str
    executor_key: str
    host: str
    port: int
    unix_path: str = ""  # set when the node's data server also listens on a Unix socket


def choose_target(targets: list[FeedTarget], key: str, partition: int) -> FeedTarget:
    """The node on this executor if there is one, else spread partitions over all nodes."""
    local = [t for t in targets if t.executor_key == key]
    pool = local or targets
    return pool[partition % len(pool)]


def _open(target: FeedTarget, key: str, secret: bytes, timeout: float) -> Connection:
    """Unix socket (unsigned frames) to a node on this executor, else TCP (signed frames)."""
    if target.unix_path and target.executor_key == key:
        try:
            return connect_unix(target.unix_path, secret, timeout=timeout)
        except (FileNotFoundError, ConnectionRefusedError):
            pass  # same key, other filesystem (e.g. a container): TCP reaches it
    return connect((target.host, target.port), secret, timeout=timeout)


class _Link:
    """One partition's connection to its node, with timeouts and terminate detection."""

    def __init__(self, feeder: Feeder, partition: int) -> None:
        key = executor_key()
        self.target = choose_target(feeder.targets, key, partition)
        self.partition = partition
        self.timeout = feeder.feed_timeout
        try:
            self.conn: Connection = _open(self.target, key, feeder.secret, min(30.0, self.timeout))
        except OSError as exc:
            raise FeedError(
                f"node {self.target.name} at {self.target.host}:{self.target.port} is not "
                f"accepting data ({exc}); its TF process has exited or was stopped"
            ) from None
        self.conn.settimeout(self.timeout)
        self.terminated = False

    def fail(self, exc: BaseException) -> BaseException:
        if isinstance(exc, TimeoutError):
            return FeedTimeout(
                f"node {self.target.name} took no data and returned no result for "
                f"feed_timeout={self.timeout:.0f}s while feeding partition "
                f"{self.partition}; is map_fun reading its DataFeed? Raise feed_timeout "
                "if its steps are slow."
            )
        return FeedError(
            f"feeding partition {self.partition} to node {self.target.name} failed: {type(exc).__name__}: {exc}"
        )

    def stop_requested(self) -> bool:
        """Non-blocking check for a Terminate from the node."""
        if not self.terminated and self.conn.poll():
            msg = m.recv_message(self.conn, m.Terminate)
            self.terminated = isinstance(msg, m.Terminate)
        return self.terminated


class Feeder:
    """The picklable feed-task functions for one ``train``/``inference`` call."""

    def __init__(
        self, targets: list[FeedTarget], secret_hex: str, qname: str, feed_timeout: float, feed_id: str = ""
    ) -> None:
        if not targets:
            raise FeedError("no node of this cluster accepts data (all are ps/evaluator, or none is up)")
        self.targets = targets
        self.secret = bytes.fromhex(secret_hex)
        self.qname = qname
        self.feed_timeout = float(feed_timeout)
        #: made on the driver, so every task of one train()/inference() call shares it: with the
        #: partition index it lets a node recognise a retried partition it already delivered
        self.feed_id = feed_id or f"{_DRIVER_FEEDS}:{next(_FEED_NUMBERS)}"

    def _start(self, link: _Link, train: bool, names: list[str] | None = None) -> m.FeedStart:
        return m.FeedStart(self.qname, train, link.partition, names or [], self.feed_id, _attempt(), self.feed_timeout)

    # ---- batching ----------------------------------------------------------------------------
    @staticmethod
    def _row_batches(
        partition: int, rows: Iterator[Any], first_row: int = 0, tally: _Tally | None = None
    ) -> Iterator[ColumnBatch]:
        """Pack rows into batches of about 4 MB, from chunks of at most 32,768 Python values;
        a small first chunk measures the row size. Chunks of rows like the first (numbers, flat
        lists/tuples of numbers, arrays) are packed row by row as the rows come (:func:`_frames`).
        ``tally`` counts the rows taken from ``rows`` (see :class:`_Tally`).

        Columns reuse buffers (:class:`Scratch`): each batch must be sent before the next is
        asked for.
        """
        # PySpark may hand a partition as a re-iterable (a ``range`` from ``parallelize``, the
        # list a user's ``mapPartitions`` returned): islice on it would restart at row 0 forever
        rows, tally = iter(rows), tally if tally is not None else _Tally()
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

    # ---- training ----------------------------------------------------------------------------
    def _send_partition(self, link: _Link, batches: Iterator[ColumnBatch], train: bool, tally: _Tally) -> int:
        """Stream ``batches`` over ``link``, then ``FeedEnd`` with the rows ``tally`` counted
        taken (not the rows sent: the node checks that they all arrived); stop early if the node
        asks to. The rows taken, or sent so far where the node stopped the feed."""
        m.send_message(link.conn, self._start(link, train))
        count = 0
        for batch in batches:
            if link.stop_requested():
                return count
            link.conn.send(*encode_batch(batch))
            count += batch.count
        if not link.terminated:
            m.send_message(link.conn, m.FeedEnd(tally.rows))
            return tally.rows
        return count

    def _train(self, partition: int, batches: Iterator[ColumnBatch], tally: _Tally) -> int:
        _freeze_worker_heap()
        first = next(batches, None)
        if first is None:  # empty partitions need no connection
            _check_none_taken(partition, tally)
            return 0
        # the link is opened here, not inside _send_partition, so that a failure while sending
        # still becomes link.fail(...) (FeedTimeout naming the node) and the link is closed
        link = _Link(self, partition)
        try:
            link.conn.offer_ring()  # same host: frames through shared memory (this thread alone sends, reads)
            count = self._send_partition(link, itertools.chain([first], batches), True, tally)
            if link.terminated:
                return count
            reply: m.Message = m.Pending()
            while isinstance(reply, m.Pending):  # Pending: map_fun is still reading what came before
                reply = m.recv_message(link.conn, m.Ack, m.Terminate, m.Reject, m.Pending)
            if isinstance(reply, m.Reject):  # e.g. a replay of a feed the node no longer remembers
                raise FeedError(f"node {link.target.name}: {reply.reason}")
            if isinstance(reply, m.Ack) and reply.count != count:
                raise FeedError(
                    f"node {link.target.name} acknowledged {reply.count} of {count} rows of partition {partition}"
                )
            return count
        except (OSError, ProtocolError) as exc:
            raise link.fail(exc) from None
        finally:
            link.conn.close()

    def train_rdd(self, partition: int, rows: Iterator[Any]) -> Iterator[int]:
        tally = _Tally()
        yield self._train(partition, self._row_batches(partition, rows, 0, tally), tally)

    def train_pickled(self, partition: int, blobs: Iterator[bytes]) -> Iterator[int]:
        """``train_rdd`` over the RDD's pickled batches (see :func:`pickled_batches`)."""
        tally = _Tally()
        yield self._train(partition, decoded_batches(partition, blobs, tally), tally)

    def train_arrow(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        partition, tally = _partition_id(TaskContext.get()), _Tally()
        count = self._train(partition, _arrow_batches(partition, batches, tally), tally)
        yield pa.RecordBatch.from_pydict({"rows": pa.array([count], pa.int64())})

    # ---- inference ---------------------------------------------------------------------------
    def _infer(self, partition: int, batches: Iterator[ColumnBatch], tally: _Tally) -> Iterator[ColumnBatch]:
        """Send the partition from a thread while results stream back here, in order."""
        _freeze_worker_heap()
        first = next(batches, None)
        if first is None:
            _check_none_taken(partition, tally)
            return
        link = _Link(self, partition)
        sent: dict[str, Any] = {"count": None, "error": None}
        sender = threading.Thread(
            target=self._infer_send, args=(link, itertools.chain([first], batches), sent, tally), daemon=True
        )
        sender.start()
        received = 0
        try:
            while True:
                payload = link.conn.recv()
                if bytes(payload[:1]) == BATCH_KIND:
                    result = decode_batch(payload)
                    received += result.count
                    yield result
                    continue
                msg = m.decode(payload)
                if isinstance(msg, m.Terminate):
                    raise FeedError(
                        f"node {link.target.name} terminated the feed during inference "
                        f"of partition {partition}; {received} results were returned"
                    )
                if isinstance(msg, m.Reject):  # e.g. rows lost on the way: the node refused the partition
                    raise FeedError(f"node {link.target.name}: {msg.reason}")
                if isinstance(msg, m.ResultsEnd):
                    break
            sender.join(self.feed_timeout)
            if sent["error"] is not None:
                raise sent["error"]
            if sent["count"] != received:
                raise FeedError(
                    f"partition {partition}: node {link.target.name} returned {received} "
                    f"results for {sent['count']} rows; map_fun must call batch_results "
                    "with exactly one result per row"
                )
        except (OSError, ProtocolError) as exc:
            raise (sent["error"] or link.fail(exc)) from None
        finally:
            link.conn.close()

    def _infer_send(self, link: _Link, batches: Iterator[ColumnBatch], sent: dict[str, Any], tally: _Tally) -> None:
        """Send the partition, then ``FeedEnd`` with the rows taken (see :meth:`_send_partition`)."""
        try:
            m.send_message(link.conn, self._start(link, False))
            for batch in batches:
                link.conn.send(*encode_batch(batch))
            m.send_message(link.conn, m.FeedEnd(tally.rows))
            sent["count"] = tally.rows
        except InputError as exc:
            sent["error"] = exc
            link.conn.close()
        except (OSError, ProtocolError) as exc:
            sent["error"] = link.fail(exc)

    def infer_rdd(self, partition: int, rows: Iterator[Any]) -> Iterator[Any]:
        tally = _Tally()
        for result in self._infer(partition, self._row_batches(partition, rows, 0, tally), tally):
            yield from result.rows(as_fed=True)  # what map_fun passed to batch_results, as in TFoS

    def infer_pickled(self, partition: int, blobs: Iterator[bytes]) -> Iterator[Any]:
        """``infer_rdd`` over the RDD's pickled batches (see :func:`pickled_batches`)."""
        tally = _Tally()
        for result in self._infer(partition, decoded_batches(partition, blobs, tally), tally):
            yield from result.rows(as_fed=True)

    def infer_arrow(self, schema_json: str) -> Any:
        """The ``mapInArrow`` function for DataFrame inference with the given result schema."""

        def run(batches: Iterator[Any]) -> Iterator[Any]:
            from pyspark import TaskContext

            partition, tally = _partition_id(TaskContext.get()), _Tally()
            for result in self._infer(partition, _arrow_batches(partition, batches, tally), tally):
                yield columns_to_arrow(result, schema_json)

        return run


def pickled_batches(rdd: Any) -> Any | None:
    """``rdd`` read as the pickled batches Spark keeps it in (one ``bytes`` per batch of rows).

    Only where that costs nothing: the rows are stored by PySpark's batched pickle serializer
    (a cached, unioned, parallelized or checkpointed RDD), not computed by an uncached ``map``
    that would otherwise run inside the feed task itself. None otherwise.
    """
    from pyspark.rdd import RDD, PipelinedRDD
    from pyspark.serializers import (
        AutoBatchedSerializer,
        BatchedSerializer,
        CloudPickleSerializer,
        NoOpSerializer,
        PickleSerializer,
    )

    if isinstance(rdd, PipelinedRDD) and rdd._is_pipelinable():
        return None
    serializer: Any = getattr(rdd, "_jrdd_deserializer", None)
    if type(serializer) not in (BatchedSerializer, AutoBatchedSerializer):
        return None  # e.g. FlattenedValuesSerializer, a pair/cartesian or UTF-8 deserializer
    if type(serializer.serializer) not in (PickleSerializer, CloudPickleSerializer):
        return None
    return RDD(rdd._jrdd, rdd.ctx, NoOpSerializer())


def rdd_feed(rdd: Any, by_rows: Callable[..., Any], by_pickles: Callable[..., Any]) -> Any:
    """``mapPartitionsWithIndex`` of a feed function over ``rdd``: ``by_pickles`` over its
    pickled batches where :func:`pickled_batches` allows, else ``by_rows`` over its rows."""
    raw = pickled_batches(rdd)
    if raw is None:
        return rdd.mapPartitionsWithIndex(by_rows)
    return raw.mapPartitionsWithIndex(by_pickles)


def decoded_batches(partition: int, blobs: Iterator[bytes], tally: _Tally | None = None) -> Iterator[ColumnBatch]:
    """Batches of about 4 MB from a partition's pickled batches of rows.

    Batches whose rows :class:`PickledRows` recognises become columns without unpickling; from
    the first one it does not, the rest of the partition is unpickled (as PySpark does) and
    packed as rows, so results, errors and their row numbers are those of ``train_rdd``.
    ``tally`` counts the rows of each pickled batch as it is read (see :class:`_Tally`).
    """
    blobs, decoder, scratch = iter(blobs), PickledRows(), Scratch()
    tally = tally if tally is not None else _Tally()
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
            yield from Feeder._row_batches(partition, rows, first_row, tally)
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
    tally: _Tally | None = None,
) -> Iterator[ColumnBatch]:
    """``rows`` packed in chunks of ``size`` rows, joined into batches of ``frame_rows`` rows
    (``sizes``); with ``plan``, chunks of rows like it row by row (:meth:`_Frames.stream`).
    ``tally`` counts the rows taken from ``rows``, a call or chunk at a time."""
    size, frame_rows = sizes
    frames, tally = _Frames(partition, frame_rows, size), tally if tally is not None else _Tally()
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


_heap_frozen = False


def _freeze_worker_heap() -> None:
    """Once per Python worker: move the objects alive now out of the cyclic GC's sight.

    A reused PySpark worker runs a full ``gc.collect()`` after every task. With pyspark, numpy
    and pyarrow loaded that walks ~40k long-lived objects (10-15 ms): ~1.5-2.5 us per row of a
    7,500-row MNIST partition, as much as packing the row. Frozen objects are never collected;
    they are modules and their state, alive as long as the worker. Objects made later are
    collected as usual. Outside a Spark task (a feeder run in-process) nothing is frozen.
    """
    global _heap_frozen
    if _heap_frozen:
        return
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return
    _heap_frozen = True
    gc.freeze()  # O(1); the worker collected after its last task, so little garbage is kept


def _python_values(row: Any) -> int:
    """Python objects in a row, through its lists, tuples and dict values (an array counts 0)."""
    if isinstance(row, dict):
        return 1 + sum(map(_python_values, row.values()))
    if isinstance(row, (list, tuple)):
        return 1 + sum(map(_python_values, row))
    return 0 if isinstance(row, np.ndarray) else 1


def _arrow_batches(partition: int, batches: Iterator[Any], tally: _Tally) -> Iterator[ColumnBatch]:
    """Each non-empty Arrow record batch as columns; ``tally`` counts its rows as it comes."""
    first_row = 0
    for rb in batches:
        tally.rows += rb.num_rows
        if rb.num_rows:
            yield arrow_to_columns(rb, partition, first_row)
            first_row += rb.num_rows


def _check_none_taken(partition: int, tally: _Tally) -> None:
    """A partition that gave no batch took no row (else packing lost them all: no connection
    would be opened, so no node could see the count)."""
    if tally.rows:
        raise FeedError(f"partition {partition}: {tally.rows} rows were taken but none was packed into a batch")


def _attempt() -> int:
    """This Spark task's attempt number (0 outside a task)."""
    from pyspark import TaskContext

    task = TaskContext.get()
    return int(task.attemptNumber()) if task is not None else 0


def _partition_id(task: Any) -> int:
    if task is None:
        raise FeedError("feed functions must run inside a Spark task")
    return int(task.partitionId())
