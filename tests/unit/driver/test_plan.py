"""driver/plan.py: the plan run() prepares, the addresses it gives tasks, and what each node is told."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from tfonspark.config import InputMode
from tfonspark.driver.cluster import Cluster
from tfonspark.driver.options import ClusterOptions
from tfonspark.driver.plan import _node_keras, prepare, task_address
from tfonspark.errors import ConfigError
from tfonspark.ports import reserve_port
from tfonspark.settings import Settings
from tfonspark.testing import FakeSparkContext, LocalLauncher

from .._port_range import free_range


def record_spec(args: dict, ctx) -> None:
    import os

    seen = {"spec": ctx.cluster_spec, "tf_config": json.loads(os.environ["TF_CONFIG"])}
    path = Path(args["dir"]) / f"{ctx.job_name}-{ctx.task_index}.json"
    path.with_suffix(".tmp").write_text(json.dumps(seen))
    path.with_suffix(".tmp").rename(path)  # whole, or not there


def test_the_chief_address_puts_ipv6_hosts_in_brackets():
    assert task_address("10.0.0.1", 5000) == "10.0.0.1:5000"
    assert task_address("fe80::1", 5000) == "[fe80::1]:5000"
    assert task_address("driver.example", 1) == "driver.example:1"


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


def test_tfonspark_run_keeps_keras_3_and_the_tfos_face_asks_for_keras_2(caplog):
    assert _node_keras("auto", tfos_face=False) == ""
    assert _node_keras("off", tfos_face=True) == ""
    with caplog.at_level(logging.INFO, logger="tfonspark.driver.plan"):
        assert _node_keras("auto", tfos_face=True) == "auto"
    [line] = [r.getMessage() for r in caplog.records]  # said in one line, with how to turn it off
    assert "Keras 2" in line and "legacyKeras=off" in line
    assert _node_keras("on", tfos_face=False) == "on"


@pytest.mark.parametrize(
    ("master", "mode", "refused"),
    [
        ("spark://master:7077", InputMode.SPARK, True),
        ("yarn", InputMode.SPARK, True),
        ("local-cluster[2,1,1024]", InputMode.SPARK, True),
        ("spark://master:7077", InputMode.TENSORFLOW, False),  # its node tasks keep their executors busy
        ("local[2]", InputMode.SPARK, False),  # no dynamic allocation in local mode
    ],
)
def test_a_fed_cluster_under_dynamic_allocation_is_refused_before_anything_starts(master, mode, refused):
    """Issue 45, item 7: Spark removes an idle executor, and a fed node's executor is idle between
    feeds, so the cluster would fail a minute in; prepare() says why at once, naming the setting."""
    sc = FakeSparkContext({"spark.master": master, "spark.dynamicAllocation.enabled": "true"})
    options = ClusterOptions(input_mode=mode)
    if not refused:
        prepare(sc, record_spec, {}, 2, options, Settings(), launcher=LocalLauncher())
        return
    with pytest.raises(ConfigError, match=r"spark\.dynamicAllocation\.enabled=false") as raised:
        prepare(sc, record_spec, {}, 2, options, Settings(), launcher=LocalLauncher())
    assert master in str(raised.value) and "executorIdleTimeout" in str(raised.value)
    sc_off = FakeSparkContext({"spark.master": master, "spark.dynamicAllocation.enabled": "false"})
    prepare(sc_off, record_spec, {}, 2, options, Settings(), launcher=LocalLauncher())


@pytest.mark.parametrize(("overhead", "warned"), [(None, True), ("2g", False)])
def test_a_container_too_small_for_a_node_is_warned_of_at_prepare_on_yarn(overhead, warned, caplog):
    """Issue 45, item 7: on YARN a TF node lives in the executor's memoryOverhead (384 MiB by
    default, ~800 MiB needed), so prepare() warns with the figure and the setting to raise."""
    conf = {"spark.master": "yarn", **({"spark.executor.memoryOverhead": overhead} if overhead else {})}
    with caplog.at_level(logging.WARNING, logger="tfonspark.driver.plan"):
        prepare(FakeSparkContext(conf), record_spec, {}, 2, ClusterOptions(), Settings(), launcher=LocalLauncher())
    said = [r.getMessage() for r in caplog.records if "memoryOverhead" in r.getMessage()]
    assert bool(said) is warned, said
    if warned:
        assert "384m (the default)" in said[0] and "800 MiB" in said[0]


# ---- the port range (issue 45, item 4) -------------------------------------------------------------


def wait_to_be_stopped(_args, _ctx) -> None:
    import time

    time.sleep(120)


def test_a_port_range_too_small_for_one_host_is_refused_before_anything_starts():
    """A fed chief with TensorBoard needs 3 ports on its host: its TF port, its feed server, TensorBoard."""
    options = ClusterOptions(input_mode=InputMode.SPARK, tensorboard=True)
    spec = free_range(2)
    with pytest.raises(ConfigError) as info:
        prepare(FakeSparkContext(), record_spec, {}, 2, options, Settings(port_range=spec), launcher=LocalLauncher())
    said = str(info.value)
    assert said.startswith(f"port_range '{spec}' holds 2 ports, but worker:0 needs 3 on its host: ")
    assert "its TF port, its feed server, TensorBoard" in said and "spark.tfonspark.portRange" in said
    plan = prepare(FakeSparkContext(), record_spec, {}, 2, options, Settings(port_range=free_range(3)))
    assert plan.ports_needed()["worker:1"] == ["its TF port", "its feed server"]
    assert plan.ports_needed("chief")["the driver"] == ["the rendezvous server", "the driver's chief task"]
    one = Settings(port_range=spec.split("-")[0], server_port=spec.split("-")[1])  # the rendezvous has its own
    with pytest.raises(
        ConfigError, match=r"holds 1 port, but the driver needs 2 on its host: the driver's chief task, ps:0's TF port"
    ):
        prepare(FakeSparkContext(), record_spec, {}, 2, ClusterOptions(num_ps=1, driver_ps_nodes=True), one).start(
            Cluster, hold="chief"
        )


def test_every_listener_of_a_cluster_on_one_host_takes_its_own_port_of_the_range():
    """Rendezvous, two nodes' TF ports and feed servers, all on this host: five ports of the range, no two alike."""
    spec = free_range(8)
    low, high = (int(p) for p in spec.split("-"))
    options = ClusterOptions(input_mode=InputMode.SPARK, reservation_timeout=60)
    cluster = prepare(
        FakeSparkContext(), wait_to_be_stopped, None, 2, options, Settings(port_range=spec), launcher=LocalLauncher()
    ).start(Cluster)
    try:
        ports = [cluster.server.address[1]]
        for info in cluster.cluster_info:
            ports.append(int(info["address"].rsplit(":", 1)[1]))
            ports.append(int(info["data_address"][1]))
    finally:
        cluster.stop(grace_secs=0)
    assert len(set(ports)) == 5 and all(low <= port <= high for port in ports), (spec, ports)


def test_a_range_whose_ports_are_all_taken_fails_the_start_naming_port_range_and_the_server():
    """Large enough on paper (the driver needs 1, a node 1), but another process holds both ports here."""
    spec = free_range(2)
    low, high = (int(p) for p in spec.split("-"))
    plan = prepare(FakeSparkContext(), record_spec, {}, 1, ClusterOptions(), Settings(port_range=spec))
    with reserve_port(low), reserve_port(high), pytest.raises(ConfigError) as info:
        plan.start(Cluster)
    said = str(info.value)
    assert said.startswith(f"the rendezvous server cannot listen on 127.0.0.1 at port(s) '{spec}'"), said
    assert "port_range (spark.tfonspark.portRange" in said
