"""tfprocess/datafeed.py: DataFeed's batches, input mapping and as_dataset, read by several threads,
and ``drain()``: against a real FeedServer, without Spark."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.unit._feeds import (
    SECRET,
    Bg,
    close_feed,
    feeder_for,
    train,
)
from tfonspark.errors import InputError
from tfonspark.executor.feeder import Feeder
from tfonspark.tfprocess.datafeed import DataFeed
from tfonspark.tfprocess.feedserver import FeedServer

pytestmark = pytest.mark.timeout(120)


def fed_server(rows: int, partitions: int) -> tuple[FeedServer, Bg]:
    """A FeedServer being fed rows ``(x, label=i)``, i = 0 .. rows-1, partition after partition.

    Partitions go in order on one connection at a time, so the labels arrive in order: any
    batch read whole is a run of consecutive labels. The end of the feed follows the last one.
    """
    server = FeedServer(SECRET)
    feeder = feeder_for(server)
    per = rows // partitions

    def feed_all() -> int:
        total = 0
        for p in range(partitions):
            part = [(np.full(4, i, np.float32), i) for i in range(p * per, (p + 1) * per)]
            total += next(feeder.train_rdd(p, iter(part)))
        close_feed(server)
        return total

    return server, Bg(feed_all)


def labels_of(batch) -> np.ndarray:
    return np.asarray(batch.columns[1])


def test_drain_reads_the_rest_of_the_feed_until_its_end():
    server, feeding = fed_server(3000, 3)
    try:
        feed = DataFeed(server)
        first = feed.next_columns(100)
        assert first is not None and first.count == 100
        assert feed.drain() == 2900
        assert feeding.get() == 3000
        assert feed.should_stop()
        assert feed.next_columns(10) is None and feed.drain() == 0
    finally:
        server.close()


def test_drain_of_a_partly_read_batch_drops_its_rest():
    server, feeding = fed_server(1000, 1)
    try:
        feed = DataFeed(server)
        assert feeding.get() == 1000  # all queued: one 1000-row batch
        assert labels_of(feed.next_columns(10)).tolist() == list(range(10))
        assert feed.drain() == 990
    finally:
        server.close()


def test_concurrent_readers_get_whole_batches_and_each_row_once():
    server, feeding = fed_server(6000, 4)
    try:
        feed = DataFeed(server)
        batches: list[np.ndarray] = []
        lock = threading.Lock()

        def read() -> None:
            while (batch := feed.next_columns(37)) is not None:
                with lock:
                    batches.append(labels_of(batch))

        readers = [Bg(read) for _ in range(3)]
        for reader in readers:
            reader.get()
        assert feeding.get() == 6000
        assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(6000))
        for labels in batches:  # never two readers' rows in one batch
            assert np.array_equal(labels, np.arange(labels[0], labels[0] + len(labels)))
    finally:
        server.close()


def test_drain_while_another_thread_still_reads():
    """fit's tf.data prefetch may still be reading when the node drains: no row is read twice."""
    server, feeding = fed_server(8000, 4)
    try:
        feed = DataFeed(server)
        taken: list[np.ndarray] = []

        def prefetch() -> None:
            while (batch := feed.next_batch(64)) != []:
                taken.append(np.asarray([row[1] for row in batch]))

        reader = Bg(prefetch)
        time.sleep(0.05)
        dropped = feed.drain()
        reader.get()
        assert feeding.get() == 8000
        labels = np.concatenate(taken) if taken else np.zeros(0, np.int64)
        assert len(np.unique(labels)) == len(labels)
        assert len(labels) + dropped == 8000
    finally:
        server.close()


def test_drain_refuses_an_inference_feed():
    server = FeedServer(SECRET)
    try:
        with pytest.raises(InputError, match="batch_results"):
            DataFeed(server, train_mode=False).drain()
    finally:
        server.close()


def test_terminate_wakes_a_reader_waiting_for_data():
    """The waiting reader holds the feed's lock; terminate() from another thread must not deadlock."""
    server = FeedServer(SECRET)
    try:
        feed = DataFeed(server)
        reader = Bg(feed.drain)
        time.sleep(0.1)  # the reader now waits for data, holding the lock
        stopper = Bg(feed.terminate)
        stopper.get(10)
        assert reader.get(10) == 0
        assert feed.should_stop() and feed.next_columns(5) is None
    finally:
        server.close()


def test_as_dataset_and_drain_share_the_feed():
    """The demo's pattern: tf.data reads part of the feed on its threads, drain() takes the rest."""
    pytest.importorskip("tensorflow")
    server, feeding = fed_server(4000, 4)
    try:
        feed = DataFeed(server)
        dataset = feed.as_dataset(100).prefetch(4)
        seen = [int(n) for _, labels in dataset.take(5) for n in labels.numpy()]
        dropped = feed.drain()
        assert feeding.get() == 4000
        assert seen == list(range(500))
        # batches tf.data prefetched beyond the 5 taken are gone (read once, by it), never re-read
        assert 500 + dropped <= 4000
        assert 4000 - 500 - dropped <= 6 * 100
    finally:
        server.close()


