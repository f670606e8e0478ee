"""Several real processes on one store: the control block, the append lock,
repair of a holder that died, wake-ups."""
from __future__ import annotations

import errno
import os
import time

import pytest

import procs
from procs import lock_is_free
from conftest import small_config
from shmq.broker.shared_store import StoreOwner
from shmq.broker.shared_store import attach as attach_store
from shmq.core.records import encode
from shmq.core.store import open_local
from shmq.core.files import StoreInUse, StoreLock
from shmq.ipc.control import ControlBlock, NotRunning, names, unlink_names

CTX = procs.context()


def run(target, *args):
    p = CTX.Process(target=target, args=args)
    p.start()
    p.join(120)
    assert p.exitcode is not None, "child hung"
    return p.exitcode


@pytest.fixture
def owner(store_dir):
    o = StoreOwner(small_config(store_dir), mp_context=CTX)
    o.open()
    yield o
    o.close()


def test_each_store_path_has_its_own_names(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    os.symlink(a, tmp_path / "link")
    assert names(str(a)) != names(str(b))
    assert names(str(a)) == names(str(tmp_path / "link"))   # same store, same block


def test_a_second_owner_is_refused(store_dir):
    first = StoreLock(store_dir)
    with pytest.raises(StoreInUse, match=f"pid {os.getpid()}"):
        StoreLock(store_dir)
    first.release()
    StoreLock(store_dir).release()


def test_a_tool_cannot_open_a_store_a_broker_owns(owner):
    """open_local would run recovery (truncation) under a live broker."""
    with pytest.raises(StoreInUse, match="in use"):
        open_local(owner.config)


def test_attach_needs_a_live_owner(store_dir):
    with pytest.raises(NotRunning, match="not open"):
        ControlBlock.attach(store_dir)


def _shm_inodes(store_dir) -> list[int]:
    """Inodes of the store's shared memory and semaphore in /dev/shm (absent: none)."""
    shm, sem, _ = names(store_dir)
    return [os.stat(p).st_ino for p in (f"/dev/shm{shm}", f"/dev/shm/sem.{sem[1:]}")
            if os.path.exists(p)]


def test_a_block_left_by_a_dead_owner_is_stale_and_replaced(store_dir):
    """... and the restart reclaims it: the names are the new owner's, the
    dead owner's block is gone, and the clean stop leaves none."""
    cfg = small_config(store_dir)
    assert run(_owner_dies, cfg) == -9
    with pytest.raises(NotRunning, match="stale"):
        ControlBlock.attach(store_dir)
    left = _shm_inodes(store_dir)
    assert len(left) == 2                        # kill -9: nobody unlinked them
    with StoreOwner(cfg, mp_context=CTX) as o:   # recovers and makes a new block
        assert o.report.mode == "abnormal"
        assert o.store.read_queue("Stale", 0)[0].body == b"before death"
        ControlBlock.attach(store_dir).close()
        now = _shm_inodes(store_dir)
        assert len(now) == 2 and not set(now) & set(left)
    assert _shm_inodes(store_dir) == []


def test_a_stop_whose_flush_fails_still_gives_back_the_shared_memory(owner, monkeypatch):
    """It raises and leaves ``abort`` for the next start's recovery, but the
    block, the semaphore and the store lock go: nothing else would give
    them back before the store's next start (a disk failure injected at
    the stop's flush)."""
    from shmq.broker import shared_store
    from shmq.core.checkpoint import abort_path

    def disk_full(store):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(shared_store, "flush_all", disk_full)
    assert len(_shm_inodes(owner.root)) == 2
    with pytest.raises(OSError, match="No space left"):
        owner.close()
    assert _shm_inodes(owner.root) == []
    assert os.path.exists(abort_path(owner.root))
    StoreLock(owner.root).release()                   # free: no StoreInUse


def _owner_dies(cfg):
    o = StoreOwner(cfg, mp_context=CTX)
    o.open()
    o.store.append(encode("Stale", [b"before death"], properties=b""))
    procs.die()


def test_the_flusher_dies_with_its_owner(store_dir):
    """An orphaned flusher could checkpoint or delete files from a stale
    control block while a new owner recovers the store."""
    a, b = CTX.Pipe()
    p = CTX.Process(target=procs.owner_reports_flusher_then_waits, args=(small_config(store_dir), b))
    p.start()
    flusher = a.recv()
    os.kill(p.pid, 9)
    p.join(30)
    unlink_names(store_dir)   # no owner comes after it to reclaim them: the store is deleted
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{flusher}") and time.monotonic() < deadline:
        time.sleep(0.02)   # killed by the kernel (PR_SET_PDEATHSIG), reaped by init
    state = open(f"/proc/{flusher}/stat").read().split()[2] if os.path.exists(f"/proc/{flusher}") else "gone"
    assert state in ("gone", "Z"), f"flusher {flusher} still running ({state})"


def test_a_writer_killed_mid_write_is_rolled_back(owner):
    assert run(procs.append_then_die_mid_write, owner.config, "Mid") == -9
    st = owner.store.state
    published = st.write_pos
    done = owner.supervise()
    assert any("1 rolled back" in d for d in done)
    assert st.write_pos == published and owner.store.max_offset("Mid", 0) == 1
    seg = owner.store.cl.map(0)
    assert not seg[published:published + 4096].any()   # the half record is gone
    r = owner.store.append(encode("Mid", [b"next"], properties=b""))   # the lock is free
    assert (r.phy_offset, r.queue_offset) == (published, 1)
    assert [m.body for m in owner.store.read_queue("Mid", 0)] == [b"kept", b"next"]


def test_a_writer_killed_after_writing_is_rolled_forward(owner):
    assert run(procs.append_then_die_after_write, owner.config, "Fwd") == -9
    assert owner.store.max_offset("Fwd", 0) == 0      # written, not yet published
    done = owner.supervise()
    assert any("1 rolled forward" in d for d in done)
    assert [m.body for m in owner.store.read_queue("Fwd", 0)] == [b"published"]
    assert owner.store.append(encode("Fwd", [b"next"], properties=b"")).queue_offset == 1


def test_a_writer_killed_inside_its_publish_is_rolled_forward(owner):
    """Killed between the first position its publish wrote (write_pos) and
    the last (publish_seq): the repair publishes the claim from its ring
    entry all the same — the positions it finds are the claim's own ends,
    not a broken order (a CI run's boss died of that assertion, with a
    direct producer killed at a random point) — and appends go on after it."""
    assert run(procs.append_then_die_mid_publish, owner.config, "Mid") == -9
    st = owner.store.state
    assert owner.store.max_offset("Mid", 0) == 0 and st.write_pos > 0   # half published
    done = owner.supervise()
    assert any("1 rolled forward" in d for d in done)
    assert [m.body for m in owner.store.read_queue("Mid", 0)] == [b"half-published"]
    r = owner.store.append(encode("Mid", [b"next"], properties=b""))
    assert r.queue_offset == 1 and r.phy_offset == st.write_pos - (r.end - r.phy_offset)
    assert [m.body for m in owner.store.read_queue("Mid", 0)] == [b"half-published", b"next"]


def test_a_process_killed_inside_its_flush_round_leaves_the_flush_to_the_next(owner):
    """A flush round's holder (a worker leading its group commit) killed
    in its fdatasync: nothing was published for it, and the flush lock is
    the kernel's to drop (an flock), so the next round takes it at once and
    makes the append durable — no repair, no wait."""
    st = owner.store.state
    before = st.flushed_pos
    assert run(procs.flush_then_die_mid_sync, owner.config, "Flushed") == -9
    assert st.flushed_pos == before < st.write_pos
    assert owner.store.flush_commitlog(block=False) == st.write_pos == st.flushed_pos


def test_one_flush_round_at_a_time(owner):
    """Two holders of the flush lock exclude each other, in one process or
    two: ``flushed_pos`` has one writer at a time."""
    from shmq.core.files import FlushLock
    other = FlushLock(owner.config.commitlog_dir)
    try:
        assert other.acquire(block=False)
        owner.store.append(encode("Round", [b"x"], properties=b""))
        assert owner.store.flush_commitlog(block=False) == -1
        assert owner.store.state.flushed_pos < owner.store.state.write_pos
        other.release()
        assert owner.store.flush_commitlog(block=False) == owner.store.state.write_pos
    finally:
        other.close()


def test_a_forked_child_does_not_share_its_parents_flush_lock(owner):
    """A child forked while its parent holds the flush lock has the
    parent's open file, which the flock belongs to: the child must not
    take the lock through it (two rounds at once), nor keep it held after
    the parent let go of it."""
    from shmq.core.files import FlushLock
    lock = FlushLock(owner.config.commitlog_dir)
    try:
        assert lock.acquire(block=False)
        pid = os.fork()
        if pid == 0:                                  # the child
            took = lock.acquire(block=False)
            os._exit(3 if took else 0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0     # refused: the parent holds it
        lock.release()
        pid = os.fork()
        if pid == 0:
            took = lock.acquire(block=False)
            os._exit(0 if took else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0     # free once the parent let go
        assert lock.acquire(block=False)
        lock.release()
    finally:
        lock.close()


def test_a_process_that_died_between_acquiring_and_recording_releases_the_lock(owner):
    assert run(procs.take_lock_then_die, owner.config) == -9
    assert owner.cb.sem.value == 0
    done = owner.supervise()
    assert any("died holding the append lock: none" in d for d in done)
    assert lock_is_free(owner.cb)


def test_wakeups_reach_a_waiting_process(owner):
    ready, result = CTX.Event(), CTX.Queue()
    p = CTX.Process(target=procs.wait_for_wakeup, args=(owner.root, ready, result))
    p.start()
    assert ready.wait(60)
    owner.store.append(encode("Wake", [b"x"], properties=b""))   # on_published wakes flagged
    woke, slot, waited = result.get(timeout=30)
    p.join(30)
    assert woke and waited < 5


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_concurrent_writers_get_dense_unique_offsets(store_dir, flush):
    """Under SYNC_FLUSH the flusher is held (SIGSTOP) until every writer's
    first send waits, so one round makes them all durable: group commit
    is seen whatever the scheduling (a busy CI machine once ran the
    writers one after the other, a round each)."""
    import signal
    sync = flush == "SYNC_FLUSH"
    cfg = small_config(store_dir, flushDiskType=flush, syncFlushTimeout=60_000)
    n, writers = 300, 4
    with StoreOwner(cfg, mp_context=CTX) as o:
        o.wait_flusher_ready()
        out = CTX.Queue()
        ps = [CTX.Process(target=procs.writer, args=(cfg, w, n, ["A", "B"], sync, out))
              for w in range(writers)]
        if sync:
            os.kill(o.flusher.pid, signal.SIGSTOP)
        try:
            for p in ps:
                p.start()
            deadline = time.monotonic() + 60
            while sync and o.store.state.get("publish_seq") < writers:
                assert time.monotonic() < deadline, "the writers' first sends never came"
                time.sleep(0.01)
        finally:
            if sync:
                os.kill(o.flusher.pid, signal.SIGCONT)
        rows = [r for _ in ps for r in out.get(timeout=120)]
        for p in ps:
            p.join(30)
        flushes = o.store.state.get("flush_seq")
    store, report = open_local(cfg)
    assert report.mode == "normal" and report.bytes_truncated == 0
    for topic in "AB":
        for qid in (0, 1):
            msgs = store.read_queue(topic, qid)
            assert [m.queue_offset for m in msgs] == list(range(len(msgs)))
            sent = {(q, body) for t, qq, q, body in rows if (t, qq) == (topic, qid)}
            assert {(m.queue_offset, m.body) for m in msgs} == sent
    assert len(rows) == n * writers
    if flush == "SYNC_FLUSH":   # group commit: fewer fdatasyncs than acknowledged sends
        assert 0 < flushes < n * writers


def test_a_sync_send_past_sync_flush_timeout_times_out(store_dir):
    """The flusher is stopped (SIGSTOP): the send is published but not durable
    within syncFlushTimeout, so the waiter is told (FLUSH_DISK_TIMEOUT); once
    the flusher runs again the same bytes become durable."""
    import signal
    from shmq.broker.shared_store import attach, wait_flushed
    cfg = small_config(store_dir, flushDiskType="SYNC_FLUSH", syncFlushTimeout=300)
    with StoreOwner(cfg, mp_context=CTX) as o:
        o.wait_flusher_ready()
        store, cb = attach(cfg, role="other")
        os.kill(o.flusher.pid, signal.SIGSTOP)
        try:
            r = store.append(encode("Slow", [b"x"], properties=b""))
            now, waits = [100.0], []

            def wait(s):             # a fake clock: each wake-up wait "takes" its whole timeout
                waits.append(s)
                cb.wait(0)
                now[0] += s
            assert wait_flushed(store, cb, r.end, wait, lambda: now[0]) is False
            assert waits == [pytest.approx(0.3)] and now[0] == pytest.approx(100.3)
            assert store.read_queue("Slow", 0)[0].body == b"x"   # published all the same
        finally:
            os.kill(o.flusher.pid, signal.SIGCONT)
        assert wait_flushed(store, cb, r.end) is True
        cb.close()


def test_an_attacher_waits_until_the_owner_has_finished_opening(owner):
    st = owner.store.state
    st.set("state", 0)   # as between laying out the block and filling it from recovery
    try:
        with pytest.raises(NotRunning, match="still being opened"):
            attach_store(owner.config)
    finally:
        st.set("state", 1)
    attach_store(owner.config)[1].close()


def test_an_attacher_configured_with_other_sizes_is_refused(owner):
    from dataclasses import replace
    with pytest.raises(ValueError, match="maxQueueSlots=16384"):
        attach_store(replace(owner.config, maxQueueSlots=1000))


def test_a_process_still_attached_to_a_dead_owners_block_cannot_write(store_dir):
    cfg = small_config(store_dir)
    a, b = CTX.Pipe()
    old_owner = CTX.Process(target=procs.owner_reports_flusher_then_waits, args=(cfg, b))
    old_owner.start()
    a.recv()
    go, out = CTX.Event(), CTX.Queue()
    writer = CTX.Process(target=procs.attached_writer, args=(cfg, go, out))
    writer.start()
    assert out.get(timeout=60) == "attached"
    os.kill(old_owner.pid, 9)
    old_owner.join(30)
    with StoreOwner(cfg, mp_context=CTX) as new:            # retires the old block, then recovers
        new.store.append(encode("Stale", [b"acknowledged by the new owner"], properties=b""))
        go.set()
        assert out.get(timeout=60) == "Retired"
        writer.join(30)
        assert [m.body for m in new.store.read_queue("Stale", 0)] == \
            [b"first", b"acknowledged by the new owner"]


def test_a_dead_lock_holder_that_never_had_a_slot_is_found(owner):
    assert run(procs.hold_lock_without_a_slot_then_die, owner.root) == -9
    done = owner.supervise()
    assert any("died holding the append lock" in d for d in done)
    assert lock_is_free(owner.cb)
    owner.store.append(encode("Free", [b"x"], properties=b""))   # not blocked


def test_a_slot_whose_wakeup_address_is_still_held_is_not_claimed(owner):
    """A process leaving its slot, or a child that inherited its socket
    through a plain fork, can still hold a slot's wake-up address after the
    slot's row says it is free: a newcomer takes another slot, and a process
    that must have that slot (the flusher's) is told why it cannot."""
    from shmq.ipc.control import SlotTaken
    from shmq.ipc.wakeup import Waiter

    cb = ControlBlock.attach(owner.root)
    probe = cb.register(role=0)           # the slot the next newcomer would get
    cb.unregister()
    held = Waiter(cb.namespace, probe)    # its address, held by someone else
    try:
        got = cb.register(role=0)
        assert got != probe
        cb.unregister()
        with pytest.raises(SlotTaken, match=f"slot {probe}: its wake-up address"):
            cb.register(role=0, slot=probe)
        assert int(cb.procs["pid"][probe]) == 0
    finally:
        held.close()
        cb.close()
    cb = ControlBlock.attach(owner.root)
    try:
        assert cb.register(role=0) == probe   # let go of: free again
    finally:
        cb.close()


def test_a_publish_wakes_the_direct_consumers_waiting_on_its_queue_only(owner):
    """WANT_PUBLISH wake-ups (every append's) reach a slot flagged
    WANT_QUEUES only when its wait_mask meets the published queues: a
    direct consumer idle on a quiet queue is not woken by a busy one; one
    waiting on a queue with no slot yet is woken by the publish that makes
    one; a worker's WANT_PUBLISH is woken by every publish, as before."""
    from shmq.core.state import NEW_QUEUE, queue_bit
    from shmq.ipc.control import WANT_PUBLISH, WANT_QUEUES

    waiting = ControlBlock.attach(owner.root)
    worker = ControlBlock.attach(owner.root)
    try:
        waiting.register(role=0)
        worker.register(role=0)
        waiting.procs["wait_mask"][waiting.slot] = queue_bit(3) | queue_bit(-1)
        waiting.set_flag(WANT_QUEUES, True)
        worker.set_flag(WANT_PUBLISH, True)
        cb = owner.cb

        def woken(queues):
            cb.wake_flagged(WANT_PUBLISH, queues)     # a datagram is queued before this returns
            return waiting.waiter.drain() > 0, worker.waiter.drain() > 0
        assert woken(queue_bit(5)) == (False, True)                  # another queue
        assert woken(queue_bit(3)) == (True, True)                   # its queue
        assert woken(queue_bit(3 + 62)) == (True, True)              # one sharing its bit
        assert woken(queue_bit(7) | NEW_QUEUE) == (True, True)       # a queue made by the publish
        assert woken(-1) == (True, True)                             # any (a slave's dispatch)
        waiting.set_flag(WANT_QUEUES, False)
        assert woken(-1) == (False, True)
    finally:
        waiting.close()
        worker.close()
