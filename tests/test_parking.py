"""The parking module on a fake clock: the near/far timer queue against a
naive twin, cancellation that leaves no garbage, and parked pulls and sends
over a real store (``open_local``: real files, the store's own state)."""
from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import small_config
from shmq.broker.parking import Parking, ParkedPull, TimerQueue
from shmq.core.records import encode
from shmq.core.store import close_clean, open_local
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.control import WANT_FLUSH, WANT_PUBLISH, WANT_QUEUES
from shmq.ipc.remoting import RemotingCommand

TICK = 0.001


# ------------------------------------------------------------------ TimerQueue
def test_a_timer_fires_after_its_deadline_within_a_tick_and_never_before():
    q = TimerQueue(tick_s=TICK, far_s=1.0)
    q.add(10.5, "a")
    q.add(10.2, "b")
    q.add(30.0, "far")
    assert q.expire(10.19) == [] and q.expire(10.2) == []
    assert q.next_deadline() <= 10.2 + TICK
    assert q.expire(10.2 + TICK) == ["b"]
    assert q.expire(10.49) == [] and q.expire(10.5 + TICK) == ["a"]
    assert len(q) == 1 and 30.0 <= q.next_deadline() <= 30.0 + TICK
    assert q.expire(29.99) == [] and q.expire(30.0 + TICK) == ["far"]
    assert q.next_deadline() is None and len(q) == 0


def test_timers_due_together_fire_earliest_first():
    q = TimerQueue(tick_s=TICK, far_s=1.0)
    for d in (5.3, 5.1, 7.0, 5.2, 6.0):
        q.add(d, d)
    assert q.expire(8.0) == [5.1, 5.2, 5.3, 6.0, 7.0]


def test_cancelling_most_timers_costs_no_heap_entry_per_timer():
    """10,000 long polls, all but two answered early: the queue holds no
    entry for a cancelled timer (only an int per bucket, dropped when seen)."""
    q = TimerQueue(tick_s=TICK, far_s=1.0)
    q.expire(100.0)
    timers = [q.add(100.0 + 15 + i * 0.0001, i) for i in range(10_000)]   # 1 s of deadlines, far
    assert len(q.far) <= 2 and len(q.far_idx) <= 2 and not q.near
    keep = {0, 9_999}
    for i, t in enumerate(timers):
        if i not in keep:
            q.cancel(t)
    assert len(q) == 2
    assert sum(len(b) for b in q.far.values()) == 2
    q.cancel(timers[0])
    q.cancel(timers[0])                        # twice: a no-op
    assert len(q) == 1
    assert q.expire(116.0 + TICK) == [9_999]
    assert q.next_deadline() is None and not q.near_ticks and not q.far_idx


def test_far_timers_are_promoted_when_their_window_comes():
    q = TimerQueue(tick_s=TICK, far_s=1.0)
    q.expire(0.0)
    q.add(0.5, "near")
    q.add(3.25, "far")
    assert list(q.near) and list(q.far)
    assert q.expire(3.0) == ["near"]           # promotes the bucket of second 3
    assert not q.far and q.near_until == 3
    q.add(3.1, "near now")                       # lands near directly
    assert q.expire(3.3) == ["near now", "far"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "cancel", "advance"]),
                          st.floats(0, 5, allow_nan=False)), max_size=60))
def test_the_timer_queue_agrees_with_a_naive_twin(ops):
    """Naive twin: a list of live (deadline, item); at ``now`` every item
    whose deadline is a tick or more past has fired, none in the future has."""
    q = TimerQueue(tick_s=TICK, far_s=0.5)
    now = 0.0
    live: dict[int, tuple[float, object]] = {}     # item → (deadline, timer)
    fired: list[int] = []
    n = 0
    for op, x in ops:
        if op == "add":
            live[n] = (now + x, q.add(now + x, n))
            n += 1
        elif op == "cancel" and live:
            item = sorted(live)[int(x * 1000) % len(live)]
            q.cancel(live.pop(item)[1])
        else:
            now += x
            out = q.expire(now)
            for item in out:
                assert live.pop(item)[0] <= now
            fired += out
        assert all(d > now - TICK for d, _ in live.values())
        assert len(q) == len(live)
        nd = q.next_deadline()
        assert (nd is None) == (not live)
        if live:
            assert nd <= min(d for d, _ in live.values()) + TICK * 1.001 + 1e-9
    assert len(set(fired)) == len(fired)


