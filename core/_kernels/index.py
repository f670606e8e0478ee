"""IndexFile: insert keys, select a key's offsets, check a file, index a scan.

RocketMQ's key → CommitLog-offset hash index in its byte format (drawn in
``layout``). One writer (``index_put``, ``index_records``) and any number of
concurrent readers (``index_select``): the writer stores the entry, then its
slot, then the header, indexCount last; slots and indexCount are aligned
4-byte words, read and written whole.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import layout as L
from ..layout import (IX_BEGIN_PHY, IX_BEGIN_TS, IX_END_PHY, IX_END_TS,  # noqa: F401
                      IX_ENTRY_BYTES, IX_HEADER_BYTES, IX_INDEX_COUNT, IX_SLOT_BYTES,
                      IX_SLOT_COUNT, S_PHY, S_PROPS_LEN, S_PROPS_POS, S_STORE_TS, S_SYSFLAG,
                      S_TOPIC_LEN, S_TOPIC_POS)
from .binary import JIT, _java_hash_more, ld_i32, ld_i64, st_i32, st_i64
from .properties import find_property

IX_DONE = 0      # index_records: every row indexed
IX_FULL = 1      # the file is full: roll, then call again from (row, key)

IX_OK = 0        # index_check: consistent
IX_BAD_SLOT = 1  # a slot outside [0, indexCount) or naming an entry of another slot
IX_BAD_ENTRY = 2  # an entry that cannot have been written by index_put

_SPACE = 32
_HASH_SEP = 35   # '#' of RocketMQ's buildKey(topic, key)


# The slot table and indexCount are read and written as aligned 4-byte words
# (one load or store each, never torn), through a uint32 view of the same
# mapping; the bytes are big-endian, the host little-endian (x86-64).
@njit(inline="always", **JIT)
def _bswap32(v):
    return (((v & 0xFF) << 24) | (((v >> 8) & 0xFF) << 16)
            | (((v >> 16) & 0xFF) << 8) | ((v >> 24) & 0xFF))


@njit(inline="always", **JIT)
def _ld_word(w, p):
    v = _bswap32(np.int64(w[p >> 2]))
    return v - 4294967296 if v >= 2147483648 else v


@njit(inline="always", **JIT)
def _st_word(w, p, v):
    w[p >> 2] = np.uint32(_bswap32(v & 0xFFFFFFFF))


@njit(inline="always", **JIT)
def _index_key_hash(h):
    """IndexFile.indexKeyHashMethod of an unsigned 32-bit hashCode:
    Math.abs, with Integer.MIN_VALUE (whose abs is negative) as 0."""
    if h == 2147483648:
        return np.int64(0)
    return 4294967296 - h if h > 2147483648 else h


@njit(inline="always", **JIT)
def _index_put(idx, w, slot_num, index_num, key_hash, phy, store_ts):
    count = _ld_word(w, IX_INDEX_COUNT)
    if count <= 0:
        count = 1            # IndexHeader.load: an unwritten count is 1
    if count >= index_num:
        return False
    slot_pos = IX_HEADER_BYTES + (key_hash % slot_num) * IX_SLOT_BYTES
    prev = _ld_word(w, slot_pos)
    if prev <= 0 or prev > count:
        prev = 0
    begin_ts = ld_i64(idx, IX_BEGIN_TS)
    diff = store_ts - begin_ts
    diff = diff // 1000 if diff >= 0 else -((-diff) // 1000)   # Java's long division
    if begin_ts <= 0 or diff < 0:
        diff = 0
    elif diff > 2147483647:
        diff = 2147483647
    p = IX_HEADER_BYTES + slot_num * IX_SLOT_BYTES + count * IX_ENTRY_BYTES
    st_i32(idx, p, key_hash)
    st_i64(idx, p + 4, phy)
    st_i32(idx, p + 12, diff)
    st_i32(idx, p + 16, prev)
    _st_word(w, slot_pos, count)
    if count <= 1:
        st_i64(idx, IX_BEGIN_PHY, phy)
        st_i64(idx, IX_BEGIN_TS, store_ts)
    if prev == 0:
        _st_word(w, IX_SLOT_COUNT, _ld_word(w, IX_SLOT_COUNT) + 1)
    st_i64(idx, IX_END_PHY, phy)
    st_i64(idx, IX_END_TS, store_ts)
    _st_word(w, IX_INDEX_COUNT, count + 1)
    return True


@njit(**JIT)
def index_put(idx, slot_num, index_num, key_hash, phy, store_ts):
    """IndexFile.putKey: add entry (key_hash, phy, store_ts) to the mapped
    file ``idx``. False when the file is full. Writes the entry, then its
    slot, then the header, indexCount last: a reader that loads indexCount
    first and follows slots finds only complete entries."""
    return _index_put(idx, idx.view(np.uint32), slot_num, index_num, key_hash, phy, store_ts)


@njit(**JIT)
def index_select(idx, slot_num, index_num, key_hash, max_num, begin, end, out, n):
    """IndexFile.selectPhyOffset: append to out[n:] the phy offsets of the
    entries of ``key_hash`` stored between ``begin`` and ``end`` (ms), newest
    first, until ``max_num`` in all; returns the new n. Safe against a
    concurrent index_put: entries at or past the indexCount read first are
    followed (they are complete) but not reported."""
    w = idx.view(np.uint32)
    count = _ld_word(w, IX_INDEX_COUNT)
    if count <= 1:
        return n
    begin_ts = ld_i64(idx, IX_BEGIN_TS)
    cur = _ld_word(w, IX_HEADER_BYTES + (key_hash % slot_num) * IX_SLOT_BYTES)
    if cur <= 0 or cur >= index_num:
        return n
    base = IX_HEADER_BYTES + slot_num * IX_SLOT_BYTES
    while n < max_num:
        p = base + cur * IX_ENTRY_BYTES
        diff = ld_i32(idx, p + 12)
        if diff < 0:
            break
        t = begin_ts + diff * 1000
        if cur < count and ld_i32(idx, p) == key_hash and begin <= t <= end:
            out[n] = ld_i64(idx, p + 4)
            n += 1
        prev = ld_i32(idx, p + 16)
        # RocketMQ stops at prev <= 0, prev > indexCount or prev == cur; a
        # chain only ever points back, so prev >= cur is corrupt and stops too.
        if prev <= 0 or prev >= cur or t < begin:
            break
        cur = prev
    return n


@njit(**JIT)
def index_records(seg, rows, first, n, skip, idx, slot_num, index_num, uniq_key, keys_key):
    """IndexService.buildIndex for rows[first:n] of scan_records over ``seg``:
    unless a record is a ROLLBACK-type transaction record, index key
    ``topic#UNIQ_KEY`` (if present) and ``topic#k`` for each non-empty
    space-separated token k of KEYS, in that order, with the record's phy
    offset and store timestamp. The first ``skip`` keys of row ``first`` are
    already indexed. Returns (row, keys done in it, IX_DONE or IX_FULL)."""
    w = idx.view(np.uint32)
    for r in range(first, n):
        if (rows[r, S_SYSFLAG] & L.SYSFLAG_TRANSACTION_MASK) == L.SYSFLAG_TRANSACTION_ROLLBACK:
            continue
        tpos = rows[r, S_TOPIC_POS]
        prefix = _java_hash_more(np.int64(0), seg, tpos, tpos + rows[r, S_TOPIC_LEN])
        prefix = (31 * prefix + _HASH_SEP) & 0xFFFFFFFF
        phy = rows[r, S_PHY]
        ts = rows[r, S_STORE_TS]
        ppos = rows[r, S_PROPS_POS]
        plen = rows[r, S_PROPS_LEN]
        done = skip if r == first else 0
        j = 0
        vpos, vlen = find_property(seg, ppos, plen, uniq_key)
        if vpos >= 0:
            if j >= done:
                h = _index_key_hash(_java_hash_more(prefix, seg, vpos, vpos + vlen))
                if not _index_put(idx, w, slot_num, index_num, h, phy, ts):
                    return r, j, IX_FULL
            j += 1
        kpos, klen = find_property(seg, ppos, plen, keys_key)
        if kpos >= 0:
            i = kpos
            kend = kpos + klen
            while i < kend:
                t = i
                while t < kend and seg[t] != _SPACE:
                    t += 1
                if t > i:
                    if j >= done:
                        h = _index_key_hash(_java_hash_more(prefix, seg, i, t))
                        if not _index_put(idx, w, slot_num, index_num, h, phy, ts):
                            return r, j, IX_FULL
                    j += 1
                i = t + 1
    return n, 0, IX_DONE


@njit(**JIT)
def index_check(idx, slot_num, count):
    """Whether the slots and entries 1..count-1 of ``idx`` are what index_put
    leaves: every slot in [0, count) naming an entry of its own slot; every
    entry with keyHash >= 0, timeDiff >= 0, phy not below the entry before
    it, prevIndex < its own index and in the same slot. Returns (status,
    slots in use)."""
    w = idx.view(np.uint32)
    base = IX_HEADER_BYTES + slot_num * IX_SLOT_BYTES
    used = 0
    for s in range(slot_num):
        v = _ld_word(w, IX_HEADER_BYTES + s * IX_SLOT_BYTES)
        if v == 0:
            continue
        if v < 0 or v >= count or ld_i32(idx, base + v * IX_ENTRY_BYTES) % slot_num != s:
            return IX_BAD_SLOT, used
        used += 1
    last_phy = np.int64(-1)
    for i in range(1, count):
        p = base + i * IX_ENTRY_BYTES
        h = ld_i32(idx, p)
        phy = ld_i64(idx, p + 4)
        prev = ld_i32(idx, p + 16)
        if h < 0 or phy < last_phy or ld_i32(idx, p + 12) < 0 or prev < 0 or prev >= i:
            return IX_BAD_ENTRY, used
        if prev > 0 and ld_i32(idx, base + prev * IX_ENTRY_BYTES) % slot_num != h % slot_num:
            return IX_BAD_ENTRY, used
        last_phy = phy
    return IX_OK, used
