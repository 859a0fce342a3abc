"""Failures in parameter-server training on real Spark (docs/ps.md, "Failures").

``ps_cluster`` (the driver as coordinator, in a subprocess: ``ps_failures_driver.py``): a worker's
TF process SIGKILLed mid-training is restarted in place by its supervisor and every scheduled
closure runs (some twice); a ps SIGKILLed fails the block within seconds with TF's error, and
leaving it raises NodeFailed naming ps:0, chained. ``run(..., coordinator=True, max_restarts=1)``:
a ps killed restarts the whole cluster, whose chief restores from the last checkpoint
(``ctx.attempt`` 1); the same kill once the restart is spent is the job's NodeFailed naming ps:0.
No node process and no task port is left in any case.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import tfonspark
from tfonspark.errors import NodeFailed
from tfonspark.probes import servers_accepting

from .conftest import by_value, node_processes, run_driver, wait_until

pytestmark = pytest.mark.spark

by_value(__name__)

DRIVER = Path(__file__).with_name("ps_failures_driver.py")


def test_a_killed_worker_restarts_in_place_and_a_killed_ps_fails_the_block(tmp_path):
    out = tmp_path / "out.json"
    r = run_driver(DRIVER, "local[3]", str(out), out=out, timeout=300)
    worker, ps, left = r["worker_kill"], r["ps_kill"], r["left_block"]
    # the worker: restarted at its address, every closure ran (at least once), training completed
    assert worker["accepting_s"] > 0 and worker["ran"] >= worker["scheduled"] == 150, worker
    assert [(s["node"], s["restart"], s["exit_code"], s["accepting"]) for s in r["server_restarts"]] == [
        ("worker:1", 1, -9, True)
    ]
    # the ps: TF's error in the block within seconds (its gRPC retries: 3.7 s on an idle machine,
    # 10.2 s once at load 11 with 3 test processes), then NodeFailed naming ps:0, chained from it
    assert 0 < ps["error_s"] < 20 and ps["type"] == "UnavailableError", ps
    assert (left["role"], left["index"], left["cause"]) == ("ps", 0, "UnavailableError"), left
    assert "ps:0" in left["message"] and "SIGKILL" in left["message"], left
    assert not any(r["after_block"]["accepting"].values()), r["after_block"]
    assert wait_until(lambda: not node_processes([r["cluster_id"]]), 10), node_processes([r["cluster_id"]])
    print(
        f"[measured] ps_cluster failures, local[3]: worker:1 SIGKILLed after 50 of 150 closures: accepting again "
        f"{worker['accepting_s']:.1f}s after the kill, training done {worker['completed_s']:.1f}s after it, "
        f"{worker['ran']} closures ran for {worker['scheduled']} scheduled (Keras optimizer.iterations counted "
        f"{worker['iterations']}), longest stall {worker['stall_s']:.2f}s, {worker['lost_s']:.1f}s lost against "
        f"the baseline rate; ps:0 SIGKILLed: {ps['type']} in the block after {ps['error_s']:.2f}s, NodeFailed "
        f"{left['left_s']:.1f}s later: {left['message']}"
    )


CHECKPOINTS = 8  # the chief checkpoints after each of these rounds of closures


def coordinate(args, ctx):
    """The chief: train in rounds, checkpointing after each; report the step it restored and each round."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.ParameterServerStrategy(ctx.cluster_resolver())
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        step_count = tf.Variable(0, dtype=tf.int64)  # assign_add on the ps: atomic, unlike Keras' counters
    checkpoint = tf.train.Checkpoint(model=model, step=step_count)
    manager = tf.train.CheckpointManager(checkpoint, args["dir"], max_to_keep=2)
    checkpoint.restore(manager.latest_checkpoint)  # None on attempt 0: nothing to restore
    ctx.report({"attempt": ctx.attempt, "restored": int(step_count.numpy())})

    @tf.function
    def step():
        model(tf.ones((4, 2)))
        step_count.assign_add(1)

    for _ in range(CHECKPOINTS):
        for _ in range(20):
            coordinator.schedule(step)
        coordinator.join()
        manager.save()
        ctx.report({"attempt": ctx.attempt, "saved": int(step_count.numpy())})
        time.sleep(0.5)


def _kill_ps_when(cluster, reported) -> float:
    """SIGKILL the ps's TF process once ``reported(reports)`` holds; return when (time.monotonic)."""
    assert wait_until(lambda: reported(cluster.reports), 120, interval=0.05), cluster.reports
    (ps,) = [p for p in node_processes([cluster.cluster_id]) if "ps:0" in p.cmdline()]
    os.kill(ps.pid, signal.SIGKILL)
    return time.monotonic()


def _shutdown_in_background(cluster) -> tuple[threading.Thread, list[BaseException], list[float]]:
    """``cluster.shutdown()`` on a thread (it waits for the chief and restarts the cluster): its error, its end."""
    errors: list[BaseException] = []
    ended: list[float] = []

    def shutdown() -> None:
        try:
            cluster.shutdown(timeout=120)
        except BaseException as exc:
            errors.append(exc)
        ended.append(time.monotonic())

    thread = threading.Thread(target=shutdown, daemon=True)
    thread.start()
    return thread, errors, ended


def test_coordinator_on_the_chief_restores_from_a_checkpoint_after_a_ps_kill(spark_manager, no_leftovers, tmp_path):
    sc = spark_manager.get("local[5]")  # shared with test_ps_coordinator.py: one SparkContext
    cluster = tfonspark.run(
        sc, coordinate, {"dir": str(tmp_path)}, 3, num_ps=1, coordinator=True, max_restarts=1, reservation_timeout=120
    )
    thread, errors, ended = _shutdown_in_background(cluster)
    _kill_ps_when(cluster, lambda reports: any(r.metrics.get("saved", 0) >= 40 for r in reports))
    # the restart: attempt 1 restores a checkpoint; then its ps dies too, with no restart left
    killed = _kill_ps_when(
        cluster, lambda reports: any(r.metrics.get("attempt") == 1 and "saved" in r.metrics for r in reports)
    )
    thread.join(120)
    assert ended and len(errors) == 1 and isinstance(errors[0], NodeFailed), errors
    error = errors[0]
    assert (error.role, error.index) == ("ps", 0) and "SIGKILL" in str(error).splitlines()[0], str(error)[:2000]
    assert len(error.attempts) == 2 and all("ps:0" in line for line in error.attempts), error.attempts
    assert cluster.restarts == 1 and cluster.restart_log[0].cause.role == "ps"
    restored = [r.metrics["restored"] for r in cluster.reports if "restored" in r.metrics]
    assert restored[0] == 0 and restored[1] >= 40, restored  # attempt 1 went on from a checkpoint
    addresses = {f"{i['job_name']}:{i['task_index']}": i["address"] for i in cluster.cluster_info}
    assert wait_until(lambda: not any(servers_accepting(_spec_of(addresses)).values()), 10)
    record = cluster.restart_log[0]
    print(
        f"[measured] coordinator=True, ps:0 SIGKILLed: cluster restarted {record.total_s:.1f}s after the failure "
        f"(teardown {record.teardown_s:.1f}s, start-up {record.startup_s:.1f}s), restored step {restored[1]}; "
        f"killed again with no restart left: shutdown() raised NodeFailed naming ps:0 {ended[0] - killed:.1f}s "
        "after the kill"
    )


def _spec_of(addresses: dict[str, str]) -> dict[str, list[str]]:
    spec: dict[str, list[str]] = {}
    for name, address in sorted(addresses.items()):
        spec.setdefault(name.split(":")[0], []).append(address)
    return spec
