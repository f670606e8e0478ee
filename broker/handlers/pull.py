"""PULL_MESSAGE: read a queue from an offset through the consumer's filter
(TAG codes, or SQL92 over the properties), commit its offset if asked, and
answer the records as the store's pieces of a pull body (file ranges for
big runs, slices of the mapping for small ones: ``MessageStore.pull_body``;
records read from disk, checked first, always as file ranges).
Nothing there yet and PULL_SUSPEND set: the pull parks (long polling, for
suspendTimeoutMillis; shortPollingTimeMills with longPollingEnable=false)
and is run again by the parking module, suspension off, when its queue
grows or its hold ends; that answer goes out in JSON, as RocketMQ's does.

Replication (broker/ha): the reply's suggestWhichBrokerId is the master (0)
unless ``slaveReadEnable``; then, as PullMessageProcessor answers, the
group's ``whichBrokerWhenConsumeSlowly`` (1) for a consumer reading further
behind than the page-cache window (``accessMessageInMemoryMaxRatio``), else
the group's ``brokerId`` (0). A slave serves pulls but never stores the
commit offset a pull carries (the master's are copied to it).
"""
from __future__ import annotations

import logging

import numpy as np
from shmq.core import layout as L
from shmq.core.consumequeue import ALL_TAGS
from shmq.core.reader import read_ahead, records_valid
from shmq.core.records import decode, record_fault
from shmq.core.recovery import damaged_at
from shmq.core.store import GetMessageStatus, GetResult
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.headers import PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION, PULL_SUSPEND, BadRequest, Header
from shmq.ipc.remoting import JSON, RemotingCommand, pull_reply_head

from ..sql92 import Sql92Filter
from ..config import SLAVE
from ..topics import PERM_READ, RETRY_GROUP_TOPIC_PREFIX, GroupConfig
from .base import PARKED, Broker, Peer, Reply
from .subscription import Subscription, parse_subscription

# (code, remark) of each status; a queue that has no message (or no slot)
# answers PULL_OFFSET_MOVED instead when the pull did not start at 0
PULL_STATUS_CODE = {st: (code, st.value.encode()) for st, code in (
    (GetMessageStatus.FOUND, R.SUCCESS),
    (GetMessageStatus.NO_MATCHED_MESSAGE, R.PULL_RETRY_IMMEDIATELY),
    (GetMessageStatus.MESSAGE_WAS_REMOVING, R.PULL_RETRY_IMMEDIATELY),
    (GetMessageStatus.OFFSET_FOUND_NULL, R.PULL_NOT_FOUND),
    (GetMessageStatus.OFFSET_OVERFLOW_ONE, R.PULL_NOT_FOUND),
    (GetMessageStatus.OFFSET_OVERFLOW_BADLY, R.PULL_OFFSET_MOVED),
    (GetMessageStatus.OFFSET_TOO_SMALL, R.PULL_OFFSET_MOVED),
    (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, R.PULL_NOT_FOUND),
    (GetMessageStatus.NO_MESSAGE_IN_QUEUE, R.PULL_NOT_FOUND))}
_FOUND = GetMessageStatus.FOUND
_FOUND_CODE = PULL_STATUS_CODE[_FOUND]
SQL_SCAN_ROUNDS = 8          # reads a SQL92-filtered pull makes while nothing matches
log = logging.getLogger("shmq.broker")


def pull(b: Broker, peer: Peer, cmd: RemotingCommand):
    return _pull(b, peer, cmd, True)


def repull(b: Broker, peer: Peer, cmd: RemotingCommand):
    """A parked pull, run again: its answer now, whatever it is."""
    return _pull(b, peer, cmd, False)


