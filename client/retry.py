"""How a message a listener could not consume goes back: the retry topic.

Every consumer group has ``%RETRY%<group>``; a clustering push consumer
subscribes to it beside its topics. A failed message goes back by
CONSUMER_SEND_MSG_BACK (``send_message_back``: the broker copies the stored
record there with a delay level, or to ``%DLQ%<group>`` once it was retried
``max_reconsume_times``); when the broker cannot, the client re-sends the
message to the retry topic itself (``send_to_retry_topic``, which the
orderly service also uses to give a message up). Messages read back from
the retry topic show their original topic again (``restore_retry_topic``).

Both consume services call these; they return False where the message is
still the caller's to retry, and never raise for a broker that is gone or
refuses (it is logged). RocketMQ has them in DefaultMQPushConsumerImpl.
"""
from __future__ import annotations

import logging
import time
import zlib

from shmq.core.layout import properties_to_string
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.headers import send_ext
from shmq.ipc.remoting import RemotingCommand

from .errors import MQClientError, RemotingError
from .instance import ClientInstance
from .message import MAX_OFFSET, MIN_OFFSET, MessageExt
from .requests import send_back

log = logging.getLogger("shmq.client")
RETRY_PREFIX = "%RETRY%"
RETRY_TOPIC, ORIGIN_MESSAGE_ID, DELAY = "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "DELAY"
TRAN_MSG = "TRAN_MSG"
SYSFLAG_COMPRESSED = 0x1
SEND_BACK_TIMEOUT = 5.0


def restore_retry_topic(msgs: list[MessageExt], group: str) -> None:
    """A message from %RETRY%<group> shows its original topic
    (DefaultMQPushConsumerImpl.resetRetryAndNamespace)."""
    retry = RETRY_PREFIX + group
    for m in msgs:
        if m.topic == retry:
            original = m.properties.get(RETRY_TOPIC)
            if original:
                m.topic = original


async def send_message_back(inst: ClientInstance, group: str, msg: MessageExt, delay_level: int,
                            max_reconsume_times: int, broker_name: str) -> bool:
    """CONSUMER_SEND_MSG_BACK; if the broker cannot take it, a re-send to
    %RETRY%<group> (DefaultMQPushConsumerImpl.sendMessageBack)."""
    cmd = send_back(group, msg.commit_log_offset, delay_level, max_reconsume_times,
                    origin_msg_id=msg.msg_id, origin_topic=msg.topic)
    cmd.ext["bname"] = broker_name
    try:
        r = await inst.invoke(broker_name, cmd, SEND_BACK_TIMEOUT)
        if r.code == R.SUCCESS:
            return True
        error: Exception = MQClientError(r.code, r.remark, "send back")
    except (RemotingError, MQClientError) as e:
        error = e
    log.warning("send back %s of %s: %s; re-sending it to the retry topic", msg.msg_id,
                group, error)
    return await send_to_retry_topic(inst, group, msg, msg.reconsume_times + 1,
                                     max_reconsume_times, broker_name)


async def send_to_retry_topic(inst: ClientInstance, group: str, msg: MessageExt, reconsume_times: int,
                              max_reconsume_times: int, broker_name: str) -> bool:
    """A new message to %RETRY%<group> carrying the original's properties;
    the broker sends it to %DLQ%<group> once ``reconsume_times`` reaches
    the maximum (the fallback of sendMessageBack, and how orderly gives up)."""
    props = {k: v for k, v in msg.properties.items() if k not in (MIN_OFFSET, MAX_OFFSET, TRAN_MSG)}
    props.setdefault(ORIGIN_MESSAGE_ID, msg.msg_id)
    props[RETRY_TOPIC] = msg.topic
    props[DELAY] = str(3 + msg.reconsume_times)
    body, sysflag = msg.body, 0
    if len(body) > 4096:
        body, sysflag = zlib.compress(body, 5), SYSFLAG_COMPRESSED
    topic = RETRY_PREFIX + group
    cmd = RemotingCommand(RC.SEND_MESSAGE_V2, body=body, ext=send_ext(
        producerGroup=group, topic=topic, defaultTopic="TBW102", defaultTopicQueueNums=4,
        queueId=-1, sysFlag=sysflag, bornTimestamp=int(time.time() * 1000), flag=msg.flag,
        properties=properties_to_string(props), reconsumeTimes=reconsume_times,
        unitMode=False, maxReconsumeTimes=max_reconsume_times, batch=False))
    try:
        r = await inst.invoke(broker_name, cmd, SEND_BACK_TIMEOUT)
    except (RemotingError, MQClientError) as e:
        log.warning("re-send %s of %s to %s: %s", msg.msg_id, group, topic, e)
        return False
    if r.code != R.SUCCESS:
        log.warning("re-send %s of %s to %s: code %d, %s", msg.msg_id, group, topic,
                    r.code, r.remark)
    return r.code == R.SUCCESS


__all__ = ["RETRY_PREFIX", "restore_retry_topic", "send_message_back", "send_to_retry_topic"]
