"""Byte layouts of the store, drawn once (RocketMQ 4.x, big-endian throughout).

This module owns the numbers: offsets, sizes, magic codes, flag bits. It does
no I/O. The numba kernels (``_kernels``) and the pure-Python decoder below both
read their positions from here, so there is one definition of the record.

Stored-message record (IPv4 born and store hosts; each IPv6 host adds 12 bytes
and shifts every later field)::

    off  size  field
      0     4  TOTALSIZE            int32, whole record incl. itself
      4     4  MAGICCODE            int32, 0xDAA320A7
      8     4  BODYCRC              int32, crc32(body) & 0x7FFFFFFF
     12     4  QUEUEID              int32
     16     4  FLAG                 int32, user flag
     20     8  QUEUEOFFSET          int64, index in the ConsumeQueue
     28     8  PHYSICALOFFSET       int64, CommitLog offset of this record
     36     4  SYSFLAG              int32, MessageSysFlag bits
     40     8  BORNTIMESTAMP        int64 ms
     48   8|20 BORNHOST             ip(4|16) + int32 port
     56     8  STORETIMESTAMP       int64 ms
     64   8|20 STOREHOST            ip(4|16) + int32 port
     72     4  RECONSUMETIMES       int32
     76     8  PREPAREDTRANSACTIONOFFSET int64
     84   4+n  BODYLENGTH + BODY
         1+t  TOPICLENGTH (int8, topic <= 127 bytes) + TOPIC
         2+p  PROPERTIESLENGTH (int16) + PROPERTIES

The end of a segment is marked by a BLANK record: TOTALSIZE = bytes left in the
segment, MAGICCODE = 0xCBD43194; the rest of the segment is left as is.

A PAD record (a shmq extension: RocketMQ has none) fills a CommitLog range
that an appender claimed and never finished (it died, or its write failed)
while later claims were written after it (``store`` module: claim, write,
publish). Every scanner skips it as it would a record without a ConsumeQueue
unit; its queue offsets are padding units (size ``CQ_PAD_SIZE``) that pulls
skip, and recovery rewrites them from the fields below::

    off  size  field
      0     4  TOTALSIZE            int32, the whole range (>= 33 + topic)
      4     4  MAGICCODE            int32, 0x53484D51 ("SHMQ")
      8     8  PHYSICALOFFSET       int64, its own position (checked like a record's)
     16     4  QUEUEID              int32
     20     8  QUEUEOFFSET          int64, the first queue offset of the range
     28     4  UNITS                int32, queue offsets it holds (padding units)
     32   1+t  TOPICLENGTH (int8, 1..127) + TOPIC
         rest  zeros

ConsumeQueue unit, 20 bytes, numpy dtype ``CQ_UNIT_DTYPE``::

    off size field
      0   8  commitlog physical offset  int64
      8   4  record size (TOTALSIZE)    int32
     12   8  tags code                  int64 (Java String.hashCode of TAGS)

A padding unit (``ConsumeQueue.fillPreBlank``) has size ``CQ_PAD_SIZE``
(Integer.MAX_VALUE); pulls step over it.

IndexFile (RocketMQ's IndexHeader / IndexFile.java; reference §7.3): a
40-byte header, ``slot_num`` int32 hash slots (``IX_SLOT_BYTES`` each), then
``index_num`` 20-byte entries. Entry 0 is never used; indexCount is the next
entry to write. Header, numpy dtype ``IX_HEADER_DTYPE``::

    off size field
      0   8  beginTimestamp             int64 ms, of entry 1
      8   8  endTimestamp               int64 ms, of the last entry
     16   8  beginPhyOffset             int64
     24   8  endPhyOffset               int64
     32   4  hashSlotCount              int32, slots in use
     36   4  indexCount                 int32, next entry (an unwritten 0 reads as 1)

Entry, numpy dtype ``IX_ENTRY_DTYPE``::

    off size field
      0   4  keyHash                    int32, abs(hashCode(topic#key))
      4   8  phyOffset                  int64
     12   4  timeDiff                   int32 s since beginTimestamp
     16   4  prevIndex                  int32, the slot's previous entry (0: none)

The scan vocabulary: ``_kernels.scan_records`` (used by recovery, the
inspector, the index builder and the readers) describes each record it
accepts in one int64 row of ``N_SCAN`` columns ``S_*`` and says why it
stopped with a ``SCAN_*`` status.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MESSAGE_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
MESSAGE_MAGIC_I32 = MESSAGE_MAGIC - (1 << 32)   # -626843481, as Java sees it
BLANK_MAGIC_I32 = BLANK_MAGIC - (1 << 32)       # -875286124
END_FILE_MIN_BLANK_BYTES = 8
PAD_MAGIC = 0x53484D51                          # "SHMQ": a claimed range never finished
PAD_MAGIC_I32 = PAD_MAGIC                       # positive as an int32
PAD_OFF_PHYSICALOFFSET = 8
PAD_OFF_QUEUEID = 16
PAD_OFF_QUEUEOFFSET = 20
PAD_OFF_UNITS = 28
PAD_OFF_TOPIC = 32                              # TOPICLENGTH, then the topic
PAD_FIXED_BYTES = 33

# Field offsets for the IPv4/IPv4 record.
OFF_TOTALSIZE = 0
OFF_MAGIC = 4
OFF_BODYCRC = 8
OFF_QUEUEID = 12
OFF_FLAG = 16
OFF_QUEUEOFFSET = 20
OFF_PHYSICALOFFSET = 28
OFF_SYSFLAG = 36
OFF_BORNTIMESTAMP = 40
OFF_BORNHOST = 48
HOST_V4_BYTES = 8
HOST_V6_BYTES = 20
# Fixed bytes of a record with IPv4 hosts and empty body, topic, properties.
RECORD_FIXED_BYTES = 91
TOPIC_BYTES_MAX = 127
PROPERTIES_BYTES_MAX = 32767

# MessageSysFlag
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_TRANSACTION_NOT = 0x0
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_COMMIT = 0x8
SYSFLAG_TRANSACTION_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20

# Properties string separators (MessageDecoder).
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"

# ConsumeQueue
CQ_UNIT_BYTES = 20
CQ_UNITS_PER_FILE = 300_000
CQ_UNIT_DTYPE = np.dtype([("phy_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
CQ_PAD_SIZE = 2147483647   # ConsumeQueue.fillPreBlank: size Integer.MAX_VALUE

# IndexFile (drawn above)
IX_BEGIN_TS = 0
IX_END_TS = 8
IX_BEGIN_PHY = 16
IX_END_PHY = 24
IX_SLOT_COUNT = 32
IX_INDEX_COUNT = 36
IX_HEADER_BYTES = 40
IX_SLOT_BYTES = 4
IX_ENTRY_BYTES = 20
IX_ENTRY_KEY_HASH = 0
IX_ENTRY_PHY = 4
IX_ENTRY_TIME_DIFF = 12
IX_ENTRY_PREV = 16
IX_HEADER_DTYPE = np.dtype([("begin_ts", ">i8"), ("end_ts", ">i8"), ("begin_phy", ">i8"),
                            ("end_phy", ">i8"), ("slot_count", ">i4"), ("index_count", ">i4")])
IX_ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("phy", ">i8"), ("time_diff", ">i4"),
                           ("prev", ">i4")])

# The scan vocabulary (drawn above). Statuses of scan_records:
SCAN_END = 0        # zero TOTALSIZE or the limit reached: no more records
SCAN_BLANK = 1      # end-of-segment blank record at ``pos``
SCAN_CORRUPT = 2    # a bad record starts at ``pos``
SCAN_FULL = 3       # ``out`` is full; call again from ``pos``
SCAN_FOREIGN = 4    # a record of another format version (5.x MAGIC_V2) at ``pos``
# Columns of a scan row:
S_PHY = 0
S_SIZE = 1
S_QUEUE_ID = 2
S_QUEUE_OFFSET = 3
S_SYSFLAG = 4
S_TAGS_CODE = 5
S_TOPIC_POS = 6     # position in the scanned buffer
S_TOPIC_LEN = 7
S_TOPIC_HASH = 8    # 64-bit FNV-1a of the topic bytes, for grouping
S_STORE_TS = 9
S_PROPS_POS = 10
S_PROPS_LEN = 11
S_BODY_POS = 12
S_BODY_LEN = 13
N_SCAN = 14

# A pull's records (a PULL_MESSAGE reply body, or the same bytes a direct
# reader takes from the store: records one after another), a row each, as
# ``pull_rows`` describes them for a batch listener (client/batch.py):
# where the record starts, its TOTALSIZE, queue offset, sysflag, body and
# TOPICLENGTH positions in the buffer, and P_STATUS: PULL_OK, or why the
# record is left out while the walk goes on past it (its field lengths do
# not add up to its TOTALSIZE, its body fails the CRC).
P_START, P_SIZE, P_QUEUE_OFFSET, P_SYSFLAG, P_BODY_POS, P_BODY_LEN, P_TOPIC_AT, P_STATUS = range(8)
N_PULL = 8
PULL_OK, PULL_FIELDS, PULL_CRC = 0, 1, 2
MESSAGE_MAGIC_V2_I32 = 0xDAA320AB - (1 << 32)   # RocketMQ 5.x records: known, not ours


def _check_drawn(dtype: np.dtype, itemsize: int, offsets: dict[str, int], what: str) -> None:
    """The dtype of a layout drawn in a header agrees with its drawing: the
    same size and every field at its drawn offset (a layout edited in one
    place and not the other fails at import, not as misread bytes)."""
    assert dtype.itemsize == itemsize, f"{what}: dtype is {dtype.itemsize} bytes, drawn {itemsize}"
    for name, off in offsets.items():
        assert dtype.fields[name][1] == off, f"{what}: field {name} at {dtype.fields[name][1]}, drawn at {off}"


_check_drawn(CQ_UNIT_DTYPE, CQ_UNIT_BYTES, {"phy_offset": 0, "size": 8, "tags_code": 12},
             "ConsumeQueue unit")
_check_drawn(IX_HEADER_DTYPE, IX_HEADER_BYTES,
             {"begin_ts": IX_BEGIN_TS, "end_ts": IX_END_TS, "begin_phy": IX_BEGIN_PHY,
              "end_phy": IX_END_PHY, "slot_count": IX_SLOT_COUNT,
              "index_count": IX_INDEX_COUNT}, "IndexFile header")
_check_drawn(IX_ENTRY_DTYPE, IX_ENTRY_BYTES,
             {"key_hash": IX_ENTRY_KEY_HASH, "phy": IX_ENTRY_PHY,
              "time_diff": IX_ENTRY_TIME_DIFF, "prev": IX_ENTRY_PREV}, "IndexFile entry")

FILE_NAME_DIGITS = 20


def offset_to_file_name(offset: int) -> str:
    """RocketMQ's ``UtilAll.offset2FileName``: the start offset, 20 digits."""
    assert offset >= 0
    return f"{offset:020d}"


