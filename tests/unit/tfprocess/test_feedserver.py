"""tfprocess/feedserver.py: the node's feed server, fed by real Feeders and read by a DataFeed in one
process over 127.0.0.1, without Spark: delivery exactly once, pacing, termination, back-pressure,
and a connection flood."""

from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import Any

import numpy as np
import pytest

from tests.unit._feeds import (
    MB,
    SECRET,
    Bg,
    answer_all,
    big_rows,
    close_feed,
    drain,
    feeder,
    feeder_for,
    infer,
    train,
)
from tests.unit.attack import SECRET_HEX, flood
from tests.waiting import wait_until
from tfonspark.errors import FeedError, FeedTimeout, InputError
from tfonspark.executor import feedbatches
from tfonspark.executor.feeder import Feeder, FeedTarget
from tfonspark.host import executor_key
from tfonspark.tfprocess.context import NodeContext
from tfonspark.tfprocess.datafeed import DataFeed
from tfonspark.tfprocess.feedserver import FeedServer
from tfonspark.wire import events as ev
from tfonspark.wire import messages as m
from tfonspark.wire import ring
from tfonspark.wire.codec import encode_batch
from tfonspark.wire.framing import Connection, connect
from tfonspark.wire.packing import pack_rows

pytestmark = pytest.mark.timeout(120)


# ---- helpers ----------------------------------------------------------------------------------


def feed_all_then_close(server: FeedServer, feeder: Feeder, partitions: dict[int, list]) -> dict[int, int]:
    """Feed every partition concurrently (like Spark tasks), then send the end of the feed."""
    try:
        tasks = {p: Bg(train, feeder, p, rows) for p, rows in partitions.items()}
        return {p: t.get(60) for p, t in tasks.items()}
    finally:
        close_feed(server)


def feed_in_turn_then_close(server: FeedServer, feeder: Feeder, partitions: list[list]) -> list[int]:
    """Feed partitions one after the other (one executor core), then send the end of the feed."""
    try:
        return [train(feeder, p, rows) for p, rows in enumerate(partitions)]
    finally:
        close_feed(server)


# ---- training ------------------------------------------------------------------------------------


