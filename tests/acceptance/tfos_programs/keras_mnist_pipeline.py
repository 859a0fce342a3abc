"""A TensorFlowOnSpark 2.x Spark ML Pipeline program: TFEstimator on CSV or TFRecord input, TFModel.

``train_fn`` is a Keras 2 ``model.fit`` under MultiWorkerMirroredStrategy fed through
``TFNode.DataFeed(ctx.mgr)``; TFModel maps the exported signature's TFoS names
(``conv2d_input`` -> ``dense_1``). The acceptance test changes only the import lines.
"""

from tensorflowonspark import dfutil
from tensorflowonspark.pipeline import TFEstimator, TFModel


def main_fun(args, ctx):
    import numpy as np
    import tensorflow as tf
    from tensorflowonspark import TFNode, compat

    strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
    tf_feed = TFNode.DataFeed(ctx.mgr, False)

    def rdd_generator():
        while not tf_feed.should_stop():
            batch = tf_feed.next_batch(1)
            if len(batch) == 0:
                return
            image, label = batch[0]
            label = np.reshape(np.array(label, np.float32), (1,))  # a list of one from TFRecords, an int from CSV
            yield np.reshape(np.array(image, np.float32) / 255.0, (28, 28, 1)), label

    ds = tf.data.Dataset.from_generator(
        rdd_generator, (tf.float32, tf.float32), (tf.TensorShape([28, 28, 1]), tf.TensorShape([1]))
    ).batch(args.batch_size)
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Conv2D(16, 3, activation="relu", input_shape=(28, 28, 1)),
                tf.keras.layers.MaxPooling2D(),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(16, activation="relu"),
                tf.keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile(
            loss="sparse_categorical_crossentropy", optimizer=tf.keras.optimizers.Adam(0.003), metrics=["accuracy"]
        )
    steps_per_epoch = int(args.rows / args.batch_size / ctx.num_workers * 0.9)
    model.fit(ds, epochs=args.epochs, steps_per_epoch=steps_per_epoch, verbose=2)
    compat.export_saved_model(model, args.export_dir, ctx.job_name == "chief")
    tf_feed.terminate()


def train(spark, args):
    sc = spark.sparkContext
    if args.format == "tfr":
        df = dfutil.loadTFRecords(sc, args.images_labels)
    else:

        def parse(ln):
            vec = [int(x) for x in ln.split(",")]
            return (vec[1:], vec[0])

        df = spark.createDataFrame(sc.textFile(args.images_labels).map(parse), ["image", "label"])
    estimator = (
        TFEstimator(main_fun, args)
        .setInputMapping({"image": "image", "label": "label"})
        .setModelDir(args.model_dir)
        .setExportDir(args.export_dir)
        .setClusterSize(args.cluster_size)
        .setEpochs(args.epochs + 1)
        .setBatchSize(args.batch_size)
        .setGraceSecs(5)
    )
    return estimator.fit(df)


def inference(spark, args, df):
    model = (
        TFModel(args)
        .setInputMapping({"image": "conv2d_input"})
        .setOutputMapping({"dense_1": "prediction"})
        .setExportDir(args.export_dir)
        .setBatchSize(args.batch_size)
    )
    return model.transform(df)
