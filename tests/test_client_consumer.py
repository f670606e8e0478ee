"""shmq's Python consumers: allocation, offsets, push (concurrently and
orderly), lite pull, against one real broker (delay levels all 1 s, SQL92 on)."""
from __future__ import annotations

import asyncio
import collections
import functools
import os
import random
import threading
import time

import orjson
import pytest
from brokerproc import routed_topic as make_topic
from brokerproc import start_broker, stored_records, topic_for
from shmq.client import (
    AsyncLitePullConsumer,
    AsyncProducer,
    AsyncPushConsumer,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyStatus,
    LitePullConsumer,
    Message,
    MessageListenerOrderly,
    MessageQueue,
    MQClientError,
    Producer,
    PushConsumer,
    averagely,
    averagely_by_circle,
    by_config,
    consistent_hash,
    select_by_hash,
)
from shmq.client.consumer import ProcessQueue, SubscriptionData
from shmq.client.offsets import (
    ReadOffsetType,
    compute_pull_from_where,
    dump_offset_table,
    parse_offset_table,
)
from shmq.client.remoting import RemotingClient
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand

OK = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
LATER = ConsumeConcurrentlyStatus.RECONSUME_LATER
FAST = dict(pull_time_delay_millis_when_exception=300, persist_consumer_offset_interval=1.0)


# ---------------------------------------------------------------- pure units
def _mqs(topic, brokers, n):
    return sorted(MessageQueue(topic, b, i) for b in brokers for i in range(n))


def _short(queues):
    return [f"{q.broker_name[-1]}{q.queue_id}" for q in queues]


