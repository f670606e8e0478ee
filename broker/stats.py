"""The broker's statistics: message rates and totals, per topic and group and
broker-wide, and disk use, whichever process asks.

Broker-wide rates (GET_BROKER_RUNTIME_INFO). RocketMQ's StoreStatsService
samples its put and get counters once a second and answers ``putTps`` /
``getTransferedTps`` as three rates, over the last 10 s, minute and 10
minutes ("x.xx y.yy z.zz"), and ``commitLogDiskRatio`` as the used fraction
of the disk under the store. Here the counters are shared by every worker,
so whichever worker answers gives the broker's figures:

- messages put: the sum of every queue's next offset in the store state
  (retries, scheduled and transaction messages count, as RocketMQ's store
  counts every put); nothing to do on the send path;
- messages got: each worker counts the messages its pulls return (a Python
  int on the pull path) and adds them to its process slot's ``msgs_got``
  once a second (``ipc.control``); the broker's total is the sum over the
  slots. A slot keeps its count when a new process takes it, so the total
  never falls.

Each worker samples (time, put, got) every second, keeping 10 minutes; a
rate is from the sample ``window`` seconds back (the oldest one while the
worker is younger than that) to the totals when asked.

Per topic and group (BrokerStatsManager: VIEW_BROKER_STATS_DATA,
GET_BROKER_CONSUME_STATS, consumeTps, the metrics endpoint). The counts are
``ipc/counters.py``'s shared table, placed after the registry in the
control block's region (``stats_offset``): every process that serves or
does a put or a get counts it in its own process slot — a worker in its
send, pull and send-back handlers, a client on this host in its direct
appends and reads — and publishes once a second (``RuntimeStats.publish``,
from the worker's one-second timer). The services process snapshots the
totals as RocketMQ's StatsItem does (``Sampler``: every 10 s, 10 min and
hour, 7, 7 and 25 kept) into rings in the same shared memory, so every
worker reads the same history. A figure over a window (``Stats.window``)
is RocketMQ's StatsSnapshot: ``sum`` the growth from the newest snapshot at
least the window old — or from zero at the broker's start, while it is
younger than the window — to the live totals; ``tps`` that over the
seconds between; ``avgpt`` the sum per request. So a figure is never more
than one publish (a second) behind, where RocketMQ's lags up to 10 s.
The day marks of RocketMQ's BrokerStats (msgPutTotalTodayMorning …) move at
the first snapshot after local midnight.
"""
from __future__ import annotations

import bisect
import datetime
import shutil
import time
from collections import deque

import numpy as np

from shmq.core.store import MessageStore
from shmq.ipc.control import ControlBlock
from shmq.ipc.counters import (FLUSH_BUCKETS_S, GET, NUMS, PUT, RINGS, SIZE, SNDBCK, TIMES,
                               Counters, Tally, counters_bytes)

from .delivery import stored
from .registry import registry_bytes

SAMPLE_S = 1.0
WINDOWS_S = (10, 60, 600)          # StoreStatsService's putTps / getTransferedTps windows
KEEP = WINDOWS_S[-1] + 1
# RocketMQ's StatsItem windows: getStatsDataInMinute / InHour / InDay
SPANS_S = {"minute": 60, "hour": 3600, "day": 86400}
# VIEW_BROKER_STATS_DATA's statsName → (row kind, column); BROKER_* sum a kind's rows
ITEMS = {"TOPIC_PUT_NUMS": (PUT, NUMS), "TOPIC_PUT_SIZE": (PUT, SIZE),
         "GROUP_GET_NUMS": (GET, NUMS), "GROUP_GET_SIZE": (GET, SIZE),
         "SNDBCK_PUT_NUMS": (SNDBCK, NUMS)}
BROKER_ITEMS = {"BROKER_PUT_NUMS": PUT, "BROKER_GET_NUMS": GET}


def stats_offset(store: MessageStore) -> int:
    """Where the counters start in the control block's region: after the
    store's state and the broker's registry (the boss asks for both)."""
    return store.state.nbytes + registry_bytes()


def counters_of(cb: ControlBlock, store: MessageStore) -> Counters | None:
    """The broker's counters, or None (not laid out yet, or a store with no
    broker around it)."""
    return Counters.over(cb.region()[stats_offset(store):], store.root)


def put_total(store: MessageStore) -> int:
    """Messages the store holds ever put: every queue's next offset, summed."""
    st = store.state
    return int(st.queue_next[st.used_slots()].sum())


