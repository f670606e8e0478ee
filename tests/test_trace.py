"""Message trace (issue 19): the record codec against what RocketMQ's Java
TraceDataEncoder writes, and shmq's client tracing a real send and consume
on a broker with ``traceTopicEnable``, read back by msgId as
``shmq admin queryMsgTraceById`` reads it (tools/msg_trace.py).

The compat clients cannot add a third party's records here: the C++ core
under rocketmq==0.4.4 has no message trace (librocketmq.so knows only the
TRACE_ON property name) and ali-ons 3.12 none at all. What a Java client
writes is pinned by the golden strings below, derived from the Java source.
"""
from __future__ import annotations

import asyncio
import time
import zlib

import pytest

from shmq.client import (AsyncProducer, AsyncPushConsumer, AsyncTransactionProducer,
                         ConsumeConcurrentlyStatus, LocalTransactionState, Message,
                         TransactionListener)
from shmq.client.trace import QUEUE_SIZE
from shmq.broker.config import BrokerConfig
from shmq.client.trace_data import (TRACE_TOPIC, ConsumeReturnType, MessageType, TraceBean, TraceContext,
                                    TraceFormatError, TraceType, decode, encode)
from shmq.tools.admin_client import AdminClient, AdminError
from shmq.tools.msg_trace import query_msg_trace

from brokerproc import start_broker, stored_records

# ---------------------------------------------------------------- the codec
# Golden records: what org.apache.rocketmq.client.trace.TraceDataEncoder.
# encoderFromContextBean writes at tag rocketmq-all-4.9.7 (commit 5eb2e4ca;
# client/src/main/java/org/apache/rocketmq/client/trace/TraceDataEncoder.java):
# StringBuilder.append of each field, CONTENT_SPLITOR (char) 1 between them,
# FIELD_SPLITOR (char) 2 after the record (TraceConstants); a null String
# appends "null", a boolean "true"/"false", msgType its ordinal().
A, B = "\x01", "\x02"
MSG_ID = "7F0000010B2A18B4AAC25D5BE6B30000"
OFFSET_ID = "7F00000100002A9F0000000000001C2B"
PUB = TraceContext(TraceType.Pub, 1700000000123, "DefaultRegion", "PG_A", 3, True, trace_beans=[
    TraceBean(topic="TopicA", msg_id=MSG_ID, offset_msg_id=OFFSET_ID, tags="TagA",
              keys="k1 k2", store_host="127.0.0.1:10911", body_length=11,
              msg_type=MessageType.Delay_Msg)])
# case Pub: type, timeStamp, regionId, groupName, topic, msgId, tags, keys,
# storeHost, bodyLength, costTime, msgType.ordinal(), offsetMsgId, isSuccess
PUB_TEXT = (f"Pub{A}1700000000123{A}DefaultRegion{A}PG_A{A}TopicA{A}{MSG_ID}{A}TagA{A}k1 k2{A}"
            f"127.0.0.1:10911{A}11{A}3{A}3{A}{OFFSET_ID}{A}true{B}")
SUB_BEFORE = TraceContext(TraceType.SubBefore, 1700000000200, None, "CG_A",
                          request_id="0A0B0C0D00002A9F0000000000000001", trace_beans=[
                              TraceBean(msg_id=MSG_ID, retry_times=0, keys="k1 k2"),
                              TraceBean(msg_id="M2", retry_times=2, keys=None)])
# case SubBefore, per bean: type, timeStamp, regionId, groupName, requestId,
# msgId, retryTimes, keys (a consumed message's absent MSG_REGION and keys: null)
SUB_BEFORE_TEXT = (f"SubBefore{A}1700000000200{A}null{A}CG_A{A}0A0B0C0D00002A9F0000000000000001"
                   f"{A}{MSG_ID}{A}0{A}k1 k2{B}"
                   f"SubBefore{A}1700000000200{A}null{A}CG_A{A}0A0B0C0D00002A9F0000000000000001"
                   f"{A}M2{A}2{A}null{B}")
