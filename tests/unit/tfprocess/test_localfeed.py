"""The in-process feed of TFoS's ``TFManager.start`` seam keeps TFoS's queue semantics."""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest

from tfonspark import TFManager
from tfonspark.tfprocess.localfeed import LocalFeeds


def full_queue():
    feeds = LocalFeeds(["input", "output"], buffer_bytes=4096)
    q = feeds.get_queue("input")
    q.put(np.zeros(400))  # 3.2 KB of the 4 KB
    return q


def test_a_put_that_cannot_wait_on_a_full_queue_raises_queue_full():
    q = full_queue()
    with pytest.raises(queue.Full, match="'input'"):
        q.put(np.zeros(400), block=False)


def test_a_put_whose_timeout_passes_raises_queue_full():
    q = full_queue()
    started = time.monotonic()
    with pytest.raises(queue.Full, match="0.2"):
        q.put(np.zeros(400), timeout=0.2)
    assert 0.15 < time.monotonic() - started < 5


def test_the_tfos_manager_queue_raises_queue_full_too():
    mgr = TFManager.start(b"key", ["input", "output"])
    q = mgr.get_queue("input")
    with pytest.raises(queue.Full):
        for _ in range(100_000):  # the default buffer holds 64 MiB
            q.put(np.zeros(100_000), block=False)
    mgr.terminate()
