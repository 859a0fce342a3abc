"""MNIST with parameter-server training: the driver is the coordinator (``tfonspark.ps_cluster``).

    python examples/mnist/mnist_ps.py --data /path/to/mnist

``tfonspark.ps_cluster(sc, num_workers=2, num_ps=1)`` starts two worker servers and one ps server
on Spark executors (``--master local[3]`` by default: three task slots on this machine) and makes
this driver process the ``chief``. Here, as in TensorFlow's own parameter-server tutorial, the
driver builds the demo CNN under ``ParameterServerStrategy`` (its variables, and Adam's, live on
the ps task), and a ``ClusterCoordinator`` schedules ``--steps`` training steps (a custom
training loop with Keras 3 layers: ``keras.Model.fit`` does not run under this strategy on
Keras 3). Each step trains one batch of ``--batch-size`` rows on whichever worker is free and
updates the variables on the ps asynchronously: no all-reduce, no waiting for the other worker.

The workers read their data themselves. The driver loads the idx files once
(``tfonspark.demo.datasets.load_mnist``) and writes the training images and labels as raw bytes
to ``--work-dir``; each worker's ``dataset_fn`` reads those two files, shuffles the whole
training set in its own random order and repeats it. ``--work-dir`` defaults to a temporary
directory, which every executor of a ``local`` or ``local-cluster`` master can read; on a real
cluster pass a path every executor can read (``hdfs://...``).

After the last step the driver copies the trained weights into a local model, evaluates it on
the 10,000 test images here and prints the test accuracy; it writes ``<output-dir>/metrics.json``
(accuracy, losses, steps/s) and ``<output-dir>/model.keras``. Steps per second are counted
after the first ``WARMUP_STEPS`` steps (tracing the step, the workers' first connections).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

WARMUP_STEPS = 10
LOG_EVERY = 100
IMAGE_PIXELS = 28 * 28


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        default=os.environ.get("TFONSPARK_DATA"),
        help=(
            "directory of the MNIST idx files (train-images-idx3-ubyte, train-labels-idx1-ubyte, "
            "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, gzipped or not), read on the driver "
            "(default: $TFONSPARK_DATA)"
        ),
    )
    parser.add_argument("--master", default="local[3]", help="Spark master URL (default: local[3])")
    parser.add_argument("--workers", type=int, default=2, help="worker tasks (default: 2)")
    parser.add_argument("--ps", type=int, default=1, help="parameter-server tasks (default: 1)")
    parser.add_argument("--steps", type=int, default=1000, help="training steps, one batch each (default: 1000)")
    parser.add_argument("--batch-size", type=int, default=128, help="rows per step (default: 128)")
    parser.add_argument("--max-train-rows", type=int, help="use only the first N training rows (default: all)")
    parser.add_argument(
        "--work-dir", help="where the driver writes the training data for the workers (default: a temp dir)"
    )
    parser.add_argument(
        "--output-dir",
        default="mnist_ps_output",
        help="metrics.json and model.keras go here (default: ./mnist_ps_output)",
    )
    args = parser.parse_args(argv)
    if not args.data:
        parser.error("--data is required (or set TFONSPARK_DATA)")
    if args.steps <= WARMUP_STEPS:
        parser.error(f"--steps must be more than {WARMUP_STEPS} (the untimed warm-up steps)")
    args.output_dir = os.path.abspath(args.output_dir)
    return args


# ---- the data: written once by the driver, read by every worker -----------------------------------------
def write_training_data(data: Any, rows: int, work_dir: str) -> dict[str, str]:
    """The first ``rows`` training images and labels as raw uint8 files in ``work_dir``; their paths."""
    import tensorflow as tf

    tf.io.gfile.makedirs(work_dir)
    paths = {"images": f"{work_dir}/train-images.u8", "labels": f"{work_dir}/train-labels.u8"}
    for key, array in (("images", data.train_images[:rows]), ("labels", data.train_labels[:rows])):
        with tf.io.gfile.GFile(paths[key], "wb") as f:
            f.write(array.astype("uint8").tobytes())
    return paths


def make_dataset_fn(paths: dict[str, str], batch: int) -> Callable[..., Any]:
    """A ``dataset_fn`` run on each worker: the training set from ``paths``, shuffled, repeated, batched.

    Its ops run on the worker, so the worker reads the files. The shuffle has no seed: each
    worker (and each MWMS node) draws its own order, so no two see the same batches.
    """

    def dataset_fn(_context: Any = None) -> Any:
        import tensorflow as tf

        images = tf.reshape(tf.io.decode_raw(tf.io.read_file(paths["images"]), tf.uint8), [-1, IMAGE_PIXELS])
        labels = tf.cast(tf.io.decode_raw(tf.io.read_file(paths["labels"]), tf.uint8), tf.int64)
        rows = tf.data.Dataset.from_tensor_slices((images, labels))
        batches = rows.shuffle(60_000).repeat().batch(batch, drop_remainder=True)

        @tf.autograph.experimental.do_not_convert  # plain TF ops; its source may not be at hand to convert
        def scale(images: Any, labels: Any) -> tuple[Any, Any]:
            return tf.cast(images, tf.float32) / 255.0, labels

        return batches.map(scale).prefetch(2)

    return dataset_fn


def evaluate(model: Any, data: Any) -> float:
    """``model``'s accuracy on the whole test set, evaluated in this process."""
    import numpy as np

    features = data.test_images.reshape(-1, IMAGE_PIXELS).astype("float32") / 255
    logits = model.predict(features, batch_size=1000, verbose=0)
    return float(np.mean(logits.argmax(axis=1) == data.test_labels))


