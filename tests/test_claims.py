"""Appends that proceed in parallel: claim, write, publish (``core/store.py``).

Real processes on one store (shared memory, real files, real ``kill -9``):
concurrent appenders fill dense queues in every producer's order; an
appender killed in the middle of its write, with later claims finished by
another process, leaves a PAD record and a queue hole that pulls skip, and
recovery (normal, abnormal, from the CommitLog alone) gives the same store
back; the last claim of a dead process is rolled back; a write that fails is
padded or rolled back by its own process; a process that dies mid-claim
holding the lock leaves nothing behind.
"""
from __future__ import annotations

import errno
import os
import shutil
import threading
import time

import pytest

import procs
from procs import lock_is_free
from conftest import SMALL_SEGMENT, small_config
from shmq.broker.shared_store import StoreOwner
from shmq.core import _kernels as K
from shmq.core import layout as L
from shmq.core.records import encode
from shmq.core.state import (E_END, E_PHY, E_Q0, E_START, I_CLAIM_POS, I_CLAIM_SEQ,
                             I_PUBLISH_SEQ, RING_ENTRIES)
from shmq.core.store import GetMessageStatus, close_clean, open_local

CTX = procs.context()
WAIT_S = 120


@pytest.fixture
def owner(store_dir):
    o = StoreOwner(small_config(store_dir), mp_context=CTX)
    o.open()
    yield o
    if o.cb is not None:
        o.close()


def snapshot(store, queues) -> dict:
    """(topic, qid) → (max offset, [(queue offset, body)] of every message)."""
    out = {}
    for topic, qid in queues:
        msgs = store.read_queue(topic, qid)      # decodes every record, CRC checked
        out[(topic, qid)] = (store.max_offset(topic, qid),
                             [(m.queue_offset, m.body) for m in msgs])
    return out


def reopen_three_ways(cfg, queues, want, pads):
    """Normal recovery, abnormal recovery (abort left), and a rebuild of the
    ConsumeQueues from the CommitLog alone give ``want`` back. The first two
    read only past the checkpoint (issue 20), where no pad lies; the rebuild
    reads the CommitLog from its first byte and meets each of the ``pads``."""
    store, report = open_local(cfg)
    assert report.mode == "normal" and report.bytes_truncated == 0
    assert snapshot(store, queues) == want
    store.close()                                  # no clean shutdown: abort stays
    store, report = open_local(cfg)
    assert report.mode == "abnormal" and report.offset_anomalies == 0
    assert snapshot(store, queues) == want
    close_clean(store)
    shutil.rmtree(os.path.join(cfg.storePathRootDir, "consumequeue"))
    store, report = open_local(cfg)
    assert report.scan_from == 0 and report.pads == pads and report.offset_anomalies == 0
    assert snapshot(store, queues) == want
    close_clean(store)


def entry(store, seq: int, field: int) -> int:
    return int(store.state.ring[seq % RING_ENTRIES, field])


def wait_until(cond, what: str):
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


# ----------------------------------------------------------- in parallel
def test_concurrent_appenders_fill_dense_queues_in_each_producers_order(owner):
    writers, n = 4, 300
    topics, nq = ("ParA", "ParB"), 2
    out = CTX.Queue()
    ps = [CTX.Process(target=procs.claim_writer, args=(owner.config, w, n, topics, nq, out))
          for w in range(writers)]
    for p in ps:
        p.start()
    reported = dict(out.get(timeout=WAIT_S) for _ in ps)
    for p in ps:
        p.join(WAIT_S)
        assert p.exitcode == 0
    store = owner.store
    queues = [(t, q) for t in topics for q in range(nq)]
    seen = set()
    for key in queues:
        msgs = store.read_queue(*key)
        assert [m.queue_offset for m in msgs] == list(range(len(msgs))), key   # dense
        assert store.max_offset(*key) == len(msgs)
        at = {}
        for m in msgs:
            wid, i = map(int, m.body.split(b":"))
            assert (wid, i) not in seen
            seen.add((wid, i))
            at[(wid, i)] = m.queue_offset
        for w in range(writers):                                            # producer order
            mine = [i for (wid, i) in sorted(at, key=at.get) if wid == w]
            assert mine == sorted(mine), (key, w)
        for w, rows in reported.items():
            for topic, qid, qoff, i in rows:
                if (topic, qid) == key:
                    assert at[(w, i)] == qoff
    assert len(seen) == writers * n
    w = store.state.words
    assert w[I_PUBLISH_SEQ] == w[I_CLAIM_SEQ] == writers * n
    assert w[I_CLAIM_POS] == store.state.write_pos > SMALL_SEGMENT     # rolled, in parallel
    want = snapshot(store, queues)
    owner.close()
    reopen_three_ways(owner.config, queues, want, pads=0)


