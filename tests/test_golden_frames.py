"""Request frames captured from UNCHANGED real RocketMQ 4.x clients, decoded
with the broker's codec, asserting what the broker relies on.

Captured 2026-11-22 on loopback by running each client against a throwaway
listener (not part of the repo) that answered route, heartbeat, send, pull and
offset requests plausibly, so that the clients went on to send everything:

* ``cpp-1.2-*``: the C++ core in PyPI ``rocketmq==0.4.4`` (tests/compat/cpp_client.py);
* ``ons-3.12-*``: the pure-JS ``ali-ons@3.12.0`` (tests/compat/ons_client.js).

Topic ``GoldenTopic``, producer group ``GoldenPG``, consumer group ``GoldenCG``.

What these frames show that a broker must handle (beyond reference §1.2):

* C++ 0.4.4 sends SEND_MESSAGE (code 10, V1 key names), never V2, also for
  batches: the batch is flagged by ``"batch": "1"`` (not ``"true"``) and
  ``unitMode`` is ``"0"``. Java's ``Boolean.parseBoolean`` would read "1" as
  false; a broker must take "1" as true to split the batch body.
* Neither client sets the oneway flag bit: C++ ``send_oneway`` and both
  clients' UPDATE_CONSUMER_OFFSET go out with flag 0 and expect (or ignore) a reply.
* C++ heartbeats carry ``consumeType``/``messageModel``/``consumeFromWhere``
  as enum ORDINALS (1, 1, 0), ``subVersion`` as a string, and ``codeSet`` all
  zeros: tag codes must be recomputed from ``tagsSet``. ali-ons sends enum
  names and real Java hash codes.
* ali-ons commits offset -1 for a queue it never consumed (``commitOffset: -1``).
* C++ CONSUMER_SEND_MSG_BACK (36) carries only group, offset (commit-log
  offset) and delayLevel: no originMsgId/originTopic/maxReconsumeTimes.
* C++ JSON headers and JSON bodies end in a newline; C++ always adds
  ``AccessKey``/``OnsChannel``/``Signature``; ali-ons has no ``remark`` key,
  language ``JAVA`` and version 121.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from shmq.ipc.headers import PULL_HEADER, SEND_HEADER, V2_KEYS, pull_ext, send_ext, send_header
from shmq.ipc.remoting import JSON, FrameDecoder, RemotingCommand

GOLDEN = Path(__file__).parent / "golden"
MAGIC_BATCH_ITEM = 0          # batch items carry magic 0; the broker stamps its own (§5.5)


def decode(name: str) -> RemotingCommand:
    """Decode one golden frame, whole and byte by byte; both must agree and
    consume the file exactly."""
    data = (GOLDEN / name).read_bytes()
    cmds = []
    for chunks in ([data], [data[i:i + 1] for i in range(len(data))]):
        d = FrameDecoder()
        for c in chunks:
            d.receive_data(c)
        cmd = d.next_command()
        assert cmd is not None, name
        assert d.next_command() is None and d.buffered_bytes == 0
        cmds.append(cmd)
    a, b = cmds
    assert (a.code, a.opaque, a.flag, a.ext, bytes(a.body)) == (b.code, b.opaque, b.flag, b.ext, bytes(b.body))
    assert a.serialize_type == JSON
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in a.ext.items()), a.ext
    return a


def raw_header(name: str) -> dict:
    """The JSON header as the client wrote it (to check value types on the wire)."""
    data = (GOLDEN / name).read_bytes()
    total, type_hlen = struct.unpack(">ii", data[:8])
    assert total == len(data) - 4 and type_hlen >> 24 == 0
    return json.loads(data[8:8 + (type_hlen & 0xFFFFFF)])


def props(s: str) -> dict[str, str]:
    out = {}
    for seg in s.split("\x02"):
        if "\x01" in seg:
            k, v = seg.split("\x01", 1)
            out[k] = v
    return out


# ------------------------------------------------------------------ C++ core (rocketmq==0.4.4)
def cpp(name: str, code: int) -> RemotingCommand:
    cmd = decode(f"cpp-1.2-{name}.bin")
    assert (cmd.code, cmd.language, cmd.version, cmd.flag, cmd.remark) == (code, "CPP", 63, 0, "")
    assert cmd.ext["AccessKey"] == "" and cmd.ext["OnsChannel"] == "ALIYUN" and cmd.ext["Signature"]
    assert not cmd.is_oneway and not cmd.is_response
    return cmd


@pytest.mark.parametrize("name", ["send", "send-oneway", "send-batch"])
def test_cpp_send_is_v1_code_10_with_string_and_number_values(name):
    cmd = cpp(name, 10)      # SEND_MESSAGE, never SEND_MESSAGE_V2 (310) or SEND_BATCH_MESSAGE (320)
    e = cmd.ext
    assert (e["producerGroup"], e["topic"], e["defaultTopic"], e["defaultTopicQueueNums"]) == \
        ("GoldenPG", "GoldenTopic", "TBW102", "4")
    assert (e["sysFlag"], e["flag"], e["reconsumeTimes"], e["unitMode"]) == ("0", "0", "0", "0")
    assert e["queueId"] in {"0", "1", "2", "3"} and int(e["bornTimestamp"]) > 1_600_000_000_000
    raw = raw_header(f"cpp-1.2-{name}.bin")["extFields"]
    # numbers on the wire for some keys, strings for others
    assert isinstance(raw["queueId"], int) and isinstance(raw["sysFlag"], int)
    assert isinstance(raw["bornTimestamp"], str) and isinstance(raw["batch"], str)
    assert (GOLDEN / f"cpp-1.2-{name}.bin").read_bytes().find(b"}\n") > 0   # jsoncpp's trailing newline


def test_cpp_send_sync_carries_tags_keys_and_uniq_key():
    cmd = cpp("send", 10)
    assert cmd.ext["batch"] == "0"
    p = props(cmd.ext["properties"])
    assert p["TAGS"] == "TagA" and p["KEYS"] == "key-1 key-2" and p["WAIT"] == "true"
    assert len(p["UNIQ_KEY"]) == 32
    assert cmd.ext["properties"].endswith("\x02")          # trailing separator, unlike Java
    assert cmd.body == b"golden-body-1"


def test_cpp_oneway_send_has_no_oneway_bit():
    cmd = cpp("send-oneway", 10)
    assert cmd.flag == 0 and cmd.ext["batch"] == "0"
    assert props(cmd.ext["properties"])["TAGS"] == "TagB" and cmd.body == b"golden-oneway"


def test_cpp_batch_is_code_10_with_batch_1_and_a_batch_body():
    cmd = cpp("send-batch", 10)
    assert cmd.ext["batch"] == "1"                             # "1", not "true"
    assert props(cmd.ext["properties"]) == {"WAIT": "true"}
    # body: items of int32 total | int32 magic | int32 bodyCRC | int32 flag |
    # int32 bodyLen | body | int16 propsLen | props (reference §5.5)
    body, pos, items = bytes(cmd.body), 0, []
    while pos < len(body):
        total, magic, crc, flag, blen = struct.unpack_from(">iiiii", body, pos)
        b = body[pos + 20:pos + 20 + blen]
        (plen,) = struct.unpack_from(">h", body, pos + 20 + blen)
        p = body[pos + 22 + blen:pos + 22 + blen + plen].decode()
        assert total == 22 + blen + plen and magic == MAGIC_BATCH_ITEM and flag == 0
        items.append((b, props(p)))
        pos += total
    assert pos == len(body)
    assert [(b, p["TAGS"], p["KEYS"]) for b, p in items] == [(b"b1", "TagC", "kb1"), (b"b2", "TagC", "kb2")]
    assert all(len(p["UNIQ_KEY"]) == 32 for _, p in items)


def test_cpp_heartbeat_uses_enum_ordinals_and_zero_tag_codes():
    cmd = cpp("heartbeat", 34)
    assert set(cmd.ext) == {"AccessKey", "OnsChannel", "Signature"}
    hb = json.loads(cmd.body)
    assert cmd.body.endswith(b"\n")
    assert hb["clientID"].endswith("-127.0.0.1@DEFAULT")          # pid-ip@instance
    assert "producerDataSet" not in hb
    [cd] = hb["consumerDataSet"]
    assert cd["groupName"] == "GoldenCG"
    # ordinals: CONSUME_PASSIVELY, CLUSTERING, CONSUME_FROM_LAST_OFFSET
    assert (cd["consumeType"], cd["messageModel"], cd["consumeFromWhere"]) == (1, 1, 0)
    subs = {s["topic"]: s for s in cd["subscriptionDataSet"]}
    assert set(subs) == {"GoldenTopic", "%RETRY%GoldenCG"}
    s = subs["GoldenTopic"]
    assert s["subString"] == "TagA || TagB || TagC || TagO"
    assert s["tagsSet"] == ["TagA", "TagB", "TagC", "TagO"]
    assert s["codeSet"] == [0, 0, 0, 0]                           # recompute from tagsSet
    assert isinstance(s["subVersion"], str) and int(s["subVersion"]) > 0
    assert subs["%RETRY%GoldenCG"]["subString"] == "*" and "tagsSet" not in subs["%RETRY%GoldenCG"]


def test_cpp_pull():
    cmd = cpp("pull", 11)
    e = cmd.ext
    assert (e["consumerGroup"], e["topic"], e["queueId"], e["queueOffset"]) == ("GoldenCG", "GoldenTopic", "0", "0")
    assert (e["maxMsgNums"], e["sysFlag"], e["commitOffset"], e["suspendTimeoutMillis"]) == ("32", "6", "0", "15000")
    assert e["subscription"] == "TagA || TagB || TagC || TagO" and int(e["subVersion"]) > 0
    assert "expressionType" not in e
    assert cmd.body == b""


def test_cpp_query_and_update_consumer_offset():
    q = cpp("query-offset", 14)
    assert (q.ext["consumerGroup"], q.ext["topic"], q.ext["queueId"]) == ("GoldenCG", "GoldenTopic", "0")
    u = cpp("update-offset", 15)       # flag 0: the C++ core waits for a reply
    assert (u.ext["consumerGroup"], u.ext["topic"], u.ext["queueId"], u.ext["commitOffset"]) == \
        ("GoldenCG", "GoldenTopic", "0", "1")


def test_cpp_orderly_consumer_locks_queues_with_a_json_body():
    cmd = cpp("lock-batch-mq", 41)
    body = json.loads(cmd.body)
    assert body["consumerGroup"] == "GoldenOrderCG" and body["clientId"].endswith("@DEFAULT")
    assert body["mqSet"] == [{"brokerName": "broker-a", "queueId": 0, "topic": "%RETRY%GoldenOrderCG"}]


def test_cpp_send_back_names_only_the_physical_offset():
    """RECONSUME_LATER: CONSUMER_SEND_MSG_BACK with no originMsgId, originTopic
    or maxReconsumeTimes; the broker finds the message by its commit-log offset."""
    cmd = cpp("consumer-send-msg-back", 36)
    assert {k: v for k, v in cmd.ext.items() if k not in ("AccessKey", "OnsChannel", "Signature")} == \
        {"group": "GoldenCG", "offset": "0", "delayLevel": "0"}
    raw = raw_header("cpp-1.2-consumer-send-msg-back.bin")["extFields"]
    assert isinstance(raw["delayLevel"], int) and isinstance(raw["offset"], str)


def test_cpp_unregister_client():
    cmd = cpp("unregister-client", 35)
    assert cmd.ext["clientID"].endswith("@DEFAULT")
    assert (cmd.ext["consumerGroup"], cmd.ext["producerGroup"]) == ("GoldenCG", "")


# ------------------------------------------------------------------ ali-ons 3.12.0
def ons(name: str, code: int) -> RemotingCommand:
    cmd = decode(f"ons-3.12-{name}.bin")
    assert (cmd.code, cmd.language, cmd.version, cmd.flag, cmd.remark) == (code, "JAVA", 121, 0, None)
    assert "remark" not in raw_header(f"ons-3.12-{name}.bin")
    assert not cmd.is_oneway and not cmd.is_response
    return cmd


def test_ons_get_routeinfo():
    cmd = ons("get-routeinfo", 105)
    assert cmd.ext == {"topic": "GoldenTopic"} and cmd.body == b""


def test_ons_send_v2_with_tags_and_keys():
    cmd = ons("send-v2", 310)
    e = cmd.ext
    assert set(e) == set("abcdefghijk")
    assert (e["a"], e["b"], e["c"], e["d"], e["f"], e["h"], e["j"], e["k"]) == \
        ("GoldenPG", "GoldenTopic", "TBW102", "4", "0", "0", "0", "false")
    assert e["e"] in {"0", "1", "2", "3"} and int(e["g"]) > 1_600_000_000_000
    raw = raw_header("ons-3.12-send-v2.bin")["extFields"]
    assert isinstance(raw["e"], int) and isinstance(raw["g"], int) and raw["k"] is False
    p = props(e["i"])
    assert p == {"TAGS": "TagA", "KEYS": "key-1 key-2"}                 # no UNIQ_KEY, no WAIT
    assert e["i"].endswith("\x02")
    assert cmd.body == b"golden-body-1"


def test_ons_send_with_sharding_key_property():
    cmd = ons("send-v2-sharding-key", 310)
    assert props(cmd.ext["i"]) == {"TAGS": "TagO", "KEYS": "ko", "__SHARDING_KEY": "order-7"}
    assert cmd.body == b"ord"


def test_ons_heartbeat_uses_enum_names_and_java_hash_codes():
    cmd = ons("heartbeat", 34)
    assert cmd.ext == {}
    hb = json.loads(cmd.body)
    assert "@" in hb["clientID"] and hb["producerDataSet"] == []
    [cd] = hb["consumerDataSet"]
    assert (cd["groupName"], cd["consumeType"], cd["messageModel"], cd["consumeFromWhere"], cd["unitMode"]) == \
        ("GoldenCG", "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET", False)
    [s] = cd["subscriptionDataSet"]
    assert (s["topic"], s["subString"], s["tagsSet"], s["classFilterMode"]) == \
        ("GoldenTopic", "TagA || TagO", ["TagA", "TagO"], False)

    def java_hash(t: str) -> int:
        h = 0
        for ch in t:
            h = (31 * h + ord(ch)) & 0xFFFFFFFF
        return h - (1 << 32) if h >= 1 << 31 else h
    assert s["codeSet"] == [java_hash("TagA"), java_hash("TagO")]
    assert isinstance(s["subVersion"], int) and "expressionType" not in s


def test_ons_pull():
    cmd = ons("pull", 11)
    assert cmd.ext == {"consumerGroup": "GoldenCG", "topic": "GoldenTopic", "queueId": "0", "queueOffset": "0",
                       "maxMsgNums": "32", "sysFlag": "6", "commitOffset": "0", "suspendTimeoutMillis": "15000",
                       "subscription": "TagA || TagO", "subVersion": cmd.ext["subVersion"]}
    assert int(cmd.ext["subVersion"]) > 0 and cmd.body == b""


def test_ons_query_offset():
    cmd = ons("query-offset", 14)
    assert cmd.ext == {"topic": "GoldenTopic", "consumerGroup": "GoldenCG", "queueId": "0"}


def test_ons_update_offset_is_sent_without_the_oneway_bit():
    cmd = ons("update-offset", 15)
    assert cmd.ext == {"topic": "GoldenTopic", "consumerGroup": "GoldenCG", "queueId": "2", "commitOffset": "1"}


def test_ons_commits_minus_one_for_an_unconsumed_queue():
    cmd = ons("update-offset-minus-one", 15)
    assert cmd.ext == {"topic": "GoldenTopic", "consumerGroup": "GoldenCG", "queueId": "0", "commitOffset": "-1"}


def test_ons_send_back():
    """ACTION_RETRY: CONSUMER_SEND_MSG_BACK with delay level 0 (broker's choice);
    if it fails, ali-ons sends a copy to %RETRY%<group> itself."""
    cmd = ons("consumer-send-msg-back", 36)
    assert cmd.ext == {"offset": "0", "group": "GoldenCG", "delayLevel": "0",
                       "originMsgId": "7F00000100004DA70000000000000000", "originTopic": "GoldenTopic",
                       "unitMode": "false", "maxReconsumeTimes": "16"}


def test_ons_unregister_client():
    cmd = ons("unregister-client", 35)
    assert set(cmd.ext) == {"clientID", "consumerGroup"} and cmd.ext["consumerGroup"] == "GoldenCG"


# ------------------------------------------------------------------ the header schemas (ipc/headers.py)
CPP_SIGNING = {"AccessKey", "OnsChannel", "Signature"}


@pytest.mark.parametrize("name", ["cpp-1.2-send", "cpp-1.2-send-oneway", "cpp-1.2-send-batch",
                                  "ons-3.12-send-v2", "ons-3.12-send-v2-sharding-key"])
def test_every_send_header_field_is_in_the_send_schema_and_reads_by_its_v1_name(name):
    cmd = decode(f"{name}.bin")
    keys = set(cmd.ext) - CPP_SIGNING
    if cmd.code == 10:
        assert keys <= {f.name for f in SEND_HEADER}
    else:
        assert keys <= set(V2_KEYS)
    h = send_header(cmd.code, cmd.ext)
    assert (h.str("topic"), h.str("producerGroup"), h.int("defaultTopicQueueNums")) == ("GoldenTopic", "GoldenPG", 4)
    assert h.bool("batch") == (name == "cpp-1.2-send-batch")
    required = {f.name for f in SEND_HEADER if f.required}
    assert required <= {V2_KEYS.get(k, k) for k in cmd.ext}


@pytest.mark.parametrize("name", ["cpp-1.2-pull", "ons-3.12-pull"])
def test_every_pull_header_field_is_in_the_pull_schema(name):
    cmd = decode(f"{name}.bin")
    assert set(cmd.ext) - CPP_SIGNING <= {f.name for f in PULL_HEADER}
    assert {f.name for f in PULL_HEADER if f.required} <= set(cmd.ext)
    # the builders write what the clients wrote
    mine = pull_ext(**{k: v for k, v in cmd.ext.items() if k not in CPP_SIGNING})
    assert mine == {k: v for k, v in cmd.ext.items() if k not in CPP_SIGNING}


def test_the_send_builder_writes_ali_ons_v2_keys():
    cmd = decode("ons-3.12-send-v2.bin")
    values = {V2_KEYS[k]: v for k, v in cmd.ext.items()}
    assert send_ext(**values) == cmd.ext
    assert send_ext(v2=False, **values) == values
