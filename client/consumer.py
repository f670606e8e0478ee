"""Push consumers (asyncio): RocketMQ's DefaultMQPushConsumer.

``AsyncPushConsumer`` shares its subscriptions' queues with the rest of its
group (rebalanced at start, every ``rebalance_interval``, and at once when
the group or a route changes), long-polls each queue it holds into a
``ProcessQueue`` (flow-controlled) and hands the messages to its listener:
concurrently, with failed ones sent back to retry later and dead-lettered
after ``max_reconsume_times``; or orderly, one batch at a time per queue
under the queue's broker lock. Offsets commit as the smallest offset not
yet consumed. ``SubscriptionData``, ``ProcessQueue`` and ``pull_kernel``
serve the lite pull consumer too.
"""
from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import dataclasses
import enum
import inspect
import itertools
import logging
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import orjson

from shmq.core.layout import java_string_hash, properties_to_string
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.headers import PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION, PULL_SUSPEND, pull_ext, send_ext
from shmq.ipc.remoting import RemotingCommand

from . import rebalance
from .connection import RemotingError
from .instance import ClientConfig, ClientInstance, MQClientError
from .message import MAX_OFFSET, MIN_OFFSET, MessageExt, MessageQueue, decode_messages
from .offsets import (CONSUME_FROM_WHERE, LocalFileOffsetStore, OffsetStore, ReadOffsetType,
                      RemoteBrokerOffsetStore, compute_pull_from_where, default_consume_timestamp,
                      parse_consume_timestamp, parse_offset_table)
from .requests import send_back

log = logging.getLogger("shmq.client")
RETRY_PREFIX = "%RETRY%"
RETRY_TOPIC, ORIGIN_MESSAGE_ID, DELAY = "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "DELAY"
TRAN_MSG = "TRAN_MSG"
SYSFLAG_COMPRESSED = 0x1
GROUP_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")
FLOW_CONTROL_DELAY = 0.05                   # PULL_TIME_DELAY_MILLS_WHEN_CACHE_FLOW_CONTROL
SUSPENDED_DELAY = 1.0                       # PULL_TIME_DELAY_MILLS_WHEN_SUSPEND
SEND_BACK_RETRY_DELAY = 5.0                 # ConsumeMessageConcurrentlyService.submitConsumeRequestLater
SEND_BACK_TIMEOUT = 5.0
LOCK_TIMEOUT = 1.0
LOCK_INTERVAL = 20.0                        # ProcessQueue.REBALANCE_LOCK_INTERVAL
LOCK_MAX_LIVE = 30.0                        # ProcessQueue.REBALANCE_LOCK_MAX_LIVE_TIME
PULL_MAX_IDLE = 120.0                       # ProcessQueue.PULL_MAX_IDLE_TIME
UNLOCK_DELAY = 20.0                         # RebalancePushImpl.UNLOCK_DELAY_TIME_MILLS
MAX_TIME_CONSUME_CONTINUOUSLY = 60.0        # ConsumeMessageOrderlyService
INT_MAX = 2 ** 31 - 1                       # Integer.MAX_VALUE
_JAVA_BLANKS = "".join(map(chr, range(33)))  # what String.trim strips


