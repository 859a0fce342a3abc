"""A TensorFlowOnSpark 2.x style program (InputMode.SPARK): train with TFNode.DataFeed, then infer.

Written exactly as for TFoS; the acceptance test changes only the import line below.
"""

from tensorflowonspark import TFCluster, TFNode


def main_fun(args, ctx):
    import numpy as np
    import tensorflow as tf

    w = tf.Variable(tf.zeros([2, 1]))
    b = tf.Variable(0.0)
    opt = tf.optimizers.SGD(0.1)

    tf_feed = TFNode.DataFeed(ctx.mgr, True)
    while not tf_feed.should_stop():
        batch = tf_feed.next_batch(args["batch_size"])
        if len(batch) == 0:
            continue
        x = np.array([row[0] for row in batch], dtype=np.float32)
        y = np.array([[row[1]] for row in batch], dtype=np.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
    np.save(
        TFNode.hdfs_path(ctx, args["model_dir"]).replace("file://", "") + f"/w{ctx.task_index}.npy",
        np.concatenate([w.numpy().ravel(), [b.numpy()]]),
    )


def inference_fun(args, ctx):
    import numpy as np

    weights = np.load(args["model_dir"] + "/w0.npy")
    tf_feed = TFNode.DataFeed(ctx.mgr, False)
    while not tf_feed.should_stop():
        batch = tf_feed.next_batch(args["batch_size"])
        if len(batch) == 0:
            continue
        x = np.array([row[0] for row in batch], dtype=np.float32)
        tf_feed.batch_results((x @ weights[:2] + weights[2]).tolist())


def main(sc, args):
    data = sc.parallelize(
        [((float(i % 10) / 10, float(i % 7) / 7), 3.0 * (i % 10) / 10 + 2.0 * (i % 7) / 7 + 1.0) for i in range(2000)],
        4,
    )
    cluster = TFCluster.run(sc, main_fun, args, args["cluster_size"], 0, False, TFCluster.InputMode.SPARK)
    cluster.train(data, args["epochs"])
    cluster.shutdown()

    cluster = TFCluster.run(sc, inference_fun, args, args["cluster_size"], 0, False, TFCluster.InputMode.SPARK)
    predictions = cluster.inference(data.map(lambda r: (r[0], 0.0))).collect()
    cluster.shutdown()
    return data.map(lambda r: r[1]).collect(), predictions
