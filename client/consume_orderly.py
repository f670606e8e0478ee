"""Orderly consumption: RocketMQ's ConsumeMessageOrderlyService.

A queue's messages reach the listener one batch at a time, in queue order:
one consume request per queue runs at a time (the process queue's
``order_lock``), takes the next batch aside, calls the listener under the
queue's ``consume_lock`` (a rebalance waits on it before unlocking the
queue on the broker) and commits the batch or puts it back in front and
comes again after ``suspend_current_queue_time_millis``. A message retried
``max_reconsume_times`` is given up to the retry topic (and the broker's
dead-letter queue) instead of blocking its queue forever. In clustering
mode nothing is consumed without the queue's broker lock (queue_locks.py);
a lease found lost is re-taken before going on. One request yields after
``MAX_TIME_CONSUME_CONTINUOUSLY`` so other queues get their turn.

The service belongs to one push consumer and uses its tasks, slots,
thread pool, locks and offset store; it never pulls and never rebalances.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from .listeners import ConsumeOrderlyContext, ConsumeOrderlyStatus
from .message import MessageExt, MessageQueue
from .process_queue import ProcessQueue
from .retry import RETRY_PREFIX, restore_retry_topic, send_to_retry_topic

if TYPE_CHECKING:
    from .push_consumer import AsyncPushConsumer

log = logging.getLogger("shmq.client")
MAX_TIME_CONSUME_CONTINUOUSLY = 60.0        # ConsumeMessageOrderlyService


class ConsumeOrderlyService:
    def __init__(self, consumer: "AsyncPushConsumer"):
        self.consumer = consumer

    def submit(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        """A consume request for the queue (a pull found it idle)."""
        self.consumer._spawn_work(self._consume(pq, mq))

    def close(self) -> None:
        """Shutting down: each request is a task of its own, nothing to end."""

    async def _consume(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        """ConsumeMessageOrderlyService.ConsumeRequest: the queue's messages in
        order, while its lock is held (clustering)."""
        c = self.consumer
        async with pq.order_lock:
            if pq.dropped or c._stopping:
                return
            if c.clustering and (not pq.locked or pq.is_lock_expired()):
                c._spawn_timer(self._try_lock_later_and_reconsume(mq, pq, 0.1))
                return
            began = time.monotonic()
            batch = c.config.consume_message_batch_max_size
            while not pq.dropped and not c._stopping:
                if c.clustering and (not pq.locked or pq.is_lock_expired()):
                    c._spawn_timer(self._try_lock_later_and_reconsume(mq, pq, 0.01))
                    return
                if time.monotonic() - began > MAX_TIME_CONSUME_CONTINUOUSLY:
                    self._submit_later(pq, mq, 10)
                    return
                msgs = pq.take_messages(batch)
                if not msgs:
                    return
                if mq.topic.startswith(RETRY_PREFIX):
                    restore_retry_topic(msgs, c.group)
                context = ConsumeOrderlyContext(mq)
                async with pq.consume_lock:
                    if pq.dropped:
                        return
                    async with c._slots:
                        status = await c._call_listener(msgs, context)
                if not isinstance(status, ConsumeOrderlyStatus):
                    if status is not None:
                        log.warning("the orderly listener of %s returned %r: suspending",
                                    c.group, status)
                    status = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                if not await self._process_result(msgs, status, context, pq, mq):
                    return

    async def _process_result(self, msgs: list[MessageExt], status: ConsumeOrderlyStatus,
                              context: ConsumeOrderlyContext, pq: ProcessQueue,
                              mq: MessageQueue) -> bool:
        """Commit, or put the batch back and come again after a pause; True
        to go on with the next batch."""
        go_on = True
        commit_offset = -1
        if status is ConsumeOrderlyStatus.SUCCESS:
            commit_offset = pq.commit()
        elif await self._check_reconsume_times(msgs, mq):
            pq.make_message_to_consume_again(msgs)
            self._submit_later(pq, mq, context.suspend_current_queue_time_millis)
            go_on = False
        else:
            commit_offset = pq.commit()
        if commit_offset >= 0 and not pq.dropped:
            self.consumer.offset_store.update_offset(mq, commit_offset, False)
        return go_on

    async def _check_reconsume_times(self, msgs: list[MessageExt], mq: MessageQueue) -> bool:
        """True if the batch is to be retried here; a message retried
        max_reconsume_times already goes to the dead-letter path instead."""
        c = self.consumer
        most = c.max_reconsume_times()
        suspend = False
        for m in msgs:
            if m.reconsume_times >= most:
                if not await send_to_retry_topic(c._inst(), c.group, m, m.reconsume_times, most,
                                                 mq.broker_name):
                    suspend = True
                    m.reconsume_times += 1
            else:
                suspend = True
                m.reconsume_times += 1
        return suspend

    def _submit_later(self, pq: ProcessQueue, mq: MessageQueue, millis: int) -> None:
        c = self.consumer
        if millis == -1:
            millis = c.config.suspend_current_queue_time_millis
        delay = min(max(millis, 10), 30000) / 1000
        c._spawn_timer(c._later(delay, lambda: self._consume(pq, mq)))

    async def _try_lock_later_and_reconsume(self, mq: MessageQueue, pq: ProcessQueue, delay: float) -> None:
        await asyncio.sleep(delay)
        c = self.consumer
        if c._stopping:
            return
        locked = await c.locks.lock(mq)
        self._submit_later(pq, mq, 10 if locked else 3000)


__all__ = ["MAX_TIME_CONSUME_CONTINUOUSLY", "ConsumeOrderlyService"]