def local_model(weights: list[Any]) -> Any:
    """The demo CNN in this process (no strategy) with ``weights``."""
    from tfonspark.demo import build_model

    model = build_model(total_steps=1)
    model.set_weights(weights)
    return model


# ---- training: this process is the coordinator ---------------------------------------------------------
def train(cluster: Any, args: argparse.Namespace, paths: dict[str, str]) -> dict[str, Any]:
    """Build the model on the ps, schedule the steps on the workers; the weights and the timings."""
    import tensorflow as tf

    strategy = tf.distribute.ParameterServerStrategy(cluster.cluster_resolver())
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    step, model = _train_step(strategy, args.steps)
    iterator = iter(coordinator.create_per_worker_dataset(make_dataset_fn(paths, args.batch_size)))

    started = time.monotonic()
    warmup = [coordinator.schedule(step, args=(iterator,)) for _ in range(WARMUP_STEPS)]
    coordinator.join()
    warm = time.monotonic()
    timed = [coordinator.schedule(step, args=(iterator,)) for _ in range(args.steps - WARMUP_STEPS)]
    losses = [float(r.fetch()) for r in warmup] + _fetch_logging(timed, WARMUP_STEPS, args.steps)
    coordinator.join()
    done = time.monotonic()
    return {
        "weights": model.get_weights(),  # read from the ps
        "losses": losses,
        "train_seconds": done - started,
        "steps_per_second": (args.steps - WARMUP_STEPS) / (done - warm),
        "variable_devices": sorted({str(v.value.device) for v in model.variables}),
    }


def _train_step(strategy: Any, total_steps: int) -> tuple[Any, Any]:
    """The demo CNN and Adam built on the ps, and the scheduled step: one batch on one worker."""
    import keras
    import tensorflow as tf

    from tfonspark.demo import build_model

    with strategy.scope():
        model = build_model(total_steps=total_steps)
        optimizer = model.optimizer  # Adam with the demo's cosine decay over total_steps
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(iterator: Any) -> Any:
        def replica_step(images: Any, labels: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.run(replica_step, args=next(iterator))

    return step, model


def _fetch_logging(results: list[Any], first: int, total: int) -> list[float]:
    """The losses of ``results`` (steps ``first+1``..``total``), printing the mean every LOG_EVERY steps."""
    losses: list[float] = []
    for i, result in enumerate(results, start=first + 1):
        losses.append(float(result.fetch()))  # waits for that step
        if i % LOG_EVERY == 0 or i == total:
            recent = losses[-LOG_EVERY:]
            print(f"step {i}/{total}  loss {sum(recent) / len(recent):.4f}", flush=True)
    return losses


def run(sc: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Write the data, start the cluster on ``sc``, train, evaluate here, stop it: the metrics."""
    import tfonspark
    from tfonspark.demo.datasets import load_mnist

    data = load_mnist(args.data)
    rows = min(args.max_train_rows or len(data.train_labels), len(data.train_labels))
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="mnist-ps-")
    try:
        paths = write_training_data(data, rows, work_dir)
        started = time.monotonic()
        with tfonspark.ps_cluster(sc, num_workers=args.workers, num_ps=args.ps, reservation_timeout=300) as cluster:
            startup = time.monotonic() - started
            trained = train(cluster, args, paths)
            # while the cluster is up: TF registers every new function with all its tasks
            model = local_model(trained.pop("weights"))
            accuracy = evaluate(model, data)
            _save(args.output_dir, model)
        cluster_seconds = time.monotonic() - started
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    metrics = {
        "mode": "parameter-server",
        "workers": args.workers,
        "ps": args.ps,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "train_rows": rows,
        "test_accuracy": accuracy,
        "startup_seconds": startup,
        "cluster_seconds": cluster_seconds,
        **trained,
    }
    with open(os.path.join(args.output_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    return metrics


def _save(output_dir: str, model: Any) -> None:
    """``model.keras`` in ``output_dir``."""
    os.makedirs(output_dir, exist_ok=True)
    model.save(os.path.join(output_dir, "model.keras"))


def main(argv: Sequence[str] | None = None) -> int:
    """Train with the driver as coordinator and print the test accuracy.

    Ends the process with ``os._exit``: TensorFlow's coordinator threads and the chief's server
    in this process cannot be stopped, and would keep a normal exit waiting.
    """
    from tfonspark.demo import spark_context, stop_spark

    args = parse_args(argv)
    sc = spark_context(args.master, "mnist_ps")
    try:
        metrics = run(sc, args)
    except BaseException:
        traceback.print_exc()
        stop_spark(sc)
        os._exit(1)
    stop_spark(sc)
    print(
        f"test accuracy: {metrics['test_accuracy']:.4f} ({args.workers} workers, {args.ps} ps, driver as "
        f"coordinator; {args.steps} steps x {args.batch_size} rows, {metrics['steps_per_second']:.1f} steps/s, "
        f"train {metrics['train_seconds']:.0f} s, cluster {metrics['cluster_seconds']:.0f} s); "
        f"model saved to {args.output_dir}/model.keras",
        flush=True,
    )
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
