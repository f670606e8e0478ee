"""shmq's Python client against the real C++-core client, same broker, same run.

- client_send_async: ``AsyncProducer.send`` of 100-byte messages, one per
  call, WINDOW in flight (WINDOW caller tasks awaiting ``send`` in a loop,
  ``max_in_flight`` = WINDOW: no task per send) — msg/s and the client's
  CPU per send; beside it the raw request/response rate on the same
  transport (the limit) and the C++ core (PyPI ``rocketmq==0.4.4``) doing
  ``send_async`` with the same window, when that wheel is installed
  (``pip install -e '.[compat]'``, as the README's test command does) — the
  target is not slower than the native client.
- client_send_accumulated: the same sends with the accumulator on
  (``linger_ms`` = LINGER_MS, ``batch_max_bytes`` 16 KiB): single sends
  leave as SEND_BATCH_MESSAGE, each caller still awaiting its own result.
  Beside it the asyncio floor (``_floor``): the same callers awaiting
  futures that a loop callback answers half a window at a time, no
  producer and no I/O — what the one-awaiting-coroutine-per-send shape
  allows in this interpreter on this machine, whatever the producer does.
  Both lines carry what a user could pick instead on this host, measured in
  the same run with 100-byte messages: ``multiprocessing.Queue`` (one
  process puts, this one gets), pyzmq PUSH/PULL over ipc:// and NATS core
  publish/subscribe (``nats-py`` and a ``nats-server`` on the PATH) — each
  where installed, else a note says what is missing. None of them is
  durable or acknowledged. Issue 14's targets: >= 100 k msg/s, >= 500 k
  with the accumulator, on 2 cores.
- client_send_batch: ``send_batch`` of 16 × 100 B — msg/s, C++
  ``send_batch`` of the same beside it (librocketmq 1.x fails batches of
  24 or more of these locally, before sending), and shmq's with 256.
- client_consume: ``AsyncPushConsumer`` (concurrently, listener batches of
  32) draining a backlog of 100-byte messages — msg/s from the first
  delivery to the last, beside raw socket bulk bandwidth in records of that
  size; the C++ PushConsumer (2 threads, its Python callback per message)
  on the same backlog with its own group.
- client_consume_batch1: the same with RocketMQ's default listener batch
  of one message (a consume request each: the consume pool's cost per
  request), and the consumer's CPU a message.

Both clients talk TCP to the broker (the C++ core has no Unix socket); the
shmq client is run a second time with its Unix-socket path.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import textwrap
import time

from perf import Skipped
from perf.broker import Broker, NamedBroker, broker, create_topic
from shmq.client import AsyncProducer, ClientConfig, Message, SendStatus
from shmq.client.remoting import RemotingClient

WINDOW = 64
LINGER_MS = 5
BODY = b"x" * 100


def _broker(ctx) -> Broker | NamedBroker:
    return broker(ctx, "ASYNC_FLUSH", "client", embeddedNamesrv="true")


def _namesrv(b: Broker | NamedBroker) -> str:
    if b.namesrv is None:
        raise Skipped(f"the broker {b.tcp} names no NameServer (namesrvAddr empty, "
                      "embeddedNamesrv false): the clients find brokers through one")
    return b.namesrv


def _route_ready(b: Broker | NamedBroker, topic: str) -> None:
    from shmq.ipc.codes import RequestCode as RC
    from shmq.ipc.remoting import RemotingCommand
    deadline = time.monotonic() + 10
    with RemotingClient(_namesrv(b)) as ns:
        while ns.invoke(RemotingCommand(RC.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic})).code != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic} never reached the NameServer")
            time.sleep(0.05)


def _ready_topic(b: Broker | NamedBroker, topic: str, queues: int = 4) -> str:
    """``topic`` created on the broker and routed by its NameServer."""
    with RemotingClient(b.addr("tcp")) as c:
        create_topic(c, topic, queues)
    _route_ready(b, topic)
    return topic


async def _shmq_send(namesrv: str, topic: str, seconds: float, unix: bool, batch: int,
                     linger_ms: float = 0, direct: bool = False) -> float:
    """msg/s (and, for single sends, ``_LAST_CPU_US``: the client's CPU per send).
    ``direct``: appends to the store by this process (client/direct.py, the
    local_ipc bench); off, every send crosses the socket."""
    cfg = ClientConfig(namesrv_addr=namesrv, use_unix_socket=unix, direct_append=direct,
                       instance_name=f"perf-{unix}-{direct}")
    async with AsyncProducer("perf-client", client=cfg, max_in_flight=WINDOW, linger_ms=linger_ms) as p:
        sent = 0
        msgs = [Message(topic, BODY) for _ in range(batch)]
        await p.send(msgs[0])                                # route, connection, heartbeat
        if batch == 1:
            return await _single_sends(p, topic, seconds)
        t0 = time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            rs = await asyncio.gather(*[p.send_batch(msgs) for _ in range(max(1, WINDOW // batch))])
            if any(r.status is not SendStatus.SEND_OK for r in rs):
                raise AssertionError(f"a send was answered {[r.status for r in rs]}")
            sent += batch * len(rs)
        return sent / (time.perf_counter() - t0)


_LAST_CPU_US: list[float] = [0.0]
_LAST_PER_REQUEST: list[float] = [0.0]      # messages per SEND_BATCH_MESSAGE (accumulator on)


async def _single_sends(p: AsyncProducer, topic: str, seconds: float) -> float:
    """WINDOW callers, each awaiting one ``send`` after another until the time
    is up. Checks: every answer SEND_OK, and every message got a position of
    its own (queue, offset) — none lost or answered twice."""
    places: set[tuple[int, int]] = set()
    answered = [0]
    end = time.perf_counter() + seconds
    requests = p.accumulator.requests if p.accumulator is not None else 0

    async def caller() -> None:
        while time.perf_counter() < end:
            r = await p.send(Message(topic, BODY))
            if r.status is not SendStatus.SEND_OK:
                raise AssertionError(f"a send was answered {r.status}")
            places.add((r.queue.queue_id, r.queue_offset))
            answered[0] += 1
    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*[caller() for _ in range(WINDOW)])
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    if len(places) != answered[0]:
        raise AssertionError(f"{answered[0]} answers name {len(places)} distinct positions")
    _LAST_CPU_US[0] = cpu / max(1, answered[0]) * 1e6
    if p.accumulator is not None:
        _LAST_PER_REQUEST[0] = answered[0] / max(1, p.accumulator.requests - requests)
    return answered[0] / dt


async def _floor(seconds: float) -> tuple[float, float]:
    """What the callers' shape allows in this interpreter, with no producer
    and no I/O: WINDOW callers, each making a ``Message`` and awaiting a
    future with a UNIQ_KEY, the futures answered WINDOW / 2 at a time by a
    loop callback with a ``SendResult`` each — the asyncio part of every
    send (a coroutine, a future, a wake-up of the caller's task). msg/s and
    CPU µs a message."""
    from shmq.client.message import MessageQueue, SendResult, unique_ids
    loop = asyncio.get_running_loop()
    q = MessageQueue("PerfFloor", "none", 0)
    waiting: list = []
    offset = [0]

    def answer() -> None:
        half = WINDOW // 2
        batch, waiting[:half] = waiting[:half], []
        for i, (fut, uniq) in enumerate(batch, offset[0]):
            fut.set_result(SendResult(SendStatus.SEND_OK, uniq, "", q, i))
        offset[0] += len(batch)
        if len(waiting) >= half:
            loop.call_soon(answer)

    async def send(msg: Message) -> SendResult:
        fut = loop.create_future()
        waiting.append((fut, unique_ids.next()))
        if len(waiting) == WINDOW // 2:
            loop.call_soon(answer)
        return await fut

    answered = [0]
    end = time.perf_counter() + seconds

    async def caller() -> None:
        while time.perf_counter() < end:
            r = await send(Message("PerfFloor", BODY))
            if r.status is not SendStatus.SEND_OK:
                raise AssertionError("the floor's future was answered otherwise")
            answered[0] += 1
        if waiting:                                        # the stragglers when time is up
            loop.call_soon(answer)
    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*[caller() for _ in range(WINDOW)])
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return answered[0] / dt, cpu / max(1, answered[0]) * 1e6


# ---------------------------------------------------------------- peers a user could pick instead
_PEER_N = 200_000


def _mp_queue(n: int) -> float:
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    q = ctx.Queue(maxsize=10_000)
    p = ctx.Process(target=_mp_put, args=(q, n), daemon=True)
    p.start()
    q.get()                                               # the producer is running
    t0 = time.perf_counter()
    for _ in range(n):
        if len(q.get()) != len(BODY):
            raise AssertionError("multiprocessing.Queue handed back another message")
    rate = n / (time.perf_counter() - t0)
    p.join(10)
    return rate


def _mp_put(q, n: int) -> None:
    q.put(BODY)
    for _ in range(n):
        q.put(BODY)


def _zmq_ipc(n: int, scratch: str) -> float:
    import zmq
    addr = f"ipc://{scratch}/perf-zmq-{os.getpid()}"
    code = textwrap.dedent(f'''
        import sys, zmq
        s = zmq.Context().socket(zmq.PUSH); s.connect({addr!r})
        s.send(b"go")
        for _ in range({n}): s.send({BODY!r})
        s.close(linger=-1)
    ''')
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(addr)
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        pull.recv()
        t0 = time.perf_counter()
        for _ in range(n):
            if len(pull.recv()) != len(BODY):
                raise AssertionError("pyzmq handed back another message")
        return n / (time.perf_counter() - t0)
    finally:
        proc.wait(30)
        pull.close(0)
        ctx.term()


def _nats_core(n: int) -> float:
    import shutil
    import socket

    import nats                                            # noqa: F401  (nats-py)
    server = shutil.which("nats-server")
    if server is None:
        raise ImportError("no nats-server on the PATH")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "-a", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def run() -> float:
        import nats as natslib
        for _ in range(100):
            try:
                nc = await natslib.connect(f"nats://127.0.0.1:{port}")
                break
            except Exception:                              # the server is still starting
                await asyncio.sleep(0.05)
        else:
            raise RuntimeError("nats-server did not start")
        got, done = [0], asyncio.Event()

        async def on(msg) -> None:
            got[0] += 1
            if got[0] == n:
                done.set()
        await nc.subscribe("perf", cb=on)
        t0 = time.perf_counter()
        for _ in range(n):
            await nc.publish("perf", BODY)
        await asyncio.wait_for(done.wait(), 120)
        rate = n / (time.perf_counter() - t0)
        await nc.close()
        return rate
    try:
        return asyncio.run(run())
    finally:
        proc.terminate()
        proc.wait(10)


def peers(ctx) -> dict:
    """msg/s of the peers on this host (once per run), or why one is missing."""
    if "client_peers" in ctx.shared:
        return ctx.shared["client_peers"]
    n = _PEER_N // 4 if ctx.quick else _PEER_N
    out: dict = {"peer_messages": n}
    notes = []
    out["mp_queue"] = round(_mp_queue(n))
    try:
        out["pyzmq_ipc"] = round(_zmq_ipc(n, ctx.scratch))
    except ImportError as e:
        out["pyzmq_ipc"] = None
        notes.append(f"pyzmq not measured: {e}")
    try:
        out["nats_core"] = round(_nats_core(n))
    except ImportError as e:
        out["nats_core"] = None
        notes.append(f"NATS core not measured: {e}")
    out["peer_note"] = "; ".join(notes) or None
    ctx.shared["client_peers"] = out
    return out


_CPP = textwrap.dedent('''
    import sys, threading, time
    from rocketmq.client import Message, Producer
    namesrv, topic, seconds, batch, window = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    p = Producer("perf-cpp"); p.set_namesrv_addr(namesrv); p.start()
    def msg():
        m = Message(topic); m.set_body(b"x" * 100); return m
    p.send_sync(msg())
    sent = 0; t0 = time.perf_counter(); end = t0 + seconds
    if batch == 1:
        sem = threading.Semaphore(window); lock = threading.Lock(); done = [0]
        def ok(r):
            with lock: done[0] += 1
            sem.release()
        def bad(e):
            sem.release()
        while time.perf_counter() < end:
            sem.acquire(); p.send_async(msg(), ok, bad); sent += 1
        for _ in range(window): sem.acquire()
        sent = done[0]
    else:
        while time.perf_counter() < end:
            p.send_batch([msg() for _ in range(batch)]); sent += batch
    rate = sent / (time.perf_counter() - t0)
    p.shutdown(); print(rate)
''')


def _cpp_send(namesrv: str, topic: str, seconds: float, batch: int) -> float | None:
    home = tempfile.mkdtemp(prefix="cpp-home-")
    env = dict(os.environ, HOME=home)
    if subprocess.run([sys.executable, "-c", "import rocketmq.client"], env=env,
                      capture_output=True).returncode != 0:
        return None
    r = subprocess.run([sys.executable, "-c", _CPP, namesrv, topic, str(seconds), str(batch),
                        str(WINDOW)], env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"the C++ client failed: {r.stderr[-800:]}")
    return float(r.stdout.strip().splitlines()[-1])


def run_send(ctx, result):
    b = _broker(ctx)
    seconds = 1.0 if ctx.quick else 5.0
    ns = _namesrv(b)
    rt = ctx.net_rtt("tcp")
    for batch, name in ((1, "client_send_async"), (16, "client_send_batch")):
        topic = _ready_topic(b, f"PerfClient_{batch}")
        tcp = asyncio.run(_shmq_send(ns, topic, seconds, False, batch))
        unix = (asyncio.run(_shmq_send(ns, topic, seconds, True, batch))
                if "unix" in b.transports else None)                 # a named broker elsewhere
        cpp = _cpp_send(ns, topic, seconds, batch)
        extra = {}
        if batch > 1:
            extra["batch_256"] = round(asyncio.run(_shmq_send(ns, topic, seconds, False, 256)))
        else:
            cpu_tcp = _LAST_CPU_US[0]
            extra.update(peers(ctx), client_cpu_us_per_send=round(cpu_tcp, 2), target=100_000)
        yield result(name, tcp, "msg/s", rt["rate"],
                     "raw request/response round trip (tcp, one in flight)",
                     unix_socket=round(unix) if unix else None, cpp_client=round(cpp) if cpp else None,
                     vs_cpp=round(tcp / cpp, 3) if cpp else None,
                     note=None if cpp else "rocketmq==0.4.4 not installed (pip install -e '.[compat]'): no C++ comparison",
                     window=WINDOW, batch=batch, body_bytes=100, **extra)
        if batch == 1:
            yield from _accumulated(ctx, result, b, ns, topic, seconds, rt)


def _accumulated(ctx, result, b, ns: str, topic: str, seconds: float, rt: dict):
    unix = "unix" in b.transports
    rate = asyncio.run(_shmq_send(ns, topic, seconds, unix, 1, linger_ms=LINGER_MS))
    cpu = _LAST_CPU_US[0]
    floor, floor_cpu = asyncio.run(_floor(seconds))
    yield result("client_send_accumulated", rate, "msg/s", rt["rate"],
                 "raw request/response round trip (tcp, one in flight)",
                 transport="unix" if unix else "tcp", client_cpu_us_per_send=round(cpu, 2),
                 messages_per_request=round(_LAST_PER_REQUEST[0], 1),
                 asyncio_floor=round(floor), asyncio_floor_cpu_us=round(floor_cpu, 2),
                 window=WINDOW, linger_ms=LINGER_MS, batch_max_bytes=16 * 1024, body_bytes=100,
                 target=500_000, **peers(ctx))




async def _backlog(namesrv: str, topic: str, n: int) -> None:
    cfg = ClientConfig(namesrv_addr=namesrv, instance_name="perf-backlog")
    async with AsyncProducer("perf-backlog", client=cfg) as p:
        msgs = [Message(topic, BODY) for _ in range(256)]
        for _ in range(n // 256):
            await p.send_batch(msgs)


async def _shmq_consume(namesrv: str, topic: str, n: int, unix: bool,
                        direct: bool = False, batch: int = 32,
                        columns: int = 0) -> tuple[float, float, int]:
    """A push consumer (its own group) draining the ``n``-message backlog of
    ``topic`` from the first offset: msg/s from the first delivery to the
    last, this process's CPU µs a message meanwhile, and how many it read
    from the store itself (``direct``: client/direct.py's reads, the scan
    kernel loaded before the drain; off, every pull crosses the socket).
    ``columns``: a batch listener (client/batch.py) with that
    pull_batch_size, each message seen by its queue offset, instead of a
    message listener seeing each one's msg_id.
    Every message must be delivered exactly once."""
    from shmq.client import AsyncPushConsumer, ConsumeConcurrentlyStatus
    if direct:
        from shmq.client.direct import warm_up_reads
        warm_up_reads()
    done = asyncio.Event()
    got = [0, 0.0, 0.0]
    seen: set[str] = set()

    async def on_messages(msgs, context):
        if got[0] == 0:
            got[1], got[2] = time.perf_counter(), time.process_time()
        got[0] += len(msgs)
        seen.update(m.msg_id for m in msgs)
        if len(seen) >= n:
            done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    offsets: list = []

    async def on_batch(batch, context):
        if got[0] == 0:
            got[1], got[2] = time.perf_counter(), time.process_time()
        got[0] += len(batch)
        offsets.append(batch.queue_offsets + (batch.queue.queue_id << 40))
        if got[0] >= n:
            done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    cfg = ClientConfig(namesrv_addr=namesrv, use_unix_socket=unix, direct_append=direct,
                       instance_name=f"perf-c-{unix}-{direct}")
    c = AsyncPushConsumer(f"perf-consume-{unix}-{direct}-{time.time_ns()}", client=cfg,
                          consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                          consume_message_batch_max_size=batch,
                          pull_batch_size=columns or 32)
    c.subscribe(topic, "*")
    if columns:
        from shmq.client.walk import warm_up_decoding
        warm_up_decoding()
        c.register_batch_listener(on_batch)
    else:
        c.register_message_listener(on_messages)
    await c.start()
    try:
        await asyncio.wait_for(done.wait(), 120)
        rate = n / (time.perf_counter() - got[1])
        cpu_us = (time.process_time() - got[2]) * 1e6 / n
        ds = [d for d in c.instance.direct.values() if d is not None]
        read_here = ds[0].reads.messages if ds else 0
    finally:
        await c.shutdown()
    if columns:
        import numpy as np
        seen = set(np.unique(np.concatenate(offsets)).tolist()) if offsets else set()
    if got[0] != n or len(seen) != n:
        raise AssertionError(f"{got[0]} deliveries of {n} messages, {len(seen)} distinct: "
                             "some came twice")
    if direct and read_here < n // 2:
        raise AssertionError(f"the direct consumer read {read_here} of {n} itself")
    return rate, cpu_us, read_here


_CPP_CONSUME = textwrap.dedent('''
    import sys, threading, time
    from rocketmq.client import PushConsumer
    namesrv, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    got = [0, 0.0]; done = threading.Event(); lock = threading.Lock()
    def on_message(msg):
        with lock:
            if got[0] == 0: got[1] = time.perf_counter()
            got[0] += 1
            if got[0] >= n: done.set()
        return None
    c = PushConsumer("perf-cpp-consume"); c.set_namesrv_addr(namesrv); c.set_thread_count(2)
    c.subscribe(topic, on_message); c.start()
    done.wait(120); rate = got[0] / (time.perf_counter() - got[1]); c.shutdown(); print(rate)
''')


def run_consume(ctx, result):
    b = _broker(ctx)
    n = 20_480 if ctx.quick else 204_800
    ns = _namesrv(b)
    topic = _ready_topic(b, "PerfClientConsume")
    asyncio.run(_backlog(ns, topic, n))
    tcp = asyncio.run(_shmq_consume(ns, topic, n, False))[0]
    unix = asyncio.run(_shmq_consume(ns, topic, n, True))[0] if "unix" in b.transports else None
    cpp = None
    home = tempfile.mkdtemp(prefix="cpp-home-")
    env = dict(os.environ, HOME=home)
    if subprocess.run([sys.executable, "-c", "import rocketmq.client"], env=env,
                      capture_output=True).returncode == 0:
        r = subprocess.run([sys.executable, "-c", _CPP_CONSUME, ns, topic, str(n)], env=env,
                           capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            raise RuntimeError(f"the C++ consumer failed: {r.stderr[-800:]}")
        cpp = float(r.stdout.strip().splitlines()[-1])
    bulk = ctx.net_bulk("tcp")
    record = 100 + 91 + len(topic) + 60                   # body, fixed fields, topic, properties
    yield result("client_consume", tcp, "msg/s", bulk["bps"] / record,
                 f"raw socket bulk (tcp) in {record}-byte records",
                 unix_socket=round(unix) if unix else None, cpp_client=round(cpp) if cpp else None,
                 vs_cpp=round(tcp / cpp, 3) if cpp else None,
                 note=None if cpp else "rocketmq==0.4.4 not installed (pip install -e '.[compat]'): no C++ comparison",
                 messages=n, body_bytes=100)
    # the default listener batch (consumeMessageBatchMaxSize 1): a consume request a message
    tcp1, cpu1, _ = asyncio.run(_shmq_consume(ns, topic, n, False, batch=1))
    unix1 = (asyncio.run(_shmq_consume(ns, topic, n, True, batch=1))[0]
             if "unix" in b.transports else None)
    yield result("client_consume_batch1", tcp1, "msg/s", bulk["bps"] / record,
                 f"raw socket bulk (tcp) in {record}-byte records",
                 unix_socket=round(unix1) if unix1 else None, client_cpu_us_per_msg=round(cpu1, 2),
                 batch32=round(tcp), cpp_client=round(cpp) if cpp else None,
                 vs_cpp=round(tcp1 / cpp, 3) if cpp else None, messages=n, body_bytes=100)
