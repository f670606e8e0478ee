"""Every numba kernel against its naive twin (``naive.py``), by hypothesis.

Each property test builds an input, runs the kernel and the twin on it, and
demands identical answers; where the twin itself could share a mistake with
the kernel, the test also checks the answer against what the input was built
from (record positions, sizes, the byte that was corrupted). A few fixed
known-answer tests pin the twins to the outside world (zlib, Java).

Run once with ``NUMBA_DISABLE_JIT=1`` too: the kernels then run as plain
Python, which catches out-of-bounds indexing that ``boundscheck=False``
hides.

Bugs these tests found (reading past a segment, an int64 overflow, Java's
malformed UTF-8 and property rules) keep a regression test at the end.
"""
from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import zlib
import dataclasses
from dataclasses import dataclass
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import naive
from shmq.core import _kernels as K
from shmq.core import layout as L
from shmq.core import records as R


def budget(n: int):
    """Hypothesis settings with ``n`` examples. The same counts serve the
    NUMBA_DISABLE_JIT=1 run: the inputs are small, so it too ends in ~20 s.
    A test that draws whole segments (or batch bodies) runs 100-150 (200):
    its examples cost ~20 ms each, nearly all of it hypothesis drawing a
    dozen messages, and 150-400 of them cost this file a third of its CPU
    time (56 -> 37 s). What the JIT-off run's coverage gate needs reached
    (every kernel line) has a fixed test where a random draw could miss it."""
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


TAGS_KEY = np.frombuffer(b"TAGS", np.uint8)
INT32 = st.integers(-2**31, 2**31 - 1)
INT64 = st.integers(-2**63, 2**63 - 1)


def u8(data: bytes) -> np.ndarray:
    """A writable uint8 array (the kernels' cached signatures are for writable arrays)."""
    return np.frombuffer(data, np.uint8).copy()


# ------------------------------------------------------------------ constants
def test_twin_constants_match_the_kernels():
    assert (naive.SCAN_END, naive.SCAN_BLANK, naive.SCAN_CORRUPT, naive.SCAN_FULL,
            naive.SCAN_FOREIGN) == (K.SCAN_END, K.SCAN_BLANK, K.SCAN_CORRUPT, K.SCAN_FULL,
                                    K.SCAN_FOREIGN)
    assert len(naive.SCAN_COLUMNS) == K.N_SCAN
    for i, name in enumerate(naive.SCAN_COLUMNS):
        assert getattr(K, "S_" + name.upper()) == i, name
    assert (naive.CQ_DONE, naive.CQ_FULL, naive.CQ_BAD) == (K.CQ_DONE, K.CQ_FULL, K.CQ_BAD)
    assert naive.CQ_PAD_SIZE == K.CQ_PAD_SIZE
    assert (naive.BATCH_OK, naive.BATCH_TRUNCATED, naive.BATCH_TOO_MANY,
            naive.BATCH_PROPS_TOO_LONG) == (K.BATCH_OK, K.BATCH_TRUNCATED, K.BATCH_TOO_MANY,
                                            K.BATCH_PROPS_TOO_LONG)
    assert naive.PROPERTIES_BYTES_MAX == L.PROPERTIES_BYTES_MAX
    assert naive.INT_DIGITS_MAX == K.INT_DIGITS_MAX
    assert naive.MESSAGE_MAGIC == L.MESSAGE_MAGIC and naive.BLANK_MAGIC == L.BLANK_MAGIC
    assert naive.MESSAGE_MAGIC_V2 - 2**32 == K.MESSAGE_MAGIC_V2_I32
    assert naive.PAD_MAGIC == L.PAD_MAGIC == L.PAD_MAGIC_I32
    assert (naive.OFF_QUEUEOFFSET, naive.OFF_PHYSICALOFFSET, naive.OFF_SYSFLAG) == (
        L.OFF_QUEUEOFFSET, L.OFF_PHYSICALOFFSET, L.OFF_SYSFLAG)


# ---------------------------------------------------------------------- CRC32
CRC_KNOWN = [(b"", 0), (b"a", 0xE8B7BE43), (b"123456789", 0xCBF43926),
             (b"The quick brown fox jumps over the lazy dog", 0x414FA339)]


@pytest.mark.parametrize("data, crc", CRC_KNOWN)
def test_crc32_known_answers(data, crc):
    assert zlib.crc32(data) == crc
    assert naive.crc32(data) == crc
    assert K.crc32(u8(data), 0, len(data), K.CRC_TABLES) == crc


def test_naive_crc32_matches_zlib_on_every_byte_value():
    data = bytes(range(256)) * 3
    assert naive.crc32(data) == zlib.crc32(data)


def test_byte_helpers_take_any_integer_index():
    """The byte helpers (numba intrinsics under the JIT) read and write the
    same bytes for a narrow unsigned index as for an int64 one: LLVM's gep
    sign-extends, so an unsigned byte index of 200 once read b[-56]."""
    from numba import njit
    from shmq.core._kernels.binary import (copy_bytes, ld_i16, ld_i32, ld_i64, ld_le64, ld_u32,
                                           st_i32)

    @njit
    def probe(b, p, out):
        copy_bytes(out, p, b, p, np.uint8(8))
        st_i32(out, p, ld_i32(b, p) + 1)
        return ld_u32(b, p), ld_i16(b, p), ld_i64(b, p), ld_le64(b, p)

    b = np.arange(256, dtype=np.uint8)
    for p in (np.uint8(200), np.int64(200), np.uint16(200), np.int32(200)):
        out = np.zeros(256, np.uint8)
        u32, i16, i64, le64 = probe(b, p, out)
        raw = bytes(range(200, 208))
        assert u32 == int.from_bytes(raw[:4], "big")
        assert i16 == int.from_bytes(raw[:2], "big", signed=True)
        assert i64 == int.from_bytes(raw, "big", signed=True) and le64 == int.from_bytes(raw, "little")
        assert bytes(out[200:208]) == (int.from_bytes(raw[:4], "big", signed=True) + 1).to_bytes(
            4, "big", signed=True) + raw[4:]


@budget(200)
@given(data=st.integers(0, 300).flatmap(lambda n: st.binary(min_size=n, max_size=n)),
       before=st.binary(max_size=15), after=st.binary(max_size=15))
def test_crc32_matches_twin(data, before, after):
    """Any length 0..300 at any alignment; the bytes around must not leak in."""
    buf = u8(before + data + after)
    got = K.crc32(buf, len(before), len(before) + len(data), K.CRC_TABLES)
    assert got == naive.crc32(data) == zlib.crc32(data)


# -------------------------------------------------------- Java String.hashCode
@pytest.mark.parametrize("text, code", [
    ("TagA", 2598919),          # "TagA".hashCode()
    ("", 0),
    ("hello", 99162322),
    ("😀", 55357 * 31 + 56832),  # two UTF-16 units: 0xD83D 0xDE00
    ("polygenelubricants", -2**31),  # the famous Integer.MIN_VALUE hash
])
def test_java_hash_known_answers(text, code):
    assert naive.java_string_hash(text) == code
    raw = text.encode()
    assert K.java_hash_utf8(u8(raw), 0, len(raw)) == code
    assert L.tags_code(text) == code


ASTRAL = ["😀", "𝄞", "\U0010FFFF", "\U00010000"]
TEXT = (st.text(max_size=40)
        | st.lists(st.sampled_from(["a", "Z", "\x00", "\x7f", "é", "ß", "\u0800", "€", "\uffff",
                                    "\ufffd", *ASTRAL]), max_size=20).map("".join))


@budget(200)
@given(text=TEXT, before=st.binary(max_size=7),
       after=st.sampled_from([b"", b"\x80", b"\x80\x80\x80", b"z"]))
def test_java_hash_matches_twin(text, before, after):
    """The kernel reads UTF-8 and hashes UTF-16 units, surrogate pairs included;
    continuation bytes after the string must not be taken as part of it."""
    raw = text.encode()
    got = K.java_hash_utf8(u8(before + raw + after), len(before), len(raw))
    assert got == naive.java_string_hash(text) == L.java_string_hash(text)


@budget(150)
@given(raw=st.binary(max_size=40), before=st.binary(max_size=5), after=st.binary(max_size=5))
def test_java_hash_reads_only_its_bytes(raw, before, after):
    """On any bytes (malformed too): a signed 32-bit result that depends only on
    buf[start:start+n]. (What malformed UTF-8 should hash to is pinned, as a
    known bug, by test_java_hash_of_malformed_utf8_is_javas.)"""
    alone = K.java_hash_utf8(u8(raw), 0, len(raw))
    framed = K.java_hash_utf8(u8(before + raw + after), len(before), len(raw))
    assert alone == framed
    assert -2**31 <= alone < 2**31


# ------------------------------------------------------------------ properties
NO_SEP = st.characters(codec="utf-8", exclude_characters="\x01\x02")
KEY = (st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "ab", "T", "TAG", "TAGSX"])
       | st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_",
                 min_size=1, max_size=6))
VALUE = (st.text(NO_SEP, max_size=8)
         | st.lists(st.sampled_from(["", "x", "\x01", "é", *ASTRAL]), max_size=4).map("".join))
PIECE = st.one_of(
    st.tuples(KEY, VALUE).map("\x01".join),                 # a name/value pair
    st.text(st.characters(codec="utf-8", exclude_characters="\x02"), max_size=6),  # junk
    st.sampled_from(["", "\x01", "a\x01", "\x01a", "ab", "TAGS", "TAGS\x01", "é\x01"]),
)
PROPS_TEXT = st.builds(
    lambda lead, pieces, trail: lead + "\x02".join(pieces) + trail,
    st.sampled_from(["", "\x02"]), st.lists(PIECE, max_size=8),
    st.sampled_from(["", "\x02", "\x02\x02", "\x01\x02", "\x01"]))


def kernel_find_property(props: bytes, key: str, before: bytes = b"", after: bytes = b""):
    buf = u8(before + props + after)
    at, n = K.find_property(buf, len(before), len(props), np.frombuffer(key.encode(), np.uint8))
    return None if at < 0 else bytes(buf[at:at + n])


@budget(200)
@given(props=PROPS_TEXT, data=st.data(), before=st.binary(max_size=4),
       after=st.sampled_from([b"", b"\x01zz", b"zz\x02TAGS\x01zz"]))
def test_find_property_matches_twin(props, data, before, after):
    """Duplicate keys (the last wins), trailing separators, short and
    separator-less pieces. Keys are non-empty ASCII, as every key the store
    looks up is: for them Java's 3-char minimum and the kernel's 3-byte one
    agree (non-ASCII keys: test_find_property_counts_chars_not_bytes)."""
    present = [p.split("\x01", 1)[0] for p in props.split("\x02") if "\x01" in p]
    present = [k for k in present if k and k.isascii()]
    key = data.draw(st.sampled_from(present) if present and data.draw(st.booleans()) else KEY)
    raw = props.encode()
    assert kernel_find_property(raw, key, before, after) == naive.find_property(raw, key)
    # The twin against the layout module's own parser.
    expected = L.string_to_properties(props).get(key)
    assert naive.find_property(raw, key) == (None if expected is None else expected.encode())


@pytest.mark.parametrize("props, key, value", [
    ("TAGS\x01TagA\x02KEYS\x01k1", "TAGS", b"TagA"),
    ("TAGS\x01TagA\x02KEYS\x01k1\x02", "KEYS", b"k1"),          # trailing separator
    ("TAGS\x01a\x02TAGS\x01b", "TAGS", b"b"),                  # last duplicate wins
    ("TAGS\x01a\x02TAGS\x01", "TAGS", b"a"),                   # an empty value is no property
    ("TAGS\x01a\x01b", "TAGS", b"a\x01b"),                     # split at the first \x01
    ("TAGS", "TAGS", None),                                    # no separator
    ("a\x01\x02ab", "a", None),                                # pieces under 3 chars
    ("", "TAGS", None),
])
def test_find_property_known_answers(props, key, value):
    assert naive.find_property(props.encode(), key) == value
    assert kernel_find_property(props.encode(), key) == value


INT_VALUE = (st.integers(-10**19, 10**19).map(str)
             | st.sampled_from(["", "+", "-", "+7", "-0", "00012", "1795344606492", "12a",
                                " 5", "5 ", "1e3", "٣", "9" * 18, "9" * 19, "-" + "9" * 18]))


@budget(200)
@given(values=st.lists(st.none() | INT_VALUE, max_size=8), gaps=st.data())
def test_int_properties_matches_twin(values, gaps):
    """The int_properties kernel over properties strings scattered in one
    buffer: absent, empty, signed, too long, not digits; the last duplicate
    wins; what it cannot read keeps the value given."""
    buf, offs, lens, props = b"", [], [], []
    for v in values:
        buf += gaps.draw(st.sampled_from([b"", b"\x02", b"OUT\x0199", b"\x01\x01"]))
        p = gaps.draw(st.sampled_from([b"", b"TAGS\x01a\x02", b"OUT\x011\x02"]))
        if v is not None:
            p += b"OUT\x01" + v.encode()
        offs.append(len(buf))
        lens.append(len(p))
        props.append(p)
        buf += p
    out = np.full(len(values), -7, np.int64)
    missed = K.int_properties(u8(buf), np.array(offs, np.int64), np.array(lens, np.int64),
                              np.frombuffer(b"OUT", np.uint8), out)
    want = [naive.int_property(p, "OUT") for p in props]
    assert out.tolist() == [-7 if w is None else w for w in want]
    assert missed == want.count(None)


@pytest.mark.parametrize("props, value", [
    ("TIMER_OUT_MS\x011795344606492\x02REAL_TOPIC\x01t", 1795344606492),
    ("TIMER_OUT_MS\x01-12", -12),
    ("TIMER_OUT_MS\x01+12", 12),
    ("TIMER_OUT_MS\x0112\x02TIMER_OUT_MS\x0134", 34),     # the last duplicate wins
    ("TIMER_OUT_MS\x0112x", None),
    ("TIMER_OUT_MS\x01" + "1" * 19, None),                 # could overflow: not read
    ("TIMER_OUT_MS\x01", None),                            # an empty value is no property
    ("TAGS\x0112", None),
])
def test_int_properties_known_answers(props, value):
    assert naive.int_property(props.encode(), "TIMER_OUT_MS") == value
    out = np.full(1, -7, np.int64)
    K.int_properties(u8(props.encode()), np.zeros(1, np.int64), np.array([len(props)], np.int64),
                     np.frombuffer(b"TIMER_OUT_MS", np.uint8), out)
    assert int(out[0]) == (-7 if value is None else value)


