"""``data_worker.watched``: a reader of the tf.data service fails, saying why, when a worker is lost for good."""

from __future__ import annotations

import threading
import time

import pytest

from tfonspark.driver.services.watch import watched
from tfonspark.errors import NodeFailed


def test_elements_pass_through_and_errors_reach_the_reader():
    assert list(watched(range(5), lambda: [], poll_secs=0.05)) == [0, 1, 2, 3, 4]

    def broken():
        yield 1
        raise ValueError("bad element")

    with pytest.raises(ValueError, match="bad element"):
        list(watched(broken(), lambda: [], poll_secs=0.05))


def test_a_hung_reader_fails_once_a_worker_is_lost():
    release = threading.Event()

    def hangs():
        yield 1
        release.wait(10)  # TF's client retrying a dead worker

    lost_at = time.monotonic() + 0.3
    got, began = [], time.monotonic()
    with pytest.raises(NodeFailed, match="worker:1 lost for good") as info:
        for x in watched(hangs(), lambda: ["worker:1"] if time.monotonic() > lost_at else [], poll_secs=0.1):
            got.append(x)
    release.set()
    assert got == [1] and time.monotonic() - began < 2, time.monotonic() - began
    assert "start again" in str(info.value)


def test_the_service_watches_with_its_own_cluster_failures():
    from types import SimpleNamespace

    from tfonspark.config import InputMode
    from tfonspark.driver.cluster import Reserved, Running
    from tfonspark.driver.services.data_service import DataService

    lost: list[str] = []
    plane = SimpleNamespace(failures=lambda: list(lost), config=SimpleNamespace(cluster_id="c" * 32))
    held = Reserved("dispatcher", None, "h:1")  # type: ignore[arg-type]
    running = Running(None, InputMode.TENSORFLOW, SimpleNamespace(gang=plane), None, None, None, held=held)  # type: ignore[arg-type]
    dispatcher = SimpleNamespace(server=None, target="grpc://h:1", worker_addresses=["h:2"])
    svc = DataService(running, dispatcher)  # type: ignore[arg-type]

    def reads():
        yield 1
        lost.append("worker:0")
        time.sleep(5)

    with pytest.raises(NodeFailed, match="worker:0"):
        list(svc.watch(reads(), poll_secs=0.05))
