"""The flusher's loop, driven pass by pass with an injected clock (no sleeps)."""
from __future__ import annotations

import os
import threading

from conftest import SMALL_SEGMENT, small_config
from shmq.broker.flusher import Flusher
from shmq.core.checkpoint import Checkpoint
from shmq.core.files import REAL_FILES
from shmq.core.records import encode
from shmq.core.store import open_local


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def advance(self, ms):
        self.t += ms / 1000


def setup(store_dir, **kw):
    clock = Clock()
    store, _ = open_local(small_config(store_dir, **kw))
    return store, Flusher(store, cb=None, clock=clock), clock


def put(store, nbytes):
    return store.append(encode("F", [b"x" * nbytes], properties=b""))


def test_async_flush_waits_for_enough_dirty_pages_or_the_thorough_interval(store_dir):
    store, f, clock = setup(store_dir)          # 500 ms interval, 4 pages, 10 s thorough
    f.step()                                    # first pass at t0
    put(store, 100)
    clock.advance(500)
    f.step()
    assert store.state.flushed_pos == 0         # 1 dirty page < flushCommitLogLeastPages
    r = put(store, 5 * 4096)
    clock.advance(499)
    f.step()
    assert store.state.flushed_pos == 0         # not yet the interval
    clock.advance(1)
    f.step()
    assert store.state.flushed_pos == r.end     # 4+ pages at the interval
    r = put(store, 10)
    clock.advance(9500)
    f.step()
    assert store.state.flushed_pos < r.end
    clock.advance(500)
    f.step()                                    # 10 s since the last flush
    assert store.state.flushed_pos == r.end


def test_sync_flush_answers_a_request_at_once_for_everything_published(store_dir):
    store, f, clock = setup(store_dir, flushDiskType="SYNC_FLUSH")
    f.step()
    a = put(store, 10)
    b = put(store, 10)                          # two waiters, one group commit
    assert store.state.get("flush_request_pos") == b.end
    f.step()                                    # no time passes
    assert store.state.flushed_pos == b.end and f.flushes == 1
    assert store.state.get("flushed_store_ts") == b.store_timestamp
    assert a.end < b.end


def test_a_round_another_process_holds_the_flush_lock_for_is_left_to_it(store_dir):
    """A worker leading its group commit holds the flush lock: the
    flusher's pass does not wait for it (its other duties go on), says it
    was locked out, and the next pass flushes what is left."""
    from shmq.core.files import FlushLock
    store, f, clock = setup(store_dir, flushDiskType="SYNC_FLUSH")
    f.step()
    worker = FlushLock(store.config.commitlog_dir)
    try:
        assert worker.acquire(block=False)
        r = put(store, 10)
        # the pass in a thread: one that waited for the lock would fail the
        # test, not hang it (the lock is released below, which frees it)
        passed = threading.Thread(target=f.step, daemon=True)
        passed.start()
        passed.join(10)
        assert not passed.is_alive(), "the flusher's pass waits for the flush lock's holder"
        assert f.locked_out and store.state.flushed_pos < r.end and f.flushes == 0
        worker.release()
        f.step()
        assert not f.locked_out and store.state.flushed_pos == r.end and f.flushes == 1
    finally:
        worker.close()


def test_an_idle_sync_flush_flusher_sleeps_until_its_interval(store_dir):
    """With nothing to flush a SYNC_FLUSH flusher's next pass is an interval
    away (an append's request wakes it sooner): its timer was never moved on
    once it had passed, so every pass said "due now" and the idle flusher
    spun a whole core (95% CPU in `top`)."""
    store, f, clock = setup(store_dir, flushDiskType="SYNC_FLUSH")   # 500 ms interval
    f.step()
    clock.advance(600)                           # past the interval, nothing written
    for _ in range(3):
        assert f.step() > 0.1                    # a wait, not 0 s again and again
    put(store, 10)                               # an append asks: at once, as before
    assert f.step() >= 0 and store.state.flushed_pos == store.state.write_pos


def test_consume_queues_flush_busy_queues_each_second_and_all_at_the_thorough_interval(store_dir):
    store, f, clock = setup(store_dir)
    st = store.state
    quiet = put(store, 50)                                   # queue F:0, one unit
    for _ in range(500):                                     # queue B:0, 500 units > 2 pages
        store.append(encode("B", [b"b"], properties=b""))
    f.step()
    assert Checkpoint.load(REAL_FILES, store_dir) is None
    clock.advance(1000)
    f.step()
    busy, idle = st.queue_slot("B", 0), st.queue_slot("F", 0)
    assert st.queue_cq_flushed[busy] == 500 and st.queue_cq_flushed[idle] == 0
    ck = Checkpoint.load(REAL_FILES, store_dir)
    assert ck.cl_flushed == st.flushed_pos and ck.cq_flushed == 0   # not every queue yet
    clock.advance(59_000)
    f.step()                                                 # flushConsumeQueueThoroughInterval
    assert st.queue_cq_flushed[idle] == 1
    assert Checkpoint.load(REAL_FILES, store_dir).cq_flushed == st.write_pos > quiet.end