# ------------------------------------------------------------------ Parking over a real store
class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Flags:
    def __init__(self):
        self.v = 0

    def __call__(self, flag: int, on: bool) -> None:
        self.v = self.v | flag if on else self.v & ~flag


@pytest.fixture
def store(store_dir):
    s, _ = open_local(small_config(store_dir))
    yield s
    close_clean(s)


def append(store, topic: str, qid: int = 0):
    return store.append(encode(topic, [b"m"], queue_ids=qid, properties=b""))


def make(store):
    clock, flags, asked = Clock(), Flags(), []

    def answer(peer, cmd):
        asked.append((peer, cmd.opaque))
        return cmd.reply(R.SUCCESS), (), 0

    return Parking(store, flags, answer, clock), clock, flags, asked


class P:
    closed = False

    def __init__(self, id):
        self.id = id


def test_a_wake_up_reruns_only_the_pulls_whose_queue_moved(store):
    parking, clock, flags, asked = make(store)
    for i in range(300):
        parking.park_pull(P(i), RemotingCommand(11, opaque=i), f"T{i % 30}", 0, 0, 15.0)
    assert flags.v & WANT_QUEUES and parking.parked_pulls == 300
    append(store, "T7")
    out = parking.on_wake()
    assert sorted(o for _, o in asked) == list(range(7, 300, 30)) == sorted(p.id for p, _ in out)
    assert parking.parked_pulls == 290 and len(parking.timers) == 290
    clock.t += 15.0 + TICK
    assert len(parking.expire()) == 290
    assert parking.pulls == {} and not flags.v & WANT_QUEUES


def test_a_pull_parked_after_its_message_arrived_is_ready_at_once(store):
    parking, _, _, asked = make(store)
    append(store, "A")                           # between the pull's read and its parking
    parking.park_pull(P(1), RemotingCommand(11, opaque=5), "A", 0, 0, 15.0)
    assert parking.arrived == {("A", 0)}
    [(peer, _)] = parking.ready()
    assert peer.id == 1 and asked[0][1] == 5 and not parking.pulls


def test_parked_sends_leave_in_order_of_their_end_as_the_flush_advances(store):
    parking, clock, flags, _ = make(store)
    ends = []
    for i in range(5):
        r = append(store, "S")
        ends.append(r.end)
        parking.park_send(P(i), RemotingCommand(10, opaque=i), RemotingCommand(10, opaque=i).reply(R.SUCCESS),
                          r.end, 5.0)
    assert flags.v & WANT_FLUSH
    store.state.set("flushed_pos", ends[2])       # as the flusher publishes it
    assert [p.id for p, _ in parking.on_wake()] == [0, 1, 2]
    clock.t += 5.0 + TICK
    out = parking.expire()
    assert [(p.id, r.cmd.code) for p, r in out] == [(3, R.FLUSH_DISK_TIMEOUT), (4, R.FLUSH_DISK_TIMEOUT)]
    assert not parking.sends and not flags.v & WANT_FLUSH and len(parking.timers) == 0


def test_a_parked_pull_times_out_through_the_same_answer(store):
    parking, clock, _, asked = make(store)
    parking.park_pull(P(1), RemotingCommand(11, opaque=9), "Q", 0, 0, 0.5)
    assert isinstance(next(iter(parking.pulls[("Q", 0)])), ParkedPull)
    clock.t += 0.5 + TICK
    assert [p.id for p, _ in parking.expire()] == [1] and asked == [(asked[0][0], 9)]


def test_with_a_mask_parked_pulls_name_their_queues(store):
    """A worker's parked pulls flag WANT_QUEUES and name their queues in
    the slot's wait_mask (``core.state.queue_bit``): an append to another
    queue does not wake the worker. A queue with no slot yet is waited on
    as NEW_QUEUE, and by its own bit once a message made it."""
    from shmq.core.state import NEW_QUEUE, queue_bit
    clock, flags, masks = Clock(), Flags(), []
    parking = Parking(store, flags, lambda peer, cmd: None, clock, set_mask=masks.append)
    append(store, "PA")
    parking.park_pull(P(1), None, "PA", 0, 1, 30.0)
    assert flags.v & WANT_QUEUES and not flags.v & WANT_PUBLISH   # not woken by every append
    assert masks[-1] == queue_bit(store.state.queue_slot("PA", 0))
    parking.park_pull(P(2), None, "PNew", 0, 0, 30.0)        # no slot yet
    assert masks[-1] == queue_bit(store.state.queue_slot("PA", 0)) | NEW_QUEUE
    append(store, "PNew")
    parking.on_wake()                                         # answered; PA still waits
    assert masks[-1] == queue_bit(store.state.queue_slot("PA", 0))
    clock.t += 60
    parking.expire()
    assert parking.pulls == {} and not flags.v & WANT_QUEUES


