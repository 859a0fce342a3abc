"""Shared pieces of the feed and inference benchmarks.

Data generation (identical rows for every variant), one fresh ``local-cluster[2,1,1024]`` Spark
context per variant, the TFoS 2.2.5 installer/loader, consumer row counters that the driver can
poll, timing and the result tables. Run the benchmarks themselves, not this module.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import mmap
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MASTER = "local-cluster[2,1,1024]"
TFOS_VERSION = "2.2.5"
TFOS_DIR = (
    Path(os.environ.get("TFOS_BENCH_DIR", Path.home() / ".cache" / "tfonspark-bench"))
    / f"tensorflowonspark-{TFOS_VERSION}"
)
_COUNT = "<q"  # a format, not a struct.Struct: this module is pickled by value
_COUNT_SIZE = struct.calcsize(_COUNT)


# ---- data ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """A row shape: ``width`` float32 features plus an integer label."""

    name: str
    width: int
    rows: int  # default row count
    tfos_rows: int  # default cap for TFoS, which is slow
    quick_rows: int  # row count for --quick


SHAPES = {
    "mnist": Shape("mnist", 784, 60_000, 60_000, 4_000),
    "tabular": Shape("tabular", 32, 300_000, 100_000, 20_000),
}


def parse_shapes(text: str) -> list[Shape]:
    """``"mnist,tabular"`` -> shapes, rejecting unknown names."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown or not names:
        raise SystemExit(f"--shapes: unknown {unknown}; choose from {sorted(SHAPES)}")
    return [SHAPES[n] for n in names]


def parse_variants(text: str, known: list[str]) -> list[str]:
    """``"rdd,df"`` -> variant names in the given order, rejecting unknown names."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(f"--variants: unknown {unknown}; choose from {known}")
    return names


def partition_arrays(width: int, rows: int, partitions: int, index: int) -> tuple[Any, Any]:
    """The deterministic features (float32) and labels (int64) of one partition."""
    start = rows * index // partitions
    stop = rows * (index + 1) // partitions
    rng = np.random.default_rng(1234 + index)
    features = rng.random((stop - start, width), dtype=np.float32)
    labels = np.arange(start, stop, dtype=np.int64) % 10
    return features, labels


def make_rdd(sc: Any, shape: Shape, rows: int, partitions: int) -> Any:
    """An RDD of ``(float32 array, int)`` rows, generated on the executors."""
    width = shape.width

    def rows_of(index: int, _: Iterator[int]) -> Iterator[tuple[Any, int]]:
        features, labels = partition_arrays(width, rows, partitions, index)
        for i in range(len(labels)):
            yield features[i], int(labels[i])

    return sc.parallelize(range(partitions), partitions).mapPartitionsWithIndex(rows_of)


def make_dataframe(spark: Any, shape: Shape, rows: int, partitions: int) -> Any:
    """A DataFrame ``features array<float>, label long`` with the same rows as :func:`make_rdd`."""
    width = shape.width

    def batches_of(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            for index in batch.column(0).to_pylist():
                features, labels = partition_arrays(width, rows, partitions, index)
                offsets = pa.array(np.arange(0, features.size + 1, width, dtype=np.int32))
                values = pa.ListArray.from_arrays(offsets, pa.array(features.reshape(-1)))
                yield pa.RecordBatch.from_arrays([values, pa.array(labels)], ["features", "label"])

    ids = spark.range(0, partitions, numPartitions=partitions)
    return ids.mapInArrow(batches_of, "features array<float>, label long")


def cached(data: Any, expected: int) -> Any:
    """Cache and materialise ``data`` (RDD or DataFrame) before anything is timed."""
    data = data.cache()
    count = data.count()
    if count != expected:
        raise RuntimeError(f"cached {count} rows, expected {expected}")
    return data


# ---- spark -----------------------------------------------------------------------------------
def fresh_spark(reuse: bool = False) -> tuple[Any, Any]:
    """A new SparkContext on two executors (the previous one is stopped) and its session.

    ``reuse``: keep the running context instead (``--quick`` smoke runs only: measurements
    need a fresh context per variant).
    """
    from pyspark.sql import SparkSession

    from tfonspark.testing import SparkManager

    manager = SparkManager.instance()
    if not reuse:
        manager.stop()
    sc = manager.get(MASTER)
    return sc, SparkSession.builder.getOrCreate()


def stop_spark() -> None:
    """Stop the benchmark's SparkContext, if one is running."""
    from tfonspark.testing import SparkManager

    SparkManager.instance().stop()


