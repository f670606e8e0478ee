"""records.encode / decode: a golden record built by hand from the layout
table, a round trip of every StoredMessage field, and the input errors that
encode must answer with a ValueError naming the problem."""
from __future__ import annotations

import ipaddress
import re
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import naive
from shmq.core import _kernels as K
from shmq.core import layout as L
from shmq.core import records as R

def stamp(enc: R.EncodedBatch, phy_base: int, first_queue_offset: int) -> np.ndarray:
    """The batch's records stamped as if appended at ``phy_base`` to one queue."""
    buf = enc.buf.copy()
    K.stamp_batch(buf, enc.rec_pos, enc.count, phy_base, np.zeros(enc.count, np.int32),
                  np.array([first_queue_offset], np.int64), np.empty(enc.count, np.int64))
    return buf


# ------------------------------------------------------------- golden record
GOLDEN_FIELDS = dict(
    topic="TopicTest", body=b"Hello RocketMQ", properties=b"TAGS\x01TagA\x02KEYS\x01k1",
    queue_id=3, flag=0, sysflag=0, born_timestamp=1700000000000, born_host=("10.0.0.1", 52000),
    store_timestamp=1700000000123, store_host=("127.0.0.1", 10911), reconsume_times=0,
    prepared_offset=0)

# Written out field by field from the table in core/layout.py (IPv4 hosts).
GOLDEN = b"".join(bytes.fromhex(h) for h in [
    "00000083",                 #   0 TOTALSIZE 131 = 91 + 14 + 9 + 17
    "DAA320A7",                 #   4 MAGICCODE
    "69C865ED",                 #   8 BODYCRC crc32(b"Hello RocketMQ") & 0x7FFFFFFF
    "00000003",                 #  12 QUEUEID 3
    "00000000",                 #  16 FLAG
    "0000000000000000",         #  20 QUEUEOFFSET (stamped later)
    "0000000000000000",         #  28 PHYSICALOFFSET (stamped later)
    "00000000",                 #  36 SYSFLAG
    "0000018BCFE56800",         #  40 BORNTIMESTAMP 1700000000000
    "0A000001" "0000CB20",      #  48 BORNHOST 10.0.0.1:52000
    "0000018BCFE5687B",         #  56 STORETIMESTAMP 1700000000123
    "7F000001" "00002A9F",      #  64 STOREHOST 127.0.0.1:10911
    "00000000",                 #  72 RECONSUMETIMES
    "0000000000000000",         #  76 PREPAREDTRANSACTIONOFFSET
    "0000000E",                 #  84 BODYLENGTH 14
    b"Hello RocketMQ".hex(),    #  88 BODY
    "09",                       # 102 TOPICLENGTH 9
    b"TopicTest".hex(),         # 103 TOPIC
    "0011",                     # 112 PROPERTIESLENGTH 17
    b"TAGS\x01TagA\x02KEYS\x01k1".hex(),  # 114 PROPERTIES, ending at 131
])


def encode_golden() -> R.EncodedBatch:
    f = GOLDEN_FIELDS
    return R.encode(f["topic"], [f["body"]], properties=f["properties"], queue_ids=f["queue_id"],
                    flag=f["flag"], sysflag=f["sysflag"], born_timestamp=f["born_timestamp"],
                    born_host=f["born_host"], store_host=f["store_host"],
                    store_timestamp=f["store_timestamp"], reconsume_times=f["reconsume_times"],
                    prepared_offset=f["prepared_offset"])


