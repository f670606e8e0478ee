"""The blocking facade: the asyncio client driven from ordinary threads.

Each process gets one event loop in a daemon thread (a new one after a
fork: the child never touches its parent's loop or sockets). ``Producer``,
``TransactionProducer`` and the consumers wrap their asyncio twins; every
call runs on that loop and waits for its result.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Any, Callable

from .message import Message, MessageQueue, SendResult
from .producer import (AsyncProducer, AsyncTransactionProducer, Selector, TransactionListener,
                       TransactionSendResult)


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

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()


class Producer(_Blocking):
    """DefaultMQProducer: ``start()``, ``send()``, ``send_async()``,
    ``send_oneway()``, ``send_batch()``, ``shutdown()``."""

    def __init__(self, group: str, **settings):
        self._p = AsyncProducer(group, **settings)

    def send(self, msg: Message, queue: MessageQueue | None = None,
             selector: Selector | None = None, arg: Any = None,
             timeout: float | None = None) -> SendResult:
        return self._run(self._p.send(msg, queue, selector, arg, timeout))

    def send_async(self, msg: Message,
                   callback: Callable[[SendResult | None, Exception | None], Any] | None = None,
                   queue: MessageQueue | None = None) -> concurrent.futures.Future:
        """Returns at once; the future (and ``callback(result, error)``, run on
        the client's thread) completes when the broker answers."""
        fut = loop_thread().submit(self._p.send(msg, queue))
        if callback is not None:
            fut.add_done_callback(lambda f: callback(None if f.exception() else f.result(),
                                                     f.exception()))
        return fut

    def send_oneway(self, msg: Message, queue: MessageQueue | None = None) -> None:
        self._run(self._p.send_oneway(msg, queue))

    def send_many(self, topic: str, bodies, *, tags: str | None = None,
                  queue: MessageQueue | None = None) -> list:
        """``AsyncProducer.send_many``: many bodies, one queue, few calls."""
        return self._run(self._p.send_many(topic, bodies, tags=tags, queue=queue))

    def send_batch(self, msgs: list[Message], queue: MessageQueue | None = None) -> SendResult:
        return self._run(self._p.send_batch(msgs, queue))

    def flush(self) -> None:
        """Send what the accumulator holds now (``linger_ms`` > 0)."""
        async def flush() -> None:
            self._p.flush()
        self._run(flush())


class TransactionProducer(Producer):
    """TransactionMQProducer: ``send_message_in_transaction(msg, arg)``; the
    listener's methods run on the client's thread."""

    def __init__(self, group: str, listener: TransactionListener, **settings):
        self._p = AsyncTransactionProducer(group, listener, **settings)

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
    """DefaultMQPushConsumer: ``subscribe()``, ``register_message_listener()``,
    ``start()``, ``shutdown()``. A plain listener runs in the consumer's
    thread pool, a coroutine function on the client's thread."""

    def __init__(self, group: str, **settings):
        self._p = AsyncPushConsumer(group, **settings)

    def register_message_listener(self, listener) -> None:
        self._run(_on_loop(self._p.register_message_listener, listener))


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
