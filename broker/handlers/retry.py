"""Messages a consumer failed: CONSUMER_SEND_MSG_BACK (to %RETRY%group after a
back-off, or %DLQ%group), and a consumer's own re-send to %RETRY%group that
has used up its reconsume times (to %DLQ%group; the send handler asks).
"""
from __future__ import annotations

import random
import time

from shmq.core.layout import properties_to_string, string_to_properties
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.counters import SNDBCK
from shmq.ipc.headers import BadRequest, Header
from shmq.ipc.remoting import RemotingCommand

from ..delivery import DELAY, ORIGIN_MESSAGE_ID, RETRY_TOPIC, repost, route_send, stored
from ..topics import DLQ_GROUP_TOPIC_PREFIX, PERM_WRITE, RETRY_GROUP_TOPIC_PREFIX, TopicConfig
from .base import Broker, Peer

VERSION_3_4_9 = 121         # clients from here on may send their own maxReconsumeTimes


def dlq_topic(b: Broker, group: str) -> TopicConfig:
    tc = b.tables.dlq_topic(group)
    if not tc.perm & PERM_WRITE:
        raise BadRequest(R.NO_PERMISSION, f"the topic[{tc.name}] sending message is forbidden")
    return tc


def retry_or_dlq(b: Broker, h: Header, topic: str, qid: int, props: str) -> tuple[str, int, str]:
    """A consumer's own re-send to %RETRY%group goes to %DLQ%group once it
    has been consumed maxReconsumeTimes times (handleRetryAndDLQ)."""
    group = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
    gc = b.tables.group(group, b.config.autoCreateSubscriptionGroup)
    if gc is None:
        raise BadRequest(R.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
    max_times = h.int("maxReconsumeTimes", gc.retry_max_times)
    if h.int("reconsumeTimes", 0) < max_times:
        return topic, qid, props
    d = string_to_properties(props)
    d.pop(DELAY, None)
    dlq_topic(b, group)
    return DLQ_GROUP_TOPIC_PREFIX + group, 0, properties_to_string(d)


def send_back(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """CONSUMER_SEND_MSG_BACK: a message the consumer failed goes to
    %RETRY%group after the back-off of its next level (3 + times
    consumed), or to %DLQ%group once consumed maxReconsumeTimes times
    (SendMessageProcessor.asyncConsumerSendMsgBack)."""
    h = Header(cmd.ext)
    group, phy, delay = h.str("group"), h.int("offset"), h.int("delayLevel")
    b.check_writable()
    b.check_disk()
    gc = b.tables.group(group, b.config.autoCreateSubscriptionGroup)
    if gc is None:
        raise BadRequest(R.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
    retry_queues = gc.retry_queue_nums
    if retry_queues <= 0:
        return cmd.reply(R.SUCCESS)
    m = stored(b.store, phy)
    if m is None:
        raise BadRequest(R.SYSTEM_ERROR, f"look message by offset failed, {phy}")
    d = m.properties
    d.setdefault(RETRY_TOPIC, m.topic)
    d.setdefault(ORIGIN_MESSAGE_ID, d.get(ORIGIN_MESSAGE_ID) or m.offset_msg_id())
    max_times = gc.retry_max_times
    if cmd.version >= VERSION_3_4_9 and h.int("maxReconsumeTimes", -1) >= 0:
        max_times = h.int("maxReconsumeTimes")     # the client's own limit
    if m.reconsume_times >= max_times or delay < 0:
        dlq_topic(b, group)
        topic, qid = DLQ_GROUP_TOPIC_PREFIX + group, 0
        d.pop(DELAY, None)
    else:
        tc = b.tables.retry_topic(group)
        if not tc.perm & PERM_WRITE:
            raise BadRequest(R.NO_PERMISSION, f"the topic[{tc.name}] sending message is forbidden")
        topic, qid = tc.name, random.randrange(max(1, retry_queues))
        d[DELAY] = str(delay or 3 + m.reconsume_times)
    c = b.config
    now = int(time.time() * 1000)
    r = route_send(topic, qid, m.sysflag, properties_to_string(d),
                   now_ms=now, delay_levels=b.delay_levels,
                   timer_enable=c.timerWheelEnable, timer_max_delay_ms=c.timerMaxDelaySec * 1000,
                   reject_transactions=c.rejectTransactionMessage)
    batch = repost(m, r.topic, r.queue_id, r.properties, store_host=b.store_host,
                   reconsume_times=m.reconsume_times + 1, tags_code=r.tags_code,
                   store_timestamp=now)
    b.store.append(batch)
    b.put_count += 1
    if b.stats.tally is not None:                # SNDBCK_PUT_NUMS, by the original topic
        b.stats.tally.get(d[RETRY_TOPIC], group, 1, 0, SNDBCK)
    return cmd.reply(R.SUCCESS)
