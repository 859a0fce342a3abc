"""tfonspark.keras.fit resumes mid-epoch from step checkpoints; model_dir must be shared.

Real TensorFlow in this process (a one-worker MultiWorkerMirroredStrategy, no TF_CONFIG); the
multi-worker shared-directory check runs against a simulated second worker (a fake collective).
"""

from __future__ import annotations

import os
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfonspark.distribute as distribute
import tfonspark.keras as tfk
from tfonspark.distribute import checkpoint
from tfonspark.errors import ConfigError

STEPS = 16  # batches per epoch


@pytest.fixture(scope="module")
def strategy():
    os.environ.pop("TF_CONFIG", None)
    return distribute.strategy()


def _ds() -> tf.data.Dataset:
    x = np.random.default_rng(0).normal(size=(STEPS * 16, 3)).astype("float32")
    y = (np.sin(x[:, :1]) + x[:, 1:2] * x[:, 2:]).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)  # no shuffling: the same batches every time


def _model(strategy, seed: int):
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
    return model


class _Batches(keras.callbacks.Callback):
    """Records (epoch, batch) of every trained step; raises after ``fail_at`` (a node dying)."""

    def __init__(self, fail_at: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.epoch = -1
        self.trained: list[tuple[int, int]] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.trained.append((self.epoch, batch))
        if (self.epoch, batch) == self.fail_at:
            raise RuntimeError("simulated node loss")


def _saved_position(model_dir) -> tuple[int, int]:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir / "checkpoints")))
    return (
        int(reader.get_tensor("completed_epochs/.ATTRIBUTES/VARIABLE_VALUE")),
        int(reader.get_tensor("step_in_epoch/.ATTRIBUTES/VARIABLE_VALUE")),
    )


