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
``<f>.tmp`` is renamed over ``<f>``. Loading falls back to ``.bak`` if ``<f>``
is missing or unreadable, and accepts fastjson's unquoted numeric keys
(``{0:12}``) so a store written by RocketMQ loads too.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import numpy as np

from .files import FileLayer

CHECKPOINT_BYTES = 4096
CHECKPOINT_MAGIC = 0x73686D71636B7074
_CKPT = np.dtype([("physic_ts", ">i8"), ("logics_ts", ">i8"), ("index_ts", ">i8"),
                  ("master_flushed", ">i8"), ("confirm_phy", ">i8"), ("magic", ">i8"),
                  ("cl_flushed", ">i8"), ("cq_flushed", ">i8")])


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

# File name → the empty table RocketMQ writes (reference §7.6).
CONFIG_TABLES = {
    "topics.json": {"topicConfigTable": {}},
    "consumerOffset.json": {"offsetTable": {}},
    "subscriptionGroup.json": {"subscriptionGroupTable": {}},
    "delayOffset.json": {"offsetTable": {}},
}


class ConfigFileError(ValueError):
    """Neither a config file nor its .bak could be read."""


def config_path(root: str, name: str) -> str:
    return os.path.join(root, "config", name)


def parse_json_lenient(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(_BARE_KEY.sub(r'\1"\2"\3', text))


def load_table(files: FileLayer, root: str, name: str) -> dict:
    """A config table, from ``<f>`` or else ``<f>.bak``; the empty table if
    neither exists. Raises ConfigFileError if one exists and none parses."""
    path = config_path(root, name)
    errors = []
    for p in (path, path + ".bak"):
        raw = files.read_bytes(p)
        if raw is None:
            continue
        try:
            data = parse_json_lenient(raw.decode("utf-8"))
            if isinstance(data, dict):
                return data
            errors.append(f"{p}: not a JSON object")
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            errors.append(f"{p}: {e}")
    if errors:
        raise ConfigFileError("; ".join(errors))
    return json.loads(json.dumps(CONFIG_TABLES.get(name, {})))


def save_table(files: FileLayer, root: str, name: str, data: dict) -> None:
    path = config_path(root, name)
    files.makedirs(os.path.dirname(path))
    text = json.dumps(data, indent="\t", sort_keys=True).encode("utf-8")
    old = files.read_bytes(path)
    if old is not None:
        files.write_durable(path + ".bak", old)
    files.write_durable(path, text)
