"""Duplicate sends (``sendDedupWindowSize``, core/dedup.py): a producer's
retry of a send whose reply it lost is stored once and answered with the
first send's result — at the handler (no sockets, a small window), then
over real sockets against real broker processes: a retry on a new
connection and another queue, across restarts, and under ``kill -9`` of
workers while a producer with retries sends (no duplicate, no acknowledged
message lost).
"""
from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import test_handlers as th
from brokerproc import BrokerProc, broker_conf, routed_topic, start_broker, stored_records
from shmq.broker.topics import SCHEDULE_TOPIC
from shmq.client.remoting import RemotingClient
from shmq.client.requests import create_topic, decode_records, pull_message, send_batch, send_message
from shmq.core.dedup import MAX_CANDIDATES, key_hash, key_of
from shmq.core.state import E_PID, E_TICKS
from shmq.core.store import _entry
from shmq.ipc.codes import ResponseCode as R

WINDOW = 8


@pytest.fixture
def make_rig(store_dir):
    rigs = []

    def make(window: int = WINDOW, **kw) -> th.Rig:
        r = th.Rig(store_dir, dedup_window=window, **kw)
        r.ok(create_topic("DedupTopic", 4))
        r.ok(create_topic("OtherTopic", 4))
        rigs.append(r)
        return r

    yield make
    for r in rigs:
        r.close()


def keyed(topic: str, body: bytes, key: str, queue_id: int = 0, **props) -> "th.RemotingCommand":
    return send_message(topic, body, queue_id=queue_id, props={"UNIQ_KEY": key, **props})


def answer(reply) -> tuple[str, str, str]:
    return reply.ext["msgId"], reply.ext["queueId"], reply.ext["queueOffset"]


def stored(rig, topic: str = "DedupTopic") -> list[bytes]:
    return [m.body for q in range(4) for m in rig.store.read_queue(topic, q)]


# ------------------------------------------------------------- the handler
def test_a_retry_to_the_same_or_another_queue_is_stored_once_with_the_first_answer(make_rig):
    rig = make_rig()
    first = rig.ok(keyed("DedupTopic", b"one", "K-1", queue_id=1))
    again = rig.ok(keyed("DedupTopic", b"one", "K-1", queue_id=1))
    elsewhere = rig.ok(keyed("DedupTopic", b"one", "K-1", queue_id=3))   # a RocketMQ client's retry
    assert answer(first) == answer(again) == answer(elsewhere)
    assert answer(first)[1:] == ("1", "0")
    assert stored(rig) == [b"one"]
    nxt = rig.ok(keyed("DedupTopic", b"two", "K-2", queue_id=1))
    assert answer(nxt)[1:] == ("1", "1")           # the duplicates took no offset


def test_sends_without_a_key_to_retry_topics_or_with_the_window_off_are_all_stored(make_rig):
    rig = make_rig()
    for _ in range(2):
        rig.ok(send_message("DedupTopic", b"plain", queue_id=0))
        rig.ok(send_message("%RETRY%g1", b"retried", queue_id=0,
                            props={"UNIQ_KEY": "K-R", "RETRY_TOPIC": "DedupTopic"}))
    assert stored(rig) == [b"plain", b"plain"]
    assert [m.body for m in rig.store.read_queue("%RETRY%g1", 0)] == [b"retried", b"retried"]


def test_with_the_window_off_a_retry_is_stored_twice(make_rig):
    rig = make_rig(window=0)
    a = rig.ok(keyed("DedupTopic", b"one", "K-1"))
    b = rig.ok(keyed("DedupTopic", b"one", "K-1"))
    assert answer(a) != answer(b) and stored(rig) == [b"one", b"one"]


def test_different_topics_are_independent(make_rig):
    rig = make_rig()
    a = rig.ok(keyed("DedupTopic", b"one", "K-1"))
    b = rig.ok(keyed("OtherTopic", b"one", "K-1"))
    assert answer(a) != answer(b)
    assert stored(rig) == [b"one"] and stored(rig, "OtherTopic") == [b"one"]