SUB_AFTER = TraceContext(TraceType.SubAfter, 1700000000250, None, "CG_A", 25, False,
                         request_id="0A0B0C0D00002A9F0000000000000001",
                         context_code=int(ConsumeReturnType.FAILED), trace_beans=[
                             TraceBean(msg_id=MSG_ID, keys="k1 k2")])
# case SubAfter, per bean: type, requestId, msgId, costTime, isSuccess, keys,
# contextCode, then (accessChannel LOCAL) timeStamp, groupName
SUB_AFTER_TEXT = (f"SubAfter{A}0A0B0C0D00002A9F0000000000000001{A}{MSG_ID}{A}25{A}false{A}k1 k2"
                  f"{A}4{A}1700000000250{A}CG_A{B}")


def test_records_encode_as_javas_trace_data_encoder_writes_them():
    assert encode(PUB) == PUB_TEXT
    assert encode(SUB_BEFORE) == SUB_BEFORE_TEXT
    assert encode(SUB_AFTER) == SUB_AFTER_TEXT
    pub_null_tags = TraceContext(TraceType.Pub, 1, "DefaultRegion", "G", 0, False, trace_beans=[
        TraceBean(topic="T", msg_id="M", offset_msg_id="O", tags=None, keys=None, store_host="h:1",
                  body_length=1)])
    assert encode(pub_null_tags) == (f"Pub{A}1{A}DefaultRegion{A}G{A}T{A}M{A}null{A}null{A}h:1{A}1"
                                     f"{A}0{A}0{A}O{A}false{B}")
    # transKey: each msgId, and each key of KEYS split at spaces
    assert SUB_BEFORE.keys() == [MSG_ID, "k1", "k2", "M2"]


def test_a_batch_of_records_decodes_field_by_field():
    got = decode(PUB_TEXT + SUB_BEFORE_TEXT + SUB_AFTER_TEXT)
    assert [c.trace_type for c in got] == [TraceType.Pub, TraceType.SubBefore, TraceType.SubBefore,
                                           TraceType.SubAfter]
    pub = got[0]
    assert (pub.time_stamp, pub.region_id, pub.group_name, pub.cost_time, pub.success) == \
        (1700000000123, "DefaultRegion", "PG_A", 3, True)
    assert pub.trace_beans == [TraceBean(topic="TopicA", msg_id=MSG_ID, offset_msg_id=OFFSET_ID,
                                         tags="TagA", keys="k1 k2", store_host="127.0.0.1:10911",
                                         body_length=11, msg_type=MessageType.Delay_Msg)]
    # Java keeps the text "null" as it reads it (TraceView prints it)
    assert got[2].region_id == "null" and got[2].trace_beans[0].keys == "null"
    assert got[2].trace_beans[0].retry_times == 2
    after = got[3]
    assert (after.request_id, after.cost_time, after.success, after.context_code, after.time_stamp,
            after.group_name) == ("0A0B0C0D00002A9F0000000000000001", 25, False, 4,
                                  1700000000250, "CG_A")
    assert [encode(c) for c in got] == [PUB_TEXT] + [r + B for r in SUB_BEFORE_TEXT.split(B)[:2]] \
        + [SUB_AFTER_TEXT]


