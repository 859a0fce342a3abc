"""The sidecar evaluator on real Spark: ``run(..., coordinator=True, eval_node=True)``.

``local[4]``: 1 ps, the chief, the evaluator and 1 worker. ``train_or_evaluate`` runs on the
chief and on the evaluator. The chief (``ParameterServerStrategy``'s coordinator) trains a
Keras 3 Dense layer and saves ``tf.train.Checkpoint(model=..., optimizer=...)`` after every
round of steps; the evaluator runs ``tfonspark.keras.sidecar_evaluate`` over that directory.
Once the chief returns, the driver stops the evaluator (SIGTERM); it evaluates the last
checkpoint and returns. The driver must then hold a report for at least two checkpoints,
the last among them, and TensorBoard event files must hold the metric at each step.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import tfonspark

from .conftest import by_value

by_value(__name__)

ROUNDS = 3  # checkpoints saved by the chief
STEPS = 5  # steps per round


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


def coordinate(args, ctx):
    import keras
    import tensorflow as tf

    began_at = time.time()
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

    began = time.monotonic()
    ready = Path(args["dir"], "evaluator-ready")
    deadline = time.monotonic() + 90
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    waited = time.monotonic() - began
    saved = []
    for i in range(ROUNDS):
        for _ in range(STEPS):
            coordinator.schedule(step, args=(iterator,))
        coordinator.join()
        saved.append([manager.save(), time.time()])
        if i < ROUNDS - 1:
            time.sleep(0.6)  # the evaluator's turn (it polls every 0.2 s)
    ctx.report(
        {
            "spec": sorted(ctx.cluster_spec),
            "saved": saved,
            "evaluator_was_ready": ready.exists(),
            "waited_s": waited,
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


def test_the_evaluator_reports_each_checkpoint_and_the_last(spark_manager, no_leftovers, tmp_path):
    sc = spark_manager.get("local[4]")  # 1 ps, the chief, the evaluator, 1 worker
    ckpt = str(tmp_path / "ckpt")
    args = {"dir": str(tmp_path), "ckpt": ckpt}
    started = time.monotonic()
    cluster = tfonspark.run(
        sc, train_or_evaluate, args, 4, num_ps=1, coordinator=True, eval_node=True, reservation_timeout=120
    )
    up, up_at = time.monotonic(), time.time()
    roles = sorted((i["job_name"], i["task_index"]) for i in cluster.cluster_info)
    assert roles == [("chief", 0), ("evaluator", 0), ("ps", 0), ("worker", 0)]
    cluster.shutdown(timeout=120)  # waits for the chief, then stops the evaluator (SIGTERM) and the servers
    done, done_at = time.monotonic(), time.time()

    by_node = {}
    for report in cluster.reports:
        by_node.setdefault(report.node, []).append(report)
    (chief,) = by_node["chief:0"]
    assert chief.metrics["spec"] == ["chief", "ps", "worker"]  # no evaluator: TF's coordinator would wait for it
    assert chief.metrics["evaluator_was_ready"]
    saved = {path: at for path, at in chief.metrics["saved"]}
    last = chief.metrics["saved"][-1][0]
    evaluations = by_node["evaluator:0"]
    seen = [r.metrics["checkpoint"] for r in evaluations]
    assert len(evaluations) >= 2 and seen[-1] == last, seen
    assert set(seen) <= set(saved) and len(set(seen)) == len(seen)
    steps = [r.metrics["step"] for r in evaluations]
    assert steps == sorted(steps) and steps[-1] == ROUNDS * STEPS, steps  # the optimizer's iterations
    assert evaluations[-1].metrics["loss"] < evaluations[0].metrics["loss"]
    assert _scalars(os.path.join(ckpt, "eval"))["loss"] == steps  # TensorBoard: one scalar per evaluation
    lags = [r.time - saved[r.metrics["checkpoint"]] for r in evaluations]
    print(
        f"[measured] sidecar evaluator, local[4] (ps, chief, evaluator, worker): {len(evaluations)} of {ROUNDS} "
        f"checkpoints evaluated, steps {steps}; checkpoint saved -> report on the driver "
        f"{', '.join(f'{lag:.2f}s' for lag in lags)}; loss {evaluations[0].metrics['loss']:.3f} -> "
        f"{evaluations[-1].metrics['loss']:.4f}; run() {up - started:.1f}s, shutdown() {done - up:.1f}s "
        f"(the chief: map_fun began {chief.metrics['began_at'] - up_at:.1f}s after run() returned, waited "
        f"{chief.metrics['waited_s']:.1f}s for the evaluator, saved its last checkpoint "
        f"{done_at - chief.metrics['saved'][-1][1]:.1f}s before shutdown() returned)"
    )
