"""``run(..., coordinator=True)``: the role plan, the checks, and the program every node runs.

The chief runs ``map_fun`` as ``ParameterServerStrategy``'s coordinator; every other node only
serves and is stopped once the chief is done. ``tests/integration/test_ps_coordinator.py`` trains
on real Spark.
"""

from __future__ import annotations

import socket

import pytest
from pyspark import cloudpickle

import tfonspark
from tfonspark.config import InputMode
from tfonspark.driver.nodes.roles import plan_roles
from tfonspark.driver.options import ClusterOptions, split_options
from tfonspark.errors import ConfigError, ReservationTimeout
from tfonspark.testing import FakeSparkContext
from tfonspark.tfprocess import server
from tfonspark.tfprocess.server import ChiefCoordinator


class _Ctx:
    """What :class:`ChiefCoordinator` reads of a node's context."""

    def __init__(self, job_name: str, spec: dict[str, list[str]]) -> None:
        self.job_name, self.task_index, self.cluster_spec = job_name, 0, spec

    def release_port(self) -> None:
        pass


def _map_fun(args, ctx):
    return ("coordinated", args, ctx.job_name)


def test_the_chief_coordinates_and_every_other_node_serves():
    roles = plan_roles(5, num_ps=2, coordinator=True)
    assert [(r.job_name, r.task_index, r.serves) for r in roles] == [
        ("ps", 0, True),
        ("ps", 1, True),
        ("chief", 0, False),
        ("worker", 0, True),
        ("worker", 1, True),
    ]
    assert [r.name for r in roles if r.trains] == ["chief:0"]  # the only node shutdown() waits for


def test_without_coordinator_every_chief_and_worker_trains():
    roles = plan_roles(4, num_ps=1, master_node="chief")
    assert [r.name for r in roles if r.trains] == ["chief:0", "worker:0", "worker:1"]
    assert not any(r.serves for r in roles)


def test_coordinator_names_its_chief_chief_and_keeps_driver_ps_nodes():
    roles = plan_roles(3, num_ps=1, master_node="chief", driver_ps_nodes=True, coordinator=True)
    assert [(r.name, r.on_driver) for r in roles] == [("ps:0", True), ("chief:0", False), ("worker:0", False)]


@pytest.mark.parametrize(
    ("num_executors", "num_ps", "keywords", "says"),
    [
        (3, 0, {}, "num_ps >= 1"),
        (2, 1, {}, "num_executors >= num_ps + 2"),
        (3, 1, {"master_node": "master"}, "master_node='master'"),
        (3, 1, {"eval_node": True}, "num_ps + 3 with eval_node"),
    ],
)
def test_a_coordinator_cluster_needs_a_ps_a_chief_and_a_worker(num_executors, num_ps, keywords, says):
    with pytest.raises(ConfigError, match="coordinator=True") as info:
        plan_roles(num_executors, num_ps, coordinator=True, **keywords)
    assert says in str(info.value)


def test_run_refuses_coordinator_without_ps_naming_both():
    with pytest.raises(ConfigError) as info:
        tfonspark.run(FakeSparkContext(), _map_fun, None, 3, coordinator=True)
    assert "coordinator=True" in str(info.value) and "num_ps=0" in str(info.value)


def test_run_refuses_coordinator_in_spark_input_mode():
    with pytest.raises(ConfigError, match="coordinator=True runs map_fun on the chief only") as info:
        tfonspark.run(FakeSparkContext(), _map_fun, None, 3, num_ps=1, coordinator=True, input_mode=InputMode.SPARK)
    assert "InputMode.TENSORFLOW" in str(info.value)


def test_coordinator_is_an_option_of_run_not_a_setting():
    options, by_name = split_options({"num_ps": 1, "coordinator": True, "heartbeat_timeout": 30})
    assert (options.coordinator, options.num_ps, by_name) == (True, 1, {"heartbeat_timeout": 30})
    assert ClusterOptions().coordinator is False


def test_the_chief_runs_map_fun_once_every_server_listens():
    with socket.create_server(("127.0.0.1", 0)) as ps, socket.create_server(("127.0.0.1", 0)) as worker:
        spec = {
            "chief": ["127.0.0.1:1"],  # its own address: not waited for
            "ps": [f"127.0.0.1:{ps.getsockname()[1]}"],
            "worker": [f"127.0.0.1:{worker.getsockname()[1]}"],
        }
        program = cloudpickle.loads(cloudpickle.dumps(ChiefCoordinator(_map_fun, timeout=5)))
        assert program({"a": 1}, _Ctx("chief", spec)) == ("coordinated", {"a": 1}, "chief")


def test_the_chief_names_the_servers_that_never_listen():
    from tfonspark.ports import reserve_port

    with reserve_port() as held:  # bound, never listening
        spec = {"chief": ["127.0.0.1:1"], "ps": [f"127.0.0.1:{held.getsockname()[1]}"], "worker": []}
        with pytest.raises(ReservationTimeout, match="ps:0 did not accept"):
            ChiefCoordinator(_map_fun, timeout=0.3)(None, _Ctx("chief", spec))


@pytest.mark.parametrize("job", ["worker", "ps"])
def test_workers_and_ps_serve_without_user_code(monkeypatch, job):
    served = []
    monkeypatch.setattr(server, "serve", lambda args, ctx: served.append((args, ctx.job_name)))
    ChiefCoordinator(_map_fun, timeout=5)("args", _Ctx(job, {}))
    assert served == [("args", job)]
