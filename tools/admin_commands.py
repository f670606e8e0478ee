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
import sys
import time
import zlib

from shmq.ipc.codes import ResponseCode as R

from .admin_client import (
    DLQ_PREFIX,
    MASTER_ID,
    ORDER_TOPIC_CONFIG,
    PERM_READ,
    PERM_WRITE,
    RETRY_PREFIX,
    TOOLS_CONSUMER,
    AdminClient,
    AdminError,
    code_name,
    decode_offset_msg_id,
)

PULL_BATCH = 32
UNIQUE_MAX_NUM = 32            # what queryMsgByUniqueKey asks for (queryMessageByUniqKey)
SYSFLAG_COMPRESSED = 0x1


def message_dict(m, broker_name: str | None = None, charset: str = "utf-8") -> dict:
    """A stored message as JSON: mqadmin's printout fields, properties and
    the body (text if it decodes in ``charset``, else base64 in bodyBase64)."""
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
        d["body"] = body.decode(charset)
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


def on_each(addrs: list[str], what: str, fn) -> list:
    """``fn(addr)`` for every address, going on past one that fails: their
    answers, in order. If any failed, an AdminError that says where ``what``
    was done and where it failed (and why): a change made on some brokers
    or NameServers and not others is a partial success, which the operator
    must be told as such, not as a plain failure. One address: its own error."""
    if len(addrs) == 1:
        return [fn(addrs[0])]
    out, done, failed = [], [], []
    for addr in addrs:
        try:
            out.append(fn(addr))
        except AdminError as e:
            failed.append(f"{addr}: {e}")
        else:
            done.append(addr)
    if failed:
        raise AdminError(f"{what}: failed on {len(failed)} of {len(addrs)} ({'; '.join(failed)}); "
                         f"done on {', '.join(done) if done else 'none'}")
    return out


def delete_topic(args, a: AdminClient) -> dict:
    a.route(args.topic)                      # an unknown topic is an error, not a silent success
    brokers = [addr for _, _, addr in a.cluster_brokers(args.clusterName)]
    on_each(brokers, f"delete topic {args.topic} in the brokers",
            lambda addr: a.delete_topic_in_broker(addr, args.topic))
    on_each(a.namesrvs, f"delete topic {args.topic} in the NameServers",
            lambda addr: a.delete_topic_in_namesrv(addr, args.topic, args.clusterName))
    return {"topic": args.topic, "cluster": args.clusterName, "brokers": brokers,
            "namesrvs": a.namesrvs}


def topic_list(args, a: AdminClient) -> dict:
    topics = a.topic_list()
    if not args.clusterModel:
        return {"topicList": topics}
    clusters = a.cluster_info()["clusterAddrTable"]
    rows = []
    for topic in topics:
        if topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            continue
        route = a.route_or_none(topic)
        brokers = a.route_readers(route) if route else []
        names = {n for n, _ in brokers}
        cluster = next((c for c, ns in sorted(clusters.items()) if names & set(ns)), "")
        groups = a.topic_consumed_by(brokers[0][1], topic) if brokers else []
        rows.append({"cluster": cluster, "topic": topic, "consumerGroups": groups})
    return {"topics": rows}


def topic_route(args, a: AdminClient) -> dict:
    return a.route(args.topic)


def topic_status(args, a: AdminClient) -> dict:
    rows = []
    for _, addr in a.route_readers(a.route(args.topic)):
        rows += a.topic_stats(addr, args.topic)
    if not rows:
        raise AdminError(f"topic {args.topic}: no broker reported its queues")
    return {"topic": args.topic, "queues": sorted(rows, key=lambda r: (r["brokerName"], r["queueId"]))}


def _broker_targets(args, a: AdminClient, masters_only: bool = True) -> list[str]:
    if args.brokerAddr:
        return [args.brokerAddr]
    addrs = [addr for _, _, addr in a.cluster_brokers(args.clusterName, masters_only)]
    if not addrs:
        raise AdminError(f"cluster {args.clusterName} has no {'master ' * masters_only}broker")
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


