"""The driver's reaction to node events, without Spark: a stalled feed cancels only its own train()."""

from __future__ import annotations

from types import SimpleNamespace

from tfonspark.config import InputMode, NodeConfig
from tfonspark.driver.cluster import Cluster
from tfonspark.errors import FeedTimeout
from tfonspark.testing import FakeSparkContext
from tfonspark.wire import messages as m


def _cluster() -> tuple[Cluster, FakeSparkContext]:
    sc = FakeSparkContext()
    config = NodeConfig(cluster_id="c" * 32, driver_host="127.0.0.1", driver_port=1, secret_hex="ab" * 32)
    cluster = Cluster(sc, [], None, config, InputMode.SPARK)  # type: ignore[arg-type]
    cluster.feeds.groups = {"tfonspark-feed-1"}
    return cluster, sc


NODE = SimpleNamespace(role=SimpleNamespace(name="worker:1"))


def stalled(feed_id: str, train: bool = True) -> m.NodeEvent:
    return m.NodeEvent(
        1, "feed_stalled", {"partition": 3, "timeout": 4.0, "received": 16, "train": train, "feed_id": feed_id}
    )


def test_a_stalled_feed_of_the_running_train_cancels_it_with_a_clear_error():
    cluster, sc = _cluster()
    cluster.feeds.running = "feed-now"
    cluster._on_event(NODE, stalled("feed-now"))
    assert sc.cancelled == ["tfonspark-feed-1"]
    (error,) = cluster.feeds.errors
    assert isinstance(error, FeedTimeout)
    assert "partition 3" in str(error) and "worker:1" in str(error) and "feed_timeout=4s" in str(error)


def test_a_late_report_about_an_earlier_feed_cancels_nothing():
    cluster, sc = _cluster()
    cluster.feeds.running = "feed-now"
    cluster._on_event(NODE, stalled("feed-before"))
    cluster._on_event(NODE, stalled("feed-now", train=False))  # inference: the job is the user's
    assert sc.cancelled == [] and cluster.feeds.errors == []


def test_other_events_are_only_logged(caplog):
    cluster, sc = _cluster()
    with caplog.at_level("INFO"):
        cluster._on_event(NODE, m.NodeEvent(1, "progress", {"step": 10}))
    assert sc.cancelled == [] and "progress" in caplog.text
