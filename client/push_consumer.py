"""The push consumer (asyncio): RocketMQ's DefaultMQPushConsumer(Impl).

``AsyncPushConsumer`` shares its subscriptions' queues with the rest of its
group (rebalanced at start, every ``rebalance_interval``, and at once when
the group or a route changes), long-polls each queue it holds into a
``ProcessQueue`` (flow-controlled: a queue holding too many messages, bytes
or too wide a span waits) and hands what it pulls to its consume service:
concurrently (consume_concurrently.py) or orderly (consume_orderly.py,
under the queues' broker locks, queue_locks.py). Offsets commit as the
smallest offset not yet consumed and are persisted every
``persist_consumer_offset_interval``.

This module is the consumer's life and its queues: set-up, start and
shutdown, the rebalance (which queues it holds, taking and letting go of
them), an offset reset a broker asks for, and the pull loop per queue.
What is shared with the lite pull consumer lives in consumer_base.py,
subscription.py, process_queue.py and pull.py; the names users import are
gathered in consumer.py. Background tasks follow background.py: a broker
gone or refusing is a warning and a later try, a bug stops its task, is
logged at ERROR and is raised by ``shutdown()``. With ``enable_msg_trace``
each listener call leaves SubBefore and SubAfter trace records
(client/trace.py); without it the listener is called as it is.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from shmq.ipc.headers import PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION, PULL_SUSPEND

from . import background, trace
from .batch import build_batch
from .consume_concurrently import ConsumeConcurrentlyService
from .consume_orderly import ConsumeOrderlyService
from .consumer_base import ConsumerBase, ConsumerSettings, split_settings
from .errors import EXPECTED, MQClientError, RemotingError
from .instance import ClientConfig
from .listeners import INT_MAX, MessageListenerConcurrently, MessageListenerOrderly, call_listener
from .message import MessageExt, MessageQueue
from .offsets import ReadOffsetType, parse_offset_table
from .process_queue import LOCK_INTERVAL, ProcessQueue
from .pull import FLOW_CONTROL_DELAY, PullRequest, PullStatus, pull_kernel
from .queue_locks import LOCK_TIMEOUT, QueueLocks
from .retry import RETRY_PREFIX
from .subscription import SubscriptionData
from .walk import warm_up_decoding

log = logging.getLogger("shmq.client")
SUSPENDED_DELAY = 1.0                       # PULL_TIME_DELAY_MILLS_WHEN_SUSPEND
UNLOCK_DELAY = 20.0                         # RebalancePushImpl.UNLOCK_DELAY_TIME_MILLS


@dataclass
class PushConsumerConfig(ConsumerSettings):
    """DefaultMQPushConsumer's settings, by their names in snake case."""
    consume_thread_max: int = 20
    consume_message_batch_max_size: int = 1
    pull_batch_size: int = 32
    pull_interval: int = 0                             # ms between pulls of a queue
    consume_concurrently_max_span: int = 2000
    max_reconsume_times: int = -1                      # -1: 16 (concurrently), unlimited (orderly)
    suspend_current_queue_time_millis: int = 1000
    broker_suspend_max_time_millis: int = 15000
    pull_time_delay_millis_when_exception: int = 3000
    post_subscription_when_pull: bool = True           # shmq: the broker need not know it from a heartbeat
    await_termination_millis_when_shutdown: int = 5000  # in-flight listeners may finish (Java: 0)

    def check(self) -> None:
        super().check()
        for name, lo, hi in (("consume_thread_max", 1, 1000), ("consume_message_batch_max_size", 1, 1024),
                             ("pull_batch_size", 1, 1024), ("pull_threshold_for_queue", 1, 65535),
                             ("pull_threshold_size_for_queue", 1, 1024),
                             ("consume_concurrently_max_span", 1, 65535)):
            if not lo <= getattr(self, name) <= hi:
                raise ValueError(f"{name} {getattr(self, name)}: must be {lo}..{hi}")


