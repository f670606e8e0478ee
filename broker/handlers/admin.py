"""Admin requests (mqadmin's): topics and subscription groups, the broker's
configuration and runtime info, the views of topics, groups and their
consumers, message lookups by commit-log offset or key, and the store
cleanups an admin asks of the flusher."""
from __future__ import annotations

import logging

import orjson
from shmq.core.index import IndexService
from shmq.core.layout import java_string_hash
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.control import FLUSHER_SLOT
from shmq.ipc.fastjson import mq_map
from shmq.ipc.headers import BadRequest, Header
from shmq.ipc.remoting import VERSION_4_9_7, RemotingCommand

from ..config import RUNTIME_SETTINGS, SECRET_SETTINGS, BrokerConfig, conf_text, parse_conf
from ..delivery import stored
from ..topics import GroupConfig, topic_config, topic_error
from . import stats as stats_handlers
from .base import Broker, Peer, Reply, json_body, json_reply

log = logging.getLogger("shmq.broker")


# ------------------------------------------------------------------ messages
def view_message(b: Broker, peer: Peer, cmd: RemotingCommand):
    phy = Header(cmd.ext).int("offset")
    m = stored(b.store, phy)
    raw = None if m is None else b.store.record_view(phy, m.total_size)
    if raw is None:
        raise BadRequest(R.SYSTEM_ERROR, f"can not find message by the offset, {phy}")
    mv = memoryview(raw)
    return Reply(cmd.reply(R.SUCCESS), [mv], mv.nbytes)


def query_message(b: Broker, peer: Peer, cmd: RemotingCommand):
    """QUERY_MESSAGE: the messages of a topic whose KEYS hold ``key`` (or,
    with _UNIQUE_KEY_QUERY, whose UNIQ_KEY is it), stored between the two
    timestamps, found through the IndexFile (IndexService.queryOffset):
    at most maxNum (defaultQueryMaxNum for a unique key; 64 in any case)."""
    h = Header(cmd.ext)
    topic, key = h.str("topic"), h.str("key")
    unique = h.bool("_UNIQUE_KEY_QUERY")
    max_num = b.config.defaultQueryMaxNum if unique else max(1, h.int("maxNum"))
    begin, end = h.int("beginTimestamp"), h.int("endTimestamp")
    if b.index is None:
        b.index = IndexService(b.config.store, read_only=True)
    found = []
    for phy in b.index.query(topic, key, max_num, begin, end):
        m = stored(b.store, phy)
        if m is None or m.topic != topic:
            continue
        p = m.properties
        if key in p.get("KEYS", "").split(" ") or p.get("UNIQ_KEY") == key:   # hash collisions
            found.append(b.store.record_view(phy, m.total_size))
    if not found:
        raise BadRequest(R.QUERY_NOT_FOUND, "can not find message, maybe time range not correct")
    reply = cmd.reply(R.SUCCESS, ext={
        "indexLastUpdateTimestamp": str(b.index.last_update_timestamp),
        "indexLastUpdatePhyoffset": str(b.index.last_update_phy_offset)})
    parts = [memoryview(f) for f in found]
    return Reply(reply, parts, sum(p.nbytes for p in parts))


# ------------------------------------------------------------------ topics, groups, config
def create_topic(b: Broker, peer: Peer, cmd: RemotingCommand):
    h = Header(cmd.ext)
    topic = h.str("topic")
    err = topic_error(topic)
    if err:
        raise BadRequest(R.SYSTEM_ERROR, err)
    if topic == b.config.brokerClusterName:
        raise BadRequest(R.SYSTEM_ERROR, f"the topic[{topic}] is conflict with system reserved words")
    read, write = h.int("readQueueNums"), h.int("writeQueueNums")
    if not (1 <= read <= 1024 and 1 <= write <= 1024):
        raise BadRequest(R.SYSTEM_ERROR, "readQueueNums and writeQueueNums must be 1..1024")
    ftype = h.str("topicFilterType", "SINGLE_TAG")
    if ftype not in ("SINGLE_TAG", "MULTI_TAG"):
        raise BadRequest(R.SYSTEM_ERROR, f"topicFilterType={ftype!r}: SINGLE_TAG or MULTI_TAG")
    b.tables.topics.update({topic: topic_config(topic, read, write, h.int("perm", 6),
                                                   ftype, h.int("topicSysFlag", 0),
                                                   h.bool("order"))})
    return cmd.reply(R.SUCCESS)