def ha_status(args, a: AdminClient) -> dict:
    """Each broker group's roles and replication (RocketMQ 5's haStatus,
    from the runtime info a 4.x broker gives): the master's CommitLog end,
    its slaves and the highest offset one acked; each slave's end and how
    many bytes it is behind its master (``diff``) and its ``status``: OK,
    NO_MASTER (none in the route, or it does not answer), NOT_CONNECTED
    (its master has no slave connected) or AHEAD (its CommitLog ends past
    its master's: the master runs on another store, and drops it), each
    but OK with a ``why``; a group's ``why`` when its master has more slaves
    connected than the route names. ``-c``: every group of the cluster; ``-b``: the
    group the broker is in."""
    info = a.cluster_info()
    table = info["brokerAddrTable"]
    if args.clusterName:
        names = info["clusterAddrTable"].get(args.clusterName)
        if names is None:
            known = ", ".join(sorted(info["clusterAddrTable"])) or "none"
            raise AdminError(f"cluster {args.clusterName} not found on the NameServer "
                             f"(clusters: {known})")
    else:
        names = [n for n, d in table.items()
                 if args.brokerAddr in ((d or {}).get("brokerAddrs") or {}).values()]
        if not names:
            raise AdminError(f"no broker group on the NameServer has {args.brokerAddr}")
    groups = []
    for name in sorted(names):
        addrs = (table.get(name) or {}).get("brokerAddrs") or {}
        rows = []
        for bid, addr in sorted(addrs.items(), key=lambda kv: int(kv[0])):
            row = {"brokerId": int(bid), "addr": addr}
            try:
                t = a.runtime_info(addr)
            except AdminError as e:           # a broker that is down is shown, not fatal
                row["error"] = str(e)
                rows.append(row)
                continue
            row["brokerRole"] = t.get("brokerRole") or ("ASYNC_MASTER" if str(bid) == MASTER_ID
                                                         else "SLAVE")
            row["commitLogMaxOffset"] = int(t.get("commitLogMaxOffset") or 0)
            if str(bid) == MASTER_ID and "haSlaveCount" in t:
                row["haSlaveCount"] = int(t["haSlaveCount"])
                row["haSlaveAckOffset"] = int(t.get("haSlaveAckOffset") or 0)
                if row["haSlaveCount"]:
                    row["diff"] = row["commitLogMaxOffset"] - row["haSlaveAckOffset"]
            rows.append(row)
        master = next((r for r in rows if r["brokerId"] == 0 and "error" not in r), None)
        for r in rows:
            if r["brokerId"] and "error" not in r:
                _slave_status(r, master)
        group = {"brokerName": name, "brokers": rows}
        named = sum(1 for r in rows if r["brokerId"])
        if master is not None and master.get("haSlaveCount", 0) > named:
            group["why"] = (f"its master has {master['haSlaveCount']} slaves connected, the route "
                            f"names {named}: a slave registered with other NameServers, or two "
                            f"that share a brokerId")
        groups.append(group)
    return {"groups": groups}


def _slave_status(r: dict, master: dict | None) -> None:
    if master is None:
        r["status"], r["why"] = "NO_MASTER", "no master of its group answers: nothing to follow"
        return
    r["diff"] = master["commitLogMaxOffset"] - r["commitLogMaxOffset"]
    if r["diff"] < 0:
        r["status"], r["why"] = "AHEAD", (
            f"its CommitLog ends {-r['diff']} bytes past its master's: the master runs on "
            f"another store (or lost its tail) and drops it; its log says so")
    elif master.get("haSlaveCount") == 0:
        r["status"], r["why"] = "NOT_CONNECTED", (
            f"its master {master['addr']} has no slave connected: see the slave's log "
            f"(haMasterAddress, or the master's haListenPort)")
    else:
        r["status"] = "OK"


def broker_status(args, a: AdminClient) -> dict:
    return {"brokers": {addr: a.runtime_info(addr) for addr in _broker_targets(args, a, False)}}


def get_broker_config(args, a: AdminClient) -> dict:
    return {"brokers": {addr: a.broker_config(addr) for addr in _broker_targets(args, a, False)}}


def update_broker_config(args, a: AdminClient) -> dict:
    addrs = _broker_targets(args, a)
    on_each(addrs, f"update broker config {args.key}",
            lambda addr: a.update_broker_config(addr, args.key, args.value))
    return {"key": args.key, "value": args.value, "brokers": addrs}


def wipe_write_perm(args, a: AdminClient) -> dict:
    counts = on_each(a.namesrvs, f"wipe the write permission of {args.brokerName}",
                     lambda ns: a.set_write_perm(ns, args.brokerName, False))
    return {"brokerName": args.brokerName,
            "namesrvs": [{"namesrv": ns, "wipeTopicCount": n} for ns, n in zip(a.namesrvs, counts)]}


