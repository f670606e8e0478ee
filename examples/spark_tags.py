"""Count a topic's messages by tag with Spark, straight from the store files:
print the counts and write them to Parquet.

    python examples/spark_tags.py [store_dir] [topic] [out_dir]
"""
import os
import sys

from pyspark.sql import SparkSession
from shmq.spark import register

store, topic, out = (sys.argv[1:] + ["~/store", "TopicTest", "tags.parquet"][len(sys.argv) - 1:])[:3]
spark = SparkSession.builder.master("local[2]").appName("shmq-tags").getOrCreate()
register(spark)   # not needed when shmq[spark] is pip-installed (non-editable)
df = spark.read.format("shmq").option("path", os.path.expanduser(store)).option("subscribe", topic).load()
counts = df.groupBy("tags").count().orderBy("tags").cache()
counts.show(truncate=False)
counts.write.mode("overwrite").parquet(out)
print(f"{counts.count()} tags of {topic} written to {os.path.abspath(out)}")
