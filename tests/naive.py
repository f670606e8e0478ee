"""Slow, obviously correct twins of the numba kernels in ``core/_kernels/``.

Each function here is written from the specification (``core/layout.py``'s
record table, RocketMQ's Java behaviour, the kernels' docstrings), never by
calling a kernel or copying its code: the property tests in
``test_kernels.py`` run both on the same input and demand the same answer.
Clarity beats speed everywhere; bytes are parsed with ``struct`` and nothing
here imports numpy or numba.

The status codes and the scan-row column order are spelled out again below
(not imported), and ``test_kernels.py`` checks that they agree with the
kernels' constants.
"""
from __future__ import annotations

import ipaddress
import struct

# ------------------------------------------------------------ format constants
MESSAGE_MAGIC = 0xDAA320A7          # 4.x stored message
BLANK_MAGIC = 0xCBD43194            # end-of-segment filler
MESSAGE_MAGIC_V2 = 0xDAA320AB       # 5.x stored message: not ours, but known
PAD_MAGIC = 0x53484D51              # shmq: a claimed range an appender never finished

SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20

OFF_QUEUEOFFSET = 20
OFF_PHYSICALOFFSET = 28
OFF_SYSFLAG = 36

TOPIC_BYTES_MAX = 127
CQ_UNIT_BYTES = 20
CQ_PAD_SIZE = 2**31 - 1             # ConsumeQueue.fillPreBlank writes Integer.MAX_VALUE

# scan_records statuses
SCAN_END = 0
SCAN_BLANK = 1
SCAN_CORRUPT = 2
SCAN_FULL = 3        # the twin has no output capacity, so it never returns this
SCAN_FOREIGN = 4

# scan_records row columns, in order
SCAN_COLUMNS = ("phy", "size", "queue_id", "queue_offset", "sysflag", "tags_code",
                "topic_pos", "topic_len", "topic_hash", "store_ts", "props_pos",
                "props_len", "body_pos", "body_len")

# cq_scan statuses
CQ_DONE = 0
CQ_FULL = 1
CQ_BAD = 2

# split_batch statuses
BATCH_OK = 0
BATCH_TRUNCATED = -1
BATCH_TOO_MANY = -2
BATCH_PROPS_TOO_LONG = -3
PROPERTIES_BYTES_MAX = 32767        # PROPERTIESLENGTH is an int16


def to_signed(value: int, bits: int) -> int:
    """The two's-complement reading of the low ``bits`` bits of ``value``."""
    value %= 1 << bits
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


# ---------------------------------------------------------------------- CRC32
def crc32(data: bytes) -> int:
    """CRC-32 as zlib computes it, one bit at a time: reflected polynomial
    0xEDB88320, register preset to 0xFFFFFFFF, result xored with 0xFFFFFFFF."""
    reg = 0xFFFFFFFF
    for byte in data:
        for bit in range(8):                     # least significant bit first
            incoming = (byte >> bit) & 1
            feedback = (reg & 1) ^ incoming
            reg >>= 1
            if feedback:
                reg ^= 0xEDB88320
    return reg ^ 0xFFFFFFFF


# -------------------------------------------------------- Java String.hashCode
def java_string_hash(s: str) -> int:
    """``String.hashCode`` exactly as its javadoc states it:
    s[0]*31^(n-1) + s[1]*31^(n-2) + ... + s[n-1] over the UTF-16 code units,
    in 32-bit int arithmetic (so: modulo 2^32, read as signed)."""
    raw = s.encode("utf-16-be", "surrogatepass")
    units = [int.from_bytes(raw[i:i + 2], "big") for i in range(0, len(raw), 2)]
    n = len(units)
    return to_signed(sum(u * 31 ** (n - 1 - i) for i, u in enumerate(units)), 32)


