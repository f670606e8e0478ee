"""Spark bulk ingest from the store's segments (spark/).

One store per run: 2,000,000 messages (200,000 with --quick) of ~300 bytes
(bodies 50-250 B, TAGS/KEYS/UNIQ_KEY properties) over 3 topics × 8 queues,
appended through the store itself. The limit printed beside each Spark
figure is the standalone decode rate measured in the same run — the numba
pass plus the Arrow batch, in this process, no Spark — times the cores
Spark's local[N] runs on: what the ingest could reach if Spark cost nothing.

    spark_decode        the standalone decode rate (one core), the limit's base
    spark_count         spark.read.format("shmq-commitlog").load().count()
    spark_count_queues  the same through the ConsumeQueues (format "shmq")
    spark_parquet       format("shmq-commitlog") → Parquet (snappy), files written

Each figure is the best of a few runs after one warm-up query (Python
workers started, kernels loaded, the JVM's JIT warm). Skipped without
pyspark or Java.
"""
from __future__ import annotations

import os
import shutil
import sys
import time

import numpy as np

from perf import Skipped

TOPICS = ("TopicA", "TopicB", "TopicC")
QUEUES = 8


def _store_here(ctx) -> dict:
    """The run's store, after checking Spark can run here (else Skipped)."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        raise Skipped("pyspark/pyarrow not installed (pip install -e '.[spark]')") from None
    if shutil.which("java") is None:
        raise Skipped("Java is not installed (Spark needs Java 17+)")
    return _store(ctx)


def _store(ctx) -> dict:
    """Build the store once per run."""
    if "spark_store" in ctx.shared:
        return ctx.shared["spark_store"]
    from shmq.core.config import StoreConfig
    from shmq.core.records import encode, properties_bytes
    from shmq.core.store import close_clean, open_local

    n = 200_000 if ctx.quick else 2_000_000
    root = os.path.join(ctx.scratch, "spark-store")
    shutil.rmtree(root, ignore_errors=True)
    store, _ = open_local(StoreConfig(storePathRootDir=root))
    rng = np.random.default_rng(7)
    pool = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    done = k = 0
    while done < n:
        m = min(4096, n - done)
        lens = rng.integers(50, 251, m)
        bodies = [pool[(i * 4099) % 900_000:(i * 4099) % 900_000 + int(ln)] for i, ln in enumerate(lens, done)]
        props = [properties_bytes({"UNIQ_KEY": "%032X" % i}, tags="tag%d" % (i % 10), keys="key%d" % i)
                 for i in range(done, done + m)]
        store.append(encode(TOPICS[k % len(TOPICS)], bodies, queue_ids=(k // len(TOPICS)) % QUEUES,
                            properties=props))
        done += m
        k += 1
    nbytes = store.state.write_pos
    close_clean(store)
    # Measure a store at rest, as an export usually reads one: without this
    # the kernel writes the fresh 600 MB back during the timed runs.
    os.sync()
    info = {"root": root, "messages": n, "bytes": nbytes}
    ctx.shared["spark_store"] = info
    ctx.on_close(lambda: shutil.rmtree(root, ignore_errors=True))
    return info


def _decode_rate(info: dict) -> float:
    """Messages/s of the read path without Spark: every segment scanned,
    decoded and made into Arrow batches, in this process (best of 3)."""
    from shmq.core import records as R
    from shmq.spark import sources as S
    from shmq.broker.live_view import StoreView

    R.warm_up_readers()
    view = StoreView.open(info["root"])
    reader = S.ShmqCommitLogReader({"path": info["root"]})
    parts = reader.partitions()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        n = sum(b.num_rows for p in parts for b in reader.read(p))
        best = min(best, time.perf_counter() - t0)
    if n != info["messages"]:
        raise AssertionError(f"decoded {n} of {info['messages']} messages")
    assert view.cl_end == info["bytes"]
    return n / best


def _session(ctx):
    if "spark" in ctx.shared:
        return ctx.shared["spark"]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from shmq.spark import register, stop
    cores = os.cpu_count() or 2
    spark = (SparkSession.builder.master(f"local[{cores}]").appName("shmq-perf")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(cores)).config("spark.driver.memory", "4g")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    ctx.shared["spark"] = spark
    ctx.shared["spark_cores"] = cores
    ctx.on_close(lambda: stop(spark))      # (once the last bench stopped it: nothing to do)
    return spark


def _limit(ctx, info) -> float:
    if "spark_decode" not in ctx.shared:
        ctx.shared["spark_decode"] = _decode_rate(info)
    return ctx.shared["spark_decode"]


def _best(fn, runs: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run_decode(ctx, result):
    info = _store_here(ctx)
    rate = _limit(ctx, info)
    yield result("spark_decode", rate, "msg/s", rate, "itself (one core: the base of the Spark limits)",
                 mb_per_s=round(rate * info["bytes"] / info["messages"] / 1e6, 1), messages=info["messages"])


def _spark_result(ctx, result, bench, seconds, info, **extra):
    cores = ctx.shared["spark_cores"]
    limit = _limit(ctx, info) * cores
    rate = info["messages"] / seconds
    return result(bench, rate, "msg/s", limit, f"standalone numba decode rate × {cores} cores, same run",
                  mb_per_s=round(info["bytes"] / seconds / 1e6, 1), seconds=round(seconds, 3),
                  messages=info["messages"], **extra)


def run_count(ctx, result):
    info = _store_here(ctx)
    spark = _session(ctx)
    runs = 2 if ctx.quick else 3
    commitlog = spark.read.format("shmq-commitlog").option("path", info["root"])
    queues = spark.read.format("shmq").option("path", info["root"]).option("subscribe", ",".join(TOPICS))
    commitlog.load().count()          # warm-up: Python workers, kernels, the JVM's JIT
    secs, n = _best(lambda: commitlog.load().count(), runs)
    if n != info["messages"]:
        raise AssertionError(f"count() gave {n} of {info['messages']}")
    yield _spark_result(ctx, result, "spark_count", secs, info, format="shmq-commitlog",
                        partitions=commitlog.load().rdd.getNumPartitions())
    secs, n = _best(lambda: queues.load().count(), runs)
    if n != info["messages"]:
        raise AssertionError(f"count() through the queues gave {n} of {info['messages']}")
    yield _spark_result(ctx, result, "spark_count_queues", secs, info, format="shmq",
                        partitions=queues.load().rdd.getNumPartitions())


def run_parquet(ctx, result):
    info = _store_here(ctx)
    spark = _session(ctx)
    out = os.path.join(ctx.scratch, "spark-parquet")
    df = spark.read.format("shmq-commitlog").option("path", info["root"])

    def export():
        df.load().write.mode("overwrite").parquet(out)

    secs, _ = _best(export, 1 if ctx.quick else 2)
    n = spark.read.parquet(out).count()
    written = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out) if f.endswith(".parquet"))
    shutil.rmtree(out, ignore_errors=True)
    if n != info["messages"]:
        raise AssertionError(f"Parquet holds {n} of {info['messages']} messages")
    yield _spark_result(ctx, result, "spark_parquet", secs, info, parquet_mb=round(written / 1e6, 1))
    # the last Spark bench: give the memory (the driver JVM too) and page cache back to the others
    from shmq.spark import stop
    stop(ctx.shared.pop("spark"))
    shutil.rmtree(ctx.shared.pop("spark_store")["root"], ignore_errors=True)