# ------------------------------------------------------------- batch encoding
HOST = st.tuples(st.ip_addresses().map(str), st.integers(0, 65535))
TOPIC = (st.text(st.characters(codec="utf-8"), min_size=1, max_size=31)
         .filter(lambda t: len(t.encode()) <= L.TOPIC_BYTES_MAX)
         | st.sampled_from(["TopicTest", "%RETRY%group", "T" * L.TOPIC_BYTES_MAX]))
TRANSACTION_TYPES = [L.SYSFLAG_TRANSACTION_NOT, L.SYSFLAG_TRANSACTION_PREPARED,
                     L.SYSFLAG_TRANSACTION_COMMIT, L.SYSFLAG_TRANSACTION_ROLLBACK]
SYSFLAG = INT32 | st.sampled_from(TRANSACTION_TYPES + [0x1, 0x2, 0x30, 0x34, 0x3C])
MESSAGE = st.fixed_dictionaries({
    "body": st.binary(max_size=300),
    "properties": PROPS_TEXT.map(str.encode),
    "queue_id": st.integers(0, 2**31 - 1) | st.integers(0, 3),
    "flag": INT32,
    "sysflag": SYSFLAG,
    "born_timestamp": INT64 | st.integers(1_600_000_000_000, 1_800_000_000_000),
    "reconsume_times": INT32 | st.integers(0, 16),
    "prepared_offset": INT64,
})
PER_MESSAGE = {"properties": "properties", "queue_id": "queue_ids", "flag": "flag",
               "sysflag": "sysflag", "born_timestamp": "born_timestamp",
               "reconsume_times": "reconsume_times", "prepared_offset": "prepared_offset"}


@dataclass
class Batch:
    """What a batch was built from, and the keyword arguments for records.encode."""
    topic: str
    messages: list[dict]
    born_host: tuple[str, int]
    store_host: tuple[str, int]
    store_timestamp: int
    kwargs: dict

    def sysflag(self, m: dict) -> int:
        """The SYSFLAG encode writes: the caller's bits, with the host bits
        replaced by what the host addresses are."""
        v6 = (L.SYSFLAG_BORNHOST_V6 if ":" in self.born_host[0] else 0) | (
            L.SYSFLAG_STOREHOST_V6 if ":" in self.store_host[0] else 0)
        return (m["sysflag"] & ~0x30) | v6

    def naive_records(self) -> list[bytes]:
        return [naive.encode_record(
            self.topic, m["body"], m["properties"], queue_id=m["queue_id"], flag=m["flag"],
            sysflag=self.sysflag(m), born_timestamp=m["born_timestamp"], born_host=self.born_host,
            store_timestamp=self.store_timestamp, store_host=self.store_host,
            reconsume_times=m["reconsume_times"], prepared_offset=m["prepared_offset"])
            for m in self.messages]

    def encode(self) -> R.EncodedBatch:
        return R.encode(self.topic, [m["body"] for m in self.messages], **self.kwargs)


@st.composite
def batches(draw, max_messages: int = 6) -> Batch:
    messages = draw(st.lists(MESSAGE, min_size=1, max_size=max_messages))
    # Some fields given once for the whole batch (a scalar, or one properties
    # string): then every message has the first message's value.
    for field in draw(st.sets(st.sampled_from(sorted(PER_MESSAGE)))):
        for m in messages[1:]:
            m[field] = messages[0][field]
        messages[0]["_scalar_" + field] = True
    kwargs = {}
    for field, arg in PER_MESSAGE.items():
        if messages[0].pop("_scalar_" + field, False):
            kwargs[arg] = messages[0][field]
        else:
            kwargs[arg] = [m[field] for m in messages]
    return _batch(draw, messages, kwargs)


@budget(150)
@given(batch=batches())
def test_encode_matches_twin(batch):
    """records.encode byte for byte against the twin, IPv4 and IPv6 hosts,
    every field per message or once for the batch (encode_batch, or
    encode_uniform when all are once); plus the batch's metadata."""
    enc = batch.encode()
    expected = batch.naive_records()
    assert bytes(enc.buf) == b"".join(expected)
    starts = np.cumsum([0] + [len(r) for r in expected[:-1]])
    assert enc.rec_pos.tolist() == starts.tolist()
    assert enc.sizes.tolist() == [len(r) for r in expected]
    assert enc.sizes.tolist() == [L.record_size(len(m["body"]), len(batch.topic.encode()),
                                                len(m["properties"]), batch.sysflag(m))
                                  for m in batch.messages]
    assert enc.queue_id == batch.messages[0]["queue_id"]
    assert enc.tags_codes.tolist() == [naive.tags_code(m["properties"]) for m in batch.messages]
    assert enc.single_queue == (len({m["queue_id"] for m in batch.messages}) == 1)
    assert enc.store_timestamp == batch.store_timestamp
    assert enc.count == len(batch.messages) and enc.nbytes == sum(map(len, expected))


def _batch(draw, messages, kwargs) -> Batch:
    """A Batch with drawn topic, hosts and store time, passed to encode too."""
    b = Batch(topic=draw(TOPIC), messages=messages, born_host=draw(HOST), store_host=draw(HOST),
              store_timestamp=draw(INT64), kwargs=kwargs)
    b.kwargs.update(born_host=b.born_host, store_host=b.store_host,
                    store_timestamp=b.store_timestamp)
    return b


@st.composite
def uniform_batches(draw) -> Batch:
    """Every integer setting given once for the batch: records.encode takes
    the encode_uniform kernel. Properties one per message or one shared."""
    first = draw(MESSAGE)
    messages = [dict(first, body=body, properties=props) for body, props in draw(
        st.lists(st.tuples(st.binary(max_size=300), PROPS_TEXT.map(str.encode)),
                 min_size=1, max_size=6))]
    shared = draw(st.booleans())
    if shared:
        for m in messages:
            m["properties"] = first["properties"]
    kwargs = {arg: first[field] for field, arg in PER_MESSAGE.items()}
    kwargs["properties"] = first["properties"] if shared else [m["properties"] for m in messages]
    return _batch(draw, messages, kwargs)


@budget(150)
@given(batch=uniform_batches())
def test_encode_uniform_matches_twin(batch):
    enc = batch.encode()
    expected = batch.naive_records()
    assert bytes(enc.buf) == b"".join(expected)
    assert enc.rec_pos.tolist() == np.cumsum([0] + [len(r) for r in expected[:-1]]).tolist()
    assert enc.sizes.tolist() == [len(r) for r in expected]
    assert enc.tags_codes.tolist() == [naive.tags_code(m["properties"]) for m in batch.messages]
    assert enc.queue_id == batch.messages[0]["queue_id"] and enc.single_queue


@budget(150)
@given(props=st.lists(PROPS_TEXT.map(str.encode), max_size=8), gaps=st.data())
def test_tags_codes_matches_twin(props, gaps):
    """The tags_codes kernel over properties strings scattered in one buffer."""
    buf, offs = b"", []
    for p in props:
        buf += gaps.draw(st.sampled_from([b"", b"\x02", b"TAGS\x01zz", b"\x01\x01"]))
        offs.append(len(buf))
        buf += p
    out = np.full(len(props), -7, np.int64)
    K.tags_codes(u8(buf), np.array(offs, np.int64), np.array([len(p) for p in props], np.int64),
                 TAGS_KEY, out)
    assert out.tolist() == [naive.tags_code(p) for p in props]


def test_encode_takes_both_kernels():
    """The property tests above reach both encoders: encode_uniform when every
    integer setting is one value, encode_batch when any is per message."""
    with mock.patch.object(K, "encode_uniform", wraps=K.encode_uniform) as uniform, \
            mock.patch.object(K, "encode_batch", wraps=K.encode_batch) as general:
        R.encode("T", [b"a", b"b"], properties=[b"", b"TAGS\x01x"], queue_ids=1, flag=2)
        assert (uniform.call_count, general.call_count) == (1, 0)
        R.encode("T", [b"a", b"b"], properties=b"TAGS\x01x", queue_ids=[1, 1], flag=2)
        assert (uniform.call_count, general.call_count) == (1, 1)


# ---------------------------------------------------------------------- stamp
@budget(150)
@given(batch=batches(), phy_base=st.integers(0, 2**50), first=st.integers(0, 2**40))
def test_stamp_one_queue_matches_twin(batch, phy_base, first):
    enc = batch.encode()
    expected, queue_offsets = naive.stamp(bytes(enc.buf), enc.rec_pos.tolist(), phy_base, first)
    buf = enc.buf.copy()
    qnext = np.array([first], np.int64)
    out = np.full(enc.count, -99, np.int64)
    K.stamp_batch(buf, enc.rec_pos, enc.count, phy_base, np.zeros(enc.count, np.int32), qnext, out)
    assert bytes(buf) == expected
    assert out.tolist() == queue_offsets
    assert int(qnext[0]) == first + sum(q >= 0 for q in queue_offsets)


@budget(100)
@given(batch=batches(max_messages=10), phy_base=st.integers(0, 2**50), data=st.data())
def test_stamp_many_queues_matches_twin(batch, phy_base, data):
    """Each slot counts on its own: the twin stamps each slot's records alone."""
    enc = batch.encode()
    n_slots = data.draw(st.integers(1, 4))
    slot_of = np.array(data.draw(st.lists(st.integers(0, n_slots - 1), min_size=enc.count,
                                          max_size=enc.count)), np.int32)
    firsts = data.draw(st.lists(st.integers(0, 2**40), min_size=n_slots, max_size=n_slots))
    expected = bytes(enc.buf)
    queue_offsets = [None] * enc.count
    for s in range(n_slots):
        mine = [i for i in range(enc.count) if slot_of[i] == s]
        expected, offs = naive.stamp(expected, [int(enc.rec_pos[i]) for i in mine], phy_base,
                                     firsts[s])
        for i, q in zip(mine, offs):
            queue_offsets[i] = q
    buf = enc.buf.copy()
    qnext = np.array(firsts, np.int64)
    out = np.full(enc.count, -99, np.int64)
    K.stamp_batch(buf, enc.rec_pos, enc.count, phy_base, slot_of, qnext, out)
    assert bytes(buf) == expected
    assert out.tolist() == queue_offsets
    assert qnext.tolist() == [firsts[s] + sum(1 for i in range(enc.count)
                                              if slot_of[i] == s and queue_offsets[i] >= 0)
                              for s in range(n_slots)]


# ----------------------------------------------------------------------- scan
@dataclass
class Segment:
    buf: bytes
    phy_base: int
    starts: list[int]         # position of every record
    records_end: int          # where the records stop and the tail starts
    tail: str                 # "zeros" or "blank"
    messages: list[tuple[Batch, dict]]
    pads: list[int] = dataclasses.field(default_factory=list)   # position of every PAD record

    @property
    def count(self) -> int:
        return len(self.starts)


@st.composite
def pad_records(draw, phy: int) -> bytes:
    """A whole PAD record at CommitLog offset ``phy`` (what a repair writes
    over a claim its appender never finished)."""
    topic = draw(st.binary(min_size=1, max_size=L.TOPIC_BYTES_MAX))
    size = L.PAD_FIXED_BYTES + len(topic) + draw(st.integers(0, 300))
    return naive.pad_record(phy, size, topic, draw(st.integers(0, 2**31 - 1)),
                            draw(st.integers(0, 2**40)), draw(st.integers(0, 64)))


@st.composite
def segments(draw, pads: bool = False) -> Segment:
    """Encoded and stamped records (a few batches, so several topics and host
    kinds), then either zeros or a blank record running to the segment end
    (whose remaining bytes are garbage: nothing may read them). ``pads``:
    PAD records may come before, between and after the batches."""
    phy_base = draw(st.integers(0, 2**40))
    buf = bytearray()
    starts: list[int] = []
    pad_at: list[int] = []
    messages: list[tuple[Batch, dict]] = []
    qnext = np.array([draw(st.integers(0, 2**40))], np.int64)

    def maybe_pad():
        if pads and draw(st.booleans()):
            pad_at.append(len(buf))
            buf.extend(draw(pad_records(phy_base + len(buf))))

    for batch in draw(st.lists(batches(max_messages=4), min_size=1, max_size=3)):
        maybe_pad()
        enc = batch.encode()
        records = enc.buf.copy()
        K.stamp_batch(records, enc.rec_pos, enc.count, phy_base + len(buf),
                      np.zeros(enc.count, np.int32), qnext, np.empty(enc.count, np.int64))
        starts += (len(buf) + enc.rec_pos).tolist()
        messages += [(batch, m) for m in batch.messages]
        buf += bytes(records)
    maybe_pad()
    records_end = len(buf)
    tail = draw(st.sampled_from(["zeros", "blank"]))
    if tail == "zeros":
        buf += bytes(draw(st.integers(0, 48)))
    else:
        rest = draw(st.binary(min_size=L.END_FILE_MIN_BLANK_BYTES - 8, max_size=40))
        buf += struct.pack(">iI", 8 + len(rest), L.BLANK_MAGIC) + rest
    return Segment(bytes(buf), phy_base, starts, records_end, tail, messages, pad_at)


def kernel_scan(buf: bytes, start: int, end: int, phy_base: int, check_crc: bool,
                cap: int) -> tuple[list[tuple], int, int]:
    """scan_records with an output of ``cap`` rows, called again from where it
    stopped while it reports SCAN_FULL; returns the twin's shape of answer."""
    arr = u8(buf)
    rows: list[tuple] = []
    pos = start
    while True:
        out = np.full((cap, K.N_SCAN), -7, np.int64)
        n, stop, status = K.scan_records(arr, pos, end, phy_base, check_crc, K.CRC_TABLES,
                                         TAGS_KEY, out)
        rows += [tuple(int(x) for x in row) for row in out[:n]]
        if status != K.SCAN_FULL:
            return rows, int(stop), int(status)
        assert n == cap and stop >= pos
        pos = int(stop)