def java_hash_of_utf8(data: bytes) -> int:
    """The hash of the Java string ``new String(data, UTF_8)``: malformed
    input becomes U+FFFD per maximal ill-formed subsequence, which Python's
    ``errors="replace"`` does too (Java agrees except for UTF-8-encoded
    surrogates, which Java replaces by one U+FFFD and Python by three)."""
    return java_string_hash(data.decode("utf-8", "replace"))


# ------------------------------------------------------------------ properties
def parse_properties(props: bytes) -> dict[str, str]:
    """Java's ``string2messageProperties`` (4.9.7) on the UTF-8 properties
    string: split on \\x02; the name ends at the first \\x01; keep the piece
    only if name and value are both non-empty (so it has at least 3 chars);
    a later duplicate replaces an earlier one.
    Bytes that are not UTF-8 pass through as lone surrogates (one char each)
    so that values can be mapped back to their exact bytes."""
    text = props.decode("utf-8", "surrogateescape")
    out: dict[str, str] = {}
    for piece in text.split("\x02"):
        name, sep, value = piece.partition("\x01")
        if sep and name and value:
            out[name] = value
    return out


def find_property(props: bytes, key: bytes | str) -> bytes | None:
    """The value bytes of property ``key`` in ``props``, or None if absent."""
    if isinstance(key, bytes):
        key = key.decode("utf-8", "surrogateescape")
    value = parse_properties(props).get(key)
    return None if value is None else value.encode("utf-8", "surrogateescape")


def tags_code(props: bytes) -> int:
    """ConsumeQueue tags code: hashCode of the TAGS value, 0 if absent or empty."""
    tags = find_property(props, "TAGS")
    return java_hash_of_utf8(tags) if tags else 0


INT_DIGITS_MAX = 18


def int_property(props: bytes, key: str) -> int | None:
    """Property ``key`` in ``Long.parseLong``'s syntax (an optional + or -,
    then digits), with ASCII digits only (Java takes any Unicode digit) and
    at most INT_DIGITS_MAX of them; None if absent or not such a number."""
    value = find_property(props, key)
    if value is None:
        return None
    digits = value[1:] if value[:1] in (b"+", b"-") else value
    if not 1 <= len(digits) <= INT_DIGITS_MAX or any(c not in b"0123456789" for c in digits):
        return None
    return -int(digits) if value[:1] == b"-" else int(digits)


def fnv1a64(data: bytes) -> int:
    """64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3), signed."""
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) % 2**64
    return to_signed(h, 64)


# ---------------------------------------------------------------------- record
def _pack_host(host: tuple[str, int], v6: bool) -> bytes:
    ip = ipaddress.ip_address(host[0])
    if (ip.version == 6) != v6:
        raise ValueError(f"host {host} does not match the sysflag's IPv6 bit")
    return ip.packed + struct.pack(">i", host[1])


