"""Topic and subscription-group tables, shared by every broker process.

The tables are RocketMQ's ``config/topics.json`` and
``config/subscriptionGroup.json``. Each process keeps a copy in memory and
reloads it when the store state's ``config_epoch`` moves; a change takes the
config lock (an flock, released if the holder dies), re-reads the file,
writes it atomically (with ``.bak``), then bumps the epoch, so every process
sees it on its next request and the services process re-registers the
broker with the NameServers at once.
"""
from __future__ import annotations

import logging
import os
import re
import time

from shmq.core.checkpoint import CONFIG_TABLES, config_path, load_table, save_table
from shmq.core.files import REAL_FILES
from shmq.core.state import StoreState
from shmq.ipc.table import FileLock

from .config import DEFAULT_TOPIC, RUNTIME_SETTINGS, BrokerConfig

log = logging.getLogger("shmq.config")

PERM_PRIORITY, PERM_READ, PERM_WRITE, PERM_INHERIT = 8, 4, 2, 1
TOPIC_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_CHARS_MAX = 127
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TIMER_TOPIC = "rmq_sys_wheel_timer"
# Producers may not send to these (AbstractSendMessageProcessor.msgCheck).
NOT_ALLOWED_SEND_TOPICS = frozenset({SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC,
                                     TRANS_CHECK_MAX_TIME_TOPIC, SELF_TEST_TOPIC,
                                     OFFSET_MOVED_EVENT, TIMER_TOPIC})
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
DLQ_QUEUE_NUMS = 1


def topic_error(topic: str | None) -> str | None:
    """Why ``topic`` is not a valid topic name, or None."""
    if not topic:
        return "the topic name is empty"
    if len(topic) > TOPIC_CHARS_MAX:
        return f"the topic name is longer than {TOPIC_CHARS_MAX} characters"
    if not TOPIC_NAME.match(topic):
        return f"the topic name {topic!r} contains characters other than ^[%|a-zA-Z0-9_-]+$"
    return None


def topic_config(name: str, read: int, write: int, perm: int = PERM_READ | PERM_WRITE,
                 filter_type: str = "SINGLE_TAG", sys_flag: int = 0, order: bool = False) -> dict:
    return {"topicName": name, "readQueueNums": int(read), "writeQueueNums": int(write),
            "perm": int(perm), "topicFilterType": filter_type, "topicSysFlag": int(sys_flag),
            "order": bool(order)}


def group_config(name: str, retry_queues: int = 1) -> dict:
    return {"groupName": name, "consumeEnable": True, "consumeFromMinEnable": True,
            "consumeBroadcastEnable": True, "retryQueueNums": retry_queues, "retryMaxTimes": 16,
            "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1,
            "notifyConsumerIdsChangedEnable": True}


def check_config_files(config: BrokerConfig) -> None:
    """Load every config table once, before the broker starts: one that
    neither its file nor its ``.bak`` supplies raises ConfigFileError naming
    the file and the key; a ``.bak`` fallback is a WARNING naming both. Settings
    an older shmq kept in brokerConfig.json but never applied are a WARNING."""
    root = config.store.storePathRootDir
    tables = {name: load_table(REAL_FILES, root, name) for name in CONFIG_TABLES}
    kept = tables["brokerConfig.json"].get("brokerConfigTable", {})
    stale = sorted(k for k in kept if k not in RUNTIME_SETTINGS)
    if stale:
        log.warning("config file %s: %s not applied: only %s can change at runtime; set the "
                    "rest in broker.conf (the next UPDATE_BROKER_CONFIG removes them here)",
                    config_path(root, "brokerConfig.json"),
                    ", ".join(f"{k}={kept[k]}" for k in stale), ", ".join(sorted(RUNTIME_SETTINGS)))


class _Table:
    def __init__(self, root: str, file: str, key: str, state: StoreState, lock: FileLock):
        self.root, self.file, self.key = root, file, key
        self.state = state
        self.lock = lock
        self.data: dict = {}
        self.epoch = -1
        self.on_change = None   # called after a change (a broker wakes its services)

    def _load(self) -> dict:
        return load_table(REAL_FILES, self.root, self.file)

    def current(self) -> dict:
        epoch = self.state.get("config_epoch")
        if epoch != self.epoch:
            self.data = self._load()
            self.data.setdefault(self.key, {})
            self.epoch = epoch
        return self.data[self.key]

    def get(self, name: str) -> dict | None:
        return self.current().get(name)

    def update(self, changes: dict[str, dict | None]) -> None:
        """Put (or, for None, remove) entries, durably, and tell every process."""
        with self.lock.held():
            data = self._load()
            table = data.setdefault(self.key, {})
            for name, value in changes.items():
                if value is None:
                    table.pop(name, None)
                else:
                    table[name] = value
            dv = data.setdefault("dataVersion", {"timestamp": 0, "counter": 0})
            dv["timestamp"] = int(time.time() * 1000)
            dv["counter"] = int(dv.get("counter", 0)) + 1
            save_table(REAL_FILES, self.root, self.file, data)
            self.state.set("config_epoch", self.state.get("config_epoch") + 1)
            self.data, self.epoch = data, self.state.get("config_epoch")
        if self.on_change is not None:
            self.on_change()

    def data_version(self) -> dict:
        self.current()
        return dict(self.data.get("dataVersion") or {"timestamp": 0, "counter": 0})


