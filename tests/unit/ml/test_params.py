"""TFEstimator/TFModel Params: TFoS names and defaults, checked values, args merging (no Spark job)."""

from __future__ import annotations

import argparse
import importlib

import pytest
from pyspark import cloudpickle
from pyspark.ml.param import Param, TypeConverters

from tfonspark.config import InputMode
from tfonspark.errors import ConfigError
from tfonspark.ml import Namespace, TFEstimator, TFModel, TFParams
from tfonspark.ml import params as params_module
from tfonspark.ml.params import HasBatchSize, HasSteps

TFOS_ESTIMATOR_DEFAULTS = {
    "input_mapping": {},
    "cluster_size": 1,
    "num_ps": 0,
    "driver_ps_nodes": False,
    "input_mode": 1,
    "master_node": "chief",
    "protocol": "grpc",
    "tensorboard": False,
    "model_dir": None,
    "export_dir": None,
    "tfrecord_dir": None,
    "batch_size": 100,
    "epochs": 1,
    "readers": 1,
    "steps": 1000,
    "grace_secs": 30,
}
TFOS_MODEL_DEFAULTS = {
    "input_mapping": {},
    "output_mapping": {},
    "batch_size": 100,
    "model_dir": None,
    "export_dir": None,
    "tag_set": None,
}


def _train(args, ctx):
    return None


def _defaults(stage) -> dict:
    return {p.name: stage.getOrDefault(p) for p in stage.params}


def test_estimator_has_tfos_params_with_tfos_defaults():
    defaults = _defaults(TFEstimator(_train, {}))
    for name, value in TFOS_ESTIMATOR_DEFAULTS.items():
        assert defaults[name] == value, name
    assert defaults["feed_timeout"] == 600
    assert defaults["signature_def_key"] == "serving_default"
    assert defaults["output_mapping"] == {} and defaults["tag_set"] is None


def test_model_has_tfos_params_and_serves_serving_default():
    defaults = _defaults(TFModel({}))
    assert set(defaults) == set(TFOS_MODEL_DEFAULTS) | {"signature_def_key"}
    for name, value in TFOS_MODEL_DEFAULTS.items():
        assert defaults[name] == value, name
    assert defaults["signature_def_key"] == "serving_default"


@pytest.mark.parametrize(
    ("setter", "getter", "value"),
    [
        ("setInputMapping", "getInputMapping", {"a": "x"}),
        ("setOutputMapping", "getOutputMapping", {"y": "out"}),
        ("setClusterSize", "getClusterSize", 3),
        ("setNumPS", "getNumPS", 1),
        ("setDriverPSNodes", "getDriverPSNodes", True),
        ("setInputMode", "getInputMode", InputMode.TENSORFLOW),
        ("setMasterNode", "getMasterNode", "master"),
        ("setProtocol", "getProtocol", "rdma"),
        ("setGraceSecs", "getGraceSecs", 2.5),
        ("setTensorboard", "getTensorboard", True),
        ("setModelDir", "getModelDir", "/m"),
        ("setExportDir", "getExportDir", "/e"),
        ("setTFRecordDir", "getTFRecordDir", "/t"),
        ("setBatchSize", "getBatchSize", 7),
        ("setEpochs", "getEpochs", 4),
        ("setReaders", "getReaders", 2),
        ("setSteps", "getSteps", 50),
        ("setFeedTimeout", "getFeedTimeout", 30),
        ("setSignatureDefKey", "getSignatureDefKey", "predict"),
        ("setTagSet", "getTagSet", "serve,gpu"),
    ],
)
def test_setters_chain_and_getters_read_back(setter, getter, value):
    estimator = TFEstimator(_train, {})
    assert getattr(estimator, setter)(value) is estimator
    assert getattr(estimator, getter)() == value


def test_input_mode_is_stored_as_a_plain_int_for_json():
    estimator = TFEstimator(_train).setInputMode(InputMode.TENSORFLOW)
    assert type(estimator.getInputMode()) is int and estimator.getInputMode() == 0


