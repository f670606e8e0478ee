"""What applications hand the client and get back: messages, queues, send results.

Names follow RocketMQ's Java client (``Message``, ``MessageExt``,
``MessageQueue``, ``SendResult``/``SendStatus``). A message's id is its
``UNIQ_KEY`` (MessageClientIDSetter's layout, made here when sending); the
broker's ``offsetMsgId`` locates the stored record.
"""
from __future__ import annotations

import enum
import itertools
import os
import socket
import struct
import time
from dataclasses import dataclass, field

from shmq.core.layout import properties_to_string
from shmq.core.records import StoredMessage

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

    def properties_string(self, uniq_key: str | None = None) -> str:
        d = dict(self.properties)
        if self.tags:
            d[TAGS] = self.tags
        if self.keys:
            d[KEYS] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
        if self.delay_level > 0:
            d[DELAY] = str(self.delay_level)
        if uniq_key and UNIQ_KEY not in d:
            d[UNIQ_KEY] = uniq_key
        return properties_to_string(d)


@dataclass
class SendResult:
    status: SendStatus
    msg_id: str                  # UNIQ_KEY (comma-joined for a batch)
    offset_msg_id: str           # the broker's id of the stored record(s)
    queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None
    region_id: str = "DefaultRegion"


class MessageExt:
    """A consumed message: the stored record plus where it came from."""

    __slots__ = ("record", "broker_name", "_props")

    def __init__(self, record: StoredMessage, broker_name: str):
        self.record = record
        self.broker_name = broker_name
        self._props: dict[str, str] | None = None

    @property
    def properties(self) -> dict[str, str]:
        if self._props is None:
            self._props = self.record.properties
        return self._props

    @property
    def topic(self) -> str:
        return self.record.topic

    @property
    def body(self) -> bytes:
        return self.record.body

    @property
    def tags(self) -> str | None:
        return self.properties.get(TAGS)

    @property
    def keys(self) -> str | None:
        """The KEYS property as sent: one string, keys separated by spaces
        (RocketMQ's getKeys()); None without keys."""
        return self.properties.get(KEYS) or None

    @property
    def key_list(self) -> list[str]:
        """The keys as a list (``keys`` split at spaces)."""
        return split_keys(self.properties.get(KEYS))

    @property
    def msg_id(self) -> str:
        return self.properties.get(UNIQ_KEY) or self.offset_msg_id

    @property
    def offset_msg_id(self) -> str:
        return self.record.offset_msg_id()

    @property
    def queue_id(self) -> int:
        return self.record.queue_id

    @property
    def queue_offset(self) -> int:
        return self.record.queue_offset

    @property
    def commit_log_offset(self) -> int:
        return self.record.phy_offset

    @property
    def reconsume_times(self) -> int:
        return self.record.reconsume_times

    @property
    def born_timestamp(self) -> int:
        return self.record.born_timestamp

    @property
    def store_timestamp(self) -> int:
        return self.record.store_timestamp

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    def __repr__(self) -> str:
        return (f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, "
                f"queue_offset={self.queue_offset}, msg_id={self.msg_id!r}, tags={self.tags!r}, "
                f"keys={self.keys!r})")


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

    def next(self) -> str:
        if self._pid != os.getpid():
            self._seed()
        ms = int((time.time() - self._month_start) * 1000) & 0x7FFFFFFF
        tail = struct.pack(">ih", ms, next(self._counter) & 0x7FFF)
        return self._prefix + tail.hex().upper()


unique_ids = UniqueIds()
