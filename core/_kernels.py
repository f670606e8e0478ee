"""Every numba-jitted function of shmq, in one private module.

Kernels take numpy arrays and numbers only, return numbers or fill output
arrays, and never raise for bad data: they return a status code that the
Python wrappers (``records``, ``consumequeue``) turn into errors. Each one has
a slow, obviously correct twin in ``tests/naive.py``. ``cache=True`` so a new
process loads machine code from ``__pycache__`` instead of compiling; the
wrappers' ``warm_up()`` touches every kernel once at process start, so no
request ever pays for a JIT.

All multi-byte integers in the store are big-endian (``layout``); numba does
not support non-native byte orders, so kernels read and write bytes by hand.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import layout as L

_JIT = dict(cache=True, nogil=True, boundscheck=False)

# ---------------------------------------------------------------- big-endian
@njit(inline="always", **_JIT)
def ld_u32(b, p):
    return ((np.int64(b[p]) << 24) | (np.int64(b[p + 1]) << 16)
            | (np.int64(b[p + 2]) << 8) | np.int64(b[p + 3]))


@njit(inline="always", **_JIT)
def ld_i32(b, p):
    v = ld_u32(b, p)
    return v - 4294967296 if v >= 2147483648 else v


@njit(inline="always", **_JIT)
def ld_i16(b, p):
    v = (np.int64(b[p]) << 8) | np.int64(b[p + 1])
    return v - 65536 if v >= 32768 else v


@njit(inline="always", **_JIT)
def ld_i64(b, p):
    return (ld_u32(b, p) << 32) | ld_u32(b, p + 4)


@njit(inline="always", **_JIT)
def st_i32(b, p, v):
    b[p] = (v >> 24) & 0xFF
    b[p + 1] = (v >> 16) & 0xFF
    b[p + 2] = (v >> 8) & 0xFF
    b[p + 3] = v & 0xFF


@njit(inline="always", **_JIT)
def st_i16(b, p, v):
    b[p] = (v >> 8) & 0xFF
    b[p + 1] = v & 0xFF


@njit(inline="always", **_JIT)
def st_i64(b, p, v):
    st_i32(b, p, (v >> 32) & 0xFFFFFFFF)
    st_i32(b, p + 4, v & 0xFFFFFFFF)


# --------------------------------------------------------------------- CRC32
def make_crc_tables() -> np.ndarray:
    """Slice-by-8 tables for the zlib CRC-32 (reflected 0xEDB88320), flattened:
    table k is t[256*k : 256*k + 256]."""
    t = np.zeros((8, 256), dtype=np.uint32)
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t[0, n] = c
    for k in range(1, 8):
        for n in range(256):
            t[k, n] = (int(t[k - 1, n]) >> 8) ^ int(t[0, int(t[k - 1, n]) & 0xFF])
    return t.ravel()


CRC_TABLES = make_crc_tables()
CRC_TABLES.flags.writeable = False   # an input of every kernel that checks CRCs (core/jit.py)

_U8 = np.uint32(8)
_U16 = np.uint32(16)
_U24 = np.uint32(24)
_UFF = np.uint32(0xFF)


@njit(inline="always", **_JIT)
def _le32(buf, i):
    return (np.uint32(buf[i]) | (np.uint32(buf[i + 1]) << _U8)
            | (np.uint32(buf[i + 2]) << _U16) | (np.uint32(buf[i + 3]) << _U24))


@njit(**_JIT)
def crc32(buf, start, end, t):
    """zlib.crc32(buf[start:end]) by slice-by-8 over the flat tables ``t``.
    Unsigned 32-bit arithmetic and uintp indices keep numba from adding
    negative-index fix-ups to every lookup (5x faster than int64)."""
    c = np.uint32(0xFFFFFFFF)
    i = start
    while i + 8 <= end:
        lo = c ^ _le32(buf, i)
        hi = _le32(buf, i + 4)
        c = (t[np.uintp(1792 + (lo & _UFF))] ^ t[np.uintp(1536 + ((lo >> _U8) & _UFF))]
             ^ t[np.uintp(1280 + ((lo >> _U16) & _UFF))] ^ t[np.uintp(1024 + (lo >> _U24))]
             ^ t[np.uintp(768 + (hi & _UFF))] ^ t[np.uintp(512 + ((hi >> _U8) & _UFF))]
             ^ t[np.uintp(256 + ((hi >> _U16) & _UFF))] ^ t[np.uintp(hi >> _U24)])
        i += 8
    while i < end:
        c = t[np.uintp((c ^ np.uint32(buf[i])) & _UFF)] ^ (c >> _U8)
        i += 1
    return np.int64(c ^ np.uint32(0xFFFFFFFF))


# ------------------------------------------------------- Java String.hashCode
@njit(inline="always", **_JIT)
def _utf8_step(buf, i, end):
    """(code point, bytes consumed) of the UTF-8 sequence at buf[i]. A
    malformed sequence decodes as U+FFFD and consumes its maximal valid
    prefix (at least one byte): the Unicode practice that Java's and
    Python's decoders follow."""
    b0 = np.int64(buf[i])
    if b0 < 0x80:
        return b0, 1
    lo, hi = np.int64(0x80), np.int64(0xBF)   # range of the second byte
    if 0xC2 <= b0 <= 0xDF:
        need, cp = 1, b0 & 0x1F
    elif 0xE0 <= b0 <= 0xEF:
        need, cp = 2, b0 & 0x0F
        if b0 == 0xE0:
            lo = 0xA0
        elif b0 == 0xED:
            hi = 0x9F
    elif 0xF0 <= b0 <= 0xF4:
        need, cp = 3, b0 & 0x07
        if b0 == 0xF0:
            lo = 0x90
        elif b0 == 0xF4:
            hi = 0x8F
    else:
        return np.int64(0xFFFD), 1
    k = 1
    while k <= need:
        if i + k >= end:
            return np.int64(0xFFFD), k
        b = np.int64(buf[i + k])
        if (k == 1 and (b < lo or b > hi)) or (k > 1 and (b & 0xC0) != 0x80):
            return np.int64(0xFFFD), k
        cp = (cp << 6) | (b & 0x3F)
        k += 1
    return cp, need + 1


