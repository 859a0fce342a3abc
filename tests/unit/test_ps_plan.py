"""``ps_cluster``'s plan: the driver's ``chief`` task in every node's cluster spec, and its checks.

The node processes here are real (``LocalLauncher``) but run a TF-free ``map_fun`` that records
what each node was told; ``tests/integration/test_ps_cluster.py`` trains on real Spark.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

import tfonspark
from tfonspark.driver.cluster import Cluster
from tfonspark.driver.nodes.roles import build_cluster_spec, plan_roles
from tfonspark.driver.options import ClusterOptions
from tfonspark.driver.plan import prepare, task_address
from tfonspark.driver.services.ps import servers_accepting
from tfonspark.errors import ConfigError
from tfonspark.settings import Settings
from tfonspark.testing import FakeSparkContext, LocalLauncher


def record_spec(args: dict, ctx) -> None:
    import os

    seen = {"spec": ctx.cluster_spec, "tf_config": json.loads(os.environ["TF_CONFIG"])}
    path = Path(args["dir"]) / f"{ctx.job_name}-{ctx.task_index}.json"
    path.with_suffix(".tmp").write_text(json.dumps(seen))
    path.with_suffix(".tmp").rename(path)  # whole, or not there


def test_the_fixed_chief_joins_the_spec_of_the_nodes_roles():
    roles = plan_roles(3, num_ps=1)
    addresses = {0: "10.0.0.2:2222", 1: "10.0.0.3:2222", 2: "10.0.0.4:2222"}
    spec = build_cluster_spec(roles, addresses, {"chief": ["10.0.0.1:5000"]})
    assert spec == {"chief": ["10.0.0.1:5000"], "ps": ["10.0.0.2:2222"], "worker": ["10.0.0.3:2222", "10.0.0.4:2222"]}
    assert build_cluster_spec(roles, addresses) == {k: v for k, v in spec.items() if k != "chief"}


def test_a_fixed_job_that_nodes_also_run_is_refused():
    with pytest.raises(ConfigError, match="both run by nodes and fixed"):
        build_cluster_spec(plan_roles(2, num_ps=1), {0: "a:1", 1: "b:1"}, {"worker": ["c:1"]})


def test_the_chief_address_puts_ipv6_hosts_in_brackets():
    assert task_address("10.0.0.1", 5000) == "10.0.0.1:5000"
    assert task_address("fe80::1", 5000) == "[fe80::1]:5000"
    assert task_address("driver.example", 1) == "driver.example:1"


@pytest.mark.parametrize(("workers", "ps"), [(0, 1), (2, 0), (-1, 1), (True, 1)])
def test_ps_cluster_needs_a_worker_and_a_ps(workers, ps):
    with pytest.raises(ConfigError, match="ps_cluster needs"):
        tfonspark.ps_cluster(FakeSparkContext(), num_workers=workers, num_ps=ps)


def test_servers_accepting_tells_a_listening_port_from_a_reserved_one():
    from tfonspark.ports import reserve_port

    with socket.create_server(("127.0.0.1", 0)) as listening, reserve_port() as reserved:
        spec = {
            "chief": ["127.0.0.1:1"],  # not probed: the driver's own task
            "ps": [f"127.0.0.1:{listening.getsockname()[1]}"],
            "worker": [f"127.0.0.1:{reserved.getsockname()[1]}"],
        }
        assert servers_accepting(spec) == {"ps:0": True, "worker:0": False}


def test_every_node_is_told_the_drivers_chief_in_its_spec_and_tf_config(tmp_path):
    plan = prepare(
        FakeSparkContext(),
        record_spec,
        {"dir": str(tmp_path)},
        3,
        ClusterOptions(num_ps=1, reservation_timeout=60),
        Settings(),
        launcher=LocalLauncher(),
    )
    held = []  # the chief's port, reserved by the start: what the handle is given
    cluster = plan.start(lambda running: held.append(running.held) or Cluster(running), hold="chief")
    chief = held[0].address
    assert held[0].task == "chief" and chief == task_address(plan.host, held[0].handover.port)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("*.json"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)  # the nodes write their file as map_fun starts; stop() does not wait for it
    cluster.stop(grace_secs=5)
    seen = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(seen) == ["ps-0", "worker-0", "worker-1"]
    spec = cluster.server.cluster_spec
    assert spec is not None and spec["chief"] == [chief] and len(spec["worker"]) == 2 and len(spec["ps"]) == 1
    for name, got in seen.items():
        assert got["spec"] == spec, name
        assert got["tf_config"]["cluster"] == spec, name
        job, index = name.split("-")
        assert got["tf_config"]["task"] == {"type": job, "index": int(index)}
    assert {i["job_name"] for i in cluster.cluster_info} == {"ps", "worker"}  # no node runs the chief
    held[0].release()
