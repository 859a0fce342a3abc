"""FeedServer + DataFeed + Feeder in one process, without Spark: the whole data path over 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.waiting import wait_until
from tfonspark.errors import FeedError, FeedTimeout, InputError
from tfonspark.executor import feedbatches
from tfonspark.executor import feeder as feeder_module
from tfonspark.executor.feeder import Feeder, FeedTarget, choose_target
from tfonspark.host import executor_key
from tfonspark.tfprocess.context import NodeContext
from tfonspark.tfprocess.datafeed import DataFeed
from tfonspark.tfprocess.feedserver import PARTITIONS_AHEAD, FeedServer
from tfonspark.wire import events as ev
from tfonspark.wire import messages as m
from tfonspark.wire import ring
from tfonspark.wire.framing import Connection, connect

pytestmark = pytest.mark.timeout(120)

SECRET = os.urandom(32)
MB = 1024 * 1024


# ---- helpers ----------------------------------------------------------------------------------


class Bg:
    """Run ``fn(*args)`` on a daemon thread; ``get`` joins with a bound and re-raises."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self.thread.start()

    def _run(self, fn, args) -> None:
        try:
            self.result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised by get()
            self.error = exc

    def get(self, timeout: float = 30) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background task did not finish in time"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture
def make_server():
    servers: list[FeedServer] = []

    def make(buffer_bytes: int = 64 * MB, ahead: int | None = PARTITIONS_AHEAD) -> FeedServer:
        server = FeedServer(SECRET, buffer_bytes=buffer_bytes, ahead=ahead)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def feeder_for(
    server: FeedServer,
    feed_timeout: float = 20.0,
    qname: str = "input",
    secret: bytes = SECRET,
    transport: str = "unix",
) -> Feeder:
    """A feeder on this executor: over the Unix socket (as in production) or forced onto TCP."""
    target = FeedTarget(
        "worker:0", executor_key(), "127.0.0.1", server.port, server.unix_path if transport == "unix" else ""
    )
    return Feeder([target], secret.hex(), qname, feed_timeout)


@pytest.fixture(params=["unix", "tcp"])
def transport(request, monkeypatch):
    """Run a test over each transport, proving the other one is not used."""
    if request.param == "unix":

        def no_tcp(*args, **kwargs):
            raise AssertionError("a same-executor feed went over TCP")

        monkeypatch.setattr(feeder_module, "connect", no_tcp)
    else:

        def no_unix(*args, **kwargs):
            raise AssertionError("a TCP feed went over the Unix socket")

        monkeypatch.setattr(feeder_module, "connect_unix", no_unix)
    return request.param


def close_feed(server: FeedServer, qname: str = "input") -> None:
    """What the driver does at the end of the feed (driver/feeding.py ``close_feeds``)."""
    with connect(("127.0.0.1", server.port), SECRET, timeout=10) as conn:
        m.send_message(conn, m.FeedClose(qname))
        conn.settimeout(10)
        m.recv_message(conn, m.Ack)


def train(feeder: Feeder, partition: int, rows) -> int:
    (count,) = list(feeder.train_rdd(partition, iter(rows)))
    return count


def infer(feeder: Feeder, partition: int, rows) -> list:
    return list(feeder.infer_rdd(partition, iter(rows)))


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


def drain(feed: DataFeed, batch_size: int) -> list:
    rows: list = []
    for _ in range(1_000_000):
        batch = feed.next_batch(batch_size)
        if not batch:
            assert feed.should_stop()
            return rows
        assert len(batch) <= batch_size
        rows.extend(batch)
    raise AssertionError("the feed never ended")


def big_rows(total_bytes: int, width: int) -> list[np.ndarray]:
    """float32 rows of ``width`` values adding up to ``total_bytes``; row i is filled with i."""
    n = total_bytes // (4 * width)
    return [np.full(width, i, dtype=np.float32) for i in range(n)]


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


def test_next_batch_returns_lists_of_rows_and_a_short_last_batch(make_server):
    server = make_server()
    feeding = Bg(feed_all_then_close, server, feeder_for(server), {0: list(range(250))})
    feeding.get()
    feed = DataFeed(server)
    assert feed.next_batch(100) == list(range(100))
    assert feed.next_batch(100) == list(range(100, 200))
    assert not feed.should_stop()
    assert feed.next_batch(100) == list(range(200, 250))  # fewer rows at the end
    assert feed.next_batch(100) == []
    assert feed.should_stop()
    assert feed.next_batch(100) == []  # and it stays ended


def test_next_batch_rejects_a_bad_batch_size(make_server):
    feed = DataFeed(make_server())
    with pytest.raises(InputError, match="batch_size"):
        feed.next_batch(0)


