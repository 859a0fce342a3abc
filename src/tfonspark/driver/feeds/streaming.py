"""Feeding streams: DStreams (``foreachRDD``/``transform``) and Structured Streaming (``foreachBatch``/``mapInArrow``).

Every micro-batch goes through the cluster's ordinary feed path (:class:`~.feeding.Feeds`), with
a feed id made of the stream and the batch (a query's id and batch id; a DStream's batch time),
so a batch that Spark runs again on the same cluster (a query restarted from its checkpoint)
delivers each partition once. :class:`Streams` also decides when the streams stop: a watcher
thread stops them as soon as a node fails (at once), a stop is requested
(``tfonspark.request_stop``) or every data node has finished (both gracefully: the running
micro-batch completes, for up to the ``stream_stop_timeout`` setting); ``Cluster.shutdown(ssc_or_query)`` waits for one of those, or for the
stream to end by itself, within its timeout.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from ...errors import ConfigError, FeedError
from ...settings import DEFAULT_STREAM_STOP_TIMEOUT
from ...wire.errors import capture
from .feeding import Feeds

__all__ = ["StreamCluster", "Streams", "is_context", "is_dstream", "is_query", "is_streaming_df"]

log = logging.getLogger(__name__)
_POLL_SECS = 0.5  # how often the watcher and shutdown() look at the streams themselves
_FAILED_BATCH_SECS = 3.0  # on a node failure, how long a running micro-batch gets to fail by itself
VALID_STREAMS = "a StreamingContext (DStreams) or a StreamingQuery (Structured Streaming)"


class StreamCluster(Protocol):
    """What the streams need to know about the cluster's nodes."""

    def check(self) -> None:
        """Raise NodeFailed if a node has failed."""
        ...

    def all_done(self) -> bool:
        """True once no data node takes data any more."""
        ...

    def stop_condition(self, timeout: float) -> tuple[str, bool]:
        """Wait up to ``timeout`` for a reason to stop the streams: (why, gracefully), ("", True) if none."""
        ...


def _has(obj: Any, *names: str) -> bool:
    """``obj``'s class has every attribute (looked up on the class: a property is not evaluated)."""
    return all(hasattr(type(obj), name) for name in names)


def is_dstream(data: Any) -> bool:
    """A ``pyspark.streaming.DStream``."""
    return _has(data, "foreachRDD", "transform", "context")


def is_streaming_df(data: Any) -> bool:
    """A streaming DataFrame (``spark.readStream...``); ``writeStream`` of a batch one raises."""
    return _has(data, "writeStream", "mapInArrow") and getattr(data, "isStreaming", False) is True


def is_query(obj: Any) -> bool:
    """A Structured Streaming ``StreamingQuery``."""
    return _has(obj, "isActive", "exception", "stop")


def is_context(obj: Any) -> bool:
    """A DStream ``StreamingContext``."""
    return _has(obj, "awaitTerminationOrTimeout", "stop") and not is_query(obj)


def _ended(stream: Any) -> tuple[bool, BaseException | None]:
    """Whether a query or StreamingContext has terminated, and the error it ended with."""
    if is_query(stream):
        return (not stream.isActive), (stream.exception() if not stream.isActive else None)
    try:
        return bool(stream.awaitTerminationOrTimeout(0.01)), None
    except Exception as exc:  # a failed streaming job: the context reports it on every wait
        return True, exc


def _trigger_active(query: Any) -> bool:
    try:
        return bool(query.status.get("isTriggerActive"))
    except Exception:  # a stopped query's status may be unavailable
        return False


