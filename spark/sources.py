"""Spark bulk ingest straight from the store's segment files (PySpark ≥ 4.2).

Two Python data sources, found by Spark on its own (``pyspark_shmq*`` modules,
``pip install shmq[spark]``) or registered with ``register(spark)``::

    spark.read.format("shmq").option("path", "/data/store")
         .option("subscribe", "TopicA,TopicB").load()             # through the ConsumeQueues
    spark.read.format("shmq-commitlog").option("path", ...).load()  # every record, by segment
    spark.readStream.format("shmq").option("path", ...).option("subscribe", "TopicA")
         .option("maxOffsetsPerTrigger", 100000).load()           # micro-batches

``shmq`` follows Spark's Kafka source: a topic is a Kafka topic, a queue a
partition, a queue offset an offset. Options (strings, case-insensitive):

  path                   store directory (storePathRootDir)                 required
  subscribe              topics, comma-separated                  one of these two,
  subscribePattern       a regular expression over topic names    for "shmq"
  startingOffsets        earliest | latest | {"TopicA": {"0": 23, "1": -2}}
                         (-2 earliest, -1 latest); batch default earliest, streaming latest
  endingOffsets          latest | {"TopicA": {"0": 50, "1": -1}} (batch only; -1 latest)
  minPartitions          split big queue ranges until there are at least this many
  failOnDataLoss         true: fail when asked-for offsets were deleted or are unreadable;
                         false: skip them                          default true
  includeProperties      true: properties as MAP<STRING,STRING>    default false (the raw
                         RocketMQ string, k\\x01v\\x02...)
  maxOffsetsPerTrigger   streaming: messages per micro-batch at most, split across queues
                         by backlog (availableNow honours it too)
  batchRows              rows per Arrow batch                       default 65536

``shmq-commitlog`` takes ``path``, optionally ``subscribe``/``subscribePattern``
(applied while reading), ``includeProperties``, ``failOnDataLoss``,
``batchRows``, ``maxBytesPerPartition`` (default 128 MiB, as Spark's
maxPartitionBytes) and ``minPartitions``: one partition per segment file (a
record never spans two), a segment larger than that (or than its share of
``minPartitions``) split in equal pieces at record starts its ConsumeQueues
point to; the fastest full export.

Both have one schema (``SCHEMA``; every column nullable). A user schema
(``.schema("topic STRING, body BINARY")``) selects a subset of its columns:
only those cross to the JVM. Reads are safe beside a live broker: every plan
takes a ``StoreView`` and reads only below its published positions. Decoding
is one numba pass per batch (``core.records.decode_columns``, the store's own
record parser) into Arrow buffers; no Python object per message.
"""
from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from shmq.core import layout as L
from shmq.core import reader
from shmq.core import records as R
from shmq.core.commitlog import CommitLog, SegmentMissing
from shmq.core.consumequeue import ConsumeQueues
from shmq.core.files import REAL_FILES as _FILES
from shmq.core.recovery import next_valid_record
from shmq.broker.live_view import StoreView


def _schema(properties) -> StructType:
    cols = [("topic", StringType()), ("queueId", IntegerType()), ("queueOffset", LongType()),
            ("commitLogOffset", LongType()), ("storeSize", IntegerType()), ("sysFlag", IntegerType()),
            ("flag", IntegerType()), ("bornTimestamp", TimestampType()), ("storeTimestamp", TimestampType()),
            ("bornHost", StringType()), ("storeHost", StringType()), ("tags", StringType()),
            ("keys", StringType()), ("body", BinaryType()), ("properties", properties),
            ("msgId", StringType())]
    return StructType([StructField(name, t, nullable=True) for name, t in cols])


SCHEMA = _schema(StringType())
SCHEMA_WITH_PROPERTY_MAP = _schema(MapType(StringType(), StringType(), valueContainsNull=True))

