"""Single sends and pulls straight from a connection's bytes: read, encode, answer.

The send lane (``broker/handlers/lane.py``, issue 14): the SEND_MESSAGE (10)
and SEND_MESSAGE_V2 (310) frames a worker read in one ``recv`` are read,
checked and written as records by two kernel calls, and their SUCCESS
answers by a third, instead of a ``RemotingCommand``, a dict and a record
built in Python for each one. The pull lane (``broker/handlers/pull_lane.py``):
the PULL_MESSAGE (11) frames by one call, ``read_pulls`` (at the end). Both
read a frame and its header with ``_frame``.

``read_sends`` reads frames from ``buf[pos:end]`` while each is a plain
single send it can take whole; it stops, taking nothing of it, at the
first that is not: incomplete, not a JSON header, another code, a response
or oneway flag, a header outside the subset below, a field missing or not
a plain decimal number, a batch, a re-consumed message (reconsumeTimes >
0), a delay, a delivery time or a transaction (its properties or sysFlag),
a size past a limit, an empty body. What it stops at goes the Python way
(``FrameDecoder`` and ``handlers/send.py``), which answers every such case
as before, errors included: the lane only ever takes what that path would
store, and stores it the same way.

The JSON it reads is a strict subset of what ``orjson`` accepts: an object
of string keys without escapes, whose values are integers of at most 18
digits, strings of ASCII characters (escapes included; a ``\\u`` escape,
four hex digits, below 0x80), true, false, null, and for ``extFields``
one object of such values.
Anything else (a non-ASCII byte, a fraction, an array, a nested object
elsewhere) stops the lane at that frame, so text the subset does not read
is never misread.

Out, per frame taken (``out[i, F_*]``): where it ends, its opaque, its
topic and properties (decoded, in ``scratch``; the properties as
``prepare`` leaves them: trailing separators cut, ``CLUSTER`` added when
absent), its queue id, sysFlag, bornTimestamp, flag, its body (in
``buf``), its ConsumeQueue tags code, the hash of its UNIQ_KEY (``dedup``),
whether its topic differs from the frame before's, and whether its
properties say WAIT=false (answered before the flush, under SYNC_FLUSH).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .binary import JIT, copy_bytes, crc32, java_hash_utf8, st_i16, st_i32, st_i64
from .properties import find_property

(F_END, F_OPAQUE, F_TOPIC_OFF, F_TOPIC_LEN, F_QID, F_SYSFLAG, F_BORN_TS, F_FLAG, F_PROPS_OFF,
 F_PROPS_LEN, F_BODY_OFF, F_BODY_LEN, F_TAGS_CODE, F_KEY_HASH, F_NEW_TOPIC, F_SIZE,
 F_NO_WAIT) = range(17)
N_F = 17

SEND_V1, SEND_V2 = 10, 310
# the header fields a send reads (send.send_fields), by slot
(X_GROUP, X_TOPIC, X_QID, X_SYSFLAG, X_BORN_TS, X_FLAG, X_PROPS, X_RECONSUME, X_BATCH) = range(9)
N_X = 9
# V2's letters of those fields, in slot order (ipc/headers.SEND_HEADER's order: a, b, e, …)
V2_LETTERS = np.frombuffer(b"abefghijm", np.uint8)
# the value kinds a field was given as
V_NONE, V_STR, V_INT, V_TRUE, V_FALSE = 0, 1, 2, 3, 4
# the literals, then the header keys read_sends knows: code, opaque, flag,
# version (at _TOP_AT) and extFields (at 34)
WORDS = b"truefalsenullcodeopaqueflagversionextFields"
_TOP_AT = np.array([13, 17, 23, 27, 34], np.int64)
INT_DIGITS = 18
_TRANSACTION_MASK = 0x3 << 2           # layout.SYSFLAG_TRANSACTION_MASK
_HOST_FLAGS = 0x10 | 0x20              # born / store host IPv6


@njit(inline="always", **JIT)
def _ws(buf, i, end):
    while i < end and (buf[i] == 32 or buf[i] == 9 or buf[i] == 10 or buf[i] == 13):
        i += 1
    return i


@njit(inline="always", **JIT)
def _hex(c):
    if 48 <= c <= 57:
        return np.int64(c - 48)
    if 65 <= c <= 70:
        return np.int64(c - 55)
    if 97 <= c <= 102:
        return np.int64(c - 87)
    return np.int64(-1)


@njit(inline="always", **JIT)
def _string(buf, i, end, scratch, sp):
    """The JSON string whose opening quote is at ``i``, decoded into
    scratch[sp:]: (position after its closing quote, decoded length), or
    (-1, 0) when it is outside the subset."""
    i += 1
    n = sp
    while i < end:
        c = buf[i]
        if c == 34:                                # "
            return i + 1, n - sp
        if c < 32 or c >= 128:
            return np.int64(-1), np.int64(0)
        if c == 92:                                # \
            if i + 1 >= end:
                return np.int64(-1), np.int64(0)
            e = buf[i + 1]
            if e == 117:                           # \u and four hex digits
                if i + 6 > end:
                    return np.int64(-1), np.int64(0)
                v = np.int64(0)
                for k in range(2, 6):
                    h = _hex(buf[i + k])
                    if h < 0:
                        return np.int64(-1), np.int64(0)
                    v = v * 16 + h
                if v >= 128:
                    return np.int64(-1), np.int64(0)
                scratch[n] = v
                i += 6
            else:
                if e == 34 or e == 92 or e == 47:
                    scratch[n] = e
                elif e == 98:
                    scratch[n] = 8
                elif e == 102:
                    scratch[n] = 12
                elif e == 110:
                    scratch[n] = 10
                elif e == 114:
                    scratch[n] = 13
                elif e == 116:
                    scratch[n] = 9
                else:
                    return np.int64(-1), np.int64(0)
                i += 2
            n += 1
            continue
        scratch[n] = c
        n += 1
        i += 1
    return np.int64(-1), np.int64(0)


@njit(**JIT)
def _number(buf, i, end):
    """The JSON integer at ``i``: (position after it, value), or (-1, 0)
    for a fraction, an exponent, a leading zero or more than INT_DIGITS
    digits."""
    neg = buf[i] == 45
    if neg:
        i += 1
    s = i
    v = np.int64(0)
    while i < end and 48 <= buf[i] <= 57:
        v = v * 10 + np.int64(buf[i] - 48)
        i += 1
    nd = i - s
    if nd == 0 or nd > INT_DIGITS or (nd > 1 and buf[s] == 48):
        return np.int64(-1), np.int64(0)
    if i < end and (buf[i] == 46 or buf[i] == 101 or buf[i] == 69):
        return np.int64(-1), np.int64(0)
    return i, -v if neg else v


@njit(inline="always", **JIT)
def _literal(buf, i, end, word):
    """Whether buf[i:] starts with ``word`` (true, false, null)."""
    if i + word.shape[0] > end:
        return False
    for k in range(word.shape[0]):
        if buf[i + k] != word[k]:
            return False
    return True


@njit(**JIT)
def _value(buf, i, end, scratch, sp, words):
    """The scalar JSON value at ``i``: (position after it or -1, kind, an
    integer's value or a string's scratch length)."""
    c = buf[i]
    if c == 34:
        j, n = _string(buf, i, end, scratch, sp)
        return j, np.int64(V_STR), n
    if c == 45 or 48 <= c <= 57:
        j, v = _number(buf, i, end)
        return j, np.int64(V_INT), v
    if c == 116 and _literal(buf, i, end, words[0:4]):
        return i + 4, np.int64(V_TRUE), np.int64(0)
    if c == 102 and _literal(buf, i, end, words[4:9]):
        return i + 5, np.int64(V_FALSE), np.int64(0)
    if c == 110 and _literal(buf, i, end, words[9:13]):
        return i + 4, np.int64(V_NONE), np.int64(0)
    return np.int64(-1), np.int64(0), np.int64(0)


@njit(inline="always", **JIT)
def _key_eq(buf, s, n, keys, a, z):
    """Whether buf[s:s+n] is keys[a:z] (no slice made: a view costs more
    than the comparison, made for every key of every header)."""
    if n != z - a:
        return False
    for k in range(n):
        if buf[s + k] != keys[a + k]:
            return False
    return True


@njit(inline="always", **JIT)
def _field_slot(buf, s, n, code, v1_names, v1_offs):
    """The slot (X_*) of extFields key buf[s:s+n] for ``code``, or -1."""
    if code == SEND_V2:
        if n == 1:
            for x in range(N_X):
                if buf[s] == V2_LETTERS[x]:
                    return x
        return -1
    for x in range(N_X):
        if _key_eq(buf, s, n, v1_names, v1_offs[x], v1_offs[x + 1]):
            return x
    return -1


@njit(inline="always", **JIT)
def _member(buf, i, end):
    """The object member whose key's opening quote is at ``i`` (a key of
    ASCII characters without escapes): (key start, key length, where its
    value starts), or (-1, 0, -1)."""
    if i >= end or buf[i] != 34:
        return np.int64(-1), np.int64(0), np.int64(-1)
    ks = i + 1
    j = ks
    while j < end and buf[j] != 34:
        if buf[j] == 92 or buf[j] < 32 or buf[j] >= 128:
            return np.int64(-1), np.int64(0), np.int64(-1)
        j += 1
    i = _ws(buf, j + 1, end)
    if i >= end or buf[i] != 58:
        return np.int64(-1), np.int64(0), np.int64(-1)
    i = _ws(buf, i + 1, end)
    if i >= end:
        return np.int64(-1), np.int64(0), np.int64(-1)
    return ks, j - ks, i


@njit(inline="always", **JIT)
def _after(buf, i, end):
    """After a member's value at ``i``: (1, where the next member's key
    starts) after a comma, (0, the position after the object) at its
    closing brace, (-1, -1) otherwise."""
    i = _ws(buf, i, end)
    if i < end and buf[i] == 44:
        return np.int64(1), _ws(buf, i + 1, end)
    if i < end and buf[i] == 125:
        return np.int64(0), i + 1
    return np.int64(-1), np.int64(-1)


@njit(inline="always", **JIT)
def _opened(buf, i, end):
    """The object whose ``{`` is at ``i``: (1, its first key's position),
    (0, the position after it) when it is empty."""
    i = _ws(buf, i + 1, end)
    if i < end and buf[i] == 125:
        return np.int64(0), i + 1
    return np.int64(1), i


@njit(**JIT)
def _ext_object(buf, i, end, scratch, sp, words, kinds, vals, key_at, key_len):
    """extFields' object at ``i`` (its ``{``): each member's key span
    (``key_at``/``key_len``), its value's kind (``kinds``) and value
    (``vals[2m]``: an integer, or a string's scratch offset with its length
    in ``vals[2m + 1]``), in order. Returns (position after it or -1,
    members, scratch used)."""
    more, i = _opened(buf, i, end)
    m = 0
    s0 = sp
    while more == 1:
        ks, kn, i = _member(buf, i, end)
        if i < 0 or m >= kinds.shape[0]:
            return np.int64(-1), np.int64(0), np.int64(0)
        i, kind, v = _value(buf, i, end, scratch, sp, words)
        if i < 0:
            return np.int64(-1), np.int64(0), np.int64(0)
        key_at[m] = ks
        key_len[m] = kn
        kinds[m] = kind
        if kind == V_STR:
            vals[2 * m] = sp
            vals[2 * m + 1] = v
            sp += v
        else:
            vals[2 * m] = v
            vals[2 * m + 1] = 0
        m += 1
        more, i = _after(buf, i, end)
    if more < 0:
        return np.int64(-1), np.int64(0), np.int64(0)
    return i, np.int64(m), sp - s0


@njit(inline="always", **JIT)
def _top_key(buf, ks, kn, words):
    """Which of the header's integer keys buf[ks:ks+kn] is (T_CODE,
    T_OPAQUE, T_FLAG, T_VERSION: their places in WORDS), or -1."""
    for t in range(4):
        if _key_eq(buf, ks, kn, words, _TOP_AT[t], _TOP_AT[t + 1]):
            return t
    return -1


@njit(inline="always", **JIT)
def _dec(scratch, s, n):
    """The decimal integer scratch[s:s+n] (an optional '-', 1..INT_DIGITS
    ASCII digits), or (False, 0)."""
    p = s
    e = s + n
    neg = n > 0 and scratch[p] == 45
    if neg:
        p += 1
    if e - p < 1 or e - p > INT_DIGITS:
        return False, np.int64(0)
    v = np.int64(0)
    for k in range(p, e):
        d = np.int64(scratch[k]) - 48
        if d < 0 or d > 9:
            return False, np.int64(0)
        v = v * 10 + d
    return True, -v if neg else v


@njit(inline="always", **JIT)
def _header_arrays():
    """What ``_frame`` fills for a header: extFields' members' kinds, their
    values (two words each), their keys' offsets and lengths (64 members
    at most), and the code, opaque, flag and version."""
    return (np.empty(64, np.int64), np.empty(128, np.int64), np.empty(64, np.int64),
            np.empty(64, np.int64), np.empty(4, np.int64))


@njit(**JIT)
def _frame(buf, pos, end, scratch, sp, words, kinds, vals, key_at, key_len, top):
    """The frame at buf[pos:end] whose JSON header is in the subset (see
    the module's header): (where it ends, where its body starts,
    extFields' members (0 for null; -1 when it is not an object), the
    scratch its strings took from ``sp``), the header's code, opaque, flag
    and version in top[0:4] (code -1 when absent), its extFields as
    ``_ext_object`` reads them. Where it ends is -1 when the frame is
    incomplete, its header not JSON or outside the subset, or one of those
    four not an int32."""
    if end - pos < 8:
        return np.int64(-1), np.int64(0), np.int64(-1), np.int64(0)
    total = (np.int64(buf[pos]) << 24) | (np.int64(buf[pos + 1]) << 16) \
        | (np.int64(buf[pos + 2]) << 8) | np.int64(buf[pos + 3])
    if total < 4 or total > (1 << 24) or end - pos < 4 + total or buf[pos + 4] != 0:
        return np.int64(-1), np.int64(0), np.int64(-1), np.int64(0)
    hlen = (np.int64(buf[pos + 5]) << 16) | (np.int64(buf[pos + 6]) << 8) | np.int64(buf[pos + 7])
    if hlen > total - 4:
        return np.int64(-1), np.int64(0), np.int64(-1), np.int64(0)
    h0 = pos + 8
    h1 = h0 + hlen
    fend = pos + 4 + total
    i = _ws(buf, h0, h1)
    if i >= h1 or buf[i] != 123:
        return np.int64(-1), np.int64(0), np.int64(-1), np.int64(0)
    more, i = _opened(buf, i, h1)
    top[0], top[1], top[2], top[3] = -1, 0, 0, 0
    members = np.int64(-1)
    s0 = sp
    while more == 1:
        ks, kn, i = _member(buf, i, h1)
        if i < 0:
            break
        if _key_eq(buf, ks, kn, words, 34, 43):                        # extFields
            if buf[i] == 123:
                i, members, used = _ext_object(buf, i, h1, scratch, sp, words, kinds, vals,
                                               key_at, key_len)
                sp += used
            else:                                                    # null: no fields
                i, kind, v = _value(buf, i, h1, scratch, sp, words)
                members = 0 if kind == V_NONE else -1
        else:
            i, kind, v = _value(buf, i, h1, scratch, sp, words)
            tk = _top_key(buf, ks, kn, words)
            if tk >= 0:
                if kind != V_INT or v < -2147483648 or v > 2147483647:
                    return np.int64(-1), np.int64(0), np.int64(-1), np.int64(0)
                top[tk] = v
        if i < 0:
            break
        more, i = _after(buf, i, h1)
    if more != 0 or _ws(buf, i, h1) != h1:
        return np.int64(-1), np.int64(0), np.int64(-1), np.int64(0)
    return fend, h1, members, sp - s0


# the needles read_sends looks for in a send's properties (keys[3], at keys[4]):
# a delay, a delivery time, a transaction (not the lane's), the cluster (added
# when absent), the UNIQ_KEY and TAGS keys (read, not looked for), WAIT=false
N_DELAY, N_TIMER, N_TRAN, N_CLUSTER, N_UNIQ, N_TAGS, N_NO_WAIT = range(7)
_SOUGHT = (1 << N_DELAY) | (1 << N_TIMER) | (1 << N_TRAN) | (1 << N_CLUSTER) | (1 << N_NO_WAIT)
_ROUTED = (1 << N_DELAY) | (1 << N_TIMER) | (1 << N_TRAN)


@njit(**JIT)
def _first_bytes(needles, noffs):
    """A table: byte → the bits of the sought needles that start with it."""
    table = np.zeros(256, np.int64)
    for j in range(noffs.shape[0] - 1):
        if _SOUGHT >> j & 1:
            table[needles[noffs[j]]] |= 1 << j
    return table


@njit(**JIT)
def _found(buf, s, n, needles, noffs, table):
    """The bits of the sought needles that occur in buf[s:s+n] (Python's
    ``in``), in one pass: only where a byte starts one is it compared."""
    got = np.int64(0)
    e = s + n
    for p in range(s, e):
        bits = table[buf[p]] & ~got
        while bits:
            j = np.int64(0)
            while not bits >> j & 1:
                j += 1
            bits &= ~(np.int64(1) << j)
            a = noffs[j]
            m = noffs[j + 1] - a
            if p + m <= e:
                k = np.int64(1)
                while k < m and buf[p + k] == needles[a + k]:
                    k += 1
                if k == m:
                    got |= np.int64(1) << j
    return got


@njit(**JIT)
def _key_hash(buf, s, n, uniq, t):
    """dedup.key_hash of the properties buf[s:s+n]: the CRC-32 (never 0) of
    the value of the first UNIQ_KEY piece, 0 when there is none or it is
    empty."""
    m = uniq.shape[0]
    e = s + n
    p = s
    while p + m <= e:
        if p == s or buf[p - 1] == 2:
            ok = True
            for k in range(m):
                if buf[p + k] != uniq[k]:
                    ok = False
                    break
            if ok:
                v = p + m
                w = v
                while w < e and buf[w] != 2:
                    w += 1
                if w == v:
                    return np.int64(0)
                h = crc32(buf, v, w, t)
                return h if h != 0 else np.int64(1)
        p += 1
    return np.int64(0)


@njit(**JIT)
def read_sends(buf, pos, end, max_frames, keys, cluster, max_body, t, out, scratch):
    """Read single sends from buf[pos:end] (see the module's header);
    ``keys``: the V1 field names (joined) and their offsets, the needles
    (see ``lane.KEYS``); ``cluster``: ``CLUSTER\\x01<name>``. Returns how
    many frames were taken; ``out[i, F_END]`` is where frame i ends.
    ``scratch`` holds at least 2 × (end - pos) plus (len(cluster) + 1)
    per frame bytes (every string decoded, the properties once more)."""
    v1_names = keys[0]
    v1_offs = keys[1]
    words = keys[2]            # WORDS: literals, then the header's keys
    needles = keys[3]          # DELAY\x01 TIMER_ TRAN_MSG\x01 CLUSTER\x01 UNIQ_KEY\x01 TAGS
    #                            WAIT\x01false
    noffs = keys[4]
    kinds, vals, key_at, key_len, top = _header_arrays()
    slot_m = np.empty(N_X, np.int64)
    nums = np.zeros(4, np.int64)
    uniq = needles[noffs[N_UNIQ]:noffs[N_UNIQ + 1]]
    tags = needles[noffs[N_TAGS]:noffs[N_TAGS + 1]]
    table = _first_bytes(needles, noffs)
    in_cluster = _found(cluster, 0, cluster.shape[0], needles, noffs, table)
    sp = np.int64(0)
    n = 0
    ptopic_s = np.int64(-1)
    ptopic_n = np.int64(0)
    while n < max_frames:
        fend, bs, members, used = _frame(buf, pos, end, scratch, sp, words, kinds, vals, key_at,
                                         key_len, top)
        if fend < 0 or (top[0] != SEND_V1 and top[0] != SEND_V2) or top[2] != 0 or members < 0:
            break
        sp += used
        code = top[0]
        opaque = top[1]
        # the send's fields, the last of a repeated key winning
        for x in range(N_X):
            slot_m[x] = -1
        for m in range(members):
            x = _field_slot(buf, key_at[m], key_len[m], code, v1_names, v1_offs)
            if x >= 0:
                slot_m[x] = m if kinds[m] != V_NONE else -1
        ok = slot_m[X_GROUP] >= 0 and slot_m[X_TOPIC] >= 0 and kinds[slot_m[X_TOPIC]] == V_STR
        for k in range(4):                        # queueId, sysFlag, bornTimestamp, flag
            if not ok:
                break
            m = slot_m[X_QID + k]
            if m < 0:
                ok = False
            elif kinds[m] == V_INT:
                nums[k] = vals[2 * m]
            elif kinds[m] == V_STR:
                ok, nums[k] = _dec(scratch, vals[2 * m], vals[2 * m + 1])
            else:
                ok = False
        if ok:                                     # reconsumeTimes: absent, "" or 0
            m = slot_m[X_RECONSUME]
            if m >= 0:
                if kinds[m] == V_INT:
                    ok = vals[2 * m] == 0
                elif kinds[m] == V_STR:
                    if vals[2 * m + 1] > 0:
                        ok2, r = _dec(scratch, vals[2 * m], vals[2 * m + 1])
                        ok = ok2 and r == 0
                else:
                    ok = False
        if ok:                                     # batch: not "true"/"1" (any case), not true/1
            m = slot_m[X_BATCH]
            if m >= 0:
                if kinds[m] == V_TRUE or (kinds[m] == V_INT and vals[2 * m] == 1):
                    ok = False
                elif kinds[m] == V_STR:
                    s = vals[2 * m]
                    ln = vals[2 * m + 1]
                    if ln == 1 and scratch[s] == 49:
                        ok = False
                    elif ln == 4 and (scratch[s] | 32) == 116 and (scratch[s + 1] | 32) == 114 \
                            and (scratch[s + 2] | 32) == 117 and (scratch[s + 3] | 32) == 101:
                        ok = False
        if ok:
            m = slot_m[X_PROPS]
            if m >= 0 and kinds[m] != V_STR:
                ok = False
        qid, sysflag, born_ts, mflag = nums[0], nums[1], nums[2], nums[3]
        if not ok or qid < 0 or qid > 2147483647 or sysflag < -2147483648 \
                or sysflag > 2147483647 or mflag < -2147483648 or mflag > 2147483647 \
                or sysflag & _TRANSACTION_MASK:
            break
        tm = slot_m[X_TOPIC]
        ts_, tn = vals[2 * tm], vals[2 * tm + 1]
        bn = fend - bs
        if tn < 1 or tn > 127 or bn < 1 or bn > max_body:
            break
        # the properties as prepare leaves them: separators cut at the end, the cluster added
        pm = slot_m[X_PROPS]
        ps = sp
        pn = np.int64(0)
        if pm >= 0:
            pn = vals[2 * pm + 1]
            copy_bytes(scratch, ps, scratch, vals[2 * pm], pn)
            while pn > 0 and scratch[ps + pn - 1] == 2:
                pn -= 1
        found = _found(scratch, ps, pn, needles, noffs, table)
        if not found >> N_CLUSTER & 1:       # (no needle holds 0x02: none spans the joint)
            if pn > 0:
                scratch[ps + pn] = 2
                pn += 1
            copy_bytes(scratch, ps + pn, cluster, 0, cluster.shape[0])
            pn += cluster.shape[0]
            found |= in_cluster
        if pn > 32767 or found & _ROUTED:
            break
        sp = ps + pn
        vpos, vlen = find_property(scratch, ps, pn, tags)
        r = out[n]
        r[F_END] = fend
        r[F_OPAQUE] = opaque
        r[F_TOPIC_OFF] = ts_
        r[F_TOPIC_LEN] = tn
        r[F_QID] = qid
        r[F_SYSFLAG] = sysflag
        r[F_BORN_TS] = born_ts
        r[F_FLAG] = mflag
        r[F_PROPS_OFF] = ps
        r[F_PROPS_LEN] = pn
        r[F_BODY_OFF] = bs
        r[F_BODY_LEN] = bn
        r[F_TAGS_CODE] = java_hash_utf8(scratch, vpos, vlen) if vpos >= 0 and vlen > 0 else 0
        r[F_KEY_HASH] = _key_hash(scratch, ps, pn, uniq, t)
        same = ptopic_n == tn
        if same:
            for k in range(tn):
                if scratch[ptopic_s + k] != scratch[ts_ + k]:
                    same = False
                    break
        r[F_NEW_TOPIC] = 0 if same else 1
        ptopic_s, ptopic_n = ts_, tn
        r[F_SIZE] = 88 + bn + 1 + tn + 2 + pn        # the record: both hosts IPv4
        r[F_NO_WAIT] = found >> N_NO_WAIT & 1          # answered before the flush
        n += 1
        pos = fend
    return n


# rows of encode_sends' ``srt``, one column per frame in the order written
S_FRAME, S_POS, S_SIZE, S_TAGS, S_KEY = range(5)
N_S = 5


@njit(inline="always", **JIT)
def _queue_key(out, tix, f):
    return (tix[f] << 32) | out[f, F_QID]


@njit(**JIT)
def encode_sends(buf, scratch, out, n, tix, sysflag_or, born, store, now, t, recs, srt, groups):
    """Write the records of the ``n`` frames ``read_sends`` took into
    ``recs``, each queue's together (by topic index ``tix[i]`` and queue
    id), in the order they came within a queue. Per record written, in
    ``srt``'s columns: its frame (S_FRAME), its place in its queue's run
    (S_POS), its size, tags code and UNIQ_KEY hash (contiguous rows: a
    run's slices are an ``EncodedBatch``'s arrays). Per queue run g:
    ``groups[0, g]`` its first column and ``groups[1, g]`` its first byte
    (``groups[:, ng]``: the ends). ``sysflag_or[i]``: bits to add to frame
    i's sysFlag (MULTI_TAG); ``born``/``store``: the two hosts, IPv4 and
    port, 8 bytes each. Returns the number of runs, ng."""
    order = srt[S_FRAME]
    for i in range(n):                     # a stable insertion sort: n is at most a chunk
        key = _queue_key(out, tix, i)
        j = i - 1
        while j >= 0 and _queue_key(out, tix, order[j]) > key:
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = i
    p = np.int64(0)
    ng = 0
    base = np.int64(0)
    prev = np.int64(-1)
    for k in range(n):
        f = order[k]
        key = _queue_key(out, tix, f)
        if k == 0 or key != prev:
            groups[0, ng] = k
            groups[1, ng] = p
            ng += 1
            base = p
            prev = key
        r = out[f]
        total = r[F_SIZE]
        bn = r[F_BODY_LEN]
        tn = r[F_TOPIC_LEN]
        pn = r[F_PROPS_LEN]
        bs = r[F_BODY_OFF]
        srt[S_POS, k] = p - base
        srt[S_SIZE, k] = total
        srt[S_TAGS, k] = r[F_TAGS_CODE]
        srt[S_KEY, k] = r[F_KEY_HASH]
        st_i32(recs, p, total)
        st_i32(recs, p + 4, np.int64(0xDAA320A7))
        st_i32(recs, p + 8, crc32(buf, bs, bs + bn, t) & 0x7FFFFFFF)
        st_i32(recs, p + 12, r[F_QID])
        st_i32(recs, p + 16, r[F_FLAG])
        st_i64(recs, p + 20, 0)
        st_i64(recs, p + 28, 0)
        st_i32(recs, p + 36, (r[F_SYSFLAG] | sysflag_or[f]) & ~_HOST_FLAGS)
        st_i64(recs, p + 40, r[F_BORN_TS])
        copy_bytes(recs, p + 48, born, 0, 8)
        st_i64(recs, p + 56, now)
        copy_bytes(recs, p + 64, store, 0, 8)
        st_i32(recs, p + 72, 0)
        st_i64(recs, p + 76, 0)
        st_i32(recs, p + 84, bn)
        copy_bytes(recs, p + 88, buf, bs, bn)
        q = p + 88 + bn
        recs[q] = tn
        copy_bytes(recs, q + 1, scratch, r[F_TOPIC_OFF], tn)
        q += 1 + tn
        st_i16(recs, q, pn)
        copy_bytes(recs, q + 2, scratch, r[F_PROPS_OFF], pn)
        p += total
    groups[0, ng] = n
    groups[1, ng] = p
    return ng


@njit(**JIT)
def place_answers(out, srt, groups, ng, gphy, gq, gqid, sel, opaque, phy, qid, qoff):
    """The answers of the runs appended whole (``gphy[g] >= 0``: the run's
    CommitLog offset, ``gq[g]`` its first queue offset, ``gqid[g]`` the
    queue to name), for the frames ``sel`` picks (0: all, 1: those not
    saying WAIT=false, 2: those saying it): each one's opaque, CommitLog
    offset, queue and queue offset, for ``send_ok_frames``. Returns how
    many."""
    m = 0
    for g in range(ng):
        if gphy[g] < 0:
            continue
        s = groups[0, g]
        for k in range(s, groups[0, g + 1]):
            f = srt[S_FRAME, k]
            if sel != 0 and (out[f, F_NO_WAIT] != 0) != (sel == 2):
                continue
            opaque[m] = out[f, F_OPAQUE]
            phy[m] = gphy[g] + srt[S_POS, k]
            qid[m] = gqid[g]
            qoff[m] = gq[g] + k - s
            m += 1
    return m


@njit(inline="always", **JIT)
def _put_dec(o, p, v):
    if v < 0:
        o[p] = 45
        p += 1
        v = -v
    d = 1
    x = v
    while x >= 10:
        x //= 10
        d += 1
    for k in range(d - 1, -1, -1):
        o[p + k] = 48 + v % 10
        v //= 10
    return p + d


@njit(**JIT)
def send_ok_frames(template, toffs, prefix, opaque, phy, qid, qoff, n, o):
    """The SUCCESS answer of n sends (``remoting.send_ok_head``'s bytes for
    opaque[i], msgId prefix + phy[i] in 16 hex digits, qid[i], qoff[i]),
    one after another into ``o``; the template's five pieces are
    template[toffs[k]:toffs[k + 1]]. Returns the bytes written."""
    p = np.int64(0)
    for i in range(n):
        h = p + 8
        q = h
        for piece in range(5):
            a = toffs[piece]
            copy_bytes(o, q, template, a, toffs[piece + 1] - a)
            q += toffs[piece + 1] - a
            if piece == 0:
                q = _put_dec(o, q, opaque[i])
            elif piece == 1:
                copy_bytes(o, q, prefix, 0, prefix.shape[0])
                q += prefix.shape[0]
                v = phy[i]
                for k in range(15, -1, -1):
                    c = v & 15
                    o[q + k] = 48 + c if c < 10 else 55 + c
                    v >>= 4
                q += 16
            elif piece == 2:
                q = _put_dec(o, q, qid[i])
            elif piece == 3:
                q = _put_dec(o, q, qoff[i])
        st_i32(o, p, q - h + 4)
        st_i32(o, p + 4, q - h)
        p = q
    return p


# ---------------------------------------------------------------- pulls
# read_pulls' rows: where the frame ends, its opaque, the group's and the
# topic's names (decoded, in ``scratch``), the queue, offset, maxMsgNums and
# sysFlag, the commitOffset (and whether it was given as a number), the
# subscription and expressionType (offset -1: absent or null; the
# subscription counts only with PULL_SUBSCRIPTION set), and whether the
# four names differ from the frame before's
(P_END, P_OPAQUE, P_GROUP_OFF, P_GROUP_LEN, P_TOPIC_OFF, P_TOPIC_LEN, P_QID, P_OFFSET, P_MAX,
 P_SYSFLAG, P_COMMIT, P_HAS_COMMIT, P_SUB_OFF, P_SUB_LEN, P_TYPE_OFF, P_TYPE_LEN, P_NEW) = range(17)
N_P = 17
PULL = 11
# the header fields a pull reads (handlers/pull.py), by slot
(Y_GROUP, Y_TOPIC, Y_QID, Y_OFFSET, Y_MAX, Y_SYSFLAG, Y_COMMIT, Y_SUB, Y_TYPE) = range(9)
N_Y = 9
_PULL_SUBSCRIPTION = 0x4               # PullSysFlag


@njit(inline="always", **JIT)
def _same(scratch, a, b, n):
    for k in range(n):
        if scratch[a + k] != scratch[b + k]:
            return False
    return True


@njit(**JIT)
def read_pulls(buf, pos, end, max_frames, keys, out, scratch):
    """Read PULL_MESSAGE requests from buf[pos:end] while each is one the
    pull lane can take: a whole frame, a JSON header in the subset (see the
    module's header), code 11, flag 0 (a request that wants its answer),
    the group and topic given as strings, queueId, queueOffset, maxMsgNums
    and sysFlag as decimal numbers (strings or integers), commitOffset,
    subscription and expressionType strings, null or absent. ``keys``:
    the names of those nine fields (joined) and their offsets, the JSON
    words. Returns how many frames were read (``out``'s rows, see P_*);
    ``scratch`` holds at least end - pos bytes. What it stops at, the way
    every request goes reads, and answers."""
    names = keys[0]
    offs = keys[1]
    words = keys[2]
    kinds, vals, key_at, key_len, top = _header_arrays()
    slot_m = np.empty(N_Y, np.int64)
    nums = np.zeros(5, np.int64)
    sp = np.int64(0)
    n = 0
    while n < max_frames:
        fend, bs, members, used = _frame(buf, pos, end, scratch, sp, words, kinds, vals, key_at,
                                         key_len, top)
        if fend < 0 or top[0] != PULL or top[2] != 0 or members < 0:
            break
        sp += used
        for y in range(N_Y):
            slot_m[y] = -1
        for m in range(members):         # the last of a repeated key wins
            for y in range(N_Y):
                if _key_eq(buf, key_at[m], key_len[m], names, offs[y], offs[y + 1]):
                    slot_m[y] = m if kinds[m] != V_NONE else -1
                    break
        ok = True
        for y in range(2):                # consumerGroup, topic: strings
            m = slot_m[y]
            if m < 0 or kinds[m] != V_STR:
                ok = False
        for y in range(5):                # queueId … sysFlag: numbers; commitOffset: maybe
            if not ok:
                break
            m = slot_m[Y_QID + y]
            good = False
            v = np.int64(0)
            if m >= 0 and kinds[m] == V_INT:
                good, v = True, vals[2 * m]
            elif m >= 0 and kinds[m] == V_STR:
                good, v = _dec(scratch, vals[2 * m], vals[2 * m + 1])
            if y < 4:
                ok = good
            nums[y] = v if good else np.int64(0)
            if y == 4:
                out[n, P_HAS_COMMIT] = 1 if good else 0
        for y in range(Y_SUB, N_Y):      # subscription, expressionType: strings or nothing
            m = slot_m[y]
            if m >= 0 and kinds[m] != V_STR:
                ok = False
        if not ok:
            break
        r = out[n]
        r[P_END] = fend
        r[P_OPAQUE] = top[1]
        gm, tm = slot_m[Y_GROUP], slot_m[Y_TOPIC]
        r[P_GROUP_OFF], r[P_GROUP_LEN] = vals[2 * gm], vals[2 * gm + 1]
        r[P_TOPIC_OFF], r[P_TOPIC_LEN] = vals[2 * tm], vals[2 * tm + 1]
        r[P_QID], r[P_OFFSET], r[P_MAX], r[P_SYSFLAG], r[P_COMMIT] = \
            nums[0], nums[1], nums[2], nums[3], nums[4]
        sm = slot_m[Y_SUB] if nums[3] & _PULL_SUBSCRIPTION else np.int64(-1)
        r[P_SUB_OFF], r[P_SUB_LEN] = (vals[2 * sm], vals[2 * sm + 1]) if sm >= 0 else (-1, 0)
        em = slot_m[Y_TYPE]
        r[P_TYPE_OFF], r[P_TYPE_LEN] = (vals[2 * em], vals[2 * em + 1]) if em >= 0 else (-1, 0)
        new = n == 0
        if not new:
            p = out[n - 1]
            for a, b in ((P_GROUP_OFF, P_GROUP_LEN), (P_TOPIC_OFF, P_TOPIC_LEN),
                         (P_SUB_OFF, P_SUB_LEN), (P_TYPE_OFF, P_TYPE_LEN)):
                if (r[a] < 0) != (p[a] < 0) or r[b] != p[b] or (
                        r[a] >= 0 and not _same(scratch, r[a], p[a], r[b])):
                    new = True
                    break
        r[P_NEW] = 1 if new else 0
        n += 1
        pos = fend
    return n
