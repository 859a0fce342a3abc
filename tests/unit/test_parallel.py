"""``TFParallel.run`` without Spark: it waits for executors to register before counting task slots."""

from __future__ import annotations

import pytest

from tfonspark import TFParallel
from tfonspark.driver import jobs
from tfonspark.errors import ConfigError
from tfonspark.testing import FakeSparkContext


def _instance(args, ctx):
    return (ctx.task_index, ctx.num_workers, args)


def test_it_waits_for_executors_that_are_still_registering(monkeypatch):
    counted = []

    def slots(sc) -> int:  # a fresh SparkContext: no executor yet, then both
        counted.append(1)
        return 0 if len(counted) < 3 else 2

    monkeypatch.setattr(jobs, "task_slots", slots)
    results = TFParallel.run(FakeSparkContext(), _instance, "x", 2, use_barrier=False)
    assert sorted(results) == [(0, 2, "x"), (1, 2, "x")]
    assert len(counted) >= 3


def test_too_many_instances_fail_after_the_wait_naming_the_settings(monkeypatch):
    monkeypatch.setattr(jobs, "task_slots", lambda sc: 1)
    with pytest.raises(ConfigError, match=r"2 instances but the cluster has 1 task slots after waiting") as info:
        TFParallel.run(FakeSparkContext(), _instance, None, 2, use_barrier=False, reservation_timeout=0.2)
    assert "reservation_timeout=0.2s" in str(info.value) and "spark.executor.instances" in str(info.value)
