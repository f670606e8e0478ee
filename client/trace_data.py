"""Message-trace records: RocketMQ's TraceContext/TraceBean and the text
TraceDataEncoder writes to the trace topic (org.apache.rocketmq.client.trace,
4.9.7). Pure Python with no I/O, so the client, the admin tools and tests
share it.

A trace message's body is records, each its fields joined by
``CONTENT_SPLITOR`` (\\u0001) and ended by ``FIELD_SPLITOR`` (\\u0002),
UTF-8. The fields of each type, in order (``encode`` writes exactly these,
as Java's StringBuilder does: ``None`` as ``null``, booleans as
``true``/``false``, enums by ordinal)::

    Pub        Pub timeStamp regionId groupName topic msgId tags keys storeHost
               bodyLength costTime msgType offsetMsgId success                (14)
    SubBefore  SubBefore timeStamp regionId groupName requestId msgId retryTimes
               keys                                          (8, one per message)
    SubAfter   SubAfter requestId msgId costTime success keys contextCode
               timeStamp groupName                           (9, one per message)
    EndTransaction  EndTransaction timeStamp regionId groupName topic msgId tags
               keys storeHost msgType transactionId transactionState
               fromTransactionCheck                                           (13)

(4.9.7's CLOUD access channel ends SubAfter after contextCode with a
\\u0001 and no \\u0002; shmq's client is never CLOUD, so it never writes that.)

``decode`` reads what ``decoderFromTraceDataString`` reads, as tolerantly:
Pub with 13 fields (no offsetMsgId), 14, or 15+ (the 15th a clientHost, as Go
writes); SubAfter with 6, 7, 8 (no groupName: 4.4–4.9.3) or 9+; text fields
as written (``null`` stays ``null``, as TraceView shows it); records of an
unknown type skipped. Java's ``String.split`` drops trailing empty fields
(an empty keys), which 4.9.7 then fails on; here missing trailing fields are
empty. A record that cannot be one (a number that is not, a type with too
few fields) raises ``TraceFormatError`` naming it.

``TraceContext.keys()`` is what the dispatcher puts in the trace message's
``KEYS`` (TraceTransferBean.transKey): each traced message's msgId and its
own keys, so a QUERY_MESSAGE by key on the trace topic finds the records of
a message by its msgId or by any of its keys.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

CONTENT_SPLITOR = "\x01"
FIELD_SPLITOR = "\x02"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"               # TopicValidator.RMQ_SYS_TRACE_TOPIC
GROUP_NAME_PREFIX = "_INNER_TRACE_PRODUCER"       # TraceConstants
TRACE_INSTANCE_NAME = "PID_CLIENT_INNER_TRACE_PRODUCER"
DEFAULT_REGION = "DefaultRegion"                  # MixAll.DEFAULT_TRACE_REGION_ID


class TraceType(enum.Enum):
    Pub = "Pub"
    SubBefore = "SubBefore"
    SubAfter = "SubAfter"
    EndTransaction = "EndTransaction"


class MessageType(enum.IntEnum):
    """org.apache.rocketmq.common.message.MessageType; written by ordinal."""
    Normal_Msg = 0
    Trans_Msg_Half = 1
    Trans_msg_Commit = 2
    Delay_Msg = 3


class ConsumeReturnType(enum.IntEnum):
    """org.apache.rocketmq.client.consumer.listener.ConsumeReturnType;
    SubAfter's contextCode is its ordinal."""
    SUCCESS = 0
    TIME_OUT = 1
    EXCEPTION = 2
    RETURNNULL = 3
    FAILED = 4


TRANSACTION_STATES = ("COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW")    # LocalTransactionState


class TraceFormatError(ValueError):
    """Text that is not trace records (names the record)."""


@dataclass
class TraceBean:
    """One traced message (TraceBean). Text fields may be None: Java's null."""
    topic: str | None = ""
    msg_id: str | None = ""
    offset_msg_id: str | None = ""
    tags: str | None = ""
    keys: str | None = ""
    store_host: str | None = ""
    client_host: str | None = ""
    store_time: int = 0
    retry_times: int = 0
    body_length: int = 0
    msg_type: MessageType = MessageType.Normal_Msg
    transaction_state: str | None = None           # a TRANSACTION_STATES name
    transaction_id: str | None = None
    from_transaction_check: bool = False


@dataclass
class TraceContext:
    """One trace event (TraceContext): a send (one bean) or a consume (a bean
    per message of the batch). ``time_stamp`` and ``cost_time`` are ms."""
    trace_type: TraceType
    time_stamp: int = field(default_factory=lambda: int(time.time() * 1000))
    region_id: str | None = ""
    group_name: str | None = ""
    cost_time: int = 0
    success: bool = True
    request_id: str | None = ""
    context_code: int = 0
    trace_beans: list[TraceBean] = field(default_factory=list)

    def keys(self) -> list[str]:
        """TraceTransferBean.transKey: each bean's msgId and its keys (split
        at spaces), in order, each once."""
        out: dict[str, None] = {}
        for b in self.trace_beans:
            out[_text(b.msg_id)] = None
            if b.keys:
                out.update(dict.fromkeys(k for k in b.keys.split(" ") if k))
        return list(out)