@njit(inline="always", **_JIT)
def _java_hash_more(h, buf, start, end):
    """Continue the Java String.hashCode state ``h`` (unsigned 32-bit) over the
    UTF-8 bytes buf[start:end], decoded as java_hash_utf8 decodes them. ASCII
    bytes skip the decoder: 1 ns a byte instead of 14."""
    i = start
    while i < end:
        b = np.int64(buf[i])
        if b < 0x80:
            h = (31 * h + b) & 0xFFFFFFFF
            i += 1
            continue
        cp, step = _utf8_step(buf, i, end)
        if cp >= 0x10000:
            c = cp - 0x10000
            h = (31 * h + (0xD800 + (c >> 10))) & 0xFFFFFFFF
            h = (31 * h + (0xDC00 + (c & 0x3FF))) & 0xFFFFFFFF
        else:
            h = (31 * h + cp) & 0xFFFFFFFF
        i += step
    return h


@njit(**_JIT)
def java_hash_utf8(buf, start, n):
    """Java ``String.hashCode`` of the UTF-8 bytes buf[start:start+n] as
    ``new String(bytes, UTF_8)`` decodes them, computed over UTF-16 code
    units. Signed int32."""
    h = _java_hash_more(np.int64(0), buf, start, start + n)
    return h - 4294967296 if h >= 2147483648 else h


@njit(inline="always", **_JIT)
def _piece(buf, i, end):
    """The properties piece starting at ``i``: (position of its first 0x01 or
    -1, its end: the next 0x02 or ``end``). Java keeps a piece whose key and
    value are both non-empty (MessageDecoder.string2messageProperties)."""
    j = i
    sep = np.int64(-1)
    while j < end and buf[j] != 2:
        if buf[j] == 1 and sep < 0:
            sep = j
        j += 1
    return sep, j


@njit(**_JIT)
def find_property(buf, start, n, key):
    """Value (start, length) of property ``key`` in a properties string
    buf[start:start+n], as Java's string2messageProperties would give it (the
    last duplicate wins); (-1, 0) when absent."""
    klen = key.shape[0]
    found_at = np.int64(-1)
    found_len = np.int64(0)
    i = start
    end = start + n
    while i < end:
        sep, j = _piece(buf, i, end)
        # (lengths in bytes or UTF-16 units agree on "non-empty")
        if sep > i and sep < j - 1 and sep - i == klen:
            same = True
            for k in range(klen):
                if buf[i + k] != key[k]:
                    same = False
                    break
            if same:
                found_at = sep + 1
                found_len = j - sep - 1
        i = j + 1
    return found_at, found_len


