"""The driver of test_ps_failures.py: a ``ps_cluster`` whose servers are SIGKILLed while it trains.

``python ps_failures_driver.py MASTER OUT_JSON [--two-workers]`` starts ``tfonspark.ps_cluster(sc, 2, 1)`` and
trains a Keras 3 Dense layer (this process the coordinator), each closure slowed to about
``STEP_MS`` by its dataset so the kills land mid-training. A ``runs`` variable on the ps counts
every closure that ran, re-runs included. In one cluster:

1. ``baseline``: ``STEPS // 3`` closures, nothing killed: the closure rate;
2. ``worker_kill``: ``STEPS`` closures, worker:1's TF process SIGKILLed after a third of them;
   its supervisor restarts the server at the same address and training completes;
3. ``two_workers`` (only with ``--two-workers``: measured for docs/ps.md, not in CI):
   ``STEPS`` closures, worker:0 then (``SECOND_KILL_S`` later, while it is
   down) worker:1 killed: the longest stall with no closure completing;
4. ``ps_kill``: ps:0 killed mid-training: the seconds until TF's coordinator raises, then the
   block is left with that error, and ``ps_cluster`` raises NodeFailed naming ps:0 from it.

It writes every figure to OUT_JSON, with what is still alive or accepting after the block, and
ends with ``os._exit`` (TF's coordinator threads do not stop within a process).
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from ps_common import write_and_exit

STEPS = 150
STEP_MS = 20
SECOND_KILL_S = 0.5
PS_STEPS = 2000  # queued before ps:0 is killed: ~20 s of closures on 2 workers, never all done first


def _tf_process(spec: dict, node: str):
    """The TF process serving ``node`` (``"worker:1"``): the one listening on its port (a restarted
    worker's is its standby, and the next standby waits beside it)."""
    import psutil

    job, _, index = node.partition(":")
    port = int(spec[job][int(index)].rpartition(":")[2])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for conn in psutil.net_connections("tcp"):
            if conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                return psutil.Process(conn.pid)
        time.sleep(0.05)
    raise LookupError(f"no TF process listens for {node} on port {port}")


def _kill(cluster, node: str) -> float:
    _tf_process(cluster.cluster_spec, node).send_signal(signal.SIGKILL)
    return time.monotonic()


def _accepting_at(spec: dict, node: str, since: float, timeout: float = 120) -> float:
    """Seconds from ``since`` until ``node``'s address accepts a connection again (after it stopped)."""
    from tfonspark.driver.services.ps import servers_accepting

    deadline = time.monotonic() + timeout
    while servers_accepting(spec, (node.split(":")[0],))[node] and time.monotonic() < deadline:
        time.sleep(0.02)  # the kill has not closed the listener yet
    while not servers_accepting(spec, (node.split(":")[0],))[node]:
        if time.monotonic() > deadline:
            return -1.0
        time.sleep(0.05)
    return time.monotonic() - since


class _Progress(threading.Thread):
    """Samples the ``runs`` variable every 50 ms: (seconds, value) pairs."""

    def __init__(self, runs) -> None:
        super().__init__(daemon=True)
        self.runs, self.samples, self.stop = runs, [], threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                self.samples.append((time.monotonic(), int(self.runs.numpy())))
            except Exception:  # the ps is gone (the last phase): nothing more to sample
                return

    def reached(self, value: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not (self.samples and self.samples[-1][1] >= value) and time.monotonic() < deadline:
            time.sleep(0.02)

    def longest_stall(self, since: float) -> float:
        """The longest time after ``since`` between two samples that saw a closure complete."""
        moved = [since] + [t for (t, v), (_, w) in zip(self.samples[1:], self.samples) if t > since and v > w]
        return max((b - a for a, b in zip(moved, moved[1:])), default=-1.0)


def _setup(cluster):
    import keras
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing  # SleepDataset: a closure of ~STEP_MS

    strategy = tf.distribute.ParameterServerStrategy(cluster.cluster_resolver())
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    def dataset_fn(_context=None):
        x = np.random.default_rng(0).normal(size=(256, 2)).astype("float32")
        y = (3.0 * x[:, :1] + 2.0 * x[:, 1:] + 1.0).astype("float32")
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)
        return ds.apply(testing.sleep(STEP_MS * 1000))

    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.05)
        optimizer.build(model.trainable_variables)
        runs = tf.Variable(0, dtype=tf.int64, name="closure_runs")  # on the ps: every run counts
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step(it):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            runs.assign_add(1)
            return loss

        return strategy.run(replica, args=next(it))

    return coordinator, lambda: coordinator.schedule(step, args=(iterator,)), runs, optimizer


def _phase(coordinator, schedule, runs, optimizer, kills, steps: int = STEPS) -> tuple[dict, _Progress]:
    """``steps`` closures; ``kills(progress, base)`` kills what it kills once scheduled; the counts and times."""
    base_runs, base_iters = int(runs.numpy()), int(optimizer.iterations.numpy())
    progress = _Progress(runs)
    progress.start()
    started = time.monotonic()
    for _ in range(steps):
        schedule()
    figures = kills(progress, base_runs)
    coordinator.join()
    figures["joined"] = time.monotonic()
    figures["train_s"] = figures["joined"] - started
    progress.stop.set()
    figures["scheduled"] = steps
    figures["ran"] = int(runs.numpy()) - base_runs
    figures["iterations"] = int(optimizer.iterations.numpy()) - base_iters
    return figures, progress


