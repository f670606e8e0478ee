"""Worker CPU per request: what one request costs the broker worker that
serves it, read from /proc rather than inferred from a rate.

A rate on a busy or small machine mixes the worker's cost with the client's
and the scheduler's; the worker's own CPU time does not. So: one broker with
one worker (``workerProcessNums=1``: that process is the whole worker cost),
the client in this process, and around N requests the utime + stime of every
worker (/proc/<pid>/stat fields 14 and 15, in clock ticks of 1/SC_CLK_TCK s)
read before and after:

- broker_cpu_send_100B_<tr>: SEND_MESSAGE_V2 (310) of 100 B, one at a time;
- broker_cpu_send_100B_w64_<tr>: the same with 64 requests in flight on the
  one connection;
- broker_cpu_send_100B_w64_keyed_<tr>: the same, each send with a UNIQ_KEY
  of its own as every RocketMQ client sets it, after as many keyed sends as
  the default duplicate window holds (``sendDedupWindowSize``): the
  window's check, in steady state, on every send (its limit is the row
  before's: the same echo);
- broker_cpu_send_100B_parked2000_<tr>: the one-at-a-time sends while
  another connection holds a long poll on each of 2,000 caught-up queues
  (PARKED_QUEUES: push consumers park one pull per queue they hold); each
  send wakes the worker, which checks every parked queue. Every poll must
  still be parked at the end. Beside it the row without them
  (``same_without_parked_us``);
- broker_cpu_pull_32x1KiB_<tr>: PULL_MESSAGE (11) of 32 × 1 KiB messages,
  one at a time, over a backlog of 64 such pulls pulled round and round;
- broker_cpu_pull_32x1KiB_w16_<tr>: the same with 16 pulls in flight on
  the connection (PULL_WINDOW: a push consumer holding 16 queues), which
  share the worker's wake-ups as the pipelined sends do.

``SHMQ_CPU_ROWS=pull`` (or ``send``, ``parked``, comma-separated) runs only those rows.

``<tr>`` is the Unix socket (TCP loopback where there is none). N grows until
the workers used at least MIN_CPU_S of CPU (and at least the row's request
count), so one clock tick (10 ms) is at most 1% of the figure (0.5% full
size); ``tick_share`` says what it was. Every send must be answered SUCCESS
at the next queue offset (the queue's maxOffset and last body are checked at
the end), every pull must return 32 records in 32 × record bytes (each
offset's first reply decoded and compared with what was sent, every later one
compared with it: ``Puller``). The sends and pulls run on a plain socket
with the same client loop as the limit's, not through ``RemotingClient``,
whose Python between two requests raised the worker's own CPU by a third
to a half on 2 cores (``Puller``, ``Sender``).

The limit, measured in the same run and the same way (its process's CPU over
N requests): a raw Python server doing one recv + one send per request
(perf.net_limits' echo process, 200-byte frames), one in flight for the
single sends, 64 in flight for the pipelined ones (the echo then reads
several frames per recv, as the worker may), and for the pulls the same
server answering each 200-byte request with a frame the size of the pull's
reply, as many in flight as the row's pulls. ratio = value / limit: times
the raw server's CPU, lower is better.
The CPU the other broker processes (boss, flusher, services) used meanwhile
is reported beside it (``others_us``), not counted.

With ``--broker HOST:PORT`` the named broker is measured when it runs on
this host (its Unix socket is here): its boss is the process that listens
on that socket (SO_PEERCRED), its workers that boss's shmq-worker-N
children, all of them summed. Elsewhere its workers cannot be read and the
bench is skipped with the reason. Other load on a named broker counts too.
"""
from __future__ import annotations

import contextlib
import os
import socket
import struct
import time

import orjson

from perf import Skipped
from perf.broker import (PROPS, PULL_NOT_FOUND, SUCCESS, TIMEOUT_S, batch_body, batch_cmd, body_of,
                         broker, check, create_topic, pull_cmd, records, send_cmd, verify_queues)