def delete_topic(b: Broker, peer: Peer, cmd: RemotingCommand):
    topic = Header(cmd.ext).str("topic")
    b.tables.topics.update({topic: None})
    return cmd.reply(R.SUCCESS)


def update_group(b: Broker, peer: Peer, cmd: RemotingCommand):
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: a SubscriptionGroupConfig body;
    fields it leaves out keep RocketMQ's defaults (retryMaxTimes 16 …)."""
    body = json_body(cmd)
    name = body.get("groupName")
    if not isinstance(name, str) or topic_error(name):
        raise BadRequest(R.SYSTEM_ERROR, f"groupName {name!r} is not a valid group name")
    b.tables.groups.update({name: GroupConfig.from_json(name, body)})
    return cmd.reply(R.SUCCESS)


def all_groups(b: Broker, peer: Peer, cmd: RemotingCommand):
    return json_reply(cmd, {"subscriptionGroupTable": b.tables.groups.table_json(),
                                "dataVersion": b.tables.groups.data_version()})


def delete_group(b: Broker, peer: Peer, cmd: RemotingCommand):
    """DELETE_SUBSCRIPTIONGROUP: the group's config; with removeOffset its
    committed offsets too (ConsumerOffsetManager.removeOffset)."""
    h = Header(cmd.ext)
    group = h.str("groupName")
    b.tables.groups.update({group: None})
    if h.bool("removeOffset"):
        n = b.registry.remove_offsets(group)
        log.info("subscription group %s deleted with its %d queue offsets", group, n)
    return cmd.reply(R.SUCCESS)


# ------------------------------------------------------------------ store cleanup (the flusher's)
def delete_expired_commitlog(b: Broker, peer: Peer, cmd: RemotingCommand):
    """DELETE_EXPIRED_COMMITLOG (executeDeleteFilesManually): the flusher
    runs retention at once and on its next passes whatever the deleteWhen
    hour (broker/flusher.py); segments older than fileReservedTime go."""
    _ask_flusher(b, "delete_cl_seq")
    return cmd.reply(R.SUCCESS)


def clean_expired_cq(b: Broker, peer: Peer, cmd: RemotingCommand):
    """CLEAN_EXPIRED_CONSUMEQUEUE: the flusher trims the ConsumeQueues to
    the CommitLog kept (core/retention.py clean_consume_queues)."""
    _ask_flusher(b, "clean_cq_seq")
    return cmd.reply(R.SUCCESS)


def _ask_flusher(b: Broker, request: str) -> None:
    """One more request in the shared state (a lost increment between two
    workers still moves it), and the flusher woken to serve it."""
    st = b.store.state
    st.set(request, st.get(request) + 1)
    b.cb.wake(FLUSHER_SLOT)


def all_topic_config(b: Broker, peer: Peer, cmd: RemotingCommand):
    return json_reply(cmd, {"topicConfigTable": b.tables.topics.table_json(),
                                "dataVersion": b.tables.topics.data_version()})


