"""Streaming feed speed: Structured Streaming micro-batches vs the batch feed of the same rows.

The rows are written once as Parquet files of exactly ``--batch-rows`` rows each (50,000 by
default). On one ``local-cluster[2,1,1024]`` and one tfonspark cluster (``InputMode.SPARK``),
every repetition times, in rotating order:

- ``batch``:  ``cluster.train(spark.read.parquet(dir))``: one feed job over every file
- ``stream``: ``cluster.train(spark.readStream...parquet(dir))`` with ``maxFilesPerTrigger=1``
  and ``trigger={"availableNow": True}``: one micro-batch per file, each fed by ``foreachBatch``
- ``empty``:  the same stream into an empty ``foreachBatch`` sink: what Spark's micro-batch
  machinery costs by itself
- ``plain``:  the same stream, each micro-batch read by plain Spark into a Python worker
  (``mapInArrow`` counting the rows, collected): the limit of any Python consumer of a stream

The clock stops once the TF processes have *consumed* every row (the same consumer as
``feed.py``). Prints rows/s of both feeds and their ratio (target >= 0.7x), and the seconds
each micro-batch adds to the feed against what an empty ``foreachBatch`` sink takes per batch,
and the streaming feed against plain Spark's streaming consumer of the same micro-batches.

    python benchmarks/streaming.py                    # 1M tabular rows (20 micro-batches), 3 reps
    python benchmarks/streaming.py --shape mnist --rows 200000
    python benchmarks/streaming.py --quick
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

import tfonspark  # noqa: E402
from tfonspark import InputMode  # noqa: E402

VARIANTS = ["batch", "stream", "empty", "plain"]
TARGET = 0.7
TIMEOUT = 600.0
SCHEMA = "features array<float>, label long"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="tabular", choices=sorted(c.SHAPES), help="row shape (default tabular)")
    p.add_argument("--rows", type=int, default=1_000_000, help="rows in all (default 1,000,000)")
    p.add_argument("--batch-rows", type=int, default=50_000, help="rows per micro-batch / file (default 50,000)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every variant (default 3)")
    p.add_argument(
        "--batch", type=int, default=1000, help="rows per next_columns() read; divides --batch-rows (default 1000)"
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 150,000 rows, one repetition, no warm-up")
    p.add_argument("--no-install", action="store_true", help="accepted for the benchmark smoke tests; unused")
    opts = p.parse_args(argv)
    c.quick_defaults(opts, argv, rows=150_000, reps=1)
    if opts.rows < opts.batch_rows or opts.rows % opts.batch_rows or opts.batch_rows % opts.batch:
        # a training read waits for a full batch: the clock needs every node's rows to fill whole batches
        p.error(
            "--rows must be a multiple of --batch-rows, and --batch-rows of --batch. "
            f"Received: {opts.rows}, {opts.batch_rows} and {opts.batch}"
        )
    return opts


class Bench:
    """The shared Spark session, Parquet files, tfonspark cluster and the samples taken."""

    def __init__(self, opts: argparse.Namespace, spark: Any, folder: str) -> None:
        self.opts = opts
        self.spark = spark
        self.folder = folder
        self.batches = opts.rows // opts.batch_rows
        self.counters = c.Counters()
        self.consumed = 0
        self.samples: dict[str, list[c.Sample]] = {v: [] for v in VARIANTS}
        self.cluster = tfonspark.run(
            spark.sparkContext,
            c.drain_columns,
            {"dir": self.counters.dir, "batch": opts.batch},
            2,
            input_mode=InputMode.SPARK,
            reservation_timeout=120,
        )

    def stream(self) -> Any:
        return self.spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(self.folder)

    def _fed(self, meter: c.Meter) -> c.Sample:
        """Wait until the consumers counted every row of this pass; the sample up to then."""
        self.consumed += self.opts.rows
        sample = meter.stop(self.counters.wait_for(self.consumed, TIMEOUT))
        sample.rows = self.opts.rows
        return sample

    def batch(self) -> c.Sample:
        meter = c.Meter()
        fed = self.cluster.train(self.spark.read.parquet(self.folder))
        _check(fed, self.opts.rows)
        return self._fed(meter)

    def streamed(self) -> c.Sample:
        checkpoint = tempfile.mkdtemp(prefix="tfos-stream-ckpt-")
        try:
            meter = c.Meter()
            query = self.cluster.train(self.stream(), trigger={"availableNow": True}, checkpoint_location=checkpoint)
            sample = self._fed(meter)
            query.awaitTermination(TIMEOUT)
            _check(sum(p["numInputRows"] for p in query.recentProgress), self.opts.rows)
            return sample
        finally:
            shutil.rmtree(checkpoint, ignore_errors=True)

    def empty(self) -> c.Sample:
        checkpoint = tempfile.mkdtemp(prefix="tfos-stream-ckpt-")
        try:
            meter = c.Meter()
            writer = self.stream().writeStream.foreachBatch(lambda df, batch_id: None)
            query = writer.trigger(availableNow=True).option("checkpointLocation", checkpoint).start()
            query.awaitTermination(TIMEOUT)
            sample = meter.stop()
            sample.rows = self.opts.rows
            _check(len({p["batchId"] for p in query.recentProgress}), self.batches)  # it reads no rows
            return sample
        finally:
            shutil.rmtree(checkpoint, ignore_errors=True)

    def plain(self) -> c.Sample:
        checkpoint = tempfile.mkdtemp(prefix="tfos-stream-ckpt-")
        counted: list[int] = []

        def count_batch(df: Any, batch_id: int) -> None:
            counted.append(sum(r[0] for r in df.mapInArrow(_count_rows, "n long").collect()))

        try:
            meter = c.Meter()
            writer = self.stream().writeStream.foreachBatch(count_batch)
            query = writer.trigger(availableNow=True).option("checkpointLocation", checkpoint).start()
            query.awaitTermination(TIMEOUT)
            sample = meter.stop()
            sample.rows = self.opts.rows
            _check(sum(counted), self.opts.rows)
            return sample
        finally:
            shutil.rmtree(checkpoint, ignore_errors=True)

    def run(self, variant: str, timed: bool = True) -> None:
        with c.quiet_stage(f"{variant}{'' if timed else ' (warm-up)'}"):
            sample = {"batch": self.batch, "stream": self.streamed, "empty": self.empty, "plain": self.plain}[variant]()
        if timed:
            self.samples[variant].append(sample)
            print(f"{variant:<7} {sample}", flush=True)

    def median_seconds(self, variant: str) -> float | None:
        return c.median([s.seconds for s in self.samples[variant]])


def _count_rows(batches: Any) -> Any:
    """mapInArrow: one row holding how many rows the partition had (the plain Spark consumer)."""
    import pyarrow as pa

    yield pa.RecordBatch.from_pydict({"n": [sum(b.num_rows for b in batches)]})


def _check(seen: int, expected: int) -> None:
    if seen != expected:
        raise RuntimeError(f"{seen} of {expected} expected rows (or batches) went through")


def write_files(spark: Any, shape: c.Shape, rows: int, batch_rows: int, folder: str) -> None:
    """``rows`` rows as Parquet files of exactly ``batch_rows`` rows each, one row group per file.

    One row group: Spark may split a large file into byte ranges, and a range reads the row
    groups that start in it; with one group, every partition holds whole files' rows.
    """
    files = rows // batch_rows
    writer = c.make_dataframe(spark, shape, rows, files).write.mode("overwrite")
    writer.option("parquet.block.size", str(1 << 30)).parquet(folder)
    written = len(list(Path(folder).glob("*.parquet")))
    if written != files:
        raise RuntimeError(f"wrote {written} Parquet files, expected {files}")


def report(bench: Bench) -> str:
    """The Markdown table and the targets."""
    batch, stream, empty, plain = (bench.median_seconds(v) for v in VARIANTS)
    rows, n = bench.opts.rows, bench.batches
    rate = {v: (rows / s if s else None) for v, s in (("batch", batch), ("stream", stream), ("plain", plain))}
    overhead = (stream - batch) / n if stream is not None and batch is not None else None
    per_empty = empty / n if empty is not None else None
    header = [
        "shape",
        "rows",
        "micro-batches",
        "batch feed rows/s",
        "streaming feed rows/s",
        "stream / batch",
        "plain Spark stream rows/s",
        "stream / plain Spark stream",
        "added s per micro-batch",
        "empty foreachBatch s per micro-batch",
    ]
    cells = [
        bench.opts.shape,
        f"{rows:,}",
        str(n),
        c.fmt_rate(rate["batch"]),
        c.fmt_rate(rate["stream"]),
        c.fmt_ratio(rate["stream"], rate["batch"]),
        c.fmt_rate(rate["plain"]),
        c.fmt_ratio(rate["stream"], rate["plain"]),
        "n/a" if overhead is None else f"{overhead:.3f}",
        "n/a" if per_empty is None else f"{per_empty:.3f}",
    ]
    lines = [c.markdown_table(header, [cells]), ""]
    if rate["stream"] and rate["batch"]:
        ratio = rate["stream"] / rate["batch"]
        verdict = "met" if ratio >= TARGET else "NOT met"
        lines.append(f"streaming feed >= {TARGET}x batch feed: {ratio:.2f}x ({verdict})")
    if rate["stream"] and rate["plain"]:
        lines.append(
            f"against plain Spark reading the same micro-batches into Python: {rate['stream'] / rate['plain']:.2f}x"
        )
    if overhead is not None and per_empty is not None:
        lines.append(
            f"per micro-batch: the streaming feed adds {overhead:.3f}s over the batch feed; "
            f"an empty foreachBatch sink takes {per_empty:.3f}s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Write the files, start one cluster, time every variant ``--reps`` times, print the table."""
    opts = parse_args(argv)
    shape = c.SHAPES[opts.shape]
    c.ship_by_value(c, sys.modules[__name__])
    _, spark = c.fresh_spark(reuse=opts.quick)
    folder = tempfile.mkdtemp(prefix="tfos-stream-bench-")
    started = time.perf_counter()
    print(
        f"# streaming benchmark: {c.MASTER}, {opts.rows:,} {shape.name} rows in micro-batches of "
        f"{opts.batch_rows:,}, reps={opts.reps}, load {c.load_average()}",
        flush=True,
    )
    try:
        with c.quiet_stage("writing the Parquet files"):
            write_files(spark, shape, opts.rows, opts.batch_rows, folder)
        bench = Bench(opts, spark, folder)
        try:
            if not opts.quick:
                for variant in VARIANTS:
                    bench.run(variant, timed=False)
            for rep in range(opts.reps):
                for variant in c.rotate(VARIANTS, rep):
                    bench.run(variant)
        finally:
            bench.cluster.shutdown(timeout=120)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    seconds = time.perf_counter() - started
    print(
        f"\n## Streaming vs batch feed, {shape.name} rows (median of {opts.reps} reps; "
        f"load average {c.load_average()}; {seconds:.0f}s in all)\n"
    )
    print(report(bench))
    return 0


if __name__ == "__main__":
    sys.exit(main())
