"""wire/buffers.py: receive buffers reused once no view of them is alive, and fresh buffers."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.unit.wire._handshake import handshake_pair
from tfonspark.wire import buffers as bufs
from tfonspark.wire import packing

BIG = 1024 * 1024


def test_recv_buffers_reuse_memory_once_no_view_of_it_is_alive():
    pool = bufs.RecvBuffers(16 * BIG)
    first = pool.take(4 * BIG)
    first[:5] = b"first"
    buffers = [first.obj]  # references, not views: they do not keep a buffer in use
    held = np.frombuffer(first[:5], np.uint8)  # a decoded batch is a numpy view like this
    del first
    second = pool.take(4 * BIG)
    # the viewed buffer was not handed out again (fresh memory is not zeroed: compare identities)
    assert second.obj is not buffers[0]
    buffers.append(second.obj)
    del second
    assert bytes(held) == b"first" and pool.nbytes == 8 * BIG
    del held
    again = pool.take(3 * BIG)  # smaller frames fit in a free buffer (up to half its size)
    assert len(again) == 3 * BIG and any(again.obj is b for b in buffers)
    assert pool.nbytes == 8 * BIG  # nothing new was allocated


def test_recv_buffers_keep_within_their_capacity():
    pool = bufs.RecvBuffers(10 * BIG)
    views = [pool.take(4 * BIG) for _ in range(5)]  # all in use: only two fit in the pool
    assert all(len(v) == 4 * BIG for v in views)
    assert pool.nbytes == 8 * BIG
    del views
    assert len(pool.take(BIG)) == BIG  # free 4 MB buffers are too large for it; no room for a third
    big = pool.take(8 * BIG)  # free buffers that do not fit make room
    assert len(big) == 8 * BIG and pool.nbytes <= 10 * BIG


def test_recv_buffers_leave_small_and_huge_frames_to_fresh_memory():
    pool = bufs.RecvBuffers(4 * BIG)
    assert len(pool.take(100)) == 100 and len(pool.take(5 * BIG)) == 5 * BIG
    assert pool.nbytes == 0


@pytest.mark.parametrize("unix", [False, True])
def test_payloads_stay_intact_while_later_frames_reuse_buffers(unix):
    server, _, client, _ = handshake_pair(unix=unix)
    try:
        server.settimeout(5)
        server.buffers = bufs.RecvBuffers(8 * BIG)
        kept = []
        for i in range(6):
            sender = threading.Thread(target=client.send, args=(np.full(BIG // 4, i, np.float32),))
            sender.start()
            arr = np.frombuffer(server.recv(), np.float32)
            sender.join(5)
            if i % 2 == 0:
                kept.append((i, arr))  # held like a batch the consumer has not let go of
            del arr
        assert all((arr == i).all() for i, arr in kept)
        assert server.buffers.nbytes <= 5 * BIG  # released frames were reused
    finally:
        server.close()
        client.close()


def test_new_buffer_is_a_bytearray_of_the_size_asked_with_or_without_the_c_part():
    for make in (bufs.new_buffer, bufs._load_empty(), bytearray):
        buf = make(12345)
        assert type(buf) is bytearray and len(buf) == 12345
        buf[-1] = 7  # writable, and resizable like any bytearray (the pool's unused probe)
        buf.append(0)
        assert len(buf) == 12346
    if packing.native is not None:  # built: it does not zero-fill, and says so in its name
        assert bufs._make_bytearray is packing.native.empty_bytearray
    for size in (-1, -2):  # with or without the C part, as the C part has always answered
        with pytest.raises(ValueError, match=">= 0"):
            bufs.new_buffer(size)


def test_the_pools_unused_probe_never_moves_a_new_buffer():
    buf = bufs.new_buffer(1 << 20)
    address = np.frombuffer(buf, np.uint8).__array_interface__["data"][0]
    assert bufs._unused(buf) and len(buf) == 1 << 20
    assert np.frombuffer(buf, np.uint8).__array_interface__["data"][0] == address
    view = memoryview(buf)
    assert not bufs._unused(buf)
    view.release()
    assert bufs._unused(buf)


def test_a_grown_frame_buffer_joins_the_pool_for_reuse(pair):
    server, client = pair
    server.buffers = bufs.RecvBuffers(16 * BIG)
    size = 3 * BIG + 5
    for i in range(3):
        sender = threading.Thread(target=client.send, args=(bytes([i]) * size,))
        sender.start()
        got = server.recv()
        sender.join(5)
        assert bytes(got[:3]) == bytes([i]) * 3 and len(got) == size
        del got
    assert server.buffers.nbytes == size  # one buffer, reused by the later frames