def host_bytes(sysflag: int, v6_flag: int) -> int:
    return HOST_V6_BYTES if sysflag & v6_flag else HOST_V4_BYTES


def record_size(body_bytes: int, topic_bytes: int, properties_bytes: int,
                sysflag: int = 0) -> int:
    """``CommitLog.calMsgLength``: the TOTALSIZE of a record."""
    extra = (host_bytes(sysflag, SYSFLAG_BORNHOST_V6) - HOST_V4_BYTES
             + host_bytes(sysflag, SYSFLAG_STOREHOST_V6) - HOST_V4_BYTES)
    return RECORD_FIXED_BYTES + extra + body_bytes + topic_bytes + properties_bytes


def properties_to_string(props: dict[str, str]) -> str:
    """Java's ``messageProperties2String`` (no trailing separator)."""
    for k, v in props.items():
        if any(c in k or c in str(v) for c in (NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR)):
            raise ValueError(f"property {k!r} contains a reserved separator \\u0001 or \\u0002")
    return PROPERTY_SEPARATOR.join(f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in props.items())


def string_to_properties(s: str) -> dict[str, str]:
    """Java's ``string2messageProperties``: keeps a piece only if its key and
    its value are both non-empty (so both trailing-separator forms parse);
    the last duplicate wins."""
    out: dict[str, str] = {}
    for item in s.split(PROPERTY_SEPARATOR):
        k, sep, v = item.partition(NAME_VALUE_SEPARATOR)
        if sep and k and v:
            out[k] = v
    return out


