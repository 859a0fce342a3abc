"""Test accuracy of the MNIST examples on 2 nodes, side by side with one plain Keras process.

    python benchmarks/accuracy.py                      # MNIST and Fashion-MNIST, both modes
    python benchmarks/accuracy.py --datasets mnist --epochs 3

For each dataset (idx files under ``--mnist`` and ``--fashion``,
or ``--mnist`` / ``--fashion``) it trains the demo CNN (:func:`tfonspark.demo.build_model`)

* in this process with plain Keras ``model.fit`` (same global batch, epochs and learning-rate
  schedule; TensorFlow's default threads, i.e. all cores), and
* with ``examples/mnist/mnist_tf.py`` (InputMode.TENSORFLOW) and ``mnist_spark.py``
  (InputMode.SPARK), each run as a subprocess on an embedded ``local-cluster[2,1,1024]``
  (two executors with one core each, one TensorFlow node per executor);

then evaluates every exported SavedModel on the test set here, and prints a Markdown table:
accuracy, the difference to plain Keras in points, steps per epoch, and wall times. "train s" is
``model.fit`` for plain Keras and ``tfonspark.run`` .. ``cluster.shutdown`` for the cluster (TF
process start-up, data loading, training, per-epoch validation and export; Spark start-up
excluded). Both cluster runs do the same work: ``train rows // global batch`` steps per epoch,
each of one full global batch (plain Keras also trains the last, partial batch of each epoch).

Checks (exit status 1 if one fails): MNIST >= 99.0% in both modes, Fashion-MNIST >= 90.0%, and
every cluster run within 0.3 points of plain Keras.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import HELP, default_data  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "mnist"
MIN_ACCURACY = {"mnist": 0.990, "fashion": 0.900}
MAX_GAP_POINTS = 0.3
MODES = {"tensorflow": "mnist_tf.py", "spark": "mnist_spark.py"}


@dataclass
class Result:
    """One training run: where, how accurate, how long."""

    dataset: str
    run: str
    accuracy: float
    train_seconds: float
    total_seconds: float
    node_accuracy: float | None = None
    steps_per_epoch: int | None = None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mnist", default=default_data("mnist"), help=f"MNIST idx directory ({HELP})")
    parser.add_argument("--fashion", default=default_data("fashion"), help=f"Fashion-MNIST idx directory ({HELP})")
    parser.add_argument("--datasets", default="mnist,fashion", help="comma-separated: mnist, fashion (default: both)")
    parser.add_argument(
        "--modes", default="tensorflow,spark", help="comma-separated cluster runs: tensorflow, spark (default: both)"
    )
    parser.add_argument("--epochs", type=int, default=5, help="epochs (default: 5)")
    parser.add_argument("--batch-size", type=int, default=128, help="global batch (default: 128)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of every run (default: 0)")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain Keras runs")
    parser.add_argument("--work-dir", help="where exports go (default: a temporary directory)")
    return parser.parse_args(argv)


def load(data_dir: str) -> tuple:
    """(train features, train labels, test features, test labels): flat float32 in [0, 1]."""
    from tfonspark.demo import to_features
    from tfonspark.demo.datasets import load_mnist

    data = load_mnist(data_dir)
    return (
        to_features(data.train_images),
        data.train_labels.astype("int64"),
        to_features(data.test_images),
        data.test_labels.astype("int64"),
    )


def accuracy_of(predict, features, labels) -> float:  # noqa: ANN001 - any callable on arrays
    """Fraction of test rows whose argmax logit is the label (batches of 1000)."""
    import numpy as np

    hits = 0
    for start in range(0, len(features), 1000):
        logits = np.asarray(predict(features[start : start + 1000]))
        hits += int((logits.argmax(axis=1) == labels[start : start + 1000]).sum())
    return hits / len(labels)


def train_plain(name: str, data: tuple, args: argparse.Namespace) -> Result:
    """The same model, epochs, batch and schedule in this one process with ``model.fit``."""
    import keras
    import tensorflow as tf

    from tfonspark.demo import build_model

    x, y, xt, yt = data
    epochs, batch = args.epochs, args.batch_size
    keras.utils.set_random_seed(args.seed)
    model = build_model(total_steps=epochs * (len(x) // batch))
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).batch(batch).prefetch(2)
    test = tf.data.Dataset.from_tensor_slices((xt, yt)).batch(batch)
    started = time.monotonic()
    model.fit(train, epochs=epochs, validation_data=test, verbose=2)
    seconds = time.monotonic() - started
    accuracy = accuracy_of(lambda b: model(b, training=False), xt, yt)
    steps = -(-len(x) // batch)  # the last batch of each epoch is partial
    return Result(name, "plain Keras, 1 process", accuracy, seconds, seconds, steps_per_epoch=steps)


def train_cluster(name: str, data_dir: str, mode: str, args: argparse.Namespace, work: Path, test: tuple) -> Result:
    """Run one example as a subprocess; evaluate its exported SavedModel here."""
    import tensorflow as tf

    out = work / f"{name}-{mode}"
    command = [
        sys.executable,
        str(EXAMPLES / MODES[mode]),
        "--data",
        data_dir,
        "--epochs",
        str(args.epochs),
        "--batch-size",
        str(args.batch_size),
        "--seed",
        str(args.seed),
        "--output-dir",
        str(out),
    ]
    print(f"$ {shlex.join(command)}", flush=True)
    started = time.monotonic()
    subprocess.run(command, check=True, cwd=work)
    total = time.monotonic() - started
    metrics = json.loads((out / "metrics.json").read_text())
    served = tf.saved_model.load(str(out / "export"))
    accuracy = accuracy_of(lambda b: served.serve(tf.constant(b)), *test)
    return Result(
        name,
        f"tfonspark {mode.upper()}, {metrics['nodes']} nodes",
        accuracy,
        metrics["cluster_seconds"],
        total,
        metrics["test_accuracy"],
        metrics.get("steps_per_epoch"),
    )


def table(results: list[Result]) -> str:
    """The Markdown table: accuracy, gap to plain Keras, wall times and their ratio."""
    lines = [
        "| dataset | run | test accuracy | vs plain (points) | steps/epoch | train s | train s / plain |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    plain = {r.dataset: r for r in results if r.run.startswith("plain")}
    for r in results:
        base = plain.get(r.dataset)
        gap = f"{100 * (r.accuracy - base.accuracy):+.2f}" if base and base is not r else ""
        ratio = f"{r.train_seconds / base.train_seconds:.2f}" if base else ""
        steps = "" if r.steps_per_epoch is None else str(r.steps_per_epoch)
        lines.append(
            f"| {r.dataset} | {r.run} | {r.accuracy:.2%} | {gap} | {steps} | {r.train_seconds:.0f} | {ratio} |"
        )
    return "\n".join(lines)


def failures(results: list[Result]) -> list[str]:
    """The checks that did not pass, as sentences."""
    plain = {r.dataset: r for r in results if r.run.startswith("plain")}
    found = []
    for r in results:
        if r.run.startswith("plain"):
            continue
        floor = MIN_ACCURACY[r.dataset]
        if r.accuracy < floor:
            found.append(f"{r.dataset} {r.run}: {r.accuracy:.2%} < {floor:.1%}")
        base = plain.get(r.dataset)
        if base and abs(r.accuracy - base.accuracy) * 100 > MAX_GAP_POINTS:
            found.append(
                f"{r.dataset} {r.run}: {100 * (r.accuracy - base.accuracy):+.2f} "
                f"points from plain Keras (limit {MAX_GAP_POINTS})"
            )
    return found


def run(args: argparse.Namespace, work: Path) -> list[Result]:
    """Every requested run, plain Keras first for each dataset."""
    results = []
    for name in [d.strip() for d in args.datasets.split(",") if d.strip()]:
        data_dir = os.path.abspath(getattr(args, name))
        data = load(data_dir)
        if not args.no_plain:
            results.append(train_plain(name, data, args))
            print(results[-1], flush=True)
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            results.append(train_cluster(name, data_dir, mode, args, work, data[2:]))
            print(results[-1], flush=True)
    return results


class LoadSampler:
    """The 1-minute load average, sampled every 10 s while the benchmark runs."""

    def __init__(self) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(10):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> str:
        """Stop sampling; describe the samples."""
        self._stop.set()
        mean = sum(self.samples) / len(self.samples)
        return f"load average (1 min) mean {mean:.1f}, max {max(self.samples):.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print the table with the command and the load average, check the thresholds."""
    args = parse_args(argv)
    sampler = LoadSampler()
    with tempfile.TemporaryDirectory(prefix="tfos-accuracy-") as tmp:
        work = Path(args.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = run(args, work)
    command = shlex.join(["python", "benchmarks/accuracy.py", *(argv or sys.argv[1:])])
    print(
        f"\n`{command}`: {args.epochs} epochs, global batch {args.batch_size}, "
        f"{os.cpu_count()} CPU cores, {sampler.stop()}\n"
    )
    print(table(results))
    problems = failures(results)
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
