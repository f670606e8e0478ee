"""Timer log and in-memory timing wheel for arbitrary-delay messages.

Owns ``<root>/timerlog/`` (an append-only log of timer entries) and the
in-memory index slot → entries rebuilt from it. Never reads the ConsumeQueue
or the CommitLog, never delivers, never stores the fire cursor: the caller
owns those. Time is slot numbers only (ints the caller computes as
``ceil(deliver_ms / precision_ms)``). One process writes the log.

Invariant: the log is a prefix of valid entries. Entries are appended in
cq_offset order and each batch's check words are stored after its other
fields, so a kill -9 at any instant leaves valid entries followed by entries
that fail their check; ``open`` keeps the valid prefix and zeroes the rest.
A slot's entries in log order are its delivery order, so the caller's cursor
``(fire_slot, fired_in_slot)`` names the same entries before and after a
restart.

Files: ``timerlog/<20-digit index of the file's first entry>``, each
``file_entries`` × 32 bytes, created sparse and written through a shared
mapping; pages get their blocks (fallocate) before entries are stored there,
up to ALLOCATE_AHEAD_MAX bytes ahead, since a store into a page with no
block on a full disk is a SIGBUS where fallocate says ENOSPC (``add``
raises it; what got in is ``next_cq_offset``). Entry n lives in file
``n - n % file_entries`` at byte ``(n % file_entries) * 32``. Entry,
big-endian, numpy dtype ``ENTRY_DTYPE``::

    off size field
      0   8  cq_offset   int64  unit index in rmq_sys_wheel_timer queue 0
      8   8  phy_offset  int64  CommitLog offset of the timer message
     16   4  size        int32  its record size
     20   4  check       int32  check_words() of the other four fields; an
                                all-zero (never written) entry fails it
     24   8  slot        int64  effective slot: max(requested, fire slot at add)

``release`` deletes a file once every entry in it has fired, so the log may
have gaps. The file holding the last entry is never deleted: it is where
``next_cq_offset`` comes from.

In memory (``_SlotIndex``): a node pool (next, phy, size) holding one linked
list per slot in log order, an open-addressing hash table slot → (head, tail,
count), and a binary min-heap of the slots, all numpy arrays driven by the
numba kernels below: O(1) per inserted entry (plus O(log slots) when it
opens a slot), O(k) read of a slot's k entries, O(log slots) to drop the
earliest slot, O(1) to find it. Memory follows the peak number of
pending entries (the arrays grow, never shrink).
"""
from __future__ import annotations

import heapq
import os

import numba
import numpy as np

from .files import REAL_FILES, FileLayer, Handle

ENTRY_DTYPE = np.dtype([("cq_offset", ">i8"), ("phy_offset", ">i8"), ("size", ">i4"),
                        ("check", ">i4"), ("slot", ">i8")])
ENTRY_BYTES = 32
ALLOCATE_AHEAD_MAX = 1 << 20       # 32,768 entries given blocks at a time at most
assert ENTRY_DTYPE.itemsize == ENTRY_BYTES

_CHECK_SEED = np.uint64(0x54494D45524C4F47)   # b"TIMERLOG"
_CHECK_MULT = np.uint64(0x9E3779B97F4A7C15)
_SHIFT_32 = np.uint64(32)


def check_words(cq_offsets, phys, sizes, slots) -> np.ndarray:
    """The int32 check word of each entry, in uint64 arithmetic mod 2**64:
    ``h = SEED; for f in (cq_offset, phy_offset, size, slot): h = (h ^ f) *
    MULT; h ^= h >> 32``, then the low 32 bits. The seed keeps an all-zero
    entry from passing."""
    h = np.full(len(cq_offsets), _CHECK_SEED, dtype=np.uint64)
    for field in (cq_offsets, phys, sizes, slots):
        h ^= np.asarray(field).astype(np.int64).view(np.uint64)
        h *= _CHECK_MULT
        h ^= h >> _SHIFT_32
    return h.astype(np.uint32).view(np.int32)


assert check_words([0], [0], [0], [0])[0] != 0


def _file_name(first_entry: int) -> str:
    return f"{first_entry:020d}"


# ------------------------------------------------------------- numba kernels
# Arrays: pool[node] = (next, phy, size), a free list threaded through
# ``next``; table[bucket] = (slot, head node, tail node, count), linear
# probing, slot == EMPTY marks a free bucket; heap[:meta[SLOTS]] = the slots
# present in the table, a binary min-heap; meta = the counters below.
EMPTY = np.iinfo(np.int64).min
NIL = -1
NEXT, PHY, SIZE = 0, 1, 2
KEY, HEAD, TAIL, COUNT = 0, 1, 2, 3
SLOTS, FREE, FREE_COUNT, PENDING = 0, 1, 2, 3


