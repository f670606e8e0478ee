"""One pull from a broker queue and what it brings: RocketMQ's PullAPIWrapper.

``pull_kernel`` sends PULL_MESSAGE (a long poll: the broker holds it up to
``suspend_ms`` when nothing is there), maps the answer's code to a
``PullStatus``, decodes a FOUND body into messages (each carrying the
queue's min/max offsets), drops those whose tag the subscription does not
list, and steps past damaged records so a queue never stops on one. It
raises ``MQClientError`` for a code that is no pull status (a refusal) and
``RemotingError`` for no answer; what to do next is the caller's.

On the broker's host, with its store attached (client/direct.py), a pull
is answered in this process when it can be — the same records, decoded by
the same path, so the listener sees the same ``MessageExt``s — and goes to
the broker otherwise: caught up (the socket pull parks, the long poll), an
offset the broker must correct, records read from disk, a SQL92
subscription, a queue the broker has not yet served this group under the
current tables (its refusals stay its own), a stopped store or a read that
failed. ``DirectReads`` says why each one goes where.

Which broker of the queue's group (RocketMQ's PullAPIWrapper
recalculatePullFromWhichNode / updatePullFromWhichNode): the id the last
reply's ``suggestWhichBrokerId`` named for this group and queue, falling
back to the master and then a slave when that id is not in the routes; a
pull to a slave never carries a commit offset. A pull whose broker is gone
waits for the routes to be asked again (``ClientInstance.broker_unreachable``)
and goes once to the group's other broker if they name one.

Callers: the push consumer's pull loop (a ``PullRequest`` per held queue)
and the lite pull consumer's. Neither's flow control is here, only the
delay both use when it says wait.
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.headers import PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION, PULL_SUSPEND, pull_ext
from shmq.ipc.remoting import RemotingCommand

from .batch import MessageBatch, build_batch
from .direct import CAUGHT_UP
from .errors import MQClientError, RemotingError
from .instance import MASTER_ID, ClientInstance
from .message import MessageExt, MessageQueue, decode_messages
from .process_queue import ProcessQueue
from .subscription import SubscriptionData

log = logging.getLogger("shmq.client")
FLOW_CONTROL_DELAY = 0.05                   # PULL_TIME_DELAY_MILLS_WHEN_CACHE_FLOW_CONTROL
FAILOVER_ROUNDS = 2       # rounds of the route refresh a pull whose broker went awaits


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


PULL_STATUS = {R.SUCCESS: PullStatus.FOUND, R.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
               R.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
               R.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL}


@dataclass
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    msgs: list[MessageExt] | MessageBatch      # a MessageBatch where the caller asked for one
    here: bool = False        # read from the store by this process (client/direct.py)


@dataclass
class PullRequest:
    """A push consumer's pull loop state for one held queue."""
    mq: MessageQueue
    pq: ProcessQueue
    next_offset: int
    previously_locked: bool = False