# ------------------------------------------------------------ subscriptions
@dataclass
class SubscriptionData:
    """A topic's filter (FilterAPI.build): TAG (``*`` or ``a || b``) or SQL92."""
    topic: str
    sub_string: str
    expression_type: str = "TAG"
    tags_set: list[str] = field(default_factory=list)
    code_set: list[int] = field(default_factory=list)
    sub_version: int = field(default_factory=lambda: int(time.time() * 1000))

    @classmethod
    def build(cls, topic: str, expression: str | None = "*",
              expression_type: str | None = "TAG") -> "SubscriptionData":
        etype = (expression_type or "TAG").upper()
        if etype not in ("TAG", "SQL92"):
            raise ValueError(f"expression type {expression_type!r}: TAG or SQL92")
        if etype == "SQL92":
            if not expression:
                raise ValueError(f"Expression can't be null! {etype}")
            return cls(topic, expression, etype)
        if not expression or expression == "*":
            return cls(topic, "*")
        tags = []
        for piece in expression.split("||"):
            tag = piece.strip(_JAVA_BLANKS)
            if tag and tag not in tags:
                tags.append(tag)
        return cls(topic, expression, "TAG", tags, list(dict.fromkeys(map(java_string_hash, tags))))

    def to_json(self) -> dict:
        return {"classFilterMode": False, "topic": self.topic, "subString": self.sub_string,
                "tagsSet": self.tags_set, "codeSet": self.code_set, "subVersion": self.sub_version,
                "expressionType": self.expression_type}

    def accepts(self, msg: MessageExt) -> bool:
        """The client's second look (PullAPIWrapper.processPullResult): the
        broker matched tag hashes; keep only messages whose tag is listed."""
        return not self.tags_set or msg.tags in self.tags_set


# ------------------------------------------------------------ process queue
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


# ------------------------------------------------------------ pulling
class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


PULL_STATUS = {R.SUCCESS: PullStatus.FOUND, R.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
               R.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
               R.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL}


@dataclass
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    msgs: list[MessageExt]


async def _cancel(tasks) -> None:
    """Cancel ``tasks`` and wait until they have ended."""
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def pull_kernel(instance: ClientInstance, group: str, mq: MessageQueue, sub: SubscriptionData,
                      offset: int, max_nums: int, sysflag: int, commit_offset: int,
                      suspend_ms: int, timeout: float) -> PullResult:
    """PULL_MESSAGE and PullAPIWrapper.processPullResult: decode, keep the
    subscribed tags, note the queue's min/max offsets on each message.
    Raises MQClientError (a broker refusal) or RemotingError."""
    if instance.broker_addr(mq.broker_name) is None:
        await instance.route(mq.topic, refresh=True)
    ext = pull_ext(consumerGroup=group, topic=mq.topic, queueId=mq.queue_id, queueOffset=offset,
                   maxMsgNums=max_nums, sysFlag=sysflag, commitOffset=commit_offset,
                   suspendTimeoutMillis=suspend_ms, subVersion=sub.sub_version,
                   expressionType=sub.expression_type, bname=mq.broker_name,
                   subscription=sub.sub_string if sysflag & PULL_SUBSCRIPTION else None)
    r = await instance.invoke(mq.broker_name, RemotingCommand(RC.PULL_MESSAGE, ext=ext), timeout)
    status = PULL_STATUS.get(r.code)
    if status is None:
        raise MQClientError(r.code, r.remark, f"pull {mq} at {offset}")
    h = r.ext
    result = PullResult(status, int(h["nextBeginOffset"]), int(h.get("minOffset", 0)),
                        int(h.get("maxOffset", 0)), [])
    if status is PullStatus.FOUND:
        # one tuple for the pull's MIN_OFFSET/MAX_OFFSET, shared by its messages
        skipped: list = []
        msgs = decode_messages(r.body, mq.broker_name, (str(result.min_offset), str(result.max_offset)),
                               skipped=skipped)
        if skipped:
            result.next_begin_offset = _past_damage(msgs, skipped, offset, result.next_begin_offset)
            for qoff, why, _ in skipped:
                log.error("pull %s: %s (queue offset %s): a damaged record, skipped and not "
                          "delivered", mq, why, "unknown" if qoff is None else qoff)
        result.msgs = [m for m in msgs if sub.accepts(m)] if sub.tags_set else msgs
    return result


def _past_damage(msgs: list[MessageExt], skipped: list, offset: int, next_begin: int) -> int:
    """Where the queue goes on after a pull with damaged records: a record
    whose body alone was bad is skipped like a poison message (its
    neighbours were read); a broken frame hid what came after it, so the
    next pull starts past it — right after it when its queue offset is
    believable, else after the last good message, else (it came first) at
    the broker's next offset — so the queue never stops on it."""
    qoff, _, framed = skipped[-1]
    if framed:
        return next_begin
    if qoff is not None and offset <= qoff < next_begin:
        return qoff + 1
    return msgs[-1].queue_offset + 1 if msgs else next_begin


