"""Bytes: big-endian integers, CRC-32 and Java's String.hashCode over UTF-8.

The helpers every other kernel module builds on. All multi-byte integers in
the store are big-endian (``layout``); numba does not support non-native
byte orders, so kernels read and write them with ``ld_*``/``st_*``. ``crc32`` is zlib's (slice-by-16 over
``CRC_TABLES``); ``java_hash_utf8`` is ``new String(bytes, UTF_8).hashCode()``
without building the string (the ConsumeQueue tags code, the IndexFile key
hash). ``JIT`` is the one set of numba options of every kernel.

Under the JIT these helpers are numba intrinsics, machine operations that
numba's array code does not reach: ``ld_*``/``st_*`` are one unaligned load
or store and a byte swap (written byte by byte, a 20-byte ConsumeQueue
unit took 14 ns; LLVM did not merge the bytes), ``copy_bytes`` is LLVM's
memcpy (a slice assignment between uint8 arrays compiles to a loop of a
byte a step, ~1 cycle a byte) and ``ld_le64`` one unaligned little-endian
load (the CRC's). They take 1-D C-contiguous uint8 arrays and integers; a
call with anything else fails to compile. With the JIT off they are the
plain Python functions of the same names, which the JIT-off run covers.
"""
from __future__ import annotations

import numpy as np
from numba import config, njit

# cache=True: a new process loads machine code from __pycache__ instead of
# compiling (see the package header for what keys that cache).
JIT = dict(cache=True, nogil=True, boundscheck=False)

# ------------------------------------------- big-endian, copies, raw loads
if config.DISABLE_JIT:
    # The plain-Python twins the JIT-off run executes (and covers); under
    # the JIT the intrinsics below take their names.
    def ld_u32(b, p):
        return ((np.int64(b[p]) << 24) | (np.int64(b[p + 1]) << 16)
                | (np.int64(b[p + 2]) << 8) | np.int64(b[p + 3]))

    def ld_i32(b, p):
        v = ld_u32(b, p)
        return v - 4294967296 if v >= 2147483648 else v

    def ld_i16(b, p):
        v = (np.int64(b[p]) << 8) | np.int64(b[p + 1])
        return v - 65536 if v >= 32768 else v

    def ld_i64(b, p):
        return (ld_u32(b, p) << 32) | ld_u32(b, p + 4)

    def st_i32(b, p, v):
        b[p] = (v >> 24) & 0xFF
        b[p + 1] = (v >> 16) & 0xFF
        b[p + 2] = (v >> 8) & 0xFF
        b[p + 3] = v & 0xFF

    def st_i16(b, p, v):
        b[p] = (v >> 8) & 0xFF
        b[p + 1] = v & 0xFF

    def st_i64(b, p, v):
        st_i32(b, p, (v >> 32) & 0xFFFFFFFF)
        st_i32(b, p + 4, v & 0xFFFFFFFF)

    def copy_bytes(dst, d, src, s, n):
        """dst[d:d + n] = src[s:s + n] (uint8 arrays, C-contiguous)."""
        dst[d:d + n] = src[s:s + n]

    def ld_le64(b, p):
        """The little-endian uint64 at b[p:p + 8]."""
        return np.uint64(int.from_bytes(b[p:p + 8].tobytes(), "little"))
