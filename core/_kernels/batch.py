"""Batches on their way into the CommitLog: split, encode, stamp.

``split_batch`` parses a SEND_BATCH_MESSAGE body: bytes from the network,
untrusted, so every length is checked against the body before it is used
and a bad one ends the split with a status. ``encode_batch`` and
``encode_uniform`` write stored-message records (``layout``) with their body
CRCs into an output buffer; ``stamp_batch`` writes the positions (CommitLog
offset and queue offsets) once the store has claimed them.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import layout as L
from .binary import JIT, copy_bytes, crc32, ld_i16, ld_i32, st_i16, st_i32, st_i64


# --------------------------------------------------------------- batch encode
# Columns of the per-message ``meta`` matrix (int64) given to encode_batch.
M_QUEUE_ID = 0
M_FLAG = 1
M_SYSFLAG = 2
M_BORN_TS = 3
M_BORN_HOST = 4      # row of ``hosts`` (rows of 20 bytes: ip + int32 port)
M_RECONSUME = 5
M_PREPARED = 6
M_BODY_OFF = 7
M_BODY_LEN = 8
M_PROPS_OFF = 9
M_PROPS_LEN = 10
M_TAGS_CODE = 11     # not encoded: carried to the ConsumeQueue unit
N_META = 12


@njit(inline="always", **JIT)
def _put_record(out, p, size, qid, flag, sysflag, born_ts, born_row, bh, store_ts, store_row, sh,
                reconsume, prepared, bodies, boff, blen, topic, props, poff, plen, t):
    st_i32(out, p, size)
    st_i32(out, p + 4, L.MESSAGE_MAGIC_I32)
    st_i32(out, p + 8, crc32(bodies, boff, boff + blen, t) & 0x7FFFFFFF)
    st_i32(out, p + 12, qid)
    st_i32(out, p + 16, flag)
    st_i64(out, p + 20, 0)
    st_i64(out, p + 28, 0)
    st_i32(out, p + 36, sysflag)
    st_i64(out, p + 40, born_ts)
    q = p + 48
    copy_bytes(out, q, born_row, 0, bh)
    q += bh
    st_i64(out, q, store_ts)
    q += 8
    copy_bytes(out, q, store_row, 0, sh)
    q += sh
    st_i32(out, q, reconsume)
    st_i64(out, q + 4, prepared)
    st_i32(out, q + 12, blen)
    q += 16
    copy_bytes(out, q, bodies, boff, blen)
    q += blen
    tlen = topic.shape[0]
    out[q] = tlen
    copy_bytes(out, q + 1, topic, 0, tlen)
    q += 1 + tlen
    st_i16(out, q, plen)
    copy_bytes(out, q + 2, props, poff, plen)


@njit(**JIT)
def encode_batch(out, meta, bodies, props, topic, hosts, store_host, store_ts, t, rec_pos):
    """Encode records back to back into ``out``, every field per message from
    ``meta``; QUEUEOFFSET and PHYSICALOFFSET are left 0 (stamp_batch sets them
    under the append lock). Returns the bytes written, or -1 if ``out`` is too
    small."""
    n = meta.shape[0]
    tlen = topic.shape[0]
    p = np.int64(0)
    for i in range(n):
        sysflag = meta[i, M_SYSFLAG]
        bh = 20 if sysflag & L.SYSFLAG_BORNHOST_V6 else 8
        sh = 20 if sysflag & L.SYSFLAG_STOREHOST_V6 else 8
        blen = meta[i, M_BODY_LEN]
        plen = meta[i, M_PROPS_LEN]
        size = L.RECORD_FIXED_BYTES + (bh - 8) + (sh - 8) + blen + tlen + plen
        if p + size > out.shape[0]:
            return -1
        rec_pos[i] = p
        _put_record(out, p, size, meta[i, M_QUEUE_ID], meta[i, M_FLAG], sysflag, meta[i, M_BORN_TS],
                    hosts[meta[i, M_BORN_HOST]], bh, store_ts, store_host, sh, meta[i, M_RECONSUME],
                    meta[i, M_PREPARED], bodies, meta[i, M_BODY_OFF], blen, topic, props,
                    meta[i, M_PROPS_OFF], plen, t)
        p += size
    return p


@njit(**JIT)
def encode_uniform(body_off, body_len, bodies, props_off, props_len, props, topic, qid, flag,
                   sysflag, born_ts, born_row, store_ts, store_row, reconsume, prepared, t):
    """encode_batch for the common case: one queue and batch-wide settings,
    bodies (and properties, or one shared properties string when the props
    arrays have length 1) per message. Allocates and returns
    (records, rec_pos, sizes)."""
    n = body_len.shape[0]
    shared = props_len.shape[0] == 1
    bh = 20 if sysflag & L.SYSFLAG_BORNHOST_V6 else 8
    sh = 20 if sysflag & L.SYSFLAG_STOREHOST_V6 else 8
    fixed = L.RECORD_FIXED_BYTES + (bh - 8) + (sh - 8) + topic.shape[0]
    sizes = np.empty(n, dtype=np.int64)
    rec_pos = np.empty(n, dtype=np.int64)
    total = np.int64(0)
    for i in range(n):
        sizes[i] = fixed + body_len[i] + (props_len[0] if shared else props_len[i])
        rec_pos[i] = total
        total += sizes[i]
    out = np.empty(total, dtype=np.uint8)
    _put_record(out, 0, sizes[0], qid, flag, sysflag, born_ts, born_row, bh, store_ts,
                store_row, sh, reconsume, prepared, bodies, body_off[0], body_len[0], topic,
                props, props_off[0], props_len[0], t)
    # The first record is the template of the others: they differ from it
    # only in TOTALSIZE, BODYCRC, BODYLENGTH, the body and (unless shared)
    # the properties, so each copies its head (through BODYLENGTH) and, with
    # shared properties, its tail (topic and properties) from it: three
    # memcpys and three stores instead of twenty fields written byte by byte.
    head = fixed - 3 - topic.shape[0]
    tail = head + body_len[0]
    tail_len = 3 + topic.shape[0] + props_len[0]
    for i in range(1, n):
        p = rec_pos[i]
        boff = body_off[i]
        blen = body_len[i]
        copy_bytes(out, p, out, 0, head)
        st_i32(out, p, sizes[i])
        st_i32(out, p + 8, crc32(bodies, boff, boff + blen, t) & 0x7FFFFFFF)
        st_i32(out, p + head - 4, blen)
        copy_bytes(out, p + head, bodies, boff, blen)
        if shared:
            copy_bytes(out, p + head + blen, out, tail, tail_len)
        else:
            q = p + head + blen
            copy_bytes(out, q, out, tail, 1 + topic.shape[0])
            q += 1 + topic.shape[0]
            st_i16(out, q, props_len[i])
            copy_bytes(out, q + 2, props, props_off[i], props_len[i])
    return out, rec_pos, sizes


@njit(**JIT)
def stamp_batch(buf, rec_pos, n, phy_base, slot_of, qnext, out_qoff):
    """Stamp PHYSICALOFFSET (phy_base + position in ``buf``) and QUEUEOFFSET
    (next offset of the record's queue, ``qnext[slot_of[i]]``, advanced in
    place). Prepared and rollback transaction records get queue offset 0 and no
    ConsumeQueue unit (out_qoff = -1), as in RocketMQ."""
    for i in range(n):
        p = rec_pos[i]
        st_i64(buf, p + L.OFF_PHYSICALOFFSET, phy_base + p)
        tt = ld_i32(buf, p + L.OFF_SYSFLAG) & L.SYSFLAG_TRANSACTION_MASK
        if tt == L.SYSFLAG_TRANSACTION_PREPARED or tt == L.SYSFLAG_TRANSACTION_ROLLBACK:
            st_i64(buf, p + L.OFF_QUEUEOFFSET, 0)
            out_qoff[i] = -1
        else:
            s = slot_of[i]
            q = qnext[s]
            qnext[s] = q + 1
            st_i64(buf, p + L.OFF_QUEUEOFFSET, q)
            out_qoff[i] = q


# ------------------------------------------------------------- batch bodies
# split_batch statuses
BATCH_OK = 0
BATCH_TRUNCATED = -1      # an entry runs past the body, or a length is negative
BATCH_TOO_MANY = -2       # more entries than the caller allowed
BATCH_PROPS_TOO_LONG = -3  # properties + the batch suffix exceed 32767 bytes


@njit(**JIT)
def split_batch(body, max_entries, suffix, props_out, meta):
    """Split a SEND_BATCH_MESSAGE body (reference §5.5: per entry int32 total |
    int32 magic | int32 crc | int32 flag | int32 body length | body | int16
    properties length | properties) into ``meta[i] = (flag, body_off,
    body_len, props_off, props_len)``, copying each entry's properties into
    ``props_out`` followed by ``suffix`` (the batch's own properties), with a
    \\x02 between them when the entry's do not end with one. ``props_out``
    must hold ``len(body) + max_entries * (len(suffix) + 1)`` bytes.
    Returns (entries, status)."""
    n = body.shape[0]
    p = 0
    i = 0
    q = 0
    slen = suffix.shape[0]
    while p < n:
        if i == max_entries:
            return i, BATCH_TOO_MANY
        if p + 20 > n:
            return i, BATCH_TRUNCATED
        total = ld_i32(body, p)
        blen = ld_i32(body, p + 16)
        if total < 22 or blen < 0 or p + total > n or 20 + blen + 2 > total:
            return i, BATCH_TRUNCATED
        plen = ld_i16(body, p + 20 + blen)
        if plen < 0 or 20 + blen + 2 + plen != total:
            return i, BATCH_TRUNCATED
        pstart = p + 20 + blen + 2
        sep = 1 if slen > 0 and plen > 0 and body[pstart + plen - 1] != 2 else 0
        out_len = plen + sep + slen
        if out_len > 32767:
            return i, BATCH_PROPS_TOO_LONG
        meta[i, 0] = ld_i32(body, p + 12)
        meta[i, 1] = p + 20
        meta[i, 2] = blen
        meta[i, 3] = q
        meta[i, 4] = out_len
        copy_bytes(props_out, q, body, pstart, plen)
        q += plen
        if sep:
            props_out[q] = 2
            q += 1
        copy_bytes(props_out, q, suffix, 0, slen)
        q += slen
        p += total
        i += 1
    return i, BATCH_OK
