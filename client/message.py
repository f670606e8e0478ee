"""What applications hand the client and get back: messages, queues, send results.

Names follow RocketMQ's Java client (``Message``, ``MessageExt``,
``MessageQueue``, ``SendResult``/``SendStatus``). A message's id is its
``UNIQ_KEY`` (MessageClientIDSetter's layout, made here when sending); the
broker's ``offsetMsgId`` locates the stored record.

A ``MessageExt`` is a view of one record in the body of a pull reply (the
record layout is drawn in ``shmq.core.layout``): ``decode_messages`` walks
the body, checks each record's frame (magic, lengths that add up to
TOTALSIZE, body CRC) and makes one object per record holding the buffer,
the record's position, its size, queue offset and sysflag. Everything else
(topic, body, properties, hosts, timestamps) is read from the buffer when
the listener first asks, so a listener that only looks at the body never
pays for the properties, and nothing but the ``MessageExt`` itself is kept
per message (the pull's MIN_OFFSET/MAX_OFFSET are one tuple shared by the
pull's messages). The buffer stays alive while any of its messages does.
"""
from __future__ import annotations

import enum
import itertools
import logging
import os
import socket
import struct
import time
import zlib
from dataclasses import dataclass, field

from shmq.core import layout as L
from shmq.core.layout import properties_to_string, string_to_properties
from shmq.ipc.codes import ResponseCode as R

from .errors import MQClientError
from .walk import CorruptMessage, kept, walk

log = logging.getLogger("shmq.client")

TAGS, KEYS, UNIQ_KEY, DELAY, WAIT = "TAGS", "KEYS", "UNIQ_KEY", "DELAY", "WAIT"


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True, order=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int

    def to_json(self) -> dict:
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id}


