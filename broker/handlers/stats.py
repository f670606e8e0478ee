"""The statistics requests of mqadmin and rocketmq-dashboard, answered from
broker/stats.py's figures and the shared registry, in RocketMQ's bodies
(AdminBrokerProcessor, 4.9):

    VIEW_BROKER_STATS_DATA        BrokerStatsData: statsMinute / statsHour /
                                  statsDay {sum, tps, avgpt} of one StatsItem
                                  (statsName, statsKey: TOPIC_PUT_NUMS by
                                  topic, GROUP_GET_NUMS by topic@group,
                                  BROKER_PUT_NUMS by cluster …); SYSTEM_ERROR
                                  "The stats <n> <k> not exist" for one never
                                  counted, as RocketMQ
    GET_BROKER_CONSUME_STATS      ConsumeStatsList: every subscription group's
                                  ConsumeStats per topic it has offsets in,
                                  the broker's address and the total lag
    GET_PRODUCER_CONNECTION_LIST  ProducerConnection of a producer group, from
                                  the registry (its producers may be served by
                                  any worker)
    QUERY_CONSUME_TIME_SPAN       QueryConsumeTimeSpanBody: per write queue the
                                  store times of its first, last and last
                                  consumed messages, and how late the group is

WHO_CONSUME_THE_MESSAGE (214) stays REQUEST_CODE_NOT_SUPPORTED: RocketMQ 4.x
defines the code and no broker handles it.
"""
from __future__ import annotations

import time

import orjson
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.counters import GET
from shmq.ipc.fastjson import mq_map
from shmq.ipc.headers import BadRequest, Header
from shmq.ipc.remoting import RemotingCommand

from ..registry import CLIENT_EXPIRED_MS, parse_client_payload
from .base import Broker, Peer, json_reply


def group_tps(b: Broker, topic: str, group: str) -> float:
    """The group's GROUP_GET_NUMS rate from ``topic`` over the last minute."""
    f = b.stats.figures
    return f.tps(GET, f"{topic}@{group}") if f is not None else 0.0


def offset_entries(b: Broker, topic: str, group: str, queues: int) -> list[tuple]:
    """ConsumeStats' offsetTable entries (mq_map's) of ``group`` in the first
    ``queues`` queues of ``topic``: the queue's max offset, the committed
    offset and the store time of the last message consumed."""
    out = []
    for qid in range(queues):
        broker_off = max(0, b.store.max_offset(topic, qid))
        consumer_off = max(0, b.registry.get_offset(topic, group, qid))
        last = (b.store.store_time(topic, qid, consumer_off - 1) or 0) if consumer_off > 0 else 0
        out.append((topic, b.config.brokerName, qid, {
            "brokerOffset": broker_off, "consumerOffset": consumer_off, "lastTimestamp": last}))
    return out


def connection_json(b: Broker, client_id: str, info: dict) -> dict:
    """A Connection (clientId, clientAddr, language, version) from a registry row's payload."""
    addr = info["clientAddr"]
    if addr == "unix":         # a client on this host, over the broker's Unix socket
        addr = f"unix:{b.config.unix_path}"
    return {"clientAddr": addr, "clientId": client_id, "language": info["language"],
            "version": info["version"]}


def view_stats(b: Broker, peer: Peer, cmd: RemotingCommand):
    h = Header(cmd.ext)
    name, key = h.str("statsName"), h.str("statsKey")
    b.stats.publish()                 # this worker's last second counts too
    f = b.stats.figures
    data = f.view(name, key, b.config.brokerClusterName) if f is not None else None
    if data is None:
        raise BadRequest(R.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
    return json_reply(cmd, data)


def broker_consume_stats(b: Broker, peer: Peer, cmd: RemotingCommand):
    """GET_BROKER_CONSUME_STATS (fetchAllConsumeStatsInBroker): with
    isOrder, only the order topics."""
    only_order = Header(cmd.ext).bool("isOrder")
    b.stats.publish()
    groups, total_diff = [], 0
    for group in sorted(b.tables.groups.current()):
        subscribed = b.registry.group_subscriptions(group)
        stats = []
        for topic in sorted(b.registry.topics_of_group(group)):
            tc = b.tables.topics.get(topic)
            if tc is None or (only_order and not tc.order) or (subscribed and topic not in subscribed):
                continue
            items = offset_entries(b, topic, group, tc.write_queue_nums)
            total_diff += sum(v["brokerOffset"] - v["consumerOffset"] for *_, v in items)
            stats.append(f'{{"consumeTps":{group_tps(b, topic, group)!r},'
                         f'"offsetTable":{mq_map(items)}}}')
        groups.append(f'{{{orjson.dumps(group).decode()}:[{",".join(stats)}]}}')
    body = (f'{{"brokerAddr":{orjson.dumps(b.config.addr).decode()},'
            f'"consumeStatsList":[{",".join(groups)}],"totalDiff":{total_diff}}}')
    return cmd.reply(R.SUCCESS, body=body.encode())


def producer_connection(b: Broker, peer: Peer, cmd: RemotingCommand):
    group = Header(cmd.ext).str("producerGroup")
    prefix = f"{group}\0".encode()
    t = b.registry.producers
    now = int(time.time() * 1000)
    connections = [connection_json(b, k[len(prefix):].decode(), parse_client_payload(t.payload(row)))
                   for row, k in t.items()
                   if k.startswith(prefix) and now - t.v[row, 1] < CLIENT_EXPIRED_MS]
    if not connections:
        raise BadRequest(R.SYSTEM_ERROR, f"the producer group[{group}] not exist")
    return json_reply(cmd, {"connectionSet": connections})


def consume_time_span(b: Broker, peer: Peer, cmd: RemotingCommand):
    h = Header(cmd.ext)
    topic, group = h.str("topic"), h.str("group")
    tc = b.tables.topics.get(topic)
    if tc is None:
        raise BadRequest(R.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
    store, now = b.store, int(time.time() * 1000)
    spans = []
    for qid in range(tc.write_queue_nums):
        lo, hi = max(0, store.min_offset(topic, qid)), max(0, store.max_offset(topic, qid))
        min_ts = (store.store_time(topic, qid, lo) or 0) if hi > lo else 0
        max_ts = (store.store_time(topic, qid, hi - 1) or 0) if hi > 0 else 0
        consumed = b.registry.get_offset(topic, group, qid)
        consume_ts = (store.store_time(topic, qid, consumed - 1) or 0) if consumed > 0 else min_ts
        nxt = max(consumed, lo)
        delay = now - (store.store_time(topic, qid, nxt) or now) if nxt < hi else 0
        spans.append({"consumeTimeStamp": consume_ts, "delayTime": delay,
                      "maxTimeStamp": max_ts,
                      "messageQueue": {"brokerName": b.config.brokerName, "queueId": qid,
                                       "topic": topic},
                      "minTimeStamp": min_ts})
    return json_reply(cmd, {"consumeTimeSpanSet": spans})
