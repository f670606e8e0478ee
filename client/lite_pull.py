"""The lite pull consumer (asyncio): RocketMQ's DefaultLitePullConsumer.

Queues come from ``subscribe(topic, expression)`` (rebalanced among the
group like a push consumer's) or from ``assign(queues)``. Each held queue is
long-polled in the background into a cache; ``poll(timeout)`` returns the
next batch pulled. A queue's consumed offset moves as its batches are
polled; ``commit_sync()`` stores it (in memory and on the broker), and with
``auto_commit`` ``poll`` does so every ``auto_commit_interval_millis``.
``seek``/``seek_to_begin``/``seek_to_end`` restart a queue elsewhere;
``offset_for_timestamp`` and ``fetch_message_queues`` ask the broker and
the NameServer.

It shares with the push consumer its base (consumer_base.py: settings,
start-up, the rebalance service), the process queue, the subscription and
the pull (pull.py); a bug in one of its background tasks stops that task,
is logged at ERROR and is raised by ``shutdown()`` (background.py).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from .consumer_base import ConsumerBase, ConsumerSettings, split_settings
from .errors import EXPECTED, MQClientError
from .instance import ClientConfig
from .message import MessageExt, MessageQueue
from .offsets import ReadOffsetType, max_offset, min_offset, search_offset
from .process_queue import ProcessQueue
from .pull import FLOW_CONTROL_DELAY, PullStatus, pull_kernel
from .requests import PULL_SUBSCRIPTION, PULL_SUSPEND
from .subscription import SubscriptionData

log = logging.getLogger("shmq.client")
PAUSED_DELAY = 1.0                        # PULL_TIME_DELAY_MILLS_WHEN_PAUSE
PULL_LITE = 0x10                          # PullSysFlag.FLAG_LITE_PULL_MESSAGE


@dataclass
class LitePullConsumerConfig(ConsumerSettings):
    """DefaultLitePullConsumer's settings, by their names in snake case."""
    auto_commit: bool = True
    auto_commit_interval_millis: int = 5000
    pull_batch_size: int = 10
    pull_threshold_for_all: int = 10000
    consume_max_span: int = 2000
    poll_timeout_millis: int = 5000
    broker_suspend_max_time_millis: int = 20000
    pull_time_delay_millis_when_exception: int = 1000

    def check(self) -> None:
        super().check()
        if self.auto_commit_interval_millis < 1000:
            raise ValueError("auto_commit_interval_millis must be at least 1000")
        if not 1 <= self.pull_batch_size <= 1024:
            raise ValueError(f"pull_batch_size {self.pull_batch_size}: must be 1..1024")


@dataclass
class QueueState:
    """AssignedMessageQueue's MessageQueueState: one held queue."""
    pq: ProcessQueue = field(default_factory=ProcessQueue)
    pull_offset: int = -1                  # the next pull starts here (-1: ask the store)
    consume_offset: int = -1               # everything before it was polled
    seek_offset: int = -1
    paused: bool = False


@dataclass
class ConsumeRequest:
    msgs: list[MessageExt]
    mq: MessageQueue
    pq: ProcessQueue


