"""Delivery guarantees of the feed server, without Spark: a training partition reaches map_fun
exactly once and only when complete, large partitions stay out of memory, and every wait on
either side of a feed connection ends within the feed's timeout."""

from __future__ import annotations

import glob
import os
import socket
import tempfile
import time

import numpy as np
import pytest

from tfonspark.executor.feeder import Feeder, FeedTarget
from tfonspark.host import executor_key
from tfonspark.tfprocess.datafeed import DataFeed
from tfonspark.tfprocess.feedserver import FeedServer
from tfonspark.wire import messages as m
from tfonspark.wire.codec import encode_batch
from tfonspark.wire.framing import connect
from tfonspark.wire.packing import pack_rows

from .test_feed_local import MB, SECRET, Bg, big_rows, close_feed, drain

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def server_and_events():
    events: list[tuple[str, dict]] = []
    server = FeedServer(  # fed first and read afterwards: partitions acknowledged on arrival
        SECRET, buffer_bytes=4 * MB, on_event=lambda event: events.append((event.TYPE, dict(vars(event)))), ahead=None
    )
    yield server, events
    server.close()


def feeder(server: FeedServer, feed_id: str, feed_timeout: float = 20.0) -> Feeder:
    target = FeedTarget("worker:0", executor_key(), "127.0.0.1", server.port, server.unix_path)
    return Feeder([target], SECRET.hex(), "input", feed_timeout, feed_id=feed_id)


def partial_attempt(server: FeedServer, feed_id: str, partition: int, rows: list, batches: int, timeout: float = 20.0):
    """A feed task that sends ``batches`` batches of ``rows`` and then dies (connection closed)."""
    conn = connect(("127.0.0.1", server.port), SECRET)
    m.send_message(conn, m.FeedStart("input", True, partition, [], feed_id, 0, timeout))
    step = len(rows) // (batches + 1)
    for i in range(batches):
        conn.send(*encode_batch(pack_rows(rows[i * step : (i + 1) * step], partition, i * step)))
    return conn


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_a_failed_attempt_is_never_read_and_its_retry_is_read_once(server_and_events):
    server, _ = server_and_events
    rows = [(np.full(8, i, np.float32), i) for i in range(3000)]
    conn = partial_attempt(server, "feed-1", 1, rows, batches=3)
    queue = server.queue("input")
    assert wait_for(lambda: queue.reserved > 0)  # the batches arrived and are held back
    assert not queue._items, "rows of an incomplete partition reached the queue"
    conn.close()  # the task died mid-partition
    assert wait_for(lambda: queue.reserved == 0), "the failed attempt's memory was not released"
    assert not queue._items

    assert list(feeder(server, "feed-1").train_rdd(1, iter(rows))) == [3000]  # Spark's retry
    close_feed(server)
    got = drain(DataFeed(server), 128)
    assert [label for _, label in got] == list(range(3000))


def test_a_repeated_attempt_of_a_delivered_partition_is_dropped_and_acknowledged(server_and_events):
    server, _ = server_and_events
    rows = list(range(500))
    assert list(feeder(server, "feed-2").train_rdd(4, iter(rows))) == [500]
    # the task's Ack was lost (or a speculative copy ran): Spark runs the partition again
    assert list(feeder(server, "feed-2").train_rdd(4, iter(rows))) == [500]
    # the same partition index in another train() call is new data
    assert list(feeder(server, "feed-3").train_rdd(4, iter(rows))) == [500]
    close_feed(server)
    assert drain(DataFeed(server), 64) == rows + rows


def test_a_partition_larger_than_the_buffer_arrives_whole_from_disk_and_leaves_no_file(server_and_events):
    server, _ = server_and_events
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "tfos-spill-*")))
    rows = big_rows(24 * MB, 1024)  # six times the 4 MB buffer
    assert list(feeder(server, "feed-4").train_rdd(0, iter(rows))) == [len(rows)]
    queue = server.queue("input")
    assert queue.reserved == 0
    close_feed(server)
    feed = DataFeed(server)
    seen = 0
    while (batch := feed.next_columns(1000)) is not None:
        col = batch.columns[0]
        assert (col[:, 0] == np.arange(seen, seen + batch.count)).all()
        col[0, 0] += 1  # spilled batches are writable, like received ones
        seen += batch.count
    assert seen == len(rows)
    # the spill file was unlinked when made: nothing named survives in the temp dir
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "tfos-spill-*"))) == before


def test_a_stalled_feeder_is_dropped_and_reported_at_its_feed_timeout(server_and_events):
    server, events = server_and_events
    conn = partial_attempt(server, "feed-5", 7, list(range(1000)), batches=2, timeout=1.0)
    start = time.monotonic()
    assert wait_for(lambda: events, 10), "no event for a feeder that went silent"
    elapsed = time.monotonic() - start
    print(f"\n[measured] silent feeder reported after {elapsed:.2f}s (feed_timeout=1s)")
    assert elapsed < 3
    kind, detail = events[0]
    assert kind == "feed_stalled" and detail["partition"] == 7 and detail["train"] is True
    queue = server.queue("input")
    assert wait_for(lambda: queue.reserved == 0) and not queue._items
    conn.close()


def test_results_a_feeder_never_reads_do_not_block_map_fun(server_and_events):
    """The TF process's send of results ends at the feed's timeout if the feed task stops reading."""
    server, _ = server_and_events
    conn = connect(("127.0.0.1", server.port), SECRET)
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    m.send_message(conn, m.FeedStart("input", False, 0, [], "feed-6", 0, 1.0))
    rows = list(range(200))
    conn.send(*encode_batch(pack_rows(rows, 0, 0)))
    m.send_message(conn, m.FeedEnd(len(rows)))
    feed = DataFeed(server, train_mode=False)
    start = time.monotonic()

    def answer_all():
        for _ in range(20):  # ~80 MB of results nobody reads
            batch = feed.next_batch(10)
            if not batch:
                return
            feed.batch_results([np.zeros(1 << 20, np.float32)] * len(batch))

    Bg(answer_all).get(30)
    elapsed = time.monotonic() - start
    print(f"\n[measured] map_fun's results send gave up after {elapsed:.2f}s (feed_timeout=1s)")
    assert elapsed < 10
    conn.close()


def test_rows_of_a_dead_inference_attempt_are_skipped(server_and_events):
    server, _ = server_and_events
    conn = connect(("127.0.0.1", server.port), SECRET)
    m.send_message(conn, m.FeedStart("input", False, 0, [], "feed-7", 0, 20.0))
    conn.send(*encode_batch(pack_rows(list(range(100)), 0, 0)))
    queue = server.queue("input")
    assert wait_for(lambda: queue._items)
    conn.close()  # the feed task died before sending the end of its partition
    time.sleep(0.3)
    rows = list(range(1000, 1050))
    task = Bg(lambda: list(feeder(server, "feed-7").infer_rdd(0, iter(rows))))
    feed = DataFeed(server, train_mode=False)
    batch = feed.next_batch(100)
    assert batch == rows, "rows of the dead attempt reached map_fun"
    feed.batch_results([r * 2 for r in batch])
    assert task.get(20) == [r * 2 for r in rows]