def _pull(b: Broker, peer: Peer, cmd: RemotingCommand, allow_suspend: bool):
    ext = cmd.ext
    try:    # the fields every pull has, read straight (Header says what is wrong otherwise)
        group, topic = ext["consumerGroup"], ext["topic"]
        qid, offset = int(ext["queueId"]), int(ext["queueOffset"])
        max_msgs, sysflag = int(ext["maxMsgNums"]), int(ext["sysFlag"])
    except (KeyError, ValueError):
        _refuse_header(ext)
    c = b.config
    tc, sub = topic_and_sub(b, group, topic,
                            ext.get("subscription") if sysflag & PULL_SUBSCRIPTION else None,
                            ext.get("expressionType"))
    if not 0 <= qid < tc.read_queue_nums:
        raise BadRequest(R.SYSTEM_ERROR, f"queueId[{qid}] is illegal, topic:[{topic}] "
                                         f"topicConfig.readQueueNums:[{tc.read_queue_nums}]")
    if sub.error is not None:      # the same error each time: without the last one's frames
        raise sub.error.with_traceback(None)
    if allow_suspend and sysflag & PULL_COMMIT_OFFSET and c.brokerRole != SLAVE:
        try:        # what a push consumer sends with most pulls: read straight, as the fields above
            committed = int(ext["commitOffset"])
        except (KeyError, ValueError):
            committed = Header(ext).int("commitOffset")      # the refusal, worded
        b.registry.commit_offset(topic, group, qid, committed)
    r, cold = read(b, topic, qid, offset, max_msgs, sub)
    st = r.status
    if st is _FOUND:     # the one status with records (SUCCESS): no enum hashed for its code
        code, remark = _FOUND_CODE
        parts, nbytes = found_body(b, r, topic, group, cold)
    else:
        code, remark = status_code(st, offset)
        if code == R.PULL_NOT_FOUND and allow_suspend and sysflag & PULL_SUSPEND:
            hold = (Header(ext).int("suspendTimeoutMillis", 15000) if c.longPollingEnable
                    else c.shortPollingTimeMills)
            b.parking.park_pull(peer, cmd, topic, qid, offset, max(0, hold) / 1000)
            return PARKED
        parts, nbytes = _NO_BODY
    # the reply to a parked pull goes out in JSON, as RocketMQ's
    head = pull_reply_head(cmd.serialize_type if allow_suspend else JSON, cmd.opaque, code, remark,
                           suggest(b, group, cold) if c.slaveReadEnable else 0,
                           r.next_offset, r.min_offset, r.max_offset, nbytes)
    return Reply(head, parts, nbytes)


_NO_BODY = ((), 0)


def status_code(st: GetMessageStatus, offset: int) -> tuple[int, bytes]:
    """(code, remark) of a pull from ``offset`` that found no record: a
    queue with no message (or no slot) answers PULL_OFFSET_MOVED when the
    pull did not start at 0."""
    code, remark = PULL_STATUS_CODE[st]
    if offset != 0 and (st is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
                        or st is GetMessageStatus.NO_MESSAGE_IN_QUEUE):
        code = R.PULL_OFFSET_MOVED
    return code, remark


def topic_and_sub(b: Broker, group: str, topic: str, expr: str | None,
                  etype: str | None) -> tuple[dict, Subscription]:
    """A pull's topic config and subscription: the one it carries
    (``expr``, with its expressionType), else the one ``group`` registered
    here (``_ALL`` when none), the checks remembered as a send's are.
    Raises the refusal (BadRequest)."""
    if expr is not None:
        etype = etype or "TAG"
        sql = b.config.enablePropertyFilter
        return b.remembered(b.pull_subs, (group, topic, expr, etype, sql), _check_pull_sub,
                            b, group, topic, expr, etype, sql)
    tc = _topic_for_pull(b, group, topic)
    sub = b.subs.get((group, topic))
    return tc, _ALL if sub is None else sub    # not registered here: serve all, clients re-filter


def read(b: Broker, topic: str, qid: int, offset: int, max_msgs: int,
         sub: Subscription) -> tuple[GetResult, bool]:
    """The records a pull gets (``GetResult``) through its subscription,
    and whether they were read from disk (cold: read ahead, and checked,
    as records are wherever the scrub listed damage)."""
    c = b.config
    store = b.store
    r = store.get_message(topic, qid, offset, max(1, min(max_msgs, c.maxTransferCountOnMessageInMemory)),
                          sub.codes, c.maxTransferBytesOnMessageInMemory)
    if sub.sql is not None and (c.filterSupportRetry
                                or not topic.startswith(RETRY_GROUP_TOPIC_PREFIX)):
        r = _sql_filtered(b, r, sub.sql, topic, qid, max_msgs)
    cold = False
    phys = r.phys
    if phys.shape[0]:
        first = int(phys[0])
        cold = first < store.state.write_pos - b.in_memory_bytes
        if cold:
            _read_ahead(b, topic, qid, offset, r.next_offset, r.max_offset, first)
        if cold or b.damaged:
            r = _checked(b, r, topic, qid, offset)     # read from disk, or damage listed: check
    return r, cold


def found_body(b: Broker, r: GetResult, topic: str, group: str, cold: bool) -> tuple[list, int]:
    """The records a pull found (status FOUND) as the pieces of its reply
    body, and their bytes; counted in the stats."""
    n = r.sizes.shape[0]
    stats = b.stats
    stats.got += n
    # Records read from disk go out by sendfile whatever their size: the
    # kernel copies them from the page cache the read-ahead filled, without
    # faulting each page into this worker's mapping first.
    parts, nbytes = b.store.pull_body(r.phys, r.sizes,
                                      0 if cold else b.config.transferSendfileMinBytes, r.nbytes)
    if stats.tally is not None:                  # GROUP_GET_NUMS / SIZE (broker/stats.py)
        stats.tally.get(topic, group, n, nbytes)
    return parts, nbytes