def check_rows_against_inputs(seg: Segment, first: int, rows: list[tuple]):
    """The rows describe records first, first+1, ... as they were built."""
    col = {name: i for i, name in enumerate(naive.SCAN_COLUMNS)}
    for row, pos, (batch, m) in zip(rows, seg.starts[first:], seg.messages[first:]):
        topic = batch.topic.encode()
        assert row[col["phy"]] == seg.phy_base + pos
        assert row[col["size"]] == L.record_size(len(m["body"]), len(topic),
                                                 len(m["properties"]), batch.sysflag(m))
        assert row[col["queue_id"]] == m["queue_id"]
        assert row[col["sysflag"]] == batch.sysflag(m)
        assert row[col["store_ts"]] == batch.store_timestamp
        assert row[col["tags_code"]] == L.tags_code(
            L.string_to_properties(m["properties"].decode()).get("TAGS"))
        tp, bp, pp = row[col["topic_pos"]], row[col["body_pos"]], row[col["props_pos"]]
        assert seg.buf[tp:tp + row[col["topic_len"]]] == topic
        assert seg.buf[bp:bp + row[col["body_len"]]] == m["body"]
        assert seg.buf[pp:pp + row[col["props_len"]]] == m["properties"]


@budget(100)
@given(seg=segments(), check_crc=st.booleans(), data=st.data())
def test_scan_matches_twin(seg, check_crc, data):
    """Clean segment, any record to start from, any output capacity; up to
    the segment end, or to an arbitrary limit (a cut record is corrupt unless
    not even its TOTALSIZE and MAGICCODE fit, which is the end)."""
    first = data.draw(st.integers(0, seg.count), label="first record")
    start = seg.starts[first] if first < seg.count else seg.records_end
    to_segment_end = data.draw(st.booleans(), label="to segment end")
    end = len(seg.buf) if to_segment_end else data.draw(st.integers(start, len(seg.buf)),
                                                        label="end")
    cap = data.draw(st.integers(1, seg.count + 1), label="cap")
    got = kernel_scan(seg.buf, start, end, seg.phy_base, check_crc, cap)
    assert got == naive.scan_records(seg.buf, start, end, seg.phy_base, check_crc)
    rows, stop, status = got
    check_rows_against_inputs(seg, first, rows)
    if to_segment_end:
        assert len(rows) == seg.count - first
        assert stop == seg.records_end
        assert status == (naive.SCAN_BLANK if seg.tail == "blank" else naive.SCAN_END)


@budget(100)
@given(seg=segments(pads=True), check_crc=st.booleans(), data=st.data())
def test_scan_skips_whole_pads_like_the_twin(seg, check_crc, data):
    """PAD records (claims never finished) give no row and do not stop the
    scan; cut by ``end`` one is corrupt, as a cut record is."""
    event(f"{len(seg.pads)} pads")
    first = data.draw(st.integers(0, seg.count), label="first record")
    start = seg.starts[first] if first < seg.count else seg.records_end
    end = data.draw(st.one_of(st.just(len(seg.buf)), st.integers(start, len(seg.buf))), label="end")
    cap = data.draw(st.integers(1, seg.count + 1), label="cap")
    got = kernel_scan(seg.buf, start, end, seg.phy_base, check_crc, cap)
    assert got == naive.scan_records(seg.buf, start, end, seg.phy_base, check_crc)
    rows, stop, status = got
    check_rows_against_inputs(seg, first, rows)
    if end == len(seg.buf):
        assert len(rows) == seg.count - first and stop == seg.records_end
        assert status == (naive.SCAN_BLANK if seg.tail == "blank" else naive.SCAN_END)


@pytest.mark.parametrize("damage", ["phy", "topic_len 0", "topic_len past size", "units < 0",
                                    "size past end", "size too small"])
def test_a_broken_pad_is_corrupt(damage):
    """A PAD record that is not whole stops the scan as a bad record does."""
    topic = b"PadTopic"
    pad = bytearray(naive.pad_record(4096, 80, topic, 3, 17, 2))
    if damage == "phy":
        struct.pack_into(">q", pad, L.PAD_OFF_PHYSICALOFFSET, 4097)
    elif damage == "topic_len 0":
        pad[L.PAD_OFF_TOPIC] = 0
    elif damage == "topic_len past size":
        pad[L.PAD_OFF_TOPIC] = 80
    elif damage == "units < 0":
        struct.pack_into(">i", pad, L.PAD_OFF_UNITS, -1)
    elif damage == "size past end":
        struct.pack_into(">i", pad, 0, 81)
    else:
        struct.pack_into(">i", pad, 0, L.PAD_FIXED_BYTES)
    buf = bytes(pad) + bytes(16)
    want = ([], 0, naive.SCAN_CORRUPT)
    assert naive.scan_records(buf, 0, 80 if damage == "size past end" else len(buf), 4096, True) \
        == want
    assert kernel_scan(buf, 0, 80 if damage == "size past end" else len(buf), 4096, True, 4) == want
    whole = naive.pad_record(4096, 80, topic, 3, 17, 2) + bytes(16)
    assert kernel_scan(whole, 0, len(whole), 4096, True, 4) == ([], 80, naive.SCAN_END)
    assert L.read_pad(np.frombuffer(whole, np.uint8), 0, 4096) == L.Pad(4096, 80, "PadTopic", 3, 17, 2)


def field_spans(sysflag: int, body_len: int, topic_len: int, props_len: int):
    """(name, offset, length) of every field of a record, from the layout table."""
    bh = 20 if sysflag & L.SYSFLAG_BORNHOST_V6 else 8
    sh = 20 if sysflag & L.SYSFLAG_STOREHOST_V6 else 8
    spans, at = [], 0
    for name, n in (("size", 4), ("magic", 4), ("body_crc", 4), ("queue_id", 4), ("flag", 4),
                    ("queue_offset", 8), ("phy_offset", 8), ("sysflag", 4), ("born_ts", 8),
                    ("born_host", bh), ("store_ts", 8), ("store_host", sh), ("reconsume", 4),
                    ("prepared", 8), ("body_len", 4), ("body", body_len), ("topic_len", 1),
                    ("topic", topic_len), ("props_len", 2), ("props", props_len)):
        spans.append((name, at, n))
        at += n
    return spans


# Fields the scan does not check: a change there leaves the scan's shape
# (rows, stop, status) alone and can only show in these columns of its row.
UNCHECKED_FIELDS = {"queue_id": {"queue_id"}, "flag": set(), "queue_offset": {"queue_offset"},
                    "sysflag": {"sysflag"}, "born_ts": set(), "born_host": set(),
                    "store_ts": {"store_ts"}, "store_host": set(), "reconsume": set(),
                    "prepared": set(), "topic": {"topic_hash"}, "props": {"tags_code"},
                    "body_crc": set(), "body": set()}


def valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@budget(150)
@given(seg=segments(), check_crc=st.booleans(), data=st.data())
def test_scan_finds_a_corrupted_byte(seg, check_crc, data):
    """One byte changed anywhere from the starting record on. Where the scan
    checks the field, it must stop at that record; where it cannot, it must
    carry on with only the affected column changed; and always agree with the
    twin."""
    first = data.draw(st.integers(0, seg.count - 1), label="first record")
    start = seg.starts[first]
    # Aim at a record (or the tail), then at one of its fields, so that
    # every field gets its share of hits however long the body is.
    target = data.draw(st.integers(first, seg.count), label="target record")
    if target == seg.count and seg.records_end < len(seg.buf):
        where = data.draw(st.integers(seg.records_end, len(seg.buf) - 1), label="tail position")
    else:
        target = min(target, seg.count - 1)
        batch, m = seg.messages[target]
        spans = field_spans(batch.sysflag(m), len(m["body"]), len(batch.topic.encode()),
                            len(m["properties"]))
        _, at, n = data.draw(st.sampled_from([s for s in spans if s[2] > 0]), label="field")
        where = seg.starts[target] + at + data.draw(st.integers(0, n - 1), label="offset")
    bad = bytearray(seg.buf)
    bad[where] ^= data.draw(st.integers(1, 255), label="xor")
    bad = bytes(bad)
    end = len(bad)
    cap = data.draw(st.integers(1, seg.count + 1), label="cap")

    clean_rows, clean_stop, clean_status = naive.scan_records(seg.buf, start, end, seg.phy_base,
                                                              check_crc)
    got = kernel_scan(bad, start, end, seg.phy_base, check_crc, cap)
    twin = naive.scan_records(bad, start, end, seg.phy_base, check_crc)
    rows, stop, status = got

    if where >= seg.records_end:                      # in the tail
        d = where - seg.records_end
        event(f"tail {seg.tail}")
        assert got == twin
        assert rows == clean_rows and stop == seg.records_end
        if seg.tail == "zeros":
            size_now_nonzero = d < 4 and end - seg.records_end >= 8
            assert status == (naive.SCAN_CORRUPT if size_now_nonzero else naive.SCAN_END)
        elif d >= 8:                                  # past the blank's header: never read
            assert status == naive.SCAN_BLANK
        elif d < 4 and struct.unpack_from(">i", bad, seg.records_end)[0] == 0:
            assert status == naive.SCAN_END
        else:
            assert status == naive.SCAN_CORRUPT
        return

    j = max(i for i in range(seg.count) if seg.starts[i] <= where)
    pos = seg.starts[j]
    batch, m = seg.messages[j]
    spans = field_spans(batch.sysflag(m), len(m["body"]), len(batch.topic.encode()),
                        len(m["properties"]))
    field = next(name for name, at, n in spans if at <= where - pos < at + n)
    old, new = seg.buf[where], bad[where]
    if field == "sysflag" and (old ^ new) & 0x30 and where - pos == L.OFF_SYSFLAG + 3:
        field = "sysflag host bits"
    event(field)
    note(f"record {j} at {pos}, field {field}, byte {old:#04x} -> {new:#04x}")
    before = clean_rows[:j - first]
    assert rows[:j - first] == before

    # The one known divergence from the twin: malformed UTF-8 in a TAGS value
    # (see test_java_hash_of_malformed_utf8_is_javas). Compare the rest.
    record = bad[pos:pos + spans[-1][1] + spans[-1][2]]
    tags_now = None
    if field == "props":              # the record's structure is intact
        tags_now = naive.find_property(naive.parse_record(record)["properties"], "TAGS")
    if tags_now is not None and not valid_utf8(tags_now):
        event("malformed TAGS: tags code not compared")
        col = naive.SCAN_COLUMNS.index("tags_code")
        strip = lambda r: tuple(v for i, v in enumerate(r) if i != col)  # noqa: E731
        assert ([strip(r) for r in rows], stop, status) == ([strip(r) for r in twin[0]],
                                                           twin[1], twin[2])
    else:
        assert got == twin

    checked = {"size", "magic", "phy_offset", "props_len"}
    if check_crc:
        checked |= {"body_crc", "body"}
    if field in checked:
        # Always caught: TOTALSIZE and PROPERTIESLENGTH no longer add up,
        # PHYSICALOFFSET is not the record's position, CRC-32 catches any
        # error burst of up to 32 bits.
        assert (len(rows), stop) == (j - first, pos)
        if field == "size" and struct.unpack_from(">i", bad, pos)[0] == 0:
            assert status == naive.SCAN_END
        elif field == "magic" and bad[pos + 4:pos + 8] == bytes.fromhex("DAA320AB"):
            assert status == naive.SCAN_FOREIGN     # 0xDAA320A7 -> 0xDAA320AB is one byte
        else:
            assert status == naive.SCAN_CORRUPT
    elif field in ("body_len", "topic_len", "sysflag host bits"):
        # Caught unless the lengths read from the shifted positions happen to
        # add up to TOTALSIZE again, which the twin then also accepts.
        caught = (len(rows), stop, status) == (j - first, pos, naive.SCAN_CORRUPT)
        assert caught or naive.parse_record(record) is not None
    else:
        assert (len(rows), stop, status) == (len(clean_rows), clean_stop, clean_status)
        may_change = {naive.SCAN_COLUMNS.index(c) for c in UNCHECKED_FIELDS[field]}
        for r_bad, r_clean in zip(rows, clean_rows):
            for i, (a, b) in enumerate(zip(r_bad, r_clean)):
                assert a == b or i in may_change, (naive.SCAN_COLUMNS[i], a, b)


@budget(100)
@given(seg=segments(), data=st.data())
def test_scan_of_overwritten_bytes_matches_twin(seg, data):
    """A run of random bytes over a valid segment (a torn write), or records
    of other formats: whatever the scan makes of it, the twin makes too."""
    at = data.draw(st.integers(0, len(seg.buf) - 1))
    junk = data.draw(st.binary(min_size=1, max_size=24)
                     | st.sampled_from([struct.pack(">I", naive.MESSAGE_MAGIC_V2),
                                        struct.pack(">I", naive.BLANK_MAGIC), bytes(4)]))
    bad = bytearray(seg.buf)
    bad[at:at + len(junk)] = junk[:len(seg.buf) - at]
    bad = bytes(bad)
    check_crc = data.draw(st.booleans())
    got = kernel_scan(bad, 0, len(bad), seg.phy_base, check_crc, seg.count + 1)
    twin = naive.scan_records(bad, 0, len(bad), seg.phy_base, check_crc)
    col = naive.SCAN_COLUMNS.index("tags_code")
    # malformed TAGS aside (see test_java_hash_of_malformed_utf8_is_javas)
    strip = lambda r: tuple(v for i, v in enumerate(r) if i != col)  # noqa: E731
    assert [strip(r) for r in got[0]] == [strip(r) for r in twin[0]]
    assert got[1:] == twin[1:]


@budget(100)
@given(seg=segments(), check_crc=st.booleans(), data=st.data())
def test_scan_stops_at_the_first_of_two_corruptions(seg, check_crc, data):
    """Two changed bytes, e.g. a body (caught only by the CRC) before a broken
    header: the scan reports the first, whichever check catches each."""
    bad = bytearray(seg.buf)
    for _ in range(2):
        bad[data.draw(st.integers(0, len(bad) - 1))] ^= data.draw(st.integers(1, 255))
    bad = bytes(bad)
    cap = data.draw(st.integers(1, seg.count + 1))
    got = kernel_scan(bad, 0, len(bad), seg.phy_base, check_crc, cap)
    twin = naive.scan_records(bad, 0, len(bad), seg.phy_base, check_crc)
    col = naive.SCAN_COLUMNS.index("tags_code")
    # malformed TAGS aside (see test_java_hash_of_malformed_utf8_is_javas)
    strip = lambda r: tuple(v for i, v in enumerate(r) if i != col)  # noqa: E731
    assert [strip(r) for r in got[0]] == [strip(r) for r in twin[0]]
    assert got[1:] == twin[1:]


