"""The Spark data sources (spark/) over stores a real broker wrote.

Most logic is checked without a JVM, by calling the readers' ``partitions()``
and ``read()`` as Spark's planner and tasks do. The tests marked ``spark``
run the same sources inside one session-scoped local[2] SparkSession; they
are skipped without Java or pyspark (``pip install -e '.[dev,spark]'``).
"""
from __future__ import annotations

import collections
import json
import os
import pickle
import runpy
import shutil
import sys
import threading
import time

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from brokerproc import routed_topic, start_broker
from shmq.client import Message, Producer
from shmq.core import records as R
from shmq.core.store import close_clean, open_local
from shmq.spark import sources as S
from shmq.broker.live_view import StoreView

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPICS = {"SparkA": 4, "SparkB": 2}


def _message(i: int, topic: str) -> Message:
    m = Message(topic, ("body %d é" % i).encode() * (1 + i % 7), flag=i % 3)
    if i % 4:
        m.tags = f"tag{i % 5}"
    if i % 3:
        m.keys = [f"k{i}", f"alt{i}"] if i % 2 else f"k{i}"
    if i % 5 == 0:
        m.put_user_property("color", "red" if i % 2 else "blue")
    return m


@pytest.fixture(scope="module")
def sent(tmp_path_factory):
    """A store written by a real broker through the Python client (single
    sends and a batch), then stopped cleanly; and what was sent."""
    tmp = tmp_path_factory.mktemp("spark")
    sent = []
    with start_broker(tmp, mappedFileSizeCommitLog=str(64 << 10), maxMessageSize=str(16 << 10)) as b:
        for t, q in TOPICS.items():
            routed_topic(b, t, q)
        with Producer("spark-test", namesrv_addr=b.namesrv) as p:
            t0 = int(time.time() * 1000)
            for i in range(400):
                m = _message(i, "SparkA" if i % 3 else "SparkB")
                r = p.send(m)
                sent.append((m, r))
            batch = [Message("SparkB", b"batch %d" % i, tags="batch") for i in range(20)]
            r = p.send_batch(batch)
            for k, (m, mid) in enumerate(zip(batch, r.msg_id.split(","))):
                sent.append((m, type(r)(r.status, mid, "", r.queue, r.queue_offset + k)))
            t1 = int(time.time() * 1000)
        store, addr = b.store, b.addr
    return {"store": store, "sent": sent, "t0": t0, "t1": t1, "store_host": addr}


def _read_all(reader, parts=None) -> pa.Table:
    parts = reader.partitions() if parts is None else parts
    parts = [pickle.loads(pickle.dumps(p)) for p in parts]     # as Spark ships them
    batches = [b for p in parts for b in reader.read(p)]
    return pa.Table.from_batches(batches, schema=batches[0].schema) if batches else None


def _rows(table: pa.Table) -> dict[tuple[str, int, int], dict]:
    return {(r["topic"], r["queueId"], r["queueOffset"]): r for r in table.to_pylist()}


def test_every_column_of_every_message_read_back(sent):
    reader = S.ShmqBatchReader({"path": sent["store"], "subscribe": "SparkA,SparkB"})
    table = _read_all(reader)
    assert table.schema == S.to_arrow_schema(S.SCHEMA, timezone="UTC")
    rows = _rows(table)
    assert len(rows) == table.num_rows == len(sent["sent"])
    seg = StoreView.open(sent["store"]).commitlog()
    for m, r in sent["sent"]:
        row = rows[(m.topic, r.queue.queue_id, r.queue_offset)]
        assert row["body"] == m.body
        assert row["tags"] == m.tags
        keys = m.keys if isinstance(m.keys, str) or m.keys is None else " ".join(m.keys)
        assert row["keys"] == keys
        assert row["msgId"] == r.msg_id
        assert row["flag"] == m.flag and row["sysFlag"] == 0
        props = dict(kv.split("\x01") for kv in row["properties"].split("\x02") if kv)
        for k, v in m.properties.items():
            assert props[k] == v
        assert props["UNIQ_KEY"] == r.msg_id
        assert (props.get("TAGS"), props.get("KEYS")) == (m.tags, keys)
        # the record itself, through the independent Python decoder
        stored = R.decode(seg.view(row["commitLogOffset"], row["storeSize"]), 0)
        assert stored.body == m.body and stored.queue_offset == r.queue_offset
        assert stored.properties == props
        born = int(row["bornTimestamp"].timestamp() * 1000)
        store_ts = int(row["storeTimestamp"].timestamp() * 1000)
        assert sent["t0"] - 1 <= born <= store_ts <= sent["t1"] + 1
        assert row["bornHost"].startswith("127.0.0.1:")
        assert row["storeHost"] == sent["store_host"]
    seg.close()


