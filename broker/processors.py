"""Request processors: RocketMQ 4.x request code → handler, run on the worker that read it.

``Processors`` is a worker's whole request-handling state: the store, the
shared tables, the subscriptions its clients registered, and what it has
parked (pulls waiting for messages, SYNC_FLUSH sends waiting for the disk).
``on_command`` runs one request to completion: it answers at once, or parks
and answers when the control block wakes the worker (new messages, flush
progress, a consumer group that changed) or a deadline passes. Replies echo
the request's opaque and serialization; errors carry RocketMQ's response
code and a remark; an unknown code gets REQUEST_CODE_NOT_SUPPORTED; no
request can raise out of here.
"""
from __future__ import annotations

import ipaddress
import logging
import random
import time
from dataclasses import dataclass

import numpy as np
import orjson
from shmq.core.checkpoint import parse_json_lenient
from shmq.core.consumequeue import ALL_TAGS
from shmq.core.index import IndexService
from shmq.core.layout import (
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_NOT,
    SYSFLAG_TRANSACTION_ROLLBACK,
    java_string_hash,
    properties_to_string,
    string_to_properties,
)
from shmq.core.records import decode, encode_arrays, split_batch_body
from shmq.core.retention import disk_full_remark
from shmq.core.state import StoreFullError
from shmq.core.store import GetMessageStatus, GetResult, MessageStore
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.codes import not_supported_remark
from shmq.ipc.control import WANT_CLIENTS, WANT_FLUSH, WANT_PUBLISH, ControlBlock
from shmq.ipc.fastjson import mq_map
from shmq.ipc.headers import (
    PULL_COMMIT_OFFSET,
    PULL_SUBSCRIPTION,
    PULL_SUSPEND,
    V2_KEYS,
    BadRequest,
    Header,
)
from shmq.ipc.remoting import (
    FLAG_ONEWAY,
    JSON,
    VERSION_4_9_7,
    RemotingCommand,
    encode_head,
)

from .config import RUNTIME_SETTINGS, BrokerConfig, conf_text, parse_conf
from .delivery import (
    DELAY,
    ORIGIN_MESSAGE_ID,
    PGROUP,
    RETRY_TOPIC,
    UNIQ_KEY,
    check_body,
    needs_routing,
    repost,
    reset_body,
    route_send,
    stored,
)
from .reactor import Connection, FileRange, Reactor
from .registry import (
    LOCK_LEASE_MS,
    Registry,
    client_payload,
    consumer_key,
    lock_key,
    post_notice,
)
from .sql92 import FilterSyntaxError, Sql92Filter, compile_sql92
from .stats import SAMPLE_S, RuntimeStats
from .topics import (
    DLQ_GROUP_TOPIC_PREFIX,
    NOT_ALLOWED_SEND_TOPICS,
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    TRANS_HALF_TOPIC,
    Tables,
    group_config,
    topic_config,
    topic_error,
)
from .transactions import resolve_half

log = logging.getLogger("shmq.broker")

MULTI_TAGS_FLAG = 0x2
PULL_STATUS_CODE = {
    GetMessageStatus.FOUND: R.SUCCESS,
    GetMessageStatus.NO_MATCHED_MESSAGE: R.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.MESSAGE_WAS_REMOVING: R.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.OFFSET_FOUND_NULL: R.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: R.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: R.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_TOO_SMALL: R.PULL_OFFSET_MOVED,
}
VERSION_3_4_9 = 121         # clients from here on may send their own maxReconsumeTimes
SQL_SCAN_ROUNDS = 8          # reads a SQL92-filtered pull makes while nothing matches
SEND_REPLY_EXT = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}


@dataclass
class Subscription:
    topic: str
    sub_string: str
    codes: np.ndarray          # sorted tag codes; empty = every message
    version: int
    expression_type: str
    sql: Sql92Filter | None = None
    error: BadRequest | None = None    # a registered expression the broker cannot use


def parse_subscription(topic: str, sub: str | None, expression_type: str | None = None,
                       version: int = 0, sql_enabled: bool = False) -> Subscription:
    """FilterAPI.buildSubscriptionData: TAG expressions ('*'/empty = all, else
    tags split on '||'; codes are Java String.hashCode of each tag) or SQL92
    expressions over the message properties (enablePropertyFilter)."""
    etype = (expression_type or "TAG").upper()
    s = (sub or "").strip()
    if etype == "SQL92":
        if not sql_enabled:
            raise BadRequest(R.SYSTEM_ERROR, "The broker does not support consumer to filter "
                                             "message by SQL92")
        try:
            return Subscription(topic, s, ALL_TAGS, version, etype, compile_sql92(s))
        except FilterSyntaxError as e:
            raise BadRequest(R.SUBSCRIPTION_PARSE_FAILED,
                             f"parse the consumer's subscription[{sub}] failed: {e}") from None
    if etype != "TAG":
        raise BadRequest(R.SYSTEM_ERROR, "The broker does not support consumer to filter "
                                         "message by " + etype)
    if not s or s == "*":
        return Subscription(topic, "*", ALL_TAGS, version, etype)
    tags = [t.strip() for t in s.split("||") if t.strip()]
    if not tags:
        raise BadRequest(R.SUBSCRIPTION_PARSE_FAILED, f"parse the consumer's subscription[{sub}] failed")
    codes = np.array(sorted({java_string_hash(t) for t in tags}), dtype=np.int64)
    return Subscription(topic, s, codes, version, etype)


