"""The request handlers with no socket: frames captured from real clients
(tests/golden/, see test_golden_frames.py) replayed into ``Handlers`` over a
real store (files in a temp dir, the shared control block, the shared
registry), checking each reply: code, remark, ext fields, body. Long polling
and SYNC_FLUSH run on a fake clock: the tests advance it, nothing sleeps.

What the real-client compatibility tests see over sockets, these see at
the handler: the same answers, and a parked request answered exactly once.
"""
from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from conftest import small_config
from shmq.broker.config import BrokerConfig
from shmq.broker.delivery import DELAY, REAL_TOPIC, RETRY_TOPIC, tags_code_rules
from shmq.broker.handlers import PARKED, Handlers, Peer, Reply
from shmq.broker.parking import FLUSH_TIMEOUT_REMARK
from shmq.broker.registry import Registry, registry_bytes
from shmq.broker.shared_store import StoreOwner, extra_region
from shmq.broker.topics import SCHEDULE_TOPIC, Tables
from shmq.client.requests import create_topic, decode_records
from shmq.core.layout import java_string_hash
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.codes import not_supported_remark
from shmq.ipc.control import WANT_FLUSH, WANT_QUEUES
from shmq.ipc.headers import V1_KEYS
from shmq.ipc.remoting import (FLAG_ONEWAY, JSON, ROCKETMQ, VERSION_4_9_7, FrameDecoder, RemotingCommand,
                               encode, encode_head)

GOLDEN = Path(__file__).parent / "golden"
TICK_S = 0.002            # a parked answer is due within the timer queue's tick after its deadline
TCP = "10.9.8.7:41234"


def golden(name: str, **ext) -> RemotingCommand:
    """A captured frame, decoded; ``ext`` overrides header fields (by their
    V1 names: a V2 send's letters are found through V1_KEYS)."""
    d = FrameDecoder()
    d.receive_data((GOLDEN / f"{name}.bin").read_bytes())
    cmd = d.next_command()
    assert cmd is not None and d.next_command() is None
    v2 = cmd.code in (RC.SEND_MESSAGE_V2, RC.SEND_BATCH_MESSAGE)
    for k, v in ext.items():
        cmd.ext[V1_KEYS[k] if v2 else k] = v
    return cmd


def decoded(r: Reply) -> Reply:
    """``r`` with its command read back when it was made as bytes (a pull's
    head, from a template), as a client reads it: those bytes must be
    exactly what ``encode_head`` makes of that command."""
    if type(r.cmd) is not bytes:
        return r
    cmd = r.command()
    assert encode_head(cmd, r.nbytes) == r.cmd
    return Reply(cmd, r.parts, r.nbytes)


def answers(out: list) -> list:
    """Parked requests' answers, ``(peer, Reply)``, each ``decoded``."""
    return [(peer, decoded(r)) for peer, r in out]


class FakeClock:
    def __init__(self):
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


class _Owner(StoreOwner):
    """The store's owner, without its flusher: the tests flush (or do not)."""

    def start_flusher(self) -> None:
        self.flusher = None


class Rig:
    def __init__(self, root: str, store: dict | None = None, dedup_window: int = 0, **broker):
        self.config = BrokerConfig(store=small_config(root, **(store or {})), **broker)
        sc = self.config.store
        self.owner = _Owner(sc, extra_bytes=registry_bytes(),
                            tags_code_rules=tags_code_rules(self.config.delay_levels_ms),
                            dedup_window=dedup_window)
        self.owner.open()
        self.store, self.cb = self.owner.store, self.owner.cb
        self.registry = Registry(extra_region(self.cb, self.store), root, create=True)
        Tables(self.config, self.store.state).ensure_system_topics()
        self.clock = FakeClock()
        self.h = Handlers(self.config, self.store, self.cb, Tables(self.config, self.store.state),
                          self.registry, clock=self.clock)
        self.parking = self.h.parking
        self.tcp = Peer(1, TCP)
        self.unix = Peer(2, "unix")

    def call(self, cmd: RemotingCommand, peer: Peer | None = None):
        r = self.h.handle(peer or self.tcp, cmd)
        if type(r) is bytes:    # a whole frame (a send's template): read it as a client does
            dec = FrameDecoder()
            dec.receive_data(r)
            reply = dec.next_command()
            assert dec.buffered_bytes == 0 and reply.serialize_type == cmd.serialize_type
            return Reply(reply)
        if isinstance(r, Reply):
            r = decoded(r)
            assert r.cmd.serialize_type == cmd.serialize_type
        return r

    def ok(self, cmd: RemotingCommand, peer: Peer | None = None) -> RemotingCommand:
        r = self.call(cmd, peer)
        assert isinstance(r, Reply), r
        assert r.cmd.code == R.SUCCESS, r.cmd.remark
        return r.cmd

    def flags(self) -> int:
        return int(self.cb.proc_flags[self.cb.slot])

    def close(self) -> None:
        self.owner.close()


@pytest.fixture
def rig(store_dir):
    r = Rig(store_dir)
    r.ok(create_topic("GoldenTopic", 4))
    yield r
    r.close()


@pytest.fixture
def sync_rig(store_dir):
    r = Rig(store_dir, store={"flushDiskType": "SYNC_FLUSH", "syncFlushTimeout": 5000})
    r.ok(create_topic("GoldenTopic", 4))
    yield r
    r.close()


def body_of(reply: Reply) -> bytes:
    assert reply.nbytes == sum(len(memoryview(p).cast("B")) for p in reply.parts)
    return b"".join(bytes(p) for p in reply.parts)


def assert_echoes(reply: RemotingCommand, cmd: RemotingCommand) -> None:
    assert reply.is_response and reply.opaque == cmd.opaque


# ------------------------------------------------------------------ sends
def test_a_cpp_v1_send_is_stored_with_its_born_host_and_answered_as_rocketmq_does(rig):
    cmd = golden("cpp-1.2-send", queueId="1")
    r = rig.ok(cmd)
    assert_echoes(r, cmd)
    assert r.serialize_type == JSON            # as the request came
    assert set(r.ext) == {"msgId", "queueId", "queueOffset", "MSG_REGION", "TRACE_ON"}
    assert (r.ext["queueId"], r.ext["queueOffset"], r.ext["TRACE_ON"]) == ("1", "0", "true")
    [m] = rig.store.read_queue("GoldenTopic", 1)
    assert r.ext["msgId"] == rig.h.msgid_prefix + f"{m.phy_offset:016X}" == m.offset_msg_id()
    assert m.body == b"golden-body-1" and m.tags == "TagA" and m.keys == ["key-1", "key-2"]
    assert m.born_host == ("10.9.8.7", 41234) and m.store_host == ("127.0.0.1", 10911)
    assert m.born_timestamp == int(cmd.ext["bornTimestamp"])
    p = m.properties
    assert p["CLUSTER"] == "DefaultCluster" and p["UNIQ_KEY"] == rig.store.read_queue("GoldenTopic", 1)[0].properties["UNIQ_KEY"]


