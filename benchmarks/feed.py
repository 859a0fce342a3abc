"""Feed throughput: tfonspark vs TensorFlowOnSpark 2.2.5 vs what plain Spark can do.

Every variant runs on its own fresh ``local-cluster[2,1,1024]`` (two executor JVMs), variants
alternate within each repetition, and all of them read the same cached rows:

- ``tfos``:  TFoS 2.2.5 ``InputMode.SPARK``, ``TFCluster.train(rdd)``
- ``rdd``:   tfonspark ``Cluster.train(rdd)`` (rows packed into numpy columns)
- ``df``:    tfonspark ``Cluster.train(df)`` (Arrow batches via ``mapInArrow``)
- ``plain``: the Spark limits: ``rdd.foreachPartition`` iterating rows, ``df.mapInArrow``
  draining batches

The TF-side consumer is the same in both frameworks (drain batches, count rows), and the clock
stops once the TF processes have *consumed* every row. Prints rows/s (median of reps), ratios
and a Markdown table.

    python benchmarks/feed.py                # defaults: < 10 minutes on 2 cores
    python benchmarks/feed.py --quick --variants rdd,df,plain
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

VARIANTS = ["tfos", "rdd", "df", "plain"]
LABELS = {
    "tfos": "TFoS 2.2.5",
    "rdd": "tfonspark RDD",
    "df": "tfonspark DF",
    "plain-rdd": "Spark foreachPartition",
    "plain-arrow": "Spark mapInArrow drain",
}
TIMEOUT = 900.0
WARM_ROWS = 2000


# ---- the TF-side consumers (identical work: drain, count) -----------------------------------------
def consume_tfonspark(args: dict[str, Any], ctx: Any) -> None:
    """tfonspark ``map_fun``: drain columnar batches until the feed ends, counting rows."""
    counter = c.NodeCounter(args["dir"], ctx.task_index)
    feed = ctx.get_data_feed(train_mode=True)
    while True:
        batch = feed.next_columns(args["batch"])
        if batch is None:
            return
        counter.add(batch.count)


def consume_tfos(args: dict[str, Any], ctx: Any) -> None:
    """TFoS ``map_fun``: drain ``next_batch`` lists until the feed ends, counting rows."""
    counter = c.NodeCounter(args["dir"], ctx.task_index)
    feed = ctx.get_data_feed(train_mode=True)
    while not feed.should_stop():
        counter.add(len(feed.next_batch(args["batch"])))


# ---- plain Spark ----------------------------------------------------------------------------------
def plain_rdd(sc: Any, rdd: Any) -> int:
    """``foreachPartition`` iterating every row; returns the rows seen."""
    seen = sc.accumulator(0)

    def drain(rows: Any) -> None:
        seen.add(sum(1 for _ in rows))

    rdd.foreachPartition(drain)
    return int(seen.value)


def plain_arrow(df: Any) -> int:
    """``mapInArrow`` draining every record batch; returns the rows seen."""

    def drain(batches: Any) -> Any:
        import pyarrow as pa

        yield pa.RecordBatch.from_pydict({"rows": [sum(b.num_rows for b in batches)]})

    return sum(r[0] for r in df.mapInArrow(drain, "rows long").collect())


# ---- one variant on one fresh Spark context ---------------------------------------------------------
class Run:
    """The settings of one benchmark invocation."""

    def __init__(self, opts: argparse.Namespace, tfos: Any) -> None:
        self.opts = opts
        self.shapes = c.parse_shapes(opts.shapes)
        self.tfos = tfos
        self.rates: dict[tuple[str, str], list[float]] = defaultdict(list)

    def rows(self, shape: c.Shape, variant: str) -> int:
        if self.opts.rows:
            rows = self.opts.rows
        else:
            rows = shape.quick_rows if self.opts.quick else shape.rows
        if variant == "tfos" and self.opts.tfos_rows:
            rows = min(rows, self.opts.tfos_rows)
        return rows

    def datasets(self, sc: Any, spark: Any, variant: str, kind: str) -> dict[str, tuple[Any, int]]:
        """Cached, materialised data per shape: ``kind`` is "rdd" or "df"."""
        out = {}
        for shape in self.shapes:
            n = self.rows(shape, variant)
            if kind == "rdd":
                data = c.make_rdd(sc, shape, n, self.opts.partitions)
            else:
                data = c.make_dataframe(spark, shape, n, self.opts.partitions)
            out[shape.name] = (c.cached(data, n), n)
        return out

    def warm_up(self, sc: Any, spark: Any, kind: str, feed: Any) -> int:
        """One small untimed feed per shape (Python workers, imports, connections); rows fed."""
        for shape in self.shapes:
            if kind == "rdd":
                feed(c.make_rdd(sc, shape, WARM_ROWS, 2))
            else:
                feed(c.make_dataframe(spark, shape, WARM_ROWS, 2))
        return WARM_ROWS * len(self.shapes)

    def record(self, measure: str, shape: str, rows: int, seconds: float) -> None:
        rate = rows / seconds
        self.rates[(measure, shape)].append(rate)
        print(f"{LABELS[measure]:<24} {shape:<8} {rows:>9,} rows {seconds:7.2f}s "
              f"{rate:>12,.0f} rows/s  load {c.load_average()}", flush=True)


def _fed(cluster_train: Any, counters: c.Counters, base: int, rows: int) -> tuple[float, int]:
    """Time one ``train`` call until the consumers have counted every row; (seconds, new base)."""
    start = time.perf_counter()
    returned = cluster_train()
    if returned is not None and returned != rows:
        raise RuntimeError(f"train() delivered {returned} of {rows} rows")
    done = counters.wait_for(base + rows, TIMEOUT)
    return done - start, base + rows


def run_tfonspark(run: Run, variant: str) -> None:
    """tfonspark ``train`` of the RDD (``rdd``) or the DataFrame (``df``) of each shape."""
    import tfonspark

    sc, spark = c.fresh_spark()
    data = run.datasets(sc, spark, variant, variant)
    counters = c.Counters()
    args = {"dir": counters.dir, "batch": run.opts.batch}
    cluster = tfonspark.run(sc, consume_tfonspark, args, 2, input_mode=tfonspark.InputMode.SPARK,
                            reservation_timeout=300)
    try:
        base = run.warm_up(sc, spark, variant, lambda d: cluster.train(d, feed_timeout=TIMEOUT))
        counters.wait_for(base, TIMEOUT)
        for shape, (frame, n) in data.items():
            seconds, base = _fed(lambda f=frame: cluster.train(f, feed_timeout=TIMEOUT), counters, base, n)
            run.record(variant, shape, n, seconds)
    finally:
        cluster.shutdown(timeout=120)


def run_tfos(run: Run) -> None:
    """TFoS 2.2.5 ``TFCluster.train`` of the RDD of each shape."""
    sc, spark = c.fresh_spark()
    data = run.datasets(sc, spark, "tfos", "rdd")
    counters = c.Counters()
    args = {"dir": counters.dir, "batch": run.opts.batch}
    cluster = run.tfos.run(sc, consume_tfos, args, 2, 0, input_mode=run.tfos.InputMode.SPARK,
                           reservation_timeout=300)
    try:
        base = run.warm_up(sc, spark, "rdd", lambda d: cluster.train(d, num_epochs=1, feed_timeout=TIMEOUT))
        counters.wait_for(base, TIMEOUT)
        for shape, (rdd, n) in data.items():
            seconds, base = _fed(lambda r=rdd: cluster.train(r, num_epochs=1, feed_timeout=TIMEOUT),
                                 counters, base, n)
            run.record("tfos", shape, n, seconds)
    finally:
        c.stop_tfos(cluster)


def run_plain(run: Run) -> None:
    """Plain Spark over the same cached RDD and DataFrame: the ceiling for each tfonspark path."""
    sc, spark = c.fresh_spark()
    rdds = run.datasets(sc, spark, "plain", "rdd")
    frames = run.datasets(sc, spark, "plain", "df")
    run.warm_up(sc, spark, "rdd", lambda d: plain_rdd(sc, d))
    run.warm_up(sc, spark, "df", plain_arrow)
    for shape in run.shapes:
        rdd, n = rdds[shape.name]
        seconds, seen = c.timed(lambda r=rdd: plain_rdd(sc, r))
        _check(seen, n)
        run.record("plain-rdd", shape.name, n, seconds)
        df, n = frames[shape.name]
        seconds, seen = c.timed(lambda d=df: plain_arrow(d))
        _check(seen, n)
        run.record("plain-arrow", shape.name, n, seconds)


def _check(seen: int, expected: int) -> None:
    if seen != expected:
        raise RuntimeError(f"plain Spark saw {seen} of {expected} rows")


# ---- report -----------------------------------------------------------------------------------------
def report(run: Run, measures: list[str]) -> str:
    """The Markdown table: median rows/s per measure and shape, then the ratios."""
    med = {key: c.median(values) for key, values in run.rates.items()}
    header = ["shape", "rows"] + [LABELS[m] + " rows/s" for m in measures] + \
        ["RDD / foreachPartition", "DF / mapInArrow", "RDD / TFoS", "DF / TFoS"]
    rows = []
    for shape in run.shapes:
        get = lambda m, s=shape.name: med.get((m, s))  # noqa: E731
        rows.append([shape.name, f"{run.rows(shape, 'rdd'):,}"] + [c.fmt_rate(get(m)) for m in measures] + [
            c.fmt_ratio(get("rdd"), get("plain-rdd")), c.fmt_ratio(get("df"), get("plain-arrow")),
            c.fmt_ratio(get("rdd"), get("tfos")), c.fmt_ratio(get("df"), get("tfos"))])
    return c.markdown_table(header, rows)


def targets(run: Run) -> list[str]:
    """The issue's targets, each as MET / MISSED / not measured."""
    med = {key: c.median(values) for key, values in run.rates.items()}
    checks = []
    for shape in run.shapes:
        s = shape.name
        checks.append((f"{s}: tfonspark RDD >= 0.8x foreachPartition", med.get(("rdd", s)), med.get(("plain-rdd", s)), 0.8))
        checks.append((f"{s}: tfonspark DF >= 0.8x mapInArrow drain", med.get(("df", s)), med.get(("plain-arrow", s)), 0.8))
        if s == "tabular":
            checks.append(("tabular: tfonspark RDD >= 10x TFoS", med.get(("rdd", s)), med.get(("tfos", s)), 10))
            checks.append(("tabular: tfonspark DF >= 10x TFoS", med.get(("df", s)), med.get(("tfos", s)), 10))
    out = []
    for name, num, den, goal in checks:
        if num is None or den is None:
            out.append(f"- {name}: not measured")
        else:
            out.append(f"- {name}: {num / den:.2f}x {'MET' if num / den >= goal else 'MISSED'}")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=0, help="rows per shape (default: per shape)")
    p.add_argument("--tfos-rows", type=int, default=0,
                   help="cap on TFoS rows per shape (it is slow; rows/s is still comparable)")
    p.add_argument("--reps", type=int, default=2, help="repetitions of every variant (default 2)")
    p.add_argument("--shapes", default="mnist,tabular", help="comma list of: mnist, tabular")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of: {', '.join(VARIANTS)}")
    p.add_argument("--partitions", type=int, default=8, help="partitions of the data (default 8)")
    p.add_argument("--batch", type=int, default=1024, help="consumer batch size (default 1024)")
    p.add_argument("--quick", action="store_true", help="small sizes, one repetition: a smoke run")
    p.add_argument("--no-install", action="store_true",
                   help="do not pip-install TFoS 2.2.5 if it is missing (skip that variant)")
    opts = p.parse_args(argv)
    if opts.quick and "--reps" not in (argv if argv is not None else sys.argv):
        opts.reps = 1
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    variants = c.parse_variants(opts.variants, VARIANTS)
    tfos = None
    if "tfos" in variants:
        tfos, reason = c.load_tfos(install=not opts.no_install)
        if tfos is None:
            print(f"SKIPPED tfos: {reason}", flush=True)
            variants.remove("tfos")
    c.ship_by_value(c, sys.modules[__name__])
    run = Run(opts, tfos)
    print(f"# feed benchmark: {c.MASTER}, shapes={opts.shapes}, variants={variants}, reps={opts.reps}, "
          f"load {c.load_average()}", flush=True)
    runners = {"tfos": lambda: run_tfos(run), "rdd": lambda: run_tfonspark(run, "rdd"),
               "df": lambda: run_tfonspark(run, "df"), "plain": lambda: run_plain(run)}
    try:
        for rep in range(opts.reps):
            for variant in c.rotate(variants, rep):
                with c.quiet_stage(f"rep {rep + 1}/{opts.reps} {variant}"):
                    if variant == "tfos":
                        c.guarded("tfos", runners[variant])
                    else:
                        runners[variant]()
    finally:
        c.stop_spark()
    measures = [m for m in LABELS if m in run.rates or m.split("-")[0] in variants]
    print(f"\n## Feed throughput (median of {opts.reps} reps; load average {c.load_average()})\n")
    print(report(run, measures))
    print()
    print("\n".join(targets(run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
