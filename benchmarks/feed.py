"""Feed throughput: tfonspark vs TensorFlowOnSpark 2.2.5 vs what plain Spark can do.

Every variant runs on its own fresh ``local-cluster[2,1,1024]`` (two executor JVMs), variants
alternate within each repetition, and all of them read the same cached rows:

- ``tfos``:  TFoS 2.2.5 ``InputMode.SPARK``, ``TFCluster.train(rdd)``
- ``rdd``:   tfonspark ``Cluster.train(rdd)`` (rows packed into numpy columns)
- ``df``:    tfonspark ``Cluster.train(df)`` (Arrow batches via ``mapInArrow``)
- ``plain``: the Spark limits: ``rdd.foreachPartition`` iterating rows, ``df.mapInArrow``
  draining batches
- ``paired`` (not in the default set): ``rdd`` and plain ``foreachPartition`` of the same RDD
  job by job on one cluster, in alternating order (``--pairs`` warm pairs): the ratio without
  the drift between two clusters' JVMs and the host's load over minutes; each side runs in
  Python workers of its own, as on a cluster of its own

Rows are ``(float32 array, int)`` (``--row-types array``) or, as TFoS users' RDDs hold them,
``(list of floats, int)`` (``list``: ``x.tolist()``, ``(vec[1:], vec[0])``) or ``(tuple of
floats, int)`` (``tuple``), or ``pyspark.sql.Row(features=[floats], label=int)`` from a cached
DataFrame's ``df.rdd`` (``row``); ``mnist-list`` is the MNIST shape as list rows. DataFrames and
TFoS are measured on ``array`` rows only.

With ``--map`` the RDD variants (``rdd``, ``plain``) read the cached rows through an uncached
``.map(...)``, as most TFoS programs feed (``sc.textFile(...).map(parse)``, ``df.rdd.map(...)``):
those rows exist only as Python objects in the task, so tfonspark packs them value by value
instead of decoding Spark's pickled batches. Give ``--epochs 1`` with it: a union of maps
(``num_epochs > 1``) is pickled by Spark between two Python workers again. ``row`` rows come
from ``df.rdd``, itself such a map, with or without ``--map``.

Each RDD measurement is taken twice: ``1st pass``, one pass over the data right after a small
warm-up job (a 2,000-row feed), and warm, as follows.

The TF-side consumer is the same in both frameworks (drain batches, count rows), and the clock
stops once the TF processes have *consumed* every row. tfonspark and plain Spark pass over the
data ``--epochs`` times in one job (a union of the cached data, as ``train(num_epochs=...)``
does), so that a job's fixed start-up cost does not decide the ratio; TFoS runs one epoch (its
rows/s does not depend on it, and it is slow). Each timed job follows ``--warmup`` seconds of
the identical job, untimed: a fresh JVM's JIT compilers compete for the cores most then (they
settle after about a minute: the ``paired`` variant waits ``--paired-warmup``, default 60 s).
Prints rows/s and CPU time per row (median of reps), their ratios, and Markdown tables.

    python benchmarks/feed.py                # defaults: about 10 minutes on 2 idle cores
    python benchmarks/feed.py --quick --variants rdd,df,plain
    python benchmarks/feed.py --variants rdd,plain --row-types list,tuple
    python benchmarks/feed.py --pack --row-types array,list,tuple    # no Spark: the Python work
    python benchmarks/feed.py --map --variants rdd,plain --row-types list,tuple,array,row --epochs 1
    python benchmarks/feed.py --map --variants paired --row-types list,tuple --epochs 1 --pairs 3
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

VARIANTS = ["tfos", "rdd", "df", "plain", "paired"]
DEFAULT_VARIANTS = VARIANTS[:4]
ROW_TYPES = ["array", "list", "tuple", "row"]
LABELS = {
    "tfos": "TFoS 2.2.5",
    "rdd": "tfonspark RDD",
    "df": "tfonspark DF",
    "plain-rdd": "Spark foreachPartition",
    "plain-arrow": "Spark mapInArrow drain",
    "rdd-cold": "tfonspark RDD 1st pass",
    "plain-rdd-cold": "Spark foreachPartition 1st pass",
    "paired-rdd": "tfonspark RDD, paired",
    "paired-plain": "Spark foreachPartition, paired",
    "paired-rdd-cold": "tfonspark RDD 1st pass, paired",
    "paired-plain-cold": "Spark foreachPartition 1st pass, paired",
}
#: (numerator, denominator, target) of the reported ratios
RATIOS = [
    ("rdd", "plain-rdd", 0.8),
    ("rdd-cold", "plain-rdd-cold", 0.8),
    ("paired-rdd", "paired-plain", 0.8),
    ("paired-rdd-cold", "paired-plain-cold", 0.8),
    ("df", "plain-arrow", 0.8),
    ("rdd", "tfos", 10.0),
    ("df", "tfos", 10.0),
]
TIMEOUT = 900.0
TFOS_WARM_ROWS = 5000
#: rows of the small job that precedes a 1st-pass measurement
COLD_WARM_ROWS = 2000
#: rows of the paired variant's small warm-up jobs, cached: enough batches for the executor
#: JVMs to compile their path from cached blocks to the Python workers before either side's
#: 1st pass
PAIRED_WARM_ROWS = 10_000
#: seconds of untimed pairs before the paired variant's warm pairs. One executor JVM fed 60,000
#: MNIST array rows a job, back to back, spent 9.2 CPU s compiling (``jstat -compiler``) in its
#: first 15 s (most of a core), 3.9 in the next 15, 2.0 and 2.9 after that, then 1.0-1.8 every
#: 15 s: its compiler threads settle after about a minute
PAIRED_WARMUP = 60.0
NODES = 2


@dataclass(frozen=True)
class Case:
    """A row shape and how its rows are held: ``array`` (numpy), ``list`` or ``tuple`` of floats."""

    shape: c.Shape
    row_type: str

    @property
    def name(self) -> str:
        return self.shape.name if self.row_type == "array" else f"{self.shape.name}-{self.row_type}"


def case_rows(case: Case, rows: int, partitions: int, index: int) -> Iterator[tuple[Any, int]]:
    """Partition ``index`` of ``case``'s rows: the values of :func:`c.make_rdd`, held as asked."""
    features, labels = c.partition_arrays(case.shape.width, rows, partitions, index)
    if case.row_type == "array":
        return zip(features, labels.tolist())
    vectors = features.tolist()
    if case.row_type == "row":
        from pyspark.sql import Row

        return (Row(features=v, label=label) for v, label in zip(vectors, labels.tolist()))
    return zip(map(tuple, vectors) if case.row_type == "tuple" else vectors, labels.tolist())


