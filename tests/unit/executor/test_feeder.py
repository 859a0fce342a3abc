"""executor/feeder.py: the feed task's side of a feed: its targets, transports and secret, and a
``FeedEnd`` that counts the rows it took from Spark, not the rows it packed.

Row 1 of issue 43 lost a chunk of rows inside the feeder's packing and ``FeedEnd`` counted only
what was sent, so the node saw a consistent, shorter partition. Here a packing loss is made on
purpose (one row dropped from each frame, or from each decoded or Arrow batch), the partition is
fed to a real ``FeedServer`` over the real connection, and the feed must fail: the node compares
``FeedEnd`` with the rows that arrived. And every path counts exactly the rows fed.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.unit._feeds import (
    SECRET,
    Bg,
    answer_all,
    close_feed,
    drain,
    feeder_for,
    infer,
    train,
)
from tfonspark.errors import FeedError, InputError
from tfonspark.executor import feedbatches
from tfonspark.executor import feeder as feeder_module
from tfonspark.executor.feeder import Feeder, FeedTarget, choose_target
from tfonspark.host import executor_key
from tfonspark.tfprocess.datafeed import DataFeed
from tfonspark.tfprocess.feedserver import FeedServer
from tfonspark.wire import packing
from tfonspark.wire.codec import ColumnBatch

pytestmark = pytest.mark.timeout(120)

N = 5000


def _tuples() -> list[Any]:
    return [([float(i), 2.0], i) for i in range(N)]  # like the first: packed row by row (fill_frame)


def _dicts() -> list[Any]:
    return [{"x": float(i), "y": i} for i in range(N)]  # no row plan: packed a chunk at a time


def _blobs(rows: list[Any]) -> list[bytes]:
    """A stored RDD's pickled batches of rows, as PySpark's batched serializer keeps them."""
    return [pickle.dumps(rows[i : i + 100], 5) for i in range(0, len(rows), 100)]


def _record_batches(rows: list[Any]) -> list[Any]:
    ids = np.arange(len(rows), dtype=np.int64)
    return [pa.RecordBatch.from_pydict({"id": ids[i : i + 700]}) for i in range(0, len(rows), 700)]


def _one_short(batches: list[ColumnBatch]) -> list[ColumnBatch]:
    return [b.slice(0, b.count - 1) if b.count > 1 else b for b in batches]


def _lose_a_row_per_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    flush = feedbatches._Frames.flush
    monkeypatch.setattr(feedbatches._Frames, "flush", lambda self: _one_short(flush(self)))


def _lose_a_row_per_decoded_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    joined = feedbatches._joined
    monkeypatch.setattr(feedbatches, "_joined", lambda batches, scratch: _one_short([joined(batches, scratch)])[0])


def _lose_a_row_per_record_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    to_columns = feedbatches.arrow_to_columns
    monkeypatch.setattr(feedbatches, "arrow_to_columns", lambda rb, *args: _one_short([to_columns(rb, *args)])[0])


def _in_a_task(monkeypatch: pytest.MonkeyPatch, partition: int) -> None:
    """``train_arrow`` reads its partition from Spark's TaskContext."""
    monkeypatch.setattr(feeder_module, "_partition_id", lambda task: partition)


def _train_rows(feeder: Feeder, rows: list[Any]) -> int:
    (count,) = list(feeder.train_rdd(4, iter(rows)))
    return count


def _train_pickled(feeder: Feeder, rows: list[Any]) -> int:
    (count,) = list(feeder.train_pickled(4, iter(_blobs(rows))))
    return count


def _train_arrow(feeder: Feeder, rows: list[Any]) -> int:
    (result,) = list(feeder.train_arrow(iter(_record_batches(rows))))
    return int(result.column(0)[0].as_py())


