"""The driver program of ``test_port_range.py``, run on the driver's host of a multi-host cluster.

``python port_range_driver.py MASTER_URL OUT_DIR RANGE SMALL``: a SparkContext against the
standalone master on its own host, with ``spark.tfonspark.portRange=RANGE`` in its conf, then:

1. ``tfonspark.run(..., port_range=SMALL)``, a range too small for a fed node: what it raised
   (its type and text, how long it took; the test says it must be a ``ConfigError``) goes to
   ``OUT_DIR/small.json``;
2. ``main``: 2 nodes under ``MultiWorkerMirroredStrategy``, fed by Spark
   (``InputMode.SPARK``), TensorBoard on the chief; each node writes ``up-main-<index>`` once
   its strategy is made, then waits for ``go-main``;
3. ``data``: ``tfonspark.data_service`` with 2 workers (the dispatcher in this process), which
   serves ``range(2000)`` once (``distributed_epoch``);
4. ``ps``: ``ps_cluster`` with 2 workers and 1 ps, and the driver's ``ParameterServerStrategy``
   (the coordinator's server in this process) training 50 steps (``ps_driver.train``).

For each of ``main``, ``data`` and ``ps``, once it runs, the driver writes ``ready-<name>.json``
(its own pid and the port of PySpark's accumulator server, which is Spark's, not tfonspark's)
and waits for the test to write ``go-<name>`` after it read every listening socket of the
cluster. The outcome goes to ``OUT_DIR/driver.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from pyspark import SparkContext

import tfonspark
from tfonspark import InputMode
from tfonspark.testing.hosts import spark_context_here

WAIT_SECS = 240.0


def _wait_for(path: Path, timeout: float = WAIT_SECS) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout}s")
        time.sleep(0.1)


def mwms_node(out_dir, ctx):
    """A node: make MWMS (TF's gRPC server on the node's port), say so, wait, read the feed."""
    import os
    import socket
    import time

    import tensorflow as tf

    from tfonspark.distribute import strategy

    made = strategy()
    with made.scope():
        tf.Variable(1.0)
    with open(os.path.join(out_dir, f"up-main-{ctx.task_index}"), "w") as f:
        f.write(socket.gethostname())
    go = os.path.join(out_dir, "go-main")
    deadline = time.time() + 240
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.1)
    feed = ctx.get_data_feed(train_mode=True)
    rows = 0
    while not feed.should_stop():
        batch = feed.next_batch(100)
        if not batch:
            break
        rows += len(batch)
    with open(os.path.join(out_dir, f"rows-{ctx.task_index}"), "w") as f:
        f.write(str(rows))


def _ready(out_dir: Path, name: str, sc: SparkContext, **more: object) -> None:
    """Tell the test that ``name`` runs, and wait until it read the listening sockets."""
    accumulators = sc._accumulatorServer  # PySpark's own server in this process: Spark's port
    port = accumulators.server_address[1] if accumulators is not None else None
    ready = {"pid": os.getpid(), "spark_ports": [port] if isinstance(port, int) else [], **more}
    (out_dir / f"ready-{name}.json").write_text(json.dumps(ready, default=str))
    _wait_for(out_dir / f"go-{name}")


def main() -> int:
    master, out_dir, port_range, small = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    started = time.monotonic()
    sc = spark_context_here(master, 3, "tfonspark-port-range", spark__tfonspark__portRange=port_range)
    out: dict = {"spark_up_s": time.monotonic() - started}

    at = time.monotonic()
    try:
        tfonspark.run(sc, mwms_node, str(out_dir), 2, input_mode=InputMode.SPARK, port_range=small)
        small_outcome: dict = {"error": None}
    except Exception as error:  # the test says which it must be
        small_outcome = {"error": str(error), "type": type(error).__name__}
    small_outcome["seconds"] = time.monotonic() - at
    (out_dir / "small.json").write_text(json.dumps(small_outcome))

    at = time.monotonic()
    cluster = tfonspark.run(
        sc,
        mwms_node,
        str(out_dir),
        2,
        input_mode=InputMode.SPARK,
        tensorboard=True,
        log_dir=str(out_dir / "tb"),
        reservation_timeout=120,
    )
    try:
        _wait_for(out_dir / "up-main-0")
        _wait_for(out_dir / "up-main-1")
        out["main_up_s"] = time.monotonic() - at
        _ready(out_dir, "main", sc, tensorboard=cluster.tensorboard_url(), cluster_info=cluster.cluster_info)
        out["fed"] = cluster.train(sc.parallelize(range(1000), 4), num_epochs=1)
    finally:
        cluster.shutdown(timeout=120)

    import tensorflow as tf
    from ps_driver import train  # the ps test's own loop: y = 3*x1 + 2*x2 + 1, 50 steps

    at = time.monotonic()
    with tfonspark.data_service(sc, 2, reservation_timeout=120) as svc:
        out["data_up_s"] = time.monotonic() - at
        out["dispatcher"], out["data_workers"] = svc.target, list(svc.worker_addresses)
        ds = svc.distribute(tf.data.Dataset.range(2000), "distributed_epoch", job_name="hosts")
        out["elements"] = sorted(int(x) for x in ds.as_numpy_iterator())
        _ready(out_dir, "data", sc, target=svc.target, workers=svc.worker_addresses)

    at = time.monotonic()
    with tfonspark.ps_cluster(sc, num_workers=2, num_ps=1, reservation_timeout=120) as ps:
        out["ps_spec"] = ps.cluster_spec
        train(ps, out)  # the coordinator's server in this process, then 50 steps on 2 workers
        out["ps_up_s"] = time.monotonic() - at
        _ready(out_dir, "ps", sc, cluster_info=ps.cluster_info)
    sc.stop()
    (out_dir / "driver.json").write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    raise SystemExit(main())