def encode_record(topic: bytes | str, body: bytes, properties: bytes, *,
                  queue_id: int = 0, flag: int = 0, sysflag: int = 0,
                  born_timestamp: int = 0, born_host: tuple[str, int] = ("127.0.0.1", 0),
                  store_timestamp: int = 0, store_host: tuple[str, int] = ("127.0.0.1", 10911),
                  reconsume_times: int = 0, prepared_offset: int = 0,
                  queue_offset: int = 0, phy_offset: int = 0) -> bytes:
    """One stored-message record, field by field from the layout table.
    Integers are truncated to their field width, as a Java cast would."""
    if isinstance(topic, str):
        topic = topic.encode()
    born = _pack_host(born_host, bool(sysflag & SYSFLAG_BORNHOST_V6))
    store = _pack_host(store_host, bool(sysflag & SYSFLAG_STOREHOST_V6))
    after_size = b"".join([
        struct.pack(">I", MESSAGE_MAGIC),                       # MAGICCODE
        struct.pack(">i", crc32(body) & 0x7FFFFFFF),            # BODYCRC
        struct.pack(">i", to_signed(queue_id, 32)),             # QUEUEID
        struct.pack(">i", to_signed(flag, 32)),                 # FLAG
        struct.pack(">q", to_signed(queue_offset, 64)),         # QUEUEOFFSET
        struct.pack(">q", to_signed(phy_offset, 64)),           # PHYSICALOFFSET
        struct.pack(">i", to_signed(sysflag, 32)),              # SYSFLAG
        struct.pack(">q", to_signed(born_timestamp, 64)),       # BORNTIMESTAMP
        born,                                                   # BORNHOST
        struct.pack(">q", to_signed(store_timestamp, 64)),      # STORETIMESTAMP
        store,                                                  # STOREHOST
        struct.pack(">i", to_signed(reconsume_times, 32)),      # RECONSUMETIMES
        struct.pack(">q", to_signed(prepared_offset, 64)),      # PREPAREDTRANSACTIONOFFSET
        struct.pack(">i", len(body)), body,                     # BODYLENGTH + BODY
        struct.pack(">b", len(topic)), topic,                   # TOPICLENGTH + TOPIC
        struct.pack(">h", len(properties)), properties,         # PROPERTIESLENGTH + PROPERTIES
    ])
    return struct.pack(">i", 4 + len(after_size)) + after_size


# ----------------------------------------------------------------------- stamp
def stamp(records: bytes, rec_pos: list[int], phy_base: int,
          first_queue_offset: int) -> tuple[bytes, list[int]]:
    """Stamp records that all go to one queue: PHYSICALOFFSET = phy_base + the
    record's position; QUEUEOFFSET = the queue's next offset, counting up,
    except prepared and rollback transaction records, which get 0, use no
    offset and have no ConsumeQueue unit (-1 in the returned list)."""
    buf = bytearray(records)
    queue_offsets = []
    next_offset = first_queue_offset
    for pos in rec_pos:
        struct.pack_into(">q", buf, pos + OFF_PHYSICALOFFSET, phy_base + pos)
        (sysflag,) = struct.unpack_from(">i", buf, pos + OFF_SYSFLAG)
        transaction = sysflag & SYSFLAG_TRANSACTION_MASK
        if transaction in (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK):
            struct.pack_into(">q", buf, pos + OFF_QUEUEOFFSET, 0)
            queue_offsets.append(-1)
        else:
            struct.pack_into(">q", buf, pos + OFF_QUEUEOFFSET, next_offset)
            queue_offsets.append(next_offset)
            next_offset += 1
    return bytes(buf), queue_offsets


# ------------------------------------------------------------------------ scan
class _Invalid(Exception):
    """The record's fields do not fit in its TOTALSIZE."""


class _Reader:
    """Reads big-endian fields from one record, refusing to leave it."""

    def __init__(self, record: bytes):
        self.record = record
        self.at = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.record):
            raise _Invalid
        piece = self.record[self.at:self.at + n]
        self.at += n
        return piece

    def int(self, fmt: str) -> int:
        return struct.unpack(">" + fmt, self.take(struct.calcsize(fmt)))[0]


def parse_record(record: bytes) -> dict | None:
    """Every field of the record that is exactly ``record`` (TOTALSIZE bytes),
    with each field's offset in it; None unless the field lengths add up to
    TOTALSIZE with a 1..127-byte topic."""
    r = _Reader(record)
    f: dict = {}
    try:
        for name, fmt in (("size", "i"), ("magic", "I"), ("body_crc", "i"), ("queue_id", "i"),
                          ("flag", "i"), ("queue_offset", "q"), ("phy_offset", "q"),
                          ("sysflag", "i"), ("born_timestamp", "q")):
            f[name] = r.int(fmt)
        f["born_ip"] = r.take(16 if f["sysflag"] & SYSFLAG_BORNHOST_V6 else 4)
        f["born_port"] = r.int("i")
        f["store_timestamp"] = r.int("q")
        f["store_ip"] = r.take(16 if f["sysflag"] & SYSFLAG_STOREHOST_V6 else 4)
        f["store_port"] = r.int("i")
        f["reconsume_times"] = r.int("i")
        f["prepared_offset"] = r.int("q")
        body_len = r.int("i")
        f["body_off"] = r.at
        f["body"] = r.take(body_len)
        topic_len = r.int("b")
        if not 1 <= topic_len <= TOPIC_BYTES_MAX:
            return None
        f["topic_off"] = r.at
        f["topic"] = r.take(topic_len)
        props_len = r.int("h")
        f["props_off"] = r.at
        f["properties"] = r.take(props_len)
    except _Invalid:
        return None
    if r.at != len(record):
        return None
    return f


