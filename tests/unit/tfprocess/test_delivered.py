"""tfprocess/delivered.py: the feed server's memory of delivered partitions stays bounded over a long
stream of feeds."""

from __future__ import annotations

import uuid

import pytest

from tests.unit._feeds import SECRET, close_feed, drain, feeder
from tfonspark.errors import FeedError
from tfonspark.executor.feeder import Feeder, FeedTarget
from tfonspark.tfprocess import delivered as memory
from tfonspark.tfprocess.datafeed import DataFeed
from tfonspark.tfprocess.feedserver import FeedServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def server_and_events():
    events: list[tuple[str, dict]] = []
    server = FeedServer(  # fed first and read afterwards: partitions acknowledged on arrival
        SECRET,
        buffer_bytes=1 << 22,
        on_event=lambda event: events.append((event.TYPE, dict(vars(event)))),
        ahead=None,
    )
    yield server, events
    server.close()


def test_only_recent_feeds_are_remembered_and_their_repeats_still_dropped(monkeypatch):
    monkeypatch.setattr(memory, "_REMEMBERED_FEEDS", 4)
    server = FeedServer(SECRET, buffer_bytes=1 << 20, ahead=None)
    try:
        for batch in range(10):  # ten micro-batches of a stream, two partitions each
            for partition in (0, 1):
                assert list(feeder(server, f"micro-{batch}").train_rdd(partition, iter([batch]))) == [1]
        assert list(server.delivered.recent[None]) == ["micro-6", "micro-7", "micro-8", "micro-9"]
        assert list(feeder(server, "micro-9").train_rdd(1, iter([9]))) == [1]  # a retry: acknowledged, dropped
        close_feed(server)
        assert drain(DataFeed(server), 64) == [b for b in range(10) for _ in (0, 1)]
    finally:
        server.close()


def test_a_feed_replayed_after_the_remembered_ones_is_refused_not_delivered_again(server_and_events):
    """65 micro-batches of 10 rows, then the first one again: 650 rows reach map_fun, not 660."""
    server, events = server_and_events
    for batch in range(memory._REMEMBERED_FEEDS + 1):
        assert list(feeder(server, f"query:{batch}").train_rdd(0, iter(range(10)))) == [10]
    with pytest.raises(FeedError) as refused:
        list(feeder(server, "query:0").train_rdd(0, iter(range(10))))
    assert "query:0" in str(refused.value) and "refused" in str(refused.value)
    assert [kind for kind, _ in events] == ["feed_refused"]
    close_feed(server)
    assert len(drain(DataFeed(server), 64)) == 10 * (memory._REMEMBERED_FEEDS + 1)


def test_a_forgotten_feed_without_a_sequence_number_is_refused_too(server_and_events):
    server, _ = server_and_events
    ids = [uuid.uuid4().hex for _ in range(memory._REMEMBERED_FEEDS + 1)]
    for feed_id in ids:
        assert list(feeder(server, feed_id).train_rdd(3, iter([1.0]))) == [1]
    with pytest.raises(FeedError, match="refused"):
        list(feeder(server, ids[0]).train_rdd(3, iter([1.0])))
    assert list(feeder(server, ids[-1]).train_rdd(3, iter([1.0]))) == [1]  # remembered: dropped, acknowledged
    assert list(feeder(server, uuid.uuid4().hex).train_rdd(3, iter([1.0]))) == [1]  # a new feed
    close_feed(server)
    assert len(drain(DataFeed(server), 64)) == memory._REMEMBERED_FEEDS + 2


def test_the_memory_of_long_streams_stays_bounded():
    """Two streams of 100,000 micro-batches of 4 partitions: the partitions of each one's last
    _REMEMBERED_FEEDS feeds are kept, and one number per stream; the newest are still decided."""
    delivered = memory.Delivered()
    for batch in range(100_000):
        for stream in ("query", "dstream"):
            for partition in range(4):
                assert delivered.first(f"{stream}:{batch}", partition)
            assert not delivered.first(f"{stream}:{batch}", 2)  # a retry within the running feed
    kept = memory._REMEMBERED_FEEDS
    assert {s: len(feeds) for s, feeds in delivered.recent.items()} == {"query": kept, "dstream": kept}
    assert delivered.forgotten_up_to == {"query": 100_000 - kept - 1, "dstream": 100_000 - kept - 1}
    assert not delivered.forgotten_ids
    assert not delivered.first(f"query:{100_000 - kept}", 3)  # the oldest remembered: a repeat
    with pytest.raises(FeedError, match="query:5"):
        delivered.first("query:5", 0)
    assert delivered.first("query:100000", 0) and delivered.first("other:0", 0)  # new feeds


def test_another_streams_feeds_never_push_out_a_running_feed():
    delivered = memory.Delivered()
    assert delivered.first("driver:0", 0)  # a train() call, running
    for batch in range(10 * memory._REMEMBERED_FEEDS):  # a stream's micro-batches meanwhile
        assert delivered.first(f"query:{batch}", 0)
    assert delivered.first("driver:0", 1) and not delivered.first("driver:0", 0)


def test_the_driver_numbers_its_feeds():
    target = FeedTarget("worker:0", "key", "127.0.0.1", 1)
    first, second = feeder_ids = [Feeder([target], SECRET.hex(), "input", 1.0).feed_id for _ in range(2)]
    stream, number = memory._sequence(first)
    assert memory._sequence(second) == (stream, number + 1), feeder_ids


def test_a_claim_names_the_node_of_the_first_delivery():
    delivered = memory.Delivered()
    assert delivered.claim("d:1", 0, "worker:0") is None
    assert delivered.claim("d:1", 0, "worker:1") == "worker:0"
    assert delivered.claim("d:1", 1) is None and delivered.claim("d:1", 1, "worker:1") == ""
    assert not delivered.first("d:1", 0)
