"""``shmq admin``: mqadmin's commands, names and flags, over the remoting protocol.

    shmq admin <command> [-n namesrvAddr] [--timeout S] [--json] [flags]

This module is the command line only: each command's flags (mqadmin's
letters and long names), their checks, and the dispatch. What a command
asks the NameServer and brokers is in ``admin_commands`` (through
``admin_client``, the protocol), how its answer prints in ``admin_show``;
both are imported only when a command runs, so ``shmq --help`` stays fast.
Because only the protocol is spoken, the commands work the same against a
RocketMQ 4.x cluster.

Output: mqadmin's tables by default; ``--json`` prints one JSON document on
stdout (the command's answer with RocketMQ's field names). Exit status: 0
done; 2 a usage error (a missing or malformed flag, named); 1 a failure (an
address that does not answer, an unknown topic or group, a refusal with its
response code and remark), one line on stderr. ``-n`` defaults to
$NAMESRV_ADDR, else 127.0.0.1:9876 (the embedded NameServer); every connect
and every reply waits at most ``--timeout`` seconds (3). Against brokers with
ACL on, every request is signed with ``--access-key``/``--secret-key`` (or
$SHMQ_ACCESS_KEY/$SHMQ_SECRET_KEY, which keep the secret out of ``ps``), else
with the accessKey/secretKey of ``$ROCKETMQ_HOME/conf/tools.yml``, the file
mqadmin reads.

Long commands (printMsg over a topic, statsAll over every topic,
cleanExpiredCQ and deleteExpiredCommitLog over a cluster) show their
progress on stderr, a line rewritten in place on a terminal, else a line
per queue, topic or broker.

Through the broker to one consumer client (the broker relays
GET_CONSUMER_RUNNING_INFO and CONSUME_MESSAGE_DIRECTLY): consumerStatus,
and queryMsgById / queryMsgByUniqueKey ``-g -d`` (consume directly).

Where shmq differs from mqadmin: updateTopicPerm ``-c`` changes the topic
on the cluster's brokers that serve it (mqadmin's creates it on every
master); consumerStatus writes no file per member (``-i`` prints one
member's running info, ``--json`` all of them); a command that cannot act
(an address that is not a master of the topic) fails with exit 1 where
mqadmin prints a line and exits 0; haStatus is mqadmin 5's (4.9 has
none), computed from the runtime info every 4.x broker gives.

Not here: consumerProgress ``-s`` (client IP per queue), queryMsgById
``-s`` (resend), the message track in message printouts, clusterList ``-i``
(repeat forever).
"""
from __future__ import annotations

import argparse
import codecs
import datetime
import os
import re
import sys
import time

DEFAULT_NAMESRV = "127.0.0.1:9876"
TOPIC_NAME = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")   # TopicValidator
TOOLS_CONSUMER = "TOOLS_CONSUMER"                      # MixAll.TOOLS_CONSUMER_GROUP
CONSUME_MESSAGE_COUNT = 128                            # ConsumeMessageCommand's messageCount
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"                    # TopicValidator.RMQ_SYS_TRACE_TOPIC


# ------------------------------------------------------------------ flag types
def _topic(v: str) -> str:
    v = v.strip()
    if not TOPIC_NAME.match(v):
        raise argparse.ArgumentTypeError(f"{v!r} is not a topic name (1-127 of [%|a-zA-Z0-9_-])")
    return v


def _name(v: str) -> str:
    v = v.strip()
    if not v:
        raise argparse.ArgumentTypeError("empty")
    return v


