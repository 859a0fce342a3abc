"""run(debug=Debug(check_numerics=True)) on real Spark: a NaN in one node's training fails the job.

Two nodes train a linear model; worker 1's rows hold a NaN. ``check_numerics`` stops it at
the first op that outputs the NaN, and the driver's ``NodeFailed`` names that op and the node
(worker:1) within 10 s of the node's NaN; worker 0 is stopped, not waited for.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import by_value

pytest.importorskip("tensorflow")

by_value(__name__)


def _nan_on_worker_1(out: str, ctx: Any) -> None:
    """A node: SGD steps of a linear model (plain TF, no Keras: quicker); worker 1's rows hold a NaN."""
    import numpy as np
    import tensorflow as tf

    x = np.random.default_rng(ctx.task_index).random((64, 8), dtype=np.float32)
    if ctx.task_index == 1:
        x[5, 3] = np.nan
    y = x.sum(axis=1, keepdims=True)
    w = tf.Variable(tf.zeros((8, 1)))

    @tf.function
    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    with open(os.path.join(out, f"start-{ctx.task_index}"), "w") as f:
        f.write(repr(time.time()))
    try:
        for _ in range(20):
            step(x, y)
    except tf.errors.InvalidArgumentError:  # check_numerics: when the node saw the NaN
        with open(os.path.join(out, f"nan-{ctx.task_index}"), "w") as f:
            f.write(repr(time.time()))
        raise
    time.sleep(600)  # the healthy node must be stopped, not waited for


def test_check_numerics_fails_the_job_naming_op_and_node(sc, tmp_path: Path, no_leftovers) -> None:
    import tfonspark
    from tfonspark.errors import NodeFailed

    debug = tfonspark.Debug(check_numerics=True)
    with pytest.raises(NodeFailed) as info:  # from run() or shutdown(), whichever sees it first
        cluster = tfonspark.run(sc, _nan_on_worker_1, str(tmp_path), 2, reservation_timeout=120, debug=debug)
        cluster.shutdown(timeout=300)
    raised_at = time.time()
    err = info.value
    assert (err.role, err.index) == ("worker", 1)
    assert "NumericsError: check_numerics: op" in err.traceback
    assert "produced NaN or Inf on worker:1" in err.traceback
    started, seen = (float((tmp_path / f"{what}-1").read_text()) for what in ("start", "nan"))
    print(
        f"[measured] worker:1 saw the NaN {seen - started:.2f}s into training; "
        f"the job failed {raised_at - seen:.2f}s later"
    )
    assert raised_at - seen < 10, f"took {raised_at - seen:.1f}s"
