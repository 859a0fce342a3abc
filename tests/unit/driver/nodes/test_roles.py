"""driver/nodes/roles.py: role planning and cluster specs, pure functions, checked against TensorFlow's
resolver; the roles of coordinator and evaluator clusters."""

from __future__ import annotations

import os

import pytest

from tfonspark.distribute.tf_config import build_tf_config
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


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


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


def test_the_fixed_chief_joins_the_spec_of_the_nodes_roles():
    roles = plan_roles(3, num_ps=1)
    addresses = {0: "10.0.0.2:2222", 1: "10.0.0.3:2222", 2: "10.0.0.4:2222"}
    spec = build_cluster_spec(roles, addresses, {"chief": ["10.0.0.1:5000"]})
    assert spec == {"chief": ["10.0.0.1:5000"], "ps": ["10.0.0.2:2222"], "worker": ["10.0.0.3:2222", "10.0.0.4:2222"]}
    assert build_cluster_spec(roles, addresses) == {k: v for k, v in spec.items() if k != "chief"}


def test_a_fixed_job_that_nodes_also_run_is_refused():
    with pytest.raises(ConfigError, match="both run by nodes and fixed"):
        build_cluster_spec(plan_roles(2, num_ps=1), {0: "a:1", 1: "b:1"}, {"worker": ["c:1"]})


def test_the_chief_coordinates_and_every_other_node_serves():
    roles = plan_roles(5, num_ps=2, coordinator=True)
    assert [(r.job_name, r.task_index, r.serves) for r in roles] == [
        ("ps", 0, True),
        ("ps", 1, True),
        ("chief", 0, False),
        ("worker", 0, True),
        ("worker", 1, True),
    ]
    assert [r.name for r in roles if r.trains] == ["chief:0"]  # the only node shutdown() waits for


def test_without_coordinator_every_chief_and_worker_trains():
    roles = plan_roles(4, num_ps=1, master_node="chief")
    assert [r.name for r in roles if r.trains] == ["chief:0", "worker:0", "worker:1"]
    assert not any(r.serves for r in roles)


def test_coordinator_names_its_chief_chief_and_keeps_driver_ps_nodes():
    roles = plan_roles(3, num_ps=1, master_node="chief", driver_ps_nodes=True, coordinator=True)
    assert [(r.name, r.on_driver) for r in roles] == [("ps:0", True), ("chief:0", False), ("worker:0", False)]


@pytest.mark.parametrize(
    ("num_executors", "num_ps", "keywords", "says"),
    [
        (3, 0, {}, "num_ps >= 1"),
        (2, 1, {}, "num_executors >= num_ps + 2"),
        (3, 1, {"master_node": "master"}, "master_node='master'"),
        (3, 1, {"eval_node": True}, "num_ps + 3 with eval_node"),
    ],
)
def test_a_coordinator_cluster_needs_a_ps_a_chief_and_a_worker(num_executors, num_ps, keywords, says):
    with pytest.raises(ConfigError, match="coordinator=True") as info:
        plan_roles(num_executors, num_ps, coordinator=True, **keywords)
    assert says in str(info.value)


def test_the_evaluator_runs_map_fun_beside_servers_and_is_not_waited_for():
    roles = plan_roles(5, num_ps=1, eval_node=True, coordinator=True)
    assert [(r.name, r.serves, r.trains) for r in roles] == [
        ("ps:0", True, False),
        ("chief:0", False, True),
        ("evaluator:0", False, False),  # runs map_fun; stopped with the ps once the chief is done
        ("worker:0", True, False),
        ("worker:1", True, False),
    ]
    assert [r.name for r in plan_roles(4, num_ps=1, eval_node=True, coordinator=True)] == [
        "ps:0",
        "chief:0",
        "evaluator:0",
        "worker:0",
    ]


def test_an_evaluator_needs_one_executor_more():
    with pytest.raises(ConfigError, match=r"num_executors >= num_ps \+ 3 with eval_node") as info:
        plan_roles(3, num_ps=1, eval_node=True, coordinator=True)
    assert "eval_node=True" in str(info.value)
