"""What push and lite pull consumers share: settings, start-up, the group's
rebalance service, offset stores, and the background tasks' error policy.

``ConsumerSettings`` holds the settings DefaultMQPushConsumer and
DefaultLitePullConsumer both have (each consumer's config extends it);
``split_settings`` sorts a consumer's keyword settings into ClientConfig's
and its own. ``ConsumerBase`` starts a consumer on its ``ClientInstance``
(routes, offset store, registration by heartbeat, the SQL92 check), runs
its services (the rebalance service, periodic work) as watched tasks
(background.py), and is what the instance calls back (``topics``,
``consumer_data``, ``rebalance_soon``, ``running_info``, ``reset_offsets``).

A forked child (``os.fork``, multiprocessing's fork) holds a copy of a
consumer that is not its own: its tasks, pulls, listener threads and
queue locks are the parent's, which goes on consuming. The child's copy
is stopped at once (``_inherited``, by the producers' fork hook,
``instance.inherit_at_fork``): ``shutdown()`` there returns without
touching the parent's (no offsets persisted from the stale copy, no
unlocking, no unregistering), and ``start()`` there makes it a consumer
of the child's own, as a new one. Fork outside a running event loop, as
for producers.

A bug in any background task of the consumer (or of its instance) is
recorded as ``failure`` — the first one, logged at ERROR where it happened —
and ``shutdown()`` raises it as ``BackgroundFailure`` after cleaning up.
How a consumer allocates and pulls its queues is the subclass's.
"""
from __future__ import annotations

import abc
import asyncio
import dataclasses
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import orjson

from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand

from . import background, rebalance
from .errors import EXPECTED, BackgroundFailure, MQClientError, RemotingError
from .instance import ClientConfig, ClientInstance, inherit_at_fork, split_settings, with_settings
from .message import MessageQueue
from .offsets import (CONSUME_FROM_WHERE, LocalFileOffsetStore, OffsetStore, RemoteBrokerOffsetStore,
                      compute_pull_from_where, default_consume_timestamp, parse_consume_timestamp)
from .retry import RETRY_PREFIX
from .subscription import SubscriptionData

log = logging.getLogger("shmq.client")
GROUP_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")


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


def check_group(group: str) -> None:
    """Validators.checkGroup."""
    if not group or len(group) > 255 or not GROUP_NAME.match(group):
        raise MQClientError(-1, f"the consumer group {group!r} is not valid: up to 255 of "
                                f"letters, digits, %, |, _ and -")


class ConsumerBase(abc.ABC):
    """What push and lite-pull consumers share: settings, start-up, the
    instance hooks, offset stores and service tasks."""

    consume_type = "CONSUME_PASSIVELY"

    def __init__(self, group: str, config, client: ClientConfig | None, namesrv_addr: str,
                 client_settings: dict):
        self.group = group
        self.config = config
        config.check()
        if namesrv_addr:
            client_settings = {**client_settings, "namesrv_addr": namesrv_addr}
        self.client_config = with_settings(client, client_settings)
        self.strategy = rebalance.strategy_of(config.allocate_strategy)
        self.subscriptions: dict[str, SubscriptionData] = {}
        self.instance: ClientInstance | None = None
        self.offset_store: OffsetStore | None = None
        self.running = False
        self.start_ms = 0
        self.failure: BaseException | None = None    # the first bug a background task met
        self._failed_in = ""
        self._services: list[asyncio.Task] = []
        self._rebalance_wake = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        inherit_at_fork(self)

    def _inherited(self) -> None:
        """In a forked child: stopped, holding nothing of the parent's (see
        the module doc); the subclass drops its own state too."""
        self.running = False
        self.instance = None
        self.offset_store = None
        self._services = []
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
        self.failure, self._failed_in = None, ""
        while True:
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
            # the last member of the instance left meanwhile and closed it (its
            # loops stopped, its connections refused): start on a new one
            if not inst.stopped:
                break
        await inst.register("consumer", self.group, self)   # (no await before it joins)
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

    # ------------------------------------------------------------ background tasks
    def record_failure(self, what: str, exc: BaseException) -> None:
        """A background task (ours or our instance's) stopped on a bug: keep
        the first, for ``shutdown()`` to raise (background.watch logged it)."""
        if self.failure is None:
            self.failure, self._failed_in = exc, what

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise BackgroundFailure(f"{self._failed_in} stopped on a bug: "
                                    f"{type(self.failure).__name__}: {self.failure}") from self.failure

    def _spawn(self, coro: Awaitable, what: str) -> asyncio.Task:
        return background.spawn(coro, what, self.record_failure)

    def _spawn_services(self, *named: tuple[Awaitable, str]) -> None:
        self._services += [self._spawn(coro, what) for coro, what in named]

    async def _stop_services(self) -> None:
        await background.cancel(self._services)
        self._services = []

    def _every(self, period: float, fn: Callable[[], Awaitable],
               first: float | None = None) -> tuple[Awaitable, str]:
        what = f"{fn.__name__.lstrip('_')} of {self.group}"
        return background.every(period, fn, what, first), what

    def _rebalance_service(self) -> tuple[Awaitable, str]:
        return self._rebalance_loop(), f"the rebalance service of {self.group}"

    async def _rebalance_loop(self) -> None:
        """RebalanceService: every ``rebalance_interval``, or at once when
        woken; an expected error waits for the next turn, a bug ends it."""
        while True:
            try:      # asyncio.timeout: wait_for may swallow a cancellation (3.11)
                async with asyncio.timeout(self.config.rebalance_interval):
                    await self._rebalance_wake.wait()
            except TimeoutError:
                pass
            self._rebalance_wake.clear()
            try:
                await self.do_rebalance()
            except EXPECTED as e:
                log.warning("rebalance of %s: %s; again in %g s", self.group, e,
                            self.config.rebalance_interval)

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


__all__ = ["ConsumerBase", "ConsumerSettings", "check_group", "split_settings"]
