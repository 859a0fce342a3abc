"""Reading a SavedModel's signatures on the driver without TensorFlow, and the cache id."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tfonspark.errors import ConfigError, DataFormatError
from tfonspark.ml import savedmodel
from tfonspark.ml.savedmodel import TensorSpec


def _export_linear(path, weights):
    """A tf.Module with two signatures, exported with TFNode.export_saved_model."""
    import tensorflow as tf

    from tfonspark import TFNode

    class Linear(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(weights, dtype=tf.float32)

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
        def serve(self, x):
            return {"prediction": tf.linalg.matvec(x, self.w), "doubled": 2.0 * x}

        @tf.function(
            input_signature=[tf.TensorSpec(None, tf.int64, name="anything"), tf.TensorSpec([None, None, 3], tf.string)]
        )
        def odd(self, anything, words):
            return {"n": tf.size(anything), "w": words}

    module = Linear()
    TFNode.export_saved_model(module, str(path), signatures={"serving_default": module.serve, "odd": module.odd})
    return str(path)


@pytest.fixture(scope="module")
def linear_dir(tmp_path_factory):
    pytest.importorskip("tensorflow")
    return _export_linear(tmp_path_factory.mktemp("sm") / "linear", [3.0, -2.0])


def test_reads_signatures_names_dtypes_and_shapes(linear_dir):
    graphs, digest = savedmodel.read_saved_model(linear_dir)
    assert len(graphs) == 1 and graphs[0].tags == frozenset({"serve"})
    assert {"serving_default", "odd"} <= set(graphs[0].signatures)
    serve = savedmodel.select_signature(graphs, None, "serving_default", linear_dir)
    assert serve.inputs == (TensorSpec("x", "float32", (None, 2)),)
    assert serve.outputs == (TensorSpec("doubled", "float32", (None, 2)), TensorSpec("prediction", "float32", (None,)))
    odd = savedmodel.select_signature(graphs, "serve", "odd", linear_dir)
    assert odd.input("anything") == TensorSpec("anything", "int64", None)  # unknown rank
    assert odd.input("words") == TensorSpec("words", "string", (None, None, 3))
    assert odd.output("n") == TensorSpec("n", "int32", ())
    assert odd.output("missing") is None
    assert len(digest) == 64


def test_reading_does_not_import_tensorflow(linear_dir):
    code = (
        "import sys; from tfonspark.ml import savedmodel; "
        f"g, _ = savedmodel.read_saved_model({linear_dir!r}); "
        "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'; "
        "print(sorted(g[0].signatures['serving_default'].inputs[0].shape, key=str))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[2, None]"


def test_key_changes_with_new_weights_and_is_stable_otherwise(tmp_path):
    pytest.importorskip("tensorflow")
    path = _export_linear(tmp_path / "m", [1.0, 1.0])
    _, first = savedmodel.read_saved_model(path)
    _, again = savedmodel.read_saved_model(path)
    assert first == again
    key = savedmodel.model_key(path, None, "serving_default", first)
    assert key == savedmodel.model_key(path, None, "serving_default", again)
    assert key != savedmodel.model_key(path, "serve", "serving_default", first)
    _export_linear(tmp_path / "m", [5.0, 1.0])  # re-export, same directory, new weights
    _, changed = savedmodel.read_saved_model(path)
    assert changed != first


def _synthetic(*graphs: tuple[list[str], list[str]]) -> bytes:
    """A SavedModel proto with MetaGraphs of the given tags and (empty) signature keys."""
    message = savedmodel._saved_model_class()()
    for tags, keys in graphs:
        graph = message.meta_graphs.add()
        graph.meta_info_def.tags.extend(tags)
        for key in keys:
            info = graph.signature_def[key].inputs["in"]
            info.name, info.dtype = "in:0", 1
            info.tensor_shape.dim.add().size = -1
    return message.SerializeToString()


def test_tag_set_selects_among_metagraphs():
    graphs = savedmodel.parse_saved_model(_synthetic((["serve"], ["a"]), (["serve", "gpu"], ["b"])))
    assert savedmodel.select_signature(graphs, "gpu, serve", "b").key == "b"
    assert savedmodel.select_signature(graphs, "serve", "a").inputs == (TensorSpec("in", "float32", (None,)),)
    with pytest.raises(
        ConfigError,
        match=r"has 2 MetaGraphs; pick one with tag_set. Available tag "
        r"sets: \['serve', 'gpu,serve'\]",
    ):
        savedmodel.select_signature(graphs, None, "a", "/m")
    with pytest.raises(ConfigError, match=r"no MetaGraph with tag_set='train'.*\['serve', 'gpu,serve'\]"):
        savedmodel.select_signature(graphs, "train", "a", "/m")
    with pytest.raises(
        ConfigError,
        match=r"signature_def_key='b' is not a signature of the "
        r"SavedModel in '/m'. Available: \['a'\]",
    ):
        savedmodel.select_signature(graphs, "serve", "b", "/m")


def test_corrupt_or_missing_saved_model(tmp_path):
    with pytest.raises(DataFormatError, match="not a SavedModel protobuf.*saved_model.pb"):
        savedmodel.parse_saved_model(b"\xff\xff\xff", "x/saved_model.pb")
    with pytest.raises(DataFormatError, match="holds no MetaGraph"):
        savedmodel.parse_saved_model(b"")
    with pytest.raises(
        ConfigError,
        match=r"export_dir holds no SavedModel \(saved_model.pb not "
        r"found\).*Received: export_dir=",
    ):
        savedmodel.read_saved_model(str(tmp_path))
    uri = "file://" + str(tmp_path)
    with pytest.raises(ConfigError, match="saved_model.pb not found"):
        savedmodel.read_saved_model(uri)


def test_file_uri_reads_like_a_path(linear_dir):
    graphs, digest = savedmodel.read_saved_model("file://" + linear_dir)
    assert digest == savedmodel.read_saved_model(linear_dir)[1]
    assert "serving_default" in graphs[0].signatures


def test_names_and_locations():
    assert savedmodel.strip_port("x:0") == "x" and savedmodel.strip_port("x:1") == "x:1"
    assert savedmodel.resolve_export_dir("hdfs://nn/models/m/") == "hdfs://nn/models/m"
    assert savedmodel.resolve_export_dir("rel/m").startswith("/")
    assert savedmodel.resolve_export_dir("rel/../m/") == savedmodel.resolve_export_dir("m")
    with pytest.raises(ConfigError, match="path is empty"):
        savedmodel.resolve_export_dir("")
    assert TensorSpec("x", "float32", (None, 2)).describe() == "x: float32[None, 2]"
    assert TensorSpec("x", "int64", None).describe() == "x: int64?"