@dataclass(frozen=True)
class Pad:
    """The fields of a PAD record."""
    phy_offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    units: int


_PAD_HEAD = struct.Struct(">iIqiqiB")


def _field_offsets(fmt: str) -> list[int]:
    """Offset of each field of a big-endian ``struct`` format (no padding)."""
    return [struct.calcsize(">" + fmt[:i]) for i in range(len(fmt))]


# The record and PAD tables drawn in the header, checked at import against
# the offsets the code uses (one of them edited without the other fails here).
assert _field_offsets("iIiiiqqiq") + [struct.calcsize(">iIiiiqqiq")] == [
    OFF_TOTALSIZE, OFF_MAGIC, OFF_BODYCRC, OFF_QUEUEID, OFF_FLAG, OFF_QUEUEOFFSET,
    OFF_PHYSICALOFFSET, OFF_SYSFLAG, OFF_BORNTIMESTAMP, OFF_BORNHOST], "record: fixed fields"
assert RECORD_FIXED_BYTES == OFF_BORNHOST + HOST_V4_BYTES + 8 + HOST_V4_BYTES + struct.calcsize(
    ">iqibh"), "record: RECORD_FIXED_BYTES is not the drawn fields' sum"
assert _field_offsets(_PAD_HEAD.format[1:]) == [
    OFF_TOTALSIZE, OFF_MAGIC, PAD_OFF_PHYSICALOFFSET, PAD_OFF_QUEUEID, PAD_OFF_QUEUEOFFSET,
    PAD_OFF_UNITS, PAD_OFF_TOPIC] and _PAD_HEAD.size == PAD_FIXED_BYTES, "PAD record: fields"


