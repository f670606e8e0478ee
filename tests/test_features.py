"""Message features on a real broker: delay levels, retry and dead letters,
transactions, reset by time, permissions — what a RocketMQ client sees.

Intervals are configured short (every delay level 1 s, transaction checks
every 300 ms) so that each test waits about a second, not minutes.
"""
from __future__ import annotations

import os
import random
import signal
import threading
import time

import orjson
import pytest
from brokerproc import start_broker
from shmq.client.remoting import RemotingClient
from shmq.client.requests import (
    COMMIT,
    ROLLBACK,
    UNKNOWN,
    create_topic,
    decode_records,
    end_transaction,
    heartbeat,
    pull_message,
    send_back,
    send_message,
)
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand

FAST = dict(messageDelayLevel=" ".join(["1s"] * 18), transactionTimeOut=300,
            transactionCheckInterval=300, transactionCheckMax=3, timerPrecisionMs=100,
            enablePropertyFilter="true")


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


def all_messages(c, topic, queues, group="g"):
    out = []
    for qid in range(queues):
        off = 0
        while True:
            r = c.invoke(pull_message(topic, qid, off, group=group, max_msgs=32))
            if r.code != R.SUCCESS:
                break
            out += decode_records(r.body)
            off = int(r.ext["nextBeginOffset"])
    return out


def delayed(i: int) -> dict:
    """Half the messages by delay level, half by delivery time."""
    if i % 2:
        return {"TIMER_DELAY_MS": str(700 + i % 500), "UNIQ_KEY": f"K{i}"}
    return {"DELAY": "1", "UNIQ_KEY": f"K{i}"}


def test_kill_9_of_the_services_process_neither_loses_nor_repeats_delayed_messages(broker, request):
    topic, n = topic_name(request), 3000
    rng = random.Random(4)
    with RemotingClient(broker.addr) as c:
        make_topic(c, topic, 4)

        def produce():
            with RemotingClient(broker.addr) as p:
                for start in range(0, n, 100):
                    ids = p.send_many([send_message(topic, f"m{i}".encode(), queue_id=i % 4,
                                                    props=delayed(i))
                                       for i in range(start, start + 100)])
                    for i, o in zip(range(start, start + 100), ids):
                        r = p.recv(o)
                        # a send that waited past waitTimeMillsInSendQueue behind the
                        # burst on a loaded machine is refused unstored, SYSTEM_BUSY
                        # (RocketMQ's fast failure): sent again, as a producer does
                        for _ in range(20):
                            if r.code != R.SYSTEM_BUSY:
                                break
                            time.sleep(0.05)
                            r = p.invoke(send_message(topic, f"m{i}".encode(), queue_id=i % 4,
                                                      props=delayed(i)))
                        assert r.code == R.SUCCESS, (r.code, r.remark)
                    time.sleep(0.05)

        sender = threading.Thread(target=produce)
        sender.start()
        kills = 0
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.3, 1.0))
            pid = broker.children().get("shmq-services")
            if pid:
                os.kill(pid, signal.SIGKILL)
                kills += 1
        sender.join()
        assert kills >= 3
        deadline = time.monotonic() + 30
        got = []
        while time.monotonic() < deadline and len(got) < n:
            time.sleep(0.5)
            got = all_messages(c, topic, 4)
        time.sleep(1.5)
        got = all_messages(c, topic, 4)
        keys = [m.properties["UNIQ_KEY"] for m in got]
        assert len(keys) == n and set(keys) == {f"K{i}" for i in range(n)}


# ------------------------------------------------------------ reset by time
def consumer_data(group, topic):
    return {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
            "subscriptionDataSet": [{"topic": topic, "subString": "*", "tagsSet": [],
                                     "codeSet": [], "subVersion": 1, "expressionType": "TAG",
                                     "classFilterMode": False}]}


def reset_request(topic, group, ts, force=True):
    return RemotingCommand(RC.INVOKE_BROKER_TO_RESET_OFFSET, ext={
        "topic": topic, "group": group, "timestamp": str(ts), "isForce": str(force).lower()})


