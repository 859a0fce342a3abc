"""_tfos_keras.py: the TFoS face's Keras 2 route, on the driver and on its nodes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from tfonspark import _tfos_keras
from tfonspark.importhook import AfterImport
from tfonspark.testing import FakeSparkContext

# ---- the setting and the driver's decision ----------------------------------------------------


# ---- the TF process's environment ---------------------------------------------------------------


# ---- hints ---------------------------------------------------------------------------------------


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


# ---- the driver takes the nodes' Keras 2; lr= is the learning rate (issue 21) ----------------------
# What runs TensorFlow runs in a fresh interpreter: which Keras tf.keras is, and tf_keras' patched
# optimizers, are per process, and this one may have imported TensorFlow already.

_KERAS_ENV = ("TF_USE_LEGACY_KERAS", "TFONSPARK_LEGACY_KERAS", "TFONSPARK_ATTEMPT")


def _python(code: str, timeout: float = 240, **env: str):
    """Run ``code`` in a new interpreter (the Keras variables unset, then ``env``); its last line is JSON."""
    environ = {k: v for k, v in os.environ.items() if k not in _KERAS_ENV}
    environ.update(TF_CPP_MIN_LOG_LEVEL="2", **env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=environ, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_the_tfos_face_imports_no_tensorflow():
    loaded = _python(
        """
        import json, sys
        from tfonspark import TFCluster, TFNode, compat, dfutil, pipeline
        print(json.dumps(sorted(m for m in ("tensorflow", "keras", "tf_keras") if m in sys.modules)))
        """
    )
    assert loaded == []


def test_import_tfonspark_keeps_the_drivers_keras():
    """The core (``tfonspark.run``, ``tfonspark.ml``) is the Keras 3 API: the faces the package
    re-exports are imported with it, and that is not a TFoS program asking for Keras 2."""
    value = _python(
        """
        import json, os
        import tfonspark
        from tfonspark.ml import TFEstimator
        print(json.dumps(os.environ.get("TF_USE_LEGACY_KERAS")))
        """
    )
    assert value is None


_DRIVER_PROGRAM = """
    import json, logging, os, warnings
    lines = []
    class Keep(logging.Handler):
        def emit(self, record):
            lines.append([record.levelname, record.getMessage()])
    logging.getLogger("tfonspark").addHandler(Keep())
    logging.getLogger("tfonspark").setLevel(logging.INFO)

    from tfonspark.pipeline import TFEstimator  # a TFoS program: the face first
    from tfonspark import dfutil  # another face module: still one line
    from tensorflow.keras import Sequential  # then Keras, at module level
    import tensorflow as tf

    out = {"env": os.environ.get("TF_USE_LEGACY_KERAS"), "sequential": Sequential.__module__, "lines": lines}
    names = ["Adam", "SGD", "RMSprop", "Adagrad", "Adadelta", "Adamax", "Nadam", "Ftrl", "AdamW", "Lion", "Adafactor"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["rates"] = {n: float(getattr(tf.keras.optimizers, n)(lr=0.2).learning_rate) for n in names}
    out["warnings"] = sorted({(w.category.__name__, w.filename, "lr=0.2" in str(w.message)) for w in caught})
    out["both"] = float(tf.keras.optimizers.Adam(learning_rate=0.1, lr=0.3).learning_rate)  # lr= wins, as in Keras 2
    out["learning_rate"] = float(tf.keras.optimizers.SGD(learning_rate=0.1).learning_rate)
    out["legacy"] = float(tf.keras.optimizers.legacy.Adam(lr=0.2).learning_rate)
    out["from_config"] = float(tf.keras.optimizers.get({"class_name": "Adam", "config": {"lr": 0.2}}).learning_rate)

    class NoRate(tf.keras.optimizers.Optimizer):  # never builds a learning rate from what it is given
        def __init__(self, **kwargs):
            super().__init__(name="NoRate", **kwargs)

    try:
        NoRate(lr=0.2).build([tf.Variable(1.0)])
        out["no_rate"] = "trained"
    except Exception as exc:
        out["no_rate"] = type(exc).__name__ + ": " + str(exc)
    print(json.dumps(out))
"""


def test_a_face_imported_before_tensorflow_gives_the_driver_keras_2_and_lr():
    out = _python(_DRIVER_PROGRAM)
    assert out["env"] == "1" and out["sequential"].startswith("tf_keras.")
    [(level, line)] = out["lines"]  # one line, saying so and how to opt out
    assert level == "INFO" and "driver uses Keras 2" in line and "TFONSPARK_LEGACY_KERAS=off" in line
    assert out["rates"] == {name: pytest.approx(0.2) for name in out["rates"]}
    assert out["warnings"] == [["UserWarning", "<string>", True]]  # Keras 2's deprecation, at the user's line
    assert out["both"] == pytest.approx(0.3) and out["learning_rate"] == pytest.approx(0.1)
    assert out["legacy"] == pytest.approx(0.2) and out["from_config"] == pytest.approx(0.2)
    assert out["no_rate"].startswith("ConfigError: NoRate was given lr=0.2") and "learning_rate=" in out["no_rate"]


def test_tf_keras_alone_drops_lr_and_a_tfos_node_gets_it():
    """A Keras 2 TF process (TF_USE_LEGACY_KERAS=1, TFONSPARK_ATTEMPT set) with tf_keras already
    imported (e.g. by unpickling map_fun): the face's map_fun wrapper patches it in place."""
    out = _python(
        """
        import json
        import tensorflow as tf
        from tfonspark import pipeline  # imported on a node: leaves the node's Keras to its supervisor
        from tfonspark._tfos_keras import FaceMapFun

        before = float(tf.keras.optimizers.Adam(lr=0.2).learning_rate)

        def map_fun(args, ctx):
            optimizers = tf.keras.optimizers
            return {n: float(getattr(optimizers, n)(lr=args).learning_rate) for n in ("Adam", "SGD", "RMSprop")}

        print(json.dumps({"before": before, "after": FaceMapFun(map_fun)(0.2, None), "module": tf.keras.__name__}))
        """,
        TF_USE_LEGACY_KERAS="1",
        TFONSPARK_ATTEMPT="0",
    )
    assert out["module"].startswith("tf_keras")
    assert out["before"] == pytest.approx(0.001)  # tf_keras 2.21: lr= logged as deprecated, then dropped
    assert out["after"] == {"Adam": pytest.approx(0.2), "SGD": pytest.approx(0.2), "RMSprop": pytest.approx(0.2)}


def tfos_main_fun(args, ctx):
    """A TFoS main_fun/train_fn that the wrapping tests hand over (it never runs)."""


def record_node_optimizer(args, ctx):
    import tensorflow as tf

    optimizer = tf.keras.optimizers.Adam(lr=0.2)
    Path(args["out"]).write_text(json.dumps([type(optimizer).__module__, float(optimizer.learning_rate)]))


def test_tfcluster_run_nodes_give_keras_2_optimizers_their_lr(tmp_path, monkeypatch):
    """A real TF process started by TFCluster.run (no Spark): Keras 2, and Adam(lr=0.2) at 0.2."""
    pytest.importorskip("tf_keras")
    from tfonspark import TFCluster
    from tfonspark.testing import FakeSparkContext, LocalLauncher

    monkeypatch.setattr(_tfos_keras, "face_used", lambda sc, legacy_keras=None: None)  # pytest is not the driver
    out = tmp_path / "node.json"
    cluster = TFCluster.run(
        FakeSparkContext(),
        record_node_optimizer,
        {"out": str(out)},
        1,
        0,
        reservation_timeout=60,
        launcher=LocalLauncher(),
    )
    cluster.shutdown(timeout=180)
    module, learning_rate = json.loads(out.read_text())
    assert module.startswith("tf_keras.") and learning_rate == pytest.approx(0.2)


# the decision itself, in this process: TensorFlow faked, tf_keras' patching recorded


@pytest.fixture
def driver(monkeypatch):
    monkeypatch.setattr(_tfos_keras._State, "switched", False)
    monkeypatch.setattr(_tfos_keras._State, "said", set())
    monkeypatch.setattr(_tfos_keras, "_tf_keras_installed", lambda: True)
    shims: list[int] = []
    monkeypatch.setattr(_tfos_keras, "install_lr_shim", lambda: shims.append(1))
    for name in _KERAS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)  # not imported yet
    return shims


