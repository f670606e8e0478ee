"""Local IPC: a producer on the broker's host appending to the store itself
(client/direct.py), against what a user could pick instead on this host.

- local_ipc_send: ``AsyncProducer.send`` of 100-byte messages, one per
  call, WINDOW callers, with direct appends (the client's default on the
  broker's host) — msg/s and the client's CPU per send. Beside it, in the
  same run: the limit, this process appending the same messages to a
  private store of its own (``encode_one`` + ``MessageStore.append``, no
  client, no route, no result: what a direct send cannot beat); the same
  sends over the Unix socket (``direct_append=False``); and the peers
  ``perf.client.peers`` measures (multiprocessing.Queue, pyzmq ipc PUSH/PULL,
  NATS core where installed; none durable or acknowledged). Issue 17's
  target: 500 k msg/s, ahead of every peer.
- local_ipc_put: ``AsyncProducer.put`` of 100-byte messages, one per call
  in one tight loop (no await), then one ``await flush()``: msg/s from the
  first put to flush's return, and the client's CPU per message; every
  message must have been appended by this process and reported stored by
  flush. Beside it, in the same run, the same peers (and
  multiprocessing.Pipe, measured here), and the blocking ``Producer.put``
  (buffered in the calling thread). Issue 17's target: 500 k msg/s, ahead
  of every peer.
- local_ipc_send_many: ``Producer.send_many`` of 4096 bodies a call (one
  claim per ~1 MiB, the batch kernel encoding): direct vs the Unix socket
  (SEND_BATCH_MESSAGE), beside memcpy of the same bytes (the limit).
  Issue 17's target: 5 M msg/s.
- local_ipc_send_sync: ``Producer.send`` (blocking), one at a time: direct
  vs the Unix socket (each send waits for its result).
- local_ipc_consume: ``AsyncPushConsumer`` (listener batches of 32)
  draining a backlog of 100-byte messages, msg/s from the first delivery to
  the last, and the consumer's CPU a message: reading the store directly (client/direct.py ``DirectReads``)
  vs pulling over the Unix socket (``direct_append=False``), each its own
  group, every message delivered once; the direct one must have read most
  of them itself (its ``DirectReads.messages``).

Every direct send must have been appended by this process (the client's
``appended`` counter), every answer SEND_OK at a position of its own.
"""
from __future__ import annotations

import asyncio
import os
import time

from perf.client import (BODY, WINDOW, _LAST_CPU_US, _backlog, _broker, _namesrv, _ready_topic,
                         _shmq_consume, _shmq_send, peers)
from shmq.client import AsyncProducer, ClientConfig, Message, Producer, SendStatus


def _store_append_rate(scratch: str, seconds: float) -> float:
    """Messages a second this process appends to a private store of its own:
    one record encoded and appended per call, as a direct send does."""
    from shmq.core.config import StoreConfig
    from shmq.core.records import encode_one, host_raw
    from shmq.core.store import open_local
    root = os.path.join(scratch, "local-ipc-store")
    store, _ = open_local(StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=256 << 20))
    host = host_raw("127.0.0.1", 10911)
    topic, props = b"LocalIpcLimit", b"UNIQ_KEY\x010123456789ABCDEF0123456789ABCDEF"
    n = 0
    try:
        t0 = time.perf_counter()
        end = t0 + seconds
        while True:
            for _ in range(500):
                now = int(time.time() * 1000)
                store.append(encode_one(topic, BODY, props, queue_id=n & 3, flag=0, sysflag=0,
                                        born_timestamp=now, born_host=host, store_host=host,
                                        store_timestamp=now))
                n += 1
            if time.perf_counter() > end:
                break
        return n / (time.perf_counter() - t0)
    finally:
        store.close()


