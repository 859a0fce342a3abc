"""Spark ML face of tfonspark: :class:`TFEstimator` trains on a cluster, :class:`TFModel` serves.

::

    from tfonspark.ml import TFEstimator

    estimator = (TFEstimator(train_fn, {"lr": 0.1})
                 .setInputMapping({"features": "x", "label": "y"})   # fed columns -> tensors
                 .setClusterSize(2).setEpochs(3).setExportDir("/models/m")
                 .setOutputMapping({"output_0": "prediction"}))      # served output -> column
    model = estimator.fit(train_df)        # a TFModel serving /models/m
    model.transform(test_df)               # test_df's columns + prediction

Both are Spark ML stages (``Pipeline``-ready, ``save``/``load``; a saved stage holds no pickle
unless saved with ``allow_pickle=True``, and loading never unpickles without the same opt-in). What ``fit`` hands to
``train_fn(args, ctx)`` is in :mod:`tfonspark.ml.estimator`; how columns bind to a signature in
:mod:`tfonspark.ml.binding`. ``tfonspark.pipeline`` keeps the TFoS module name.
"""

from __future__ import annotations

from .estimator import TFEstimator
from .model import TFModel
from .model_cache import ModelCache
from .params import Namespace, TFParams
from .persistence import allow_pickle

__all__ = ["ModelCache", "Namespace", "TFEstimator", "TFModel", "TFParams", "allow_pickle"]
