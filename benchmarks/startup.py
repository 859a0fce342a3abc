"""Start-up, phase by phase: from ``tfonspark.run()`` to the last ``map_fun`` entered, and shutdown.

    python benchmarks/startup.py              # 5 runs on one warm local-cluster[2,1,1024]
    python benchmarks/startup.py --reps 2

Measured the way users start a job: one warm Spark context (a trivial job runs first, and
is timed too: the floor of any Spark job here), then ``tfonspark.run`` of a ``map_fun`` that
only reports when it was entered, on 2 nodes (``InputMode.TENSORFLOW``). Every timestamp is
this machine's wall clock, so the phases line up:

* **Spark to supervisor**: ``run()`` called until the node's supervisor process exists
  (driver set-up, Spark job submit, the barrier stage, the task spawning the supervisor);
* **rendezvous to TF process**: the supervisor exists until its TF process exists (register,
  wait for every node, the cluster spec, forking the TF process from the executor's fork server,
  or spawning it where there is none);
* **TF process to map_fun**: the interpreter starts, imports tfonspark and pyspark's
  cloudpickle, starts the node's servers and unpickles ``map_fun``, which is entered;
* **total**: ``run()`` called until the *last* node entered ``map_fun``; ``run()`` itself
  returns once the cluster has formed.

Each phase is the slowest node's. Process creation times come from ``/proc`` (10 ms ticks).
The table also shows whether TensorFlow was already imported when ``map_fun`` was entered
(yes where the TF process was forked from the executor's fork server, which imported it once
for every later node of that executor; no where it was spawned: ``TFONSPARK_FORK_SERVER=off``,
and a ``map_fun`` that never imports it does not pay for it then), the cost of
the TF process's own imports measured alone in a fresh interpreter (also with pyspark from
Spark's ``pyspark.zip``, which the TF process imported until its supervisor dropped the zip
from its ``PYTHONPATH``), and ``shutdown()``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402


def supervisor_pid(executor_id: int) -> int:
    """This TF process's supervisor: its parent where it was spawned; where it was forked from
    the executor's fork server, the supervisor of its cluster and executor, by command line."""
    import psutil

    me = psutil.Process()
    parent = me.parent()
    if parent is not None and "tfonspark.executor.supervisor" in " ".join(parent.cmdline()):
        return parent.pid
    mine = me.cmdline()
    cluster = mine[mine.index("--cluster") + 1][:12]
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if "tfonspark.executor.supervisor" in cmd and f"--executor {executor_id}" in cmd and cluster in cmd:
            return int(proc.pid)
    raise LookupError(f"no supervisor of TF process {me.pid} (executor {executor_id}, cluster {cluster})")


def created(pid: int) -> float:
    """When process ``pid`` was created, on the wall clock (Linux ``/proc``; psutil's creation times
    lean on the boot time, which may be off from ``time.time()`` by a second in a container)."""
    import os as _os
    import time as _time

    with open(f"/proc/{pid}/stat") as stat:
        start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as uptime:
        now_uptime = float(uptime.read().split()[0])
    return _time.time() - (now_uptime - start_ticks / _os.sysconf("SC_CLK_TCK"))


def map_fun(args: Any, ctx: Any) -> None:
    """Report when this node entered ``map_fun``, and when its processes were created."""
    import os as _os
    import sys as _sys
    import time as _time

    entered = _time.time()
    ctx.report(
        {
            "entered": entered,
            "tf_process": created(_os.getpid()),
            "supervisor": created(supervisor_pid(ctx.executor_id)),
            "tf_imported": "tensorflow" in _sys.modules,
        }
    )


@dataclass
class Run:
    """One ``run()``: the slowest node's phases, seconds."""

    to_supervisor: float
    to_tf_process: float
    to_map_fun: float
    total: float
    run_returned: float
    shutdown: float
    tf_imported: bool


def one_run(sc: Any) -> Run:
    """``tfonspark.run`` of ``map_fun`` on 2 nodes, timed phase by phase; then ``shutdown()``."""
    import tfonspark

    start = time.time()
    cluster = tfonspark.run(sc, map_fun, None, 2, input_mode=tfonspark.InputMode.TENSORFLOW)
    returned = time.time()
    deadline = time.monotonic() + 60
    while len(cluster.reports) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    reports = [r.metrics for r in cluster.reports]
    stop = time.time()
    cluster.shutdown()
    stopped = time.time()
    if len(reports) < 2:
        raise RuntimeError(f"only {len(reports)} of 2 nodes reported within 60 s")
    return Run(
        to_supervisor=max(r["supervisor"] for r in reports) - start,
        to_tf_process=max(r["tf_process"] - r["supervisor"] for r in reports),
        to_map_fun=max(r["entered"] - r["tf_process"] for r in reports),
        total=max(r["entered"] for r in reports) - start,
        run_returned=returned - start,
        shutdown=stopped - stop,
        tf_imported=any(r["tf_imported"] for r in reports),
    )