def test_the_window_is_bounded_an_older_key_is_stored_again(make_rig):
    rig = make_rig()
    first = rig.ok(keyed("DedupTopic", b"old", "K-old"))
    for i in range(WINDOW - 1):                     # still in the window: the last WINDOW sends
        rig.ok(keyed("OtherTopic", b"x", f"K-{i}"))
    assert answer(rig.ok(keyed("DedupTopic", b"old", "K-old"))) == answer(first)
    rig.ok(keyed("OtherTopic", b"x", "K-last"))    # one more keyed send: K-old has left
    late = rig.ok(keyed("DedupTopic", b"old", "K-old"))
    assert answer(late) != answer(first)
    assert stored(rig) == [b"old", b"old"]
    # a send without a key does not move the window
    for _ in range(3 * WINDOW):
        rig.ok(send_message("DedupTopic", b"plain", queue_id=2))
    assert answer(rig.ok(keyed("DedupTopic", b"old", "K-old"))) == answer(late)


def test_a_clean_stop_saves_the_window_and_the_next_start_takes_it_back(make_rig, store_dir):
    """Issue 20: refilling the window reads its records back one by one
    (seconds over a big store), so a clean stop saves it and the next start
    takes it back as it was; a window saved for another end of the store
    (records appended after, a file copied in) is refilled instead, and
    the file is read once."""
    import os

    from shmq.core.dedup import SNAPSHOT

    rig = make_rig()
    sent = {f"K-{i}": answer(rig.ok(keyed("DedupTopic", b"m%d" % i, f"K-{i}", queue_id=i % 4)))
            for i in range(2 * WINDOW)}              # the window holds the last WINDOW keys
    st = rig.store.state
    before = (bytes(st.words[st.dedup_heads:st.dedup_ents + WINDOW * 3]), st.get("dedup_seq"))
    rig.close()
    snapshot = os.path.join(store_dir, SNAPSHOT)
    assert os.path.exists(snapshot)
    rig = make_rig()
    st = rig.store.state
    assert (bytes(st.words[st.dedup_heads:st.dedup_ents + WINDOW * 3]), st.get("dedup_seq")) == before
    assert not os.path.exists(snapshot)             # read once
    for i in range(WINDOW, 2 * WINDOW):             # retries across the restart: the first answers
        assert answer(rig.ok(keyed("DedupTopic", b"m%d" % i, f"K-{i}", queue_id=0))) == sent[f"K-{i}"]
    rig.close()
    saved = open(snapshot, "rb").read()
    rig = make_rig()                                # takes it back, and appends past its end
    rig.ok(keyed("DedupTopic", b"later", "K-later", queue_id=1))
    rig.close()
    with open(snapshot, "wb") as f:                 # the older window, copied back in
        f.write(saved)
    rig = make_rig()
    assert not os.path.exists(snapshot)
    # refilled from the store: the last keyed sends, K-later among them, are still caught
    assert answer(rig.ok(keyed("DedupTopic", b"later", "K-later", queue_id=2)))[1] == "1"
    assert stored(rig).count(b"later") == 1


def _window(st) -> list[tuple[int, int]]:
    """The window's (hash, CommitLog offset) entries, oldest first."""
    import numpy as np

    n, seq = st.dedup_entries, st.get("dedup_seq")
    ents = np.asarray(st.words[st.dedup_ents:st.dedup_ents + n * 3]).reshape(n, 3)
    return [(int(ents[p % n, 0]), int(ents[p % n, 2])) for p in range(max(0, seq - n), seq)]


