"""``DataFeed``: what TF code reads fed Spark data from (TFoS semantics plus a ``tf.data`` face).

``next_batch(n)`` returns up to ``n`` rows (a list of rows, or with ``input_mapping`` a dict of
tensor name -> numpy array); in inference mode a batch never spans two partitions, so results
can go back to the partition they belong to. ``as_dataset(batch_size)`` streams whole columnar
batches into ``tf.data`` without per-row Python work.

One ``DataFeed`` may be read from several threads at once (the training loop, ``tf.data``'s
prefetch threads, :meth:`DataFeed.drain`): every read takes the feed's lock, so each batch comes
whole from one read and every row goes to exactly one reader.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import FeedError, InputError
from ..wire.buffers import RecvBuffers
from ..wire.codec import ColumnBatch
from ..wire.events import EpochRead
from .batchjoin import concat
from .feedqueue import END_FEED, EpochMark
from .feedresults import HeldResults, results_batch
from .feedserver import FeedServer, Stream
from .localfeed import LocalFeeds

__all__ = ["DataFeed", "feed_dataset"]

_DRAIN_BATCH = 16_384  # rows per read while draining
#: memory for batches joined from two received frames, reused once the reader drops them: a
#: fresh multi-MB array is page-faulted in at every read, a fifth of a TF process's CPU per
#: fed MNIST row when most batches cross a frame boundary
_JOIN_POOL_BYTES = 64 << 20


def _feed_source(mgr: Any) -> FeedServer | LocalFeeds:
    """The node's feed server (``ctx.mgr``), or a :class:`LocalFeeds` a test filled."""
    if not isinstance(mgr, (FeedServer, LocalFeeds)):
        raise FeedError(
            "this node has no data feed: get_data_feed() needs a cluster started with "
            "input_mode=InputMode.SPARK, on a chief/master/worker node (or, in a test, "
            f"tfonspark.TFManager.start(...)). Received: ctx.mgr={type(mgr).__name__}"
        )
    return mgr