# Java 4.9.7's strategies run on these inputs (client ids sorted, queues sorted)
JAVA_ALLOCATIONS = [
    # (topic, brokers, queues per broker, cids, strategy, {cid: queues})
    ("T", "ab", 4, ["c1", "c2", "c3"], averagely,
     {"c1": ["a0", "a1", "a2"], "c2": ["a3", "b0", "b1"], "c3": ["b2", "b3"]}),
    ("T", "ab", 4, ["c1", "c2", "c3"], averagely_by_circle,
     {"c1": ["a0", "a3", "b2"], "c2": ["a1", "b0", "b3"], "c3": ["a2", "b1"]}),
    ("T", "ab", 4, ["c1", "c2", "c3"], consistent_hash,
     {"c1": ["a0", "b0", "b3"], "c2": ["a1", "a2", "b2"], "c3": ["a3", "b1"]}),
    ("T", "ab", 4, ["c1", "c2", "c3"], functools.partial(consistent_hash, virtual_node_cnt=3),
     {"c1": ["a0", "b2"], "c2": ["a2"], "c3": ["a1", "a3", "b0", "b1", "b3"]}),
    ("T", "a", 8, ["c1", "c2", "c3"], averagely,
     {"c1": ["a0", "a1", "a2"], "c2": ["a3", "a4", "a5"], "c3": ["a6", "a7"]}),
    ("T", "a", 8, ["c1", "c2", "c3"], consistent_hash,
     {"c1": ["a0", "a4"], "c2": ["a1", "a2", "a5", "a6", "a7"], "c3": ["a3"]}),
    ("T", "a", 2, ["c1", "c2", "c3", "c4"], averagely, {"c1": ["a0"], "c2": ["a1"], "c3": [], "c4": []}),
    ("T", "a", 2, ["c1", "c2", "c3", "c4"], consistent_hash,
     {"c1": ["a0"], "c2": [], "c3": [], "c4": ["a1"]}),
    ("TopicTest", "ab", 4, ["192.168.0.1@123", "192.168.0.2@456"], consistent_hash,
     {"192.168.0.1@123": ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"], "192.168.0.2@456": []}),
]


@pytest.mark.parametrize("case", JAVA_ALLOCATIONS, ids=lambda c: f"{c[0]}-{len(c[3])}")
def test_allocation_strategies_give_javas_results(case):
    topic, brokers, n, cids, strategy, want = case
    mq_all = _mqs(topic, [f"broker-{b}" for b in brokers], n)
    got = {cid: _short(strategy("g", cid, mq_all, cids)) for cid in cids}
    assert got == want
    if strategy is not consistent_hash:            # every queue exactly once
        assert sorted(q for qs in got.values() for q in qs) == sorted(_short(mq_all))


def test_allocation_edge_cases():
    mq_all = _mqs("T", ["broker-a"], 4)
    assert averagely("g", "stranger", mq_all, ["c1", "c2"]) == []        # not a member yet
    with pytest.raises(ValueError):
        averagely("g", "c1", [], ["c1"])
    fixed = [MessageQueue("T", "broker-a", 3)]
    assert by_config(fixed)("g", "anyone", mq_all, ["c1"]) == fixed


def test_fastjson_offset_tables_parse():
    java = (b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:12,'
            b'{"brokerName":"broker-a","queueId":1,"topic":"T"}:0}}')
    want = {MessageQueue("T", "broker-a", 0): 12, MessageQueue("T", "broker-a", 1): 0}
    assert parse_offset_table(java) == want
    pretty = ('{\n\t"offsetTable":{{\n\t\t\t"brokerName":"b",\n\t\t\t"queueId":3,'
              '\n\t\t\t"topic":"x\\"y"\n\t\t}:5280\n\t}\n}')
    assert parse_offset_table(pretty) == {MessageQueue('x"y', "b", 3): 5280}
    for_c = b'{"offsetTable":[{"brokerName":"b","offset":7,"queueId":2,"topic":"T"}]}'
    assert parse_offset_table(for_c) == {MessageQueue("T", "b", 2): 7}
    assert parse_offset_table(dump_offset_table(want)) == want
    for bad in (b'{"offsetTable":{', b'{"other":1}', b'{"offsetTable":{"T":1}}', b"[1,2"):
        with pytest.raises(ValueError):
            parse_offset_table(bad)


class _FakeStore:
    def __init__(self, stored):
        self.stored = stored

    async def read_offset(self, mq, how):
        assert how is ReadOffsetType.READ_FROM_STORE
        return self.stored


class _FakeInstance:
    """Answers GET_MAX_OFFSET with 100, SEARCH_OFFSET_BY_TIMESTAMP with 42."""

    def broker_addr(self, name):
        return "addr"

    async def invoke(self, broker, cmd, timeout=None):
        return cmd.reply(R.SUCCESS, ext={"offset": {RC.GET_MAX_OFFSET: "100",
                                                    RC.SEARCH_OFFSET_BY_TIMESTAMP: "42"}[cmd.code]})


def test_compute_pull_from_where_without_a_stored_offset():
    mq, retry = MessageQueue("T", "b", 0), MessageQueue("%RETRY%g", "b", 0)

    def start(stored, where, q=mq):
        return asyncio.run(compute_pull_from_where(_FakeInstance(), _FakeStore(stored), q, where, 1))
    assert start(7, "CONSUME_FROM_LAST_OFFSET") == 7                  # a stored offset wins
    assert start(-1, "CONSUME_FROM_LAST_OFFSET") == 100               # QUERY_NOT_FOUND: the end
    assert start(-1, "CONSUME_FROM_FIRST_OFFSET") == 0
    assert start(-1, "CONSUME_FROM_TIMESTAMP") == 42
    assert start(-1, "CONSUME_FROM_LAST_OFFSET", retry) == 0          # retry queues from 0
    assert start(-1, "CONSUME_FROM_TIMESTAMP", retry) == 100
    assert start(-2, "CONSUME_FROM_FIRST_OFFSET") == -1               # broker unreachable: later


def test_subscription_data_and_heartbeat():
    sub = SubscriptionData.build("T", " TagA || TagB ||| x || TagA")
    assert sub.tags_set == ["TagA", "TagB", "| x"]
    assert sub.code_set[:2] == [2598919, 2598920]                    # Java "TagA".hashCode()
    assert SubscriptionData.build("T", "*").tags_set == []
    sql = SubscriptionData.build("T", "a > 1", "SQL92")
    assert (sql.expression_type, sql.tags_set) == ("SQL92", [])
    with pytest.raises(ValueError):
        SubscriptionData.build("T", "", "SQL92")
    c = AsyncPushConsumer("hb-group", namesrv_addr="127.0.0.1:1", message_model="BROADCASTING")
    c.subscribe("T", "TagA || TagB")
    data = orjson.loads(orjson.dumps(c.consumer_data()))
    assert data["consumeType"] == "CONSUME_PASSIVELY" and data["messageModel"] == "BROADCASTING"
    [sd] = data["subscriptionDataSet"]
    assert {k: sd[k] for k in ("topic", "subString", "tagsSet", "codeSet", "expressionType")} == {
        "topic": "T", "subString": "TagA || TagB", "tagsSet": ["TagA", "TagB"],
        "codeSet": [2598919, 2598920], "expressionType": "TAG"}
    info = orjson.loads(orjson.dumps(c.running_info()))         # GET_CONSUMER_RUNNING_INFO
    assert info["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
    assert info["properties"]["allocate_strategy"] == "AVG"
    with pytest.raises(TypeError):
        AsyncPushConsumer("g", no_such_setting=1)
    with pytest.raises(ValueError):
        AsyncPushConsumer("g", message_model="EVERYONE")


def test_process_queue_commits_the_smallest_unconsumed_offset():
    class M:
        def __init__(self, off):
            self.queue_offset, self.body = off, b"x"
            self.body_size = len(self.body)
    pq = ProcessQueue()
    msgs = [M(o) for o in range(10, 15)]
    assert pq.put_messages(msgs) is True and pq.put_messages([M(15)]) is False
    assert pq.max_span() == 5 and pq.msg_count == 6
    assert pq.remove_messages([msgs[1], msgs[2]]) == 10        # 10 is not done yet
    assert pq.remove_messages([msgs[0]]) == 13
    assert pq.remove_messages([msgs[3], msgs[4]]) == 15
    taken = pq.take_messages(1)
    pq.make_message_to_consume_again(taken)
    assert [m.queue_offset for m in pq.take_messages(1)] == [15] and pq.commit() == 16
    assert pq.take_messages(1) == [] and pq.consuming is False


# ---------------------------------------------------------------- against a broker
@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("consumer"), enablePropertyFilter="true",
                     messageDelayLevel=" ".join(["1s"] * 18))
    yield b
    assert b.stop() == 0, b.log()[-3000:]


def topic_of(request) -> str:
    return topic_for(request, "CC_")


def stored(broker, topic, queues=1):
    return stored_records(broker, topic, queues)


async def until(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def wait_for(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


async def send_all(broker, topic, bodies, **kw):
    async with AsyncProducer("pg-" + topic[-40:], namesrv_addr=broker.namesrv) as p:
        return [await p.send(Message(topic, b, **kw)) for b in bodies]


def recorder(into: list, status=OK):
    async def listener(msgs, context):
        into.extend(msgs)
        return status
    return listener


def test_clustering_splits_queues_and_takes_over_when_one_leaves(broker, request):
    topic = make_topic(broker, topic_of(request))
    group = "cg-split"

    async def main():
        got1, got2 = [], []
        c1 = AsyncPushConsumer(group, namesrv_addr=broker.namesrv, instance_name="c1", **FAST)
        c2 = AsyncPushConsumer(group, namesrv_addr=broker.namesrv, instance_name="c2", **FAST)
        for c, got in ((c1, got1), (c2, got2)):
            c.subscribe(topic)
            c.register_message_listener(recorder(got))
            await c.start()

        def mine(c):
            return {mq for mq in c.assigned_queues() if mq.topic == topic}
        await until(lambda: len(mine(c1)) == len(mine(c2)) == 2 and not mine(c1) & mine(c2),
                    what="two consumers holding two queues each")
        await send_all(broker, topic, [b"a%d" % i for i in range(40)])
        await until(lambda: len(got1) + len(got2) >= 40, what="the first 40")
        assert got1 and got2 and {m.queue_id for m in got1}.isdisjoint({m.queue_id for m in got2})
        await c2.shutdown()
        await until(lambda: len(mine(c1)) == 4, what="c1 taking every queue")
        await send_all(broker, topic, [b"b%d" % i for i in range(40)])
        await until(lambda: len(got1) + len(got2) >= 80, what="all 80")
        await asyncio.sleep(0.3)
        await c1.shutdown()
        counts = collections.Counter(m.body for m in got1 + got2)
        assert set(counts.values()) == {1} and len(counts) == 80          # exactly once
    asyncio.run(main())


def test_broadcasting_delivers_to_every_consumer(broker, request, tmp_path):
    topic = make_topic(broker, topic_of(request), 2)
    group = "cg-broadcast"
    got = {"b1": [], "b2": []}
    consumers = []
    for name in got:
        c = PushConsumer(group, namesrv_addr=broker.namesrv, instance_name=name,
                         message_model="BROADCASTING", local_offset_store_dir=str(tmp_path),
                         consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
        c.subscribe(topic)
        c.register_message_listener(lambda msgs, ctx, into=got[name]: (into.extend(msgs), OK)[1])
        consumers.append(c.start())
    with Producer("pg-broadcast", namesrv_addr=broker.namesrv) as p:
        for i in range(20):
            p.send(Message(topic, b"m%d" % i))
    wait_for(lambda: all(len(v) == 20 for v in got.values()), what="20 messages each")
    for c in consumers:
        c.shutdown()
    for name, msgs in got.items():
        assert sorted(m.body for m in msgs) == sorted(b"m%d" % i for i in range(20))
        [client_dir] = [d for d in os.listdir(tmp_path) if d.endswith("@" + name)]
        with open(tmp_path / client_dir / group / "offsets.json") as f:
            offsets = parse_offset_table(f.read())
        assert sum(offsets.values()) == 20                       # every queue consumed to its end


def test_orderly_consumption_keeps_each_orders_sequence(broker, request):
    topic = make_topic(broker, topic_of(request))
    seen: list[tuple[int, int, int]] = []
    suspended = collections.Counter()

    class Listener(MessageListenerOrderly):
        def consume_message(self, msgs, context):          # a plain method: a consume thread
            [m] = msgs
            order, step = map(int, m.body.split(b":"))
            if (order, step) == (1, 3) and suspended[(order, step)] < 2:
                suspended[(order, step)] += 1
                context.suspend_current_queue_time_millis = 50
                seen.append((order, step, m.reconsume_times))
                return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            time.sleep(random.random() / 500)
            seen.append((order, step, m.reconsume_times))
            return ConsumeOrderlyStatus.SUCCESS

    async def main():
        c = AsyncPushConsumer("cg-orderly", namesrv_addr=broker.namesrv, **FAST)
        c.subscribe(topic)
        c.register_message_listener(Listener())
        await c.start()
        async with AsyncProducer("pg-orderly", namesrv_addr=broker.namesrv) as p:
            for step in range(10):
                for order in range(4):
                    await p.send(Message(topic, b"%d:%d" % (order, step)), selector=select_by_hash,
                                 arg=order)
        await until(lambda: len(seen) >= 42, what="40 steps and 2 retries")
        await c.shutdown()
    asyncio.run(main())
    for order in range(4):
        steps = [(s, t) for o, s, t in seen if o == order]
        if order == 1:
            assert steps[3:6] == [(3, 0), (3, 1), (3, 2)]        # retried here, in place
            steps = [s for s in steps if s[0] != 3 or s[1] == 2]
        assert [s for s, _ in steps] == list(range(10))


def test_orderly_gives_up_to_the_dlq_after_max_reconsume_times(broker, request):
    topic = make_topic(broker, topic_of(request), 1)
    group = "cg-orderly-dlq"
    seen = []

    async def listener(msgs, context):
        seen.append((msgs[0].body, msgs[0].reconsume_times))
        context.suspend_current_queue_time_millis = 10
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT if msgs[0].body == b"poison" \
            else ConsumeOrderlyStatus.SUCCESS

    async def main():
        c = AsyncPushConsumer(group, namesrv_addr=broker.namesrv, max_reconsume_times=2, **FAST)
        c.subscribe(topic)
        c.register_message_listener(MessageListenerOrderly(listener))
        await c.start()
        await send_all(broker, topic, [b"poison", b"next"])
        await until(lambda: (b"next", 0) in seen, what="the message after the poison")
        await c.shutdown()
    asyncio.run(main())
    assert seen == [(b"poison", 0), (b"poison", 1), (b"poison", 2), (b"next", 0)]
    [dead] = stored(broker, "%DLQ%" + group)
    assert dead.body == b"poison" and dead.properties["RETRY_TOPIC"] == topic


def test_reconsume_later_retries_with_back_off_then_dead_letters(broker, request):
    topic = make_topic(broker, topic_of(request), 2)
    group = "cg-retry"
    seen = []

    async def listener(msgs, context):
        for m in msgs:
            seen.append((m.body, m.reconsume_times, m.topic))
        return LATER if msgs[0].body == b"bad" else OK

    async def main():
        c = AsyncPushConsumer(group, namesrv_addr=broker.namesrv, max_reconsume_times=2, **FAST)
        c.subscribe(topic)
        c.register_message_listener(listener)
        await c.start()
        await send_all(broker, topic, [b"good", b"bad"])
        await until(lambda: len(stored(broker, "%DLQ%" + group)) == 1, timeout=15,
                    what="the dead letter")
        await c.shutdown()
    asyncio.run(main())
    assert [(t, topic_) for b, t, topic_ in seen if b == b"bad"] == [(0, topic), (1, topic), (2, topic)]
    assert [b for b, _, _ in seen].count(b"good") == 1
    [dead] = stored(broker, "%DLQ%" + group)
    assert dead.body == b"bad" and dead.reconsume_times == 3     # the DLQ hop counts too


def test_a_refused_send_back_is_re_sent_to_the_retry_topic(broker, request, monkeypatch):
    """When CONSUMER_SEND_MSG_BACK fails the client sends the message to
    %RETRY%<group> itself; the broker dead-letters it at max_reconsume_times."""
    import shmq.client.retry as retry_module      # where the consume services send back from
    real = retry_module.send_back
    monkeypatch.setattr(retry_module, "send_back",
                        lambda group, phy, *a, **kw: real(group, 1 << 40, *a, **kw))  # no such record
    topic = make_topic(broker, topic_of(request), 1)
    group = "cg-fallback"
    seen = []

    async def main():
        c = AsyncPushConsumer(group, namesrv_addr=broker.namesrv, max_reconsume_times=2, **FAST)
        c.subscribe(topic)
        c.register_message_listener(recorder(seen, LATER))
        await c.start()
        await send_all(broker, topic, [b"refused"])
        await until(lambda: len(stored(broker, "%DLQ%" + group)) == 1, timeout=15,
                    what="the dead letter")
        await c.shutdown()
    asyncio.run(main())
    assert [(m.body, m.reconsume_times, m.topic) for m in seen] == [(b"refused", 0, topic),
                                                                    (b"refused", 1, topic)]
    [dead] = stored(broker, "%DLQ%" + group)
    assert dead.properties["RETRY_TOPIC"] == topic and dead.properties["ORIGIN_MESSAGE_ID"]


def test_a_restarted_consumer_resumes_at_its_committed_offset(broker, request):
    topic = make_topic(broker, topic_of(request))
    group = "cg-resume"
    got = []
    lock = threading.Lock()

    def listener(msgs, context):                              # runs in a consume thread
        with lock:
            got.extend(m.body for m in msgs)
        return OK

    def consumer():
        c = PushConsumer(group, namesrv_addr=broker.namesrv, **FAST)
        c.subscribe(topic)
        c.register_message_listener(listener)
        return c.start()

    with Producer("pg-resume", namesrv_addr=broker.namesrv) as p:
        c = consumer()
        for i in range(30):
            p.send(Message(topic, b"r%d" % i))
        wait_for(lambda: len(got) >= 30, what="the first 30")
        c.shutdown()
        for i in range(30, 60):
            p.send(Message(topic, b"r%d" % i))
    c = consumer()
    wait_for(lambda: len(got) >= 60, what="the next 30")
    time.sleep(0.3)
    c.shutdown()
    assert sorted(got) == sorted(b"r%d" % i for i in range(60))     # nothing twice, nothing lost


def test_shutdown_commits_the_offsets_and_keys_read_as_sent(broker, request):
    """No periodic persist (an hour apart): shutdown() alone commits the
    offsets, so the group's next consumer gets only what is new. A received
    message's ``keys`` is the KEYS string as set (getKeys()), ``key_list`` the list."""
    topic = make_topic(broker, topic_of(request), 2)
    slow = dict(FAST, persist_consumer_offset_interval=3600.0)

    async def consume(n):
        got = []
        c = AsyncPushConsumer("cg-shutdown", namesrv_addr=broker.namesrv, **slow)
        c.subscribe(topic)
        c.register_message_listener(recorder(got))
        async with c:                                         # start() … shutdown()
            await until(lambda: len(got) >= n, what=f"{n} messages")
            await asyncio.sleep(0.3)                          # nothing more arrives
        return got

    async def main():
        await send_all(broker, topic, [b"old%d" % i for i in range(6)], keys="k1 k2")
        got = await consume(6)
        assert sorted(m.body for m in got) == [b"old%d" % i for i in range(6)]
        assert {(m.keys, tuple(m.key_list)) for m in got} == {("k1 k2", ("k1", "k2"))}
        await send_all(broker, topic, [b"new"], keys=["k3", "k4"])
        got = await consume(1)
        assert [(m.body, m.keys, m.key_list) for m in got] == [(b"new", "k3 k4", ["k3", "k4"])]
    asyncio.run(main())


def test_message_keys_as_a_string_or_a_list():
    assert Message("T", b"", keys="a b").key_list == Message("T", b"", keys=["a", "b"]).key_list == ["a", "b"]
    assert Message("T", b"").key_list == []
    assert Message("T", b"", keys=["a", "b"]).properties_string() == "KEYS\x01a b"


def test_consume_from_where_for_a_new_group(broker, request):
    """A queue that still holds its first message answers a new group's
    offset query with 0 (ConsumerManageProcessor), so LAST reads it from
    the start too; without an offset the client applies the setting
    (test_compute_pull_from_where_without_a_stored_offset)."""
    topic = make_topic(broker, topic_of(request), 2)

    async def consume(group, where):
        got = []
        c = AsyncPushConsumer(group, namesrv_addr=broker.namesrv, consume_from_where=where, **FAST)
        c.subscribe(topic)
        c.register_message_listener(recorder(got))
        await c.start()
        await until(lambda: len(got) >= 5, what=f"5 messages for {where}")
        await c.shutdown()
        return sorted(m.body for m in got)

    async def main():
        await send_all(broker, topic, [b"old%d" % i for i in range(5)])
        assert await consume("cg-first", "CONSUME_FROM_FIRST_OFFSET") == [b"old%d" % i for i in range(5)]
        assert await consume("cg-last", "CONSUME_FROM_LAST_OFFSET") == [b"old%d" % i for i in range(5)]
    asyncio.run(main())


def test_tag_and_sql92_filters(broker, request):
    topic = make_topic(broker, topic_of(request), 2)

    async def main():
        tags, sql = [], []
        ct = AsyncPushConsumer("cg-tags", namesrv_addr=broker.namesrv, **FAST)
        ct.subscribe(topic, "TagA || TagB")
        ct.register_message_listener(recorder(tags))
        cs = AsyncPushConsumer("cg-sql", namesrv_addr=broker.namesrv, **FAST)
        cs.subscribe(topic, "a >= 5 AND color = 'red'", "SQL92")
        cs.register_message_listener(recorder(sql))
        await ct.start()
        await cs.start()
        async with AsyncProducer("pg-filter", namesrv_addr=broker.namesrv) as p:
            for i in range(10):
                await p.send(Message(topic, b"t%d" % i, tags=["TagA", "TagB", "TagC", None, "TagAB"][i % 5],
                                     properties={"a": str(i), "color": "red" if i % 2 else "blue"}))
        await until(lambda: len(tags) >= 4 and len(sql) >= 3, what="the filtered messages")
        await asyncio.sleep(0.3)
        await ct.shutdown()
        await cs.shutdown()
        assert sorted(m.body for m in tags) == [b"t0", b"t1", b"t5", b"t6"]
        assert sorted(m.body for m in sql) == [b"t5", b"t7", b"t9"]
        bad = AsyncPushConsumer("cg-bad-sql", namesrv_addr=broker.namesrv)
        bad.subscribe(topic, "a >", "SQL92")
        bad.register_message_listener(recorder([]))
        with pytest.raises(MQClientError, match="Check client in broker error"):
            await bad.start()
    asyncio.run(main())


def test_flow_control_bounds_the_process_queue(broker, request):
    topic = make_topic(broker, topic_of(request), 1)
    most, done = [0], []

    async def main():
        c = AsyncPushConsumer("cg-flow", namesrv_addr=broker.namesrv, consume_thread_max=1,
                              pull_batch_size=8, pull_threshold_for_queue=16, **FAST)

        def slow(msgs, context):
            most[0] = max([most[0], *(pq.msg_count for pq in c.process_queues.values())])
            time.sleep(0.01)
            done.extend(msgs)
            return OK
        c.subscribe(topic)
        c.register_message_listener(slow)
        await send_all(broker, topic, [b"f%d" % i for i in range(100)])
        await c.start()
        await until(lambda: len(done) >= 100, what="100 slow messages")
        await c.shutdown()
    asyncio.run(main())
    assert 16 <= most[0] <= 16 + 8          # pulled only while at most the threshold was cached


@pytest.mark.parametrize("kind", ["awaiting", "plain"])
def test_consume_requests_run_at_most_consume_thread_max_at_once(broker, request, kind):
    """Batches of one: a listener that waits (a coroutine awaiting, or a
    plain function in the consume thread pool) has exactly
    ``consume_thread_max`` of them running at once while more wait, each
    message once; and a shutdown does not wait on the idle workers (its
    ``await_termination_millis_when_shutdown`` is a minute here)."""
    topic = make_topic(broker, topic_of(request), 1)
    running, most, done = [0], [0], []
    lock = threading.Lock()

    def enter():
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])

    def leave(msgs):
        with lock:
            running[0] -= 1
            done.extend(m.body for m in msgs)

    async def awaiting(msgs, context):
        enter()
        await asyncio.sleep(0.05)
        leave(msgs)
        return OK

    def plain(msgs, context):
        enter()
        time.sleep(0.05)
        leave(msgs)
        return OK

    async def main():
        await send_all(broker, topic, [b"t%d" % i for i in range(24)])
        c = AsyncPushConsumer(f"cg-slots-{kind}", namesrv_addr=broker.namesrv,
                              consume_thread_max=3, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                              await_termination_millis_when_shutdown=60_000, **FAST)
        c.subscribe(topic)
        c.register_message_listener(awaiting if kind == "awaiting" else plain)
        await c.start()
        await until(lambda: len(done) >= 24, what="24 messages")
        await asyncio.wait_for(c.shutdown(), 20)
    asyncio.run(main())
    assert most[0] == 3
    assert sorted(done) == sorted(b"t%d" % i for i in range(24))


def test_a_bug_in_one_consume_request_leaves_the_others_consumed(broker, request):
    """A request that raises past the listener (here once, in its result's
    processing) is a bug: logged, kept for ``shutdown()`` to raise, and the consume
    pool's worker goes on with the requests behind it (ending with it, it
    left them waiting for a worker none would bring while no new pull
    came)."""
    from shmq.client import BackgroundFailure
    topic = make_topic(broker, topic_of(request), 1)
    got = []

    async def main():
        c = AsyncPushConsumer("cg-bug", namesrv_addr=broker.namesrv, consume_thread_max=1,
                              consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
        c.subscribe(topic)
        c.register_message_listener(recorder(got))
        await c.start()
        service = c.service
        process_result = service._process_result

        async def broken_once(*args):
            service._process_result = process_result
            raise RuntimeError("a bug after the listener")
        service._process_result = broken_once
        async with AsyncProducer("pg-bug", namesrv_addr=broker.namesrv) as p:   # one pull's worth
            await p.send_batch([Message(topic, b"g%d" % i) for i in range(10)])
        await until(lambda: len(got) >= 10, what="the ten messages")
        with pytest.raises(BackgroundFailure, match="a consume request of cg-bug"):
            await c.shutdown()
    asyncio.run(main())
    assert sorted(m.body for m in got) == sorted(b"g%d" % i for i in range(10))


def test_reset_offsets_by_time_reaches_a_live_consumer(broker, request):
    topic = make_topic(broker, topic_of(request), 2)
    group = "cg-reset"

    async def main():
        got = []
        c = AsyncPushConsumer(group, namesrv_addr=broker.namesrv, **FAST)
        c.subscribe(topic)
        c.register_message_listener(recorder(got))
        await c.start()
        before = int(time.time() * 1000) - 1000
        await send_all(broker, topic, [b"x%d" % i for i in range(10)])
        await until(lambda: len(got) >= 10, what="the first pass")
        with RemotingClient(broker.addr) as admin:
            r = admin.invoke(RemotingCommand(RC.INVOKE_BROKER_TO_RESET_OFFSET, ext={
                "topic": topic, "group": group, "timestamp": str(before), "isForce": "true"}))
            assert r.code == R.SUCCESS, r.remark
        await until(lambda: len(got) >= 20, what="the second pass after the reset")
        await asyncio.sleep(0.3)
        await c.shutdown()
        assert collections.Counter(m.body for m in got) == {b"x%d" % i: 2 for i in range(10)}
    asyncio.run(main())


def test_lite_pull_assign_poll_commit_seek(broker, request):
    topic = make_topic(broker, topic_of(request), 2)
    with Producer("pg-lite", namesrv_addr=broker.namesrv) as p:
        queues = [MessageQueue(topic, "broker-a", q) for q in range(2)]
        for i in range(20):               # a selector: send(queue=) alone finds no route
            p.send(Message(topic, b"l%d" % i), selector=lambda qs, m, arg: qs[arg], arg=i % 2)
    c = LitePullConsumer("cg-lite", namesrv_addr=broker.namesrv, auto_commit=False,
                         consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
    assert c.start().fetch_message_queues(topic) == queues
    c.assign(queues)

    def poll_n(n, timeout=10.0):
        out, deadline = [], time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            out += c.poll(0.5)
        return out
    try:
        msgs = poll_n(20)
        assert sorted(m.body for m in msgs) == sorted(b"l%d" % i for i in range(20))
        c.commit_sync()
        assert [c.committed(q) for q in queues] == [10, 10]
        by_offset = {m.queue_offset: m for m in msgs if m.queue_id == 0}
        c.seek(queues[0], 3)
        again = poll_n(7)
        assert [(m.queue_id, m.queue_offset) for m in again] == [(0, o) for o in range(3, 10)]
        c.seek_to_end(queues[1])
        c.seek_to_begin(queues[0])
        assert sorted(m.queue_offset for m in poll_n(10)) == list(range(10))
        assert c.poll(0.3) == []
        ts = by_offset[6].store_timestamp
        assert by_offset[c.offset_for_timestamp(queues[0], ts)].store_timestamp == ts
        with pytest.raises(MQClientError, match="Seek offset illegal"):
            c.seek(queues[0], 99)
    finally:
        c.shutdown()


def test_consumers_running_in_a_forked_child_are_the_parents_and_the_child_starts_its_own(
        broker, request):
    """Fork while a push and a lite pull consumer run: in the child both are
    stopped copies (their shutdown returns at once, touching none of the
    parent's tasks, threads or sockets; poll says it is not running), and
    the lite pull one started there is the child's own, reading the queue
    from its start; the parent's both go on consuming."""
    import signal
    topic = make_topic(broker, topic_of(request), 1)
    queue = MessageQueue(topic, "broker-a", 0)
    pushed = []
    lock = threading.Lock()

    def listener(msgs, context):                              # runs in a consume thread
        with lock:
            pushed.extend(m.body for m in msgs)
        return OK

    c = PushConsumer("cg-fork-push", namesrv_addr=broker.namesrv, **FAST)
    c.subscribe(topic)
    c.register_message_listener(listener)
    lite = LitePullConsumer("cg-fork-lite", namesrv_addr=broker.namesrv, auto_commit=False,
                            consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
    lite.assign([queue])
    with Producer("pg-fork-consumers", namesrv_addr=broker.namesrv) as p:
        c.start()
        lite.start()
        try:
            p.send(Message(topic, b"before"))
            wait_for(lambda: pushed == [b"before"], what="the parent's push consumer")
            pid = os.fork()
            if pid == 0:                                   # the child: its exit code says
                code = 1
                try:
                    signal.alarm(60)                       # never outlive a failed test
                    c.shutdown()
                    lite.shutdown()
                    try:
                        lite.poll(0.1)
                        code = 2
                    except MQClientError as e:
                        code = 3 if "not running" not in str(e) else 1
                    if code == 1:
                        lite.start()                       # the child's own, from the start
                        got, deadline = [], time.monotonic() + 20
                        while not got and time.monotonic() < deadline:
                            got = lite.poll(0.5)
                        lite.shutdown()
                        code = 0 if [m.body for m in got] == [b"before"] else 4
                finally:
                    os._exit(code)
            status = []
            try:
                wait_for(lambda: status.append(os.waitpid(pid, os.WNOHANG)) or status[-1][0] == pid,
                         30, "the child")
            finally:
                if status[-1][0] != pid:                   # it hangs: the test failed
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status[-1][1]) == 0
            p.send(Message(topic, b"after"))
            wait_for(lambda: pushed == [b"before", b"after"], what="the parent's push consumer")
            polled, deadline = [], time.monotonic() + 20
            while len(polled) < 2 and time.monotonic() < deadline:
                polled += lite.poll(0.5)
            assert [m.body for m in polled] == [b"before", b"after"]
        finally:
            c.shutdown()
            lite.shutdown()


def test_lite_pull_subscribe_shares_queues_and_commits(broker, request):
    topic = make_topic(broker, topic_of(request), 2)

    async def main():
        await send_all(broker, topic, [b"s%d" % i for i in range(12)])
        c = AsyncLitePullConsumer("cg-lite-sub", namesrv_addr=broker.namesrv,
                                  consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
        c.subscribe(topic, "*")
        await c.start()
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 12 and time.monotonic() < deadline:
            got += await c.poll(0.5)
        assert sorted(m.body for m in got) == sorted(b"s%d" % i for i in range(12))
        assert {mq.queue_id for mq in c.assignment()} == {0, 1}
        await c.shutdown()                                     # auto commit, then persist
        again = AsyncLitePullConsumer("cg-lite-sub", namesrv_addr=broker.namesrv, **FAST)
        again.subscribe(topic)
        await again.start()
        assert sum([await again.committed(mq) for mq in again.assignment()]) == 12
        assert await again.poll(0.3) == []
        await again.shutdown()
    asyncio.run(main())


def test_the_consumer_survives_a_broker_restart(broker, request):
    topic = make_topic(broker, topic_of(request), 2)

    async def main():
        got = []
        c = AsyncPushConsumer("cg-restart", namesrv_addr=broker.namesrv, **FAST)
        c.subscribe(topic)
        c.register_message_listener(recorder(got))
        await c.start()
        await send_all(broker, topic, [b"before%d" % i for i in range(10)])
        await until(lambda: len(got) >= 10, what="messages before the restart")
        await asyncio.sleep(1.2)                               # offsets persisted
        await asyncio.to_thread(broker.stop)
        await asyncio.sleep(0.5)
        # in this thread, not a worker's: a test broker dies with the thread
        # that started it (brokerproc.spawn's PDEATHSIG), and the module's
        # later tests use it (the loop stands still while it starts)
        broker.start()
        # the embedded NameServer restarted empty: wait until the broker re-registered
        await asyncio.to_thread(make_topic, broker, topic, 2)
        await send_all(broker, topic, [b"after%d" % i for i in range(10)])
        await until(lambda: len(got) >= 20, timeout=20, what="messages after the restart")
        await asyncio.sleep(0.3)
        await c.shutdown()
        assert sorted(m.body for m in got) == sorted([b"before%d" % i for i in range(10)] +
                                                      [b"after%d" % i for i in range(10)])
    asyncio.run(main())


# ---------------------------------------------------------------- the decode path
def _fields(m) -> dict:
    """Every field a listener can read, from a MessageExt or a StoredMessage."""
    ext = not hasattr(m, "properties_raw")
    props = {k: v for k, v in m.properties.items() if k not in ("MIN_OFFSET", "MAX_OFFSET")}
    return {"topic": m.topic, "body": m.body, "properties": props, "tags": m.tags,
            "keys": m.keys if ext else (m.properties.get("KEYS") or None),
            "queue_id": m.queue_id, "queue_offset": m.queue_offset, "flag": m.flag,
            "sysflag": m.sysflag, "phy": m.commit_log_offset if ext else m.phy_offset,
            "born": (m.born_timestamp, m.born_host), "stored": (m.store_timestamp, m.store_host),
            "reconsume": m.reconsume_times,
            "offset_msg_id": m.offset_msg_id if ext else m.offset_msg_id(),
            "prepared": m.prepared_transaction_offset if ext else m.prepared_offset}


def test_decode_messages_reads_every_field_as_the_naive_twin_writes_it():
    """MessageExt views of records built field by field (tests/naive.py): IPv4
    and IPv6 hosts, a compressed body, properties with duplicates and pieces
    Java's parser drops, unicode; the same fields core.records.decode reads."""
    import zlib

    from naive import encode_record
    from shmq.client.message import CorruptMessage, decode_messages
    from shmq.core.records import decode
    props = ["TAGS\x01a\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01ABC\x02u\x01é日",
             "UNIQ_KEY\x01first\x02x\x01\x02UNIQ_KEY\x01last\x02\x01y\x02TAGS\x01",
             "", "KEYS\x01only"]
    records = [encode_record("Tópic", body, p.encode(), queue_id=i, flag=i * 7, sysflag=sysflag,
                             born_timestamp=1700000000000 + i, born_host=born, store_timestamp=1700000000500,
                             store_host=store, reconsume_times=i, prepared_offset=i * 11,
                             queue_offset=100 + i, phy_offset=4096 * i)
               for i, (body, p, sysflag, born, store) in enumerate([
                   (b"plain", props[0], 0, ("10.1.2.3", 51000), ("127.0.0.1", 10911)),
                   (zlib.compress(b"z" * 5000), props[1], 0x1 | 0x10, ("::1", 7), ("127.0.0.1", 10911)),
                   (b"\x00\xff", props[2], 0x20, ("10.0.0.9", 1), ("fe80::2", 10911)),
                   (b"k", props[3], 0x30, ("::ffff:1.2.3.4", 2), ("2001:db8::1", 3))])]
    body = b"".join(records)
    got = decode_messages(body, "broker-x", ("5", "105"))
    pos = 0
    for m, rec_bytes in zip(got, records):
        want = decode(body, pos, check_crc=True)
        pos += len(rec_bytes)
        expected = _fields(want)
        if want.sysflag & 1:
            expected["body"] = zlib.decompress(want.body)
        assert _fields(m) == expected
        assert m.msg_id == (want.properties.get("UNIQ_KEY") or want.offset_msg_id())
        assert (m.properties["MIN_OFFSET"], m.properties["MAX_OFFSET"], m.broker_name) == ("5", "105", "broker-x")
    assert [m.msg_id for m in got][:2] == ["ABC", "last"] and got[1].tags is None
    import gc
    import sys
    many = records[0] * 1000        # what a pull of 1,000 keeps: each view and its position (an
    gc.collect()                    # int); the decoder this replaced kept 17 objects a message
    before = sys.getallocatedblocks()
    views = decode_messages(many, "b", ("5", "105"))
    assert len(views) == 1000 and (sys.getallocatedblocks() - before) / len(views) < 2.2
    for cut in (body[:-1], body[:50], body[:4] + b"\x00" * 4 + body[8:]):          # short, short, magic
        with pytest.raises(CorruptMessage):
            decode_messages(cut, "b")
    flipped = bytearray(body)
    flipped[records[0].index(b"plain")] ^= 1
    with pytest.raises(CorruptMessage, match="CRC"):
        decode_messages(bytes(flipped), "b")
    # TOPICLENGTH of the last record past the buffer's end (it read past it: struct.error)
    last = got[-1]
    garbled = bytearray(body)
    garbled[last._pos + last._tr] = 255
    with pytest.raises(CorruptMessage, match="do not add up"):
        decode_messages(bytes(garbled), "b")
    skipped = []
    assert [m.queue_offset for m in decode_messages(bytes(garbled), "b", skipped=skipped)] == [100, 101, 102]
    assert [(q, framed) for q, _, framed in skipped] == [(103, True)]


def test_the_push_consumer_delivers_messages_as_stored(broker, request):
    """What a listener receives (body, topic, tags, keys, properties, ids,
    offsets, hosts, timestamps) is what the broker stored, for single,
    batched, compressed and flagged messages; reading one field never needs
    another."""
    topic = make_topic(broker, topic_of(request), 2)
    big = bytes(range(256)) * 40                                # compressed on the way in

    async def main():
        async with AsyncProducer("pg-same", namesrv_addr=broker.namesrv) as p:
            await p.send(Message(topic, b"one", tags="A", keys=["k1", "k2"],
                                 properties={"color": "réd", "n": "1"}, flag=3))
            await p.send(Message(topic, big, tags="B"))
            await p.send_batch([Message(topic, b"b%d" % i, keys="bk", properties={"i": str(i)})
                                for i in range(5)])
        got = []
        c = AsyncPushConsumer("cg-same", namesrv_addr=broker.namesrv, **FAST,
                              consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        c.subscribe(topic)
        c.register_message_listener(recorder(got))
        async with c:
            await until(lambda: len(got) >= 7, what="7 messages")
        return got
    got = asyncio.run(main())
    held = {(m.queue_id, m.queue_offset): m for m in stored(broker, topic, 2)}
    assert len(got) == len(held) == 7
    for m in got:
        want = held[(m.queue_id, m.queue_offset)]
        expected = _fields(want)
        if want.sysflag & 1:
            expected["body"] = big
        assert _fields(m) == expected
        assert m.msg_id == want.properties["UNIQ_KEY"] and m.queue.topic == topic
        assert m.record.body == expected["body"] and m.record.phy_offset == want.phy_offset
    first = next(m for m in got if m.body == b"one")
    assert (first.tags, first.keys, first.key_list, first.flag) == ("A", "k1 k2", ["k1", "k2"], 3)
    assert first.properties["color"] == "réd" and {"MIN_OFFSET", "MAX_OFFSET"} <= set(first.properties)


def test_a_consumer_whose_client_instance_closes_while_it_starts_starts_on_a_new_one(broker):
    """A consumer shares its process's client instance with the producers
    and consumers of the same client id; the last of them to leave closes
    it. Closed while a consumer was starting on it (its routes fetched,
    before it joined), the consumer joined a closed instance: no heartbeat,
    no rebalance, every pull refused. It now starts on a new one."""
    from shmq.client import ClientConfig
    from shmq.client.instance import ClientInstance

    async def main():
        cfg = ClientConfig(namesrv_addr=broker.namesrv, instance_name="closing-under-a-consumer")
        c = AsyncPushConsumer("cg-closing-under", client=cfg)
        c.subscribe("TopicClosingUnder", "*")
        c.register_message_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
        starting = asyncio.create_task(c.start())
        while c.instance is None:                   # it took the instance; now it starts on it
            await asyncio.sleep(0)
        first = c.instance
        await first.close()                         # as the last other member leaving does
        await starting
        try:
            assert c.instance is not first and not c.instance.stopped
            assert c.instance.consumers.get("cg-closing-under") is c
            assert ClientInstance.get(cfg) is c.instance
        finally:
            await c.shutdown()

    asyncio.run(main())
