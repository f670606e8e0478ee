"""The services process: the broker's background duties, off the request path.

- registers the broker with every NameServer every ``registerNameServerPeriod``
  and at once when the topic table changes (a topic created on first send
  must be routable before consumers poll again), again every
  ``REGISTER_RETRY_S`` while a NameServer has not taken a registration (one
  starting after the broker, or slow to answer the first; then after 2, 4,
  8 s), and unregisters at shutdown;
- saves consumer offsets to ``config/consumerOffset.json`` every
  ``flushConsumerOffsetInterval`` and at shutdown;
- expires consumers silent for 120 s (their groups are then re-balanced);
- re-posts delayed messages when due (``schedule``) and asks producers about
  unresolved transactions (``transactions``), exactly once across its own
  ``kill -9`` (``delivery.Reposter``);
- builds the IndexFile (query by key and by unique id);
- snapshots the statistics (broker/stats.py) and serves ``/metrics`` on
  ``metricsPort`` (broker/metrics.py).

On a SLAVE (``brokerRole``) nothing here appends to the store — no delay,
timer or transaction check-back: the master's records arrive by
replication (``broker/ha``) — and the haServerAddr / masterAddr the
NameServer answers its registration with are kept for the HA process.
"""
from __future__ import annotations

import logging
import signal
import time

from shmq.core import jit
from shmq.core.files import DISK_ERRORS
from shmq.core.index import IndexService
from shmq.core.scrub import Scrubber
from shmq.core.store import MessageStore
from shmq.ipc.channel import RemotingClient
from shmq.ipc.codes import ResponseCode
from shmq.ipc.control import (
    REGISTERED,
    WANT_CLIENTS,
    WANT_CONFIG,
    die_with_parent,
    set_process_name,
)

from . import metrics
from .config import SLAVE, BrokerConfig
from .delivery import Progress, Reposter
from .ha.slave import load_learned, save_learned
from .ha.sync import SlaveSync
from .logs import DiskWait
from .logs import setup as setup_logs
from .namesrv import register_broker_request, unregister_broker_request
from .registry import Registry
from .schedule import DelayService, TimerService
from .shared_store import attach, extra_region
from .topics import Tables
from .transactions import TransactionService

log = logging.getLogger("shmq.services")
TICK_S = 0.1
EXPIRE_EVERY_S = 10.0
STOP_INDEX_S = 2.0
REGISTER_RETRY_S = 1.0   # a NameServer that did not take the last registration
REGISTER_RETRY_MAX_S = 8.0   # ... doubled while it does not: at most this (or the period)


class IndexBuilder:
    """Keeps the IndexFile up with the CommitLog (keys and unique ids). A
    disk that refuses the index's pages (full: ``core.index``'s blocks
    ahead) pauses it (``DiskWait``); the build then goes on where it stopped."""

    def __init__(self, index: IndexService, store: MessageStore):
        self.index, self.store = index, store
        self.disk = DiskWait(log, f"the IndexFile under {index.dir}",
                             "messages stored meanwhile are indexed once there is room")

    def step(self, now_ms: int) -> int:
        if not self.disk.ready(now_ms):
            return 0
        try:
            done = self.index.build(self.store)
        except OSError as e:
            self.disk.failed(e, now_ms)
            return 0
        self.disk.ok()
        return done