class DataFeed:
    """Reads batches fed by ``Cluster.train``/``inference`` on this node.

    Thread-safe: reads (:meth:`next_columns`, :meth:`next_batch`, :meth:`as_dataset`'s
    generator, :meth:`drain`) are serialised by a lock, so concurrent readers never interleave
    inside a batch, and each row is read once. A reader waiting for data holds the lock; the
    others wait for it. :meth:`batch_results` answers the last batch read on this feed, by any
    thread: an inference loop must read and answer from one thread at a time.

    In ``map_fun`` get one with ``ctx.get_data_feed(...)`` (same parameters, ``mgr`` filled in).

    Parameters
    ----------
    mgr : FeedServer or LocalFeeds
        Where the fed data arrives: ``ctx.mgr`` on a node of a cluster started with
        ``input_mode=InputMode.SPARK``, or a :class:`~tfonspark.tfprocess.localfeed.LocalFeeds`
        (``TFManager.start(...)``) to test ``map_fun`` without Spark. Anything else raises
        :class:`~tfonspark.errors.FeedError`.
    train_mode : bool, default True
        True for ``Cluster.train`` feeds; False for ``Cluster.inference``, where a batch never
        spans two partitions and each batch must be answered with :meth:`batch_results`.
    qname_in : str, default "input"
        The queue to read (the ``qname`` the driver fed).
    qname_out : str, default "output"
        Kept for TFoS compatibility; results go back to the partition they came from.
    input_mapping : dict or list of str, optional
        Column name -> tensor name (a list maps each column to itself). With it, reads return
        ``{tensor name: numpy array}``, looking columns up by name, or for unnamed fields by the
        position of the column in sorted order (TFoS).

    Examples
    --------
    >>> from tfonspark.tfprocess.localfeed import LocalFeeds
    >>> feeds = LocalFeeds(["input", "output"])
    >>> for i in range(3):
    ...     feeds.get_queue("input").put(([float(i), 1.0], i))
    >>> feeds.get_queue("input").put(None)  # the end of the feed
    >>> feed = DataFeed(feeds)
    >>> feed.next_batch(2)
    [([0.0, 1.0], 0), ([1.0, 1.0], 1)]
    """

    def __init__(
        self,
        mgr: Any,
        train_mode: bool = True,
        qname_in: str = "input",
        qname_out: str = "output",
        input_mapping: Mapping[str, str] | list[str] | None = None,
    ) -> None:
        self.server = _feed_source(mgr)
        self.train_mode = train_mode
        self.qname_in = qname_in
        self.qname_out = qname_out
        self.queue = self.server.queue(qname_in)
        self.input_mapping = _normalise_mapping(input_mapping)
        self.done_feeding = False
        self._pending: tuple[Stream, ColumnBatch, int] | None = None
        self._last: tuple[Stream | None, int] = (None, 0)
        self._mid_frame = False  # the last read left rows of its received frame for the next
        self._lock = threading.Lock()  # held by every read (see the class docstring)
        self._joins = RecvBuffers(_JOIN_POOL_BYTES)  # batches joined from two frames (``concat``)
        self._held = HeldResults()

    # ---- reading -------------------------------------------------------------------------
    def _fill(self, stop_at_boundary: bool = False) -> bool:
        """Make sure a batch is pending; False at the end of the feed.

        With ``stop_at_boundary`` (inference, rows already taken) a partition boundary also
        returns False, so a batch never mixes rows of two partitions.
        """
        while self._pending is None:
            if self.done_feeding:
                return False
            stream, item = self._get()
            if item is END_FEED:
                self.done_feeding = True
                return False
            if isinstance(item, EpochMark):  # the driver re-feeds from the first epoch not read through
                if isinstance(self.server, FeedServer):
                    self.server.on_event(EpochRead(item.feed_id, item.epoch))
                continue
            if item is None:  # partition boundary
                if stream is not None:
                    stream.maybe_finish()
                if stop_at_boundary:
                    return False
                continue
            if stream is not None and not stream.train and stream.closed.is_set():
                continue  # its feeder is gone: Spark retries the partition, whose results count
            if item.count == 0:
                continue  # no rows to read or answer: no reader ever gets a 0-row batch
            self._pending = (stream, item, 0)
        return True

    def _get(self) -> tuple[Any, Any]:
        """The next queue item, waiting for it as long as it takes (TFoS semantics); on a node,
        a wait is registered with the feed server, which tells the driver if it starves or lasts."""
        try:
            return self.queue.get(timeout=0)
        except TimeoutError:
            pass
        server = self.server
        if not isinstance(server, FeedServer):
            return self.queue.get()
        qname, queue, train = self.qname_in, self.queue, self.train_mode
        with server.waits.waiting(
            f"data of queue {qname!r}: nothing is queued for map_fun",
            "none: DataFeed waits while the driver lives and has not ended the feed (TFoS semantics)",
            qname=qname,
            starving=(lambda: train and queue.empty and not server.receiving(qname)),
        ):
            return self.queue.get()

    def next_columns(self, batch_size: int) -> ColumnBatch | None:
        """Up to ``batch_size`` rows as columns, or None once the feed has ended.

        Blocks until data arrives or the driver ends the feed. Safe to call from several threads.
        No per-row Python work: each column is one numpy array (a list for strings).

        Parameters
        ----------
        batch_size : int
            The most rows to return (>= 1; fewer at the end of the feed or, in inference mode,
            of a partition).

        Returns
        -------
        ColumnBatch or None
            ``.count`` rows in ``.columns`` (one per field, axis 0 is the row), ``.names`` for
            named (dict or DataFrame) rows; None once the feed has ended.

        Examples
        --------
        >>> from tfonspark.tfprocess.localfeed import LocalFeeds
        >>> feeds = LocalFeeds(["input"])
        >>> for i in range(5):
        ...     feeds.get_queue("input").put(([float(i), 1.0], i))
        >>> feeds.get_queue("input").put(None)
        >>> batch = DataFeed(feeds).next_columns(4)
        >>> batch.count, batch.columns[1].tolist()
        (4, [0, 1, 2, 3])
        """
        if batch_size < 1:
            raise InputError(f"batch_size must be >= 1. Received: {batch_size}")
        with self._lock:
            return self._read(batch_size)

    def _read(self, batch_size: int) -> ColumnBatch | None:
        """``next_columns`` with the lock held."""
        parts: list[ColumnBatch] = []
        total = 0
        stream: Stream | None = None
        while total < batch_size:
            if not self._fill(stop_at_boundary=not self.train_mode and total > 0):
                break
            assert self._pending is not None
            s, batch, offset = self._pending
            if not self.train_mode and stream is not None and s is not stream:
                break
            stream = s
            take = min(batch_size - total, batch.count - offset)
            parts.append(batch.slice(offset, offset + take) if (offset or take < batch.count) else batch)
            total += take
            self._pending = None if offset + take == batch.count else (s, batch, offset + take)
        self._last = (stream, total)
        self._mid_frame = self._pending is not None and self._pending[0] is stream
        if total:
            self.queue.note_read()  # progress, which keeps paced feeders waiting (FeedServer._pace)
        return concat(parts, self._joins) if parts else None

    def next_batch(self, batch_size: int) -> Any:
        """TFoS ``next_batch``: a list of up to ``batch_size`` rows, or a dict with ``input_mapping``.

        Rows come back as they were fed, as in TFoS: a row fed as ``([1.0, 2.0], 7)`` is read as
        ``([1.0, 2.0], 7)``, list and tuple values and rows included; numpy values stay numpy,
        and DataFrame rows are tuples of numpy arrays. Rebuilding lists costs about as much
        per value as unpickling them: :meth:`next_columns`, :meth:`as_dataset` and
        ``input_mapping`` hand out numpy columns instead.

        Parameters
        ----------
        batch_size : int
            The most rows to return (>= 1).

        Returns
        -------
        list or dict
            The rows (``[]`` once the feed has ended); with ``input_mapping``, a dict of tensor
            name -> numpy array (empty lists once the feed has ended).

        Examples
        --------
        >>> from tfonspark.tfprocess.localfeed import LocalFeeds
        >>> feeds = LocalFeeds(["input"])
        >>> for i in range(3):
        ...     feeds.get_queue("input").put({"x": [i, i], "y": i})
        >>> feeds.get_queue("input").put(None)
        >>> feed = DataFeed(feeds, input_mapping={"x": "features", "y": "label"})
        >>> batch = feed.next_batch(2)
        >>> batch["features"].tolist(), batch["label"].tolist()
        ([[0, 0], [1, 1]], [0, 1])
        """
        batch = self.next_columns(batch_size)
        if batch is None:
            return {t: [] for t in self.input_mapping.values()} if self.input_mapping else []
        if self.input_mapping:
            return self._mapped(batch)
        return batch.rows(as_fed=True)

    def _mapped(self, batch: ColumnBatch) -> dict[str, Any]:
        """Columns renamed to tensors: by column name, or by sorted-name position (TFoS)."""
        assert self.input_mapping is not None
        out: dict[str, Any] = {}
        for position, (column, tensor) in enumerate(sorted(self.input_mapping.items())):
            if batch.names is not None:
                if column not in batch.names:
                    raise InputError(
                        f"input_mapping names column {column!r} but the fed data has columns {batch.names}",
                        column=column,
                    )
                out[tensor] = batch.columns[batch.names.index(column)]
            elif position < len(batch.columns) and batch.layout != "scalar":
                out[tensor] = batch.columns[position]
            else:
                raise InputError(
                    f"input_mapping has {len(self.input_mapping)} columns but fed rows "
                    f"have {len(batch.columns)} unnamed fields",
                    column=column,
                )
        return out

    def should_stop(self) -> bool:
        """True once the feed has ended (TFoS ``should_stop``): the read loop's exit test.

        Examples
        --------
        >>> from tfonspark.tfprocess.localfeed import LocalFeeds
        >>> feeds = LocalFeeds(["input"])
        >>> for i in range(5):
        ...     feeds.get_queue("input").put(i)
        >>> feeds.get_queue("input").put(None)
        >>> feed = DataFeed(feeds)
        >>> while not feed.should_stop():
        ...     print(feed.next_batch(2))
        [0, 1]
        [2, 3]
        [4]
        """
        return self.done_feeding

    def drain(self) -> int:
        """Read and drop whatever is left of a training feed; return how many rows were dropped.

        For ``model.fit(..., steps_per_epoch=...)`` on a feed: the steps are fixed, the fed rows
        are not exactly a multiple of them (and not split evenly between nodes), so the last
        step leaves rows behind. Until they are read, the feed's buffer stays full and the
        driver's ``cluster.train`` cannot finish. Call ``drain()`` after training: it returns
        when the feed ends (the driver's ``cluster.shutdown()``, or :meth:`terminate` on this
        node), so do work that must not wait for the driver before it. A ``tf.data`` pipeline still
        prefetching from this feed on another thread is fine: the two share the lock, and the
        rows either of them reads are gone.

        Training feeds only: an inference feed owes one result per row (``batch_results``).

        Returns
        -------
        int
            The number of rows dropped.

        Examples
        --------
        >>> from tfonspark.tfprocess.localfeed import LocalFeeds
        >>> feeds = LocalFeeds(["input"])
        >>> for i in range(10):
        ...     feeds.get_queue("input").put(i)
        >>> feeds.get_queue("input").put(None)
        >>> feed = DataFeed(feeds)
        >>> feed.next_batch(4)  # e.g. model.fit(dataset, steps_per_epoch=...) read this much
        [0, 1, 2, 3]
        >>> feed.drain()
        6
        """
        if not self.train_mode:
            raise InputError(
                "drain() drops rows, which an inference feed must answer one for one with "
                "batch_results(). Received: a DataFeed with train_mode=False"
            )
        dropped = 0
        while (batch := self.next_columns(_DRAIN_BATCH)) is not None:
            dropped += batch.count
        return dropped

    # ---- results and control ------------------------------------------------------------------
    def batch_results(self, results: Any) -> None:
        """Send one result per row of the last batch back to the partition it came from.

        ``Cluster.inference`` returns the results in the order of its rows. Call it once after
        each read of an inference feed (``train_mode=False``), from the thread that read.

        Parameters
        ----------
        results : sequence
            Exactly one result per row of the last batch read (a list, or a numpy array whose
            first axis is the row); a different length raises
            :class:`~tfonspark.errors.InputError`.

        Examples
        --------
        >>> from tfonspark.tfprocess.localfeed import LocalFeeds
        >>> feeds = LocalFeeds(["input", "output"])
        >>> for i in range(3):
        ...     feeds.get_queue("input").put(([1.0, float(i)],))
        >>> feeds.get_queue("input").put(None)
        >>> feed = DataFeed(feeds, train_mode=False)
        >>> rows = feed.next_batch(10)
        >>> feed.batch_results([sum(x) for (x,) in rows])
        >>> [feeds.get_queue("output").get() for _ in rows]
        [1.0, 2.0, 3.0]
        """
        stream, count = self._last
        n = len(results)
        if n != count:
            raise InputError(
                f"batch_results received {n} results for a batch of {count} rows; "
                "return exactly one result per input row"
            )
        if stream is None or n == 0:
            return
        batch = results_batch(results)
        if isinstance(stream, Stream):  # a feeder over a socket: one frame per received frame
            self._held.add(stream, batch, flush=not self._mid_frame)
        else:
            stream.answer(batch)

    def terminate(self) -> None:
        """Stop the feed early: queued data is dropped and feed tasks stop sending.

        A reader blocked waiting for data wakes up and sees the end of the feed. For a node that
        has what it needs (e.g. reached its step count) before the driver ends the feed.

        Examples
        --------
        >>> from tfonspark.tfprocess.localfeed import LocalFeeds
        >>> feeds = LocalFeeds(["input"])
        >>> for i in range(10):
        ...     feeds.get_queue("input").put(i)
        >>> feed = DataFeed(feeds)
        >>> feed.next_batch(3)
        [0, 1, 2]
        >>> feed.terminate()
        >>> feed.should_stop(), feed.next_batch(3)
        (True, [])
        """
        self.server.terminate()  # first: it wakes a reader that holds the lock while waiting
        self._held.flush()
        with self._lock:
            self.done_feeding = True
            self._pending = None  # the rest of a partly read batch is dropped too

    # ---- tf.data -------------------------------------------------------------------------------
    def as_dataset(self, batch_size: int, output_signature: Any = None) -> Any:
        """A ``tf.data.Dataset`` of fed batches (tuples, or dicts for named/mapped columns).

        The element spec is static: taken from ``output_signature`` or from the first batch
        (``None`` batch dimension); later batches are cast to it or rejected with InputError.
        The dataset reads through :meth:`next_columns` (on ``tf.data``'s threads), so it may be
        iterated while this node also calls :meth:`drain` or reads the feed itself.

        Parameters
        ----------
        batch_size : int
            The most rows per element (the last batch of the feed may be smaller).
        output_signature : tf.TensorSpec or nested structure of them, optional
            The element spec; required when the feed may end before any data arrives (or
            :class:`~tfonspark.errors.InputError` is raised).

        Returns
        -------
        tf.data.Dataset
            Ends when the feed ends; its elements are a tensor for one-value rows, a tuple for
            other rows, a dict for named columns or with ``input_mapping``.

        Examples
        --------
        >>> from tfonspark.tfprocess.localfeed import LocalFeeds
        >>> feeds = LocalFeeds(["input"])
        >>> for i in range(5):
        ...     feeds.get_queue("input").put(([float(i), 1.0], i))
        >>> feeds.get_queue("input").put(None)
        >>> dataset = DataFeed(feeds).as_dataset(batch_size=4)
        >>> [y.numpy().tolist() for x, y in dataset]
        [[0, 1, 2, 3], [4]]
        """
        import tensorflow as tf

        if output_signature is None:
            with self._lock:
                if not self._fill():
                    raise InputError(
                        "the feed ended before any data arrived, so the dataset's element "
                        "spec is unknown; pass output_signature=..."
                    )
                assert self._pending is not None
                output_signature = _signature(self._structure(_arrays(self._pending[1])))

        flat_specs = tf.nest.flatten(output_signature)

        def batches() -> Iterator[Any]:
            while True:
                batch = self.next_columns(batch_size)
                if batch is None:
                    return
                values = tf.nest.flatten(self._structure(_arrays(batch)))
                yield tf.nest.pack_sequence_as(output_signature, [_cast(v, s) for v, s in zip(values, flat_specs)])

        return tf.data.Dataset.from_generator(batches, output_signature=output_signature)

    def _structure(self, batch: ColumnBatch) -> Any:
        if self.input_mapping:
            return self._mapped(batch)
        if batch.layout == "scalar":
            return batch.columns[0]
        if batch.names is not None and batch.layout == "dict":
            return dict(zip(batch.names, batch.columns))
        return tuple(batch.columns)


