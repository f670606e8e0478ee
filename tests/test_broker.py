"""A real ``shmq broker`` (boss, workers, flusher, services, NameServer) over real sockets.

What a RocketMQ client sees: send and pull over TCP and the Unix socket,
batches, tag filters, long polling and out-of-order replies, offsets,
consumer groups and queue locks, lookups, admin, the NameServer's routes,
and the error answers for bad requests.
"""
from __future__ import annotations

import threading
import time

import orjson
import pytest

from brokerproc import start_broker
from shmq.client.remoting import RemotingClient, RemotingTimeout
from shmq.client.requests import (create_topic, decode_records, properties, pull_message,
                                  send_batch, send_message)
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("broker"))
    yield b
    assert b.stop() == 0, b.log()[-3000:]


@pytest.fixture(params=["tcp", "unix"])
def client(request, broker):
    addr = broker.addr if request.param == "tcp" else f"unix:{broker.unix}"
    with RemotingClient(addr) as c:
        yield c


def topic_name(request) -> str:
    return "T_" + "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[-100:]


def make_topic(c, topic, queues=4):
    r = c.invoke(create_topic(topic, queues))
    assert r.code == R.SUCCESS, r.remark


def pull_all(c, topic, qid, offset=0, **kw):
    r = c.invoke(pull_message(topic, qid, offset, **kw))
    return r, decode_records(r.body) if r.code == R.SUCCESS else []


def test_send_then_pull_returns_the_messages_with_tags_keys_and_offsets(client, request):
    topic = topic_name(request)
    make_topic(client, topic)
    sent = []
    for i in range(3):
        r = client.invoke(send_message(topic, f"body-{i}".encode(), tags="TagA", keys=[f"k{i}", "x"],
                                       queue_id=1))
        assert r.code == R.SUCCESS, r.remark
        assert (r.ext["queueId"], r.ext["queueOffset"]) == ("1", str(i))
        assert len(r.ext["msgId"]) == 32 and r.ext["MSG_REGION"] and r.ext["TRACE_ON"] == "true"
        sent.append(r.ext["msgId"])
    r, msgs = pull_all(client, topic, 1)
    assert r.code == R.SUCCESS
    assert (r.ext["nextBeginOffset"], r.ext["minOffset"], r.ext["maxOffset"]) == ("3", "0", "3")
    assert [m.body for m in msgs] == [b"body-0", b"body-1", b"body-2"]
    assert [m.queue_offset for m in msgs] == [0, 1, 2]
    assert all(m.tags == "TagA" and m.topic == topic for m in msgs)
    assert msgs[2].keys == ["k2", "x"]
    assert msgs[0].properties["CLUSTER"] == "DefaultCluster"
    assert [m.offset_msg_id() for m in msgs] == sent
    # caught up: PULL_NOT_FOUND with every offset still in the header
    r, _ = pull_all(client, topic, 1, 3)
    assert r.code == R.PULL_NOT_FOUND and r.remark == "OFFSET_OVERFLOW_ONE"
    assert (r.ext["nextBeginOffset"], r.ext["maxOffset"]) == ("3", "3")
    r, _ = pull_all(client, topic, 1, 10)     # RocketMQ: back to minOffset when it is 0
    assert r.code == R.PULL_OFFSET_MOVED and r.ext["nextBeginOffset"] == "0"


