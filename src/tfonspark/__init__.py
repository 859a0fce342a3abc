"""tfonspark: distributed TensorFlow training and inference on Apache Spark.

The successor of TensorFlowOnSpark: ``tfonspark.run(sc, map_fun, args, num_executors, ...)``
starts one TensorFlow process per Spark executor and returns a :class:`Cluster` to feed, query
and shut down. TFoS programs keep working through ``from tfonspark import TFCluster, TFNode``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import errors
from .config import InputMode
from .driver.cluster import Cluster
from .driver.data_service import DataService, data_service
from .driver.ps import PSCluster, ps_cluster
from .driver.reports import Report
from .driver.restarts import Restart
from .driver.runner import run
from .driver.stopping import request_stop
from .settings import Settings
from .tfprocess.context import NodeContext, hdfs_path
from .tfprocess.datafeed import DataFeed, feed_dataset
from .tfprocess.debugging import Debug

if TYPE_CHECKING:
    from . import TFCluster, TFManager, TFNode, TFParallel, compat

__version__ = "0.1.0"

#: The TFoS faces load on first use: importing one is what tells the driver it runs a TFoS
#: program (its Keras becomes the nodes' Keras 2, see ``_tfos_keras``); ``import tfonspark``
#: alone is the Keras 3 API and changes nothing.
_FACES = ("TFCluster", "TFManager", "TFNode", "TFParallel", "compat")


def __getattr__(name: str) -> Any:
    if name in _FACES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Cluster",
    "DataFeed",
    "DataService",
    "Debug",
    "InputMode",
    "NodeContext",
    "PSCluster",
    "Report",
    "Restart",
    "Settings",
    "TFCluster",
    "TFManager",
    "TFNode",
    "TFParallel",
    "__version__",
    "compat",
    "data_service",
    "errors",
    "feed_dataset",
    "hdfs_path",
    "ps_cluster",
    "request_stop",
    "run",
]
