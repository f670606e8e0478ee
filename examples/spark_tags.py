"""Count a topic's messages by tag with Spark, straight from the store files.

    python examples/spark_tags.py [store_dir] [topic] [out_dir]
"""
import sys

from pyspark.sql import SparkSession
from shmq.tools.spark import register

store, topic, out = (sys.argv[1:] + ["~/store", "TopicTest", "tags.parquet"][len(sys.argv) - 1:])[:3]
spark = SparkSession.builder.master("local[2]").appName("shmq-tags").getOrCreate()
register(spark)   # not needed when shmq[spark] is pip-installed (non-editable)
df = spark.read.format("shmq").option("path", store).option("subscribe", topic).load()
df.groupBy("tags").count().write.mode("overwrite").parquet(out)
