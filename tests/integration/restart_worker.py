"""The node program of the chaos tests (test_restarts.py) and of benchmarks/recovery.py.

Two workers train a small MNIST CNN with ``tfonspark.keras.fit(model_dir=...,
checkpoint_every_steps=...)`` for a few epochs, from a numpy file (``InputMode.TENSORFLOW``) or
from the Spark feed (``InputMode.SPARK``). What they do is told to the driver with
``ctx.report``, so a test can kill a node at a known step and measure the recovery:

* ``{"kind": "start"}`` when ``map_fun`` starts: ``attempt``, ``pid``, time, and ``spare``:
  whether this TF process was the previous attempt's warm spare (``executor/spare.py``);
* ``{"kind": "ready"}`` once the model is built: when TensorFlow was imported
  (``imported``), the strategy formed its collectives (``strategy``) and the model was built
  (``t``);
* ``{"kind": "begin"}`` at ``on_train_begin``, after the restore: ``iterations`` = the
  optimizer steps the restored checkpoint holds (0 on a fresh start);
* ``{"kind": "step"}`` after the first training step of each attempt: ``step`` (global) and time,
  i.e. "training resumed";
* ``{"kind": "hold"}``: worker 1, attempt 0 only, after ``Job.hold_at`` global steps; it then
  waits (up to :data:`HOLD_S` seconds) to be killed from outside (``Chaos``, on the driver);
* ``{"kind": "rows"}`` (SPARK mode): rows read from the feed so far in this attempt;
* ``{"kind": "done"}``: test accuracy (chief), steps trained, rows read and drained.

``Chaos`` is the driver side: an ``on_report`` callback that keeps the reports and, on
``hold``, SIGKILLs the TF process (or, with ``target="executor"``, the executor JVM) of the
reporting node with psutil, recording when.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HOLD_S = 60.0  # the most a held node waits to be killed before it trains on (the test then fails)
IMAGE = (28, 28, 1)


@dataclass(frozen=True)
class Job:
    """What every node runs: ``data`` is an ``.npz`` with x_train, y_train, x_test, y_test."""

    data: str
    model_dir: str
    epochs: int = 4
    global_batch: int = 64
    checkpoint_every: int | None = 8  # None: epoch checkpoints only
    hold_at: int | None = None  # global step after which worker 1 waits to be killed (attempt 0)
    seed: int = 7
    feed: bool = False  # InputMode.SPARK: train on ctx.get_data_feed() instead of the file
    steps_per_epoch: int = 32  # global steps per epoch: rows per epoch // global_batch
    fail_worker: int | None = None  # this worker raises at once, on every attempt
    marks: str = ""  # a directory where a failing node writes when it fails


def write_data(path: str, mnist_dir: str, train_rows: int, test_rows: int) -> str:
    """The first ``train_rows`` / ``test_rows`` MNIST examples as float32 images in [0, 1]."""
    from tfonspark.demo.datasets import load_mnist

    mnist = load_mnist(mnist_dir)

    def images(a: np.ndarray) -> np.ndarray:
        return (a.astype(np.float32) / np.float32(255.0)).reshape(len(a), -1)

    np.savez(
        path,
        x_train=images(mnist.train_images[:train_rows]),
        y_train=mnist.train_labels[:train_rows].astype(np.int64),
        x_test=images(mnist.test_images[:test_rows]),
        y_test=mnist.test_labels[:test_rows].astype(np.int64),
    )
    return path


def step_checkpoints() -> bool:
    """Whether ``tfonspark.keras.fit`` takes ``checkpoint_every_steps`` (else: epoch checkpoints).

    It is a named parameter in older versions, one of its ``**options`` (``FitOptions``) now.
    """
    import inspect

    from tfonspark.distribute import keras_fit

    options = getattr(keras_fit, "FitOptions", None)
    named = inspect.signature(keras_fit.fit).parameters
    return "checkpoint_every_steps" in named or "checkpoint_every_steps" in getattr(options, "__annotations__", {})


def tf_port() -> int:
    """This node's TensorFlow server port, from ``TF_CONFIG``."""
    import json

    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    task = config.get("task", {})
    try:
        return int(config["cluster"][task["type"]][task["index"]].rsplit(":", 1)[1])
    except (KeyError, IndexError, ValueError):
        return 0


def attempt_of(ctx: Any) -> int:
    """``ctx.attempt`` (issue 13), else the ``TFONSPARK_ATTEMPT`` environment variable, else 0."""
    return int(getattr(ctx, "attempt", os.environ.get("TFONSPARK_ATTEMPT", 0)) or 0)


