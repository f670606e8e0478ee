"""Clients: heartbeats (producer and consumer groups, subscriptions),
unregistering and closed connections, group membership and its
NOTIFY_CONSUMER_IDS_CHANGED, orderly consumption's queue locks, and the
notices other processes leave for this worker's clients (transaction
check-backs to producers, offset resets to consumers).

The registry (shared memory) holds every worker's clients; this worker
keeps the peers of its own (``Broker.group_peers``, ``producer_peers``) to
address notices. ``check_clients`` and ``deliver_notices`` return the
notices as ``(peer, Reply)`` for the driver to write; a handler that
changes membership or posts a notice sets ``Broker.due``.
"""
from __future__ import annotations

import logging
import time

from shmq.core.consumequeue import ALL_TAGS
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.control import WANT_CLIENTS
from shmq.ipc.headers import BadRequest, Header
from shmq.ipc.remoting import FLAG_ONEWAY, VERSION_4_9_7, RemotingCommand

from ..delivery import UNIQ_KEY, check_body, reset_body, stored
from ..registry import LOCK_LEASE_MS, client_payload, consumer_key, lock_key
from .base import Broker, Peer, Reply, int_or, json_body, json_reply
from .subscription import Subscription, parse_subscription

log = logging.getLogger("shmq.broker")