def test_when_every_queue_with_unflushed_units_is_busy_the_checkpoint_advances_each_second(store_dir):
    # the position a recovery after kill -9 or power loss rescans from: a
    # busy broker's would otherwise lag up to the thorough interval (60 s)
    store, f, clock = setup(store_dir)
    st = store.state
    for _ in range(500):                                     # two busy queues, nothing idle
        store.append(encode("B", [b"b"], queue_ids=0, properties=b""))
        store.append(encode("B", [b"b"], queue_ids=1, properties=b""))
    f.step()
    clock.advance(1000)
    f.step()
    ck = Checkpoint.load(REAL_FILES, store_dir)
    assert all(st.queue_cq_flushed[st.queue_slot("B", q)] == 500 for q in range(2))
    assert ck.cq_flushed == ck.cl_flushed == st.write_pos
    put(store, 50)                                           # a unit left dirty holds it back
    clock.advance(1000)
    f.step()
    assert Checkpoint.load(REAL_FILES, store_dir).cq_flushed == ck.cq_flushed < st.write_pos


def test_the_next_segment_exists_before_the_writer_needs_it(store_dir):
    """From the first append to a segment the one after it is prepared: the
    append that made a new store's first segment wakes the flusher, as an
    append that rolls does, to prepare the next one."""
    store, f, clock = setup(store_dir)
    woken = []
    store.on_flush_request = lambda: woken.append(store.state.write_pos)
    nxt = os.path.join(store_dir, "commitlog", f"{SMALL_SEGMENT:020d}")
    f.step()
    assert f._preparing is None                 # nothing written: nothing made ahead
    put(store, 100)
    assert len(woken) == 1                      # it made segment 0
    put(store, 100)
    assert len(woken) == 1                      # ASYNC_FLUSH, no roll: the flusher sleeps on
    f.step()
    f._preparing.join()
    assert os.path.getsize(nxt) == SMALL_SEGMENT
    while store.state.write_pos < SMALL_SEGMENT:    # roll into it: the roll wakes the flusher
        put(store, 4000)
    assert len(woken) == 2 and woken[1] > SMALL_SEGMENT
    f.step()
    f._preparing.join()
    assert os.path.exists(os.path.join(store_dir, "commitlog", f"{2 * SMALL_SEGMENT:020d}"))


def test_finish_flushes_everything(store_dir):
    store, f, clock = setup(store_dir)
    r = put(store, 10)
    f.finish()
    assert store.state.flushed_pos == r.end
    assert Checkpoint.load(REAL_FILES, store_dir).cl_flushed == r.end


def test_the_flush_meter_counts_messages_at_most_every_interval_and_all_before_it_sleeps(
        store_dir, tmp_path):
    """Every round counts an fdatasync; the messages they made durable are
    summed over the queues (a read of every queue) at a round at most every
    COUNT_EVERY_S, and the rest when the flusher is about to sleep, so the
    gauge is exact whenever the flusher is idle."""
    from shmq.broker.stats import COUNT_EVERY_S, FlushMeter
    from shmq.ipc.counters import Counters, Tally, counters_bytes
    store, f, clock = setup(store_dir, flushDiskType="SYNC_FLUSH")
    c = Counters(bytearray(counters_bytes(2)), str(tmp_path), 2)
    put(store, 10)                                # stored before the meter: not counted
    meter = FlushMeter(store, None, clock=clock)
    meter.tally = Tally(c, 0)
    f.on_flush, f.on_idle = meter, meter.settle
    for i in range(3):                            # three rounds, one interval
        put(store, 10)
        put(store, 10)
        f.step()
    assert (c.gauge("fdatasyncs"), c.gauge("flushed_msgs")) == (3, 2)   # counted at the first
    meter.settle()                                # (the loop, before it sleeps)
    assert c.gauge("flushed_msgs") == 6
    meter.settle()
    assert c.gauge("flushed_msgs") == 6           # nothing more since
    put(store, 10)
    clock.advance(COUNT_EVERY_S * 1000 + 1)
    f.step()
    assert (c.gauge("fdatasyncs"), c.gauge("flushed_msgs")) == (4, 7)   # the interval passed
    put(store, 10)                                # appended, no round yet: not flushed
    meter.settle()
    assert c.gauge("flushed_msgs") == 7
    store.flush_commitlog()                       # a worker's round (its own meter counts
    meter.settle()                                # the fdatasync): the flusher counts the
    assert (c.gauge("fdatasyncs"), c.gauge("flushed_msgs")) == (4, 8)   # messages
