"""driver/services/beside.py: ``run(..., data_service=N)`` without Spark: the service starts first (on
its own executors or on the first nodes), ends with the cluster, or on failure."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import tfonspark
from tfonspark.driver.options import ClusterOptions
from tfonspark.driver.services import beside, data_service
from tfonspark.errors import ConfigError, NodeFailed, ReservationTimeout
from tfonspark.settings import Settings
from tfonspark.testing import FakeSparkContext
from tfonspark.tfprocess.data_worker import ADDRESS


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


# ---- from test_data_on_nodes.py ---------------------------------------------------------------------
# ``run(..., data_service=N, data_service_on="nodes")`` without Spark: the options, the wrapper, the start order.


class ReportingCluster:
    cluster_id = "c" * 32

    def __init__(self, reports, failure=None):
        self.reports, self.failure, self.stopped, self.on_end = reports, failure, 0, None

    def stop(self, grace_secs=2.0):
        self.stopped += 1
        if self.on_end:
            self.on_end()
        if self.failure is not None:
            raise self.failure


class FakeHandover:
    released = 0

    def release(self):
        self.released += 1


@pytest.fixture
def dispatch(monkeypatch):
    made = []

    class Svc:
        def __init__(self, workers):
            self.worker_addresses, self.stopped = workers, 0

        def shutdown(self):
            self.stopped += 1

    handover = FakeHandover()
    reserved = SimpleNamespace(task="dispatcher", handover=handover, address="driver:7", release=handover.release)
    monkeypatch.setattr(data_service, "reserve_task", lambda host, task, port_range="": reserved)
    monkeypatch.setattr(data_service, "Dispatcher", lambda reserved, workers: made.append(Svc(workers)) or made[-1])
    return SimpleNamespace(made=made, handover=handover)


def _report(node, address):
    role, index = node.split(":")
    return SimpleNamespace(node=node, role=role, index=int(index), metrics={ADDRESS: address})


def _start(cluster, count=2, timeout=5.0):
    targets = []

    def begin(target, on_end):
        targets.append(target)
        cluster.on_end = on_end
        return cluster

    options = ClusterOptions(data_service=count, data_service_on="nodes", reservation_timeout=timeout)
    resolved = SimpleNamespace(port_range="")  # Plan.resolved: the settings as they apply
    plan = SimpleNamespace(
        sc=None, host="driver", options=options, settings=Settings(), resolved=resolved, launcher=None, num_executors=2
    )
    plan.start = lambda handle, target, on_end: begin(target, on_end)  # Plan.start, its handle a Cluster
    return beside.start_beside(plan), targets


def test_the_dispatcher_starts_with_the_addresses_the_nodes_reported(dispatch):
    cluster = ReportingCluster([_report("worker:1", "b:2"), _report("worker:0", "a:1")])
    got, targets = _start(cluster)
    assert got is cluster and targets == ["grpc://driver:7"]
    (svc,) = dispatch.made
    assert svc.worker_addresses == ["a:1", "b:2"] and svc.stopped == 0  # no extra slots were asked for
    cluster.on_end()
    assert svc.stopped == 1 and dispatch.handover.released >= 1


def test_a_node_that_fails_before_reporting_stops_the_cluster(dispatch):
    cluster = ReportingCluster([], failure=NodeFailed("worker:0 exited"))
    with pytest.raises(NodeFailed, match="worker:0 exited"):
        _start(cluster)
    assert cluster.stopped == 1 and dispatch.made == [] and dispatch.handover.released >= 1


def test_nodes_that_never_report_time_out_naming_the_numbers(dispatch):
    cluster = ReportingCluster([_report("worker:0", "a:1")])
    with pytest.raises(ReservationTimeout, match="only 1 of the 2 TF nodes") as info:
        _start(cluster, timeout=0.2)
    assert (info.value.registered, info.value.required) == (1, 2) and cluster.stopped == 1
