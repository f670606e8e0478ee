"""Consumer offsets: where a group has got to in each queue, and where a new one starts.

``RemoteBrokerOffsetStore`` (clustering) keeps the offsets in memory and
writes them to the queue's broker (UPDATE_CONSUMER_OFFSET) when asked: every
``persist_consumer_offset_interval``, when a queue is dropped and at shutdown;
it reads them back with QUERY_CONSUMER_OFFSET. ``LocalFileOffsetStore``
(broadcasting) keeps them in
``<dir>/<clientId>/<group>/offsets.json`` (dir ``~/.rocketmq_offsets``),
written atomically in the Java client's fastjson form, so either client can
read the other's file. ``read_offset`` answers as RocketMQ's OffsetStore
does: an offset, -1 (none stored) or -2 (the broker could not be asked).

``parse_offset_table`` reads fastjson's ``Map<MessageQueue, Long>`` text
(``{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"t"}:12}}``, not
JSON) as sent in RESET_CONSUMER_CLIENT_OFFSET and kept in offsets.json.
``compute_pull_from_where`` is RebalancePushImpl's choice of a queue's first
offset (stored offset, else ``consume_from_where``).
"""
from __future__ import annotations

import abc
import asyncio
import enum
import logging
import os
import shutil
import time

from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.fastjson import mq_map, parse_fastjson
from shmq.ipc.remoting import RemotingCommand

from .connection import RemotingError
from .instance import ClientInstance, MQClientError
from .message import MessageQueue

log = logging.getLogger("shmq.client")
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
OFFSET_REQUEST_TIMEOUT = 5.0                  # RemoteBrokerOffsetStore's 1000 * 5 ms
LAST_OFFSET_FAMILY = ("CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                      "CONSUME_FROM_MIN_OFFSET", "CONSUME_FROM_MAX_OFFSET")
CONSUME_FROM_WHERE = LAST_OFFSET_FAMILY + ("CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP")


class ReadOffsetType(enum.Enum):
    READ_FROM_MEMORY = "READ_FROM_MEMORY"
    READ_FROM_STORE = "READ_FROM_STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


class OffsetStore(abc.ABC):
    """The in-memory table both stores share (RocketMQ's OffsetStore)."""

    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}

    async def load(self) -> None:
        """Read what was persisted before (nothing for the broker store)."""

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        old = self.table.get(mq)
        if old is None or not increase_only or offset > old:
            self.table[mq] = offset

    def remove_offset(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)

    def clone_offset_table(self, topic: str = "") -> dict[MessageQueue, int]:
        return {mq: o for mq, o in self.table.items() if not topic or mq.topic == topic}

    async def read_offset(self, mq: MessageQueue, how: ReadOffsetType) -> int:
        if how is not ReadOffsetType.READ_FROM_STORE:
            offset = self.table.get(mq)
            if offset is not None:
                return offset
            if how is ReadOffsetType.READ_FROM_MEMORY:
                return -1
        offset = await self._read_stored(mq)
        if offset >= 0:
            self.table[mq] = offset
        return offset

    @abc.abstractmethod
    async def _read_stored(self, mq: MessageQueue) -> int:
        """The offset kept where this store keeps them (-1: none)."""

    @abc.abstractmethod
    async def persist(self, mq: MessageQueue) -> None:
        """Keep one queue's offset."""

    @abc.abstractmethod
    async def persist_all(self, mqs: set[MessageQueue]) -> None:
        """Keep the offsets of ``mqs`` (and drop the others)."""


