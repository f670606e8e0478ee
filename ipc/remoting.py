"""The RocketMQ 4.x remoting protocol, sans I/O: bytes in, commands out, bytes back.

Nothing here touches a socket. ``FrameDecoder.receive_data`` takes whatever
bytes arrived; ``next_command`` returns a complete ``RemotingCommand`` or
``None`` (need more data), or raises ``RemoteProtocolError`` for bytes that
can never form a command (the caller closes that one connection). ``encode``
and ``encode_head`` turn a command back into bytes; ``encode_head`` leaves the
body out so that it can be sent separately (sendfile, sendmsg of slices).

Frame (reference §1.1), big-endian::

    int32 total      = 4 + header bytes + body bytes (not counting itself)
    int32 type_hlen  = serialize type << 24 | header bytes
    header           JSON (type 0) or ROCKETMQ binary (type 1)
    body             the rest of the frame

ROCKETMQ binary header (§1.3)::

    int16 code | int8 language | int16 version | int32 opaque | int32 flag |
    int32 remark bytes | remark | int32 ext bytes |
    ext: repeated (int16 key bytes | key | int32 value bytes | value)

Clients send extFields values as strings (Go), JSON numbers and booleans
(Node, C++): every value becomes a string here, numbers as decimal text,
booleans as "true"/"false"; nulls and unknown keys are dropped. A reply goes
out in the request's serialization (``RemotingCommand.reply``); replies made
without a request (errors) use JSON, which every client reads.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

import orjson

JSON = 0
ROCKETMQ = 1
FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2
FRAME_BYTES_MAX = 16 * 1024 * 1024          # NettyDecoder.FRAME_MAX_LENGTH
VERSION_4_9_7 = 407                         # MQVersion ordinal this broker speaks as

LANGUAGES = {"JAVA": 0, "CPP": 1, "DOTNET": 2, "PYTHON": 3, "DELPHI": 4, "ERLANG": 5,
             "RUBY": 6, "OTHER": 7, "HTTP": 8, "GO": 9, "PHP": 10, "OMS": 11, "RUST": 12,
             "NODE_JS": 13}
LANGUAGE_NAMES = {v: k for k, v in LANGUAGES.items()}

_PREFIX = struct.Struct(">ii")
_BIN_FIXED = struct.Struct(">hbhiii")      # code, language, version, opaque, flag, remark length
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class RemoteProtocolError(ValueError):
    """The peer sent bytes that are not a remoting frame: close the connection."""


class LocalProtocolError(ValueError):
    """We were asked to encode something the protocol cannot carry."""


@dataclass(slots=True)       # one per request and reply: slots make it cheaper to build and read
class RemotingCommand:
    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext: dict[str, str] = field(default_factory=dict)
    body: bytes | bytearray | memoryview = b""
    language: str = "JAVA"
    version: int = VERSION_4_9_7
    serialize_type: int = JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def reply(self, code: int, remark: str | None = None, ext: dict[str, str] | None = None,
              body: bytes | memoryview = b"") -> "RemotingCommand":
        """The response to this request: same opaque, response flag, and the
        request's serialization (RocketMQ's normal path)."""
        return RemotingCommand(code=code, opaque=self.opaque, flag=FLAG_RESPONSE, remark=remark,
                               ext=dict(ext or {}), body=body, serialize_type=self.serialize_type)


# ------------------------------------------------------------------ decoding
def _ext_value(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (int, float, str)):
        return str(v)
    raise RemoteProtocolError(f"extFields value of type {type(v).__name__} is not a scalar")


def _int_field(obj: dict, key: str, default: int | None = None) -> int:
    v = obj.get(key, default)
    if v is None:
        raise RemoteProtocolError(f"JSON header has no {key!r}")
    if (isinstance(v, bool) or not isinstance(v, (int, str, float))
            or (isinstance(v, float) and not v.is_integer())):
        raise RemoteProtocolError(f"JSON header {key!r} is not an integer: {v!r}")
    try:
        n = int(v)
    except ValueError:
        raise RemoteProtocolError(f"JSON header {key!r} is not an integer: {v!r}") from None
    if not -2**31 <= n < 2**31:
        raise RemoteProtocolError(f"JSON header {key!r}={n} is out of the int32 range")
    return n


_STR_ONLY = {str}
_join = "".join
_I32_MIN, _I32_END = -2**31, 2**31
_I32_RANGE = range(_I32_MIN, _I32_END)


def _header_int(obj: dict, key: str, default: int | None = None) -> int:
    v = obj.get(key, default)
    if type(v) is int and v in _I32_RANGE:     # what every client sends: skip the checks
        return v
    return _int_field(obj, key, default)


def decode_json_header(raw) -> RemotingCommand:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise RemoteProtocolError(f"header is not JSON: {e}") from None
    if type(obj) is not dict:
        raise RemoteProtocolError("JSON header is not an object")
    get = obj.get
    ext = get("extFields") or {}
    if type(ext) is not dict:
        raise RemoteProtocolError("JSON header extFields is not an object")
    if ext:
        try:        # Java and Go send strings only: a join is the cheapest proof of it
            _join(ext.values())
        except TypeError:
            ext = {k: s for k, v in ext.items() if (s := _ext_value(v)) is not None}
    code, opaque, flag, version = get("code"), get("opaque", 0), get("flag", 0), get("version", 0)
    # what every client sends, checked inline (a call per field costs a request ~1 µs)
    if not (type(code) is type(opaque) is type(flag) is type(version) is int
            and _I32_MIN <= code < _I32_END and _I32_MIN <= opaque < _I32_END
            and _I32_MIN <= flag < _I32_END and _I32_MIN <= version < _I32_END):
        code, opaque = _header_int(obj, "code"), _header_int(obj, "opaque", 0)
        flag, version = _header_int(obj, "flag", 0), _header_int(obj, "version", 0)
    language = get("language", "JAVA")
    if type(language) is not str:
        language = LANGUAGE_NAMES.get(language, "OTHER") if type(language) is int else "OTHER"
    remark = get("remark")
    if remark is not None and type(remark) is not str:
        remark = str(remark)
    return RemotingCommand(code, opaque, flag, remark, ext, b"", language, version, JSON)


def decode_binary_header(raw) -> RemotingCommand:
    mv = memoryview(raw)
    n = len(mv)
    try:
        code, lang, version, opaque, flag, rlen = _BIN_FIXED.unpack_from(mv, 0)
        pos = _BIN_FIXED.size
        if rlen < 0 or pos + rlen > n:
            raise RemoteProtocolError("ROCKETMQ header: remark length out of bounds")
        remark = bytes(mv[pos:pos + rlen]).decode("utf-8", "replace") if rlen else None
        pos += rlen
        (elen,) = _I32.unpack_from(mv, pos)
        pos += 4
        if elen < 0 or pos + elen > n:
            raise RemoteProtocolError("ROCKETMQ header: extFields length out of bounds")
        end = pos + elen
        ext = {}
        while pos < end:
            (klen,) = _I16.unpack_from(mv, pos)
            pos += 2
            if klen < 0 or pos + klen > end:
                raise RemoteProtocolError("ROCKETMQ header: key length out of bounds")
            key = bytes(mv[pos:pos + klen]).decode("utf-8", "replace")
            pos += klen
            (vlen,) = _I32.unpack_from(mv, pos)
            pos += 4
            if vlen < 0 or pos + vlen > end:
                raise RemoteProtocolError("ROCKETMQ header: value length out of bounds")
            if klen and vlen:   # Java reads empty strings as null and drops them
                ext[key] = bytes(mv[pos:pos + vlen]).decode("utf-8", "replace")
            pos += vlen
    except struct.error:
        raise RemoteProtocolError("ROCKETMQ header is truncated") from None
    return RemotingCommand(code=code, opaque=opaque, flag=flag, remark=remark, ext=ext,
                           language=LANGUAGE_NAMES.get(lang, "OTHER"), version=version,
                           serialize_type=ROCKETMQ)


class FrameDecoder:
    """Reassembles frames from a byte stream, one connection's worth.

    Holds at most one incomplete frame (capped at ``frame_bytes_max``); once
    it has raised RemoteProtocolError it raises again on every call, because
    the stream has lost its framing."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX):
        self.frame_bytes_max = frame_bytes_max
        self._buf = bytearray()
        self._pos = 0
        self._error: RemoteProtocolError | None = None

    def receive_data(self, data) -> None:
        if self._error is not None:
            raise self._error
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos

    def pending(self) -> tuple[bytearray, int]:
        """(the buffer, where its unread bytes begin), for a reader that
        takes whole frames itself (the worker's send lane); ``skip_to``
        then says where the frames it took end."""
        if self._error is not None:
            raise self._error
        return self._buf, self._pos

    def frames_held(self, n: int) -> bool:
        """Whether at least ``n`` whole frames are buffered (by their length
        fields alone: nothing is decoded)."""
        buf, pos, end = self._buf, self._pos, len(self._buf)
        for _ in range(n):
            if end - pos < 4:
                return False
            total = _I32.unpack_from(buf, pos)[0]
            if total < 4:             # not a frame: next_command says so
                return False
            pos += 4 + total
            if pos > end:
                return False
        return True

    def skip_to(self, pos: int) -> None:
        """The frames before ``pos`` are read (by ``next_command``, or by
        another reader: ``pending``); the buffer drops them once they are
        over 1 MiB and more than half of it."""
        self._pos = pos
        if pos > (1 << 20) and pos * 2 > len(self._buf):
            del self._buf[:pos]
            self._pos = 0

    def next_if(self, head: bytes) -> RemotingCommand | None:
        """The next command, as ``next_command`` gives it, when its frame is
        whole, in JSON, and its header begins with ``head`` (``{"code":11,``:
        the worker's pull lane); else None, and the frame is left for
        ``next_command`` (which raises what is wrong with it)."""
        buf, pos = self._buf, self._pos
        if (self._error is not None or len(buf) - pos < 8 or buf[pos + 4] != JSON
                or not buf.startswith(head, pos + 8)):
            return None
        try:
            return self._next()
        except RemoteProtocolError:          # (nothing read: _next moves on only once decoded)
            return None

    def next_command(self) -> RemotingCommand | None:
        if self._error is not None:
            raise self._error
        try:
            return self._next()
        except RemoteProtocolError as e:
            self._error = e
            raise

    def _next(self) -> RemotingCommand | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return None
        (total,) = _I32.unpack_from(buf, pos)
        if total < 4:
            raise RemoteProtocolError(f"frame length {total} is shorter than its header length field")
        if total > self.frame_bytes_max:
            raise RemoteProtocolError(f"frame length {total} exceeds the {self.frame_bytes_max}-byte limit")
        if len(buf) - pos < 4 + total:
            return None
        (type_hlen,) = _I32.unpack_from(buf, pos + 4)
        stype = (type_hlen >> 24) & 0xFF
        hlen = type_hlen & 0xFFFFFF
        if hlen > total - 4:
            raise RemoteProtocolError(f"header length {hlen} exceeds the frame ({total} bytes)")
        start, end = pos + 8, pos + 4 + total
        with memoryview(buf) as mv:           # the header decoded where it lies; the body one copy
            header = mv[start:start + hlen]
            try:
                if stype == JSON:
                    cmd = decode_json_header(header)
                elif stype == ROCKETMQ:
                    cmd = decode_binary_header(header)
                else:
                    raise RemoteProtocolError(f"unknown serialize type {stype}")
            finally:
                header.release()              # (an error's traceback must not pin the buffer)
            cmd.body = bytes(mv[start + hlen:end])
        self.skip_to(end)
        return cmd


