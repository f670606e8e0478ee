"""Concurrent consumption: RocketMQ's ConsumeMessageConcurrentlyService.

Each pull's messages are cut into batches of ``consume_message_batch_max_size``
and each batch becomes one consume request, run as soon as one of
``consume_thread_max`` workers is free; batches of one queue may finish in
any order. A batch's result decides its messages' fate: the ones the
listener acknowledged (all, or up to the context's ``ack_index``) are done;
the rest go back to the broker's retry topic (retry.py) — broadcasting
drops them, as RocketMQ does — and one the broker would not take back is
consumed again here after ``SEND_BACK_RETRY_DELAY``. Then the process queue
gives the offset to commit (the smallest still held), so a slow batch holds
back the commit, never the consumption of others.

The workers are RocketMQ's consume thread pool as tasks: requests wait in
one FIFO, and a worker takes them one after another, parking when none is
left. A task per request (as before 2026-11-27) cost ~6–8 µs each —
its creation, its done-callbacks, the slot semaphore — most of what a
push consumer spent per message at the default batch of one. A worker
taking a request while more wait makes sure another is coming (an idle one
woken, or a new one up to ``consume_thread_max``): a listener that awaits
(I/O, the thread pool for a plain function) is joined by up to the
maximum of them, as the slots allowed before, while one that never yields
has its requests run by one worker, and the others stay parked.

A batch listener's request is one pull's ``MessageBatch`` (client/batch.py),
never cut: its acknowledged part is done, the rest goes back as above (a
``MessageExt`` made for each such message), and what the broker would not
take back stays held as a smaller batch, consumed again later.

The service belongs to one push consumer and uses its tasks, thread pool
and offset store; it never pulls and never rebalances.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from time import monotonic
from typing import TYPE_CHECKING

from . import background
from .batch import MessageBatch
from .listeners import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus
from .message import MessageExt, MessageQueue
from .process_queue import ProcessQueue
from .retry import RETRY_PREFIX, restore_retry_topic, send_message_back

if TYPE_CHECKING:
    from .push_consumer import AsyncPushConsumer

log = logging.getLogger("shmq.client")
SEND_BACK_RETRY_DELAY = 5.0                 # ConsumeMessageConcurrentlyService.submitConsumeRequestLater
# A worker taking one request after another yields to what else is ready
# once it has run this long (a task per request interleaved with the rest
# of the loop; yielding after every request cost batches of one ~5 µs a
# message)
YIELD_EVERY_S = 200e-6


class ConsumeConcurrentlyService:
    def __init__(self, consumer: "AsyncPushConsumer"):
        self.consumer = consumer
        self.requests: deque = deque()      # (msgs, pq, mq) not taken by a worker yet
        self.idle: list[asyncio.Future] = []   # parked workers, woken by setting theirs
        self.workers = 0                    # workers alive (running, woken or parked)
        self.waking = 0                     # woken or started, not running yet
        self.closing = False

    def submit(self, msgs: list[MessageExt] | MessageBatch, pq: ProcessQueue, mq: MessageQueue,
               at_once: bool = False) -> None:
        """One consume request per batch of a pull's messages."""
        reqs = self.requests
        if isinstance(msgs, MessageBatch):
            reqs.append((msgs, pq, mq))
        else:
            n = self.consumer.config.consume_message_batch_max_size
            for i in range(0, len(msgs), n):
                reqs.append((msgs[i:i + n], pq, mq))
        if not self.waking:
            # a worker, woken after what is ready now: the pull loop that
            # submits goes on to write its next pull, and the connection
            # flushes it when the turn ends; woken at once, the worker ran
            # first and the pull waited for the whole pull's consumption
            # (TCP, batches of 32: 20 % fewer msg/s than a task per request).
            # ``at_once``: a pull read in this process, with no request to
            # write, whose loop turns next: the worker runs first.
            self.waking += 1
            if at_once:
                self._wake_one()
            else:
                asyncio.get_running_loop().call_soon(self._wake_one)

    def _wake_one(self) -> None:
        self.waking -= 1
        if self.requests:
            self._add_worker()

    def _add_worker(self) -> None:
        """One more worker on its way to the requests: a parked one, else a
        new one if fewer than consume_thread_max run (else the running ones
        take them as they finish)."""
        idle = self.idle
        while idle:
            fut = idle.pop()
            if not fut.done():           # (a parked worker cancelled: gone)
                fut.set_result(None)
                self.waking += 1
                return
        c = self.consumer
        if self.workers < c.config.consume_thread_max:
            self.workers += 1
            self.waking += 1
            c._spawn_work(self._worker())

    async def _worker(self) -> None:
        c = self.consumer
        reqs = self.requests
        woken = True                # counted in ``waking`` until it runs
        try:
            while True:
                if woken:
                    self.waking -= 1
                    woken = False
                ran_from = monotonic()
                while reqs:
                    msgs, pq, mq = reqs.popleft()
                    if reqs and not self.waking:
                        self._add_worker()       # for the next, if this listener waits
                    try:
                        await self._consume(msgs, pq, mq)
                    except Exception as e:       # a bug in this request: reported as a task's
                        background.report(f"a consume request of {c.group}", e,  # would be,
                                          c.record_failure)                      # and on
                    if reqs and monotonic() - ran_from >= YIELD_EVERY_S:
                        await asyncio.sleep(0)   # what else is ready runs (see YIELD_EVERY_S)
                        ran_from = monotonic()
                if self.closing:
                    return
                fut = asyncio.get_running_loop().create_future()
                self.idle.append(fut)
                try:
                    await fut
                except BaseException:            # cancelled: after being woken, or parked
                    woken = fut.done() and not fut.cancelled()
                    raise
                woken = True
        finally:
            if woken:
                self.waking -= 1
            self.workers -= 1
            if reqs and not self.closing and not self.waking:
                self._add_worker()               # (it ended on a BaseException: the rest)

    def close(self) -> None:
        """Shutting down: parked workers end, and the running ones once no
        request is left (what the consumer's shutdown waits for)."""
        self.closing = True
        for fut in self.idle:
            if not fut.done():
                fut.set_result(None)
                self.waking += 1
        self.idle.clear()

    async def _consume(self, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue) -> None:
        """ConsumeMessageConcurrentlyService.ConsumeRequest."""
        c = self.consumer
        if pq.dropped or c._stopping:
            return
        if mq.topic.startswith(RETRY_PREFIX):      # a queue's records carry its topic
            if isinstance(msgs, MessageBatch):
                msgs.retry_group = c.group           # (its messages() restore it)
            else:
                restore_retry_topic(msgs, c.group)
        context = ConsumeConcurrentlyContext(mq)
        status = await c._call_listener(msgs, context)
        if not isinstance(status, ConsumeConcurrentlyStatus):
            if status is not None:
                log.warning("the listener of %s returned %r: RECONSUME_LATER", c.group, status)
            status = ConsumeConcurrentlyStatus.RECONSUME_LATER
        if pq.dropped:
            return
        if isinstance(msgs, MessageBatch):
            await self._batch_result(status, context, msgs, pq, mq)
        else:
            await self._process_result(status, context, msgs, pq, mq)

    async def _process_result(self, status: ConsumeConcurrentlyStatus,
                              context: ConsumeConcurrentlyContext, msgs: list[MessageExt],
                              pq: ProcessQueue, mq: MessageQueue) -> None:
        c = self.consumer
        ack = min(context.ack_index, len(msgs) - 1) \
            if status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS else -1
        failed = msgs[ack + 1:]
        if failed and not c.clustering:
            log.warning("broadcasting %s: %d messages failed and are dropped", c.group, len(failed))
        elif failed:
            back_failed = []
            for m in failed:
                if not await send_message_back(c._inst(), c.group, m, context.delay_level_when_next_consume,
                                               c.max_reconsume_times(), mq.broker_name):
                    m.reconsume_times += 1
                    back_failed.append(m)
            if back_failed:
                msgs = [m for m in msgs if m not in back_failed]
                c._spawn_timer(c._later(SEND_BACK_RETRY_DELAY,
                                        lambda: self._resubmit(back_failed, pq, mq)))
        offset = pq.remove_messages(msgs)
        if offset >= 0 and not pq.dropped:
            c.offset_store.update_offset(mq, offset, True)

    async def _batch_result(self, status: ConsumeConcurrentlyStatus,
                            context: ConsumeConcurrentlyContext, batch: MessageBatch,
                            pq: ProcessQueue, mq: MessageQueue) -> None:
        """``_process_result`` for a batch: the messages after the
        acknowledged ones go back one by one; those the broker would not
        take stay held, a smaller batch consumed again later."""
        c = self.consumer
        n = len(batch)
        ack = min(context.ack_index, n - 1) \
            if status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS else -1
        keep = None
        if ack < n - 1 and not c.clustering:
            log.warning("broadcasting %s: %d messages failed and are dropped", c.group, n - ack - 1)
        elif ack < n - 1:
            back_failed = []
            for i in range(ack + 1, n):
                if not await send_message_back(c._inst(), c.group, batch.message(i),
                                               context.delay_level_when_next_consume,
                                               c.max_reconsume_times(), mq.broker_name):
                    back_failed.append(i)
            if back_failed:
                keep = batch.take(back_failed)
                keep.reconsume_times[:] += 1
                c._spawn_timer(c._later(SEND_BACK_RETRY_DELAY,
                                        lambda: self._resubmit(keep, pq, mq)))
        offset = pq.remove_batch(batch, keep)
        if offset >= 0 and not pq.dropped:
            c.offset_store.update_offset(mq, offset, True)

    async def _resubmit(self, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue) -> None:
        self.submit(msgs, pq, mq)


__all__ = ["SEND_BACK_RETRY_DELAY", "ConsumeConcurrentlyService"]
