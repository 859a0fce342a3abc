"""tfonspark.keras.fit on two real TF worker processes (MWMS over 127.0.0.1, no Spark).

Phase 1 trains 4 epochs with checkpoints and exports; phase 2 starts two fresh processes on the
same model_dir with ``epochs=5`` and uneven per-worker input, and must run only the 5th epoch.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from .conftest import run_tf_workers

WORKER = Path(__file__).with_name("keras_worker.py")
TIMEOUT_S = 300  # a hang guard: two MWMS workers on 2 busy cores took over 60 s (load ~9)


def _run_cluster(phase: str, tmp: Path, **extra_env: str) -> list[dict]:
    """Start two workers with TF_CONFIG, wait for both, return their JSON results by task id."""
    return run_tf_workers(
        WORKER,
        lambda i: [phase, tmp / "model", tmp / "export", tmp / f"{phase}-{i}.json"],
        tmp,
        timeout=TIMEOUT_S,
        **extra_env,
    )


def test_two_workers_train_identically_resume_and_export(tmp_path):
    tf = pytest.importorskip("tensorflow")
    first = _run_cluster("train", tmp_path)

    # identical start (MWMS broadcasts worker 0's initial values) and identical end
    assert first[0]["start_weights"] == first[1]["start_weights"]
    for a, b in zip(first[0]["weights"], first[1]["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    kernel, bias = (np.array(w) for w in first[0]["weights"])
    np.testing.assert_allclose(kernel.ravel(), [3.0, 2.0], atol=0.05)
    np.testing.assert_allclose(bias, [1.0], atol=0.05)

    # epoch logs are global, hence the same on both nodes
    assert first[0]["history"] == first[1]["history"]
    assert set(first[0]["history"]) == {"loss", "mae", "val_loss", "val_mae"}
    assert first[0]["epochs_run"] == [0, 1, 2, 3]
    losses = first[0]["history"]["loss"]
    assert losses[-1] < losses[0] / 100
    assert [(p["step"], p["global_rows"]) for p in first[0]["progress"]] == [(8, 512)] * 4
    assert [node["iterations"] for node in first] == [32, 32]  # running out of data is no step

    # only the chief exported; the other node's scratch export and checkpoints are gone
    assert first[0]["is_chief"] and not first[1]["is_chief"]
    assert first[0]["exported"] == str(tmp_path / "export") and first[1]["exported"] is None
    assert not [p.name for p in (tmp_path / "scratch").iterdir() if "tfonspark" in p.name]
    checkpoints = sorted(os.listdir(tmp_path / "model" / "checkpoints"))
    assert "ckpt-4.index" in checkpoints and "ckpt-1.index" not in checkpoints  # max_to_keep=3
    served = tf.saved_model.load(str(tmp_path / "export"))
    x = np.array([[1.0, 2.0], [-1.0, 0.5]], dtype="float32")
    np.testing.assert_allclose(served.serve(tf.constant(x)).numpy(), x @ kernel + bias, atol=1e-5)

    second = _run_cluster("resume", tmp_path)
    for node in second:
        assert node["epochs_run"] == [4]
        assert len(node["history"]["loss"]) == 1
        assert node["start_weights"] == first[0]["weights"]  # restored, not re-initialised
        # uneven input: 8 and 7 batches; both nodes run 8 steps, 256 + 224 rows
        assert node["progress"] == [{"epoch": 4, "step": 8, "global_rows": 480}]
        assert node["iterations"] == 40  # the restored 32 and this epoch's 8 (uneven input: not 9)
    for a, b in zip(second[0]["weights"], second[1]["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert second[0]["history"]["loss"][0] < losses[-1]


@pytest.mark.slow
def test_two_workers_train_a_tf_keras_model_with_its_own_fit(tmp_path):
    pytest.importorskip("tf_keras")
    nodes = _run_cluster("legacy", tmp_path, TF_USE_LEGACY_KERAS="1")
    assert all(node["uses_tf_keras"] for node in nodes)
    assert nodes[0]["history"] == nodes[1]["history"]
    assert len(nodes[0]["history"]["loss"]) == 3
    for a, b in zip(nodes[0]["weights"], nodes[1]["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    kernel, bias = (np.array(w) for w in nodes[0]["weights"])
    np.testing.assert_allclose(kernel.ravel(), [3.0, 2.0], atol=0.2)
    np.testing.assert_allclose(bias, [1.0], atol=0.2)