@pytest.mark.parametrize(
    ("setter", "value", "expected"),
    [
        ("setClusterSize", 0, "cluster_size must be an integer >= 1. Received: cluster_size=0"),
        ("setBatchSize", True, "batch_size must be an integer >= 1. Received: batch_size=True"),
        ("setNumPS", -1, "num_ps must be an integer >= 0"),
        ("setEpochs", 1.5, "epochs must be an integer >= 1. Received: epochs=1.5"),
        (
            "setInputMode",
            2,
            "input_mode must be InputMode.TENSORFLOW (0) or InputMode.SPARK (1). Received: input_mode=2",
        ),
        ("setMasterNode", "boss", "master_node must be 'chief', 'master' or None. Received: master_node='boss'"),
        ("setFeedTimeout", 0, "feed_timeout must be a number of seconds > 0"),
        ("setGraceSecs", -1, "grace_secs must be a number of seconds >= 0"),
        ("setExportDir", "", "export_dir must be a non-empty string"),
        ("setInputMapping", ["a"], "input_mapping must be a dict of str -> str. Received: input_mapping=['a'] (list)"),
        ("setOutputMapping", {"y": 1}, "output_mapping must map strings to strings"),
    ],
)
def test_bad_values_raise_config_error_naming_param_and_value(setter, value, expected):
    with pytest.raises(ConfigError) as info:
        getattr(TFEstimator(_train), setter)(value)
    assert expected in str(info.value)


def test_none_is_accepted_and_means_not_given():
    estimator = TFEstimator(_train).setMasterNode(None).setExportDir(None)
    assert estimator.getMasterNode() is None and estimator.getExportDir() is None
    estimator.set(estimator.master_node, None)  # Params.set converts None too (used by load)
    assert estimator.getMasterNode() is None


def test_mapping_param_is_a_copy():
    mapping = {"a": "x"}
    model = TFModel().setInputMapping(mapping)
    mapping["b"] = "y"
    assert model.getInputMapping() == {"a": "x"}


def test_namespace_from_dict_namespace_and_argv():
    d = {"string": "foo", "integer": 1, "array": [1, 2], "map": {"a": 1}}
    n1 = Namespace(d)
    assert (n1.string, n1.integer, n1.array, n1.map) == ("foo", 1, [1, 2], {"a": 1})
    assert "string" in n1 and "extra" not in n1
    assert sorted(n1) == sorted(d)
    n2 = Namespace(n1)
    assert n2 == n1 and n2 is not n1
    n3 = Namespace(argparse.Namespace(lr=0.1))
    assert n3.lr == 0.1 and n3 == argparse.Namespace(lr=0.1)
    argv = ["--foo", "1", "--bar", "x"]
    n4 = Namespace(argv)
    assert n4.argv == argv and list(n4) == argv and n4 == argv and "--foo" in n4
    assert Namespace().to_dict() == {} and n4.to_dict() == {"argv": argv}
    assert repr(n1).startswith("Namespace(array=[1, 2], integer=1")


def test_namespace_rejects_other_types_and_names_missing_arguments():
    with pytest.raises(ConfigError, match=r"tf_args must be a dict.*Received: int"):
        Namespace(3)
    with pytest.raises(AttributeError, match=r"args has no 'missing'; it has \['a'\]"):
        Namespace({"a": 1}).missing  # noqa: B018


def test_merge_args_params_params_win_and_args_are_not_modified():
    class Foo(TFParams, HasBatchSize, HasSteps):
        def __init__(self, args):
            super().__init__()
            self.args = args

    args = Namespace({"a": 1, "b": 2, "batch_size": 5})
    merged = Foo(args).setBatchSize(10).setSteps(100).merge_args_params()
    assert merged == Namespace({"a": 1, "b": 2, "batch_size": 10, "steps": 100})
    assert args == Namespace({"a": 1, "b": 2, "batch_size": 5})


def test_estimator_args_hold_every_param_and_argv_is_kept():
    merged = TFEstimator(_train, {"lr": 0.1}).setEpochs(3).merge_args_params()
    assert merged.lr == 0.1 and merged.epochs == 3 and merged.cluster_size == 1
    assert merged.input_mode == 1 and merged.feed_timeout == 600
    argv = TFEstimator(_train, ["--lr", "0.1"]).merge_args_params()
    assert argv.argv == ["--lr", "0.1"] and argv.batch_size == 100


def test_fitted_model_copy_takes_the_shared_params():
    estimator = (
        TFEstimator(_train, {"lr": 0.1})
        .setExportDir("/e")
        .setBatchSize(7)
        .setOutputMapping({"y": "out"})
        .setTagSet("serve")
        .setInputMapping({"c": "x"})
    )
    model = estimator._copyValues(TFModel(estimator.args))
    assert (
        model.getExportDir(),
        model.getBatchSize(),
        model.getOutputMapping(),
        model.getTagSet(),
        model.getInputMapping(),
    ) == ("/e", 7, {"y": "out"}, "serve", {"c": "x"})
    assert model.args.lr == 0.1 and not model.hasParam("cluster_size")


def test_estimator_needs_functions():
    with pytest.raises(ConfigError, match="train_fn is required"):
        TFEstimator(None)
    with pytest.raises(ConfigError, match=r"export_fn must be a function. Received: export_fn='x'"):
        TFEstimator(_train, {}, export_fn="x")