def _queue_nums(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a number of queues") from None
    if not 1 <= n <= 1024:
        raise argparse.ArgumentTypeError(f"{n} queues: want 1..1024")
    return n


def _perm(v: str) -> int:
    if v.strip() not in ("2", "4", "6"):
        raise argparse.ArgumentTypeError(f"{v!r}: want 2 (W), 4 (R) or 6 (RW)")
    return int(v)


def _bool(v: str) -> bool:
    if v.strip().lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{v!r}: want true or false")
    return v.strip().lower() == "true"


def _non_negative(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} is negative")
    return n


def _int32(v: str) -> int:
    """A non-negative Java int (a subscription group's counts and broker ids)."""
    n = _non_negative(v)
    if n > 2**31 - 1:
        raise argparse.ArgumentTypeError(f"{n}: over 2147483647 (a Java int)")
    return n


def _positive(v: str) -> int:
    n = _non_negative(v)
    if n == 0:
        raise argparse.ArgumentTypeError("want a positive number")
    return n


def parse_timestamp(v: str, allow_now: bool = False) -> int:
    """mqadmin's timestamps: milliseconds since the epoch or local
    ``yyyy-MM-dd#HH:mm:ss:SSS`` (and ``now`` = -1 where allowed)."""
    v = v.strip()
    if allow_now and v == "now":
        return -1
    if re.fullmatch(r"\d+", v):
        return int(v)
    try:
        t = datetime.datetime.strptime(v, "%Y-%m-%d#%H:%M:%S:%f")
    except ValueError:
        want = "now, " if allow_now else ""
        raise argparse.ArgumentTypeError(
            f"{v!r}: want {want}milliseconds or yyyy-MM-dd#HH:mm:ss:SSS") from None
    return int(t.replace(microsecond=0).timestamp()) * 1000 + t.microsecond // 1000


def _timestamp(v: str) -> int:
    return parse_timestamp(v)


def _timestamp_or_now(v: str) -> int:
    return parse_timestamp(v, allow_now=True)


def _addr(v: str) -> str:
    v = v.strip()
    host, sep, port = v.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{v!r} is not host:port")
    return v


def _namesrv(v: str) -> str:
    if "," in v:
        raise argparse.ArgumentTypeError(f"{v!r}: separate NameServer addresses with ';', "
                                         f"not ','")
    addrs = [_addr(a) for a in v.split(";") if a.strip()]
    if not addrs:
        raise argparse.ArgumentTypeError("no address given")
    return ";".join(addrs)


def namesrv_addr(parser, value: str | None) -> str:
    """The NameServers: ``-n``'s value (checked by ``_namesrv``), else
    $NAMESRV_ADDR checked the same way — a bad one is an error naming the
    variable, not ``-n`` —, else DEFAULT_NAMESRV."""
    if value is not None:
        return value
    env = os.environ.get("NAMESRV_ADDR", "").strip()
    if not env:
        return DEFAULT_NAMESRV
    try:
        return _namesrv(env)
    except argparse.ArgumentTypeError as e:
        parser.error(f"$NAMESRV_ADDR={env!r}: {e}")


def _timeout_ms(v: str) -> int:
    """``-t timeoutMillis``: what ``--timeout`` allows, in milliseconds."""
    n = _positive(v)
    if n > 600_000:
        raise argparse.ArgumentTypeError(f"{n} ms: want at most 600000 (10 minutes)")
    return n


def _timeout(v: str) -> float:
    try:
        t = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a number of seconds") from None
    if not 0 < t <= 600:
        raise argparse.ArgumentTypeError(f"{t:g} s: want more than 0, at most 600")
    return t


# ------------------------------------------------------------------ each command's flags
def _flags_update_topic(p):
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("-b", "--brokerAddr", type=_addr, help="create the topic on this broker (host:port)")
    g.add_argument("-c", "--clusterName", type=_name, help="create the topic on every master of this cluster")
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic name")
    p.add_argument("-r", "--readQueueNums", type=_queue_nums, default=8, help="read queue nums (8)")
    p.add_argument("-w", "--writeQueueNums", type=_queue_nums, default=8, help="write queue nums (8)")
    p.add_argument("-p", "--perm", type=_perm, default=6, help="permission: 2 W, 4 R, 6 RW (6)")
    p.add_argument("-o", "--order", type=_bool, default=False, help="ordered topic: true|false")
    p.add_argument("-u", "--unit", type=_bool, default=False, help="unit topic: true|false")
    p.add_argument("-s", "--hasUnitSub", type=_bool, default=False, help="has unit sub: true|false")


def _flags_delete_topic(p):
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic name")
    p.add_argument("-c", "--clusterName", type=_name, required=True,
                   help="delete the topic from this cluster's masters and the NameServers")


def _flags_topic_list(p):
    p.add_argument("-c", "--clusterModel", action="store_true",
                   help="with each topic's cluster and consumer groups")


def _flags_topic_route(p):
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic name")
    p.add_argument("-l", "--list", action="store_true", help="a table instead of the route's JSON")


def _flags_topic(p):
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic name")


def _flags_cluster_list(p):
    p.add_argument("-m", "--moreStats", action="store_true", help="messages in and out, yesterday and today")


def _flags_broker_or_cluster(p):
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("-b", "--brokerAddr", type=_addr, help="broker address (host:port)")
    g.add_argument("-c", "--clusterName", type=_name, help="every broker of this cluster")


def _flags_update_broker_config(p):
    _flags_broker_or_cluster(p)
    p.add_argument("-k", "--key", type=_name, required=True, help="config key")
    p.add_argument("-v", "--value", required=True, help="config value")


def _flags_broker_name(p):
    p.add_argument("-b", "--brokerName", type=_name, required=True, help="broker name")


def _flags_consumer_progress(p):
    p.add_argument("-g", "--groupName", type=_name,
                   help="consumer group (without it: a summary line per group)")


def _flags_consumer_connection(p):
    p.add_argument("-g", "--consumerGroup", type=_name, required=True, help="consumer group name")
    p.add_argument("-b", "--brokerAddr", type=_addr, help="ask this broker (default: the group's)")


def _flags_consumer_status(p):
    p.add_argument("-g", "--consumerGroup", type=_name, required=True, help="consumer group name")
    p.add_argument("-i", "--clientId", type=_name, help="only this member: its whole running info")
    p.add_argument("-b", "--brokerAddr", type=_addr, help="ask this broker (default: the group's)")
    p.add_argument("-s", "--jstack", action="store_true",
                   help="ask for the consumer's thread stacks (a Java client's jstack)")


def _flags_query_msg_by_id(p):
    p.add_argument("-i", "--msgId", type=_name, required=True,
                   help="message id(s), comma-separated: offset msgIds, or client msgIds with -t")
    p.add_argument("-t", "--topic", type=_topic,
                   help="topic, to find a client-generated msgId (UNIQ_KEY) through the index")
    _flags_consume_directly(p)


def _flags_consume_directly(p):
    p.add_argument("-g", "--consumerGroup", type=_name,
                   help="with -d: hand the message to this group's consumer (consume directly)")
    p.add_argument("-d", "--clientId", type=_name, help="with -g: the consumer's client id")


def _check_consume_directly(p, args) -> None:
    if bool(args.consumerGroup) != bool(args.clientId):
        p.error("-g/--consumerGroup and -d/--clientId go together (consume the message directly)")


def _flags_query_msg_by_key(p):
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic name")
    p.add_argument("-k", "--msgKey", type=_name, required=True, help="message key")


def _flags_query_msg_by_offset(p):
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic name")
    p.add_argument("-b", "--brokerName", type=_name, required=True, help="broker name")
    p.add_argument("-i", "-q", "--queueId", type=_non_negative, required=True, help="queue id")
    p.add_argument("-o", "--offset", type=_non_negative, required=True, help="queue offset")


def _flags_reset_offset(p):
    p.add_argument("-g", "--group", type=_name, required=True, help="consumer group")
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic")
    p.add_argument("-s", "--timestamp", type=_timestamp_or_now, required=True,
                   help="now | milliseconds | yyyy-MM-dd#HH:mm:ss:SSS")
    p.add_argument("-f", "--force", type=_bool, default=True,
                   help="move offsets forward too: true|false (true)")
    p.add_argument("-c", "--cplus", action="store_true", help="reset C++ clients' offsets")


def _flags_send_message(p):
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic name")
    p.add_argument("-p", "--body", required=True, help="message body (UTF-8 text)")
    p.add_argument("-k", "--key", type=_name, help="message keys")
    p.add_argument("-c", "--tags", type=_name, help="message tags")
    p.add_argument("-b", "--broker", type=_name, help="send to this broker (name)")
    p.add_argument("-i", "--qid", type=_non_negative, help="send to this queue (needs -b)")
    p.add_argument("-m", "--msgTraceEnable", type=_bool, default=False,
                   help="message trace: accepted, not supported (false)")


def _flags_consume_message(p):
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic name")
    p.add_argument("-b", "--brokerName", type=_name, help="only this broker")
    p.add_argument("-i", "--queueId", type=_non_negative, help="only this queue (needs -b)")
    p.add_argument("-o", "--offset", type=_non_negative, help="from this queue offset (needs -i)")
    p.add_argument("-g", "--consumerGroup", type=_name, default=TOOLS_CONSUMER,
                   help=f"consumer group ({TOOLS_CONSUMER}); no offset is committed")
    p.add_argument("-s", "--beginTimestamp", type=_timestamp,
                   help="from this time: milliseconds | yyyy-MM-dd#HH:mm:ss:SSS")
    p.add_argument("-e", "--endTimestamp", type=_timestamp,
                   help="up to this time: milliseconds | yyyy-MM-dd#HH:mm:ss:SSS")
    p.add_argument("-c", "--MessageNumber", type=_positive, default=CONSUME_MESSAGE_COUNT,
                   help=f"at most this many messages ({CONSUME_MESSAGE_COUNT})")


def _flags_update_sub_group(p):
    _flags_broker_or_cluster(p)
    p.add_argument("-g", "--groupName", type=_name, required=True, help="consumer group name")
    p.add_argument("-s", "--consumeEnable", type=_bool, default=True,
                   help="consume enable: true|false (true)")
    p.add_argument("-m", "--consumeFromMinEnable", type=_bool, default=False,
                   help="from min offset: true|false (false)")
    p.add_argument("-d", "--consumeBroadcastEnable", type=_bool, default=False,
                   help="broadcast: true|false (false)")
    p.add_argument("-q", "--retryQueueNums", type=_queue_nums, default=1, help="retry queue nums (1)")
    p.add_argument("-r", "--retryMaxTimes", type=_int32, default=16, help="retry max times (16)")
    p.add_argument("-i", "--brokerId", type=_int32, default=0,
                   help="consume from which broker id (0)")
    p.add_argument("-w", "--whichBrokerWhenConsumeSlowly", type=_int32, default=1,
                   help="which broker id when consume slowly (1)")
    p.add_argument("-a", "--notifyConsumerIdsChanged", type=_bool, default=True,
                   help="notify consumerId changed: true|false (true)")


def _flags_delete_sub_group(p):
    _flags_broker_or_cluster(p)
    p.add_argument("-g", "--groupName", type=_name, required=True, help="subscription group name")
    p.add_argument("-r", "--removeOffset", type=_bool, default=False,
                   help="remove the group's consumer offsets too: true|false (false)")


def _flags_update_topic_perm(p):
    _flags_broker_or_cluster(p)
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic name")
    p.add_argument("-p", "--perm", type=_perm, required=True, help="permission: 2 W, 4 R, 6 RW")


def _flags_clone_group_offset(p):
    p.add_argument("-s", "--srcGroup", type=_name, required=True, help="source consumer group")
    p.add_argument("-d", "--destGroup", type=_name, required=True, help="destination consumer group")
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic")
    p.add_argument("-o", "--offline", type=_bool, default=False,
                   help="the group or the topic is offline: accepted, no effect (as in mqadmin)")


def _flags_skip_accumulated(p):
    p.add_argument("-g", "--group", type=_name, required=True, help="consumer group")
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic")
    p.add_argument("-f", "--force", type=_bool, default=True,
                   help="move offsets forward too: true|false (true)")


def _flags_query_msg_by_unique_key(p):
    p.add_argument("-i", "--msgId", type=_name, required=True, help="the client-generated msgId (UNIQ_KEY)")
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic of the message")
    p.add_argument("-a", "--showAll", action="store_true",
                   help="print every message stored under it (at most 32), not only the first")
    _flags_consume_directly(p)


def _flags_update_namesrv_config(p):
    p.add_argument("-k", "--key", type=_name, required=True, help="config key")
    p.add_argument("-v", "--value", required=True, help="config value")


def _charset(v: str) -> str:
    try:
        return codecs.lookup(v.strip()).name
    except LookupError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a charset (e.g. UTF-8, GBK)") from None


def _flags_print_msg(p):
    p.add_argument("-t", "--topic", type=_topic, required=True, help="topic name")
    p.add_argument("-c", "--charsetName", type=_charset, default="utf-8",
                   help="charset of the bodies (UTF-8)")
    p.add_argument("-s", "--subExpression", type=_name, default="*",
                   help="subscribe expression, e.g. 'TagA || TagB' (*)")
    p.add_argument("-b", "--beginTimestamp", type=_timestamp,
                   help="from this time: milliseconds | yyyy-MM-dd#HH:mm:ss:SSS")
    p.add_argument("-e", "--endTimestamp", type=_timestamp,
                   help="up to this time: milliseconds | yyyy-MM-dd#HH:mm:ss:SSS")
    p.add_argument("-d", "--printBody", type=_bool, default=True, help="print the bodies: true|false (true)")


def _flags_broker_or_cluster_or_all(p):
    g = p.add_mutually_exclusive_group()
    g.add_argument("-b", "--brokerAddr", type=_addr, help="broker address (host:port)")
    g.add_argument("-c", "--cluster", type=_name,
                   help="every broker of this cluster (default: every broker the NameServer knows)")


def _flags_producer_connection(p):
    p.add_argument("-g", "--producerGroup", type=_name, required=True, help="producer group name")
    p.add_argument("-t", "--topic", type=_topic, required=True, help="a topic the group sends to")


def _flags_broker_consume_stats(p):
    p.add_argument("-b", "--brokerAddr", type=_addr, required=True, help="broker address (host:port)")
    p.add_argument("-t", "--timeoutMillis", type=_timeout_ms,
                   help="request timeout in milliseconds (at most 600000)")
    p.add_argument("-l", "--level", type=_non_negative, default=0,
                   help="only queues whose diff is at least this (0)")
    p.add_argument("-o", "--order", type=_bool, default=False, help="ordered topics only: true|false")


def _flags_stats_all(p):
    p.add_argument("-a", "--activeTopic", action="store_true",
                   help="only topics with messages in or out in the last 24 hours")
    p.add_argument("-t", "--topic", type=_topic, help="only this topic")


def _flags_query_msg_trace_by_id(p):
    p.add_argument("-i", "--msgId", type=_name, required=True, help="the client msgId (UNIQ_KEY)")
    p.add_argument("-t", "--traceTopic", type=_topic, default=TRACE_TOPIC,
                   help=f"the trace topic ({TRACE_TOPIC})")


def _check_print_msg(p, args) -> None:
    if args.beginTimestamp is not None and args.endTimestamp is not None \
            and args.beginTimestamp > args.endTimestamp:
        p.error("-b/--beginTimestamp is after -e/--endTimestamp")


def _check_send_message(p, args) -> None:
    if args.qid is not None and not args.broker:
        p.error("-i/--qid needs -b/--broker: the queue is chosen on a broker")


def _check_consume_message(p, args) -> None:
    if args.queueId is not None and not args.brokerName:
        p.error("-i/--queueId needs -b/--brokerName")
    if args.offset is not None and args.queueId is None:
        p.error("-o/--offset needs -i/--queueId")
    now = int(time.time() * 1000)
    for flag, v in (("-s/--beginTimestamp", args.beginTimestamp), ("-e/--endTimestamp", args.endTimestamp)):
        if v is not None and v > now:
            p.error(f"{flag} is after now")
    if args.beginTimestamp is not None and args.endTimestamp is not None \
            and args.beginTimestamp > args.endTimestamp:
        p.error("-s/--beginTimestamp is after -e/--endTimestamp")


# name, one-line description (mqadmin's), flags, extra check after parsing
COMMANDS = [
    ("updateTopic", "Update or create topic", _flags_update_topic, None),
    ("deleteTopic", "Delete topic from broker and NameServer", _flags_delete_topic, None),
    ("topicList", "Fetch all topic list from name server", _flags_topic_list, None),
    ("topicRoute", "Examine topic route info", _flags_topic_route, None),
    ("topicStatus", "Examine topic Status info", _flags_topic, None),
    ("clusterList", "List all of clusters", _flags_cluster_list, None),
    ("brokerStatus", "Fetch broker runtime status data", _flags_broker_or_cluster, None),
    ("haStatus", "Fetch ha runtime status data", _flags_broker_or_cluster, None),
    ("getBrokerConfig", "Get broker config by cluster or special broker", _flags_broker_or_cluster, None),
    ("updateBrokerConfig", "Update broker's config", _flags_update_broker_config, None),
    ("wipeWritePerm", "Wipe write perm of broker in all name server you defined in the -n param",
     _flags_broker_name, None),
    ("addWritePerm", "Add write perm of broker in all name server you defined in the -n param",
     _flags_broker_name, None),
    ("consumerProgress", "Query consumers's progress, speed", _flags_consumer_progress, None),
    ("consumerConnection", "Query consumer's socket connection, client version and subscription",
     _flags_consumer_connection, None),
    ("consumerStatus", "Query consumer's internal data structure", _flags_consumer_status, None),
    ("queryMsgById", "Query Message by Id", _flags_query_msg_by_id, _check_consume_directly),
    ("queryMsgByKey", "Query Message by Key", _flags_query_msg_by_key, None),
    ("queryMsgByOffset", "Query Message by offset", _flags_query_msg_by_offset, None),
    ("resetOffsetByTime", "Reset consumer offset by timestamp(without client restart)",
     _flags_reset_offset, None),
    ("sendMessage", "Send a message", _flags_send_message, _check_send_message),
    ("consumeMessage", "Consume message", _flags_consume_message, _check_consume_message),
    ("updateSubGroup", "Update or create subscription group", _flags_update_sub_group, None),
    ("deleteSubGroup", "Delete subscription group from broker.", _flags_delete_sub_group, None),
    ("updateTopicPerm", "Update topic perm", _flags_update_topic_perm, None),
    ("topicClusterList", "get cluster info for topic", _flags_topic, None),
    ("cloneGroupOffset", "clone offset from other group.", _flags_clone_group_offset, None),
    ("skipAccumulatedMessage", "Skip all messages that are accumulated (not consumed) currently",
     _flags_skip_accumulated, None),
    ("queryMsgByUniqueKey", "Query Message by Unique key", _flags_query_msg_by_unique_key,
     _check_consume_directly),
    ("getNamesrvConfig", "Get configs of name server.", lambda p: None, None),
    ("updateNamesrvConfig", "Update configs of name server.", _flags_update_namesrv_config, None),
    ("printMsg", "Print Message Detail", _flags_print_msg, _check_print_msg),
    ("cleanExpiredCQ", "Clean expired ConsumeQueue on broker.", _flags_broker_or_cluster_or_all, None),
    ("deleteExpiredCommitLog", "Delete expired CommitLog files", _flags_broker_or_cluster_or_all, None),
    ("producerConnection", "Query producer's socket connection and client version",
     _flags_producer_connection, None),
    ("brokerConsumeStats", "Fetch broker consume stats data", _flags_broker_consume_stats, None),
    ("statsAll", "Topic and Consumer tps stats", _flags_stats_all, None),
    ("queryMsgTraceById", "query a message trace", _flags_query_msg_trace_by_id, None),
]


def _common(p) -> None:
    g = p.add_argument_group("connection and output")
    g.add_argument("-n", "--namesrvAddr", type=_namesrv, default=None,
                   help="NameServer address(es), host:port;host:port "
                        f"(default: $NAMESRV_ADDR, else {DEFAULT_NAMESRV})")
    g.add_argument("--timeout", type=_timeout, default=3.0,
                   help="seconds to wait for each connect and each reply (3)")
    g.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    g.add_argument("--access-key", default=os.environ.get("SHMQ_ACCESS_KEY", ""),
                   help="ACL account to sign every request with (default: $SHMQ_ACCESS_KEY, else "
                        "accessKey in $ROCKETMQ_HOME/conf/tools.yml, as mqadmin)")
    g.add_argument("--secret-key", default=os.environ.get("SHMQ_SECRET_KEY", ""),
                   help="its secret key (default: $SHMQ_SECRET_KEY, else tools.yml's secretKey)")


def credentials(p, args):
    """The account to sign with: the flags (or their variables), else
    mqadmin's ``$ROCKETMQ_HOME/conf/tools.yml``; None: requests go unsigned."""
    from shmq.ipc.signing import Credentials
    ak, sk = args.access_key, args.secret_key
    home = os.environ.get("ROCKETMQ_HOME")
    tools = os.path.join(home, "conf", "tools.yml") if home else None
    if not ak and not sk and tools and os.path.exists(tools):
        import yaml
        try:
            with open(tools, encoding="utf-8") as f:
                doc = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as e:
            p.error(f"{tools}: {e}")
        if not isinstance(doc, dict):
            p.error(f"{tools}: not a mapping of accessKey and secretKey")
        ak, sk = str(doc.get("accessKey") or ""), str(doc.get("secretKey") or "")
    try:
        return Credentials.of(ak, sk)
    except ValueError as e:
        p.error(f"--access-key/--secret-key: {e}")


class _CommandParser(argparse.ArgumentParser):
    """``admin``'s and each command's parser: an unknown flag is this
    parser's usage error (its usage line, exit 2), not the top-level
    parser's "unrecognized arguments" under ``shmq``'s usage."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def command_list() -> str:
    """The commands, one line each: name and mqadmin's description."""
    width = max(len(name) for name, _, _, _ in COMMANDS)
    return "\n".join(f"  {name:<{width}}  {desc}" for name, desc, _, _ in COMMANDS)


def add_parser(subparsers) -> None:
    ap = subparsers.add_parser(
        "admin", help="mqadmin's commands against a NameServer and its brokers",
        description="mqadmin-compatible administration over the RocketMQ 4.x protocol "
                    "(works against shmq and RocketMQ 4.x). `shmq admin <command> --help` "
                    "lists a command's flags.")
    sub = ap.add_subparsers(dest="admin_command", metavar="<command>", title="commands",
                            parser_class=_CommandParser)
    ap.__class__ = _CommandParser        # `shmq admin --bogus`: admin's usage, not shmq's
    ap.set_defaults(func=lambda args: _no_command(ap))
    for name, desc, flags, check in COMMANDS:
        p = sub.add_parser(name, help=desc, description=desc)
        flags(p)
        _common(p)
        p.set_defaults(func=_main, _check=check, _parser=p, _name=name)


def _no_command(ap) -> int:
    """``shmq admin`` alone: its usage and the commands, on stderr; exit 2."""
    ap.print_usage(sys.stderr)
    print(f"{ap.prog}: error: no command given; the commands:\n{command_list()}\n"
          f"`{ap.prog} <command> --help` lists a command's flags.", file=sys.stderr)
    return 2


def snake(name: str) -> str:
    """updateTopic → update_topic, cleanExpiredCQ → clean_expired_cq: the
    command's function in admin_commands and admin_show."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def _main(args) -> int:
    if args._check is not None:
        args._check(args._parser, args)
    import json

    from . import admin_commands, admin_show
    from .admin_client import AdminClient, AdminError

    name = snake(args._name)
    args.namesrvAddr = namesrv_addr(args._parser, args.namesrvAddr)
    creds = credentials(args._parser, args)
    try:
        with AdminClient(args.namesrvAddr, args.timeout, creds) as a:
            data = getattr(admin_commands, name)(args, a)
    except AdminError as e:
        print(f"shmq admin {args._name}: {e}", file=sys.stderr)
        return 1
    try:
        if args.json:
            sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
        else:
            getattr(admin_show, name)(data, args)
        sys.stdout.flush()
    except BrokenPipeError:             # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
