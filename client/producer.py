"""Producers (asyncio): RocketMQ's DefaultMQProducer and TransactionMQProducer.

``AsyncProducer.send`` picks a queue from the topic's route (round robin,
skipping the broker that just failed), sends SEND_MESSAGE_V2 and, when the
send fails in a way another queue may not (no answer, a busy or unavailable
broker, no permission), tries the next one up to
``retry_times_when_send_failed`` more times. A queue chosen by the caller
(a ``MessageQueue`` or a selector, for ordered messages) is never changed.
A topic the NameServer does not know is sent through the route of
``create_topic_key`` (TBW102) so the broker creates it. Bodies above
``compress_msg_body_over_howmuch`` are zlib-compressed; messages above
``max_message_size`` are refused before sending. Every message gets a
unique id (``UNIQ_KEY``): ``SendResult.msg_id``.

``AsyncTransactionProducer`` sends half messages, runs the local
transaction, ends it (commit, rollback or unknown) and answers the broker's
CHECK_TRANSACTION_STATE through ``check_local_transaction``.
"""
from __future__ import annotations

import asyncio
import abc
import enum
import inspect
import itertools
import logging
import os
import re
import struct
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable

from shmq.core.records import decode
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand

from .connection import Connection, RemotingError
from .instance import ClientConfig, ClientInstance, MQClientError, TopicRoute
from .message import (UNIQ_KEY, Message, MessageExt, MessageQueue, SendResult, SendStatus,
                      unique_ids)

log = logging.getLogger("shmq.client")
DEFAULT_TOPIC = "TBW102"
TOPIC_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")
SYSFLAG_COMPRESSED, SYSFLAG_PREPARED, COMMIT, ROLLBACK, UNKNOWN = 0x1, 0x4, 0x8, 0xC, 0x0
# reply codes after which another queue is tried (DefaultMQProducerImpl.retryResponseCodes)
RETRY_CODES = {R.TOPIC_NOT_EXIST, R.SERVICE_NOT_AVAILABLE, R.SYSTEM_ERROR, R.NO_PERMISSION,
               R.SYSTEM_BUSY}
STATUS = {R.SUCCESS: SendStatus.SEND_OK, R.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
          R.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
          R.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE}
_ENTRY = struct.Struct(">iiiii")

Selector = Callable[[list[MessageQueue], Message, Any], MessageQueue]


