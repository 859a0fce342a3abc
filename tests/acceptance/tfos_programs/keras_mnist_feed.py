"""A TensorFlowOnSpark 2.x Keras program (InputMode.SPARK), written as TFoS users write them.

``tf.keras`` (Keras 2) ``model.fit`` with ``steps_per_epoch`` under MultiWorkerMirroredStrategy,
fed from an RDD of CSV rows through a ``TFNode.DataFeed(ctx.mgr)`` generator, a
``ModelCheckpoint`` of TF-format weights, and ``compat.export_saved_model`` on every worker.
The acceptance test changes only the import lines.
"""

from tensorflowonspark import TFCluster


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
            yield np.reshape(np.array(image, np.float32) / 255.0, (28, 28, 1)), np.array([label], np.float32)

    ds = tf.data.Dataset.from_generator(
        rdd_generator, (tf.float32, tf.float32), (tf.TensorShape([28, 28, 1]), tf.TensorShape([1]))
    ).batch(args.batch_size)

    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Conv2D(16, 3, activation="relu", input_shape=(28, 28, 1)),
                tf.keras.layers.MaxPooling2D(),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile(
            loss="sparse_categorical_crossentropy", optimizer=tf.keras.optimizers.Adam(0.003), metrics=["accuracy"]
        )

    tf.io.gfile.makedirs(args.model_dir)
    callbacks = [tf.keras.callbacks.ModelCheckpoint(args.model_dir + "/weights-{epoch:04d}", save_weights_only=True)]
    steps_per_epoch = int(args.rows / args.batch_size / ctx.num_workers * 0.9)  # as TFoS's example: 90%
    history = model.fit(ds, epochs=args.epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=2)
    compat.export_saved_model(model, args.export_dir, ctx.job_name == "chief")
    if ctx.job_name == "chief":
        with open(args.model_dir + "/history.txt", "w") as f:
            f.write(f"{type(model).__module__} {history.history['accuracy'][-1]}")
    tf_feed.terminate()


def main(sc, args):
    def parse(ln):
        vec = [int(x) for x in ln.split(",")]
        return (vec[1:], vec[0])

    images_labels = sc.textFile(args.images_labels).map(parse)
    cluster = TFCluster.run(
        sc, main_fun, args, args.cluster_size, num_ps=0, input_mode=TFCluster.InputMode.SPARK, master_node="chief"
    )
    cluster.train(images_labels, args.epochs + 1)  # TFoS's advice: feed extra so that no worker runs dry
    cluster.shutdown()