def make_rdd(sc: Any, case: Case, rows: int, partitions: int) -> Any:
    """An RDD of ``(features, int)`` rows of ``case``, generated on the executors."""
    if case.row_type == "row":
        from pyspark.sql import SparkSession

        return c.make_dataframe(SparkSession.builder.getOrCreate(), case.shape, rows, partitions).rdd
    if case.row_type == "array":
        return c.make_rdd(sc, case.shape, rows, partitions)
    return sc.parallelize(range(partitions), partitions).mapPartitionsWithIndex(
        lambda index, _: case_rows(case, rows, partitions, index)
    )


def _same(row: Any) -> Any:
    """The ``map`` function of ``--map``: the row itself (what a parse or preprocess returns)."""
    return row


def fed_rdd(data: Any, case: Case, mapped: bool) -> Any:
    """The RDD a variant reads from cached ``data``: ``df.rdd`` for ``row`` rows; with ``--map``
    behind an uncached ``.map(...)``."""
    rdd = data.rdd if case.row_type == "row" else data
    return rdd.map(_same) if mapped else rdd


# ---- --pack: the packing alone, no Spark ----------------------------------------------------------
PACK_REPS = 5
PACK_HEADER = [
    "shape",
    "rows",
    "rows/pickle",
    "rows/batch",
    "unpickle+drop us/row",
    "unpickle+pack+drop us/row",
    "packing ns/value",
    "plain / feed",
    "pickles decoded us/row",
    "plain / decoded",
]


def spark_pickles(rows: list[Any]) -> list[bytes]:
    """``rows`` pickled in batches as PySpark's ``AutoBatchedSerializer`` stores them (the batch
    doubles until a pickle reaches 64 KiB)."""
    import pickle

    blobs, batch, start = [], 1, 0
    while start < len(rows):
        blobs.append(pickle.dumps(rows[start : start + batch], pickle.HIGHEST_PROTOCOL))
        start += batch
        if len(blobs[-1]) < 1 << 16:
            batch *= 2
    return blobs