class Tables:
    """The topic and subscription-group tables of one broker process."""

    def __init__(self, config: BrokerConfig, state: StoreState, on_change=None):
        self.config = config
        root = config.store.storePathRootDir
        REAL_FILES.makedirs(os.path.join(root, "config"))   # owner-only (core/files.py)
        self.lock = FileLock(os.path.join(root, "config", ".lock"))
        self.topics = _Table(root, "topics.json", "topicConfigTable", state, self.lock)
        self.groups = _Table(root, "subscriptionGroup.json", "subscriptionGroupTable", state,
                             self.lock)
        self.topics.on_change = on_change
        # UPDATE_BROKER_CONFIG's changes, kept across restarts (RocketMQ
        # persists them too); brokerPermission applies at once everywhere
        self.broker = _Table(root, "brokerConfig.json", "brokerConfigTable", state, self.lock)
        self.broker.on_change = on_change

    def broker_permission(self) -> int:
        v = self.broker.current().get("brokerPermission")
        return int(v) if v is not None else self.config.brokerPermission

    def ensure_system_topics(self) -> None:
        """The topics a RocketMQ broker creates at start (TopicConfigManager)."""
        c = self.config
        want = {SELF_TEST_TOPIC: topic_config(SELF_TEST_TOPIC, 1, 1),
                OFFSET_MOVED_EVENT: topic_config(OFFSET_MOVED_EVENT, 1, 1),
                c.brokerClusterName: topic_config(c.brokerClusterName, 16, 16,
                                                  PERM_READ | PERM_WRITE),
                c.brokerName: topic_config(c.brokerName, 1, 1, PERM_READ | PERM_WRITE),
                SCHEDULE_TOPIC: topic_config(SCHEDULE_TOPIC, len(c.delay_levels_ms),
                                             len(c.delay_levels_ms)),
                TRANS_HALF_TOPIC: topic_config(TRANS_HALF_TOPIC, 1, 1),
                TRANS_OP_HALF_TOPIC: topic_config(TRANS_OP_HALF_TOPIC, 1, 1),
                TRANS_CHECK_MAX_TIME_TOPIC: topic_config(TRANS_CHECK_MAX_TIME_TOPIC, 1, 1)}
        if c.timerWheelEnable:
            want[TIMER_TOPIC] = topic_config(TIMER_TOPIC, 1, 1)
        if c.autoCreateTopicEnable:
            n = c.defaultTopicQueueNums
            want[DEFAULT_TOPIC] = topic_config(DEFAULT_TOPIC, n, n,
                                               PERM_READ | PERM_WRITE | PERM_INHERIT)
        current = self.topics.current()
        changes: dict[str, dict | None] = {k: v for k, v in want.items() if current.get(k) != v}
        if not c.autoCreateTopicEnable and DEFAULT_TOPIC in current:
            changes[DEFAULT_TOPIC] = None
        if changes:
            self.topics.update(changes)

    def create_topic_on_send(self, topic: str, default_topic: str, queue_nums: int) -> dict | None:
        """RocketMQ's createTopicInSendMessageMethod: a new topic from a
        default topic that carries PERM_INHERIT; None if that is not allowed."""
        existing = self.topics.get(topic)
        if existing is not None:
            return existing
        base = self.topics.get(default_topic)
        if base is None or not base["perm"] & PERM_INHERIT:
            return None
        n = max(1, min(int(queue_nums), int(base["writeQueueNums"])))
        tc = topic_config(topic, n, n, base["perm"] & ~PERM_INHERIT)
        self.topics.update({topic: tc})
        return tc

    def retry_topic(self, group: str) -> dict:
        name = RETRY_GROUP_TOPIC_PREFIX + group
        tc = self.topics.get(name)
        if tc is None:
            n = self.config.retryQueueNums
            tc = topic_config(name, n, n)
            self.topics.update({name: tc})
        return tc

    def dlq_topic(self, group: str) -> dict:
        """%DLQ%group: one queue, read and write (RocketMQ 4.9.2+)."""
        name = DLQ_GROUP_TOPIC_PREFIX + group
        tc = self.topics.get(name)
        if tc is None:
            tc = topic_config(name, DLQ_QUEUE_NUMS, DLQ_QUEUE_NUMS)
            self.topics.update({name: tc})
        return tc

    def group(self, name: str, create: bool) -> dict | None:
        g = self.groups.get(name)
        if g is None and create:
            g = group_config(name)
            self.groups.update({name: g})
        return g
