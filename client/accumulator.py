"""The producer's send window and its accumulator (Kafka's RecordAccumulator).

``Window`` bounds the sends of one producer that are waiting for their
answer (``max_in_flight``): a send past it waits, and a freed slot is handed
to the oldest waiter, so nobody starves and the count never overshoots. A
new send does not take a free slot while anyone waits or a waiter that was
handed one has not resumed yet (``handed``): it would write (or append)
before those older sends, out of call order; a slot freed before a handed
waiter resumed goes to the next waiter when it does.

``Accumulator`` (on when ``linger_ms`` > 0) turns single ``send`` calls into
SEND_BATCH_MESSAGE requests. It owns the open batches, one per queue; each
is one growing buffer (its messages' batch entries, encoded there as they
come), its messages' UNIQ_KEYs and one future per caller. A batch leaves
when

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

Timeouts are each caller's own (``send(..., timeout=)``): a batch's request
waits as long as its latest caller's deadline (the caller's own call + its
timeout: one who joined a batch late has lost nothing to the lingering
before it came), and a caller whose deadline comes earlier gets its
timeout then, alone (the others wait on, the batch's retries included; as
for any send that timed out, its message may still be stored). Before its
request is written — its broker's connection still opening — every
caller, the latest included, gets its timeout at its own deadline. A caller
whose timeout is under twice ``linger_ms`` makes its batch leave by half
of it (``_hurry``, counted from its call), so that lingering never uses
up its time: Kafka requires delivery.timeout.ms >=
linger.ms + request.timeout.ms for the same reason, and as there a batch
is never failed for lingering past a deadline.

A batch of one goes as a plain SEND_MESSAGE_V2. A message not chosen for a
queue sticks to the queue of the topic's open batch (Kafka's sticky
partitioner) and the next batch takes the next queue, round robin. The
reply names the first message's queue offset and every message's offsetMsgId
(comma-joined, RocketMQ's batch answer): each caller gets a ``SendResult``
of its own message (its UNIQ_KEY, its offsetMsgId, first offset + its index).

What a message costs (``offer``, the send path's fast lane, taken when the
message is plain — no user properties, no delay — its topic's route is
cached and a window slot is free): a UNIQ_KEY, its entry appended to the
batch's buffer (the 20-byte entry head of a body length made once, the
properties of a message without tags or keys are ``UNIQ_KEY`` alone), one
future, and no awaiting before the caller's own ``await``. Nothing per
message happens when the batch leaves (one ``write_batch`` of the buffer)
and when its answer comes (a done callback of the request's future, no
task): the callback builds each ``SendResult``, resolves the callers'
futures and frees the batch's window slots at once. A task is started only
for a batch that must wait for its broker's connection to open or that
failed and is retried.

Never batched (``takes``): delay levels, timer and transaction properties,
messages asking not to wait for the store (WAIT=false), retry-topic sends,
bodies that would be compressed (a batch is never compressed, as in
RocketMQ), and messages whose entry alone is over ``batch_max_bytes``.

Invariant: frames for one queue leave in the order their batches closed: a
batch is written when it leaves if its broker's connection is open (in the
caller's loop turn); otherwise it queues behind the one task that opens the
connection, which writes them all in order, before anything else can use
it. Only a failed batch of a queue the producer chose is retried, whole, on
another queue (``retry_times_when_send_failed``); a batch a message with a
chosen queue joined is that queue's for good, whoever opened it. Once
``shutdown()`` begins no message joins a batch (the send is refused,
RocketMQ's "service state not OK"), and a batch that leaves after it fails
its callers: no caller waits for a batch nothing would send. A batch holds one window
slot per message from the message's ``add`` until its answer (or its last
failure) settles every caller: a cancelled caller's slot is freed then.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import logging
import math
import struct
import time
from threading import get_ident
from typing import TYPE_CHECKING

from shmq.ipc.codes import ResponseCode as R

from . import instance
from .connection import RemotingError
from .instance import MQClientError
from .message import UNIQ_KEY, Message, MessageQueue, unique_ids

if TYPE_CHECKING:
    from .producer import AsyncProducer

log = logging.getLogger("shmq.client")
RETRY_PREFIX = "%RETRY%"
# properties that make the broker route a message (delay, timer, transaction) or
# that a batch cannot carry per message (WAIT: the batch waits or not as one)
_ALONE = ("DELAY", "TRAN_MSG", "__STARTDELIVERTIME", "WAIT")

# One message of a SEND_BATCH_MESSAGE body (reference §5.5)::
#
#     int32 total = 20 + body + 2 + props | int32 magic (0) | int32 body CRC (0)
#     int32 flag | int32 body length | body | int16 props length | props
_ENTRY = struct.Struct(">iiiii")
_I16 = struct.Struct(">h")
_UNIQ_BYTES = len(UNIQ_KEY) + 1 + 32    # a plain message's properties: UNIQ_KEY \x01 32 hex digits
_UNIQ_ONLY = _I16.pack(_UNIQ_BYTES) + f"{UNIQ_KEY}\x01".encode()     # what comes before the digits
_heads: dict[int, bytes] = {}          # body length → the entry head of a plain message (flag 0)
_INT32 = range(-1 << 31, 1 << 31)


def check_flag(flag: int) -> None:
    """A message's flag is an int32 on the wire (and in the store)."""
    if flag not in _INT32:
        raise MQClientError(R.MESSAGE_ILLEGAL, f"the message flag {flag} is out of int32 range")


