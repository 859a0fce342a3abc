"""Nothing is lost at shutdown: a report a node sends while it is being stopped reaches the driver.

The driver keeps collecting node events until its rendezvous server closes, which teardown does
only once every node has exited (or its bounded wait ran out). Spark is swapped for
``tfonspark.testing.LocalLauncher``; the rest is real.
"""

from __future__ import annotations

import signal
import time

import tfonspark
from tfonspark.testing import FakeSparkContext, LocalLauncher


def report_when_stopped(args: dict, ctx) -> None:
    """ps:0 serves until SIGTERM, then reports once more (a little later) and returns; ps:1 dies
    of SIGTERM at once, so the driver hears of an exit before that report."""
    if ctx.job_name != "ps":
        return
    if ctx.task_index != 0:
        time.sleep(120)
        return
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    ctx.report({"ready": True})  # the test stops the cluster only now: a SIGTERM before would kill it
    deadline = time.monotonic() + 120
    while not stopping and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # the driver is well into its teardown by now
    ctx.report({"last": True, "signal": stopping[0] if stopping else 0})


def _last_reports(cluster: tfonspark.Cluster) -> list[dict]:
    return [r.metrics for r in cluster.reports if r.node == "ps:0" and "last" in r.metrics]


def _wait_until_ps0_ready(cluster: tfonspark.Cluster) -> None:
    """ps:0's SIGTERM handler is installed (its TF process may take seconds to get there under load)."""
    deadline = time.monotonic() + 60
    while not any(r.node == "ps:0" and r.metrics.get("ready") for r in cluster.reports):
        assert time.monotonic() < deadline, "ps:0 never reported that it was ready"
        time.sleep(0.02)


def test_a_report_sent_while_shutdown_stops_the_node_reaches_cluster_reports():
    cluster = tfonspark.run(
        FakeSparkContext(), report_when_stopped, {}, 3, num_ps=2, reservation_timeout=60, launcher=LocalLauncher()
    )
    _wait_until_ps0_ready(cluster)
    cluster.shutdown(grace_secs=10, timeout=60)
    assert _last_reports(cluster) == [{"last": True, "signal": int(signal.SIGTERM)}]


def test_a_report_sent_while_stop_stops_the_node_reaches_cluster_reports():
    seen: list[dict] = []
    cluster = tfonspark.run(
        FakeSparkContext(),
        report_when_stopped,
        {},
        3,
        num_ps=2,
        reservation_timeout=60,
        launcher=LocalLauncher(),
        on_report=lambda r: seen.append(r.metrics),
    )
    _wait_until_ps0_ready(cluster)
    cluster.stop(grace_secs=10)
    assert _last_reports(cluster) == [{"last": True, "signal": int(signal.SIGTERM)}]
    assert [m for m in seen if "last" in m] == [{"last": True, "signal": int(signal.SIGTERM)}]
