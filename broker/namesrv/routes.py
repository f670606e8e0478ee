"""The NameServer's route tables and request logic, sans I/O: a command in, a reply out.

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

Settings (GET_NAMESRV_CONFIG, UPDATE_NAMESRV_CONFIG; a properties body):
``listenPort`` and ``aclEnable`` are the process's, fixed at start;
``orderMessageEnable`` (NamesrvConfig's) changes at runtime: whether routes
carry ``orderTopicConf`` from the KV table (default false, as RocketMQ's). An update names every key it cannot apply and applies none; like
the KV table, an update lasts as long as the process.

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
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import orjson

from shmq.ipc.codes import RequestCode, ResponseCode, not_supported_remark
from shmq.ipc.headers import BadRequest
from shmq.ipc.remoting import FLAG_ONEWAY, JSON, ROCKETMQ, RemotingCommand

from ..acl import Acl, denied
from ..config import parse_conf
from .bodies import (QueueData, RegisterBody, bad, data_version,
                     decode_register_body, dumps, loads, version_key)

log = logging.getLogger("shmq.broker.namesrv")

MASTER_ID = 0
PERM_WRITE = 0x2
TOPIC_SYS_FLAG_UNIT = 0x1
TOPIC_SYS_FLAG_UNIT_SUB = 0x2
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"  # KV namespace of orderTopicConf
RUNTIME_SETTINGS = frozenset({"orderMessageEnable"})   # UPDATE_NAMESRV_CONFIG may change
BROKER_EXPIRE_MS = 120_000                 # RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME

# With ACL on, only an admin account of plain_acl.yml (a broker signing with
# its accessKey/secretKey, or shmq admin with the same) or a white-listed
# address may change the tables: register, unregister, perms, topics, KV.
# Routes and lists stay open to every client, as in RocketMQ.
GUARDED = frozenset({RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER,
                     RequestCode.QUERY_DATA_VERSION, RequestCode.WIPE_WRITE_PERM_OF_BROKER,
                     RequestCode.ADD_WRITE_PERM_OF_BROKER, RequestCode.DELETE_TOPIC_IN_NAMESRV,
                     RequestCode.PUT_KV_CONFIG, RequestCode.DELETE_KV_CONFIG,
                     RequestCode.UPDATE_NAMESRV_CONFIG})

_DECIMAL = re.compile(r"[+-]?[0-9]+")


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


# ------------------------------------------------------------------ the tables
class NameServer:
    def __init__(self, clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 broker_expire_ms: int = BROKER_EXPIRE_MS, acl: Acl | None = None):
        self.clock_ms = clock_ms
        self.acl = acl
        # listenPort: set by the process that listens (server.serve)
        self.settings = {"listenPort": 0, "aclEnable": acl is not None,
                         "orderMessageEnable": False}
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
            R.GET_NAMESRV_CONFIG: self._get_config,
            R.UPDATE_NAMESRV_CONFIG: self._update_config,
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
        if order_conf is not None and self.settings["orderMessageEnable"]:
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
            version_key(lv.data_version) != version_key(version)

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
        version = data_version(loads(bytes(cmd.body), "DataVersion")) if cmd.body else None
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
        return _reply(cmd, ResponseCode.SUCCESS, body=dumps(route))

    def _cluster_info(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        info = {"brokerAddrTable": {n: b.to_json() for n, b in self.brokers.items()},
                "clusterAddrTable": {c: sorted(ns) for c, ns in self.clusters.items()}}
        return _reply(cmd, ResponseCode.SUCCESS, body=dumps(info))

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

    # -------------------------------------------------------------- settings
    def _get_config(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        text = "".join(f"{k}={_setting_text(v)}\n" for k, v in self.settings.items())
        return _reply(cmd, ResponseCode.SUCCESS, body=text.encode())

    def _update_config(self, cmd: RemotingCommand, peer: str) -> RemotingCommand:
        try:
            values = parse_conf(bytes(cmd.body).decode("utf-8"), "the request body")
        except (ValueError, UnicodeDecodeError) as e:
            raise bad(f"update name server config failed: {e}") from None
        unknown = sorted(set(values) - set(self.settings))
        if unknown:
            raise bad(f"update name server config failed: unknown settings {', '.join(unknown)} "
                      f"(the settings: {', '.join(self.settings)})")
        fixed = sorted(k for k, v in values.items()
                       if k not in RUNTIME_SETTINGS and v != _setting_text(self.settings[k]))
        if fixed:
            raise BadRequest(ResponseCode.NO_PERMISSION, f"{', '.join(fixed)} "
                             f"{'needs' if len(fixed) == 1 else 'need'} a restart (at runtime only "
                             f"{', '.join(sorted(RUNTIME_SETTINGS))} can change); nothing was updated")
        for k, v in values.items():
            if k in RUNTIME_SETTINGS and v.lower() not in ("true", "false"):
                raise bad(f"update name server config failed: {k}={v!r}: want true or false")
        for k, v in values.items():
            if k in RUNTIME_SETTINGS:
                self.settings[k] = v.lower() == "true"
        log.info("namesrv: config updated from %s: %s", peer, values)
        return _reply(cmd, ResponseCode.SUCCESS)

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
        return dumps({"table": self.kv.get(ns, {})})


# ------------------------------------------------------------------ replies and headers
def _reply(cmd: RemotingCommand, code: int, remark: str | None = None, ext: dict[str, str] | None = None,
           body: bytes = b"") -> RemotingCommand:
    reply = cmd.reply(int(code), remark, ext, body)
    if reply.serialize_type not in (JSON, ROCKETMQ):
        reply.serialize_type = JSON
    return reply


def _setting_text(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _error(cmd: RemotingCommand, code: int, remark: str) -> RemotingCommand:
    reply = cmd.reply(int(code), remark)
    reply.serialize_type = JSON
    return reply


def _topic_list(cmd: RemotingCommand, topics, broker_addr: str | None = None) -> RemotingCommand:
    body: dict = {"topicList": sorted(set(topics))}
    if broker_addr is not None:
        body["brokerAddr"] = broker_addr
    return _reply(cmd, ResponseCode.SUCCESS, body=dumps(body))


def _need(cmd: RemotingCommand, name: str) -> str:
    value = cmd.ext.get(name)
    if value is None:
        raise bad(f"the custom field <{name}> is null")
    return value


def _parse_int(name: str, value: str) -> int:
    if not _DECIMAL.fullmatch(value):                       # as Long.parseLong: no spaces, no "_"
        raise bad(f"the custom field <{name}> is not an integer: {value!r}")
    n = int(value)
    if not -2**63 <= n < 2**63:
        raise bad(f"the custom field <{name}> is out of the int64 range: {value!r}")
    return n


def _need_int(cmd: RemotingCommand, name: str) -> int:
    return _parse_int(name, _need(cmd, name))


def _opt_int(cmd: RemotingCommand, name: str, default: int) -> int:
    value = cmd.ext.get(name)
    return default if value is None or value == "" else _parse_int(name, value)


def _opt_bool(cmd: RemotingCommand, name: str) -> bool:
    return cmd.ext.get(name, "").strip().lower() == "true"    # Boolean.parseBoolean