def split_keys(keys: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """The keys of a KEYS value (space-separated) or of a list, as a list."""
    if not keys:
        return []
    if isinstance(keys, str):
        return [k for k in keys.split(" ") if k]
    return [k for k in keys if k]


@dataclass
class Message:
    """A message to send. ``keys`` is one key, several separated by spaces, or
    a list (RocketMQ's setKeys(String) / setKeys(Collection)); ``key_list``
    gives them as a list. ``properties`` are user properties; ``delay_level``
    1..18 delays it by the broker's levels."""
    topic: str
    body: bytes
    tags: str | None = None
    keys: str | list[str] | None = None
    properties: dict[str, str] = field(default_factory=dict)
    delay_level: int = 0
    flag: int = 0

    def put_user_property(self, name: str, value: str) -> None:
        self.properties[name] = str(value)

    @property
    def key_list(self) -> list[str]:
        return split_keys(self.keys)

    def properties_string(self, uniq_key: str | None = None,
                          extra: dict[str, str] | None = None) -> str:
        """The properties as sent (``k\\x01v`` joined by ``\\x02``), UNIQ_KEY
        included, and ``extra``: what the producer adds (a half message's
        TRAN_MSG and PGROUP), not kept in the message. Every send path
        encodes them here, so here a message whose properties — all of
        them, the added ones too — do not fit the record's int16 length is
        refused (MESSAGE_ILLEGAL, as RocketMQ's broker refuses it:
        PROPERTIES_SIZE_EXCEEDED) before anything is sent or batched."""
        if not self.properties and not extra and isinstance(self.keys, (str, type(None))):
            return properties_fit(self._system_properties(uniq_key))
        d = dict(self.properties)
        if self.tags:
            d[TAGS] = self.tags
        if self.keys:
            d[KEYS] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
        if self.delay_level > 0:
            d[DELAY] = str(self.delay_level)
        if uniq_key and UNIQ_KEY not in d:
            d[UNIQ_KEY] = uniq_key
        if extra:
            d.update(extra)
        for k, v in d.items():
            check_property(k, str(v))
        return properties_fit(properties_to_string(d))

    def _system_properties(self, uniq_key: str | None) -> str:
        """properties_string without user properties (the common case), without
        the dict: the same pieces in the same order."""
        parts = []
        for name, v in ((TAGS, self.tags), (KEYS, self.keys)):
            if v:
                check_property(name, v)
                parts.append(f"{name}\x01{v}")
        if self.delay_level > 0:
            parts.append(f"{DELAY}\x01{self.delay_level}")
        if uniq_key:
            parts.append(f"{UNIQ_KEY}\x01{uniq_key}")
        return "\x02".join(parts)


def check_property(name: str, value: str) -> None:
    """A property (TAGS, KEYS, a user property) whose name or value holds a
    separator of the properties string (\\u0001 between name and value,
    \\u0002 between properties) would be read back as other properties:
    MESSAGE_ILLEGAL, before anything is sent or put (every send path and
    ``put`` check here)."""
    for s in (name, value):
        if "\x01" in s or "\x02" in s:
            raise MQClientError(R.MESSAGE_ILLEGAL, f"the message property {name}={value!r} "
                                f"contains an illegal character: \\u0001 or \\u0002 separate "
                                f"the properties")


def properties_fit(props: str) -> str:
    """``props``, if its UTF-8 encoding fits the record's int16 properties
    length (32767 bytes); else MESSAGE_ILLEGAL (every properties string a
    producer sends is made by ``properties_string``, ``put_properties`` or
    ``send_many``, which check it here). (Up to 8191 characters it
    fits whatever they are: no encoding on the common path.)"""
    if len(props) > L.PROPERTIES_BYTES_MAX // 4:
        n = len(props.encode())
        if n > L.PROPERTIES_BYTES_MAX:
            raise MQClientError(R.MESSAGE_ILLEGAL, f"the message's properties are {n} bytes "
                                f"encoded, over the limit of {L.PROPERTIES_BYTES_MAX} (msg "
                                f"properties length limit 32KB): send less in tags, keys and "
                                f"user properties")
    return props


@dataclass
class SendResult:
    status: SendStatus
    msg_id: str                  # UNIQ_KEY (comma-joined for a batch)
    offset_msg_id: str           # the broker's id of the stored record(s)
    queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None
    region_id: str = "DefaultRegion"


# TOTALSIZE, MAGICCODE, BODYCRC, QUEUEOFFSET, SYSFLAG, and BODYLENGTH where
# two IPv4 hosts put it (offset 84): a record of an IPv4 broker read in one
# call (RECORD_FIXED_BYTES covers it; IPv6 hosts move BODYLENGTH)
_HEAD_V4 = struct.Struct(">iii8xq8xi44xi")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_MAGIC = L.MESSAGE_MAGIC_I32
_COMPRESSED, _BORN_V6, _STORE_V6 = L.SYSFLAG_COMPRESSED, L.SYSFLAG_BORNHOST_V6, L.SYSFLAG_STOREHOST_V6
_V6 = _BORN_V6 | _STORE_V6
MIN_OFFSET, MAX_OFFSET = "MIN_OFFSET", "MAX_OFFSET"


class MessageExt:
    """A consumed message: a view of its record in a pulled buffer, and the
    broker it came from. ``topic``, ``body`` and ``reconsume_times`` may be
    set (a retry's original topic, a failed consume)."""

    __slots__ = ("_buf", "_pos", "broker_name", "store_size", "queue_offset", "sysflag",
                 "_body", "_topic", "_props", "_reconsume", "_pull", "_blen", "_tr")

    def __init__(self, buf: bytes, pos: int, broker_name: str, store_size: int,
                 queue_offset: int, sysflag: int, body_len: int, topic_at: int,
                 pull: tuple[str, str] | None = None):
        self._buf, self._pos = buf, pos
        self.broker_name = broker_name
        self.store_size, self.queue_offset, self.sysflag = store_size, queue_offset, sysflag
        # BODYLENGTH, and where TOPICLENGTH is in the record, as the decoder
        # found them: the body ends there and the properties begin after the
        # topic, so each field is one slice away (a held message's size is
        # asked twice, by the pull's flow control; its id by most
        # listeners). Relative to the record: ints the interpreter shares
        # (no new object) for bodies up to ~160 B.
        self._blen, self._tr = body_len, topic_at
        self._body = self._topic = self._props = self._reconsume = None
        self._pull = pull                  # (MIN_OFFSET, MAX_OFFSET) of the pull, shared

    # ------------------------------------------------------------ positions
    def _host_bytes(self) -> tuple[int, int]:
        f = self.sysflag
        return (20 if f & _BORN_V6 else 8), (20 if f & _STORE_V6 else 8)

    def _props_span(self) -> tuple[int, int]:
        t = self._pos + self._tr
        return t + 3 + self._buf[t], self._pos + self.store_size

    # ------------------------------------------------------------ fields
    @property
    def body(self) -> bytes:
        if self._body is None:
            t = self._pos + self._tr
            self._body = self._buf[t - self._blen:t]
        return self._body

    @body.setter
    def body(self, value: bytes) -> None:
        self._body = value

    @property
    def body_size(self) -> int:
        """len(body), without slicing it out of the buffer."""
        b = self._body
        return self._blen if b is None else len(b)

    @property
    def topic(self) -> str:
        if self._topic is None:
            buf, t = self._buf, self._pos + self._tr
            self._topic = buf[t + 1:t + 1 + buf[t]].decode("utf-8", "replace")
        return self._topic

    @topic.setter
    def topic(self, value: str) -> None:
        self._topic = value

    @property
    def properties(self) -> dict[str, str]:
        if self._props is None:
            s, e = self._props_span()
            props = string_to_properties(self._buf[s:e].decode("utf-8", "replace"))
            if self._pull is not None:
                props[MIN_OFFSET], props[MAX_OFFSET] = self._pull
            self._props = props
        return self._props

    def _property(self, name: str, key: bytes) -> str | None:
        """One property, read from the raw bytes while the dict is not built
        (``key`` is ``name`` + 0x01; the last piece with it wins, as in
        string_to_properties; anything unusual asks the dict). Written out
        in one frame: most listeners ask every message for its id."""
        if self._props is not None:
            return self._props.get(name)
        buf, pos = self._buf, self._pos
        t = pos + self._tr
        s = t + 3 + buf[t]
        e = pos + self.store_size
        i = buf.rfind(key, s, e)
        if i < 0:
            return None
        if i != s and buf[i - 1] != 2:           # the end of another name: the dict says
            return self.properties.get(name)
        v = i + len(key)
        end = buf.find(b"\x02", v, e)
        value = buf[v:e if end < 0 else end]
        if not value or 1 in value:
            return self.properties.get(name)
        return value.decode("utf-8", "replace")

    @property
    def tags(self) -> str | None:
        return self._property(TAGS, b"TAGS\x01")

    @property
    def keys(self) -> str | None:
        """The KEYS property as sent: one string, keys separated by spaces
        (RocketMQ's getKeys()); None without keys."""
        return self._property(KEYS, b"KEYS\x01") or None

    @property
    def key_list(self) -> list[str]:
        """The keys as a list (``keys`` split at spaces)."""
        return split_keys(self.keys)

    @property
    def msg_id(self) -> str:
        """UNIQ_KEY (the producer's id), else ``offset_msg_id``: ``_property``
        written out here, since a listener asks every message for it."""
        if self._props is None:
            buf, pos = self._buf, self._pos
            t = pos + self._tr
            s = t + 3 + buf[t]
            e = pos + self.store_size
            i = buf.rfind(b"UNIQ_KEY\x01", s, e)
            if i == s or i > s and buf[i - 1] == 2:
                end = buf.find(b"\x02", i + 9, e)
                value = buf[i + 9:e if end < 0 else end]
                if value and 1 not in value:
                    return value.decode("utf-8", "replace")
            elif i < 0:
                return self.offset_msg_id
        return self.properties.get(UNIQ_KEY) or self.offset_msg_id

    @property
    def offset_msg_id(self) -> str:
        """The broker's id of the record: store host ip + port + phy offset, hex."""
        born, store = self._host_bytes()
        at = self._pos + 56 + born
        return (self._buf[at:at + store] + _I64.pack(self.commit_log_offset)).hex().upper()

    @property
    def queue_id(self) -> int:
        return _I32.unpack_from(self._buf, self._pos + 12)[0]

    @property
    def flag(self) -> int:
        return _I32.unpack_from(self._buf, self._pos + 16)[0]

    @property
    def commit_log_offset(self) -> int:
        return _I64.unpack_from(self._buf, self._pos + 28)[0]

    @property
    def body_crc(self) -> int:
        return _I32.unpack_from(self._buf, self._pos + 8)[0]

    @property
    def born_timestamp(self) -> int:
        return _I64.unpack_from(self._buf, self._pos + 40)[0]

    @property
    def store_timestamp(self) -> int:
        return _I64.unpack_from(self._buf, self._pos + 48 + self._host_bytes()[0])[0]

    def _host(self, at: int, n: int) -> tuple[str, int]:
        family = socket.AF_INET6 if n == 20 else socket.AF_INET
        return socket.inet_ntop(family, self._buf[at:at + n - 4]), \
            _I32.unpack_from(self._buf, at + n - 4)[0]

    @property
    def born_host(self) -> tuple[str, int]:
        return self._host(self._pos + 48, self._host_bytes()[0])

    @property
    def store_host(self) -> tuple[str, int]:
        born, store = self._host_bytes()
        return self._host(self._pos + 56 + born, store)

    @property
    def reconsume_times(self) -> int:
        if self._reconsume is None:
            born, store = self._host_bytes()
            return _I32.unpack_from(self._buf, self._pos + 56 + born + store)[0]
        return self._reconsume

    @reconsume_times.setter
    def reconsume_times(self, value: int) -> None:
        self._reconsume = value

    @property
    def prepared_transaction_offset(self) -> int:
        born, store = self._host_bytes()
        return _I64.unpack_from(self._buf, self._pos + 60 + born + store)[0]

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    @property
    def record(self):
        """The record as a ``shmq.core.records.StoredMessage``, with the topic,
        body and reconsume times as they are here (imported on use: the
        client's own paths never load core.records and its numba kernels)."""
        import dataclasses

        from shmq.core.records import decode
        rec = decode(self._buf, self._pos, check_crc=False)
        return dataclasses.replace(rec, topic=self.topic, body=self.body,
                                   reconsume_times=self.reconsume_times)

    def __repr__(self) -> str:
        return (f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, "
                f"queue_offset={self.queue_offset}, msg_id={self.msg_id!r}, tags={self.tags!r}, "
                f"keys={self.keys!r})")


def decode_messages(body: bytes, broker_name: str, pull: tuple[str, str] | None = None,
                    check_crc: bool = True, skipped: list | None = None) -> list[MessageExt]:
    """The records of a pull (or VIEW/QUERY) reply body as ``MessageExt``s.
    Each record's frame is checked (magic, field lengths adding up to
    TOTALSIZE, body CRC); a compressed body is inflated here (one that is not
    zlib is kept as stored, with a warning). Raises CorruptMessage, unless
    ``skipped`` is a list: then a damaged record is left out and described
    there as (its queue offset or None, why, framed): ``framed`` when the
    records after it could still be read (only its body is bad); a broken
    frame ends the decoding there. Once a consumer has loaded the walk's
    kernel (client/walk.py) the records of a body past LOOP_BYTES_MAX are
    found by it, else by one Python loop: the same messages and the same
    damage either way."""
    if not isinstance(body, bytes):
        body = bytes(body)
    if len(body) > LOOP_BYTES_MAX:
        walked = walk(body, check_crc, kernel_only=True)
        if walked is not None:
            return _from_rows(body, broker_name, pull, skipped, *walked)
    return _decode_loop(body, broker_name, pull, check_crc, skipped)


# A body this small (a few records) is decoded by the Python loop even where
# the walk's kernel is loaded: the kernel's call and its rows cost a fixed
# ~6 µs, the loop ~1.3 µs a record of 100 B, so the loop is quicker up to
# about 8 such records (in-process, 2026-11-28: one record 1.7 against
# 7.8 µs, 8 records 10.6 against 11.8, 16 records 20.7 against 15.6). A
# consumer of sparse traffic gets one message a pull.
LOOP_BYTES_MAX = 2048


def _decode_loop(body: bytes, broker_name: str, pull: tuple[str, str] | None, check_crc: bool,
                 skipped: list | None) -> list[MessageExt]:
    """``decode_messages`` in one Python loop: where the walk's kernel is
    not loaded (a client alone, a consumer's first pulls, a tool)."""
    out = []
    append = out.append
    head4, i32 = _HEAD_V4.unpack_from, _I32.unpack_from
    fixed, v6, magic_ok = L.RECORD_FIXED_BYTES, _V6, _MAGIC
    crc32 = zlib.crc32
    mv = memoryview(body)
    pos, n = 0, len(body)
    while pos < n:
        if n - pos < fixed:
            why = f"record at {pos}: {n - pos} bytes left, too few for a record"
            if skipped is None:
                raise CorruptMessage(why)
            skipped.append((None, why, False))
            break
        size, magic, crc, qoff, sysflag, blen = head4(body, pos)
        end = pos + size
        if sysflag & v6:
            q = pos + 68 + (20 if sysflag & _BORN_V6 else 8) + (20 if sysflag & _STORE_V6 else 8)
            if q + 7 <= end <= n:
                blen = i32(body, q)[0]
        else:
            q = pos + 84
        if magic != magic_ok or size < fixed or end > n or q + 7 > end:
            why = (f"record at {pos}: magic {magic & 0xFFFFFFFF:#x}, TOTALSIZE {size}: not a "
                   f"message record within the {n} bytes")
            if skipped is None:
                raise CorruptMessage(why)
            skipped.append((qoff if magic == _MAGIC else None, why, False))
            break
        t = q + 4 + blen                   # TOPICLENGTH
        # the topic's length, then the properties' (int16) ending the record at TOTALSIZE
        if blen < 0 or t + 3 > end or not 0 < (tl := body[t]) or t + 3 + tl > end or (
                (pl := body[t + 1 + tl] << 8 | body[t + 2 + tl]) >= 0x8000 or t + 3 + tl + pl != end):
            why = f"record at {pos}: field lengths do not add up to TOTALSIZE {size}"
            if skipped is None:
                raise CorruptMessage(why)
            skipped.append((qoff, why, True))        # TOTALSIZE passed its checks: go on
            pos = end
            continue
        if check_crc and crc32(mv[q + 4:t]) & 0x7FFFFFFF != crc:
            why = f"record at {pos}: body CRC mismatch"
            if skipped is None:
                raise CorruptMessage(why)
            skipped.append((qoff, why, True))
            pos = end
            continue
        m = MessageExt(body, pos, broker_name, size, qoff, sysflag, blen, t - pos, pull)
        if sysflag & _COMPRESSED:
            try:
                m._body = zlib.decompress(body[q + 4:t])
            except zlib.error as e:
                log.warning("message %s at %s:%d: body not zlib (%s); kept as stored",
                            m.msg_id, broker_name, qoff, e)
        append(m)
        pos = end
    return out


def _from_rows(body: bytes, broker_name: str, pull: tuple[str, str] | None,
               skipped: list | None, rows, stop: int) -> list[MessageExt]:
    """``decode_messages`` from the walk's rows (client/walk.py): the same
    messages, the same damage described, in half the time of the loop."""
    rows = kept(body, rows, stop, skipped)
    # each row: start, TOTALSIZE, queue offset, sysflag, body position and
    # length, TOPICLENGTH's position, status (layout.P_*)
    out = [MessageExt(body, start, broker_name, size, qoff, sysflag, blen, topic_at - start, pull)
           for start, size, qoff, sysflag, _, blen, topic_at, _ in rows.tolist()]
    if (rows[:, L.P_SYSFLAG] & _COMPRESSED).any():
        for m in out:
            if m.sysflag & _COMPRESSED:
                t = m._pos + m._tr
                try:
                    m._body = zlib.decompress(body[t - m._blen:t])
                except zlib.error as e:
                    log.warning("message %s at %s:%d: body not zlib (%s); kept as stored",
                                m.msg_id, broker_name, m.queue_offset, e)
    return out


class UniqueIds:
    """MessageClientIDSetter: ip | pid int16 | int32 | ms since the month
    began int32 | counter int16, upper-case hex. Re-seeded after a fork."""

    def __init__(self):
        self._pid = -1

    def _seed(self) -> None:
        self._pid = os.getpid()
        try:
            ip = socket.inet_aton(socket.gethostbyname(socket.gethostname()))
        except OSError:
            ip = socket.inet_aton("127.0.0.1")
        self._prefix = (ip + struct.pack(">hi", self._pid & 0x7FFF, id(self) & 0x7FFFFFFF)).hex().upper()
        t = time.localtime()
        self._month_start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
        self._counter = itertools.count()
        self._ms, self._head = -1, ""

    def next(self) -> str:
        if self._pid < 0:                 # first use, or a forked child (_forked)
            self._seed()
        ms = int((time.time() - self._month_start) * 1000) & 0x7FFFFFFF
        if ms != self._ms:                # prefix + the ms field, in hex, once a millisecond
            self._ms, self._head = ms, f"{self._prefix}{ms:08X}"
        return self._head + _COUNTER_HEX[next(self._counter) & 0x7FFF]


_COUNTER_HEX = [f"{i:04X}" for i in range(0x8000)]     # the int16 field, non-negative
unique_ids = UniqueIds()


def _forked() -> None:
    unique_ids._pid = -1


os.register_at_fork(after_in_child=_forked)
