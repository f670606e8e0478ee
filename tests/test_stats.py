"""The broker's statistics as mqadmin, rocketmq-dashboard and Prometheus read
them, against one real broker (two workers, SYNC_FLUSH, /metrics on).

Traffic goes through shmq's own client both ways a client can go: over TCP
(the workers count it) and on this host straight into the store (direct
appends and reads: the client counts it in its own process slot). Each
answer is decoded as RocketMQ's body (BrokerStatsData, ConsumeStatsList,
ProducerConnection, QueryConsumeTimeSpanBody, the runtime-info table) and
checked against what was sent and consumed; /metrics is read over HTTP and
parsed with the Prometheus client's own parser.
"""
from __future__ import annotations

import os
import re
import signal
import time
import urllib.request

import orjson
import pytest
from brokerproc import free_port, routed_topic, start_broker, until
from prometheus_client.parser import text_string_to_metric_families
from shmq.broker.config import BrokerConfig
from shmq.client import ClientConfig, ConsumeConcurrentlyStatus, Message, Producer, PushConsumer
from shmq.client.remoting import RemotingClient
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.fastjson import parse_fastjson
from shmq.ipc.remoting import LANGUAGES, RemotingCommand

CLUSTER = "DefaultCluster"
def tcp() -> dict:
    """Over TCP: the workers count (no Unix socket, so no direct appends or reads)."""
    return dict(client=ClientConfig(use_unix_socket=False))
FAST = dict(pull_time_delay_millis_when_exception=300, persist_consumer_offset_interval=0.5,
            consume_from_where="CONSUME_FROM_FIRST_OFFSET")
SENT_TCP, SENT_DIRECT = 12, 5


def consume(broker, group: str, topic: str, n: int, **kw) -> list:
    got = []
    c = PushConsumer(group, namesrv_addr=broker.namesrv, **FAST, **kw)
    c.subscribe(topic)
    c.register_message_listener(lambda msgs, ctx: (got.extend(msgs),
                                                   ConsumeConcurrentlyStatus.CONSUME_SUCCESS)[1])
    c.start()
    try:
        until(lambda: len(got) >= n, f"{n} messages of {topic} consumed by {group}")
        until(lambda: _committed(broker, topic, group) >= n, f"{group}'s offsets committed")
    finally:
        c.shutdown()
    return got


def _committed(broker, topic, group) -> int:
    r = call(broker, RC.GET_CONSUME_STATS, consumerGroup=group, topic=topic)
    if r.code != R.SUCCESS:
        return 0
    return sum(v["consumerOffset"] for v in parse_fastjson(r.body.decode())["offsetTable"].values())


def call(broker, code: int, body: bytes = b"", **ext) -> RemotingCommand:
    with RemotingClient(broker.addr) as c:
        return c.invoke(RemotingCommand(code, ext={k: str(v) for k, v in ext.items()}, body=body))


def view(broker, name: str, key: str) -> RemotingCommand:
    return call(broker, RC.VIEW_BROKER_STATS_DATA, statsName=name, statsKey=key)


def minute_sum(broker, name: str, key: str) -> int:
    r = view(broker, name, key)
    return orjson.loads(r.body)["statsMinute"]["sum"] if r.code == R.SUCCESS else -1


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    """A broker, and what went through it: TCP sends of SENT_TCP messages
    consumed over TCP by one group, direct sends of SENT_DIRECT consumed
    by another (on this host: direct reads where the client can)."""
    port = free_port()
    b = start_broker(tmp_path_factory.mktemp("stats"), flushDiskType="SYNC_FLUSH",
                     metricsPort=port, haListenPort=free_port())   # not listenPort + 1: taken at times
    try:
        t_tcp, t_direct = routed_topic(b, "StatsTcp", 2), routed_topic(b, "StatsDirect", 2)
        t0 = time.monotonic()
        with Producer("pg-stats-tcp", namesrv_addr=b.namesrv, **tcp()) as p:
            for i in range(SENT_TCP):
                p.send(Message(t_tcp, b"x" * (100 + i)))
            # a live producer: its connection is listed
            conns = until(lambda: _producers(b, "pg-stats-tcp"), "the producer listed")
        with Producer("pg-stats-direct", namesrv_addr=b.namesrv) as p:
            for i in range(SENT_DIRECT):
                p.send(Message(t_direct, b"d" * 50))
        got_tcp = consume(b, "cg-stats-tcp", t_tcp, SENT_TCP, **tcp())
        got_direct = consume(b, "cg-stats-direct", t_direct, SENT_DIRECT)
        yield dict(broker=b, port=port, tcp=t_tcp, direct=t_direct, got_tcp=got_tcp,
                   got_direct=got_direct, conns=conns, t0=t0)
    finally:
        b.stop()
        b.kill9()


