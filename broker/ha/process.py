"""``shmq-ha``: the replication process, started and restarted by the boss.

A master's runs ``HAService`` on the listening socket the boss bound (a
port in use is a clear error at start, and a restarted process takes the
same socket); a slave's runs ``HAClient``. SIGTERM ends the loop: a master
drops its slaves (``ha_slaves`` 0: SYNC sends no longer wait), a slave
closes its connection. It attaches to the store as any process does.
"""
from __future__ import annotations

import signal
import socket

from shmq.core import jit
from shmq.core.replica import Replica
from shmq.ipc.control import die_with_parent, set_process_name

from ..config import SLAVE, BrokerConfig
from ..delivery import tags_code_rules
from ..logs import setup as setup_logs
from ..shared_store import attach
from .master import HAService
from .slave import HAClient


def ha_main(config: BrokerConfig, boss_pid: int, listener: socket.socket | None) -> None:
    die_with_parent(boss_pid)
    set_process_name("shmq-ha")
    setup_logs("ha")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    store, cb = attach(config.store, "other")
    jit.freeze()
    stopping = []

    def on_term(signum, frame):
        stopping.append(signum)
        cb.wake(cb.slot)

    signal.signal(signal.SIGTERM, on_term)
    if config.brokerRole == SLAVE:
        loop = HAClient(config, Replica(store, tags_code_rules(config.delay_levels_ms)))
    else:
        loop = HAService(config, store, cb, listener)
    try:
        while not stopping:
            loop.step()
            cb.heartbeat()
    finally:
        loop.close()
        if config.brokerRole != SLAVE:
            store.state.set("ha_slaves", 0)
        cb.close()
        store.close()
