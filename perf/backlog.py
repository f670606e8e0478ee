"""A big backlog (亿级堆积): what N stored messages cost at start, in memory and
to read back, each figure beside its limit measured in the same run.

N messages of 100 B (N = 100,000,000 full size, 2,000,000 ``--quick``) are
sent through a real ``shmq broker`` (ASYNC_FLUSH, index on) over its Unix
socket: PRODUCERS processes, each its own connection and its share of
QUEUES queues, batches (320) of BATCH messages, one in flight per queue (a
busy reply sent again), every reply's queueOffset checked and every queue's maxOffset and last body at the
end. Segment sizes are chosen so the quick store still has several CommitLog
segments and several ConsumeQueue files per queue. Then, on that store:

- backlog_ready_clean: ready time (spawn to the "ready" line) after a clean
  stop, with the page cache dropped first; limit: an empty store's ready
  time, same settings, same run (target: ≤ 5 s with 100 M stored, ≤ 2×
  the empty store's);
- backlog_ready_kill9: the same after ``kill -9`` of the broker (abort
  marker left, recovery from the checkpoint);
- backlog_inspect_summary: ``shmq store inspect`` (summary) on the stopped
  store, cold; limit: the same command on the empty store (target ≤ 5 s);
- backlog_peak_rss: the largest peak RSS (VmHWM) of any broker process over
  the whole run: the filling broker, the restart that backfills the
  IndexFile (its index files are removed before that start, so the services
  process indexes the whole CommitLog) and the reads; limit: 1 GiB (the
  target, not a measurement);
- backlog_catchup_cold: one queue read from offset 0 (to its end; 2 M
  messages at full size), pulls (11) of 32 messages, 4 in flight, the page
  cache dropped first — record bytes/s against a raw sequential read on the
  same disk measured in the same run: a segment-sized file written for it,
  cold, 1 MiB reads (not a segment: pages a broker maps stay cached
  whatever drop_caches does). Target ratio ≥ 0.5. ``warm_msg_per_s``: the
  same read again from the page cache, what the pull path's CPU allows
  (the rest is I/O); ``share_of_log``: the read's record bytes over the
  CommitLog bytes it spanned (8 queues interleave: about 1/8), so reading
  the span sequentially at the raw rate gives the queue's records at raw
  × share_of_log, the most a read that cannot skip the other queues'
  bytes for free reaches; ``cache_in_per_byte``: the CommitLog pages of
  the span the read covered that came into the page cache during it
  (mincore before and after) per byte it returned — about 1 when the
  read-ahead brings in the queue's own records only, up to 8 when whole
  pages of all 8 interleaved queues come in — and
  ``other_queues_cache_in_per_byte`` the part of it that is other queues'
  pages. The scrub's first pass after a start reads the whole CommitLog
  (32 MiB/s), every queue's pages: the quick run waits for it to end
  before the reads (``scrub_first_pass_done``); the full run's, 12 minutes,
  overlaps them and counts in these figures. ``meminfo_cached_per_byte``:
  the growth of /proc/meminfo's Cached, whatever brought it in. The quick run
  sets accessMessageInMemoryMaxRatio=0, so all its few hundred MB lie
  outside the page-cache window, as the first 2 M of 100 M messages do at
  the default 40%;
- backlog_catchup_cold_producing: the same read of another queue (1 M
  messages at most) while PRODUCERS producers send at full rate to another
  topic (target ≥ 0.25); ``warm_msg_per_s``: the same read again, its
  records now in the page cache, the producers still sending: what the
  CPU left to the pull allows. Its ``meminfo_cached_per_byte`` counts the
  producers' records, ConsumeQueue units and index entries too.

The page cache is dropped with ``sync; echo 3 > /proc/sys/vm/drop_caches``
when the run is root; otherwise each store file is given
``posix_fadvise(DONTNEED)`` after a sync (pages a process still maps stay
either way), and every result says which (``page_cache``).
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import deque

import numpy as np

from perf.broker import (SUCCESS, TIMEOUT_S, Broker, batch_body, batch_cmd, body_of, check,
                         create_topic, free_port, gather, pull_cmd, records, spawn, _child,
                         verify_queues)
from perf import Skipped
from perf.net_limits import FORK
from shmq.broker.procs import broker_processes
from shmq.client.remoting import RemotingClient
from shmq.core.config import StoreConfig
from shmq.core.index import IndexService
from shmq.core.layout import CQ_PAD_SIZE, CQ_UNIT_DTYPE, offset_to_file_name
from shmq.ipc.remoting import RemotingCommand

TOPIC = "PerfBacklog"
LIVE_TOPIC = "PerfBacklogLive"
QUEUES = 8
PRODUCERS = 2                  # the fill and the live load: one per core here
BATCH = 256
WINDOW = 4                     # a live producer's batches in flight (a filler: one per queue)
PULL_MSGS = 32
PULLS_IN_FLIGHT = 4
BODY = 100
GET_BROKER_RUNTIME_INFO = 28
SYSTEM_BUSY = 2
RSS_LIMIT_MIB = 1024
SCRUB_PASS_DONE = "scrub: checked the CommitLog up to"    # core/scrub.py's line at a pass's end
SCRUB_WAIT_S = 90
PHY_AT = struct.Struct(">q")    # a record's PHYSICALOFFSET, at byte 28


# ------------------------------------------------------------------ the page cache
def drop_cache(store: str) -> str:
    """Empty the page cache of the store's files; says how."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "dropped (drop_caches)"
    except OSError:
        pass
    for d, _, names in os.walk(store):
        for n in names:
            try:
                fd = os.open(os.path.join(d, n), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return "not dropped (not root): store files fadvised DONTNEED"


def cached_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1]) * 1024
    return 0


