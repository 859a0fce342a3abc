"""DataFrame inference throughput: tfonspark's three ways against ``predict_batch_udf``.

Every variant scores the same numpy "model" (``x @ W + b`` with a fixed ``W``: one float32 per
row of 32 float32 features) over the same cached DataFrame, each on its own fresh
``local-cluster[2,1,1024]``, alternating within each repetition (the order rotates), every
pass written to Spark's ``noop`` sink:

- ``rows``:    ``Cluster.inference(df)``, ``map_fun`` reading with TFoS's ``next_batch`` (a list
  of rows) and answering ``batch_results(predictions.tolist())``, as TFoS programs do
- ``columns``: ``Cluster.inference(df)``, ``map_fun`` reading ``next_columns`` (numpy columns)
  and answering with a numpy array
- ``tfmodel``: ``tfonspark.ml.TFModel(...).transform(df).select("prediction")`` serving the same
  model exported as a SavedModel (``features [None, 32] -> prediction [None]``); like every
  variant it writes the prediction column alone
- ``udf``:     ``pyspark.ml.functions.predict_batch_udf`` with the numpy model: the baseline
- ``tfos``:    TFoS 2.2.5 ``TFCluster.inference(df.rdd)``, results counted (not by default)

Each variant is first checked against numpy on 2,000 cached rows (a warm-up job: it also
starts the Python workers and, for ``tfmodel``, imports TensorFlow and loads the model there),
then timed twice: the **first pass** over the freshly cached data, and a **warm** pass after
``--warmup`` seconds of the identical job, untimed.

    python benchmarks/inference.py                        # 1,000,000 rows, 2 reps
    python benchmarks/inference.py --quick --variants columns,udf
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

VARIANTS = ["tfos", "rows", "columns", "tfmodel", "udf"]
DEFAULT_VARIANTS = ["rows", "columns", "tfmodel", "udf"]
LABELS = {
    "tfos": "TFoS 2.2.5",
    "rows": "next_batch (rows)",
    "columns": "next_columns",
    "tfmodel": "TFModel.transform",
    "udf": "predict_batch_udf",
}
PASSES = ("first", "warm")
SHAPE = c.SHAPES["tabular"]
ROWS = 1_000_000
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
def serve_columns(args: dict[str, Any], ctx: Any) -> None:
    """``map_fun`` of ``columns``: numpy columns in, a numpy array of predictions back."""
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        batch = feed.next_columns(args["batch"])
        if batch is None:
            return
        feed.batch_results(predict(batch.columns[0]))


def serve_rows(args: dict[str, Any], ctx: Any) -> None:
    """``map_fun`` of ``rows`` and ``tfos``: TFoS's loop, lists of rows in, a list of results back."""
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        rows = feed.next_batch(args["batch"])
        if rows:
            feed.batch_results(predict([r[0] for r in rows]).tolist())


