"""tfonspark across hosts, measured on a multi-host cluster in network namespaces (issue 45, item 8).

``tfonspark.testing.hosts`` makes a driver host, a master host and three worker hosts (one core,
1 GiB each) on a private bridge, a standalone Spark master and a worker per worker host; this
script then runs itself on the driver host as the driver program (``--role driver``), once per
measurement, and prints:

- **feed**: rows/s of ``Cluster.train`` (an RDD and a DataFrame of MNIST-shaped and tabular
  rows, cached and materialised first) with 2 nodes on the 3 executors of the three hosts: the
  node-less host's partitions (a third, where Spark runs each task beside its cached block) cross
  to another host over TCP; the same on one host (``local-cluster[3,1,1024]`` on the driver
  host: every feed task beside a node or on loopback); and plain Spark's ``foreachPartition``
  iterating every row of the same cached RDD on each. The clock stops when the TF processes have
  consumed the rows (``_common.Counters``), after an untimed warm-up pass.
- **mwms**: steps/s of the demo CNN (``tfonspark.demo.build_model``) under
  ``MultiWorkerMirroredStrategy`` with ``tfonspark.keras.fit``, 2 nodes on two hosts against 2
  nodes on one host (``local-cluster[2,1,1024]``), global batch 64, the steps after the first
  ``--warm-steps``.
- **faults**: the time from a fault to what it must cause, with default settings: a node's host
  cut off (its link down, its processes alive) to ``NodeFailed``; the driver's host cut off to
  the last node process gone from the worker hosts; every process of a node's host killed to
  ``NodeFailed``.

Needs root (namespaces; ``tfonspark.testing.hosts`` says why where it cannot make them). About 9
minutes on 2 cores; ``--quick`` (small data, fewer steps, for a smoke run) about 5. Run it with
the venv's python: ``.venv/bin/python benchmarks/hosts.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import _common as c

from tfonspark.testing.hosts import spark_context_here

PREFIX, SUBNET = "tfbh", "10.240.0"  # not the tests' hosts (tfh<n>, 10.232+n.0)
NODES = 2
TIMEOUT = 600.0
PARTS = ["feed", "mwms", "faults"]
NODE_PROCESSES = ("tfonspark.executor.supervisor", "tfonspark.tfprocess.entry")


# ---- on the nodes ------------------------------------------------------------------------------
def consume(args: dict[str, Any], ctx: Any) -> None:
    """Drain the feed's columnar batches, counting rows; stay until the driver read the counters."""
    c.drain_columns(args, ctx).hold(TIMEOUT)


def fit_cnn(args: dict[str, Any], ctx: Any) -> None:
    """Fit the demo CNN on random images under MWMS; the chief writes its steps/s."""
    from tfonspark import distribute

    strategy = distribute.strategy()  # before any other TensorFlow op
    import keras
    import numpy as np

    from tfonspark.demo import build_model
    from tfonspark.keras import fit

    steps, warm, per_node = args["steps"], args["warm_steps"], args["batch"] // ctx.num_workers

    def dataset_fn(_context: Any = None) -> Any:
        import tensorflow as tf

        rng = np.random.default_rng(ctx.task_index)
        images = rng.random((2048, 784), dtype=np.float32)
        labels = rng.integers(0, 10, 2048)
        return tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(per_node, drop_remainder=True)

    class Timer(keras.callbacks.Callback):
        warm_at = end_at = 0.0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == warm - 1:
                self.warm_at = time.monotonic()

        def on_train_end(self, logs: Any = None) -> None:
            self.end_at = time.monotonic()

    with strategy.scope():
        model = build_model(total_steps=steps)
    timer = Timer()
    fit(model, dataset_fn, epochs=1, steps_per_epoch=steps, callbacks=[timer], verbose=0)
    if ctx.is_chief:
        rate = (steps - warm) / (timer.end_at - timer.warm_at)
        Path(args["out"], "mwms.json").write_text(json.dumps({"steps_per_s": rate, "host": socket.gethostname()}))


def wait_until_stopped(out: str, ctx: Any) -> None:
    """A node that runs until its cluster stops, after saying on which host (``up-<job>-<index>``)."""
    Path(out, f"up-{ctx.job_name}-{ctx.task_index}").write_text(socket.gethostname())
    deadline = time.time() + TIMEOUT
    while time.time() < deadline:
        time.sleep(0.2)