def test_reset_offsets_by_time_moves_the_group_and_tells_its_consumers(broker, request):
    topic, group = topic_name(request), "G_reset"
    with RemotingClient(broker.addr) as admin, RemotingClient(f"unix:{broker.unix}") as consumer:
        make_topic(admin, topic, 2)
        for i in range(3):
            send(admin, topic, f"early{i}".encode(), queue_id=i % 2)
        time.sleep(0.05)
        cut = int(time.time() * 1000)
        time.sleep(0.05)
        for i in range(3):
            send(admin, topic, f"late{i}".encode(), queue_id=i % 2)
        hb = heartbeat("cid-reset", consumers=[consumer_data(group, topic)])
        assert consumer.invoke(hb).code == R.SUCCESS
        for qid in (0, 1):
            upd = RemotingCommand(RC.UPDATE_CONSUMER_OFFSET, ext={
                "consumerGroup": group, "topic": topic, "queueId": str(qid), "commitOffset": "3"})
            assert admin.invoke(upd).code == R.SUCCESS
        r = admin.invoke(reset_request(topic, group, cut))
        assert r.code == R.SUCCESS, r.remark
        assert b'"queueId":0,"topic":"' in r.body and b"}:2" in r.body and b"}:1" in r.body
        note = consumer.next_request(timeout=5)
        assert note.code == RC.RESET_CONSUMER_CLIENT_OFFSET
        assert (note.ext["topic"], note.ext["group"], note.ext["timestamp"]) == (topic, group, str(cut))
        assert b"}:2" in note.body and b"}:1" in note.body
        for qid, want in ((0, 2), (1, 1)):
            q = admin.invoke(RemotingCommand(RC.QUERY_CONSUMER_OFFSET, ext={
                "consumerGroup": group, "topic": topic, "queueId": str(qid)}))
            assert q.ext["offset"] == str(want)
        # -1 = the end; an unknown topic is an error naming it
        assert admin.invoke(reset_request(topic, group, -1)).code == R.SUCCESS
        q = admin.invoke(RemotingCommand(RC.QUERY_CONSUMER_OFFSET, ext={
            "consumerGroup": group, "topic": topic, "queueId": "0"}))
        assert q.ext["offset"] == "4"
        r = admin.invoke(reset_request("NoSuchTopic", group, cut))
        assert r.code == R.TOPIC_NOT_EXIST and "NoSuchTopic" in r.remark


# ------------------------------------------------------------------- SQL92
def sql_pull(c, topic, expr, offset=0):
    cmd = pull_message(topic, 0, offset, group="gsql", max_msgs=32, subscription=expr)
    cmd.ext["expressionType"] = "SQL92"
    return c.invoke(cmd)


def test_sql92_filter_on_user_properties(client, request):
    topic = topic_name(request)
    make_topic(client, topic)
    for i in range(40):
        send(client, topic, f"m{i}".encode(), tags="even" if i % 2 == 0 else "odd",
             props={"a": str(i), "region": "eu" if i < 20 else "us"})
    r = sql_pull(client, topic, "a BETWEEN 10 AND 14 AND region = 'eu' OR a IN ('39')")
    assert r.code == R.SUCCESS, r.remark
    assert [m.body for m in decode_records(r.body)] == [b"m10", b"m11", b"m12", b"m13", b"m14"]
    r = sql_pull(client, topic, "a > 36 AND TAGS = 'odd'", offset=0)
    got = []
    while r.code in (R.SUCCESS, R.PULL_RETRY_IMMEDIATELY) and len(got) < 2:
        got += [m.body for m in decode_records(r.body)] if r.code == R.SUCCESS else []
        r = sql_pull(client, topic, "a > 36 AND TAGS = 'odd'", int(r.ext["nextBeginOffset"]))
    assert got == [b"m37", b"m39"]
    r = sql_pull(client, topic, "nothere IS NULL AND NOT (region <> 'us')")
    assert decode_records(r.body)[0].body == b"m20"


def test_a_bad_sql92_expression_is_refused_at_subscribe_and_pull(client, request):
    topic = topic_name(request)
    make_topic(client, topic)
    r = sql_pull(client, topic, "a > ")
    assert r.code == R.SUBSCRIPTION_PARSE_FAILED and "a > " in r.remark
    body = orjson.dumps({"clientId": "c1", "group": "gsql", "subscriptionData": {
        "topic": topic, "subString": "a = 'x", "expressionType": "SQL92"}})
    r = client.invoke(RemotingCommand(RC.CHECK_CLIENT_CONFIG, body=body))
    assert r.code == R.SUBSCRIPTION_PARSE_FAILED and "a = 'x" in r.remark
    ok = orjson.dumps({"clientId": "c1", "group": "gsql", "subscriptionData": {
        "topic": topic, "subString": "a = 'x'", "expressionType": "SQL92"}})
    assert client.invoke(RemotingCommand(RC.CHECK_CLIENT_CONFIG, body=ok)).code == R.SUCCESS


# ------------------------------------------------------------- permissions
def broker_config(c, **values):
    body = "".join(f"{k}={v}\n" for k, v in values.items()).encode()
    return c.invoke(RemotingCommand(RC.UPDATE_BROKER_CONFIG, body=body))


