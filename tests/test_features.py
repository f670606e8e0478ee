"""Message features on a real broker: delay levels, retry and dead letters,
transactions, reset by time, permissions — what a RocketMQ client sees.

Intervals are configured short (every delay level 1 s, transaction checks
every 300 ms) so that each test waits about a second, not minutes.
"""
from __future__ import annotations

import os
import signal
import time

import orjson
import pytest

from brokerproc import start_broker
from shmq.client.remoting import RemotingClient
from shmq.client.requests import (COMMIT, ROLLBACK, UNKNOWN, create_topic, decode_records,
                                  end_transaction, heartbeat, pull_message, send_back,
                                  send_message)
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand

FAST = dict(messageDelayLevel=" ".join(["1s"] * 18), transactionTimeOut=300,
            transactionCheckInterval=300, transactionCheckMax=3, timerPrecisionMs=100)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("features"), **FAST)
    yield b
    assert b.stop() == 0, b.log()[-3000:]


@pytest.fixture
def client(broker):
    with RemotingClient(broker.addr) as c:
        yield c


def topic_name(request) -> str:
    return "F_" + "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[-90:]


def make_topic(c, topic, queues=1, perm=6):
    r = c.invoke(create_topic(topic, queues, perm=perm))
    assert r.code == R.SUCCESS, r.remark


def pull(c, topic, qid=0, offset=0, group="g", **kw):
    r = c.invoke(pull_message(topic, qid, offset, group=group, **kw))
    return decode_records(r.body) if r.code == R.SUCCESS else []


def wait_for(c, topic, n, qid=0, timeout=10.0, group="g"):
    deadline = time.monotonic() + timeout
    while True:
        msgs = pull(c, topic, qid, group=group, max_msgs=n + 8)
        if len(msgs) >= n or time.monotonic() > deadline:
            return msgs
        time.sleep(0.05)


def send(c, topic, body, **kw):
    r = c.invoke(send_message(topic, body, queue_id=kw.pop("queue_id", 0), **kw))
    assert r.code == R.SUCCESS, r.remark
    return r


# ------------------------------------------------------------------- delay
def test_a_delayed_message_is_delivered_once_after_its_level(client, request):
    topic = topic_name(request)
    make_topic(client, topic)
    t0 = int(time.time() * 1000)
    r = send(client, topic, b"later", tags="T", props={"DELAY": "3", "UNIQ_KEY": "U1"})
    send(client, topic, b"now")
    assert int(r.ext["queueOffset"]) >= 0
    assert [m.body for m in pull(client, topic)] == [b"now"]     # not yet
    parked = pull(client, "SCHEDULE_TOPIC_XXXX", 2, offset=0, max_msgs=1000)
    assert any(m.properties.get("UNIQ_KEY") == "U1" for m in parked)
    msgs = wait_for(client, topic, 2)
    assert [m.body for m in msgs] == [b"now", b"later"]
    m = msgs[1]
    assert m.store_timestamp - t0 >= 1000
    assert m.tags == "T" and m.properties["REAL_TOPIC"] == topic and "DELAY" not in m.properties
    assert m.properties["UNIQ_KEY"] == "U1"
    time.sleep(1.2)
    assert len(pull(client, topic)) == 2                     # delivered once


def test_delay_level_above_the_last_is_clamped_and_a_bad_one_refused(client, request):
    topic = topic_name(request)
    make_topic(client, topic)
    send(client, topic, b"x", props={"DELAY": "99"})
    assert wait_for(client, topic, 1)[0].body == b"x"
    r = client.invoke(send_message(topic, b"y", queue_id=0, props={"DELAY": "soon"}))
    assert r.code == R.MESSAGE_ILLEGAL and "DELAY" in r.remark


def test_timer_message_is_delivered_at_its_time(client, request):
    topic = topic_name(request)
    make_topic(client, topic)
    due = int(time.time() * 1000) + 700
    send(client, topic, b"at", props={"TIMER_DELIVER_MS": str(due)})
    send(client, topic, b"in", props={"TIMER_DELAY_MS": "300"})
    send(client, topic, b"past", props={"TIMER_DELIVER_MS": str(due - 10_000)})
    msgs = wait_for(client, topic, 3)
    assert [m.body for m in msgs] == [b"past", b"in", b"at"]
    assert msgs[2].store_timestamp >= due
    r = client.invoke(send_message(topic, b"far", queue_id=0,
                                   props={"TIMER_DELAY_SEC": str(8 * 86400)}))
    assert r.code == R.MESSAGE_ILLEGAL and "max delay" in r.remark


