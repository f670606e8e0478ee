"""The worker's send lane (broker/handlers/lane.py) against the way every
request goes: the same frames driven through a worker's driver over a
socket pair, once with the lane and once without, must leave each queue
the very same records (where in the CommitLog and when aside) and give
the very same answers; what the
lane does not take (a delay, a topic it does not know yet, a batch, a
oneway send, non-ASCII properties, a queue out of range) goes the usual
way in the order it came. The pull lane likewise: the same pulls, with it
and without, get the same answers."""
from __future__ import annotations

import contextlib
import struct

import pytest
from test_handlers import (Rig, driven, golden, keyed, read_replies, replies_in_turns,
                           turns_until)
from shmq.broker.handlers import PARKED
from shmq.client.requests import create_topic, decode_records
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import FLAG_ONEWAY, decode_all, encode


def _frames() -> tuple[list, int, int]:
    """(commands, how many the lane takes, how many are answered)."""
    cmds, lane = [], 0
    for i in range(40):           # the first the usual way: the lane knows only checked topics
        cmds.append(keyed(i % 4, f"k{i}", i)); lane += i > 0
    cmds.append(keyed(1, "k3", 100)); lane += 1                  # a retry: the window's duplicate
    d = keyed(2, "delayed", 101)
    d.ext["i"] += "DELAY\x013\x02"
    cmds.append(d)
    cmds.append(keyed(0, "new-topic", 102, topic="NewTopic")); lane += 0   # created the usual way
    for i in range(5):
        cmds.append(keyed(i % 2, f"n{i}", 103 + i, topic="NewTopic")); lane += 1
    cmds.append(keyed(1, "zh", 110, body="中文".encode()))
    cmds[-1].ext["i"] = "KEYS\x01键\x02UNIQ_KEY\x01zh"                  # non-ASCII: the usual way
    cmds.append(keyed(9, "far", 111))                                  # queue 9 of 4: refused
    ow = keyed(3, "oneway", 112)
    ow.flag |= FLAG_ONEWAY
    cmds.append(ow)
    cpp = golden("cpp-1.2-send")
    cpp.opaque = 113
    cmds.append(cpp); lane += 1
    esc = keyed(2, "esc", 114)
    esc.ext["i"] = 'KEYS\x01a"b\\c/d\ne\x02UNIQ_KEY\x01esc\x02\x02'
    cmds.append(esc); lane += 1
    cmds.append(keyed(0, "k2", 115)); lane += 1                        # another duplicate
    answered = sum(1 for c in cmds if not c.flag & FLAG_ONEWAY)
    return cmds, lane, answered


def _run(root: str, lane: bool, alone: bool = False):
    """``_frames`` through a driver, with the send lane or without: all in
    one write, or (``alone``) each alone, its answer read before the next
    is written, as a producer sending one message at a time."""
    rig = Rig(root, dedup_window=1024, autoCreateTopicEnable=True)
    rig.ok(create_topic("GoldenTopic", 4))
    reactor, driver, client = driven(rig, lane=lane)
    cmds, taken, answered = _frames()
    replies = []
    if alone:
        for c in cmds:
            client.sendall(bytes(encode(c)))
            reactor.run_once()            # the whole frame is there: read and answered
            if not c.flag & FLAG_ONEWAY:
                replies += read_replies(client, 1)
        assert not _readable(client)
    else:
        client.sendall(b"".join(bytes(encode(c)) for c in cmds))
    replies += replies_in_turns(reactor, client, answered - len(replies))
    store = rig.store
    end = store.state.get("write_pos")
    log = bytearray(store.cl.read(0, end))
    queues = {(t, q): [(m.queue_offset, m.phy_offset, m.body) for m in store.read_queue(t, q)]
              for t in ("GoldenTopic", "NewTopic") for q in range(4)}
    reactor.close()
    rig.close()
    return driver.lane.taken, taken, replies, log, queues


def _readable(sock) -> bool:
    import select
    return bool(select.select([sock], [], [], 0.01)[0])


def _by_queue(log: bytearray) -> dict:
    """Each queue's records, in CommitLog order, their PHYSICALOFFSET and
    STORETIMESTAMP zeroed (both hosts IPv4 here: at 28 and 56). Across
    queues the two ways may interleave differently (a chunk of the lane is
    64 sends, a group of the send path 32): RocketMQ orders each queue."""
    import struct
    p, out = 0, {}
    while p + 4 <= len(log):
        size = struct.unpack_from(">i", log, p)[0]
        if size <= 0:
            break
        rec = bytearray(log[p:p + size])
        rec[28:36] = rec[56:64] = bytes(8)
        blen = struct.unpack_from(">i", rec, 84)[0]
        tlen = rec[88 + blen]
        queue = (bytes(rec[89 + blen:89 + blen + tlen]), struct.unpack_from(">i", rec, 12)[0])
        out.setdefault(queue, []).append(bytes(rec))
        p += size
    return out


