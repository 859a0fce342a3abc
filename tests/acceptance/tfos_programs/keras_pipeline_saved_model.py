"""TFoS 2.x's own pipeline test of a saved model (``test_pipeline.py::test_spark_saved_model``), as a program.

What makes it hard: the Keras classes are imported on the driver at module level, after the
TFoS imports, and ``train_fn`` (pickled by value, a test's nested function in TFoS) carries
them to the nodes, which run Keras 2; and the optimizer is ``Adam(lr=0.2)``, the Keras 2
spelling that tf_keras 2.11+ ignores (it would train at 0.001 and miss the weights). A linear
model learns ``y = 3.14 * a + 1.618 * b`` from 1,000 rows fed one at a time under
MultiWorkerMirroredStrategy; TFModel serves the export by TFoS's signature names
(``dense_input`` -> ``dense``). The acceptance test changes only the import lines.
"""

# TFoS's order, on purpose: the face first, then Keras at module level (isort would swap them)
import numpy as np  # noqa: I001
from tensorflowonspark import compat
from tensorflowonspark.pipeline import TFEstimator
from tensorflow.keras import Sequential
from tensorflow.keras.layers import Dense

WEIGHTS = [3.14, 1.618]
ROWS = 1000


def examples():
    rng = np.random.RandomState(1234)
    features = rng.rand(ROWS, 2)
    labels = features @ np.array(WEIGHTS)
    return [(features[i].tolist(), [float(labels[i])]) for i in range(ROWS)]


def main(spark, args):
    """Train with TFEstimator, export, and serve ``[1.0, 1.0]`` with the TFModel ``fit`` returns.

    Returns the prediction (expected: the sum of WEIGHTS). Each node also writes, to
    ``model_dir/<job><index>.txt``, its model's module and its optimizer's learning rate."""

    def train_fn(args, ctx):
        import tensorflow as tf
        from tensorflowonspark import TFNode

        strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = Sequential()
            model.add(Dense(1, activation="linear", input_shape=[2]))
            optimizer = tf.keras.optimizers.Adam(lr=0.2)
            model.compile(optimizer=optimizer, loss="mse", metrics=["mse"])

        tf_feed = TFNode.DataFeed(ctx.mgr, input_mapping=args.input_mapping)

        def rows():
            while not tf_feed.should_stop():
                batch = tf_feed.next_batch(1)
                if len(batch["x"]) == 0:
                    return
                yield batch["x"][0], batch["y_"][0]

        ds = tf.data.Dataset.from_generator(rows, (tf.float32, tf.float32), (tf.TensorShape([2]), tf.TensorShape([1])))
        options = tf.data.Options()
        compat.disable_auto_shard(options)  # fed rows are already split between the workers
        ds = ds.with_options(options).batch(args.batch_size)

        steps_per_epoch = ROWS * 0.9 // (args.batch_size * ctx.num_workers)  # partitions are uneven
        tf.io.gfile.makedirs(args.model_dir)
        checkpoint = tf.keras.callbacks.ModelCheckpoint(
            filepath=args.model_dir + "/weights-{epoch:04d}", save_weights_only=True, load_weights_on_restart=True
        )
        model.fit(ds, epochs=args.epochs, steps_per_epoch=steps_per_epoch, callbacks=[checkpoint])
        with open(f"{args.model_dir}/{ctx.job_name}{ctx.task_index}.txt", "w") as out:
            out.write(f"{type(model).__module__} {tf.keras.backend.get_value(optimizer.learning_rate)}")
        compat.export_saved_model(model, args.export_dir, ctx.job_name == "chief")
        tf_feed.terminate()

    train = spark.sparkContext.parallelize(examples(), 2).toDF(["col1", "col2"])
    estimator = (
        TFEstimator(train_fn, {})
        .setInputMapping({"col1": "x", "col2": "y_"})
        .setModelDir(args.model_dir)
        .setExportDir(args.export_dir)
        .setClusterSize(args.cluster_size)
        .setMasterNode("chief")
        .setNumPS(0)
        .setBatchSize(1)
        .setEpochs(1)
    )
    model = estimator.fit(train)

    test = spark.createDataFrame([([1.0, 1.0], [0.0])], ["c1", "c2"])
    model.setTagSet("serve").setSignatureDefKey("serving_default")
    model.setInputMapping({"c1": "dense_input"}).setOutputMapping({"dense": "cout"})
    return model.transform(test).head().cout[0]