def _stop_query(query: Any, wait: float) -> None:
    """Stop a query once its running micro-batch (if any) has ended, waiting at most ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while query.isActive and _trigger_active(query) and time.monotonic() < deadline:
        time.sleep(0.05)
    if query.isActive:
        query.stop()


def _stop_context(ssc: Any, graceful: bool) -> None:
    """Stop a StreamingContext, never the SparkContext (graceful: finish the batches it has)."""
    ssc.stop(stopSparkContext=False, stopGraceFully=graceful)


class Streams:
    """The DStream contexts and queries feeding one cluster, and the thread that stops them."""

    def __init__(
        self, feeds: Feeds, cluster: StreamCluster, label: str = "", stop_timeout: float = DEFAULT_STREAM_STOP_TIMEOUT
    ) -> None:
        self.feeds = feeds
        self.cluster = cluster
        self.label = label
        self.contexts: list[Any] = []
        self.queries: list[Any] = []
        self.reason = ""  # why the streams were stopped
        self.stopped = threading.Event()
        #: how long a graceful stop waits for a running micro-batch: the ``stream_stop_timeout``
        #: setting (``NodeConfig.stream_stop_timeout``), capped by what is left of ``finish``'s timeout
        self.stop_timeout = stop_timeout
        self._deadline_left = math.inf
        self._asked: tuple[str, bool] | None = None
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    # ---- feeding -------------------------------------------------------------------------------
    def train(self, data: Any, feed_timeout: float, qname: str, options: dict[str, Any]) -> Any:
        """Feed every micro-batch of ``data``; the StreamingQuery for a streaming DataFrame, else None."""
        stream_id = uuid.uuid4().hex[:12]
        if is_dstream(data):
            self._no_options(options, "a DStream")

            def feed_rdd(when: Any, rdd: Any) -> None:
                self._feed(rdd, feed_timeout, qname, f"{stream_id}:{int(when.timestamp() * 1000)}")

            data.foreachRDD(feed_rdd)
            self._watch(data.context())
            return None
        sc = self.feeds.sc

        def feed_batch(batch: Any, batch_id: int) -> None:
            query_id = sc.getLocalProperty("sql.streaming.queryId") or stream_id  # the same after a restart
            self._feed(batch, feed_timeout, qname, f"{query_id}:{batch_id}")

        query = _writer(data.writeStream.foreachBatch(feed_batch), options).start()
        self._watch(query)
        return query

    def _feed(self, data: Any, feed_timeout: float, qname: str, feed_id: str) -> None:
        """One micro-batch through the batch feed; skipped once no data node takes data (TFoS)."""
        with capture():  # a typed error reaches the user's query/StreamingContext with its marker
            self.cluster.check()
            if self._asked is not None and not self._asked[1]:
                # not returning: Spark would commit the micro-batch as processed
                raise FeedError(f"micro-batch {feed_id} was not fed: the streams are being stopped ({self._asked[0]})")
            if self.cluster.all_done():
                log.info("every data node has finished: micro-batch %s dropped", feed_id)
                return
            self.feeds.train(data, 1, feed_timeout, qname, label=f"{self.label} {feed_id}", feed_id=feed_id)

    def inference(self, data: Any, feed_timeout: float, qname: str, output_schema: Any) -> Any:
        """A DStream of results for a DStream; a streaming DataFrame (one row per input row) for one."""
        if is_dstream(data):

            def infer(rdd: Any) -> Any:
                with capture():
                    return self.feeds.inference(rdd, feed_timeout, qname, None)

            out = data.transform(infer)
            self._watch(data.context())
            return out
        return self.feeds.inference(data, feed_timeout, qname, output_schema)

    @staticmethod
    def _no_options(options: dict[str, Any], what: str) -> None:
        given = sorted(k for k, v in options.items() if v is not None)
        if given:
            raise ConfigError(
                f"{', '.join(given)} apply to a streaming DataFrame's query; {what} takes none. "
                "Set a DStream's batch interval on its StreamingContext."
            )

    # ---- stopping ------------------------------------------------------------------------------
    def _watch(self, stream: Any) -> None:
        """Remember a stream to stop with the cluster; start the watcher on the first one."""
        with self._lock:
            known = self.contexts if is_context(stream) else self.queries
            if not any(s is stream for s in known):
                known.append(stream)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._run, name="tfos-streams", daemon=True)
                self._watcher.start()

    @property
    def active(self) -> bool:
        """True if streams were registered and have not been stopped yet."""
        return self._watcher is not None and not self.stopped.is_set()

    def _run(self) -> None:
        """Wait for a reason to stop (node failure, stop request, nodes done, shutdown), then stop all."""
        why, graceful = "", True
        while not why:
            why, graceful = self._asked or self.cluster.stop_condition(_POLL_SECS)
        self.reason = why
        log.info("stopping the cluster's streams (%s)", why)
        try:
            self._stop_all(graceful)
        finally:
            self.stopped.set()

    def _stop_all(self, graceful: bool) -> None:
        with self._lock:
            contexts, queries = list(self.contexts), list(self.queries)
        for ssc in contexts:
            try:
                _stop_context(ssc, graceful)
            except Exception as exc:  # a context stopped elsewhere, or a failed batch
                log.warning("stopping a StreamingContext failed: %s", exc)
        for query in queries:
            try:
                _stop_query(query, self._grace() if graceful else _FAILED_BATCH_SECS)
            except Exception as exc:
                log.warning("stopping streaming query %s failed: %s", query.name or query.id, exc)

    def _grace(self) -> float:
        """How long a graceful stop waits for a running micro-batch (see ``stop_timeout``)."""
        return min(self.stop_timeout, self._deadline_left)

    def finish(self, stream: Any, timeout: float) -> tuple[bool, BaseException | None]:
        """``shutdown(stream)``: wait for a reason to stop or for ``stream`` to end, then stop every stream.

        ``stream`` None stops the streams now. Returns (stopped within ``timeout``, the error a
        stream ended with). Streams left after the timeout are stopped at once.
        """
        if stream is not None and not (is_query(stream) or is_context(stream)):
            raise ConfigError(f"shutdown(ssc=...) takes {VALID_STREAMS}. Received: {type(stream).__name__}")
        deadline = time.monotonic() + timeout
        if stream is not None:
            self._watch(stream)
            while not self.stopped.is_set() and not _ended(stream)[0] and time.monotonic() < deadline:
                self.stopped.wait(min(_POLL_SECS, max(deadline - time.monotonic(), 0)))
        if self._watcher is None:
            return True, None
        in_time = stream is None or self.stopped.is_set() or _ended(stream)[0]
        self._deadline_left = max(deadline - time.monotonic(), 0.0)
        self.stop("shutdown() was called" if in_time else "shutdown(timeout=...) expired", graceful=in_time)
        done = self.stopped.wait(max(deadline - time.monotonic(), 10.0))
        return in_time and done, self._error()

    def stop(self, why: str, graceful: bool) -> None:
        """Ask the watcher to stop every stream now (no-op without streams, or once stopping)."""
        if self._asked is None:
            self._asked = (why, graceful)

    def _error(self) -> BaseException | None:
        """The first error a registered stream ended with."""
        for stream in [*self.contexts, *self.queries]:
            ended, error = _ended(stream)
            if ended and error is not None:
                return error
        return None

    def join(self, timeout: float) -> bool:
        """Wait for the watcher to have stopped every stream; True if it has (or never started)."""
        if self._watcher is None:
            return True
        self.stop("the cluster is shutting down", graceful=False)
        self._watcher.join(timeout)
        return not self._watcher.is_alive()


def _writer(writer: Any, options: dict[str, Any]) -> Any:
    """Apply train()'s query options to a DataStreamWriter (trigger, checkpoint, query name)."""
    setters: dict[str, Callable[[Any, Any], Any]] = {
        "trigger": _trigger,
        "checkpoint_location": lambda w, v: w.option("checkpointLocation", str(v)),
        "query_name": lambda w, v: w.queryName(str(v)),
    }
    for name, value in options.items():
        if name not in setters:
            raise ConfigError(f"unknown streaming option {name!r}; valid: {sorted(setters)}")
        if value is not None:
            writer = setters[name](writer, value)
    return writer


def _trigger(writer: Any, value: Any) -> Any:
    """``"2 seconds"`` (processing time) or a dict of ``DataStreamWriter.trigger`` keywords."""
    if isinstance(value, str):
        return writer.trigger(processingTime=value)
    if isinstance(value, dict):
        return writer.trigger(**value)
    raise ConfigError(
        "trigger must be a processing-time interval ('2 seconds') or a dict of DataStreamWriter.trigger "
        f"keywords ({{'availableNow': True}}). Received: {type(value).__name__}"
    )
