"""The boss: owns the store, accepts connections, hands them to workers, supervises.

``shmq broker`` runs this in its main process (DESIGN §3)::

    boss ─┬─ shmq-compile × cores (first start only: kernels, broker/kernels.py)
          └─ forkserver (modules and kernels loaded: broker/preload.py) forks
               ├─ namesrv   (embedded NameServer, unless namesrvAddr / -n names one)
               ├─ flusher   (started by StoreOwner: group commit, CQ flush, retention)
               ├─ worker × N (reactors; connections arrive by SCM_RIGHTS)
               ├─ services  (NameServer registration, offset persistence, expiry)
               └─ ha        (replication: a master's slaves, a slave's master; broker/ha)

Start-up: compile what the kernel cache lacks (in parallel, logged), start
the fork server, take the store (recovery), lay out the registries after
the store state, load consumer offsets, write the system topics, bind every
port (TCP, ``<store>/broker.sock``, the NameServer's, a master's HA port),
start the NameServer, workers, services and the HA process, wait for the first NameServer registration, print the
ready line. A signal at any step stops the start at the next. Then: accept
→ hand the socket to the worker with the fewest connections handed so far
(round robin among equals); every tick, repair after any dead process
(append lock, its unfinished appends, registry rows) and restart it, with
back-off for one that keeps failing (``Restarts``). Every child dies with the boss (PDEATHSIG on
the fork server, which exits with the boss). SIGTERM/SIGINT: stop
accepting, stop the workers (they answer what is parked), stop services
(offsets saved, broker unregistered), flush and checkpoint, remove
``abort``, unlink the shared memory.
"""
from __future__ import annotations

import dataclasses
import errno
import logging
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.util
import os
import re
import resource
import selectors
import shutil
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass

from shmq.core import jit
from shmq.ipc.control import FORK_SERVER_OWNER, REGISTERED, WANT_CLIENTS, set_process_name

from .config import SLAVE, SYNC_MASTER, BrokerConfig
from .delivery import tags_code_rules
from .ha.process import ha_main
from .kernels import Interrupted, compile_cold
from .namesrv import listen as namesrv_listen
from .namesrv import serve as namesrv_serve
from .reactor import SignalWakeup
from .registry import Registry, registry_bytes
from .services import services_main
from .shared_store import StoreOwner, extra_region
from .stats import lay_out, stats_bytes
from .topics import Tables, check_config_files
from .worker import boss_address, worker_main

log = logging.getLogger("shmq.boss")
TICK_S = 0.2
STOP_TIMEOUT_S = 15
PENDING_MAX = 4096
# A child that dies of its own failure (not SIGKILL) within STABLE_S of its
# start is restarted after a back-off doubling from BACKOFF_FIRST_S up to
# BACKOFF_MAX_S; after GIVE_UP_AFTER such deaths in a row the boss stops the
# broker with an error. One that ran longer, or was killed, restarts at once.
STABLE_S = 10.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 8.0
GIVE_UP_AFTER = 5
# Ready means ready: the ready line waits for the first NameServer
# registration (a client asking for routes at once finds them), at most this
# long (RocketMQ's registerBrokerTimeoutMills); past it the line is printed
# with a warning and the services keep trying. The embedded NameServer is
# the broker's own, started beside it: the line waits for it (a busy machine
# may take seconds to start it), up to the longer bound.
REGISTER_WAIT_S = 6.0
EMBEDDED_REGISTER_WAIT_S = 60.0
# accept() failing for want of descriptors (EMFILE/ENFILE) is logged at most
# once per this many seconds, with how many failed meanwhile.
FD_LOG_EVERY_S = 1.0


def raise_nofile() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (capped by
    fs.nr_open when the hard limit is unlimited), before any child starts,
    so every child inherits it. At the usual soft 1,024 a busy broker runs
    out of descriptors. Returns the soft limit in effect."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as e:
            log.warning("open files limit (RLIMIT_NOFILE) stays at %d: raising it to %d "
                        "failed: %s", soft, target, e)
            return soft
        log.info("open files limit (RLIMIT_NOFILE) raised from %d to %d (the hard limit)",
                 soft, target)
        return target
    log.info("open files limit (RLIMIT_NOFILE) is %d (hard %d)", soft, hard)
    return soft


