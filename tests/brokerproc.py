"""Run a real ``shmq broker`` process for a test: free ports, a temp store, the ready line.

    with start_broker(tmp_path, flushDiskType="SYNC_FLUSH") as b:
        RemotingClient(b.addr) ... ; b.kill9() ; b.stop()

Everything listens on 127.0.0.1 (and the store's Unix socket). The broker's
stderr goes to ``<tmp>/broker.log`` (printed when start-up fails), its log
files (broker/logs.py) to ``<tmp>/logs/`` (SHMQ_LOG_DIR), its temporary
files to ``<tmp>`` (TMPDIR): the boss's fork server listens on a socket in
a ``pymp-*`` directory there, which a clean stop removes and a kill -9
leaves behind — in the test's own directory, not one more in /tmp (unless
``<tmp>`` is too long a path for the socket's name).

A test broker dies with the test process: it runs in a session of its own
(a Ctrl-C at the terminal does not reach it, and ``kill9`` can kill its
whole group), so nothing else would stop a broker whose pytest was killed
(SIGKILL, a CI timeout) — it would hold its ports, its store and its shared
memory until someone found it. The boss is started with the kernel's
parent-death signal (``die_with_parent``: SIGKILL when the process that
started it dies; its children die with it as with any boss). The signal
follows the *thread* that started the broker: start test brokers from a
thread that outlives them (the main thread, as fixtures do). The product's
own daemon mode does not do this: a broker outlives the shell that started it.

A broker stopped cleanly unlinks its store's shared memory, and one killed
-9 leaves it for the store's next broker to reclaim (``ipc/control.py``);
a test that kills its broker and starts none again on that store, which is
then deleted, would leave it in /dev/shm for good (two names, the state's
size, a store each). ``release_shared_memory`` unlinks what such a broker
left; leaving a ``with BrokerProc`` does it, and so does this process's exit
for every store it started a broker on.
"""
from __future__ import annotations

import atexit
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

from shmq.ipc.control import (ControlBlock, NotRunning, die_with_parent, names, pid_alive,
                              process_start_ticks, unlink_names)

READY = re.compile(r"^shmq broker ready tcp=(\S+) unix=(\S+) namesrv=(\S+) store=(\S+)")
UNIX_PATH_MAX = 107          # sun_path is 108 bytes, NUL included (as broker/boss.py)
SMALL = dict(mappedFileSizeCommitLog=str(16 << 20), maxMessageSize=str(1 << 20),
             maxQueueSlots="4096", workerProcessNums="2")


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768                             # Linux's default range is 32768-60999


# free_port's pool: ports below the kernel's ephemeral range, cut into slices,
# one an xdist worker (PYTEST_XDIST_WORKER gw0, gw1, ...; a run without xdist
# takes the last). A port from bind(("127.0.0.1", 0)) is one the kernel may
# hand again at once: to the other worker's free_port, or to any connect()'s
# local end, between this check and the broker's bind ("Address already in
# use" at random under pytest -n). The kernel gives no port of this pool to
# anyone who did not ask for it by number, the workers' slices are disjoint,
# and within one process the pool is walked in turn, so a port once handed
# out is not handed out again before the walk wraps (a slice holds ~800).
# Even ports only: a broker whose haListenPort is left at listenPort + 1
# (RocketMQ's default) binds an odd one, which no free_port hands out (a
# walk in steps of one gave that port to the next setting of the same
# broker, namesrvListenPort: "one port for two listeners").
PORTS_LOW = 20000
PORTS_SLICES = 8


def _port_pool() -> list[int]:
    high = max(_ephemeral_low(), PORTS_LOW + PORTS_SLICES * 100)
    pairs = (high - PORTS_LOW) // PORTS_SLICES // 2
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) % (PORTS_SLICES - 1) if worker.startswith("gw") else PORTS_SLICES - 1
    start = os.getpid() % pairs                  # two runs at once start apart
    return [PORTS_LOW + 2 * (index * pairs + (start + i) % pairs) for i in range(pairs)]


_POOL: list[int] = []
_next_port = 0


