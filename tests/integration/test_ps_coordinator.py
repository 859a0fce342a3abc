"""Parameter-server training on real Spark with the coordinator on the chief, and a sidecar evaluator.

``tfonspark.run(sc, train_or_evaluate, args, 5, num_ps=1, coordinator=True, eval_node=True)`` on
``local[5]``: 1 ps, the chief, the evaluator and 2 workers, in one cluster start. ``coordinate``
runs on the chief only: it builds ``ParameterServerStrategy`` and ``ClusterCoordinator`` from
``ctx.cluster_resolver()``, trains a Keras 3 Dense layer in a custom loop on a per-worker synthetic
dataset for ``ROUNDS`` rounds of ``STEPS`` scheduled steps, saves
``tf.train.Checkpoint(model=..., optimizer=...)`` after each round, reports its losses and
returns. The evaluator runs ``tfonspark.keras.sidecar_evaluate`` over that directory. The workers
and the ps only serve. ``cluster.shutdown()`` returns once the chief is done: it stops the
evaluator first (SIGTERM: it evaluates the last checkpoint and returns), then the servers. The
driver must then hold a report for at least two checkpoints, the last among them; TensorBoard
event files must hold the metric at each step; no node process is left and no task's port accepts.

Unlike ``ps_cluster`` (``test_ps_cluster.py``), the coordinator lives in the chief's TF process,
which ends with ``map_fun``: this test can drive the cluster from the pytest process.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import tfonspark
from tfonspark.errors import NodeFailed
from tfonspark.probes import servers_accepting

from .conftest import by_value, wait_until

by_value(__name__)

ROUNDS = 3  # checkpoints saved by the chief
STEPS = 10  # steps per round


def _xy():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 2)).astype("float32")
    return x, (3.0 * x[:, :1] + 2.0 * x[:, 1:] + 1.0).astype("float32")


def _dataset_fn(_context=None):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(_xy()).shuffle(256).repeat().batch(16)


def _model():
    import keras

    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])


def train_or_evaluate(args, ctx):
    """The chief trains and checkpoints; the evaluator evaluates each checkpoint as it appears."""
    if ctx.job_name == "evaluator":
        import tfonspark.keras

        model = _model()
        model.compile(loss="mse", metrics=["mae"])
        Path(args["dir"], "evaluator-ready").touch()  # the chief's first checkpoint waits for this
        tfonspark.keras.sidecar_evaluate(ctx, model, _xy(), args["ckpt"], timeout=120, poll_secs=0.2)
        return
    coordinate(args, ctx)


def _wait_for_evaluator(args) -> float:
    """Seconds the chief waited (at most 90) for the evaluator to be ready for the first checkpoint."""
    began = time.monotonic()
    ready = Path(args["dir"], "evaluator-ready")
    while not ready.exists() and time.monotonic() - began < 90:
        time.sleep(0.1)
    return time.monotonic() - began


def coordinate(args, ctx):
    """The chief's program: the PS strategy and coordinator from the node's resolver, then train in rounds."""
    import keras
    import tensorflow as tf

    started, began_at = time.monotonic(), time.time()
    strategy = tf.distribute.ParameterServerStrategy(ctx.cluster_resolver())
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = _model()
        optimizer = keras.optimizers.SGD(0.05)
        optimizer.build(model.trainable_variables)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer), args["ckpt"], None)
    iterator = iter(coordinator.create_per_worker_dataset(_dataset_fn))

    @tf.function
    def step(it):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.run(replica, args=next(it))

    setup_s = time.monotonic() - started
    waited = _wait_for_evaluator(args)
    ready = time.monotonic()
    results, saved = [], []
    for i in range(ROUNDS):
        results += [coordinator.schedule(step, args=(iterator,)) for _ in range(STEPS)]
        coordinator.join()
        saved.append([manager.save(), time.time(), int(optimizer.iterations.numpy())])
        if i < ROUNDS - 1:
            time.sleep(0.6)  # the evaluator's turn (it polls every 0.2 s)
    losses = [float(r.fetch()) for r in results]
    ctx.report(
        {
            "task": [ctx.job_name, ctx.task_index],
            "resolver": [ctx.cluster_resolver().task_type, ctx.cluster_resolver().task_id],
            "spec": ctx.cluster_spec,
            "losses": losses,
            "devices": [str(getattr(v.value, "device", "")) for v in model.variables],
            "saved": saved,
            "evaluator_was_ready": Path(args["dir"], "evaluator-ready").exists(),
            "waited_s": waited,
            "setup_s": setup_s,
            "train_s": time.monotonic() - ready,
            "began_at": began_at,
        }
    )


def _scalars(log_dir: str) -> dict[str, list[int]]:
    """The steps of each scalar in ``log_dir``'s event files, read as TensorBoard does (no TensorFlow here)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps: dict[str, list[int]] = {}
    for name in sorted(os.listdir(log_dir)):
        for event in EventFileLoader(os.path.join(log_dir, name)).Load():
            for value in event.summary.value:
                steps.setdefault(value.tag, []).append(event.step)
    return steps


def _check_the_chief(r: dict) -> None:
    """The chief coordinated 2 serving workers: its spec, its losses, variables on the ps."""
    assert r["task"] == r["resolver"] == ["chief", 0]
    # no evaluator in the chief's spec: TF's coordinator would wait for it
    assert sorted(r["spec"]) == ["chief", "ps", "worker"] and len(r["spec"]["worker"]) == 2, r["spec"]
    losses = r["losses"]
    assert len(losses) == ROUNDS * STEPS
    assert sum(losses[-5:]) / 5 < 0.2 * sum(losses[:5]) / 5, losses
    assert r["devices"] and all("/job:ps" in d for d in r["devices"]), r["devices"]
    assert r["evaluator_was_ready"]


