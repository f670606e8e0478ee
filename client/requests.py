"""RocketMQ 4.x requests a producer or consumer sends, and the records pulls return.

Builders return ``RemotingCommand``s ready for ``RemotingClient``:
``send_message`` (SEND_MESSAGE_V2, or SEND_BATCH_MESSAGE with ``batch_body``),
``pull_message``, ``create_topic``; ``decode_records`` turns a pull (or
VIEW/QUERY) body back into ``StoredMessage``s.

``SendTemplate`` is the producer's hot path: the whole SEND_MESSAGE_V2 /
SEND_BATCH_MESSAGE frame from a pre-built JSON header with the per-send
numbers filled in, byte for byte what ``encode(RemotingCommand(...))``
writes (tests check it), at a fraction of the cost (no ext dict, no copy).
With credentials its frames carry ``AccessKey`` and the ``Signature`` that
``ipc.signing.sign`` would add: the signed text is the constant values
joined once and the per-send ones, in the keys' order (AccessKey, a … m).
"""
from __future__ import annotations

import struct
import time

import orjson

from shmq.core.layout import properties_to_string
from shmq.ipc.codes import RequestCode
from shmq.ipc.headers import PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION, PULL_SUSPEND, pull_ext, send_ext
from shmq.ipc.remoting import VERSION_4_9_7, RemotingCommand
from shmq.ipc.signing import Credentials, sign_text

from .connection import LANGUAGE

_ENTRY = struct.Struct(">iiiii")


def properties(tags: str | None = None, keys: str | list[str] | None = None,
               extra: dict[str, str] | None = None) -> str:
    d = dict(extra or {})
    if tags:
        d["TAGS"] = tags
    if keys:
        d["KEYS"] = keys if isinstance(keys, str) else " ".join(keys)
    return properties_to_string(d)


def send_message(topic: str, body: bytes, *, tags: str | None = None, keys=None,
                 queue_id: int = -1, group: str = "shmq-producer", props: dict | None = None,
                 default_queues: int = 4, flag: int = 0, sysflag: int = 0) -> RemotingCommand:
    return RemotingCommand(RequestCode.SEND_MESSAGE_V2, body=body, ext=send_ext(
        producerGroup=group, topic=topic, defaultTopic="TBW102",
        defaultTopicQueueNums=default_queues, queueId=queue_id, sysFlag=sysflag,
        bornTimestamp=int(time.time() * 1000), flag=flag, properties=properties(tags, keys, props),
        reconsumeTimes=0, unitMode=False, batch=False))


_PREFIX = struct.Struct(">ii")


class SendTemplate:
    """SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE frames of one producer group to one
    topic: the JSON header ``ipc.remoting.encode_header`` writes for them, its
    constant parts joined once. ``frame`` fills in opaque, queue, sysflag,
    born timestamp, flag and properties and appends the body."""

    __slots__ = ("_v2", "_batch", "_secret", "_signed")

    def __init__(self, group: str, topic: str, create_topic_key: str, default_queues: int,
                 credentials: Credentials | None = None):
        def literal(text: str) -> bytes:    # JSON, its '%' kept from the per-send formatting
            return orjson.dumps(text).replace(b"%", b"%%")

        signed = b""
        if credentials is not None:     # inserted as is: its one %s is the Signature's place
            signed = b',"AccessKey":%s,"Signature":"%%s"' % literal(credentials.access_key)

        def head(code: int) -> bytes:
            return (b'{"code":%d,"language":"%s","version":%d,"opaque":%%d,"flag":0,'
                    b'"serializeTypeCurrentRPC":"JSON","extFields":{"a":%s,"b":%s,"c":%s,'
                    b'"d":"%d","e":"%%d","f":"%%d","g":"%%d","h":"%%d","i":%%s,"j":"0",'
                    b'"k":"false","m":"%%s"%s}}'
                    % (code, LANGUAGE.encode(), VERSION_4_9_7, literal(group), literal(topic),
                       literal(create_topic_key), default_queues, signed))
        self._v2 = head(RequestCode.SEND_MESSAGE_V2)
        self._batch = head(RequestCode.SEND_BATCH_MESSAGE)
        self._secret = None if credentials is None else credentials.secret_key
        # the signed text's constant start: AccessKey, a, b, c, d
        self._signed = None if credentials is None else \
            f"{credentials.access_key}{group}{topic}{create_topic_key}{default_queues}"

    def frame(self, opaque: int, queue_id: int, sysflag: int, born_ms: int, flag: int,
              props: str, body: bytes, batch: bool = False) -> bytes:
        """The whole frame (``props`` is the properties string; "" for a batch)."""
        m = b"true" if batch else b"false"
        fields = (opaque, queue_id, sysflag, born_ms, flag, orjson.dumps(props), m)
        if self._secret is not None:
            text = f"{self._signed}{queue_id}{sysflag}{born_ms}{flag}{props}0false{m.decode()}"
            fields += (sign_text(self._secret, text, body).encode(),)
        h = (self._batch if batch else self._v2) % fields
        return _PREFIX.pack(4 + len(h) + len(body), len(h)) + h + body


