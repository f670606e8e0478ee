"""Reading a message's trace (mqadmin queryMsgTraceById, RocketMQ's TraceView).

Trace records are ordinary messages on the trace topic whose ``KEYS`` name
the traced messages' msgIds (client/trace.py), so a message's trace is a
QUERY_MESSAGE by key — the msgId — on the trace topic, at every broker that
hosts it, as ``queryMsgByKey`` asks (``AdminClient.query_messages``). Of
what comes back, the messages whose keys hold the msgId are decoded
(``shmq.client.trace_data``: any RocketMQ client's records read the same)
and the records of that msgId kept (a body over 4 KiB was compressed by
the trace producer, as Java's does). Like the broker's index, it only sees
what the brokers still hold; a trace message over 64 matches per broker is
not seen (mqadmin's ``maxNum``).
"""
from __future__ import annotations

import zlib

from shmq.client.trace_data import TRACE_TOPIC, TraceFormatError, decode

from .admin_client import AdminClient, AdminError

SYSFLAG_COMPRESSED = 0x1       # a trace producer compresses bodies over 4 KiB, as any producer
_ORDER = {"Pub": 0, "SubBefore": 1, "SubAfter": 2, "EndTransaction": 3}    # within one ms


def query_msg_trace(a: AdminClient, msg_id: str, trace_topic: str = TRACE_TOPIC) -> list[dict]:
    """The trace records of the message ``msg_id`` (its client msgId,
    UNIQ_KEY), oldest first (within a ms: Pub, SubBefore, SubAfter), one
    dict per record with TraceView's names —
    ``traceType`` (Pub, SubBefore, SubAfter, EndTransaction), ``timeStamp``
    (ms), ``regionId``, ``groupName``, ``clientHost`` (the host that sent the
    trace: its born host), ``costTime`` (ms), ``success`` and ``status``
    (success/failed), ``requestId`` (pairs a SubBefore with its SubAfter),
    ``msgId``, ``topic``, ``tags``, ``keys``, ``storeHost``, ``bodyLength``,
    ``msgType`` (MessageType's name), ``offsetMsgId``, ``retryTimes``,
    ``contextCode`` (ConsumeReturnType's ordinal), ``transactionId``,
    ``transactionState`` and ``fromTransactionCheck`` (EndTransaction),
    ``brokerName`` (where the trace message is). Text fields are as the
    client wrote them (Java's ``null`` included). [] if nothing traced it;
    AdminError if the trace topic has no route (no trace was ever sent to
    it), a broker refuses, or a trace message is not trace records."""
    msg_id = msg_id.strip()
    if not msg_id:
        raise AdminError("no msgId given")
    route = a.route_or_none(trace_topic)
    if route is None:
        raise AdminError(f"trace topic {trace_topic} does not exist: the NameServer has no route "
                         f"for it (no client with enableMsgTrace sent to it, and no broker has "
                         f"traceTopicEnable=true)")
    out = []
    for name, addr in a.route_readers(route):
        for m in a.query_messages(addr, trace_topic, msg_id):
            if m.topic != trace_topic or msg_id not in m.keys:
                continue
            try:
                body = zlib.decompress(m.body) if m.sysflag & SYSFLAG_COMPRESSED else m.body
                contexts = decode(body.decode("utf-8", "replace"))
            except (TraceFormatError, zlib.error) as e:
                raise AdminError(f"trace message {m.offset_msg_id()} on {name}: {e}") from None
            host = f"{m.born_host[0]}:{m.born_host[1]}"
            out += [_view(c, host, name) for c in contexts if c.trace_beans[0].msg_id == msg_id]
    out.sort(key=lambda v: (v["timeStamp"], _ORDER[v["traceType"]]))
    return out


def _view(c, client_host: str, broker_name: str) -> dict:
    b = c.trace_beans[0]
    return {"traceType": c.trace_type.value, "timeStamp": c.time_stamp, "regionId": c.region_id,
            "groupName": c.group_name, "clientHost": client_host, "costTime": c.cost_time,
            "success": c.success, "status": "success" if c.success else "failed",
            "requestId": c.request_id, "msgId": b.msg_id, "topic": b.topic, "tags": b.tags,
            "keys": b.keys, "storeHost": b.store_host, "bodyLength": b.body_length,
            "msgType": b.msg_type.name, "offsetMsgId": b.offset_msg_id,
            "retryTimes": b.retry_times, "contextCode": c.context_code,
            "transactionId": b.transaction_id, "transactionState": b.transaction_state,
            "fromTransactionCheck": b.from_transaction_check, "brokerName": broker_name}


__all__ = ["query_msg_trace"]
