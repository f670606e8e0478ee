"""The PySpark data sources over a store's segment files (``pip install shmq[spark]``).

``sources``: ``spark.read.format("shmq")`` (through the ConsumeQueues, batch
and streaming, Kafka-source options) and ``spark.read.format("shmq-commitlog")``
(every record, one partition per segment); ``entry/``: the top-level
``pyspark_shmq*`` modules through which Spark finds them with no
registration. ``register(spark)`` registers both by hand; ``stop(spark)``
stops a session and waits for its JVM (``SparkSession.stop`` leaves it).

They read stores as ``broker.live_view`` opens them (below a running broker's
published positions) with ``core.reader`` and the store's own numba record
parser; nothing here runs in the broker.
"""
from shmq.spark.sources import (SCHEMA, ShmqCommitLogDataSource, ShmqDataSource, ShmqSourceError,
                                register, stop)

__all__ = ["SCHEMA", "ShmqCommitLogDataSource", "ShmqDataSource", "ShmqSourceError", "register",
           "stop"]