def pad_header(pad: Pad) -> bytes:
    """The first bytes of a PAD record (the rest of its range is zeros)."""
    tb = pad.topic.encode()
    assert 0 < len(tb) <= TOPIC_BYTES_MAX and pad.size >= PAD_FIXED_BYTES + len(tb), pad
    return _PAD_HEAD.pack(pad.size, PAD_MAGIC, pad.phy_offset, pad.queue_id, pad.queue_offset,
                          pad.units, len(tb)) + tb


def read_pad(data, pos: int, phy_base: int = 0) -> Pad:
    """The PAD record at ``pos`` of ``data`` (bytes or uint8 array; its
    CommitLog offset is ``phy_base + pos``). ValueError if it is not one."""
    head = bytes(data[pos:pos + PAD_FIXED_BYTES + TOPIC_BYTES_MAX])
    if len(head) < PAD_FIXED_BYTES:
        raise ValueError(f"no PAD record at {phy_base + pos}: the buffer ends")
    size, magic, phy, qid, qoff, units, tlen = _PAD_HEAD.unpack_from(head)
    if (magic != PAD_MAGIC or phy != phy_base + pos or not 0 < tlen <= TOPIC_BYTES_MAX
            or size < PAD_FIXED_BYTES + tlen or units < 0):
        raise ValueError(f"no PAD record at {phy_base + pos}")
    topic = head[PAD_FIXED_BYTES:PAD_FIXED_BYTES + tlen].decode("utf-8", "replace")
    return Pad(phy, size, topic, qid, qoff, units)


def offset_msg_ids(prefix: str, phys: np.ndarray) -> str:
    """The offset msgIds of the records at CommitLog offsets ``phys``,
    joined by commas as a batch send's answer carries them: each is
    ``prefix`` (the store host's address and port as hex, as RocketMQ's
    MessageDecoder.createMessageId writes them) then the offset as 16
    upper-case hex digits. One C call per step, not a formatted string per
    record: 2.9 µs for 32 records where a join of f-strings took 13.8,
    21 µs for 256 against 104 (2026-11-28)."""
    raw = np.asarray(phys).astype(">u8").tobytes()
    return prefix + raw.hex(",", 8).upper().replace(",", "," + prefix) if raw else ""


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode`` (UTF-16 code units, 32-bit wrap, signed)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """The ConsumeQueue tags code: ``(long) tags.hashCode()``, 0 when untagged."""
    return java_string_hash(tags) if tags else 0


# ---------------------------------------------------------- bodies laid out
_ZERO1 = np.zeros(1, np.int64)


def lay_out(items, what: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """bytes (one for all: arrays of length 1) or a list of n bytes-like →
    (buffer, offsets, lengths): what the encoding kernels read, built by a
    direct producer (numpy only, no numba) and the store alike."""
    if isinstance(items, (bytes, bytearray, memoryview)):
        buf = np.frombuffer(items, np.uint8)
        return buf, _ZERO1, np.array([buf.shape[0]], np.int64)
    if len(items) != n:
        raise ValueError(f"{len(items)} {what} for {n} messages")
    lens = np.fromiter(map(len, items), np.int64, n)
    return np.frombuffer(b"".join(items), np.uint8), offsets(lens), lens


def offsets(lens: np.ndarray) -> np.ndarray:
    """Where each of items of ``lens`` bytes, laid back to back, begins."""
    offs = np.zeros(lens.shape[0], np.int64)
    np.cumsum(lens[:-1], out=offs[1:])
    return offs