def pack_bench(cases: list[Case], rows: int) -> list[list[str]]:
    """A feed task's Python work on ``case``'s rows against ``foreachPartition``'s, without Spark.

    Both unpickle Spark's batches of rows (as a PySpark worker does) and drop each row after
    use; the feed task also packs them (``row_batches``' own chunking into ``pack_rows``). Last, the
    feed task's work on a stored RDD: the same pickles decoded into columns without unpickling
    (``train_pickled``). CPU seconds, min of ``PACK_REPS``; rows for :func:`c.markdown_table`.
    """
    import pickle

    from tfonspark.executor.feedbatches import decoded_batches, row_batches

    out = []
    for case in cases:
        n = rows or case.shape.quick_rows * 4
        blobs = spark_pickles(list(case_rows(case, n, 1, 0)))
        counts = [b.count for b in row_batches(0, _unpickled(blobs))]

        def plain(blobs: list[bytes] = blobs) -> None:
            for _ in _unpickled(blobs):
                pass

        def feed(blobs: list[bytes] = blobs) -> None:
            for _ in row_batches(0, _unpickled(blobs)):
                pass

        def decoded(blobs: list[bytes] = blobs) -> None:
            for _ in decoded_batches(0, iter(blobs)):
                pass

        values = n * case.shape.width
        cpu = {"plain": _min_cpu(plain), "feed": _min_cpu(feed), "decoded": _min_cpu(decoded)}
        out.append(
            [
                case.name,
                f"{n:,}",
                f"{max(len(pickle.loads(b)) for b in blobs):,}",
                f"{max(counts):,}",
                f"{cpu['plain'] / n * 1e6:.2f}",
                f"{cpu['feed'] / n * 1e6:.2f}",
                f"{(cpu['feed'] - cpu['plain']) / values * 1e9:.1f}",
                f"{cpu['plain'] / cpu['feed']:.2f}x",
                f"{cpu['decoded'] / n * 1e6:.2f}",
                f"{cpu['plain'] / cpu['decoded']:.2f}x",
            ]
        )
        print(f"pack {case.name:<16} " + "  ".join(out[-1][1:]), flush=True)
    return out


def _unpickled(blobs: list[bytes]) -> Iterator[Any]:
    """The rows of pickled batches, one batch unpickled at a time (as a PySpark worker reads)."""
    import itertools
    import pickle

    return itertools.chain.from_iterable(map(pickle.loads, blobs))


def _min_cpu(fn: Any) -> float:
    """The least process CPU seconds of ``PACK_REPS`` calls of ``fn``."""
    times = []
    for _ in range(PACK_REPS):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


# ---- the TF-side consumers (identical work: drain, count) -----------------------------------------
def consume_tfonspark(args: dict[str, Any], ctx: Any) -> None:
    """tfonspark ``map_fun``: drain columnar batches until the feed ends, counting rows."""
    c.drain_columns(args, ctx).hold()  # stay alive until the driver has read this process's CPU time


def consume_tfos(args: dict[str, Any], ctx: Any) -> None:
    """TFoS ``map_fun``: drain ``next_batch`` lists until the feed ends, counting rows."""
    counter = c.NodeCounter(args["dir"], ctx.task_index)
    feed = ctx.get_data_feed(train_mode=True)
    while not feed.should_stop():
        counter.add(len(feed.next_batch(args["batch"])))


# ---- plain Spark ----------------------------------------------------------------------------------
#: set in the environment of plain Spark's jobs only, so that they run in Python workers of their
#: own (Spark keeps a pool of workers per environment), never in one a tfonspark feed task ran in
PLAIN_WORKERS = "TFOS_BENCH_PLAIN_WORKERS"


def plain_rdd(sc: Any, rdd: Any, epochs: int = 1) -> int:
    """``foreachPartition`` iterating every row ``epochs`` times in one job; returns the rows seen.

    It runs in Python workers no tfonspark task has run in: a feed task freezes its worker's
    heap (``gc.freeze``), which takes the full ``gc.collect()`` that PySpark's daemon runs after
    every task in a reused worker from ~10 ms to little, and plain Spark's tasks in that worker
    would gain it too (``paired`` shares the executors).
    """
    seen = sc.accumulator(0)

    def drain(rows: Any) -> None:
        seen.add(sum(1 for _ in rows))

    sc.environment[PLAIN_WORKERS] = "1"  # read when the job's Python function is made, below
    try:
        (sc.union([rdd] * epochs) if epochs > 1 else rdd).foreachPartition(drain)
    finally:
        sc.environment.pop(PLAIN_WORKERS, None)
    return int(seen.value)