def test_scan_known_statuses():
    """One record then: nothing, a blank, a 5.x record, garbage; and a blank
    that does not reach the segment end."""
    enc = R.encode("TopicTest", [b"x"], properties=b"TAGS\x01a")
    rec = enc.buf.copy()
    K.stamp_batch(rec, enc.rec_pos, 1, 1000, np.zeros(1, np.int32), np.zeros(1, np.int64),
                  np.zeros(1, np.int64))
    rec = bytes(rec)
    n = len(rec)
    blank = struct.pack(">iI", 16, L.BLANK_MAGIC) + bytes(8)
    cases = [
        (rec, 1, n, K.SCAN_END),
        (rec + bytes(16), 1, n, K.SCAN_END),
        (rec + blank, 1, n, K.SCAN_BLANK),
        (rec + blank + bytes(4), 1, n, K.SCAN_CORRUPT),     # blank not at the segment end
        (rec + struct.pack(">iI", 100, naive.MESSAGE_MAGIC_V2) + bytes(92), 1, n, K.SCAN_FOREIGN),
        (rec + struct.pack(">iI", 100, 0x12345678) + bytes(92), 1, n, K.SCAN_CORRUPT),
        (rec + struct.pack(">iI", -5, L.MESSAGE_MAGIC) + bytes(92), 1, n, K.SCAN_CORRUPT),
        (rec + struct.pack(">iI", 91, L.MESSAGE_MAGIC) + bytes(92), 1, n, K.SCAN_CORRUPT),
    ]
    for buf, rows, stop, status in cases:
        got = kernel_scan(buf, 0, len(buf), 1000, True, 4)
        assert got == naive.scan_records(buf, 0, len(buf), 1000, True)
        assert (len(got[0]), got[1], got[2]) == (rows, stop, status), buf[n:]
    # The wrong segment base: PHYSICALOFFSET no longer matches.
    assert kernel_scan(rec, 0, n, 999, False, 4) == ([], 0, K.SCAN_CORRUPT)
    # A changed body byte: every length still adds up, only BODYCRC tells (so
    # the JIT-off run's coverage of the CRC check never rests on a random draw).
    body_at = kernel_scan(rec, 0, n, 1000, False, 4)[0][0][naive.SCAN_COLUMNS.index("body_pos")]
    bad = bytearray(rec)
    bad[body_at] ^= 1
    bad = bytes(bad)
    for check_crc, want in ((True, (0, 0, K.SCAN_CORRUPT)), (False, (1, n, K.SCAN_END))):
        got = kernel_scan(bad, 0, n, 1000, check_crc, 4)
        assert got == naive.scan_records(bad, 0, n, 1000, check_crc)
        assert (len(got[0]), got[1], got[2]) == want


def _record_with_topic_length(topic_len: int, phy: int) -> bytes:
    """A record whose fields add up, with a topic of ``topic_len`` bytes (the
    length byte holds it unsigned, so 128..255 are possible on disk)."""
    rec = bytearray(naive.encode_record("T", b"x", b"TAGS\x01a", phy_offset=phy))
    at = 88 + 1                                        # TOPICLENGTH, after a 1-byte body
    rec[at:at + 2] = bytes([topic_len]) + b"T" * topic_len
    rec[0:4] = struct.pack(">i", len(rec))
    return bytes(rec)


@pytest.mark.parametrize("topic_len, valid", [(0, False), (1, True), (127, True),
                                              (128, False), (255, False)])
def test_scan_checks_the_topic_length(topic_len, valid):
    """Topic 1..127 bytes, even when every length adds up."""
    rec = _record_with_topic_length(topic_len, 5000)
    got = kernel_scan(rec, 0, len(rec), 5000, True, 2)
    assert got == naive.scan_records(rec, 0, len(rec), 5000, True)
    assert (len(got[0]), got[2]) == ((1, K.SCAN_END) if valid else (0, K.SCAN_CORRUPT))


# --------------------------------------------------------------- ConsumeQueue
TAG_POOL = [0, 1, -1, 42, 2598919, 2**63 - 1, -2**63]
TAG = st.sampled_from(TAG_POOL) | INT64


@st.composite
def cq_unit(draw) -> tuple[int, int, int]:
    kind = draw(st.sampled_from(["real"] * 8 + ["pad", "pad-size", "negative", "bad size",
                                                 "zero"]))
    if kind == "real":
        return draw(st.integers(0, 2**40)), draw(st.integers(1, 5000)), draw(TAG)
    if kind == "pad":                                   # ConsumeQueue.fillPreBlank
        return 0, naive.CQ_PAD_SIZE, 0
    if kind == "pad-size":
        return draw(INT64), naive.CQ_PAD_SIZE, draw(TAG)
    if kind == "negative":
        return draw(st.integers(-2**63, -1)), draw(INT32), draw(TAG)
    if kind == "bad size":
        return draw(st.integers(0, 2**40)), draw(st.integers(-2**31, 0)), draw(TAG)
    return 0, 0, 0                                      # never written


def cq_bytes(units) -> bytes:
    return b"".join(struct.pack(">qiq", *u) for u in units)


@st.composite
def cq_files(draw):
    """Units of one file, and a window (first, count) into them."""
    units = draw(st.lists(cq_unit(), max_size=40))
    first = draw(st.integers(0, len(units)))
    count = draw(st.integers(0, len(units) - first))
    return units, first, count


@budget(200)
@given(cq=cq_files(), codes=st.lists(TAG, unique=True, max_size=5), data=st.data())
def test_cq_scan_matches_twin(cq, codes, data):
    units, first, count = cq
    # Limits at, just below and just above what the real units add up to.
    window = [u for u in units[first:first + count] if 0 < u[1] < naive.CQ_PAD_SIZE]
    sums = np.cumsum([0] + [u[1] for u in window]).tolist()
    max_msgs = data.draw(st.integers(0, len(window) + 1), label="max_msgs")
    near_a_sum = st.sampled_from(sums).flatmap(lambda s: st.sampled_from([s - 1, s, s + 1]))
    max_bytes = data.draw(near_a_sum | st.integers(0, 60_000) | st.just(2**62), label="max_bytes")
    raw = cq_bytes(units)
    codes = sorted(codes)
    out_phy = np.full(max(count, 1), -7, np.int64)
    out_size = np.full(max(count, 1), -7, np.int64)
    found, scanned, status, nbytes = K.cq_scan(u8(raw), first, count, np.array(codes, np.int64),
                                               max_msgs, max_bytes, out_phy, out_size)
    phys, sizes, n_scanned, n_status = naive.cq_scan(raw, first, count, codes, max_msgs,
                                                     max_bytes)
    assert (out_phy[:found].tolist(), out_size[:found].tolist(), scanned, status, nbytes) == (
        phys, sizes, n_scanned, n_status, sum(sizes))
    assert (out_phy[found:] == -7).all()
    if status == naive.CQ_FULL:
        assert found >= 1 or max_msgs == 0
        assert found == max_msgs or sum(sizes) + units[first + scanned][1] > max_bytes


@budget(150)
@given(cq=cq_files(), data=st.data())
def test_cq_valid_units_matches_twin(cq, data):
    units, first, count = cq
    ends = [p + s for p, s, _ in units if p >= 0 and 0 < s < naive.CQ_PAD_SIZE]
    cl_end = data.draw(st.sampled_from(ends) | st.integers(0, 2**41) if ends
                       else st.integers(0, 2**41))
    raw = cq_bytes(units)
    got = K.cq_valid_units(u8(raw), first, count, cl_end)
    assert tuple(int(x) for x in got) == naive.cq_valid_units(raw, first, count, cl_end)


@budget(150)
@given(cq=cq_files(), data=st.data())
def test_min_phy_from_matches_twin(cq, data):
    units, first, count = cq
    phys = [p for p, _, _ in units]
    cl_min = data.draw(st.sampled_from(phys) | INT64 if phys else INT64)
    raw = cq_bytes(units)
    assert K.min_phy_from(u8(raw), first, count, cl_min) == naive.min_phy_from(
        raw, first, count, cl_min)


@budget(100)
@given(words=st.lists(st.integers(0, 2**40), min_size=1, max_size=30), data=st.data())
def test_queues_due_matches_twin(words, data):
    """A worker's parked queues (broker/parking.py ``_Watched``): a word
    index or -1 (no slot yet: next offset 0), the lowest offset a pull waits
    at (int64 max: a free place), against the state's words."""
    n = data.draw(st.integers(0, 40))
    places = data.draw(st.lists(st.tuples(st.integers(-1, len(words) - 1),
                                          st.integers(-1, 2**40) | st.just(2**63 - 1)),
                                min_size=n, max_size=n))
    word = np.array([w for w, _ in places] + [-1] * 3, np.int64)     # places past n: ignored
    lo = np.array([x for _, x in places] + [-1] * 3, np.int64)
    out = np.full(len(word), -7, np.int64)
    k = K.queues_due(np.array(words, np.int64), word, lo, n, out)
    assert out[:k].tolist() == naive.queues_due(words, places)


@budget(100)
@given(units=st.lists(cq_unit(), min_size=1, max_size=20), data=st.data())
def test_cq_put_many_writes_the_unit_layout(units, data):
    """cq_put_many against struct.pack(">qiq") (layout.CQ_UNIT_DTYPE)."""
    start = data.draw(st.integers(0, len(units) - 1))
    count = data.draw(st.integers(0, len(units) - start))
    first_unit = data.draw(st.integers(0, 3))
    cq = np.full((first_unit + count + 1) * 20, 0xAB, np.uint8)
    K.cq_put_many(cq, first_unit, np.array([u[0] for u in units], np.int64),
                  np.array([u[1] for u in units], np.int64),
                  np.array([u[2] for u in units], np.int64), start, count)
    fill = b"\xab" * 20
    assert bytes(cq) == fill * first_unit + cq_bytes(units[start:start + count]) + fill
    view = cq[first_unit * 20:(first_unit + count) * 20].view(L.CQ_UNIT_DTYPE)
    assert [tuple(int(x) for x in u) for u in view] == units[start:start + count]


@budget(100)
@given(old=st.lists(cq_unit(), min_size=1, max_size=12), data=st.data())
def test_cq_put_units_writes_them_and_counts_the_changed(old, data):
    """cq_put_units against its twin: the bytes after, and the units that
    differed (some drawn equal to what was there)."""
    first = data.draw(st.integers(0, len(old) - 1))
    new = [data.draw(st.just(u) | cq_unit()) for u in old[first:]][:data.draw(st.integers(0, len(old) - first))]
    raw, units = cq_bytes(old), cq_bytes(new)
    cq = u8(raw)
    got = K.cq_put_units(cq, first, u8(units) if units else np.zeros(0, np.uint8), len(new))
    want_bytes, want = naive.cq_put_units(raw, first, units)
    assert bytes(cq) == want_bytes and got == want
    assert got == sum(a != b for a, b in zip(old[first:], new))


@st.composite
def scan_rows(draw) -> list[dict]:
    """Rows as scan_records gives them, for cq_group_rows: few queues (so
    they repeat), transaction types of every kind, queue offsets mostly
    consecutive per queue, sometimes not."""
    n = draw(st.integers(0, 40))
    keys = draw(st.lists(st.tuples(INT64, st.integers(0, 2**31 - 1)), min_size=1, max_size=4))
    nxt: dict = {}
    rows = []
    for _ in range(n):
        key = draw(st.sampled_from(keys))
        q = nxt.get(key, draw(st.integers(0, 2**40)))
        if draw(st.integers(0, 9)) == 0:
            q = draw(st.integers(0, 2**40))          # an anomaly
        nxt[key] = q + 1
        rows.append(dict(topic_hash=key[0], queue_id=key[1], queue_offset=q,
                         sysflag=draw(st.sampled_from([0, 0x4, 0x8, 0xC, 0x1, 0x2])),
                         phy=draw(st.integers(0, 2**50)), size=draw(st.integers(1, 2**31 - 2)),
                         tags_code=draw(INT64)))
    return rows


@budget(150)
@given(rows=scan_rows())
def test_cq_group_rows_matches_twin(rows):
    """cq_group_rows against its twin: the groups, their order and rows,
    their anomalies, and each row's unit in the layout."""
    n = len(rows)
    arr = np.zeros((n, L.N_SCAN), np.int64)
    for i, r in enumerate(rows):
        arr[i, L.S_TOPIC_HASH], arr[i, L.S_QUEUE_ID] = r["topic_hash"], r["queue_id"]
        arr[i, L.S_QUEUE_OFFSET], arr[i, L.S_SYSFLAG] = r["queue_offset"], r["sysflag"]
        arr[i, L.S_PHY], arr[i, L.S_SIZE], arr[i, L.S_TAGS_CODE] = r["phy"], r["size"], r["tags_code"]
    units, order, qoffs = np.zeros(n * 20, np.uint8), np.zeros(n, np.int64), np.zeros(n, np.int64)
    bounds, anomalies = np.zeros(n + 1, np.int64), np.zeros(n, np.int64)
    groups = K.cq_group_rows(arr, units, order, qoffs, bounds, anomalies)
    want = naive.cq_group_rows(rows)
    assert groups == len(want)
    for g, (key, idx, anomalous) in enumerate(want):
        a, b = int(bounds[g]), int(bounds[g + 1])
        assert order[a:b].tolist() == idx and int(anomalies[g]) == anomalous
        assert qoffs[a:b].tolist() == [rows[i]["queue_offset"] for i in idx]
        assert bytes(units[a * 20:b * 20]) == cq_bytes(
            [(rows[i]["phy"], rows[i]["size"], rows[i]["tags_code"]) for i in idx])
        assert all((rows[i]["topic_hash"], rows[i]["queue_id"]) == key for i in idx)