def main(job: Job, ctx: Any) -> None:
    """``map_fun``: train, report, and on the chief report the test accuracy."""
    attempt = attempt_of(ctx)
    start = {"kind": "start", "attempt": attempt, "pid": os.getpid(), "port": tf_port(), "t": time.time()}
    ctx.report({**start, "tmpdir": os.environ.get("TMPDIR", ""), "spare": _is_spare()})
    if job.fail_worker is not None and ctx.task_index == job.fail_worker:
        _fail(job, ctx, attempt)
    if job.fail_worker is not None:
        time.sleep(HOLD_S)  # the other node waits to be torn down
        return
    import tensorflow as tf

    from tfonspark import distribute

    imported = time.time()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    strategy = distribute.strategy()  # before any other TensorFlow op
    formed = time.time()
    from tfonspark.keras import fit

    data = np.load(job.data)
    with strategy.scope():
        model = _model(job.seed)
    ctx.report({"kind": "ready", "attempt": attempt, "imported": imported, "strategy": formed, "t": time.time()})
    feed = ctx.get_data_feed() if job.feed else None
    counter = _Rows(ctx, attempt)
    extra: dict[str, Any] = {}
    if job.checkpoint_every is not None and step_checkpoints():
        extra["checkpoint_every_steps"] = job.checkpoint_every
    if job.feed:
        dataset = _feed_input(feed, counter, job.global_batch)
    else:
        dataset = _file_input(data["x_train"], data["y_train"], job.global_batch)
    watcher = _watcher(job, ctx, attempt)
    fit(
        model,
        dataset,
        epochs=job.epochs,
        steps_per_epoch=job.steps_per_epoch,  # exactly one pass (else one empty step ends an epoch)
        model_dir=job.model_dir,
        callbacks=[watcher],
        verbose=0,
        log_every_steps=0,
        **extra,
    )
    drained = feed.drain() if feed is not None else 0
    done: dict[str, Any] = {
        "kind": "done",
        "attempt": attempt,
        "iterations": int(model.optimizer.iterations.numpy()),
        "rows": counter.rows,
        "drained": drained,
        "t": time.time(),
    }
    if ctx.is_chief:
        done["accuracy"] = _accuracy(model, data["x_test"], data["y_test"])
    ctx.report(done)


def _executor_of(proc: Any) -> Any:
    """The Spark executor JVM of TF process ``proc``: an ancestor where it was spawned; where it
    was forked, the executor its fork server serves (``forkserver PATH EXECUTOR_PID ...``)."""
    import psutil

    for parent in proc.parents():
        cmdline = parent.cmdline()
        if "CoarseGrainedExecutorBackend" in " ".join(cmdline):
            return parent
        if "tfonspark.executor.forkserver" in cmdline:
            return psutil.Process(int(cmdline[cmdline.index("tfonspark.executor.forkserver") + 2]))
    raise RuntimeError(f"no Spark executor above TF process {proc.pid}")