def _sync_sends(namesrv: str, topic: str, seconds: float, direct: bool) -> float:
    cfg = ClientConfig(namesrv_addr=namesrv, direct_append=direct, instance_name=f"perf-sync-{direct}")
    with Producer("perf-local-sync", client=cfg) as p:
        p.send(Message(topic, BODY))
        n, t0 = 0, time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            for _ in range(100):
                if p.send(Message(topic, BODY)).status is not SendStatus.SEND_OK:
                    raise AssertionError("a send was not SEND_OK")
            n += 100
        rate = n / (time.perf_counter() - t0)
        ds = [d for d in p._p.instance.direct.values() if d is not None]
        if direct and (not ds or ds[0].appended < n):
            raise AssertionError(f"direct sends went over the socket: {ds and ds[0].appended} of {n}")
        return rate


def _direct_appended(p) -> int:
    ds = [d for d in p.instance.direct.values() if d is not None]
    return ds[0].appended if ds else 0


async def _puts(namesrv: str, topic: str, seconds: float) -> tuple[float, float]:
    """``AsyncProducer.put`` of BODY in a tight loop for ``seconds``, then one
    ``flush``: (msg/s, client CPU µs a message)."""
    cfg = ClientConfig(namesrv_addr=namesrv, instance_name="perf-put")
    async with AsyncProducer("perf-local-put", client=cfg) as p:
        p.put(topic, BODY)
        await p.flush()                                  # the route, the store attached
        before, puts = _direct_appended(p), p.puts
        put = p.put
        n = 0
        c0, t0 = time.process_time(), time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            for _ in range(10_000):
                put(topic, BODY)
            n += 10_000
        r = await p.flush()
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        if r.put - puts != n or r.stored != r.put or _direct_appended(p) - before != n:
            raise AssertionError(f"put {n}: flush says {r}, {_direct_appended(p) - before} "
                                 f"appended directly by this process")
    return n / dt, cpu / n * 1e6


def _blocking_puts(namesrv: str, topic: str, seconds: float) -> float:
    """``Producer.put`` (the blocking facade) in a tight loop, then ``flush``."""
    cfg = ClientConfig(namesrv_addr=namesrv, instance_name="perf-put-blocking")
    with Producer("perf-local-put-blocking", client=cfg) as p:
        p.put(topic, BODY)
        p.flush()
        before, puts = _direct_appended(p._p), p._p.puts
        n, t0 = 0, time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            for _ in range(10_000):
                p.put(topic, BODY)
            n += 10_000
        r = p.flush()
        rate = n / (time.perf_counter() - t0)
        if r.put - puts != n or r.stored != r.put or _direct_appended(p._p) - before != n:
            raise AssertionError(f"blocking put {n}: flush says {r}")
    return rate


