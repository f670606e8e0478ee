"""Offsets: a group's committed offsets (shared by every worker, in the
registry), a queue's min and max offset, offset by store time, and
INVOKE_BROKER_TO_RESET_OFFSET, which moves a group's offsets and tells its
consumers (a notice the driver sends once the handler has posted it), and
the tables a slave copies: every committed offset, every delay level's progress."""
from __future__ import annotations

from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.control import WANT_CLIENTS
from shmq.ipc.headers import BadRequest, Header
from shmq.ipc.remoting import RemotingCommand

from ..delivery import Progress, reset_body
from ..registry import post_notice
from ..schedule import delay_offset_table
from .base import Broker, Peer, json_reply


def query_consumer_offset(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    h = Header(cmd.ext)
    group, topic, qid = h.str("consumerGroup"), h.str("topic"), h.int("queueId")
    off = b.registry.get_offset(topic, group, qid)
    if off >= 0:
        return cmd.reply(R.SUCCESS, ext={"offset": str(off)})
    if b.store.min_offset(topic, qid) <= 0:
        # A new group on a queue that still has its first message: from 0
        # (ConsumerManageProcessor.queryConsumerOffset).
        return cmd.reply(R.SUCCESS, ext={"offset": "0"})
    return cmd.reply(R.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe")


def update_consumer_offset(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    h = Header(cmd.ext)
    b.registry.commit_offset(h.str("topic"), h.str("consumerGroup"), h.int("queueId"),
                             h.int("commitOffset"))
    return cmd.reply(R.SUCCESS)


def all_consumer_offsets(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """GET_ALL_CONSUMER_OFFSET: every committed offset, in consumerOffset.json's
    shape (what a slave copies from its master: broker/ha/sync.py)."""
    return json_reply(cmd, {"offsetTable": b.registry.offset_table()})


def all_delay_offsets(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """GET_ALL_DELAY_OFFSET: each delay level's progress, in delayOffset.json's
    shape, read from the services process's cursors as they are now (what a
    slave copies from its master: broker/ha/sync.py)."""
    c = b.config
    table = delay_offset_table(b.store, Progress.peek(c.store.storePathRootDir),
                               len(c.delay_levels_ms))
    return json_reply(cmd, {"offsetTable": table})


def _queue(cmd: RemotingCommand) -> tuple[str, int]:
    h = Header(cmd.ext)
    return h.str("topic"), h.int("queueId")


def get_max_offset(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    topic, qid = _queue(cmd)
    return cmd.reply(R.SUCCESS, ext={"offset": str(b.store.max_offset(topic, qid))})


def get_min_offset(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    topic, qid = _queue(cmd)
    return cmd.reply(R.SUCCESS, ext={"offset": str(b.store.min_offset(topic, qid))})


def search_offset(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """The queue offset whose store time is nearest ``timestamp``
    (ConsumeQueue.getOffsetInQueueByTime): binary search by store time."""
    topic, qid = _queue(cmd)
    ts = Header(cmd.ext).int("timestamp")
    store = b.store
    lo, hi = store.min_offset(topic, qid), store.max_offset(topic, qid)
    best = store.offset_by_time(topic, qid, ts)       # first offset stored at or after ts
    if best >= hi:
        best = max(lo, hi - 1)
    elif best > lo:
        t_at = store.store_time(topic, qid, best)
        t_before = store.store_time(topic, qid, best - 1)
        if t_at is not None and t_before is not None and t_at != ts \
                and ts - t_before < t_at - ts:
            best -= 1
    return cmd.reply(R.SUCCESS, ext={"offset": str(best)})


def earliest_store_time(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    topic, qid = _queue(cmd)
    t = b.store.store_time(topic, qid, b.store.min_offset(topic, qid))
    if t is None:
        raise BadRequest(R.SYSTEM_ERROR, f"the queue {topic}:{qid} holds no message")
    return cmd.reply(R.SUCCESS, ext={"timestamp": str(t)})


def reset_offset(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """INVOKE_BROKER_TO_RESET_OFFSET (回溯消费): commit each queue's offset
    at ``timestamp`` (-1: the end) for the group and tell its online
    consumers (RESET_CONSUMER_CLIENT_OFFSET); without ``isForce`` an
    offset only moves back (Broker2Client.resetOffset)."""
    h = Header(cmd.ext)
    topic, group, ts = h.str("topic"), h.str("group"), h.int("timestamp")
    force = h.bool("isForce", True)
    tc = b.tables.topics.get(topic)
    if tc is None:
        raise BadRequest(R.TOPIC_NOT_EXIST, f"[reset-offset] request reset offset, but the "
                                            f"topic[{topic}] not exist")
    table = {}
    for qid in range(tc.write_queue_nums):
        current = b.registry.get_offset(topic, group, qid)
        if current < 0 and b.tables.groups.get(group) is None:
            raise BadRequest(R.SYSTEM_ERROR, f"THe consumer group <{group}> not exist")
        at = b.store.max_offset(topic, qid) if ts == -1 else b.store.offset_by_time(topic, qid, ts)
        if not force and 0 <= current < at:
            at = current
        table[qid] = at
    for qid, at in table.items():
        b.registry.commit_offset(topic, group, qid, at)
    post_notice(b.registry.notices, f"reset\0{group}\0{topic}".encode(), ts)
    b.cb.wake_flagged(WANT_CLIENTS)
    b.due = True                      # this worker's own consumers: the driver sends the notice
    return cmd.reply(R.SUCCESS, body=reset_body(topic, b.config.brokerName, table, cmd.language))