# --------------------------------------------------- a writer killed mid-write
def start_hanging_writer(owner, topic, body_bytes=3000):
    ready = CTX.Event()
    a = CTX.Process(target=procs.claim_then_hang_mid_write,
                    args=(owner.config, topic, body_bytes, ready))
    a.start()
    assert ready.wait(WAIT_S), "the writer did not claim"
    seq = owner.store.state.words[I_CLAIM_SEQ] - 1
    st = owner.store
    return a, seq, (entry(st, seq, E_START), entry(st, seq, E_PHY), entry(st, seq, E_END))


def kill(p):
    os.kill(p.pid, 9)
    p.join(WAIT_S)
    assert p.exitcode == -9


def check_pad(store, topic, phy, end, q0):
    seg = store.cl.segment_start(phy)
    assert L.read_pad(store.cl.map(seg), phy - seg, seg) == L.Pad(phy, end - phy, topic, 0, q0, 1)
    assert not store.cl.map(seg)[phy - seg + L.PAD_FIXED_BYTES + len(topic):end - seg].any()
    assert store.cqs.unit(topic, 0, q0) == (0, K.CQ_PAD_SIZE, 0)   # a padding unit: a hole


def check_pull_skips_the_hole(store, topic, q0, next_phy):
    r = store.get_message(topic, 0, q0, 32)                  # a pull at the hole moves past it
    assert r.status is GetMessageStatus.FOUND and int(r.phys[0]) == next_phy
    r = store.get_message(topic, 0, 0, 32)
    assert r.status is GetMessageStatus.FOUND and r.count == store.max_offset(topic, 0) - 1


def test_a_writer_killed_mid_write_is_padded_by_the_appender_waiting_behind_it(owner):
    a, seq, (start, phy, end) = start_hanging_writer(owner, "Pad")
    assert start == phy                                     # no roll here
    out = CTX.Queue()
    bodies = [b"after-%d" % i for i in range(3)]
    b = CTX.Process(target=procs.append_after, args=(owner.config, "Pad", bodies, None, None, out))
    b.start()
    wait_until(lambda: owner.store.state.words[I_CLAIM_SEQ] > seq + 1, "B did not claim")
    assert owner.store.max_offset("Pad", 0) == 1            # B waits for A's claim
    kill(a)                                                 # no supervise: B repairs A's claim
    rows = out.get(timeout=WAIT_S)
    b.join(WAIT_S)
    assert [q for q, _ in rows] == [2, 3, 4] and rows[0][1] == end
    store = owner.store
    check_pad(store, "Pad", phy, end, 1)
    check_pull_skips_the_hole(store, "Pad", 1, end)
    assert [m.body for m in store.read_queue("Pad", 0)] == [b"kept", *bodies]
    assert store.max_offset("Pad", 0) == 5
    want = snapshot(store, [("Pad", 0)])
    owner.supervise()                                       # frees the slots
    owner.close()
    reopen_three_ways(owner.config, [("Pad", 0)], want, pads=1)