def free_port() -> int:
    """A port nothing listens on now and that no other worker of this run is
    handed (see the pool above); the caller's server binds it soon after."""
    global _next_port
    if not _POOL:
        _POOL.extend(_port_pool())
    for _ in range(len(_POOL)):
        port = _POOL[_next_port % len(_POOL)]
        _next_port += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue                         # in use (or in TIME_WAIT): the next
            return port
    raise RuntimeError(f"no free port in the test port pool {_POOL[0]}-{_POOL[-1]}")


def ready_line(proc: subprocess.Popen, timeout: float) -> str:
    """The next line ``proc`` writes to its stdout (a text pipe), or "" at
    its end or when none comes within ``timeout`` s, so that a server whose
    start hangs fails its test instead of holding the suite. For processes
    that print whole lines one at a time, as the servers' ready lines are:
    a line already read into the pipe's buffer is not seen by select."""
    if not select.select([proc.stdout], [], [], max(0.0, timeout))[0]:
        return ""
    return proc.stdout.readline()


def spawn(argv: list[str], **popen) -> subprocess.Popen:
    """Start ``argv`` as a test broker is started: in a session of its own,
    killed by the kernel when this process dies (see the module doc)."""
    me = os.getpid()
    return subprocess.Popen(argv, start_new_session=True, preexec_fn=lambda: die_with_parent(me),
                            **popen)


def shared_memory(store) -> list[str]:
    """The /dev/shm entries of the store's control block that exist."""
    shm, sem, _ = names(str(store))
    return [n for n in (shm[1:], f"sem.{sem[1:]}") if os.path.exists(f"/dev/shm/{n}")]


_STARTED: dict[str, list[tuple[int, int]]] = {}   # store → (pid, start ticks) of the bosses started on it


def release_shared_memory(store_dir: str) -> None:
    """Unlink the store's shared memory if its broker was killed -9 (see the
    module doc), unless a boss this process started on the store still runs
    or the block's owner is alive."""
    if any(pid_alive(pid, start) for pid, start in _STARTED.get(store_dir, ())):
        return
    try:
        ControlBlock.attach(store_dir).close()
        return                                   # a live owner: its own to unlink
    except NotRunning:
        unlink_names(store_dir)


@atexit.register
def _release_all() -> None:
    for store_dir in _STARTED:
        release_shared_memory(store_dir)


class BrokerProc:
    def __init__(self, tmp, conf: dict, env: dict | None = None):
        self.tmp = str(tmp)
        self.conf = conf
        self.env = env
        self.conf_path = os.path.join(self.tmp, "broker.conf")
        with open(self.conf_path, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in conf.items())
        self.log_path = os.path.join(self.tmp, "broker.log")
        self.log_dir = os.path.join(self.tmp, "logs")
        self.proc: subprocess.Popen | None = None
        self.addr = self.unix = self.namesrv = self.store = None
        self.store_dir = os.path.realpath(conf.get("storePathRootDir", os.path.expanduser("~/store")))

    def start(self, timeout: float = 90) -> "BrokerProc":
        log = open(self.log_path, "a")
        self.proc = spawn([sys.executable, "-m", "shmq.tools", "broker", "-c", self.conf_path],
                          stdout=subprocess.PIPE, stderr=log, text=True,
                          env={**os.environ, "SHMQ_LOG_DIR": self.log_dir, **self._tmpdir(),
                               **(self.env or {})})
        log.close()
        _STARTED.setdefault(self.store_dir, []).append(
            (self.proc.pid, process_start_ticks(self.proc.pid)))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = ready_line(self.proc, deadline - time.monotonic())
            if not line:
                break
            m = READY.match(line)
            if m:
                tcp, self.unix, self.namesrv, self.store = m.groups()
                self.addr = tcp
                return self
        self.kill9()
        raise RuntimeError(f"broker did not start; log:\n{self.log()[-4000:]}")

    def _tmpdir(self) -> dict:
        """TMPDIR=<tmp>, where the fork server's socket path
        (``<tmp>/pymp-XXXXXXXX/listener-XXXXXXXX``) fits a Unix socket name."""
        return {"TMPDIR": self.tmp} if len(self.tmp) + 32 < UNIX_PATH_MAX else {}

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM and wait: the clean shutdown path. Returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise

    def kill9(self, timeout: float = 30) -> None:
        """kill -9 the boss alone, as the OOM killer or an operator would.
        Every other process of the broker must die with it (PDEATHSIG, through
        its fork server): this waits until they have, and fails naming any
        that outlive it, after killing its process group so none is left."""
        if self.proc is None or self.proc.poll() is not None:
            return
        kids = {name: (pid, process_start_ticks(pid)) for name, pid in self.children().items()}
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + timeout
        while True:
            kids = {name: (pid, t) for name, (pid, t) in kids.items()
                    if t >= 0 and process_start_ticks(pid) == t}
            if not kids or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if kids:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            raise AssertionError(f"outlived the boss's kill -9 by {timeout:g} s: {kids}")

    def children(self) -> dict[str, int]:
        """Process name (shmq-worker-0, shmq-flusher, shmq-namesrv, shmq-services)
        → pid, for the boss's processes (its children and theirs: most fork
        from its fork server), found by ``broker.procs``."""
        from shmq.broker.procs import children
        return children(self.proc.pid)

    def __enter__(self) -> "BrokerProc":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            self.kill9()
            release_shared_memory(self.store_dir)


