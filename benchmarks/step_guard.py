"""What the 0-row guard costs a training step: the demo's MNIST CNN with and without it.

    python benchmarks/step_guard.py                      # 200 timed steps, 6 alternating reps
    python benchmarks/step_guard.py --steps 500 --reps 4 --data DIR

``tfonspark.keras.fit`` runs each replica's ``train_step`` inside ``tf.cond(rows > 0, ...)``
with the optimizer update made after the cond (``tfonspark.distribute.replica_steps``), so that
a replica with a 0-row batch never runs the model (issue 20). This times that step against the
step as it was before, ``strategy.run(model.train_step, ...)`` in a ``tf.function``, on the
same model, data and strategy (the process's one-worker ``MultiWorkerMirroredStrategy``):

* ``plain``: the old step (no guard);
* ``guarded``: the step ``fit`` runs now.

Each run builds a fresh demo CNN (:func:`tfonspark.demo.build_model`, Adam, global batch 128)
over real MNIST (``--data``, else ``$TFONSPARK_DATA``), traces
and runs ``--warmup`` untimed steps, then times ``--steps`` steps, wall clock and the process's
CPU time. Variants alternate within each repetition (the order rotates) and medians are
reported with the ``plain`` runs' spread as the noise floor. Prints one line per run and the
ratio guarded / plain.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from tfonspark.demo import build_model
from tfonspark.demo.datasets import load_mnist
from tfonspark.distribute import replica_steps, strategy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import HELP, default_data  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BATCH = 128


def _plain_step(model: Any) -> Callable[[Any], Any]:
    """The replica step before the guard: the model's train_step on whatever batch arrives."""

    def replica_step(data: Any) -> Any:
        with tf.control_dependencies(tf.nest.flatten(data)):
            return model.train_step(data), tf.shape(tf.nest.flatten(data)[0])[0]

    return replica_step


VARIANTS: dict[str, Callable[[Any], Callable[[Any], Any]]] = {
    "plain": _plain_step,
    "guarded": replica_steps.guarded_train_step,
}


def _dataset(data_dir: Path) -> tf.data.Dataset:
    mnist = load_mnist(data_dir)
    images = mnist.train_images.reshape(len(mnist.train_images), -1).astype("float32") / 255.0
    return tf.data.Dataset.from_tensor_slices((images, mnist.train_labels.astype("int64"))).batch(BATCH).repeat()


def _run(variant: str, dataset: tf.data.Dataset, warmup: int, steps: int) -> tuple[float, float]:
    """(wall ms/step, CPU ms/step) of ``steps`` timed steps after ``warmup`` untimed ones."""
    strat = strategy()
    keras.utils.set_random_seed(0)
    with strat.scope():
        model = build_model(total_steps=warmup + steps)
    replica_step = VARIANTS[variant](model)
    iterator = iter(strat.experimental_distribute_dataset(dataset))

    @tf.function
    def one_step(it: Any) -> Any:
        return strat.run(replica_step, args=(next(it),))

    for _ in range(warmup):
        one_step(iterator)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        outputs = one_step(iterator)
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, outputs)  # wait for the last
    return (time.perf_counter() - wall) * 1e3 / steps, (time.process_time() - cpu) * 1e3 / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=default_data(), help=f"MNIST idx directory ({HELP})")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="20 steps, 1 rep (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.reps = 20, 3, 1
    strategy()  # before any other TensorFlow op
    dataset = _dataset(Path(args.data))
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    order = list(VARIANTS)
    for rep in range(args.reps):
        for variant in itertools.islice(itertools.cycle(order), rep % len(order), rep % len(order) + len(order)):
            wall, cpu = _run(variant, dataset, args.warmup, args.steps)
            results[variant].append((wall, cpu))
            load = os.getloadavg()[0]
            print(f"rep {rep + 1} {variant:8s} {wall:7.2f} ms/step wall {cpu:7.2f} ms/step CPU (load {load:.1f})")
    plain = [w for w, _ in results["plain"]]
    print()
    print("| variant | wall ms/step (median) | CPU ms/step (median) | runs |")
    print("|---|---:|---:|---:|")
    medians = {}
    for variant, runs in results.items():
        medians[variant] = (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        print(f"| {variant} | {medians[variant][0]:.2f} | {medians[variant][1]:.2f} | {len(runs)} |")
    wall_ratio = medians["guarded"][0] / medians["plain"][0]
    cpu_ratio = medians["guarded"][1] / medians["plain"][1]
    print()
    print(f"guarded / plain: {wall_ratio:.3f}x wall, {cpu_ratio:.3f}x CPU per step")
    if len(plain) > 1:
        print(f"noise floor: the plain runs span {100 * (max(plain) / min(plain) - 1):.1f}% among themselves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
