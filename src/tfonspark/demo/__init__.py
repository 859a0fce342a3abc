"""``python -m tfonspark.demo``: train a CNN on an embedded two-executor Spark and report accuracy.

What it does, offline, on one machine:

1. loads MNIST-style idx files from ``--data`` (or ``$TFONSPARK_DATA``), or else scikit-learn's
   bundled 8x8 digits upsampled to 28x28, and says which (:mod:`.datasets`);
2. starts Spark on ``--master`` (default ``local-cluster[2,1,1024]``: two executor JVMs,
   :mod:`.spark`) and turns the training images into a DataFrame (``image array<float>``,
   ``label bigint``; :mod:`.data`);
3. starts one TensorFlow node per executor (``InputMode.SPARK``) and feeds them the DataFrame for
   ``--epochs`` epochs; the nodes train the same Keras model (:mod:`.model`) under
   ``MultiWorkerMirroredStrategy`` with :func:`tfonspark.keras.fit` (:mod:`.node`), and send
   progress (epoch, step, loss, rows/s) to this console with ``ctx.report`` (:mod:`.progress`);
4. prints the test accuracy and writes ``training_curves.png`` and ``confusion_matrix.png``
   (:mod:`.plots`) to ``--out`` (default ``./demo_output``).

The command line is :mod:`.cli`. The names below are public and are what ``examples/`` and
``benchmarks/`` use; importing this package imports neither TensorFlow nor Spark.
"""

from __future__ import annotations

from .cli import main
from .data import images_to_dataframe, limit_rows, shard, to_features
from .model import DEFAULT_LEARNING_RATE, build_model
from .spark import DEFAULT_MASTER, spark_context, stop_spark

__all__ = [
    "DEFAULT_LEARNING_RATE",
    "DEFAULT_MASTER",
    "build_model",
    "images_to_dataframe",
    "limit_rows",
    "main",
    "shard",
    "spark_context",
    "stop_spark",
    "to_features",
]