class RemoteBrokerOffsetStore(OffsetStore):
    """Clustering: each queue's offset lives on the broker that holds the queue."""

    def __init__(self, instance: ClientInstance, group: str):
        super().__init__()
        self.instance, self.group = instance, group

    async def _invoke(self, mq: MessageQueue, cmd: RemotingCommand) -> RemotingCommand:
        inst = self.instance
        if inst.broker_addr(mq.broker_name) is None:      # not in any route we hold: ask again
            await inst.route(mq.topic, refresh=True)
        return await inst.invoke(mq.broker_name, cmd, OFFSET_REQUEST_TIMEOUT)

    def _header(self, mq: MessageQueue) -> dict[str, str]:
        return {"consumerGroup": self.group, "topic": mq.topic, "queueId": str(mq.queue_id),
                "bname": mq.broker_name}

    async def _read_stored(self, mq: MessageQueue) -> int:
        try:
            r = await self._invoke(mq, RemotingCommand(RC.QUERY_CONSUMER_OFFSET, ext=self._header(mq)))
        except (RemotingError, MQClientError) as e:
            log.warning("query the offset of %s for %s: %s", mq, self.group, e)
            return -2
        if r.code != R.SUCCESS:           # QUERY_NOT_FOUND (or any refusal): no offset
            return -1
        return int(r.ext["offset"])

    async def update_consume_offset_to_broker(self, mq: MessageQueue, offset: int) -> None:
        ext = {**self._header(mq), "commitOffset": str(offset)}
        r = await self._invoke(mq, RemotingCommand(RC.UPDATE_CONSUMER_OFFSET, ext=ext))
        if r.code != R.SUCCESS:
            raise MQClientError(r.code, r.remark, f"update the offset of {mq}")

    async def persist(self, mq: MessageQueue) -> None:
        offset = self.table.get(mq)
        if offset is None:
            return
        try:
            await self.update_consume_offset_to_broker(mq, offset)
        except (RemotingError, MQClientError) as e:
            log.warning("persist the offset %d of %s for %s: %s", offset, mq, self.group, e)

    async def persist_all(self, mqs: set[MessageQueue]) -> None:
        """Write the offsets of ``mqs``; forget those of queues no longer held."""
        if not mqs:
            return
        for mq in [mq for mq in self.table if mq not in mqs]:
            del self.table[mq]
        await asyncio.gather(*(self.persist(mq) for mq in list(self.table)))


class LocalFileOffsetStore(OffsetStore):
    """Broadcasting: every client keeps its own offsets in a local file."""

    def __init__(self, client_id: str, group: str, directory: str = ""):
        super().__init__()
        root = os.path.expanduser(directory or os.path.join("~", ".rocketmq_offsets"))
        self.path = os.path.join(root, client_id, group, "offsets.json")

    async def load(self) -> None:
        self.table.update(await asyncio.to_thread(self._read_file))

    def _read_file(self) -> dict[MessageQueue, int]:
        """offsets.json, or else offsets.json.bak; an empty table if neither exists."""
        errors = []
        for path in (self.path, self.path + ".bak"):
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except FileNotFoundError:
                continue
            if not text:
                continue
            try:
                return parse_offset_table(text)
            except ValueError as e:
                errors.append(f"{path}: {e}")
        if errors:
            raise MQClientError(-1, "; ".join(errors), "read the local offset store")
        return {}

    async def _read_stored(self, mq: MessageQueue) -> int:
        try:
            stored = await asyncio.to_thread(self._read_file)
        except MQClientError as e:
            log.warning("%s", e)
            return -1
        return stored.get(mq, -1)

    async def persist(self, mq: MessageQueue) -> None:
        await self.persist_all(set(self.table))

    async def persist_all(self, mqs: set[MessageQueue]) -> None:
        if not mqs:
            return
        table = {mq: o for mq, o in self.table.items() if mq in mqs}
        try:
            await asyncio.to_thread(self._write_file, dump_offset_table(table))
        except OSError as e:
            log.error("persist the offsets to %s: %s", self.path, e)

    def _write_file(self, text: str) -> None:
        """Write ``text`` to a temporary file, keep the previous file as .bak,
        then rename (MixAll.string2File, made durable)."""
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(self.path):
            shutil.copyfile(self.path, self.path + ".bak")
        os.replace(tmp, self.path)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ------------------------------------------------------------ fastjson offset tables
def dump_offset_table(table: dict[MessageQueue, int]) -> str:
    """``{"offsetTable":{{"brokerName":..,"queueId":..,"topic":..}:offset,...}}``."""
    entries = ((mq.topic, mq.broker_name, mq.queue_id, off) for mq, off in sorted(table.items()))
    return f'{{"offsetTable":{mq_map(entries)}}}'