class _Stream:
    """One partition of a hand-filled feed: its rows are answered into ``results``."""

    partition = 0

    def __init__(self, train: bool) -> None:
        self.train = train
        self.closed = threading.Event()
        self.results: list = []

    def answer(self, batch) -> None:
        self.results.extend(batch.rows())

    def maybe_finish(self) -> None:
        pass


def _queued_feed(batches: list, train: bool) -> tuple[DataFeed, _Stream]:
    """A feed of ``batches``, each queued as one received frame of one partition, then the end
    of the feed."""
    from tfonspark.tfprocess.feedqueue import END_FEED
    from tfonspark.tfprocess.localfeed import LocalFeeds

    feeds, stream = LocalFeeds(["input", "output"]), _Stream(train)
    queue = feeds.queue("input")
    for batch in batches:
        queue.put(stream, batch, batch.nbytes)
    queue.put(stream, None)  # the partition's end
    queue.put(None, END_FEED)
    return DataFeed(feeds, train_mode=train), stream


def _feed_with_empty_batches(train: bool) -> tuple[DataFeed, _Stream]:
    """5 rows as [2 rows, 0 rows, 3 rows, 0 rows], then the end of the feed: the 0-row batches
    are what a 0-row Arrow batch of a DataFrame partition becomes."""
    from tfonspark.wire.packing import pack_rows

    rows = pack_rows([(np.full(3, i, np.float32), i) for i in range(5)])
    return _queued_feed([rows.slice(0, 2), rows.slice(0, 0), rows.slice(2, 5), rows.slice(5, 5)], train)


def test_a_reader_never_gets_a_zero_row_batch():
    feed, _ = _feed_with_empty_batches(train=True)
    sizes = []
    while (batch := feed.next_columns(5)) is not None:  # the second read starts at a 0-row batch
        sizes.append(batch.count)
    assert sizes == [5]


def test_as_dataset_never_yields_an_empty_batch():
    pytest.importorskip("tensorflow")
    feed, _ = _feed_with_empty_batches(train=True)
    labels = [b[1].numpy().tolist() for b in feed.as_dataset(5)]
    assert labels == [[0, 1, 2, 3, 4]]


def test_inference_reads_skip_zero_row_batches_and_answer_every_row():
    feed, stream = _feed_with_empty_batches(train=False)
    sizes = []
    while (batch := feed.next_columns(10)) is not None:
        sizes.append(batch.count)
        feed.batch_results([int(label) * 10 for _, label in batch.rows()])
    assert sizes == [5] and stream.results == [0, 10, 20, 30, 40]


# ---- what next_batch hands back: the rows as they were fed, as TFoS did -------------------------


def _fed_rows(rows: list) -> list:
    """Feed ``rows`` as one partition through a real feed server; read them with next_batch."""
    from tests.unit._feeds import train

    server = FeedServer(SECRET)
    try:
        feeding = Bg(lambda: (train(feeder_for(server), 0, rows), close_feed(server)))
        feed = DataFeed(server)
        got: list = []
        while batch := feed.next_batch(3):
            got.extend(batch)
        feeding.get()
        return got
    finally:
        server.close()


@pytest.mark.parametrize(
    "rows",
    [
        [([1.0, 2.0, 3.0], 7), ([4.0, 5.0, 6.0], 8)],  # TFoS's (features, label)
        [[[1.0, 2.0], 7], [[3.5, 4.5], 8]],  # list rows
        [((1, 2), (0.5,)), ((3, 4), (1.5,))],  # tuple values
        [[0.25, 0.5, 1.0], [2.0, 4.0, 8.0]],  # a row that is a list of numbers
        [{"x": [1.0, 2.0], "y": 3}, {"x": [4.0, 5.0], "y": 6}],  # dicts
        [[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]],  # nested lists
        [7, 8, 9],
    ],
    ids=["features-label", "list-rows", "tuple-values", "flat-list", "dicts", "nested", "scalars"],
)
def test_next_batch_gives_back_the_rows_as_fed(rows):
    got = _fed_rows(rows)
    assert got == rows
    assert [type(r) for r in got] == [type(r) for r in rows]
    if isinstance(rows[0], (list, tuple)):
        assert [type(v) for v in got[0]] == [type(v) for v in rows[0]]