def shut_down(group: str) -> MQClientError:
    """What a send to a producer that is shutting down gets (RocketMQ's
    \"The producer service state not OK\")."""
    return MQClientError(-1, f"the producer {group} is shut down: the producer service "
                             f"state not OK")


def append_entry(buf: bytearray, body: bytes, props: bytes, flag: int = 0) -> int:
    """Append one batch entry to ``buf``; its size."""
    n, m = len(body), len(props)
    buf += _ENTRY.pack(22 + n + m, 0, 0, flag, n)
    buf += body
    buf += _I16.pack(m)
    buf += props
    return 22 + n + m


def running_here(loop: asyncio.AbstractEventLoop) -> bool:
    """Is ``loop`` the event loop running in this thread? (What
    ``loop is asyncio.get_running_loop()`` says, without its getpid() system
    call on every call, which costs the send path 0.4-1.5 µs here: a
    BaseEventLoop knows the thread it runs in.)"""
    try:
        return loop._thread_id == get_ident()
    except AttributeError:                 # another loop implementation
        try:
            return loop is asyncio.get_running_loop()
        except RuntimeError:               # none runs in this thread
            return False


class Window:
    """At most ``size`` sends in flight; ``try_take`` or ``await wait()``, then
    ``release`` exactly once. Slots go in call order: a send takes a free
    slot only while nobody waits for one and no waiter handed one has
    resumed yet (it would go first); a slot freed, or found free when a
    handed waiter resumes, goes to the oldest waiter."""

    __slots__ = ("size", "used", "handed", "limit", "_waiters")

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"max_in_flight {size}: at least 1")
        self.size, self.used = size, 0
        self.handed = 0                    # slots handed to waiters that have not resumed yet
        # ``size`` while nobody waits and no slot is handed, else 0: ``used <
        # limit`` is try_take's whole test (the send path inlines it)
        self.limit = size
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    def try_take(self) -> bool:
        if self.used < self.limit:
            self.used += 1
            return True
        return False

    @property
    def has_waiters(self) -> bool:
        return bool(self._waiters)

    async def wait(self) -> None:
        """Wait for a slot: it is handed over (``used`` already counts it)."""
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self.limit = 0
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.handed -= 1
                self.release()               # handed over, then cancelled: pass it on
            else:        # (a release in the same turn may have dropped it already)
                if fut in self._waiters:
                    self._waiters.remove(fut)
                self._hand()
            raise
        self.handed -= 1
        self._hand()                         # a slot freed meanwhile is the next waiter's

    def release(self, n: int = 1) -> None:
        """Free ``n`` slots: each goes to the oldest waiter, if any."""
        self.used -= n
        self._hand()

    def _hand(self) -> None:
        """Free slots to the oldest waiters; ``limit`` again."""
        waiters = self._waiters
        while waiters and self.used < self.size:
            w = waiters.popleft()
            if not w.done():
                w.set_result(None)
                self.used += 1
                self.handed += 1
        self.limit = 0 if waiters or self.handed else self.size