def route_perm(broker, topic):
    with RemotingClient(broker.namesrv) as ns:
        r = ns.invoke(RemotingCommand(RC.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}))
        return orjson.loads(r.body)["queueDatas"][0]["perm"] if r.code == R.SUCCESS else None


def test_topic_perm_and_a_drained_broker_answer_no_permission(broker, client, request):
    topic = topic_name(request)
    make_topic(client, topic + "_ro", perm=4)
    make_topic(client, topic + "_wo", perm=2)
    r = client.invoke(send_message(topic + "_ro", b"x", queue_id=0))
    assert r.code == R.NO_PERMISSION and "forbidden" in r.remark
    send(client, topic + "_wo", b"x")
    r = client.invoke(pull_message(topic + "_wo", 0, 0))
    assert r.code == R.NO_PERMISSION
    make_topic(client, topic)
    send(client, topic, b"before")
    try:
        assert broker_config(client, brokerPermission=4).code == R.SUCCESS
        r = client.invoke(send_message(topic, b"drained", queue_id=0))
        assert r.code == R.NO_PERMISSION and "broker-a" in r.remark
        with RemotingClient(f"unix:{broker.unix}") as other:      # every worker sees it
            assert other.invoke(send_message(topic, b"x", queue_id=0)).code == R.NO_PERMISSION
        assert [m.body for m in pull(client, topic)] == [b"before"]   # still readable
        deadline = time.monotonic() + 5
        while route_perm(broker, topic) != 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert route_perm(broker, topic) == 4      # producers routed elsewhere
        cfg = client.invoke(RemotingCommand(RC.GET_BROKER_CONFIG)).body.decode()
        assert "brokerPermission=4" in cfg.splitlines()
        bad = broker_config(client, brokerPermission="rw")
        assert bad.code == R.SYSTEM_ERROR and "brokerPermission" in bad.remark
        bad = broker_config(client, noSuchSetting=1)
        assert bad.code == R.SYSTEM_ERROR and "noSuchSetting" in bad.remark
    finally:
        assert broker_config(client, brokerPermission=6).code == R.SUCCESS
    send(client, topic, b"after")


# ------------------------------------------------------------------- query
def query(c, topic, key, unique=False, begin=0, end=None, max_num=32):
    ext = {"topic": topic, "key": key, "maxNum": str(max_num), "beginTimestamp": str(begin),
           "endTimestamp": str(end or int(time.time() * 1000) + 60_000)}
    if unique:
        ext["_UNIQUE_KEY_QUERY"] = "true"
    return c.invoke(RemotingCommand(RC.QUERY_MESSAGE, ext=ext))


def test_query_by_key_and_by_unique_id_through_the_index(client, request):
    topic = topic_name(request)
    make_topic(client, topic, 2)
    t0 = int(time.time() * 1000)
    for i in range(50):
        send(client, topic, b"q%d" % i, queue_id=i % 2, keys=[f"order-{i % 5}", "all"],
             props={"UNIQ_KEY": f"UQ{i:04d}"})
    deadline = time.monotonic() + 5           # indexed by the services process within a tick
    while len(decode_records((r := query(client, topic, "order-3")).body)) < 10 \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.code == R.SUCCESS, r.remark
    assert sorted(m.body for m in decode_records(r.body)) == sorted(b"q%d" % i for i in range(3, 50, 5))
    assert int(r.ext["indexLastUpdatePhyoffset"]) > 0 and int(r.ext["indexLastUpdateTimestamp"]) >= t0 // 1000 * 1000
    r = query(client, topic, "UQ0042", unique=True)
    assert [m.body for m in decode_records(r.body)] == [b"q42"]
    r = query(client, topic, "all", max_num=7)
    assert len(decode_records(r.body)) == 7                              # maxNum honoured
    assert query(client, topic, "order-3", end=t0 - 5000).code == R.QUERY_NOT_FOUND   # time bound
    assert query(client, "Other" + topic[:20], "order-3").code == R.QUERY_NOT_FOUND   # per topic


# ------------------------------------------------------------- restarts
LONG_DELAY_S = 12       # delay level 2 of the restarts' broker (level 1 stays 1 s)


@pytest.fixture(scope="module")
def restarts_broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("restarts"),
                     **{**FAST, "messageDelayLevel": f"1s {LONG_DELAY_S}s"})
    yield b
    b.stop()


@pytest.fixture
def whole_broker(restarts_broker):
    """A broker the test may kill -9 whole and start again, each test on its
    own topic: one start and stop for the module's restart tests instead of
    one each (~3 s), started again here if a test left it dead."""
    if restarts_broker.proc.poll() is not None:
        restarts_broker.start()
    return restarts_broker