def test_older_and_other_clients_layouts_decode():
    """decoderFromTraceDataString's tolerance: Pub without offsetMsgId (13
    fields) or with a clientHost (15, rocketmq-client-go); SubAfter of
    4.4-4.9.3 (8 fields: no groupName); unknown types skipped."""
    pub13, pub15, after8 = decode(
        f"Pub{A}5{A}R{A}G{A}T{A}M{A}t{A}k{A}h:1{A}7{A}2{A}1{A}true{B}"
        f"Pub{A}5{A}R{A}G{A}T{A}M{A}t{A}k{A}h:1{A}7{A}2{A}0{A}O{A}false{A}10.0.0.9{B}"
        f"Recall{A}5{A}R{A}G{A}T{A}M{A}true{B}"
        f"SubAfter{A}Q{A}M{A}4{A}true{A}k{A}0{A}99{B}")
    assert pub13.success and pub13.trace_beans[0].offset_msg_id == "" \
        and pub13.trace_beans[0].msg_type is MessageType.Trans_Msg_Half
    assert not pub15.success and pub15.trace_beans[0].client_host == "10.0.0.9"
    assert (after8.time_stamp, after8.group_name, after8.context_code) == (99, "", 0)
    with pytest.raises(TraceFormatError, match="Pub"):
        decode(f"Pub{A}not-a-time{A}R{A}G{A}T{A}M{A}t{A}k{A}h{A}7{A}2{A}0{A}O{A}true{B}")


# ---------------------------------------------------------------- live
@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("trace"), traceTopicEnable="true",
                     messageDelayLevel=" ".join(["1s"] * 18))
    yield b
    assert b.stop() == 0, b.log()[-3000:]


FAST = dict(pull_time_delay_millis_when_exception=100, persist_consumer_offset_interval=1.0)


def trace_of(broker, msg_id: str, want: int, deadline_s: float = 10.0) -> list[dict]:
    """The trace records of ``msg_id``, once there are ``want`` of them (the
    broker indexes a trace message a moment after storing it)."""
    deadline = time.monotonic() + deadline_s
    with AdminClient(broker.namesrv) as a:
        while True:
            got = query_msg_trace(a, msg_id)
            if len(got) >= want or time.monotonic() > deadline:
                return got
            time.sleep(0.05)


def test_a_traced_send_and_consume_read_back_by_msg_id(broker):
    topic, group = "TRACE_T1", "trace-cg-1"

    async def run():
        seen: list = []

        def listener(msgs, ctx):
            seen.extend(m.msg_id for m in msgs)
            # the second message fails once: a SubAfter with FAILED, then a retry
            if msgs[0].keys == "order-2" and msgs[0].reconsume_times == 0:
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        c = AsyncPushConsumer(group, namesrv_addr=broker.namesrv, enable_msg_trace=True, **FAST)
        c.subscribe(topic, "*")
        c.register_message_listener(listener)
        async with AsyncProducer("trace-pg-1", namesrv_addr=broker.namesrv, enable_msg_trace=True,
                                 default_topic_queue_nums=1) as p:
            r1 = await p.send(Message(topic, b"hello trace", tags="TagA", keys="order-1 buyer-7"))
            r2 = await p.send(Message(topic, b"x" * 20, keys="order-2"))
        await c.start()
        deadline = time.monotonic() + 15
        while seen.count(r2.msg_id) < 2 or r1.msg_id not in seen:
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.05)
        await c.shutdown()          # sends the trace records that wait
        return r1, r2

    r1, r2 = asyncio.run(run())
    got = trace_of(broker, r1.msg_id, 3)
    assert [v["traceType"] for v in got] == ["Pub", "SubBefore", "SubAfter"], got
    pub, before, after = got
    assert {k: pub[k] for k in ("groupName", "topic", "msgId", "tags", "keys", "storeHost",
                                "bodyLength", "msgType", "offsetMsgId", "success", "regionId")} == {
        "groupName": "trace-pg-1", "topic": topic, "msgId": r1.msg_id, "tags": "TagA",
        "keys": "order-1 buyer-7", "storeHost": broker.addr, "bodyLength": 11,
        "msgType": "Normal_Msg", "offsetMsgId": r1.offset_msg_id, "success": True,
        "regionId": "DefaultRegion"}
    assert 0 <= pub["costTime"] < 10_000
    assert (before["groupName"], before["msgId"], before["retryTimes"], before["keys"]) == \
        (group, r1.msg_id, 0, "order-1 buyer-7")
    assert (after["groupName"], after["requestId"], after["success"], after["contextCode"]) == \
        (group, before["requestId"], True, int(ConsumeReturnType.SUCCESS))
    assert after["timeStamp"] >= before["timeStamp"] >= pub["timeStamp"]
    got = trace_of(broker, r2.msg_id, 5)
    assert (got[0]["traceType"], got[0]["keys"], got[0]["tags"]) == ("Pub", "order-2", "null")
    subs = [(v["traceType"], v["retryTimes"], v["success"], v["contextCode"]) for v in got[1:]]
    assert subs == [("SubBefore", 0, True, 0), ("SubAfter", 0, False, int(ConsumeReturnType.FAILED)),
                    ("SubBefore", 1, True, 0), ("SubAfter", 0, True, int(ConsumeReturnType.SUCCESS))], got


