"""Rows as users pass them, on real Spark: every shape, source and batch size is fed completely,
exactly once, in order, and no feed can hang.

Each call that could hang runs under :func:`within`, so a hang fails the test with a message
(and cancels its Spark jobs) instead of stalling the suite.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

import tfonspark
from tfonspark import InputMode, TFCluster
from tfonspark.errors import FeedTimeout, NodeFailed
from tfonspark.executor.feeder import pickled_batches
from tfonspark.wire.pickled import PickledRows

from .conftest import by_value, node_processes, wait_until

by_value(__name__)

BATCH_SIZES = [7, 10, 1, 64, 333]  # some divide the partitions, some do not


def within(seconds: float, what: str, fn, sc):
    """``fn()``, or a test failure naming ``what`` if it has not returned after ``seconds``."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised on the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        sc.cancelAllJobs()
        thread.join(30)
        pytest.fail(f"{what} did not return within {seconds:.0f}s: a hang")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def leaf_sum(row) -> float:
    """The sum of every number in a row, whatever its shape (scalar, tuple, list, array, dict)."""
    if isinstance(row, dict) or hasattr(row, "asDict"):
        return sum(leaf_sum(v) for v in (row.asDict() if hasattr(row, "asDict") else row).values())
    if isinstance(row, (list, tuple)):
        return float(sum(leaf_sum(v) for v in row))
    return float(np.sum(row))


# ---- stored rows read as their pickled batches ----------------------------------------------------


def _decoded_rows(blobs):
    """Every row of a partition's pickled batches, decoded without unpickling (None if refused)."""
    decoder, out = PickledRows(), []
    for blob in blobs:
        batch = decoder.decode(blob)
        if batch is None:
            return [None]
        out.extend((features.tolist(), label) for features, label in batch.rows())
    return out


def test_stored_rows_are_read_as_the_pickled_batches_spark_keeps(sc, tmp_path):
    """Cached, unioned and parallelized RDDs come as their stored batches, which decode to the
    very rows; an uncached map (pipelined into the feed task) and text files do not."""
    rows = [([i + 0.5] * 20, i % 10) for i in range(3000)]
    base = sc.parallelize(rows, 2)
    cached = base.map(lambda r: r).cache()
    (tmp_path / "t.txt").write_text("a\nb\n")
    assert pickled_batches(base.map(lambda r: r)) is None
    assert pickled_batches(sc.textFile(str(tmp_path / "t.txt"))) is None
    assert pickled_batches(base) is not None and pickled_batches(cached) is not None
    raw = pickled_batches(sc.union([cached, base]))  # one job reads all three kinds
    try:
        assert raw is not None
        assert raw.mapPartitions(_decoded_rows).collect() == rows + rows
    finally:
        cached.unpersist()


# ---- the two TFoS programs that hung ------------------------------------------------------------


def fun_square(args, ctx):
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        batch = feed.next_batch(10)
        if len(batch) > 0:
            feed.batch_results([x * x for x in batch])


def test_tfos_inference_of_plain_ints_returns_every_square_in_order(sc, no_leftovers):
    c = TFCluster.run(sc, fun_square, {}, 2, 0, False, TFCluster.InputMode.SPARK, reservation_timeout=120)
    try:
        out = within(
            120,
            "inference over sc.parallelize(range(1000), 10)",
            lambda: c.inference(sc.parallelize(range(1000), 10), feed_timeout=120).collect(),
            sc,
        )
        assert out == [x * x for x in range(1000)]
    finally:
        c.shutdown(timeout=120)


def fun_raise_late(args, ctx):
    feed = ctx.get_data_feed(train_mode=True)
    while not feed.should_stop():
        feed.next_batch(50)
    raise ValueError("boom-late")


