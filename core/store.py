"""The message store: append, read, flush, over CommitLog + ConsumeQueues + StoreState.

``MessageStore`` is what the broker's request handlers call. One instance per process; all
instances of a store share the files (page cache) and the ``StoreState``
(shared memory in a broker), so several processes append concurrently.

Append (the only writer path: ``append`` for a batch, ``append_record`` for
one record, a single send's, without a batch around it) is claim, write,
publish: the LMAX Disruptor's multi-producer sequencer, Aeron's log buffers.
The append lock is held only for the claim, so appends from many processes
write in parallel::

    1. claim    (append lock held: a few integer operations) seq = claim_seq;
                start = claim_pos; phy = start, or the next segment's first
                byte if the batch + an 8-byte blank does not fit (the blank
                at start belongs to this claim); end = phy + bytes; q0 = the
                queue's claim_next. Fill ring entry seq % RING_ENTRIES (start,
                phy, end, slot, q0, q_end, owner pid, CLAIMED), then claim_next,
                claim_pos and, last, claim_seq = seq + 1. With RING_ENTRIES
                claims in flight the claimant waits for the publishers.
    2. write    (no lock) stamp the offsets into the private buffer; the blank
                (on a roll), the records (pwrite), the ConsumeQueue units;
                then the entry is DONE.
    3. publish  (no lock) wait until publish_seq == seq (every earlier claim
                is published: spin, then sched_yield, then sleeps of at most
                1 ms); then last_store_ts, write_pos = end, the queue's
                next_offset, queue_pos, flush_request_pos (SYNC_FLUSH) and,
                last, publish_seq = seq + 1. ``append`` returns after that, so
                an acknowledged append is visible and recoverable.

Claims are published in claim order, one at a time, by whoever holds the
turn: the owner of claim ``publish_seq``, or, when that owner is dead (or gave
its claim up), a process that repairs it holding the lock. So every published
position has its bytes and units below it, and each shared counter has one
writer at a time without an atomic instruction (Python has none).

Repair (``repair_after_death``: the boss when a process dies; an appender
whose turn waits on a dead owner; an appender whose own write failed, e.g.
ENOSPC): a claim not DONE whose owner is dead or gave it up is

    * rolled back if it is the last claim: its bytes (a blank included) and
      units zeroed, claim_seq, claim_pos and the queue's claim_next moved back;
    * padded otherwise: a BLANK at start (on a roll), a PAD record over
      [phy, end) (``layout``; every scanner skips it) and padding units at its
      queue offsets (pulls skip them; its offsets are never reused); now DONE.

A DONE claim of a dead owner is published as it stands (rolled forward), also
one whose owner died inside its own publish (``_publish``). A
claim past ``write_pos`` that nobody finished is, to recovery after a crash, a
torn write: the scan stops at its first bad byte and truncates what follows.

Reads never look past a queue's published ``next_offset`` nor a record past
``write_pos``. A batch goes to one queue, as every RocketMQ batch does. What a
process reads through the mappings stays in its RSS until it is given back:
each time the write position has moved GIVE_BACK_EVERY_BYTES on, a reader
gives back (``CommitLog.drop``) its pages more than HOT_BYTES behind it, so
a worker that serves consumers for days holds the hot tail, not every page
it ever served (a reader far behind gives back its own as it reads ahead:
``broker/handlers/pull.py``).
"""
from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Mapping

import numpy as np

from . import _kernels as K
from . import layout as L
from .commitlog import CommitLog, FileRange, SegmentMissing
from .config import StoreConfig
from .consumequeue import ALL_TAGS, ConsumeQueues
from .files import REAL_FILES, FileLayer
from .layout import CQ_UNIT_BYTES, CQ_UNIT_DTYPE, END_FILE_MIN_BLANK_BYTES
from .checkpoint import Checkpoint, abort_path
from . import dedup as D
from . import reader
from .reader import GetMessageStatus, GetResult, body_pieces
from .records import ONE_AT_ZERO, EncodedBatch, StoredMessage, decode
from .recovery import Recovered, RecoveryReport, TagsCodeRule, recover
from .state import (CLAIMED, DONE, E_END, E_PHY, E_PID, E_Q0, E_QEND, E_SEQ, E_SLOT, E_START,
                    E_CLAIMED_MS, E_STATE, E_TICKS, E_TS, ENTRY_WORDS, I_CLAIM_POS, I_CLAIM_SEQ, I_DEDUP_SEQ,
                    I_CL_MIN_OFFSET, I_FLUSH_REQUEST_POS, I_LAST_STORE_TS, I_PUBLISH_SEQ,
                    I_QUEUE_POS, I_WRITE_POS, I_STATE, Q_CLAIM, Q_MIN, Q_NEXT, Q_WORDS, QUEUE_BASE,
                    NEW_QUEUE, QUEUE_BITS, RING_BASE, RING_ENTRIES,
                    STATE_RUNNING, STATE_STOPPING, StoreState, StoreStopping, me, owner_alive)

# Above this many dirty ConsumeQueues one syncfs beats a sync per file
# (each costs a journal commit, ~0.3 ms here).
CQ_SYNC_EACH_MAX = 32
# A reader's mapped CommitLog pages further behind the write position than
# HOT_BYTES are given back each time it moves GIVE_BACK_EVERY_BYTES on (the
# module doc): a worker's RSS holds about HOT_BYTES of the log at most.
HOT_BYTES = 256 << 20
GIVE_BACK_EVERY_BYTES = 64 << 20


class AppendResult:
    """Where an append went. (Slots and a plain ``__init__``, not a frozen
    dataclass: built once per send, and frozen ones cost a microsecond.)"""
    __slots__ = ("phy_offset", "end", "queue_offset", "rec_pos", "store_timestamp")

    def __init__(self, phy_offset: int, end: int, queue_offset: int, rec_pos: np.ndarray,
                 store_timestamp: int):
        self.phy_offset = phy_offset        # CommitLog offset of the first record
        self.end = end                      # CommitLog offset just past the last record
        self.queue_offset = queue_offset    # queue offset of the first record (-1: none got one)
        self.rec_pos = rec_pos              # position of each record in the batch
        self.store_timestamp = store_timestamp

    @property
    def rec_phy(self) -> np.ndarray:
        """CommitLog offset of each record."""
        return self.rec_pos + self.phy_offset

    @property
    def count(self) -> int:
        return int(self.rec_pos.shape[0])