def test_properties_as_a_map(sent):
    reader = S.ShmqBatchReader({"path": sent["store"], "subscribe": "SparkA", "includeProperties": "true"})
    table = _read_all(reader)
    assert table.schema.field("properties").type == pa.map_(pa.string(), pa.string())
    for row in table.to_pylist():
        props = dict(row["properties"])
        assert props["UNIQ_KEY"] == row["msgId"]
        assert props.get("TAGS") == row["tags"]


def test_commitlog_format_equals_the_queue_format(sent):
    by_queue = _read_all(S.ShmqBatchReader({"path": sent["store"], "subscribePattern": ".*"}))
    everything = _read_all(S.ShmqCommitLogReader({"path": sent["store"]}))
    key = ["commitLogOffset"]
    assert everything.sort_by([(k, "ascending") for k in key]).equals(
        by_queue.sort_by([(k, "ascending") for k in key]))
    # one partition per segment with data (64 KiB each; the flusher's
    # preallocated next one has none); smaller ones split at record starts
    parts = S.ShmqCommitLogReader({"path": sent["store"]}).partitions()
    view = StoreView.open(sent["store"])
    assert len(parts) == len([s for s in view.segments if view.data_end(s) > 0]) >= 2
    small = S.ShmqCommitLogReader({"path": sent["store"], "maxBytesPerPartition": str(8 << 10)})
    assert len(small.partitions()) > 2 * len(parts)
    assert _read_all(small).equals(everything)
    only_b = _read_all(S.ShmqCommitLogReader({"path": sent["store"], "subscribe": "SparkB"}))
    assert set(only_b.column("topic").to_pylist()) == {"SparkB"}
    assert only_b.num_rows == sum(1 for m, _ in sent["sent"] if m.topic == "SparkB")


def test_a_user_schema_selects_columns(sent):
    schema = S.StructType([S.SCHEMA["body"], S.SCHEMA["queueOffset"]])
    table = _read_all(S.ShmqBatchReader({"path": sent["store"], "subscribe": "SparkB"}, schema))
    assert table.column_names == ["body", "queueOffset"]
    bad = S.StructType([S.StructField("body", S.StringType())])
    with pytest.raises(S.ShmqSourceError, match="body.*binary"):
        S.ShmqBatchReader({"path": sent["store"], "subscribe": "SparkB"}, bad)


def test_offset_ranges_and_splits(sent):
    view = StoreView.open(sent["store"])
    a0 = view.queues[("SparkA", 0)].max_offset
    opts = {"path": sent["store"], "subscribe": "SparkA",
            "startingOffsets": json.dumps({"SparkA": {"0": 5, "1": -2}}),
            "endingOffsets": json.dumps({"SparkA": {"0": 20, "2": 3}})}
    table = _read_all(S.ShmqBatchReader(opts))
    got = {}
    for r in table.to_pylist():
        got.setdefault(r["queueId"], []).append(r["queueOffset"])
    assert sorted(got[0]) == list(range(5, 20))
    assert sorted(got[1]) == list(range(view.queues[("SparkA", 1)].max_offset))   # -2 .. latest
    assert sorted(got[2]) == [0, 1, 2]
    assert sorted(got[3]) == list(range(view.queues[("SparkA", 3)].max_offset))
    # minPartitions splits big ranges in proportion; together they cover each once
    parts = S.ShmqBatchReader({"path": sent["store"], "subscribe": "SparkA", "minPartitions": "10"}).partitions()
    assert len(parts) >= 10
    covered = sorted((p.queue_id, o) for p in parts for o in range(p.start, p.end))
    assert covered == sorted((q, o) for q in range(4) for o in range(view.queues[("SparkA", q)].max_offset))
    assert a0 > 20


