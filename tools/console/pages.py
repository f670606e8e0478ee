"""What each console page and action asks, and what it shows.

Every question is one ``shmq admin`` command's (``admin_commands``): a
form's fields are that command's long flag names (``topic``,
``clusterName``, ``timestamp`` …), read by the command's own flag
definitions from ``admin.COMMANDS`` (``admin_args``), so a field is checked
exactly as the flag is and a bad one is named as mqadmin names it. The
answer, plain data with RocketMQ's field names, is drawn as tables here.
One thing mqadmin has no command for is here: resending a dead letter
(``resend_dead_letter``).

A page function takes an ``AdminClient`` (one per request: connections to
the NameServer and brokers for the request's life) and the request's
fields, and returns ``(title, body, notice)``. Whatever the user can get
wrong (a malformed field: ``BadInput``; an unknown topic or group, a broker
that refuses or does not answer: ``AdminError``) is raised with a sentence
that the server shows on the page; where a page has several parts, a part
that fails shows its sentence in place and the rest of the page stays.
"""
from __future__ import annotations

import argparse
import base64
import re
import time
from types import SimpleNamespace

from shmq.core.layout import properties_to_string
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.headers import send_ext
from shmq.ipc.remoting import RemotingCommand

from .. import admin
from .. import admin_commands as cmds
from ..admin_client import DLQ_PREFIX, RETRY_PREFIX, AdminClient, AdminError
from ..msg_trace import query_msg_trace
from .html import (Html, checkbox, esc, form, hidden, kv_table, link, ms_text, select, table,
                   text_input, tps_chart)

QUERY_MESSAGES = 64            # messages a time-range query shows at most
# properties a resent dead letter does not carry over: the pull's range and
# the retry's delay level (it is resent to be consumed now)
NOT_RESENT = ("MIN_OFFSET", "MAX_OFFSET", "DELAY", "TRAN_MSG")
# a resent dead letter's maxReconsumeTimes (a send to a %RETRY% topic must
# carry one: older 4.x brokers read it without a null check): RocketMQ's
# default retryMaxTimes, so the group's consumers retry it as any message
RESEND_MAX_RECONSUME_TIMES = 16


class BadInput(Exception):
    """A form field the user must correct (HTTP 400, the sentence on the page)."""


class Failed(Exception):
    """A page that failed after its forms were drawn: shown with the error
    (HTTP 400), so the user corrects the field in place."""

    def __init__(self, title: str, body: Html, error: Exception):
        super().__init__(str(error))
        self.title, self.body = title, body


# the forms' labels of fields whose flag name a user does not see on the page
LABELS = {"producerGroup": "Producer group", "beginTimestamp": "From", "endTimestamp": "To",
          "timestamp": "Time", "readQueueNums": "Read queues", "writeQueueNums": "Write queues",
          "msgKey": "Key", "msgId": "Message id", "key": "Keys", "brokerAddr": "Broker address",
          "clusterName": "Cluster", "groupName": "Group"}


class _FormParser(argparse.ArgumentParser):
    def error(self, message):
        """argparse's "argument -s/--beginTimestamp: …" → "From (beginTimestamp): …"."""
        m = re.match(r"argument (?:-\w+/)?--(\w+): (.*)", message, re.S)
        if m:
            name, why = m.groups()
            message = f"{LABELS[name]} ({name}): {why}" if name in LABELS else f"{name}: {why}"
        message = re.sub(r"(?:-\w+/)?--(\w+)", r"\1", message)     # any other flag: its field
        raise BadInput(message.replace("the following arguments are required", "a value is needed in"))


_FLAGS = {name: (flags, check) for name, _, flags, check in admin.COMMANDS}


def admin_args(command: str, **fields) -> argparse.Namespace:
    """The form's ``fields`` (long flag name → text; empty ones left out)
    read as ``shmq admin <command>`` reads its flags (``--name=value``, so
    a value may start with a dash)."""
    flags, check = _FLAGS[command]
    p = _FormParser(prog=command, add_help=False)
    flags(p)
    args = p.parse_args([f"--{name}={value}" for name, value in fields.items()
                         if value is not None and str(value).strip() != ""])
    if check is not None:
        check(p, args)
    return args


