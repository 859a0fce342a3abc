"""Chaos tests on real Spark (issue 13): a node dies mid-training, the cluster re-forms and resumes.

Two workers train a small MNIST CNN (restart_worker.py) for 4 epochs of 32 steps with a step
checkpoint every :data:`EVERY` steps. Worker 1 stops after :data:`HOLD_AT` steps (the middle of
epoch 2) and says so with ``ctx.report``; the test process then SIGKILLs its TF process (or its
executor JVM) from outside with psutil. With ``max_restarts=1`` the run must finish with one
restart, lose at most :data:`EVERY` steps, reach the accuracy of an undisturbed run with the same
seed (within :data:`TOLERANCE` points), and leave no process, port or Spark job behind.
"""

from __future__ import annotations

import os
import time

import psutil
import pytest

import tfonspark
from tfonspark.errors import NodeFailed

from . import restart_worker as rw
from .conftest import by_value, listening_ports, wait_until

by_value(rw.__name__)

TRAIN_ROWS, TEST_ROWS = 2048, 2000
BATCH = 64
STEPS = TRAIN_ROWS // BATCH  # per epoch
EVERY = 8  # checkpoint_every_steps
HOLD_AT = STEPS + 13  # worker 1 is killed after 13 steps of epoch 2 (of 4)
TOLERANCE = 0.3  # accuracy points
LOCAL_CLUSTER = "local-cluster[2,1,1024]"


# session scope: this module's tests run on two masters (local-cluster, then standalone with the
# other standalone tests), and a module-scoped fixture would be set up again for the second part,
# re-training the undisturbed run and restarting local-cluster between the two standalone tests
@pytest.fixture(scope="session")
def data(tmp_path_factory, mnist_dir) -> str:
    path = tmp_path_factory.mktemp("mnist") / "subset.npz"
    return rw.write_data(str(path), str(mnist_dir), TRAIN_ROWS, TEST_ROWS)


@pytest.fixture(scope="session")
def baseline(spark_manager, data, tmp_path_factory) -> float:
    """The undisturbed run's test accuracy (TENSORFLOW mode, same seed), once per session."""
    sc = spark_manager.get(LOCAL_CLUSTER)
    chaos = rw.Chaos(target="")
    job = rw.Job(data, str(tmp_path_factory.mktemp("baseline") / "model"), checkpoint_every=EVERY)
    cluster = tfonspark.run(sc, rw.main, job, 2, on_report=chaos, reservation_timeout=120)
    cluster.shutdown(timeout=240)
    return chaos.accuracy()


def _run_killed(sc, job: rw.Job, chaos: rw.Chaos, **kwargs):
    """Start the two-worker cluster with max_restarts=1 and return it (the nodes are running)."""
    return tfonspark.run(sc, rw.main, job, 2, on_report=chaos, max_restarts=1, reservation_timeout=120, **kwargs)


def _check_recovered(cluster, chaos: rw.Chaos, baseline: float, how: str = "SIGKILL") -> None:
    """One restart, at most EVERY steps lost, the undisturbed accuracy, nothing left running."""
    assert not chaos.kill_error, f"the test could not kill the held node: {chaos.kill_error}"
    assert chaos.killed_at is not None, f"no node asked to be killed; reports: {[r.metrics for r in chaos.reports]}"
    assert cluster.restarts == 1, f"expected one restart, got {cluster.restarts}: {cluster.restart_log}"
    (restart,) = cluster.restart_log
    assert restart.attempt == 1 and restart.failed_at >= chaos.killed_at, restart
    # the killed node is named first (its peer's collective fails right after it: listed too)
    assert (restart.cause.role, restart.cause.index) == ("worker", 1), restart.cause
    assert how in str(restart.cause).splitlines()[0] + restart.cause.traceback, restart.cause
    held = chaos.of("hold", 0)[0].metrics["step"]
    restored = {r.metrics["iterations"] for r in chaos.of("begin", 1)}
    assert len(restored) == 1, f"the workers restored different steps: {restored}"
    lost = held - restored.pop()
    limit = EVERY if rw.step_checkpoints() else STEPS
    assert 0 <= lost <= limit, f"{lost} steps lost (killed after {held}); at most {limit} expected"
    finished = {r.metrics["iterations"] for r in chaos.of("done", 1)}
    assert finished == {4 * STEPS}, f"attempt 1 ended after {finished} steps, expected {4 * STEPS}"
    accuracy = chaos.accuracy()
    assert abs(accuracy - baseline) <= TOLERANCE, f"accuracy {accuracy:.2f}% vs undisturbed {baseline:.2f}%"
    _check_nothing_left(chaos)
    resumed = min(r.metrics["t"] for r in chaos.of("step", 1)) - chaos.killed_at
    print(  # shown with pytest -rP: the figures of the chaos-test table
        f"resumed {resumed:.1f}s after the kill (restart {restart.total_s:.1f}s: teardown "
        f"{restart.teardown_s:.1f}s, reservation {restart.reserve_s:.1f}s, start-up {restart.startup_s:.1f}s); "
        f"steps lost {lost}; accuracy {accuracy:.2f}% vs undisturbed {baseline:.2f}%"
    )


