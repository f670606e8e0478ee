"""Message counters every process of a broker adds to, in shared memory:
RocketMQ's BrokerStatsManager items and a few gauges per process.

The items are RocketMQ's (BrokerStatsManager, 4.9): TOPIC_PUT_NUMS and
TOPIC_PUT_SIZE by topic, GROUP_GET_NUMS and GROUP_GET_SIZE by
``topic@group``, SNDBCK_PUT_NUMS by ``topic@group``; each keeps a value
(messages, or bytes) and times (requests), so one row holds an item's
three counters: messages, requests, bytes. BROKER_PUT_NUMS and
BROKER_GET_NUMS are the sums of the topic and group rows.

Who counts: the process that does the work, whichever it is — a broker
worker for the sends, pulls and send-backs it serves, and a client on the
broker's host for what it appends to or reads from the store itself
(client/direct.py). Every process counts in the columns of its own process
slot (``ipc/control.py``), so no two processes ever write one word: no lock,
no atomic add, no system call. On its request path a process adds to a
dict of Python ints (``Tally.put`` / ``get``: a lookup and three adds, about
0.2 µs); once a second it moves what it counted into its slot's columns
(``Tally.publish``: one small numpy add per key it saw, a lock only the
first time a key is seen by the broker). A client, with no timer to publish
from, adds straight into its columns (``Tally.add_now``). Readers sum the columns over the
slots (``Counters.totals``). A slot's counts stay when a new process takes
the slot, so totals never fall; what a process counted in the second
before it was killed is lost.

Layout, at ``offset`` in the control block's region (after the broker's
registry: ``broker/stats.py`` places it and the boss lays it out)::

    header (128 B): magic, rows, slots, boot_ms, snapshots taken per ring,
                    the day marks of RocketMQ's BrokerStats (below)
    keys     SharedTable (ITEM_ROWS): b"P\\0topic", b"G\\0topic@group",
             b"B\\0topic@group" → row; a row is never freed while the broker
             runs (a deleted topic's counts stay until the restart)
    counts   int64 [slots, ITEM_ROWS, 3]: messages, requests, bytes
    gauges   int64 [slots, len(GAUGES)]: what one process knows (its
             connections, parked requests; the flusher's fdatasyncs; the
             boss's restarts), each written by its own process only
    rings    RocketMQ's StatsItem snapshots of the totals: every 10 s (7
             kept: the last minute), every 10 min (7: the hour), every hour
             (25: the day); per ring a time column (ms, 0 while a snapshot
             is written) and the [n, ITEM_ROWS, 3] totals. One process
             takes them (the broker's services process, ``broker/stats.py``).

Unused rows and slots cost address space, not memory: the shared memory is
zero pages until written.
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np

from .table import KEY_BYTES_MAX, FileLock, SharedTable, TableFull, table_bytes

log = logging.getLogger("shmq.stats")

MAGIC = 0x73686D7173746174   # "shmqstat"
ITEM_ROWS = 4096
NUMS, TIMES, SIZE = 0, 1, 2
PUT, GET, SNDBCK = b"P\0", b"G\0", b"B\0"
HEADER_BYTES = 128
_HDR = ["magic", "rows", "slots", "boot_ms", "taken_minute", "taken_hour", "taken_day",
        "day", "put_today_morning", "put_yesterday_morning", "get_today_morning",
        "get_yesterday_morning"]
# RocketMQ's StatsItem sampling: (name, seconds between snapshots, snapshots kept)
RINGS = (("minute", 10, 7), ("hour", 600, 7), ("day", 3600, 25))
# the flusher's latency histogram: upper bounds (s) of its buckets, +Inf last
FLUSH_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
GAUGES = ("connections", "parked_pulls", "parked_sends", "fdatasyncs", "flush_ns",
          "flushed_msgs", "restarts") + tuple(f"flush_le_{i}" for i in range(len(FLUSH_BUCKETS_S) + 1))
G = {name: i for i, name in enumerate(GAUGES)}
assert len(_HDR) * 8 <= HEADER_BYTES


def _aligned(n: int) -> int:
    return -(-n // 64) * 64


def _sizes(slots: int) -> tuple[int, int, int, list[tuple[int, int]]]:
    keys = _aligned(table_bytes(ITEM_ROWS))
    counts = slots * ITEM_ROWS * 3 * 8
    gauges = _aligned(slots * len(GAUGES) * 8)
    rings = [(_aligned(n * 8), n * ITEM_ROWS * 3 * 8) for _, _, n in RINGS]
    return keys, counts, gauges, rings


def counters_bytes(slots: int) -> int:
    keys, counts, gauges, rings = _sizes(slots)
    return HEADER_BYTES + keys + counts + gauges + sum(a + b for a, b in rings)


class Counters:
    """The shared counters (see the module's docstring)."""

    def __init__(self, buf, root: str, slots: int | None = None):
        """Over ``buf`` (memory of ``counters_bytes(slots)`` at least); with
        ``slots`` (the owner, once) lay it out, else read the layout."""
        self.header = np.ndarray((1,), np.dtype({"names": _HDR, "formats": [np.int64] * len(_HDR),
                                                "offsets": [8 * i for i in range(len(_HDR))],
                                                "itemsize": HEADER_BYTES}), buf, 0)
        h = self.header
        if slots is not None:
            h["rows"], h["slots"] = ITEM_ROWS, slots
            h["boot_ms"] = int(time.time() * 1000)
        n = int(h["slots"][0])
        keys, counts, gauges, rings = _sizes(n)
        at = HEADER_BYTES
        self.keys = SharedTable(buf, at, FileLock(os.path.join(root, "stats.lock")),
                                ITEM_ROWS if slots is not None else None)
        at += keys
        self.counts = np.ndarray((n, ITEM_ROWS, 3), np.int64, buf, at)
        at += counts
        self.gauges = np.ndarray((n, len(GAUGES)), np.int64, buf, at)
        at += gauges
        self.rings = {}
        for (name, _, kept), (ts_bytes, data_bytes) in zip(RINGS, rings):
            ts = np.ndarray((kept,), np.int64, buf, at)
            data = np.ndarray((kept, ITEM_ROWS, 3), np.int64, buf, at + ts_bytes)
            self.rings[name] = (ts, data)
            at += ts_bytes + data_bytes
        if slots is not None:
            h["magic"] = MAGIC
        self._items_epoch, self._items = -1, {}

    @classmethod
    def over(cls, buf, root: str) -> "Counters | None":
        """The counters laid out in ``buf``, or None if they are not (yet)."""
        if len(buf) < HEADER_BYTES or int.from_bytes(bytes(buf[:8]), "little") != MAGIC:
            return None
        return cls(buf, root)

    @property
    def boot_ms(self) -> int:
        return int(self.header["boot_ms"][0])

    def row(self, key: bytes, create: bool = False) -> int:
        """The row of ``key``; -1 if it has none (and ``create`` is off, or
        the key is too long or the table is full: then it is not counted)."""
        r = self.keys.find(key)
        if r >= 0 or not create:
            return r
        if len(key) > KEY_BYTES_MAX:
            return -1
        try:
            return self.keys.upsert(key)
        except TableFull:
            return -1

    def totals(self) -> np.ndarray:
        """[ITEM_ROWS, 3]: every slot's counts summed (the rows in use: the
        others are zero, and summing them would touch all the pages)."""
        out = np.zeros((ITEM_ROWS, 3), np.int64)
        used = self.keys.used()
        if used.shape[0]:
            out[used] = self.counts[:, used, :].sum(axis=0)
        return out

    def row_totals(self, row: int) -> np.ndarray:
        return self.counts[:, row, :].sum(axis=0)

    def items(self, kind: bytes) -> list[tuple[str, int]]:
        """(stats key, row) of every item of ``kind`` (PUT, GET, SNDBCK),
        remembered until a key is added."""
        if self._items_epoch != self.keys.epoch:
            self._items_epoch, self._items = self.keys.epoch, {}
        hit = self._items.get(kind)
        if hit is None:
            hit = self._items[kind] = [(k[2:].decode("utf-8", "replace"), r)
                                       for r, k in self.keys.items() if k[:2] == kind]
        return hit

    def gauge(self, name: str) -> int:
        """A gauge summed over the slots."""
        return int(self.gauges[:, G[name]].sum())


class Tally:
    """One process's counts, moved into its slot's columns by ``publish``."""

    def __init__(self, counters: Counters, slot: int):
        self.c = counters
        self.slot = slot
        self.pending: dict[bytes, list[int]] = {}
        self.rows: dict[bytes, int] = {}
        self.views: dict[bytes, np.ndarray] = {}    # add_now's rows
        self._refused: set[bytes] = set()

    def put(self, topic: str, msgs: int, nbytes: int) -> None:
        """Messages stored to ``topic`` by one request (TOPIC_PUT_NUMS/SIZE)."""
        e = self.pending.get(topic)
        if e is None:
            e = self.pending[topic] = [PUT + topic.encode(), 0, 0, 0]
        e[1] += msgs
        e[2] += 1
        e[3] += nbytes

    def get(self, topic: str, group: str, msgs: int, nbytes: int, kind: bytes = GET) -> None:
        """Messages ``group`` got from ``topic`` by one pull (GROUP_GET_NUMS/SIZE),
        or sent back (``kind`` SNDBCK: SNDBCK_PUT_NUMS)."""
        k = (kind, topic, group)
        e = self.pending.get(k)
        if e is None:
            e = self.pending[k] = [kind + f"{topic}@{group}".encode(), 0, 0, 0]
        e[1] += msgs
        e[2] += 1
        e[3] += nbytes

    def publish(self) -> None:
        """Move the counts into this process's slot (once a second)."""
        if not self.pending or self.slot < 0:
            return
        counts = self.c.counts[self.slot]
        for e in self.pending.values():
            key = e[0]
            row = self.rows.get(key)
            if row is None:
                row = self.c.row(key, create=True)
                if row < 0:
                    if key not in self._refused:
                        self._refused.add(key)
                        log.warning("stats: %r is not counted (key longer than %d bytes, or "
                                    "all %d rows used)", key, KEY_BYTES_MAX, ITEM_ROWS)
                    continue
                self.rows[key] = row
            c = counts[row]
            c[NUMS] += e[1]
            c[TIMES] += e[2]
            c[SIZE] += e[3]
        self.pending.clear()

    def add_now(self, key: bytes, msgs: int, nbytes: int) -> None:
        """Count one request straight into this process's slot (a process with
        no timer to publish from: a client's direct appends and reads;
        about 0.5 µs). ``key``: PUT + topic, or GET + topic@group, encoded."""
        row = self.views.get(key)
        if row is None:
            r = self.c.row(key, create=True)
            if r < 0 or self.slot < 0:
                return
            row = self.views[key] = self.c.counts[self.slot, r]
        row[NUMS] += msgs
        row[TIMES] += 1
        row[SIZE] += nbytes

    def set_gauge(self, name: str, value: int) -> None:
        if self.slot >= 0:
            self.c.gauges[self.slot, G[name]] = value

    def add_gauge(self, name: str, value: int) -> None:
        if self.slot >= 0:
            self.c.gauges[self.slot, G[name]] += value
