"""shmq's Python client against the real C++-core client, same broker, same run.

- client_send_async: ``AsyncProducer.send`` of 100-byte messages, WINDOW in
  flight (asyncio tasks) — msg/s; beside it the raw request/response rate
  on the same transport (the limit) and the C++ core (PyPI
  ``rocketmq==0.4.4``) doing ``send_async`` with the same window, when
  that wheel is installed (``pip install -e '.[compat]'``, as the README's
  test command does) — the target is not slower than the native client.
- client_send_batch: ``send_batch`` of 16 × 100 B — msg/s, C++
  ``send_batch`` of the same beside it (librocketmq 1.x fails batches of
  24 or more of these locally, before sending), and shmq's with 256.
- client_consume: ``AsyncPushConsumer`` (concurrently, listener batches of
  32) draining a backlog of 100-byte messages — msg/s from the first
  delivery to the last, beside raw socket bulk bandwidth in records of that
  size; the C++ PushConsumer (2 threads, its Python callback per message)
  on the same backlog with its own group.

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


async def _shmq_send(namesrv: str, topic: str, seconds: float, unix: bool, batch: int) -> float:
    cfg = ClientConfig(namesrv_addr=namesrv, use_unix_socket=unix, instance_name=f"perf-{unix}")
    async with AsyncProducer("perf-client", client=cfg) as p:
        sent = 0
        msgs = [Message(topic, BODY) for _ in range(batch)]
        await p.send(msgs[0])                                # route, connection, heartbeat
        t0 = time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            if batch == 1:
                rs = await asyncio.gather(*[p.send(Message(topic, BODY)) for _ in range(WINDOW)])
            else:
                rs = await asyncio.gather(*[p.send_batch(msgs) for _ in range(max(1, WINDOW // batch))])
            if any(r.status is not SendStatus.SEND_OK for r in rs):
                raise AssertionError(f"a send was answered {[r.status for r in rs]}")
            sent += batch * len(rs)
        return sent / (time.perf_counter() - t0)


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
        topic = f"PerfClient_{batch}"
        with RemotingClient(b.addr("tcp")) as c:
            create_topic(c, topic, 4)
        _route_ready(b, topic)
        tcp = asyncio.run(_shmq_send(ns, topic, seconds, False, batch))
        unix = (asyncio.run(_shmq_send(ns, topic, seconds, True, batch))
                if "unix" in b.transports else None)                 # a named broker elsewhere
        cpp = _cpp_send(ns, topic, seconds, batch)
        extra = {}
        if batch > 1:
            extra["batch_256"] = round(asyncio.run(_shmq_send(ns, topic, seconds, False, 256)))
        yield result(name, tcp, "msg/s", rt["rate"],
                     "raw request/response round trip (tcp, one in flight)",
                     unix_socket=round(unix) if unix else None, cpp_client=round(cpp) if cpp else None,
                     vs_cpp=round(tcp / cpp, 3) if cpp else None,
                     note=None if cpp else "rocketmq==0.4.4 not installed (pip install -e '.[compat]'): no C++ comparison",
                     window=WINDOW, batch=batch, body_bytes=100, **extra)




async def _backlog(namesrv: str, topic: str, n: int) -> None:
    cfg = ClientConfig(namesrv_addr=namesrv, instance_name="perf-backlog")
    async with AsyncProducer("perf-backlog", client=cfg) as p:
        msgs = [Message(topic, BODY) for _ in range(256)]
        for _ in range(n // 256):
            await p.send_batch(msgs)


async def _shmq_consume(namesrv: str, topic: str, n: int, unix: bool) -> float:
    from shmq.client import AsyncPushConsumer, ConsumeConcurrentlyStatus
    done = asyncio.Event()
    got = [0, 0.0]

    seen: set[str] = set()

    async def on_messages(msgs, context):
        if got[0] == 0:
            got[1] = time.perf_counter()
        got[0] += len(msgs)
        seen.update(m.msg_id for m in msgs)
        if len(seen) >= n:
            done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    cfg = ClientConfig(namesrv_addr=namesrv, use_unix_socket=unix, instance_name=f"perf-c-{unix}")
    c = AsyncPushConsumer(f"perf-consume-{unix}", client=cfg,
                          consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                          consume_message_batch_max_size=32)
    c.subscribe(topic, "*")
    c.register_message_listener(on_messages)
    await c.start()
    try:
        await asyncio.wait_for(done.wait(), 120)
    finally:
        await c.shutdown()
    if got[0] != n:
        raise AssertionError(f"{got[0]} deliveries of {n} messages: some came twice")
    return n / (time.perf_counter() - got[1])


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
    topic = "PerfClientConsume"
    with RemotingClient(b.addr("tcp")) as c:
        create_topic(c, topic, 4)
    _route_ready(b, topic)
    asyncio.run(_backlog(ns, topic, n))
    tcp = asyncio.run(_shmq_consume(ns, topic, n, False))
    unix = asyncio.run(_shmq_consume(ns, topic, n, True)) if "unix" in b.transports else None
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
