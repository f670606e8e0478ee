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
- local_ipc_send_many: ``AsyncProducer.send_many`` of 4096 bodies a call
  (one claim per ~1 MiB, the batch kernel encoding) and the client's CPU a
  message: direct vs the Unix socket (SEND_BATCH_MESSAGE), beside memcpy
  of the same bytes (the limit), and the blocking ``Producer.send_many``
  (each call a trip to the client's loop thread and back). Issue 17's
  target: 5 M msg/s.
- local_ipc_send_many_array: the same bodies as one 2-D numpy array (a
  body a row): no Python step per body on the direct path.
- local_ipc_send_sync: ``Producer.send`` (blocking), one at a time: direct
  vs the Unix socket (each send waits for its result).
- local_ipc_consume: ``AsyncPushConsumer`` (listener batches of 32)
  draining a backlog of 100-byte messages, msg/s from the first delivery to
  the last, and the consumer's CPU a message: reading the store directly (client/direct.py ``DirectReads``)
  vs pulling over the Unix socket (``direct_append=False``), each its own
  group, every message delivered once; the direct one must have read most
  of them itself (its ``DirectReads.messages``).
- local_ipc_consume_batch: the same drain with a batch listener
  (``register_batch_listener``: each pull one ``MessageBatch`` of numpy
  columns, client/batch.py) and pull_batch_size BATCH_PULL, direct; beside
  it the same at pull_batch_size 32, over the Unix socket, and the message
  listener's rate (the row above). Each message seen once, by queue offset.
- local_ipc_latency_spin / local_ipc_latency_park: produce → consume
  latency through the direct path at LATENCY_RATE msg/s, one 100 B message
  per ``AsyncProducer.send`` (direct; the loop turns after each, as an
  application's does), stamped with CLOCK_MONOTONIC when the send is
  called, read in another process. Spinning: the consumer process
  loops on its direct read (``DirectReads.pull``, what a push consumer's
  pull asks first) and never parks — the client has no spinning consumer
  of its own: this is the floor one would reach. Parking: an
  ``AsyncPushConsumer`` with direct reads (caught up, its pull waits in
  its own process until an append wakes it: client/direct.py
  ``_Parker``); beside it the same push consumer
  over the socket (``direct_append=False``) and the raw Unix-socket round
  trip (the limit). p50/p99 of every message; issue 17's targets 10 µs and
  40 µs. ``broker_cpu_us_per_msg``: the CPU the broker's processes used a
  message meanwhile (a caught-up direct consumer waits in its own process,
  so the broker's workers should have none of it; beside it the socket
  consumer's).
- local_ipc_2x2: 2 producer processes (``put``, direct) and 2 consumer
  processes (``AsyncPushConsumer``, one group, direct reads) on one
  4-queue topic at once: every message delivered once, stored in put
  order per queue and delivered in queue order; msg/s from the go to the
  last delivery. Beside it: the same with socket consumers and producers
  (``direct_append=False``). Issue 17's target: 1 M msg/s.
- local_ipc_2x2_batch: the same, direct, with batch listeners
  (pull_batch_size BATCH_PULL) checking the same with numpy.
- local_ipc_sync_flush: a SYNC_FLUSH broker, WINDOW ``AsyncProducer.send``
  callers in one process: direct vs the Unix socket at the same load, the
  messages each fdatasync made durable (the flusher's count), every answer
  SEND_OK (no FLUSH_DISK_TIMEOUT). Issue 17's target: direct ≥ socket.
  ``one_at_a_time``: the same with one caller (a lone send: the direct
  producer's flush thread leads its group commit), beside the socket's.

Every direct send must have been appended by this process (the client's
``appended`` counter), every answer SEND_OK at a position of its own.
"""
from __future__ import annotations

import asyncio
import os
import struct
import time

import numpy as np

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


def _many_bodies(array: bool):
    """MANY 100 B bodies: a list of bytes, or one 2-D numpy array (a body a row)."""
    return np.frombuffer(BODY * MANY, np.uint8).reshape(MANY, -1) if array else [BODY] * MANY


def _check_many(rs) -> None:
    if any(r.status is not SendStatus.SEND_OK for r in rs) or sum(r.count for r in rs) != MANY:
        raise AssertionError("send_many: not every message SEND_OK")


async def _many_sends(namesrv: str, topic: str, seconds: float, direct: bool,
                      array: bool = False) -> tuple[float, float]:
    """``AsyncProducer.send_many`` of MANY 100 B bodies per call: (msg/s,
    client CPU ns a message); with ``direct``, every one appended by this
    process."""
    cfg = ClientConfig(namesrv_addr=namesrv, direct_append=direct,
                       instance_name=f"perf-many-{direct}-{array}")
    bodies = _many_bodies(array)
    async with AsyncProducer("perf-local-many", client=cfg) as p:
        await p.send_many(topic, bodies[:16])
        before = _direct_appended(p)
        n, c0, t0 = 0, time.process_time(), time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            _check_many(await p.send_many(topic, bodies))
            n += MANY
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        if direct and _direct_appended(p) - before != n:
            raise AssertionError("send_many: not every message appended by this process")
    return n / dt, cpu / n * 1e9


def _blocking_many_sends(namesrv: str, topic: str, seconds: float, array: bool) -> float:
    """The same through the blocking ``Producer.send_many`` (a trip to the
    client's loop thread and back a call): msg/s."""
    cfg = ClientConfig(namesrv_addr=namesrv, instance_name=f"perf-many-blocking-{array}")
    bodies = _many_bodies(array)
    with Producer("perf-local-many-blocking", client=cfg) as p:
        p.send_many(topic, bodies[:16])
        before = _direct_appended(p._p)
        n, t0 = 0, time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            _check_many(p.send_many(topic, bodies))
            n += MANY
        rate = n / (time.perf_counter() - t0)
        if _direct_appended(p._p) - before != n:
            raise AssertionError("blocking send_many: not every message appended by this process")
        return rate


def _send_many_rows(ctx, ns: str, topic: str, seconds: float, result):
    """local_ipc_send_many and local_ipc_send_many_array. The two direct
    figures are measured first, for 0.5 s each in the quick run: on the
    2-core VM, writing into page-cache pages the guest has not touched
    lately costs 3-4x (perf: 60% of the time in copy_folio_from_iter_atomic;
    the balloon's free page reporting hands freed pages back to the host),
    and a run sees that after ~3.5 GB written, at 1-2 GB/s; what came after
    measured the VM, not the client. The full run's 5 s is the sustained
    figure, cold pages included."""
    took = 0.5 if ctx.quick else seconds
    direct = {a: asyncio.run(_many_sends(ns, topic, took, True, a)) for a in (True, False)}
    for array in (False, True):
        rate, cpu = direct[array]
        socket_rate, _ = asyncio.run(_many_sends(ns, topic, seconds, False, array))
        yield result("local_ipc_send_many_array" if array else "local_ipc_send_many", rate,
                     "msg/s", ctx.memcpy_bps() / 100,
                     "memcpy of 100 B per message into a mapping (this host, same run)",
                     client_cpu_ns_per_msg=round(cpu), unix_socket=round(socket_rate),
                     vs_socket=round(rate / socket_rate, 2),
                     blocking_producer=round(_blocking_many_sends(ns, topic, seconds, array)),
                     call_bodies=MANY, body_bytes=100, target=5_000_000)


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
    yield from _send_many_rows(ctx, ns, topic, seconds, result)
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
    rate_b, cpu_b, _ = asyncio.run(_shmq_consume(ns, backlog, n, True, direct=True,
                                                 columns=BATCH_PULL))
    rate_b32, cpu_b32, _ = asyncio.run(_shmq_consume(ns, backlog, n, True, direct=True, columns=32))
    rate_bs, cpu_bs, _ = asyncio.run(_shmq_consume(ns, backlog, n, True, columns=BATCH_PULL))
    yield result("local_ipc_consume_batch", rate_b, "msg/s", ctx.memcpy_bps() / record,
                 f"memcpy of {record}-byte records (this host, same run)",
                 client_cpu_us_per_msg=round(cpu_b, 3), pull_batch_size=BATCH_PULL,
                 pull_batch_size_32=round(rate_b32), pull_batch_size_32_cpu_us_per_msg=round(cpu_b32, 3),
                 message_listener=round(drained), vs_message_listener=round(rate_b / drained, 2),
                 unix_socket=round(rate_bs), unix_socket_client_cpu_us_per_msg=round(cpu_bs, 3),
                 messages=n, body_bytes=100)
    yield from run_latency(ctx, result, b, ns)
    yield from run_two_by_two(ctx, result, b, ns)
    yield from run_sync_flush(ctx, result)


# a batch listener's pull_batch_size in the consume and 2 x 2 rows
# (client/batch.py: a direct read takes it past the broker's count cap of 32)
BATCH_PULL = 256

# ---------------------------------------------------------------- latency
LATENCY_RATE = 10_000            # messages a second, one per send
_STAMP = struct.Struct(">qq")    # message number, CLOCK_MONOTONIC ns when its send was called


async def _paced_sends(ns: str, topic: str, count: int, rate: int) -> tuple[float, int]:
    """``count`` direct sends to ``topic`` (one queue), one every 1/``rate``
    s, each body stamped: (the rate reached, sends later than 1 ms)."""
    cfg = ClientConfig(namesrv_addr=ns, instance_name="perf-latency-producer")
    pad = BODY[_STAMP.size:]
    async with AsyncProducer("perf-local-latency", client=cfg) as p:
        await p.send(Message(topic, _STAMP.pack(-1, 0) + pad))     # route, store attached
        before = _direct_appended(p)
        late = 0
        send, clock, sleep = p.send, time.monotonic, time.sleep
        t0 = clock()
        for i in range(count):
            wait = t0 + i / rate - clock()
            if wait > 0:
                sleep(wait)
            elif wait < -0.001:
                late += 1
            r = await send(Message(topic, _STAMP.pack(i, time.monotonic_ns()) + pad))
            if r.status is not SendStatus.SEND_OK or r.queue_offset != i + 1:
                raise AssertionError(f"latency send {i}: {r.status} at {r.queue_offset}")
            await asyncio.sleep(0)          # the loop turns, as an application's does
        rate_reached = count / (clock() - t0)
        if _direct_appended(p) - before != count:
            raise AssertionError("latency sends went over the socket")
    return rate_reached, late


def _stamps(msgs, first: int, lat: list) -> int:
    """Append each message's latency (ns, now minus its stamp); check they
    come in order from ``first`` (after the producer's first, numbered -1);
    the next number expected."""
    now = time.monotonic_ns()
    for m in msgs:
        i, t = _STAMP.unpack_from(m.body)
        if i < 0 and first == 0:
            continue
        if i != first or m.queue_offset != i + 1:
            raise AssertionError(f"expected message {first}, got {i} at offset {m.queue_offset}")
        lat.append(now - t)
        first += 1
    return first


def _latency_child(fn):
    """A consumer process body: runs ``fn`` (a coroutine function) and sends
    back its latencies, or its exception."""
    def body(*args):
        pipe = args[-1]
        try:
            pipe.send(asyncio.run(fn(*args[:-1], pipe)))
        except BaseException as e:
            pipe.send(RuntimeError(f"{type(e).__name__}: {e}"))
            raise
    return body


async def _spin_consumer(ns: str, topic: str, count: int, pipe) -> list:
    """Read ``topic``'s queue 0 from offset 1 with the client's direct read
    in a loop that never parks, until ``count`` messages came."""
    import numpy as np
    from shmq.client.direct import CAUGHT_UP, warm_up_reads
    from shmq.client.instance import ClientInstance
    from shmq.client.message import decode_messages
    from shmq.client.pull import pull_kernel
    from shmq.client.subscription import SubscriptionData
    warm_up_reads()
    group = f"perf-latency-spin-{time.time_ns()}"
    cfg = ClientConfig(namesrv_addr=ns, instance_name="perf-latency-spin")
    async with AsyncProducer(group, client=cfg) as p:             # the instance, attached
        await p.publish_queues(topic)
        inst: ClientInstance = p.instance
        mq = (await p.publish_queues(topic))[0]
        await inst.broker(mq.broker_name)
        ds = inst.direct_now(mq.broker_name)
        if ds is None:
            raise AssertionError("the spinning consumer could not attach the store")
        sub = SubscriptionData.build(topic, "*")
        # socket pulls: the broker answers for the group and the queue first
        # (twice: the first creates the group, a table change that makes the
        # client ask the broker again)
        for _ in range(2):
            await pull_kernel(inst, group, mq, sub, 1, 1, 0, 0, 0, 10.0)
        codes = np.empty(0, np.int64)
        codes.flags.writeable = False
        pull = ds.reads.pull
        lat: list[int] = []
        off = 1
        pipe.send("ready")
        deadline = time.monotonic() + count / LATENCY_RATE * 3 + 30
        while off <= count:
            got = pull(group, topic, 0, off, 32, codes, None)
            if got is None or got is CAUGHT_UP or not got[0]:
                if time.monotonic() > deadline:
                    raise AssertionError(f"spinning: {off - 1} of {count} came")
                continue
            msgs = decode_messages(got[4], mq.broker_name)
            if _stamps(msgs, off - 1, lat) != got[1] - 1:
                raise AssertionError(f"spinning: next offset {got[1]} after {len(msgs)}")
            off = got[1]
    return lat


async def _park_consumer(ns: str, topic: str, count: int, direct: bool, pipe) -> list:
    """An ``AsyncPushConsumer`` (listener batches of 1) reading ``topic``
    from offset 1 until ``count`` messages came."""
    from shmq.client import AsyncPushConsumer, ConsumeConcurrentlyStatus
    from shmq.client.direct import warm_up_reads
    if direct:
        warm_up_reads()
    lat: list[int] = []
    nxt = [0]
    done = asyncio.Event()

    async def on_messages(msgs, context):
        nxt[0] = _stamps(msgs, nxt[0], lat)
        if nxt[0] >= count:
            done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    cfg = ClientConfig(namesrv_addr=ns, direct_append=direct, instance_name=f"perf-park-{direct}")
    c = AsyncPushConsumer(f"perf-latency-park-{direct}-{time.time_ns()}", client=cfg,
                          consume_from_where="CONSUME_FROM_LAST_OFFSET")
    c.subscribe(topic, "*")
    c.register_message_listener(on_messages)
    await c.start()
    try:
        deadline = time.monotonic() + 30
        while not c.assigned_queues() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)                      # its first pull parks at the end
        pipe.send("ready")
        await asyncio.wait_for(done.wait(), count / LATENCY_RATE * 3 + 30)
    finally:
        await c.shutdown()
    return lat


def _broker_pids(b) -> list[int]:
    """The broker's processes (boss and children) where this host shows
    them (a broker started here; a named one's boss is not known): []."""
    proc = getattr(b, "proc", None)
    if proc is None:
        return []
    from shmq.broker.procs import broker_processes
    roles, _ = broker_processes(proc.pid)
    return [proc.pid] + [pid for _, pid in roles if pid != proc.pid]


def _latency(ns: str, topic: str, count: int, consumer, *args, broker_pids=()) -> dict:
    """One consumer process ``consumer(ns, topic, count, *args)`` and paced
    direct sends from this one: the latencies' p50/p99 (µs), the rate, and
    the broker processes' CPU a message meanwhile (µs; None where unknown)."""
    import numpy as np
    from perf.broker import spawn
    from perf.net_limits import _check_exit
    from perf.worker_cpu import CLK_TCK, ticks
    p, a = spawn(_latency_child(consumer), (ns, topic, count, *args))
    try:
        got = a.recv() if a.poll(60) else None
        if got != "ready":
            raise RuntimeError(f"latency consumer did not get ready: {got!r}")
        t0 = ticks(broker_pids) if broker_pids else None
        rate, late = asyncio.run(_paced_sends(ns, topic, count, LATENCY_RATE))
        broker_us = (None if t0 is None
                     else round((ticks(broker_pids) - t0) / CLK_TCK / count * 1e6, 1))
        lat = a.recv() if a.poll(60) else None
        if isinstance(lat, BaseException):
            raise RuntimeError("latency consumer failed") from lat
        if lat is None or len(lat) != count:
            raise AssertionError(f"the latency consumer got {lat and len(lat)} of {count}")
        _check_exit(p, "latency consumer")
    finally:
        if p.is_alive():
            p.kill()
    us = np.array(lat) / 1e3
    return {"p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99)),
            "rate": rate, "late": late, "broker_us": broker_us}


def run_latency(ctx, result, b, ns: str):
    count = 10_000 if ctx.quick else 50_000
    rt = ctx.net_rtt("unix")
    runs = {}
    for name, consumer, args in (("spin", _spin_consumer, ()), ("park", _park_consumer, (True,)),
                                 ("socket", _park_consumer, (False,))):
        topic = _ready_topic(b, f"PerfLocalIpcLatency_{name}", queues=1)
        runs[name] = _latency(ns, topic, count, consumer, *args, broker_pids=_broker_pids(b))
    for name, target in (("spin", 10), ("park", 40)):
        r = runs[name]
        yield result(f"local_ipc_latency_{name}", r["p50"], "us p50", rt["p50_us"],
                     "raw Unix-socket request/response round trip p50; ratio = times it",
                     p99_us=round(r["p99"], 1), target_p50_us=target,
                     socket_consumer_p50_us=round(runs["socket"]["p50"], 1),
                     socket_consumer_p99_us=round(runs["socket"]["p99"], 1),
                     broker_cpu_us_per_msg=r["broker_us"],
                     socket_consumer_broker_cpu_us_per_msg=runs["socket"]["broker_us"],
                     rate_msg_s=round(r["rate"]), target_rate=LATENCY_RATE, late_sends=r["late"],
                     messages=count, body_bytes=100)


# ---------------------------------------------------------------- 2 producers + 2 consumers
_SEQ = struct.Struct(">ii")      # producer, message number: the first bytes of each body


def _two_producer(ns: str, topic: str, tag: int, n: int, direct: bool, go, pipe) -> None:
    """Put ``n`` messages (numbered 0.., the first before the go) to
    ``topic``, then flush: (go time, flushed time, messages, appended here).
    Over the socket a put is refused (SYSTEM_BUSY) while ``put_buffer_bytes``
    of chunks wait for the event loop, as the producer's doc says: the loop
    gets a turn and the refused put is made again (the full run's 1 M puts
    are 34 MB)."""
    from shmq.client import MQClientError
    from shmq.ipc.codes import ResponseCode

    async def main():
        pad = BODY[_SEQ.size:]
        cfg = ClientConfig(namesrv_addr=ns, direct_append=direct,
                           instance_name=f"perf-2x2-p{tag}-{direct}")
        async with AsyncProducer(f"perf-2x2-p{tag}", client=cfg) as p:
            p.put(topic, _SEQ.pack(tag, 0) + pad)
            await p.flush()
            pipe.send("ready")
            go.wait()
            t0 = time.monotonic()
            put, pack = p.put, _SEQ.pack
            i = 1
            while i < n:
                try:
                    for i in range(i, n):
                        put(topic, pack(tag, i) + pad)
                    i = n
                except MQClientError as e:           # (i: the put refused)
                    if e.code != ResponseCode.SYSTEM_BUSY:
                        raise
                    await asyncio.sleep(0)
            r = await p.flush()
            t1 = time.monotonic()
            if r.put != n or r.stored != n:
                raise AssertionError(f"producer {tag}: flush says {r} of {n}")
            return t0, t1, n, _direct_appended(p)
    try:
        pipe.send(asyncio.run(main()))
    except BaseException as e:
        pipe.send(RuntimeError(f"{type(e).__name__}: {e}"))
        raise


def _two_consumer(ns: str, topic: str, group: str, queues: int, total, direct: bool,
                  batch: bool, pipe) -> None:
    """One of the group's push consumers: ready once it holds ``queues``
    queues; consumes until the group's shared count reaches ``total``
    messages: (each message's queue, queue offset, producer and number as
    arrays; the time of its last delivery; deliveries out of queue order;
    messages read from the store itself). ``batch``: a batch listener
    (pull_batch_size BATCH_PULL) reading the same with numpy."""
    from array import array

    from shmq.client import AsyncPushConsumer, ConsumeConcurrentlyStatus
    from shmq.client.direct import warm_up_reads

    async def main():
        if direct:
            warm_up_reads()
        cols = [array("q") for _ in range(4)]
        qids, offs, tags, seqs = (c.append for c in cols)
        last = [0.0, 0]                          # last delivery, out-of-order deliveries
        seen: dict[int, int] = {}
        unpack = _SEQ.unpack_from
        counter = total[0]

        async def on_messages(msgs, context):
            for m in msgs:
                q, o = m.queue_id, m.queue_offset
                if o <= seen.get(q, -1):
                    last[1] += 1
                seen[q] = o
                t, s = unpack(m.body)
                qids(q)
                offs(o)
                tags(t)
                seqs(s)
            with counter.get_lock():
                counter.value += len(msgs)
            last[0] = time.monotonic()
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        parts: list = []
        head = np.arange(_SEQ.size)

        async def on_batch(batch, context):
            q = batch.queue.queue_id
            o = batch.queue_offsets
            if o[0] <= seen.get(q, -1) or (len(o) > 1 and (np.diff(o) <= 0).any()):
                last[1] += 1
            seen[q] = int(o[-1])
            raw = np.frombuffer(batch.data, np.uint8)
            ts = raw[batch.body_offsets[:, None] + head].view(">i4").astype(np.int64)
            parts.append((np.full(len(o), q, np.int64), o.copy(), ts[:, 0], ts[:, 1]))
            with counter.get_lock():
                counter.value += len(o)
            last[0] = time.monotonic()
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        cfg = ClientConfig(namesrv_addr=ns, direct_append=direct,
                           instance_name=f"perf-2x2-c{os.getpid()}")
        c = AsyncPushConsumer(group, client=cfg, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                              consume_message_batch_max_size=32,
                              pull_batch_size=BATCH_PULL if batch else 32)
        c.subscribe(topic, "*")
        if batch:
            from shmq.client.walk import warm_up_decoding
            warm_up_decoding()
            c.register_batch_listener(on_batch)
        else:
            c.register_message_listener(on_messages)
        await c.start()
        try:
            deadline = time.monotonic() + 60
            while (held := sum(q.topic == topic for q in c.assigned_queues())) != queues:
                if time.monotonic() > deadline:            # (its retry topic's queue aside)
                    raise AssertionError(f"holds {held} queues of {topic}, not {queues}")
                await asyncio.sleep(0.02)
            pipe.send("ready")
            deadline = time.monotonic() + 300
            while counter.value < total[1]:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the group consumed {counter.value} of {total[1]}")
                await asyncio.sleep(0.005)
            ds = [d for d in c.instance.direct.values() if d is not None]
            read_here = ds[0].reads.messages if ds else 0
        finally:
            await c.shutdown()
        if parts:
            cols = [np.concatenate([p[i] for p in parts]) for i in range(4)]
        return [c.tobytes() for c in cols], last[0], last[1], read_here
    try:
        pipe.send(asyncio.run(main()))
    except BaseException as e:
        pipe.send(RuntimeError(f"{type(e).__name__}: {e}"))
        raise


def _two_by_two(b, ns: str, n: int, direct: bool, batch: bool = False) -> dict:
    """2 producer processes put ``n`` messages each to a fresh 4-queue topic
    while 2 consumer processes of one group consume them: msg/s from the go
    to the last delivery, after checking every message was delivered once,
    stored in put order per queue and delivered in queue order."""
    import numpy as np
    from perf.broker import FORK, spawn
    from perf.net_limits import _check_exit
    # a topic of this call's own: the checks below count on an empty one
    # (a second run against a named broker found the first run's messages,
    # read them from the first offset, and the group's start-up rebalance
    # delivered some twice)
    topic = _ready_topic(b, f"PerfLocalIpc2x2_{direct}{'_batch' * batch}_{time.time_ns()}",
                         queues=4)
    total = 2 * n
    counter = FORK.Value("q", 0)
    group = f"perf-2x2-{direct}-{batch}-{time.time_ns()}"
    go = FORK.Event()
    kids = []
    try:
        cons = [spawn(_two_consumer, (ns, topic, group, 2, (counter, total), direct, batch))
                for _ in range(2)]
        kids += [k for k, _ in cons]
        for _, a in cons:
            _ready(a, "2x2 consumer")
        prods = [spawn(_two_producer, (ns, topic, tag, n, direct, go)) for tag in range(2)]
        kids += [k for k, _ in prods]
        for _, a in prods:
            _ready(a, "2x2 producer")
        t_go = time.monotonic()
        go.set()
        made = [_report(a, "2x2 producer") for _, a in prods]
        got = [_report(a, "2x2 consumer") for _, a in cons]
        for k in kids:
            _check_exit(k, "2x2 client")
    finally:
        for k in kids:
            if k.is_alive():
                k.kill()
    q, o, t, s = (np.concatenate([np.frombuffer(g[0][i], np.int64) for g in got]) for i in range(4))
    if q.shape[0] != total or np.unique(t * (1 << 32) + s).shape[0] != total:
        raise AssertionError(f"{q.shape[0]} deliveries, {np.unique(t * (1 << 32) + s).shape[0]} "
                             f"distinct messages of {total}")
    for qid in range(4):
        m = q == qid
        order = np.argsort(o[m], kind="stable")
        if not (o[m][order] == np.arange(m.sum())).all():
            raise AssertionError(f"queue {qid}: its offsets are not each delivered once from 0")
        for tag in range(2):
            seq = s[m][order][t[m][order] == tag]
            if (np.diff(seq) <= 0).any():
                raise AssertionError(f"queue {qid}: producer {tag}'s messages out of put order")
    if sum(g[2] for g in got):
        raise AssertionError(f"{sum(g[2] for g in got)} deliveries out of queue order")
    if direct and (sum(m[3] for m in made) != total or sum(g[3] for g in got) < total // 2):
        raise AssertionError(f"direct: {sum(m[3] for m in made)} appended, "
                             f"{sum(g[3] for g in got)} read by the clients themselves of {total}")
    return {"rate": total / (max(g[1] for g in got) - t_go),
            "produce_rate": total / (max(m[1] for m in made) - t_go),
            "per_consumer": [int(np.frombuffer(g[0][0], np.int64).shape[0]) for g in got],
            "read_here": sum(g[3] for g in got)}


def _ready(pipe, what: str) -> None:
    got = pipe.recv() if pipe.poll(90) else None
    if isinstance(got, BaseException):
        raise RuntimeError(f"{what} failed") from got
    if got != "ready":
        raise RuntimeError(f"{what} did not get ready ({got!r})")


def _report(pipe, what: str):
    got = pipe.recv() if pipe.poll(300) else None
    if isinstance(got, BaseException):
        raise RuntimeError(f"{what} failed") from got
    if got is None:
        raise RuntimeError(f"{what} did not report")
    return got


def run_two_by_two(ctx, result, b, ns: str):
    n = 100_000 if ctx.quick else 1_000_000
    direct = _two_by_two(b, ns, n, True)
    socket = _two_by_two(b, ns, n, False)
    yield result("local_ipc_2x2", direct["rate"], "msg/s", ctx.memcpy_bps() / 100,
                 "memcpy of 100 B per message into a mapping (this host, same run)",
                 produce_rate=round(direct["produce_rate"]), per_consumer=direct["per_consumer"],
                 read_by_consumers=direct["read_here"], unix_socket=round(socket["rate"]),
                 unix_socket_produce_rate=round(socket["produce_rate"]),
                 vs_socket=round(direct["rate"] / socket["rate"], 2), producers=2, consumers=2,
                 messages=2 * n, body_bytes=100, target=1_000_000)
    batch = _two_by_two(b, ns, n, True, batch=True)
    yield result("local_ipc_2x2_batch", batch["rate"], "msg/s", ctx.memcpy_bps() / 100,
                 "memcpy of 100 B per message into a mapping (this host, same run)",
                 produce_rate=round(batch["produce_rate"]), per_consumer=batch["per_consumer"],
                 read_by_consumers=batch["read_here"], pull_batch_size=BATCH_PULL,
                 message_listeners=round(direct["rate"]),
                 vs_message_listeners=round(batch["rate"] / direct["rate"], 2), producers=2,
                 consumers=2, messages=2 * n, body_bytes=100, target=1_000_000)


# ---------------------------------------------------------------- SYNC_FLUSH
async def _window_sends(ns: str, topic: str, seconds: float, direct: bool,
                        window: int = WINDOW) -> tuple[int, float, int]:
    """``window`` callers each sending one message after another for
    ``seconds``: (answers, seconds, appended by this process); every answer
    SEND_OK at a position of its own."""
    cfg = ClientConfig(namesrv_addr=ns, direct_append=direct,
                       instance_name=f"perf-sync-w{window}-{direct}")
    async with AsyncProducer("perf-local-sync-window", client=cfg, max_in_flight=WINDOW) as p:
        await p.send(Message(topic, BODY))
        before = _direct_appended(p)
        places: set = set()
        end = time.monotonic() + seconds

        async def caller():
            while time.monotonic() < end:
                r = await p.send(Message(topic, BODY))
                if r.status is not SendStatus.SEND_OK:
                    raise AssertionError(f"a SYNC_FLUSH send was answered {r.status}")
                places.add((r.queue.queue_id, r.queue_offset))
        t0 = time.monotonic()
        await asyncio.gather(*[caller() for _ in range(window)])
        return len(places), time.monotonic() - t0, _direct_appended(p) - before


def run_sync_flush(ctx, result):
    from perf.broker import broker, flush_seq
    b = broker(ctx, "SYNC_FLUSH", "client-sync", embeddedNamesrv="true")
    ns = _namesrv(b)
    topic = _ready_topic(b, "PerfLocalIpcSync")
    seconds = 1.0 if ctx.quick else 5.0
    fsync_rate, _ = ctx.fdatasync()
    out = {}
    for window in (WINDOW, 1):
        for direct in (True, False):
            f0 = flush_seq(b)
            n, dt, here = asyncio.run(_window_sends(ns, topic, seconds, direct, window))
            f1 = flush_seq(b)
            if direct and here != n:
                raise AssertionError(f"direct SYNC_FLUSH: {here} of {n} appended by this process")
            out[direct, window] = (n / dt, round(n / max(1, f1 - f0), 2)
                                   if None not in (f0, f1) else None)
    (d, d_per), (s, s_per) = out[True, WINDOW], out[False, WINDOW]
    d1, s1 = out[True, 1][0], out[False, 1][0]
    yield result("local_ipc_sync_flush", d, "msg/s", fsync_rate, "raw fdatasync/s (4 KiB overwrite)",
                 msgs_per_fdatasync=d_per, unix_socket=round(s), unix_socket_msgs_per_fdatasync=s_per,
                 vs_socket=round(d / s, 2), window=WINDOW, body_bytes=100, target_vs_socket=1.0,
                 one_at_a_time=round(d1), unix_socket_one_at_a_time=round(s1),
                 one_at_a_time_vs_socket=round(d1 / s1, 2))
