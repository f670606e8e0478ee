"""What every handler shares: the worker's broker state (``Broker``), the
per-connection context (``Peer``), and the reply helpers.

A handler is a function ``(b: Broker, peer: Peer, cmd) -> answer`` where the
answer is a ``RemotingCommand`` (its body inline), a ``Reply`` (a command
with its body as pieces: memory slices, file ranges), ``bytes`` (a whole
reply frame already encoded: a send's SUCCESS from its template),
``PARKED`` (the parking module answers later) or None (no answer). It never sees a
connection or a socket: the driver (broker/worker.py) writes what it
returns, and what ``Broker`` leaves for other clients (notices) once the
handler sets ``due``.
"""
from __future__ import annotations

import ipaddress
import os
import time

import orjson
from shmq.core.checkpoint import parse_json_lenient
from shmq.core.index import IndexService
from shmq.core.records import host_raw
from shmq.core.recovery import DamageLog
from shmq.core.retention import disk_full_remark
from shmq.core.store import MessageStore
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.control import ControlBlock
from shmq.ipc.headers import BadRequest
from shmq.ipc.remoting import RemotingCommand

from ..config import SLAVE, BrokerConfig
from ..parking import Parking, Reply
from ..registry import Registry
from ..stats import RuntimeStats
from ..topics import PERM_WRITE, Tables, TopicConfig
from .subscription import Subscription

__all__ = ["PARKED", "Broker", "Peer", "Reply", "born_host", "int_or", "json_body", "json_reply"]


CHECKS_REMEMBERED = 4096      # topics (groups × topics) whose checks a worker remembers


class _Parked:
    def __repr__(self) -> str:
        return "PARKED"


PARKED = _Parked()     # the answer will come from the parking module


def born_host(addr: str) -> tuple[str, int]:
    """A connection's "ip:port" as a message's born host; a Unix-socket
    client is 127.0.0.1:0."""
    host, _, port = addr.rpartition(":")
    try:
        ipaddress.ip_address(host)
        return host, int(port)
    except ValueError:
        return "127.0.0.1", 0


class Peer:
    """What a handler may know about the connection a request came on: its
    id, its address (text and born host, parsed once), what the broker
    remembers about the client (``attrs``: client id, language, groups),
    and whether it has closed (parked answers to it are dropped)."""
    __slots__ = ("id", "addr", "born_host", "born_raw", "attrs", "closed")

    def __init__(self, id: int, addr: str, attrs: dict | None = None):
        self.id = id
        self.addr = addr
        self.born_host = born_host(addr)
        self.born_raw = host_raw(*self.born_host)    # as a record stores it
        self.attrs = {} if attrs is None else attrs
        self.closed = False

    def __repr__(self) -> str:
        return f"Peer({self.id}, {self.addr!r})"


def _physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Broker:
    """A worker's request-handling state: the store, the shared tables, the
    subscriptions its clients registered, what it has parked, and the
    clients it can send notices to."""

    def __init__(self, config: BrokerConfig, store: MessageStore, cb: ControlBlock,
                 tables: Tables, registry: Registry, parking: Parking | None = None):
        self.config = config
        self.store = store
        self.cb = cb
        self.tables = tables
        self.registry = registry
        self.parking = parking
        self.store_host = (config.brokerIP1, config.listenPort)
        self.store_host_raw = host_raw(*self.store_host)
        self.send_topics: dict[str, tuple[int, TopicConfig]] = {}   # topic → (config_epoch, config)
        self.pull_topics: dict[tuple[str, str], tuple[int, TopicConfig]] = {}   # (group, topic) → same
        self.pull_subs: dict[tuple, tuple[int, Subscription]] = {}   # a pull's (topic, expression, …) → same
        ip = ipaddress.ip_address(config.brokerIP1).packed
        self.msgid_prefix = (ip + config.listenPort.to_bytes(4, "big")).hex().upper()
        self.cluster_prop = f"CLUSTER\x01{config.brokerClusterName}"
        self.delay_levels = config.delay_levels_ms
        self.boot_ms = int(time.time() * 1000)
        self.put_count = 0
        self.stats = RuntimeStats(store, cb)       # putTps, getTransferedTps, disk use
        # pulls check records further than this behind the write position
        # (read from disk, not the page cache this broker wrote: checkCRCOnRead)
        sc = config.store
        self.in_memory_bytes = (_physical_memory() * sc.accessMessageInMemoryMaxRatio // 100
                                if sc.checkCRCOnRead else 1 << 62)
        self.corrupt_seen: dict[int, str] = {}      # phy → why, of records pulls refused
        self.damage_log = DamageLog(store.files, store.root)
        self.damage_stamp = (0, 0)
        self.damaged: list[tuple[int, int, str]] = []   # ranges the scrub found: never served
        self.index: IndexService | None = None      # opened on the first query
        self.subs: dict[tuple[str, str], Subscription] = {}
        self.group_peers: dict[str, dict[str, Peer]] = {}     # group → client id → its peer
        self.producer_peers: dict[int, Peer] = {}             # peer id → a producer's peer
        self.notified: dict[str, list[str]] = {}
        self.seen_clients_epoch = -1
        self.seen_resets: dict[bytes, int] = {}
        self.seen_notices_epoch = -1
        self.due = False      # clients changed or a notice was posted: the driver runs notices()

    def reload_damage(self) -> None:
        """Once a second: the ranges the scrub listed, if the list changed."""
        stamp = self.damage_log.stamp()
        if stamp != self.damage_stamp:
            self.damage_stamp = stamp
            self.damaged = self.damage_log.load()

    # ------------------------------------------------------------- checks
    def remembered(self, cache: dict, key, check, *args):
        """``check(*args)``'s answer for ``key`` (a topic's config once a send or
        a pull to it passed its checks), remembered until the tables change:
        the topic, group and broker tables all move config_epoch. A refusal
        (BadRequest) is not remembered."""
        epoch = self.store.state.get("config_epoch")
        hit = cache.get(key)
        if hit is not None and hit[0] == epoch:
            return hit[1]
        value = check(*args)
        if len(cache) >= CHECKS_REMEMBERED:
            cache.clear()
        cache[key] = (self.store.state.get("config_epoch"), value)   # after any auto-create
        return value

    def check_writable(self) -> None:
        if not self.tables.broker_permission() & PERM_WRITE:
            raise BadRequest(R.NO_PERMISSION, f"the broker[{self.config.brokerName}] sending "
                                              f"message is forbidden")

    def check_disk(self) -> None:
        """Every write a client asks for (send, send-back, end of a
        transaction) is refused while the disk is full, and on a slave
        (RocketMQ's checkStoreStatus: the same code and remark), before it appends."""
        full = self.store.state.get("disk_full")   # published by the flusher (core/retention.py)
        if full or self.config.brokerRole == SLAVE:
            raise BadRequest(R.SERVICE_NOT_AVAILABLE, disk_full_remark(full / 10_000))


# ------------------------------------------------------------------ replies
def json_reply(cmd: RemotingCommand, obj, code: int = R.SUCCESS) -> RemotingCommand:
    return cmd.reply(code, body=orjson.dumps(obj))


def json_body(cmd: RemotingCommand) -> dict:
    """The request body as a JSON object (fastjson's unquoted keys too)."""
    try:
        data = orjson.loads(cmd.body)
    except orjson.JSONDecodeError:
        try:
            data = parse_json_lenient(bytes(cmd.body).decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(R.SYSTEM_ERROR, f"the request body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise BadRequest(R.SYSTEM_ERROR, "the request body is not a JSON object")
    return data


def int_or(v, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default