def test_the_owner_pads_a_dead_writers_claim_and_the_later_claim_publishes(owner):
    a, seq, (start, phy, end) = start_hanging_writer(owner, "Boss")
    written, go, out = CTX.Event(), CTX.Event(), CTX.Queue()
    bodies = [b"later-%d" % i for i in range(3)]
    b = CTX.Process(target=procs.append_after,
                    args=(owner.config, "Boss", bodies, written, go, out))
    b.start()
    assert written.wait(WAIT_S), "B did not write"          # B's claim is DONE, unpublished
    kill(a)
    done = owner.supervise()
    assert any("1 padded" in d for d in done), done
    st = owner.store.state
    assert st.write_pos == end and owner.store.max_offset("Boss", 0) == 2   # the pad is published
    assert st.words[I_PUBLISH_SEQ] == seq + 1 < st.words[I_CLAIM_SEQ]        # B's claim is not
    go.set()
    rows = out.get(timeout=WAIT_S)
    b.join(WAIT_S)
    assert [q for q, _ in rows] == [2, 3, 4]
    store = owner.store
    check_pad(store, "Boss", phy, end, 1)
    check_pull_skips_the_hole(store, "Boss", 1, end)
    assert [m.body for m in store.read_queue("Boss", 0)] == [b"kept", *bodies]
    want = snapshot(store, [("Boss", 0)])
    owner.close()
    reopen_three_ways(owner.config, [("Boss", 0)], want, pads=1)


def fill_segment_to(store, left: int) -> None:
    """Append filler records (topic Fill) until ``left`` bytes remain in the segment."""
    seg = store.config.mappedFileSizeCommitLog
    empty = L.record_size(0, 4, 0)
    while True:
        room = seg - store.state.write_pos % seg - left
        assert room >= 0
        if room == 0:
            return
        size = min(room, 6000)
        if 0 < room - size < 2 * empty:     # never leave less than a record's room
            size = room // 2
        store.append(encode("Fill", [b"f" * (size - empty)], properties=b""))


def test_the_last_claim_of_a_dead_writer_is_rolled_back_with_its_segment_roll(owner):
    store = owner.store
    kept = L.record_size(4, 4, 0)                           # "kept" in topic Last
    fill_segment_to(store, kept + 1000)                     # A's 3 KB claim must roll
    a, seq, (start, phy, end) = start_hanging_writer(owner, "Last")
    assert phy == start - start % SMALL_SEGMENT + SMALL_SEGMENT > start   # rolled
    written = store.cl.map(phy)[:100].any()
    kill(a)
    done = owner.supervise()
    assert any("1 rolled back" in d for d in done), done
    st = store.state
    assert st.words[I_CLAIM_POS] == st.write_pos == start and st.words[I_CLAIM_SEQ] == seq
    assert written and not store.cl.map(phy)[:end - phy].any()   # its half record is gone
    old = store.cl.map(start - start % SMALL_SEGMENT)
    assert not old[start % SMALL_SEGMENT:].any()                   # and its blank
    r = store.append(encode("Last", [b"next"], properties=b""))
    assert (r.phy_offset, r.queue_offset) == (start, 1)            # the range is handed out again
    want = snapshot(store, [("Last", 0)])
    assert [b for _, b in want[("Last", 0)][1]] == [b"kept", b"next"]
    owner.close()
    reopen_three_ways(owner.config, [("Last", 0)], want, pads=0)


def test_a_lock_holder_that_dies_mid_claim_leaves_nothing_claimed(owner):
    p = CTX.Process(target=procs.die_mid_claim, args=(owner.config, "Half"))
    p.start()
    p.join(WAIT_S)
    assert p.exitcode == -9
    st = owner.store.state
    end = st.write_pos
    assert st.words[I_CLAIM_POS] == end + 1000
    done = owner.supervise()
    assert any("died holding the append lock" in d for d in done), done
    assert st.words[I_CLAIM_POS] == end and lock_is_free(owner.cb)
    r = owner.store.append(encode("Half", [b"next"], properties=b""))
    assert (r.phy_offset, r.queue_offset) == (end, 1)