PATHS: dict[str, tuple[Callable[[], list[Any]], Callable[..., int], Callable[[pytest.MonkeyPatch], None]]] = {
    "rows packed as they come": (_tuples, _train_rows, _lose_a_row_per_frame),
    "rows packed in chunks": (_dicts, _train_rows, _lose_a_row_per_frame),
    "pickled batches": (_tuples, _train_pickled, _lose_a_row_per_decoded_batch),
    "arrow record batches": (_tuples, _train_arrow, _lose_a_row_per_record_batch),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_a_row_lost_in_packing_fails_the_training_feed(path, make_server, monkeypatch):  # noqa: F811
    """Before, each of these fed 5,000 rows minus the lost ones and reported success."""
    rows, train, lose = PATHS[path]
    _in_a_task(monkeypatch, 4)
    lose(monkeypatch)
    server = make_server()
    try:
        with pytest.raises(FeedError, match=f"took {N} rows"):  # FeedEnd: the rows taken, not sent
            train(feeder_for(server), rows())
    finally:
        close_feed(server)
    assert not DataFeed(server, train_mode=True).next_batch(N)  # nothing of it was delivered


@pytest.mark.parametrize("path", list(PATHS))
def test_every_path_counts_the_rows_fed(path, make_server, monkeypatch):  # noqa: F811
    rows, train, _ = PATHS[path]
    _in_a_task(monkeypatch, 4)
    server = make_server()
    feed = DataFeed(server, train_mode=True)
    try:
        assert train(feeder_for(server), rows()) == N
    finally:
        close_feed(server)
    assert len(drain(feed, 1000)) == N


def test_a_row_lost_in_packing_fails_the_inference_feed(make_server, monkeypatch):  # noqa: F811
    _lose_a_row_per_frame(monkeypatch)
    server = make_server()
    consumer = Bg(answer_all, DataFeed(server, train_mode=False), 500, lambda row: row[1], [])
    try:
        with pytest.raises(FeedError, match=f"took {N} rows"):  # the node refuses it, naming both counts
            list(feeder_for(server).infer_rdd(4, iter(_tuples())))
    finally:
        close_feed(server)
    consumer.get()


def test_rows_taken_but_no_batch_packed_fail_the_feed(make_server):  # noqa: F811
    """No batch opens no connection, so no node could see the count: the feeder says it."""
    server = make_server()
    tally = feedbatches.Tally()
    tally.rows = 3
    with pytest.raises(FeedError, match="partition 4: 3 rows were taken but none was packed"):
        feeder_for(server)._train(4, iter([]), tally)
    assert feeder_for(server)._train(4, iter([]), feedbatches.Tally()) == 0  # an empty partition


@pytest.mark.parametrize("native", ["c", "pure"])
@pytest.mark.parametrize("empty", [(), [], {}])
def test_a_partition_of_only_empty_rows_fails_its_feed_task_naming_it(empty, native, make_server, monkeypatch):  # noqa: F811
    """It was a ZeroDivisionError in ``feedbatches.row_batches`` on both packers."""
    if native == "pure":
        monkeypatch.setattr(packing, "native", None)
    server = make_server()
    with pytest.raises(InputError) as info:
        _train_rows(feeder_for(server), [empty] * 100)
    assert (info.value.partition, info.value.row) == (4, 0) and "empty row" in str(info.value)


def test_the_tally_counts_rows_where_the_c_packer_leaves_some_over(monkeypatch):
    """Rows that ``fill_frame`` does not take (a chunk's rows rebuilt, the row itself, the rest
    of the chunk) are counted once each, as the frames that carry them."""
    rows: list[Any] = _tuples()
    for r in (16, 17, 100, 4000, N - 1):
        rows[r] = ([float(r), 2.0], float(r))  # a float label: a chunk of another dtype
    tally = feedbatches.Tally()
    batches: Iterator[ColumnBatch] = feedbatches.row_batches(0, iter(rows), 0, tally)
    assert sum(b.count for b in batches) == tally.rows == N


def feed_all_then_close(server: FeedServer, feeder: Feeder, partitions: dict[int, list]) -> dict[int, int]:
    """Feed every partition concurrently (like Spark tasks), then send the end of the feed."""
    try:
        tasks = {p: Bg(train, feeder, p, rows) for p, rows in partitions.items()}
        return {p: t.get(60) for p, t in tasks.items()}
    finally:
        close_feed(server)


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