EARLIEST = -2
LATEST = -1
DEFAULT_BATCH_ROWS = 65536
# Spark's file sources split at spark.sql.files.maxPartitionBytes (128 MiB);
# a segment is split likewise, at record starts its ConsumeQueues point to.
DEFAULT_PARTITION_BYTES = 128 << 20


class ShmqSourceError(ValueError):
    """A bad option, or data the options say must be there and is not."""


# ------------------------------------------------------------------ options
@dataclass(frozen=True)
class ReadOptions:
    """What ``read()`` needs: small and picklable (it travels in every partition)."""
    commitlog_dir: str                # the store's StoreConfig.commitlog_dir
    consumequeue_dir: str             # ... and consumequeue_dir
    segment_bytes: int
    units_per_file: int
    include_properties: bool
    fail_on_data_loss: bool
    batch_rows: int
    columns: tuple[str, ...]          # output columns, in order


def _opts(options) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def _bool(o: dict, name: str, default: bool) -> bool:
    v = o.get(name.lower())
    if v is None:
        return default
    if v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise ShmqSourceError(f"option {name}={v!r}: expected true or false")


def _int(o: dict, name: str, default: int | None, minimum: int = 1) -> int | None:
    v = o.get(name.lower())
    if v is None:
        return default
    try:
        n = int(v)
    except ValueError:
        raise ShmqSourceError(f"option {name}={v!r}: expected an integer") from None
    if n < minimum:
        raise ShmqSourceError(f"option {name}={v!r}: must be at least {minimum}")
    return n


def _path(o: dict) -> str:
    p = o.get("path")
    if not p:
        raise ShmqSourceError("option path (the store directory) is required")
    return p


def _topic_matcher(o: dict, required: bool):
    """A predicate over topic names from subscribe / subscribePattern."""
    sub, pat = o.get("subscribe"), o.get("subscribepattern")
    if sub is not None and pat is not None:
        raise ShmqSourceError("give only one of the options subscribe and subscribePattern")
    if sub is not None:
        topics = {t.strip() for t in sub.split(",") if t.strip()}
        if not topics:
            raise ShmqSourceError(f"option subscribe={sub!r} names no topic")
        return topics.__contains__
    if pat is not None:
        try:
            rx = re.compile(pat)
        except re.error as e:
            raise ShmqSourceError(f"option subscribePattern={pat!r}: {e}") from None
        return lambda t: rx.fullmatch(t) is not None
    if required:
        raise ShmqSourceError("one of the options subscribe or subscribePattern is required")
    return None


def _offsets_spec(o: dict, name: str, default: str, allow_earliest: bool = True):
    """'earliest' | 'latest' | {topic: {qid: offset}} (qid keys as strings)."""
    v = o.get(name.lower(), default).strip()
    if v in ("earliest", "latest"):
        if v == "earliest" and not allow_earliest:
            raise ShmqSourceError(f"option {name}=earliest is not allowed (use latest or JSON)")
        return v
    try:
        spec = json.loads(v)
    except ValueError:
        spec = None
    if not isinstance(spec, dict) or not all(isinstance(q, dict) for q in spec.values()):
        raise ShmqSourceError(f"option {name}={v!r}: expected earliest, latest or JSON like "
                              f'{{"TopicA": {{"0": 23, "1": -2}}}}')
    out = {}
    for topic, queues in spec.items():
        for qid, off in queues.items():
            try:
                q, off = int(qid), int(off)
            except (TypeError, ValueError):
                raise ShmqSourceError(f"option {name}: {topic}/{qid}={off!r} is not a queue id "
                                      f"and an offset") from None
            if off < EARLIEST or (off == EARLIEST and not allow_earliest):
                raise ShmqSourceError(f"option {name}: {topic}/{qid}={off} is not a valid offset")
            out[(topic, q)] = off
    return out


