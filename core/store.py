"""The message store: append, read, flush, over CommitLog + ConsumeQueues + StoreState.

``MessageStore`` is what processors call. One instance per process; all
instances of a store share the files (page cache) and the ``StoreState``
(shared memory in a broker), so several processes append concurrently.

Append (the only writer path), with the append lock held::

    1. reserve: phy = write_pos (or the next segment if the batch + an 8-byte
       blank does not fit), end = phy + bytes; stamp offsets into the private
       buffer; record reserve_{slot,qnext,start,end} in the state
    2. write:   blank (on a roll), records (pwrite), ConsumeQueue units
    3. publish: write_pos = end, then the queue's next_offset, then clear the
                reservation (reserve_start = end)

so at every instant either the reservation is empty, or ``write_pos <
reserve_end`` (nothing published: roll back by zeroing), or ``write_pos ==
reserve_end`` (published: roll the queue offset forward). ``repair_after_death``
does exactly that for a process that died holding the lock.

Reads never look past a queue's published ``next_offset`` nor a record past
``write_pos``. A batch goes to one queue, as every RocketMQ batch does.
"""
from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from . import _kernels as K
from .commitlog import CommitLog
from .config import StoreConfig
from .consumequeue import ALL_TAGS, ConsumeQueues
from .files import REAL_FILES, FileLayer
from .layout import CQ_UNIT_BYTES, CQ_UNIT_DTYPE, END_FILE_MIN_BLANK_BYTES
from .checkpoint import Checkpoint, abort_path
from .records import EncodedBatch, StoredMessage, decode
from .recovery import Recovered, RecoveryReport, TagsCodeRule, recover
from .state import STATE_RUNNING, StoreState

CQ_SCAN_BYTES_MIN = 16000
# Above this many dirty ConsumeQueues one syncfs beats a sync per file
# (each costs a journal commit, ~0.3 ms here).
CQ_SYNC_EACH_MAX = 32  # DefaultMessageStore: max(16000, maxMsgNums * 20) bytes of CQ per read


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(frozen=True)
class AppendResult:
    phy_offset: int            # CommitLog offset of the first record
    end: int                   # CommitLog offset just past the last record
    queue_offset: int          # queue offset of the first record (-1: none got one)
    rec_phy: np.ndarray        # CommitLog offset of each record
    store_timestamp: int

    @property
    def count(self) -> int:
        return int(self.rec_phy.shape[0])


@dataclass(frozen=True)
class GetResult:
    status: GetMessageStatus
    next_offset: int
    min_offset: int
    max_offset: int
    phys: np.ndarray           # CommitLog offsets of the records found
    sizes: np.ndarray

    @property
    def count(self) -> int:
        return int(self.phys.shape[0])


_EMPTY = np.zeros(0, dtype=np.int64)
_NO_UNITS = np.zeros(0, dtype=CQ_UNIT_DTYPE)


