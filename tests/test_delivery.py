"""The services process's re-posts, exactly once: a kill at any point of
``Reposter.put`` is finished or redone on restart, never doubled or lost.

In-process, on a real store: the "kill" is a put that stops after one of its
steps (its note written; its append done; its cursor moved), followed by a
fresh ``Reposter.recover`` as a restarted process would run it.

Also: after an abnormal shutdown, recovery gives the delay-level and timer
units back their delivery times (``tags_code_rules``).
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import shmq.broker.schedule as sched
from shmq.broker.delivery import (
    DELAY_CURSOR,
    NOTE_SET,
    TIMER_CURSOR,
    Progress,
    Reposter,
    restore_real,
    route_send,
    tags_code_rules,
)
from shmq.broker.schedule import DelayService, TimerService
from shmq.broker.topics import SCHEDULE_TOPIC, TIMER_TOPIC
from shmq.core.config import StoreConfig
from shmq.core.consumequeue import ConsumeQueues
from shmq.core.records import encode
from shmq.core.store import open_local
from shmq.tools.cli import main

LEVELS = (1000, 2000)
HOST = ("127.0.0.1", 10911)


@pytest.fixture
def store(tmp_path):
    (tmp_path / "config").mkdir()
    s, _ = open_local(StoreConfig(storePathRootDir=str(tmp_path), mappedFileSizeCommitLog=1 << 20, maxMessageSize=65536))
    yield s
    s.close()


def park(store, n, now=1_000):
    """n messages sent with DELAY=1 at ``now`` (due at now + 1 s)."""
    for i in range(n):
        r = route_send("Real", 0, 0, f"DELAY\x011\x02UNIQ_KEY\x01U{i}", now_ms=now,
                       delay_levels=LEVELS, timer_enable=True, timer_max_delay_ms=10**9,
                       reject_transactions=False)
        b = encode(r.topic, [f"m{i}".encode()], properties=r.properties.encode(),
                   queue_ids=r.queue_id)
        b.tags_codes[:] = r.tags_code
        store.append(b)


def delivered(store):
    return [m.properties["UNIQ_KEY"] for m in store.read_queue("Real", 0)]


class Killed(Exception):
    pass


@pytest.mark.parametrize("stop_after", ["note", "append", "cursor"])
def test_a_put_killed_after_any_step_is_finished_or_redone_once(store, stop_after):
    park(store, 5)
    p = Progress(store.root)
    r = Reposter(store, p)
    real_append, real_set = store.append, Progress.__setitem__

    def append(batch):
        if stop_after == "note":
            raise Killed
        res = real_append(batch)
        if stop_after == "append":
            raise Killed
        return res

    def setitem(self, i, v):
        real_set(self, i, v)
        if stop_after == "cursor" and i == DELAY_CURSOR + 1:
            raise Killed

    store.append = append
    Progress.__setitem__ = setitem
    try:
        with pytest.raises(Killed):
            DelayService(store, p, r, LEVELS, HOST, store.root).step(now_ms=10_000)
    finally:
        store.append = real_append
        Progress.__setitem__ = real_set
    assert p[NOTE_SET] == 1
    p2 = Progress(store.root)                      # the restarted process
    r2 = Reposter(store, p2)
    assert r2.recover() == ("redo" if stop_after == "note" else "finished")
    DelayService(store, p2, r2, LEVELS, HOST, store.root).step(now_ms=10_000)
    assert delivered(store) == [f"U{i}" for i in range(5)]
    assert p2[DELAY_CURSOR + 1] == 5


def test_only_due_messages_move_and_the_cursor_survives_a_restart(store):
    park(store, 3, now=1_000)
    park(store, 2, now=5_000)
    p = Progress(store.root)
    svc = DelayService(store, p, Reposter(store, p), LEVELS, HOST, store.root)
    assert svc.step(now_ms=2_500) == 3
    assert svc.next_due_ms() == 6_000
    p2 = Progress(store.root)
    svc2 = DelayService(store, p2, Reposter(store, p2), LEVELS, HOST, store.root)
    assert svc2.step(now_ms=2_600) == 0
    assert svc2.step(now_ms=6_000) == 2
    assert delivered(store) == ["U0", "U1", "U2", "U0", "U1"]
    m = store.read_queue("Real", 0)[0]
    assert m.properties["REAL_TOPIC"] == "Real" and "DELAY" not in m.properties
    assert store.max_offset(SCHEDULE_TOPIC, 0) == 5


def test_restore_real_keeps_what_the_producer_set(store):
    park(store, 1)
    parked = store.read_queue(SCHEDULE_TOPIC, 0)[0]
    b = restore_real(parked, HOST)
    assert (b.topic, b.queue_id) == ("Real", 0)


def park_timers(store, n, now, delay_ms):
    for i in range(n):
        r = route_send("Real", 0, 0, f"TIMER_DELAY_MS\x01{delay_ms}\x02UNIQ_KEY\x01T{i}",
                       now_ms=now, delay_levels=LEVELS, timer_enable=True,
                       timer_max_delay_ms=10**9, reject_transactions=False)
        b = encode(r.topic, [f"t{i}".encode()], properties=r.properties.encode(),
                   queue_ids=r.queue_id)
        if r.tags_code is not None:
            b.tags_codes[:] = r.tags_code
        store.append(b)


@pytest.mark.parametrize("stop_after", ["note", "append", "cursor"])
def test_a_timer_slot_killed_mid_way_is_resumed_exactly(store, stop_after):
    park_timers(store, 6, now=1_000, delay_ms=500)        # all due at 1.5 s: one slot
    p = Progress(store.root)
    svc = TimerService(store, p, Reposter(store, p), 100, HOST, store.root)
    assert svc.step(now_ms=1_200) == 0                      # logged, not due
    real_append = store.append
    calls = []

    def append(batch):                                       # the second re-post dies
        calls.append(1)
        if len(calls) == 2 and stop_after == "note":
            raise Killed
        res = real_append(batch)
        if len(calls) == 2 and stop_after == "append":
            raise Killed
        return res

    real_set = Progress.__setitem__

    def setitem(self, i, v):
        real_set(self, i, v)
        if stop_after == "cursor" and i == TIMER_CURSOR and len(calls) == 2:
            raise Killed

    store.append = append
    Progress.__setitem__ = setitem
    batch_max = sched.REPOST_BATCH_MAX
    sched.REPOST_BATCH_MAX = 3                               # two appends for six messages
    try:
        with pytest.raises(Killed):
            svc.step(now_ms=1_600)
    finally:
        store.append = real_append
        Progress.__setitem__ = real_set
        sched.REPOST_BATCH_MAX = batch_max
    svc.close()
    p2 = Progress(store.root)
    r2 = Reposter(store, p2)
    r2.recover()
    svc2 = TimerService(store, p2, r2, 100, HOST, store.root)
    svc2.step(now_ms=1_700)
    got = store.read_queue("Real", 0)
    assert [m.properties["UNIQ_KEY"] for m in got] == [f"T{i}" for i in range(6)]
    assert all("REAL_TOPIC" not in m.properties and "TIMER_OUT_MS" in m.properties for m in got)
    park_timers(store, 2, now=1_700, delay_ms=-5)           # already due: straight through
    park_timers(store, 1, now=1_700, delay_ms=100_000)
    svc2.step(now_ms=1_800)
    assert len(store.read_queue("Real", 0)) == 6 + 2
    svc2.close()


# ------------------------------------------------------------ transactions
def half_message(store, body=b"tx", qid=0):
    r = route_send("Real", qid, 0x4, "TRAN_MSG\x01true\x02PGROUP\x01pg\x02UNIQ_KEY\x01TX",
                   now_ms=1_000, delay_levels=LEVELS, timer_enable=True, timer_max_delay_ms=10**9,
                   reject_transactions=False)
    b = encode(r.topic, [body], properties=r.properties.encode(), queue_ids=r.queue_id,
               sysflag=r.sysflag)
    res = store.append(b)
    return store.read_message(res.phy_offset)


def registry(store):
    from shmq.broker.registry import Registry, registry_bytes
    return Registry(memoryview(bytearray(registry_bytes())), store.root, create=True)


def committed(store):
    return [m for m in store.read_queue("Real", 0) if m.sysflag & 0xC == 0x8]


def test_a_commit_killed_before_its_op_record_is_finished_not_repeated(store):
    from shmq.broker import transactions as tx
    m = half_message(store)
    reg = registry(store)
    real_op = tx.op_record

    def op_dies(*a):
        raise Killed
    tx.op_record = op_dies                   # the commit is stored, the op record never
    try:
        with pytest.raises(Killed):
            tx.resolve_half(store, reg, HOST, m, 0x8)
    finally:
        tx.op_record = real_op
    assert len(committed(store)) == 1
    # the producer's answer comes again (or the check's): finished, not posted twice
    assert tx.resolve_half(store, reg, HOST, m, 0x8) is True
    assert tx.resolve_half(store, reg, HOST, m, 0x8) is False
    assert len(committed(store)) == 1
    assert len(store.read_queue("RMQ_SYS_TRANS_OP_HALF_TOPIC", 0)) == 1


def test_after_a_whole_broker_crash_a_stored_commit_is_recorded_not_asked_again(store):
    from shmq.broker import transactions as tx
    from shmq.broker.config import BrokerConfig
    m = half_message(store)
    real_op = tx.op_record

    def op_dies(*a):
        raise Killed
    tx.op_record = op_dies
    try:
        with pytest.raises(Killed):
            tx.resolve_half(store, registry(store), HOST, m, 0x8)
    finally:
        tx.op_record = real_op
    reg = registry(store)                    # shared memory gone with the broker
    asked = []
    svc = tx.TransactionService(BrokerConfig(transactionTimeOut=0), store, reg,
                                Progress(store.root), HOST, asked.append)
    svc.start()
    svc.step(now_ms=10**13)
    assert asked == [] and len(committed(store)) == 1
    assert len(store.read_queue("RMQ_SYS_TRANS_OP_HALF_TOPIC", 0)) == 1
    svc.step(now_ms=10**13 + 10**6)          # resolved: the half cursor moves past it
    assert tx.resolve_half(store, reg, HOST, m, 0x8) is False
    assert len(committed(store)) == 1


# ------------------------------------------------- delivery times across a crash
RULE_LEVELS = (1_000, 5_000, 30_000)
T0 = 1_795_344_600_000          # the send time: an epoch ms far from the tag hashes


def park_for_recovery(store) -> dict[str, int]:
    """Delay-level, timer and ordinary messages routed as the send path does
    (store time = the routing time); UNIQ_KEY → the tags code it was given."""
    sends = [f"DELAY\x01{level}" for level in (1, 2, 3, 99, 2, 1)]        # 99: the last level
    sends += [f"TIMER_DELAY_MS\x01{ms}" for ms in (250, 7_000, 123_456)]
    sends += ["TIMER_DELAY_SEC\x0145", f"TIMER_DELIVER_MS\x01{T0 + 20_000}"]
    sends += ["TAGS\x01plain", ""]                                       # ordinary messages
    codes = {}
    for i, props in enumerate(sends * 3):
        now = T0 + 17 * i
        r = route_send("Real", i % 2, 0, f"{props}\x02TAGS\x01t{i % 4}\x02UNIQ_KEY\x01U{i}",
                       now_ms=now, delay_levels=RULE_LEVELS, timer_enable=True,
                       timer_max_delay_ms=10**9, reject_transactions=False)
        b = encode(r.topic, [b"m%d" % i], properties=r.properties.encode(), queue_ids=r.queue_id,
                   store_timestamp=now)
        if r.tags_code is not None:
            b.tags_codes[:] = r.tags_code
        store.append(b)
        codes[f"U{i}"] = int(b.tags_codes[0])
    return codes


def unit_codes(store) -> dict[str, int]:
    """UNIQ_KEY → the tags code of its ConsumeQueue unit, over every queue."""
    out = {}
    for topic, qid in store.cqs.list_queues():
        units = store.queue_units(topic, qid, 0, 1 << 10)
        for u in units:
            m = store.read_message(int(u["phy_offset"]))
            out[m.properties["UNIQ_KEY"]] = int(u["tags_code"])
    return out


@pytest.mark.parametrize("crash", ["abort", "units_zeroed", "consumequeue_deleted"])
def test_recovery_gives_delayed_and_timer_units_their_delivery_time_again(tmp_path, capsys, crash):
    """After an abnormal shutdown recovery re-dispatches every record past the
    checkpoint. A delay-level or timer unit must get back the delivery time
    route_send gave it, not the TAGS hash (which makes it due at once), and
    the services must find nothing due before that time."""
    root = tmp_path / "store"
    (root / "config").mkdir(parents=True)
    cfg = StoreConfig(storePathRootDir=str(root), mappedFileSizeCommitLog=1 << 20,
                      maxMessageSize=65536)
    rules = tags_code_rules(RULE_LEVELS)
    store, _ = open_local(cfg, tags_code_rules=rules)
    sent = park_for_recovery(store)
    assert unit_codes(store) == sent
    delay_units = store.max_offset(SCHEDULE_TOPIC, 0) + store.max_offset(SCHEDULE_TOPIC, 1)
    assert delay_units and store.max_offset(SCHEDULE_TOPIC, 2) and store.max_offset(TIMER_TOPIC, 0)
    store.close()                                    # no clean shutdown: abort stays
    cqs = ConsumeQueues(store.files, cfg.consumequeue_dir, cfg.cq_units_per_file)
    if crash == "units_zeroed":                      # the page cache never reached the disk
        for topic, qid in cqs.list_queues():
            cqs.mapped(topic, qid, 0, create=False)[:] = 0
    cqs.close()
    if crash == "consumequeue_deleted":
        shutil.rmtree(root / "consumequeue")

    store, report = open_local(cfg, tags_code_rules=rules)
    assert report.mode == "abnormal" and report.records_scanned == len(sent)
    assert report.units_rebuilt == (0 if crash == "abort" else len(sent))
    assert unit_codes(store) == sent
    p = Progress(store.root)
    delay = DelayService(store, p, Reposter(store, p), RULE_LEVELS, HOST, store.root)
    timer = TimerService(store, p, Reposter(store, p), 100, HOST, store.root)
    try:
        assert delay.step(now_ms=T0 + 999) == 0 and timer.step(now_ms=T0 + 99) == 0
        assert delay.next_due_ms() == T0 + 1_000
        last = max(sent.values()) + 100               # the timer fires at its slot's end
        assert delay.step(now_ms=last) + timer.step(now_ms=last) == delay_units + \
            store.max_offset(SCHEDULE_TOPIC, 2) + store.max_offset(TIMER_TOPIC, 0)
    finally:
        timer.close()
    store.close()
    assert main(["store", "inspect", str(root), "--verify"]) == 0, capsys.readouterr()

    # Without the rules (the bug): the re-dispatched delivery times are tag hashes.
    shutil.rmtree(root / "consumequeue")
    store, _ = open_local(cfg)
    wrong = unit_codes(store)
    store.close()
    timed = [k for k, v in sent.items() if v >= 1 << 31]
    assert all(np.iinfo(np.int32).min <= wrong[k] <= np.iinfo(np.int32).max for k in timed)
    assert main(["store", "inspect", str(root), "--verify"]) == 1