def test_pipeline_module_is_the_tfos_face_of_ml():
    from tfonspark import ml, pipeline

    assert issubclass(pipeline.TFEstimator, ml.TFEstimator) and pipeline.TFModel is ml.TFModel
    assert pipeline.TFEstimator._tfos_face and not ml.TFEstimator._tfos_face  # Keras 2 for TFoS code only
    assert pipeline.Namespace is ml.Namespace
    assert pipeline.TFTypeConverters.toDict({"a": "b"}) == {"a": "b"}


@pytest.mark.parametrize(
    "name",
    [
        "tfonspark.ml",
        "tfonspark.ml.params",
        "tfonspark.ml.binding",
        "tfonspark.ml.inference",
        "tfonspark.ml.savedmodel",
        "tfonspark.ml.model_cache",
        "tfonspark.ml.persistence",
        "tfonspark.ml.estimator",
        "tfonspark.ml.model",
        "tfonspark.pipeline",
    ],
)
def test_exported_members(name):
    module = importlib.import_module(name)
    assert module.__all__ == sorted(module.__all__)
    public = {
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__ and callable(v)
    }
    assert public <= set(module.__all__), public - set(module.__all__)
    for item in module.__all__:
        assert hasattr(module, item)


# ---- the Params are declared by one factory line each: same surface as the hand-written mixins --

#: ``explainParams()`` as the hand-written mixins gave it (captured before the factory).
ESTIMATOR_EXPLAIN = (
    "batch_size: Number of records per batch (default: 100)\n"
    "cluster_size: Number of nodes in the cluster (default: 1)\n"
    "driver_ps_nodes: Run PS nodes on driver locally (default: False)\n"
    "epochs: Number of epochs to train (default: 1)\n"
    "export_dir: Directory to export saved_model (default: None)\n"
    "feed_timeout: Seconds a node may accept no data before the feed fails (default: 600.0)\n"
    "grace_secs: Number of seconds to wait after feeding data (for final tasks like exporting a saved_model) (default: 30.0)\n"
    "input_mapping: Mapping of input DataFrame column to input tensor (default: {})\n"
    "input_mode: Input data feeding mode (0=TENSORFLOW, 1=SPARK) (default: 1)\n"
    "master_node: Job name of master/chief worker node (default: chief)\n"
    "max_restarts: Times the cluster is restarted after a node failure (train_fn resumes from its checkpoints) (default: 0)\n"
    "model_dir: Path to save/load model checkpoints (default: None)\n"
    "num_ps: Number of PS nodes in cluster (default: 0)\n"
    "output_mapping: Mapping of output tensor to output DataFrame column (default: {})\n"
    "protocol: Network protocol for Tensorflow (grpc|rdma) (default: grpc)\n"
    "readers: number of reader/enqueue threads (default: 1)\n"
    "signature_def_key: Identifier for a specific saved_model signature (default: serving_default)\n"
    "steps: Maximum number of steps to train (default: 1000)\n"
    "tag_set: Comma-delimited list of tags identifying a saved_model metagraph (default: None)\n"
    "tensorboard: Launch tensorboard process (default: False)\n"
    "tfrecord_dir: Path to temporarily export a DataFrame as TFRecords (for InputMode.TENSORFLOW apps) (default: None)"
)

MODEL_EXPLAIN = (
    "batch_size: Number of records per batch (default: 100)\n"
    "export_dir: Directory to export saved_model (default: None)\n"
    "input_mapping: Mapping of input DataFrame column to input tensor (default: {})\n"
    "model_dir: Path to save/load model checkpoints (default: None)\n"
    "output_mapping: Mapping of output tensor to output DataFrame column (default: {})\n"
    "signature_def_key: Identifier for a specific saved_model signature (default: serving_default)\n"
    "tag_set: Comma-delimited list of tags identifying a saved_model metagraph (default: None)"
)


def _mixins() -> list[type]:
    return [getattr(params_module, n) for n in params_module.__all__ if n.startswith("Has")]


def test_explain_params_is_unchanged():
    assert TFEstimator(_train, {}).explainParams() == ESTIMATOR_EXPLAIN
    assert TFModel({}).explainParams() == MODEL_EXPLAIN


