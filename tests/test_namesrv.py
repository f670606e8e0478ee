"""The NameServer's request logic, driven through the wire codec: every
request is encoded and decoded before ``process`` sees it, and every reply is
encoded and decoded back, so each test also proves the replies are valid
frames. Behaviour follows RocketMQ's RouteInfoManager (reference §3.10, §4.1)."""
from __future__ import annotations

import json
import logging
import struct
import zlib

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmq.broker.namesrv import (NameServer, quote_bare_keys, register_broker_request,
                                 unregister_broker_request)
from shmq.ipc.codes import RequestCode as R
from shmq.ipc.codes import ResponseCode as C
from shmq.ipc.remoting import (FLAG_ONEWAY, FLAG_RESPONSE, JSON, ROCKETMQ, FrameDecoder,
                               RemotingCommand, encode)

MASTER = "10.0.0.1:10911"
SLAVE = "10.0.0.2:10911"
OTHER = "10.0.0.3:10911"
TOPICS = {"T1": {"readQueueNums": 4, "writeQueueNums": 4, "perm": 6},
          "T2": {"readQueueNums": 8, "writeQueueNums": 2, "perm": 4, "topicSysFlag": 1}}


class Clock:
    def __init__(self, now: int = 1_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now


def wire(cmd: RemotingCommand) -> RemotingCommand:
    d = FrameDecoder()
    d.receive_data(encode(cmd))
    out = d.next_command()
    assert out is not None and d.next_command() is None and d.buffered_bytes == 0
    return out


def call(ns: NameServer, cmd: RemotingCommand, peer: str = "peer-1") -> RemotingCommand | None:
    """Request over the wire, process, reply over the wire."""
    cmd.opaque = cmd.opaque or 77
    req = wire(cmd)
    reply = ns.process(req, peer)
    if reply is None:
        return None
    assert reply.is_response and reply.opaque == req.opaque
    back = wire(reply)
    assert (back.code, back.remark, back.ext, bytes(back.body)) == \
        (reply.code, reply.remark, reply.ext, bytes(reply.body))
    return back


def req(code: int, **ext) -> RemotingCommand:
    return RemotingCommand(code=int(code), ext={k: str(v) for k, v in ext.items()})


def register(ns, *, name="broker-a", addr=MASTER, broker_id=0, topics=TOPICS, version=1,
             cluster="DefaultCluster", peer="peer-1", **kw):
    r = call(ns, register_broker_request(cluster=cluster, broker_name=name, broker_addr=addr,
                                         broker_id=broker_id, topic_configs=topics,
                                         data_version={"timestamp": 1700000000000, "counter": version},
                                         ha_addr=addr.replace("10911", "10912"), **kw), peer)
    assert r.code == C.SUCCESS, r.remark
    return r


def route(ns, topic: str) -> RemotingCommand:
    return call(ns, req(R.GET_ROUTEINFO_BY_TOPIC, topic=topic))


def route_json(ns, topic: str) -> dict:
    r = route(ns, topic)
    assert r.code == C.SUCCESS, r.remark
    return json.loads(bytes(r.body))     # the stdlib parser: standard JSON only


def body(r: RemotingCommand):
    return json.loads(bytes(r.body))


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def ns(clock):
    return NameServer(clock_ms=clock)


# ------------------------------------------------------------------ register and route
def test_register_then_route_has_queue_and_broker_data(ns):
    r = register(ns)
    assert body(r) == {"table": {}}                   # KVTable of ORDER_TOPIC_CONFIG
    assert "masterAddr" not in r.ext                  # a master has no master
    t1 = route_json(ns, "T1")
    assert t1["queueDatas"] == [{"brokerName": "broker-a", "perm": 6, "readQueueNums": 4,
                                 "topicSysFlag": 0, "writeQueueNums": 4}]
    assert t1["brokerDatas"] == [{"brokerAddrs": {"0": MASTER}, "brokerName": "broker-a",
                                  "cluster": "DefaultCluster"}]
    assert t1["filterServerTable"] == {}
    assert "orderTopicConf" not in t1
    t2 = route_json(ns, "T2")
    assert t2["queueDatas"] == [{"brokerName": "broker-a", "perm": 4, "readQueueNums": 8,
                                 "topicSysFlag": 1, "writeQueueNums": 2}]


def test_route_json_is_standard_with_quoted_keys(ns):
    register(ns)
    raw = bytes(route(ns, "T1").body)
    assert b'"brokerAddrs":{"0":"10.0.0.1:10911"}' in raw
    assert b"topicSysFlag" in raw and b"topicSynFlag" not in raw
    json.loads(raw)


def test_two_brokers_share_a_topic(ns):
    register(ns, name="broker-a", addr=MASTER)
    register(ns, name="broker-b", addr=OTHER, topics={"T1": {"readQueueNums": 2, "writeQueueNums": 2}},
             peer="peer-2")
    t1 = route_json(ns, "T1")
    assert [q["brokerName"] for q in t1["queueDatas"]] == ["broker-a", "broker-b"]
    assert [q["readQueueNums"] for q in t1["queueDatas"]] == [4, 2]
    assert {b["brokerName"]: b["brokerAddrs"] for b in t1["brokerDatas"]} == \
        {"broker-a": {"0": MASTER}, "broker-b": {"0": OTHER}}


def test_unknown_topic_is_17_without_body(ns):
    register(ns)
    r = route(ns, "nope")
    assert r.code == C.TOPIC_NOT_EXIST == 17
    assert bytes(r.body) == b"" and "nope" in r.remark


def test_order_topic_conf_only_when_set_and_order_messages_are_enabled(ns):
    """orderMessageEnable is false by default, as RocketMQ's NamesrvConfig:
    a route carries the KV table's orderTopicConf only once it is enabled."""
    register(ns)
    assert call(ns, req(R.PUT_KV_CONFIG, namespace="ORDER_TOPIC_CONFIG", key="T1",
                        value="broker-a:4")).code == C.SUCCESS
    assert "orderTopicConf" not in route_json(ns, "T1")
    r = call(ns, RemotingCommand(code=int(R.UPDATE_NAMESRV_CONFIG), body=b"orderMessageEnable=true\n"))
    assert r.code == C.SUCCESS
    assert route_json(ns, "T1")["orderTopicConf"] == "broker-a:4"
    assert "orderTopicConf" not in route_json(ns, "T2")
    assert body(register(ns)) == {"table": {"T1": "broker-a:4"}}


def test_reregister_with_fewer_topics_removes_routes(ns):
    register(ns, version=1)
    register(ns, version=2, topics={"T1": {"readQueueNums": 16, "writeQueueNums": 16}})
    assert route(ns, "T2").code == C.TOPIC_NOT_EXIST
    assert route_json(ns, "T1")["queueDatas"][0]["readQueueNums"] == 16
    topics = body(call(ns, req(R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)))
    assert topics == {"topicList": ["T1"]}


def test_same_data_version_is_a_heartbeat_and_keeps_a_wiped_perm(ns):
    register(ns, version=5)
    r = call(ns, req(R.WIPE_WRITE_PERM_OF_BROKER, brokerName="broker-a"))
    assert r.code == C.SUCCESS and r.ext["wipeTopicCount"] == "2"
    assert route_json(ns, "T1")["queueDatas"][0]["perm"] == 4
    register(ns, version=5)                            # periodic re-registration
    assert route_json(ns, "T1")["queueDatas"][0]["perm"] == 4
    r = call(ns, req(R.ADD_WRITE_PERM_OF_BROKER, brokerName="broker-a"))
    assert r.ext["addTopicCount"] == "2"
    assert route_json(ns, "T1")["queueDatas"][0]["perm"] == 6


def test_slave_gets_master_addresses_and_its_topics_are_ignored(ns):
    register(ns)
    r = register(ns, addr=SLAVE, broker_id=1, topics={"SLAVE_ONLY": {}}, peer="peer-2")
    assert r.ext == {"haServerAddr": "10.0.0.1:10912", "masterAddr": MASTER}
    assert route(ns, "SLAVE_ONLY").code == C.TOPIC_NOT_EXIST
    assert route_json(ns, "T1")["brokerDatas"][0]["brokerAddrs"] == {"0": MASTER, "1": SLAVE}
    # the master leaves: the slave still serves the route's broker name
    ns.connection_closed("peer-1")
    assert route_json(ns, "T1")["brokerDatas"][0]["brokerAddrs"] == {"1": SLAVE}


def test_address_changing_id_drops_its_old_id(ns):
    register(ns, addr=SLAVE, broker_id=1)
    register(ns, addr=SLAVE, broker_id=0)             # slave promoted
    assert route_json(ns, "T1")["brokerDatas"][0]["brokerAddrs"] == {"0": SLAVE}


# ------------------------------------------------------------------ leaving
def test_expiry_with_injected_clock(ns, clock):
    register(ns, name="broker-a", addr=MASTER)
    clock.now += 60_000
    register(ns, name="broker-b", addr=OTHER, topics={"T3": {}}, peer="peer-2")
    clock.now += 60_000                                # a: exactly 120 s, not yet
    assert ns.scan_expired() == []
    clock.now += 1
    assert ns.scan_expired() == [MASTER]
    assert route(ns, "T1").code == C.TOPIC_NOT_EXIST
    assert route_json(ns, "T3")["brokerDatas"][0]["brokerName"] == "broker-b"
    info = body(call(ns, req(R.GET_BROKER_CLUSTER_INFO)))
    assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-b"]}
    assert list(info["brokerAddrTable"]) == ["broker-b"]
    clock.now += 50_000                                # b re-registers in time
    register(ns, name="broker-b", addr=OTHER, topics={"T3": {}}, peer="peer-2")
    clock.now += 100_000
    assert ns.scan_expired() == []


def test_query_data_version_refreshes_liveness(ns, clock):
    register(ns, version=3)
    clock.now += 100_000
    q = req(R.QUERY_DATA_VERSION, brokerName="broker-a", brokerAddr=MASTER,
            clusterName="DefaultCluster", brokerId=0)
    q.body = orjson.dumps({"timestamp": 1700000000000, "counter": 3})
    r = call(ns, q)
    assert r.code == C.SUCCESS and r.ext["changed"] == "false"
    assert body(r) == {"counter": 3, "timestamp": 1700000000000}
    clock.now += 100_000
    assert ns.scan_expired() == []
    q.body = orjson.dumps({"timestamp": 1700000000000, "counter": 4})
    assert call(ns, q).ext["changed"] == "true"


def test_connection_closed_drops_the_broker(ns):
    register(ns, name="broker-a", addr=MASTER, peer="peer-1")
    register(ns, name="broker-b", addr=OTHER, topics={"T1": {}}, peer="peer-2")
    ns.connection_closed("client-9")                   # not a broker: nothing happens
    assert len(route_json(ns, "T1")["queueDatas"]) == 2
    ns.connection_closed("peer-1")
    t1 = route_json(ns, "T1")
    assert [q["brokerName"] for q in t1["queueDatas"]] == ["broker-b"]
    assert route(ns, "T2").code == C.TOPIC_NOT_EXIST
    assert ns.live.keys() == {OTHER}


def test_unregister(ns):
    register(ns)
    register(ns, addr=SLAVE, broker_id=1, peer="peer-2")
    r = call(ns, unregister_broker_request(cluster="DefaultCluster", broker_name="broker-a",
                                           broker_addr=MASTER, broker_id=0))
    assert r.code == C.SUCCESS
    assert route_json(ns, "T1")["brokerDatas"][0]["brokerAddrs"] == {"1": SLAVE}
    call(ns, unregister_broker_request(cluster="DefaultCluster", broker_name="broker-a",
                                       broker_addr=SLAVE, broker_id=1))
    assert route(ns, "T1").code == C.TOPIC_NOT_EXIST
    assert body(call(ns, req(R.GET_BROKER_CLUSTER_INFO))) == {"brokerAddrTable": {}, "clusterAddrTable": {}}


# ------------------------------------------------------------------ register bodies
def java_compressed_body(version: dict, topics: list[str], filters: list[str]) -> bytes:
    """RegisterBrokerBody.encode(true), written out independently of the module."""
    def chunk(b: bytes) -> bytes:
        return struct.pack(">i", len(b)) + b
    raw = chunk(json.dumps(version).encode()) + struct.pack(">i", len(topics))
    raw += b"".join(chunk(t.encode()) for t in topics) + chunk(json.dumps(filters).encode())
    return zlib.compress(raw, 9)


def compressed_register(body: bytes, crc: int | None = None) -> RemotingCommand:
    c = req(R.REGISTER_BROKER, brokerName="broker-z", brokerAddr=OTHER, clusterName="C2",
            haServerAddr="10.0.0.3:10912", brokerId=0, compressed="true",
            bodyCrc32=zlib.crc32(body) & 0x7FFFFFFF if crc is None else crc)
    c.body = body
    return c


def test_compressed_register_body(ns):
    b = java_compressed_body({"counter": 7, "timestamp": 1700000000000},
                             ["TC 3 5 6 SINGLE_TAG", "TD 1 1 2 MULTI_TAG"], ["10.0.0.9:30000"])
    r = call(ns, compressed_register(b))
    assert r.code == C.SUCCESS, r.remark
    tc = route_json(ns, "TC")
    assert tc["queueDatas"] == [{"brokerName": "broker-z", "perm": 6, "readQueueNums": 3,
                                 "topicSysFlag": 0, "writeQueueNums": 5}]
    assert tc["brokerDatas"][0] == {"brokerAddrs": {"0": OTHER}, "brokerName": "broker-z", "cluster": "C2"}
    assert tc["filterServerTable"] == {OTHER: ["10.0.0.9:30000"]}
    assert route_json(ns, "TD")["queueDatas"][0]["perm"] == 2


def test_compressed_round_trip_through_the_request_builder(ns):
    register(ns, compressed=True)
    assert route_json(ns, "T2")["queueDatas"][0]["readQueueNums"] == 8


def test_crc_mismatch_is_system_error_and_changes_nothing(ns):
    b = java_compressed_body({"counter": 1, "timestamp": 1}, ["TC 3 5 6 SINGLE_TAG"], [])
    r = call(ns, compressed_register(b, crc=(zlib.crc32(b) & 0x7FFFFFFF) ^ 1))
    assert r.code == C.SYSTEM_ERROR and r.remark == "crc32 not match"
    assert route(ns, "TC").code == C.TOPIC_NOT_EXIST and not ns.brokers
    r = call(ns, compressed_register(b, crc=0))       # 0: not checked
    assert r.code == C.SUCCESS


def test_fastjson_unquoted_numeric_keys_in_register_body(ns):
    raw = (b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":1,'
           b'"timestamp":5},"topicConfigTable":{"T1":{"order":false,"perm":6,"readQueueNums":2,'
           b'"topicFilterType":"SINGLE_TAG","topicName":"T1","topicSysFlag":0,"writeQueueNums":2}},'
           b'"topicQueueMappingInfoMap":{"T1":{"currIdMap":{0:0, 1:1},"note":"a,5:b {7:x}"}}}}')
    c = req(R.REGISTER_BROKER, brokerName="b", brokerAddr=MASTER, clusterName="C",
            haServerAddr="h", brokerId=0)
    c.body = raw
    assert call(ns, c).code == C.SUCCESS
    assert route_json(ns, "T1")["queueDatas"][0]["readQueueNums"] == 2


def test_quote_bare_keys_leaves_strings_alone():
    assert json.loads(quote_bare_keys('{0:"a", -1 : "b,2:c", "k":{10:[1,2]}}')) == \
        {"0": "a", "-1": "b,2:c", "k": {"10": [1, 2]}}


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("drop", ["brokerName", "brokerAddr", "clusterName", "brokerId"])
def test_missing_register_header_is_system_error_naming_it(ns, drop):
    c = register_broker_request(cluster="C", broker_name="b", broker_addr=MASTER, broker_id=0,
                                topic_configs=TOPICS, data_version={"timestamp": 1, "counter": 1})
    del c.ext[drop]
    r = call(ns, c)
    assert r.code == C.SYSTEM_ERROR and drop in r.remark
    assert not ns.brokers and not ns.topics


@pytest.mark.parametrize("code,ext,field", [
    (R.REGISTER_BROKER, {"brokerName": "b", "brokerAddr": "a", "clusterName": "c", "brokerId": "x"}, "brokerId"),
    (R.REGISTER_BROKER, {"brokerName": "b", "brokerAddr": "a", "clusterName": "c", "brokerId": "0",
                         "bodyCrc32": "zz"}, "bodyCrc32"),
    (R.GET_ROUTEINFO_BY_TOPIC, {}, "topic"),
    (R.UNREGISTER_BROKER, {"brokerName": "b", "clusterName": "c", "brokerId": "0"}, "brokerAddr"),
    (R.GET_TOPICS_BY_CLUSTER, {}, "cluster"),
    (R.DELETE_TOPIC_IN_NAMESRV, {}, "topic"),
    (R.WIPE_WRITE_PERM_OF_BROKER, {}, "brokerName"),
    (R.PUT_KV_CONFIG, {"namespace": "n", "key": "k"}, "value"),
    (R.GET_KV_CONFIG, {"key": "k"}, "namespace"),
    (R.GET_KVLIST_BY_NAMESPACE, {}, "namespace"),
    (R.QUERY_DATA_VERSION, {"brokerName": "b", "clusterName": "c", "brokerId": "0"}, "brokerAddr"),
])
def test_bad_headers_get_an_error_reply(ns, code, ext, field):
    r = call(ns, req(code, **ext))
    assert r.code == C.SYSTEM_ERROR and field in r.remark


@pytest.mark.parametrize("raw,compressed", [
    (b"not json", "false"), (b"[1,2]", "false"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":"rw"}}}}', "false"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":1e400}}}}', "false"),
    (b"\x78\x9c garbage", "true"),
    (zlib.compress(b"\x00\x00\x00\x02{}" + b"\x00\x00\x00\x01\x00\x00\x00\x03T 1"), "true"),
    (zlib.compress(b"\x00\x00\x01\x00{}"), "true"),
])
def test_bad_register_body_is_system_error(ns, raw, compressed):
    c = req(R.REGISTER_BROKER, brokerName="b", brokerAddr=MASTER, clusterName="C", haServerAddr="h",
            brokerId=0, compressed=compressed)
    c.body = raw
    r = call(ns, c)
    assert r.code == C.SYSTEM_ERROR and "RegisterBrokerBody" in r.remark
    assert not ns.brokers


