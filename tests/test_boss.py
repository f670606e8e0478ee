"""Starting and supervising a broker as an operator meets it: the usual
RocketMQ start (a NameServer, then a broker with ``-n``), a first start that
compiles the kernels (and says so), a signal during start, a client started
the instant the broker is ready, and children that keep dying. (Ports in
use: test_cli.py.)"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from brokerproc import BrokerProc, broker_conf, free_port, ready_line
from shmq.broker.boss import (BACKOFF_FIRST_S, BACKOFF_MAX_S, GIVE_UP_AFTER, STABLE_S,
                              ChildFailing, Restarts)
from shmq.client.remoting import RemotingClient
from shmq.client.requests import create_topic, pull_message, send_batch, properties
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand

JIT_OFF = os.environ.get("NUMBA_DISABLE_JIT") == "1"


def _shmq_procs(boss_pid: int) -> list[int]:
    """Pids of live processes whose parent is ``boss_pid``."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == boss_pid and fields[0] != "Z":
                out.append(int(pid))
    return out


def _listed(namesrv: str, within_s: float, what: str) -> None:
    """Until the NameServer at ``namesrv`` lists broker-a in its cluster info."""
    with RemotingClient(namesrv) as c:
        deadline = time.monotonic() + within_s
        while True:
            r = c.invoke(RemotingCommand(RC.GET_BROKER_CLUSTER_INFO))
            if r.code == R.SUCCESS and b"broker-a" in r.body:
                return
            assert time.monotonic() < deadline, what
            time.sleep(0.1)


def test_dash_n_registers_with_a_running_namesrv_and_starts_no_embedded_one(tmp_path):
    ns_port = free_port()
    ns = subprocess.Popen([sys.executable, "-m", "shmq.tools", "namesrv", "-p", str(ns_port)],
                          stdout=subprocess.PIPE, text=True)
    try:
        assert ready_line(ns, 60).startswith("shmq namesrv ready")
        # the same port as the running NameServer: with -n nothing may bind it again
        conf = broker_conf(tmp_path, namesrvListenPort=ns_port, namesrvAddr=f"127.0.0.1:{ns_port}")
        with BrokerProc(tmp_path, conf).start() as b:
            assert b.namesrv == f"127.0.0.1:{ns_port}"
            assert "shmq-namesrv" not in b.children()
            _listed(f"127.0.0.1:{ns_port}", 10, "the broker never registered")
            assert "Traceback" not in b.log() and "restarting" not in b.log()
            assert b.stop() == 0
    finally:
        ns.terminate()
        ns.wait(30)


def test_a_namesrv_started_after_the_broker_gets_its_routes_within_seconds(tmp_path):
    """A NameServer that was not up when the broker started (or did not answer
    its first registration) is registered with a second later, not a
    registerNameServerPeriod later: until then its clients find no route."""
    ns_port = free_port()
    conf = broker_conf(tmp_path, namesrvAddr=f"127.0.0.1:{ns_port}",
                       registerNameServerPeriod=120000)
    with BrokerProc(tmp_path, conf).start() as b:
        assert "not registered with the NameServer" in b.log()
        ns = subprocess.Popen([sys.executable, "-m", "shmq.tools", "namesrv", "-p", str(ns_port)],
                              stdout=subprocess.PIPE, text=True)
        try:
            assert ready_line(ns, 60).startswith("shmq namesrv ready")
            _listed(f"127.0.0.1:{ns_port}", 15, "the broker did not register again")
            assert b.stop() == 0
        finally:
            ns.terminate()
            ns.wait(30)


def test_a_stop_whose_store_close_fails_still_ends_the_namesrv_and_raises(tmp_path):
    """The store's close raising at stop (a last flush the disk refused; a
    repair that failed): the embedded NameServer is still ended and the
    error still reaches the caller. Before, the stop ended there, the
    NameServer ran on, and the boss — whose exit joins its children —
    never exited (a CI run's broker hung 60 s until it was killed)."""
    import multiprocessing

    from shmq.broker.boss import Boss
    from shmq.broker.config import BrokerConfig
    from shmq.core.config import StoreConfig
    boss = Boss(BrokerConfig(store=StoreConfig(storePathRootDir=str(tmp_path / "store"))))
    boss.namesrv = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,))
    boss.namesrv.start()

    def close():
        raise OSError(5, "Input/output error")
    boss.owner.close = close
    try:
        with pytest.raises(OSError, match="Input/output"):
            boss.stop()
        assert not boss.namesrv.is_alive()
    finally:
        if boss.namesrv.is_alive():
            boss.namesrv.kill()