def _is_spare() -> bool:
    """Whether this process started as a spare (``python -c WARM_CODE``), not ``-m ...entry``."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return b"await_bootstrap" in f.read()
    except OSError:
        return False


def _fail(job: Job, ctx: Any, attempt: int) -> None:
    """Raise at once, after noting when (the test measures how soon the driver gives up)."""
    if job.marks:
        with open(os.path.join(job.marks, f"failed-{attempt}"), "w") as out:
            out.write(repr(time.time()))
    raise RuntimeError(f"planned failure of worker {ctx.task_index} in attempt {attempt}")


def _model(seed: int) -> Any:
    """A small CNN; the same initial weights everywhere for a given seed."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((IMAGE[0] * IMAGE[1],)),
            keras.layers.Reshape(IMAGE),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(2e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _file_input(x: np.ndarray, y: np.ndarray, global_batch: int) -> Any:
    """A ``dataset_fn``: worker i trains on rows i, i+n, ... in file order, no shuffle, repeated
    (an exhausted iterator would cost an empty step at each epoch boundary)."""
    import tensorflow as tf

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(global_batch)
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
        return ds.batch(batch, drop_remainder=True).repeat()

    return dataset_fn


class _Rows:
    """Rows this node read from its feed in this attempt, reported every ``every`` rows."""

    def __init__(self, ctx: Any, attempt: int, every: int = 256) -> None:
        self.ctx, self.attempt, self.every = ctx, attempt, every
        self.rows = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            before, self.rows = self.rows, self.rows + n
            if before // self.every != self.rows // self.every:
                self.ctx.report({"kind": "rows", "attempt": self.attempt, "rows": self.rows})


def _feed_input(feed: Any, counter: _Rows, global_batch: int) -> Any:
    """A ``dataset_fn``: this node's fed rows in arrival order, counted as they are read."""
    import tensorflow as tf

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(global_batch)

        def batches() -> Any:
            while (columns := feed.next_columns(batch)) is not None:
                counter.add(columns.count)
                x, y = columns.columns
                yield np.asarray(x, np.float32).reshape(-1, IMAGE[0] * IMAGE[1]), np.asarray(y, np.int64)

        signature = (
            tf.TensorSpec((None, IMAGE[0] * IMAGE[1]), tf.float32),
            tf.TensorSpec((None,), tf.int64),
        )
        return tf.data.Dataset.from_generator(batches, output_signature=signature)

    return dataset_fn


def _accuracy(model: Any, x: np.ndarray, y: np.ndarray) -> float:
    """Test accuracy in percent, computed locally (no collective)."""
    predicted = np.concatenate([np.argmax(np.asarray(model(x[i : i + 500])), axis=1) for i in range(0, len(x), 500)])
    return float(100.0 * np.mean(predicted == y))


def _watcher(job: Job, ctx: Any, attempt: int) -> Any:
    import keras

    class Watcher(keras.callbacks.Callback):
        """Reports the restore point and the first step; holds worker 1 at ``hold_at``."""

        def __init__(self) -> None:
            super().__init__()
            self.first = True

        def on_train_begin(self, logs: Any = None) -> None:
            iterations = int(self.model.optimizer.iterations.numpy())
            ctx.report({"kind": "begin", "attempt": attempt, "iterations": iterations, "t": time.time()})

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            step = int(self.model.optimizer.iterations.numpy())
            if self.first:
                self.first = False
                ctx.report({"kind": "step", "attempt": attempt, "step": step, "t": time.time()})
            if attempt == 0 and ctx.task_index == 1 and step == job.hold_at:
                ctx.report({"kind": "hold", "attempt": attempt, "step": step, "pid": os.getpid(), "t": time.time()})
                deadline = time.monotonic() + HOLD_S
                while time.monotonic() < deadline:  # killed from outside meanwhile
                    time.sleep(0.05)

    return Watcher()


# ---- the driver side ---------------------------------------------------------------------------
@dataclass
class Chaos:
    """``on_report`` for ``tfonspark.run``: keeps every report; kills the node that says ``hold``.

    ``target``: ``"tf"`` SIGKILLs the TF process (its pid from the report), ``"executor"`` the
    executor JVM it runs under (found among its ancestors), ``""`` kills nothing.
    """

    target: str = "tf"
    reports: list[Any] = field(default_factory=list)
    killed_at: float | None = None
    killed: list[str] = field(default_factory=list)
    kill_error: str = ""
    pids: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, report: Any) -> None:
        with self._lock:
            self.reports.append(report)
        metrics = report.metrics
        if "pid" in metrics:
            self.pids.add(int(metrics["pid"]))
        if metrics.get("kind") == "hold" and self.target and self.killed_at is None:
            try:
                self._kill(int(metrics["pid"]))
            except Exception as exc:  # the test reports it
                self.kill_error = f"{type(exc).__name__}: {exc}"

    def _kill(self, pid: int) -> None:
        import psutil

        proc = psutil.Process(pid)
        if "tfonspark.tfprocess.entry" not in " ".join(proc.cmdline()):
            raise RuntimeError(f"pid {pid} is not a TF process: {proc.cmdline()}")
        kind = "tf"
        if self.target == "executor":
            proc = _executor_of(proc)
            kind = "executor-jvm"
        self.killed.append(f"{kind} {proc.pid}")
        self.killed_at = time.time()
        proc.kill()

    def of(self, kind: str, attempt: int | None = None) -> list[Any]:
        """Reports of one kind (and attempt), oldest first."""
        with self._lock:
            reports = list(self.reports)
        return [
            r
            for r in reports
            if r.metrics.get("kind") == kind and (attempt is None or r.metrics.get("attempt") == attempt)
        ]

    def accuracy(self) -> float:
        """The chief's final test accuracy (percent)."""
        done = [r for r in self.of("done") if "accuracy" in r.metrics]
        if not done:
            raise AssertionError(f"the chief reported no result; reports: {[r.metrics for r in self.reports]}")
        return float(done[-1].metrics["accuracy"])
