"""TFModel inference without Spark: binding columns to a signature, Arrow <-> numpy, serving."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import types as T

from tfonspark.errors import ConfigError, InputError
from tfonspark.ml import binding, inference
from tfonspark.ml.binding import InputBinding, OutputBinding
from tfonspark.ml.model_cache import ModelCache
from tfonspark.ml.savedmodel import Signature, TensorSpec

SIGNATURE = Signature(
    "serving_default",
    inputs=(TensorSpec("image", "float32", (None, 2, 2, 1)), TensorSpec("word", "string", (None,))),
    outputs=(
        TensorSpec("scalar", "float32", ()),
        TensorSpec("total", "float32", (None,)),
        TensorSpec("grid", "int64", (None, 3, 2)),
    ),
)


@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory):
    """A tf.Module whose signatures cover casts, reshapes, strings, nesting and bad batch dims."""
    tf = pytest.importorskip("tensorflow")

    from tfonspark import TFNode

    class Mixed(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 2, 2, 1], tf.float32),
                tf.TensorSpec([None], tf.string),
                tf.TensorSpec([None], tf.int64),
            ]
        )
        def serve(self, image, word, count):
            return {
                "total": tf.reduce_sum(image, axis=[1, 2, 3]),
                "echo": tf.strings.join([word, "!"]),
                "grid": tf.reshape(tf.tile(count[:, None], [1, 6]), [-1, 3, 2]),
                "flag": count > 1,
                "small": tf.cast(count, tf.uint8),
            }

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
        def pooled(self, x):
            return {"mean": tf.reduce_mean(x, axis=0, keepdims=True)}

    module = Mixed()
    path = tmp_path_factory.mktemp("sm") / "mixed"
    TFNode.export_saved_model(module, str(path), signatures={"serving_default": module.serve, "pooled": module.pooled})
    return str(path)


@pytest.fixture(scope="module")
def keras_dir(tmp_path_factory):
    """A two-input, two-output Keras 3 model exported with TFNode.export_saved_model."""
    pytest.importorskip("tensorflow")
    import keras

    from tfonspark import TFNode

    a, b = keras.Input((2,), name="a"), keras.Input((), name="b")
    y = keras.layers.Dense(3, kernel_initializer="ones", name="d")(a)
    z = keras.layers.Lambda(lambda t: 2.0 * t[0][:, 0] + t[1])([a, b])
    model = keras.Model({"a": a, "b": b}, {"y": y, "z": z})
    path = tmp_path_factory.mktemp("sm") / "keras"
    TFNode.export_saved_model(model, str(path))
    return str(path)


def _schema(**columns: T.DataType) -> T.StructType:
    return T.StructType([T.StructField(name, dtype) for name, dtype in columns.items()])


# ---- binding ----------------------------------------------------------------------------------


def test_bind_inputs_ignores_non_signature_tensors_and_accepts_port_suffix():
    bound = binding.bind_inputs(SIGNATURE, {"img": "image:0", "w": "word", "label": "y_"}, ["img", "w"])
    assert bound == (
        InputBinding("img", "image", "float32", (None, 2, 2, 1)),
        InputBinding("w", "word", "string", (None,)),
    )


def test_bind_inputs_errors_name_what_is_missing():
    with pytest.raises(InputError) as info:
        binding.bind_inputs(SIGNATURE, {"img": "image", "w": "word"}, ["image", "w"])
    assert (
        "names column 'img' (for signature input 'image') but the DataFrame has columns ['image', 'w']"
        in str(info.value)
        and info.value.column == "img"
    )
    with pytest.raises(
        ConfigError,
        match=r"input\(s\) \['word'\] have no column.*Received: "
        r"input_mapping=\{'img': 'image'\}; signature inputs: "
        r"\['image: float32\[None, 2, 2, 1\]', 'word: string\[None\]'\]",
    ):
        binding.bind_inputs(SIGNATURE, {"img": "image"}, ["img"])
    odd = Signature("s", inputs=(TensorSpec("h", "resource", ()),), outputs=())
    with pytest.raises(
        ConfigError,
        match=r"signature input h: resource\[\] has a dtype no DataFrame "
        r"column can feed; supported: \['bfloat16'",
    ):
        binding.bind_inputs(odd, {"c": "h"}, ["c"])
    with pytest.raises(ConfigError, match="signature 's' takes no inputs"):
        binding.bind_inputs(Signature("s", inputs=(), outputs=()), {}, [])
    with pytest.raises(ConfigError, match="maps two columns to signature input 'word': 'a' and 'b'"):
        binding.bind_inputs(SIGNATURE, {"a": "word", "b": "word:0", "img": "image"}, ["a", "b", "img"])


def test_bind_outputs_errors_name_outputs_and_columns():
    with pytest.raises(ConfigError, match=r"output_mapping is empty.*outputs: \['scalar: float32\[\]'"):
        binding.bind_outputs(SIGNATURE, {}, [])
    with pytest.raises(
        ConfigError,
        match=r"output_mapping names 'dense', which is not an output of "
        r"signature 'serving_default'. Available outputs:",
    ):
        binding.bind_outputs(SIGNATURE, {"dense": "out"}, [])
    with pytest.raises(ConfigError, match=r"output column 'img' \(for output 'total'\) already exists"):
        binding.bind_outputs(SIGNATURE, {"total": "img"}, ["img"])
    with pytest.raises(ConfigError, match=r"output column 'o' \(for output 'total'\) already exists"):
        binding.bind_outputs(SIGNATURE, {"grid": "o", "total": "o"}, [])
    with pytest.raises(ConfigError, match=r"scalar: float32\[\] has no batch dimension"):
        binding.bind_outputs(SIGNATURE, {"scalar": "s"}, [])
    assert binding.bind_outputs(SIGNATURE, {"total:0": "t"}, ["x"]) == (
        OutputBinding("total", "t", "float32", (None,)),
    )


@pytest.mark.parametrize(
    ("dtype", "shape", "expected"),
    [
        ("float32", (None,), T.FloatType()),
        ("float16", (None, 4), T.ArrayType(T.FloatType(), False)),
        ("float64", (None, 2), T.ArrayType(T.DoubleType(), False)),
        ("int64", (None, 3, 2), T.ArrayType(T.ArrayType(T.LongType(), False), False)),
        ("uint8", (None,), T.ShortType()),
        ("uint32", (None,), T.LongType()),
        ("bool", (None,), T.BooleanType()),
        ("string", (None,), T.StringType()),
    ],
)
def test_output_types_follow_dtype_and_shape(dtype, shape, expected):
    assert binding.spark_type(TensorSpec("o", dtype, shape)) == expected


def test_output_types_refuse_what_a_column_cannot_hold():
    with pytest.raises(ConfigError, match=r"o: complex64\[None\] has a dtype no DataFrame column can hold"):
        binding.spark_type(TensorSpec("o", "complex64", (None,)))
    with pytest.raises(ConfigError, match=r"o: float32\? has no batch dimension"):
        binding.spark_type(TensorSpec("o", "float32", None))


def test_plan_needs_an_export_dir_and_refuses_vector_columns(mixed_dir):
    with pytest.raises(ConfigError, match="needs export_dir. Received: export_dir=None"):
        binding.plan_serving(
            _schema(),
            export_dir=None,
            tag_set=None,
            signature_def_key=None,
            input_mapping={},
            output_mapping={},
            batch_size=1,
        )
    from pyspark.ml.linalg import VectorUDT

    with pytest.raises(InputError, match="vector_to_array.*column='x'"):
        binding.plan_serving(
            _schema(x=VectorUDT()),
            export_dir=mixed_dir,
            tag_set=None,
            signature_def_key="pooled",
            input_mapping={"x": "x"},
            output_mapping={"mean": "m"},
            batch_size=1,
        )


# ---- Arrow -> numpy ---------------------------------------------------------------------------


def _binding(dtype, shape, column="c", tensor="t"):
    return InputBinding(column, tensor, dtype, shape)


def test_column_array_casts_and_reshapes_flat_arrays():
    column = pa.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], pa.list_(pa.float64()))
    values = inference.column_array(column, _binding("float32", (None, 2, 2, 1)), 0, 0)
    assert values.dtype == np.float32 and values.shape == (2, 2, 2, 1)
    assert values[1, 1, 0, 0] == 7.0
    ints = inference.column_array(pa.array([1, 2], pa.int64()), _binding("float32", (None, 1)), 0, 0)
    assert ints.dtype == np.float32 and ints.shape == (2, 1)
    same = inference.column_array(column, _binding("float64", (None, None)), 0, 0)
    assert same.dtype == np.float64 and same.shape == (2, 4)
    words = inference.column_array(pa.array(["a", "b"]), _binding("string", (None,)), 0, 0)
    assert list(words) == ["a", "b"]


def test_column_array_errors_say_column_partition_and_row():
    column = pa.array([[1.0, 2.0, 3.0]] * 2, pa.list_(pa.float64()))
    with pytest.raises(
        InputError,
        match=r"shape \[3\] per row do not fit signature input 't' of "
        r"shape \[2, 2, 1\] per row \(column='c', partition=4\)",
    ):
        inference.column_array(column, _binding("float32", (None, 2, 2, 1)), 4, 0)
    with pytest.raises(InputError, match=r"null value.*column='c', partition=1, row=12"):
        inference.column_array(pa.array([1.0, None]), _binding("float32", (None,)), 1, 11)
    with pytest.raises(
        InputError, match="holds float64 values but signature input 't' takes int32; cast the column first"
    ):
        inference.column_array(pa.array([1.5]), _binding("int32", (None,)), 0, 0)
    with pytest.raises(InputError, match="holds text or binary values but signature input 't' takes float32"):
        inference.column_array(pa.array(["x"]), _binding("float32", (None,)), 0, 0)
    with pytest.raises(InputError, match="holds int64 values but signature input 't' takes strings"):
        inference.column_array(pa.array([1]), _binding("string", (None,)), 0, 0)


# ---- numpy -> Arrow ----------------------------------------------------------------------------


def test_outputs_to_arrow_nests_per_dimension():
    grid = np.arange(12, dtype=np.int64).reshape(2, 3, 2)
    array = inference.outputs_to_arrow(grid, OutputBinding("g", "g", "int64", (None, 3, 2)))
    assert array.type == pa.list_(pa.list_(pa.int64()))
    assert array.to_pylist()[1] == [[6, 7], [8, 9], [10, 11]]
    words = inference.outputs_to_arrow(
        np.array([b"a\xc3\xa9", b"b"], dtype=object), OutputBinding("w", "w", "string", (None,))
    )
    assert words.to_pylist() == ["a\u00e9", "b"]
    small = inference.outputs_to_arrow(np.array([200], np.uint8), OutputBinding("s", "s", "uint8", (None,)))
    assert small.type == pa.int16() and small.to_pylist() == [200]
    empty = inference.outputs_to_arrow(np.zeros((0, 0, 2)), OutputBinding("e", "e", "float32", (None, None, 2)))
    assert len(empty) == 0 and empty.type == pa.list_(pa.list_(pa.float32()))


# ---- serving end to end (in this process) ------------------------------------------------------


def _mixed_plan(mixed_dir, batch_size):
    schema = _schema(img=T.ArrayType(T.DoubleType()), word=T.StringType(), n=T.LongType(), label=T.DoubleType())
    return binding.plan_serving(
        schema,
        export_dir=mixed_dir,
        tag_set="serve",
        signature_def_key=None,
        input_mapping={"img": "image", "word": "word:0", "n": "count", "label": "y_"},
        output_mapping={"total": "total", "echo": "echo", "grid": "grid", "flag": "flag", "small": "small"},
        batch_size=batch_size,
    )


def _batch(start, stop):
    rows = range(start, stop)
    return pa.RecordBatch.from_pydict(
        {
            "img": pa.array([[float(i)] * 4 for i in rows], pa.list_(pa.float64())),
            "word": pa.array([f"w{i}" for i in rows]),
            "n": pa.array(list(rows), pa.int64()),
            "label": pa.array([0.5] * len(rows)),
        }
    )


def test_serve_batches_appends_outputs_across_batch_boundaries(mixed_dir):
    ModelCache.clear()
    plan = _mixed_plan(mixed_dir, batch_size=3)
    assert [f.name for f in binding.output_fields(plan)] == ["echo", "flag", "grid", "small", "total"]
    first, empty, second = _batch(0, 7), _batch(0, 0), _batch(7, 9)
    out = list(inference.serve_batches(iter([first, empty, second]), plan))
    assert [b.num_rows for b in out] == [7, 0, 2]
    assert out[0].schema.names == ["img", "word", "n", "label", "echo", "flag", "grid", "small", "total"]
    passed, given = out[0].column(0), first.column(0)  # input columns pass through, zero-copy
    assert [b.address for b in passed.buffers() if b] == [b.address for b in given.buffers() if b]
    rows = out[0].to_pylist() + out[2].to_pylist()
    assert [r["total"] for r in rows] == [4.0 * i for i in range(9)]
    assert [r["echo"] for r in rows] == [f"w{i}!" for i in range(9)]
    assert rows[8]["grid"] == [[8, 8]] * 3 and [r["flag"] for r in rows[:3]] == [False, False, True]
    assert out[1].schema.field("grid").type == pa.list_(pa.list_(pa.int64()))
    list(inference.serve_batches(iter([_batch(0, 2)]), plan))
    assert ModelCache.loads[plan.model_key] == 1  # loaded once for both calls


def test_batch_size_does_not_change_results(mixed_dir):
    small = list(inference.serve_batches(iter([_batch(0, 10)]), _mixed_plan(mixed_dir, 1)))
    large = list(inference.serve_batches(iter([_batch(0, 10)]), _mixed_plan(mixed_dir, 1000)))
    assert small[0].equals(large[0])


def test_many_batches_run_in_one_graph_call_with_the_results_of_one_call_each(mixed_dir, monkeypatch):
    """Rows > batch_size: one graph loops over the batches; the signature still sees batch_size
    rows a call, and every output (strings, nested, unsigned, bool) equals batch-by-batch calls."""
    ModelCache.clear()
    plan = _mixed_plan(mixed_dir, batch_size=3)
    batch = _batch(0, 10)
    fn = inference.load_signature(plan)
    assert [v is not None for v in fn._loops.values()] == [True]  # traced at load: dtypes, shapes fixed
    (looped,) = inference.serve_batches(iter([batch]), plan)
    assert [v is not None for v in fn._loops.values()] == [True]  # and used, not traced again
    seen = []
    monkeypatch.setattr(
        fn, "fn", lambda **kw: seen.append(len(kw["count"])) or fn.saved_model.signatures["serving_default"](**kw)
    )
    monkeypatch.setattr(fn, "_loops", {})
    monkeypatch.setattr(fn, "batched", lambda *a: None)  # batch by batch, from Python
    (each,) = inference.serve_batches(iter([batch]), plan)
    assert seen == [3, 3, 3, 1]
    assert looped.equals(each)


def test_a_signature_the_loop_cannot_serve_falls_back_once_and_keeps_its_error(mixed_dir):
    ModelCache.clear()
    plan, batch = _pooled(mixed_dir, batch_size=2, rows=5)
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"output 'mean' returned shape \[1, 2\] for a batch of 2 rows"):
            list(inference.serve_batches(iter([batch]), plan))
    assert list(inference.load_signature(plan)._loops.values()) == [None]  # not traced again


def test_a_model_loaded_in_a_spark_task_is_frozen_out_of_the_gc(mixed_dir, monkeypatch):
    """PySpark collects after every task: with TensorFlow and a model that walked ~420k objects."""
    import gc

    import pyspark

    ModelCache.clear()
    gc.unfreeze()
    inference.load_signature(_mixed_plan(mixed_dir, 4))
    assert gc.get_freeze_count() == 0  # not in a Spark task: the user's process is left alone
    ModelCache.clear()
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: object()))
    try:
        fn = inference.load_signature(_mixed_plan(mixed_dir, 4))
        assert gc.get_freeze_count() > 10_000
        assert not any(o is fn for o in gc.get_objects())  # frozen: out of every generation
        ModelCache.clear()  # the next load first unfreezes, so a dropped model's cycles can go
        calls = []
        unfreeze = gc.unfreeze
        monkeypatch.setattr(gc, "unfreeze", lambda: calls.append(gc.get_freeze_count()) or unfreeze())
        inference.load_signature(_mixed_plan(mixed_dir, 5))
        assert calls and calls[0] > 10_000 and gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()


def _pooled(mixed_dir, batch_size, rows):
    """The ``pooled`` signature (one output row per batch, not per row) and a batch of ``rows``."""
    plan = binding.plan_serving(
        _schema(x=T.ArrayType(T.FloatType())),
        export_dir=mixed_dir,
        tag_set=None,
        signature_def_key="pooled",
        input_mapping={"x": "x"},
        output_mapping={"mean": "m"},
        batch_size=batch_size,
    )
    return plan, pa.RecordBatch.from_pydict({"x": pa.array([[1.0, 2.0]] * rows, pa.list_(pa.float32()))})


def test_output_without_a_row_per_input_is_an_error(mixed_dir):
    plan, batch = _pooled(mixed_dir, batch_size=5, rows=3)
    with pytest.raises(ConfigError, match=r"output 'mean' returned shape \[1, 2\] for a batch of 3 rows"):
        list(inference.serve_batches(iter([batch]), plan))


def test_keras_model_exported_by_tfnode_serves_unchanged(keras_dir):
    schema = _schema(feat=T.ArrayType(T.DoubleType()), b=T.DoubleType())
    plan = binding.plan_serving(
        schema,
        export_dir=keras_dir,
        tag_set=None,
        signature_def_key=None,
        input_mapping={"feat": "a", "b": "b"},
        output_mapping={"y": "y", "z": "z"},
        batch_size=2,
    )
    assert [(f.name, f.dataType) for f in binding.output_fields(plan)] == [
        ("y", T.ArrayType(T.FloatType(), False)),
        ("z", T.FloatType()),
    ]
    batch = pa.RecordBatch.from_pydict(
        {"feat": pa.array([[1.0, 2.0], [3.0, 4.0], [0.0, 1.0]]), "b": pa.array([10.0, 20.0, 30.0])}
    )
    (out,) = inference.serve_batches(iter([batch]), plan)
    assert out.column(3).to_pylist() == [12.0, 26.0, 30.0]
    np.testing.assert_allclose(
        np.array(out.column(2).to_pylist())[:, 0] - [3.0, 7.0, 1.0], 0, atol=1e-6
    )  # ones kernel: every output is a sum (+ zero bias)


def test_plan_is_picklable_and_frozen(mixed_dir):
    import pickle

    plan = _mixed_plan(mixed_dir, 4)
    assert pickle.loads(pickle.dumps(plan)) == plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.batch_size = 5  # type: ignore[misc]


def test_serve_arrays_is_the_arrow_udf_body(mixed_dir, keras_dir):
    plan = _mixed_plan(mixed_dir, batch_size=4)
    batch = _batch(0, 5)
    columns = {b.column: batch.column(b.column) for b in plan.inputs}
    items = [tuple(columns[b.column] for b in plan.inputs)]
    (struct,) = inference.serve_arrays(iter(items), plan)
    assert struct.type.names == ["echo", "flag", "grid", "small", "total"]
    assert struct.field("total").to_pylist() == [0.0, 4.0, 8.0, 12.0, 16.0]
    single = binding.plan_serving(
        _schema(x=T.ArrayType(T.FloatType())),
        export_dir=mixed_dir,
        tag_set=None,
        signature_def_key="pooled",
        input_mapping={"x": "x"},
        output_mapping={"mean": "m"},
        batch_size=8,
    )
    arrays = [pa.array([[1.0, 3.0]], pa.list_(pa.float32())), pa.array([], pa.list_(pa.float32()))]
    first, empty = inference.serve_arrays(iter(arrays), single)  # one input: plain arrays
    assert first.to_pylist() == [[1.0, 3.0]] and len(empty) == 0
    assert first.type == pa.list_(pa.float32())


def test_keras_model_exported_with_given_signatures_serves_by_key(tmp_path):
    tf = pytest.importorskip("tensorflow")
    import keras

    from tfonspark import TFNode

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones")])

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="features")])
    def predict(features):
        return {"prediction": tf.squeeze(model(features), -1)}

    path = str(tmp_path / "k")
    assert TFNode.export_saved_model(model, path, signatures={"predict": predict}) == path
    plan = binding.plan_serving(
        _schema(f=T.ArrayType(T.DoubleType())),
        export_dir=path,
        tag_set="serve",
        signature_def_key="predict",
        input_mapping={"f": "features"},
        output_mapping={"prediction": "p"},
        batch_size=16,
    )
    (out,) = inference.serve_arrays(iter([pa.array([[1.0, 2.0], [0.5, 0.5]])]), plan)
    assert out.to_pylist() == [3.0, 1.0]


def test_saved_model_exported_like_the_mnist_examples_serves_unchanged(tmp_path):
    """examples/mnist: a Keras 3 CNN on flat ``image`` pixels, tfonspark.keras.export_saved_model."""
    pytest.importorskip("tensorflow")
    import keras

    from tfonspark.keras import export_saved_model

    model = keras.Sequential(
        [
            keras.Input((784,), name="image"),
            keras.layers.Reshape((28, 28, 1)),
            keras.layers.Conv2D(2, 3),
            keras.layers.Flatten(),
            keras.layers.Dense(10, name="logits"),
        ]
    )
    path = str(tmp_path / "export")
    assert export_saved_model(model, path) == path
    plan = binding.plan_serving(
        _schema(image=T.ArrayType(T.FloatType()), label=T.LongType()),
        export_dir=path,
        tag_set=None,
        signature_def_key=None,
        input_mapping={"image": "image"},
        output_mapping={"output_0": "logits"},
        batch_size=2,  # 3 rows: two batches of the CNN, in one graph call
    )
    assert [(f.name, f.dataType) for f in binding.output_fields(plan)] == [
        ("logits", T.ArrayType(T.FloatType(), False))
    ]
    images = np.random.default_rng(0).random((3, 784), dtype=np.float32)
    column = pa.ListArray.from_arrays(
        pa.array(np.arange(0, 3 * 784 + 1, 784, dtype=np.int32)), pa.array(images.reshape(-1))
    )
    (out,) = inference.serve_arrays(iter([column]), plan)
    np.testing.assert_allclose(np.array(out.to_pylist()), model.predict(images, verbose=0), rtol=1e-5, atol=1e-5)
    assert [v is not None for v in inference.load_signature(plan)._loops.values()] == [True]


def test_a_conv2d_model_is_never_served_an_empty_batch(tmp_path):
    """oneDNN's Conv2D kernels reject 0 rows; 0-row record batches get 0-row outputs unserved."""
    tf = pytest.importorskip("tensorflow")
    import keras

    model = keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            keras.layers.Conv2D(2, 2, activation="relu"),
            keras.layers.Conv2D(2, 2, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )
    serve = tf.function(lambda image: {"score": model(image)}, input_signature=[tf.TensorSpec([None, 4, 4, 1])])
    module = tf.Module()
    module.model = model
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": serve})
    ModelCache.clear()
    plan = binding.plan_serving(
        _schema(img=T.ArrayType(T.FloatType())),
        export_dir=str(tmp_path),
        tag_set="serve",
        signature_def_key=None,
        input_mapping={"img": "image"},
        output_mapping={"score": "score"},
        batch_size=4,
    )

    def images(count):
        return pa.RecordBatch.from_pydict({"img": pa.array([[1.0] * 16] * count, pa.list_(pa.float32()))})

    out = list(inference.serve_batches(iter([images(3), images(0), images(2), images(0)]), plan))
    assert [b.num_rows for b in out] == [3, 0, 2, 0]
    x = np.ones((1, 4, 4, 1), np.float32)
    expected = float(np.asarray(model(x))[0, 0])
    assert out[0].column("score").to_pylist()[0] == pytest.approx([expected], rel=1e-5)