def add_write_perm(args, a: AdminClient) -> dict:
    counts = on_each(a.namesrvs, f"add the write permission of {args.brokerName}",
                     lambda ns: a.set_write_perm(ns, args.brokerName, True))
    return {"brokerName": args.brokerName,
            "namesrvs": [{"namesrv": ns, "addTopicCount": n} for ns, n in zip(a.namesrvs, counts)]}


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


def consumer_status(args, a: AdminClient) -> dict:
    """Each member's ConsumerRunningInfo, asked through a broker of the group
    (the broker relays it to the client), and mqadmin's checks over them:
    the same subscriptions on every member of a push group running for over
    2 minutes (analyzeSubscription), and per member the queues it holds
    that look stuck (analyzeProcessQueue)."""
    group = args.consumerGroup
    cc = examine_connection(a, group, args.brokerAddr)
    members = sorted(cc["connectionSet"], key=lambda c: c["clientId"])
    if args.clientId:
        members = [c for c in members if c["clientId"] == args.clientId]
        if not members:
            raise AdminError(f"consumer {args.clientId} is not a member of group {group} (its "
                             f"members: {', '.join(c['clientId'] for c in cc['connectionSet'])})")
    addr = args.brokerAddr or _group_masters(a, group)[0][1]
    clients = []
    for c in members:
        row = {"clientId": c["clientId"], "version": c["version"]}
        try:
            row["runningInfo"] = a.consumer_running_info(addr, group, c["clientId"], args.jstack)
        except AdminError as e:
            if args.clientId:
                raise
            row["error"] = str(e)           # mqadmin goes on with the other members
        clients.append(row)
    infos = {c["clientId"]: c["runningInfo"] for c in clients if "runningInfo" in c}
    same = _same_subscription(infos)
    return {"group": group, "clients": clients, "subscriptionSame": same if infos else None,
            "rebalanceOK": same if infos else None,       # analyzeRebalance: always true in 4.x
            "warnings": [w for cid, info in infos.items() for w in _stuck_queues(cid, info)]}


def _same_subscription(infos: dict[str, dict]) -> bool:
    """ConsumerRunningInfo.analyzeSubscription."""
    if not infos:
        return True
    props = next(iter(infos.values())).get("properties") or {}
    push = props.get("PROP_CONSUME_TYPE") == "CONSUME_PASSIVELY"
    started = int(props.get("PROP_CONSUMER_START_TIMESTAMP") or 0)
    if not push or time.time() * 1000 - started <= 120_000:
        return True
    subs = [sorted((s.get("topic"), s.get("subString")) for s in i.get("subscriptionSet") or [])
            for i in infos.values()]
    return all(s == subs[0] for s in subs) and bool(subs[-1])


def _stuck_queues(client_id: str, info: dict) -> list[str]:
    """ConsumerRunningInfo.analyzeProcessQueue's lines for one member."""
    props = info.get("properties") or {}
    if props.get("PROP_CONSUME_TYPE") != "CONSUME_PASSIVELY":
        return []
    orderly = str(props.get("PROP_CONSUME_ORDERLY", "false")).lower() == "true"
    now = int(time.time() * 1000)
    out = []
    for q in info.get("mqTable") or []:
        mq = f"MessageQueue [topic={q['topic']}, brokerName={q['brokerName']}, queueId={q['queueId']}]"
        if orderly and not q.get("locked"):
            out.append(f"{client_id} {mq} can't lock for a while, {now - q.get('lastLockTimestamp', 0)}ms")
        elif orderly and q.get("droped") and q.get("tryUnlockTimes", 0) > 0:
            out.append(f"{client_id} {mq} unlock {q['tryUnlockTimes']} times, still failed")
        elif not orderly:
            idle = now - q.get("lastConsumeTimestamp", now)
            if idle > 60_000 and q.get("cachedMsgCount", 0) > 0:
                out.append(f"{client_id} {mq} can't consume for a while, maybe blocked, {idle}ms")
    return out


def reset_offset_by_time(args, a: AdminClient) -> dict:
    return reset_offsets(a, args.group, args.topic, args.timestamp, args.force, args.cplus)


