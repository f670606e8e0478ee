"""Broker configuration: RocketMQ's ``broker.conf``, key=value, RocketMQ's names.

``BrokerConfig`` holds the broker's own settings (``BrokerConfig`` and
``NettyServerConfig`` names in RocketMQ) and a ``StoreConfig`` for the store's
(``MessageStoreConfig``). ``load(path, overrides)`` reads a ``broker.conf``;
settings shmq does not know are reported and ignored, so a real RocketMQ
``broker.conf`` works unchanged. ``describe()`` lists every setting with its
value and default (``shmq broker -m``).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from shmq.core.config import OLD_NAMES, StoreConfig, _convert
from shmq.broker.ha.protocol import FRAME_BYTES_MAX
from shmq.broker.logs import LogSettings
from shmq.ipc.signing import Credentials

_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """``messageDelayLevel`` ("1s 5s … 2h") → delay in ms of levels 1..n."""
    out = []
    for item in text.split():
        unit = _UNITS.get(item[-1:].lower())
        try:
            n = int(item[:-1])
        except ValueError:
            n = -1
        if unit is None or n < 0:
            raise ValueError(f"messageDelayLevel item {item!r}: want a number and s, m, h or d")
        out.append(n * unit)
    if not out:
        raise ValueError("messageDelayLevel is empty")
    return tuple(out)


# Settings UPDATE_BROKER_CONFIG changes at once on every worker (kept in
# config/brokerConfig.json, so they hold across restarts). Every other setting
# is read once at start, from broker.conf: a request to change one is refused
# (RocketMQ refuses its configBlackList the same way, with NO_PERMISSION).
RUNTIME_SETTINGS = frozenset({"brokerPermission"})

# Settings never shown (GET_BROKER_CONFIG shows ******) nor taken from
# UPDATE_BROKER_CONFIG, even at their value: that would tell a caller it guessed it.
SECRET_SETTINGS = frozenset({"secretKey"})

# brokerRole values (RocketMQ's BrokerRole)
ASYNC_MASTER, SYNC_MASTER, SLAVE = "ASYNC_MASTER", "SYNC_MASTER", "SLAVE"

# The topic producers name to have the broker create a new topic (TopicValidator).
DEFAULT_TOPIC = "TBW102"


@dataclass(frozen=True)
class BrokerConfig:
    brokerName: str = "broker-a"
    brokerClusterName: str = "DefaultCluster"
    # 0 = master; a SLAVE's is > 0 (either master role is forced to 0, as
    # RocketMQ's BrokerStartup does)
    brokerId: int = 0
    # the address clients are told to use (route data, stored STOREHOST)
    brokerIP1: str = "127.0.0.1"
    listenPort: int = 10911
    # NameServer addresses this broker registers with, "host:port;host:port";
    # empty = the embedded NameServer
    namesrvAddr: str = ""
    autoCreateTopicEnable: bool = True
    autoCreateSubscriptionGroup: bool = True
    # queues of a topic created on first send (capped by the producer's own number)
    defaultTopicQueueNums: int = 8
    # 6 = read + write
    brokerPermission: int = 6
    longPollingEnable: bool = True
    # ms a pull parks when long polling is off
    shortPollingTimeMills: int = 1000
    # ms between registrations with the NameServer
    registerNameServerPeriod: int = 30_000
    maxTransferBytesOnMessageInMemory: int = 256 * 1024
    maxTransferCountOnMessageInMemory: int = 32
    # queues of each consumer group's %RETRY% topic
    retryQueueNums: int = 1
    # ms between consumer offset saves (config/consumerOffset.json)
    flushConsumerOffsetInterval: int = 5000
    # seconds without traffic before the broker closes a connection
    serverChannelMaxIdleTimeSeconds: int = 120
    # --- message features (RocketMQ's names; MessageStoreConfig's for the first five)
    # delay of each level, 1..n (units s, m, h, d)
    messageDelayLevel: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    # ms between saves of config/delayOffset.json
    flushDelayOffsetInterval: int = 10_000
    # messages with TIMER_DELIVER_MS / TIMER_DELAY_MS / TIMER_DELAY_SEC wait for their time
    timerWheelEnable: bool = True
    # ms: the timer's slot: a message is delivered at or after its time, within
    # about one slot (RocketMQ 5 defaults to 1000)
    timerPrecisionMs: int = 100
    # s: the longest timer delay accepted (RocketMQ 5 defaults to 3 days; shmq to 7)
    timerMaxDelaySec: int = 7 * 86400
    # ms a half message waits before its producer is asked to resolve it
    transactionTimeOut: int = 6000
    # ms between transaction check rounds
    transactionCheckInterval: int = 60_000
    # checks of one half message before it is rolled back
    transactionCheckMax: int = 15
    rejectTransactionMessage: bool = False
    # SQL92 property filters on pull
    enablePropertyFilter: bool = False
    # apply SQL92 filters to %RETRY% topics too
    filterSupportRetry: bool = False
    # messages a QUERY_MESSAGE by unique key returns at most
    defaultQueryMaxNum: int = 32
    # create the message-trace topic at start (1 queue, read + write) for
    # clients with enableMsgTrace (RocketMQ's BrokerConfig; client/trace.py)
    traceTopicEnable: bool = False
    msgTraceTopicName: str = "RMQ_SYS_TRACE_TOPIC"
    # --- access control (RocketMQ's plain ACL; broker/acl.py)
    aclEnable: bool = False
    # RocketMQ's home: the rules are <rocketmqHome>/conf/plain_acl.yml
    rocketmqHome: str = field(default_factory=lambda: os.environ.get("ROCKETMQ_HOME", ""))
    # shmq: the rules file, if not that one (RocketMQ: -Drocketmq.acl.plain.file)
    aclPlainFile: str = ""
    # shmq: the account this broker signs its own requests with (NameServer
    # registration; the NameServer with ACL on wants an admin account)
    accessKey: str = ""
    secretKey: str = ""
    # shmq: the address the broker listens on (RocketMQ binds every address;
    # shmq only loopback unless told otherwise)
    bindAddress: str = "127.0.0.1"
    # shmq: worker processes (reactors); 0 = one per CPU
    workerProcessNums: int = 0
    # shmq: run a NameServer process inside the broker (only while namesrvAddr
    # is empty: naming NameServers, as `-n` does, means they run elsewhere)
    embeddedNamesrv: bool = True
    # shmq: its port
    namesrvListenPort: int = 9876
    # shmq: the Unix socket; empty = <storePathRootDir>/broker.sock
    unixSocketPath: str = ""
    # shmq: bytes queued for one connection before the broker stops reading
    # its requests (back-pressure on a client that does not read replies)
    outboundBufferMaxBytes: int = 8 * 1024 * 1024
    # shmq: bytes of unfinished request frames one worker holds across its
    # connections; past it the connection holding the most is closed
    # (16 clients each sending 16 MiB of a frame and stopping cost 256 MiB)
    serverPendingFrameBytesMax: int = 64 * 1024 * 1024
    # shmq: client connections the broker serves at once (split evenly over
    # the workers); past it a new one is closed with an ERROR a second.
    # 0: the descriptor limit (RLIMIT_NOFILE) less 256 kept for the store
    serverMaxConnections: int = 0
    # RocketMQ's: a send that waited longer than this (ms) between arriving
    # and being handled is refused with SYSTEM_BUSY ([TIMEOUT_CLEAN_QUEUE]),
    # so the producer backs off or tries another broker
    waitTimeMillsInSendQueue: int = 200
    # shmq: pull bodies of at least this many bytes leave by sendfile(2);
    # smaller ones by one sendmsg(2) of mapping slices (perf/pull_transfer)
    transferSendfileMinBytes: int = 16 * 1024
    # shmq: duplicate sends (core/dedup.py). A send whose UNIQ_KEY property
    # matches one of the broker's last this-many keyed sends (a batch counts
    # once, by its messages' keys in order) to the same topic is not stored
    # again: it is answered SEND_OK with the first send's msgId, queueId and
    # queueOffset. Covers a producer's retry after a lost reply, on any queue
    # of the topic and across restarts; 0 = off (RocketMQ's behaviour: both
    # stored). 40 bytes of shared memory per entry
    sendDedupWindowSize: int = 65536
    # shmq: a client on this host, run by the OS user that owns the store,
    # may append to the store itself instead of sending over a socket
    # (client/direct.py: the store's files and shared memory are owner-only,
    # so the OS enforces who can). Asked over the Unix socket; never offered
    # with aclEnable (an account's permissions are the broker's to check)
    directAppendEnable: bool = True
    # shmq: the Prometheus endpoint (/metrics, RocketMQ exporter's metric names;
    # broker/metrics.py) on bindAddress:metricsPort, served by the services
    # process; 0 = off
    metricsPort: int = 0
    # --- log files (broker/logs.py; named after RocketMQ's client logging
    # properties, rocketmq.client.logRoot …: its broker sets these in
    # logback_broker.xml). Each is overridden by its environment variable
    # (SHMQ_LOG_DIR, SHMQ_LOG_LEVEL, SHMQ_LOG_FILE_MAX_SIZE, SHMQ_LOG_FILE_MAX_INDEX)
    # the directory of broker.log, store.log, remoting.log, namesrv.log
    logRoot: str = LogSettings.logRoot
    # TRACE (= DEBUG), DEBUG, INFO, WARN, ERROR or OFF: for stderr and the files
    logLevel: str = LogSettings.logLevel
    # bytes: a log file past this is rotated (RocketMQ's 128MB)
    logFileMaxSize: int = LogSettings.logFileMaxSize
    # rotated files kept of each log (<name>.log.1 … .N; RocketMQ's maxIndex 10)
    logFileMaxIndex: int = LogSettings.logFileMaxIndex
    # --- replication (broker/ha/; RocketMQ's MessageStoreConfig names and defaults)
    # ASYNC_MASTER, SYNC_MASTER (a send waits for a slave's ack) or SLAVE
    brokerRole: str = ASYNC_MASTER
    # the HA port; 0: listenPort + 1 (RocketMQ 4.9 always uses listenPort + 1)
    haListenPort: int = 0
    # a SLAVE's master, "ip:port" of its HA port; empty: the haServerAddr the
    # NameServer answers this slave's registration with
    haMasterAddress: str = ""
    # ms: a slave reports its offset, and a master sends an empty frame, at
    # least this often
    haSendHeartbeatInterval: int = 5000
    # ms without a byte from the peer before an HA connection is closed
    haHousekeepingInterval: int = 20_000
    # bytes of CommitLog in one master → slave frame at most
    haTransferBatchSize: int = 32 * 1024
    # bytes: a slave this far behind does not count for SYNC_MASTER
    # (sends are answered SLAVE_NOT_AVAILABLE)
    haSlaveFallbehindMax: int = 256 * 1024 * 1024
    # ms a SYNC_MASTER send waits for the slave's ack before FLUSH_SLAVE_TIMEOUT
    slaveTimeout: int = 3000
    # pull replies may suggest a slave (a group's whichBrokerWhenConsumeSlowly)
    # to a consumer reading cold data (RocketMQ's BrokerConfig)
    slaveReadEnable: bool = False
    store: StoreConfig = field(default_factory=StoreConfig)

    def __post_init__(self):
        errors = []
        for name in ("listenPort", "namesrvListenPort", "metricsPort"):
            if not 0 <= getattr(self, name) <= 65535:
                errors.append(f"{name}={getattr(self, name)}: not a port")
        if not 0 <= self.brokerPermission <= 15:
            errors.append(f"brokerPermission={self.brokerPermission}: a permission, 0..15 "
                          f"(PERM_READ 4 | PERM_WRITE 2 | PERM_INHERIT 1 | PERM_PRIORITY 8; 6: "
                          f"read and write)")
        if self.workerProcessNums < 0:
            errors.append(f"workerProcessNums={self.workerProcessNums}: must be >= 0")
        if not 1 <= self.defaultTopicQueueNums <= 1024:
            errors.append(f"defaultTopicQueueNums={self.defaultTopicQueueNums}: must be 1..1024")
        if not 0 <= self.sendDedupWindowSize <= 1 << 24:
            errors.append(f"sendDedupWindowSize={self.sendDedupWindowSize}: must be 0..16777216")
        if self.outboundBufferMaxBytes < 64 * 1024:
            errors.append(f"outboundBufferMaxBytes={self.outboundBufferMaxBytes}: at least 65536")
        if self.serverPendingFrameBytesMax < 1 << 20:
            errors.append(f"serverPendingFrameBytesMax={self.serverPendingFrameBytesMax}: "
                          f"at least 1048576")
        if self.serverMaxConnections < 0:
            errors.append(f"serverMaxConnections={self.serverMaxConnections}: must be >= 0")
        if self.waitTimeMillsInSendQueue <= 0:
            errors.append(f"waitTimeMillsInSendQueue={self.waitTimeMillsInSendQueue}: "
                          f"must be positive")
        t = self.msgTraceTopicName
        if not t or len(t) > 127 or not all(c.isascii() and (c.isalnum() or c in "%|_-") for c in t):
            errors.append(f"msgTraceTopicName={t!r}: not a topic name (1..127 of letters, digits, "
                          f"%, |, _ and -)")
        try:
            parse_delay_levels(self.messageDelayLevel)
        except ValueError as e:
            errors.append(str(e))
        for name in ("flushDelayOffsetInterval", "timerPrecisionMs", "timerMaxDelaySec",
                     "transactionCheckInterval", "transactionCheckMax"):
            if getattr(self, name) <= 0:
                errors.append(f"{name}={getattr(self, name)}: must be positive")
        if bool(self.accessKey) != bool(self.secretKey):
            errors.append("accessKey and secretKey go together: set both or neither")
        if self.brokerRole not in (ASYNC_MASTER, SYNC_MASTER, SLAVE):
            errors.append(f"brokerRole={self.brokerRole!r}: must be ASYNC_MASTER, SYNC_MASTER "
                          f"or SLAVE")
        elif self.brokerRole == SLAVE and self.brokerId <= 0:
            errors.append(f"brokerId={self.brokerId}: a SLAVE's brokerId must be > 0")
        elif self.brokerRole == SLAVE and not (self.namesrvAddr or self.haMasterAddress):
            # it started, registered with its own embedded NameServer and waited forever
            errors.append("brokerRole=SLAVE with neither namesrvAddr nor haMasterAddress: a slave "
                          "finds its master through the NameServers it shares with it "
                          "(namesrvAddr); its own embedded NameServer knows no master")
        elif self.brokerRole != SLAVE and self.brokerId != 0:
            object.__setattr__(self, "brokerId", 0)    # a master is broker 0 (BrokerStartup)
        if not 0 <= self.haListenPort <= 65535:
            errors.append(f"haListenPort={self.haListenPort}: not a port (0: listenPort + 1)")
        else:
            errors += self._port_clashes()
        if self.haMasterAddress and not _is_addr(self.haMasterAddress):
            errors.append(f"haMasterAddress={self.haMasterAddress!r}: want host:port")
        bad = [a for a in self.namesrvAddr.split(";") if a.strip() and not _is_addr(a.strip())]
        if bad:     # the services process died of it at its first registration, a traceback
            errors.append(f"namesrvAddr={self.namesrvAddr!r}: want host:port, several joined "
                          f"by ';' ({bad[0].strip()!r} is not)")
        for name in ("haSendHeartbeatInterval", "haHousekeepingInterval", "haTransferBatchSize",
                     "haSlaveFallbehindMax", "slaveTimeout"):
            if getattr(self, name) <= 0:
                errors.append(f"{name}={getattr(self, name)}: must be positive")
        if self.haTransferBatchSize > FRAME_BYTES_MAX:    # a slave would drop every such frame
            errors.append(f"haTransferBatchSize={self.haTransferBatchSize}: at most "
                          f"{FRAME_BYTES_MAX} (the largest HA frame a slave takes)")
        errors += LogSettings(self.logRoot, self.logLevel, self.logFileMaxSize,
                              self.logFileMaxIndex).problems()
        if errors:
            raise ValueError("; ".join(errors))

    def _port_clashes(self) -> list[str]:
        """The ports this broker binds that are one port (or no port at
        all: listenPort 65535's HA port), each named by its settings: caught
        at bind time, one of them would be 'Address already in use' as if
        another broker held it, or, the HA port taking the embedded
        NameServer's, a broker registering with its own HA port."""
        if not 0 <= self.listenPort <= 65535:
            return []           # said already
        if self.ha_port > 65535:
            return [f"listenPort={self.listenPort}: its HA port, listenPort + 1, is not a port; "
                    f"set haListenPort"]
        bound = [("listenPort", self.listenPort)]
        if self.brokerRole != SLAVE:         # only a master listens for slaves
            bound.append(("haListenPort", self.ha_port))
        if self.runs_embedded_namesrv:
            bound.append(("namesrvListenPort", self.namesrvListenPort))
        bound.append(("metricsPort", self.metricsPort))
        errors, seen = [], {}
        for name, port in bound:
            if not port:                     # 0: any free port (or off)
                continue
            said = f"{name}={port}"
            if name == "haListenPort" and not self.haListenPort:
                said += " (listenPort + 1)"
            if port in seen:
                errors.append(f"{seen[port]} and {said}: one port for two listeners")
            else:
                seen[port] = said
        return errors

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.messageDelayLevel)

    @property
    def workers(self) -> int:
        return self.workerProcessNums or os.cpu_count() or 1

    @property
    def addr(self) -> str:
        return f"{self.brokerIP1}:{self.listenPort}"

    @property
    def ha_port(self) -> int:
        if self.haListenPort or not self.listenPort:   # listenPort 0 (any port): the HA one too
            return self.haListenPort
        return self.listenPort + 1

    @property
    def ha_addr(self) -> str:
        """The HA address this broker advertises (RocketMQ: brokerIP2:haListenPort)."""
        return f"{self.brokerIP1}:{self.ha_port}"

    @property
    def unix_path(self) -> str:
        return self.unixSocketPath or os.path.join(self.store.storePathRootDir, "broker.sock")

    @property
    def acl_file(self) -> str:
        """The ACL rules file (ValueError when aclEnable has none to name)."""
        from .acl import acl_path
        return acl_path(self.rocketmqHome, self.aclPlainFile)

    @property
    def credentials(self) -> Credentials | None:
        return Credentials.of(self.accessKey, self.secretKey)

    @property
    def runs_embedded_namesrv(self) -> bool:
        return self.embeddedNamesrv and not self.namesrvAddr

    @property
    def namesrv_addrs(self) -> list[str]:
        if self.namesrvAddr:
            return [a.strip() for a in self.namesrvAddr.split(";") if a.strip()]
        if self.embeddedNamesrv:
            return [f"127.0.0.1:{self.namesrvListenPort}"]
        return []

    @classmethod
    def from_strings(cls, values: dict[str, str]) -> tuple["BrokerConfig", list[str]]:
        """Build from broker.conf strings; returns (config, unknown keys)."""
        store_names = {f.name for f in dataclasses.fields(StoreConfig)} | set(OLD_NAMES)
        kwargs = {}
        own = {f.name: f for f in dataclasses.fields(cls) if f.name != "store"}
        unknown = []
        for k, v in values.items():
            if k in own:
                kwargs[k] = _convert(k, own[k].type, v)
            elif k not in store_names:
                unknown.append(k)
        return cls(store=StoreConfig.from_strings(values), **kwargs), unknown

    def describe(self) -> list[tuple[str, object, object]]:
        """(name, value, default) of every setting, broker's then store's."""
        out = []
        for obj, kind in ((self, BrokerConfig), (self.store, StoreConfig)):
            for f in dataclasses.fields(kind):
                if f.name == "store":
                    continue
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
                out.append((f.name, getattr(obj, f.name), default))
        return out


def _is_addr(text: str) -> bool:
    host, _, port = text.rpartition(":")
    # (a ',' in the host: two addresses joined the wrong way, "a:1,b:2")
    return bool(host) and "," not in host and port.isdigit() and 0 < int(port) <= 65535


def conf_text(value) -> str:
    """A setting's value as broker.conf and RocketMQ's properties write it
    (Java's toString: ``true``/``false``, not Python's ``True``/``False``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_conf(text: str, source: str = "broker.conf") -> dict[str, str]:
    """key=value lines; '#' starts a comment line; blank lines ignored."""
    values = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#") or line.startswith("!"):
            continue
        if "=" not in line:
            raise ValueError(f"{source}:{n}: expected key=value, got {line!r}")
        k, v = line.split("=", 1)
        if not k.strip():
            raise ValueError(f"{source}:{n}: a value with no setting name: {line!r}")
        values[k.strip()] = v.strip()
    return values


def load(path: str | None, overrides: dict[str, str] | None = None) -> tuple[BrokerConfig, list[str]]:
    values = {}
    if path:
        with open(path, encoding="utf-8") as f:
            try:
                text = f.read()
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            values = parse_conf(text, path)
    values.update(overrides or {})
    return BrokerConfig.from_strings(values)
