"""Raw socket limits, over a Unix socket and TCP loopback: what any broker
written in Python could reach at best, with no protocol and no store.

- round trip: an echo *process* reads length-prefixed frames of 200 bytes
  (``int32 length | payload``, big-endian) and answers each with the same
  frame; the client (the harness process) keeps one request in flight on a
  blocking socket and times each one. Rate, p50 and p99. This bounds a
  one-at-a-time sync send.
- bulk: a sender process writes 1 MiB buffers with ``sendall``; a drain
  process receives them into a 1 MiB buffer and throws them away. Bytes/s,
  timed from the sender's first write to the drain's last byte (both read
  CLOCK_MONOTONIC, which every process shares). This bounds a pull of a
  backlog.

Both depend on where the scheduler puts the two processes: a Unix-socket
stream runs ≈ 2.4x faster with both on one core (the receiver copies bytes
still in that core's cache) than across two. Each limit is therefore measured
with the processes pinned both ways, and the better one is the limit (a
broker's figure is held to the best the machine did, not to a lucky or
unlucky placement); both are reported.

``Drain`` is also the receiver of perf/pull_transfer: it drains exactly the
bytes it is told to expect and hands back the first and last frame, so that
the caller can check what arrived rather than trust a count.
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import shutil
import socket
import struct
import tempfile
import time

import numpy as np

FORK = multiprocessing.get_context("fork")
TRANSPORTS = ("unix", "tcp")
RECV_BYTES = 1 << 20
FRAME_BYTES = 200
_LEN = struct.Struct(">i")
_seq = itertools.count()


# ------------------------------------------------------------------ placement
def placements() -> dict[str, tuple[int, int]]:
    """Pinnings to measure: (cpu of the first process, cpu of the second)."""
    cpus = sorted(os.sched_getaffinity(0))
    out = {"same_core": (cpus[0], cpus[0])}
    if len(cpus) > 1:
        out["cross_core"] = (cpus[0], cpus[1])
    return out


def pin(pid: int, cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(pid, {cpu})


class pinned_self:
    """Pin the calling process to ``cpu`` for a while, then restore its mask."""

    def __init__(self, cpu: int | None):
        self.cpu = cpu

    def __enter__(self):
        self.saved = os.sched_getaffinity(0)
        pin(0, self.cpu)

    def __exit__(self, *exc):
        os.sched_setaffinity(0, self.saved)


# ------------------------------------------------------------------ sockets
_MADE_DIRS: dict[str, str] = {}     # a Unix socket's path → the directory made for it


def listener(transport: str, scratch: str) -> tuple[socket.socket, object]:
    """A listening socket and the address to connect to; ``forget`` the
    address when done (a Unix socket leaves its file, and a path too long
    for ``scratch`` a /tmp/shmq-perf-* directory)."""
    if transport == "unix":
        path = os.path.join(scratch, f"n{os.getpid()}-{next(_seq)}.sock")
        if len(path) > 100:   # sun_path holds 108 bytes
            made = tempfile.mkdtemp(prefix="shmq-perf-")
            path = os.path.join(made, "s.sock")
            _MADE_DIRS[path] = made
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
        s.listen(8)
        return s, path
    if transport == "tcp":
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        return s, s.getsockname()
    raise ValueError(f"unknown transport {transport!r}")


def forget(transport: str, addr) -> None:
    """Remove what ``listener`` left on disk for ``addr``."""
    if transport != "unix":
        return
    try:
        os.unlink(addr)
    except FileNotFoundError:
        pass
    made = _MADE_DIRS.pop(addr, None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)


def connect(transport: str, addr) -> socket.socket:
    if transport == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(addr)
    else:
        s = socket.create_connection(addr)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def accept(lsock: socket.socket) -> socket.socket:
    conn, _ = lsock.accept()
    lsock.close()
    if conn.family == socket.AF_INET:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def recv_exactly(sock: socket.socket, mv: memoryview) -> None:
    got = 0
    while got < len(mv):
        n = sock.recv_into(mv[got:])
        if not n:
            raise ConnectionError("peer closed the connection mid-frame")
        got += n


def sockbufs(sock: socket.socket) -> dict:
    return {"sndbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
            "rcvbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)}


def _check_exit(p, what: str, timeout: float = 10.0) -> None:
    p.join(timeout)
    if p.exitcode is None:
        p.kill()
        p.join()
        raise RuntimeError(f"{what} process did not exit")
    if p.exitcode != 0:
        raise RuntimeError(f"{what} process failed with exit code {p.exitcode}")


# ------------------------------------------------------------------ round trip
def _echo(lsock: socket.socket, reply_bytes: int | None = None) -> None:
    """Answer each frame with the same frame (with ``reply_bytes``: with one
    frame of that size, as a pull's reply; perf.worker_cpu)."""
    reply = None if reply_bytes is None else _LEN.pack(reply_bytes - 4) + bytes(reply_bytes - 4)
    conn = accept(lsock)
    buf = bytearray(1 << 16)
    mv = memoryview(buf)
    have = 0
    while n := conn.recv_into(mv[have:]):
        have += n
        pos = 0
        while have - pos >= 4:
            (length,) = _LEN.unpack_from(buf, pos)
            if not 0 <= length <= len(buf) - 4:
                raise ValueError(f"bad frame length {length}")
            if have - pos < 4 + length:
                break
            conn.sendall(mv[pos:pos + 4 + length] if reply is None else reply)
            pos += 4 + length
        if pos:
            buf[:have - pos] = buf[pos:have]
            have -= pos
    conn.close()


def round_trip(transport: str, scratch: str, seconds: float, frame_bytes: int = FRAME_BYTES,
               cpus: tuple[int, int] | None = None) -> dict:
    """One request in flight to an echo process: {rate, p50_us, p99_us, n}.
    ``cpus``: (this process's cpu, the echo's cpu) while measuring."""
    lsock, addr = listener(transport, scratch)
    try:
        p = FORK.Process(target=_echo, args=(lsock,), daemon=True)
        p.start()
        lsock.close()
        if cpus:
            pin(p.pid, cpus[1])
        with pinned_self(cpus[0] if cpus else None):
            return _round_trip(p, transport, addr, seconds, frame_bytes)
    finally:
        forget(transport, addr)


def _round_trip(p, transport, addr, seconds, frame_bytes) -> dict:
    s = connect(transport, addr)
    frame = _LEN.pack(frame_bytes - 4) + os.urandom(frame_bytes - 4)
    buf = bytearray(frame_bytes)
    mv = memoryview(buf)
    pc = time.perf_counter
    try:
        for _ in range(2000):                       # warm both processes
            s.sendall(frame)
            recv_exactly(s, mv)
        lat = []
        t0 = pc()
        end = t0 + seconds
        t = t0
        while t < end:
            s.sendall(frame)
            recv_exactly(s, mv)
            t2 = pc()
            lat.append(t2 - t)
            t = t2
        elapsed = t - t0
        if bytes(buf) != frame:
            raise AssertionError("echo returned different bytes")
    finally:
        s.close()
    _check_exit(p, "echo")
    a = np.array(lat) * 1e6
    return {"rate": len(lat) / elapsed, "p50_us": float(np.percentile(a, 50)),
            "p99_us": float(np.percentile(a, 99)), "n": len(lat), "frame_bytes": frame_bytes}


# ------------------------------------------------------------------ drain
def _drain(lsock: socket.socket, pipe) -> None:
    conn = accept(lsock)
    pipe.send(sockbufs(conn))
    scratch = memoryview(bytearray(RECV_BYTES))
    while (cmd := pipe.recv()) is not None:
        total, keep = cmd
        assert total >= 2 * keep > 0, (total, keep)
        first, last = bytearray(keep), bytearray(keep)
        fmv, lmv = memoryview(first), memoryview(last)
        tail_at = total - keep
        got = 0
        while got < total:
            if got < keep:
                target = fmv[got:]
            elif got >= tail_at:
                target = lmv[got - tail_at:]
            else:
                target = scratch[:min(RECV_BYTES, tail_at - got)]
            n = conn.recv_into(target)
            if not n:
                raise ConnectionError(f"sender closed after {got} of {total} bytes")
            got += n
        pipe.send((time.monotonic(), bytes(first), bytes(last)))
    conn.close()


class Drain:
    """A receiver process that drains exactly the bytes it is told to expect.

    ``expect(total, keep)`` arms it; ``result()`` returns (monotonic time of
    the last byte, first ``keep`` bytes, last ``keep`` bytes)."""

    def __init__(self, transport: str, scratch: str):
        self.transport = transport
        lsock, self.addr = listener(transport, scratch)
        try:
            self.pipe, child = FORK.Pipe()
            self.proc = FORK.Process(target=_drain, args=(lsock, child), daemon=True)
            self.proc.start()
        except BaseException:
            forget(transport, self.addr)
            raise
        finally:
            lsock.close()

        self._bufs = None

    def bufs(self) -> dict:
        """Socket buffer sizes of the accepted connection (waits for the sender)."""
        if self._bufs is None:
            if not self.pipe.poll(30):
                raise TimeoutError("no sender connected to the drain")
            self._bufs = self.pipe.recv()
        return self._bufs

    def expect(self, total: int, keep: int) -> None:
        self.bufs()
        self.pipe.send((total, keep))

    def result(self, timeout: float = 120.0) -> tuple[float, bytes, bytes]:
        if not self.pipe.poll(timeout):
            raise TimeoutError("the drain did not receive everything in time")
        return self.pipe.recv()

    def close(self) -> None:
        try:
            self.pipe.send(None)
            _check_exit(self.proc, "drain")
        finally:
            forget(self.transport, self.addr)


# ------------------------------------------------------------------ bulk
def _bulk_sender(transport, addr, chunk_bytes, pipe) -> None:
    s = connect(transport, addr)
    chunk = np.random.default_rng(7).integers(0, 256, chunk_bytes, dtype=np.uint8).tobytes()
    while (count := pipe.recv()) is not None:
        t0 = time.monotonic()
        for _ in range(count):
            s.sendall(chunk)
        pipe.send(t0)
    s.close()


def bulk(transport: str, scratch: str, nbytes: int, rounds: int = 3,
         chunk_bytes: int = RECV_BYTES, cpus: tuple[int, int] | None = None) -> dict:
    """Best of ``rounds`` of streaming ``nbytes`` one way: {bps, ...}.
    ``cpus``: (the sender's cpu, the drain's cpu)."""
    chunk = np.random.default_rng(7).integers(0, 256, chunk_bytes, dtype=np.uint8).tobytes()
    count = max(2, nbytes // chunk_bytes)
    drain = Drain(transport, scratch)
    pipe, child = FORK.Pipe()
    p = FORK.Process(target=_bulk_sender, args=(transport, drain.addr, chunk_bytes, child),
                     daemon=True)
    p.start()
    if cpus:
        pin(p.pid, cpus[0])
        pin(drain.proc.pid, cpus[1])
    try:
        bufs = drain.bufs()
        best = 0.0
        for _ in range(rounds):
            drain.expect(count * chunk_bytes, chunk_bytes)
            pipe.send(count)
            t0 = pipe.recv()
            t_end, first, last = drain.result()
            if first != chunk or last != chunk:
                raise AssertionError("bulk: the drain received different bytes")
            best = max(best, count * chunk_bytes / (t_end - t0))
    finally:
        pipe.send(None)
        drain.close()
    _check_exit(p, "bulk sender")
    return {"bps": best, "bytes": count * chunk_bytes, "chunk_bytes": chunk_bytes, **bufs}


def best_of_placements(measure, key: str, also: tuple[str, ...] = ()) -> dict:
    """Run ``measure(cpus)`` for every placement; the best result by ``key``,
    with ``<field>_<placement>`` for ``key`` and ``also`` from every placement
    and ``placement`` naming the best."""
    runs = {name: measure(cpus) for name, cpus in placements().items()}
    name = max(runs, key=lambda k: runs[k][key])
    out = dict(runs[name], placement=name)
    for k, r in runs.items():
        for f in (key, *also):
            out[f"{f}_{k}"] = r[f]
    return out


# ------------------------------------------------------------------ bench
def run(ctx, result):
    for tr in TRANSPORTS:
        rt = ctx.net_rtt(tr)
        yield result(f"net_rtt_{tr}", rt["rate"], "req/s", rt["rate"],
                     "itself (raw Python request/response, one in flight)",
                     p50_us=round(rt["p50_us"], 2), p99_us=round(rt["p99_us"], 2),
                     requests=rt["n"], frame_bytes=rt["frame_bytes"], placement=rt["placement"],
                     **{k: round(v, 2) for k, v in rt.items()
                        if k.startswith(("rate_", "p50_us_", "p99_us_"))})
    for tr in TRANSPORTS:
        b = ctx.net_bulk(tr)
        yield result(f"net_bulk_{tr}", b["bps"], "B/s", b["bps"],
                     "itself (raw socket, 1 MiB sendall -> recv_into)",
                     bytes=b["bytes"], chunk_bytes=b["chunk_bytes"],
                     sndbuf=b["sndbuf"], rcvbuf=b["rcvbuf"], placement=b["placement"],
                     **{k: round(v) for k, v in b.items() if k.startswith("bps_")})