class MessageStore:
    def __init__(self, config: StoreConfig, state: StoreState, files: FileLayer = REAL_FILES,
                 on_published: Callable[[], None] | None = None,
                 on_flush_request: Callable[[], None] | None = None):
        self.config = config
        self.state = state
        self.files = files
        self.root = config.storePathRootDir
        self.cl = CommitLog(files, self.root, config.mappedFileSizeCommitLog)
        self.cqs = ConsumeQueues(files, self.root, config.cq_units_per_file)
        self.on_published = on_published
        self.on_flush_request = on_flush_request
        self._seg = config.mappedFileSizeCommitLog
        self._slot_of = np.zeros(1, dtype=np.int32)
        self._seen_cl_min = 0
        self.store_lock = None   # set by open_local: released on close

    def close(self) -> None:
        self.cl.close()
        self.cqs.close()
        if self.store_lock is not None:
            self.store_lock.release()
            self.store_lock = None

    # ------------------------------------------------------------------ append
    def append(self, batch: EncodedBatch) -> AppendResult:
        """Append ``batch`` (consumed: its buffer is stamped in place). Thread-
        and process-safe. Publishes before it returns; under SYNC_FLUSH the
        caller then waits for ``flushed_pos >= result.end``."""
        if not batch.single_queue:
            raise ValueError("a batch goes to one queue; split it by queue id")
        nbytes = batch.nbytes
        if nbytes + END_FILE_MIN_BLANK_BYTES > self._seg:
            raise ValueError(f"batch of {nbytes} bytes does not fit a {self._seg}-byte segment")
        st = self.state
        topic, qid = batch.topic, batch.queue_id
        n = batch.count
        qoff = np.empty(n, dtype=np.int64)
        slot = st.queue_slot(topic, qid)
        with st.locked():
            if slot < 0:
                slot = st.queue_slot_create(topic, qid)
            wp = st.write_pos
            seg_start = wp - wp % self._seg
            phy = wp
            if nbytes + END_FILE_MIN_BLANK_BYTES > seg_start + self._seg - wp:
                phy = seg_start + self._seg
            end = phy + nbytes
            q0 = int(st.queue_next[slot])
            qnext = np.array([q0], dtype=np.int64)
            if self._slot_of.shape[0] < n:   # one queue per batch: every record in slot 0
                self._slot_of = np.zeros(n, dtype=np.int32)
            K.stamp_batch(batch.buf, batch.rec_pos, n, phy, self._slot_of, qnext, qoff)
            q_end = int(qnext[0])
            # 1. reserve (reserve_end last: it is what marks the reservation)
            st.set("reserve_slot", slot)
            st.set("reserve_qnext", q_end)
            st.set("reserve_start", wp)
            st.set("reserve_end", end)
            # 2. write
            rec_phy = batch.rec_pos + phy
            try:
                if phy != wp:
                    self.cl.write_blank(wp)
                self.cl.ensure_segment(phy - phy % self._seg)
                self.cl.write(phy, batch.buf)
                if q_end - q0 == n:
                    self.cqs.put(topic, qid, q0, rec_phy, batch.sizes, batch.tags_codes, 0, n)
                elif q_end > q0:  # prepared/rollback transaction records get no unit
                    keep = np.flatnonzero(qoff >= 0)
                    self.cqs.put(topic, qid, q0, rec_phy[keep], batch.sizes[keep],
                                 batch.tags_codes[keep], 0, keep.shape[0])
            except BaseException:
                # e.g. ENOSPC: leave nothing that a later recovery could take
                # for records, then let the caller see the error.
                self._roll_back(slot)
                raise
            # 3. publish
            st.set("last_store_ts", batch.store_timestamp)
            st.set("write_pos", end)
            st.queue_next[slot] = q_end
            st.set("reserve_start", end)
            if self.config.sync_flush:
                st.set("flush_request_pos", end)
        if self.on_published is not None:
            self.on_published()
        if self.config.sync_flush and self.on_flush_request is not None:
            self.on_flush_request()
        return AppendResult(phy_offset=phy, end=end, queue_offset=q0 if q_end > q0 else -1,
                            rec_phy=rec_phy, store_timestamp=batch.store_timestamp)

    def repair_after_death(self) -> str:
        """Undo or finish the reservation of a process that died holding the
        append lock. Call with the lock taken over from the dead holder.
        Returns what it did: "none", "rolled back" or "rolled forward"."""
        st = self.state
        start, end, wp = st.get("reserve_start"), st.get("reserve_end"), st.write_pos
        if start >= end:
            return "none"
        slot, q_end = st.get("reserve_slot"), st.get("reserve_qnext")
        if wp >= end:
            assert wp == end, (wp, end)
            if st.queue_next[slot] < q_end:
                st.queue_next[slot] = q_end
            st.set("reserve_start", end)
            return "rolled forward"
        assert wp == start, (wp, start)
        self._roll_back(slot)
        return "rolled back"

    def _roll_back(self, slot: int) -> None:
        """Undo an unpublished reservation (lock held): erase its bytes and
        units, so neither recovery nor a reader can take them for records."""
        st = self.state
        start, end, q_end = st.get("reserve_start"), st.get("reserve_end"), st.get("reserve_qnext")
        self.cl.zero(start, end)
        topic, qid = st.slot_key(slot)
        q0 = int(st.queue_next[slot])
        if q_end > q0:
            units = np.zeros(q_end - q0, dtype=np.int64)
            self.cqs.put(topic, qid, q0, units, units, units, 0, q_end - q0)
        st.set("reserve_end", start)

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
        ``tag_codes`` (empty: all), within ``max_bytes`` (the first always)."""
        st = self.state
        if st.get("cl_min_offset") != self._seen_cl_min:
            self.release_deleted()
        slot = st.queue_slot(topic, queue_id)
        if slot < 0:
            return GetResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0, _EMPTY, _EMPTY)
        mx = int(st.queue_next[slot])
        mn = int(st.queue_min[slot])

        def result(status, nxt, phys=_EMPTY, sizes=_EMPTY):
            return GetResult(status, nxt, mn, mx, phys, sizes)

        if mx == 0:
            return result(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0)
        if offset < mn:
            return result(GetMessageStatus.OFFSET_TOO_SMALL, mn)
        if offset == mx:
            return result(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset)
        if offset > mx:
            return result(GetMessageStatus.OFFSET_OVERFLOW_BADLY, mn if mn == 0 else mx)
        units = min(mx - offset, max(CQ_SCAN_BYTES_MIN, max_msgs * CQ_UNIT_BYTES) // CQ_UNIT_BYTES)
        out_phy = np.empty(min(max_msgs, units), dtype=np.int64)
        out_size = np.empty_like(out_phy)
        r = self.cqs.scan(topic, queue_id, offset, units, tag_codes, max_msgs, max_bytes,
                          out_phy, out_size)
        if r is None:
            upf = self.config.cq_units_per_file
            return result(GetMessageStatus.OFFSET_FOUND_NULL, (offset // upf + 1) * upf)
        found, scanned, status = r
        if status == K.CQ_BAD:
            raise AssertionError(f"{topic}:{queue_id} unit {offset + scanned} below the "
                                 f"published max {mx} is not a position")
        phys, sizes = out_phy[:found], out_size[:found]
        cl_min = st.get("cl_min_offset")
        if found and phys[0] < cl_min:
            keep = phys >= cl_min
            phys, sizes = phys[keep], sizes[keep]
            if not phys.shape[0]:
                return result(GetMessageStatus.MESSAGE_WAS_REMOVING, offset + scanned)
        if not phys.shape[0]:
            return result(GetMessageStatus.NO_MATCHED_MESSAGE, offset + scanned)
        return result(GetMessageStatus.FOUND, offset + scanned, phys, sizes)

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
                                  GetMessageStatus.OFFSET_FOUND_NULL):
                break
            if r.next_offset <= offset:
                break
            offset = r.next_offset
        return out

    # ------------------------------------------------------------------- flush
    def flush_commitlog(self) -> int:
        """Make everything published so far durable and publish ``flushed_pos``:
        one group commit for every append up to now. Flusher only."""
        st = self.state
        target = st.write_pos
        ts = st.get("last_store_ts")
        done = st.flushed_pos
        if target > done:
            self.cl.flush(done, target)
            st.set("flushed_store_ts", ts)
            st.set("flushed_pos", target)
            st.set("flush_seq", st.get("flush_seq") + 1)
        return target

    def flush_consume_queues(self, thorough: bool = True) -> int:
        """Make published units durable. Thorough: every queue, and the
        returned CommitLog position (all of whose units are now durable)
        advances. Otherwise only queues with flushConsumeQueueLeastPages
        dirty pages (RocketMQ's policy: syncing every queue every second
        write-protects thousands of pages that the next appends fault on).
        Returns the checkpoint's ConsumeQueue position. Flusher only."""
        st = self.state
        with st.locked():
            # Every append ending at or before pos has published its queue
            # offsets once we hold the lock: next offsets read after it
            # cover all their units (and maybe more, which is fine).
            pos = st.write_pos
        used = st.used_slots()
        nxt = st.queue_next[used]
        done = st.queue_cq_flushed[used]
        dirty = used[nxt > done]
        if not thorough:
            least = self.config.flushConsumeQueueLeastPages * 4096 // CQ_UNIT_BYTES
            busy = used[nxt - done >= least]
            if busy.shape[0] <= CQ_SYNC_EACH_MAX:
                dirty = busy
            else:
                thorough = True   # syncfs below covers every queue anyway
        nxt_of = dict(zip(used.tolist(), nxt.tolist()))
        if thorough and dirty.shape[0] > CQ_SYNC_EACH_MAX:
            self.files.sync_filesystem(self.root)   # data and directory entries, one call
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

    def wait_flushed(self, end: int, timeout_ms: int, wait: Callable[[float], None]) -> bool:
        """Block until ``flushed_pos >= end`` (True) or ``timeout_ms`` passes
        (False: FLUSH_DISK_TIMEOUT). ``wait(seconds)`` sleeps until woken."""
        deadline = time.monotonic() + timeout_ms / 1000
        while self.state.flushed_pos < end:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            wait(left)
        return True

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)


def init_state(state: StoreState, rec: Recovered) -> None:
    """Fill a fresh ``StoreState`` from a recovery result (owner only).
    Attachers are refused until the last step marks it running."""
    state.set("write_pos", rec.write_pos)
    state.set("flushed_pos", rec.write_pos)        # recover() synced what it kept
    state.set("flush_request_pos", rec.write_pos)
    state.set("reserve_start", rec.write_pos)
    state.set("reserve_end", rec.write_pos)
    state.set("cq_flushed_pos", rec.write_pos)
    state.set("cl_min_offset", rec.cl_min_offset)
    state.set("last_store_ts", rec.last_store_ts)
    state.set("flushed_store_ts", rec.last_store_ts)
    with state.locked():
        for q in rec.queues:
            slot = state.queue_slot_create(q.topic, q.queue_id)
            state.queue_next[slot] = q.max_offset
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