def pad_record(phy: int, size: int, topic: bytes, queue_id: int, queue_offset: int,
               units: int) -> bytes:
    """A whole PAD record: TOTALSIZE, PAD_MAGIC, PHYSICALOFFSET, QUEUEID,
    QUEUEOFFSET, UNITS, TOPICLENGTH + TOPIC, then zeros up to ``size``."""
    head = struct.pack(">iIqiqiB", size, PAD_MAGIC, phy, queue_id, queue_offset, units,
                       len(topic)) + topic
    assert len(head) <= size
    return head + bytes(size - len(head))


def pad_ok(segment: bytes, pos: int, size: int, end: int, phy_base: int) -> bool:
    """A PAD record is whole: inside ``end``, naming its own position, a
    1..127-byte topic that fits, a count that is not negative."""
    if size < 34 or pos + size > end:
        return False
    _, _, phy, _, _, units, tlen = struct.unpack_from(">iIqiqiB", segment, pos)
    return phy == phy_base + pos and 1 <= tlen <= TOPIC_BYTES_MAX and size >= 33 + tlen and units >= 0


def scan_records(segment: bytes, start: int, end: int, phy_base: int,
                 check_crc: bool) -> tuple[list[tuple], int, int]:
    """Validate the records of ``segment`` from position ``start`` up to
    ``end``; a row (SCAN_COLUMNS order) per valid record. Returns
    (rows, stop position, status)."""
    rows: list[tuple] = []
    pos = start
    while True:
        if end - pos < 8:                      # not even TOTALSIZE + MAGICCODE
            return rows, pos, SCAN_END
        size, magic = struct.unpack_from(">iI", segment, pos)
        if size == 0:
            return rows, pos, SCAN_END
        if magic == BLANK_MAGIC:
            return rows, pos, SCAN_BLANK if pos + size == len(segment) else SCAN_CORRUPT
        if magic == PAD_MAGIC:
            if not pad_ok(segment, pos, size, end, phy_base):
                return rows, pos, SCAN_CORRUPT
            pos += size                         # no record: skipped, no row
            continue
        if magic == MESSAGE_MAGIC_V2:
            return rows, pos, SCAN_FOREIGN
        if magic != MESSAGE_MAGIC or size <= 0 or pos + size > end:
            return rows, pos, SCAN_CORRUPT
        f = parse_record(segment[pos:pos + size])
        if f is None or f["phy_offset"] != phy_base + pos:
            return rows, pos, SCAN_CORRUPT
        if check_crc and f["body_crc"] != crc32(f["body"]) & 0x7FFFFFFF:
            return rows, pos, SCAN_CORRUPT
        rows.append((phy_base + pos, size, f["queue_id"], f["queue_offset"], f["sysflag"],
                     tags_code(f["properties"]), pos + f["topic_off"], len(f["topic"]),
                     fnv1a64(f["topic"]), f["store_timestamp"], pos + f["props_off"],
                     len(f["properties"]), pos + f["body_off"], len(f["body"])))
        pos += size