def restore_retry_topic(msgs: list[MessageExt], group: str) -> None:
    """A message from %RETRY%<group> shows its original topic
    (DefaultMQPushConsumerImpl.resetRetryAndNamespace)."""
    retry = RETRY_PREFIX + group
    for m in msgs:
        if m.topic == retry:
            original = m.properties.get(RETRY_TOPIC)
            if original:
                m.topic = original


# ------------------------------------------------------------ listeners
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


# ------------------------------------------------------------ configuration
@dataclass
class ConsumerSettings:
    """What DefaultMQPushConsumer and DefaultLitePullConsumer both have."""
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    consume_timestamp: str | int = field(default_factory=default_consume_timestamp)
    allocate_strategy: str | rebalance.AllocateStrategy = "AVG"
    pull_threshold_for_queue: int = 1000
    pull_threshold_size_for_queue: int = 100           # MiB
    consumer_timeout_millis_when_suspend: int = 30000
    rebalance_interval: float = 20.0                   # s; rocketmq.client.rebalance.waitInterval
    local_offset_store_dir: str = ""                   # broadcasting; "" = ~/.rocketmq_offsets

    def check(self) -> None:
        if self.message_model not in ("CLUSTERING", "BROADCASTING"):
            raise ValueError(f"message_model {self.message_model!r}: CLUSTERING or BROADCASTING")
        if self.consume_from_where not in CONSUME_FROM_WHERE:
            raise ValueError(f"consume_from_where {self.consume_from_where!r}: one of {CONSUME_FROM_WHERE}")
        parse_consume_timestamp(self.consume_timestamp)


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


def split_settings(settings: dict, config_class) -> tuple[dict, dict]:
    """Keyword settings → (ClientConfig ones, the consumer's own)."""
    client_names = {f.name for f in dataclasses.fields(ClientConfig)}
    own_names = {f.name for f in dataclasses.fields(config_class)}
    unknown = set(settings) - client_names - own_names
    if unknown:
        raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
    return ({k: v for k, v in settings.items() if k in client_names},
            {k: v for k, v in settings.items() if k in own_names})


def check_group(group: str) -> None:
    """Validators.checkGroup."""
    if not group or len(group) > 255 or not GROUP_NAME.match(group):
        raise MQClientError(-1, f"the consumer group {group!r} is not valid: up to 255 of "
                                f"letters, digits, %, |, _ and -")


@dataclass
class PullRequest:
    mq: MessageQueue
    pq: ProcessQueue
    next_offset: int
    previously_locked: bool = False


