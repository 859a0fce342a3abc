"""driver/nodes/restarts.py: ``max_restarts``: a failed cluster is torn down and started again, without
Spark (LocalLauncher), a fixed ``server_port`` included.

Everything but Spark is real: rendezvous server, supervisors and TF processes (which run
``map_fun`` without importing TensorFlow), so a restart takes seconds here.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
from pathlib import Path

import pytest

import tfonspark
from tfonspark.driver.nodes.restarts import cause_line, exhausted
from tfonspark.errors import ConfigError, NodeFailed
from tfonspark.testing import FakeSparkContext, LocalLauncher, free_ports


def run(map_fun, args, n: int = 2, **kwargs) -> tfonspark.Cluster:
    return tfonspark.run(
        FakeSparkContext(), map_fun, args, n, reservation_timeout=60, launcher=LocalLauncher(), **kwargs
    )


def fail_first_attempt(args: dict, ctx) -> None:
    """Record who ran on which attempt; worker 1 fails (as args["how"] says) on the first ones."""
    marker = Path(args["dir"]) / f"{ctx.task_index}-{ctx.attempt}-{os.environ['TFONSPARK_ATTEMPT']}"
    marker.touch()
    if ctx.task_index == 1 and ctx.attempt < args["failing_attempts"]:
        if args["how"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"boom on attempt {ctx.attempt}")
    if ctx.task_index == 0:
        time.sleep(args.get("sleep", 0))  # worker 0 is still running when worker 1 fails


def test_a_failed_node_restarts_the_cluster_with_the_next_attempt(tmp_path):
    args = {"dir": str(tmp_path), "failing_attempts": 1, "how": "raise", "sleep": 3}
    cluster = run(fail_first_attempt, args, max_restarts=2)
    cluster.shutdown(timeout=60)
    assert cluster.restarts == 1 and cluster.attempt == 1
    # every node ran again, with ctx.attempt and TFONSPARK_ATTEMPT saying which attempt it is
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0-0-0", "0-1-1", "1-0-0", "1-1-1"]
    record = cluster.restart_log[0]
    assert record.attempt == 1
    assert (record.cause.role, record.cause.index) == ("worker", 1)
    assert "boom on attempt 0" in record.cause.traceback
    assert record.failed_at > 0 and 0 < record.total_s < 60
    assert record.total_s >= record.reserve_s + record.startup_s
    assert cluster.failure is None


def test_a_killed_tf_process_is_restarted_and_named_in_the_log(tmp_path, caplog):
    args = {"dir": str(tmp_path), "failing_attempts": 1, "how": "kill", "sleep": 3}
    with caplog.at_level("WARNING", logger="tfonspark.driver.nodes.restarts"):
        cluster = run(fail_first_attempt, args, max_restarts=1)
        cluster.shutdown(timeout=60)
    assert cluster.restarts == 1
    assert "killed by signal 9 (SIGKILL)" in str(cluster.restart_log[0].cause)
    logged = [r.getMessage() for r in caplog.records if "restarting the TensorFlow cluster" in r.getMessage()]
    assert len(logged) == 1 and "attempt 1 of 2" in logged[0] and "worker:1" in logged[0], logged


def test_exhausted_restarts_name_every_attempt_soon_after_the_last_failure(tmp_path):
    args = {"dir": str(tmp_path), "failing_attempts": 99, "how": "raise", "sleep": 1}
    with pytest.raises(NodeFailed) as info:
        run(fail_first_attempt, args, max_restarts=2).shutdown(timeout=60)
    raised = time.time()
    err = info.value
    assert len(err.attempts) == 3, err.attempts
    for i, line in enumerate(err.attempts):
        assert line.startswith(f"attempt {i}: TensorFlow node worker:1") and f"boom on attempt {i}" in line
    assert "every attempt failed (the cluster was restarted 2 time(s), max_restarts=2)" in str(err)
    assert (err.role, err.index) == ("worker", 1) and "boom on attempt 2" in err.traceback
    last_failure = max(p.stat().st_mtime for p in tmp_path.iterdir())
    assert raised - last_failure < 10
    assert pickle.loads(pickle.dumps(err)).attempts == err.attempts


def test_without_max_restarts_a_failure_ends_the_job_as_before(tmp_path):
    args = {"dir": str(tmp_path), "failing_attempts": 1, "how": "raise"}
    with pytest.raises(NodeFailed) as info:
        run(fail_first_attempt, args).shutdown(timeout=60)
    assert info.value.attempts == []
    assert not any(p.name.endswith("-1-1") for p in tmp_path.iterdir())


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2", None])
def test_max_restarts_must_be_a_whole_number(bad, tmp_path):
    with pytest.raises(ConfigError, match=r"max_restarts must be a whole number >= 0.*Received: "):
        run(fail_first_attempt, {"dir": str(tmp_path)}, max_restarts=bad)
    assert list(tmp_path.iterdir()) == []  # refused before any node started


def test_the_final_error_keeps_one_line_per_attempt():
    causes = [
        NodeFailed("TensorFlow node worker:1 (executor 1) was killed by signal 9 (SIGKILL)", role="worker", index=1),
        NodeFailed(
            "TensorFlow node chief:0 (executor 0) failed with exit code 1",
            role="chief",
            index=0,
            traceback="Traceback...\nValueError: bad shape",
        ),
    ]
    err = exhausted(causes, 1)
    assert err.attempts == [
        "attempt 0: TensorFlow node worker:1 (executor 1) was killed by signal 9 (SIGKILL)",
        "attempt 1: TensorFlow node chief:0 (executor 0) failed with exit code 1: ValueError: bad shape",
    ]
    assert (err.role, err.index) == ("chief", 0)
    assert exhausted(causes[:1], 0) is causes[0]
    assert cause_line(causes[1]).endswith("ValueError: bad shape")


def test_the_estimator_takes_max_restarts_as_a_param():
    from tfonspark.ml import TFEstimator

    estimator = TFEstimator(fail_first_attempt)
    assert estimator.getMaxRestarts() == 0
    assert estimator.setMaxRestarts(3).getMaxRestarts() == 3
    assert estimator.merge_args_params().max_restarts == 3
    with pytest.raises(ConfigError, match="max_restarts"):
        estimator.setMaxRestarts(-1)
    assert tfonspark.Restart is not None and "Restart" in tfonspark.__all__


def sleep_long(args: dict, ctx) -> None:
    time.sleep(120)


def test_a_node_goes_when_its_executor_goes(monkeypatch, tmp_path):
    """The supervisor watches its executor's JVM (here a stand-in process) and fails the node with it."""
    import subprocess

    from tfonspark.executor import node

    jvm = subprocess.Popen(["sleep", "600"])
    monkeypatch.setattr(node, "executor_pid", lambda: jvm.pid)
    try:
        cluster = run(sleep_long, {}, n=1)
        jvm.kill()
        jvm.wait()
        killed = time.time()
        with pytest.raises(NodeFailed) as info:
            cluster.shutdown(timeout=60)
    finally:
        jvm.kill()
    assert time.time() - killed < 10
    assert f"Spark executor (JVM pid {jvm.pid}) exited" in str(info.value)


# ---- from test_restart_fixed_port.py ----------------------------------------------------------------
# A restart (``max_restarts``) with a fixed ``server_port`` binds that port again (issue 21, row 3).
#
# Before SO_REUSEADDR on the rendezvous server's socket the restart ended in ``ConfigError``
# "Address already in use": the last attempt's connections on the port were in TIME-WAIT.


def test_a_restart_binds_the_fixed_server_port_again(tmp_path):
    (port,) = free_ports()
    args = {"dir": str(tmp_path), "failing_attempts": 1, "how": "raise", "sleep": 3}
    cluster = run(fail_first_attempt, args, max_restarts=1, server_port=port)
    cluster.shutdown(timeout=60)
    assert cluster.restarts == 1 and cluster.failure is None
    assert cluster.server.address[1] == port  # the second attempt's server, on the same port