def update_broker_config(b: Broker, peer: Peer, cmd: RemotingCommand):
    """UPDATE_BROKER_CONFIG: a properties body (key=value lines). Every key
    is checked; the settings applied at runtime (RUNTIME_SETTINGS:
    brokerPermission, at once on every worker, to drain a broker before a
    restart) are kept in config/brokerConfig.json. A request that would
    change any other setting is refused whole (NO_PERMISSION, as RocketMQ
    refuses its configBlackList), the remark naming each such setting: they
    are read at start, from broker.conf. Setting one to the value in effect
    is accepted and changes nothing."""
    try:
        values = parse_conf(bytes(cmd.body).decode("utf-8"), "the request body")
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(R.SYSTEM_ERROR, f"update broker config failed: {e}") from None
    in_effect = {name: value for name, value, _ in b.config.describe()}
    unknown = sorted(set(values) - set(in_effect))
    if unknown:
        raise BadRequest(R.SYSTEM_ERROR, f"update broker config failed: unknown settings "
                                         f"{', '.join(unknown)}")
    live = {k: v for k, v in b.tables.broker.current().items() if k in RUNTIME_SETTINGS}
    try:
        new, _ = BrokerConfig.from_strings(
            {**{k: conf_text(v) for k, v in in_effect.items()}, **live, **values})
    except ValueError as e:
        raise BadRequest(R.SYSTEM_ERROR, f"update broker config failed: {e}") from None
    wanted = {name: value for name, value, _ in new.describe()}
    refused = sorted(k for k in values if k not in RUNTIME_SETTINGS and
                     (wanted[k] != in_effect[k] or k in SECRET_SETTINGS))
    if refused:
        raise BadRequest(R.NO_PERMISSION, f"{', '.join(refused)} "
                         f"{'needs' if len(refused) == 1 else 'need'} a restart: change "
                         f"broker.conf (at runtime only {', '.join(sorted(RUNTIME_SETTINGS))} "
                         f"can change); nothing was updated")
    changes = {k: conf_text(wanted[k]) for k in values if k in RUNTIME_SETTINGS}
    # drop what an older shmq kept here: settings it never applied
    changes.update({k: None for k in b.tables.broker.current() if k not in RUNTIME_SETTINGS})
    if changes:
        b.tables.broker.update(changes)
        log.info("broker config updated: %s", changes)
    return cmd.reply(R.SUCCESS)


def get_broker_config(b: Broker, peer: Peer, cmd: RemotingCommand):
    """The settings in effect: broker.conf's, with RUNTIME_SETTINGS as
    UPDATE_BROKER_CONFIG last set them and SECRET_SETTINGS masked."""
    shown = {k: "******" for k in SECRET_SETTINGS if getattr(b.config, k)}
    shown.update((k, v) for k, v in b.tables.broker.current().items() if k in RUNTIME_SETTINGS)
    lines = [f"{name}={conf_text(shown.get(name, value))}" for name, value, _ in b.config.describe()]
    reply = cmd.reply(R.SUCCESS, body="\n".join(lines).encode() + b"\n",
                      ext={"version": orjson.dumps(b.tables.broker.data_version()).decode()})
    return reply


def runtime_info(b: Broker, peer: Peer, cmd: RemotingCommand):
    st = b.store.state
    table = {"brokerVersionDesc": "V4_9_7", "brokerVersion": str(VERSION_4_9_7),
             "bootTimestamp": str(b.boot_ms),
             "commitLogMaxOffset": str(st.write_pos),
             "commitLogMinOffset": str(st.get("cl_min_offset")),
             "commitLogFlushedOffset": str(st.flushed_pos),
             "msgPutTotalThisWorker": str(b.put_count),
             "queueCount": str(int(st.get("queue_slots_used"))),
             "flushDiskType": b.config.store.flushDiskType,
             # replication (broker/ha; shmq's names, RocketMQ 4 shows none): a
             # master's connected slaves and the highest offset one acked
             # (the lag in bytes: commitLogMaxOffset - haSlaveAckOffset)
             "brokerRole": b.config.brokerRole,
             "haSlaveCount": str(st.get("ha_slaves")),
             "haSlaveAckOffset": str(st.get("confirm_pos")),
             # shmq: clients on this host may use the Unix socket instead of TCP
             "unixSocketPath": b.config.unix_path,
             **b.stats.runtime_info()}
    return json_reply(cmd, {"table": table})

