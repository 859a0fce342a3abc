"""Parameter-server against MultiWorkerMirroredStrategy training on the same executors: steps/s and accuracy.

    python benchmarks/ps_vs_mwms.py              # 1000 steps of 128 rows, each way
    python benchmarks/ps_vs_mwms.py --quick      # smoke run: 40 steps of 64 rows on 4,000 rows

Both train the demo CNN (``tfonspark.demo.build_model``: Adam, cosine decay over ``--steps``) on
MNIST (``--data``) with 2 workers, on
the same Spark master (``--master``, default ``local[3]``), for the same number of steps with the
same global batch, i.e. the same rows:

* **PS**: ``examples/mnist/mnist_ps.py`` as a subprocess: ``tfonspark.ps_cluster`` with 2 workers
  and 1 ps, the driver as coordinator. A step is one batch of ``--batch-size`` rows on one
  worker, applied to the variables on the ps asynchronously.
* **MWMS**: ``tfonspark.run`` with 2 nodes and ``tfonspark.keras.fit`` under
  ``MultiWorkerMirroredStrategy``. A step is ``--batch-size / 2`` rows on each node, the
  gradients all-reduced, the same update applied on both.

Both read the same files (written once by this process) through the example's ``dataset_fn``
(the whole training set, shuffled in each worker's own order). Steps/s count the steps after
the first 10 (tracing, first connections); "train s" is every step. Both models are evaluated
on the 10,000 test images in this process by the example's ``evaluate``. With ``--reps K`` the
two alternate (the order rotates) and the table shows each rep. The table ends with the command
and the load average (``/proc/loadavg``) before and after.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import HELP, default_data  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "mnist" / "mnist_ps.py"
QUICK = {"steps": 40, "batch_size": 64, "max_train_rows": 4000}


def load_example() -> Any:
    """``examples/mnist/mnist_ps.py`` as a module, pickled by value (the executors cannot import it)."""
    from pyspark import cloudpickle

    spec = importlib.util.spec_from_file_location("mnist_ps", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mnist_ps"] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


mnist_ps = load_example()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=default_data(), help=f"MNIST idx directory ({HELP})")
    parser.add_argument("--master", default="local[3]", help="Spark master of both runs (default: local[3])")
    parser.add_argument("--steps", type=int, default=1000, help="training steps of each run (default: 1000)")
    parser.add_argument("--batch-size", type=int, default=128, help="global batch: rows per step (default: 128)")
    parser.add_argument("--max-train-rows", type=int, help="use only the first N training rows (default: all)")
    parser.add_argument("--reps", type=int, default=1, help="repetitions of each run, alternating (default: 1)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: " + ", ".join(f"{k}={v}" for k, v in QUICK.items())
    )
    args = parser.parse_args(argv)
    given = argv if argv is not None else sys.argv
    for name, value in QUICK.items():
        if args.quick and f"--{name.replace('_', '-')}" not in given:
            setattr(args, name, value)
    if args.steps <= mnist_ps.WARMUP_STEPS:
        parser.error(f"--steps must be more than {mnist_ps.WARMUP_STEPS} (the untimed warm-up steps)")
    return args


# ---- PS: the example, in its own process (TF's coordinator stays for the life of its process) -------------
def run_ps(args: argparse.Namespace, work: Path, rep: int) -> dict[str, Any]:
    """``mnist_ps.py`` on the written data; its metrics.json."""
    out = work / f"ps-{rep}"
    command = [sys.executable, str(EXAMPLE), "--data", args.data, "--master", args.master]
    command += ["--steps", str(args.steps), "--batch-size", str(args.batch_size)]
    command += ["--work-dir", str(work / "data"), "--output-dir", str(out)]
    if args.max_train_rows:
        command += ["--max-train-rows", str(args.max_train_rows)]
    print(f"$ {shlex.join(command)}", file=sys.stderr, flush=True)
    subprocess.run(command, check=True, cwd=work, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    metrics: dict[str, Any] = json.loads((out / "metrics.json").read_text())
    return metrics


# ---- MWMS: tfonspark.run + tfonspark.keras.fit, from this process ----------------------------------------
def mwms_node(args: dict[str, Any], ctx: Any) -> None:
    """Runs on each node: fit the demo CNN for ``steps`` steps; the chief writes weights and timings."""
    from tfonspark import distribute

    strategy = distribute.strategy()  # before any other TensorFlow op
    import numpy as np

    from tfonspark.demo import build_model
    from tfonspark.keras import fit

    with strategy.scope():
        model = build_model(total_steps=args["steps"])
    timer = _step_timer(mnist_ps.WARMUP_STEPS)
    per_node = args["batch_size"] // ctx.num_workers
    dataset_fn = mnist_ps.make_dataset_fn(args["paths"], per_node)
    fit(model, dataset_fn, epochs=1, steps_per_epoch=args["steps"], callbacks=[timer], verbose=0)
    if ctx.is_chief:
        np.savez(os.path.join(args["out"], "weights.npz"), *model.get_weights())
        steady = args["steps"] - mnist_ps.WARMUP_STEPS
        timings = {"train_seconds": timer.end - timer.begin, "steps_per_second": steady / (timer.end - timer.warm)}
        with open(os.path.join(args["out"], "timings.json"), "w") as f:
            json.dump(timings, f)


def _step_timer(warmup: int) -> Any:
    """A Keras callback noting when training begins, when step ``warmup`` ends, and when training ends."""
    import keras

    class StepTimer(keras.callbacks.Callback):
        begin = warm = end = 0.0

        def on_train_begin(self, logs: Any = None) -> None:
            self.begin = time.monotonic()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == warmup - 1:
                self.warm = time.monotonic()

        def on_train_end(self, logs: Any = None) -> None:
            self.end = time.monotonic()

    return StepTimer()


def run_mwms(args: argparse.Namespace, work: Path, rep: int, paths: dict[str, str], data: Any) -> dict[str, Any]:
    """Two MWMS nodes on a fresh Spark context; the chief's timings and the test accuracy here."""
    import numpy as np

    import tfonspark
    from tfonspark.demo import spark_context, stop_spark

    out = work / f"mwms-{rep}"
    out.mkdir()
    node_args = {"steps": args.steps, "batch_size": args.batch_size, "paths": paths, "out": str(out)}
    sc = spark_context(args.master, "ps_vs_mwms")
    try:
        cluster = tfonspark.run(sc, mwms_node, node_args, 2, reservation_timeout=300)
        cluster.shutdown(timeout=3600)
    finally:
        stop_spark(sc)
    with np.load(out / "weights.npz") as saved:
        weights = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    timings: dict[str, Any] = json.loads((out / "timings.json").read_text())
    return {**timings, "test_accuracy": mnist_ps.evaluate(mnist_ps.local_model(weights), data)}