def test_every_row_arrives_exactly_once_across_partitions(make_server, transport):
    server = make_server()
    sizes = {0: 1000, 1: 0, 2: 1, 3: 3000, 4: 257}
    partitions = {p: [(p * 100_000 + i, np.full(8, i, np.float32) + p) for i in range(n)] for p, n in sizes.items()}
    feeding = Bg(feed_all_then_close, server, feeder_for(server, transport=transport), partitions)
    feed = DataFeed(server, train_mode=True)
    assert not feed.should_stop()
    rows = drain(feed, 128)
    assert feeding.get() == sizes  # each feed task reports its own count

    ids = [int(r[0]) for r in rows]
    expected = [row[0] for part in partitions.values() for row in part]
    assert len(ids) == len(expected) == sum(sizes.values())
    assert sorted(ids) == sorted(expected)  # exactly once
    got_sum = sum(float(r[1].sum()) for r in rows)
    assert got_sum == pytest.approx(sum(float(r[1].sum()) for part in partitions.values() for r in part))
    for p in sizes:  # each partition keeps its order
        mine = [i for i in ids if i // 100_000 == p]
        assert mine == sorted(mine)
    assert server.queue("input").nbytes == 0


def test_batches_the_consumer_keeps_stay_intact_while_frames_are_reused(make_server, transport):
    """Large frames land in reused buffers: batches still held keep their rows, dropped ones
    give their memory back, and the pool stays within the queue's bytes + 8 MB."""
    server = make_server(buffer_bytes=8 * MB)
    partitions = {
        p: [(p * 100_000 + i, np.full(1024, p * 100_000 + i, np.float32)) for i in range(3000)] for p in range(4)
    }  # 12 MB per partition: frames of ~4 MB
    feeding = Bg(feed_all_then_close, server, feeder_for(server, transport=transport), partitions)
    feed = DataFeed(server, train_mode=True)
    kept, seen = [], 0
    while (batch := feed.next_columns(700)) is not None:
        ids, features = batch.columns
        if seen % 2 == 0:
            kept.append((ids, features))  # views of the received frames, held on purpose
        seen += 1
    assert feeding.get() == {p: 3000 for p in partitions}
    for ids, features in kept:
        assert (features == ids[:, None].astype(np.float32)).all()
    assert sum(len(ids) for ids, _ in kept) > 5000
    assert 0 < server._buffers.nbytes <= 16 * MB


def test_same_host_training_frames_go_through_shared_memory(make_server, transport, monkeypatch):
    """Over the Unix socket, training frames are copied through the feeder's ring (wire/ring.py),
    not the socket; rows arrive intact, partitions fed at once each with a ring of their own."""
    placed: list[int] = []
    send_shared = Connection._send_shared

    def spy(self: Connection, parts: Any, length: int) -> None:
        placed.append(length)
        send_shared(self, parts, length)

    monkeypatch.setattr(Connection, "_send_shared", spy)
    server = make_server(buffer_bytes=8 * MB)
    partitions = {p: [(p * 100_000 + i, np.full(512, i, np.float64)) for i in range(4000)] for p in range(3)}
    feeding = Bg(feed_all_then_close, server, feeder_for(server, transport=transport), partitions)
    feed, seen = DataFeed(server, train_mode=True), 0
    while (batch := feed.next_columns(1000)) is not None:
        ids, features = batch.columns
        assert (features == (ids % 100_000)[:, None]).all()
        seen += batch.count
    assert feeding.get() == {p: 4000 for p in partitions} and seen == 12_000
    assert (sum(placed) > 3 * 4000 * 512 * 8 * 0.9) == (transport == "unix" and ring.supported())


def test_node_context_gives_a_data_feed_on_the_server(make_server):
    server = make_server()
    ctx = NodeContext(
        executor_id=0,
        job_name="worker",
        task_index=0,
        cluster_spec={"worker": ["a"]},
        default_fs="file://",
        working_dir="/tmp",
        mgr=server,
    )
    feed = ctx.get_data_feed(train_mode=False, qname_in="other")
    assert isinstance(feed, DataFeed) and feed.queue is server.queue("other") and not feed.train_mode


def test_queues_are_separate(make_server):
    server = make_server()
    train(feeder_for(server, qname="a"), 0, [1, 2, 3])
    train(feeder_for(server, qname="b"), 0, [10, 20])
    close_feed(server, "a")
    close_feed(server, "b")
    assert drain(DataFeed(server, qname_in="b"), 10) == [10, 20]
    assert drain(DataFeed(server, qname_in="a"), 10) == [1, 2, 3]


# ---- inference ------------------------------------------------------------------------------------


def test_inference_returns_one_result_per_row_in_order(make_server, transport):
    server = make_server()
    feeder = feeder_for(server, transport=transport)
    sizes = {0: 300, 1: 0, 2: 1000, 3: 512, 4: 1}
    partitions = {p: [(p, i) for i in range(n)] for p, n in sizes.items()}
    feed = DataFeed(server, train_mode=False)
    batches: list = []
    consumer = Bg(answer_all, feed, 200, lambda row: row[0] * 1_000_000 + row[1] * 10, batches)
    tasks = {p: Bg(infer, feeder, p, rows) for p, rows in partitions.items()}  # concurrent partitions
    results = {p: t.get(60) for p, t in tasks.items()}
    close_feed(server)
    consumer.get()
    for p, rows in partitions.items():
        assert results[p] == [p * 1_000_000 + i * 10 for _, i in rows]
    # no batch ever mixes two partitions, so results can go back where they came from
    for batch in batches:
        assert len({row[0] for row in batch}) == 1, [row[0] for row in batch]
    assert sum(len(b) for b in batches) == sum(sizes.values())


def test_batch_results_with_the_wrong_length(make_server):
    server = make_server()
    feeder = feeder_for(server)
    feed = DataFeed(server, train_mode=False)
    task = Bg(infer, feeder, 0, list(range(30)))
    batch = feed.next_batch(30)
    assert batch == list(range(30))
    with pytest.raises(InputError, match="received 29 results for a batch of 30 rows"):
        feed.batch_results(batch[:-1])
    with pytest.raises(InputError, match="31 results"):
        feed.batch_results(batch + [0])
    feed.batch_results(np.asarray(batch, dtype=np.float64) / 2)  # numpy results are fine too
    assert task.get() == [i / 2 for i in range(30)]


def test_ragged_rows_in_inference_raise_input_error_naming_the_row(make_server):
    server = make_server()
    feed = DataFeed(server, train_mode=False)
    rows = [(i, [1.0, 2.0]) for i in range(300)]
    rows[280] = (280, [1.0])
    consumer = Bg(answer_all, feed, 64, lambda row: row[0], [])
    with pytest.raises(InputError) as info:
        infer(feeder_for(server), 6, rows)
    assert (info.value.partition, info.value.row, info.value.column) == (6, 280, 1)
    close_feed(server)
    consumer.get()


def test_ragged_rows_in_training_raise_input_error_naming_the_row(make_server):
    server = make_server()
    rows = [[1.0, 2.0]] * 10 + [[1.0]]
    with pytest.raises(InputError) as info:
        train(feeder_for(server), 2, rows)
    assert (info.value.partition, info.value.row) == (2, 10)


# ---- terminate ----------------------------------------------------------------------------------


def test_a_training_partition_is_acknowledged_once_map_fun_read_the_one_before(make_server):
    """Feed tasks keep pace with map_fun (as TFoS's did), so no node's executor runs ahead."""
    server = make_server()
    assert train(feeder_for(server), 0, list(range(10))) == 10  # nothing before it: at once
    second = Bg(train, feeder_for(server), 1, list(range(10, 20)))
    assert wait_until(lambda: server.queue("input").partitions == 2)  # committed, not acknowledged
    time.sleep(0.3)
    assert second.thread.is_alive()
    feed = DataFeed(server)
    assert [int(r) for r in feed.next_batch(11)] == list(range(11))  # the read passes partition 0
    assert second.get(5) == 10
    assert server.queue("input").partitions == 1


def test_pacing_gives_up_after_half_the_feed_timeout_without_an_error(make_server):
    server = make_server()
    assert train(feeder_for(server, feed_timeout=1.0), 0, [1]) == 1
    start = time.monotonic()
    assert train(feeder_for(server, feed_timeout=1.0), 1, [2]) == 1  # map_fun never reads
    assert 0.4 < time.monotonic() - start < 0.9
    assert server.queue("input").partitions == 2


def test_pacing_holds_a_feeder_for_as_long_as_map_fun_keeps_reading(make_server):
    """A map_fun slower than feed_timeout per partition still paces the feeders: the node tells
    the waiting feeder Pending while map_fun takes batches, so neither side times out."""
    server = make_server()
    assert train(feeder_for(server, feed_timeout=2.0), 0, list(range(40))) == 40
    second = Bg(train, feeder_for(server, feed_timeout=2.0), 1, list(range(40, 80)))
    assert wait_until(lambda: server.queue("input").partitions == 2)
    feed, rows = DataFeed(server), []
    start = time.monotonic()
    while time.monotonic() - start < 3.0:  # 1.5 feed_timeouts on partition 0, a row at a time
        rows += feed.next_batch(1)
        time.sleep(0.09)
        assert second.thread.is_alive() or len(rows) >= 40, f"acknowledged after {len(rows)} of 40 rows"
    assert second.thread.is_alive() and len(rows) < 40  # still held, and no FeedTimeout raised
    while len(rows) < 41:
        rows += feed.next_batch(1)
    assert second.get(5) == 40
    assert [int(r) for r in rows] == list(range(41))


def _released(server: FeedServer, feed_id: str, final: bool) -> None:
    """What the driver's FeedWatch sends (driver/feed_watch.py)."""
    with connect(("127.0.0.1", server.port), SECRET, timeout=10) as conn:
        m.send_message(conn, m.FeedRelease("input", feed_id, final=final))
        conn.settimeout(10)
        m.recv_message(conn, m.Ack)


def _paced_feeder(server: FeedServer, feed_id: str = "driver:7") -> Feeder:
    target = FeedTarget("worker:0", executor_key(), "127.0.0.1", server.port, server.unix_path)
    return Feeder([target], SECRET.hex(), "input", 20.0, feed_id)


def test_the_driver_releases_a_held_ack_and_a_final_release_holds_none_again():
    """A held Ack that can only stall (every partition handed out, or another node starving)
    goes at once when the driver says so, not after feed_timeout / 2 (issue 43, row 0)."""
    events: list = []
    server = FeedServer(SECRET, on_event=events.append)
    try:
        feeder = _paced_feeder(server)
        assert train(feeder, 0, list(range(10))) == 10  # nothing before it: not held
        assert not [e for e in events if isinstance(e, ev.FeedHeld)]
        held = Bg(train, feeder, 1, list(range(10, 20)))
        assert wait_until(lambda: [e for e in events if isinstance(e, ev.FeedHeld)])
        assert events[-1] == ev.FeedHeld("driver:7", 1)
        time.sleep(0.3)
        assert held.thread.is_alive()  # map_fun reads nothing: held

        _released(server, "driver:7", final=False)  # another node starves: release the ones held now
        assert held.get(5) == 10
        again = Bg(train, feeder, 2, list(range(20, 30)))  # a later partition is paced again
        assert wait_until(lambda: sum(isinstance(e, ev.FeedHeld) for e in events) == 2)
        time.sleep(0.3)
        assert again.thread.is_alive()

        _released(server, "driver:7", final=True)  # every partition handed out: never hold again
        assert again.get(5) == 10
        start = time.monotonic()
        assert train(feeder, 3, list(range(30, 40))) == 10
        assert time.monotonic() - start < 2 and sum(isinstance(e, ev.FeedHeld) for e in events) == 2
        other = Bg(train, _paced_feeder(server, "driver:8"), 0, [1])  # another feed is paced as before
        assert wait_until(lambda: sum(isinstance(e, ev.FeedHeld) for e in events) == 3)
        assert other.thread.is_alive()
    finally:
        server.close()
    other.get(5)


def test_a_long_hold_and_a_starving_reader_are_told_to_the_driver():
    """Every wait of the feed past 30 s (here 0.3 s) becomes a FeedWaiting event naming the
    partition and the setting; a reader with nothing queued or arriving, a FeedStarved."""
    events: list = []
    server = FeedServer(SECRET, on_event=events.append)
    server.waits.warn_after, server.waits.starved_after = 0.3, 0.2
    try:
        feeder = _paced_feeder(server)
        train(feeder, 0, list(range(10)))
        held = Bg(train, feeder, 1, list(range(10, 20)))
        assert wait_until(lambda: [e for e in events if isinstance(e, ev.FeedWaiting)], timeout=5)
        (waiting,) = [e for e in events if isinstance(e, ev.FeedWaiting)]
        assert (waiting.feed_id, waiting.partition) == ("driver:7", 1) and waiting.waited >= 0.3
        assert "feed_timeout=20s" in waiting.setting and "held" in waiting.what
        assert not [e for e in events if isinstance(e, ev.FeedStarved)]  # data is queued: nobody starves

        feed = DataFeed(server)
        assert len(feed.next_batch(20)) == 20  # both partitions; the held one is acknowledged
        assert held.get(5) == 10
        reader = Bg(feed.next_batch, 5)  # nothing queued, nothing arriving: it starves
        assert wait_until(lambda: len([e for e in events if isinstance(e, ev.FeedStarved)]) >= 2, timeout=5)
        starved = [e for e in events if isinstance(e, ev.FeedStarved)]
        assert starved[0].qname == "input" and starved[1].waited > starved[0].waited  # told again while it lasts
        close_feed(server)
        assert reader.get(5) == []
    finally:
        server.close()


@pytest.mark.parametrize("train_mode", [True, False])
def test_a_partition_whose_rows_do_not_all_arrive_is_refused_never_delivered_short(train_mode):
    """The feeder's FeedEnd counts the rows it took from Spark: had packing lost some (issue 43,
    row 1), the node refuses the partition with a FeedError naming it, instead of delivering it short."""
    from tfonspark.wire.codec import encode_batch
    from tfonspark.wire.packing import pack_rows

    events: list = []
    server = FeedServer(SECRET, on_event=events.append)
    try:
        with connect(("127.0.0.1", server.port), SECRET, timeout=10) as conn:
            conn.settimeout(10)
            m.send_message(conn, m.FeedStart("input", train_mode, 4, feed_id="driver:1", timeout=10.0))
            conn.send(*encode_batch(pack_rows([(1.0, 2), (3.0, 4)])))
            m.send_message(conn, m.FeedEnd(3))  # three rows taken, two sent
            reply = m.recv_message(conn, m.Reject)
        assert "partition 4" in reply.reason and "took 3 rows" in reply.reason and "2 arrived" in reply.reason
        (refused,) = [e for e in events if isinstance(e, ev.FeedRefused)]
        assert (refused.feed_id, refused.partition) == ("driver:1", 4)
        if train_mode:
            assert server.queue("input").partitions == 0 and server.queue("input").empty
        close_feed(server)
        assert DataFeed(server, train_mode=train_mode).next_batch(10) == []  # nothing of it is read
    finally:
        server.close()


def test_terminate_releases_a_feeder_that_waits_for_map_fun_to_read(make_server):
    server = make_server()
    train(feeder_for(server), 0, [1])
    waiting = Bg(train, feeder_for(server), 1, [2, 3])
    assert wait_until(lambda: server.queue("input").partitions == 2)
    DataFeed(server).terminate()
    assert waiting.get(5) == 2  # told to stop: the rows it sent are counted, nothing raised


def test_a_waiting_feeder_is_told_terminate_even_if_its_stream_closes_first(make_server, monkeypatch):
    """terminate() looks up the open streams, aborts the queues, then tells those streams; a
    stream whose wait the abort ended may close its connection in between (a busy host): its
    own thread tells the feeder first, so the feeder stops cleanly instead of failing."""
    from tfonspark.tfprocess import feedqueue

    abort = feedqueue.ByteQueue.abort

    def abort_then_stall(self) -> None:
        abort(self)
        time.sleep(0.5)  # the waiting stream's thread returns and closes meanwhile

    monkeypatch.setattr(feedqueue.ByteQueue, "abort", abort_then_stall)
    server = make_server()
    train(feeder_for(server), 0, [1])
    waiting = Bg(train, feeder_for(server), 1, [2, 3])
    assert wait_until(lambda: server.queue("input").partitions == 2)
    DataFeed(server).terminate()
    assert waiting.get(5) == 2


def test_terminate_stops_an_in_flight_feeder_and_drops_later_feeds(make_server, monkeypatch):
    monkeypatch.setattr(feedbatches, "_TARGET_BYTES", 256 * 1024)
    server = make_server(buffer_bytes=1 * MB)
    rows = big_rows(40 * MB, 1024)
    # a whole partition is delivered once complete (a 40 MB one partly from disk); the next
    # one is held back while map_fun has not read the first
    assert train(feeder_for(server), 0, rows) == len(rows)
    feeding = Bg(train, feeder_for(server), 1, rows)
    feed = DataFeed(server)
    first = feed.next_batch(16)
    assert len(first) == 16 and float(first[0][0]) == 0.0
    time.sleep(0.2)  # let the feeder block on the full buffer
    assert feeding.thread.is_alive()
    start = time.monotonic()
    feed.terminate()
    sent = feeding.get(20)
    elapsed = time.monotonic() - start
    print(f"\nfeeder stopped {elapsed:.3f}s after terminate(), having sent {sent} of {len(rows)} rows")
    assert elapsed < 5
    assert sent < len(rows)
    assert feed.should_stop() and feed.next_batch(16) == []

    # a feed that starts after terminate() is told to stop and nothing of it is queued
    start = time.monotonic()
    train(feeder_for(server), 2, list(range(5000)))
    assert time.monotonic() - start < 5
    queue = server.queue("input")
    assert queue.nbytes == 0 and not queue._items and queue.aborted


@pytest.mark.parametrize("received", ["whole partition received", "partition still arriving"])
def test_terminate_during_inference_fails_the_partition_quickly(make_server, monkeypatch, received):
    if received == "whole partition received":
        server = make_server()
        rows: list = list(range(1000))
    else:
        monkeypatch.setattr(feedbatches, "_TARGET_BYTES", 256 * 1024)
        server = make_server(buffer_bytes=1 * MB)
        rows = big_rows(40 * MB, 1024)
    feed = DataFeed(server, train_mode=False)
    task = Bg(infer, feeder_for(server, feed_timeout=60), 3, rows)
    batch = feed.next_batch(100)
    feed.batch_results([0] * len(batch))
    if received == "whole partition received":  # the feeder now only waits for results
        assert wait_until(lambda: any(s.ended for s in list(server._streams)))
    else:
        time.sleep(0.2)
        assert not any(s.ended for s in list(server._streams))
    start = time.monotonic()
    feed.terminate()
    with pytest.raises(FeedError, match="terminated the feed during inference of partition 3"):
        task.get(20)
    assert time.monotonic() - start < 5  # not after feed_timeout


# ---- backpressure and timeouts -----------------------------------------------------------------------


def test_backpressure_keeps_the_buffer_bounded(make_server, monkeypatch):
    monkeypatch.setattr(feedbatches, "_TARGET_BYTES", 128 * 1024)  # frames smaller than the buffer
    buffer_bytes = 1 * MB
    server = make_server(buffer_bytes=buffer_bytes)
    rows = big_rows(50 * MB, 256)
    queue = server.queue("input")
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(queue.nbytes + queue.reserved)
            time.sleep(0.001)

    sampler = Bg(sample)
    # one feed task at a time, as an executor with one core runs them: 100 partitions of 0.5 MB
    feeding = Bg(
        feed_in_turn_then_close,
        server,
        feeder_for(server),
        [rows[i : i + len(rows) // 100] for i in range(0, len(rows), len(rows) // 100)],
    )
    feed = DataFeed(server)
    count, total = 0, 0.0
    try:
        for _ in range(10_000):
            batch = feed.next_columns(1024)
            if batch is None:
                break
            count += batch.count
            total += float(batch.columns[0][:, 0].sum())
            time.sleep(0.015)  # a slow training step
    finally:
        done.set()
    sampler.get()
    feeding.get()
    peak = max(samples)
    print(
        f"\nfed {len(rows) * 1024 // MB} MB through a {buffer_bytes // MB} MB buffer; "
        f"peak queued {peak / MB:.2f} MB over {len(samples)} samples"
    )
    assert count == len(rows) and total == pytest.approx(len(rows) * (len(rows) - 1) / 2)
    assert peak <= buffer_bytes  # queued + staged stay bounded, while 50 MB went through
    assert peak >= buffer_bytes // 2  # and the buffer really filled up (the producer was held back)


def test_feed_timeout_when_the_consumer_never_reads(make_server, monkeypatch):
    monkeypatch.setattr(feedbatches, "_TARGET_BYTES", 256 * 1024)
    server = make_server(buffer_bytes=1 * MB)
    rows = big_rows(40 * MB, 1024)
    # the first partition is delivered whole (spilled past the buffer); the next one waits
    assert train(feeder_for(server, feed_timeout=1.0), 4, rows) == len(rows)
    start = time.monotonic()
    with pytest.raises(FeedTimeout) as info:
        train(feeder_for(server, feed_timeout=1.0), 5, rows)
    elapsed = time.monotonic() - start
    assert elapsed < 1.0 + 8
    assert "worker:0" in str(info.value) and "feed_timeout=1s" in str(info.value)
    assert "partition 5" in str(info.value)
    assert isinstance(info.value, TimeoutError)


def test_feed_timeout_when_inference_results_never_come(make_server):
    server = make_server()
    DataFeed(server, train_mode=False)  # a map_fun that never reads nor answers
    start = time.monotonic()
    with pytest.raises(FeedTimeout, match="worker:0"):
        infer(feeder_for(server, feed_timeout=1.0), 0, list(range(10)))
    assert 0.9 < time.monotonic() - start < 6


# ---- connecting -------------------------------------------------------------------------------------


def test_feed_server_removes_its_unix_socket_on_close():
    server = FeedServer(SECRET)
    path = server.unix_path
    assert path and os.path.exists(path) and os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    server.close()
    assert not os.path.exists(os.path.dirname(path))


@pytest.mark.parametrize("enabled", [True, False])
def test_feeding_leaves_the_garbage_collector_as_it_found_it(make_server, enabled):
    import gc

    server = make_server()
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        feeding = Bg(feed_all_then_close, server, feeder_for(server), {0: list(range(5000))})
        assert len(drain(DataFeed(server), 1000)) == 5000
        feeding.get()
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()


# ---- tf.data ----------------------------------------------------------------------------------------


# ---- from test_feed_delivery.py ---------------------------------------------------------------------
# Delivery guarantees of the feed server, without Spark: a training partition reaches map_fun
# exactly once and only when complete, large partitions stay out of memory, and every wait on
# either side of a feed connection ends within the feed's timeout.


@pytest.fixture
def server_and_events():
    events: list[tuple[str, dict]] = []
    server = FeedServer(  # fed first and read afterwards: partitions acknowledged on arrival
        SECRET, buffer_bytes=4 * MB, on_event=lambda event: events.append((event.TYPE, dict(vars(event)))), ahead=None
    )
    yield server, events
    server.close()


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


# ---- from test_feed_attack.py -----------------------------------------------------------------------
# A FeedServer short of file descriptors keeps taking legitimate feeds through a connection flood.
#
# The server runs in a process of its own limited to 64 descriptors (``RLIMIT_NOFILE``), with a
# consumer draining its queue; :func:`tests.unit.attack.flood` holds 200 idle and 20 slow
# (1 byte / 5 s) unauthenticated connections open against it. A real feeder must deliver a
# partition in under 2 s during the flood and after it.


_SERVER = textwrap.dedent("""
    import json, resource, sys, threading, time
    from tfonspark.tfprocess.datafeed import DataFeed
    from tfonspark.tfprocess.feedserver import FeedServer

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    server = FeedServer(bytes.fromhex(sys.argv[1]))
    rows = []

    def consume():
        feed = DataFeed(server)
        while True:
            batch = feed.next_columns(1000)
            if batch is None:
                return
            rows.append(batch.count)

    threading.Thread(target=consume, daemon=True).start()
    print(json.dumps({"port": server.port}), flush=True)
    sys.stdin.read()
    # an Ack means the rows are queued here, not yet read: give the consumer a bounded moment
    deadline = time.monotonic() + 10
    while sum(rows) < 10000 and time.monotonic() < deadline:
        time.sleep(0.01)
    listeners = sum(t.name.startswith("tfos-feed") for t in threading.enumerate())
    print(json.dumps({"rows": sum(rows), "listener_threads": listeners}), flush=True)
    server.close()
""")


def _feed(port: int, partition: int) -> float:
    target = FeedTarget("worker:0", "another-executor", "127.0.0.1", port)  # TCP, signed frames
    feeder = Feeder([target], SECRET_HEX, "input", 10.0, feed_id="flooded")
    start = time.monotonic()
    assert list(feeder.train_rdd(partition, iter(range(5000)))) == [5000]
    return time.monotonic() - start


def test_feeds_get_through_a_descriptor_flood_during_and_after():
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, SECRET_HEX], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = json.loads(proc.stdout.readline())["port"]
        with flood(("127.0.0.1", port), n_idle=200, n_slow=20) as attacker:
            time.sleep(1.0)  # the server is out of descriptors by now
            during = _feed(port, 0)
        time.sleep(1.0)
        after = _feed(port, 1)
        report = json.loads(proc.communicate(timeout=30)[0].strip().splitlines()[-1])
    finally:
        proc.kill()
    print(
        f"\n[measured] feed through a flood: {during:.3f}s during, {after:.3f}s after; "
        f"attacker {attacker.stats}; server {report}"
    )
    assert during < 2 and after < 2
    assert attacker.stats["closed_by_server"] > 0  # the flood really hit the descriptor limit
    assert report["rows"] == 10000
    assert report["listener_threads"] >= 1  # the accept loop is still alive
