"""The boss: owns the store, accepts connections, hands them to workers, supervises.

``shmq broker`` runs this in its main process (DESIGN §3)::

    boss ─┬─ namesrv   (embedded NameServer, unless embeddedNamesrv=false)
          ├─ flusher   (started by StoreOwner: group commit, CQ flush, retention)
          ├─ worker × N (reactors; connections arrive by SCM_RIGHTS)
          └─ services  (NameServer registration, offset persistence, expiry)

Start-up: take the store (recovery), lay out the registries after the
store state, load consumer offsets, write the system topics, start the
NameServer, listen (TCP and ``<store>/broker.sock``), start the workers and
services, print the ready line. Then: accept → hand the socket to the worker
with the fewest connections handed so far (round robin among equals);
every tick, repair after any dead process (append lock, registry rows) and
restart it. Every child dies with the boss (PDEATHSIG). SIGTERM/SIGINT: stop
accepting, stop the workers (they answer what is parked), stop services
(offsets saved, broker unregistered), flush and checkpoint, remove
``abort``, unlink the shared memory.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import selectors
import signal
import socket
import sys
import time

from shmq.ipc.control import WANT_CLIENTS, set_process_name

from .config import BrokerConfig
from .delivery import tags_code_rules
from .namesrv import serve as namesrv_serve
from .registry import Registry, registry_bytes
from .services import services_main
from .shared_store import StoreOwner, extra_region
from .topics import Tables
from .worker import boss_address, worker_main

log = logging.getLogger("shmq.boss")
TICK_S = 0.2
STOP_TIMEOUT_S = 15
PENDING_MAX = 4096


class Boss:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.ctx = multiprocessing.get_context("spawn")
        self.owner = StoreOwner(config.store, extra_bytes=registry_bytes(),
                                tags_code_rules=tags_code_rules(config.delay_levels_ms))
        self.workers: dict[int, multiprocessing.Process] = {}
        self.chans: dict[int, socket.socket] = {}         # worker index → channel
        self.handed: dict[int, int] = {}                  # worker index → connections handed
        self.worker_slots: dict[int, int] = {}
        self.pending: list[tuple[socket.socket, str]] = []
        self.namesrv: multiprocessing.Process | None = None
        self.services: multiprocessing.Process | None = None
        self.sel = selectors.DefaultSelector()
        self.stopping = False
        self.registry: Registry | None = None
        self.listeners: list[socket.socket] = []
        self.next_index = 0

    # ---------------------------------------------------------------- start
    def start(self) -> None:
        c = self.config
        report = self.owner.open()
        log.info("store %s: %s", c.store.storePathRootDir, report.summary())
        try:
            self.registry = Registry(extra_region(self.owner.cb, self.owner.store),
                                     c.store.storePathRootDir, create=True)
            n = self.registry.load_offsets()
            log.info("loaded %d consumer offsets", n)
            Tables(c, self.owner.store.state).ensure_system_topics()
            if c.embeddedNamesrv:
                self._start_namesrv()
            self._listen()
            for i in range(c.workers):
                self._start_worker(i)
            self._start_services()
            self._await_workers()
        except BaseException:
            self.stop()
            raise

    def _start_namesrv(self) -> None:
        c = self.config
        p = self.ctx.Process(target=namesrv_serve, name="shmq-namesrv",
                             args=(c.bindAddress, c.namesrvListenPort, os.getpid()))
        p.start()
        self.namesrv = p
        deadline = time.monotonic() + 30
        while True:   # registration needs it up
            try:
                socket.create_connection((c.bindAddress, c.namesrvListenPort), timeout=1).close()
                return
            except OSError:
                if not p.is_alive():
                    raise RuntimeError(f"the embedded NameServer could not start on "
                                       f"{c.bindAddress}:{c.namesrvListenPort} (port in use?)")
                if time.monotonic() > deadline:
                    raise RuntimeError("the embedded NameServer did not start within 30 s")
                time.sleep(0.05)

    def _listen(self) -> None:
        c = self.config
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            tcp.bind((c.bindAddress, c.listenPort))
        except OSError as e:
            tcp.close()
            raise RuntimeError(f"cannot listen on {c.bindAddress}:{c.listenPort}: {e}") from None
        tcp.listen(4096)
        path = c.unix_path
        if os.path.exists(path):
            os.unlink(path)    # left by a previous run: we hold the store lock
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(path)
        unix.listen(4096)
        chan = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        chan.bind(boss_address(self.owner.cb.namespace))
        chan.listen(64)
        for s, what in ((tcp, "tcp"), (unix, "unix"), (chan, "chan")):
            s.setblocking(False)
            self.sel.register(s, selectors.EVENT_READ, what)
            self.listeners.append(s)

    def _start_worker(self, index: int) -> None:
        p = self.ctx.Process(target=worker_main, name=f"shmq-worker-{index}",
                             args=(self.config, index, os.getpid()))
        p.start()
        self.workers[index] = p
        self.handed[index] = 0

    def _start_services(self) -> None:
        p = self.ctx.Process(target=services_main, name="shmq-services",
                             args=(self.config, os.getpid()))
        p.start()
        self.services = p

    def _await_workers(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.chans) < len(self.workers):
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start")
            dead = [i for i, p in self.workers.items() if not p.is_alive()]
            if dead:
                raise RuntimeError(f"worker {dead[0]} exited at start "
                                   f"(code {self.workers[dead[0]].exitcode})")
            self.step(0.05)

    def ready_line(self) -> str:
        c = self.config
        ns = ";".join(c.namesrv_addrs) or "none"
        return (f"shmq broker ready tcp={c.bindAddress}:{c.listenPort} unix={c.unix_path} "
                f"namesrv={ns} store={c.store.storePathRootDir} workers={len(self.workers)}")

    # ----------------------------------------------------------------- loop
    def run(self) -> None:
        while not self.stopping:
            self.step(TICK_S)
            self.supervise()

    def step(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            what = key.data
            if what in ("tcp", "unix"):
                self._accept(key.fileobj, what)
            elif what == "chan":
                self._worker_hello(key.fileobj)
            else:   # a worker channel became readable: the worker is gone
                self._channel_closed(what)
        if self.pending and self.chans:
            pending, self.pending = self.pending, []
            for sock, peer in pending:
                self._hand(sock, peer)

    def _accept(self, lsock: socket.socket, what: str) -> None:
        for _ in range(64):
            try:
                sock, addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:   # EMFILE and the like: log, keep serving
                log.error("accept on %s failed: %s", what, e)
                return
            peer = f"{addr[0]}:{addr[1]}" if what == "tcp" else "unix"
            if not self.chans:
                if len(self.pending) >= PENDING_MAX:
                    sock.close()
                else:
                    self.pending.append((sock, peer))
                continue
            self._hand(sock, peer)

    def _hand(self, sock: socket.socket, peer: str) -> None:
        index = min(self.chans, key=lambda i: self.handed[i])
        try:
            socket.send_fds(self.chans[index], [peer.encode()], [sock.fileno()])
            self.handed[index] += 1
        except OSError as e:
            log.warning("handing a connection to worker %d failed: %s", index, e)
        finally:
            sock.close()

    def _worker_hello(self, lsock: socket.socket) -> None:
        try:
            chan, _ = lsock.accept()
        except (BlockingIOError, InterruptedError):
            return
        chan.settimeout(10)
        try:
            line = chan.recv(256).decode()
            index, slot, _pid = (int(x) for x in line.split())
        except (OSError, ValueError):
            chan.close()
            return
        chan.setblocking(True)
        old = self.chans.pop(index, None)
        if old is not None:
            self.sel.unregister(old)
            old.close()
        self.chans[index] = chan
        self.worker_slots[index] = slot
        self.sel.register(chan, selectors.EVENT_READ, index)

    def _channel_closed(self, index: int) -> None:
        chan = self.chans.pop(index, None)
        if chan is not None:
            self.sel.unregister(chan)
            chan.close()

    def supervise(self) -> None:
        self.owner.supervise()
        for index, p in list(self.workers.items()):
            if p.is_alive() or self.stopping:
                continue
            p.join()
            log.warning("worker %d (pid %d) exited with %s: restarting", index, p.pid, p.exitcode)
            self._channel_closed(index)
            slot = self.worker_slots.pop(index, None)
            if slot is not None:
                self.owner.supervise()    # its slot and the append lock, if it held it
                n = self.registry.forget_worker(slot)
                if n:
                    self.owner.cb.wake_flagged(WANT_CLIENTS)   # its groups changed
            self._start_worker(index)
        if self.services is not None and not self.services.is_alive() and not self.stopping:
            log.warning("services (pid %d) exited with %s: restarting", self.services.pid,
                        self.services.exitcode)
            self._start_services()
        if self.namesrv is not None and not self.namesrv.is_alive() and not self.stopping:
            log.warning("the embedded NameServer exited with %s: restarting", self.namesrv.exitcode)
            self._start_namesrv()

    # ----------------------------------------------------------------- stop
    def stop(self) -> None:
        self.stopping = True
        for s in self.listeners:
            try:
                self.sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()
        self.listeners = []
        for sock, _ in self.pending:
            sock.close()
        self.pending = []
        _terminate(list(self.workers.values()))
        for chan in self.chans.values():
            chan.close()
        self.chans = {}
        if self.services is not None:
            _terminate([self.services])
        if self.owner.store is not None and self.registry is not None:
            try:
                self.registry.save_offsets()
            except OSError as e:
                log.error("saving consumer offsets failed: %s", e)
        self.owner.close()
        if self.namesrv is not None:
            _terminate([self.namesrv])
        path = self.config.unix_path
        if os.path.exists(path):
            os.unlink(path)


def _terminate(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def run_broker(config: BrokerConfig, out=sys.stdout) -> int:
    """``shmq broker``: start, print the ready line, serve until SIGTERM/SIGINT."""
    set_process_name("shmq-boss")
    boss = Boss(config)

    def on_signal(signum, frame):
        boss.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    boss.start()
    print(boss.ready_line(), file=out, flush=True)
    try:
        boss.run()
    finally:
        log.info("shutting down")
        boss.stop()
        log.info("stopped cleanly")
    return 0

