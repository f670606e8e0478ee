"""SEND_MESSAGE (V1 keys), SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE (V2 keys):
check the topic and the queue, route what needs it (delay, timer,
transaction half, a consumer's own re-send to %RETRY%), encode, append,
answer msgId / queueId / queueOffset. Under SYNC_FLUSH the answer waits in
the parking module until the bytes are durable (the worker's own group
commit at the end of its turn, or another process's flush round), and on a
SYNC_MASTER until a slave acked them (``broker/ha``), unless the message says
WAIT=false. A SYNC_MASTER with no slave connected, or with its slave
haSlaveFallbehindMax behind, answers SLAVE_NOT_AVAILABLE at once (after the
flush, under SYNC_FLUSH): the message is stored, as RocketMQ's is.

A single message is the common case and has a budget (issue 14: ≤ 20 µs
of worker CPU per send, socket included). Most single sends never come
here: the worker's send lane (``lane.py``) reads, stores and answers them
in kernels, and sends here only what it does not take whole (the first
send to a topic, a delay, a batch, a header outside its JSON subset …).
For those, and where the lane is off, the header's fields are read
straight from extFields, whole and first (``send_fields``), the topic's
checks are cached until the tables change (config_epoch), the record is
written by ``records.encode_one`` (struct + zlib, no kernel call over
arrays), the born host comes parsed from the peer, and the SUCCESS reply
is a template (``remoting.send_ok_head``) rather than a command the
driver encodes. The sends a worker reads in one reactor turn are
``prepare``d as they come and appended together, one claim per queue
(``append_group``, through ``Handlers.take`` / ``flush_group``); a lone
send is ``prepare`` then ``append_one``.

Duplicates (``sendDedupWindowSize``, ``core/dedup.py``): a send carrying a
UNIQ_KEY (to any topic but a %RETRY% or %DLQ% one, with reconsumeTimes 0)
is checked against the store's window of recent keyed sends inside the
append's claim; a retry of a send already stored is answered SEND_OK with
the first send's msgId (offset ids), queueOffset and the queueId its record
is in (for a routed send — delay, timer, transaction half — the stored
queue is the internal one, so the retry's own queueId is answered, as the
first send's answer had it), and the reply waits for the flush under
SYNC_FLUSH as the first did. A batch is checked by its first message's key
and is a duplicate only when every message's key matches, in order, the
records of the earlier batch; otherwise it is stored whole.
"""
from __future__ import annotations

import random
import time

from shmq.core.dedup import dedupable_topic, hash_of, key_hash, read_record_key
from shmq.core.layout import SYSFLAG_TRANSACTION_MASK, offset_msg_ids
from shmq.core.records import (EncodedBatch, encode_arrays, encode_record, join_records,
                               split_batch_body, tags_code_of)
from shmq.core.store import DuplicateResult
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.headers import V1_KEYS, BadRequest, Header, send_header
from shmq.ipc.remoting import RemotingCommand, send_ok_head

from ..config import SYNC_MASTER
from ..delivery import needs_routing, route_send
from ..topics import (NOT_ALLOWED_SEND_TOPICS, PERM_WRITE, RETRY_GROUP_TOPIC_PREFIX, TopicConfig,
                      topic_error)
from .base import PARKED, Broker, Peer
from .retry import retry_or_dlq

MULTI_TAGS_FLAG = 0x2
SEND_REPLY_EXT = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
# RocketMQ's answer while its put lock is held too long (OS_PAGECACHE_BUSY)
PC_BUSY_REMARK = "[PC_SYNCHRONIZED]broker busy, start flow control for a while"


def topic_for_send(b: Broker, h: Header, topic: str) -> TopicConfig:
    """The topic's config if this broker takes sends to it (NO_PERMISSION,
    TOPIC_NOT_EXIST, SYSTEM_ERROR otherwise), creating it where RocketMQ
    would; remembered until the tables change."""
    return b.remembered(b.send_topics, topic, _check_send_topic, b, h, topic)