def plain_arrow(df: Any, epochs: int = 1) -> int:
    """``mapInArrow`` draining every record batch ``epochs`` times in one job; returns the rows seen."""

    def drain(batches: Any) -> Any:
        import pyarrow as pa

        yield pa.RecordBatch.from_pydict({"rows": [sum(b.num_rows for b in batches)]})

    data = functools.reduce(lambda a, b: a.unionAll(b), [df] * epochs)
    return sum(r[0] for r in data.mapInArrow(drain, "rows long").collect())


# ---- bookkeeping ----------------------------------------------------------------------------------
class Run:
    """The settings and results of one benchmark invocation."""

    def __init__(self, opts: argparse.Namespace, tfos: Any) -> None:
        self.opts = opts
        self.shapes = c.parse_shapes(opts.shapes)
        self.cases = [Case(s, t) for s in self.shapes for t in parse_row_types(opts.row_types)]
        self.tfos = tfos
        self.results: dict[tuple[str, str], list[c.Sample]] = defaultdict(list)
        self.sc: Any = None
        self.spark: Any = None
        self.paired_reps = 0
        #: ("paired" or "paired-cold", shape) -> tfonspark/plain rows/s of each pair (``paired``)
        self.pair_ratios: dict[tuple[str, str], list[float]] = defaultdict(list)

    def rows(self, shape: c.Shape, variant: str) -> int:
        """Rows of ``shape`` for ``variant`` (TFoS is capped)."""
        rows = self.opts.rows or (shape.quick_rows if self.opts.quick else shape.rows)
        if variant == "tfos":
            rows = min(rows, self.opts.tfos_rows or (rows if self.opts.quick else shape.tfos_rows))
        return rows

    def start_spark(self) -> tuple[Any, Any]:
        """A fresh SparkContext (and session) for the next variant."""
        self.sc, self.spark = c.fresh_spark(reuse=self.opts.quick)
        return self.sc, self.spark

    def dataset(self, case: Case, variant: str, kind: str) -> tuple[Any, int]:
        """Cached, materialised data of ``case``: ``kind`` is "rdd" or "df" (a DataFrame for
        ``row`` rows; unpersist it after: list rows of every case at once would not fit the
        executors' storage memory). :func:`fed_rdd` makes the RDD a variant reads of it."""
        n = self.rows(case.shape, variant)
        if kind == "rdd" and case.row_type == "row":
            data = c.make_dataframe(self.spark, case.shape, n, self.opts.partitions)
        elif kind == "rdd":
            data = make_rdd(self.sc, case, n, self.opts.partitions)
        else:
            data = c.make_dataframe(self.spark, case.shape, n, self.opts.partitions)
        return c.cached(data, n), n

    def cases_for(self, kind: str) -> list[Case]:
        """The cases a kind of data exists for: DataFrames (and TFoS) have array rows only."""
        return [case for case in self.cases if kind == "rdd" or case.row_type == "array"]

    def record(self, measure: str, shape: str, rows: int, sample: c.Sample) -> None:
        """Keep and print one measurement."""
        sample.rows = rows
        self.results[(measure, shape)].append(sample)
        print(f"{LABELS[measure]:<24} {shape:<8} {sample}  load {c.load_average()}", flush=True)

    def median(self, measure: str, shape: str, what: str) -> float | None:
        """Median rows/s (``what="rate"``) or CPU us per row (``"cpu"``) over the reps."""
        samples = self.results.get((measure, shape), [])
        values = [s.rate if what == "rate" else s.cpu_us_per_row for s in samples]
        return c.median([v for v in values if v is not None])


# ---- the variants -----------------------------------------------------------------------------------
def run_tfonspark(run: Run, variant: str) -> None:
    """tfonspark ``train`` of the RDD (``rdd``) or the DataFrame (``df``) of each shape.

    A partition counts as delivered once it is buffered in the TF process, so ``train`` can
    return before the consumers have read everything: the clock runs on until they have,
    which is seen once ``shutdown`` has closed the feed (so: a new cluster per shape).
    """
    run.start_spark()
    for case in run.cases_for(variant):
        stored, n = run.dataset(case, variant, variant)
        frame = fed_rdd(stored, case, run.opts.map) if variant == "rdd" else stored
        cluster, counters = _start_cluster(run, f"{variant} {case.name}")
        try:
            feed = _Feed(cluster, counters, run.opts)
            if variant == "rdd":
                with c.quiet_stage(f"rdd {case.name}: small warm-up job"):
                    feed(warm_rdd(run, case), COLD_WARM_ROWS, 1)
                meter = c.Meter()
                run.record("rdd-cold", case.name, n, meter.stop(at=feed(frame, n, 1)))
            sample = _time_tfonspark(feed, frame, n)
            run.record(variant, case.name, n * run.opts.epochs, sample)
        finally:
            counters.release()
            cluster.shutdown(timeout=120)  # a no-op after a successful run
            stored.unpersist()


