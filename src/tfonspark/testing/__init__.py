"""Reusable test helpers: real Spark masters for tests and demos, several hosts on one machine
(:mod:`.hosts`), and a cluster without Spark."""

from .driver import FakeDriver
from .fakes import FakeAccumulator, FakeRDD, FakeSparkContext, LocalLauncher, fake_nvidia_smi
from .hosts import Hosts
from .ports import free_ports
from .spark import SparkManager, StandaloneCluster, embedded, spark_conf, spark_home

__all__ = [
    "FakeAccumulator",
    "FakeDriver",
    "FakeRDD",
    "FakeSparkContext",
    "Hosts",
    "LocalLauncher",
    "SparkManager",
    "StandaloneCluster",
    "embedded",
    "fake_nvidia_smi",
    "free_ports",
    "spark_conf",
    "spark_home",
]