# -------------------------------------------------------- retry and dead letters
def test_send_back_retries_with_back_off_then_dead_letters(client, request):
    topic, group = topic_name(request), "G_" + topic_name(request)[-40:]
    make_topic(client, topic)
    send(client, topic, b"poison", tags="P", props={"UNIQ_KEY": "POISON"})
    first = pull(client, topic)[0]
    r = client.invoke(send_back(group, first.phy_offset, max_reconsume_times=2))
    assert r.code == R.SUCCESS, r.remark
    retry = "%RETRY%" + group
    msgs = wait_for(client, retry, 1, group=group)
    assert len(msgs) == 1
    m = msgs[0]
    assert m.body == b"poison" and m.reconsume_times == 1
    assert m.properties["RETRY_TOPIC"] == topic and m.properties["ORIGIN_MESSAGE_ID"] == first.offset_msg_id()
    assert m.store_timestamp - first.store_timestamp >= 1000   # level 3 = 1 s here
    r = client.invoke(send_back(group, m.phy_offset, max_reconsume_times=2))
    assert r.code == R.SUCCESS
    m2 = wait_for(client, retry, 2, group=group)[1]
    assert m2.reconsume_times == 2
    assert m2.properties["ORIGIN_MESSAGE_ID"] == first.offset_msg_id()
    r = client.invoke(send_back(group, m2.phy_offset, max_reconsume_times=2))
    assert r.code == R.SUCCESS
    dlq = "%DLQ%" + group
    dead = pull(client, dlq, group=group)           # no delay on the way to the DLQ
    assert [d.body for d in dead] == [b"poison"] and dead[0].reconsume_times == 3
    assert dead[0].properties["RETRY_TOPIC"] == topic
    routes = orjson.loads(client.invoke(RemotingCommand(RC.GET_ALL_TOPIC_CONFIG)).body)
    table = routes["topicConfigTable"]
    assert (table[dlq]["perm"], table[dlq]["readQueueNums"]) == (6, 1)
    assert table[retry]["perm"] == 6


def test_send_back_errors(client, request):
    r = client.invoke(send_back("g", 1 << 50))
    assert r.code == R.SYSTEM_ERROR and "look message by offset failed" in r.remark


# ------------------------------------------------------------ transactions
def half(c, topic, body, group, uniq):
    r = send(c, topic, body, group=group, sysflag=0x4,
             props={"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": uniq})
    halves = pull(c, "RMQ_SYS_TRANS_HALF_TOPIC", 0, offset=int(r.ext["queueOffset"]), max_msgs=1)
    return int(r.ext["queueOffset"]), halves[0].phy_offset


def test_commit_is_visible_once_and_rollback_never(client, request):
    topic, group = topic_name(request), "PG_commit"
    make_topic(client, topic)
    q1, p1 = half(client, topic, b"commit-me", group, "TX1")
    q2, p2 = half(client, topic, b"roll-me-back", group, "TX2")
    assert pull(client, topic) == []                        # half messages are invisible
    for _ in range(2):                                       # a repeated answer changes nothing
        r = client.invoke(end_transaction(group, q1, p1, COMMIT, "TX1"))
        assert r.code == R.SUCCESS, r.remark
        assert client.invoke(end_transaction(group, q2, p2, ROLLBACK, "TX2")).code == R.SUCCESS
    msgs = pull(client, topic)
    assert [m.body for m in msgs] == [b"commit-me"]
    m = msgs[0]
    assert m.sysflag & 0xC == 0x8 and m.prepared_offset == p1
    assert "REAL_TOPIC" not in m.properties and "TRAN_MSG" not in m.properties
    assert m.properties["UNIQ_KEY"] == "TX1"
    r = client.invoke(end_transaction("other-group", q1, p1, COMMIT))
    assert r.code == R.SYSTEM_ERROR and "producer group" in r.remark


def test_unresolved_half_is_checked_with_its_producer_then_rolled_back(broker, request):
    topic, group = topic_name(request), "PG_check"
    with RemotingClient(broker.addr) as producer:
        make_topic(producer, topic)
        assert producer.invoke(heartbeat("cid-check", [group])).code == R.SUCCESS
        qoff, phy = half(producer, topic, b"ask-me", group, "TXC")
        producer.invoke_oneway(end_transaction(group, qoff, phy, UNKNOWN))   # "don't know yet"
        chk = producer.next_request(timeout=10)
        assert chk.code == RC.CHECK_TRANSACTION_STATE
        assert (chk.ext["tranStateTableOffset"], chk.ext["commitLogOffset"]) == (str(qoff), str(phy))
        assert chk.ext["transactionId"] == "TXC"
        rec = decode_records(chk.body)[0]
        assert rec.topic == topic and rec.body == b"ask-me"
        # answer commit through the check: delivered once
        r = producer.invoke(end_transaction(group, qoff, phy, COMMIT, "TXC", from_check=True))
        assert r.code == R.SUCCESS
        assert [m.body for m in wait_for(producer, topic, 1)] == [b"ask-me"]
        # a half nobody answers is rolled back after transactionCheckMax checks
        q2, p2 = half(producer, topic, b"orphan", group, "TXO")
        deadline = time.monotonic() + 15
        kept = []
        while time.monotonic() < deadline and not kept:
            kept = pull(producer, "TRANS_CHECK_MAX_TIME_TOPIC", 0, max_msgs=100)
            time.sleep(0.1)
        assert [m.body for m in kept] == [b"orphan"]
        assert [m.body for m in pull(producer, topic)] == [b"ask-me"]
        late = producer.invoke(end_transaction(group, q2, p2, COMMIT, "TXO"))
        assert late.code == R.SUCCESS
        assert [m.body for m in pull(producer, topic)] == [b"ask-me"]   # resolved already
