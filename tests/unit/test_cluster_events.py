"""The driver's reaction to node events, without Spark: a stalled feed cancels only its own train()."""

from __future__ import annotations

from types import SimpleNamespace

from tfonspark.driver.feeds.feeding import Feeds
from tfonspark.driver.nodes.node_events import NodeEvents
from tfonspark.driver.nodes.reports import ReportLog
from tfonspark.errors import FeedTimeout
from tfonspark.testing import FakeSparkContext
from tfonspark.wire import events as ev


def _handler() -> tuple[NodeEvents, Feeds, FakeSparkContext]:
    sc = FakeSparkContext()
    feeds = Feeds(sc, "ab" * 32, None)  # type: ignore[arg-type]  # stalls never ask the nodes
    feeds.groups = {"tfonspark-feed-1"}
    return NodeEvents(ReportLog(), feeds), feeds, sc


NODE = SimpleNamespace(role=SimpleNamespace(name="worker:1", job_name="worker", task_index=1))


def stalled(feed_id: str, train: bool = True) -> ev.FeedStalled:
    return ev.FeedStalled(feed_id, 3, received=16, timeout=4.0, train=train)


def test_a_stalled_feed_of_the_running_train_cancels_it_with_a_clear_error():
    handle, feeds, sc = _handler()
    feeds.running = "feed-now"
    handle(NODE, stalled("feed-now"))  # type: ignore[arg-type]
    assert sc.cancelled == ["tfonspark-feed-1"]
    (error,) = feeds.errors
    assert isinstance(error, FeedTimeout)
    assert "partition 3" in str(error) and "worker:1" in str(error) and "feed_timeout=4s" in str(error)


def test_a_late_report_about_an_earlier_feed_cancels_nothing():
    handle, feeds, sc = _handler()
    feeds.running = "feed-now"
    handle(NODE, stalled("feed-before"))  # type: ignore[arg-type]
    handle(NODE, stalled("feed-now", train=False))  # type: ignore[arg-type]  # inference: the job is the user's
    assert sc.cancelled == [] and feeds.errors == []


def test_reports_go_to_the_report_log():
    handle, _, _ = _handler()
    handle(NODE, ev.Reported({"loss": 0.5}))  # type: ignore[arg-type]
    (report,) = handle.reports.all()
    assert report.node == "worker:1" and report.metrics == {"loss": 0.5}


def test_other_events_are_only_logged(caplog):
    handle, feeds, sc = _handler()
    with caplog.at_level("INFO"):
        handle(NODE, ev.FeedRefused("feed-1", 2, "delivered already"))  # type: ignore[arg-type]
    assert sc.cancelled == [] and "delivered already" in caplog.text
