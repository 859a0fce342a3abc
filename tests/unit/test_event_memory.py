"""Driver memory over a long run (issue 21, row 4): 1,000,000 node events through the server.

The events enter a real :class:`RendezvousServer` where a supervisor's do: its connection
handler (``_follow``: decode, check, record), on its own thread; a :class:`Gang`'s watcher
takes them and hands the reports to a :class:`ReportLog`, as in ``tfonspark.run``. Only the
socket and its HMAC are left out, which keep nothing per event, so that a million events take
well under a minute on two shared cores (over a real socket the same run takes ~1 s per 25,000
events there). The driver's resident memory must not grow with the number of events: it stays
within the documented caps (``EVENT_BACKLOG``/``BACKLOG_BYTES`` for events waiting for the
watcher, ``KEEP_REPORTS``/``KEEP_BYTES`` for the report log, ``MARKED_FEEDS`` for epoch marks).
For the figures: ``python -m pytest tests/unit/test_event_memory.py -s``.
"""

from __future__ import annotations

import gc
import hashlib
import os
import threading
import time

import pytest

from tfonspark.config import NodeConfig
from tfonspark.driver.feeds.feeding import Feeds
from tfonspark.driver.nodes import rendezvous, reports
from tfonspark.driver.nodes.gang import Gang
from tfonspark.driver.nodes.launcher import LocalLauncher
from tfonspark.driver.nodes.node_events import NodeEvents
from tfonspark.driver.nodes.rendezvous import RendezvousServer
from tfonspark.driver.nodes.reports import ReportLog
from tfonspark.driver.nodes.roles import plan_roles
from tfonspark.testing import FakeSparkContext
from tfonspark.wire import messages as m

SECRET = hashlib.sha256(b"event-memory-test").digest()
CLUSTER = "event-memory"
EVENTS = 1_000_000
WARM_UP = 30_000  # past the report log's 10,000: the "before" figure is taken at its steady state
MARK_EVERY = 100  # one event in 100 is an epoch mark, of a new feed every 1,000 events
MIB = 1024 * 1024


class _Supervisor:
    """One supervisor's connection as the server reads it: ``recv()`` gives the next frame's payload.

    Sends ``warm_up`` events, waits for ``go``, sends the rest of ``total``, then ``NodeExit``.
    Reports carry ``pad`` more bytes. Like a socket read, it lets other threads run (every 64
    small events, every large one), so the watcher keeps up as it would.
    """

    def __init__(self, total: int, warm_up: int, pad: int = 0) -> None:
        self.total, self.warm_up, self.pad = total, warm_up, b"x" * pad
        self.sent = 0
        self.go = threading.Event()
        self.paused = threading.Event()

    def settimeout(self, timeout: float | None) -> None:
        pass

    def recv(self) -> bytes:
        i = self.sent
        if i == self.total:
            return m.encode(m.NodeExit(0, 0, "", "", False))
        if i == self.warm_up and not self.go.is_set():
            self.paused.set()
            self.go.wait()
        if i % 64 == 0 or self.pad:
            time.sleep(0)
        self.sent += 1
        if i % MARK_EVERY == MARK_EVERY - 1:
            detail = b'{"feed_id":"feed-%d","epoch":%d}' % (i // 1000, i % 1000 // MARK_EVERY)
            return b'J{"type":"epoch_read",%s' % detail[1:]
        detail = b'{"step":%d,"loss":0.25,"accuracy":0.875,"pad":"%s"}' % (i, self.pad)
        return b'J{"type":"reported","metrics":%s}' % detail


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reports_sent(events: int) -> int:
    return events - events // MARK_EVERY


def _run(total: int, warm_up: int, pad: int = 0) -> dict[str, float]:
    """Push ``total`` events through a server and a cluster's watcher; RSS and timings."""
    server = RendezvousServer(CLUSTER, plan_roles(1), SECRET, "127.0.0.1")
    config = NodeConfig(cluster_id=CLUSTER, driver_host="127.0.0.1", driver_port=1, secret_hex=SECRET.hex())
    handed: list[int] = [0]

    def on_report(report: reports.Report) -> None:
        handed[0] += 1

    feeds = Feeds(FakeSparkContext(), SECRET.hex(), None)  # type: ignore[arg-type]  # no feed runs
    on_event = NodeEvents(ReportLog(on_report), feeds)
    gang = Gang(server, config, plan_roles(1), LocalLauncher(), on_event, feeds.cancel)
    node = server.nodes[0]
    node.address = "127.0.0.1:1"  # registered
    supervisor = _Supervisor(total, warm_up, pad)
    follow = threading.Thread(target=server._follow, args=(supervisor, node), daemon=True)

    def handed_out(count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while handed[0] + getattr(server, "dropped", 0) < count:
            assert time.monotonic() < deadline, f"{handed[0]} of {count} reports handed out in {timeout}s"
            time.sleep(0.01)

    try:
        gc.collect()
        start = _rss()
        gang._watcher.start()
        follow.start()
        assert supervisor.paused.wait(60)
        handed_out(_reports_sent(warm_up), 60)
        gc.collect()
        before = _rss()
        started, cpu = time.monotonic(), time.process_time()
        supervisor.go.set()
        follow.join(120)
        assert node.exit is not None, f"{supervisor.sent:,} events sent in 120s"
        handed_out(_reports_sent(total), 60)
        took, cpu = time.monotonic() - started, time.process_time() - cpu
        gc.collect()
        after = _rss()
        marks_started = time.perf_counter()
        marks = gang.marks_read(f"feed-{(total - 1) // 1000}")
        marks_ms = (time.perf_counter() - marks_started) * 1e3
        kept = on_event.reports.all()
    finally:
        supervisor.go.set()
        gang.closed = True
        server.close()
        gang._watcher.join(10)
    print(
        f"\n{total:,} events ({total - warm_up:,} after the warm-up; reports of {pad:,} bytes more) in "
        f"{took:.1f}s ({cpu:.1f}s CPU); driver RSS {start / MIB:.1f} MiB at the start, {before / MIB:.1f} "
        f"after {warm_up:,} events, {after / MIB:.1f} after {total:,}; {len(kept):,} reports kept; reports "
        f"dropped by a lagging watcher: {getattr(server, 'dropped', 0)}; marks_read {marks_ms:.3f} ms"
    )
    assert marks == {"worker:0": (total - 1) % 1000 // MARK_EVERY}  # the last feed's last mark
    assert kept[-1].metrics["step"] == total - 1 - (total % MARK_EVERY == 0)  # the latest, in order
    return {"start": start, "before": before, "after": after, "kept": len(kept)}


@pytest.mark.slow  # ~20 s of CPU; a minute on two busy cores
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_a_million_events_leave_driver_memory_within_the_documented_caps():
    rss = _run(EVENTS, WARM_UP)
    assert rss["after"] - rss["before"] < 8 * MIB, "memory grows with the number of events"
    assert rss["after"] - rss["start"] < reports.KEEP_BYTES, "driver memory beyond the report log's cap"
    assert rss["kept"] == reports.KEEP_REPORTS  # the latest 10,000


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_large_reports_are_kept_within_keep_bytes():
    """Before: 2,000 reports of 64 KiB took 126 MiB (in the server's event list and the report log)."""
    rss = _run(4_000, 1_000, pad=64 * 1024 - 100)
    assert rss["after"] - rss["before"] < 16 * MIB, "memory grows with the number of events"
    assert rss["after"] - rss["start"] < reports.KEEP_BYTES + rendezvous.BACKLOG_BYTES
    assert rss["kept"] < 520  # 32 MiB of 64 KiB reports