def test_a_start_without_a_saved_window_refills_the_same_entries_from_the_store(
        make_rig, store_dir):
    """After an abnormal stop (no saved window) the start refills the window
    from the store (issue 20: the keys are hashed in a kernel, a stretch of
    the newest records at a time, not read back one by one): the same
    entries, oldest first, as the sends made. Sends without a key or with an
    empty one, between them, take none; retries are still caught."""
    import os

    from shmq.core.dedup import SNAPSHOT

    rig = make_rig()
    sent = {}
    for i in range(2 * WINDOW + 3):
        sent[i] = answer(rig.ok(keyed("DedupTopic", b"m%d" % i, f"K-{i}", queue_id=i % 4)))
        rig.ok(send_message("OtherTopic", b"plain", queue_id=i % 4))
        if i % 5 == 0:
            rig.ok(keyed("OtherTopic", b"empty key", ""))
    before = _window(rig.store.state)
    assert len(before) == WINDOW
    rig.close()
    os.unlink(os.path.join(store_dir, SNAPSHOT))    # as after kill -9: nothing saved
    rig = make_rig()
    assert _window(rig.store.state) == before
    last = 2 * WINDOW + 2
    assert answer(rig.ok(keyed("DedupTopic", b"m%d" % last, f"K-{last}", queue_id=3))) == sent[last]


def test_a_batch_retry_gets_the_first_batch_answer_and_a_different_batch_is_stored(make_rig):
    rig = make_rig()

    def batch(keys, queue_id):
        msgs = [(f"b-{k}".encode(), f"UNIQ_KEY\x01{k}") for k in keys]
        return send_batch("DedupTopic", msgs, queue_id=queue_id)

    first = rig.ok(batch(["B1", "B2", "B3"], 0))
    again = rig.ok(batch(["B1", "B2", "B3"], 2))
    assert answer(first) == answer(again) and len(answer(first)[0].split(",")) == 3
    other = rig.ok(batch(["B1", "B9", "B3"], 0))   # same first key, not the same batch
    assert answer(other) != answer(first)
    assert stored(rig) == [b"b-B1", b"b-B2", b"b-B3", b"b-B1", b"b-B9", b"b-B3"]


def test_one_key_first_in_many_batches_costs_a_bounded_lookup(make_rig):
    """A client that puts one key first in batch after batch of other
    messages: each is stored, a lookup reads back at most MAX_CANDIDATES of
    them, newest first, so the latest batch's retry is still found and a
    retry of one more than MAX_CANDIDATES batches back is stored again."""
    rig = make_rig(window=64)
    first = []
    for i in range(MAX_CANDIDATES + 2):
        msgs = [(b"head", "UNIQ_KEY\x01K-same"), (b"x%d" % i, f"UNIQ_KEY\x01K-{i}")]
        first.append(answer(rig.ok(send_batch("DedupTopic", msgs, queue_id=0))))
    assert len(set(first)) == MAX_CANDIDATES + 2
    last = [(b"head", "UNIQ_KEY\x01K-same"), (b"x%d" % (MAX_CANDIDATES + 1),
                                                 f"UNIQ_KEY\x01K-{MAX_CANDIDATES + 1}")]
    assert answer(rig.ok(send_batch("DedupTopic", last, queue_id=1))) == first[-1]
    oldest = [(b"head", "UNIQ_KEY\x01K-same"), (b"x0", "UNIQ_KEY\x01K-0")]
    assert answer(rig.ok(send_batch("DedupTopic", oldest, queue_id=1))) != first[0]
    assert len(stored(rig)) == 2 * (MAX_CANDIDATES + 3)


def test_a_delayed_send_retried_waits_once_in_the_schedule_topic(make_rig):
    rig = make_rig()
    a = rig.ok(keyed("DedupTopic", b"later", "K-d", queue_id=1, DELAY="2"))
    b = rig.ok(keyed("DedupTopic", b"later", "K-d", queue_id=2, DELAY="2"))
    assert answer(a)[0] == answer(b)[0] and answer(a)[2] == answer(b)[2]
    assert answer(b)[1] == "2"                      # routed: the retry's own queue is answered
    assert [m.body for m in rig.store.read_queue(SCHEDULE_TOPIC, 1)] == [b"later"]


