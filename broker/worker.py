"""A worker process: one reactor serving the connections the boss hands it.

The boss accepts every connection and passes its descriptor here over a
Unix socket (SCM_RIGHTS). The worker attaches to the shared store and
registries, and runs requests to completion in its one thread; it sleeps in
epoll on its client sockets, the boss channel and its wake-up socket (new
messages for parked pulls, flush progress for parked sync sends, consumer
group changes). It dies with the boss (PDEATHSIG). SIGTERM: answer what is
parked, flush replies, leave.
"""
from __future__ import annotations

import logging
import os
import resource
import signal
import socket
import time

from shmq.core import jit
from shmq.ipc.control import WANT_CLIENTS, WANT_CONFIG, die_with_parent, set_process_name

from .config import BrokerConfig
from .processors import Processors
from .reactor import Reactor
from .registry import Registry
from .shared_store import attach, extra_region
from .topics import Tables

log = logging.getLogger("shmq.worker")
HANDOFF_MSG_BYTES = 64 * 1024
HANDOFF_FDS_MAX = 64
DRAIN_S = 5.0


def boss_address(namespace: str) -> bytes:
    return f"\0{namespace}.boss".encode()


def worker_main(config: BrokerConfig, index: int, boss_pid: int) -> None:
    die_with_parent(boss_pid)
    set_process_name(f"shmq-worker-{index}")
    logging.basicConfig(level=os.environ.get("SHMQ_LOG_LEVEL", "INFO"),
                        format=f"%(asctime)s worker-{index} %(levelname)s %(name)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    store, cb = attach(config.store, "worker")
    jit.freeze()                      # no compile on a request path (core/jit.py)
    cb.set_flag(WANT_CLIENTS, True)
    registry = Registry(extra_region(cb, store), config.store.storePathRootDir)
    tables = Tables(config, store.state, on_change=lambda: cb.wake_flagged(WANT_CONFIG))
    reactor = Reactor()
    procs = Processors(config, store, cb, tables, registry, reactor)

    chan = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    chan.connect(boss_address(cb.namespace))
    chan.sendall(f"{index} {cb.slot} {os.getpid()}\n".encode())

    def on_handoff():
        try:
            msg, fds, flags, _ = socket.recv_fds(chan, HANDOFF_MSG_BYTES, HANDOFF_FDS_MAX)
        except (BlockingIOError, InterruptedError):
            return
        if not msg and not fds:
            log.warning("the boss is gone: stopping")
            reactor.stopping = True
            return
        peers = msg.decode().split("\n")
        if flags & socket.MSG_CTRUNC:      # the kernel dropped descriptors we had no room for
            lost = max(0, len([p for p in peers if p]) - len(fds))
            log.error("lost %d client connection(s) handed by the boss: this worker is out of "
                      "file descriptors (RLIMIT_NOFILE %d); raise it (ulimit -n, LimitNOFILE=)",
                      lost, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        for i, fd in enumerate(fds):
            sock = socket.socket(fileno=fd)
            peer = peers[i] if i < len(peers) and peers[i] else f"fd{fd}"
            reactor.add_connection(sock, peer, procs.on_command, procs.connection_closed,
                                   config.outboundBufferMaxBytes)

    def on_wake():
        cb.waiter.drain()
        procs.check_parked_pulls()
        procs.check_parked_sends()
        procs.check_clients()
        procs.deliver_notices()

    ticks = [0]

    def every_second():
        cb.heartbeat()
        procs.check_parked_pulls()
        procs.check_clients()
        procs.deliver_notices()
        ticks[0] += 1
        if ticks[0] % 10 == 0:
            reactor.close_idle(config.serverChannelMaxIdleTimeSeconds)

    chan.setblocking(False)
    reactor.add_reader(chan, on_handoff)
    reactor.add_reader(cb.waiter.sock, on_wake)
    reactor.every(1.0, every_second)

    def on_term(signum, frame):
        reactor.stopping = True

    signal.signal(signal.SIGTERM, on_term)
    reactor.wake_on_signals()
    log.info("serving (slot %d)", cb.slot)
    try:
        reactor.run()
        _drain(reactor, procs)
    finally:
        reactor.close()
        cb.close()
        store.close()


def _drain(reactor: Reactor, procs: Processors) -> None:
    """Answer parked pulls now, give parked sync sends and queued replies up
    to DRAIN_S to go out."""
    for waiting in procs.parked_pulls.values():
        for p in waiting:
            p.deadline = 0
    procs.check_parked_pulls()
    deadline = time.monotonic() + DRAIN_S
    reactor.stopping = False
    while time.monotonic() < deadline and (procs.parked_sends or any(
            c.out for c in reactor.conns.values())):
        reactor.run_once()
        procs.check_parked_sends()
