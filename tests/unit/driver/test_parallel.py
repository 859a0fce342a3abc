"""``TFParallel.run`` without Spark: it waits for executors to register before counting task slots."""

from __future__ import annotations

import os

import pytest

from tfonspark import TFParallel
from tfonspark.driver import jobs
from tfonspark.errors import ConfigError
from tfonspark.testing import FakeSparkContext, fake_nvidia_smi


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


def _gpus_seen(args, ctx):
    return ctx.task_index, ctx.gpus, os.environ.get("CUDA_VISIBLE_DEVICES")


def test_instances_take_free_gpus_by_index_and_the_worker_environment_is_restored(monkeypatch, tmp_path):
    fake_nvidia_smi(tmp_path, count=4, busy=(1,))
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(jobs, "task_slots", lambda sc: 2)
    results = TFParallel.run(FakeSparkContext(), _gpus_seen, {"num_gpus": 1}, 2, use_barrier=False)
    assert sorted(results) == [(0, ["0"], "0"), (1, ["2"], "2")]  # GPU 1 is busy: disjoint free ones
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # the Spark Python worker runs other tasks next


def test_without_gpus_instances_run_on_the_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    monkeypatch.setattr(jobs, "task_slots", lambda sc: 1)
    assert TFParallel.run(FakeSparkContext(), _gpus_seen, {}, 1, use_barrier=False) == [(0, [], "")]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"
