"""What ``shmq admin`` asks NameServers and brokers, over the RocketMQ 4.x remoting protocol.

``AdminClient`` is DefaultMQAdminExt's request side without its threads:
blocking calls (``ipc.channel.RemotingClient``), one connection per address
for the life of a command, every connect and every reply bounded by
``timeout`` seconds, every request signed with ``credentials`` if given
(an account of the brokers' ACL; admin requests need an admin one). It only speaks the protocol, so it works the same
against shmq and against a RocketMQ 4.x cluster.

It owns no output: methods return plain dicts and lists with RocketMQ's
field names. Anything that goes wrong a user could fix (an address that
does not answer, an unknown topic or group, a refusal with its response
code and remark) raises ``AdminError`` with a sentence naming it; bugs
raise anything else.

Bodies: routes and cluster info are standard JSON; the broker's
TopicStatsTable, ConsumeStats and ResetOffsetBody are fastjson maps keyed
by MessageQueue objects (``{{"brokerName":..,"queueId":..,"topic":..}:..}``),
read with ``shmq.ipc.fastjson.parse_fastjson``.
"""
from __future__ import annotations

import socket
from typing import Self

import orjson
from shmq.client.offsets import parse_offset_table
from shmq.client.requests import decode_records, pull_message
from shmq.core.records import CorruptRecord, StoredMessage
from shmq.ipc.channel import RemotingClient, RemotingTimeout
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.fastjson import parse_fastjson
from shmq.ipc.remoting import RemoteProtocolError, RemotingCommand
from shmq.ipc.signing import Credentials

MASTER_ID = "0"
PERM_WRITE, PERM_READ = 2, 4
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
TOOLS_CONSUMER = "TOOLS_CONSUMER"          # MixAll.TOOLS_CONSUMER_GROUP
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"  # the NameServer KV namespace of orderTopicConf
LONG_MAX = 2**63 - 1
QUERY_MAX_NUM = 64                         # what mqadmin's queryMsgByKey asks for
_CODE_NAMES = {int(c): c.name for c in R}


class AdminError(Exception):
    """A failure to report to the user (exit status 1)."""


def code_name(code: int) -> str:
    return _CODE_NAMES.get(code, "UNKNOWN")


def split_addrs(text: str) -> list[str]:
    """``host:port;host:port`` → addresses; ValueError naming a bad one."""
    out = []
    for a in text.split(";"):
        a = a.strip()
        if not a:
            continue
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{a!r} is not host:port")
        out.append(a)
    if not out:
        raise ValueError("no address given")
    return out


def decode_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """An offset message id (store host + CommitLog offset, reference §6.1) →
    (broker address, CommitLog offset); ValueError if it cannot be one."""
    s = msg_id.strip()
    try:
        raw = bytes.fromhex(s)
    except ValueError:
        raise ValueError(f"msgId {msg_id!r} is not hexadecimal") from None
    if len(raw) == 16:
        host = socket.inet_ntop(socket.AF_INET, raw[:4])
    elif len(raw) == 28:
        host = "[" + socket.inet_ntop(socket.AF_INET6, raw[:16]) + "]"
    else:
        raise ValueError(f"msgId {msg_id!r} has {len(s)} hex digits; an offset msgId has 32 (IPv4) "
                         f"or 56 (IPv6)")
    port = int.from_bytes(raw[-12:-8], "big")
    offset = int.from_bytes(raw[-8:], "big", signed=True)
    if not 0 < port < 65536 or offset < 0:
        raise ValueError(f"msgId {msg_id!r} decodes to port {port}, offset {offset}: not an "
                         f"offset msgId")
    return f"{host}:{port}", offset


