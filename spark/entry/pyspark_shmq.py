"""Spark finds Python data sources in top-level ``pyspark_*`` modules with a
``DefaultSource``: this one makes ``spark.read.format("shmq")`` work with no
registration (``shmq.spark``)."""
from shmq.spark.sources import ShmqDataSource as DefaultSource

__all__ = ["DefaultSource"]