def stats_bytes(slots: int) -> int:
    """The shared memory the counters take (the boss asks for it after the registry's)."""
    return counters_bytes(slots)


def lay_out(cb: ControlBlock, store: MessageStore, slots: int) -> Tally:
    """The owner lays the counters out once, at start; its own tally (the
    boss's gauges: restarts) comes back."""
    return Tally(Counters(cb.region()[stats_offset(store):], store.root, slots), cb.slot)


def human_bytes(n: int) -> str:
    """RocketMQ's MixAll.humanReadableByteCount(n, false)."""
    if n < 1024:
        return f"{n} B"
    exp = min(6, int(np.log(n) / np.log(1024)))
    return f"{n / 1024 ** exp:.1f} {'KMGTPE'[exp - 1]}iB"


class Stats:
    """Figures over windows, from the shared counters (any process)."""

    def __init__(self, counters: Counters):
        self.c = counters

    def _base(self, span_s: int, now_ms: int) -> tuple[str, int]:
        """The ring for that span, and the index in it of the newest snapshot
        at least ``span_s`` old, or -1: count from the broker's start."""
        ring = "minute" if span_s <= 60 else "hour" if span_s <= 3600 else "day"
        ts = self.c.rings[ring][0]
        old = np.flatnonzero((ts > 0) & (ts <= now_ms - span_s * 1000))
        return ring, int(old[np.argmax(ts[old])]) if old.shape[0] else -1

    def window(self, rows, col: int, span_s: int, with_times: bool = True,
               now_ms: int | None = None) -> dict:
        """RocketMQ's StatsSnapshot (sum, tps, avgpt) of the rows' column
        ``col`` (summed) over the last ``span_s`` seconds."""
        now_ms = now_ms or int(time.time() * 1000)
        rows = list(rows)
        if not rows:
            return {"sum": 0, "tps": 0.0, "avgpt": 0.0}
        counts = self.c.counts[:, rows, :].sum(axis=(0, 1))
        ring, i = self._base(span_s, now_ms)
        if i < 0:
            t0, base = self.c.boot_ms, np.zeros(3, np.int64)
        else:
            ts, data = self.c.rings[ring]
            t0, base = int(ts[i]), data[i, rows, :].sum(axis=0)
        total = max(0, int(counts[col] - base[col]))
        times = max(0, int(counts[TIMES] - base[TIMES])) if with_times else 0
        dt = now_ms - t0
        return {"sum": total, "tps": total * 1000.0 / dt if dt > 0 else 0.0,
                "avgpt": total / times if times else 0.0}

    def tps(self, kind: bytes, key: str, col: int = NUMS) -> float:
        """The minute's rate of one item (0.0 if it has none)."""
        row = self.c.row(kind + key.encode())
        return self.window([row], col, SPANS_S["minute"])["tps"] if row >= 0 else 0.0

    def view(self, name: str, key: str, cluster: str) -> dict | None:
        """VIEW_BROKER_STATS_DATA's BrokerStatsData of ``name``/``key``, or
        None where RocketMQ has no such StatsItem."""
        if name in ITEMS:
            kind, col = ITEMS[name]
            row = self.c.row(kind + key.encode())
            if row < 0:
                return None
            rows, times = [row], True
        elif name in BROKER_ITEMS and key == cluster:
            rows, col, times = [r for _, r in self.c.items(BROKER_ITEMS[name])], NUMS, False
        else:
            return None
        return {f"stats{span.capitalize()}": self.window(rows, col, s, times)
                for span, s in SPANS_S.items()}

    def broker_totals(self) -> tuple[int, int]:
        """(messages put, messages got) since the broker started, as counted."""
        t = self.c.totals()
        put = [r for _, r in self.c.items(PUT)]
        get = [r for _, r in self.c.items(GET)]
        return int(t[put, NUMS].sum()), int(t[get, NUMS].sum())