class AsyncPushConsumer(ConsumerBase):
    """DefaultMQPushConsumer: ``subscribe()``, ``register_message_listener()``,
    ``start()``, ``shutdown()``; settings are PushConsumerConfig's and
    ClientConfig's (``instance_name``, ``persist_consumer_offset_interval`` …)."""

    def __init__(self, group: str, *, namesrv_addr: str = "", client: ClientConfig | None = None,
                 **settings):
        client_settings, own = split_settings(settings, PushConsumerConfig)
        super().__init__(group, PushConsumerConfig(**own), client, namesrv_addr, client_settings)
        self.listener: MessageListenerConcurrently | MessageListenerOrderly | None = None
        self.orderly = False
        self.batch = False          # a batch listener: each pull's messages as one MessageBatch
        self.paused = False
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self._pull_tasks: dict[MessageQueue, asyncio.Task] = {}
        self._work: set[asyncio.Task] = set()      # listener calls and what they lead to
        self._timers: set[asyncio.Task] = set()    # sleeps before some work
        self._slots: asyncio.Semaphore | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._listener_is_async = False
        self._stopping = False
        self.locks = QueueLocks(group, self._inst, self.process_queues)
        self.service: ConsumeConcurrentlyService | ConsumeOrderlyService | None = None
        self.tracer: trace.TraceDispatcher | None = None
        if self.client_config.enable_msg_trace:   # off: no trace code around the listener at all
            self.tracer = trace.TraceDispatcher(group, "CONSUME", self.client_config)
            self._call_listener = self._traced_call_listener

    def _inherited(self) -> None:
        super()._inherited()
        self._stopping = False
        self.process_queues = {}
        self._pull_tasks, self._work, self._timers = {}, set(), set()
        self._slots = self._executor = None             # the parent's threads
        if self.service is not None:                    # (its workers were the parent's tasks)
            self.service = type(self.service)(self)
        self.locks = QueueLocks(self.group, self._inst, self.process_queues)
        if self.tracer is not None:        # the parent's queued trace records stay the parent's
            self.tracer = trace.TraceDispatcher(self.group, "CONSUME", self.client_config)

    # ------------------------------------------------------------ set-up
    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        """Consume ``topic``'s messages that match a TAG (``*``, ``A || B``) or
        SQL92 expression; replaces an earlier subscription of the topic."""
        self.subscriptions[topic] = SubscriptionData.build(topic, expression, expression_type)
        if self.running:
            self._spawn_timer(self._inst().heartbeat())
            self.rebalance_soon()

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)

    def register_message_listener(self, listener) -> None:
        """A MessageListenerConcurrently or MessageListenerOrderly, or a plain
        or coroutine function ``(msgs, context) -> status`` (concurrently)."""
        if not isinstance(listener, (MessageListenerConcurrently, MessageListenerOrderly)):
            if not callable(listener):
                raise TypeError("the listener must be a MessageListener or a callable")
            listener = MessageListenerConcurrently(listener)
        self.listener = listener
        self.batch = False
        self.orderly = isinstance(listener, MessageListenerOrderly)
        self.service = ConsumeOrderlyService(self) if self.orderly else ConsumeConcurrentlyService(self)
        fn = listener.consume_message
        self._listener_is_async = inspect.iscoroutinefunction(fn)

    def register_batch_listener(self, fn) -> None:
        """A plain or coroutine function ``(batch, context) -> status`` that
        consumes concurrently, taking each pull's messages as one
        ``MessageBatch`` (client/batch.py: numpy columns over the records,
        no object per message): as many as the broker gives a pull (up to
        its maxTransferCountOnMessageInMemory, 32 by default), or, read from
        the store directly on the broker's host, up to ``pull_batch_size``;
        ``consume_message_batch_max_size`` does not cut it.
        ``context.ack_index`` acknowledges the messages up to that index, as
        for a list. Replaces a message listener registered before."""
        if not callable(fn):
            raise TypeError("the batch listener must be a callable (batch, context) -> status")
        self.register_message_listener(MessageListenerConcurrently(fn))
        self.batch = True

    def max_reconsume_times(self) -> int:
        if self.config.max_reconsume_times == -1:
            return INT_MAX if self.orderly else 16
        return self.config.max_reconsume_times

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.running:
            raise MQClientError(-1, f"the push consumer {self.group} is already running")
        if self.listener is None:
            raise MQClientError(-1, "register a message listener before start()")
        if not self.subscriptions:
            raise MQClientError(-1, "subscribe to a topic before start()")
        if self.clustering:
            retry = RETRY_PREFIX + self.group
            self.subscriptions.setdefault(retry, SubscriptionData.build(retry, "*"))
        self._stopping = False
        self.service = type(self.service)(self)        # (a restart: its workers anew)
        if self.batch:                          # the records' walk kernel, loaded aside
            warm_up_decoding(wait=False)        # (a direct reader loads it with its own)
        self._slots = asyncio.Semaphore(self.config.consume_thread_max)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            self.config.consume_thread_max, thread_name_prefix=f"ConsumeMessageThread_{self.group}")
        try:
            await self._start_instance()
        except BaseException:
            self._executor.shutdown(wait=False)
            raise
        if self.tracer is not None:
            await self.tracer.start()
        interval = self.client_config.persist_consumer_offset_interval
        self._spawn_services(self._rebalance_service(), self._every(interval, self._persist_all))
        if self.orderly and self.clustering:
            self._spawn_services(self._every(LOCK_INTERVAL, self.locks.lock_all, first=1.0))
        await self.do_rebalance()

    async def shutdown(self) -> None:
        """Stop pulling, let in-flight listeners finish (up to
        ``await_termination_millis_when_shutdown``), persist offsets, unlock
        orderly queues and leave the group. Raises BackgroundFailure, after
        all that, if a background task stopped on a bug meanwhile."""
        if not self.running:
            return
        self._stopping = True
        await self._stop_services()
        async with self._rebalance_lock:           # no rebalance (or reset) is half done
            await background.cancel(self._timers)
            await background.cancel(self._pull_tasks.values())
            self._pull_tasks.clear()
        self.service.close()                       # its parked workers end
        if self._work:
            await asyncio.wait(self._work, timeout=self.config.await_termination_millis_when_shutdown / 1000)
        await background.cancel(self._work)
        await background.cancel(self._timers)          # set by work that ended meanwhile
        await self._persist_all()
        if self.orderly and self.clustering:
            await self.locks.unlock_all()
        for pq in self.process_queues.values():
            pq.dropped = True
        self.process_queues.clear()
        self.running = False
        await self.instance.unregister("consumer", self.group)
        self._executor.shutdown(wait=False)
        if self.tracer is not None:
            await self.tracer.shutdown()
        self._raise_failure()

    async def __aenter__(self) -> "AsyncPushConsumer":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    def suspend(self) -> None:
        """Pause pulling (resume() goes on)."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self.rebalance_soon()

    def assigned_queues(self) -> set[MessageQueue]:
        """The queues this consumer holds now (retry queues included)."""
        return set(self.process_queues)

    def _spawn_timer(self, coro: Awaitable) -> None:
        t = self._spawn(coro, f"a timer of {self.group}")
        self._timers.add(t)
        t.add_done_callback(self._timers.discard)

    def _spawn_work(self, coro: Awaitable) -> None:
        t = self._spawn(coro, f"a consume request of {self.group}")
        self._work.add(t)
        t.add_done_callback(self._work.discard)

    async def _later(self, delay: float, coro_fn: Callable[[], Awaitable]) -> None:
        """After ``delay``, start ``coro_fn()`` as work (unless shutting down)."""
        await asyncio.sleep(delay)
        if not self._stopping:
            self._spawn_work(coro_fn())

    # ------------------------------------------------------------ rebalance
    async def do_rebalance(self) -> None:
        """RebalanceImpl.doRebalance: for each subscribed topic, take the
        queues allocated to this client and let go of the others."""
        if not self.running or self.paused or self._stopping:
            return
        async with self._rebalance_lock:
            if self._stopping:
                return
            changed = False
            for topic in list(self.subscriptions):
                alloc = await self._allocate(topic)
                if alloc is not None and await self._update_process_queues(topic, alloc[1]):
                    self.subscriptions[topic].sub_version = int(time.time() * 1000)
                    changed = True
            for mq in [mq for mq in self.process_queues if mq.topic not in self.subscriptions]:
                await self._drop(mq)
            if changed:
                await self._inst().heartbeat()

    async def _update_process_queues(self, topic: str, mine: set[MessageQueue]) -> bool:
        changed = False
        for mq, pq in list(self.process_queues.items()):
            if mq.topic == topic and (mq not in mine or pq.is_pull_expired()):
                pq.dropped = True
                if await self._remove_unnecessary_queue(mq, pq):
                    del self.process_queues[mq]
                    changed = True
        for mq in sorted(mine - set(self.process_queues)):
            if self.orderly and self.clustering and not await self.locks.lock(mq):
                continue
            self.offset_store.remove_offset(mq)
            pq = ProcessQueue()
            pq.locked = True
            try:
                offset = await self._compute_pull_from_where(mq)
            except (RemotingError, MQClientError) as e:
                log.warning("where to start %s for %s: %s", mq, self.group, e)
                continue
            if offset < 0:
                continue
            self.process_queues[mq] = pq
            self._start_pull(PullRequest(mq, pq, offset))
            changed = True
        return changed

    async def _drop(self, mq: MessageQueue) -> None:
        pq = self.process_queues.pop(mq, None)
        if pq is not None:
            pq.dropped = True
            await self._remove_unnecessary_queue(mq, pq)

    async def _remove_unnecessary_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Stop pulling ``mq``, persist and forget its offset; an orderly queue
        is unlocked once no listener runs on it (RebalancePushImpl)."""
        task = self._pull_tasks.pop(mq, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        ds = self.instance.direct_now(mq.broker_name) if self.instance is not None else None
        if ds is not None:                  # (a direct read's commit held back: stale now)
            ds.reads.forget(self.group, mq.topic, mq.queue_id)
        await self.offset_store.persist(mq)
        self.offset_store.remove_offset(mq)
        if not (self.orderly and self.clustering):
            return True
        try:
            async with asyncio.timeout(LOCK_TIMEOUT):
                await pq.consume_lock.acquire()
        except TimeoutError:
            pq.try_unlock_times += 1
            log.warning("%s of %s is being consumed; unlock it later (%d tries)", mq, self.group,
                        pq.try_unlock_times)
            return False
        try:
            if pq.has_temp_message():
                self._spawn_timer(self._later(UNLOCK_DELAY, lambda: self.locks.unlock([mq])))
            else:
                await self.locks.unlock([mq])
        finally:
            pq.consume_lock.release()
        return True

    async def reset_offsets(self, topic: str, body: bytes) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET: drop the topic's queues named in the
        body, set their offsets there, and take them up again
        (MQClientInstance.resetOffset)."""
        try:
            table = parse_offset_table(body)
        except ValueError as e:
            log.warning("reset offsets of %s for %s: bad body (%s)", topic, self.group, e)
            return
        if not self.running:
            return
        self.paused = True
        try:
            async with self._rebalance_lock:
                if self._stopping:
                    return
                targets = [(mq, pq) for mq, pq in self.process_queues.items()
                           if mq.topic == topic and mq in table]
                for _, pq in targets:
                    pq.dropped = True
                    pq.clear()
                for mq, pq in targets:
                    self.offset_store.update_offset(mq, table[mq], False)
                    await self._remove_unnecessary_queue(mq, pq)
                    del self.process_queues[mq]
            log.info("offsets of %s for %s reset: %s", topic, self.group,
                     {f"{mq.broker_name}:{mq.queue_id}": o for mq, o in table.items()})
        finally:
            self.paused = False
        await self.do_rebalance()

    # ------------------------------------------------------------ offsets and locks
    async def _persist_all(self) -> None:
        await self.offset_store.persist_all(set(self.process_queues))

    # ------------------------------------------------------------ pulling
    def _start_pull(self, req: PullRequest) -> None:
        self._pull_tasks[req.mq] = self._spawn(self._pull_loop(req), f"the pull loop of {req.mq} "
                                                                     f"for {self.group}")

    async def _pull_loop(self, req: PullRequest) -> None:
        """Pull ``req``'s queue until it is let go; a broker gone or refusing
        waits ``pull_time_delay_millis_when_exception``, a bug ends the loop."""
        while not req.pq.dropped:
            try:
                delay = await self._pull_once(req)
            except EXPECTED as e:
                log.warning("pull %s for %s: %s", req.mq, self.group, e)
                delay = self.config.pull_time_delay_millis_when_exception / 1000
            if delay > 0:
                await asyncio.sleep(delay)

    async def _pull_once(self, req: PullRequest) -> float:
        """DefaultMQPushConsumerImpl.pullMessage: one pull, unless flow control
        says wait; returns how long to wait before the next."""
        cfg = self.config
        pq, mq = req.pq, req.mq
        error_delay = cfg.pull_time_delay_millis_when_exception / 1000
        pq.last_pull_time = time.monotonic()
        if self.paused:
            return SUSPENDED_DELAY
        if pq.msg_count > cfg.pull_threshold_for_queue or \
                pq.msg_size > cfg.pull_threshold_size_for_queue * (1 << 20):
            return FLOW_CONTROL_DELAY
        if not self.orderly:
            if pq.max_span() > cfg.consume_concurrently_max_span:
                return FLOW_CONTROL_DELAY
        elif not pq.locked:
            return error_delay
        elif not req.previously_locked:          # another client may have consumed meanwhile
            try:
                offset = await self._compute_pull_from_where(mq)
            except (RemotingError, MQClientError):
                return error_delay
            if offset < 0:
                return error_delay
            req.previously_locked, req.next_offset = True, offset
        sub = self.subscriptions.get(mq.topic)
        if sub is None:
            return error_delay
        commit_offset = 0
        if self.clustering:
            commit_offset = max(0, await self.offset_store.read_offset(mq, ReadOffsetType.READ_FROM_MEMORY))
        sysflag = PULL_SUSPEND | (PULL_COMMIT_OFFSET if commit_offset > 0 else 0) | \
            (PULL_SUBSCRIPTION if cfg.post_subscription_when_pull else 0)
        try:
            result = await pull_kernel(self._inst(), self.group, mq, sub, req.next_offset,
                                       cfg.pull_batch_size, sysflag, commit_offset,
                                       cfg.broker_suspend_max_time_millis,
                                       cfg.consumer_timeout_millis_when_suspend / 1000,
                                       self.batch)
        except (RemotingError, MQClientError) as e:
            if not mq.topic.startswith(RETRY_PREFIX):
                log.warning("pull %s for %s: %s", mq, self.group, e)
            return error_delay
        if pq.dropped:
            return 0
        if result.status is PullStatus.FOUND:
            req.next_offset = result.next_begin_offset
            if self.batch:
                if result.msgs and pq.put_batch(result.msgs):
                    self.service.submit(result.msgs, pq, mq, at_once=result.here)
            elif result.msgs:
                dispatch = pq.put_messages(result.msgs)
                if self.orderly:
                    if dispatch:
                        self.service.submit(pq, mq)
                else:
                    self.service.submit(result.msgs, pq, mq, at_once=result.here)
            if result.here:
                # read in this process (pull_kernel's doc): the
                # listener runs now, before the next pull (a direct read
                # overlaps nothing: before, that pull — a read, its decode, a
                # caught-up queue's park — came first, then two more turns)
                await asyncio.sleep(0)
            return cfg.pull_interval / 1000 if result.msgs else 0
        if result.status is PullStatus.OFFSET_ILLEGAL:
            log.warning("pull %s for %s: offset %d is illegal, the broker says %d", mq, self.group,
                        req.next_offset, result.next_begin_offset)
            req.next_offset = result.next_begin_offset
            pq.dropped = True
            self._spawn_timer(self._fix_illegal_offset(req))
            return 0
        req.next_offset = result.next_begin_offset        # no new / no matched message
        if pq.msg_count == 0:                             # correctTagsOffset
            self.offset_store.update_offset(mq, req.next_offset, True)
        if result.here:
            await asyncio.sleep(0)                        # (pull_kernel's doc, as above)
        return 0

    async def _fix_illegal_offset(self, req: PullRequest) -> None:
        """OFFSET_ILLEGAL: keep the offset the broker gave, let go of the queue
        and take it up again from there."""
        self._pull_tasks.pop(req.mq, None)
        self.offset_store.update_offset(req.mq, req.next_offset, False)
        await self.offset_store.persist(req.mq)
        async with self._rebalance_lock:
            if self.process_queues.get(req.mq) is req.pq:
                await self._drop(req.mq)
        self.rebalance_soon()

    # ------------------------------------------------------------ consuming
    async def consume_directly(self, body: bytes, broker_name: str) -> dict:
        """CONSUME_MESSAGE_DIRECTLY (an operator's ``queryMsgById -g -d``, the
        console's "consume directly"): the listener on the one stored message
        of ``body``, outside the queues, nothing sent back and no offset
        moved; ConsumeMessageDirectlyResult, as the Java client's consume
        services build it."""
        from .listeners import (ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
                                ConsumeOrderlyContext, ConsumeOrderlyStatus)
        from .message import decode_messages
        from .retry import restore_retry_topic

        msgs = decode_messages(body, broker_name)
        if not msgs:                  # the broker found no such message: nothing to consume
            raise ValueError("the request carries no message")
        restore_retry_topic(msgs, self.group)
        mq = MessageQueue(msgs[0].topic, broker_name, msgs[0].queue_id)
        if self.batch:
            msgs = build_batch(body, mq)
            msgs.retry_group = self.group
        context = (ConsumeOrderlyContext(mq) if self.orderly else ConsumeConcurrentlyContext(mq))
        t0 = time.monotonic()
        try:
            if self._listener_is_async:
                status = await self.listener.consume_message(msgs, context)
            else:
                status = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self.listener.consume_message, msgs, context)
            result, remark = {ConsumeConcurrentlyStatus.CONSUME_SUCCESS: "CR_SUCCESS",
                              ConsumeConcurrentlyStatus.RECONSUME_LATER: "CR_LATER",
                              ConsumeOrderlyStatus.SUCCESS: "CR_SUCCESS",
                              ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT: "CR_LATER",
                              None: "CR_RETURN_NULL"}.get(status, "CR_RETURN_NULL"), None
        except Exception as e:       # the application's code: its error is the answer
            result, remark = "CR_THROW_EXCEPTION", f"{type(e).__name__}: {e}"
        return {"order": self.orderly, "autoCommit": True, "consumeResult": result,
                "remark": remark, "spentTimeMills": int((time.monotonic() - t0) * 1000)}

    async def _call_listener(self, msgs: list[MessageExt], context) -> Any:
        """What both consume services call: the listener, on the loop or in
        the consume thread pool (listeners.call_listener)."""
        return await call_listener(self.listener.consume_message, self._listener_is_async,
                                   self._executor, msgs, context, self.group)

    async def _traced_call_listener(self, msgs: list[MessageExt], context) -> Any:
        """``_call_listener`` with trace on: SubBefore and SubAfter records
        around it (client/trace.py), telling a listener that raised from one
        that returned nothing."""
        before = trace.sub_before(self.tracer, self.group,
                                  msgs.messages() if self.batch else msgs)
        fn, raised = self.listener.consume_message, []
        if self._listener_is_async:
            async def listener(m, c):
                try:
                    return await fn(m, c)
                except Exception:
                    raised.append(True)
                    raise
        else:
            def listener(m, c):
                try:
                    return fn(m, c)
                except Exception:
                    raised.append(True)
                    raise
        status = await call_listener(listener, self._listener_is_async, self._executor, msgs,
                                     context, self.group)
        trace.sub_after(self.tracer, before, len(msgs), status, bool(raised))
        return status


__all__ = ["AsyncPushConsumer", "PushConsumerConfig"]
