"""The checkpoint file, the abort marker and the ``config/*.json`` tables.

checkpoint — one 4096-byte page, big-endian int64s (RocketMQ's
``StoreCheckpoint`` for the first five, shmq's own after a magic)::

    off field
      0 physicMsgTimestamp    store time (ms) of the last flushed CommitLog record
      8 logicsMsgTimestamp    same, for the ConsumeQueues
     16 indexMsgTimestamp     same, for the IndexFile
     24 masterFlushedOffset   (RocketMQ 5; written 0)
     32 confirmPhyOffset      (RocketMQ 5; written as the flushed CommitLog offset)
     40 shmq magic            0x73686D71636B7074 ("shmqckpt"): the next two are valid
     48 cl_flushed_pos        CommitLog bytes durable below this offset
     56 cq_flushed_pos        every ConsumeQueue unit of a record below it is durable

abort — an empty file that exists while a broker runs; found at start-up it
means the last run did not shut down cleanly (abnormal recovery).

config tables — JSON files rewritten whole and atomically: the new content
goes to ``<f>.tmp`` (fsync), the old file is copied to ``<f>.bak``, then
``<f>.tmp`` is renamed over ``<f>``. Loading checks each table's shape (the
types of the keys shmq reads) and falls back to ``.bak`` if ``<f>`` is
missing, unreadable or wrong-shaped, with a WARNING naming both files and
what was wrong (the last change to the table may be lost); if neither loads,
``ConfigFileError`` names each file and the key at fault. fastjson's unquoted
numeric keys (``{0:12}``) are accepted, so a store written by RocketMQ loads too.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass

import numpy as np

from .files import FileLayer

log = logging.getLogger("shmq.config")

CHECKPOINT_BYTES = 4096
CHECKPOINT_MAGIC = 0x73686D71636B7074
_CKPT = np.dtype([("physic_ts", ">i8"), ("logics_ts", ">i8"), ("index_ts", ">i8"),
                  ("master_flushed", ">i8"), ("confirm_phy", ">i8"), ("magic", ">i8"),
                  ("cl_flushed", ">i8"), ("cq_flushed", ">i8")])
# the page drawn above: eight int64s at 0, 8, .. 56, inside one page
assert [_CKPT.fields[n][1] for n in _CKPT.names] == list(range(0, 64, 8)) and (
    _CKPT.itemsize <= CHECKPOINT_BYTES), "checkpoint: _CKPT is not the page drawn in the header"


@dataclass(frozen=True)
class Checkpoint:
    physic_ts: int = 0
    logics_ts: int = 0
    index_ts: int = 0
    cl_flushed: int = -1   # -1: unknown (no shmq fields: a RocketMQ store, or none)
    cq_flushed: int = -1

    @staticmethod
    def path(root: str) -> str:
        return os.path.join(root, "checkpoint")

    @classmethod
    def load(cls, files: FileLayer, root: str) -> "Checkpoint | None":
        raw = files.read_bytes(cls.path(root))
        if raw is None or len(raw) < _CKPT.itemsize:
            return None
        r = np.frombuffer(raw[:_CKPT.itemsize], dtype=_CKPT)[0]
        ours = int(r["magic"]) == CHECKPOINT_MAGIC
        return cls(int(r["physic_ts"]), int(r["logics_ts"]), int(r["index_ts"]),
                   int(r["cl_flushed"]) if ours else -1, int(r["cq_flushed"]) if ours else -1)

    def save(self, files: FileLayer, root: str) -> None:
        path = self.path(root)
        files.create_preallocated(path, CHECKPOINT_BYTES)
        rec = np.zeros(1, dtype=_CKPT)
        rec[0] = (self.physic_ts, self.logics_ts, self.index_ts, 0, self.cl_flushed,
                  CHECKPOINT_MAGIC, self.cl_flushed, self.cq_flushed)
        h = files.open(path)
        try:
            files.pwrite(h, rec.tobytes(), 0)
            files.sync(h)
        finally:
            files.close(h)


def abort_path(root: str) -> str:
    return os.path.join(root, "abort")


# ----------------------------------------------------------- config tables
_BARE_KEY = re.compile(r'([{,]\s*)(-?\d+)(\s*:)')

# File name → the empty table RocketMQ writes (reference §7.6); brokerConfig.json
# is shmq's (UPDATE_BROKER_CONFIG's runtime settings).
CONFIG_TABLES = {
    "topics.json": {"topicConfigTable": {}},
    "consumerOffset.json": {"offsetTable": {}},
    "subscriptionGroup.json": {"subscriptionGroupTable": {}},
    "delayOffset.json": {"offsetTable": {}},
    "brokerConfig.json": {"brokerConfigTable": {}},
}


class ConfigFileError(ValueError):
    """Neither a config file nor its .bak could be read: names each file and
    what is wrong with it (for a wrong-shaped one, the key)."""


def config_path(root: str, name: str) -> str:
    return os.path.join(root, "config", name)


def parse_json_lenient(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(_BARE_KEY.sub(r'\1"\2"\3', text))


# --- shapes: the keys shmq reads from each table, with their JSON types
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_TYPES = {"int": (_is_int, "an integer"), "str": (lambda v: isinstance(v, str), "a string"),
          "bool": (lambda v: isinstance(v, bool), "true or false"),
          "intstr": (lambda v: isinstance(v, str) and v.strip().lstrip("-").isdigit(),
                     "an integer string")}
# topicConfigTable / subscriptionGroupTable entries: key → (type, required)
_TOPIC_FIELDS = {"topicName": ("str", True), "readQueueNums": ("int", True),
                 "writeQueueNums": ("int", True), "perm": ("int", True),
                 "topicFilterType": ("str", False), "topicSysFlag": ("int", False),
                 "order": ("bool", False)}
_GROUP_FIELDS = {"groupName": ("str", False), "retryQueueNums": ("int", False),
                 "retryMaxTimes": ("int", False), "brokerId": ("int", False),
                 "whichBrokerWhenConsumeSlowly": ("int", False), "consumeEnable": ("bool", False),
                 "consumeFromMinEnable": ("bool", False), "consumeBroadcastEnable": ("bool", False),
                 "notifyConsumerIdsChangedEnable": ("bool", False)}


def _show(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _want(key: str, value, kind: str) -> str | None:
    ok, says = _TYPES[kind]
    return None if ok(value) else f"{key} is {_show(value)}, not {says}"


def _fields(prefix: str, entry, fields: dict) -> str | None:
    if not isinstance(entry, dict):
        return f"{prefix} is {_show(entry)}, not a JSON object"
    for key, (kind, required) in fields.items():
        if key not in entry:
            if required:
                return f"{prefix}.{key} is missing"
            continue
        why = _want(f"{prefix}.{key}", entry[key], kind)
        if why:
            return why
    return None


def _offsets(prefix: str, entry) -> str | None:
    """{"<queue id or delay level>": offset}"""
    if not isinstance(entry, dict):
        return f"{prefix} is {_show(entry)}, not a JSON object"
    for k, v in entry.items():
        if not k.strip().lstrip("-").isdigit():
            return f"{prefix}.{k}: the key {json.dumps(k)} is not an integer"
        why = _want(f"{prefix}.{k}", v, "int")
        if why:
            return why
    return None


def table_problem(name: str, data) -> str | None:
    """Why ``data`` is not the shape of config table ``name`` (the key at
    fault and what it holds), or None."""
    if not isinstance(data, dict):
        return f"is {_show(data)}, not a JSON object"
    dv = data.get("dataVersion")
    if dv is not None:
        why = _fields("dataVersion", dv, {"timestamp": ("int", False), "counter": ("int", False)})
        if why:
            return why
    if name not in CONFIG_TABLES:
        return None
    [key] = CONFIG_TABLES[name]
    table = data.get(key, {})
    if not isinstance(table, dict):
        return f"{key} is {_show(table)}, not a JSON object"
    for k, entry in table.items():
        prefix = f"{key}.{k}"
        if name == "topics.json":
            why = _fields(prefix, entry, _TOPIC_FIELDS)
        elif name == "subscriptionGroup.json":
            why = _fields(prefix, entry, _GROUP_FIELDS)
        elif name == "consumerOffset.json":
            why = _offsets(prefix, entry)
        elif name == "delayOffset.json":
            why = (_want(prefix, entry, "int") if k.strip().isdigit()
                   else f"{prefix}: the key {json.dumps(k)} is not a delay level")
        else:   # brokerConfig.json: key=value strings, as broker.conf
            why = _want(prefix, entry, "intstr" if k == "brokerPermission" else "str")
        if why:
            return why
    return None


_warned: set[str] = set()


def _says(path: str, why: str) -> str:
    return f"config file {path} {why}" if why.startswith("is ") else f"config file {path}: {why}"


def load_table(files: FileLayer, root: str, name: str) -> dict:
    """A config table, from ``<f>`` or else ``<f>.bak`` (a WARNING, once per
    process, names both and what was wrong with ``<f>``); the empty table if
    neither exists. Raises ConfigFileError naming each file (and key) if one
    exists and none loads."""
    path = config_path(root, name)
    errors: list[tuple[str, str]] = []
    for p in (path, path + ".bak"):
        raw = files.read_bytes(p)
        if raw is None:
            if p == path and files.read_bytes(path + ".bak") is not None:
                errors.append((p, "is missing"))
            continue
        try:
            data = parse_json_lenient(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            errors.append((p, f"is not valid JSON ({e})"))
            continue
        why = table_problem(name, data)
        if why:
            errors.append((p, why))
            continue
        if errors:
            msg = (f"{_says(*errors[0])}; loaded {p} instead "
                   f"(the last change to {name} may be lost)")
            if msg not in _warned:
                _warned.add(msg)
                log.warning("%s", msg)
        return data
    if errors:
        raise ConfigFileError("; ".join(_says(p, why) for p, why in errors))
    return json.loads(json.dumps(CONFIG_TABLES.get(name, {})))


def save_table(files: FileLayer, root: str, name: str, data: dict) -> None:
    path = config_path(root, name)
    files.makedirs(os.path.dirname(path))
    text = json.dumps(data, indent="\t", sort_keys=True).encode("utf-8")
    old = files.read_bytes(path)
    if old is not None:
        files.write_durable(path + ".bak", old)
    files.write_durable(path, text)