def test_a_full_ring_makes_the_claimant_wait_for_the_publishers(store_dir, monkeypatch):
    """With RING_ENTRIES claims in flight (here 2) the next claimant waits
    until the oldest is published, then claims."""
    from shmq.core import store as store_mod
    monkeypatch.setattr(store_mod, "RING_ENTRIES", 2)
    store, _ = open_local(small_config(store_dir))
    w = store.state.words
    written, go, results = threading.Event(), threading.Event(), {}

    def first_waits(stage, seq):
        if stage == "written" and seq == 0:
            written.set()
            assert go.wait(WAIT_S)

    def put(name):
        results[name] = store.append(encode("Ring", [name.encode()], properties=b""))

    store.hook = first_waits
    threads = [threading.Thread(target=put, args=(name,)) for name in ("a", "b", "c")]
    threads[0].start()
    assert written.wait(WAIT_S)
    threads[1].start()
    wait_until(lambda: w[I_CLAIM_SEQ] == 2, "b did not claim")
    threads[2].start()
    time.sleep(0.2)
    assert w[I_CLAIM_SEQ] == 2 and w[I_PUBLISH_SEQ] == 0   # c waits: the ring is full
    go.set()
    for t in threads:
        t.join(WAIT_S)
    assert sorted(r.queue_offset for r in results.values()) == [0, 1, 2]
    assert w[I_PUBLISH_SEQ] == w[I_CLAIM_SEQ] == 3
    assert [m.body for m in store.read_queue("Ring", 0)] == [b"a", b"b", b"c"]
    close_clean(store)


# ------------------------------------------------------ a write that fails
def fail_a_write_with_a_later_claim(store, topic):
    """Append to ``topic`` with a write that fails (ENOSPC) while a later
    append (another thread) has claimed after it. Returns (phy of the failed
    claim, the later append's result)."""
    w = store.state.words
    real_write = store.cl.write
    failing, later = [], []

    def hook(stage, seq):
        if stage != "claimed":
            return
        store.hook = None
        failing.append(entry(store, seq, E_PHY))
        t = threading.Thread(target=lambda: later.append(
            store.append(encode(topic, [b"second"], properties=b""))))
        t.start()
        later.append(t)
        wait_until(lambda: w[I_CLAIM_SEQ] == seq + 2, "the later append did not claim")

    def write(phy, data):
        if failing and phy == failing[0] and len(failing) == 1:
            failing.append("failed")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(phy, data)

    store.cl.write = write
    store.hook = hook
    with pytest.raises(OSError, match="No space"):
        store.append(encode(topic, [b"lost"], properties=b""))
    later[0].join(WAIT_S)
    store.cl.write = real_write
    return failing[0], later[1]


def test_a_failed_write_with_a_later_claim_is_padded_by_its_own_process(store_dir):
    """ENOSPC in the write of a claim that is not the last: the failing
    appender pads it and gives it up (the caller sees the error); the later
    appender publishes the pad and then its own claim."""
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    store.append(encode("E", [b"first"], properties=b""))
    phy, r = fail_a_write_with_a_later_claim(store, "E")
    assert r.queue_offset == 2 and r.phy_offset > phy
    check_pad(store, "E", phy, r.phy_offset, 1)
    check_pull_skips_the_hole(store, "E", 1, r.phy_offset)
    w = store.state.words
    assert w[I_PUBLISH_SEQ] == w[I_CLAIM_SEQ] == 3
    want = snapshot(store, [("E", 0)])
    assert [b for _, b in want[("E", 0)][1]] == [b"first", b"second"]
    close_clean(store)
    reopen_three_ways(cfg, [("E", 0)], want, pads=1)


def test_inspect_verify_walks_over_a_pad_and_its_hole(store_dir, capsys):
    from shmq.tools.cli import main
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    store.append(encode("V", [b"first"], properties=b""))
    fail_a_write_with_a_later_claim(store, "V")
    store.append(encode("V", [b"third"], properties=b""))
    close_clean(store)
    code = main(["store", "inspect", store_dir, "--verify"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    code = main(["store", "inspect", store_dir, "-t", "V", "-q", "0"])
    out, err = capsys.readouterr()
    assert code == 0 and "padding unit" in out and "third" in out, out + err
