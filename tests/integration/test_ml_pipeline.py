"""TFModel and TFEstimator on real Spark executors (local-cluster[2,1,1024]).

* TFModel serves a SavedModel on 4 partitions: columns kept, outputs appended, every row right,
  the model loaded once per Python worker, and a re-export into the same directory served anew.
* A data error on an executor (a null feature) and a typed error raised by ``export_fn`` reach
  the driver as the same InputError, with its column.
* A Pipeline (SQLTransformer + TFEstimator in InputMode.TENSORFLOW) fits: the DataFrame's mapped
  columns go to TFRecords, train_fn reads them from ``args.tfrecord_dir`` and exports a
  ``tf.Module`` with TFNode.export_saved_model; the Pipeline and the PipelineModel save, load
  and serve the same predictions. The saved metadata holds no pickle (train_fn by reference);
  a pickle planted in it is refused by ``PipelineModel.load`` unless ``allow_pickle()`` is on.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tfonspark.config import InputMode
from tfonspark.errors import ConfigError

from .conftest import by_value

by_value(__name__)


def _export_linear(path: str, weights: list[float]) -> None:
    """y = x . w as ``prediction`` ([None]) and x * w as ``scaled`` ([None, 2])."""
    import tensorflow as tf

    from tfonspark import TFNode

    class Linear(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(weights, dtype=tf.float32)

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
        def serve(self, x):
            return {"prediction": tf.linalg.matvec(x, self.w), "scaled": x * self.w}

    module = Linear()
    TFNode.export_saved_model(module, path, signatures={"serving_default": module.serve})


def _cache_stats(spark) -> list[dict]:
    """ModelCache.stats() of the Python workers that run Arrow tasks."""

    def stats(batches):
        import pyarrow as pa

        from tfonspark.ml import ModelCache

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"s": [json.dumps(ModelCache.stats())]})

    rows = spark.range(0, 8, numPartitions=8).mapInArrow(stats, "s string").collect()
    return [json.loads(r.s) for r in rows]


def test_transform_serves_every_row_once_loaded_per_worker(spark, tmp_path, monkeypatch):
    pytest.importorskip("tensorflow")
    from pyspark.sql import functions as F

    from tfonspark.ml import TFModel

    export_dir = str(tmp_path / "linear")
    _export_linear(export_dir, [3.0, -2.0])
    df = spark.range(0, 1000, numPartitions=4).select(
        "id", F.array(F.col("id").cast("double"), F.lit(1.0)).alias("features"), F.lit("k").alias("tag")
    )
    model = (
        TFModel()
        .setExportDir(export_dir)
        .setInputMapping({"features": "x"})
        .setOutputMapping({"prediction": "pred", "scaled": "scaled"})
        .setBatchSize(64)
    )
    out = model.transform(df)
    assert "ArrowEvalPython" in out._jdf.queryExecution().executedPlan().toString()
    assert out.schema.simpleString() == (
        "struct<id:bigint,features:array<double>,tag:string,pred:float,scaled:array<float>>"
    )
    rows = sorted(out.collect(), key=lambda r: r.id)
    assert [r.id for r in rows] == list(range(1000)) and {r.tag for r in rows} == {"k"}
    assert all(r.pred == 3.0 * r.id - 2.0 and r.scaled == [3.0 * r.id, -2.0] for r in rows)

    # a second transform of the same content (all rows computed): no second load
    model.transform(df).write.format("noop").mode("overwrite").save()
    loads = [s["loads"] for s in _cache_stats(spark)]
    holders = [counts for counts in loads if counts]
    assert holders, f"no Python worker reports the model: {loads}"
    assert all(n == 1 for counts in holders for n in counts.values()), loads

    _export_linear(export_dir, [1.0, 1.0])  # same directory, new weights: a new cache id
    again = sorted(model.transform(df).select("id", "pred").collect())
    assert all(r.pred == r.id + 1.0 for r in again)

    from tfonspark.ml import model as model_module  # Spark < 4.1 path: mapInArrow

    monkeypatch.setattr(model_module, "_arrow_udf_available", lambda: False)
    fallback = model.transform(df.where("id < 50"))  # no limit(): it stops Python workers
    assert "MapInArrow" in fallback._jdf.queryExecution().executedPlan().toString()
    assert fallback.columns == ["id", "features", "tag", "pred", "scaled"]
    assert all(r.pred == r.id + 1.0 and r.scaled == [r.id, 1.0] for r in fallback.collect())


def test_executor_errors_come_back_as_the_typed_error(spark, tmp_path):
    """A null feature fails the user's action with Spark's error, which carries the InputError.

    ``transform`` is lazy, so the action is the user's and raises Spark's own exception;
    ``reraise`` rebuilds the InputError with its column. ``export_fn`` runs in a Spark job of
    tfonspark's own, which raises the typed error itself.
    """
    pytest.importorskip("tensorflow")
    from pyspark.sql import functions as F

    from tfonspark.errors import InputError
    from tfonspark.ml import TFModel
    from tfonspark.ml.estimator import _run_export_fn
    from tfonspark.wire.errors import reraise

    export_dir = str(tmp_path / "linear")
    _export_linear(export_dir, [1.0, 1.0])
    features = F.when(F.col("id") == 37, None).otherwise(F.array(F.col("id").cast("double"), F.lit(1.0)))
    df = spark.range(0, 50, numPartitions=1).select("id", features.alias("features"))
    model = TFModel().setExportDir(export_dir).setInputMapping({"features": "x"}).setOutputMapping({"prediction": "p"})
    with pytest.raises(Exception) as failure:
        model.transform(df).collect()
    with pytest.raises(InputError, match="null value") as typed:
        reraise(failure.value)
    assert (typed.value.column, typed.value.partition, typed.value.row) == ("features", 0, 37)

    with pytest.raises(InputError, match="nothing to export") as exported:
        _run_export_fn(spark.sparkContext, _export_nothing, {"k": 1})
    assert exported.value.column == "label"


def _export_nothing(args):
    from tfonspark.errors import InputError

    raise InputError("nothing to export", column="label")


def _least_squares(args, ctx):
    """InputMode.TENSORFLOW train_fn: read the TFRecords, solve, export a tf.Module."""
    import glob
    import json
    import os

    import numpy as np
    import tensorflow as tf

    from tfonspark import TFNode
    from tfonspark.data.tfrecord import read_tfrecord_file

    xs, ys, names = [], [], set()
    for path in sorted(glob.glob(os.path.join(args.tfrecord_dir, "part-*"))):
        for record in read_tfrecord_file(path):
            feature = tf.train.Example.FromString(record).features.feature
            names |= set(feature)
            xs.append(list(feature["features"].float_list.value))
            ys.append(feature["label"].float_list.value[0])
    w = np.linalg.lstsq(np.array(xs), np.array(ys), rcond=None)[0].astype("float32")
    with open(os.path.join(args.model_dir, "seen.json"), "w") as f:
        json.dump({"rows": len(ys), "features": sorted(names), "note": args.note}, f)

    class Linear(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(w)

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
        def serve(self, x):
            return {"prediction": tf.linalg.matvec(x, self.w)}

    module = Linear()
    TFNode.export_saved_model(
        module, args.export_dir, signatures={"serving_default": module.serve}, is_chief=ctx.is_chief
    )


def test_pipeline_fits_in_tensorflow_mode_saves_and_loads(spark, tmp_path):
    pytest.importorskip("tensorflow")
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import SQLTransformer

    from tfonspark.ml import TFEstimator, TFModel

    rng = np.random.default_rng(7)
    x = rng.random((300, 2))
    train = spark.createDataFrame(
        [(float(a), float(b), float(3 * a - 2 * b), "extra") for a, b in x],
        "x1 double, x2 double, label double, note string",
    ).repartition(3)
    features = SQLTransformer(statement="SELECT *, array(x1, x2) AS features FROM __THIS__")
    estimator = (
        TFEstimator(_least_squares, {"note": "from tf_args"})
        .setInputMode(InputMode.TENSORFLOW)
        .setTFRecordDir(str(tmp_path / "tfr"))
        .setInputMapping({"features": "x", "label": "y"})
        .setModelDir(str(tmp_path))
        .setExportDir(str(tmp_path / "export"))
        .setOutputMapping({"prediction": "pred"})
        .setGraceSecs(0)
    )
    pipeline = Pipeline(stages=[features, estimator])
    fitted = pipeline.fit(train)

    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"rows": 300, "features": ["features", "label"], "note": "from tf_args"}
    test = spark.createDataFrame([(1.0, 1.0), (2.0, 0.5)], "x1 double, x2 double")
    served = fitted.transform(test)
    assert served.columns == ["x1", "x2", "features", "pred"]  # label -> y ignored: no such input
    preds = [r.pred for r in served.orderBy("x1").collect()]
    np.testing.assert_allclose(preds, [1.0, 5.0], atol=1e-4)

    pipeline.write().overwrite().save(str(tmp_path / "pipeline"))
    fitted.write().overwrite().save(str(tmp_path / "fitted"))
    loaded_estimator = Pipeline.load(str(tmp_path / "pipeline")).getStages()[1]
    assert isinstance(loaded_estimator, TFEstimator) and loaded_estimator.uid == estimator.uid
    assert loaded_estimator.train_fn.__name__ == "_least_squares"
    assert loaded_estimator.args.note == "from tf_args"
    assert loaded_estimator.getInputMode() == 0 and loaded_estimator.getInputMapping() == {
        "features": "x",
        "label": "y",
    }
    loaded = PipelineModel.load(str(tmp_path / "fitted"))
    assert isinstance(loaded.stages[1], TFModel) and loaded.stages[1].args.note == "from tf_args"
    assert [r.pred for r in loaded.transform(test).orderBy("x1").collect()] == preds

    # no pickle in what was saved (train_fn by reference); a pickle planted there is refused
    # by PipelineModel.load without being unpickled, and loads only with the opt-in
    estimator_meta = _saved_metadata(tmp_path / "pipeline" / "stages" / f"1_{estimator.uid}")
    assert estimator_meta["train_fn"] == {"ref": f"{__name__}:_least_squares"}
    model_dir = tmp_path / "fitted" / "stages" / f"1_{fitted.stages[1].uid}"
    for stage in [*(tmp_path / "pipeline" / "stages").iterdir(), model_dir]:
        assert "pickle" not in json.dumps(_saved_metadata(stage)), stage
    marker = tmp_path / "pwned"
    _tamper_metadata(model_dir, tf_args={"pickle": _touch_pickle(marker)})
    with pytest.raises(ConfigError, match=r"\['tf_args'\] hold a pickle.*runs arbitrary code"):
        PipelineModel.load(str(tmp_path / "fitted"))
    assert not marker.exists()
    from tfonspark.ml.persistence import allow_pickle

    with allow_pickle():
        PipelineModel.load(str(tmp_path / "fitted"))
    assert marker.exists()
    with pytest.raises(
        ConfigError, match="holds a saved tfonspark.ml.estimator.TFEstimator, not a tfonspark.ml.model.TFModel"
    ):
        TFModel.load(str(tmp_path / "pipeline" / "stages" / f"1_{estimator.uid}"))


def _saved_metadata(stage_dir) -> dict:
    """The JSON Spark ML wrote to ``stage_dir/metadata`` (one text part file)."""
    (part,) = (stage_dir / "metadata").glob("part-*")
    return json.loads(part.read_text())


def _tamper_metadata(stage_dir, **fields) -> None:
    """Change saved metadata as an attacker with write access would (dropping Hadoop's .crc)."""
    (part,) = (stage_dir / "metadata").glob("part-*")
    metadata = json.loads(part.read_text())
    metadata.update(fields)
    part.write_text(json.dumps(metadata) + "\n")
    for crc in (stage_dir / "metadata").glob(".*.crc"):
        crc.unlink()


def _touch_pickle(marker) -> str:
    """A base64 pickle of ``{"note": ...}`` whose unpickling creates ``marker``."""
    import base64
    import pathlib
    import pickle

    class Touch:
        def __reduce__(self):
            return (pathlib.Path.touch, (pathlib.Path(marker),))

    return base64.b64encode(pickle.dumps({"note": Touch()})).decode("ascii")
