"""Message trace (RocketMQ 4.4+): a client with ``enable_msg_trace`` records
each send and each consume as trace records (trace_data.py) and sends them,
batched, to the trace topic (``customized_trace_topic``, else
RMQ_SYS_TRACE_TOPIC) as ordinary messages. Nothing here runs when trace is
off: the producer and the push consumer put their traced methods in place
only when it is on.

The hooks (RocketMQ's SendMessageTraceHookImpl, ConsumeMessageTraceHookImpl):

- ``pub``: after a ``send`` (``send_async`` too) or a half message that got
  an answer, one Pub record (a send that raised writes none, as in Java:
  its SendResult is null; so does ``send_oneway``). ``send_batch`` and
  ``send_many`` are not traced; ``end_transaction``: one EndTransaction
  record per END_TRANSACTION a transaction producer sends (after its local
  transaction, or answering a broker's check);
- ``sub_before`` before the listener runs on a batch, one SubBefore per
  message (skipping a message whose ``TRACE_ON`` property is ``false``);
  ``sub_after`` after it, one SubAfter per message, with the listener's
  verdict (``ConsumeReturnType``) and its time divided over the batch.

The dispatcher (AsyncTraceDispatcher) keeps them from costing the user's
sends: a hook only appends a context to a bounded queue (``QUEUE_SIZE``,
1024); a full queue drops it and counts it in ``discarded``, never waits
for room. A background task, every ``POLL_S``, encodes what waits into the
current segment; a segment is sent when its text reaches ``SEGMENT_CHARS``
(maxMessageSize − 10000), its oldest record is ``WAIT_S`` old, or (shmq)
its KEYS reach ``KEYS_CHARS_MAX``: a stored record's properties must stay
under 32 KiB. Each segment is one message: body the records, ``KEYS`` the
traced messages' msgIds and keys, so QUERY_MESSAGE by key on the trace
topic finds a message's records. Sends run concurrently (at most
``SENDING_MAX`` at once, ``PENDING_MAX`` waiting; past that a segment is
dropped and counted) on the dispatcher's own producer, group
``_INNER_TRACE_PRODUCER-<group>-<PRODUCE|CONSUME>-<n>``, instance
``PID_CLIENT_INNER_TRACE_PRODUCER_<namesrv>``, send timeout 5 s, maximum
message size 128000, with the host client's account. A send that fails is
a warning and counted in ``send_failures``; it is never retried.
``shutdown`` sends what waits and gives the sends up to the send timeout.

Unlike Java's worker thread, the worker shares the event loop with the
sends, and sends that append directly to the store (client/direct.py) never
yield it: a loop of them would starve the worker and fill the queue. So a
traced send that finds ``BACKLOG`` contexts queued does the worker's
encoding itself and yields once (``keep_up``: about one send in 512, in a
tight loop).
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import re
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from . import background
from .errors import EXPECTED
from .instance import MASTER_ID, ClientConfig
from .listeners import ConsumeConcurrentlyStatus, ConsumeOrderlyStatus
from .message import Message, MessageExt, MessageQueue, SendResult, SendStatus, unique_ids
from .trace_data import (DEFAULT_REGION, GROUP_NAME_PREFIX, TRACE_INSTANCE_NAME, TRACE_TOPIC,
                         ConsumeReturnType, MessageType, TraceBean, TraceContext, TraceType,
                         encode)

if TYPE_CHECKING:
    from .producer import AsyncProducer

log = logging.getLogger("shmq.client")

QUEUE_SIZE = 1024                  # AsyncTraceDispatcher.traceContextQueue
BACKLOG = QUEUE_SIZE // 2          # queued contexts past which a traced send helps the worker
MAX_MESSAGE_SIZE = 128_000         # the trace producer's maxMessageSize
SEGMENT_CHARS = MAX_MESSAGE_SIZE - 10_000
POLL_S = 0.1                       # pollingTimeMil
WAIT_S = 0.5                       # waitTimeThresholdMil
SEND_TIMEOUT_S = 5.0
SENDING_MAX = 20                   # the trace executor's threads ...
PENDING_MAX = 2048                 # ... and its queue
CONSUME_TIMEOUT_MS = 15 * 60_000   # DefaultMQPushConsumer.consumeTimeout: slower is TIME_OUT
_COUNTER = itertools.count(1)


KEYS_CHARS_MAX = 16_000            # shmq: a segment's KEYS at most (a record's properties are < 32 KiB)
_TOPIC_NAME = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")


def trace_topic(config: ClientConfig) -> str:
    """The topic ``config``'s trace goes to; ValueError naming a bad one."""
    topic = config.customized_trace_topic or TRACE_TOPIC
    if not _TOPIC_NAME.match(topic):
        raise ValueError(f"customized_trace_topic {topic!r}: not a topic name (1..127 of "
                         f"letters, digits, %, |, _ and -)")
    return topic


