"""What every worker must agree on about clients: offsets, consumers, queue locks.

Three ``SharedTable``s (shared memory, after the store's state in the
control block), so that a client served by any worker — or by another one
after a reconnect — sees the same registry:

- ``offsets``   key ``topic@group\\0queueId`` → v0 committed offset (−1: none),
                v1 when it was committed (ms). Saved to
                ``config/consumerOffset.json`` by the services process every
                ``flushConsumerOffsetInterval`` and at shutdown; loaded at start.
- ``consumers`` key ``group\\0clientId`` → v0 worker slot, v1 last heartbeat
                (ms), v2 connection id in that worker, v3 1 if broadcasting.
                The table's epoch moves when a group gains or loses a member:
                workers then notify their consumers of the group.
- ``locks``     key ``group\\0topic\\0brokerName\\0queueId`` → v0 lock time (ms),
                payload the clientId holding it (orderly consumption).
"""
from __future__ import annotations

import os
import time

from shmq.core.checkpoint import load_table, save_table
from shmq.core.files import REAL_FILES
from shmq.ipc.table import FileLock, SharedTable, table_bytes

OFFSET_ROWS = 32768
CONSUMER_ROWS = 4096
LOCK_ROWS = 8192
# RocketMQ: ConsumerManager.CHANNEL_EXPIRED_TIMEOUT, RebalanceLockManager lock lease
CLIENT_EXPIRED_MS = 120_000
LOCK_LEASE_MS = 60_000


def registry_bytes() -> int:
    return table_bytes(OFFSET_ROWS) + table_bytes(CONSUMER_ROWS) + table_bytes(LOCK_ROWS)


def offset_key(topic: str, group: str, queue_id: int) -> bytes:
    return f"{topic}@{group}\0{queue_id}".encode()


def consumer_key(group: str, client_id: str) -> bytes:
    return f"{group}\0{client_id}".encode()


def lock_key(group: str, topic: str, broker: str, queue_id: int) -> bytes:
    return f"{group}\0{topic}\0{broker}\0{queue_id}".encode()


class Registry:
    def __init__(self, buf, root: str, create: bool = False):
        self.root = root
        self.lock = FileLock(os.path.join(root, "registry.lock"))
        o1 = table_bytes(OFFSET_ROWS)
        o2 = o1 + table_bytes(CONSUMER_ROWS)
        self.offsets = SharedTable(buf, 0, self.lock, OFFSET_ROWS if create else None)
        self.consumers = SharedTable(buf, o1, self.lock, CONSUMER_ROWS if create else None)
        self.locks = SharedTable(buf, o2, self.lock, LOCK_ROWS if create else None)

    # ---------------------------------------------------------- offsets
    def get_offset(self, topic: str, group: str, queue_id: int) -> int:
        """The committed offset, or -1 if none."""
        row = self.offsets.find(offset_key(topic, group, queue_id))
        return int(self.offsets.v[row, 0]) if row >= 0 else -1

    def commit_offset(self, topic: str, group: str, queue_id: int, offset: int) -> None:
        row = self.offsets.upsert(offset_key(topic, group, queue_id))
        self.offsets.v[row, 0] = offset
        self.offsets.v[row, 1] = int(time.time() * 1000)

    def offset_table(self) -> dict[str, dict[str, int]]:
        """RocketMQ's consumerOffset.json shape: {"topic@group": {"qid": offset}}."""
        out: dict[str, dict[str, int]] = {}
        for row, key in self.offsets.items():
            tg, _, qid = key.decode().rpartition("\0")
            out.setdefault(tg, {})[qid] = int(self.offsets.v[row, 0])
        return out

    def load_offsets(self) -> int:
        table = load_table(REAL_FILES, self.root, "consumerOffset.json").get("offsetTable", {})
        n = 0
        for tg, queues in table.items():
            topic, _, group = tg.partition("@")
            for qid, off in queues.items():
                self.commit_offset(topic, group, int(qid), int(off))
                n += 1
        return n

    def save_offsets(self) -> None:
        save_table(REAL_FILES, self.root, "consumerOffset.json",
                   {"offsetTable": self.offset_table()})

    # -------------------------------------------------------- consumers
    def group_members(self, group: str, now_ms: int | None = None) -> list[str]:
        now_ms = now_ms or int(time.time() * 1000)
        prefix = f"{group}\0".encode()
        t = self.consumers
        return sorted(k[len(prefix):].decode() for row, k in t.items()
                      if k.startswith(prefix) and now_ms - t.v[row, 1] < CLIENT_EXPIRED_MS)

    def members_by_group(self, now_ms: int | None = None) -> dict[str, list[str]]:
        now_ms = now_ms or int(time.time() * 1000)
        out: dict[str, list[str]] = {}
        t = self.consumers
        for row, k in t.items():
            if now_ms - t.v[row, 1] < CLIENT_EXPIRED_MS:
                g, _, cid = k.decode().partition("\0")
                out.setdefault(g, []).append(cid)
        return {g: sorted(v) for g, v in out.items()}

    def forget_worker(self, slot: int) -> int:
        """Drop the consumers a dead worker served (they reconnect elsewhere)."""
        t = self.consumers
        rows = [r for r, _ in t.items() if t.v[r, 0] == slot]
        for r in rows:
            t.delete(r)
        return len(rows)

    def expire_clients(self, now_ms: int | None = None) -> int:
        now_ms = now_ms or int(time.time() * 1000)
        t = self.consumers
        rows = [r for r, _ in t.items() if now_ms - t.v[r, 1] >= CLIENT_EXPIRED_MS]
        for r in rows:
            t.delete(r)
        return len(rows)
