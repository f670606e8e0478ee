"""Request handlers: RocketMQ 4.x request code → handler, run on the worker that read it.

``Handlers`` is a worker's whole request-handling state (``base.Broker``: the
store, the shared tables, the subscriptions its clients registered, the
peers it can notify) and what it has parked (``broker/parking.py``: pulls
waiting for messages, SYNC_FLUSH sends waiting for the disk). ``handle``
runs one request to completion: it answers at once, or parks and answers
when the control block wakes the worker (new messages, flush progress, a
consumer group that changed) or a deadline passes. Replies echo the
request's opaque and serialization; errors carry RocketMQ's response code
and a remark; an unknown code gets REQUEST_CODE_NOT_SUPPORTED; no request
can raise out of here. With ``aclEnable`` each request first passes
broker/acl.py's check (RocketMQ 4.x's plain ACL) or is refused as RocketMQ
refuses it.

Sans-I/O: a handler takes a ``Peer`` (the connection as a handler may know
it: id, address, born host parsed once, attrs) and the command, and returns
the answer; it never touches a connection or a socket. The driver
(broker/worker.py) maps each connection to its peer, calls ``handle``,
writes what comes back, and writes the ``(peer, Reply)`` pairs that
``parking`` and ``notices()`` return later. Tests drive the same calls with
no socket at all (tests/test_handlers.py).

One module per idea, each over ``base``:

    send          SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE
    pull          PULL_MESSAGE (long polling through the parking module)
    offsets       consumer offsets, min/max/by-time offsets, reset offset
    clients       heartbeat, unregister, consumer list, queue locks, notices
    admin         topics, groups, broker config, runtime info, views, lookups
    retry         CONSUMER_SEND_MSG_BACK (%RETRY% / %DLQ%)
    transactions  END_TRANSACTION
    direct        SHMQ_DIRECT_INFO (a local client appends to the store itself)
    stats         the figures of broker/stats.py: stats views, consume stats of every
                  group, producer connections, consume time spans
    relay         GET_CONSUMER_RUNNING_INFO, CONSUME_MESSAGE_DIRECTLY (to a consumer client
                  on whichever worker holds it, and its answer back)
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from shmq.core.records import group_bytes_limit, runs
from shmq.core.state import StoreFullError
from shmq.core.store import MessageStore
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.codes import not_supported_remark
from shmq.ipc.control import WANT_PUBLISH, ControlBlock
from shmq.ipc.headers import BadRequest
from shmq.ipc.remoting import RemotingCommand

from ..acl import Acl, denied
from ..config import BrokerConfig
from ..parking import Parking
from ..registry import Registry
from ..topics import Tables
from . import admin, clients, direct, offsets, pull, relay, retry, send, stats, transactions
from .base import PARKED, Broker, Peer, Reply, born_host
from .subscription import Subscription, parse_subscription

__all__ = ["HANDLERS", "PARKED", "Handlers", "Peer", "Reply", "Subscription", "born_host",
           "parse_subscription"]

log = logging.getLogger("shmq.broker")

HANDLERS: dict[int, Callable] = {
    RC.SEND_MESSAGE: send.send, RC.SEND_MESSAGE_V2: send.send,
    RC.SEND_BATCH_MESSAGE: send.send,
    RC.PULL_MESSAGE: pull.pull,
    RC.QUERY_CONSUMER_OFFSET: offsets.query_consumer_offset,
    RC.UPDATE_CONSUMER_OFFSET: offsets.update_consumer_offset,
    RC.GET_ALL_CONSUMER_OFFSET: offsets.all_consumer_offsets,
    RC.GET_ALL_DELAY_OFFSET: offsets.all_delay_offsets,
    RC.GET_MAX_OFFSET: offsets.get_max_offset, RC.GET_MIN_OFFSET: offsets.get_min_offset,
    RC.SEARCH_OFFSET_BY_TIMESTAMP: offsets.search_offset,
    RC.GET_EARLIEST_MSG_STORETIME: offsets.earliest_store_time,
    RC.INVOKE_BROKER_TO_RESET_OFFSET: offsets.reset_offset,
    RC.HEART_BEAT: clients.heartbeat, RC.UNREGISTER_CLIENT: clients.unregister_client,
    RC.GET_CONSUMER_LIST_BY_GROUP: clients.consumer_list,
    RC.LOCK_BATCH_MQ: clients.lock_batch, RC.UNLOCK_BATCH_MQ: clients.unlock_batch,
    RC.CHECK_CLIENT_CONFIG: clients.check_client_config,
    RC.VIEW_MESSAGE_BY_ID: admin.view_message, RC.QUERY_MESSAGE: admin.query_message,
    RC.UPDATE_AND_CREATE_TOPIC: admin.create_topic,
    RC.DELETE_TOPIC_IN_BROKER: admin.delete_topic,
    RC.GET_ALL_TOPIC_CONFIG: admin.all_topic_config,
    RC.GET_BROKER_RUNTIME_INFO: admin.runtime_info,
    RC.UPDATE_BROKER_CONFIG: admin.update_broker_config,
    RC.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: admin.update_group,
    RC.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: admin.all_groups,
    RC.DELETE_SUBSCRIPTIONGROUP: admin.delete_group,
    RC.DELETE_EXPIRED_COMMITLOG: admin.delete_expired_commitlog,
    RC.CLEAN_EXPIRED_CONSUMEQUEUE: admin.clean_expired_cq,
    RC.GET_BROKER_CONFIG: admin.get_broker_config,
    RC.GET_TOPIC_STATS_INFO: admin.topic_stats,
    RC.GET_CONSUME_STATS: admin.consume_stats,
    RC.GET_CONSUMER_CONNECTION_LIST: admin.consumer_connection,
    RC.QUERY_TOPIC_CONSUME_BY_WHO: admin.topic_consumed_by,
    RC.CONSUMER_SEND_MSG_BACK: retry.send_back,
    RC.END_TRANSACTION: transactions.end_transaction,
    RC.SHMQ_DIRECT_INFO: direct.direct_info,
    RC.VIEW_BROKER_STATS_DATA: stats.view_stats, RC.GET_BROKER_CONSUME_STATS: stats.broker_consume_stats,
    RC.GET_PRODUCER_CONNECTION_LIST: stats.producer_connection,
    RC.QUERY_CONSUME_TIME_SPAN: stats.consume_time_span,
    RC.GET_CONSUMER_RUNNING_INFO: relay.call_consumer,
    RC.CONSUME_MESSAGE_DIRECTLY: relay.call_consumer,
}


# the sends ``Handlers.take`` may group (a batch is one append already)
GROUPED_CODES = frozenset({RC.SEND_MESSAGE, RC.SEND_MESSAGE_V2})


def _failed(peer: Peer, cmd: RemotingCommand, e: Exception) -> RemotingCommand:
    """The answer to a request that raised ``e``: RocketMQ's code for it
    and a remark (no request can raise out of the handlers)."""
    if isinstance(e, BadRequest):
        return cmd.reply(e.code, e.remark)
    if isinstance(e, StoreFullError):
        return cmd.reply(R.SERVICE_NOT_AVAILABLE, str(e))
    if isinstance(e, OSError):
        log.error("request %d from %s: %s", cmd.code, peer.addr, e)
        return cmd.reply(R.SERVICE_NOT_AVAILABLE, f"service not available now: {e}")
    log.error("request %d from %s failed", cmd.code, peer.addr, exc_info=e)
    return cmd.reply(R.SYSTEM_ERROR, f"{type(e).__name__}: {e}")


def _runs(sends: list, limit: int):
    """One queue's sends cut into runs (``records.runs``): a send that does
    not join (``Prepared.joins``: a batch, a transaction's record) alone."""
    return runs(sends, limit, lambda it: len(it[2].rec), lambda it: not it[2].joins)


class Handlers(Broker):
    def __init__(self, config: BrokerConfig, store: MessageStore, cb: ControlBlock,
                 tables: Tables, registry: Registry, clock: Callable[[], float] = time.monotonic):
        super().__init__(config, store, cb, tables, registry)
        self.parking = Parking(store, cb.set_flag, self.answer_parked_pull, clock,
                               set_mask=cb.set_wait_mask)
        store.on_published = self._published
        self.relays = relay.Relays()      # requests passed on to a consumer client
        # None unless aclEnable: then every request is checked before it runs
        self.acl = Acl(config.acl_file) if config.aclEnable else None
        # sends taken into this turn's group ([peer, cmd, Prepared, answer]),
        # their bodies' bytes (the driver caps them: worker.TAKEN_BYTES_MAX)
        self.taken: list = []
        self.taken_bytes = 0

    def _published(self, queues: int) -> None:
        """An append of this worker published ``queues`` (the store's
        ``on_published``): the other processes whose pulls wait on them are
        woken, and this worker's own parked pulls are answered before its
        turn ends (``Parking.published``: the driver asks ``ready``), with
        no wake-up to itself. That wake-up was a datagram, a turn to read it
        and a look at every parked queue: with 2,000 queues parked on the
        worker, a send one at a time cost it 131–198 µs of CPU, now 79–113
        (87–112 with none parked; 2-core VM)."""
        if self.cb.wake_flagged(WANT_PUBLISH, queues, me_too=False):
            self.parking.published(queues, self.store.published_slot)

    def handle(self, peer: Peer, cmd: RemotingCommand):
        """Run one request: its ``Reply`` (a tuple: command, body pieces,
        their bytes), a whole encoded frame (``bytes``), ``PARKED``, or None (no answer: a oneway request, a
        client's response, END_TRANSACTION "unknown")."""
        if cmd.is_response:
            # a client acknowledging one of our notifications, or answering a relayed request
            return relay.answered(self, peer, cmd)
        debug = log.isEnabledFor(logging.DEBUG)      # once a request: _run is told
        if debug:
            log.debug("%s: request %d %s body %d bytes", peer.addr, cmd.code, cmd.ext, len(cmd.body))
        if self.acl is not None:
            why = self._refused(peer, cmd)
            if why is not None:
                log.info("%s: request %d refused: %s", peer.addr, cmd.code, why)
                return None if cmd.is_oneway else Reply(denied(cmd, why))
        return self._run(HANDLERS.get(cmd.code), peer, cmd, debug)

    def pulls_direct(self) -> bool:
        """Whether ``run_pull`` may stand for ``handle`` on a PULL_MESSAGE
        request: with no ACL and no DEBUG log, all ``handle`` does before
        a request's handler is nothing (the worker's pull lane asks)."""
        return self.acl is None and not log.isEnabledFor(logging.DEBUG)

    def run_pull(self, peer: Peer, cmd: RemotingCommand):
        """``handle`` of a PULL_MESSAGE request (not a response, not oneway)
        while ``pulls_direct()``: the same answer (a ``Reply``, or PARKED),
        without the dispatch ``_run`` does for any handler's."""
        try:
            return pull.pull(self, peer, cmd)
        except Exception as e:
            return Reply(_failed(peer, cmd, e))

    def _refused(self, peer: Peer, cmd: RemotingCommand) -> str | None:
        """The ACL's verdict; a check that fails refuses the request."""
        try:
            return self.acl.check(peer.born_host[0], cmd)
        except Exception as e:
            log.exception("request %d from %s: the ACL check failed", cmd.code, peer.addr)
            return f"the ACL check failed: {type(e).__name__}: {e}"

    def answer_parked_pull(self, peer: Peer, cmd: RemotingCommand):
        """A parked pull, run again with suspension off (parking's callback)."""
        return self._run(pull.repull, peer, cmd, log.isEnabledFor(logging.DEBUG))

    def _run(self, fn, peer: Peer, cmd: RemotingCommand, debug: bool):
        try:
            if fn is None:
                r = cmd.reply(R.REQUEST_CODE_NOT_SUPPORTED, not_supported_remark(cmd.code))
            else:
                r = fn(self, peer, cmd)
        except Exception as e:
            r = _failed(peer, cmd, e)
        if r is None or r is PARKED:
            return r
        if type(r) is bytes:                 # a whole frame (send_ok_head)
            return None if cmd.is_oneway else r
        if type(r) is not Reply:
            body = r.body
            r = Reply(r, (body,), len(body)) if body else Reply(r)
        if debug:
            c = r.command()
            log.debug("%s: reply to %d: %d %s %s", peer.addr, cmd.code, c.code, c.remark, c.ext)
        return None if cmd.is_oneway else r

    # ------------------------------------------------------------ grouped sends
    def take(self, peer: Peer, cmd: RemotingCommand) -> bool:
        """Take a send into this reactor turn's group, where it can be: a
        SEND_MESSAGE(_V2), no ACL, no DEBUG log. Its answer then comes from
        ``flush_group``, which the driver calls before it runs any other
        request and at the end of the turn (issue 14: the sends pipelined
        in one turn share a claim, a write and a publish per queue)."""
        if (cmd.code not in GROUPED_CODES or self.acl is not None
                or log.isEnabledFor(logging.DEBUG)):
            return False
        try:
            self.taken.append([peer, cmd, send.prepare(self, peer, cmd), None])
        except Exception as e:
            self.taken.append([peer, cmd, None, _failed(peer, cmd, e)])
        self.taken_bytes += len(cmd.body)
        return True

    def flush_group(self) -> list:
        """Append the sends taken this turn and answer them: ``(peer,
        frame or Reply)`` in the order they came (a oneway send gets none;
        one whose answer waits for the disk or a slave is parked).
        Each queue's sends are appended in the order they came (what
        RocketMQ promises), in runs (``_runs``); across queues in any
        order."""
        items, self.taken = self.taken, []
        self.taken_bytes = 0
        if len(items) == 1:            # a turn of one send (one at a time): as alone
            if items[0][2] is not None:
                self._append_one(items[0])
        else:
            self._append_runs(items)
        return [(peer, a if type(a) is bytes or type(a) is Reply else Reply(a))
                for peer, cmd, _, a in items
                if a is not None and a is not PARKED and not cmd.is_oneway]

    def _append_runs(self, items: list) -> None:
        queues: dict = {}
        for it in items:
            p = it[2]
            if p is not None:          # (None: refused, answered already)
                queues.setdefault((p.store_topic, p.store_qid), []).append(it)
        limit = group_bytes_limit(self.config.store.mappedFileSizeCommitLog)
        for sends in queues.values():
            for run in _runs(sends, limit):
                answers = None
                if len(run) > 1:
                    try:
                        answers = send.append_group(self, run)
                    except Exception as e:
                        answers = [_failed(peer, cmd, e) for peer, cmd, _, _ in run]
                if answers is None:       # one by one, before the queue's next run
                    for it in run:
                        self._append_one(it)
                else:
                    for it, a in zip(run, answers):
                        it[3] = a

    def _append_one(self, it: list) -> None:
        peer, cmd, p, _ = it
        try:
            it[3] = send.append_one(self, peer, cmd, p)
        except Exception as e:
            it[3] = _failed(peer, cmd, e)

    # ------------------------------------------------------------ the driver's
    def connection_closed(self, peer: Peer) -> None:
        peer.closed = True                # parked answers to it are dropped
        self.parking.drop_pulls_of(peer)
        clients.connection_closed(self, peer)

    def notices(self) -> list:
        """Notices due to this worker's clients, as ``(peer, Reply)``: group
        membership changes, transaction check-backs, offset resets."""
        self.due = False
        return clients.check_clients(self) + clients.deliver_notices(self) + relay.deliver(self)