# ---------------------------------------------------------------- ConsumeQueue
def cq_units(units: bytes, first: int, count: int) -> list[tuple[int, int, int]]:
    """(phy_offset, size, tags_code) of units first .. first+count-1."""
    return [struct.unpack_from(">qiq", units, (first + k) * CQ_UNIT_BYTES) for k in range(count)]


def cq_scan(units: bytes, first: int, count: int, codes_sorted, max_msgs: int,
            max_bytes: int) -> tuple[list[int], list[int], int, int]:
    """Collect the units among first .. first+count-1 whose tags code is
    wanted (an empty ``codes_sorted`` wants all), skipping padding. Stop with
    CQ_BAD at a unit that is not a position (negative offset, size <= 0);
    stop with CQ_FULL at the match that would make more than ``max_msgs``
    matches or more than ``max_bytes`` (the first match is always taken).
    Returns (phys, sizes, units scanned, status)."""
    wanted = set(int(c) for c in codes_sorted)
    phys: list[int] = []
    sizes: list[int] = []
    for k, (phy, size, code) in enumerate(cq_units(units, first, count)):
        if size == CQ_PAD_SIZE:
            continue
        if phy < 0 or size <= 0:
            return phys, sizes, k, CQ_BAD
        if wanted and code not in wanted:
            continue
        if len(phys) + 1 > max_msgs or (phys and sum(sizes) + size > max_bytes):
            return phys, sizes, k, CQ_FULL
        phys.append(phy)
        sizes.append(size)
    return phys, sizes, count, CQ_DONE


def cq_put_units(cq: bytes, first: int, units: bytes) -> tuple[bytes, int]:
    """``cq`` with ``units`` written from unit ``first`` on, and how many of
    them differed there before."""
    n = len(units) // CQ_UNIT_BYTES
    at = first * CQ_UNIT_BYTES
    old = [cq[at + k * CQ_UNIT_BYTES:at + (k + 1) * CQ_UNIT_BYTES] for k in range(n)]
    new = [units[k * CQ_UNIT_BYTES:(k + 1) * CQ_UNIT_BYTES] for k in range(n)]
    return cq[:at] + units + cq[at + len(units):], sum(a != b for a, b in zip(old, new))


