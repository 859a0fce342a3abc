"""The one SavedModel export (distribute/checkpoint.py) behind every face: who writes, and how."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfonspark import TFNode
from tfonspark.errors import ConfigError

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import tfonspark.keras as tfk  # noqa: E402 - needs TensorFlow
from tfonspark.distribute.checkpoint import export_saved_model  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def small_model() -> object:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


class Doubler(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec((None,), tf.float32)])
    def serve(self, x: object) -> object:
        return {"y": x * 2}


def written(path: Path) -> bool:
    return (path / "saved_model.pb").is_file()


def test_a_plain_keras_model_is_written_where_the_caller_says(tmp_path):
    model = small_model()
    assert TFNode.export_saved_model(model, str(tmp_path / "no"), is_chief=False) is None
    assert not (tmp_path / "no").exists()
    assert TFNode.export_saved_model(model, str(tmp_path / "yes")) == str(tmp_path / "yes")
    x = np.ones((2, 3), np.float32)
    loaded = tf.saved_model.load(str(tmp_path / "yes"))  # kept: its functions need its variables
    np.testing.assert_allclose(np.asarray(loaded.serve(x)), np.asarray(model(x)), rtol=1e-6)


def test_signatures_go_through_tf_saved_model(tmp_path):
    module = Doubler()
    path = tmp_path / "module"
    assert TFNode.export_saved_model(module, path, signatures={"serving_default": module.serve}) == str(path)
    loaded = tf.saved_model.load(str(path))
    assert loaded.signatures["serving_default"](tf.constant([1.0, 2.0]))["y"].numpy().tolist() == [2.0, 4.0]
    assert export_saved_model(module, tmp_path / "not-chief", signatures={"s": module.serve}, is_chief=False) is None


def test_without_is_chief_the_strategy_decides(tmp_path):
    # no TF_CONFIG: one process, which is the chief
    assert tfk.export_saved_model(small_model(), tmp_path / "m") == str(tmp_path / "m")
    assert written(tmp_path / "m")


def test_a_model_built_under_a_strategy_is_exported_by_every_worker_whatever_is_chief_says(tmp_path):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = small_model()
    # every worker must run this save (collectives); the chief keeps it, and here we are the chief
    assert TFNode.export_saved_model(model, str(tmp_path / "m"), is_chief=False) == str(tmp_path / "m")
    assert written(tmp_path / "m")


def test_signatures_and_input_signature_exclude_each_other(tmp_path):
    module = Doubler()
    with pytest.raises(ConfigError, match="either signatures"):
        export_saved_model(module, tmp_path, signatures={"s": module.serve}, input_signature=[1])