# ---- the driver program, on the driver host ----------------------------------------------------
def _timed_train(cluster: Any, counters: c.Counters, data: Any, rows: int, fed_before: int, batch: int) -> float:
    """Seconds from ``train(data)`` to every row consumed but a partial batch per node."""
    started = time.perf_counter()
    fed = cluster.train(data, num_epochs=1, feed_timeout=TIMEOUT)
    if fed != rows:
        raise RuntimeError(f"train() fed {fed} rows, expected {rows}")
    done = counters.wait_for(fed_before + rows - NODES * (batch - 1), TIMEOUT)
    return done - started


def drive_feed(opts: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Every shape: tfonspark's ``train`` of the cached RDD and DataFrame, and ``foreachPartition``."""
    from pyspark.sql import SparkSession

    import tfonspark

    c.ship_by_value(c)
    sc = spark_context_here(opts.master, 3, "tfonspark-bench-hosts-feed", timeout=180)
    spark = SparkSession(sc)
    found: dict[str, Any] = {}
    try:
        for shape in c.parse_shapes(opts.shapes):
            rows = opts.rows if shape.name == "mnist" else opts.rows * 4
            partitions = 12
            rdd = c.cached(c.make_rdd(sc, shape, rows, partitions), rows)
            df = c.cached(c.make_dataframe(spark, shape, rows, partitions), rows)
            counters = c.Counters()
            args = {"dir": counters.dir, "batch": opts.batch}
            cluster = tfonspark.run(
                sc, consume, args, NODES, input_mode=tfonspark.InputMode.SPARK, reservation_timeout=300
            )
            fed, seconds = 0, {}
            try:
                for name, data in (("rdd", rdd), ("df", df)):
                    _timed_train(cluster, counters, data, rows, fed, opts.batch)  # warm-up pass, untimed
                    fed += rows
                    seconds[name] = _timed_train(cluster, counters, data, rows, fed, opts.batch)
                    fed += rows
            finally:
                counters.release()
                cluster.shutdown(timeout=TIMEOUT)
            seen = sc.accumulator(0)
            rdd.foreachPartition(lambda it, s=seen: s.add(sum(1 for _ in it)))  # warm-up
            started = time.perf_counter()
            rdd.foreachPartition(lambda it, s=seen: s.add(sum(1 for _ in it)))
            seconds["plain"] = time.perf_counter() - started
            found[shape.name] = {"rows": rows, "seconds": seconds}
            rdd.unpersist()
            df.unpersist()
    finally:
        sc.stop()
    return found


def drive_mwms(opts: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Two nodes fitting the demo CNN; the chief's steps/s and host."""
    import tfonspark

    sc = spark_context_here(opts.master, 2, "tfonspark-bench-hosts-mwms", timeout=180)
    try:
        args = {"steps": opts.steps, "warm_steps": opts.warm_steps, "batch": 64, "out": str(out)}
        cluster = tfonspark.run(sc, fit_cnn, args, NODES, reservation_timeout=300)
        cluster.shutdown(timeout=TIMEOUT)
    finally:
        sc.stop()
    result: dict[str, Any] = json.loads((out / "mwms.json").read_text())
    return result


def drive_fault(opts: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Two nodes that run until stopped (``started`` once up), then the NodeFailed a fault brings."""
    import tfonspark
    from tfonspark.errors import NodeFailed

    sc = spark_context_here(opts.master, 3, "tfonspark-bench-hosts-fault", timeout=180)
    cluster = tfonspark.run(sc, wait_until_stopped, str(out), NODES, reservation_timeout=300)
    (out / "started").touch()
    try:
        cluster.shutdown(timeout=TIMEOUT)
        outcome: dict[str, Any] = {"error": None}
    except NodeFailed as error:
        outcome = {"error": str(error)[:300], "at": time.time()}
    sc.stop()
    return outcome


DRIVES = {"feed": drive_feed, "mwms": drive_mwms, "fault": drive_fault}


def driver_main(opts: argparse.Namespace) -> int:
    out = Path(opts.out)
    (out / "result.json").write_text(json.dumps(DRIVES[opts.drive](opts, out)))
    return 0


# ---- the orchestra, as root on this machine ----------------------------------------------------
def _driver_argv(opts: argparse.Namespace, drive: str, master: str, out: Path) -> list[str]:
    return [
        sys.executable,
        __file__,
        "--role",
        "driver",
        "--drive",
        drive,
        "--master",
        master,
        "--out",
        str(out),
        "--rows",
        str(opts.rows),
        "--shapes",
        opts.shapes,
        "--batch",
        str(opts.batch),
        "--steps",
        str(opts.steps),
        "--warm-steps",
        str(opts.warm_steps),
    ]


def _drive(hosts: Any, opts: argparse.Namespace, drive: str, master: str, work: Path, label: str) -> dict[str, Any]:
    """Run the driver program ``drive`` on the driver host; its result."""
    out = work / label
    out.mkdir()
    with c.quiet_stage(label):
        done = hosts.run(hosts.driver, _driver_argv(opts, drive, master, out), timeout=TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


def _node_pids(hosts: Any, host: Any) -> list[int]:
    found = []
    for pid in hosts.processes(host):
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if any(name in cmdline for name in NODE_PROCESSES):
                found.append(pid)
    return found


def _wait(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _fault(hosts: Any, opts: argparse.Namespace, work: Path, name: str) -> dict[str, Any]:
    """One fault to a running 2-node cluster: ``cut`` a node's host, ``kill`` all its processes,
    or cut the ``driver``'s host; the seconds to NodeFailed (or to the nodes' processes gone)."""
    out = work / f"fault-{name}"
    out.mkdir()
    master = f"spark://{hosts.master.address}:7077"
    log = open(out / "driver.log", "wb")  # noqa: SIM115 (closed below)
    driver = hosts.popen(hosts.driver, _driver_argv(opts, "fault", master, out), log=log)
    victim = None
    try:
        _wait(lambda: (out / "started").exists() or driver.poll() is not None, 300)
        if driver.poll() is not None or not (out / "started").exists():
            raise RuntimeError(f"fault {name}: the cluster did not start: {(out / 'driver.log').read_text()[-2000:]}")
        on = [h for h in hosts.workers if _node_pids(hosts, h)]
        first = sorted(out.glob("up-*"))[0].read_text()  # the first node's host
        victim = hosts.driver if name == "driver" else next(h for h in hosts.workers if h.name == first)
        at = time.time()
        if name == "kill":
            for pid in hosts.processes(victim):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        else:
            hosts.cut(victim)
        if name == "driver":
            gone = _wait(lambda: not any(_node_pids(hosts, h) for h in on), 120)
            return {"seconds": time.time() - at, "what": "every node process gone" if gone else "processes left"}
        driver.wait(timeout=TIMEOUT)
        result = json.loads((out / "result.json").read_text())
        return {"seconds": result["at"] - at if result["error"] else None, "what": (result["error"] or "")[:160]}
    finally:
        if victim is not None and name != "kill":
            hosts.restore(victim)
        if driver.poll() is None:
            driver.kill()
        driver.wait()
        log.close()


def orchestrate(opts: argparse.Namespace) -> int:
    import tempfile

    from tfonspark.testing.hosts import Hosts, unavailable

    why = unavailable()
    if why:
        print(f"# benchmarks/hosts.py cannot make its hosts here: {why}", file=sys.stderr)
        return 1
    parts = c.parse_variants(opts.parts, PARTS)
    work = Path(tempfile.mkdtemp(prefix="tfos-bench-hosts-"))
    os.chmod(work, 0o755)
    hosts = Hosts(workers=3, prefix=PREFIX, subnet=SUBNET).up()
    results: dict[str, Any] = {}
    try:
        with c.quiet_stage("hosts and Spark up"):
            hosts.spark(memory="1g")
        master = f"spark://{hosts.master.address}:7077"
        if "feed" in parts:
            results["feed"] = {
                "three hosts": _drive(hosts, opts, "feed", master, work, "feed-hosts"),
                "one host": _drive(hosts, opts, "feed", "local-cluster[3,1,1024]", work, "feed-one-host"),
            }
        if "mwms" in parts:
            results["mwms"] = {
                "two hosts": _drive(hosts, opts, "mwms", master, work, "mwms-hosts"),
                "one host": _drive(hosts, opts, "mwms", "local-cluster[2,1,1024]", work, "mwms-one-host"),
            }
        if "faults" in parts:
            results["faults"] = {name: _fault(hosts, opts, work, name) for name in ("cut", "driver", "kill")}
    finally:
        hosts.down()
    report(results, opts)
    return 0


# ---- the report --------------------------------------------------------------------------------
def report(results: dict[str, Any], opts: argparse.Namespace) -> None:
    print(f"# load average at the end: {c.load_average()}; {os.cpu_count()} cores")
    feed = results.get("feed")
    if feed:
        rows = []
        for shape in feed["three hosts"]:
            many, one = feed["three hosts"][shape], feed["one host"][shape]
            n = many["rows"]
            rate = {
                f"{where} {k}": n / s for where, r in (("hosts", many), ("one", one)) for k, s in r["seconds"].items()
            }
            for kind in ("rdd", "df"):
                rows.append(
                    [
                        f"{shape} {kind}",
                        f"{n:,}",
                        c.fmt_rate(rate[f"hosts {kind}"]),
                        c.fmt_rate(rate[f"one {kind}"]),
                        c.fmt_ratio(rate[f"hosts {kind}"], rate[f"one {kind}"]),
                        c.fmt_rate(rate["hosts plain"]),
                        c.fmt_ratio(rate[f"hosts {kind}"], rate["hosts plain"]),
                        c.fmt_ratio(rate[f"one {kind}"], rate["one plain"]),
                    ]
                )
        header = ["feed", "rows", "3 hosts rows/s", "1 host rows/s", "hosts / 1 host"]
        header += ["plain foreachPartition, 3 hosts", "vs plain, 3 hosts", "vs plain, 1 host"]
        print("\n## The feed, 2 nodes on 3 executors (a third of the partitions cross hosts on 3 hosts)\n")
        print(c.markdown_table(header, rows))
    mwms = results.get("mwms")
    if mwms:
        many, one = mwms["two hosts"]["steps_per_s"], mwms["one host"]["steps_per_s"]
        print(f"\n## MWMS, the demo CNN, 2 nodes, global batch 64, {opts.steps - opts.warm_steps} timed steps\n")
        print(
            c.markdown_table(
                ["2 hosts steps/s", "1 host steps/s", "2 hosts / 1 host"],
                [[f"{many:.2f}", f"{one:.2f}", c.fmt_ratio(many, one)]],
            )
        )
    faults = results.get("faults")
    if faults:
        said = {
            "cut": "a node's host cut off -> NodeFailed",
            "driver": "the driver's host cut off -> node processes gone",
            "kill": "every process of a node's host killed -> NodeFailed",
        }
        print("\n## Faults between hosts, default settings\n")
        table = [
            [said[k], "n/a" if v["seconds"] is None else f"{v['seconds']:.1f}", v["what"].replace("|", "/")[:100]]
            for k, v in faults.items()
        ]
        print(c.markdown_table(["fault", "seconds", "what came"], table))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--parts", default=",".join(PARTS), help=f"which measurements, of {','.join(PARTS)}")
    p.add_argument("--rows", type=int, default=60_000, help="MNIST-shaped rows (tabular: 4x as many)")
    p.add_argument("--shapes", default="mnist,tabular", help="row shapes (benchmarks/_common.py)")
    p.add_argument("--batch", type=int, default=1024, help="rows per next_columns() read on the nodes")
    p.add_argument("--steps", type=int, default=80, help="MWMS steps, the first --warm-steps untimed")
    p.add_argument("--warm-steps", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="a smoke run: little data, few steps")
    p.add_argument("--role", default="orchestra", choices=["orchestra", "driver"], help=argparse.SUPPRESS)
    p.add_argument("--drive", choices=sorted(DRIVES), help=argparse.SUPPRESS)
    p.add_argument("--master", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.quick and opts.role == "orchestra":
        opts.rows, opts.steps, opts.warm_steps = 6_000, 20, 5
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    if opts.role == "driver":
        return driver_main(opts)
    return orchestrate(opts)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    raise SystemExit(main())
