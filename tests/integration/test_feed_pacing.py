"""Fed MWMS training never stalls on the feed's own pacing (issue 43, row 0).

Seen from outside: two nodes train the demo CNN with ``tfonspark.keras.fit`` under MWMS, fed
from a DataFrame and read through a shuffled ``as_dataset``, in a SparkContext where an
``InputMode.TENSORFLOW`` cluster ran just before; ``train()`` took 327 s for 25 s of training.
One node had read all of its share and waited for more; the other waited for it in the step's
collective, with a partition queued and the next one's Ack held by the pacing, which kept the
job, and so the end of the feed, from coming until the hold's quiet limit (feed_timeout / 2).

Which partitions a node gets depends on which executor frees first, so the test builds that
shape on purpose: the first executor to compute a partition of the DataFrame computes full ones
(4,000 rows each), the other small ones (20 rows), 0.15 s slower. The full executor's node then
holds two full partitions (the second one's Ack held: map_fun reads into its shuffle buffer,
then waits in the collective), the other node 120 rows, fewer than its shuffle buffer: it waits
for data that only the end of the feed brings. Before the fix ``train()`` waited for the hold's
quiet limit (measured with feed_timeout=120 s: 111.8 s for 56.7 s of training, on a busy
machine); now the driver releases the held Ack once every partition is handed out.
"""

from __future__ import annotations

import logging
import os
import time

import pytest

import tfonspark
from tfonspark import InputMode

from .conftest import by_value

by_value(__name__)

FULL, SMALL, PARTITIONS = 4000, 20, 8
FEED_TIMEOUT = 300.0  # the hold's quiet limit: 150 s
PER_REPLICA = 12


def _rows(marker: str):
    """``mapInArrow``: a partition's rows, full on the first executor to compute one, else small."""

    def rows(batches):
        import os
        import time

        import numpy as np
        import pyarrow as pa

        from tfonspark.host import executor_key

        key = executor_key()
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.write(fd, key.encode())
            os.close(fd)
        except FileExistsError:
            pass
        with open(marker) as f:
            full = f.read() == key
        for batch in batches:
            for partition in batch.column(0).to_pylist():
                n = FULL if full else SMALL
                if not full:
                    time.sleep(0.15)  # a slower executor
                rng = np.random.default_rng(partition)
                images = rng.random(n * 784, dtype=np.float32)
                offsets = pa.array(np.arange(0, (n + 1) * 784, 784, dtype=np.int32))
                column = pa.ListArray.from_arrays(offsets, pa.array(images))
                yield pa.RecordBatch.from_arrays([column, pa.array(rng.integers(0, 10, n))], ["image", "label"])

    return rows


def _nothing(args, ctx):
    """The TENSORFLOW-mode cluster that runs first."""


def _train(args, ctx):
    """The demo CNN through tfonspark.keras.fit, on the fed rows, shuffled; report timings."""
    import time

    from tfonspark import distribute

    strategy = distribute.strategy()
    from tfonspark.demo.model import build_model
    from tfonspark.keras import fit

    feed = ctx.get_data_feed()
    with strategy.scope():
        model = build_model(total_steps=1000)

    def dataset_fn(context):
        batch = context.get_per_replica_batch_size(2 * PER_REPLICA)
        return feed.as_dataset(256).unbatch().shuffle(512).batch(batch)

    steps: list[float] = []
    rows: list[int] = []
    ctx.report({"ready": True})  # the test feeds once map_fun is about to read
    start = time.monotonic()

    def progress(p):
        steps.append(time.monotonic())
        rows.append(p.rows)

    fit(model, dataset_fn, epochs=1, steps_per_epoch=2000, verbose=0, log_every_steps=1, on_progress=progress)
    end = time.monotonic()
    ctx.report(
        {
            "ready": False,
            "first_step_s": steps[0] - start,
            "training_s": end - steps[0],
            "rows": rows[-1],
            "steps": len(steps),
        }
    )
    feed.drain()


@pytest.mark.slow
def test_fed_mwms_training_after_a_tensorflow_cluster_never_waits_for_the_pacing(
    sc, spark, tmp_path, caplog, no_leftovers
):
    pytest.importorskip("tensorflow")
    tfonspark.run(sc, _nothing, {}, 2, input_mode=InputMode.TENSORFLOW, reservation_timeout=120).shutdown(timeout=120)

    marker = str(tmp_path / "full-executor")
    df = spark.range(PARTITIONS, numPartitions=PARTITIONS).mapInArrow(_rows(marker), "image array<float>, label bigint")
    reports = []
    cluster = tfonspark.run(
        sc, _train, {}, 2, input_mode=InputMode.SPARK, reservation_timeout=120, on_report=reports.append
    )
    deadline = time.monotonic() + 180
    while sum(bool(r.metrics.get("ready")) for r in reports) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    with caplog.at_level(logging.INFO, logger="tfonspark.driver.feeds.feed_watch"):
        start = time.monotonic()
        fed = cluster.train(df, num_epochs=1, feed_timeout=FEED_TIMEOUT)
        train_s = time.monotonic() - start
    cluster.shutdown(timeout=180)

    nodes = {r.node: r.metrics for r in reports if "rows" in r.metrics}
    assert set(nodes) == {"worker:0", "worker:1"}
    full, small = sorted(nodes.values(), key=lambda n: -n["rows"])
    # the shape of the stall: one node with two full partitions or more, the other starving
    assert full["rows"] >= 2 * FULL and full["rows"] % FULL == 0, nodes
    assert small["rows"] < 512 and fed == full["rows"] + small["rows"], (fed, nodes)
    assert os.path.exists(marker)
    training_s = full["training_s"]  # the steps after the first: the training itself
    assert train_s < 2 * training_s, f"train() took {train_s:.1f}s for {training_s:.1f}s of training: {nodes}"
    assert train_s < FEED_TIMEOUT / 2  # never the hold's quiet limit
    assert "every partition of the feed is handed out" in caplog.text
