"""Direct appends and reads: a client on the broker's host uses the store itself.

Every broker worker maps the same CommitLog and ConsumeQueue segments and
appends under one claim protocol (``core/store.py``: claim under the lock,
write, publish in claim order). A producer process run by the OS user that
owns the store can do exactly what a worker does for a send — encode the
record, claim, write, publish, wake the workers whose pulls wait for it —
and skip the socket, the worker and the reply. The result is the same
``SendResult`` (msgId from the broker's address and the CommitLog offset,
the queue offset), the same bytes in the store, the same wake-ups: socket
consumers, ``shmq admin`` and a real RocketMQ client see nothing different.

Attaching (``DirectStore.attach``): the client asks the broker over its Unix
socket (SHMQ_DIRECT_INFO, broker/handlers/direct.py) for the store's
settings, then maps the control block and registers a process slot in it,
as a worker does: if this process dies mid-append, the broker's boss repairs
the claim it left (rolls it back or pads it) exactly as for a worker. The
OS decides who may: the store's files and shared memory are owner-only, so
another user's process gets PermissionError and sends over the socket. So
does a client without the ``broker`` extra (numba, posix_ipc) and one whose
broker refuses (``aclEnable``, ``directAppendEnable=false``). A process's
first attachment imports numba and the store's modules and loads the
append's kernels (``load_appends``, 0.4-2.5 s of CPU): the client does it
in a thread and sends over the socket meanwhile (client/instance.py);
``warm_up_appends()`` at start makes the first send append.

What goes direct: a message to a topic the store's ``topics.json`` has, with
write permission, on a broker that takes writes, to a valid queue, and with
nothing for the broker's logic to route — no delay level, delivery time or
transaction, not a %RETRY% topic (``append`` returns None and the producer
sends it over the socket, where the broker routes it, creates the topic,
answers busy or disk-full, as always). The duplicate-send window
(``sendDedupWindowSize``) is the store's, so it applies here too.

Durability is the socket path's: an append returns once published (visible,
and recovered after a crash of any process); under SYNC_FLUSH the send waits
until it is durable (``FlushWaiter``: one thread leads the group commit, as
a broker worker does for its turn's sends, and releases every send its
fdatasync covered).

Consumers read the same attachment (``DirectReads``, the section at the
end): a pull the broker would answer with records, from the page cache's
window, is answered in this process; everything else (caught up: the long
poll; refusals; offsets to correct; cold records; SQL92) is a socket pull.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import signal
import sys
from _signal import getsignal as _getsignal     # the handler itself: signal.getsignal makes
                                                # an enum of it, a microsecond an append
import threading
import time

from .accumulator import running_here

log = logging.getLogger("shmq.client.direct")

PERM_WRITE = 0x2
MULTI_TAGS_FLAG = 0x2
# what only the broker can route: DELAY, TIMER_*, TRAN_MSG properties (spelled
# out in ``routed``: three ``in`` tests cost less than a generator over them)
_SYSFLAG_TRANSACTION_MASK = 0xC
RETRY_PREFIX = "%RETRY%"
# topics no producer may send to (AbstractSendMessageProcessor.msgCheck; the
# broker's NOT_ALLOWED_SEND_TOPICS, which tests/test_direct.py ties to this)
NOT_ALLOWED_SEND_TOPICS = frozenset({
    "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", "rmq_sys_wheel_timer"})


def routed(props: str, sysflag: int) -> bool:
    """Whether a message needs the broker's routing: a transaction's, or a
    delay level, a delivery time or a transaction in its properties."""
    return bool(sysflag & _SYSFLAG_TRANSACTION_MASK or "DELAY\x01" in props or "TIMER_" in props
                or "TRAN_MSG\x01" in props)


_MAIN = threading.main_thread()


def _forked() -> None:
    """A child forked from another thread runs in that one, its main thread now."""
    global _MAIN
    _MAIN = threading.main_thread()


os.register_at_fork(after_in_child=_forked)


class _SigintGuard:
    """Ctrl-C waits until the main thread's direct append is published.

    A KeyboardInterrupt between claim and publish would leave the append
    lock held or a claim unpublished, which holds back every later append
    (this process's own next one first, and the broker's) while this
    process lives. Blocking SIGINT with pthread_sigmask does not prevent
    it: the kernel hands a process-directed SIGINT to any thread that does
    not block it (numpy's BLAS threads), and Python then runs its handler
    in the main thread at the next check — inside the append (a test that
    interrupted a sending loop 20 times hung in the lock's acquire). So
    the guard works where the KeyboardInterrupt is raised: the SIGINT
    handler the application has (default_int_handler, asyncio's, its own)
    is wrapped once, from the first main-thread append on; while an append
    runs, a SIGINT is kept, and the wrapped handler is called with it
    right after (the append is then stored, the caller gets the
    KeyboardInterrupt) — or, if the append has to wait (behind a claim
    whose owner may be stalled, alive: the wait would not end), during
    that wait (``waiting``, the store's ``on_wait``): a claim it finished
    is given up to whoever publishes next. Flags, no system call (the two
    pthread_sigmask calls cost 3.9 µs an append). An application that
    installs another SIGINT handler later is wrapped again at its next
    append.

    Closing a DirectStore in the main thread puts the wrapped handler back
    (``release``) if the wrapper is still the one installed: asyncio.run
    installs its handler (Ctrl-C cancels the main task) only over Python's
    default and puts the default back only over its own, so a wrapper left
    installed kept the finished run's handler for the rest of the process,
    and a later run's Ctrl-C raised KeyboardInterrupt from it instead of
    cancelling its main task. Another store still open wraps again at its
    next append.

    A store closed in another thread cannot put it back: ``signal.signal``
    raises ValueError outside the main thread, and no other call changes a
    handler. The close raises nothing and the restore is owed, paid in the
    main thread by whichever comes first: the next release there (any
    store's close, this one's too — its producer's shutdown closes it
    again) or the next SIGINT, which the wrapper takes out of the way
    before calling the application's handler. Until then Ctrl-C still
    reaches that handler, through the wrapper."""

    __slots__ = ("inside", "kept", "handler", "wrapped", "owed")

    def __init__(self):
        self.inside = False
        self.kept = None              # (signum, frame) of a SIGINT kept during an append
        self.handler = None           # the wrapper installed (to tell whether it still is)
        self.wrapped = None           # the application's handler it calls
        self.owed = False             # released in another thread: put back in the main one

    def enter(self) -> None:
        if _getsignal(_SIGINT) is not self.handler:
            self._wrap()
        self.inside = True

    def leave(self) -> None:
        self.inside = False
        kept = self.kept
        if kept is not None:
            self.kept = None
            self.wrapped(*kept)       # raises KeyboardInterrupt (the default handler)

    def waiting(self) -> None:
        """The store's ``on_wait``: an append that waits (behind a claim whose
        owner is alive but stalled: stopped, swapped out, stuck on the disk)
        is where a kept Ctrl-C is delivered, not after a wait that may not
        end; the store gives the append up to whoever publishes next."""
        if self.kept is not None and threading.current_thread() is _MAIN:
            self.leave()

    def release(self) -> None:
        if threading.current_thread() is not _MAIN:
            self.owed = self.wrapped is not None      # signal.signal: main thread only
            return
        self.owed = False
        if self.wrapped is not None and _getsignal(_SIGINT) is self.handler:
            signal.signal(signal.SIGINT, self.wrapped)
        self.handler = self.wrapped = None

    def _wrap(self) -> None:
        h = _getsignal(_SIGINT)          # raw (SIG_DFL, SIG_IGN: ints), as ``enter`` compares
        if not callable(h):           # SIG_DFL, SIG_IGN: no Python handler raises anything
            self.handler, self.wrapped = h, None
            return
        self.wrapped = h

        def keep_during_append(signum, frame):
            if self.inside:
                self.kept = (signum, frame)
                return None
            if self.owed:             # a release in another thread: paid here, the main thread
                self.release()
            return h(signum, frame)
        self.handler = keep_during_append
        signal.signal(signal.SIGINT, keep_during_append)


_SIGINT = int(signal.SIGINT)
_SIGINT_GUARD = _SigintGuard()


def release_sigint_guard() -> None:
    """The application's SIGINT handler back, if the guard wrapped it (in
    the main thread; elsewhere owed, as ``_SigintGuard.release`` says)."""
    _SIGINT_GUARD.release()


class DirectUnavailable(RuntimeError):
    """This process cannot append to that broker's store itself (the reason)."""


class DirectStore:
    """One local broker's store, attached for appends (see the module doc)."""

    def __init__(self, info: dict):
        try:                                  # (``load_appends``: the same, in a thread)
            from shmq.core.checkpoint import load_table
            from shmq.core.config import StoreConfig
            from shmq.core.dedup import dedupable_topic, key_hash
            from shmq.core.files import REAL_FILES
            from shmq.core.layout import PROPERTIES_BYTES_MAX, RECORD_FIXED_BYTES, lay_out
            from shmq.core.records import (encode_arrays, encode_record, group_bytes_limit,
                                           host_raw, runs, tags_code_of)
            from shmq.core.state import STATE_RUNNING, StoreState, StoreStopping
            from shmq.core.store import DuplicateResult, MessageStore
            import posix_ipc
            from shmq.ipc.control import (FLUSHER_SLOT, ROLE_OTHER, WANT_PUBLISH, ControlBlock,
                                          NotRunning, Retired)
        except ImportError as e:
            raise DirectUnavailable(f"direct appends need the broker's modules ({e.name} is not "
                                    f"installed: pip install 'shmq[broker]')") from None
        self._load_table, self._files = load_table, REAL_FILES
        self._encode, self._tags_code = encode_record, tags_code_of
        self._key_hash, self._dedupable = key_hash, dedupable_topic
        self._encode_arrays, self._lay_out = encode_arrays, lay_out
        self._props_max, self._record_fixed = PROPERTIES_BYTES_MAX, RECORD_FIXED_BYTES
        self._runs = runs
        self._duplicate, self._stopping = DuplicateResult, (StoreStopping, Retired)
        self.stopped = False
        try:
            config = StoreConfig(**info["store"])
        except (KeyError, TypeError, ValueError) as e:
            raise DirectUnavailable(f"the broker's store settings are not this client's: {e}") \
                from None
        self.config = config
        self.root = root = config.storePathRootDir
        try:
            cb = ControlBlock.attach(root)
        except (OSError, NotRunning, posix_ipc.Error) as e:   # another user's store, shared memory
            raise DirectUnavailable(f"cannot open the store {root}: {e}") from None
        try:
            try:
                cb.register(ROLE_OTHER)
            except (RuntimeError, OSError, posix_ipc.Error) as e:   # every slot taken; name in use
                raise DirectUnavailable(f"no process slot in the store {root}: {e}") from None
            state = StoreState.over(cb.region(), cb.lock)
            if state is None or state.get("state") != STATE_RUNNING:
                raise DirectUnavailable(f"the store {root} is not running")
            if (state.queue_slots, state.get("segment_bytes")) != (
                    config.maxQueueSlots, config.mappedFileSizeCommitLog):
                raise DirectUnavailable(f"the store {root} runs with other settings than the "
                                        f"broker said")
            # the wake-ups an append owes, coalesced per loop turn (``Wakes``)
            self.wakes = (Wakes(lambda queues: cb.wake_flagged(WANT_PUBLISH, queues)),
                          Wakes(lambda _: cb.wake(FLUSHER_SLOT)))
            self.store = MessageStore(config, state, on_published=self.wakes[0].due,
                                      on_flush_request=self.wakes[1].due)
            self.store.on_wait = _SIGINT_GUARD.waiting    # a Ctrl-C kept through a long wait
            # SYNC_FLUSH: the FlushWaiter leads the group commit, so an append
            # does not wake the flusher (but on a roll: the next segment)
            self.store.flush_inline = config.sync_flush
        except BaseException:
            cb.close()
            raise
        self.cb = cb
        self.state = state
        # Every use of the store in this process, in one thread at a time: the
        # loop's (sends, reads, close) and the blocking Producer.send's, which
        # appends in its caller's thread (AsyncProducer.send_here). The store
        # is made for one writer a process (its open files, the append lock's
        # held flag, the counters): this makes a process of threads one.
        self.lock = threading.Lock()
        self.broker_name = info["brokerName"]
        self.msgid_prefix = info["msgIdPrefix"]
        host, _, port = info["storeHost"].rpartition(":")
        self.store_host_pair = (host, int(port))
        self.store_host = host_raw(host, int(port))
        self.born_host = host_raw("127.0.0.1", 0)        # what a Unix-socket client is to the broker
        self.cluster_prop = f"CLUSTER\x01{info['clusterName']}"
        self.broker_perm = int(info.get("brokerPermission", 6))
        self.max_bytes = config.maxMessageSize
        self.group_bytes = group_bytes_limit(config.mappedFileSizeCommitLog)
        self.busy_ms = config.osPageCacheBusyTimeOutMills
        self.sync_flush = config.sync_flush
        self._epoch = -1
        self._topics: dict[str, tuple[int, int, int]] = {}   # topic → (perm, write queues, sysflag bits)
        self._writable = True
        self.flush_waiter: FlushWaiter | None = None
        self.appended = 0
        self.conn = None           # the broker's Unix-socket connection (the client instance's)
        self.reads = DirectReads(self, info)      # consumers' pulls answered here (below)
        # the broker's per-topic and per-group counters (broker/stats.py), where it
        # says they are: this process counts what it appends and reads there
        self.tally = None
        if info.get("statsOffset") is not None:
            from shmq.ipc.counters import Counters, Tally
            counters = Counters.over(cb.region()[int(info["statsOffset"]):], root)
            self.tally = None if counters is None else Tally(counters, cb.slot)
        self._put_key = {}                        # topic → its counters' key
        self.turn = AppendTurn(self)              # sends of one loop turn appended together

    @classmethod
    def attach(cls, info: dict) -> "DirectStore":
        return cls(info)

    # ------------------------------------------------------------ topics
    def _reload(self) -> None:
        """The topic and broker tables as the broker's processes see them
        (they move ``config_epoch`` on every change)."""
        epoch = self.state.get("config_epoch")
        if epoch == self._epoch:
            return
        topics = self._load_table(self._files, self.root, "topics.json").get("topicConfigTable", {})
        self._topics = {name: (int(t.get("perm", 6)), int(t.get("writeQueueNums", 0)),
                               MULTI_TAGS_FLAG if t.get("topicFilterType") == "MULTI_TAG" else 0)
                        for name, t in topics.items()}
        kept = self._load_table(self._files, self.root, "brokerConfig.json").get(
            "brokerConfigTable", {})
        perm = int(kept.get("brokerPermission", self.broker_perm))
        self._writable = bool(perm & PERM_WRITE)
        self._epoch = epoch

    def takes(self, topic: str, queue_id: int, props: str, sysflag: int) -> int | None:
        """The sysflag bits the topic adds if a message goes direct, else None:
        the broker's logic is needed (see the module doc)."""
        if self.state.get("config_epoch") != self._epoch:
            self._reload()
        t = self._topics.get(topic)
        if (t is None or not t[0] & PERM_WRITE or not 0 <= queue_id < t[1] or not self._writable
                or topic.startswith(RETRY_PREFIX) or topic in NOT_ALLOWED_SEND_TOPICS
                or routed(props, sysflag)):
            return None
        return t[2]

    # ------------------------------------------------------------ append
    def append(self, topic: str, queue_id: int, body: bytes, props: str, flag: int = 0,
               sysflag: int = 0, born_ms: int | None = None) -> tuple[str, int, int, int] | None:
        """Append one message: (msgId, queue id, queue offset, end) — the end
        is what a SYNC_FLUSH send waits for — or None when it must go over
        the socket (the broker's logic is needed, the disk is full, the
        store is busy). ``props`` carries UNIQ_KEY; the CLUSTER property is
        added as the broker adds it. ValueError: a message the store refuses."""
        with self.lock:
            return self._append_one(topic, queue_id, body, props, flag, sysflag, born_ms)

    def _append_one(self, topic: str, queue_id: int, body: bytes, props: str, flag: int,
                    sysflag: int, born_ms: int | None):
        if self.stopped:
            return None
        extra = self.takes(topic, queue_id, props, sysflag)
        if extra is None:
            return None
        now = int(time.time() * 1000)
        if self._refused(now):
            return None                           # the broker answers these, as for any send
        if "CLUSTER\x01" not in props:
            props = f"{props}\x02{self.cluster_prop}" if props else self.cluster_prop
        pb = props.encode()
        rec = self._encode(topic.encode(), body, pb, queue_id, flag, sysflag | extra,
                           now if born_ms is None else born_ms, self.born_host, self.store_host,
                           now, 0, 0, self.max_bytes)
        dh = self._key_hash(pb) if self.store.dedup_on and self._dedupable(topic) else 0
        r = self._append(topic, self.store.append_record, topic, queue_id, rec,
                         self._tags_code(pb), now, dh)
        if r is None:
            return None
        if r.__class__ is self._duplicate:
            queue_id = r.queue_id
        else:
            self.appended += 1
            if self.tally is not None:
                self.count_put(topic, 1, len(rec))
        return f"{self.msgid_prefix}{r.phy_offset:016X}", queue_id, r.queue_offset, r.end

    def _refused(self, now: int) -> bool:
        """Whether the broker must answer a send now (disk full, store busy)."""
        return bool(self.state.get("disk_full")) or self.store.busy_ms(now) > self.busy_ms

    def append_group(self, topic: str, queue_id: int, sends: list) -> list:
        """``append`` of several messages to one queue, ``sends`` a list of
        (body, props, flag, sysflag) in call order: the sends of one event-
        loop turn (``AppendTurn``), in runs (``records.runs``: the broker's
        worker cuts the sends of its turns alike) each appended as one claim
        — one lock, one write, one publish and wake-up for all — each
        message with its own duplicate-window entry. One answer per send, as
        ``append``'s: None (over the socket: the broker must route it, the
        store is busy …), a ValueError (what the broker answers
        MESSAGE_ILLEGAL), or where it was stored. A message whose flag or
        sysflag differs from the first's is appended on its own, in its
        place; one the store refuses is answered so; when one of a
        run's keys may be in the window (``MessageStore.append``'s
        ``each``) the run's messages are appended one by one, each checked
        on its own."""
        with self.lock:
            return self._append_group(topic, queue_id, sends)

    def _append_group(self, topic: str, queue_id: int, sends: list) -> list:
        out: list = [None] * len(sends)
        if self.stopped:
            return out
        extra = self.takes(topic, queue_id, "", 0)        # the topic's and broker's checks
        now = int(time.time() * 1000)
        if extra is None or self._refused(now):
            return out
        flag0, sysflag0 = sends[0][2], sends[0][3]
        cluster = self.cluster_prop
        dedup = self.store.dedup_on and self._dedupable(topic)
        key_hash = self._key_hash
        max_bytes, props_max = self.max_bytes, self._props_max
        fixed = self._record_fixed + len(topic.encode())
        items = []          # (i, body, properties' bytes or None: alone, key hash)
        for i, (body, props, flag, sysflag) in enumerate(sends):
            if routed(props, sysflag):
                continue                   # for the broker's logic: over the socket
            try:
                pb = (props if "CLUSTER\x01" in props else
                      f"{props}\x02{cluster}" if props else cluster).encode()
            except ValueError:
                pb = None
            if pb is None or len(body) > max_bytes or len(pb) > props_max:
                out[i] = self._one(topic, queue_id, sends[i])    # its refusal, worded
            elif flag != flag0 or sysflag != sysflag0:
                items.append((i, body, None, 0))                 # appended alone, in its place
            else:
                items.append((i, body, pb, key_hash(pb) if dedup else 0))
        for run in self._runs(items, self.group_bytes, lambda it: fixed + len(it[1]) + len(it[2]),
                              lambda it: it[2] is None):
            if len(run) == 1 or not self._append_run(topic, queue_id, run, out, now, flag0,
                                                     sysflag0 | extra):
                for it in run:
                    out[it[0]] = self._one(topic, queue_id, sends[it[0]])
        return out

    def _append_run(self, topic: str, queue_id: int, run: list, out: list, now: int, flag: int,
                    sysflag: int) -> bool:
        """One claim of ``run`` (``_append_group``'s items), its answers in
        ``out``; False when it must go one by one (a message refused, a key
        that may be in the window, the store stopped: then each says so)."""
        n = len(run)
        lay_out = self._lay_out
        try:
            batch = self._encode_arrays(topic, *lay_out([it[1] for it in run], "bodies", n),
                                        *lay_out([it[2] for it in run], "properties", n),
                                        queue_ids=queue_id, flag=flag, sysflag=sysflag,
                                        born_timestamp=now, born_host=("127.0.0.1", 0),
                                        store_host=self.store_host_pair, store_timestamp=now,
                                        max_message_bytes=self.max_bytes, spans_checked=True)
        except ValueError:
            return False
        r = self._append(topic, self.store.append, batch, 0, [it[3] for it in run])
        if r is None:
            return False
        self.appended += n
        if self.tally is not None:
            self.count_put(topic, n, batch.buf.shape[0])
        pre, phy, q, end = self.msgid_prefix, r.phy_offset, r.queue_offset, r.end
        for k, (it, pos) in enumerate(zip(run, batch.rec_pos.tolist())):
            out[it[0]] = (f"{pre}{phy + pos:016X}", queue_id, q + k, end)
        return True

    def _one(self, topic: str, queue_id: int, send: tuple):
        """``_append_one``'s answer for a send of a group, or its ValueError."""
        try:
            return self._append_one(topic, queue_id, *send, None)
        except ValueError as e:
            return e

    def append_many(self, topic: str, queue_id: int, flat, offs, lens, props: str | list[str],
                    flag: int = 0):
        """Append bodies to one queue as one claim: (the first record's
        CommitLog offset, each record's offset from it, the first queue
        offset, end), or None as ``append``. What a SEND_BATCH_MESSAGE
        stores, encoded by the batch kernel in one call. The bodies are laid
        out in ``flat`` (read-only uint8), body i at ``offs[i]``, ``lens[i]``
        bytes, each inside ``flat`` (the producer's ``_Bodies`` make them so;
        not checked again). ``props`` is one properties string for all, or one per
        message (``put``'s tags and keys, "" for none: TAGS and KEYS only,
        nothing the broker routes); messages with none share one properties
        value (CLUSTER)."""
        with self.lock:
            return self._append_many(topic, queue_id, flat, offs, lens, props, flag)

    def _append_many(self, topic: str, queue_id: int, flat, offs, lens, props, flag: int):
        if self.stopped:
            return None
        one = props.__class__ is str
        extra = self.takes(topic, queue_id, props if one else "", 0)
        if extra is None:
            return None
        now = int(time.time() * 1000)
        if self._refused(now):
            return None
        cluster = self.cluster_prop
        if not one:
            alone = cluster.encode()
            pb = [f"{p}\x02{cluster}".encode() if p else alone for p in props]
        elif "CLUSTER\x01" not in props:
            pb = (f"{props}\x02{cluster}" if props else cluster).encode()
        else:
            pb = props.encode()
        n = lens.shape[0]
        batch = self._encode_arrays(topic, flat, offs, lens, *self._lay_out(pb, "properties", n),
                                    queue_ids=queue_id, flag=flag, sysflag=extra,
                                    born_timestamp=now, born_host=("127.0.0.1", 0),
                                    store_host=self.store_host_pair, store_timestamp=now,
                                    max_message_bytes=self.max_bytes,
                                    shared_properties=pb if one else None,
                                    spans_checked=True)   # laid out by the producer
        r = self._append(topic, self.store.append, batch, 0)
        if r is None:
            return None
        self.appended += n
        if self.tally is not None:
            self.count_put(topic, n, batch.buf.shape[0])
        return r.phy_offset, r.rec_pos, r.queue_offset, r.end

    def _append(self, topic: str, append, *args):
        """``append(*args)`` (the store's ``append`` or ``append_record``), or
        None: the socket from now on. In the main thread a Ctrl-C waits until
        the append is published (``_SigintGuard``)."""
        main = threading.current_thread() is _MAIN
        if main:
            _SIGINT_GUARD.enter()
        try:
            return append(*args)
        except self._stopping:   # the broker closes, or a new one took the store over
            self.stopped = True
        except (OSError, RuntimeError) as e:   # the disk refused (the claim rolled back), no slot
            log.warning("direct append to %s failed (%s): sending over the socket", topic, e)
            self.stopped = True
        finally:
            if main:
                _SIGINT_GUARD.leave()
        return None

    def count_put(self, topic: str, msgs: int, nbytes: int) -> None:
        key = self._put_key.get(topic)
        if key is None:
            key = self._put_key[topic] = b"P\0" + topic.encode()   # ipc.counters.PUT
        self.tally.add_now(key, msgs, nbytes)

    def flushed(self, end: int) -> bool:
        return self.state.flushed_pos >= end

    def wait_flushed(self, end: int, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """A future that turns True once ``end`` is durable, False after
        syncFlushTimeout (the socket path's FLUSH_DISK_TIMEOUT)."""
        if self.flush_waiter is None:
            self.flush_waiter = FlushWaiter(self)
        return self.flush_waiter.add(end, loop, self.config.syncFlushTimeout / 1000)

    def close(self) -> None:
        """Leave the store; again (a no-op but for the SIGINT guard's release,
        which a close in another thread could not do: ``_SigintGuard``)."""
        self.stopped = True               # first: nothing starts waiting on what closes
        with self.lock:                   # (an append in another thread finishes first)
            self._close()
        _SIGINT_GUARD.release()

    def _close(self) -> None:
        if self.cb is not None:
            if self.flush_waiter is not None:
                self.flush_waiter.stop()
                self.flush_waiter = None
            self.reads.close()
            for w in self.wakes:
                w.pay()
            self.store.close()
            self.cb.close()
            self.cb = None


WAKE_EVERY_S = 200e-6


class Wakes:
    """One kind of wake-up an append owes (the processes waiting for
    appends — a worker with parked pulls, the HA service — or, under
    SYNC_FLUSH, the flusher), coalesced: each wake-up is a datagram that
    costs the sender a system call and wakes the receiver (a worker or a
    direct consumer with a pull waiting on the append's queue: the
    ``queues`` mask each wake-up carries; before the masks, any worker
    holding any parked pull). Woken on every append, direct sends paid it on
    every send (and the workers woke as often, on the same cores): with one
    consumer waiting anywhere on the broker, direct sends went slower than
    the socket (12 k vs 14 k msg/s, 55 µs of client CPU a send instead of
    31 µs; 2-core VM).

    The first append of an event-loop turn wakes at once; a later one in
    the same turn wakes at once only if WAKE_EVERY_S passed since the last
    wake-up, else it is owed, and paid when the turn ends (``call_soon``,
    queued by the turn's first append) — or by the next append after
    WAKE_EVERY_S. Without a running loop every append wakes at once. So a
    message published while a wake-up is owed reaches a parked pull when
    the sender's loop next turns: at once for a sender that awaits
    anything that yields; a loop the application blocks (a direct send
    itself never yields) delays it until the loop runs again or the next
    send, WAKE_EVERY_S after the last wake-up. Nothing else waits for it:
    a send's answer, durability, direct and socket reads of the store."""

    __slots__ = ("wake", "scheduled", "owed", "woke_at", "lock", "loop")

    def __init__(self, wake):
        self.wake = wake                 # called with the queues (a ``queue_bit`` mask) it is for
        self.scheduled = False           # a turn_over is queued on the loop
        self.owed = 0                    # the queues of the appends not woken for yet (0: none)
        self.woke_at = 0.0
        # The loop whose turns coalesce (the client instance's; None: any
        # running one). An append in another thread — the blocking
        # Producer.send's (AsyncProducer.send_here) — wakes at once, taking
        # what is owed; ``owed`` and ``scheduled`` change under the lock.
        self.loop = None
        self.lock = threading.Lock()

    def due(self, queues: int = -1) -> None:
        now = time.monotonic()
        loop = self.loop
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:         # no loop in this thread: at once, always
                loop = None
        elif not running_here(loop):
            loop = None                  # another thread's append: at once
        with self.lock:
            if loop is not None:
                if not self.scheduled:
                    loop.call_soon(self.turn_over)
                    self.scheduled = True
                elif now - self.woke_at < WAKE_EVERY_S:
                    self.owed |= queues
                    return
            self.woke_at = now
            queues |= self.owed
            self.owed = 0
        self.wake(queues)

    def turn_over(self) -> None:
        with self.lock:
            self.scheduled = False
        self.pay()

    def pay(self) -> None:
        with self.lock:
            queues, self.owed = self.owed, 0
            if queues:
                self.woke_at = time.monotonic()
        if queues:
            self.wake(queues)


AT_ONCE_MAX = 8


class AppendTurn:
    """The direct sends of one event-loop turn, appended together.

    ``AsyncProducer.send`` appends a message to the store in the caller's
    coroutine, without yielding: one claim, one ``pwrite``, one publish per
    message (~30 µs of a ~50 µs send on the 2-core VM). When many sends are
    in flight (``gather``, a window of callers, handlers of many requests)
    a turn runs many of them, and they can share that work as the broker's
    worker shares it for the sends it reads in one reactor turn.

    The turn's first send appends at once (``join`` answers None: a lone
    send waits for nothing), and so do the next AT_ONCE_MAX - 1 sends of
    the same task (a loop sending one message after another) while no
    other has joined. Every other send of the turn — another task's, or
    that task's after those — joins a group per queue, appended when the
    turn ends (``call_soon``, queued by the first send: the callbacks ready
    by then run before it) in call order: one ``DirectStore.append_group``
    per queue, each message with its own msgId, queue offset and duplicate-
    window entry. Its callers resume in the next turn with their answers;
    a send cancelled meanwhile is left out (not stored). So a task sending
    in a loop yields every AT_ONCE_MAX sends, where before it held the loop
    until it stopped sending: other tasks run, and their sends join the
    group. Measured on the 2-core VM (one process, settings alternated): a
    task sending one message after another 57–70 µs a send with 8, 60–78
    with no yield (4: 82–94, a yield costs more than it looked); 64
    tasks each sending in a loop 25–28 k msg/s with 8, 22–24 k with 32,
    17–19 k with no yield. One loop: the client instance's, whose
    coroutines alone call ``join``."""

    __slots__ = ("ds", "scheduled", "queues", "opener", "alone")

    def __init__(self, ds: "DirectStore"):
        self.ds = ds
        self.scheduled = False
        self.queues: dict[tuple[str, int], list] = {}    # (topic, queue) → [(send, future)]
        self.opener = None               # the task of the turn's first send
        self.alone = 0                   # its sends appended at once this turn

    def join(self, loop: asyncio.AbstractEventLoop, topic: str, queue_id: int, body: bytes,
             props: str, flag: int, sysflag: int, over_socket) -> asyncio.Future | None:
        """None: a send to append now; else the future of its answer:
        ``DirectStore.append``'s, the ValueError that refused it, or, when
        the store leaves it to the broker, ``OverSocket``: ``over_socket()``
        (the sender's, a plain call) wrote it over the socket when the turn
        ended, in its place among the turn's sends, so a send called later
        cannot overtake it."""
        if not self.scheduled:
            loop.call_soon(self.run)
            self.scheduled = True
            self.opener, self.alone = asyncio.current_task(loop), 1
            return None
        if (self.alone < AT_ONCE_MAX and not self.queues
                and asyncio.current_task(loop) is self.opener):
            self.alone += 1
            return None
        fut = loop.create_future()
        key = (topic, queue_id)
        group = self.queues.get(key)
        if group is None:
            group = self.queues[key] = []
        group.append(((body, props, flag, sysflag), fut, over_socket))
        return fut

    def flush(self) -> None:
        """The turn's groups appended now: before an append of this loop that
        must not overtake them (a ``send_many`` or ``put`` chunk; their
        ``call_soon`` then finds nothing left)."""
        if self.queues:
            self.run()

    def run(self) -> None:
        self.scheduled, self.opener = False, None
        queues, self.queues = self.queues, {}
        try:
            for (topic, qid), group in queues.items():
                group = [g for g in group if not g[1].done()]       # cancelled: not stored
                if not group:
                    continue
                try:
                    out = self.ds.append_group(topic, qid, [g[0] for g in group])
                except BaseException as e:   # what a lone append raises to its caller: a
                    for _, fut, _ in group:  # Ctrl-C kept during the append (``_SigintGuard``)
                        fut.set_exception(e)  # is raised by the senders' tasks, out of the loop
                    continue
                for (_, fut, over_socket), r in zip(group, out):
                    if r is None:
                        try:
                            r = OverSocket(over_socket())
                        except Exception as e:
                            fut.set_exception(e)
                            continue
                    fut.set_result(r)
        finally:     # left by an exception between appends (a Ctrl-C): not stored, not sent
            for group in queues.values():
                for _, fut, _ in group:
                    if not fut.done():
                        fut.cancel()


class OverSocket:
    """A send of a turn's group that the store left to the broker, written
    over the socket in its place: ``reply``, the future of its answer."""

    __slots__ = ("reply",)

    def __init__(self, reply: asyncio.Future):
        self.reply = reply


class FlushWaiter(threading.Thread):
    """SYNC_FLUSH sends waiting for the disk: one thread releases every send
    a fdatasync covered, and leads the group commit itself when one send
    waits.

    **A lone send** (LEAD_WAITING_MAX: one waiting) is made durable here, as
    a broker worker makes its turn's sends (broker/worker.py ``Driver.
    group_commit``): the thread flushes the CommitLog up to everything
    published (every process's appends: ``MessageStore.flush_commitlog``,
    under the store's flush lock), releases the send and wakes the other
    processes whose sends the flush covered. No wake-up of the flusher and
    back: one at a time, 3.4–4.3 k sends a second where they were 1.6–3.0 k
    (the 2-core VM, the two alternated).

    **Many waiting** (a window of sends in flight) are the flusher's: the
    appends wake it again (``MessageStore.flush_inline`` off), the loop's
    appends and the flusher's fdatasync run on two cores, and the thread
    waits for its wake-ups. Led here, the fdatasync's kernel time (~150 µs
    on that VM) fell on the producer, which is what limits such a window:
    64 in flight went from 20–25 k to 15–17 k sends a second.

    When another process holds the flush lock (the flusher, a worker,
    another producer: it is flushing), the thread waits on this process's
    wake-up socket, flagged WANT_FLUSH while anything waits, which the
    holder writes once it has published; then it looks again. A flush that
    fails (EIO) is the flusher's to retry and report: the thread wakes it
    and leaves the rounds to it for LEAD_AGAIN_S. Resolutions go to each
    senders' loop in one ``call_soon_threadsafe`` a round."""

    LEAD_AGAIN_S = 1.0
    LEAD_WAITING_MAX = 1          # (4 measured no better at 4 in flight, and no worse at 64)

    def __init__(self, ds: DirectStore):
        super().__init__(name="shmq-direct-flush", daemon=True)
        self.ds = ds
        self.waits: list = []                  # heap of (end, seq, future, loop, deadline)
        self.seq = itertools.count()
        self.cv = threading.Condition()
        self.stopping = False
        self.lead_at = 0.0                     # lead no round before (monotonic): a flush failed
        self.rounds = 0                        # rounds this thread led (tests, benches)
        self.start()

    def add(self, end: int, loop, timeout_s: float) -> asyncio.Future:
        fut = loop.create_future()
        with self.cv:
            heapq.heappush(self.waits, (end, next(self.seq), fut, loop, time.monotonic() + timeout_s))
            self.cv.notify()
        return fut

    def stop(self) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify()
        self.join(5)

    def run(self) -> None:
        from shmq.ipc.control import WANT_FLUSH
        cb, st = self.ds.cb, self.ds.state
        flagged = False
        while True:
            with self.cv:
                while not self.waits and not self.stopping:
                    if flagged:
                        cb.set_flag(WANT_FLUSH, False)
                        flagged = False
                    self.cv.wait()
                if self.stopping:
                    break
                first, waiting = self.waits[0][0], len(self.waits)
            if not flagged:        # before the lock is tried: its holder's wake-up finds us
                cb.set_flag(WANT_FLUSH, True)
                flagged = True
            if st.flushed_pos < first:
                lead = waiting <= self.LEAD_WAITING_MAX
                self.choose(lead)
                if not (lead and self.lead()):
                    cb.wait(0.01)
            self.resolve(st.flushed_pos, time.monotonic())
        if flagged:
            cb.set_flag(WANT_FLUSH, False)
        with self.cv:
            left, self.waits = self.waits, []
        self._settle_all([(e, False) for e in left])

    def choose(self, lead: bool) -> None:
        """Lead the rounds here (the appends then do not wake the flusher:
        ``MessageStore.flush_inline``), or leave them to the flusher (woken
        by the appends again, and once now for those made meanwhile)."""
        store = self.ds.store
        if lead == store.flush_inline:
            return
        store.flush_inline = lead
        if not lead:
            from shmq.ipc.control import FLUSHER_SLOT
            self.ds.cb.wake(FLUSHER_SLOT)

    def lead(self) -> bool:
        """One group commit led here: False if another process holds the
        flush lock (it wakes us) or the flush failed (the flusher's now)."""
        from shmq.ipc.control import FLUSHER_SLOT, WANT_FLUSH
        now = time.monotonic()
        ds = self.ds
        if now < self.lead_at:
            ds.cb.wake(FLUSHER_SLOT)
            return False
        try:
            done = ds.store.flush_commitlog(block=False)
        except OSError as e:
            log.error("direct SYNC_FLUSH: the CommitLog flush failed (%s); the flusher "
                      "takes over", e)
            self.lead_at = now + self.LEAD_AGAIN_S
            ds.cb.wake(FLUSHER_SLOT)
            return False
        if done < 0:
            return False
        self.rounds += 1
        ds.cb.wake_flagged(WANT_FLUSH)       # the others whose sends it made durable
        return True

    def resolve(self, flushed: int, now: float) -> None:
        """Release the sends ``flushed`` covers (True) and those past their
        deadline (False: FLUSH_DISK_TIMEOUT)."""
        done = []
        with self.cv:
            w = self.waits
            while w and w[0][0] <= flushed:
                done.append((heapq.heappop(w), True))
            late = [e for e in w if e[4] <= now]
            if late:
                self.waits = [e for e in w if e[4] > now]
                heapq.heapify(self.waits)
                done += [(e, False) for e in late]
        if done:
            self._settle_all(done)

    @staticmethod
    def _settle_all(done: list) -> None:
        by_loop: dict = {}
        for (_, _, fut, loop, _), ok in done:
            by_loop.setdefault(loop, []).append((fut, ok))
        for loop, settled in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle_each, settled)
            except RuntimeError:                 # its loop closed: nobody waits for them
                pass


def _settle_each(settled: list) -> None:
    for fut, ok in settled:
        if not fut.done():
            fut.set_result(ok)


# ---------------------------------------------------------------- direct reads
#
# A consumer on the broker's host answers its own PULL_MESSAGE from the same
# mapping (client/pull.py calls ``DirectReads.pull``): the ConsumeQueue
# units from the offset through the tag filter (the store's kernel, by the
# tags' hash codes, as the broker's pull handler filters), then the records
# as the bytes a socket pull's body would carry, decoded by the same path.
# Only what the broker would answer FOUND or "no matching message, go on"
# (PULL_RETRY_IMMEDIATELY) is answered here, and only in the page cache's
# window: everything else goes to the broker as a socket pull, which answers
# it exactly as before —
#
#   * caught up (nothing at the offset): ``pull`` says CAUGHT_UP and the
#     pull waits here (``park``) for an append to the queue, on a wake-up
#     socket of its own (``_Parker``: a process slot of the control block,
#     flagged WANT_QUEUES while a pull waits, its wait_mask the queues
#     waited on, which a publish to one of them — a worker's or a direct
#     producer's — writes to), then reads again: a
#     consumer costs no system call while messages keep coming and parks
#     when it is caught up, and the broker's worker is not in the path (a
#     pull parked there cost a wake-up of the worker, its reply and the
#     next pull's request per message: 0.5 ms p50 at 10 k msg/s on 2
#     cores). Past the pull's suspend time with nothing, or where no slot
#     is free, the pull goes to the broker. A waiting process is woken by
#     publishes to its queues only (and to queues whose slots share their
#     bit, slot % 62; a queue with no slot yet by the publish that makes
#     one), so consumers idle on quiet queues cost the appends to busy
#     ones nothing but a look at their flags;
#   * an offset too small, too big, a ConsumeQueue file missing: the
#     broker's OFFSET_MOVED / NOT_FOUND answers;
#   * records further behind the write position than the broker's in-memory
#     window (accessMessageInMemoryMaxRatio, when checkCRCOnRead): the broker
#     checks what it reads from disk, skips what its scrub found damaged,
#     and reads ahead for a consumer that far behind; and every record
#     while the scrub has listed damaged ranges (quarantine/damaged.json,
#     looked at once a second): the broker never serves those;
#   * a refusal (no read permission, a queue past readQueueNums, an unknown
#     group): a queue is read here only after a socket pull of that group
#     was answered with a pull status under the tables as they are now
#     (``config_epoch``); a change of any table sends each queue's next
#     pull to the broker again, which refuses it if it must;
#   * a stopped store or a read that raises (the broker closing, a new one
#     taking the store over, an I/O error);
#   * until the ConsumeQueue scan kernel is loaded: the first pull starts
#     loading it in a thread (numba's cache: most of a second of CPU), and
#     pulls go to the broker meanwhile, so a consumer neither stalls nor
#     counts the load against its first messages.
#
# A pull that carries a commit offset (PULL_COMMIT_OFFSET) commits it over
# the socket here too: UPDATE_CONSUMER_OFFSET, oneway, when the offset moved
# and COMMIT_EVERY_S passed since that queue's last one (the offset store
# also writes every offset every persistConsumerOffsetInterval, and the
# socket pull a caught-up consumer parks in carries it).
COMMIT_EVERY_S = 0.2


class DirectReads:
    """One attached store's direct pulls (see the section's comment)."""

    def __init__(self, ds: DirectStore, info: dict):
        from shmq.core.commitlog import SegmentMissing
        from shmq.core.reader import GetMessageStatus as S
        from shmq.core.recovery import DamageLog
        from shmq.core.state import StoreStopping
        from shmq.ipc.control import Retired
        self.ds = ds
        self.failed = (StoreStopping, Retired, OSError, SegmentMissing)
        self.FOUND, self.NO_MATCHED = S.FOUND, (S.NO_MATCHED_MESSAGE, S.MESSAGE_WAS_REMOVING)
        self.OVERFLOW_ONE = S.OFFSET_OVERFLOW_ONE
        # nothing ever in the queue (no ConsumeQueue yet: a %RETRY% queue)
        self.EMPTY = (S.NO_MESSAGE_IN_QUEUE, S.NO_MATCHED_LOGIC_QUEUE)
        self._parker: _Parker | None = None
        self._parker_retry_at = 0.0    # no slot was free: caught-up pulls wait in the broker
        self._parker_failed = False    # ... and that was said
        # the broker's pull limits (BrokerConfig's defaults when it does not say)
        self.count_max = int(info.get("maxTransferCountOnMessageInMemory", 32))
        self.bytes_max = int(info.get("maxTransferBytesOnMessageInMemory", 256 * 1024))
        c = ds.config
        self.window_bytes = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                             * c.accessMessageInMemoryMaxRatio // 100
                             if c.checkCRCOnRead else 1 << 62)
        self._damage_log = DamageLog(ds._files, ds.root)
        self._damage_stamp = (0, 0)
        self._damaged = False
        self._damage_due = 0.0         # monotonic time of the next look at the damage log
        self._epoch = -1
        self._answered: set[tuple[str, str, int]] = set()   # (group, topic, queue) the broker served
        self._committed: dict[tuple[str, str, int], tuple[int, float]] = {}
        self._owed: dict[tuple[str, str, int], int] = {}   # held back by the window: sent at its end
        self.count = 0                 # pulls answered here (direct_reads)
        self.messages = 0
        self.parked = 0                # caught-up pulls that waited here (``park``)
        self.woken = 0                 # ... and that an append released

    def epoch(self) -> int:
        return self.ds.state.get("config_epoch")

    def served(self, group: str, topic: str, queue_id: int, asked_at_epoch: int) -> None:
        """The broker answered a pull of this queue with a pull status: the
        group may read it until the tables change — if they did not change
        since the pull was sent (``asked_at_epoch``), else the next pull asks
        the broker again."""
        epoch = self.ds.state.get("config_epoch")
        if epoch != self._epoch:
            self._answered.clear()
            self._epoch = epoch
        if epoch == asked_at_epoch:
            self._answered.add((group, topic, queue_id))

    def first_ask(self, group: str, topic: str, queue_id: int) -> bool:
        """Is the broker's answer to one pull all this queue needs before
        its pulls are read here (and, caught up, wait here)? Then that pull
        need not wait in the broker: answered at once, it lets the next one
        wait here (a pull parked in a worker flags it for every append to
        any topic: a consumer's %RETRY% queue, caught up from the start,
        woke the worker on each message for its first 15 s)."""
        return (not self.ds.stopped and _SCAN_LOADED.is_set() and not self._damaged
                and (group, topic, queue_id) not in self._answered)

    def pull(self, group: str, topic: str, queue_id: int, offset: int, max_msgs: int,
             codes, commit_offset: int | None, batch: bool = False):
        """(found, next offset, min offset, max offset, body bytes or None) of
        the pull answered here — found: the broker's SUCCESS, else its
        PULL_RETRY_IMMEDIATELY —, CAUGHT_UP: nothing at ``offset`` yet
        (``park`` waits for it), or None: ask the broker. Up to as many
        messages as the broker would answer (its count and bytes caps); a
        batch consumer's (client/batch.py) up to ``max_msgs`` within the bytes
        cap: the count cap bounds the broker's work a message on a transfer,
        and this read costs the broker nothing (its pull_batch_size is what
        a batch listener's pull costs: 256 messages a pull made a local
        consumer 3.5–4× quicker than 32)."""
        ds = self.ds
        key = (group, topic, queue_id)
        if ds.stopped or key not in self._answered:
            return None
        if not _SCAN_LOADED.is_set():
            warm_up_reads(wait=False)
            return None
        now = time.monotonic()
        if now >= self._damage_due:
            self._look_at_damage(now)
        if self._damaged:
            return None
        st = ds.state
        if st.get("config_epoch") != self._epoch:
            self._answered.clear()
            return None
        with ds.lock:                             # (a blocking send's append in another thread)
            if ds.stopped:
                return None
            return self._read(ds, st, key, group, topic, queue_id, offset,
                              max(1, max_msgs if batch else min(max_msgs, self.count_max)),
                              codes, commit_offset, now)

    def _read(self, ds, st, key, group: str, topic: str, queue_id: int, offset: int,
              max_msgs: int, codes, commit_offset: int | None, now: float):
        store = ds.store
        try:
            r = store.get_message(topic, queue_id, offset, max_msgs, codes, self.bytes_max)
            status = r.status
            if status is self.FOUND:
                phys = r.phys
                if int(phys[0]) < st.write_pos - self.window_bytes:
                    return None                   # from disk: the broker checks and reads ahead
                parts, _ = store.pull_body(phys, r.sizes, 1 << 62)    # slices of the mapping
                body = bytes(parts[0]) if len(parts) == 1 else b"".join(parts)
            elif status in self.NO_MATCHED:
                body = None
            elif status is self.OVERFLOW_ONE or status in self.EMPTY and offset == 0:
                if commit_offset is not None:
                    self._commit(key, commit_offset, now, waiting=True)
                return CAUGHT_UP                  # ``park``, then read again
            else:
                return None
        except self.failed as e:
            log.info("direct read of %s:%d at %d: %s; pulling over the socket", topic, queue_id,
                     offset, e)
            return None
        if commit_offset is not None:
            self._commit(key, commit_offset, now)
        self.count += 1
        if body is not None:
            n = r.phys.shape[0]
            self.messages += n
            cb = ds.cb                        # the broker's msgGetTotal and getTransferedTps
            if cb is not None and cb.slot >= 0:     # sum every slot's count (broker/stats.py)
                cb.procs["msgs_got"][cb.slot] += n
            if ds.tally is not None:              # GROUP_GET_NUMS / SIZE
                ds.tally.add_now(f"G\0{topic}@{group}".encode(), n, len(body))
        return body is not None, r.next_offset, r.min_offset, r.max_offset, body

    async def park(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool | None:
        """Wait until the queue has a message at ``offset`` (True) or
        ``timeout_s`` passed (False), in this process (``_Parker``); None at
        once where it cannot wait here (the broker's long poll waits)."""
        loop = asyncio.get_running_loop()
        p = self._parker
        if p is None or p.loop is not loop or p.closed:
            if self.ds.stopped or time.monotonic() < self._parker_retry_at:
                return None
            if p is not None:
                p.close()
            try:
                p = self._parker = _Parker(self.ds, loop)
            except Exception as e:           # every slot taken, the block gone: the broker parks
                if not self._parker_failed:
                    log.warning("direct reads: caught-up pulls wait in the broker, not here: %s "
                                "(tried again every %.0f s)", e, PARKER_RETRY_S)
                self._parker_failed = True
                self._parker_retry_at = time.monotonic() + PARKER_RETRY_S
                self._parker = None
                return None
            self._parker_failed = False
        self.parked += 1
        came = await p.wait(topic, queue_id, offset, timeout_s)
        self.woken += came
        return came

    def close(self) -> None:
        if self._parker is not None:
            self._parker.close()
            self._parker = None

    def forget(self, group: str, topic: str, queue_id: int) -> None:
        """The group's consumer let the queue go (a rebalance, an offset
        reset): a commit held back for it (``_commit``) is dropped, not sent
        later over the offset the consumer persisted on letting go — an
        offset reset's, or a newer one of the queue's next owner."""
        key = (group, topic, queue_id)
        self._owed.pop(key, None)
        self._committed.pop(key, None)

    def _pay(self, key: tuple[str, str, int]) -> None:
        offset = self._owed.pop(key, None)
        if offset is not None and not self.ds.stopped:
            self._commit(key, offset, time.monotonic())

    def _look_at_damage(self, now: float) -> None:
        self._damage_due = now + 1.0
        try:
            stamp = self._damage_log.stamp()
            if stamp != self._damage_stamp:
                self._damaged = bool(self._damage_log.load())
                self._damage_stamp = stamp
        except OSError:                    # cannot tell: the broker checks
            self._damaged = True

    def _commit(self, key: tuple[str, str, int], offset: int, now: float,
                waiting: bool = False) -> None:
        """The pull's commit offset to the broker (oneway), at most every
        COMMIT_EVERY_S a queue. ``waiting``: a caught-up pull about to wait,
        whose offset would otherwise wait for the next persist (5 s): one the
        window holds back is sent when the window ends (unless a newer one
        went meanwhile), not with every pull (at 10 k msg/s one message a
        pull, that cost the broker 20 µs a message)."""
        last = self._committed.get(key)
        if last is not None and last[0] == offset:
            return
        if last is not None and now - last[1] < COMMIT_EVERY_S:
            if waiting:
                if key not in self._owed:
                    asyncio.get_running_loop().call_later(COMMIT_EVERY_S - (now - last[1]),
                                                          self._pay, key)
                self._owed[key] = offset
            return
        self._owed.pop(key, None)
        conn = self.ds.conn
        if conn is None or conn.closed:
            return
        from shmq.ipc.codes import RequestCode as RC
        from shmq.ipc.remoting import RemotingCommand
        group, topic, queue_id = key
        ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id),
               "commitOffset": str(offset), "bname": self.ds.broker_name}
        conn.send_oneway(RemotingCommand(RC.UPDATE_CONSUMER_OFFSET, ext=ext))
        self._committed[key] = (offset, now)