def test_under_sync_flush_a_duplicate_waits_for_the_first_send_to_be_durable(make_rig):
    rig = make_rig(store={"flushDiskType": "SYNC_FLUSH", "syncFlushTimeout": 5000})
    assert rig.call(keyed("DedupTopic", b"one", "K-s")) is th.PARKED
    assert rig.call(keyed("DedupTopic", b"one", "K-s", queue_id=2), rig.unix) is th.PARKED
    assert rig.parking.on_wake() == []              # neither is durable yet
    rig.store.flush_commitlog()
    [(p1, r1), (p2, r2)] = rig.parking.on_wake()
    assert (p1, p2) == (rig.tcp, rig.unix) and r1.cmd.code == r2.cmd.code == R.SUCCESS
    assert answer(r1.cmd) == answer(r2.cmd)
    assert stored(rig) == [b"one"]
    # a duplicate of a durable send is answered at once
    assert answer(rig.ok(keyed("DedupTopic", b"one", "K-s"))) == answer(r1.cmd)


@pytest.mark.parametrize("in_turn", [False, True], ids=["alone", "in-a-turn"])
def test_a_retry_racing_its_unpublished_original_waits_for_it(make_rig, in_turn):
    """The original is claimed (its window entry made) but not written yet
    when the retry arrives from another thread: the retry waits for it to be
    published, then gets its result; nothing is stored twice. Also when the
    original was appended with another send of its reactor turn, in one
    claim: its window entry then points inside that claim."""
    rig = make_rig(window=64)
    store = rig.store
    claimed, go = threading.Event(), threading.Event()

    def hook(stage, seq):
        if stage == "claimed" and threading.current_thread().name == "original":
            claimed.set()
            assert go.wait(30)

    def original():
        if in_turn:
            return th.turn(rig, [keyed("DedupTopic", b"zero", "K-0"),
                                 keyed("DedupTopic", b"one", "K-race")])[1]
        return rig.ok(keyed("DedupTopic", b"one", "K-race", queue_id=0))

    store.hook = hook
    results = {}
    t = threading.Thread(target=lambda: results.setdefault("first", original()), name="original")
    t.start()
    assert claimed.wait(30)
    retry = threading.Thread(target=lambda: results.setdefault("retry", rig.ok(keyed(
        "DedupTopic", b"one", "K-race", queue_id=1))), name="retry")
    retry.start()
    retry.join(0.2)
    assert retry.is_alive()                         # waiting for the original's publication
    go.set()
    t.join(30), retry.join(30)
    assert answer(results["first"]) == answer(results["retry"])
    assert stored(rig) == ([b"zero"] if in_turn else []) + [b"one"]


def test_sends_of_one_turn_each_have_a_window_entry_and_a_key_twice_is_stored_once(make_rig):
    """Sends pipelined in one reactor turn are appended in one claim per
    queue (``Handlers.take``), each still its own window entry: a retry in a
    later turn, to another queue, gets the first answer; the same key twice
    in one turn is stored once; a turn with a key already in the window is
    appended one by one, so each is checked."""
    rig = make_rig(window=64)
    first = th.turn(rig, [keyed("DedupTopic", b"a", "K-a"), keyed("DedupTopic", b"b", "K-b")])
    seq = rig.store.state.get("claim_seq")
    again = th.turn(rig, [keyed("DedupTopic", b"c", "K-c", queue_id=1),
                          keyed("DedupTopic", b"a", "K-a", queue_id=1),
                          keyed("DedupTopic", b"d", "K-d", queue_id=1)])
    assert [r.code for r in again] == [R.SUCCESS] * 3
    assert answer(again[1]) == answer(first[0]) and answer(first[0])[1:] == ("0", "0")
    assert rig.store.state.get("claim_seq") == seq + 2             # c and d, one by one
    twice = th.turn(rig, [keyed("DedupTopic", b"e", "K-e", queue_id=2),
                          keyed("DedupTopic", b"e", "K-e", queue_id=2),
                          keyed("DedupTopic", b"f", "K-f", queue_id=2)])
    assert answer(twice[0]) == answer(twice[1])
    later = th.turn(rig, [keyed("DedupTopic", b"d", "K-d", queue_id=3),
                          keyed("DedupTopic", b"f", "K-f", queue_id=3)])
    assert [answer(r) for r in later] == [answer(again[2]), answer(twice[2])]
    assert stored(rig) == [b"a", b"b", b"c", b"d", b"e", b"f"]