def test_cq_group_rows_queues_whose_slots_collide():
    """Two queues whose (topic hash ^ queue id) is the same slot: the table
    probes on; 20 rows: a table past its first size. Each keeps its rows."""
    keys = [(0, 1), (1, 0), (2, 3)]              # 0 ^ 1 == 1 ^ 0: one slot
    arr = np.zeros((20, L.N_SCAN), np.int64)
    for i in range(20):
        arr[i, L.S_TOPIC_HASH], arr[i, L.S_QUEUE_ID] = keys[i % 3]
        arr[i, L.S_QUEUE_OFFSET], arr[i, L.S_SIZE] = i // 3, 1
    units, order, qoffs = np.zeros(400, np.uint8), np.zeros(20, np.int64), np.zeros(20, np.int64)
    bounds, anomalies = np.zeros(21, np.int64), np.zeros(20, np.int64)
    assert K.cq_group_rows(arr, units, order, qoffs, bounds, anomalies) == 3
    assert bounds[:4].tolist() == [0, 7, 14, 20] and anomalies[:3].tolist() == [0, 0, 0]
    assert order[:7].tolist() == list(range(0, 20, 3)) and order[7:14].tolist() == list(range(1, 20, 3))
    # the last slot of a table of 16 taken twice: the probe goes on at its first
    arr = np.zeros((4, L.N_SCAN), np.int64)
    for i, key in enumerate([(15, 0), (0, 15), (15, 0), (0, 15)]):
        arr[i, L.S_TOPIC_HASH], arr[i, L.S_QUEUE_ID] = key
        arr[i, L.S_QUEUE_OFFSET] = i // 2
    assert K.cq_group_rows(arr, units, order, qoffs, bounds, anomalies) == 2
    assert bounds[:3].tolist() == [0, 2, 4] and order[:4].tolist() == [0, 2, 1, 3]


# ---------------------------------------------------------------- batch bodies
@st.composite
def batch_entries(draw) -> bytes:
    """One SEND_BATCH entry as a client writes it, except that MAGICCODE and
    BODYCRC are anything (the broker must not care)."""
    body = draw(st.binary(max_size=200))
    props = draw(PROPS_TEXT.map(str.encode) | st.binary(max_size=40))
    return struct.pack(">iiiii", 20 + len(body) + 2 + len(props), draw(INT32 | st.just(0)),
                       draw(INT32 | st.just(0)), draw(INT32), len(body)) + body + struct.pack(
        ">h", len(props)) + props


@st.composite
def batch_bodies(draw) -> bytes:
    """A well-formed body, or one damaged as an untrusted sender might:
    cut anywhere, a length field overwritten (negative, past the end,
    2**31-1), random bytes written over it or appended, or noise alone."""
    body = b"".join(draw(st.lists(batch_entries(), max_size=5)))
    how = draw(st.sampled_from(["whole", "cut", "length", "overwrite", "append", "noise"]))
    event(how)
    if how == "cut" and body:
        body = body[:draw(st.integers(0, len(body) - 1))]
    elif how == "length" and body:
        at = draw(st.integers(0, len(body) - 1))
        value = draw(st.sampled_from([-1, -2**31, 0, 1, 21, 22, 2**15, 2**31 - 1]) | INT32)
        fmt = draw(st.sampled_from([">i", ">h"]))
        raw = struct.pack(fmt, value if fmt == ">i" else max(-2**15, min(value, 2**15 - 1)))
        body = (body[:at] + raw + body[at + len(raw):])[:len(body)]
    elif how == "overwrite" and body:
        at = draw(st.integers(0, len(body) - 1))
        noise = draw(st.binary(min_size=1, max_size=8))
        body = (body[:at] + noise + body[at + len(noise):])[:len(body)]
    elif how == "append":
        body += draw(st.binary(min_size=1, max_size=30))
    elif how == "noise":
        body = draw(st.binary(max_size=120))
    return body


SUFFIX = st.sampled_from([b"", b"WAIT\x01true", b"\x02", b"CLUSTER\x01c\x02"]) | st.binary(
    max_size=12) | st.just(b"K\x01" + b"v" * (L.PROPERTIES_BYTES_MAX - 40))


def kernel_split_batch(body: bytes, max_entries: int, suffix: bytes):
    """split_batch with the buffers its docstring asks for; the twin's shape
    of answer, checking on the way that the properties are packed."""
    buf = u8(body)
    sfx = u8(suffix)
    props = np.full(len(body) + max_entries * (len(suffix) + 1), 0xEE, np.uint8)
    meta = np.full((max(max_entries, 1), 5), -7, np.int64)
    n, status = K.split_batch(buf, max_entries, sfx, props, meta)
    entries, packed = [], 0
    for flag, body_at, body_len, props_at, props_len in meta[:n].tolist():
        assert props_at == packed            # each entry's properties right after the last's
        packed += props_len
        entries.append((flag, body_at, body_len, bytes(props[props_at:props_at + props_len])))
    return entries, int(status)


@budget(200)
@given(body=batch_bodies(), suffix=SUFFIX, data=st.data())
def test_split_batch_matches_twin(body, suffix, data):
    """Whole, cut, overwritten and random bodies: the same entries and the
    same status as the twin; a body the twin accepts in full splits into
    entries whose bodies are where the entries put them."""
    max_entries = data.draw(st.integers(0, 7), label="max_entries")
    got = kernel_split_batch(body, max_entries, suffix)
    want = naive.split_batch(body, max_entries, suffix)
    event(f"status {want[1]}")
    assert got == want
    for flag, body_at, body_len, _ in got[0]:
        assert 0 <= body_at and body_at + body_len <= len(body)


def test_split_batch_known_answers():
    entry = struct.pack(">iiiii", 20 + 2 + 2 + 3, 0, 0, 7, 2) + b"hi" + struct.pack(">h", 3) + b"a\x01b"
    assert naive.split_batch(entry * 2, 2, b"W\x01t") == (
        [(7, 20, 2, b"a\x01b\x02W\x01t"), (7, 47, 2, b"a\x01b\x02W\x01t")], naive.BATCH_OK)
    assert kernel_split_batch(entry * 2, 2, b"W\x01t") == naive.split_batch(entry * 2, 2, b"W\x01t")
    for body, max_entries, suffix, status in [
            (entry * 3, 2, b"", K.BATCH_TOO_MANY),
            (entry[:-1], 4, b"", K.BATCH_TRUNCATED),                       # cut inside
            (entry + b"\x00\x00\x00", 4, b"", K.BATCH_TRUNCATED),          # a few bytes after
            (struct.pack(">i", 2**31 - 1) + entry[4:], 4, b"", K.BATCH_TRUNCATED),
            (entry[:16] + struct.pack(">i", -1) + entry[20:], 4, b"", K.BATCH_TRUNCATED),
            (entry[:22] + struct.pack(">h", -1) + entry[24:], 4, b"", K.BATCH_TRUNCATED),
            (entry, 4, b"x" * (L.PROPERTIES_BYTES_MAX - 3), K.BATCH_PROPS_TOO_LONG)]:
        assert kernel_split_batch(body, max_entries, suffix)[1] == status
        assert naive.split_batch(body, max_entries, suffix)[1] == status
    # MAGICCODE and BODYCRC are the client's zeros or anything: not checked
    odd = entry[:4] + struct.pack(">ii", 0x12345678, -5) + entry[12:]
    assert kernel_split_batch(odd, 1, b"")[1] == K.BATCH_OK


# ------------------------------------------------------------ columnar decode
def kernel_records_at(seg: Segment, units: list[tuple[int, int]], tags_key=TAGS_KEY):
    phys = np.array([u[0] for u in units], np.int64)
    sizes = np.array([u[1] for u in units], np.int64)
    out = np.full((len(units), K.N_SCAN), -7, np.int64)
    n = K.records_at(u8(seg.buf), seg.phy_base, phys, sizes, 0, len(units), tags_key, out)
    return [tuple(int(x) for x in row) for row in out[:n]]


@st.composite
def units_into(draw, seg: Segment) -> list[tuple[int, int]]:
    """ConsumeQueue units for ``seg``: mostly its records, with a wrong one
    somewhere (a pad, the blank or zeros at the end, a size off by some
    bytes, a position inside a record or outside the segment, extremes a
    torn unit can hold)."""
    true = [(seg.phy_base + p, naive.scan_records(seg.buf, p, len(seg.buf), seg.phy_base,
                                                   False)[0][0][1]) for p in seg.starts]
    units = draw(st.lists(st.sampled_from(true), min_size=1, max_size=6)) if true else []
    if draw(st.booleans()):
        bad = draw(st.one_of(
            st.sampled_from(true).map(lambda u: (u[0], u[1] + 1)) if true else st.nothing(),
            st.sampled_from(true).map(lambda u: (u[0], u[1] - 1)) if true else st.nothing(),
            st.sampled_from(seg.pads).map(lambda p: (seg.phy_base + p, 40)) if seg.pads
            else st.nothing(),
            st.just((seg.phy_base + seg.records_end, len(seg.buf) - seg.records_end)),
            st.tuples(st.integers(seg.phy_base - 100, seg.phy_base + len(seg.buf) + 100),
                      st.integers(-5, 400)),
            st.tuples(st.sampled_from([-2**63, -1, 2**62, 2**63 - 1, 2**63 - 50]),
                      st.sampled_from([1, 100, 2**31 - 1, L.CQ_PAD_SIZE])),
            st.tuples(st.just(seg.phy_base), st.sampled_from([0, -1, 2**63 - 1]))))
        units.insert(draw(st.integers(0, len(units))), bad)
    return units


@budget(100)
@given(seg=segments(pads=True), data=st.data())
def test_records_at_matches_twin(seg, data):
    """The rows of the leading units that are whole records of their size,
    as the twin (scan one record where the unit points) finds them; with the
    tags key and without it (readers pass none: tags code 0)."""
    units = data.draw(units_into(seg), label="units")
    want = naive.records_at(seg.buf, seg.phy_base, units)
    assert kernel_records_at(seg, units) == want
    tags = naive.SCAN_COLUMNS.index("tags_code")
    no_tags = [row[:tags] + (0,) + row[tags + 1:] for row in want]
    assert kernel_records_at(seg, units, np.zeros(0, np.uint8)) == no_tags
    event(f"{len(want)} of {len(units)} units read")


@budget(100)
@given(seg=segments(pads=True), data=st.data())
def test_uniq_hashes_match_twin_and_the_appends_lookup(seg, data):
    """The window's hash of each unit's record (``dedup.rebuild``), as the
    twin finds it; for every whole record not consumed again, the very hash
    the append's lookup makes of its properties (``dedup.key_hash``), so a
    refilled window catches what the live one would."""
    from shmq.core.dedup import key_hash
    from shmq.core.records import uniq_hashes
    units = data.draw(units_into(seg), label="units")
    phys = np.array([u[0] for u in units], np.int64)
    sizes = np.array([u[1] for u in units], np.int64)
    got = uniq_hashes(u8(seg.buf), seg.phy_base, phys, sizes).tolist()
    assert got == naive.uniq_hashes(seg.buf, seg.phy_base, units)
    for (phy, size), h in zip(units, got):
        rows = naive.records_at(seg.buf, seg.phy_base, [(phy, size)])
        f = rows and naive.parse_record(seg.buf[phy - seg.phy_base:phy - seg.phy_base + size])
        if f and f["reconsume_times"] == 0:
            assert h == key_hash(f["properties"])
    event(f"{sum(1 for h in got if h)} of {len(units)} keyed")


KEYED_PROPS = st.lists(PIECE | st.tuples(st.sampled_from(["UNIQ_KEY", "UNIQ_KEX", "XNIQ_KEY"]),
                                          VALUE).map("\x01".join), max_size=5).map(lambda pieces: "\x02".join(pieces).encode())


@budget(100)
@given(records=st.lists(st.tuples(KEYED_PROPS, st.sampled_from([0, 0, 0, 1, -1]),
                                  st.sampled_from([0, L.SYSFLAG_BORNHOST_V6 | L.SYSFLAG_STOREHOST_V6])),
                        min_size=1, max_size=6),
       phy_base=st.integers(0, 2**40))
def test_uniq_hashes_of_keyed_records_are_the_appends_lookup(records, phy_base):
    """Records whose properties mostly carry UNIQ_KEY pieces (first, later,
    twice, empty, near misses of its name), some consumed again, some with IPv6 hosts: the twin's
    hashes, and for each one not consumed again the append's lookup."""
    from shmq.core.dedup import key_hash
    from shmq.core.records import uniq_hashes
    buf, units = b"", []
    for props, reconsume, sysflag in records:
        host = ("::1", 7) if sysflag else ("127.0.0.1", 7)
        rec = naive.encode_record("T", b"body", props, sysflag=sysflag, born_host=host,
                                  store_host=host, reconsume_times=reconsume,
                                  phy_offset=phy_base + len(buf))
        units.append((phy_base + len(buf), len(rec)))
        buf += rec
    got = uniq_hashes(u8(buf), phy_base, np.array([u[0] for u in units], np.int64),
                      np.array([u[1] for u in units], np.int64)).tolist()
    assert got == naive.uniq_hashes(buf, phy_base, units)
    assert [h for h, (_, reconsume, _) in zip(got, records) if reconsume] == \
        [0 for _, reconsume, _ in records if reconsume]
    assert [h for h, r in zip(got, records) if not r[1]] == \
        [key_hash(props) for props, reconsume, _ in records if not reconsume]
    event(f"{sum(1 for h in got if h)} of {len(units)} keyed")


def decoded_columns(seg: Segment, rows: list[tuple]) -> list[dict]:
    """R.decode_columns (arrow_columns in buffers the wrapper sizes) row by row."""
    arr = np.array(rows, np.int64).reshape(len(rows), K.N_SCAN)
    cols = R.decode_columns(u8(seg.buf), seg.phy_base, arr)
    out = []
    for i in range(len(rows)):
        row = {name: int(cols.fixed[name][i]) for name, _ in R.FIXED_COLUMNS}
        for name in R.VAR_COLUMNS:
            off, dat = cols.var[name]
            row[name] = bytes(dat[off[i]:off[i + 1]])
            if name in cols.valid and not cols.valid[name][i]:
                assert row[name] == b"", name         # a null adds no bytes
                row[name] = None
        out.append(row)
    return out