def _columns(schema: StructType | None, include_properties: bool) -> tuple[str, ...]:
    full = SCHEMA_WITH_PROPERTY_MAP if include_properties else SCHEMA
    if schema is None:
        return tuple(full.names)
    known = {f.name: f.dataType for f in full.fields}
    for f in schema.fields:
        if f.name not in known:
            raise ShmqSourceError(f"column {f.name!r} is not in the shmq schema ({', '.join(known)})")
        if f.dataType != known[f.name]:
            raise ShmqSourceError(f"column {f.name!r} must be {known[f.name].simpleString()}, "
                                  f"not {f.dataType.simpleString()}")
    return tuple(schema.names)


def _read_options(view: StoreView, o: dict, columns: tuple[str, ...]) -> ReadOptions:
    return ReadOptions(view.config.commitlog_dir, view.config.consumequeue_dir,
                       view.segment_bytes, view.units_per_file,
                       _bool(o, "includeProperties", False), _bool(o, "failOnDataLoss", True),
                       _int(o, "batchRows", DEFAULT_BATCH_ROWS), columns)


def _open_view(o: dict) -> StoreView:
    try:
        return StoreView.open(_path(o))
    except ValueError as e:
        raise ShmqSourceError(str(e)) from None


# --------------------------------------------------------------- partitions
@dataclass
class QueueRange(InputPartition):
    """Queue offsets [start, end) of one queue."""
    topic: str
    queue_id: int
    start: int
    end: int
    opts: ReadOptions


@dataclass
class SegmentRange(InputPartition):
    """CommitLog bytes [start, end) of the segment beginning at ``base``."""
    base: int
    start: int
    end: int
    topics: tuple[str, ...] | None      # exact names, or None with ``pattern``/all
    pattern: str | None
    opts: ReadOptions


def resolve_ranges(view: StoreView, o: dict, matches, starting, ending,
                   fail_on_data_loss: bool) -> dict[tuple[str, int], tuple[int, int]]:
    """Per subscribed queue, the offsets [start, end) to read."""
    out = {}
    for key, ext in sorted(view.queues.items()):
        if not matches(key[0]):
            continue
        start = _pick(starting, key, ext.min_offset, ext)
        end = _pick(ending, key, ext.max_offset, ext)
        if start < ext.min_offset:
            if fail_on_data_loss:
                raise ShmqSourceError(
                    f"{key[0]}/{key[1]}: offset {start} was deleted (the queue now starts at "
                    f"{ext.min_offset}); set failOnDataLoss=false to skip what is gone")
            start = ext.min_offset
        end = min(end, ext.max_offset)
        if start > end:
            raise ShmqSourceError(f"{key[0]}/{key[1]}: starting offset {start} is past the ending "
                                  f"offset {end}")
        out[key] = (start, end)
    for spec in (starting, ending):
        if isinstance(spec, dict):
            missing = [k for k in spec if k not in out and matches(k[0])]
            unsubscribed = [k for k in spec if not matches(k[0])]
            if unsubscribed:
                raise ShmqSourceError(f"offsets given for {unsubscribed[0][0]}/{unsubscribed[0][1]}, "
                                      f"which is not subscribed")
            if missing:
                raise ShmqSourceError(f"offsets given for {missing[0][0]}/{missing[0][1]}, "
                                      f"which the store does not have")
    return out


def _pick(spec, key, default_for_name: int, ext) -> int:
    if spec == "earliest":
        return ext.min_offset
    if spec == "latest":
        return ext.max_offset
    if isinstance(spec, dict) and key in spec:
        off = spec[key]
        return ext.min_offset if off == EARLIEST else ext.max_offset if off == LATEST else off
    return default_for_name


