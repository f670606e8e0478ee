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
from dataclasses import dataclass, fields

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


class _Config:
    """A frozen config entry that is a JSON object in a RocketMQ table file:
    ``_JSON`` pairs each field with its Java name (what the file, the wire
    bodies and the NameServer registration carry)."""
    __slots__ = ()
    _JSON: tuple[tuple[str, str], ...] = ()
    _KEYS: dict[str, str] = {}

    def to_json(self) -> dict:
        return {key: getattr(self, attr) for attr, key in self._JSON}

    @classmethod
    def from_json(cls, name: str, obj: dict):
        """The entry ``name`` from its JSON object. Fields it leaves out, or
        gives a value of another type (an admin request's body), keep
        RocketMQ's defaults; unknown ones (5.x's ``attributes``) are dropped.
        A table file's entries were checked whole when it was read
        (``core.checkpoint.table_problem``: a bad one names its file and key)."""
        given = {}
        for f in fields(cls)[1:]:
            v = obj.get(cls._KEYS[f.name])
            want = type(f.default)
            if type(v) is want:                # (a bool is no int here)
                given[f.name] = v
        return cls(name, **given)


@dataclass(frozen=True, slots=True)
class TopicConfig(_Config):
    """RocketMQ's TopicConfig, one entry of config/topics.json."""
    name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    filter_type: str = "SINGLE_TAG"
    sys_flag: int = 0
    order: bool = False
    _JSON = (("name", "topicName"), ("read_queue_nums", "readQueueNums"),
             ("write_queue_nums", "writeQueueNums"), ("perm", "perm"),
             ("filter_type", "topicFilterType"), ("sys_flag", "topicSysFlag"), ("order", "order"))
    _KEYS = dict(_JSON)


@dataclass(frozen=True, slots=True)
class GroupConfig(_Config):
    """RocketMQ's SubscriptionGroupConfig, one entry of config/subscriptionGroup.json."""
    name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    _JSON = (("name", "groupName"), ("consume_enable", "consumeEnable"),
             ("consume_from_min_enable", "consumeFromMinEnable"),
             ("consume_broadcast_enable", "consumeBroadcastEnable"),
             ("retry_queue_nums", "retryQueueNums"), ("retry_max_times", "retryMaxTimes"),
             ("broker_id", "brokerId"),
             ("which_broker_when_consume_slowly", "whichBrokerWhenConsumeSlowly"),
             ("notify_consumer_ids_changed_enable", "notifyConsumerIdsChangedEnable"))
    _KEYS = dict(_JSON)


def topic_config(name: str, read: int, write: int, perm: int = PERM_READ | PERM_WRITE,
                 filter_type: str = "SINGLE_TAG", sys_flag: int = 0,
                 order: bool = False) -> TopicConfig:
    return TopicConfig(name, int(read), int(write), int(perm), filter_type, int(sys_flag),
                       bool(order))


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
    """One table file: its entries parsed (``entry``: a ``_Config`` class; None
    keeps the JSON values as they are), reloaded when ``config_epoch`` moves."""

    def __init__(self, root: str, file: str, key: str, state: StoreState, lock: FileLock,
                 entry: type[_Config] | None = None):
        self.root, self.file, self.key = root, file, key
        self.state = state
        self.lock = lock
        self.entry = entry
        self.data: dict = {}        # the file as JSON
        self.entries: dict = {}     # its table, parsed
        self.epoch = -1
        self.on_change = None   # called after a change (a broker wakes its services)

    def _load(self) -> dict:
        return load_table(REAL_FILES, self.root, self.file)

    def _parse(self, data: dict) -> dict:
        table = data.setdefault(self.key, {})
        if self.entry is None:
            return table
        return {name: self.entry.from_json(name, v) for name, v in table.items()}

    def current(self) -> dict:
        epoch = self.state.get("config_epoch")
        if epoch != self.epoch:
            data = self._load()
            self.entries = self._parse(data)
            self.data, self.epoch = data, epoch
        return self.entries

    def get(self, name: str):
        return self.current().get(name)

    def update(self, changes: dict) -> None:
        """Put (or, for None, remove) entries, durably, and tell every process."""
        with self.lock.held():
            data = self._load()
            table = data.setdefault(self.key, {})
            for name, value in changes.items():
                if value is None:
                    table.pop(name, None)
                else:
                    table[name] = value if self.entry is None else value.to_json()
            dv = data.setdefault("dataVersion", {"timestamp": 0, "counter": 0})
            dv["timestamp"] = int(time.time() * 1000)
            dv["counter"] = int(dv.get("counter", 0)) + 1
            save_table(REAL_FILES, self.root, self.file, data)
            self.state.set("config_epoch", self.state.get("config_epoch") + 1)
            self.entries = self._parse(data)
            self.data, self.epoch = data, self.state.get("config_epoch")
        if self.on_change is not None:
            self.on_change()

    def table_json(self) -> dict:
        """The table as its file has it (GET_ALL_* bodies, registration)."""
        self.current()
        return self.data[self.key]

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
        self.topics = _Table(root, "topics.json", "topicConfigTable", state, self.lock,
                             TopicConfig)
        self.groups = _Table(root, "subscriptionGroup.json", "subscriptionGroupTable", state,
                             self.lock, GroupConfig)
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
        if c.traceTopicEnable:                     # TopicConfigManager: 1 queue, perm 6
            want[c.msgTraceTopicName] = topic_config(c.msgTraceTopicName, 1, 1)
        if c.autoCreateTopicEnable:
            n = c.defaultTopicQueueNums
            want[DEFAULT_TOPIC] = topic_config(DEFAULT_TOPIC, n, n,
                                               PERM_READ | PERM_WRITE | PERM_INHERIT)
        current = self.topics.current()
        changes: dict[str, TopicConfig | None] = {k: v for k, v in want.items()
                                                  if current.get(k) != v}
        if not c.autoCreateTopicEnable and DEFAULT_TOPIC in current:
            changes[DEFAULT_TOPIC] = None
        if changes:
            self.topics.update(changes)

    def create_topic_on_send(self, topic: str, default_topic: str,
                             queue_nums: int) -> TopicConfig | None:
        """RocketMQ's createTopicInSendMessageMethod: a new topic from a
        default topic that carries PERM_INHERIT; None if that is not allowed."""
        existing = self.topics.get(topic)
        if existing is not None:
            return existing
        base = self.topics.get(default_topic)
        if base is None or not base.perm & PERM_INHERIT:
            return None
        n = max(1, min(int(queue_nums), base.write_queue_nums))
        tc = topic_config(topic, n, n, base.perm & ~PERM_INHERIT)
        self.topics.update({topic: tc})
        return tc

    def retry_topic(self, group: str) -> TopicConfig:
        name = RETRY_GROUP_TOPIC_PREFIX + group
        tc = self.topics.get(name)
        if tc is None:
            n = self.config.retryQueueNums
            tc = topic_config(name, n, n)
            self.topics.update({name: tc})
        return tc

    def dlq_topic(self, group: str) -> TopicConfig:
        """%DLQ%group: one queue, read and write (RocketMQ 4.9.2+)."""
        name = DLQ_GROUP_TOPIC_PREFIX + group
        tc = self.topics.get(name)
        if tc is None:
            tc = topic_config(name, DLQ_QUEUE_NUMS, DLQ_QUEUE_NUMS)
            self.topics.update({name: tc})
        return tc

    def group(self, name: str, create: bool) -> GroupConfig | None:
        g = self.groups.get(name)
        if g is None and create:
            g = GroupConfig(name)
            self.groups.update({name: g})
        return g