def test_sends_pipelined_on_one_connection_are_each_answered_and_stored_in_order_per_queue(
        broker, request):
    """Hundreds of sends written at once (the worker reads many per turn and
    appends them a claim per queue): each answered once, with its own
    msgId, at the next offset of its queue in the order sent; a bad one
    among them gets its own error answer."""
    import socket

    from shmq.ipc.remoting import FrameDecoder, encode
    topic = topic_name(request)
    with RemotingClient(f"unix:{broker.unix}") as c:
        make_topic(c, topic)
    cmds = []
    for i in range(300):
        cmd = send_message(topic, b"m%d" % i, queue_id=i % 4, props={"UNIQ_KEY": f"U{i}"})
        cmd.opaque = 1000 + i
        cmds.append(cmd)
    cmds[150] = send_message(topic, b"bad", queue_id=7)
    cmds[150].opaque = 1150
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(broker.unix)
    s.sendall(b"".join(bytes(encode(c)) for c in cmds))
    dec, replies = FrameDecoder(), {}
    while len(replies) < len(cmds):
        data = s.recv(1 << 16)
        assert data, "the broker closed the connection"
        dec.receive_data(data)
        while (r := dec.next_command()) is not None:
            assert r.opaque not in replies
            replies[r.opaque] = r
    s.close()
    assert replies[1150].code == R.SYSTEM_ERROR and "queueId[7] is illegal" in replies[1150].remark
    with RemotingClient(f"unix:{broker.unix}") as c:
        for q in range(4):
            sent = [i for i in range(300) if i % 4 == q and i != 150]
            assert [int(replies[1000 + i].ext["queueOffset"]) for i in sent] == list(range(len(sent)))
            assert all(replies[1000 + i].ext["queueId"] == str(q) for i in sent)
            msgs = []
            while len(msgs) < len(sent):
                _, got = pull_all(c, topic, q, len(msgs))
                assert got, f"queue {q}: {len(msgs)} of {len(sent)} stored"
                msgs += got
            assert [m.body for m in msgs] == [b"m%d" % i for i in sent]
            assert [m.offset_msg_id() for m in msgs] == [replies[1000 + i].ext["msgId"] for i in sent]


def test_batch_send_stores_every_message_with_its_own_properties(client, request):
    topic = topic_name(request)
    make_topic(client, topic, 2)
    msgs = [(f"m{i}".encode() * (i + 1), properties(tags=f"T{i % 3}", keys=f"key{i}"))
            for i in range(100)]
    r = client.invoke(send_batch(topic, msgs, queue_id=0))
    assert r.code == R.SUCCESS, r.remark
    assert len(r.ext["msgId"].split(",")) == 100 and r.ext["queueOffset"] == "0"
    got = []
    off = 0
    while len(got) < 100:
        p, page = pull_all(client, topic, 0, off)
        assert p.code == R.SUCCESS
        got += page
        off = int(p.ext["nextBeginOffset"])
    assert [m.body for m in got] == [b for b, _ in msgs]
    assert [m.tags for m in got] == [f"T{i % 3}" for i in range(100)]
    assert got[57].keys == ["key57"] and got[57].properties["CLUSTER"] == "DefaultCluster"


def test_a_tag_subscription_returns_only_matching_messages(client, request):
    topic = topic_name(request)
    make_topic(client, topic, 1)
    for i, tag in enumerate(["A", "B", None, "A", "C"]):
        assert client.invoke(send_message(topic, b"%d" % i, tags=tag, queue_id=0)).code == R.SUCCESS
    r, msgs = pull_all(client, topic, 0, subscription="A || C")
    assert [m.body for m in msgs] == [b"0", b"3", b"4"]
    r, msgs = pull_all(client, topic, 0, subscription="*")
    assert len(msgs) == 5
    r, msgs = pull_all(client, topic, 0, subscription="Z")
    assert r.code == R.PULL_RETRY_IMMEDIATELY and r.ext["nextBeginOffset"] == "5"


def test_a_parked_pull_is_answered_when_a_message_arrives_and_does_not_block_other_requests(broker, request):
    topic = topic_name(request)
    with RemotingClient(broker.addr) as c, RemotingClient(f"unix:{broker.unix}") as producer:
        make_topic(c, topic, 1)
        pull_op = c.send(pull_message(topic, 0, 0, suspend_ms=20_000))
        # the next request on the same connection is answered while the pull waits
        r = c.invoke(RemotingCommand(RC.GET_MAX_OFFSET, ext={"topic": topic, "queueId": "0"}))
        assert r.code == R.SUCCESS and r.ext["offset"] == "0"
        with pytest.raises(RemotingTimeout):
            c.recv(pull_op, timeout=0.3)
        assert producer.invoke(send_message(topic, b"wake", queue_id=0)).code == R.SUCCESS
        r = c.recv(pull_op, timeout=5)     # long before the 20 s hold ends
        assert r.code == R.SUCCESS and decode_records(r.body)[0].body == b"wake"