def _normalise_mapping(mapping: Mapping[str, str] | list[str] | None) -> dict[str, str] | None:
    if mapping is None:
        return None
    if isinstance(mapping, (list, tuple)):
        return {name: name for name in mapping}
    if isinstance(mapping, Mapping):
        return dict(mapping)
    raise InputError(
        f"input_mapping must be a dict of column -> tensor name or a list of columns. "
        f"Received: {type(mapping).__name__}"
    )


def _arrays(batch: ColumnBatch) -> ColumnBatch:
    """List columns (strings) as object arrays, so that ``tf.nest`` sees each column as one leaf."""
    columns = [c if isinstance(c, np.ndarray) else np.asarray(c, dtype=object) for c in batch.columns]
    return ColumnBatch(columns, batch.layout, batch.names, batch.kinds)


def _signature(structure: Any) -> Any:
    import tensorflow as tf

    def spec(col: Any) -> Any:
        if isinstance(col, np.ndarray) and col.dtype != object:
            return tf.TensorSpec((None, *col.shape[1:]), tf.as_dtype(col.dtype))
        if len(col) and isinstance(col[0], (str, bytes)):
            return tf.TensorSpec((None,), tf.string)
        raise InputError(f"column of {type(col[0]).__name__} values cannot become a tensor")

    return (
        tf.nest.map_structure(spec, structure, check_types=False)
        if not isinstance(structure, np.ndarray)
        else spec(structure)
    )