def test_with_the_window_full_a_turn_of_new_keys_is_still_one_claim(make_rig):
    """A key's bucket having a head says little once the window is full
    (four buckets in ten do): a turn falls back to one by one only for an
    entry of the same hash."""
    rig = make_rig(window=1024)
    for i in range(1024):
        rig.ok(keyed("DedupTopic", b"x", f"old-{i}", queue_id=1))
    seq = rig.store.state.get("claim_seq")
    out = th.turn(rig, [keyed("DedupTopic", b"y%d" % i, f"new-{i}") for i in range(16)])
    assert [r.code for r in out] == [R.SUCCESS] * 16
    assert rig.store.state.get("claim_seq") - seq == 1
    again = th.turn(rig, [keyed("DedupTopic", b"y3", "new-3", queue_id=2),
                          keyed("DedupTopic", b"z", "new-z", queue_id=2)])
    assert answer(again[0]) == answer(out[3])
    assert len(rig.store.read_queue("DedupTopic", 2)) == 1


def test_a_run_appended_one_by_one_keeps_its_place_before_the_queues_next_run(make_rig):
    """A turn's sends to one queue are cut into runs (16 KiB with this
    store's 64 KiB segments); a run holding a retry is appended one by one,
    still before the next run: the queue keeps the order they were sent in."""
    rig = make_rig(window=64)
    th.turn(rig, [keyed("DedupTopic", b"r" * 5000, "K-r")])
    bodies = [bytes([97 + i]) * 5000 for i in range(6)]
    out = th.turn(rig, [keyed("DedupTopic", b"r" * 5000, "K-r")] + [
        keyed("DedupTopic", body, f"K-{i}") for i, body in enumerate(bodies)])
    assert [r.code for r in out] == [R.SUCCESS] * 7
    assert [r.ext["queueOffset"] for r in out] == ["0", "1", "2", "3", "4", "5", "6"]
    assert stored(rig) == [b"r" * 5000] + bodies


def test_a_retry_waiting_for_an_original_whose_writer_died_stores_it_once(make_rig):
    """The original's writer dies (here: its claim is handed to a dead pid
    and its thread never goes on) after its claim: the retry waiting for it
    repairs the dead claim (rolled back: it was the last) and stores the
    message itself, once; it does not wait for that claim's number forever."""
    rig = make_rig()
    store = rig.store
    dead = subprocess.Popen(["true"])
    dead.wait()
    claimed = threading.Event()
    never = threading.Event()

    def hook(stage, seq):
        if stage == "claimed" and threading.current_thread().name == "original":
            e = _entry(seq)
            store._w[e + E_PID], store._w[e + E_TICKS] = dead.pid, 1
            claimed.set()
            never.wait()                            # "killed": never writes, never returns

    store.hook = hook
    threading.Thread(target=lambda: rig.call(keyed("DedupTopic", b"one", "K-dead")),
                     name="original", daemon=True).start()
    assert claimed.wait(30)
    results = {}
    retry = threading.Thread(target=lambda: results.setdefault("retry", rig.ok(keyed(
        "DedupTopic", b"one", "K-dead", queue_id=1))), name="retry", daemon=True)
    retry.start()
    retry.join(60)
    assert not retry.is_alive(), "the retry waited for a dead claim forever"
    assert answer(results["retry"])[1:] == ("1", "0")
    assert stored(rig) == [b"one"]
    store.hook = None
    assert answer(rig.ok(keyed("DedupTopic", b"one", "K-dead", queue_id=2))) == \
        answer(results["retry"])


