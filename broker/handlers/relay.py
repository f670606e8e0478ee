"""Requests the broker passes on to one consumer client and whose answer it
returns (AdminBrokerProcessor.callConsumer): GET_CONSUMER_RUNNING_INFO
(307) and CONSUME_MESSAGE_DIRECTLY (309, with the stored message as its
body, found by the offset in its msgId, and ``brokerName`` added).

The admin's request may reach any worker, and the consumer's connection
is held by one (the registry's consumer row: its worker slot and
connection id). So the asking worker writes the request (code, ext, body)
to ``<store>/relay/<id>.req``, posts a ``relay\\0<id>`` notice for the
holder (the registry's notices table, as transaction check-backs go) and
wakes it, and parks the admin's request. The holder sends the request to
its client under an opaque of its own; when the client answers, it writes
the answer to ``<id>.resp`` and posts ``relayed\\0<id>`` back. The asker
answers the admin with the client's code, remark and body. The same steps
run when both are one worker. No answer in RELAY_TIMEOUT_S (RocketMQ's
10 s): CONSUME_MSG_TIMEOUT, as RocketMQ's RemotingTimeoutException; a
consumer not registered: SYSTEM_ERROR "The Consumer <g> <c> not online".
"""
from __future__ import annotations

import itertools
import os
import struct
import time

import orjson
from shmq.core.files import FILE_MODE, make_dirs
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.headers import BadRequest, Header
from shmq.ipc.remoting import RemotingCommand

from ..delivery import stored
from ..registry import CLIENT_EXPIRED_MS, consumer_key, post_notice
from .base import PARKED, Broker, Peer, Reply

RELAY_TIMEOUT_S = 10.0
OPAQUE_BASE = 1 << 30            # the relayed requests' opaques, apart from a client's own
_LEN = struct.Struct(">I")


class Relays:
    """One worker's relays: the admin requests it parked (id → peer, command,
    deadline) and the client requests it sent (opaque → id, asker slot, deadline)."""

    def __init__(self):
        self.asked: dict[str, tuple[Peer, RemotingCommand, float]] = {}
        self.sent: dict[int, tuple[str, int, float]] = {}
        self.seen_epoch = -1
        self.ids = itertools.count(1)


def _dir(b: Broker) -> str:
    d = os.path.join(b.store.root, "relay")
    make_dirs(d)                        # owner-only, as everything under the store
    return d


def _write(path: str, head: dict, body: bytes) -> None:
    h = orjson.dumps(head)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    with open(fd, "wb") as f:
        f.write(_LEN.pack(len(h)) + h + bytes(body))
    os.replace(tmp, path)


def _read(path: str) -> tuple[dict, bytes]:
    with open(path, "rb") as f:
        raw = f.read()
    os.unlink(path)
    n = _LEN.unpack_from(raw)[0]
    return orjson.loads(raw[4:4 + n]), raw[4 + n:]


def call_consumer(b: Broker, peer: Peer, cmd: RemotingCommand):
    h = Header(cmd.ext)
    group, cid = h.str("consumerGroup"), h.str("clientId")
    t = b.registry.consumers
    row = t.find(consumer_key(group, cid))
    if row < 0 or int(time.time() * 1000) - t.v[row, 1] >= CLIENT_EXPIRED_MS:
        raise BadRequest(R.SYSTEM_ERROR, f"The Consumer <{group}> <{cid}> not online")
    ext, body = dict(cmd.ext), bytes(cmd.body)
    if cmd.code == RC.CONSUME_MESSAGE_DIRECTLY:
        ext["brokerName"] = b.config.brokerName
        try:
            phy = int(h.str("msgId")[16:32], 16)      # an offset msgId: host, port, offset
        except ValueError:
            phy = -1
        m = stored(b.store, phy) if phy >= 0 else None
        if m is not None:                 # else sent without, as RocketMQ does
            body = bytes(b.store.record_view(phy, m.total_size))
    rid = f"{b.cb.slot}-{os.getpid()}-{next(b.relays.ids)}"
    _write(os.path.join(_dir(b), rid + ".req"), {"code": cmd.code, "ext": ext}, body)
    target = int(t.v[row, 0])
    post_notice(b.registry.notices, f"relay\0{rid}".encode(), target, int(t.v[row, 2]), b.cb.slot)
    b.relays.asked[rid] = (peer, cmd, time.monotonic() + RELAY_TIMEOUT_S)
    b.cb.wake(target)
    return PARKED


