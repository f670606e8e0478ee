"""Replication (broker/ha) over TCP loopback: a master and its slave, two real
``shmq broker`` processes, each figure beside its limit measured in the same run.

- ha_catchup: the master holds a backlog of 1 KiB messages (QUEUES queues;
  1 GiB of CommitLog full size, 128 MiB ``--quick``) before its slave
  starts, empty; the slave's CommitLog bytes/s from its HA connection to
  the end of the master's CommitLog — against raw one-way TCP loopback
  bandwidth (perf.net_limits.bulk; target ratio ≥ 0.5). Checked: the
  slave's CommitLog segments are the master's bytes. Beside it, measured
  right after: ``disk_write_bps``, the same number of bytes written in
  1 MiB pwrites to a new file of this disk (fdatasync every 0.5 s), the
  run's sequential-write limit. The slave writes every byte it receives
  into new page-cache pages, and where those are slow to get (a virtual
  machine whose balloon reports free guest pages to the host faults each
  one in again: 72% of the slave's CPU in the kernel's copy into the page
  cache on the 2-core dev VM, 2026-11-27) the catch-up follows this rate,
  not the network's.
- ha_lag: with the slave following, one producer connection sends batches
  of 1 KiB messages at full rate for a while (WINDOW in flight); a sampler
  reads both stores' published ``write_pos`` from their shared memory every
  SAMPLE_S and reports, for each master position, the time until the
  slave's reached it: p50 / p99 (resolution: SAMPLE_S plus the sampler's
  own scheduling). Target p99 ≤ 100 ms; the limit printed is the raw TCP
  round trip p99 (what no replication can beat).

- ha_sync_master: SYNC_CONNS producer processes, each its own connection
  and queue, sending one 100-byte message at a time (the lean clients of
  broker_sync_flush: ``perf.broker._sync_producer``; every answer
  SEND_OK, a FLUSH_SLAVE_TIMEOUT fails the run) to a SYNC_MASTER
  (ASYNC_FLUSH) whose slave follows — msg/s against the same load on a
  SYNC_FLUSH broker measured in the same run (target ratio ≥ 0.5); with the
  sends each slave ack released (group commit: ``ha_acks``, the acks that
  moved the master's confirm_pos).

The brokers are ASYNC_MASTER or SYNC_MASTER and SLAVE (haMasterAddress
given, no NameServer); ``--broker`` has nothing to measure here (skipped).
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from perf import Skipped
from perf.broker import (FORK, QUEUES, SUCCESS, SYNC_CONNS, TIMEOUT_S, Broker, _child,
                         _sync_producer, body_of, broker, create_topic, free_port, gather,
                         produce_backlog, send_cmd, spawn)
from shmq.client.remoting import RemotingClient
from shmq.core.state import StoreState
from shmq.ipc.control import ControlBlock

SAMPLE_S = 0.002
LAG_SECONDS = 3.0


def _state(store: str) -> tuple[ControlBlock, StoreState]:
    cb = ControlBlock.attach(store)
    return cb, StoreState.over(cb.region(), cb.lock)


def _master(ctx, seg: int, role: str = "ASYNC_MASTER") -> Broker:
    port = free_port()     # not listenPort + 1: that one may be a connection's local port
    master = Broker(ctx, "ASYNC_FLUSH", f"ha-{role}", brokerRole=role,
                    mappedFileSizeCommitLog=seg, haListenPort=port)
    ctx.on_close(master.stop)
    master.ha_addr = f"{master.tcp.rsplit(':', 1)[0]}:{port}"
    return master


def _slave(ctx, master: Broker, seg: int, name: str = "ha-slave") -> Broker:
    slave = Broker(ctx, "ASYNC_FLUSH", name, brokerRole="SLAVE", brokerId=1,
                   haMasterAddress=master.ha_addr, mappedFileSizeCommitLog=seg,
                   haSendHeartbeatInterval=1000)
    ctx.on_close(slave.stop)
    return slave


def _same_bytes(master: str, slave: str, end: int) -> None:
    """The slave's CommitLog below ``end`` is the master's, segment by segment."""
    d_m, d_s = os.path.join(master, "commitlog"), os.path.join(slave, "commitlog")
    for name in sorted(os.listdir(d_m)):
        start = int(name)
        if start >= end:
            break
        with open(os.path.join(d_m, name), "rb") as a, open(os.path.join(d_s, name), "rb") as b:
            n = end - start
            while n > 0:
                k = min(n, 64 << 20)
                if a.read(k) != b.read(k):
                    raise AssertionError(f"the slave's segment {name} differs from the master's")
                n -= k


def run(ctx, result):
    if getattr(ctx, "named_broker", None) is not None:
        raise Skipped("replication starts its own master and slave")
    seg = (256 if ctx.quick else 1024) << 20
    backlog = (128 if ctx.quick else 1024) << 20
    master = _master(ctx, seg)
    per_queue = backlog // (QUEUES * 1100)
    produce_backlog(master.tcp, "HaBench", per_queue, 1024)
    cb_m, st_m = _state(master.store)
    end = st_m.write_pos
    t0 = time.monotonic()
    slave = _slave(ctx, master, seg)
    cb_s, st_s = _state(slave.store)
    deadline = time.monotonic() + 600
    started = None
    while st_s.write_pos < end:
        if started is None and st_s.write_pos > 0:
            started = time.monotonic()
        if time.monotonic() > deadline:
            raise AssertionError(f"the slave reached {st_s.write_pos} of {end} in 600 s")
        time.sleep(0.001)
    done = time.monotonic()
    started = started or t0
    _same_bytes(master.store, slave.store, end)
    bulk = ctx.net_bulk("tcp")["bps"]
    # what writing the same bytes costs on this disk (measured after the
    # catch-up, so as not to change the page cache it found): the slave's
    # copy into the page cache bounds it where that is slow (module doc)
    disk = ctx.disk_write_bps(end)
    rate = end / (done - started)
    yield result("ha_catchup", rate, "B/s", bulk, "raw TCP loopback one-way B/s",
           backlog_bytes=end, seconds=round(done - started, 3),
           slave_start_s=round(started - t0, 3), disk_write_bps=round(disk),
           vs_disk_write=round(rate / disk, 3))

    # lag: produce at full rate while sampling both published ends
    samples_m: list[tuple[float, int]] = []
    samples_s: list[tuple[float, int]] = []
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            now = time.monotonic()
            samples_m.append((now, st_m.write_pos))
            samples_s.append((now, st_s.write_pos))
            time.sleep(SAMPLE_S)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    t_start = time.monotonic()
    n = 0
    while time.monotonic() - t_start < LAG_SECONDS:
        produce_backlog(master.tcp, f"HaLag{n}", 2000, 1024)
        n += 1
    end = st_m.write_pos
    while st_s.write_pos < end and time.monotonic() - t_start < LAG_SECONDS + 60:
        time.sleep(0.001)
    time.sleep(0.05)
    stop.set()
    th.join()
    sent = time.monotonic() - t_start
    ts = np.array([t for t, _ in samples_s])
    pos = np.array([p for _, p in samples_s])
    lags = []
    for t, m in samples_m:
        i = int(np.searchsorted(pos, m, side="left"))       # slave positions only grow
        if i < len(ts):
            lags.append(max(0.0, ts[i] - t))
    lags_ms = np.array(lags) * 1000
    rtt = ctx.net_rtt("tcp")
    rate = (end - samples_m[0][1]) / sent
    yield result("ha_lag", float(np.percentile(lags_ms, 99)), "ms p99", rtt["p99_us"] / 1000,
           "raw TCP round trip p99 ms", p50_ms=round(float(np.percentile(lags_ms, 50)), 3),
           produce_bps=round(rate), samples=len(lags), sample_ms=SAMPLE_S * 1000)
    for cb in (cb_m, cb_s):
        cb.close()


def _sync_rate(addr: str, topic: str, conns: int, seconds: float, on_go=None) -> tuple[float, int]:
    with RemotingClient(addr) as c:
        create_topic(c, topic, conns)
    go = FORK.Event()
    kids, pipes = zip(*(spawn(_sync_producer, (addr, topic, q, seconds, go))
                        for q in range(conns)))
    got = gather(list(kids), list(pipes), go, "sync producer", on_go=on_go)
    if sum(g[3] for g in got):
        raise AssertionError(f"{sum(g[3] for g in got)} sync sends to {addr} were answered "
                             f"FLUSH_DISK_TIMEOUT")
    acked = sum(g[2] for g in got)
    return acked / (max(g[1] for g in got) - min(g[0] for g in got)), acked


def _replicating(master: Broker, slave: Broker, st, timeout: float = 30.0) -> None:
    """Until a SYNC_MASTER send to ``master`` is answered SEND_OK: its slave
    connected, reported where it stands and acknowledged. A connection
    alone (``ha_slaves``) is counted before the slave has written a byte;
    sends timed from then on answered FLUSH_SLAVE_TIMEOUT, then
    SLAVE_NOT_AVAILABLE, when the slave could not write (a CI run on a disk
    full of other stores: its log said ENOSPC, which this error now shows)."""
    deadline = time.monotonic() + timeout
    with RemotingClient(master.tcp) as c:
        create_topic(c, "HaSyncProbe", 1)
        while True:
            code = None
            if st.get("ha_slaves") >= 1:
                r = c.invoke(send_cmd("HaSyncProbe", 0, b"probe"), timeout=TIMEOUT_S)
                if r.code == SUCCESS:
                    return
                code = f"{r.code} ({r.remark})"
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the slave {slave.tcp} did not replicate within {timeout:g} s (slaves "
                    f"connected: {st.get('ha_slaves')}, last probe: {code}); master's log: "
                    f"{master.log_tail()}; slave's log: {slave.log_tail()}")
            time.sleep(0.05)


def run_sync_master(ctx, result):
    if getattr(ctx, "named_broker", None) is not None:
        raise Skipped("replication starts its own master and slave")
    seconds = 0.8 if ctx.quick else 3.0
    conns = max(SYNC_CONNS)
    flush_rate, _ = _sync_rate(broker(ctx, "SYNC_FLUSH").tcp, "HaSyncFlush", conns, seconds)
    seg = (256 if ctx.quick else 1024) << 20
    master = _master(ctx, seg, "SYNC_MASTER")
    slave = _slave(ctx, master, seg, "ha-sync-slave")
    cb, st = _state(master.store)
    _replicating(master, slave, st)
    acks = []
    rate, acked = _sync_rate(master.tcp, "HaSyncMaster", conns, seconds,
                             on_go=lambda: acks.append(st.get("ha_acks")))
    n_acks = st.get("ha_acks") - acks[0]
    cb.close()
    yield result("ha_sync_master", rate, "msg/s", flush_rate,
                 f"SYNC_FLUSH broker msg/s, {conns} connections, same run", connections=conns,
                 messages=acked, sends_per_slave_ack=round(acked / max(1, n_acks), 2))
