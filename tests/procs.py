"""Bodies of the processes that tests start (importable by name, so a fork
server or spawn can run them), and the context they start in."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

from shmq.broker.shared_store import attach, wait_flushed
from shmq.core.records import encode, properties_bytes
from shmq.ipc.control import LOCKING, WANT_PUBLISH, ControlBlock


def context():
    """The tests' multiprocessing context: children forked from one server
    that has the modules and kernels loaded (tests/forkserver_preload.py)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["forkserver_preload"])
    return ctx


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def append_then_die_mid_write(cfg, topic):
    """Append normally once, then die after writing half of the second batch."""
    store, cb = attach(cfg)
    store.append(encode(topic, [b"kept"], properties=b""))
    real_write = store.cl.write

    def half_write(phy, data):
        real_write(phy, data[:len(data) // 2])
        die()

    store.cl.write = half_write
    store.append(encode(topic, [b"lost-" + b"x" * 3000], properties=b""))


def append_then_die_after_write(cfg, topic):
    """Die with the append written (its claim DONE) but not yet published."""
    store, cb = attach(cfg)
    store.hook = lambda stage, seq: die() if stage == "written" else None
    store.append(encode(topic, [b"published"], properties=b""))


def append_then_die_mid_publish(cfg, topic):
    """Die inside the publish of an append: its claim DONE, ``write_pos``
    already moved to its end (the first position a publish writes), its
    queue's next offset and ``publish_seq`` not yet."""
    from shmq.core.state import DONE, E_STATE, I_LAST_STORE_TS, I_WRITE_POS
    store, cb = attach(cfg)
    w = store._w

    def finish(seq, e, slot, known, start, phy, end, q0, nq, ts):
        w[e + E_STATE] = DONE
        w[I_LAST_STORE_TS] = ts
        w[I_WRITE_POS] = end
        die()
    store._finish = finish
    store.append(encode(topic, [b"half-published"], properties=b""))


def flush_then_die_mid_sync(cfg, topic):
    """Append, then die inside the flush round's fdatasync, holding the
    flush lock, before it published ``flushed_pos``."""
    store, cb = attach(cfg)
    store.append(encode(topic, [b"unflushed"], properties=b""))
    store.cl.flush = lambda begin, end: die()
    store.flush_commitlog()


def take_lock_then_die(cfg):
    """Die holding the semaphore before recording itself as holder."""
    store, cb = attach(cfg)
    cb.set_flag(LOCKING, True)
    cb.sem.acquire()
    die()


def wait_for_wakeup(store_dir, ready, result):
    cb = ControlBlock.attach(store_dir)
    cb.register(4)
    cb.set_flag(WANT_PUBLISH, True)
    ready.set()
    t0 = time.monotonic()
    woke = cb.wait(10)
    result.put((woke, cb.slot, time.monotonic() - t0))
    cb.close()


def writer(cfg, writer_id, n, topics, sync, out):
    """Append n single messages round-robin over topics' queue 0..1 and report
    (topic, qid, queue offset, body) of each."""
    store, cb = attach(cfg)
    rows = []
    for i in range(n):
        topic = topics[i % len(topics)]
        body = f"{writer_id}:{i}".encode()
        r = store.append(encode(topic, [body], queue_ids=i % 2,
                                properties=properties_bytes(tags=f"w{writer_id}")))
        if sync:
            assert wait_flushed(store, cb, r.end)
        rows.append((topic, i % 2, r.queue_offset, body))
    out.put(rows)
    cb.close()


# ------------------------------------------------------------- crash tests
CRASH_TOPICS = ("CrashA", "CrashB")
WRITER_APPENDS_MAX = 200_000
WRITER_SECONDS_MAX = 120


def crash_owner(cfg, ready, stop):
    """Own the store; supervise (repair, restart the flusher) until stopped or killed."""
    from shmq.broker.shared_store import StoreOwner
    o = StoreOwner(cfg)
    o.open()
    pid_file = os.path.join(cfg.storePathRootDir, "flusher.pid")
    last = None
    ready.set()
    while not stop.is_set():
        o.supervise()
        if o.flusher.pid != last:
            last = o.flusher.pid
            with open(pid_file + ".tmp", "w") as f:
                f.write(str(last))
            os.replace(pid_file + ".tmp", pid_file)
        time.sleep(0.02)
    o.close()


def crash_writer(cfg, wid, ack_path, sync):
    """Append small batches until killed; after each acknowledged batch append
    "first last" (sequence numbers) to ack_path."""
    import random

    from shmq.ipc.control import NotRunning
    rng = random.Random(wid)
    deadline = time.monotonic() + WRITER_SECONDS_MAX
    while True:
        try:
            store, cb = attach(cfg)
            break
        except NotRunning:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    seq = 0
    while seq < WRITER_APPENDS_MAX and time.monotonic() < deadline:
        n = rng.randint(1, 4)
        bodies = [f"{wid}:{seq + i}:".encode() + b"p" * rng.randint(0, 600) for i in range(n)]
        r = store.append(encode(CRASH_TOPICS[seq % 2], bodies, queue_ids=wid % 3,
                                properties=properties_bytes(tags=f"w{wid}", keys=f"{wid}-{seq}")))
        if not sync or wait_flushed(store, cb, r.end):
            os.write(fd, f"{seq} {seq + n - 1}\n".encode())
        seq += n


def owner_reports_flusher_then_waits(cfg, conn):
    """Own the store, report the flusher's pid, then wait to be killed."""
    from shmq.broker.shared_store import StoreOwner
    o = StoreOwner(cfg)
    o.open()
    o.wait_flusher_ready()
    conn.send(o.flusher.pid)
    time.sleep(WRITER_SECONDS_MAX)


def attached_writer(cfg, go, out):
    """Attach and append once, then (when told) try again and report how it went."""
    store, cb = attach(cfg)
    store.append(encode("Stale", [b"first"], properties=b""))
    out.put("attached")
    go.wait(120)
    try:
        store.append(encode("Stale", [b"from a stale process"], properties=b""))
        out.put("appended")
    except Exception as e:   # the outcome is the test's to judge
        out.put(type(e).__name__)


def hold_lock_without_a_slot_then_die(store_dir):
    """Take the append lock through a block this process never registered in."""
    cb = ControlBlock.attach(store_dir)
    cb.lock.acquire()
    die()


# ----------------------------------------------- claims (test_claims.py)
def claim_writer(cfg, wid, n, topics, queues, out):
    """Append n single messages "wid:i", round-robin over topics x queues,
    and report (topic, qid, queue offset, i) of each."""
    store, cb = attach(cfg)
    rows = []
    for i in range(n):
        topic, qid = topics[i % len(topics)], (i // len(topics)) % queues
        r = store.append(encode(topic, [f"{wid}:{i}".encode()], queue_ids=qid,
                                properties=properties_bytes(tags=f"w{wid}")))
        rows.append((topic, qid, r.queue_offset, i))
    out.put((wid, rows))
    cb.close()


def claim_then_hang_mid_write(cfg, topic, body_bytes, ready):
    """Append one message normally; then claim a second, write the first half
    of its record, say so and hang there (until the test kills it)."""
    from shmq.core.state import E_PHY, RING_ENTRIES
    store, cb = attach(cfg)
    store.append(encode(topic, [b"kept"], properties=b""))
    batch = encode(topic, [b"lost-" + b"x" * body_bytes], properties=b"")

    def hook(stage, seq):
        if stage == "claimed":
            phy = int(store.state.ring[seq % RING_ENTRIES, E_PHY])
            store.cl.ensure_segment(store.cl.segment_start(phy))   # (on a roll: maybe new)
            store.cl.write(phy, batch.buf[:batch.nbytes // 2])   # unstamped: half a record
            ready.set()
            time.sleep(WRITER_SECONDS_MAX)

    store.hook = hook
    store.append(batch)


def append_after(cfg, topic, bodies, written, go, out):
    """Append ``bodies`` one by one; with ``written`` given, the first stops
    once written (not yet published), says so and waits for ``go``.
    Reports (queue offset, phy) of each."""
    store, cb = attach(cfg)
    if written is not None:
        def hook(stage, seq):
            if stage == "written":
                store.hook = None
                written.set()
                go.wait(WRITER_SECONDS_MAX)
        store.hook = hook
    rows = []
    for body in bodies:
        r = store.append(encode(topic, [body], properties=b""))
        rows.append((r.queue_offset, r.phy_offset))
    out.put(rows)
    cb.close()


def die_mid_claim(cfg, topic):
    """Take the append lock and die halfway through a claim: claim_pos and
    the queue's claim_next moved, claim_seq (which makes a claim) not."""
    from shmq.core.state import I_CLAIM_POS
    store, cb = attach(cfg)
    store.append(encode(topic, [b"before"], properties=b""))
    st = store.state
    slot = st.queue_slot(topic, 0)
    cb.lock.acquire()
    st.words[I_CLAIM_POS] += 1000
    st.queue_claim[slot] += 5
    die()


def lock_is_free(cb) -> bool:
    """The append lock can be taken (then given back): released, whatever
    else takes it for a moment meanwhile (the flusher registering as it
    starts). Its value alone is a race with those."""
    import posix_ipc
    try:
        cb.sem.acquire(30)
    except posix_ipc.BusyError:
        return False
    cb.sem.release()
    return True
