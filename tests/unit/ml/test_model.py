"""TFModel.transform and TFEstimator.fit on fakes: what they ask Spark and the cluster to do."""

from __future__ import annotations

import argparse
import types

import pytest
from pyspark.sql import types as T

from tfonspark.config import InputMode
from tfonspark.errors import ClusterError, ConfigError, FeedError, InputError
from tfonspark.ml import Namespace, TFEstimator, TFModel
from tfonspark.ml import estimator as estimator_module
from tfonspark.ml import persistence as p
from tfonspark.settings import Settings
from tfonspark.testing import FakeSparkContext
from tfonspark.wire.errors import CapturedError, reraise


class FakeFrame:
    """Just enough DataFrame: a schema, select, mapInArrow; records what was asked."""

    def __init__(self, **columns: T.DataType) -> None:
        self.schema = T.StructType([T.StructField(n, t) for n, t in columns.items()])
        self.columns = list(columns)
        self.selected: list[str] | None = None
        self.mapped: tuple | None = None
        self.sparkSession = argparse.Namespace(sparkContext=FakeSparkContext())

    def select(self, columns):
        self.selected = list(columns)
        return self

    def mapInArrow(self, fn, schema):  # noqa: N802 (Spark name)
        self.mapped = (fn, schema)
        return "transformed"


class FakeCluster:
    def __init__(self, fail_with: BaseException | None = None) -> None:
        self.calls: list[tuple] = []
        self.fail_with = fail_with

    def train(self, data, epochs, feed_timeout):
        self.calls.append(("train", data.selected, epochs, feed_timeout))
        if self.fail_with is not None:
            raise self.fail_with

    def shutdown(self, grace_secs=0, timeout=259200):
        self.calls.append(("shutdown", grace_secs, timeout))


def _train(args, ctx):
    return None


@pytest.fixture
def fake_run(monkeypatch):
    """Replace the ``prepare`` TFEstimator starts clusters with; lists (args, kwargs, cluster) per call."""
    started: list[tuple] = []

    def run(*args, **kwargs):
        cluster = FakeCluster(getattr(run, "fail_with", None))
        started.append((args, kwargs, cluster))
        return types.SimpleNamespace(start=lambda handle: cluster)  # the plan, started: the cluster

    monkeypatch.setattr(estimator_module, "prepare", run)
    run.started = started  # type: ignore[attr-defined]
    return run