def parse_offset_table(text: str | bytes) -> dict[MessageQueue, int]:
    """The ``offsetTable`` of a ResetOffsetBody or an offsets.json: fastjson's
    map with MessageQueue keys, or the list form sent to C++ clients
    (ResetOffsetBodyForC: ``[{"brokerName","offset","queueId","topic"}]``)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8")
    data = parse_fastjson(text)
    table = data.get("offsetTable") if isinstance(data, dict) else None
    if table is None:
        raise ValueError("no offsetTable")
    out: dict[MessageQueue, int] = {}
    if isinstance(table, list):
        for item in table:
            out[_queue(item)] = int(item["offset"])
        return out
    if not isinstance(table, dict):
        raise ValueError("offsetTable is neither a map nor a list")
    for key, offset in table.items():
        if not isinstance(key, tuple):
            raise ValueError(f"offsetTable key {key!r} is not a MessageQueue")
        out[_queue(dict(key))] = int(offset)
    return out


def _queue(d) -> MessageQueue:
    try:
        return MessageQueue(str(d["topic"]), str(d["brokerName"]), int(d["queueId"]))
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{d!r} is not a MessageQueue") from None


# ------------------------------------------------------------ queue offsets on the broker
async def _queue_offset(instance: ClientInstance, code: int, mq: MessageQueue,
                        extra: dict[str, str] | None = None) -> int:
    if instance.broker_addr(mq.broker_name) is None:
        await instance.route(mq.topic, refresh=True)
    ext = {"topic": mq.topic, "queueId": str(mq.queue_id), "bname": mq.broker_name, **(extra or {})}
    r = await instance.invoke(mq.broker_name, RemotingCommand(code, ext=ext))
    if r.code != R.SUCCESS:
        raise MQClientError(r.code, r.remark, f"offset request {code} for {mq}")
    return int(r.ext["offset"])


async def max_offset(instance: ClientInstance, mq: MessageQueue) -> int:
    """GET_MAX_OFFSET: the offset the next message of ``mq`` will get."""
    return await _queue_offset(instance, RC.GET_MAX_OFFSET, mq)


async def min_offset(instance: ClientInstance, mq: MessageQueue) -> int:
    """GET_MIN_OFFSET: the oldest offset still stored."""
    return await _queue_offset(instance, RC.GET_MIN_OFFSET, mq)


async def search_offset(instance: ClientInstance, mq: MessageQueue, timestamp_ms: int) -> int:
    """SEARCH_OFFSET_BY_TIMESTAMP: the offset whose store time is nearest ``timestamp_ms``."""
    return await _queue_offset(instance, RC.SEARCH_OFFSET_BY_TIMESTAMP, mq,
                               {"timestamp": str(int(timestamp_ms))})


def parse_consume_timestamp(value: str | int | float) -> int:
    """``consume_timestamp``: ms since the epoch, or RocketMQ's local-time
    ``yyyyMMddHHmmss`` string."""
    if isinstance(value, (int, float)):
        return int(value)
    try:
        t = time.strptime(value, "%Y%m%d%H%M%S")
    except ValueError:
        raise ValueError(f"consume_timestamp {value!r}: want yyyyMMddHHmmss or ms") from None
    return int(time.mktime(t) * 1000)


def default_consume_timestamp() -> str:
    """Half an hour ago as yyyyMMddHHmmss, RocketMQ's default."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(time.time() - 1800))


async def compute_pull_from_where(instance: ClientInstance, store: OffsetStore, mq: MessageQueue,
                                  consume_from_where: str, consume_timestamp_ms: int) -> int:
    """Where a queue newly held starts (RebalancePushImpl.computePullFromWhere):
    the stored offset; with none, the end (LAST), 0 (FIRST) or the offset at
    ``consume_timestamp_ms`` (TIMESTAMP); a retry queue starts at 0 (LAST) or
    the end (TIMESTAMP). -1: the store could not be read, try again later.
    Raises MQClientError/RemotingError when the broker cannot say."""
    last = await store.read_offset(mq, ReadOffsetType.READ_FROM_STORE)
    if last >= 0:
        return last
    if last != -1:
        return -1
    retry = mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
    if consume_from_where in LAST_OFFSET_FAMILY:
        return 0 if retry else await max_offset(instance, mq)
    if consume_from_where == "CONSUME_FROM_FIRST_OFFSET":
        return 0
    if retry:
        return await max_offset(instance, mq)
    return await search_offset(instance, mq, consume_timestamp_ms)


__all__ = ["CONSUME_FROM_WHERE", "LocalFileOffsetStore", "OffsetStore", "ReadOffsetType",
           "RemoteBrokerOffsetStore", "compute_pull_from_where", "default_consume_timestamp",
           "dump_offset_table", "max_offset", "min_offset", "parse_consume_timestamp",
           "parse_offset_table", "search_offset"]