def test_next_batch_with_input_mapping_returns_dict_of_arrays(make_server):
    server = make_server()
    rows = [{"x": np.arange(4, dtype=np.float32) + i, "y": i % 3} for i in range(25)]
    Bg(feed_all_then_close, server, feeder_for(server), {0: rows}).get()
    feed = DataFeed(server, input_mapping={"x": "features", "y": "labels"})
    batch = feed.next_batch(10)
    assert set(batch) == {"features", "labels"}
    assert batch["features"].shape == (10, 4) and batch["features"].dtype == np.float32
    assert batch["labels"].tolist() == [i % 3 for i in range(10)]
    assert feed.next_batch(10)["labels"].shape == (10,)
    assert feed.next_batch(10)["features"].shape == (5, 4)
    assert feed.next_batch(10) == {"features": [], "labels": []}
    assert feed.should_stop()


def test_input_mapping_for_unnamed_tuples_goes_by_sorted_column_name(make_server):
    """TFoS: with tuple rows, the i-th column (by sorted input_mapping key) feeds the i-th field."""
    server = make_server()
    Bg(feed_all_then_close, server, feeder_for(server), {0: [(i, -i) for i in range(5)]}).get()
    feed = DataFeed(server, input_mapping={"b_col": "second", "a_col": "first"})
    batch = feed.next_batch(5)
    assert batch["first"].tolist() == [0, 1, 2, 3, 4] and batch["second"].tolist() == [0, -1, -2, -3, -4]


def test_input_mapping_naming_a_missing_column(make_server):
    server = make_server()
    Bg(feed_all_then_close, server, feeder_for(server), {0: [{"x": 1}, {"x": 2}]}).get()
    feed = DataFeed(server, input_mapping=["x", "nope"])
    with pytest.raises(InputError, match="nope"):
        feed.next_batch(2)


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


def answer_all(feed: DataFeed, batch_size: int, fn: Callable[[Any], Any], seen: list) -> None:
    """A map_fun in inference mode: one result per row, until the end of the feed."""
    for _ in range(1_000_000):
        batch = feed.next_batch(batch_size)
        if not batch:
            if feed.should_stop():
                return
            continue
        seen.append(batch)
        feed.batch_results([fn(row) for row in batch])
    raise AssertionError("the feed never ended")


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


def test_feeder_with_the_wrong_secret_gets_nothing_in(make_server):
    server = make_server()
    with pytest.raises(FeedError, match="worker:0"):
        train(feeder_for(server, secret=os.urandom(32)), 0, [1, 2, 3])
    assert server.queue("input").nbytes == 0 and not server.queue("input")._items


def test_feeder_to_a_node_that_is_gone(make_server):
    server = make_server()
    server.close()  # stops accepting at once (the accept thread is woken, not left to one more peer)
    for partition in range(3):
        with pytest.raises(FeedError, match="worker:0 at 127.0.0.1:.* is not accepting data"):
            train(feeder_for(server, feed_timeout=2), partition, [1, 2, 3])
    with pytest.raises(FeedError, match="not accepting data"):
        infer(feeder_for(server, feed_timeout=2), 0, [1, 2, 3])


def test_empty_partitions_need_no_connection(make_server):
    server = make_server()
    server.close()  # nothing listens: an empty partition must not even try
    feeder = feeder_for(server)
    assert train(feeder, 0, []) == 0
    assert infer(feeder, 0, []) == []


def test_a_missing_unix_socket_falls_back_to_tcp(make_server):
    """Same executor key but another filesystem (a container): TCP still reaches the node."""
    server = make_server()
    target = FeedTarget("worker:0", executor_key(), "127.0.0.1", server.port, "/nonexistent/feed.sock")
    feeding = Bg(feed_all_then_close, server, Feeder([target], SECRET.hex(), "input", 20), {0: list(range(10))})
    assert drain(DataFeed(server), 4) == list(range(10))
    assert feeding.get() == {0: 10}


def test_a_node_on_another_executor_is_fed_over_tcp(make_server, monkeypatch):
    server = make_server()
    target = FeedTarget("worker:0", "another-executor", "127.0.0.1", server.port, server.unix_path)

    def no_unix(*args, **kwargs):
        raise AssertionError("the Unix socket of another executor was used")

    monkeypatch.setattr(feeder_module, "connect_unix", no_unix)
    feeding = Bg(feed_all_then_close, server, Feeder([target], SECRET.hex(), "input", 20), {0: list(range(10))})
    assert drain(DataFeed(server), 4) == list(range(10))
    assert feeding.get() == {0: 10}


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


