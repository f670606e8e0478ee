"""The broker's message rates and disk use, for GET_BROKER_RUNTIME_INFO.

RocketMQ's StoreStatsService samples its put and get counters once a second
and answers ``putTps`` / ``getTransferedTps`` as three rates, over the last
10 s, minute and 10 minutes ("x.xx y.yy z.zz"), and ``commitLogDiskRatio`` as
the used fraction of the disk under the store. Here the counters are shared
by every worker, so whichever worker answers gives the broker's figures:

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
"""
from __future__ import annotations

import time
from collections import deque

from shmq.core.store import MessageStore
from shmq.ipc.control import ControlBlock

SAMPLE_S = 1.0
WINDOWS_S = (10, 60, 600)          # StoreStatsService's putTps / getTransferedTps windows
KEEP = WINDOWS_S[-1] + 1


class RuntimeStats:
    def __init__(self, store: MessageStore, cb: ControlBlock):
        self.store = store
        self.cb = cb
        self.got = 0               # messages this worker's pulls returned (the pull path adds)
        self.corrupt_skipped = 0   # damaged records this worker's pulls refused to serve
        self._corrupt_published = 0
        self._published = 0        # of those, already in this process's slot
        self.samples: deque[tuple[float, int, int]] = deque(maxlen=KEEP)
        self.sample()

    def put_total(self) -> int:
        st = self.store.state
        return int(st.queue_next[st.used_slots()].sum())

    def got_total(self) -> int:
        self.publish()
        return int(self.cb.procs["msgs_got"].sum())

    def publish(self) -> None:
        """Add what this worker got since the last call to its slot's counters."""
        if self.got != self._published and self.cb.slot >= 0:
            self.cb.procs["msgs_got"][self.cb.slot] += self.got - self._published
            self._published = self.got
        if self.corrupt_skipped != self._corrupt_published and self.cb.slot >= 0:
            self.cb.procs["corrupt_skipped"][self.cb.slot] += (self.corrupt_skipped
                                                               - self._corrupt_published)
            self._corrupt_published = self.corrupt_skipped

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
        disk = self.store.files.disk_usage_ratio(self.store.root)
        return {"putTps": self._rates(now, 1), "getTransferedTps": self._rates(now, 2),
                # shmq: the totals the rates are taken from (messages put since the store
                # was made, got since the broker started)
                "msgPutTotal": str(now[1]), "msgGetTotal": str(now[2]),
                # shmq: damaged records pulls refused to serve (checkCRCOnRead)
                "corruptSkipped": str(int(self.cb.procs["corrupt_skipped"].sum())),
                "commitLogDiskRatio": str(disk),
                "consumeQueueDiskRatio": str(disk)}     # one store root: the same disk