def reset_offsets(a: AdminClient, group: str, topic: str, timestamp: int, force: bool,
                  cplus: bool = False) -> dict:
    """resetOffsetByTimestamp (``timestamp`` -1: every queue's max offset):
    the broker tells the group's live consumers; with none online, each
    queue's offset is committed here (``consumerOffline``)."""
    route = a.route(topic)
    for bd in route.get("brokerDatas") or []:     # none reset rather than some: name the gap
        a.broker_of(route, topic, bd["brokerName"], write=True)
    rows, fallback = [], False
    for name, addr in a.route_masters(route):
        table = a.reset_offset(addr, topic, group, timestamp, force, cplus)
        if table is None:                    # RocketMQ: no consumer online, set offsets ourselves
            fallback = True
            rows += _reset_offline(a, name, addr, group, topic, timestamp, force)
        else:
            rows += [{"brokerName": name, "queueId": q, "offset": off}
                     for q, off in sorted(table.items())]
    return {"group": group, "topic": topic, "timestamp": timestamp,
            "force": force, "consumerOffline": fallback, "offsets": rows}


def _reset_offline(a: AdminClient, name: str, addr: str, group: str, topic: str,
                   timestamp: int, force: bool) -> list[dict]:
    """resetOffsetByTimestampOld: each queue's offset at the time, committed
    with UPDATE_CONSUMER_OFFSET (unless it would move forward without -f).
    Each row is RocketMQ's RollbackStats, ``offset`` its rollbackOffset."""
    stats, _ = a.consume_stats(addr, group, topic)
    current = {r["queueId"]: (r["brokerOffset"], r["consumerOffset"])
               for r in stats if r["topic"] == topic}
    if not current:
        current = {r["queueId"]: (r["maxOffset"], r["minOffset"]) for r in a.topic_stats(addr, topic)}
    rows = []
    for qid, (broker_off, consumer_off) in sorted(current.items()):
        if timestamp == -1:
            at = a.max_offset(addr, topic, qid)
        else:
            at = a.search_offset(addr, topic, qid, timestamp)
        rollback = at
        if force or at <= consumer_off:
            a.update_consumer_offset(addr, group, topic, qid, at)
        else:
            rollback = consumer_off
        rows.append({"brokerName": name, "queueId": qid, "offset": rollback,
                     "brokerOffset": broker_off, "consumerOffset": consumer_off,
                     "timestampOffset": at})
    return rows


def skip_accumulated_message(args, a: AdminClient) -> dict:
    return reset_offsets(a, args.group, args.topic, -1, args.force)


def clone_group_offset(args, a: AdminClient) -> dict:
    """The source group's committed offset of each queue of the topic,
    committed for the destination group (CloneGroupOffsetCommand). As
    mqadmin, every queue the broker's stats list for the topic is cloned:
    a queue the source never committed in is listed at 0 (the broker's
    stats say max(0, offset)), so the destination's is set to 0 there too.
    The group's stats are asked
    without the topic, as mqadmin's examineConsumeStats(srcGroup): then the
    broker lists only the topics the group has offsets in (with the topic
    it answers 0 for every queue of a group it never saw, which would reset
    the destination); a source with none in the topic (a mistyped group) is
    an error, not a "success"."""
    rows = []
    for name, addr in a.route_masters(a.route(args.topic)):
        stats, _ = a.consume_stats(addr, args.srcGroup)
        for r in stats:
            if r["topic"] == args.topic and r["consumerOffset"] >= 0:
                a.update_consumer_offset(addr, args.destGroup, args.topic, r["queueId"],
                                         r["consumerOffset"])
                rows.append({"brokerName": name, "queueId": r["queueId"],
                             "offset": r["consumerOffset"]})
    if not rows:
        raise AdminError(f"consumer group {args.srcGroup} has no committed offset in topic "
                         f"{args.topic}: nothing to clone")
    return {"srcGroup": args.srcGroup, "destGroup": args.destGroup, "topic": args.topic,
            "offsets": rows}


def update_sub_group(args, a: AdminClient) -> dict:
    config = {"groupName": args.groupName, "consumeEnable": args.consumeEnable,
              "consumeFromMinEnable": args.consumeFromMinEnable,
              "consumeBroadcastEnable": args.consumeBroadcastEnable,
              "retryQueueNums": args.retryQueueNums, "retryMaxTimes": args.retryMaxTimes,
              "brokerId": args.brokerId,
              "whichBrokerWhenConsumeSlowly": args.whichBrokerWhenConsumeSlowly,
              "notifyConsumerIdsChangedEnable": args.notifyConsumerIdsChanged}
    addrs = _broker_targets(args, a)
    for addr in addrs:
        a.create_group(addr, config)
    return {"subscriptionGroupConfig": config, "brokers": addrs}


