"""Request headers (a command's extFields): the one ``BadRequest``, the typed
reader, and the SEND and PULL header schemas.

RocketMQ 4.x carries a request's arguments as a flat string map, the
"custom header" (reference §3). This module owns what both ends must agree
on about it and nothing else; it never does I/O.

* ``BadRequest(code, remark)``: a request the server refuses by design,
  answered with RocketMQ's response ``code`` and ``remark``. The broker's
  handlers and the NameServer (which always answers SYSTEM_ERROR) raise it;
  a bug raises anything else.
* ``Header``: typed access to extFields; a missing or malformed field is a
  SYSTEM_ERROR naming it, as RocketMQ's header decoding answers.
* ``SEND_HEADER``: SendMessageRequestHeader's fields in V2 order; a
  SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE carries them under one-letter keys
  (``V2_KEYS``: "a" producerGroup … "n" bname), a SEND_MESSAGE (code 10, the
  C++ core's only send) under their names. ``send_header`` reads either.
* ``PULL_HEADER``: PullMessageRequestHeader's fields; the pull ``sysFlag``
  bits (``PULL_COMMIT_OFFSET``, ``PULL_SUSPEND``, ``PULL_SUBSCRIPTION``).
* ``send_ext`` / ``pull_ext``: the extFields a client writes, from keyword
  values, in the schema's order (tests and tools build requests with them).

Values on the wire are strings (the codec turns numbers and booleans a
client wrote as JSON values into their text); booleans are "true"/"false",
and the C++ core sends "1"/"0", so ``Header.bool`` takes both.
"""
from __future__ import annotations

from typing import NamedTuple

from .codes import RequestCode, ResponseCode


class BadRequest(Exception):
    """A request the server refuses: answered with ``code`` and ``remark``."""

    def __init__(self, code: int, remark: str):
        super().__init__(remark)
        self.code, self.remark = code, remark


class Header:
    """Typed access to a request's extFields; a missing or malformed field is
    a SYSTEM_ERROR naming it (what RocketMQ's header decoding answers)."""
    __slots__ = ("ext", "keys")

    def __init__(self, ext: dict[str, str], keys: dict[str, str] | None = None):
        self.ext = ext
        self.keys = keys    # field name → the key it travels under (V2's letters), if not itself

    def get(self, name: str) -> str | None:
        keys = self.keys
        return self.ext.get(name if keys is None else keys.get(name, name))

    def str(self, name: str, default: str | None = None, required: bool = True) -> str | None:
        v = self.get(name)
        if v is None:
            if required and default is None:
                raise BadRequest(ResponseCode.SYSTEM_ERROR, f"the request header has no {name}")
            return default
        return v

    def int(self, name: str, default: int | None = None) -> int:
        v = self.get(name)
        if v is None or v == "":
            if default is None:
                raise BadRequest(ResponseCode.SYSTEM_ERROR, f"the request header has no {name}")
            return default
        try:
            return int(v)
        except ValueError:
            raise BadRequest(ResponseCode.SYSTEM_ERROR,
                             f"the request header's {name}={v!r} is not a number") from None

    def bool(self, name: str, default: bool = False) -> bool:
        v = self.get(name)
        return default if v is None else v.lower() in ("true", "1")   # C++ sends 0/1


class Field(NamedTuple):
    name: str          # RocketMQ's field name (the key a V1 header uses)
    kind: type         # str, int or bool: how the reader takes it
    required: bool     # @CFNotNull in RocketMQ's header class


# SendMessageRequestHeader, in the order of SendMessageRequestHeaderV2's letters
SEND_HEADER = (
    Field("producerGroup", str, True),
    Field("topic", str, True),
    Field("defaultTopic", str, True),
    Field("defaultTopicQueueNums", int, True),
    Field("queueId", int, True),
    Field("sysFlag", int, True),
    Field("bornTimestamp", int, True),
    Field("flag", int, True),
    Field("properties", str, False),
    Field("reconsumeTimes", int, False),
    Field("unitMode", bool, False),
    Field("maxReconsumeTimes", int, False),
    Field("batch", bool, False),
    Field("bname", str, False),           # 5.x brokerName; 4.x brokers ignore it
)
V2_KEYS = {chr(ord("a") + i): f.name for i, f in enumerate(SEND_HEADER)}
V1_KEYS = {name: key for key, name in V2_KEYS.items()}

# PullMessageRequestHeader
PULL_HEADER = (
    Field("consumerGroup", str, True),
    Field("topic", str, True),
    Field("queueId", int, True),
    Field("queueOffset", int, True),
    Field("maxMsgNums", int, True),
    Field("sysFlag", int, True),
    Field("commitOffset", int, True),
    Field("suspendTimeoutMillis", int, True),
    Field("subscription", str, False),
    Field("subVersion", int, True),
    Field("expressionType", str, False),
    Field("bname", str, False),           # 5.x brokerName; 4.x brokers ignore it
)
PULL_COMMIT_OFFSET, PULL_SUSPEND, PULL_SUBSCRIPTION = 0x1, 0x2, 0x4   # PullSysFlag


def send_header(code: int, ext: dict[str, str]) -> Header:
    """The SEND header of any send code under its V1 names: SEND_MESSAGE
    carries them as they are, V2 and batch sends under ``V2_KEYS`` (other
    keys, e.g. the C++ core's AccessKey, pass through). V2 keys are
    translated per lookup rather than by rebuilding the dict: a send reads
    six of its fourteen fields."""
    return Header(ext, None if code == RequestCode.SEND_MESSAGE else V1_KEYS)


def _text(v) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _ext(schema: tuple[Field, ...], values: dict, keys: dict[str, str] | None = None) -> dict[str, str]:
    names = {f.name for f in schema}
    unknown = set(values) - names
    if unknown:
        raise TypeError(f"not header fields: {sorted(unknown)}")
    out = {}
    for f in schema:
        v = values.get(f.name)
        if v is None:
            if f.required:
                raise TypeError(f"the header needs {f.name}")
            continue
        out[keys[f.name] if keys else f.name] = _text(v)
    return out


def send_ext(v2: bool = True, **values) -> dict[str, str]:
    """A SEND header's extFields from its V1 field names (``topic=…``): under
    the V2 letters when ``v2``, else under the names (SEND_MESSAGE)."""
    return _ext(SEND_HEADER, values, V1_KEYS if v2 else None)


def pull_ext(**values) -> dict[str, str]:
    """A PULL_MESSAGE header's extFields from its field names."""
    return _ext(PULL_HEADER, values)