def test_a_parked_pull_times_out_with_pull_not_found(client, request):
    """When: tests/test_handlers.py, on a fake clock; here: that it is answered."""
    topic = topic_name(request)
    make_topic(client, topic, 1)
    r = client.invoke(pull_message(topic, 0, 0, suspend_ms=300), timeout=10)
    assert r.code == R.PULL_NOT_FOUND


def test_consumer_offsets_min_max_and_time_lookups(client, request):
    topic = topic_name(request)
    make_topic(client, topic, 1)
    q = {"topic": topic, "queueId": "0", "consumerGroup": "G1"}
    r = client.invoke(RemotingCommand(RC.QUERY_CONSUMER_OFFSET, ext=q))
    assert (r.code, r.ext.get("offset")) == (R.SUCCESS, "0")   # a new group starts at 0
    stamps = []
    for i in range(5):
        stamps.append(int(time.time() * 1000))
        assert client.invoke(send_message(topic, b"x", queue_id=0)).code == R.SUCCESS
        time.sleep(0.02)
    r = client.invoke(RemotingCommand(RC.UPDATE_CONSUMER_OFFSET, ext={**q, "commitOffset": "3"}))
    assert r.code == R.SUCCESS
    assert client.invoke(RemotingCommand(RC.QUERY_CONSUMER_OFFSET, ext=q)).ext["offset"] == "3"
    # a pull that commits an offset
    client.invoke(pull_message(topic, 0, 4, group="G1", commit_offset=4))
    assert client.invoke(RemotingCommand(RC.QUERY_CONSUMER_OFFSET, ext=q)).ext["offset"] == "4"
    qq = {"topic": topic, "queueId": "0"}
    assert client.invoke(RemotingCommand(RC.GET_MAX_OFFSET, ext=qq)).ext["offset"] == "5"
    assert client.invoke(RemotingCommand(RC.GET_MIN_OFFSET, ext=qq)).ext["offset"] == "0"
    _, msgs = pull_all(client, topic, 0)
    r = client.invoke(RemotingCommand(RC.GET_EARLIEST_MSG_STORETIME, ext=qq))
    assert int(r.ext["timestamp"]) == msgs[0].store_timestamp
    for i, m in enumerate(msgs):
        r = client.invoke(RemotingCommand(RC.SEARCH_OFFSET_BY_TIMESTAMP,
                                          ext={**qq, "timestamp": str(m.store_timestamp)}))
        assert r.ext["offset"] == str(i)
    r = client.invoke(RemotingCommand(RC.SEARCH_OFFSET_BY_TIMESTAMP, ext={**qq, "timestamp": "0"}))
    assert r.ext["offset"] == "0"


def heartbeat(c, client_id, group, topic, tags="*"):
    body = {"clientID": client_id, "producerDataSet": [], "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": topic, "subString": tags, "tagsSet": [], "codeSet": [],
                                 "subVersion": 1, "expressionType": "TAG", "classFilterMode": False}]}]}
    r = c.invoke(RemotingCommand(RC.HEART_BEAT, body=orjson.dumps(body)))
    assert r.code == R.SUCCESS and r.version >= 401
    return r


