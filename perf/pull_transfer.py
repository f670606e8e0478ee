"""Pull bodies out of the store: ``os.sendfile`` vs one ``sendmsg`` of mapping slices.

A pull reply is a remoting head (the frame's length fields and a JSON header
like the broker's PULL reply) followed by stored records taken verbatim from
a CommitLog segment. The broker can send the records two ways:

- sendfile: ``send(head, MSG_MORE)`` then ``os.sendfile(sock, segment_fd, off, n)``
  (two system calls; the kernel copies page cache → socket, no user copy);
- sendmsg: ``sock.sendmsg([head, memoryview(mapping)[off:off + n]])`` (one
  system call; the kernel copies from the mapped pages).

For each body size and transport a sender process replies from a file on the
scratch disk (written, then read back through its mapping so that every page
is in the page cache and mapped) to a drain process (perf.net_limits.Drain)
that receives everything and hands back the first and last reply, checked
byte for byte against the file. Consecutive replies read consecutive ranges,
starting 100 bytes into the file (records are not page aligned). Methods
alternate, best of the rounds; the sender's CPU time per reply (median) is
reported too: it is what a broker worker pays, and it is steadier than the
wall rate on a shared VM. Every size runs with the two processes pinned to
one core and to two (perf.net_limits: the placement changes the answer).
Limit: raw bulk socket bandwidth on the same transport and placement. The
result table picks ``transferSendfileMinBytes``; the last line names the
size from which sendfile costs the sender less CPU at every larger size.
"""
from __future__ import annotations

import mmap
import os
import socket
import time

import numpy as np

from perf.net_limits import FORK, TRANSPORTS, Drain, _check_exit, connect, pin, placements
from shmq.ipc.remoting import FLAG_RESPONSE, RemotingCommand, encode_head

SIZES = (256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20)
METHODS = ("sendfile", "sendmsg")
SKEW = 100


def label(n: int) -> str:
    return f"{n >> 20}MiB" if n >= 1 << 20 else f"{n >> 10}KiB" if n >= 1 << 10 else f"{n}B"


def pull_head(n: int) -> bytes:
    """A PULL reply head as the broker would send it for an ``n``-byte body."""
    cmd = RemotingCommand(code=0, opaque=123456, flag=FLAG_RESPONSE, remark="FOUND",
                          ext={"suggestWhichBrokerId": "0", "nextBeginOffset": "1234567",
                               "minOffset": "0", "maxOffset": "2345678"})
    return encode_head(cmd, n)


def offsets(file_bytes: int, n: int) -> list[int]:
    slots = (file_bytes - SKEW) // n
    assert slots >= 2, (file_bytes, n)
    return [SKEW + i * n for i in range(slots)]


def make_file(path: str, nbytes: int) -> None:
    rng = np.random.default_rng(11)
    with open(path, "wb") as f:
        for _ in range(nbytes >> 20):
            f.write(rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes())
        os.fsync(f.fileno())


def _sender(transport, addr, path, pipe) -> None:
    s = connect(transport, addr)
    sfd = s.fileno()
    ffd = os.open(path, os.O_RDONLY)
    size = os.fstat(ffd).st_size
    mm = mmap.mmap(ffd, size, prot=mmap.PROT_READ)
    mv = memoryview(mm)
    assert int(np.frombuffer(mm, np.uint8)[::4096].sum()) >= 0     # fault every page in
    more = socket.MSG_MORE
    sendfile = os.sendfile
    while (cmd := pipe.recv()) is not None:
        method, n, count = cmd
        head = pull_head(n)
        hl = len(head)
        offs = offsets(size, n)
        k = len(offs)
        c0 = time.process_time()
        t0 = time.monotonic()
        if method == "sendfile":
            for i in range(count):
                off = offs[i % k]
                s.sendall(head, more)
                sent = 0
                while sent < n:
                    sent += sendfile(sfd, ffd, off + sent, n - sent)
        elif method == "sendmsg":
            for i in range(count):
                off = offs[i % k]
                sent = s.sendmsg([head, mv[off:off + n]])
                if sent < hl + n:                  # a partial write: finish it
                    if sent < hl:
                        s.sendall(head[sent:])
                        sent = hl
                    s.sendall(mv[off + sent - hl:off + n])
        else:
            raise ValueError(method)
        pipe.send((t0, time.process_time() - c0))
    del mv
    mm.close()
    os.close(ffd)
    s.close()


