"""``ctx.report({...})`` on real Spark (local-cluster[2,1,1024]): from each node to the driver."""

from __future__ import annotations

import threading

import tfonspark

from .conftest import by_value

by_value(__name__)

STEPS = 3


def _report_steps(args, ctx):
    """Report a few steps, numpy values included, and what a bad report raised here."""
    import numpy as np

    from tfonspark.errors import ConfigError

    for step in range(STEPS):
        ctx.report({"step": step, "loss": 0.5, "rows": np.int64(10 * step)})
    try:
        ctx.report({"model": object()})
    except ConfigError as err:
        ctx.report({"refused": str(err)})


def test_reports_reach_on_report_and_cluster_reports(sc, no_leftovers):
    received = []
    threads = set()

    def on_report(report):
        received.append(report)
        threads.add(threading.current_thread().name)

    cluster = tfonspark.run(sc, _report_steps, None, 2, reservation_timeout=120, on_report=on_report)
    cluster.shutdown(timeout=120)

    assert [r.node for r in cluster.reports] == [r.node for r in received]
    assert len(received) == 2 * (STEPS + 1)
    assert threading.current_thread().name not in threads  # called from the cluster's own thread
    for index in (0, 1):
        mine = [r for r in received if (r.role, r.index) == ("worker", index)]
        assert [r.node for r in mine] == [f"worker:{index}"] * (STEPS + 1)
        assert [dict(r.metrics) for r in mine[:STEPS]] == [
            {"step": step, "loss": 0.5, "rows": 10 * step} for step in range(STEPS)
        ]
        assert "Received: model=object" in mine[-1].metrics["refused"]
        assert all(earlier.time <= later.time for earlier, later in zip(mine, mine[1:]))