def test_an_entry_whose_append_was_rolled_back_turns_nothing_away(make_rig):
    """A writer that fails (or dies) after its claim leaves a window entry
    pointing at bytes that are rolled back and reused: the entry is checked
    against the record there, so the resend is stored, exactly once."""
    rig = make_rig()
    store = rig.store

    def fail(stage, seq):
        if stage == "claimed":
            raise OSError(28, "No space left on device")

    store.hook = fail
    r = rig.call(keyed("DedupTopic", b"lost", "K-lost"))
    assert r.cmd.code != R.SUCCESS
    store.hook = None
    other = rig.ok(keyed("DedupTopic", b"other", "K-other"))   # reuses the rolled-back range
    resent = rig.ok(keyed("DedupTopic", b"lost", "K-lost"))
    assert answer(resent) != answer(other)
    assert stored(rig) == [b"other", b"lost"]
    assert answer(rig.ok(keyed("DedupTopic", b"lost", "K-lost"))) == answer(resent)


def test_the_key_parsers_agree_with_the_record():
    props = b"KEYS\x01a\x02XUNIQ_KEY\x01no\x02UNIQ_KEY\x01K-7\x02WAIT\x01true"
    assert key_of(props) == b"K-7" and key_hash(props) == key_hash(b"UNIQ_KEY\x01K-7")
    assert key_hash(b"KEYS\x01a") == 0 and key_hash(b"UNIQ_KEY\x01") == 0
    assert key_hash(b"UNIQ_KEY\x01K-7") != 0


# ---------------------------------------------------------- real brokers
def _raw_send(addr: str, topic: str, body: bytes, key: str, queue_id: int):
    with RemotingClient(addr) as c:                 # a new connection each time
        r = c.invoke(keyed(topic, body, key, queue_id=queue_id))
        assert r.code == R.SUCCESS, r.remark
        return answer(r)


def _bodies(addr: str, topic: str, queues: int) -> list[tuple[int, int, object]]:
    """(queue, offset, message) of every stored message of ``topic``."""
    return [(m.queue_id, m.queue_offset, m) for m in stored_records(addr, topic, queues)]


def test_over_sockets_retries_on_new_connections_and_across_restarts_are_stored_once(tmp_path):
    conf = broker_conf(tmp_path)
    b = BrokerProc(tmp_path, conf).start()
    try:
        topic = routed_topic(b, "DedupWire", 4)
        first = _raw_send(b.addr, topic, b"w-1", "W-1", 0)
        # new connections land on either worker; each is answered with the first result
        for q in (0, 1, 2, 3, 1, 2):
            assert _raw_send(b.addr, topic, b"w-1", "W-1", q) == first
            assert _raw_send("unix:" + b.unix, topic, b"w-1", "W-1", q) == first
        assert b.stop() == 0                        # clean restart: the window as it was
        b = BrokerProc(tmp_path, conf).start()
        assert "duplicate-send window: taken back as the clean stop left it" in b.log()
        assert _raw_send(b.addr, topic, b"w-1", "W-1", 3) == first
        second = _raw_send(b.addr, topic, b"w-2", "W-2", 2)
        b.kill9()                                   # crash restart: refilled from the store
        [left] = tmp_path.glob("pymp-*")            # the dead boss's fork server socket (TMPDIR)
        b = BrokerProc(tmp_path, conf).start()
        assert "duplicate-send window: 2 of 65536 entries refilled" in b.log()
        assert not left.exists() and len(list(tmp_path.glob("pymp-*"))) == 1   # reclaimed
        assert _raw_send(b.addr, topic, b"w-2", "W-2", 0) == second
        assert _raw_send(b.addr, topic, b"w-1", "W-1", 0) == first
        got = _bodies(b.addr, topic, 4)
        assert sorted(m.body for _, _, m in got) == [b"w-1", b"w-2"]
    finally:
        b.kill9()