def decode_all(frames) -> list[RemotingCommand]:
    """Every command in ``frames``: whole frames back to back (a reply the
    send lane wrote for a chunk, say)."""
    dec = FrameDecoder()
    dec.receive_data(frames)
    out = []
    while (cmd := dec.next_command()) is not None:
        out.append(cmd)
    return out


# ------------------------------------------------------------------ encoding
def encode_header(cmd: RemotingCommand) -> bytes:
    if cmd.serialize_type == JSON:
        obj = {"code": cmd.code, "language": cmd.language, "version": cmd.version,
               "opaque": cmd.opaque, "flag": cmd.flag, "serializeTypeCurrentRPC": "JSON"}
        if cmd.remark is not None:
            obj["remark"] = cmd.remark
        ext = cmd.ext
        if ext:
            obj["extFields"] = ext if set(map(type, ext.values())) == _STR_ONLY else {
                k: str(v) for k, v in ext.items()}
        return orjson.dumps(obj)
    if cmd.serialize_type == ROCKETMQ:
        if not -2**15 <= cmd.code < 2**15 or not -2**15 <= cmd.version < 2**15:
            raise LocalProtocolError(f"code {cmd.code} / version {cmd.version} do not fit the "
                                     f"ROCKETMQ header's int16")
        remark = (cmd.remark or "").encode()
        parts = [_BIN_FIXED.pack(cmd.code, LANGUAGES.get(cmd.language, LANGUAGES["OTHER"]),
                                 cmd.version, cmd.opaque, cmd.flag, len(remark)), remark]
        ext = bytearray()
        for k, v in cmd.ext.items():
            kb, vb = str(k).encode(), str(v).encode()
            if len(kb) >= 2**15:
                raise LocalProtocolError(f"extFields key of {len(kb)} bytes does not fit an int16")
            ext += _I16.pack(len(kb)) + kb + _I32.pack(len(vb)) + vb
        parts += [_I32.pack(len(ext)), bytes(ext)]
        return b"".join(parts)
    raise LocalProtocolError(f"unknown serialize type {cmd.serialize_type}")


