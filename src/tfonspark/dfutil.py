"""TFoS-compatible face: the names of ``tensorflowonspark.dfutil``, aliases of
:mod:`tfonspark.data.tfrecord`'s (pure Python TFRecord I/O, no tensorflow-hadoop jar):
``saveAsTFRecords(df, output_dir)`` is ``save_tfrecords``, ``loadTFRecords(sc, input_dir,
binary_features=[])`` is ``load_tfrecords``, ``isLoadedDF`` is ``is_loaded_df`` and ``loadedDF``
is ``loaded_dfs`` (the same objects; ``tests/unit/house/test_doors.py`` checks it).

``loadedDF`` maps each DataFrame returned by ``loadTFRecords`` to the directory it was read
from, as in TFoS; entries now disappear when the DataFrame is garbage collected.
TFoS helpers that exposed its internals (``toTFExample``, ``fromTFExample``, ``infer_schema``
taking a ``tf.train.Example``) are not kept; see :func:`tfonspark.data.tfrecord.infer_schema`.
"""

from __future__ import annotations

from . import _tfos_keras
from .data.tfrecord import is_loaded_df as isLoadedDF
from .data.tfrecord import load_tfrecords as loadTFRecords
from .data.tfrecord import loaded_dfs as loadedDF
from .data.tfrecord import save_tfrecords as saveAsTFRecords

__all__ = ["isLoadedDF", "loadTFRecords", "loadedDF", "saveAsTFRecords"]

_tfos_keras.face_imported()  # a TFoS program: the driver takes the nodes' Keras 2