def test_a_send_behind_a_stalled_append_is_system_busy_pc_synchronized(store_dir):
    """Appends publish in claim order: one whose writer stalls after claiming
    holds back every later one. Past osPageCacheBusyTimeOutMills new sends
    are refused as RocketMQ refuses them while its put lock is held too long,
    instead of piling up behind it; once it finishes they are stored again."""
    import threading
    import time

    from shmq.core.records import encode
    rig = Rig(store_dir, store={"osPageCacheBusyTimeOutMills": 1})
    rig.ok(create_topic("GoldenTopic", 4))
    store = rig.store
    claimed, go = threading.Event(), threading.Event()

    def stall(stage, seq):
        if stage == "claimed":
            store.hook = None
            claimed.set()
            assert go.wait(30)

    store.hook = stall
    t = threading.Thread(target=store.append, args=(encode("GoldenTopic", [b"slow"], properties=b""),))
    t.start()
    try:
        assert claimed.wait(30)
        time.sleep(0.02)                            # > 1 ms in flight
        assert store.busy_ms(int(time.time() * 1000)) >= 20
        r = rig.call(golden("cpp-1.2-send", queueId="1"))
        assert r.cmd.code == R.SYSTEM_BUSY
        assert r.cmd.remark.startswith("[PC_SYNCHRONIZED]broker busy")
    finally:
        go.set()
        t.join(30)
    assert store.busy_ms(int(time.time() * 1000)) == 0
    assert rig.ok(golden("cpp-1.2-send", queueId="1")).ext["queueOffset"] == "0"
    assert [m.body for m in store.read_queue("GoldenTopic", 1)] == [b"golden-body-1"]
    rig.close()


def test_an_append_given_up_behind_a_stalled_one_does_not_make_the_store_busy(store_dir):
    """An append interrupted while it waits for the claim ahead (a Ctrl-C of a
    direct producer, delivered in the store's ``on_wait``) leaves its record
    written and its claim to whoever publishes next. Once the stalled one
    published, that claim is the oldest unpublished: counted busy past
    osPageCacheBusyTimeOutMills, every send was refused before claiming, so
    none came to publish it and the store stayed busy while its owner lived.
    It is not busy: the next send is stored, after the given-up record."""
    import threading
    import time

    from shmq.core.records import encode
    rig = Rig(store_dir, store={"osPageCacheBusyTimeOutMills": 1})
    rig.ok(create_topic("GoldenTopic", 4))
    store = rig.store
    claimed, go, waiting = threading.Event(), threading.Event(), threading.Event()

    def stall(stage, seq):
        if stage == "claimed" and threading.current_thread() is staller:
            claimed.set()
            assert go.wait(30)

    class Interrupted(Exception):
        pass

    def interrupt():                     # the behind thread's wait: interrupted
        if threading.current_thread() is behind:
            waiting.set()
            raise Interrupted

    def append_behind():
        with pytest.raises(Interrupted):
            store.append(encode("GoldenTopic", [b"given up"], queue_ids=1, properties=b""))

    store.hook, store.on_wait = stall, interrupt
    staller = threading.Thread(target=store.append,
                               args=(encode("GoldenTopic", [b"stalled"], queue_ids=1, properties=b""),))
    behind = threading.Thread(target=append_behind)
    staller.start()
    try:
        assert claimed.wait(30)
        behind.start()
        assert waiting.wait(30)
        behind.join(30)
    finally:
        go.set()
        staller.join(30)
    store.hook = store.on_wait = None
    time.sleep(0.02)                                # > 1 ms since the given-up claim
    assert store.busy_ms(int(time.time() * 1000)) == 0
    assert rig.ok(golden("cpp-1.2-send", queueId="1")).ext["queueOffset"] == "2"
    assert [m.body for m in store.read_queue("GoldenTopic", 1)] == [
        b"stalled", b"given up", b"golden-body-1"]
    rig.close()


def test_a_unix_socket_client_is_born_at_127_0_0_1_port_0_and_a_send_without_the_oneway_bit_is_answered(rig):
    cmd = golden("cpp-1.2-send-oneway", queueId="0")
    assert cmd.flag == 0
    r = rig.ok(cmd, rig.unix)
    assert r.ext["queueOffset"] == "0"
    [m] = rig.store.read_queue("GoldenTopic", 0)
    assert m.born_host == ("127.0.0.1", 0) and m.body == b"golden-oneway"


def test_a_oneway_request_is_run_and_not_answered(rig):
    cmd = golden("cpp-1.2-send", queueId="0")
    cmd.flag |= FLAG_ONEWAY
    assert rig.call(cmd) is None
    assert [m.body for m in rig.store.read_queue("GoldenTopic", 0)] == [b"golden-body-1"]


def test_a_cpp_batch_flagged_batch_1_is_split_into_its_messages(rig):
    cmd = golden("cpp-1.2-send-batch", queueId="2")
    r = rig.ok(cmd)
    msgs = rig.store.read_queue("GoldenTopic", 2)
    assert [m.body for m in msgs] == [b"b1", b"b2"] and [m.keys for m in msgs] == [["kb1"], ["kb2"]]
    assert r.ext["msgId"].split(",") == [m.offset_msg_id() for m in msgs]
    assert r.ext["queueOffset"] == "0"


@pytest.mark.parametrize("name", ["ons-3.12-send-v2", "ons-3.12-send-v2-sharding-key"])
def test_an_ali_ons_v2_send_reads_its_one_letter_keys(rig, name):
    cmd = golden(name, queueId="3")
    r = rig.ok(cmd)
    assert r.ext["queueId"] == "3"
    [m] = rig.store.read_queue("GoldenTopic", 3)
    assert m.body == cmd.body and m.born_host == ("10.9.8.7", 41234)
    sent = {k: v for k, v in (s.split("\x01", 1) for s in cmd.ext["i"].split("\x02") if s)}
    assert {k: m.properties[k] for k in sent} == sent