def vm_hwm_mib(pid: int) -> float:
    """Peak RSS of a live process (VmHWM), MiB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PAGE = 4096


def resident_pages(path: str) -> np.ndarray:
    """Which pages of the file are in the page cache (mincore of a mapping
    made for the question: mapping reads nothing), one bool a page."""
    size = os.path.getsize(path)
    n = -(-size // PAGE)
    if not n:
        return np.zeros(0, bool)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            vec = (ctypes.c_ubyte * n)()
            if _libc.mincore(addr, size, vec):
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return (np.frombuffer(vec, np.uint8) & 1).astype(bool)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def queue_runs(store: str, upf: int, qid: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """CommitLog offsets and sizes of queue ``qid``'s first ``count`` records
    (its ConsumeQueue files read directly: the broker is not asked)."""
    d = os.path.join(store, "consumequeue", TOPIC, str(qid))
    parts, got = [], 0
    while got < count:
        u = np.fromfile(os.path.join(d, offset_to_file_name(got // upf * upf * CQ_UNIT_DTYPE.itemsize)),
                        dtype=CQ_UNIT_DTYPE)[got % upf:][:count - got]
        parts.append(u)
        got += u.shape[0]
    u = np.concatenate(parts)
    u = u[(u["size"] > 0) & (u["size"] != CQ_PAD_SIZE)]
    return u["phy_offset"].astype(np.int64), u["size"].astype(np.int64)


def span_cached(store: str, seg_bytes: int, phys: np.ndarray, sizes: np.ndarray) -> tuple[int, int]:
    """Bytes of the page cache holding the CommitLog span a read covers
    (its first record to its last one's end): (pages holding the read's
    own records, the other pages of the span: the other queues' records)."""
    lo, hi = int(phys[0]), int(phys[-1] + sizes[-1])
    own = other = 0
    for s in range(lo - lo % seg_bytes, hi, seg_bytes):
        r = resident_pages(os.path.join(store, "commitlog", offset_to_file_name(s)))
        mine = np.zeros(r.shape[0] + 1, np.int64)    # +1 at a record's first page, -1 past its last
        sel = (phys >= s) & (phys < s + seg_bytes)
        np.add.at(mine, (phys[sel] - s) // PAGE, 1)
        np.add.at(mine, (phys[sel] + sizes[sel] - 1 - s) // PAGE + 1, -1)
        mine = np.cumsum(mine[:-1]) > 0
        page = np.arange(r.shape[0], dtype=np.int64) * PAGE + s
        span = (page + PAGE > lo) & (page < hi)
        own += int(np.count_nonzero(r & mine)) * PAGE
        other += int(np.count_nonzero(r & ~mine & span)) * PAGE
    return own, other


# ------------------------------------------------------------------ a broker on a given store
class StoreBroker(Broker):
    """``Broker`` on a conf written once and started again on the same store:
    ``ready_s`` is spawn → the "ready" line."""

    def __init__(self, conf_path: str, store: str, log_path: str, phase: str):
        self.conf_path, self.store, self.flush = conf_path, store, "ASYNC_FLUSH"
        self.phase = phase
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.log_from = self.log.tell()          # this start's lines follow
        t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "shmq.tools", "broker", "-c", conf_path],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.log, cwd=os.path.dirname(conf_path),
                                     start_new_session=True)      # kill -9 takes its group
        line = self._ready_line(600.0)
        self.ready_s = time.monotonic() - t0
        self.recovery = self._recovery_line(log_path)
        fields = dict(tok.split("=", 1) for tok in line.split()[3:] if "=" in tok)
        self.tcp, self.unix = fields["tcp"], fields["unix"]
        self.transports = ("unix",)
        self.namesrv = None
        self.out = deque(maxlen=100)
        self._drain = threading.Thread(target=self._drain_stdout, daemon=True)
        self._drain.start()
        self.hwm: dict[str, float] = {}

    @staticmethod
    def _recovery_line(log_path: str) -> str:
        """The recovery report this start logged (its summary line)."""
        with open(log_path, "rb") as f:
            lines = [ln for ln in f.read().decode(errors="replace").splitlines()
                     if " recovery: end " in ln]
        return lines[-1].split(": ", 1)[-1][:400] if lines else ""

    def logged(self, text: str) -> bool:
        """Whether this start has logged a line containing ``text``."""
        with open(self.log_path, "rb") as f:
            f.seek(self.log_from)
            return text.encode() in f.read()

    def sample_rss(self) -> None:
        """Keep each broker process's peak RSS (VmHWM: the kernel's own peak)."""
        roles, _ = broker_processes(self.proc.pid)
        for role, pid in roles:
            self.hwm[role] = max(self.hwm.get(role, 0.0), vm_hwm_mib(pid))

    def kill9(self) -> None:
        roles, _ = broker_processes(self.proc.pid)
        self.sample_rss()
        os.killpg(self.proc.pid, signal.SIGKILL)     # the boss, its fork server, their children
        self.proc.wait()
        deadline = time.monotonic() + 30
        for _, pid in roles:          # its children die with it (PDEATHSIG); wait for them
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        if f.read().split(")")[-1].split()[0] == "Z":
                            break
                except OSError:
                    break
                time.sleep(0.05)
        self._drain.join(5)
        self.log.close()

    def stop(self) -> None:
        self.sample_rss()
        super().stop()

    def reap(self) -> None:
        """kill -9 the broker's process group if it still runs."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def cq_units_per_file(quick: bool) -> int:
    """ConsumeQueue units a file (mappedFileSizeConsumeQueue / 20): several files a queue."""
    return 50_000 if quick else 300_000


def write_conf(root: str, quick: bool, name: str) -> tuple[str, str]:
    d = os.path.join(root, name)
    os.makedirs(d)
    store = os.path.join(d, "store")
    upf = cq_units_per_file(quick)
    conf = {"storePathRootDir": store, "listenPort": free_port(),
            "namesrvListenPort": free_port(), "embeddedNamesrv": "false",
            "flushDiskType": "ASYNC_FLUSH", "workerProcessNums": 2, "messageIndexEnable": "true",
            "mappedFileSizeCommitLog": (64 if quick else 1024) << 20,
            "mappedFileSizeConsumeQueue": upf * 20,
            # records further behind the write position than this share of
            # RAM are read from disk (checked, read ahead): the quick store
            # is a few hundred MB, so 0 makes all of it far behind, as the
            # reads' first 2 M of 100 M messages are at the default 40%
            "accessMessageInMemoryMaxRatio": 0 if quick else 40,
            "unixSocketPath": f"/tmp/shmq-backlog-{os.getpid()}-{name}.sock"}
    path = os.path.join(d, "broker.conf")
    with open(path, "w") as f:
        f.writelines(f"{k}={v}\n" for k, v in conf.items())
    return path, store


# ------------------------------------------------------------------ producers
def _payload(q: int) -> bytes:
    return batch_body([body_of(q, j, BODY) for j in range(BATCH)])


@_child
def _filler(addr, topic, queues, per_queue, go, pipe):
    """Send ``per_queue`` messages to each of ``queues`` in batches, one in
    flight per queue (so each reply's queueOffset is known in advance);
    a busy reply (flow control) is sent again, as a RocketMQ producer does."""
    payloads = {q: _payload(q) for q in queues}
    busy = 0
    with RemotingClient(addr) as c:
        pipe.send("ready")
        go.wait()
        pending = {}

        def send(q, off):
            pending[c.send(batch_cmd(topic, q, payloads[q]))] = (q, off)

        t0 = time.monotonic()
        for q in queues:
            send(q, 0)
        while pending:
            r = c.recv(timeout=TIMEOUT_S)
            q, off = pending.pop(r.opaque)
            if r.code == SYSTEM_BUSY:
                busy += 1
                send(q, off)
                continue
            check(r, what="backlog batch")
            if int(r.ext["queueOffset"]) != off:
                raise AssertionError(f"{topic}/{q}: queueOffset {r.ext['queueOffset']} != {off}")
            if off + BATCH < per_queue:
                send(q, off + BATCH)
        t1 = time.monotonic()
    pipe.send((t0, t1, len(queues) * per_queue, busy))


@_child
def _live(addr, topic, qid, stop, go, pipe):
    """Send batches at full rate until ``stop`` is set; reports messages
    stored and the sends the broker turned away busy (flow control, which
    a RocketMQ producer retries: so does this one)."""
    payload = _payload(qid)
    n = busy = 0
    with RemotingClient(addr) as c:
        pipe.send("ready")
        go.wait()
        inflight = 0
        t0 = time.monotonic()
        for _ in range(WINDOW):
            c.send(batch_cmd(topic, qid, payload))
            inflight += 1
        while inflight:
            r = c.recv(timeout=TIMEOUT_S)
            inflight -= 1
            if r.code == SYSTEM_BUSY:
                busy += 1
            else:
                check(r, what="live batch")
                n += BATCH
            if not stop.is_set():
                c.send(batch_cmd(topic, qid, payload))
                inflight += 1
        t1 = time.monotonic()
    pipe.send((t0, t1, n, busy))


def fill(addr: str, n: int) -> tuple[float, int]:
    per_queue = n // QUEUES
    with RemotingClient(addr) as c:
        create_topic(c, TOPIC, QUEUES)
    go = FORK.Event()
    kids, pipes = zip(*(spawn(_filler, (addr, TOPIC, list(range(p, QUEUES, PRODUCERS)), per_queue, go))
                        for p in range(PRODUCERS)))
    got = gather(kids, pipes, go, "backlog fill", ready_s=120, report_s=3600)
    with RemotingClient(addr) as c:
        verify_queues(c, TOPIC, {q: (per_queue, body_of(q, BATCH - 1, BODY)) for q in range(QUEUES)})
    return (sum(g[2] for g in got) / (max(g[1] for g in got) - min(g[0] for g in got)),
            sum(g[3] for g in got))


# ------------------------------------------------------------------ reads
def catch_up(addr: str, qid: int, count: int) -> tuple[float, int, int, int]:
    """Read queue ``qid`` from 0 to ``count``, PULLS_IN_FLIGHT pulls of
    PULL_MSGS; (seconds, messages, record bytes, CommitLog bytes the read
    spanned: from its first record to the end of the last reply's first
    run), every pull checked (a pull stops at a ConsumeQueue file's end:
    the rest is asked again)."""
    todo = deque((off, min(PULL_MSGS, count - off)) for off in range(0, count, PULL_MSGS))
    lo, hi = 1 << 62, 0
    with RemotingClient(addr) as c:
        pending = {}
        got = nbytes = replies = 0
        t0 = time.monotonic()
        while todo or pending:
            while todo and len(pending) < PULLS_IN_FLIGHT:
                off, want = todo.popleft()
                pending[c.send(pull_cmd(TOPIC, qid, off, want))] = (off, want)
            r = c.recv(timeout=TIMEOUT_S)
            off, want = pending.pop(r.opaque)
            k = int(r.ext.get("nextBeginOffset", off)) - off
            if r.code != SUCCESS or not 0 < k <= want:
                raise AssertionError(f"pull {qid}@{off}: code {r.code} ({r.remark}), "
                                     f"nextBeginOffset {r.ext.get('nextBeginOffset')}")
            if k < want:
                todo.appendleft((off + k, want - k))
            if replies % 64 == 0:
                recs = records(r.body)
                q, o, body, _ = recs[0]
                if len(recs) != k or (q, o) != (qid, off) or body != body_of(qid, off % BATCH, BODY):
                    raise AssertionError(f"pull {qid}@{off}: {len(recs)} records, first {q}@{o}")
            got += k
            nbytes += len(r.body)
            replies += 1
            phy = PHY_AT.unpack_from(r.body, 28)[0]
            lo, hi = min(lo, phy), max(hi, phy + len(r.body))
        t1 = time.monotonic()
    if got != count:
        raise AssertionError(f"queue {qid}: read {got} of {count}")
    return t1 - t0, got, nbytes, hi - lo


def raw_read_bps(path: str, nbytes: int, store: str) -> float:
    """Sequential read of a file of ``nbytes`` written for it on the store's
    disk, with 1 MiB reads, its pages dropped first. Not a segment of the
    store: a broker maps those, and pages a process maps stay cached
    whatever drop_caches does (the read would measure memory)."""
    with open(path, "wb") as f:
        for _ in range(nbytes >> 20):
            f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
    drop_cache(store)
    buf = bytearray(1 << 20)
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.monotonic()
        n = 0
        with os.fdopen(fd, "rb", buffering=0, closefd=False) as f:
            while True:
                k = f.readinto(buf)
                if not k:
                    break
                n += k
        return n / (time.monotonic() - t0)
    finally:
        os.close(fd)
        os.unlink(path)


def until_logged(b: StoreBroker, text: str, timeout: float) -> bool:
    """Wait up to ``timeout`` s for the broker to log ``text``; whether it did."""
    deadline = time.monotonic() + timeout
    while not b.logged(text):
        if time.monotonic() >= deadline:
            return False
        b.alive()
        time.sleep(0.2)
    return True


def inspect_s(store: str) -> float:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "shmq.tools", "store", "inspect", store],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"shmq store inspect {store}: exit {p.returncode}: {p.stderr[-500:]!r}")
    return time.monotonic() - t0


def wait_indexed(b: StoreBroker, store: str, timeout: float) -> float:
    """Seconds until the services process's index backfill reaches the
    CommitLog's end (the last record starts within 4 KiB of it)."""
    with RemotingClient(b.addr("unix")) as c:
        info = check(c.invoke(RemotingCommand(GET_BROKER_RUNTIME_INFO), timeout=TIMEOUT_S))
    end = int(json.loads(bytes(info.body))["table"]["commitLogMaxOffset"])
    ix = IndexService(StoreConfig(storePathRootDir=store), read_only=True)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            ix.query(TOPIC, "k", 1, 0, 0)            # refreshes the file list
            if ix.last_update_phy_offset >= end - 4096:
                return time.monotonic() - t0
            b.alive()
            b.sample_rss()
            time.sleep(0.2)
    finally:
        ix.close()
    raise RuntimeError(f"the index backfill did not reach {end} within {timeout} s "
                       f"(at {ix.last_update_phy_offset})")


# ------------------------------------------------------------------ the bench
def run(ctx, result):
    if getattr(ctx, "named_broker", None) is not None:
        raise Skipped("starts, kills and restarts brokers on a store of its own")
    per_queue = (2_000_000 if ctx.quick else 100_000_000) // QUEUES // BATCH * BATCH
    n = per_queue * QUEUES
    root = ctx.sub("backlog")
    brokers: list[StoreBroker] = []

    def start(conf, store, log, phase):
        b = StoreBroker(conf, store, log, phase)
        brokers.append(b)
        ctx.on_close(b.reap)              # a bench that fails leaves no broker behind
        return b

    # the empty store: start, stop; its inspector run
    econf, estore = write_conf(root, ctx.quick, "empty")
    start(econf, estore, econf + ".log", "warm-up").stop()   # warms numba's cache, makes the store
    how = drop_cache(estore)
    e = start(econf, estore, econf + ".log", "empty")
    e.stop()
    empty_ready = e.ready_s
    drop_cache(estore)
    empty_inspect = inspect_s(estore)

    # the backlog
    seg_bytes = (64 if ctx.quick else 1024) << 20
    conf, store = write_conf(root, ctx.quick, "backlog")
    log = conf + ".log"
    b = start(conf, store, log, "fill")
    t = time.monotonic()
    rate, fill_busy = fill(b.addr("unix"), n)
    fill_s = time.monotonic() - t
    b.stop()
    segs = sorted(os.listdir(os.path.join(store, "commitlog")))
    cq_files = len(os.listdir(os.path.join(store, "consumequeue", TOPIC, "0")))
    stored = sum(os.path.getsize(os.path.join(store, "commitlog", s)) for s in segs)

    # a clean start over the backlog, the index removed: the services backfill it
    for name in os.listdir(os.path.join(store, "index")):
        os.unlink(os.path.join(store, "index", name))
    how = drop_cache(store)
    b = start(conf, store, log, "backfill+reads")
    clean_ready, clean_rec = b.ready_s, b.recovery
    backfill_s = wait_indexed(b, store, 3600)
    common = dict(messages=n, body_bytes=BODY, stored_bytes=stored, segments=len(segs),
                  segment_bytes=seg_bytes, cq_files_per_queue=cq_files, page_cache=how)
    yield result("backlog_ready_clean", clean_ready, "s", empty_ready,
                 "the empty store's ready time, same settings, same run", target_s=5.0,
                 target_ratio=2.0, fill_msg_per_s=round(rate), fill_s=round(fill_s, 1),
                 fill_busy_replies=fill_busy, recovery=clean_rec, **common)
    # cold catch-up reads, alone and beside producers
    raw = raw_read_bps(os.path.join(root, "raw-read"), seg_bytes, store)
    # the scrub's first pass after a start reads the whole CommitLog (32
    # MiB/s): the quick run waits for it, so what the reads bring into the
    # page cache is theirs; the full run's pass (12 min) overlaps them
    scrubbed = until_logged(b, SCRUB_PASS_DONE, SCRUB_WAIT_S if ctx.quick else 0)
    # the reads: a queue from its start, as far as a read of a minute or
    # so goes (full size: 2 M of its 12.5 M; with producers 1 M, their
    # writes meanwhile must fit the disk)
    n1, n2 = min(per_queue, 2_000_000), min(per_queue, 1_000_000)
    runs1 = queue_runs(store, cq_units_per_file(ctx.quick), 0, n1)   # (read before the drop)
    runs2 = queue_runs(store, cq_units_per_file(ctx.quick), 1, n2)
    drop_cache(store)
    c0 = cached_bytes()
    span0 = span_cached(store, seg_bytes, *runs1)
    s1, m1, by1, span1 = catch_up(b.addr("unix"), 0, n1)
    amp1 = (cached_bytes() - c0) / by1
    own1, other1 = (a - z for a, z in zip(span_cached(store, seg_bytes, *runs1), span0))
    sw, mw, _, _ = catch_up(b.addr("unix"), 0, min(per_queue, 250_000))   # warm: the CPU's ceiling
    b.sample_rss()
    with RemotingClient(b.addr("unix")) as c:
        create_topic(c, LIVE_TOPIC, PRODUCERS)
    drop_cache(store)
    stop, go = FORK.Event(), FORK.Event()
    kids, pipes = zip(*(spawn(_live, (b.addr("unix"), LIVE_TOPIC, p, stop, go)) for p in range(PRODUCERS)))
    for a in pipes:
        if a.recv() != "ready":
            raise RuntimeError("a live producer did not get ready")
    go.set()
    c0 = cached_bytes()
    span0 = span_cached(store, seg_bytes, *runs2)
    s2, m2, by2, span2 = catch_up(b.addr("unix"), 1, n2)
    cached2 = cached_bytes() - c0
    own2, other2 = (a - z for a, z in zip(span_cached(store, seg_bytes, *runs2), span0))
    sw2, mw2, _, _ = catch_up(b.addr("unix"), 1, min(n2, 250_000))   # warm, producers still on
    stop.set()
    live = [a.recv() for a in pipes]
    if any(isinstance(x, BaseException) for x in live):
        raise RuntimeError("a live producer failed") from next(x for x in live
                                                              if isinstance(x, BaseException))
    for p in kids:
        p.join(30)
    live_rate = sum(x[2] for x in live) / (max(x[1] for x in live) - min(x[0] for x in live))
    yield result("backlog_catchup_cold", by1 / s1, "B/s", raw,
                 "raw sequential read, cold, 1 MiB reads of a segment-sized file on the store's disk",
                 msg_per_s=round(m1 / s1), read_messages=m1, pulls_in_flight=PULLS_IN_FLIGHT,
                 max_msg_nums=PULL_MSGS, cache_in_per_byte=round((own1 + other1) / by1, 2),
                 other_queues_cache_in_per_byte=round(other1 / by1, 3),
                 meminfo_cached_per_byte=round(amp1, 2), target_ratio=0.5,
                 warm_msg_per_s=round(mw / sw), share_of_log=round(by1 / span1, 3),
                 scrub_first_pass_done=scrubbed, **common)
    yield result("backlog_catchup_cold_producing", by2 / s2, "B/s", raw,
                 "raw sequential read, cold, 1 MiB reads of a segment-sized file on the store's disk",
                 msg_per_s=round(m2 / s2), read_messages=m2, pulls_in_flight=PULLS_IN_FLIGHT,
                 max_msg_nums=PULL_MSGS, cache_in_per_byte=round((own2 + other2) / by2, 2),
                 other_queues_cache_in_per_byte=round(other2 / by2, 3),
                 meminfo_cached_per_byte=round(cached2 / by2, 2), target_ratio=0.25,
                 warm_msg_per_s=round(mw2 / sw2),
                 producers=PRODUCERS, producers_msg_per_s=round(live_rate),
                 producers_busy_replies=sum(x[3] for x in live), share_of_log=round(by2 / span2, 3),
                 scrub_first_pass_done=scrubbed,
                 **common)
    b.sample_rss()
    b.kill9()

    # after kill -9
    drop_cache(store)
    b = start(conf, store, log, "after kill -9")
    kill_ready, kill_rec = b.ready_s, b.recovery
    b.stop()
    yield result("backlog_ready_kill9", kill_ready, "s", empty_ready,
                 "the empty store's ready time, same settings, same run", target_s=5.0,
                 target_ratio=2.0, recovery=kill_rec, **common)
    drop_cache(store)
    insp = inspect_s(store)
    yield result("backlog_inspect_summary", insp, "s", empty_inspect,
                 "shmq store inspect on the empty store, same run", target_s=5.0, **common)

    phases = {x.phase: {role: round(mib, 1) for role, mib in sorted(x.hwm.items())} for x in brokers}
    top_phase, top = max(((p, r) for p, roles in phases.items() for r in roles),
                         key=lambda pr: phases[pr[0]][pr[1]])
    yield result("backlog_peak_rss", phases[top_phase][top], "MiB", RSS_LIMIT_MIB,
                 "target: every broker process under 1 GiB (VmHWM)", process=top,
                 phase=top_phase, peak_mib_by_phase=phases,
                 index_backfill_s=round(backfill_s, 2), **common)
