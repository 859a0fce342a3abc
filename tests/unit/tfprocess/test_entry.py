"""tfprocess/entry.py: the TF process's entry sends ctx.report's reports to its supervisor as node events."""

from __future__ import annotations

import json

import numpy as np

from tfonspark.tfprocess.context import NodeContext

SPEC = {"ps": ["h:0"], "chief": ["h:1"], "evaluator": ["h:2"], "worker": ["h:3", "h:4", "h:5"]}


def make_ctx(job_name: str = "worker", task_index: int = 0, cluster_spec=None, **kwargs) -> NodeContext:
    return NodeContext(
        executor_id=kwargs.pop("executor_id", 4),
        job_name=job_name,
        task_index=task_index,
        cluster_spec=SPEC if cluster_spec is None else cluster_spec,
        default_fs=kwargs.pop("default_fs", "hdfs://nn:8020"),
        working_dir=kwargs.pop("working_dir", "/home/me"),
        **kwargs,
    )


def test_the_tf_process_sends_reports_as_node_events_to_its_supervisor():
    """entry.py's reporter writes the status line that the supervisor relays as a Reported event."""
    import io

    from tfonspark.tfprocess import entry

    status = io.StringIO()
    reporter = entry._reporter(status)
    make_ctx(reporter=reporter).report({"step": np.int64(1), "loss": 0.5})
    assert reporter.flush(5)
    line = status.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line[1:]) == {"type": "reported", "metrics": {"step": 1, "loss": 0.5}}
