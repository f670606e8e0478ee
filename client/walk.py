"""A pull's records walked into rows: where each is and whether it is whole.

A pull's body (or the same bytes a direct reader takes from the store) is
records one after another. ``walk`` describes each in a row of
``layout.P_*`` columns — its start, TOTALSIZE, queue offset, sysflag, body
span, TOPICLENGTH position and a status — checking it as a consumer must:
its frame, field lengths adding up to its TOTALSIZE, its body CRC. A record
whose fields or body are bad gets its status and the walk goes on past it;
a frame that is not a record (its magic, TOTALSIZE or hosts do not fit)
ends the walk there, since nothing after it can be found. ``damage``
describes what was left out, as (queue offset or None, why, framed).

Where the store's kernels are installed (the ``broker`` extra) the walk is
``core.records.pull_rows``, numba: 32 records of 100 B in ~6.5 µs, against
~46 µs for ``_rows_here``, the same walk in Python, which a client
installed alone uses. The kernel is loaded once per process in a thread
(``warm_up_decoding``), where numba is wanted anyway: by a consumer that
reads the store directly (with its scan kernel, client/direct.py) or has a
batch listener, as it starts; until then the walk is Python's. A socket
consumer of message listeners never imports numba for it (0.7 s of CPU
from numba's cache, and its memory, to save ~0.8 µs a message). Both decoders build on it: ``MessageBatch``
(client/batch.py) keeps the rows, ``decode_messages`` (client/message.py)
makes a ``MessageExt`` of each once the kernel is loaded (its own loop is
the quicker Python path before).
"""
from __future__ import annotations

import struct
import threading
import zlib

import numpy as np

from shmq.core import layout as L
from shmq.core.layout import (N_PULL, P_QUEUE_OFFSET, P_SIZE, P_START, P_STATUS, PULL_CRC,
                              PULL_FIELDS, PULL_OK)

_WHY = {PULL_FIELDS: "field lengths do not add up to TOTALSIZE {size}",
        PULL_CRC: "body CRC mismatch"}
_HEAD = struct.Struct(">iii8xq8xi")         # TOTALSIZE, MAGIC, BODYCRC, QUEUEOFFSET, SYSFLAG
_I32 = struct.Struct(">i")
_BORN_V6, _STORE_V6 = L.SYSFLAG_BORNHOST_V6, L.SYSFLAG_STOREHOST_V6


def walk(data: bytes, check_crc: bool, kernel_only: bool = False) -> tuple[np.ndarray, int] | None:
    """(rows, where the walk stopped) of the records of ``data``: by the
    kernel where it is loaded, else in Python (and the kernel starts
    loading) — or None with ``kernel_only`` (the caller has a quicker Python
    path of its own, and a process that never starts a consumer, a tool,
    never loads the kernel)."""
    k = _kernel(start=not kernel_only)
    if k is not None:
        out = np.empty((len(data) // L.RECORD_FIXED_BYTES + 1, N_PULL), np.int64)
        n, stop = k(np.frombuffer(data, np.uint8), check_crc, out)
        return out[:n], stop
    return None if kernel_only else _rows_here(data, check_crc)


class CorruptMessage(ValueError):
    """A pulled body holds bytes that are not a stored-message record."""


def kept(data: bytes, rows: np.ndarray, stop: int, skipped: list | None) -> np.ndarray:
    """The rows of the whole records of a walk; what it left out is
    described in ``skipped`` (``damage``), or, without ``skipped``, raises
    CorruptMessage naming the first of it."""
    bad = rows[:, P_STATUS] != PULL_OK
    if stop < len(data) or bad.any():
        found = damage(data, rows, bad, stop)
        if skipped is None:
            raise CorruptMessage(found[0][1])
        skipped.extend(found)
        rows = rows[~bad]
    return rows


def damage(data: bytes, rows: np.ndarray, bad: np.ndarray, stop: int) -> list:
    """What a walk left out, in the order of ``data``: (its queue offset or
    None, why, framed) for each ``bad`` row (framed: the records after it
    were read), then the frame it stopped at, if it stopped before the end."""
    found = []
    for r in rows[bad].tolist():
        why = _WHY[r[P_STATUS]].format(size=r[P_SIZE])
        found.append((r[P_QUEUE_OFFSET], f"record at {r[P_START]}: {why}", True))
    if stop < len(data):
        left = len(data) - stop
        if left < L.RECORD_FIXED_BYTES:
            found.append((None, f"record at {stop}: {left} bytes left, too few for a record",
                          False))
        else:
            size, magic, _, qoff, _ = _HEAD.unpack_from(data, stop)
            found.append((qoff if magic == L.MESSAGE_MAGIC_I32 else None,
                          f"record at {stop}: magic {magic & 0xFFFFFFFF:#x}, TOTALSIZE {size}: "
                          f"not a message record within the {len(data)} bytes", False))
    return found


def _rows_here(data: bytes, check_crc: bool) -> tuple[np.ndarray, int]:
    """``pull_rows`` in Python: the same rows, where numba is not installed."""
    rows = []
    n, pos = len(data), 0
    head, i32, crc32 = _HEAD.unpack_from, _I32.unpack_from, zlib.crc32
    mv = memoryview(data)
    while n - pos >= L.RECORD_FIXED_BYTES:
        size, magic, crc, qoff, sysflag = head(data, pos)
        end = pos + size
        q = pos + 68 + (20 if sysflag & _BORN_V6 else 8) + (20 if sysflag & _STORE_V6 else 8)
        if magic != L.MESSAGE_MAGIC_I32 or size < L.RECORD_FIXED_BYTES or end > n or q + 7 > end:
            break
        blen = i32(data, q)[0]
        t = q + 4 + blen
        status = PULL_OK
        if blen < 0 or t + 3 > end or not 0 < (tl := data[t]) or t + 3 + tl > end or (
                (pl := data[t + 1 + tl] << 8 | data[t + 2 + tl]) >= 0x8000 or t + 3 + tl + pl != end):
            status = PULL_FIELDS
        elif check_crc and crc32(mv[q + 4:t]) & 0x7FFFFFFF != crc:
            status = PULL_CRC
        rows.append((pos, size, qoff, sysflag, q + 4, blen, t, status))
        pos = end
    out = np.array(rows, np.int64).reshape(len(rows), N_PULL)
    return out, pos


# ---------------------------------------------------------------- the kernel
_LOADED = threading.Event()
_loader: list[threading.Thread] = []
_KERNEL: list = []


def _kernel(start: bool):
    """The kernel if loaded; else None, and ``start``: start loading it."""
    if _LOADED.is_set():
        return _KERNEL[0] if _KERNEL else None
    if start and not _loader:
        warm_up_decoding(wait=False)
    return None


def _load() -> None:
    try:
        from shmq.core import jit, records
        jit.load(("pull",))
        _KERNEL.append(records.pull_rows)
    except ImportError:                  # the client alone: no numba
        pass
    finally:
        _LOADED.set()


def warm_up_decoding(wait: bool = True) -> bool:
    """Load the walk's kernel in a thread (once per process); with
    ``wait``, until it is loaded. Pulls are walked in Python meanwhile.
    True once it is loaded (or known absent: the client alone)."""
    if not _loader:
        t = threading.Thread(target=_load, daemon=True, name="shmq-decoding-warm-up")
        _loader.append(t)
        t.start()
    if wait:
        _loader[0].join()
    return _LOADED.is_set()


__all__ = ["CorruptMessage", "damage", "kept", "walk", "warm_up_decoding"]
