"""The driver's checks of Spark's settings: the container memory a TF node needs on YARN and Kubernetes."""

from __future__ import annotations

import pytest

from tfonspark.driver.jobs import NODE_MEMORY_MIB, memory_overhead_warning


@pytest.mark.parametrize(
    "conf, spare, warned",
    [
        ({}, False, True),  # the default: max(384 MiB, 10% of a 1 GiB heap)
        ({"spark.executor.memory": "8g"}, False, False),  # 819 MiB by the factor
        ({"spark.executor.memory": "8g"}, True, True),  # ... but a spare needs 700 MiB more
        ({"spark.executor.memoryOverhead": "2g"}, True, False),
        ({"spark.executor.memoryOverhead": "512"}, False, True),  # plain numbers are MiB
        ({"spark.executor.memoryOverhead": "512m", "spark.executor.pyspark.memory": "512m"}, False, False),
        ({"spark.executor.memory": "4g", "spark.executor.memoryOverheadFactor": "0.4"}, False, False),
    ],
)
def test_a_container_too_small_for_a_tf_node_is_warned_of_on_yarn_and_kubernetes(conf, spare, warned):
    for master in ("yarn", "k8s://https://api:6443"):
        text = memory_overhead_warning(conf, master, spare)
        assert bool(text) is warned, (conf, spare, text)
        if warned:
            assert "spark.executor.memoryOverhead" in text and f"{NODE_MEMORY_MIB} MiB" in text and master in text


def test_masters_without_container_limits_are_never_warned_of():
    for master in ("local[2]", "local-cluster[2,1,1024]", "spark://m:7077"):
        assert memory_overhead_warning({}, master, True) == ""


def test_the_warning_names_the_default_and_the_fix():
    text = memory_overhead_warning({}, "yarn", False)
    assert "384m (the default)" in text and "--conf spark.executor.memoryOverhead=1g" in text
