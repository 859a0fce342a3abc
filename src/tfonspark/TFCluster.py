"""TFoS-compatible face: ``TFCluster.run(...)`` and ``TFCluster.InputMode``.

Programs written for TensorFlowOnSpark run after changing only their import line::

    from tfonspark import TFCluster
    cluster = TFCluster.run(sc, main_fun, args, num_executors, num_ps, tensorboard,
                            TFCluster.InputMode.SPARK)
"""

from __future__ import annotations

from .config import InputMode
from .driver.cluster import Cluster
from .driver.launch import run

TFCluster = Cluster  # TFoS name of the class returned by run()

__all__ = ["Cluster", "InputMode", "TFCluster", "run"]