def test_delayed_timed_and_half_messages_survive_kill_9_of_the_whole_broker(whole_broker):
    """Nothing waiting is lost or delivered twice when every broker process is
    killed, some messages already delivered and some not yet due."""
    n = 300
    b = whole_broker
    topic, group = "F_restart", "PG_restart"
    with RemotingClient(b.addr) as c:
        make_topic(c, topic, 2)
        for i in range(n):
            props = {"DELAY": "1"} if i % 3 else {"TIMER_DELAY_MS": str(300 + 5 * i)}
            send(c, topic, b"d%d" % i, queue_id=i % 2, props={**props, "UNIQ_KEY": f"R{i}"})
        qoff, phy = half(c, topic, b"half", group, "HALF")
        time.sleep(1.0)                         # some are being delivered now
    b.kill9()
    b.start()
    with RemotingClient(b.addr) as c:
        assert c.invoke(heartbeat("cid-restart", [group])).code == R.SUCCESS
        chk = c.next_request(timeout=15)        # the half is still pending: asked again
        assert chk.ext["tranStateTableOffset"] == str(qoff)
        r = c.invoke(end_transaction(group, qoff, phy, COMMIT, "HALF", from_check=True))
        assert r.code == R.SUCCESS
        deadline = time.monotonic() + 20
        got = []
        while time.monotonic() < deadline and len(got) < n + 1:
            time.sleep(0.3)
            got = all_messages(c, topic, 2)
        time.sleep(1.5)
        got = all_messages(c, topic, 2)
    keys = sorted(m.properties["UNIQ_KEY"] for m in got)
    assert keys == sorted([f"R{i}" for i in range(n)] + ["HALF"])


def test_after_kill_9_of_the_whole_broker_no_waiting_message_is_delivered_early(whole_broker):
    """The restart re-dispatches the ConsumeQueue units of records past the
    checkpoint; the delay-level and timer units must keep their delivery time
    (a tag hash there made them due at once). The services process is stopped
    before the sends, so the timer messages are not in its timer log yet: the
    restarted one reads their times from the units."""
    delay_s, n = LONG_DELAY_S, 40
    b = whole_broker
    topic = "F_not_early"
    with RemotingClient(b.addr) as c:
        make_topic(c, topic, 2)
        services = b.children()["shmq-services"]
        os.kill(services, signal.SIGSTOP)
        sent_at = time.time()
        for i in range(n):
            props = {"DELAY": "2"} if i % 2 else {"TIMER_DELAY_MS": str(delay_s * 1000)}
            send(c, topic, b"w%d" % i, queue_id=i % 2, props={**props, "UNIQ_KEY": f"W{i}"})
    b.kill9()                                   # SIGKILL ends a stopped process too
    b.start()
    due = sent_at + delay_s
    with RemotingClient(b.addr) as c:
        # Units that lost their delivery time are due at once, delivered by the
        # services process's first passes after the start: watching for 2 s
        # before the due time tells. A restart slower than that on a loaded
        # machine leaves too little to watch: said, not passed (nor failed).
        left = due - time.time()
        if left < 2.5:
            pytest.skip(f"the restart left {left:.1f} s before the due time: too little to "
                        f"watch for an early delivery")
        while True:
            early = all_messages(c, topic, 2)
            assert early == [], f"{len(early)} delivered {due - time.time():.1f} s early"
            if time.time() >= due - 0.5:
                break
            time.sleep(0.2)
        got = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len(got) < n:
            time.sleep(0.3)
            got = all_messages(c, topic, 2)
    assert sorted(m.properties["UNIQ_KEY"] for m in got) == sorted(f"W{i}" for i in range(n))


def test_a_group_created_with_its_own_retry_limit_dead_letters_sooner(client, request):
    topic, group = topic_name(request), "G_limit"
    make_topic(client, topic)
    body = orjson.dumps({"groupName": group, "retryMaxTimes": 1, "retryQueueNums": 1})
    r = client.invoke(RemotingCommand(RC.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body))
    assert r.code == R.SUCCESS, r.remark
    groups = orjson.loads(client.invoke(RemotingCommand(RC.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body)
    assert groups["subscriptionGroupTable"][group]["retryMaxTimes"] == 1
    assert groups["subscriptionGroupTable"][group]["consumeEnable"] is True   # defaults kept
    send(client, topic, b"once")
    first = pull(client, topic)[0]
    assert client.invoke(send_back(group, first.phy_offset)).code == R.SUCCESS
    retried = wait_for(client, "%RETRY%" + group, 1, group=group)[0]
    assert client.invoke(send_back(group, retried.phy_offset)).code == R.SUCCESS
    assert [m.body for m in pull(client, "%DLQ%" + group, group=group)] == [b"once"]
