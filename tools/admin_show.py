"""How ``shmq admin`` prints each command's answer without ``--json``:
mqadmin's printf columns and lines, one function per command named as the
command in snake case, ``(data, args) -> None``.
"""
from __future__ import annotations

import datetime
import json
import time

from .admin_client import PERM_READ, PERM_WRITE


def human_ms(ms: int) -> str:
    """UtilAll.timeMillisToHumanString2: yyyy-MM-dd HH:mm:ss,SSS."""
    t = datetime.datetime.fromtimestamp(ms / 1000)
    return t.strftime("%Y-%m-%d %H:%M:%S,") + f"{ms % 1000:03d}"


def human_date(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def perm_string(perm: int) -> str:
    """PermName.perm2String: R, W, X (inherit) or -."""
    return ("R" if perm & PERM_READ else "-") + ("W" if perm & PERM_WRITE else "-") \
        + ("X" if perm & 1 else "-")


def version_desc(v: int) -> str:
    """MQVersion.getVersionDesc for 4.0.0 … 5.9.9 (each patch a SNAPSHOT and a
    release); other ordinals are shown as numbers."""
    if 212 <= v < 612:
        off = v - 212
        major, minor, patch = 4 + off // 200, off % 200 // 20, off % 20 // 2
        return f"V{major}_{minor}_{patch}" + ("_SNAPSHOT" if off % 2 == 0 else "")
    return str(v)


def print_message(d: dict, ids: bool = True) -> None:
    """QueryMsgByIdSubCommand.printMsg's lines (the body inline, not in a
    file); without ``ids``, queryMsgByUniqueKey's (no OffsetID, MsgId)."""
    rows = [("OffsetID:", d["offsetMsgId"]), ("MsgId:", d["msgId"])] if ids else []
    rows += [("Topic:", d["topic"]),
            ("Tags:", f"[{_java(d['tags'])}]"), ("Keys:", f"[{_java(d['keys'])}]"),
            ("Queue ID:", d["queueId"]),
            ("Queue Offset:", d["queueOffset"]), ("CommitLog Offset:", d["commitLogOffset"]),
            ("Reconsume Times:", d["reconsumeTimes"]),
            ("Born Timestamp:", human_ms(d["bornTimestamp"])),
            ("Store Timestamp:", human_ms(d["storeTimestamp"])), ("Born Host:", d["bornHost"]),
            ("Store Host:", d["storeHost"]), ("System Flag:", d["sysFlag"]),
            ("Properties:", _java(d["properties"])),
            ("Message Body:", d["body"] if d["body"] is not None
             else f"<{d['bodyLength']} bytes, not UTF-8: see --json bodyBase64>")]
    for k, v in rows:
        print(f"{k:<20} {v}")


def _java(v) -> str:
    """A value as Java's toString prints it: null, true/false, {k=v, k=v}.
    Every value a table or line shows goes through here."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={_java(x)}" for k, x in v.items()) + "}"
    return str(v)


def message_ext_line(m: dict) -> str:
    """A pulled message as consumeMessage and printMsg print it: MSGID,
    MessageExt's fields, BODY."""
    if "body" not in m:
        body = "NOT PRINT BODY"
    else:
        body = m["body"] if m["body"] is not None else f"<{m['bodyLength']} bytes, not text>"
    return (f"MSGID: {m['msgId']} MessageExt [brokerName={m['brokerName']}, "
            f"queueId={m['queueId']}, queueOffset={m['queueOffset']}, "
            f"storeTimestamp={m['storeTimestamp']}, tags={_java(m['tags'])}, "
            f"keys={_java(m['keys'])}, properties={_java(m['properties'])}] BODY: {body}")


def topic_config_line(tc: dict) -> str:
    """TopicConfig.toString."""
    return (f"TopicConfig [topicName={tc['topicName']}, readQueueNums={tc['readQueueNums']}, "
            f"writeQueueNums={tc['writeQueueNums']}, perm={perm_string(tc['perm'])}, "
            f"topicFilterType={tc['topicFilterType']}, topicSysFlag={tc['topicSysFlag']}, "
            f"order={_java(tc['order'])}]")


def _rule(n: int = 158) -> None:
    print("-" * n)


def update_topic(d: dict, args) -> None:
    for addr in d["brokers"]:
        print(f"create topic to {addr} success.")
    if d["orderConf"]:
        print(f"set orderConf. isOrder=true, orderConf=[{d['orderConf']}]")
    print(topic_config_line(d["topicConfig"]))


def delete_topic(d: dict, args) -> None:
    print(f"delete topic [{d['topic']}] from cluster [{d['cluster']}] success.")
    print(f"delete topic [{d['topic']}] from NameServer success.")


def topic_list(d: dict, args) -> None:
    if "topicList" in d:
        for t in d["topicList"]:
            print(t)
        return
    print(f"{'#Cluster Name':<20}  {'#Topic':<48}  {'#Consumer Group':<48}")
    for r in d["topics"]:
        for g in r["consumerGroups"] or [""]:
            print(f"{r['cluster']:<20}  {r['topic']:<64}  {g:<64}")


def topic_route(d: dict, args) -> None:
    if not args.list:
        print(json.dumps(d, indent=2, sort_keys=True))
        return
    fmt = "{:<45} {:<32} {:<50} {:<10} {:<11} {:<5}"
    print(fmt.format("#ClusterName", "#BrokerName", "#BrokerAddrs", "#ReadQueue", "#WriteQueue",
                     "#Perm"))
    qds = {q["brokerName"]: q for q in d.get("queueDatas") or []}
    read = write = 0
    for b in sorted(d.get("brokerDatas") or [], key=lambda b: b["brokerName"]):
        q = qds.get(b["brokerName"], {})
        read += q.get("readQueueNums", 0)
        write += q.get("writeQueueNums", 0)
        print(fmt.format(*(_java(v) for v in (
            b.get("cluster", ""), b["brokerName"], b.get("brokerAddrs"), q.get("readQueueNums", ""),
            q.get("writeQueueNums", ""), q.get("perm", "")))))
    _rule()
    print(fmt.format("Total:", len(qds), "", read, write, ""))


def topic_status(d: dict, args) -> None:
    print(f"{'#Broker Name':<32}  {'#QID':<4}  {'#Min Offset':<20}  {'#Max Offset':<20}    #Last Updated")
    for r in d["queues"]:
        ts = human_ms(r["lastUpdateTimestamp"]) if r["lastUpdateTimestamp"] > 0 else ""
        print(f"{r['brokerName']:<32}  {r['queueId']:<4}  {r['minOffset']:<20}  {r['maxOffset']:<20}    {ts}")


def _tps(table: dict, key: str) -> float:
    try:
        return float((table.get(key) or "0").split(" ")[0])
    except ValueError:
        return 0.0


def _delta(table: dict, later: str, earlier: str) -> int:
    try:
        return int(table.get(later) or 0) - int(table.get(earlier) or 0)
    except ValueError:
        return 0


def cluster_list(d: dict, args) -> None:
    if args.moreStats:
        print(f"{'#Cluster Name':<16}  {'#Broker Name':<32} {'#InTotalYest':>14} {'#OutTotalYest':>14} "
              f"{'#InTotalToday':>14} {'#OutTotalToday':>14}")
        for r in d["brokers"]:
            t = r["runtime"]
            print(f"{r['cluster']:<16}  {r['brokerName']:<32} "
                  f"{_delta(t, 'msgPutTotalTodayMorning', 'msgPutTotalYesterdayMorning'):>14} "
                  f"{_delta(t, 'msgGetTotalTodayMorning', 'msgGetTotalYesterdayMorning'):>14} "
                  f"{_delta(t, 'msgPutTotalTodayNow', 'msgPutTotalTodayMorning'):>14} "
                  f"{_delta(t, 'msgGetTotalTodayNow', 'msgGetTotalTodayMorning'):>14}")
        return
    print(f"{'#Cluster Name':<16}  {'#Broker Name':<22}  {'#BID':<4}  {'#Addr':<22} {'#Version':<16} "
          f"{'#InTPS':>9} {'#OutTPS':>9} {'#Hour':>7} {'#SPACE':>6}")
    now = time.time() * 1000
    for r in d["brokers"]:
        t = r["runtime"]
        version = t.get("brokerVersionDesc", "ERROR" if "error" in r else "")
        earliest = t.get("earliestMessageTimeStamp")
        hour = (now - int(earliest)) / 3_600_000 if earliest and earliest.isdigit() else 0.0
        try:
            space = float(t.get("commitLogDiskRatio") or 0)
        except ValueError:
            space = 0.0
        print(f"{r['cluster']:<16}  {r['brokerName']:<22}  {r['brokerId']:<4}  {r['addr']:<22} "
              f"{version:<16} {_tps(t, 'putTps'):>9.2f} {_tps(t, 'getTransferedTps'):>9.2f} "
              f"{hour:>7.2f} {space:>6.4f}")


def ha_status(d: dict, args) -> None:
    print(f"{'#Broker Name':<22}  {'#BID':<4}  {'#Addr':<22} {'#Role':<13} {'#CommitLogMaxOffset':>20} "
          f"{'#Slaves':>7} {'#SlaveAckOffset':>16} {'#Diff':>12}  #Status")
    warns = []
    for g in d["groups"]:
        for r in g["brokers"]:
            if "error" in r:
                print(f"{g['brokerName']:<22}  {r['brokerId']:<4}  {r['addr']:<22} ERROR: {r['error']}")
                continue
            print(f"{g['brokerName']:<22}  {r['brokerId']:<4}  {r['addr']:<22} {r['brokerRole']:<13} "
                  f"{r['commitLogMaxOffset']:>20} {r.get('haSlaveCount', '-'):>7} "
                  f"{r.get('haSlaveAckOffset', '-'):>16} {r.get('diff', '-'):>12}  "
                  f"{r.get('status', '-')}")
            if "why" in r:
                warns.append(f"WARN: slave {r['addr']} of {g['brokerName']}: {r['why']}")
        if "why" in g:
            warns.append(f"WARN: {g['brokerName']}: {g['why']}")
    if warns:
        print("\n" + "\n".join(warns))


def broker_status(d: dict, args) -> None:
    for addr, table in d["brokers"].items():
        for k in sorted(table):
            if args.brokerAddr:
                print(f"{k:<32}: {_java(table[k])}")
            else:
                print(f"{addr:<24} {k:<32}: {_java(table[k])}")


def get_broker_config(d: dict, args) -> None:
    for addr, props in d["brokers"].items():
        print(f"============{addr}============")
        for k, v in props.items():
            print(f"{k:<50}=  {_java(v)}")
        print()


def update_broker_config(d: dict, args) -> None:
    for addr in d["brokers"]:
        print(f"update broker config success, {addr}")


def wipe_write_perm(d: dict, args) -> None:
    for r in d["namesrvs"]:
        print(f"wipe write perm of broker[{d['brokerName']}] in name server[{r['namesrv']}] OK, "
              f"{r['wipeTopicCount']}")


def add_write_perm(d: dict, args) -> None:
    for r in d["namesrvs"]:
        print(f"add write perm of broker[{d['brokerName']}] in name server[{r['namesrv']}] OK, "
              f"{r['addTopicCount']}")


def consumer_progress(d: dict, args) -> None:
    if "groups" in d:
        print(f"{'#Group':<64}  {'#Count':<6}  {'#Version':<24} {'#Type':<5}  {'#Model':<14}  "
              f"{'#TPS':<7}  #Diff Total")
        for g in d["groups"]:
            online = g["count"] > 0
            ctype = ("PULL" if g["consumeType"] == "CONSUME_ACTIVELY" else "PUSH") if online else ""
            model = g["messageModel"] if online and g["consumeType"] == "CONSUME_PASSIVELY" else ""
            version = version_desc(g["version"]) if online else "OFFLINE"
            print(f"{g['group']:<64}  {g['count']:<6}  {version:<24} {ctype:<5}  {model or '':<14}  "
                  f"{g['consumeTps']:<7}  {g['diffTotal']}")
        return
    print(f"{'#Topic':<64}  {'#Broker Name':<32}  {'#QID':<4}  {'#Broker Offset':<20}  "
          f"{'#Consumer Offset':<20}  {'#Diff':<20}  #LastTime")
    for r in d["queues"]:
        last = human_date(r["lastTimestamp"]) if r["lastTimestamp"] else "N/A"
        print(f"{r['topic']:<64}  {r['brokerName']:<32}  {r['queueId']:<4}  {r['brokerOffset']:<20}  "
              f"{r['consumerOffset']:<20}  {r['diff']:<20}  {last}")
    print()
    print(f"Consume TPS: {d['consumeTps']:.2f}")
    print(f"Diff Total: {d['diffTotal']}")


def consumer_connection(d: dict, args) -> None:
    print(f"{'#ClientId':<36} {'#ClientAddr':<22} {'#Language':<10} #Version")
    for c in d["connectionSet"]:
        print(f"{c['clientId']:<36} {c['clientAddr']:<22} {c['language']:<10} "
              f"{version_desc(c['version'])}")
    print("\nBelow is subscription:")
    print(f"{'#Topic':<20} #SubExpression")
    for sd in (d.get("subscriptionTable") or {}).values():
        print(f"{sd['topic']:<20} {sd['subString']}")
    print()
    print(f"ConsumeType: {d.get('consumeType')}")
    print(f"MessageModel: {d.get('messageModel')}")
    print(f"ConsumeFromWhere: {d.get('consumeFromWhere')}")


def reset_offset_by_time(d: dict, args) -> None:
    print(f"rollback consumer offset by specified group[{d['group']}], topic[{d['topic']}], "
          f"force[{_java(d['force'])}], timestamp(long)[{d['timestamp']}]")
    _offset_table(d["offsets"])


def _consume_results(d: dict) -> bool:
    """ConsumeMessageDirectlyResult.toString of each -g -d result, if asked."""
    for r in d.get("consumeResults") or []:
        print(f"ConsumeMessageDirectlyResult [order={_java(r.get('order'))}, "
              f"autoCommit={_java(r.get('autoCommit'))}, consumeResult={_java(r.get('consumeResult'))}, "
              f"remark={_java(r.get('remark'))}, spentTimeMills={_java(r.get('spentTimeMills'))}]")
    return "consumeResults" in d


def query_msg_by_id(d: dict, args) -> None:
    if _consume_results(d):
        return
    for i, m in enumerate(d["messages"]):
        if i:
            print()
        print_message(m)


def query_msg_by_key(d: dict, args) -> None:
    print(f"{'#Message ID':<50} {'#QID':>4} {'#Offset':>40}")
    for m in d["messages"]:
        print(f"{m['msgId']:<50} {m['queueId']:>4} {m['queueOffset']:>40}")


def send_message(d: dict, args) -> None:
    print(f"{'#Broker Name':<32}  {'#QID':<4}  {'#Send Result':<20}    #MsgId")
    print(f"{d['brokerName']:<32}  {d['queueId']:<4}  {d['sendStatus']:<20}    {d['msgId']}")


def consume_message(d: dict, args) -> None:
    for m in d["messages"]:
        print(message_ext_line(m))
    print(f"Consumed {len(d['messages'])} message(s) of topic {d['topic']}")


query_msg_by_offset = query_msg_by_id


def _offset_table(rows: list[dict]) -> None:
    print(f"{'#brokerName':<40}  {'#queueId':<40}  {'#offset':<40}")
    for r in rows:
        print(f"{r['brokerName']:<40}  {r['queueId']:<40}  {r['offset']:<40}")


def skip_accumulated_message(d: dict, args) -> None:
    if not d["consumerOffline"]:
        _offset_table(d["offsets"])
        return
    cols = ("#brokerName", "#queueId", "#brokerOffset", "#consumerOffset", "#timestampOffset",
            "#rollbackOffset")
    print("  ".join(f"{c:<20}" for c in cols))
    for r in d["offsets"]:
        print("  ".join(f"{v:<20}" for v in (r["brokerName"], r["queueId"], r["brokerOffset"],
                                             r["consumerOffset"], r["timestampOffset"], r["offset"])))


def clone_group_offset(d: dict, args) -> None:
    print(f"clone group offset success. srcGroup[{d['srcGroup']}], destGroup=[{d['destGroup']}], "
          f"topic[{d['topic']}]")


def update_sub_group(d: dict, args) -> None:
    for addr in d["brokers"]:
        print(f"create subscription group to {addr} success.")
    c = d["subscriptionGroupConfig"]
    print("SubscriptionGroupConfig [" + ", ".join(f"{k}={_java(v)}" for k, v in c.items()) + "]")


def delete_sub_group(d: dict, args) -> None:
    for addr in d["brokers"]:
        if d["cluster"]:
            print(f"delete subscription group [{d['group']}] from broker [{addr}] in cluster "
                  f"[{d['cluster']}] success.")
        else:
            print(f"delete subscription group [{d['group']}] from broker [{addr}] success.")
    for topic in d["deletedTopics"]:
        print(f"delete topic [{topic}] from cluster [{d['cluster']}] success.")
        print(f"delete topic [{topic}] from NameServer success.")


def update_topic_perm(d: dict, args) -> None:
    for r in d["brokers"]:
        if not r["changed"]:
            print(f"new perm equals to the old one! ({r['addr']})")
            continue
        print(f"update topic perm from {r['oldPerm']} to {r['perm']} in {r['addr']} success.")
        if args.brokerAddr:
            print(f"{topic_config_line(r['topicConfig'])}.")


def topic_cluster_list(d: dict, args) -> None:
    for c in d["clusters"]:
        print(c)


def query_msg_by_unique_key(d: dict, args) -> None:
    if _consume_results(d):
        return
    for i, m in enumerate(d["messages"]):
        if i:
            print()
        print_message(m, ids=False)


def get_namesrv_config(d: dict, args) -> None:
    for ns, props in d["namesrvs"].items():
        print(f"============{ns}============")
        for k, v in props.items():
            print(f"{k:<50}=  {v}")


def update_namesrv_config(d: dict, args) -> None:
    print(f"update name server config success![{', '.join(d['namesrvs'])}]")
    print(f"{d['key']} : {d['value']}")


def print_msg_queue_start(topic: str, q: dict) -> None:
    print(f"minOffset={q['minOffset']}, maxOffset={q['maxOffset']}, MessageQueue "
          f"[topic={topic}, brokerName={q['brokerName']}, queueId={q['queueId']}]")


def print_msg_pulled(topic: str, q: dict, found: list[dict], next_offset: int) -> None:
    """One pull's messages, or mqadmin's line for a pull that found none."""
    for m in found:
        print(message_ext_line(m))
    if found:
        return
    mq = f"MessageQueue [topic={topic}, brokerName={q['brokerName']}, queueId={q['queueId']}]"
    if q["status"] == "NO_MATCHED_MSG":
        print(f"{mq} no matched msg. status={q['status']}, offset={next_offset}")
    else:
        print(f"{mq} print msg finished. status={q['status']}, offset={next_offset}")


def print_msg_queue_end() -> None:
    print("--------------------------------------------------------")


def print_msg(d: dict, args) -> None:
    """Nothing left: the messages were printed as they were pulled."""


def _store_cleanup(d: dict, args) -> None:
    print("success" if d["result"] else "false")


clean_expired_cq = delete_expired_commit_log = _store_cleanup


def producer_connection(d: dict, args) -> None:
    for i, c in enumerate(d["connectionSet"], 1):
        print(f"{i:04d}  {c['clientId']:<32} {c['clientAddr']:<22} {c['language']:<8} "
              f"{version_desc(c['version'])}")


def broker_consume_stats(d: dict, args) -> None:
    print(f"{'#Topic':<64}  {'#Group':<64}  {'#Broker Name':<32}  {'#QID':<4}  {'#Broker Offset':<20}  "
          f"{'#Consumer Offset':<20}  {'#Diff':<20}  #LastTime")
    for r in d["queues"]:
        if r["lastTimestamp"] > 0:          # mqadmin prints the queues consumed from only
            print(f"{r['topic']:<64}  {r['group']:<64}  {r['brokerName']:<32}  {r['queueId']:<4}  "
                  f"{r['brokerOffset']:<20}  {r['consumerOffset']:<20}  {r['diff']:<20}  "
                  f"{human_date(r['lastTimestamp'])}")
    print(f"\nDiff Total: {d['totalDiff']}")


def stats_all(d: dict, args) -> None:
    print(f"{'#Topic':<64}  {'#Consumer Group':<64} {'#Accumulation':>12} {'#InTPS':>11} "
          f"{'#OutTPS':>11} {'#InMsg24Hour':>14} {'#OutMsg24Hour':>14}")
    for r in d["stats"]:
        if r["group"] is None:
            print(f"{r['topic']:<64}  {'':<64} {0:>12} {r['inTps']:>11.2f} {'':>11} "
                  f"{r['inMsg24Hour']:>14} {'NO_CONSUMER':>14}")
        else:
            print(f"{r['topic']:<64}  {r['group']:<64} {r['accumulation']:>12} {r['inTps']:>11.2f} "
                  f"{r['outTps']:>11.2f} {r['inMsg24Hour']:>14} {r['outMsg24Hour']:>14}")


def query_msg_trace_by_id(d: dict, args) -> None:
    """QueryMsgTraceByIdSubCommand.printMessageTrace: each Pub record, then
    the SubAfter records grouped by consumer group."""
    fmt = "{:<10} {:<20} {:<20} {:<20} {:<10} {:<10}"
    consumed: dict[str, list[dict]] = {}
    for t in d["traces"]:
        if t["traceType"] == "Pub":
            print(fmt.format("#Type", "#ProducerGroup", "#ClientHost", "#SendTime", "#CostTimes", "#Status"))
            print(fmt.format("Pub", t["groupName"], t["clientHost"], human_date(t["timeStamp"]),
                             f"{t['costTime']}ms", t["status"]))
            print()
        elif t["traceType"] == "SubAfter":
            consumed.setdefault(t["groupName"], []).append(t)
    for views in consumed.values():
        print(fmt.format("#Type", "#ConsumerGroup", "#ClientHost", "#ConsumerTime", "#CostTimes", "#Status"))
        for t in views:
            print(fmt.format("Sub", t["groupName"], t["clientHost"], human_date(t["timeStamp"]),
                             f"{t['costTime']}ms", t["status"]))
        print()


def consumer_status(d: dict, args) -> None:
    """mqadmin's consumerStatus: with -i the member's ConsumerRunningInfo
    (formatString); without, a line per member (the running infos are in
    --json: no file is written, as mqadmin writes one per member) and the
    checks over them."""
    if args.clientId:
        [c] = d["clients"]
        print(running_info_text(c["runningInfo"]), end="")
        return
    print(f"{'#Index':<10} {'#ClientId':<40} {'#Version':<20} #Status")
    for i, c in enumerate(d["clients"], 1):
        print(f"{i:<10} {c['clientId']:<40} {version_desc(c['version']):<20} "
              f"{c.get('error') or 'ok'}")
    if d["subscriptionSame"] is None:
        return
    if not d["subscriptionSame"]:
        print("\n\nWARN: Different subscription in the same group of consumer!!!")
        return
    print("\n\nSame subscription in the same group of consumer")
    print(f"\n\nRebalance {'OK' if d['rebalanceOK'] else 'Failed'}")
    for w in d["warnings"]:
        print(w)


def running_info_text(info: dict) -> str:
    """ConsumerRunningInfo.formatString."""
    out = ["#Consumer Properties#\n"]
    out += [f"{k:<40}: {_java(v)}\n" for k, v in (info.get("properties") or {}).items()]
    out.append("\n\n#Consumer Subscription#\n")
    for i, sd in enumerate(info.get("subscriptionSet") or [], 1):
        out.append(f"{i:03d} Topic: {sd.get('topic'):<40} ClassFilter: "
                   f"{_java(bool(sd.get('classFilterMode'))):<8} SubExpression: {sd.get('subString')}\n")
    out.append("\n\n#Consumer Offset#\n")
    out.append(f"{'#Topic':<64}  {'#Broker Name':<32}  {'#QID':<4}  {'#Consumer Offset':<20}\n")
    mqs = info.get("mqTable") or []
    out += [f"{q['topic']:<32}  {q['brokerName']:<32}  {q['queueId']:<4}  {q.get('commitOffset', 0):<20}\n"
            for q in mqs]
    out.append("\n\n#Consumer MQ Detail#\n")
    out.append(f"{'#Topic':<64}  {'#Broker Name':<32}  {'#QID':<4}  {'#ProcessQueueInfo':<20}\n")
    for q in mqs:
        detail = ", ".join(f"{k}={_java(v)}" for k, v in q.items()
                           if k not in ("topic", "brokerName", "queueId"))
        out.append(f"{q['topic']:<64}  {q['brokerName']:<32}  {q['queueId']:<4}  "
                   f"ProcessQueueInfo [{detail}]\n")
    out.append("\n\n#Consumer RT&TPS#\n")
    out.append(f"{'#Topic':<64}  {'#Pull RT':>14} {'#Pull TPS':>14} {'#Consume RT':>14} "
               f"{'#ConsumeOK TPS':>14} {'#ConsumeFailed TPS':>18} {'#ConsumeFailedMsgsInHour':>25}\n")
    for topic, st in (info.get("statusTable") or {}).items():
        out.append(f"{topic:<32}  {st.get('pullRT', 0):>14.2f} {st.get('pullTPS', 0):>14.2f} "
                   f"{st.get('consumeRT', 0):>14.2f} {st.get('consumeOKTPS', 0):>14.2f} "
                   f"{st.get('consumeFailedTPS', 0):>18.2f} {st.get('consumeFailedMsgs', 0):>25}\n")
    if info.get("jstack") is not None:
        out.append("\n\n#Consumer jstack#\n" + str(info["jstack"]))
    return "".join(out)