def test_unknown_code_is_3(ns):
    r = call(ns, req(9999))
    assert r.code == C.REQUEST_CODE_NOT_SUPPORTED == 3
    assert r.remark == " request type 9999 not supported"
    assert r.serialize_type == JSON


def test_binary_request_gets_binary_reply_and_errors_are_json(ns):
    register(ns)
    c = req(R.GET_ROUTEINFO_BY_TOPIC, topic="T1")
    c.serialize_type = ROCKETMQ
    r = call(ns, c)
    assert r.serialize_type == ROCKETMQ and r.code == C.SUCCESS
    c = req(R.GET_ROUTEINFO_BY_TOPIC)
    c.serialize_type = ROCKETMQ
    r = call(ns, c)
    assert r.serialize_type == JSON and r.code == C.SYSTEM_ERROR


def test_unknown_serialize_type_replies_json(ns):
    c = req(R.GET_BROKER_CLUSTER_INFO)
    c.serialize_type = 7
    r = ns.process(c, "p")
    assert r.serialize_type == JSON
    wire(r)


def test_oneway_gets_no_reply_but_is_applied(ns):
    c = register_broker_request(cluster="C", broker_name="b", broker_addr=MASTER, broker_id=0,
                                topic_configs=TOPICS, data_version={"timestamp": 1, "counter": 1})
    c.flag = FLAG_ONEWAY
    assert call(ns, c) is None
    assert route_json(ns, "T1")["queueDatas"][0]["brokerName"] == "b"
    stray = req(R.GET_BROKER_CLUSTER_INFO)
    stray.flag = FLAG_RESPONSE
    assert ns.process(stray, "p") is None