def _refuse_header(ext: dict[str, str]):
    """The BadRequest a pull header lacking a field, or with a field that is
    not a number, gets (read in the order RocketMQ's decoding checks them)."""
    h = Header(ext)
    h.str("consumerGroup"), h.str("topic")
    for name in ("queueId", "queueOffset", "maxMsgNums", "sysFlag"):
        h.int(name)
    raise AssertionError(f"a pull header that Header reads whole: {ext}")


_ALL = parse_subscription("", "*")      # (topic_and_sub: a subscription not registered here)


def _check_pull_sub(b: Broker, group: str, topic: str, expr: str, etype: str,
                    sql_enabled: bool) -> tuple[dict, Subscription]:
    """A pull that carries its subscription (a pull consumer's, or a push
    consumer's with postSubscriptionWhenPull): the topic's config if
    ``group`` may pull it (``_check_pull_topic``: its refusal is not
    remembered) and the subscription parsed, remembered together per
    (group, topic, expression, type) as the worker's checks are: a pull
    consumer sends the same one with every pull. An expression the broker
    cannot use is kept as the subscription's ``error``, raised after the
    queue id's check, as RocketMQ builds the subscription after it."""
    tc = _topic_for_pull(b, group, topic)
    try:
        return tc, parse_subscription(topic, expr, etype, 0, sql_enabled)
    except BadRequest as e:
        return tc, Subscription(topic, expr, ALL_TAGS, 0, etype, error=e)


# A pull far behind (its records older than the page-cache window,
# accessMessageInMemoryMaxRatio) reads ahead: the ConsumeQueue units of the
# next READ_AHEAD_UNITS offsets and the CommitLog runs they point at, runs
# closer than READ_AHEAD_GAP_BYTES read as one (core.reader.read_ahead),
# once the look-ahead left is under half of it: one call per READ_AHEAD_UNITS
# / 2 units a queue is read (a few syscalls every ~64 pulls of 32), none for
# a pull near the head. Its own queue's runs only: 8 queues interleave in
# the CommitLog, and reading all their bytes would cost the page cache 8×.
# Each time it reads ahead, it also gives back this worker's pages of what
# the queue was served since the last time (CommitLog.drop): a reader going
# through a backlog of GBs would otherwise leave them all in the worker's RSS.
READ_AHEAD_UNITS = 4096
READ_AHEAD_GAP_BYTES = 64 << 10
# (store, topic, queue) → (queue offset read ahead to, the queue offset and
# CommitLog offset its pulls had reached then)
_ahead: dict[tuple[int, str, int], tuple[int, int, int]] = {}


def _read_ahead(b: Broker, topic: str, qid: int, offset: int, nxt: int, mx: int, phy: int) -> None:
    key = (id(b.store), topic, qid)
    upto, since_off, since = _ahead.get(key, (-1, -1, -1))
    if not offset <= upto <= offset + 2 * READ_AHEAD_UNITS:   # new here, or moved elsewhere
        upto, since_off, since = offset, -1, -1
    units = min(READ_AHEAD_UNITS, mx - upto)
    if upto - nxt < READ_AHEAD_UNITS // 2 and units > 0:
        if 0 <= since < phy:
            b.store.cl.drop(since, phy)
            b.store.cqs.drop(topic, qid, since_off, offset)
        _ahead[key] = (read_ahead(b.store.cl, b.store.cqs, topic, qid, upto, units,
                                  READ_AHEAD_GAP_BYTES), offset, phy)