def _start_cluster(run: Run, label: str) -> tuple[Any, c.Counters]:
    """A tfonspark cluster of ``NODES`` draining consumers, and the counters they report to."""
    import tfonspark

    counters = c.Counters()
    args = {"dir": counters.dir, "batch": run.opts.batch}
    with c.quiet_stage(f"{label}: cluster start"):
        cluster = tfonspark.run(
            run.sc, consume_tfonspark, args, NODES, input_mode=tfonspark.InputMode.SPARK, reservation_timeout=300
        )
    return cluster, counters


class _Feed:
    """``train`` jobs on one cluster, counting the rows fed so far."""

    def __init__(self, cluster: Any, counters: c.Counters, opts: argparse.Namespace) -> None:
        self.cluster, self.counters, self.opts = cluster, counters, opts
        self.fed = 0

    def __call__(self, data: Any, n: int, epochs: int) -> float:
        """Feed ``epochs`` passes over ``data``; the ``perf_counter`` time the consumers had
        read all of it but a partial batch per node (which waits for the feed to close)."""
        _check(self.cluster.train(data, num_epochs=epochs, feed_timeout=TIMEOUT), n * epochs)
        self.fed += n * epochs
        return self.counters.wait_for(self.fed - NODES * (self.opts.batch - 1), TIMEOUT)


def _time_tfonspark(feed: _Feed, data: Any, n: int) -> c.Sample:
    """``--warmup`` seconds of untimed jobs, then the same job timed: ``train`` of ``--epochs``
    passes + closing the feed until every row was consumed."""
    opts, cluster, counters = feed.opts, feed.cluster, feed.counters
    with c.quiet_stage("warm-up jobs"):
        c.warm_up(lambda: feed(data, n, opts.epochs), opts.warmup)
    fed = n * opts.epochs
    meter = c.Meter()
    _check(cluster.train(data, num_epochs=opts.epochs, feed_timeout=TIMEOUT), fed)
    returned = time.perf_counter() - meter.start
    closing = c.in_background(functools.partial(cluster.shutdown, timeout=TIMEOUT))
    sample = meter.stop(at=counters.wait_for(feed.fed + fed, TIMEOUT))
    print(
        f"# train() returned after {returned:.2f}s, all rows consumed after {sample.seconds:.2f}s",
        file=sys.stderr,
        flush=True,
    )
    counters.release()
    closing()
    return sample


def run_tfos(run: Run) -> None:
    """TFoS 2.2.5 ``TFCluster.train`` of the RDD of each shape (one cluster for all shapes).

    TFoS ``train`` returns only once the TF side has taken every row off its queue, so the
    call alone is timed; the consumers' counts are checked after ``shutdown``. Its warm-up is
    a small feed: a full pass would double its long run time, and its cost per row is Python.
    """
    run.start_spark()
    counters = c.Counters()
    args = {"dir": counters.dir, "batch": run.opts.batch}
    with c.quiet_stage("tfos: cluster start"):
        cluster = run.tfos.run(
            run.sc, consume_tfos, args, NODES, 0, input_mode=run.tfos.InputMode.SPARK, reservation_timeout=300
        )
    train = functools.partial(cluster.train, num_epochs=1, feed_timeout=TIMEOUT)
    fed = 0
    try:
        for case in run.cases_for("df"):
            rdd, n = run.dataset(case, "tfos", "rdd")
            with c.quiet_stage("tfos: warm-up"):
                train(make_rdd(run.sc, case, TFOS_WARM_ROWS, NODES))
                fed += TFOS_WARM_ROWS
                counters.wait_for(fed - NODES * (run.opts.batch - 1), TIMEOUT)
            meter = c.Meter()
            train(rdd)
            run.record("tfos", case.name, n, meter.stop())
            fed += n
            rdd.unpersist()
    finally:
        with c.quiet_stage("tfos: shutdown"):
            c.stop_tfos(cluster)
    counters.wait_for(fed, 60)  # every row really arrived


