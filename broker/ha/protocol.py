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
    Bodies are views of the bytes fed, valid until the next ``feed``: one
    copy joins what is left over to what arrives, nothing else is copied."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX):
        self.rest = b""
        self.max = frame_bytes_max

    def feed(self, data) -> list[tuple[int, memoryview]]:
        buf = self.rest + data if self.rest else bytes(data)
        mv = memoryview(buf)
        out = []
        pos = 0
        n = len(buf)
        while n - pos >= HEADER_BYTES:
            offset, size = HEADER.unpack_from(buf, pos)
            if size < 0 or size > self.max or offset < 0:
                raise ProtocolError(f"HA frame header: offset {offset}, size {size}")
            if n - pos - HEADER_BYTES < size:
                break
            start = pos + HEADER_BYTES
            out.append((offset, mv[start:start + size]))
            pos = start + size
        self.rest = buf[pos:]
        return out
