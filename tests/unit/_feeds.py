"""The feed's test helpers, shared by the tests of the feed server (tfprocess/), its reader and its feeder (executor/): a FeedServer and a Feeder over 127.0.0.1, without Spark."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tfonspark.executor import feeder as feeder_module
from tfonspark.executor.feeder import Feeder, FeedTarget
from tfonspark.host import executor_key
from tfonspark.tfprocess.datafeed import DataFeed
from tfonspark.tfprocess.feedserver import PARTITIONS_AHEAD, FeedServer
from tfonspark.wire import messages as m
from tfonspark.wire.framing import connect

SECRET = os.urandom(32)


MB = 1024 * 1024


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


def feeder(server: FeedServer, feed_id: str, feed_timeout: float = 20.0) -> Feeder:
    target = FeedTarget("worker:0", executor_key(), "127.0.0.1", server.port, server.unix_path)
    return Feeder([target], SECRET.hex(), "input", feed_timeout, feed_id=feed_id)