def encode_head(cmd: RemotingCommand, body_bytes: int, frame_bytes_max: int = FRAME_BYTES_MAX) -> bytes:
    """The frame up to the body: length fields and header. The caller sends
    ``body_bytes`` of body after it (from memory, a mapping or a file)."""
    header = encode_header(cmd)
    if len(header) > 0xFFFFFF:
        raise LocalProtocolError(f"header of {len(header)} bytes exceeds 16 MiB - 1")
    total = 4 + len(header) + body_bytes
    if total > frame_bytes_max:
        raise LocalProtocolError(f"frame of {total} bytes exceeds the {frame_bytes_max}-byte limit")
    return _PREFIX.pack(total, (cmd.serialize_type << 24) | len(header)) + header


def decode_head(head: bytes) -> RemotingCommand:
    """The command a frame's head (``encode_head``'s, or a template's) carries,
    without its body: for logs and tests that look at a reply made as bytes."""
    _total, type_hlen = _PREFIX.unpack_from(head)
    header = head[_PREFIX.size:_PREFIX.size + (type_hlen & 0xFFFFFF)]
    if type_hlen >> 24 == JSON:
        return decode_json_header(header)
    return decode_binary_header(header)


def encode(cmd: RemotingCommand, frame_bytes_max: int = FRAME_BYTES_MAX) -> bytes:
    """The whole frame, body included."""
    return encode_head(cmd, len(cmd.body), frame_bytes_max) + bytes(cmd.body)