# ---- the run and the table -----------------------------------------------------------------------------
def loadavg() -> str:
    """The first three fields of /proc/loadavg (1, 5, 15 minutes)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_all(args: argparse.Namespace, work: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Write the data once; run PS and MWMS ``--reps`` times, alternating; (PS, MWMS) per rep."""
    from tfonspark.demo.datasets import load_mnist

    data = load_mnist(args.data)
    rows = min(args.max_train_rows or len(data.train_labels), len(data.train_labels))
    paths = mnist_ps.write_training_data(data, rows, str(work / "data"))
    runners: dict[str, Callable[[int], dict[str, Any]]] = {
        "PS": lambda rep: run_ps(args, work, rep),
        "MWMS": lambda rep: run_mwms(args, work, rep, paths, data),
    }
    results = []
    for rep in range(args.reps):
        done: dict[str, dict[str, Any]] = {}
        for name in ("PS", "MWMS") if rep % 2 == 0 else ("MWMS", "PS"):
            started = time.monotonic()
            done[name] = runners[name](rep)
            print(
                f"rep {rep + 1} {name}: {_summary(done[name])}, {time.monotonic() - started:.0f} s in all", flush=True
            )
        results.append((done["PS"], done["MWMS"]))
    return results


def _summary(result: dict[str, Any]) -> str:
    return (
        f"{result['steps_per_second']:.2f} steps/s, train {result['train_seconds']:.1f} s, "
        f"test accuracy {result['test_accuracy']:.4f}"
    )


def table(results: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """The Markdown table: both runs' steps/s side by side, their ratio, train seconds, accuracies."""
    lines = [
        "| rep | PS steps/s | MWMS steps/s | PS / MWMS | PS train s | MWMS train s | PS accuracy | MWMS accuracy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rep, (ps, mwms) in enumerate(results, start=1):
        lines.append(
            f"| {rep} | {ps['steps_per_second']:.2f} | {mwms['steps_per_second']:.2f} | "
            f"**{ps['steps_per_second'] / mwms['steps_per_second']:.2f}x** | {ps['train_seconds']:.1f} | "
            f"{mwms['train_seconds']:.1f} | {ps['test_accuracy']:.2%} | {mwms['test_accuracy']:.2%} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both ways, print the table with the command, the machine and its load."""
    args = parse_args(argv)
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="ps-vs-mwms-") as tmp:
        results = run_all(args, Path(tmp))
    command = shlex.join(["python", "benchmarks/ps_vs_mwms.py", *(argv if argv is not None else sys.argv[1:])])
    print(
        f"\n`{command}`: {args.steps} steps x global batch {args.batch_size}, 2 workers on {args.master} "
        f"(PS: + 1 ps, driver coordinator); {os.cpu_count()} CPU cores; "
        f"load (/proc/loadavg 1/5/15 min) before {load_before}, after {loadavg()}\n"
    )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