def test_next_batch_keeps_numpy_values_and_next_columns_stays_columnar():
    rows = [(np.arange(3, dtype=np.float32) + i, i) for i in range(4)]
    got = _fed_rows(rows)
    assert all(isinstance(r[0], np.ndarray) and r[0].dtype == np.float32 for r in got)
    assert [r[0].tolist() for r in got] == [r[0].tolist() for r in rows]
    from tests.unit._feeds import train

    server = FeedServer(SECRET)
    try:
        feeding = Bg(lambda: (train(feeder_for(server), 0, [([1.0, 2.0], 7)] * 5), close_feed(server)))
        columns = DataFeed(server).next_columns(5)
        feeding.get()
    finally:
        server.close()
    assert isinstance(columns.columns[0], np.ndarray) and columns.columns[0].shape == (5, 2)


# ---- inference results: one frame back per frame received -----------------------------------


def test_results_of_one_received_frame_go_back_as_one_frame(monkeypatch):
    """Reads of 64 rows from one 1,000-row frame are answered in one frame, in order, with the
    values given (a reused result buffer included), the types kept (ints after floats), and
    object results (strings) sent at once."""
    from tests.unit._feeds import infer
    from tfonspark.tfprocess import feedserver

    answers: list[int] = []
    answer = feedserver.Stream.answer
    monkeypatch.setattr(feedserver.Stream, "answer", lambda self, b: (answers.append(b.count), answer(self, b))[1])
    server = FeedServer(SECRET)
    try:
        feeder = feeder_for(server)
        feed = DataFeed(server, train_mode=False)
        task = Bg(infer, feeder, 0, [(float(i), i) for i in range(1000)])
        buffer, read = np.empty(64, np.float64), 0
        while read < 1000:
            batch = feed.next_columns(64)
            labels, read = batch.columns[1], read + batch.count
            if labels[0] < 512:  # numpy results, in a buffer reused for every batch
                buffer[: batch.count] = labels * 2
                feed.batch_results(buffer[: batch.count])
            elif labels[0] < 960:
                feed.batch_results([int(v) * 2 for v in labels])  # ints after floats
            else:
                feed.batch_results([str(v) for v in labels])  # objects: answered at once
        results = task.get(60)
        close_feed(server)
    finally:
        server.close()
    assert results == [float(i * 2) for i in range(512)] + [i * 2 for i in range(512, 960)] + [
        str(i) for i in range(960, 1000)
    ]
    assert [type(r) for r in results[511:513]] == [float, int]
    assert answers == [512, 448, 40]  # 16 reads: one frame per kind of result


def _feed_of_frames(*frames: list) -> DataFeed:
    """A training feed of ``frames`` (lists of rows), each packed and queued as one received frame."""
    from tfonspark.wire.packing import pack_rows

    return _queued_feed([pack_rows(rows) for rows in frames], train=True)[0]


def _address(column: np.ndarray) -> int:
    return column.__array_interface__["data"][0]


def test_batches_joined_from_two_frames_reuse_memory_the_reader_dropped():
    width = 1024  # 4 KB rows: a 150-row batch is large enough to be pooled
    frames = [[(np.full(width, i, np.float32), i) for i in range(f * 100, (f + 1) * 100)] for f in range(6)]
    feed = _feed_of_frames(*frames)
    first = feed.next_columns(150)  # rows 0-149: frames 0 and 1, joined
    held_address = _address(first.columns[0])
    second = feed.next_columns(150)  # rows 150-299: frames 1 and 2, joined while the first is held
    assert _address(second.columns[0]) != held_address
    np.testing.assert_array_equal(first.columns[0][:, 0], np.arange(150, dtype=np.float32))
    np.testing.assert_array_equal(second.columns[1], np.arange(150, 300))
    del first
    third = feed.next_columns(150)  # rows 300-449: joined into the memory the first one left
    assert _address(third.columns[0]) == held_address
    np.testing.assert_array_equal(third.columns[0][:, -1], np.arange(300, 450, dtype=np.float32))
    np.testing.assert_array_equal(second.columns[1], np.arange(150, 300))  # untouched meanwhile
    third.columns[0][0, 0] = -1.0  # a reader may write to what it was given
    assert feed.next_columns(150).count == 150 and feed.next_columns(150) is None


def test_joined_batches_keep_numpys_dtype_rules_and_refuse_another_shape():
    small, wide = np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int64)
    joined = _feed_of_frames([(small, 0)], [(wide, 1)]).next_columns(2)
    assert joined.columns[0].dtype == np.int64 and joined.columns[0].tolist() == [[0, 1, 2]] * 2
    with pytest.raises(InputError, match="column 0"):
        _feed_of_frames([(np.zeros(4, np.float32), 0)], [(np.zeros(5, np.float32), 1)]).next_columns(2)


def feed_all_then_close(server: FeedServer, feeder: Feeder, partitions: dict[int, list]) -> dict[int, int]:
    """Feed every partition concurrently (like Spark tasks), then send the end of the feed."""
    try:
        tasks = {p: Bg(train, feeder, p, rows) for p, rows in partitions.items()}
        return {p: t.get(60) for p, t in tasks.items()}
    finally:
        close_feed(server)


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
