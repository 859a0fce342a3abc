"""TFoS-compatible face: the names of ``tensorflowonspark.dfutil``, backed by
:mod:`tfonspark.data.tfrecord` (pure Python TFRecord I/O, no tensorflow-hadoop jar).

``loadedDF`` maps each DataFrame returned by ``loadTFRecords`` to the directory it was read
from, as in TFoS; entries now disappear when the DataFrame is garbage collected.
TFoS helpers that exposed its internals (``toTFExample``, ``fromTFExample``, ``infer_schema``
taking a ``tf.train.Example``) are not kept; see :func:`tfonspark.data.tfrecord.infer_schema`.
"""

from __future__ import annotations

from . import _tfos_keras
from .data.tfrecord import isLoadedDF, loadTFRecords, saveAsTFRecords
from .data.tfrecord import loaded_dfs as loadedDF

__all__ = ["isLoadedDF", "loadTFRecords", "loadedDF", "saveAsTFRecords"]

_tfos_keras.face_imported()  # a TFoS program: the driver takes the nodes' Keras 2