def _tensorflow(monkeypatch, legacy: bool) -> None:
    monkeypatch.setitem(sys.modules, "tensorflow", types.SimpleNamespace(_tf_uses_legacy_keras=legacy))


def _lines(caplog) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == _tfos_keras.__name__]


def test_the_driver_switches_once_before_tensorflow(driver, caplog):
    with caplog.at_level(logging.INFO, logger=_tfos_keras.__name__):
        _tfos_keras.face_imported()
        _tfos_keras.face_used(FakeSparkContext())  # TFCluster.run / TFEstimator.fit look again: nothing new
    assert os.environ["TF_USE_LEGACY_KERAS"] == "1" and driver
    [(level, line)] = _lines(caplog)
    assert level == "INFO" and "spark.tfonspark.legacyKeras=off" in line


def test_tensorflow_imported_with_keras_3_first_is_a_warning_not_a_mix(driver, caplog, monkeypatch):
    _tensorflow(monkeypatch, legacy=False)
    _tfos_keras.face_imported()
    _tfos_keras.face_used(FakeSparkContext())
    [(level, line)] = _lines(caplog)
    assert level == "WARNING" and "fail when map_fun uses them" in line and "before TensorFlow" in line
    assert "TF_USE_LEGACY_KERAS" not in os.environ and not driver