def delete_sub_group(args, a: AdminClient) -> dict:
    """The group's config (and with -r its offsets) on each broker; with -c
    also its %RETRY% and %DLQ% topics, from the cluster and the NameServers."""
    group = args.groupName
    addrs = _broker_targets(args, a)
    for addr in addrs:
        a.delete_group(addr, group, args.removeOffset)
    topics = []
    if args.clusterName:
        for topic in (RETRY_PREFIX + group, DLQ_PREFIX + group):
            if a.route_or_none(topic) is None:
                continue
            for addr in addrs:
                a.delete_topic_in_broker(addr, topic)
            for ns in a.namesrvs:
                a.delete_topic_in_namesrv(ns, topic, args.clusterName)
            topics.append(topic)
    return {"group": group, "cluster": args.clusterName, "brokers": addrs,
            "removeOffset": args.removeOffset, "deletedTopics": topics}



def query_msg_by_id(args, a: AdminClient) -> dict:
    out = []
    for msg_id in [m.strip() for m in args.msgId.split(",") if m.strip()]:
        out.append(_find_by_id(a, msg_id, args.topic))
    if args.consumerGroup:
        return {"messages": out, "consumeResults": [_consume_directly(a, m, args) for m in out]}
    return {"messages": out}


def _consume_directly(a: AdminClient, m: dict, args) -> dict:
    """-g -d: the message handed to one consumer's listener, through the
    broker that stores it (consumeMessageDirectly)."""
    return a.consume_directly(m["storeHost"], args.consumerGroup, args.clientId, m["offsetMsgId"])


def _find_by_id(a: AdminClient, msg_id: str, topic: str | None) -> dict:
    """An offset msgId is read from the broker it names; a client's msgId
    (UNIQ_KEY) is looked up in the topic's index (``-t``)."""
    if topic:
        for name, addr in a.route_readers(a.route(topic)):
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
        where = f"not in topic {topic}, and " if topic else ""
        raise AdminError(f"message {msg_id} not found: {where}not an offset msgId of a broker "
                         f"the NameServer knows (it would be at {addr})"
                         + ("" if topic else "; a client-generated msgId needs its topic: -t"))
    return message_dict(a.view_message(addr, phy), known[addr])


def query_msg_by_key(args, a: AdminClient) -> dict:
    out = []
    for name, addr in a.route_readers(a.route(args.topic)):
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
            a.broker_of(route, args.topic, args.broker, write=True)
        elif not writable:                  # a group whose master is gone is named as such
            for bd in route.get("brokerDatas") or []:
                a.broker_of(route, args.topic, bd["brokerName"], write=True)
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


def queue_range(a: AdminClient, addr: str, topic: str, qid: int, begin: int | None,
                end: int | None) -> tuple[int, int]:
    """A queue's [lo, hi) offsets, narrowed to store times [begin, end) when given
    (SEARCH_OFFSET_BY_TIMESTAMP), as consumeMessage and printMsg read it."""
    lo = a.min_offset(addr, topic, qid) if begin is None else a.search_offset(addr, topic, qid, begin)
    hi = a.max_offset(addr, topic, qid) if end is None else a.search_offset(addr, topic, qid, end)
    return lo, hi


def consume_message(args, a: AdminClient) -> dict:
    route = a.route(args.topic)
    if args.brokerName:
        a.broker_of(route, args.topic, args.brokerName)       # names a broker not serving it
    queues = [(name, addr, qid) for name, addr, qid in readable_queues(a, route, args.topic)
              if (not args.brokerName or name == args.brokerName)
              and (args.queueId is None or qid == args.queueId)]
    if args.queueId is not None and not queues:
        raise AdminError(f"topic {args.topic} has no readable queue {args.queueId} on broker "
                         f"{args.brokerName}")
    left = args.MessageNumber
    out = []
    for name, addr, qid in queues:
        if left <= 0:
            break
        lo, hi = queue_range(a, addr, args.topic, qid, args.beginTimestamp, args.endTimestamp)
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