@budget(100)
@given(seg=segments(pads=True))
def test_arrow_columns_match_twin(seg):
    """Every column of every record (IPv4 and IPv6 hosts, TAGS/KEYS absent,
    empty or duplicated, msgId from UNIQ_KEY or the offset id) is what the
    twin reads from the layout table."""
    rows, _, _ = naive.scan_records(seg.buf, 0, len(seg.buf), seg.phy_base, False)
    assert decoded_columns(seg, rows) == [naive.arrow_columns(seg.buf, seg.phy_base, r)
                                          for r in rows]


PROPS_BYTES = st.lists(st.sampled_from([b"\x01", b"\x02", b"a", b"TAGS", b"\xff", b"\x01\x01"]),
                       max_size=30).map(b"".join)


@budget(300)
@given(strings=st.lists(PROPS_BYTES, max_size=6), before=st.binary(max_size=3))
def test_property_spans_match_twin(strings, before):
    """Rows of properties strings laid end to end (as the properties column
    holds them): the pieces Java keeps, in order, duplicates included."""
    dat = before + b"".join(strings)
    offs = [len(before)]
    for s in strings:
        offs.append(offs[-1] + len(s))
    n = len(strings)
    cap = dat.count(b"\x02") + n
    ks, kl, vs, vl = (np.full(cap, -7, np.int64) for _ in range(4))
    row_off = np.full(n + 1, -7, np.int32)
    m = K.property_spans(u8(dat), np.array(offs, np.int32), n, ks, kl, vs, vl, row_off)
    want = naive.property_spans(dat, offs)
    got = [[(int(ks[k]), int(kl[k]), int(vs[k]), int(vl[k]))
            for k in range(row_off[i], row_off[i + 1])] for i in range(n)]
    assert got == want and m == sum(len(r) for r in want) == row_off[n]


@budget(200)
@given(dat=st.binary(max_size=60), data=st.data())
def test_gather_spans_matches_twin(dat, data):
    spans = data.draw(st.lists(st.integers(0, len(dat)).flatmap(
        lambda s: st.tuples(st.just(s), st.integers(0, len(dat) - s))), max_size=8))
    m = len(spans)
    want_off, want = naive.gather_spans(dat, spans)
    out_off = np.full(m + 1, -7, np.int32)
    out = np.full(len(want), 0xEE, np.uint8)
    K.gather_spans(u8(dat), np.array([s for s, _ in spans], np.int64),
                   np.array([n for _, n in spans], np.int64), m, out_off, out)
    assert out_off.tolist() == want_off and bytes(out) == want


# ----------------------------------------------- a pull's records as rows
def kernel_pull_rows(body: bytes, check_crc: bool, cap: int) -> tuple[list[tuple], int]:
    """pull_rows with ``cap`` rows of output, called again on the rest while
    it fills them; rows and where the walk stopped, in the whole body's terms."""
    rows: list[tuple] = []
    pos = 0
    while True:
        out = np.full((cap, K.N_PULL), -7, np.int64)
        rest = u8(body[pos:])
        n, stop = K.pull_rows(rest, check_crc, K.CRC_TABLES, out)
        for r in out[:n].tolist():
            for c in (K.P_START, K.P_BODY_POS, K.P_TOPIC_AT):
                r[c] += pos
            rows.append(tuple(r))
        if n < cap or pos + stop == len(body):
            return rows, pos + int(stop)
        pos += int(stop)


@budget(150)
@given(seg=segments(), check_crc=st.booleans(), data=st.data())
def test_pull_rows_walks_a_pull_as_the_clients_decoder_does(seg, check_crc, data):
    """A pull's body (records one after another), whole, cut short or with
    bytes changed: the kernel's rows are the client's Python walk's
    (client/batch.py, where numba is not installed), and the records it
    keeps and leaves out are the ones ``decode_messages``'s own loop keeps
    and skips (where the kernel is loaded, it decodes from these rows)."""
    from shmq.client.message import _decode_loop
    from shmq.client.walk import _rows_here
    body = bytearray(seg.buf[:seg.records_end])
    how = data.draw(st.sampled_from(["whole", "cut", "flip", "flips"]))
    if how == "cut":
        del body[data.draw(st.integers(0, len(body))):]
    elif body and how != "whole":
        for _ in range(1 if how == "flip" else 3):
            body[data.draw(st.integers(0, len(body) - 1))] ^= data.draw(st.integers(1, 255))
    body = bytes(body)
    event(how)
    rows, stop = kernel_pull_rows(body, check_crc, data.draw(st.integers(1, seg.count + 1)))
    here, here_stop = _rows_here(body, check_crc)
    assert rows == [tuple(r) for r in here.tolist()] and stop == here_stop
    ok = [r for r in rows if r[K.P_STATUS] == K.PULL_OK]
    left_out = [(r[K.P_QUEUE_OFFSET], True) for r in rows if r[K.P_STATUS] != K.PULL_OK]
    if stop < len(body):
        left_out.append(None)                         # a frame that ends the walk
    if not check_crc:
        return
    skipped: list = []
    msgs = _decode_loop(body, "b", None, True, skipped)   # the Python loop, not the rows
    assert [(m.queue_offset, m._pos, m.store_size) for m in msgs] == \
        [(r[K.P_QUEUE_OFFSET], r[K.P_START], r[K.P_SIZE]) for r in ok]
    assert [(q, framed) if framed else None for q, _, framed in skipped] == left_out
    for m, r in zip(msgs, ok):
        assert body[r[K.P_BODY_POS]:r[K.P_BODY_POS] + r[K.P_BODY_LEN]] == \
            body[m._pos + m._tr - m._blen:m._pos + m._tr]


def test_pull_rows_known_answers():
    """Each way a record is left out, and each way a walk ends, once."""
    rec = naive.encode_record("T", b"body", b"TAGS\x01a", queue_id=0, flag=0, sysflag=0,
                              born_timestamp=1, born_host=("127.0.0.1", 1), store_timestamp=2,
                              store_host=("127.0.0.1", 2), reconsume_times=0, prepared_offset=0,
                              queue_offset=5, phy_offset=0)
    bad_crc = bytearray(rec)
    bad_crc[rec.index(b"body")] ^= 1
    t = rec.index(b"body") + 4                             # TOPICLENGTH
    fields = []
    for at, value in ((t, b"\x00"),                       # a topic of 0 bytes
                      (84, struct.pack(">i", len(rec))),  # BODYLENGTH past the record
                      (84, struct.pack(">i", -1)),
                      (t + 2, b"\x80\x00"),                # PROPERTIESLENGTH negative
                      (t + 2, b"\x00\x09")):               # ... not the record's rest
        bad = bytearray(rec)
        bad[at:at + len(value)] = value
        fields.append(bytes(bad))
    for body, statuses, stop in ((rec * 2, [K.PULL_OK] * 2, 2 * len(rec)),
                                 (bytes(bad_crc) + rec, [K.PULL_CRC, K.PULL_OK], 2 * len(rec)),
                                 *((bad + rec, [K.PULL_FIELDS, K.PULL_OK], 2 * len(rec))
                                   for bad in fields),
                                 (rec + rec[:50], [K.PULL_OK], len(rec)),
                                 (rec + bytes(len(rec)), [K.PULL_OK], len(rec))):
        rows, got_stop = kernel_pull_rows(body, True, 4)
        assert [r[K.P_STATUS] for r in rows] == statuses and got_stop == stop
        assert rows[-1][K.P_QUEUE_OFFSET] == 5
    assert kernel_pull_rows(bytes(bad_crc), False, 1)[0][0][K.P_STATUS] == K.PULL_OK


# ------------------------------------------- regressions (bugs found and fixed)
@pytest.mark.parametrize("raw, java_text", [
    pytest.param(b"\xe2\x82A", "\ufffdA", id="truncated-3-byte-sequence"),
    pytest.param(b"\xc0\x80", "\ufffd\ufffd", id="overlong-nul"),
    pytest.param(b"\xf4\x90\x80\x80", "\ufffd" * 4, id="above-U+10FFFF"),
])
def test_java_hash_of_malformed_utf8_is_javas(raw, java_text):
    """RocketMQ's broker computes the tags code as new String(props, UTF_8)
    .hashCode(), whose decoder replaces a maximal ill-formed subsequence by
    one U+FFFD and rejects overlong and above-U+10FFFF forms."""
    assert raw.decode("utf-8", "replace") == java_text
    assert K.java_hash_utf8(u8(raw), 0, len(raw)) == naive.java_string_hash(java_text)


def test_find_property_counts_chars_not_bytes():
    """"é\\x01" is 2 Java chars (3 UTF-8 bytes): Java skips that piece, so
    the earlier "é" -> "x" stands."""
    props = "é\x01x\x02é\x01".encode()
    assert naive.find_property(props, "é") == b"x"
    assert kernel_find_property(props, "é") == b"x"


def test_cq_valid_units_rejects_a_unit_ending_past_int64_max():
    """A garbage unit (a torn ConsumeQueue write) pointing just below 2**63:
    it does not end before cl_end, so recovery must not keep it."""
    raw = cq_bytes([(2**63 - 100, 1000, 0)])
    assert naive.cq_valid_units(raw, 0, 1, 2**40) == (0, -1)
    assert tuple(int(x) for x in K.cq_valid_units(u8(raw), 0, 1, 2**40)) == (0, -1)


_GUARD_PAGE_SCAN = textwrap.dedent("""
    import ctypes, mmap, struct
    import numpy as np
    from shmq.core import _kernels as K, jit, layout as L
    jit.load(("scan",))      # the broker's specialisation, from the cache: no compile here
    jit.freeze(("scan",))
    page = mmap.PAGESIZE
    mem = mmap.mmap(-1, 2 * page)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mem))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(addr + page, page, 0) == 0      # PROT_NONE guard page
    seg = np.frombuffer(mem, np.uint8, count=page)
    pos = page - 92
    # A 92-byte record claiming two IPv6 hosts, ending exactly at the segment end.
    seg[pos:] = np.frombuffer(struct.pack(">iI", 92, L.MESSAGE_MAGIC) + bytes(84), np.uint8)
    seg[pos + 36:pos + 40] = np.frombuffer(struct.pack(">i", 0x30), np.uint8)
    seg[pos + 28:pos + 36] = np.frombuffer(struct.pack(">q", pos), np.uint8)
    out = np.zeros((1, K.N_SCAN), np.int64)
    n, stop, status = K.scan_records(seg, pos, page, 0, False, K.CRC_TABLES,
                                     np.frombuffer(b"TAGS", np.uint8), out)
    print(int(n), int(stop) - pos, int(status))
""")


