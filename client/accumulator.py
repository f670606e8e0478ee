"""The producer's send window and its accumulator (Kafka's RecordAccumulator).

``Window`` bounds the sends of one producer that are waiting for their
answer (``max_in_flight``): a send past it waits, and a freed slot is handed
to the oldest waiter, so nobody starves and the count never overshoots.

``Accumulator`` (on when ``linger_ms`` > 0) turns single ``send`` calls into
SEND_BATCH_MESSAGE requests. It owns the open batches, one per queue; each
holds the messages' encoded batch entries and one future per caller. A
batch leaves when

- the next message would take it past ``batch_max_bytes`` (or it is exactly
  full),
- ``linger_ms`` have passed since its first message,
- half the window's slots are held by messages waiting in batches:
  waiting longer could add at most the other half (the window is the
  limit, not the clock), and sending now lets the broker store one half
  while the callers of the other refill the next batch (two batches in
  flight, as double buffering), or
- a send is waiting for a slot and every slot taken is held by a message
  waiting in a batch: nothing else would free one. (While some slots are
  held by sends still on their way in — a route lookup, a request on the
  wire — the batches keep filling: flushing at every message then would
  send batches of one.)
- the producer flushes (``flush()``, ``shutdown()``, or a message for the same
  queue that goes alone: it must not overtake the batch).

A batch of one goes as a plain SEND_MESSAGE_V2. A message not chosen for a
queue sticks to the queue of the topic's open batch (Kafka's sticky
partitioner) and the next batch takes the next queue, round robin. The
reply names the first message's queue offset and every message's offsetMsgId
(comma-joined, RocketMQ's batch answer): each caller gets a ``SendResult``
of its own message (its UNIQ_KEY, its offsetMsgId, first offset + its index).

Never batched (``takes``): delay levels, timer and transaction properties,
messages asking not to wait for the store (WAIT=false), retry-topic sends,
bodies that would be compressed (a batch is never compressed, as in
RocketMQ), and messages whose entry alone is over ``batch_max_bytes``.

Invariant: frames for one queue leave in the order their batches closed: a
batch is written when it leaves if its broker's connection is open (in the
caller's loop turn); otherwise it queues behind the one task that opens the
connection, which writes them all in order, before anything else can use
it. Only a failed batch of a queue the producer chose is retried, whole, on
another queue (``retry_times_when_send_failed``).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import TYPE_CHECKING

from .connection import RemotingError
from .instance import MQClientError
from .message import Message, MessageQueue
from .requests import batch_entry

if TYPE_CHECKING:
    from .producer import AsyncProducer

log = logging.getLogger("shmq.client")
RETRY_PREFIX = "%RETRY%"
# properties that make the broker route a message (delay, timer, transaction) or
# that a batch cannot carry per message (WAIT: the batch waits or not as one)
_ALONE = ("DELAY", "TRAN_MSG", "__STARTDELIVERTIME", "WAIT")


class Window:
    """At most ``size`` sends in flight; ``try_take`` or ``await wait()``, then
    ``release`` exactly once."""

    __slots__ = ("size", "used", "_waiters")

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"max_in_flight {size}: at least 1")
        self.size, self.used = size, 0
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    def try_take(self) -> bool:
        if self.used < self.size:
            self.used += 1
            return True
        return False

    @property
    def has_waiters(self) -> bool:
        return bool(self._waiters)

    async def wait(self) -> None:
        """Wait for a slot: ``release`` hands it over (``used`` already counts it)."""
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()               # handed over, then cancelled: pass it on
            raise

    def release(self) -> None:
        waiters = self._waiters
        while waiters:
            w = waiters.popleft()
            if not w.done():
                w.set_result(None)
                return
        self.used -= 1


class Batch:
    __slots__ = ("queue", "fixed", "entries", "uniqs", "futures", "size", "first", "deadline",
                 "timer")

    def __init__(self, queue: MessageQueue, fixed: bool, deadline: float):
        self.queue, self.fixed, self.deadline = queue, fixed, deadline
        self.entries: list[bytes] = []
        self.uniqs: list[str] = []
        self.futures: list[asyncio.Future] = []
        self.size = 0
        self.first: tuple[Message, str] | None = None      # sent alone if the batch stays at one
        self.timer: asyncio.TimerHandle | None = None


class Accumulator:
    def __init__(self, producer: "AsyncProducer"):
        self.p = producer
        self.window = producer.window
        cfg = producer.config
        if cfg.batch_max_bytes < 1:
            raise ValueError(f"batch_max_bytes {cfg.batch_max_bytes}: at least 1")
        self.linger_s = cfg.linger_ms / 1000
        self.max_bytes = cfg.batch_max_bytes
        self.batches: dict[MessageQueue, Batch] = {}
        self.sticky: dict[str, Batch] = {}              # topic → its open batch, queue not chosen
        self.lingering = 0                              # messages in open batches
        self.flush_at = max(1, self.window.size // 2)  # lingering messages that send every batch
        self.requests = 0                               # SEND_BATCH_MESSAGE requests sent
        self._deliveries: set[asyncio.Task] = set()
        self._unconnected: dict[str, list[Batch]] = {}  # broker name → batches waiting to connect

    def takes(self, msg: Message) -> bool:
        """May ``msg`` share a request with others?"""
        if msg.delay_level > 0 or len(msg.body) > self.p.config.compress_msg_body_over_howmuch \
                or msg.topic.startswith(RETRY_PREFIX):
            return False
        props = msg.properties
        return not props or not any(k in _ALONE or k.startswith("TIMER_") for k in props)

    def add(self, msg: Message, uniq: str, queue: MessageQueue | None,
            queues: list[MessageQueue], deadline: float) -> asyncio.Future | None:
        """Put ``msg`` in its queue's batch (the caller holds a window slot for
        it); the future gets its own SendResult. None: it must go alone (its
        entry is over ``batch_max_bytes``), after the queue's open batch."""
        props = msg.properties_string(uniq)
        entry = batch_entry(msg.body, props.encode(), msg.flag)
        n = len(entry)
        if n > self.max_bytes:
            if queue is not None:
                self.flush_queue(queue)
            return None
        b = self.batches.get(queue) if queue is not None else self.sticky.get(msg.topic)
        if b is not None and b.size + n > self.max_bytes:
            self._flush(b)
            b = None
        loop = asyncio.get_running_loop()
        if b is None:
            q = queue if queue is not None else self.p.pick(queues)
            b = self.batches.get(q)               # a batch for a chosen queue open there: join it
            if b is not None and b.size + n > self.max_bytes:
                self._flush(b)
                b = None
            if b is None:
                b = self.batches[q] = Batch(q, queue is not None, deadline)
                b.first = (msg, props)
                b.timer = loop.call_later(self.linger_s, self._flush, b)
            if queue is None:
                self.sticky[msg.topic] = b
        fut = loop.create_future()
        b.entries.append(entry)
        b.uniqs.append(uniq)
        b.futures.append(fut)
        b.size += n
        self.lingering += 1
        if b.size >= self.max_bytes:
            self._flush(b)
        elif self.lingering >= self.flush_at or (self.window.has_waiters
                                                 and self.lingering >= self.window.used):
            self.flush()                  # see the module's header
        return fut

    def flush(self) -> None:
        """Send every open batch now."""
        for b in list(self.batches.values()):
            self._flush(b)

    def flush_queue(self, q: MessageQueue, conn=None) -> None:
        """Send ``q``'s open batch now, and with ``conn`` (q's broker's open
        connection) any batch still waiting for it: a message for ``q`` that
        goes alone must not overtake them."""
        if conn is not None and self._unconnected.get(q.broker_name):
            self._send_waiting(q.broker_name, conn)
        b = self.batches.get(q)
        if b is not None:
            self._flush(b)

    async def drain(self) -> None:
        """Flush, and wait until every batch sent has its answer."""
        self.flush()
        while self._deliveries:
            await asyncio.gather(*self._deliveries, return_exceptions=True)

    def _flush(self, b: Batch) -> None:
        q = b.queue
        if self.batches.get(q) is not b:
            return                                         # gone already
        del self.batches[q]
        if self.sticky.get(q.topic) is b:
            del self.sticky[q.topic]                       # the next batch takes the next queue
        b.timer.cancel()
        self.lingering -= len(b.futures)
        name = q.broker_name
        conn = self.p.instance.broker_now(name) if self.p.instance is not None else None
        waiting = self._unconnected.get(name)
        if conn is None:                  # one task opens the connection; batches queue behind it
            if waiting is None:
                self._unconnected[name] = [b]
                self._spawn(self._connect(name))
            else:
                waiting.append(b)
            return
        if waiting:
            self._send_waiting(name, conn)
        self._send(b, conn)

    def _send(self, b: Batch, conn) -> None:
        """Write ``b`` now (frames of a queue leave in the order batches close)
        and hand its answer to a delivery task."""
        left = b.deadline - time.monotonic()
        fut = self._write(conn, b, b.queue, left) if left > 0 else None
        self._spawn(self._deliver(b, fut))

    def _send_waiting(self, name: str, conn) -> None:
        for b in self._unconnected.pop(name, ()):
            self._send(b, conn)

    async def _connect(self, name: str) -> None:
        try:
            conn = await self.p.instance.broker(name)
        except Exception as e:                     # every waiting caller gets it; not swallowed
            for b in self._unconnected.pop(name, ()):
                for f in b.futures:
                    if not f.done():
                        f.set_exception(e)
            if not isinstance(e, (RemotingError, MQClientError)):
                raise
            return
        self._send_waiting(name, conn)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    def _write(self, conn, b: Batch, q: MessageQueue, timeout: float) -> asyncio.Future:
        if len(b.futures) == 1:
            msg, props = b.first
            return self.p.write_send(conn, q, msg, props, timeout)
        self.requests += 1
        return self.p.write_batch(conn, q, b.entries, timeout)

    async def _deliver(self, b: Batch, fut: asyncio.Future | None) -> None:
        p = self.p
        q = b.queue
        tries = 1 if b.fixed else 1 + p.config.retry_times_when_send_failed
        last: Exception | None = None
        try:
            for attempt in range(tries):
                if fut is None:
                    left = b.deadline - time.monotonic()
                    if left <= 0:
                        break
                    if attempt:
                        q = p.pick(await p.publish_queues(q.topic))
                    fut = self._write(await p.instance.broker(q.broker_name), b, q, left)
                try:
                    results = p.results(await fut, q, b.uniqs)
                except RemotingError as e:
                    last = e
                except MQClientError as e:
                    if e.code not in p.retry_codes:
                        raise
                    last = e
                else:
                    p.failed_broker = None
                    for f, r in zip(b.futures, results):
                        if not f.done():
                            f.set_result(r)
                    return
                fut = None
                p.failed_broker = q.broker_name
                log.info("batch of %d to %s failed (%s)%s", len(b.futures), q, last,
                         "" if attempt + 1 == tries else "; trying another queue")
            raise last or MQClientError(-1, "the batch's send timeout passed before it was sent")
        except asyncio.CancelledError:
            for f in b.futures:
                f.cancel()
            raise
        except Exception as e:               # every caller gets it; not swallowed
            for f in b.futures:
                if not f.done():
                    f.set_exception(e)
            if not isinstance(e, (RemotingError, MQClientError)):
                raise