@pytest.mark.parametrize("alone", [False, True], ids=["pipelined", "one-at-a-time"])
def test_the_lane_stores_and_answers_exactly_as_the_send_path(tmp_path, alone):
    """The same sends, with the lane and without, in one write (the lane's
    chunks) or one at a time (its chunk of one: ``SendLane._lone``)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    took, expected, with_lane, log_a, queues_a = _run(str(tmp_path / "a"), True, alone)
    none, _, without, log_b, queues_b = _run(str(tmp_path / "b"), False, alone)
    assert took == expected and none == 0
    assert len(log_a) == len(log_b) and _by_queue(log_a) == _by_queue(log_b)
    assert [[m[::2] for m in q] for q in queues_a.values()] == \
        [[m[::2] for m in q] for q in queues_b.values()]          # (offset, body) of each
    for replies, queues in ((with_lane, queues_a), (without, queues_b)):
        phy = {(t, q, m[0]): m[1] for (t, q), ms in queues.items() for m in ms}
        for r in replies:          # each msgId names where its queue offset's record is
            if r.code == R.SUCCESS and r.opaque not in (101,):
                t = "NewTopic" if 102 <= r.opaque < 110 else "GoldenTopic"
                at = phy[(t, int(r.ext["queueId"]), int(r.ext["queueOffset"]))]
                assert r.ext["msgId"].endswith("%016X" % at)
    def answers(rs):
        return sorted((r.opaque, r.code, r.remark, {k: v for k, v in r.ext.items() if k != "msgId"})
                      for r in rs)
    assert answers(with_lane) == answers(without)
    codes = {r.opaque: r.code for r in with_lane}
    assert codes[111] == R.SYSTEM_ERROR and codes[0] == R.SUCCESS and 112 not in codes
    first = {r.opaque: r.ext for r in with_lane}
    assert first[100]["msgId"] == first[3]["msgId"]              # the retry: the first's answer
    assert first[115]["queueOffset"] == first[2]["queueOffset"]
    assert [m[2] for m in queues_a[("GoldenTopic", 1)]][:3] == [b"k1", b"k5", b"k9"]


@pytest.mark.parametrize("alone", [False, True], ids=["chunk", "one-at-a-time"])
def test_a_multi_tag_topics_sends_are_stored_with_its_flag_by_the_lane_as_the_send_path(
        tmp_path, alone):
    """A topic whose topicFilterType is MULTI_TAG: every send to it is
    stored with MessageSysFlag.MULTI_TAGS_FLAG, by the lane (a chunk, or
    its chunk of one) as by the way every request goes."""
    flags = {}
    for lane in (True, False):
        rig = Rig(str(tmp_path / str(lane)), dedup_window=1024)
        topic = create_topic("MultiTag", 2)
        topic.ext["topicFilterType"] = "MULTI_TAG"
        rig.ok(topic)
        rig.ok(keyed(0, "first", 999, topic="MultiTag"))      # checked the usual way
        reactor, driver, client = driven(rig, lane=lane)
        cmds = [keyed(i % 2, f"m{i}", i, topic="MultiTag") for i in range(4)]
        if alone:
            for c in cmds:
                client.sendall(bytes(encode(c)))
                reactor.run_once()
                read_replies(client, 1)
        else:
            client.sendall(b"".join(bytes(encode(c)) for c in cmds))
            replies = replies_in_turns(reactor, client, 4)
        assert driver.lane.taken == (4 if lane else 0)
        flags[lane] = [(q, m.body, m.sysflag) for q in range(2)
                       for m in rig.store.read_queue("MultiTag", q)]
        reactor.close()
        rig.close()
    assert flags[True] == flags[False]
    assert len(flags[True]) == 5 and all(f & 2 for _, _, f in flags[True])   # MULTI_TAGS_FLAG


def _sync_rig(root: str) -> Rig:
    rig = Rig(root, store={"flushDiskType": "SYNC_FLUSH", "syncFlushTimeout": 5000},
              dedup_window=1024)
    rig.ok(create_topic("GoldenTopic", 4))
    assert rig.call(keyed(0, "first", 999)) is PARKED     # the topic checked once, the usual way
    rig.store.flush_commitlog()
    assert len(rig.parking.on_wake()) == 1
    return rig


@contextlib.contextmanager
def _flush_stuck(rig):
    """The flush lock held by another holder (a flusher stuck in its
    fdatasync) for the block: no flush round can publish meanwhile."""
    from shmq.core.files import FlushLock
    held = FlushLock(rig.store.config.commitlog_dir)
    assert held.acquire(block=False)
    try:
        yield
    finally:
        held.release()
        held.close()


def _lane_answers(rig, answers) -> dict:
    """opaque → (code, remark, queueOffset) of parked answers (each a Reply
    of the lane's frames, or a command's)."""
    out = {}
    for _, r in answers:
        for cmd in decode_all(r.head()):
            out[cmd.opaque] = (cmd.code, cmd.remark, cmd.ext.get("queueOffset"))
    return out


def test_under_sync_flush_the_lanes_answers_leave_after_the_turns_group_commit(tmp_path):
    """A chunk's answers are parked as one reply and leave at the end of
    the turn, after the worker's own group commit flushed the chunk (one
    flush round for it); one saying WAIT=false is answered first, without
    waiting."""
    rig = _sync_rig(str(tmp_path))
    reactor, driver, client = driven(rig)
    cmds = [keyed(i % 4, f"s{i}", i) for i in range(10)]
    cmds[4].ext["i"] += "WAIT\x01false\x02"
    st = rig.store.state
    seq = st.get("flush_seq")
    client.sendall(b"".join(bytes(encode(c)) for c in cmds))
    turns = turns_until(reactor, lambda: driver.lane.taken >= 10, "the lane took 10")
    got = read_replies(client, 10)
    assert (got[0].opaque, got[0].code) == (4, R.SUCCESS)
    assert sorted(r.opaque for r in got[1:]) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert {r.code for r in got} == {R.SUCCESS} and \
        {r.opaque: r.ext["queueOffset"] for r in got}[8] == "3"       # after first, s0, s4
    assert st.flushed_pos == st.write_pos and st.get("flush_seq") == seq + turns
    assert not rig.parking.sends and len(rig.parking.timers) == 0
    reactor.close()
    rig.close()


def test_under_sync_flush_answers_wait_while_another_process_flushes(tmp_path):
    """The flush lock held elsewhere (the flusher, or another worker, in
    its round): the turn's answers stay parked — nothing is answered
    before its bytes are durable — until the holder has published and
    woken this worker; then they leave."""
    from test_handlers import readable_answers
    rig = _sync_rig(str(tmp_path))
    reactor, driver, client = driven(rig)
    with _flush_stuck(rig):
        client.sendall(b"".join(bytes(encode(keyed(i % 4, f"s{i}", i))) for i in range(3)))
        turns_until(reactor, lambda: driver.lane.taken >= 3, "the lane took 3")
        assert readable_answers(client) == 0 and len(rig.parking.sends) == 1
        assert rig.store.flush_commitlog(block=False) == -1     # not while it is held
    rig.store.flush_commitlog()              # the holder's round, published
    driver.on_wake()                         # and its wake-up
    reactor.flush()
    assert sorted(r.opaque for r in read_replies(client, 3)) == [0, 1, 2]
    assert not rig.parking.sends
    reactor.close()
    rig.close()


def test_under_sync_flush_a_lone_sends_answer_waits_for_the_flush(tmp_path):
    """One send at a time under SYNC_FLUSH, taken by the lane alone: its
    answer leaves once the turn's group commit flushed it; one saying
    WAIT=false is answered at once; one whose flush never comes (the
    flush lock held by a process stuck in its fdatasync) is answered
    FLUSH_DISK_TIMEOUT after syncFlushTimeout, as the send path answers."""
    from test_handlers import readable_answers
    from shmq.broker.parking import FLUSH_TIMEOUT_REMARK
    rig = _sync_rig(str(tmp_path))
    reactor, driver, client = driven(rig)
    client.sendall(bytes(encode(keyed(1, "w", 1))))
    reactor.run_once()
    [r] = read_replies(client, 1)
    assert (driver.lane.taken, r.opaque, r.code, r.ext["queueOffset"]) == (1, 1, R.SUCCESS, "0")
    assert rig.store.state.flushed_pos == rig.store.state.write_pos
    nowait = keyed(2, "nw", 2)
    nowait.ext["i"] += "WAIT\x01false\x02"
    with _flush_stuck(rig):
        client.sendall(bytes(encode(nowait)))
        reactor.run_once()
        [r] = read_replies(client, 1)
        assert (driver.lane.taken, r.opaque, r.code, r.ext["queueOffset"]) == (2, 2, R.SUCCESS, "0")
        client.sendall(bytes(encode(keyed(1, "late", 3))))
        reactor.run_once()
        assert readable_answers(client) == 0
        rig.clock.advance(5.1)
        assert _lane_answers(rig, rig.parking.expire()) == \
            {3: (R.FLUSH_DISK_TIMEOUT, FLUSH_TIMEOUT_REMARK, "1")}
    assert driver.lane.taken == 3
    assert [m.body for m in rig.store.read_queue("GoldenTopic", 1)] == [b"w", b"late"]
    reactor.close()
    rig.close()


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "usual"])
def test_on_a_sync_master_answers_wait_for_the_slaves_ack_as_the_send_path_answers(tmp_path,
                                                                                  lane):
    """A SYNC_MASTER with a slave connected: a lone send's answer and a
    chunk's (one parked reply) leave once the slave's ack (confirm_pos)
    passes their end; WAIT=false is answered at once; a send the slave does
    not ack within slaveTimeout is answered FLUSH_SLAVE_TIMEOUT; a slave
    haSlaveFallbehindMax behind makes the answer SLAVE_NOT_AVAILABLE at
    once; with no slave the lane stays closed. The same answers the usual
    way (``lane=False``)."""
    from test_handlers import readable_answers
    from shmq.broker.parking import SLAVE_TIMEOUT_REMARK
    rig = Rig(str(tmp_path), dedup_window=1024, brokerRole="SYNC_MASTER", slaveTimeout=3000,
              haSlaveFallbehindMax=1 << 20)
    rig.ok(create_topic("GoldenTopic", 4))
    st = rig.store.state
    first = rig.call(keyed(0, "first", 999))                # no slave yet: stored, not waited for
    assert first.cmd.code == R.SLAVE_NOT_AVAILABLE
    st.set("ha_slaves", 1)
    st.set("confirm_pos", st.write_pos)
    reactor, driver, client = driven(rig, lane=lane)

    def acked_now():
        st.set("confirm_pos", st.write_pos)
        driver.on_wake()
        reactor.flush()

    client.sendall(bytes(encode(keyed(1, "alone", 1))))
    reactor.run_once()
    assert readable_answers(client) == 0 and len(rig.parking.sends) == 1
    acked_now()
    [r] = read_replies(client, 1)
    assert (r.opaque, r.code, r.ext["queueOffset"]) == (1, R.SUCCESS, "0")
    cmds = [keyed(i % 2, f"c{i}", 10 + i) for i in range(3)]
    cmds[1].ext["i"] += "WAIT\x01false\x02"
    client.sendall(b"".join(bytes(encode(c)) for c in cmds))
    turns_until(reactor, lambda: readable_answers(client), "the WAIT=false answer")
    [nowait] = read_replies(client, 1)
    assert (nowait.opaque, nowait.code) == (11, R.SUCCESS) and readable_answers(client) == 0
    acked_now()
    assert sorted((r.opaque, r.code) for r in read_replies(client, 2)) == \
        [(10, R.SUCCESS), (12, R.SUCCESS)]
    client.sendall(bytes(encode(keyed(0, "unacked", 20))))
    reactor.run_once()
    rig.clock.advance(3.1)
    driver.send_all(rig.parking.expire())
    reactor.flush()
    [r] = read_replies(client, 1)
    assert (r.opaque, r.code, r.remark) == (20, R.FLUSH_SLAVE_TIMEOUT, SLAVE_TIMEOUT_REMARK)
    st.set("confirm_pos", st.write_pos - (1 << 20))        # the slave fell behind
    client.sendall(bytes(encode(keyed(0, "behind", 21))))
    reactor.run_once()
    [r] = read_replies(client, 1)
    assert (r.opaque, r.code) == (21, R.SLAVE_NOT_AVAILABLE) and not rig.parking.sends
    st.set("ha_slaves", 0)                                  # no slave: not the lane's
    taken = driver.lane.taken
    client.sendall(bytes(encode(keyed(0, "alone2", 22))))
    reactor.run_once()
    [r] = read_replies(client, 1)
    assert (r.opaque, r.code, driver.lane.taken) == (22, R.SLAVE_NOT_AVAILABLE, taken)
    assert driver.lane.taken == (6 if lane else 0)
    assert [m.body for m in rig.store.read_queue("GoldenTopic", 0)] == \
        [b"first", b"c0", b"c2", b"unacked", b"behind", b"alone2"]
    reactor.close()
    rig.close()


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "usual"])
@pytest.mark.parametrize("sends", [1, 3], ids=["alone", "chunk"])
def test_sends_the_disk_refuses_are_answered_as_the_send_path_answers(tmp_path, lane, sends):
    """The CommitLog's write fails (ENOSPC) under a lone send, or a chunk
    of three: the lane answers each what the send path answers, and the
    next send, once the disk takes it again, is stored at the offset the
    failed ones did not use. (An error's traceback must not keep the
    decoder's buffer exported: the next read grows it.)"""
    import errno
    rig = Rig(str(tmp_path), dedup_window=1024)
    rig.ok(create_topic("GoldenTopic", 4))
    rig.ok(keyed(0, "first", 999))
    reactor, driver, client = driven(rig, lane=lane)
    cl = rig.store.cl
    write = cl.write

    def full(*args, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")
    cl.write = full
    client.sendall(b"".join(bytes(encode(keyed(0, f"nospace{i}", 1 + i))) for i in range(sends)))
    reactor.run_once()
    refused = read_replies(client, sends)
    cl.write = write
    client.sendall(bytes(encode(keyed(0, "after", 9))))
    reactor.run_once()
    [ok] = read_replies(client, 1)
    assert driver.lane.taken == (sends + 1 if lane else 0)
    assert [(r.opaque, r.code) for r in refused] == \
        [(1 + i, R.SERVICE_NOT_AVAILABLE) for i in range(sends)]
    assert all("No space left" in r.remark for r in refused)
    assert (ok.opaque, ok.code, ok.ext["queueOffset"]) == (9, R.SUCCESS, "1")
    assert [m.body for m in rig.store.read_queue("GoldenTopic", 0)] == [b"first", b"after"]
    reactor.close()
    rig.close()


def test_under_sync_flush_the_lanes_parked_answers_time_out_each_as_the_send_path(tmp_path):
    """A chunk whose flush does not come within syncFlushTimeout (the
    flush lock held by a process stuck in its fdatasync): each send is
    answered FLUSH_DISK_TIMEOUT at its own offset, stored all the same."""
    from shmq.broker.parking import FLUSH_TIMEOUT_REMARK
    rig = _sync_rig(str(tmp_path))
    reactor, driver, client = driven(rig)
    cmds = [keyed(i % 2, f"t{i}", 10 + i) for i in range(3)]
    with _flush_stuck(rig):
        client.sendall(b"".join(bytes(encode(c)) for c in cmds))
        turns_until(reactor, lambda: driver.lane.taken >= 3, "the lane took 3")
        rig.clock.advance(4.9)
        assert rig.parking.expire() == []
        rig.clock.advance(0.2)
        got = _lane_answers(rig, rig.parking.expire())
    assert got == {10: (R.FLUSH_DISK_TIMEOUT, FLUSH_TIMEOUT_REMARK, "1"),
                   11: (R.FLUSH_DISK_TIMEOUT, FLUSH_TIMEOUT_REMARK, "0"),
                   12: (R.FLUSH_DISK_TIMEOUT, FLUSH_TIMEOUT_REMARK, "2")}
    assert [m.body for m in rig.store.read_queue("GoldenTopic", 0)] == [b"first", b"t0", b"t2"]
    reactor.close()
    rig.close()


def test_a_chunk_larger_than_a_claim_may_be_is_appended_in_runs_across_segments(tmp_path):
    """30 sends of 6,000 B to one queue in one chunk (180 KB, segments of
    64 KiB): appended in runs of at most a quarter segment, as the send path
    cuts a turn, each answered at its offset, all stored in order."""
    rig = Rig(str(tmp_path), dedup_window=1024)
    rig.ok(create_topic("GoldenTopic", 4))
    rig.ok(keyed(0, "first", 999))
    reactor, driver, client = driven(rig)
    cmds = [keyed(0, f"b{i}", i, body=bytes([65 + i]) * 6000) for i in range(30)]
    client.sendall(b"".join(bytes(encode(c)) for c in cmds))
    replies = replies_in_turns(reactor, client, 30)
    assert driver.lane.taken == 30
    assert sorted((r.opaque, r.code, r.ext["queueOffset"]) for r in replies) == \
        [(i, R.SUCCESS, str(i + 1)) for i in range(30)]
    assert [m.body for m in rig.store.read_queue("GoldenTopic", 0)][1:] == [c.body for c in cmds]
    reactor.close()
    rig.close()


def test_a_queue_out_of_range_stops_the_lane_before_the_next_topic(tmp_path):
    """One read: a send the lane takes, one to queue 9 of the topic's 4,
    one to a topic not yet checked. The lane stops at the second (the send
    path refuses it), whatever follows; nothing lands in a queue 9."""
    rig = Rig(str(tmp_path), dedup_window=1024, autoCreateTopicEnable=True)
    rig.ok(create_topic("GoldenTopic", 4))
    rig.ok(keyed(0, "first", 999))              # GoldenTopic checked
    reactor, driver, client = driven(rig)
    cmds = [keyed(0, "ok", 1), keyed(9, "far", 2), keyed(1, "other", 3, topic="Other")]
    client.sendall(b"".join(bytes(encode(c)) for c in cmds))
    replies = replies_in_turns(reactor, client, 3)
    assert {r.opaque: r.code for r in replies} == {1: R.SUCCESS, 2: R.SYSTEM_ERROR, 3: R.SUCCESS}
    assert driver.lane.taken == 1
    assert rig.store.read_queue("GoldenTopic", 9) == []
    assert [m.body for m in rig.store.read_queue("Other", 1)] == [b"other"]
    reactor.close()
    rig.close()


def test_under_sync_flush_answers_leave_in_the_order_their_sends_came(tmp_path):
    """A chunk parked for the flush (the flush lock held elsewhere), then a
    chunk whose bytes the flusher made durable before it was answered
    (here: at once, on publish): the
    first chunk's answers leave first. (They left after it: a pipelined
    producer reading its answers in order saw a later send answered
    before an earlier one.)"""
    rig = _sync_rig(str(tmp_path))
    reactor, driver, client = driven(rig)
    with _flush_stuck(rig):                # (else the turn's own group commit answers them)
        client.sendall(b"".join(bytes(encode(keyed(0, f"a{i}", i))) for i in range(3)))
        turns_until(reactor, lambda: driver.lane.taken >= 3, "the lane took 3")
    assert len(rig.parking.sends) == 1
    published = rig.store.on_published
    rig.store.on_published = lambda mask: (published and published(mask),
                                           rig.store.flush_commitlog())
    client.sendall(b"".join(bytes(encode(keyed(0, f"b{i}", 10 + i))) for i in range(3)))
    turns_until(reactor, lambda: driver.lane.taken >= 6, "the lane took 6")
    assert [r.opaque for r in read_replies(client, 6)] == [0, 1, 2, 10, 11, 12]
    reactor.close()
    rig.close()


@pytest.mark.parametrize("tail", [struct.pack(">i", -6) + b"abcdefgh" * 4,   # back before it
                                  struct.pack(">i", -4) + b"junk" * 8,
                                  struct.pack(">i", 2) + b"junk" * 8,
                                  struct.pack(">ii", 40, 0x7F000010) + b"j" * 36])
def test_garbage_behind_sends_closes_that_connection_and_nothing_else(tmp_path, tail):
    """Two sends, then bytes that are no frame (a length that points back
    into the buffer, below the header field, an unknown serialize type): the
    sends are stored and answered, the connection closed as a protocol
    error, the worker (its reactor turn) unharmed."""
    rig = Rig(str(tmp_path), dedup_window=1024)
    rig.ok(create_topic("GoldenTopic", 4))
    rig.ok(keyed(0, "first", 999))
    reactor, driver, client = driven(rig)
    sends = b"".join(bytes(encode(keyed(0, f"g{i}", i))) for i in range(2))
    client.sendall(sends + tail)                       # behind them in one read
    for _ in range(3):
        reactor.call_later(0.01, lambda: None)       # (a turn with nothing to read ends)
        reactor.run_once()
    assert [r.opaque for r in read_replies(client, 2)] == [0, 1]
    assert client.recv(1 << 16) == b""                 # then closed
    reactor2, driver2, client2 = driven(rig)           # the same at the start of a read
    client2.sendall(sends.replace(b"g0", b"h0").replace(b"g1", b"h1"))
    turns_until(reactor2, lambda: driver2.lane.taken >= 2, "the lane took 2")
    assert [r.opaque for r in read_replies(client2, 2)] == [0, 1]
    client2.sendall(tail)
    for _ in range(3):
        reactor2.call_later(0.01, lambda: None)
        reactor2.run_once()
    assert client2.recv(1 << 16) == b""
    assert not reactor2.conns
    reactor2.close()
    assert not reactor.conns
    assert [m.body for m in rig.store.read_queue("GoldenTopic", 0)] == \
        [b"first", b"g0", b"g1", b"h0", b"h1"]
    reactor.close()
    rig.close()


def _pulls_and_sends(tmp_path, monkeypatch, sends_first: bool):
    """Two pulls and three sends in one read, in that order or the other:
    (the driver, each answer's code by opaque, the header starts each lane's
    kernel read: {"send": […], "pull": […]})."""
    from shmq.core import sends as F
    from shmq.client.requests import pull_message
    heads: dict = {"send": [], "pull": []}
    for lane, name in (("send", "read_sends"), ("pull", "read_pulls")):
        def reading(view, pos, *args, _read=getattr(F, name), _heads=heads[lane]):
            _heads.append(bytes(view[pos + 8:pos + 20]))
            return _read(view, pos, *args)
        monkeypatch.setattr(F, name, reading)
    rig = Rig(str(tmp_path), dedup_window=1024)
    rig.ok(create_topic("GoldenTopic", 4))
    rig.ok(keyed(0, "first", 999))              # GoldenTopic checked
    reactor, driver, client = driven(rig)
    pulls = [pull_message("GoldenTopic", 0, 0), pull_message("GoldenTopic", 1, 0)]
    for i, p in enumerate(pulls):
        p.opaque = 50 + i
    sends = [keyed(0, f"s{i}", i) for i in range(3)]
    client.sendall(b"".join(bytes(encode(c)) for c in (sends + pulls if sends_first
                                                       else pulls + sends)))
    replies = replies_in_turns(reactor, client, 5)
    reactor.close()
    rig.close()
    return driver, {r.opaque: r.code for r in replies}, heads


def test_pulls_ahead_of_sends_cost_no_kernel_call_and_the_sends_behind_them_take_the_lane(
        tmp_path, monkeypatch):
    """One read: two pulls, then three sends. The pulls are answered by
    the pull lane, and the send lane's kernel never reads a buffer whose
    first frame says (its header's first key, as every RocketMQ client
    writes it) it is not a send; the sends behind the pulls still take the
    send lane (after the first of them, which goes the usual way: the lane
    is tried again after a send)."""
    driver, codes, heads = _pulls_and_sends(tmp_path, monkeypatch, sends_first=False)
    assert codes == {50: R.SUCCESS, 51: R.PULL_NOT_FOUND, 0: R.SUCCESS, 1: R.SUCCESS, 2: R.SUCCESS}
    # the pull lane's chunk took both: the first found records, the second
    # none and does not wait (no PULL_SUSPEND): PULL_NOT_FOUND
    assert driver.lane.taken == 2 and (driver.pull_lane.taken, driver.pulls_run) == (2, 0)
    assert heads["send"] and all(h.startswith(b'{"code":310,') for h in heads["send"]), heads


def test_sends_ahead_of_pulls_cost_the_pull_lane_no_kernel_call(tmp_path, monkeypatch):
    """One read: three sends, then two pulls. The pull lane's kernel never
    reads a buffer whose first frame says it is not a pull (it read the
    sends' before); the sends take the send lane, and every request is
    answered."""
    driver, codes, heads = _pulls_and_sends(tmp_path, monkeypatch, sends_first=True)
    assert codes == {0: R.SUCCESS, 1: R.SUCCESS, 2: R.SUCCESS, 50: R.SUCCESS, 51: R.PULL_NOT_FOUND}
    assert driver.lane.taken == 3
    assert all(h.startswith(b'{"code":11,') for h in heads["pull"]), heads


@pytest.mark.parametrize("head, says", [(b'{"code":310,"flag":0', False),
                                        (b'{"code":11,"flag":0', True),
                                        (b'{ "code" : 11 , "flag":0', True),
                                        (b'{"flag":0,"code":11', False),     # says nothing first
                                        (b'{"code":"11"', False),
                                        (b'', False)])
def test_a_frame_says_another_code_only_where_its_header_begins_with_it(head, says):
    from shmq.core import sends as F
    frame = struct.pack(">ii", 4 + len(head), len(head)) + head
    assert F.says_other_code(bytearray(b"xx" + frame), 2, {310}) is says


# ------------------------------------------------------------------ the pull lane
def _pull_frames() -> tuple[list, int]:
    """(commands, how many the pull lane runs): the pulls of the C++ core
    and ali-ons as captured, with a commit, a tag, refusals, a tag no
    record has, an empty queue without suspension, one that parks and is
    answered by a send behind it, a oneway one, and a heartbeat and a
    binary-header pull that go the usual way."""
    from shmq.client.requests import pull_message
    from shmq.ipc.remoting import ROCKETMQ
    cmds = [golden("cpp-1.2-pull"), golden("ons-3.12-pull"),
            golden("cpp-1.2-pull", sysFlag="7", commitOffset="2"),          # commits offset 2
            golden("ons-3.12-pull", subscription="TagC"),
            golden("ons-3.12-pull", subscription="||"),                    # SUBSCRIPTION_PARSE_FAILED
            golden("ons-3.12-pull", topic="NoSuchTopic"),                  # TOPIC_NOT_EXIST
            golden("ons-3.12-pull", queueId="9"),                          # queueId illegal
            golden("ons-3.12-pull", queueOffset="one"),                    # not a number
            golden("ons-3.12-pull", sysFlag="3"),                          # no commitOffset
            golden("ons-3.12-pull", queueId="1", maxMsgNums="2"),          # numbers, null: _wire
            golden("ons-3.12-pull", subscription="TagZ"),                  # PULL_RETRY_IMMEDIATELY
            golden("ons-3.12-pull", queueId="2", sysFlag="4"),             # not found, no suspend
            golden("ons-3.12-heartbeat"),                                   # the usual way
            pull_message("GoldenTopic", 1, 0, group="GoldenCG"),            # shmq's own client
            pull_message("GoldenTopic", 0, 999, group="GoldenCG"),          # PULL_OFFSET_MOVED
            golden("ons-3.12-pull", queueId="3")]                           # parks: 15 s
    binary = golden("cpp-1.2-pull")
    binary.serialize_type = ROCKETMQ                                        # the usual way
    oneway = golden("cpp-1.2-pull")
    oneway.flag |= FLAG_ONEWAY                                              # no answer
    cmds += [binary, oneway, keyed(3, "for-the-parked-pull", 0)]
    del cmds[8].ext["commitOffset"]
    for i, c in enumerate(cmds):
        c.opaque = 300 + i
    return cmds, len(cmds) - 3


def _wire(cmds: list) -> bytes:
    """The frames of ``cmds``; the tenth's queueId and maxMsgNums as JSON
    numbers and its subscription null (decode_json_header turns them into
    the strings "1" and "2", and drops the null)."""
    frames = [bytes(encode(c)) for c in cmds]
    f = frames[9]
    for old, new in ((b'"queueId":"1"', b'"queueId":1'), (b'"maxMsgNums":"2"', b'"maxMsgNums":2'),
                     (b'"subscription":"TagA || TagO"', b'"subscription":null')):
        assert old in f
        f = f.replace(old, new)
    cut = len(frames[9]) - len(f)
    head = struct.unpack_from(">i", f, 4)[0] - cut        # (a JSON header: the type byte is 0)
    frames[9] = struct.pack(">ii", len(f) - 4, head) + f[8:]
    return b"".join(frames)


def _pull_run(root: str, lane: bool):
    rig = Rig(root)
    rig.ok(create_topic("GoldenTopic", 4))
    rig.ok(golden("cpp-1.2-send", queueId="0"))               # TagA
    rig.ok(golden("cpp-1.2-send-batch", queueId="0"))         # TagC, TagC
    rig.ok(keyed(1, "q1", 0))
    reactor, driver, client = driven(rig, lane=lane)
    cmds, _ = _pull_frames()
    answered = sum(1 for c in cmds if not c.flag & FLAG_ONEWAY)
    client.sendall(_wire(cmds))
    replies = replies_in_turns(reactor, client, answered)
    seen = {}
    for r in replies:
        recs = [(m.queue_id, m.queue_offset, m.tags, m.body) for m in decode_records(r.body)] \
            if r.code == R.SUCCESS and r.body else r.body
        seen[r.opaque] = (r.code, r.remark, r.ext, recs)
    committed = rig.registry.get_offset("GoldenTopic", "GoldenCG", 0)
    reactor.close()
    rig.close()
    return (driver.pull_lane.taken, driver.pulls_run), seen, committed


def test_the_pull_lane_answers_exactly_as_every_request_is_answered(tmp_path):
    """The same frames, one read, through a worker's driver with the lanes
    and without: the same answer to each (code, remark, ext fields, the
    records), the same offset committed, the parked pull answered once by
    the send behind it. The lane's chunks took the pulls that found
    records or found none and do not wait; it ran every other pull one by
    one but the binary and oneway ones."""
    from shmq.client.requests import decode_records  # noqa: F401 (used by _pull_run)
    ran, seen, committed = _pull_run(str(tmp_path / "lane"), lane=True)
    ran0, seen0, committed0 = _pull_run(str(tmp_path / "usual"), lane=False)
    cmds, lane_pulls = _pull_frames()
    assert ran == (9, lane_pulls - 1 - 9) and ran0 == (0, 0)    # (the heartbeat is not a pull)
    assert seen == seen0 and committed == committed0 == 2
    codes = [seen[c.opaque][0] if c.opaque in seen else None for c in cmds]
    assert codes == [R.SUCCESS, R.SUCCESS, R.SUCCESS, R.SUCCESS, R.SUBSCRIPTION_PARSE_FAILED,
                     R.TOPIC_NOT_EXIST, R.SYSTEM_ERROR, R.SYSTEM_ERROR, R.SYSTEM_ERROR, R.SUCCESS,
                     R.PULL_RETRY_IMMEDIATELY, R.PULL_NOT_FOUND, R.SUCCESS, R.SUCCESS,
                     R.PULL_OFFSET_MOVED, R.SUCCESS, R.SUCCESS, None, R.SUCCESS]
    assert [t for _, _, t, _ in seen[303][3]] == ["TagC", "TagC"]
    assert [b for _, _, _, b in seen[309][3]] == [b"q1"]
    assert int(seen[310][2]["nextBeginOffset"]) == 3          # past the three it skipped
    assert [b for _, _, _, b in seen[315][3]] == [b"for-the-parked-pull"]


def test_pulls_that_all_park_are_each_read_by_the_kernel_at_most_twice(tmp_path, monkeypatch):
    """A consumer's pulls of 16 caught-up queues in one read (after a
    rebalance): each parks, so the pull lane's chunk takes none of them and
    the way every request goes runs each. The kernel reads the first chunk
    whole, then one frame ahead after each chunk that took nothing (the
    last pull, alone, is not a chunk's): 30 frames read, not the 16 + 15 +
    … + 2 a chunk after every pull would."""
    from shmq.core import sends as F
    read = F.read_pulls
    frames_read = []

    def reading(view, pos, end, window, *args):
        n = read(view, pos, end, window, *args)
        frames_read.append(n)
        return n

    monkeypatch.setattr(F, "read_pulls", reading)
    rig = Rig(str(tmp_path))
    rig.ok(create_topic("GoldenTopic", 16))
    reactor, driver, client = driven(rig)
    pulls = [golden("ons-3.12-pull", queueId=str(q)) for q in range(16)]    # PULL_SUSPEND set
    for i, p in enumerate(pulls):
        p.opaque = 700 + i
    client.sendall(b"".join(bytes(encode(p)) for p in pulls))
    for _ in range(50):
        reactor.run_once()
        if driver.pulls_run == 16:
            break
    assert (driver.pull_lane.taken, driver.pulls_run) == (0, 16)
    assert sum(len(w) for w in rig.parking.pulls.values()) == 16 and not _readable(client)
    assert frames_read == [16] + [1] * 14 and sum(frames_read) == 30
    reactor.close()
    rig.close()
