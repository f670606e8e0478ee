"""What the application gives a push consumer, and how it is called.

RocketMQ's listener vocabulary: ``MessageListenerConcurrently`` returns a
``ConsumeConcurrentlyStatus`` for a batch (its context can send some of the
batch back and pick their delay); ``MessageListenerOrderly`` returns a
``ConsumeOrderlyStatus`` (its context can set how long the queue pauses).
Either wraps a function or is subclassed; the function may be plain (run in
the consumer's thread pool, ``consume_thread_max`` threads) or a coroutine
function (run on the event loop). ``call_listener`` is the one place both
consume services call it: an exception from application code is logged
and counts as no status, which each service reads as "later" — the
listener is user code, so its errors are answers, not the client's bugs.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable

from .message import MessageExt, MessageQueue

log = logging.getLogger("shmq.client")
INT_MAX = 2 ** 31 - 1                       # Integer.MAX_VALUE


class ConsumeConcurrentlyStatus(enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(enum.Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


@dataclass
class ConsumeConcurrentlyContext:
    """``delay_level_when_next_consume``: 0 lets the broker choose (3 + times
    consumed), -1 sends straight to the DLQ; ``ack_index``: with SUCCESS, the
    messages after it are sent back."""
    message_queue: MessageQueue
    delay_level_when_next_consume: int = 0
    ack_index: int = INT_MAX


@dataclass
class ConsumeOrderlyContext:
    """``suspend_current_queue_time_millis``: -1 is the consumer's setting."""
    message_queue: MessageQueue
    suspend_current_queue_time_millis: int = -1


Listener = Callable[[list[MessageExt], Any], Any]


class MessageListenerConcurrently:
    """Override ``consume_message`` (plain or ``async``), or wrap a function:
    ``MessageListenerConcurrently(fn)``. Returns a ConsumeConcurrentlyStatus;
    None or an exception means RECONSUME_LATER."""

    def __init__(self, fn: Listener | None = None):
        _listener_init(self, fn, MessageListenerConcurrently)

    def consume_message(self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext):
        return self._fn(msgs, context)


class MessageListenerOrderly:
    """As MessageListenerConcurrently, for ordered consumption: returns a
    ConsumeOrderlyStatus; None or an exception means SUSPEND_CURRENT_QUEUE_A_MOMENT."""

    def __init__(self, fn: Listener | None = None):
        _listener_init(self, fn, MessageListenerOrderly)

    def consume_message(self, msgs: list[MessageExt], context: ConsumeOrderlyContext):
        return self._fn(msgs, context)


def _listener_init(listener, fn: Listener | None, base: type) -> None:
    """A listener wraps ``fn`` or overrides ``consume_message``: one of the two."""
    if fn is None and type(listener).consume_message is base.consume_message:
        raise TypeError(f"{base.__name__}: pass a function (msgs, context) or override consume_message")
    listener._fn = fn
    if fn is not None:
        # the function itself, so a coroutine function is seen as one
        listener.consume_message = fn


async def call_listener(fn: Callable, is_async: bool, executor: concurrent.futures.Executor,
                        msgs: list[MessageExt], context, group: str) -> Any:
    """Run the listener's ``fn`` (on the loop if it is a coroutine function,
    else in the consume thread pool); an exception counts as no status (None)."""
    try:
        if is_async:
            status = await fn(msgs, context)
        else:
            status = await asyncio.get_running_loop().run_in_executor(executor, fn, msgs, context)
            if inspect.isawaitable(status):
                status = await status
    except Exception:       # the application's code: logged, and the batch is retried
        log.exception("the listener of %s raised on %d messages of %s", group, len(msgs),
                      context.message_queue)
        return None
    return status


__all__ = ["ConsumeConcurrentlyContext", "ConsumeConcurrentlyStatus", "ConsumeOrderlyContext",
           "ConsumeOrderlyStatus", "INT_MAX", "MessageListenerConcurrently", "MessageListenerOrderly",
           "call_listener"]