def update_topic_perm(args, a: AdminClient) -> dict:
    """Each target broker's TopicConfig of the topic as its route has it,
    with the new perm (UpdateTopicPermSubCommand). Only brokers that serve
    the topic are touched (mqadmin's -c creates it on every master)."""
    route = a.route(args.topic)
    queue_datas = {q["brokerName"]: q for q in route.get("queueDatas") or []}
    masters = [(n, addr) for n, addr in a.route_masters(route) if n in queue_datas]
    if args.brokerAddr:
        targets = [(n, addr) for n, addr in masters if addr == args.brokerAddr]
        if not targets:
            raise AdminError(f"broker {args.brokerAddr} is not a master serving topic {args.topic} "
                             f"(its masters: {', '.join(addr for _, addr in masters) or 'none'})")
    else:
        in_cluster = {addr for _, _, addr in a.cluster_brokers(args.clusterName)}
        targets = [(n, addr) for n, addr in masters if addr in in_cluster]
        if not targets:
            raise AdminError(f"no master of cluster {args.clusterName} serves topic {args.topic}")
    rows = []
    for name, addr in targets:
        qd = queue_datas[name]
        tc = {"topicName": args.topic, "readQueueNums": qd["readQueueNums"],
              "writeQueueNums": qd["writeQueueNums"], "perm": args.perm,
              "topicFilterType": "SINGLE_TAG", "topicSysFlag": qd.get("topicSysFlag", 0),
              "order": False}
        changed = qd["perm"] != args.perm
        if changed:
            a.create_topic(addr, tc)
        rows.append({"brokerName": name, "addr": addr, "oldPerm": qd["perm"], "perm": args.perm,
                     "changed": changed, "topicConfig": tc})
    return {"topic": args.topic, "brokers": rows}


def topic_cluster_list(args, a: AdminClient) -> dict:
    """The clusters whose brokers serve the topic (getTopicClusterList)."""
    names = {b["brokerName"] for b in a.route(args.topic).get("brokerDatas") or []}
    clusters = a.cluster_info()["clusterAddrTable"]
    return {"topic": args.topic,
            "clusters": sorted(c for c, members in clusters.items() if names & set(members))}


def query_msg_by_unique_key(args, a: AdminClient) -> dict:
    """The messages stored under a client msgId (a retried send may have
    stored it twice), oldest first; the first only unless -a."""
    found = []
    for name, addr in a.route_readers(a.route(args.topic)):
        found += [message_dict(m, name) for m in
                  a.query_messages(addr, args.topic, args.msgId, unique=True, max_num=UNIQUE_MAX_NUM)]
    if not found:
        raise AdminError(f"no message with unique key {args.msgId} in topic {args.topic}")
    found.sort(key=lambda d: d["storeTimestamp"])
    if args.consumerGroup:
        return {"messages": found[:1], "consumeResults": [_consume_directly(a, found[0], args)]}
    return {"messages": found if args.showAll else found[:1]}


def get_namesrv_config(args, a: AdminClient) -> dict:
    return {"namesrvs": {ns: a.namesrv_config(ns) for ns in a.namesrvs}}


def update_namesrv_config(args, a: AdminClient) -> dict:
    value = args.value.strip()
    on_each(a.namesrvs, f"update name server config {args.key}",
            lambda ns: a.update_namesrv_config(ns, args.key, value))
    return {"key": args.key, "value": value, "namesrvs": a.namesrvs}


class Progress:
    """A long command's progress on stderr (stdout keeps its table or JSON):
    one line rewritten in place, at most 5 times a second, where stderr is
    a terminal and stdout is not (``printMsg > file``); otherwise a line per
    finished step (a queue, a topic, a broker), which output to the same
    terminal cannot run into."""

    def __init__(self, command: str, total: int, unit: str):
        self.command, self.total, self.unit = command, total, unit
        self.tty = sys.stderr.isatty() and not sys.stdout.isatty()
        self.shown_at = 0.0       # a terminal: when the line was last rewritten
        self.shown_done = 0       # otherwise: the steps already reported

    def update(self, done: int, detail: str = "") -> None:
        """``done`` steps of ``total`` are finished (a step in progress: same ``done``)."""
        line = f"{self.command}: {done}/{self.total} {self.unit}" + (f", {detail}" if detail else "")
        now = time.monotonic()
        if self.tty:
            if done == self.total or now - self.shown_at >= 0.2:
                self.shown_at = now
                end = "\n" if done == self.total else ""
                sys.stderr.write(f"\r\x1b[K{line}{end}")
                sys.stderr.flush()
        elif done > self.shown_done:
            self.shown_done = done
            print(line, file=sys.stderr)


def readable_queues(a: AdminClient, route: dict, topic: str) -> list[tuple[str, str, int]]:
    """(brokerName, addr, queueId) of each queue a consumer reads
    (fetchSubscribeMessageQueues: read queues of brokers with perm R), at
    the broker's master, else its slave."""
    readable = {q["brokerName"]: q["readQueueNums"] for q in route.get("queueDatas") or []
                if q.get("perm", 6) & PERM_READ}
    return [(name, addr, qid) for name, addr in a.route_readers(route)
            for qid in range(readable.get(name, 0))]