def test_a_send_to_a_new_topic_creates_it_from_tbw102(store_dir):
    rig = Rig(store_dir)
    try:
        r = rig.ok(golden("cpp-1.2-send", queueId="3"))
        assert r.ext["queueId"] == "3"
        tc = rig.h.tables.topics.get("GoldenTopic")
        assert (tc.read_queue_nums, tc.write_queue_nums) == (4, 4)    # defaultTopicQueueNums
    finally:
        rig.close()


def keyed(qid: int, key: str, opaque: int, body: bytes = b"", **ext) -> RemotingCommand:
    """An ali-ons V2 send to ``qid`` carrying UNIQ_KEY ``key`` (as every
    RocketMQ client sets one), its body ``body`` (default: the key)."""
    cmd = golden("ons-3.12-send-v2", queueId=str(qid), **ext)
    cmd.ext["i"] = f"TAGS\x01TagA\x02UNIQ_KEY\x01{key}\x02"
    cmd.opaque = opaque
    cmd.body = body or key.encode()
    return cmd


def turn(rig, cmds: list, peer: Peer | None = None) -> list:
    """The sends of one reactor turn: each taken, then the group flushed;
    the answers (commands), in the order the group gave them."""
    for cmd in cmds:
        assert rig.h.take(peer or rig.tcp, cmd)
    out = []
    for p, a in rig.h.flush_group():
        assert p is (peer or rig.tcp)
        if type(a) is bytes:
            dec = FrameDecoder()
            dec.receive_data(a)
            out.append(dec.next_command())
            assert dec.buffered_bytes == 0
        else:
            out.append(decoded(a).cmd)
    return out


def test_the_sends_of_one_turn_are_stored_in_one_claim_per_queue_and_answered_in_order(rig):
    """Issue 14: sends pipelined in one reactor turn share a claim, a write
    and a publish per queue; each is answered as alone, in the order sent."""
    seq0 = rig.store.state.get("claim_seq")
    cmds = [keyed(i % 2, f"k{i}", 100 + i) for i in range(6)]
    oneway = keyed(0, "k-oneway", 999)
    oneway.flag |= FLAG_ONEWAY
    for cmd in cmds[:3] + [oneway] + cmds[3:]:
        assert rig.h.take(rig.tcp, cmd)
    assert rig.store.read_queue("GoldenTopic", 0) == []        # nothing before the turn ends
    out = rig.h.flush_group()
    assert rig.store.state.get("claim_seq") == seq0 + 2          # queue 0's and queue 1's
    replies = []
    for _, frame in out:
        dec = FrameDecoder()
        dec.receive_data(frame)
        replies.append(dec.next_command())
    assert [r.opaque for r in replies] == [c.opaque for c in cmds]    # the oneway: no answer
    assert all(r.code == R.SUCCESS and r.is_response for r in replies)
    q0, q1 = rig.store.read_queue("GoldenTopic", 0), rig.store.read_queue("GoldenTopic", 1)
    assert [m.body for m in q0] == [b"k0", b"k2", b"k-oneway", b"k4"]
    assert [m.body for m in q1] == [b"k1", b"k3", b"k5"]
    by_body = {m.body: m for m in q0 + q1}
    for cmd, r in zip(cmds, replies):
        m = by_body[cmd.body]
        assert r.ext["msgId"] == m.offset_msg_id()
        assert (r.ext["queueId"], r.ext["queueOffset"]) == (str(m.queue_id), str(m.queue_offset))
        assert m.properties["UNIQ_KEY"] == cmd.body.decode() and m.born_host == ("10.9.8.7", 41234)
    assert rig.h.put_count == 7


def test_a_send_refused_or_delayed_in_a_turn_is_answered_in_its_place(rig):
    delayed = keyed(0, "late", 3)
    delayed.ext["i"] += f"{DELAY}\x012\x02"
    bad = keyed(0, "x", 2, topic="NoSuch", defaultTopic="NoDefault")
    later = keyed(2, "later", 6)
    later.ext["i"] += f"{DELAY}\x012\x02"
    seq0 = rig.store.state.get("claim_seq")
    out = turn(rig, [keyed(0, "a", 1), bad, delayed, keyed(0, "b", 4), keyed(9, "q9", 5), later])
    assert rig.store.state.get("claim_seq") - seq0 == 2     # queue 0's; the delay level's
    assert [r.opaque for r in out] == [1, 2, 3, 4, 5, 6]
    assert [r.code for r in out] == [R.SUCCESS, R.TOPIC_NOT_EXIST, R.SUCCESS, R.SUCCESS,
                                     R.SYSTEM_ERROR, R.SUCCESS]
    assert [(r.ext["queueId"], r.ext["queueOffset"]) for r in (out[2], out[5])] == [
        ("0", "0"), ("2", "1")]                 # the request's queue, the delay queue's offset
    assert out[4].remark.startswith("request queueId[9] is illegal")
    assert [m.body for m in rig.store.read_queue("GoldenTopic", 0)] == [b"a", b"b"]
    late = rig.store.read_queue(SCHEDULE_TOPIC, 1)           # delay level 2: queue 1
    assert [m.body for m in late] == [b"late", b"later"]
    assert [m.properties[REAL_TOPIC] for m in late] == ["GoldenTopic"] * 2


def test_a_routed_send_that_stays_in_its_queue_keeps_its_place_in_the_turn(rig):
    """DELAY=0, a property merely ending in DELAY, a delivery time past:
    routed sends stored in their own queue after all, in the order sent."""
    cmds = [keyed(0, "1", 1), keyed(0, "2", 2), keyed(0, "3", 3), keyed(0, "4", 4),
            keyed(0, "5", 5)]
    cmds[1].ext["i"] += f"{DELAY}\x010\x02"
    cmds[2].ext["i"] += "MY_RETRY_DELAY\x015\x02"
    out = turn(rig, cmds)
    assert [r.ext["queueOffset"] for r in out] == ["0", "1", "2", "3", "4"]
    assert [m.body for m in rig.store.read_queue("GoldenTopic", 0)] == [b"1", b"2", b"3", b"4", b"5"]


def driven(rig, lane: bool = True):
    """A worker's driver and reactor over ``rig``'s handlers, with one
    connection: (reactor, driver, the client's end of it). ``lane=False``:
    without the send lane (its sends go the way every request goes)."""
    import socket

    from shmq.broker.reactor import Reactor
    from shmq.broker.worker import Driver
    reactor = Reactor()
    driver = Driver(reactor, rig.h)
    a, b = socket.socketpair()
    conn = driver.add_connection(a, "unix", 8 << 20)
    if not lane:
        conn.lane = None
    b.settimeout(5)
    return reactor, driver, b