def _worker_kill(cluster, spec):
    def kills(progress, base):
        progress.reached(base + STEPS // 3)
        killed = _kill(cluster, "worker:1")
        return {"accepting_s": _accepting_at(spec, "worker:1", killed), "killed": killed}

    return kills


def _standbys_ready(cluster_id: str, count: int, timeout: float = 120) -> float:
    """Wait until ``count`` standby TF processes of the cluster sit idle (TensorFlow imported); the seconds waited."""
    import psutil

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        standbys = [
            p
            for p in psutil.process_iter(["cmdline"])
            if cluster_id[:12] in (p.info.get("cmdline") or []) and "-c" in (p.info.get("cmdline") or [])
        ]
        before = [sum(p.cpu_times()[:2]) for p in standbys]
        time.sleep(0.5)
        if len(standbys) >= count and all(sum(p.cpu_times()[:2]) - b < 0.01 for p, b in zip(standbys, before)):
            return time.monotonic() - started
    return -1.0


def _two_workers(cluster, spec):
    def kills(progress, base):
        progress.reached(base + STEPS // 3)
        first = _kill(cluster, "worker:0")
        time.sleep(SECOND_KILL_S)
        second = _kill(cluster, "worker:1")
        return {"killed": second, "first_killed": first}

    return kills


def train_through_kills(cluster, out: dict, two_workers: bool) -> None:
    spec = cluster.cluster_spec
    coordinator, schedule, runs, optimizer = _setup(cluster)
    baseline, _ = _phase(coordinator, schedule, runs, optimizer, lambda p, b: {}, STEPS // 3)
    out["baseline"] = baseline
    rate = baseline["scheduled"] / baseline["train_s"]
    worker, progress = _phase(coordinator, schedule, runs, optimizer, _worker_kill(cluster, spec))
    killed = worker.pop("killed")
    worker["completed_s"] = worker.pop("joined") - killed
    worker["lost_s"] = worker["train_s"] - worker["ran"] / rate
    worker["stall_s"] = progress.longest_stall(killed)
    out["worker_kill"] = worker
    if two_workers:  # once both standbys are ready: what the supervisors' restarts leave of the window
        out["standbys_ready_s"] = _standbys_ready(cluster.cluster.cluster_id, 2)
        both, progress = _phase(coordinator, schedule, runs, optimizer, _two_workers(cluster, spec))
        both["stall_s"] = progress.longest_stall(both.pop("first_killed"))
        both["lost_s"] = both["train_s"] - both["ran"] / rate
        both["completed_s"] = both.pop("joined") - both.pop("killed")
        out["two_workers"] = both
    time.sleep(1)  # the last ServerRestarted events reach the driver
    out["server_restarts"] = [{k: v for k, v in vars(r).items() if k != "time"} for r in cluster.server_restarts]
    _ps_kill(cluster, coordinator, schedule, runs, out)


def _ps_kill(cluster, coordinator, schedule, runs, out: dict) -> None:
    """ps:0 killed once a few closures ran, with many more still queued: the error TF raises in ``join``.

    The process is looked up before training starts and ``PS_STEPS`` closures (seconds of work
    even on idle cores) are queued, so the kill lands mid-training on a busy machine too: with
    ``STEPS`` queued, CI once finished them all before the kill, and ``join`` returned cleanly.
    """
    ps = _tf_process(cluster.cluster_spec, "ps:0")
    progress = _Progress(runs)
    progress.start()
    base = int(runs.numpy())
    for _ in range(PS_STEPS):
        schedule()
    progress.reached(base + STEPS // 6)
    progress.stop.set()
    ps.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    ran = progress.samples[-1][1] - base if progress.samples else -1
    try:
        coordinator.join()
    except Exception as error:
        out["ps_kill"] = {
            "error_s": time.monotonic() - killed,
            "type": type(error).__name__,
            "message": str(error)[:600],
            "ran_before_kill": ran,
        }
        out["leaving"] = time.monotonic()
        raise
    out["ps_kill"] = {"error_s": -1.0, "ran_before_kill": ran, "scheduled": PS_STEPS}


def main(master: str, out_path: str, two_workers: bool) -> None:
    import tfonspark
    from tfonspark.driver.services.ps import servers_accepting
    from tfonspark.errors import NodeFailed
    from tfonspark.testing import SparkManager

    sc = SparkManager.instance().get(master)
    out: dict = {}
    started = time.monotonic()
    try:
        with tfonspark.ps_cluster(sc, 2, 1, reservation_timeout=120) as cluster:
            out["startup_s"] = time.monotonic() - started
            out["spec"], out["cluster_id"] = cluster.cluster_spec, cluster.cluster.cluster_id
            train_through_kills(cluster, out, two_workers)
    except NodeFailed as error:
        out["left_block"] = {
            "left_s": time.monotonic() - out.pop("leaving", time.monotonic()),
            "role": error.role,
            "index": error.index,
            "message": str(error).splitlines()[0],
            "cause": type(error.__cause__).__name__,
        }
    out["after_block"] = {"accepting": servers_accepting(out["spec"])}
    write_and_exit(out, out_path, sc)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--two-workers" in sys.argv[3:])