@numba.njit(cache=True)
def _home(key, mask):
    """Bucket where ``key``'s probe starts. Stays below 2**63: no overflow."""
    h = key ^ (key >> 29)
    return (((h & 0x7FFFFFFF) * 0x9E3779B1) >> 16) & mask


@numba.njit(cache=True)
def _find(key, table):
    """Bucket holding ``key``, or -1."""
    mask = len(table) - 1
    b = _home(key, mask)
    while table[b, KEY] != key:
        if table[b, KEY] == EMPTY:
            return -1
        b = (b + 1) & mask
    return b


@numba.njit(cache=True)
def _heap_push(heap, size, key):
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= key:
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = key


@numba.njit(cache=True)
def _heap_pop(heap, size):
    """Remove heap[0]; ``size`` is the size after removal."""
    key = heap[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] >= key:
            break
        heap[i] = heap[child]
        i = child
    heap[i] = key


@numba.njit(cache=True)
def _delete_bucket(hole, table):
    """Empty bucket ``hole`` and shift later members of its probe run back
    (linear-probing deletion without tombstones)."""
    mask = len(table) - 1
    j = hole
    while True:
        j = (j + 1) & mask
        key = table[j, KEY]
        if key == EMPTY:
            break
        if ((j - _home(key, mask)) & mask) >= ((j - hole) & mask):
            for c in range(4):
                table[hole, c] = table[j, c]
            hole = j
    table[hole, KEY] = EMPTY


@numba.njit(cache=True)
def _insert(phys, sizes, slots, pool, table, heap, meta):
    """Append entry i to the list of slots[i], in order, until a new slot
    would fill the table past half; returns the number inserted. The caller
    has made room in the pool (meta[FREE_COUNT] >= n); len(heap) is
    len(table) // 2."""
    mask = len(table) - 1
    for i in range(len(slots)):
        key = slots[i]
        b = _home(key, mask)
        while table[b, KEY] != key and table[b, KEY] != EMPTY:
            b = (b + 1) & mask
        if table[b, KEY] == EMPTY and 2 * (meta[SLOTS] + 1) > len(table):
            return i
        node = meta[FREE]
        meta[FREE] = pool[node, NEXT]
        meta[FREE_COUNT] -= 1
        meta[PENDING] += 1
        pool[node, NEXT] = NIL
        pool[node, PHY] = phys[i]
        pool[node, SIZE] = sizes[i]
        if table[b, KEY] == EMPTY:
            table[b, KEY] = key
            table[b, HEAD] = node
            table[b, COUNT] = 0
            _heap_push(heap, meta[SLOTS], key)
            meta[SLOTS] += 1
        else:
            pool[table[b, TAIL], NEXT] = node
        table[b, TAIL] = node
        table[b, COUNT] += 1
    return len(slots)


@numba.njit(cache=True)
def _read_list(node, pool, out_phys, out_sizes):
    for i in range(len(out_phys)):
        out_phys[i] = pool[node, PHY]
        out_sizes[i] = pool[node, SIZE]
        node = pool[node, NEXT]


@numba.njit(cache=True)
def _release(below, pool, table, heap, meta):
    """Drop every slot < ``below``; their nodes go back to the free list
    (O(1) per slot: the whole list is spliced). Returns entries dropped."""
    dropped = 0
    while meta[SLOTS] > 0 and heap[0] < below:
        key = heap[0]
        meta[SLOTS] -= 1
        _heap_pop(heap, meta[SLOTS])
        b = _find(key, table)
        pool[table[b, TAIL], NEXT] = meta[FREE]
        meta[FREE] = table[b, HEAD]
        meta[FREE_COUNT] += table[b, COUNT]
        dropped += table[b, COUNT]
        _delete_bucket(b, table)
    meta[PENDING] -= dropped
    return dropped


@numba.njit(cache=True)
def _rehash(old, table):
    mask = len(table) - 1
    for i in range(len(old)):
        key = old[i, KEY]
        if key != EMPTY:
            b = _home(key, mask)
            while table[b, KEY] != EMPTY:
                b = (b + 1) & mask
            for c in range(4):
                table[b, c] = old[i, c]