def test_a_forked_child_traces_its_own_sends_and_not_its_parents(broker, tmp_path):
    """A traced producer forked with its parent's Pub record still queued:
    the child's send is traced by a dispatcher of the child's own, and the
    parent's record is sent once, by the parent (the child had sent it again
    with its own, and its shutdown awaited the parent's task)."""
    import os
    import signal
    from shmq.client import Producer
    topic, out = "TRACE_FORK", tmp_path / "child-msg-id"
    with Producer("trace-pg-fork", namesrv_addr=broker.namesrv, enable_msg_trace=True,
                  default_topic_queue_nums=1) as p:
        r1 = p.send(Message(topic, b"parent"))
        pid = os.fork()
        if pid == 0:                                   # the child: its exit code says
            code = 1
            try:
                signal.alarm(60)                       # never outlive a failed test
                out.write_text(p.send(Message(topic, b"child")).msg_id)
                p.shutdown()                           # sends the child's trace record
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    child = trace_of(broker, out.read_text(), 1)
    assert [(v["traceType"], v["bodyLength"]) for v in child] == [("Pub", 5)], child
    parent = trace_of(broker, r1.msg_id, 1)
    assert [(v["traceType"], v["bodyLength"]) for v in parent] == [("Pub", 6)], parent


def test_a_traced_transaction_records_its_half_and_its_end(broker):
    class Commit(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            return LocalTransactionState.COMMIT_MESSAGE

        def check_local_transaction(self, msg):
            return LocalTransactionState.COMMIT_MESSAGE

    async def run():
        p = AsyncTransactionProducer("trace-pg-tx", Commit(), namesrv_addr=broker.namesrv,
                                     enable_msg_trace=True)
        await p.start()
        try:
            return await p.send_message_in_transaction(Message("TRACE_T_TX", b"tx", keys="tx-1"))
        finally:
            await p.shutdown()

    r = asyncio.run(run())
    half, end = trace_of(broker, r.msg_id, 2)
    assert (half["traceType"], half["msgType"], half["success"]) == ("Pub", "Trans_Msg_Half", True)
    assert (end["traceType"], end["msgType"], end["groupName"], end["keys"], end["storeHost"]) == \
        ("EndTransaction", "Trans_msg_Commit", "trace-pg-tx", "tx-1", broker.addr)
    assert end["transactionState"] == "COMMIT_MESSAGE" and end["fromTransactionCheck"] is False


def test_trace_off_writes_nothing_and_adds_nothing_to_send(broker):
    async def run():
        async with AsyncProducer("trace-pg-off", namesrv_addr=broker.namesrv) as p:
            assert p.tracer is None and "send" not in vars(p)      # the plain send path
            c = AsyncPushConsumer("trace-cg-off", namesrv_addr=broker.namesrv)
            assert c.tracer is None and "_call_listener" not in vars(c)   # the plain listener call
            return await p.send(Message("TRACE_T_OFF", b"untraced", keys="off-1"))

    r = asyncio.run(run())
    with AdminClient(broker.namesrv) as a:
        assert query_msg_trace(a, r.msg_id) == []
        assert query_msg_trace(a, "off-1") == []


def test_a_full_trace_queue_drops_records_and_never_holds_a_send(broker):
    async def run():
        async with AsyncProducer("trace-pg-full", namesrv_addr=broker.namesrv,
                                 enable_msg_trace=True) as p:
            filler = TraceContext(TraceType.Pub, trace_beans=[TraceBean(msg_id="filler")])
            accepted = sum(p.tracer.append(filler) for _ in range(QUEUE_SIZE + 500))
            discarded = p.tracer.discarded
            r = await p.send(Message("TRACE_T_FULL", b"sent all the same"))
            return accepted, discarded, r

    accepted, discarded, r = asyncio.run(run())
    assert (accepted, discarded) == (QUEUE_SIZE, 500)
    assert r.status.name == "SEND_OK"


def test_the_blocking_producer_shows_its_tracer_as_the_asyncio_one(broker):
    """The README's ``tracer.discarded``, on the blocking facade too."""
    from shmq.client import Producer
    with Producer("trace-pg-blocking", namesrv_addr=broker.namesrv, enable_msg_trace=True) as p:
        assert p.send(Message("TRACE_T_BLOCKING", b"traced")).status.name == "SEND_OK"
        assert p.tracer.discarded == 0 and p.tracer.started
    assert Producer("trace-pg-blocking-off", namesrv_addr=broker.namesrv).tracer is None


def test_the_broker_creates_the_trace_topic_when_told(broker):
    """traceTopicEnable: TopicConfigManager's one read and one write queue, perm 6."""
    with AdminClient(broker.namesrv) as a:
        (qd,) = a.route(TRACE_TOPIC)["queueDatas"]
    assert (qd["readQueueNums"], qd["writeQueueNums"], qd["perm"]) == (1, 1, 6)
    with pytest.raises(ValueError, match="msgTraceTopicName='no spaces'"):
        BrokerConfig(traceTopicEnable=True, msgTraceTopicName="no spaces")
    with pytest.raises(ValueError, match="customized_trace_topic 'no spaces'"):
        AsyncProducer("g", enable_msg_trace=True, customized_trace_topic="no spaces")


def test_a_tight_loop_of_sends_loses_no_record(broker):
    """Sends appended directly to the store never yield the event loop the
    dispatcher shares (client/trace.py, keep_up): none of 2000 is dropped."""
    n = 2000

    async def run():
        async with AsyncProducer("trace-pg-loop", namesrv_addr=broker.namesrv,
                                 enable_msg_trace=True) as p:
            for i in range(n):
                r = await p.send(Message("TRACE_T_LOOP", b"loop", keys=f"loop-{i}"))
            return p.tracer, r

    tracer, last = asyncio.run(run())
    assert (tracer.discarded, tracer.dropped_segments, tracer.send_failures) == (0, 0, 0)
    # segments this big are compressed by the trace producer, as Java's are
    bodies = [zlib.decompress(m.body) if m.sysflag & 1 else m.body
              for m in stored_records(broker, TRACE_TOPIC, 1)]
    pubs = [c for b in bodies for c in decode(b.decode())
            if c.trace_type is TraceType.Pub and c.trace_beans[0].topic == "TRACE_T_LOOP"]
    assert sorted(int(c.trace_beans[0].keys[5:]) for c in pubs) == list(range(n))
    (pub,) = trace_of(broker, last.msg_id, 1)
    assert (pub["traceType"], pub["keys"]) == ("Pub", f"loop-{n - 1}")


def test_no_trace_topic_is_a_clear_error(broker):
    with AdminClient(broker.namesrv) as a, pytest.raises(AdminError, match="NO_SUCH_TRACE_TOPIC"):
        query_msg_trace(a, MSG_ID, "NO_SUCH_TRACE_TOPIC")