@njit(**_JIT)
def tags_codes(buf, offs, lens, tags_key, out):
    """ConsumeQueue tags code of each properties string buf[offs[i]:+lens[i]]:
    Java hashCode of its TAGS value, 0 when absent or empty."""
    for i in range(offs.shape[0]):
        vpos, vlen = find_property(buf, offs[i], lens[i], tags_key)
        out[i] = java_hash_utf8(buf, vpos, vlen) if vpos >= 0 and vlen > 0 else 0


INT_DIGITS_MAX = 18   # int_properties: never overflows int64; an epoch-ms time has 13


@njit(**_JIT)
def int_properties(buf, offs, lens, key, out):
    """Property ``key`` of each properties string buf[offs[i]:+lens[i]] read
    as a decimal integer: an optional sign, then 1..INT_DIGITS_MAX ASCII
    digits (Java's ``Long.parseLong`` syntax, bounded). Where the property is
    absent or not such a number, out[i] is left as it was. Returns how many
    were left."""
    missed = 0
    for i in range(offs.shape[0]):
        vpos, vlen = find_property(buf, offs[i], lens[i], key)
        if vpos < 0:
            missed += 1
            continue
        p = vpos
        end = vpos + vlen
        neg = buf[p] == 45                 # '-'
        if neg or buf[p] == 43:            # '+'
            p += 1
        if end - p < 1 or end - p > INT_DIGITS_MAX:
            missed += 1
            continue
        v = np.int64(0)
        for j in range(p, end):
            d = np.int64(buf[j]) - 48
            if d < 0 or d > 9:
                v = np.int64(-1)
                break
            v = v * 10 + d
        if v < 0:
            missed += 1
            continue
        out[i] = -v if neg else v
    return missed


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


@njit(inline="always", **_JIT)
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
    for k in range(bh):
        out[q + k] = born_row[k]
    q += bh
    st_i64(out, q, store_ts)
    q += 8
    for k in range(sh):
        out[q + k] = store_row[k]
    q += sh
    st_i32(out, q, reconsume)
    st_i64(out, q + 4, prepared)
    st_i32(out, q + 12, blen)
    q += 16
    out[q:q + blen] = bodies[boff:boff + blen]
    q += blen
    tlen = topic.shape[0]
    out[q] = tlen
    out[q + 1:q + 1 + tlen] = topic
    q += 1 + tlen
    st_i16(out, q, plen)
    out[q + 2:q + 2 + plen] = props[poff:poff + plen]


@njit(**_JIT)
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


@njit(**_JIT)
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
    for i in range(n):
        j = 0 if shared else i
        _put_record(out, rec_pos[i], sizes[i], qid, flag, sysflag, born_ts, born_row, bh,
                    store_ts, store_row, sh, reconsume, prepared, bodies, body_off[i],
                    body_len[i], topic, props, props_off[j], props_len[j], t)
    return out, rec_pos, sizes


@njit(**_JIT)
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


# ------------------------------------------------------- record scan/validate
SCAN_END = 0        # zero TOTALSIZE or the limit reached: no more records
SCAN_BLANK = 1      # end-of-segment blank record at ``pos``
SCAN_CORRUPT = 2    # a bad record starts at ``pos``
SCAN_FULL = 3       # ``out`` is full; call again from ``pos``
SCAN_FOREIGN = 4    # a record of another format version (5.x MAGIC_V2) at ``pos``

S_PHY = 0
S_SIZE = 1
S_QUEUE_ID = 2
S_QUEUE_OFFSET = 3
S_SYSFLAG = 4
S_TAGS_CODE = 5
S_TOPIC_POS = 6     # position in ``buf``
S_TOPIC_LEN = 7
S_TOPIC_HASH = 8    # 64-bit FNV-1a of the topic bytes, for grouping
S_STORE_TS = 9
S_PROPS_POS = 10
S_PROPS_LEN = 11
S_BODY_POS = 12
S_BODY_LEN = 13
N_SCAN = 14

