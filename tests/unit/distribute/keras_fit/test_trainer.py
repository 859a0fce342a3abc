"""tfonspark.keras.fit in one process (a one-worker MultiWorkerMirroredStrategy, no TF_CONFIG)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfonspark.distribute as distribute
import tfonspark.keras as tfk
from tfonspark.distribute import checkpoint
from tfonspark.distribute.tf_config import task_info
from tfonspark.errors import ConfigError

W_TRUE = np.array([[3.0], [2.0]], dtype="float32")


@pytest.fixture(scope="module")
def strategy():
    """The process's strategy, created without TF_CONFIG (a one-worker MWMS)."""
    os.environ.pop("TF_CONFIG", None)
    return distribute.strategy()


def _linear_data(n: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).normal(size=(n, 2)).astype("float32")
    return x, (x @ W_TRUE + 1.0).astype("float32")


def _linear_ds(n: int = 256, batch: int = 32, seed: int = 0) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(_linear_data(n, seed)).batch(batch)


def _linear_model(strategy, optimizer="sgd"):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        opt = keras.optimizers.SGD(0.1) if optimizer == "sgd" else keras.optimizers.Adam(0.05)
        model.compile(optimizer=opt, loss="mse", metrics=["mae"])
    return model


def _weights(model) -> list[np.ndarray]:
    return [np.array(w) for w in model.get_weights()]


class _Recorder(keras.callbacks.Callback):
    """Remembers the weights at train begin and the epochs seen."""

    def on_train_begin(self, logs=None):
        self.start_weights = _weights(self.model)
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


# -- TF_CONFIG reading (pure) ----------------------------------------------------------------


def test_task_info_without_tf_config_is_a_single_chief():
    info = task_info("")
    assert (info.task_type, info.task_id, info.num_workers, info.is_chief) == (None, 0, 1, True)


def test_task_info_reads_cluster_and_chief():
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    worker0 = task_info({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    chief = task_info({"cluster": cluster, "task": {"type": "chief", "index": 0}})
    assert worker0.num_workers == 3
    assert not worker0.is_chief
    assert chief.is_chief


def test_task_info_worker0_is_chief_without_chief_role():
    tf_config = '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": "1"}}'
    info = task_info(tf_config)
    assert (info.task_id, info.is_chief) == (1, False)
    assert task_info(tf_config.replace('"1"', "0")).is_chief


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ("{not json", "not valid JSON"),
        ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}}', "'ps'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}', "not in"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}', ">= 0"),
        ('{"cluster": {"worker": "a:1"}, "task": {"type": "worker"}}', "list of"),
    ],
)
def test_task_info_rejects_malformed_tf_config(bad, fragment):
    with pytest.raises(ConfigError, match=fragment):
        task_info(bad)


# -- strategy --------------------------------------------------------------------------------


def test_strategy_is_cached_and_refuses_another_tf_config(strategy):
    assert distribute.strategy() is strategy
    assert strategy.num_replicas_in_sync == 1
    os.environ["TF_CONFIG"] = '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker"}}'
    with pytest.raises(ConfigError, match="already created"):
        distribute.strategy()
    with pytest.raises(ConfigError, match="collective"):
        distribute.strategy(communication="carrier-pigeon")
    os.environ["TFONSPARK_COLLECTIVE"] = "pigeon"  # outside tfonspark the variable is read here
    with pytest.raises(ConfigError, match=r"TFONSPARK_COLLECTIVE must be .*'pigeon' \(from the environment\)"):
        distribute.strategy()


# -- training --------------------------------------------------------------------------------