def split_ranges(ranges: dict[tuple[str, int], tuple[int, int]], min_partitions: int | None,
                 opts: ReadOptions) -> list[QueueRange]:
    """One partition per non-empty queue range; with ``minPartitions`` above
    that count, each range split in proportion to its share of the total
    (Kafka's KafkaOffsetRangeCalculator rule)."""
    parts = [(k, s, e) for k, (s, e) in ranges.items() if e > s]
    total = sum(e - s for _, s, e in parts)
    out = []
    for (topic, qid), s, e in parts:
        pieces = 1
        if min_partitions and min_partitions > len(parts):
            pieces = max(1, round((e - s) / total * min_partitions))
        step = -(-(e - s) // pieces)
        for a in range(s, e, step):
            out.append(QueueRange(topic, qid, a, min(a + step, e), opts))
    return out


# ------------------------------------------------------------------ reading
def _arrow_schema(opts: ReadOptions) -> pa.Schema:
    full = SCHEMA_WITH_PROPERTY_MAP if opts.include_properties else SCHEMA
    return to_arrow_schema(StructType([full[c] for c in opts.columns]), timezone="UTC")


def _var_array(typ: pa.DataType, offs: np.ndarray, dat: np.ndarray, valid: np.ndarray | None = None):
    n = offs.shape[0] - 1
    bitmap = None
    nulls = 0
    if valid is not None:
        nulls = n - int(np.count_nonzero(valid))
        if nulls:
            bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(offs), pa.py_buffer(dat[:offs[n]])], nulls)


def to_record_batch(cols: R.Columns, schema: pa.Schema, opts: ReadOptions) -> pa.RecordBatch:
    """Arrow arrays over the decoded buffers (no copy), in ``schema``'s order."""
    arrays = []
    for field in schema:
        name = field.name
        if name in cols.fixed:
            arrays.append(pa.Array.from_buffers(field.type, cols.n, [None, pa.py_buffer(cols.fixed[name])], 0))
        elif name == "properties" and opts.include_properties:
            row_off, (ko, kd), (vo, vd) = R.property_pairs(*cols.var["properties"])
            keys = _var_array(pa.string(), ko, kd)
            values = _var_array(pa.string(), vo, vd)
            arrays.append(pa.MapArray.from_arrays(pa.array(row_off, pa.int32()), keys, values,
                                                  type=field.type))
        else:
            offs, dat = cols.var[name]
            arrays.append(_var_array(field.type, offs, dat, cols.valid.get(name)))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _data_loss(opts: ReadOptions, what: str) -> None:
    if opts.fail_on_data_loss:
        raise ShmqSourceError(f"{what}; set failOnDataLoss=false to skip what is gone")


def read_queue_range(part: QueueRange) -> Iterator[pa.RecordBatch]:
    """The messages of one queue range, through its ConsumeQueue
    (``core.reader``: units file by file, then the records they point at,
    segment by segment, each checked to be its unit's). Spark reads a plan
    with no partitions as one ``InputPartition(None)``: nothing to read."""
    if not isinstance(part, QueueRange):
        return
    opts = part.opts
    schema = _arrow_schema(opts)
    cl = CommitLog(_FILES, opts.commitlog_dir, opts.segment_bytes, read_only=True)
    cqs = ConsumeQueues(_FILES, opts.consumequeue_dir, opts.units_per_file, read_only=True)
    where = f"{part.topic}/{part.queue_id}"
    try:
        for first, units, n in reader.unit_chunks(cqs, part.topic, part.queue_id, part.start,
                                                  part.end, opts.batch_rows):
            if units is None:
                _data_loss(opts, f"{where}: ConsumeQueue file for offsets {first}..{first + n} is gone")
                continue
            for run in reader.unit_records(cl, part.queue_id, first, units):
                if run.buf is None:
                    _data_loss(opts, f"{where}: offsets {run.qoffs[0]}..{run.qoffs[-1]} point into "
                                     f"CommitLog segment {run.base}, which is gone")
                    continue
                if run.rows.shape[0]:
                    yield to_record_batch(R.decode_columns(run.buf, run.base, run.rows), schema, opts)
                if run.bad:     # a record that is not its unit's is skipped, alone
                    _data_loss(opts, f"{where}: offset {run.bad_qoff} points at CommitLog "
                                     f"{run.bad_phy}, which does not hold its message")
    finally:
        cl.close()
        cqs.close()