def _check_the_evaluations(evaluations: list, r: dict, ckpt: str) -> list[int]:
    """At least two checkpoints evaluated, the last among them, in order; the steps evaluated."""
    iterations = {path: n for path, _, n in r["saved"]}
    seen = [e.metrics["checkpoint"] for e in evaluations]
    assert len(evaluations) >= 2 and seen[-1] == r["saved"][-1][0], seen
    assert set(seen) <= set(iterations) and len(set(seen)) == len(seen)
    steps = [e.metrics["step"] for e in evaluations]
    # each evaluation's step is the optimizer's iterations in its checkpoint (2 workers may lose a few
    # of Keras' non-atomic increments on the ps: at most ROUNDS * STEPS, not exactly)
    assert steps == [iterations[c] for c in seen] and steps == sorted(steps), (steps, r["saved"])
    assert 0 < steps[-1] <= ROUNDS * STEPS, steps
    assert evaluations[-1].metrics["loss"] < evaluations[0].metrics["loss"]
    assert _scalars(os.path.join(ckpt, "eval"))["loss"] == steps  # TensorBoard: one scalar per evaluation
    return steps


#: TF 2.21's own transport failing one of the coordinator's RPCs to a serving worker: the worker
#: answered "Unable to parse request" (gRPC INTERNAL) to a ``RemoteValue`` fetch, once in ~30 CI
#: runs of this file (stop 37) and never in 10 runs alone or beside a busy loop. No tfonspark code
#: is on that path (TF's client serializes, TF's server parses); the test runs again once for it.
TF_TRANSPORT_FLAKE = "Unable to parse request"


def _train_and_shut_down(sc, tmp_path: Path):
    """One cluster start on ``local[5]``, its roles checked, and its shutdown; what was timed."""
    tmp_path.mkdir()
    ckpt = str(tmp_path / "ckpt")
    started, started_at = time.monotonic(), time.time()
    cluster = tfonspark.run(
        sc,
        train_or_evaluate,
        {"dir": str(tmp_path), "ckpt": ckpt},
        5,
        num_ps=1,
        coordinator=True,
        eval_node=True,
        reservation_timeout=120,
    )
    up = time.monotonic()
    roles = sorted((i["job_name"], i["task_index"]) for i in cluster.cluster_info)
    assert roles == [("chief", 0), ("evaluator", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    cluster.shutdown(timeout=120)  # waits for the chief, then stops the evaluator (SIGTERM) and the servers
    return cluster, ckpt, (started, started_at, up, time.monotonic(), time.time())


def _train_tolerating_tf_transport_flake(sc, tmp_path: Path):
    """:func:`_train_and_shut_down`, again in a fresh directory if TF's transport failed the first."""
    try:
        return _train_and_shut_down(sc, tmp_path / "try1")
    except NodeFailed as exc:
        if TF_TRANSPORT_FLAKE not in str(exc):
            raise
        warnings.warn(f"TF's gRPC transport failed the first run, running again: {str(exc)[:300]}", stacklevel=1)
    return _train_and_shut_down(sc, tmp_path / "try2")


def test_the_chief_coordinates_serving_workers_and_the_evaluator_reports_each_checkpoint(
    spark_manager, no_leftovers, tmp_path
):
    sc = spark_manager.get("local[5]")  # a barrier stage of 5 tasks: 1 ps, the chief, the evaluator, 2 workers
    cluster, ckpt, (started, started_at, up, done, done_at) = _train_tolerating_tf_transport_flake(sc, tmp_path)

    by_node: dict[str, list] = {}
    for report in cluster.reports:
        by_node.setdefault(report.node, []).append(report)
    assert sorted(by_node) == ["chief:0", "evaluator:0"]  # only they ran user code
    (chief,) = by_node["chief:0"]
    r = chief.metrics
    _check_the_chief(r)
    evaluations = by_node["evaluator:0"]
    steps = _check_the_evaluations(evaluations, r, ckpt)
    # shutdown() returned: every task's server stopped, the chief's too (its process ended)
    assert wait_until(lambda: not any(servers_accepting(r["spec"], ("chief", "ps", "worker")).values()), 10)
    assert wait_until(lambda: not sc.statusTracker().getActiveJobsIds(), 20)
    saved = {path: at for path, at, _ in r["saved"]}
    lags = [e.time - saved[e.metrics["checkpoint"]] for e in evaluations]
    print(
        f"[measured] coordinator on the chief + sidecar evaluator, local[5] (1 ps, chief, evaluator, 2 workers): "
        f"run() {up - started:.1f}s, map_fun started {r['began_at'] - started_at:.1f}s after run() (servers "
        f"listening), strategy+model {r['setup_s']:.1f}s, waited {r['waited_s']:.1f}s for the evaluator, "
        f"{ROUNDS}x{STEPS} steps and checkpoints {r['train_s']:.2f}s, loss {r['losses'][0]:.3f} -> "
        f"{r['losses'][-1]:.5f}; {len(evaluations)} of {ROUNDS} checkpoints evaluated, steps {steps}, checkpoint "
        f"saved -> report on the driver {', '.join(f'{lag:.2f}s' for lag in lags)}, eval loss "
        f"{evaluations[0].metrics['loss']:.3f} -> {evaluations[-1].metrics['loss']:.4f}; shutdown() "
        f"{done - up:.1f}s, of which {done_at - r['saved'][-1][1]:.1f}s after the last checkpoint"
    )
