"""driver/nodes/node_events.py: the driver's reaction to node events: the feed's long waits are
WARNINGs naming the node (issue 43, row 0), a stalled feed cancels only its own train(), server
restarts are logged."""

from __future__ import annotations

import logging
import types
from types import SimpleNamespace

from tfonspark.driver.feeds.feeding import Feeds
from tfonspark.driver.nodes.node_events import NodeEvents, ServerRestart, how_it_died
from tfonspark.driver.nodes.reports import ReportLog
from tfonspark.errors import FeedTimeout
from tfonspark.testing import FakeSparkContext
from tfonspark.wire import events as ev

NODE = SimpleNamespace(role=SimpleNamespace(name="worker:1", job_name="worker", task_index=1))


def _handler() -> tuple[NodeEvents, Feeds]:
    feeds = Feeds(FakeSparkContext(), "ab" * 32, None)  # type: ignore[arg-type]
    return NodeEvents(ReportLog(), feeds), feeds


def test_a_held_partition_waiting_30s_is_a_warning_naming_node_partition_and_setting(caplog):
    handle, _ = _handler()
    event = ev.FeedWaiting(
        "map_fun to read the partitions queued before partition 7", 31.0, "feed_timeout=600s", "d:2", 7
    )
    with caplog.at_level(logging.INFO):
        handle(NODE, event)  # type: ignore[arg-type]
    (record,) = [r for r in caplog.records if "waited" in r.getMessage()]
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert "worker:1" in text and "31s" in text and "partition 7 of feed d:2" in text and "feed_timeout=600s" in text


def test_a_reader_waiting_for_data_is_a_warning_only_while_train_runs(caplog):
    handle, feeds = _handler()
    event = ev.FeedWaiting("data of queue 'input': nothing is queued for map_fun", 30.5, "none: ...")
    with caplog.at_level(logging.INFO):
        handle(NODE, event)  # type: ignore[arg-type]  # between train() calls: the user's own pause
        feeds.running = "d:3"
        handle(NODE, event)  # type: ignore[arg-type]
    levels = [r.levelno for r in caplog.records if "waited" in r.getMessage()]
    assert levels == [logging.INFO, logging.WARNING]


def test_holds_and_starving_nodes_reach_the_running_feeds_watch():
    handle, feeds = _handler()
    calls: list[str] = []
    feeds.watch = SimpleNamespace(
        held=lambda feed_id: calls.append(f"held {feed_id}"), starved=lambda: calls.append("starved")
    )  # type: ignore[assignment]
    handle(NODE, ev.FeedHeld("d:3", 4))  # type: ignore[arg-type]
    handle(NODE, ev.FeedStarved("input", 2.0))  # type: ignore[arg-type]
    assert calls == ["held d:3", "starved"]
    feeds.watch = None
    handle(NODE, ev.FeedStarved("input", 2.0))  # type: ignore[arg-type]  # no train() running: nothing to do


def test_the_driver_logs_a_restart_and_records_it(caplog):
    event = ev.ServerRestarted(restart=2, limit=3, exit_code=-9, down_s=7.25)
    node = types.SimpleNamespace(role=types.SimpleNamespace(name="worker:1", job_name="worker", task_index=1))
    with caplog.at_level(logging.WARNING, logger="tfonspark.driver.nodes.node_events"):
        NodeEvents(reports=None, feeds=None)(node, event)  # type: ignore[arg-type]
    assert "worker:1" in caplog.text and "SIGKILL" in caplog.text and "2 of at most 3" in caplog.text
    record = ServerRestart.of("worker:1", event)
    assert (record.node, record.restart, record.down_s, record.accepting) == ("worker:1", 2, 7.25, True)
    assert how_it_died(-9) == "killed by signal 9 (SIGKILL)" and how_it_died(1) == "exited with code 1"


# ---- from test_cluster_events.py --------------------------------------------------------------------
# The driver's reaction to node events, without Spark: a stalled feed cancels only its own train().


def _handler_and_context() -> tuple[NodeEvents, Feeds, FakeSparkContext]:
    sc = FakeSparkContext()
    feeds = Feeds(sc, "ab" * 32, None)  # type: ignore[arg-type]  # stalls never ask the nodes
    feeds.groups = {"tfonspark-feed-1"}
    return NodeEvents(ReportLog(), feeds), feeds, sc


def stalled(feed_id: str, train: bool = True) -> ev.FeedStalled:
    return ev.FeedStalled(feed_id, 3, received=16, timeout=4.0, train=train)


def test_a_stalled_feed_of_the_running_train_cancels_it_with_a_clear_error():
    handle, feeds, sc = _handler_and_context()
    feeds.running = "feed-now"
    handle(NODE, stalled("feed-now"))  # type: ignore[arg-type]
    assert sc.cancelled == ["tfonspark-feed-1"]
    (error,) = feeds.errors
    assert isinstance(error, FeedTimeout)
    assert "partition 3" in str(error) and "worker:1" in str(error) and "feed_timeout=4s" in str(error)


def test_a_late_report_about_an_earlier_feed_cancels_nothing():
    handle, feeds, sc = _handler_and_context()
    feeds.running = "feed-now"
    handle(NODE, stalled("feed-before"))  # type: ignore[arg-type]
    handle(NODE, stalled("feed-now", train=False))  # type: ignore[arg-type]  # inference: the job is the user's
    assert sc.cancelled == [] and feeds.errors == []


def test_reports_go_to_the_report_log():
    handle, _, _ = _handler_and_context()
    handle(NODE, ev.Reported({"loss": 0.5}))  # type: ignore[arg-type]
    (report,) = handle.reports.all()
    assert report.node == "worker:1" and report.metrics == {"loss": 0.5}


def test_other_events_are_only_logged(caplog):
    handle, feeds, sc = _handler_and_context()
    with caplog.at_level("INFO"):
        handle(NODE, ev.FeedRefused("feed-1", 2, "delivered already"))  # type: ignore[arg-type]
    assert sc.cancelled == [] and "delivered already" in caplog.text