def cq_group_rows(rows: list[dict]) -> list[tuple[tuple[int, int], list[int], int]]:
    """((topic hash, queue id), the rows' indexes, offset anomalies) per
    queue, in the order each queue's first row comes; prepared and
    rolled-back transaction records (no unit) left out."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, r in enumerate(rows):
        if r["sysflag"] & 0xC in (0x4, 0xC):
            continue
        groups.setdefault((r["topic_hash"], r["queue_id"]), []).append(i)
    return [(key, idx, sum(rows[b]["queue_offset"] != rows[a]["queue_offset"] + 1
                           for a, b in zip(idx, idx[1:])))
            for key, idx in groups.items()]


def cq_valid_units(units: bytes, first: int, max_units: int, cl_end: int) -> tuple[int, int]:
    """How many units from ``first`` are padding (size CQ_PAD_SIZE) or
    real positions lying wholly before ``cl_end``, counting until the first
    that is neither; and where the last real one ends (-1 if none)."""
    last_end = -1
    for k, (phy, size, _code) in enumerate(cq_units(units, first, max_units)):
        if size == CQ_PAD_SIZE:
            continue
        if not (phy >= 0 and size > 0 and phy + size <= cl_end):
            return k, last_end
        last_end = phy + size
    return max_units, last_end


def min_phy_from(units: bytes, first: int, max_units: int, cl_min: int) -> int:
    """Index (from ``first``) of the first non-padding unit whose physical
    offset is at least ``cl_min``; ``max_units`` if there is none."""
    for k, (phy, size, _code) in enumerate(cq_units(units, first, max_units)):
        if size != CQ_PAD_SIZE and phy >= cl_min:
            return k
    return max_units


def queues_due(words: list[int], places: list[tuple[int, int]]) -> list[int]:
    """The places (word index or -1 for a queue with no slot, the lowest
    offset a pull waits at) whose queue's next offset (``words[word]``, 0
    without a slot) is past that offset."""
    return [at for at, (word, lo) in enumerate(places) if (words[word] if word >= 0 else 0) > lo]


def last_nonzero(buf: bytes, start: int) -> int:
    """Index of the last nonzero byte at or after ``start``, or -1."""
    for i in range(len(buf) - 1, start - 1, -1):
        if buf[i]:
            return i
    return -1


# ---------------------------------------------------------------- batch bodies
def split_batch(body: bytes, max_entries: int, suffix: bytes) -> tuple[list[tuple], int]:
    """A SEND_BATCH_MESSAGE body (reference §5.5) entry by entry: TOTALSIZE,
    MAGICCODE, BODYCRC, FLAG, BODYLEN + body, PROPERTIESLEN + properties,
    every field inside the entry's TOTALSIZE and the entry inside the body.
    MAGICCODE and BODYCRC are not checked: clients write 0 to both and
    RocketMQ's ``MessageDecoder.decodeMessages`` reads past them.
    Returns ((flag, body position, body length, stored properties) for each
    entry read, status); the stored properties are the entry's, then a
    \x02 if they are non-empty, do not end with one and ``suffix`` is
    non-empty, then ``suffix`` (``needAppendLastPropertySeparator``)."""
    entries: list[tuple] = []
    pos = 0
    while pos < len(body):
        if len(entries) == max_entries:
            return entries, BATCH_TOO_MANY
        if len(body) - pos < 4:
            return entries, BATCH_TRUNCATED
        (total,) = struct.unpack_from(">i", body, pos)
        if total < 0 or pos + total > len(body):
            return entries, BATCH_TRUNCATED
        r = _Reader(body[pos:pos + total])
        try:
            r.int("i"), r.int("I"), r.int("i")          # TOTALSIZE, MAGICCODE, BODYCRC
            flag = r.int("i")
            body_len = r.int("i")
            body_at = pos + r.at
            r.take(body_len)
            props = r.take(r.int("h"))
        except (_Invalid, struct.error):
            return entries, BATCH_TRUNCATED
        if r.at != total:
            return entries, BATCH_TRUNCATED
        sep = b"\x02" if suffix and props and not props.endswith(b"\x02") else b""
        stored = props + sep + suffix
        if len(stored) > PROPERTIES_BYTES_MAX:
            return entries, BATCH_PROPS_TOO_LONG
        entries.append((flag, body_at, body_len, stored))
        pos += total
    return entries, BATCH_OK


# ------------------------------------------------------------ columnar decode
def records_at(segment: bytes, phy_base: int, units: list[tuple[int, int]]) -> list[tuple]:
    """Scan rows of the records ConsumeQueue units (phy, size) point at, up
    to the first unit that is not exactly one whole valid message record of
    its size inside ``segment`` (a PAD, a blank, a record of another size, a
    position outside the segment: the reader stops there)."""
    rows = []
    for phy, size in units:
        pos = phy - phy_base
        if not (0 <= pos and 0 < size and pos + size <= len(segment)):
            break
        got, _, _ = scan_records(segment, pos, pos + size, phy_base, False)
        if len(got) != 1 or got[0][1] != size:
            break
        rows.append(got[0])
    return rows


def uniq_hashes(segment: bytes, phy_base: int, units: list[tuple[int, int]]) -> list[int]:
    """The duplicate-send window's hash of the record each unit (phy, size)
    points at: the CRC-32 of the value of its first properties piece named
    UNIQ_KEY (1 for a CRC of 0); 0 when the unit is not exactly one whole
    valid message record of its size, the record's RECONSUMETIMES is not 0,
    or that value is empty or there is no such piece."""
    out = []
    for phy, size in units:
        h = 0
        if records_at(segment, phy_base, [(phy, size)]):
            f = parse_record(segment[phy - phy_base:phy - phy_base + size])
            for piece in f["properties"].split(b"\x02") if f["reconsume_times"] == 0 else []:
                key, sep, value = piece.partition(b"\x01")
                if sep and key == b"UNIQ_KEY":
                    h = (crc32(value) or 1) if value else 0
                    break
        out.append(h)
    return out


def host_text(ip: bytes, port: int) -> str:
    """``a.b.c.d:port``, or ``[h:h:h:h:h:h:h:h]:port`` with each group in
    lower-case hex without leading zeros and no ``::`` shortening; a
    negative port reads as 0."""
    if len(ip) == 4:
        addr = ".".join(str(b) for b in ip)
    else:
        addr = "[" + ":".join(f"{g:x}" for g in struct.unpack(">8H", ip)) + "]"
    return f"{addr}:{max(port, 0)}"


def offset_msg_id(store_ip: bytes, store_port: int, phy: int) -> str:
    """RocketMQ's offsetMsgId (reference §6.1): upper-case hex of the store
    host's ip, its int32 port, then the int64 phy offset."""
    return (store_ip + struct.pack(">iq", store_port, phy)).hex().upper()


