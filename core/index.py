"""IndexFile: RocketMQ's key → CommitLog-offset hash index (reference §7.3).

``<store>/index/<yyyyMMddHHmmssSSS>`` files in RocketMQ's byte format, sparse
and mapped; the kernels are in ``_kernels``. One process writes (``build``,
the broker's services process); any process queries (``read_only=True``).
Keys are stored as hashes only: a query may return records of another key,
so the caller re-checks the key on each record (RocketMQ's clients do).

Blocks: the files are sparse (a new file costs its header, not 420 MB) and
written through their mapping, where a store into a page with no block on a
full disk is a SIGBUS that kills the services process. So the writer gives
pages blocks (fallocate) before the kernel stores there: the header and the
hash slots (random access) when the file is made or first opened for
writing, the entries (sequential) ahead of indexCount, up to
ENTRIES_AHEAD_MAX bytes at a time (``FileLayer.allocate_ahead``); the
kernel is told to stop at the last entry with blocks (``IndexFile.room``).
A full disk is then ENOSPC from ``build``, which keeps its place
(``IndexBuilder`` tries again later).

Concurrency: an insert writes the entry, then its slot, then the header,
indexCount last, slots and indexCount as aligned 4-byte stores (x86-64 TSO
keeps the order); a query loads indexCount first and reports only entries
below it. Crash safety: the index is derived; ``recover`` drops what the
CommitLog does not back and the build redoes it.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from . import _kernels as K
from . import jit
from . import layout as L
from .commitlog import SegmentMissing
from .config import StoreConfig
from .files import REAL_FILES, FileLayer
from .recovery import next_valid_record
from .store import MessageStore

if sys.byteorder != "little":
    raise ImportError("the IndexFile kernels store big-endian words on a little-endian host")

NAME_DIGITS = 17
# MessageStoreConfig.maxMsgsNumBatch: IndexService.queryOffset caps maxNum at it.
MAX_MSGS_NUM_BATCH = 64
SCAN_ROWS = 8192
# entries given blocks at a time at most (the module doc): 52,428 entries
ENTRIES_AHEAD_MAX = 1 << 20
log = logging.getLogger("shmq.store")

HEADER_DTYPE = np.dtype([("begin_ts", ">i8"), ("end_ts", ">i8"), ("begin_phy", ">i8"),
                         ("end_phy", ">i8"), ("slot_count", ">i4"), ("index_count", ">i4")])
ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("phy", ">i8"), ("time_diff", ">i4"),
                        ("prev", ">i4")])
assert HEADER_DTYPE.itemsize == K.IX_HEADER_BYTES and ENTRY_DTYPE.itemsize == K.IX_ENTRY_BYTES

_UNIQ_KEY = np.frombuffer(L.PROPERTY_UNIQ_KEY.encode(), np.uint8)
_KEYS = np.frombuffer(L.PROPERTY_KEYS.encode(), np.uint8)
_TAGS = np.frombuffer(L.PROPERTY_TAGS.encode(), np.uint8)


class IndexGeometryError(ValueError):
    """An index file's size does not match maxHashSlotNum and maxIndexNum."""


def file_bytes(slot_num: int, index_num: int) -> int:
    return K.IX_HEADER_BYTES + slot_num * K.IX_SLOT_BYTES + index_num * K.IX_ENTRY_BYTES


