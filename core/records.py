"""Message records in and out: batch encoding (kernel-backed) and decoding.

``encode`` turns a batch of messages for one topic into stored-message records
(``layout``) in a private buffer, with CRCs, outside any lock; the store then
stamps physical and queue offsets under the append lock and copies the bytes
in. It validates everything a caller can get wrong and raises ``ValueError``
naming the problem; the kernel never sees bad input.

``decode`` reads one record back in plain Python (tools, tests, the
inspector); the hot paths (recovery, reads, Spark) use the scan kernel.
"""
from __future__ import annotations

import functools
import ipaddress
import socket
import struct
import time
import zlib
from dataclasses import dataclass

import numpy as np

from . import _kernels as K
from . import jit
from . import layout as L

_TAGS_KEY = np.frombuffer(L.PROPERTY_TAGS.encode(), dtype=np.uint8)   # read-only, as every key


@functools.lru_cache(maxsize=4096)
def host_row(ip: str, port: int) -> tuple[np.ndarray, bool]:
    """(ip, port) as the (1, 20) host row the encoder copies from (ip, then
    int32 port, big-endian), and whether it is IPv6. Cached: a connection's
    hosts repeat on every batch. The array is read-only."""
    addr = ipaddress.ip_address(ip)
    port = int(port)
    if not 0 <= port <= 0xFFFFFFFF:
        raise ValueError(f"port {port} out of range")
    row = np.zeros((1, 20), dtype=np.uint8)
    raw = addr.packed
    row[0, :len(raw)] = np.frombuffer(raw, np.uint8)
    row[0, len(raw):len(raw) + 4] = np.frombuffer(port.to_bytes(4, "big"), np.uint8)
    row.flags.writeable = False
    return row, addr.version == 6


@dataclass(slots=True)
class EncodedBatch:
    """Records of one topic, encoded but not yet stamped with offsets.
    (Slots, not frozen: built once per send, and a frozen dataclass's
    ``__init__`` costs a microsecond of ``object.__setattr__``.)"""
    topic: str
    buf: np.ndarray          # uint8, exactly nbytes long
    rec_pos: np.ndarray      # int64, position of each record in buf
    sizes: np.ndarray        # int64, TOTALSIZE of each record
    queue_id: int            # of the first record
    tags_codes: np.ndarray   # int64, for the ConsumeQueue units
    store_timestamp: int
    single_queue: bool       # every record goes to queue_id

    @property
    def count(self) -> int:
        return int(self.rec_pos.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.buf.shape[0])


def properties_bytes(props: dict[str, str] | None = None, *, tags: str | None = None,
                     keys: str | list[str] | None = None) -> bytes:
    """A RocketMQ properties string (UTF-8) from a dict plus tags and keys."""
    d = dict(props or {})
    if tags:
        d[L.PROPERTY_TAGS] = tags
    if keys:
        d[L.PROPERTY_KEYS] = keys if isinstance(keys, str) else " ".join(keys)
    return L.properties_to_string(d).encode()


def _column(value, n: int, what: str) -> np.ndarray:
    a = np.asarray(value, dtype=np.int64)
    if a.shape != (n,):
        raise ValueError(f"{what}: {a.shape[0] if a.ndim else 'scalar'} values for {n} messages")
    return a


_PER_MESSAGE = (("queue_ids", K.M_QUEUE_ID), ("flag", K.M_FLAG), ("sysflag", K.M_SYSFLAG),
                ("born_timestamp", K.M_BORN_TS), ("reconsume_times", K.M_RECONSUME),
                ("prepared_offset", K.M_PREPARED))
_HOST_FLAGS = L.SYSFLAG_BORNHOST_V6 | L.SYSFLAG_STOREHOST_V6


def check_sizes(topic: bytes, body_max: int, props_max: int, max_message_bytes: int) -> None:
    """What a record's sizes must fit: a 1..127-byte topic, bodies within
    maxMessageSize, properties within an int16 (ValueError naming it)."""
    if not 0 < len(topic) <= L.TOPIC_BYTES_MAX:
        raise ValueError(f"topic {topic.decode(errors='replace')!r}: must be "
                         f"1..{L.TOPIC_BYTES_MAX} bytes in UTF-8")
    if body_max > max_message_bytes:
        raise ValueError(f"message body of {body_max} bytes exceeds "
                         f"maxMessageSize={max_message_bytes}")
    if props_max > L.PROPERTIES_BYTES_MAX:
        raise ValueError(f"properties of {props_max} bytes exceed {L.PROPERTIES_BYTES_MAX}")


def encode(topic: str, bodies: list[bytes], *, properties: bytes | list[bytes] = b"",
           queue_ids=0, flag=0, sysflag=0, born_timestamp=None, reconsume_times=0,
           prepared_offset=0, born_host: tuple[str, int] = ("127.0.0.1", 0),
           store_host: tuple[str, int] = ("127.0.0.1", 10911), store_timestamp: int | None = None,
           max_message_bytes: int = 4 * 1024 * 1024) -> EncodedBatch:
    """Encode ``bodies`` for ``topic``. ``properties`` is one properties string
    for all or one per message (it carries TAGS, KEYS …); the integer
    settings take one value for the batch or a sequence, one per message."""
    n = len(bodies)
    if n == 0:
        raise ValueError("empty batch")
    body_buf, body_off, body_len = L.lay_out(bodies, "bodies", n)
    props_buf, props_off, props_len = L.lay_out(properties, "properties", n)
    shared = bytes(properties) if isinstance(properties, (bytes, bytearray, memoryview)) else None
    return encode_arrays(topic, body_buf, body_off, body_len, props_buf, props_off, props_len,
                         queue_ids=queue_ids, flag=flag, sysflag=sysflag,
                         born_timestamp=born_timestamp, reconsume_times=reconsume_times,
                         prepared_offset=prepared_offset, born_host=born_host,
                         store_host=store_host, store_timestamp=store_timestamp,
                         max_message_bytes=max_message_bytes, shared_properties=shared,
                         spans_checked=True)