@pytest.mark.parametrize("opts, message", [
    ({}, "subscribe or subscribePattern is required"),
    ({"subscribe": "SparkA", "subscribePattern": "x"}, "only one of"),
    ({"subscribe": "SparkA", "startingOffsets": "{bad"}, "startingOffsets.*expected earliest"),
    ({"subscribe": "SparkA", "endingOffsets": "earliest"}, "endingOffsets=earliest is not allowed"),
    ({"subscribe": "SparkA", "startingOffsets": '{"SparkB": {"0": 1}}'}, "SparkB/0, which is not subscribed"),
    ({"subscribe": "SparkA", "startingOffsets": '{"SparkA": {"9": 1}}'}, "SparkA/9, which the store does not have"),
    ({"subscribe": "SparkA", "minPartitions": "zero"}, "minPartitions.*integer"),
    ({"subscribe": "SparkA", "failOnDataLoss": "maybe"}, "failOnDataLoss.*true or false"),
    ({"subscribe": "SparkA", "subscribePattern": None, "startingOffsets": '{"SparkA": {"0": 30}}',
      "endingOffsets": '{"SparkA": {"0": 10}}'}, "past the ending offset"),
])
def test_bad_options_name_the_problem(sent, opts, message):
    o = {"path": sent["store"], **{k: v for k, v in opts.items() if v is not None}}
    with pytest.raises(S.ShmqSourceError, match=message):
        S.ShmqBatchReader(o).partitions()


def test_not_a_store(tmp_path):
    with pytest.raises(S.ShmqSourceError, match="not a store"):
        S.ShmqBatchReader({"path": str(tmp_path), "subscribe": "x"}).partitions()
    with pytest.raises(S.ShmqSourceError, match="path"):
        S.ShmqCommitLogReader({})


def test_deleted_offsets_fail_or_are_skipped(tmp_path):
    """Retention removed the first segment: reading from offset 0 fails with
    failOnDataLoss (the default) and starts at the first kept offset without."""
    from conftest import small_config
    cfg = small_config(str(tmp_path / "store"), mappedFileSizeCommitLog=64 << 10)
    store, _ = open_local(cfg)
    for i in range(40):
        store.append(R.encode("Gone", [b"x" * 4000], queue_ids=0))
    close_clean(store)
    os.unlink(os.path.join(cfg.storePathRootDir, "commitlog", "0" * 20))
    view = StoreView.open(cfg.storePathRootDir)
    first = view.queues[("Gone", 0)].min_offset
    assert first > 0
    opts = {"path": cfg.storePathRootDir, "subscribe": "Gone", "startingOffsets": '{"Gone": {"0": 0}}'}
    with pytest.raises(S.ShmqSourceError, match="deleted.*failOnDataLoss=false"):
        S.ShmqBatchReader(opts).partitions()
    table = _read_all(S.ShmqBatchReader({**opts, "failOnDataLoss": "false"}))
    assert table.column("queueOffset").to_pylist() == list(range(first, 40))
    # the commitlog format reads what is left
    assert _read_all(S.ShmqCommitLogReader({"path": cfg.storePathRootDir})).num_rows == 40 - first


def test_torn_tail_is_the_end(tmp_path):
    """A crashed store (no broker, garbage after the last record) reads up to
    the last whole record, never past it."""
    from conftest import small_config
    cfg = small_config(str(tmp_path / "store"), mappedFileSizeCommitLog=1 << 20)
    store, _ = open_local(cfg)
    for i in range(10):
        store.append(R.encode("Torn", [b"m%d" % i], queue_ids=0))
    end = store.state.write_pos
    store.cl.write(end, b"\x00\x00\x01\x00garbage!")      # half a record's header
    store.cl.flush(0, end + 16)
    store.close()
    view = StoreView.open(cfg.storePathRootDir)
    assert view.cl_end == end and view.queues[("Torn", 0)].max_offset == 10
    for reader in (S.ShmqCommitLogReader({"path": cfg.storePathRootDir}),
                   S.ShmqBatchReader({"path": cfg.storePathRootDir, "subscribe": "Torn"})):
        assert _read_all(reader).column("body").to_pylist() == [b"m%d" % i for i in range(10)]


