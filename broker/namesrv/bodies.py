"""The NameServer's request and reply bodies: RegisterBrokerBody both ways.

``decode_register_body`` reads what a broker registers (fastjson JSON, with
fastjson's unquoted numeric map keys, or Java's compressed form: a zlib
stream of int32-length-prefixed DataVersion JSON, a topic count, "name read
write perm FILTERTYPE" lines and the filter-server list); anything malformed
is a ``BadRequest`` (SYSTEM_ERROR, RocketMQ's "Failed to decode …" remark),
never an exception out of the NameServer. ``register_broker_request`` and
``unregister_broker_request`` build the requests a broker sends (shmq's
services process uses them; so do the tests, as a Java broker would).
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import orjson

from shmq.ipc.codes import RequestCode, ResponseCode
from shmq.ipc.headers import BadRequest
from shmq.ipc.remoting import RemotingCommand

DEFAULT_PERM = 0x6                         # PERM_READ | PERM_WRITE
DEFAULT_QUEUE_NUMS = 16                    # TopicConfig.defaultRead/WriteQueueNums
INFLATED_BYTES_MAX = 64 * 1024 * 1024      # a compressed register body may not inflate past this
_I32 = struct.Struct(">i")


@dataclass
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self) -> dict:
        return {"brokerName": self.broker_name, "perm": self.perm,
                "readQueueNums": self.read_queue_nums, "topicSysFlag": self.topic_sys_flag,
                "writeQueueNums": self.write_queue_nums}


@dataclass
class RegisterBody:
    topics: dict[str, QueueData] | None    # None: the request had no body (keep the queue data)
    data_version: dict | None
    filter_servers: list[str]


def bad(remark: str) -> BadRequest:
    """A request the NameServer cannot act on: SYSTEM_ERROR with ``remark``."""
    return BadRequest(ResponseCode.SYSTEM_ERROR, remark)


def dumps(obj) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


# ------------------------------------------------------------------ bodies
def quote_bare_keys(text: str) -> str:
    """Quote fastjson's unquoted object keys (``{0:"a",1:"b"}``), leaving
    strings alone; anything else malformed stays malformed."""
    out: list[str] = []
    stack: list[str] = []
    expect_key = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
            expect_key = False
            continue
        if c in "{[":
            stack.append(c)
            expect_key = c == "{"
        elif c in "}]":
            if stack:
                stack.pop()
            expect_key = False
        elif c == ",":
            expect_key = bool(stack) and stack[-1] == "{"
        elif c == ":":
            expect_key = False
        elif expect_key and not c.isspace():
            j = i
            while j < n and text[j] not in ':,{}[]"' and not text[j].isspace():
                j += 1
            out.append(f'"{text[i:j]}"')
            i = j
            expect_key = False
            continue
        out.append(c)
        i += 1
    return "".join(out)


def loads(raw: bytes, what: str):
    """JSON as Java tools write it: standard, or fastjson with unquoted keys."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return orjson.loads(quote_bare_keys(raw.decode("utf-8")))
    except (UnicodeDecodeError, orjson.JSONDecodeError) as e:
        raise bad(f"Failed to decode {what}: {e}") from None


def int_of(obj: dict, key: str, default: int, what: str) -> int:
    v = obj.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise bad(f"Failed to decode {what}: {key} is not an integer: {v!r}")
    try:
        n = int(v)
    except ValueError:
        raise bad(f"Failed to decode {what}: {key} is not an integer: {v!r}") from None
    if not -2**63 <= n < 2**63:
        raise bad(f"Failed to decode {what}: {key} is out of the int64 range: {n}")
    return n


def data_version(obj) -> dict:
    if not isinstance(obj, dict):
        raise bad("Failed to decode DataVersion: not an object")
    dv = {"counter": int_of(obj, "counter", 0, "DataVersion"),
          "timestamp": int_of(obj, "timestamp", 0, "DataVersion")}
    if "stateVersion" in obj:                                 # 5.x
        dv["stateVersion"] = int_of(obj, "stateVersion", 0, "DataVersion")
    return dv


def version_key(dv: dict) -> tuple[int, int, int]:
    return dv["timestamp"], dv.get("stateVersion", 0), dv["counter"]


def queue_data(broker_name: str, topic: str, cfg) -> QueueData:
    what = f"RegisterBrokerBody: topic config {topic!r}"
    if not isinstance(cfg, dict):
        raise bad(f"Failed to decode {what}: not an object")
    return QueueData(broker_name=broker_name,
                     read_queue_nums=int_of(cfg, "readQueueNums", DEFAULT_QUEUE_NUMS, what),
                     write_queue_nums=int_of(cfg, "writeQueueNums", DEFAULT_QUEUE_NUMS, what),
                     perm=int_of(cfg, "perm", DEFAULT_PERM, what),
                     topic_sys_flag=int_of(cfg, "topicSysFlag", 0, what))


