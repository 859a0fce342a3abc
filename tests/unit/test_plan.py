"""Role planning, cluster specs and TF_CONFIG: pure functions, checked against TensorFlow's resolver."""

from __future__ import annotations

import json
import os

import pytest

from tfonspark.distribute.tf_config import build_tf_config, task_info
from tfonspark.driver.nodes.roles import (
    CHIEF_ROLES,
    DATA_ROLES,
    SERVICE_ROLES,
    NodeRole,
    build_cluster_spec,
    plan_roles,
)
from tfonspark.errors import ConfigError


def jobs(roles: list[NodeRole]) -> list[tuple[int, str, int]]:
    return [(r.executor_id, r.job_name, r.task_index) for r in roles]


# ---- plan_roles --------------------------------------------------------------------------------


def test_workers_only():
    assert jobs(plan_roles(3)) == [(0, "worker", 0), (1, "worker", 1), (2, "worker", 2)]


def test_tfos_role_order_ps_then_chief_then_evaluator_then_workers():
    roles = plan_roles(7, num_ps=2, master_node="chief", eval_node=True)
    assert jobs(roles) == [
        (0, "ps", 0),
        (1, "ps", 1),
        (2, "chief", 0),
        (3, "evaluator", 0),
        (4, "worker", 0),
        (5, "worker", 1),
        (6, "worker", 2),
    ]
    assert not any(r.on_driver for r in roles)


def test_master_node_may_be_called_master():
    assert jobs(plan_roles(3, num_ps=1, master_node="master")) == [(0, "ps", 0), (1, "master", 0), (2, "worker", 0)]


def test_evaluator_without_chief():
    assert jobs(plan_roles(3, eval_node=True)) == [(0, "evaluator", 0), (1, "worker", 0), (2, "worker", 1)]


def test_smallest_plans():
    assert jobs(plan_roles(1)) == [(0, "worker", 0)]
    assert jobs(plan_roles(1, master_node="chief")) == [(0, "chief", 0)]
    assert jobs(plan_roles(2, num_ps=1)) == [(0, "ps", 0), (1, "worker", 0)]


def test_driver_ps_nodes_marks_only_ps():
    roles = plan_roles(4, num_ps=2, master_node="chief", driver_ps_nodes=True)
    assert [r.on_driver for r in roles] == [True, True, False, False]
    assert [r.job_name for r in roles if r.on_driver] == ["ps", "ps"]
    assert not any(r.on_driver for r in plan_roles(4, num_ps=2, driver_ps_nodes=False))


def test_task_indices_are_dense_per_job():
    roles = plan_roles(50, num_ps=3, master_node="chief", eval_node=True)
    by_job: dict[str, list[int]] = {}
    for r in roles:
        by_job.setdefault(r.job_name, []).append(r.task_index)
    assert by_job == {"ps": [0, 1, 2], "chief": [0], "evaluator": [0], "worker": list(range(45))}
    assert [r.executor_id for r in roles] == list(range(50))


def test_node_role_name_and_immutability():
    role = NodeRole(3, "worker", 2)
    assert role.name == "worker:2"
    with pytest.raises(AttributeError):
        role.job_name = "ps"  # type: ignore[misc]


def test_role_groups():
    assert set(CHIEF_ROLES) <= set(DATA_ROLES)
    assert "worker" in DATA_ROLES and not set(DATA_ROLES) & set(SERVICE_ROLES)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"num_executors": 0}, r"num_executors must be a positive integer. Received: 0"),
        ({"num_executors": -2}, r"num_executors .* Received: -2"),
        ({"num_executors": 2.0}, r"num_executors .* Received: 2.0"),
        ({"num_executors": "4"}, r"num_executors .* Received: '4'"),
        ({"num_executors": None}, r"num_executors .* Received: None"),
        ({"num_executors": 2, "num_ps": -1}, r"num_ps must be a non-negative integer. Received: -1"),
        ({"num_executors": 2, "num_ps": 0.5}, r"num_ps .* Received: 0.5"),
        ({"num_executors": 2, "master_node": "boss"}, r"master_node must be one of .*chief.*master.* Received: 'boss'"),
        ({"num_executors": 2, "master_node": "worker"}, r"Received: 'worker'"),
        ({"num_executors": 2, "num_ps": 2}, r"no executor left for a chief or worker: num_executors=2, num_ps=2"),
        ({"num_executors": 3, "num_ps": 2, "eval_node": True}, r"num_ps=2, eval_node=True; raise num_executors"),
        ({"num_executors": 1, "eval_node": True}, r"no executor left"),
    ],
)
def test_invalid_plans_are_config_errors_that_say_what_was_received(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        plan_roles(**kwargs)


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        plan_roles(0)


# ---- build_cluster_spec ---------------------------------------------------------------------------


def test_cluster_spec_is_ordered_by_task_index_not_by_registration():
    roles = plan_roles(5, num_ps=1, master_node="chief")
    addresses = {4: "h4:4", 0: "h0:0", 3: "h3:3", 1: "h1:1", 2: "h2:2"}
    assert build_cluster_spec(list(reversed(roles)), addresses) == {
        "chief": ["h1:1"],
        "ps": ["h0:0"],
        "worker": ["h2:2", "h3:3", "h4:4"],
    }


def test_cluster_spec_follows_task_index_even_when_executor_ids_do_not():
    roles = [NodeRole(0, "worker", 1), NodeRole(1, "worker", 0)]
    assert build_cluster_spec(roles, {0: "a:1", 1: "b:2"}) == {"worker": ["b:2", "a:1"]}


def test_cluster_spec_missing_address():
    with pytest.raises(ConfigError, match=r"no address registered for executor ids \[1, 2\]"):
        build_cluster_spec(plan_roles(3), {0: "h:1"})


# ---- build_tf_config (distribute/tf_config.py, beside its reader) -----------------------------------

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


def test_planned_cluster_resolves_with_tensorflow(tf):
    roles = plan_roles(6, num_ps=1, master_node="chief", eval_node=True)
    spec = build_cluster_spec(roles, {r.executor_id: f"127.0.0.1:{3000 + r.executor_id}" for r in roles})
    for role in roles:
        os.environ["TF_CONFIG"] = build_tf_config(spec, role.job_name, role.task_index)
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        assert resolver.cluster_spec().as_dict() == spec
        assert (resolver.task_type, resolver.task_id) == (role.job_name, role.task_index)
        assert (
            resolver.cluster_spec().task_address(role.job_name, role.task_index)
            == f"127.0.0.1:{3000 + role.executor_id}"
        )