class ChildFailing(RuntimeError):
    """A supervised child keeps dying: the broker cannot serve."""


@dataclass
class Restarts:
    """Supervision state of one child (by name: ``worker-0``, ``services`` …)."""
    started_at: float = 0.0
    failures: int = 0             # consecutive quick deaths of its own failure
    due_at: float | None = None   # when a dead child is to be started again
    deaths: int = 0               # every death (the metrics' shmq_restarts_total)

    def died(self, exitcode: int | None, now: float, name: str) -> float:
        """Record a death; returns the delay before the restart."""
        ran_s = now - self.started_at
        self.deaths += 1
        if exitcode == -signal.SIGKILL or ran_s >= STABLE_S:
            self.failures = 0
            delay = 0.0
        else:
            self.failures += 1
            if self.failures >= GIVE_UP_AFTER:
                raise ChildFailing(f"{name} exited {self.failures} times in a row within "
                                   f"{STABLE_S:.0f} s of its start (last exit code {exitcode}); "
                                   f"stopping the broker: see the log above for why")
            delay = min(BACKOFF_FIRST_S * 2 ** (self.failures - 1), BACKOFF_MAX_S)
        log.warning("%s exited with %s after %.1f s: restarting%s", name, exitcode, ran_s,
                    f" in {delay:.1f} s" if delay else "")
        self.due_at = now + delay
        return delay


UNIX_PATH_MAX = 107      # sun_path is 108 bytes, NUL included
FORK_SERVER_DIR = "forkserver.dir"   # in the store: where the boss's fork server listened


def check_unix_path(path: str) -> None:
    """A Unix socket path the kernel takes, or one line saying what to set:
    at start, before recovery, not as bind's bare "AF_UNIX path too long"."""
    n = len(os.fsencode(path))
    if n > UNIX_PATH_MAX:
        raise RuntimeError(f"cannot listen on the Unix socket {path}: its path is {n} bytes, and a "
                           f"Unix socket's may be at most {UNIX_PATH_MAX}; set unixSocketPath to a "
                           f"shorter one (the default is broker.sock in storePathRootDir)")


