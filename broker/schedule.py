"""Delay levels: the services process's re-post of due messages.

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

import numpy as np

from shmq.core.checkpoint import load_table, save_table
from shmq.core.files import REAL_FILES
from shmq.core.records import concat_batches
from shmq.core.store import MessageStore

from .delivery import DELAY_CURSOR, REAL_TOPIC, Progress, Reposter, restore_real
from .topics import SCHEDULE_TOPIC

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
        table = {str(level): self.p[DELAY_CURSOR + level] for level in range(1, len(self.levels) + 1)
                 if self.store.max_offset(SCHEDULE_TOPIC, level - 1) > 0}
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
