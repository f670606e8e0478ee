"""``spark.read.format("shmq-commitlog")`` with no registration (see pyspark_shmq)."""
from shmq.spark.sources import ShmqCommitLogDataSource as DefaultSource

__all__ = ["DefaultSource"]
