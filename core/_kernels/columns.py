"""Columns: records turned into Arrow-shaped arrays for readers outside the broker.

Readers (spark/, tools/inspect) decode records into fixed-width arrays
plus (int32 offsets, bytes) pairs, with no Python object per message.
Positions come from the same header parser as recovery (``_scan_headers``),
so a reader never accepts a record that recovery would not.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import layout as L
from ..layout import (N_PULL, P_BODY_LEN, P_BODY_POS, P_QUEUE_OFFSET, P_SIZE,  # noqa: F401
                      P_START, P_STATUS, P_SYSFLAG, P_TOPIC_AT, PULL_CRC, PULL_FIELDS, PULL_OK)
from ..layout import (S_BODY_LEN, S_BODY_POS, S_PHY, S_PROPS_LEN, S_PROPS_POS,  # noqa: F401
                      S_QUEUE_ID, S_QUEUE_OFFSET, S_SIZE, S_STORE_TS, S_SYSFLAG, S_TOPIC_LEN,
                      S_TOPIC_POS)
from .binary import JIT, copy_bytes, crc32, ld_i32, ld_i64
from .properties import _is_key, _piece
from .records import _scan_headers


@njit(**JIT)
def records_at(buf, phy_base, phys, sizes, start, count, tags_key, out):
    """Describe, in rows of ``out`` as ``scan_records`` does, the records that
    ConsumeQueue units phys/sizes[start:start+count] point at, all inside
    segment ``buf``. Returns how many lead valid (a record is valid when the
    header parser accepts exactly one record of the unit's size there)."""
    seg = buf.shape[0]
    for i in range(count):
        phy = phys[start + i]
        size = sizes[start + i]
        # Compared without a sum that can wrap (phy_base >= 0): a torn unit's
        # phy near 2**63 made pos + size wrap negative, pass the bounds check
        # and the scan read far outside buf (found by the naive twin's
        # adversarial units: it crashed the reader)
        if phy < phy_base or size <= 0 or size > seg - (phy - phy_base):
            return i
        pos = phy - phy_base
        n, _, _ = _scan_headers(buf, pos, pos + size, phy_base, tags_key, out[i:i + 1])
        if n != 1 or out[i, S_SIZE] != size:
            return i
    return count


@njit(inline="always", **JIT)
def _put_dec(out, o, v):
    """Decimal text of v >= 0 at out[o:]; returns the new end."""
    k = 1
    t = v // 10
    while t > 0:
        k += 1
        t //= 10
    for j in range(k):
        out[o + k - 1 - j] = 48 + v % 10
        v //= 10
    return o + k


@njit(inline="always", **JIT)
def _put_host(buf, p, v6, out, o):
    """``a.b.c.d:port`` or ``[h:h:h:h:h:h:h:h]:port`` of the host at buf[p:]."""
    if v6:
        out[o] = 91
        o += 1
        for g in range(8):
            if g:
                out[o] = 58
                o += 1
            v = (np.int64(buf[p + 2 * g]) << 8) | np.int64(buf[p + 2 * g + 1])
            started = False
            for s in range(12, -1, -4):
                d = (v >> s) & 0xF
                if d or started or s == 0:
                    out[o] = 48 + d if d < 10 else 87 + d
                    o += 1
                    started = True
        out[o] = 93
        o += 1
        p += 16
    else:
        for g in range(4):
            if g:
                out[o] = 46
                o += 1
            o = _put_dec(out, o, np.int64(buf[p + g]))
        p += 4
    out[o] = 58
    port = ld_i32(buf, p)
    return _put_dec(out, o + 1, max(port, 0))


@njit(inline="always", **JIT)
def _copy(buf, src, n, out, o):
    copy_bytes(out, o, buf, src, n)
    return o + n


@njit(**JIT)
def arrow_columns(buf, phy_base, rows, n, tags_key, keys_key, uniq_key,
                  qid, qoff, phy, size, sysflag, flag, born_us, store_us,
                  topic_off, topic_dat, body_off, body_dat, props_off, props_dat,
                  tags_off, tags_dat, tags_ok, keys_off, keys_dat, keys_ok,
                  bh_off, bh_dat, sh_off, sh_dat, id_off, id_dat):
    """Fill Arrow-shaped columns for the first ``n`` rows (``scan_records``
    rows over segment ``buf``). Offsets arrays have n+1 entries and start at
    0; data buffers must hold the sums of the parts (hosts: 47 bytes, msgId:
    32 + UNIQ_KEY bytes per row). TAGS/KEYS are null when absent or empty;
    msgId is UNIQ_KEY when present, else the offset message id."""
    ot = 0
    ob = 0
    op = 0
    og = 0
    ok = 0
    obh = 0
    osh = 0
    oi = 0
    topic_off[0] = 0
    body_off[0] = 0
    props_off[0] = 0
    tags_off[0] = 0
    keys_off[0] = 0
    bh_off[0] = 0
    sh_off[0] = 0
    id_off[0] = 0
    for i in range(n):
        pos = rows[i, S_PHY] - phy_base
        sf = rows[i, S_SYSFLAG]
        qid[i] = rows[i, S_QUEUE_ID]
        qoff[i] = rows[i, S_QUEUE_OFFSET]
        phy[i] = rows[i, S_PHY]
        size[i] = rows[i, S_SIZE]
        sysflag[i] = sf
        flag[i] = ld_i32(buf, pos + L.OFF_FLAG)
        born_us[i] = ld_i64(buf, pos + L.OFF_BORNTIMESTAMP) * 1000
        store_us[i] = rows[i, S_STORE_TS] * 1000
        bh = 20 if sf & L.SYSFLAG_BORNHOST_V6 else 8
        sh_v6 = (sf & L.SYSFLAG_STOREHOST_V6) != 0
        obh = _put_host(buf, pos + L.OFF_BORNHOST, bh == 20, bh_dat, obh)
        bh_off[i + 1] = obh
        shp = pos + L.OFF_BORNHOST + bh + 8
        osh = _put_host(buf, shp, sh_v6, sh_dat, osh)
        sh_off[i + 1] = osh
        ot = _copy(buf, rows[i, S_TOPIC_POS], rows[i, S_TOPIC_LEN], topic_dat, ot)
        topic_off[i + 1] = ot
        ob = _copy(buf, rows[i, S_BODY_POS], rows[i, S_BODY_LEN], body_dat, ob)
        body_off[i + 1] = ob
        ps = rows[i, S_PROPS_POS]
        pn = rows[i, S_PROPS_LEN]
        op = _copy(buf, ps, pn, props_dat, op)
        props_off[i + 1] = op
        # TAGS, KEYS and UNIQ_KEY in one pass; a piece counts when its key and
        # value are both non-empty, the last duplicate wins (Java's parser)
        tv = np.int64(-1)
        tn = np.int64(0)
        kv = np.int64(-1)
        kn = np.int64(0)
        uv = np.int64(-1)
        un = np.int64(0)
        j = ps
        end = ps + pn
        while j < end:
            sep, e = _piece(buf, j, end)
            if sep > j and sep < e - 1:
                if _is_key(buf, j, sep, tags_key):
                    tv = sep + 1
                    tn = e - sep - 1
                elif _is_key(buf, j, sep, keys_key):
                    kv = sep + 1
                    kn = e - sep - 1
                elif _is_key(buf, j, sep, uniq_key):
                    uv = sep + 1
                    un = e - sep - 1
            j = e + 1
        tags_ok[i] = tv >= 0
        if tv >= 0:
            og = _copy(buf, tv, tn, tags_dat, og)
        tags_off[i + 1] = og
        keys_ok[i] = kv >= 0
        if kv >= 0:
            ok = _copy(buf, kv, kn, keys_dat, ok)
        keys_off[i + 1] = ok
        if uv >= 0:
            oi = _copy(buf, uv, un, id_dat, oi)
        else:
            # offset message id: store host ip + port, then the phy offset, upper hex
            hn = 20 if sh_v6 else 8
            for k in range(hn):
                b = np.int64(buf[shp + k])
                id_dat[oi] = 48 + (b >> 4) if (b >> 4) < 10 else 55 + (b >> 4)
                id_dat[oi + 1] = 48 + (b & 15) if (b & 15) < 10 else 55 + (b & 15)
                oi += 2
            v = rows[i, S_PHY]
            for s in range(60, -1, -4):
                d = (v >> s) & 15
                id_dat[oi] = 48 + d if d < 10 else 55 + d
                oi += 1
        id_off[i + 1] = oi


@njit(**JIT)
def property_spans(dat, offs, n, key_start, key_len, val_start, val_len, row_off):
    """Split each properties string dat[offs[i]:offs[i+1]] into its
    (key, value) pieces, kept as Java keeps them (both non-empty); row_off
    (n+1) gets each row's first piece. Span arrays need one slot per 0x02
    separator plus one per row. Returns the number of pieces."""
    m = 0
    row_off[0] = 0
    for i in range(n):
        j = offs[i]
        end = offs[i + 1]
        while j < end:
            sep, e = _piece(dat, j, end)
            if sep > j and sep < e - 1:
                key_start[m] = j
                key_len[m] = sep - j
                val_start[m] = sep + 1
                val_len[m] = e - sep - 1
                m += 1
            j = e + 1
        row_off[i + 1] = m
    return m


@njit(**JIT)
def gather_spans(dat, starts, lens, m, out_off, out_dat):
    """Concatenate dat[starts[k]:+lens[k]] for k < m; out_off gets m+1 offsets."""
    o = 0
    out_off[0] = 0
    for k in range(m):
        o = _copy(dat, starts[k], lens[k], out_dat, o)
        out_off[k + 1] = o


# A pull's records as rows (``pull_rows``): the columns P_* and the statuses
# PULL_* are drawn in ``layout``.
@njit(**JIT)
def pull_rows(buf, check_crc, t, out):
    """Walk the records of ``buf`` from its start, as the client's decoder
    does (client/message.py ``decode_messages``), one row of ``out`` each
    (``P_*``). Stops at the end, at a frame that is not a record (its magic,
    TOTALSIZE or hosts do not fit: nothing after it can be found), or when
    ``out`` is full. Returns (rows written, where the walk stopped)."""
    n = buf.shape[0]
    cap = out.shape[0]
    pos = np.int64(0)
    k = 0
    while pos < n and k < cap:
        if n - pos < L.RECORD_FIXED_BYTES:
            return k, pos
        size = ld_i32(buf, pos)
        sysflag = ld_i32(buf, pos + L.OFF_SYSFLAG)
        end = pos + size
        q = pos + 68 + (20 if sysflag & L.SYSFLAG_BORNHOST_V6 else 8) \
            + (20 if sysflag & L.SYSFLAG_STOREHOST_V6 else 8)
        if ld_i32(buf, pos + 4) != L.MESSAGE_MAGIC_I32 or size < L.RECORD_FIXED_BYTES \
                or end > n or q + 7 > end:
            return k, pos
        blen = np.int64(ld_i32(buf, q))
        tpos = q + 4 + blen
        status = PULL_OK
        if blen < 0 or tpos + 3 > end:
            status = PULL_FIELDS
        else:
            tl = np.int64(buf[tpos])
            if tl == 0 or tpos + 3 + tl > end:
                status = PULL_FIELDS
            else:
                pl = np.int64(buf[tpos + 1 + tl]) << 8 | np.int64(buf[tpos + 2 + tl])
                if pl >= 0x8000 or tpos + 3 + tl + pl != end:
                    status = PULL_FIELDS
        if status == PULL_OK and check_crc and \
                (crc32(buf, q + 4, tpos, t) & 0x7FFFFFFF) != ld_i32(buf, pos + L.OFF_BODYCRC):
            status = PULL_CRC
        out[k, P_START] = pos
        out[k, P_SIZE] = size
        out[k, P_QUEUE_OFFSET] = ld_i64(buf, pos + L.OFF_QUEUEOFFSET)
        out[k, P_SYSFLAG] = sysflag
        out[k, P_BODY_POS] = q + 4
        out[k, P_BODY_LEN] = blen
        out[k, P_TOPIC_AT] = tpos
        out[k, P_STATUS] = status
        k += 1
        pos = end
    return k, pos