def test_golden_record_byte_for_byte():
    enc = encode_golden()
    f = GOLDEN_FIELDS
    total = L.RECORD_FIXED_BYTES + len(f["body"]) + len(f["topic"]) + len(f["properties"])
    assert total == 131 == len(GOLDEN)
    assert bytes(enc.buf) == GOLDEN
    assert enc.sizes.tolist() == [131] and enc.rec_pos.tolist() == [0]
    assert enc.tags_codes.tolist() == [2598919]          # "TagA".hashCode()
    # The twin agrees, and the offsets of the reference table hold.
    assert naive.encode_record(**f) == GOLDEN
    b = GOLDEN
    assert struct.unpack_from(">i", b, L.OFF_TOTALSIZE) == (131,)
    assert struct.unpack_from(">I", b, L.OFF_MAGIC) == (L.MESSAGE_MAGIC,)
    crc = zlib.crc32(b"Hello RocketMQ") & 0x7FFFFFFF
    assert struct.unpack_from(">i", b, L.OFF_BODYCRC) == (crc,) == (0x69C865ED,)
    assert struct.unpack_from(">i", b, L.OFF_QUEUEID) == (3,)
    assert struct.unpack_from(">i", b, L.OFF_FLAG) == (0,)
    assert struct.unpack_from(">q", b, L.OFF_QUEUEOFFSET) == (0,)
    assert struct.unpack_from(">q", b, L.OFF_PHYSICALOFFSET) == (0,)
    assert struct.unpack_from(">i", b, L.OFF_SYSFLAG) == (0,)
    assert struct.unpack_from(">q", b, L.OFF_BORNTIMESTAMP) == (1700000000000,)
    assert b[L.OFF_BORNHOST:L.OFF_BORNHOST + 4] == bytes([10, 0, 0, 1])
    assert struct.unpack_from(">i", b, L.OFF_BORNHOST + 4) == (52000,)
    assert struct.unpack_from(">q", b, 56) == (1700000000123,)
    assert b[64:68] == bytes([127, 0, 0, 1]) and struct.unpack_from(">i", b, 68) == (10911,)
    assert struct.unpack_from(">iqi", b, 72) == (0, 0, 14)
    assert b[88:102] == b"Hello RocketMQ"
    assert b[102] == 9 and b[103:112] == b"TopicTest"
    assert struct.unpack_from(">h", b, 112) == (17,) and b[114:131] == f["properties"]


def test_golden_record_stamped_and_decoded():
    enc = encode_golden()
    buf = stamp(enc, phy_base=0x1000, first_queue_offset=5)
    stamped = bytearray(GOLDEN)
    stamped[20:28] = (5).to_bytes(8, "big")
    stamped[28:36] = (0x1000).to_bytes(8, "big")
    assert bytes(buf) == bytes(stamped)
    m = R.decode(buf)
    assert m == R.StoredMessage(
        total_size=131, magic=L.MESSAGE_MAGIC_I32, body_crc=0x69C865ED, queue_id=3, flag=0,
        queue_offset=5, phy_offset=0x1000, sysflag=0, born_timestamp=1700000000000,
        born_host=("10.0.0.1", 52000), store_timestamp=1700000000123,
        store_host=("127.0.0.1", 10911), reconsume_times=0, prepared_offset=0,
        body=b"Hello RocketMQ", topic="TopicTest", properties_raw=GOLDEN_FIELDS["properties"])
    assert m.properties == {"TAGS": "TagA", "KEYS": "k1"}
    assert m.tags == "TagA" and m.keys == ["k1"]
    # MessageDecoder.createMessageId: store host ip + port + phy offset, upper hex.
    assert m.offset_msg_id() == "7F000001" "00002A9F" "0000000000001000"


# ------------------------------------------------------------ offset_msg_id
@given(ip=st.ip_addresses(v=4), port=st.integers(0, 65535), phy=st.integers(0, 2**63 - 1))
@settings(max_examples=50, deadline=None)
def test_offset_msg_id_ipv4_is_32_upper_hex(ip, port, phy):
    enc = R.encode("T", [b"x"], store_host=(str(ip), port))
    msg_id = R.decode(stamp(enc, phy, 0)).offset_msg_id()
    assert re.fullmatch(r"[0-9A-F]{32}", msg_id)
    assert msg_id == (ip.packed + struct.pack(">iq", port, phy)).hex().upper()


def test_offset_msg_id_ipv6_carries_16_address_bytes():
    enc = R.encode("T", [b"x"], store_host=("2001:db8::1", 10911))
    msg_id = R.decode(stamp(enc, 77, 0)).offset_msg_id()
    assert msg_id == ("20010DB8000000000000000000000001" "00002A9F" "000000000000004D")


# --------------------------------------------------------------- round trip
INT32 = st.integers(-2**31, 2**31 - 1)
INT64 = st.integers(-2**63, 2**63 - 1)
PROPS = st.dictionaries(st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"),
                                min_size=1, max_size=8),
                        st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"),
                                max_size=12), max_size=4)