from perf.net_limits import FORK, FRAME_BYTES, _check_exit, _echo, connect, listener, recv_exactly
from shmq.client.remoting import RemotingClient
from shmq.ipc.remoting import FrameDecoder, encode
from shmq.broker.config import BrokerConfig
from shmq.broker.procs import broker_processes

CLK_TCK = os.sysconf("SC_CLK_TCK")
WINDOW = 64
PULL_MSGS, PULL_BODY = 32, 1024
BACKLOG_PULLS = 64                          # 2,048 messages of 1 KiB pulled in turn
# pulls in flight on the connection for the pipelined pull row: a push
# consumer keeps one in flight per queue it holds, and a client's consumers
# share its connection to a broker, so 16 is one consumer of 16 queues, or
# four of four; their replies (16 × 37 KB) about fill the socket's buffers
PULL_WINDOW = 16
CHUNK = 500                                 # requests between two looks at the clock
# queues a consumer connection holds a long poll on, caught up, for the
# parked row (push consumers park one pull per queue they hold: a busy
# broker's workers hold thousands); each poll outlives the row
PARKED_QUEUES = 2000
PARKED_HOLD_MS = 120_000
PARKED_SENTINEL = 2_000_000_000             # the opaque of the pull behind them
DEDUP_WINDOW = BrokerConfig.sendDedupWindowSize     # keyed sends the default window holds


# ------------------------------------------------------------------ CPU time from /proc
def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (/proc/<pid>/stat fields 14, 15)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError as e:
        raise RuntimeError(f"process {pid} is gone mid-measurement: {e}") from e
    fields = stat[stat.rindex(")") + 2:].split()        # fields[0] is field 3 (state)
    return int(fields[11]) + int(fields[12])


def ticks(pids) -> int:
    return sum(cpu_ticks(p) for p in pids)


def measure(pids, step, min_n: int, min_cpu_s: float, max_wall_s: float, others=()) -> dict:
    """Call ``step()`` (it makes some requests and returns how many) until at
    least ``min_n`` requests were made and ``pids`` used at least
    ``min_cpu_s`` of CPU (or ``max_wall_s`` passed): µs of their CPU per request."""
    o0, t0, w0 = ticks(others), ticks(pids), time.monotonic()
    n = 0
    while True:
        n += step()
        used = ticks(pids) - t0
        wall = time.monotonic() - w0
        if (n >= min_n and used >= min_cpu_s * CLK_TCK) or wall > max_wall_s:
            break
    if used <= 0:
        raise RuntimeError(f"{n} requests in {wall:.1f} s used no measurable CPU of pids {list(pids)}")
    other = ticks(others) - o0
    return {"us": used / CLK_TCK / n * 1e6, "n": n, "cpu_s": used / CLK_TCK, "wall_s": wall,
            "tick_share": 1 / used, "others_us": other / CLK_TCK / n * 1e6}


