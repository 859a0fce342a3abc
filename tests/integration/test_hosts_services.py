"""tfonspark's services across hosts (issue 45, item 2): MWMS ``keras.fit`` and GPUs per host on the
multi-host Spark cluster in network namespaces the multi-host tests share (``hosts_fixture.py``;
``hosts_driver.py`` runs on the driver host). ``ps_cluster`` with its coordinator and the tf.data
service with its dispatcher on the driver host are checked in test_port_range.py, in the same
driver program as their ports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from .hosts_fixture import GPUS_PER_HOST

pytestmark = [pytest.mark.hosts, pytest.mark.spark]

DRIVER = Path(__file__).with_name("hosts_driver.py")


def test_keras_fit_under_mwms_trains_a_conv2d_model_across_hosts_on_uneven_input(hosts, tmp_path):
    """Two nodes on two hosts all-reduce over TF's gRPC across the bridge; worker 0 runs out of
    data 4 steps before worker 1 (tfonspark.keras.fit's uneven input). TensorBoard's URL and every
    address in TF_CONFIG are the hosts' own."""
    master = f"spark://{hosts.master.address}:7077"
    done = hosts.run(hosts.driver, [sys.executable, str(DRIVER), "mwms", master, str(tmp_path), "3"], timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    driver = json.loads((tmp_path / "driver.json").read_text())
    nodes = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("node-*.json"))]
    print(f"MWMS keras.fit across {[n['host'] for n in nodes]}: {driver['fit_s']:.1f}s, TB {driver['tensorboard_url']}")
    assert len({n["host"] for n in nodes}) == 2, "the two nodes should run on two hosts"
    assert all(n["global_rows"] == [(3 + 7) * 16] for n in nodes)  # every row of both workers, once
    assert all(np.isfinite(n["loss"]).all() for n in nodes)
    own = {h.address for h in hosts.all}
    for node in nodes:
        addresses = [a for tasks in node["tf_config"]["cluster"].values() for a in tasks]
        assert {a.rsplit(":", 1)[0] for a in addresses} <= own, addresses
    url = driver["tensorboard_url"]
    assert url and url.split("//", 1)[1].rsplit(":", 1)[0] in {h.address for h in hosts.workers}, url


def test_each_node_gets_the_gpus_spark_gave_its_executor_on_its_own_host(hosts, tmp_path):
    """Every worker host's discovery script reports two fake GPUs that name the host (h2: 20, 21).
    One node per host, each executor asking Spark for one GPU: each node's ``CUDA_VISIBLE_DEVICES``
    and ``ctx.gpus`` are one of its own host's, and the driver's node table says the same."""
    master = f"spark://{hosts.master.address}:7077"
    done = hosts.run(hosts.driver, [sys.executable, str(DRIVER), "gpus", master, str(tmp_path), "3"], timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    driver = json.loads((tmp_path / "driver.json").read_text())
    nodes = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("node-*.json"))]
    print(f"GPUs per host: {[(n['host'], n['cuda']) for n in nodes]}; node table {driver['cluster_info']}")
    assert sorted(n["host"] for n in nodes) == sorted(h.name for h in hosts.workers), nodes  # one node per host
    for index, node in enumerate(nodes):
        number = node["host"].rsplit("-h", 1)[1]
        own = {f"{number}{i}" for i in range(GPUS_PER_HOST)}  # what this host's script reported
        assert node["cuda"] in own and node["ctx"] == [node["cuda"]], node
        table = next(i for i in driver["cluster_info"] if i["node"] == f"worker:{index}")
        assert table["gpus"] == node["ctx"], (table, node)
