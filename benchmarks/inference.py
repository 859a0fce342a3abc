"""Inference throughput: tfonspark vs TensorFlowOnSpark 2.2.5 vs ``predict_batch_udf``.

All three run the same numpy "model" (``x @ W + b`` with a fixed ``W``, one float per row) over
the same cached DataFrame of tabular rows (32 float32 features), each on its own fresh
``local-cluster[2,1,1024]``, alternating within each repetition:

- ``tfos``:      TFoS 2.2.5 ``TFCluster.inference(df.rdd)``, results counted
- ``tfonspark``: tfonspark ``Cluster.inference(df)`` (Arrow in, Arrow out), written to ``noop``
- ``udf``:       ``pyspark.ml.functions.predict_batch_udf``, written to ``noop``

    python benchmarks/inference.py
    python benchmarks/inference.py --quick --variants tfonspark,udf
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

VARIANTS = ["tfos", "tfonspark", "udf"]
LABELS = {"tfos": "TFoS 2.2.5", "tfonspark": "tfonspark", "udf": "predict_batch_udf"}
SHAPE = c.SHAPES["tabular"]
TFOS_ROWS = 30_000  # default cap: TFoS infers ~10^3 rows/s here; its rows/s does not depend on it
NODES = 2
WARM_ROWS = 2000
TIMEOUT = 900.0


def model() -> tuple[Any, Any]:
    """The fixed "model": weights (32,) and bias, float32."""
    weights = np.random.default_rng(7).standard_normal(SHAPE.width).astype(np.float32)
    return weights, np.float32(0.5)


def predict(x: Any) -> Any:
    """One float32 prediction per row of ``x`` (n, 32)."""
    weights, bias = model()
    return (np.asarray(x, np.float32) @ weights + bias).astype(np.float32)


# ---- TF-side inference loops ---------------------------------------------------------------------
def serve_tfonspark(args: dict[str, Any], ctx: Any) -> None:
    """tfonspark ``map_fun``: columnar batches in, one prediction per row back."""
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        batch = feed.next_columns(args["batch"])
        if batch is None:
            return
        feed.batch_results(predict(batch.columns[0]))


def serve_tfos(args: dict[str, Any], ctx: Any) -> None:
    """TFoS ``map_fun``: lists of rows in, one prediction per row back."""
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        rows = feed.next_batch(args["batch"])
        if rows:
            feed.batch_results(predict([r[0] for r in rows]).tolist())


# ---- variants ----------------------------------------------------------------------------------------
class Run:
    """Settings and results of one invocation."""

    def __init__(self, opts: argparse.Namespace, tfos: Any) -> None:
        self.opts = opts
        self.tfos = tfos
        self.results: dict[str, list[c.Sample]] = defaultdict(list)
        self.rows = opts.rows or (SHAPE.quick_rows if opts.quick else SHAPE.rows)

    def variant_rows(self, variant: str) -> int:
        """Rows for ``variant`` (TFoS is capped)."""
        if variant != "tfos":
            return self.rows
        return min(self.rows, self.opts.tfos_rows or (self.rows if self.opts.quick else TFOS_ROWS))

    def data(self, variant: str) -> tuple[Any, Any, int]:
        """A fresh Spark context, the cached features DataFrame and a small warm-up one."""
        sc, spark = c.fresh_spark(reuse=self.opts.quick)
        n = self.variant_rows(variant)
        df = c.cached(c.make_dataframe(spark, SHAPE, n, self.opts.partitions).select("features"), n)
        warm = c.make_dataframe(spark, SHAPE, WARM_ROWS, NODES).select("features")
        return sc, (df, warm), n

    def record(self, variant: str, rows: int, sample: c.Sample) -> None:
        """Keep and print one measurement."""
        sample.rows = rows
        self.results[variant].append(sample)
        print(f"{LABELS[variant]:<18} {sample}  load {c.load_average()}", flush=True)

    def median(self, variant: str, what: str) -> float | None:
        """Median rows/s (``what="rate"``) or CPU us per row (``"cpu"``) over the reps."""
        values = [s.rate if what == "rate" else s.cpu_us_per_row for s in self.results.get(variant, [])]
        return c.median([v for v in values if v is not None])


def _check(predictions: list[float], warm: Any) -> None:
    """The warm-up predictions must equal the numpy model's."""
    x = np.asarray([r[0] for r in warm.collect()], np.float32)
    if not np.allclose(np.asarray(predictions, np.float32), predict(x), rtol=1e-5, atol=1e-5):
        raise RuntimeError("inference results differ from the numpy model")


