"""TFoS-compatible face: ``TFCluster.run(...)`` and ``TFCluster.InputMode``.

Programs written for TensorFlowOnSpark run after changing only their import line::

    from tfonspark import TFCluster
    cluster = TFCluster.run(sc, main_fun, args, num_executors, num_ps, tensorboard,
                            TFCluster.InputMode.SPARK)

``TFCluster.run`` is :func:`tfonspark.run` for TFoS programs: their nodes run Keras 2
(``tf_keras`` with ``TF_USE_LEGACY_KERAS=1``) where ``tf_keras`` is installed (``pip install
'tfonspark[tfos]'``), as TFoS Keras code expects, and the one ``tensorflow_estimator`` helper
TFoS examples import (``export_lib.get_timestamped_export_dir``) is provided where
``tensorflow_estimator`` (gone since TF 2.16) is not installed. ``legacy_keras=False`` (or
``spark.tfonspark.legacyKeras=off``) keeps Keras 3.

The driver takes the same Keras 2 when this module is imported before TensorFlow, and
``Adam(lr=0.2)`` gets that learning rate in tf_keras as it did in Keras 2 (:mod:`tfonspark._tfos_keras`).
"""

from __future__ import annotations

import functools
from typing import Any

from . import _tfos_keras
from .config import InputMode
from .driver import launch
from .driver.cluster import Cluster

TFCluster = Cluster  # TFoS name of the class returned by run()

__all__ = ["Cluster", "InputMode", "TFCluster", "run"]


@functools.wraps(launch.run)
def run(sc: Any, map_fun: Any, *args: Any, **kwargs: Any) -> Cluster:
    """TFoS ``TFCluster.run``: :func:`tfonspark.run` with the TFoS face's Keras 2 default (driver too)."""
    _tfos_keras.face_used(sc, kwargs.get("legacy_keras"))
    if callable(map_fun):  # else run() says what is wrong with it
        map_fun = _tfos_keras.FaceMapFun(map_fun)
    return launch.run(sc, map_fun, *args, _tfos_face=True, **kwargs)


_tfos_keras.face_imported()
