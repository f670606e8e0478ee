"""SHMQ_DIRECT_INFO: what a client on this host needs to append to the store itself.

A producer run by the store's OS user skips the socket, the worker and the
reply (client/direct.py): it attaches to the control block, appends under
the same claim protocol the workers use and wakes them as they wake each
other. It asks first, over the broker's Unix socket, and this is the
answer: the store's settings (the client builds the same ``StoreConfig``),
and what a worker would put in the record and its answer (store host,
msgId prefix, the CLUSTER property). Refused over TCP (the asker is not on
this host), with ``aclEnable`` (an account's permissions are the broker's to
check, per request) and with ``directAppendEnable=false``; the client then
sends over the socket as before. Whether the asker may open the store is
the OS's answer: the files and shared memory are owner-only.
"""
from __future__ import annotations

import dataclasses

from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.headers import BadRequest
from shmq.ipc.remoting import RemotingCommand

from ..config import ASYNC_MASTER
from ..stats import stats_offset
from .base import Broker, Peer, json_reply


def direct_info(b: Broker, peer: Peer, cmd: RemotingCommand):
    c = b.config
    if not c.directAppendEnable:
        raise BadRequest(R.NO_PERMISSION, "direct appends are off (directAppendEnable=false)")
    if c.aclEnable:
        raise BadRequest(R.NO_PERMISSION, "direct appends are off while aclEnable is on")
    if c.brokerRole != ASYNC_MASTER:   # a slave takes no writes; a SYNC_MASTER's wait for its slave
        raise BadRequest(R.NO_PERMISSION, f"direct appends are off on a {c.brokerRole} "
                                          f"(brokerRole)")
    if peer.addr != "unix":
        raise BadRequest(R.NO_PERMISSION, "direct appends are offered over the broker's Unix "
                                          "socket only (to a client on this host)")
    return json_reply(cmd, {
        "store": dataclasses.asdict(c.store),
        "brokerName": c.brokerName, "brokerAddr": c.addr, "clusterName": c.brokerClusterName,
        "storeHost": c.addr, "msgIdPrefix": b.msgid_prefix,
        "sendDedup": b.store.dedup_on,
        # where the broker's per-topic counters are in the control block's region
        # (broker/stats.py): the client counts its appends and reads there
        "statsOffset": stats_offset(b.store),
        # broker.conf's; brokerConfig.json's runtime value, when set, overrides it
        "brokerPermission": c.brokerPermission,
        # what one pull returns at most, as the broker's own pulls (direct reads)
        "maxTransferCountOnMessageInMemory": c.maxTransferCountOnMessageInMemory,
        "maxTransferBytesOnMessageInMemory": c.maxTransferBytesOnMessageInMemory})