MESSAGE = st.fixed_dictionaries({
    "body": st.binary(max_size=300), "props": PROPS,
    "tags": st.none() | st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"),
                                min_size=1, max_size=8),
    "keys": st.lists(st.text("abcxyz019", min_size=1, max_size=5), max_size=3),
    "queue_id": st.integers(0, 2**31 - 1), "flag": INT32, "sysflag": INT32,
    "born_timestamp": INT64, "reconsume_times": INT32, "prepared_offset": INT64,
})
HOST = st.tuples(st.ip_addresses().map(str), st.integers(0, 65535))
TOPIC = (st.text(st.characters(codec="utf-8"), min_size=1, max_size=31)
         .filter(lambda t: len(t.encode()) <= L.TOPIC_BYTES_MAX))


def same_host(decoded: tuple[str, int], given_host: tuple[str, int]) -> bool:
    return (ipaddress.ip_address(decoded[0]) == ipaddress.ip_address(given_host[0])
            and decoded[1] == given_host[1])


@given(topic=TOPIC, messages=st.lists(MESSAGE, min_size=1, max_size=5), born=HOST, store=HOST,
       store_ts=INT64, phy_base=st.integers(0, 2**50), first_q=st.integers(0, 2**40),
       lead=st.integers(0, 64))
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
def test_every_field_round_trips(topic, messages, born, store, store_ts, phy_base, first_q, lead):
    props = [R.properties_bytes(m["props"], tags=m["tags"], keys=m["keys"]) for m in messages]
    enc = R.encode(topic, [m["body"] for m in messages], properties=props,
                   queue_ids=[m["queue_id"] for m in messages],
                   flag=[m["flag"] for m in messages], sysflag=[m["sysflag"] for m in messages],
                   born_timestamp=[m["born_timestamp"] for m in messages],
                   reconsume_times=[m["reconsume_times"] for m in messages],
                   prepared_offset=[m["prepared_offset"] for m in messages],
                   born_host=born, store_host=store, store_timestamp=store_ts)
    # Decode from the middle of a larger buffer, as from a segment.
    seg = np.concatenate([np.full(lead, 0xEE, np.uint8), stamp(enc, phy_base + lead, first_q)])
    host_bits = ((L.SYSFLAG_BORNHOST_V6 if ":" in born[0] else 0)
                 | (L.SYSFLAG_STOREHOST_V6 if ":" in store[0] else 0))
    next_q = first_q
    for i, (m, p) in enumerate(zip(messages, props)):
        pos = lead + int(enc.rec_pos[i])
        d = R.decode(seg, pos)
        transaction = m["sysflag"] & L.SYSFLAG_TRANSACTION_MASK
        if transaction in (L.SYSFLAG_TRANSACTION_PREPARED, L.SYSFLAG_TRANSACTION_ROLLBACK):
            queue_offset = 0
        else:
            queue_offset, next_q = next_q, next_q + 1
        assert d.total_size == enc.sizes[i] == L.record_size(
            len(m["body"]), len(topic.encode()), len(p), host_bits)
        assert d.magic == L.MESSAGE_MAGIC_I32
        assert d.body_crc == zlib.crc32(m["body"]) & 0x7FFFFFFF
        assert d.queue_id == m["queue_id"]
        assert d.flag == m["flag"]
        assert d.queue_offset == queue_offset
        assert d.phy_offset == phy_base + pos
        assert d.sysflag == (m["sysflag"] & ~0x30) | host_bits
        assert d.born_timestamp == m["born_timestamp"]
        assert same_host(d.born_host, born)
        assert d.store_timestamp == store_ts
        assert same_host(d.store_host, store)
        assert d.reconsume_times == m["reconsume_times"]
        assert d.prepared_offset == m["prepared_offset"]
        assert d.body == m["body"]
        assert d.topic == topic
        assert d.properties_raw == p
        expected_props = dict(m["props"])
        if m["tags"]:
            expected_props["TAGS"] = m["tags"]
        if m["keys"]:
            expected_props["KEYS"] = " ".join(m["keys"])
        # Java (4.9.7) drops a piece whose name or value is empty.
        expected_props = {k: v for k, v in expected_props.items() if k and v}
        assert naive.parse_properties(p) == expected_props
        assert d.properties == expected_props
        assert d.tags == expected_props.get("TAGS")
        assert d.keys == [k for k in expected_props.get("KEYS", "").split(" ") if k]
        assert enc.tags_codes[i] == L.tags_code(expected_props.get("TAGS"))


