"""Node events on the driver (issue 21, rows 4 and 5): refused when oversize or malformed without
losing the node, handed to the watcher once and then forgotten, epoch marks kept compactly, and
the report log bounded in count and bytes."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import pytest

from tests.waiting import wait_until
from tfonspark.driver.nodes import rendezvous
from tfonspark.driver.nodes.rendezvous import RendezvousServer
from tfonspark.driver.nodes.reports import KEEP_BYTES, KEEP_REPORTS, ReportLog
from tfonspark.driver.nodes.roles import plan_roles
from tfonspark.executor.relay import MAX_EVENT_BYTES
from tfonspark.wire import events as ev
from tfonspark.wire import framing as f
from tfonspark.wire import messages as m

SECRET = hashlib.sha256(b"rendezvous-events-test").digest()
CLUSTER = "events-under-test"


@pytest.fixture
def server():
    made = RendezvousServer(CLUSTER, plan_roles(2), SECRET, "127.0.0.1")
    yield made
    made.close()


@pytest.fixture
def nodes(server):
    """Both nodes registered, the cluster formed: (connection of worker:0, of worker:1)."""
    conns = []
    for executor_id in (0, 1):
        conn = f.connect(server.address, SECRET, timeout=10)
        conn.settimeout(10)
        m.send_message(conn, m.Register(executor_id, "127.0.0.1", 20000 + executor_id, "k", os.getpid(), CLUSTER))
        conns.append(conn)
    for conn in conns:
        assert isinstance(m.recv_message(conn, m.ClusterReady), m.ClusterReady)
    yield conns
    for conn in conns:
        conn.close()


def _taken(server: RendezvousServer, conn: f.Connection) -> list[ev.NodeEvent]:
    """Every event the server hands out until what was sent on ``conn`` so far has been recorded."""
    marker = ev.Reported({"sync": time.perf_counter_ns()})
    m.send_message(conn, marker)
    seen: list[ev.NodeEvent] = []

    def synced() -> bool:
        seen.extend(event for _, event in server.take_events())
        return marker in seen

    assert wait_until(synced)
    return [e for e in seen if e != marker]


# ---- row 5: an oversize event or field is refused, and the node stays --------------------------------


def test_an_event_over_max_event_bytes_is_refused_and_the_node_stays(server, nodes, caplog):
    """Before: the driver kept a 1 MiB event (and a 5 MiB one broke the connection: node lost)."""
    conn = nodes[0]
    big = ev.Reported({"blob": "x" * (1024 * 1024)})
    with caplog.at_level(logging.ERROR, logger="tfonspark.driver.nodes.rendezvous"):
        m.send_message(conn, big)
        m.send_message(conn, ev.Reported({"loss": 0.5}))
        got = _taken(server, conn)
    assert got == [ev.Reported({"loss": 0.5})]
    assert not server.failures() and not server.nodes[0].finished
    assert server.refused == 1
    message = caplog.records[0].getMessage()
    assert "'reported' event from node worker:0" in message
    assert f"{len(m.encode(big))} bytes" in message
    assert f"at most {MAX_EVENT_BYTES}" in message and "MAX_EVENT_BYTES" in message


def test_a_largest_report_is_accepted(server, nodes):
    filler = 64 * 1024 - len(json.dumps({"x": ""}, separators=(",", ":")))
    event = ev.Reported({"x": "a" * filler})
    m.send_message(nodes[0], event)
    assert _taken(server, nodes[0]) == [event]


@pytest.mark.parametrize(
    ("kind", "fields", "said"),
    [
        ("epoch_read", {"feed_id": "f" * 60_000, "epoch": 0}, "feed_id is a str of 60000 characters"),
        ("feed_stalled", {"feed_id": "f" * 300, "partition": 1}, "feed_id is a str of 300 characters"),
        ("epoch_read", {"feed_id": ["not", "a", "str"], "epoch": 0}, "field feed_id must be str. Received: list"),
        ("epoch_read", {"epoch": 0}, "missing 1 required positional argument: 'feed_id'"),
        ("epoch_read", {"feed_id": "f1", "epoch": "3"}, "field epoch must be int. Received: str"),
        ("epoch_read", {"feed_id": "f1", "epoch": True}, "field epoch must be int. Received: bool"),
        ("epoch_read", {"feed_id": "f1", "epoch": -1}, "epoch is -1, and must be an int from 0 to 2**31 - 1"),
        ("feed_stalled", {"feed_id": "f1", "partition": 1, "timeout": "soon"}, "field timeout must be float"),
        ("feed_stalled", {"feed_id": "f1", "partition": 1, "received": 1.5}, "field received must be int"),
    ],
)
def test_a_bad_field_is_refused_with_what_was_received_and_what_is_valid(server, nodes, caplog, kind, fields, said):
    with caplog.at_level(logging.ERROR, logger="tfonspark.driver.nodes.rendezvous"):
        nodes[0].send(b"J" + json.dumps({"type": kind, **fields}).encode())
        assert _taken(server, nodes[0]) == []
    message = caplog.records[0].getMessage()
    assert said in message and f"'{kind}' event from node worker:0" in message
    if "characters" in said:
        assert "must be at most 256 (MAX_FEED_ID)" in message
    assert server.refused == 1 and not server.failures()
    assert server.epochs_read("f1") == {}


def test_a_malformed_message_that_is_no_event_still_loses_the_node(server, nodes):
    nodes[0].send(b'J{"type": "node_up", "executor_id": "zero"}')
    assert wait_until(lambda: server.nodes[0].lost)


def test_refusals_are_logged_at_a_bounded_rate(server, nodes, caplog):
    with caplog.at_level(logging.ERROR, logger="tfonspark.driver.nodes.rendezvous"):
        for _ in range(50):
            nodes[0].send(b'J{"type": "epoch_read", "feed_id": 7, "epoch": 0}')
        _taken(server, nodes[0])
    assert server.refused == 50
    assert len(caplog.records) == 10


# ---- row 4: events are handed out once and forgotten; what the cluster needs is kept compactly --------


def test_events_are_handed_out_once_in_order_and_then_forgotten(server, nodes):
    first = ev.FeedStalled("f1", 3, timeout=2.5)
    second = ev.Reported({"loss": 1.0})
    third = ev.Reported({"loss": 0.5})
    m.send_message(nodes[0], first)
    assert wait_until(lambda: server.event_count == 1)
    m.send_message(nodes[1], second)
    assert wait_until(lambda: server.event_count == 2)
    m.send_message(nodes[0], third)
    assert wait_until(lambda: server.event_count == 3)
    taken = server.next_events(lambda: False)
    assert taken == [(server.nodes[0], first), (server.nodes[1], second), (server.nodes[0], third)]
    assert server.take_events() == [] and server.next_events(lambda: True) == []
    assert server.event_count == 3
    assert not hasattr(server, "events")  # no list that grows with every event


def test_epoch_marks_are_kept_per_feed_and_node(server, nodes):
    for conn, epoch in [(nodes[0], 0), (nodes[0], 2), (nodes[0], 1), (nodes[1], 0)]:
        m.send_message(conn, ev.EpochRead("feed-a", epoch))
    m.send_message(nodes[1], ev.EpochRead("feed-b", 5))
    _taken(server, nodes[0])
    assert wait_until(lambda: server.event_count == 6)
    assert server.epochs_read("feed-a") == {"worker:0": 2, "worker:1": 0}  # the last epoch read through
    assert server.epochs_read("feed-b") == {"worker:1": 5}
    assert server.epochs_read("feed-c") == {}
    marks = server.epochs_read("feed-a")
    marks["worker:0"] = 99  # a copy
    assert server.epochs_read("feed-a")["worker:0"] == 2


def test_only_the_last_marked_feeds_are_remembered(server, nodes):
    count = rendezvous.MARKED_FEEDS + 10
    for i in range(count):
        m.send_message(nodes[0], ev.EpochRead(f"feed-{i}", 0))
    m.send_message(nodes[0], ev.EpochRead("feed-5", 1))  # used again
    _taken(server, nodes[0])
    assert server.epochs_read(f"feed-{count - 1}") == {"worker:0": 0}
    assert server.epochs_read("feed-5") == {"worker:0": 1}  # kept: recently used
    assert server.epochs_read("feed-6") == {}  # forgotten: 64 feeds were marked after it
    assert len(server._marks) == rendezvous.MARKED_FEEDS


def test_a_terminated_feed_is_noted_on_the_node_as_it_is_recorded(server, nodes):
    m.send_message(nodes[1], ev.FeedTerminated())
    assert wait_until(lambda: server.nodes[1].feed_ended)
    assert not server.nodes[0].feed_ended


def test_a_watcher_that_falls_behind_loses_the_oldest_reports_not_the_notices(server, nodes, monkeypatch, caplog):
    monkeypatch.setattr(rendezvous, "EVENT_BACKLOG", 50)
    stall = ev.FeedStalled("f", 1, timeout=1.0)
    with caplog.at_level(logging.WARNING, logger="tfonspark.driver.nodes.rendezvous"):
        m.send_message(nodes[0], stall)
        for step in range(120):
            m.send_message(nodes[0], ev.Reported({"step": step}))
        assert wait_until(lambda: server.event_count == 121)
    events = [e for _, e in server.take_events()]
    assert len(events) == 50 and events[0] == stall
    assert [e.metrics["step"] for e in events[1:] if isinstance(e, ev.Reported)] == list(range(71, 120))
    assert server.dropped == 71
    assert "fell behind by over 50 events" in caplog.text and "dropped the oldest waiting event" in caplog.text


def test_the_backlog_is_bounded_in_bytes(server, nodes, monkeypatch):
    monkeypatch.setattr(rendezvous, "BACKLOG_BYTES", 10 * 1024)
    for step in range(20):
        m.send_message(nodes[0], ev.Reported({"step": step, "pad": "p" * 1000}))
    assert wait_until(lambda: server.event_count == 20)
    steps = [e.metrics["step"] for _, e in server.take_events() if isinstance(e, ev.Reported)]
    assert 5 <= len(steps) <= 10 and steps == list(range(20 - len(steps), 20))


# ---- the report log: the latest reports, bounded in count and bytes ---------------------------------


def test_the_report_log_keeps_the_latest_reports_within_count_and_bytes():
    log = ReportLog(lambda report: None, keep=5, keep_bytes=1000)
    for step in range(8):
        log.add("worker", 0, {"step": step})
    assert [r.metrics["step"] for r in log.all()] == [3, 4, 5, 6, 7]
    for step in range(8, 12):
        log.add("worker", 1, {"step": step, "pad": "p" * 300})  # ~320 bytes each: three fit in 1000
    assert [r.metrics["step"] for r in log.all()] == [9, 10, 11]
    log.add("worker", 0, {"pad": "p" * 5000})  # larger than the budget alone: the newest is still kept
    assert len(log.all()) == 1
    assert KEEP_REPORTS == 10_000 and KEEP_BYTES == 32 * 1024 * 1024
