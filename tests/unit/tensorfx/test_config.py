"""tfonspark.tensorfx.Configuration: TF_CONFIG read into task, cluster, roles, device, strategy."""

from __future__ import annotations

import json

import pytest

from tfonspark.errors import ConfigError
from tfonspark.tensorfx import Configuration, Task

CLUSTER = {"chief": ["a:1"], "worker": ["b:2", "c:3"]}


def set_tf_config(monkeypatch: pytest.MonkeyPatch, document: object) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps(document))


def test_local_is_one_chief_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for config in (Configuration.local(), Configuration.environment()):
        assert config.cluster is None and not config.distributed
        assert config.task == Task("chief", 0) and config.master and not config.worker and not config.param_server
        assert config.env == "local" and config.job == {}
        assert config.device.to_string() == "/job:localhost/replica:0/task:0"
        assert config.create_server() is None


@pytest.mark.parametrize(
    ("task", "master", "worker", "ps"),
    [
        ({"type": "chief", "index": 0}, True, False, False),
        ({"type": "worker", "index": 1}, False, True, False),
        ({"type": "ps", "index": 0}, False, False, True),
    ],
)
def test_environment_reads_tf_config(
    monkeypatch: pytest.MonkeyPatch, task: dict[str, object], master: bool, worker: bool, ps: bool
) -> None:
    cluster = {**CLUSTER, "ps": ["d:4"]}
    set_tf_config(monkeypatch, {"cluster": cluster, "task": task, "job": {"name": "j"}, "environment": "cloud"})
    config = Configuration.environment()
    assert config.task.type == task["type"] and config.task.index == task["index"]
    assert (config.master, config.worker, config.param_server, config.distributed) == (master, worker, ps, True)
    assert config.cluster == {role: tuple(a) for role, a in cluster.items()}
    assert config.job == {"name": "j"} and config.env == "cloud"
    assert config.device.job == task["type"] and config.device.task == task["index"]
    assert config.device.replica == 0


def test_worker_zero_is_master_without_a_chief() -> None:
    config = Configuration({"type": "worker", "index": 0}, {"worker": ["a:1", "b:2"]})
    assert config.master and config.worker
    assert Configuration({"type": "master", "index": 0}, {"master": ["a:1"]}).master


@pytest.mark.parametrize(
    "document",
    [
        {"cluster": {"boss": ["a:1"], "worker": ["b:2"]}, "task": {"type": "worker", "index": 0}},
        {"task": {"type": "boss", "index": 0}},
    ],
)
def test_unknown_role_names_it_and_the_valid_ones(monkeypatch: pytest.MonkeyPatch, document: object) -> None:
    set_tf_config(monkeypatch, document)
    with pytest.raises(ConfigError, match=r"'boss'.*valid: chief, master, worker, ps, evaluator"):
        Configuration.environment()


def test_malformed_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        Configuration.environment()
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": 5}})
    with pytest.raises(ConfigError, match="worker:5"):
        Configuration.environment()


def test_strategy_roles() -> None:
    pytest.importorskip("tensorflow")
    import tensorflow as tf

    assert Configuration.local().create_strategy() is tf.distribute.get_strategy()
    with Configuration.local().create_device_setter(None):
        assert tf.distribute.get_strategy() is tf.distribute.get_strategy()
    ps_worker = Configuration({"type": "worker", "index": 0}, {"chief": ["a:1"], "worker": ["b:2"], "ps": ["c:3"]})
    with pytest.raises(ConfigError, match="create_server"):
        ps_worker.create_strategy()
    evaluator = Configuration({"type": "evaluator", "index": 0}, {"chief": ["a:1"], "evaluator": ["b:2"]})
    with pytest.raises(ConfigError, match="evaluator"):
        evaluator.create_strategy()


def test_docstring_examples_run() -> None:
    import doctest

    import tfonspark.tensorfx.args
    import tfonspark.tensorfx.config

    for module in (tfonspark.tensorfx.args, tfonspark.tensorfx.config):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, module.__name__
