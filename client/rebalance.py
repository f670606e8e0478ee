"""Which queues each consumer of a group takes (RocketMQ's AllocateMessageQueueStrategy
and the allocation step of RebalanceImpl).

A strategy is a pure function ``(group, current_cid, mq_all, cid_all) ->
list[MessageQueue]`` returning exactly what the Java 4.9 strategy of the
same name returns for the same inputs (RebalanceImpl sorts both lists
first): ``averagely`` (AVG), ``averagely_by_circle`` (AVG_BY_CIRCLE),
``consistent_hash`` (CONSISTENT_HASH: an MD5 ring with ``virtual_node_cnt``
nodes per client) and ``by_config(queues)`` (CONFIG). ``allocate`` asks a
broker for the group's members and applies one to a topic's queues.
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import random
from typing import Callable, Sequence

import orjson

from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand

from .instance import ClientInstance, MQClientError
from .message import MessageQueue

AllocateStrategy = Callable[[str, str, list[MessageQueue], list[str]], list[MessageQueue]]


def _check(current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]) -> bool:
    """AbstractAllocateMessageQueueStrategy.check: empty inputs are errors; a
    client that is not (yet) a member gets nothing."""
    if not current_cid:
        raise ValueError("currentCID is empty")
    if not mq_all:
        raise ValueError("mqAll is null or mqAll empty")
    if not cid_all:
        raise ValueError("cidAll is null or cidAll empty")
    return current_cid in cid_all


def averagely(group: str, current_cid: str, mq_all: list[MessageQueue],
              cid_all: list[str]) -> list[MessageQueue]:
    """AllocateMessageQueueAveragely: consecutive blocks, the first
    ``len(mq_all) % len(cid_all)`` clients one queue more."""
    if not _check(current_cid, mq_all, cid_all):
        return []
    index, n, m = cid_all.index(current_cid), len(mq_all), len(cid_all)
    mod = n % m
    if n <= m:
        size = 1
    else:
        size = n // m + 1 if mod > 0 and index < mod else n // m
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [mq_all[(start + i) % n] for i in range(min(size, n - start))]


def averagely_by_circle(group: str, current_cid: str, mq_all: list[MessageQueue],
                        cid_all: list[str]) -> list[MessageQueue]:
    """AllocateMessageQueueAveragelyByCircle: every ``len(cid_all)``-th queue."""
    if not _check(current_cid, mq_all, cid_all):
        return []
    index = cid_all.index(current_cid)
    return mq_all[index::len(cid_all)]


def md5_hash(key: str) -> int:
    """ConsistentHashRouter.MD5Hash: the first 4 bytes of MD5(key), unsigned."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")


def queue_key(mq: MessageQueue) -> str:
    """MessageQueue.toString(), the key a queue is hashed by."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


def consistent_hash(group: str, current_cid: str, mq_all: list[MessageQueue], cid_all: list[str],
                    virtual_node_cnt: int = 10,
                    hash_function: Callable[[str], int] = md5_hash) -> list[MessageQueue]:
    """AllocateMessageQueueConsistentHash: each client is ``virtual_node_cnt``
    points ``"<cid>-<i>"`` on a hash ring (a later point overwrites an equal
    earlier one, as a TreeMap put does); a queue belongs to the first point
    at or after its hash, wrapping round. Another count:
    ``functools.partial(consistent_hash, virtual_node_cnt=n)``."""
    if virtual_node_cnt < 0:
        raise ValueError(f"illegal virtualNodeCnt :{virtual_node_cnt}")
    if not _check(current_cid, mq_all, cid_all):
        return []
    ring: dict[int, str] = {}
    for cid in cid_all:
        existing = sum(1 for owner in ring.values() if owner == cid)
        for i in range(virtual_node_cnt):
            ring[hash_function(f"{cid}-{i + existing}")] = cid
    if not ring:
        return []
    points = sorted(ring)
    mine = []
    for mq in mq_all:
        i = bisect.bisect_left(points, hash_function(queue_key(mq)))
        if ring[points[i % len(points)]] == current_cid:
            mine.append(mq)
    return mine


def by_config(queues: list[MessageQueue]) -> AllocateStrategy:
    """AllocateMessageQueueByConfig: always ``queues``, whoever asks."""
    def allocate(group: str, current_cid: str, mq_all: list[MessageQueue],
                 cid_all: list[str]) -> list[MessageQueue]:
        return list(queues)
    return allocate


STRATEGIES: dict[str, AllocateStrategy] = {
    "AVG": averagely, "AVG_BY_CIRCLE": averagely_by_circle, "CONSISTENT_HASH": consistent_hash}


def strategy_of(strategy: str | AllocateStrategy) -> AllocateStrategy:
    """A strategy function, or its RocketMQ name (AVG, AVG_BY_CIRCLE, CONSISTENT_HASH)."""
    if callable(strategy):
        return strategy
    try:
        return STRATEGIES[strategy]
    except KeyError:
        raise ValueError(f"allocate strategy {strategy!r}: one of {sorted(STRATEGIES)} "
                         f"or a function") from None


def strategy_name(strategy: AllocateStrategy) -> str:
    for name, fn in STRATEGIES.items():
        if strategy is fn:
            return name
    if isinstance(strategy, functools.partial):
        return strategy_name(strategy.func)
    return getattr(strategy, "__name__", "CUSTOM")


async def consumer_ids(instance: ClientInstance, topic: str, group: str) -> list[str]:
    """GET_CONSUMER_LIST_BY_GROUP to one broker of the topic (MQClientInstance.findConsumerIdList);
    [] when the broker knows no member."""
    route = await instance.route(topic)
    names = [n for n, addrs in route.broker_addrs.items() if addrs] if route else []
    if not names:
        raise MQClientError(R.SYSTEM_ERROR, f"no broker serves {topic}")
    r = await instance.invoke(random.choice(names),
                              RemotingCommand(RC.GET_CONSUMER_LIST_BY_GROUP, ext={"consumerGroup": group}))
    if r.code != R.SUCCESS:
        return []
    return list(orjson.loads(r.body).get("consumerIdList") or [])


async def allocate(instance: ClientInstance, group: str, topic: str, message_model: str,
                   strategy: AllocateStrategy) -> tuple[set[MessageQueue], set[MessageQueue]] | None:
    """RebalanceImpl.rebalanceByTopic's choice: (the topic's readable queues,
    those this client should hold), or None when it cannot be known now (no
    route yet, no member list)."""
    route = await instance.route(topic)
    if route is None or not route.subscribe:
        return None
    mq_set = set(route.subscribe)
    if message_model == "BROADCASTING":
        return mq_set, mq_set
    cids = await consumer_ids(instance, topic, group)
    if not cids:
        return None
    mine = strategy(group, instance.client_id, sorted(mq_set), sorted(cids))
    return mq_set, set(mine or ())


__all__ = ["AllocateStrategy", "STRATEGIES", "allocate", "averagely", "averagely_by_circle",
           "by_config", "consistent_hash", "consumer_ids", "md5_hash", "queue_key",
           "strategy_of"]
