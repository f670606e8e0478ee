"""The console's TPS history: what the cluster page charts.

A broker answers GET_BROKER_RUNTIME_INFO with its rates now (``putTps`` and
``getTransferedTps``, each "10 s, 1 min, 10 min"), not their history, so the
console asks every ``interval_s`` seconds, as the dashboard's collector
does, and keeps the last ``RING`` samples per broker address in memory: a
ring (deque) that forgets the oldest. The question is mqadmin clusterList's
(``admin_commands.cluster_list``: every broker the NameServer knows, a
broker that does not answer shown with its error), asked by one thread with
its own AdminClient; pages read copies under a lock. Nothing is stored:
a restarted console starts its charts empty.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from types import SimpleNamespace

from ..admin_client import AdminClient, AdminError
from ..admin_commands import cluster_list
from ..admin_show import _tps

RING = 720                     # samples kept per broker: an hour at the default 5 s

log = logging.getLogger("shmq.console")


class Sampler:
    def __init__(self, client: AdminClient, interval_s: float):
        self.client = client
        self.interval_s = interval_s
        self._rings: dict[str, collections.deque] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shmq-console-sampler", daemon=True)
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.interval_s + self.client.timeout * 4)
        self.client.close()

    def samples(self, addr: str) -> list[tuple[int, float, float]]:
        """(time ms, put TPS, get TPS) of the broker at ``addr``, oldest first."""
        with self._lock:
            return list(self._rings.get(addr, ()))

    def sample_once(self) -> None:
        try:
            rows = cluster_list(SimpleNamespace(moreStats=False), self.client)["brokers"]
        except AdminError as e:          # the NameServer is down: try again next time
            self.last_error = str(e)
            return
        self.last_error = None
        now = int(time.time() * 1000)
        with self._lock:
            for r in rows:
                if "error" in r:
                    continue
                ring = self._rings.setdefault(r["addr"], collections.deque(maxlen=RING))
                ring.append((now, _tps(r["runtime"], "putTps"), _tps(r["runtime"], "getTransferedTps")))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)