def ship_by_value(*modules: Any) -> None:
    """Executors cannot import the benchmark modules: pickle their functions by value."""
    from pyspark import cloudpickle

    for module in modules:
        cloudpickle.register_pickle_by_value(module)


# ---- TensorFlowOnSpark 2.2.5 -------------------------------------------------------------------
def _add_tfos_path() -> None:
    """Make the TFoS install visible here and in executors (they inherit PYTHONPATH)."""
    path = str(TFOS_DIR)
    if path not in sys.path:
        sys.path.append(path)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if path not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([*parts, path])


def install_tfos() -> str:
    """``pip install --no-deps --target`` TFoS 2.2.5 into a cache dir; '' or why it failed.

    ``--no-deps``: TFoS only needs ``packaging`` and ``setuptools`` (``pkg_resources``), which the
    project venv has; ``--target`` keeps it out of the venv that the test suite uses.
    """
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--disable-pip-version-check",
        "--target",
        str(TFOS_DIR),
        f"tensorflowonspark=={TFOS_VERSION}",
    ]
    print(f"# installing TensorFlowOnSpark {TFOS_VERSION}: {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode:
        return f"pip install failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
    return ""


def load_tfos(install: bool) -> tuple[Any, str]:
    """Import TFoS 2.2.5 (installing it first if asked); returns (TFCluster module, skip reason)."""
    _add_tfos_path()
    if install and not (TFOS_DIR / "tensorflowonspark").is_dir():
        reason = install_tfos()
        if reason:
            return None, reason
    try:
        tfcluster = importlib.import_module("tensorflowonspark.TFCluster")
        version = importlib.import_module("tensorflowonspark").__version__
    except Exception as exc:  # any import failure means: skip the variant, say why
        return None, f"cannot import tensorflowonspark: {type(exc).__name__}: {exc}"
    if version != TFOS_VERSION:
        return None, f"tensorflowonspark {version} found, the benchmark needs {TFOS_VERSION}"
    import logging

    # TFoS calls logging.basicConfig(level=INFO) on import: keep the report readable
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("tensorflowonspark").setLevel(logging.WARNING)
    return tfcluster, ""


def guarded(variant: str, fn: Callable[[], Any]) -> bool:
    """Run a TFoS variant; a failure (TFoS calls ``sys.exit(1)`` on errors) is printed, not fatal."""
    try:
        fn()
        return True
    except (Exception, SystemExit) as exc:
        text = str(exc).strip().splitlines()
        print(f"FAILED {variant}: {type(exc).__name__}: {text[0] if text else ''}", flush=True)
        return False


def stop_tfos(cluster: Any) -> None:
    """TFoS ``shutdown`` plus undoing its process-wide SIGALRM (labelled shim, not feeding)."""
    import signal

    try:
        cluster.shutdown(timeout=-1)
    finally:
        signal.alarm(0)


# ---- consumer row counters ----------------------------------------------------------------------
class Counters:
    """Per-node row counters in small mmap'd files: consumers bump them, the driver polls them.

    The driver stops the clock when the TF side has *consumed* every fed row, not when the feed
    job returns (tfonspark acknowledges a partition once it is buffered in the TF process).
    """

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="tfos-bench-")
        atexit.register(shutil.rmtree, self.dir, True)

    def total(self) -> int:
        """Rows counted by all consumers so far."""
        total = 0
        for name in os.listdir(self.dir):
            if not name.startswith("node-"):
                continue
            with open(os.path.join(self.dir, name), "rb") as f:
                data = f.read(_COUNT_SIZE)
            if len(data) == _COUNT_SIZE:
                total += struct.unpack(_COUNT, data)[0]
        return total

    def release(self) -> None:
        """Let consumers that finished (``NodeCounter.hold``) return."""
        open(os.path.join(self.dir, "release"), "w").close()

    def wait_for(self, target: int, timeout: float) -> float:
        """Block until the counters sum to ``target``; returns the monotonic time it happened."""
        deadline = time.perf_counter() + timeout
        while True:
            now = time.perf_counter()
            got = self.total()
            if got >= target:
                return now
            if now > deadline:
                raise TimeoutError(f"consumers counted {got} of {target} rows in {timeout:.0f}s")
            time.sleep(0.002)


