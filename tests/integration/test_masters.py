"""The same cluster code on every kind of Spark master: local[N], local-cluster and standalone."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import tfonspark
from tfonspark import InputMode, TFParallel
from tfonspark.errors import ConfigError

from .conftest import by_value
from .test_feeding import _count_rows, _double, _totals

by_value(__name__)


def _feed_and_infer(sc, tmp_path):
    rdd = sc.parallelize([(np.full(8, i, np.float32), i) for i in range(1000)], 4)
    cluster = tfonspark.run(sc, _count_rows, str(tmp_path), 2, input_mode=InputMode.SPARK, reservation_timeout=120)
    assert cluster.train(rdd, num_epochs=2) == 2000
    cluster.shutdown(timeout=120)
    rows, label_sum, _ = _totals(tmp_path)
    assert rows == 2000 and label_sum == 2 * sum(range(1000))
    cluster = tfonspark.run(sc, _double, None, 2, input_mode=InputMode.SPARK, reservation_timeout=120)
    try:
        assert cluster.inference(rdd).collect() == [2 * i for i in range(1000)]
    finally:
        cluster.shutdown(timeout=120)
    return cluster


def test_two_executors_on_one_host_have_distinct_identities(sc, tmp_path, no_leftovers):
    cluster = _feed_and_infer(sc, tmp_path)
    keys = {i["executor_key"] for i in cluster.cluster_info}
    assert len(keys) == 2, "each executor JVM must get its own identity, even on one host"


def _instance(args, ctx):
    import os

    return {"index": ctx.executor_id, "num_workers": ctx.num_workers, "pid": os.getpid(), "arg": args}


@pytest.mark.parametrize("use_barrier", [True, False])
def test_tfparallel_runs_independent_instances(sc, use_barrier):
    results = TFParallel.run(sc, _instance, "x", 2, use_barrier=use_barrier)
    assert sorted(r["index"] for r in results) == [0, 1]
    assert all(r["num_workers"] == 2 and r["arg"] == "x" for r in results)


def test_tfparallel_rejects_more_instances_than_slots(sc):
    with pytest.raises(ConfigError, match="3 instances but the cluster has 2 task slots"):
        TFParallel.run(sc, _instance, None, 3, reservation_timeout=1)


def test_local_mode_laptop(sc_local, tmp_path, no_leftovers):
    """local[2]: both nodes live in one executor (the driver JVM); feeding spreads over both."""
    cluster = _feed_and_infer(sc_local, tmp_path)
    assert len({i["executor_key"] for i in cluster.cluster_info}) == 1
    parts = [json.loads(p.read_text()) for p in tmp_path.glob("rows*.json")]
    assert len(parts) == 2 and all(p["rows"] > 0 for p in parts)


@pytest.mark.cluster
def test_standalone_master_and_two_workers(standalone, tmp_path, no_leftovers):
    cluster = _feed_and_infer(standalone, tmp_path)
    assert len({i["executor_key"] for i in cluster.cluster_info}) == 2
    assert os.path.exists(tmp_path / "rows0.json")