class DuplicateResult(AppendResult):
    """An append refused as a duplicate (``core.dedup``): where the first
    append of the same UNIQ_KEY (and topic) went, read back from its
    records. ``queue_offset`` is -1 for a record with no queue offset (a
    prepared transaction record), as the first append's was."""
    __slots__ = ("queue_id",)

    def __init__(self, phy_offset, end, queue_offset, rec_pos, store_timestamp, queue_id):
        super().__init__(phy_offset, end, queue_offset, rec_pos, store_timestamp)
        self.queue_id = queue_id


_NO_UNITS = np.zeros(0, dtype=CQ_UNIT_DTYPE)
_NO_POS = np.zeros(0, dtype=np.int64)


# Waiting for the turn to publish: spin, then yield the CPU, then sleep (doubling
# up to the cap); a claim ahead whose owner may be dead is checked every
# LIVENESS_CHECK_S of sleeping (a /proc read), and repaired if it is.
# The cap is short because a sleeper holds back every claim behind it (they
# publish in claim order): with the worker's send lane appending 64-record
# runs, 8 workers on 16 cores spent 79% of their time asleep here (py-spy
# --idle) and sent 44-54 k msg/s, fewer than one worker's 58-64 k; with
# 1,024 yields and a 50 µs cap, 258 k (4 workers: 190-208 k either way;
# `python -m perf broker_scaling` on the 16-core device machine, 2026-11-27).
SPINS = 64
YIELDS = 1024
SLEEP_MIN_S = 20e-6
SLEEP_MAX_S = 50e-6
LIVENESS_CHECK_S = 0.01

_STAMP = struct.Struct(">qq")          # QUEUEOFFSET, PHYSICALOFFSET, back to back
assert L.OFF_PHYSICALOFFSET == L.OFF_QUEUEOFFSET + 8
_TX_BYTE = L.OFF_SYSFLAG + 3           # the SYSFLAG byte holding the transaction type bits
# prepared and rollback transaction records get no queue offset: both have
# the PREPARED bit (0x4), which COMMIT (0x8) lacks
_NO_UNIT_BIT = L.SYSFLAG_TRANSACTION_PREPARED
_ENT = D.ENT_WORDS                      # words of a dedup window entry


def _entry(seq: int) -> int:
    """Word index of claim ``seq``'s ring entry."""
    return RING_BASE + seq % RING_ENTRIES * ENTRY_WORDS