def test_the_users_own_tf_use_legacy_keras_is_respected(driver, caplog, monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    _tfos_keras.face_imported()
    [(level, line)] = _lines(caplog)
    assert level == "WARNING" and "TF_USE_LEGACY_KERAS='0'" in line
    assert os.environ["TF_USE_LEGACY_KERAS"] == "0" and not driver
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")  # Keras 2 already: only lr= to fix, nothing to say
    caplog.clear()
    _tfos_keras.face_imported()
    assert driver == [1] and _lines(caplog) == []


def test_legacy_keras_off_keeps_keras_3_and_takes_the_switch_back(driver, caplog, monkeypatch):
    monkeypatch.setenv("TFONSPARK_LEGACY_KERAS", "off")
    _tfos_keras.face_imported()
    assert "TF_USE_LEGACY_KERAS" not in os.environ
    monkeypatch.delenv("TFONSPARK_LEGACY_KERAS")
    _tfos_keras.face_used(FakeSparkContext({"spark.tfonspark.legacyKeras": "off"}))
    assert "TF_USE_LEGACY_KERAS" not in os.environ
    _tfos_keras.face_imported()  # switched at import, then run(legacy_keras=False) before TensorFlow
    _tfos_keras.face_used(FakeSparkContext(), legacy_keras=False)
    assert "TF_USE_LEGACY_KERAS" not in os.environ
    _tfos_keras.face_imported()  # ... and after TensorFlow took Keras 2: too late, said
    _tensorflow(monkeypatch, legacy=True)
    _tfos_keras.face_used(FakeSparkContext(), legacy_keras=False)
    assert [level for level, _ in _lines(caplog)] == ["WARNING"]
    assert "legacy_keras=off" in _lines(caplog)[0][1]


def test_nodes_package_imports_and_missing_tf_keras_are_left_alone(driver, monkeypatch):
    import tfonspark

    monkeypatch.setenv("TFONSPARK_ATTEMPT", "0")  # a TF process
    _tfos_keras.face_imported()
    monkeypatch.delenv("TFONSPARK_ATTEMPT")
    monkeypatch.setitem(sys.modules, "pyspark.worker", types.ModuleType("pyspark.worker"))  # a Spark worker
    _tfos_keras.face_imported()
    monkeypatch.delitem(sys.modules, "pyspark.worker")
    monkeypatch.setattr(tfonspark.__spec__, "_initializing", True, raising=False)  # `import tfonspark`
    _tfos_keras.face_imported()
    monkeypatch.setattr(tfonspark.__spec__, "_initializing", False, raising=False)
    monkeypatch.setattr(_tfos_keras, "_tf_keras_installed", lambda: False)
    _tfos_keras.face_imported()
    assert "TF_USE_LEGACY_KERAS" not in os.environ and not driver


def test_tfcluster_run_and_tfestimator_hand_the_nodes_a_wrapped_function(monkeypatch):
    from tfonspark import TFCluster, pipeline
    from tfonspark.ml import estimator

    seen: list[tuple] = []
    monkeypatch.setattr(_tfos_keras, "face_used", lambda sc, legacy_keras=None: seen.append(("face", legacy_keras)))
    unstarted = types.SimpleNamespace(start=lambda handle: None)  # the plan TFCluster.run would start
    monkeypatch.setattr(TFCluster, "prepare", lambda sc, fn, *a, **kw: seen.append(("run", fn, (a, kw))) or unstarted)
    TFCluster.run(FakeSparkContext(), tfos_main_fun, {}, 2, 0, legacy_keras="off")
    (_, keras), (_, fn, (args, kwargs)) = seen
    assert keras == "off" and isinstance(fn, _tfos_keras.FaceMapFun) and fn.fn is tfos_main_fun
    assert args[3].given() == {"legacy_keras": "off"} and kwargs["tfos_face"] is True
    seen.clear()
    TFCluster.run(FakeSparkContext(), "not callable", {}, 2, 0)
    assert seen[1][1] == "not callable"  # run() names the mistake

    monkeypatch.setattr(estimator.TFEstimator, "_fit", lambda self, dataset: seen.append(("fit", self)))
    est = pipeline.TFEstimator(tfos_main_fun, {"a": 1}).setClusterSize(3)
    seen.clear()
    est._fit(types.SimpleNamespace(sparkSession=types.SimpleNamespace(sparkContext=FakeSparkContext())))
    (_, keras), (_, runner) = seen
    assert isinstance(runner.train_fn, _tfos_keras.FaceMapFun) and runner.train_fn.fn is tfos_main_fun
    assert runner.getClusterSize() == 3 and runner.args == est.args
    assert est.train_fn is tfos_main_fun  # what the estimator saves stays the user's function


def test_face_map_fun_pickles_and_patches_only_under_keras_2(monkeypatch):
    from pyspark import cloudpickle

    shims: list[int] = []
    monkeypatch.setattr(_tfos_keras, "install_lr_shim", lambda: shims.append(1))
    fn = cloudpickle.loads(cloudpickle.dumps(_tfos_keras.FaceMapFun(tfos_main_fun)))
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    assert fn.fn is tfos_main_fun and not shims
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    called: list[tuple] = []
    _tfos_keras.FaceMapFun(lambda args, ctx: called.append((args, ctx)) or "done")("args", "ctx")
    assert shims == [1] and called == [("args", "ctx")]


_FAKE_OPTIMIZERS = """
class _BaseOptimizer:  # tf_keras' protocol: __init__ -> _process_kwargs, then _build_learning_rate
    def __init__(self, learning_rate=0.001, **kwargs):
        self._process_kwargs(kwargs)
        self.learning_rate = self._build_learning_rate(learning_rate)

    def _process_kwargs(self, kwargs):
        kwargs.pop("lr", None)  # what tf_keras 2.21 does, after logging a deprecation

    def _build_learning_rate(self, learning_rate):
        return learning_rate

    def build(self, var_list):
        return var_list
"""


def test_the_lr_shim_patches_tf_keras_when_it_is_imported_then_unhooks(tmp_path, monkeypatch):
    (tmp_path / "fake_tf_keras_optimizer.py").write_text(_FAKE_OPTIMIZERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_tfos_keras, "_OPTIMIZERS", "fake_tf_keras_optimizer")
    monkeypatch.setattr(_tfos_keras, "_LR_HOOK", AfterImport({"fake_tf_keras_optimizer"}, _tfos_keras._patch_once))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "fake_tf_keras_optimizer", raising=False)
    _tfos_keras.install_lr_shim()
    _tfos_keras.install_lr_shim()  # one hook
    assert sys.meta_path.count(_tfos_keras._LR_HOOK) == 1
    import fake_tf_keras_optimizer as module  # type: ignore[import-not-found]

    assert _tfos_keras._LR_HOOK not in sys.meta_path
    assert type(module.__loader__).__name__ == "SourceFileLoader"  # its own loader, not the hook's
    with pytest.warns(UserWarning, match=r"lr=0\.5"):
        assert module._BaseOptimizer(lr=0.5).learning_rate == 0.5
    assert module._BaseOptimizer(learning_rate=0.1).learning_rate == 0.1
    _tfos_keras.install_lr_shim()  # already imported: patched in place, once
    assert module._BaseOptimizer(lr=None).learning_rate == 0.001  # lr=None: ignored, as tf_keras does


