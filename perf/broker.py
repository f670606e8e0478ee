"""The broker end to end: a real ``shmq broker`` process, clients speaking the
RocketMQ 4.x remoting protocol over the Unix socket and TCP loopback.

Each bench prints its figure beside the raw limit for the same work on the
same transport, measured in the same run (perf.net_limits):

- broker_send: one-at-a-time SEND_MESSAGE_V2 (310) of 100 B from one
  connection, a lean client (``run_send``) — msg/s, p50/p99 — against the
  raw request/response round trip (target ratio ≥ 0.70);
- broker_produce: batches (320) of 32 and of 256 100-byte messages from
  PRODUCERS processes, each its own connection and queue, WINDOW requests in
  flight — msg/s (target ≥ 1,000,000), limit: raw bulk socket bandwidth in
  messages of this size, with Redis pipelined XADD beside it when
  redis_peer ran first;
- broker_consume: a backlog of 1 KiB messages pulled (11) with maxMsgNums
  32 by one consumer process, WINDOW pulls in flight over QUEUES queues —
  body bytes/s against raw bulk socket bandwidth (target ratio ≥ 0.5);
  beside it the CPU a pull of the broker's processes and of the consumer,
  and the wall time a pull: which side the figure is the limit of;
- broker_latency: produce → consume latency, p50/p99, at a fixed rate,
  the consumer parked in a long poll (sysFlag suspend) and every body
  stamped with CLOCK_MONOTONIC at send — against the raw round trip p50;
- broker_sync_flush: SYNC_FLUSH broker, 1 and 16 connections (processes)
  each sending one message at a time, and one connection with 64 in
  flight — msg/s against the raw fdatasync rate, with Redis ``appendfsync
  always`` under the same load beside it, and the messages each fdatasync
  made durable (group commit). The one-at-a-time clients are lean
  (``_sync_producer``), as the Redis peer's are;
- broker_scaling: brokers of W = 1, 2, 4 … workers (up to the cores), two
  client processes per worker each pipelining SCALE_WINDOW single-message
  sends on its own connection and queue — msg/s against W × the 1-worker
  rate (the target: 8 workers ≥ 6× one, on ≥ 8 cores), and the workers'
  and the clients' CPU per send (a lean client: ``_lean_sender`` says why).

One ASYNC_FLUSH broker serves the first four benches (started on first use,
stopped at the end of the run); broker_sync_flush starts its own. Every
bench checks what it did: reply codes, queue offsets, the queues' maxOffset
against the acknowledged count, sample bodies read back by a pull.

A broker someone else runs can stand in for the ones started here
(``ctx.named_broker``, set by ``--broker HOST:PORT``): ``NamedBroker`` reads
its settings from the broker itself (GET_BROKER_CONFIG, runtime info), uses
its Unix socket when that is on this host, and a bench whose broker needs a
setting the named one lacks (SYNC_FLUSH, SQL92) is skipped with the reason
rather than run against the wrong configuration. It is never started,
stopped or killed here.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import deque

import numpy as np

from perf import Skipped
from perf.net_limits import FORK, TRANSPORTS, _check_exit
from shmq.client.remoting import RemotingClient
from shmq.core.state import StoreState
from shmq.ipc.control import ControlBlock, NotRunning
from shmq.ipc.headers import PULL_SUBSCRIPTION, PULL_SUSPEND, pull_ext, send_ext
from shmq.ipc.remoting import RemotingCommand

SEND_MESSAGE_V2 = 310
SEND_BATCH_MESSAGE = 320
PULL_MESSAGE = 11
UPDATE_AND_CREATE_TOPIC = 17
GET_BROKER_CONFIG, GET_BROKER_RUNTIME_INFO = 26, 28
SUCCESS, FLUSH_DISK_TIMEOUT, PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY = 0, 10, 19, 20
MAGIC = -626843481                          # 0xDAA320A7, §5.1
GROUP = "perf_group"
PRODUCER_GROUP = "perf_producer"
PROPS = "TAGS\x01t\x02KEYS\x01k"

PRODUCERS = 4
WINDOW = 4
QUEUES = 4
SYNC_CONNS = (1, 16)
SYNC_WINDOW = 64             # sends in flight on one connection (broker_sync_flush_w64)
SCALE_WINDOW = 16
SCALE_CLIENTS_PER_WORKER = 2
TIMEOUT_S = 15.0


# ------------------------------------------------------------------ the broker process
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    """``python -m shmq.tools broker -c conf``, up until ``stop()``."""

    def __init__(self, ctx, flush: str, name: str = "", **extra):
        root = ctx.sub(f"broker-{name or flush}")
        store = os.path.join(root, "store")
        conf = {"storePathRootDir": store, "listenPort": free_port(), "haListenPort": free_port(),
                "namesrvListenPort": free_port(), "embeddedNamesrv": "false",
                "flushDiskType": flush, "workerProcessNums": 2,
                "mappedFileSizeCommitLog": (256 if ctx.quick else 1024) << 20, **extra}
        if len(os.path.join(store, "broker.sock")) > 100:       # sun_path is 108 bytes
            conf["unixSocketPath"] = f"/tmp/shmq-perf-{os.getpid()}-{name or flush}.sock"
        self.conf_path = os.path.join(root, "broker.conf")
        with open(self.conf_path, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in conf.items())
        self.flush = flush
        self.store = store
        self.log_path = os.path.join(root, "broker.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "shmq.tools", "broker", "-c", self.conf_path],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.log, cwd=root)
        line = self._ready_line(60.0)
        fields = dict(tok.split("=", 1) for tok in line.split()[3:] if "=" in tok)
        self.tcp, self.unix = fields["tcp"], fields["unix"]
        self.transports = TRANSPORTS
        embedded = str(conf.get("embeddedNamesrv", "true")).lower() == "true"
        self.namesrv = f"127.0.0.1:{conf['namesrvListenPort']}" if embedded else None
        self.out: deque[str] = deque(maxlen=100)
        self._drain = threading.Thread(target=self._drain_stdout, daemon=True)
        self._drain.start()
        for watch in getattr(ctx, "broker_watchers", ()):   # shmq profile: every broker a bench starts
            watch(self)

    def _ready_line(self, timeout: float) -> str:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        seen = []
        try:
            while time.monotonic() < deadline:
                if not sel.select(max(0.0, deadline - time.monotonic())):
                    continue
                line = self.proc.stdout.readline().decode(errors="replace")
                if not line:                                  # EOF: it died
                    self.proc.wait(5)
                    raise RuntimeError(f"broker exited with {self.proc.returncode} before ready: "
                                       f"{''.join(seen)[-500:]}{self.log_tail()}")
                seen.append(line)
                if line.startswith("shmq broker ready"):
                    return line.strip()
        finally:
            sel.close()
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError(f"broker not ready within {timeout} s: {self.log_tail()}")

    def _drain_stdout(self) -> None:
        for line in self.proc.stdout:
            self.out.append(line.decode(errors="replace"))

    def log_tail(self, n: int = 2000) -> str:
        if not self.log.closed:          # (``stop`` closes it before it reports the exit)
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")

    def addr(self, transport: str) -> str:
        return self.tcp if transport == "tcp" else f"unix:{self.unix}"

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the broker died (exit {self.proc.returncode}): {self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError(f"the broker did not stop on SIGTERM: {self.log_tail()}")
        self._drain.join(5)
        self.log.close()
        if self.proc.returncode != 0:
            raise RuntimeError(f"the broker exited with {self.proc.returncode}: {self.log_tail()}")


class NamedBroker:
    """A running broker at ``host:port`` that this run did not start: its
    settings come from the broker (GET_BROKER_CONFIG's ``key=value`` lines,
    the runtime info's ``unixSocketPath``); ``stop`` leaves it running."""

    # settings a bench's broker may ask for that only say how to start one:
    # a named broker with any NameServer will do (``namesrv`` says which)
    HOW_TO_START = ("embeddedNamesrv",)

    def __init__(self, addr: str):
        self.tcp = addr
        try:
            with RemotingClient(addr) as c:
                conf = check(c.invoke(RemotingCommand(GET_BROKER_CONFIG), timeout=TIMEOUT_S),
                             what="GET_BROKER_CONFIG")
                info = check(c.invoke(RemotingCommand(GET_BROKER_RUNTIME_INFO), timeout=TIMEOUT_S),
                             what="GET_BROKER_RUNTIME_INFO")
        except OSError as e:
            raise RuntimeError(f"cannot reach the broker at {addr}: {e}") from e
        self.config = dict(line.split("=", 1) for line in bytes(conf.body).decode().splitlines()
                           if "=" in line)
        path = json.loads(bytes(info.body))["table"].get("unixSocketPath")
        self.unix = path if path and os.path.exists(path) else None      # on this host?
        self.transports = TRANSPORTS if self.unix else ("tcp",)
        ns = self.config.get("namesrvAddr", "").split(";")[0]
        if self.config.get("embeddedNamesrv", "").lower() == "true":
            ns = f"{addr.rpartition(':')[0]}:{self.config['namesrvListenPort']}"
        self.namesrv = ns or None
        store = self.config.get("storePathRootDir")
        self.store = store if store and os.path.isdir(store) else None   # on this host?

    def lacks(self, flush: str, settings: dict) -> str | None:
        """Why this broker cannot serve a bench that wants these settings, or None."""
        want = {"flushDiskType": flush, **settings}
        diff = [(k, v) for k, v in want.items() if k not in self.HOW_TO_START
                and self.config.get(k, "").lower() != str(v).lower()]
        if not diff:
            return None
        return (f"needs a broker with {', '.join(f'{k}={v}' for k, v in diff)}; the named broker "
                f"{self.tcp} has {', '.join(f'{k}={self.config.get(k)}' for k, _ in diff)}")

    def addr(self, transport: str) -> str:
        return self.tcp if transport == "tcp" else f"unix:{self.unix}"

    def alive(self) -> None:
        try:
            RemotingClient(self.tcp).close()
        except OSError as e:
            raise RuntimeError(f"the named broker {self.tcp} is gone: {e}") from e

    def stop(self) -> None:
        pass


def broker(ctx, flush: str = "ASYNC_FLUSH", name: str = "", **extra) -> Broker | NamedBroker:
    """The run's broker with this flush type (or this name and settings),
    started on first use; the named broker instead when there is one, or
    ``Skipped`` when it lacks these settings."""
    named = getattr(ctx, "named_broker", None)
    if named is not None:
        why = named.lacks(flush, extra)
        if why:
            raise Skipped(why)
        named.alive()
        return named
    key = f"broker-{name or flush}"
    b = ctx.shared.get(key)
    if b is None:
        b = ctx.shared[key] = Broker(ctx, flush, name, **extra)
        ctx.on_close(b.stop)
    b.alive()
    return b


# ------------------------------------------------------------------ protocol
def check(reply: RemotingCommand, *codes: int, what: str = "") -> RemotingCommand:
    if reply.code not in (codes or (SUCCESS,)):
        raise RuntimeError(f"{what or 'request'}: reply code {reply.code} ({reply.remark})")
    return reply


def create_topic(client: RemotingClient, topic: str, queues: int) -> None:
    cmd = RemotingCommand(UPDATE_AND_CREATE_TOPIC, ext={
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(queues),
        "writeQueueNums": str(queues), "perm": "6", "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0", "order": "false"})
    check(client.invoke(cmd, timeout=TIMEOUT_S), what=f"create topic {topic}")


def send_cmd(topic: str, qid: int, body: bytes, props: str = PROPS) -> RemotingCommand:
    return RemotingCommand(SEND_MESSAGE_V2, body=body, ext=_send_ext(topic, qid, props, False))


def _send_ext(topic: str, qid: int, props: str, batch: bool) -> dict[str, str]:
    return send_ext(producerGroup=PRODUCER_GROUP, topic=topic, defaultTopic="TBW102",
                    defaultTopicQueueNums=4, queueId=qid, sysFlag=0,
                    bornTimestamp=int(time.time() * 1000), flag=0, properties=props,
                    reconsumeTimes=0, unitMode=False, batch=batch)


def batch_body(bodies: list[bytes], props: bytes = PROPS.encode()) -> bytes:
    """§5.5: int32 total | int32 magic 0 | int32 crc 0 | int32 flag | int32 len | body |
    int16 props len | props, per message."""
    out = []
    for b in bodies:
        out.append(struct.pack(">iiiii", 20 + len(b) + 2 + len(props), 0, 0, 0, len(b)))
        out.append(b)
        out.append(struct.pack(">h", len(props)))
        out.append(props)
    return b"".join(out)


def batch_cmd(topic: str, qid: int, body: bytes) -> RemotingCommand:
    return RemotingCommand(SEND_BATCH_MESSAGE, body=body, ext=_send_ext(topic, qid, "", True))


def pull_cmd(topic: str, qid: int, offset: int, max_msgs: int = 32, suspend_ms: int = 0,
             group: str = GROUP) -> RemotingCommand:
    return RemotingCommand(PULL_MESSAGE, ext=pull_ext(
        consumerGroup=group, topic=topic, queueId=qid, queueOffset=offset, maxMsgNums=max_msgs,
        sysFlag=PULL_SUBSCRIPTION | (PULL_SUSPEND if suspend_ms else 0), commitOffset=0,
        suspendTimeoutMillis=suspend_ms, subVersion=0, subscription="*"))


def records(body) -> list[tuple[int, int, bytes, int]]:
    """(queueId, queueOffset, body, record bytes) of each stored record (§5.1)."""
    out = []
    pos, n = 0, len(body)
    while pos < n:
        total, magic = struct.unpack_from(">ii", body, pos)
        if magic != MAGIC or not 0 < total <= n - pos:
            raise AssertionError(f"record at {pos}: magic {magic:#x}, size {total}")
        (qid,) = struct.unpack_from(">i", body, pos + 12)
        (qoff,) = struct.unpack_from(">q", body, pos + 20)
        (sysflag,) = struct.unpack_from(">i", body, pos + 36)
        at = pos + 48 + (20 if sysflag & 0x10 else 8) + 8 + (20 if sysflag & 0x20 else 8) + 12
        (blen,) = struct.unpack_from(">i", body, at)
        out.append((qid, qoff, bytes(body[at + 4:at + 4 + blen]), total))
        pos += total
    return out


def queue_end(client: RemotingClient, topic: str, qid: int) -> tuple[int, bytes | None]:
    """(maxOffset, body of the last message) of a queue, read by pulls."""
    r = check(client.invoke(pull_cmd(topic, qid, 0, 1), timeout=TIMEOUT_S),
              SUCCESS, PULL_NOT_FOUND, what="pull")
    mx = int(r.ext["maxOffset"])
    if mx == 0:
        return 0, None
    r = check(client.invoke(pull_cmd(topic, qid, mx - 1, 1), timeout=TIMEOUT_S), what="pull last")
    recs = records(r.body)
    if len(recs) != 1 or recs[0][1] != mx - 1 or recs[0][0] != qid:
        raise AssertionError(f"{topic}/{qid}: pull at {mx - 1} returned {[(q, o) for q, o, _, _ in recs]}")
    return mx, recs[0][2]


def verify_queues(client, topic: str, expect: dict[int, tuple[int, bytes]]) -> None:
    """Every queue holds exactly the expected count and ends with the expected body."""
    for qid, (count, last) in expect.items():
        mx, body = queue_end(client, topic, qid)
        if mx != count:
            raise AssertionError(f"{topic}/{qid}: maxOffset {mx}, acknowledged {count}")
        if count and body != last:
            raise AssertionError(f"{topic}/{qid}: the last message is not the one sent")


_LETTERS = bytes(range(65, 91)) * ((64 << 10) // 26 + 2)


def body_of(tag: int, i: int, n: int = 100) -> bytes:
    """Message ``i`` of producer/queue ``tag``: recognisable, ``n`` bytes."""
    head = b"%04d:%010d:" % (tag, i)
    return head + _LETTERS[i % 26:i % 26 + n - len(head)]


def spawn(target, args) -> tuple:
    a, b = FORK.Pipe()
    p = FORK.Process(target=target, args=(*args, b), daemon=True)
    p.start()
    return p, a


def gather(kids: list, pipes: list, go, what: str, on_go=None, ready_s: float = 60,
           report_s: float = 300) -> list:
    """Wait for every client's "ready" (``ready_s`` each), start them all
    (``on_go()`` first), and collect what each reports (``report_s`` each: a
    full-size backlog fill runs for minutes)."""
    for a in pipes:
        got = a.recv() if a.poll(ready_s) else None
        if isinstance(got, BaseException):
            raise RuntimeError(f"{what}: a client failed") from got
        if got != "ready":
            raise RuntimeError(f"{what}: a client did not get ready ({got!r})")
    if on_go is not None:
        on_go()
    go.set()
    out = []
    for a in pipes:
        if not a.poll(report_s):
            raise RuntimeError(f"{what}: a client did not report within {report_s:.0f} s")
        got = a.recv()
        if isinstance(got, BaseException):
            raise RuntimeError(f"{what}: a client failed") from got
        out.append(got)
    for p in kids:
        _check_exit(p, what)
    return out


def _child(fn):
    """Run a client process body; send its exception back instead of dying silently."""
    def body(*args):
        pipe = args[-1]
        try:
            fn(*args)
        except BaseException as e:
            pipe.send(RuntimeError(f"{type(e).__name__}: {e}"))
            raise
    return body


# ------------------------------------------------------------------ (a) one-at-a-time send
def run_send(ctx, result):
    """One connection, a send at a time, each waiting for its answer, from a
    lean client (``worker_cpu.sending``: a ``Sender`` with a window of 1,
    template frames on a plain socket, each answer checked by its JSON head,
    the queue verified at the end), as the raw round trip's client is:
    ``RemotingClient.invoke`` cost ~50 µs of its own a send, on the same two
    cores, which the figure charged the broker."""
    from perf.worker_cpu import sending
    b = broker(ctx)
    seconds = 0.5 if ctx.quick else 3.0
    for tr in b.transports:
        rt = ctx.net_rtt(tr)
        with sending(b, tr, f"PerfSend_{tr}", 1) as s:
            step = s.step
            for _ in range(500):                                  # warm the path
                step(1)
            lat = []
            pc = time.perf_counter
            t0 = t = pc()
            end = t0 + seconds
            while t < end:
                step(1)
                t2 = pc()
                lat.append(t2 - t)
                t = t2
            rate = len(lat) / (t - t0)
        a = np.array(lat) * 1e6
        yield result(f"broker_send_1conn_{tr}", rate, "msg/s", rt["rate"],
                     f"raw request/response round trip ({tr}, one in flight, "
                     f"best placement: {rt['placement']})",
                     limit_cross_core=round(rt.get("rate_cross_core", 0)),
                     p50_us=round(float(np.percentile(a, 50)), 2),
                     p99_us=round(float(np.percentile(a, 99)), 2),
                     raw_p50_us=round(rt["p50_us"], 2), raw_p99_us=round(rt["p99_us"], 2),
                     messages=len(lat), body_bytes=100, target_ratio=0.70)


# ------------------------------------------------------------------ (b) batched produce
@_child
def _batch_producer(addr, topic, qid, batch, seconds, go, pipe):
    bodies = [body_of(qid, j) for j in range(batch)]
    payload = batch_body(bodies)
    with RemotingClient(addr) as c:
        check(c.invoke(batch_cmd(topic, qid, payload), timeout=TIMEOUT_S), what="warm batch")
        pipe.send("ready")
        go.wait()
        offsets = []
        inflight = 0
        t0 = time.monotonic()
        end = t0 + seconds
        for _ in range(WINDOW):
            c.send(batch_cmd(topic, qid, payload))
            inflight += 1
        while inflight:
            r = c.recv(timeout=TIMEOUT_S)
            inflight -= 1
            if r.code != SUCCESS:
                raise RuntimeError(f"batch send: code {r.code} ({r.remark})")
            offsets.append(int(r.ext["queueOffset"]))
            if time.monotonic() < end:
                c.send(batch_cmd(topic, qid, payload))
                inflight += 1
        t1 = time.monotonic()
    n = len(offsets)
    if sorted(offsets) != list(range(batch, batch * (n + 1), batch)):
        raise AssertionError(f"queue {qid}: batch offsets are not dense: {sorted(offsets)[:5]}…")
    pipe.send((t0, t1, n * batch, batch * (n + 1), bodies[-1], len(payload)))


def run_produce(ctx, result):
    b = broker(ctx)
    seconds = 0.8 if ctx.quick else 3.0
    for batch in (32, 256):
        for tr in b.transports:
            topic = f"PerfBatch{batch}_{tr}"
            with RemotingClient(b.addr(tr)) as c:
                create_topic(c, topic, PRODUCERS)
            go = FORK.Event()
            kids, pipes = zip(*(spawn(_batch_producer, (b.addr(tr), topic, q, batch, seconds, go))
                                for q in range(PRODUCERS)))
            got = gather(list(kids), list(pipes), go, "batch producer")
            n = sum(g[2] for g in got)
            rate = n / (max(g[1] for g in got) - min(g[0] for g in got))
            with RemotingClient(b.addr(tr)) as c:
                verify_queues(c, topic, {q: (g[3], g[4]) for q, g in enumerate(got)})
            wire = got[0][5] / batch              # request body bytes per message
            limit = ctx.net_bulk(tr)["bps"] / wire
            peer = ctx.peers.get(f"redis_xadd_everysec_b{batch}")
            yield result(f"broker_produce_100B_b{batch}_{tr}", rate, "msg/s", limit,
                         f"raw bulk socket bandwidth ({tr}) in {wire:.0f}-byte batch entries",
                         messages=n, batch=batch, producers=PRODUCERS, requests_in_flight=WINDOW,
                         target=1_000_000, redis_xadd_same_batch=round(peer) if peer else None,
                         over_redis=round(rate / peer, 3) if peer else None)


# ------------------------------------------------------------------ (c) consume a backlog
def produce_backlog(addr: str, topic: str, per_queue: int, body_bytes: int = 1024) -> dict:
    """Fill QUEUES queues with ``per_queue`` messages each; the last body of each."""
    batch = 256
    with RemotingClient(addr) as c:
        create_topic(c, topic, QUEUES)
        todo = deque((q, off) for off in range(0, per_queue, batch) for q in range(QUEUES))
        pending = {}
        last = {}

        def issue():
            q, off = todo.popleft()
            k = min(batch, per_queue - off)
            bodies = [body_of(q, off + j, body_bytes) for j in range(k)]
            last[q] = bodies[-1]
            pending[c.send(batch_cmd(topic, q, batch_body(bodies)))] = (q, off)

        # one connection: its requests run in order, so each queue's offsets
        # are known in advance (checked on every reply)
        while todo or pending:
            while todo and len(pending) < WINDOW:
                issue()
            r = c.recv(timeout=TIMEOUT_S)
            q, off = pending.pop(r.opaque)
            check(r, what="backlog batch")
            if int(r.ext["queueOffset"]) != off:
                raise AssertionError(f"backlog {q}: queueOffset {r.ext['queueOffset']} != {off}")
        verify_queues(c, topic, {q: (per_queue, last[q]) for q in range(QUEUES)})
    return last


@_child
def _consumer(addr, topic, per_queue, go, pipe):
    with RemotingClient(addr) as c:
        # learn the record size from one pull (same body, topic, properties: all equal)
        r = check(c.invoke(pull_cmd(topic, 0, 0, 1), timeout=TIMEOUT_S), what="first pull")
        rec = records(r.body)[0][3]
        pipe.send("ready")
        go.wait()
        todo = deque((q, off, min(32, per_queue - off))
                     for off in range(0, per_queue, 32) for q in range(QUEUES))
        pending = {}
        nbytes = msgs = replies = 0
        t0, c0 = time.monotonic(), time.process_time()
        while todo or pending:
            while todo and len(pending) < WINDOW:
                q, off, want = todo.popleft()
                pending[c.send(pull_cmd(topic, q, off, want))] = (q, off, want)
            r = c.recv(timeout=TIMEOUT_S)
            q, off, want = pending.pop(r.opaque)
            if r.code != SUCCESS:
                raise RuntimeError(f"pull {q}@{off}: code {r.code} ({r.remark})")
            k = int(r.ext["nextBeginOffset"]) - off
            if not 0 < k <= want or len(r.body) != k * rec:
                raise AssertionError(f"pull {q}@{off}: {k} messages in {len(r.body)} bytes "
                                     f"(asked {want}, record {rec} B)")
            if replies % 64 == 0:                          # sample: first record checked
                qid, qoff, body, _ = records(r.body[:rec])[0]
                if (qid, qoff) != (q, off) or body != body_of(q, off, len(body)):
                    raise AssertionError(f"pull {q}@{off}: got record {qid}@{qoff}")
            if k < want:
                todo.appendleft((q, off + k, want - k))
            nbytes += len(r.body)
            msgs += k
            replies += 1
        t1, c1 = time.monotonic(), time.process_time()
    if msgs != QUEUES * per_queue:
        raise AssertionError(f"consumed {msgs} of {QUEUES * per_queue}")
    pipe.send((t0, t1, nbytes, msgs, replies, rec, c1 - c0))


def run_consume(ctx, result):
    from perf.worker_cpu import ticks, CLK_TCK
    from shmq.broker.procs import broker_processes
    b = broker(ctx)
    total = 64_000 if ctx.quick else 1_000_000
    per_queue = total // QUEUES
    topic = "PerfBacklog"
    t = time.monotonic()
    produce_backlog(b.addr(b.transports[0]), topic, per_queue)     # Unix when there is one
    fill_s = time.monotonic() - t
    # which side a figure is the limit of: the broker's processes' CPU a pull
    # (a broker started here: a named one's processes may not be visible)
    # beside the consumer's own
    proc = getattr(b, "proc", None)
    pids = [pid for _, pid in broker_processes(proc.pid)[0]] if proc is not None else []
    for tr in b.transports:
        go = FORK.Event()
        p, a = spawn(_consumer, (b.addr(tr), topic, per_queue, go))
        cpu = []
        t0, t1, nbytes, msgs, replies, rec, consumer_s = gather(
            [p], [a], go, "consumer", on_go=lambda: cpu.append(ticks(pids)))[0]
        broker_s = (ticks(pids) - cpu[0]) / CLK_TCK
        bps = nbytes / (t1 - t0)
        bulk = ctx.net_bulk(tr)
        yield result(f"broker_consume_1KiB_{tr}", bps, "B/s", bulk["bps"],
                     f"raw bulk socket bandwidth ({tr}, best placement: {bulk['placement']})",
                     limit_cross_core=round(bulk.get("bps_cross_core", 0)),
                     limit_same_core=round(bulk["bps_same_core"]),
                     messages=msgs, msg_per_s=round(msgs / (t1 - t0)),
                     record_bytes=rec, pulls=replies, max_msg_nums=32, pulls_in_flight=WINDOW,
                     queues=QUEUES, target_ratio=0.5, backlog_fill_s=round(fill_s, 2),
                     broker_cpu_us_per_pull=round(broker_s / replies * 1e6, 1) if pids else None,
                     consumer_cpu_us_per_pull=round(consumer_s / replies * 1e6, 1),
                     wall_us_per_pull=round((t1 - t0) / replies * 1e6, 1))


# ------------------------------------------------------------------ (d) produce -> consume latency
_STAMP = struct.Struct(">qq")


@_child
def _latency_consumer(addr, topic, count, go, pipe):
    lat = []
    with RemotingClient(addr) as c:
        pipe.send("ready")
        go.wait()
        off = 0
        while off < count:
            r = c.invoke(pull_cmd(topic, 0, off, 32, suspend_ms=5000), timeout=TIMEOUT_S)
            now = time.monotonic_ns()
            if r.code in (PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY):
                continue
            check(r, what=f"latency pull @{off}")
            for qid, qoff, body, _ in records(r.body):
                seq, stamp = _STAMP.unpack_from(body)
                if (qid, qoff, seq) != (0, off, off):
                    raise AssertionError(f"expected message {off}, got seq {seq} at {qid}@{qoff}")
                lat.append(now - stamp)
                off += 1
            if int(r.ext["nextBeginOffset"]) != off:
                raise AssertionError(f"nextBeginOffset {r.ext['nextBeginOffset']} != {off}")
    pipe.send(lat)


def run_latency(ctx, result):
    b = broker(ctx)
    rate = 2000
    seconds = 1.5 if ctx.quick else 5.0
    count = int(rate * seconds)
    pad = bytes(100 - _STAMP.size)
    for tr in b.transports:
        topic = f"PerfLatency_{tr}"
        with RemotingClient(b.addr(tr)) as c:
            create_topic(c, topic, 1)
            go = FORK.Event()
            p, a = spawn(_latency_consumer, (b.addr(tr), topic, count, go))
            got = a.recv() if a.poll(60) else None
            if got != "ready":
                raise RuntimeError(f"latency consumer did not get ready: {got!r}")
            go.set()
            time.sleep(0.2)                       # let its first pull park
            t0 = time.monotonic()
            late = 0
            for i in range(count):
                due = t0 + i / rate
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                elif wait < -0.01:
                    late += 1
                r = c.invoke(send_cmd(topic, 0, _STAMP.pack(i, time.monotonic_ns()) + pad),
                             timeout=TIMEOUT_S)
                if r.code != SUCCESS or int(r.ext["queueOffset"]) != i:
                    raise AssertionError(f"latency send {i}: {r.code} {r.ext.get('queueOffset')}")
            sent_s = time.monotonic() - t0
        if not a.poll(60):
            raise RuntimeError("latency consumer did not finish")
        lat = a.recv()
        if isinstance(lat, BaseException):
            raise RuntimeError("latency consumer failed") from lat
        _check_exit(p, "latency consumer")
        if len(lat) != count:
            raise AssertionError(f"consumed {len(lat)} of {count}")
        us = np.array(lat) / 1e3
        rt = ctx.net_rtt(tr)
        p50 = float(np.percentile(us, 50))
        yield result(f"broker_latency_{tr}", p50, "us p50", rt["p50_us"],
                     f"raw request/response round trip p50 ({tr}); ratio = times the raw p50",
                     p99_us=round(float(np.percentile(us, 99)), 1), max_us=round(float(us.max()), 1),
                     messages=count, rate_msg_s=round(count / sent_s), target_rate=rate,
                     late_sends=late, suspend_ms=5000)


# ------------------------------------------------------------------ (e) SYNC_FLUSH
def flush_seq(b) -> int | None:
    """How many fdatasyncs the broker's flusher has made (the shared state's
    flush_seq), read from its control block where the broker runs on this
    host; None elsewhere."""
    if getattr(b, "store", None) is None:
        return None
    try:
        cb = ControlBlock.attach(b.store)
    except (NotRunning, OSError):
        return None
    try:
        st = StoreState.over(cb.region(), None)
        n = None if st is None else int(st.get("flush_seq"))
        del st
        return n
    finally:
        cb.close()


def _warm_then_wait(c: RemotingClient, topic: str, qid: int, go, pipe) -> None:
    """A sending client's start: one send (body 0) to warm the path, then
    "ready" to the parent and wait for every client's go."""
    check(c.invoke(send_cmd(topic, qid, body_of(qid, 0)), timeout=TIMEOUT_S), what="warm")
    pipe.send("ready")
    go.wait()


@_child
def _sync_producer(addr, topic, qid, seconds, go, pipe):
    """One SYNC_FLUSH client: a send at a time to its own queue, each
    waiting for its answer, from a lean client (``worker_cpu.Sender``,
    window 1: template frames on a plain socket, each answer checked by its
    JSON head) as the Redis peer's clients are hand-rolled RESP on a plain
    socket, so that the two rows compare the servers, not the clients
    (``RemotingClient.invoke`` costs ~55 µs of CPU a send here: with 16 of
    them the clients took more of the 2 cores than the broker)."""
    from perf.net_limits import connect
    from perf.worker_cpu import Sender, _host_port
    with RemotingClient(addr) as c:
        _warm_then_wait(c, topic, qid, go, pipe)
        unix = addr.startswith("unix:")
        sock = connect("unix" if unix else "tcp", addr[5:] if unix else _host_port(addr))
        try:
            sock.settimeout(TIMEOUT_S)
            s = Sender(sock, topic, 1, qid=qid, first=1)
            s.codes = (SUCCESS, FLUSH_DISK_TIMEOUT)
            t0 = time.monotonic()
            end = t0 + seconds
            while time.monotonic() < end:
                s.step(1)
            t1 = time.monotonic()
        finally:
            sock.close()
    n = s.acked
    pipe.send((t0, t1, n - s.timeouts, s.timeouts, n + 1, body_of(qid, n)))


def run_sync_flush(ctx, result):
    b = broker(ctx, "SYNC_FLUSH")
    seconds = 0.8 if ctx.quick else 3.0
    fsync_rate, fsync_p50 = ctx.fdatasync()
    for tr in b.transports:
        for conns in SYNC_CONNS:
            topic = f"PerfSync{conns}_{tr}"
            with RemotingClient(b.addr(tr)) as c:
                create_topic(c, topic, conns)
            go = FORK.Event()
            kids, pipes = zip(*(spawn(_sync_producer, (b.addr(tr), topic, q, seconds, go))
                                for q in range(conns)))
            seq = []
            got = gather(list(kids), list(pipes), go, "sync producer",
                         on_go=lambda: seq.append(flush_seq(b)))
            f0, f1 = seq[0], flush_seq(b)
            with RemotingClient(b.addr(tr)) as c:
                verify_queues(c, topic, {q: (g[4], g[5]) for q, g in enumerate(got)})
            acked = sum(g[2] for g in got)
            rate = acked / (max(g[1] for g in got) - min(g[0] for g in got))
            peer = ctx.peers.get(f"redis_xadd_always_{conns}conn")
            peer_b32 = ctx.peers.get("redis_xadd_always_b32")
            yield result(f"broker_sync_flush_{conns}conn_{tr}", rate, "msg/s", fsync_rate,
                         "raw fdatasync/s (4 KiB overwrite)", connections=conns,
                         messages=acked, flush_timeouts=sum(g[3] for g in got),
                         msgs_per_fdatasync=(round(acked / max(1, f1 - f0), 2)
                                             if f0 is not None and f1 is not None else None),
                         fdatasync_p50_us=round(fsync_p50, 1),
                         redis_always_same_load=round(peer) if peer else None,
                         over_redis=round(rate / peer, 3) if peer else None,
                         redis_always_pipelined_b32=round(peer_b32) if peer_b32 else None)
        yield _sync_pipelined(ctx, b, tr, seconds, fsync_rate, result)


def _sync_pipelined(ctx, b, tr: str, seconds: float, fsync_rate: float, result):
    """One connection with SYNC_WINDOW sends of 100 B in flight (issue 14's
    "64 pipelined"), written as a pipelining producer writes them (what the
    window frees, in one write): every answer SUCCESS at the next queue
    offset, each sent only once its bytes were flushed; messages per
    fdatasync is what the group commit gathered."""
    from perf.worker_cpu import sending
    with sending(b, tr, f"PerfSyncW{SYNC_WINDOW}_{tr}", SYNC_WINDOW, together=True) as snd:
        snd.step(SYNC_WINDOW)                          # warm the path
        f0, t0, n = flush_seq(b), time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            n += snd.step()
        t1, f1 = time.monotonic(), flush_seq(b)
    return result(f"broker_sync_flush_w{SYNC_WINDOW}_{tr}", n / (t1 - t0), "msg/s", fsync_rate,
                  "raw fdatasync/s (4 KiB overwrite)", requests_in_flight=SYNC_WINDOW,
                  messages=n, msgs_per_fdatasync=(round(n / max(1, f1 - f0), 2)
                                                  if f0 is not None and f1 is not None else None),
                  target=100_000)


# ------------------------------------------------------------------ (f) worker scaling
@_child
def _lean_sender(addr, topic, qid, seconds, go, pipe):
    """One scaling client: SCALE_WINDOW single-message sends in flight on
    its own connection, to its own queue, from a client that costs the
    broker's cores little, so that the bench measures the workers: a
    ``worker_cpu.Sender`` (template frames, answers checked by their JSON
    heads), writing the frames the window frees together, as a pipelining
    client with a write queue does. With ``RemotingClient`` (a command
    built, encoded and written per send, each answer decoded into one) a
    client cost 30 µs of CPU a send against the worker's 24, and on 16
    cores the clients, not the workers, set the rate: 8 workers sent 5.5×
    one; with this client 5.8–7.4 µs, and 6.0–6.2× (the device machine,
    2026-11-27; the README's scaling section)."""
    from perf.worker_cpu import Sender
    with RemotingClient(addr) as c:
        _warm_then_wait(c, topic, qid, go, pipe)     # body 0 at offset 0: the Sender's go from 1
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(addr.removeprefix("unix:"))
        sock.settimeout(TIMEOUT_S)
        s = Sender(sock, topic, SCALE_WINDOW, qid=qid, first=1, together=True)
        t0, c0 = time.monotonic(), time.process_time()
        end = t0 + seconds
        while time.monotonic() < end:
            s.step(SCALE_WINDOW)
        s.drain()
        t1, c1 = time.monotonic(), time.process_time()
        sock.close()
    pipe.send((t0, t1, s.acked, s.acked + 1, body_of(qid, s.acked), c1 - c0))


def run_scaling(ctx, result):
    if getattr(ctx, "named_broker", None) is not None:
        raise Skipped("starts brokers of 1, 2, 4 … workers of its own")
    from perf.worker_cpu import ticks, CLK_TCK
    from shmq.broker.procs import children
    cores = os.cpu_count() or 1
    counts = [w for w in (1, 2, 4, 8, 16) if w <= cores] or [1]
    seconds = 0.8 if ctx.quick else 3.0
    base = None
    for w in counts:
        b = Broker(ctx, "ASYNC_FLUSH", name=f"scale{w}", workerProcessNums=w)
        try:
            workers = [pid for name, pid in children(b.proc.pid).items()
                       if name.startswith("shmq-worker")]
            n = w * SCALE_CLIENTS_PER_WORKER
            topic = f"PerfScale{w}"
            with RemotingClient(b.addr("unix")) as c:
                create_topic(c, topic, n)
            go = FORK.Event()
            kids, pipes = zip(*(spawn(_lean_sender, (b.addr("unix"), topic, q, seconds, go))
                                for q in range(n)))
            cpu = []
            got = gather(list(kids), list(pipes), go, "pipelined sender",
                         on_go=lambda: cpu.append(ticks(workers)))
            used_s = (ticks(workers) - cpu[0]) / CLK_TCK
            with RemotingClient(b.addr("unix")) as c:
                verify_queues(c, topic, {q: (g[3], g[4]) for q, g in enumerate(got)})
        finally:
            b.stop()
        acked = sum(g[2] for g in got)
        rate = acked / (max(g[1] for g in got) - min(g[0] for g in got))
        base = base or rate
        yield result(f"broker_scaling_{w}workers", rate, "msg/s", base * w,
                     "the 1-worker rate × workers (linear scaling)", workers=w, clients=n,
                     window=SCALE_WINDOW, cores=cores, speedup=round(rate / base, 2),
                     worker_cpu_us_per_send=round(used_s / max(1, acked) * 1e6, 1),
                     client_cpu_us_per_send=round(sum(g[5] for g in got) / max(1, acked) * 1e6, 1),
                     target_speedup_8workers=6.0)