def _mp_pipe(n: int) -> float:
    """multiprocessing.Pipe: a child sends ``n`` BODYs, this process receives them."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    rx, tx = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_pipe_send, args=(tx, n), daemon=True)
    p.start()
    rx.recv_bytes()                                       # the sender is running
    t0 = time.perf_counter()
    for _ in range(n):
        if len(rx.recv_bytes()) != len(BODY):
            raise AssertionError("multiprocessing.Pipe handed back another message")
    rate = n / (time.perf_counter() - t0)
    p.join(10)
    return rate


def _pipe_send(tx, n: int) -> None:
    tx.send_bytes(BODY)
    for _ in range(n):
        tx.send_bytes(BODY)


MANY = 4096                      # bodies per send_many call


def _many_sends(namesrv: str, topic: str, seconds: float, direct: bool) -> float:
    """``Producer.send_many`` of MANY 100 B bodies per call: msg/s."""
    cfg = ClientConfig(namesrv_addr=namesrv, direct_append=direct, instance_name=f"perf-many-{direct}")
    bodies = [BODY] * MANY
    with Producer("perf-local-many", client=cfg) as p:
        p.send_many(topic, bodies[:16])
        n, t0 = 0, time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            rs = p.send_many(topic, bodies)
            if any(r.status is not SendStatus.SEND_OK for r in rs) or sum(r.count for r in rs) != MANY:
                raise AssertionError("send_many: not every message SEND_OK")
            n += MANY
        return n / (time.perf_counter() - t0)


def run(ctx, result):
    b = _broker(ctx)
    if "unix" not in b.transports:
        from perf import Skipped
        raise Skipped("the broker is not on this host (no Unix socket): no direct appends")
    seconds = 1.0 if ctx.quick else 5.0
    ns = _namesrv(b)
    topic = _ready_topic(b, "PerfLocalIpc")
    limit = _store_append_rate(ctx.scratch, seconds)
    direct = asyncio.run(_shmq_send(ns, topic, seconds, True, 1, direct=True))
    cpu = _LAST_CPU_US[0]
    socket_rate = asyncio.run(_shmq_send(ns, topic, seconds, True, 1, direct=False))
    p = peers(ctx)
    best_peer = max((v for k, v in p.items() if k in ("mp_queue", "pyzmq_ipc", "nats_core") and v),
                    default=None)
    yield result("local_ipc_send", direct, "msg/s", limit,
                 "this process appending the same messages to a private store (encode_one + "
                 "MessageStore.append per message)",
                 client_cpu_us_per_send=round(cpu, 2), unix_socket=round(socket_rate),
                 vs_socket=round(direct / socket_rate, 2), vs_best_peer=round(direct / best_peer, 3)
                 if best_peer else None, window=WINDOW, body_bytes=100, target=500_000, **p)
    rate, cpu_put = asyncio.run(_puts(ns, topic, seconds))
    pipe = round(_mp_pipe(p["peer_messages"]))
    best = max((v for k, v in p.items() if k in ("mp_queue", "pyzmq_ipc", "nats_core") and v),
               default=0)
    best = max(best, pipe)
    yield result("local_ipc_put", rate, "msg/s", ctx.memcpy_bps() / 100,
                 "memcpy of 100 B per message into a mapping (this host, same run)",
                 client_cpu_us_per_msg=round(cpu_put, 3), vs_best_peer=round(rate / best, 2),
                 blocking_producer_put=round(_blocking_puts(ns, topic, seconds)),
                 mp_pipe=pipe, body_bytes=100, target=500_000, **p)
    many, many_socket = (_many_sends(ns, topic, seconds, d) for d in (True, False))
    yield result("local_ipc_send_many", many, "msg/s", ctx.memcpy_bps() / 100,
                 "memcpy of 100 B per message into a mapping (this host, same run)",
                 unix_socket=round(many_socket), vs_socket=round(many / many_socket, 2),
                 call_bodies=MANY, body_bytes=100, target=5_000_000)
    d1 = _sync_sends(ns, topic, seconds, True)
    s1 = _sync_sends(ns, topic, seconds, False)
    yield result("local_ipc_send_sync", d1, "msg/s", limit,
                 "this process appending the same messages to a private store",
                 unix_socket=round(s1), vs_socket=round(d1 / s1, 2), body_bytes=100)
    n = 20_480 if ctx.quick else 204_800
    backlog = _ready_topic(b, "PerfLocalIpcConsume")
    asyncio.run(_backlog(ns, backlog, n))
    drained, cpu, _ = asyncio.run(_shmq_consume(ns, backlog, n, True, direct=True))
    drained_socket, cpu_socket, _ = asyncio.run(_shmq_consume(ns, backlog, n, True))
    record = 100 + 91 + len(backlog) + 60                 # body, fixed fields, topic, properties
    yield result("local_ipc_consume", drained, "msg/s", ctx.memcpy_bps() / record,
                 f"memcpy of {record}-byte records (this host, same run)",
                 unix_socket=round(drained_socket), vs_socket=round(drained / drained_socket, 2),
                 client_cpu_us_per_msg=round(cpu, 2),
                 unix_socket_client_cpu_us_per_msg=round(cpu_socket, 2), messages=n, body_bytes=100)
