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

Many sends pipeline on one connection with no task per send: a send writes
its frame (``SendTemplate``: the header pre-built, the numbers filled in;
the connection joins every frame of a loop turn into one write) and awaits
the future its reply resolves. At most ``max_in_flight`` sends of a producer
wait for their answer (the window, default 64); the next one waits for a
slot. With ``linger_ms`` > 0 single sends to one queue are gathered into
SEND_BATCH_MESSAGE requests of up to ``batch_max_bytes`` (``accumulator``),
each caller still getting its own ``SendResult``.

``put`` and ``flush`` (the hot loop's call, one message a call): ``put(topic,
body, tags, keys)`` is a plain method that checks the body (``bytes``, 1..
``max_message_size``), appends it to the topic's buffer and returns — the
message is NOT stored yet; ``await flush()`` is the acknowledgement. It is
write-combining, as Kafka's producer does (batch.size, linger.ms): a buffer
is stored as one chunk once it holds ``put_batch_bytes`` (1 MiB) or
``put_linger_ms`` (1 ms) after its first message, along ``send_many``'s
path (``_store_chunk``): on the broker's host one claim appended by this
process, encoded by the batch kernel — done inside the put that finds the
buffer full, without yielding, so a loop of puts that never awaits still
stores as it goes; elsewhere one SEND_BATCH_MESSAGE, from one task per
topic (``_put_drain``: it also takes a chunk whose route must be looked
up, and every later chunk of its topic, so the order holds — in a new
producer, ``await flush()`` after the first put, before a loop that never
awaits). Chunks go round robin
over the topic's queues; within a queue messages are stored in put order.
Each message's tags and keys are its own properties (without, the messages
of a claim share one). ``flush()`` stores what the buffers hold, waits
until every earlier put is stored (under SYNC_FLUSH: durable, as a send's
answer) and returns the producer's counts (``FlushResult``: put, stored),
or raises ``PutFailed``: the first failure since the last flush, with the
counts; until then every ``put`` raises it too, so a failure never goes
unseen. ``shutdown()`` flushes. In RocketMQ's terms a put is a
``sendOneway`` that is batched, and ``flush`` says what became of it. A
put appended by this process has no UNIQ_KEY (its msgId is the offset
msgId, as ``send_many``'s; a chunk sent over the socket gives each message
one, as RocketMQ's batch send does), no retry on another queue and no
trace record. Over the socket, at most
``put_buffer_bytes`` of chunks wait for the loop: past that a put is
refused (SYSTEM_BUSY, nothing taken) until the loop has had a turn.

A forked child (``os.fork``, multiprocessing's fork) starts its copy of a
producer with nothing of its parent's in flight (``_inherited``, run by a
fork hook): a new window, an empty accumulator, no puts buffered or
waiting, counts from zero, and the parent's client instance let go
(``ClientInstance.inherited``; the hook is the instance's,
``inherit_at_fork``, the consumers' too); its first send attaches one of its own.
The parent's batches, puts and sends in flight stay the parent's: the
child neither waits for their slots (it hung on a full window) nor sends
them again (a batch it joined was stored twice). Fork outside a running
event loop (the blocking facade's runs in a thread the child does not
have; an asyncio program forks between ``asyncio.run`` calls): a loop
running in the forking thread goes on in the child with its parent's
tasks, which asyncio does not support.

``AsyncTransactionProducer`` sends half messages, runs the local
transaction, ends it (commit, rollback or unknown) and answers the broker's
CHECK_TRANSACTION_STATE through ``check_local_transaction``.

With ``enable_msg_trace`` (ClientConfig's, or the constructor's as in
DefaultMQProducer) ``send`` and half messages leave a Pub trace record,
END_TRANSACTION an EndTransaction one (client/trace.py); without it the
send path runs no trace code.
"""
from __future__ import annotations

import asyncio
import abc
import collections
import enum
import inspect
import itertools
import logging
import os
import re
import struct
import time
import zlib
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable

import numpy as np

from shmq.core.jit import readonly
from shmq.core.layout import lay_out, offset_msg_ids, offsets
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.headers import send_ext
from shmq.ipc.remoting import RemotingCommand

from . import instance, trace
from .accumulator import Accumulator, Window, append_entry, check_flag, running_here, shut_down
from .connection import Connection, RemotingError, next_opaque
from .direct import OverSocket
from .instance import ClientConfig, ClientInstance, MQClientError, TopicRoute, split_settings, with_settings as _with_settings
from .message import (KEYS, TAGS, UNIQ_KEY, Message, MessageExt, MessageQueue, SendResult,
                      SendStatus, check_property, decode_messages, properties_fit,
                      string_to_properties, unique_ids)
from .requests import SendTemplate
from .trace_data import MessageType

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
    max_in_flight: int = 64            # sends awaiting their answer at once (the window)
    linger_ms: float = 0               # accumulator: wait up to this for a batch; 0 = off
    batch_max_bytes: int = 16 * 1024   # accumulator: a batch's body at most (Kafka's batch.size)
    put_linger_ms: float = 1.0         # put: a partly filled buffer is stored after this (linger.ms)
    put_batch_bytes: int = 1 << 20     # put: a buffer is stored once it holds this (batch.size)
    put_buffer_bytes: int = 32 << 20   # put: chunks waiting for the loop at most (buffer.memory)


_BYTES_LIKE = {bytes, bytearray, memoryview}


def _byte_bodies(bodies) -> list:
    """``send_many``'s bodies, each bytes-like, checked before any is stored
    (the same refusal on the direct and the socket path); a memoryview that
    is not flat bytes (an int array's, a 2-D or a strided one) as its bytes,
    so that its length is its byte length. (One type pass in C for the
    common case.)"""
    types = set(map(type, bodies))
    if not types <= _BYTES_LIKE:
        for b in bodies:
            if not isinstance(b, (bytes, bytearray, memoryview)):
                raise MQClientError(R.MESSAGE_ILLEGAL, f"send_many takes bodies of bytes, "
                                    f"not {type(b).__name__}")
    if memoryview in types:
        bodies = [b.tobytes() if b.__class__ is memoryview and not (
            b.ndim == 1 and b.itemsize == 1 and b.c_contiguous) else b for b in bodies]
    return bodies


class _Bodies:
    """Bodies as the batch kernel encodes them: ``laid()`` is one read-only
    uint8 array and each body's offset and length in it, with no Python
    step per body; made once, and from the caller's list of bytes
    (``items``, also the socket path's messages) only when the direct path
    asks (the socket path needs the lengths alone: ``lens()``)."""
    __slots__ = ("items", "_laid", "_lens")

    def __init__(self, items: list | None = None, laid: tuple | None = None,
                 lens: np.ndarray | None = None):
        self.items, self._laid = items, laid
        self._lens = laid[2] if laid is not None else lens

    @classmethod
    def of(cls, bodies, lengths) -> "_Bodies":
        """``send_many``'s ``bodies`` (and ``lengths``); TypeError or
        ValueError for a shape it does not take, MQClientError for a body
        that is not bytes."""
        if lengths is not None:                 # one buffer of bodies back to back
            if isinstance(bodies, np.ndarray):
                flat = np.ascontiguousarray(bodies).reshape(-1).view(np.uint8)
            elif isinstance(bodies, (bytes, bytearray, memoryview)):
                flat = np.frombuffer(bodies, np.uint8)
            else:
                raise TypeError(f"send_many with lengths= takes one buffer of bodies (bytes, "
                                f"bytearray, memoryview, numpy array), not {type(bodies).__name__}")
            given = np.asarray(lengths)
            if given.ndim != 1 or given.dtype.kind not in "iu" and given.shape[0]:
                raise ValueError("send_many: lengths= is one integer per body (a 1-D sequence "
                                 f"of integers), not {given.dtype} of shape {given.shape}")
            # a copy: the kernels' own type (int64, contiguous, writable), whatever came
            lens = np.array(given, dtype=np.int64)
            total = int(lens.sum())
            if total != flat.shape[0]:
                raise ValueError(f"send_many: lengths sum to {total} bytes, "
                                 f"the buffer holds {flat.shape[0]}")
            return cls(laid=(readonly(flat), offsets(lens), lens))
        if isinstance(bodies, np.ndarray) and bodies.dtype.kind not in "OS":
            if bodies.ndim != 2:
                raise TypeError("send_many takes a sequence of bodies, a 2-D array (a body a "
                                "row) or one buffer with lengths=")
            a = np.ascontiguousarray(bodies)        # a body a row: its bytes
            row = a.shape[1] * a.itemsize
            n = a.shape[0]
            return cls(laid=(readonly(a.reshape(-1).view(np.uint8)),
                             np.arange(n, dtype=np.int64) * row, np.full(n, row, np.int64)))
        if isinstance(bodies, (bytes, bytearray, memoryview)):
            raise TypeError("send_many takes a sequence of bodies, a 2-D array (a body a row) "
                            "or one buffer with lengths=; send() takes one message")
        if isinstance(bodies, np.ndarray) or not hasattr(bodies, "__len__"):
            bodies = list(bodies)                  # an array of bytes objects, a generator
        return cls(_byte_bodies(bodies))

    def laid(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._laid is None:
            self._laid = lay_out(self.items, "bodies", len(self.items))
            self._lens = self._laid[2]
        return self._laid

    def lens(self) -> np.ndarray:
        if self._lens is None:
            self._lens = np.fromiter(map(len, self.items), np.int64, len(self.items))
        return self._lens

    def __len__(self) -> int:
        return len(self.items) if self.items is not None else self._lens.shape[0]

    def part(self, i: int, j: int) -> "_Bodies":
        laid, lens = self._laid, self._lens
        return _Bodies(None if self.items is None else self.items[i:j],
                       None if laid is None else (laid[0], laid[1][i:j], laid[2][i:j]),
                       None if lens is None else lens[i:j])

    def as_list(self) -> list:
        if self.items is None:
            flat, offs, lens = self._laid
            self.items = [flat[o:o + n].tobytes() for o, n in zip(offs.tolist(), lens.tolist())]
        return self.items


_CACHED_MAX = 4096                     # topics whose name and template a producer keeps


class AsyncProducer:
    def __init__(self, group: str, *, namesrv_addr: str = "", client: ClientConfig | None = None,
                 access_key: str = "", secret_key: str = "", enable_msg_trace: bool = False,
                 customized_trace_topic: str = "", **settings):
        self.group = group
        # ClientConfig's settings as keywords too (direct_append=False ...), as the
        # consumers take them
        client_settings, settings = split_settings(settings, ProducerConfig)
        if namesrv_addr:
            client_settings["namesrv_addr"] = namesrv_addr
        if access_key or secret_key:      # an ACL account: every request is signed with it
            client_settings.update(access_key=access_key, secret_key=secret_key)
        if enable_msg_trace:              # DefaultMQProducer(group, enableMsgTrace, customizedTraceTopic)
            client_settings.update(enable_msg_trace=True, customized_trace_topic=customized_trace_topic)
        self.client_config = _with_settings(client, client_settings)
        self.config = ProducerConfig(**settings)
        if self.config.linger_ms < 0:
            raise ValueError(f"linger_ms {self.config.linger_ms}: 0 (off) or more")
        if self.config.put_linger_ms < 0:
            raise ValueError(f"put_linger_ms {self.config.put_linger_ms}: 0 or more")
        if self.config.put_batch_bytes < 1:
            raise ValueError(f"put_batch_bytes {self.config.put_batch_bytes}: 1 or more")
        self.instance: ClientInstance | None = None
        self.closing = False               # shutdown() began: new sends are refused
        self._rr = itertools.count()
        self.failed_broker: str | None = None
        self.window = Window(self.config.max_in_flight)
        self.accumulator = Accumulator(self) if self.config.linger_ms > 0 else None
        self.retry_codes = RETRY_CODES
        self._templates: dict[str, SendTemplate] = {}      # topic → its send frames; names checked
        self._puts: dict[str, _PutBuffer] = {}             # topic → its puts not handed on yet
        self._put_budget = self._chunk_budget(self.config.put_batch_bytes)
        self._put_linger = self.config.put_linger_ms / 1000
        self._put_max = self.config.max_message_size
        self._put_error: BaseException | None = None       # the first failure since the last flush
        self.puts = self.stored = 0                         # messages put / stored, all along
        self._put_ends: dict[Any, int] = {}                 # direct store → end appended (SYNC_FLUSH)
        self._direct_init()
        self.tracer: trace.TraceDispatcher | None = None
        if self.client_config.enable_msg_trace:   # off: no trace code on the send path at all
            self.tracer = trace.TraceDispatcher(group, "PRODUCE", self.client_config)
            self.send = self._traced_send
        instance.inherit_at_fork(self)

    def _inherited(self) -> None:
        """In a forked child: nothing of the parent's in flight is ours (see
        the module doc). The parent's timers are cancelled in this copy of
        its loop, so the child never runs them."""
        acc = self.accumulator
        if acc is not None:
            for b in acc.batches.values():
                b.timer.cancel()
        for b in self._puts.values():
            if b.timer is not None:
                b.timer.cancel()
        self.window = Window(self.config.max_in_flight)
        self.accumulator = Accumulator(self) if acc is not None else None
        self._puts, self._put_ends, self._put_error = {}, {}, None
        self.puts = self.stored = 0
        self.failed_broker = None
        self._direct_init()
        if self.tracer is not None:        # the parent's queued trace records stay the parent's
            self.tracer = trace.TraceDispatcher(self.group, "PRODUCE", self.client_config)

    async def start(self) -> None:
        self.instance = ClientInstance.get(self.client_config)
        self.closing = False
        await self.instance.register("producer", self.group, self)
        if self.tracer is not None:
            await self.tracer.start()

    async def shutdown(self) -> None:
        """``flush()`` (what the accumulator and ``put`` hold), unregister
        (and send the trace records that wait); then raise what ``flush``
        raised (``PutFailed``). A send made once it began is refused: it
        could join a batch no flush would send."""
        if self.instance is not None:
            self.closing = True
            failed = None
            try:
                await self.flush()
            except PutFailed as e:
                failed = e
            if self.instance.pid == instance.PID:     # not the parent's, in a forked child
                await self.instance.unregister("producer", self.group)
            self.instance = None
            if self.tracer is not None:
                await self.tracer.shutdown()
            if failed is not None:
                raise failed

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

    def pick(self, queues: list[MessageQueue]) -> MessageQueue:
        """The next queue, round robin, avoiding the broker that just failed."""
        n = len(queues)
        for _ in range(n):
            q = queues[next(self._rr) % n]
            if q.broker_name != self.failed_broker:
                return q
        return queues[next(self._rr) % n]

    def _queues_now(self, topic: str) -> list[MessageQueue] | None:
        """The topic's writable queues if this process's instance has them
        cached (the send path's common case, no awaiting); else None."""
        inst = self.instance
        if inst is None or inst.pid != instance.PID or not running_here(inst.loop):
            return None
        route = inst.routes.get(topic)
        return route.publish if route is not None and route.publish else None

    async def _attach(self) -> ClientInstance:
        """This process's and loop's instance: a producer used in a forked child
        (or from another loop) registers afresh instead of touching the
        parent's sockets."""
        inst = self._inst()
        if inst.pid != os.getpid() or inst.loop is not asyncio.get_running_loop():
            self.instance = inst = ClientInstance.get(self.client_config)
            await inst.register("producer", self.group, self)
            if self.tracer is not None and not self.tracer.started:   # a forked child's own
                await self.tracer.start()
        return inst

    def _inst(self) -> ClientInstance:
        if self.instance is None:
            raise MQClientError(-1, f"the producer {self.group} is not started")
        return self.instance

    # ------------------------------------------------------------ sending
    def _check(self, msg: Message, draining: bool = False) -> None:
        """Refuse a new send once shutdown began; ``draining``: a chunk of
        what ``put`` took before, which shutdown's flush stores."""
        if self.closing and not draining:
            raise shut_down(self.group)
        if msg.topic not in self._templates:
            self._template(msg.topic)
        if not isinstance(msg.body, (bytes, bytearray, memoryview)):
            raise MQClientError(R.MESSAGE_ILLEGAL, f"the message body is "
                                f"{type(msg.body).__name__}, not bytes")
        if not msg.body:
            raise MQClientError(R.MESSAGE_ILLEGAL, "the message body is empty")
        if len(msg.body) > self.config.max_message_size:
            raise MQClientError(R.MESSAGE_ILLEGAL, f"the message body size over max value, "
                                f"MAX: {self.config.max_message_size}")
        if msg.flag:
            check_flag(msg.flag)

    def _template(self, topic: str) -> SendTemplate:
        """The topic's send frames (the name checked once, here)."""
        t = self._templates.get(topic)
        if t is None:
            if not topic or len(topic) > 127 or not TOPIC_NAME.match(topic):
                raise MQClientError(R.MESSAGE_ILLEGAL, f"the topic name {topic!r} is not valid")
            if len(self._templates) >= _CACHED_MAX:
                self._templates.clear()
            c = self.config
            t = self._templates[topic] = SendTemplate(self.group, topic, c.create_topic_key,
                                                      c.default_topic_queue_nums,
                                                      self.client_config.credentials)
        return t

    def write_send(self, conn: Connection, q: MessageQueue, msg: Message, props: str,
                   timeout: float, sysflag: int = 0) -> asyncio.Future:
        """Write one SEND_MESSAGE_V2 for ``msg`` (``props``: its properties
        string, UNIQ_KEY included) on ``conn``; the future gets the reply."""
        body = msg.body
        if len(body) > self.config.compress_msg_body_over_howmuch:
            body = zlib.compress(body, 5)
            sysflag |= SYSFLAG_COMPRESSED
        opaque = next_opaque()
        frame = self._template(msg.topic).frame(opaque, q.queue_id, sysflag, int(time.time() * 1000),
                                                msg.flag, props, body)
        return conn.send_frame(opaque, frame, timeout, RC.SEND_MESSAGE_V2)

    def write_batch(self, conn: Connection, q: MessageQueue, batch, timeout: float) -> asyncio.Future:
        """Write one SEND_BATCH_MESSAGE of the accumulator's ``batch`` (its
        ``buf``: the encoded entries) on ``conn``."""
        opaque = next_opaque()
        frame = self._template(q.topic).frame(opaque, q.queue_id, 0, int(time.time() * 1000), 0, "",
                                              batch.buf, batch=True)
        return conn.send_frame(opaque, frame, timeout, RC.SEND_BATCH_MESSAGE)

    def results(self, reply: RemotingCommand, q: MessageQueue, uniqs: list[str]) -> list[SendResult]:
        """Each message's ``SendResult`` from the answer to a send of
        ``uniqs`` (one message, or a batch in this order): a batch's answer
        names the first queue offset and every offsetMsgId, comma-joined."""
        status = STATUS.get(reply.code)
        if status is None:
            raise MQClientError(reply.code, reply.remark, f"send to {q.broker_name}")
        ext = reply.ext
        qid = ext.get("queueId")
        if qid is not None and int(qid) != q.queue_id:
            q = MessageQueue(q.topic, q.broker_name, int(qid))
        first = int(ext.get("queueOffset", -1))
        msg_id = ext.get("msgId", "")
        tx, region = ext.get("transactionId"), ext.get("MSG_REGION", "DefaultRegion")
        if len(uniqs) == 1:
            return [SendResult(status, uniqs[0], msg_id, q, first, tx, region)]
        ids = msg_id.split(",")
        if len(ids) != len(uniqs):
            ids = [msg_id] * len(uniqs)              # a broker that answers otherwise: the whole id
        if first < 0:
            return [SendResult(status, u, i, q, -1, tx, region) for u, i in zip(uniqs, ids)]
        return [SendResult(status, u, i, q, o, tx, region)
                for u, i, o in zip(uniqs, ids, range(first, first + len(uniqs)))]

    def _request(self, msg: Message, q: MessageQueue, uniq: str, sysflag: int = 0,
                 compress: bool = True) -> RemotingCommand:
        body = msg.body
        if compress and len(body) > self.config.compress_msg_body_over_howmuch:
            body = zlib.compress(body, 5)
            sysflag |= SYSFLAG_COMPRESSED
        props = msg.properties_string(uniq)
        return RemotingCommand(RC.SEND_MESSAGE_V2, body=body, ext=send_ext(
            producerGroup=self.group, topic=msg.topic, defaultTopic=self.config.create_topic_key,
            defaultTopicQueueNums=self.config.default_topic_queue_nums, queueId=q.queue_id,
            sysFlag=sysflag, bornTimestamp=int(time.time() * 1000), flag=msg.flag,
            properties=props, reconsumeTimes=0, unitMode=False, batch=False))

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

    def _append(self, ds, q: MessageQueue, msg: Message, props: str, uniq: str, sysflag: int):
        """``msg`` appended to the local broker's store by this process
        (client/direct.py): its ``SendResult``, a coroutine giving it once
        the flusher made it durable (SYNC_FLUSH), or None: it goes over the
        socket (the broker's logic is needed). Without an accumulator only:
        its socket batches and direct appends to one queue could reorder."""
        body, sysflag = self._stored_body(msg, sysflag)
        got = self._appended(ds, q, body, props, msg.flag, sysflag)
        return self._direct_result(ds, q, got, props, uniq)

    @staticmethod
    def _appended(ds, q: MessageQueue, body: bytes, props: str, flag: int, sysflag: int):
        try:
            return ds.append(q.topic, q.queue_id, body, props, flag, sysflag)
        except ValueError as e:                 # what the broker answers MESSAGE_ILLEGAL
            raise MQClientError(R.MESSAGE_ILLEGAL, str(e)) from None

    def _stored_body(self, msg: Message, sysflag: int) -> tuple[bytes, int]:
        body = msg.body
        if len(body) > self.config.compress_msg_body_over_howmuch:
            body = zlib.compress(body, 5)
            sysflag |= SYSFLAG_COMPRESSED
        return body, sysflag

    def _direct_result(self, ds, q: MessageQueue, got, props: str, uniq: str):
        """What ``_append`` answers for ``DirectStore.append``'s answer ``got``."""
        if got is None:
            return None
        msg_id, qid, offset, end = got
        mq = q if qid == q.queue_id else MessageQueue(q.topic, q.broker_name, qid)
        r = SendResult(SendStatus.SEND_OK, uniq, msg_id, mq, offset, None, "DefaultRegion")
        if not ds.sync_flush or ds.flushed(end) or "WAIT\x01false" in props:
            return r
        return self._flushed(ds, end, r)

    async def _append_in_turn(self, loop, ds, q: MessageQueue, msg: Message, props: str,
                              uniq: str, sysflag: int, over_socket):
        """``_append``, at once or joined to the loop turn's group for its
        queue (client/direct.py ``AppendTurn``); or ``OverSocket``: the
        group's end wrote it over the socket (``over_socket``), in its place."""
        body, stored_flag = self._stored_body(msg, sysflag)
        fut = ds.turn.join(loop, q.topic, q.queue_id, body, props, msg.flag, stored_flag,
                           over_socket)
        if fut is None:
            got = self._appended(ds, q, body, props, msg.flag, stored_flag)
        else:
            got = await fut
            if got.__class__ is OverSocket:
                return got
            if isinstance(got, ValueError):
                raise MQClientError(R.MESSAGE_ILLEGAL, str(got)) from None
        r = self._direct_result(ds, q, got, props, uniq)
        return await r if r is not None and r.__class__ is not SendResult else r

    def _write_counted(self, name: str, conn: Connection, q: MessageQueue, msg: Message,
                       props: str, timeout: float, sysflag: int) -> asyncio.Future:
        """``write_send``, counted among the sends over ``name``'s socket that
        a direct append waits for (``_switch``) until it is answered (or
        fails): counted off by the reply future itself, so a sender
        cancelled before it awaits the reply (one the loop turn's group
        wrote for it) leaves no count behind."""
        self._over_socket[name] = self._over_socket.get(name, 0) + 1
        try:
            fut = self.write_send(conn, q, msg, props, timeout, sysflag)
        except BaseException:
            self._socket_answered(name)
            raise
        fut.add_done_callback(lambda _: self._socket_answered(name))
        return fut

    def _direct_init(self) -> None:
        """The switch of ``send`` from a broker's socket to its store (``_switch``)."""
        self._direct_of: dict[str, Any] = {}          # broker name → the store sends append to
        self._over_socket: dict[str, int] = {}        # broker name → sends in flight over its socket
        self._drained: dict[str, asyncio.Future] = {}  # broker name → set once none is
        self._switching: dict[str, int] = {}           # broker name → sends in its ``_switch``
        self._switch_locks: dict[str, asyncio.Lock] = {}   # broker name → its switch's lock
        self._switch_loop: Any = None                  # the loop they serve

    async def _switch(self, name: str, ds, deadline: float) -> None:
        """Before ``send`` appends to ``ds``, the store of broker ``name``,
        while sends to that broker are in flight over its socket (the store
        attached while this producer sent over the socket, or an earlier
        send the store left to the broker: busy, the broker's logic
        needed): wait until every one is answered, so that no append
        overtakes one (the order within a queue). The sends that come
        meanwhile wait too, and go on in call order (the lock is FIFO; each
        appends before the next one resumes, and a new send waits behind
        them while any is in here). One broker's switch holds up only the
        sends to that broker. A send whose ``deadline`` (monotonic) passes
        first fails (RemotingError) without appending: its order is kept by
        not being stored. Each waits through a shield: a waiter cancelled
        leaves the others' wait as it was."""
        loop = asyncio.get_running_loop()
        if self._switch_loop is not loop:              # a lock serves one loop
            self._switch_locks, self._switch_loop = {}, loop
        lock = self._switch_locks.get(name)
        if lock is None:
            lock = self._switch_locks[name] = asyncio.Lock()
        switching = self._switching
        switching[name] = switching.get(name, 0) + 1
        try:
            async with asyncio.timeout(deadline - time.monotonic()), lock:
                while self._over_socket.get(name):
                    fut = self._drained.get(name)
                    if fut is None:
                        fut = self._drained[name] = loop.create_future()
                    await asyncio.shield(fut)
                self._direct_of[name] = ds
        except TimeoutError:
            raise RemotingError(f"the send timed out waiting for the sends in flight over "
                                f"{name}'s socket, which a direct append must not overtake") from None
        finally:
            n = switching[name] - 1
            if n:
                switching[name] = n
            else:
                del switching[name]

    def _socket_answered(self, name: str) -> None:
        n = self._over_socket[name] - 1
        if n:
            self._over_socket[name] = n
            return
        del self._over_socket[name]
        fut = self._drained.pop(name, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def _flushed(self, ds, end: int, r: SendResult) -> SendResult:
        if not await ds.wait_flushed(end, asyncio.get_running_loop()):
            r = replace(r, status=SendStatus.FLUSH_DISK_TIMEOUT)
        return r

    def send_here(self, msg: Message, queue: MessageQueue | None = None,
                  selector: Selector | None = None, arg: Any = None):
        """The blocking ``Producer.send``'s lane past the client's loop, in the
        calling thread: ``msg`` appended to the store of its broker on this
        host (client/direct.py) as ``send`` appends it there. Returns (its
        SendResult, None) or (None, the queue ``send`` must use: the one
        given or the selector's, None for round robin): it takes the loop's
        path — no route or attached store yet, a topic on more than that
        broker, a send of this producer over a socket not answered yet (an
        append now could overtake it), SYNC_FLUSH (its wait is the loop's),
        an accumulator or trace on, a message the broker's logic must see,
        or a store that leaves it to the broker (busy, disk full). Each is
        known before a queue is picked but the last, so the round robin
        loses a turn only then. The checks read the loop's state and change
        none of it but the round robin: the caller may be any thread but
        the loop's own."""
        inst = self.instance
        if (inst is None or inst.pid != instance.PID or inst.stopped or self.accumulator is not None
                or self.tracer is not None or self._over_socket or self._switching):
            return None, queue
        route = inst.routes.get(msg.topic)
        queues = route.publish if route is not None else None
        if not queues:
            return None, queue
        name = queues[0].broker_name
        ds = self._direct_of.get(name)
        if (ds is None or ds.stopped or ds.sync_flush or ds.conn is None or ds.conn.closed
                or queues[-1].broker_name != name):        # (one broker's queues: in a row)
            return None, queue
        self._check(msg)
        uniq = msg.properties.get(UNIQ_KEY) or unique_ids.next()
        props = msg.properties_string(uniq)
        if ds.takes(msg.topic, 0, props, 0) is None:       # the broker's logic is needed
            return None, queue
        if queue is None and selector is not None:
            queue = selector(queues, msg, arg)
        q = queue or self.pick(queues)
        if q.broker_name != name:                          # a queue given of another broker
            return None, queue
        r = self._append(ds, q, msg, props, uniq, 0)
        if r is None:
            return None, queue
        self.failed_broker = None
        return r, None

    def send(self, msg: Message, queue: MessageQueue | None = None,
             selector: Selector | None = None, arg: Any = None,
             timeout: float | None = None) -> Awaitable[SendResult]:
        """Send and wait for the broker's answer (``await p.send(msg)``).
        ``queue`` or ``selector`` (with ``arg``) fix the queue: ordered
        messages, no retry elsewhere. (A plain function returning the
        coroutine: one frame less per send.)"""
        return self._send(msg, queue, selector, arg, timeout)

    async def _traced_send(self, msg: Message, queue: MessageQueue | None = None,
                           selector: Selector | None = None, arg: Any = None,
                           timeout: float | None = None) -> SendResult:
        """``send`` with trace on: its Pub record (client/trace.py)."""
        began_ms = int(time.time() * 1000)
        r = await self._send(msg, queue, selector, arg, timeout)
        trace.pub(self.tracer, self, msg, r, began_ms, MessageType.Delay_Msg
                  if msg.delay_level > 0 else MessageType.Normal_Msg)
        if len(self.tracer.queue) >= trace.BACKLOG:
            await self.tracer.keep_up()
        return r

    async def _send(self, msg: Message, queue, selector, arg, timeout, sysflag: int = 0,
                    extra: dict[str, str] | None = None) -> SendResult:
        acc = self.accumulator
        if acc is not None and queue is None and selector is None and not sysflag:
            fut = acc.offer(msg, timeout or self.config.send_msg_timeout)   # its fast lane
            if fut is not None:
                return await fut
        self._check(msg)
        timeout = timeout or self.config.send_msg_timeout
        uniq = msg.properties.get(UNIQ_KEY) or unique_ids.next()
        deadline = time.monotonic() + timeout
        # also loads the route of a given queue
        queues = self._queues_now(msg.topic) or await self.publish_queues(msg.topic)
        if queue is None and selector is not None:
            queue = selector(queues, msg, arg)
        window = self.window
        if window.used < window.limit:             # Window.try_take, inline: the hot path
            window.used += 1
        else:
            if acc is not None and acc.lingering >= window.used:
                acc.flush()                        # only lingering holds slots: nothing else frees one
            await window.wait()
        fut = None
        try:
            if acc is not None and not sysflag and acc.takes(msg):
                fut = acc.add(msg, uniq, queue, queues, deadline - time.monotonic())
                if fut is not None:                # its batch holds the slot now
                    return await fut
            props = msg.properties_string(uniq, extra)    # checked with extra's in it
            tries = 1 if queue is not None else 1 + self.config.retry_times_when_send_failed
            last: Exception | None = None
            for attempt in range(tries):
                if attempt:                            # the route again: it may have changed
                    queues = self._queues_now(msg.topic) or await self.publish_queues(msg.topic)
                q = queue or self.pick(queues)
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    inst = self.instance
                    conn = inst.broker_now(q.broker_name) or await inst.broker(q.broker_name)
                    if acc is None:
                        name = q.broker_name
                        ds = inst.direct_now(name)
                        sent = None
                        if ds is not None:
                            # (a send still over the socket, this one's turn to
                            # append after it: as at the switch)
                            if self._direct_of.get(name) is not ds or self._over_socket.get(name) \
                                    or self._switching and name in self._switching:
                                await self._switch(name, ds, deadline)
                            r = await self._append_in_turn(
                                inst.loop, ds, q, msg, props, uniq, sysflag,
                                lambda: self._write_counted(name, conn, q, msg, props, left,
                                                            sysflag))
                            if r.__class__ is OverSocket:
                                sent = r.reply         # the turn's end wrote it, in its place
                            elif r is not None:
                                self.failed_broker = None
                                return r
                        if sent is None:               # not appended here: over the socket
                            sent = self._write_counted(name, conn, q, msg, props, left, sysflag)
                        reply = await sent
                    else:
                        acc.flush_queue(q, conn)       # what waits for q leaves first
                        reply = await self.write_send(conn, q, msg, props, left, sysflag)
                    r = self.results(reply, q, [uniq])[0]
                    self.failed_broker = None
                    return r
                except RemotingError as e:
                    last = e
                except MQClientError as e:
                    if e.code not in RETRY_CODES:
                        raise
                    last = e
                self.failed_broker = q.broker_name
                log.info("send to %s failed (%s); trying another queue", q, last)
            raise last or MQClientError(-1, f"send timed out after {timeout} s")
        finally:
            if fut is None:
                window.release()

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
        q = queue or self.pick(queues)
        conn = await self._inst().broker(q.broker_name)
        if self.accumulator is not None:
            self.accumulator.flush_queue(q, conn)
        conn.send_oneway(self._request(msg, q, msg.properties.get(UNIQ_KEY) or unique_ids.next()))

    async def send_many(self, topic: str, bodies, *, tags: str | None = None,
                        queue: MessageQueue | None = None, timeout: float | None = None,
                        lengths=None) -> list[SendManyResult]:
        """The hot loop's call: many bodies to one queue of ``topic`` (``queue``,
        else the next round robin), with one ``tags`` for all and no other
        properties — no ``Message`` objects, and appended here no UNIQ_KEY
        (each message is known by its offset msgId; over the socket each gets
        one, as RocketMQ's batch send gives). ``bodies``: a sequence of
        bytes-like bodies; a 2-D numpy array, a body a row; or one buffer of
        bodies back to back with their ``lengths`` (an Arrow binary column's
        data and lengths, say). The arrays cost no Python step per body. On
        the broker's host (direct appends) each ~1 MiB of bodies is one
        claim, encoded by the batch kernel in one call; elsewhere each is one
        SEND_BATCH_MESSAGE. One result per claim, in order."""
        self._template(topic)
        laid = _Bodies.of(bodies, lengths)
        lens = laid.lens()
        n = lens.shape[0]
        limit = self.config.max_message_size
        bad = np.flatnonzero((lens < 1) | (lens > limit))
        if bad.shape[0]:
            raise MQClientError(R.MESSAGE_ILLEGAL, f"a body of {lens[bad[0]]} bytes: 1..{limit}")
        props = put_properties(tags, None)
        if queue is not None and queue.topic != topic:
            raise ValueError(f"send_many to {topic}: queue= is a queue of {queue.topic}")
        q = queue or self.pick(self._queues_now(topic) or await self.publish_queues(topic))
        out: list[SendManyResult] = []
        # a claim's bodies, as a batch entry counts them (a socket batch's
        # body must stay under the broker's maxMessageSize too): as many as
        # fit the budget, at least one
        budget = self._chunk_budget(_MANY_CHUNK_BYTES)
        ends = np.cumsum(lens + (_ENTRY_BYTES + len(props.encode())))
        i, base = 0, 0
        while i < n:
            j = max(i + 1, int(np.searchsorted(ends, base + budget, "right")))
            out.append(await self._store_chunk(q, laid.part(i, j), props, timeout))
            base, i = int(ends[j - 1]), j
        return out

    def _chunk_budget(self, most: int) -> int:
        """The bodies (with their entries) one claim or SEND_BATCH_MESSAGE
        carries at most: ``most``, within the broker's maxMessageSize."""
        return min(most, self.config.max_message_size) - 1024

    async def _store_chunk(self, q: MessageQueue, bodies: _Bodies, props: str | list[str],
                           timeout: float | None, draining: bool = False) -> SendManyResult:
        """One chunk of ``send_many`` (or of ``put``) stored in ``q``: one
        direct claim, waiting for the flusher under SYNC_FLUSH, or one
        SEND_BATCH_MESSAGE. ``props``: one properties string for all or one
        per message (TAGS and KEYS). ``draining``: ``put``'s, which a
        shutdown's flush still stores."""
        inst = self._inst()
        # the first connection to a broker on this host attaches its store
        conn = inst.broker_now(q.broker_name) or await inst.broker(q.broker_name)
        got = self._append_chunk(q, bodies, props)
        if got is not None:
            r, ds, end = got
            if not await self._durable(ds, end):
                r.status = SendStatus.FLUSH_DISK_TIMEOUT
            return r
        if self.accumulator is not None:
            self.accumulator.flush_queue(q, conn)
        topic = q.topic
        if props.__class__ is str:
            msgs = [Message(topic, b, properties=string_to_properties(props) if props else {})
                    for b in bodies.as_list()]
        else:
            msgs = [Message(topic, b, properties=string_to_properties(p) if p else {})
                    for b, p in zip(bodies.as_list(), props)]
        if len(msgs) == 1:
            # one message alone (a body up to max_message_size, which a batch's
            # entry head would push over it): a plain send, stored as the direct
            # path and a batch store it (not compressed)
            m = msgs[0]
            self._check(m, draining)
            uniq = unique_ids.next()
            sr = await self._send_to(q, self._request(m, q, uniq, compress=False), uniq,
                                     timeout or self.config.send_msg_timeout)
        else:
            sr = await self._send_batch(msgs, q, timeout, draining)
        return SendManyResult(sr.status, sr.queue, sr.queue_offset, len(bodies),
                              ids=sr.offset_msg_id.split(","))

    def _append_chunk(self, q: MessageQueue, bodies: _Bodies, props: str | list[str]):
        """``bodies`` appended to ``q`` as one claim by this process, without
        yielding: (its ``SendManyResult``, the store, the end a SYNC_FLUSH
        waits for), or None: it goes over the socket (no direct appends to
        q's broker, the broker's logic needed, or an accumulator, whose
        batches for q must leave first)."""
        if self.accumulator is not None:
            return None
        inst = self._inst()
        ds = inst.direct_now(q.broker_name)
        if ds is None:
            return None
        if running_here(inst.loop):
            ds.turn.flush()                 # the sends called before it, appended before it
        try:
            got = ds.append_many(q.topic, q.queue_id, *bodies.laid(), props)
        except ValueError as e:             # what the broker answers MESSAGE_ILLEGAL
            raise MQClientError(R.MESSAGE_ILLEGAL, str(e)) from None
        if got is None:
            return None
        first, rec_pos, offset, end = got
        return (SendManyResult(SendStatus.SEND_OK, q, offset, len(bodies), first, rec_pos,
                               ds.msgid_prefix), ds, end)

    @staticmethod
    async def _durable(ds, end: int) -> bool:
        """Is the store's CommitLog durable up to ``end`` — at once unless
        SYNC_FLUSH, else once the flusher got there (False: syncFlushTimeout)?"""
        return (not ds.sync_flush or ds.flushed(end)
                or await ds.wait_flushed(end, asyncio.get_running_loop()))

    # ------------------------------------------------------------ put / flush
    def put(self, topic: str, body: bytes, tags: str | None = None,
            keys: str | list[str] | None = None) -> None:
        """Hand one message to the producer and return (a plain call, ~1 µs):
        it is NOT stored yet. ``await flush()`` is the acknowledgement. See
        "put and flush" in the module doc: puts to ``topic`` are gathered in
        one buffer, stored ~1 MiB a claim (``put_batch_bytes``) or after
        ``put_linger_ms``, in call order within each queue. Raises at once
        for a bad topic or body (``bytes`` of 1..max_message_size, tags and
        keys without \\u0001/\\u0002), and ``PutFailed`` while an earlier
        chunk's failure waits for ``flush()`` to report it."""
        if self._put_error is not None:
            raise self._put_failed()
        b = self._puts.get(topic)
        if b is None:
            b = self._put_open(topic)
        if body.__class__ is not bytes or not 0 < len(body) <= self._put_max:
            raise self._put_refused(body)
        if b.nbytes >= self._put_budget:
            self._put_seal(b, True)
        if b.timer is None:
            b.timer = asyncio.get_running_loop().call_later(self._put_linger, self._put_seal, b)
        if tags is None and keys is None:
            if b.tagged:
                b.props.append("")
            b.nbytes += len(body) + _ENTRY_BYTES
        else:
            p = put_properties(tags, keys)
            if not b.tagged:                    # the first with properties: "" for those before
                b.props = [""] * len(b.bodies)
                b.tagged = True
            b.props.append(p)
            b.nbytes += len(body) + _ENTRY_BYTES + len(p)
        b.bodies.append(body)

    def _put_open(self, topic: str) -> "_PutBuffer":
        self._template(topic)                   # the name checked once
        b = self._puts[topic] = _PutBuffer(topic)
        return b

    def _put_handoff(self, topic: str, bodies: list, props, nbytes: int,
                     release: Callable[[], None] | None) -> None:
        """A chunk put in another thread (``Producer.put``), stored as ours."""
        b = self._puts.get(topic) or self._put_open(topic)
        self._put_seal(b)                       # what was put here first goes first
        self.puts += len(bodies)
        self._put_chunk(b, bodies, props, nbytes, release)

    def _put_refused(self, body) -> MQClientError:
        if body.__class__ is not bytes:
            return MQClientError(R.MESSAGE_ILLEGAL, f"put takes a body of bytes, not "
                                 f"{type(body).__name__} (it is stored later: it must not change)")
        return MQClientError(R.MESSAGE_ILLEGAL, f"a body of {len(body)} bytes: "
                                                f"1..{self._put_max}")

    def _put_failed(self) -> "PutFailed":
        e = self._put_error
        return PutFailed(getattr(e, "code", -1), f"an earlier put was not stored ({e}); "
                         f"await flush() to see the counts and go on", self.puts, self.stored,
                         e)

    def _put_seal(self, b: "_PutBuffer", check: bool = False) -> None:
        """Hand ``b``'s messages on as one chunk (size reached, linger over,
        flush). ``check``: a put's, which is refused (MQClientError) while
        ``put_buffer_bytes`` of chunks wait for the loop."""
        if check and b.waiting_bytes >= self.config.put_buffer_bytes:
            raise MQClientError(R.SYSTEM_BUSY, f"{b.waiting_bytes} bytes of puts to {b.topic} "
                                f"wait for the event loop (put_buffer_bytes): await flush()")
        if b.timer is not None:
            b.timer.cancel()
            b.timer = None
        bodies = b.bodies
        if not bodies:
            return
        props = b.props if b.tagged else ""
        nbytes = b.nbytes
        b.bodies, b.props, b.tagged, b.nbytes = [], [], False, 0
        self.puts += len(bodies)
        self._put_chunk(b, bodies, props, nbytes)

    def _put_chunk(self, b: "_PutBuffer", bodies: list, props, nbytes: int,
                   release: Callable[[], None] | None = None) -> None:
        """Store one chunk of ``b``'s topic: appended here and now, without
        yielding, when its route is known and its queue's broker is attached
        (direct) and no earlier chunk of the topic waits; else queued behind
        those for the topic's one task (``_put_drain``), which awaits what
        must be awaited (the route, the socket) and keeps the order.
        ``release`` is called once the chunk is done with (stored or failed)."""
        bodies = _Bodies(bodies)
        q = None
        if not b.waiting:
            queues = self._queues_now(b.topic)
            if queues is not None:
                q = self.pick(queues)
                try:
                    got = self._append_chunk(q, bodies, props)
                except Exception as e:                  # noqa: BLE001 (flush raises it)
                    self._put_fail(e)
                    got = False
                if got is not None:
                    if got:
                        r, ds, end = got
                        self.stored += r.count
                        if ds.sync_flush:
                            self._put_ends[ds] = end
                    if release is not None:
                        release()
                    return
        b.waiting.append((q, bodies, props, nbytes, release))
        b.waiting_bytes += nbytes
        if b.task is None:
            b.task = asyncio.get_running_loop().create_task(self._put_drain(b))

    async def _put_drain(self, b: "_PutBuffer") -> None:
        """Store ``b``'s waiting chunks, one after the other (send_many's path)."""
        try:
            while b.waiting:
                q, bodies, props, nbytes, release = b.waiting[0]
                try:
                    if q is None:
                        q = self.pick(self._queues_now(b.topic) or await self.publish_queues(b.topic))
                    r = await self._store_chunk(q, bodies, props, None, draining=True)
                    self.stored += r.count
                    if r.status is not SendStatus.SEND_OK:
                        self._put_fail(MQClientError(-1, f"{r.count} messages put to {q} are "
                                                     f"stored but {r.status.value}"))
                except Exception as e:                  # noqa: BLE001 (flush raises it)
                    self._put_fail(e)
                finally:
                    b.waiting.popleft()
                    b.waiting_bytes -= nbytes
                    if release is not None:
                        release()
        finally:
            b.task = None

    def _put_fail(self, e: BaseException) -> None:
        log.warning("puts not stored: %s", e)
        if self._put_error is None:
            self._put_error = e

    async def flush(self) -> "FlushResult":
        """Store everything ``put`` before this call (and send what the
        accumulator holds, waiting for the answers); return once it is
        stored — under SYNC_FLUSH durable, as a send's answer — with the
        producer's counts of messages put and stored. ``PutFailed`` if any
        chunk since the last flush failed (the first error as its
        ``__cause__``, the counts on it); the next flush starts clean."""
        if self.accumulator is not None:
            await self.accumulator.drain()
        for b in list(self._puts.values()):
            self._put_seal(b)
        tasks = [b.task for b in self._puts.values() if b.task is not None]
        if tasks:
            await asyncio.wait(tasks)          # a cancelled flush leaves them storing
        for ds, end in list(self._put_ends.items()):
            if not await self._durable(ds, end):
                self._put_fail(MQClientError(R.FLUSH_DISK_TIMEOUT, f"the store is not durable "
                                             f"up to {end} after syncFlushTimeout"))
            elif self._put_ends.get(ds) == end:
                del self._put_ends[ds]
        if self._put_error is not None:
            failed = self._put_failed()
            self._put_error = None
            raise failed
        return FlushResult(self.puts, self.stored)

    async def send_batch(self, msgs: list[Message], queue: MessageQueue | None = None,
                         timeout: float | None = None) -> SendResult:
        """One SEND_BATCH_MESSAGE: every message to one topic and queue."""
        return await self._send_batch(msgs, queue, timeout)

    async def _send_batch(self, msgs: list[Message], queue: MessageQueue | None,
                          timeout: float | None, draining: bool = False) -> SendResult:
        if not msgs:
            raise MQClientError(R.MESSAGE_ILLEGAL, "the batch is empty")
        topic = msgs[0].topic
        body, uniqs = bytearray(), []
        for m in msgs:
            self._check(m, draining)
            if m.topic != topic:
                raise MQClientError(R.MESSAGE_ILLEGAL, "the messages of a batch go to one topic")
            if m.delay_level > 0:
                raise MQClientError(R.MESSAGE_ILLEGAL, "a batch cannot carry a delay level")
            uniq = m.properties.get(UNIQ_KEY) or unique_ids.next()
            uniqs.append(uniq)
            append_entry(body, m.body, m.properties_string(uniq).encode(), m.flag)
        if len(body) > self.config.max_message_size:
            raise MQClientError(R.MESSAGE_ILLEGAL, f"the batch is {len(body)} bytes, over "
                                f"max_message_size {self.config.max_message_size}")
        queues = await self.publish_queues(topic)
        q = queue or self.pick(queues)
        if self.accumulator is not None:
            self.accumulator.flush_queue(q, await self._inst().broker(q.broker_name))
        cmd = RemotingCommand(RC.SEND_BATCH_MESSAGE, body=body, ext=send_ext(
            producerGroup=self.group, topic=topic, defaultTopic=self.config.create_topic_key,
            defaultTopicQueueNums=self.config.default_topic_queue_nums, queueId=q.queue_id,
            sysFlag=0, bornTimestamp=int(time.time() * 1000), flag=0, properties="",
            reconsumeTimes=0, unitMode=False, batch=True))
        return await self._send_to(q, cmd, ",".join(uniqs), timeout or self.config.send_msg_timeout)


@dataclass
class SendManyResult:
    """Where ``send_many``'s messages went: ``count`` of them in ``queue``,
    message i at ``queue_offset + i`` (one claim: nothing between them)."""
    status: SendStatus
    queue: MessageQueue
    queue_offset: int
    count: int
    first_phy: int = 0
    rec_pos: Any = None          # each record's CommitLog offset from first_phy (array)
    msgid_prefix: str = ""
    ids: list[str] | None = None     # a broker's answer names them (the socket path)

    @property
    def offset_msg_ids(self) -> list[str]:
        """The broker's msgId of each message (made on demand: a string each)."""
        if self.ids is not None:
            return self.ids
        return offset_msg_ids(self.msgid_prefix, self.rec_pos + self.first_phy).split(",")


class _PutBuffer:
    """One topic's puts not handed on yet, and its chunks waiting for the loop."""
    __slots__ = ("topic", "bodies", "props", "tagged", "nbytes", "timer", "waiting",
                 "waiting_bytes", "task")

    def __init__(self, topic: str):
        self.topic = topic
        self.bodies: list[bytes] = []
        self.props: list[str] = []          # each message's TAGS/KEYS properties, "" for none
        self.tagged = False                 # any not "" (else ``props`` is left empty)
        self.nbytes = 0                     # as a batch entry counts them
        self.timer = None                   # the linger's TimerHandle (Producer.put: a mark)
        self.waiting: collections.deque = collections.deque()
        self.waiting_bytes = 0
        self.task: asyncio.Task | None = None


def put_properties(tags: str | None, keys: str | list[str] | None) -> str:
    """A put's properties string: TAGS and KEYS (a list joined by spaces,
    as ``Message``), in ``Message``'s order."""
    if keys is not None and not isinstance(keys, str):
        keys = " ".join(keys)
    for name, v in ((TAGS, tags), (KEYS, keys)):
        if v:
            check_property(name, v)
    if tags and keys:
        return properties_fit(f"TAGS\x01{tags}\x02KEYS\x01{keys}")
    return properties_fit(f"TAGS\x01{tags}" if tags else f"KEYS\x01{keys}" if keys else "")


@dataclass
class FlushResult:
    """What ``flush()`` found: messages ``put`` and ``stored`` by this
    producer, since it was made (equal when nothing was lost)."""
    put: int
    stored: int


class PutFailed(MQClientError):
    """Puts that were not stored (or not made durable): ``code`` and remark
    of the first failure (its ``__cause__``), the producer's counts."""

    def __init__(self, code: int, remark: str, put: int, stored: int,
                 cause: BaseException | None = None):
        super().__init__(code, remark, "put")
        self.put, self.stored = put, stored
        self.__cause__ = cause


_MANY_CHUNK_BYTES = 1 << 20            # send_many: bodies appended (or sent) per claim at most
_ENTRY_BYTES = 24 + 64                 # a batch entry's head and a UNIQ_KEY, beside body and properties


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
        began_ms = int(time.time() * 1000)
        r = await self._send(msg, None, None, None, None, SYSFLAG_PREPARED,
                             {"TRAN_MSG": "true", "PGROUP": self.group})
        if self.tracer is not None:
            trace.pub(self.tracer, self, msg, r, began_ms, MessageType.Trans_Msg_Half)
        state = LocalTransactionState.UNKNOW
        if r.status is SendStatus.SEND_OK:
            try:
                state = await _call(self.listener.execute_local_transaction, msg, arg)
            except Exception:     # the application's code: its error is an answer (UNKNOW), as in Java
                log.exception("the local transaction of %s raised: left unknown", r.msg_id)
                state = LocalTransactionState.UNKNOW
        else:
            state = LocalTransactionState.ROLLBACK_MESSAGE
        await self._end(int(r.offset_msg_id[-16:], 16), r.queue_offset, r.msg_id, state,
                        broker=r.queue.broker_name)
        if self.tracer is not None:
            trace.end_transaction(self.tracer, self, msg, r.msg_id, state.name, False,
                                  trace.broker_addr(self, r.queue))
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
        msg = decode_messages(cmd.body, "", check_crc=False)[0]
        if msg.properties.get("PGROUP") not in (None, self.group):
            return False
        try:
            state = await _call(self.listener.check_local_transaction, msg)
        except Exception:         # the application's code, as above
            log.exception("check_local_transaction of %s raised: unknown", msg.msg_id)
            state = LocalTransactionState.UNKNOW
        ext = cmd.ext
        msg_id = ext.get("msgId") or msg.msg_id
        await self._end(int(ext["commitLogOffset"]), int(ext["tranStateTableOffset"]), msg_id,
                        state, conn=conn, from_check=True)
        if self.tracer is not None:
            host, port = msg.store_host
            trace.end_transaction(self.tracer, self, msg, msg_id, state.name, True, f"{host}:{port}")
        return True