def _cast(value: Any, spec: Any) -> Any:
    if not isinstance(value, np.ndarray):
        return np.asarray(value, dtype=object)
    want = spec.dtype.as_numpy_dtype
    if value.dtype == want:
        return value
    if np.can_cast(value.dtype, want, casting="same_kind"):
        return value.astype(want)
    raise InputError(f"a fed batch has dtype {value.dtype} where the dataset expects {spec.dtype.name}")


def feed_dataset(
    ctx: Any, batch_size: int, qname: str = "input", input_mapping: Any = None, output_signature: Any = None
) -> Any:
    """``tf.data.Dataset`` over the data fed to this node: ``ctx.get_data_feed(...).as_dataset(...)``.

    A training feed (:class:`DataFeed` with ``train_mode=True``); see :meth:`DataFeed.as_dataset`
    for the elements and when the dataset ends.

    Parameters
    ----------
    ctx : NodeContext
        The ``ctx`` of ``map_fun(args, ctx)``; its ``mgr`` is the node's feed.
    batch_size : int
        The most rows per element.
    qname : str, default "input"
        The queue the driver fed (``Cluster.train(..., qname=...)``).
    input_mapping : dict or list of str, optional
        Column name -> tensor name: the elements become dicts of tensors (see :class:`DataFeed`).
    output_signature : tf.TensorSpec or nested structure of them, optional
        The element spec, by default taken from the first batch.

    Returns
    -------
    tf.data.Dataset

    Examples
    --------
    In ``map_fun(args, ctx)`` of a cluster fed by ``cluster.train(rdd, num_epochs)``:

    >>> dataset = feed_dataset(ctx, batch_size=64).map(lambda x, y: (x / 255.0, y))  # doctest: +SKIP
    >>> model.fit(dataset, epochs=1)  # doctest: +SKIP
    """
    feed = DataFeed(ctx.mgr, True, qname, input_mapping=input_mapping)
    return feed.as_dataset(batch_size, output_signature)