def decode_register_body(body: bytes, compressed: bool) -> RegisterBody:
    """RegisterBrokerBody: fastjson JSON, or (compressed) Java's zlib stream of
    int32-length-prefixed DataVersion JSON, topic count, "name read write perm
    FILTERTYPE" lines and the filter server list JSON. The queue data it
    returns has an empty broker name; registration fills it in."""
    if compressed:
        return _decode_compressed(body)
    obj = loads(body, "RegisterBrokerBody")
    if not isinstance(obj, dict):
        raise bad("Failed to decode RegisterBrokerBody: not an object")
    wrapper = obj.get("topicConfigSerializeWrapper")
    if wrapper is None and "topicConfigTable" in obj:         # pre-3.0.11 brokers sent the wrapper alone
        wrapper = obj
    wrapper = wrapper or {}
    if not isinstance(wrapper, dict):
        raise bad("Failed to decode RegisterBrokerBody: topicConfigSerializeWrapper is not an object")
    table = wrapper.get("topicConfigTable") or {}
    if not isinstance(table, dict):
        raise bad("Failed to decode RegisterBrokerBody: topicConfigTable is not an object")
    topics = {}
    for key, cfg in table.items():
        name = cfg.get("topicName") if isinstance(cfg, dict) else None
        topics[name if isinstance(name, str) and name else key] = queue_data("", key, cfg)
    dv = wrapper.get("dataVersion")
    filters = obj.get("filterServerList") or []
    if not isinstance(filters, list):
        raise bad("Failed to decode RegisterBrokerBody: filterServerList is not a list")
    return RegisterBody(topics, data_version(dv) if dv is not None else None, [str(f) for f in filters])


def _decode_compressed(body: bytes) -> RegisterBody:
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(body, INFLATED_BYTES_MAX)
    except zlib.error as e:
        raise bad(f"Failed to decode RegisterBrokerBody: {e}") from None
    if inflater.unconsumed_tail:
        raise bad(f"Failed to decode RegisterBrokerBody: inflates past {INFLATED_BYTES_MAX} bytes")
    pos = 0

    def chunk() -> bytes:
        nonlocal pos
        if pos + 4 > len(raw):
            raise bad("Failed to decode RegisterBrokerBody: End of compressed data has reached")
        (size,) = _I32.unpack_from(raw, pos)
        if size < 0 or pos + 4 + size > len(raw):
            raise bad("Failed to decode RegisterBrokerBody: End of compressed data has reached")
        pos += 4 + size
        return raw[pos - size:pos]

    dv = data_version(loads(chunk(), "DataVersion"))
    if pos + 4 > len(raw):
        raise bad("Failed to decode RegisterBrokerBody: End of compressed data has reached")
    (count,) = _I32.unpack_from(raw, pos)
    pos += 4
    topics = {}
    for _ in range(max(count, 0)):
        line = chunk().decode("utf-8", "replace")
        parts = line.split(" ", 5)
        if len(parts) < 5:
            raise bad(f"Failed to decode RegisterBrokerBody: bad topic config {line!r}")
        name, read, write, perm = parts[:4]
        topics[name] = queue_data("", name, {"readQueueNums": read, "writeQueueNums": write, "perm": perm})
    filters = loads(chunk(), "filterServerList")     # 5.x appends static-topic mappings: ignored
    if not isinstance(filters, list):
        filters = []
    return RegisterBody(topics, dv, [str(f) for f in filters])


# ------------------------------------------------------------------ requests (the broker side)
def _topic_config(name: str, cfg: dict) -> dict:
    full = {"topicName": name, "readQueueNums": DEFAULT_QUEUE_NUMS, "writeQueueNums": DEFAULT_QUEUE_NUMS,
            "perm": DEFAULT_PERM, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}
    full.update(cfg)
    return full


def encode_register_body(topic_configs: dict[str, dict], data_version: dict,
                         filter_servers: list[str] | None = None, compressed: bool = False) -> bytes:
    """RegisterBrokerBody as a Java broker sends it (``encode(compressed)``)."""
    table = {name: _topic_config(name, cfg) for name, cfg in topic_configs.items()}
    filters = list(filter_servers or [])
    if not compressed:
        return orjson.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": table,
                                                            "dataVersion": data_version},
                             "filterServerList": filters})
    parts = [orjson.dumps(data_version)]
    lines = [f"{c['topicName']} {c['readQueueNums']} {c['writeQueueNums']} {c['perm']} "
             f"{c['topicFilterType']}".encode() for c in table.values()]
    out = bytearray()
    out += _I32.pack(len(parts[0])) + parts[0] + _I32.pack(len(lines))
    for line in lines:
        out += _I32.pack(len(line)) + line
    tail = orjson.dumps(filters)
    out += _I32.pack(len(tail)) + tail
    return zlib.compress(bytes(out), 9)


def register_broker_request(*, cluster: str, broker_name: str, broker_addr: str, broker_id: int,
                            topic_configs: dict[str, dict], data_version: dict, ha_addr: str = "",
                            compressed: bool = False) -> RemotingCommand:
    """REGISTER_BROKER (103) as a broker sends it: header with bodyCrc32, body
    RegisterBrokerBody. ``topic_configs`` maps a topic to TopicConfig fields
    (readQueueNums, writeQueueNums, perm, topicSysFlag, ...; defaults filled in);
    ``data_version`` is ``{"timestamp": ms, "counter": n}``."""
    body = encode_register_body(topic_configs, data_version, compressed=compressed)
    ext = {"brokerName": broker_name, "brokerAddr": broker_addr, "clusterName": cluster,
           "haServerAddr": ha_addr, "brokerId": str(broker_id),
           "compressed": "true" if compressed else "false",
           "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF)}
    return RemotingCommand(code=int(RequestCode.REGISTER_BROKER), ext=ext, body=body)


def unregister_broker_request(*, cluster: str, broker_name: str, broker_addr: str,
                              broker_id: int) -> RemotingCommand:
    """UNREGISTER_BROKER (104), sent by a broker on shutdown."""
    return RemotingCommand(code=int(RequestCode.UNREGISTER_BROKER),
                           ext={"brokerName": broker_name, "brokerAddr": broker_addr,
                                "clusterName": cluster, "brokerId": str(broker_id)})