class Sampler:
    """The services process's snapshots of the totals (see the module doc)."""

    def __init__(self, counters: Counters):
        self.c = counters
        self.stats = Stats(counters)
        self.due = {name: 0.0 for name, _, _ in RINGS}

    def step(self, now_ms: int) -> None:
        if all(now_ms < d for d in self.due.values()):
            return
        totals = None
        h = self.c.header
        for name, every_s, kept in RINGS:
            if now_ms < self.due[name]:
                continue
            if totals is None:
                totals = self.c.totals()
            ts, data = self.c.rings[name]
            taken = f"taken_{name}"
            i = int(h[taken][0]) % kept
            ts[i] = 0                       # readers skip it while it is written
            used = self.c.keys.used()       # rows are never freed: the others stay 0
            data[i, used] = totals[used]
            ts[i] = now_ms
            h[taken] += 1
            self.due[name] = now_ms + every_s * 1000
        self._day_marks(now_ms)

    def _day_marks(self, now_ms: int) -> None:
        """RocketMQ's BrokerStats.record, at the first snapshot of a new day."""
        h = self.c.header
        day = datetime.date.fromtimestamp(now_ms / 1000).toordinal()
        seen = int(h["day"][0])
        if seen == day:
            return
        h["day"] = day
        if seen == 0:
            return                         # the broker's first day: the marks stay 0
        put, got = self.stats.broker_totals()
        h["put_yesterday_morning"] = int(h["put_today_morning"][0])
        h["get_yesterday_morning"] = int(h["get_today_morning"][0])
        h["put_today_morning"], h["get_today_morning"] = put, got


# how often at most the flusher sums the queues' next offsets for the
# flushed_msgs gauge: the sum reads every queue (2.5 µs with 100 queues,
# 53 µs with 10,000, 427 µs with 50,000, 2026-11-28), and under SYNC_FLUSH
# a group commit runs thousands of rounds a second
COUNT_EVERY_S = 0.05


class FlushMeter:
    """The gauges of the CommitLog flush rounds (their fdatasyncs), each
    round in the slot of the process that ran it — the flusher, or a worker
    leading the group commit of its turn (broker/worker.py): how long it
    took (the latency histogram). And, the flusher's meter alone
    (``counts``), how many messages the rounds made durable: the store's
    put total since the last count, counted when ``flush_seq`` moved since
    then (whoever flushed), at a round at most every COUNT_EVERY_S and
    before the flusher sleeps (``settle``). The boss lays the counters out
    after the flusher starts: until then rounds go uncounted."""

    def __init__(self, store: MessageStore, cb: ControlBlock, clock=time.monotonic,
                 counts: bool = True):
        self.store, self.cb, self.clock = store, cb, clock
        self.counts = counts
        self.tally: Tally | None = None
        self.last_put = put_total(store) if counts else 0   # what is stored was flushed before
        self.counted_at = float("-inf")
        self.counted_seq = store.state.get("flush_seq")

    def _tally(self) -> Tally | None:
        t = self.tally
        if t is None:
            c = counters_of(self.cb, self.store)
            if c is not None:
                t = self.tally = Tally(c, self.cb.slot)
        return t

    def __call__(self, ns: int) -> None:
        t = self._tally()
        if t is None:
            return
        t.add_gauge("fdatasyncs", 1)
        t.add_gauge("flush_ns", ns)
        t.add_gauge(f"flush_le_{bisect.bisect_left(FLUSH_BUCKETS_S, ns / 1e9)}", 1)
        if self.counts and self.clock() - self.counted_at >= COUNT_EVERY_S:
            self.settle()

    def settle(self) -> None:
        """Count the messages the rounds since the last count made durable."""
        if not self.counts:
            return
        seq = self.store.state.get("flush_seq")
        if seq == self.counted_seq or self._tally() is None:
            return
        put = put_total(self.store)
        self.tally.add_gauge("flushed_msgs", put - self.last_put)
        self.last_put, self.counted_at, self.counted_seq = put, self.clock(), seq