def encode_arrays(topic: str, body_buf: np.ndarray, body_off: np.ndarray, body_len: np.ndarray,
                  props_buf: np.ndarray, props_off: np.ndarray, props_len: np.ndarray, *,
                  queue_ids=0, flag=0, sysflag=0, born_timestamp=None, reconsume_times=0,
                  prepared_offset=0, born_host: tuple[str, int] = ("127.0.0.1", 0),
                  store_host: tuple[str, int] = ("127.0.0.1", 10911),
                  store_timestamp: int | None = None, max_message_bytes: int = 4 * 1024 * 1024,
                  shared_properties: bytes | None = None,
                  spans_checked: bool = False) -> EncodedBatch:
    """``encode`` over bodies and properties already laid out in buffers
    (offsets and lengths per message; properties arrays of length 1 are one
    string for all, ``shared_properties`` if the caller has it as bytes).
    ``spans_checked``: the caller made the offsets and lengths itself
    (``lay_out``, ``split_batch``), so they lie in their buffers; else they
    are checked here (ValueError), as the kernels copy with memcpy."""
    n = body_len.shape[0]
    if n == 0:
        raise ValueError("empty batch")
    tb = topic.encode()
    check_sizes(tb, int(body_len.max()), int(props_len.max()), max_message_bytes)
    for what, buf, off, ln in () if spans_checked else (
            ("body", body_buf, body_off, body_len), ("properties", props_buf, props_off, props_len)):
        if off.shape != ln.shape or (ln < 0).any() or (off < 0).any() or (
                off + ln > buf.shape[0]).any():
            raise ValueError(f"{what} offsets and lengths reach outside their buffer "
                             f"of {buf.shape[0]} bytes")
    now = int(time.time() * 1000)
    born_row, born_v6 = host_row(*born_host)
    store_row, store_v6 = host_row(*store_host)
    host_flags = (L.SYSFLAG_BORNHOST_V6 if born_v6 else 0) | (L.SYSFLAG_STOREHOST_V6 if store_v6 else 0)
    ts = now if store_timestamp is None else int(store_timestamp)
    born_ts = now if born_timestamp is None else born_timestamp
    values = (queue_ids, flag, sysflag, born_ts, reconsume_times, prepared_offset)
    for name, v in (("flag", flag), ("sysflag", sysflag), ("reconsume_times", reconsume_times)):
        lo, hi = (np.min(v), np.max(v)) if not isinstance(v, (int, np.integer)) else (v, v)
        if lo < -2**31 or hi >= 2**31:
            raise ValueError(f"{name} out of the int32 range")
    topic_arr = np.frombuffer(tb, np.uint8)
    if all(isinstance(v, (int, np.integer)) for v in values):
        if not 0 <= queue_ids < 2**31:
            raise ValueError(f"queue id {queue_ids} out of range 0..{2**31 - 1}")
        out, rec_pos, sizes = K.encode_uniform(
            body_off, body_len, body_buf, props_off, props_len, props_buf, topic_arr, queue_ids,
            flag, (sysflag & ~_HOST_FLAGS) | host_flags, born_ts, born_row[0], ts, store_row[0],
            reconsume_times, prepared_offset, K.CRC_TABLES)
        qid, single = int(queue_ids), True
    else:
        out, rec_pos, sizes, qids = _encode_general(
            n, values, body_buf, body_off, body_len, props_buf, props_off, props_len, topic_arr,
            born_row, store_row, host_flags, ts)
        qid, single = int(qids[0]), bool((qids == qids[0]).all())
    if props_len.shape[0] == 1 and n != 1 or shared_properties is not None:
        shared = shared_properties if shared_properties is not None else props_buf[
            int(props_off[0]):int(props_off[0] + props_len[0])].tobytes()
        codes = np.full(n, shared_tags_code(shared), np.int64)
    else:
        codes = tags_codes(props_buf, props_off, props_len)
    return EncodedBatch(topic=topic, buf=out, rec_pos=rec_pos, sizes=sizes, queue_id=qid,
                        tags_codes=codes, store_timestamp=ts, single_queue=single)


_HEAD = struct.Struct(">iIiiiqqiq")   # TOTALSIZE … BORNTIMESTAMP (layout: offsets 0..47)
_TAIL = struct.Struct(">iqi")         # RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET, BODYLENGTH
# TOTALSIZE … BODYLENGTH when both hosts are IPv4 (8 bytes each): offsets 0..91
_FIXED_V4 = struct.Struct(">iIiiiqqiq8sq8siqi")
assert _FIXED_V4.size == _HEAD.size + 2 * L.HOST_V4_BYTES + 8 + _TAIL.size
_I32_MIN, _I32_MAX = -2**31, 2**31 - 1
ONE_AT_ZERO = np.zeros(1, np.int64)
ONE_AT_ZERO.flags.writeable = False