def test_failure_after_the_feed_ends_raises_at_shutdown_naming_it(sc, no_leftovers):
    c = TFCluster.run(sc, fun_raise_late, {}, 2, 0, False, TFCluster.InputMode.SPARK, reservation_timeout=120)
    try:
        assert (
            within(
                120,
                "train over range(1000)",
                lambda: c.train(sc.parallelize(range(1000), 4), num_epochs=1, feed_timeout=60),
                sc,
            )
            == 1000
        )
        start = time.monotonic()
        with pytest.raises(NodeFailed) as info:
            within(60, "shutdown", lambda: c.shutdown(grace_secs=5, timeout=120), sc)
        elapsed = time.monotonic() - start
        print(f"\n[measured] shutdown raised NodeFailed {elapsed:.2f}s after it was called")
        assert elapsed < 10
        assert "boom-late" in str(info.value) and info.value.role in ("chief", "worker")
    finally:
        c._attempts.gang.teardown(grace_secs=0)


# ---- the shapes users pass ----------------------------------------------------------------------


def rdd_cases(sc) -> dict:
    """name -> (RDD, the rows it holds, in order)."""
    vec = [(np.full(4, i, np.float32), i) for i in range(600)]
    cases = {
        "ints from range": (sc.parallelize(range(1000), 10), list(range(1000))),
        "ints from a list": (sc.parallelize(list(range(1000)), 10), list(range(1000))),
        "floats": (sc.parallelize([i * 0.5 for i in range(500)], 3), [i * 0.5 for i in range(500)]),
        "tuples (array, label)": (sc.parallelize(vec, 5), vec),
        "tuples of lists": (
            sc.parallelize([([float(i)] * 3, i) for i in range(400)], 4),
            [([float(i)] * 3, i) for i in range(400)],
        ),
        "lists": (sc.parallelize([[i, i + 1, i + 2] for i in range(700)], 7), [[i, i + 1, i + 2] for i in range(700)]),
        "numpy rows": (
            sc.parallelize([np.arange(3) + i for i in range(300)], 3),
            [np.arange(3) + i for i in range(300)],
        ),
        "dicts": (
            sc.parallelize([{"x": i, "y": [i, i]} for i in range(300)], 3),
            [{"x": i, "y": [i, i]} for i in range(300)],
        ),
        "mapPartitions returning a list": (
            sc.parallelize(range(1000), 10).mapPartitions(lambda it: [x * 2 for x in it]),
            [x * 2 for x in range(1000)],
        ),
        "generator partitions": (
            sc.parallelize(range(1000), 4).mapPartitions(lambda it: (x + 1 for x in it)),
            [x + 1 for x in range(1000)],
        ),
        "more partitions than rows": (sc.parallelize(range(50), 13), list(range(50))),
        "one big partition": (sc.parallelize(range(20000), 1), list(range(20000))),
    }
    return cases


def df_cases(spark) -> dict:
    from pyspark.sql import functions as F

    arr = spark.range(0, 900, numPartitions=6).select(
        F.array(*[F.col("id").cast("float")] * 3).alias("features"), F.col("id").alias("label")
    )
    tuples = spark.createDataFrame([(i, float(i) / 2) for i in range(500)], "a long, b double").repartition(4)
    return {
        "DataFrame of one long column": (spark.range(0, 1000, numPartitions=7), [(i,) for i in range(1000)]),
        "DataFrame with an array column": (arr, [([float(i)] * 3, i) for i in range(900)]),
        "DataFrame from Python tuples": (tuples, None),  # repartition() shuffles: compare sums
    }


def _sum_rows(args, ctx):
    """Inference: one result per row, the sum of its numbers; batch sizes change every batch."""
    import itertools

    feed = ctx.get_data_feed(train_mode=False)
    sizes = itertools.cycle(args["sizes"])
    while not feed.should_stop():
        batch = feed.next_batch(next(sizes))
        if len(batch) > 0:
            feed.batch_results([leaf_sum(r) for r in batch])


