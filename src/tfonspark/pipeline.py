"""TFoS-compatible face: ``tensorflowonspark.pipeline`` names, backed by :mod:`tfonspark.ml`.

Programs change only their import line::

    from tfonspark.pipeline import TFEstimator, TFModel

``TFEstimator(train_fn, tf_args, export_fn=None)`` and ``TFModel(tf_args)`` take the same
arguments and Params (names and defaults) as in TFoS, and ``train_fn(args, ctx)`` receives the
same merged ``args``. Differences: a TFModel keeps the input columns and appends its outputs,
and ``signature_def_key`` defaults to ``serving_default``. TFoS internals (``_run_model``,
``single_node_env``, ``yield_batch``) are not kept. As with ``TFCluster.run``, the nodes run
Keras 2 (``tf_keras``) where it is installed, and so does the driver when this module is imported
before TensorFlow (:mod:`tfonspark._tfos_keras`); ``spark.tfonspark.legacyKeras=off`` keeps Keras 3.
"""

from __future__ import annotations

from typing import Any

from . import _tfos_keras
from .ml import estimator as _estimator
from .ml.model import TFModel
from .ml.params import (
    HasBatchSize,
    HasClusterSize,
    HasEpochs,
    HasExportDir,
    HasFeedTimeout,
    HasGraceSecs,
    HasInputMapping,
    HasInputMode,
    HasMasterNode,
    HasModelDir,
    HasNumPS,
    HasOutputMapping,
    HasProtocol,
    HasReaders,
    HasSignatureDefKey,
    HasSteps,
    HasTagSet,
    HasTensorboard,
    HasTFRecordDir,
    Namespace,
    TFParams,
    TFTypeConverters,
)


class TFEstimator(_estimator.TFEstimator):
    """TFoS ``pipeline.TFEstimator``: :class:`tfonspark.ml.TFEstimator` whose nodes run Keras 2
    (``tf_keras``) where installed, as TFoS ``train_fn`` code expects."""

    _tfos_face = True

    def _fit(self, dataset: Any) -> TFModel:
        _tfos_keras.face_used(dataset.sparkSession.sparkContext)
        runner = self.copy()  # train_fn wrapped for the nodes; this estimator (and what it saves) unchanged
        runner.train_fn = _tfos_keras.FaceMapFun(self.train_fn)
        return _estimator.TFEstimator._fit(runner, dataset)


__all__ = [
    "HasBatchSize",
    "HasClusterSize",
    "HasEpochs",
    "HasExportDir",
    "HasFeedTimeout",
    "HasGraceSecs",
    "HasInputMapping",
    "HasInputMode",
    "HasMasterNode",
    "HasModelDir",
    "HasNumPS",
    "HasOutputMapping",
    "HasProtocol",
    "HasReaders",
    "HasSignatureDefKey",
    "HasSteps",
    "HasTFRecordDir",
    "HasTagSet",
    "HasTensorboard",
    "Namespace",
    "TFEstimator",
    "TFModel",
    "TFParams",
    "TFTypeConverters",
]

_tfos_keras.face_imported()