class MessageStore:
    def __init__(self, config: StoreConfig, state: StoreState, files: FileLayer = REAL_FILES,
                 on_published: Callable[[int], None] | None = None,
                 on_flush_request: Callable[[], None] | None = None):
        self.config = config
        self.state = state
        self.files = files
        self.root = config.storePathRootDir
        self.cl = CommitLog(files, config.commitlog_dir, config.mappedFileSizeCommitLog)
        self.cqs = ConsumeQueues(files, config.consumequeue_dir, config.cq_units_per_file)
        # called after each publish with the queues it concerns (a
        # ``state.queue_bit`` mask; -1: any): the wake-ups of pulls waiting on them
        self.on_published = on_published
        self.on_flush_request = on_flush_request
        # A worker that leads the group commit of its own sync sends at the
        # end of its turn (broker/worker.py) does not ask the flusher for
        # each of them: on_flush_request is then for a roll only.
        self.flush_inline = False
        # the queue slot of the last append this process published (what a
        # mask of one queue bit passed to ``on_published`` stands for)
        self.published_slot = -1
        self._flush_lock = None     # files.FlushLock, opened by the first flush
        self._seg = config.mappedFileSizeCommitLog
        self._sync = config.sync_flush
        self._w = state.words
        self._lock = state.lock_impl
        self._slot_of = np.zeros(1, dtype=np.int32)
        self._seen_cl_min = 0
        self._given_back = 0      # this process's mapped pages below here were given back
        # the duplicate-send window (core.dedup): its length, bucket heads, entries
        self.dedup_on = self._dn = state.dedup_entries
        self._dn2 = 2 * self._dn
        self._dh = state.dedup_heads
        self._de = state.dedup_ents
        self.store_lock = None   # set by open_local: released on close
        # A repair left a dead owner's finished claim unpublished behind a live
        # one (or failed): the owner's supervisor calls repair_after_death again.
        self.repair_pending = False
        # Tests only: called as hook(stage, seq) once the claim is made
        # ("claimed") and once its bytes are written ("written").
        self.hook: Callable[[str, int], None] | None = None
        # Called while an append waits, between its sleeps (a claim ahead of
        # it not yet published, or the ring full): an exception it raises
        # leaves the append as an interrupt there does (the claim, if any,
        # finished and given up to whoever publishes next). A direct
        # producer's main thread delivers a Ctrl-C it kept here
        # (client/direct.py, _SigintGuard).
        self.on_wait: Callable[[], None] | None = None

    def close(self) -> None:
        self.cl.close()
        self.cqs.close()
        if self._flush_lock is not None:
            self._flush_lock.close()
            self._flush_lock = None
        if self.store_lock is not None:
            self.store_lock.release()
            self.store_lock = None

    # ------------------------------------------------------------------ append
    def append(self, batch: EncodedBatch, dedup_hash: int = 0,
               each: list[int] | None = None) -> AppendResult | None:
        """Append ``batch`` (consumed: its buffer is stamped in place). Thread-
        and process-safe. Publishes before it returns; under SYNC_FLUSH the
        caller then waits for ``flushed_pos >= result.end``.

        ``dedup_hash``: ``dedup.key_hash`` of the first record's UNIQ_KEY
        (0: none, no check). With a window (``dedup_on``), an append whose
        records carry, in order, the keys of an append still in the window,
        to the same topic, is not stored: a ``DuplicateResult`` says where
        that one went (``core.dedup``).

        ``each``: the records are messages sent one by one (the sends to
        one queue a worker read in one reactor turn, appended in one
        claim), each
        checked for duplicates on its own: ``each[i]`` is record i's key
        hash (0: none), and each keyed record is an entry of the window.
        Then the answer is None, and nothing is appended, when one of the
        keys may be in the window (an entry of the same hash) or is there
        twice: append those messages one by one."""
        if not batch.single_queue:
            raise ValueError("a batch goes to one queue; split it by queue id")
        buf = batch.buf
        rec_pos = batch.rec_pos
        n = rec_pos.shape[0]
        if n == 1 and each is None:
            return self.append_record(batch.topic, batch.queue_id, buf, batch.tags_codes.item(0),
                                      batch.store_timestamp, dedup_hash)
        nbytes = buf.shape[0]
        if nbytes + END_FILE_MIN_BLANK_BYTES > self._seg:
            raise ValueError(f"batch of {nbytes} bytes does not fit a {self._seg}-byte segment")
        nq = n - int(np.count_nonzero(buf[rec_pos + _TX_BYTE] & _NO_UNIT_BIT))
        topic, qid = batch.topic, batch.queue_id
        ts = batch.store_timestamp
        known = self.state.queue_slot(topic, qid)
        if each is not None and self._dn:
            keyed = [h for h in each if h]
            if len(set(keyed)) != len(keyed):
                return None
        else:
            each = None
        return self._commit(batch, known, topic, qid, nbytes, nq, ts, dedup_hash, each, rec_pos, 0)

    def append_record(self, topic: str, qid: int, rec, tags_code: int, ts: int,
                      dedup_hash: int = 0) -> AppendResult:
        """``append`` of one record (``rec``: a writable buffer of exactly
        its bytes, as ``records.encode_record`` makes; consumed: stamped in
        place), with its ConsumeQueue tags code and store timestamp: a
        single send's append without a batch of one around it (its arrays
        cost a send more than the claim). The same claim, duplicate check,
        write and publish as ``append``, which hands its batches of one here."""
        nbytes = len(rec)
        if nbytes + END_FILE_MIN_BLANK_BYTES > self._seg:
            raise ValueError(f"batch of {nbytes} bytes does not fit a {self._seg}-byte segment")
        nq = 0 if rec[_TX_BYTE] & _NO_UNIT_BIT else 1
        return self._commit(rec, self.state.queue_slot(topic, qid), topic, qid, nbytes, nq, ts,
                            dedup_hash, None, ONE_AT_ZERO, tags_code)

    def _commit(self, what, known: int, topic: str, qid: int, nbytes: int, nq: int, ts: int,
                dh: int, each: list[int] | None, rec_pos: np.ndarray, tags_code: int):
        """Claim, write, publish ``what``: an ``EncodedBatch`` (``append``)
        or one record's buffer with its ``tags_code`` (``append_record``).
        Its ``AppendResult``, a ``DuplicateResult``, or None (``each``: one
        by one instead)."""
        c = self._claim(known, topic, qid, nbytes, nq, ts, dh if self._dn else 0, what, each)
        if c is None or c.__class__ is DuplicateResult:
            return c
        slot, seq, e, start, phy, q0 = c
        try:
            if self.hook is not None:
                self.hook("claimed", seq)
            if what.__class__ is EncodedBatch:
                self._write(what, rec_pos.shape[0], nq, topic, qid, start, phy, q0)
            else:
                self._write_one(what, nq, topic, qid, start, phy, q0, tags_code)
        except BaseException:
            # e.g. ENOSPC: leave nothing that a later recovery could take for
            # records (roll back or pad), then let the caller see the error.
            self._give_up(seq)
            raise
        self._finish(seq, e, slot, known, start, phy, phy + nbytes, q0, nq, ts)
        return AppendResult(phy, phy + nbytes, q0 if nq else -1, rec_pos, ts)

    def _finish(self, seq: int, e: int, slot: int, known: int, start: int, phy: int, end: int,
               q0: int, nq: int, ts: int) -> None:
        """Step 3: claim ``seq`` (ring entry ``e``) is written: DONE, then,
        in claim order, its positions published, the pulls waiting on its
        queue woken and the flusher asked."""
        w = self._w
        hook = self.hook
        w[e + E_STATE] = DONE
        if hook is not None:
            hook("written", seq)
        # publish, in claim order
        waited = w[I_PUBLISH_SEQ] != seq
        if waited:
            try:
                self._await(seq)
            except BaseException:   # finished, but not ours to publish now: anyone's
                w[e + E_PID] = 0
                raise
        qn = QUEUE_BASE + slot * Q_WORDS + Q_NEXT
        assert w[I_WRITE_POS] == start and w[qn] == q0, (
            "publish: claims publish in claim order, back to back: write_pos and the "
            "queue's next offset must be where this claim began", w[I_WRITE_POS], start, q0)
        w[I_LAST_STORE_TS] = ts
        w[I_WRITE_POS] = end
        w[qn] = q0 + nq
        w[I_QUEUE_POS] = end
        if self._sync:
            w[I_FLUSH_REQUEST_POS] = end
        w[I_PUBLISH_SEQ] = seq + 1
        if self.on_published is not None:
            # whom it concerns (a state.queue_bit mask, inline): its queue, a
            # queue new with it (or whose slot a claim that published nothing
            # made: its first offset), and any, after a wait that may have
            # repaired and published the claims of others; for a mask of
            # one queue, its slot is ``published_slot``
            self.published_slot = slot
            self.on_published(-1 if waited else 1 << slot % QUEUE_BITS
                              | (NEW_QUEUE if known < 0 or q0 == 0 else 0))
        # the flusher, under SYNC_FLUSH for this append; on a roll into a new
        # segment for the one after it, to be created before it is needed
        if ((self._sync and not self.flush_inline) or phy != start) \
                and self.on_flush_request is not None:
            self.on_flush_request()

    def _claim(self, slot: int, topic: str, qid: int, nbytes: int, nq: int,
               ts: int, dh: int = 0, batch=None,
               each: list[int] | None = None):
        """Step 1: (slot, seq, ring entry, start, phy, q0) of a new claim of
        ``nbytes`` and ``nq`` queue offsets. Only integer operations under
        the lock. With ``dh`` (a dedup hash) the window is looked up first
        and a hit returned as a ``DuplicateResult``; a miss is recorded.
        With ``each`` (a hash per record, ``append``), None if any of them
        may be in the window; else each is recorded at its record."""
        w = self._w
        lock = self._lock
        seg = self._seg
        pid, ticks = me()
        claimed_ms = int(time.time() * 1000)
        while True:
            lock.acquire()
            try:
                if w[I_STATE] == STATE_STOPPING:       # the owner closes: its last flush is next
                    raise StoreStopping(f"the store {self.root} is closing")
                if slot < 0:
                    slot = self.state.queue_slot_create(topic, qid)
                seq = w[I_CLAIM_SEQ]
                hit = None
                if dh and seq - w[I_PUBLISH_SEQ] < RING_ENTRIES:
                    # the window (dedup_add, _dedup_find inlined for a miss):
                    # the bucket's newest position, if any is in the window
                    db = self._dh + dh % self._dn2
                    top = w[I_DEDUP_SEQ]
                    p = w[db] - 1
                    if p >= 0 and p >= top - self._dn:
                        hit = self._dedup_find(dh, topic, batch)
                        if hit.__class__ is DuplicateResult:
                            return hit
                if each is not None:
                    for h in each:
                        if h and self._maybe_in_window(h):
                            return None
                if hit is None and seq - w[I_PUBLISH_SEQ] < RING_ENTRIES:
                    start = w[I_CLAIM_POS]
                    seg_end = start - start % seg + seg
                    phy = seg_end if nbytes + END_FILE_MIN_BLANK_BYTES > seg_end - start else start
                    if each is not None:
                        for h, pos in zip(each, batch.rec_pos.tolist()):
                            if h:
                                self.dedup_add(h, phy + pos)
                    if dh:   # entry, then dedup_seq, then the head (core.dedup)
                        de = self._de + top % self._dn * _ENT
                        w[de] = dh
                        w[de + 1] = p + 1
                        w[de + 2] = phy
                        w[I_DEDUP_SEQ] = top + 1
                        w[db] = top + 1
                    qi = QUEUE_BASE + slot * Q_WORDS + Q_CLAIM
                    q0 = w[qi]
                    e = RING_BASE + seq % RING_ENTRIES * ENTRY_WORDS
                    w[e + E_STATE] = CLAIMED
                    w[e + E_START] = start
                    w[e + E_PHY] = phy
                    w[e + E_END] = phy + nbytes
                    w[e + E_SLOT] = slot
                    w[e + E_Q0] = q0
                    w[e + E_QEND] = q0 + nq
                    w[e + E_PID] = pid
                    w[e + E_TICKS] = ticks
                    w[e + E_TS] = ts
                    w[e + E_CLAIMED_MS] = claimed_ms
                    w[e + E_SEQ] = seq
                    w[qi] = q0 + nq
                    w[I_CLAIM_POS] = phy + nbytes
                    w[I_CLAIM_SEQ] = seq + 1     # last: this makes the claim
                    return slot, seq, e, start, phy, q0
            finally:
                lock.release()
            if hit is not None:     # the key's first append is in flight: once it is
                self._await(hit[0] + 1, hit[1])   # published, repaired or rolled
                continue                           # back, look again
            self._await(seq - RING_ENTRIES + 1)   # the ring is full

    def busy_ms(self, now_ms: int) -> int:
        """How long (ms) the oldest claim not yet published has been in
        flight, 0 when none is: appends publish in claim order, so a writer
        that stalls after claiming (stopped, swapped out, a write stuck on
        the disk) holds back every later append until it finishes or dies.
        A few shared reads, lock-free; RocketMQ's isOSPageCacheBusy asks the
        same of its put lock."""
        w = self._w
        seq = w[I_PUBLISH_SEQ]
        if w[I_CLAIM_SEQ] == seq:
            return 0
        e = RING_BASE + seq % RING_ENTRIES * ENTRY_WORDS
        if w[e + E_SEQ] != seq:
            return 0            # published meanwhile and the entry reused
        if w[e + E_PID] == 0:
            # given up by its owner (interrupted waiting for the claims ahead,
            # a write the disk refused): the next append repairs and publishes
            # it at once (``_await``). Counted busy, every send was refused
            # before it claimed, nobody came to publish it, and the store
            # stayed busy while its owner lived.
            return 0
        return max(0, now_ms - w[e + E_CLAIMED_MS])

    # ------------------------------------------------------------ dedup window
    def dedup_add(self, h: int, phy: int) -> None:
        """Record a keyed append at ``phy`` in the window (lock held, or the
        owner before anyone attaches). The entry, then ``dedup_seq``, then
        the bucket head: see ``core.dedup``."""
        w = self._w
        n = self._dn
        p = w[I_DEDUP_SEQ]
        b = self._dh + h % self._dn2
        e = self._de + p % n * D.ENT_WORDS
        w[e] = h
        w[e + 1] = w[b]
        w[e + 2] = phy
        w[I_DEDUP_SEQ] = p + 1
        w[b] = p + 1

    def _maybe_in_window(self, h: int) -> bool:
        """Lock held: may key hash ``h`` be in the window? Its bucket's chain
        walked for an entry of the same hash, as ``_dedup_find`` walks it
        (a bucket's head alone says little: with the window full, four
        buckets in ten have one); a chain longer than ``MAX_STEPS`` says
        maybe."""
        w = self._w
        n = self._dn
        low = w[I_DEDUP_SEQ] - n
        p = w[self._dh + h % self._dn2] - 1
        de = self._de
        steps = D.MAX_STEPS
        while p >= low and p >= 0:
            if not steps:
                return True
            e = de + p % n * D.ENT_WORDS
            if w[e] == h:
                return True
            p = w[e + 1] - 1
            steps -= 1
        return False

    def _dedup_find(self, h: int, topic: str, batch):
        """Lock held: the ``DuplicateResult`` of an append in the window
        with ``batch``'s keys, (claim seq, phy) of the claim to wait for when
        such an append is still in flight, or None. Bounded, as the lock is
        held: at most ``dedup.MAX_STEPS`` chain steps and
        ``dedup.MAX_CANDIDATES`` records read back, newest first (a client
        that puts one key first in every batch of different messages, or
        one key on many topics, must not make every send read them all)."""
        w = self._w
        n = self._dn
        top = w[I_DEDUP_SEQ]
        low = top - n
        p = w[self._dh + h % self._dn2] - 1
        de = self._de
        steps = D.MAX_STEPS
        reads = D.MAX_CANDIDATES
        while p >= low and p >= 0 and steps:
            e = de + p % n * D.ENT_WORDS
            if w[e] == h:
                hit = self._dedup_check(w[e + 2], topic, batch)
                if hit is not None:
                    return hit
                reads -= 1
                if not reads:
                    break
            p = w[e + 1] - 1
            steps -= 1
        return None

    def _dedup_check(self, phy: int, topic: str, batch):
        """Lock held: is the append at ``phy`` the same as ``batch`` (its
        records' topic and keys, in order; else a buffer: ``append_record``'s
        one record)? Its ``DuplicateResult``; (the seq of its claim, the
        claim's first record) if it is not published yet; None if not."""
        w = self._w
        if phy >= w[I_WRITE_POS]:          # claimed, not published: wait for it
            for s in range(w[I_PUBLISH_SEQ], w[I_CLAIM_SEQ]):
                e = _entry(s)      # (a record of a claim of several sends: inside it)
                if w[e + E_PHY] <= phy < w[e + E_END] and w[e + E_SEQ] == s:
                    return s, w[e + E_PHY]
            return None                    # rolled back
        if phy < self.state.get("cl_min_offset"):
            return None
        seg = self._seg
        rel = phy % seg
        if not isinstance(batch, EncodedBatch):       # append_record's one record
            mine, positions = memoryview(batch).cast("B"), [0]
        else:
            mine, positions = memoryview(batch.buf), batch.rec_pos.tolist()
        stored = memoryview(self.cl.map(phy - rel))[rel:]
        tb = topic.encode()
        pos = 0
        first = None
        rec_pos = np.empty(len(positions), dtype=np.int64)
        for i, mpos in enumerate(positions):
            if phy + pos >= w[I_WRITE_POS]:
                return None
            old = D.read_record_key(stored, pos)
            new = D.read_record_key(mine, mpos)
            if old is None or new is None or old.topic != tb or old.key != new.key \
                    or old.key is None or old.reconsume:
                return None
            if first is None:
                first = old
            rec_pos[i] = pos
            pos += old.size
        q0 = -1 if first.sysflag & _NO_UNIT_BIT else first.queue_offset
        return DuplicateResult(phy, phy + pos, q0, rec_pos, first.store_ts, first.queue_id)

    def _write(self, batch: EncodedBatch, n: int, nq: int, topic: str, qid: int, start: int,
               phy: int, q0: int) -> None:
        """Step 2, for a batch of several records: stamp the offsets, write
        the blank (on a roll), the records and the ConsumeQueue units. No lock."""
        buf = batch.buf
        qnext = np.array([q0], dtype=np.int64)
        qoff = np.empty(n, dtype=np.int64)
        if self._slot_of.shape[0] < n:   # one queue per batch: every record in slot 0
            self._slot_of = np.zeros(n, dtype=np.int32)
        K.stamp_batch(buf, batch.rec_pos, n, phy, self._slot_of, qnext, qoff)
        assert int(qnext[0]) == q0 + nq, (int(qnext[0]), q0, nq)
        if phy != start:
            self._pwrite(start, self.cl.blank(start))
        self._pwrite(phy, buf)
        if nq == 0:
            return
        if nq == n:
            self.cqs.put(topic, qid, q0, batch.rec_pos + phy, batch.sizes, batch.tags_codes, 0, n)
        else:
            keep = np.flatnonzero(qoff >= 0)
            self.cqs.put(topic, qid, q0, batch.rec_pos[keep] + phy, batch.sizes[keep],
                         batch.tags_codes[keep], 0, keep.shape[0])

    def _write_one(self, rec, nq: int, topic: str, qid: int, start: int, phy: int, q0: int,
                   tags_code: int) -> None:
        """Step 2, for one record (``rec``, a buffer of exactly its bytes):
        its offsets stamped, the blank (on a roll), the record and its unit
        (``nq``: 1, or 0 for a transaction record that takes no queue offset)."""
        _STAMP.pack_into(rec, L.OFF_QUEUEOFFSET, q0 if nq else 0, phy)
        if phy != start:
            self._pwrite(start, self.cl.blank(start))
        self._pwrite(phy, rec)
        if nq:
            self.cqs.put_one(topic, qid, q0, phy, len(rec), tags_code)

    def _pwrite(self, phy: int, data) -> None:
        """Write into the CommitLog, creating the segment if nobody has yet
        (the flusher usually has, ahead of the writers; of a new store, the
        first append makes the first, and wakes the flusher to make the
        next one)."""
        try:
            self.cl.write(phy, data)
        except SegmentMissing:
            self.cl.ensure_segment(phy - phy % self._seg)
            self.cl.write(phy, data)
            if self.on_flush_request is not None:
                self.on_flush_request()

    def _await(self, seq: int, phy: int = -1) -> None:
        """Step 3's wait: until ``publish_seq >= seq``. Claims ahead are their
        owners' to publish; one whose owner died or gave it up is repaired
        here (under the lock), so a dead process never stops the store.
        With ``phy`` (a duplicate check waiting for claim ``seq - 1`` at that
        offset) it also ends when that claim is gone: rolled back, or its
        sequence number reused by another claim."""
        w = self._w
        spins = 0
        sleep_s = SLEEP_MIN_S
        check_at = 0.0
        while True:
            ps = w[I_PUBLISH_SEQ]
            if ps >= seq:
                return
            if phy >= 0 and (w[I_CLAIM_SEQ] < seq or w[_entry(seq - 1) + E_PHY] != phy):
                return
            spins += 1
            if spins <= SPINS:
                continue
            e = _entry(ps)
            if w[e + E_PID] == 0 and w[e + E_SEQ] == ps:   # given up: anyone finishes it
                self.repair_after_death()
                continue
            if spins <= SPINS + YIELDS:
                os.sched_yield()
                continue
            now = time.monotonic()
            if not check_at:
                check_at = now + LIVENESS_CHECK_S
            elif now >= check_at:
                check_at = now + LIVENESS_CHECK_S
                pid, ticks = w[e + E_PID], w[e + E_TICKS]
                if w[e + E_SEQ] == ps and not owner_alive(pid, ticks):
                    self.repair_after_death()
                    continue
            if self.on_wait is not None:
                self.on_wait()
            time.sleep(sleep_s)
            sleep_s = min(2 * sleep_s, SLEEP_MAX_S)

    def _give_up(self, seq: int) -> None:
        """This process's write for claim ``seq`` failed: roll it back (the
        last claim) or pad it and leave it for the publishers (owner 0). If
        even that fails, the claim is left with owner 0 and the next repair
        (by any process) tries again."""
        w = self._w
        e = _entry(seq)
        self._lock.acquire()
        try:
            try:
                if w[I_CLAIM_SEQ] == seq + 1:
                    self._roll_back(seq)
                    return
                self._pad(seq)
                w[e + E_STATE] = DONE
            finally:
                if w[e + E_SEQ] == seq:
                    w[e + E_PID] = 0
        finally:
            self._lock.release()

    # ------------------------------------------------------------------ repair
    def repair_after_death(self, lock_held: bool = False) -> str:
        """Finish what dead processes left: every claim whose owner is dead
        or gave it up is rolled back (the last ones, unfinished), padded
        (unfinished, with later claims) or published as it stands (finished);
        see the module doc. ``lock_held``: the caller took the append lock
        over from a dead holder (which may have died mid-claim). Returns what
        it did ("none" if nothing)."""
        if not lock_held:
            self._lock.acquire()
        try:
            done = self._repair(lock_held)
        finally:
            if not lock_held:
                self._lock.release()
        if done != "none" and self.on_published is not None:
            self.on_published(-1)           # what it published, on whatever queues
        return done

    def _repair(self, normalize: bool) -> str:
        w = self._w
        if normalize:
            self._normalize_claims()
        alive: dict[tuple[int, int], bool] = {}

        def dead(e: int) -> bool:
            key = (w[e + E_PID], w[e + E_TICKS])
            if key not in alive:
                alive[key] = owner_alive(*key)
            return not alive[key]

        rolled = padded = forward = 0
        while w[I_CLAIM_SEQ] > w[I_PUBLISH_SEQ]:     # the last claims, newest first
            seq = w[I_CLAIM_SEQ] - 1
            e = _entry(seq)
            if w[e + E_STATE] != CLAIMED or not dead(e):
                break
            self._roll_back(seq)
            rolled += 1
        for seq in range(w[I_PUBLISH_SEQ], w[I_CLAIM_SEQ]):
            e = _entry(seq)
            if w[e + E_STATE] == CLAIMED and dead(e):
                self._pad(seq)
                w[e + E_STATE] = DONE
                w[e + E_PID] = 0
                padded += 1
        while w[I_PUBLISH_SEQ] < w[I_CLAIM_SEQ]:     # the turn is a dead owner's: take it
            seq = w[I_PUBLISH_SEQ]
            e = _entry(seq)
            if w[e + E_STATE] != DONE or not dead(e):
                break
            forward += w[e + E_PID] != 0
            self._publish(seq)
        assert w[I_PUBLISH_SEQ] <= w[I_CLAIM_SEQ] <= w[I_PUBLISH_SEQ] + RING_ENTRIES and (
            w[I_WRITE_POS] <= w[I_CLAIM_POS]), ("repair: publish_seq <= claim_seq within a ring, "
                                               "write_pos <= claim_pos")
        self.repair_pending = any(w[_entry(s) + E_STATE] == DONE and dead(_entry(s))
                                  for s in range(w[I_PUBLISH_SEQ], w[I_CLAIM_SEQ]))
        what = [f"{k} {name}" for k, name in ((rolled, "rolled back"), (padded, "padded"),
                                               (forward, "rolled forward")) if k]
        return ", ".join(what) or "none"

    def _normalize_claims(self) -> None:
        """A lock holder died, maybe mid-claim: make claim_pos and every
        queue's claim_next agree with the claims made (claim_seq commits a
        claim; what a dead holder wrote before it is dropped). Lock held."""
        w, st = self._w, self.state
        used = st.used_slots()
        st.queue_claim[used] = st.queue_next[used]
        pos = w[I_WRITE_POS]
        for seq in range(w[I_PUBLISH_SEQ], w[I_CLAIM_SEQ]):
            e = _entry(seq)
            st.queue_claim[w[e + E_SLOT]] = w[e + E_QEND]
            pos = w[e + E_END]
        w[I_CLAIM_POS] = pos

    def _roll_back(self, seq: int) -> None:
        """Undo the last claim (lock held): erase its bytes (a blank
        included) and units, so neither recovery nor a reader can take them
        for records, and hand its range and queue offsets out again."""
        w, st = self._w, self.state
        e = _entry(seq)
        assert w[I_CLAIM_SEQ] == seq + 1 and seq >= w[I_PUBLISH_SEQ], (
            "roll back: only the last claim, never a published one", w[I_CLAIM_SEQ], seq)
        start, end, slot, q0, q_end = (w[e + E_START], w[e + E_END], w[e + E_SLOT], w[e + E_Q0],
                                       w[e + E_QEND])
        self.cl.zero(start, end)
        if q_end > q0:
            topic, qid = st.slot_key(slot)
            units = np.zeros(q_end - q0, dtype=np.int64)
            self.cqs.put(topic, qid, q0, units, units, units, 0, q_end - q0)
        w[QUEUE_BASE + slot * Q_WORDS + Q_CLAIM] = q0
        w[I_CLAIM_POS] = start
        w[I_CLAIM_SEQ] = seq
        w[e + E_SEQ] = -1

    def _pad(self, seq: int) -> None:
        """Make claim ``seq``'s range a PAD record (after a BLANK, on a roll)
        and its queue offsets padding units (``layout``)."""
        w = self._w
        e = _entry(seq)
        assert w[I_PUBLISH_SEQ] <= seq < w[I_CLAIM_SEQ], (
            "pad: only a claim made and not yet published", seq)
        start, phy, end, slot, q0, q_end = (w[e + E_START], w[e + E_PHY], w[e + E_END],
                                            w[e + E_SLOT], w[e + E_Q0], w[e + E_QEND])
        topic, qid = self.state.slot_key(slot)
        if phy != start:
            self._pwrite(start, self.cl.blank(start))
        data = bytearray(end - phy)
        head = L.pad_header(L.Pad(phy, end - phy, topic, qid, q0, q_end - q0))
        data[:len(head)] = head
        self._pwrite(phy, data)
        if q_end > q0:
            self.cqs.put_padding(topic, qid, q0, q_end - q0)

    def _publish(self, seq: int) -> None:
        """Publish claim ``seq`` from its ring entry, for its dead owner (the
        turn is ours: lock held, publish_seq == seq). The owner may have died
        inside its own publish (``_finish``), after some of the positions
        and before publish_seq: those it wrote are the claim's own ends, and
        every position is written again here."""
        w = self._w
        e = _entry(seq)
        assert w[I_PUBLISH_SEQ] == seq and w[e + E_SEQ] == seq, (
            "repair publishes the claim whose turn it is", w[I_PUBLISH_SEQ], seq)
        end = w[e + E_END]
        at = (w[I_WRITE_POS], w[QUEUE_BASE + w[e + E_SLOT] * Q_WORDS + Q_NEXT])
        assert at in ((w[e + E_START], w[e + E_Q0]), (end, w[e + E_Q0]), (end, w[e + E_QEND])), (
            "publish: claims publish in claim order, back to back (the positions where the claim "
            "began, or where a publish its owner died in left them)", seq, at)
        w[I_LAST_STORE_TS] = w[e + E_TS]
        w[I_WRITE_POS] = end
        w[QUEUE_BASE + w[e + E_SLOT] * Q_WORDS + Q_NEXT] = w[e + E_QEND]
        w[I_QUEUE_POS] = end
        if self._sync:
            w[I_FLUSH_REQUEST_POS] = end
        w[I_PUBLISH_SEQ] = seq + 1

    # -------------------------------------------------------------------- read
    def max_offset(self, topic: str, queue_id: int) -> int:
        slot = self.state.queue_slot(topic, queue_id)
        return int(self.state.queue_next[slot]) if slot >= 0 else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        slot = self.state.queue_slot(topic, queue_id)
        return int(self.state.queue_min[slot]) if slot >= 0 else 0

    def get_message(self, topic: str, queue_id: int, offset: int, max_msgs: int,
                    tag_codes: np.ndarray = ALL_TAGS, max_bytes: int = 256 * 1024) -> GetResult:
        """RocketMQ's ``DefaultMessageStore.getMessage``: up to ``max_msgs``
        records of the queue from ``offset`` whose tags code is in the sorted
        ``tag_codes`` (empty: all), within ``max_bytes`` (the first always),
        below the published positions (``reader.get_message``)."""
        w = self._w
        if w[I_CL_MIN_OFFSET] != self._seen_cl_min:
            self.release_deleted()
        if w[I_WRITE_POS] - self._given_back > HOT_BYTES + GIVE_BACK_EVERY_BYTES:
            self._give_back()
        slot = self.state.queue_slot(topic, queue_id)
        if slot < 0:
            return GetResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0, _NO_POS, _NO_POS)
        q = QUEUE_BASE + slot * Q_WORDS
        return reader.get_message(self.cqs, topic, queue_id, offset, w[q + Q_MIN], w[q + Q_NEXT],
                                  self._cl_min, max_msgs, tag_codes, max_bytes)

    def _cl_min(self) -> int:
        return self._w[I_CL_MIN_OFFSET]

    def pull_body(self, phys: np.ndarray, sizes: np.ndarray, sendfile_min: int,
                  nbytes: int = -1) -> tuple[list[FileRange | memoryview], int]:
        """The published records at ``phys``/``sizes`` (a ``GetResult``'s,
        ``nbytes`` its total when known) as the pieces of a reply body, and
        their bytes: runs of adjacent records, as ``FileRange``s of the
        segment files (sendfile) from ``sendfile_min`` bytes, else as slices
        of the mapping (``reader.body_pieces``)."""
        return body_pieces(self.cl, phys, sizes, sendfile_min, nbytes)

    def queue_units(self, topic: str, queue_id: int, offset: int, max_units: int) -> np.ndarray:
        """The published ConsumeQueue units from ``offset`` (at most
        ``max_units``, within one file) as a ``CQ_UNIT_DTYPE`` array: the
        background services read delivery times from the tags codes of
        their internal queues this way, without touching the CommitLog."""
        mx = self.max_offset(topic, queue_id)
        offset = max(offset, self.min_offset(topic, queue_id))
        if offset >= mx:
            return _NO_UNITS
        got = self.cqs.units(topic, queue_id, offset, min(max_units, mx - offset))
        return _NO_UNITS if got is None else got

    def store_time(self, topic: str, queue_id: int, offset: int) -> int | None:
        """Store timestamp (ms) of the message at a queue offset, or None."""
        r = self.get_message(topic, queue_id, offset, 1, max_bytes=1 << 62)
        if r.status is not GetMessageStatus.FOUND or r.next_offset != offset + 1:
            return None
        head = self.record_view(int(r.phys[0]), 80)
        pos = 56 + (12 if int.from_bytes(head[36:40].tobytes(), "big") & 0x10 else 0)
        return int.from_bytes(head[pos:pos + 8].tobytes(), "big", signed=True)

    def offset_by_time(self, topic: str, queue_id: int, ts: int) -> int:
        """The first queue offset stored at or after ``ts`` (binary search by
        store time; the max offset if none)."""
        lo, hi = self.min_offset(topic, queue_id), self.max_offset(topic, queue_id)
        while lo < hi:
            mid = (lo + hi) // 2
            t = self.store_time(topic, queue_id, mid)
            if t is not None and t < ts:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _give_back(self) -> None:
        """Give back this process's mapped CommitLog pages more than
        HOT_BYTES behind the write position (a reader still there faults
        them back from the page cache)."""
        below = int(self._w[I_WRITE_POS]) - HOT_BYTES
        self.cl.drop(self._given_back, below)
        self._given_back = below

    def release_deleted(self) -> None:
        """Close this process's handles on files retention has deleted, so
        their disk space is freed."""
        st = self.state
        cl_min = st.get("cl_min_offset")
        for start in [s for s in self.cl.open_segments() if s + self._seg <= cl_min]:
            self.cl.close_segment(start)
        upf = self.config.cq_units_per_file
        for topic, qid, fi in self.cqs.open_files():
            slot = st.queue_slot(topic, qid)
            if slot >= 0 and (fi + 1) * upf <= st.queue_min[slot]:
                self.cqs.forget(topic, qid, fi)
        self._seen_cl_min = cl_min

    def record_view(self, phy: int, size: int) -> np.ndarray:
        """Zero-copy bytes of a published record."""
        assert phy + size <= self.state.write_pos
        return self.cl.view(phy, size)

    def read_message(self, phy: int) -> StoredMessage:
        seg = self.cl.map(self.cl.segment_start(phy))
        return decode(seg, phy % self._seg)

    def read_queue(self, topic: str, queue_id: int, offset: int = 0,
                   max_msgs: int = 1 << 30) -> list[StoredMessage]:
        """Every message of a queue from ``offset`` (tools and tests)."""
        out: list[StoredMessage] = []
        while len(out) < max_msgs:
            r = self.get_message(topic, queue_id, offset, min(1024, max_msgs - len(out)),
                                 max_bytes=1 << 62)
            if r.status is GetMessageStatus.FOUND:
                out.extend(self.read_message(int(p)) for p in r.phys)
            elif r.status not in (GetMessageStatus.NO_MATCHED_MESSAGE,
                                  GetMessageStatus.MESSAGE_WAS_REMOVING,
                                  GetMessageStatus.OFFSET_FOUND_NULL,
                                  GetMessageStatus.OFFSET_TOO_SMALL):   # from the queue's min
                break
            if r.next_offset <= offset:
                break
            offset = r.next_offset
        return out

    # ------------------------------------------------------------------- flush
    def flush_commitlog(self, block: bool = True) -> int:
        """Make everything published so far durable and publish ``flushed_pos``:
        one group commit for every append up to now. Holding the flush lock
        (``files.FlushLock``: the flusher, or a worker leading the group
        commit of its turn's sync sends), so ``flushed_pos`` has one writer
        at a time. ``block`` False: -1 at once if another process holds
        it (it is flushing; it wakes those waiting when it has published)."""
        lock = self._flush_lock
        if lock is None:
            lock = self._flush_lock = self.files.flush_lock(self.config.commitlog_dir)
        if not lock.acquire(block):
            return -1
        try:
            st = self.state
            target = st.write_pos
            ts = st.get("last_store_ts")
            done = st.flushed_pos
            assert target >= done, ("flush: flushed_pos is a past write_pos, never ahead of it",
                                    done, target)
            if target > done:
                self.cl.flush(done, target)
                st.set("flushed_store_ts", ts)
                st.set("flushed_pos", target)
                st.set("flush_seq", st.get("flush_seq") + 1)
            return target
        finally:
            lock.release()

    def flush_consume_queues(self, thorough: bool = True) -> int:
        """Make published units durable. Thorough: every queue, and the
        returned CommitLog position (all of whose units are now durable)
        advances. Otherwise only queues with flushConsumeQueueLeastPages
        dirty pages (RocketMQ's policy: syncing every queue every second
        write-protects thousands of pages that the next appends fault on);
        when those are all the queues with unflushed units, that is every
        queue, and the position advances too: a recovery after kill -9 or
        power loss then rescans about a flush interval of writes, not up to
        flushConsumeQueueThoroughInterval's (60 s of a busy broker's writes
        is tens of GB). Returns the checkpoint's ConsumeQueue position.
        Flusher only."""
        st = self.state
        # Every claim ending at or before queue_pos has published its queue
        # offsets: next offsets read after it cover all their units (and
        # maybe more, which is fine).
        pos = self._w[I_QUEUE_POS]
        used = st.used_slots()
        nxt = st.queue_next[used]
        done = st.queue_cq_flushed[used]
        dirty = used[nxt > done]
        if not thorough:
            least = self.config.flushConsumeQueueLeastPages * 4096 // CQ_UNIT_BYTES
            busy = used[nxt - done >= least]
            if busy.shape[0] >= dirty.shape[0]:
                thorough = True   # every queue with unflushed units is busy: the same syncs
            elif busy.shape[0] <= CQ_SYNC_EACH_MAX:
                dirty = busy
            else:
                thorough = True   # syncfs below covers every queue anyway
        nxt_of = dict(zip(used.tolist(), nxt.tolist()))
        if thorough and dirty.shape[0] > CQ_SYNC_EACH_MAX:
            self.files.sync_filesystem(self.cqs.dir)   # data and directory entries, one call
        else:
            upf = self.config.cq_units_per_file
            for slot in dirty.tolist():
                topic, qid = st.slot_key(slot)
                flushed, end = int(st.queue_cq_flushed[slot]), nxt_of[slot]
                self.cqs.flush(topic, qid, max(flushed, int(st.queue_min[slot])), end)
                if (flushed - 1) // upf != (end - 1) // upf:
                    self.cqs.sync_dirs(topic, qid, new_queue=flushed == 0)  # new files' names
        st.queue_cq_flushed[dirty] = [nxt_of[s] for s in dirty.tolist()]
        if thorough:
            st.set("cq_flushed_pos", pos)
        return st.get("cq_flushed_pos")

    def write_checkpoint(self) -> Checkpoint:
        """Record what is durable (after flush_commitlog and flush_consume_queues)."""
        st = self.state
        ts = st.get("flushed_store_ts")
        ck = Checkpoint(physic_ts=ts, logics_ts=ts, index_ts=0,
                        cl_flushed=st.flushed_pos, cq_flushed=st.get("cq_flushed_pos"))
        ck.save(self.files, self.root)
        return ck

    def wait_flushed(self, end: int, timeout_ms: int, wait: Callable[[float], None],
                     clock: Callable[[], float] = time.monotonic) -> bool:
        """Block until ``flushed_pos >= end`` (True) or ``timeout_ms`` passes
        on ``clock`` (False: FLUSH_DISK_TIMEOUT). ``wait(seconds)`` sleeps
        until woken."""
        deadline = clock() + timeout_ms / 1000
        while self.state.flushed_pos < end:
            left = deadline - clock()
            if left <= 0:
                return False
            wait(left)
        return True

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def disk_usage_ratio(self) -> float:
        """Use (0..1) of the fullest disk the store writes: the root's, the
        CommitLog's and the ConsumeQueues' (storePathCommitLog may put the
        CommitLog on a disk of its own). Retention and the full-disk refusal
        go by it. OSError: a disk cannot be measured."""
        return max(self.files.disk_usage_ratio(d) for d in {self.root, self.cl.dir, self.cqs.dir})