def _int_or(v, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def peer_host(peer: str) -> tuple[str, int]:
    host, _, port = peer.rpartition(":")
    try:
        ipaddress.ip_address(host)
        return host, int(port)
    except ValueError:
        return "127.0.0.1", 0     # a Unix-socket client


@dataclass
class ParkedPull:
    conn: Connection
    cmd: RemotingCommand
    offset: int
    deadline: float


@dataclass
class ParkedSend:
    conn: Connection
    cmd: RemotingCommand
    reply: RemotingCommand
    end: int
    deadline: float


class Processors:
    def __init__(self, config: BrokerConfig, store: MessageStore, cb: ControlBlock,
                 tables: Tables, registry: Registry, reactor: Reactor):
        self.config = config
        self.store = store
        self.cb = cb
        self.tables = tables
        self.registry = registry
        self.reactor = reactor
        self.store_host = (config.brokerIP1, config.listenPort)
        ip = ipaddress.ip_address(config.brokerIP1).packed
        self.msgid_prefix = (ip + config.listenPort.to_bytes(4, "big")).hex().upper()
        self.cluster_prop = f"CLUSTER\x01{config.brokerClusterName}"
        self.seg_bytes = config.store.mappedFileSizeCommitLog
        self.parked_pulls: dict[tuple[str, int], list[ParkedPull]] = {}
        self.parked_sends: list[ParkedSend] = []
        self.subs: dict[tuple[str, str], Subscription] = {}
        self.group_conns: dict[str, dict[str, Connection]] = {}
        self.notified: dict[str, list[str]] = {}
        self.seen_clients_epoch = -1
        self.producer_conns: dict[int, Connection] = {}
        self.seen_resets: dict[bytes, int] = {}
        self.seen_notices_epoch = -1
        self.boot_ms = int(time.time() * 1000)
        self.put_count = 0
        self.stats = RuntimeStats(store, cb)       # putTps, getTransferedTps, disk use
        reactor.every(SAMPLE_S, self.stats.sample)
        self.delay_levels = config.delay_levels_ms
        self.index: IndexService | None = None      # opened on the first query
        self.handlers = {
            RC.SEND_MESSAGE: self.send, RC.SEND_MESSAGE_V2: self.send,
            RC.SEND_BATCH_MESSAGE: self.send,
            RC.PULL_MESSAGE: self.pull,
            RC.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RC.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RC.GET_MAX_OFFSET: self.get_max_offset, RC.GET_MIN_OFFSET: self.get_min_offset,
            RC.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset,
            RC.GET_EARLIEST_MSG_STORETIME: self.earliest_store_time,
            RC.HEART_BEAT: self.heartbeat, RC.UNREGISTER_CLIENT: self.unregister_client,
            RC.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
            RC.LOCK_BATCH_MQ: self.lock_batch, RC.UNLOCK_BATCH_MQ: self.unlock_batch,
            RC.VIEW_MESSAGE_BY_ID: self.view_message, RC.QUERY_MESSAGE: self.query_message,
            RC.UPDATE_AND_CREATE_TOPIC: self.create_topic,
            RC.DELETE_TOPIC_IN_BROKER: self.delete_topic,
            RC.GET_ALL_TOPIC_CONFIG: self.all_topic_config,
            RC.GET_BROKER_RUNTIME_INFO: self.runtime_info,
            RC.CONSUMER_SEND_MSG_BACK: self.send_back,
            RC.END_TRANSACTION: self.end_transaction,
            RC.INVOKE_BROKER_TO_RESET_OFFSET: self.reset_offset,
            RC.UPDATE_BROKER_CONFIG: self.update_broker_config,
            RC.CHECK_CLIENT_CONFIG: self.check_client_config,
            RC.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.update_group,
            RC.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.all_groups,
            RC.DELETE_SUBSCRIPTIONGROUP: self.delete_group,
            RC.GET_BROKER_CONFIG: self.get_broker_config,
            RC.GET_TOPIC_STATS_INFO: self.topic_stats,
            RC.GET_CONSUME_STATS: self.consume_stats,
            RC.GET_CONSUMER_CONNECTION_LIST: self.consumer_connection,
            RC.QUERY_TOPIC_CONSUME_BY_WHO: self.topic_consumed_by,
        }

    # ---------------------------------------------------------------- dispatch
    def on_command(self, conn: Connection, cmd: RemotingCommand) -> None:
        if cmd.is_response:
            return    # a client acknowledging one of our notifications
        handler = self.handlers.get(cmd.code)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: request %d %s body %d bytes", conn.peer, cmd.code, cmd.ext, len(cmd.body))
        try:
            if handler is None:
                self.respond(conn, cmd, cmd.reply(R.REQUEST_CODE_NOT_SUPPORTED,
                                                  not_supported_remark(cmd.code)))
            else:
                handler(conn, cmd)
        except BadRequest as e:
            self.respond(conn, cmd, cmd.reply(e.code, e.remark))
        except StoreFullError as e:
            self.respond(conn, cmd, cmd.reply(R.SERVICE_NOT_AVAILABLE, str(e)))
        except OSError as e:
            log.error("request %d from %s: %s", cmd.code, conn.peer, e)
            self.respond(conn, cmd, cmd.reply(R.SERVICE_NOT_AVAILABLE,
                                              f"service not available now: {e}"))
        except Exception as e:
            log.exception("request %d from %s failed", cmd.code, conn.peer)
            self.respond(conn, cmd, cmd.reply(R.SYSTEM_ERROR, f"{type(e).__name__}: {e}"))

    def respond(self, conn: Connection, cmd: RemotingCommand, reply: RemotingCommand,
                parts=None) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: reply to %d: %d %s %s", conn.peer, cmd.code, reply.code, reply.remark,
                      reply.ext)
        if cmd.is_oneway:
            return
        if parts is None:
            parts = (reply.body,) if reply.body else ()
            nbytes = len(reply.body)
        else:
            nbytes = sum(p.n if isinstance(p, FileRange) else p.nbytes for p in parts)
        conn.send(encode_head(reply, nbytes), parts)

    def reply_json(self, conn, cmd, obj, code: int = R.SUCCESS) -> None:
        self.respond(conn, cmd, cmd.reply(code, body=orjson.dumps(obj)))

    # -------------------------------------------------------------------- send
    def _topic_for_send(self, h: Header, topic: str) -> dict:
        if not self.tables.broker_permission() & PERM_WRITE:
            raise BadRequest(R.NO_PERMISSION, f"the broker[{self.config.brokerName}] sending "
                                              f"message is forbidden")
        err = topic_error(topic)
        if err:
            raise BadRequest(R.SYSTEM_ERROR, err)
        if topic in NOT_ALLOWED_SEND_TOPICS:
            raise BadRequest(R.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden.")
        tables = self.tables
        tc = tables.topics.get(topic)
        if tc is None:
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                tc = tables.retry_topic(topic[len(RETRY_GROUP_TOPIC_PREFIX):])
            else:
                tc = tables.create_topic_on_send(topic, h.str("defaultTopic"),
                                                 h.int("defaultTopicQueueNums", 4))
            if tc is None:
                raise BadRequest(R.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not tc["perm"] & PERM_WRITE:
            raise BadRequest(R.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        return tc

    def _check_disk(self) -> None:
        """Every write a client asks for (send, send-back, end of a
        transaction) is refused while the disk is full, before it appends."""
        full = self.store.state.get("disk_full")   # published by the flusher (core/retention.py)
        if full:
            raise BadRequest(R.SERVICE_NOT_AVAILABLE, disk_full_remark(full / 10_000))

    def send(self, conn: Connection, cmd: RemotingCommand) -> None:
        ext = cmd.ext
        if cmd.code != RC.SEND_MESSAGE:
            ext = {V2_KEYS.get(k, k): v for k, v in ext.items()}
        h = Header(ext)
        topic = h.str("topic")
        h.str("producerGroup")
        tc = self._topic_for_send(h, topic)
        self._check_disk()
        nq = int(tc["writeQueueNums"])
        qid = h.int("queueId")
        if qid < 0:
            qid = random.randrange(max(1, nq))
        if qid >= max(nq, int(tc["readQueueNums"])):
            raise BadRequest(R.SYSTEM_ERROR, f"request queueId[{qid}] is illegal, topic: {topic} "
                                             f"writeQueueNums: {nq}")
        sysflag = h.int("sysFlag")
        if tc.get("topicFilterType") == "MULTI_TAG":
            sysflag |= MULTI_TAGS_FLAG
        props = (h.str("properties", "") or "").rstrip("\x02")
        if "CLUSTER\x01" not in props:
            props = f"{props}\x02{self.cluster_prop}" if props else self.cluster_prop
        is_batch = h.bool("batch")
        now = int(time.time() * 1000)
        routed = None
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and not is_batch:
            topic, qid, props = self._retry_or_dlq(h, topic, qid, props)
        if needs_routing(props, sysflag):
            if is_batch:
                raise BadRequest(R.MESSAGE_ILLEGAL, "a batch cannot carry a delay, a delivery "
                                                    "time or a transaction")
            c = self.config
            routed = route_send(topic, qid, sysflag, props, now_ms=now,
                                delay_levels=self.delay_levels, timer_enable=c.timerWheelEnable,
                                timer_max_delay_ms=c.timerMaxDelaySec * 1000,
                                reject_transactions=c.rejectTransactionMessage)
            sysflag, props = routed.sysflag, routed.properties
        pb = props.encode()
        body = cmd.body
        common = dict(queue_ids=qid if routed is None else routed.queue_id, sysflag=sysflag,
                      born_timestamp=h.int("bornTimestamp"),
                      reconsume_times=h.int("reconsumeTimes", 0),
                      born_host=peer_host(conn.peer), store_host=self.store_host,
                      max_message_bytes=self.config.store.maxMessageSize, store_timestamp=now)
        store_topic = topic if routed is None else routed.topic
        try:
            if is_batch:
                bb = split_batch_body(body, pb)
                flags = bb.flags
                flag = int(flags[0]) if (flags == flags[0]).all() else flags
                batch = encode_arrays(store_topic, bb.body_buf, bb.body_off, bb.body_len,
                                      bb.props_buf, bb.props_off, bb.props_len, flag=flag,
                                      **common)
            else:
                if not len(body):
                    raise ValueError("the message body is empty")
                bbuf = np.frombuffer(body, np.uint8)
                pbuf = np.frombuffer(pb, np.uint8)
                batch = encode_arrays(store_topic, bbuf, np.zeros(1, np.int64),
                                      np.array([bbuf.shape[0]], np.int64), pbuf,
                                      np.zeros(1, np.int64), np.array([pbuf.shape[0]], np.int64),
                                      flag=h.int("flag"), shared_properties=pb, **common)
        except ValueError as e:
            raise BadRequest(R.MESSAGE_ILLEGAL, str(e)) from None
        if routed is not None and routed.tags_code is not None:
            batch.tags_codes[:] = routed.tags_code
        r = self.store.append(batch)
        self.put_count += batch.count
        pre = self.msgid_prefix
        if batch.count == 1:
            msg_id = f"{pre}{r.phy_offset:016X}"
        else:
            msg_id = ",".join(f"{pre}{p:016X}" for p in r.rec_phy.tolist())
        reply = cmd.reply(R.SUCCESS, ext={"msgId": msg_id, "queueId": str(qid),
                                          "queueOffset": str(r.queue_offset), **SEND_REPLY_EXT})
        if self.config.store.sync_flush and self.store.state.flushed_pos < r.end \
                and "WAIT\x01false" not in props:
            self._park_send(conn, cmd, reply, r.end)
            return
        self.respond(conn, cmd, reply)

    def _retry_or_dlq(self, h: Header, topic: str, qid: int, props: str) -> tuple[str, int, str]:
        """A consumer's own re-send to %RETRY%group goes to %DLQ%group once it
        has been consumed maxReconsumeTimes times (handleRetryAndDLQ)."""
        group = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
        gc = self.tables.group(group, self.config.autoCreateSubscriptionGroup)
        if gc is None:
            raise BadRequest(R.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
        max_times = h.int("maxReconsumeTimes", int(gc.get("retryMaxTimes", 16)))
        if h.int("reconsumeTimes", 0) < max_times:
            return topic, qid, props
        d = string_to_properties(props)
        d.pop(DELAY, None)
        self._dlq_topic(group)
        return DLQ_GROUP_TOPIC_PREFIX + group, 0, properties_to_string(d)

    def _dlq_topic(self, group: str) -> dict:
        tc = self.tables.dlq_topic(group)
        if not tc["perm"] & PERM_WRITE:
            raise BadRequest(R.NO_PERMISSION, f"the topic[{tc['topicName']}] sending message "
                                              f"is forbidden")
        return tc

    def _park_send(self, conn, cmd, reply, end) -> None:
        timeout = self.config.store.syncFlushTimeout / 1000
        self.parked_sends.append(ParkedSend(conn, cmd, reply, end, time.monotonic() + timeout))
        self.cb.set_flag(WANT_FLUSH, True)
        if len(self.parked_sends) == 1:
            self.reactor.call_later(timeout, self.check_parked_sends)
        if self.store.state.flushed_pos >= end:   # flushed before the flag was up
            self.reactor.call_soon(self.check_parked_sends)

    def check_parked_sends(self) -> None:
        if not self.parked_sends:
            return
        flushed = self.store.state.flushed_pos
        now = time.monotonic()
        keep = []
        for p in self.parked_sends:
            if p.end <= flushed:
                self.respond(p.conn, p.cmd, p.reply)
            elif now >= p.deadline:
                p.reply.code = R.FLUSH_DISK_TIMEOUT
                p.reply.remark = "flush the message to disk timed out (syncFlushTimeout)"
                self.respond(p.conn, p.cmd, p.reply)
            elif not p.conn.closed:
                keep.append(p)
        self.parked_sends = keep
        if not keep:
            self.cb.set_flag(WANT_FLUSH, False)
        else:
            self.reactor.call_later(max(0.0, min(p.deadline for p in keep) - now) + 0.001,
                                    self.check_parked_sends)

    # -------------------------------------------------------------------- pull
    def pull(self, conn: Connection, cmd: RemotingCommand, allow_suspend: bool = True) -> None:
        h = Header(cmd.ext)
        group, topic = h.str("consumerGroup"), h.str("topic")
        qid, offset = h.int("queueId"), h.int("queueOffset")
        max_msgs = h.int("maxMsgNums")
        sysflag = h.int("sysFlag")
        if not self.tables.broker_permission() & PERM_READ:
            raise BadRequest(R.NO_PERMISSION, f"the broker[{self.config.brokerName}] pulling "
                                              f"message is forbidden")
        if self.tables.group(group, self.config.autoCreateSubscriptionGroup) is None:
            raise BadRequest(R.SUBSCRIPTION_GROUP_NOT_EXIST,
                             f"subscription group [{group}] does not exist")
        tc = self.tables.topics.get(topic)
        if tc is None:
            raise BadRequest(R.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not tc["perm"] & PERM_READ:
            raise BadRequest(R.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if not 0 <= qid < int(tc["readQueueNums"]):
            raise BadRequest(R.SYSTEM_ERROR, f"queueId[{qid}] is illegal, topic:[{topic}] "
                                             f"topicConfig.readQueueNums:[{tc['readQueueNums']}]")
        c = self.config
        if sysflag & PULL_SUBSCRIPTION and h.str("subscription", required=False) is not None:
            sub = parse_subscription(topic, h.str("subscription"), h.str("expressionType", "TAG"),
                                     sql_enabled=c.enablePropertyFilter)
        else:
            sub = self.subs.get((group, topic))
            if sub is None:   # not registered with this worker: serve all, clients re-filter
                sub = parse_subscription(topic, "*")
        if sub.error is not None:
            raise sub.error
        if allow_suspend and sysflag & PULL_COMMIT_OFFSET:
            self.registry.commit_offset(topic, group, qid, h.int("commitOffset"))
        r = self.store.get_message(topic, qid, offset,
                                   max(1, min(max_msgs, c.maxTransferCountOnMessageInMemory)),
                                   sub.codes, c.maxTransferBytesOnMessageInMemory)
        if sub.sql is not None and (c.filterSupportRetry
                                    or not topic.startswith(RETRY_GROUP_TOPIC_PREFIX)):
            r = self._sql_filtered(r, sub.sql, topic, qid, max_msgs)
        st = r.status
        if st in (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MESSAGE_IN_QUEUE):
            code = R.PULL_OFFSET_MOVED if offset != 0 else R.PULL_NOT_FOUND
        else:
            code = PULL_STATUS_CODE[st]
        if code == R.PULL_NOT_FOUND and allow_suspend and sysflag & PULL_SUSPEND:
            hold = h.int("suspendTimeoutMillis", 15000) if c.longPollingEnable else c.shortPollingTimeMills
            self._park_pull(conn, cmd, topic, qid, offset, max(0, hold) / 1000)
            return
        ext = {"suggestWhichBrokerId": "0", "nextBeginOffset": str(r.next_offset),
               "minOffset": str(r.min_offset), "maxOffset": str(r.max_offset)}
        # the reply to a parked pull goes out in JSON, as RocketMQ's does
        reply = cmd.reply(code, st.value, ext)
        if not allow_suspend:
            reply.serialize_type = JSON
        if code == R.SUCCESS:
            self.stats.got += len(r.sizes)
            self.respond(conn, cmd, reply, self._body_parts(r.phys, r.sizes))
        else:
            self.respond(conn, cmd, reply)

    def _sql_filtered(self, r: GetResult, sql: Sql92Filter, topic: str, qid: int,
                      max_msgs: int) -> GetResult:
        """Keep the records whose properties match ``sql``, reading on while
        none did (up to SQL_SCAN_ROUNDS reads), as RocketMQ's getMessage
        filters by CommitLog after the ConsumeQueue."""
        c = self.config
        for _ in range(SQL_SCAN_ROUNDS):
            if r.status is not GetMessageStatus.FOUND:
                return r
            keep = [i for i, (p, n) in enumerate(zip(r.phys.tolist(), r.sizes.tolist()))
                    if sql.matches(self._properties(p, n))]
            if keep:
                return GetResult(r.status, r.next_offset, r.min_offset, r.max_offset,
                                 r.phys[keep], r.sizes[keep])
            if r.next_offset >= r.max_offset:
                break
            r = self.store.get_message(topic, qid, r.next_offset,
                                       max(1, min(max_msgs, c.maxTransferCountOnMessageInMemory)),
                                       ALL_TAGS, c.maxTransferBytesOnMessageInMemory)
        return GetResult(GetMessageStatus.NO_MATCHED_MESSAGE, r.next_offset, r.min_offset,
                         r.max_offset, r.phys[:0], r.sizes[:0])

    def _properties(self, phy: int, size: int) -> dict[str, str]:
        raw = self.store.record_view(phy, size)
        return decode(raw, 0, check_crc=False).properties

    def _body_parts(self, phys: np.ndarray, sizes: np.ndarray) -> list:
        """The records as few ranges as possible (adjacent ones joined): big
        ranges by sendfile from the segment file, small ones as slices of
        the mapping (one sendmsg for all)."""
        p, s = phys.tolist(), sizes.tolist()
        n = len(p)
        parts = []
        cl = self.store.cl
        seg = self.seg_bytes
        big = self.config.transferSendfileMinBytes
        i = 0
        while i < n:
            start = p[i]
            end = start + s[i]
            i += 1
            while i < n and p[i] == end:
                end += s[i]
                i += 1
            base = start - start % seg
            if end - start >= big:
                parts.append(FileRange(cl.handle(base).fd, start - base, end - start))
            else:
                parts.append(memoryview(cl.view(start, end - start)))
        return parts

    def _park_pull(self, conn, cmd, topic, qid, offset, hold_s) -> None:
        p = ParkedPull(conn, cmd, offset, time.monotonic() + hold_s)
        self.parked_pulls.setdefault((topic, qid), []).append(p)
        self.cb.set_flag(WANT_PUBLISH, True)
        self.reactor.call_later(hold_s + 0.001, self.check_parked_pulls)
        if self.store.max_offset(topic, qid) > offset:   # arrived before the flag was up
            self.reactor.call_soon(self.check_parked_pulls)

    def check_parked_pulls(self) -> None:
        if not self.parked_pulls:
            return
        now = time.monotonic()
        for key in list(self.parked_pulls):
            mx = self.store.max_offset(*key)
            waiting = []
            for p in self.parked_pulls[key]:
                if p.conn.closed:
                    continue
                if mx > p.offset or now >= p.deadline:
                    try:
                        self.pull(p.conn, p.cmd, allow_suspend=False)
                    except BadRequest as e:
                        self.respond(p.conn, p.cmd, p.cmd.reply(e.code, e.remark))
                else:
                    waiting.append(p)
            if waiting:
                self.parked_pulls[key] = waiting
            else:
                del self.parked_pulls[key]
        if not self.parked_pulls:
            self.cb.set_flag(WANT_PUBLISH, False)

    # ----------------------------------------------------------------- offsets
    def query_consumer_offset(self, conn, cmd) -> None:
        h = Header(cmd.ext)
        group, topic, qid = h.str("consumerGroup"), h.str("topic"), h.int("queueId")
        off = self.registry.get_offset(topic, group, qid)
        if off >= 0:
            self.respond(conn, cmd, cmd.reply(R.SUCCESS, ext={"offset": str(off)}))
        elif self.store.min_offset(topic, qid) <= 0:
            # A new group on a queue that still has its first message: from 0
            # (ConsumerManageProcessor.queryConsumerOffset).
            self.respond(conn, cmd, cmd.reply(R.SUCCESS, ext={"offset": "0"}))
        else:
            self.respond(conn, cmd, cmd.reply(R.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe"))

    def update_consumer_offset(self, conn, cmd) -> None:
        h = Header(cmd.ext)
        self.registry.commit_offset(h.str("topic"), h.str("consumerGroup"), h.int("queueId"),
                                    h.int("commitOffset"))
        self.respond(conn, cmd, cmd.reply(R.SUCCESS))

    def _queue(self, cmd) -> tuple[str, int]:
        h = Header(cmd.ext)
        return h.str("topic"), h.int("queueId")

    def get_max_offset(self, conn, cmd) -> None:
        topic, qid = self._queue(cmd)
        self.respond(conn, cmd, cmd.reply(R.SUCCESS, ext={"offset": str(self.store.max_offset(topic, qid))}))

    def get_min_offset(self, conn, cmd) -> None:
        topic, qid = self._queue(cmd)
        self.respond(conn, cmd, cmd.reply(R.SUCCESS, ext={"offset": str(self.store.min_offset(topic, qid))}))

    def search_offset(self, conn, cmd) -> None:
        """The queue offset whose store time is nearest ``timestamp``
        (ConsumeQueue.getOffsetInQueueByTime): binary search by store time."""
        topic, qid = self._queue(cmd)
        ts = Header(cmd.ext).int("timestamp")
        lo, hi = self.store.min_offset(topic, qid), self.store.max_offset(topic, qid)
        best = self.store.offset_by_time(topic, qid, ts)       # first offset stored at or after ts
        if best >= hi:
            best = max(lo, hi - 1)
        elif best > lo:
            t_at = self.store.store_time(topic, qid, best)
            t_before = self.store.store_time(topic, qid, best - 1)
            if t_at is not None and t_before is not None and t_at != ts \
                    and ts - t_before < t_at - ts:
                best -= 1
        self.respond(conn, cmd, cmd.reply(R.SUCCESS, ext={"offset": str(best)}))

    def earliest_store_time(self, conn, cmd) -> None:
        topic, qid = self._queue(cmd)
        t = self.store.store_time(topic, qid, self.store.min_offset(topic, qid))
        if t is None:
            raise BadRequest(R.SYSTEM_ERROR, f"the queue {topic}:{qid} holds no message")
        self.respond(conn, cmd, cmd.reply(R.SUCCESS, ext={"timestamp": str(t)}))

    # ----------------------------------------------------------------- clients
    def _json_body(self, cmd) -> dict:
        try:
            data = orjson.loads(cmd.body)
        except orjson.JSONDecodeError:
            try:
                data = parse_json_lenient(bytes(cmd.body).decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise BadRequest(R.SYSTEM_ERROR, f"the request body is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise BadRequest(R.SYSTEM_ERROR, "the request body is not a JSON object")
        return data

    def heartbeat(self, conn: Connection, cmd: RemotingCommand) -> None:
        data = self._json_body(cmd)
        cid = data.get("clientID")
        if not isinstance(cid, str) or not cid:
            raise BadRequest(R.SYSTEM_ERROR, "the heartbeat has no clientID")
        conn.attrs["client_id"] = cid
        conn.attrs["language"] = cmd.language
        now = int(time.time() * 1000)
        changed = False
        for p in data.get("producerDataSet") or []:
            g = p.get("groupName") if isinstance(p, dict) else None
            if isinstance(g, str) and g and g != "CLIENT_INNER_PRODUCER":
                row = self.registry.producers.upsert(consumer_key(g, cid))
                t = self.registry.producers
                t.v[row, 0], t.v[row, 1], t.v[row, 2] = self.cb.slot, now, conn.id
                self.producer_conns[conn.id] = conn
                conn.attrs.setdefault("producer_groups", set()).add(g)
        for c in data.get("consumerDataSet") or []:
            g = c.get("groupName")
            if not isinstance(g, str) or not g:
                raise BadRequest(R.SYSTEM_ERROR, "a consumerData in the heartbeat has no groupName")
            if self.tables.group(g, self.config.autoCreateSubscriptionGroup) is None:
                raise BadRequest(R.SUBSCRIPTION_GROUP_NOT_EXIST,
                                 f"subscription group [{g}] does not exist")
            self.tables.retry_topic(g)
            shared_subs = {}
            for sd in c.get("subscriptionDataSet") or []:
                topic = sd.get("topic")
                if isinstance(topic, str):
                    etype = sd.get("expressionType") or "TAG"
                    shared_subs[topic] = (str(sd.get("subString") or "*"),
                                          _int_or(sd.get("subVersion"), 0), str(etype).upper() == "SQL92")
                    try:
                        self.subs[(g, topic)] = parse_subscription(
                            topic, sd.get("subString"), etype, int(sd.get("subVersion") or 0),
                            self.config.enablePropertyFilter)
                    except BadRequest as e:   # its pulls get the error
                        log.warning("%s: group %s cannot subscribe %s: %s", conn.peer, g, topic,
                                    e.remark)
                        self.subs[(g, topic)] = Subscription(topic, str(sd.get("subString")),
                                                             ALL_TAGS, 0, etype, error=e)
            self.registry.update_subscriptions(g, shared_subs, now)
            key = consumer_key(g, cid)
            t = self.registry.consumers
            new = t.find(key) < 0
            row = t.upsert(key, client_payload(
                conn.peer, cmd.language, cmd.version, str(c.get("consumeType") or ""),
                str(c.get("consumeFromWhere") or "")))
            t.v[row, 0] = self.cb.slot
            t.v[row, 1] = now
            t.v[row, 2] = conn.id
            t.v[row, 3] = 1 if str(c.get("messageModel", "")).upper() == "BROADCASTING" else 0
            self.group_conns.setdefault(g, {})[cid] = conn
            conn.attrs.setdefault("groups", set()).add(g)
            changed |= new
        if changed:
            self.clients_changed()
        reply = cmd.reply(R.SUCCESS)
        reply.version = VERSION_4_9_7
        self.respond(conn, cmd, reply)

    def _drop_client(self, conn: Connection, cid: str, groups) -> None:
        t = self.registry.consumers
        changed = False
        for g in list(groups):
            row = t.find(consumer_key(g, cid))
            if row >= 0 and t.v[row, 0] == self.cb.slot and t.v[row, 2] == conn.id:
                t.delete(row)
                changed = True
            members = self.group_conns.get(g)
            if members and members.get(cid) is conn:
                del members[cid]
                if not members:
                    del self.group_conns[g]
                    self.notified.pop(g, None)
        if changed:
            self.clients_changed()

    def connection_closed(self, conn: Connection) -> None:
        cid = conn.attrs.get("client_id")
        if cid:
            self._drop_client(conn, cid, conn.attrs.get("groups", ()))
            t = self.registry.producers
            for g in conn.attrs.get("producer_groups", ()):
                row = t.find(consumer_key(g, cid))
                if row >= 0 and t.v[row, 0] == self.cb.slot and t.v[row, 2] == conn.id:
                    t.delete(row)
        self.producer_conns.pop(conn.id, None)

    def unregister_client(self, conn, cmd) -> None:
        h = Header(cmd.ext)
        cid = h.str("clientID")
        group = h.str("consumerGroup", required=False)
        if group:
            self._drop_client(conn, cid, [group])
            conn.attrs.get("groups", set()).discard(group)
        self.respond(conn, cmd, cmd.reply(R.SUCCESS))

    def clients_changed(self) -> None:
        """A group gained or lost a member: every worker re-checks its groups."""
        self.cb.wake_flagged(WANT_CLIENTS)
        self.reactor.call_soon(self.check_clients)

    def check_clients(self) -> None:
        """Send NOTIFY_CONSUMER_IDS_CHANGED to this worker's consumers of each
        group whose membership changed (RocketMQ: Broker2Client)."""
        epoch = self.registry.consumers.epoch
        if epoch == self.seen_clients_epoch:
            return
        self.seen_clients_epoch = epoch
        members = self.registry.members_by_group()
        for g, conns in self.group_conns.items():
            now = members.get(g, [])
            if self.notified.get(g) == now:
                continue
            if g in self.notified:
                note = RemotingCommand(RC.NOTIFY_CONSUMER_IDS_CHANGED, flag=FLAG_ONEWAY,
                                       ext={"consumerGroup": g})
                head = encode_head(note, 0)
                for conn in conns.values():
                    conn.send(head)
            self.notified[g] = now

    def check_client_config(self, conn, cmd) -> None:
        """CHECK_CLIENT_CONFIG: a Java consumer asks, at subscribe, whether the
        broker can apply its filter; a bad SQL92 expression is refused here."""
        sd = self._json_body(cmd).get("subscriptionData")
        if not isinstance(sd, dict):
            raise BadRequest(R.SYSTEM_ERROR, "the body has no subscriptionData")
        parse_subscription(str(sd.get("topic")), sd.get("subString"), sd.get("expressionType"),
                           sql_enabled=self.config.enablePropertyFilter)
        self.respond(conn, cmd, cmd.reply(R.SUCCESS))

    def consumer_list(self, conn, cmd) -> None:
        g = Header(cmd.ext).str("consumerGroup")
        members = self.registry.group_members(g)
        if not members:
            raise BadRequest(R.SYSTEM_ERROR, f"no consumer for this group, {g}")
        self.reply_json(conn, cmd, {"consumerIdList": members})

    def _mq_body(self, cmd) -> tuple[str, str, list[dict]]:
        data = self._json_body(cmd)
        g, cid, mqs = data.get("consumerGroup"), data.get("clientId"), data.get("mqSet") or []
        if not isinstance(g, str) or not isinstance(cid, str) or not isinstance(mqs, list):
            raise BadRequest(R.SYSTEM_ERROR, "the body needs consumerGroup, clientId and mqSet")
        return g, cid, [m for m in mqs if isinstance(m, dict)]

    def lock_batch(self, conn, cmd) -> None:
        """Orderly consumption: lease each queue to one client for 60 s."""
        g, cid, mqs = self._mq_body(cmd)
        t = self.registry.locks
        now = int(time.time() * 1000)
        ok = []
        owner = cid.encode()
        with t.lock.held():
            for mq in mqs:
                key = lock_key(g, str(mq.get("topic")), str(mq.get("brokerName")),
                               int(mq.get("queueId", -1)))
                row = t.find(key)
                if row < 0 or t.payload(row) == owner or now - t.v[row, 0] > LOCK_LEASE_MS:
                    row = t.upsert(key, owner)
                    t.v[row, 0] = now
                    ok.append(mq)
        self.reply_json(conn, cmd, {"lockOKMQSet": ok})

    def unlock_batch(self, conn, cmd) -> None:
        g, cid, mqs = self._mq_body(cmd)
        t = self.registry.locks
        owner = cid.encode()
        with t.lock.held():
            for mq in mqs:
                row = t.find(lock_key(g, str(mq.get("topic")), str(mq.get("brokerName")),
                                      int(mq.get("queueId", -1))))
                if row >= 0 and t.payload(row) == owner:
                    t.delete(row)
        self.respond(conn, cmd, cmd.reply(R.SUCCESS))

    # ---------------------------------------------------------------- messages
    def view_message(self, conn, cmd) -> None:
        phy = Header(cmd.ext).int("offset")
        m = stored(self.store, phy)
        raw = None if m is None else self.store.record_view(phy, m.total_size)
        if raw is None:
            raise BadRequest(R.SYSTEM_ERROR, f"can not find message by the offset, {phy}")
        self.respond(conn, cmd, cmd.reply(R.SUCCESS), [memoryview(raw)])

    def query_message(self, conn, cmd) -> None:
        """QUERY_MESSAGE: the messages of a topic whose KEYS hold ``key`` (or,
        with _UNIQUE_KEY_QUERY, whose UNIQ_KEY is it), stored between the two
        timestamps, found through the IndexFile (IndexService.queryOffset):
        at most maxNum (defaultQueryMaxNum for a unique key; 64 in any case)."""
        h = Header(cmd.ext)
        topic, key = h.str("topic"), h.str("key")
        unique = h.bool("_UNIQUE_KEY_QUERY")
        max_num = self.config.defaultQueryMaxNum if unique else max(1, h.int("maxNum"))
        begin, end = h.int("beginTimestamp"), h.int("endTimestamp")
        if self.index is None:
            self.index = IndexService(self.config.store, read_only=True)
        found = []
        for phy in self.index.query(topic, key, max_num, begin, end):
            m = stored(self.store, phy)
            if m is None or m.topic != topic:
                continue
            p = m.properties
            if key in p.get("KEYS", "").split(" ") or p.get("UNIQ_KEY") == key:   # hash collisions
                found.append(self.store.record_view(phy, m.total_size))
        if not found:
            raise BadRequest(R.QUERY_NOT_FOUND, "can not find message, maybe time range not correct")
        reply = cmd.reply(R.SUCCESS, ext={
            "indexLastUpdateTimestamp": str(self.index.last_update_timestamp),
            "indexLastUpdatePhyoffset": str(self.index.last_update_phy_offset)})
        self.respond(conn, cmd, reply, [memoryview(f) for f in found])

    # ---------------------------------------------- retry, transactions, reset
    def send_back(self, conn, cmd) -> None:
        """CONSUMER_SEND_MSG_BACK: a message the consumer failed goes to
        %RETRY%group after the back-off of its next level (3 + times
        consumed), or to %DLQ%group once consumed maxReconsumeTimes times
        (SendMessageProcessor.asyncConsumerSendMsgBack)."""
        h = Header(cmd.ext)
        group, phy, delay = h.str("group"), h.int("offset"), h.int("delayLevel")
        if not self.tables.broker_permission() & PERM_WRITE:
            raise BadRequest(R.NO_PERMISSION, f"the broker[{self.config.brokerName}] sending "
                                              f"message is forbidden")
        self._check_disk()
        gc = self.tables.group(group, self.config.autoCreateSubscriptionGroup)
        if gc is None:
            raise BadRequest(R.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
        retry_queues = int(gc.get("retryQueueNums", 1))
        if retry_queues <= 0:
            self.respond(conn, cmd, cmd.reply(R.SUCCESS))
            return
        m = stored(self.store, phy)
        if m is None:
            raise BadRequest(R.SYSTEM_ERROR, f"look message by offset failed, {phy}")
        d = m.properties
        d.setdefault(RETRY_TOPIC, m.topic)
        d.setdefault(ORIGIN_MESSAGE_ID, d.get(ORIGIN_MESSAGE_ID) or m.offset_msg_id())
        max_times = int(gc.get("retryMaxTimes", 16))
        if cmd.version >= VERSION_3_4_9 and h.int("maxReconsumeTimes", -1) >= 0:
            max_times = h.int("maxReconsumeTimes")     # the client's own limit
        if m.reconsume_times >= max_times or delay < 0:
            self._dlq_topic(group)
            topic, qid = DLQ_GROUP_TOPIC_PREFIX + group, 0
            d.pop(DELAY, None)
        else:
            tc = self.tables.retry_topic(group)
            if not tc["perm"] & PERM_WRITE:
                raise BadRequest(R.NO_PERMISSION, f"the topic[{tc['topicName']}] sending message "
                                                  f"is forbidden")
            topic, qid = tc["topicName"], random.randrange(max(1, retry_queues))
            d[DELAY] = str(delay or 3 + m.reconsume_times)
        c = self.config
        now = int(time.time() * 1000)
        r = route_send(topic, qid, m.sysflag, properties_to_string(d),
                       now_ms=now, delay_levels=self.delay_levels,
                       timer_enable=c.timerWheelEnable, timer_max_delay_ms=c.timerMaxDelaySec * 1000,
                       reject_transactions=c.rejectTransactionMessage)
        batch = repost(m, r.topic, r.queue_id, r.properties, store_host=self.store_host,
                       reconsume_times=m.reconsume_times + 1, tags_code=r.tags_code,
                       store_timestamp=now)
        self.store.append(batch)
        self.put_count += 1
        self.respond(conn, cmd, cmd.reply(R.SUCCESS))

    def end_transaction(self, conn, cmd) -> None:
        """END_TRANSACTION: commit posts the half message to its real topic,
        rollback drops it; either way an op message records it. A half
        message is resolved once, whichever worker and however many times
        the producer answers (EndTransactionProcessor)."""
        h = Header(cmd.ext)
        group, qoff, phy = h.str("producerGroup"), h.int("tranStateTableOffset"), h.int("commitLogOffset")
        kind = h.int("commitOrRollback")
        if kind == SYSFLAG_TRANSACTION_NOT:
            return                       # "unknown": RocketMQ answers nothing and waits for the check
        if kind not in (SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_ROLLBACK):
            raise BadRequest(R.SYSTEM_ERROR, f"commitOrRollback={kind}: want 8 (commit) or 12 (rollback)")
        if not self.tables.broker_permission() & PERM_WRITE:
            raise BadRequest(R.NO_PERMISSION, f"the broker[{self.config.brokerName}] sending "
                                              f"message is forbidden")
        self._check_disk()
        m = stored(self.store, phy)
        if m is None or m.topic != TRANS_HALF_TOPIC:
            raise BadRequest(R.SYSTEM_ERROR, "Find prepared transaction message failed")
        if m.properties.get(PGROUP) != group:
            raise BadRequest(R.SYSTEM_ERROR, "The producer group wrong")
        if m.queue_offset != qoff:
            raise BadRequest(R.SYSTEM_ERROR, "The transaction state table offset wrong")
        if resolve_half(self.store, self.registry, self.store_host, m, kind):
            self.put_count += 1
        self.respond(conn, cmd, cmd.reply(R.SUCCESS))

    def reset_offset(self, conn, cmd) -> None:
        """INVOKE_BROKER_TO_RESET_OFFSET (回溯消费): commit each queue's offset
        at ``timestamp`` (-1: the end) for the group and tell its online
        consumers (RESET_CONSUMER_CLIENT_OFFSET); without ``isForce`` an
        offset only moves back (Broker2Client.resetOffset)."""
        h = Header(cmd.ext)
        topic, group, ts = h.str("topic"), h.str("group"), h.int("timestamp")
        force = h.bool("isForce", True)
        tc = self.tables.topics.get(topic)
        if tc is None:
            raise BadRequest(R.TOPIC_NOT_EXIST, f"[reset-offset] request reset offset, but the "
                                                f"topic[{topic}] not exist")
        table = {}
        for qid in range(int(tc["writeQueueNums"])):
            current = self.registry.get_offset(topic, group, qid)
            if current < 0 and self.tables.groups.get(group) is None:
                raise BadRequest(R.SYSTEM_ERROR, f"THe consumer group <{group}> not exist")
            at = self.store.max_offset(topic, qid) if ts == -1 else self.store.offset_by_time(topic, qid, ts)
            if not force and 0 <= current < at:
                at = current
            table[qid] = at
        for qid, at in table.items():
            self.registry.commit_offset(topic, group, qid, at)
        post_notice(self.registry.notices, f"reset\0{group}\0{topic}".encode(), ts)
        self.cb.wake_flagged(WANT_CLIENTS)
        self.reactor.call_soon(self.deliver_notices)
        self.respond(conn, cmd, cmd.reply(R.SUCCESS, body=reset_body(
            topic, self.config.brokerName, table, cmd.language)))

    def deliver_notices(self) -> None:
        """Send what other processes left for this worker's clients: transaction
        checks to producers, offset resets to consumers."""
        t = self.registry.notices
        if t.epoch == self.seen_notices_epoch:
            return
        self.seen_notices_epoch = t.epoch
        for row, key in t.items():
            if key.startswith(b"check\0"):
                if t.v[row, 0] == self.cb.slot:
                    self._send_check(int(t.v[row, 1]), int(t.v[row, 2]), t.payload(row).decode())
                    t.delete(row)
            elif key.startswith(b"reset\0"):
                seq = int(t.v[row, 3])
                if self.seen_resets.get(key, 0) != seq:
                    self.seen_resets[key] = seq
                    _, group, topic = key.decode().split("\0")
                    self._send_reset(group, topic, int(t.v[row, 0]))

    def _send_check(self, conn_id: int, phy: int, group: str) -> None:
        conn = self.producer_conns.get(conn_id)
        m = stored(self.store, phy)
        if conn is None or conn.closed or m is None:
            return
        body = check_body(m, self.store_host)
        uniq = m.properties.get(UNIQ_KEY, "")
        note = RemotingCommand(RC.CHECK_TRANSACTION_STATE, flag=FLAG_ONEWAY, ext={
            "tranStateTableOffset": str(m.queue_offset), "commitLogOffset": str(phy),
            "msgId": uniq, "transactionId": uniq, "offsetMsgId": m.offset_msg_id()})
        conn.send(encode_head(note, len(body)), (body,))

    def _send_reset(self, group: str, topic: str, ts: int) -> None:
        conns = self.group_conns.get(group)
        tc = self.tables.topics.get(topic)
        if not conns or tc is None:
            return
        table = {qid: self.registry.get_offset(topic, group, qid)
                 for qid in range(int(tc["writeQueueNums"]))}
        for conn in conns.values():
            lang = conn.attrs.get("language", "JAVA")
            body = reset_body(topic, self.config.brokerName, table, lang)
            note = RemotingCommand(RC.RESET_CONSUMER_CLIENT_OFFSET, flag=FLAG_ONEWAY, ext={
                "topic": topic, "group": group, "timestamp": str(ts), "isForce": "true"})
            conn.send(encode_head(note, len(body)), (memoryview(body),))

    # ------------------------------------------------------------------ admin
    def create_topic(self, conn, cmd) -> None:
        h = Header(cmd.ext)
        topic = h.str("topic")
        err = topic_error(topic)
        if err:
            raise BadRequest(R.SYSTEM_ERROR, err)
        if topic == self.config.brokerClusterName:
            raise BadRequest(R.SYSTEM_ERROR, f"the topic[{topic}] is conflict with system reserved words")
        read, write = h.int("readQueueNums"), h.int("writeQueueNums")
        if not (1 <= read <= 1024 and 1 <= write <= 1024):
            raise BadRequest(R.SYSTEM_ERROR, "readQueueNums and writeQueueNums must be 1..1024")
        ftype = h.str("topicFilterType", "SINGLE_TAG")
        if ftype not in ("SINGLE_TAG", "MULTI_TAG"):
            raise BadRequest(R.SYSTEM_ERROR, f"topicFilterType={ftype!r}: SINGLE_TAG or MULTI_TAG")
        self.tables.topics.update({topic: topic_config(topic, read, write, h.int("perm", 6),
                                                       ftype, h.int("topicSysFlag", 0),
                                                       h.bool("order"))})
        self.respond(conn, cmd, cmd.reply(R.SUCCESS))

    def delete_topic(self, conn, cmd) -> None:
        topic = Header(cmd.ext).str("topic")
        self.tables.topics.update({topic: None})
        self.respond(conn, cmd, cmd.reply(R.SUCCESS))

    def update_group(self, conn, cmd) -> None:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: a SubscriptionGroupConfig body;
        fields it leaves out keep RocketMQ's defaults (retryMaxTimes 16 …)."""
        body = self._json_body(cmd)
        name = body.get("groupName")
        if not isinstance(name, str) or topic_error(name):
            raise BadRequest(R.SYSTEM_ERROR, f"groupName {name!r} is not a valid group name")
        cfg = group_config(name)
        for k, v in body.items():
            if k in cfg and isinstance(v, type(cfg[k])):
                cfg[k] = v
        self.tables.groups.update({name: cfg})
        self.respond(conn, cmd, cmd.reply(R.SUCCESS))

    def all_groups(self, conn, cmd) -> None:
        self.reply_json(conn, cmd, {"subscriptionGroupTable": self.tables.groups.current(),
                                    "dataVersion": self.tables.groups.data_version()})

    def delete_group(self, conn, cmd) -> None:
        self.tables.groups.update({Header(cmd.ext).str("groupName"): None})
        self.respond(conn, cmd, cmd.reply(R.SUCCESS))

    def all_topic_config(self, conn, cmd) -> None:
        self.reply_json(conn, cmd, {"topicConfigTable": self.tables.topics.current(),
                                    "dataVersion": self.tables.topics.data_version()})

    def update_broker_config(self, conn, cmd) -> None:
        """UPDATE_BROKER_CONFIG: a properties body (key=value lines). Every key
        is checked; the settings applied at runtime (RUNTIME_SETTINGS:
        brokerPermission, at once on every worker, to drain a broker before a
        restart) are kept in config/brokerConfig.json. A request that would
        change any other setting is refused whole (NO_PERMISSION, as RocketMQ
        refuses its configBlackList), the remark naming each such setting: they
        are read at start, from broker.conf. Setting one to the value in effect
        is accepted and changes nothing."""
        try:
            values = parse_conf(bytes(cmd.body).decode("utf-8"), "the request body")
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(R.SYSTEM_ERROR, f"update broker config failed: {e}") from None
        in_effect = {name: value for name, value, _ in self.config.describe()}
        unknown = sorted(set(values) - set(in_effect))
        if unknown:
            raise BadRequest(R.SYSTEM_ERROR, f"update broker config failed: unknown settings "
                                             f"{', '.join(unknown)}")
        live = {k: v for k, v in self.tables.broker.current().items() if k in RUNTIME_SETTINGS}
        try:
            new, _ = BrokerConfig.from_strings(
                {**{k: conf_text(v) for k, v in in_effect.items()}, **live, **values})
        except ValueError as e:
            raise BadRequest(R.SYSTEM_ERROR, f"update broker config failed: {e}") from None
        wanted = {name: value for name, value, _ in new.describe()}
        refused = sorted(k for k in values if k not in RUNTIME_SETTINGS and wanted[k] != in_effect[k])
        if refused:
            raise BadRequest(R.NO_PERMISSION, f"{', '.join(refused)} "
                             f"{'needs' if len(refused) == 1 else 'need'} a restart: change "
                             f"broker.conf (at runtime only {', '.join(sorted(RUNTIME_SETTINGS))} "
                             f"can change); nothing was updated")
        changes = {k: conf_text(wanted[k]) for k in values if k in RUNTIME_SETTINGS}
        # drop what an older shmq kept here: settings it never applied
        changes.update({k: None for k in self.tables.broker.current() if k not in RUNTIME_SETTINGS})
        if changes:
            self.tables.broker.update(changes)
            log.info("broker config updated: %s", changes)
        self.respond(conn, cmd, cmd.reply(R.SUCCESS))

    def get_broker_config(self, conn, cmd) -> None:
        """The settings in effect: broker.conf's, with RUNTIME_SETTINGS as
        UPDATE_BROKER_CONFIG last set them."""
        runtime = {k: v for k, v in self.tables.broker.current().items() if k in RUNTIME_SETTINGS}
        lines = [f"{name}={conf_text(runtime.get(name, value))}"
                 for name, value, _ in self.config.describe()]
        reply = cmd.reply(R.SUCCESS, body="\n".join(lines).encode() + b"\n",
                          ext={"version": orjson.dumps(self.tables.broker.data_version()).decode()})
        self.respond(conn, cmd, reply)

    def runtime_info(self, conn, cmd) -> None:
        st = self.store.state
        table = {"brokerVersionDesc": "V4_9_7", "brokerVersion": str(VERSION_4_9_7),
                 "bootTimestamp": str(self.boot_ms),
                 "commitLogMaxOffset": str(st.write_pos),
                 "commitLogMinOffset": str(st.get("cl_min_offset")),
                 "commitLogFlushedOffset": str(st.flushed_pos),
                 "msgPutTotalThisWorker": str(self.put_count),
                 "queueCount": str(int(st.get("queue_slots_used"))),
                 "flushDiskType": self.config.store.flushDiskType,
                 # shmq: clients on this host may use the Unix socket instead of TCP
                 "unixSocketPath": self.config.unix_path,
                 **self.stats.runtime_info()}
        self.reply_json(conn, cmd, {"table": table})

    # ------------------------------------------------------------- admin views
    def topic_stats(self, conn, cmd) -> None:
        """GET_TOPIC_STATS_INFO: TopicStatsTable, each write queue's min and max
        offset and the store time of its last message (AdminBrokerProcessor)."""
        topic = Header(cmd.ext).str("topic")
        tc = self.tables.topics.get(topic)
        if tc is None:
            raise BadRequest(R.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        items = []
        for qid in range(int(tc["writeQueueNums"])):
            lo = max(0, self.store.min_offset(topic, qid))
            hi = max(0, self.store.max_offset(topic, qid))
            ts = (self.store.store_time(topic, qid, hi - 1) or 0) if hi > 0 else 0
            items.append((topic, self.config.brokerName, qid,
                          {"lastUpdateTimestamp": ts, "maxOffset": hi, "minOffset": lo}))
        body = f'{{"offsetTable":{mq_map(items)}}}'
        self.respond(conn, cmd, cmd.reply(R.SUCCESS, body=body.encode()))

    def consume_stats(self, conn, cmd) -> None:
        """GET_CONSUME_STATS: ConsumeStats of a group, per read queue of the
        topic (or of every topic it has offsets in, skipping those its live
        consumers do not subscribe): max offset, committed offset, store time
        of the last consumed message. consumeTps is 0: shmq keeps no per-group rates."""
        h = Header(cmd.ext)
        group = h.str("consumerGroup")
        topic = h.str("topic", required=False)
        topics = {topic} if topic else self.registry.topics_of_group(group)
        subscribed = self.registry.group_subscriptions(group)
        items = []
        for t in sorted(topics):
            tc = self.tables.topics.get(t)
            if tc is None or (subscribed and t not in subscribed):
                continue
            for qid in range(int(tc["readQueueNums"])):
                broker_off = max(0, self.store.max_offset(t, qid))
                consumer_off = max(0, self.registry.get_offset(t, group, qid))
                last = (self.store.store_time(t, qid, consumer_off - 1) or 0) if consumer_off > 0 else 0
                items.append((t, self.config.brokerName, qid, {
                    "brokerOffset": broker_off, "consumerOffset": consumer_off, "lastTimestamp": last}))
        body = f'{{"consumeTps":0.0,"offsetTable":{mq_map(items)}}}'
        self.respond(conn, cmd, cmd.reply(R.SUCCESS, body=body.encode()))

    def consumer_connection(self, conn, cmd) -> None:
        """GET_CONSUMER_CONNECTION_LIST: ConsumerConnection of a group, from
        the shared registry (its members may be served by any worker)."""
        group = Header(cmd.ext).str("consumerGroup")
        members = self.registry.group_clients(group)
        if not members:
            raise BadRequest(R.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        connections = []
        for cid, _, info in members:
            addr = info["clientAddr"]
            if addr == "unix":         # a client on this host, over the broker's Unix socket
                addr = f"unix:{self.config.unix_path}"
            connections.append({"clientAddr": addr, "clientId": cid, "language": info["language"],
                                "version": info["version"]})
        subs = {}
        for topic, sd in self.registry.group_subscriptions(group).items():
            tags = [] if sd["expressionType"] == "SQL92" or sd["subString"].strip() in ("", "*") \
                else [t.strip() for t in sd["subString"].split("||") if t.strip()]
            subs[topic] = {"classFilterMode": False, "codeSet": [java_string_hash(t) for t in tags],
                           "expressionType": sd["expressionType"], "subString": sd["subString"],
                           "subVersion": sd["subVersion"], "tagsSet": tags, "topic": topic}
        first = members[0][2]
        self.reply_json(conn, cmd, {
            "connectionSet": connections, "consumeFromWhere": first["consumeFromWhere"],
            "consumeType": first["consumeType"],
            "messageModel": "BROADCASTING" if members[0][1] else "CLUSTERING",
            "subscriptionTable": subs})

    def topic_consumed_by(self, conn, cmd) -> None:
        """QUERY_TOPIC_CONSUME_BY_WHO: GroupList of the groups subscribing the
        topic or holding offsets in it."""
        topic = Header(cmd.ext).str("topic")
        self.reply_json(conn, cmd, {"groupList": sorted(self.registry.groups_of_topic(topic))})
