"""A tf.data worker SIGKILLed mid-epoch (``parallel_epochs``, real Spark): the job goes on.

Its supervisor restarts the ``WorkerServer`` in place at the same address (data workers are
serve-only nodes); the dispatcher hands the job's task to it again and the reader's retries
reach it. Measured here: the gap from the kill to the next element from the restarted worker,
and how many elements the restart repeats (its task starts over). With ``work_dir`` the
dispatcher journals.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time

import psutil
import pytest

import tfonspark
from tfonspark.tfprocess.data_worker import split_address

tf = pytest.importorskip("tensorflow")
M = 1500  # elements per worker (parallel_epochs: each worker produces all of them)
KILL_AFTER = 300


def _listener(address: str) -> psutil.Process:
    port = split_address(address)[1]
    for conn in psutil.net_connections("tcp"):
        if conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            return psutil.Process(conn.pid)
    raise LookupError(f"nothing listens at {address}")


class _Reader(threading.Thread):
    """Reads the job, timing each element, so that a hang fails the test instead of blocking it."""

    def __init__(self, ds) -> None:
        super().__init__(daemon=True)
        self.ds, self.got, self.times, self.error = ds, [], [], None

    def run(self) -> None:
        try:
            for x in self.ds.as_numpy_iterator():
                self.got.append(int(x))
                self.times.append(time.monotonic())
        except Exception as error:  # noqa: BLE001 - reported by the test
            self.error = error


def test_killed_worker_restarts_in_place_and_the_job_goes_on(sc, tmp_path):
    work_dir = str(tmp_path / "dispatcher")
    with tfonspark.data_service(sc, 2, work_dir=work_dir, heartbeat_interval_ms=500, reservation_timeout=120) as svc:
        assert os.path.exists(os.path.join(work_dir, "tf_data_dispatcher_journal")), os.listdir(work_dir)
        ds = tf.data.Dataset.range(M)
        reader = _Reader(svc.distribute(ds, "parallel_epochs", job_name="ft", max_outstanding_requests=2))
        reader.start()
        assert _wait(lambda: len(reader.got) >= KILL_AFTER or not reader.is_alive(), 60)
        victim = _listener(svc.worker_addresses[1])
        # the supervisor keeps a standby TF process ready once the server serves: wait for it
        assert _wait(lambda: len(victim.parent().children()) >= 2, 60), "no standby TF process"
        victim.send_signal(signal.SIGKILL)
        killed, before = time.monotonic(), len(reader.got)
        reader.join(60)
        assert not reader.is_alive(), f"the reader hung: {len(reader.got)} elements, last {_ago(reader)}"
        assert reader.error is None, reader.error
        assert _wait(lambda: bool(svc.cluster.server_restarts), 10), "no ServerRestarted event"
        restart = svc.cluster.server_restarts[0]
    counts = collections.Counter(collections.Counter(reader.got).values())
    third = [t for x, t in zip(reader.got, reader.times) if x == 0][2:3]  # the restarted task's first element
    again = f"{third[0] - killed:.1f}s" if third else "never"
    print(
        f"[measured] killed after {before} elements; restarted worker's elements again after {again}; "
        f"read {len(reader.got)}; times each element was read: {dict(counts)}; {restart}"
    )
    assert set(counts) <= {2, 3}, counts  # nothing lost; what the killed worker had sent is sent again


def _ago(reader) -> str:
    return f"{time.monotonic() - reader.times[-1]:.1f}s ago" if reader.times else "none"


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