def export_model(path: str) -> str:
    """The numpy model as a SavedModel: ``features`` (None, 32) float32 -> ``prediction`` (None,)."""
    import tensorflow as tf

    weights, bias = model()

    class Linear(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.constant(weights)
            self.b = tf.constant(bias)

        @tf.function(input_signature=[tf.TensorSpec([None, SHAPE.width], tf.float32, name="features")])
        def serve(self, features: Any) -> Any:
            return {"prediction": tf.linalg.matvec(features, self.w) + self.b}

    module = Linear()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return path


# ---- variants ----------------------------------------------------------------------------------------
class Run:
    """Settings and results of one invocation."""

    def __init__(self, opts: argparse.Namespace, tfos: Any) -> None:
        self.opts = opts
        self.tfos = tfos
        self.results: dict[tuple[str, str], list[c.Sample]] = defaultdict(list)
        self.rows = opts.rows or (SHAPE.quick_rows if opts.quick else ROWS)
        self._export_dir = ""

    def export_dir(self) -> str:
        """The SavedModel of ``tfmodel``, exported once."""
        if not self._export_dir:
            with c.quiet_stage("tfmodel: export the SavedModel"):
                self._export_dir = export_model(os.path.join(tempfile.mkdtemp(prefix="tfos-bench-"), "linear"))
        return self._export_dir

    def variant_rows(self, variant: str) -> int:
        """Rows for ``variant`` (TFoS is capped)."""
        if variant != "tfos":
            return self.rows
        return min(self.rows, self.opts.tfos_rows or (self.rows if self.opts.quick else TFOS_ROWS))

    def data(self, variant: str) -> tuple[Any, Any, int]:
        """A fresh Spark context, the cached features DataFrame and a small warm-up one."""
        with c.quiet_stage(f"{variant}: spark + cached data"):
            sc, spark = c.fresh_spark(reuse=self.opts.quick)
            n = self.variant_rows(variant)
            df = c.cached(c.make_dataframe(spark, SHAPE, n, self.opts.partitions).select("features"), n)
            # cached too, so the check runs in the Python worker that serves the first pass
            warm = c.cached(c.make_dataframe(spark, SHAPE, WARM_ROWS, NODES).select("features"), WARM_ROWS)
        return sc, (df, warm), n

    def record(self, variant: str, when: str, rows: int, sample: c.Sample) -> None:
        """Keep and print one measurement."""
        sample.rows = rows
        self.results[(variant, when)].append(sample)
        print(f"{LABELS[variant]:<18} {when:<5} {sample}  load {c.load_average()}", flush=True)

    def median(self, variant: str, when: str, what: str) -> float | None:
        """Median rows/s (``what="rate"``) or CPU us per row (``"cpu"``) over the reps."""
        samples = self.results.get((variant, when), [])
        values = [s.rate if what == "rate" else s.cpu_us_per_row for s in samples]
        return c.median([v for v in values if v is not None])


def _check(predictions: list[float], warm: Any) -> None:
    """The warm-up predictions must equal the numpy model's."""
    x = np.asarray([r[0] for r in warm.collect()], np.float32)
    if not np.allclose(np.asarray(predictions, np.float32), predict(x), rtol=1e-4, atol=1e-4):
        raise RuntimeError("inference results differ from the numpy model")


def _noop_write(df: Any) -> None:
    """Compute every row of ``df`` and throw it away (Spark's ``noop`` sink)."""
    df.write.format("noop").mode("overwrite").save()


def measure(run: Run, variant: str, score: Callable[[Any], Any], df: Any, warm: Any, n: int) -> None:
    """Check ``score`` on the warm-up rows, time the first pass, warm up, time a warm pass."""
    with c.quiet_stage(f"{variant}: check"):
        _check([r.prediction for r in score(warm).select("prediction").collect()], warm)
    meter = c.Meter()
    _noop_write(score(df))
    run.record(variant, "first", n, meter.stop())
    with c.quiet_stage(f"{variant}: untimed passes"):
        c.warm_up(lambda: _noop_write(score(df)), run.opts.warmup)
    meter = c.Meter()
    _noop_write(score(df))
    run.record(variant, "warm", n, meter.stop())


@contextlib.contextmanager
def tfonspark_cluster(run: Run, sc: Any, map_fun: Callable[..., Any]) -> Iterator[Any]:
    """A 2-node ``InputMode.SPARK`` cluster serving ``map_fun``, shut down afterwards."""
    import tfonspark

    with c.quiet_stage("cluster start"):
        cluster = tfonspark.run(
            sc, map_fun, {"batch": run.opts.batch}, NODES, input_mode=tfonspark.InputMode.SPARK, reservation_timeout=300
        )
    try:
        yield cluster
    finally:
        with c.quiet_stage("cluster shutdown"):
            cluster.shutdown(timeout=120)


def run_cluster(run: Run, variant: str) -> None:
    """``rows`` / ``columns``: ``Cluster.inference(df)`` with the matching ``map_fun``."""
    sc, (df, warm), n = run.data(variant)
    with tfonspark_cluster(run, sc, serve_rows if variant == "rows" else serve_columns) as cluster:
        score = functools.partial(cluster.inference, feed_timeout=TIMEOUT, output_schema="prediction float")
        measure(run, variant, score, df, warm, n)


def run_tfmodel(run: Run) -> None:
    """``TFModel.transform`` serving the SavedModel of the same model."""
    from tfonspark.ml import TFModel

    export_dir = run.export_dir()
    _, (df, warm), n = run.data("tfmodel")
    model = (
        TFModel()
        .setExportDir(export_dir)
        .setInputMapping({"features": "features"})
        .setOutputMapping({"prediction": "prediction"})
        .setBatchSize(run.opts.batch)
    )
    # the prediction column alone, as every other variant writes: transform() also passes the
    # 32-float features column on, which the noop sink would copy row by row in the JVM
    measure(run, "tfmodel", lambda d: model.transform(d).select("prediction"), df, warm, n)


def make_predict_fn() -> Any:
    """``predict_batch_udf``'s model loader: the same numpy model."""
    return predict


def run_udf(run: Run) -> None:
    """``predict_batch_udf`` over the same data."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import FloatType

    _, (df, warm), n = run.data("udf")
    udf = predict_batch_udf(
        make_predict_fn, return_type=FloatType(), batch_size=run.opts.batch, input_tensor_shapes=[[SHAPE.width]]
    )
    measure(run, "udf", lambda d: d.select(udf("features").alias("prediction")), df, warm, n)


def run_tfos(run: Run) -> None:
    """TFoS ``TFCluster.inference(df.rdd)``: check, then one timed pass (counted)."""
    sc, (df, warm), n = run.data("tfos")
    with c.quiet_stage("tfos: cluster start"):
        cluster = run.tfos.run(
            sc,
            serve_rows,
            {"batch": run.opts.batch},
            NODES,
            0,
            input_mode=run.tfos.InputMode.SPARK,
            reservation_timeout=300,
        )
    try:
        infer = functools.partial(cluster.inference, feed_timeout=TIMEOUT)
        _check(infer(warm.rdd).collect(), warm)
        meter = c.Meter()
        count = infer(df.rdd).count()
        sample = meter.stop()
        if count != n:
            raise RuntimeError(f"TFoS returned {count} results for {n} rows")
        run.record("tfos", "first", n, sample)
    finally:
        with c.quiet_stage("tfos: shutdown"):
            c.stop_tfos(cluster)


# ---- report -----------------------------------------------------------------------------------------
def report(run: Run, variants: list[str]) -> str:
    """Markdown table: median rows/s and CPU us per row per pass, and the ratios to ``udf``."""
    shown = [v for v in VARIANTS if v in variants]
    header = ["variant", *[f"{p} rows/s" for p in PASSES], *[f"{p} / udf" for p in PASSES]]
    header += [f"{p} CPU us/row" for p in PASSES]
    rows = []
    for v in shown:
        rate = {p: run.median(v, p, "rate") for p in PASSES}
        rows.append(
            [
                LABELS[v],
                *[c.fmt_rate(rate[p]) for p in PASSES],
                *[c.fmt_ratio(rate[p], run.median("udf", p, "rate")) for p in PASSES],
                *[c.fmt_us(run.median(v, p, "cpu")) for p in PASSES],
            ]
        )
    return c.markdown_table(header, rows)


TARGETS = (("rows", 1.0), ("columns", 1.5), ("tfmodel", 1.2))


def targets(run: Run) -> list[str]:
    """The targets on the median rows/s against ``udf``, each pass, as MET / MISSED."""
    out = []
    for variant, goal in TARGETS:
        for when in PASSES:
            num, base = run.median(variant, when, "rate"), run.median("udf", when, "rate")
            if num is None or base is None:
                continue
            verdict = "MET" if num / base >= goal else "MISSED"
            out.append(f"- {LABELS[variant]} >= {goal}x predict_batch_udf ({when}): {num / base:.2f}x {verdict}")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=0, help=f"rows (default {ROWS:,})")
    p.add_argument(
        "--tfos-rows",
        type=int,
        default=0,
        help=f"cap on TFoS rows (default {TFOS_ROWS:,}); its rows/s does not depend on it",
    )
    c.add_run_args(p, VARIANTS, "model batch size")
    p.set_defaults(variants=",".join(DEFAULT_VARIANTS))
    opts = p.parse_args(argv)
    c.quick_defaults(opts, argv, reps=1, warmup=0)
    return opts


def main(argv: list[str] | None = None) -> int:
    """Run every variant ``--reps`` times, alternating, then print the table."""
    opts = parse_args(argv)
    variants, tfos = c.selected_variants(opts, VARIANTS)
    c.ship_by_value(c, sys.modules[__name__])
    run = Run(opts, tfos)
    import tfonspark

    print(
        f"# inference benchmark: {c.MASTER}, {run.rows:,} {SHAPE.name} rows, variants={variants}, "
        f"reps={opts.reps}, warm-up {opts.warmup:.0f}s, tfonspark from {Path(tfonspark.__file__).parent}, "
        f"load {c.load_average()}",
        flush=True,
    )
    runners = {
        "tfos": lambda: c.guarded("tfos", functools.partial(run_tfos, run)),
        "rows": functools.partial(run_cluster, run, "rows"),
        "columns": functools.partial(run_cluster, run, "columns"),
        "tfmodel": functools.partial(run_tfmodel, run),
        "udf": functools.partial(run_udf, run),
    }
    seconds = c.alternate(variants, opts.reps, runners)
    print(
        f"\n## DataFrame inference, {run.rows:,} tabular rows (median of {opts.reps} reps; "
        f"load average {c.load_average()}; {seconds:.0f}s in all)\n"
    )
    print(report(run, variants))
    print()
    print("\n".join(targets(run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