class TraceDispatcher:
    """One traced producer's or consumer's records on their way to the trace
    topic (``kind``: PRODUCE or CONSUME)."""

    def __init__(self, group: str, kind: str, config: ClientConfig):
        self.group = group
        self.topic = trace_topic(config)
        self.config = replace(config, instance_name=f"{TRACE_INSTANCE_NAME}_"
                                                    f"{';'.join(config.namesrv_list())}",
                              enable_msg_trace=False, customized_trace_topic="")
        self.producer_group = f"{GROUP_NAME_PREFIX}-{group}-{kind}-{next(_COUNTER)}"
        self.queue: collections.deque[TraceContext] = collections.deque()
        self.discarded = 0               # contexts dropped: the queue was full
        self.dropped_segments = 0        # segments dropped: PENDING_MAX sends waited
        self.send_failures = 0
        self._segment: list[str] = []
        self._segment_keys: dict[str, None] = {}
        self._segment_chars = 0
        self._segment_key_chars = 0
        self._segment_since = 0.0
        self._sends: set[asyncio.Task] = set()
        self._slots: asyncio.Semaphore | None = None
        self._task: asyncio.Task | None = None
        self.producer: AsyncProducer | None = None
        self.failure: BaseException | None = None     # the bug that stopped the worker

    # ------------------------------------------------------------ the hooks' side
    def append(self, ctx: TraceContext) -> bool:
        """Queue ``ctx``; False (and counted) if the queue is full."""
        if len(self.queue) >= QUEUE_SIZE:
            self.discarded += 1
            if self.discarded & (self.discarded - 1) == 0:      # 1, 2, 4, 8 ...: not every one
                log.warning("trace of %s: the queue is full; %d records dropped so far",
                            self.group, self.discarded)
            return False
        self.queue.append(ctx)
        return True

    async def keep_up(self) -> None:
        """A traced send found ``BACKLOG`` contexts waiting: the loop gave the
        worker no turn (direct appends complete without yielding). Encode
        them here and give the trace sends a turn, so a tight loop of sends
        drops no record."""
        self._drain()
        if self._segment and time.monotonic() - self._segment_since >= WAIT_S:
            self._send_segment()
        await asyncio.sleep(0)

    # ------------------------------------------------------------ life
    async def start(self) -> None:
        from .producer import AsyncProducer           # producer.py imports this module
        self.producer = AsyncProducer(self.producer_group, client=self.config,
                                      send_msg_timeout=SEND_TIMEOUT_S,
                                      max_message_size=MAX_MESSAGE_SIZE)
        await self.producer.start()
        self._slots = asyncio.Semaphore(SENDING_MAX)
        self._task = background.spawn(self._run(), f"the trace dispatcher of {self.group}",
                                      self._bug)

    @property
    def started(self) -> bool:
        return self._task is not None

    async def shutdown(self) -> None:
        """Send what waits, give the sends up to the send timeout, stop."""
        if self._task is None:
            return
        await background.cancel([self._task])
        self._task = None
        self._drain()
        self._send_segment()
        if self._sends:
            await asyncio.wait(set(self._sends), timeout=SEND_TIMEOUT_S)
        await background.cancel(self._sends)
        await self.producer.shutdown()

    def _bug(self, what: str, exc: BaseException) -> None:
        """A bug stopped the dispatcher (logged by background.watch): tracing
        stops, the host client goes on; records queue up to QUEUE_SIZE and
        are dropped after."""
        self.failure = exc

    # ------------------------------------------------------------ the worker
    async def _run(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            self._drain()
            if self._segment and time.monotonic() - self._segment_since >= WAIT_S:
                self._send_segment()

    def _drain(self) -> None:
        """Encode the queued contexts into the segment; send it when full."""
        q = self.queue
        while q:
            ctx = q.popleft()
            text = encode(ctx)
            if not self._segment:
                self._segment_since = time.monotonic()
            self._segment.append(text)
            for k in ctx.keys():
                if k not in self._segment_keys:
                    self._segment_keys[k] = None
                    self._segment_key_chars += len(k) + 1
            self._segment_chars += len(text)
            if self._segment_chars >= SEGMENT_CHARS or self._segment_key_chars >= KEYS_CHARS_MAX:
                self._send_segment()

    def _send_segment(self) -> None:
        if not self._segment:
            return
        msg = Message(self.topic, "".join(self._segment).encode(), keys=list(self._segment_keys))
        self._segment, self._segment_keys = [], {}
        self._segment_chars = self._segment_key_chars = 0
        if len(self._sends) >= SENDING_MAX + PENDING_MAX:
            self.dropped_segments += 1
            log.warning("trace of %s: %d trace sends wait; a segment is dropped", self.group,
                        len(self._sends))
            return
        task = asyncio.get_running_loop().create_task(self._send(msg))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send(self, msg: Message) -> None:
        async with self._slots:
            try:
                await self.producer.send(msg)
            except EXPECTED as e:
                self.send_failures += 1
                log.warning("trace of %s: sending %d bytes to %s failed: %s", self.group,
                            len(msg.body), self.topic, e)


# ---------------------------------------------------------------- the hooks
def pub(d: TraceDispatcher, producer: "AsyncProducer", msg: Message, r: SendResult,
        began_ms: int, msg_type: MessageType) -> None:
    """SendMessageTraceHookImpl: the Pub record of a send begun at ``began_ms``."""
    if msg.topic == d.topic:
        return
    cost = int(time.time() * 1000) - began_ms
    bean = TraceBean(topic=msg.topic, msg_id=r.msg_id, offset_msg_id=r.offset_msg_id,
                     tags=msg.tags, keys=_keys(msg), store_host=broker_addr(producer, r.queue),
                     store_time=began_ms + cost // 2, body_length=len(msg.body), msg_type=msg_type)
    d.append(TraceContext(TraceType.Pub, began_ms, r.region_id or DEFAULT_REGION, producer.group,
                          cost, r.status is SendStatus.SEND_OK, trace_beans=[bean]))


def end_transaction(d: TraceDispatcher, producer: "AsyncProducer", msg: Message | MessageExt,
                    msg_id: str, state: str, from_check: bool, store_host: str) -> None:
    """EndTransactionTraceHookImpl: the EndTransaction record of an END_TRANSACTION
    (``state``: LocalTransactionState's name) sent to the broker at ``store_host``."""
    bean = TraceBean(topic=msg.topic, msg_id=msg_id, tags=msg.tags, keys=_keys(msg),
                     store_host=store_host, client_host=producer.instance.client_id,
                     msg_type=MessageType.Trans_msg_Commit, transaction_state=state,
                     transaction_id=msg_id, from_transaction_check=from_check)
    region = msg.properties.get("MSG_REGION") or DEFAULT_REGION
    d.append(TraceContext(TraceType.EndTransaction, region_id=region, group_name=producer.group,
                          trace_beans=[bean]))


def broker_addr(producer: "AsyncProducer", q: MessageQueue) -> str:
    """The address of ``q``'s master as the route names it (TCP, as Java's
    brokerAddr: not the Unix socket a send may have gone over)."""
    route = producer.instance.routes.get(q.topic) if producer.instance is not None else None
    return route.broker_addrs.get(q.broker_name, {}).get(MASTER_ID, "") if route else ""


def _keys(msg: Message | MessageExt) -> str | None:
    """getKeys(): the KEYS property, keys joined by spaces; None without keys."""
    keys = msg.keys
    return (keys if isinstance(keys, str) else " ".join(keys)) if keys else None


def sub_before(d: TraceDispatcher, group: str, msgs: list[MessageExt]) -> TraceContext:
    """ConsumeMessageTraceHookImpl.consumeMessageBefore: the batch's SubBefore
    context (queued if it has a bean); ``sub_after`` takes it."""
    ctx = TraceContext(TraceType.SubBefore, group_name=group, request_id=unique_ids.next(),
                       region_id=None)
    for m in msgs:
        props = m.properties
        if props.get("TRACE_ON") == "false":
            continue
        ctx.region_id = props.get("MSG_REGION")
        ctx.trace_beans.append(TraceBean(topic=m.topic, msg_id=m.msg_id, tags=m.tags, keys=m.keys,
                                         store_time=m.store_timestamp, body_length=m.store_size,
                                         retry_times=m.reconsume_times))
    if ctx.trace_beans:
        ctx.time_stamp = int(time.time() * 1000)
        d.append(ctx)
    return ctx


def _succeeded(status: Any) -> bool:
    return status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS or status is ConsumeOrderlyStatus.SUCCESS


def sub_after(d: TraceDispatcher, before: TraceContext, batch: int, status: Any,
              raised: bool) -> None:
    """consumeMessageAfter: the SubAfter records of ``before``'s batch of
    ``batch`` messages, given the listener's ``status`` (None: it returned
    nothing, or ``raised``); the return type as the consume services judge it."""
    if not before.trace_beans:
        return
    cost = int(time.time() * 1000) - before.time_stamp
    if status is None:
        rtype = ConsumeReturnType.EXCEPTION if raised else ConsumeReturnType.RETURNNULL
    elif cost >= CONSUME_TIMEOUT_MS:
        rtype = ConsumeReturnType.TIME_OUT
    elif _succeeded(status):
        rtype = ConsumeReturnType.SUCCESS
    else:
        rtype = ConsumeReturnType.FAILED
    d.append(TraceContext(TraceType.SubAfter, region_id=before.region_id,
                          group_name=before.group_name, cost_time=cost // batch,
                          success=_succeeded(status), request_id=before.request_id,
                          context_code=int(rtype), trace_beans=before.trace_beans))


__all__ = ["TraceDispatcher", "broker_addr", "end_transaction", "pub", "sub_after", "sub_before",
           "trace_topic"]
