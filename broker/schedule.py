"""Delay levels and delivery times: the services process's re-post of due messages.

A message sent with ``DELAY=n`` waits in ``SCHEDULE_TOPIC_XXXX`` queue n − 1,
its ConsumeQueue tags code the time it is due (store time + level delay).
Each level's queue is in due-time order, so a level is a cursor: every tick
the services process takes the units due by now, re-posts their messages to
the real topic and queue (``REAL_TOPIC``/``REAL_QID``; ``DELAY`` removed),
consecutive ones bound for one queue as one append, and moves the cursor
with each append (``Reposter``: exactly once across ``kill -9``). Progress
is also written to RocketMQ's ``config/delayOffset.json``.
"""
from __future__ import annotations

import logging
import time

import numpy as np
from shmq.core.checkpoint import load_table, save_table
from shmq.core.files import REAL_FILES
from shmq.core.records import concat_batches
from shmq.core.store import MessageStore
from shmq.core.timer import TimerWheel

from .delivery import (
    DELAY_CURSOR,
    REAL_QID,
    REAL_TOPIC,
    TIMER_CURSOR,
    TIMER_DEQUEUE_MS,
    TIMER_ENQUEUE_MS,
    Progress,
    Reposter,
    restore_real,
)
from .logs import DiskWait
from .topics import SCHEDULE_TOPIC, TIMER_TOPIC

log = logging.getLogger("shmq.schedule")
UNITS_PER_READ = 512
REPOST_BATCH_MAX = 256


def repost_run(store: MessageStore, reposter: Reposter, store_host, phys, cursor: int,
               first_value: int, transform=restore_real) -> int:
    """Re-post the messages at ``phys`` in order, consecutive ones bound for
    one queue as one append; after the k-th message the cursor reads
    ``first_value + k + 1``. Returns how many were re-posted."""
    group, group_src = [], -1
    done = 0
    for k, phy in enumerate(phys):
        m = store.read_message(phy)
        if REAL_TOPIC not in m.properties:
            log.error("message at %d in %s has no REAL_TOPIC: skipped", phy, m.topic)
            b = None
        else:
            b = transform(m, store_host)
        if group and (b is None or (b.topic, b.queue_id) != (group[0].topic, group[0].queue_id)
                      or len(group) >= REPOST_BATCH_MAX):
            reposter.put(concat_batches(group), group_src, cursor, first_value + k)
            done += len(group)
            group = []
        if b is None:
            reposter.advance(cursor, first_value + k + 1)
            continue
        if not group:
            group_src = phy
        group.append(b)
    if group:
        reposter.put(concat_batches(group), group_src, cursor, first_value + len(phys))
        done += len(group)
    return done


def delay_offset_table(store: MessageStore, cursors, levels: int) -> dict[str, int]:
    """delayOffset.json's offsetTable (what GET_ALL_DELAY_OFFSET answers): the
    next offset of each level's queue that has ever held a message."""
    return {str(level): int(cursors[DELAY_CURSOR + level]) for level in range(1, levels + 1)
            if store.max_offset(SCHEDULE_TOPIC, level - 1) > 0}


class DelayService:
    def __init__(self, store: MessageStore, progress: Progress, reposter: Reposter,
                 levels_ms: tuple[int, ...], store_host: tuple[str, int], root: str):
        self.store = store
        self.p = progress
        self.reposter = reposter
        self.levels = levels_ms
        self.store_host = store_host
        self.root = root
        self.saved: dict | None = None

    def load(self) -> None:
        """A new progress file starts from RocketMQ's delayOffset.json."""
        if not self.p.created:
            return
        table = load_table(REAL_FILES, self.root, "delayOffset.json").get("offsetTable", {})
        for level, off in table.items():
            if 1 <= int(level) <= len(self.levels):
                self.p[DELAY_CURSOR + int(level)] = int(off)

    def save(self) -> None:
        table = delay_offset_table(self.store, self.p, len(self.levels))
        if table != self.saved:
            save_table(REAL_FILES, self.root, "delayOffset.json", {"offsetTable": table})
            self.saved = table

    def step(self, now_ms: int) -> int:
        """Re-post every message due by ``now_ms``; returns how many."""
        done = 0
        for level in range(1, len(self.levels) + 1):
            cursor = DELAY_CURSOR + level
            while True:
                off = max(self.p[cursor], self.store.min_offset(SCHEDULE_TOPIC, level - 1))
                units = self.store.queue_units(SCHEDULE_TOPIC, level - 1, off, UNITS_PER_READ)
                if not units.shape[0]:
                    break
                later = np.flatnonzero(units["tags_code"] > now_ms)
                due = int(later[0]) if later.shape[0] else units.shape[0]
                if due:
                    done += repost_run(self.store, self.reposter, self.store_host,
                                       units["phy_offset"][:due].tolist(), cursor, off)
                if due < units.shape[0]:
                    break
        return done

    def next_due_ms(self) -> int | None:
        """When the earliest waiting message is due (None: nothing waits)."""
        best = None
        for level in range(1, len(self.levels) + 1):
            off = max(self.p[DELAY_CURSOR + level], self.store.min_offset(SCHEDULE_TOPIC, level - 1))
            units = self.store.queue_units(SCHEDULE_TOPIC, level - 1, off, 1)
            if units.shape[0]:
                t = int(units["tags_code"][0])
                best = t if best is None else min(best, t)
        return best