class _SlotIndex:
    """Slot → entries (phy, size) in insertion order, over the kernels."""

    def __init__(self, nodes: int = 1024, buckets: int = 1024):
        assert buckets >= 2 and buckets & (buckets - 1) == 0, buckets
        self.pool = np.empty((0, 3), dtype=np.int64)
        self.table = np.full((buckets, 4), EMPTY, dtype=np.int64)
        self.heap = np.empty(buckets // 2, dtype=np.int64)
        self.meta = np.array([0, NIL, 0, 0], dtype=np.int64)
        self._grow_pool(nodes)

    @property
    def pending(self) -> int:
        return int(self.meta[PENDING])

    def insert(self, phys: np.ndarray, sizes: np.ndarray, slots: np.ndarray) -> None:
        if self.meta[FREE_COUNT] < len(slots):
            self._grow_pool(max(len(self.pool), len(slots)))
        done = _insert(phys, sizes, slots, self.pool, self.table, self.heap, self.meta)
        while done < len(slots):
            self._grow_table()
            done += _insert(phys[done:], sizes[done:], slots[done:],
                            self.pool, self.table, self.heap, self.meta)

    def entries(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        b = _find(slot, self.table)
        count = 0 if b < 0 else int(self.table[b, COUNT])
        phys = np.empty(count, dtype=np.int64)
        sizes = np.empty(count, dtype=np.int64)
        if count:
            _read_list(self.table[b, HEAD], self.pool, phys, sizes)
        return phys, sizes

    def first_slot(self) -> int | None:
        return int(self.heap[0]) if self.meta[SLOTS] else None

    def release(self, below: int) -> int:
        return int(_release(below, self.pool, self.table, self.heap, self.meta))

    def _grow_table(self) -> None:
        old = self.table
        self.table = np.full((2 * len(old), 4), EMPTY, dtype=np.int64)
        _rehash(old, self.table)
        heap = np.empty(len(old), dtype=np.int64)
        heap[:len(self.heap)] = self.heap
        self.heap = heap

    def _grow_pool(self, extra: int) -> None:
        old = len(self.pool)
        pool = np.empty((old + extra, 3), dtype=np.int64)
        pool[:old] = self.pool
        pool[old:, NEXT] = np.arange(old + 1, old + extra + 1)
        pool[-1, NEXT] = self.meta[FREE]
        self.pool = pool
        self.meta[FREE] = old
        self.meta[FREE_COUNT] += extra


def warm_up() -> None:
    """Run every kernel once (loads them from the numba cache, or compiles)."""
    index = _SlotIndex(nodes=1, buckets=2)
    one = np.ones(3, dtype=np.int64)
    index.insert(one, one, np.arange(3, dtype=np.int64))
    index.entries(1)
    index.release(3)


# ------------------------------------------------------------------ the log
class TimerWheel:
    """The timer log plus its in-memory index. ``open`` once, then ``add``,
    ``slot_entries``, ``next_due_slot``, ``release``; ``close``.

    The caller's loop, with its persisted cursor (F, fired): deliver entries
    of ``slot_entries(F)`` and persist (F, fired) with each batch; before
    moving past F, read ``slot_entries(F)`` again (``add`` with fire_slot F
    appends late entries to it); persist the new cursor, then ``release`` it.

    ``slot_entries(s)`` lists the entries of ``s`` this process loaded or
    added. After ``open(F, k)`` the first k entries of F are not loaded, so
    the i-th entry of ``slot_entries(F)`` is entry ``k + i`` of F for the rest
    of this process's life; every other slot starts at entry 0."""

    def __init__(self, root: str, file_entries: int = 1 << 20,
                 files: FileLayer = REAL_FILES):
        assert file_entries > 0
        self.dir = os.path.join(root, "timerlog")
        self.file_entries = file_entries
        self.file_bytes = file_entries * ENTRY_BYTES
        self.files = files
        self.recovery: dict[str, int] = {}   # what ``open`` found, for the log
        self._index: _SlotIndex | None = None
        self._end = 0                         # log index of the next entry
        self._last_cq: int | None = None      # cq_offset of the last logged entry
        self._released_below = EMPTY          # slots below this are forgotten
        self._closed_files: list[tuple[int, int]] = []   # heap of (max slot, first entry)
        self._current: Handle | None = None   # mapped file holding the last entry
        self._current_first = 0
        self._current_max_slot = EMPTY
        self._rows: np.ndarray | None = None  # ENTRY_DTYPE view of _current

    # ------------------------------------------------------------- recovery
    def open(self, fire_slot: int, fired_in_slot: int) -> None:
        """Find the valid prefix of the log, discard the rest, and load every
        entry with slot > fire_slot, plus those of fire_slot after the first
        ``fired_in_slot`` of them (log order)."""
        assert self._index is None, "open() twice"
        self.files.makedirs(self.dir)
        firsts = self._list_files()
        torn = files_discarded = 0
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        file_max: dict[int, int] = {}
        for pos, first in enumerate(firsts):
            h = self.files.open(self._path(first))
            if h.size != self.file_bytes:
                self.files.close(h)
                raise ValueError(f"{h.path}: {h.size} bytes, expected {self.file_bytes}"
                                 " (file_entries changed?)")
            rows = self.files.map(h).view(ENTRY_DTYPE)
            cq = rows["cq_offset"].astype(np.int64)
            phys = rows["phy_offset"].astype(np.int64)
            sizes = rows["size"].astype(np.int64)
            slots = rows["slot"].astype(np.int64)
            bad = np.flatnonzero(check_words(cq, phys, sizes, slots) != rows["check"])
            valid = int(bad[0]) if len(bad) else self.file_entries
            if valid < self.file_entries:
                torn = self._zero_tail(rows, valid)
            del rows
            self.files.close(h)
            self._end = first + valid
            if valid:
                self._last_cq = int(cq[valid - 1])
                slots = slots[:valid]
                file_max[first] = int(slots.max())
                keep = slots >= fire_slot
                parts.append((phys[:valid][keep], sizes[:valid][keep], slots[keep]))
            else:
                self.files.unlink(self._path(first))   # created, never written
            if valid < self.file_entries:
                for later in firsts[pos + 1:]:
                    self.files.unlink(self._path(later))
                    files_discarded += 1
                break
        self._load_index(parts, fire_slot, fired_in_slot)
        current = self._end - 1 - (self._end - 1) % self.file_entries
        if self._end and current in file_max:
            self._map_current(current, file_max.pop(current))
        self._closed_files = [(m, f) for f, m in file_max.items()]
        heapq.heapify(self._closed_files)
        self._released_below = fire_slot
        self.recovery = {"files": len(file_max) + (self._current is not None),
                         "entries_end": self._end, "pending": self.pending,
                         "torn_entries": torn, "files_discarded": files_discarded}

    def _zero_tail(self, rows: np.ndarray, valid: int) -> int:
        """Zero the written entries after the valid prefix (leaving the sparse
        remainder untouched); returns how many entries were not all zero."""
        words = rows[valid:].view(np.uint64).reshape(-1, ENTRY_BYTES // 8)
        written = np.flatnonzero(words.any(axis=1))
        if len(written):
            words[:written[-1] + 1] = 0
        return len(written)

    def _load_index(self, parts, fire_slot: int, fired_in_slot: int) -> None:
        if parts:
            phys, sizes, slots = (np.concatenate(c) for c in zip(*parts))
        else:
            phys = sizes = slots = np.zeros(0, dtype=np.int64)
        at_fire = np.flatnonzero(slots == fire_slot)
        if fired_in_slot > len(at_fire):
            raise ValueError(f"fired_in_slot {fired_in_slot} > {len(at_fire)} entries "
                             f"logged for slot {fire_slot}")
        keep = slots > fire_slot
        keep[at_fire[fired_in_slot:]] = True
        self._index = _SlotIndex(nodes=max(int(keep.sum()), 1024))
        self._index.insert(phys[keep], sizes[keep], slots[keep])

    # ---------------------------------------------------------------- state
    @property
    def next_cq_offset(self) -> int:
        """cq_offset of the last logged entry + 1, or -1 if the log is empty."""
        assert self._index is not None
        return -1 if self._last_cq is None else self._last_cq + 1

    @property
    def pending(self) -> int:
        """Entries in memory: loaded or added, not yet released."""
        return self._index.pending if self._index is not None else 0

    def next_due_slot(self) -> int | None:
        """The smallest slot holding entries, or None."""
        return self._index.first_slot()

    def slot_entries(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        """(phy offsets, sizes) of the entries of ``slot``, in log order (see the
        class docstring for the fire slot after ``open``)."""
        return self._index.entries(slot)

    # --------------------------------------------------------------- writes
    def add(self, cq_offsets: np.ndarray, phys: np.ndarray, sizes: np.ndarray,
            slots: np.ndarray, fire_slot: int) -> None:
        """Log the entries, then index them under max(slot, fire_slot): a late
        entry goes to the end of the fire slot's list. Done file by file: if it
        raises (e.g. no space for a new file), ``next_cq_offset`` tells what got in."""
        n = len(cq_offsets)
        assert len(phys) == len(sizes) == len(slots) == n
        if n == 0:
            return
        assert fire_slot >= self._released_below, (fire_slot, self._released_below)
        cq_offsets = np.asarray(cq_offsets, dtype=np.int64)
        assert (self._last_cq is None or cq_offsets[0] > self._last_cq) \
            and bool(np.all(cq_offsets[1:] > cq_offsets[:-1])), "cq_offsets must increase"
        phys = np.array(phys, dtype=np.int64)   # a writable contiguous copy: the kernels' type
        sizes32 = np.asarray(sizes).astype(np.int32)
        assert np.array_equal(sizes32, sizes), "size out of int32 range"
        eff = np.maximum(np.asarray(slots, dtype=np.int64), fire_slot)
        checks = check_words(cq_offsets, phys, sizes32, eff)
        done = 0
        while done < n:
            if self._current is None or self._end == self._current_first + self.file_entries:
                self._roll()
            at = self._end - self._current_first
            m = min(n - done, self.file_entries - at)
            # blocks before stores through the mapping (the module doc)
            self.files.allocate_ahead(self._current, (at + m) * ENTRY_BYTES, self.file_bytes,
                                      ALLOCATE_AHEAD_MAX)
            rows = self._rows[at:at + m]
            part = slice(done, done + m)
            rows["cq_offset"] = cq_offsets[part]
            rows["phy_offset"] = phys[part]
            rows["size"] = sizes32[part]
            rows["slot"] = eff[part]
            rows["check"] = checks[part]   # last: makes the entries valid
            self._current_max_slot = max(self._current_max_slot, int(eff[part].max()))
            self._end += m
            self._last_cq = int(cq_offsets[done + m - 1])
            self._index.insert(phys[part], sizes32[part].astype(np.int64), eff[part])
            done += m

    def release(self, fire_slot: int) -> int:
        """Forget the entries of slots < fire_slot and delete the log files
        whose entries all have slot < fire_slot (never the file holding the
        last entry). Call it only once a cursor >= fire_slot is persisted.
        Returns the number of files deleted."""
        self._index.release(fire_slot)
        self._released_below = max(self._released_below, fire_slot)
        # the last entry's file, closed when a roll made the next one but the
        # disk had no room for its first entry: kept (``next_cq_offset``)
        last = self._end - 1 - (self._end - 1) % self.file_entries if self._end > 0 else -1
        deleted, kept = 0, []
        while self._closed_files and self._closed_files[0][0] < fire_slot:
            entry = heapq.heappop(self._closed_files)
            if entry[1] == last:
                kept.append(entry)
                continue
            self.files.unlink(self._path(entry[1]))
            deleted += 1
        for entry in kept:
            heapq.heappush(self._closed_files, entry)
        return deleted

    def flush(self) -> None:
        """Make the entries written so far durable (msync of the current file;
        earlier files were synced when the log rolled past them)."""
        if self._current is not None:
            self.files.sync(self._current)

    def close(self) -> None:
        self.flush()
        self._unmap_current()
        self._index = None

    # ---------------------------------------------------------------- files
    def _path(self, first: int) -> str:
        return os.path.join(self.dir, _file_name(first))

    def _list_files(self) -> list[int]:
        firsts = []
        for name in self.files.listdir(self.dir):
            if name.endswith(".tmp"):   # a creation cut short (FileLayer.create_preallocated)
                self.files.unlink(os.path.join(self.dir, name))
            elif len(name) == 20 and name.isdigit():
                if int(name) % self.file_entries:
                    raise ValueError(f"{name}: not a multiple of file_entries "
                                     f"{self.file_entries} (file_entries changed?)")
                firsts.append(int(name))
        return sorted(firsts)

    def _roll(self) -> None:
        if self._current is not None:
            self.files.sync(self._current)
            heapq.heappush(self._closed_files, (self._current_max_slot, self._current_first))
            self._unmap_current()
        assert self._end % self.file_entries == 0, self._end
        # it exists when a roll before this one made it and then failed (its
        # directory sync, its mapping: the disk): never written, it is taken
        self.files.create_preallocated(self._path(self._end), self.file_bytes, sparse=True)
        self.files.fsync_dir(self.dir)
        self._map_current(self._end, EMPTY)

    def _map_current(self, first: int, max_slot: int) -> None:
        self._current = self.files.open(self._path(first))
        self._rows = self.files.map(self._current).view(ENTRY_DTYPE)
        self._current_first = first
        self._current_max_slot = max_slot

    def _unmap_current(self) -> None:
        if self._current is not None:
            self._rows = None
            self.files.close(self._current)
            self._current = None