def test_a_spark_worker_freezes_its_long_lived_objects_once():
    """In a Spark task the feeder moves the worker's objects out of the cyclic GC's sight (in a
    child process: freezing is global); outside Spark it leaves the GC alone."""
    script = textwrap.dedent("""
        import gc, weakref
        import pyspark
        from tfonspark.executor import feeder
        feeder._freeze_worker_heap()
        assert gc.get_freeze_count() == 0, "froze outside a Spark task"
        pyspark.TaskContext.get = staticmethod(lambda: object())  # as inside a task
        feeder._freeze_worker_heap()
        frozen = gc.get_freeze_count()
        assert frozen > 10_000, frozen  # pyspark, numpy and tfonspark's objects
        feeder._freeze_worker_heap()
        assert gc.get_freeze_count() == frozen, "froze twice"
        class Node: pass
        node = Node(); node.me = node; alive = weakref.ref(node); del node
        gc.collect()
        assert alive() is None, "a cycle made after the freeze was not collected"
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_feeder_needs_a_target():
    with pytest.raises(FeedError, match="no node"):
        Feeder([], SECRET.hex(), "input", 10)


def test_choose_target_prefers_the_local_executor():
    targets = [FeedTarget(f"worker:{i}", key, "h", 1000 + i) for i, key in enumerate(["k0", "k1", "k0", "k2"])]
    assert {choose_target(targets, "k1", p).name for p in range(10)} == {"worker:1"}
    assert [choose_target(targets, "k0", p).name for p in range(4)] == ["worker:0", "worker:2"] * 2
    # no node on this executor: partitions spread over all of them
    assert [choose_target(targets, "elsewhere", p).name for p in range(5)] == [
        "worker:0",
        "worker:1",
        "worker:2",
        "worker:3",
        "worker:0",
    ]


def test_executor_key_outside_spark(monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    key = executor_key()
    assert key == executor_key() and len(key) == 16
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/tmp/blockmgr-1")
    other = executor_key()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/tmp/blockmgr-2")
    assert len({key, other, executor_key()}) == 3


# ---- tf.data ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def test_as_dataset_has_a_static_element_spec(tf, make_server):
    server = make_server(ahead=None)  # both partitions fed before the first read
    rows = [(i, np.full(4, i, np.float32)) for i in range(300)]
    Bg(feed_all_then_close, server, feeder_for(server), {0: rows[:130], 1: rows[130:]}).get()
    ds = DataFeed(server).as_dataset(64)
    assert ds.element_spec == (tf.TensorSpec((None,), tf.int64), tf.TensorSpec((None, 4), tf.float32))
    sizes, ids = [], []
    for ids_t, vecs in ds:
        assert vecs.shape[1:] == (4,) and vecs.dtype == tf.float32
        sizes.append(int(ids_t.shape[0]))
        ids.extend(ids_t.numpy().tolist())
        assert np.array_equal(vecs.numpy()[:, 0], ids_t.numpy().astype(np.float32))
    assert sizes == [64, 64, 64, 64, 44]
    assert sorted(ids) == list(range(300))


def test_as_dataset_of_named_columns_and_strings(tf, make_server):
    server = make_server()
    rows = [{"text": f"row {i}", "label": float(i)} for i in range(10)]
    Bg(feed_all_then_close, server, feeder_for(server), {0: rows}).get()
    ds = DataFeed(server).as_dataset(4)
    assert ds.element_spec == {"text": tf.TensorSpec((None,), tf.string), "label": tf.TensorSpec((None,), tf.float64)}
    got = [(b["text"].numpy().tolist(), b["label"].numpy().tolist()) for b in ds]
    assert [len(t) for t, _ in got] == [4, 4, 2]
    assert got[0] == ([b"row 0", b"row 1", b"row 2", b"row 3"], [0.0, 1.0, 2.0, 3.0])


def test_as_dataset_with_an_output_signature_casts_batches(tf, make_server):
    server = make_server()
    Bg(feed_all_then_close, server, feeder_for(server), {0: [np.int32(i) for i in range(10)]}).get()
    spec = tf.TensorSpec((None,), tf.int64)
    ds = DataFeed(server).as_dataset(8, output_signature=spec)
    assert ds.element_spec == spec
    assert [b.numpy().tolist() for b in ds] == [list(range(8)), [8, 9]]


def test_as_dataset_on_an_empty_feed_asks_for_a_signature(tf, make_server):
    server = make_server()
    close_feed(server)
    with pytest.raises(InputError, match="output_signature"):
        DataFeed(server).as_dataset(8)