# ------------------------------------------------------------------ admin and KV
def test_cluster_info_topic_lists_and_delete(ns):
    register(ns, name="broker-a", addr=MASTER, cluster="C1")
    register(ns, name="broker-b", addr=OTHER, cluster="C2", topics={"T9": {}, "T1": {}}, peer="p2")
    info = body(call(ns, req(R.GET_BROKER_CLUSTER_INFO)))
    assert info["clusterAddrTable"] == {"C1": ["broker-a"], "C2": ["broker-b"]}
    assert info["brokerAddrTable"]["broker-b"] == {"brokerAddrs": {"0": OTHER}, "brokerName": "broker-b",
                                                   "cluster": "C2"}
    assert body(call(ns, req(R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))) == {"topicList": ["T1", "T2", "T9"]}
    assert body(call(ns, req(R.GET_TOPICS_BY_CLUSTER, cluster="C2"))) == {"topicList": ["T1", "T9"]}
    assert body(call(ns, req(R.GET_TOPICS_BY_CLUSTER, cluster="nope"))) == {"topicList": []}
    assert body(call(ns, req(R.GET_UNIT_TOPIC_LIST))) == {"topicList": ["T2"]}
    system = body(call(ns, req(R.GET_SYSTEM_TOPIC_LIST_FROM_NS)))
    assert set(system["topicList"]) == {"C1", "C2", "broker-a", "broker-b"}
    assert call(ns, req(R.DELETE_TOPIC_IN_NAMESRV, topic="T1", clusterName="C1")).code == C.SUCCESS
    assert [q["brokerName"] for q in route_json(ns, "T1")["queueDatas"]] == ["broker-b"]
    call(ns, req(R.DELETE_TOPIC_IN_NAMESRV, topic="T1"))
    assert route(ns, "T1").code == C.TOPIC_NOT_EXIST