class NodeCounter:
    """The consumer side of :class:`Counters` (used inside the TF process)."""

    def __init__(self, directory: str, index: int) -> None:
        self.dir = directory
        path = os.path.join(directory, f"node-{index}")
        with open(path, "wb") as f:
            f.write(b"\0" * _COUNT_SIZE)
        self._file = open(path, "r+b")  # noqa: SIM115 (lives as long as the process)
        self._map = mmap.mmap(self._file.fileno(), _COUNT_SIZE)
        self.count = 0

    def add(self, n: int) -> None:
        """Count ``n`` more rows (visible to the driver at once)."""
        self.count += n
        struct.pack_into(_COUNT, self._map, 0, self.count)

    def hold(self, timeout: float = 120.0) -> None:
        """Keep this (TF) process alive until the driver has measured its CPU time."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(os.path.join(self.dir, "release")) and time.monotonic() < deadline:
            time.sleep(0.01)


# ---- timing and reporting ------------------------------------------------------------------------
_KINDS = (
    ("tfonspark.tfprocess.entry", "tf"),
    ("tfonspark.executor.supervisor", "supervisor"),
    ("pyspark.daemon", "pyworker"),
    ("CoarseGrainedExecutorBackend", "executor-jvm"),
    ("java", "driver-jvm"),
)


def drain_columns(args: dict[str, Any], ctx: Any) -> NodeCounter:
    """tfonspark's consumer in every benchmark: drain columnar batches until the feed ends, counting
    rows in a :class:`NodeCounter` (``args``: ``dir`` of the counters, ``batch`` rows per read)."""
    counter = NodeCounter(args["dir"], ctx.task_index)
    feed = ctx.get_data_feed(train_mode=True)
    while True:
        batch = feed.next_columns(args["batch"])
        if batch is None:
            return counter
        counter.add(batch.count)


def _kind(proc: Any) -> str:
    """What a process of the run is (TFoS's TF processes are forks of Python workers)."""
    cmd = " ".join(proc.cmdline())
    return next((kind for marker, kind in _KINDS if marker in cmd), "driver")


def tree_cpu() -> dict[int, tuple[str, float]] | None:
    """CPU seconds (user + system) so far of this process and each descendant, by pid (system
    time apart, under the negated pid, with ``TFOS_BENCH_CPU_DETAIL=sys``).

    That is the driver, its JVM, the executor JVMs, Python workers, supervisors and TF
    processes: a cost that, unlike wall time, hardly depends on what else the machine runs.
    """
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    out = {}
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times, kind = proc.cpu_times(), _kind(proc)
            if os.environ.get("TFOS_BENCH_CPU_DETAIL") == "sys":  # system time apart: "<kind> sys"
                out[proc.pid], out[-proc.pid] = (kind, times.user), (f"{kind} sys", times.system)
            else:
                out[proc.pid] = (kind, times.user + times.system)
    return out


@dataclass
class Sample:
    """One timed run: wall seconds, CPU seconds by process kind (None: no psutil), rows."""

    seconds: float
    cpu_by_kind: dict[str, float] | None
    rows: int = 0

    @property
    def rate(self) -> float:
        return self.rows / self.seconds

    @property
    def cpu(self) -> float | None:
        return None if self.cpu_by_kind is None else sum(self.cpu_by_kind.values())

    @property
    def cpu_us_per_row(self) -> float | None:
        cpu = self.cpu
        return None if cpu is None or not self.rows else cpu / self.rows * 1e6

    def __str__(self) -> str:
        text = (
            f"{self.rows:>9,} rows {self.seconds:7.2f}s {self.rate:>11,.0f} rows/s "
            f"{fmt_us(self.cpu_us_per_row):>7} CPU us/row"
        )
        if os.environ.get("TFOS_BENCH_CPU_DETAIL") and self.cpu_by_kind and self.rows:
            text += (
                " ("
                + ", ".join(f"{kind} {cpu / self.rows * 1e6:.1f}" for kind, cpu in sorted(self.cpu_by_kind.items()))
                + ")"
            )
        return text


class Meter:
    """Starts the clocks (wall and per-process CPU of the run) when created."""

    def __init__(self) -> None:
        self.cpu = tree_cpu()
        self.start = time.perf_counter()

    def stop(self, at: float | None = None) -> Sample:
        """The sample up to now (or up to the ``perf_counter`` time ``at``).

        CPU is counted per process: one that started meanwhile counts from zero, one that
        ended meanwhile is missed (the TF processes are kept alive until this is read).
        """
        end = time.perf_counter() if at is None else at
        now = tree_cpu()
        if now is None or self.cpu is None:
            return Sample(end - self.start, None)
        by_kind: dict[str, float] = {}
        for pid, (kind, cpu) in now.items():
            by_kind[kind] = by_kind.get(kind, 0.0) + cpu - self.cpu.get(pid, (kind, 0.0))[1]
        return Sample(end - self.start, by_kind)


def fmt_us(value: float | None) -> str:
    """Microseconds for a table cell."""
    return "n/a" if value is None else f"{value:,.1f}"


def in_background(fn: Callable[[], Any]) -> Callable[[], None]:
    """Start ``fn`` in a thread; the returned function joins it and re-raises its error."""
    import threading

    error: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the joining thread
            error.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()

    def join() -> None:
        thread.join()
        if error:
            raise error[0]

    return join


def load_average() -> str:
    """The 1, 5 and 15 minute load averages."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def median(values: list[float]) -> float | None:
    """The median, or None for no values."""
    return statistics.median(values) if values else None


def fmt_rate(rate: float | None) -> str:
    """Rows/s for a table cell."""
    return "n/a" if rate is None else f"{rate:,.0f}"


def fmt_ratio(num: float | None, den: float | None) -> str:
    """``num / den`` as ``1.23x`` for a table cell."""
    return "n/a" if num is None or den is None or den == 0 else f"{num / den:.2f}x"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def rotate(items: list[str], rep: int) -> list[str]:
    """Variant order for repetition ``rep``: rotated, so no variant always runs first."""
    k = rep % len(items) if items else 0
    return items[k:] + items[:k]


@contextlib.contextmanager
def quiet_stage(label: str) -> Iterator[None]:
    """Print what is running and how long it took (to stderr, so stdout stays the report)."""
    start = time.perf_counter()
    print(f"# {label} ...", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        print(f"# {label}: {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)


# ---- the command line and the run loop both scripts share ------------------------------------------
def add_run_args(p: Any, variants: list[str], batch_help: str) -> None:
    """The options every benchmark takes: repetitions, variants, partitions, batch, quick, install."""
    p.add_argument("--reps", type=int, default=2, help="repetitions of every variant (default 2)")
    p.add_argument("--variants", default=",".join(variants), help=f"comma list of: {', '.join(variants)}")
    p.add_argument("--partitions", type=int, default=8, help="partitions of the data (default 8)")
    p.add_argument("--batch", type=int, default=1024, help=f"{batch_help} (default 1024)")
    p.add_argument(
        "--warmup",
        type=float,
        default=15.0,
        help="seconds of identical untimed jobs before each timed one (default 15): "
        "the JVMs' JIT compilers compete for the cores most in the first seconds (and "
        "until then the ratios depend on the order of the variants); they settle only "
        "after about a minute of jobs",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: small data, one repetition, no warm-up, one shared Spark context",
    )
    p.add_argument(
        "--no-install", action="store_true", help="do not pip-install TFoS 2.2.5 if it is missing (skip that variant)"
    )


def quick_defaults(opts: Any, argv: list[str] | None, **values: Any) -> None:
    """Under ``--quick``, options the user did not give take these values (e.g. ``reps=1``)."""
    given = argv if argv is not None else sys.argv
    if opts.quick:
        for name, value in values.items():
            if f"--{name.replace('_', '-')}" not in given:
                setattr(opts, name, value)


def selected_variants(opts: Any, known: list[str]) -> tuple[list[str], Any]:
    """The variants to run and the TFoS module (None, and its variant dropped, if unavailable)."""
    variants = parse_variants(opts.variants, known)
    tfos = None
    if "tfos" in variants:
        tfos, reason = load_tfos(install=not opts.no_install)
        if tfos is None:
            print(f"SKIPPED tfos: {reason}", flush=True)
            variants.remove("tfos")
    return variants, tfos


def warm_up(job: Callable[[], Any], seconds: float) -> None:
    """Run ``job`` once, then again until ``seconds`` have passed."""
    start = time.perf_counter()
    job()
    while time.perf_counter() - start < seconds:
        job()


def alternate(variants: list[str], reps: int, runners: dict[str, Callable[[], Any]]) -> float:
    """Run every variant ``reps`` times, rotating the order; stop Spark; return the seconds taken."""
    started = time.perf_counter()
    try:
        for rep in range(reps):
            for variant in rotate(variants, rep):
                with quiet_stage(f"rep {rep + 1}/{reps} {variant}"):
                    runners[variant]()
    finally:
        stop_spark()
    return time.perf_counter() - started