def test_layout_properties_follow_javas_rule():
    """Java (4.9.7) keeps a piece only if key and value are both non-empty."""
    for text, want in [("\U00010000\x01", {}), ("\U00010000\x01v", {"\U00010000": "v"}),
                       ("\x01v\x02k\x01", {}), ("k\x011\x02k\x012\x02", {"k": "2"})]:
        assert naive.parse_properties(text.encode()) == want
        assert L.string_to_properties(text) == want


def test_properties_bytes_layout():
    assert R.properties_bytes({"a": "1"}, tags="TagA", keys=["k1", "k2"]) == (
        b"a\x011\x02TAGS\x01TagA\x02KEYS\x01k1 k2")
    assert R.properties_bytes() == b""
    with pytest.raises(ValueError, match="separator"):
        R.properties_bytes({"a\x02": "1"})


# ----------------------------------------------------------------- decode errors
def test_decode_rejects_what_is_not_a_record():
    good = bytes(stamp(encode_golden(), 0, 0))
    assert R.decode(good).body == b"Hello RocketMQ"
    flipped_body = bytearray(good)
    flipped_body[90] ^= 1
    with pytest.raises(R.CorruptRecord, match="CRC"):
        R.decode(bytes(flipped_body))
    assert R.decode(bytes(flipped_body), check_crc=False).body != b"Hello RocketMQ"
    bad_magic = bytearray(good)
    bad_magic[4] ^= 1
    with pytest.raises(R.CorruptRecord, match="magic"):
        R.decode(bytes(bad_magic))
    with pytest.raises(R.CorruptRecord, match="past the buffer"):
        R.decode(good[:-1])
    with pytest.raises(R.CorruptRecord, match="too small"):
        R.decode(struct.pack(">i", 91) + good[4:])
    with pytest.raises(R.CorruptRecord, match="buffer ends"):
        R.decode(good, len(good) - 2)
    bad_plen = bytearray(good)
    bad_plen[113] += 1
    with pytest.raises(R.CorruptRecord, match="add up"):
        R.decode(bytes(bad_plen))


# ------------------------------------------------------------- encode errors
def test_encode_rejects_an_empty_batch():
    with pytest.raises(ValueError, match="empty batch"):
        R.encode("T", [])


@pytest.mark.parametrize("topic", ["", "t" * 128, "€" * 43])     # 43 chars, 129 bytes
def test_encode_rejects_a_topic_outside_1_to_127_bytes(topic):
    with pytest.raises(ValueError, match=r"topic .*1\.\.127 bytes"):
        R.encode(topic, [b"x"])


def test_encode_accepts_a_127_byte_topic():
    enc = R.encode("€" * 42 + "t", [b"x"])        # 126 + 1 bytes
    assert R.decode(stamp(enc, 0, 0)).topic == "€" * 42 + "t"


def test_encode_rejects_a_body_over_max_message_bytes():
    R.encode("T", [b"x" * 10], max_message_bytes=10)
    with pytest.raises(ValueError, match=r"body of 11 bytes exceeds maxMessageSize=10"):
        R.encode("T", [b"", b"x" * 11], max_message_bytes=10)


def test_encode_rejects_properties_over_32767_bytes():
    R.encode("T", [b"x"], properties=b"a" * L.PROPERTIES_BYTES_MAX)
    with pytest.raises(ValueError, match=r"properties of 32768 bytes exceed 32767"):
        R.encode("T", [b"x"], properties=b"a" * 32768)
    with pytest.raises(ValueError, match=r"properties of 32768 bytes exceed 32767"):
        R.encode("T", [b"x", b"y"], properties=[b"", b"a" * 32768])


@pytest.mark.parametrize("arg", ["queue_ids", "flag", "sysflag", "born_timestamp",
                                 "reconsume_times", "prepared_offset"])
def test_encode_rejects_a_per_message_list_of_the_wrong_length(arg):
    with pytest.raises(ValueError, match=rf"{arg}: 2 values for 3 messages"):
        R.encode("T", [b"a", b"b", b"c"], **{arg: [0, 0]})


def test_encode_rejects_a_properties_list_of_the_wrong_length():
    with pytest.raises(ValueError, match=r"4 properties for 3 messages"):
        R.encode("T", [b"a", b"b", b"c"], properties=[b""] * 4)


@pytest.mark.parametrize("queue_ids", [-1, 2**31, [0, -1], [0, 2**31]])
def test_encode_rejects_a_queue_id_out_of_range(queue_ids):
    bodies = [b"x"] * (len(queue_ids) if isinstance(queue_ids, list) else 1)
    with pytest.raises(ValueError, match="queue id"):
        R.encode("T", bodies, queue_ids=queue_ids)