class RuntimeStats:
    def __init__(self, store: MessageStore, cb: ControlBlock):
        self.store = store
        self.cb = cb
        self.got = 0               # messages this worker's pulls returned (the pull path adds)
        self.corrupt_skipped = 0   # damaged records this worker's pulls refused to serve
        self._corrupt_published = 0
        self._published = 0        # of those, already in this process's slot
        self.samples: deque[tuple[float, int, int]] = deque(maxlen=KEEP)
        self.boot_ms = int(time.time() * 1000)     # the broker's start, where counters say it
        # per topic and group (None without the broker's shared counters)
        counters = counters_of(cb, store)
        self.figures = Stats(counters) if counters is not None else None
        self.tally = Tally(counters, cb.slot) if counters is not None else None
        if counters is not None:
            self.boot_ms = counters.boot_ms
        self.sample()

    def note_worker(self, connections: int, parking) -> None:
        """A worker's gauges, once a second: its connections and what it has parked."""
        if self.tally is not None:
            t = self.tally
            t.set_gauge("connections", connections)
            t.set_gauge("parked_pulls", sum(len(w) for w in parking.pulls.values()))
            t.set_gauge("parked_sends", len(parking.sends))

    def put_total(self) -> int:
        return put_total(self.store)

    def got_total(self) -> int:
        self.publish()
        return int(self.cb.procs["msgs_got"].sum())

    def publish(self) -> None:
        """Add what this worker counted since the last call to its slot's counters."""
        if self.got != self._published and self.cb.slot >= 0:
            self.cb.procs["msgs_got"][self.cb.slot] += self.got - self._published
            self._published = self.got
        if self.corrupt_skipped != self._corrupt_published and self.cb.slot >= 0:
            self.cb.procs["corrupt_skipped"][self.cb.slot] += (self.corrupt_skipped
                                                               - self._corrupt_published)
            self._corrupt_published = self.corrupt_skipped
        if self.tally is not None:
            self.tally.publish()

    def sample(self) -> None:
        """Once a second (the worker's timer)."""
        self.samples.append((time.monotonic(), self.put_total(), self.got_total()))

    def _rates(self, now: tuple[float, int, int], field: int) -> str:
        out = []
        for window in WINDOWS_S:
            base = self.samples[0]
            for s in reversed(self.samples):
                if s[0] <= now[0] - window:
                    base = s
                    break
            dt = now[0] - base[0]
            out.append(max(0, now[field] - base[field]) / dt if dt > 0 else 0.0)
        return " ".join(f"{r:.2f}" for r in out)

    def runtime_info(self) -> dict[str, str]:
        """The runtime-info entries, as RocketMQ names and formats them."""
        now = (time.monotonic(), self.put_total(), self.got_total())
        ratio = self.store.files.disk_usage_ratio
        out = {"putTps": self._rates(now, 1), "getTransferedTps": self._rates(now, 2),
               # shmq: the totals the rates are taken from (messages put since the store
               # was made, got since the broker started)
               "msgPutTotal": str(now[1]), "msgGetTotal": str(now[2]),
               # shmq: damaged records pulls refused to serve (checkCRCOnRead)
               "corruptSkipped": str(int(self.cb.procs["corrupt_skipped"].sum())),
               # each on its own disk when storePathCommitLog / storePathConsumeQueue say so
               "commitLogDiskRatio": str(ratio(self.store.cl.dir)),
               "consumeQueueDiskRatio": str(ratio(self.store.cqs.dir))}
        if self.figures is not None:
            c = self.figures.c
            h = c.header[0]
            put, got = self.figures.broker_totals()
            size = int(c.totals()[[r for _, r in c.items(PUT)], SIZE].sum())
            out.update({
                # BrokerStats: the day marks, and the totals since the broker started
                "msgPutTotalYesterdayMorning": str(int(h["put_yesterday_morning"])),
                "msgPutTotalTodayMorning": str(int(h["put_today_morning"])),
                "msgPutTotalTodayNow": str(put),
                "msgGetTotalYesterdayMorning": str(int(h["get_yesterday_morning"])),
                "msgGetTotalTodayMorning": str(int(h["get_today_morning"])),
                "msgGetTotalTodayNow": str(got),
                "putMessageTimesTotal": str(put), "putMessageSizeTotal": str(size),
                "putMessageAverageSize": str(size / put if put else 0.0)})
        st = self.store.state
        first = stored(self.store, st.get("cl_min_offset"))
        boot_s = (int(time.time() * 1000) - self.boot_ms) // 1000
        out.update({
            # the store's (DefaultMessageStore.getRuntimeInfo, prepareRuntimeInfo)
            "earliestMessageTimeStamp": str(first.store_timestamp if first else 0),
            "pageCacheLockTimeMills": str(self.store.busy_ms(int(time.time() * 1000))),
            "dispatchBehindBytes": "0",       # ConsumeQueues are written with each append
            "remainHowManyDataToFlush": human_bytes(max(0, st.write_pos - st.flushed_pos)),
            "runtime": f"[ {boot_s // 86400} days, {boot_s // 3600 % 24} hours, "
                       f"{boot_s // 60 % 60} minutes, {boot_s % 60} seconds ]"})
        try:
            u = shutil.disk_usage(self.store.cl.dir)   # storePathCommitLog's disk
            out["commitLogDirCapacity"] = (f"Total : {human_bytes(u.total)}, "
                                           f"Free : {human_bytes(u.free)}.")
        except OSError:
            pass
        return out