def test_a_damaged_record_fails_or_is_skipped_alone(tmp_path):
    """A record whose header was damaged below the flushed position: the
    store still ends where recovery will end it, and both formats fail with
    failOnDataLoss or skip that one record without it (they used to drop the
    rest of the segment, or of the batch)."""
    from conftest import small_config
    cfg = small_config(str(tmp_path / "store"), mappedFileSizeCommitLog=1 << 20)
    store, _ = open_local(cfg)
    rs = [store.append(R.encode("Hurt", [b"h%02d" % i], queue_ids=0)) for i in range(20)]
    close_clean(store)
    with open(os.path.join(cfg.storePathRootDir, "commitlog", "0" * 20), "r+b") as f:
        f.seek(int(rs[7].phy_offset) + 4)
        f.write(b"\0\0\0\0")                                   # its MAGIC
    view = StoreView.open(cfg.storePathRootDir)
    assert view.cl_end == rs[-1].end and view.queues[("Hurt", 0)].max_offset == 20
    want = [b"h%02d" % i for i in range(20) if i != 7]
    for reader in (S.ShmqCommitLogReader, lambda o: S.ShmqBatchReader({**o, "subscribe": "Hurt"})):
        with pytest.raises(S.ShmqSourceError, match="failOnDataLoss=false"):
            _read_all(reader({"path": cfg.storePathRootDir}))
        table = _read_all(reader({"path": cfg.storePathRootDir, "failOnDataLoss": "false"}))
        assert table.column("body").to_pylist() == want


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A broker that stays up for the tests that read beside it, each on a
    topic of its own (one start and stop instead of three, ~3 s each)."""
    with start_broker(tmp_path_factory.mktemp("spark-live"), mappedFileSizeCommitLog=str(1 << 20),
                      maxMessageSize=str(64 << 10)) as b:
        yield b


def test_reads_beside_a_live_broker_stop_at_the_snapshot(live):
    """While producers write, a plan sees a published position and every
    partition reads exactly up to it: whole records, no gaps, no partials."""
    b = live
    routed_topic(b, "Live", 2)
    stop = threading.Event()
    errors = []

    def produce():
        try:
            with Producer("live-writer", namesrv_addr=b.namesrv) as p:
                for i in range(3000):          # bounded
                    if stop.is_set():
                        break
                    p.send(Message("Live", b"live %06d" % i + bytes(200)))
        except Exception as e:     # surfaced below
            errors.append(e)

    t = threading.Thread(target=produce)
    t.start()
    try:
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 3 and time.monotonic() < deadline:
            view = StoreView.open(b.store)
            if not view.queues.get(("Live", 0)):
                time.sleep(0.05)
                continue
            assert view.live
            for reader in (S.ShmqBatchReader({"path": b.store, "subscribe": "Live"}),
                           S.ShmqCommitLogReader({"path": b.store, "subscribe": "Live"})):
                parts = reader.partitions()
                table = _read_all(reader, parts)
                if table is None:
                    continue
                for row in table.to_pylist():
                    assert row["body"][:5] == b"live " and len(row["body"]) == 211
                if isinstance(reader, S.ShmqBatchReader):
                    assert table.num_rows == sum(p.end - p.start for p in parts)
            seen += 1
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors
    assert seen == 3


# ----------------------------------------------------------------- streaming
def _stream(store: str, **extra) -> S.ShmqStreamReader:
    return S.ShmqStreamReader({"path": store, "subscribe": "SparkA", **extra})


def test_stream_offsets_rate_limit_and_available_now(sent):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
    view = StoreView.open(sent["store"])
    latest = {str(q): view.queues[("SparkA", q)].max_offset for q in range(4)}
    r = _stream(sent["store"], startingOffsets="earliest", maxOffsetsPerTrigger="40")
    start = r.initialOffset()
    assert start == {"SparkA": {str(q): 0 for q in range(4)}}
    assert isinstance(r.getDefaultReadLimit(), ReadMaxRows)
    end = r.latestOffset(start, ReadMaxRows(40))
    moved = {q: end["SparkA"][q] - start["SparkA"][q] for q in latest}
    assert sum(moved.values()) <= 40 + 4 and all(v > 0 for v in moved.values())   # shared by backlog
    assert r.latestOffset(start, ReadAllAvailable()) == {"SparkA": latest}
    # reading batch after batch covers everything once
    offsets, rows = start, []
    while True:
        nxt = r.latestOffset(offsets, ReadMaxRows(40))
        if nxt == offsets:
            break
        rows += [(x["queueId"], x["queueOffset"]) for p in r.partitions(offsets, nxt) for b in r.read(p)
                 for x in b.select(["queueId", "queueOffset"]).to_pylist()]
        offsets = nxt
    assert sorted(rows) == sorted((q, o) for q in range(4) for o in range(latest[str(q)]))
    assert len(rows) == len(set(rows))
    # default start is latest; availableNow pins the target
    assert _stream(sent["store"]).initialOffset() == {"SparkA": latest}
    r2 = _stream(sent["store"], startingOffsets="earliest")
    r2.prepareForTriggerAvailableNow()
    assert r2.latestOffset(r2.initialOffset(), ReadAllAvailable()) == {"SparkA": latest}
    with pytest.raises(S.ShmqSourceError, match="batch queries only"):
        _stream(sent["store"], endingOffsets="latest")


def test_rate_limit_shares_by_backlog():
    start = {("T", 0): 0, ("T", 1): 0, ("T", 2): 10}
    latest = {("T", 0): 900, ("T", 1): 100, ("T", 2): 10}
    out = S.rate_limit(start, latest, 100)
    assert out == {("T", 0): 90, ("T", 1): 10, ("T", 2): 10}
    assert S.rate_limit(start, latest, 5000) == latest
    # a tiny share still moves (rounded up) so no queue starves
    assert S.rate_limit({("T", 0): 0, ("T", 1): 0}, {("T", 0): 10_000, ("T", 1): 1}, 10)[("T", 1)] == 1


# ------------------------------------------------------------------- Spark
spark_mark = pytest.mark.spark


def _new_session():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    return (SparkSession.builder.master("local[2]").appName("shmq-tests")
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
            .config("spark.driver.memory", "1g").config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
            .config("spark.sql.codegen.wholeStage", "false")
            .getOrCreate())


_STARTING: dict = {}       # "start": (the thread starting the session, what it left)


@pytest.fixture(scope="module", autouse=True)
def _spark_starts_early(request):
    """Where a Spark test is selected, the JVM starts in a thread as this
    module's first test begins, so its start (7-10 s, most of it the JVM's
    own) overlaps the JVM-less tests above instead of adding to them."""
    if shutil.which("java") is None or not any(
            item.get_closest_marker("spark") for item in request.session.items):
        yield
        return
    out: dict = {}

    def start():
        try:
            out["session"] = _new_session()
        except BaseException as e:          # raised where the session is wanted
            out["error"] = e

    t = threading.Thread(target=start, name="spark-start", daemon=True)
    t.start()
    _STARTING["start"] = (t, out)
    yield
    if _STARTING.pop("start", None):        # no Spark test ran after all
        t.join(120)
        if "session" in out:
            S.stop(out["session"])


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None:
        pytest.skip("Java is not installed (Spark needs Java 17+)")
    started = _STARTING.pop("start", None)
    if started is None:
        session = _new_session()
    else:
        t, out = started
        t.join(300)
        assert not t.is_alive(), "the SparkSession did not start in 300 s"
        if "error" in out:
            raise out["error"]
        session = out["session"]
    session.sparkContext.setLogLevel("ERROR")
    S.register(session)
    yield session
    S.stop(session)


@spark_mark
def test_spark_reads_the_store_exactly(spark, sent):
    df = spark.read.format("shmq").option("path", sent["store"]).option("subscribe", "SparkA,SparkB").load()
    collected = df.collect()
    rows = {(r.topic, r.queueId, r.queueOffset): r for r in collected}
    assert len(rows) == len(sent["sent"])
    for m, r in sent["sent"]:
        row = rows[(m.topic, r.queue.queue_id, r.queue_offset)]
        assert (bytes(row.body), row.tags, row.msgId) == (m.body, m.tags, r.msg_id)
    # the commitlog format reads the same rows, every column, as many times
    # each (a multiset compared here, not with two exceptAll shuffles: ~5 s)
    everything = spark.read.format("shmq-commitlog").option("path", sent["store"]).load()
    assert everything.schema == df.schema

    def multiset(rs):
        return collections.Counter(tuple(bytes(v) if isinstance(v, bytearray) else v for v in r) for r in rs)
    assert multiset(everything.collect()) == multiset(collected)
    tags = {r["tags"]: r["count"] for r in df.groupBy("tags").count().collect()}
    assert tags["batch"] == 20
    maps = spark.read.format("shmq").option("path", sent["store"]).option("subscribe", "SparkA") \
        .option("includeProperties", "true").load()
    assert maps.where("properties['color'] = 'red'").count() == sum(
        1 for m, _ in sent["sent"] if m.properties.get("color") == "red" and m.topic == "SparkA")


@spark_mark
def test_spark_reads_a_store_with_nothing_yet_as_no_rows(spark, tmp_path):
    """A store whose broker has written nothing yet: the plan has no
    partitions, which Spark runs as one placeholder partition; both formats
    read it as no rows (they failed on the placeholder)."""
    from conftest import small_config
    cfg = small_config(str(tmp_path / "store"))
    store, _ = open_local(cfg)
    close_clean(store)
    for fmt, opts in (("shmq", {"subscribePattern": ".*"}), ("shmq-commitlog", {})):
        df = spark.read.format(fmt).option("path", cfg.storePathRootDir).options(**opts).load()
        assert df.count() == 0, fmt


@spark_mark
def test_spark_streaming_available_now_across_a_restart(spark, live, tmp_path):
    """availableNow with a rate limit, more messages, a restart from the
    checkpoint: every message exactly once."""
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    b = live
    routed_topic(b, "Stream", 3)
    with Producer("stream-writer", namesrv_addr=b.namesrv) as p:
        def send(a, z):
            for i in range(a, z):
                p.send(Message("Stream", b"%d" % i))

        def run_once():
            q = (spark.readStream.format("shmq").option("path", b.store).option("subscribe", "Stream")
                 .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "70").load()
                 .selectExpr("CAST(body AS STRING) AS n", "queueId", "queueOffset")
                 .writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
                 .trigger(availableNow=True).start())
            q.awaitTermination(120)
            assert q.exception() is None
            return q

        send(0, 200)
        q = run_once()
        assert len([p for p in q.recentProgress if p["numInputRows"]]) >= 3     # 70 at a time
        send(200, 260)
        run_once()
    got = [int(r.n) for r in spark.read.parquet(out).collect()]
    assert sorted(got) == list(range(260))


@spark_mark
def test_spark_count_while_the_broker_writes(spark, live):
    b = live
    routed_topic(b, "Busy", 2)
    stop = threading.Event()

    def produce():
        with Producer("busy-writer", namesrv_addr=b.namesrv) as p:
            for i in range(20000):          # bounded
                if stop.is_set():
                    return
                p.send(Message("Busy", bytes(100)))

    t = threading.Thread(target=produce)
    t.start()
    try:
        counts = []
        for _ in range(3):
            before = sum(e.max_offset for k, e in StoreView.open(b.store).queues.items() if k[0] == "Busy")
            df = spark.read.format("shmq-commitlog").option("path", b.store).option("subscribe", "Busy").load()
            n = df.where("length(body) = 100").count()
            after = sum(e.max_offset for k, e in StoreView.open(b.store).queues.items() if k[0] == "Busy")
            assert before <= n <= after
            counts.append(n)
    finally:
        stop.set()
        t.join(60)
    assert counts == sorted(counts)


@spark_mark
def test_example_job_writes_parquet_by_tag(spark, sent, tmp_path, monkeypatch):
    """examples/spark_tags.py, run in this process: its getOrCreate() finds
    the test session instead of starting a second JVM."""
    out = str(tmp_path / "by_tag")
    monkeypatch.setattr(sys, "argv", ["spark_tags.py", sent["store"], "SparkA", out])
    runpy.run_path(os.path.join(ROOT, "examples", "spark_tags.py"), run_name="__main__")
    counts = {row.tags: row["count"] for row in spark.read.parquet(out).collect()}
    expect = {}
    for m, _ in sent["sent"]:
        if m.topic == "SparkA":
            expect[m.tags] = expect.get(m.tags, 0) + 1
    assert counts == expect


@spark_mark
def test_stopping_a_session_waits_for_its_jvm(spark):
    """``stop``, the session's last use (keep this test last): the driver JVM is gone and
    waited for, not left running until this process exits and then left
    defunct, orphaned (SparkSession.stop alone keeps it)."""
    from pyspark import SparkContext
    jvm = SparkContext._gateway.proc
    S.stop(spark)
    assert jvm.returncode is not None                 # waited for: reaped, no zombie
    assert SparkContext._gateway is None
    S.stop(spark)                                     # the fixture's stop after it: nothing to do