def test_kv_config(ns):
    r = call(ns, req(R.GET_KV_CONFIG, namespace="ns", key="k"))
    assert r.code == C.QUERY_NOT_FOUND
    assert call(ns, req(R.GET_KVLIST_BY_NAMESPACE, namespace="ns")).code == C.QUERY_NOT_FOUND
    call(ns, req(R.PUT_KV_CONFIG, namespace="ns", key="k", value="v"))
    call(ns, req(R.PUT_KV_CONFIG, namespace="ns", key="k2", value="v2"))
    assert call(ns, req(R.GET_KV_CONFIG, namespace="ns", key="k")).ext == {"value": "v"}
    assert body(call(ns, req(R.GET_KVLIST_BY_NAMESPACE, namespace="ns"))) == {"table": {"k": "v", "k2": "v2"}}
    call(ns, req(R.DELETE_KV_CONFIG, namespace="ns", key="k"))
    assert call(ns, req(R.GET_KV_CONFIG, namespace="ns", key="k")).code == C.QUERY_NOT_FOUND


# ------------------------------------------------------------------ never raises
EXT_KEYS = st.sampled_from(["topic", "brokerName", "brokerAddr", "clusterName", "brokerId", "compressed",
                            "bodyCrc32", "haServerAddr", "namespace", "key", "value", "cluster"])
