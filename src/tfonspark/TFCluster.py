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
"""

from __future__ import annotations

import functools
from typing import Any

from .config import InputMode
from .driver import launch
from .driver.cluster import Cluster

TFCluster = Cluster  # TFoS name of the class returned by run()

__all__ = ["Cluster", "InputMode", "TFCluster", "run"]


@functools.wraps(launch.run)
def run(*args: Any, **kwargs: Any) -> Cluster:
    """TFoS ``TFCluster.run``: :func:`tfonspark.run` with the TFoS face's Keras 2 default."""
    return launch.run(*args, _tfos_face=True, **kwargs)