def answered(b: Broker, peer: Peer, cmd: RemotingCommand) -> None:
    """A client's response: the answer to a request this worker relayed, if it is one."""
    hit = b.relays.sent.pop(cmd.opaque, None)
    if hit is None:
        return None
    rid, asker, _ = hit
    _write(os.path.join(_dir(b), rid + ".resp"),
           {"code": cmd.code, "remark": cmd.remark, "ext": cmd.ext}, bytes(cmd.body))
    post_notice(b.registry.notices, f"relayed\0{rid}".encode(), asker)
    b.cb.wake(asker)
    return None


def deliver(b: Broker) -> list[tuple[Peer, Reply]]:
    """Once a second and on a wake-up: requests to send to this worker's
    clients, answers to give this worker's admins, and what timed out."""
    rel, out = b.relays, []
    t = b.registry.notices
    if t.epoch != rel.seen_epoch:
        rel.seen_epoch = t.epoch
        for row, key in list(t.items()):
            if int(t.v[row, 0]) != b.cb.slot:
                continue
            if key.startswith(b"relay\0"):
                rid = key[6:].decode()
                conn_id, asker = int(t.v[row, 1]), int(t.v[row, 2])
                t.delete(row)
                out.extend(_send(b, rid, conn_id, asker))
            elif key.startswith(b"relayed\0"):
                rid = key[8:].decode()
                t.delete(row)
                out.extend(_answer(b, rid))
    now = time.monotonic()
    for rid, (peer, cmd, deadline) in list(rel.asked.items()):
        if now >= deadline:
            del rel.asked[rid]
            h = Header(cmd.ext)
            out.append((peer, Reply(cmd.reply(R.CONSUME_MSG_TIMEOUT, (
                f"consumer <{h.str('consumerGroup', '')}> <{h.str('clientId', '')}> Timeout: "
                f"no answer in {RELAY_TIMEOUT_S:.0f} s")))))
            for ext in (".req", ".resp"):
                try:
                    os.unlink(os.path.join(_dir(b), rid + ext))
                except FileNotFoundError:
                    pass
    for opaque, (_, _, deadline) in list(rel.sent.items()):
        if now >= deadline:
            del rel.sent[opaque]
    return out


def _send(b: Broker, rid: str, conn_id: int, asker: int) -> list[tuple[Peer, Reply]]:
    try:
        head, body = _read(os.path.join(_dir(b), rid + ".req"))
    except FileNotFoundError:          # the asker gave up and removed it
        return []
    ext = head["ext"]
    group, cid = ext.get("consumerGroup", ""), ext.get("clientId", "")
    peer = b.group_peers.get(group, {}).get(cid)
    if peer is None or peer.closed or peer.id != conn_id:
        _write(os.path.join(_dir(b), rid + ".resp"),
               {"code": R.SYSTEM_ERROR, "remark": f"The Consumer <{group}> <{cid}> not online",
                "ext": {}}, b"")
        post_notice(b.registry.notices, f"relayed\0{rid}".encode(), asker)
        b.cb.wake(asker)
        return []
    opaque = OPAQUE_BASE + next(b.relays.ids)
    b.relays.sent[opaque] = (rid, asker, time.monotonic() + RELAY_TIMEOUT_S)
    req = RemotingCommand(head["code"], opaque=opaque, ext=ext, body=body)
    return [(peer, Reply(req, (body,), len(body)) if body else Reply(req))]


def _answer(b: Broker, rid: str) -> list[tuple[Peer, Reply]]:
    asked = b.relays.asked.pop(rid, None)
    try:
        head, body = _read(os.path.join(_dir(b), rid + ".resp"))
    except FileNotFoundError:
        return []
    if asked is None:                  # timed out already
        return []
    peer, cmd, _ = asked
    reply = cmd.reply(head["code"], head.get("remark"), head.get("ext") or {}, body)
    return [(peer, Reply(reply, (body,), len(body)) if body else Reply(reply))]
