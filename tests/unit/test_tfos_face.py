"""The TFoS face's Keras 2 route, its tensorflow_estimator stand-in and the hints naming fixes."""

from __future__ import annotations

import logging
import os
import sys

import pytest

from tfonspark import settings
from tfonspark.config import NodeConfig
from tfonspark.driver.launch import _node_keras
from tfonspark.errors import ConfigError
from tfonspark.executor import tfos_env
from tfonspark.tfprocess.hints import hint_for


def _config(**fields):
    return NodeConfig(cluster_id="c" * 32, driver_host="127.0.0.1", driver_port=1, secret_hex="ab" * 16, **fields)


# ---- the setting and the driver's decision ----------------------------------------------------


@pytest.mark.parametrize(
    "raw, value", [(True, "on"), (False, "off"), ("OFF", "off"), ("0", "off"), ("true", "on"), ("auto", "auto")]
)
def test_legacy_keras_setting_takes_modes_and_booleans(raw, value):
    assert settings.resolve({"legacy_keras": raw}, environ={}).legacy_keras == value


def test_legacy_keras_setting_rejects_anything_else_naming_the_key():
    with pytest.raises(ConfigError, match=r"TFONSPARK_LEGACY_KERAS must be one of auto, on, off.*'maybe'"):
        settings.resolve(environ={"TFONSPARK_LEGACY_KERAS": "maybe"})


def test_tfonspark_run_keeps_keras_3_and_the_tfos_face_asks_for_keras_2(caplog):
    assert _node_keras("auto", tfos_face=False) == ""
    assert _node_keras("off", tfos_face=True) == ""
    with caplog.at_level(logging.INFO, logger="tfonspark.driver.launch"):
        assert _node_keras("auto", tfos_face=True) == "auto"
    [line] = [r.getMessage() for r in caplog.records]  # said in one line, with how to turn it off
    assert "Keras 2" in line and "legacyKeras=off" in line
    assert _node_keras("on", tfos_face=False) == "on"


def test_node_config_rejects_an_unknown_keras_mode():
    with pytest.raises(ConfigError, match="legacy_keras must be"):
        _config(legacy_keras="yes")


# ---- the TF process's environment ---------------------------------------------------------------


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


# ---- hints ---------------------------------------------------------------------------------------


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_keras_3_under_multiworker_mirrored_names_the_keras_2_route():
    exc = ValueError("Attempt to convert a value (PerReplica:{ 0: <tf.Tensor ...> }) with an unsupported type")
    assert "tfonspark[tfos]" in hint_for(exc, {})
    assert hint_for(exc, {"TF_USE_LEGACY_KERAS": "1"}) == ""  # raised outside Keras 3: not this case
    assert "Keras 3" in hint_for(ValueError("Invalid reduction dimension 0 for input with 0 dimensions"), {})


def test_hints_for_estimator_numpy_aliases_and_missing_tf_keras():
    missing = ModuleNotFoundError("No module named 'tensorflow_estimator'", name="tensorflow_estimator")
    assert "removed with tf.estimator" in hint_for(missing, {})
    alias = AttributeError("module 'numpy' has no attribute 'int'.\n`np.int` was a deprecated alias")
    assert "np.int64" in hint_for(alias, {})
    no_tf_keras = ImportError("Keras cannot be imported. Check that it is installed.")
    assert "pip install 'tfonspark[tfos]'" in hint_for(no_tf_keras, {"TF_USE_LEGACY_KERAS": "1"})
    assert hint_for(KeyError("x"), {}) == ""


def test_a_hint_is_found_through_the_exception_chain():
    try:
        try:
            raise ModuleNotFoundError("No module named 'tensorflow_estimator'", name="tensorflow_estimator")
        except ImportError as inner:
            raise RuntimeError("loading the model failed") from inner
    except RuntimeError as outer:
        assert "tensorflow_estimator" in hint_for(outer, {})


def test_a_keras_3_model_carried_from_the_driver_into_a_keras_2_node_is_named():
    namespace: dict[str, object] = {}
    code = compile(
        "def fit():\n    raise ValueError('cannot convert PerReplica:{0: x}')\n", "/x/keras/src/trainer.py", "exec"
    )
    exec(code, namespace)  # a frame whose file is Keras 3's own code
    try:
        namespace["fit"]()  # type: ignore[operator]
    except ValueError as exc:
        assert "set TF_USE_LEGACY_KERAS=1 in the driver's environment" in hint_for(exc, {"TF_USE_LEGACY_KERAS": "1"})


def test_a_conv2d_on_an_empty_batch_names_tfonspark_keras_fit():
    """tf_keras' own model.fit under MWMS with uneven input: oneDNN's error on a 0-row batch."""
    tf = pytest.importorskip("tensorflow")
    for message in (
        "input depth must be evenly divisible by filter depth: 1 vs 16\n\t [[{{node conv2d_1/Relu}}]]",
        "Incompatible shapes: [0,14,14,16] vs. [1,1,1,32] [Op:AddV2]",
    ):
        hint = hint_for(tf.errors.InvalidArgumentError(None, None, message), {"TF_USE_LEGACY_KERAS": "1"})
        assert "0 rows" in hint and "tfonspark.keras.fit" in hint and "drop_remainder=True" in hint
    assert hint_for(tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [3,2] vs. [4,2]"), {}) == ""