def run_plain(run: Run) -> None:
    """Plain Spark over the same cached RDD and DataFrame: the ceiling for each tfonspark path."""
    run.start_spark()
    for case in run.cases:
        kinds = [("plain-rdd", functools.partial(plain_rdd, run.sc), "rdd")]
        if case.row_type == "array" and not run.opts.map:
            kinds.append(("plain-arrow", plain_arrow, "df"))
        for measure, action, kind in kinds:
            stored, n = run.dataset(case, "plain", kind)
            data = fed_rdd(stored, case, run.opts.map) if kind == "rdd" else stored
            if measure == "plain-rdd":
                with c.quiet_stage(f"plain-rdd {case.name}: small warm-up job"):
                    _check(action(warm_rdd(run, case)), COLD_WARM_ROWS)
                meter = c.Meter()
                _check(action(data), n)
                run.record("plain-rdd-cold", case.name, n, meter.stop())
            with c.quiet_stage(f"{measure} {case.name}: warm-up jobs"):
                c.warm_up(
                    lambda: _check(action(data, run.opts.epochs), n * run.opts.epochs),  # noqa: B023
                    run.opts.warmup,
                )
            meter = c.Meter()
            _check(action(data, run.opts.epochs), n * run.opts.epochs)
            run.record(measure, case.name, n * run.opts.epochs, meter.stop())
            stored.unpersist()


def run_paired(run: Run) -> None:
    """tfonspark ``train`` and plain ``foreachPartition`` of the same RDD, job by job, on one cluster.

    Separate variants run on separate fresh clusters, whose JVMs' JIT and the host's load drift
    apart by more than the 10% at stake (one run's executor JVM spent 22 and another's 45 CPU
    us per MNIST row on the same plain job). Here both read the same cached rows through the
    same executor JVMs, each side in Python workers of its own (see :func:`plain_rdd`); the TF
    processes stay idle while Spark runs alone.
    1st pass: after a small job of each, one pass of each, who goes first alternating with the
    rep; warm: ``--paired-warmup`` seconds of both, then ``--pairs`` pairs in alternating order. A
    tfonspark job is timed until the consumers have read all but a partial batch per node (as
    its 1st pass is measured elsewhere too); the per-pair ratios are kept and printed.
    """
    rep, run.paired_reps = run.paired_reps, run.paired_reps + 1
    run.start_spark()
    for case in run.cases_for("rdd"):
        stored, n = run.dataset(case, "rdd", "rdd")
        data = fed_rdd(stored, case, run.opts.map)
        cluster, counters = _start_cluster(run, f"paired {case.name}")
        try:
            _pairs(run, case, _PairedJobs(run, _Feed(cluster, counters, run.opts), data, n), rep)
        finally:
            counters.release()
            cluster.shutdown(timeout=120)
            stored.unpersist()


class _PairedJobs:
    """The two jobs of a pair, each returning its :class:`c.Sample`."""

    def __init__(self, run: Run, feed: _Feed, data: Any, n: int) -> None:
        self.run, self.feed, self.data, self.n = run, feed, data, n

    def tfonspark(self, epochs: int) -> c.Sample:
        meter = c.Meter()
        return meter.stop(at=self.feed(self.data, self.n, epochs))

    def plain(self, epochs: int) -> c.Sample:
        meter = c.Meter()
        _check(plain_rdd(self.run.sc, self.data, epochs), self.n * epochs)
        return meter.stop()


def _pairs(run: Run, case: Case, jobs: _PairedJobs, rep: int) -> None:
    """The 1st-pass pair, warm-up, then ``--pairs`` warm pairs; records samples and ratios.

    Both sides share the executor JVMs, and the first job to read cached blocks into Python
    workers at scale paid ~5-15 CPU us a MNIST row more in them than the second (their JIT):
    whoever went first in the 1st-pass pair. So the small jobs before it read a small cached
    copy of the data, as the measured jobs read theirs, and warm that path for both.
    """
    stored = c.cached(_small_data(run, case), PAIRED_WARM_ROWS)
    small = fed_rdd(stored, case, run.opts.map)
    with c.quiet_stage(f"paired {case.name}: small warm-up jobs"):
        jobs.feed(small, PAIRED_WARM_ROWS, 1)
        _check(plain_rdd(run.sc, small), PAIRED_WARM_ROWS)
    stored.unpersist()
    _pair(run, case, jobs, 1, "-cold", tfonspark_first=rep % 2 == 0)
    with c.quiet_stage(f"paired {case.name}: warm-up jobs"):
        c.warm_up(lambda: (jobs.tfonspark(run.opts.epochs), jobs.plain(run.opts.epochs)), run.opts.paired_warmup)
    for i in range(run.opts.pairs):
        _pair(run, case, jobs, run.opts.epochs, "", tfonspark_first=(rep + i) % 2 == 0)