def test_scan_never_reads_past_the_segment_end():
    """A short record with both IPv6 bits at the very end of a mapping that is
    followed by an inaccessible page: the scan must say CORRUPT, not crash."""
    run = subprocess.run([sys.executable, "-c", _GUARD_PAGE_SCAN], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.split() == ["0", "0", str(K.SCAN_CORRUPT)]


@given(data=st.data(), n=st.integers(0, 300))
@settings(max_examples=200, deadline=None)
def test_last_nonzero_matches_twin(data, n):
    raw = bytearray(n)
    for i in data.draw(st.lists(st.integers(0, max(0, n - 1)), max_size=4)) if n else []:
        raw[i] = data.draw(st.integers(1, 255))
    start = data.draw(st.integers(0, n))
    assert K.last_nonzero(u8(bytes(raw)), start) == naive.last_nonzero(bytes(raw), start)


def test_records_at_refuses_a_unit_whose_end_wraps_past_int64_max():
    """A torn ConsumeQueue unit with phy just below 2**63: phy + size wrapped
    negative, passed the bounds check and the scan read outside the segment
    (a segfault). Found by the records_at twin; the check no longer adds."""
    seg = Segment(bytes(4096), 0, [], 0, "zeros", [])
    for units in ([(2**63 - 1, 100)], [(2**63 - 50, 2**31 - 1)], [(-2**63, 100)]):
        assert naive.records_at(seg.buf, 0, units) == []
        assert kernel_records_at(seg, units) == []


# ----------------------------------- guards no generated input reaches (the
# JIT-off run's coverage gate counts every kernel line: these are the lines
# that only damaged files or a caller's mistake reach)
def test_encode_batch_refuses_an_output_too_small():
    """encode_batch returns -1 instead of writing past ``out`` (the wrapper
    sizes it exactly, so only a bug in the wrapper would meet this)."""
    got = []
    real = K.encode_batch

    def short(out, *args):
        got.append(real(out[:-1], *args))
        return real(out, *args)

    with mock.patch.object(K, "encode_batch", short):
        R.encode("T", [b"a", b"b"], properties=b"", queue_ids=[1, 1])
    assert got == [-1]


def test_scan_refuses_ipv6_hosts_that_do_not_fit_the_record():
    """In process (the guard-page test above runs in a subprocess): a record
    of the IPv4 minimum size whose SYSFLAG claims IPv6 hosts is corrupt."""
    rec = bytearray(struct.pack(">iI", 92, L.MESSAGE_MAGIC) + bytes(84))
    struct.pack_into(">i", rec, L.OFF_SYSFLAG, L.SYSFLAG_BORNHOST_V6 | L.SYSFLAG_STOREHOST_V6)
    assert kernel_scan(bytes(rec), 0, 92, 0, False, 1) == ([], 0, K.SCAN_CORRUPT)
    assert naive.scan_records(bytes(rec), 0, 92, 0, False) == ([], 0, naive.SCAN_CORRUPT)


def index_file(slot_num: int, index_num: int, puts) -> np.ndarray:
    idx = np.zeros(L.IX_HEADER_BYTES + slot_num * L.IX_SLOT_BYTES + index_num * L.IX_ENTRY_BYTES,
                   np.uint8)
    for key_hash, phy in puts:
        assert K.index_put(idx, slot_num, index_num, key_hash, phy, 1_700_000_000_000)
    return idx


def entry_at(slot_num: int, i: int) -> int:
    return L.IX_HEADER_BYTES + slot_num * L.IX_SLOT_BYTES + i * L.IX_ENTRY_BYTES


def test_index_check_finds_entries_index_put_cannot_write():
    """A negative timeDiff, and a prevIndex naming an entry of another slot
    (a torn or overwritten file): IX_BAD_ENTRY, with the slots in use."""
    idx = index_file(4, 8, [(1, 100), (2, 200)])
    assert tuple(K.index_check(idx, 4, 3)) == (K.IX_OK, 2)
    bad = idx.copy()
    struct.pack_into(">i", bad, entry_at(4, 1) + L.IX_ENTRY_TIME_DIFF, -1)
    assert tuple(K.index_check(bad, 4, 3)) == (K.IX_BAD_ENTRY, 2)
    bad = idx.copy()
    struct.pack_into(">i", bad, entry_at(4, 2) + L.IX_ENTRY_PREV, 1)   # key 2's chain -> key 1's
    assert tuple(K.index_check(bad, 4, 3)) == (K.IX_BAD_ENTRY, 2)


def test_index_select_stops_at_an_entry_with_a_negative_time():
    idx = index_file(4, 8, [(1, 100), (1, 200)])
    out = np.zeros(4, np.int64)
    assert K.index_select(idx, 4, 8, 1, 4, 0, 2**62, out, 0) == 2
    struct.pack_into(">i", idx, entry_at(4, 2) + L.IX_ENTRY_TIME_DIFF, -1)
    assert K.index_select(idx, 4, 8, 1, 4, 0, 2**62, out, 0) == 0


# ------------------------------------------------ the send lane (frames.py)
# Its twin is the way every request goes: FrameDecoder, send.send_fields and
# prepare's checks, records.encode_record. The property: whatever frame
# read_sends takes, that way would store the very same record (and answer it
# with the very same bytes); what it does not take goes that way.
def _lane_twin(frame: bytes, cluster: str, max_body: int):
    """The record the send path would store for ``frame`` when it is a
    plain single send to a known topic (the lane's to take), else None."""
    from shmq.broker.delivery import needs_routing
    from shmq.broker.handlers.send import send_fields
    from shmq.ipc.remoting import FrameDecoder
    dec = FrameDecoder()
    dec.receive_data(frame)
    try:
        cmd = dec.next_command()
        if cmd is None or cmd.code not in (10, 310) or cmd.flag or cmd.serialize_type:
            return None
        g, topic, qid, sysflag, born, flag, props, rc, batch = send_fields(cmd.code, cmd.ext)
    except Exception:        # (BadRequest, RemoteProtocolError): answered that way, not stored
        return None
    props = props.rstrip("\x02")
    if "CLUSTER\x01" not in props:
        props = f"{props}\x02{cluster}" if props else cluster
    if batch or rc or qid < 0 or needs_routing(props, sysflag) or not cmd.body:
        return None
    try:
        return R.encode_record(topic.encode(), cmd.body, props.encode(), qid, flag, sysflag, born,
                               _LANE_HOST, _LANE_HOST, 7, 0, 0, max_body), props.encode()
    except ValueError:
        return None


_LANE_HOST = R.host_raw("127.0.0.1", 4321)


def _lane_read(data: bytes, cluster: str = "CLUSTER\x01c", max_body: int = 4096):
    """read_sends and encode_sends over ``data``: (frames taken, out, each record)."""
    from shmq.broker.handlers.lane import KEYS
    from shmq.core import sends as S
    view = S.u8(data)
    out = np.zeros((64, S.N_F), np.int64)
    scratch = np.zeros(2 * len(data) + 64 * 64, np.uint8)
    n = S.read_sends(view, 0, len(data), 64, KEYS, S.u8(cluster.encode()), max_body, out, scratch)
    recs = np.zeros(max(1, int(out[:n, S.F_SIZE].sum())), np.uint8)
    srt = np.zeros((S.N_S, 64), np.int64)
    groups = np.zeros((2, 65), np.int64)
    host = S.u8(_LANE_HOST[0])
    ng = S.encode_sends(view, scratch, out, n, np.zeros(64, np.int64), np.zeros(64, np.int64),
                        host, host, 7, recs, srt, groups)
    by_frame = [b""] * n
    for g in range(ng):                      # each queue's run, its records in the order sent
        frames = srt[S.S_FRAME, groups[0, g]:groups[0, g + 1]].tolist()
        assert frames == sorted(frames) and len({int(out[f, S.F_QID]) for f in frames}) == 1
        for k in range(groups[0, g], groups[0, g + 1]):
            at = groups[1, g] + srt[S.S_POS, k]
            by_frame[srt[S.S_FRAME, k]] = recs[at:at + srt[S.S_SIZE, k]].tobytes()
            assert srt[S.S_SIZE, k] == len(by_frame[srt[S.S_FRAME, k]])
    assert groups[1, ng] == recs.shape[0] or n == 0
    return n, out, by_frame


def _frame(header: bytes, body: bytes = b"hello") -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


_V2_EXT = (b'"a":"G","b":"T1","c":"TBW102","d":4,"e":3,"f":0,"g":1795329007905,"h":0,'
           b'"i":"TAGS\\u0001TagA\\u0002UNIQ_KEY\\u0001K1\\u0002","j":0,"k":false')


def _json_header(top: bytes, ext: bytes) -> bytes:
    """A JSON header: the top-level members ``top`` (each with its comma), then extFields."""
    return b"{" + top + b'"extFields":{' + ext + b"}}"


def _v2(ext: bytes = _V2_EXT, top: bytes = b'"code":310,"opaque":5,"flag":0,'
        b'"language":"JAVA","version":121,') -> bytes:
    return _json_header(top, ext)


# (header, taken?) — taken ones are checked against the twin too
LANE_CASES = [
    (_v2(), True),
    (_v2(_V2_EXT.replace(b'"e":3', b'"e":"2"')), True),                # numbers as strings
    (b' \n{ "code" : 310 , "extFields" : { ' + _V2_EXT + b' } , "flag":0 } \n', True),
    (_v2(_V2_EXT.replace(b"K1", b'a\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u0041\\u004A\\u004a')), True),   # escapes
    (_v2(_V2_EXT.replace(b'"j":0', b'"j":""')), True),
    (_v2(_V2_EXT.replace(b'"j":0', b'"j":"0"') + b',"m":"false","n":null'), True),
    (_v2(_V2_EXT.replace(b'"j":0', b'"m":2')), True),                 # batch 2: not "1"
    (_v2(_V2_EXT.replace(b'"j":0', b'"m":"no"')), True),
    (_v2(_V2_EXT.replace(b'\\u0002","j"', b'\\u0002\\u0002","j"')), True),   # separators cut
    (_v2(_V2_EXT.replace(b'"i":"TAGS', b'"i":"CLUSTER\\u0001x\\u0002TAGS')), True),
    (_v2(_V2_EXT.replace(b'"i":"TAGS', b'"i":"WAIT\\u0001false\\u0002TAGS')), True),
    (_v2(_V2_EXT.replace(b'"i":"TAGS', b'"i":"K\\u0001TIMER DELAY TRAN_MS WAIT\\u0001fals\\u0002TAGS')),
     True),                                            # near misses of every needle
    (_v2(_V2_EXT.replace(b'\\u0002","j"', b'\\u0002x\\u0001DELA","j"')), True),   # one cut short
    (_v2(_V2_EXT.replace(b'\\u0002","j"', b'\\u0002x\\u0001CLUSTE","j"')), True),
    (_v2(_V2_EXT.replace(b',"i":"TAGS\\u0001TagA\\u0002UNIQ_KEY\\u0001K1\\u0002"', b"")), True),
    (_v2(_V2_EXT.replace(b'"i":"TAGS', b'"i":"xUNIQ_KEY\\u0001z\\u0002UNIQ_KEY\\u0001\\u0002TAGS')),
     True),                                                            # an empty key: none
    (_v2(top=b'"code":310,"remark":null,"language":13,"serializeTypeCurrentRPC":"JSON",'
         b'"other":[],'), False),                                      # an array
    (_v2(top=b'"code":310,"remark":"r","language":13,"x":-1,"y":true,'), True),
    (_v2(top=b'"code":10,'), False),                                   # V1 code, V2 letters
    (_v2(top=b'"code":11,'), False),
    (_v2(top=b'"code":"310",'), False),
    (_v2(top=b'"code":310,"flag":2,'), False),                         # oneway
    (_v2(top=b'"code":310,"opaque":2147483648,'), False),
    (_v2(top=b'"code":310,"version":"1",'), False),
    (_v2(top=b'"code":310,"flag":"0",'), False),
    (_v2(top=b'"code":310,"opaque":"1",'), False),
    (_v2(top=b'"code":310,"version":2147483648,'), False),
    (_v2(top=b'"opaque":1,'), False),                                  # no code
    (b'{"code":310,"extFields":null}', False),
    (b'{"code":310,"extFields":1}', False),
    (b'{"code":310}', False),
    (b"{}", False),
    (b"[]", False),
    (b'{"code":310,}', False),
    (b'{"code":310 "flag":0}', False),
    (b'{"code":310,"extFields":{"a":"G",}}', False),
    (b'{"code":310,"extFields":{"a":"G" "b":"T"}}', False),
    (b'{"code":310,"extFields":{"a" "G"}}', False),
    (b'{"code":310,"extFields":{"a":}}', False),
    (b'{"code":310,"extFields":{"a":"G"', False),
    (b'{"code":310,"extFields":{"a":"G",', False),
    (b'{"code":310,"extFields":{"a', False),
    (b'{"code":310,"extFields":{"a":', False),
    (b'{"code":310,"extFields":{"\\u0061":"G"}}', False),
    (b'{"code":310,"extFields":{"a":{}}}', False),
    (b'{"code":310,"extFields":{}}', False),
    (b'{"code":310,"extFields":{' + b",".join(b'"x%d":1' % i for i in range(70)) + b"}}", False),
    (b'{"co\\u0064e":310}', False),
    (b'{"code" 310}', False),
    (b'{"code":', False),
    (b'{"code', False),
    (b'{"code":310', False),
    (b'{"code":310}x', False),
    (b'{"\xc3\xa9":1}', False),
    (b'{"code":01}', False),
    (b'{"code":310.0}', False),
    (b'{"code":3e2}', False),
    (b'{"code":-}', False),
    (b'{"code":1234567890123456789}', False),
    (b'{"code":tru}', False),
    (b'{"code":nul}', False),
    (b'{"code":fals}', False),
    (b'{"code":@}', False),
    (b'{"code":tr', False),
    (b'{"code":310,"extFields":{"a":"G\\', False),
    (b'{"code":310,"extFields":{"a":"G\\u00', False),
]
for bad in (b'"G\\x"', b'"G\\u00"', b'"G\\u00zz"', b'"G\\u00e9"', b'"G\xc3\xa9"', b'"G\x01"', b'"G',
            b'"G\\'):
    LANE_CASES.append((b'{"code":310,"extFields":{"a":' + bad + b"}}", False))
for field, value in ((b'"b":"T1"', b'"b":1'), (b'"b":"T1"', b'"b":""'), (b'"b":"T1"', b'"b":null'),
                     (b'"a":"G"', b'"a":null'), (b'"e":3', b'"e":-1'), (b'"e":3', b'"e":true'),
                     (b'"e":3', b'"e":"3x"'), (b'"e":3', b'"e":"-"'), (b'"e":3', b'"e":"+3"'),
                     (b'"e":3', b'"e":"1234567890123456789"'), (b'"e":3', b'"e":2147483648'),
                     (b'"f":0', b'"f":4'), (b'"f":0', b'"f":-2147483649'), (b'"f":0', b'"f":2147483648'),
                     (b'"h":0', b'"h":2147483648'), (b'"h":0', b'"h":-2147483649'),
                     (b'"j":0', b'"j":1'), (b'"j":0', b'"j":"2"'), (b'"j":0', b'"j":"x"'),
                     (b'"j":0', b'"j":false'), (b'"j":0', b'"m":true'), (b'"j":0', b'"m":1'),
                     (b'"j":0', b'"m":"1"'), (b'"j":0', b'"m":"TRUE"'), (b'"i":"TAGS', b'"i":1,"z":"'),
                     (b'"i":"TAGS', b'"i":"DELAY\\u00013\\u0002TAGS'),
                     (b'"i":"TAGS', b'"i":"TIMER_DELAY_SEC\\u00013\\u0002TAGS'),
                     (b'"i":"TAGS', b'"i":"TRAN_MSG\\u0001true\\u0002TAGS'),
                     (b'"b":"T1"', b'"b":"' + b"t" * 128 + b'"')):
    LANE_CASES.append((_v2(_V2_EXT.replace(field, value)), False))


@pytest.mark.parametrize("header,taken", LANE_CASES)
def test_the_send_lane_takes_what_the_send_path_would_store_the_same_way(header, taken):
    """Each case alone, then behind a frame the lane takes (it stops there,
    taking the first only), then as the frame before one it takes."""
    frame = _frame(header)
    twin = _lane_twin(frame, "CLUSTER\x01c", 4096)
    n, out, recs = _lane_read(frame)
    assert n == (1 if taken else 0), header
    if taken:
        assert twin is not None and recs[0] == bytes(twin[0])
        from shmq.core import sends as S
        from shmq.core.dedup import key_hash
        assert out[0, S.F_TAGS_CODE] == R.tags_code_of(twin[1])
        assert out[0, S.F_KEY_HASH] == key_hash(twin[1])
        assert out[0, S.F_NO_WAIT] == (b"WAIT\x01false" in twin[1])
    good = _frame(_v2())
    assert _lane_read(good + frame)[0] == 1 + taken
    assert _lane_read(frame + good)[0] == (2 if taken else 0)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), st.integers(0, 2**32 - 1),
                          st.binary(max_size=300)), max_size=4))
def test_the_send_lane_reads_random_bytes_without_reading_past_them(pieces):
    """Frame lengths, type and header-length words of any value before any
    bytes (with the JIT off every index is checked): read_sends stops, takes
    nothing of what is not a send, never reads outside the buffer."""
    data = b"".join(struct.pack(">iI", n, t) + b for n, t, b in pieces)
    n, out, _ = _lane_read(data)
    assert 0 <= n <= len(pieces)


