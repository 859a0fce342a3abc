"""Feed tasks: stream one partition to a TF node as columnar batches (and read results back).

A feed task prefers the node on its own executor (same executor key) and falls back to the
others by partition index, sends ``FeedStart``, the partition's batches and ``FeedEnd``, and
waits for the node's Ack (training) or reads the results back (inference). The batches come
from :mod:`.feedbatches`: RDD rows packed into numpy columns, a stored RDD's pickled batches
read as columns without unpickling (:func:`rdd_feed` chooses), DataFrame partitions as Arrow
record batches (``mapInArrow``) that never become Python rows.
"""

from __future__ import annotations

import gc
import itertools
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import FeedError, FeedTimeout, InputError, ProtocolError
from ..host import executor_key
from ..wire import messages as m
from ..wire.arrow import columns_to_arrow
from ..wire.codec import BATCH_KIND, ColumnBatch, decode_batch, encode_batch
from ..wire.framing import Connection, connect, connect_unix
from .feedbatches import Tally, arrow_batches, decoded_batches, row_batches

__all__ = ["FeedTarget", "Feeder", "choose_target", "pickled_batches", "rdd_feed"]

#: feed ids made here are ``<this driver>:<n>``, n counting up: a node keeps one number per
#: such stream of feeds, not every id (tfprocess/delivered.py ``Delivered``)
_DRIVER_FEEDS = uuid.uuid4().hex[:16]
_FEED_NUMBERS = itertools.count()


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

    def _send_partition(self, link: _Link, batches: Iterator[ColumnBatch], train: bool, tally: Tally) -> int:
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

    def _train(self, partition: int, batches: Iterator[ColumnBatch], tally: Tally) -> int:
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
        tally = Tally()
        yield self._train(partition, row_batches(partition, rows, 0, tally), tally)

    def train_pickled(self, partition: int, blobs: Iterator[bytes]) -> Iterator[int]:
        """``train_rdd`` over the RDD's pickled batches (see :func:`pickled_batches`)."""
        tally = Tally()
        yield self._train(partition, decoded_batches(partition, blobs, tally), tally)

    def train_arrow(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        partition, tally = _partition_id(TaskContext.get()), Tally()
        count = self._train(partition, arrow_batches(partition, batches, tally), tally)
        yield pa.RecordBatch.from_pydict({"rows": pa.array([count], pa.int64())})

    # ---- inference ---------------------------------------------------------------------------
    def _infer(self, partition: int, batches: Iterator[ColumnBatch], tally: Tally) -> Iterator[ColumnBatch]:
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

    def _infer_send(self, link: _Link, batches: Iterator[ColumnBatch], sent: dict[str, Any], tally: Tally) -> None:
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
        tally = Tally()
        for result in self._infer(partition, row_batches(partition, rows, 0, tally), tally):
            yield from result.rows(as_fed=True)  # what map_fun passed to batch_results, as in TFoS

    def infer_pickled(self, partition: int, blobs: Iterator[bytes]) -> Iterator[Any]:
        """``infer_rdd`` over the RDD's pickled batches (see :func:`pickled_batches`)."""
        tally = Tally()
        for result in self._infer(partition, decoded_batches(partition, blobs, tally), tally):
            yield from result.rows(as_fed=True)

    def infer_arrow(self, schema_json: str) -> Any:
        """The ``mapInArrow`` function for DataFrame inference with the given result schema."""

        def run(batches: Iterator[Any]) -> Iterator[Any]:
            from pyspark import TaskContext

            partition, tally = _partition_id(TaskContext.get()), Tally()
            for result in self._infer(partition, arrow_batches(partition, batches, tally), tally):
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


def _check_none_taken(partition: int, tally: Tally) -> None:
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
