"""The driver program of ``test_hosts.py``, run on the driver's host of a multi-host cluster.

``python hosts_driver.py feed MASTER_URL OUT_DIR EXECUTORS ROWS``: a SparkContext against the
standalone master on its own host, at this host's own address; ``tfonspark.run`` with 2 TF nodes
on ``EXECUTORS`` executors (one per worker host, so at least one host has no node), and
``train()`` from a DataFrame whose rows carry the hostname of the executor that made them (a
Python UDF, in the feed task's own Python worker), then from an uncached ``rdd.map`` (the TFoS
shape: ids ``ROWS`` to ``2 * ROWS - 1``, each made in its feed task). Each node writes the ids it
read, those made on another host than its own, and what it was told about the cluster, to
``OUT_DIR/node-<task>.json``. Then a second cluster answers ``inference()`` on the same rows,
one result per row; the driver writes both outcomes to ``OUT_DIR/driver.json``.

``python hosts_driver.py cut MASTER_URL OUT_DIR EXECUTORS``: 2 nodes that run until stopped; each
writes ``up-<job>-<index>`` with its host; the driver writes ``started``, then waits in
``shutdown()`` and writes the ``NodeFailed`` it gets (the test cuts a node's host off) and when.

``python hosts_driver.py mwms MASTER_URL OUT_DIR EXECUTORS``: ``tfonspark.keras.fit`` of a Conv2D
model under MWMS on 2 nodes of 2 hosts, with uneven input and TensorBoard on the chief; each node
writes its host, losses, rows per epoch and ``TF_CONFIG`` to ``OUT_DIR/node-<task>.json``, the
driver the TensorBoard URL.

``python hosts_driver.py gpus MASTER_URL OUT_DIR EXECUTORS``: one node per worker host, each
executor asking Spark for one GPU (the hosts' fake discovery scripts, ``hosts_fixture.py``);
each node writes its host, ``CUDA_VISIBLE_DEVICES`` and ``ctx.gpus``, the driver what its node
table says each node got.

``python hosts_driver.py retry MASTER_URL OUT_DIR EXECUTORS ROWS``: Spark declares an executor
lost after 6 s without heartbeats; 2 nodes read a DataFrame feed slowly, each writing
``up-<task>`` (its host) and ``from-<host>`` once it read a row made on another host. The test
cuts the node-less host off mid-feed (long enough for Spark to run its tasks again on the node
hosts, or briefly) and restores it. Each row carries the Spark attempt that made it; the driver
writes what the nodes read and the ledger's repeats (attempts dropped on a node) to
``OUT_DIR/driver.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

import tfonspark
from tfonspark import InputMode
from tfonspark.errors import NodeFailed
from tfonspark.testing.hosts import spark_context_here


def read_all(out_dir, ctx):
    """A node: read every row; count the rows made on another host (they crossed over TCP)."""
    import json
    import os
    import socket

    mine = socket.gethostname()
    feed = ctx.get_data_feed(train_mode=True)
    ids, crossed, makers = [], [], set()
    while not feed.should_stop():
        batch = feed.next_batch(500)
        if not batch:
            break
        for row_id, made_on in batch:
            ids.append(int(row_id))
            if made_on != mine:
                crossed.append(int(row_id))
            makers.add(made_on)
    found = {
        "host": mine,
        "ids": ids,
        "crossed": crossed,
        "makers": sorted(makers),
        "cluster_spec": ctx.cluster_spec,
        "tf_config": json.loads(os.environ.get("TF_CONFIG", "{}")),
    }
    with open(os.path.join(out_dir, f"node-{ctx.task_index}.json"), "w") as f:
        json.dump(found, f)


def answer(_, ctx):
    """A node of an inference cluster: one result per row, ``(id * 2, the node's host)``."""
    import socket

    mine = socket.gethostname()
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        batch = feed.next_batch(300)
        if batch:
            feed.batch_results([(int(row_id) * 2, mine) for row_id, _ in batch])


def wait_to_be_cut(out_dir, ctx):
    """A node that runs until the cluster stops, after saying where it runs (``up-<task>``)."""
    import os
    import socket
    import time

    with open(os.path.join(out_dir, f"up-{ctx.job_name}-{ctx.task_index}"), "w") as f:
        f.write(socket.gethostname())
    deadline = time.time() + 300
    while time.time() < deadline:
        time.sleep(0.2)


def read_slowly(out_dir, ctx):
    """A node that reads its feed slowly (the feed lasts while the test cuts a host off), notes
    where it runs and the first row it read from each other host, and writes every row it read."""
    import json
    import os
    import socket
    import time

    mine = socket.gethostname()
    with open(os.path.join(out_dir, f"up-{ctx.task_index}"), "w") as f:
        f.write(mine)
    feed = ctx.get_data_feed(train_mode=True)
    rows, seen = [], {mine}
    while not feed.should_stop():
        batch = feed.next_batch(250)
        if not batch:
            break
        rows.extend((int(i), made_on, int(attempt)) for i, made_on, attempt in batch)
        for made_on in {r[1] for r in batch} - seen:
            seen.add(made_on)
            open(os.path.join(out_dir, f"from-{made_on}"), "w").close()
        time.sleep(0.1)
    with open(os.path.join(out_dir, f"node-{ctx.task_index}.json"), "w") as f:
        json.dump({"host": mine, "rows": rows}, f)


def fit_uneven(out_dir, ctx):
    """A node of an MWMS cluster: ``tfonspark.keras.fit`` of the demo CNN (Conv2D) on uneven input
    (worker 0 has 3 batches, worker 1 has 7), its all-reduces crossing hosts; writes what it saw."""
    from tfonspark import distribute

    strategy = distribute.strategy()  # before any other TensorFlow op
    import json
    import os
    import socket

    import numpy as np
    import tensorflow as tf

    import tfonspark.keras as tfk
    from tfonspark.demo.model import build_model

    rows = (3, 7)[ctx.task_index] * 16
    rng = np.random.default_rng(ctx.task_index)
    x, y = rng.random((rows, 784), dtype=np.float32), rng.integers(0, 10, rows).astype(np.int64)

    def dataset_fn(input_ctx):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(input_ctx.get_per_replica_batch_size(16))

    seen = []
    with strategy.scope():
        model = build_model(total_steps=20)
    history = tfk.fit(
        model,
        dataset_fn,
        epochs=1,
        verbose=0,
        on_progress=lambda p: seen.append(p.global_rows) if p.epoch_end else None,
    )
    found = {
        "host": socket.gethostname(),
        "loss": [float(v) for v in history.history["loss"]],
        "global_rows": seen,
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
    }
    with open(os.path.join(out_dir, f"node-{ctx.task_index}.json"), "w") as f:
        json.dump(found, f)


def _context(master: str, executors: int, **conf_keys: str) -> tuple[SparkContext, str]:
    """A SparkContext at this host's own address, once ``executors`` executors registered; that address."""
    sc = spark_context_here(master, executors, "tfonspark-hosts", **conf_keys)
    return sc, socket.gethostbyname(socket.gethostname())


def feed_and_answer(master: str, out_dir: Path, executors: int, rows: int) -> dict:
    """Train from a DataFrame across hosts, then answer inference on the same rows."""
    started = time.monotonic()
    sc, address = _context(master, executors)
    spark = SparkSession(sc)
    made_on = F.udf(lambda _: __import__("socket").gethostname(), StringType())
    df = spark.range(0, rows, numPartitions=4 * executors).select(F.col("id"), made_on(F.col("id")).alias("made_on"))
    ready = time.monotonic()
    cluster = tfonspark.run(sc, read_all, str(out_dir), 2, input_mode=InputMode.SPARK, reservation_timeout=120)
    fed = cluster.train(df, num_epochs=1)
    # the TFoS shape: an uncached rdd.map, its rows made in the feed tasks (ids after the DataFrame's)
    rdd = sc.parallelize(range(rows, 2 * rows), 4 * executors).map(lambda i: (i, socket.gethostname()))
    fed_rdd = cluster.train(rdd, num_epochs=1)
    cluster.shutdown(timeout=120)
    trained = time.monotonic()
    serving = tfonspark.run(sc, answer, None, 2, input_mode=InputMode.SPARK, reservation_timeout=120)
    try:
        results = serving.inference(df.rdd.map(tuple)).collect()  # RDD in, RDD out: results in row order
    finally:
        serving.shutdown(timeout=120)
    done = time.monotonic()
    sc.stop()
    return {
        "fed": fed,
        "fed_rdd": fed_rdd,
        "driver_host": socket.gethostname(),
        "driver_address": address,
        "cluster_info": [{k: str(v) for k, v in info.items()} for info in cluster.cluster_info],
        "results": [list(r) for r in results],
        "spark_up_s": ready - started,
        "train_s": trained - ready,
        "inference_s": done - trained,
    }


def cut_off(master: str, out_dir: Path, executors: int) -> dict:
    """Run 2 nodes until one fails (the test cuts a host off): the error and when it came."""
    sc, _ = _context(master, executors)
    cluster = tfonspark.run(sc, wait_to_be_cut, str(out_dir), 2, reservation_timeout=120)
    (out_dir / "started").write_text(json.dumps(cluster.cluster_info, default=str))
    try:
        cluster.shutdown(timeout=300)
        outcome: dict = {"error": None}
    except NodeFailed as error:
        outcome = {"error": str(error), "role": error.role, "index": error.index, "at": time.time()}
    sc.stop()
    return outcome


class _Repeats(logging.Handler):
    """The driver ledger's log of dropped repeated attempts (driver/nodes/ledger.py)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def feed_through_a_cut(master: str, out_dir: Path, executors: int, rows: int) -> dict:
    """Train 2 nodes from a DataFrame read slowly while the test cuts the node-less host off."""
    lost_after = {  # Spark: an executor silent for 6 s is lost, checked every second
        "spark__network__timeout": "6s",
        "spark__network__timeoutInterval": "1s",
        "spark__storage__blockManagerTimeoutIntervalMs": "1000",
        "spark__executor__heartbeatInterval": "1s",
    }
    sc, _ = _context(master, executors, **lost_after)
    repeats = _Repeats()
    ledger = logging.getLogger("tfonspark.driver.nodes.ledger")
    ledger.setLevel(logging.INFO)
    ledger.addHandler(repeats)
    spark = SparkSession(sc)
    made_on = F.udf(lambda _: __import__("socket").gethostname(), StringType())
    attempt = F.udf(lambda _: __import__("pyspark").TaskContext.get().attemptNumber(), "int")
    df = spark.range(0, rows, numPartitions=6 * executors).select(
        F.col("id"), made_on(F.col("id")).alias("made_on"), attempt(F.col("id")).alias("attempt")
    )
    cluster = tfonspark.run(sc, read_slowly, str(out_dir), 2, input_mode=InputMode.SPARK, reservation_timeout=120)
    started = time.monotonic()
    outcome: dict = {"error": None}
    try:
        outcome["fed"] = cluster.train(df, num_epochs=1, feed_timeout=60)
        cluster.shutdown(timeout=120)
    except Exception as error:  # a clean failure is allowed; a hang or a row twice is not
        outcome["error"] = f"{type(error).__name__}: {error}"
        with contextlib.suppress(Exception):
            cluster.shutdown(timeout=30)
    outcome.update(train_s=time.monotonic() - started, repeats=repeats.lines)
    sc.stop()
    return outcome


def mwms_fit(master: str, out_dir: Path, executors: int) -> dict:
    """``tfonspark.keras.fit`` under MWMS on 2 nodes of 2 hosts, TensorBoard on the chief."""
    sc, _ = _context(master, executors)
    started = time.monotonic()
    cluster = tfonspark.run(sc, fit_uneven, str(out_dir), 2, tensorboard=True, reservation_timeout=120)
    url = cluster.tensorboard_url()
    cluster.shutdown(timeout=240)
    outcome = {"tensorboard_url": url, "fit_s": time.monotonic() - started}
    sc.stop()
    return outcome


def write_gpus(out_dir, ctx):
    """A node: what it was given (``CUDA_VISIBLE_DEVICES``, ``ctx.gpus``) and on which host."""
    import json
    import os
    import socket

    seen = {"host": socket.gethostname(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "ctx": ctx.gpus}
    with open(os.path.join(out_dir, f"node-{ctx.task_index}.json"), "w") as f:
        json.dump(seen, f)


def gpus_per_host(master: str, out_dir: Path, executors: int) -> dict:
    """One node per worker host, each executor given one of its host's (fake) GPUs by Spark."""
    gpu = {"spark__executor__resource__gpu__amount": "1", "spark__task__resource__gpu__amount": "1"}
    sc, _ = _context(master, executors, **gpu)
    cluster = tfonspark.run(sc, write_gpus, str(out_dir), executors, reservation_timeout=120)
    cluster.shutdown(timeout=120)
    info = [{"node": f"{i['job_name']}:{i['task_index']}", "gpus": i["gpus"]} for i in cluster.cluster_info]
    sc.stop()
    return {"cluster_info": info}


def main() -> int:
    mode, master, out_dir, executors = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    if mode == "feed":
        out = feed_and_answer(master, out_dir, executors, int(sys.argv[5]))
    elif mode == "mwms":
        out = mwms_fit(master, out_dir, executors)
    elif mode == "gpus":
        out = gpus_per_host(master, out_dir, executors)
    elif mode == "retry":
        out = feed_through_a_cut(master, out_dir, executors, int(sys.argv[5]))
    else:
        out = cut_off(master, out_dir, executors)
    (out_dir / "driver.json").write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    raise SystemExit(main())
