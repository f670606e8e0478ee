"""What every worker must agree on about clients: offsets, consumers, queue locks.

``SharedTable``s (shared memory, after the store's state in the
control block), so that a client served by any worker — or by another one
after a reconnect — sees the same registry:

- ``offsets``   key ``topic@group\\0queueId`` → v0 committed offset (−1: none),
                v1 when it was committed (ms). Saved to
                ``config/consumerOffset.json`` by the services process every
                ``flushConsumerOffsetInterval`` and at shutdown; loaded at start.
- ``consumers`` key ``group\\0clientId`` → v0 worker slot, v1 last heartbeat
                (ms), v2 connection id in that worker, v3 1 if broadcasting;
                payload ``client_payload``: address, language, version,
                consume type and where it starts (GET_CONSUMER_CONNECTION_LIST).
                The table's epoch moves when a group gains or loses a member:
                workers then notify their consumers of the group.
- ``subscriptions`` key ``group\\0topic`` → v0 subVersion, v1 last heartbeat
                naming it (ms), v2 1 if SQL92 (else TAG); payload the
                expression (cut at 128 bytes, ``…`` marking a cut). A group's
                last heartbeat decides its topics, as RocketMQ's
                ConsumerGroupInfo.updateSubscription does.
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

import logging
import os
import time

from shmq.core.checkpoint import load_table, save_table
from shmq.core.files import REAL_FILES
from shmq.ipc.table import (
    PAYLOAD_BYTES_MAX,
    FileLock,
    SharedTable,
    TableFull,
    table_bytes,
)

log = logging.getLogger("shmq.broker")

OFFSET_ROWS = 32768
CONSUMER_ROWS = 4096
LOCK_ROWS = 8192
PRODUCER_ROWS = 4096
SUBSCRIPTION_ROWS = 4096
RESOLVED_ROWS = 16384
NOTICE_ROWS = 2048
# RocketMQ: ConsumerManager.CHANNEL_EXPIRED_TIMEOUT, RebalanceLockManager lock lease
CLIENT_EXPIRED_MS = 120_000
LOCK_LEASE_MS = 60_000


_TABLES = (("offsets", OFFSET_ROWS), ("consumers", CONSUMER_ROWS), ("locks", LOCK_ROWS),
           ("producers", PRODUCER_ROWS), ("resolved", RESOLVED_ROWS), ("notices", NOTICE_ROWS),
           ("subscriptions", SUBSCRIPTION_ROWS))
# what a consumer's heartbeat says, kept as an index into these (the payload is short)
CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY", "CONSUME_POP")
CONSUME_FROM = ("CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                "CONSUME_FROM_MIN_OFFSET", "CONSUME_FROM_MAX_OFFSET", "CONSUME_FROM_FIRST_OFFSET",
                "CONSUME_FROM_TIMESTAMP")


def registry_bytes() -> int:
    return sum(table_bytes(rows) for _, rows in _TABLES)


def offset_key(topic: str, group: str, queue_id: int) -> bytes:
    return f"{topic}@{group}\0{queue_id}".encode()


def consumer_key(group: str, client_id: str) -> bytes:
    return f"{group}\0{client_id}".encode()


def client_payload(addr: str, language: str, version: int, consume_type: str,
                   consume_from: str) -> bytes:
    """A consumer row's payload: ``addr\\0language\\0version\\0type\\0from`` (the
    last two as indexes into CONSUME_TYPES / CONSUME_FROM, -1 if unknown)."""
    ct = CONSUME_TYPES.index(consume_type) if consume_type in CONSUME_TYPES else -1
    cf = CONSUME_FROM.index(consume_from) if consume_from in CONSUME_FROM else -1
    tail = f"\0{language[:16]}\0{int(version)}\0{ct}\0{cf}".encode()
    return addr.encode()[:PAYLOAD_BYTES_MAX - len(tail)] + tail


def parse_client_payload(raw: bytes) -> dict:
    """``client_payload`` back: clientAddr, language, version, consumeType, consumeFromWhere."""
    try:
        addr, language, version, ct, cf = raw.decode("utf-8", "replace").split("\0")
        version_n, ct_n, cf_n = int(version), int(ct), int(cf)
    except ValueError:           # a row written before its payload (a heartbeat in progress)
        return {"clientAddr": "", "language": "OTHER", "version": 0, "consumeType": "",
                "consumeFromWhere": ""}
    return {"clientAddr": addr, "language": language, "version": version_n,
            "consumeType": CONSUME_TYPES[ct_n] if ct_n >= 0 else "",
            "consumeFromWhere": CONSUME_FROM[cf_n] if cf_n >= 0 else ""}


def subscription_key(group: str, topic: str) -> bytes:
    return f"{group}\0{topic}".encode()


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
        self.offsets.put(offset_key(topic, group, queue_id), offset, int(time.time() * 1000))

    def commit_offsets(self, commits: dict[tuple[str, str, int], int]) -> None:
        """``commit_offset`` of each (topic, group, queue) → offset, at one
        time, under one hold of the table's lock (the pull lane's chunk)."""
        now = int(time.time() * 1000)
        self.offsets.put_many([(offset_key(*k), (off, now)) for k, off in commits.items()])

    def remove_offsets(self, group: str) -> int:
        """Drop every committed offset of ``group``; how many there were."""
        rows = [row for row, key in self.offsets.items()
                if key.decode().partition("\0")[0].partition("@")[2] == group]
        for row in rows:
            self.offsets.delete(row)
        return len(rows)

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

    def group_clients(self, group: str, now_ms: int | None = None) -> list[tuple[str, int, dict]]:
        """(clientId, v3 broadcasting flag, parsed payload) of each live member of ``group``."""
        now_ms = now_ms or int(time.time() * 1000)
        prefix = f"{group}\0".encode()
        t = self.consumers
        return sorted((k[len(prefix):].decode(), int(t.v[row, 3]), parse_client_payload(t.payload(row)))
                      for row, k in t.items()
                      if k.startswith(prefix) and now_ms - t.v[row, 1] < CLIENT_EXPIRED_MS)

    # ---------------------------------------------------- subscriptions
    def update_subscriptions(self, group: str, subs: dict[str, tuple[str, int, bool]],
                             now_ms: int) -> None:
        """A heartbeat's subscriptions of ``group`` (topic → expression,
        subVersion, SQL92?) replace the group's; an expression longer than a
        payload is cut (marked ``…``); a key too long for the table is skipped."""
        t = self.subscriptions
        for topic, (expr, version, sql) in subs.items():
            raw = expr.encode()
            if len(raw) > PAYLOAD_BYTES_MAX:
                raw = raw[:PAYLOAD_BYTES_MAX - 3].decode("utf-8", "ignore").encode() + "…".encode()
            try:
                t.put(subscription_key(group, topic), version, now_ms, int(sql), payload=raw)
            except (ValueError, TableFull) as e:
                log.warning("subscription %s of group %s not recorded: %s", topic, group, e)
        prefix = f"{group}\0".encode()
        for row, k in list(t.items()):
            if k.startswith(prefix) and k[len(prefix):].decode() not in subs:
                t.delete(row)

    def group_subscriptions(self, group: str, now_ms: int | None = None) -> dict[str, dict]:
        """topic → {subString, subVersion, expressionType} of ``group``'s
        subscriptions; none once the group has no live member (RocketMQ then
        forgets the group's ConsumerGroupInfo)."""
        now_ms = now_ms or int(time.time() * 1000)
        if not self.group_members(group, now_ms):
            return {}
        prefix = f"{group}\0".encode()
        t = self.subscriptions
        return {k[len(prefix):].decode(): {"subString": t.payload(row).decode("utf-8", "replace"),
                                           "subVersion": int(t.v[row, 0]),
                                           "expressionType": "SQL92" if t.v[row, 2] else "TAG"}
                for row, k in t.items()
                if k.startswith(prefix) and now_ms - t.v[row, 1] < CLIENT_EXPIRED_MS}

    def groups_of_topic(self, topic: str, now_ms: int | None = None) -> set[str]:
        """Groups that subscribe ``topic`` now or have an offset in it
        (QUERY_TOPIC_CONSUME_BY_WHO)."""
        now_ms = now_ms or int(time.time() * 1000)
        t = self.subscriptions
        out = set()
        live = self.members_by_group(now_ms)
        for row, k in t.items():
            group, _, tp = k.decode().partition("\0")
            if tp == topic and group in live and now_ms - t.v[row, 1] < CLIENT_EXPIRED_MS:
                out.add(group)
        for tg in self.offset_table():
            tp, _, group = tg.partition("@")
            if tp == topic:
                out.add(group)
        return out

    def topics_of_group(self, group: str) -> set[str]:
        """Topics ``group`` has an offset in (ConsumerOffsetManager.whichTopicByConsumer)."""
        suffix = f"@{group}"
        return {tg[:-len(suffix)] for tg in self.offset_table() if tg.endswith(suffix)}

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
        """Drop consumers (returned: how many), producers and subscriptions silent too long."""
        now_ms = now_ms or int(time.time() * 1000)
        dropped = 0
        for t in (self.consumers, self.producers, self.subscriptions):
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