def test_a_tf_keras_without_the_expected_optimizer_base_is_said_not_patched(monkeypatch, caplog):
    monkeypatch.setattr(_tfos_keras._State, "said", set())
    _tfos_keras._patch(types.ModuleType("tf_keras.src.optimizers.optimizer"))
    [(level, line)] = _lines(caplog)
    assert level == "WARNING" and "lr= is ignored; use learning_rate=" in line


def test_tfcluster_run_has_tfos_signature_and_warns_that_queues_are_ignored(monkeypatch):
    """TFoS 2.2.5's positional signature; a non-default ``queues`` warns once, naming it."""
    import inspect
    import warnings

    from tfonspark import TFCluster
    from tfonspark.testing import FakeSparkContext

    params = list(inspect.signature(TFCluster.run).parameters.values())
    assert [p.name for p in params[:14]] == [
        "sc", "map_fun", "tf_args", "num_executors", "num_ps", "tensorboard", "input_mode", "log_dir",
        "driver_ps_nodes", "master_node", "reservation_timeout", "queues", "eval_node", "release_port",
    ]  # fmt: skip
    assert params[4].default is inspect.Parameter.empty and params[11].default == ["input", "output", "error"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[14:-1])
    started = []
    unstarted = types.SimpleNamespace(start=lambda handle: None)  # the plan TFCluster.run would start
    monkeypatch.setattr(TFCluster, "prepare", lambda *args, **kwargs: started.append((args, kwargs)) or unstarted)
    monkeypatch.setattr(_tfos_keras, "face_used", lambda sc, legacy_keras=None: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TFCluster.run(FakeSparkContext(), print, {}, 2, 0, queues=["input", "output", "error"])
    with pytest.warns(UserWarning, match="queues=") as caught:
        TFCluster.run(FakeSparkContext(), print, {}, 2, 1, False, 0, None, False, None, 60, ["input"])
    assert len(caught) == 1
    options = started[-1][0][4]
    assert (options.num_ps, options.reservation_timeout) == (1, 60) and started[-1][1]["tfos_face"] is True
