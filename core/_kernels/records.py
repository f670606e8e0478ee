"""Stored records: scan and validate a CommitLog segment.

``scan_records`` is the one parser of stored records: recovery, the scrub,
the inspector, the index builder and the readers all take its rows (the scan
vocabulary, ``SCAN_*`` statuses and ``S_*`` columns, is in ``layout``). It
never reads past ``end`` or the record's own TOTALSIZE, so a torn or hostile
segment stops the scan with SCAN_CORRUPT instead of a wild read.
``last_nonzero`` tells recovery what lies past the end of the data.
``uniq_hashes`` reads the duplicate-send window's keys back (``dedup``).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import layout as L
from ..layout import (MESSAGE_MAGIC_V2_I32, N_SCAN, S_BODY_LEN, S_BODY_POS, S_PHY,  # noqa: F401
                      S_PROPS_LEN, S_PROPS_POS, S_QUEUE_ID, S_QUEUE_OFFSET, S_SIZE, S_STORE_TS,
                      S_SYSFLAG, S_TAGS_CODE, S_TOPIC_HASH, S_TOPIC_LEN, S_TOPIC_POS,
                      SCAN_BLANK, SCAN_CORRUPT, SCAN_END, SCAN_FOREIGN, SCAN_FULL)
from .binary import JIT, crc32, java_hash_utf8, ld_i16, ld_i32, ld_i64
from .properties import _is_key, _piece, find_property


@njit(**JIT)
def scan_records(buf, start, end, phy_base, check_crc, t, tags_key, out):
    """Validate records of one segment ``buf`` from ``start`` up to ``end``
    (both positions in ``buf``; ``phy_base`` is the segment's CommitLog offset)
    and describe each in a row of ``out``. Returns (n, pos, status): ``pos`` is
    where scanning stopped (the end of valid data unless status is SCAN_FULL).

    A record is valid when: TOTALSIZE fits before ``end``; MAGIC is the 4.x
    message magic; the field lengths add up to TOTALSIZE; the topic is 1..127
    bytes; PHYSICALOFFSET equals its own position; and (if check_crc) BODYCRC
    matches. A blank record is valid only if it runs exactly to the segment end.
    A PAD record (``layout``: a claimed range never finished) that is whole is
    skipped without a row, like a record no reader wants; one that is not is
    corrupt. (Recovery finds the pads it needs in the gaps between rows.)
    """
    n, pos, status = _scan_headers(buf, start, end, phy_base, tags_key, out)
    if check_crc:
        # Bodies are checked in a loop of their own: inside the header loop
        # the CRC ran 7x slower (its table lookups did not optimise there).
        bad = _first_bad_crc(buf, out, n, phy_base, t)
        if bad < n:
            return bad, out[bad, S_PHY] - phy_base, SCAN_CORRUPT
    return n, pos, status


@njit(**JIT)
def _first_bad_crc(buf, out, n, phy_base, t):
    for i in range(n):
        p = out[i, S_BODY_POS]
        stored = ld_i32(buf, out[i, S_PHY] - phy_base + 8)
        if (crc32(buf, p, p + out[i, S_BODY_LEN], t) & 0x7FFFFFFF) != stored:
            return i
    return n


@njit(inline="always", **JIT)
def _pad_ok(buf, pos, size, end, phy_base):
    """Is the PAD record (``layout``) at ``pos`` whole: it fits before ``end``,
    names its own position, a topic of 1..127 bytes and no negative count?"""
    if size < L.PAD_FIXED_BYTES + 1 or pos + size > end:
        return False
    tlen = np.int64(buf[pos + L.PAD_OFF_TOPIC])
    return (ld_i64(buf, pos + L.PAD_OFF_PHYSICALOFFSET) == phy_base + pos
            and 1 <= tlen <= L.TOPIC_BYTES_MAX and size >= L.PAD_FIXED_BYTES + tlen
            and ld_i32(buf, pos + L.PAD_OFF_UNITS) >= 0)


@njit(**JIT)
def _scan_headers(buf, start, end, phy_base, tags_key, out):
    """scan_records without the body CRCs."""
    seg_bytes = buf.shape[0]
    cap = out.shape[0]
    n = 0
    pos = np.int64(start)
    while True:
        if pos + 8 > end:
            return n, pos, SCAN_END
        size = ld_i32(buf, pos)
        if size == 0:
            return n, pos, SCAN_END
        magic = ld_i32(buf, pos + 4)
        if magic == L.BLANK_MAGIC_I32:
            if pos + size == seg_bytes:
                return n, pos, SCAN_BLANK
            return n, pos, SCAN_CORRUPT
        if magic == L.PAD_MAGIC_I32:   # a claimed range never finished: no record, skip it
            if not _pad_ok(buf, pos, size, end, phy_base):
                return n, pos, SCAN_CORRUPT
            pos += size
            continue
        if magic == MESSAGE_MAGIC_V2_I32:
            return n, pos, SCAN_FOREIGN
        if magic != L.MESSAGE_MAGIC_I32:
            return n, pos, SCAN_CORRUPT
        if size < L.RECORD_FIXED_BYTES + 1 or pos + size > end:
            return n, pos, SCAN_CORRUPT
        if n == cap:
            return n, pos, SCAN_FULL
        sysflag = ld_i32(buf, pos + L.OFF_SYSFLAG)
        bh = 20 if sysflag & L.SYSFLAG_BORNHOST_V6 else 8
        sh = 20 if sysflag & L.SYSFLAG_STOREHOST_V6 else 8
        if size < L.RECORD_FIXED_BYTES + (bh - 8) + (sh - 8) + 1:
            return n, pos, SCAN_CORRUPT   # IPv6 hosts would not fit: read nothing past it
        q = pos + 48 + bh
        store_ts = ld_i64(buf, q)
        q += 8 + sh + 12
        blen = ld_i32(buf, q)
        if blen < 0 or q + 4 + blen + 3 > pos + size:
            return n, pos, SCAN_CORRUPT
        body_pos = q + 4
        q = body_pos + blen
        tlen = np.int64(buf[q])
        if tlen < 1 or tlen > L.TOPIC_BYTES_MAX or q + 1 + tlen + 2 > pos + size:
            return n, pos, SCAN_CORRUPT
        topic_pos = q + 1
        q = topic_pos + tlen
        plen = ld_i16(buf, q)
        props_pos = q + 2
        if plen < 0 or props_pos + plen != pos + size:
            return n, pos, SCAN_CORRUPT
        if ld_i64(buf, pos + L.OFF_PHYSICALOFFSET) != phy_base + pos:
            return n, pos, SCAN_CORRUPT
        th = np.int64(-3750763034362895579)  # FNV-1a 64 offset basis
        for k in range(tlen):
            th = (th ^ np.int64(buf[topic_pos + k])) * np.int64(1099511628211)
        tags = 0
        if tags_key.shape[0]:           # readers pass no key: they need no tags code
            vpos, vlen = find_property(buf, props_pos, plen, tags_key)
            tags = java_hash_utf8(buf, vpos, vlen) if vpos >= 0 and vlen > 0 else 0
        out[n, S_PHY] = phy_base + pos
        out[n, S_SIZE] = size
        out[n, S_QUEUE_ID] = ld_i32(buf, pos + L.OFF_QUEUEID)
        out[n, S_QUEUE_OFFSET] = ld_i64(buf, pos + L.OFF_QUEUEOFFSET)
        out[n, S_SYSFLAG] = sysflag
        out[n, S_TAGS_CODE] = tags
        out[n, S_TOPIC_POS] = topic_pos
        out[n, S_TOPIC_LEN] = tlen
        out[n, S_TOPIC_HASH] = th
        out[n, S_STORE_TS] = store_ts
        out[n, S_PROPS_POS] = props_pos
        out[n, S_PROPS_LEN] = plen
        out[n, S_BODY_POS] = body_pos
        out[n, S_BODY_LEN] = blen
        n += 1
        pos += size


@njit(**JIT)
def last_nonzero(buf, start):
    """Index of the last nonzero byte of buf[start:], or -1 (recovery: what
    lies past the end of the data). Reads 8-byte words where it can."""
    i = buf.shape[0] - 1
    while i >= start and (i + 1) % 8 != 0:      # trailing bytes
        if buf[i] != 0:
            return i
        i -= 1
    wlo = (start + 7) // 8
    whi = (i + 1) // 8
    if i >= start and whi > wlo:                # whole words [wlo*8, whi*8)
        words = buf[wlo * 8:whi * 8].view(np.uint64)
        w = whi - wlo - 1
        while w >= 0 and words[w] == 0:
            w -= 1
        if w >= 0:
            base = (wlo + w) * 8
            for k in range(7, -1, -1):
                if buf[base + k] != 0:
                    return base + k
        i = wlo * 8 - 1
    while i >= start:                           # leading bytes
        if buf[i] != 0:
            return i
        i -= 1
    return -1


@njit(**JIT)
def uniq_hashes(buf, phy_base, phys, sizes, count, t, uniq_key, out):
    """The duplicate-send window's hash (``dedup.hash_of``: the CRC-32 of the
    UNIQ_KEY value, 1 for 0) of the record each ConsumeQueue unit (phys[i],
    sizes[i]), i < count, points at in segment ``buf``, into out[i]; 0 where
    the unit is not one whole valid message record of its size there (as
    ``records_at`` decides), the record is a consumer's retry
    (RECONSUMETIMES != 0), or its first piece named UNIQ_KEY has an empty
    value or there is none (the key the append's lookup reads,
    ``dedup.key_of``). Returns how many are nonzero."""
    seg = buf.shape[0]
    row = np.empty((1, N_SCAN), dtype=np.int64)
    no_tags = uniq_key[:0]
    found = 0
    for i in range(count):
        out[i] = 0
        phy = phys[i]
        size = sizes[i]
        # (no sum that can wrap: see records_at)
        if phy < phy_base or size <= 0 or size > seg - (phy - phy_base):
            continue
        pos = phy - phy_base
        n, _, _ = _scan_headers(buf, pos, pos + size, phy_base, no_tags, row)
        if n != 1 or row[0, S_SIZE] != size:
            continue
        sysflag = row[0, S_SYSFLAG]
        reconsume = (pos + L.OFF_BORNHOST + (20 if sysflag & L.SYSFLAG_BORNHOST_V6 else 8) + 8
                     + (20 if sysflag & L.SYSFLAG_STOREHOST_V6 else 8))
        if ld_i32(buf, reconsume) != 0:
            continue
        j = row[0, S_PROPS_POS]
        end = j + row[0, S_PROPS_LEN]
        while j < end:
            sep, e = _piece(buf, j, end)
            if _is_key(buf, j, sep, uniq_key):
                if e > sep + 1:
                    h = crc32(buf, sep + 1, e, t)
                    out[i] = h if h != 0 else 1
                    found += 1
                break
            j = e + 1
    return found