def _check_send_topic(b: Broker, h: Header, topic: str) -> TopicConfig:
    b.check_writable()
    err = topic_error(topic)
    if err:
        raise BadRequest(R.SYSTEM_ERROR, err)
    if topic in NOT_ALLOWED_SEND_TOPICS:
        raise BadRequest(R.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden.")
    tables = b.tables
    tc = tables.topics.get(topic)
    if tc is None:
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            tc = tables.retry_topic(topic[len(RETRY_GROUP_TOPIC_PREFIX):])
        else:
            tc = tables.create_topic_on_send(topic, h.str("defaultTopic"),
                                             h.int("defaultTopicQueueNums", 4))
        if tc is None:
            raise BadRequest(R.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
    if not tc.perm & PERM_WRITE:
        raise BadRequest(R.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
    return tc


def _encode_batch(topic: str, body, props: bytes, common: dict) -> EncodedBatch:
    """The records of a batch send: its body split into its messages (each
    with its own flag and properties, plus ``props``). ``common``: queue
    id, sysflag, born/store hosts and times, reconsume times, the size
    limit. A batch the store refuses is MESSAGE_ILLEGAL."""
    try:
        bb = split_batch_body(body, props)
        flags = bb.flags
        f = int(flags[0]) if (flags == flags[0]).all() else flags
        return encode_arrays(topic, bb.body_buf, bb.body_off, bb.body_len,
                             bb.props_buf, bb.props_off, bb.props_len, flag=f, **common,
                             spans_checked=True)       # split_batch checked every length
    except ValueError as e:
        raise BadRequest(R.MESSAGE_ILLEGAL, str(e)) from None


# The fields a send has, in SendMessageRequestHeader's order, under the keys
# each send code carries them (V2 and batch: the letters): what RocketMQ's
# header decoding checks before the request runs. Read straight from
# extFields (a Header lookup per field cost a send ~3 µs).
_V1_SEND = ("producerGroup", "topic", "queueId", "sysFlag", "bornTimestamp", "flag",
            "properties", "reconsumeTimes", "batch")
_V2_SEND = tuple(V1_KEYS[name] for name in _V1_SEND)


def send_fields(code: int, ext: dict[str, str]) -> tuple[str, str, int, int, int, int, str, int, bool]:
    """(producerGroup, topic, queueId, sysFlag, bornTimestamp, flag,
    properties, reconsumeTimes, batch) of a SEND header, by ``Header``'s
    rules (a missing properties is "", reconsumeTimes 0, batch false; "1"
    is true, as the C++ core sends it): a field missing or not a number is
    the SYSTEM_ERROR naming the first such, in the header's order."""
    g, t, q, sf, bt, fl, pr, rc, ba = _V1_SEND if code == RC.SEND_MESSAGE else _V2_SEND
    try:
        reconsume = ext.get(rc)
        batch = ext.get(ba)
        return (ext[g], ext[t], int(ext[q]), int(ext[sf]), int(ext[bt]), int(ext[fl]),
                ext.get(pr) or "", int(reconsume) if reconsume else 0,
                batch is not None and batch.lower() in ("true", "1"))
    except (KeyError, ValueError):
        h = send_header(code, ext)
        h.str("producerGroup"), h.str("topic")
        for name in ("queueId", "sysFlag", "bornTimestamp", "flag"):
            h.int(name)
        h.int("reconsumeTimes", 0)
        raise AssertionError(f"a send header that Header reads whole: {ext}") from None


class Prepared:
    """A send checked and encoded, not yet appended: what ``prepare``
    made of its request."""
    __slots__ = ("batch", "rec", "tags_code", "qid", "topic", "store_topic", "store_qid", "props",
                 "dh", "routed", "joins", "now")

    def __init__(self, batch: EncodedBatch | None, rec: bytearray | None, tags_code: int,
                 qid: int, topic: str, store_topic: str, store_qid: int, props: str, dh: int,
                 routed: bool, joins: bool, now: int):
        self.batch = batch              # a batch send's records (None: one message)
        self.rec = rec                  # one message's record, and its tags code
        self.tags_code = tags_code
        self.qid = qid                  # the queue the reply names
        self.topic = topic              # the topic it was sent to (a %RETRY% one rewritten)
        self.store_topic = store_topic  # where it is stored (routed: the internal topic)
        self.store_qid = store_qid
        self.props = props
        self.dh = dh                    # its dedup key hash (0: not checked)
        self.routed = routed            # a delay, a delivery time, a transaction
        # may be appended in one claim with others to its queue: one record
        # that takes a queue offset (not a transaction's)
        self.joins = joins
        self.now = now                  # its store timestamp (ms)


def send(b: Broker, peer: Peer, cmd: RemotingCommand):
    return append_one(b, peer, cmd, prepare(b, peer, cmd))


def prepare(b: Broker, peer: Peer, cmd: RemotingCommand) -> Prepared:
    """Everything a send does before its append: the header, the topic's
    and the queue's checks, routing, the record(s), the dedup key."""
    ext = cmd.ext
    _group, topic, qid, sysflag, born_ts, flag, props, reconsume, is_batch = send_fields(cmd.code, ext)
    h = send_header(cmd.code, ext)        # the rest, read where a rare path needs it
    tc = topic_for_send(b, h, topic)
    b.check_disk()
    nq = tc.write_queue_nums
    if qid < 0:
        qid = random.randrange(max(1, nq))
    if qid >= max(nq, tc.read_queue_nums):
        raise BadRequest(R.SYSTEM_ERROR, f"request queueId[{qid}] is illegal, topic: {topic} "
                                         f"writeQueueNums: {nq}")
    if tc.filter_type == "MULTI_TAG":
        sysflag |= MULTI_TAGS_FLAG
    props = props.rstrip("\x02")
    if "CLUSTER\x01" not in props:
        props = f"{props}\x02{b.cluster_prop}" if props else b.cluster_prop
    now = int(time.time() * 1000)
    routed = None
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and not is_batch:
        topic, qid, props = retry_or_dlq(b, h, topic, qid, props)
    if needs_routing(props, sysflag):
        if is_batch:
            raise BadRequest(R.MESSAGE_ILLEGAL, "a batch cannot carry a delay, a delivery "
                                                "time or a transaction")
        c = b.config
        routed = route_send(topic, qid, sysflag, props, now_ms=now,
                            delay_levels=b.delay_levels, timer_enable=c.timerWheelEnable,
                            timer_max_delay_ms=c.timerMaxDelaySec * 1000,
                            reject_transactions=c.rejectTransactionMessage)
        sysflag, props = routed.sysflag, routed.properties
    pb = props.encode()
    body = cmd.body
    store_qid = qid if routed is None else routed.queue_id
    store_topic = topic if routed is None else routed.topic
    batch = rec = None
    if is_batch:
        batch = _encode_batch(store_topic, body, pb, dict(   # (never routed: refused above)
            queue_ids=store_qid, sysflag=sysflag, born_timestamp=born_ts,
            reconsume_times=reconsume, born_host=peer.born_host, store_host=b.store_host,
            max_message_bytes=b.config.store.maxMessageSize, store_timestamp=now))
    else:
        if not len(body):
            raise BadRequest(R.MESSAGE_ILLEGAL, "the message body is empty")
        try:
            rec = encode_record(store_topic.encode(), body, pb, store_qid, flag, sysflag, born_ts,
                                peer.born_raw, b.store_host_raw, now, reconsume, 0,
                                b.config.store.maxMessageSize)
        except ValueError as e:
            raise BadRequest(R.MESSAGE_ILLEGAL, str(e)) from None
    dh = 0
    if b.store.dedup_on and not reconsume and dedupable_topic(topic):
        if not is_batch:
            dh = key_hash(pb)
        else:
            rk = read_record_key(memoryview(batch.buf), 0)
            if rk is not None and rk.key is not None:
                dh = hash_of(rk.key)
    tags_code = 0
    if not is_batch:
        tags_code = tags_code_of(pb) if routed is None or routed.tags_code is None \
            else routed.tags_code
    return Prepared(batch, rec, tags_code, qid, topic, store_topic, store_qid, props, dh,
                    routed is not None, rec is not None and not sysflag & SYSFLAG_TRANSACTION_MASK,
                    now)


def _refuse_if_busy(b: Broker, now: int) -> None:
    if b.store.busy_ms(now) > b.config.store.osPageCacheBusyTimeOutMills:
        raise BadRequest(R.SYSTEM_BUSY, PC_BUSY_REMARK)


def _stored(b: Broker, p: Prepared, count: int, nbytes: int) -> None:
    stored(b, p.topic, count, nbytes)


def stored(b: Broker, topic: str, count: int, nbytes: int) -> None:
    """Count ``count`` records of ``nbytes`` sent to ``topic``. (A pull
    parked here on the queue they went to was marked due by the append's
    publish: ``Handlers._published``.)"""
    b.put_count += count
    if b.stats.tally is not None:            # TOPIC_PUT_NUMS / SIZE (broker/stats.py)
        b.stats.tally.put(topic, count, nbytes)


def append_one(b: Broker, peer: Peer, cmd: RemotingCommand, p: Prepared):
    """Append one prepared send and answer it (or park the answer)."""
    _refuse_if_busy(b, p.now)
    batch = p.batch
    if batch is None:
        r = b.store.append_record(p.store_topic, p.store_qid, p.rec, p.tags_code, p.now, p.dh)
    else:
        r = b.store.append(batch, p.dh)
    qid = p.qid
    if r.__class__ is DuplicateResult:
        if not p.routed:
            qid = r.queue_id                   # where the first send's message is
    elif batch is None:
        _stored(b, p, 1, len(p.rec))
    else:
        _stored(b, p, batch.count, batch.buf.shape[0])
    pre = b.msgid_prefix
    if batch is not None:
        msg_id = offset_msg_ids(pre, r.rec_phy)
    else:
        msg_id = f"{pre}{r.phy_offset:016X}"
    return _answer(b, peer, cmd, p.props, msg_id, qid, r.queue_offset, r.end)


def _answer(b: Broker, peer: Peer, cmd: RemotingCommand, props: str, msg_id: str, qid: int,
            queue_offset: int, end: int):
    """A stored send's answer: the SUCCESS frame; under SYNC_FLUSH (until
    ``end`` is flushed) or on a SYNC_MASTER (until a slave has it) the
    answer parked (PARKED), unless the message says WAIT=false; a
    SYNC_MASTER without a slave able to take it answers SLAVE_NOT_AVAILABLE."""
    wait = None if "WAIT\x01false" in props else answer_wait(b, end)
    if wait is None:
        return send_ok_head(cmd.serialize_type, cmd.opaque, msg_id, qid, queue_offset)
    flush, code, slave = wait
    reply = cmd.reply(code, ext={"msgId": msg_id, "queueId": str(qid),
                                 "queueOffset": str(queue_offset), **SEND_REPLY_EXT})
    if not (flush or slave):
        return reply
    park_answer(b, peer, cmd, reply, end, flush, slave)
    return PARKED


def answer_wait(b: Broker, end: int) -> tuple[bool, int, bool] | None:
    """What the answer of a send ending at ``end`` waits for: (the flush,
    the answer's code, a slave's ack), or None: SUCCESS at once (not
    SYNC_FLUSH or flushed already, not a SYNC_MASTER). The send path's and
    the send lane's (``lane.SendLane``) one decision."""
    c = b.config
    flush = c.store.sync_flush and b.store.state.flushed_pos < end
    if not flush and c.brokerRole != SYNC_MASTER:
        return None
    code, slave = _replica_wait(b, end)
    return None if not (flush or slave) and code == R.SUCCESS else (flush, code, slave)


def park_answer(b: Broker, peer: Peer, cmd, reply, end: int, flush: bool, slave: bool) -> None:
    """Park ``reply`` until ``end`` is flushed (``flush``) and/or a slave
    acked it (``slave``), or the longer of the two timeouts passes; never
    before an answer parked earlier (a duplicate of an older send ends
    below it: the order is kept)."""
    c = b.config
    parking = b.parking
    timeout_ms = max(c.store.syncFlushTimeout if flush else 0, c.slaveTimeout if slave else 0)
    parking.park_send(peer, cmd, reply, max(end, parking.last_end), timeout_ms / 1000, flush,
                      slave)


def append_group(b: Broker, items: list) -> list | None:
    """Append single sends to one queue, none a transaction's
    (``[peer, cmd, Prepared, …]`` each, in the order they came) in one
    claim, one write and one publish, and answer each as ``append_one``
    does (a SYNC_FLUSH one parked until the run is flushed): the sends one
    connection, or several, pipelined in a reactor turn (``Handlers.take``).
    All or none are stored. None, with none stored, when one of them must
    be checked for duplicates on its own (``MessageStore.append``'s
    ``each``): append them one by one."""
    first = items[0][2]
    _refuse_if_busy(b, first.now)
    joined = join_records(first.store_topic, [it[2].rec for it in items], first.store_qid,
                          [it[2].tags_code for it in items], max(it[2].now for it in items))
    r = b.store.append(joined, 0, [it[2].dh for it in items])
    if r is None:
        return None
    if any(it[2].topic != first.topic for it in items):   # delays to one level, say
        for it in items:
            _stored(b, it[2], 1, len(it[2].rec))
    else:
        _stored(b, first, len(items), joined.buf.shape[0])
    pre = b.msgid_prefix
    phy, q, end = r.phy_offset, r.queue_offset, r.end
    c = b.config
    if not c.store.sync_flush and c.brokerRole != SYNC_MASTER:     # the answer at once
        out = []
        for (_, cmd, p, *_), pos in zip(items, joined.rec_pos.tolist()):
            out.append(send_ok_head(cmd.serialize_type, cmd.opaque, f"{pre}{phy + pos:016X}",
                                    p.qid, q))
            q += 1
        return out
    return [_answer(b, peer, cmd, p.props, f"{pre}{phy + pos:016X}", p.qid, q + i, end)
            for i, ((peer, cmd, p, *_), pos) in enumerate(zip(items, joined.rec_pos.tolist()))]


def _replica_wait(b: Broker, end: int) -> tuple[int, bool]:
    """(the reply's code, wait for a slave's ack?) of a send ending at
    ``end`` (RocketMQ's CommitLog.submitReplicaRequest, HAService.isSlaveOK)."""
    c = b.config
    if c.brokerRole != SYNC_MASTER:
        return R.SUCCESS, False
    st = b.store.state
    acked = st.get("confirm_pos")
    if st.get("ha_slaves") > 0 and end - acked < c.haSlaveFallbehindMax:
        return R.SUCCESS, acked < end
    return R.SLAVE_NOT_AVAILABLE, False
