"""The client's shared machinery (RocketMQ's MQClientInstance): NameServer
routes, broker connections, heartbeats, and requests brokers send us.

One ``ClientInstance`` per client id serves every producer and consumer of
a process that shares its settings. It polls the NameServers for the routes
of the topics in use (every ``poll_name_server_interval``), sends a heartbeat
naming its producer and consumer groups to every broker it knows (every
``heartbeat_interval``, and at once when a group starts), keeps one
connection per broker address and opens a new one when it breaks (a broker
restart). A broker on this host is reached over its Unix socket when it
advertises one (``unixSocketPath`` in its runtime info) and ``use_unix_socket``
is on. A fork gets its own instance: an instance is tied to the pid and
the event loop that made it, and a forked child lets its parent's go at
once (``inherited``: their sockets closed in the child, nothing sent).
The members made in the process, producers and consumers, are told too
(``inherit_at_fork``: each one's ``_inherited`` drops what it holds of
the parent's: its windows, batches, tasks, threads, queues).

Broker groups: sends go to a group's master; pulls to the broker id the
last pull reply suggested (``pull_from``, ``find_broker``: RocketMQ's
findBrokerAddressInSubscribe), else the master, else a slave. A request
whose broker connection breaks or will not open asks the NameServers for
every route at once and again every ``REROUTE_EVERY_S`` until the routes no
longer name that broker (``broker_unreachable``, a bounded retry), so a
consumer whose master dies reads from its slave within a second or so, not
at the next periodic refresh; it goes back when a refresh names the master.

Its two loops follow background.py: a NameServer or broker that is down is
a warning and the next period tries again; a bug stops the loop, is logged
at ERROR and becomes ``failure``, which every consumer on the instance
(also one that joins later) raises from its ``shutdown()``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import socket
import time
import weakref
from dataclasses import dataclass, field

import orjson

from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand
from shmq.ipc.signing import Credentials

from . import background
from .connection import Connection
from .errors import MQClientError, RemotingError
from .message import MessageQueue

log = logging.getLogger("shmq.client")
PERM_READ, PERM_WRITE = 4, 2
MASTER_ID = "0"
REROUTE_EVERY_S, REROUTE_TRIES = 0.5, 10     # routes asked again after a broker is lost
PID = os.getpid()          # this process's pid, kept current by a fork hook (no syscall per send)
_members: "weakref.WeakSet" = weakref.WeakSet()     # producers and consumers: what a fork resets


def inherit_at_fork(member) -> None:
    """In a forked child, call ``member._inherited()`` (after the instances
    are let go): a producer or consumer drops what it holds of the parent's."""
    _members.add(member)


def _forked() -> None:
    """In a forked child: every instance is the parent's (``ClientInstance.inherited``),
    and so is what every member holds."""
    global PID
    PID = os.getpid()
    inherited = list(ClientInstance._instances.values())
    ClientInstance._instances.clear()
    for inst in inherited:
        inst.inherited()
    for member in list(_members):
        member._inherited()


os.register_at_fork(after_in_child=_forked)