def test_a_child_that_keeps_failing_backs_off_then_the_boss_gives_up():
    r = Restarts(started_at=0.0)
    now = 1.0
    delays = []
    for _ in range(GIVE_UP_AFTER - 1):
        delays.append(r.died(1, now, "worker 0"))
        r.started_at = now = r.due_at + 0.5          # restarted, dies again half a second later
    assert delays == [min(BACKOFF_FIRST_S * 2 ** i, BACKOFF_MAX_S) for i in range(GIVE_UP_AFTER - 1)]
    with pytest.raises(ChildFailing, match=r"worker 0 exited 5 times in a row"):
        r.died(1, now, "worker 0")


def test_a_killed_child_or_one_that_ran_a_while_restarts_at_once():
    r = Restarts(started_at=0.0)
    for _ in range(2 * GIVE_UP_AFTER):        # an operator's (or the OOM killer's) kill -9
        assert r.died(-signal.SIGKILL, 0.1, "services") == 0.0
    assert r.died(1, 0.1, "services") == BACKOFF_FIRST_S
    r.started_at = 1.0
    assert r.died(1, 1.0 + STABLE_S, "services") == 0.0 and r.failures == 0


def _cache_lacking(cache, unit: str) -> None:
    """Fill ``cache`` (a NUMBA_CACHE_DIR) with this process's numba cache
    of the broker's kernels (conftest compiled and loaded them), less the
    kernels of ``unit``: a cache that lacks one unit, as a fresh clone's
    empty one lacks them all. (Every unit compiled cold again here took
    ~14 s of CI's 2-core VM; conftest's session fixture already compiles
    them all in parallel there, as the boss does.)"""
    from numba.core.caching import UserProvidedCacheLocator
    from shmq.core import jit
    dirs = {}
    for name in jit.BROKER:
        for d in jit.UNITS[name].dispatchers():
            src = d._cache._cache_path
            dirs[src] = os.path.join(cache, UserProvidedCacheLocator.get_suitable_cache_subpath(
                d.py_func.__code__.co_filename))
    for src, dst in dirs.items():
        shutil.copytree(src, dst, ignore=lambda _, names: [
            n for n in names if not n.endswith((".nbi", ".nbc"))])
    for d in jit.UNITS[unit].dispatchers():
        stem = d._cache._cache_file._index_name[:-len(".nbi")]
        dst = dirs[d._cache._cache_path]
        for n in os.listdir(dst):
            if n == stem + ".nbi" or (n.startswith(stem + ".") and n.endswith(".nbc")):
                os.remove(os.path.join(dst, n))


@pytest.mark.skipif(JIT_OFF, reason="compiles nothing with the JIT off")
def test_a_cold_start_says_it_compiles_and_a_batch_sent_at_ready_is_answered(tmp_path):
    """The first start on a numba cache that lacks kernels (a fresh clone's
    first run lacks them all): what is missing compiles before any child
    starts, and only that, the log says so unit by unit, and a batch sent
    the instant the broker is ready is answered at once. (Before, the first
    SEND_BATCH compiled encode_uniform for seconds in the worker and the
    client timed out: so encode is the unit the cache lacks here.)"""
    cache = tmp_path / "numba-cache"
    _cache_lacking(cache, "encode")
    b = BrokerProc(tmp_path, broker_conf(tmp_path), env={"NUMBA_CACHE_DIR": str(cache)})
    with b.start(timeout=300):
        log = b.log()
        assert "first start: compiling 1 groups of kernels (encode)" in log, log[-2000:]
        assert "compiled encode" in log, log[-2000:]
        with RemotingClient(b.addr, timeout=5.0) as c:
            assert c.invoke(create_topic("Cold", 1)).code == R.SUCCESS
            msgs = [(b"m%d" % i, properties(tags="T", keys=f"k{i}")) for i in range(50)]
            r = c.invoke(send_batch("Cold", msgs, queue_id=0))
            assert r.code == R.SUCCESS, r.remark
            p = c.invoke(pull_message("Cold", 0, 0))
            assert p.code == R.SUCCESS
        assert b.stop() == 0
    # the next start finds everything cached and compiles nothing
    with BrokerProc(tmp_path, broker_conf(tmp_path), env={"NUMBA_CACHE_DIR": str(cache)}).start() as b2:
        assert b2.log().count("first start: compiling") == 1
        assert b2.stop() == 0


