"""tfonspark: distributed TensorFlow training and inference on Apache Spark.

The successor of TensorFlowOnSpark: ``tfonspark.run(sc, map_fun, args, num_executors, ...)``
starts one TensorFlow process per Spark executor and returns a :class:`Cluster` to feed, query
and shut down. TFoS programs keep working through ``from tfonspark import TFCluster, TFNode``.
"""

from __future__ import annotations

from . import TFCluster, TFManager, TFNode, TFParallel, compat, errors
from .config import InputMode
from .driver.cluster import Cluster
from .driver.launch import run
from .driver.reports import Report
from .driver.restarts import Restart
from .driver.stopping import request_stop
from .tfprocess.context import NodeContext, hdfs_path
from .tfprocess.datafeed import DataFeed, feed_dataset

__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "DataFeed",
    "InputMode",
    "NodeContext",
    "Report",
    "Restart",
    "TFCluster",
    "TFManager",
    "TFNode",
    "TFParallel",
    "__version__",
    "compat",
    "errors",
    "feed_dataset",
    "hdfs_path",
    "request_stop",
    "run",
]
