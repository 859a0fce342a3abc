"""The Spark the demo and ``examples/mnist`` run on: spark-submit's, or one embedded here."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["DEFAULT_MASTER", "spark_context", "stop_spark"]

DEFAULT_MASTER = "local-cluster[2,1,1024]"
"""Two executor JVMs with one core each, started on this machine."""


def spark_context(master: str | None = None, app_name: str = "tfonspark-demo") -> Any:
    """The SparkContext of the demo and of ``examples/mnist``.

    Under ``spark-submit`` it is the submitted application's: its master, ``--archives``,
    ``spark.pyspark.python`` and every other setting as given (``master``, where given too,
    replaces the submitted master). Otherwise ``master=None`` means :data:`DEFAULT_MASTER`, and
    a master whose executors run on this machine (``local[N]``, ``local-cluster[N,cores,MB]``,
    ``spark://127.0.0.1:PORT``: :func:`tfonspark.testing.embedded`) gets a context tuned for one
    machine by :class:`tfonspark.testing.SparkManager`, the driver on 127.0.0.1 and the executors
    on this Python. Any other master (``spark://other-host:7077``, ``yarn``) gets a plain context:
    no address pinned, the executors' Python from ``PYSPARK_PYTHON`` and Spark's own defaults
    (README, "Running on a cluster": ship the environment).
    """
    from pyspark import SparkConf, SparkContext

    from ..testing import SparkManager, embedded

    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # launched by spark-submit: its conf is the JVM's
        conf = SparkConf()
        if master:
            conf.setMaster(master)
        if not conf.contains("spark.app.name"):
            conf.setAppName(app_name)
        return SparkContext.getOrCreate(conf)
    if master is None or embedded(master):
        return SparkManager.instance().get(master or DEFAULT_MASTER, spark__app__name=app_name)
    return SparkContext.getOrCreate(SparkConf().setMaster(master).setAppName(app_name))


def stop_spark(sc: Any) -> None:
    """Stop ``sc`` (and, for an embedded cluster, its executors)."""
    from ..testing import SparkManager

    manager = SparkManager.instance()
    if manager.sc is sc:
        manager.stop()
    else:
        sc.stop()
