"""What every worker must agree on about clients: offsets, consumers, queue locks.

``SharedTable``s (shared memory, after the store's state in the
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
- ``producers`` key ``group\\0clientId`` → v0 worker slot, v1 last heartbeat (ms),
                v2 connection id: where a transaction check can reach the group.
- ``resolved``  key half-message queue offset (decimal) → v0 8 commit / 12
                rollback, v1 when: END_TRANSACTION is applied once per half
                message, whichever worker gets it (rows go when the services
                process's half cursor passes them).
- ``notices``   messages from the services process or one worker to the
                clients of others: key ``check\\0<half offset>`` → v0 target
                worker slot, v1 connection id, v2 half phy offset, payload the
                producer group (a CHECK_TRANSACTION_STATE to send); key
                ``reset\\0group\\0topic`` → v0 timestamp, v1 a sequence number
                (tell the group's consumers their offsets were reset).
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
PRODUCER_ROWS = 4096
RESOLVED_ROWS = 16384
NOTICE_ROWS = 2048
# RocketMQ: ConsumerManager.CHANNEL_EXPIRED_TIMEOUT, RebalanceLockManager lock lease
CLIENT_EXPIRED_MS = 120_000
LOCK_LEASE_MS = 60_000


_TABLES = (("offsets", OFFSET_ROWS), ("consumers", CONSUMER_ROWS), ("locks", LOCK_ROWS),
           ("producers", PRODUCER_ROWS), ("resolved", RESOLVED_ROWS), ("notices", NOTICE_ROWS))


def registry_bytes() -> int:
    return sum(table_bytes(rows) for _, rows in _TABLES)


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
        at = 0
        for name, rows in _TABLES:
            setattr(self, name, SharedTable(buf, at, self.lock, rows if create else None))
            at += table_bytes(rows)

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
        """Drop the consumers (returned: how many) and producers a dead worker
        served (they reconnect elsewhere)."""
        n = 0
        for t in (self.consumers, self.producers):
            rows = [r for r, _ in t.items() if t.v[r, 0] == slot]
            for r in rows:
                t.delete(r)
            n += len(rows) if t is self.consumers else 0
        return n

    def expire_clients(self, now_ms: int | None = None) -> int:
        """Drop consumers (returned: how many) and producers silent too long."""
        now_ms = now_ms or int(time.time() * 1000)
        dropped = 0
        for t in (self.consumers, self.producers):
            rows = [r for r, _ in t.items() if now_ms - t.v[r, 1] >= CLIENT_EXPIRED_MS]
            for r in rows:
                t.delete(r)
            dropped += len(rows) if t is self.consumers else 0
        return dropped

    def producer_channels(self, group: str, now_ms: int | None = None) -> list[tuple[int, int]]:
        """(worker slot, connection id) of each live producer of ``group``."""
        now_ms = now_ms or int(time.time() * 1000)
        prefix = f"{group}\0".encode()
        t = self.producers
        return [(int(t.v[r, 0]), int(t.v[r, 2])) for r, k in t.items()
                if k.startswith(prefix) and now_ms - t.v[r, 1] < CLIENT_EXPIRED_MS]


def post_notice(t: SharedTable, key: bytes, v0: int, v1: int = 0, v2: int = 0,
                payload: bytes = b"") -> None:
    """Put a notice (re-inserted, so the table's epoch moves and every worker
    looks); v3 counts how often this key was posted."""
    with t.lock.held():
        row = t.find(key)
        seq = 0
        if row >= 0:
            seq = int(t.v[row, 3])
            t.delete(row)
        row = t.upsert(key, payload)
        t.v[row, 0], t.v[row, 1], t.v[row, 2], t.v[row, 3] = v0, v1, v2, seq + 1
