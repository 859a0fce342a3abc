"""TFModel/TFEstimator save and load: no pickle by default, a tampered file never unpickled.

Spark's metadata I/O (``DefaultParamsWriter.saveMetadata``/``DefaultParamsReader.loadMetadata``,
a one-line text file written through a SparkSession) is replaced by plain files, and
``SparkSession.active()`` by a fake; everything else (the writers, readers, ``Pipeline`` and
``PipelineModel`` persistence) is Spark's and tfonspark's real code.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import pickle
import sys
import threading

import pyspark
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter
from pyspark.sql import SparkSession

from tfonspark.errors import ConfigError
from tfonspark.ml import TFEstimator, TFModel
from tfonspark.ml import persistence as p
from tfonspark.ml.persistence import allow_pickle


class FakeSpark:
    """What the metadata writer asks of a session: its version (and a createDataFrame)."""

    version = pyspark.__version__

    def createDataFrame(self, *args, **kwargs):  # noqa: N802 (Spark name)
        raise AssertionError("not used: metadata goes through local files here")


@pytest.fixture(autouse=True)
def local_metadata(monkeypatch):
    """Spark's metadata file written and read as a local JSON file, no JVM."""

    def save(instance, path, sc, extraMetadata=None, paramMap=None):  # noqa: N803 (Spark names)
        text = DefaultParamsWriter._get_metadata_to_save(instance, FakeSpark(), extraMetadata, paramMap)
        os.makedirs(path, exist_ok=True)
        pathlib.Path(path, "metadata").write_text(text)

    def load(path, sc, expectedClassName=""):  # noqa: N803 (Spark names)
        return DefaultParamsReader._parseMetaData(pathlib.Path(path, "metadata").read_text(), expectedClassName)

    monkeypatch.setattr(DefaultParamsWriter, "saveMetadata", staticmethod(save))
    monkeypatch.setattr(DefaultParamsReader, "loadMetadata", staticmethod(load))
    monkeypatch.setattr(SparkSession, "active", classmethod(lambda cls: FakeSpark()))


def _train(args, ctx):
    return args, ctx


def _export(args):
    return args


class Fns:
    @staticmethod
    def train(args, ctx):
        return "static"


