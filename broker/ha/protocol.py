"""The HA stream's bytes, sans-I/O (the frames are drawn in ``broker/ha``).

``Reports`` parses what a slave sends (bare int64 offsets), ``Frames`` what
a master sends (12-byte header + CommitLog bytes); both take bytes as they
arrive, in any split, and never touch a socket. A frame whose size is
negative or larger than ``FRAME_BYTES_MAX`` is a ``ProtocolError`` (the
connection is closed); nothing else a peer sends can raise.
"""
from __future__ import annotations

import struct

HEADER = struct.Struct(">qi")        # masterPhyOffset, bodySize
REPORT = struct.Struct(">q")         # slaveMaxPhyOffset
HEADER_BYTES = HEADER.size           # 12 (HAConnection.WriteSocketService.headerSize)
REPORT_BYTES = REPORT.size           # 8
# a body larger than this is not a frame (RocketMQ's masters send <= 32 KiB;
# haTransferBatchSize may be raised, never past this)
FRAME_BYTES_MAX = 64 << 20


class ProtocolError(ValueError):
    """The peer sent something the HA protocol has no meaning for."""


def header(offset: int, size: int) -> bytes:
    return HEADER.pack(offset, size)


def report(offset: int) -> bytes:
    return REPORT.pack(offset)


class Reports:
    """A slave's reports as they arrive. ``feed`` returns the last complete
    offset in what arrived (a master acts on the newest only, as RocketMQ's
    does), or None when no report completed."""

    def __init__(self):
        self.buf = b""

    def feed(self, data: bytes) -> int | None:
        buf = self.buf + data
        whole = len(buf) - len(buf) % REPORT_BYTES
        self.buf = buf[whole:]
        if not whole:
            return None
        return REPORT.unpack_from(buf, whole - REPORT_BYTES)[0]


class Frames:
    """A master's frames as they arrive: ``feed`` returns the (offset,
    body) of every frame completed, in order (a heartbeat's body is empty).
    Bodies are views of the bytes fed, valid as long as those bytes are (a
    reader may read into the same buffer again once it applied them); only
    a frame cut by the end of what arrived is copied, into one buffer of
    its own that the next ``feed`` completes, so a 1 MiB read of 32 KiB
    frames copies one frame at most."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX):
        self.rest = bytearray()         # the start of a frame cut by a read's end
        self.max = frame_bytes_max

    def _size(self, offset: int, size: int) -> int:
        if size < 0 or size > self.max or offset < 0:
            raise ProtocolError(f"HA frame header: offset {offset}, size {size}")
        return size

    def feed(self, data) -> list[tuple[int, memoryview]]:
        mv = memoryview(data).cast("B")
        out = []
        pos, n = 0, len(mv)
        rest = self.rest
        if rest:                           # complete the cut frame, taking only its bytes
            if len(rest) < HEADER_BYTES:
                pos = min(HEADER_BYTES - len(rest), n)
                rest += mv[:pos]
                if len(rest) < HEADER_BYTES:
                    return out
            offset, size = HEADER.unpack_from(rest)
            take = min(HEADER_BYTES + self._size(offset, size) - len(rest), n - pos)
            rest += mv[pos:pos + take]
            pos += take
            if len(rest) < HEADER_BYTES + size:
                return out
            out.append((offset, memoryview(rest)[HEADER_BYTES:]))
            self.rest = bytearray()
        while n - pos >= HEADER_BYTES:
            offset, size = HEADER.unpack_from(mv, pos)
            if n - pos - HEADER_BYTES < self._size(offset, size):
                break
            start = pos + HEADER_BYTES
            out.append((offset, mv[start:start + size]))
            pos = start + size
        if pos < n:
            self.rest = bytearray(mv[pos:])
        return out