# ------------------------------------------------------------------ the broker's workers
def peer_pid(unix_path: str) -> int:
    """The pid of the process that listens on a Unix socket (SO_PEERCRED; 0 when not visible)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(unix_path)
        pid, _uid, _gid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                           struct.calcsize("3i")))
    return pid


def workers_of(ctx) -> tuple[object, int, list[int], list[int]]:
    """(broker, boss pid, worker pids, the other broker processes' pids)."""
    named = getattr(ctx, "named_broker", None)
    if named is not None:
        if named.unix is None:
            raise Skipped(f"the named broker {named.tcp} is not on this host (its Unix socket is not "
                          f"here): its workers' CPU time cannot be read from /proc")
        b = broker(ctx)
        boss = peer_pid(named.unix)
        if boss <= 0 or not os.path.exists(f"/proc/{boss}/stat"):
            raise Skipped(f"the process listening on {named.unix} (the named broker's boss) is not "
                          f"visible here (pid {boss}): another PID namespace?")
    else:
        b = broker(ctx, name="cpu", workerProcessNums=1)
        boss = b.proc.pid
    roles, _ = broker_processes(boss)
    workers = [pid for role, pid in roles if role.startswith("worker")]
    if not workers:
        raise RuntimeError(f"no shmq-worker-N process under the broker's boss (pid {boss}): {roles}")
    return b, boss, workers, [pid for role, pid in roles if not role.startswith("worker")]


# ------------------------------------------------------------------ the limit: a raw server's CPU
def raw_server_cpu(transport: str, scratch: str, window: int, min_n: int, min_cpu_s: float,
                   max_wall_s: float, reply_bytes: int | None = None) -> dict:
    """CPU per request of net_limits' echo process (one recv + one send per
    request), ``window`` 200-byte requests in flight; with ``reply_bytes`` it
    answers each with a frame of that size instead of the request."""
    lsock, addr = listener(transport, scratch)
    p = FORK.Process(target=_echo, args=(lsock, reply_bytes), daemon=True)
    p.start()
    lsock.close()
    frame = struct.pack(">i", FRAME_BYTES - 4) + os.urandom(FRAME_BYTES - 4)
    want = reply_bytes or FRAME_BYTES
    mv = memoryview(bytearray(want))
    s = connect(transport, addr)
    try:
        def step(k=CHUNK):
            for _ in range(k):
                recv_exactly(s, mv)
                s.sendall(frame)
            return k

        for _ in range(window):
            s.sendall(frame)
        step(2000)                                                  # warm both sides
        got = measure([p.pid], step, min_n, min_cpu_s, max_wall_s)
        for _ in range(window):
            recv_exactly(s, mv)
        if reply_bytes is None and bytes(mv) != frame:
            raise AssertionError("echo returned different bytes")
        if reply_bytes is not None and struct.unpack_from(">i", mv)[0] != reply_bytes - 4:
            raise AssertionError("the raw server's reply has the wrong length")
    finally:
        s.close()
    _check_exit(p, "raw server")
    return got


# ------------------------------------------------------------------ the requests
def recv_frame(sock: socket.socket) -> bytes:
    """One whole remoting frame (its length field included) off ``sock``."""
    head = bytearray(4)
    recv_exactly(sock, memoryview(head))
    rest = bytearray(struct.unpack(">i", head)[0])
    recv_exactly(sock, memoryview(rest))
    return bytes(head + rest)


class Sender:
    """100 B sends to queue ``qid`` of ``topic``, ``window`` in flight, on a
    plain socket with the limit's client loop, as ``Puller``'s (the reason is
    there: ``RemotingClient``'s Python between two requests, on the
    worker's two cores and caches, cost the worker itself CPU the echo
    limit is not charged). Send i (from 0) is a template's bytes
    (``send_cmd``'s, its opaque 10 digits wide, its UNIQ_KEY, when
    ``keyed``, 24 hex digits) with its opaque, key and body
    ``body_of(qid, first + i)`` put in: a microsecond, where a command
    built and encoded cost ten. Each is written as the window frees room
    for it, one write a frame as the echo limit's client does
    (``together``: the frames the window frees written in one, as a
    pipelining client with a write queue does); the answers are read as
    they come, many to a ``recv_into``, and each checked by its header's
    JSON: SUCCESS, for its own request (opaque), at the next queue offset
    (``first + i``: one connection, in order)."""

    OPAQUE0 = 1_000_000_000

    def __init__(self, sock: socket.socket, topic: str, window: int, keyed: bool = False,
                 qid: int = 0, first: int = 0, together: bool = False):
        self.sock, self.window, self.qid, self.first, self.together = sock, window, qid, first, together
        self.issued = self.acked = 0
        # the answers taken: SUCCESS (and, for a SYNC_FLUSH bench that counts
        # them, FLUSH_DISK_TIMEOUT: stored, not flushed in time)
        self.codes = (SUCCESS,)
        self.timeouts = 0
        key0 = b"%08X%024X" % (os.getpid(), 0)
        props = PROPS if not keyed else f"{PROPS}\x02UNIQ_KEY\x01{key0.decode()}"
        cmd = send_cmd(topic, qid, body_of(qid, first), props)
        cmd.opaque = self.OPAQUE0
        frame = encode(cmd)
        at = frame.index(b'"opaque":%d' % self.OPAQUE0) + 9
        end = len(frame) - len(body_of(qid, first))            # every body is 100 B
        if keyed:
            k = frame.index(key0) + 8
            self.head, self.mid, self.tail = frame[:at], frame[at + 10:k], frame[k + 24:end]
        else:
            self.head, self.mid, self.tail = frame[:at], frame[at + 10:end], None
        self.buf = bytearray(1 << 20)
        self.view = memoryview(self.buf)
        self.have = 0

    def frame(self, i: int) -> bytes:
        body = body_of(self.qid, self.first + i)
        opaque = b"%010d" % (self.OPAQUE0 + i)
        if self.tail is None:
            return b"".join((self.head, opaque, self.mid, body))
        return b"".join((self.head, opaque, self.mid, b"%024X" % i, self.tail, body))

    def _fill(self) -> None:
        room = self.window - (self.issued - self.acked)
        if room <= 0:
            return
        frames = [self.frame(i) for i in range(self.issued, self.issued + room)]
        if self.together:
            self.sock.sendall(b"".join(frames))
        else:
            for f in frames:
                self.sock.sendall(f)
        self.issued += room

    def _read(self) -> None:
        """What the socket has (at least one byte): every whole answer in it checked."""
        buf, view = self.buf, self.view
        n = self.sock.recv_into(view[self.have:])
        if not n:
            raise ConnectionError("the broker closed the connection")
        have = self.have + n
        at = 0
        while have - at >= 8:
            size = int.from_bytes(buf[at:at + 4], "big") + 4
            if have - at < size:
                break
            hlen = int.from_bytes(buf[at + 5:at + 8], "big")
            r = orjson.loads(view[at + 8:at + 8 + hlen])
            i = self.acked
            ext = r.get("extFields") or {}
            code = r.get("code")
            if (code not in self.codes or r.get("opaque") != self.OPAQUE0 + i
                    or ext.get("queueOffset") != str(self.first + i)):
                raise AssertionError(f"send {i}: opaque {r.get('opaque')}, code {code} "
                                     f"({r.get('remark')}), queueOffset {ext.get('queueOffset')}")
            if code != SUCCESS:
                self.timeouts += 1
            self.acked += 1
            at += size
        buf[:have - at] = buf[at:have]
        self.have = have - at

    def step(self, k: int = CHUNK) -> int:
        """At least ``k`` answers, keeping ``window`` requests in flight (they
        stay in flight); how many."""
        first, want = self.acked, self.acked + k
        while self.acked < want:
            self._fill()
            self._read()
        return self.acked - first

    def drain(self) -> None:
        while self.acked < self.issued:
            self._read()


@contextlib.contextmanager
def sending(b, tr: str, topic: str, window: int, keyed: bool = False, together: bool = False):
    """A ``Sender`` to queue 0 of ``topic``, made with one queue on broker
    ``b``, over a plain ``tr`` socket; when the block ends, what it sent is
    drained and the queue verified (its last offset and body)."""
    with RemotingClient(b.addr(tr)) as c:
        create_topic(c, topic, 1)
        sock = connect(tr, b.unix if tr == "unix" else _host_port(b.tcp))
        try:
            sock.settimeout(TIMEOUT_S)
            s = Sender(sock, topic, window, keyed, together=together)
            yield s
            s.drain()
        finally:
            sock.close()
        verify_queues(c, topic, {0: (s.issued, body_of(0, s.issued - 1))})


class _Parked:
    def __init__(self, sock: socket.socket):
        self.sock = sock

    def still_parked(self) -> None:
        """Every pull is still parked: none was answered (a parked pull is
        answered only when its queue gets a message or its long poll ends)."""
        self.sock.setblocking(False)
        try:
            data = self.sock.recv(1 << 16)
        except BlockingIOError:
            return
        finally:
            self.sock.setblocking(True)
        raise AssertionError(f"a parked pull was answered ({len(data)} bytes): the row measured "
                             f"fewer parked pulls than it says")


@contextlib.contextmanager
def parked_pulls(b, tr: str, queues: int):
    """``queues`` queues (8 to a topic, one message each) with a long poll
    parked on each, from one connection held open (a consumer caught up
    on every queue it holds: a worker's idle state); closed after."""
    topics = -(-queues // 8)
    with RemotingClient(b.addr(tr)) as c:
        for t in range(topics):
            create_topic(c, f"PerfCpuIdle{t}_{tr}", 8)
        for t in range(topics):
            for q in range(8):
                c.send(send_cmd(f"PerfCpuIdle{t}_{tr}", q, body_of(q, 0)))
        for _ in range(topics * 8):
            r = c.recv(timeout=TIMEOUT_S)
            if r.code != SUCCESS or r.ext.get("queueOffset") != "0":
                raise AssertionError(f"an idle queue's first send: {r.code} {r.remark} "
                                     f"{r.ext.get('queueOffset')}")
    sock = connect(tr, b.unix if tr == "unix" else _host_port(b.tcp))
    try:
        sock.settimeout(TIMEOUT_S)
        frames = [encode(pull_cmd(f"PerfCpuIdle{k // 8}_{tr}", k % 8, 1, PULL_MSGS,
                                  suspend_ms=PARKED_HOLD_MS)) for k in range(queues)]
        # behind them one that does not wait: its answer (nothing new, at
        # once) says the worker has read, and parked, every pull before it
        last = pull_cmd(f"PerfCpuIdle0_{tr}", 0, 1, PULL_MSGS)
        last.opaque = PARKED_SENTINEL
        sock.sendall(b"".join(bytes(f) for f in frames) + bytes(encode(last)))
        d = FrameDecoder()
        d.receive_data(recv_frame(sock))
        r = d.next_command()
        if r is None or r.opaque != PARKED_SENTINEL or r.code != PULL_NOT_FOUND:
            raise AssertionError(f"behind the parked pulls, a pull that does not wait was answered "
                                 f"{None if r is None else (r.opaque, r.code, r.remark)}")
        idle = _Parked(sock)
        idle.still_parked()
        yield idle
    finally:
        sock.close()


def fill_backlog(c: RemotingClient, topic: str) -> int:
    """BACKLOG_PULLS × PULL_MSGS messages of 1 KiB in queue 0; the record size."""
    total = BACKLOG_PULLS * PULL_MSGS
    for off in range(0, total, 256):
        bodies = [body_of(0, off + j, PULL_BODY) for j in range(min(256, total - off))]
        r = check(c.invoke(batch_cmd(topic, 0, batch_body(bodies)), timeout=TIMEOUT_S), what="backlog")
        if int(r.ext["queueOffset"]) != off:
            raise AssertionError(f"backlog: queueOffset {r.ext['queueOffset']} != {off}")
    verify_queues(c, topic, {0: (total, body_of(0, total - 1, PULL_BODY))})
    r = check(c.invoke(pull_cmd(topic, 0, 0, 1), timeout=TIMEOUT_S), what="first pull")
    return records(r.body)[0][3]


class Puller:
    """Pulls of PULL_MSGS from queue 0 round the backlog, ``window`` in
    flight (1: one at a time), on a plain socket with the limit's client
    loop (send a frame as the window frees room, read each reply whole
    into one buffer): the reply at each offset is decoded and checked the
    first time (SUCCESS, nextBeginOffset, 32 records of ``rec`` bytes, the
    records sent there), and every later one must be the same bytes in its
    head (code, opaque, offsets, lengths: so in the order asked, as one
    connection's pulls that find records are answered) and, one in 64,
    whole. ``RemotingClient.invoke`` runs much more Python between two
    pulls (encoding the request's JSON header, a poll, the frame decoder
    copying the 37 KiB reply into a command, the opaque matcher), and on
    two cores that much Python beside the worker cost the worker
    itself 60-73 µs of CPU per pull against 41-43 with this loop (same
    broker, same run; its caches and its core are shared): a figure of
    the client, not of the worker, which the limit's raw server is not
    charged either."""

    def __init__(self, sock: socket.socket, topic: str, rec: int, window: int = 1):
        self.sock, self.topic, self.rec, self.window = sock, topic, rec, window
        self.frames = [encode(pull_cmd(topic, 0, i * PULL_MSGS, PULL_MSGS))
                       for i in range(BACKLOG_PULLS)]
        self.replies: list[bytes] = []
        for i, frame in enumerate(self.frames):
            sock.sendall(frame)
            self.replies.append(self._checked(i * PULL_MSGS, recv_frame(sock)))
        # heads differ in length with the offsets' digits: each offset reads its own size
        buf = memoryview(bytearray(max(map(len, self.replies))))
        self.views = [buf[:len(r)] for r in self.replies]
        self.heads = [r[:len(r) - PULL_MSGS * rec] for r in self.replies]
        self.reply_bytes = len(self.replies[-1])
        self.n = self.issued = 0

    def _checked(self, off: int, reply: bytes) -> bytes:
        d = FrameDecoder()
        d.receive_data(reply)
        r = d.next_command()
        if r is None or r.code != SUCCESS:
            raise RuntimeError(f"pull @{off}: {'no whole reply' if r is None else r.code} "
                               f"({'' if r is None else r.remark})")
        got = int(r.ext["nextBeginOffset"]) - off
        if got != PULL_MSGS or len(r.body) != PULL_MSGS * self.rec:
            raise AssertionError(f"pull @{off}: {got} messages in {len(r.body)} bytes, "
                                 f"asked {PULL_MSGS} of {self.rec} B")
        recs = records(r.body)
        if ([(q, o) for q, o, _, _ in recs] != [(0, off + j) for j in range(PULL_MSGS)]
                or recs[-1][2] != body_of(0, off + PULL_MSGS - 1, PULL_BODY)):
            raise AssertionError(f"pull @{off}: not the records sent there")
        return reply

    def step(self, k: int = CHUNK) -> int:
        """``k`` replies read, ``window`` pulls kept in flight (they stay in flight)."""
        sock, frames, window = self.sock, self.frames, self.window
        for _ in range(k):
            while self.issued - self.n < window:
                sock.sendall(frames[self.issued % BACKLOG_PULLS])
                self.issued += 1
            self._reply()
        return k

    def drain(self) -> None:
        while self.n < self.issued:
            self._reply()

    def _reply(self) -> None:
        i = self.n % BACKLOG_PULLS
        mv, head = self.views[i], self.heads[i]
        recv_exactly(self.sock, mv)
        if mv[:len(head)] != head or (self.n % 64 == 0 and mv != self.replies[i]):
            self._checked(i * PULL_MSGS, bytes(mv))              # says what differs
            raise AssertionError(f"pull @{i * PULL_MSGS}: a reply unlike the first there")
        self.n += 1


def _host_port(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


# ------------------------------------------------------------------ bench
def run(ctx, result):
    b, boss, workers, others = workers_of(ctx)
    tr = b.transports[0]                                        # Unix when there is one
    quick = ctx.quick
    min_cpu_s = 1.0 if quick else 2.0
    max_wall_s = 60.0 if quick else 180.0
    min_sends, min_pulls = (2_000, 500) if quick else (20_000, 5_000)
    where = (f"{len(workers)} worker{'s' if len(workers) > 1 else ''} of "
             + (f"the named broker {b.tcp}" if ctx.named_broker is not None else "a broker started here"))

    def row(name, got, raw, limit_name, **extra):
        return result(name, got["us"], "us CPU/req", raw["us"],
                      f"{limit_name}; ratio = times its CPU per request, lower is better",
                      requests=got["n"], worker_cpu_s=round(got["cpu_s"], 3),
                      wall_s=round(got["wall_s"], 2), tick_share=round(got["tick_share"], 5),
                      others_us=round(got["others_us"], 2), workers=len(workers), boss_pid=boss,
                      measured=where, raw_requests=raw["n"], raw_tick_share=round(raw["tick_share"], 5),
                      clk_tck=CLK_TCK, **extra)

    rows = os.environ.get("SHMQ_CPU_ROWS", "send,parked,pull").split(",")
    alone_us = None
    for window, keyed in ((1, False), (WINDOW, False), (WINDOW, True)) if "send" in rows else ():
        topic = f"PerfCpuSend{window}{'k' if keyed else ''}_{tr}"
        with sending(b, tr, topic, window, keyed) as s:
            s.step(2000 if not quick else 500)                  # warm the path
            while keyed and s.acked < DEDUP_WINDOW:            # fill the window
                s.step(CHUNK * 8)
            got = measure(workers, s.step, min_sends, min_cpu_s, max_wall_s, others)
        if not keyed:
            raw = raw_server_cpu(tr, ctx.scratch, window, min_sends, min_cpu_s, max_wall_s)
        if window == 1:
            alone_us, alone_raw = got["us"], raw
        yield row(f"broker_cpu_send_100B{'' if window == 1 else f'_w{window}'}"
                  f"{'_keyed' if keyed else ''}_{tr}", got, raw,
                  f"raw Python echo process, one recv + one send per request ({tr}, {FRAME_BYTES} B, "
                  f"{window} in flight)", requests_in_flight=window, body_bytes=100, target_us=20,
                  **({"uniq_keys": True, "keyed_sends_before": s.acked - got["n"]} if keyed else {}))

    if "parked" in rows:
        topic = f"PerfCpuParked_{tr}"
        with parked_pulls(b, tr, PARKED_QUEUES) as idle, sending(b, tr, topic, 1) as s:
            s.step(500)
            got = measure(workers, s.step, min_sends, min_cpu_s, max_wall_s, others)
            idle.still_parked()
        raw = alone_raw if alone_us is not None else raw_server_cpu(
            tr, ctx.scratch, 1, min_sends, min_cpu_s, max_wall_s)
        yield row(f"broker_cpu_send_100B_parked{PARKED_QUEUES}_{tr}", got, raw,
                  f"raw Python echo process, one recv + one send per request ({tr}, "
                  f"{FRAME_BYTES} B, 1 in flight)", requests_in_flight=1, body_bytes=100,
                  parked_pulls=PARKED_QUEUES, same_without_parked_us=alone_us)

    if "pull" not in rows:
        return
    topic = f"PerfCpuPull_{tr}"
    with RemotingClient(b.addr(tr)) as c:
        create_topic(c, topic, 1)
        rec = fill_backlog(c, topic)
    for window in (1, PULL_WINDOW):
        sock = connect(tr, b.unix if tr == "unix" else _host_port(b.tcp))
        try:
            sock.settimeout(TIMEOUT_S)
            p = Puller(sock, topic, rec, window)
            p.step(200)                                             # warm
            got = measure(workers, p.step, min_pulls, min_cpu_s, max_wall_s, others)
            p.drain()
        finally:
            sock.close()
        raw = raw_server_cpu(tr, ctx.scratch, window, min_pulls, min_cpu_s, max_wall_s,
                             reply_bytes=p.reply_bytes)
        yield row(f"broker_cpu_pull_{PULL_MSGS}x1KiB{'' if window == 1 else f'_w{window}'}_{tr}",
                  got, raw, f"raw Python server, one recv + one send per request ({tr}, "
                  f"{FRAME_BYTES} B request, {p.reply_bytes} B reply as the pull's, "
                  f"{window} in flight)", requests_in_flight=window, max_msg_nums=PULL_MSGS,
                  record_bytes=rec, reply_bytes=p.reply_bytes, target_us=30)