@pytest.mark.parametrize("mixin", _mixins(), ids=lambda m: m.__name__)
def test_each_mixin_has_set_and_get_named_after_it_for_each_param(mixin):
    declared = {name: value for name, value in vars(mixin).items() if isinstance(value, Param)}
    accessors = {name for name in vars(mixin) if name.startswith(("set", "get"))}
    assert declared and len(accessors) == 2 * len(declared)
    stem = mixin.__name__.removeprefix("Has")
    assert {f"set{stem}", f"get{stem}"} <= accessors  # HasNumPS also has set/getDriverPSNodes
    for attr, param in declared.items():
        assert attr == param.name and param.doc and param.parent == "undefined"
    for name in accessors:
        assert getattr(mixin, name).__qualname__ == f"{mixin.__name__}.{name}"


@pytest.mark.parametrize("mixin", _mixins(), ids=lambda m: m.__name__)
def test_each_setter_and_getter_pair_serves_one_param_of_its_mixin(mixin):
    declared = {value.name for value in vars(mixin).values() if isinstance(value, Param)}
    touched = set()
    for setter in (name for name in vars(mixin) if name.startswith("set")):
        stage = getattr(TFEstimator(_train, {}), setter)(None)  # None: "not given", set unchecked
        (param,) = [p.name for p in stage.params if stage.isSet(p)]
        assert getattr(stage, "get" + setter.removeprefix("set"))() is None
        touched.add(param)
    assert touched == declared


def test_bound_accessors_pickle_by_name():
    model = TFModel().setBatchSize(3)  # a bound method pickles as getattr(model, its __name__)
    assert cloudpickle.loads(cloudpickle.dumps(model.getBatchSize))() == 3


def test_copy_and_extract_param_map_keep_values_and_owner():
    estimator = TFEstimator(_train, {}).setEpochs(2)
    copied = estimator.copy({estimator.batch_size: 7})
    values = {p.name: v for p, v in copied.extractParamMap().items()}
    assert values["batch_size"] == 7 and values["epochs"] == 2 and values["feed_timeout"] == 600.0
    assert all(p.parent == copied.uid for p in copied.params)
    assert estimator.getBatchSize() == 100 and copied.getEpochs() == 2


def test_flags_keep_sparks_boolean_converter():
    estimator = TFEstimator(_train)
    assert estimator.tensorboard.typeConverter is TypeConverters.toBoolean
    with pytest.raises(TypeError, match="driver_ps_nodes"):
        estimator.setDriverPSNodes("yes")


# ---- a user's value is never replaced silently (issue 43, item 5) -------------------------------

#: a valid value other than the default, for every Param of TFEstimator (a test keeps it complete)
EXPLICIT = {
    "input_mapping": {"a": "x"},
    "output_mapping": {"y": "out"},
    "cluster_size": 3,
    "num_ps": 1,
    "driver_ps_nodes": True,
    "input_mode": 0,
    "master_node": "master",
    "protocol": "rdma",
    "grace_secs": 2.5,
    "tensorboard": True,
    "model_dir": "/m",
    "export_dir": "/e",
    "tfrecord_dir": "/t",
    "batch_size": 7,
    "epochs": 4,
    "readers": 2,
    "steps": 50,
    "max_restarts": 2,
    "feed_timeout": 30.0,
    "signature_def_key": "predict",
    "tag_set": "serve,gpu",
}
ESTIMATOR_PARAMS = sorted(p.name for p in TFEstimator(_train).params)


def _default(name: str):
    """The estimator's default of Param ``name`` (as stored, after its check)."""
    return TFEstimator(_train).getOrDefault(name)


def _set(stage, values: dict):
    for name, value in values.items():
        stage.set(stage.getParam(name), value)
    return stage


def test_explicit_values_cover_every_param():
    assert sorted(EXPLICIT) == ESTIMATOR_PARAMS
    estimator = _set(TFEstimator(_train), EXPLICIT)
    assert all(estimator.getOrDefault(name) != _default(name) for name in EXPLICIT)


@pytest.mark.parametrize("name", ESTIMATOR_PARAMS)
def test_a_tf_args_value_is_not_replaced_by_a_param_default(name):
    """TFoS replaced it with the Param's default: train_fn (and the feed) used a value nobody chose."""
    estimator = TFEstimator(_train, {name: EXPLICIT[name], "lr": 0.1})
    with pytest.raises(ConfigError) as info:
        estimator.merge_args_params()
    message = str(info.value)
    assert f"tf_args[{name!r}]={EXPLICIT[name]!r}" in message
    assert f"default {_default(name)!r}" in message
    setter = next(n for n in dir(TFEstimator) if n.startswith("set") and n.lower() == "set" + name.replace("_", ""))
    assert f"{setter}({EXPLICIT[name]!r})" in message