def _producers(b, group):
    r = call(b, RC.GET_PRODUCER_CONNECTION_LIST, producerGroup=group)
    return orjson.loads(r.body)["connectionSet"] if r.code == R.SUCCESS else None


def test_stats_items_count_every_put_and_get_whichever_path(traffic):
    b, tcp, direct = traffic["broker"], traffic["tcp"], traffic["direct"]
    stored = sum(m.store_size for m in traffic["got_tcp"])
    until(lambda: minute_sum(b, "TOPIC_PUT_NUMS", tcp) == SENT_TCP, "TOPIC_PUT_NUMS")
    data = orjson.loads(view(b, "TOPIC_PUT_NUMS", tcp).body)
    elapsed = time.monotonic() - traffic["t0"] + 2          # the broker started before t0
    for span in ("statsMinute", "statsHour", "statsDay"):
        item = data[span]
        assert item["sum"] == SENT_TCP
        assert item["avgpt"] == 1.0                          # one message per send request
        assert SENT_TCP / (elapsed + 60) < item["tps"] <= SENT_TCP / 0.1
    size = orjson.loads(view(b, "TOPIC_PUT_SIZE", tcp).body)["statsMinute"]
    assert size["sum"] == stored                             # the records' bytes, as stored
    until(lambda: minute_sum(b, "GROUP_GET_NUMS", f"{tcp}@cg-stats-tcp") == SENT_TCP,
          "GROUP_GET_NUMS over TCP")
    got = orjson.loads(view(b, "GROUP_GET_SIZE", f"{tcp}@cg-stats-tcp").body)["statsMinute"]
    assert got["sum"] == stored
    # the direct path: counted by the client in its own process slot
    until(lambda: minute_sum(b, "TOPIC_PUT_NUMS", direct) == SENT_DIRECT, "direct appends counted")
    until(lambda: minute_sum(b, "GROUP_GET_NUMS", f"{direct}@cg-stats-direct") == SENT_DIRECT,
          "direct reads counted")
    assert minute_sum(b, "BROKER_PUT_NUMS", CLUSTER) >= SENT_TCP + SENT_DIRECT
    assert minute_sum(b, "BROKER_GET_NUMS", CLUSTER) >= SENT_TCP + SENT_DIRECT
    r = view(b, "TOPIC_PUT_NUMS", "NoSuchTopic")
    assert (r.code, r.remark) == (R.SYSTEM_ERROR, "The stats <TOPIC_PUT_NUMS> <NoSuchTopic> not exist")
    r = view(b, "NO_SUCH_STATS", tcp)
    assert r.code == R.SYSTEM_ERROR