def turns_until(reactor, done, what: str, most: int = 500) -> int:
    """Run ``reactor``'s turns until ``done()``; how many it took. A turn
    waits at most 10 ms for something to happen (a timer each turn), and
    after ``most`` turns the test fails naming ``what``: a regression that
    stops the worker ends the test, not the suite's time."""
    for turn in range(1, most + 1):
        reactor.call_later(0.01, lambda: None)
        reactor.run_once()
        if done():
            return turn
    raise AssertionError(f"not after {most} reactor turns: {what}")


def replies_in_turns(reactor, client, n: int, what: str = "") -> list:
    """Run ``reactor``'s turns (``turns_until``) until ``n`` replies came to
    ``client``, the client end of a ``driven`` connection: the replies."""
    import select
    replies: list = []

    def got() -> bool:
        if select.select([client], [], [], 0)[0]:
            replies.extend(read_replies(client, 1))
        return len(replies) >= n
    turns_until(reactor, got, what or f"{n} replies")
    return replies


def read_replies(sock, n: int) -> list:
    dec, out = FrameDecoder(), []
    while len(out) < n:
        data = sock.recv(1 << 16)
        if not data:
            break
        dec.receive_data(data)
        while (r := dec.next_command()) is not None:
            out.append(r)
    return out


def test_sends_read_with_a_malformed_frame_are_answered_before_the_close(rig):
    reactor, driver, client = driven(rig)
    cmds = [keyed(0, "m0", 10), keyed(0, "m1", 11)]
    client.sendall(b"".join(bytes(encode(c)) for c in cmds) + b"\x00\x00\x00\x03\x00\x00\x00\x00")
    reactor.run_once()
    assert [r.opaque for r in read_replies(client, 2)] == [10, 11]
    assert client.recv(10) == b""                                  # then closed
    assert [m.body for m in rig.store.read_queue("GoldenTopic", 0)] == [b"m0", b"m1"]
    reactor.close()


def test_a_turn_appends_what_it_took_each_time_their_bodies_pass_the_cap(rig, monkeypatch):
    """Sends taken are out of the decoders' account until appended: a turn
    appends them whenever their bodies reach TAKEN_BYTES_MAX."""
    import shmq.broker.worker as worker
    monkeypatch.setattr(worker, "TAKEN_BYTES_MAX", 2500)
    reactor, driver, client = driven(rig, lane=False)
    held = []
    flush = rig.h.flush_group
    monkeypatch.setattr(rig.h, "flush_group", lambda: (held.append(len(rig.h.taken)), flush())[1])
    cmds = [keyed(0, f"k{i}", i, body=bytes([65 + i]) * 1000) for i in range(7)]
    client.sendall(b"".join(bytes(encode(c)) for c in cmds))
    turns_until(reactor, lambda: len(rig.store.read_queue("GoldenTopic", 0)) >= 7,
                "7 sends stored")
    assert held == [3, 3, 1]
    assert [r.opaque for r in read_replies(client, 7)] == list(range(7))
    assert [m.body for m in rig.store.read_queue("GoldenTopic", 0)] == [c.body for c in cmds]
    reactor.close()


def readable_answers(client) -> int:
    """How many whole frames the client end of a ``driven`` connection can
    read now (left there to read)."""
    import socket
    client.setblocking(False)
    try:
        data = client.recv(1 << 20, socket.MSG_PEEK)
    except BlockingIOError:
        data = b""
    client.settimeout(5)
    dec, n = FrameDecoder(), 0
    dec.receive_data(data)
    while dec.next_command() is not None:
        n += 1
    return n


def test_a_turn_answers_each_group_of_sends_before_it_appends_the_next(rig, monkeypatch):
    """A turn that read more than ANSWER_EVERY sends appends and answers
    them that many at a time, each group's answers written before the next
    group is appended: a producer with a window in flight sends its next
    ones meanwhile (issue 14: the two processes overlap instead of taking
    turns)."""
    from shmq.broker.worker import ANSWER_EVERY
    reactor, driver, client = driven(rig, lane=False)
    readable = []           # at each append of a group: (its sends, the answers the client can read)
    flush = rig.h.flush_group
    monkeypatch.setattr(rig.h, "flush_group",
                        lambda: (readable.append((len(rig.h.taken), readable_answers(client))),
                                 flush())[1])
    n = 2 * ANSWER_EVERY + 6
    cmds = [keyed(i % 2, f"w{i}", i) for i in range(n)]
    client.sendall(b"".join(bytes(encode(c)) for c in cmds))     # one read: one turn
    reactor.run_once()
    assert readable == [(ANSWER_EVERY, 0), (ANSWER_EVERY, ANSWER_EVERY), (6, 2 * ANSWER_EVERY)]
    assert [r.opaque for r in read_replies(client, n)] == list(range(n))
    for q in (0, 1):
        assert [m.body for m in rig.store.read_queue("GoldenTopic", q)] == \
            [c.body for c in cmds[q::2]]
    reactor.close()


def test_a_peer_gone_when_a_group_is_answered_leaves_nothing_behind(rig):
    """A group's answers written mid-turn to a client that stopped reading
    close its connection there: what was appended was answered-or-lost as
    any unanswered send is (a retry is a duplicate the window catches), the
    rest of its frames are dropped unappended, and the reactor holds
    nothing of it (pending bytes, connection, peer); a connection sending
    in the same turn is served whole."""
    import socket

    from shmq.broker.worker import ANSWER_EVERY
    reactor, driver, client = driven(rig)
    a, b = socket.socketpair()
    driver.add_connection(a, "unix", 8 << 20)
    n = 2 * ANSWER_EVERY + 6
    client.sendall(b"".join(bytes(encode(keyed(0, f"gone{i}", i))) for i in range(n)))
    client.shutdown(socket.SHUT_RD)                 # its answers cannot be delivered
    b.sendall(b"".join(bytes(encode(keyed(1, f"live{i}", i))) for i in range(n)))
    b.settimeout(5)
    turns_until(reactor, lambda: len(rig.store.read_queue("GoldenTopic", 1)) >= n,
                f"{n} sends stored")
    assert [r.opaque for r in read_replies(b, n)] == list(range(n))
    gone = [m.body for m in rig.store.read_queue("GoldenTopic", 0)]
    assert gone == [f"gone{i}".encode() for i in range(len(gone))]    # a prefix, in order
    assert len(driver.peers) == 1 and len(reactor.conns) == 1 and reactor.pending == 0
    reactor.close()


