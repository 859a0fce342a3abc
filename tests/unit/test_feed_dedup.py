"""The feed server's memory of delivered partitions stays bounded over a long stream of feeds."""

from __future__ import annotations

import pytest

from tfonspark.tfprocess import feedserver
from tfonspark.tfprocess.datafeed import DataFeed
from tfonspark.tfprocess.feedserver import FeedServer

from .test_feed_delivery import feeder
from .test_feed_local import SECRET, close_feed, drain

pytestmark = pytest.mark.timeout(120)


def test_only_recent_feeds_are_remembered_and_their_repeats_still_dropped(monkeypatch):
    monkeypatch.setattr(feedserver, "_REMEMBERED_FEEDS", 4)
    server = FeedServer(SECRET, buffer_bytes=1 << 20)
    try:
        for batch in range(10):  # ten micro-batches of a stream, two partitions each
            for partition in (0, 1):
                assert list(feeder(server, f"micro-{batch}").train_rdd(partition, iter([batch]))) == [1]
        assert list(server._delivered) == ["micro-6", "micro-7", "micro-8", "micro-9"]
        assert list(feeder(server, "micro-9").train_rdd(1, iter([9]))) == [1]  # a retry: acknowledged, dropped
        close_feed(server)
        assert drain(DataFeed(server), 64) == [b for b in range(10) for _ in (0, 1)]
    finally:
        server.close()