def test_inference_of_every_row_shape_returns_one_result_per_row_in_order(sc, spark, no_leftovers):
    cluster = tfonspark.run(
        sc, _sum_rows, {"sizes": BATCH_SIZES}, 2, input_mode=InputMode.SPARK, reservation_timeout=120
    )
    wrong = []
    try:
        for name, (rdd, rows) in rdd_cases(sc).items():
            got = within(
                120, f"inference of {name}", lambda rdd=rdd: cluster.inference(rdd, feed_timeout=60).collect(), sc
            )
            if got != [leaf_sum(r) for r in rows]:
                wrong.append(f"{name}: {len(got)} results, first {got[:5]}")
        for name, (df, rows) in df_cases(spark).items():
            got = within(
                120,
                f"inference of {name}",
                lambda df=df: [r[0] for r in cluster.inference(df, feed_timeout=60).collect()],
                sc,
            )
            expected = [leaf_sum(r) for r in rows] if rows is not None else None
            if (
                (expected is not None and got != expected)
                or len(got) != df.count()
                or sum(got) != pytest.approx(sum(leaf_sum(r) for r in df.collect()))
            ):
                wrong.append(f"{name}: {len(got)} results, first {got[:5]}")
    finally:
        cluster.shutdown(timeout=120)
    assert not wrong, "\n".join(wrong)


