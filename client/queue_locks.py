"""Orderly consumption's leases on broker queues (RebalanceImpl.lock/lockAll/unlock).

In clustering mode an orderly push consumer consumes a queue only while the
broker says the queue is locked to it: LOCK_BATCH_MQ answers the subset of
the asked queues this client now holds, each for the broker's lease time
(60 s); the consumer renews its whole set every ``LOCK_INTERVAL`` (20 s)
and treats a lease older than ``LOCK_MAX_LIVE`` (30 s) as lost
(process_queue.py). UNLOCK_BATCH_MQ lets queues go at a rebalance and at
shutdown. The result of each lock lands on the queue's ``ProcessQueue``
(``locked``, ``last_lock_time``), which the orderly consume service reads.

``lock`` and ``unlock`` swallow a broker that is gone or refuses (logged:
the queue just stays unlocked); ``lock_all``, the periodic renewal, raises
it for its background loop to warn about.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import orjson

from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand

from .errors import MQClientError, RemotingError
from .instance import ClientInstance
from .message import MessageQueue
from .process_queue import ProcessQueue

log = logging.getLogger("shmq.client")
LOCK_TIMEOUT = 1.0


class QueueLocks:
    """The broker locks of one consumer group's held queues (``held``: the
    consumer's own map of queue → ProcessQueue, read as it changes)."""

    def __init__(self, group: str, instance: Callable[[], ClientInstance],
                 held: dict[MessageQueue, ProcessQueue]):
        self.group = group
        self._instance = instance
        self.held = held

    def _body(self, mqs: list[MessageQueue]) -> bytes:
        return orjson.dumps({"consumerGroup": self.group, "clientId": self._instance().client_id,
                             "mqSet": [mq.to_json() for mq in mqs]})

    async def lock_batch(self, broker: str, mqs: list[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ on ``broker``: the queues now locked to us, noted on
        their process queues. Raises MQClientError or RemotingError."""
        r = await self._instance().invoke(broker, RemotingCommand(RC.LOCK_BATCH_MQ, body=self._body(mqs)),
                                          LOCK_TIMEOUT)
        if r.code != R.SUCCESS:
            raise MQClientError(r.code, r.remark, f"lock {len(mqs)} queues on {broker}")
        locked = {MessageQueue(d["topic"], d["brokerName"], int(d["queueId"]))
                  for d in orjson.loads(r.body).get("lockOKMQSet") or []}
        now = time.monotonic()
        for mq in mqs:
            pq = self.held.get(mq)
            if pq is not None:
                pq.locked = mq in locked
                if pq.locked:
                    pq.last_lock_time = now
        return locked

    async def lock(self, mq: MessageQueue) -> bool:
        try:
            return mq in await self.lock_batch(mq.broker_name, [mq])
        except (RemotingError, MQClientError) as e:
            log.warning("lock %s for %s: %s", mq, self.group, e)
            return False

    async def lock_all(self) -> None:
        """RebalanceImpl.lockAll: renew the lease of every queue held."""
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in self.held:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for broker, mqs in by_broker.items():
            await self.lock_batch(broker, mqs)

    async def unlock(self, mqs: list[MessageQueue]) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for broker, group in by_broker.items():
            try:
                await self._instance().invoke(broker, RemotingCommand(RC.UNLOCK_BATCH_MQ,
                                                                      body=self._body(group)), LOCK_TIMEOUT)
            except (RemotingError, MQClientError) as e:
                log.warning("unlock %d queues on %s for %s: %s", len(group), broker, self.group, e)
        for mq in mqs:
            pq = self.held.get(mq)
            if pq is not None:
                pq.locked = False

    async def unlock_all(self) -> None:
        await self.unlock(list(self.held))


__all__ = ["LOCK_TIMEOUT", "QueueLocks"]