def test_broker_consume_stats_and_consume_tps(traffic):
    b, tcp = traffic["broker"], traffic["tcp"]
    r = call(b, RC.GET_BROKER_CONSUME_STATS, isOrder="false")
    assert r.code == R.SUCCESS, r.remark
    body = parse_fastjson(r.body.decode())
    assert body["brokerAddr"] == b.addr
    groups = {g: stats for entry in body["consumeStatsList"] for g, stats in entry.items()}
    # the topic, and the group's %RETRY% topic it holds offsets in too
    by_topic = {dict(next(iter(s["offsetTable"])))["topic"]: s for s in groups["cg-stats-tcp"]}
    assert set(by_topic) == {tcp, "%RETRY%cg-stats-tcp"}
    stats = by_topic[tcp]
    table = stats["offsetTable"]
    assert sum(v["consumerOffset"] for v in table.values()) == SENT_TCP
    assert sum(v["brokerOffset"] for v in table.values()) == SENT_TCP
    assert all(v["lastTimestamp"] > 0 for v in table.values() if v["consumerOffset"])
    assert stats["consumeTps"] > 0
    assert body["totalDiff"] == 0                  # every group consumed everything
    r = call(b, RC.GET_BROKER_CONSUME_STATS, isOrder="true")
    assert all(not s for entry in parse_fastjson(r.body.decode())["consumeStatsList"]
               for s in entry.values())            # no order topics here
    r = call(b, RC.GET_CONSUME_STATS, consumerGroup="cg-stats-tcp", topic=tcp)
    assert parse_fastjson(r.body.decode())["consumeTps"] > 0


def test_producer_connection_list(traffic):
    [conn] = traffic["conns"]
    assert conn["clientId"] and conn["language"] in LANGUAGES and conn["version"] > 0
    assert re.fullmatch(r"127\.0\.0\.1:\d+", conn["clientAddr"])
    r = call(traffic["broker"], RC.GET_PRODUCER_CONNECTION_LIST, producerGroup="no-such-pg")
    assert (r.code, r.remark) == (R.SYSTEM_ERROR, "the producer group[no-such-pg] not exist")


def test_consume_time_span(traffic):
    b, tcp = traffic["broker"], traffic["tcp"]
    r = call(b, RC.QUERY_CONSUME_TIME_SPAN, topic=tcp, group="cg-stats-tcp")
    assert r.code == R.SUCCESS, r.remark
    spans = orjson.loads(r.body)["consumeTimeSpanSet"]
    assert sorted(s["messageQueue"]["queueId"] for s in spans) == [0, 1]
    stored = [m.store_timestamp for m in traffic["got_tcp"]]
    for s in spans:
        assert s["messageQueue"] == {"brokerName": "broker-a", "queueId": s["messageQueue"]["queueId"],
                                     "topic": tcp}
        assert min(stored) <= s["minTimeStamp"] <= s["maxTimeStamp"] <= max(stored)
        assert s["consumeTimeStamp"] == s["maxTimeStamp"] and s["delayTime"] == 0
    r = call(b, RC.QUERY_CONSUME_TIME_SPAN, topic="NoSuchTopic", group="g")
    assert (r.code, r.remark) == (R.TOPIC_NOT_EXIST, "topic[NoSuchTopic] not exist")


def test_runtime_info_has_rocketmqs_totals(traffic):
    b = traffic["broker"]
    r = call(b, RC.GET_BROKER_RUNTIME_INFO)
    t = orjson.loads(r.body)["table"]
    assert int(t["msgPutTotalTodayNow"]) >= SENT_TCP + SENT_DIRECT
    assert int(t["msgGetTotalTodayNow"]) >= SENT_TCP + SENT_DIRECT
    assert t["msgPutTotalTodayMorning"] == t["msgPutTotalYesterdayMorning"] == "0"   # day one
    assert float(t["putTps"].split()[2]) > 0                  # clusterList's InTPS (10 min)
    assert re.fullmatch(r"Total : [\d.]+ [KMGTPE]iB, Free : [\d.]+ [KMGTPE]iB\.", t["commitLogDirCapacity"])
    assert 0 < int(t["earliestMessageTimeStamp"]) <= int(time.time() * 1000)
    assert re.fullmatch(r"\[ 0 days, 0 hours, \d+ minutes, \d+ seconds \]", t["runtime"])
    assert t["remainHowManyDataToFlush"] == "0 B"             # SYNC_FLUSH: nothing waits


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("cluster", "broker")))
            out[(s.name, labels)] = s.value
    return out


