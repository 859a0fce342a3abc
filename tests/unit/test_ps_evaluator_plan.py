"""The evaluator of a parameter-server cluster: its role, the program it runs, the chief's spec.

``run(..., coordinator=True, eval_node=True)`` runs ``map_fun`` on the chief and on the
evaluator; ``ps_cluster(..., evaluator=fn)`` runs ``fn`` on the evaluator. The evaluator runs no
TF server, so TF's coordinator must not see it in its cluster spec.
``tests/integration/test_ps_coordinator.py`` runs one on real Spark.
"""

from __future__ import annotations

import json
import socket

import pytest
from pyspark import cloudpickle

import tfonspark
from tfonspark.distribute import sidecar
from tfonspark.driver.nodes.rendezvous import NodeState
from tfonspark.driver.nodes.roles import plan_roles
from tfonspark.driver.nodes.sidecars import EVALUATOR_GRACE_SECS, finish_evaluators
from tfonspark.errors import ConfigError
from tfonspark.testing import FakeSparkContext
from tfonspark.tfprocess import server
from tfonspark.tfprocess.server import ChiefCoordinator, ServeBesideEvaluator, coordinator_spec
from tfonspark.wire.messages import NodeExit


class _Ctx:
    def __init__(self, job_name: str, spec: dict[str, list[str]]) -> None:
        self.job_name, self.task_index, self.cluster_spec = job_name, 0, spec

    def release_port(self) -> None:
        pass


def _map_fun(args, ctx):
    return (args, ctx.job_name, dict(ctx.cluster_spec))


@pytest.fixture
def stops(monkeypatch):
    """``stop_on_sigterm`` calls, without changing this process's SIGTERM handler."""
    calls: list[bool] = []
    monkeypatch.setattr(sidecar, "stop_on_sigterm", lambda: calls.append(True) or True)
    return calls


def test_the_evaluator_runs_map_fun_beside_servers_and_is_not_waited_for():
    roles = plan_roles(5, num_ps=1, eval_node=True, coordinator=True)
    assert [(r.name, r.serves, r.trains) for r in roles] == [
        ("ps:0", True, False),
        ("chief:0", False, True),
        ("evaluator:0", False, False),  # runs map_fun; stopped with the ps once the chief is done
        ("worker:0", True, False),
        ("worker:1", True, False),
    ]
    assert [r.name for r in plan_roles(4, num_ps=1, eval_node=True, coordinator=True)] == [
        "ps:0",
        "chief:0",
        "evaluator:0",
        "worker:0",
    ]


def test_an_evaluator_needs_one_executor_more():
    with pytest.raises(ConfigError, match=r"num_executors >= num_ps \+ 3 with eval_node") as info:
        plan_roles(3, num_ps=1, eval_node=True, coordinator=True)
    assert "eval_node=True" in str(info.value)


def test_coordinator_spec_leaves_out_the_evaluator_only():
    spec = {"chief": ["a:1"], "ps": ["b:1"], "evaluator": ["c:1"], "worker": ["d:1"]}
    assert coordinator_spec(spec) == {"chief": ["a:1"], "ps": ["b:1"], "worker": ["d:1"]}
    assert coordinator_spec({"ps": ["b:1"]}) == {"ps": ["b:1"]}


def test_the_chief_sees_no_evaluator_in_its_spec_or_tf_config(monkeypatch):
    with socket.create_server(("127.0.0.1", 0)) as ps, socket.create_server(("127.0.0.1", 0)) as worker:
        spec = {
            "chief": ["127.0.0.1:1"],
            "evaluator": ["127.0.0.1:2"],  # runs no server: neither waited for nor seen
            "ps": [f"127.0.0.1:{ps.getsockname()[1]}"],
            "worker": [f"127.0.0.1:{worker.getsockname()[1]}"],
        }
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": spec, "task": {"type": "chief", "index": 0}}))
        program = cloudpickle.loads(cloudpickle.dumps(ChiefCoordinator(_map_fun, timeout=5)))
        args, job, seen = program({"a": 1}, _Ctx("chief", dict(spec)))
    assert (args, job) == ({"a": 1}, "chief")
    assert sorted(seen) == ["chief", "ps", "worker"]
    import os

    tf_config = json.loads(os.environ["TF_CONFIG"])
    assert sorted(tf_config["cluster"]) == ["chief", "ps", "worker"] and tf_config["task"]["type"] == "chief"