def heartbeat(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    data = json_body(cmd)
    cid = data.get("clientID")
    if not isinstance(cid, str) or not cid:
        raise BadRequest(R.SYSTEM_ERROR, "the heartbeat has no clientID")
    attrs = peer.attrs
    attrs["client_id"] = cid
    attrs["language"] = cmd.language
    now = int(time.time() * 1000)
    changed = False
    for p in data.get("producerDataSet") or []:
        g = p.get("groupName") if isinstance(p, dict) else None
        if isinstance(g, str) and g and g != "CLIENT_INNER_PRODUCER":
            b.registry.producers.put(consumer_key(g, cid), b.cb.slot, now, peer.id,
                                     payload=client_payload(peer.addr, cmd.language, cmd.version, "", ""))
            b.producer_peers[peer.id] = peer
            attrs.setdefault("producer_groups", set()).add(g)
    for c in data.get("consumerDataSet") or []:
        g = c.get("groupName")
        if not isinstance(g, str) or not g:
            raise BadRequest(R.SYSTEM_ERROR, "a consumerData in the heartbeat has no groupName")
        if b.tables.group(g, b.config.autoCreateSubscriptionGroup) is None:
            raise BadRequest(R.SUBSCRIPTION_GROUP_NOT_EXIST,
                             f"subscription group [{g}] does not exist")
        b.tables.retry_topic(g)
        shared_subs = {}
        for sd in c.get("subscriptionDataSet") or []:
            topic = sd.get("topic")
            if isinstance(topic, str):
                etype = sd.get("expressionType") or "TAG"
                shared_subs[topic] = (str(sd.get("subString") or "*"),
                                      int_or(sd.get("subVersion"), 0), str(etype).upper() == "SQL92")
                try:
                    b.subs[(g, topic)] = parse_subscription(
                        topic, sd.get("subString"), etype, int(sd.get("subVersion") or 0),
                        b.config.enablePropertyFilter)
                except BadRequest as e:   # its pulls get the error
                    log.warning("%s: group %s cannot subscribe %s: %s", peer.addr, g, topic,
                                e.remark)
                    b.subs[(g, topic)] = Subscription(topic, str(sd.get("subString")),
                                                      ALL_TAGS, 0, etype, error=e)
        b.registry.update_subscriptions(g, shared_subs, now)
        key = consumer_key(g, cid)
        t = b.registry.consumers
        new = t.find(key) < 0
        t.put(key, b.cb.slot, now, peer.id,
              1 if str(c.get("messageModel", "")).upper() == "BROADCASTING" else 0,
              payload=client_payload(peer.addr, cmd.language, cmd.version,
                                     str(c.get("consumeType") or ""), str(c.get("consumeFromWhere") or "")))
        b.group_peers.setdefault(g, {})[cid] = peer
        attrs.setdefault("groups", set()).add(g)
        changed |= new
    if changed:
        clients_changed(b)
    reply = cmd.reply(R.SUCCESS)
    reply.version = VERSION_4_9_7
    return reply


def _drop_client(b: Broker, peer: Peer, cid: str, groups) -> None:
    t = b.registry.consumers
    changed = False
    for g in list(groups):
        row = t.find(consumer_key(g, cid))
        if row >= 0 and t.v[row, 0] == b.cb.slot and t.v[row, 2] == peer.id:
            t.delete(row)
            changed = True
        members = b.group_peers.get(g)
        if members and members.get(cid) is peer:
            del members[cid]
            if not members:
                del b.group_peers[g]
                b.notified.pop(g, None)
    if changed:
        clients_changed(b)


def connection_closed(b: Broker, peer: Peer) -> None:
    cid = peer.attrs.get("client_id")
    if cid:
        _drop_client(b, peer, cid, peer.attrs.get("groups", ()))
        t = b.registry.producers
        for g in peer.attrs.get("producer_groups", ()):
            row = t.find(consumer_key(g, cid))
            if row >= 0 and t.v[row, 0] == b.cb.slot and t.v[row, 2] == peer.id:
                t.delete(row)
    b.producer_peers.pop(peer.id, None)


def unregister_client(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    h = Header(cmd.ext)
    cid = h.str("clientID")
    group = h.str("consumerGroup", required=False)
    if group:
        _drop_client(b, peer, cid, [group])
        peer.attrs.get("groups", set()).discard(group)
    return cmd.reply(R.SUCCESS)


def clients_changed(b: Broker) -> None:
    """A group gained or lost a member: every worker re-checks its groups."""
    b.cb.wake_flagged(WANT_CLIENTS)
    b.due = True


def check_clients(b: Broker) -> list[tuple[Peer, Reply]]:
    """NOTIFY_CONSUMER_IDS_CHANGED to this worker's consumers of each group
    whose membership changed (RocketMQ: Broker2Client)."""
    epoch = b.registry.consumers.epoch
    if epoch == b.seen_clients_epoch:
        return []
    b.seen_clients_epoch = epoch
    members = b.registry.members_by_group()
    out = []
    for g, peers in b.group_peers.items():
        now = members.get(g, [])
        if b.notified.get(g) == now:
            continue
        if g in b.notified:
            note = Reply(RemotingCommand(RC.NOTIFY_CONSUMER_IDS_CHANGED, flag=FLAG_ONEWAY,
                                         ext={"consumerGroup": g}))
            out.extend((p, note) for p in peers.values())
        b.notified[g] = now
    return out


def deliver_notices(b: Broker) -> list[tuple[Peer, Reply]]:
    """What other processes left for this worker's clients: transaction
    checks to producers, offset resets to consumers."""
    t = b.registry.notices
    if t.epoch == b.seen_notices_epoch:
        return []
    b.seen_notices_epoch = t.epoch
    out: list = []
    for row, key in t.items():
        if key.startswith(b"check\0"):
            if t.v[row, 0] == b.cb.slot:
                out.extend(_check_note(b, int(t.v[row, 1]), int(t.v[row, 2])))
                t.delete(row)
        elif key.startswith(b"reset\0"):
            seq = int(t.v[row, 3])
            if b.seen_resets.get(key, 0) != seq:
                b.seen_resets[key] = seq
                _, group, topic = key.decode().split("\0")
                out.extend(_reset_notes(b, group, topic, int(t.v[row, 0])))
    return out


def _check_note(b: Broker, peer_id: int, phy: int) -> list[tuple[Peer, Reply]]:
    """CHECK_TRANSACTION_STATE of the half message at ``phy`` to the producer
    on connection ``peer_id``."""
    peer = b.producer_peers.get(peer_id)
    m = stored(b.store, phy)
    if peer is None or peer.closed or m is None:
        return []
    body = check_body(m, b.store_host)
    uniq = m.properties.get(UNIQ_KEY, "")
    note = RemotingCommand(RC.CHECK_TRANSACTION_STATE, flag=FLAG_ONEWAY, ext={
        "tranStateTableOffset": str(m.queue_offset), "commitLogOffset": str(phy),
        "msgId": uniq, "transactionId": uniq, "offsetMsgId": m.offset_msg_id()})
    return [(peer, Reply(note, (body,), len(body)))]


def _reset_notes(b: Broker, group: str, topic: str, ts: int) -> list[tuple[Peer, Reply]]:
    peers = b.group_peers.get(group)
    tc = b.tables.topics.get(topic)
    if not peers or tc is None:
        return []
    table = {qid: b.registry.get_offset(topic, group, qid)
             for qid in range(tc.write_queue_nums)}
    out = []
    for peer in peers.values():
        body = reset_body(topic, b.config.brokerName, table, peer.attrs.get("language", "JAVA"))
        note = RemotingCommand(RC.RESET_CONSUMER_CLIENT_OFFSET, flag=FLAG_ONEWAY, ext={
            "topic": topic, "group": group, "timestamp": str(ts), "isForce": "true"})
        out.append((peer, Reply(note, (body,), len(body))))
    return out


def check_client_config(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """CHECK_CLIENT_CONFIG: a Java consumer asks, at subscribe, whether the
    broker can apply its filter; a bad SQL92 expression is refused here."""
    sd = json_body(cmd).get("subscriptionData")
    if not isinstance(sd, dict):
        raise BadRequest(R.SYSTEM_ERROR, "the body has no subscriptionData")
    parse_subscription(str(sd.get("topic")), sd.get("subString"), sd.get("expressionType"),
                       sql_enabled=b.config.enablePropertyFilter)
    return cmd.reply(R.SUCCESS)


def consumer_list(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    g = Header(cmd.ext).str("consumerGroup")
    members = b.registry.group_members(g)
    if not members:
        raise BadRequest(R.SYSTEM_ERROR, f"no consumer for this group, {g}")
    return json_reply(cmd, {"consumerIdList": members})


def _mq_body(cmd: RemotingCommand) -> tuple[str, str, list[dict]]:
    data = json_body(cmd)
    g, cid, mqs = data.get("consumerGroup"), data.get("clientId"), data.get("mqSet") or []
    if not isinstance(g, str) or not isinstance(cid, str) or not isinstance(mqs, list):
        raise BadRequest(R.SYSTEM_ERROR, "the body needs consumerGroup, clientId and mqSet")
    return g, cid, [m for m in mqs if isinstance(m, dict)]


def lock_batch(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """Orderly consumption: lease each queue to one client for 60 s."""
    g, cid, mqs = _mq_body(cmd)
    t = b.registry.locks
    now = int(time.time() * 1000)
    ok = []
    owner = cid.encode()
    with t.lock.held():
        for mq in mqs:
            key = lock_key(g, str(mq.get("topic")), str(mq.get("brokerName")),
                           int(mq.get("queueId", -1)))
            row = t.find(key)
            if row < 0 or t.payload(row) == owner or now - t.v[row, 0] > LOCK_LEASE_MS:
                row = t.upsert(key, owner)
                t.v[row, 0] = now
                ok.append(mq)
    return json_reply(cmd, {"lockOKMQSet": ok})


def unlock_batch(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    g, cid, mqs = _mq_body(cmd)
    t = b.registry.locks
    owner = cid.encode()
    with t.lock.held():
        for mq in mqs:
            row = t.find(lock_key(g, str(mq.get("topic")), str(mq.get("brokerName")),
                                  int(mq.get("queueId", -1))))
            if row >= 0 and t.payload(row) == owner:
                t.delete(row)
    return cmd.reply(R.SUCCESS)
