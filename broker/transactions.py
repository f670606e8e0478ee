"""Transactional messages: resolving half messages, and asking producers.

A half message sits in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, invisible to
consumers. ``resolve_half`` applies a producer's answer once — commit posts
the message to its real topic, rollback posts nothing, and either way an op
message (``RMQ_SYS_TRANS_OP_HALF_TOPIC``, tag ``d``, body the half's queue
offset) records it — under the ``resolved`` registry table's lock, so
whichever worker gets an answer, and however often it comes, the message
is posted at most once.

``TransactionService`` (services process) reads the op queue to learn what
is resolved, moves the half cursor over the resolved prefix, and every
``transactionCheckInterval`` asks a live producer of the group about each
unresolved half older than ``transactionTimeOut`` (CHECK_TRANSACTION_STATE,
sent by the worker that holds the producer's connection); after
``transactionCheckMax`` checks the half is rolled back and kept in
``TRANS_CHECK_MAX_TIME_TOPIC``.
"""
from __future__ import annotations

import logging
import random
import time
from collections import deque

from shmq.core.layout import SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_ROLLBACK
from shmq.core.records import StoredMessage
from shmq.core.store import MessageStore

from .config import BrokerConfig
from .delivery import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TRANS_HALF_CURSOR,
    TRANS_OP_CURSOR,
    Progress,
    commit_half,
    op_record,
    repost,
    stored,
)
from .registry import Registry, post_notice
from .topics import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC

log = logging.getLogger("shmq.transactions")
CHECKS_PER_ROUND = 2000
CURSOR_KEY = b"cursor"      # v0: every half message below this offset is resolved
RESOLVING, RESOLVED = 1, 2  # a row's v2


def resolve_half(store: MessageStore, registry: Registry, store_host, m: StoredMessage,
                 kind: int, discard: bool = False, posted: bool = False) -> bool:
    """Commit or roll back the half message ``m`` unless it is resolved
    already; returns whether this call resolved it. ``discard``: a rollback
    that keeps the message in TRANS_CHECK_MAX_TIME_TOPIC; ``posted``: its
    committed copy is known to be stored already (only the op is missing).

    The row is written first (RESOLVING, with the target queue's next
    offset) and marked RESOLVED after the op record, all under the table's
    lock (an flock: a dead holder's is released). A row found RESOLVING was
    left by a process killed half-way: its appends are finished, the
    committed copy found (not posted twice) if it got in."""
    t = registry.resolved
    key = str(m.queue_offset).encode()
    target = _target(m, kind, discard)
    with t.lock.held():
        below = t.find(CURSOR_KEY)
        if below >= 0 and m.queue_offset < t.v[below, 0]:
            return False
        row = t.find(key)
        if row >= 0 and t.v[row, 2] != RESOLVING:
            return False
        if row >= 0:                       # finish what a killed resolver started
            kind = int(t.v[row, 0])
            target = _target(m, kind, discard)
            posted = target is None or copy_of_half(store, m, target, int(t.v[row, 3]))
        else:
            row = t.upsert(key)
            t.v[row, 0], t.v[row, 1] = kind, int(time.time() * 1000)
            t.v[row, 3] = store.max_offset(*target) if target else 0
            t.v[row, 2] = RESOLVING
        if not posted and kind == SYSFLAG_TRANSACTION_COMMIT:
            store.append(commit_half(m, store_host))
        elif not posted and target is not None:
            store.append(repost(m, TRANS_CHECK_MAX_TIME_TOPIC, 0, m.properties,
                                store_host=store_host, prepared_offset=m.phy_offset))
        store.append(op_record(m.queue_offset, store_host))
        t.v[row, 2] = RESOLVED
    return True


def _target(m: StoredMessage, kind: int, discard: bool) -> tuple[str, int] | None:
    """The queue a resolution posts to (None: a plain rollback posts nothing)."""
    if kind == SYSFLAG_TRANSACTION_COMMIT:
        d = m.properties
        qid = d.get(REAL_QID, "0")
        return d.get(REAL_TOPIC, m.topic), int(qid) if qid.isdigit() else 0
    return (TRANS_CHECK_MAX_TIME_TOPIC, 0) if discard else None


def copy_of_half(store: MessageStore, m: StoredMessage, target: tuple[str, int],
                 from_offset: int, scan_max: int = 1_000_000) -> bool:
    """Whether the queue ``target`` holds, from ``from_offset`` on, the
    record posted for half message ``m`` (its prepared offset is m's)."""
    topic, qid = target
    off = max(from_offset, store.min_offset(topic, qid))
    end = min(store.max_offset(topic, qid), off + scan_max)
    while off < end:
        units = store.queue_units(topic, qid, off, 1024)
        if not units.shape[0]:
            return False
        for phy in units["phy_offset"].tolist():
            r = stored(store, phy)
            if r is not None and r.prepared_offset == m.phy_offset:
                return True
        off += units.shape[0]
    return False