def read_segment(part: SegmentRange) -> Iterator[pa.RecordBatch]:
    """Every record of one CommitLog segment in [start, end), optionally of
    some topics (nothing for Spark's ``InputPartition(None)``, as above)."""
    if not isinstance(part, SegmentRange):
        return
    opts = part.opts
    schema = _arrow_schema(opts)
    read_schema = schema if "topic" in schema.names or part.topics is None and part.pattern is None \
        else pa.schema([pa.field("topic", pa.string()), *schema])
    wanted = set(part.topics) if part.topics is not None else None
    rx = re.compile(part.pattern) if part.pattern is not None else None
    cl = CommitLog(_FILES, opts.commitlog_dir, opts.segment_bytes, read_only=True)
    try:
        try:
            buf = cl.map(part.base)
        except (SegmentMissing, FileNotFoundError):
            _data_loss(opts, f"CommitLog segment {part.base} is gone")
            return
        cl.prefault(part.base, part.start, part.end)
        pos = part.start
        while pos < part.end:
            rows, pos, status = R.scan_rows(buf, pos, part.end, part.base, opts.batch_rows)
            if rows.shape[0]:
                batch = to_record_batch(R.decode_columns(buf, part.base, rows), read_schema, opts)
                if wanted is not None or rx is not None:
                    topics = batch.column("topic")
                    names = [t for t in pc.unique(topics).to_pylist()
                             if (t in wanted if wanted is not None else rx.fullmatch(t))]
                    batch = batch.filter(pc.is_in(topics, pa.array(names, pa.string())))
                    if read_schema is not schema:
                        batch = batch.select(schema.names)
                if batch.num_rows:
                    yield batch
            if status in (L.SCAN_BLANK, L.SCAN_END):
                break
            if status != L.SCAN_FULL:
                _data_loss(opts, f"CommitLog segment {part.base}: no valid record at {part.base + pos}")
                nxt = next_valid_record(buf, part.base, pos + 1, part.end)   # damage: step over it
                if nxt is None:
                    break
                pos = nxt
    finally:
        cl.close()


# ------------------------------------------------------------- data sources
class _Source(DataSource):
    """What both formats share: the schema (with properties as a map on request)."""

    def schema(self) -> StructType:
        return SCHEMA_WITH_PROPERTY_MAP if _bool(_opts(self.options), "includeProperties", False) else SCHEMA


class ShmqDataSource(_Source):
    """``format("shmq")``: Kafka-style reads through the ConsumeQueues."""

    @classmethod
    def name(cls) -> str:
        return "shmq"

    def reader(self, schema: StructType) -> ShmqBatchReader:
        return ShmqBatchReader(_opts(self.options), schema)

    def streamReader(self, schema: StructType) -> ShmqStreamReader:
        return ShmqStreamReader(_opts(self.options), schema)


class ShmqCommitLogDataSource(_Source):
    """``format("shmq-commitlog")``: every record, one partition per segment."""

    @classmethod
    def name(cls) -> str:
        return "shmq-commitlog"

    def reader(self, schema: StructType) -> ShmqCommitLogReader:
        return ShmqCommitLogReader(_opts(self.options), schema)


class ShmqBatchReader(DataSourceReader):
    def __init__(self, options: dict, schema: StructType | None = None):
        self.o = _opts(options)
        self.matches = _topic_matcher(self.o, required=True)
        self.starting = _offsets_spec(self.o, "startingOffsets", "earliest")
        self.ending = _offsets_spec(self.o, "endingOffsets", "latest", allow_earliest=False)
        self.min_partitions = _int(self.o, "minPartitions", None)
        self.columns = _columns(schema, _bool(self.o, "includeProperties", False))
        _read_options_check(self.o)

    def partitions(self) -> list[QueueRange]:
        view = _open_view(self.o)
        opts = _read_options(view, self.o, self.columns)
        ranges = resolve_ranges(view, self.o, self.matches, self.starting, self.ending,
                                opts.fail_on_data_loss)
        return split_ranges(ranges, self.min_partitions, opts)

    def read(self, partition: QueueRange) -> Iterator[pa.RecordBatch]:
        return read_queue_range(partition)


