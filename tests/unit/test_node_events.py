"""driver/node_events.py: the feed's long waits are WARNINGs naming the node (issue 43, row 0)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from tfonspark.driver.feeds.feeding import Feeds
from tfonspark.driver.nodes.node_events import NodeEvents
from tfonspark.driver.nodes.reports import ReportLog
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