class AsyncLitePullConsumer(ConsumerBase):
    """DefaultLitePullConsumer: ``subscribe()`` or ``assign()``, ``start()``,
    ``poll()``, ``commit_sync()``, ``seek()``, ``shutdown()``."""

    consume_type = "CONSUME_ACTIVELY"

    def __init__(self, group: str, *, namesrv_addr: str = "", client: ClientConfig | None = None,
                 **settings):
        client_settings, own = split_settings(settings, LitePullConsumerConfig)
        super().__init__(group, LitePullConsumerConfig(**own), client, namesrv_addr, client_settings)
        self.mode: str | None = None                   # "SUBSCRIBE" or "ASSIGN"
        self.queues: dict[MessageQueue, QueueState] = {}
        self._assigned: set[MessageQueue] = set()
        self._requests: asyncio.Queue[ConsumeRequest] = asyncio.Queue()
        self._pull_tasks: dict[MessageQueue, asyncio.Task] = {}
        self._ending: set[asyncio.Task] = set()         # pull tasks cancelled, not yet ended
        self._next_auto_commit = 0.0

    def _inherited(self) -> None:
        super()._inherited()
        self.queues = {}
        self._requests = asyncio.Queue()             # the parent's polled messages
        self._pull_tasks, self._ending = {}, set()

    def _set_mode(self, mode: str) -> None:
        if self.mode not in (None, mode):
            raise MQClientError(-1, "subscribe and assign are exclusive")
        self.mode = mode

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        """Consume ``topic`` (a TAG or SQL92 filter), its queues shared among the group."""
        if not topic:
            raise ValueError("Topic can not be null or empty.")
        self._set_mode("SUBSCRIBE")
        self.subscriptions[topic] = SubscriptionData.build(topic, expression, expression_type)
        if self.running:
            self.rebalance_soon()

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)
        if self.running:
            self.rebalance_soon()

    def assign(self, queues) -> None:
        """Consume exactly these queues (no rebalance); replaces an earlier assignment."""
        queues = set(queues)
        if not queues:
            raise ValueError("Message queues can not be null or empty.")
        self._set_mode("ASSIGN")
        self._assigned = queues
        if self.running:
            self._update_assigned(None, queues)

    def assignment(self) -> set[MessageQueue]:
        return set(self.queues)

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.running:
            raise MQClientError(-1, f"the lite pull consumer {self.group} is already running")
        await self._start_instance()
        self._next_auto_commit = time.monotonic() + self.config.auto_commit_interval_millis / 1000
        self._spawn_services(self._every(self.client_config.persist_consumer_offset_interval,
                                         self._persist_all))
        if self.mode == "SUBSCRIBE":
            self._spawn_services(self._rebalance_service())
            await self.do_rebalance()
        elif self.mode == "ASSIGN":
            self._update_assigned(None, self._assigned)

    async def shutdown(self) -> None:
        """Stop pulling; with auto commit, commit what was polled; persist; leave
        the group. Raises BackgroundFailure, after all that, if a background
        task stopped on a bug meanwhile."""
        if not self.running:
            return
        await self._stop_services()
        async with self._rebalance_lock:
            for mq in list(self._pull_tasks):
                self._stop_pull(mq)
            await asyncio.gather(*self._ending, return_exceptions=True)
        if self.config.auto_commit:
            self._commit_all()
        await self._persist_all()
        for st in self.queues.values():
            st.pq.dropped = True
        self.queues.clear()
        self.running = False
        await self.instance.unregister("consumer", self.group)
        self._raise_failure()

    async def __aenter__(self) -> "AsyncLitePullConsumer":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    # ------------------------------------------------------------ rebalance and assignment
    async def do_rebalance(self) -> None:
        if not self.running or self.mode != "SUBSCRIBE":
            return
        async with self._rebalance_lock:
            for topic in list(self.subscriptions):
                alloc = await self._allocate(topic)
                if alloc is not None:
                    await self._release([mq for mq in self.queues
                                         if mq.topic == topic and mq not in alloc[1]])
                    self._update_assigned(topic, alloc[1])
            await self._release([mq for mq in self.queues if mq.topic not in self.subscriptions])

    def _update_assigned(self, topic: str | None, mine: set[MessageQueue]) -> None:
        """Hold exactly ``mine`` (of ``topic``, or of every topic when None)."""
        for mq in [mq for mq in self.queues if (topic is None or mq.topic == topic) and mq not in mine]:
            self._forget(mq)
        for mq in sorted(mine - set(self.queues)):
            self.offset_store.remove_offset(mq)
            self.queues[mq] = QueueState()
            self._start_pull(mq)

    def _forget(self, mq: MessageQueue) -> None:
        st = self.queues.pop(mq, None)
        if st is not None:
            st.pq.dropped = True
        self._stop_pull(mq)

    def _stop_pull(self, mq: MessageQueue) -> None:
        task = self._pull_tasks.pop(mq, None)
        if task is not None:
            task.cancel()
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)

    async def _release(self, mqs: list[MessageQueue]) -> None:
        """Let go of queues another consumer takes; their offsets (with auto
        commit, what was polled) are persisted first."""
        for mq in mqs:
            st = self.queues.get(mq)
            if st is not None and st.consume_offset >= 0 and self.config.auto_commit:
                self.offset_store.update_offset(mq, st.consume_offset, False)
            self._forget(mq)
            await self.offset_store.persist(mq)
            self.offset_store.remove_offset(mq)

    def pause(self, queues) -> None:
        for mq in queues:
            if mq in self.queues:
                self.queues[mq].paused = True

    def resume(self, queues) -> None:
        for mq in queues:
            if mq in self.queues:
                self.queues[mq].paused = False

    # ------------------------------------------------------------ pulling
    def _start_pull(self, mq: MessageQueue) -> None:
        self._pull_tasks[mq] = self._spawn(self._pull_loop(mq), f"the pull loop of {mq} for {self.group}")

    async def _pull_loop(self, mq: MessageQueue) -> None:
        while True:
            st = self.queues.get(mq)
            if st is None or st.pq.dropped:
                return
            try:
                delay = await self._pull_once(mq, st)
            except EXPECTED as e:         # a bug is not caught: it ends the loop (background.py)
                log.warning("pull %s for %s: %s", mq, self.group, e)
                delay = self.config.pull_time_delay_millis_when_exception / 1000
            if delay > 0:
                await asyncio.sleep(delay)

    async def _pull_once(self, mq: MessageQueue, st: QueueState) -> float:
        """DefaultLitePullConsumerImpl.PullTaskImpl.run: one pull into the cache."""
        cfg = self.config
        pq = st.pq
        if st.paused:
            return PAUSED_DELAY
        if self._requests.qsize() * cfg.pull_batch_size > cfg.pull_threshold_for_all or \
                pq.msg_count > cfg.pull_threshold_for_queue or \
                pq.msg_size > cfg.pull_threshold_size_for_queue * (1 << 20) or \
                pq.max_span() > cfg.consume_max_span:
            return FLOW_CONTROL_DELAY
        offset = await self._next_pull_offset(mq, st)
        if offset < 0:
            return cfg.pull_time_delay_millis_when_exception / 1000
        if self.mode == "SUBSCRIBE":
            sub = self.subscriptions.get(mq.topic)
            if sub is None:
                return 0
        else:
            sub = SubscriptionData.build(mq.topic, "*")
        result = await pull_kernel(self._inst(), self.group, mq, sub, offset, cfg.pull_batch_size,
                                   PULL_SUSPEND | PULL_SUBSCRIPTION | PULL_LITE, 0,
                                   cfg.broker_suspend_max_time_millis,
                                   cfg.consumer_timeout_millis_when_suspend / 1000)
        if pq.dropped:
            return 0
        if result.status is PullStatus.FOUND and result.msgs and st.seek_offset == -1:
            pq.put_messages(result.msgs)
            self._requests.put_nowait(ConsumeRequest(result.msgs, mq, pq))
        if st.seek_offset == -1:
            st.pull_offset = result.next_begin_offset
        if result.here:
            # read in this process (pull_kernel's doc): a poll
            # waiting for them gets them now, before the next pull reads again
            await asyncio.sleep(0)
        return 0

    async def _next_pull_offset(self, mq: MessageQueue, st: QueueState) -> int:
        if st.seek_offset != -1:
            offset, st.seek_offset = st.seek_offset, -1
            st.consume_offset = offset
            return offset
        if st.pull_offset == -1:
            st.pull_offset = await self._compute_pull_from_where(mq)
        return st.pull_offset

    # ------------------------------------------------------------ the application's calls
    async def poll(self, timeout: float | None = None) -> list[MessageExt]:
        """The next batch pulled, or [] after ``timeout`` seconds (default
        ``poll_timeout_millis``)."""
        self._inst()
        if timeout is None:
            timeout = self.config.poll_timeout_millis / 1000
        if timeout < 0:
            raise ValueError("Timeout must not be negative")
        if self.config.auto_commit and time.monotonic() >= self._next_auto_commit:
            self._commit_all()
            self._next_auto_commit = time.monotonic() + self.config.auto_commit_interval_millis / 1000
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    req = self._requests.get_nowait()
                else:
                    async with asyncio.timeout(left):
                        req = await self._requests.get()
            except (asyncio.QueueEmpty, TimeoutError):
                return []
            st = self.queues.get(req.mq)
            if req.pq.dropped or st is None or st.pq is not req.pq:
                continue
            offset = req.pq.remove_messages(req.msgs)
            if offset >= 0:
                st.consume_offset = offset
            return req.msgs

    def _commit_all(self) -> None:
        for mq, st in self.queues.items():
            if st.consume_offset != -1 and not st.pq.dropped:
                self.offset_store.update_offset(mq, st.consume_offset, False)

    async def commit_sync(self, offsets: dict[MessageQueue, int] | None = None,
                          persist: bool = True) -> None:
        """Commit what was polled (or ``offsets``) and, with ``persist``, store
        it on the broker (or the local file) before returning."""
        self._inst()
        if offsets is None:
            self._commit_all()
            mqs = [mq for mq, st in self.queues.items() if st.consume_offset != -1]
        else:
            for mq, offset in offsets.items():
                st = self.queues.get(mq)
                if offset != -1 and st is not None and not st.pq.dropped:
                    self.offset_store.update_offset(mq, offset, False)
            mqs = list(offsets)
        if persist:
            await asyncio.gather(*(self.offset_store.persist(mq) for mq in mqs))

    async def committed(self, mq: MessageQueue) -> int:
        """The committed offset of ``mq`` (-1 if none)."""
        self._inst()
        offset = await self.offset_store.read_offset(mq, ReadOffsetType.MEMORY_FIRST_THEN_STORE)
        if offset == -2:
            raise MQClientError(-1, f"Fetch consume offset of {mq} from broker exception")
        return offset

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """Poll ``mq`` from ``offset`` on; what was cached from it is dropped."""
        inst = self._inst()
        if mq not in self.queues:
            raise MQClientError(-1, f"The message queue is not in assigned list"
                                    f"{', may be rebalancing' if self.mode == 'SUBSCRIBE' else ''}, "
                                    f"message queue: {mq}")
        lo, hi = await min_offset(inst, mq), await max_offset(inst, mq)
        if not lo <= offset <= hi:
            raise MQClientError(-1, f"Seek offset illegal, seek offset = {offset}, "
                                    f"min offset = {lo}, max offset = {hi}")
        task = self._pull_tasks.get(mq)
        self._stop_pull(mq)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        old = self.queues[mq]
        old.pq.dropped = True                  # its cached batches are skipped by poll
        self.queues[mq] = QueueState(seek_offset=offset, paused=old.paused)
        self._start_pull(mq)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        await self.seek(mq, await min_offset(self._inst(), mq))

    async def seek_to_end(self, mq: MessageQueue) -> None:
        await self.seek(mq, await max_offset(self._inst(), mq))

    async def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The offset whose store time is nearest ``timestamp_ms`` (SEARCH_OFFSET_BY_TIMESTAMP)."""
        return await search_offset(self._inst(), mq, timestamp_ms)

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, from the NameServer."""
        route = await self._inst().route(topic, refresh=True)
        if route is None or not route.subscribe:
            raise MQClientError(-1, f"Can not find Message Queue for this topic, {topic}")
        return sorted(route.subscribe)

    # ------------------------------------------------------------ ClientInstance hooks
    def topics(self) -> list[str]:
        return sorted(set(self.subscriptions) | {mq.topic for mq in self._assigned})

    async def reset_offsets(self, topic: str, body: bytes) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET concerns push consumers only (as in RocketMQ)."""
        log.info("lite pull consumer %s ignores an offset reset of %s", self.group, topic)

    async def _persist_all(self) -> None:
        await self.offset_store.persist_all(set(self.queues))


__all__ = ["AsyncLitePullConsumer", "LitePullConsumerConfig"]
