"""Step checkpoints and the shared-model_dir check on two real TF workers (MWMS over 127.0.0.1).

This file is also the worker (``python test_keras_resume.py OWN_DIR SHARED_DIR OUT_JSON`` with
``TF_CONFIG`` set). In one process pair, each worker:

1. fits with a ``model_dir`` on its "local disk" (a directory of its own): every worker must get
   the ConfigError of the shared-directory check, before any training;
2. fits with the shared directory and ``checkpoint_every_steps=3``; both workers raise from a
   callback at epoch 1, step 4 (the cluster being torn down after a node loss);
3. fits a fresh model with the same directory: it resumes at epoch 1, step 3 (the checkpoint),
   and ends with the same weights on both workers. (That a resumed run ends as an uninterrupted
   one does is checked in ``tests/unit/distribute/keras_fit/test_trainer.py``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tfonspark.testing import free_ports

TIMEOUT_S = 180  # two TF processes: measured 57 s at load 12 and 100 s at load 15 on 2 cores
GLOBAL_BATCH = 32
ROWS = 256  # 8 steps per epoch


def test_two_workers_refuse_unshared_model_dirs_then_resume_mid_epoch(tmp_path):
    pytest.importorskip("tensorflow")
    addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = []
    for index in range(2):
        env = dict(
            os.environ,
            TF_CONFIG=json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}),
            TF_CPP_MIN_LOG_LEVEL="2",
            TF_NUM_INTRAOP_THREADS="1",
            CUDA_VISIBLE_DEVICES="",
        )
        args = [str(tmp_path / f"local{index}"), str(tmp_path / "shared"), str(tmp_path / f"{index}.json")]
        log = open(tmp_path / f"{index}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen([sys.executable, __file__, *args], env=env, stdout=log, stderr=log), log))
    deadline = time.monotonic() + TIMEOUT_S
    for index, (proc, log) in enumerate(procs):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        if proc.returncode != 0:
            tail = (tmp_path / f"{index}.log").read_text()[-3000:]
            pytest.fail(f"worker {index} exited with {proc.returncode} (limit {TIMEOUT_S} s):\n{tail}")
    nodes = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]

    for index, node in enumerate(nodes):
        error = node["unshared_error"]
        assert error.startswith(f"ConfigError: model_dir {str(tmp_path / f'local{index}')!r} is not shared")
        assert f"worker:0 ({addresses[0]}) cannot see the marker files of worker:1" in error
        assert f"worker:1 ({addresses[1]}) cannot see the marker files of worker:0" in error
        assert node["trained_before_error"] == 0
        assert os.listdir(tmp_path / f"local{index}") == []  # markers removed
        assert node["interrupted"] == [[0, b] for b in range(8)] + [[1, b] for b in range(5)]
        assert node["resumed"] == [[1, b] for b in range(3, 8)]  # from the checkpoint at step 3
    for a, b in zip(nodes[0]["resumed_weights"], nodes[1]["resumed_weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert not [p for p in os.listdir(tmp_path / "shared") if p.startswith(".tfonspark-shared")]


def worker(own_dir: str, shared_dir: str, out_path: str) -> None:
    """One node of the test above; writes what it saw to ``out_path``."""
    from tfonspark import distribute

    strategy = distribute.strategy()  # before any other TensorFlow op
    import keras
    import tensorflow as tf

    import tfonspark.keras as tfk
    from tfonspark.errors import ConfigError

    x = np.random.default_rng(0).normal(size=(ROWS, 2)).astype("float32")
    y = (3.0 * x[:, :1] - 2.0 * x[:, 1:] + 1.0).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)

    def model() -> keras.Model:
        keras.utils.set_random_seed(7)
        with strategy.scope():
            built = keras.Sequential(
                [keras.Input((2,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)]
            )
            built.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
        return built

    class Steps(keras.callbacks.Callback):
        def __init__(self, fail_at: tuple[int, int] | None = None) -> None:
            super().__init__()
            self.fail_at, self.epoch, self.seen = fail_at, -1, []

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            self.seen.append((self.epoch, batch))
            if (self.epoch, batch) == self.fail_at:
                raise RuntimeError("simulated node loss")

    result: dict = {}
    steps = Steps()
    try:
        tfk.fit(model(), data, epochs=2, model_dir=own_dir, callbacks=[steps], verbose=0)
    except ConfigError as err:
        result["unshared_error"] = f"ConfigError: {err}"
    result["trained_before_error"] = len(steps.seen)
    steps = Steps(fail_at=(1, 4))
    try:
        tfk.fit(model(), data, epochs=2, model_dir=shared_dir, checkpoint_every_steps=3, callbacks=[steps], verbose=0)
    except RuntimeError:
        result["interrupted"] = steps.seen
    steps = Steps()
    resumed = model()
    tfk.fit(resumed, data, epochs=2, model_dir=shared_dir, checkpoint_every_steps=3, callbacks=[steps], verbose=0)
    result["resumed"] = steps.seen
    result["resumed_weights"] = [w.tolist() for w in resumed.get_weights()]
    with open(out_path, "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    worker(*sys.argv[1:4])
