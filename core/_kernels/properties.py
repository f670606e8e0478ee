"""Properties strings: find a key's value, the tags code, integer properties.

A stored message's properties are ``key 0x01 value`` pieces joined by
``0x02`` (``layout``: Java's ``messageProperties2String``). These kernels find
values in place, as ``MessageDecoder.string2messageProperties`` would read
them: a piece counts only when its key and value are both non-empty, and the
last duplicate wins. Nothing is decoded to text.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .binary import JIT, java_hash_utf8


@njit(inline="always", **JIT)
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


@njit(inline="always", **JIT)
def _is_key(buf, i, sep, key):
    """Is the key of the piece at ``i`` (its 0x01 at ``sep``) ``key``?"""
    if sep - i != key.shape[0]:
        return False
    for k in range(key.shape[0]):
        if buf[i + k] != key[k]:
            return False
    return True


@njit(**JIT)
def find_property(buf, start, n, key):
    """Value (start, length) of property ``key`` in a properties string
    buf[start:start+n], as Java's string2messageProperties would give it (the
    last duplicate wins); (-1, 0) when absent."""
    found_at = np.int64(-1)
    found_len = np.int64(0)
    i = start
    end = start + n
    while i < end:
        sep, j = _piece(buf, i, end)
        # (lengths in bytes or UTF-16 units agree on "non-empty")
        if sep > i and sep < j - 1 and _is_key(buf, i, sep, key):
            found_at = sep + 1
            found_len = j - sep - 1
        i = j + 1
    return found_at, found_len


@njit(**JIT)
def tags_codes(buf, offs, lens, tags_key, out):
    """ConsumeQueue tags code of each properties string buf[offs[i]:+lens[i]]:
    Java hashCode of its TAGS value, 0 when absent or empty."""
    for i in range(offs.shape[0]):
        vpos, vlen = find_property(buf, offs[i], lens[i], tags_key)
        out[i] = java_hash_utf8(buf, vpos, vlen) if vpos >= 0 and vlen > 0 else 0


INT_DIGITS_MAX = 18   # int_properties: never overflows int64; an epoch-ms time has 13


@njit(**JIT)
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