class Pair:
    """A sender process with the file mapped and a drain, over one transport."""

    def __init__(self, transport: str, scratch: str, path: str, cpus: tuple[int, int] | None = None):
        self.path = path
        self.size = os.path.getsize(path)
        self.drain = Drain(transport, scratch)
        self.pipe, child = FORK.Pipe()
        self.proc = FORK.Process(target=_sender, args=(transport, self.drain.addr, path, child),
                                 daemon=True)
        self.proc.start()
        if cpus:
            pin(self.proc.pid, cpus[0])
            pin(self.drain.proc.pid, cpus[1])
        self.fd = os.open(path, os.O_RDONLY)

    def run(self, method: str, n: int, count: int) -> tuple[float, float]:
        """Send ``count`` replies of ``n`` body bytes, checked: (replies/s,
        sender CPU seconds per reply)."""
        frame = len(pull_head(n)) + n
        self.drain.expect(count * frame, frame)
        self.pipe.send((method, n, count))
        t0, cpu = self.pipe.recv()
        t_end, first, last = self.drain.result()
        offs = offsets(self.size, n)
        head = pull_head(n)
        for got, i in ((first, 0), (last, count - 1)):
            want = head + os.pread(self.fd, n, offs[i % len(offs)])
            if got != want:
                raise AssertionError(f"{method} {n} B: reply {i} arrived different from the file")
        return count / (t_end - t0), cpu / count

    def close(self) -> None:
        self.pipe.send(None)
        self.drain.close()
        _check_exit(self.proc, "pull sender")
        os.close(self.fd)


def measure(pair: Pair, n: int, seconds: float, rounds: int) -> dict[str, tuple[float, float]]:
    """Per method: (best replies/s, median sender CPU seconds per reply) for
    ``n``-byte bodies. Wall rates swing with the neighbours on a shared VM;
    the sender's CPU time per reply (what a broker worker pays) is steadier."""
    calib = max(4, min(20000, (8 << 20) // n))
    rate = max(pair.run(m, n, calib)[0] for m in METHODS)      # warm + calibrate
    count = max(4, int(rate * seconds))
    runs = {m: [] for m in METHODS}
    for r in range(rounds):
        for m in (METHODS if r % 2 == 0 else METHODS[::-1]):
            runs[m].append(pair.run(m, n, count))
    return {m: (max(x[0] for x in v), float(np.median([x[1] for x in v])))
            for m, v in runs.items()}


def crossover(rows: list[tuple[int, str]]) -> int | None:
    """The smallest size from which sendfile wins at every larger size."""
    cross = None
    for n, winner in reversed(rows):
        if winner != "sendfile":
            break
        cross = n
    return cross


def run(ctx, result):
    d = ctx.sub("pull")
    path = os.path.join(d, "segment")
    make_file(path, (32 if ctx.quick else 256) << 20)
    seconds, rounds = (0.03, 3) if ctx.quick else (0.3, 6)
    wall, cpu = {}, {}
    for tr in TRANSPORTS:
        bulk = ctx.net_bulk(tr)
        for place, cpus in placements().items():
            limit = bulk[f"bps_{place}"]
            pair = Pair(tr, d, path, cpus)
            rows, rows_cpu = [], []
            try:
                for n in SIZES:
                    best = measure(pair, n, seconds, rounds)
                    (sf, sf_cpu), (sm, sm_cpu) = best["sendfile"], best["sendmsg"]
                    winner = "sendfile" if sf > sm else "sendmsg"
                    winner_cpu = "sendfile" if sf_cpu < sm_cpu else "sendmsg"
                    rows.append((n, winner))
                    rows_cpu.append((n, winner_cpu))
                    yield result(f"pull_transfer_{tr}_{place}_{label(n)}", max(sf, sm) * n, "B/s",
                                 limit, f"raw bulk socket bandwidth ({tr}, {place})",
                                 body_bytes=n, sendfile_Bps=round(sf * n), sendmsg_Bps=round(sm * n),
                                 winner=winner, sendfile_over_sendmsg=round(sf / sm, 3),
                                 sendfile_cpu_us=round(sf_cpu * 1e6, 2),
                                 sendmsg_cpu_us=round(sm_cpu * 1e6, 2), winner_cpu=winner_cpu,
                                 head_bytes=len(pull_head(n)), rounds=rounds, cpus=list(cpus))
            finally:
                pair.close()
            wall[f"{tr}_{place}"], cpu[f"{tr}_{place}"] = crossover(rows), crossover(rows_cpu)
    key = "unix_cross_core" if "unix_cross_core" in cpu else "unix_same_core"
    yield result("pull_transfer_crossover", cpu[key] or 0, "B", 0, "none (a choice, not a rate)",
                 sendfile_from_bytes_cpu=cpu, sendfile_from_bytes_wall=wall,
                 note="smallest body size from which sendfile wins at every larger size "
                      "(null: never); value: by the sender's CPU per reply (what a worker pays; "
                      f"steadier than wall rates here), {key} (0: never)")