# A SEND's SUCCESS reply, the one reply per message of the commonest request:
# the bytes ``encode_head(request.reply(SUCCESS, ext=...), 0)`` gives, from a
# template (one ``%`` format, no RemotingCommand, dict or JSON encoder).
_SEND_OK_EXT_TAIL = (("MSG_REGION", "DefaultRegion"), ("TRACE_ON", "true"))
_SEND_OK_JSON = (b'{"code":0,"language":"JAVA","version":%d,"opaque":%%d,"flag":%d,'
                 b'"serializeTypeCurrentRPC":"JSON","extFields":{"msgId":"%%s",'
                 b'"queueId":"%%d","queueOffset":"%%d"' % (VERSION_4_9_7, FLAG_RESPONSE)
                 + b"".join(b',"%s":"%s"' % (k.encode(), v.encode()) for k, v in _SEND_OK_EXT_TAIL)
                 + b"}}")
_SEND_OK_BIN_TAIL = b"".join(_I16.pack(len(k)) + k.encode() + _I32.pack(len(v)) + v.encode()
                             for k, v in _SEND_OK_EXT_TAIL)


def send_ok_pieces() -> list[bytes]:
    """The JSON SUCCESS reply's header cut at its four fields (opaque,
    msgId, queueId, queueOffset): for a writer of many at once (the
    worker's send lane) that must write the bytes ``send_ok_head`` does."""
    return re.split(rb"%[ds]", _SEND_OK_JSON)