def test_fit_learns_linear_function_and_reports_global_epoch_logs(strategy):
    model = _linear_model(strategy)
    reports: list[tfk.Progress] = []
    epochs = 12
    xv, yv = _linear_data(64, seed=1)
    yv = yv + np.random.default_rng(1).normal(0.0, 0.5, size=yv.shape).astype("float32")
    history = tfk.fit(
        model,
        _linear_ds(),
        epochs=epochs,
        validation_data=tf.data.Dataset.from_tensor_slices((xv, yv)).batch(16),
        on_progress=reports.append,
        log_every_steps=4,
        verbose=0,
    )
    kernel, bias = _weights(model)
    np.testing.assert_allclose(kernel.ravel(), [3.0, 2.0], atol=0.02)
    np.testing.assert_allclose(bias, [1.0], atol=0.02)
    assert set(history.history) == {"loss", "mae", "val_loss", "val_mae"}
    assert history.epoch == list(range(epochs))
    assert all(len(v) == epochs for v in history.history.values())
    assert history.history["loss"][-1] < history.history["loss"][0] / 100
    # val_* after the last epoch is the final model's error on the validation set
    predicted = xv @ kernel + bias
    assert history.history["val_loss"][-1] == pytest.approx(np.mean((predicted - yv) ** 2), rel=1e-4)
    assert history.history["val_mae"][-1] == pytest.approx(np.mean(np.abs(predicted - yv)), rel=1e-4)
    ends = [r for r in reports if r.epoch_end]
    steps = [r for r in reports if not r.epoch_end]
    assert [r.epoch for r in ends] == list(range(epochs))
    assert all(r.global_rows == 256 and r.step == 8 and r.rows_per_sec > 0 for r in ends)
    assert ends[-1].logs["val_loss"] == history.history["val_loss"][-1]
    assert [(r.step, r.rows) for r in steps[:2]] == [(4, 128), (8, 256)]
    assert isinstance(steps[0].loss, float)


def test_fit_classification_with_sparse_crossentropy_and_accuracy(strategy):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(300, 4)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int64") + 2 * (x[:, 2] > 1.0)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(300, seed=0).batch(30)
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
        model.compile(
            optimizer=keras.optimizers.Adam(0.05),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["sparse_categorical_accuracy"],
        )
    history = tfk.fit(model, ds, epochs=15, validation_data=ds, verbose=0)
    accuracy = history.history["sparse_categorical_accuracy"]
    assert accuracy[-1] > 0.9 > accuracy[0]
    assert history.history["val_sparse_categorical_accuracy"][-1] > 0.9
    predicted = np.argmax(model.predict(x, verbose=0), axis=1)
    assert history.history["val_sparse_categorical_accuracy"][-1] == pytest.approx(np.mean(predicted == y), abs=1e-6)


def test_build_fn_is_called_inside_the_scope(strategy):
    def build():
        assert tf.distribute.has_strategy()
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        return model

    history = tfk.fit(build, _linear_ds(), epochs=3, verbose=0)
    assert isinstance(history.model, keras.Model)
    assert history.model.distribute_strategy is strategy
    assert len(history.history["loss"]) == 3


def test_dataset_fn_gets_an_input_context(strategy):
    contexts = []

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        contexts.append(ctx)
        batch = ctx.get_per_replica_batch_size(32)
        return _linear_ds(batch=batch).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)

    model = _linear_model(strategy)
    history = tfk.fit(model, dataset_fn, epochs=2, validation_data=dataset_fn, verbose=0)
    assert [(c.num_input_pipelines, c.input_pipeline_id) for c in contexts][:1] == [(1, 0)]
    assert len(history.history["val_loss"]) == 2