def time_millis_to_human(ms: int) -> str:
    """``UtilAll.timeMillisToHumanString``: local time as yyyyMMddHHmmssSSS."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(ms // 1000)) + f"{ms % 1000:03d}"


def key_hash(topic: str, key: str) -> int:
    """``IndexFile.indexKeyHashMethod(topic + "#" + key)``: abs of the Java
    hashCode, Integer.MIN_VALUE mapped to 0."""
    h = L.java_string_hash(f"{topic}#{key}")
    return 0 if h == -2**31 else abs(h)


class IndexFile:
    """One mapped index file."""

    def __init__(self, files: FileLayer, path: str, slot_num: int, index_num: int,
                 writable: bool):
        h = files.open(path, writable)
        if h.size != file_bytes(slot_num, index_num):
            files.close(h)
            raise IndexGeometryError(f"{path}: {h.size} bytes, expected "
                                     f"{file_bytes(slot_num, index_num)}")
        self.files = files
        self.path = path
        self.name = os.path.basename(path)
        self.slot_num = slot_num
        self.index_num = index_num
        self._h = h
        self.buf = files.map_only(h)
        self.header = np.ndarray((), HEADER_DTYPE, self.buf, 0)
        self.entries = np.ndarray((index_num,), ENTRY_DTYPE, self.buf,
                                  K.IX_HEADER_BYTES + slot_num * K.IX_SLOT_BYTES)

    @classmethod
    def create(cls, files: FileLayer, path: str, slot_num: int, index_num: int,
               end_phy: int, end_ts: int) -> IndexFile | None:
        """RocketMQ's ``new IndexFile``: a sparse file that starts where the
        previous one ended (its endPhyOffset and endTimestamp, when positive).
        None if ``path`` exists."""
        if not files.create_preallocated(path, file_bytes(slot_num, index_num), sparse=True):
            return None
        f = cls(files, path, slot_num, index_num, writable=True)
        try:
            f.room()                       # blocks for the header and slots before a store there
        except OSError:                    # the disk is full: no file rather than one that
            f.close()                      # would be a SIGBUS to write
            files.unlink(path)
            raise
        if end_phy > 0:
            f.header["begin_phy"] = f.header["end_phy"] = end_phy
        if end_ts > 0:
            f.header["begin_ts"] = f.header["end_ts"] = end_ts
        f.header["index_count"] = 1
        return f

    @property
    def begin_ts(self) -> int:
        return int(self.header["begin_ts"])

    @property
    def end_ts(self) -> int:
        return int(self.header["end_ts"])

    @property
    def begin_phy(self) -> int:
        return int(self.header["begin_phy"])

    @property
    def end_phy(self) -> int:
        return int(self.header["end_phy"])

    @property
    def slot_count(self) -> int:
        return int(self.header["slot_count"])

    @property
    def count(self) -> int:
        """indexCount: the next entry to write (1 in an empty file)."""
        return max(1, int(self.header["index_count"]))

    @property
    def is_full(self) -> bool:
        return self.count >= self.index_num

    @property
    def entries_base(self) -> int:
        return K.IX_HEADER_BYTES + self.slot_num * K.IX_SLOT_BYTES

    def room(self) -> int:
        """The writer's limit for the kernel's ``index_num``: entries below
        it lie in pages with blocks, as do the header and the slots; more
        are given blocks here when the next entry has none (the module
        doc). OSError (ENOSPC) when the disk has no room for the next one."""
        h, base, size = self._h, self.entries_base, K.IX_ENTRY_BYTES
        have = max(0, (h.allocated - base) // size)
        if self.count >= have and have < self.index_num:
            # the next entry's own bytes, and ahead
            self.files.allocate_ahead(h, base + (self.count + 1) * size, h.size, ENTRIES_AHEAD_MAX)
            have = max(0, (h.allocated - base) // size)
        return min(have, self.index_num)

    def time_matched(self, begin: int, end: int) -> bool:
        """``IndexFile.isTimeMatched``."""
        b, e = self.begin_ts, self.end_ts
        return (begin < b and end > e) or b <= begin <= e or b <= end <= e

    def select(self, h: int, max_num: int, begin: int, end: int, out: np.ndarray, n: int) -> int:
        return K.index_select(self.buf, self.slot_num, self.index_num, h, max_num, begin, end,
                              out, n)

    def flush(self) -> None:
        self.files.sync(self._h)

    def close(self) -> None:
        self.buf = self.header = self.entries = None   # no view may outlive the mapping
        self.files.close(self._h)


@dataclass
class IndexRecovery:
    discarded: list[str] = field(default_factory=list)   # "<file>: <why>"
    resume_phy: int = 0      # CommitLog offset the build resumes at
    resume_keys: int = 0     # keys of the record there that the index already holds


class IndexService:
    """The index directory: its files oldest first, the last one being written."""

    def __init__(self, config: StoreConfig, files: FileLayer = REAL_FILES,
                 read_only: bool = False):
        self.config = config
        self.files = files
        self.read_only = read_only
        self.dir = config.index_dir
        self.slot_num = config.maxHashSlotNum
        self.index_num = config.maxIndexNum
        self._files: list[IndexFile] = []
        self._recovery: IndexRecovery | None = None
        self._next_phy = 0    # the record the build goes on with ...
        self._skip = 0        # ... and how many of its keys are indexed
        self.damaged_skipped = 0   # damaged ranges the build stepped over
        self._rows = None if read_only else np.empty((SCAN_ROWS, K.N_SCAN), np.int64)
        self._out = np.empty(MAX_MSGS_NUM_BATCH, np.int64)
        if not read_only:
            files.makedirs(self.dir)
        self._refresh()

    def _names(self) -> list[str]:
        return [n for n in self.files.listdir(self.dir) if len(n) == NAME_DIGITS and n.isdigit()]

    def _refresh(self) -> None:
        """Open the files that appeared since, close the ones deleted since.
        Files of another geometry are left out."""
        have = {f.name: f for f in self._files}
        files = []
        for name in self._names():
            f = have.pop(name, None)
            if f is None:
                try:
                    f = IndexFile(self.files, os.path.join(self.dir, name), self.slot_num,
                                  self.index_num, writable=not self.read_only)
                except (IndexGeometryError, FileNotFoundError):
                    continue
            files.append(f)
        for f in have.values():
            f.close()
        self._files = files

    @property
    def file_names(self) -> list[str]:
        return [f.name for f in self._files]

    # ------------------------------------------------------------------ query
    def query(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[int]:
        """``IndexService.queryOffset``: CommitLog offsets of the records whose
        index key hash is that of ``topic#key`` and whose store time (to the
        second below) lies in [begin_ms, end_ms], newest file first, at most
        min(max_num, 64). Hash collisions are possible: re-check the key."""
        if self.read_only:
            self._refresh()
        max_num = min(max_num, MAX_MSGS_NUM_BATCH)
        h = key_hash(topic, key)
        n = 0
        for f in reversed(self._files):
            if n >= max_num:
                break
            if f.count <= 1:
                # Empty: just created (maybe with its header not yet written).
                # RocketMQ would look at its inherited times, which send any
                # query on to the previous file, or stop where it finds nothing.
                continue
            if f.time_matched(begin_ms, end_ms):
                n = f.select(h, max_num, begin_ms, end_ms, self._out, n)
            if f.begin_ts < begin_ms:
                break
        return self._out[:n].tolist()

    def _last_written(self) -> IndexFile | None:
        """The newest file with entries: its end is the newest file's (a file
        starts empty with its predecessor's end)."""
        return next((f for f in reversed(self._files) if f.count > 1), None)

    @property
    def last_update_timestamp(self) -> int:
        """QUERY_MESSAGE's ``indexLastUpdateTimestamp`` (as of the last query)."""
        f = self._last_written()
        return f.end_ts if f is not None else 0

    @property
    def last_update_phy_offset(self) -> int:
        """QUERY_MESSAGE's ``indexLastUpdatePhyoffset`` (as of the last query)."""
        f = self._last_written()
        return f.end_phy if f is not None else 0

    # --------------------------------------------------------------- recovery
    def recover(self, store: MessageStore) -> IndexRecovery:
        """Make the index agree with the recovered CommitLog; writer only,
        ``build`` calls it once. The rule:

        1. delete files of another size (maxHashSlotNum or maxIndexNum
           changed) and leftovers of an interrupted create;
        2. while the newest file does not check out, delete it: header out
           of range, slots or entries not as index_put leaves them (a torn
           page, a crash inside an insert), endPhyOffset at or past the
           write position, or no record at endPhyOffset;
        3. resume at the record at the newest endPhyOffset, skipping the keys
           of it the index holds (they may span files); with no file left,
           at the CommitLog's min offset.

        So a discarded newest file is rebuilt from its beginPhyOffset (its
        predecessor's end). Entries in older files are not checked one by
        one: a file was flushed when it filled, before the next began."""
        self._check_writer()
        rep = IndexRecovery()
        expected = file_bytes(self.slot_num, self.index_num)
        for name in self.files.listdir(self.dir):
            path = os.path.join(self.dir, name)
            if name.endswith(".tmp"):
                self.files.unlink(path)   # a create that a crash interrupted
            elif len(name) == NAME_DIGITS and name.isdigit():
                size = self.files.file_size(path)
                if size != expected:
                    self.files.unlink(path)
                    rep.discarded.append(f"{name}: {size} bytes, not {expected} "
                                         f"(maxHashSlotNum or maxIndexNum changed)")
        self._refresh()
        while self._files:
            f = self._files[-1]
            why = self._problem(f, store)
            if why is None:
                break
            self._files.pop()
            f.close()
            self.files.unlink(f.path)
            rep.discarded.append(f"{f.name}: {why}")
        self._next_phy, self._skip = self._resume_point(store.state.get("cl_min_offset"))
        rep.resume_phy, rep.resume_keys = self._next_phy, self._skip
        self._recovery = rep
        return rep

    def _problem(self, f: IndexFile, store: MessageStore) -> str | None:
        """Why ``f`` cannot be the newest file, or None."""
        count = int(f.header["index_count"])
        if not 1 <= count <= self.index_num:   # 0: the create was cut short
            return f"indexCount {count} outside 1..{self.index_num}"
        slots = f.slot_count
        if not 0 <= slots <= min(count - 1, self.slot_num):
            return f"hashSlotCount {slots} with indexCount {count}"
        status, used = K.index_check(f.buf, self.slot_num, count)
        if status == K.IX_BAD_SLOT:
            return "torn: a hash slot names a missing entry or one of another slot"
        if status == K.IX_BAD_ENTRY:
            return "torn: an entry is not as index_put writes one"
        if used != slots:
            return f"hashSlotCount {slots} but {used} slots in use"
        end_phy = f.end_phy
        if count > 1 and (int(f.entries[1]["phy"]) != f.begin_phy
                          or int(f.entries[count - 1]["phy"]) != end_phy):
            return "beginPhyOffset or endPhyOffset differs from the entries"
        if count > 1 or f.end_ts > 0:   # a key was indexed at end_phy
            write_pos = store.state.write_pos
            if end_phy >= write_pos:
                return f"endPhyOffset {end_phy} is past the CommitLog end {write_pos}"
            if end_phy >= store.state.get("cl_min_offset") and not _record_at(store, end_phy):
                return f"no record at endPhyOffset {end_phy}"
        return None

    def _resume_point(self, cl_min: int) -> tuple[int, int]:
        if not self._files:
            return cl_min, 0
        f = self._files[-1]
        end_phy = f.end_phy
        if (f.count <= 1 and f.end_ts <= 0) or end_phy < cl_min:
            return cl_min, 0
        keys = 0          # entries of the record at end_phy, from the newest back
        for g in reversed(self._files):
            i = g.count - 1
            while i >= 1 and int(g.entries[i]["phy"]) == end_phy:
                keys += 1
                i -= 1
            if i >= 1:
                break
        return end_phy, keys

    # ------------------------------------------------------------------ build
    def build(self, store: MessageStore, limit_bytes: int | None = None) -> int:
        """Index the records from where the index ends up to the CommitLog's
        write position, stopping once about ``limit_bytes`` (whole scan
        chunks of up to SCAN_ROWS records; default backgroundScanWindowBytes)
        are done. Returns how many bytes of CommitLog the index advanced
        over. A no-op unless messageIndexEnable.

        The pages walked are given back at the end of each call
        (``CommitLog.drop``): a backfill over a store it never indexed walks
        the whole CommitLog, and this process's RSS holds one window of it,
        not the store."""
        self._check_writer()
        if not self.config.messageIndexEnable:
            return 0
        if self._recovery is None:
            self.recover(store)
        st = store.state
        seg_bytes = self.config.mappedFileSizeCommitLog
        end = st.write_pos
        start = self._next_phy
        if limit_bytes is None:
            limit_bytes = self.config.backgroundScanWindowBytes
        while self._next_phy < end and self._next_phy - start < limit_bytes:
            pos = self._next_phy
            if pos < st.get("cl_min_offset"):   # retention deleted it unindexed
                self._next_phy, self._skip = st.get("cl_min_offset"), 0
                continue
            seg_start = pos - pos % seg_bytes
            try:
                seg = store.cl.map(seg_start)
            except SegmentMissing:
                if pos < st.get("cl_min_offset"):
                    continue
                raise
            n, rel, status = K.scan_records(seg, pos - seg_start, min(end - seg_start, seg_bytes),
                                            seg_start, False, K.CRC_TABLES, _TAGS, self._rows)
            if n:
                self._index_rows(seg, n)
            if status == K.SCAN_BLANK:
                self._next_phy = seg_start + seg_bytes
            elif status == K.SCAN_FULL or (status == K.SCAN_END and n):
                self._next_phy = seg_start + rel
            else:
                self._next_phy = self._past_damage(seg, seg_start, rel, end)
        store.cl.drop(start, self._next_phy)
        if self._files and self._next_phy > start:
            # the entries written so far are only queried now (a few pages
            # each): out of this RSS too; the hash slots stay (random access)
            f = self._files[-1]
            first = K.IX_HEADER_BYTES + f.slot_num * K.IX_SLOT_BYTES
            self.files.drop(f._h, first, first + f.count * K.IX_ENTRY_BYTES)
        return self._next_phy - start

    def _past_damage(self, seg: np.ndarray, seg_start: int, rel: int, end: int) -> int:
        """No valid record at ``seg_start + rel``, below the write position:
        damage (recovery quarantines what it scans; older segments are not
        rescanned). Skip to the next valid record, or the next segment, and
        say so: the records there are not indexed (QUERY_MESSAGE will not
        find them) but nothing after them is lost."""
        stop_in_seg = min(end - seg_start, seg.shape[0])
        nxt = next_valid_record(seg, seg_start, rel + 1, stop_in_seg)
        resume = seg_start + (nxt if nxt is not None else seg.shape[0])
        resume = min(resume, end)
        self.damaged_skipped += 1
        log.error("index: no valid record at CommitLog offset %d below the write position %d "
                  "(damaged): %d bytes skipped to %d, not indexed", seg_start + rel, end,
                  resume - seg_start - rel, resume)
        return resume

    def _index_rows(self, seg: np.ndarray, n: int) -> None:
        """Index rows[:n]. On OSError (no room on the disk for a new file or
        the next entry's page) the build's place is the first row not done
        and the keys of it done, where the next ``build`` goes on."""
        first, skip = 0, self._skip
        while True:
            try:
                f = self._files[-1] if self._files and not self._files[-1].is_full else self._roll()
                room = f.room()
            except OSError:
                self._next_phy, self._skip = int(self._rows[first, K.S_PHY]), skip
                raise
            # the kernel stops at ``room`` as at a full file (IX_FULL): a file
            # not full then gets more room on the next turn, a full one a successor
            row, done, status = K.index_records(seg, self._rows, first, n, skip, f.buf,
                                                self.slot_num, room, _UNIQ_KEY, _KEYS)
            if status == K.IX_DONE:
                break
            first, skip = row, done
        self._skip = 0

    def _roll(self) -> IndexFile:
        """``getAndCreateLastIndexFile``: flush the full file, start the next."""
        prev = self._files[-1] if self._files else None
        if prev is not None:
            prev.flush()
            # full: only queries read it now (a few pages each); its
            # maxIndexNum entries leave this process's RSS
            self.files.drop(prev._h, 0, prev._h.size)
        end_phy = prev.end_phy if prev is not None else 0
        end_ts = prev.end_ts if prev is not None else 0
        name = time_millis_to_human(int(time.time() * 1000))
        while True:
            # Names must sort in creation order: after a clock step back, or a
            # second file in the same millisecond, take the next number.
            if prev is not None and name <= prev.name:
                name = f"{int(prev.name) + 1:0{NAME_DIGITS}d}"
            f = IndexFile.create(self.files, os.path.join(self.dir, name), self.slot_num,
                                 self.index_num, end_phy, end_ts)
            if f is not None:
                self._files.append(f)
                return f
            name = f"{int(name) + 1:0{NAME_DIGITS}d}"

    # ------------------------------------------------------------ maintenance
    def delete_below(self, min_phy: int) -> int:
        """``IndexService.deleteExpiredFile``: delete the oldest files whose
        endPhyOffset is below the CommitLog's min offset, never the newest.
        Returns how many."""
        self._check_writer()
        n = 0
        while len(self._files) > 1 and self._files[0].end_phy < min_phy:
            f = self._files.pop(0)
            f.close()
            self.files.unlink(f.path)
            n += 1
        return n

    def flush(self) -> None:
        """msync the file being written (full files were flushed when they filled)."""
        self._check_writer()
        if self._files:
            self._files[-1].flush()

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []

    def _check_writer(self) -> None:
        if self.read_only:
            raise RuntimeError("this IndexService is read-only: only the services process writes")