def test_a_batch_send_is_answered_before_the_next_request_of_the_turn_runs(rig, monkeypatch):
    """A SEND_BATCH_MESSAGE is one claim, a group of sends already: its
    answer is written at once, before the turn runs the next batch (an
    accumulating producer refills meanwhile)."""
    from shmq.client.requests import send_batch
    reactor, driver, client = driven(rig)
    readable = []           # at each request run: the answers the client can read
    handle = rig.h.handle
    monkeypatch.setattr(rig.h, "handle", lambda peer, cmd: (readable.append(
        readable_answers(client)), handle(peer, cmd))[1])
    cmds = [send_batch("GoldenTopic", [(f"b{i}-{j}".encode(), "") for j in range(4)], queue_id=0)
            for i in range(3)]
    for i, c in enumerate(cmds):
        c.opaque = i
    client.sendall(b"".join(bytes(encode(c)) for c in cmds))     # one read: one turn
    reactor.run_once()
    assert readable == [0, 1, 2]
    assert [(r.opaque, r.code) for r in read_replies(client, 3)] == [(i, R.SUCCESS) for i in range(3)]
    assert [m.body for m in rig.store.read_queue("GoldenTopic", 0)] == \
        [f"b{i}-{j}".encode() for i in range(3) for j in range(4)]
    reactor.close()


def test_a_turn_of_large_sends_is_appended_in_runs_that_fit_a_segment(store_dir):
    """A claim takes at most a quarter of a segment (or 1 MiB): a turn
    whose sends together exceed a segment is stored whole, across the
    roll, each in its order."""
    rig = Rig(store_dir, store={"mappedFileSizeCommitLog": 1 << 16, "maxMessageSize": 12000})
    rig.ok(create_topic("GoldenTopic", 4))
    seq0 = rig.store.state.get("claim_seq")
    cmds = [keyed(0, f"big{i}", i, body=bytes([65 + i]) * 5000) for i in range(20)]
    out = turn(rig, cmds)                              # 100 KB: two segments of 64 KiB
    assert [r.code for r in out] == [R.SUCCESS] * 20
    assert [int(r.ext["queueOffset"]) for r in out] == list(range(20))
    assert rig.store.state.get("claim_seq") - seq0 == 7     # 16 KiB runs: three 5 KB records each
    assert [m.body for m in rig.store.read_queue("GoldenTopic", 0)] == [c.body for c in cmds]
    rig.close()


def test_the_sends_of_a_sync_flush_turn_are_answered_once_their_run_is_flushed(sync_rig):
    rig = sync_rig
    cmds = [keyed(i % 2, f"s{i}", 10 + i) for i in range(4)]
    nowait = keyed(0, "nowait", 20)
    nowait.ext["i"] += "WAIT\x01false\x02"
    for cmd in cmds + [nowait]:
        assert rig.h.take(rig.tcp, cmd)
    [(peer, frame)] = rig.h.flush_group()               # WAIT=false: at once
    dec = FrameDecoder()
    dec.receive_data(frame)
    r = dec.next_command()
    assert peer is rig.tcp and (r.opaque, r.code, r.ext["queueOffset"]) == (20, R.SUCCESS, "2")
    assert rig.flags() & WANT_FLUSH
    assert rig.parking.on_wake() == []                   # woken, not flushed yet
    rig.store.flush_commitlog()
    got = answers(rig.parking.on_wake())
    assert sorted(r.cmd.opaque for _, r in got) == [10, 11, 12, 13]
    assert all(r.cmd.code == R.SUCCESS for _, r in got)
    assert {r.cmd.opaque: r.cmd.ext["queueOffset"] for _, r in got} == {10: "0", 11: "0",
                                                                        12: "1", 13: "1"}
    assert len(rig.parking.timers) == 0


def test_send_errors_carry_rocketmq_codes_and_remarks(rig):
    cmd = golden("cpp-1.2-send", topic="NoSuch", defaultTopic="NoDefault")
    r = rig.call(cmd).cmd
    assert (r.code, r.remark) == (R.TOPIC_NOT_EXIST, "topic[NoSuch] not exist, apply first please!")
    cmd = golden("ons-3.12-send-v2")
    del cmd.ext["b"]
    r = rig.call(cmd).cmd
    assert (r.code, r.remark) == (R.SYSTEM_ERROR, "the request header has no topic")
    # the header is read whole first, as RocketMQ decodes it: the first field
    # missing or not a number, in the header's order, even to a topic that
    # does not exist
    for key, value, remark in (("e", None, "the request header has no queueId"),
                               ("g", "", "the request header has no bornTimestamp"),
                               ("f", "x", "the request header's sysFlag='x' is not a number"),
                               ("j", "1.5", "the request header's reconsumeTimes='1.5' is not a number")):
        cmd = golden("ons-3.12-send-v2", topic="NoSuch")
        if value is None:
            del cmd.ext[key]
        else:
            cmd.ext[key] = value
        r = rig.call(cmd).cmd
        assert (r.code, r.remark) == (R.SYSTEM_ERROR, remark)
    r = rig.call(golden("cpp-1.2-send", queueId="9")).cmd
    assert (r.code, r.remark) == (R.SYSTEM_ERROR, "request queueId[9] is illegal, topic: GoldenTopic "
                                                  "writeQueueNums: 4")
    cmd = golden("cpp-1.2-send", queueId="0")
    cmd.body = b""
    r = rig.call(cmd).cmd
    assert (r.code, r.remark) == (R.MESSAGE_ILLEGAL, "the message body is empty")
    r = rig.call(golden("ons-3.12-get-routeinfo")).cmd      # a NameServer request
    assert (r.code, r.remark) == (R.REQUEST_CODE_NOT_SUPPORTED, not_supported_remark(RC.GET_ROUTEINFO_BY_TOPIC))


