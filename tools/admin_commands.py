"""What each ``shmq admin`` command does: one function per command,
``(args, AdminClient) -> dict``, named as the command in snake case.

Each asks what mqadmin's command asks (through ``admin_client``) and returns
the answer as plain data with RocketMQ's field names; ``admin_show`` prints
it as mqadmin does, ``--json`` prints the dict. A failure the user can act
on raises ``AdminError``. sendMessage sends with the Python client's
Producer (what mqadmin does with DefaultMQProducer); consumeMessage and
queryMsgByOffset pull with the client's request builders, committing no
offset.
"""
from __future__ import annotations

import base64
import os
import time
import zlib

from .admin_client import (
    ORDER_TOPIC_CONFIG,
    PERM_READ,
    PERM_WRITE,
    RETRY_PREFIX,
    AdminClient,
    AdminError,
    code_name,
    decode_offset_msg_id,
)

PULL_BATCH = 32
SYSFLAG_COMPRESSED = 0x1


def message_dict(m, broker_name: str | None = None) -> dict:
    """A stored message as JSON: mqadmin's printout fields, properties and
    the body (text if UTF-8, else base64 in bodyBase64)."""
    props = m.properties
    body = m.body
    if m.sysflag & SYSFLAG_COMPRESSED:
        try:
            body = zlib.decompress(body)
        except zlib.error:
            pass
    d = {"msgId": props.get("UNIQ_KEY") or m.offset_msg_id(), "offsetMsgId": m.offset_msg_id(),
         "topic": m.topic, "tags": props.get("TAGS"), "keys": props.get("KEYS"),
         "queueId": m.queue_id, "queueOffset": m.queue_offset, "commitLogOffset": m.phy_offset,
         "reconsumeTimes": m.reconsume_times, "bornTimestamp": m.born_timestamp,
         "storeTimestamp": m.store_timestamp, "bornHost": f"{m.born_host[0]}:{m.born_host[1]}",
         "storeHost": f"{m.store_host[0]}:{m.store_host[1]}", "sysFlag": m.sysflag,
         "properties": props, "bodyLength": len(body)}
    if broker_name is not None:
        d["brokerName"] = broker_name
    try:
        d["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        d["body"] = None
        d["bodyBase64"] = base64.b64encode(body).decode()
    return d


def update_topic(args, a: AdminClient) -> dict:
    tc = {"topicName": args.topic, "readQueueNums": args.readQueueNums,
          "writeQueueNums": args.writeQueueNums, "perm": args.perm,
          "topicFilterType": "SINGLE_TAG",
          "topicSysFlag": (1 if args.unit else 0) | (2 if args.hasUnitSub else 0),
          "order": args.order}
    if args.brokerAddr:
        targets = [(None, args.brokerAddr)]
    else:
        targets = [(name, addr) for name, _, addr in a.cluster_brokers(args.clusterName)]
        if not targets:
            raise AdminError(f"cluster {args.clusterName} has no master broker")
    for _, addr in targets:
        a.create_topic(addr, tc)
    order_conf = None
    if args.order:
        if args.brokerAddr:
            names = [n for n, b in a.cluster_info()["brokerAddrTable"].items()
                     if args.brokerAddr in (b.get("brokerAddrs") or {}).values()]
            if not names:
                raise AdminError(f"no broker registered at {args.brokerAddr} on the NameServer")
            order_conf = f"{names[0]}:{args.writeQueueNums}"
        else:
            order_conf = ";".join(f"{n}:{args.writeQueueNums}" for n, _ in targets)
        a.put_kv(ORDER_TOPIC_CONFIG, args.topic, order_conf)
    return {"topicConfig": tc, "brokers": [addr for _, addr in targets], "orderConf": order_conf}


def delete_topic(args, a: AdminClient) -> dict:
    a.route(args.topic)                      # an unknown topic is an error, not a silent success
    brokers = [addr for _, _, addr in a.cluster_brokers(args.clusterName)]
    for addr in brokers:
        a.delete_topic_in_broker(addr, args.topic)
    for addr in a.namesrvs:
        a.delete_topic_in_namesrv(addr, args.topic, args.clusterName)
    return {"topic": args.topic, "cluster": args.clusterName, "brokers": brokers,
            "namesrvs": a.namesrvs}


def topic_list(args, a: AdminClient) -> dict:
    topics = a.topic_list()
    if not args.clusterModel:
        return {"topicList": topics}
    clusters = a.cluster_info()["clusterAddrTable"]
    rows = []
    for topic in topics:
        if topic.startswith((RETRY_PREFIX, "%DLQ%")):
            continue
        route = a.route_or_none(topic)
        masters = a.route_masters(route) if route else []
        names = {n for n, _ in masters}
        cluster = next((c for c, ns in sorted(clusters.items()) if names & set(ns)), "")
        groups = a.topic_consumed_by(masters[0][1], topic) if masters else []
        rows.append({"cluster": cluster, "topic": topic, "consumerGroups": groups})
    return {"topics": rows}


def topic_route(args, a: AdminClient) -> dict:
    return a.route(args.topic)


def topic_status(args, a: AdminClient) -> dict:
    rows = []
    for _, addr in a.route_masters(a.route(args.topic)):
        rows += a.topic_stats(addr, args.topic)
    if not rows:
        raise AdminError(f"topic {args.topic}: no broker reported its queues")
    return {"topic": args.topic, "queues": sorted(rows, key=lambda r: (r["brokerName"], r["queueId"]))}


def _broker_targets(args, a: AdminClient, masters_only: bool = True) -> list[str]:
    if args.brokerAddr:
        return [args.brokerAddr]
    addrs = [addr for _, _, addr in a.cluster_brokers(args.clusterName, masters_only)]
    if not addrs:
        raise AdminError(f"cluster {args.clusterName} has no broker")
    return addrs


def cluster_list(args, a: AdminClient) -> dict:
    info = a.cluster_info()
    rows = []
    for cluster, names in sorted(info["clusterAddrTable"].items()):
        for name in sorted(names):
            addrs = (info["brokerAddrTable"].get(name) or {}).get("brokerAddrs") or {}
            for bid, addr in sorted(addrs.items(), key=lambda kv: int(kv[0])):
                row = {"cluster": cluster, "brokerName": name, "brokerId": int(bid), "addr": addr}
                try:
                    row["runtime"] = a.runtime_info(addr)
                except AdminError as e:           # a broker that is down is shown, not fatal
                    row["runtime"], row["error"] = {}, str(e)
                rows.append(row)
    return {"brokers": rows}


def broker_status(args, a: AdminClient) -> dict:
    return {"brokers": {addr: a.runtime_info(addr) for addr in _broker_targets(args, a, False)}}


def get_broker_config(args, a: AdminClient) -> dict:
    return {"brokers": {addr: a.broker_config(addr) for addr in _broker_targets(args, a, False)}}


def update_broker_config(args, a: AdminClient) -> dict:
    addrs = _broker_targets(args, a)
    for addr in addrs:
        a.update_broker_config(addr, args.key, args.value)
    return {"key": args.key, "value": args.value, "brokers": addrs}


def wipe_write_perm(args, a: AdminClient) -> dict:
    return {"brokerName": args.brokerName,
            "namesrvs": [{"namesrv": ns, "wipeTopicCount": a.set_write_perm(ns, args.brokerName, False)}
                         for ns in a.namesrvs]}


def add_write_perm(args, a: AdminClient) -> dict:
    return {"brokerName": args.brokerName,
            "namesrvs": [{"namesrv": ns, "addTopicCount": a.set_write_perm(ns, args.brokerName, True)}
                         for ns in a.namesrvs]}


def _group_masters(a: AdminClient, group: str) -> list[tuple[str, str]]:
    route = a.route_or_none(RETRY_PREFIX + group)
    if route is None:
        raise AdminError(f"consumer group {group} not found: the NameServer has no route for "
                         f"{RETRY_PREFIX}{group} (the group has never consumed)")
    return a.route_masters(route)


def examine_consume_stats(a: AdminClient, group: str) -> tuple[list[dict], float]:
    rows, tps = [], 0.0
    for _, addr in _group_masters(a, group):
        r, t = a.consume_stats(addr, group)
        rows += r
        tps += t
    for r in rows:
        r["diff"] = r["brokerOffset"] - r["consumerOffset"]
    return rows, tps


def examine_connection(a: AdminClient, group: str, addr: str | None = None) -> dict:
    addrs = [addr] if addr else [ad for _, ad in _group_masters(a, group)]
    for ad in addrs:
        cc = a.consumer_connection(ad, group)
        if cc is not None and cc.get("connectionSet"):
            return cc
    raise AdminError(f"consumer group {group} is not online (no broker lists a connection of it)")


def consumer_progress(args, a: AdminClient) -> dict:
    if args.groupName:
        rows, tps = examine_consume_stats(a, args.groupName)
        if not rows:
            raise AdminError(f"consumer group {args.groupName} has no consume stats (it has no "
                             f"offset in any topic it subscribes)")
        return {"group": args.groupName, "consumeTps": tps,
                "diffTotal": sum(r["diff"] for r in rows), "queues": rows}
    groups = []
    for topic in a.topic_list():
        if not topic.startswith(RETRY_PREFIX):
            continue
        group = topic[len(RETRY_PREFIX):]
        g = {"group": group, "count": 0, "version": None, "consumeType": None,
             "messageModel": None, "consumeTps": 0, "diffTotal": 0}
        try:
            rows, tps = examine_consume_stats(a, group)
            g["consumeTps"], g["diffTotal"] = int(tps), sum(r["diff"] for r in rows)
        except AdminError:
            pass
        try:
            cc = examine_connection(a, group)
            g["count"] = len(cc["connectionSet"])
            g["version"] = min(c.get("version", 0) for c in cc["connectionSet"])
            g["consumeType"], g["messageModel"] = cc.get("consumeType"), cc.get("messageModel")
        except AdminError:
            pass
        groups.append(g)
    return {"groups": groups}


def consumer_connection(args, a: AdminClient) -> dict:
    cc = examine_connection(a, args.consumerGroup, args.brokerAddr)
    return {"group": args.consumerGroup, **cc}


def reset_offset_by_time(args, a: AdminClient) -> dict:
    route = a.route(args.topic)
    rows, fallback = [], False
    for name, addr in a.route_masters(route):
        table = a.reset_offset(addr, args.topic, args.group, args.timestamp, args.force, args.cplus)
        if table is None:                    # RocketMQ: no consumer online, set offsets ourselves
            fallback = True
            rows += _reset_offline(a, name, addr, args)
        else:
            rows += [{"brokerName": name, "queueId": q, "offset": off}
                     for q, off in sorted(table.items())]
    return {"group": args.group, "topic": args.topic, "timestamp": args.timestamp,
            "force": args.force, "consumerOffline": fallback, "offsets": rows}


def _reset_offline(a: AdminClient, name: str, addr: str, args) -> list[dict]:
    """resetOffsetByTimestampOld: each queue's offset at the time, committed
    with UPDATE_CONSUMER_OFFSET (unless it would move forward without -f)."""
    stats, _ = a.consume_stats(addr, args.group, args.topic)
    current = {r["queueId"]: r["consumerOffset"] for r in stats if r["topic"] == args.topic}
    if not current:
        current = {r["queueId"]: r["minOffset"] for r in a.topic_stats(addr, args.topic)}
    rows = []
    for qid, consumer_off in sorted(current.items()):
        if args.timestamp == -1:
            at = a.max_offset(addr, args.topic, qid)
        else:
            at = a.search_offset(addr, args.topic, qid, args.timestamp)
        if args.force or at <= consumer_off:
            a.update_consumer_offset(addr, args.group, args.topic, qid, at)
        else:
            at = consumer_off
        rows.append({"brokerName": name, "queueId": qid, "offset": at})
    return rows


def query_msg_by_id(args, a: AdminClient) -> dict:
    out = []
    for msg_id in [m.strip() for m in args.msgId.split(",") if m.strip()]:
        out.append(_find_by_id(a, msg_id, args.topic))
    return {"messages": out}


def _find_by_id(a: AdminClient, msg_id: str, topic: str | None) -> dict:
    """An offset msgId is read from the broker it names; a client's msgId
    (UNIQ_KEY) is looked up in the topic's index (``-t``)."""
    if topic:
        for name, addr in a.route_masters(a.route(topic)):
            found = a.query_messages(addr, topic, msg_id, unique=True)
            if found:
                return message_dict(found[0], name)
    try:
        addr, phy = decode_offset_msg_id(msg_id)
    except ValueError as e:
        hint = "" if topic else "; a client-generated msgId needs its topic: -t"
        raise AdminError(f"{e}{hint}") from None
    known = {a_: n for n, b in a.cluster_info()["brokerAddrTable"].items()
             for a_ in (b.get("brokerAddrs") or {}).values()}
    if addr not in known:
        where = f"in topic {topic}, and " if topic else ""
        raise AdminError(f"message {msg_id} not found: not {where}not an offset msgId of a broker "
                         f"the NameServer knows (it would be at {addr})"
                         + ("" if topic else "; a client-generated msgId needs its topic: -t"))
    return message_dict(a.view_message(addr, phy), known[addr])


def query_msg_by_key(args, a: AdminClient) -> dict:
    out = []
    for name, addr in a.route_masters(a.route(args.topic)):
        for m in a.query_messages(addr, args.topic, args.msgKey):
            if args.msgKey in m.keys:
                out.append(message_dict(m, name))
    if not out:
        raise AdminError(f"no message with key {args.msgKey} in topic {args.topic}")
    return {"messages": out}


def query_msg_by_offset(args, a: AdminClient) -> dict:
    addr = a.broker_of(a.route(args.topic), args.topic, args.brokerName)
    code, msgs, _ = a.pull(addr, args.topic, args.queueId, args.offset, 1)
    if not msgs:
        raise AdminError(f"no message at {args.topic}:{args.brokerName}:{args.queueId} offset "
                         f"{args.offset} ({code_name(code)})")
    return {"messages": [message_dict(msgs[0], args.brokerName)]}


def send_message(args, a: AdminClient) -> dict:
    from shmq.client import ClientConfig, Message, MessageQueue, MQClientError, Producer
    from shmq.client.connection import RemotingError

    route = a.route_or_none(args.topic)
    if route is not None:
        writable = [n for n, _ in a.route_masters(route)
                    if any(q["brokerName"] == n and q.get("perm", 6) & PERM_WRITE
                           for q in route.get("queueDatas") or [])]
        if args.broker:
            a.broker_of(route, args.topic, args.broker)
        if not writable or (args.broker and args.broker not in writable):
            raise AdminError(f"topic {args.topic} is not writable: its route on the NameServer "
                             f"gives no queue write permission (perm without 2)")
    msg = Message(args.topic, args.body.encode("utf-8"), tags=args.tags, keys=args.key)
    queue = MessageQueue(args.topic, args.broker, args.qid) if args.qid is not None else None
    creds = a.credentials
    config = ClientConfig(namesrv_addr=";".join(a.namesrvs), request_timeout=a.timeout,
                          instance_name=f"shmq-admin-{os.getpid()}",
                          access_key=creds.access_key if creds else "",
                          secret_key=creds.secret_key if creds else "")
    producer = Producer(str(int(time.time() * 1000)), client=config, send_msg_timeout=a.timeout)
    try:
        producer.start()
        try:
            r = producer.send(msg, queue)
        finally:
            producer.shutdown()
    except (MQClientError, RemotingError) as e:
        raise AdminError(f"send to topic {args.topic} failed: {e}") from None
    return {"brokerName": r.queue.broker_name, "queueId": r.queue.queue_id,
            "sendStatus": r.status.value, "msgId": r.msg_id, "offsetMsgId": r.offset_msg_id,
            "queueOffset": r.queue_offset}


def consume_message(args, a: AdminClient) -> dict:
    route = a.route(args.topic)
    masters = a.route_masters(route)
    if args.brokerName:
        masters = [(args.brokerName, a.broker_of(route, args.topic, args.brokerName))]
    readable = {q["brokerName"]: q["readQueueNums"] for q in route.get("queueDatas") or []
                if q.get("perm", 6) & PERM_READ}
    queues = [(name, addr, qid) for name, addr in masters for qid in range(readable.get(name, 0))
              if args.queueId is None or qid == args.queueId]
    if args.queueId is not None and not queues:
        raise AdminError(f"topic {args.topic} has no readable queue {args.queueId} on broker "
                         f"{args.brokerName}")
    left = args.MessageNumber
    out = []
    for name, addr, qid in queues:
        if left <= 0:
            break
        lo = a.min_offset(addr, args.topic, qid)
        hi = a.max_offset(addr, args.topic, qid)
        if args.beginTimestamp is not None:
            lo = a.search_offset(addr, args.topic, qid, args.beginTimestamp)
        if args.endTimestamp is not None:
            hi = a.search_offset(addr, args.topic, qid, args.endTimestamp)
        if args.offset is not None:
            lo = max(lo, args.offset)
        offset = lo
        while offset < hi and left > 0:
            _, msgs, nxt = a.pull(addr, args.topic, qid, offset, min(PULL_BATCH, left, hi - offset),
                                     args.consumerGroup)
            for m in msgs[:left]:
                out.append(message_dict(m, name))
            left -= min(len(msgs), left)
            if nxt <= offset:
                break
            offset = nxt
    return {"topic": args.topic, "messages": out}