def _pair(run: Run, case: Case, jobs: _PairedJobs, epochs: int, suffix: str, tfonspark_first: bool) -> None:
    order = [("rdd", jobs.tfonspark), ("plain", jobs.plain)]
    samples = {name: job(epochs) for name, job in (order if tfonspark_first else order[::-1])}
    for name, sample in samples.items():
        run.record(f"paired-{name}{suffix}", case.name, jobs.n * epochs, sample)
    run.pair_ratios[(f"paired{suffix}", case.name)].append(samples["rdd"].rate / samples["plain"].rate)


def _small_data(run: Run, case: Case) -> Any:
    """``PAIRED_WARM_ROWS`` of ``case``'s rows, held as the measured data is (a DataFrame for ``row``)."""
    if case.row_type == "row":
        return c.make_dataframe(run.spark, case.shape, PAIRED_WARM_ROWS, NODES)
    return make_rdd(run.sc, case, PAIRED_WARM_ROWS, NODES)


def warm_rdd(run: Run, case: Case) -> Any:
    """The small job's rows before a 1st-pass measurement: ``case``'s rows, uncached (mapped
    again with ``--map``, as the measured RDD is)."""
    rdd = make_rdd(run.sc, case, COLD_WARM_ROWS, NODES)
    return rdd.map(_same) if run.opts.map else rdd


def _check(seen: int, expected: int) -> None:
    """Every row must have arrived."""
    if seen != expected:
        raise RuntimeError(f"{seen} of {expected} rows arrived")


# ---- report -----------------------------------------------------------------------------------------
def report(run: Run, measures: list[str]) -> str:
    """Two Markdown tables: median rows/s with ratios, and median CPU us per row."""
    rate_rows, cpu_rows = [], []
    ratio_names = [f"{LABELS[a].replace('tfonspark ', '')} / {LABELS[b].replace('Spark ', '')}" for a, b, _ in RATIOS]
    for case in run.cases:
        rate = {m: run.median(m, case.name, "rate") for m in LABELS}
        cpu = {m: run.median(m, case.name, "cpu") for m in LABELS}
        head = [case.name, f"{run.rows(case.shape, 'rdd'):,}"]
        rate_rows.append(
            head + [c.fmt_rate(rate[m]) for m in measures] + [c.fmt_ratio(rate[a], rate[b]) for a, b, _ in RATIOS]
        )
        cpu_rows.append(
            head + [c.fmt_us(cpu[m]) for m in measures] + [c.fmt_ratio(cpu[b], cpu[a]) for a, b, _ in RATIOS]
        )
    names = [LABELS[m] for m in measures]
    header = ["shape", "rows", *names, *ratio_names]
    return (
        f"rows/s (wall clock; higher is better)\n\n{c.markdown_table(header, rate_rows)}\n\n"
        "CPU microseconds per row, summed over all processes of the run (lower is better; the "
        "ratios are the other side's CPU over tfonspark's: > 1 means tfonspark is cheaper)\n\n"
        f"{c.markdown_table(header, cpu_rows)}"
    )


def targets(run: Run) -> list[str]:
    """The issue's targets on the median rows/s, each as MET / MISSED / not measured."""
    out = []
    for case in run.cases:
        for a, b, target in RATIOS:
            goal = 0.9 if run.opts.map and b.startswith(("plain-rdd", "paired-plain")) else target  # issue 26
            if (b == "tfos" and case.name != "tabular") or (b == "plain-arrow" and case.row_type != "array"):
                continue
            num, den = run.median(a, case.name, "rate"), run.median(b, case.name, "rate")
            name = f"{case.name}: {LABELS[a]} >= {goal:g}x {LABELS[b]}"
            out.append(
                f"- {name}: not measured"
                if num is None or den is None
                else f"- {name}: {num / den:.2f}x {'MET' if num / den >= goal else 'MISSED'}"
            )
    return out


