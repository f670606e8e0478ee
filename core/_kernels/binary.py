"""Bytes: big-endian integers, CRC-32 and Java's String.hashCode over UTF-8.

The helpers every other kernel module builds on. All multi-byte integers in
the store are big-endian (``layout``); numba does not support non-native
byte orders, so kernels read and write bytes by hand (``ld_*``/``st_*``,
inlined into their callers). ``crc32`` is zlib's (slice-by-8 over
``CRC_TABLES``); ``java_hash_utf8`` is ``new String(bytes, UTF_8).hashCode()``
without building the string (the ConsumeQueue tags code, the IndexFile key
hash). ``JIT`` is the one set of numba options of every kernel.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# cache=True: a new process loads machine code from __pycache__ instead of
# compiling (see the package header for what keys that cache).
JIT = dict(cache=True, nogil=True, boundscheck=False)

# ---------------------------------------------------------------- big-endian
@njit(inline="always", **JIT)
def ld_u32(b, p):
    return ((np.int64(b[p]) << 24) | (np.int64(b[p + 1]) << 16)
            | (np.int64(b[p + 2]) << 8) | np.int64(b[p + 3]))


@njit(inline="always", **JIT)
def ld_i32(b, p):
    v = ld_u32(b, p)
    return v - 4294967296 if v >= 2147483648 else v


@njit(inline="always", **JIT)
def ld_i16(b, p):
    v = (np.int64(b[p]) << 8) | np.int64(b[p + 1])
    return v - 65536 if v >= 32768 else v


@njit(inline="always", **JIT)
def ld_i64(b, p):
    return (ld_u32(b, p) << 32) | ld_u32(b, p + 4)


@njit(inline="always", **JIT)
def st_i32(b, p, v):
    b[p] = (v >> 24) & 0xFF
    b[p + 1] = (v >> 16) & 0xFF
    b[p + 2] = (v >> 8) & 0xFF
    b[p + 3] = v & 0xFF


@njit(inline="always", **JIT)
def st_i16(b, p, v):
    b[p] = (v >> 8) & 0xFF
    b[p + 1] = v & 0xFF


@njit(inline="always", **JIT)
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


@njit(inline="always", **JIT)
def _le32(buf, i):
    return (np.uint32(buf[i]) | (np.uint32(buf[i + 1]) << _U8)
            | (np.uint32(buf[i + 2]) << _U16) | (np.uint32(buf[i + 3]) << _U24))


@njit(**JIT)
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
@njit(inline="always", **JIT)
def _utf8_step(buf, i, end):
    """(code point, bytes consumed) of the UTF-8 sequence at buf[i]. A
    malformed sequence decodes as U+FFFD and consumes its maximal valid
    prefix (at least one byte): the Unicode practice that Java's and
    Python's decoders follow."""
    b0 = np.int64(buf[i])
    # Its one caller (_java_hash_more) decodes ASCII itself; kept so the step is whole.
    if b0 < 0x80:   # pragma: no cover
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


@njit(inline="always", **JIT)
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


@njit(**JIT)
def java_hash_utf8(buf, start, n):
    """Java ``String.hashCode`` of the UTF-8 bytes buf[start:start+n] as
    ``new String(bytes, UTF_8)`` decodes them, computed over UTF-16 code
    units. Signed int32."""
    h = _java_hash_more(np.int64(0), buf, start, start + n)
    return h - 4294967296 if h >= 2147483648 else h