PRODUCER = r"""
import asyncio, json, logging, os, sys
from shmq.client import AsyncProducer, ClientConfig, Message
ns, topic, out_path, stop_path, limit, direct = sys.argv[1:7]
retries = 0
class Count(logging.Handler):
    def emit(self, rec):
        global retries
        if "trying another queue" in rec.getMessage():
            retries += 1
logging.getLogger("shmq.client").addHandler(Count())
logging.getLogger("shmq.client").setLevel(logging.INFO)
out = open(out_path, "a", buffering=1)
async def main():
    async with AsyncProducer("dedup-kill", namesrv_addr=ns, send_msg_timeout=20,
                             retry_times_when_send_failed=6,
                             client=ClientConfig(direct_append=direct == "direct")) as p:
        async def one(i):
            try:
                r = await p.send(Message(topic, b"m-%d" % i))
                out.write(json.dumps(["ok", i, r.msg_id, r.queue.queue_id, r.queue_offset]) + "\n")
            except Exception as e:
                out.write(json.dumps(["fail", i, repr(e)]) + "\n")
        i = 0
        while i < int(limit) and not os.path.exists(stop_path):
            await asyncio.gather(*(one(j) for j in range(i, i + 32)))
            i += 32
asyncio.run(main())
print("retries", retries, flush=True)
"""


def _lines(path) -> list:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(x) for x in f.read().splitlines() if x.endswith("]")]


@pytest.mark.parametrize("flush, direct", [("ASYNC_FLUSH", "socket"), ("SYNC_FLUSH", "socket"),
                                           ("SYNC_FLUSH", "direct")])
def test_kill_9_of_workers_during_sends_with_client_retries_stores_no_duplicate(tmp_path, flush,
                                                                                direct):
    """Workers SIGKILLed under a producer: over the socket its retries after
    lost replies are stored once; appending directly (client/direct.py) its
    appends go on beside the repairs of the workers' dead claims."""
    kills = 4
    with start_broker(tmp_path, workerProcessNums=2, flushDiskType=flush) as b:
        topic = routed_topic(b, "DedupKill", 4)
        out, stop = str(tmp_path / "acks.jsonl"), str(tmp_path / "stop")
        prod = subprocess.Popen([sys.executable, "-c", PRODUCER, b.namesrv, topic, out, stop,
                                 "200000", direct], stdout=subprocess.PIPE, text=True)
        try:
            acked_at_kill = 0
            for k in range(kills):
                deadline = time.monotonic() + 60
                while sum(1 for x in _lines(out) if x[0] == "ok") < acked_at_kill + 400:
                    assert prod.poll() is None, "the producer stopped early"
                    assert time.monotonic() < deadline, "the producer made no progress"
                    time.sleep(0.02)
                names = b.children()
                os.kill(names[f"shmq-worker-{k % 2}"], signal.SIGKILL)
                acked_at_kill = sum(1 for x in _lines(out) if x[0] == "ok")
            deadline = time.monotonic() + 60
            while sum(1 for x in _lines(out) if x[0] == "ok") < acked_at_kill + 400:
                assert time.monotonic() < deadline, "no progress after the last kill"
                time.sleep(0.02)
        finally:
            open(stop, "w").close()
            stdout, _ = prod.communicate(timeout=120)
        lines = _lines(out)
        acked = {x[1]: x for x in lines if x[0] == "ok"}
        got = _bodies(b.addr, topic, 4)
        counts = collections.Counter(m.body for _, _, m in got)
        dups = {body: n for body, n in counts.items() if n > 1}
        assert not dups, f"{len(dups)} messages stored more than once, e.g. {list(dups)[:5]}"
        at = {(q, off): m for q, off, m in got}
        for i, (_, _, msg_id, q, off) in acked.items():
            m = at.get((q, off))
            assert m is not None and m.body == b"m-%d" % i, f"acknowledged m-{i} not at {q}:{off}"
            assert m.properties["UNIQ_KEY"] == msg_id
        print(f"{len(acked)} acknowledged, {len(lines) - len(acked)} failed, "
              f"{len(got)} stored, {stdout.strip()}")