def _noop_write(df: Any) -> None:
    """Compute every row of ``df`` and throw it away (Spark's ``noop`` sink)."""
    df.write.format("noop").mode("overwrite").save()


def run_tfonspark(run: Run) -> None:
    """tfonspark ``Cluster.inference(df)``: warm-up, check, ``--warmup`` seconds of untimed passes, the timed one."""
    import tfonspark

    stage = c.quiet_stage
    with stage("tfonspark: spark + cached data"):
        sc, (df, warm), n = run.data("tfonspark")
    with stage("tfonspark: cluster start"):
        cluster = tfonspark.run(
            sc,
            serve_tfonspark,
            {"batch": run.opts.batch},
            NODES,
            input_mode=tfonspark.InputMode.SPARK,
            reservation_timeout=300,
        )
    try:
        infer = functools.partial(cluster.inference, feed_timeout=TIMEOUT, output_schema="prediction float")
        with stage("tfonspark: warm-up, check and untimed passes"):
            _check([r.prediction for r in infer(warm).collect()], warm)
            c.warm_up(lambda: _noop_write(infer(df)), run.opts.warmup)
        meter = c.Meter()
        _noop_write(infer(df))
        run.record("tfonspark", n, meter.stop())
    finally:
        with stage("tfonspark: shutdown"):
            cluster.shutdown(timeout=120)


def run_tfos(run: Run) -> None:
    """TFoS ``TFCluster.inference(df.rdd)``: warm-up, check, then the timed pass (counted)."""
    stage = c.quiet_stage
    with stage("tfos: spark + cached data"):
        sc, (df, warm), n = run.data("tfos")
    with stage("tfos: cluster start"):
        cluster = run.tfos.run(
            sc,
            serve_tfos,
            {"batch": run.opts.batch},
            NODES,
            0,
            input_mode=run.tfos.InputMode.SPARK,
            reservation_timeout=300,
        )
    try:
        infer = functools.partial(cluster.inference, feed_timeout=TIMEOUT)
        with stage("tfos: warm-up and check"):
            _check(infer(warm.rdd).collect(), warm)
        meter = c.Meter()
        count = infer(df.rdd).count()
        sample = meter.stop()
        if count != n:
            raise RuntimeError(f"TFoS returned {count} results for {n} rows")
        run.record("tfos", n, sample)
    finally:
        with stage("tfos: shutdown"):
            c.stop_tfos(cluster)


def make_predict_fn() -> Any:
    """``predict_batch_udf``'s model loader: the same numpy model."""
    return predict