@dataclass
class ClientConfig:
    """RocketMQ's ClientConfig, by its names in snake case."""
    namesrv_addr: str = ""                 # "host:port;host:port"; "" = $NAMESRV_ADDR or 127.0.0.1:9876
    instance_name: str = "DEFAULT"
    client_ip: str = ""
    poll_name_server_interval: float = 30.0
    heartbeat_interval: float = 30.0
    persist_consumer_offset_interval: float = 5.0
    request_timeout: float = 3.0
    use_unix_socket: bool = True           # shmq: the broker's Unix socket when it is on this host
    # shmq: a producer on the broker's host, run by the store's OS user,
    # appends to the store itself (client/direct.py), no socket per send
    direct_append: bool = True
    access_key: str = ""                   # an account of the brokers' ACL (plain_acl.yml):
    secret_key: str = ""                   # every request is signed with it (RocketMQ's SessionCredentials)
    # RocketMQ's enableMsgTrace / customizedTraceTopic: producers and push
    # consumers send trace records to this topic ("" = RMQ_SYS_TRACE_TOPIC; client/trace.py)
    enable_msg_trace: bool = False
    customized_trace_topic: str = ""

    @property
    def credentials(self) -> Credentials | None:
        return Credentials.of(self.access_key, self.secret_key)

    def namesrv_list(self) -> list[str]:
        addrs = self.namesrv_addr or os.environ.get("NAMESRV_ADDR") or "127.0.0.1:9876"
        return [a.strip() for a in addrs.split(";") if a.strip()]

    def ip(self) -> str:
        if self.client_ip:
            return self.client_ip
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"

    def client_id(self) -> str:
        if self.instance_name == "DEFAULT" or self._pid != os.getpid():
            # ClientConfig.changeInstanceNameToPID (4.9.7: pid#nanoTime), once per
            # config and again in a forked child
            self.instance_name = f"{os.getpid()}#{time.monotonic_ns()}"
            self._pid = os.getpid()
        return f"{self.ip()}@{self.instance_name}"

    def __post_init__(self):
        self._pid = os.getpid() if self.instance_name != "DEFAULT" else -1
        Credentials.of(self.access_key, self.secret_key)     # both or neither (ValueError)


@dataclass
class TopicRoute:
    queue_datas: list[dict]
    broker_addrs: dict[str, dict[str, str]]          # broker name → {brokerId: addr}
    order_conf: str | None = None
    publish: list[MessageQueue] = field(default_factory=list)
    subscribe: list[MessageQueue] = field(default_factory=list)

    @classmethod
    def parse(cls, topic: str, data: dict) -> "TopicRoute":
        addrs = {b["brokerName"]: {str(k): v for k, v in (b.get("brokerAddrs") or {}).items()}
                 for b in data.get("brokerDatas") or []}
        qds = sorted(data.get("queueDatas") or [], key=lambda q: q["brokerName"])
        route = cls(qds, addrs, data.get("orderTopicConf"))
        for qd in qds:
            name = qd["brokerName"]
            here = addrs.get(name)
            if not here:
                continue
            # sends go to a master; reads to the master or, with the master
            # gone from the route, to a slave (RocketMQ's topicRouteData2Topic*Info)
            if MASTER_ID in here and qd.get("perm", 6) & PERM_WRITE:
                route.publish += [MessageQueue(topic, name, i) for i in range(qd["writeQueueNums"])]
            if qd.get("perm", 6) & PERM_READ:
                route.subscribe += [MessageQueue(topic, name, i) for i in range(qd["readQueueNums"])]
        return route


def with_settings(client: ClientConfig | None, settings: dict) -> ClientConfig:
    """The config a producer or consumer runs with: ``client`` (shared as it
    is, so every member made from one config is one client instance, as in
    RocketMQ) or a new one, with keyword ``settings`` on a copy (the
    caller's object is never changed; its instance name is fixed first, so
    the copy still joins its instance)."""
    if not settings:
        return client if client is not None else ClientConfig()
    if client is not None:
        client.client_id()
    return dataclasses.replace(client or ClientConfig(), **settings)


def split_settings(settings: dict, config_class) -> tuple[dict, dict]:
    """A client's keyword settings → (ClientConfig's, its own ``config_class``'s):
    producers and consumers take both kinds as keywords, as RocketMQ's
    DefaultMQProducer and DefaultMQPushConsumer inherit ClientConfig's setters."""
    client_names = {f.name for f in dataclasses.fields(ClientConfig)}
    own_names = {f.name for f in dataclasses.fields(config_class)}
    unknown = set(settings) - client_names - own_names
    if unknown:
        raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
    return ({k: v for k, v in settings.items() if k in client_names},
            {k: v for k, v in settings.items() if k in own_names})


