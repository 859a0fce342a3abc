"""The demo's parts without Spark: progress reports, console, data helpers, CLI checks."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from tfonspark import demo
from tfonspark.demo import cli, limit_rows, shard, to_features
from tfonspark.demo.progress import Console, format_progress, progress_message, result_message
from tfonspark.driver.nodes.reports import Report
from tfonspark.errors import ConfigError
from tfonspark.tfprocess.report import report_payload

pytestmark = pytest.mark.timeout(60)


# ---- progress reports ---------------------------------------------------------------------------


def progress(**overrides):
    """A stand-in for tfonspark.keras.Progress (same attributes)."""
    fields = dict(
        epoch=1,
        step=40,
        steps=100,
        logs={"loss": 0.25, "accuracy": 0.9},
        rows=2560,
        seconds=2.0,
        epoch_end=False,
        global_rows=None,
        worker=0,
    )
    fields.update(overrides)
    value = SimpleNamespace(**fields)
    value.rows_per_sec = fields["rows"] / fields["seconds"]
    return value


def test_a_progress_message_is_a_valid_report():
    message = progress_message(progress(logs={"loss": np.float32(0.25), "accuracy": 0.9, "note": "x"}))
    assert report_payload(message) == {
        "kind": "progress",
        "epoch": 1,
        "step": 40,
        "steps": 100,
        "epoch_end": False,
        "rows_per_sec": 1280.0,
        "global_rows": None,
        "logs": {"loss": 0.25, "accuracy": 0.9},
    }


def test_the_result_is_small_whatever_the_test_set():
    matrix = np.diag(np.full(10, 60_000 // 10))  # a 60,000-image test set
    message = result_message({"loss": [np.float32(0.5), 0.25], "val_accuracy": [0.9, 0.95]}, matrix)
    assert report_payload(message) == message
    assert message["confusion"][3][3] == 6000 and message["history"]["loss"] == [0.5, 0.25]
    assert len(json.dumps(message)) < 1000


def test_pairs_reproduce_the_confusion_matrix():
    from tfonspark.demo.plots import confusion_matrix

    counts = np.array([[3, 1, 0], [0, 2, 2], [1, 0, 5]])
    labels, predictions = cli._pairs(counts)
    assert np.array_equal(confusion_matrix(labels, predictions, 3), counts)


def test_format_progress_step_and_epoch_lines():
    step = progress_message(progress())
    assert format_progress(step, 3, {0: 1280.0, 1: 1300.0}) == (
        "epoch 2/3  step 40/100  loss 0.2500  accuracy 0.9000  2580 rows/s (2 nodes)"
    )
    assert format_progress(step, 3, {0: 1280.0}).endswith("1280 rows/s (1 node)")
    end = progress_message(
        progress(step=100, epoch_end=True, global_rows=12800, logs={"loss": 0.2, "val_accuracy": 0.95})
    )
    line = format_progress(end, 3, {})
    assert line.startswith("epoch 2/3  step 100/100  done: loss 0.2000  val_accuracy 0.9500")
    assert "rows/s (all nodes" in line


# ---- the demo's console -------------------------------------------------------------------------


def report(index: int, metrics: dict) -> Report:
    return Report("worker", index, metrics)


def test_console_prints_the_chief_sums_rates_and_keeps_the_result(capsys):
    console = Console(epochs=2)
    console(report(1, progress_message(progress(rows=3000))))
    console(report(0, progress_message(progress())))
    console(report(0, progress_message(progress(step=100, epoch_end=True, global_rows=12800))))
    console(report(1, progress_message(progress(step=100, epoch_end=True, global_rows=12800))))
    assert console.wait_for_result(0.01) is None
    console(report(0, {"kind": "result", "history": {}}))
    console(report(0, {"kind": "something else"}))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines  # worker 1 is summed into the rate, not printed
    assert "2780 rows/s (2 nodes)" in lines[0] and "done:" in lines[1]
    assert console.trained_rows == 12800
    assert console.wait_for_result(0.01) == {"kind": "result", "history": {}}


# ---- data helpers -------------------------------------------------------------------------------


def test_to_features_flattens_and_scales():
    images = np.array([[[0, 255], [51, 102]]], dtype=np.uint8)
    features = to_features(images)
    assert features.dtype == np.float32 and features.shape == (1, 4)
    np.testing.assert_allclose(features, [[0.0, 1.0, 0.2, 0.4]], rtol=1e-6)


def test_limit_rows_is_a_fixed_random_subset():
    images = np.arange(100, dtype=np.uint8).reshape(100, 1, 1)
    labels = np.arange(100) % 10
    small, small_labels = limit_rows(images, labels, 30)
    again, _ = limit_rows(images, labels, 30)
    assert len(small) == 30 and np.array_equal(small, again)
    assert np.array_equal(small.ravel() % 10, small_labels)
    assert len(np.unique(small_labels)) > 5  # drawn at random, not the first 30
    assert limit_rows(images, labels, None)[0] is images
    with pytest.raises(ConfigError, match="max_rows"):
        limit_rows(images, labels, 0)


def test_shards_partition_the_rows():
    rows = np.arange(11)
    parts = [shard(rows, i, 3) for i in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == rows.tolist()
    assert [len(p) for p in parts] == [4, 4, 3]
    with pytest.raises(ConfigError, match="shard index"):
        shard(rows, 3, 3)


# ---- CLI ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--epochs", "--batch-size", "--max-train-rows", "--nodes"])
def test_main_refuses_counts_below_one_before_starting_spark(option, capsys):
    assert demo.main([option, "0"]) == 1
    err = capsys.readouterr().err
    assert f"ConfigError: {option} must be >= 1. Received: {option}=0" in err


def test_main_reports_a_missing_data_directory(tmp_path, capsys):
    assert demo.main(["--data", str(tmp_path / "nowhere")]) == 1
    assert "data directory does not exist" in capsys.readouterr().err


def test_recipe_defaults_depend_on_the_data_size():
    dataset = SimpleNamespace(
        image_shape=(28, 28),
        num_classes=10,
        test_images=np.zeros((1, 28, 28), np.uint8),
        test_labels=np.zeros(1, np.uint8),
    )
    args = cli._parse_args([])
    small = cli._node_args(args, dataset, 1438, threads=1)
    assert (small.epochs, small.global_batch, small.steps_per_epoch) == (10, 64, 22)
    large = cli._node_args(args, dataset, 60_000, threads=1)
    assert (large.epochs, large.global_batch, large.steps_per_epoch) == (3, 128, 468)
    assert large.log_every_steps == 117
    explicit = cli._node_args(cli._parse_args(["--epochs", "2", "--batch-size", "100"]), dataset, 60_000, threads=1)
    assert (explicit.epochs, explicit.global_batch, explicit.steps_per_epoch) == (2, 100, 600)


def test_importing_the_demo_does_not_import_tensorflow():
    import subprocess
    import sys

    code = "import sys, tfonspark.demo; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_model_takes_flat_images_and_returns_logits():
    pytest.importorskip("keras")
    model = demo.build_model((28, 28), 10, total_steps=10)
    assert model.input_shape == (None, 784)
    assert tuple(model(np.zeros((3, 784), np.float32)).shape) == (3, 10)
    assert model.compiled and model.optimizer is not None


def test_the_public_names_are_the_package_s():
    assert demo.__all__ == sorted(demo.__all__)
    assert all(hasattr(demo, name) for name in demo.__all__)
    assert demo.to_features is to_features and demo.DEFAULT_MASTER == "local-cluster[2,1,1024]"


def test_python_m_tfonspark_demo_runs_the_cli():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "tfonspark.demo", "--epochs", "0"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1 and "--epochs must be >= 1" in out.stderr


def test_the_demo_evaluation_never_calls_the_model_on_zero_rows():
    from tfonspark.demo.node import predict_classes

    sizes: list[int] = []

    def model(features, training):
        assert len(features) > 0, "called on an empty batch"
        sizes.append(len(features))
        return np.eye(3)[np.full(len(features), 2)]

    assert predict_classes(model, np.zeros((2001, 4), np.float32)).tolist() == [2] * 2001
    assert sizes == [1000, 1000, 1]
    assert predict_classes(model, np.zeros((0, 4), np.float32)).shape == (0,) and sizes == [1000, 1000, 1]