class ConsumerBase(abc.ABC):
    """What push and lite-pull consumers share: settings, start-up, the
    instance hooks, offset stores and service tasks."""

    consume_type = "CONSUME_PASSIVELY"

    def __init__(self, group: str, config, client: ClientConfig | None, namesrv_addr: str,
                 client_settings: dict):
        self.group = group
        self.config = config
        config.check()
        self.client_config = client or ClientConfig(**client_settings)
        if namesrv_addr:
            self.client_config.namesrv_addr = namesrv_addr
        self.strategy = rebalance.strategy_of(config.allocate_strategy)
        self.subscriptions: dict[str, SubscriptionData] = {}
        self.instance: ClientInstance | None = None
        self.offset_store: OffsetStore | None = None
        self.running = False
        self.start_ms = 0
        self._services: list[asyncio.Task] = []
        self._rebalance_wake = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()

    @property
    def clustering(self) -> bool:
        return self.config.message_model == "CLUSTERING"

    def _inst(self) -> ClientInstance:
        if self.instance is None or not self.running:
            raise MQClientError(-1, f"the consumer {self.group} is not running")
        return self.instance

    def _consume_timestamp_ms(self) -> int:
        return parse_consume_timestamp(self.config.consume_timestamp)

    async def _start_instance(self) -> None:
        """Routes, offset store, registration (a heartbeat) and the SQL92 check."""
        check_group(self.group)
        self.instance = inst = ClientInstance.get(self.client_config)
        if self.clustering:
            self.offset_store = RemoteBrokerOffsetStore(inst, self.group)
        else:
            self.offset_store = LocalFileOffsetStore(inst.client_id, self.group,
                                                     self.config.local_offset_store_dir)
        await self.offset_store.load()
        for topic in self.topics():
            try:
                await inst.route(topic)
            except (RemotingError, MQClientError) as e:
                log.warning("route of %s: %s", topic, e)
        await inst.register("consumer", self.group, self)
        self.running = True
        self.start_ms = int(time.time() * 1000)
        try:
            await self._check_client_in_broker()
        except BaseException:
            self.running = False
            await inst.unregister("consumer", self.group)
            raise

    async def _check_client_in_broker(self) -> None:
        """CHECK_CLIENT_CONFIG for each SQL92 subscription: a broker that cannot
        apply it fails start() (MQClientInstance.checkClientInBroker)."""
        inst = self._inst()
        for sub in self.subscriptions.values():
            if sub.expression_type == "TAG":
                continue
            body = orjson.dumps({"clientId": inst.client_id, "group": self.group,
                                 "subscriptionData": sub.to_json()})
            for addr in inst.broker_addrs():
                conn = await inst.connection(addr)
                r = await conn.invoke(RemotingCommand(RC.CHECK_CLIENT_CONFIG, body=body),
                                      inst.config.request_timeout)
                if r.code != R.SUCCESS:
                    raise MQClientError(r.code, r.remark,
                                        f"Check client in broker error, maybe because you use "
                                        f"{sub.expression_type} to filter message, but server has "
                                        f"not been upgraded to support")

    def _spawn_services(self, *coros: Awaitable) -> None:
        loop = asyncio.get_running_loop()
        self._services += [loop.create_task(c) for c in coros]

    async def _stop_services(self) -> None:
        await _cancel(self._services)
        self._services = []

    async def _every(self, period: float, fn: Callable[[], Awaitable], first: float | None = None) -> None:
        await asyncio.sleep(period if first is None else first)
        while True:
            try:
                await fn()
            except (RemotingError, MQClientError) as e:
                log.warning("%s of %s: %s", fn.__name__, self.group, e)
            except Exception:
                log.exception("%s of %s", fn.__name__, self.group)
            await asyncio.sleep(period)

    async def _rebalance_service(self) -> None:
        """RebalanceService: every ``rebalance_interval``, or at once when woken."""
        while True:
            try:      # asyncio.timeout: wait_for may swallow a cancellation (3.11)
                async with asyncio.timeout(self.config.rebalance_interval):
                    await self._rebalance_wake.wait()
            except TimeoutError:
                pass
            self._rebalance_wake.clear()
            try:
                await self.do_rebalance()
            except Exception:
                log.exception("rebalance of %s", self.group)

    @abc.abstractmethod
    async def do_rebalance(self) -> None:
        """Re-allocate this consumer's queues (push and lite pull differ)."""

    async def _allocate(self, topic: str) -> tuple[set[MessageQueue], set[MessageQueue]] | None:
        try:
            return await rebalance.allocate(self._inst(), self.group, topic,
                                            self.config.message_model, self.strategy)
        except (RemotingError, MQClientError, ValueError) as e:
            if not topic.startswith(RETRY_PREFIX):
                log.warning("rebalance %s of %s: %s", topic, self.group, e)
            return None

    async def _compute_pull_from_where(self, mq: MessageQueue) -> int:
        return await compute_pull_from_where(self._inst(), self.offset_store, mq,
                                             self.config.consume_from_where,
                                             self._consume_timestamp_ms())

    # ------------------------------------------------------------ ClientInstance hooks
    def topics(self) -> list[str]:
        return list(self.subscriptions)

    def consumer_data(self) -> dict:
        return {"groupName": self.group, "consumeType": self.consume_type,
                "messageModel": self.config.message_model,
                "consumeFromWhere": self.config.consume_from_where,
                "subscriptionDataSet": [s.to_json() for s in self.subscriptions.values()],
                "unitMode": False}

    def rebalance_soon(self) -> None:
        self._rebalance_wake.set()

    def running_info(self) -> dict:
        """ConsumerRunningInfo's properties and subscriptions."""
        props = {k: str(v) if not callable(v) else rebalance.strategy_name(v)
                 for k, v in dataclasses.asdict(self.config).items()}
        props.update({"PROP_NAMESERVER_ADDR": ";".join(self.client_config.namesrv_list()),
                      "PROP_CONSUME_TYPE": self.consume_type,
                      "PROP_CONSUMER_START_TIMESTAMP": str(self.start_ms),
                      "PROP_CLIENT_VERSION": "V4_9_7"})
        return {"properties": props,
                "subscriptionSet": [s.to_json() for s in self.subscriptions.values()]}


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
        self.paused = False
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self._pull_tasks: dict[MessageQueue, asyncio.Task] = {}
        self._work: set[asyncio.Task] = set()      # listener calls and what they lead to
        self._timers: set[asyncio.Task] = set()    # sleeps before some work
        self._slots: asyncio.Semaphore | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._listener_is_async = False
        self._stopping = False

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
        self.orderly = isinstance(listener, MessageListenerOrderly)
        fn = listener.consume_message
        self._listener_is_async = inspect.iscoroutinefunction(fn)

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
        self._slots = asyncio.Semaphore(self.config.consume_thread_max)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            self.config.consume_thread_max, thread_name_prefix=f"ConsumeMessageThread_{self.group}")
        try:
            await self._start_instance()
        except BaseException:
            self._executor.shutdown(wait=False)
            raise
        interval = self.client_config.persist_consumer_offset_interval
        self._spawn_services(self._rebalance_service(),
                             self._every(interval, self._persist_all))
        if self.orderly and self.clustering:
            self._spawn_services(self._every(LOCK_INTERVAL, self._lock_all, first=1.0))
        await self.do_rebalance()

    async def shutdown(self) -> None:
        """Stop pulling, let in-flight listeners finish (up to
        ``await_termination_millis_when_shutdown``), persist offsets, unlock
        orderly queues and leave the group."""
        if not self.running:
            return
        self._stopping = True
        await self._stop_services()
        async with self._rebalance_lock:           # no rebalance (or reset) is half done
            await _cancel(self._timers)
            await _cancel(self._pull_tasks.values())
            self._pull_tasks.clear()
        if self._work:
            await asyncio.wait(self._work, timeout=self.config.await_termination_millis_when_shutdown / 1000)
        await _cancel(self._work)
        await _cancel(self._timers)          # set by work that ended meanwhile
        await self._persist_all()
        if self.orderly and self.clustering:
            await self._unlock_all()
        for pq in self.process_queues.values():
            pq.dropped = True
        self.process_queues.clear()
        self.running = False
        await self.instance.unregister("consumer", self.group)
        self._executor.shutdown(wait=False)

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
        t = asyncio.get_running_loop().create_task(coro)
        self._timers.add(t)
        t.add_done_callback(self._timers.discard)

    def _spawn_work(self, coro: Awaitable) -> None:
        t = asyncio.get_running_loop().create_task(coro)
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
            if self.orderly and self.clustering and not await self._lock(mq):
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
                self._spawn_timer(self._later(UNLOCK_DELAY, lambda: self._unlock([mq])))
            else:
                await self._unlock([mq])
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

    def _lock_body(self, mqs: list[MessageQueue]) -> bytes:
        return orjson.dumps({"consumerGroup": self.group, "clientId": self._inst().client_id,
                             "mqSet": [mq.to_json() for mq in mqs]})

    async def _lock_batch(self, broker: str, mqs: list[MessageQueue]) -> set[MessageQueue]:
        r = await self._inst().invoke(broker, RemotingCommand(RC.LOCK_BATCH_MQ, body=self._lock_body(mqs)),
                                      LOCK_TIMEOUT)
        if r.code != R.SUCCESS:
            raise MQClientError(r.code, r.remark, f"lock {len(mqs)} queues on {broker}")
        locked = {MessageQueue(d["topic"], d["brokerName"], int(d["queueId"]))
                  for d in orjson.loads(r.body).get("lockOKMQSet") or []}
        now = time.monotonic()
        for mq in mqs:
            pq = self.process_queues.get(mq)
            if pq is not None:
                pq.locked = mq in locked
                if pq.locked:
                    pq.last_lock_time = now
        return locked

    async def _lock(self, mq: MessageQueue) -> bool:
        try:
            return mq in await self._lock_batch(mq.broker_name, [mq])
        except (RemotingError, MQClientError) as e:
            log.warning("lock %s for %s: %s", mq, self.group, e)
            return False

    async def _lock_all(self) -> None:
        """RebalanceImpl.lockAll: renew the lease of every queue held."""
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in self.process_queues:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for broker, mqs in by_broker.items():
            await self._lock_batch(broker, mqs)

    async def _unlock(self, mqs: list[MessageQueue]) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for broker, group in by_broker.items():
            try:
                await self._inst().invoke(broker, RemotingCommand(RC.UNLOCK_BATCH_MQ,
                                                                  body=self._lock_body(group)), LOCK_TIMEOUT)
            except (RemotingError, MQClientError) as e:
                log.warning("unlock %d queues on %s for %s: %s", len(group), broker, self.group, e)
        for mq in mqs:
            pq = self.process_queues.get(mq)
            if pq is not None:
                pq.locked = False

    async def _unlock_all(self) -> None:
        await self._unlock(list(self.process_queues))

    # ------------------------------------------------------------ pulling
    def _start_pull(self, req: PullRequest) -> None:
        self._pull_tasks[req.mq] = asyncio.get_running_loop().create_task(self._pull_loop(req))

    async def _pull_loop(self, req: PullRequest) -> None:
        while not req.pq.dropped:
            try:
                delay = await self._pull_once(req)
            except Exception:
                log.exception("pull %s for %s", req.mq, self.group)
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
                                       cfg.consumer_timeout_millis_when_suspend / 1000)
        except (RemotingError, MQClientError) as e:
            if not mq.topic.startswith(RETRY_PREFIX):
                log.warning("pull %s for %s: %s", mq, self.group, e)
            return error_delay
        if pq.dropped:
            return 0
        if result.status is PullStatus.FOUND:
            req.next_offset = result.next_begin_offset
            if not result.msgs:
                return 0
            dispatch = pq.put_messages(result.msgs)
            if self.orderly:
                if dispatch:
                    self._spawn_work(self._consume_orderly(pq, mq))
            else:
                self._submit_concurrently(result.msgs, pq, mq)
            return cfg.pull_interval / 1000
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
    async def _call_listener(self, msgs: list[MessageExt], context) -> Any:
        """Run the listener (on the loop if it is a coroutine function, else in
        the consume thread pool); an exception counts as no status (None)."""
        fn = self.listener.consume_message
        try:
            if self._listener_is_async:
                status = await fn(msgs, context)
            else:
                status = await asyncio.get_running_loop().run_in_executor(self._executor, fn, msgs, context)
                if inspect.isawaitable(status):
                    status = await status
        except Exception:
            log.exception("the listener of %s raised on %d messages of %s", self.group, len(msgs),
                          context.message_queue)
            return None
        return status

    def _submit_concurrently(self, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue) -> None:
        n = self.config.consume_message_batch_max_size
        for i in range(0, len(msgs), n):
            self._spawn_work(self._consume_concurrently(msgs[i:i + n], pq, mq))

    async def _consume_concurrently(self, msgs: list[MessageExt], pq: ProcessQueue,
                                    mq: MessageQueue) -> None:
        """ConsumeMessageConcurrentlyService.ConsumeRequest."""
        async with self._slots:
            if pq.dropped or self._stopping:
                return
            if mq.topic.startswith(RETRY_PREFIX):      # a queue's records carry its topic
                restore_retry_topic(msgs, self.group)
            context = ConsumeConcurrentlyContext(mq)
            status = await self._call_listener(msgs, context)
        if not isinstance(status, ConsumeConcurrentlyStatus):
            if status is not None:
                log.warning("the listener of %s returned %r: RECONSUME_LATER", self.group, status)
            status = ConsumeConcurrentlyStatus.RECONSUME_LATER
        if not pq.dropped:
            await self._process_consume_result(status, context, msgs, pq, mq)

    async def _process_consume_result(self, status: ConsumeConcurrentlyStatus,
                                      context: ConsumeConcurrentlyContext, msgs: list[MessageExt],
                                      pq: ProcessQueue, mq: MessageQueue) -> None:
        ack = min(context.ack_index, len(msgs) - 1) \
            if status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS else -1
        failed = msgs[ack + 1:]
        if failed and not self.clustering:
            log.warning("broadcasting %s: %d messages failed and are dropped", self.group, len(failed))
        elif failed:
            back_failed = []
            for m in failed:
                if not await self._send_message_back(m, context.delay_level_when_next_consume,
                                                     mq.broker_name):
                    m.reconsume_times += 1
                    back_failed.append(m)
            if back_failed:
                msgs = [m for m in msgs if m not in back_failed]
                self._spawn_timer(self._later(SEND_BACK_RETRY_DELAY,
                                              lambda: self._resubmit(back_failed, pq, mq)))
        offset = pq.remove_messages(msgs)
        if offset >= 0 and not pq.dropped:
            self.offset_store.update_offset(mq, offset, True)

    async def _resubmit(self, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue) -> None:
        self._submit_concurrently(msgs, pq, mq)

    async def _send_message_back(self, msg: MessageExt, delay_level: int, broker_name: str) -> bool:
        """CONSUMER_SEND_MSG_BACK; if the broker cannot take it, a re-send to
        %RETRY%<group> (DefaultMQPushConsumerImpl.sendMessageBack)."""
        cmd = send_back(self.group, msg.commit_log_offset, delay_level, self.max_reconsume_times(),
                        origin_msg_id=msg.msg_id, origin_topic=msg.topic)
        cmd.ext["bname"] = broker_name
        try:
            r = await self._inst().invoke(broker_name, cmd, SEND_BACK_TIMEOUT)
            if r.code == R.SUCCESS:
                return True
            error: Exception = MQClientError(r.code, r.remark, "send back")
        except (RemotingError, MQClientError) as e:
            error = e
        log.warning("send back %s of %s: %s; re-sending it to the retry topic", msg.msg_id,
                    self.group, error)
        return await self._send_to_retry_topic(msg, msg.reconsume_times + 1, broker_name)

    async def _send_to_retry_topic(self, msg: MessageExt, reconsume_times: int, broker_name: str) -> bool:
        """A new message to %RETRY%<group> carrying the original's properties;
        the broker sends it to %DLQ%<group> once ``reconsume_times`` reaches
        the maximum (the fallback of sendMessageBack, and how orderly gives up)."""
        props = {k: v for k, v in msg.properties.items() if k not in (MIN_OFFSET, MAX_OFFSET, TRAN_MSG)}
        props.setdefault(ORIGIN_MESSAGE_ID, msg.msg_id)
        props[RETRY_TOPIC] = msg.topic
        props[DELAY] = str(3 + msg.reconsume_times)
        body, sysflag = msg.body, 0
        if len(body) > 4096:
            body, sysflag = zlib.compress(body, 5), SYSFLAG_COMPRESSED
        topic = RETRY_PREFIX + self.group
        cmd = RemotingCommand(RC.SEND_MESSAGE_V2, body=body, ext=send_ext(
            producerGroup=self.group, topic=topic, defaultTopic="TBW102", defaultTopicQueueNums=4,
            queueId=-1, sysFlag=sysflag, bornTimestamp=int(time.time() * 1000), flag=msg.flag,
            properties=properties_to_string(props), reconsumeTimes=reconsume_times,
            unitMode=False, maxReconsumeTimes=self.max_reconsume_times(), batch=False))
        try:
            r = await self._inst().invoke(broker_name, cmd, SEND_BACK_TIMEOUT)
        except (RemotingError, MQClientError) as e:
            log.warning("re-send %s of %s to %s: %s", msg.msg_id, self.group, topic, e)
            return False
        if r.code != R.SUCCESS:
            log.warning("re-send %s of %s to %s: code %d, %s", msg.msg_id, self.group, topic,
                        r.code, r.remark)
        return r.code == R.SUCCESS

    async def _consume_orderly(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        """ConsumeMessageOrderlyService.ConsumeRequest: the queue's messages in
        order, while its lock is held (clustering)."""
        async with pq.order_lock:
            if pq.dropped or self._stopping:
                return
            if self.clustering and (not pq.locked or pq.is_lock_expired()):
                self._spawn_timer(self._try_lock_later_and_reconsume(mq, pq, 0.1))
                return
            began = time.monotonic()
            batch = self.config.consume_message_batch_max_size
            while not pq.dropped and not self._stopping:
                if self.clustering and (not pq.locked or pq.is_lock_expired()):
                    self._spawn_timer(self._try_lock_later_and_reconsume(mq, pq, 0.01))
                    return
                if time.monotonic() - began > MAX_TIME_CONSUME_CONTINUOUSLY:
                    self._submit_orderly_later(pq, mq, 10)
                    return
                msgs = pq.take_messages(batch)
                if not msgs:
                    return
                if mq.topic.startswith(RETRY_PREFIX):
                    restore_retry_topic(msgs, self.group)
                context = ConsumeOrderlyContext(mq)
                async with pq.consume_lock:
                    if pq.dropped:
                        return
                    async with self._slots:
                        status = await self._call_listener(msgs, context)
                if not isinstance(status, ConsumeOrderlyStatus):
                    if status is not None:
                        log.warning("the orderly listener of %s returned %r: suspending",
                                    self.group, status)
                    status = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                if not await self._process_orderly_result(msgs, status, context, pq, mq):
                    return

    async def _process_orderly_result(self, msgs: list[MessageExt], status: ConsumeOrderlyStatus,
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
            self._submit_orderly_later(pq, mq, context.suspend_current_queue_time_millis)
            go_on = False
        else:
            commit_offset = pq.commit()
        if commit_offset >= 0 and not pq.dropped:
            self.offset_store.update_offset(mq, commit_offset, False)
        return go_on

    async def _check_reconsume_times(self, msgs: list[MessageExt], mq: MessageQueue) -> bool:
        """True if the batch is to be retried here; a message retried
        max_reconsume_times already goes to the dead-letter path instead."""
        suspend = False
        for m in msgs:
            if m.reconsume_times >= self.max_reconsume_times():
                if not await self._send_to_retry_topic(m, m.reconsume_times, mq.broker_name):
                    suspend = True
                    m.reconsume_times += 1
            else:
                suspend = True
                m.reconsume_times += 1
        return suspend

    def _submit_orderly_later(self, pq: ProcessQueue, mq: MessageQueue, millis: int) -> None:
        if millis == -1:
            millis = self.config.suspend_current_queue_time_millis
        delay = min(max(millis, 10), 30000) / 1000
        self._spawn_timer(self._later(delay, lambda: self._consume_orderly(pq, mq)))

    async def _try_lock_later_and_reconsume(self, mq: MessageQueue, pq: ProcessQueue, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._stopping:
            return
        locked = await self._lock(mq)
        self._submit_orderly_later(pq, mq, 10 if locked else 3000)


__all__ = ["AsyncPushConsumer", "ConsumeConcurrentlyContext", "ConsumeConcurrentlyStatus",
           "ConsumeOrderlyContext", "ConsumeOrderlyStatus", "MessageListenerConcurrently",
           "MessageListenerOrderly", "ProcessQueue", "PullResult", "PullStatus",
           "PushConsumerConfig", "SubscriptionData", "pull_kernel"]
