"""Reusable test helpers: real Spark masters for tests and demos."""

from .spark import SparkManager, StandaloneCluster, spark_conf, spark_home

__all__ = ["SparkManager", "StandaloneCluster", "spark_conf", "spark_home"]