def _mqadmin_time(ms: int) -> str:
    """ms → mqadmin's yyyy-MM-dd#HH:mm:ss:SSS (local time), what the time fields take."""
    t = time.localtime(ms // 1000)
    return time.strftime("%Y-%m-%d#%H:%M:%S", t) + f":{ms % 1000:03d}"


def _now_ms() -> int:
    return int(time.time() * 1000)


# ------------------------------------------------------------------ cluster
def cluster(c, a: AdminClient, q: dict):
    rows, charts = [], []
    for r in cmds.cluster_list(SimpleNamespace(moreStats=False), a)["brokers"]:
        t = r["runtime"]
        rows.append([r["cluster"], r["brokerName"], r["brokerId"],
                     link("/broker", r["addr"], addr=r["addr"]),
                     t.get("brokerVersionDesc", ""), t.get("putTps", ""),
                     t.get("getTransferedTps", ""), t.get("msgPutTotalTodayNow", ""),
                     t.get("msgGetTotalTodayNow", ""), t.get("commitLogDiskRatio", ""),
                     r.get("error", "")])
        charts.append(tps_chart(f"{r['brokerName']} ({r['addr']})", c.sampler.samples(r["addr"])))
    body = table(["Cluster", "Broker", "BID", "Address", "Version", "Put TPS (10s 1m 10m)",
                  "Get TPS (10s 1m 10m)", "Put today", "Get today", "Disk ratio", "Error"], rows)
    body += Html(f"<h2>TPS over time</h2><p class=note>sampled every {c.sampler.interval_s:g} s "
                 f"(GET_BROKER_RUNTIME_INFO), the 10 s rates; reload to redraw</p>")
    if c.sampler.last_error:
        body += Html(f'<p class="error">the last sample failed: {esc(c.sampler.last_error)}</p>')
    body += Html("".join(charts))
    return "Cluster", body, None


def broker(c, a: AdminClient, q: dict):
    args = admin_args("brokerStatus", brokerAddr=q.get("addr", ""), clusterName=None)
    status = cmds.broker_status(args, a)["brokers"][args.brokerAddr]
    body = tps_chart(f"TPS of {args.brokerAddr}", c.sampler.samples(args.brokerAddr))
    body += Html("<h2>Runtime status</h2>") + kv_table(dict(sorted(status.items())))
    return f"Broker {args.brokerAddr}", body, None


# ------------------------------------------------------------------ topics
def _clusters(a: AdminClient) -> list[str]:
    return sorted(a.cluster_info()["clusterAddrTable"])


def topics(c, a: AdminClient, q: dict, notice: str | None = None):
    listed = cmds.topic_list(SimpleNamespace(clusterModel=True), a)["topics"]
    rows = [[link("/topic", t["topic"], topic=t["topic"]), t["cluster"],
             Html(", ".join(link("/group", g, group=g) for g in t["consumerGroups"]))]
            for t in listed]
    system = [t for t in a.topic_list() if t.startswith((RETRY_PREFIX, DLQ_PREFIX))]
    clusters = _clusters(a)
    body = form("/topic/create", [
        text_input("topic", "Topic"), select("clusterName", "Cluster", clusters),
        text_input("readQueueNums", "Read queues", 8, size=3),
        text_input("writeQueueNums", "Write queues", 8, size=3),
        select("perm", "Perm", ["6", "4", "2"]), select("order", "Order", ["false", "true"])],
        "Create topic")
    body += table(["Topic", "Cluster", "Consumer groups"], rows)
    body += Html("<h2>Retry and dead-letter topics</h2>")
    body += table(["Topic"], [[link("/topic", t, topic=t)] for t in system])
    return "Topics", body, notice


def topic_create(c, a: AdminClient, q: dict):
    args = admin_args("updateTopic", topic=q.get("topic"), clusterName=q.get("clusterName"),
                      readQueueNums=q.get("readQueueNums"), writeQueueNums=q.get("writeQueueNums"),
                      perm=q.get("perm"), order=q.get("order"))
    done = cmds.update_topic(args, a)
    return topics(c, a, {}, f"Topic {args.topic} created on {', '.join(done['brokers'])}")


def topic(c, a: AdminClient, q: dict, notice: str | None = None):
    args = admin_args("topicRoute", topic=q.get("topic"))
    route = cmds.topic_route(args, a)
    brokers = [[b["brokerName"], b.get("cluster", ""),
                ", ".join(f"{bid}={ad}" for bid, ad in sorted((b.get("brokerAddrs") or {}).items()))]
               for b in route.get("brokerDatas") or []]
    queues = [[d["brokerName"], d["readQueueNums"], d["writeQueueNums"], d["perm"],
               d.get("topicSysFlag", 0)] for d in route.get("queueDatas") or []]
    body = Html("<h2>Route</h2>") + table(["Broker", "Cluster", "Addresses"], brokers)
    body += table(["Broker", "Read queues", "Write queues", "Perm", "Sys flag"], queues, {1, 2, 3, 4})
    body += Html("<h2>Status</h2>")
    try:
        rows = [[s["brokerName"], s["queueId"], s["minOffset"], s["maxOffset"],
                 ms_text(s.get("lastUpdateTimestamp"))]
                for s in cmds.topic_status(args, a)["queues"]]
        body += table(["Broker", "Queue", "Min offset", "Max offset", "Last update"], rows, {1, 2, 3})
    except AdminError as e:
        body += Html(f'<p class="error">{esc(e)}</p>')
    masters = a.route_masters(route)
    groups = a.topic_consumed_by(masters[0][1], args.topic) if masters else []
    body += Html("<h2>Consumer groups</h2><p>" + (", ".join(link("/group", g, group=g) for g in groups)
                                                 or "none") + "</p>")
    now = _now_ms()
    body += Html("<p>") + link("/messages", "Messages of the last hour", by="time", topic=args.topic,
                               beginTimestamp=_mqadmin_time(now - 3_600_000),
                               endTimestamp=_mqadmin_time(now)) + Html("</p>")
    body += Html("<h2>Send a message</h2>") + form("/topic/send", [
        hidden("topic", args.topic), text_input("tags", "Tags"), text_input("key", "Keys"),
        text_input("body", "Body", size=24)], "Send")
    body += Html("<h2>Delete</h2>") + form("/topic/delete", [
        hidden("topic", args.topic), select("clusterName", "From cluster", _clusters(a)),
        checkbox("confirm", f"yes, delete {args.topic}")], "Delete topic")
    return f"Topic {args.topic}", body, notice


def topic_send(c, a: AdminClient, q: dict):
    args = admin_args("sendMessage", topic=q.get("topic"), body=q.get("body"), key=q.get("key"),
                      tags=q.get("tags"))
    r = cmds.send_message(args, a)
    return topic(c, a, {"topic": args.topic},
                 f"Sent {r['msgId']} ({r['sendStatus']}) to {r['brokerName']} queue {r['queueId']} "
                 f"offset {r['queueOffset']}")


def topic_delete(c, a: AdminClient, q: dict):
    args = admin_args("deleteTopic", topic=q.get("topic"), clusterName=q.get("clusterName"))
    if q.get("confirm") != "true":
        raise BadInput(f"tick 'yes, delete {args.topic}' to delete the topic")
    done = cmds.delete_topic(args, a)
    return topics(c, a, {}, f"Topic {args.topic} deleted from {', '.join(done['brokers'])} and "
                            f"the NameServer")


# ------------------------------------------------------------------ consumer groups
def groups(c, a: AdminClient, q: dict):
    rows = [[link("/group", g["group"], group=g["group"]), g["count"], g["version"] or "",
             g["consumeType"] or "", g["messageModel"] or "", g["consumeTps"], g["diffTotal"]]
            for g in cmds.consumer_progress(SimpleNamespace(groupName=None), a)["groups"]]
    return "Consumer groups", table(["Group", "Clients", "Version", "Type", "Model", "TPS", "Lag"],
                                    rows, {1, 5, 6}), None


def group(c, a: AdminClient, q: dict, notice: str | None = None, result: Html = Html("")):
    args = admin_args("consumerProgress", groupName=q.get("group"))
    g = args.groupName
    body = result
    topics_seen = []
    body += Html("<h2>Lag per queue</h2>")
    try:
        p = cmds.consumer_progress(args, a)
        rows = [[r["topic"], r["brokerName"], r["queueId"], r["brokerOffset"], r["consumerOffset"],
                 r["diff"], ms_text(r.get("lastTimestamp"))] for r in p["queues"]]
        body += Html(f"<p>consume TPS {p['consumeTps']:.2f}, total lag {p['diffTotal']}</p>")
        body += table(["Topic", "Broker", "Queue", "Broker offset", "Consumer offset", "Lag",
                       "Last consumed"], rows, {2, 3, 4, 5})
        topics_seen += [r["topic"] for r in p["queues"]]
    except AdminError as e:
        unknown = e               # and if no broker lists a connection either: an unknown group
        body += Html(f'<p class="error">{esc(e)}</p>')
    else:
        unknown = None
    body += Html("<h2>Connections</h2>")
    try:
        cc = cmds.examine_connection(a, g)
        body += Html(f"<p>{esc(cc.get('consumeType'))} {esc(cc.get('messageModel'))} "
                     f"{esc(cc.get('consumeFromWhere'))}</p>")
        body += table(["Client id", "Address", "Language", "Version"],
                      [[x["clientId"], x["clientAddr"], x["language"], x["version"]]
                       for x in cc["connectionSet"]])
        subs = cc.get("subscriptionTable") or {}
        body += table(["Subscribed topic", "Expression"],
                      [[t, s.get("subString", "")] for t, s in sorted(subs.items())])
        topics_seen += list(subs)
    except AdminError as e:
        if unknown is not None:
            raise unknown from None
        body += Html(f'<p class="note">{esc(e)}</p>')
    user_topics = sorted({t for t in topics_seen if not t.startswith(RETRY_PREFIX)}) or [""]
    body += Html("<h2>Reset offset by time</h2>") + form("/group/reset", [
        hidden("group", g), text_input("topic", "Topic", user_topics[0]),
        text_input("timestamp", "Time", _mqadmin_time(_now_ms() - 3_600_000),
                   "now | ms | yyyy-MM-dd#HH:mm:ss:SSS", 14),
        select("force", "Force", ["true", "false"])], "Reset offset")
    body += Html("<h2>Skip backlog</h2>") + form("/group/skip", [
        hidden("group", g), text_input("topic", "Topic", user_topics[0])], "Skip accumulated messages")
    return f"Consumer group {g}", body, notice


def _offsets_table(d: dict) -> Html:
    return table(["Broker", "Queue", "New offset"],
                 [[r["brokerName"], r["queueId"], r["offset"]] for r in d["offsets"]], {1, 2})


def group_reset(c, a: AdminClient, q: dict):
    args = admin_args("resetOffsetByTime", group=q.get("group"), topic=q.get("topic"),
                      timestamp=q.get("timestamp"), force=q.get("force"))
    d = cmds.reset_offset_by_time(args, a)
    how = "committed here (no consumer online)" if d["consumerOffline"] else "sent to its consumers"
    return group(c, a, {"group": args.group},
                 f"Offsets of {args.group} in {args.topic} reset to {q.get('timestamp')}: {how}",
                 _offsets_table(d))


def group_skip(c, a: AdminClient, q: dict):
    args = admin_args("skipAccumulatedMessage", group=q.get("group"), topic=q.get("topic"))
    d = cmds.skip_accumulated_message(args, a)
    return group(c, a, {"group": args.group},
                 f"Backlog of {args.group} in {args.topic} skipped", _offsets_table(d))


# ------------------------------------------------------------------ producers
def _producers(a: AdminClient, group_name: str, topic_name: str) -> list[dict]:
    args = admin_args("producerConnection", producerGroup=group_name, topic=topic_name)
    return cmds.producer_connection(args, a)["connectionSet"]


def producers(c, a: AdminClient, q: dict):
    group_name, topic_name = (q.get("producerGroup") or "").strip(), q.get("topic") or ""
    body = form("/producers", [text_input("producerGroup", "Producer group", group_name),
                               text_input("topic", "Topic", topic_name)], "Show connections", "get")
    if "producerGroup" in q:
        try:
            conns = _producers(a, group_name, topic_name)
        except (BadInput, AdminError) as e:
            raise Failed("Producers", body, e) from None
        body += table(["Client id", "Address", "Language", "Version"],
                      [[x["clientId"], x["clientAddr"], x["language"], x["version"]] for x in conns])
    return "Producers", body, None


# ------------------------------------------------------------------ messages
def messages(c, a: AdminClient, q: dict):
    now = _now_ms()
    by = q.get("by")
    topic_name = q.get("topic", "")
    body = form("/messages", [
        hidden("by", "key"), text_input("topic", "Topic", topic_name if by == "key" else ""),
        text_input("msgKey", "Key", q.get("msgKey", ""))], "Query by key", "get")
    body += form("/messages", [
        hidden("by", "id"), text_input("msgId", "Message id", q.get("msgId", ""), size=22),
        text_input("topic", "Topic (for a client msgId)", topic_name if by == "id" else "")],
        "Query by id", "get")
    body += form("/messages", [
        hidden("by", "time"), text_input("topic", "Topic", topic_name if by == "time" else ""),
        text_input("beginTimestamp", "From", q.get("beginTimestamp") or _mqadmin_time(now - 3_600_000),
                   size=14),
        text_input("endTimestamp", "To", q.get("endTimestamp") or _mqadmin_time(now), size=14)],
        "Query by time", "get")
    if by is None:
        return "Messages", body, None
    try:
        found = _query(a, q, by, topic_name)
    except (BadInput, AdminError) as e:
        raise Failed("Messages", body, e) from None
    rows = [[link("/message", m["msgId"], msgId=m["offsetMsgId"]), m["topic"], m["tags"] or "",
             m["keys"] or "", m["brokerName"], m["queueId"], m["queueOffset"],
             ms_text(m["storeTimestamp"]), m["bodyLength"]] for m in found]
    body += Html(f"<h2>{len(rows)} message(s)</h2>")
    if by == "time" and len(rows) == QUERY_MESSAGES:
        body += Html(f'<p class="note">the first {QUERY_MESSAGES}; narrow the time range</p>')
    body += table(["Message id", "Topic", "Tags", "Keys", "Broker", "Queue", "Offset", "Stored",
                   "Body bytes"], rows, {5, 6, 8})
    return "Messages", body, None


def _query(a: AdminClient, q: dict, by: str, topic_name: str) -> list[dict]:
    if by == "key":
        return cmds.query_msg_by_key(admin_args("queryMsgByKey", topic=topic_name,
                                                msgKey=q.get("msgKey")), a)["messages"]
    if by == "id":
        return cmds.query_msg_by_id(admin_args("queryMsgById", msgId=q.get("msgId"),
                                               topic=topic_name), a)["messages"]
    if by == "time":
        return _by_time(a, admin_args("consumeMessage", topic=topic_name,
                                      beginTimestamp=q.get("beginTimestamp"),
                                      endTimestamp=q.get("endTimestamp"),
                                      MessageNumber=QUERY_MESSAGES))
    raise BadInput(f"by={by}: want key, id or time")


def _by_time(a: AdminClient, args) -> list[dict]:
    """The first QUERY_MESSAGES messages stored between the times, oldest
    first, as the dashboard's queryMessageByTopic finds them: each queue
    from its offset at the begin time (consumeMessage -b -i -s), keeping
    what was stored up to the end time. (consumeMessage -e would stop
    before the offset at the end time, which is a queue's last message
    when the end is after it.)"""
    end = args.endTimestamp if args.endTimestamp is not None else _now_ms()
    found = []
    for name, _, qid in cmds.readable_queues(a, a.route(args.topic), args.topic):
        one = argparse.Namespace(**{**vars(args), "brokerName": name, "queueId": qid,
                                    "endTimestamp": None})
        found += [m for m in cmds.consume_message(one, a)["messages"] if m["storeTimestamp"] <= end]
    found.sort(key=lambda m: m["storeTimestamp"])
    return found[:QUERY_MESSAGES]


def _find(a: AdminClient, q: dict) -> dict:
    msg_id = (q.get("msgId") or "").strip()
    if "," in msg_id:
        raise BadInput("msgId: one message id, please")
    return cmds.query_msg_by_id(admin_args("queryMsgById", msgId=msg_id, topic=q.get("topic")),
                                a)["messages"][0]


def message(c, a: AdminClient, q: dict, notice: str | None = None):
    m = _find(a, q)
    fields = {k: m[k] for k in ("msgId", "offsetMsgId", "topic", "tags", "keys", "brokerName",
                                "queueId", "queueOffset", "commitLogOffset", "reconsumeTimes",
                                "bornHost", "storeHost", "sysFlag", "bodyLength")}
    fields["bornTimestamp"] = ms_text(m["bornTimestamp"])
    fields["storeTimestamp"] = ms_text(m["storeTimestamp"])
    body = kv_table(fields) + Html("<h2>Properties</h2>") + kv_table(m["properties"])
    body += Html("<h2>Body</h2>")
    if m["body"] is not None:
        body += Html(f"<pre>{esc(m['body'])}</pre>")
    else:
        body += Html(f'<p class="note">not UTF-8 text; base64:</p><pre>{esc(m["bodyBase64"])}</pre>')
    if m["topic"].startswith(DLQ_PREFIX):
        g = m["topic"][len(DLQ_PREFIX):]
        body += Html("<h2>Dead letter</h2>") + form("/message/resend", [
            hidden("msgId", m["offsetMsgId"])], f"Resend to consumer group {g}")
    body += Html("<h2>Trace</h2>")
    try:
        trace = query_msg_trace(a, m["msgId"])
        body += table(["Type", "Time", "Group", "Client", "Cost ms", "Status", "Retry", "Store host"],
                      [[v["traceType"], ms_text(v["timeStamp"]), v["groupName"], v["clientHost"],
                        v["costTime"], v["status"], v["retryTimes"], v["storeHost"]] for v in trace]) \
            if trace else Html('<p class="note">no trace record of this message</p>')
    except AdminError as e:
        body += Html(f'<p class="note">{esc(e)}</p>')
    return f"Message {m['msgId']}", body, notice


def resend_dead_letter(a: AdminClient, m: dict) -> dict:
    """A dead letter (``message_dict`` of a %DLQ%<group> message) sent again
    to %RETRY%<group>, to the master of the broker that holds it if it
    serves that topic: every consumer of the group subscribes to its retry
    topic, and restores the original topic from RETRY_TOPIC (which the
    broker set when it gave up). reconsumeTimes starts again at 0, the
    msgId (UNIQ_KEY), keys and tags stay; the send is a SEND_MESSAGE_V2
    as a client's fallback of sendMessageBack makes it (client/retry.py).
    Works on any 4.x broker, with
    the group's consumers online or not (they get it when they come);
    rocketmq-dashboard instead asks one online consumer to consume it
    directly (CONSUME_MESSAGE_DIRECTLY), which needs one online."""
    group_name = m["topic"][len(DLQ_PREFIX):]
    retry = RETRY_PREFIX + group_name
    route = a.route_or_none(retry)
    masters = a.route_masters(route) if route else []
    if not masters:
        raise AdminError(f"cannot resend to group {group_name}: the NameServer has no route for "
                         f"{retry}")
    addr = dict(masters).get(m["brokerName"], masters[0][1])
    body = m["body"].encode() if m["body"] is not None else base64.b64decode(m["bodyBase64"])
    props = {k: v for k, v in m["properties"].items() if k not in NOT_RESENT}
    cmd = RemotingCommand(RC.SEND_MESSAGE_V2, body=body, ext=send_ext(
        producerGroup=group_name, topic=retry, defaultTopic="TBW102", defaultTopicQueueNums=4,
        queueId=-1, sysFlag=0, bornTimestamp=_now_ms(), flag=0,
        properties=properties_to_string(props), reconsumeTimes=0, unitMode=False,
        maxReconsumeTimes=RESEND_MAX_RECONSUME_TIMES, batch=False))
    r = a.broker_call(addr, cmd, f"resend to {retry}")
    return {"topic": retry, "brokerAddr": addr, "msgId": r.ext.get("msgId"),
            "queueId": r.ext.get("queueId"), "queueOffset": r.ext.get("queueOffset")}


def message_resend(c, a: AdminClient, q: dict):
    m = _find(a, q)
    if not m["topic"].startswith(DLQ_PREFIX):
        raise BadInput(f"message {m['msgId']} is in topic {m['topic']}, not a dead-letter "
                       f"topic ({DLQ_PREFIX}<group>)")
    r = resend_dead_letter(a, m)
    return message(c, a, {"msgId": m["offsetMsgId"]},
                   f"Resent to {r['topic']} at {r['brokerAddr']} queue {r['queueId']} offset "
                   f"{r['queueOffset']} (offset msgId {r['msgId']})")


GET = {"/": cluster, "/cluster": cluster, "/broker": broker, "/topics": topics, "/topic": topic,
       "/groups": groups, "/group": group, "/producers": producers, "/messages": messages,
       "/message": message}
POST = {"/topic/create": topic_create, "/topic/delete": topic_delete, "/topic/send": topic_send,
        "/group/reset": group_reset, "/group/skip": group_skip, "/message/resend": message_resend}
# where a refused action's error is shown: the page of its form, and the
# form fields that name that page
BACK = {"/topic/create": ("/topics", ()), "/topic/delete": ("/topic", ("topic",)),
        "/topic/send": ("/topic", ("topic",)), "/group/reset": ("/group", ("group",)),
        "/group/skip": ("/group", ("group",)), "/message/resend": ("/message", ("msgId",))}

__all__ = ["BACK", "GET", "POST", "BadInput", "Failed", "admin_args"]