else:  # pragma: no cover  (compile-time code: the JIT-off run uses the twins above)
    import llvmlite.ir as _ir
    from numba.core import cgutils as _cg
    from numba.core import types as _t
    from numba.extending import intrinsic

    def _flat_u8(a) -> bool:
        return isinstance(a, _t.Array) and a.dtype == _t.uint8 and a.ndim == 1 and a.layout == "C"

    def _at(context, builder, arr_type, arr, index, index_type, width=8):
        """A pointer to ``width``-bit integers at byte ``index`` of a uint8
        array (an unsigned index widened as unsigned: gep sign-extends)."""
        if not index_type.signed and index.type.width < 64:
            index = builder.zext(index, _ir.IntType(64))
        p = builder.gep(context.make_array(arr_type)(context, builder, arr).data, [index])
        return p if width == 8 else builder.bitcast(p, _ir.IntType(width).as_pointer())

    def _load(width: int, signed: bool, swap: bool, result):
        """An intrinsic (b, p) → the ``width``-bit integer at b[p], one
        unaligned load, byte-swapped (big-endian) if ``swap``, extended to
        ``result``."""
        @intrinsic
        def load(typingctx, b, p):
            if not (_flat_u8(b) and isinstance(p, _t.Integer)):
                return None

            def codegen(context, builder, signature, args):
                ty = signature.args
                v = builder.load(_at(context, builder, ty[0], args[0], args[1], ty[1], width),
                                 align=1)
                if swap:
                    v = builder.bswap(v)
                to = context.get_value_type(result)
                if to.width == width:
                    return v
                return builder.sext(v, to) if signed else builder.zext(v, to)
            return result(b, p), codegen
        return load

    def _store(width: int):
        """An intrinsic (b, p, v): the low ``width`` bits of the integer v at
        b[p], big-endian, one unaligned store."""
        @intrinsic
        def store(typingctx, b, p, v):
            if not (_flat_u8(b) and b.mutable and isinstance(p, _t.Integer)
                    and isinstance(v, _t.Integer)):
                return None

            def codegen(context, builder, signature, args):
                ty = signature.args
                x = context.cast(builder, args[2], ty[2], _t.int64)
                if width < 64:
                    x = builder.trunc(x, _ir.IntType(width))
                builder.store(builder.bswap(x),
                              _at(context, builder, ty[0], args[0], args[1], ty[1], width), align=1)
                return context.get_dummy_value()
            return _t.void(b, p, v), codegen
        return store

    ld_u32 = _load(32, False, True, _t.int64)
    ld_i32 = _load(32, True, True, _t.int64)
    ld_i16 = _load(16, True, True, _t.int64)
    ld_i64 = _load(64, True, True, _t.int64)
    ld_le64 = _load(64, False, False, _t.uint64)
    st_i16, st_i32, st_i64 = _store(16), _store(32), _store(64)

    @intrinsic
    def copy_bytes(typingctx, dst, d, src, s, n):
        if not (_flat_u8(dst) and _flat_u8(src) and dst.mutable
                and all(isinstance(x, _t.Integer) for x in (d, s, n))):
            return None
        sig = _t.void(dst, d, src, s, n)

        def codegen(context, builder, signature, args):
            ty = signature.args
            n = args[4]
            if not ty[4].signed and n.type.width < 64:
                n = builder.zext(n, _ir.IntType(64))
            _cg.raw_memcpy(builder, _at(context, builder, ty[0], args[0], args[1], ty[1]),
                           _at(context, builder, ty[2], args[2], args[3], ty[3]), n, 1)
            return context.get_dummy_value()
        return sig, codegen


# --------------------------------------------------------------------- CRC32
def make_crc_tables() -> np.ndarray:
    """Slice-by-16 tables for the zlib CRC-32 (reflected 0xEDB88320), flattened:
    table k (the CRC of a byte followed by k zero bytes) is t[256*k : 256*k + 256]."""
    t = np.zeros((16, 256), dtype=np.uint32)
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t[0, n] = c
    for k in range(1, 16):
        for n in range(256):
            t[k, n] = (int(t[k - 1, n]) >> 8) ^ int(t[0, int(t[k - 1, n]) & 0xFF])
    return t.ravel()


CRC_TABLES = make_crc_tables()
CRC_TABLES.flags.writeable = False   # an input of every kernel that checks CRCs (core/jit.py)

_UFF = np.uint64(0xFF)


@njit(inline="always", **JIT)
def _t8(t, base, v):
    """The eight lookups of the little-endian word ``v``: its byte j in
    table base + 7 - j (slice-by-8 within slice-by-16)."""
    return (t[np.uintp(((base + 7) << 8) + (v & _UFF))]
            ^ t[np.uintp(((base + 6) << 8) + ((v >> np.uint64(8)) & _UFF))]
            ^ t[np.uintp(((base + 5) << 8) + ((v >> np.uint64(16)) & _UFF))]
            ^ t[np.uintp(((base + 4) << 8) + ((v >> np.uint64(24)) & _UFF))]
            ^ t[np.uintp(((base + 3) << 8) + ((v >> np.uint64(32)) & _UFF))]
            ^ t[np.uintp(((base + 2) << 8) + ((v >> np.uint64(40)) & _UFF))]
            ^ t[np.uintp(((base + 1) << 8) + ((v >> np.uint64(48)) & _UFF))]
            ^ t[np.uintp((base << 8) + (v >> np.uint64(56)))])


@njit(**JIT)
def crc32(buf, start, end, t):
    """zlib.crc32(buf[start:end]) by slice-by-16 over the flat tables ``t``:
    16 bytes (two 8-byte loads) a step, 1.7x slice-by-8's speed on 100 B
    bodies, 2.6 GB/s on long ones. Unsigned arithmetic and uintp indices
    keep numba from adding negative-index fix-ups to every lookup."""
    c = np.uint64(0xFFFFFFFF)
    i = start
    while i + 16 <= end:
        c = np.uint64(_t8(t, 8, c ^ ld_le64(buf, i)) ^ _t8(t, 0, ld_le64(buf, i + 8)))
        i += 16
    if i + 8 <= end:
        c = np.uint64(_t8(t, 0, c ^ ld_le64(buf, i)))
        i += 8
    while i < end:
        c = np.uint64(t[np.uintp((c ^ np.uint64(buf[i])) & _UFF)]) ^ (c >> np.uint64(8))
        i += 1
    return np.int64(c ^ np.uint64(0xFFFFFFFF))


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