EXT_VALUES = st.one_of(st.sampled_from(["0", "1", "-1", "true", "T1", "", "99999999999999999999999"]),
                       st.text(max_size=8))


@settings(max_examples=300, deadline=None)
@given(code=st.sampled_from([int(c) for c in R] + [0, 9999]),
       ext=st.dictionaries(EXT_KEYS, EXT_VALUES, max_size=8),
       raw=st.one_of(st.binary(max_size=64), st.sampled_from([
           b"{}", b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{}}}}',
           zlib.compress(b"\x00\x00\x00\x02{}\x00\x00\x00\x00\x00\x00\x00\x02[]")])),
       stype=st.sampled_from([JSON, ROCKETMQ]))
def test_any_request_gets_a_wire_valid_reply(code, ext, raw, stype):
    """Bad input is answered by design (BadRequest), never by the catch-all
    that logs an unexpected exception."""
    ns = NameServer(clock_ms=Clock())
    register(ns)
    errors = _Errors()
    logger = logging.getLogger("shmq.broker.namesrv")
    logger.addHandler(errors)
    try:
        r = call(ns, RemotingCommand(code=code, ext=ext, body=raw, serialize_type=stype))
    finally:
        logger.removeHandler(errors)
    assert r is not None and isinstance(r.code, int)
    assert not errors.records, errors.records[0].exc_info


