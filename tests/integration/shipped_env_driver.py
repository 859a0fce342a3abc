"""The driver program of ``test_shipped_env.py``, run by ``spark-submit`` on the driver's host.

Its SparkContext is the examples' own (``tfonspark.demo.spark_context``, which takes the
submitted master and settings as they are). The driver runs the checkout's virtualenv
(``spark.pyspark.driver.python``); the executors run
what ``spark.pyspark.python`` names: the packed environment shipped with ``--archives`` (the
way users run on YARN), or a Python without tfonspark.

``shipped_env_driver.py train OUT_DIR ROWS``: 2 TF nodes trained from a DataFrame of ``ROWS``
ids; each node writes the ids it read and which Python its TF process ran (``sys.executable``,
``sys.prefix``, where tfonspark and numpy came from, its supervisor's interpreter) to
``OUT_DIR/node-<task>.json``. Then the driver claims another tfonspark version than its own
(``tfonspark.__version__`` set on the driver: the executors' copy is unchanged, so the two
differ as they would with another version installed there) and starts a cluster again, which
must fail at once with ``ExecutorEnvironmentError``.

``shipped_env_driver.py missing OUT_DIR``: a cluster whose executors' Python has no tfonspark;
its error, its class and the seconds it took go to ``OUT_DIR/driver.json``, as every outcome does.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

import tfonspark
from tfonspark import InputMode, TFParallel
from tfonspark.demo import spark_context
from tfonspark.testing.spark import wait_for_executors

OTHER_VERSION = "0.0.1+other"


def read_rows(out_dir, ctx):
    """A node: read every row, then say which Python this TF process is and where it loaded from."""
    import json
    import os
    import socket
    import sys

    import numpy

    import tfonspark

    feed = ctx.get_data_feed(train_mode=True)
    ids = []
    while not feed.should_stop():
        batch = feed.next_batch(500)
        if not batch:
            break
        ids.extend(int(row[0]) for row in batch)
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        supervisor = f.read().split(b"\0")[0].decode()
    found = {
        "host": socket.gethostname(),
        "ids": ids,
        "executable": sys.executable,
        "prefix": sys.prefix,
        "cwd": os.getcwd(),
        "tfonspark": tfonspark.__file__,
        "numpy": numpy.__file__,
        "supervisor": supervisor,
        "tensorflow_installed": _installed("tensorflow") or _installed("tensorflow-cpu"),
    }
    with open(os.path.join(out_dir, f"node-{ctx.task_index}.json"), "w") as f:
        json.dump(found, f)


def _installed(name):
    import importlib.metadata

    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def idle(_, ctx):
    """A node that is never started: its executors cannot run it."""


def _failure(sc, out: dict, key: str, parallel: bool = False) -> None:
    """Start a cluster (``parallel``: TFParallel's instances, in a barrier stage) that must fail at
    once; its error's class, text, attributes and seconds."""
    started = time.monotonic()
    try:
        if parallel:
            TFParallel.run(sc, idle, None, 2, use_barrier=True, reservation_timeout=120)
        else:
            cluster = tfonspark.run(sc, idle, None, 2, input_mode=InputMode.SPARK, reservation_timeout=120)
            cluster.shutdown(timeout=60)
        out[key] = {"error": "", "type": "", "seconds": time.monotonic() - started}
    except Exception as err:
        out[key] = {
            "error": str(err),
            "type": type(err).__name__,
            "classes": [c.__name__ for c in type(err).__mro__],
            "attrs": {k: v for k, v in vars(err).items() if isinstance(v, str)},
            "seconds": time.monotonic() - started,
        }


def main() -> int:
    mode, out_dir = sys.argv[1], Path(sys.argv[2])
    out: dict = {"mode": mode, "driver_python": sys.executable}
    started = time.monotonic()
    sc = spark_context(app_name="tfonspark-shipped-env")  # the examples' own: spark-submit's settings
    sc.setLogLevel("ERROR")
    out["master"] = sc.master
    out["driver_host"] = sc.getConf().get("spark.driver.host", "")
    out["python_exec"] = sc.pythonExec
    out["context_s"] = time.monotonic() - started
    wait_for_executors(sc, 2, 120)
    out["executors_s"] = time.monotonic() - started
    try:
        if mode == "train":
            rows = int(sys.argv[3])
            df = SparkSession(sc).range(0, rows, numPartitions=8)
            started = time.monotonic()
            cluster = tfonspark.run(sc, read_rows, str(out_dir), 2, input_mode=InputMode.SPARK, reservation_timeout=120)
            out["fed"] = cluster.train(df, num_epochs=1)
            cluster.shutdown(timeout=120)
            out["train_s"] = time.monotonic() - started
            out["driver_version"] = tfonspark.__version__
            tfonspark.__version__ = OTHER_VERSION  # what the next NodeConfig carries to the executors
            _failure(sc, out, "mismatch")
        elif mode == "missing":
            _failure(sc, out, "missing")
            _failure(sc, out, "parallel", parallel=True)
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    finally:
        (out_dir / "driver.json").write_text(json.dumps(out))
        sc.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