def _tally(args, ctx):
    """Training: read each case from its own queue (a batch may span train() calls on one queue)
    and write how many rows, and their sum, this node read of it."""
    import itertools

    sizes = itertools.cycle(args["sizes"])
    for case in args["cases"]:
        feed = ctx.get_data_feed(train_mode=True, qname_in=case)
        count, total = 0, 0.0
        while not feed.should_stop():
            batch = feed.next_batch(next(sizes))
            count += len(batch)
            total += sum(leaf_sum(r) for r in batch)
        path = os.path.join(args["dir"], f"{case}-node{ctx.task_index}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"count": count, "sum": total}, f)
        os.replace(path + ".tmp", path)


def _read_tally(directory, case) -> tuple[int, float]:
    parts = [json.loads(p.read_text()) for p in directory.glob(f"{case}-node*.json")]
    return sum(p["count"] for p in parts), sum(p["sum"] for p in parts)


def test_training_on_every_row_shape_reads_each_row_once(sc, spark, tmp_path, no_leftovers):

    cases = {**rdd_cases(sc), **df_cases(spark)}
    qnames = {name: f"case{i}" for i, name in enumerate(cases)}
    cluster = tfonspark.run(
        sc,
        _tally,
        {"sizes": BATCH_SIZES, "dir": str(tmp_path), "cases": list(qnames.values())},
        2,
        input_mode=InputMode.SPARK,
        reservation_timeout=120,
    )
    wrong = []
    try:
        for name, (data, rows) in cases.items():
            epochs = 2 if name == "ints from range" else 1
            rows = rows if rows is not None else data.collect()
            q = qnames[name]
            fed = within(
                120, f"train on {name}", lambda d=data, e=epochs, q=q: cluster.train(d, e, feed_timeout=60, qname=q), sc
            )
            cluster._feeds.close((q,))  # what shutdown() does for the "input" queue
            wait_until(lambda q=q: len(list(tmp_path.glob(f"{q}-node*.json"))) == 2, 60)
            read = _read_tally(tmp_path, q)
            want = (epochs * len(rows), epochs * sum(leaf_sum(r) for r in rows))
            if fed != want[0] or read != (want[0], pytest.approx(want[1])):
                wrong.append(f"{name}: fed {fed}, nodes read {read}, expected {want}")
    finally:
        cluster._feeds.close(tuple(qnames.values()))  # every queue, so map_fun ends either way
        cluster.shutdown(timeout=120)
    assert not wrong, "\n".join(wrong)


# ---- exactly once per partition, with Spark's retries ------------------------------------------


def _count_rows(args, ctx):
    feed = ctx.get_data_feed(train_mode=True)
    rows, label_sum = 0, 0
    while not feed.should_stop():
        batch = feed.next_columns(500)
        if batch is None:
            break
        rows += batch.count
        label_sum += int(np.asarray(batch.columns[-1]).sum())
    with open(os.path.join(args, f"rows{ctx.task_index}.json"), "w") as f:
        json.dump({"rows": rows, "label_sum": label_sum}, f)


@pytest.mark.parametrize("how", ["raises", "worker dies"])
def test_a_partition_retried_by_spark_is_read_exactly_once(sc, tmp_path, no_leftovers, how):
    """20,000 MNIST-sized rows in 4 partitions; partition 1 fails at row 2,500 on its first attempt,
    after several batches of it reached the node. TFoS 2.2.5 counts 20,000; we did 20,016."""

    def flaky(index, rows):
        from pyspark import TaskContext

        first_attempt = TaskContext.get().attemptNumber() == 0
        for i, row in enumerate(rows):
            if index == 1 and first_attempt and i == 2500:
                if how == "worker dies":
                    os._exit(1)
                raise RuntimeError("injected failure at row 2500 of partition 1")
            yield row

    rdd = (
        sc.parallelize(range(20000), 4)
        .map(lambda i: (np.full(784, i % 7, np.float32), i))
        .mapPartitionsWithIndex(flaky)
    )
    cluster = tfonspark.run(sc, _count_rows, str(tmp_path), 2, input_mode=InputMode.SPARK, reservation_timeout=120)
    try:
        assert within(180, "train with a retried partition", lambda: cluster.train(rdd, feed_timeout=60), sc) == 20000
    finally:
        cluster.shutdown(timeout=120)
    parts = [json.loads(p.read_text()) for p in tmp_path.glob("rows*.json")]
    print(f"\n[measured] nodes read {[p['rows'] for p in parts]} rows ({how} at row 2,500 of partition 1)")
    assert sum(p["rows"] for p in parts) == 20000
    assert sum(p["label_sum"] for p in parts) == sum(range(20000))


# ---- every side of every channel stalls: an error, not a hang ----------------------------------


def _read_slowly_forever(args, ctx):
    feed = ctx.get_data_feed(train_mode=True)
    while not feed.should_stop():
        feed.next_batch(100)


def test_a_stalled_feeder_fails_the_feed_within_feed_timeout(sc, no_leftovers):
    """The feed task stops sending in the middle of a partition (its rows take forever)."""

    def stall(index, rows):
        for i, row in enumerate(rows):
            if index == 0 and i == 100:
                time.sleep(600)
            yield row

    rdd = sc.parallelize(range(4000), 4).map(lambda i: np.full(784, i, np.float32)).mapPartitionsWithIndex(stall)
    cluster = tfonspark.run(sc, _read_slowly_forever, None, 2, input_mode=InputMode.SPARK, reservation_timeout=120)
    try:
        start = time.monotonic()
        with pytest.raises(FeedTimeout) as info:
            within(120, "train with a stalled feeder", lambda: cluster.train(rdd, feed_timeout=4), sc)
        elapsed = time.monotonic() - start
        print(f"\n[measured] stalled feeder -> FeedTimeout after {elapsed:.1f}s (feed_timeout=4)")
        assert elapsed < 4 + 15
        assert "partition 0" in str(info.value) and "feed_timeout=4" in str(info.value)
    finally:
        cluster._attempts.gang.teardown(grace_secs=0)


def _never_read(args, ctx):
    time.sleep(600)


def test_a_node_that_takes_no_data_fails_the_feed_within_feed_timeout(sc, no_leftovers):
    os.environ["TFOS_FEED_BUFFER_BYTES"] = str(1 << 20)
    rdd = sc.parallelize(range(8), 8).flatMap(lambda i: [np.zeros(4096, np.float32)] * 500)
    cluster = tfonspark.run(sc, _never_read, None, 2, input_mode=InputMode.SPARK, reservation_timeout=120)
    try:
        start = time.monotonic()
        with pytest.raises(FeedTimeout) as info:
            within(120, "train into a node that never reads", lambda: cluster.train(rdd, feed_timeout=3), sc)
        elapsed = time.monotonic() - start
        print(f"\n[measured] node reading nothing -> FeedTimeout after {elapsed:.1f}s (feed_timeout=3)")
        assert elapsed < 60  # Spark retries the task spark.task.maxFailures times, each ~feed_timeout
        assert "worker:" in str(info.value) and "feed_timeout=3" in str(info.value)
    finally:
        cluster._attempts.gang.teardown(grace_secs=0)


def _read_but_never_answer(args, ctx):
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        feed.next_batch(10)


def test_results_that_never_come_fail_the_inference_within_feed_timeout(sc, no_leftovers):
    cluster = tfonspark.run(sc, _read_but_never_answer, None, 2, input_mode=InputMode.SPARK, reservation_timeout=120)
    try:
        start = time.monotonic()
        with pytest.raises(Exception) as info:
            within(
                120,
                "inference whose results never come",
                lambda: cluster.inference(sc.parallelize(range(100), 2), feed_timeout=3).collect(),
                sc,
            )
        elapsed = time.monotonic() - start
        print(f"\n[measured] results never sent -> error after {elapsed:.1f}s (feed_timeout=3)")
        assert "FeedTimeout" in str(info.value) and "feed_timeout=3" in str(info.value)
    finally:
        cluster._attempts.gang.teardown(grace_secs=0)


def _sleep_in_map_fun(args, ctx):
    time.sleep(600)


def test_a_silent_supervisor_is_reported_lost_within_heartbeat_timeout(sc, no_leftovers):
    """Control channel: a supervisor that stops answering (SIGSTOP) is a lost node, not a hang."""
    os.environ["TFONSPARK_HEARTBEAT_TIMEOUT"] = "4"
    cluster = tfonspark.run(sc, _sleep_in_map_fun, None, 2, reservation_timeout=120)
    stopped = []
    try:
        supervisors = [
            p for p in node_processes([cluster.cluster_id]) if "tfonspark.executor.supervisor" in " ".join(p.cmdline())
        ]
        assert supervisors
        supervisors[0].send_signal(signal.SIGSTOP)
        stopped.append(supervisors[0])
        start = time.monotonic()
        with pytest.raises(NodeFailed) as info:
            within(60, "shutdown with a silent supervisor", lambda: cluster.shutdown(timeout=60), sc)
        elapsed = time.monotonic() - start
        print(f"\n[measured] silent supervisor -> NodeFailed after {elapsed:.1f}s (heartbeat timeout 4s)")
        assert elapsed < 4 + 10
        assert "heartbeat" in str(info.value)
    finally:
        for proc in stopped:
            proc.send_signal(signal.SIGCONT)
        cluster._attempts.gang.teardown(grace_secs=0)


def _echo_rows(args, ctx):
    """TFoS inference that answers each row with the row itself, as next_batch gave it."""
    from tfonspark import TFNode

    feed = TFNode.DataFeed(ctx.mgr, False)
    while not feed.should_stop():
        batch = feed.next_batch(args["batch"])
        if len(batch) > 0:
            assert all(type(r) is type(batch[0]) for r in batch)
            feed.batch_results(batch)


def test_tfos_rows_and_results_come_back_as_they_were_fed(sc, no_leftovers):
    """TFoS handed next_batch the objects fed and returned what batch_results got: lists stay
    lists, tuples tuples, through the row path (an uncached map) and the stored-RDD path."""
    rows = [([float(i) + 0.5] * 16, i) for i in range(300)]
    list_rows = [[[float(i)] * 3, (i, i + 1)] for i in range(200)]
    cluster = tfonspark.run(sc, _echo_rows, {"batch": 37}, 2, input_mode=InputMode.SPARK, reservation_timeout=120)
    try:
        cases = {
            "uncached map": (sc.parallelize(range(300), 3).map(lambda i: ([float(i) + 0.5] * 16, i)), rows),
            "cached": (sc.parallelize(rows, 3).cache(), rows),
            "list rows, uncached map": (
                sc.parallelize(range(200), 2).map(lambda i: [[float(i)] * 3, (i, i + 1)]),
                list_rows,
            ),
            "list rows, parallelized": (sc.parallelize(list_rows, 2), list_rows),
        }
        for name, (rdd, expected) in cases.items():
            got = within(
                120, f"inference of {name}", lambda rdd=rdd: cluster.inference(rdd, feed_timeout=60).collect(), sc
            )
            assert got == expected, name
            assert {(type(r), *map(type, r)) for r in got} == {(type(expected[0]), *map(type, expected[0]))}, name
    finally:
        cluster.shutdown(timeout=120)