class AdminClient:
    def __init__(self, namesrv: str, timeout: float = 3.0, credentials: Credentials | None = None):
        self.namesrvs = split_addrs(namesrv)
        self.timeout = timeout
        self.credentials = credentials
        self._conns: dict[str, RemotingClient] = {}

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ transport
    def call(self, addr: str, cmd: RemotingCommand, role: str = "broker",
             timeout: float | None = None) -> RemotingCommand:
        """``cmd`` to ``addr``; its reply, whatever its code. AdminError if
        ``addr`` cannot be reached or does not answer within the timeout
        (``timeout``, else the client's)."""
        conn = self._conns.get(addr)
        wait = timeout or self.timeout
        try:
            if conn is None:
                conn = self._conns[addr] = RemotingClient(addr, self.timeout, self.credentials)
            return conn.invoke(cmd, wait)
        except RemotingTimeout:
            self._drop(addr)
            raise AdminError(f"the {role} at {addr} did not answer within {wait:g} s") from None
        except RemoteProtocolError as e:   # an HTTP server, an HA port, …: another protocol
            self._drop(addr)
            raise AdminError(f"{addr} is not a {role}: it does not speak RocketMQ's remoting "
                             f"protocol ({e})") from None
        except OSError as e:               # refused, reset, unreachable
            self._drop(addr)
            raise AdminError(f"cannot reach the {role} at {addr}: "
                             f"{e.strerror or str(e) or type(e).__name__}") from None

    def _drop(self, addr: str) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.close()

    def expect(self, reply: RemotingCommand, what: str, addr: str) -> RemotingCommand:
        if reply.code != R.SUCCESS:
            raise AdminError(f"{what}: {addr} answered {code_name(reply.code)} ({reply.code}): "
                             f"{(reply.remark or '').strip() or 'no remark'}")
        return reply

    def namesrv_call(self, cmd: RemotingCommand) -> tuple[str, RemotingCommand]:
        """Ask the NameServers in turn until one answers: (its address, reply)."""
        errors = []
        for addr in self.namesrvs:
            try:
                return addr, self.call(addr, RemotingCommand(cmd.code, ext=dict(cmd.ext),
                                                             body=cmd.body), "NameServer")
            except AdminError as e:
                errors.append(str(e))
        raise AdminError("; ".join(errors))

    def broker_call(self, addr: str, cmd: RemotingCommand, what: str) -> RemotingCommand:
        return self.expect(self.call(addr, cmd), what, f"the broker at {addr}")

    @staticmethod
    def _json(reply: RemotingCommand, what: str):
        try:
            return orjson.loads(reply.body)
        except orjson.JSONDecodeError:
            try:
                return parse_fastjson(bytes(reply.body).decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise AdminError(f"{what}: the reply body is not JSON: {e}") from None

    # ------------------------------------------------------------ NameServer
    def route(self, topic: str) -> dict:
        """TopicRouteData of ``topic``; AdminError naming it if no NameServer routes it."""
        addr, r = self.namesrv_call(RemotingCommand(RC.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}))
        if r.code == R.TOPIC_NOT_EXIST:
            raise AdminError(f"topic {topic} does not exist: the NameServer at {addr} has no "
                             f"route for it")
        self.expect(r, f"route of topic {topic}", f"the NameServer at {addr}")
        return self._json(r, f"route of topic {topic}")

    def route_or_none(self, topic: str) -> dict | None:
        addr, r = self.namesrv_call(RemotingCommand(RC.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}))
        if r.code == R.TOPIC_NOT_EXIST:
            return None
        self.expect(r, f"route of topic {topic}", f"the NameServer at {addr}")
        return self._json(r, f"route of topic {topic}")

    def cluster_info(self) -> dict:
        addr, r = self.namesrv_call(RemotingCommand(RC.GET_BROKER_CLUSTER_INFO))
        self.expect(r, "cluster info", f"the NameServer at {addr}")
        data = self._json(r, "cluster info")
        data.setdefault("brokerAddrTable", {})
        data.setdefault("clusterAddrTable", {})
        return data

    def topic_list(self) -> list[str]:
        addr, r = self.namesrv_call(RemotingCommand(RC.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        self.expect(r, "topic list", f"the NameServer at {addr}")
        return sorted(self._json(r, "topic list").get("topicList") or [])

    def cluster_brokers(self, cluster: str, masters_only: bool = True) -> list[tuple[str, str, str]]:
        """(brokerName, brokerId, addr) of ``cluster``'s brokers (masters only
        by default), sorted; AdminError if the NameServer knows no such cluster."""
        info = self.cluster_info()
        names = info["clusterAddrTable"].get(cluster)
        if names is None:
            known = ", ".join(sorted(info["clusterAddrTable"])) or "none"
            raise AdminError(f"cluster {cluster} not found on the NameServer (clusters: {known})")
        out = []
        for name in sorted(names):
            addrs = (info["brokerAddrTable"].get(name) or {}).get("brokerAddrs") or {}
            for bid, addr in sorted(addrs.items(), key=lambda kv: int(kv[0])):
                if str(bid) == MASTER_ID or not masters_only:
                    out.append((name, str(bid), addr))
        return out

    @staticmethod
    def route_masters(route: dict) -> list[tuple[str, str]]:
        """(brokerName, master addr) of each broker in a route that has a master."""
        out = []
        for bd in sorted(route.get("brokerDatas") or [], key=lambda b: b["brokerName"]):
            addr = (bd.get("brokerAddrs") or {}).get(MASTER_ID)
            if addr:
                out.append((bd["brokerName"], addr))
        return out

    @staticmethod
    def route_readers(route: dict) -> list[tuple[str, str]]:
        """(brokerName, addr) of each broker in a route: its master, else its
        first slave (mqadmin's reads, BrokerData.selectBrokerAddr, take a
        slave at random): with a master down, queries, consumeMessage and
        printMsg read what its slave holds, as consumers do."""
        out = []
        for bd in sorted(route.get("brokerDatas") or [], key=lambda b: b["brokerName"]):
            addrs = bd.get("brokerAddrs") or {}
            if addrs:
                out.append((bd["brokerName"], addrs[min(addrs, key=int)]))
        return out

    def broker_of(self, route: dict, topic: str, broker_name: str, write: bool = False) -> str:
        """The address of ``broker_name`` in ``topic``'s route: to read from
        (its master, else a slave) or, ``write``, its master (sends, offset
        resets: a slave takes neither)."""
        for name, addr in self.route_readers(route):
            if name != broker_name:
                continue
            bd = next(b for b in route["brokerDatas"] if b["brokerName"] == name)
            if write and MASTER_ID not in bd["brokerAddrs"]:
                slaves = ", ".join(f"{bid} {a}" for bid, a in sorted(bd["brokerAddrs"].items()))
                raise AdminError(f"broker {broker_name} has no master in the route of topic "
                                 f"{topic} (only its slaves, brokerId {slaves}: is the master "
                                 f"down?)")
            return addr
        names = ", ".join(n for n, _ in self.route_readers(route)) or "none"
        raise AdminError(f"broker {broker_name} does not serve topic {topic} (its brokers: {names})")

    def delete_topic_in_namesrv(self, addr: str, topic: str, cluster: str) -> None:
        r = self.call(addr, RemotingCommand(RC.DELETE_TOPIC_IN_NAMESRV,
                                            ext={"topic": topic, "clusterName": cluster}), "NameServer")
        self.expect(r, f"delete topic {topic}", f"the NameServer at {addr}")

    def set_write_perm(self, addr: str, broker_name: str, writable: bool) -> int:
        code = RC.ADD_WRITE_PERM_OF_BROKER if writable else RC.WIPE_WRITE_PERM_OF_BROKER
        r = self.call(addr, RemotingCommand(code, ext={"brokerName": broker_name}), "NameServer")
        self.expect(r, ("add" if writable else "wipe") + f" write perm of broker {broker_name}",
                    f"the NameServer at {addr}")
        return int(r.ext.get("addTopicCount" if writable else "wipeTopicCount", "0"))

    def put_kv(self, namespace: str, key: str, value: str) -> None:
        for addr in self.namesrvs:
            r = self.call(addr, RemotingCommand(RC.PUT_KV_CONFIG, ext={
                "namespace": namespace, "key": key, "value": value}), "NameServer")
            self.expect(r, f"put {namespace}/{key}", f"the NameServer at {addr}")

    def namesrv_config(self, addr: str) -> dict[str, str]:
        """GET_NAMESRV_CONFIG: the NameServer's settings (a properties body)."""
        r = self.call(addr, RemotingCommand(RC.GET_NAMESRV_CONFIG), "NameServer")
        self.expect(r, "get name server config", f"the NameServer at {addr}")
        return parse_properties(bytes(r.body).decode("utf-8", "replace"))

    def update_namesrv_config(self, addr: str, key: str, value: str) -> None:
        r = self.call(addr, RemotingCommand(RC.UPDATE_NAMESRV_CONFIG,
                                            body=f"{key}={value}\n".encode()), "NameServer")
        self.expect(r, f"update name server config {key}", f"the NameServer at {addr}")

    # ------------------------------------------------------------ brokers
    def create_topic(self, addr: str, tc: dict) -> None:
        self.broker_call(addr, RemotingCommand(RC.UPDATE_AND_CREATE_TOPIC, ext={
            "topic": tc["topicName"], "defaultTopic": "TBW102",
            "readQueueNums": str(tc["readQueueNums"]), "writeQueueNums": str(tc["writeQueueNums"]),
            "perm": str(tc["perm"]), "topicFilterType": tc["topicFilterType"],
            "topicSysFlag": str(tc["topicSysFlag"]), "order": str(tc["order"]).lower()}),
            f"create topic {tc['topicName']}")

    def delete_topic_in_broker(self, addr: str, topic: str) -> None:
        self.broker_call(addr, RemotingCommand(RC.DELETE_TOPIC_IN_BROKER, ext={"topic": topic}),
                         f"delete topic {topic}")

    def create_group(self, addr: str, config: dict) -> None:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP with a SubscriptionGroupConfig body."""
        self.broker_call(addr, RemotingCommand(RC.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                               body=orjson.dumps(config)),
                         f"create subscription group {config['groupName']}")

    def delete_group(self, addr: str, group: str, remove_offset: bool) -> None:
        self.broker_call(addr, RemotingCommand(RC.DELETE_SUBSCRIPTIONGROUP, ext={
            "groupName": group, "removeOffset": str(remove_offset).lower()}),
            f"delete subscription group {group}")

    def clean_expired_cq(self, addr: str) -> dict[str, str]:
        """CLEAN_EXPIRED_CONSUMEQUEUE; the reply's ext (shmq says what it removed)."""
        return dict(self.broker_call(addr, RemotingCommand(RC.CLEAN_EXPIRED_CONSUMEQUEUE),
                                     "clean expired ConsumeQueues").ext)

    def delete_expired_commitlog(self, addr: str) -> dict[str, str]:
        """DELETE_EXPIRED_COMMITLOG; the reply's ext (shmq says what it deleted)."""
        return dict(self.broker_call(addr, RemotingCommand(RC.DELETE_EXPIRED_COMMITLOG),
                                     "delete expired CommitLog files").ext)

    def runtime_info(self, addr: str) -> dict[str, str]:
        r = self.broker_call(addr, RemotingCommand(RC.GET_BROKER_RUNTIME_INFO), "broker status")
        return dict(self._json(r, "broker status").get("table") or {})

    def broker_config(self, addr: str) -> dict[str, str]:
        r = self.broker_call(addr, RemotingCommand(RC.GET_BROKER_CONFIG), "get broker config")
        return parse_properties(bytes(r.body).decode("utf-8", "replace"))

    def update_broker_config(self, addr: str, key: str, value: str) -> None:
        self.broker_call(addr, RemotingCommand(RC.UPDATE_BROKER_CONFIG,
                                               body=f"{key}={value}\n".encode()),
                         f"update broker config {key}")

    def topic_stats(self, addr: str, topic: str) -> list[dict]:
        """GET_TOPIC_STATS_INFO: [{brokerName, queueId, minOffset, maxOffset, lastUpdateTimestamp}]."""
        r = self.broker_call(addr, RemotingCommand(RC.GET_TOPIC_STATS_INFO, ext={"topic": topic}),
                             f"status of topic {topic}")
        return mq_rows(self._json(r, "topic stats").get("offsetTable") or {})

    def consume_stats(self, addr: str, group: str, topic: str | None = None) -> tuple[list[dict], float]:
        """GET_CONSUME_STATS: ([{topic, brokerName, queueId, brokerOffset,
        consumerOffset, lastTimestamp}], consumeTps)."""
        ext = {"consumerGroup": group}
        if topic:
            ext["topic"] = topic
        r = self.broker_call(addr, RemotingCommand(RC.GET_CONSUME_STATS, ext=ext),
                             f"consume stats of group {group}")
        data = self._json(r, "consume stats")
        return mq_rows(data.get("offsetTable") or {}), float(data.get("consumeTps") or 0)

    def consumer_connection(self, addr: str, group: str) -> dict | None:
        """ConsumerConnection of ``group`` as ``addr`` sees it; None if not online there."""
        r = self.call(addr, RemotingCommand(RC.GET_CONSUMER_CONNECTION_LIST,
                                            ext={"consumerGroup": group}))
        if r.code == R.CONSUMER_NOT_ONLINE:
            return None
        self.expect(r, f"connections of group {group}", f"the broker at {addr}")
        return self._json(r, "consumer connection")

    def view_stats(self, addr: str, name: str, key: str) -> dict | None:
        """VIEW_BROKER_STATS_DATA: BrokerStatsData ({statsMinute, statsHour,
        statsDay: {sum, tps, avgpt}}) of one stats item; None if the broker
        never counted it (SYSTEM_ERROR "The stats ... not exist")."""
        r = self.call(addr, RemotingCommand(RC.VIEW_BROKER_STATS_DATA,
                                            ext={"statsName": name, "statsKey": key}))
        if r.code == R.SYSTEM_ERROR and "not exist" in (r.remark or ""):
            return None
        self.expect(r, f"stats {name} {key}", f"the broker at {addr}")
        return self._json(r, f"stats {name} {key}")

    def broker_consume_stats(self, addr: str, is_order: bool) -> dict:
        """GET_BROKER_CONSUME_STATS: {brokerAddr, totalDiff, groups: {group:
        [rows as consume_stats gives them]}}."""
        r = self.broker_call(addr, RemotingCommand(RC.GET_BROKER_CONSUME_STATS,
                                                   ext={"isOrder": str(is_order).lower()}),
                             "broker consume stats")
        data = self._json(r, "broker consume stats")
        groups: dict[str, list[dict]] = {}
        for entry in data.get("consumeStatsList") or []:
            for group, stats in entry.items():
                for cs in stats:
                    groups.setdefault(group, []).extend(mq_rows(cs.get("offsetTable") or {}))
        return {"brokerAddr": data.get("brokerAddr", addr), "totalDiff": int(data.get("totalDiff") or 0),
                "groups": groups}

    def producer_connection(self, addr: str, group: str) -> list[dict]:
        """GET_PRODUCER_CONNECTION_LIST: the group's connections on ``addr``
        ([] where the broker does not know the group)."""
        r = self.call(addr, RemotingCommand(RC.GET_PRODUCER_CONNECTION_LIST,
                                            ext={"producerGroup": group}))
        if r.code == R.SYSTEM_ERROR and "not exist" in (r.remark or ""):
            return []
        self.expect(r, f"connections of producer group {group}", f"the broker at {addr}")
        return list(self._json(r, "producer connection").get("connectionSet") or [])

    def consumer_running_info(self, addr: str, group: str, client_id: str, jstack: bool) -> dict:
        """GET_CONSUMER_RUNNING_INFO, which the broker passes on to the
        client: its ConsumerRunningInfo (properties, subscriptionSet, and
        from Java clients mqTable as rows, statusTable, jstack)."""
        r = self.broker_call(addr, RemotingCommand(RC.GET_CONSUMER_RUNNING_INFO, ext={
            "consumerGroup": group, "clientId": client_id, "jstackEnable": str(jstack).lower()}),
            f"running info of consumer {client_id}")
        info = self._json(r, f"running info of consumer {client_id}")
        if not isinstance(info, dict):
            raise AdminError(f"running info of consumer {client_id}: not a ConsumerRunningInfo")
        info["mqTable"] = mq_rows(info.get("mqTable") or {})
        return info

    def consume_directly(self, addr: str, group: str, client_id: str, offset_msg_id: str) -> dict:
        """CONSUME_MESSAGE_DIRECTLY, which the broker passes on to the client
        with the message: its ConsumeMessageDirectlyResult. Waits three
        timeouts, as mqadmin: the client runs its listener first."""
        r = self.call(addr, RemotingCommand(RC.CONSUME_MESSAGE_DIRECTLY, ext={
            "consumerGroup": group, "clientId": client_id, "msgId": offset_msg_id}),
            timeout=self.timeout * 3)
        self.expect(r, f"consume message {offset_msg_id} directly by {client_id}",
                    f"the broker at {addr}")
        return self._json(r, "consume message directly")

    def topic_consumed_by(self, addr: str, topic: str) -> list[str]:
        r = self.broker_call(addr, RemotingCommand(RC.QUERY_TOPIC_CONSUME_BY_WHO,
                                                   ext={"topic": topic}), f"groups of topic {topic}")
        return sorted(self._json(r, "group list").get("groupList") or [])

    def _queue_offset(self, addr: str, code: int, topic: str, qid: int, **ext) -> int:
        ext = {"topic": topic, "queueId": str(qid), **{k: str(v) for k, v in ext.items()}}
        r = self.broker_call(addr, RemotingCommand(code, ext=ext), f"offset of {topic}:{qid}")
        return int(r.ext.get("offset", "0"))

    def min_offset(self, addr: str, topic: str, qid: int) -> int:
        return self._queue_offset(addr, RC.GET_MIN_OFFSET, topic, qid)

    def max_offset(self, addr: str, topic: str, qid: int) -> int:
        return self._queue_offset(addr, RC.GET_MAX_OFFSET, topic, qid)

    def search_offset(self, addr: str, topic: str, qid: int, timestamp: int) -> int:
        return self._queue_offset(addr, RC.SEARCH_OFFSET_BY_TIMESTAMP, topic, qid, timestamp=timestamp)

    def update_consumer_offset(self, addr: str, group: str, topic: str, qid: int, offset: int) -> None:
        self.broker_call(addr, RemotingCommand(RC.UPDATE_CONSUMER_OFFSET, ext={
            "consumerGroup": group, "topic": topic, "queueId": str(qid),
            "commitOffset": str(offset)}), f"commit offset of group {group}")

    def reset_offset(self, addr: str, topic: str, group: str, ts: int, force: bool,
                     cpp: bool) -> dict[int, int] | None:
        """INVOKE_BROKER_TO_RESET_OFFSET: queueId → new offset; None if the
        broker answers CONSUMER_NOT_ONLINE (then offsets are set one by one)."""
        cmd = RemotingCommand(RC.INVOKE_BROKER_TO_RESET_OFFSET, ext={
            "topic": topic, "group": group, "timestamp": str(ts), "isForce": str(force).lower()})
        if cpp:
            cmd.language = "CPP"   # RocketMQ answers C++ clients' form (ResetOffsetBodyForC)
        r = self.call(addr, cmd)
        if r.code == R.CONSUMER_NOT_ONLINE:
            return None
        self.expect(r, f"reset offsets of group {group}", f"the broker at {addr}")
        try:
            return {mq.queue_id: off for mq, off in parse_offset_table(r.body).items()}
        except ValueError as e:
            raise AdminError(f"reset offsets of group {group}: unreadable reply: {e}") from None

    # ------------------------------------------------------------ messages
    def view_message(self, addr: str, phy: int) -> StoredMessage:
        r = self.call(addr, RemotingCommand(RC.VIEW_MESSAGE_BY_ID, ext={"offset": str(phy)}))
        self.expect(r, f"message at CommitLog offset {phy}", f"the broker at {addr}")
        return self._one(r.body, f"message at CommitLog offset {phy}")

    def query_messages(self, addr: str, topic: str, key: str, unique: bool = False,
                       max_num: int = QUERY_MAX_NUM) -> list[StoredMessage]:
        ext = {"topic": topic, "key": key, "maxNum": str(max_num), "beginTimestamp": "0",
               "endTimestamp": str(LONG_MAX)}
        if unique:
            ext["_UNIQUE_KEY_QUERY"] = "true"
        r = self.call(addr, RemotingCommand(RC.QUERY_MESSAGE, ext=ext))
        if r.code == R.QUERY_NOT_FOUND:
            return []
        self.expect(r, f"query topic {topic} by key {key}", f"the broker at {addr}")
        return self._records(r.body, f"query by key {key}")

    def pull(self, addr: str, topic: str, qid: int, offset: int, max_msgs: int,
             group: str = TOOLS_CONSUMER, subscription: str = "*") -> tuple[int, list[StoredMessage], int]:
        """One PULL_MESSAGE (no long polling, no offset commit), filtered by
        ``subscription`` (tags): (response code, messages, next offset)."""
        r = self.call(addr, pull_message(topic, qid, offset, group=group, max_msgs=max_msgs,
                                         subscription=subscription))
        if r.code not in (R.SUCCESS, R.PULL_NOT_FOUND, R.PULL_RETRY_IMMEDIATELY, R.PULL_OFFSET_MOVED):
            self.expect(r, f"pull {topic}:{qid} at {offset}", f"the broker at {addr}")
        msgs = self._records(r.body, f"pull {topic}:{qid}") if r.code == R.SUCCESS else []
        return r.code, msgs, int(r.ext.get("nextBeginOffset", offset))

    def _records(self, body, what: str) -> list[StoredMessage]:
        try:
            return decode_records(body)
        except (CorruptRecord, ValueError) as e:
            raise AdminError(f"{what}: unreadable message records: {e}") from None

    def _one(self, body, what: str) -> StoredMessage:
        msgs = self._records(body, what)
        if not msgs:
            raise AdminError(f"{what}: the broker sent no record")
        return msgs[0]


def mq_rows(table: dict) -> list[dict]:
    """A fastjson ``Map<MessageQueue, {..}>`` → rows with topic, brokerName,
    queueId and the value's fields, sorted as MessageQueue sorts."""
    rows = []
    for key, value in table.items():
        mq = dict(key) if isinstance(key, tuple) else {}
        if not {"topic", "brokerName", "queueId"} <= mq.keys() or not isinstance(value, dict):
            raise AdminError(f"unreadable MessageQueue map entry {key!r}: {value!r}")
        rows.append({"topic": mq["topic"], "brokerName": mq["brokerName"],
                     "queueId": int(mq["queueId"]), **value})
    return sorted(rows, key=lambda r: (r["topic"], r["brokerName"], r["queueId"]))


def parse_properties(text: str) -> dict[str, str]:
    """java.util.Properties text (what GET_BROKER_CONFIG sends): key=value lines."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out