def trivial_job(sc: Any) -> float:
    """A 2-partition Spark job that does nothing: the floor of any job on this context."""
    start = time.time()
    sc.parallelize(range(2), 2).foreach(lambda _: None)
    return time.time() - start


def import_cost(zips: bool = False) -> float:
    """Seconds a fresh interpreter spends importing what the TF process imports before ``map_fun``.

    With ``zips``, pyspark comes from Spark's ``pyspark.zip`` first on ``PYTHONPATH``, as in a
    Python worker: what each TF process paid before the supervisor dropped the zips.
    """
    code = (
        "import time; t = time.perf_counter(); import tfonspark.tfprocess.entry; "
        "from pyspark import cloudpickle; print(time.perf_counter() - t)"
    )
    env = dict(os.environ)
    if zips:
        import glob

        import pyspark

        lib = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
        paths = [os.path.join(lib, "pyspark.zip"), *glob.glob(os.path.join(lib, "py4j-*-src.zip"))]
        env["PYTHONPATH"] = os.pathsep.join([*paths, *[p for p in sys.path if p]])
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # as Spark sets it for its workers
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return float(run.stdout)


def compile_tfonspark() -> None:
    """Write tfonspark's bytecode, as ``pip install`` does: with ``PYTHONDONTWRITEBYTECODE`` set
    (this checkout's environment sets it, and Spark sets it for its workers) an editable install
    has none, and every supervisor and TF process compiled tfonspark from source (~0.2-0.3 s)."""
    import compileall

    import tfonspark

    compileall.compile_dir(os.path.dirname(tfonspark.__file__), quiet=1)


def _row(name: str, values: list[float]) -> str:
    cells = " | ".join(f"{v:.3f}" for v in values)
    return f"| {name} | {statistics.median(values):.3f} | {cells} |"


def table(runs: list[Run], trivial: list[float], imports: list[float], zipped: list[float]) -> str:
    """The markdown table: one column per run, the median first."""
    reps = " | ".join(f"run {i + 1}" for i in range(len(runs)))
    lines = [f"| phase (s) | median | {reps} |", "|---|---|" + "---|" * len(runs)]
    for field, name in (
        ("to_supervisor", "run() -> supervisor process (submit, barrier stage, spawn)"),
        ("to_tf_process", "supervisor -> TF process (register, rendezvous, fork or spawn)"),
        ("to_map_fun", "TF process -> map_fun entered (interpreter, imports, unpickle)"),
        ("total", "**run() -> last map_fun entered**"),
        ("run_returned", "run() returned"),
        ("shutdown", "shutdown()"),
    ):
        lines.append(_row(name, [getattr(r, field) for r in runs]))
    lines.append(_row("a trivial Spark job (the floor)", trivial))
    lines.append(_row("TF process imports alone (fresh interpreter)", imports))
    lines.append(_row("the same, pyspark from Spark's pyspark.zip (no bytecode)", zipped))
    lines.append(f"\nTensorFlow imported before map_fun: {any(r.tf_imported for r in runs)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--no-compile", action="store_true", help="leave tfonspark without bytecode, if this environment has none"
    )
    opts = parser.parse_args(argv)
    if not opts.no_compile:
        compile_tfonspark()
    _common.ship_by_value(sys.modules[__name__])
    load_before = os.getloadavg()[0]
    sc, _ = _common.fresh_spark()
    trivial_job(sc)  # warm: the executors' Python workers exist
    one_run(sc)  # warm: the first run() also loads what later ones reuse
    runs, trivial, imports, zipped = [], [], [], []
    for _ in range(opts.reps):
        trivial.append(trivial_job(sc))
        runs.append(one_run(sc))
        imports.append(import_cost())
        zipped.append(import_cost(zips=True))
    _common.stop_spark()
    print(table(runs, trivial, imports, zipped))
    print(f"\n`python benchmarks/startup.py --reps {opts.reps}` on {_common.MASTER}, warm context; ", end="")
    print(f"load {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
