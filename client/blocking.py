"""The blocking facade: the asyncio client driven from ordinary threads.

Each process gets one event loop in a daemon thread (a new one after a
fork: the child never touches its parent's loop or sockets, and a
``Producer``'s puts buffered in the parent are not the child's). ``Producer``,
``TransactionProducer`` and the consumers wrap their asyncio twins; every
call runs on that loop and waits for its result — but ``Producer.send`` to
a broker whose store this process appends to, which appends in the calling
thread (``AsyncProducer.send_here``).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import threading
import weakref
from typing import Any, Callable

from .message import Message, MessageQueue, SendResult
from .producer import (_ENTRY_BYTES, AsyncProducer, AsyncTransactionProducer, FlushResult,
                       Selector, TransactionListener, TransactionSendResult, _PutBuffer,
                       put_properties)

_PUT_CHUNKS = 4            # Producer.put: chunks handed to the loop and not yet stored, at most


class LoopThread:
    def __init__(self):
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="shmq-client",
                                       daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


_loop: LoopThread | None = None
_lock = threading.Lock()
_producers: "weakref.WeakSet[Producer]" = weakref.WeakSet()


def _forked() -> None:
    """In a forked child: locks another thread of the parent may have held
    at the fork are new, and each ``Producer``'s puts are the parent's
    (AsyncProducer's own hook resets the rest)."""
    global _lock
    _lock = threading.Lock()
    for p in list(_producers):
        p._put_init()


os.register_at_fork(after_in_child=_forked)


def loop_thread() -> LoopThread:
    """This process's client loop (started on first use, again after a fork)."""
    global _loop
    with _lock:
        if _loop is None or _loop.pid != os.getpid():
            _loop = LoopThread()
        return _loop


class _Blocking:
    """The facade of one asyncio client object (``self._p``): each call runs
    on the client loop and waits."""

    def _run(self, coro):
        return loop_thread().run(coro)

    def start(self):
        self._run(self._p.start())
        return self

    def shutdown(self) -> None:
        self._run(self._p.shutdown())

    @property
    def tracer(self):
        """The trace dispatcher (``enable_msg_trace``; None when off): its
        ``discarded`` counts the records a full queue dropped. A producer's
        and a push consumer's; None for the lite pull consumer, which
        records no traces."""
        return getattr(self._p, "tracer", None)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()


class Producer(_Blocking):
    """DefaultMQProducer: ``start()``, ``send()``, ``send_async()``,
    ``send_oneway()``, ``send_batch()``, ``shutdown()``; and ``put()`` /
    ``flush()`` (below).

    ``put`` gathers messages in the calling thread (a trip to the client's
    loop thread would cost ~10 µs a call), one buffer per topic under a
    lock, and hands each full buffer (``put_batch_bytes``) to the loop,
    which stores it as ``AsyncProducer.put``'s chunks; a partly filled one
    is handed over by the loop after ``put_linger_ms``. At most
    ``_PUT_CHUNKS`` chunks are on their way: a put that hands over one
    more waits until one is done with (each is stored or fails within its
    send timeout)."""

    def __init__(self, group: str, **settings):
        self._p = AsyncProducer(group, **settings)
        self._put_init()

    def _put_init(self) -> None:
        """The puts' state: new, and again in a forked child (``_forked``)."""
        _producers.add(self)
        self._put_lock = threading.Lock()
        self._put_bufs: dict[str, _PutBuffer] = {}
        self._put_slots = threading.Semaphore(_PUT_CHUNKS)
        self._async_out = 0          # send_async calls not answered yet (``send``'s lane waits)

    def _async_done(self, _fut) -> None:
        with self._put_lock:
            self._async_out -= 1

    def put(self, topic: str, body: bytes, tags: str | None = None,
            keys: str | list[str] | None = None) -> None:
        """``AsyncProducer.put`` from any thread: returns before the message
        is stored; ``flush()`` is the acknowledgement (RocketMQ's
        ``sendOneway``, except that ``flush`` tells what became of them)."""
        p = self._p
        if p._put_error is not None:
            raise p._put_failed()
        if body.__class__ is not bytes or not 0 < len(body) <= p._put_max:
            raise p._put_refused(body)
        props = "" if tags is None and keys is None else put_properties(tags, keys)
        handed = False
        with self._put_lock:
            b = self._put_bufs.get(topic)
            if b is None:
                p._template(topic)                       # the name checked once
                b = self._put_bufs[topic] = _PutBuffer(topic)
            if b.nbytes >= p._put_budget:
                handed = self._put_hand(b)
            if b.timer is None:                          # the loop hands it over after the linger
                b.timer = lt = loop_thread()
                lt.loop.call_soon_threadsafe(lt.loop.call_later, p._put_linger,
                                             self._put_lingered, b, b.bodies)
            if props and not b.tagged:                   # "" for those before (AsyncProducer.put)
                b.props = [""] * len(b.bodies)
                b.tagged = True
            if b.tagged:
                b.props.append(props)
            b.bodies.append(body)
            b.nbytes += len(body) + _ENTRY_BYTES + len(props)
        if handed:
            self._put_slot()

    def _put_hand(self, b: _PutBuffer, counted: bool = True) -> bool:
        """Under the lock: ``b``'s messages to the loop as one chunk, ``b``
        emptied. Chunks reach the loop in the order they were taken (one
        ready queue, appended under this lock): the order within a queue."""
        if not b.bodies:
            return False
        chunk = (b.bodies, b.props if b.tagged else "", b.nbytes)
        b.bodies, b.props, b.tagged, b.nbytes, b.timer = [], [], False, 0, None
        loop_thread().loop.call_soon_threadsafe(self._p._put_handoff, b.topic, *chunk,
                                                self._put_slots.release if counted else None)
        return counted

    def _put_slot(self) -> None:
        """After handing a chunk over: wait while more than ``_PUT_CHUNKS``
        are on their way (the loop releases a slot per chunk done with:
        stored, or failed within its send or flush timeout)."""
        self._put_slots.acquire()

    def _put_lingered(self, b: _PutBuffer, bodies: list) -> None:
        """On the loop: ``b``'s linger is over; hand it over unless it was
        already (its list is another)."""
        with self._put_lock:
            if b.bodies is bodies:
                self._put_hand(b, counted=False)

    def flush(self) -> FlushResult:
        """Hand over what ``put`` holds and wait until every earlier put is
        stored (``AsyncProducer.flush``: the counts, or ``PutFailed``); also
        sends what the accumulator holds (``linger_ms`` > 0) and waits for it."""
        self._put_hand_all()
        return self._run(self._p.flush())

    def shutdown(self) -> None:
        """``flush()``, then ``AsyncProducer.shutdown`` (``PutFailed`` after it).
        Called in the main thread, it puts the application's SIGINT handler
        back where ``send``'s appends there wrapped it (client/direct.py
        ``_SigintGuard``: the store closes in the loop's thread, which
        cannot; a later ``asyncio.run`` then skipped its own Ctrl-C
        handler). A store of another producer wraps it again at its next
        append in the main thread."""
        self._put_hand_all()
        try:
            self._run(self._p.shutdown())
        finally:
            direct = sys.modules.get("shmq.client.direct")
            if direct is not None:
                direct.release_sigint_guard()

    def _put_hand_all(self) -> None:
        with self._put_lock:
            for b in self._put_bufs.values():
                self._put_hand(b, counted=False)

    def send(self, msg: Message, queue: MessageQueue | None = None,
             selector: Selector | None = None, arg: Any = None,
             timeout: float | None = None) -> SendResult:
        """Send and wait for the result. To a broker on this host whose store
        is attached (client/direct.py), appended by the calling thread
        (``AsyncProducer.send_here``), without a round trip through the
        client's loop thread — unless a ``send_async`` of this producer is
        still unanswered: the loop stores this one after it, in call order."""
        if not self._async_out:
            r, queue = self._p.send_here(msg, queue, selector, arg)
            if r is not None:
                return r
            selector = None if queue is not None else selector
        return self._run(self._p.send(msg, queue, selector, arg, timeout))

    def send_async(self, msg: Message,
                   callback: Callable[[SendResult | None, Exception | None], Any] | None = None,
                   queue: MessageQueue | None = None) -> concurrent.futures.Future:
        """Returns at once; the future (and ``callback(result, error)``, run on
        the client's thread) completes when the broker answers."""
        with self._put_lock:
            self._async_out += 1
        fut = loop_thread().submit(self._p.send(msg, queue))
        fut.add_done_callback(self._async_done)
        if callback is not None:
            fut.add_done_callback(lambda f: callback(None if f.exception() else f.result(),
                                                     f.exception()))
        return fut

    def send_oneway(self, msg: Message, queue: MessageQueue | None = None) -> None:
        self._run(self._p.send_oneway(msg, queue))

    def send_many(self, topic: str, bodies, *, tags: str | None = None,
                  queue: MessageQueue | None = None, timeout: float | None = None,
                  lengths=None) -> list:
        """``AsyncProducer.send_many``: many bodies (a sequence, a 2-D array,
        or one buffer with ``lengths``), one queue, few calls."""
        return self._run(self._p.send_many(topic, bodies, tags=tags, queue=queue,
                                           timeout=timeout, lengths=lengths))

    def send_batch(self, msgs: list[Message], queue: MessageQueue | None = None) -> SendResult:
        return self._run(self._p.send_batch(msgs, queue))


class TransactionProducer(Producer):
    """TransactionMQProducer: ``send_message_in_transaction(msg, arg)``; the
    listener's methods run on the client's thread."""

    def __init__(self, group: str, listener: TransactionListener, **settings):
        self._p = AsyncTransactionProducer(group, listener, **settings)
        self._put_init()

    def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        return self._run(self._p.send_message_in_transaction(msg, arg))


# ---------------------------------------------------------------- consumers
from .push_consumer import AsyncPushConsumer  # noqa: E402  (appended with the consumers)
from .lite_pull import AsyncLitePullConsumer  # noqa: E402
from .message import MessageExt  # noqa: E402


async def _on_loop(fn: Callable, *args: Any) -> Any:
    """Call ``fn`` on the client's loop (what touches the consumer's state)."""
    return fn(*args)


class _Subscriber(_Blocking):
    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        self._run(_on_loop(self._p.subscribe, topic, expression, expression_type))

    def unsubscribe(self, topic: str) -> None:
        self._run(_on_loop(self._p.unsubscribe, topic))


class PushConsumer(_Subscriber):
    """DefaultMQPushConsumer: ``subscribe()``, ``register_message_listener()``
    (or ``register_batch_listener()``), ``start()``, ``shutdown()``. A plain listener runs in the consumer's
    thread pool, a coroutine function on the client's thread."""

    def __init__(self, group: str, **settings):
        self._p = AsyncPushConsumer(group, **settings)

    def register_message_listener(self, listener) -> None:
        self._run(_on_loop(self._p.register_message_listener, listener))

    def register_batch_listener(self, fn) -> None:
        self._run(_on_loop(self._p.register_batch_listener, fn))

    def suspend(self) -> None:
        self._run(_on_loop(self._p.suspend))

    def resume(self) -> None:
        self._run(_on_loop(self._p.resume))

    def assigned_queues(self) -> set[MessageQueue]:
        return self._run(_on_loop(self._p.assigned_queues))



class LitePullConsumer(_Subscriber):
    """DefaultLitePullConsumer: ``subscribe()`` or ``assign()``, ``start()``,
    ``poll()``, ``commit_sync()``, ``seek()``, ``shutdown()``."""

    def __init__(self, group: str, **settings):
        self._p = AsyncLitePullConsumer(group, **settings)

    def assign(self, queues) -> None:
        self._run(_on_loop(self._p.assign, list(queues)))

    def assignment(self) -> set[MessageQueue]:
        return self._run(_on_loop(self._p.assignment))



    def poll(self, timeout: float | None = None) -> list[MessageExt]:
        return self._run(self._p.poll(timeout))

    def commit_sync(self, offsets: dict[MessageQueue, int] | None = None, persist: bool = True) -> None:
        self._run(self._p.commit_sync(offsets, persist))

    def committed(self, mq: MessageQueue) -> int:
        return self._run(self._p.committed(mq))

    def seek(self, mq: MessageQueue, offset: int) -> None:
        self._run(self._p.seek(mq, offset))

    def seek_to_begin(self, mq: MessageQueue) -> None:
        self._run(self._p.seek_to_begin(mq))

    def seek_to_end(self, mq: MessageQueue) -> None:
        self._run(self._p.seek_to_end(mq))

    def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._run(self._p.offset_for_timestamp(mq, timestamp_ms))

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        return self._run(self._p.fetch_message_queues(topic))

    def pause(self, queues) -> None:
        self._run(_on_loop(self._p.pause, list(queues)))

    def resume(self, queues) -> None:
        self._run(_on_loop(self._p.resume, list(queues)))
