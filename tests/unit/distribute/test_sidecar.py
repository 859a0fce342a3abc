"""tfonspark.keras.sidecar_evaluate: real Keras models and real tf.train.Checkpoint files, no Spark.

A writer thread plays the coordinator (trains a little, saves a checkpoint); the sidecar loop in
the main thread evaluates each, writes TensorBoard scalars and reports. The end of training is
the cluster's: SIGTERM to this process, which the loop turns into "evaluate the newest, return".
"""

from __future__ import annotations

import os
import signal
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfonspark.keras as tfk
from tests.waiting import wait_until
from tfonspark.distribute import sidecar
from tfonspark.errors import CheckpointTimeout, ConfigError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class FakeCtx:
    """Collects ``ctx.report`` calls, as the driver's ``cluster.reports`` would."""

    def __init__(self) -> None:
        self.reports: list[dict] = []

    def report(self, metrics) -> None:
        self.reports.append(dict(metrics))


def _data():
    x = np.random.default_rng(0).normal(size=(64, 2)).astype("float32")
    y = (3 * x[:, :1] - 2 * x[:, 1:] + 1).astype("float32")
    return x, y


def _model(lib=keras):
    model = lib.Sequential([lib.Input((2,)), lib.layers.Dense(1)])
    model.compile(lib.optimizers.SGD(0.1), "mse", metrics=["mae"])
    return model


def _events(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    """TensorBoard scalars written under ``log_dir``: tag -> [(step, value)]."""
    out: dict[str, list[tuple[int, float]]] = {}
    for name in sorted(os.listdir(log_dir)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(log_dir, name)):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
                out.setdefault(value.tag, []).append((event.step, number))
    return out


def test_evaluates_each_checkpoint_and_the_last_after_sigterm(tmp_path):
    x, y = _data()
    trained = _model()
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=trained, optimizer=trained.optimizer), str(tmp_path), max_to_keep=10
    )
    ctx, saved, expected = FakeCtx(), [], {}

    def coordinator():  # 3 checkpoints, each evaluated before the next; the 4th with the stop
        for i in range(4):
            trained.fit(x, y, batch_size=16, epochs=1, verbose=0)  # 4 steps
            path = manager.save()
            saved.append(path)
            expected[path] = trained.evaluate(x, y, verbose=0, return_dict=True)["loss"]
            if i < 3:
                assert wait_until(lambda n=i: len(ctx.reports) > n, 30.0), "timed out"
        os.kill(os.getpid(), signal.SIGTERM)  # the cluster stops the evaluator right after the last save

    writer = threading.Thread(target=coordinator)
    previous = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    writer.start()
    try:
        reports = tfk.sidecar_evaluate(ctx, _model(), (x, y), str(tmp_path), timeout=60, poll_secs=0.05)
    finally:
        writer.join(60)
    assert time.monotonic() - started < 60
    assert signal.getsignal(signal.SIGTERM) == previous and not sidecar.stop_requested()  # put back
    assert reports == ctx.reports
    assert [r["checkpoint"] for r in reports] == saved  # every one, the last after the stop
    assert [r["step"] for r in reports] == [4, 8, 12, 16]  # the optimizer's iterations
    for r in reports:
        assert r["loss"] == pytest.approx(expected[r["checkpoint"]], rel=1e-4)
        assert set(r) == {"loss", "mae", "checkpoint", "step"}
    assert reports[-1]["loss"] < reports[0]["loss"]
    scalars = _events(str(tmp_path / "eval"))  # the default log_dir
    assert [s for s, _ in scalars["loss"]] == [4, 8, 12, 16]
    assert [v for _, v in scalars["loss"]] == pytest.approx([r["loss"] for r in reports], rel=1e-5)
    assert [s for s, _ in scalars["mae"]] == [4, 8, 12, 16]


def test_tf_keras_model_max_evaluations_and_log_dir(tmp_path):
    tf_keras = pytest.importorskip("tf_keras")
    x, y = _data()
    trained = _model(tf_keras)
    trained.fit(x, y, batch_size=32, epochs=3, verbose=0)  # 6 steps
    path = tf.train.Checkpoint(model=trained, optimizer=trained.optimizer).save(str(tmp_path / "ckpt"))
    log_dir = str(tmp_path / "tb")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    reports = tfk.sidecar_evaluate(None, _model(tf_keras), dataset, str(tmp_path), log_dir=log_dir, max_evaluations=1)
    (report,) = reports
    assert report["checkpoint"] == path and report["step"] == 6
    assert report["loss"] == pytest.approx(trained.evaluate(x, y, verbose=0, return_dict=True)["loss"], rel=1e-4)
    assert _events(log_dir)["loss"][0][0] == 6


def test_steps_come_from_a_step_variable_else_the_save_counter(tmp_path):
    model = _model()
    step = tf.Variable(1234, dtype=tf.int64)
    with_step = tf.train.Checkpoint(model=model, step=step).save(str(tmp_path / "a" / "ckpt"))
    checkpoint = tf.train.Checkpoint(model=keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    checkpoint.save(str(tmp_path / "b" / "ckpt"))
    plain = checkpoint.save(str(tmp_path / "b" / "ckpt"))
    assert sidecar.checkpoint_step(with_step) == 1234
    assert sidecar.checkpoint_step(plain) == 2  # the save counter


def test_no_checkpoint_within_the_timeout_names_it(tmp_path):
    started = time.monotonic()
    with pytest.raises(CheckpointTimeout, match=r"timeout=0.3s"):
        tfk.sidecar_evaluate(FakeCtx(), _model(), _data(), str(tmp_path), timeout=0.3, poll_secs=0.05)
    assert time.monotonic() - started < 5


def test_no_new_checkpoint_within_the_timeout_ends_the_loop(tmp_path):
    x, y = _data()
    trained = _model()
    tf.train.Checkpoint(model=trained).save(str(tmp_path / "ckpt"))
    ctx = FakeCtx()
    reports = tfk.sidecar_evaluate(ctx, _model(), (x, y), str(tmp_path), log_dir="", timeout=0.3, poll_secs=0.05)
    assert len(reports) == 1 == len(ctx.reports)
    assert not os.path.exists(tmp_path / "eval")  # log_dir="": no summaries


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    other = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    tf.train.Checkpoint(other_model=other).save(str(tmp_path / "a" / "ckpt"))
    with pytest.raises(ConfigError, match=r"^checkpoint .* holds none of the model.s variables.*other_model"):
        tfk.sidecar_evaluate(None, _model(), _data(), str(tmp_path / "a"), timeout=5)
    tf.train.Checkpoint(model=other).save(str(tmp_path / "b" / "ckpt"))
    with pytest.raises(ConfigError, match="does not fit the model"):
        tfk.sidecar_evaluate(None, _model(), _data(), str(tmp_path / "b"), timeout=5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"timeout": 0}, "timeout > 0"),
        ({"max_evaluations": 0}, "max_evaluations"),
        ({"poll_secs": 0}, "poll_secs"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        tfk.sidecar_evaluate(None, _model(), _data(), str(tmp_path), **kwargs)


def test_not_a_model_and_an_unbuilt_model_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="Keras model"):
        tfk.sidecar_evaluate(None, object(), _data(), str(tmp_path))
    with pytest.raises(ConfigError, match="built model"):
        tfk.sidecar_evaluate(None, keras.Sequential([keras.layers.Dense(1)]), _data(), str(tmp_path))