def print_msg(args, a: AdminClient) -> dict:
    """Every message of the topic (between the times, matching the tags),
    queue by queue, as PrintMessageSubCommand pulls them. Without --json
    they are printed as they are pulled (``admin_show``'s printMsg lines),
    not kept: a topic may hold more than fits in memory."""
    from shmq.client.subscription import SubscriptionData

    from . import admin_show
    show = None if args.json else admin_show
    tags = SubscriptionData.build(args.topic, args.subExpression).tags_set
    queues = readable_queues(a, a.route(args.topic), args.topic)
    progress = Progress("printMsg", len(queues), "queues")
    out, total = [], 0
    for i, (name, addr, qid) in enumerate(queues):
        lo, hi = queue_range(a, addr, args.topic, qid, args.beginTimestamp, args.endTimestamp)
        q = {"brokerName": name, "queueId": qid, "minOffset": lo, "maxOffset": hi,
             "status": None, "messageCount": 0}
        if show:
            show.print_msg_queue_start(args.topic, q)
        else:
            q["messages"] = []
        offset = lo
        while offset < hi:
            code, msgs, nxt = a.pull(addr, args.topic, qid, offset, PULL_BATCH, TOOLS_CONSUMER,
                                     args.subExpression)
            found = [message_dict(m, name, args.charsetName) for m in msgs
                     if m.queue_offset < hi and (not tags or m.properties.get("TAGS") in tags)]
            q["status"] = "FOUND" if found else _PULL_STATUS.get(code, "NO_MATCHED_MSG")
            if not args.printBody:
                for d in found:
                    d.pop("body")
                    d.pop("bodyBase64", None)
            q["messageCount"] += len(found)
            if show:
                show.print_msg_pulled(args.topic, q, found, nxt)
            else:
                q["messages"] += found
            if code in (R.PULL_NOT_FOUND, R.PULL_OFFSET_MOVED) or nxt <= offset:
                break
            offset = nxt
            progress.update(i, f"{total + q['messageCount']} messages")
        total += q["messageCount"]
        if show:
            show.print_msg_queue_end()
        out.append(q)
        progress.update(i + 1, f"{total} messages")
    return {"topic": args.topic, "subExpression": args.subExpression, "messageCount": total,
            "queues": out}


# PullResult's status, as the Java client maps a pull's response code
_PULL_STATUS = {R.PULL_NOT_FOUND: "NO_NEW_MSG", R.PULL_RETRY_IMMEDIATELY: "NO_MATCHED_MSG",
                R.PULL_OFFSET_MOVED: "OFFSET_ILLEGAL"}


def _store_targets(args, a: AdminClient) -> list[str]:
    """-b's broker, else every broker (masters and slaves) of -c's cluster,
    else of every cluster (cleanExpiredConsumerQueue, deleteExpiredCommitLog)."""
    if args.brokerAddr:
        return [args.brokerAddr]
    if args.cluster:
        addrs = [addr for _, _, addr in a.cluster_brokers(args.cluster, masters_only=False)]
    else:
        info = a.cluster_info()
        addrs = [addr for c in sorted(info["clusterAddrTable"])
                 for _, _, addr in a.cluster_brokers(c, masters_only=False)]
    if not addrs:
        raise AdminError(f"cluster {args.cluster} has no broker" if args.cluster
                         else "the NameServer knows no broker")
    return addrs


def clean_expired_cq(args, a: AdminClient) -> dict:
    return _store_cleanup(args, a, "cleanExpiredCQ", a.clean_expired_cq)


def delete_expired_commit_log(args, a: AdminClient) -> dict:
    return _store_cleanup(args, a, "deleteExpiredCommitLog", a.delete_expired_commitlog)


def _store_cleanup(args, a: AdminClient, command: str, request) -> dict:
    addrs = _store_targets(args, a)
    progress = Progress(command, len(addrs), "brokers")
    rows = []
    for i, addr in enumerate(addrs):
        rows.append({"brokerAddr": addr, **request(addr)})
        progress.update(i + 1, addr)
    return {"result": True, "brokers": rows}