def _close_attached(work: asyncio.Future) -> None:
    """``_attaching``'s thread finished after its task was cancelled: let go
    of what it attached."""
    if not work.cancelled() and work.exception() is None:
        ds, _ = work.result()
        if ds is not None:
            ds.close()


class ClientInstance:
    _instances: dict[tuple[int, str, str, str], "ClientInstance"] = {}

    @classmethod
    def get(cls, config: ClientConfig) -> "ClientInstance":
        """The instance for this config's client id in this process and loop."""
        key = (os.getpid(), config.client_id() + "|" + ";".join(config.namesrv_list()),
               config.access_key, config.secret_key)
        inst = cls._instances.get(key)
        if inst is None or inst.loop is not asyncio.get_running_loop() or inst.stopped:
            inst = cls._instances[key] = cls(config)
        return inst

    def __init__(self, config: ClientConfig):
        self.config = config
        self.client_id = config.client_id()
        self.pid = os.getpid()
        self.loop = asyncio.get_running_loop()
        self.routes: dict[str, TopicRoute] = {}
        self.conns: dict[str, Connection] = {}
        self._by_name: dict[str, Connection] = {}    # broker name → its open connection (a cache)
        self._conn_locks: dict[str, asyncio.Lock] = {}
        self._opening: dict[str, Connection] = {}    # address → opened, not published yet
        self._conn_waiting: dict[str, int] = {}      # address → callers in connection()
        self.producers: dict[str, object] = {}
        self.consumers: dict[str, object] = {}
        self.tasks: list[asyncio.Task] = []
        self.started = self.stopped = False
        self.failure: BaseException | None = None    # the first bug a background task met
        self._failed_in = ""
        self._unix: dict[str, str | None] = {}
        # broker address → its store attached for direct appends (None: not
        # possible, asked once); broker name → the same, for the send path
        self.direct: dict[str, object | None] = {}
        self._direct_by_name: dict[str, object] = {}
        # (consumer group, queue) → the broker id its next pull goes to: the
        # last pull reply's suggestWhichBrokerId (RocketMQ's pullFromWhichNodeTable)
        self.pull_from: dict[tuple[str, MessageQueue], str] = {}
        self._rerouting: asyncio.Task | None = None
        self._rerouted = asyncio.Event()       # its current round done (a new one each round)
        self._gave_up: dict[str, float] = {}   # broker address → when a reroute last gave up

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.started:
            return
        self.started = True
        self.tasks = [background.spawn(background.every(period, fn, what), what, self._bug)
                      for period, fn, what in (
                          (self.config.poll_name_server_interval, self.refresh_routes,
                           f"the route refresh of {self.client_id}"),
                          (self.config.heartbeat_interval, self.heartbeat,
                           f"the heartbeat of {self.client_id}"))]

    def _bug(self, what: str, exc: BaseException) -> None:
        """A loop of ours stopped on a bug (logged by background.watch): every
        consumer on this instance records it, so its shutdown() raises it."""
        if self.failure is None:
            self.failure, self._failed_in = exc, what
        for c in list(self.consumers.values()):
            self._tell(c)

    def _tell(self, member) -> None:
        record = getattr(member, "record_failure", None)
        if record is not None and self.failure is not None:
            record(self._failed_in, self.failure)

    async def register(self, kind: str, group: str, member) -> None:
        table = self.producers if kind == "producer" else self.consumers
        if group in table and table[group] is not member:
            raise MQClientError(-1, f"the {kind} group {group} is already in use by this client")
        table[group] = member
        self._tell(member)                 # a loop that stopped before it joined stays stopped
        await self.start()
        await self.heartbeat()
        if self.config.direct_append:             # brokers dialled before any member joined
            for addr, conn in list(self.conns.items()):
                if conn.addr.startswith("unix:") and not conn.closed and addr not in self.direct:
                    await self._attach_direct(addr, conn)

    async def unregister(self, kind: str, group: str) -> None:
        table = self.producers if kind == "producer" else self.consumers
        table.pop(group, None)
        ext = {"clientID": self.client_id, f"{kind}Group": group}
        for addr in self.broker_addrs(slaves=True):
            try:
                conn = await self.connection(addr)
                await conn.invoke(RemotingCommand(RC.UNREGISTER_CLIENT, ext=dict(ext)),
                                  self.config.request_timeout)
            except (RemotingError, OSError):
                pass
        if not self.producers and not self.consumers:
            await self.close()

    async def close(self) -> None:
        self.stopped = True
        for t in self.tasks + [self._rerouting] * (self._rerouting is not None):
            t.cancel()
        for ds in self.direct.values():
            if ds is not None:
                ds.close()
        self.direct.clear()
        self._direct_by_name.clear()
        for c in list(self.conns.values()) + list(self._opening.values()):
            await c.close()
        self.conns.clear()
        self._opening.clear()
        self._by_name.clear()

    def inherited(self) -> None:
        """This process is a fork of the one that made the instance: none of
        it is this process's. Its sockets are closed here, this process's
        copies only (the parent's stay open; the parent's event loop and its
        epoll instance, which the fork shares, are not touched: asyncio's
        transport.close would take the parent's sockets out of it); the
        requests in flight are the parent's (their futures are left alone,
        their answers go to the parent); its direct stores are let go, not
        closed (closing would free the parent's process slot in the store).
        A member used in the child attaches a new instance (``get``)."""
        self.stopped = True
        for conn in list(self.conns.values()) + list(self._opening.values()):
            conn.inherited()
        self.conns.clear()
        self._opening.clear()
        self._by_name.clear()
        self.direct.clear()
        self._direct_by_name.clear()

    # ------------------------------------------------------------ routes
    async def namesrv_invoke(self, cmd: RemotingCommand) -> RemotingCommand:
        addrs = self.config.namesrv_list()
        start = random.randrange(len(addrs))
        last: Exception | None = None
        for i in range(len(addrs)):
            addr = addrs[(start + i) % len(addrs)]
            try:
                conn = await self.connection(addr, direct=True)
                return await conn.invoke(RemotingCommand(cmd.code, ext=dict(cmd.ext), body=cmd.body),
                                         self.config.request_timeout)
            except RemotingError as e:
                last = e
        raise RemotingError(f"no NameServer answered ({'; '.join(addrs)}): {last}")

    async def route(self, topic: str, refresh: bool = False) -> TopicRoute | None:
        """The topic's route (cached; None if the NameServer knows no such topic)."""
        r = self.routes.get(topic)
        if r is not None and not refresh:
            return r
        reply = await self.namesrv_invoke(RemotingCommand(RC.GET_ROUTEINFO_BY_TOPIC,
                                                          ext={"topic": topic}))
        if reply.code == R.TOPIC_NOT_EXIST:
            return None
        if reply.code != R.SUCCESS:
            raise MQClientError(reply.code, reply.remark, f"route of {topic}")
        r = self.routes[topic] = TopicRoute.parse(topic, orjson.loads(reply.body))
        self._by_name.clear()                    # an address may have changed
        return r

    async def refresh_routes(self) -> None:
        """Every topic in use; a consumer re-balances when its topic's queues change
        (or its topic appears). One failing topic does not stop the others.
        A topic the NameServers answer TOPIC_NOT_EXIST for keeps the route
        held, with a warning, as RocketMQ's MQClientInstance keeps it
        (updateTopicRouteInfoFromNameServer returns false): a NameServer
        restarted before its brokers registered again, or a broker that is
        restarting, knows no topic for a while, and sends and pulls go on to
        the brokers meanwhile (a producer's route made up from TBW102's
        would send to queues the topic does not have)."""
        topics = set(self.routes)
        for c in self.consumers.values():
            topics |= set(c.topics())
        for topic in topics:
            old = self.routes.get(topic)
            try:
                new = await self.route(topic, refresh=True)
            except (RemotingError, MQClientError) as e:
                log.warning("route of %s: %s", topic, e)
                continue
            if new is None:
                if old is not None:
                    log.warning("route of %s: the NameServers know no such topic now; the "
                                "last route is kept", topic)
                continue
            if new.subscribe != (old.subscribe if old else None):
                for c in self.consumers.values():
                    if topic in c.topics():
                        c.rebalance_soon()

    def broker_addr(self, broker_name: str) -> str | None:
        """The master of ``broker_name``; with no master in any route, its
        slave of the lowest id: consumers go on reading from a slave while the
        master is down, and back to the master once a route names it again
        (every route refresh forgets the connections by name)."""
        return self.find_broker(broker_name, MASTER_ID)[0]

    def find_broker(self, broker_name: str, broker_id: str) -> tuple[str | None, bool]:
        """RocketMQ's findBrokerAddressInSubscribe (onlyThisBroker false):
        the address of ``broker_id`` in the group ``broker_name``, else for a
        slave id the next id's, else the master's, else the slave of the
        lowest id; and whether it is a slave. (None, False): no route names
        the group."""
        group: dict[str, str] = {}
        for r in self.routes.values():
            a = r.broker_addrs.get(broker_name)
            if a:
                if MASTER_ID in a and MASTER_ID not in group:
                    group[MASTER_ID] = a[MASTER_ID]      # a master in any route wins
                group.update((k, v) for k, v in a.items() if k != MASTER_ID)
        for bid in (broker_id, str(int(broker_id) + 1) if broker_id != MASTER_ID else None,
                    MASTER_ID, min(group, key=int, default=None)):
            if bid is not None and bid in group:
                return group[bid], bid != MASTER_ID
        return None, False

    def broker_unreachable(self, addr: str | None) -> None:
        """A request to ``addr`` found no broker there (its connection broke,
        or would not open): ask the NameServers for every route at once, and
        again every REROUTE_EVERY_S while a route still names ``addr``, at most
        REROUTE_TRIES times (then not again for that broker within a periodic
        refresh interval), so that a consumer whose master was killed reads
        from the slave within seconds, not at the next periodic refresh
        (the NameServer drops a broker as soon as its connection closes)."""
        if addr is None or self._rerouting is not None and not self._rerouting.done():
            return
        if self.loop.time() - self._gave_up.get(addr, -1e9) < self.config.poll_name_server_interval:
            return                 # tried lately: the periodic refresh will see it go
        self._rerouted = asyncio.Event()
        self._rerouting = background.spawn(self._reroute(addr), f"the route refresh of "
                                           f"{self.client_id} after {addr} went", self._bug)

    async def rerouted(self) -> bool:
        """Until the round of the route refresh ``broker_unreachable``
        started that runs now has ended; True then, False at once when
        none runs (the refresh ended: it will not ask again)."""
        if self._rerouting is None or self._rerouting.done():
            return False
        await self._rerouted.wait()
        return True

    async def _reroute(self, addr: str) -> None:
        """A group whose master is gone from the NameServers gets the route
        naming its slave; a broker gone with no other one keeps its route
        (pulls go on trying it, as before the break)."""
        try:
            for _ in range(REROUTE_TRIES):
                await self.refresh_routes()
                done, self._rerouted = self._rerouted, asyncio.Event()
                done.set()                   # this round's waiters; the next round's wait anew
                if addr not in self.broker_addrs(slaves=True):
                    return
                await asyncio.sleep(REROUTE_EVERY_S)
            self._gave_up[addr] = self.loop.time()
        finally:
            self._rerouted.set()

    def broker_addrs(self, slaves: bool = False) -> set[str]:
        """Every master's address in the routes held; ``slaves``: every slave's too."""
        return {addr for r in self.routes.values() for a in r.broker_addrs.values()
                for bid, addr in a.items() if slaves or bid == MASTER_ID}

    # ------------------------------------------------------------ connections
    async def connection(self, addr: str, direct: bool = False) -> Connection:
        """The connection to ``addr`` (opened, or re-opened after it broke).

        One caller opens it, holding ``addr``'s lock; the callers that came
        meanwhile wait on the lock (FIFO) and take it from ``_opening`` in
        turn. It is published (``conns``, and so ``broker_now``) only when
        the last of them has left the lock: a send that comes while any
        still waits queues behind them, where published earlier (once
        opened, or once the first heartbeat was answered) it was written
        ahead of them, out of call order."""
        conn = self.conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        if self.stopped:
            raise self._shut_down(addr)
        lock = self._conn_locks.setdefault(addr, asyncio.Lock())
        waiting = self._conn_waiting
        waiting[addr] = waiting.get(addr, 0) + 1
        try:
            async with lock:
                conn = self._opening.get(addr) or self.conns.get(addr)
                if self.stopped:   # shut down meanwhile: nothing opened (the last caller
                    raise self._shut_down(addr)     # closes what is), nothing opens
                if conn is None or conn.closed:
                    conn = await self._open(addr, direct)
                    if self.stopped:
                        raise self._shut_down(addr)
                return conn
        finally:
            n = waiting[addr] - 1
            if n:
                waiting[addr] = n
            else:                                   # the last caller: publish it
                del waiting[addr]
                opened = self._opening.pop(addr, None)
                if opened is not None:
                    if self.stopped:    # close() ran meanwhile: it outlives no close()
                        await opened.close()
                    else:
                        self.conns[addr] = opened

    def _shut_down(self, addr: str) -> RemotingError:
        return RemotingError(f"the client {self.client_id} is shut down: no connection to {addr}")

    async def _open(self, addr: str, direct: bool) -> Connection:
        """A new connection to ``addr``, in ``_opening`` (``connection``)."""
        conn = await Connection.open(addr, self._on_request, self.config.request_timeout,
                                     self.config.credentials)
        if not direct and self.config.use_unix_socket:
            conn = await self._prefer_unix(addr, conn)
            if self.config.direct_append and (self.producers or self.consumers) \
                    and conn.addr.startswith("unix:"):
                old = self.direct.get(addr)
                if old is not None:         # a new connection: the broker may be a new one
                    self._drop_direct(old)
                await self._attach_direct(addr, conn)
        self._opening[addr] = conn          # the waiters' even if the heartbeat fails
        if not direct:
            await self._heartbeat_to(addr, conn, self.heartbeat_body())   # our groups at once
        return conn

    async def _prefer_unix(self, addr: str, conn: Connection) -> Connection:
        """A broker on this host that advertises its Unix socket is used through it."""
        host = addr.rpartition(":")[0]
        if not host.startswith("127.") and host not in (self.config.ip(), "localhost"):
            return conn
        path = self._unix.get(addr, "")
        if path == "":
            try:
                r = await conn.invoke(RemotingCommand(RC.GET_BROKER_RUNTIME_INFO),
                                      self.config.request_timeout)
                table = orjson.loads(r.body).get("table", {}) if r.code == R.SUCCESS else {}
            except (RemotingError, ValueError):
                table = {}
            path = table.get("unixSocketPath")
            self._unix[addr] = path = path if path and os.path.exists(path) else None
        if not path:
            return conn
        try:
            unix = await Connection.open("unix:" + path, self._on_request,
                                         self.config.request_timeout, self.config.credentials)
        except RemotingError:
            return conn
        await conn.close()
        return unix

    async def _attach_direct(self, addr: str, conn: Connection) -> None:
        """Ask the broker at ``addr`` whether its store can be attached for
        direct appends and, if so, attach it: at once where this process
        has loaded what that takes (``direct.appends_loaded``), else in a
        thread (``_attaching``): the first attachment of a process imports
        numba and the store's modules and loads the append's kernels, 0.4-
        2.5 s the event loop must not stop for. Meanwhile ``direct[addr]``
        is None (asked: nobody asks again) and sends go over the socket; a
        producer switches to the store once its sends in flight over the
        socket are answered (``AsyncProducer._switch``), so no append
        overtakes them. Why it cannot is said once at INFO."""
        from . import direct
        self.direct[addr] = None
        try:
            r = await conn.invoke(RemotingCommand(RC.SHMQ_DIRECT_INFO), self.config.request_timeout)
        except RemotingError as e:
            log.info("broker %s: no direct appends (%s); sending over its socket", addr, e)
            return
        if r.code != R.SUCCESS:
            log.info("broker %s: no direct appends (%d %s); sending over its socket", addr,
                     r.code, r.remark)
            return
        if direct.appends_loaded():
            self._attached(addr, conn, *self._attach(r.body))
        else:
            background.spawn(self._attaching(addr, conn, r.body),
                             f"attaching the store of {addr} for direct appends", self._bug)

    @staticmethod
    def _attach(info: bytes):
        """(the store attached, None) or (None, why not)."""
        from .direct import DirectStore, DirectUnavailable, load_appends
        load_appends()
        try:
            return DirectStore.attach(orjson.loads(info)), None
        except (DirectUnavailable, OSError, ValueError, KeyError) as e:
            return None, e

    async def _attaching(self, addr: str, conn: Connection, info: bytes) -> None:
        # a plain future (not a task: asyncio.run's end cancels the tasks)
        work = asyncio.get_running_loop().run_in_executor(None, self._attach, info)
        try:
            got = await asyncio.shield(work)
        except asyncio.CancelledError:
            # the loop ends (asyncio.run's end cancels this; it then waits for
            # the thread): a store attached after that would keep its process
            # slot until the process exits, and the broker would take the
            # exit for a death ("pid ... is gone")
            work.add_done_callback(_close_attached)
            raise
        self._attached(addr, conn, *got)

    def _attached(self, addr: str, conn: Connection, ds, why) -> None:
        if ds is None:
            log.info("broker %s: no direct appends (%s); sending over its socket", addr, why)
            return
        if self.stopped or conn.closed or self.direct.get(addr, 0) is not None:
            ds.close()                # closed, reconnected or let go meanwhile: not ours to use
            return
        ds.conn = conn                # its broker's connection: closed, the broker is gone
        for w in ds.wakes:            # its appends' wake-ups coalesce per turn of this loop
            w.loop = self.loop
        self.direct[addr] = ds
        log.info("broker %s: appending to its store %s directly", addr, ds.root)

    def direct_now(self, broker_name: str):
        """The store of ``broker_name`` attached for direct appends, if it is.
        One whose broker closed its connection (stopped, killed, restarting)
        or refused a claim (closing the store) is let go; the next
        connection to that broker asks again."""
        ds = self._direct_by_name.get(broker_name)
        if ds is None:
            if not self.direct:
                return None
            ds = self.direct.get(self.broker_addr(broker_name))
            if ds is None:
                return None
            self._direct_by_name[broker_name] = ds
        if ds.stopped or ds.conn.closed:
            self._drop_direct(ds)
            return None
        return ds

    def _drop_direct(self, ds) -> None:
        for name, d in list(self._direct_by_name.items()):
            if d is ds:
                del self._direct_by_name[name]
        for addr, d in list(self.direct.items()):
            if d is ds:
                del self.direct[addr]
        ds.close()

    def broker_now(self, broker_name: str) -> Connection | None:
        """The open connection to ``broker_name`` if there is one (no awaiting:
        the send path's common case); None means ``await broker(...)``."""
        conn = self._by_name.get(broker_name)
        return conn if conn is not None and not conn.closed else None

    async def broker(self, broker_name: str) -> Connection:
        conn = self._by_name.get(broker_name)
        if conn is not None and not conn.closed:
            return conn
        addr = self._master(broker_name)
        conn = await self.connection(addr)
        if self.conns.get(addr) is conn:       # published: no send waits for it any more
            self._by_name[broker_name] = conn
        return conn

    def _master(self, broker_name: str) -> str:
        """``broker_addr``, or MQClientError when no route names the group."""
        addr = self.broker_addr(broker_name)
        if addr is None:
            raise MQClientError(R.SYSTEM_ERROR, f"the broker {broker_name} is not in any route")
        return addr

    async def invoke(self, broker_name: str, cmd: RemotingCommand,
                     timeout: float | None = None) -> RemotingCommand:
        """``cmd`` to the master of ``broker_name`` (``invoke_at`` its address)."""
        return await self.invoke_at(self._master(broker_name), cmd, timeout)

    async def invoke_at(self, addr: str, cmd: RemotingCommand,
                        timeout: float | None = None) -> RemotingCommand:
        """``cmd`` to the broker at ``addr`` (a route's address); as ``invoke``,
        a connection that breaks or will not open sends for the routes again."""
        conn = None
        try:
            conn = await self.connection(addr)
            return await conn.invoke(cmd, timeout or self.config.request_timeout)
        except RemotingError:
            if conn is None or conn.closed:
                self.broker_unreachable(addr)
            raise

    # ------------------------------------------------------------ heartbeats
    def heartbeat_body(self) -> bytes:
        return orjson.dumps({
            "clientID": self.client_id,
            "producerDataSet": [{"groupName": g} for g in self.producers],
            "consumerDataSet": [c.consumer_data() for c in self.consumers.values()]})

    async def heartbeat(self) -> None:
        body = self.heartbeat_body()
        # a consumer's groups to slaves too (it may read there); a producer's to masters
        for addr in self.broker_addrs(slaves=bool(self.consumers)):
            try:
                await self._heartbeat_to(addr, await self.connection(addr), body)
            except RemotingError as e:
                log.warning("heartbeat to %s: %s", addr, e)

    async def _heartbeat_to(self, addr: str, conn: Connection, body: bytes) -> None:
        r = await conn.invoke(RemotingCommand(RC.HEART_BEAT, body=body), self.config.request_timeout)
        if r.code != R.SUCCESS:
            log.warning("heartbeat to %s: %d %s", addr, r.code, r.remark)

    # ------------------------------------------------------------ requests from brokers
    async def _on_request(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        ext = cmd.ext
        if cmd.code == RC.NOTIFY_CONSUMER_IDS_CHANGED:
            c = self.consumers.get(ext.get("consumerGroup", ""))
            if c is not None:
                c.rebalance_soon()
            return None
        if cmd.code == RC.CHECK_TRANSACTION_STATE:
            for p in self.producers.values():
                if hasattr(p, "check_transaction_state") and await p.check_transaction_state(conn, cmd):
                    break
            return None
        if cmd.code == RC.RESET_CONSUMER_CLIENT_OFFSET:
            c = self.consumers.get(ext.get("group", ""))
            if c is not None:
                await c.reset_offsets(ext.get("topic", ""), cmd.body)
            return cmd.reply(R.SUCCESS)
        if cmd.code == RC.CONSUME_MESSAGE_DIRECTLY:
            c = self.consumers.get(ext.get("consumerGroup", ""))
            if c is None or not hasattr(c, "consume_directly"):
                return cmd.reply(R.SYSTEM_ERROR, f"The Consumer Group <{ext.get('consumerGroup')}> "
                                                 f"not exist in this consumer")
            try:
                result = await c.consume_directly(cmd.body or b"", ext.get("brokerName", ""))
            except ValueError as e:           # a body that is not a stored message
                return cmd.reply(R.SYSTEM_ERROR, f"cannot decode the message: {e}")
            return cmd.reply(R.SUCCESS, body=orjson.dumps(result))
        if cmd.code == RC.GET_CONSUMER_RUNNING_INFO:
            c = self.consumers.get(ext.get("consumerGroup", ""))
            info = c.running_info() if c is not None else {}
            return cmd.reply(R.SUCCESS, body=orjson.dumps(info))
        return cmd.reply(R.REQUEST_CODE_NOT_SUPPORTED, f"request {cmd.code} is not supported "
                                                       f"by the shmq Python client")
