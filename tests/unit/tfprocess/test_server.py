"""tfprocess/server.py: the programs of a parameter-server cluster's nodes: the chief as coordinator,
the servers, the evaluator; and start_cluster_server.

The chief runs ``map_fun`` as ``ParameterServerStrategy``'s coordinator; every other node only
serves and is stopped once the chief is done. ``tests/integration/test_ps_coordinator.py`` trains
on real Spark.
"""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import pytest
from pyspark import cloudpickle

import tfonspark
from tfonspark.distribute import sidecar
from tfonspark.errors import (
    ReservationTimeout,
)
from tfonspark.tfprocess import server
from tfonspark.tfprocess import server as server_module
from tfonspark.tfprocess.context import NodeContext
from tfonspark.tfprocess.server import ChiefCoordinator, ServeBesideEvaluator, coordinator_spec


class _Ctx:
    """What :class:`ChiefCoordinator` reads of a node's context."""

    def __init__(self, job_name: str, spec: dict[str, list[str]]) -> None:
        self.job_name, self.task_index, self.cluster_spec = job_name, 0, spec

    def release_port(self) -> None:
        pass


def _map_fun(args, ctx):
    return ("coordinated", args, ctx.job_name)


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


class _EvaluatorCtx:
    def __init__(self, job_name: str, spec: dict[str, list[str]]) -> None:
        self.job_name, self.task_index, self.cluster_spec = job_name, 0, spec

    def release_port(self) -> None:
        pass


def _spec_map_fun(args, ctx):
    return (args, ctx.job_name, dict(ctx.cluster_spec))


@pytest.fixture
def stops(monkeypatch):
    """``stop_on_sigterm`` calls, without changing this process's SIGTERM handler."""
    calls: list[bool] = []
    monkeypatch.setattr(sidecar, "stop_on_sigterm", lambda: calls.append(True) or True)
    return calls


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
        program = cloudpickle.loads(cloudpickle.dumps(ChiefCoordinator(_spec_map_fun, timeout=5)))
        args, job, seen = program({"a": 1}, _EvaluatorCtx("chief", dict(spec)))
    assert (args, job) == ({"a": 1}, "chief")
    assert sorted(seen) == ["chief", "ps", "worker"]
    import os

    tf_config = json.loads(os.environ["TF_CONFIG"])
    assert sorted(tf_config["cluster"]) == ["chief", "ps", "worker"] and tf_config["task"]["type"] == "chief"


def test_the_evaluator_runs_map_fun_with_sigterm_as_a_stop_request(stops, monkeypatch):
    monkeypatch.setattr(server, "serve", lambda *_: pytest.fail("the evaluator must not serve"))
    spec = {"chief": ["a:1"], "evaluator": ["c:1"], "ps": ["b:1"], "worker": ["d:1"]}
    program = cloudpickle.loads(cloudpickle.dumps(ChiefCoordinator(_spec_map_fun, timeout=5)))
    args, job, seen = program(7, _EvaluatorCtx("evaluator", dict(spec)))
    assert (args, job, seen) == (7, "evaluator", spec)  # its own spec is whole: TF allows that
    assert stops == [True]


def test_ps_cluster_program_runs_the_evaluator_fn_there_and_serves_elsewhere(stops, monkeypatch):
    served: list[str] = []
    monkeypatch.setattr(server, "serve", lambda _args, ctx: served.append(ctx.job_name))
    program = cloudpickle.loads(cloudpickle.dumps(ServeBesideEvaluator(_spec_map_fun)))
    assert program(None, _EvaluatorCtx("evaluator", {"evaluator": ["c:1"]}))[1] == "evaluator"
    program(None, _EvaluatorCtx("worker", {}))
    program(None, _EvaluatorCtx("ps", {}))
    assert served == ["worker", "ps"] and stops == [True]


SPEC = {"ps": ["h:0"], "chief": ["h:1"], "evaluator": ["h:2"], "worker": ["h:3", "h:4", "h:5"]}


def make_ctx(job_name: str = "worker", task_index: int = 0, cluster_spec=None, **kwargs) -> NodeContext:
    return NodeContext(
        executor_id=kwargs.pop("executor_id", 4),
        job_name=job_name,
        task_index=task_index,
        cluster_spec=SPEC if cluster_spec is None else cluster_spec,
        default_fs=kwargs.pop("default_fs", "hdfs://nn:8020"),
        working_dir=kwargs.pop("working_dir", "/home/me"),
        **kwargs,
    )


def test_start_cluster_server_releases_the_port_and_starts_tf_server(monkeypatch):
    calls = []
    fake_tf = SimpleNamespace(
        train=SimpleNamespace(ClusterSpec=lambda spec: ("spec", spec)),
        distribute=SimpleNamespace(Server=lambda cluster, **kw: calls.append((cluster, kw)) or "server"),
    )
    monkeypatch.setitem(__import__("sys").modules, "tensorflow", fake_tf)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    ctx = make_ctx("worker", 2, tmp_socket=sock)
    assert ctx.start_cluster_server(rdma=True) == (("spec", SPEC), "server")
    assert sock.fileno() == -1
    assert calls == [(("spec", SPEC), {"job_name": "worker", "task_index": 2, "protocol": "grpc+verbs"})]
    assert tfonspark.TFNode.start_cluster_server is server_module.start_cluster_server