def test_metrics_endpoint(traffic):
    b, port, tcp = traffic["broker"], traffic["port"], traffic["tcp"]
    group = (("group", "cg-stats-tcp"), ("topic", tcp))
    m = until(lambda: (lambda m: m if m.get(("rocketmq_consumer_offset", group)) == SENT_TCP
                       else None)(scrape(port)), "the group's offsets in /metrics")
    assert m[("rocketmq_producer_offset", (("topic", tcp),))] == SENT_TCP
    assert m[("rocketmq_group_diff", group)] == 0
    assert m[("rocketmq_producer_tps", (("topic", tcp),))] > 0
    assert m[("rocketmq_producer_message_size", (("topic", tcp),))] > 0
    assert m[("rocketmq_consumer_tps", group)] > 0
    assert m[("rocketmq_broker_tps", ())] > 0 and m[("rocketmq_broker_qps", ())] > 0
    assert 0 < m[("rocketmq_brokeruntime_commitlog_disk_ratio", ())] < 1
    assert m[("rocketmq_brokeruntime_msg_put_total_today_now", ())] >= SENT_TCP + SENT_DIRECT
    # SYNC_FLUSH: every TCP send waited for a flush round (the flusher counts
    # the messages at a round at most every COUNT_EVERY_S, the rest at its
    # next pass)
    m = until(lambda: (lambda m: m if m.get(("shmq_flushed_messages_total", ())) >= SENT_TCP
                       else None)(scrape(port)), "every flushed message counted")
    syncs = m[("shmq_fdatasyncs_total", ())]
    assert syncs >= 1
    assert m[("shmq_flush_latency_seconds_count", ())] == syncs
    assert m[("shmq_flush_latency_seconds_bucket", (("le", "+Inf"),))] == syncs
    assert m[("shmq_messages_per_fdatasync", ())] > 0
    assert m[("shmq_parked_sends", ())] == 0
    assert m[("shmq_restarts_total", ())] == 0
    # a connection held open shows, once its worker's second has passed
    with RemotingClient(b.addr):
        until(lambda: scrape(port).get(("shmq_connections", ())) >= 1, "a connection counted")
    # a worker killed: the boss restarts it, and says so
    os.kill(b.children()["shmq-worker-0"], signal.SIGKILL)
    until(lambda: scrape(port).get(("shmq_restarts_total", ())) == 1, "the restart counted")