@pytest.mark.parametrize("offs,lens", [([0, 8], [4, 8]),       # past the end: would copy what follows
                                       ([0, -2], [4, 2]), ([0, 4], [4, -1]), ([0], [4, 4])])
def test_encode_arrays_refuses_spans_outside_their_buffer(offs, lens):
    """The kernels copy bodies with memcpy, unchecked: a span outside the
    buffer is refused before, never read past it (or a huge copy)."""
    body = np.frombuffer(b"0123456789", np.uint8)
    props = L.lay_out(b"", "properties", 2)
    with pytest.raises(ValueError, match="outside their buffer of 10 bytes"):
        R.encode_arrays("T", body, np.array(offs, np.int64), np.array(lens, np.int64), *props)


def test_encode_rejects_a_port_out_of_range():
    with pytest.raises(ValueError, match="port"):
        R.encode("T", [b"x"], born_host=("10.0.0.1", -1))


def test_decode_columns_agrees_with_the_python_decoder(tmp_path):
    """The columnar reader kernels (spark/, tools/inspect) against
    ``decode``: every field, IPv6 hosts, odd property strings (empty keys or
    values, duplicates: the last wins, as in Java), absent TAGS/KEYS/UNIQ_KEY."""
    from conftest import small_config

    from shmq.core.store import open_local
    store, _ = open_local(small_config(str(tmp_path / "s"), mappedFileSizeCommitLog=1 << 20))
    odd = [b"TAGS\x01a\x02TAGS\x01b", b"\x01x\x02KEYS\x01\x02UNIQ_KEY\x01U1", b"", b"KEYS\x01k1 k2\x02noval",
           b"TAGS\x01\xc3\xa9t\x02UNIQ_KEY\x01ABC\x02KEYS\x01k"]
    store.append(R.encode("Cols", [b"b%d" % i * i for i in range(5)], properties=odd, flag=[0, 1, 2, 3, 4]))
    store.append(R.encode("Cols6", [b"six"], born_host=("::1", 1234), store_host=("fe80::1:2", 10911)))
    buf = store.cl.map(0)
    rows, _, status = R.scan_rows(buf, 0, store.state.write_pos, 0, 64)
    assert rows.shape[0] == 6 and status == K.SCAN_END
    assert (R.rows_at(buf, 0, rows[:, K.S_PHY].copy(), rows[:, K.S_SIZE].copy()) == rows).all()
    cols = R.decode_columns(buf, 0, rows)
    ro, (ko, kd), (vo, vd) = R.property_pairs(*cols.var["properties"])
    for i in range(6):
        m = R.decode(buf, int(rows[i, K.S_PHY]))
        props = m.properties
        assert cols.text("topic", i) == m.topic
        off, dat = cols.var["body"]
        assert dat[off[i]:off[i + 1]].tobytes() == m.body
        assert cols.text("properties", i) == m.properties_raw.decode()
        assert cols.text("tags", i) == (props.get("TAGS") or None)
        assert cols.text("keys", i) == (props.get("KEYS") or None)
        assert cols.text("msgId", i) == props.get("UNIQ_KEY", m.offset_msg_id())
        assert cols.text("bornHost", i) == _host_text(m.born_host)
        assert cols.text("storeHost", i) == _host_text(m.store_host)
        f = cols.fixed
        assert (f["queueId"][i], f["queueOffset"][i], f["commitLogOffset"][i], f["storeSize"][i]) == (
            m.queue_id, m.queue_offset, m.phy_offset, m.total_size)
        assert (f["sysFlag"][i], f["flag"][i]) == (m.sysflag, m.flag)
        assert (f["bornTimestamp"][i], f["storeTimestamp"][i]) == (m.born_timestamp * 1000, m.store_timestamp * 1000)
        pairs = {kd[ko[k]:ko[k + 1]].tobytes().decode(): vd[vo[k]:vo[k + 1]].tobytes().decode()
                 for k in range(ro[i], ro[i + 1])}
        assert pairs == props
    store.close()


def _host_text(host: tuple[str, int]) -> str:
    """``ip:port``; IPv6 as eight unabbreviated groups in brackets."""
    ip = ipaddress.ip_address(host[0])
    if ip.version == 4:
        return f"{ip}:{host[1]}"
    return "[" + ":".join(f"{int(g, 16):x}" for g in ip.exploded.split(":")) + f"]:{host[1]}"