async def pull_kernel(instance: ClientInstance, group: str, mq: MessageQueue, sub: SubscriptionData,
                      offset: int, max_nums: int, sysflag: int, commit_offset: int,
                      suspend_ms: int, timeout: float, batch: bool = False) -> PullResult:
    """PULL_MESSAGE and PullAPIWrapper.processPullResult: decode, keep the
    subscribed tags, note the queue's min/max offsets on each message.
    Raises MQClientError (a broker refusal) or RemotingError. A pull read
    here (``here``) may not have turned the loop (a socket pull's wait for
    its answer does): a caller that pulls in a loop turns it once it has
    handed the messages on, so the listeners run between pulls (before the
    next one: a read here overlaps nothing) and a queue is not read ahead
    to its flow-control limit (then a 50 ms pause)."""
    reads = None
    # recalculatePullFromWhichNode: where the last reply said to pull next
    which = instance.pull_from.get((group, mq), MASTER_ID)
    if instance.direct and sub.expression_type == "TAG" and which == MASTER_ID:
        ds = instance.direct_now(mq.broker_name)
        if ds is not None:
            reads = ds.reads
            codes = _tag_codes(sub)
            got = reads.pull(group, mq.topic, mq.queue_id, offset, max_nums, codes,
                             commit_offset if sysflag & PULL_COMMIT_OFFSET else None, batch)
            if got is CAUGHT_UP:
                # the long poll, here: woken by the append, read again; after
                # the suspend time with nothing the broker answers at once
                # (no second wait there); where this process cannot wait, the
                # broker's long poll does
                came = None
                if sysflag & PULL_SUSPEND and suspend_ms > 0:
                    came = await reads.park(mq.topic, mq.queue_id, offset, suspend_ms / 1000)
                got = None
                if came:
                    got = reads.pull(group, mq.topic, mq.queue_id, offset, max_nums, codes, None,
                                     batch)
                    if got is CAUGHT_UP:
                        got = None
                elif came is False:
                    sysflag &= ~PULL_SUSPEND
            elif got is None and reads.first_ask(group, mq.topic, mq.queue_id):
                sysflag &= ~PULL_SUSPEND              # answered at once; the next pull is here
            if got is not None:
                found, next_begin, mn, mx, body = got
                result = PullResult(PullStatus.FOUND if found else PullStatus.NO_MATCHED_MSG,
                                    next_begin, mn, mx, [], True)
                if found:
                    _found(result, body, mq, sub, offset, batch)
                return result                     # (the caller turns the loop: the doc)
            asked_at = reads.epoch()
    addr, slave = instance.find_broker(mq.broker_name, which)
    if addr is None:
        await instance.route(mq.topic, refresh=True)
        addr, slave = instance.find_broker(mq.broker_name, which)
        if addr is None:
            raise MQClientError(R.SYSTEM_ERROR, f"the broker {mq.broker_name} is not in any route")
    while True:
        ext = pull_ext(consumerGroup=group, topic=mq.topic, queueId=mq.queue_id,
                       queueOffset=offset, maxMsgNums=max_nums, commitOffset=commit_offset,
                       # a slave never stores the offset a pull carries
                       sysFlag=sysflag & ~PULL_COMMIT_OFFSET if slave else sysflag,
                       suspendTimeoutMillis=suspend_ms, subVersion=sub.sub_version,
                       expressionType=sub.expression_type, bname=mq.broker_name,
                       subscription=sub.sub_string if sysflag & PULL_SUBSCRIPTION else None)
        try:
            r = await instance.invoke_at(addr, RemotingCommand(RC.PULL_MESSAGE, ext=ext), timeout)
            break
        except RemotingError:
            # the broker is gone: once the routes are asked again, a queue whose
            # group has another broker left (the slave) is pulled there at once.
            # The NameServers drop a broker when its connection closes, which
            # the first round of asking can beat: a second round is awaited
            # (REROUTE_EVERY_S later) before the pull fails and waits the
            # consumer's pull_time_delay_millis_when_exception.
            for _ in range(FAILOVER_ROUNDS):
                asking = await instance.rerouted()
                other, slave = instance.find_broker(mq.broker_name, which)
                if other is not None and other != addr or not asking:
                    break
            if other is None or other == addr:
                raise
            addr = other
    status = PULL_STATUS.get(r.code)
    # updatePullFromWhichNode: the broker's word on where this queue's next pull goes
    suggested = r.ext.get("suggestWhichBrokerId")
    if suggested is not None and status is not None:
        if suggested == MASTER_ID:
            instance.pull_from.pop((group, mq), None)
        elif suggested.isdigit():
            instance.pull_from[(group, mq)] = suggested
    if status is None:
        raise MQClientError(r.code, r.remark, f"pull {mq} at {offset}")
    if reads is not None:                 # the broker may be asked no more for this queue
        reads.served(group, mq.topic, mq.queue_id, asked_at)
    h = r.ext
    result = PullResult(status, int(h["nextBeginOffset"]), int(h.get("minOffset", 0)),
                        int(h.get("maxOffset", 0)), [])
    if status is PullStatus.FOUND:
        _found(result, r.body, mq, sub, offset, batch)
    return result


def _found(result: PullResult, body: bytes, mq: MessageQueue, sub: SubscriptionData,
           offset: int, batch: bool) -> None:
    """processPullResult for a FOUND body, from the socket or read here:
    decode (``batch``: as one MessageBatch, client/batch.py), step past
    damage, keep the subscribed tags."""
    # one tuple for the pull's MIN_OFFSET/MAX_OFFSET, shared by its messages
    skipped: list = []
    pull = (str(result.min_offset), str(result.max_offset))
    if batch:
        msgs = build_batch(body, mq, pull, skipped=skipped)
        last = int(msgs.queue_offsets[-1]) if len(msgs) else None
    else:
        msgs = decode_messages(body, mq.broker_name, pull, skipped=skipped)
        last = msgs[-1].queue_offset if msgs else None
    if skipped:
        result.next_begin_offset = _past_damage(last, skipped, offset, result.next_begin_offset)
        for qoff, why, _ in skipped:
            log.error("pull %s: %s (queue offset %s): a damaged record, skipped and not "
                      "delivered", mq, why, "unknown" if qoff is None else qoff)
    if not sub.tags_set:
        result.msgs = msgs
    elif batch:
        result.msgs = msgs.take([i for i in range(len(msgs)) if sub.accepts(msgs.message(i))])
    else:
        result.msgs = [m for m in msgs if sub.accepts(m)]


# a TAG subscription's codes as the store's scan takes them (sorted int64;
# empty: every message), as the broker's parse_subscription builds them
_codes: dict[tuple[str, str], object] = {}


def _tag_codes(sub: SubscriptionData):
    key = (sub.topic, sub.sub_string)
    codes = _codes.get(key)
    if codes is None:
        import numpy as np
        if len(_codes) > 1024:
            _codes.clear()
        codes = _codes[key] = np.array(sorted(set(sub.code_set)), dtype=np.int64)
        codes.flags.writeable = False          # the scan kernel's canonical type (core/jit.py)
    return codes


def _past_damage(last: int | None, skipped: list, offset: int, next_begin: int) -> int:
    """Where the queue goes on after a pull with damaged records: a record
    whose body alone was bad is skipped like a poison message (its
    neighbours were read); a broken frame hid what came after it, so the
    next pull starts past it — right after it when its queue offset is
    believable, else after the last good message, else (it came first) at
    the broker's next offset — so the queue never stops on it. ``last``:
    the last good message's queue offset (None: none was good)."""
    qoff, _, framed = skipped[-1]
    if framed:
        return next_begin
    if qoff is not None and offset <= qoff < next_begin:
        return qoff + 1
    return next_begin if last is None else last + 1


__all__ = ["FLOW_CONTROL_DELAY", "PULL_STATUS", "PullRequest", "PullResult", "PullStatus",
           "pull_kernel"]