# ------------------------------------------------------------- admin views


# ------------------------------------------------------------------ views
def topic_stats(b: Broker, peer: Peer, cmd: RemotingCommand):
    """GET_TOPIC_STATS_INFO: TopicStatsTable, each write queue's min and max
    offset and the store time of its last message (AdminBrokerProcessor)."""
    topic = Header(cmd.ext).str("topic")
    tc = b.tables.topics.get(topic)
    if tc is None:
        raise BadRequest(R.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
    items = []
    for qid in range(tc.write_queue_nums):
        lo = max(0, b.store.min_offset(topic, qid))
        hi = max(0, b.store.max_offset(topic, qid))
        ts = (b.store.store_time(topic, qid, hi - 1) or 0) if hi > 0 else 0
        items.append((topic, b.config.brokerName, qid,
                      {"lastUpdateTimestamp": ts, "maxOffset": hi, "minOffset": lo}))
    body = f'{{"offsetTable":{mq_map(items)}}}'
    return cmd.reply(R.SUCCESS, body=body.encode())


def consume_stats(b: Broker, peer: Peer, cmd: RemotingCommand):
    """GET_CONSUME_STATS: ConsumeStats of a group, per read queue of the
    topic (or of every topic it has offsets in, skipping those its live
    consumers do not subscribe): max offset, committed offset, store time
    of the last consumed message; consumeTps the group's GROUP_GET_NUMS rate
    over the last minute, summed over the topics (broker/stats.py)."""
    h = Header(cmd.ext)
    group = h.str("consumerGroup")
    topic = h.str("topic", required=False)
    topics = {topic} if topic else b.registry.topics_of_group(group)
    subscribed = b.registry.group_subscriptions(group)
    items = []
    for t in sorted(topics):
        tc = b.tables.topics.get(t)
        if tc is None or (subscribed and t not in subscribed):
            continue
        items.extend(stats_handlers.offset_entries(b, t, group, tc.read_queue_nums))
    tps = sum(stats_handlers.group_tps(b, t, group) for t in {i[0] for i in items})
    body = f'{{"consumeTps":{tps!r},"offsetTable":{mq_map(items)}}}'
    return cmd.reply(R.SUCCESS, body=body.encode())


def consumer_connection(b: Broker, peer: Peer, cmd: RemotingCommand):
    """GET_CONSUMER_CONNECTION_LIST: ConsumerConnection of a group, from
    the shared registry (its members may be served by any worker)."""
    group = Header(cmd.ext).str("consumerGroup")
    members = b.registry.group_clients(group)
    if not members:
        raise BadRequest(R.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
    connections = [stats_handlers.connection_json(b, cid, info) for cid, _, info in members]
    subs = {}
    for topic, sd in b.registry.group_subscriptions(group).items():
        tags = [] if sd["expressionType"] == "SQL92" or sd["subString"].strip() in ("", "*") \
            else [t.strip() for t in sd["subString"].split("||") if t.strip()]
        subs[topic] = {"classFilterMode": False, "codeSet": [java_string_hash(t) for t in tags],
                       "expressionType": sd["expressionType"], "subString": sd["subString"],
                       "subVersion": sd["subVersion"], "tagsSet": tags, "topic": topic}
    first = members[0][2]
    return json_reply(cmd, {
        "connectionSet": connections, "consumeFromWhere": first["consumeFromWhere"],
        "consumeType": first["consumeType"],
        "messageModel": "BROADCASTING" if members[0][1] else "CLUSTERING",
        "subscriptionTable": subs})


def topic_consumed_by(b: Broker, peer: Peer, cmd: RemotingCommand):
    """QUERY_TOPIC_CONSUME_BY_WHO: GroupList of the groups subscribing the
    topic or holding offsets in it."""
    topic = Header(cmd.ext).str("topic")
    return json_reply(cmd, {"groupList": sorted(b.registry.groups_of_topic(topic))})