class Services:
    def __init__(self, config: BrokerConfig, tables: Tables, registry: Registry, wake_clients,
                 store: MessageStore | None = None, wake_slot=None):
        self.config = config
        self.tables = tables
        self.registry = registry
        self.wake_clients = wake_clients
        self.store = store
        self.features: list = []
        self.timer = None
        if store is not None:
            root = config.store.storePathRootDir
            host = (config.brokerIP1, config.listenPort)
            self.progress = Progress(root)
            self.reposter = Reposter(store, self.progress)
            what = self.reposter.recover()
            if what != "none":
                log.warning("the last services process was killed mid re-post: %s", what)
            self.delay = DelayService(store, self.progress, self.reposter,
                                      config.delay_levels_ms, host, root)
            self.delay.load()
            self.transactions = TransactionService(config, store, registry, self.progress, host,
                                                   wake_slot)
            self.transactions.start()
            self.index = IndexService(config.store)
            self.features = [self.delay, self.transactions, IndexBuilder(self.index, store),
                             Scrubber(store, config.store)]
            if config.brokerRole == SLAVE:      # what would append: the master's to do
                self.features = self.features[2:]
            if config.timerWheelEnable and config.brokerRole != SLAVE:
                self.timer = TimerService(store, self.progress, self.reposter,
                                          config.timerPrecisionMs, host, root)
                self.features.append(self.timer)
        self.next_delay_save = 0.0
        self.registered_epoch = -1
        self.next_register = 0.0
        self.register_retry_s = REGISTER_RETRY_S    # after a NameServer did not take it
        self.registered = False      # a NameServer took the routes since start
        self.next_offsets = 0.0
        self.next_expire = 0.0
        # a slave's copy of the master's topics, groups, offsets (broker/ha/sync.py)
        self.slave_sync = (SlaveSync(config, tables, registry, time.monotonic(),
                                     self.progress if store is not None else None, store)
                           if config.brokerRole == SLAVE else None)
        self.saved_offsets: dict | None = None
        # One lasting connection per NameServer: a NameServer drops a broker
        # whose connection closes (RocketMQ: BrokerHousekeepingService).
        self.channels: dict[str, RemotingClient] = {}

    def step(self, now: float) -> None:
        epoch = self.tables.topics.state.get("config_epoch")
        if epoch != self.registered_epoch or now >= self.next_register:
            everyone = self.register_all() == len(self.config.namesrv_addrs)
            self.registered_epoch = epoch
            # a NameServer that did not take it (not up yet, slow, restarting)
            # hears again in a second, not a registration period later: until
            # then clients asking it find no route to this broker. Again
            # after 2, 4, 8 s while it does not (one that never answers costs
            # each try its timeout, this loop's time).
            period = self.config.registerNameServerPeriod / 1000
            if everyone:
                self.register_retry_s = REGISTER_RETRY_S
                self.next_register = now + period
            else:
                self.next_register = now + min(self.register_retry_s, period)
                self.register_retry_s = min(self.register_retry_s * 2, REGISTER_RETRY_MAX_S)
        if now >= self.next_offsets:
            self.save_offsets()
            self.next_offsets = now + self.config.flushConsumerOffsetInterval / 1000
        now_ms = int(time.time() * 1000)
        for feature in self.features:
            feature.step(now_ms)
        if self.features and now >= self.next_delay_save:
            self.save_progress()
            self.next_delay_save = now + self.config.flushDelayOffsetInterval / 1000
        if self.slave_sync is not None:
            self.slave_sync.step(now)
        if now >= self.next_expire:
            if self.registry.expire_clients():
                self.wake_clients()
            self.next_expire = now + EXPIRE_EVERY_S

    def sleep_s(self) -> float:
        """Until the next tick, or sooner if a timer slot falls due first."""
        if self.timer is None:
            return TICK_S
        due = self.timer.next_due_ms()
        if due is None:
            return TICK_S
        return min(TICK_S, max(0.0, due / 1000 - time.time()))

    def save_progress(self) -> None:
        if self.timer is not None:
            self.timer.flush()
        self.index.flush()
        self.index.delete_below(self.store.state.get("cl_min_offset"))
        self.progress.flush()
        self.delay.save()

    def save_offsets(self) -> None:
        table = self.registry.offset_table()
        if table != self.saved_offsets:
            self.registry.save_offsets()
            self.saved_offsets = table

    def _call_all(self, make, on_reply=None) -> int:
        """Send ``make()`` to every NameServer; returns how many answered
        SUCCESS (each such reply handed to ``on_reply``, if given)."""
        ok = 0
        for addr in self.config.namesrv_addrs:
            for _ in range(2):
                kept = addr in self.channels
                try:
                    c = self.channels.get(addr)
                    if c is None:
                        c = self.channels[addr] = RemotingClient(
                            addr, timeout=3.0, credentials=self.config.credentials)
                    r = c.invoke(make(), timeout=3.0)
                    if r.code != ResponseCode.SUCCESS:
                        log.warning("NameServer %s answered %d: %s", addr, r.code, r.remark)
                    else:
                        ok += 1
                        if on_reply is not None:
                            on_reply(r)
                except OSError as e:
                    c = self.channels.pop(addr, None)
                    if c is not None:
                        c.close()
                    if kept:    # a connection the NameServer closed (it restarted): a new one,
                        continue        # now, not a registration period later with no routes
                    log.warning("NameServer %s: %s", addr, e)
                break
        return ok

    def register_all(self) -> int:
        """Register with every NameServer; returns how many took it."""
        c = self.config
        # The version is read before the topics: a topic created in between
        # then rides under the older version, and the next registration's
        # newer one makes the NameServer take the tables again. Read after,
        # a registration could carry the new version without the new topic,
        # and the NameServer skips every later one with that same version.
        version = self._data_version()
        perm = self.tables.broker_permission()
        # a read-only (drained) broker: routes say so (registerBrokerAll)
        topics = {k: v.to_json() if perm & 6 == 6 else {**v.to_json(), "perm": v.perm & perm}
                  for k, v in self.tables.topics.current().items()}
        took = self._call_all(lambda: register_broker_request(
            cluster=c.brokerClusterName, broker_name=c.brokerName, broker_addr=c.addr,
            broker_id=c.brokerId, topic_configs=topics,
            data_version=version, ha_addr=c.ha_addr),
            self._learn_master if c.brokerRole == SLAVE else None)
        if took:
            self.registered = True
        return took

    def _learn_master(self, reply) -> None:
        """A slave's registration reply names its master (when the master is
        registered): kept for the HA process (``broker/ha/slave.py``)."""
        ha, master = reply.ext.get("haServerAddr", ""), reply.ext.get("masterAddr", "")
        root = self.config.store.storePathRootDir
        if ha and load_learned(root) != {"haServerAddr": ha, "masterAddr": master}:
            save_learned(root, ha, master)
            log.info("the master of %s is %s (HA %s)", self.config.brokerName, master, ha)

    def _data_version(self) -> dict:
        """The topics' data version, moved by broker config changes too (a
        NameServer takes the topics of a registration only if it moved)."""
        t, b = self.tables.topics.data_version(), self.tables.broker.data_version()
        return {"timestamp": max(t["timestamp"], b["timestamp"]),
                "counter": t["counter"] + b["counter"]}

    def unregister_all(self) -> None:
        c = self.config
        self._call_all(lambda: unregister_broker_request(
            cluster=c.brokerClusterName, broker_name=c.brokerName, broker_addr=c.addr,
            broker_id=c.brokerId))


