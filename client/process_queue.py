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

A push consumer with a batch listener (client/batch.py) keeps each pull
as one ``MessageBatch`` instead (``put_batch``, ``remove_batch``), keyed by
its first offset: the counts, sizes and span are the messages' all the same.

Push and lite pull consumers both hold one per queue. It does no I/O and
is touched only on the event loop.
"""
from __future__ import annotations

import asyncio
import itertools
import time

from .batch import MessageBatch
from .message import MessageExt

LOCK_INTERVAL = 20.0                        # ProcessQueue.REBALANCE_LOCK_INTERVAL
LOCK_MAX_LIVE = 30.0                        # ProcessQueue.REBALANCE_LOCK_MAX_LIVE_TIME
PULL_MAX_IDLE = 120.0                       # ProcessQueue.PULL_MAX_IDLE_TIME


class ProcessQueue:
    """The messages pulled from one queue and not yet consumed, by offset."""

    def __init__(self) -> None:
        self.msgs: dict[int, MessageExt] = {}        # ascending offsets
        self.batches: dict[int, MessageBatch] = {}   # first offset → batch (a batch listener's)
        self.batch_count = 0                         # messages in them
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
        return len(self.msgs) + len(self.consuming_orderly) + self.batch_count

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

    def put_batch(self, batch: MessageBatch) -> bool:
        """Hold a pulled batch (a batch listener's consumer) until
        ``remove_batch``; False if one from the same offset is held."""
        offs = batch.queue_offsets
        first = int(offs[0])
        held = self.batches
        if first in held:
            return False
        last = next(reversed(held)) if held else -1
        held[first] = batch
        self.batch_count += len(offs)
        self.msg_size += batch.body_bytes
        self.queue_offset_max = max(self.queue_offset_max, int(offs[-1]))
        if first < last:
            self.batches = dict(sorted(held.items()))
        return True

    def remove_batch(self, batch: MessageBatch, keep: MessageBatch | None = None) -> int:
        """Drop a consumed batch, holding ``keep`` (its part to consume again)
        in its place; the offset to commit, as ``remove_messages`` answers it
        (-1 if the batch was not held: the queue was cleared meanwhile)."""
        self.last_consume_time = time.monotonic()
        if self.batches.pop(int(batch.queue_offsets[0]), None) is None:
            return -1
        self.batch_count -= len(batch)
        self.msg_size -= batch.body_bytes
        if keep is not None and len(keep):
            self.put_batch(keep)
        return next(iter(self.batches)) if self.batches else self.queue_offset_max + 1

    def max_span(self) -> int:
        if self.batches:
            last = next(reversed(self.batches.values()))
            return int(last.queue_offsets[-1]) - next(iter(self.batches))
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
        return bool(self.msgs) or bool(self.batches)

    def clear(self) -> None:
        self.msgs.clear()
        self.batches.clear()
        self.batch_count = 0
        self.consuming_orderly.clear()
        self.msg_size = 0
        self.queue_offset_max = 0


__all__ = ["LOCK_INTERVAL", "LOCK_MAX_LIVE", "PULL_MAX_IDLE", "ProcessQueue"]