def test_infinite_dataset_needs_steps_per_epoch(strategy):
    model = _linear_model(strategy)
    infinite = tf.data.Dataset.counter().map(lambda i: (tf.fill([2], tf.cast(i, tf.float32)), [1.0]))
    infinite = infinite.batch(4)
    assert infinite.cardinality() == tf.data.INFINITE_CARDINALITY
    with pytest.raises(ConfigError, match="steps_per_epoch"):
        tfk.fit(model, infinite, epochs=1, verbose=0)
    seen: list[int] = []

    class Batches(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(batch)

    reports: list[tfk.Progress] = []
    history = tfk.fit(
        model,
        infinite,
        epochs=2,
        steps_per_epoch=3,
        callbacks=[Batches()],
        on_progress=reports.append,
        verbose=0,
    )
    assert len(history.history["loss"]) == 2
    assert seen == [0, 1, 2, 0, 1, 2]
    assert [r.global_rows for r in reports if r.epoch_end] == [12, 12]


def test_finite_dataset_with_steps_per_epoch_restarts_when_it_runs_out(strategy, caplog):
    model = _linear_model(strategy)
    reports: list[tfk.Progress] = []
    with caplog.at_level(logging.WARNING, logger="tfonspark.distribute.keras_fit"):
        tfk.fit(model, _linear_ds(), epochs=3, steps_per_epoch=5, on_progress=reports.append, verbose=0)
    # 8 batches: epoch 0 takes 5, epoch 1 the last 3 (early end), epoch 2 starts again
    assert [r.step for r in reports if r.epoch_end] == [5, 3, 5]
    assert "ran out of data after 3 of 5 steps" in caplog.text


def test_the_end_of_the_data_is_not_an_optimizer_step(strategy):
    """The step that finds no batch must not count: Adam's bias correction reads the iterations."""
    model = _linear_model(strategy, optimizer="adam")
    tfk.fit(model, _linear_ds(), epochs=3, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 3 * 8
    keras.utils.set_random_seed(1)
    plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])  # Keras' own fit, no strategy
    plain.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    plain.fit(_linear_ds(), epochs=3, verbose=0)
    for ours, theirs in zip(_weights(model), _weights(plain), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    carried = _linear_model(strategy, optimizer="adam")
    tfk.fit(carried, _linear_ds(), epochs=3, steps_per_epoch=5, verbose=0)
    assert int(carried.optimizer.iterations.numpy()) == 5 + 3 + 5  # as in the test above


def _conv_bn_model(strategy, *, eager=False):
    """Conv2D + BatchNormalization with plain SGD: an empty batch must leave it untouched."""
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Conv2D(2, 3),
                keras.layers.BatchNormalization(),
                keras.layers.Flatten(),
                keras.layers.Dense(3),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            run_eagerly=eager,
        )
    return model


def _image_batches(empty_after: int | None = None) -> tf.data.Dataset:
    """3 batches of 8 images; with ``empty_after``, a 0-row batch after that many batches."""
    rng = np.random.default_rng(5)
    x, y = rng.random((24, 8, 8, 1), dtype=np.float32), rng.integers(0, 3, 24)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    if empty_after is None:
        return ds
    empty = tf.data.Dataset.from_tensors((x[:0], y[:0]))
    return ds.take(empty_after).concatenate(empty).concatenate(ds.skip(empty_after))


