"""fastjson's JSON, which RocketMQ's Java side writes and reads.

fastjson writes a ``Map<MessageQueue, V>`` with the MessageQueue objects
themselves as keys (``{{"brokerName":"b","queueId":0,"topic":"T"}:5}``), which
no standard JSON parser accepts (reference: Quirk 2). The broker writes such
maps (reset, topic stats, consume stats) and the client and ``shmq admin``
read them, so both directions live here, in the room both may import.

``parse_fastjson`` reads such text: object keys may be objects (returned as
tuples of sorted items, so they can be dict keys) or bare words.
"""
from __future__ import annotations

import json
import re

import orjson


def mq_key(topic: str, broker: str, qid: int) -> str:
    """A MessageQueue as fastjson writes it, also as a map key."""
    return f'{{"brokerName":{orjson.dumps(broker).decode()},"queueId":{qid},' \
           f'"topic":{orjson.dumps(topic).decode()}}}'


def mq_map(entries) -> str:
    """fastjson's ``Map<MessageQueue, V>`` from ``(topic, brokerName, queueId,
    value)`` entries, each value written as JSON."""
    return "{" + ",".join(f"{mq_key(topic, broker, qid)}:{orjson.dumps(v).decode()}"
                          for topic, broker, qid, v in entries) + "}"


_WS = re.compile(r"\s*")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_WORD = re.compile(r"[A-Za-z_$][\w$]*")
_MAX_DEPTH = 64


def parse_fastjson(text: str):
    """JSON plus fastjson's map keys: numbers, bare words and objects (an
    object key becomes a tuple of its sorted items, so it can key a dict)."""
    value, pos = _value(text, _WS.match(text, 0).end(), 0)
    if _WS.match(text, pos).end() != len(text):
        raise ValueError(f"unexpected text at {pos}")
    return value


def _value(s: str, pos: int, depth: int):
    if depth > _MAX_DEPTH:
        raise ValueError("nested too deeply")
    if pos >= len(s):
        raise ValueError("unexpected end of text")
    ch = s[pos]
    if ch == "{":
        return _object(s, pos + 1, depth + 1)
    if ch == "[":
        return _array(s, pos + 1, depth + 1)
    if ch == '"':
        return _string(s, pos)
    m = _NUMBER.match(s, pos)
    if m:
        t = m.group()
        return (float(t) if any(c in t for c in ".eE") else int(t)), m.end()
    m = _WORD.match(s, pos)
    if m:
        return {"true": True, "false": False, "null": None}.get(m.group(), m.group()), m.end()
    raise ValueError(f"unexpected {ch!r} at {pos}")


def _string(s: str, pos: int) -> tuple[str, int]:
    end = pos + 1
    while True:
        end = s.find('"', end)
        if end < 0:
            raise ValueError(f"unterminated string at {pos}")
        backslashes = len(s[pos + 1:end]) - len(s[pos + 1:end].rstrip("\\"))
        if backslashes % 2 == 0:
            return json.loads(s[pos:end + 1]), end + 1
        end += 1


def _object(s: str, pos: int, depth: int) -> tuple[dict, int]:
    out = {}
    pos = _WS.match(s, pos).end()
    while pos < len(s) and s[pos] != "}":
        key, pos = _value(s, pos, depth)
        if isinstance(key, dict):
            key = tuple(sorted(key.items()))
        elif isinstance(key, list):
            raise ValueError(f"a list cannot be a map key (before {pos})")
        pos = _WS.match(s, pos).end()
        if s[pos:pos + 1] != ":":
            raise ValueError(f"expected ':' at {pos}")
        out[key], pos = _value(s, _WS.match(s, pos + 1).end(), depth)
        pos = _WS.match(s, pos).end()
        if s[pos:pos + 1] == ",":
            pos = _WS.match(s, pos + 1).end()
        elif s[pos:pos + 1] != "}":
            raise ValueError(f"expected ',' or '}}' at {pos}")
    if pos >= len(s):
        raise ValueError("unterminated object")
    return out, pos + 1


def _array(s: str, pos: int, depth: int) -> tuple[list, int]:
    out = []
    pos = _WS.match(s, pos).end()
    while pos < len(s) and s[pos] != "]":
        item, pos = _value(s, pos, depth)
        out.append(item)
        pos = _WS.match(s, pos).end()
        if s[pos:pos + 1] == ",":
            pos = _WS.match(s, pos + 1).end()
        elif s[pos:pos + 1] != "]":
            raise ValueError(f"expected ',' or ']' at {pos}")
    if pos >= len(s):
        raise ValueError("unterminated array")
    return out, pos + 1