def test_the_send_lane_refuses_empty_and_oversized_bodies_and_stops_at_a_part_frame():
    good = _frame(_v2())
    assert _lane_read(_frame(_v2(), b""))[0] == 0
    assert _lane_read(_frame(_v2(), b"x" * 5000))[0] == 0
    assert _lane_read(good + good[:-1])[0] == 1                      # the second incomplete
    assert _lane_read(good + good[:6])[0] == 1
    assert _lane_read(struct.pack(">ii", 3, 0) + good)[0] == 0     # shorter than its header field
    assert _lane_read(struct.pack(">ii", 10, 20) + bytes(10))[0] == 0   # header past the frame
    assert _lane_read(struct.pack(">ii", 4 + 2, 1 << 24 | 2) + b"{}")[0] == 0   # ROCKETMQ type
    from shmq.core import sends as S
    other = _frame(_v2(_V2_EXT.replace(b'"b":"T1"', b'"b":"T2"')))
    n, out, _ = _lane_read(good + good + other + good)
    assert n == 4 and out[:4, S.F_NEW_TOPIC].tolist() == [1, 0, 1, 1]
    long_props = _v2(_V2_EXT.replace(b"K1", b"k" * 32800))
    assert _lane_read(_frame(long_props), max_body=1 << 20)[0] == 0


def _mangled(data, goldens: list[str]) -> tuple[bytes, bytes]:
    """(header, body) of one of the real clients' frames ``goldens``, 1-3
    bytes of its header flipped, dropped, repeated or replaced by JSON's."""
    from pathlib import Path
    raw = (Path(__file__).parent / "golden" / data.draw(st.sampled_from(goldens))).read_bytes()
    hlen = struct.unpack(">i", raw[4:8])[0] & 0xFFFFFF
    header, body = bytearray(raw[8:8 + hlen]), raw[8 + hlen:]
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(header) - 1))
        how = data.draw(st.sampled_from(["flip", "drop", "dup", "byte"]))
        if how == "flip":
            header[i] ^= 1 << data.draw(st.integers(0, 7))
        elif how == "drop":
            del header[i]
        elif how == "dup":
            header.insert(i, header[i])
        else:
            header[i] = data.draw(st.sampled_from(b'"\\{}:,0123456789-tfn \x01'))
    return bytes(header), body


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_a_mangled_send_the_lane_takes_is_one_the_send_path_stores_the_same(data):
    """Bytes of a real client's send header flipped, dropped or repeated:
    whenever the lane still takes the frame, the send path stores the very
    same record."""
    header, body = _mangled(data, ["ons-3.12-send-v2.bin", "cpp-1.2-send.bin",
                                   "ons-3.12-send-v2-sharding-key.bin"])
    frame = _frame(header, body)
    n, _, recs = _lane_read(frame)
    if n:
        twin = _lane_twin(frame, "CLUSTER\x01c", 4096)
        assert twin is not None and recs[0] == bytes(twin[0]), header


def test_the_send_lane_writes_each_queues_records_together_in_the_order_sent():
    frames = [_frame(_v2(_V2_EXT.replace(b'"e":3', b'"e":%d' % q))) for q in (2, 0, 2, 1, 0, 2)]
    n, out, recs = _lane_read(b"".join(frames))
    assert n == 6
    for f, q in enumerate((2, 0, 2, 1, 0, 2)):
        assert struct.unpack_from(">i", recs[f], 12)[0] == q


def test_the_send_lane_places_each_answer_of_the_runs_appended_whole():
    from shmq.core import sends as S
    out = np.zeros((64, S.N_F), np.int64)
    out[:5, S.F_OPAQUE] = [10, 11, 12, 13, 14]
    out[:5, S.F_NO_WAIT] = [0, 1, 0, 0, 1]
    srt = np.zeros((S.N_S, 64), np.int64)
    srt[S.S_FRAME, :5] = [1, 3, 0, 2, 4]           # runs: frames 1, 3 | 0, 2 | 4
    srt[S.S_POS, :5] = [0, 100, 0, 90, 0]
    groups = np.zeros((2, 65), np.int64)
    groups[0, :4] = [0, 2, 4, 5]
    gphy = np.array([1000, -1, 5000], np.int64)     # the second run answered one by one
    gq, gqid = np.array([7, 0, 3], np.int64), np.array([1, 0, 2], np.int64)
    got = []
    for sel in (0, 1, 2):
        f = np.zeros((4, 64), np.int64)
        m = S.place_answers(out, srt, groups, 3, gphy, gq, gqid, sel, *f)
        got.append([tuple(f[:, i].tolist()) for i in range(m)])
    assert got[0] == [(11, 1000, 1, 7), (13, 1100, 1, 8), (14, 5000, 2, 3)]
    assert got[1] == [(13, 1100, 1, 8)]
    assert got[2] == [(11, 1000, 1, 7), (14, 5000, 2, 3)]


def test_the_send_lanes_answers_are_the_send_paths_bytes():
    from shmq.broker.handlers.lane import TEMPLATE, TEMPLATE_OFFS
    from shmq.core import sends as S
    from shmq.ipc.remoting import send_ok_head
    opaque = np.array([0, 1, -5, 2**31 - 1, -2**31], np.int64)
    phy = np.array([0, 255, 2**40 + 7, 2**62, 12345], np.int64)
    qid = np.array([0, 3, 17, 1000, 2**31 - 1], np.int64)
    qoff = np.array([0, 9, 10**12, 2**62, 1], np.int64)
    o = np.zeros(5 * 400, np.uint8)
    m = S.send_ok_frames(TEMPLATE, TEMPLATE_OFFS, S.u8(b"7F00000100002A9F"), opaque, phy, qid,
                         qoff, 5, o)
    assert o[:m].tobytes() == b"".join(
        send_ok_head(0, int(opaque[i]), "7F00000100002A9F%016X" % phy[i], int(qid[i]), int(qoff[i]))
        for i in range(5))


# ------------------------------------------------ the pull lane (frames.py)
# Its twin is the way every request goes: FrameDecoder and the fields
# handlers/pull.py reads. The property: whatever pull read_pulls takes, that
# way reads the very same fields from it; what it does not take goes that way.
def _pull_twin(frame: bytes):
    """The fields the pull handler reads from ``frame`` (opaque, group,
    topic, queue, offset, maxMsgNums, sysFlag, commitOffset or None, the
    subscription it uses or None, expressionType or None) when it is a JSON
    PULL_MESSAGE request whose six first fields read, else None."""
    from shmq.ipc.remoting import FrameDecoder
    dec = FrameDecoder()
    dec.receive_data(frame)
    try:
        cmd = dec.next_command()
        if cmd is None or cmd.code != 11 or cmd.flag or cmd.serialize_type:
            return None
        ext = cmd.ext
        fields = (cmd.opaque, ext["consumerGroup"], ext["topic"], int(ext["queueId"]),
                  int(ext["queueOffset"]), int(ext["maxMsgNums"]), int(ext["sysFlag"]))
    except Exception:        # (KeyError, ValueError, RemoteProtocolError): refused that way
        return None
    try:
        commit = int(ext["commitOffset"])
    except (KeyError, ValueError):
        commit = None
    sub = ext.get("subscription") if fields[6] & 4 else None
    return fields + (commit, sub, ext.get("expressionType"))


def _pulls_read(data: bytes):
    """read_pulls over ``data``: (frames taken, each one's fields as _pull_twin gives them)."""
    from shmq.broker.handlers.pull_lane import KEYS
    from shmq.core import sends as S
    out = np.zeros((64, S.N_P), np.int64)
    scratch = np.zeros(len(data) + 1, np.uint8)
    n = S.read_pulls(S.u8(data), 0, len(data), 64, KEYS, out, scratch)

    def text(o, ln):
        return None if o < 0 else scratch[o:o + ln].tobytes().decode()

    got = []
    for r in out[:n].tolist():
        got.append((r[S.P_OPAQUE], text(r[S.P_GROUP_OFF], r[S.P_GROUP_LEN]),
                    text(r[S.P_TOPIC_OFF], r[S.P_TOPIC_LEN]), r[S.P_QID], r[S.P_OFFSET], r[S.P_MAX],
                    r[S.P_SYSFLAG], r[S.P_COMMIT] if r[S.P_HAS_COMMIT] else None,
                    text(r[S.P_SUB_OFF], r[S.P_SUB_LEN]), text(r[S.P_TYPE_OFF], r[S.P_TYPE_LEN])))
        assert r[S.P_END] <= len(data)
    return n, got, out


_PULL_EXT = (b'"consumerGroup":"CG","topic":"T1","queueId":"3","queueOffset":"64",'
             b'"maxMsgNums":"32","sysFlag":"7","commitOffset":"60","suspendTimeoutMillis":"15000",'
             b'"subscription":"TagA || TagB","subVersion":"1795329047849","expressionType":"TAG"')


def _pull(ext: bytes = _PULL_EXT, top: bytes = b'"code":11,"language":"JAVA","version":121,'
          b'"opaque":6,"flag":0,') -> bytes:
    return _json_header(top, ext)


PULL_CASES = [
    (_pull(), True),
    (_pull(_PULL_EXT.replace(b'"queueId":"3"', b'"queueId":3').replace(b'"sysFlag":"7"',
                                                                      b'"sysFlag":7')), True),
    (_pull(_PULL_EXT.replace(b'"subscription":"TagA || TagB"', b'"subscription":null')), True),
    (_pull(_PULL_EXT.replace(b'"sysFlag":"7"', b'"sysFlag":"3"')), True),     # its subscription unused
    (_pull(_PULL_EXT.replace(b',"expressionType":"TAG"', b"")), True),
    (_pull(_PULL_EXT.replace(b'"expressionType":"TAG"', b'"expressionType":""')), True),
    (_pull(_PULL_EXT.replace(b'"commitOffset":"60"', b'"commitOffset":"x"')), True),   # unread
    (_pull(_PULL_EXT.replace(b'"commitOffset":"60",', b"")), True),
    (_pull(_PULL_EXT.replace(b'"queueOffset":"64"', b'"queueOffset":"0064"')), True),
    (_pull(_PULL_EXT + b',"topic":"T2","queueId":"1"'), True),                 # the last wins
    (_pull(_PULL_EXT.replace(b'"consumerGroup":"CG"', b'"consumerGroup":"C\\u0047\\n"')), True),
    (_pull(_PULL_EXT.replace(b'"queueOffset":"64"', b'"queueOffset":"-1"')), True),
    (_pull(top=b'"code":11,'), True),
    (_pull(top=b'"code":11,"flag":1,'), False),                        # a response
    (_pull(top=b'"code":11,"flag":2,'), False),                        # oneway
    (_pull(top=b'"code":12,'), False),
    (_pull(top=b'"code":"11",'), False),
    (_pull(top=b'"opaque":1,'), False),
    (b'{"code":11,"extFields":null}', False),
    (b'{"code":11}', False),
]
for field, value in ((b'"consumerGroup":"CG",', b""), (b'"consumerGroup":"CG"', b'"consumerGroup":7'),
                     (b'"topic":"T1"', b'"topic":null'), (b'"queueId":"3"', b'"queueId":"+3"'),
                     (b'"queueId":"3"', b'"queueId":" 3"'), (b'"queueId":"3"', b'"queueId":""'),
                     (b'"queueId":"3"', b'"queueId":3.0'), (b'"queueId":"3"', b'"queueId":true'),
                     (b'"maxMsgNums":"32"', b'"maxMsgNums":"1234567890123456789"'),
                     (b'"sysFlag":"7"', b'"sysFlag":null'),
                     (b'"subscription":"TagA || TagB"', b'"subscription":1'),
                     (b'"expressionType":"TAG"', b'"expressionType":false'),
                     (b'"topic":"T1"', b'"topic":"T\xc3\xa9"')):
    PULL_CASES.append((_pull(_PULL_EXT.replace(field, value)), False))


@pytest.mark.parametrize("header,taken", PULL_CASES)
def test_the_pull_lane_reads_what_the_pull_handler_reads(header, taken):
    """Each case alone, then behind a pull the lane takes (it stops there,
    taking the first only), then before one; what it takes, the way every
    request goes reads the same."""
    frame = _frame(header, b"")
    n, got, _ = _pulls_read(frame)
    assert n == (1 if taken else 0), header
    if taken:
        assert got[0] == _pull_twin(frame)
    good = _frame(_pull(), b"")
    assert _pulls_read(good + frame)[0] == 1 + taken
    assert _pulls_read(frame + good)[0] == (2 if taken else 0)


def test_the_pull_lane_marks_where_a_pulls_names_change_and_stops_at_a_part_frame():
    from shmq.core import sends as S
    good = _frame(_pull(), b"")
    other = _frame(_pull(_PULL_EXT.replace(b'"topic":"T1"', b'"topic":"T2"')), b"")
    nosub = _frame(_pull(_PULL_EXT.replace(b'"sysFlag":"7"', b'"sysFlag":"3"')), b"")
    etype = _frame(_pull(_PULL_EXT.replace(b'"expressionType":"TAG"', b'"expressionType":"SQL92"')),
                   b"")
    n, _, out = _pulls_read(good + good + other + other + nosub + good + etype + etype)
    assert n == 8 and out[:8, S.P_NEW].tolist() == [1, 0, 1, 0, 1, 1, 1, 0]
    assert _pulls_read(good + good[:-1])[0] == 1
    assert _pulls_read(good + good[:6])[0] == 1
    assert _pulls_read(_frame(_pull(), b"a body") + good)[0] == 2      # (a pull's body: unread)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), st.integers(0, 2**32 - 1),
                          st.binary(max_size=300)), max_size=4))
def test_the_pull_lane_reads_random_bytes_without_reading_past_them(pieces):
    data = b"".join(struct.pack(">iI", n, t) + b for n, t, b in pieces)
    n, _, _ = _pulls_read(data)
    assert 0 <= n <= len(pieces)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_a_mangled_pull_the_lane_takes_is_read_the_same_by_the_pull_handler(data):
    """Bytes of a real client's pull header flipped, dropped or repeated:
    whenever the lane still takes the frame, the way every request goes
    reads the very same fields from it."""
    header, _ = _mangled(data, ["ons-3.12-pull.bin", "cpp-1.2-pull.bin"])
    frame = _frame(header, b"")
    n, got, _ = _pulls_read(frame)
    event(f"taken: {n}")
    if n:
        assert got[0] == _pull_twin(frame), header