@pytest.fixture(scope="module")
def linear_dir(tmp_path_factory):
    tf = pytest.importorskip("tensorflow")

    class Linear(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
        def serve(self, x):
            return {"prediction": tf.reduce_sum(x, axis=1), "both": x}

    path = str(tmp_path_factory.mktemp("sm") / "linear")
    module = Linear()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return path


# ---- TFModel --------------------------------------------------------------------------------


@pytest.fixture
def map_in_arrow(monkeypatch):
    """Take the mapInArrow path (Spark < 4.1), which the fake frame can record."""
    from tfonspark.ml import model

    monkeypatch.setattr(model, "_arrow_udf_available", lambda: False)


def test_transform_keeps_columns_and_appends_typed_outputs_without_a_job(linear_dir, map_in_arrow):
    frame = FakeFrame(id=T.LongType(), features=T.ArrayType(T.DoubleType()))
    model = (
        TFModel({"k": 1})
        .setExportDir(linear_dir)
        .setInputMapping({"features": "x:0"})
        .setOutputMapping({"prediction": "pred", "both": "echo"})
        .setBatchSize(8)
    )
    assert model.transform(frame) == "transformed"
    fn, schema = frame.mapped
    assert schema.simpleString() == "struct<id:bigint,features:array<double>,echo:array<float>,pred:float>"
    plan = fn.__wrapped__.keywords["plan"]  # captured(partial(serve_batches, plan=...))
    assert plan.batch_size == 8 and plan.signature_def_key == "serving_default"
    assert plan.export_dir == linear_dir and [b.column for b in plan.inputs] == ["features"]


def test_transform_errors_name_the_missing_pieces(linear_dir, map_in_arrow):
    frame = FakeFrame(feats=T.ArrayType(T.DoubleType()))
    with pytest.raises(ConfigError, match="needs export_dir"):
        TFModel().transform(frame)
    model = TFModel().setExportDir(linear_dir).setOutputMapping({"prediction": "p"})
    with pytest.raises(InputError, match=r"names column 'features' .* DataFrame has columns \['feats'\]"):
        model.setInputMapping({"features": "x"}).transform(frame)
    with pytest.raises(
        ConfigError,
        match=r"signature_def_key='predict' is not a signature.*"
        r"Available: \['serving_default'\]",
    ):
        model.setInputMapping({"feats": "x"}).setSignatureDefKey("predict").transform(frame)


def test_same_model_content_gives_the_same_cache_key(linear_dir, map_in_arrow):
    frame = FakeFrame(f=T.ArrayType(T.FloatType()))
    keys = []
    for _ in range(2):
        (
            TFModel()
            .setExportDir(linear_dir)
            .setInputMapping({"f": "x"})
            .setOutputMapping({"prediction": "p"})
            .transform(frame)
        )
        keys.append(frame.mapped[0].__wrapped__.keywords["plan"].model_key)
    assert keys[0] == keys[1]


def test_executor_data_errors_in_transform_carry_the_typed_error(linear_dir, map_in_arrow):
    """What Spark runs for transform raises an error whose text ``reraise`` turns back into InputError."""
    import pyarrow as pa

    frame = FakeFrame(features=T.ArrayType(T.DoubleType()))
    model = TFModel().setExportDir(linear_dir).setInputMapping({"features": "x"}).setOutputMapping({"both": "b"})
    model.transform(frame)
    fn, _ = frame.mapped  # the function Spark runs on the executors (mapInArrow)
    bad = pa.RecordBatch.from_pydict({"features": pa.array([[1.0, 2.0], None], pa.list_(pa.float64()))})
    with pytest.raises(CapturedError) as failure:
        list(fn(iter([bad])))
    with pytest.raises(InputError, match="null value") as typed:
        reraise(RuntimeError(f"Spark task failed: {failure.value}"))  # Spark carries it as text
    assert (typed.value.column, typed.value.row) == ("features", 1)


def test_spark_4_1_serves_through_a_scalar_iterator_arrow_udf():
    from tfonspark.ml import model

    assert model._arrow_udf_available()  # the project's Spark: only the mapped columns travel
    assert model._quoted("a.b`c") == "`a.b``c`"


# ---- TFEstimator ------------------------------------------------------------------------------


def test_fit_feeds_sorted_mapped_columns_and_returns_a_model(fake_run, tmp_path):
    frame = FakeFrame(b=T.DoubleType(), a=T.ArrayType(T.DoubleType()), extra=T.StringType())
    estimator = (
        TFEstimator(_train, {"lr": 0.5})
        .setInputMapping({"b": "y", "a": "x"})
        .setClusterSize(2)
        .setEpochs(3)
        .setFeedTimeout(42)
        .setGraceSecs(0)
        .setExportDir(str(tmp_path))
        .setOutputMapping({"p": "pred"})
    )
    model = estimator.fit(frame)
    ((args, kwargs, cluster),) = fake_run.started
    sc, train_fn, tf_args, cluster_size, options, settings = args
    assert train_fn is _train and cluster_size == 2 and settings == Settings()
    assert (options.num_ps, options.tensorboard, options.input_mode) == (0, False, InputMode.SPARK)
    assert (options.master_node, options.driver_ps_nodes, options.max_restarts) == ("chief", False, 0)
    assert kwargs == {"tfos_face": False}
    assert tf_args.lr == 0.5 and tf_args.epochs == 3 and tf_args.input_mapping == {"b": "y", "a": "x"}
    assert cluster.calls == [("train", ["a", "b"], 3, 42.0), ("shutdown", 0.0, 259200)]
    assert isinstance(model, TFModel) and model.args == Namespace({"lr": 0.5})
    assert model.getExportDir() == str(tmp_path) and model.getOutputMapping() == {"p": "pred"}


def test_fit_hands_an_argv_to_train_fn_as_is(fake_run):
    TFEstimator(_train, ["--lr", "1"]).setInputMapping({"a": "x"}).setGraceSecs(0).fit(FakeFrame(a=T.DoubleType()))
    assert fake_run.started[0][0][2] == ["--lr", "1"]


def test_fit_stops_the_cluster_when_feeding_fails(fake_run):
    fake_run.fail_with = FeedError("feed broke")
    with pytest.raises(FeedError, match="feed broke"):
        TFEstimator(_train).setInputMapping({"a": "x"}).fit(FakeFrame(a=T.DoubleType()))
    assert fake_run.started[0][2].calls[-1] == ("shutdown", 0, 60)


def test_fit_runs_export_fn_once_with_the_args(fake_run):
    seen = []
    estimator = TFEstimator(_train, {"k": "v"}, export_fn=lambda args: seen.append(args.k))
    estimator.setInputMapping({"a": "x"}).setGraceSecs(0).fit(FakeFrame(a=T.DoubleType()))
    assert seen == ["v"]


def _export_fails_on_data(args):
    raise InputError("no rows to export", column="label", partition=0)


def _export_crashes(args):
    raise KeyError("weights")


def test_export_fn_errors_come_back_typed_or_as_a_cluster_error(fake_run):
    estimator = TFEstimator(_train, export_fn=_export_fails_on_data).setInputMapping({"a": "x"}).setGraceSecs(0)
    with pytest.raises(InputError, match="no rows to export") as typed:
        estimator.fit(FakeFrame(a=T.DoubleType()))
    assert (typed.value.column, typed.value.partition) == ("label", 0)
    estimator = TFEstimator(_train, export_fn=_export_crashes).setInputMapping({"a": "x"}).setGraceSecs(0)
    with pytest.raises(ClusterError, match="export_fn failed on an executor: KeyError: 'weights'"):
        estimator.fit(FakeFrame(a=T.DoubleType()))


@pytest.mark.parametrize(
    ("mapping", "columns", "error", "message"),
    [
        (
            {},
            {"a": T.DoubleType()},
            ConfigError,
            r"set input_mapping=\{column: tensor_name\}. Received: input_mapping=\{\}; DataFrame columns: \['a'\]",
        ),
        (
            {"a": "x", "zz": "y"},
            {"a": T.DoubleType()},
            InputError,
            r"input_mapping names column\(s\) \['zz'\] that the DataFrame lacks; available columns: \['a'\]",
        ),
    ],
)
def test_fit_checks_the_mapping_before_starting_a_cluster(fake_run, mapping, columns, error, message):
    with pytest.raises(error, match=message):
        TFEstimator(_train).setInputMapping(mapping).fit(FakeFrame(**columns))
    assert fake_run.started == []


def test_fit_refuses_vector_columns_and_tensorflow_mode_without_tfrecord_dir(fake_run):
    from pyspark.ml.linalg import VectorUDT

    with pytest.raises(InputError, match="vector_to_array.*column='v'"):
        TFEstimator(_train).setInputMapping({"v": "x"}).fit(FakeFrame(v=VectorUDT()))
    with pytest.raises(ConfigError, match="set tfrecord_dir.*Received: tfrecord_dir=None"):
        TFEstimator(_train).setInputMode(InputMode.TENSORFLOW).fit(FakeFrame(a=T.DoubleType()))
    assert fake_run.started == []


# ---- persistence helpers ---------------------------------------------------------------------


@pytest.mark.parametrize("args", [Namespace({"lr": 0.1, "layers": [2, 3]}), Namespace(["--x", "1"]), Namespace()])
def test_args_round_trip_through_json(args):
    encoded = p.encode_args(args)
    assert "json" in encoded and p.decode_args(encoded) == args


def test_args_json_cannot_hold_need_allow_pickle_both_ways():
    args = Namespace({"shape": {1, 2}})
    with pytest.raises(ConfigError, match=r"tf_args cannot be saved as JSON: \{'shape': 'set'\}"):
        p.encode_args(args)
    encoded = p.encode_args(args, allow_pickle=True)
    assert set(encoded) == {"pickle"}
    with pytest.raises(ConfigError, match="'tf_args' holds a pickle.*runs arbitrary code"):
        p.decode_args(encoded)
    assert p.decode_args(encoded, allow_pickle=True).shape == {1, 2}


def test_functions_round_trip():
    assert p.encode_function(_train) == {"ref": f"{__name__}:_train"}
    assert p.decode_function(p.encode_function(_train)) is _train
    assert p.decode_function(p.encode_function(None)) is None
    offset = 3
    with pytest.raises(ConfigError, match="lambda.*allow_pickle=True"):
        p.encode_function(lambda v: v + offset)
    pickled = p.encode_function(lambda v: v + offset, allow_pickle=True)
    with pytest.raises(ConfigError, match="holds a pickle"):
        p.decode_function(pickled)
    assert p.decode_function(pickled, allow_pickle=True)(1) == 4