def init_state(state: StoreState, rec: Recovered) -> None:
    """Fill a fresh ``StoreState`` from a recovery result (owner only).
    Attachers are refused until the last step marks it running."""
    state.set("write_pos", rec.write_pos)
    state.set("flushed_pos", rec.write_pos)        # recover() synced what it kept
    state.set("flush_request_pos", rec.write_pos)
    state.set("claim_pos", rec.write_pos)
    state.set("queue_pos", rec.write_pos)
    state.set("claim_seq", 0)
    state.set("publish_seq", 0)
    state.set("cq_flushed_pos", rec.write_pos)
    state.set("cl_min_offset", rec.cl_min_offset)
    state.set("last_store_ts", rec.last_store_ts)
    state.set("flushed_store_ts", rec.last_store_ts)
    with state.locked():
        for q in rec.queues:
            slot = state.queue_slot_create(q.topic, q.queue_id)
            state.queue_next[slot] = q.max_offset
            state.queue_claim[slot] = q.max_offset
            state.queue_min[slot] = q.min_offset
            state.queue_cq_flushed[slot] = q.max_offset
    state.set("state", STATE_RUNNING)


def open_local(config: StoreConfig, files: FileLayer = REAL_FILES,
               tags_code_rules: Mapping[str, TagsCodeRule] | None = None,
               ) -> tuple[MessageStore, RecoveryReport]:
    """Recover and open a store for this process alone (tools, tests): the
    state lives in private memory and the flusher's work is done by calling
    ``flush_all``. Holds the store's lock file (a running broker's store is
    refused with StoreInUse) and marks it running (``abort``) until
    ``close_clean``. ``tags_code_rules``: as ``recover`` takes them (a
    broker's store wants the broker's, ``broker.delivery.tags_code_rules``)."""
    lock = files.lock_store(config.storePathRootDir)   # StoreInUse if a broker has it
    try:
        rec = recover(config, files, tags_code_rules)
        state = StoreState.create_local(config.maxQueueSlots, config.mappedFileSizeCommitLog)
        init_state(state, rec)
        files.touch(abort_path(config.storePathRootDir))
    except BaseException:
        lock.release()
        raise
    store = MessageStore(config, state, files)
    store.store_lock = lock
    return store, rec.report


def flush_all(store: MessageStore) -> None:
    store.flush_commitlog()
    store.flush_consume_queues()
    store.write_checkpoint()


def close_clean(store: MessageStore) -> None:
    """Clean shutdown: flush everything, checkpoint, remove ``abort``."""
    flush_all(store)
    store.files.unlink(abort_path(store.root))
    store.close()
