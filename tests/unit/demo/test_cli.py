"""demo/cli.py: the demo's command line, its checks before Spark starts, and its recipe defaults."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tfonspark import demo
from tfonspark.demo import cli

pytestmark = pytest.mark.timeout(60)


def test_pairs_reproduce_the_confusion_matrix():
    from tfonspark.demo.plots import confusion_matrix

    counts = np.array([[3, 1, 0], [0, 2, 2], [1, 0, 5]])
    labels, predictions = cli._pairs(counts)
    assert np.array_equal(confusion_matrix(labels, predictions, 3), counts)


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


def test_python_m_tfonspark_demo_runs_the_cli():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "tfonspark.demo", "--epochs", "0"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1 and "--epochs must be >= 1" in out.stderr