def _record_at(store: MessageStore, phy: int) -> bool:
    """Whether a published record starts at ``phy`` (its magic and its own
    PHYSICALOFFSET say so)."""
    seg_bytes = store.config.mappedFileSizeCommitLog
    rel = phy % seg_bytes
    if rel + L.RECORD_FIXED_BYTES > seg_bytes:
        return False
    try:
        head = store.cl.map(phy - rel)[rel:rel + L.OFF_PHYSICALOFFSET + 8].tobytes()
    except SegmentMissing:
        return False
    size = int.from_bytes(head[0:4], "big", signed=True)
    magic = int.from_bytes(head[4:8], "big", signed=True)
    own = int.from_bytes(head[L.OFF_PHYSICALOFFSET:L.OFF_PHYSICALOFFSET + 8], "big", signed=True)
    return (magic == L.MESSAGE_MAGIC_I32 and own == phy and size > 0
            and phy + size <= store.state.write_pos)


def warm_up() -> None:
    """The index kernels once each, with their canonical types (``core/jit.py``):
    segments and index files they only read are read-only."""
    idx = np.zeros(file_bytes(2, 3), np.uint8)
    seg = jit.readonly(np.zeros(64, np.uint8))     # compiling needs the types only
    rows = jit.readonly(np.zeros((0, K.N_SCAN), np.int64))
    K.index_records(seg, rows, 0, 0, 0, idx, 2, 3, _UNIQ_KEY, _KEYS)
    ro = jit.readonly(idx)
    K.index_check(ro, 2, 2)
    K.index_select(ro, 2, 3, 0, 1, 0, 1, np.zeros(1, np.int64), 0)
