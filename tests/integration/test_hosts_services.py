"""tfonspark's services across hosts (issue 45, item 2): MWMS ``keras.fit``, ``ps_cluster`` and the
tf.data service on a multi-host Spark cluster in network namespaces (``hosts_driver.py`` runs on
the driver host). A module of its own, with its own hosts, so that it runs beside test_hosts.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from .hosts_fixture import multi_host

pytestmark = [pytest.mark.hosts, pytest.mark.spark]

DRIVER = Path(__file__).with_name("hosts_driver.py")
PREFIX, SUBNET = "tfosv", "10.238.0"  # no other test module's


@pytest.fixture(scope="module")
def hosts():
    yield from multi_host(PREFIX, SUBNET)


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


def test_ps_cluster_and_the_data_service_serve_a_driver_on_its_own_host(hosts, tmp_path):
    """The coordinator (ps_cluster's chief) and the tf.data dispatcher run in the driver program,
    on the driver host; the ps, workers and data workers on the worker hosts. Every address is
    the hosts' own, training converges and every element is read once."""
    master = f"spark://{hosts.master.address}:7077"
    done = hosts.run(hosts.driver, [sys.executable, str(DRIVER), "services", master, str(tmp_path), "3"], timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads((tmp_path / "driver.json").read_text())
    spec, workers = out["ps_spec"], {h.address for h in hosts.workers}
    print(f"ps_cluster {spec}: loss {out['losses'][0]:.3f} -> {out['losses'][-1]:.4f}; data service {out}"[:600])
    assert [a.rsplit(":", 1)[0] for a in spec["chief"]] == [hosts.driver.address]
    assert {a.rsplit(":", 1)[0] for role in ("ps", "worker") for a in spec[role]} <= workers
    assert out["steps"] == 50 and out["losses"][-1] < out["losses"][0] / 4
    assert out["dispatcher"].removeprefix("grpc://").rsplit(":", 1)[0] == hosts.driver.address
    assert len(out["data_workers"]) == 2 and {a.rsplit(":", 1)[0] for a in out["data_workers"]} <= workers
    assert out["elements"] == list(range(2000))