def test_heartbeats_form_groups_and_members_are_told_when_a_group_changes(broker, request):
    topic, group = topic_name(request), "GRP_" + topic_name(request)[-40:]
    with RemotingClient(broker.addr) as a, RemotingClient(broker.addr) as b:
        make_topic(a, topic, 2)
        heartbeat(a, "10.0.0.1@A", group, topic, "TagA")
        r = a.invoke(RemotingCommand(RC.GET_CONSUMER_LIST_BY_GROUP, ext={"consumerGroup": group}))
        assert orjson.loads(r.body) == {"consumerIdList": ["10.0.0.1@A"]}
        heartbeat(b, "10.0.0.2@B", group, topic)
        r = a.invoke(RemotingCommand(RC.GET_CONSUMER_LIST_BY_GROUP, ext={"consumerGroup": group}))
        assert orjson.loads(r.body)["consumerIdList"] == ["10.0.0.1@A", "10.0.0.2@B"]
        # a learns that its group changed (b may be on another worker)
        deadline = time.monotonic() + 5
        while not a.requests and time.monotonic() < deadline:
            with pytest.raises(RemotingTimeout):
                a.recv(-1, timeout=0.2)
        note = a.requests.popleft()
        assert note.code == RC.NOTIFY_CONSUMER_IDS_CHANGED and note.ext["consumerGroup"] == group
        # the registered subscription filters a's pulls (no subscription flag)
        a.invoke(send_message(topic, b"a", tags="TagA", queue_id=0))
        a.invoke(send_message(topic, b"b", tags="TagB", queue_id=0))
        p = pull_message(topic, 0, 0, group=group)
        p.ext["sysFlag"] = "0"
        r = a.invoke(p)
        assert [m.body for m in decode_records(r.body)] == [b"a"]
        # leaving: b closes; the group shrinks
    with RemotingClient(broker.addr) as c:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            r = c.invoke(RemotingCommand(RC.GET_CONSUMER_LIST_BY_GROUP, ext={"consumerGroup": group}))
            if r.code == R.SYSTEM_ERROR:
                break
            time.sleep(0.1)
        assert r.code == R.SYSTEM_ERROR and "no consumer for this group" in r.remark


def test_queue_locks_go_to_one_client_at_a_time(client, request):
    group = "LOCK_" + topic_name(request)[-40:]
    mqs = [{"topic": "T", "brokerName": "broker-a", "queueId": q} for q in range(3)]

    def lock(cid, code=RC.LOCK_BATCH_MQ):
        body = orjson.dumps({"consumerGroup": group, "clientId": cid, "mqSet": mqs})
        r = client.invoke(RemotingCommand(code, body=body))
        assert r.code == R.SUCCESS
        return r

    assert len(orjson.loads(lock("A").body)["lockOKMQSet"]) == 3
    assert orjson.loads(lock("B").body)["lockOKMQSet"] == []
    assert len(orjson.loads(lock("A").body)["lockOKMQSet"]) == 3     # renewal
    lock("A", RC.UNLOCK_BATCH_MQ)
    assert len(orjson.loads(lock("B").body)["lockOKMQSet"]) == 3


def test_view_by_id_and_query_by_key(client, request):
    topic = topic_name(request)
    make_topic(client, topic, 2)
    t0 = int(time.time() * 1000) - 1000
    ids = {}
    for i in range(6):
        r = client.invoke(send_message(topic, b"v%d" % i, keys=f"order-{i % 3}", queue_id=i % 2))
        ids[i] = r.ext["msgId"]
    phy = int(ids[4][16:], 16)
    r = client.invoke(RemotingCommand(RC.VIEW_MESSAGE_BY_ID, ext={"offset": str(phy)}))
    assert r.code == R.SUCCESS and decode_records(r.body)[0].body == b"v4"
    r = client.invoke(RemotingCommand(RC.VIEW_MESSAGE_BY_ID, ext={"offset": str(phy + 3)}))
    assert r.code == R.SYSTEM_ERROR
    q = {"topic": topic, "key": "order-1", "maxNum": "32", "beginTimestamp": str(t0),
         "endTimestamp": str(t0 + 3_600_000)}
    deadline = time.monotonic() + 5        # the services process indexes within a tick
    while len(decode_records((r := client.invoke(RemotingCommand(RC.QUERY_MESSAGE, ext=q))).body)) < 2 \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.code == R.SUCCESS
    assert sorted(m.body for m in decode_records(r.body)) == [b"v1", b"v4"]
    r = client.invoke(RemotingCommand(RC.QUERY_MESSAGE, ext={**q, "key": "nope"}))
    assert r.code == R.QUERY_NOT_FOUND


