"""``run(..., data_service=N)`` without Spark: the service starts first, ends with the cluster, or on failure."""

from __future__ import annotations

import pytest

import tfonspark
from tfonspark.config import NodeConfig
from tfonspark.driver.options import ClusterOptions, split_options
from tfonspark.driver.services import beside, data_service
from tfonspark.errors import ConfigError, ReservationTimeout
from tfonspark.settings import Settings
from tfonspark.testing import FakeSparkContext
from tfonspark.tfprocess.context import NodeContext


class FakeService:
    target = "grpc://driver:5050"

    def __init__(self) -> None:
        self.stopped = 0

    def shutdown(self) -> None:
        self.stopped += 1


class FakeCluster:
    cluster_id = "c" * 32

    def __init__(self) -> None:
        self.closers = []

    def begin(self, target, on_end):
        """What ``Plan.start`` does here: the cluster keeps ``on_end`` for when its nodes stop."""
        self.closers.append(on_end)
        return self


class FakePlan:
    """What ``start_beside`` reads of a ``Plan``; ``start(handle, target, on_end)`` calls ``begin``."""

    def __init__(self, options, begin, num_executors=1, sc=None):
        self.sc, self.host, self.options, self.settings, self.launcher = sc, "driver", options, Settings(), None
        self.num_executors, self._begin = num_executors, begin

    def start(self, handle, data_target=None, on_end=None):
        return self._begin(data_target, on_end)


@pytest.fixture
def svc(monkeypatch):
    made = FakeService()
    calls = []

    def fake(sc, count, **kwargs):
        calls.append((count, kwargs["reservation_timeout"]))
        return made

    monkeypatch.setattr(data_service, "data_service", fake)
    monkeypatch.setattr(beside, "wait_for_slots", lambda sc, needed, timeout: needed)
    made.calls = calls
    return made


def test_the_service_starts_first_and_ends_with_the_cluster(svc):
    cluster = FakeCluster()
    targets = []
    got = beside.start_beside(
        FakePlan(
            ClusterOptions(data_service=2, reservation_timeout=30),
            lambda t, on_end: targets.append(t) or cluster.begin(t, on_end),
        )
    )
    assert got is cluster and targets == [svc.target] and svc.calls == [(2, 30.0)]
    assert svc.stopped == 0
    (close,) = cluster.closers
    close()
    assert svc.stopped == 1


def test_a_cluster_that_cannot_start_stops_the_service(svc):
    def fail(target, on_end):
        raise ConfigError("no")

    with pytest.raises(ConfigError, match="no"):
        beside.start_beside(FakePlan(ClusterOptions(data_service=1), fail))
    assert svc.stopped == 1


def test_a_failed_worker_is_logged_not_raised_on_stop(svc, caplog):
    def broken() -> None:
        raise RuntimeError("worker 0 died")

    svc.shutdown = broken
    cluster = FakeCluster()
    beside.start_beside(FakePlan(ClusterOptions(data_service=1), cluster.begin))
    cluster.closers[0]()
    assert "worker 0 died" in caplog.text


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2"])
def test_data_service_must_be_a_count(svc, bad):
    with pytest.raises(ConfigError, match="data_service must be a whole number"):
        tfonspark.run(FakeSparkContext(), print, None, 1, data_service=bad)  # prepare refuses it: nothing starts
    assert svc.calls == []


def test_too_few_slots_for_nodes_and_workers_name_both(svc, monkeypatch):
    monkeypatch.setattr(beside, "wait_for_slots", lambda sc, needed, timeout: 2)
    options = ClusterOptions(data_service=1, reservation_timeout=3)
    with pytest.raises(ReservationTimeout) as info:
        beside.start_beside(FakePlan(options, lambda t, on_end: None, num_executors=2, sc="sc"))
    message = str(info.value)
    assert "run(num_executors=2, data_service=1) needs 3 Spark task slots" in message, message
    assert "spark.executor.instances" in message and (info.value.required, info.value.registered) == (3, 2)
    assert svc.calls == []  # nothing started


def test_run_takes_data_service_as_a_keyword():
    options, by_name = split_options({"data_service": 2, "heartbeat_timeout": 30})
    assert options.data_service == 2 and by_name == {"heartbeat_timeout": 30}
    assert ClusterOptions().data_service == 0


def _ctx(target):
    config = NodeConfig("c1", "127.0.0.1", 1, "ab" * 32, attempt=1, data_service=target)
    config = NodeConfig.from_json(config.to_json())  # it travels to the node as JSON
    place = {"executor_id": 0, "job_name": "worker", "task_index": 0, "cluster_spec": {"worker": ["a:1"]}}
    return NodeContext.in_cluster(config, {**place, "working_dir": "/tmp"})


def test_ctx_names_one_job_per_call_the_same_on_every_node(monkeypatch):
    from tfonspark.tfprocess import context

    seen = []
    monkeypatch.setattr(context, "distribute", lambda ds, target, mode, job_name: seen.append((target, mode, job_name)))
    for _node in range(2):
        ctx = _ctx("grpc://d:1")
        assert ctx.data_service == "grpc://d:1"
        ctx.distribute_dataset("train")
        ctx.distribute_dataset("val", "parallel_epochs")
        ctx.distribute_dataset("more", job_name="mine")
    first = [
        ("grpc://d:1", "distributed_epoch", "tfonspark-a1-1"),
        ("grpc://d:1", "parallel_epochs", "tfonspark-a1-2"),
        ("grpc://d:1", "distributed_epoch", "mine"),
    ]
    assert seen == first * 2


def test_ctx_without_a_service_says_how_to_start_one():
    ctx = _ctx(None)
    assert ctx.data_service is None
    with pytest.raises(ConfigError, match=r"run\(\.\.\., data_service=N\)"):
        ctx.distribute_dataset(object())