# ------------------------------------------------------------------ clients
def test_heartbeats_register_groups_and_subscriptions_and_membership_changes_are_notices(rig):
    cpp_peer, ons_peer = rig.tcp, rig.unix
    r = rig.ok(golden("cpp-1.2-heartbeat"), cpp_peer)
    assert r.version == VERSION_4_9_7
    cpp_id = orjson.loads(golden("cpp-1.2-heartbeat").body)["clientID"]
    assert rig.registry.group_members("GoldenCG") == [cpp_id]
    sub = rig.h.subs[("GoldenCG", "GoldenTopic")]      # C++ sends codeSet zeros: computed here
    assert sub.codes.tolist() == sorted(java_string_hash(t) for t in ("TagA", "TagB", "TagC", "TagO"))
    assert rig.h.due and rig.h.notices() == []          # first sight of the group: nothing to tell
    rig.ok(golden("ons-3.12-heartbeat"), ons_peer)
    ons_id = orjson.loads(golden("ons-3.12-heartbeat").body)["clientID"]
    assert rig.registry.group_members("GoldenCG") == sorted([cpp_id, ons_id])
    assert rig.h.subs[("GoldenCG", "GoldenTopic")].sub_string == "TagA || TagO"
    notes = rig.h.notices()
    assert {p.id for p, _ in notes} == {cpp_peer.id, ons_peer.id}
    for _, n in notes:
        assert n.cmd.code == RC.NOTIFY_CONSUMER_IDS_CHANGED and n.cmd.is_oneway
        assert n.cmd.ext == {"consumerGroup": "GoldenCG"}
    rig.ok(golden("ons-3.12-unregister-client"), ons_peer)
    assert rig.registry.group_members("GoldenCG") == [cpp_id]
    assert [p.id for p, _ in rig.h.notices()] == [cpp_peer.id]
    rig.h.connection_closed(cpp_peer)
    assert rig.registry.group_members("GoldenCG") == []


def test_a_cpp_orderly_consumer_locks_its_queues_once(rig):
    cmd = golden("cpp-1.2-lock-batch-mq")
    r = rig.ok(cmd)
    want = orjson.loads(cmd.body)["mqSet"]
    assert orjson.loads(r.body) == {"lockOKMQSet": want}
    other = RemotingCommand(RC.LOCK_BATCH_MQ, body=orjson.dumps(
        {"consumerGroup": "GoldenOrderCG", "clientId": "someone-else", "mqSet": want}))
    assert orjson.loads(rig.ok(other).body) == {"lockOKMQSet": []}


def test_cpp_unregister_client_is_answered(rig):
    rig.ok(golden("cpp-1.2-heartbeat"))
    rig.ok(golden("cpp-1.2-unregister-client"))
    assert rig.registry.group_members("GoldenCG") == []


# ------------------------------------------------------------------ offsets
def test_offsets_as_cpp_and_ali_ons_commit_and_query_them(rig):
    r = rig.ok(golden("ons-3.12-query-offset"))
    assert r.ext == {"offset": "0"}                     # a new group on a queue from its start
    rig.ok(golden("ons-3.12-update-offset"))            # queue 2 → 1
    assert rig.ok(golden("ons-3.12-query-offset", queueId="2")).ext == {"offset": "1"}
    rig.ok(golden("cpp-1.2-update-offset"))             # queue 0 → 1
    assert rig.ok(golden("cpp-1.2-query-offset")).ext == {"offset": "1"}
    rig.ok(golden("ons-3.12-update-offset-minus-one"))  # queue 0 → -1: "never consumed"
    assert rig.ok(golden("cpp-1.2-query-offset")).ext == {"offset": "0"}


def test_a_pull_with_the_commit_offset_flag_commits_the_offset_it_carries(rig):
    rig.ok(golden("cpp-1.2-send", queueId="0"))
    rig.ok(golden("cpp-1.2-pull", sysFlag="7", commitOffset="1"))    # a push consumer's commit
    assert rig.ok(golden("cpp-1.2-query-offset")).ext == {"offset": "1"}
    rig.ok(golden("cpp-1.2-pull", commitOffset="5"))                 # flag clear: not committed
    assert rig.ok(golden("cpp-1.2-query-offset")).ext == {"offset": "1"}
    r = rig.call(golden("cpp-1.2-pull", sysFlag="7", commitOffset="one")).cmd
    assert (r.code, r.remark) == (R.SYSTEM_ERROR, "the request header's commitOffset='one' is "
                                                  "not a number")
    assert rig.ok(golden("cpp-1.2-query-offset")).ext == {"offset": "1"}


def test_a_reset_offset_is_a_notice_to_the_groups_consumers_on_this_worker(rig):
    rig.ok(golden("cpp-1.2-send", queueId="0"))
    rig.ok(golden("ons-3.12-heartbeat"), rig.unix)
    rig.h.notices()
    cmd = RemotingCommand(RC.INVOKE_BROKER_TO_RESET_OFFSET, ext={
        "topic": "GoldenTopic", "group": "GoldenCG", "timestamp": "-1", "isForce": "true"})
    r = rig.ok(cmd)
    assert b'"offsetTable"' in r.body                   # the new offsets, per queue
    assert rig.registry.get_offset("GoldenTopic", "GoldenCG", 0) == 1
    [(peer, note)] = rig.h.notices()
    assert peer is rig.unix and note.cmd.code == RC.RESET_CONSUMER_CLIENT_OFFSET
    assert note.cmd.ext["group"] == "GoldenCG" and note.nbytes == len(note.parts[0]) > 0


# ------------------------------------------------------------------ retry
@pytest.mark.parametrize("name", ["cpp-1.2-consumer-send-msg-back", "ons-3.12-consumer-send-msg-back"])
def test_a_message_sent_back_waits_in_the_delay_queue_for_retry_topic(rig, name):
    rig.ok(golden("cpp-1.2-send", queueId="0"))        # at commit-log offset 0, as the frames name
    cmd = golden(name)
    rig.ok(cmd)
    [m] = rig.store.read_queue(SCHEDULE_TOPIC, 2)       # delay level 3 = 3 + times consumed
    p = m.properties
    assert (p[REAL_TOPIC], p[RETRY_TOPIC], p[DELAY]) == ("%RETRY%GoldenCG", "GoldenTopic", "3")
    assert m.reconsume_times == 1 and m.body == b"golden-body-1"


# ------------------------------------------------------------------ pull and long polling
def test_pulls_as_cpp_and_ali_ons_send_them_get_the_matching_records(rig):
    rig.ok(golden("cpp-1.2-send", queueId="0"))               # TagA
    rig.ok(golden("cpp-1.2-send-batch", queueId="0"))         # TagC, TagC
    for name in ("cpp-1.2-pull", "ons-3.12-pull"):             # TagA || TagB || TagC || TagO; TagA || TagO
        cmd = golden(name)
        r = rig.call(cmd)
        assert r.cmd.code == R.SUCCESS and r.cmd.remark == "FOUND"
        assert r.cmd.serialize_type == JSON
        msgs = decode_records(body_of(r))
        tags = {"cpp-1.2-pull": ["TagA", "TagC", "TagC"], "ons-3.12-pull": ["TagA"]}[name]
        assert [m.tags for m in msgs] == tags
        assert r.cmd.ext == {"suggestWhichBrokerId": "0", "nextBeginOffset": "3",
                             "minOffset": "0", "maxOffset": "3"}