@functools.lru_cache(maxsize=4096)
def host_raw(ip: str, port: int) -> tuple[bytes, bool]:
    """(ip, port) as a record stores it: the packed address then the int32
    port (8 bytes for IPv4, 20 for IPv6), and whether it is IPv6."""
    row, v6 = host_row(ip, port)
    return row[0, :L.HOST_V6_BYTES if v6 else L.HOST_V4_BYTES].tobytes(), v6


@functools.lru_cache(maxsize=4096)
def _tags_hash(tags: bytes) -> int:
    try:
        return L.java_string_hash(tags.decode("utf-8"))
    except UnicodeDecodeError:   # what the kernel makes of it, so recovery agrees
        return _tags_code_one(np.frombuffer(tags, np.uint8), 0, len(tags))


def tags_code_of(props: bytes) -> int:
    """The ConsumeQueue tags code of one properties string, as the kernel
    ``find_property`` reads it (the last non-empty TAGS wins), without a
    kernel call: single sends carry a UNIQ_KEY each, so their properties
    never repeat, but their tags do."""
    i = props.find(b"TAGS\x01")
    if i < 0:
        return 0
    if (i == 0 or props[i - 1] == 2) and props.find(b"TAGS\x01", i + 5) < 0:   # one TAGS
        j = props.find(b"\x02", i + 5)
        tags = props[i + 5:j] if j >= 0 else props[i + 5:]
        if 1 not in tags:          # (the byte 0x01: one memchr; a bytes needle costs ~10x)
            return _tags_hash(tags) if tags else 0
    tags = b""
    for piece in props.split(b"\x02"):
        name, sep, value = piece.partition(b"\x01")
        if name == b"TAGS" and sep and value:
            tags = value
    return _tags_hash(tags) if tags else 0


def encode_one(topic: bytes, body: bytes, props: bytes, *, queue_id: int, flag: int, sysflag: int,
               born_timestamp: int, born_host: tuple[bytes, bool], store_host: tuple[bytes, bool],
               store_timestamp: int, reconsume_times: int = 0, prepared_offset: int = 0,
               max_message_bytes: int = 4 * 1024 * 1024,
               tags_code: int | None = None, topic_name: str | None = None) -> EncodedBatch:
    """One message as a batch of one record (``encode_record``). ``topic``
    is the UTF-8 name (``topic_name`` the same as text, when the caller
    has it); ``tags_code`` its ConsumeQueue tags code when the caller knows
    it (else read from ``props``)."""
    rec = encode_record(topic, body, props, queue_id, flag, sysflag, born_timestamp, born_host,
                        store_host, store_timestamp, reconsume_times, prepared_offset,
                        max_message_bytes)
    return one_record(topic.decode() if topic_name is None else topic_name, rec, queue_id,
                      tags_code_of(props) if tags_code is None else tags_code, store_timestamp)


def one_record(topic: str, rec: bytearray, queue_id: int, tags_code: int,
               store_timestamp: int) -> EncodedBatch:
    """The batch of one record ``encode_record`` wrote."""
    return EncodedBatch(topic=topic, buf=np.frombuffer(rec, np.uint8), rec_pos=ONE_AT_ZERO,
                        sizes=np.array((len(rec),), np.int64), queue_id=queue_id,
                        tags_codes=np.array((tags_code,), np.int64),
                        store_timestamp=store_timestamp, single_queue=True)


# the records single sends share one claim with at most (bytes; a quarter of
# a segment where that is less): large messages gain nothing from sharing a
# claim, and a claim must fit a segment
GROUP_BYTES_MAX = 1 << 20