# what ``DirectReads.pull`` answers for a queue with nothing at the offset yet
CAUGHT_UP = "caught up"
# a process that could not make its waiting place (every process slot taken,
# the broker restarting) lets the broker's long poll wait, and tries again after
PARKER_RETRY_S = 10.0
# a parked pull looks at its queue this often even without a wake-up (one
# lost between a publish and the flag being raised costs this, never a hang)
PARK_LOOK_EVERY_S = 1.0


def _look_again(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class _Parker:
    """Caught-up direct pulls of one event loop, waiting for appends on a
    wake-up socket of their own: a process slot of the store's control
    block (not the producer's: its FlushWaiter thread sleeps on that one),
    flagged WANT_QUEUES while a pull waits, with the bits of the queues
    waited on in its wait_mask, so a publish to one of them — a worker's,
    a direct producer's (``ControlBlock.wake_flagged``) — writes a byte to
    it; the socket is a reader of the loop. Woken, each waiting pull whose
    queue now reaches past its offset is released. A lost wake-up costs
    PARK_LOOK_EVERY_S at most."""

    def __init__(self, ds: DirectStore, loop: asyncio.AbstractEventLoop):
        from shmq.core.state import STATE_RUNNING, queues_mask
        from shmq.ipc.control import ROLE_OTHER, WANT_QUEUES, ControlBlock
        self.running, self.queues_mask = STATE_RUNNING, queues_mask
        cb = ControlBlock.attach(ds.root)
        try:
            cb.register(ROLE_OTHER)
            loop.add_reader(cb.waiter.fileno(), self._woken)
        except BaseException:
            cb.close()
            raise
        self.cb, self.loop, self.ds, self.store, self.flag = cb, loop, ds, ds.store, WANT_QUEUES
        self.waits: dict[int, tuple[str, int, int, asyncio.Future]] = {}
        self.ids = itertools.count()
        self.closed = False
        self.masked_at = -1               # queue_slots_used when the mask was made

    async def wait(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """True once the queue reaches past ``offset``; False after
        ``timeout_s``, or when the broker stopped or is gone. Each look is
        a future of its own, set True by a wake-up (``_woken``), None by
        its timer (look again), False by ``close``: no task, no
        ``asyncio.wait`` (a third of a consumer's CPU a message at 10 k
        msg/s went to such machinery)."""
        store, cb, loop = self.store, self.cb, self.loop
        k = next(self.ids)
        self.waits[k] = (topic, queue_id, offset, None)
        self._remask()                    # the mask, then the flag: a waker reads them so
        if len(self.waits) == 1:
            cb.set_flag(self.flag, True)
        try:
            deadline = loop.time() + timeout_s
            while True:
                # after the flag is up: an append published before it is seen here
                if store.max_offset(topic, queue_id) > offset:
                    return True
                left = deadline - loop.time()
                if left <= 0 or self.closed:
                    return False
                fut = loop.create_future()
                self.waits[k] = (topic, queue_id, offset, fut)
                timer = loop.call_later(min(left, PARK_LOOK_EVERY_S), _look_again, fut)
                try:
                    came = await fut
                finally:
                    timer.cancel()
                if came is not None:
                    return came
                if not self._serving():
                    return False          # the broker stopped or is gone: ask it (fails over)
        finally:
            self.waits.pop(k, None)
            if not self.waits and not self.closed:
                cb.set_flag(self.flag, False)

    def _serving(self) -> bool:
        """Is the store still this broker's, running, its connection open?
        (A new broker on the store, or none, writes no wake-up here.)"""
        ds, conn = self.ds, self.ds.conn
        return (not ds.stopped and not self.cb.hdr_retired[0] and conn is not None
                and not conn.closed and ds.state.get("state") == self.running)

    def _remask(self) -> None:
        """This slot's wait_mask: the bits of the queues waited on (a queue
        with no slot yet waits for NEW_QUEUE, and its slot's bit once made)."""
        st = self.store.state
        self.masked_at = st.get("queue_slots_used")
        self.cb.set_wait_mask(self.queues_mask(st, (w[:2] for w in self.waits.values())))

    def _woken(self) -> None:
        self.cb.waiter.drain()
        store = self.store
        for topic, queue_id, offset, fut in list(self.waits.values()):
            if fut is not None and not fut.done() and store.max_offset(topic, queue_id) > offset:
                fut.set_result(True)
        if store.state.get("queue_slots_used") != self.masked_at:
            self._remask()                # a queue made since: its own bit from now on

    def close(self) -> None:
        """Release every waiting pull (to the broker) and leave the slot, in
        the loop's thread (the socket is its reader)."""
        if self.closed:
            return
        self.closed = True
        try:
            running = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            running = False
        if running or self.loop.is_closed() or not self.loop.is_running():
            self._close_here()
        else:
            self.loop.call_soon_threadsafe(self._close_here)

    def _close_here(self) -> None:
        for *_, fut in self.waits.values():
            if fut is not None and not fut.done():
                fut.set_result(False)
        if not self.loop.is_closed():
            self.loop.remove_reader(self.cb.waiter.fileno())
        self.cb.close()


_APPENDS_LOADED = threading.Event()
_appends_loader: list[threading.Thread] = []


_APPEND_MODULES = ("shmq.core.store", "posix_ipc", "shmq.ipc.control")


def appends_loaded() -> bool:
    """Has this process loaded what an attachment imports and an append
    runs (``load_appends``, or the modules imported otherwise: a process
    of the broker's, a benchmark)? Then attaching is quick enough for the loop."""
    return _APPENDS_LOADED.is_set() or all(m in sys.modules for m in _APPEND_MODULES)


def load_appends() -> None:
    """Import the modules ``DirectStore`` uses and load the kernels of an
    append (from numba's cache, or compiled) in this thread; without them
    (no ``broker`` extra) return: the attachment says why."""
    if _APPENDS_LOADED.is_set():
        return
    try:
        from shmq.core import jit, store  # noqa: F401  (the heavy one: numba, the kernels)
        import posix_ipc  # noqa: F401
        from shmq.ipc import control  # noqa: F401
        # K.stamp_batch, every append's; the encoding kernels, a turn's
        # group's and send_many's (else their first use compiles or loads
        # them in the event loop)
        jit.load(("batch", "encode"))
    except ImportError:
        pass
    _APPENDS_LOADED.set()


def warm_up_appends(wait: bool = True) -> bool:
    """``load_appends`` in a thread (once per process); with ``wait``, until
    it is done. True once it is. The client does it on its first connection
    to a local broker and sends over the socket until it is done; an
    application that wants its very first send appended calls it at start."""
    return _once_in_a_thread(_appends_loader, load_appends, "shmq-direct-append-warm-up",
                             _APPENDS_LOADED, wait)


def _once_in_a_thread(loader: list, target, name: str, done: threading.Event, wait: bool) -> bool:
    """``target`` in a daemon thread, once per process (``loader`` keeps
    it); with ``wait``, until it has ended. True once ``done`` is set."""
    if not loader:
        t = threading.Thread(target=target, daemon=True, name=name)
        loader.append(t)
        t.start()
    if wait:
        loader[0].join()
    return done.is_set()


_SCAN_LOADED = threading.Event()
_scan_loader: list[threading.Thread] = []


def warm_up_reads(wait: bool = True) -> bool:
    """Load the ConsumeQueue scan kernel direct reads use, in a thread (once
    per process); with ``wait``, until it is loaded. True once it is. A
    consumer calls it on its first direct pull and pulls over the socket
    until it is done; an application that wants direct reads from its very
    first message calls it at start (the local_ipc bench does)."""
    return _once_in_a_thread(_scan_loader, _load_scan, "shmq-direct-read-warm-up", _SCAN_LOADED,
                             wait)


def _load_scan() -> None:
    """``cq_scan`` for the types a read passes: this process's mapping is
    writable, the codes read-only (client/pull.py); and the walk of what it
    reads (client/walk.py: numba is imported by now)."""
    from shmq.core.reader import warm_up_get_message

    from .walk import warm_up_decoding
    warm_up_get_message()
    warm_up_decoding()
    _SCAN_LOADED.set()


__all__ = ["COMMIT_EVERY_S", "DirectReads", "DirectStore", "DirectUnavailable", "FlushWaiter",
           "WAKE_EVERY_S", "Wakes", "appends_loaded", "load_appends", "warm_up_appends",
           "warm_up_reads"]