def run_udf(run: Run) -> None:
    """``predict_batch_udf`` over the same data: warm-up, check, ``--warmup`` s of untimed passes, timed pass."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import FloatType

    with c.quiet_stage("udf: spark + cached data"):
        _, (df, warm), n = run.data("udf")
    udf = predict_batch_udf(
        make_predict_fn, return_type=FloatType(), batch_size=run.opts.batch, input_tensor_shapes=[[SHAPE.width]]
    )
    score = lambda d: d.select(udf("features").alias("prediction"))  # noqa: E731
    with c.quiet_stage("udf: warm-up, check and untimed passes"):
        _check([r.prediction for r in score(warm).collect()], warm)
        c.warm_up(lambda: _noop_write(score(df)), run.opts.warmup)
    meter = c.Meter()
    _noop_write(score(df))
    run.record("udf", n, meter.stop())


# ---- report -----------------------------------------------------------------------------------------
def report(run: Run, variants: list[str]) -> str:
    """Markdown tables of the median rows/s and CPU us per row, with the ratios."""
    shown = [v for v in VARIANTS if v in variants]
    header = ["rows", *[LABELS[v] for v in shown], "tfonspark / TFoS", "tfonspark / predict_batch_udf"]
    rate = {v: run.median(v, "rate") for v in VARIANTS}
    cpu = {v: run.median(v, "cpu") for v in VARIANTS}
    rates = [
        f"{run.rows:,}",
        *[c.fmt_rate(rate[v]) for v in shown],
        c.fmt_ratio(rate["tfonspark"], rate["tfos"]),
        c.fmt_ratio(rate["tfonspark"], rate["udf"]),
    ]
    cpus = [
        f"{run.rows:,}",
        *[c.fmt_us(cpu[v]) for v in shown],
        c.fmt_ratio(cpu["tfos"], cpu["tfonspark"]),
        c.fmt_ratio(cpu["udf"], cpu["tfonspark"]),
    ]
    return (
        f"rows/s (wall clock; higher is better)\n\n{c.markdown_table(header, [rates])}\n\n"
        "CPU microseconds per row, summed over all processes of the run (lower is better; the "
        "ratios are the other side's CPU over tfonspark's: > 1 means tfonspark is cheaper)\n\n"
        f"{c.markdown_table(header, [cpus])}"
    )


def targets(run: Run) -> list[str]:
    """The issue's targets on the median rows/s, each as MET / MISSED / not measured."""
    out = []
    for name, den, goal in (("tfonspark >= 10x TFoS", "tfos", 10), ("tfonspark >= 1x predict_batch_udf", "udf", 1)):
        num, base = run.median("tfonspark", "rate"), run.median(den, "rate")
        out.append(
            f"- {name}: not measured"
            if num is None or base is None
            else f"- {name}: {num / base:.2f}x {'MET' if num / base >= goal else 'MISSED'}"
        )
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=0, help=f"rows (default {SHAPE.rows:,})")
    p.add_argument(
        "--tfos-rows",
        type=int,
        default=0,
        help=f"cap on TFoS rows (default {TFOS_ROWS:,}); its rows/s does not depend on it",
    )
    c.add_run_args(p, VARIANTS, "model batch size")
    opts = p.parse_args(argv)
    c.quick_defaults(opts, argv, reps=1, warmup=0)
    return opts


def main(argv: list[str] | None = None) -> int:
    """Run every variant ``--reps`` times, alternating, then print the tables."""
    opts = parse_args(argv)
    variants, tfos = c.selected_variants(opts, VARIANTS)
    c.ship_by_value(c, sys.modules[__name__])
    run = Run(opts, tfos)
    print(
        f"# inference benchmark: {c.MASTER}, {SHAPE.name} rows, variants={variants}, "
        f"reps={opts.reps}, load {c.load_average()}",
        flush=True,
    )
    runners = {
        "tfos": lambda: c.guarded("tfos", functools.partial(run_tfos, run)),
        "tfonspark": functools.partial(run_tfonspark, run),
        "udf": functools.partial(run_udf, run),
    }
    seconds = c.alternate(variants, opts.reps, runners)
    print(
        f"\n## Inference throughput, tabular rows (median of {opts.reps} reps; "
        f"load average {c.load_average()}; {seconds:.0f}s in all)\n"
    )
    print(report(run, variants))
    if "tfos" in variants and run.variant_rows("tfos") != run.rows:
        print(f"\n(TFoS ran on {run.variant_rows('tfos'):,} rows: --tfos-rows)")
    print()
    print("\n".join(targets(run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