def send_ok_head(serialize_type: int, opaque: int, msg_id: str, queue_id: int,
                 queue_offset: int) -> bytes:
    """The whole frame of a SEND's SUCCESS reply (msgId, queueId,
    queueOffset, MSG_REGION, TRACE_ON; no body) in the request's
    serialization."""
    if serialize_type == JSON:
        header = _SEND_OK_JSON % (opaque, msg_id.encode(), queue_id, queue_offset)
    else:
        m, q, o = msg_id.encode(), b"%d" % queue_id, b"%d" % queue_offset
        ext = b"".join((b"\x00\x05msgId", _I32.pack(len(m)), m, b"\x00\x07queueId",
                        _I32.pack(len(q)), q, b"\x00\x0bqueueOffset", _I32.pack(len(o)), o,
                        _SEND_OK_BIN_TAIL))
        header = b"".join((_BIN_FIXED.pack(0, LANGUAGES["JAVA"], VERSION_4_9_7, opaque,
                                           FLAG_RESPONSE, 0), _I32.pack(len(ext)), ext))
    return _PREFIX.pack(4 + len(header), (serialize_type << 24) | len(header)) + header


# A PULL_MESSAGE reply's head, the one reply per pull (of up to 32 records):
# the bytes ``encode_head(request.reply(code, remark, ext), body_bytes)``
# gives for PullMessageResponseHeader's four fields, from a template as a
# SEND's SUCCESS has. ``remark`` is a GetMessageStatus name (ASCII letters
# and underscores: nothing to escape in JSON).
_PULL_JSON = (b'{"code":%%d,"language":"JAVA","version":%d,"opaque":%%d,"flag":%d,'
              b'"serializeTypeCurrentRPC":"JSON","remark":"%%s","extFields":{'
              b'"suggestWhichBrokerId":"%%d","nextBeginOffset":"%%d","minOffset":"%%d",'
              b'"maxOffset":"%%d"}}' % (VERSION_4_9_7, FLAG_RESPONSE))
_PULL_BIN = struct.Struct(">iihbhiii")     # frame length, type|header length, then _BIN_FIXED


def pull_reply_head(serialize_type: int, opaque: int, code: int, remark: bytes, suggest: int,
                    next_offset: int, min_offset: int, max_offset: int, body_bytes: int) -> bytes:
    """The frame up to the body of a PULL_MESSAGE reply (suggestWhichBrokerId,
    nextBeginOffset, minOffset, maxOffset) in ``serialize_type``, for
    ``body_bytes`` of records after it."""
    if serialize_type == JSON:
        header = _PULL_JSON % (code, opaque, remark, suggest, next_offset, min_offset, max_offset)
        total = 4 + len(header) + body_bytes
        if total > FRAME_BYTES_MAX:
            raise LocalProtocolError(f"frame of {total} bytes exceeds the {FRAME_BYTES_MAX}-byte limit")
        return _PREFIX.pack(total, len(header)) + header
    s, n, lo, hi = b"%d" % suggest, b"%d" % next_offset, b"%d" % min_offset, b"%d" % max_offset
    ext = b"".join((b"\x00\x14suggestWhichBrokerId", _I32.pack(len(s)), s,
                    b"\x00\x0fnextBeginOffset", _I32.pack(len(n)), n,
                    b"\x00\x09minOffset", _I32.pack(len(lo)), lo,
                    b"\x00\x09maxOffset", _I32.pack(len(hi)), hi))
    hlen = _BIN_FIXED.size + len(remark) + 4 + len(ext)
    total = 4 + hlen + body_bytes
    if total > FRAME_BYTES_MAX:
        raise LocalProtocolError(f"frame of {total} bytes exceeds the {FRAME_BYTES_MAX}-byte limit")
    return b"".join((_PULL_BIN.pack(total, (ROCKETMQ << 24) | hlen, code, LANGUAGES["JAVA"],
                                    VERSION_4_9_7, opaque, FLAG_RESPONSE, len(remark)),
                     remark, _I32.pack(len(ext)), ext))
