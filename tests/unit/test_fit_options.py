"""tfonspark.keras.fit keeps the options a user gives: callbacks, verbose, steps, validation.

One process, a one-worker MultiWorkerMirroredStrategy (no TF_CONFIG), real Keras models. Each
test would fail if ``fit`` dropped or replaced the user's value (issue 43, item 5).
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfonspark.distribute as distribute
import tfonspark.keras as tfk


@pytest.fixture(scope="module")
def strategy():
    os.environ.pop("TF_CONFIG", None)
    return distribute.strategy()


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