def _looks(fn, what: str, timeout: float):
    """``fn()``'s values, one a look, while they are falsy and ``timeout``
    has not passed (then the test fails naming ``what`` and the last)."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        yield got
        assert time.monotonic() < deadline, f"never within {timeout:g} s: {what}; last {got!r}"


def until(fn, what: str, timeout: float = 15.0, step: float = 0.05):
    """``fn()`` again until it is truthy (its value is returned), polling
    every ``step`` seconds; after ``timeout`` the test fails naming ``what``
    and the last value."""
    for got in _looks(fn, what, timeout):
        if got:
            return got
        time.sleep(step)


async def until_async(fn, what: str, timeout: float = 15.0, step: float = 0.02):
    """``until`` for a coroutine: the loop runs (other tasks too) between looks."""
    import asyncio
    for got in _looks(fn, what, timeout):
        if got:
            return got
        await asyncio.sleep(step)


def broker_conf(tmp, **conf) -> dict:
    """A test broker's settings: a store under ``tmp``, free ports, small files."""
    # haListenPort too: a master listens there (default listenPort + 1, which
    # another free port of the run may be by then)
    base = dict(storePathRootDir=os.path.join(str(tmp), "store"), listenPort=str(free_port()),
                namesrvListenPort=str(free_port()), haListenPort=str(free_port()),
                brokerIP1="127.0.0.1", **SMALL)
    base.update({k: str(v) for k, v in conf.items()})
    return base


def start_broker(tmp, **conf) -> BrokerProc:
    return BrokerProc(tmp, broker_conf(tmp, **conf)).start()


def routed_topic(broker: BrokerProc, topic: str, queues: int = 4) -> str:
    """Create ``topic`` and wait until the NameServer routes it, so a client
    that asks at once finds it. Returns the topic."""
    from shmq.client.remoting import RemotingClient
    from shmq.client.requests import create_topic
    from shmq.ipc.codes import RequestCode, ResponseCode
    from shmq.ipc.remoting import RemotingCommand
    with RemotingClient(broker.addr) as c:
        r = c.invoke(create_topic(topic, queues))
        assert r.code == ResponseCode.SUCCESS, r.remark
    deadline = time.monotonic() + 5
    with RemotingClient(broker.namesrv) as ns:
        route = RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic})
        while ns.invoke(route).code != ResponseCode.SUCCESS:
            assert time.monotonic() < deadline, f"{topic} never reached the NameServer"
            time.sleep(0.05)
    return topic


def topic_for(request, prefix: str) -> str:
    """A topic name of the running test's own (prefix + the test's name)."""
    return prefix + "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[-80:]


def stored_records(broker, topic: str, queues: int) -> list:
    """Every record stored in ``topic``'s first ``queues`` queues, pulled
    over the protocol page by page (``broker``: a BrokerProc or an address):
    what the broker holds, not what a client saw."""
    from shmq.client.remoting import RemotingClient
    from shmq.client.requests import decode_records, pull_message
    from shmq.ipc.codes import ResponseCode
    out = []
    with RemotingClient(getattr(broker, "addr", broker)) as c:
        for q in range(queues):
            off = 0
            while True:
                r = c.invoke(pull_message(topic, q, off, max_msgs=32))
                if r.code != ResponseCode.SUCCESS:
                    break
                out += decode_records(r.body)
                off = int(r.ext["nextBeginOffset"])
    return out
