"""Messages the broker re-posts: delay levels, timers, retries, transactions.

Property names are RocketMQ's ``MessageConst``. The functions here turn a
stored message into the record it becomes next (``repost``) and decide, on
the send path, where a new message really goes (``route_send``): a delay
level parks it in ``SCHEDULE_TOPIC_XXXX`` (queue = level − 1), a delivery
time in the timer topic, a transaction's half message in
``RMQ_SYS_TRANS_HALF_TOPIC``; in the first two the ConsumeQueue tags code
carries the delivery time, so the services process finds what is due without
reading the CommitLog. Recovery rewrites the units of records past the
checkpoint; ``tags_code_rules`` tells it how to compute those delivery times
again from the records (store time + the level's delay; ``TIMER_OUT_MS``),
so a crash neither makes a waiting message due at once nor moves its time.

``Progress`` and ``Reposter`` make the services process's re-posts
exactly-once across ``kill -9``. Every cursor lives in one page of a
memory-mapped file (the page cache outlives the process). Before an append
the reposter writes what it is about to do (source record, target queue
and its next offset, the cursor and the value it moves to); after the
append it moves the cursor and clears the note. A restarted process that
finds a note looks in the target queue, past the noted offset, for the
copy: found, it only moves the cursor; not found, the append never
happened and the work is redone.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np
import orjson
from shmq.core.files import FILE_MODE
from shmq.core.layout import (
    OFF_PHYSICALOFFSET,
    OFF_QUEUEOFFSET,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_NOT,
    SYSFLAG_TRANSACTION_PREPARED,
    properties_to_string,
    string_to_properties,
)
from shmq.core.records import EncodedBatch, StoredMessage, decode, encode, int_property
from shmq.core.recovery import QueueRecords, TagsCodeRule
from shmq.core.store import AppendResult, MessageStore
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.fastjson import mq_map
from shmq.ipc.headers import BadRequest

from .topics import SCHEDULE_TOPIC, TIMER_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC

DELAY = "DELAY"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
TRAN_MSG = "TRAN_MSG"
PGROUP = "PGROUP"
UNIQ_KEY = "UNIQ_KEY"
RETRY_TOPIC = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_OUT_MS = "TIMER_OUT_MS"
TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
OP_TAG = "d"
_TIMER_KEYS = (TIMER_DELAY_SEC, TIMER_DELAY_MS, TIMER_DELIVER_MS)
TIMER_ILLEGAL = ("timer message illegal, the delay time should not be bigger than the max "
                 "delay {max}ms; or if set del msg, the delay time should be bigger than the "
                 "current time")


def _int_prop(props: dict[str, str], name: str) -> int:
    try:
        return int(props[name])
    except ValueError:
        raise BadRequest(R.MESSAGE_ILLEGAL, f"property {name}={props[name]!r} is not a number") from None


@dataclass
class Routed:
    """Where a sent message is stored, and with what."""
    topic: str
    queue_id: int
    sysflag: int
    properties: str
    tags_code: int | None = None      # the ConsumeQueue tags code, when it is a delivery time
    half: bool = False                # a transaction's half message


TRIGGERS = ("DELAY\x01", "TIMER_", "TRAN_MSG\x01")
_DELAY, _TIMER, _TRAN = TRIGGERS


def needs_routing(props: str, sysflag: int) -> bool:
    """Whether a send must be routed (a delay, a delivery time, a
    transaction). Every send asks: the three ``in`` tests written out cost
    a third of ``any()`` over a generator."""
    return bool(sysflag & SYSFLAG_TRANSACTION_MASK) or _DELAY in props or _TIMER in props \
        or _TRAN in props


def route_send(topic: str, queue_id: int, sysflag: int, props: str, *, now_ms: int,
               delay_levels: tuple[int, ...], timer_enable: bool, timer_max_delay_ms: int,
               reject_transactions: bool) -> Routed:
    """RocketMQ's put hooks for one message (``CommitLog.asyncPutMessage``,
    ``TransactionalMessageBridge.parseHalfMessageInner``,
    ``HookUtils.handleScheduleMessage``)."""
    d = string_to_properties(props)
    tran = sysflag & SYSFLAG_TRANSACTION_MASK
    if tran == SYSFLAG_TRANSACTION_PREPARED and d.get(TRAN_MSG, "").lower() == "true":
        if reject_transactions:
            raise BadRequest(R.NO_PERMISSION, "the broker sending transaction message is forbidden")
        d.pop(DELAY, None)    # producers clear it; a half message is never delayed
        d[REAL_TOPIC], d[REAL_QID] = topic, str(queue_id)
        return Routed(TRANS_HALF_TOPIC, 0, sysflag & ~SYSFLAG_TRANSACTION_MASK,
                      properties_to_string(d), half=True)
    if tran not in (SYSFLAG_TRANSACTION_NOT, SYSFLAG_TRANSACTION_COMMIT):
        return Routed(topic, queue_id, sysflag, props)
    level = _int_prop(d, DELAY) if DELAY in d else 0
    if level > 0:
        for k in _TIMER_KEYS:
            d.pop(k, None)
        level = min(level, len(delay_levels))
        d[REAL_TOPIC], d[REAL_QID] = topic, str(queue_id)
        return Routed(SCHEDULE_TOPIC, level - 1, sysflag, properties_to_string(d),
                      tags_code=now_ms + delay_levels[level - 1])
    if TIMER_OUT_MS in d or topic == TIMER_TOPIC or not any(k in d for k in _TIMER_KEYS):
        return Routed(topic, queue_id, sysflag, props)
    if not timer_enable:
        raise BadRequest(R.SYSTEM_ERROR, "accurate timer message is not enabled, "
                                         "timerWheelEnable is false")
    if TIMER_DELAY_SEC in d:
        deliver = now_ms + _int_prop(d, TIMER_DELAY_SEC) * 1000
    elif TIMER_DELAY_MS in d:
        deliver = now_ms + _int_prop(d, TIMER_DELAY_MS)
    else:
        deliver = _int_prop(d, TIMER_DELIVER_MS)
    if deliver - now_ms > timer_max_delay_ms:
        raise BadRequest(R.MESSAGE_ILLEGAL, TIMER_ILLEGAL.format(max=timer_max_delay_ms))
    if deliver <= now_ms:
        return Routed(topic, queue_id, sysflag, props)
    d[TIMER_OUT_MS] = str(deliver)
    d[REAL_TOPIC], d[REAL_QID] = topic, str(queue_id)
    return Routed(TIMER_TOPIC, 0, sysflag, properties_to_string(d), tags_code=deliver)


def repost(m: StoredMessage, topic: str, queue_id: int, props: dict[str, str] | str, *,
           store_host: tuple[str, int], sysflag: int | None = None,
           reconsume_times: int | None = None, prepared_offset: int = 0,
           tags_code: int | None = None, store_timestamp: int | None = None) -> EncodedBatch:
    """The record a stored message becomes when the broker posts it again:
    same body, flag, born time and host; new topic, queue and properties.
    A ``tags_code`` that is a delivery time wants the ``store_timestamp`` it
    was computed from (recovery computes it again from the record's)."""
    if isinstance(props, dict):
        props = properties_to_string(props)
    batch = encode(topic, [m.body], properties=props.encode(),
                   queue_ids=queue_id, flag=m.flag,
                   sysflag=m.sysflag if sysflag is None else sysflag,
                   born_timestamp=m.born_timestamp, born_host=m.born_host,
                   reconsume_times=m.reconsume_times if reconsume_times is None else reconsume_times,
                   prepared_offset=prepared_offset, store_host=store_host,
                   store_timestamp=store_timestamp, max_message_bytes=max(len(m.body), 1))
    if tags_code is not None:
        batch.tags_codes[:] = tags_code
    return batch


def tags_code_rules(delay_levels: tuple[int, ...]) -> dict[str, TagsCodeRule]:
    """How recovery computes the tags codes ``route_send`` gave the
    delay-level and timer topics' units (``core.recovery``)."""
    levels = np.asarray(delay_levels, dtype=np.int64)

    def delay_due(r: QueueRecords) -> np.ndarray:
        # The queue is the level − 1 that route_send chose (DELAY clamped to
        # the last level), and the level DelayService reads it as; RocketMQ
        # reads the DELAY property, which says the same for every record a
        # 4.x broker or shmq writes. Clamped again: messageDelayLevel may
        # have fewer levels since (DelayService skips those queues).
        return r.store_timestamp + levels[min(max(r.queue_id, 0), levels.shape[0] - 1)]

    def timer_due(r: QueueRecords) -> np.ndarray:
        # route_send puts the delivery time in TIMER_OUT_MS too; a record
        # without a number there was not timed by it and keeps its tag hash.
        return int_property(r.props_buf, r.props_pos, r.props_len, TIMER_OUT_MS, r.tags_hash)

    return {SCHEDULE_TOPIC: delay_due, TIMER_TOPIC: timer_due}


def restore_real(m: StoredMessage, store_host: tuple[str, int], drop=(DELAY,),
                 add: dict[str, str] | None = None) -> EncodedBatch:
    """A parked message (delay level, timer) back to its real topic and queue
    (``ScheduleMessageService.messageTimeup``)."""
    d = m.properties
    topic, qid = d.get(REAL_TOPIC), d.get(REAL_QID, "0")
    for k in drop:
        d.pop(k, None)
    d.update(add or {})
    return repost(m, topic or m.topic, int(qid) if qid.isdigit() else 0, d, store_host=store_host)


def commit_half(m: StoredMessage, store_host: tuple[str, int]) -> EncodedBatch:
    """The committed message of a half message (EndTransactionProcessor):
    its real topic and queue, transaction type COMMIT, the half message's
    offset as its prepared-transaction offset."""
    d = m.properties
    topic, qid = d.pop(REAL_TOPIC, m.topic), d.pop(REAL_QID, "0")
    d.pop(TRAN_MSG, None)
    return repost(m, topic, int(qid) if qid.isdigit() else 0, d, store_host=store_host,
                  sysflag=(m.sysflag & ~SYSFLAG_TRANSACTION_MASK) | SYSFLAG_TRANSACTION_COMMIT,
                  prepared_offset=m.phy_offset)


def op_record(half_queue_offset: int, store_host: tuple[str, int]) -> EncodedBatch:
    """An op message: the half message at this queue offset is resolved
    (tag "d", body the offset in decimal; TransactionalMessageUtil)."""
    return encode(TRANS_OP_HALF_TOPIC, [str(half_queue_offset).encode()],
                  properties=properties_to_string({"TAGS": OP_TAG, "WAIT": "false"}).encode(),
                  store_host=store_host)


def check_body(m: StoredMessage, store_host: tuple[str, int]) -> bytes:
    """The body of a CHECK_TRANSACTION_STATE: the half message as a record,
    with its real topic and queue put back and its own offsets kept."""
    d = m.properties
    qid = d.get(REAL_QID, "0")
    b = repost(m, d.get(REAL_TOPIC, m.topic), int(qid) if qid.isdigit() else 0, d,
               store_host=store_host)
    buf = b.buf
    buf[OFF_QUEUEOFFSET:OFF_QUEUEOFFSET + 8] = np.frombuffer(m.queue_offset.to_bytes(8, "big", signed=True), np.uint8)
    buf[OFF_PHYSICALOFFSET:OFF_PHYSICALOFFSET + 8] = np.frombuffer(m.phy_offset.to_bytes(8, "big"), np.uint8)
    return buf.tobytes()


def reset_body(topic: str, broker: str, table: dict[int, int], language: str) -> bytes:
    """ResetOffsetBody: fastjson's map with MessageQueue keys (Quirk 2), or
    the list form RocketMQ sends C++ clients (ResetOffsetBodyForC)."""
    if language == "CPP":
        items = ",".join(f'{{"brokerName":{orjson.dumps(broker).decode()},"offset":{off},'
                         f'"queueId":{qid},"topic":{orjson.dumps(topic).decode()}}}'
                         for qid, off in table.items())
        return f'{{"offsetTable":[{items}]}}'.encode()
    return f'{{"offsetTable":{mq_map((topic, broker, q, off) for q, off in table.items())}}}'.encode()


# ------------------------------------------------------------------ progress
PROGRESS_FILE = "servicesProgress.bin"
PROGRESS_SLOTS = 512
# the note a Reposter writes before an append
NOTE_SET, NOTE_SRC, NOTE_QNEXT, NOTE_CURSOR, NOTE_VALUE, NOTE_QID, NOTE_TOPIC_LEN = range(7)
NOTE_TOPIC = 8                       # 16 slots = 128 bytes of topic name
DELAY_CURSOR = 32                    # + level: next offset of SCHEDULE_TOPIC_XXXX queue level-1
TIMER_CURSOR = 128                   # slot << 24 | messages fired in that slot
TRANS_HALF_CURSOR, TRANS_OP_CURSOR = 136, 137


class Progress:
    """int64 cursors of the services process in one mapped page
    (``<store>/config/servicesProgress.bin``); only that process writes."""

    def __init__(self, root: str):
        path = os.path.join(root, "config", PROGRESS_FILE)
        self.created = not os.path.exists(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            if os.fstat(fd).st_size < PROGRESS_SLOTS * 8:
                os.ftruncate(fd, PROGRESS_SLOTS * 8)
            self._map = mmap.mmap(fd, PROGRESS_SLOTS * 8)
        finally:
            os.close(fd)
        self.v = np.frombuffer(self._map, dtype=np.int64)

    def __getitem__(self, i: int) -> int:
        return int(self.v[i])

    def __setitem__(self, i: int, value: int) -> None:
        self.v[i] = value

    def flush(self) -> None:
        self._map.flush()

    @staticmethod
    def peek(root: str) -> np.ndarray:
        """The cursors as they are now, for a process that never writes them
        (zeros before the services process made the file)."""
        try:
            return np.fromfile(os.path.join(root, "config", PROGRESS_FILE), np.int64, PROGRESS_SLOTS)
        except (FileNotFoundError, ValueError):
            return np.zeros(PROGRESS_SLOTS, np.int64)

    def close(self) -> None:
        self.v = None
        self._map.close()


class Reposter:
    """Exactly-once appends of the services process (see the module doc)."""

    def __init__(self, store: MessageStore, progress: Progress):
        self.store = store
        self.p = progress

    def put(self, batch: EncodedBatch, src_phy: int, cursor: int, value: int) -> AppendResult:
        p = self.p
        tb = batch.topic.encode()
        p.v[NOTE_TOPIC:NOTE_TOPIC + 16] = np.frombuffer(tb.ljust(128, b"\0"), np.int64)
        p[NOTE_TOPIC_LEN] = len(tb)
        p[NOTE_QID] = batch.queue_id
        p[NOTE_QNEXT] = self.store.max_offset(batch.topic, batch.queue_id)
        p[NOTE_SRC] = src_phy
        p[NOTE_CURSOR], p[NOTE_VALUE] = cursor, value
        p[NOTE_SET] = 1
        r = self.store.append(batch)
        p[cursor] = value
        p[NOTE_SET] = 0
        return r

    def advance(self, cursor: int, value: int) -> None:
        """Move a cursor past work that needs no append (nothing to redo)."""
        self.p[cursor] = value

    def recover(self) -> str:
        """Finish or forget the append a killed process was doing."""
        p = self.p
        if not p[NOTE_SET]:
            return "none"
        topic = p.v[NOTE_TOPIC:NOTE_TOPIC + 16].tobytes()[:p[NOTE_TOPIC_LEN]].decode()
        src = stored(self.store, p[NOTE_SRC])
        found = src is not None and self._copy_in(topic, p[NOTE_QID], p[NOTE_QNEXT], src)
        if found:
            p[p[NOTE_CURSOR]] = p[NOTE_VALUE]
        p[NOTE_SET] = 0
        return "finished" if found else "redo"

    def _copy_in(self, topic: str, qid: int, qnext: int, src: StoredMessage) -> bool:
        mx = self.store.max_offset(topic, qid)
        off = max(qnext, self.store.min_offset(topic, qid))
        uniq = src.properties.get(UNIQ_KEY)
        while off < mx:
            units = self.store.queue_units(topic, qid, off, 1024)
            if not units.shape[0]:
                return False
            for phy in units["phy_offset"].tolist():
                m = self.store.read_message(phy)
                if (m.born_timestamp, m.body_crc, len(m.body)) == \
                        (src.born_timestamp, src.body_crc, len(src.body)) and \
                        m.properties.get(UNIQ_KEY) == uniq:
                    return True
            off += units.shape[0]
        return False


def stored(store: MessageStore, phy: int) -> StoredMessage | None:
    """The message at a CommitLog offset, or None if no valid record is there."""
    st = store.state
    if not st.get("cl_min_offset") <= phy < st.write_pos:
        return None
    size = int.from_bytes(store.record_view(phy, 4).tobytes(), "big", signed=True)
    if size <= 0 or phy + size > st.write_pos:
        return None
    try:
        return decode(store.record_view(phy, size), 0, check_crc=False)
    except ValueError:
        return None