MESSAGE_MAGIC_V2_I32 = 0xDAA320AB - 4294967296


@njit(**_JIT)
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


@njit(**_JIT)
def _first_bad_crc(buf, out, n, phy_base, t):
    for i in range(n):
        p = out[i, S_BODY_POS]
        stored = ld_i32(buf, out[i, S_PHY] - phy_base + 8)
        if (crc32(buf, p, p + out[i, S_BODY_LEN], t) & 0x7FFFFFFF) != stored:
            return i
    return n


@njit(inline="always", **_JIT)
def _pad_ok(buf, pos, size, end, phy_base):
    """Is the PAD record (``layout``) at ``pos`` whole: it fits before ``end``,
    names its own position, a topic of 1..127 bytes and no negative count?"""
    if size < L.PAD_FIXED_BYTES + 1 or pos + size > end:
        return False
    tlen = np.int64(buf[pos + L.PAD_OFF_TOPIC])
    return (ld_i64(buf, pos + L.PAD_OFF_PHYSICALOFFSET) == phy_base + pos
            and 1 <= tlen <= L.TOPIC_BYTES_MAX and size >= L.PAD_FIXED_BYTES + tlen
            and ld_i32(buf, pos + L.PAD_OFF_UNITS) >= 0)


@njit(**_JIT)
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


@njit(**_JIT)
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


# --------------------------------------------------------------- ConsumeQueue
CQ_PAD_SIZE = 2147483647   # ConsumeQueue.fillPreBlank: size Integer.MAX_VALUE

CQ_DONE = 0      # scanned every unit asked for
CQ_FULL = 1      # stopped at a count or byte limit
CQ_BAD = 2       # a unit that is not a valid position (never below the published max)


@njit(**_JIT)
def cq_put(cq, unit, phy, size, tags_code):
    p = unit * 20
    st_i64(cq, p, phy)
    st_i32(cq, p + 8, size)
    st_i64(cq, p + 12, tags_code)


@njit(**_JIT)
def cq_put_many(cq, first_unit, phys, sizes, codes, start, count):
    for k in range(count):
        cq_put(cq, first_unit + k, phys[start + k], sizes[start + k], codes[start + k])


@njit(**_JIT)
def cq_scan(cq, first_unit, count, codes, max_msgs, max_bytes, out_phy, out_size):
    """Collect units first_unit .. first_unit+count-1 of one ConsumeQueue file
    whose tags code is in the sorted array ``codes`` (empty = every message),
    stopping before ``max_msgs`` matches or ``max_bytes`` (the first match is
    always taken). Returns (found, scanned, status)."""
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
            return found, k, CQ_BAD
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
            return found, k, CQ_FULL
        out_phy[found] = phy
        out_size[found] = size
        found += 1
        total += size
    return found, count, CQ_DONE


@njit(**_JIT)
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


@njit(**_JIT)
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


# ------------------------------------------------------------- batch bodies
# split_batch statuses
BATCH_OK = 0
BATCH_TRUNCATED = -1      # an entry runs past the body, or a length is negative
BATCH_TOO_MANY = -2       # more entries than the caller allowed
BATCH_PROPS_TOO_LONG = -3  # properties + the batch suffix exceed 32767 bytes


@njit(**_JIT)
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
        for k in range(plen):
            props_out[q + k] = body[pstart + k]
        q += plen
        if sep:
            props_out[q] = 2
            q += 1
        for k in range(slen):
            props_out[q + k] = suffix[k]
        q += slen
        p += total
        i += 1
    return i, BATCH_OK


# ------------------------------------------------------------------ IndexFile
# RocketMQ's IndexFile (IndexHeader / IndexFile.java; reference §7.3): a
# 40-byte header, ``slot_num`` int32 hash slots, ``index_num`` 20-byte entries
# (int32 keyHash | int64 phyOffset | int32 timeDiff s | int32 prevIndex).
# Entry 0 is never used; indexCount is the next entry to write.
IX_BEGIN_TS = 0
IX_END_TS = 8
IX_BEGIN_PHY = 16
IX_END_PHY = 24
IX_SLOT_COUNT = 32
IX_INDEX_COUNT = 36
IX_HEADER_BYTES = 40
IX_SLOT_BYTES = 4
IX_ENTRY_BYTES = 20

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
@njit(inline="always", **_JIT)
def _bswap32(v):
    return (((v & 0xFF) << 24) | (((v >> 8) & 0xFF) << 16)
            | (((v >> 16) & 0xFF) << 8) | ((v >> 24) & 0xFF))


