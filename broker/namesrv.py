"""The NameServer's request logic, sans I/O: a command in, a reply out.

A socket reactor feeds ``NameServer.process(cmd, peer)`` with each decoded
request and the id of the connection it came on, sends back what it returns
(``None`` for oneway requests), calls ``scan_expired()`` every 10 s and
``connection_closed(peer)`` when a connection goes away. Nothing here touches
a socket or a clock other than the injected ``clock_ms``.

The route tables (RocketMQ's RouteInfoManager, reference §3.10, §4.1)::

    topics    topic -> {brokerName -> QueueData(read, write, perm, sysFlag)}
              filled from each master's registered topicConfigTable
    brokers   brokerName -> BrokerData(cluster, {brokerId -> "ip:port"}); id 0 = master
    clusters  clusterName -> {brokerName}
    live      brokerAddr -> Live(last registration ms, DataVersion, peer, haServerAddr)
    filters   brokerAddr -> [filter server addr]   (kept only to echo in routes)
    kv        namespace -> {key -> value}          (PUT/GET_KV_CONFIG; in memory only)

Registration (REGISTER_BROKER) adds the broker name to its cluster, its
address under its id (an address that changes id, a slave promoted to master,
loses its old id), and refreshes ``live``. A master's topic table replaces
that broker name's queue data, topics it no longer lists included, but only
when the broker is new or its DataVersion changed: a periodic re-registration
with the same version is a heartbeat, so a WIPE_WRITE_PERM survives it as in
RocketMQ. Slaves' topic tables are ignored; a slave's reply names its live
master (``masterAddr``, ``haServerAddr``).

A broker address leaves when it unregisters (by id), when it has not
re-registered for ``broker_expire_ms`` (``scan_expired``), or when the
connection it last registered on closes (``connection_closed``). A broker name
with no address left leaves its cluster and every topic's queue data; a topic
with no queue data left is gone (TOPIC_NOT_EXIST).

With ACL on (``acl``: the broker's plain_acl.yml, broker/acl.py), the
requests that change the tables (``GUARDED``: registration, perms, topic
deletion, KV) need an admin account's signature or a white-listed address,
so no one can forge a broker's registration; a refusal is the broker's
(SYSTEM_ERROR, the AclException text).

Replies: routes are standard JSON with quoted ``brokerAddrs`` keys and
``topicSysFlag`` (what 4.9.4+ Java clients get; GO, CPP and ali-ons read it
too). Normal replies mirror the request's serialization; remoting-level errors
(unknown code, a bad or missing header field, anything unexpected) are JSON
SYSTEM_ERROR / REQUEST_CODE_NOT_SUPPORTED as in RocketMQ, so nothing a client
sends makes ``process`` raise. Incoming JSON bodies may carry fastjson's
unquoted numeric map keys.
"""
from __future__ import annotations

import logging
import re
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import orjson

from shmq.ipc.codes import RequestCode, ResponseCode, not_supported_remark
from shmq.ipc.headers import BadRequest
from shmq.ipc.remoting import FLAG_ONEWAY, JSON, ROCKETMQ, RemotingCommand

from .acl import Acl, denied

log = logging.getLogger(__name__)

MASTER_ID = 0
PERM_WRITE = 0x2
DEFAULT_PERM = 0x6                         # PERM_READ | PERM_WRITE
DEFAULT_QUEUE_NUMS = 16                    # TopicConfig.defaultRead/WriteQueueNums
TOPIC_SYS_FLAG_UNIT = 0x1
TOPIC_SYS_FLAG_UNIT_SUB = 0x2
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"  # KV namespace of orderTopicConf
BROKER_EXPIRE_MS = 120_000                 # RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME
INFLATED_BYTES_MAX = 64 * 1024 * 1024      # a compressed register body may not inflate past this

# With ACL on, only an admin account of plain_acl.yml (a broker signing with
# its accessKey/secretKey, or shmq admin with the same) or a white-listed
# address may change the tables: register, unregister, perms, topics, KV.
# Routes and lists stay open to every client, as in RocketMQ.
GUARDED = frozenset({RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER,
                     RequestCode.QUERY_DATA_VERSION, RequestCode.WIPE_WRITE_PERM_OF_BROKER,
                     RequestCode.ADD_WRITE_PERM_OF_BROKER, RequestCode.DELETE_TOPIC_IN_NAMESRV,
                     RequestCode.PUT_KV_CONFIG, RequestCode.DELETE_KV_CONFIG})