def _check_nothing_left(chaos: rw.Chaos) -> None:
    """Every TF process of every attempt has exited, released its TF port and lost its TMPDIR."""
    assert wait_until(lambda: not [p for p in chaos.pids if psutil.pid_exists(p)], 20), (
        f"TF processes still running: {[p for p in chaos.pids if psutil.pid_exists(p)]}"
    )
    ports = {int(r.metrics["port"]) for r in chaos.of("start")} - {0}
    assert wait_until(lambda: not ports & listening_ports(), 20), (
        f"TF ports still listening: {ports & listening_ports()}"
    )
    scratch = {r.metrics["tmpdir"] for r in chaos.of("start")} - {""}
    assert wait_until(lambda: not [d for d in scratch if os.path.exists(d)], 20), (
        f"node scratch dirs left behind: {[d for d in scratch if os.path.exists(d)]}"
    )


@pytest.mark.slow
def test_tf_process_killed_in_epoch_2_resumes_from_step_checkpoint(sc, data, baseline, tmp_path, no_leftovers):
    chaos = rw.Chaos(target="tf")
    job = rw.Job(data, str(tmp_path / "model"), checkpoint_every=EVERY, hold_at=HOLD_AT)
    cluster = _run_killed(sc, job, chaos)
    cluster.shutdown(timeout=240)
    _check_recovered(cluster, chaos, baseline)
    assert all(r.metrics["attempt"] == 1 for r in chaos.of("done"))
    # attempt 1 took over each executor's warm spare (TensorFlow imported): new processes all the same
    starts = chaos.of("start", 1)
    assert len(starts) == 2 and all(r.metrics["spare"] for r in starts), [r.metrics for r in starts]
    assert not {r.metrics["pid"] for r in starts} & {r.metrics["pid"] for r in chaos.of("start", 0)}


def _feed_rows(sc, data: str, partitions: int):
    """The training rows as an RDD of (image, label): partition p holds rows p, p+n, ... in order."""

    def rows(index, _):
        import numpy as np

        arrays = np.load(data)
        x, y = arrays["x_train"][index::partitions], arrays["y_train"][index::partitions]
        for i in range(len(y)):
            yield x[i], int(y[i])

    return sc.parallelize(range(partitions), partitions).mapPartitionsWithIndex(rows)


@pytest.mark.slow
def test_spark_mode_feed_resumes_at_the_interrupted_epoch(sc, data, baseline, tmp_path, no_leftovers):
    chaos = rw.Chaos(target="tf")
    job = rw.Job(data, str(tmp_path / "model"), checkpoint_every=EVERY, hold_at=HOLD_AT, feed=True)
    cluster = _run_killed(sc, job, chaos, input_mode=tfonspark.InputMode.SPARK, feed_buffer_bytes=1 << 20)
    fed = cluster.train(_feed_rows(sc, data, 2), num_epochs=4, feed_timeout=120)
    cluster.shutdown(timeout=240)
    _check_recovered(cluster, chaos, baseline)

    # rows each attempt read (both nodes): attempt 1 is fed whole epochs from the interrupted one
    # on, never the completed ones (each node reports its count every 256 rows)
    def read(attempt: int) -> int:
        latest: dict[str, int] = {}
        for r in chaos.of("rows", attempt):
            latest[r.node] = max(latest.get(r.node, 0), r.metrics["rows"])
        return sum(latest.values())

    second = sum(r.metrics["rows"] + r.metrics["drained"] for r in chaos.of("done", 1))
    first = read(0)
    refed = cluster.restart_log[0].refeed_epoch
    assert refed is not None and 1 <= refed <= 2, f"the feed restarted at epoch {refed}; epoch 0 was complete"
    assert second == (4 - refed) * TRAIN_ROWS, (
        f"attempt 1 read {second} rows; epochs {refed}..3 hold {(4 - refed) * TRAIN_ROWS} ({TRAIN_ROWS} each)"
    )
    assert refed * TRAIN_ROWS - 2 * 256 <= first < (refed + 1) * TRAIN_ROWS, (
        f"attempt 0 read {first} rows, not the completed epochs 0..{refed - 1} and part of epoch {refed}"
    )
    assert fed == 4 * TRAIN_ROWS, f"cluster.train returned {fed}: each epoch's rows count once"


def test_restarts_exhausted_raise_node_failed_with_every_attempt(sc, tmp_path, no_leftovers):
    chaos = rw.Chaos(target="")
    job = rw.Job("", str(tmp_path / "model"), fail_worker=1, marks=str(tmp_path))
    with pytest.raises(NodeFailed) as info:
        cluster = _run_killed(sc, job, chaos)
        cluster.shutdown(timeout=120)
    raised = time.time()
    error = info.value
    assert len(error.attempts) == 2, f"expected both attempts' causes, got {error.attempts}"
    for attempt, line in enumerate(error.attempts):
        assert "worker:1" in line, line
        assert f"planned failure of worker 1 in attempt {attempt}" in line, line
    assert "planned failure of worker 1 in attempt 1" in str(error)
    failed_at = float((tmp_path / "failed-1").read_text())
    assert raised - failed_at <= 10, f"NodeFailed came {raised - failed_at:.1f}s after the last failure"
    print(f"NodeFailed raised {raised - failed_at:.1f}s after the last failure")
    assert os.path.exists(tmp_path / "failed-0")
    _check_nothing_left(chaos)


@pytest.mark.slow
def test_executor_jvm_killed_on_standalone_is_replaced(standalone, data, baseline, tmp_path, no_leftovers):
    chaos = rw.Chaos(target="executor")
    job = rw.Job(data, str(tmp_path / "model"), checkpoint_every=EVERY, hold_at=HOLD_AT)
    cluster = _run_killed(standalone, job, chaos)
    cluster.shutdown(timeout=240)
    assert chaos.killed and chaos.killed[0].startswith("executor-jvm"), chaos.killed
    _check_recovered(cluster, chaos, baseline, how="Spark executor (JVM pid")