def arrow_columns(segment: bytes, phy_base: int, row: tuple) -> dict:
    """Every column ``arrow_columns`` fills for the record that a scan row
    (SCAN_COLUMNS order) describes, read again from the layout table: TAGS
    and KEYS are None when Java's parser keeps no such property; msgId is
    UNIQ_KEY when kept, else the offsetMsgId; times in microseconds."""
    phy, size = row[0], row[1]
    f = parse_record(segment[phy - phy_base:phy - phy_base + size])
    assert f is not None, "the twin takes rows of valid records only"
    props = f["properties"]
    uniq = find_property(props, "UNIQ_KEY")
    return {
        "queueId": f["queue_id"], "queueOffset": f["queue_offset"],
        "commitLogOffset": f["phy_offset"], "storeSize": f["size"], "sysFlag": f["sysflag"],
        "flag": f["flag"],
        # microseconds as an int64 (a time past 2**63 us wraps, as the product does)
        "bornTimestamp": to_signed(f["born_timestamp"] * 1000, 64),
        "storeTimestamp": to_signed(f["store_timestamp"] * 1000, 64),
        "topic": f["topic"], "body": f["body"], "properties": props,
        "tags": find_property(props, "TAGS"), "keys": find_property(props, "KEYS"),
        "bornHost": host_text(f["born_ip"], f["born_port"]).encode(),
        "storeHost": host_text(f["store_ip"], f["store_port"]).encode(),
        "msgId": uniq if uniq is not None else offset_msg_id(
            f["store_ip"], f["store_port"], f["phy_offset"]).encode(),
    }


def property_spans(dat: bytes, offs: list[int]) -> list[list[tuple[int, int, int, int]]]:
    """For each row's properties string dat[offs[i]:offs[i+1]], its pieces
    that Java's parser keeps (name and value both non-empty), in order,
    duplicates included, as (name start, name length, value start, value
    length) positions in ``dat``."""
    rows = []
    for i in range(len(offs) - 1):
        pieces = []
        at = offs[i]
        for piece in dat[offs[i]:offs[i + 1]].split(b"\x02"):
            name, sep, value = piece.partition(b"\x01")
            if sep and name and value:
                pieces.append((at, len(name), at + len(name) + 1, len(value)))
            at += len(piece) + 1
        rows.append(pieces)
    return rows


def gather_spans(dat: bytes, spans: list[tuple[int, int]]) -> tuple[list[int], bytes]:
    """The spans dat[start:start+length] laid end to end: (m+1 offsets, bytes)."""
    offs, out = [0], b""
    for start, length in spans:
        out += dat[start:start + length]
        offs.append(len(out))
    return offs, out
