"""One held queue's messages between pull and commit: RocketMQ's ProcessQueue.

A pull puts messages in (``put_messages``, keyed and kept sorted by queue
offset); consuming takes them out. Concurrently, any batch may finish
first, so ``remove_messages`` answers the offset to commit: the smallest
offset still held (or one past the largest pulled), never past a message
not yet consumed. Orderly, ``take_messages`` moves the next batch aside
(``consuming_orderly``) until ``commit`` (done: the offset after it) or
``make_message_to_consume_again`` (retry: back in front). ``msg_count`` and
``msg_size`` drive the pull's flow control; ``dropped`` tells every task
that still holds the queue that it was let go; ``locked`` and
``last_lock_time`` are the orderly lease on the broker (queue_locks.py).

Push and lite pull consumers both hold one per queue. It does no I/O and
is touched only on the event loop.
"""
from __future__ import annotations

import asyncio
import itertools
import time

from .message import MessageExt

LOCK_INTERVAL = 20.0                        # ProcessQueue.REBALANCE_LOCK_INTERVAL
LOCK_MAX_LIVE = 30.0                        # ProcessQueue.REBALANCE_LOCK_MAX_LIVE_TIME
PULL_MAX_IDLE = 120.0                       # ProcessQueue.PULL_MAX_IDLE_TIME


class ProcessQueue:
    """The messages pulled from one queue and not yet consumed, by offset."""

    def __init__(self) -> None:
        self.msgs: dict[int, MessageExt] = {}        # ascending offsets
        self.consuming_orderly: dict[int, MessageExt] = {}
        self.msg_size = 0
        self.queue_offset_max = 0
        self.dropped = False
        self.locked = False
        self.consuming = False
        now = time.monotonic()
        self.last_pull_time = self.last_lock_time = self.last_consume_time = now
        self.consume_lock = asyncio.Lock()          # held while an orderly listener runs
        self.order_lock = asyncio.Lock()            # one orderly consume request at a time
        self.try_unlock_times = 0

    @property
    def msg_count(self) -> int:
        return len(self.msgs) + len(self.consuming_orderly)

    def is_lock_expired(self) -> bool:
        return time.monotonic() - self.last_lock_time > LOCK_MAX_LIVE

    def is_pull_expired(self) -> bool:
        return time.monotonic() - self.last_pull_time > PULL_MAX_IDLE

    def put_messages(self, msgs: list[MessageExt]) -> bool:
        """Add pulled messages; True if a consumer should be started for them."""
        resort = False
        held = self.msgs
        last = next(reversed(held)) if held else -1
        size = 0
        for m in msgs:
            off = m.queue_offset
            if off in held:
                continue
            if off < last:
                resort = True
            held[off] = m
            last = self.queue_offset_max = off
            size += m.body_size
        self.msg_size += size
        if resort:
            self.msgs = dict(sorted(self.msgs.items()))
        dispatch = bool(self.msgs) and not self.consuming
        if dispatch:
            self.consuming = True
        return dispatch

    def max_span(self) -> int:
        if not self.msgs:
            return 0
        return next(reversed(self.msgs)) - next(iter(self.msgs))

    def remove_messages(self, msgs: list[MessageExt]) -> int:
        """Drop consumed messages; the offset to commit (the smallest one
        still held, or one past the largest pulled), -1 if none were held."""
        self.last_consume_time = time.monotonic()
        if not self.msgs:
            return -1
        held, size = self.msgs, 0
        for m in msgs:
            if held.pop(m.queue_offset, None) is not None:
                size += m.body_size
        self.msg_size -= size
        return next(iter(self.msgs)) if self.msgs else self.queue_offset_max + 1

    def take_messages(self, n: int) -> list[MessageExt]:
        """Orderly: the next ``n`` messages, moved aside until commit or retry."""
        self.last_consume_time = time.monotonic()
        out = []
        for off in list(itertools.islice(self.msgs, n)):
            m = self.msgs.pop(off)
            self.consuming_orderly[off] = m
            out.append(m)
        if not out:
            self.consuming = False
        return out

    def commit(self) -> int:
        """Orderly: the taken messages are done; the offset after them."""
        if not self.consuming_orderly:
            return -1
        last = next(reversed(self.consuming_orderly))
        self.msg_size -= sum(m.body_size for m in self.consuming_orderly.values())
        self.consuming_orderly.clear()
        return last + 1

    def make_message_to_consume_again(self, msgs: list[MessageExt]) -> None:
        for m in msgs:
            self.consuming_orderly.pop(m.queue_offset, None)
            self.msgs[m.queue_offset] = m
        self.msgs = dict(sorted(self.msgs.items()))

    def has_temp_message(self) -> bool:
        return bool(self.msgs)

    def clear(self) -> None:
        self.msgs.clear()
        self.consuming_orderly.clear()
        self.msg_size = 0
        self.queue_offset_max = 0


__all__ = ["LOCK_INTERVAL", "LOCK_MAX_LIVE", "PULL_MAX_IDLE", "ProcessQueue"]