FIRED_BITS = 24                       # the timer cursor: slot << 24 | messages fired in it
FIRED_MASK = (1 << FIRED_BITS) - 1


def timer_cursor(slot: int, fired: int) -> int:
    return slot << FIRED_BITS | fired


def timer_restore(m, store_host, now_ms: int | None = None):
    """A timer message to its real topic and queue (RocketMQ 5's
    TimerMessageStore.convert): REAL_TOPIC/REAL_QID removed, TIMER_OUT_MS kept
    (it stops a second timing), the wheel's enqueue and dequeue times added."""
    now = str(now_ms if now_ms is not None else int(time.time() * 1000))
    return restore_real(m, store_host, drop=(REAL_TOPIC, REAL_QID),
                        add={TIMER_ENQUEUE_MS: str(m.store_timestamp), TIMER_DEQUEUE_MS: now})


class TimerService:
    """Arbitrary delivery times: the timer topic's units (tags code = due
    time) go into a timing wheel (``core.timer``: a persistent log plus an
    in-memory slot index, O(1) per message); each tick the due slots are
    re-posted in order. One cursor, ``slot << 24 | fired``, moves with every
    re-post, so a restart resumes exactly inside a slot."""

    def __init__(self, store: MessageStore, progress: Progress, reposter: Reposter,
                 precision_ms: int, store_host: tuple[str, int], root: str):
        self.store = store
        self.p = progress
        self.reposter = reposter
        self.precision = precision_ms
        self.store_host = store_host
        self.wheel = TimerWheel(root)
        cur = self.p[TIMER_CURSOR]
        self.open_slot, self.open_fired = cur >> FIRED_BITS, cur & FIRED_MASK
        self.wheel.open(self.open_slot, self.open_fired)
        if self.wheel.pending:
            log.info("timer wheel: %s", self.wheel.recovery)
        self.disk = DiskWait(log, f"the timer log under {self.wheel.dir}",
                             "timer messages stored meanwhile are scheduled once there is room "
                             "(those already scheduled are delivered)")

    def close(self) -> None:
        self.wheel.flush()
        self.wheel.close()

    def _enqueue(self, fire_slot: int) -> int:
        n = 0
        while True:
            nxt = self.wheel.next_cq_offset
            if nxt < 0:
                nxt = self.store.min_offset(TIMER_TOPIC, 0)
            units = self.store.queue_units(TIMER_TOPIC, 0, nxt, UNITS_PER_READ * 8)
            if not units.shape[0]:
                return n
            due = units["tags_code"].astype(np.int64)
            slots = -(-due // self.precision)              # ceil: never early
            self.wheel.add(np.arange(nxt, nxt + units.shape[0], dtype=np.int64),
                           units["phy_offset"].astype(np.int64), units["size"].astype(np.int64),
                           slots, fire_slot)
            n += units.shape[0]

    def step(self, now_ms: int) -> int:
        cur = self.p[TIMER_CURSOR]
        slot, fired = cur >> FIRED_BITS, cur & FIRED_MASK
        if self.disk.ready(now_ms):
            try:
                self._enqueue(slot)
            except OSError as e:              # the log's page, or a new file: the disk is full
                self.disk.failed(e, now_ms)   # (what got in is the wheel's next_cq_offset)
            else:
                self.disk.ok()
        now_slot = now_ms // self.precision
        done = 0
        while True:
            s = self.wheel.next_due_slot()
            if s is None or s > now_slot:
                break
            if s != slot:
                slot, fired = s, 0
                self.reposter.advance(TIMER_CURSOR, timer_cursor(slot, 0))
            phys, _ = self.wheel.slot_entries(s)
            skip = fired - (self.open_fired if s == self.open_slot else 0)
            todo = phys[skip:].tolist()
            done += repost_run(self.store, self.reposter, self.store_host, todo, TIMER_CURSOR,
                               timer_cursor(s, fired),
                               lambda m, host: timer_restore(m, host, now_ms))
            slot, fired = s + 1, 0
            self.reposter.advance(TIMER_CURSOR, timer_cursor(slot, 0))
            self.wheel.release(slot)
        if slot <= now_slot:
            self.reposter.advance(TIMER_CURSOR, timer_cursor(now_slot + 1, 0))
            self.wheel.release(now_slot + 1)
        return done

    def next_due_ms(self) -> int | None:
        s = self.wheel.next_due_slot()
        return None if s is None else s * self.precision

    def flush(self) -> None:
        self.wheel.flush()
