"""``TFManager.start`` + ``TFNode.DataFeed``: a TFoS user's way to test ``map_fun`` without Spark."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tfonspark import TFManager, TFNode
from tfonspark.errors import ConfigError, FeedError


def test_training_rows_come_out_in_batches_then_the_feed_ends():
    mgr = TFManager.start(b"abc", ["input", "output"], "local")
    q = mgr.get_queue("input")
    for i in range(10):
        q.put(i)
    q.put(None)
    feed = TFNode.DataFeed(mgr, train_mode=True)
    batches = []
    while not feed.should_stop():
        batch = feed.next_batch(4)
        if batch:
            batches.append(list(batch))
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_inference_results_go_to_the_output_queue_in_order():
    mgr = TFManager.start(b"abc", ["input", "output"], "remote")
    rows = [(np.full(3, i, np.float32), i) for i in range(5)]
    for row in rows:
        mgr.get_queue("input").put(row)
    mgr.get_queue("input").put(None)
    feed = TFNode.DataFeed(mgr, train_mode=False)
    while not feed.should_stop():
        batch = feed.next_batch(2)
        if batch:
            feed.batch_results([float(x.sum()) + label for x, label in batch])
    out = mgr.get_queue("output")
    assert [out.get(timeout=5) for _ in rows] == [4.0 * i for i in range(5)]
    assert out.empty()


def test_dict_rows_and_an_input_mapping_give_named_arrays():
    mgr = TFManager.start(b"k", ["input", "output"])
    for i in range(3):
        mgr.get_queue("input").put({"x": [i, i], "y": i})
    mgr.get_queue("input").put(None)
    feed = TFNode.DataFeed(mgr, True, input_mapping={"x": "features", "y": "label"})
    batch = feed.next_batch(3)
    np.testing.assert_array_equal(batch["features"], [[0, 0], [1, 1], [2, 2]])
    np.testing.assert_array_equal(batch["label"], [0, 1, 2])


def test_terminate_wakes_a_reader_waiting_for_rows():
    mgr = TFManager.start(b"k", ["input"])
    feed = TFNode.DataFeed(mgr, True)
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(feed.next_batch(5)))
    reader.start()
    feed.terminate()
    reader.join(10)
    assert not reader.is_alive() and got == [[]] and feed.should_stop()


def test_bad_mode_and_a_missing_feed_say_what_to_use():
    with pytest.raises(ConfigError, match="mode must be 'local' or 'remote'"):
        TFManager.start(b"k", ["input"], "shared")
    with pytest.raises(FeedError, match=r"TFManager.start"):
        TFNode.DataFeed(object(), True)