class Touch:
    """A pickle payload that creates ``path`` when unpickled (what an attacker's would do)."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))


def _metadata(path) -> dict:
    return json.loads(pathlib.Path(path, "metadata").read_text())


def _tamper(path, **fields) -> None:
    metadata = _metadata(path)
    metadata.update(fields)
    pathlib.Path(path, "metadata").write_text(json.dumps(metadata))


def _keys(value) -> set[str]:
    """Every dict key anywhere in a JSON value."""
    if isinstance(value, dict):
        return set(value).union(*(_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_keys(v) for v in value))
    return set()


def _pickled(value) -> str:
    return base64.b64encode(pickle.dumps(value)).decode("ascii")


@pytest.fixture
def no_unpickling(monkeypatch):
    """Any pickle.loads in the test fails it."""

    def refuse(*args, **kwargs):
        raise AssertionError("pickle.loads was called")

    monkeypatch.setattr(pickle, "loads", refuse)


# ---- the default format: JSON and references, no pickle --------------------------------------


def test_model_round_trips_without_pickle(tmp_path, no_unpickling):
    model = (
        TFModel({"lr": 0.1, "layers": [2, 3], "name": "m"})
        .setExportDir("/models/m")
        .setInputMapping({"x": "in"})
        .setOutputMapping({"out": "y"})
        .setBatchSize(7)
    )
    model.save(str(tmp_path / "m"))

    saved = _metadata(tmp_path / "m")
    assert "pickle" not in _keys(saved) and "pickle" not in json.dumps(saved)
    assert saved["tf_args"] == {"json": {"lr": 0.1, "layers": [2, 3], "name": "m"}}
    for loaded in (TFModel.load(str(tmp_path / "m")), TFModel.read().load(str(tmp_path / "m"))):
        assert loaded.uid == model.uid and loaded.args == model.args
        assert loaded.getExportDir() == "/models/m" and loaded.getBatchSize() == 7
        assert loaded.getInputMapping() == {"x": "in"} and loaded.getOutputMapping() == {"out": "y"}


def test_estimator_functions_are_saved_by_reference(tmp_path, no_unpickling):
    estimator = TFEstimator(_train, ["--lr", "0.1"], export_fn=_export).setClusterSize(3)
    estimator.write().save(str(tmp_path / "e"))

    saved = _metadata(tmp_path / "e")
    assert "pickle" not in _keys(saved)
    assert saved["train_fn"] == {"ref": f"{__name__}:_train"}
    assert saved["export_fn"] == {"ref": f"{__name__}:_export"}
    loaded = TFEstimator.load(str(tmp_path / "e"))
    assert loaded.train_fn is _train and loaded.export_fn is _export
    assert loaded.args.argv == ["--lr", "0.1"] and loaded.getClusterSize() == 3

    TFEstimator(Fns.train).save(str(tmp_path / "s"))  # a static method has a reference too
    assert _metadata(tmp_path / "s")["export_fn"] is None
    assert TFEstimator.load(str(tmp_path / "s")).train_fn is Fns.train


def test_what_needs_a_pickle_is_refused_at_save_with_how_to_opt_in(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"train_fn=.*lambda.*not a plain module-level name.*"
        r"allow_pickle=True",
    ):
        TFEstimator(lambda args, ctx: None).save(str(tmp_path / "lambda"))
    main_fn = _train.__class__(_train.__code__, {"__name__": "__main__"}, "notebook_fn")
    main_fn.__module__ = "__main__"
    with pytest.raises(ConfigError, match=r"export_fn=.*defined in __main__ \(a notebook"):
        TFEstimator(_train, export_fn=main_fn).save(str(tmp_path / "main"))
    with pytest.raises(
        ConfigError,
        match=r"tf_args cannot be saved as JSON: \{'shape': 'set'\}.*"
        r"allowPickle\(\)",
    ):
        TFModel({"shape": {1, 2}, "ok": 1}).save(str(tmp_path / "set"))
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_save_with_allow_pickle_then_load_needs_the_opt_in_too(tmp_path):
    offset = 3
    estimator = TFEstimator(lambda v, ctx: v + offset, {"shape": {1, 2}})
    estimator.save(str(tmp_path / "e"), allow_pickle=True)
    saved = _metadata(tmp_path / "e")
    assert set(saved["train_fn"]) == {"pickle"} and set(saved["tf_args"]) == {"pickle"}

    with pytest.raises(ConfigError, match=r"\['tf_args', 'train_fn'\] hold a pickle"):
        TFEstimator.load(str(tmp_path / "e"))
    loaded = TFEstimator.load(str(tmp_path / "e"), allow_pickle=True)
    assert loaded.train_fn(1, None) == 4 and loaded.args.shape == {1, 2}
    assert TFEstimator.read().allowPickle().load(str(tmp_path / "e")).train_fn(2, None) == 5
    with allow_pickle():
        assert TFEstimator.load(str(tmp_path / "e")).uid == estimator.uid

    TFModel({"shape": {3}}).write().allowPickle().save(str(tmp_path / "m"))
    assert TFModel.read().allowPickle().load(str(tmp_path / "m")).args.shape == {3}


# ---- tampered files ----------------------------------------------------------------------------


def test_tampered_model_is_refused_before_unpickling(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    TFModel({"lr": 0.1}).save(str(tmp_path / "m"))
    _tamper(tmp_path / "m", tf_args={"pickle": _pickled({"lr": Touch(marker)})})

    with monkeypatch.context() as m:
        m.setattr(pickle, "loads", lambda *a, **k: pytest.fail("pickle.loads was called"))
        for load in (
            lambda: TFModel.load(str(tmp_path / "m")),
            lambda: TFModel.read().load(str(tmp_path / "m")),
            lambda: DefaultParamsReader.loadParamsInstance(str(tmp_path / "m"), None),
        ):
            with pytest.raises(ConfigError) as err:
                load()
            text = str(err.value)
            assert "['tf_args'] hold a pickle" in text and "Unpickling runs arbitrary code" in text
            assert "TFModel.load(path, allow_pickle=True)" in text
            assert "TFModel.read().allowPickle().load(path)" in text
            assert "allow_pickle(): PipelineModel.load(path)" in text
            assert not marker.exists()
        with allow_pickle(False), pytest.raises(ConfigError, match="hold a pickle"):
            TFModel.load(str(tmp_path / "m"))
    assert not marker.exists()

    # the decoder refuses on its own too (not only the reader's check)
    with pytest.raises(ConfigError, match="'tf_args' holds a pickle.*runs arbitrary code"):
        p.decode_args(_metadata(tmp_path / "m")["tf_args"])
    assert not marker.exists()

    assert TFModel.load(str(tmp_path / "m"), allow_pickle=True).args.lr is None  # opted in: runs
    assert marker.exists()


@pytest.mark.parametrize("field", ["train_fn", "export_fn"])
@pytest.mark.parametrize("legacy", [False, True], ids=["pickle", "legacy-base64"])
def test_tampered_estimator_functions_are_refused(tmp_path, no_unpickling, field, legacy):
    marker = tmp_path / "pwned"
    TFEstimator(_train).save(str(tmp_path / "e"))
    payload = _pickled(Touch(marker))
    _tamper(tmp_path / "e", **{field: payload if legacy else {"pickle": payload}})
    with pytest.raises(ConfigError, match=rf"\['{field}'\] hold a pickle.*allow_pickle=True"):
        TFEstimator.load(str(tmp_path / "e"))
    with pytest.raises(ConfigError, match=f"'{field}' holds a pickle"):
        p.decode_function(_metadata(tmp_path / "e")[field], field=field)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("tfonspark.ml.estimator:encode_function", "does not name a function defined there"),  # a re-export
        ("os:system", "is a module of the standard library"),  # a re-export (posix.system), and stdlib
        ("os:__builtins__", "not {'ref': 'module:qualname'}"),  # dunders are never looked up
        ("os:path.__class__", "not {'ref': 'module:qualname'}"),
        ("tfonspark.ml.persistence:FUNCTION_FIELDS", "does not name a function"),  # not callable
        ("os:sep", "is a module of the standard library"),
        ("tfonspark_no_such_module:f", "cannot be loaded: No module named"),
        ("..rel:f", "not {'ref': 'module:qualname'}"),
        ("os.system", "not {'ref': 'module:qualname'}"),
    ],
)
def test_references_must_name_a_callable_defined_there(tmp_path, no_unpickling, ref, message):
    TFEstimator(_train).save(str(tmp_path / "e"))
    _tamper(tmp_path / "e", train_fn={"ref": ref})
    with pytest.raises(ConfigError, match=rf"saved (field )?'?train_fn'? .*{message}"):
        TFEstimator.load(str(tmp_path / "e"))


#: references into the standard library a tampered file could name (issue 43, row 14): every one is
#: refused before its module is imported; before, builtins:exec, posix:system, subprocess:call and
#: others loaded, and loading imported the module
STDLIB_REFERENCES = [
    "builtins:exec",
    "builtins:eval",
    "posix:system",
    "os:system",
    "os:execv",
    "os.path:join",
    "subprocess:call",
    "subprocess:run",
    "sys:exit",
    "shutil:rmtree",
    "importlib:import_module",
    "pickle:loads",
    "marshal:loads",
    "ctypes:CDLL",
    "socket:create_connection",
    "pty:spawn",
    "code:interact",
    "runpy:run_path",
    "webbrowser:open",
    "antigravity:geohash",  # importing it opens a web browser
    "this:x",  # importing it prints
    "multiprocessing.util:spawnv_passfds",
    "xml.etree.ElementTree:parse",
    "_posixsubprocess:fork_exec",
    "encodings:search_function",
]


@pytest.mark.parametrize("ref", STDLIB_REFERENCES)
def test_references_into_the_standard_library_are_refused_before_any_import(tmp_path, no_unpickling, ref):
    module = ref.partition(":")[0]
    was_imported = module in sys.modules
    TFEstimator(_train).save(str(tmp_path / "e"))
    _tamper(tmp_path / "e", train_fn={"ref": ref})
    with pytest.raises(ConfigError) as err:
        TFEstimator.load(str(tmp_path / "e"))
    text = str(err.value)
    assert "train_fn" in text and ref in text
    assert "standard library" in text and "outside the standard library" in text, text
    assert "mypackage.training:train" in text  # what is valid, by example
    assert (module in sys.modules) == was_imported  # refused before importing it
    with pytest.raises(ConfigError, match="standard library"):
        p.decode_function({"ref": ref}, field="export_fn")


@pytest.mark.parametrize("ref", [f"{__name__}:Touch", "tfonspark.ml.params:Namespace"])
def test_a_reference_to_a_class_is_refused(ref):
    """Only functions (and static or class methods) are saved by reference; a class would be
    instantiated by fit (``Touch(args, ctx)``), and one imported from elsewhere is no definition here."""
    with pytest.raises(ConfigError, match="not a function|does not name a function"):
        p.decode_function({"ref": ref}, field="train_fn")


def test_a_standard_library_function_is_not_saved_by_reference():
    import os.path

    with pytest.raises(ConfigError, match="standard library"):
        p.encode_function(os.path.join, field="train_fn")
    assert "pickle" in p.encode_function(os.path.join, allow_pickle=True, field="train_fn")


def test_functions_and_static_methods_of_importable_modules_still_load(tmp_path, no_unpickling):
    assert p.decode_function(p.encode_function(_train)) is _train
    assert p.decode_function(p.encode_function(Fns.train)) is Fns.train


# ---- inside a Pipeline ---------------------------------------------------------------------------


def test_pipeline_and_pipeline_model_round_trip_without_pickle(tmp_path, no_unpickling):
    estimator = TFEstimator(_train, {"note": "n"}).setInputMapping({"a": "x"})
    Pipeline(stages=[estimator]).save(str(tmp_path / "p"))
    (loaded,) = Pipeline.load(str(tmp_path / "p")).getStages()
    assert isinstance(loaded, TFEstimator) and loaded.uid == estimator.uid
    assert loaded.train_fn is _train and loaded.args.note == "n"
    assert loaded.getInputMapping() == {"a": "x"}

    model = TFModel({"note": "m"}).setExportDir("/models/m")
    PipelineModel(stages=[model]).save(str(tmp_path / "pm"))
    (served,) = PipelineModel.load(str(tmp_path / "pm")).stages
    assert isinstance(served, TFModel) and served.args.note == "m"
    assert served.getExportDir() == "/models/m"
    for stage_dir in (tmp_path / "p" / "stages", tmp_path / "pm" / "stages"):
        (saved,) = [_metadata(d) for d in stage_dir.iterdir()]
        assert "pickle" not in _keys(saved)


def test_pipeline_opts_in_with_the_context_manager(tmp_path):
    marker = tmp_path / "pwned"
    pipeline = Pipeline(stages=[TFEstimator(lambda args, ctx: "lambda", {"s": {1}})])
    with pytest.raises(ConfigError, match="cannot be saved"):
        pipeline.save(str(tmp_path / "p"))
    with allow_pickle():
        pipeline.save(str(tmp_path / "p"))
    with pytest.raises(ConfigError, match=r"hold a pickle.*allow_pickle\(\): PipelineModel.load"):
        Pipeline.load(str(tmp_path / "p"))
    with allow_pickle():
        (loaded,) = Pipeline.load(str(tmp_path / "p")).getStages()
    assert loaded.train_fn(None, None) == "lambda" and loaded.args.s == {1}
    assert not p.pickle_allowed()  # the block has ended

    PipelineModel(stages=[TFModel({"lr": 0.1})]).save(str(tmp_path / "pm"))
    (stage_dir,) = (tmp_path / "pm" / "stages").iterdir()
    _tamper(stage_dir, tf_args={"pickle": _pickled({"lr": Touch(marker)})})
    with pytest.raises(ConfigError, match="hold a pickle"):
        PipelineModel.load(str(tmp_path / "pm"))
    assert not marker.exists()
    with allow_pickle():
        PipelineModel.load(str(tmp_path / "pm"))
    assert marker.exists()


def test_allow_pickle_is_per_thread_and_nests():
    seen: list[bool] = []
    with allow_pickle():
        worker = threading.Thread(target=lambda: seen.append(p.pickle_allowed()))
        worker.start()
        worker.join()
        assert p.pickle_allowed()
        with allow_pickle(False):
            assert not p.pickle_allowed()
        assert p.pickle_allowed()
    assert seen == [False] and not p.pickle_allowed()


def test_the_tfos_face_estimator_loads_as_itself(tmp_path, no_unpickling):
    from tfonspark import pipeline

    pipeline.TFEstimator(_train, {"lr": 0.1}).save(str(tmp_path / "tfos"))
    loaded = pipeline.TFEstimator.load(str(tmp_path / "tfos"))
    assert type(loaded) is pipeline.TFEstimator and loaded._tfos_face  # still runs its nodes on Keras 2
    assert loaded.train_fn is _train and loaded.args.lr == 0.1