@pytest.mark.skipif(JIT_OFF, reason="compiles nothing with the JIT off")
def test_a_signal_while_kernels_compile_stops_the_start_and_leaves_nothing_running(tmp_path):
    cache = tmp_path / "numba-cache"
    log_path = tmp_path / "broker.log"
    conf = tmp_path / "broker.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in broker_conf(tmp_path).items()))
    with open(log_path, "w") as log:
        p = subprocess.Popen([sys.executable, "-m", "shmq.tools", "broker", "-c", str(conf)],
                             stdout=subprocess.PIPE, stderr=log, text=True,
                             env={**os.environ, "NUMBA_CACHE_DIR": str(cache)})
    try:
        deadline = time.monotonic() + 120
        while "first start: compiling" not in log_path.read_text():
            assert p.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        while not _shmq_procs(p.pid):                 # the pool starts just after that line
            assert p.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)                  # Ctrl-C
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
    text = log_path.read_text()
    assert "stopped before it was ready" in text and "Traceback" not in text, text
    assert p.stdout.read() == ""                      # never said ready
    deadline = time.monotonic() + 10
    while _shmq_procs(p.pid):                         # its compilers die with it
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_client_started_the_instant_the_broker_is_ready_sends_on_its_first_try(tmp_path):
    """Ready means ready: the ready line follows the first NameServer
    registration, so a producer asking for routes at once finds them (the
    topic is created on first send, through TBW102's route). Its ports are
    0 (any): the ready line, and the address registered, name those taken."""
    from shmq.client import Message, Producer
    conf = broker_conf(tmp_path, listenPort=0, namesrvListenPort=0, haListenPort=0)
    with BrokerProc(tmp_path, conf).start() as b:
        assert "not registered with the NameServer" not in b.log()
        assert not b.addr.endswith(":0") and not b.namesrv.endswith(":0"), (b.addr, b.namesrv)
        with Producer("ReadyGroup", namesrv_addr=b.namesrv, retry_times_when_send_failed=0) as p:
            r = p.send(Message("ReadyTopic", b"first"))
        assert r.status.value == "SEND_OK"
        assert b.stop() == 0


def test_only_a_worker_the_boss_started_may_take_connections(tmp_path):
    """The boss hands client connections to workers over an abstract Unix
    socket, which file permissions do not guard: a process claiming to be a
    worker is refused (SO_PEERCRED names it), and clients are still served."""
    import socket as so
    from shmq.broker.worker import boss_address
    from shmq.ipc.control import names
    from shmq.client.requests import send_message
    with BrokerProc(tmp_path, broker_conf(tmp_path)).start() as b:
        fake = so.socket(so.AF_UNIX, so.SOCK_STREAM)
        fake.connect(boss_address(names(b.store)[2]))
        fake.sendall(f"0 5 {os.getpid()}\n".encode())
        fake.settimeout(10)
        assert fake.recv(64) == b""                     # closed on us, nothing handed
        fake.close()
        assert "refused a worker hello" in b.log()
        with RemotingClient(b.addr) as c:               # clients still reach real workers
            assert c.invoke(create_topic("Still", 1)).code == R.SUCCESS
            assert c.invoke(send_message("Still", b"x", queue_id=0)).code == R.SUCCESS
        assert b.stop() == 0
