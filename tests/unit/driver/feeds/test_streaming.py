"""When streams stop, and how micro-batches are fed: ``driver/streaming.py`` against fake queries and contexts.

The integration tests (tests/integration/test_streaming.py) run the same paths on real Spark;
here the decisions are checked in milliseconds: a node failure stops every stream at once, a
stop request or finished nodes stop them after the running micro-batch, ``finish`` honours its
timeout, and a micro-batch carries a feed id naming its stream and batch.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Any

import pytest

from tfonspark.driver.feeds import streaming
from tfonspark.driver.feeds.feeding import Feeds
from tfonspark.driver.feeds.streaming import Streams
from tfonspark.errors import ConfigError, NodeFailed
from tfonspark.executor.feeder import FeedTarget
from tfonspark.testing import FakeSparkContext


class FakeQuery:
    """A StreamingQuery: active until stopped; ``busy`` holds a micro-batch 'running'."""

    isActive = True  # a property on pyspark's class: kinds are told apart on the class

    def __init__(self, error: Exception | None = None) -> None:
        self.isActive = True
        self.busy = False
        self.error = error
        self.stopped_while_busy: bool | None = None
        self.name, self.id = "q", "id"

    @property
    def status(self) -> dict[str, Any]:
        return {"isTriggerActive": self.busy}

    def exception(self) -> Exception | None:
        return self.error

    def stop(self) -> None:
        self.stopped_while_busy = self.busy
        self.isActive = False


class FakeContext:
    """A StreamingContext: records how it was stopped."""

    def __init__(self, error: Exception | None = None) -> None:
        self.stops: list[tuple[bool, bool]] = []
        self.error = error

    def awaitTerminationOrTimeout(self, timeout: float) -> bool:
        if self.error is not None:
            raise self.error
        return bool(self.stops)

    def stop(self, stopSparkContext: bool = True, stopGraceFully: bool = False) -> None:
        self.stops.append((stopSparkContext, stopGraceFully))


class FakeDStream:
    def __init__(self, ssc: FakeContext) -> None:
        self.ssc = ssc
        self.batch_fns: list[Any] = []

    def foreachRDD(self, fn: Any) -> None:
        self.batch_fns.append(fn)

    def transform(self, fn: Any) -> Any:
        self.batch_fns.append(fn)
        return "results"

    def context(self) -> FakeContext:
        return self.ssc


class FakeCluster:
    """The cluster as the streams see it; ``event`` is what stop_condition reports."""

    def __init__(self) -> None:
        self.event = ("", True)
        self.done = False
        self.failed = False
        self.woken = threading.Event()

    def check(self) -> None:
        if self.failed:
            raise NodeFailed("worker:1 failed", role="worker", index=1)

    def all_done(self) -> bool:
        return self.done

    def stop_condition(self, timeout: float) -> tuple[str, bool]:
        self.woken.wait(min(timeout, 0.05))
        return self.event


class RecordingFeeds(Feeds):
    def __init__(self) -> None:
        super().__init__(FakeSparkContext(), "00" * 32, self)
        self.fed: list[tuple[Any, str]] = []

    def targets(self) -> list[FeedTarget]:
        return [FeedTarget("worker:0", "k", "127.0.0.1", 1)]

    def check(self) -> None:
        pass

    def all_done(self) -> bool:
        return False

    def train(
        self, data: Any, num_epochs: int, feed_timeout: float, qname: str, label: str = "", feed_id: str = ""
    ) -> int:
        self.fed.append((data, feed_id))
        return 1


@pytest.fixture
def parts():
    cluster = FakeCluster()
    feeds = RecordingFeeds()
    streams = Streams(feeds, cluster, label="test")
    yield cluster, feeds, streams
    cluster.event = ("test over", False)
    streams.join(5)


def test_a_node_failure_stops_every_stream_at_once(parts):
    cluster, _, streams = parts
    query, ssc = FakeQuery(), FakeContext()
    streams._watch(query)
    streams._watch(ssc)
    start = time.monotonic()
    cluster.event = ("TensorFlow node worker:1 failed", False)
    assert streams.stopped.wait(5)
    assert time.monotonic() - start < 1
    assert not query.isActive and ssc.stops == [(False, False)], "not graceful, never the SparkContext"
    assert streams.reason == "TensorFlow node worker:1 failed"


def test_a_stop_request_lets_the_running_micro_batch_finish(parts):
    cluster, _, streams = parts
    query = FakeQuery()
    query.busy = True
    streams._watch(query)
    cluster.event = ("stop requested: operator", True)
    time.sleep(0.3)
    assert query.isActive, "the running micro-batch is not cut short"
    query.busy = False
    assert streams.stopped.wait(5)
    assert not query.isActive and query.stopped_while_busy is False


def test_a_failure_gives_a_running_batch_only_seconds(parts, monkeypatch):
    monkeypatch.setattr(streaming, "_FAILED_BATCH_SECS", 0.2)
    cluster, _, streams = parts
    query = FakeQuery()
    query.busy = True
    streams._watch(query)
    cluster.event = ("TensorFlow node worker:0 failed", False)
    assert streams.stopped.wait(5)
    assert query.stopped_while_busy is True


def test_finish_waits_for_the_stream_to_end_by_itself(parts):
    _, _, streams = parts
    error = RuntimeError("batch 3 failed")
    query = FakeQuery()
    threading.Timer(0.3, lambda: (setattr(query, "error", error), setattr(query, "isActive", False))).start()
    in_time, ended_with = streams.finish(query, timeout=10)
    assert in_time and ended_with is error and streams.stopped.is_set()


def test_finish_times_out_and_stops_the_streams_anyway(parts):
    _, _, streams = parts
    query, ssc = FakeQuery(), FakeContext()
    streams._watch(ssc)
    start = time.monotonic()
    in_time, error = streams.finish(query, timeout=0.5)
    assert not in_time and error is None
    assert 0.4 < time.monotonic() - start < 5
    assert not query.isActive and ssc.stops == [(False, False)]


def test_finish_on_a_stop_request_stops_gracefully(parts):
    cluster, _, streams = parts
    ssc = FakeContext()
    threading.Timer(0.2, lambda: setattr(cluster, "event", ("stop requested: x", True))).start()
    in_time, error = streams.finish(ssc, timeout=10)
    assert in_time and error is None
    assert ssc.stops == [(False, True)]


def test_a_failed_streaming_context_is_reported(parts):
    _, _, streams = parts
    error = RuntimeError("An exception was raised by Python: InputError")
    in_time, ended_with = streams.finish(FakeContext(error), timeout=10)
    assert in_time and ended_with is error


def test_finish_without_streams_returns_at_once(parts):
    _, _, streams = parts
    assert streams.finish(None, timeout=10) == (True, None)


def test_finish_rejects_what_is_not_a_stream(parts):
    _, _, streams = parts
    with pytest.raises(ConfigError, match="StreamingContext .* or a StreamingQuery.*Received: list"):
        streams.finish([], timeout=1)


def test_dstream_batches_are_fed_with_their_batch_time_as_feed_id(parts):
    cluster, feeds, streams = parts
    ssc = FakeContext()
    dstream = FakeDStream(ssc)
    assert streams.train(dstream, 60, "input", {"trigger": None}) is None
    (feed_rdd,) = dstream.batch_fns
    when = datetime(2026, 1, 2, tzinfo=timezone.utc)
    feed_rdd(when, "rdd-1")
    feed_rdd(when, "rdd-1")  # Spark running the same batch again: the same feed id
    (data, feed_id), again = feeds.fed
    assert data == "rdd-1" and feed_id.endswith(f":{int(when.timestamp() * 1000)}") and again == (data, feed_id)
    cluster.done = True
    feed_rdd(when, "rdd-2")
    assert len(feeds.fed) == 2, "once every data node has finished, micro-batches are dropped (TFoS)"
    cluster.failed = True
    with pytest.raises(Exception, match="tfonspark-error"):  # typed: reraise() gives NodeFailed back
        feed_rdd(when, "rdd-3")


def test_query_options_do_not_apply_to_a_dstream(parts):
    _, _, streams = parts
    with pytest.raises(ConfigError, match="checkpoint_location, trigger apply to a streaming DataFrame"):
        streams.train(FakeDStream(FakeContext()), 60, "input", {"trigger": "1 second", "checkpoint_location": "/x"})


def test_query_options_reach_the_writer():
    calls: list[tuple[str, Any]] = []

    class Writer:
        def trigger(self, **kw: Any) -> Writer:
            calls.append(("trigger", kw))
            return self

        def option(self, key: str, value: str) -> Writer:
            calls.append((key, value))
            return self

        def queryName(self, name: str) -> Writer:
            calls.append(("name", name))
            return self

    streaming._writer(Writer(), {"trigger": "2 seconds", "checkpoint_location": "/ck", "query_name": "q"})
    streaming._writer(Writer(), {"trigger": {"availableNow": True}})
    assert calls == [
        ("trigger", {"processingTime": "2 seconds"}),
        ("checkpointLocation", "/ck"),
        ("name", "q"),
        ("trigger", {"availableNow": True}),
    ]
    with pytest.raises(ConfigError, match="processing-time interval"):
        streaming._writer(Writer(), {"trigger": 5})


def test_train_of_an_unsupported_type_names_it_and_what_is_valid():
    feeds = RecordingFeeds()
    with pytest.raises(
        ConfigError, match=r"RDD, a DataFrame, a streaming DataFrame or a DStream\. Received: builtins\.set"
    ):
        Feeds.train(feeds, set(), 1, 60, "input")


def test_a_streaming_dataframe_needs_an_output_schema_for_inference():
    class StreamingDF:
        isStreaming = True
        schema = None

        def mapInArrow(self, *a: Any) -> None:
            raise AssertionError("must not be reached")

    with pytest.raises(ConfigError, match="needs output_schema"):
        RecordingFeeds().inference(StreamingDF(), 60, "input", None)


def test_kinds_are_told_apart_without_evaluating_properties():
    class BatchDF:
        isStreaming = False

        @property
        def writeStream(self) -> Any:
            raise AssertionError("writeStream of a batch DataFrame raises in pyspark")

        def mapInArrow(self) -> None: ...

    class StreamDF(BatchDF):
        isStreaming = True

    assert not streaming.is_streaming_df(BatchDF()) and streaming.is_streaming_df(StreamDF())
    assert streaming.is_dstream(FakeDStream(FakeContext())) and not streaming.is_dstream(StreamDF())
    assert streaming.is_query(FakeQuery()) and not streaming.is_context(FakeQuery())
    assert streaming.is_context(FakeContext()) and not streaming.is_query(FakeContext())


def test_a_batch_after_a_hard_stop_fails_instead_of_being_committed(parts):
    _, feeds, streams = parts
    dstream = FakeDStream(FakeContext())
    streams.train(dstream, 60, "input", {})
    streams.stop("shutdown(timeout=...) expired", graceful=False)
    with pytest.raises(Exception, match="was not fed: the streams are being stopped"):
        dstream.batch_fns[0](datetime(2026, 1, 2, tzinfo=timezone.utc), "rdd")
    assert feeds.fed == []
