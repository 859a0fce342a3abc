"""``run(..., data_service=N)`` without Spark: the service starts first, ends with the cluster, or on failure."""

from __future__ import annotations

import pytest

from tfonspark.config import NodeConfig
from tfonspark.driver.launch import ClusterOptions, split_options
from tfonspark.driver.services import beside
from tfonspark.errors import ConfigError, ReservationTimeout
from tfonspark.settings import Settings
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
        """``launch.prepare``'s ``begin``: the cluster keeps ``on_end`` for when its nodes stop."""
        self.closers.append(on_end)
        return self


@pytest.fixture
def svc(monkeypatch):
    made = FakeService()
    calls = []

    def fake(sc, count, **kwargs):
        calls.append((count, kwargs["reservation_timeout"]))
        return made

    monkeypatch.setattr(beside, "data_service", fake)
    monkeypatch.setattr(beside, "wait_for_slots", lambda sc, needed, timeout: needed)
    made.calls = calls
    return made


def test_the_service_starts_first_and_ends_with_the_cluster(svc):
    cluster = FakeCluster()
    targets = []
    got = beside.start_beside(
        None,
        ClusterOptions(data_service=2, reservation_timeout=30),
        Settings(),
        None,
        lambda t, on_end: targets.append(t) or cluster.begin(t, on_end),
        1,
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
        beside.start_beside(None, ClusterOptions(data_service=1), Settings(), None, fail, 1)
    assert svc.stopped == 1


def test_a_failed_worker_is_logged_not_raised_on_stop(svc, caplog):
    def broken() -> None:
        raise RuntimeError("worker 0 died")

    svc.shutdown = broken
    cluster = FakeCluster()
    beside.start_beside(None, ClusterOptions(data_service=1), Settings(), None, cluster.begin, 1)
    cluster.closers[0]()
    assert "worker 0 died" in caplog.text


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2"])
def test_data_service_must_be_a_count(svc, bad):
    with pytest.raises(ConfigError, match="data_service must be a whole number"):
        beside.start_beside(None, ClusterOptions(data_service=bad), Settings(), None, lambda t, on_end: None, 1)
    assert svc.calls == []


def test_too_few_slots_for_nodes_and_workers_name_both(svc, monkeypatch):
    monkeypatch.setattr(beside, "wait_for_slots", lambda sc, needed, timeout: 2)
    options = ClusterOptions(data_service=1, reservation_timeout=3)
    with pytest.raises(ReservationTimeout) as info:
        beside.start_beside("sc", options, Settings(), None, lambda t, on_end: None, 2)
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
