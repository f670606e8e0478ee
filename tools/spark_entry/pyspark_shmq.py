"""Spark finds Python data sources in top-level ``pyspark_*`` modules with a
``DefaultSource``: this one makes ``spark.read.format("shmq")`` work with no
registration (``shmq.tools.spark``)."""
from shmq.tools.spark import ShmqDataSource as DefaultSource

__all__ = ["DefaultSource"]