def group_bytes_limit(segment_bytes: int) -> int:
    return min(GROUP_BYTES_MAX, segment_bytes // 4)


def runs(items: list, limit: int, size, alone):
    """``items`` (one queue's sends, in call order) cut into runs to append in
    one claim each: at most ``limit`` bytes (``size(item)``; a larger item is
    a run of its own), and an item for which ``alone(item)`` is true a run
    of its own, in its place. The broker's worker and a direct producer
    cut the sends of a turn alike."""
    run, total = [], 0
    for it in items:
        if alone(it):
            if run:
                yield run
            yield [it]
            run, total = [], 0
            continue
        n = size(it)
        if run and total + n > limit:
            yield run
            run, total = [], 0
        run.append(it)
        total += n
    if run:
        yield run


def join_records(topic: str, recs: list, queue_id: int, tags_codes: list[int],
                 store_timestamp: int) -> EncodedBatch:
    """The batch of several records ``encode_record`` wrote, all for one
    queue (single sends appended together: all or none)."""
    sizes = np.array([len(r) for r in recs], np.int64)
    rec_pos = np.zeros(len(recs), np.int64)
    np.cumsum(sizes[:-1], out=rec_pos[1:])
    return EncodedBatch(topic=topic, buf=np.frombuffer(bytearray().join(recs), np.uint8),
                        rec_pos=rec_pos, sizes=sizes, queue_id=queue_id,
                        tags_codes=np.array(tags_codes, np.int64),
                        store_timestamp=store_timestamp, single_queue=True)


def encode_record(topic: bytes, body: bytes, props: bytes, queue_id: int, flag: int, sysflag: int,
                  born_timestamp: int, born_host: tuple[bytes, bool],
                  store_host: tuple[bytes, bool], store_timestamp: int, reconsume_times: int,
                  prepared_offset: int, max_message_bytes: int) -> bytearray:
    """One message's record, the same bytes ``encode_arrays`` writes, with
    ``struct`` and ``zlib.crc32`` instead of a kernel call over arrays
    built per message: a single send is the common case and the kernel's
    dispatch of ~20 arguments cost more than the record. ``topic`` is the
    UTF-8 name; hosts come from ``host_raw`` (parse them once per peer).
    The checks pass in one comparison each for what every send carries,
    and two IPv4 hosts (the usual case) are packed with the fields before
    the body in one call; what fails is named by the checks written out."""
    tlen, blen, plen = len(topic), len(body), len(props)
    if not (0 < tlen <= L.TOPIC_BYTES_MAX and blen <= max_message_bytes
            and plen <= L.PROPERTIES_BYTES_MAX):
        check_sizes(topic, blen, plen, max_message_bytes)
    if not (_I32_MIN <= flag <= _I32_MAX and _I32_MIN <= sysflag <= _I32_MAX
            and _I32_MIN <= reconsume_times <= _I32_MAX and 0 <= queue_id <= _I32_MAX):
        _check_ints(queue_id, flag, sysflag, reconsume_times)
    born, born_v6 = born_host
    store, store_v6 = store_host
    crc = zlib.crc32(body) & 0x7FFFFFFF
    if not born_v6 and not store_v6:
        p = _FIXED_V4.size
        total = p + blen + 1 + tlen + 2 + plen
        rec = bytearray(total)
        _FIXED_V4.pack_into(rec, 0, total, L.MESSAGE_MAGIC, crc, queue_id, flag, 0, 0,
                            sysflag & ~_HOST_FLAGS, born_timestamp, born, store_timestamp, store,
                            reconsume_times, prepared_offset, blen)
    else:
        sysflag = (sysflag & ~_HOST_FLAGS) | (L.SYSFLAG_BORNHOST_V6 if born_v6 else 0) \
            | (L.SYSFLAG_STOREHOST_V6 if store_v6 else 0)
        b = len(born)
        head = 48 + b + 8 + len(store)               # up to RECONSUMETIMES
        p = head + 16
        total = p + blen + 1 + tlen + 2 + plen
        rec = bytearray(total)
        _HEAD.pack_into(rec, 0, total, L.MESSAGE_MAGIC, crc, queue_id, flag, 0, 0, sysflag,
                        born_timestamp)
        rec[48:48 + b] = born
        rec[48 + b:56 + b] = store_timestamp.to_bytes(8, "big", signed=True)
        rec[56 + b:head] = store
        _TAIL.pack_into(rec, head, reconsume_times, prepared_offset, blen)
    rec[p:p + blen] = body
    p += blen
    rec[p] = tlen
    rec[p + 1:p + 1 + tlen] = topic
    p += 1 + tlen
    rec[p:p + 2] = plen.to_bytes(2, "big")
    rec[p + 2:] = props
    return rec


def _check_ints(queue_id: int, flag: int, sysflag: int, reconsume_times: int) -> None:
    """The ValueError naming the first of ``encode_one``'s integers out of range."""
    for name, v in (("flag", flag), ("sysflag", sysflag), ("reconsume_times", reconsume_times)):
        if not _I32_MIN <= v <= _I32_MAX:
            raise ValueError(f"{name} out of the int32 range")
    if not 0 <= queue_id <= _I32_MAX:
        raise ValueError(f"queue id {queue_id} out of range 0..{_I32_MAX}")


def concat_batches(batches: list[EncodedBatch]) -> EncodedBatch:
    """One batch of the records of several, all for one topic and queue
    (they are appended together: all or none)."""
    if len(batches) == 1:
        return batches[0]
    first = batches[0]
    if any(b.topic != first.topic or b.queue_id != first.queue_id or not b.single_queue
           for b in batches):
        raise ValueError("concat_batches: the batches go to different queues")
    starts = np.cumsum([0] + [b.nbytes for b in batches[:-1]])
    return EncodedBatch(
        topic=first.topic, buf=np.concatenate([b.buf for b in batches]),
        rec_pos=np.concatenate([b.rec_pos + s for b, s in zip(batches, starts)]),
        sizes=np.concatenate([b.sizes for b in batches]), queue_id=first.queue_id,
        tags_codes=np.concatenate([b.tags_codes for b in batches]),
        store_timestamp=max(b.store_timestamp for b in batches), single_queue=True)


def _encode_general(n, values, body_buf, body_off, body_len, props_buf, props_off, props_len,
                    topic_arr, born_row, store_row, host_flags, ts):
    """Every setting per message (the meta matrix of ``_kernels.encode_batch``)."""
    meta = np.empty((n, K.N_META), dtype=np.int64)
    for (name, col), v in zip(_PER_MESSAGE, values):
        meta[:, col] = v if isinstance(v, (int, np.integer)) else _column(v, n, name)
    meta[:, K.M_SYSFLAG] = (meta[:, K.M_SYSFLAG] & ~_HOST_FLAGS) | host_flags
    meta[:, K.M_BORN_HOST] = 0
    meta[:, K.M_BODY_OFF] = body_off
    meta[:, K.M_BODY_LEN] = body_len
    meta[:, K.M_PROPS_OFF] = props_off if props_off.shape[0] == n else 0
    meta[:, K.M_PROPS_LEN] = props_len if props_len.shape[0] == n else props_len[0]
    qids = meta[:, K.M_QUEUE_ID].copy()
    if int(qids.min()) < 0 or int(qids.max()) >= 2**31:
        raise ValueError(f"queue id out of range 0..{2**31 - 1}")
    sizes = (L.RECORD_FIXED_BYTES + topic_arr.shape[0] + meta[:, K.M_BODY_LEN]
             + meta[:, K.M_PROPS_LEN] + (12 if host_flags & L.SYSFLAG_BORNHOST_V6 else 0)
             + (12 if host_flags & L.SYSFLAG_STOREHOST_V6 else 0))
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    rec_pos = np.empty(n, dtype=np.int64)
    written = K.encode_batch(out, meta, body_buf, props_buf, topic_arr, born_row, store_row[0],
                             ts, K.CRC_TABLES, rec_pos)
    assert written == out.shape[0], (written, out.shape)
    return out, rec_pos, sizes, qids


_SHARED_CODES: dict[bytes, int] = {}
_SHARED_CODES_MAX = 4096


def shared_tags_code(props: bytes) -> int:
    """Tags code of a properties string many batches share (cached)."""
    code = _SHARED_CODES.get(props)
    if code is None:
        if len(_SHARED_CODES) >= _SHARED_CODES_MAX:
            _SHARED_CODES.clear()
        code = _SHARED_CODES[props] = _tags_code_one(np.frombuffer(props, np.uint8), 0, len(props))
    return code


def tags_codes(props_buf: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The ConsumeQueue tags code of each message, from its properties."""
    out = np.empty(offs.shape[0], np.int64)
    K.tags_codes(props_buf, offs, lens, _TAGS_KEY, out)
    return out


def int_property(buf: np.ndarray, offs: np.ndarray, lens: np.ndarray, key: str,
                 fallback: np.ndarray) -> np.ndarray:
    """Property ``key`` of each properties string buf[offs[i]:+lens[i]] as an
    integer (a sign and up to ``K.INT_DIGITS_MAX`` digits); ``fallback[i]``
    where it is absent or not such a number."""
    out = np.array(fallback, dtype=np.int64)
    K.int_properties(buf, np.ascontiguousarray(offs, np.int64), np.ascontiguousarray(lens, np.int64),
                     np.frombuffer(key.encode(), np.uint8), out)
    return out


def _tags_code_one(buf: np.ndarray, off: int, n: int) -> int:
    vpos, vlen = K.find_property(buf, off, n, _TAGS_KEY)
    return int(K.java_hash_utf8(buf, vpos, vlen)) if vpos >= 0 and vlen > 0 else 0


_BATCH_ERRORS = {
    K.BATCH_TRUNCATED: "batch body is malformed: an entry's lengths do not add up",
    K.BATCH_TOO_MANY: "batch has more than {max} messages",
    K.BATCH_PROPS_TOO_LONG: "a message's properties, with the batch's, exceed 32767 bytes",
}


@dataclass(frozen=True)
class BatchBody:
    """The messages of a SEND_BATCH_MESSAGE body, laid out for ``encode_arrays``."""
    body_buf: np.ndarray
    body_off: np.ndarray
    body_len: np.ndarray
    props_buf: np.ndarray
    props_off: np.ndarray
    props_len: np.ndarray
    flags: np.ndarray

    @property
    def count(self) -> int:
        return int(self.body_len.shape[0])


def split_batch_body(body, suffix: bytes, max_entries: int = 1 << 16) -> BatchBody:
    """Parse a batch body (reference §5.5); every entry's properties get
    ``suffix`` appended (the batch's own properties). ValueError names what
    is wrong with a malformed body."""
    buf = np.frombuffer(body, np.uint8)
    sfx = np.frombuffer(suffix, np.uint8)
    limit = min(max_entries, buf.shape[0] // 22 + 1)
    props = np.empty(buf.shape[0] + limit * (sfx.shape[0] + 1), np.uint8)
    meta = np.empty((limit, 5), np.int64)
    n, status = K.split_batch(buf, limit, sfx, props, meta)
    if status != K.BATCH_OK:
        raise ValueError(_BATCH_ERRORS[status].format(max=max_entries))
    if n == 0:
        raise ValueError("batch body holds no message")
    m = meta[:n]
    return BatchBody(buf, m[:, 1].copy(), m[:, 2].copy(), props, m[:, 3].copy(), m[:, 4].copy(),
                     m[:, 0].copy())


# --------------------------------------------------------------------- decode
@dataclass(frozen=True)
class StoredMessage:
    """Every field of a stored-message record."""
    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    phy_offset: int
    sysflag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_offset: int
    body: bytes
    topic: str
    properties_raw: bytes

    @property
    def properties(self) -> dict[str, str]:
        return L.string_to_properties(self.properties_raw.decode("utf-8", "replace"))

    @property
    def tags(self) -> str | None:
        return self.properties.get(L.PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(L.PROPERTY_KEYS, "").split(" ") if k]

    def offset_msg_id(self) -> str:
        """The broker's message id (reference §6.1): store host + phy offset, upper hex."""
        ip = ipaddress.ip_address(self.store_host[0]).packed
        return (ip + self.store_host[1].to_bytes(4, "big")
                + self.phy_offset.to_bytes(8, "big", signed=True)).hex().upper()


class CorruptRecord(ValueError):
    """Bytes at a position are not a valid stored-message record."""


def _host(b: bytes, pos: int, v6: bool) -> tuple[tuple[str, int], int]:
    n = 16 if v6 else 4
    ip = socket.inet_ntop(socket.AF_INET6 if v6 else socket.AF_INET, b[pos:pos + n])
    return (ip, int.from_bytes(b[pos + n:pos + n + 4], "big", signed=True)), pos + n + 4


def record_fault(data, phy: int) -> str | None:
    """Why the record at the start of ``data`` (a view of exactly its bytes,
    at CommitLog offset ``phy``) fails the check recovery makes — TOTALSIZE,
    MAGIC, its own offset, the field lengths, the body CRC — or None when
    it passes. No object per field: pulls that read old records from disk
    call it per record."""
    size = len(data)
    if size < L.RECORD_FIXED_BYTES + 1:
        return f"record at {phy}: {size} bytes, too few for a record"
    total, magic, crc, _, _, _, own, sysflag, _ = _HEAD.unpack_from(data, 0)
    if total != size:
        return f"record at {phy}: TOTALSIZE {total}, its ConsumeQueue unit says {size}"
    if magic != L.MESSAGE_MAGIC:
        return f"record at {phy}: magic {magic:#x} is not {L.MESSAGE_MAGIC:#x}"
    if own != phy:
        return f"record at {phy}: PHYSICALOFFSET says {own}"
    q = 48 + (20 if sysflag & L.SYSFLAG_BORNHOST_V6 else 8) + 8 \
        + (20 if sysflag & L.SYSFLAG_STOREHOST_V6 else 8) + 12
    blen = int.from_bytes(data[q:q + 4], "big", signed=True)
    t = q + 4 + blen
    if blen < 0 or t + 3 > size or t + 1 + data[t] + 2 + int.from_bytes(
            data[t + 1 + data[t]:t + 3 + data[t]], "big", signed=True) != size:
        return f"record at {phy}: field lengths do not add up to TOTALSIZE {size}"
    if zlib.crc32(data[q + 4:t]) & 0x7FFFFFFF != crc:
        return f"record at {phy}: body CRC mismatch"
    return None


def decode(data, pos: int = 0, check_crc: bool = True) -> StoredMessage:
    """Decode the record at ``pos`` of ``data`` (bytes or uint8 array)."""
    b = bytes(data[pos:pos + 4])
    if len(b) < 4:
        raise CorruptRecord(f"no record at {pos}: buffer ends")
    size = int.from_bytes(b, "big", signed=True)
    if size < L.RECORD_FIXED_BYTES + 1:
        raise CorruptRecord(f"record at {pos}: TOTALSIZE {size} is too small")
    r = bytes(data[pos:pos + size])
    if len(r) != size:
        raise CorruptRecord(f"record at {pos}: TOTALSIZE {size} runs past the buffer")

    def i32(o):
        return int.from_bytes(r[o:o + 4], "big", signed=True)

    def i64(o):
        return int.from_bytes(r[o:o + 8], "big", signed=True)

    magic = i32(4)
    if magic != L.MESSAGE_MAGIC_I32:
        raise CorruptRecord(f"record at {pos}: magic {magic & 0xFFFFFFFF:#x} is not {L.MESSAGE_MAGIC:#x}")
    sysflag = i32(36)
    born_host, q = _host(r, 48, bool(sysflag & L.SYSFLAG_BORNHOST_V6))
    store_ts = i64(q)
    store_host, q = _host(r, q + 8, bool(sysflag & L.SYSFLAG_STOREHOST_V6))
    reconsume, prepared, blen = i32(q), i64(q + 4), i32(q + 12)
    q += 16
    body = r[q:q + blen]
    q += blen
    if blen < 0 or q >= size:
        raise CorruptRecord(f"record at {pos}: body length {blen} does not fit")
    tlen = r[q]
    topic = r[q + 1:q + 1 + tlen].decode("utf-8", "replace")
    q += 1 + tlen
    plen = int.from_bytes(r[q:q + 2], "big", signed=True)
    props = r[q + 2:q + 2 + plen]
    if q + 2 + plen != size or tlen == 0:
        raise CorruptRecord(f"record at {pos}: field lengths do not add up to TOTALSIZE {size}")
    crc = i32(8)
    if check_crc and crc != (zlib.crc32(body) & 0x7FFFFFFF):
        raise CorruptRecord(f"record at {pos}: body CRC mismatch")
    return StoredMessage(size, magic, crc, i32(12), i32(16), i64(20), i64(28), sysflag, i64(40),
                         born_host, store_ts, store_host, reconsume, prepared, body, topic, props)


# ------------------------------------------------------------ columnar decode
_KEYS_KEY = np.frombuffer(L.PROPERTY_KEYS.encode(), dtype=np.uint8)
_UNIQ_KEY = np.frombuffer(L.PROPERTY_UNIQ_KEY.encode(), dtype=np.uint8)
_NO_KEY = jit.readonly(np.zeros(0, dtype=np.uint8))
_HOST_TEXT_MAX = 47        # "[ffff:…:ffff]:2147483647"
_OFFSET_ID_MAX = 56        # IPv6 store host + port + offset, in hex

# (name, dtype) of the fixed-width columns, and the names of the variable ones
# (int32 offsets + bytes), in the order ``decode_columns`` fills them.
FIXED_COLUMNS = (("queueId", np.int32), ("queueOffset", np.int64), ("commitLogOffset", np.int64),
                 ("storeSize", np.int32), ("sysFlag", np.int32), ("flag", np.int32),
                 ("bornTimestamp", np.int64), ("storeTimestamp", np.int64))
VAR_COLUMNS = ("topic", "body", "properties", "tags", "keys", "bornHost", "storeHost", "msgId")


@dataclass
class Columns:
    """Records as columns, Arrow-shaped: ``fixed[name]`` arrays (timestamps
    in microseconds), ``var[name] = (int32 offsets (n+1), uint8 data)`` and
    ``valid[name]`` (uint8, 1 = present) for the nullable tags and keys."""
    n: int
    fixed: dict[str, np.ndarray]
    var: dict[str, tuple[np.ndarray, np.ndarray]]
    valid: dict[str, np.ndarray]

    def text(self, name: str, i: int) -> str | None:
        if name in self.valid and not self.valid[name][i]:
            return None
        off, dat = self.var[name]
        return dat[off[i]:off[i + 1]].tobytes().decode("utf-8", "replace")


# The columnar readers' entry points below pass their input arrays to the
# kernels read-only (``_ro``), whatever their callers hold (a writable
# mapping, rows a kernel just wrote): the one specialisation each kernel has
# (``core/jit.py``), so an unfrozen process (a Spark worker, a tool) never
# compiles a second one for writable inputs on a cold cache.
def _ro(arrays) -> tuple:
    return tuple(jit.readonly(a) for a in arrays)


def scan_rows(buf: np.ndarray, start: int, end: int, phy_base: int, max_rows: int,
              check_crc: bool = False) -> tuple[np.ndarray, int, int]:
    """Rows (``scan_records`` layout) of up to ``max_rows`` records of segment
    ``buf`` from ``start`` to ``end``; returns (rows, pos, status)."""
    out = np.empty((max_rows, K.N_SCAN), dtype=np.int64)
    n, pos, status = K.scan_records(jit.readonly(buf), start, end, phy_base, check_crc,
                                    K.CRC_TABLES, _NO_KEY, out)
    return out[:n], int(pos), int(status)


def rows_at(buf: np.ndarray, phy_base: int, phys: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Rows of the records at ConsumeQueue positions ``phys`` (all in segment
    ``buf``), up to the first that is not a valid record of its unit's size."""
    buf, phys, sizes = _ro((buf, phys, sizes))
    out = np.empty((phys.shape[0], K.N_SCAN), dtype=np.int64)
    n = K.records_at(buf, phy_base, phys, sizes, 0, phys.shape[0], _NO_KEY, out)
    return out[:n]


def uniq_hashes(buf: np.ndarray, phy_base: int, phys: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The duplicate-send window's hash of each record at ConsumeQueue
    positions ``phys`` (all in segment ``buf``; ``K.uniq_hashes``), 0 where
    there is no key to remember."""
    buf, phys, sizes = _ro((buf, phys, sizes))
    out = np.empty(phys.shape[0], dtype=np.int64)
    K.uniq_hashes(buf, phy_base, phys, sizes, phys.shape[0], K.CRC_TABLES, _UNIQ_KEY, out)
    return out


def decode_columns(buf: np.ndarray, phy_base: int, rows: np.ndarray) -> Columns:
    """Every field of the records ``rows`` describe, as columns (one numba pass)."""
    buf, rows = _ro((buf, rows))
    n = rows.shape[0]
    body = int(rows[:, K.S_BODY_LEN].sum())
    props = int(rows[:, K.S_PROPS_LEN].sum())
    topic = int(rows[:, K.S_TOPIC_LEN].sum())
    fixed = {name: np.empty(n, dtype) for name, dtype in FIXED_COLUMNS}
    sizes = {"topic": topic, "body": body, "properties": props, "tags": props, "keys": props,
             "bornHost": n * _HOST_TEXT_MAX, "storeHost": n * _HOST_TEXT_MAX,
             "msgId": props + n * _OFFSET_ID_MAX}
    var = {name: (np.empty(n + 1, np.int32), np.empty(sizes[name], np.uint8)) for name in VAR_COLUMNS}
    valid = {"tags": np.empty(n, np.uint8), "keys": np.empty(n, np.uint8)}
    K.arrow_columns(buf, phy_base, rows, n, _TAGS_KEY, _KEYS_KEY, _UNIQ_KEY,
                    *(fixed[name] for name, _ in FIXED_COLUMNS),
                    *var["topic"], *var["body"], *var["properties"],
                    *var["tags"], valid["tags"], *var["keys"], valid["keys"],
                    *var["bornHost"], *var["storeHost"], *var["msgId"])
    return Columns(n, fixed, var, valid)


def property_pairs(offs: np.ndarray, dat: np.ndarray) -> tuple[np.ndarray, tuple, tuple]:
    """Each row's properties as (row offsets into the pairs, (key offsets,
    key bytes), (value offsets, value bytes)), the pieces Java's parser keeps."""
    offs, dat = _ro((offs, dat))
    n = offs.shape[0] - 1
    cap = int(np.count_nonzero(dat == 2)) + n
    ks, kl, vs, vl = (np.empty(cap, np.int64) for _ in range(4))
    row_off = np.empty(n + 1, np.int32)
    m = K.property_spans(dat, offs, n, ks, kl, vs, vl, row_off)
    out = []
    for starts, lens in ((ks, kl), (vs, vl)):
        o = np.empty(m + 1, np.int32)
        d = np.empty(int(lens[:m].sum()), np.uint8)
        K.gather_spans(dat, starts, lens, m, o, d)
        out.append((o, d))
    return row_off, out[0], out[1]


# ------------------------------------------------------------------ warm-ups
# The units of ``core/jit.py``: each calls its kernels once with their
# canonical argument types (inputs read-only, outputs writable, int64; a
# frozen broker process converts the writable arrays its request paths pass).
# Compilation depends on the types alone, so a unit feeds zeros where it can
# and never runs another unit's kernels (the units compile in parallel).
_WARM_BODY = b"\x00\x00\x00\x18" + bytes(12) + b"\x00\x00\x00\x01x\x00\x01t"   # a batch of one


def warm_up_encode() -> None:
    bodies = L.lay_out([b"x", b"yz"], "bodies", 2)
    for props in ([b"TAGS\x01a\x02KEYS\x01k", b""], b"TAGS\x01t"):   # one each; one for all
        arrays = _ro(bodies + L.lay_out(props, "properties", 2))
        encode_arrays("warmup", *arrays)                                # encode_uniform, tags_codes
        encode_arrays("warmup", *arrays, flag=[0, 1])                   # encode_batch
    _tags_code_one(jit.readonly(np.frombuffer(b"TAGS\x01t", np.uint8)), 0, 6)


def warm_up_batch() -> None:
    split_batch_body(_WARM_BODY, b"")
    zeros = jit.readonly(np.zeros(64, np.uint8))
    one = jit.readonly(np.zeros(1, np.int64))
    slot_of = jit.readonly(np.zeros(1, np.int32))      # the store's per-record queue slots
    K.stamp_batch(np.zeros(64, np.uint8), one, 1, 0, slot_of, np.zeros(1, np.int64),
                  np.zeros(1, np.int64))
    int_property(zeros, one, one, L.PROPERTY_TAGS, np.zeros(1, np.int64))


def warm_up_scan() -> None:
    zeros = jit.readonly(np.zeros(64, np.uint8))
    K.scan_records(zeros, 0, 64, 0, True, K.CRC_TABLES, _TAGS_KEY, np.zeros((1, K.N_SCAN), np.int64))
    K.last_nonzero(zeros, 0)
    one = jit.readonly(np.zeros(1, np.int64))
    uniq_hashes(zeros, 0, one, one)


def warm_up_queue() -> None:
    cq = np.zeros(40, np.uint8)
    one = jit.readonly(np.ones(1, np.int64))
    K.cq_put_many(cq, 0, one, one, one, 0, 1)
    o = np.zeros(2, np.int64)
    ro = jit.readonly(cq)
    K.cq_scan(ro, 0, 1, one, 1, 1 << 20, o, o)
    K.cq_valid_units(ro, 0, 2, 1 << 20)
    K.min_phy_from(ro, 0, 2, 0)
    K.cq_put_units(cq, 0, jit.readonly(np.zeros(20, np.uint8)), 1)   # recovery's, a slave's units
    rows = jit.readonly(np.zeros((1, K.N_SCAN), np.int64))
    K.cq_group_rows(rows, np.zeros(20, np.uint8), o, o, np.zeros(2, np.int64), o)
    K.queues_due(one, jit.readonly(np.zeros(1, np.int64)), one, 1, o)   # a worker's parked pulls


def pull_rows(buf: np.ndarray, check_crc: bool, out: np.ndarray) -> tuple[int, int]:
    """Rows (``layout.P_*``) of the records of a pull's body ``buf`` (read-only
    uint8), as many as fit in ``out``: (rows written, where the walk
    stopped). client/batch.py's batches."""
    n, stop = K.pull_rows(buf, check_crc, K.CRC_TABLES, out)
    return int(n), int(stop)


def warm_up_pull() -> None:
    """A batch consumer's walk of a pull's records (client/batch.py)."""
    K.pull_rows(jit.readonly(np.zeros(0, np.uint8)), True, K.CRC_TABLES,
                np.zeros((1, K.N_PULL), np.int64))


def warm_up() -> None:
    """Load (or compile) every kernel a store needs, in this process."""
    jit.load(("encode", "batch", "scan", "queue"))


def warm_up_readers() -> None:
    """The columnar readers' kernels (tools, Spark)."""
    zeros = jit.readonly(np.zeros(64, np.uint8))
    none = jit.readonly(np.zeros(0, np.int64))
    rows_at(zeros, 0, none, none)
    cols = decode_columns(zeros, 0, jit.readonly(np.zeros((0, K.N_SCAN), np.int64)))
    property_pairs(*_ro(cols.var["properties"]))