_I32 = struct.Struct(">i")
_DECIMAL = re.compile(r"[+-]?[0-9]+")


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
class BrokerData:
    cluster: str
    broker_name: str
    addrs: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"brokerAddrs": {str(i): a for i, a in sorted(self.addrs.items())},
                "brokerName": self.broker_name, "cluster": self.cluster}


@dataclass
class Live:
    last_update_ms: int
    data_version: dict | None
    peer: str
    ha_addr: str


@dataclass
class RegisterBody:
    topics: dict[str, QueueData] | None    # None: the request had no body (keep the queue data)
    data_version: dict | None
    filter_servers: list[str]


# ------------------------------------------------------------------ the tables
class NameServer:
    def __init__(self, clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 broker_expire_ms: int = BROKER_EXPIRE_MS, acl: Acl | None = None):
        self.clock_ms = clock_ms
        self.acl = acl
        self.broker_expire_ms = broker_expire_ms
        self.topics: dict[str, dict[str, QueueData]] = {}
        self.brokers: dict[str, BrokerData] = {}
        self.clusters: dict[str, set[str]] = {}
        self.live: dict[str, Live] = {}
        self.filters: dict[str, list[str]] = {}
        self.kv: dict[str, dict[str, str]] = {}
        R = RequestCode
        self._handlers: dict[int, Callable[[RemotingCommand, str], RemotingCommand]] = {
            R.PUT_KV_CONFIG: self._put_kv,
            R.GET_KV_CONFIG: self._get_kv,
            R.DELETE_KV_CONFIG: self._delete_kv,
            R.GET_KVLIST_BY_NAMESPACE: self._get_kv_list,
            R.REGISTER_BROKER: self._register,
            R.UNREGISTER_BROKER: self._unregister,
            R.QUERY_DATA_VERSION: self._query_data_version,
            R.GET_ROUTEINFO_BY_TOPIC: self._route,
            R.GET_BROKER_CLUSTER_INFO: self._cluster_info,
            R.WIPE_WRITE_PERM_OF_BROKER: self._wipe_write_perm,
            R.ADD_WRITE_PERM_OF_BROKER: self._add_write_perm,
            R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._all_topics,
            R.DELETE_TOPIC_IN_NAMESRV: self._delete_topic,
            R.GET_TOPICS_BY_CLUSTER: self._topics_by_cluster,
            R.GET_SYSTEM_TOPIC_LIST_FROM_NS: self._system_topics,
            R.GET_UNIT_TOPIC_LIST: self._unit_topics,
            R.GET_HAS_UNIT_SUB_TOPIC_LIST: self._unit_sub_topics,
            R.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST: self._unit_sub_ununit_topics,
        }

    # -------------------------------------------------------------- entry points
    def process(self, cmd: RemotingCommand, peer: str) -> RemotingCommand | None:
        """Handle one request from connection ``peer``; the reply, or None for a
        oneway request (and for a stray response). Never raises."""
        if cmd.is_response:
            return None
        handler = self._handlers.get(cmd.code)
        try:
            why = None
            if self.acl is not None and cmd.code in GUARDED:
                why = self.acl.check(peer.rpartition(":")[0], cmd, admin=True)
            if why is not None:
                log.warning("namesrv: request %d from %s refused: %s", cmd.code, peer, why)
                reply = denied(cmd, why)
            elif handler is None:
                reply = _error(cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, not_supported_remark(cmd.code))
            else:
                reply = handler(cmd, peer)
        except BadRequest as e:
            reply = _error(cmd, e.code, e.remark)
        except Exception as e:     # a bug here must not take the NameServer down
            log.exception("namesrv: request code %s from %s failed", cmd.code, peer)
            reply = _error(cmd, ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
        return None if cmd.flag & FLAG_ONEWAY else reply

    def scan_expired(self) -> list[str]:
        """Drop the broker addresses that have not registered for
        ``broker_expire_ms``; returns them. The reactor may close their peers."""
        now = self.clock_ms()
        gone = [a for a, lv in self.live.items() if lv.last_update_ms + self.broker_expire_ms < now]
        for addr in gone:
            log.warning("namesrv: broker %s expired (silent %d ms)", addr, now - self.live[addr].last_update_ms)
            self._drop_addr(addr)
        return gone

    def connection_closed(self, peer: str) -> None:
        """The connection ``peer`` closed: drop every broker address that last registered on it."""
        for addr in [a for a, lv in self.live.items() if lv.peer == peer]:
            log.info("namesrv: broker %s left with its connection %s", addr, peer)
            self._drop_addr(addr)

    def topic_route(self, topic: str) -> dict | None:
        """TopicRouteData as a JSON-ready dict, or None if no live broker serves ``topic``."""
        per_broker = self.topics.get(topic)
        if not per_broker:
            return None
        names = sorted(per_broker)
        brokers = [self.brokers[n] for n in names if n in self.brokers]
        if not brokers:
            return None
        route = {"brokerDatas": [b.to_json() for b in brokers],
                 "filterServerTable": {a: self.filters[a] for b in brokers for a in b.addrs.values()
                                       if self.filters.get(a)},
                 "queueDatas": [per_broker[n].to_json() for n in names]}
        order_conf = self.kv.get(ORDER_TOPIC_CONFIG, {}).get(topic)
        if order_conf is not None:
            route["orderTopicConf"] = order_conf
        return route

    # -------------------------------------------------------------- table updates
    def register(self, cluster: str, broker_name: str, broker_addr: str, broker_id: int,
                 ha_addr: str, peer: str, body: RegisterBody) -> tuple[str, str] | None:
        """Apply one registration; returns (haServerAddr, masterAddr) of the live
        master for a slave, else None."""
        self.clusters.setdefault(cluster, set()).add(broker_name)
        bd = self.brokers.get(broker_name)
        first = bd is None
        if bd is None:
            bd = self.brokers[broker_name] = BrokerData(cluster, broker_name)
        for old_id in [i for i, a in bd.addrs.items() if a == broker_addr and i != broker_id]:
            del bd.addrs[old_id]
        first = first or broker_id not in bd.addrs
        bd.addrs[broker_id] = broker_addr
        if body.topics is not None and broker_id == MASTER_ID and \
                (first or self._version_changed(broker_addr, body.data_version)):
            self._replace_topics(broker_name, body.topics)
        self.live[broker_addr] = Live(self.clock_ms(), body.data_version, peer, ha_addr)
        if body.filter_servers:
            self.filters[broker_addr] = list(body.filter_servers)
        else:
            self.filters.pop(broker_addr, None)
        if broker_id != MASTER_ID:
            master = bd.addrs.get(MASTER_ID)
            if master is not None and master in self.live:
                return self.live[master].ha_addr, master
        return None

    def unregister(self, cluster: str, broker_name: str, broker_addr: str, broker_id: int) -> None:
        self.live.pop(broker_addr, None)
        self.filters.pop(broker_addr, None)
        bd = self.brokers.get(broker_name)
        if bd is not None:
            bd.addrs.pop(broker_id, None)
            if not bd.addrs:
                self._forget_broker_name(broker_name)

    def _version_changed(self, broker_addr: str, version: dict | None) -> bool:
        lv = self.live.get(broker_addr)
        return lv is None or lv.data_version is None or version is None or \
            _version_key(lv.data_version) != _version_key(version)

    def _replace_topics(self, broker_name: str, topics: dict[str, QueueData]) -> None:
        for topic, qd in topics.items():
            self.topics.setdefault(topic, {})[broker_name] = replace(qd, broker_name=broker_name)
        for topic in [t for t, m in self.topics.items() if broker_name in m and t not in topics]:
            self._drop_queue_data(topic, broker_name)

    def _drop_queue_data(self, topic: str, broker_name: str) -> None:
        per_broker = self.topics.get(topic)
        if per_broker is not None:
            per_broker.pop(broker_name, None)
            if not per_broker:
                del self.topics[topic]

    def _drop_addr(self, addr: str) -> None:
        self.live.pop(addr, None)
        self.filters.pop(addr, None)
        for name, bd in list(self.brokers.items()):
            for i in [i for i, a in bd.addrs.items() if a == addr]:
                del bd.addrs[i]
            if not bd.addrs:
                self._forget_broker_name(name)

    def _forget_broker_name(self, broker_name: str) -> None:
        self.brokers.pop(broker_name, None)
        for cluster, names in list(self.clusters.items()):
            names.discard(broker_name)
            if not names:
                del self.clusters[cluster]
        for topic in [t for t, m in self.topics.items() if broker_name in m]:
            self._drop_queue_data(topic, broker_name)

    # -------------------------------------------------------------- broker requests
    def _register(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        cluster = _need(cmd, "clusterName")
        name = _need(cmd, "brokerName")
        addr = _need(cmd, "brokerAddr")
        broker_id = _need_int(cmd, "brokerId")
        ha_addr = cmd.ext.get("haServerAddr", "")   # required by Java; binary headers drop ""
        crc = _opt_int(cmd, "bodyCrc32", 0)
        body = bytes(cmd.body)
        if crc != 0 and zlib.crc32(body) & 0x7FFFFFFF != crc:
            return _reply(cmd, ResponseCode.SYSTEM_ERROR, "crc32 not match")
        compressed = _opt_bool(cmd, "compressed")
        parsed = decode_register_body(body, compressed) if body else RegisterBody(None, None, [])
        master = self.register(cluster, name, addr, broker_id, ha_addr, peer, parsed)
        ext = {"haServerAddr": master[0], "masterAddr": master[1]} if master else {}
        return _reply(cmd, ResponseCode.SUCCESS, ext=ext, body=self._kv_table(ORDER_TOPIC_CONFIG))

    def _unregister(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        self.unregister(_need(cmd, "clusterName"), _need(cmd, "brokerName"), _need(cmd, "brokerAddr"),
                        _need_int(cmd, "brokerId"))
        return _reply(cmd, ResponseCode.SUCCESS)

    def _query_data_version(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        _need(cmd, "clusterName")
        _need(cmd, "brokerName")
        _need_int(cmd, "brokerId")
        addr = _need(cmd, "brokerAddr")
        version = _data_version(_loads(bytes(cmd.body), "DataVersion")) if cmd.body else None
        changed = self._version_changed(addr, version)
        lv = self.live.get(addr)
        if not changed and lv is not None:
            lv.last_update_ms = self.clock_ms()
        body = orjson.dumps(lv.data_version) if lv is not None and lv.data_version is not None else b""
        return _reply(cmd, ResponseCode.SUCCESS, ext={"changed": "true" if changed else "false"}, body=body)

    # -------------------------------------------------------------- client / admin requests
    def _route(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        topic = _need(cmd, "topic")
        route = self.topic_route(topic)
        if route is None:
            return _reply(cmd, ResponseCode.TOPIC_NOT_EXIST,
                          f"No topic route info in name server for the topic: {topic}")
        return _reply(cmd, ResponseCode.SUCCESS, body=_dumps(route))

    def _cluster_info(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        info = {"brokerAddrTable": {n: b.to_json() for n, b in self.brokers.items()},
                "clusterAddrTable": {c: sorted(ns) for c, ns in self.clusters.items()}}
        return _reply(cmd, ResponseCode.SUCCESS, body=_dumps(info))

    def _all_topics(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        return _topic_list(cmd, self.topics)

    def _topics_by_cluster(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        names = self.clusters.get(_need(cmd, "cluster"), set())
        return _topic_list(cmd, [t for t, m in self.topics.items() if names & m.keys()])

    def _system_topics(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        found: list[str] = []
        for cluster, names in self.clusters.items():
            found += [cluster, *names]
        addr = next((a for b in self.brokers.values() for a in b.addrs.values()), None)
        return _topic_list(cmd, found, addr)

    def _unit_topics(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        return _topic_list(cmd, self._topics_with_flags(lambda f: bool(f & TOPIC_SYS_FLAG_UNIT)))

    def _unit_sub_topics(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        return _topic_list(cmd, self._topics_with_flags(lambda f: bool(f & TOPIC_SYS_FLAG_UNIT_SUB)))

    def _unit_sub_ununit_topics(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        return _topic_list(cmd, self._topics_with_flags(
            lambda f: bool(f & TOPIC_SYS_FLAG_UNIT_SUB) and not f & TOPIC_SYS_FLAG_UNIT))

    def _topics_with_flags(self, test: Callable[[int], bool]) -> list[str]:
        return [t for t, m in self.topics.items() if m and test(m[min(m)].topic_sys_flag)]

    def _delete_topic(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        topic = _need(cmd, "topic")
        cluster = cmd.ext.get("clusterName")
        if cluster and cluster in self.clusters:      # only that cluster's brokers (5.x)
            for name in self.clusters[cluster]:
                self._drop_queue_data(topic, name)
        else:
            self.topics.pop(topic, None)
        return _reply(cmd, ResponseCode.SUCCESS)

    def _wipe_write_perm(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        n = self._set_write_perm(_need(cmd, "brokerName"), False)
        return _reply(cmd, ResponseCode.SUCCESS, ext={"wipeTopicCount": str(n)})

    def _add_write_perm(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        n = self._set_write_perm(_need(cmd, "brokerName"), True)
        return _reply(cmd, ResponseCode.SUCCESS, ext={"addTopicCount": str(n)})

    def _set_write_perm(self, broker_name: str, writable: bool) -> int:
        n = 0
        for per_broker in self.topics.values():
            qd = per_broker.get(broker_name)
            if qd is not None:
                qd.perm = qd.perm | PERM_WRITE if writable else qd.perm & ~PERM_WRITE
                n += 1
        return n

    # -------------------------------------------------------------- KV config
    def _put_kv(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        ns, key, value = _need(cmd, "namespace"), _need(cmd, "key"), _need(cmd, "value")
        self.kv.setdefault(ns, {})[key] = value
        return _reply(cmd, ResponseCode.SUCCESS)

    def _get_kv(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        ns, key = _need(cmd, "namespace"), _need(cmd, "key")
        value = self.kv.get(ns, {}).get(key)
        if value is None:
            return _reply(cmd, ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {ns} Key: {key}")
        return _reply(cmd, ResponseCode.SUCCESS, ext={"value": value})

    def _delete_kv(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        ns, key = _need(cmd, "namespace"), _need(cmd, "key")
        table = self.kv.get(ns)
        if table is not None:
            table.pop(key, None)
            if not table:
                del self.kv[ns]
        return _reply(cmd, ResponseCode.SUCCESS)

    def _get_kv_list(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        ns = _need(cmd, "namespace")
        if not self.kv.get(ns):
            return _reply(cmd, ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {ns}")
        return _reply(cmd, ResponseCode.SUCCESS, body=self._kv_table(ns))

    def _kv_table(self, ns: str) -> bytes:
        return _dumps({"table": self.kv.get(ns, {})})


# ------------------------------------------------------------------ replies and headers
def _reply(cmd: RemotingCommand, code: int, remark: str | None = None, ext: dict[str, str] | None = None,
           body: bytes = b"") -> RemotingCommand:
    reply = cmd.reply(int(code), remark, ext, body)
    if reply.serialize_type not in (JSON, ROCKETMQ):
        reply.serialize_type = JSON
    return reply


def _bad(remark: str) -> BadRequest:
    """A request the NameServer cannot act on: SYSTEM_ERROR with ``remark``."""
    return BadRequest(ResponseCode.SYSTEM_ERROR, remark)


def _error(cmd: RemotingCommand, code: int, remark: str) -> RemotingCommand:
    reply = cmd.reply(int(code), remark)
    reply.serialize_type = JSON
    return reply


def _topic_list(cmd: RemotingCommand, topics, broker_addr: str | None = None) -> RemotingCommand:
    body: dict = {"topicList": sorted(set(topics))}
    if broker_addr is not None:
        body["brokerAddr"] = broker_addr
    return _reply(cmd, ResponseCode.SUCCESS, body=_dumps(body))


def _need(cmd: RemotingCommand, name: str) -> str:
    value = cmd.ext.get(name)
    if value is None:
        raise _bad(f"the custom field <{name}> is null")
    return value


def _parse_int(name: str, value: str) -> int:
    if not _DECIMAL.fullmatch(value):                       # as Long.parseLong: no spaces, no "_"
        raise _bad(f"the custom field <{name}> is not an integer: {value!r}")
    n = int(value)
    if not -2**63 <= n < 2**63:
        raise _bad(f"the custom field <{name}> is out of the int64 range: {value!r}")
    return n


def _need_int(cmd: RemotingCommand, name: str) -> int:
    return _parse_int(name, _need(cmd, name))


def _opt_int(cmd: RemotingCommand, name: str, default: int) -> int:
    value = cmd.ext.get(name)
    return default if value is None or value == "" else _parse_int(name, value)


def _opt_bool(cmd: RemotingCommand, name: str) -> bool:
    return cmd.ext.get(name, "").strip().lower() == "true"    # Boolean.parseBoolean


def _dumps(obj) -> bytes:
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


def _loads(raw: bytes, what: str):
    """JSON as Java tools write it: standard, or fastjson with unquoted keys."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return orjson.loads(quote_bare_keys(raw.decode("utf-8")))
    except (UnicodeDecodeError, orjson.JSONDecodeError) as e:
        raise _bad(f"Failed to decode {what}: {e}") from None


def _int_of(obj: dict, key: str, default: int, what: str) -> int:
    v = obj.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise _bad(f"Failed to decode {what}: {key} is not an integer: {v!r}")
    try:
        n = int(v)
    except ValueError:
        raise _bad(f"Failed to decode {what}: {key} is not an integer: {v!r}") from None
    if not -2**63 <= n < 2**63:
        raise _bad(f"Failed to decode {what}: {key} is out of the int64 range: {n}")
    return n


def _data_version(obj) -> dict:
    if not isinstance(obj, dict):
        raise _bad("Failed to decode DataVersion: not an object")
    dv = {"counter": _int_of(obj, "counter", 0, "DataVersion"),
          "timestamp": _int_of(obj, "timestamp", 0, "DataVersion")}
    if "stateVersion" in obj:                                 # 5.x
        dv["stateVersion"] = _int_of(obj, "stateVersion", 0, "DataVersion")
    return dv


def _version_key(dv: dict) -> tuple[int, int, int]:
    return dv["timestamp"], dv.get("stateVersion", 0), dv["counter"]


def _queue_data(broker_name: str, topic: str, cfg) -> QueueData:
    what = f"RegisterBrokerBody: topic config {topic!r}"
    if not isinstance(cfg, dict):
        raise _bad(f"Failed to decode {what}: not an object")
    return QueueData(broker_name=broker_name,
                     read_queue_nums=_int_of(cfg, "readQueueNums", DEFAULT_QUEUE_NUMS, what),
                     write_queue_nums=_int_of(cfg, "writeQueueNums", DEFAULT_QUEUE_NUMS, what),
                     perm=_int_of(cfg, "perm", DEFAULT_PERM, what),
                     topic_sys_flag=_int_of(cfg, "topicSysFlag", 0, what))


def decode_register_body(body: bytes, compressed: bool) -> RegisterBody:
    """RegisterBrokerBody: fastjson JSON, or (compressed) Java's zlib stream of
    int32-length-prefixed DataVersion JSON, topic count, "name read write perm
    FILTERTYPE" lines and the filter server list JSON. The queue data it
    returns has an empty broker name; registration fills it in."""
    if compressed:
        return _decode_compressed(body)
    obj = _loads(body, "RegisterBrokerBody")
    if not isinstance(obj, dict):
        raise _bad("Failed to decode RegisterBrokerBody: not an object")
    wrapper = obj.get("topicConfigSerializeWrapper")
    if wrapper is None and "topicConfigTable" in obj:         # pre-3.0.11 brokers sent the wrapper alone
        wrapper = obj
    wrapper = wrapper or {}
    if not isinstance(wrapper, dict):
        raise _bad("Failed to decode RegisterBrokerBody: topicConfigSerializeWrapper is not an object")
    table = wrapper.get("topicConfigTable") or {}
    if not isinstance(table, dict):
        raise _bad("Failed to decode RegisterBrokerBody: topicConfigTable is not an object")
    topics = {}
    for key, cfg in table.items():
        name = cfg.get("topicName") if isinstance(cfg, dict) else None
        topics[name if isinstance(name, str) and name else key] = _queue_data("", key, cfg)
    dv = wrapper.get("dataVersion")
    filters = obj.get("filterServerList") or []
    if not isinstance(filters, list):
        raise _bad("Failed to decode RegisterBrokerBody: filterServerList is not a list")
    return RegisterBody(topics, _data_version(dv) if dv is not None else None, [str(f) for f in filters])


def _decode_compressed(body: bytes) -> RegisterBody:
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(body, INFLATED_BYTES_MAX)
    except zlib.error as e:
        raise _bad(f"Failed to decode RegisterBrokerBody: {e}") from None
    if inflater.unconsumed_tail:
        raise _bad(f"Failed to decode RegisterBrokerBody: inflates past {INFLATED_BYTES_MAX} bytes")
    pos = 0

    def chunk() -> bytes:
        nonlocal pos
        if pos + 4 > len(raw):
            raise _bad("Failed to decode RegisterBrokerBody: End of compressed data has reached")
        (size,) = _I32.unpack_from(raw, pos)
        if size < 0 or pos + 4 + size > len(raw):
            raise _bad("Failed to decode RegisterBrokerBody: End of compressed data has reached")
        pos += 4 + size
        return raw[pos - size:pos]

    dv = _data_version(_loads(chunk(), "DataVersion"))
    if pos + 4 > len(raw):
        raise _bad("Failed to decode RegisterBrokerBody: End of compressed data has reached")
    (count,) = _I32.unpack_from(raw, pos)
    pos += 4
    topics = {}
    for _ in range(max(count, 0)):
        line = chunk().decode("utf-8", "replace")
        parts = line.split(" ", 5)
        if len(parts) < 5:
            raise _bad(f"Failed to decode RegisterBrokerBody: bad topic config {line!r}")
        name, read, write, perm = parts[:4]
        topics[name] = _queue_data("", name, {"readQueueNums": read, "writeQueueNums": write, "perm": perm})
    filters = _loads(chunk(), "filterServerList")     # 5.x appends static-topic mappings: ignored
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


# ------------------------------------------------------------------ process
def listen(host: str, port: int):
    """The NameServer's listening socket (OSError if the port is taken)."""
    import socket
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind((host, port))
        lsock.listen(1024)
    except OSError:
        lsock.close()
        raise
    return lsock


def serve(host: str, port: int, parent_pid: int | None = None, on_ready=None, lsock=None,
          acl_file: str | None = None) -> None:
    """Run a NameServer on ``host:port`` until SIGTERM (``shmq namesrv``, or
    the broker's embedded one, which dies with its parent and is handed the
    listening socket ``lsock`` its parent bound). ``acl_file``: plain_acl.yml,
    whose admin accounts alone may send the GUARDED requests."""
    import signal

    from .reactor import Reactor
    from shmq.ipc.control import die_with_parent, set_process_name
    from shmq.ipc.remoting import encode

    if parent_pid is not None:
        die_with_parent(parent_pid)
        set_process_name("shmq-namesrv")
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s namesrv %(levelname)s %(name)s %(message)s")
    ns = NameServer(acl=Acl(acl_file) if acl_file else None)
    reactor = Reactor()
    if lsock is None:
        lsock = listen(host, port)
    lsock.setblocking(False)

    def on_command(conn, cmd):
        reply = ns.process(cmd, conn.peer)
        if reply is not None:
            conn.send(encode(reply))

    def on_accept():
        try:
            sock, addr = lsock.accept()
        except (BlockingIOError, InterruptedError):
            return
        reactor.add_connection(sock, f"{addr[0]}:{addr[1]}", on_command,
                               lambda conn: ns.connection_closed(conn.peer))

    reactor.add_reader(lsock, on_accept)
    reactor.every(10.0, ns.scan_expired)
    reactor.every(30.0, lambda: reactor.close_idle(120))

    def on_term(signum, frame):
        reactor.stopping = True

    signal.signal(signal.SIGTERM, on_term)
    reactor.wake_on_signals()
    if parent_pid is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if on_ready is not None:
        on_ready(lsock.getsockname())
    try:
        reactor.run()
    finally:
        reactor.close()
        lsock.close()