def test_the_evaluator_runs_map_fun_with_sigterm_as_a_stop_request(stops, monkeypatch):
    monkeypatch.setattr(server, "serve", lambda *_: pytest.fail("the evaluator must not serve"))
    spec = {"chief": ["a:1"], "evaluator": ["c:1"], "ps": ["b:1"], "worker": ["d:1"]}
    program = cloudpickle.loads(cloudpickle.dumps(ChiefCoordinator(_map_fun, timeout=5)))
    args, job, seen = program(7, _Ctx("evaluator", dict(spec)))
    assert (args, job, seen) == (7, "evaluator", spec)  # its own spec is whole: TF allows that
    assert stops == [True]


def test_ps_cluster_program_runs_the_evaluator_fn_there_and_serves_elsewhere(stops, monkeypatch):
    served: list[str] = []
    monkeypatch.setattr(server, "serve", lambda _args, ctx: served.append(ctx.job_name))
    program = cloudpickle.loads(cloudpickle.dumps(ServeBesideEvaluator(_map_fun)))
    assert program(None, _Ctx("evaluator", {"evaluator": ["c:1"]}))[1] == "evaluator"
    program(None, _Ctx("worker", {}))
    program(None, _Ctx("ps", {}))
    assert served == ["worker", "ps"] and stops == [True]


def test_ps_cluster_refuses_an_evaluator_that_is_not_callable():
    with pytest.raises(ConfigError, match="evaluator must be callable"):
        tfonspark.ps_cluster(FakeSparkContext(), num_workers=1, num_ps=1, evaluator="eval.py")


class _Server:
    """What :func:`finish_evaluators` uses of the control plane: its nodes, Stop, and waiting."""

    def __init__(self, nodes, exit_code=0) -> None:
        self.table = list(nodes)
        self.stopped: list[tuple[str, float]] = []
        self.exit_code = exit_code

    def nodes(self):
        return list(self.table)

    def stop_node(self, node, grace_secs) -> None:
        self.stopped.append((node.role.name, grace_secs))
        node.exit = NodeExit(node.role.executor_id, self.exit_code, stopped=True)  # its supervisor's answer

    def wait_for(self, predicate, timeout, until_failure=True) -> bool:
        assert timeout > 0 and until_failure is False
        return bool(predicate(self.table))


def _nodes():
    return [
        NodeState(role, address=f"h:{role.executor_id}") for role in plan_roles(4, 1, eval_node=True, coordinator=True)
    ]


def test_the_evaluator_is_stopped_first_with_a_longer_grace_and_waited_for():
    server = _Server(_nodes())
    finish_evaluators(server, grace_secs=0)
    assert server.stopped == [("evaluator:0", EVALUATOR_GRACE_SECS)]  # only it; the rest go at teardown
    finish_evaluators(server, grace_secs=30)  # it has exited: nothing to do
    assert len(server.stopped) == 1


def test_an_evaluator_killed_at_its_stop_is_logged(caplog):
    server = _Server(_nodes(), exit_code=-9)
    finish_evaluators(server, grace_secs=60)
    assert server.stopped == [("evaluator:0", 60)]
    assert "evaluator:0 exited with code -9" in caplog.text and "grace_secs" in caplog.text


def test_without_an_evaluator_nothing_is_stopped():
    server = _Server([NodeState(role, address="h:1") for role in plan_roles(3, 1, coordinator=True)])
    finish_evaluators(server, grace_secs=0)
    assert server.stopped == []
