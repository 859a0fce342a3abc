"""tfonspark: distributed TensorFlow training and inference on Apache Spark.

The successor of TensorFlowOnSpark: ``tfonspark.run(sc, map_fun, args, num_executors, ...)``
starts one TensorFlow process per Spark executor and returns a :class:`Cluster` to feed, query
and shut down. TFoS programs keep working through ``from tfonspark import TFCluster, TFNode``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import TFCluster, TFManager, TFNode, TFParallel, compat, errors
    from .config import InputMode
    from .driver.cluster import Cluster
    from .driver.nodes.reports import Report
    from .driver.nodes.restarts import Restart
    from .driver.nodes.stopping import request_stop
    from .driver.runner import run
    from .driver.services.data_service import DataService, data_service
    from .driver.services.ps import PSCluster, ps_cluster
    from .settings import Settings
    from .tfprocess.context import NodeContext, hdfs_path
    from .tfprocess.datafeed import DataFeed, feed_dataset
    from .tfprocess.debugging import Debug

__version__ = "0.1.0"

#: The TFoS faces load on first use: importing one is what tells the driver it runs a TFoS
#: program (its Keras becomes the nodes' Keras 2, see ``_tfos_keras``); ``import tfonspark``
#: alone is the Keras 3 API and changes nothing.
_FACES = ("TFCluster", "TFManager", "TFNode", "TFParallel", "compat")


#: Every other public name loads on first use too (PEP 562): the supervisor and the TF process
#: import ``tfonspark.executor``/``tfonspark.tfprocess`` modules, which runs this ``__init__``;
#: loading the driver (and numpy) here would cost each of them ~0.2 s of start-up for nothing.
#: name -> the module that defines it (the imports under ``TYPE_CHECKING`` above, for mypy).
_LAZY = {
    "Cluster": ".driver.cluster",
    "DataFeed": ".tfprocess.datafeed",
    "DataService": ".driver.services.data_service",
    "Debug": ".tfprocess.debugging",
    "InputMode": ".config",
    "NodeContext": ".tfprocess.context",
    "PSCluster": ".driver.services.ps",
    "Report": ".driver.nodes.reports",
    "Restart": ".driver.nodes.restarts",
    "Settings": ".settings",
    "data_service": ".driver.services.data_service",
    "feed_dataset": ".tfprocess.datafeed",
    "hdfs_path": ".tfprocess.context",
    "ps_cluster": ".driver.services.ps",
    "request_stop": ".driver.nodes.stopping",
    "run": ".driver.runner",
}


def __getattr__(name: str) -> Any:
    if name in _FACES or name == "errors":
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