@pytest.mark.parametrize("name", ESTIMATOR_PARAMS)
def test_a_param_set_by_the_user_wins_over_tf_args_and_a_default_equal_to_tf_args_is_no_conflict(name):
    estimator = _set(TFEstimator(_train, {name: "from tf_args"}), {name: EXPLICIT[name]})
    assert getattr(estimator.merge_args_params(), name) == EXPLICIT[name]  # documented: a set Param wins
    same = TFEstimator(_train, {name: _default(name)})
    assert getattr(same.merge_args_params(), name) == _default(name)


def test_the_tfos_face_estimator_refuses_the_same_replacement():
    from tfonspark import pipeline

    with pytest.raises(ConfigError, match=r"tf_args\['epochs'\]=5 .*setEpochs\(5\)"):
        pipeline.TFEstimator(_train, argparse.Namespace(epochs=5, lr=0.1)).merge_args_params()
    assert pipeline.TFEstimator(_train, argparse.Namespace(epochs=5)).setEpochs(5).merge_args_params().epochs == 5


@pytest.mark.parametrize("stage", [TFEstimator(_train, {"lr": 0.1}), TFModel({"lr": 0.1})], ids=["estimator", "model"])
def test_a_copy_has_its_own_tf_args(stage):
    copied = stage.copy()
    copied.args.lr = 0.5
    assert stage.args.lr == 0.1
    stage.args.lr = 0.2
    assert copied.args.lr == 0.5
    argv = type(stage)(*([_train] if isinstance(stage, TFEstimator) else []), ["--lr", "1"])
    argv.copy().args.argv.append("--extra")
    assert argv.args.argv == ["--lr", "1"]


def test_copy_keeps_explicit_values_and_what_was_set():
    estimator = _set(TFEstimator(_train, {"lr": 0.1}), {**EXPLICIT, "batch_size": 100})  # 100: the default
    copied = estimator.copy()
    assert {n: copied.getOrDefault(n) for n in EXPLICIT} == {**EXPLICIT, "batch_size": 100}
    assert all(copied.isSet(copied.getParam(n)) for n in EXPLICIT)
    assert copied.copy({copied.epochs: 9}).getEpochs() == 9 and copied.getEpochs() == 4


@pytest.fixture
def local_metadata(monkeypatch):
    """Spark ML's metadata file written and read as a local JSON file (Spark's own writer, no JVM)."""
    import os
    import pathlib

    import pyspark
    from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter
    from pyspark.sql import SparkSession

    class FakeSpark:
        version = pyspark.__version__

    def save(instance, path, sc, extraMetadata=None, paramMap=None):  # noqa: N803 (Spark names)
        text = DefaultParamsWriter._get_metadata_to_save(instance, FakeSpark(), extraMetadata, paramMap)
        os.makedirs(path, exist_ok=True)
        pathlib.Path(path, "metadata").write_text(text)

    def load(path, sc, expectedClassName=""):  # noqa: N803 (Spark names)
        return DefaultParamsReader._parseMetaData(pathlib.Path(path, "metadata").read_text(), expectedClassName)

    monkeypatch.setattr(DefaultParamsWriter, "saveMetadata", staticmethod(save))
    monkeypatch.setattr(DefaultParamsReader, "loadMetadata", staticmethod(load))
    monkeypatch.setattr(SparkSession, "active", classmethod(lambda cls: FakeSpark()))


def test_save_and_load_keep_explicit_values_what_was_set_and_tf_args(tmp_path, local_metadata):
    explicit = {**EXPLICIT, "batch_size": 100}  # set to the default's value: still the user's choice
    estimator = _set(TFEstimator(_train, {"lr": 0.1, "layers": [2, 3]}), explicit)
    estimator.save(str(tmp_path / "e"))
    loaded = TFEstimator.load(str(tmp_path / "e"))
    assert {n: loaded.getOrDefault(n) for n in explicit} == explicit
    assert all(loaded.isSet(loaded.getParam(n)) for n in explicit)
    assert loaded.args == Namespace({"lr": 0.1, "layers": [2, 3]})
    assert loaded.merge_args_params() == estimator.merge_args_params()

    unset = TFEstimator(_train, {"lr": 0.1}).setEpochs(2)
    unset.save(str(tmp_path / "u"))
    back = TFEstimator.load(str(tmp_path / "u"))
    assert [p.name for p in back.params if back.isSet(p)] == ["epochs"]  # defaults stay defaults

    shared = {n: EXPLICIT[n] for n in sorted(p.name for p in TFModel().params)}
    model = _set(TFModel({"k": "v"}), shared)
    model.save(str(tmp_path / "m"))
    model_back = TFModel.load(str(tmp_path / "m"))
    assert {n: model_back.getOrDefault(n) for n in shared} == shared and model_back.args.k == "v"
