"""distribute/tf_config.py: TF_CONFIG built from a cluster spec and read back, checked against TensorFlow's resolver."""

from __future__ import annotations

import json
import os

import pytest

from tfonspark.distribute.tf_config import build_tf_config, task_info
from tfonspark.driver.nodes.roles import (
    build_cluster_spec,
    plan_roles,
)
from tfonspark.errors import ConfigError

SPEC = {"ps": ["h0:2222"], "chief": ["h1:2222"], "evaluator": ["h2:2222"], "worker": ["h3:2222", "h4:2222"]}


def test_tf_config_json():
    config = json.loads(build_tf_config(SPEC, "worker", 1))
    assert config == {"cluster": SPEC, "task": {"type": "worker", "index": 1}, "environment": "cloud"}


@pytest.mark.parametrize(("job", "index"), [("worker", 2), ("worker", -1), ("master", 0), ("ps", 1)])
def test_tf_config_for_a_task_outside_the_spec(job, index):
    with pytest.raises(ConfigError, match=rf"task {job}:{index} is not in the cluster spec"):
        build_tf_config(SPEC, job, index)


def test_tf_config_reads_back_what_it_writes():
    roles = plan_roles(4, master_node="chief", eval_node=True)  # the roles MultiWorkerMirroredStrategy takes
    spec = build_cluster_spec(roles, {r.executor_id: f"h{r.executor_id}:2222" for r in roles})
    for role in roles:
        info = task_info(build_tf_config(spec, role.job_name, role.task_index))
        assert (info.task_type, info.task_id) == (role.job_name, role.task_index)
        assert info.is_chief == (role.job_name == "chief")
        assert info.cluster == {job: tuple(hosts) for job, hosts in spec.items()}


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


@pytest.mark.parametrize(("job", "index"), [("ps", 0), ("chief", 0), ("evaluator", 0), ("worker", 0), ("worker", 1)])
def test_tf_config_resolves_with_tensorflow(tf, job, index):
    os.environ["TF_CONFIG"] = build_tf_config(SPEC, job, index)  # the autouse fixture restores it
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    assert resolver.cluster_spec().as_dict() == SPEC
    assert resolver.task_type == job
    assert resolver.task_id == index
