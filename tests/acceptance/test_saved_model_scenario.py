"""TFoS's saved-model pipeline scenario on Keras 3 (TFoS test_pipeline.test_spark_saved_model).

Fit y = 3.14*x1 + 1.618*x2 with TFEstimator on 2 nodes (chief + worker, MultiWorkerMirrored
through ``tfonspark.keras.fit``), export a SavedModel, and serve (1, 1) with TFModel: 4.758 to
2 decimals. The train_fn is written the TFoS way: it reads ``args`` (tf_args merged with the
Params) and the fed ``input_mapping`` tensors.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.integration.conftest import by_value

by_value(__name__)

WEIGHTS = np.array([3.14, 1.618])


def _train_fn(args, ctx):
    """Linear regression on the fed columns; every node exports, the chief keeps the model."""
    from tfonspark import distribute

    strategy = distribute.strategy()  # first TensorFlow call of the process
    import keras

    import tfonspark.keras as tfk

    with strategy.scope():
        model = keras.Sequential([keras.Input((2,), name="dense_input"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate), loss="mse")
    feed = ctx.get_data_feed(input_mapping=args.input_mapping)
    dataset = feed.as_dataset(args.batch_size).map(lambda batch: (batch["x"], batch["y_"]))
    # each node trains on its own fed partitions: no auto-sharding
    tfk.fit(model, dataset, epochs=1, shard_policy="off", verbose=0)
    tfk.export_saved_model(model, args.export_dir)


@pytest.mark.slow
def test_fit_export_and_transform_gives_the_known_weights(spark, tmp_path):
    from tfonspark.pipeline import TFEstimator

    rng = np.random.RandomState(1234)
    features = rng.rand(1000, 2)
    labels = features @ WEIGHTS
    train = spark.createDataFrame(
        [(f.tolist(), [float(y)]) for f, y in zip(features, labels)], ["col1", "col2"]
    ).repartition(2)
    export_dir = str(tmp_path / "export")
    estimator = (
        TFEstimator(_train_fn, {"learning_rate": 0.2})
        .setInputMapping({"col1": "x", "col2": "y_"})
        .setExportDir(export_dir)
        .setClusterSize(2)
        .setMasterNode("chief")
        .setBatchSize(10)
        .setEpochs(4)
        .setGraceSecs(0)
    )
    model = estimator.fit(train)
    assert model.getExportDir() == export_dir and model.getBatchSize() == 10

    test = spark.createDataFrame([([1.0, 1.0], [0.0])], ["c1", "c2"])
    model.setTagSet("serve").setSignatureDefKey("serving_default")
    model.setInputMapping({"c1": "dense_input"}).setOutputMapping({"output_0": "cout"})
    result = model.transform(test)
    assert result.columns == ["c1", "c2", "cout"]
    prediction = result.head().cout[0]
    print(f"prediction for (1, 1): {prediction:.5f} (expected {WEIGHTS.sum():.3f})")
    assert prediction == pytest.approx(WEIGHTS.sum(), abs=0.005)  # 4.758 to 2 decimals
