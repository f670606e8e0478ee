"""The fault campaign: what each fault costs, measured on real files and a real broker.

    python -m perf.faults [--trials N] [--quick] [--report FILE] [name ...]

Each campaign injects one kind of fault many times and counts what a user
would count: acknowledged messages lost (beyond the record a fault itself
destroyed), queue offsets handed out twice, and what the operator is told.
It fails loudly (exit 1) when a trial loses more than the fault destroyed.
``--report`` writes the table as Markdown (perf/FAULTS.md). The test suite
runs every campaign with a few trials (tests/test_faults.py);
``--trials`` is the stress knob.

- ``bitflip``: one bit of a checked field (TOTALSIZE, MAGIC, BODYCRC,
  PHYSICALOFFSET, the body length, the body) of a random record of a random
  segment of a flushed store. The scrub finds it (every record below the
  flushed position, the segment being written included; a start rescans
  only past the checkpoint); the next start quarantines it.
  Expected: exactly the flipped record lost, no offset reused.
- ``torn_tail``: the unflushed tail of a store cut or overwritten with
  garbage at a random point (a power loss). Expected: nothing flushed lost.
- ``truncated_segment``: a random segment cut short at a random point (a
  copy, a full disk). Expected: only the records past the cut lost, their
  offsets skipped, the broker starts.
- ``partial_frames``: clients each sending most of a 16 MiB frame and
  stopping, while a good client sends one message at a time. Reported: the
  workers' RSS growth against serverPendingFrameBytesMax, the good client's
  p99, a new connection's first reply.
- ``stalled_readers``: clients pipelining pulls they never read, same figures.
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import socket
import sys
import tempfile
import time

import numpy as np

from shmq.core import layout as L
from shmq.core.config import StoreConfig
from shmq.core.records import encode
from shmq.core.recovery import DamageLog
from shmq.core.scrub import Scrubber
from shmq.core.store import close_clean, flush_all, open_local

SEGMENT = 64 * 1024
MIB = 1 << 20


class TrialFailed(AssertionError):
    pass


# ------------------------------------------------------------------ store campaigns
def _config(root: str) -> StoreConfig:
    return StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=SEGMENT, maxMessageSize=16384,
                       mappedFileSizeConsumeQueue=20 * 1024)


def _fill(store, rng, n: int) -> list[tuple[int, int, int, int, bytes]]:
    """n records over 3 queues: (phy, end, queue id, queue offset, body)."""
    out = []
    for i in range(n):
        body = b"%05d:" % i + os.urandom(rng.randint(20, 1500))
        r = store.append(encode("Fault", [body], queue_ids=i % 3, properties=b""))
        out.append((int(r.phy_offset), int(r.end), i % 3, int(r.queue_offset), body))
    return out


def _survivors(store) -> dict[tuple[int, int], bytes]:
    """(queue id, queue offset) → body of every record served."""
    return {(q, m.queue_offset): m.body for q in range(3) for m in store.read_queue("Fault", q)}


def _offsets_reused(store, recs) -> int:
    """Queues whose next offset is below one already handed out."""
    return sum(store.max_offset("Fault", q) < 1 + max((r[3] for r in recs if r[2] == q), default=-1)
               for q in range(3))


def _checked_byte(rng, rec) -> int:
    blen_at = rec[0] + 84                                   # IPv4 hosts
    return rng.choice([rec[0] + rng.randrange(4), rec[0] + 4 + rng.randrange(4),
                       rec[0] + 8 + rng.randrange(4), rec[0] + 28 + rng.randrange(8),
                       blen_at + rng.randrange(4)]
                      + [blen_at + 4 + rng.randrange(len(rec[4]))] * 3)


def _flip(root: str, phy: int, bit: int) -> None:
    seg = phy - phy % SEGMENT
    with open(os.path.join(root, "commitlog", L.offset_to_file_name(seg)), "r+b") as f:
        f.seek(phy - seg)
        b = f.read(1)[0]
        f.seek(phy - seg)
        f.write(bytes([b ^ (1 << bit)]))


def trial_bitflip(rng, root: str) -> dict:
    cfg = _config(root)
    store, _ = open_local(cfg)
    recs = _fill(store, rng, rng.randint(60, 200))
    flush_all(store)
    # a record with a later one in its queue (so the hole shows), any segment
    bad = rng.choice([r for r in recs if any(k[2] == r[2] and k[3] > r[3] for k in recs)])
    _flip(root, _checked_byte(rng, bad), rng.randrange(8))
    scrub = Scrubber(store, cfg, clock=iter(range(1, 10 ** 6)).__next__)
    while scrub.step(0) or scrub.pos >= 0:                  # one whole pass, as the services do
        pass
    found_by = "scrub" if scrub.found else "recovery"
    close_clean(store)
    store, report = open_local(cfg)
    try:
        got = _survivors(store)
        want = {(r[2], r[3]): r[4] for r in recs if r is not bad}
        lost = [k for k in want if got.get(k) != want[k]]
        if lost or (bad[2], bad[3]) in got:
            raise TrialFailed(f"flip in record {bad[0]}: lost {lost[:5]} besides it")
        reused = _offsets_reused(store, recs)
        if reused:
            raise TrialFailed(f"flip in record {bad[0]}: {reused} queues would reuse an offset")
        if not report.quarantined:
            raise TrialFailed(f"flip in record {bad[0]}: recovery reported no quarantine")
        return {"acked": len(recs), "destroyed": 1, "lost": len(recs) - len(got), "reused": 0,
                "found_by": found_by,
                "seen": "ERROR naming the offset and the copy in <store>/quarantine/ (from the "
                        "scrub, or from recovery past the checkpoint), and the report"}
    finally:
        store.close()


def trial_torn_tail(rng, root: str) -> dict:
    cfg = _config(root)
    store, _ = open_local(cfg)
    recs = _fill(store, rng, rng.randint(40, 120))
    flush_all(store)                                      # the checkpoint: these are durable
    flushed = len(recs)
    more = _fill(store, rng, rng.randint(1, 40))
    recs += more
    end = more[-1][1]
    cut = rng.randint(more[0][0], end - 1)
    seg = cut - cut % SEGMENT
    path = os.path.join(root, "commitlog", L.offset_to_file_name(seg))
    store.close()                                         # a crash: no clean shutdown
    with open(path, "r+b") as f:
        f.seek(cut - seg)
        f.write(os.urandom(min(end - cut, SEGMENT - (cut - seg))) if rng.random() < 0.5
                else bytes(min(end - cut, SEGMENT - (cut - seg))))
    store, report = open_local(cfg)
    try:
        got = _survivors(store)
        lost = [r for r in recs[:flushed] if got.get((r[2], r[3])) != r[4]]
        if lost:
            raise TrialFailed(f"torn at {cut}: {len(lost)} flushed records lost")
        return {"acked": flushed, "destroyed": 0, "lost": 0, "reused": 0,
                "seen": "INFO recovery report: where the log ended, bytes truncated"}
    finally:
        store.close()


def trial_truncated_segment(rng, root: str) -> dict:
    cfg = _config(root)
    store, _ = open_local(cfg)
    recs = _fill(store, rng, rng.randint(100, 250))
    close_clean(store)
    segs = sorted({r[0] - r[0] % SEGMENT for r in recs})
    seg = rng.choice(segs)
    inside = [r for r in recs if seg <= r[0] < seg + SEGMENT]
    cut_rec = rng.choice(inside)
    cut = cut_rec[0] - seg + rng.randrange(cut_rec[1] - cut_rec[0])
    os.truncate(os.path.join(root, "commitlog", L.offset_to_file_name(seg)), cut)
    store, report = open_local(cfg)
    try:
        got = _survivors(store)
        cut_away = {(r[2], r[3]) for r in recs if seg + cut <= r[1] and r[0] < seg + SEGMENT}
        lost = [r for r in recs if (r[2], r[3]) not in cut_away and got.get((r[2], r[3])) != r[4]]
        if lost:
            raise TrialFailed(f"segment {seg} cut at {cut}: {len(lost)} records lost past the cut")
        reused = _offsets_reused(store, recs)
        if reused:
            raise TrialFailed(f"segment {seg} cut at {cut}: {reused} queues would reuse an offset")
        return {"acked": len(recs), "destroyed": len(cut_away), "lost": len(recs) - len(got),
                "reused": 0, "seen": "ERROR naming the segment, both sizes and the records lost; "
                                     "the broker starts"}
    finally:
        store.close()


def store_campaign(name: str, trial, trials: int, seed: int) -> dict:
    rows = []
    for i in range(trials):
        root = tempfile.mkdtemp(prefix=f"shmq-fault-{name}-")
        try:
            rows.append(trial(random.Random(seed * 100_003 + i), os.path.join(root, "store")))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return {"fault": name, "trials": trials, "acked": sum(r["acked"] for r in rows),
            "destroyed": sum(r["destroyed"] for r in rows), "lost": sum(r["lost"] for r in rows),
            "lost_beyond": sum(r["lost"] - r["destroyed"] for r in rows),
            "reused": sum(r["reused"] for r in rows), "seen": rows[-1]["seen"] if rows else ""}


# ------------------------------------------------------------------ broker campaigns
def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _workers(boss: int) -> list[int]:
    from shmq.broker.procs import children
    return [pid for name, pid in children(boss).items() if name.startswith("shmq-worker")]


def _good_client(addr: str, topic: str, n: int) -> tuple[float, float]:
    """(p99 ms of n one-at-a-time sends, a new connection's first reply in ms)."""
    from shmq.client.remoting import RemotingClient
    from shmq.client.requests import send_message
    from shmq.ipc.codes import RequestCode as RC
    from shmq.ipc.remoting import RemotingCommand
    t = time.perf_counter()
    with RemotingClient(addr, timeout=30) as c:
        c.invoke(RemotingCommand(RC.GET_BROKER_RUNTIME_INFO))
        first = (time.perf_counter() - t) * 1000
        lat = []
        for i in range(n):
            t = time.perf_counter()
            r = c.invoke(send_message(topic, b"good-%d" % i, queue_id=0))
            lat.append((time.perf_counter() - t) * 1000)
            if r.code != 0:
                raise TrialFailed(f"the good client's send {i} failed: {r.code} {r.remark}")
    return float(np.percentile(lat, 99)), first


def broker_campaign(name: str, clients: int, quick: bool) -> dict:
    from perf.broker import Broker
    from shmq.client.remoting import RemotingClient
    from shmq.client.requests import create_topic, pull_message, send_batch
    from shmq.ipc.remoting import encode as encode_frame

    class Ctx:
        def __init__(self, scratch):
            self.quick, self.scratch = True, scratch

        def sub(self, n):
            return tempfile.mkdtemp(prefix=n, dir=self.scratch)

    scratch = tempfile.mkdtemp(prefix="shmq-fault-broker-")
    cap = 64 * MIB
    b = Broker(Ctx(scratch), "ASYNC_FLUSH", name, serverPendingFrameBytesMax=cap)
    socks = []
    try:
        host, port = b.tcp.split(":")
        with RemotingClient(b.tcp) as c:
            c.invoke(create_topic("Good", 1))
            c.invoke(create_topic("Big", 1))
            for _ in range(8):
                c.invoke(send_batch("Big", [(b"x" * 1000, "")] * 32, queue_id=0))
        workers = _workers(b.proc.pid)
        before = sum(_rss_mib(p) for p in workers)
        for i in range(clients):
            s = socket.create_connection((host, int(port)))
            s.setblocking(False)
            if name == "partial_frames":
                data = (16 * MIB).to_bytes(4, "big") + (2).to_bytes(4, "big") + b"{}" + bytes(16 * MIB - 16)
            else:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                data = b"".join(encode_frame(pull_message("Big", 0, (j * 32) % 200, max_msgs=32))
                                for j in range(100))
            view = memoryview(data)
            deadline = time.monotonic() + 10
            while view and time.monotonic() < deadline:       # whatever the broker takes
                try:
                    view = view[s.send(view):]
                except BlockingIOError:
                    time.sleep(0.001)
                except OSError:
                    break                                      # closed by the broker: the cap
            socks.append(s)
        time.sleep(1.0)
        after = sum(_rss_mib(p) for p in workers)
        p99, first = _good_client(b.tcp, "Good", 200 if quick else 2000)
        growth = after - before
        if name == "partial_frames" and growth > len(workers) * cap / MIB * 1.25 + 32:
            raise TrialFailed(f"workers grew {growth:.0f} MiB with {clients} partial frames, "
                              f"past {len(workers)} × {cap // MIB} MiB")
        seen = ("WARNING connection ...: closed holding N bytes ... (serverPendingFrameBytesMax)"
                if name == "partial_frames" else "nothing: they stop only themselves")
        return {"fault": name, "trials": clients, "rss_growth_mib": round(growth, 1),
                "cap_mib": len(workers) * cap // MIB, "good_p99_ms": round(p99, 2),
                "first_reply_ms": round(first, 2), "seen": seen}
    finally:
        for s in socks:
            s.close()
        b.stop()
        shutil.rmtree(scratch, ignore_errors=True)


# ------------------------------------------------------------------ the run
STORE = {"bitflip": trial_bitflip, "torn_tail": trial_torn_tail,
         "truncated_segment": trial_truncated_segment}
BROKER = ("partial_frames", "stalled_readers")


def run(names: list[str], trials: int, quick: bool, seed: int = 1) -> list[dict]:
    out = []
    for name in names:
        if name in STORE:
            out.append(store_campaign(name, STORE[name], trials, seed))
        else:
            out.append(broker_campaign(name, (16 if quick else 64) if name == "partial_frames"
                                       else (25 if quick else 100), quick))
        print(out[-1], flush=True)
    return out


def markdown(rows: list[dict], command: str) -> str:
    lines = [f"# Fault campaign\n\n`{command}` — {time.strftime('%Y-%m-%d')}, "
             f"{os.cpu_count()} cores, kernel {os.uname().release}.\n",
             "| fault | trials | acknowledged | destroyed by the fault | lost | lost beyond it | "
             "offsets reused | what the operator sees |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "acked" in r:
            lines.append(f"| {r['fault']} | {r['trials']} | {r['acked']} | {r['destroyed']} | "
                         f"{r['lost']} | **{r['lost_beyond']}** | {r['reused']} | {r['seen']} |")
    lines += ["", "| fault | clients | workers' RSS growth | cap | good client p99 | "
              "new connection's first reply | what the operator sees |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "rss_growth_mib" in r:
            lines.append(f"| {r['fault']} | {r['trials']} | {r['rss_growth_mib']} MiB | "
                         f"{r['cap_mib']} MiB | {r['good_p99_ms']} ms | {r['first_reply_ms']} ms | "
                         f"{r['seen']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.faults", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"campaigns (default all): {', '.join([*STORE, *BROKER])}")
    ap.add_argument("--trials", type=int, help="trials per store campaign (50; --quick: 5)")
    ap.add_argument("--quick", action="store_true", help="5 trials, fewer clients")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--report", help="write the table as Markdown (perf/FAULTS.md)")
    args = ap.parse_args(argv)
    logging.getLogger("shmq").setLevel(logging.CRITICAL)    # the faults' ERRORs are expected
    names = args.names or [*STORE, *BROKER]
    unknown = [n for n in names if n not in STORE and n not in BROKER]
    if unknown:
        ap.error(f"unknown campaign(s) {unknown}; choose from {[*STORE, *BROKER]}")
    try:
        trials = args.trials if args.trials is not None else 5 if args.quick else 50
        rows = run(names, trials, args.quick, args.seed)
    except TrialFailed as e:
        print(f"perf.faults: FAILED: {e}", file=sys.stderr)
        return 1
    text = markdown(rows, "python -m perf.faults " + " ".join(argv if argv is not None else sys.argv[1:]))
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
