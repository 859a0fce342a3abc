"""Which masters run their executors on this machine (where spark_conf's pinning holds)."""

from __future__ import annotations

import pytest

from tfonspark.testing import embedded


@pytest.mark.parametrize(
    "master",
    [
        "local",
        "local[2]",
        "local[*]",
        "local-cluster[2,1,1024]",
        "standalone:2",
        "spark://127.0.0.1:7077",
        "spark://localhost:7077",
    ],
)
def test_masters_of_this_machine_are_embedded(master):
    assert embedded(master)


@pytest.mark.parametrize(
    "master",
    ["spark://10.236.0.11:7077", "spark://m1:7077,127.0.0.1:7077", "yarn", "k8s://https://k:6443", "mesos://m"],
)
def test_other_machines_masters_are_not(master):
    assert not embedded(master)