def services_main(config: BrokerConfig, boss_pid: int, metrics_sock=None) -> None:
    """``metrics_sock``: metricsPort's listening socket, bound by the boss
    (a port in use fails the start, naming it; a restarted services process
    serves the same socket)."""
    die_with_parent(boss_pid)
    set_process_name("shmq-services")
    setup_logs("services")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    store, cb = attach(config.store, "other")
    jit.freeze()                      # no compile on a request path (core/jit.py)
    registry = Registry(extra_region(cb, store), config.store.storePathRootDir)
    svc = Services(config, Tables(config, store.state), registry,
                   lambda: cb.wake_flagged(WANT_CLIENTS), store, cb.wake)
    metrics.start(config, svc, store, cb, metrics_sock)   # stats snapshots; /metrics
    stopping = []

    def on_term(signum, frame):
        stopping.append(signum)
        cb.wake(cb.slot)

    signal.signal(signal.SIGTERM, on_term)
    cb.set_flag(WANT_CONFIG, True)    # topics changed: register at once
    try:
        while not stopping:
            svc.step(time.monotonic())
            if svc.registered:                    # the boss says ready after this
                cb.set_flag(REGISTERED, True)
            cb.heartbeat()
            cb.wait(svc.sleep_s())
        svc.save_offsets()
        svc.save_progress()
        svc.unregister_all()
        if hasattr(svc, "index"):
            # The workers have stopped: index what they stored since the last
            # step, so a clean stop leaves the IndexFile up with the CommitLog
            # (bounded: a store never indexed catches up after the restart).
            deadline = time.monotonic() + STOP_INDEX_S
            try:
                while svc.index.build(store) and time.monotonic() < deadline:
                    pass
            except OSError as e:          # a full disk: indexed after the restart
                if e.errno not in DISK_ERRORS:
                    raise
                log.warning("index: not brought up to date at stop (%s): it catches up after "
                            "the restart", e.strerror or e)
    finally:
        if svc.timer is not None:
            svc.timer.close()
        if store is not None and hasattr(svc, "index"):
            svc.index.flush()
            svc.index.close()
        cb.close()
        store.close()