class ShmqCommitLogReader(DataSourceReader):
    def __init__(self, options: dict, schema: StructType | None = None):
        self.o = _opts(options)
        _topic_matcher(self.o, required=False)     # validates
        self.columns = _columns(schema, _bool(self.o, "includeProperties", False))
        _read_options_check(self.o)

    def partitions(self) -> list[SegmentRange]:
        view = _open_view(self.o)
        opts = _read_options(view, self.o, self.columns)
        sub = self.o.get("subscribe")
        topics = tuple(t.strip() for t in sub.split(",") if t.strip()) if sub is not None else None
        most = _int(self.o, "maxBytesPerPartition", DEFAULT_PARTITION_BYTES)
        spans = [(base, max(0, view.cl_min - base), view.data_end(base)) for base in view.segments]
        spans = [(base, a, b) for base, a, b in spans if b > a]
        pieces = [-(-(b - a) // most) for _, a, b in spans]
        want = _int(self.o, "minPartitions", None)
        total = sum(b - a for _, a, b in spans)
        if want and sum(pieces) < want:
            pieces = [max(p, round((b - a) / total * want)) for p, (_, a, b) in zip(pieces, spans)]
        out = []
        pattern = self.o.get("subscribepattern")
        for (base, a, b), k in zip(spans, pieces):
            # equal pieces, each cut moved to the next record start a queue knows
            cuts = [a]
            for j in range(1, k):
                cut = view.record_start_after(base + a + (b - a) * j // k, base + b) - base
                if cut > cuts[-1] and cut < b:
                    cuts.append(cut)
            for lo, hi in zip(cuts, cuts[1:] + [b]):
                out.append(SegmentRange(base, lo, hi, topics, pattern, opts))
        return out

    def read(self, partition: SegmentRange) -> Iterator[pa.RecordBatch]:
        return read_segment(partition)


def _read_options_check(o: dict) -> None:
    """Fail at plan time, on the driver, for options read() would trip on."""
    _bool(o, "includeProperties", False)
    _bool(o, "failOnDataLoss", True)
    _int(o, "batchRows", DEFAULT_BATCH_ROWS)
    _path(o)


# ---------------------------------------------------------------- streaming
def _offset_json(ranges: dict[tuple[str, int], int]) -> dict:
    out: dict[str, dict[str, int]] = {}
    for (topic, qid), off in sorted(ranges.items()):
        out.setdefault(topic, {})[str(qid)] = off
    return out


def _from_json(offsets: dict) -> dict[tuple[str, int], int]:
    return {(t, int(q)): int(off) for t, qs in offsets.items() for q, off in qs.items()}


def rate_limit(start: dict[tuple[str, int], int], latest: dict[tuple[str, int], int],
               limit: int) -> dict[tuple[str, int], int]:
    """Advance each queue by its share of ``limit`` in proportion to its
    backlog (a share below one rounds up so no queue starves, above one down)."""
    backlog = {k: max(0, latest[k] - start.get(k, latest[k])) for k in latest}
    total = sum(backlog.values())
    if total <= limit:
        return dict(latest)
    out = {}
    for k, end in latest.items():
        s = start.get(k, end)
        share = limit * backlog[k] / total
        step = int(np.ceil(share)) if share < 1 else int(share)
        out[k] = min(end, s + step)
    return out


class ShmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over the ConsumeQueues. Offsets are ``{"Topic": {"qid":
    next offset}}``; the checkpoint, not ``commit``, is the source of truth.
    A queue that appears later starts from its earliest offset (as Kafka's
    new partitions do)."""

    def __init__(self, options: dict, schema: StructType | None = None):
        self.o = _opts(options)
        self.matches = _topic_matcher(self.o, required=True)
        self.starting = _offsets_spec(self.o, "startingOffsets", "latest")
        if "endingoffsets" in self.o:
            raise ShmqSourceError("option endingOffsets is for batch queries only")
        self.max_per_trigger = _int(self.o, "maxOffsetsPerTrigger", None)
        self.columns = _columns(schema, _bool(self.o, "includeProperties", False))
        _read_options_check(self.o)
        self.fail_on_data_loss = _bool(self.o, "failOnDataLoss", True)
        self._target: dict[tuple[str, int], int] | None = None

    def _latest(self) -> tuple[StoreView, dict[tuple[str, int], int]]:
        view = _open_view(self.o)
        return view, {k: e.max_offset for k, e in view.queues.items() if self.matches(k[0])}

    def initialOffset(self) -> dict:
        view = _open_view(self.o)
        ranges = resolve_ranges(view, self.o, self.matches, self.starting, "latest", self.fail_on_data_loss)
        return _offset_json({k: s for k, (s, _) in ranges.items()})

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()[1]

    def latestOffset(self, start: dict, limit=None) -> dict:
        view, latest = self._latest()
        if self._target is not None:
            latest = {k: min(v, self._target.get(k, view.queues[k].min_offset)) for k, v in latest.items()}
        begin = _from_json(start)
        # a queue new since ``start`` begins at its earliest offset
        begin.update({k: view.queues[k].min_offset for k in latest if k not in begin})
        latest = {k: max(v, begin[k]) for k, v in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        merged = dict(begin)
        merged.update(latest)
        return _offset_json(merged)

    def reportLatestOffset(self) -> dict:
        return _offset_json(self._latest()[1])

    def partitions(self, start: dict, end: dict) -> list[QueueRange]:
        view = _open_view(self.o)
        opts = _read_options(view, self.o, self.columns)
        begin, stop = _from_json(start), _from_json(end)
        ranges = {}
        for k, e in stop.items():
            ext = view.queues.get(k)
            s = begin.get(k, ext.min_offset if ext is not None else e)
            lo = ext.min_offset if ext is not None else e
            if s < lo:
                if opts.fail_on_data_loss:
                    raise ShmqSourceError(f"{k[0]}/{k[1]}: offsets {s}..{lo} were deleted before they "
                                          f"were read; set failOnDataLoss=false to skip what is gone")
                s = lo
            if e > s:
                ranges[k] = (s, e)
        return split_ranges(ranges, _int(self.o, "minPartitions", None), opts)

    def read(self, partition: QueueRange) -> Iterator[pa.RecordBatch]:
        return read_queue_range(partition)

    def commit(self, end: dict) -> None:
        pass   # progress lives in Spark's checkpoint; the store keeps data by retention


def stop(spark, timeout: float = 60.0) -> None:
    """Stop ``spark`` and the driver JVM this process launched for it, and
    wait for that JVM. ``SparkSession.stop`` leaves the JVM running (pyspark
    keeps its gateway for a next session in the same process) until this
    process exits; the JVM then dies orphaned (on its stdin's end) and no
    parent waits for it: a defunct java process, one per session, until
    init reaps it (if ever, in a container). Here the gateway is shut, the
    JVM's stdin closed (it exits on that) and the JVM waited for (killed
    after ``timeout`` s); a later ``getOrCreate`` launches a new one. Once
    stopped so, a second call does nothing."""
    from pyspark import SparkContext
    if SparkContext._gateway is None:
        return
    spark.stop()
    with SparkContext._lock:
        gateway, SparkContext._gateway, SparkContext._jvm = SparkContext._gateway, None, None
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is None:          # a gateway this process did not launch: not its JVM to wait for
        return
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def register(spark) -> None:
    """Register both formats on a session (when the ``pyspark_shmq`` modules
    are not installed for Spark to find on its own)."""
    spark.dataSource.register(ShmqDataSource)
    spark.dataSource.register(ShmqCommitLogDataSource)

