"""examples/mnist and ``python -m tfonspark.demo`` run as users run them: subprocesses that start
their own embedded ``local-cluster[2,1,1024]``.

The MNIST-style data is made here from scikit-learn's bundled digits (1438 train / 359 test
images in MNIST's 28x28 layout, written as gzipped idx files), so nothing is downloaded and the
tests do not depend on ``../shared/data``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.demo.test_datasets import write_idx
from tfonspark.demo.datasets import MNIST_FILES, load_digits_as_mnist

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "mnist"
ACCURACY = re.compile(r"test accuracy: (0\.\d{4})", re.IGNORECASE)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY = ["--max-train-rows", "1000", "--epochs", "1", "--batch-size", "64"]


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MNIST-style directory holding scikit-learn's digits as idx files."""
    pytest.importorskip("sklearn")
    directory = tmp_path_factory.mktemp("digits-idx")
    digits = load_digits_as_mnist()
    for key, stem in MNIST_FILES.items():
        write_idx(directory / f"{stem}.gz", getattr(digits, key))
    return directory


def run(args: list[str], cwd: Path, timeout: float = 240) -> str:
    """Run ``python *args``; its output, or a failure that shows the output's tail."""
    env = {k: v for k, v in os.environ.items() if k != "TFONSPARK_DATA"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        pytest.fail(f"{args[0]} exited with {done.returncode}:\n{output[-4000:]}")
    return output


def printed_accuracy(output: str) -> float:
    match = ACCURACY.search(output)
    assert match, f"no test accuracy printed:\n{output[-2000:]}"
    return float(match.group(1))


@pytest.mark.parametrize("script", ["mnist_tf.py", "mnist_spark.py", "mnist_inference.py", "mnist_ps.py"])
def test_examples_have_help(script: str, tmp_path: Path) -> None:
    output = run([str(EXAMPLES / script), "--help"], tmp_path, timeout=60)
    assert "--data" in output and "--master" in output


def test_demo_has_help(tmp_path: Path) -> None:
    output = run(["-m", "tfonspark.demo", "--help"], tmp_path, timeout=60)
    for option in ("--data", "--out", "--epochs", "--max-train-rows", "--master"):
        assert option in output


@pytest.mark.slow
def test_mnist_tf_trains_exports_and_inference_labels_every_row(digits_dir: Path, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "out"
    trained = run([str(EXAMPLES / "mnist_tf.py"), "--data", str(digits_dir), *TINY, "--output-dir", str(out)], tmp_path)
    accuracy = printed_accuracy(trained)
    assert accuracy > 0.2, trained[-2000:]  # one epoch of 15 steps; chance is 0.1
    assert re.search(r"^epoch 1 \(worker:0\): loss \d\.\d{4}.*  val_accuracy \d\.\d{4}$", trained, re.M), trained[
        -2000:
    ]
    assert (out / "export" / "saved_model.pb").is_file() and (out / "metrics.json").is_file()

    # local[2]: one JVM starts faster, and where the model runs does not matter here
    labelled = run(
        [
            str(EXAMPLES / "mnist_inference.py"),
            "--data",
            str(digits_dir),
            "--export-dir",
            str(out / "export"),
            "--output",
            str(out / "predictions"),
            "--master",
            "local[2]",
        ],
        tmp_path,
    )
    table = pq.read_table(out / "predictions")
    assert table.num_rows == 359  # one prediction per test image
    assert sorted(table.column("id").to_pylist()) == sorted(set(table.column("id").to_pylist()))
    predictions = table.column("prediction").to_pylist()
    assert set(predictions) <= set(range(10))
    correct = sum(p == y for p, y in zip(predictions, table.column("label").to_pylist()))
    # the same model on the same test set as the nodes' final validation
    assert abs(correct / 359 - accuracy) < 0.003, labelled[-2000:]
    assert f"wrote 359 predictions to {out / 'predictions'}" in labelled


@pytest.mark.slow
def test_mnist_spark_feeds_a_dataframe(digits_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    output = run(
        [str(EXAMPLES / "mnist_spark.py"), "--data", str(digits_dir), *TINY, "--output-dir", str(out)], tmp_path
    )
    assert printed_accuracy(output) > 0.2, output[-2000:]
    assert "1 epochs x 15 steps, 1000 rows fed, 960 trained" in output
    assert re.search(r"^epoch 1 \(worker:0\): loss \d\.\d{4}.*  val_accuracy \d\.\d{4}$", output, re.M), output[-2000:]
    assert (out / "export" / "saved_model.pb").is_file()


@pytest.mark.slow
def test_mnist_ps_trains_with_the_driver_as_coordinator(digits_dir: Path, tmp_path: Path) -> None:
    """2 workers + 1 ps on local[3], 20 steps scheduled from the driver; evaluated and saved there."""
    out = tmp_path / "out"
    started = time.monotonic()
    output = run(
        [str(EXAMPLES / "mnist_ps.py"), "--data", str(digits_dir), "--steps", "20", "--batch-size", "32"]
        + ["--output-dir", str(out)],
        tmp_path,
        timeout=120,
    )
    seconds = time.monotonic() - started
    assert printed_accuracy(output) > 0.2, output[-2000:]  # 20 steps of 32 rows; chance is 0.1
    assert re.search(r"^step 20/20  loss \d\.\d{4}$", output, re.M), output[-2000:]
    assert "2 workers, 1 ps, driver as coordinator; 20 steps x 32 rows" in output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["variable_devices"] == ["/job:ps/replica:0/task:0/device:CPU:0"], metrics
    assert len(metrics["losses"]) == 20 and (out / "model.keras").is_file()
    print(f"mnist_ps.py, 20 steps: {seconds:.0f} s in all, start-up {metrics['startup_seconds']:.0f} s")


@pytest.mark.slow
def test_demo_falls_back_to_digits_and_draws_its_plots(tmp_path: Path) -> None:
    out = tmp_path / "plots"
    output = run(["-m", "tfonspark.demo", "--epochs", "1", "--max-train-rows", "1000", "--out", str(out)], tmp_path)
    assert "Data: scikit-learn digits" in output and "TFONSPARK_DATA unset" in output
    assert re.search(r"epoch 1/1  step \d+/15  loss \d\.\d{4}  accuracy \d\.\d{4}  \d+ rows/s", output), output[-2000:]
    assert "epoch 1/1  step 15/15  done: " in output
    accuracy = re.search(r"Test accuracy: (\d+\.\d\d)% on 359 scikit-learn digits", output)
    assert accuracy and float(accuracy.group(1)) > 20, output[-2000:]
    for name in ("training_curves.png", "confusion_matrix.png"):
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