class _Errors(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_broker_registers_at_once_with_a_nameserver_that_restarted(tmp_path):
    """A NameServer restarted (same address) closed the connection the
    broker registers on: its next registration failed on that dead
    connection, was not tried again, and the routes it carries were missing
    until the one after, a registerNameServerPeriod later (30 s by default;
    a new-user walkthrough saw sends answered "No route info" for ~60 s).
    The registration now goes again at once on a new connection: a topic
    created after the restart is routed long before the next period."""
    import subprocess
    import sys
    import time
    from brokerproc import BrokerProc, broker_conf, free_port, ready_line
    from shmq.client.remoting import RemotingClient
    from shmq.client.requests import create_topic
    port = free_port()

    def namesrv():
        p = subprocess.Popen([sys.executable, "-m", "shmq.tools", "namesrv", "-p", str(port)],
                             stdout=subprocess.PIPE, text=True)
        assert ready_line(p, 60).startswith("shmq namesrv ready")
        return p
    ns = namesrv()
    addr = f"127.0.0.1:{port}"
    broker = BrokerProc(tmp_path, broker_conf(tmp_path, namesrvAddr=addr,
                                              registerNameServerPeriod=60_000)).start()
    try:
        def routed(topic):
            route = RemotingCommand(R.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic})
            deadline = time.monotonic() + 20        # the next period is 60 s away
            with RemotingClient(addr) as c:
                while c.invoke(route).code != C.SUCCESS:
                    assert time.monotonic() < deadline, f"{topic} was not registered"
                    time.sleep(0.05)
        with RemotingClient(broker.addr) as c:
            assert c.invoke(create_topic("BeforeRestart", 1)).code == C.SUCCESS
        routed("BeforeRestart")                     # registered on the connection kept
        ns.terminate()
        assert ns.wait(30) == 0
        ns = namesrv()                              # the same address, nothing registered
        with RemotingClient(broker.addr) as c:
            assert c.invoke(create_topic("AfterRestart", 1)).code == C.SUCCESS
        routed("AfterRestart")                      # at once, on a new connection
        assert f"NameServer {addr}" not in broker.log()      # no failure worth a line
    finally:
        assert broker.stop() == 0
        ns.terminate()
        ns.wait(30)