def parse_row_types(text: str) -> list[str]:
    """``"array,list"`` -> row types, rejecting unknown names."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROW_TYPES]
    if unknown or not names:
        raise SystemExit(f"--row-types: unknown {unknown}; choose from {ROW_TYPES}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=0, help="rows per shape (default: mnist 60,000, tabular 300,000)")
    p.add_argument(
        "--tfos-rows",
        type=int,
        default=0,
        help="cap on TFoS rows per shape (default: mnist 60,000, tabular 100,000); "
        "TFoS is slow and its rows/s does not depend on the row count",
    )
    p.add_argument("--shapes", default="mnist,tabular", help="comma list of: mnist, tabular")
    p.add_argument(
        "--pack",
        action="store_true",
        help="measure only the row packing of the feed task (pack_rows) against pickle.loads of "
        "the same rows, in this process, without Spark; --rows sets the rows (default 4x quick)",
    )
    p.add_argument(
        "--row-types",
        default="array,list",
        help=f"comma list of how RDD rows hold their features: {', '.join(ROW_TYPES)} (default array,list)",
    )
    p.add_argument(
        "--map",
        action="store_true",
        help="feed (and drain) the cached RDDs through an uncached .map(...), the shape most TFoS "
        "programs feed (rows packed value by value); use with --epochs 1",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=3,
        help="passes over the data in each timed tfonspark/plain job (default 3; TFoS: 1)",
    )
    p.add_argument(
        "--pairs",
        type=int,
        default=3,
        help="warm pairs of jobs per shape and rep of the paired variant (default 3; --quick: 1)",
    )
    p.add_argument(
        "--paired-warmup",
        type=float,
        default=PAIRED_WARMUP,
        help=f"seconds of untimed pairs before the paired variant's warm pairs (default {PAIRED_WARMUP:.0f}; "
        "--quick: 0): its jobs are short, and the JVMs' JIT compilers take that long to settle",
    )
    c.add_run_args(p, VARIANTS, "consumer batch size")
    p.set_defaults(variants=",".join(DEFAULT_VARIANTS))
    opts = p.parse_args(argv)
    c.quick_defaults(opts, argv, reps=1, epochs=1, warmup=0, pairs=1, paired_warmup=0)
    if opts.epochs < 1:
        p.error(f"--epochs must be >= 1. Received: {opts.epochs}")
    return opts


def main(argv: list[str] | None = None) -> int:
    """Run every variant ``--reps`` times, alternating, then print the tables."""
    opts = parse_args(argv)
    if opts.pack:
        cases = [Case(s, t) for s in c.parse_shapes(opts.shapes) for t in parse_row_types(opts.row_types)]
        print(f"# a feed task's Python work vs foreachPartition's (CPU, min of {PACK_REPS}; no Spark)", flush=True)
        print(f"\n{c.markdown_table(PACK_HEADER, pack_bench(cases, opts.rows))}")
        return 0
    variants, tfos = c.selected_variants(opts, VARIANTS)
    c.ship_by_value(c, sys.modules[__name__])
    run = Run(opts, tfos)
    print(
        f"# feed benchmark: {c.MASTER}, shapes={opts.shapes}, row types={opts.row_types}, "
        f"{'behind an uncached map, ' if opts.map else ''}"
        f"variants={variants}, reps={opts.reps}, "
        f"epochs={opts.epochs}, "
        f"load {c.load_average()}",
        flush=True,
    )
    runners: dict[str, Callable[[], Any]] = {
        "tfos": lambda: c.guarded("tfos", functools.partial(run_tfos, run)),
        "rdd": functools.partial(run_tfonspark, run, "rdd"),
        "df": functools.partial(run_tfonspark, run, "df"),
        "plain": functools.partial(run_plain, run),
        "paired": functools.partial(run_paired, run),
    }
    seconds = c.alternate(variants, opts.reps, runners)
    measures = [m for m in LABELS if m.split("-")[0] in variants]
    print(
        f"\n## Feed throughput (median of {opts.reps} reps, {opts.epochs} epochs per timed job; "
        f"load average {c.load_average()}; "
        f"{seconds:.0f}s in all)\n"
    )
    print(report(run, measures))
    capped = [f"{s.name} {run.rows(s, 'tfos'):,}" for s in run.shapes if run.rows(s, "tfos") != run.rows(s, "rdd")]
    if "tfos" in variants and capped:
        print(f"\n(TFoS ran on fewer rows: {', '.join(capped)}; see --tfos-rows)")
    print()
    print("\n".join(targets(run)))
    if run.pair_ratios:
        print("\ntfonspark / Spark rows/s of each pair (paired variant), in the order run:")
        for (kind, shape), ratios in run.pair_ratios.items():
            print(
                f"- {shape} {'1st pass' if kind.endswith('cold') else 'warm'}: {', '.join(f'{r:.2f}' for r in ratios)}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
