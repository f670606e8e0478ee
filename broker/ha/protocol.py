"""The HA stream's bytes, sans-I/O (the frames are drawn in ``broker/ha``).

``Reports`` parses what a slave sends (bare int64 offsets), ``Frames`` what
a master sends (12-byte header + CommitLog bytes, handed on as the body's
bytes arrive: a 1 MiB frame is neither held back nor copied until whole);
both take bytes as they arrive, in any split, and never touch a socket. A
frame whose size is negative or larger than ``FRAME_BYTES_MAX`` is a ``ProtocolError`` (the
connection is closed); nothing else a peer sends can raise.
"""
from __future__ import annotations

import struct

HEADER = struct.Struct(">qi")        # masterPhyOffset, bodySize
REPORT = struct.Struct(">q")         # slaveMaxPhyOffset
HEADER_BYTES = HEADER.size           # 12 (HAConnection.WriteSocketService.headerSize)
REPORT_BYTES = REPORT.size           # 8
# a body larger than this is not a frame (RocketMQ's masters send <= 32 KiB,
# shmq's 1 MiB; haTransferBatchSize may be raised, never past this)
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
    """A master's frames as they arrive: ``feed`` returns (offset, piece)
    for the body bytes in what arrived, in order, each piece at the offset
    its bytes have in the master's CommitLog. Pieces are views of the bytes
    fed, valid as long as those bytes are (a reader may read into the same
    buffer again once it applied them); a body cut by the end of what
    arrived goes on in the next ``feed``'s first piece, so no body byte is
    ever copied, whatever the frame's size: only a header cut by a read's
    end is kept (12 bytes at most). A heartbeat (size 0) is one empty piece
    at its offset."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX):
        self.head = bytearray()         # the start of a header cut by a read's end
        self.at = 0                     # where the frame's next body byte lies
        self.left = 0                   # body bytes of the frame still to come
        self.max = frame_bytes_max

    def _begin(self, offset: int, size: int, out: list, empty) -> None:
        if size < 0 or size > self.max or offset < 0:
            raise ProtocolError(f"HA frame header: offset {offset}, size {size}")
        if not size:
            out.append((offset, empty))
        self.at, self.left = offset, size

    def feed(self, data) -> list[tuple[int, memoryview]]:
        mv = memoryview(data).cast("B")
        out = []
        pos, n = 0, len(mv)
        while pos < n:
            if self.left:                  # the body of the frame begun before
                k = min(self.left, n - pos)
                out.append((self.at, mv[pos:pos + k]))
                self.at += k
                self.left -= k
                pos += k
            elif self.head or n - pos < HEADER_BYTES:     # a header cut by a read's end
                take = min(HEADER_BYTES - len(self.head), n - pos)
                self.head += mv[pos:pos + take]
                pos += take
                if len(self.head) == HEADER_BYTES:
                    head, self.head = self.head, bytearray()
                    self._begin(*HEADER.unpack(head), out, mv[pos:pos])
            else:
                self._begin(*HEADER.unpack_from(mv, pos), out, mv[pos:pos])
                pos += HEADER_BYTES
        return out