class Boss:
    def __init__(self, config: BrokerConfig):
        self.config = config
        # Children fork from a server that has loaded their modules and the
        # kernels, and nothing else (broker/preload.py).
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(["shmq.broker.preload"])
        self.owner = StoreOwner(config.store, extra_bytes=registry_bytes()
                                + stats_bytes(config.store.maxProcessSlots),
                                tags_code_rules=tags_code_rules(config.delay_levels_ms),
                                mp_context=self.ctx, dedup_window=0 if config.brokerRole == SLAVE
                                else config.sendDedupWindowSize)
        # (a slave takes no sends and its replica appends add no keys: a window
        # kept there, saved at its stop, would lack everything it replicated
        # when it restarts as a master; that start refills one from the store)
        self.workers: dict[int, multiprocessing.Process] = {}
        self.chans: dict[int, socket.socket] = {}         # worker index → channel
        self.handed: dict[int, int] = {}                  # worker index → connections handed
        self.worker_slots: dict[int, int] = {}
        self.pending: list[tuple[socket.socket, str]] = []
        self.namesrv: multiprocessing.Process | None = None
        self.services: multiprocessing.Process | None = None
        self.ha: multiprocessing.Process | None = None
        self.ha_sock: socket.socket | None = None
        self.metrics_sock: socket.socket | None = None   # metricsPort's, served by the services
        self.sel = selectors.DefaultSelector()
        self.signals: SignalWakeup | None = None
        self.stopping = False
        self.registry: Registry | None = None
        self.listeners: list[socket.socket] = []
        self.unix_bound = False           # the store's Unix socket is ours to remove at stop
        self.namesrv_sock: socket.socket | None = None
        self.restarts: dict[str, Restarts] = {}
        self.stats = None                 # the boss's tally of the counters (broker/stats.py)
        self.next_index = 0
        self.fd_failures = 0                  # accepts failed (EMFILE/ENFILE) since the last line
        self.fd_logged_at = float("-inf")

    # ---------------------------------------------------------------- start
    def start(self) -> None:
        """Everything up to the ready line. A signal meanwhile (``stopping``)
        raises ``Interrupted`` at the next step; the caller then stops."""
        c = self.config
        raise_nofile()   # before the compilers and the fork server: every child inherits it
        try:
            check_config_files(c)   # a bad config file: one line naming it, before anything runs
            check_unix_path(c.unix_path)
            compile_cold(jit.BROKER, should_stop=lambda: self.stopping)
            os.environ[FORK_SERVER_OWNER] = str(os.getpid())    # the fork server's owner (preload.py)
            # Ctrl-C reaches the whole process group: the fork server (and so
            # every child it forks) ignores SIGINT, as the boss ends them; with
            # Python's default it died of a KeyboardInterrupt in its imports
            # when Ctrl-C came while it loaded, a traceback and an EOF here
            sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                multiprocessing.forkserver.ensure_running()   # it loads while we recover
            finally:
                signal.signal(signal.SIGINT, sigint)
                del os.environ[FORK_SERVER_OWNER]
            jit.load(jit.BROKER)     # from the cache, now complete
            jit.freeze(jit.BROKER)   # no compile on a request path (core/jit.py)
            self._check_stop()
            report = self.owner.open()
            self._started("flusher")     # (open started it)
            self._reclaim_fork_server_dir()
            log.info("store %s: %s", c.store.storePathRootDir, report.summary())
            self.registry = Registry(extra_region(self.owner.cb, self.owner.store),
                                     c.store.storePathRootDir, create=True)
            self.stats = lay_out(self.owner.cb, self.owner.store, c.store.maxProcessSlots)
            n = self.registry.load_offsets()
            log.info("loaded %d consumer offsets", n)
            Tables(c, self.owner.store.state).ensure_system_topics()
            self._listen()
            self._check_stop()
            if self.namesrv_sock is not None:
                self._start_namesrv()
            for i in range(c.workers):
                self._start_worker(i)
            self._start_services()
            self._start_ha()
            self._await_workers()
            self._await_registered()
        except BaseException:
            self.stop()
            raise

    def _reclaim_fork_server_dir(self) -> None:
        """The fork server listens on a socket in a temporary directory of
        the boss's (``pymp-*`` in TMPDIR, /tmp by default) that Python
        removes when the boss exits, and a kill -9 leaves behind. Recorded
        in the store (``FORK_SERVER_DIR``), the store's next start removes
        it, as it reclaims the shared memory: it holds the store's lock,
        so that boss is dead. Unless a socket in it is still bound (a copy
        of a live broker's store: that broker's fork server is listening)."""
        files = self.owner.store.files
        record = os.path.join(self.config.store.storePathRootDir, FORK_SERVER_DIR)
        mine = multiprocessing.util.get_temp_dir()     # where ensure_running put the socket
        old = (files.read_bytes(record) or b"").decode(errors="replace").strip()
        if (old and old != mine and re.fullmatch(r"pymp-[A-Za-z0-9_]+", os.path.basename(old))
                and os.path.isdir(old) and not _bound_under(old)):
            shutil.rmtree(old, ignore_errors=True)
            log.info("removed %s, the fork server's directory of this store's last boss", old)
        files.write_durable(record, mine.encode() + b"\n")

    def _check_stop(self) -> None:
        if self.stopping:
            raise Interrupted("stopped by a signal during start")

    def _start_namesrv(self) -> None:
        # The boss holds the listening socket (bound in _listen): a restarted
        # NameServer takes the same one, and no other process can take the port.
        c = self.config
        p = self.ctx.Process(target=namesrv_serve, name="shmq-namesrv",
                             args=(c.bindAddress, c.namesrvListenPort, os.getpid(), None,
                                   self.namesrv_sock, c.acl_file if c.aclEnable else None))
        p.start()
        self.namesrv = p
        self._started("namesrv")

    def _started(self, name: str) -> None:
        r = self.restarts.setdefault(name, Restarts())
        r.started_at = time.monotonic()
        r.due_at = None

    def _listen(self) -> None:
        """Bind every port before any child starts: a port in use is one
        clear error at start, never a child that dies and is restarted."""
        c = self.config
        try:   # a bad address would be blamed on the first port bound (the NameServer's)
            socket.getaddrinfo(c.bindAddress, None, socket.AF_INET, socket.SOCK_STREAM)
        except OSError as e:
            raise RuntimeError(f"bindAddress={c.bindAddress!r}: not an IPv4 address or a host name "
                               f"this machine resolves ({e.strerror or e})") from None
        if c.runs_embedded_namesrv:
            try:
                self.namesrv_sock = namesrv_listen(c.bindAddress, c.namesrvListenPort)
            except OSError as e:
                raise RuntimeError(
                    f"cannot listen on {c.bindAddress}:{c.namesrvListenPort} for the embedded "
                    f"NameServer (namesrvListenPort): {e.strerror}. If a NameServer already runs "
                    f"there, register with it: shmq broker -n {c.bindAddress}:"
                    f"{c.namesrvListenPort}") from None
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            tcp.bind((c.bindAddress, c.listenPort))
        except OSError as e:
            tcp.close()
            raise RuntimeError(f"cannot listen on {c.bindAddress}:{c.listenPort} (listenPort): "
                               f"{e.strerror}; is another broker running there?") from None
        tcp.listen(4096)
        if c.brokerRole != SLAVE:
            try:
                self.ha_sock = _bind(c.bindAddress, c.ha_port, "haListenPort")
            except RuntimeError as e:
                if c.brokerRole == SYNC_MASTER:     # it cannot answer a send without a slave
                    tcp.close()
                    raise
                log.error("%s: no slave can connect to this ASYNC_MASTER", e)
        if c.metricsPort:
            try:
                self.metrics_sock = _bind(c.bindAddress, c.metricsPort, "metricsPort")
            except RuntimeError:
                tcp.close()                # (the HA socket: stop() closes it)
                raise
        path = c.unix_path
        if os.path.exists(path):
            os.unlink(path)    # left by a previous run: we hold the store lock
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)   # the socket is made 0600: only this user may connect
        try:
            unix.bind(path)
        except OSError as e:
            unix.close()
            tcp.close()
            raise RuntimeError(f"cannot listen on the Unix socket {path} (unixSocketPath): "
                               f"{e.strerror}") from None
        finally:
            os.umask(old_umask)
        self.unix_bound = True
        unix.listen(4096)
        chan = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        chan.bind(boss_address(self.owner.cb.namespace))
        chan.listen(64)
        for s, what in ((tcp, "tcp"), (unix, "unix"), (chan, "chan")):
            s.setblocking(False)
            self.sel.register(s, selectors.EVENT_READ, what)
            self.listeners.append(s)
        # Port 0 is any port: from here on the config names the ports taken,
        # for the ready line, the NameServer registration and every child.
        taken = {}
        if c.listenPort == 0:
            taken["listenPort"] = tcp.getsockname()[1]
        if self.namesrv_sock is not None and c.namesrvListenPort == 0:
            taken["namesrvListenPort"] = self.namesrv_sock.getsockname()[1]
        if self.ha_sock is not None and c.ha_port == 0:
            taken["haListenPort"] = self.ha_sock.getsockname()[1]
        if taken:
            self.config = dataclasses.replace(c, **taken)

    def _start_worker(self, index: int) -> None:
        p = self.ctx.Process(target=worker_main, name=f"shmq-worker-{index}",
                             args=(self.config, index, os.getpid()))
        p.start()
        self.workers[index] = p
        self.handed[index] = 0
        self._started(f"worker-{index}")

    def _start_services(self) -> None:
        p = self.ctx.Process(target=services_main, name="shmq-services",
                             args=(self.config, os.getpid(), self.metrics_sock))
        p.start()
        self.services = p
        self._started("services")

    def _start_ha(self) -> None:
        if self.ha_sock is None and self.config.brokerRole != SLAVE:
            return                    # a master whose HA port was taken: no slave to serve
        p = self.ctx.Process(target=ha_main, name="shmq-ha",
                             args=(self.config, os.getpid(), self.ha_sock))
        p.start()
        self.ha = p
        self._started("ha")

    def _await_workers(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.chans) < len(self.workers):
            self._check_stop()
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start")
            dead = [i for i, p in self.workers.items() if not p.is_alive()]
            if dead:
                raise RuntimeError(f"worker {dead[0]} exited at start "
                                   f"(code {self.workers[dead[0]].exitcode})")
            self.step(0.05)

    def _await_registered(self) -> None:
        if not self.config.namesrv_addrs:
            return
        timeout_s = EMBEDDED_REGISTER_WAIT_S if self.namesrv is not None else REGISTER_WAIT_S
        deadline = time.monotonic() + timeout_s
        while not self.owner.cb.flags_of(self.services.pid) & REGISTERED:
            self._check_stop()
            for name, p in (("services", self.services), ("namesrv", self.namesrv)):
                if p is not None and not p.is_alive():
                    raise RuntimeError(f"the {name} process exited at start (code {p.exitcode})")
            if time.monotonic() > deadline:
                log.warning("not registered with the NameServer (%s) within %.0f s: clients find "
                            "this broker's routes once it is (it keeps trying)",
                            ";".join(self.config.namesrv_addrs), timeout_s)
                return
            self.step(0.02)

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
            elif what == "signal":
                self.signals.drain()
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
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    self._out_of_fds(what, e)
                else:
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

    def _out_of_fds(self, what: str, e: OSError) -> None:
        """One ERROR line a second at most (not one per failed accept), naming
        the limit and how to raise it."""
        self.fd_failures += 1
        now = time.monotonic()
        if now - self.fd_logged_at < FD_LOG_EVERY_S:
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        which = ("the system-wide limit (fs.file-max)" if e.errno == errno.ENFILE
                 else f"the open files limit (RLIMIT_NOFILE soft {soft}, hard {hard})")
        log.error("accept on %s failed: %s (%d time(s) since the last such line): %s is "
                  "reached, connections wait or are refused: raise it (ulimit -n before shmq "
                  "broker, LimitNOFILE= in a systemd unit, nofile in /etc/security/limits.conf)",
                  what, e.strerror, self.fd_failures, which)
        self.fd_failures = 0
        self.fd_logged_at = now

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
        # The channel is an abstract Unix socket, which file permissions do not
        # guard: only a worker this boss started may say hello (the kernel's
        # SO_PEERCRED names the peer), or any local user could claim to be a
        # worker and be handed clients' connections.
        pid, _uid, _gid = struct.unpack("3i", chan.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
        chan.settimeout(10)
        try:
            line = chan.recv(256).decode()
            index, slot, said_pid = (int(x) for x in line.split())
        except (OSError, ValueError):
            chan.close()
            return
        worker = self.workers.get(index)
        if worker is None or worker.pid != pid or said_pid != pid:
            log.warning("refused a worker hello from pid %d (as worker %d): not a worker this "
                        "boss started", pid, index)
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
        """Repair after dead processes, and restart each (with back-off when
        it keeps failing; ``ChildFailing`` when it will not stay up)."""
        if self.stopping:
            return
        now = time.monotonic()
        self.owner.supervise(restart_flusher=False)
        for index, p in list(self.workers.items()):
            if p is not None and not p.is_alive():
                p.join()
                self.workers[index] = None
                self._channel_closed(index)
                slot = self.worker_slots.pop(index, None)
                if slot is not None:
                    self.owner.supervise(restart_flusher=False)   # its slot, the append lock, its claims
                    if self.registry.forget_worker(slot):
                        self.owner.cb.wake_flagged(WANT_CLIENTS)   # its groups changed
                self.restarts[f"worker-{index}"].died(p.exitcode, now, f"worker {index} (pid {p.pid})")
            if self.workers[index] is None and self._due(f"worker-{index}", now):
                self._start_worker(index)
        for name, attr, start in (("services", "services", self._start_services),
                                  ("namesrv", "namesrv", self._start_namesrv),
                                  ("ha", "ha", self._start_ha)):
            p = getattr(self, attr)
            if p is not None and not p.is_alive():
                p.join()
                setattr(self, attr, None)
                self.restarts[name].died(p.exitcode, now, f"{name} (pid {p.pid})")
            if getattr(self, attr) is None and self._due(name, now):
                start()
        f = self.owner.flusher
        if f is not None and not f.is_alive():
            f.join()
            self.owner.flusher = None
            self.restarts.setdefault("flusher", Restarts()).died(f.exitcode, now, f"flusher (pid {f.pid})")
        if self.owner.flusher is None and self._due("flusher", now):
            self.owner.start_flusher()
            self._started("flusher")
        if self.stats is not None:
            self.stats.set_gauge("restarts", sum(r.deaths for r in self.restarts.values()))

    def _due(self, name: str, now: float) -> bool:
        r = self.restarts.get(name)
        return r is not None and r.due_at is not None and now >= r.due_at

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
        _terminate([p for p in self.workers.values() if p is not None])
        for chan in self.chans.values():
            chan.close()
        self.chans = {}
        if self.ha is not None:
            _terminate([self.ha])
        if self.ha_sock is not None:
            self.ha_sock.close()
            self.ha_sock = None
        if self.services is not None:
            _terminate([self.services])
        if self.metrics_sock is not None:
            self.metrics_sock.close()
            self.metrics_sock = None
        if self.owner.store is not None and self.registry is not None:
            try:
                self.registry.save_offsets()
            except OSError as e:
                log.error("saving consumer offsets failed: %s", e)
        try:
            self.owner.close()     # (a failed last flush raises: the next start recovers)
        finally:
            # whatever the store's close raised: a NameServer left running
            # kept the boss from exiting (multiprocessing joins its children
            # at exit), so a stop that failed hung instead
            if self.namesrv is not None:
                _terminate([self.namesrv])
            if self.namesrv_sock is not None:
                self.namesrv_sock.close()
                self.namesrv_sock = None
            # only the socket this boss bound: a second broker refused on a
            # store in use stops here too, and the path is the live broker's
            path = self.config.unix_path
            if self.unix_bound and os.path.exists(path):
                os.unlink(path)
                self.unix_bound = False


def _bound_under(directory: str) -> bool:
    """Does a live socket of this host have its path in ``directory``
    (/proc/net/unix lists the paths of bound Unix sockets)?"""
    prefix = directory.rstrip("/") + "/"
    try:
        with open("/proc/net/unix") as f:
            return any(parts[7].startswith(prefix) for parts in
                       (line.rstrip("\n").split(None, 7) for line in f) if len(parts) == 8)
    except OSError:
        return True                     # cannot tell: leave it


def _bind(host: str, port: int, setting: str) -> socket.socket:
    """A listening TCP socket, or one clear error naming ``setting``."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        s.close()
        raise RuntimeError(f"cannot listen on {host}:{port} ({setting}): {e.strerror}; is "
                           f"another broker running there?") from None
    s.listen(64)
    return s


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
    """``shmq broker``: start, print the ready line, serve until SIGTERM/SIGINT.
    A signal during start stops it at the next step (well within 1 s: the
    boss only waits there; compilers and children are killed or told)."""
    set_process_name("shmq-boss")
    boss = Boss(config)

    def on_signal(signum, frame):
        boss.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    boss.signals = SignalWakeup()              # a signal ends the boss's select at once
    boss.sel.register(boss.signals.r, selectors.EVENT_READ, "signal")
    try:
        boss.start()
    except Interrupted:
        log.info("stopped before it was ready")
        return 0
    print(boss.ready_line(), file=out, flush=True)
    code = 0
    try:
        boss.run()
    except ChildFailing as e:
        log.error("%s", e)
        code = 1
    finally:
        log.info("shutting down")
        boss.stop()
        log.info("stopped cleanly" if code == 0 else "stopped")
    return code