@pytest.mark.parametrize("eager", [False, True], ids=["traced", "run_eagerly"])
def test_an_empty_batch_never_reaches_the_model(strategy, eager):
    """oneDNN's Conv2D rejects 0 rows and BatchNormalization makes NaNs of them: the step skips
    the model, contributes zero gradients and no metric update, and still counts as a step."""
    model = _conv_bn_model(strategy, eager=eager)
    history = tfk.fit(model, _image_batches(empty_after=1), epochs=2, shard_policy="off", verbose=0)
    reference = _conv_bn_model(strategy)
    expected = tfk.fit(reference, _image_batches(), epochs=2, shard_policy="off", verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 2 * 4  # the empty batch is a step ...
    for ours, theirs in zip(_weights(model), _weights(reference), strict=True):  # ... with no effect
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(history.history[key], expected.history[key], rtol=1e-5)
    evaluated = tfk.fit(model, _image_batches(), epochs=3, validation_data=_image_batches(empty_after=3), verbose=0)
    assert np.isfinite(evaluated.history["val_loss"]).all()


def test_an_empty_batch_with_a_custom_train_step_and_sparse_gradients(strategy):
    """A custom train_step (its own logs, apply_gradients) and an Embedding's IndexedSlices."""

    class Custom(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables))
            return {"custom_loss": loss}

    keras.utils.set_random_seed(4)
    with strategy.scope():
        inputs = keras.Input((4,), dtype="int32")
        outputs = keras.layers.Dense(1)(keras.layers.Flatten()(keras.layers.Embedding(50, 2)(inputs)))
        model = Custom(inputs, outputs)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    rng = np.random.default_rng(6)
    x, y = rng.integers(0, 50, (16, 4)).astype("int32"), rng.random((16, 1), dtype=np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    ds = ds.concatenate(tf.data.Dataset.from_tensors((x[:0], y[:0])))
    before = _weights(model)
    history = tfk.fit(model, ds, epochs=1, shard_policy="off", verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 3
    assert not np.allclose(_weights(model)[0], before[0])
    assert np.isfinite(history.history["custom_loss"]).all()


def test_progress_goes_to_the_log_by_default(strategy, caplog):
    model = _linear_model(strategy)
    with caplog.at_level(logging.INFO, logger="tfonspark.distribute.keras_fit"):
        tfk.fit(model, _linear_ds(), epochs=1, log_every_steps=4, verbose=0)
    lines = [r.getMessage() for r in caplog.records if "rows/s" in r.getMessage()]
    assert len(lines) == 3
    assert lines[0].startswith("worker 0 epoch 1 step 4/8 loss=")
    assert lines[-1].endswith("(epoch end, all workers)")


def test_stop_training_is_honoured_at_the_epoch_end(strategy):
    class StopAfterTwo(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = epoch == 1

    history = tfk.fit(_linear_model(strategy), _linear_ds(), epochs=6, callbacks=[StopAfterTwo()], verbose=0)
    assert history.epoch == [0, 1]


def test_keras_early_stopping_works(strategy):
    model = _linear_model(strategy)
    stopper = keras.callbacks.EarlyStopping(monitor="loss", min_delta=1e9, patience=1)
    history = tfk.fit(model, _linear_ds(), epochs=10, callbacks=[stopper], verbose=0)
    assert history.epoch == [0, 1]


# -- contract violations ---------------------------------------------------------------------


def test_model_created_outside_the_scope_is_refused(strategy):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ConfigError, match="not created under"):
        tfk.fit(model, _linear_ds(), verbose=0)
    with pytest.raises(ConfigError, match="not created under"):
        tfk.fit(model, _linear_ds(), strategy=strategy, verbose=0)


def test_model_compiled_outside_the_scope_is_refused(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(ConfigError, match="not compiled"):
        tfk.fit(model, _linear_ds(), verbose=0)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ConfigError, match="compiled outside"):
        tfk.fit(model, _linear_ds(), verbose=0)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"epochs": 0}, "epochs"),
        ({"epochs": True}, "epochs"),
        ({"steps_per_epoch": 0}, "steps_per_epoch"),
        ({"verbose": "loud"}, "verbose"),
        ({"shard_policy": "sometimes"}, "shard_policy"),
        ({"log_every_steps": -1}, "log_every_steps"),
    ],
)
def test_bad_arguments_are_config_errors(strategy, kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        tfk.fit(_linear_model(strategy), _linear_ds(), **kwargs)


def test_bad_inputs_are_config_errors(strategy):
    model = _linear_model(strategy)
    with pytest.raises(ConfigError, match="tf.data.Dataset"):
        tfk.fit(model, [1, 2, 3], verbose=0)
    with pytest.raises(ConfigError, match="shard_policy applies"):
        tfk.fit(model, lambda ctx: _linear_ds(), shard_policy="data", verbose=0)
    with pytest.raises(ConfigError, match="build_fn must return"):
        tfk.fit(lambda: "not a model", _linear_ds(), verbose=0)
    with pytest.raises(ConfigError, match="model must be"):
        tfk.fit(42, _linear_ds(), verbose=0)


# -- checkpoints and export ------------------------------------------------------------------


def test_resume_continues_after_the_last_completed_epoch(strategy, tmp_path):
    first = _linear_model(strategy, optimizer="adam")
    h1 = tfk.fit(first, _linear_ds(), epochs=1, model_dir=tmp_path, verbose=0)
    assert h1.epoch == [0]
    after_first = _weights(first)
    iterations = int(first.optimizer.iterations.numpy())

    second = _linear_model(strategy, optimizer="adam")  # a fresh, differently trained start
    assert not np.allclose(_weights(second)[0], after_first[0])
    recorder = _Recorder()
    h2 = tfk.fit(second, _linear_ds(), epochs=2, model_dir=tmp_path, callbacks=[recorder], verbose=0)
    assert h2.epoch == [1] and recorder.epochs == [1]
    assert len(h2.history["loss"]) == 1
    for restored, saved in zip(recorder.start_weights, after_first, strict=True):
        np.testing.assert_array_equal(restored, saved)
    assert int(second.optimizer.iterations.numpy()) == 2 * iterations  # Adam state came back too
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert "ckpt-1.index" in names and "ckpt-2.index" in names


def test_checkpoint_holds_non_trainable_state_and_a_done_run_trains_nothing(strategy, tmp_path):
    def build():
        keras.utils.set_random_seed(4)
        model = keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization(), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    trained = tfk.fit(build, _linear_ds(), epochs=2, model_dir=tmp_path, verbose=0).model
    history = tfk.fit(build, _linear_ds(), epochs=2, model_dir=tmp_path, verbose=0)
    assert history.history == {} and history.epoch == []
    restored = history.model
    moving_mean = restored.layers[0].moving_mean
    assert not np.allclose(moving_mean.numpy(), 0.0)
    for a, b in zip(_weights(restored), _weights(trained), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # raised inside Keras' shape error
def test_checkpoint_of_another_model_is_refused(strategy, tmp_path):
    tfk.fit(_linear_model(strategy), _linear_ds(), epochs=1, model_dir=tmp_path, verbose=0)

    def bigger():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    with pytest.raises(ConfigError, match="does not match the model"):
        tfk.fit(bigger, _linear_ds(), epochs=2, model_dir=tmp_path, verbose=0)


def test_workers_that_restored_different_epochs_are_refused(strategy, tmp_path, monkeypatch):
    from tfonspark.distribute import checkpoint

    model = _linear_model(strategy)
    tfk.fit(model, _linear_ds(), epochs=1, model_dir=tmp_path, verbose=0)
    # what two workers would sum (epoch, epoch^2, step, step^2, 1) if one restored epoch 1 and
    # the other found nothing (epoch 0)
    monkeypatch.setattr(checkpoint, "sum_across_replicas", lambda s, values: [1.0, 1.0, 0.0, 0.0, 2.0])
    with pytest.raises(ConfigError, match="shared|every worker can read"):
        checkpoint.EpochCheckpoint(model, tmp_path, strategy=strategy).restore()


def test_fit_inside_the_scope_with_checkpoints(strategy, tmp_path):
    model = _linear_model(strategy)
    with strategy.scope():
        history = tfk.fit(model, _linear_ds(), epochs=2, model_dir=tmp_path, verbose=0)
    assert history.epoch == [0, 1]
    assert (tmp_path / "checkpoints" / "ckpt-2.index").exists()


def test_export_saved_model_serves_the_same_predictions(strategy, tmp_path):
    trainer = tfk.DistributedTrainer(_linear_model(strategy))
    trainer.fit(_linear_ds(), epochs=2, verbose=0)
    assert trainer.is_chief
    path = trainer.export(tmp_path / "export")
    assert path == str(tmp_path / "export")
    x, _ = _linear_data(16, seed=5)
    loaded = tf.saved_model.load(path)  # keep a reference: serve() uses its variables
    served = loaded.serve(tf.constant(x)).numpy()
    np.testing.assert_allclose(served, trainer.model.predict(x, verbose=0), rtol=1e-6, atol=1e-6)


# -- tf_keras --------------------------------------------------------------------------------


def test_tf_keras_model_is_trained_by_its_own_fit(tmp_path, monkeypatch):
    tf_keras = pytest.importorskip("tf_keras")
    save_freqs = []

    class Recording(tf_keras.callbacks.BackupAndRestore):
        def __init__(self, backup_dir, save_freq="epoch"):
            super().__init__(backup_dir, save_freq=save_freq)
            save_freqs.append(save_freq)

    monkeypatch.setattr(tf_keras.callbacks, "BackupAndRestore", Recording)
    model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(2,))])
    model.compile(optimizer=tf_keras.optimizers.SGD(0.1), loss="mse")
    with pytest.raises(ConfigError, match="on_progress"):
        tfk.fit(model, _linear_ds(), on_progress=print)
    history = tfk.fit(model, _linear_ds(), epochs=3, model_dir=tmp_path, verbose=0)
    assert isinstance(history, tf_keras.callbacks.History)
    assert len(history.history["loss"]) == 3
    assert history.history["loss"][-1] < history.history["loss"][0]
    tfk.fit(model, _linear_ds(), epochs=1, model_dir=tmp_path / "b", checkpoint_every_steps=3, verbose=0)
    assert save_freqs == [tfk.DEFAULT_CHECKPOINT_EVERY_STEPS, 3]


