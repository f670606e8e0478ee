"""ConsumeQueue units: write them, scan a range, find where valid ones end.

A unit is 20 bytes (``layout``: phy offset, size, tags code, big-endian);
a padding unit has size ``CQ_PAD_SIZE``. ``cq_scan`` serves pulls,
``cq_valid_units`` and ``min_phy_from`` recovery and retention,
``queues_due`` a worker's parked pulls (the queues' published next offsets).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..layout import CQ_PAD_SIZE  # noqa: F401  (re-exported: K.CQ_PAD_SIZE)
from ..layout import (S_PHY, S_QUEUE_ID, S_QUEUE_OFFSET, S_SIZE, S_SYSFLAG, S_TAGS_CODE,
                      S_TOPIC_HASH, SYSFLAG_TRANSACTION_MASK, SYSFLAG_TRANSACTION_PREPARED,
                      SYSFLAG_TRANSACTION_ROLLBACK)
from .binary import JIT, ld_i32, ld_i64, st_i32, st_i64

CQ_DONE = 0      # scanned every unit asked for
CQ_FULL = 1      # stopped at a count or byte limit
CQ_BAD = 2       # a unit that is not a valid position (never below the published max)


@njit(**JIT)
def cq_put(cq, unit, phy, size, tags_code):
    p = unit * 20
    st_i64(cq, p, phy)
    st_i32(cq, p + 8, size)
    st_i64(cq, p + 12, tags_code)


@njit(**JIT)
def cq_put_many(cq, first_unit, phys, sizes, codes, start, count):
    for k in range(count):
        cq_put(cq, first_unit + k, phys[start + k], sizes[start + k], codes[start + k])


@njit(**JIT)
def cq_put_units(cq, first_unit, units, count):
    """Copy ``count`` units (20 bytes each, back to back in ``units``) into
    ``cq`` from ``first_unit`` on; returns how many differed there before
    (recovery counts the units it rebuilt)."""
    changed = 0
    for k in range(count):
        p = (first_unit + k) * 20
        s = k * 20
        same = True
        for j in range(20):
            if cq[p + j] != units[s + j]:
                same = False
                cq[p + j] = units[s + j]
        if not same:
            changed += 1
    return changed


@njit(**JIT)
def cq_group_rows(rows, units, order, qoffs, bounds, anomalies):
    """The ConsumeQueue units of scanned records (``rows``: scan_records'
    N_SCAN columns, in CommitLog order), queue by queue: prepared and
    rolled-back transaction records have none and are left out; the rest
    are grouped by (topic hash, queue id), groups in the order their first
    record comes, records in CommitLog order within each. Group g is
    [bounds[g], bounds[g + 1]) of ``order`` (each record's row), ``qoffs``
    (its queue offset) and ``units`` (its unit: 20 bytes each, back to
    back); ``anomalies[g]``: its queue offsets that do not follow the one
    before by 1. Returns the number of groups. Linear: the groups are found
    through an open-addressing table of twice the rows' count."""
    n = rows.shape[0]
    size = 16
    while size < 2 * n:
        size *= 2
    mask = size - 1
    slot_gid = np.full(size, -1, np.int64)
    group_hash = np.empty(n, np.int64)
    group_qid = np.empty(n, np.int64)
    gid = np.full(n, -1, np.int64)
    count = np.zeros(n + 1, np.int64)
    groups = 0
    for i in range(n):
        tx = rows[i, S_SYSFLAG] & SYSFLAG_TRANSACTION_MASK
        if tx == SYSFLAG_TRANSACTION_PREPARED or tx == SYSFLAG_TRANSACTION_ROLLBACK:
            continue
        th = rows[i, S_TOPIC_HASH]
        qid = rows[i, S_QUEUE_ID]
        h = (th ^ qid) & mask
        while True:
            g = slot_gid[h]
            if g < 0:
                g = groups
                groups += 1
                slot_gid[h] = g
                group_hash[g] = th
                group_qid[g] = qid
                break
            if group_hash[g] == th and group_qid[g] == qid:
                break
            h = (h + 1) & mask
        gid[i] = g
        count[g] += 1
    at = np.empty(groups + 1, np.int64)
    total = 0
    for g in range(groups):
        bounds[g] = total
        at[g] = total
        anomalies[g] = 0
        total += count[g]
    bounds[groups] = total
    for i in range(n):
        g = gid[i]
        if g < 0:
            continue
        k = at[g]
        at[g] = k + 1
        q = rows[i, S_QUEUE_OFFSET]
        if k > bounds[g] and q != qoffs[k - 1] + 1:
            anomalies[g] += 1
        order[k] = i
        qoffs[k] = q
        cq_put(units, k, rows[i, S_PHY], rows[i, S_SIZE], rows[i, S_TAGS_CODE])
    return groups


@njit(**JIT)
def cq_scan(cq, first_unit, count, codes, max_msgs, max_bytes, out_phy, out_size):
    """Collect units first_unit .. first_unit+count-1 of one ConsumeQueue file
    whose tags code is in the sorted array ``codes`` (empty = every message),
    stopping before ``max_msgs`` matches or ``max_bytes`` (the first match is
    always taken). Returns (found, scanned, status, their bytes) — the bytes
    let a pull tell its records lie back to back without reading them back."""
    found = 0
    total = np.int64(0)
    nc = codes.shape[0]
    for k in range(count):
        p = (first_unit + k) * 20
        phy = ld_i64(cq, p)
        size = ld_i32(cq, p + 8)
        if size == CQ_PAD_SIZE:
            continue
        if phy < 0 or size <= 0:
            return found, k, CQ_BAD, total
        if nc > 0:
            tag = ld_i64(cq, p + 12)
            lo = 0
            hi = nc
            while lo < hi:
                mid = (lo + hi) >> 1
                if codes[mid] < tag:
                    lo = mid + 1
                else:
                    hi = mid
            if lo == nc or codes[lo] != tag:
                continue
        if found >= max_msgs or (found > 0 and total + size > max_bytes):
            return found, k, CQ_FULL, total
        out_phy[found] = phy
        out_size[found] = size
        found += 1
        total += size
    return found, count, CQ_DONE, total


@njit(**JIT)
def cq_valid_units(cq, first_unit, max_units, cl_end):
    """Count the units from ``first_unit`` that are real positions ending at or
    before ``cl_end``: recovery keeps these and drops the rest. Padding units
    count as valid. Returns (count, phy end of the last real unit or -1)."""
    last_end = np.int64(-1)
    for k in range(max_units):
        p = (first_unit + k) * 20
        phy = ld_i64(cq, p)
        size = ld_i32(cq, p + 8)
        if size == CQ_PAD_SIZE:
            continue
        if phy < 0 or size <= 0 or phy > cl_end - size:   # not phy + size: it can overflow
            return k, last_end
        last_end = phy + size
    return max_units, last_end


@njit(**JIT)
def min_phy_from(cq, first_unit, max_units, cl_min):
    """First unit (relative to first_unit) pointing at or beyond ``cl_min``
    (retention: units before it point into deleted segments); max_units when
    none does."""
    for k in range(max_units):
        p = (first_unit + k) * 20
        size = ld_i32(cq, p + 8)
        if size == CQ_PAD_SIZE:
            continue
        if ld_i64(cq, p) >= cl_min:
            return k
    return max_units


@njit(**JIT)
def queues_due(words, word, lo, n, out):
    """The places (0..n) whose queue's next offset — ``words[word[at]]``, a
    store state word; 0 where ``word[at]`` is -1: no slot yet — passed the
    lowest offset a pull waits at there (``lo[at]``), into ``out``; how
    many (broker/parking.py ``_Watched.due``: one wake-up, every parked
    queue)."""
    k = 0
    for at in range(n):
        w = word[at]
        nxt = words[w] if w >= 0 else 0
        if nxt > lo[at]:
            out[k] = at
            k += 1
    return k
