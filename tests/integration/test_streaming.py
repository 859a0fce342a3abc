"""Streams on real Spark: Structured Streaming (file source) and DStreams fed, inferred, failed and stopped."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

import tfonspark
from tfonspark import InputMode
from tfonspark.errors import AuthenticationError, NodeFailed

from .conftest import by_value, node_processes, wait_until

by_value(__name__)
pytestmark = pytest.mark.filterwarnings("ignore:DStream is deprecated:FutureWarning")
SCHEMA = "features array<float>, label long"


def _collect_labels(args, ctx):
    """Read the feed to its end; report each batch's rows; write every label seen.

    A training batch waits for its 50 rows (TFoS semantics), so the tests feed multiples of 50.
    """
    import numpy as np

    feed = ctx.get_data_feed(train_mode=True)
    seen = []
    while True:
        batch = feed.next_columns(50)
        if batch is None:
            break
        labels = [int(v) for v in np.asarray(batch.columns[-1])]
        seen.extend(labels)
        ctx.report({"rows": len(labels)})
    with open(os.path.join(args, f"seen{ctx.task_index}.json"), "w") as f:
        json.dump(seen, f)


def _reported(cluster) -> int:
    return sum(int(r.metrics.get("rows", 0)) for r in cluster.reports)


def _seen(path) -> list[int]:
    return sorted(v for p in path.glob("seen*.json") for v in json.loads(p.read_text()))


def _drop(folder, name: str, labels: range) -> None:
    """Drop a JSON-lines file into a watched folder at once (written aside, then renamed in)."""
    aside = folder.parent / f".{name}"
    aside.write_text("".join(json.dumps({"features": [float(i)] * 4, "label": i}) + "\n" for i in labels))
    os.replace(aside, folder / name)


def test_streams_feed_every_row_once_and_stop_on_request(spark, tmp_path, no_leftovers):
    """Files dropped into a folder, then a DStream: each row reaches map_fun exactly once across
    micro-batches; a wrong secret is refused; the CLI's stop request ends both streams; nothing
    is left running."""
    from pyspark.streaming import StreamingContext

    sc = spark.sparkContext
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir(), out.mkdir()
    cluster = tfonspark.run(sc, _collect_labels, str(out), 2, input_mode=InputMode.SPARK, reservation_timeout=120)
    query, ssc = None, StreamingContext(sc, 0.2)
    try:
        stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(src))
        query = cluster.train(stream, trigger="100 milliseconds", checkpoint_location=str(tmp_path / "ckpt"))
        _drop(src, "a.json", range(0, 400))
        assert wait_until(lambda: _reported(cluster) == 400, 60), f"{_reported(cluster)} of 400 rows arrived"
        _drop(src, "b.json", range(400, 700))
        _drop(src, "c.json", range(700, 1000))
        assert wait_until(lambda: _reported(cluster) == 1000, 60), f"{_reported(cluster)} of 1000 rows arrived"
        # restarted from its checkpoint, the query feeds only what came after: nothing twice. Stop
        # it once its three micro-batches are committed: a batch fed but not yet committed is
        # fed again after a restart, by design (the node drops the replay: every row once)
        commits = tmp_path / "ckpt" / "commits"
        assert wait_until(lambda: len([c for c in commits.glob("[0-9]*")]) == 3, 60), "3 commits expected"
        assert wait_until(lambda: sum(p["numInputRows"] for p in query.recentProgress) == 1000, 60)
        query.stop()
        first = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        _drop(src, "d.json", range(1200, 1300))
        query = cluster.train(stream, trigger="100 milliseconds", checkpoint_location=str(tmp_path / "ckpt"))
        assert wait_until(lambda: _reported(cluster) == 1100, 60), f"{_reported(cluster)} of 1100 rows arrived"

        rdds = [sc.parallelize([(np.zeros(3, np.float32), i) for i in range(k, k + 100)], 2) for k in (1000, 1100)]
        assert cluster.train(ssc.queueStream(rdds)) is None  # TFoS: DStream training returns at once
        ssc.start()
        assert wait_until(lambda: _reported(cluster) == 1300, 60), f"{_reported(cluster)} of 1300 rows arrived"

        host, port = cluster.server.address
        with pytest.raises(AuthenticationError):
            tfonspark.request_stop(f"{host}:{port}", os.urandom(32))
        assert query.isActive and not cluster.server.stop_reason, "a wrong secret must not stop the stream"

        stop_file = cluster.write_stop_file(tmp_path / "stop.json")
        assert stat.S_IMODE(os.stat(stop_file).st_mode) == 0o600
        cli = subprocess.run(
            [sys.executable, "-m", "tfonspark.stop", stop_file, "--reason", "test"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        start = time.monotonic()
        cluster.shutdown(query, timeout=60)
        print(f"[measured] shutdown(query) after a stop request took {time.monotonic() - start:.2f}s")
    finally:
        cluster.shutdown(timeout=60)
        ssc.stop(stopSparkContext=False)
    assert not query.isActive and spark.streams.active == []
    assert ssc.awaitTerminationOrTimeout(0.1), "the StreamingContext is stopped with the query"
    assert _seen(out) == list(range(1300)), "every row exactly once"
    assert first == [400, 300, 300], first
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [100]
    assert not os.path.exists(stop_file), "the stop file goes with the cluster"
    assert wait_until(lambda: not node_processes([cluster.cluster_id]), 20), "node processes left behind"
    assert wait_until(lambda: not sc.statusTracker().getActiveJobsIds(), 20), "Spark jobs still running"


def _die_on_data(args, ctx):
    import time

    feed = ctx.get_data_feed()
    feed.next_batch(10)
    with open(os.path.join(args, f"died{ctx.task_index}"), "w") as f:
        f.write(repr(time.time()))
    raise RuntimeError(f"node {ctx.task_index} crashed on streamed data")


def test_node_failure_stops_the_query_within_seconds(spark, tmp_path, no_leftovers):
    src = tmp_path / "in"
    src.mkdir()
    cluster = tfonspark.run(
        spark.sparkContext, _die_on_data, str(tmp_path), 2, input_mode=InputMode.SPARK, reservation_timeout=120
    )
    stream = spark.readStream.schema(SCHEMA).json(str(src))
    query = cluster.train(stream, trigger="100 milliseconds")
    _drop(src, "a.json", range(100))
    assert wait_until(lambda: list(tmp_path.glob("died*")), 60), "no node took the streamed rows"
    assert wait_until(lambda: not query.isActive, 30)
    stopped = time.time()
    died = min(float(p.read_text()) for p in tmp_path.glob("died*"))
    print(f"[measured] node death stopped the streaming query after {stopped - died:.2f}s")
    assert stopped - died < 10, f"took {stopped - died:.1f}s"
    with pytest.raises(NodeFailed) as info:
        cluster.shutdown(query, timeout=60)
    assert info.value.role == "worker" and "crashed on streamed data" in info.value.traceback
    assert spark.streams.active == []


def _double(args, ctx):
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        batch = feed.next_batch(50)
        if batch:
            feed.batch_results([2 * row[-1] for row in batch])


def test_stream_inference_and_dstreams(spark, tmp_path, no_leftovers):
    """inference(streaming_df) gives one row per input row into a checkpointed sink;
    inference(dstream) a DStream of results; train(dstream) feeds each micro-batch once;
    shutdown(ssc) after request_stop stops the StreamingContext."""
    from pyspark.errors import AnalysisException
    from pyspark.streaming import StreamingContext

    sc = spark.sparkContext
    src = tmp_path / "in"
    src.mkdir()
    cluster = tfonspark.run(sc, _double, None, 2, input_mode=InputMode.SPARK, reservation_timeout=120)
    try:
        stream = spark.readStream.schema(SCHEMA).json(str(src))
        results = cluster.inference(stream, output_schema="doubled long")
        assert results.isStreaming
        query = (
            results.writeStream.format("parquet")
            .option("path", str(tmp_path / "pred"))
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(processingTime="100 milliseconds")
            .start()
        )
        _drop(src, "a.json", range(300))
        _drop(src, "b.json", range(300, 500))

        def predictions():
            """What the sink has committed so far (read through its own metadata log)."""
            try:
                return sorted(r.doubled for r in spark.read.parquet(str(tmp_path / "pred")).collect())
            except AnalysisException:  # no batch committed yet
                return []

        assert wait_until(lambda: len(predictions()) >= 500, 60), f"{len(predictions())} of 500 results"
        assert predictions() == [2 * i for i in range(500)], "one result per input row"
        query.stop()

        ssc = StreamingContext(sc, 0.2)
        batches = [sc.parallelize([(np.zeros(2, np.float32), i) for i in range(k, k + 50)], 2) for k in (0, 50, 100)]
        got = []
        cluster.inference(ssc.queueStream(batches)).foreachRDD(lambda rdd: got.extend(rdd.collect()))
        ssc.start()
        assert wait_until(lambda: len(got) == 150, 60), f"{len(got)} of 150 results"
        assert sorted(got) == [2 * i for i in range(150)]
        tfonspark.request_stop(cluster.write_stop_file())
        cluster.shutdown(ssc, timeout=60)
        assert ssc.awaitTerminationOrTimeout(0.1), "the StreamingContext must be stopped"
    finally:
        cluster.shutdown(timeout=60)
    assert spark.streams.active == []