def batch_body(messages: list[tuple[bytes, str]]) -> bytes:
    """(body, properties string) pairs as a SEND_BATCH_MESSAGE body (reference §5.5)."""
    out = []
    for body, props in messages:
        pb = props.encode()
        out.append(_ENTRY.pack(20 + len(body) + 2 + len(pb), 0, 0, 0, len(body)))
        out.append(body)
        out.append(struct.pack(">h", len(pb)))
        out.append(pb)
    return b"".join(out)


def send_batch(topic: str, messages: list[tuple[bytes, str]], *, queue_id: int = -1,
               group: str = "shmq-producer") -> RemotingCommand:
    cmd = send_message(topic, batch_body(messages), queue_id=queue_id, group=group)
    cmd.code = RequestCode.SEND_BATCH_MESSAGE
    cmd.ext["m"] = "true"
    cmd.ext["i"] = ""
    return cmd


def pull_message(topic: str, queue_id: int, offset: int, *, group: str = "shmq-consumer",
                 max_msgs: int = 32, subscription: str = "*", suspend_ms: int = 0,
                 commit_offset: int | None = None) -> RemotingCommand:
    flag = PULL_SUBSCRIPTION | (PULL_SUSPEND if suspend_ms else 0)
    if commit_offset is not None:
        flag |= PULL_COMMIT_OFFSET
    return RemotingCommand(RequestCode.PULL_MESSAGE, ext=pull_ext(
        consumerGroup=group, topic=topic, queueId=queue_id, queueOffset=offset,
        maxMsgNums=max_msgs, sysFlag=flag, commitOffset=commit_offset or 0,
        suspendTimeoutMillis=suspend_ms, subscription=subscription, subVersion=0,
        expressionType="TAG"))


def create_topic(topic: str, queues: int = 4, perm: int = 6, order: bool = False) -> RemotingCommand:
    return RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext={
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(queues),
        "writeQueueNums": str(queues), "perm": str(perm), "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0", "order": str(order).lower()})


def decode_records(body) -> list:
    """Every record of ``body`` as a ``shmq.core.records.StoredMessage`` (imported
    here, not at the top: the client's own paths never need core.records and
    its numba kernels)."""
    from shmq.core.records import decode
    out = []
    pos = 0
    n = len(body)
    while pos < n:
        m = decode(body, pos)
        out.append(m)
        pos += m.total_size
    return out


def send_back(group: str, phy_offset: int, delay_level: int = 0,
              max_reconsume_times: int | None = None, origin_msg_id: str = "",
              origin_topic: str = "") -> RemotingCommand:
    """CONSUMER_SEND_MSG_BACK: the message at ``phy_offset`` failed; retry it later."""
    ext = {"group": group, "offset": str(phy_offset), "delayLevel": str(delay_level),
           "originMsgId": origin_msg_id, "originTopic": origin_topic, "unitMode": "false"}
    if max_reconsume_times is not None:
        ext["maxReconsumeTimes"] = str(max_reconsume_times)
    return RemotingCommand(RequestCode.CONSUMER_SEND_MSG_BACK, ext=ext)


COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0


def end_transaction(group: str, half_queue_offset: int, half_phy: int, state: int,
                    msg_id: str = "", from_check: bool = False) -> RemotingCommand:
    """END_TRANSACTION: COMMIT (8), ROLLBACK (12) or UNKNOWN (0) for a half message."""
    return RemotingCommand(RequestCode.END_TRANSACTION, ext={
        "producerGroup": group, "tranStateTableOffset": str(half_queue_offset),
        "commitLogOffset": str(half_phy), "commitOrRollback": str(state),
        "fromTransactionCheck": str(from_check).lower(), "msgId": msg_id,
        "transactionId": msg_id})


def heartbeat(client_id: str, producer_groups=(), consumers: list[dict] | None = None) -> RemotingCommand:
    """HEART_BEAT with producer groups and consumer data (reference §4.2)."""
    body = {"clientID": client_id,
            "producerDataSet": [{"groupName": g} for g in producer_groups],
            "consumerDataSet": consumers or []}
    return RemotingCommand(RequestCode.HEART_BEAT, body=orjson.dumps(body))