_QUEUES = [("PA", 0), ("PA", 1), ("PB", 0), ("PC", 3)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("park"), st.integers(0, 3), st.integers(0, 5), st.integers(0, 3)),
    st.tuples(st.just("append"), st.integers(0, 3)),
    st.tuples(st.just("close"), st.integers(0, 5)),
    st.tuples(st.just("wake")),
    st.tuples(st.just("expire"))), max_size=40))
@example(ops=[("park", 0, 0, 2), ("park", 0, 1, 1), ("append", 0), ("wake",)])  # a lower offset second
def test_wake_ups_answer_exactly_the_pulls_their_queue_passed_as_a_naive_twin_does(
        tmp_path_factory, ops):
    """Pulls parked on queues with and without a slot, appends, closed
    connections, expiries and wake-ups in any order: each wake-up answers
    exactly the parked pulls whose queue's max offset is past their offset
    (a naive twin reading every queue), and the rest stay parked. After a
    wake-up, or a park on a queue not yet waited on, the wait_mask is
    exactly the parked queues' bits: NEW_QUEUE for a queue with no slot
    yet, since the append that makes its slot publishes that bit too, and
    the wake-up it causes moves the queue to its own."""
    from shmq.core.state import queue_bit
    s, _ = open_local(small_config(str(tmp_path_factory.mktemp("twin"))))
    try:
        clock, flags, masks, asked = Clock(), Flags(), [0], []
        parking = Parking(s, flags, lambda peer, cmd: asked.append(cmd.opaque) or None, clock,
                          set_mask=masks.append)
        peers = [P(i) for i in range(6)]
        twin: dict[int, tuple] = {}           # opaque → (peer, key, offset)
        nxt = 0

        def mask_of(keys):
            m = 0
            for t, q in keys:
                m |= queue_bit(s.state.queue_slot(t, q))
            return m
        for op in ops:
            if op[0] == "park":
                key, peer = _QUEUES[op[1]], peers[op[2]]
                if peer.closed:
                    continue
                off = s.max_offset(*key) + op[3] - 1       # behind (answered at once), at, ahead
                if off < s.max_offset(*key):
                    continue                              # the handler reads it, no park
                new = key not in {k for _, k, _ in twin.values()}
                parking.park_pull(peer, RemotingCommand(11, opaque=nxt), *key, off, 10.0)
                twin[nxt] = (peer, key, off)
                nxt += 1
                if new:
                    assert masks[-1] == mask_of({k for _, k, _ in twin.values()})
            elif op[0] == "append":
                append(s, *_QUEUES[op[1]][:1], _QUEUES[op[1]][1])
            elif op[0] == "close":
                peer = peers[op[1]]
                peer.closed = True
                parking.drop_pulls_of(peer)
                twin = {o: v for o, v in twin.items() if v[0] is not peer}
                peers[op[1]] = P(op[1])                  # a new connection from then on
            elif op[0] == "wake":
                asked.clear()
                parking.arrived.clear()
                parking.on_wake()
                due = {o for o, (_, key, off) in twin.items() if s.max_offset(*key) > off}
                assert set(asked) == due
                twin = {o: v for o, v in twin.items() if o not in due}
                if twin:
                    assert masks[-1] == mask_of({k for _, k, _ in twin.values()})
            else:
                clock.t += 10.0 + 2 * TICK
                asked.clear()
                parking.expire()
                assert set(asked) == set(twin)
                twin = {}
            assert parking.parked_pulls == len(twin)
            assert set(parking.pulls) == {k for _, k, _ in twin.values()}
            assert bool(flags.v & WANT_QUEUES) == bool(twin)
    finally:
        close_clean(s)