# -- public surface --------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["tfonspark.distribute.tf_config", "tfonspark.executor.supervisor"])
def test_tf_config_and_the_supervisor_do_not_import_tensorflow_or_keras(module):
    code = f"import sys, {module}; sys.exit(any(m in sys.modules for m in ('tensorflow', 'keras')))"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.mark.parametrize("module", [tfk, distribute])
def test_exported_members(module):
    assert module.__all__ == sorted(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None


# ---- from test_fit_options.py -----------------------------------------------------------------------
# tfonspark.keras.fit keeps the options a user gives: callbacks, verbose, steps, validation.
#
# One process, a one-worker MultiWorkerMirroredStrategy (no TF_CONFIG), real Keras models. Each
# test would fail if ``fit`` dropped or replaced the user's value (issue 43, item 5).


def _model(strategy):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


def _data(rows: int = 64, batch: int = 16, repeat: bool = False) -> tf.data.Dataset:
    x = np.random.default_rng(0).normal(size=(rows, 2)).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True)))
    return (ds.repeat() if repeat else ds).batch(batch)


class _Counter(keras.callbacks.Callback):
    """Counts the hooks Keras calls and keeps the params and the epoch logs it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}
        self.epoch_logs: list[dict] = []

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def on_train_begin(self, logs=None):
        self._count("train_begin")

    def on_train_batch_end(self, batch, logs=None):
        self._count("train_batch_end")

    def on_test_batch_end(self, batch, logs=None):
        self._count("test_batch_end")

    def on_epoch_end(self, epoch, logs=None):
        self._count("epoch_end")
        self.epoch_logs.append(dict(logs or {}))

    def on_train_end(self, logs=None):
        self._count("train_end")


def test_steps_and_validation_are_the_users_and_every_callback_hook_runs(strategy):
    counter = _Counter()
    callbacks = [counter]
    history = tfk.fit(
        _model(strategy),
        _data(repeat=True),  # infinite: only the user's steps end an epoch
        epochs=2,
        steps_per_epoch=3,
        validation_data=_data(repeat=True),
        validation_steps=2,
        callbacks=callbacks,
        verbose=0,
    )
    assert counter.calls == {
        "train_begin": 1,
        "train_batch_end": 6,
        "test_batch_end": 4,
        "epoch_end": 2,
        "train_end": 1,
    }
    assert counter.params == {"epochs": 2, "steps": 3, "verbose": 0}
    assert counter.model is not None and all("val_loss" in logs for logs in counter.epoch_logs)
    assert history.epoch == [0, 1] and len(history.history["val_mae"]) == 2
    assert callbacks == [counter]  # the user's list is not changed


def test_a_users_history_is_the_one_filled_and_returned(strategy):
    mine = keras.callbacks.History()
    returned = tfk.fit(_model(strategy), _data(), epochs=2, callbacks=[mine], verbose=0)
    assert returned is mine and mine.epoch == [0, 1] and set(mine.history) == {"loss", "mae"}


@pytest.mark.parametrize("verbose", [0, 1, 2])
def test_verbose_is_the_users(strategy, verbose, capsys):
    counter = _Counter()
    tfk.fit(_model(strategy), _data(), epochs=2, callbacks=[counter], verbose=verbose)
    assert counter.params["verbose"] == verbose
    out = capsys.readouterr().out
    assert ("Epoch 2/2" in out, "loss:" in out) == (verbose != 0, verbose != 0)
    assert ("\r" in out) == (verbose == 1)  # 1: a progress bar; 2: one line per epoch


def test_a_users_progress_bar_is_used_not_doubled(strategy, capsys):
    class Bar(keras.callbacks.ProgbarLogger):
        epochs_seen = 0

        def on_epoch_begin(self, epoch, logs=None):
            Bar.epochs_seen += 1
            super().on_epoch_begin(epoch, logs)

    tfk.fit(_model(strategy), _data(), epochs=2, callbacks=[Bar()], verbose=2)
    assert Bar.epochs_seen == 2
    out = capsys.readouterr().out
    assert out.count("Epoch 1/2") == 1 and out.count("Epoch 2/2") == 1


# ---- from test_keras_resume.py ----------------------------------------------------------------------
# tfonspark.keras.fit resumes mid-epoch from step checkpoints; model_dir must be shared.
#
# Real TensorFlow in this process (a one-worker MultiWorkerMirroredStrategy, no TF_CONFIG); the
# multi-worker shared-directory check runs against a simulated second worker (a fake collective).


STEPS = 16  # batches per epoch


def _ds() -> tf.data.Dataset:
    x = np.random.default_rng(0).normal(size=(STEPS * 16, 3)).astype("float32")
    y = (np.sin(x[:, :1]) + x[:, 1:2] * x[:, 2:]).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)  # no shuffling: the same batches every time


def _resumable_model(strategy, seed: int):
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
    reference = _resumable_model(strategy, seed=1)
    tfk.fit(reference, _ds(), epochs=3, verbose=0)

    interrupted = _resumable_model(strategy, seed=1)
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

    resumed = _resumable_model(strategy, seed=2)  # another start: the checkpoint must overwrite it
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
    model = _resumable_model(strategy, seed=3)
    tfk.fit(model, _ds().repeat(), epochs=2, steps_per_epoch=8, model_dir=tmp_path, checkpoint_every_steps=4, verbose=0)
    # per epoch: step 4, then the epoch end (not step 8 as well)
    assert tf.train.get_checkpoint_state(str(tmp_path / "checkpoints")).model_checkpoint_path.endswith("ckpt-4")
    assert _saved_position(tmp_path) == (2, 0)
    batches = _Batches()
    again = tfk.fit(
        _resumable_model(strategy, seed=4),
        _ds().repeat(),
        epochs=2,
        steps_per_epoch=8,
        model_dir=tmp_path,
        callbacks=[batches],
    )
    assert batches.trained == [] and again.epoch == []


def test_resume_past_the_end_of_shorter_input_ends_the_epoch(strategy, tmp_path, caplog):
    model = _resumable_model(strategy, seed=5)
    dying = _Batches(fail_at=(0, 13))
    with pytest.raises(RuntimeError):
        tfk.fit(model, _ds(), epochs=1, model_dir=tmp_path, checkpoint_every_steps=6, callbacks=[dying], verbose=0)
    assert _saved_position(tmp_path) == (0, 12)
    batches = _Batches()
    history = tfk.fit(
        _resumable_model(strategy, seed=5), _ds().take(10), epochs=1, model_dir=tmp_path, callbacks=[batches]
    )
    assert batches.trained == [] and history.epoch == [0]
    assert "training data ended after 10 batches" in caplog.text
    assert _saved_position(tmp_path) == (1, 0)


@pytest.mark.parametrize("every", [0, -3, True, 2.5, "10"])
def test_checkpoint_every_steps_must_be_a_positive_int(strategy, tmp_path, every):
    with pytest.raises(ConfigError, match=rf"checkpoint_every_steps must be an integer >= 1. Received: .*{every!r}"):
        tfk.fit(_resumable_model(strategy, 0), _ds(), model_dir=tmp_path, checkpoint_every_steps=every)
    assert not os.listdir(tmp_path)  # refused before anything was written


def test_checkpoint_every_steps_needs_a_model_dir(strategy):
    with pytest.raises(ConfigError, match="checkpoint_every_steps needs a model_dir"):
        tfk.DistributedTrainer(_resumable_model(strategy, 0), checkpoint_every_steps=10)


def test_model_dir_without_an_interval_checkpoints_at_the_default(strategy, tmp_path):
    trainer = tfk.DistributedTrainer(_resumable_model(strategy, 0), model_dir=tmp_path)
    assert trainer._checkpoint_every == tfk.DEFAULT_CHECKPOINT_EVERY_STEPS
    assert tfk.DistributedTrainer(_resumable_model(strategy, 0))._checkpoint_every is None


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