class Batch:
    __slots__ = ("queue", "fixed", "buf", "uniqs", "futures", "deadlines", "first", "opened",
                 "leaves", "deadline", "timer", "expiry", "queues")

    def __init__(self, queue: MessageQueue, fixed: bool, opened: float):
        self.queue, self.fixed, self.opened = queue, fixed, opened
        self.buf = bytearray()                             # the encoded entries
        self.uniqs: list[str] = []
        self.futures: list[asyncio.Future] = []
        self.deadlines: list[float] = []                   # each caller's: its call + its timeout
        self.first: Message | None = None                  # sent alone if the batch stays at one
        self.leaves = 0.0                                  # when its timer sends it
        self.deadline = 0.0                                # its request's: the latest caller's
        self.timer: asyncio.TimerHandle | None = None
        self.expiry: asyncio.TimerHandle | None = None     # fails callers whose deadline is earlier
        self.queues: list[MessageQueue] = []               # the topic's, when it was opened

    def __len__(self) -> int:
        """Its messages."""
        return len(self.futures)


class Accumulator:
    def __init__(self, producer: "AsyncProducer"):
        self.p = producer
        self.window = producer.window
        cfg = producer.config
        if cfg.batch_max_bytes < 1:
            raise ValueError(f"batch_max_bytes {cfg.batch_max_bytes}: at least 1")
        # a batch's deadline is its first message's send timeout, and it
        # leaves linger_ms after that message: no batched send could succeed
        if cfg.linger_ms >= cfg.send_msg_timeout * 1000:
            raise ValueError(f"linger_ms {cfg.linger_ms} must be less than send_msg_timeout "
                             f"{cfg.send_msg_timeout} s ({cfg.send_msg_timeout * 1000:g} ms): a "
                             f"batch waits linger_ms before it is sent, so every batched send "
                             f"would time out")
        self.linger_s = cfg.linger_ms / 1000
        self.hurried = 2 * self.linger_s               # a timeout under this moves a batch's send up
        self.max_bytes = cfg.batch_max_bytes
        # a body offer() takes: not compressed, within max_message_size
        self.small = min(cfg.compress_msg_body_over_howmuch, cfg.max_message_size)
        self.batches: dict[MessageQueue, Batch] = {}
        self.sticky: dict[str, Batch] = {}              # topic → its open batch, queue not chosen
        self.lingering = 0                              # messages in open batches
        self.flush_at = max(1, self.window.size // 2)  # lingering messages that send every batch
        self.requests = 0                               # SEND_BATCH_MESSAGE requests sent
        self._inflight: set[asyncio.Future] = set()     # batches' answers and tasks not settled
        self._unconnected: dict[str, list[Batch]] = {}  # broker name → batches waiting to connect
        self.loop: asyncio.AbstractEventLoop | None = None  # the open batches' (their timers')

    def takes(self, msg: Message) -> bool:
        """May ``msg`` share a request with others?"""
        if msg.delay_level > 0 or len(msg.body) > self.p.config.compress_msg_body_over_howmuch \
                or msg.topic.startswith(RETRY_PREFIX):
            return False
        props = msg.properties
        return not props or not any(k in _ALONE or k.startswith("TIMER_") for k in props)

    def offer(self, msg: Message, timeout: float) -> asyncio.Future | None:
        """``send``'s fast lane: ``msg`` (no queue chosen) into its topic's
        batch, taking a window slot, when that needs no awaiting and no
        check the general path makes: a plain message of a topic whose name
        was checked and whose route is cached, a free slot, the producer's
        own loop and process. The future gets its SendResult; None: take
        the general path."""
        window = self.window
        p = self.p
        inst = p.instance
        body = msg.body
        if window.used >= window.limit or msg.properties or msg.delay_level \
                or inst is None or inst.pid != instance.PID or not running_here(inst.loop) \
                or body.__class__ is not bytes or not 0 < len(body) <= self.small:
            return None
        topic = msg.topic
        queues = None
        if topic not in self.sticky:         # a topic with an open batch passed these already
            if topic not in p._templates or topic.startswith(RETRY_PREFIX):
                return None
            queues = p._queues_now(topic)
            if queues is None:
                return None
        window.used += 1                                 # Window.try_take, inline (tested above)
        try:
            fut = self.add(msg, unique_ids.next(), None, queues, timeout)
        except BaseException:
            window.release()
            raise
        if fut is None:                                  # goes alone: the general path
            window.release()
        return fut

    def add(self, msg: Message, uniq: str, queue: MessageQueue | None,
            queues: list[MessageQueue] | None, timeout: float) -> asyncio.Future | None:
        """Put ``msg`` in its queue's batch (the caller holds a window slot
        for it, which the batch now owns); the future gets its own
        SendResult. None: it must go alone (its entry is over
        ``batch_max_bytes``), after the queue's open batch; the slot stays
        the caller's. ``queues``: the topic's, needed unless ``msg`` joins
        the topic's open batch."""
        inst = self.p.instance
        if inst is None or self.p.closing:
            raise shut_down(self.p.group)
        body = msg.body
        n = len(body)
        if msg.tags or msg.keys or msg.properties or msg.flag:
            if msg.flag:
                check_flag(msg.flag)
            props = msg.properties_string(uniq).encode()
            size = 22 + n + len(props)
        else:                                    # plain: its properties are UNIQ_KEY alone
            props = None
            size = 22 + n + _UNIQ_BYTES
        if size > self.max_bytes:
            if queue is not None:
                self.flush_queue(queue)
            return None
        b = self.batches.get(queue) if queue is not None else self.sticky.get(msg.topic)
        if b is not None and len(b.buf) + size > self.max_bytes:
            self._flush(b)
            if queues is None:                  # the route the full one was picked from
                queues = self.p._queues_now(msg.topic) or b.queues
            b = None
        if b is None:
            b = self._open(msg, queue, queues, size, timeout)
        if queue is not None:
            b.fixed = True                    # its chosen-queue message never moves elsewhere
        buf = b.buf
        if props is None:
            head = _heads.get(n)
            if head is None:
                head = _heads[n] = _ENTRY.pack(size, 0, 0, 0, n)
            buf += head
            buf += body
            buf += _UNIQ_ONLY
            buf += uniq.encode()
        else:
            append_entry(buf, body, props, msg.flag)
        if not b.futures:
            b.first = msg                     # in the batch now: sent alone if it stays at one
        fut = inst.loop.create_future()
        b.futures.append(fut)
        b.uniqs.append(uniq)
        now = time.monotonic()
        b.deadlines.append(now + timeout)
        if timeout < self.hurried:
            self._hurry(b, now, timeout)
        self.lingering += 1
        if len(buf) >= self.max_bytes:
            self._flush(b)
        elif self.lingering >= self.flush_at or (self.window._waiters
                                                 and self.lingering >= self.window.used):
            self.flush()                  # see the module's header
        return fut

    def _open(self, msg: Message, queue: MessageQueue | None, queues: list[MessageQueue],
              size: int, timeout: float) -> Batch:
        """The batch ``msg`` joins: its chosen queue's, else (a new sticky
        batch) the next queue's, or a batch for that queue open there."""
        q = queue if queue is not None else self.p.pick(queues)
        b = self.batches.get(q)
        if b is not None and len(b.buf) + size > self.max_bytes:
            self._flush(b)
            b = None
        if b is None:
            b = self.batches[q] = Batch(q, queue is not None, time.monotonic())
            b.queues = queues
            b.leaves = b.opened + self.linger_s
            self.loop = loop = self.p.instance.loop
            b.timer = loop.call_later(self.linger_s, self._flush, b)
        if queue is None:
            self.sticky[msg.topic] = b
        return b

    def _hurry(self, b: Batch, now: float, timeout: float) -> None:
        """A caller (sending at ``now``) whose ``timeout`` is short beside the
        linger: ``b`` leaves by half of it, so its answer has the other half
        (Kafka refuses a delivery.timeout.ms under linger.ms +
        request.timeout.ms for the same reason: waiting in a batch must not
        use up a send's time)."""
        leaves = now + timeout / 2
        if leaves < b.leaves:
            b.leaves = leaves
            b.timer.cancel()
            b.timer = self.loop.call_later(leaves - now, self._flush, b)

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
        while self._inflight:                     # asyncio.wait: a cancelled drain cancels none
            await asyncio.wait(list(self._inflight))

    def _flush(self, b: Batch) -> None:
        q = b.queue
        if self.batches.get(q) is not b:
            return                                         # gone already
        del self.batches[q]
        if self.sticky.get(q.topic) is b:
            del self.sticky[q.topic]                       # the next batch takes the next queue
        b.timer.cancel()
        if not b.futures:
            return                         # nothing joined it
        self.lingering -= len(b.futures)
        inst = self.p.instance
        if inst is None:                   # shut down (its callers came after shutdown's flush)
            self._settle(b, shut_down(self.p.group))
            return
        name = q.broker_name
        conn = inst.broker_now(name)
        waiting = self._unconnected.get(name)
        if conn is None:                  # one task opens the connection; batches queue behind it
            # each caller gets its timeout at its own deadline meanwhile
            # (an opening connection may take several request timeouts)
            self._expire(b, connecting=True)
            if waiting is None:
                self._spawn(self._connect(name))
                self._unconnected[name] = [b]     # only once the task that sends them exists
            else:
                waiting.append(b)
            return
        if waiting:
            self._send_waiting(name, conn)
        self._send(b, conn)

    def _send(self, b: Batch, conn) -> None:
        """Write ``b`` now (frames of a queue leave in the order batches close);
        its answer settles it in ``_answered``. The request waits as long as
        the latest caller's deadline; a caller whose deadline is earlier
        gets its timeout then (``_expire``), alone."""
        if b.expiry is not None:           # armed while its connection opened
            b.expiry.cancel()
            b.expiry = None
        deadlines = b.deadlines
        b.deadline = max(deadlines)
        now = time.monotonic()
        left = b.deadline - now
        if left <= 0:
            self._settle(b, MQClientError(-1, "the batch's send timeout passed before it was sent"))
            return
        if min(deadlines) < b.deadline:
            self._expire(b)
        try:
            fut = self._write(conn, b, b.queue, left)
        except RemotingError as e:                         # closed meanwhile: retried as any failure
            self._failed(b, e)
            return
        self._inflight.add(fut)
        fut.add_done_callback(functools.partial(self._answered, b))

    def _expire(self, b: Batch, connecting: bool = False) -> None:
        """Fail the callers of ``b`` whose deadline has passed (a timeout of
        their own, as a send alone gets it: the message may still be
        stored); again at the next earlier deadline than the batch's (its
        request waits as long as the latest), or, ``connecting`` (no request
        yet: its broker's connection opens), at the next deadline whatever
        it is."""
        now = time.monotonic()
        limit = nxt = math.inf if connecting else b.deadline
        for f, d in zip(b.futures, b.deadlines):
            if f.done():
                continue
            if d <= now:
                f.set_exception(RemotingError(
                    f"no reply to the send within its timeout (its batch of {len(b.futures)} "
                    f"to {b.queue} is still waiting"
                    f"{f' for the connection to {b.queue.broker_name}' if connecting else ''})"))
            elif d < nxt:
                nxt = d
        b.expiry = self.loop.call_later(nxt - now, self._expire, b, connecting) if nxt < limit else None

    def _send_waiting(self, name: str, conn) -> None:
        for b in self._unconnected.pop(name, ()):
            self._send(b, conn)

    async def _connect(self, name: str) -> None:
        try:
            inst = self.p.instance
            if inst is None:
                raise shut_down(self.p.group)
            conn = await inst.broker(name)
        except Exception as e:                     # every waiting caller gets it; not swallowed
            for b in self._unconnected.pop(name, ()):
                self._settle(b, e)
            if not isinstance(e, (RemotingError, MQClientError)):
                raise
            return
        self._send_waiting(name, conn)

    def _spawn(self, coro) -> None:
        task = self.loop.create_task(coro)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    def _write(self, conn, b: Batch, q: MessageQueue, timeout: float) -> asyncio.Future:
        if len(b.futures) == 1:
            msg, uniq = b.first, b.uniqs[0]
            return self.p.write_send(conn, q, msg, msg.properties_string(uniq), timeout)
        self.requests += 1
        return self.p.write_batch(conn, q, b, timeout)

    def _answered(self, b: Batch, fut: asyncio.Future) -> None:
        """The answer to ``b``'s request: every caller's SendResult, or a
        failure, retried on another queue where the module's header says."""
        self._inflight.discard(fut)
        if b.expiry is not None:
            b.expiry.cancel()
        if fut.cancelled():
            self._settle(b, asyncio.CancelledError())
            return
        error = fut.exception()
        if error is None:
            try:
                results = self.p.results(fut.result(), b.queue, b.uniqs)
            except Exception as e:                         # noqa: BLE001 (_failed tells)
                error = e
            else:
                self.p.failed_broker = None
                for f, r in zip(b.futures, results):
                    if not f.done():
                        f.set_result(r)
                self.window.release(len(b.futures))
                return
        self._failed(b, error)

    def _failed(self, b: Batch, error: BaseException) -> None:
        p = self.p
        retry = isinstance(error, RemotingError) or (isinstance(error, MQClientError)
                                                     and error.code in p.retry_codes)
        if not retry:
            self._settle(b, error)
            if not isinstance(error, (MQClientError, asyncio.CancelledError)):
                log.error("the answer to a batch of %d to %s: a bug", len(b.futures), b.queue,
                          exc_info=error)
            return
        p.failed_broker = b.queue.broker_name
        tries = 1 if b.fixed else 1 + p.config.retry_times_when_send_failed
        log.info("batch of %d to %s failed (%s)%s", len(b.futures), b.queue, error,
                 "" if tries == 1 else "; trying another queue")
        if tries == 1:
            self._settle(b, error)
        else:
            self._spawn(self._retry(b, tries - 1, error))

    async def _retry(self, b: Batch, tries: int, last: Exception) -> None:
        """``b`` again on other queues (a failed batch of a queue the producer
        chose), up to ``tries`` more times, within its deadline."""
        p = self.p
        try:
            for attempt in range(tries):
                left = b.deadline - time.monotonic()
                if left <= 0:
                    break
                if b.expiry is not None:
                    b.expiry.cancel()
                self._expire(b)            # a caller whose deadline is earlier still gets it then
                q = b.queue = p.pick(await p.publish_queues(b.queue.topic))
                try:
                    results = p.results(await self._write(await p.instance.broker(q.broker_name),
                                                          b, q, left), q, b.uniqs)
                except RemotingError as e:
                    last = e
                except MQClientError as e:
                    if e.code not in p.retry_codes:
                        raise
                    last = e
                else:
                    p.failed_broker = None
                    if b.expiry is not None:
                        b.expiry.cancel()
                    for f, r in zip(b.futures, results):
                        if not f.done():
                            f.set_result(r)
                    self.window.release(len(b.futures))
                    return
                p.failed_broker = q.broker_name
                log.info("batch of %d to %s failed (%s)%s", len(b.futures), q, last,
                         "" if attempt + 1 == tries else "; trying another queue")
            raise last
        except BaseException as e:           # every caller gets it; not swallowed
            self._settle(b, e)
            if not isinstance(e, (RemotingError, MQClientError)):
                raise

    def _settle(self, b: Batch, error: BaseException) -> None:
        """``b`` failed for good: every caller gets ``error``; its slots are free."""
        if b.expiry is not None:
            b.expiry.cancel()
        cancelled = isinstance(error, asyncio.CancelledError)
        for f in b.futures:
            if not f.done():
                if cancelled:
                    f.cancel()
                else:
                    f.set_exception(error)
        self.window.release(len(b.futures))