def test_resume_mid_epoch_trains_only_the_remaining_steps_and_ends_as_an_uninterrupted_run(strategy, tmp_path):
    reference = _model(strategy, seed=1)
    tfk.fit(reference, _ds(), epochs=3, verbose=0)

    interrupted = _model(strategy, seed=1)
    dying = _Batches(fail_at=(1, 12))  # the 29th step fails; the last checkpoint is epoch 1, step 10
    with pytest.raises(RuntimeError, match="simulated node loss"):
        tfk.fit(
            interrupted, _ds(), epochs=3, model_dir=tmp_path, checkpoint_every_steps=5, callbacks=[dying], verbose=0
        )
    assert len(dying.trained) == STEPS + 13
    assert _saved_position(tmp_path) == (1, 10)
    # saves: epoch 0 at steps 5, 10, 15 and its end, epoch 1 at 5, 10; the latest 3 are kept
    assert sorted(p for p in os.listdir(tmp_path / "checkpoints") if p.endswith(".index")) == [
        "ckpt-4.index",
        "ckpt-5.index",
        "ckpt-6.index",
    ]

    resumed = _model(strategy, seed=2)  # another start: the checkpoint must overwrite it
    batches = _Batches()
    history = tfk.fit(
        resumed, _ds(), epochs=3, model_dir=tmp_path, checkpoint_every_steps=5, callbacks=[batches], verbose=0
    )
    assert batches.trained == [(1, b) for b in range(10, STEPS)] + [(2, b) for b in range(STEPS)]
    assert history.epoch == [1, 2]
    assert int(resumed.optimizer.iterations.numpy()) == int(reference.optimizer.iterations.numpy())
    for got, want in zip(resumed.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert _saved_position(tmp_path) == (3, 0)


def test_steps_per_epoch_end_is_saved_once_and_a_finished_run_resumes_to_nothing(strategy, tmp_path):
    model = _model(strategy, seed=3)
    tfk.fit(model, _ds().repeat(), epochs=2, steps_per_epoch=8, model_dir=tmp_path, checkpoint_every_steps=4, verbose=0)
    # per epoch: step 4, then the epoch end (not step 8 as well)
    assert tf.train.get_checkpoint_state(str(tmp_path / "checkpoints")).model_checkpoint_path.endswith("ckpt-4")
    assert _saved_position(tmp_path) == (2, 0)
    batches = _Batches()
    again = tfk.fit(
        _model(strategy, seed=4), _ds().repeat(), epochs=2, steps_per_epoch=8, model_dir=tmp_path, callbacks=[batches]
    )
    assert batches.trained == [] and again.epoch == []


def test_resume_past_the_end_of_shorter_input_ends_the_epoch(strategy, tmp_path, caplog):
    model = _model(strategy, seed=5)
    dying = _Batches(fail_at=(0, 13))
    with pytest.raises(RuntimeError):
        tfk.fit(model, _ds(), epochs=1, model_dir=tmp_path, checkpoint_every_steps=6, callbacks=[dying], verbose=0)
    assert _saved_position(tmp_path) == (0, 12)
    batches = _Batches()
    history = tfk.fit(_model(strategy, seed=5), _ds().take(10), epochs=1, model_dir=tmp_path, callbacks=[batches])
    assert batches.trained == [] and history.epoch == [0]
    assert "training data ended after 10 batches" in caplog.text
    assert _saved_position(tmp_path) == (1, 0)


@pytest.mark.parametrize("every", [0, -3, True, 2.5, "10"])
def test_checkpoint_every_steps_must_be_a_positive_int(strategy, tmp_path, every):
    with pytest.raises(ConfigError, match=rf"checkpoint_every_steps must be an integer >= 1. Received: .*{every!r}"):
        tfk.fit(_model(strategy, 0), _ds(), model_dir=tmp_path, checkpoint_every_steps=every)
    assert not os.listdir(tmp_path)  # refused before anything was written


def test_checkpoint_every_steps_needs_a_model_dir(strategy):
    with pytest.raises(ConfigError, match="checkpoint_every_steps needs a model_dir"):
        tfk.DistributedTrainer(_model(strategy, 0), checkpoint_every_steps=10)


def test_model_dir_without_an_interval_checkpoints_at_the_default(strategy, tmp_path):
    trainer = tfk.DistributedTrainer(_model(strategy, 0), model_dir=tmp_path)
    assert trainer._checkpoint_every == tfk.DEFAULT_CHECKPOINT_EVERY_STEPS
    assert tfk.DistributedTrainer(_model(strategy, 0))._checkpoint_every is None


# -- model_dir shared by all workers -----------------------------------------------------------


def _two_workers(me: int) -> types.SimpleNamespace:
    """A stand-in strategy: worker ``me`` of a two-worker cluster, one local replica."""
    spec = {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}
    resolver = types.SimpleNamespace(
        task_type="worker", task_id=me, cluster_spec=lambda: types.SimpleNamespace(as_dict=lambda: spec)
    )
    return types.SimpleNamespace(cluster_resolver=resolver, extended=types.SimpleNamespace(worker_devices=["cpu:0"]))


class _OtherWorker:
    """Worker 1's half of each collective of ``check_shared_dir``, run against its own model_dir."""

    def __init__(self, model_dir) -> None:
        self.dir = str(model_dir)
        self.calls = 0
        self.token = 0

    def __call__(self, strategy, values):
        self.calls += 1
        if self.calls == 1:  # worker 0 draws the token; worker 1 adds 0, then writes its marker
            self.token = round(values[0])
            os.makedirs(self.dir, exist_ok=True)
            open(checkpoint._marker(self.dir, self.token, 1), "w").close()
            return list(values)
        if self.calls == 2:  # the barrier
            return [values[0] + 1.0]
        seen = [os.path.exists(checkpoint._marker(self.dir, self.token, w)) for w in (0, 1)]
        os.remove(checkpoint._marker(self.dir, self.token, 1))
        return [values[0], values[1], float(not seen[0]), float(not seen[1])]


def test_a_shared_model_dir_passes_and_the_markers_are_removed(tmp_path):
    other = _OtherWorker(tmp_path)
    checkpoint.check_shared_dir(tmp_path, _two_workers(0), reduce=other)
    assert other.calls == 3
    assert os.listdir(tmp_path) == []


def test_a_model_dir_on_each_workers_local_disk_is_refused(tmp_path):
    mine, theirs = tmp_path / "node0", tmp_path / "node1"
    with pytest.raises(ConfigError) as err:
        checkpoint.check_shared_dir(mine, _two_workers(0), reduce=_OtherWorker(theirs))
    message = str(err.value)
    assert f"model_dir {str(mine)!r} is not shared by all workers" in message
    assert "worker:0 (10.0.0.1:2222) cannot see the marker files of worker:1" in message
    assert "worker:1 (10.0.0.2:2222) cannot see the marker files of worker:0" in message
    assert "HDFS, S3, GCS, NFS" in message
    assert os.listdir(mine) == [] and os.listdir(theirs) == []


def test_one_worker_skips_the_shared_dir_check(strategy, tmp_path):
    def no_collective(strategy, values):
        raise AssertionError("a single worker needs no collective")

    checkpoint.check_shared_dir(tmp_path, strategy, reduce=no_collective)
    assert os.listdir(tmp_path) == []