def test_a_pull_header_missing_a_field_or_with_a_word_for_a_number_is_refused_naming_it(rig):
    for field, value, remark in (("queueOffset", None, "the request header has no queueOffset"),
                                 ("maxMsgNums", "", "the request header has no maxMsgNums"),
                                 ("sysFlag", "six", "the request header's sysFlag='six' is not "
                                                    "a number")):
        cmd = golden("ons-3.12-pull")
        if value is None:
            del cmd.ext[field]
        else:
            cmd.ext[field] = value
        r = rig.call(cmd).cmd
        assert (r.code, r.remark) == (R.SYSTEM_ERROR, remark)


def test_a_subscription_carried_by_pulls_filters_each_and_a_bad_one_is_refused_each_time(rig):
    rig.ok(golden("cpp-1.2-send", queueId="0"))               # TagA
    rig.ok(golden("cpp-1.2-send-batch", queueId="0"))         # TagC, TagC
    for sub, tags in (("TagC", ["TagC", "TagC"]), ("TagA", ["TagA"]), ("TagC", ["TagC", "TagC"])):
        r = rig.call(golden("ons-3.12-pull", subscription=sub))
        assert [m.tags for m in decode_records(body_of(r))] == tags
    for _ in range(2):                                        # never remembered as parsed
        r = rig.call(golden("ons-3.12-pull", subscription="||")).cmd
        assert r.code == R.SUBSCRIPTION_PARSE_FAILED


def test_a_pull_with_nothing_to_read_parks_and_is_answered_when_its_queue_gets_a_message(rig):
    cmd = golden("ons-3.12-pull")
    assert cmd.ext["suspendTimeoutMillis"] == "15000"
    assert rig.call(cmd) is PARKED
    assert rig.flags() & WANT_QUEUES                    # writers to its queue wake this process
    rig.clock.advance(14.9)
    assert rig.parking.expire() == [] and rig.parking.ready() == []
    rig.ok(golden("ons-3.12-send-v2", queueId="1"))    # another queue: still parked
    assert rig.parking.ready() == [] and rig.parking.on_wake() == []
    rig.ok(golden("ons-3.12-send-v2", queueId="0"))    # its queue: answered at once
    [(peer, r)] = answers(rig.parking.ready())
    assert peer is rig.tcp and r.cmd.code == R.SUCCESS and r.cmd.opaque == cmd.opaque
    assert r.cmd.serialize_type == JSON                 # a parked pull's answer, as RocketMQ's
    assert [m.body for m in decode_records(body_of(r))] == [b"golden-body-1"]
    assert len(rig.parking.timers) == 0 and not rig.flags() & WANT_QUEUES
    rig.clock.advance(1)
    assert rig.parking.expire() == []                  # answered once


def test_a_parked_pull_is_answered_on_a_wake_up_for_a_message_another_process_wrote(rig):
    cmd = golden("cpp-1.2-pull")
    cmd.serialize_type = ROCKETMQ
    assert rig.call(cmd) is PARKED
    rig.ok(golden("cpp-1.2-send", queueId="0"))
    rig.parking.arrived.clear()                         # as if another worker appended it
    [(_, r)] = answers(rig.parking.on_wake())
    assert r.cmd.code == R.SUCCESS and r.cmd.serialize_type == JSON


def test_a_pull_parked_on_a_queue_never_written_is_answered_once_another_process_writes_it(rig):
    """The queue has no slot in the store when the pull parks, nor at the
    wake-ups before its first message (each finds nothing); the first
    wake-up after another process's append made the slot answers it."""
    cmd = golden("cpp-1.2-pull")
    assert rig.store.state.queue_slot(cmd.ext["topic"], int(cmd.ext["queueId"])) < 0
    assert rig.call(cmd) is PARKED
    assert rig.parking.on_wake() == [] and rig.parking.on_wake() == []
    rig.ok(golden("cpp-1.2-send", queueId="1"))        # another queue's slot made: not it
    rig.parking.arrived.clear()
    assert rig.parking.on_wake() == []
    rig.ok(golden("cpp-1.2-send", queueId="0"))
    rig.parking.arrived.clear()                         # as if another worker appended it
    [(_, r)] = answers(rig.parking.on_wake())
    assert r.cmd.code == R.SUCCESS and r.cmd.opaque == cmd.opaque


def test_a_pull_parked_on_this_worker_is_answered_by_its_own_send_without_a_wake_up(rig):
    """A worker's own sends to queues its pulls are parked on: the pulls are
    answered before the sends' turn ends, and the worker sent itself no
    wake-up (a datagram, a turn to read it and a look at every parked
    queue: most of a send's cost with 2,000 queues parked on it) — for a
    queue that has a slot, and for one whose slot the send makes."""
    import select

    from shmq.client.requests import pull_message
    rig.ok(keyed(0, "first", 999))                     # queue 0 has a slot; queue 3 none
    reactor, driver, client = driven(rig)
    pulls = [pull_message("GoldenTopic", 0, 1, suspend_ms=15000),
             pull_message("GoldenTopic", 3, 0, suspend_ms=15000)]
    for i, p in enumerate(pulls):
        p.opaque = 50 + i
    client.sendall(b"".join(bytes(encode(p)) for p in pulls))
    turns_until(reactor, lambda: len(rig.parking.pulls) == 2, "two pulls parked")
    assert rig.flags() & WANT_QUEUES
    rig.cb.waiter.drain()
    client.sendall(bytes(encode(keyed(0, "a", 10))) + bytes(encode(keyed(3, "b", 11))))
    got = {r.opaque: r for r in replies_in_turns(reactor, client, 4)}
    assert {o: r.code for o, r in got.items()} == {10: R.SUCCESS, 11: R.SUCCESS,
                                                   50: R.SUCCESS, 51: R.SUCCESS}
    assert [m.body for m in decode_records(got[50].body)] == [b"a"]
    assert [m.body for m in decode_records(got[51].body)] == [b"b"]
    assert select.select([rig.cb.waiter.sock], [], [], 0)[0] == [], "it woke itself"
    assert not rig.parking.pulls
    reactor.close()


