"""``run(..., data_service=N, data_service_on="nodes")`` without Spark: the options, the wrapper, the start order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tfonspark.driver.options import ClusterOptions, split_options
from tfonspark.driver.programs import for_run
from tfonspark.driver.services import beside, data_service
from tfonspark.errors import ConfigError, NodeFailed, ReservationTimeout
from tfonspark.settings import Settings
from tfonspark.tfprocess import data_worker
from tfonspark.tfprocess.data_worker import ADDRESS, OnNodes


def main_fun(args, ctx):
    return ("ran", ctx.executor_id)


def node_program(map_fun, options, nodes):
    """What every node of ``run(map_fun, ..., nodes, **options)`` runs: its row of the program table."""
    return for_run(options).make(map_fun, options, nodes)


def test_run_takes_data_service_on_as_a_keyword():
    options, _ = split_options({"data_service": 2, "data_service_on": "nodes"})
    assert options.data_service_on == "nodes" and ClusterOptions().data_service_on == "executors"


def test_executors_keep_map_fun_and_nodes_wrap_it():
    assert node_program(main_fun, ClusterOptions(data_service=2), 2) is main_fun
    program = node_program(main_fun, ClusterOptions(data_service=2, data_service_on="nodes", reservation_timeout=30), 3)
    assert program == OnNodes(main_fun, 2, 30.0)


@pytest.mark.parametrize(
    ("options", "nodes", "says"),
    [
        (ClusterOptions(data_service_on="spare"), 2, "must be one of 'executors', 'nodes'"),
        (ClusterOptions(data_service=0, data_service_on="nodes"), 2, "give 1..2. Received: 0"),
        (ClusterOptions(data_service=3, data_service_on="nodes"), 2, "give 1..2. Received: 3"),
        (ClusterOptions(data_service=1, data_service_on="nodes", coordinator=True), 2, "coordinator=True"),
        (ClusterOptions(data_service=1, data_service_on="nodes", max_restarts=1), 2, "max_restarts must be 0"),
        (ClusterOptions(data_service=1, data_service_on="nodes", driver_ps_nodes=True), 2, "driver_ps_nodes"),
    ],
)
def test_options_the_nodes_cannot_serve_are_refused(options, nodes, says):
    with pytest.raises(ConfigError, match="data_service_on") as info:
        node_program(main_fun, options, nodes)
    assert says in str(info.value), str(info.value)


def test_the_first_nodes_serve_beside_map_fun_and_stop_after_it(monkeypatch):
    events = []

    class Server:
        def stop(self):
            events.append("stopped")

    monkeypatch.setattr(data_worker, "serve_beside", lambda ctx, wait: events.append(("serve", wait)) or Server())
    program = OnNodes(main_fun, 1, 5.0)
    assert program(None, SimpleNamespace(executor_id=1)) == ("ran", 1) and events == []  # not one of the first
    assert program(None, SimpleNamespace(executor_id=0)) == ("ran", 0)
    assert events == [("serve", 5.0), "stopped"]

    def fails(args, ctx):
        raise ValueError("map_fun failed")

    with pytest.raises(ValueError, match="map_fun failed"):
        OnNodes(fails, 1)(None, SimpleNamespace(executor_id=0))
    assert events[-1] == "stopped"


class FakeCluster:
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
    monkeypatch.setattr(data_service, "reserve_task", lambda host, task: reserved)
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
    plan = SimpleNamespace(sc=None, host="driver", options=options, settings=Settings(), launcher=None, num_executors=2)
    plan.start = lambda handle, target, on_end: begin(target, on_end)  # Plan.start, its handle a Cluster
    return beside.start_beside(plan), targets


def test_the_dispatcher_starts_with_the_addresses_the_nodes_reported(dispatch):
    cluster = FakeCluster([_report("worker:1", "b:2"), _report("worker:0", "a:1")])
    got, targets = _start(cluster)
    assert got is cluster and targets == ["grpc://driver:7"]
    (svc,) = dispatch.made
    assert svc.worker_addresses == ["a:1", "b:2"] and svc.stopped == 0  # no extra slots were asked for
    cluster.on_end()
    assert svc.stopped == 1 and dispatch.handover.released >= 1


def test_a_node_that_fails_before_reporting_stops_the_cluster(dispatch):
    cluster = FakeCluster([], failure=NodeFailed("worker:0 exited"))
    with pytest.raises(NodeFailed, match="worker:0 exited"):
        _start(cluster)
    assert cluster.stopped == 1 and dispatch.made == [] and dispatch.handover.released >= 1


def test_nodes_that_never_report_time_out_naming_the_numbers(dispatch):
    cluster = FakeCluster([_report("worker:0", "a:1")])
    with pytest.raises(ReservationTimeout, match="only 1 of the 2 TF nodes") as info:
        _start(cluster, timeout=0.2)
    assert (info.value.registered, info.value.required) == (1, 2) and cluster.stopped == 1