def _checked(b: Broker, r: GetResult, topic: str, qid: int, offset: int) -> GetResult:
    """``r`` without the first record read from disk that fails its check
    (``records.record_fault``), or that lies in a range the scrub listed
    (``recovery.DamageLog``), and what follows it: the records before it
    are served, and a pull that starts at it moves the queue past it
    (NO_MATCHED_MESSAGE, next offset after it: PULL_RETRY_IMMEDIATELY), so
    a damaged record is never served and never stops a consumer. Each one
    is an ERROR once per worker and counted in the stats (corruptSkipped)."""
    horizon = b.store.state.write_pos - b.in_memory_bytes
    phys, sizes = r.phys.tolist(), r.sizes.tolist()
    if not b.damaged and b.corrupt_seen.keys().isdisjoint(phys):
        # the usual case: all pass, checked in the kernel (all read from disk
        # unless the pull reaches the page-cache window: records ascend)
        if phys[-1] < horizon:
            ok = records_valid(b.store.cl, r.phys, r.sizes)
        else:
            old = r.phys < horizon
            ok = records_valid(b.store.cl, r.phys[old], r.sizes[old])
        if ok:
            return r
    for i, (p, n) in enumerate(zip(phys, sizes)):
        why = b.corrupt_seen.get(p) or (damaged_at(b.damaged, p, n) if b.damaged else None)
        if why is None:
            if p >= horizon:
                continue                  # newer: in the page cache this broker wrote
            why = record_fault(memoryview(b.store.record_view(p, n)), p)
            if why is None:
                continue
        qoff = _queue_offset_of(b, topic, qid, offset, p)
        if p not in b.corrupt_seen:
            b.corrupt_seen[p] = why
            b.stats.corrupt_skipped += 1
            log.error("pull %s queue %d: %s; queue offset %s is skipped, never served "
                      "(recovery quarantines it at the next start if it lies in the segments "
                      "it scans; shmq store inspect --offset %d shows it)", topic, qid, why,
                      qoff, p)
        if i:
            prev = b.store.record_view(phys[i - 1], sizes[i - 1])
            q = L.OFF_QUEUEOFFSET
            nxt = int.from_bytes(prev[q:q + 8].tobytes(), "big", signed=True) + 1
            return GetResult(r.status, nxt, r.min_offset, r.max_offset, r.phys[:i], r.sizes[:i])
        nxt = r.next_offset if qoff is None else qoff + 1
        return GetResult(GetMessageStatus.NO_MATCHED_MESSAGE, nxt, r.min_offset, r.max_offset,
                         r.phys[:0], r.sizes[:0])
    return r


def _queue_offset_of(b: Broker, topic: str, qid: int, offset: int, phy: int) -> int | None:
    """The queue offset at or after ``offset`` whose unit points at ``phy``."""
    while True:
        units = b.store.queue_units(topic, qid, offset, 1024)
        if not units.shape[0]:
            return None
        hit = np.flatnonzero(units["phy_offset"] == phy)
        if hit.shape[0]:
            return offset + int(hit[0])
        offset += units.shape[0]


def suggest(b: Broker, group: str, cold: bool) -> int:
    """The broker id a consumer should pull from next (slaveReadEnable on)."""
    g = b.tables.groups.get(group) or GroupConfig(group)
    return int(g.which_broker_when_consume_slowly if cold else g.broker_id)


def _topic_for_pull(b: Broker, group: str, topic: str) -> dict:
    """The topic's config if ``group`` may pull it here (NO_PERMISSION,
    SUBSCRIPTION_GROUP_NOT_EXIST, TOPIC_NOT_EXIST otherwise), remembered
    until the tables change, as a send's checks are."""
    return b.remembered(b.pull_topics, (group, topic), _check_pull_topic, b, group, topic)


def _check_pull_topic(b: Broker, group: str, topic: str) -> dict:
    c = b.config
    if not b.tables.broker_permission() & PERM_READ:
        raise BadRequest(R.NO_PERMISSION, f"the broker[{c.brokerName}] pulling "
                                          f"message is forbidden")
    if b.tables.group(group, c.autoCreateSubscriptionGroup) is None:
        raise BadRequest(R.SUBSCRIPTION_GROUP_NOT_EXIST,
                         f"subscription group [{group}] does not exist")
    tc = b.tables.topics.get(topic)
    if tc is None:
        raise BadRequest(R.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
    if not tc.perm & PERM_READ:
        raise BadRequest(R.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
    return tc


def _sql_filtered(b: Broker, r: GetResult, sql: Sql92Filter, topic: str, qid: int,
                  max_msgs: int) -> GetResult:
    """Keep the records whose properties match ``sql``, reading on while
    none did (up to SQL_SCAN_ROUNDS reads), as RocketMQ's getMessage
    filters by CommitLog after the ConsumeQueue."""
    c = b.config
    for _ in range(SQL_SCAN_ROUNDS):
        if r.status is not GetMessageStatus.FOUND:
            return r
        keep = [i for i, (p, n) in enumerate(zip(r.phys.tolist(), r.sizes.tolist()))
                if sql.matches(decode(b.store.record_view(p, n), 0, check_crc=False).properties)]
        if keep:
            return GetResult(r.status, r.next_offset, r.min_offset, r.max_offset,
                             r.phys[keep], r.sizes[keep])
        if r.next_offset >= r.max_offset:
            break
        r = b.store.get_message(topic, qid, r.next_offset,
                                max(1, min(max_msgs, c.maxTransferCountOnMessageInMemory)),
                                ALL_TAGS, c.maxTransferBytesOnMessageInMemory)
    return GetResult(GetMessageStatus.NO_MATCHED_MESSAGE, r.next_offset, r.min_offset,
                     r.max_offset, r.phys[:0], r.sizes[:0])