def java_hash_code(arg: Any) -> int:
    """``arg.hashCode()`` as Java computes it, so an order key picks the same
    queue in every process, after every restart, and in a Java producer:
    a str is a ``String`` (31-polynomial over UTF-16 code units, int32
    wrap-around), an int in the int32 range an ``Integer`` (itself), a larger
    one a ``Long`` (``(int) (v ^ (v >>> 32))``). (Python's ``hash`` of a str
    is salted per process.) Anything else hashes as its ``str``."""
    if isinstance(arg, bool) or not isinstance(arg, int):
        units = str(arg).encode("utf-16-be")
        h = 0
        for (cu,) in struct.iter_unpack(">H", units):
            h = (31 * h + cu) & 0xFFFFFFFF
    elif -2**31 <= arg < 2**31:
        return arg
    else:
        v = arg & 0xFFFFFFFFFFFFFFFF
        h = (v ^ (v >> 32)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def select_by_hash(queues: list[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """SelectMessageQueueByHash: the same ``arg`` (an order id) → the same
    queue, as RocketMQ picks it: ``abs(arg.hashCode() % n)`` with Java's
    hashCode (``java_hash_code``)."""
    return queues[abs(java_hash_code(arg)) % len(queues)]   # |Java's %| = |h| mod n


@dataclass
class ProducerConfig:
    send_msg_timeout: float = 3.0
    retry_times_when_send_failed: int = 2
    compress_msg_body_over_howmuch: int = 4096
    max_message_size: int = 4 * 1024 * 1024
    default_topic_queue_nums: int = 4
    create_topic_key: str = DEFAULT_TOPIC


class AsyncProducer:
    def __init__(self, group: str, *, namesrv_addr: str = "", client: ClientConfig | None = None,
                 **settings):
        self.group = group
        self.client_config = client or ClientConfig(namesrv_addr=namesrv_addr)
        if namesrv_addr:
            self.client_config.namesrv_addr = namesrv_addr
        self.config = ProducerConfig(**settings)
        self.instance: ClientInstance | None = None
        self._rr = itertools.count()
        self._failed_broker: str | None = None

    async def start(self) -> None:
        self.instance = ClientInstance.get(self.client_config)
        await self.instance.register("producer", self.group, self)

    async def shutdown(self) -> None:
        if self.instance is not None:
            await self.instance.unregister("producer", self.group)
            self.instance = None

    async def __aenter__(self) -> "AsyncProducer":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    # ------------------------------------------------------------ routing
    async def publish_queues(self, topic: str) -> list[MessageQueue]:
        inst = await self._attach()
        route = await inst.route(topic)
        if route is None:
            default = await inst.route(self.config.create_topic_key)
            if default is None:
                raise MQClientError(R.TOPIC_NOT_EXIST, f"No route info of this topic: {topic}")
            route = self._from_default(topic, default)
            inst.routes[topic] = route
        if not route.publish:    # DefaultMQProducerImpl: a route without a writable queue is not ok
            raise MQClientError(R.TOPIC_NOT_EXIST, f"No route info of this topic: {topic} "
                                                   f"(no writable queue)")
        return route.publish

    def _from_default(self, topic: str, default: TopicRoute) -> TopicRoute:
        qds = [{**qd, "writeQueueNums": min(self.config.default_topic_queue_nums, qd["writeQueueNums"]),
                "readQueueNums": min(self.config.default_topic_queue_nums, qd["readQueueNums"])}
               for qd in default.queue_datas]
        brokers = [{"brokerName": n, "brokerAddrs": a} for n, a in default.broker_addrs.items()]
        return TopicRoute.parse(topic, {"queueDatas": qds, "brokerDatas": brokers})

    def _pick(self, queues: list[MessageQueue]) -> MessageQueue:
        n = len(queues)
        for _ in range(n):
            q = queues[next(self._rr) % n]
            if q.broker_name != self._failed_broker:
                return q
        return queues[next(self._rr) % n]

    async def _attach(self) -> ClientInstance:
        """This process's and loop's instance: a producer used in a forked child
        (or from another loop) registers afresh instead of touching the
        parent's sockets."""
        inst = self._inst()
        if inst.pid != os.getpid() or inst.loop is not asyncio.get_running_loop():
            self.instance = inst = ClientInstance.get(self.client_config)
            await inst.register("producer", self.group, self)
        return inst

    def _inst(self) -> ClientInstance:
        if self.instance is None:
            raise MQClientError(-1, f"the producer {self.group} is not started")
        return self.instance

    # ------------------------------------------------------------ sending
    def _check(self, msg: Message) -> None:
        if not msg.topic or len(msg.topic) > 127 or not TOPIC_NAME.match(msg.topic):
            raise MQClientError(R.MESSAGE_ILLEGAL, f"the topic name {msg.topic!r} is not valid")
        if not msg.body:
            raise MQClientError(R.MESSAGE_ILLEGAL, "the message body is empty")
        if len(msg.body) > self.config.max_message_size:
            raise MQClientError(R.MESSAGE_ILLEGAL, f"the message body size over max value, "
                                f"MAX: {self.config.max_message_size}")

    def _request(self, msg: Message, q: MessageQueue, uniq: str, sysflag: int = 0,
                 extra: dict[str, str] | None = None) -> RemotingCommand:
        body = msg.body
        if len(body) > self.config.compress_msg_body_over_howmuch:
            body = zlib.compress(body, 5)
            sysflag |= SYSFLAG_COMPRESSED
        props = msg.properties_string(uniq)
        if extra:
            props += "".join(f"\x02{k}\x01{v}" for k, v in extra.items())
        return RemotingCommand(RC.SEND_MESSAGE_V2, body=body, ext={
            "a": self.group, "b": msg.topic, "c": self.config.create_topic_key,
            "d": str(self.config.default_topic_queue_nums), "e": str(q.queue_id),
            "f": str(sysflag), "g": str(int(time.time() * 1000)), "h": str(msg.flag),
            "i": props, "j": "0", "k": "false", "m": "false"})

    async def _send_to(self, q: MessageQueue, cmd: RemotingCommand, uniq: str,
                       timeout: float) -> SendResult:
        reply = await self._inst().invoke(q.broker_name, cmd, timeout)
        status = STATUS.get(reply.code)
        if status is None:
            raise MQClientError(reply.code, reply.remark, f"send to {q.broker_name}")
        ext = reply.ext
        return SendResult(status, uniq, ext.get("msgId", ""), MessageQueue(
            q.topic, q.broker_name, int(ext.get("queueId", q.queue_id))),
            int(ext.get("queueOffset", -1)), ext.get("transactionId"),
            ext.get("MSG_REGION", "DefaultRegion"))

    async def send(self, msg: Message, queue: MessageQueue | None = None,
                   selector: Selector | None = None, arg: Any = None,
                   timeout: float | None = None) -> SendResult:
        """Send and wait for the broker's answer. ``queue`` or ``selector``
        (with ``arg``) fix the queue: ordered messages, no retry elsewhere."""
        return await self._send(msg, queue, selector, arg, timeout)

    async def _send(self, msg: Message, queue, selector, arg, timeout, sysflag: int = 0,
                    extra: dict[str, str] | None = None) -> SendResult:
        self._check(msg)
        timeout = timeout or self.config.send_msg_timeout
        uniq = msg.properties.get(UNIQ_KEY) or unique_ids.next()
        deadline = time.monotonic() + timeout
        queues = await self.publish_queues(msg.topic)      # also loads the route of a given queue
        if queue is None and selector is not None:
            queue = selector(queues, msg, arg)
        tries = 1 if queue is not None else 1 + self.config.retry_times_when_send_failed
        last: Exception | None = None
        for _ in range(tries):
            q = queue or self._pick(await self.publish_queues(msg.topic))
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                r = await self._send_to(q, self._request(msg, q, uniq, sysflag, extra), uniq, left)
                self._failed_broker = None
                return r
            except RemotingError as e:
                last = e
            except MQClientError as e:
                if e.code not in RETRY_CODES:
                    raise
                last = e
            self._failed_broker = q.broker_name
            log.info("send to %s failed (%s); trying another queue", q, last)
        raise last or MQClientError(-1, f"send timed out after {timeout} s")

    def send_async(self, msg: Message, callback: Callable[[SendResult | None, Exception | None], Any] | None = None,
                   queue: MessageQueue | None = None, selector: Selector | None = None,
                   arg: Any = None) -> asyncio.Task:
        """Send in the background: the returned task is awaitable; ``callback``
        (result, error) runs when it is done."""
        task = asyncio.get_running_loop().create_task(self.send(msg, queue, selector, arg))
        if callback is not None:
            def done(t: asyncio.Task) -> None:
                err = t.exception() if not t.cancelled() else asyncio.CancelledError()
                callback(None if err else t.result(), err)
            task.add_done_callback(done)
        return task

    async def send_oneway(self, msg: Message, queue: MessageQueue | None = None) -> None:
        """Send without waiting for any answer."""
        self._check(msg)
        queues = await self.publish_queues(msg.topic)
        q = queue or self._pick(queues)
        conn = await self._inst().broker(q.broker_name)
        conn.send_oneway(self._request(msg, q, msg.properties.get(UNIQ_KEY) or unique_ids.next()))

    async def send_batch(self, msgs: list[Message], queue: MessageQueue | None = None,
                         timeout: float | None = None) -> SendResult:
        """One SEND_BATCH_MESSAGE: every message to one topic and queue."""
        if not msgs:
            raise MQClientError(R.MESSAGE_ILLEGAL, "the batch is empty")
        topic = msgs[0].topic
        parts, uniqs = [], []
        for m in msgs:
            self._check(m)
            if m.topic != topic:
                raise MQClientError(R.MESSAGE_ILLEGAL, "the messages of a batch go to one topic")
            if m.delay_level > 0:
                raise MQClientError(R.MESSAGE_ILLEGAL, "a batch cannot carry a delay level")
            uniq = m.properties.get(UNIQ_KEY) or unique_ids.next()
            uniqs.append(uniq)
            pb = m.properties_string(uniq).encode()
            parts += [_ENTRY.pack(20 + len(m.body) + 2 + len(pb), 0, 0, m.flag, len(m.body)),
                      m.body, struct.pack(">h", len(pb)), pb]
        body = b"".join(parts)
        if len(body) > self.config.max_message_size:
            raise MQClientError(R.MESSAGE_ILLEGAL, f"the batch is {len(body)} bytes, over "
                                f"max_message_size {self.config.max_message_size}")
        queues = await self.publish_queues(topic)
        q = queue or self._pick(queues)
        cmd = RemotingCommand(RC.SEND_BATCH_MESSAGE, body=body, ext={
            "a": self.group, "b": topic, "c": self.config.create_topic_key,
            "d": str(self.config.default_topic_queue_nums), "e": str(q.queue_id), "f": "0",
            "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0", "k": "false",
            "m": "true"})
        return await self._send_to(q, cmd, ",".join(uniqs), timeout or self.config.send_msg_timeout)


# ---------------------------------------------------------------- transactions
class LocalTransactionState(enum.Enum):
    COMMIT_MESSAGE = COMMIT
    ROLLBACK_MESSAGE = ROLLBACK
    UNKNOW = UNKNOWN       # RocketMQ's spelling


class TransactionListener(abc.ABC):
    """Override both; either may be a coroutine function."""

    @abc.abstractmethod
    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        """Run the local transaction for the half ``msg`` just stored."""

    @abc.abstractmethod
    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        """The broker asks again about a half it has no answer for."""


@dataclass
class TransactionSendResult(SendResult):
    local_transaction_state: LocalTransactionState = LocalTransactionState.UNKNOW


async def _call(fn, *args):
    r = fn(*args)
    return await r if inspect.isawaitable(r) else r


class AsyncTransactionProducer(AsyncProducer):
    def __init__(self, group: str, listener: TransactionListener, **kw):
        super().__init__(group, **kw)
        self.listener = listener

    async def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        if msg.delay_level:
            msg.delay_level = 0           # a half message is never delayed
        r = await self._send(msg, None, None, None, None, SYSFLAG_PREPARED,
                             {"TRAN_MSG": "true", "PGROUP": self.group})
        state = LocalTransactionState.UNKNOW
        if r.status is SendStatus.SEND_OK:
            try:
                state = await _call(self.listener.execute_local_transaction, msg, arg)
            except Exception:
                log.exception("the local transaction of %s raised: left unknown", r.msg_id)
                state = LocalTransactionState.UNKNOW
        else:
            state = LocalTransactionState.ROLLBACK_MESSAGE
        await self._end(int(r.offset_msg_id[-16:], 16), r.queue_offset, r.msg_id, state,
                        broker=r.queue.broker_name)
        return TransactionSendResult(**{**r.__dict__, "local_transaction_state": state})

    async def _end(self, commit_log_offset: int, queue_offset: int, msg_id: str,
                   state: LocalTransactionState, broker: str = "", conn: Connection | None = None,
                   from_check: bool = False) -> None:
        cmd = RemotingCommand(RC.END_TRANSACTION, ext={
            "producerGroup": self.group, "tranStateTableOffset": str(queue_offset),
            "commitLogOffset": str(commit_log_offset),
            "commitOrRollback": str(state.value), "fromTransactionCheck": str(from_check).lower(),
            "msgId": msg_id, "transactionId": msg_id})
        conn = conn or await self._inst().broker(broker)
        conn.send_oneway(cmd)

    async def check_transaction_state(self, conn: Connection, cmd: RemotingCommand) -> bool:
        """A broker asks about a half message of this group: answer it."""
        rec = decode(cmd.body, 0, check_crc=False)
        if rec.properties.get("PGROUP") not in (None, self.group):
            return False
        msg = MessageExt(rec, "")
        try:
            state = await _call(self.listener.check_local_transaction, msg)
        except Exception:
            log.exception("check_local_transaction of %s raised: unknown", msg.msg_id)
            state = LocalTransactionState.UNKNOW
        ext = cmd.ext
        await self._end(int(ext["commitLogOffset"]), int(ext["tranStateTableOffset"]),
                        ext.get("msgId") or msg.msg_id, state, conn=conn, from_check=True)
        return True
