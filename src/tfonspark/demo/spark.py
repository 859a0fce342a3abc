"""The Spark the demo and ``examples/mnist`` run on: spark-submit's, or one embedded here."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["DEFAULT_MASTER", "spark_context", "stop_spark"]

DEFAULT_MASTER = "local-cluster[2,1,1024]"
"""Two executor JVMs with one core each, started on this machine."""


def spark_context(master: str | None = None, app_name: str = "tfonspark-demo") -> Any:
    """The SparkContext of the demo and of ``examples/mnist``.

    ``master=None`` means: the master ``spark-submit`` set up when run under it, else
    :data:`DEFAULT_MASTER`. Other masters get a context tuned for one machine by
    :class:`tfonspark.testing.SparkManager`: ``local[N]``, ``local-cluster[N,cores,MB]`` (its
    executors start here) or ``spark://127.0.0.1:PORT`` (a standalone cluster on this host).
    """
    from pyspark import SparkContext

    from ..testing import SparkManager

    if master is None and os.environ.get("PYSPARK_GATEWAY_PORT"):  # launched by spark-submit
        return SparkContext.getOrCreate()
    return SparkManager.instance().get(master or DEFAULT_MASTER, spark__app__name=app_name)


def stop_spark(sc: Any) -> None:
    """Stop ``sc`` (and, for an embedded cluster, its executors)."""
    from ..testing import SparkManager

    manager = SparkManager.instance()
    if manager.sc is sc:
        manager.stop()
    else:
        sc.stop()
