"""``tfonspark.compat`` keeps TFoS's meaning (``from tensorflowonspark import compat``)."""

from __future__ import annotations

import glob
import os
import tempfile

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tfonspark import compat  # noqa: E402


def _model():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_the_chief_exports_a_servable_saved_model(tmp_path):
    model = _model()
    x = np.ones((4, 3), np.float32)
    compat.export_saved_model(model, str(tmp_path / "export"), is_chief=True)
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    np.testing.assert_allclose(loaded.serve(x).numpy(), model.predict(x, verbose=0), rtol=1e-5)
    assert "serving_default" in loaded.signatures


def test_other_workers_export_to_a_throwaway_dir_that_is_removed(tmp_path):
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "tfonspark-worker-model-*")))
    compat.export_saved_model(_model(), str(tmp_path / "export"))  # is_chief defaults to False, as in TFoS
    assert not (tmp_path / "export").exists()
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "tfonspark-worker-model-*"))) == before


def test_disable_auto_shard_turns_tf_data_sharding_off():
    options = tf.data.Options()
    compat.disable_auto_shard(options)
    assert options.experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF


def test_is_gpu_available_says_what_tensorflow_sees():
    assert compat.is_gpu_available() == bool(tf.config.list_logical_devices("GPU"))


def test_a_tf_keras_model_is_saved_as_tfos_saved_it_with_its_layer_names(tmp_path):
    tf_keras = pytest.importorskip("tf_keras")
    model = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(3,), name="dense")])
    export_dir = os.fsencode(tmp_path / "1700000000")  # as get_timestamped_export_dir returns it
    compat.export_saved_model(model, export_dir, is_chief=True)
    predict = tf.saved_model.load(str(tmp_path / "1700000000")).signatures["serving_default"]
    x = np.ones((4, 3), np.float32)
    out = predict(dense_input=tf.constant(x))  # the input name TFoS programs map (e.g. conv2d_input)
    np.testing.assert_allclose(out["dense"].numpy(), model.predict(x, verbose=0), rtol=1e-5)
    compat.export_saved_model(model, str(tmp_path / "other"), is_chief=False)
    assert not (tmp_path / "other").exists()