def producer_connection(args, a: AdminClient) -> dict:
    """The group's producers as the topic's brokers see them
    (examineProducerConnectionInfo), each client once."""
    seen: dict[str, dict] = {}
    for _, addr in a.route_masters(a.route(args.topic)):
        for c in a.producer_connection(addr, args.producerGroup):
            seen.setdefault(c["clientId"], c)
    if not seen:
        raise AdminError(f"producer group {args.producerGroup} not found: no broker of topic "
                         f"{args.topic} has a connection of it")
    return {"group": args.producerGroup, "topic": args.topic, "connectionSet": list(seen.values())}


def broker_consume_stats(args, a: AdminClient) -> dict:
    """Every group's lag on one broker (fetchConsumeStatsInBroker); the
    rows under ``-l`` are left out."""
    if args.timeoutMillis is not None:
        a.timeout = args.timeoutMillis / 1000
    d = a.broker_consume_stats(args.brokerAddr, args.order)
    rows = []
    for group, queues in d["groups"].items():
        for r in queues:
            r["diff"] = r["brokerOffset"] - r["consumerOffset"]
            if r["diff"] >= args.level:
                rows.append({"group": group, **r})
    return {"brokerAddr": d["brokerAddr"], "totalDiff": d["totalDiff"], "queues": rows}


def stats_all(args, a: AdminClient) -> dict:
    """Each topic's put rate and messages of the last 24 hours, and per
    consumer group its get rate, messages and lag (StatsAllSubCommand).
    A figure a broker never counted is 0, as in mqadmin."""
    topics = [t for t in a.topic_list() if not t.startswith((RETRY_PREFIX, DLQ_PREFIX))
              and (not args.topic or t == args.topic)]
    if args.topic and not topics:
        raise AdminError(f"topic {args.topic} does not exist: the NameServer does not list it")
    progress = Progress("statsAll", len(topics), "topics")
    rows, errors = [], []
    for i, topic in enumerate(topics):
        try:
            rows += _topic_stats(a, topic, args.activeTopic)
        except AdminError as e:              # mqadmin skips the topic; --json says why
            errors.append({"topic": topic, "error": str(e)})
        progress.update(i + 1, topic)
    return {"stats": rows, "errors": errors}


def _topic_stats(a: AdminClient, topic: str, active_only: bool) -> list[dict]:
    """statsAll's rows of one topic (StatsAllSubCommand.printTopicDetail)."""
    route = a.route_or_none(topic)
    masters = [addr for _, addr in a.route_masters(route)] if route else []
    in_tps, in_24h = _stats_sum(a, masters, "TOPIC_PUT_NUMS", topic)
    groups = a.topic_consumed_by(masters[0], topic) if masters else []
    rows = []
    for group in groups:
        out_tps, out_24h = _stats_sum(a, masters, "GROUP_GET_NUMS", f"{topic}@{group}")
        lag = 0
        for addr in masters:
            stats, _ = a.consume_stats(addr, group, topic)
            lag += sum(r["brokerOffset"] - r["consumerOffset"] for r in stats if r["topic"] == topic)
        if not active_only or in_24h > 0 or out_24h > 0:
            rows.append({"topic": topic, "group": group, "accumulation": max(0, lag),
                         "inTps": in_tps, "outTps": out_tps, "inMsg24Hour": in_24h,
                         "outMsg24Hour": out_24h})
    if not groups and (not active_only or in_24h > 0):
        rows.append({"topic": topic, "group": None, "accumulation": 0, "inTps": in_tps,
                     "outTps": None, "inMsg24Hour": in_24h, "outMsg24Hour": None})
    return rows


def _stats_sum(a: AdminClient, addrs: list[str], name: str, key: str) -> tuple[float, int]:
    """(tps over the last minute, messages in the last 24 hours) of one
    stats item over the brokers: compute24HourSum takes the day's sum, else
    the hour's, else the minute's."""
    tps, total = 0.0, 0
    for addr in addrs:
        d = a.view_stats(addr, name, key)
        if d is None:
            continue
        tps += float(d["statsMinute"]["tps"])
        total += next((int(d[k]["sum"]) for k in ("statsDay", "statsHour", "statsMinute")
                       if int(d[k]["sum"])), 0)
    return tps, total


def query_msg_trace_by_id(args, a: AdminClient) -> dict:
    from .msg_trace import query_msg_trace
    views = query_msg_trace(a, args.msgId, args.traceTopic)
    if not views:
        raise AdminError(f"no trace of message {args.msgId} in trace topic {args.traceTopic}")
    return {"msgId": args.msgId, "traceTopic": args.traceTopic, "traces": views}