def _text(v) -> str:
    """StringBuilder.append: null as ``null``, booleans in lower case."""
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    return str(v)


def _record(values) -> str:
    return CONTENT_SPLITOR.join(map(_text, values)) + FIELD_SPLITOR


def encode(ctx: TraceContext) -> str:
    """TraceDataEncoder.encoderFromContextBean's transData: the context's records."""
    t = ctx.trace_type
    if t is TraceType.Pub:
        b = ctx.trace_beans[0]
        return _record((t.value, ctx.time_stamp, ctx.region_id, ctx.group_name, b.topic, b.msg_id,
                        b.tags, b.keys, b.store_host, b.body_length, ctx.cost_time,
                        int(b.msg_type), b.offset_msg_id, ctx.success))
    if t is TraceType.SubBefore:
        return "".join(_record((t.value, ctx.time_stamp, ctx.region_id, ctx.group_name,
                                ctx.request_id, b.msg_id, b.retry_times, b.keys))
                       for b in ctx.trace_beans)
    if t is TraceType.SubAfter:
        return "".join(_record((t.value, ctx.request_id, b.msg_id, ctx.cost_time, ctx.success,
                                b.keys, ctx.context_code, ctx.time_stamp, ctx.group_name))
                       for b in ctx.trace_beans)
    b = ctx.trace_beans[0]
    return _record((t.value, ctx.time_stamp, ctx.region_id, ctx.group_name, b.topic, b.msg_id,
                    b.tags, b.keys, b.store_host, int(b.msg_type), b.transaction_id,
                    b.transaction_state, b.from_transaction_check))


_MIN_FIELDS = {TraceType.Pub: 13, TraceType.SubBefore: 8, TraceType.SubAfter: 6,
               TraceType.EndTransaction: 13}
_TYPES = {t.value: t for t in TraceType}


def decode(text: str) -> list[TraceContext]:
    """TraceDataEncoder.decoderFromTraceDataString: one context, with one
    bean, per record."""
    out = []
    for rec in text.split(FIELD_SPLITOR):
        f = rec.split(CONTENT_SPLITOR)
        t = _TYPES.get(f[0])
        if t is None:              # an unknown type, or the empty text after the last record
            continue
        while f and f[-1] == "":   # Java's split drops trailing empty fields ...
            f.pop()
        if len(f) < _MIN_FIELDS[t]:   # ... which were fields still: empty ones
            f += [""] * (_MIN_FIELDS[t] - len(f))
        try:
            out.append(_decode_one(t, f))
        except (ValueError, IndexError) as e:
            raise TraceFormatError(f"trace record {rec!r}: {e}") from None
    return out


def _decode_one(t: TraceType, f: list[str]) -> TraceContext:
    if t is TraceType.Pub:
        b = TraceBean(topic=f[4], msg_id=f[5], tags=f[6], keys=f[7], store_host=f[8],
                      body_length=int(f[9]), msg_type=MessageType(int(f[11])))
        ctx = TraceContext(t, int(f[1]), f[2], f[3], cost_time=int(f[10]), trace_beans=[b])
        if len(f) == 13:
            ctx.success = _bool(f[12])
        else:
            b.offset_msg_id, ctx.success = f[12], _bool(f[13])
            if len(f) >= 15:
                b.client_host = f[14]
        return ctx
    if t is TraceType.SubBefore:
        b = TraceBean(msg_id=f[5], retry_times=int(f[6]), keys=f[7])
        return TraceContext(t, int(f[1]), f[2], f[3], request_id=f[4], trace_beans=[b])
    if t is TraceType.SubAfter:
        b = TraceBean(msg_id=f[2], keys=f[5])
        ctx = TraceContext(t, 0, "", "", cost_time=int(f[3]), success=_bool(f[4]),
                           request_id=f[1], trace_beans=[b])
        if len(f) >= 7:
            ctx.context_code = int(f[6])
        if len(f) >= 8:
            ctx.time_stamp = int(f[7])
        if len(f) >= 9:
            ctx.group_name = f[8]
        return ctx
    if f[11] not in TRANSACTION_STATES:
        raise ValueError(f"transactionState {f[11]!r} is none of {', '.join(TRANSACTION_STATES)}")
    b = TraceBean(topic=f[4], msg_id=f[5], tags=f[6], keys=f[7], store_host=f[8],
                  msg_type=MessageType(int(f[9])), transaction_id=f[10], transaction_state=f[11],
                  from_transaction_check=_bool(f[12]))
    return TraceContext(t, int(f[1]), f[2], f[3], trace_beans=[b])


def _bool(s: str) -> bool:
    """Boolean.parseBoolean: ``true`` in any case, anything else false."""
    return s.lower() == "true"


__all__ = ["CONTENT_SPLITOR", "ConsumeReturnType", "DEFAULT_REGION", "FIELD_SPLITOR",
           "GROUP_NAME_PREFIX", "MessageType", "TRACE_INSTANCE_NAME", "TRACE_TOPIC",
           "TRANSACTION_STATES", "TraceBean", "TraceContext", "TraceFormatError", "TraceType",
           "decode", "encode"]