def test_topics_are_created_listed_routed_and_deleted(broker, request):
    topic = topic_name(request)
    with RemotingClient(broker.addr) as c, RemotingClient(broker.namesrv) as ns:
        make_topic(c, topic, 3)
        assert c.invoke(send_message(topic, b"x", queue_id=0)).code == R.SUCCESS
        r = c.invoke(RemotingCommand(RC.GET_ALL_TOPIC_CONFIG))
        tc = orjson.loads(r.body)["topicConfigTable"][topic]
        assert (tc["readQueueNums"], tc["writeQueueNums"], tc["perm"]) == (3, 3, 6)
        route = None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            r = ns.invoke(RemotingCommand(RC.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}))
            if r.code == R.SUCCESS:
                route = orjson.loads(r.body)
                break
            time.sleep(0.05)
        assert route["brokerDatas"][0]["brokerAddrs"] == {"0": broker.addr}
        assert route["queueDatas"][0]["writeQueueNums"] == 3
        assert c.invoke(RemotingCommand(RC.DELETE_TOPIC_IN_BROKER, ext={"topic": topic})).code == R.SUCCESS
        r = c.invoke(RemotingCommand(RC.GET_ALL_TOPIC_CONFIG))
        assert topic not in orjson.loads(r.body)["topicConfigTable"]
        r = c.invoke(RemotingCommand(RC.GET_BROKER_RUNTIME_INFO))
        assert int(orjson.loads(r.body)["table"]["commitLogMaxOffset"]) > 0


def test_bad_requests_get_rocketmq_error_codes_with_remarks(client, request):
    topic = topic_name(request)
    make_topic(client, topic, 2)
    r = client.invoke(RemotingCommand(9999))
    assert (r.code, r.remark) == (R.REQUEST_CODE_NOT_SUPPORTED, " request type 9999 not supported")
    bad = send_message(topic, b"x")
    del bad.ext["b"]
    r = client.invoke(bad)
    assert r.code == R.SYSTEM_ERROR and "topic" in r.remark
    r = client.invoke(send_message(topic, b"x", queue_id=7))
    assert r.code == R.SYSTEM_ERROR and "queueId" in r.remark
    r = client.invoke(send_message("bad topic!", b"x"))
    assert r.code == R.SYSTEM_ERROR and "characters" in r.remark
    r = client.invoke(send_message("SCHEDULE_TOPIC_XXXX", b"x"))
    assert r.code == R.NO_PERMISSION
    r = client.invoke(send_message(topic, b"x" * ((1 << 20) + 1), queue_id=0))
    assert r.code == R.MESSAGE_ILLEGAL and "maxMessageSize" in r.remark
    r = client.invoke(send_message(topic, b"", queue_id=0))
    assert r.code == R.MESSAGE_ILLEGAL
    cmd = send_batch(topic, [(b"x", "")], queue_id=0)
    cmd.body = cmd.body[:-1] + b"\xff\xff\xff"
    r = client.invoke(cmd)
    assert r.code == R.MESSAGE_ILLEGAL and "batch" in r.remark
    r = client.invoke(pull_message("NoSuchTopic", 0, 0))
    assert r.code == R.TOPIC_NOT_EXIST
    r = client.invoke(pull_message(topic, 9, 0))
    assert r.code == R.SYSTEM_ERROR
    r = client.invoke(RemotingCommand(RC.HEART_BEAT, body=b"{not json"))
    assert r.code == R.SYSTEM_ERROR
    p = pull_message(topic, 0, 0)
    p.ext["queueOffset"] = "abc"
    r = client.invoke(p)
    assert r.code == R.SYSTEM_ERROR and "queueOffset" in r.remark
    # still serving
    assert client.invoke(send_message(topic, b"ok", queue_id=0)).code == R.SUCCESS


def test_a_new_topic_needs_the_inheriting_default_topic(client, request):
    cmd = send_message(topic_name(request), b"x")
    cmd.ext["c"] = "NoSuchDefault"
    r = client.invoke(cmd)
    assert r.code == R.TOPIC_NOT_EXIST
    r = client.invoke(send_message(topic_name(request), b"x", default_queues=2))
    assert r.code == R.SUCCESS   # auto-created from TBW102
