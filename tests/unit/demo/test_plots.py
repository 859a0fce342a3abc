"""tfonspark.demo.plots: the confusion matrix arithmetic and the PNG files the demo writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfonspark.demo import plots
from tfonspark.demo.plots import confusion_matrix, save_confusion_matrix, save_training_curves
from tfonspark.errors import ConfigError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HISTORY = {
    "loss": [1.2, 0.7, 0.45, 0.3],
    "accuracy": [0.6, 0.8, 0.87, 0.91],
    "val_loss": [1.0, 0.65, 0.5, 0.42],
    "val_accuracy": [0.65, 0.79, 0.84, 0.86],
}


def assert_png(path: Path) -> None:
    """A real, non-trivial PNG file."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 5_000


# --------------------------------------------------------------------------- confusion_matrix


def test_confusion_matrix_counts() -> None:
    cm = confusion_matrix([0, 1, 2, 2, 1, 0], [0, 2, 2, 2, 1, 1], 3)
    assert cm.tolist() == [[1, 1, 0], [0, 1, 1], [0, 0, 2]]
    assert cm.dtype == np.int64


def test_confusion_matrix_matches_a_loop() -> None:
    rng = np.random.default_rng(0)
    y_true, y_pred = rng.integers(0, 7, 500), rng.integers(0, 7, 500)
    expected = np.zeros((7, 7), int)
    for t, p in zip(y_true, y_pred, strict=True):
        expected[t, p] += 1
    np.testing.assert_array_equal(confusion_matrix(y_true, y_pred, 7), expected)


def test_confusion_matrix_accepts_uint8_and_integral_floats() -> None:
    cm = confusion_matrix(np.array([3, 3], np.uint8), np.array([3.0, 1.0]), 4)
    assert cm[3, 3] == 1 and cm[3, 1] == 1 and cm.sum() == 2


def test_confusion_matrix_empty() -> None:
    assert confusion_matrix([], [], 2).tolist() == [[0, 0], [0, 0]]


@pytest.mark.parametrize(
    ("y_true", "y_pred", "num_classes", "match"),
    [
        ([0, 1], [0], 2, "same length"),
        ([0, 3], [0, 1], 3, r"outside \[0, 3\)"),
        ([0, -1], [0, 1], 3, "min=-1"),
        ([0, 1], [[0.9, 0.1], [0.2, 0.8]], 2, "argmax"),
        ([0, 1], [0.5, 1.0], 2, "integer"),
        (["a"], [0], 2, "integer"),
        ([0], [0], 0, "num_classes"),
        ([0], [0], True, "num_classes"),
    ],
)
def test_confusion_matrix_rejects_bad_arguments(y_true, y_pred, num_classes, match) -> None:
    with pytest.raises(ConfigError, match=match):
        confusion_matrix(y_true, y_pred, num_classes)


# --------------------------------------------------------------------------- pictures


def test_training_curves_png(tmp_path: Path) -> None:
    path = save_training_curves(HISTORY, tmp_path / "out" / "curves.png")
    assert path == tmp_path / "out" / "curves.png"
    assert_png(path)


def test_training_curves_panels() -> None:
    panels = plots._metric_panels({"accuracy": [0.5], "val_loss": [2.0], "loss": [1.0], "lr": [0.1]})
    assert list(panels) == ["loss", "accuracy", "lr"]
    assert panels["loss"] == ([1.0], [2.0])
    assert panels["accuracy"] == ([0.5], None)


def test_training_curves_without_validation_and_one_epoch(tmp_path: Path) -> None:
    assert_png(save_training_curves({"loss": [0.5], "accuracy": [0.9]}, tmp_path / "c.png"))


def test_training_curves_other_formats(tmp_path: Path) -> None:
    assert save_training_curves(HISTORY, tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")
    no_suffix = save_training_curves(HISTORY, tmp_path / "curves")
    assert no_suffix == tmp_path / "curves"
    assert no_suffix.read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize(
    ("history", "match"),
    [
        ({}, "non-empty mapping"),
        ([0.1, 0.2], "non-empty mapping"),
        ({"loss": []}, "no values"),
        ({"loss": ["x"]}, "sequence of numbers"),
        ({"loss": 0.5}, "sequence of numbers"),
    ],
)
def test_training_curves_reject_bad_history(tmp_path: Path, history, match) -> None:
    with pytest.raises(ConfigError, match=match):
        save_training_curves(history, tmp_path / "c.png")
    assert not (tmp_path / "c.png").exists()


def test_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'xyz'.*png"):
        save_training_curves(HISTORY, tmp_path / "c.xyz")


def test_confusion_matrix_png(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    y_true = rng.integers(0, 10, 1000)
    y_pred = np.where(rng.random(1000) < 0.9, y_true, rng.integers(0, 10, 1000))
    path = save_confusion_matrix(y_true, y_pred, tmp_path / "cm.png", [f"class {i}" for i in range(10)])
    assert path == tmp_path / "cm.png"
    assert_png(path)
    assert_png(save_confusion_matrix(y_true, y_pred, tmp_path / "cm_norm.png", normalize=True))


def test_confusion_matrix_png_class_names_fix_the_size(tmp_path: Path) -> None:
    # labels 0 and 1 only, but three named classes: the picture has a row for each
    assert_png(save_confusion_matrix([0, 1], [1, 1], tmp_path / "cm.png", ["a", "b", "c"]))
    with pytest.raises(ConfigError, match="outside"):
        save_confusion_matrix([0, 5], [1, 1], tmp_path / "bad.png", ["a", "b", "c"])


def test_drawing_leaves_pyplot_alone(tmp_path: Path) -> None:
    """Importing plots loads no matplotlib; drawing loads no pyplot and keeps the backend."""
    code = f"""
import sys, matplotlib
import tfonspark.demo.plots as p
backend = dict.__getitem__(matplotlib.rcParams, "backend")
assert "matplotlib.pyplot" not in sys.modules
p.save_training_curves({{"loss": [1.0, 0.5]}}, {str(tmp_path / "a.png")!r})
p.save_confusion_matrix([0, 1], [0, 1], {str(tmp_path / "b.png")!r})
assert "matplotlib.pyplot" not in sys.modules, "pyplot was imported"
assert dict.__getitem__(matplotlib.rcParams, "backend") == backend
"""
    env = {**os.environ, "PYTHONPATH": str(Path(plots.__file__).parents[2])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    light = "import sys, tfonspark.demo.plots; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", light], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"


def test_exported_members() -> None:
    assert plots.__all__ == sorted(plots.__all__)
    public = {
        name
        for name, value in vars(plots).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == plots.__name__
    }
    assert public == set(plots.__all__)
