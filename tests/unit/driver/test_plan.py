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
from tfonspark.settings import Settings
from tfonspark.testing import FakeSparkContext, LocalLauncher


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
