"""executor/tfos_env.py: the environment a TFoS-face node gets: Keras 2 where asked, the tensorflow_estimator stand-in."""

from __future__ import annotations

import os
import sys

import pytest

from tfonspark.config import NodeConfig
from tfonspark.errors import ConfigError
from tfonspark.executor import tfos_env


def _config(**fields):
    return NodeConfig(cluster_id="c" * 32, driver_host="127.0.0.1", driver_port=1, secret_hex="ab" * 16, **fields)


def _installed(*names):
    return lambda name: name in names


def test_keras_2_is_switched_on_where_tf_keras_is_installed():
    env: dict[str, str] = {}
    env.update(tfos_env.env_changes(_config(legacy_keras="auto"), env, _installed("tf_keras")))
    assert env == {"TF_USE_LEGACY_KERAS": "1"}
    env = {}
    env.update(tfos_env.env_changes(_config(legacy_keras="auto"), env, _installed()))
    assert env == {}  # auto without tf_keras: Keras 3 (the driver said so)


def test_keras_2_asked_for_without_tf_keras_names_the_fix():
    with pytest.raises(ConfigError, match=r"tfonspark\[tfos\].*legacyKeras=off"):
        tfos_env.env_changes(_config(legacy_keras="on"), {}, _installed())


def test_keras_3_leaves_the_users_own_variable_alone():
    env = {"TF_USE_LEGACY_KERAS": "1"}
    env.update(tfos_env.env_changes(_config(), env, _installed("tf_keras")))
    assert env == {"TF_USE_LEGACY_KERAS": "1"}


def test_the_estimator_stand_in_goes_last_on_the_path_and_only_where_none_is_installed():
    env = {"PYTHONPATH": "/user/libs"}
    env.update(tfos_env.env_changes(_config(tfos_face=True), env, _installed()))
    assert env["PYTHONPATH"].split(os.pathsep) == ["/user/libs", tfos_env.SHIMS_DIR]
    env = {}
    env.update(tfos_env.env_changes(_config(tfos_face=True), env, _installed("tensorflow_estimator")))
    assert env == {}
    env.update(tfos_env.env_changes(_config(tfos_face=False), env, _installed()))
    assert env == {}


def test_the_stand_in_gives_tfos_examples_their_timestamped_export_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(tfos_env.SHIMS_DIR)
    for name in [n for n in sys.modules if n.startswith("tensorflow_estimator")]:
        monkeypatch.delitem(sys.modules, name)
    from tensorflow_estimator.python.estimator.export import export_lib

    clock = iter([1000.0, 1000.0, 1001.0])
    monkeypatch.setattr(export_lib.time, "time", lambda: next(clock))
    monkeypatch.setattr(export_lib.time, "sleep", lambda s: None)
    (tmp_path / "1000").mkdir()  # taken: the next second is used, as the original does
    assert export_lib.get_timestamped_export_dir(str(tmp_path)) == os.fsencode(tmp_path / "1001")
    with pytest.raises(AttributeError, match="tf.estimator was removed in TensorFlow 2.16"):
        export_lib.build_raw_serving_input_receiver_fn  # noqa: B018
