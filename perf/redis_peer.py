"""The peer: Redis Streams XADD of 100-byte entries, pipelined, from several processes.

Starts Debian's ``redis-server`` on 127.0.0.1 with a random port, its
directory in scratch, no RDB snapshots, AOF on: ``appendfsync everysec``
(the peer of an ASYNC_FLUSH broker) and then a fresh server with
``appendfsync always`` (the peer of SYNC_FLUSH: Redis writes and fsyncs the
AOF once per event-loop turn, before it answers, so pipelined clients share
one fsync — its group commit), with the same pipelined load and with the
load of broker_sync_flush (1 and 16 clients, one XADD at a time). The clients are hand-rolled RESP over a plain
socket (no dependency): each process owns one stream, writes pipelines of
``batch`` XADDs, keeps ``WINDOW`` pipelines in flight and counts the replies
(one bulk-string id each, two CRLFs; an error reply fails the run). After
the run every stream's XLEN must equal the acknowledged count and its last
entry must hold the body sent.

No redis-server on PATH: the bench installs it with apt-get only as root and
when asked to (``--install-peers``) or under CI ($CI set); otherwise it
prints a result line with ``"skipped"`` and the reason.

Figures land in ``ctx.peers`` (``redis_xadd_<fsync>_b<batch>``) for the broker
benches to print beside their own. Limits: raw TCP bulk bandwidth in XADD
requests of this size (everysec), raw fdatasync rate (always).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

from perf.net_limits import FORK, _check_exit

PRODUCERS = 4
WINDOW = 2
BATCHES = (32, 256)
BODY_BYTES = 100
SYNC_CONNS = (1, 16)     # as perf.broker's SYNC_FLUSH bench


# ------------------------------------------------------------------ RESP
def resp(*args: bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def call(sock: socket.socket, *args: bytes) -> bytes:
    """One command, its whole raw reply (simple replies only: status, integer,
    bulk, or an array of at most a few small items read until quiet)."""
    sock.sendall(resp(*args))
    buf = b""
    while True:
        buf += sock.recv(1 << 16)
        if buf.startswith(b"-"):
            raise RuntimeError(f"redis: {buf.decode(errors='replace').strip()}")
        if _complete(buf):
            return buf


def _complete(buf: bytes) -> bool:
    try:
        return _parse(buf, 0) == len(buf)
    except IndexError:
        return False


def _parse(buf: bytes, pos: int) -> int:
    """Position after the RESP value at ``pos`` (IndexError: incomplete)."""
    end = buf.index(b"\r\n", pos)
    kind, head = buf[pos:pos + 1], buf[pos + 1:end]
    pos = end + 2
    if kind in (b"+", b"-", b":"):
        return pos
    if kind == b"$":
        n = int(head)
        if n < 0:
            return pos
        if len(buf) < pos + n + 2:
            raise IndexError
        return pos + n + 2
    if kind == b"*":
        for _ in range(max(0, int(head))):
            pos = _parse(buf, pos)
        return pos
    raise ValueError(f"not RESP: {buf[pos - 2:pos + 20]!r}")


def xadd_pipeline(key: bytes, body: bytes, batch: int) -> bytes:
    return resp(b"XADD", key, b"*", b"d", body) * batch


def _producer(port, key, body, batch, window, seconds, go, pipe) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = xadd_pipeline(key, body, batch)
    want = 2 * batch                                  # "$<n>\r\n<id>\r\n" per reply
    pipe.send("ready")
    go.wait()
    sent = done = 0
    t0 = time.monotonic()
    end = t0 + seconds
    for _ in range(window):
        s.sendall(payload)
        sent += 1
    buf = b""
    while done < sent:
        buf += s.recv(1 << 18)
        # count whole pipelines answered; keep the partial rest
        while True:
            n = buf.count(b"\r\n", 0)
            if n < want:
                break
            cut = 0
            for _ in range(want):
                cut = buf.index(b"\r\n", cut) + 2
            reply, buf = buf[:cut], buf[cut:]
            if reply.startswith(b"-") or b"\r\n-" in reply:
                raise RuntimeError(f"redis error: {reply[:200]!r}")
            done += 1
            if time.monotonic() < end:
                s.sendall(payload)
                sent += 1
    t1 = time.monotonic()
    s.close()
    pipe.send((t0, t1, done * batch))


# ------------------------------------------------------------------ server
def find_redis(ctx) -> tuple[str | None, str | None]:
    """(path to redis-server, None) or (None, why it is skipped)."""
    path = shutil.which("redis-server")
    if path:
        return path, None
    may = os.geteuid() == 0 and (ctx.install_peers or os.environ.get("CI"))
    if not may:
        return None, ("redis-server is not installed (apt-get install redis-server, or run "
                      "as root with --install-peers)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "install", "-y", "-q", "redis-server"],
                ["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "redis-server"]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if cmd[1] == "install" and r.returncode == 0:
            break
    path = shutil.which("redis-server")
    return (path, None) if path else (None, f"apt-get install redis-server failed: {r.stderr[-300:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, exe: str, workdir: str, appendfsync: str):
        self.dir = workdir
        self.port = free_port()
        self.log = os.path.join(workdir, "redis.log")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", workdir,
             "--appendonly", "yes", "--appendfsync", appendfsync, "--save", "",
             "--daemonize", "no", "--logfile", self.log],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 15
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited {self.proc.returncode}: "
                                   f"{self.proc.stderr.read().decode()[-500:]} {self._tail()}")
            try:
                with self.connect() as s:
                    if call(s, b"PING") == b"+PONG\r\n":
                        break
            except (ConnectionRefusedError, RuntimeError):   # not listening / still loading
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not answer PING: {self._tail()}")
                time.sleep(0.05)
        with self.connect() as s:
            got = call(s, b"CONFIG", b"GET", b"appendfsync")
            if appendfsync.encode() not in got:
                raise AssertionError(f"redis appendfsync is not {appendfsync}: {got!r}")
            self.version = call(s, b"INFO", b"server").split(b"redis_version:")[1].split(b"\r\n")[0].decode()

    def _tail(self) -> str:
        try:
            with open(self.log) as f:
                return f.read()[-500:]
        except FileNotFoundError:
            return ""

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("redis-server did not stop on SIGTERM")
        self.proc.stderr.close()


def produce(redis: Redis, batch: int, seconds: float, tag: str, producers: int = PRODUCERS,
            window: int = WINDOW) -> dict:
    """``producers`` processes, one stream each, for ``seconds``: msg/s, verified."""
    body = bytes((65 + i % 26) for i in range(BODY_BYTES))
    go = FORK.Event()
    kids, pipes, keys = [], [], []
    for i in range(producers):
        a, b = FORK.Pipe()
        key = f"{tag}-b{batch}-c{producers}-p{i}".encode()
        p = FORK.Process(target=_producer,
                         args=(redis.port, key, body, batch, window, seconds, go, b), daemon=True)
        p.start()
        kids.append(p)
        pipes.append(a)
        keys.append(key)
    for a in pipes:
        assert a.recv() == "ready"
    go.set()
    spans = [a.recv() for a in pipes]
    for p in kids:
        _check_exit(p, "redis producer")
    with redis.connect() as s:                          # verify: every entry is there
        for key, (_, _, n) in zip(keys, spans):
            got = call(s, b"XLEN", key)
            if got != b":%d\r\n" % n:
                raise AssertionError(f"XLEN {key!r} = {got!r}, acknowledged {n}")
            last = call(s, b"XREVRANGE", key, b"+", b"-", b"COUNT", b"1")
            if not last.endswith(b"$1\r\nd\r\n$%d\r\n%s\r\n" % (BODY_BYTES, body)):
                raise AssertionError(f"last entry of {key!r} is not the body sent: {last[:200]!r}")
    n = sum(s[2] for s in spans)
    return {"rate": n / (max(s[1] for s in spans) - min(s[0] for s in spans)), "messages": n,
            "request_bytes": len(resp(b"XADD", keys[0], b"*", b"d", body))}


def run(ctx, result):
    exe, why = find_redis(ctx)
    if exe is None:
        yield {"bench": "redis_peer", "skipped": why}
        return
    seconds = 0.8 if ctx.quick else 3.0
    tcp_bps = ctx.net_bulk("tcp")["bps"]
    fsync_rate, fsync_p50 = ctx.fdatasync()
    for mode in ("everysec", "always"):
        redis = Redis(exe, ctx.sub(f"redis-{mode}"), mode)
        try:
            for batch in BATCHES:
                r = produce(redis, batch, seconds, mode)
                ctx.peers[f"redis_xadd_{mode}_b{batch}"] = r["rate"]
                common = dict(messages=r["messages"], batch=batch, producers=PRODUCERS,
                              pipelines_in_flight=WINDOW, body_bytes=BODY_BYTES,
                              redis_version=redis.version, appendfsync=mode)
                if mode == "everysec":
                    yield result(f"redis_xadd_100B_b{batch}", r["rate"], "msg/s",
                                 tcp_bps / r["request_bytes"],
                                 "raw TCP bulk bandwidth in XADD requests/s", **common)
                else:
                    yield result(f"redis_xadd_100B_b{batch}_always", r["rate"], "msg/s", fsync_rate,
                                 "raw fdatasync/s (4 KiB overwrite)",
                                 fdatasync_p50_us=round(fsync_p50, 1), **common)
            if mode == "always":    # the load of broker_sync_flush: one XADD at a time per client
                for conns in SYNC_CONNS:
                    r = produce(redis, 1, seconds, mode, producers=conns, window=1)
                    ctx.peers[f"redis_xadd_always_{conns}conn"] = r["rate"]
                    yield result(f"redis_xadd_100B_always_{conns}conn", r["rate"], "msg/s",
                                 fsync_rate, "raw fdatasync/s (4 KiB overwrite)",
                                 fdatasync_p50_us=round(fsync_p50, 1), messages=r["messages"],
                                 batch=1, producers=conns, pipelines_in_flight=1,
                                 body_bytes=BODY_BYTES, redis_version=redis.version,
                                 appendfsync=mode)
        finally:
            redis.stop()