# ------------------------------------------------------- one message, no kernel
_props_piece = st.sampled_from(["TAGS\x01a", "TAGS\x01TagA", "TAGS\x01é t", "TAGS\x01", "TAGS",
                                "KEYS\x01k1 k2", "UNIQ_KEY\x010A0B", "X\x01\x01y", "\x01v", ""])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topic=st.text(min_size=1, max_size=20).filter(lambda t: len(t.encode()) <= 127),
       body=st.binary(max_size=300), pieces=st.lists(_props_piece, max_size=4),
       born=st.sampled_from([("10.1.2.3", 40000), ("::1", 5), ("fe80::1", 70000)]),
       store=st.sampled_from([("127.0.0.1", 10911), ("2001:db8::5", 10911)]),
       qid=st.integers(0, 2**31 - 1), flag=st.integers(-2**31, 2**31 - 1),
       sysflag=st.sampled_from([0, 2, 4, 8, 12, 0x30]), reconsume=st.integers(0, 16),
       prepared=st.integers(0, 2**40), born_ts=st.integers(0, 2**42), store_ts=st.integers(0, 2**42))
def test_encode_one_writes_the_bytes_and_tags_code_encode_does(topic, body, pieces, born, store, qid,
                                                               flag, sysflag, reconsume, prepared,
                                                               born_ts, store_ts):
    """The single-send encoder (struct + zlib, no kernel) and the batch
    kernel are one record format: same bytes, same ConsumeQueue tags code."""
    props = "\x02".join(pieces).encode()
    kw = dict(flag=flag, sysflag=sysflag, reconsume_times=reconsume, prepared_offset=prepared,
              born_timestamp=born_ts, store_timestamp=store_ts)
    want = R.encode(topic, [body], properties=props, queue_ids=qid, born_host=born,
                    store_host=store, **kw)
    got = R.encode_one(topic.encode(), body, props, queue_id=qid, born_host=R.host_raw(*born),
                       store_host=R.host_raw(*store), **kw)
    assert got.buf.tobytes() == want.buf.tobytes()
    assert got.tags_codes.tolist() == want.tags_codes.tolist()
    assert (got.sizes.tolist(), got.rec_pos.tolist(), got.queue_id, got.topic) == \
        (want.sizes.tolist(), want.rec_pos.tolist(), want.queue_id, want.topic)
    got.buf[20] = 1        # the store stamps offsets into it in place


@pytest.mark.parametrize("kw, problem", [
    (dict(topic=b""), "topic"), (dict(topic=b"t" * 128), "topic"),
    (dict(body=b"x" * 11), "maxMessageSize=10"), (dict(props=b"p" * 32768), "32767"),
    (dict(flag=2**31), "flag"), (dict(sysflag=-2**31 - 1), "sysflag"),
    (dict(reconsume_times=2**31), "reconsume_times"), (dict(queue_id=-1), "queue id"),
])
def test_encode_one_rejects_what_encode_rejects(kw, problem):
    args = dict(topic=b"T", body=b"b", props=b"", queue_id=0, flag=0, sysflag=0,
                born_timestamp=0, born_host=R.host_raw("127.0.0.1", 1),
                store_host=R.host_raw("127.0.0.1", 2), store_timestamp=0, max_message_bytes=10)
    args.update(kw)
    topic, body, props = args.pop("topic"), args.pop("body"), args.pop("props")
    with pytest.raises(ValueError, match=re.escape(problem)):
        R.encode_one(topic, body, props, **args)


def test_offset_msg_ids_are_the_prefix_and_each_offset_in_16_hex_digits():
    """As a batch send's answer carries them (RocketMQ's
    MessageDecoder.createMessageId per record, joined by commas)."""
    import numpy as np
    from shmq.core.layout import offset_msg_ids
    pre = "7F00000100002A9F"
    for phys in ([0], [231, 462, 0x1234ABCD], [2**63 - 1, 2**40 + 5], list(range(0, 256 * 230, 230))):
        want = ",".join(f"{pre}{x:016X}" for x in phys)
        assert offset_msg_ids(pre, np.array(phys, np.int64)) == want
    assert offset_msg_ids(pre, np.zeros(0, np.int64)) == ""