@njit(inline="always", **_JIT)
def _ld_word(w, p):
    v = _bswap32(np.int64(w[p >> 2]))
    return v - 4294967296 if v >= 2147483648 else v


@njit(inline="always", **_JIT)
def _st_word(w, p, v):
    w[p >> 2] = np.uint32(_bswap32(v & 0xFFFFFFFF))


@njit(inline="always", **_JIT)
def _index_key_hash(h):
    """IndexFile.indexKeyHashMethod of an unsigned 32-bit hashCode:
    Math.abs, with Integer.MIN_VALUE (whose abs is negative) as 0."""
    if h == 2147483648:
        return np.int64(0)
    return 4294967296 - h if h > 2147483648 else h


@njit(inline="always", **_JIT)
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


@njit(**_JIT)
def index_put(idx, slot_num, index_num, key_hash, phy, store_ts):
    """IndexFile.putKey: add entry (key_hash, phy, store_ts) to the mapped
    file ``idx``. False when the file is full. Writes the entry, then its
    slot, then the header, indexCount last: a reader that loads indexCount
    first and follows slots finds only complete entries."""
    return _index_put(idx, idx.view(np.uint32), slot_num, index_num, key_hash, phy, store_ts)


@njit(**_JIT)
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


@njit(**_JIT)
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


@njit(**_JIT)
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


# ---------------------------------------------------------- columnar decode
# Readers outside the broker (tools/spark, tools/inspect) turn records into
# Arrow-shaped columns: fixed-width arrays plus (int32 offsets, bytes) pairs.
# Positions come from the same header parser as recovery (``_scan_headers``).

@njit(**_JIT)
def records_at(buf, phy_base, phys, sizes, start, count, tags_key, out):
    """Describe, in rows of ``out`` as ``scan_records`` does, the records that
    ConsumeQueue units phys/sizes[start:start+count] point at, all inside
    segment ``buf``. Returns how many lead valid (a record is valid when the
    header parser accepts exactly one record of the unit's size there)."""
    seg = buf.shape[0]
    for i in range(count):
        pos = phys[start + i] - phy_base
        size = sizes[start + i]
        if pos < 0 or size <= 0 or pos + size > seg:
            return i
        n, _, _ = _scan_headers(buf, pos, pos + size, phy_base, tags_key, out[i:i + 1])
        if n != 1 or out[i, S_SIZE] != size:
            return i
    return count


@njit(inline="always", **_JIT)
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


@njit(inline="always", **_JIT)
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


@njit(inline="always", **_JIT)
def _copy(buf, src, n, out, o):
    # Unrolled by 8: the fields are short (tags, keys, bodies of a few
    # hundred bytes), where this beats both a byte loop (2.5x) and a slice
    # assignment (whose per-call set-up costs more than the copy).
    k = 0
    while k + 8 <= n:
        out[o + k] = buf[src + k]
        out[o + k + 1] = buf[src + k + 1]
        out[o + k + 2] = buf[src + k + 2]
        out[o + k + 3] = buf[src + k + 3]
        out[o + k + 4] = buf[src + k + 4]
        out[o + k + 5] = buf[src + k + 5]
        out[o + k + 6] = buf[src + k + 6]
        out[o + k + 7] = buf[src + k + 7]
        k += 8
    while k < n:
        out[o + k] = buf[src + k]
        k += 1
    return o + n


@njit(inline="always", **_JIT)
def _is_key(buf, i, sep, key):
    if sep - i != key.shape[0]:
        return False
    for k in range(key.shape[0]):
        if buf[i + k] != key[k]:
            return False
    return True


@njit(**_JIT)
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


@njit(**_JIT)
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


@njit(**_JIT)
def gather_spans(dat, starts, lens, m, out_off, out_dat):
    """Concatenate dat[starts[k]:+lens[k]] for k < m; out_off gets m+1 offsets."""
    o = 0
    out_off[0] = 0
    for k in range(m):
        o = _copy(dat, starts[k], lens[k], out_dat, o)
        out_off[k + 1] = o
