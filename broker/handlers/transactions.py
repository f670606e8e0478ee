"""END_TRANSACTION: a producer's commit or rollback of a half message. The
check-backs the broker asks of producers (CHECK_TRANSACTION_STATE) are
notices, sent by the clients module."""
from __future__ import annotations

from shmq.core.layout import (
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_NOT,
    SYSFLAG_TRANSACTION_ROLLBACK,
)
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.headers import BadRequest, Header
from shmq.ipc.remoting import RemotingCommand

from ..delivery import PGROUP, stored
from ..topics import TRANS_HALF_TOPIC
from ..transactions import resolve_half
from .base import Broker, Peer


def end_transaction(b: Broker, peer: Peer, cmd: RemotingCommand) -> RemotingCommand | None:
    """END_TRANSACTION: commit posts the half message to its real topic,
    rollback drops it; either way an op message records it. A half
    message is resolved once, whichever worker and however many times
    the producer answers (EndTransactionProcessor)."""
    h = Header(cmd.ext)
    group, qoff, phy = h.str("producerGroup"), h.int("tranStateTableOffset"), h.int("commitLogOffset")
    kind = h.int("commitOrRollback")
    if kind == SYSFLAG_TRANSACTION_NOT:
        return None                  # "unknown": RocketMQ answers nothing and waits for the check
    if kind not in (SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_ROLLBACK):
        raise BadRequest(R.SYSTEM_ERROR, f"commitOrRollback={kind}: want 8 (commit) or 12 (rollback)")
    b.check_writable()
    b.check_disk()
    m = stored(b.store, phy)
    if m is None or m.topic != TRANS_HALF_TOPIC:
        raise BadRequest(R.SYSTEM_ERROR, "Find prepared transaction message failed")
    if m.properties.get(PGROUP) != group:
        raise BadRequest(R.SYSTEM_ERROR, "The producer group wrong")
    if m.queue_offset != qoff:
        raise BadRequest(R.SYSTEM_ERROR, "The transaction state table offset wrong")
    if resolve_half(b.store, b.registry, b.store_host, m, kind):
        b.put_count += 1
    return cmd.reply(R.SUCCESS)