class TransactionService:
    def __init__(self, config: BrokerConfig, store: MessageStore, registry: Registry,
                 progress: Progress, store_host, wake_slot):
        self.config = config
        self.store = store
        self.registry = registry
        self.p = progress
        self.store_host = store_host
        self.wake_slot = wake_slot
        self.resolved: set[int] = set()
        self.ops: deque[tuple[int, int]] = deque()      # (op offset, half offset) read
        self.op_read = -1
        self.checks: dict[int, int] = {}                 # half offset → checks sent
        self.next_round = 0

    def start(self) -> None:
        """Learn what the op queue says is resolved, and tell the workers."""
        self.op_read = max(self.p[TRANS_OP_CURSOR], self.store.min_offset(TRANS_OP_HALF_TOPIC, 0))
        self._read_ops()
        t = self.registry.resolved
        for half in self.resolved:
            key = str(half).encode()
            if t.find(key) < 0:
                row = t.upsert(key)
                t.v[row, 0], t.v[row, 2] = SYSFLAG_TRANSACTION_ROLLBACK, RESOLVED

    def step(self, now_ms: int) -> int:
        """Returns how many halves were checked or discarded."""
        self._read_ops()
        self._advance()
        if now_ms < self.next_round:
            return 0
        self.next_round = now_ms + self.config.transactionCheckInterval
        return self._check_round(now_ms)

    def _read_ops(self) -> None:
        while True:
            units = self.store.queue_units(TRANS_OP_HALF_TOPIC, 0, self.op_read, 1024)
            if not units.shape[0]:
                return
            for phy in units["phy_offset"].tolist():
                m = self.store.read_message(phy)
                try:
                    half = int(m.body)
                except ValueError:
                    half = -1
                if half >= self.p[TRANS_HALF_CURSOR]:
                    self.resolved.add(half)
                self.ops.append((self.op_read, half))
                self.op_read += 1

    def _advance(self) -> None:
        """Move the half cursor over the resolved prefix. The shared cursor
        moves first, then the rows below it go: a worker always sees one or
        the other."""
        start = max(self.p[TRANS_HALF_CURSOR], self.store.min_offset(TRANS_HALF_TOPIC, 0))
        end = self.store.max_offset(TRANS_HALF_TOPIC, 0)
        cursor = start
        while cursor < end and cursor in self.resolved:
            cursor += 1
        t = self.registry.resolved
        t.v[t.upsert(CURSOR_KEY), 0] = cursor
        self.p[TRANS_HALF_CURSOR] = cursor
        for half in range(start, cursor):
            self.resolved.discard(half)
            self.checks.pop(half, None)
            row = t.find(str(half).encode())
            if row >= 0:
                t.delete(row)
        while self.ops and self.ops[0][1] < cursor:
            self.ops.popleft()
        self.p[TRANS_OP_CURSOR] = self.ops[0][0] if self.ops else self.op_read

    def _check_round(self, now_ms: int) -> int:
        c = self.config
        off = self.p[TRANS_HALF_CURSOR]
        done = 0
        while done < CHECKS_PER_ROUND:
            units = self.store.queue_units(TRANS_HALF_TOPIC, 0, off, 1024)
            if not units.shape[0]:
                break
            for k, phy in enumerate(units["phy_offset"].tolist()):
                half = off + k
                if half in self.resolved:
                    continue
                m = stored(self.store, phy)
                if m is None:
                    continue
                immunity = m.properties.get(CHECK_IMMUNITY_TIME_IN_SECONDS, "")
                wait = int(immunity) * 1000 if immunity.isdigit() else c.transactionTimeOut
                if now_ms - m.store_timestamp < wait:
                    continue
                done += 1
                if self.checks.get(half, 0) >= c.transactionCheckMax:
                    log.info("half message %d checked %d times: rolled back", half,
                             c.transactionCheckMax)
                    resolve_half(self.store, self.registry, self.store_host, m,
                                 SYSFLAG_TRANSACTION_ROLLBACK, discard=True)
                    continue
                if half not in self.checks and self._committed_before(m):
                    continue
                self.checks[half] = self.checks.get(half, 0) + 1
                self._ask(m)
            off += units.shape[0]
        return done

    def _committed_before(self, m: StoredMessage) -> bool:
        """Before a half is first asked about by this process: was it committed
        by a broker killed before it wrote the op record (shared memory gone)?
        Then only the op record is written; the producer is not asked again."""
        target = _target(m, SYSFLAG_TRANSACTION_COMMIT, False)
        start = self.store.offset_by_time(*target, m.store_timestamp)
        if not copy_of_half(self.store, m, target, start):
            return False
        log.info("half message %d was committed before a crash: recording it", m.queue_offset)
        resolve_half(self.store, self.registry, self.store_host, m, SYSFLAG_TRANSACTION_COMMIT,
                     posted=True)
        self.resolved.add(m.queue_offset)
        return True

    def _ask(self, m: StoredMessage) -> None:
        group = m.properties.get(PGROUP, "")
        channels = self.registry.producer_channels(group)
        if not channels:
            log.info("no live producer of group %r to check half message %d", group, m.queue_offset)
            return
        slot, conn_id = random.choice(channels)
        post_notice(self.registry.notices, f"check\0{m.queue_offset}".encode(), slot, conn_id,
                    m.phy_offset, group.encode())
        self.wake_slot(slot)