def test_a_parked_pull_times_out_with_pull_not_found_at_suspend_timeout_millis(rig):
    cmd = golden("cpp-1.2-pull", suspendTimeoutMillis="700")
    assert rig.call(cmd) is PARKED
    due = rig.parking.next_deadline()
    assert 0.7 <= due - rig.clock() <= 0.7 + TICK_S
    rig.clock.advance(0.699)
    assert rig.parking.expire() == []
    rig.clock.advance(0.001 + TICK_S)
    [(peer, r)] = answers(rig.parking.expire())
    assert (r.cmd.code, r.cmd.remark) == (R.PULL_NOT_FOUND, "NO_MATCHED_LOGIC_QUEUE")   # never written
    assert r.cmd.ext["nextBeginOffset"] == "0" and r.nbytes == 0
    assert rig.parking.next_deadline() is None and not rig.flags() & WANT_QUEUES


def test_short_polling_holds_a_pull_short_polling_time_mills(store_dir):
    rig = Rig(store_dir, longPollingEnable=False, shortPollingTimeMills=300)
    try:
        rig.ok(create_topic("GoldenTopic", 4))
        assert rig.call(golden("ons-3.12-pull")) is PARKED
        rig.clock.advance(0.3 + TICK_S)
        [(_, r)] = answers(rig.parking.expire())
        assert r.cmd.code == R.PULL_NOT_FOUND
    finally:
        rig.close()


def test_a_parked_pull_of_a_closed_connection_is_dropped(rig):
    assert rig.call(golden("ons-3.12-pull")) is PARKED
    assert rig.call(golden("ons-3.12-pull", queueId="1"), rig.unix) is PARKED
    rig.h.connection_closed(rig.tcp)
    # gone at once (not when a message or the deadline comes): the other
    # client's pull stays, and with it the flag that appends wake us by
    assert list(rig.parking.pulls) == [("GoldenTopic", 1)] and len(rig.parking.timers) == 1
    assert rig.flags() & WANT_QUEUES
    rig.h.connection_closed(rig.unix)
    assert rig.parking.pulls == {} and len(rig.parking.timers) == 0
    assert not rig.flags() & WANT_QUEUES
    rig.ok(golden("ons-3.12-send-v2", queueId="0"), rig.tcp)
    assert rig.parking.ready() == []


def test_shutting_down_answers_every_parked_pull(rig):
    for peer in (rig.tcp, rig.unix):
        assert rig.call(golden("ons-3.12-pull"), peer) is PARKED
    out = answers(rig.parking.expire_all_pulls())
    assert [(p.id, r.cmd.code) for p, r in out] == [(1, R.PULL_NOT_FOUND), (2, R.PULL_NOT_FOUND)]
    assert len(rig.parking.timers) == 0


# ------------------------------------------------------------------ SYNC_FLUSH
def test_a_sync_flush_send_is_answered_once_its_bytes_are_flushed(sync_rig):
    rig = sync_rig
    cmd = golden("ons-3.12-send-v2", queueId="0")
    assert rig.call(cmd) is PARKED
    assert rig.flags() & WANT_FLUSH
    assert rig.parking.on_wake() == []                 # woken, not flushed yet
    rig.store.flush_commitlog()
    [(peer, r)] = rig.parking.on_wake()
    assert peer is rig.tcp and r.cmd.code == R.SUCCESS and r.cmd.opaque == cmd.opaque
    assert r.cmd.ext["queueOffset"] == "0" and r.cmd.ext["TRACE_ON"] == "true"
    assert not rig.flags() & WANT_FLUSH and len(rig.parking.timers) == 0


def test_a_sync_flush_send_times_out_at_sync_flush_timeout(sync_rig):
    rig = sync_rig
    first, second = golden("ons-3.12-send-v2", queueId="0"), golden("ons-3.12-send-v2", queueId="1")
    assert rig.call(first) is PARKED
    rig.clock.advance(1)
    assert rig.call(second, rig.unix) is PARKED
    rig.clock.advance(3.999)
    assert rig.parking.expire() == []
    rig.clock.advance(0.001 + TICK_S)
    [(peer, r)] = rig.parking.expire()
    assert (peer, r.cmd.code, r.cmd.remark) == (rig.tcp, R.FLUSH_DISK_TIMEOUT, FLUSH_TIMEOUT_REMARK)
    assert r.cmd.ext["queueId"] == "0"                  # the rest of the answer stands
    rig.store.flush_commitlog()                         # flushed, no wake-up before its deadline
    rig.clock.advance(1)
    [(peer, r)] = rig.parking.expire()
    assert (peer, r.cmd.code) == (rig.unix, R.SUCCESS)
    assert rig.store.read_queue("GoldenTopic", 0)[0].body == b"golden-body-1"   # stored all the same


def test_a_send_that_says_wait_false_is_answered_before_the_flush(sync_rig):
    cmd = golden("cpp-1.2-send", queueId="0")
    cmd.ext["properties"] = cmd.ext["properties"].replace("WAIT\x01true", "WAIT\x01false")
    assert sync_rig.ok(cmd).ext["queueOffset"] == "0"
    assert sync_rig.parking.sends == {}


def test_remembered_topic_checks_follow_a_permission_change_at_once(rig):
    """Sends and pulls remember a topic's checks only until the tables
    change: a topic made read-only refuses the next send, made unreadable
    the next pull, and both work again once it is restored."""
    rig.ok(golden("ons-3.12-send-v2", queueId="0"))
    rig.ok(golden("ons-3.12-pull"))
    rig.ok(create_topic("GoldenTopic", 4, perm=4))          # read only
    r = rig.call(golden("ons-3.12-send-v2", queueId="0")).cmd
    assert (r.code, r.remark) == (R.NO_PERMISSION,
                                  "the topic[GoldenTopic] sending message is forbidden")
    rig.ok(golden("ons-3.12-pull"))
    rig.ok(create_topic("GoldenTopic", 4, perm=2))          # write only
    r = rig.call(golden("ons-3.12-pull")).cmd
    assert (r.code, r.remark) == (R.NO_PERMISSION,
                                  "the topic[GoldenTopic] pulling message is forbidden")
    rig.ok(create_topic("GoldenTopic", 4, perm=6))
    rig.ok(golden("ons-3.12-send-v2", queueId="0"))
    rig.ok(golden("ons-3.12-pull"))