def test_requests_relayed_to_a_consumer_on_any_worker(traffic):
    """GET_CONSUMER_RUNNING_INFO and CONSUME_MESSAGE_DIRECTLY reach the
    consumer whichever worker the admin's connection lands on (each call is
    a new connection: the boss spreads them over both workers), and its
    answer comes back."""
    b, topic = traffic["broker"], traffic["tcp"]
    c = PushConsumer("cg-stats-relay", namesrv_addr=b.namesrv, **FAST, **tcp())
    c.subscribe(topic)
    c.register_message_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    c.start()
    try:
        r = until(lambda: (lambda r: r if r.code == R.SUCCESS else None)(
            call(b, RC.GET_CONSUMER_LIST_BY_GROUP, consumerGroup="cg-stats-relay")), "registered")
        [cid] = orjson.loads(r.body)["consumerIdList"]
        for _ in range(4):
            r = call(b, RC.GET_CONSUMER_RUNNING_INFO, consumerGroup="cg-stats-relay", clientId=cid,
                     jstackEnable="false")
            assert r.code == R.SUCCESS, r.remark
            info = orjson.loads(r.body)
            assert {s["topic"] for s in info["subscriptionSet"]} == {topic, "%RETRY%cg-stats-relay"}
            assert info["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
        msg_id = traffic["got_tcp"][0].offset_msg_id
        r = call(b, RC.CONSUME_MESSAGE_DIRECTLY, consumerGroup="cg-stats-relay", clientId=cid,
                 msgId=msg_id)
        # the client's listener ran on the message, and its result comes back
        assert r.code == R.SUCCESS, r.remark
        assert orjson.loads(r.body)["consumeResult"] == "CR_SUCCESS"
        # no message at that offset: the client says so and runs no listener
        r = call(b, RC.CONSUME_MESSAGE_DIRECTLY, consumerGroup="cg-stats-relay", clientId=cid,
                 msgId=msg_id[:16] + "%016X" % (1 << 40))
        assert (r.code, r.remark) == (R.SYSTEM_ERROR, "cannot decode the message: the request "
                                                      "carries no message")
        # the relay's files pass between workers under the store: owner-only, as all of it
        assert os.stat(os.path.join(b.store, "relay")).st_mode & 0o777 == 0o700
    finally:
        c.shutdown()
    r = call(b, RC.GET_CONSUMER_RUNNING_INFO, consumerGroup="cg-stats-relay", clientId="nobody")
    assert (r.code, r.remark) == (R.SYSTEM_ERROR, "The Consumer <cg-stats-relay> <nobody> not online")


def test_metrics_are_served_again_by_a_restarted_services_process(tmp_path):
    """The boss holds metricsPort's socket (bound at start, where a port in
    use is one clear error: test_cli.py): the services process the boss
    restarts after a kill -9 serves /metrics on it again."""
    port = free_port()
    with start_broker(tmp_path, metricsPort=port, haListenPort=free_port(),
                      workerProcessNums=1) as b:
        assert scrape(port)[("shmq_restarts_total", ())] == 0
        os.kill(b.children()["shmq-services"], signal.SIGKILL)
        until(lambda: _scrape_or_none(port).get(("shmq_restarts_total", ())) == 1,
              "/metrics served again, the restart counted")
        assert "metricsPort" not in b.log()        # no error about the port


def _scrape_or_none(port: int) -> dict:
    try:
        return scrape(port)
    except OSError:       # between the kill and the restart: nobody accepts
        return {}


def test_metrics_port_is_checked():
    with pytest.raises(ValueError, match="metricsPort=70000: not a port"):
        BrokerConfig(metricsPort=70000)


def test_windows_count_from_the_snapshot_a_window_old_or_from_the_start(tmp_path):
    """RocketMQ's StatsItem windows over the shared counters, with the clock
    given: a minute's figure starts at the newest snapshot at least a minute
    old (the broker's start while none is), the day marks move at the first
    snapshot of a new day."""
    from shmq.broker.stats import Sampler, Stats
    from shmq.ipc.counters import NUMS, PUT, SIZE, Counters, Tally, counters_bytes
    c = Counters(memoryview(bytearray(counters_bytes(4))), str(tmp_path), slots=4)
    t0 = c.boot_ms
    workers = [Tally(c, 1), Tally(c, 2)]
    workers[0].put("T", 10, 1000)
    workers[1].put("T", 2, 200)
    for w in workers:
        w.publish()
    sampler, f = Sampler(c), Stats(c)
    sampler.step(t0 + 1000)                       # the first snapshot of every ring
    workers[1].put("T", 5, 500)
    workers[1].publish()
    row = [c.row(PUT + b"T")]
    young = f.window(row, NUMS, 60, now_ms=t0 + 30_000)
    assert young == {"sum": 17, "tps": 17 / 30, "avgpt": 17 / 3}
    old = f.window(row, NUMS, 60, now_ms=t0 + 61_000)          # from the snapshot at t0 + 1 s
    assert old == {"sum": 5, "tps": 5 / 60, "avgpt": 5.0}
    assert f.window(row, SIZE, 3600, now_ms=t0 + 61_000)["sum"] == 1700   # the hour: from the start
    assert f.view("TOPIC_PUT_NUMS", "T", "C")["statsDay"]["sum"] == 17
    assert f.view("BROKER_PUT_NUMS", "C", "C")["statsMinute"]["avgpt"] == 0.0   # no times, as RocketMQ
    assert f.view("TOPIC_PUT_NUMS", "U", "C") is None and f.view("BROKER_PUT_NUMS", "X", "C") is None
    h = c.header[0]
    sampler.step(t0 + 86_400_000)                 # the next day: today's morning is now
    assert (int(h["put_today_morning"]), int(h["put_yesterday_morning"])) == (17, 0)
