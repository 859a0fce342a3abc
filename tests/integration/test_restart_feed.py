"""``max_restarts`` in InputMode.SPARK on real Spark: after a restart, only unread epochs are fed again."""

from __future__ import annotations

import json
import os

import numpy as np

import tfonspark
from tfonspark import InputMode

from .conftest import by_value

by_value(__name__)

ROWS, PARTITIONS, EPOCHS = 3000, 6, 4


def _read_and_die(args, ctx):
    """Read the feed; on the first attempt worker 1 is SIGKILLed in its second epoch.

    Not at a row count: feed tasks go to whichever node is free, so how many rows an epoch
    brings each node depends on their relative speed (another test beside this one changes it).
    Each node notes the epoch marks it reads (a file per mark); worker 1 dies once it has read
    epoch 0's mark and a row after it, and worker 0 has read epoch 0's mark too, before it reads
    epoch 1's: the first epoch some node had not read through is then epoch 1, by construction.
    """
    import signal
    import time

    import numpy as np

    feed = ctx.get_data_feed(train_mode=True)
    marks: list[int] = []
    report = feed.server.on_event

    def note_marks(event):
        report(event)  # first: the driver has it before the file says so
        if type(event).__name__ == "EpochRead":
            marks.append(event.epoch)
            open(os.path.join(args, f"mark-{ctx.attempt}-{ctx.task_index}-{event.epoch}"), "w").close()

    feed.server.on_event = note_marks
    rows, label_sum = 0, 0
    while not feed.should_stop():
        batch = feed.next_columns(100)
        if batch is None:
            break
        rows += batch.count
        label_sum += int(np.asarray(batch.columns[-1]).sum())
        if ctx.attempt == 0 and ctx.task_index == 1 and marks == [0]:
            worker0_read = os.path.join(args, "mark-0-0-0")
            deadline = time.monotonic() + 60
            while not os.path.exists(worker0_read):
                if time.monotonic() > deadline:  # fails this node: the test names it in its cause
                    raise TimeoutError("worker 0 read no end of epoch 0 within 60 s; worker 1 was to die after it")
                time.sleep(0.01)
            time.sleep(0.2)  # worker 0's mark travels to the driver on its own channel
            os.kill(os.getpid(), signal.SIGKILL)
    with open(os.path.join(args, f"rows-{ctx.attempt}-{ctx.task_index}.json"), "w") as f:
        json.dump({"rows": rows, "label_sum": label_sum}, f)


def test_a_node_killed_mid_epoch_is_restarted_and_only_unread_epochs_are_fed_again(sc, tmp_path, no_leftovers):
    rdd = sc.parallelize([(np.float32(i % 5), i) for i in range(ROWS)], PARTITIONS).cache()
    cluster = tfonspark.run(
        sc, _read_and_die, str(tmp_path), 2, input_mode=InputMode.SPARK, reservation_timeout=120, max_restarts=1
    )
    delivered = cluster.train(rdd, num_epochs=EPOCHS, feed_timeout=120)
    cluster.shutdown(timeout=120)

    assert cluster.restarts == 1
    restart = cluster.restart_log[0]
    assert (restart.cause.role, restart.cause.index) == ("worker", 1)
    assert "SIGKILL" in str(restart.cause)
    # worker 1 died in epoch 1 (from 0), worker 0 had read past epoch 0's end: epochs 1-3 again
    assert restart.refeed_epoch == 1
    refed = [json.loads(p.read_text()) for p in tmp_path.glob("rows-1-*.json")]
    assert len(refed) == 2
    assert sum(p["rows"] for p in refed) == (EPOCHS - 1) * ROWS
    assert sum(p["label_sum"] for p in refed) == (EPOCHS - 1) * sum(range(ROWS))
    assert delivered == EPOCHS * ROWS  # each epoch counted once, by the feed that completed it
    print(
        f"[measured] SPARK-mode restart: {restart.total_s:.1f}s from failure to nodes up "
        f"(detect {restart.detect_s:.1f}s, teardown {restart.teardown_s:.1f}s, reservation {restart.reserve_s:.1f}s, start-up {restart.startup_s:.1f}s)"
    )
