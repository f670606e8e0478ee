"""Access control as RocketMQ 4.x does it (``aclEnable``, ``plain_acl.yml``).

The file (RocketMQ's format, ``<rocketmqHome>/conf/plain_acl.yml`` unless
``aclPlainFile`` names another)::

    globalWhiteRemoteAddresses: [10.10.103.*, 192.168.0.*]   # skip every check
    accounts:
      - accessKey: RocketMQ           # longer than 6 characters
        secretKey: 12345678           # longer than 6 characters
        whiteRemoteAddress: 192.168.1.*   # from here: no signature, no perms
        admin: false                  # may send the admin codes
        defaultTopicPerm: DENY        # topics not listed (absent: DENY)
        defaultGroupPerm: SUB         # groups not listed (absent: DENY)
        topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
        groupPerms: [groupA=DENY, groupB=PUB|SUB]

``Acl.check`` is PlainPermissionManager.validate: a request from a globally
white-listed address passes; else it needs a known ``AccessKey``; a request
from the account's own white address passes; else its ``Signature`` must be
right (ipc/signing.py); then admin codes need ``admin: true``, and the
topics and groups the request names need the perm its code asks for (PUB to
send, SUB to pull, to commit offsets, to heartbeat a consumer group and to
send back to %RETRY%). A denial is what RocketMQ 4.x answers: SYSTEM_ERROR
with the AclException text as remark, no reply to a oneway request.

Addresses: the connection's peer IP; a Unix-socket client counts as
127.0.0.1. Patterns: an exact IP (v4 or v6), ``*`` (any), ``a.b.c.*`` /
``a.b.*.*`` and ``a.b.c.1-100`` ranges, ``a.b.c.{1,2,3}`` and comma lists.

The file is read at start (errors name the file and the key, and stop the
broker) and again when it changes, as RocketMQ watches it: each process
looks at its size and mtime at most once a second while requests come; a
changed file that does not load is logged and the previous rules stay. A
process that starts later (a worker restarted) while the file does not
load refuses every request until it does.
"""
from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable

import orjson
import yaml

from shmq.core.checkpoint import parse_json_lenient
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import JSON, RemotingCommand
from shmq.ipc.signing import ACCESS_KEY, SIGNATURE, UNIQUE_KEY_QUERY, Credentials, sign, signature

log = logging.getLogger("shmq.acl")

# Permission bits (acl/common/Permission)
DENY, ANY, PUB, SUB = 1, 2, 4, 8
PERMS = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}
# Permission.ADMIN_CODE: only an admin account may send these
ADMIN_CODES = frozenset({RC.UPDATE_AND_CREATE_TOPIC, RC.UPDATE_BROKER_CONFIG, RC.DELETE_TOPIC_IN_BROKER,
                         RC.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RC.DELETE_SUBSCRIPTIONGROUP})
RETRY = "%RETRY%"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"      # trace producers may publish to it whatever their perms
KEY_MIN = 7                              # AclConstants: keys must be longer than 6
RECHECK_S = 1.0
EXCEPTION = "org.apache.rocketmq.acl.common.AclException"

ACCOUNT_KEYS = {"accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
                "defaultGroupPerm", "topicPerms", "groupPerms"}
TOP_KEYS = {"globalWhiteRemoteAddresses", "accounts", "dataVersion"}

Matcher = Callable[[str], bool]


class AclFileError(ValueError):
    """plain_acl.yml cannot be used; the message names the file and the key."""


# ------------------------------------------------------------------ addresses
def _never(ip: str) -> bool:
    return False


def _always(ip: str) -> bool:
    return True


def _ip(text: str) -> str | None:
    """The canonical form of an IP address, or None if ``text`` is not one."""
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        return None


@functools.lru_cache(maxsize=4096)
def _peer(ip: str) -> tuple[str | None, bytes | None]:
    """A peer IP's canonical form and its IPv4 bytes (None if not IPv4),
    parsed once per address: ``ipaddress`` costs microseconds a call."""
    canonical = _ip(ip)
    try:
        v4 = ipaddress.IPv4Address(ip).packed
    except ValueError:
        v4 = None
    return canonical, v4


def _octet(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 255:
        raise ValueError(f"{text!r} is not 0..255")
    return int(text)


def address_matcher(pattern) -> Matcher:
    """A whiteRemoteAddress pattern as a test of a peer IP
    (RemoteAddressStrategyFactory); ValueError for a pattern it cannot be."""
    if pattern is None or not str(pattern).strip():
        return _never
    p = str(pattern).strip()
    if p in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return _always
    if p.endswith("}"):                               # a.b.c.{1,2,3}
        head, brace, tail = p.rpartition("{")
        if not brace:
            raise ValueError("'}' without '{'")
        return _one_of([head + x.strip() for x in tail[:-1].split(",")])
    if "," in p:
        return _one_of(p.split(","))
    if "*" in p or "-" in p:
        return _range(p)
    ip = _ip(p)
    if ip is None:
        raise ValueError("not an IP address")
    return lambda peer: _peer(peer)[0] == ip


def _one_of(items: list[str]) -> Matcher:
    ips = set()
    for item in items:
        ip = _ip(item)
        if ip is None:
            raise ValueError(f"{item.strip()!r} is not an IP address")
        ips.add(ip)
    return lambda peer: _peer(peer)[0] in ips


def _range(p: str) -> Matcher:
    """``a.*.*.*``, ``a.b.*.*``, ``a.b.c.*``, ``a.b.c.lo-hi`` (also in the
    second or third place, with ``*`` after it): IPv4 only."""
    parts = p.split(".")
    if len(parts) != 4:
        raise ValueError("a range is an IPv4 address with '*' or 'lo-hi' in one place (IPv6 ranges "
                         "are not supported)")
    at = next((i for i in range(1, 4) if "*" in parts[i] or "-" in parts[i]), None)
    if at is None or any(x != "*" for x in parts[at + 1:]):
        raise ValueError("'*' or 'lo-hi' must be in the second, third or fourth place, "
                         "with only '*' after it")
    head = tuple(_octet(x) for x in parts[:at])
    if parts[at] == "*":
        lo, hi = 0, 255
    else:
        a, dash, b = parts[at].partition("-")
        if not dash:
            raise ValueError(f"{parts[at]!r} is neither '*' nor 'lo-hi'")
        lo, hi = _octet(a), _octet(b)
        if lo > hi:
            raise ValueError(f"{parts[at]!r}: the range is empty")

    def match(peer: str) -> bool:
        packed = _peer(peer)[1]
        return packed is not None and tuple(packed[:at]) == head and lo <= packed[at] <= hi
    return match


# ------------------------------------------------------------------ the file
@dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: str
    white: Matcher
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    perms: dict[str, int] | None      # topic, or %RETRY%group → perm; None: none listed


@dataclass(frozen=True)
class Rules:
    white: tuple[Matcher, ...]
    accounts: dict[str, Account]


def parse_perm(text, where: str) -> int:
    if text is None:
        return DENY
    perm = PERMS.get(str(text).strip())
    if perm is None:
        raise AclFileError(f"{where}: {text!r} is not a permission (DENY, PUB, SUB, PUB|SUB)")
    return perm


def _account(path: str, i: int, a) -> Account:
    where = f"{path}: accounts[{i}]"
    if not isinstance(a, dict):
        raise AclFileError(f"{where}: not a mapping")
    for k in a.keys() - ACCOUNT_KEYS:
        log.warning("%s: unknown key %r ignored", where, k)
    keys = {}
    for k in ("accessKey", "secretKey"):
        v = a.get(k)
        if not isinstance(v, (str, int)) or isinstance(v, bool) or len(str(v)) < KEY_MIN:
            raise AclFileError(f"{where}.{k}: must be text longer than {KEY_MIN - 1} characters")
        keys[k] = str(v)
    where = f"{path}: account {keys['accessKey']!r}"
    admin = a.get("admin", False)
    if not isinstance(admin, bool):
        raise AclFileError(f"{where}: admin: {admin!r} is not true or false")
    try:
        white = address_matcher(a.get("whiteRemoteAddress"))
    except ValueError as e:
        raise AclFileError(f"{where}: whiteRemoteAddress {a.get('whiteRemoteAddress')!r}: {e}") from None
    perms: dict[str, int] | None = None
    for key, prefix in (("topicPerms", ""), ("groupPerms", RETRY)):
        items = a.get(key) or []
        if not isinstance(items, list):
            raise AclFileError(f"{where}: {key}: not a list")
        for item in items:
            name, eq, perm = str(item).partition("=")
            if not eq or not name.strip():
                raise AclFileError(f"{where}: {key}: {item!r} is not Name=PERM")
            if perms is None:
                perms = {}
            perms[prefix + name.strip()] = parse_perm(perm, f"{where}: {key}: {item!r}")
    return Account(keys["accessKey"], keys["secretKey"], white, admin,
                   parse_perm(a.get("defaultTopicPerm"), f"{where}: defaultTopicPerm"),
                   parse_perm(a.get("defaultGroupPerm"), f"{where}: defaultGroupPerm"), perms)


def load_rules(path: str) -> Rules:
    """Read and check ``plain_acl.yml``; AclFileError names what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise AclFileError(f"{path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise AclFileError(f"{path}: not UTF-8: {e}") from None
    except yaml.YAMLError as e:
        raise AclFileError(f"{path}: not YAML: {e}".replace("\n", " ")) from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise AclFileError(f"{path}: not a mapping of globalWhiteRemoteAddresses and accounts")
    for k in doc.keys() - TOP_KEYS:
        log.warning("%s: unknown key %r ignored", path, k)
    white = []
    addrs = doc.get("globalWhiteRemoteAddresses") or []
    if not isinstance(addrs, list):
        raise AclFileError(f"{path}: globalWhiteRemoteAddresses: not a list")
    for p in addrs:
        try:
            white.append(address_matcher(p))
        except ValueError as e:
            raise AclFileError(f"{path}: globalWhiteRemoteAddresses: {p!r}: {e}") from None
    accounts_doc = doc.get("accounts") or []
    if not isinstance(accounts_doc, list):
        raise AclFileError(f"{path}: accounts: not a list")
    accounts = {}
    for i, a in enumerate(accounts_doc):
        acct = _account(path, i, a)
        if acct.access_key in accounts:
            raise AclFileError(f"{path}: account {acct.access_key!r} is listed twice")
        accounts[acct.access_key] = acct
    return Rules(tuple(white), accounts)


def acl_path(rocketmq_home: str, plain_file: str) -> str:
    """Where the rules are: ``plain_file``, else RocketMQ's default."""
    if plain_file:
        return plain_file
    if not rocketmq_home:
        raise AclFileError("aclEnable=true needs aclPlainFile or rocketmqHome ($ROCKETMQ_HOME), "
                           "whose conf/plain_acl.yml holds the accounts")
    return os.path.join(rocketmq_home, "conf", "plain_acl.yml")


# ------------------------------------------------------------------ requests
def _retry(group) -> str | None:
    return RETRY + group if isinstance(group, str) else None


def needed(cmd: RemotingCommand) -> dict[str, int]:
    """The topics (and %RETRY%group for groups) a request uses, each with
    the perm it needs (PlainAccessValidator.parse); {} for codes that need
    only a signature. Unlike RocketMQ 4.x, a SEND_BATCH_MESSAGE needs PUB
    too (4.9.7 checks only its signature, so a batch could write to a
    topic its account may not send to)."""
    ext, code = cmd.ext, cmd.code
    out: dict[str, int] = {}

    def add(resource, perm: int) -> None:
        if isinstance(resource, str):
            out[resource] = perm
    if code in (RC.SEND_MESSAGE, RC.SEND_MESSAGE_V2, RC.SEND_BATCH_MESSAGE):
        topic, group = (ext.get("topic"), ext.get("group")) if code == RC.SEND_MESSAGE else \
            (ext.get("b"), ext.get("a"))
        if topic is not None and topic.startswith(RETRY):
            add(_retry(group), SUB)
        else:
            add(topic, PUB)
    elif code == RC.CONSUMER_SEND_MSG_BACK:
        add(_retry(ext.get("group")), SUB)
    elif code == RC.PULL_MESSAGE:
        add(ext.get("topic"), SUB)
        add(_retry(ext.get("consumerGroup")), SUB)
    elif code == RC.QUERY_MESSAGE:
        add(ext.get("topic"), SUB)
    elif code == RC.HEART_BEAT:
        for c in _heartbeat_consumers(cmd.body):
            add(_retry(c.get("groupName")), SUB)
            for sd in c.get("subscriptionDataSet") or []:
                if isinstance(sd, dict):
                    add(sd.get("topic"), SUB)
    elif code in (RC.UNREGISTER_CLIENT, RC.GET_CONSUMER_LIST_BY_GROUP):
        add(_retry(ext.get("consumerGroup")), SUB)
    elif code == RC.UPDATE_CONSUMER_OFFSET:
        add(_retry(ext.get("consumerGroup")), SUB)
        add(ext.get("topic"), SUB)
    return out


def _heartbeat_consumers(body) -> list[dict]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            data = parse_json_lenient(bytes(body).decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"the heartbeat body is not JSON: {e}") from None
    consumers = data.get("consumerDataSet") if isinstance(data, dict) else None
    return [c for c in consumers or [] if isinstance(c, dict)]


def _allowed(needed_perm: int, owned: int) -> bool:
    """Permission.checkPermission."""
    if owned & DENY:
        return False
    if needed_perm & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed_perm & owned)


def _not_admin(cmd: RemotingCommand, ak: str) -> str:
    return f"Need admin permission for request code={cmd.code}, but accessKey={ak} is not"


def _what(resource: str) -> str:
    return f"group:{resource[len(RETRY):]}" if resource.startswith(RETRY) else f"topic:{resource}"


class Acl:
    """One process's rules, reloaded when the file changes."""

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic):
        self.path = path
        self.clock = clock
        self._stamp = self._stat()
        try:
            self.rules = load_rules(path)
        except AclFileError as e:
            log.error("%s cannot be used, every request is refused until it loads: %s", path, e)
            self.rules = Rules((), {})
        self._next_look = clock() + RECHECK_S

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _fresh(self) -> Rules:
        now = self.clock()
        if now >= self._next_look:
            self._next_look = now + RECHECK_S
            stamp = self._stat()
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self.rules = load_rules(self.path)
                    log.info("%s changed: %d account(s) loaded", self.path, len(self.rules.accounts))
                except AclFileError as e:
                    log.error("%s changed but cannot be used, the previous rules stay: %s", self.path, e)
        return self.rules

    def check(self, ip: str, cmd: RemotingCommand, admin: bool = False) -> str | None:
        """None if the request may run, else why not (the AclException
        message). ``admin``: the request needs an admin account whatever its
        code (the NameServer's broker and admin requests)."""
        rules = self._fresh()
        for white in rules.white:
            if white(ip):
                return None
        ext = cmd.ext
        ak = ext.get(ACCESS_KEY)
        if ak is None:
            return "No accessKey is configured"
        acct = rules.accounts.get(ak)
        if acct is None:
            return f"No acl config for {ak}"
        if acct.white(ip):
            return _not_admin(cmd, ak) if admin and not acct.admin else None
        if not self._signed(acct, cmd):
            return f"Check signature failed for accessKey={ak}"
        try:
            need = needed(cmd)
        except ValueError as e:
            return str(e)
        if need.get(TRACE_TOPIC) == PUB:
            return None
        if (admin or cmd.code in ADMIN_CODES) and not acct.admin:
            return _not_admin(cmd, ak)
        if not need or (acct.admin and acct.perms is None):
            return None
        owned = acct.perms or {}
        for resource, perm in need.items():
            mine = owned.get(resource)
            if mine is None:
                mine = acct.default_group_perm if resource.startswith(RETRY) else acct.default_topic_perm
            if not _allowed(perm, mine):
                return f"No default permission for {_what(resource)}"
        return None

    @staticmethod
    def _signed(acct: Account, cmd: RemotingCommand) -> bool:
        given = cmd.ext.get(SIGNATURE)
        if given is None:
            return False
        given = given.encode()         # compare_digest takes str only when it is ASCII
        if hmac.compare_digest(signature(acct.secret_key, cmd.ext, cmd.body,
                                         (SIGNATURE, UNIQUE_KEY_QUERY)).encode(), given):
            return True
        # a 4.9.4+ Java client signed _UNIQUE_KEY_QUERY too
        return UNIQUE_KEY_QUERY in cmd.ext and hmac.compare_digest(
            signature(acct.secret_key, cmd.ext, cmd.body).encode(), given)


def own_registration_refused(path: str, credentials: Credentials | None) -> str | None:
    """Why a NameServer with these rules would refuse a registration from
    127.0.0.1 signed with ``credentials`` (the embedded NameServer and its
    broker), or None."""
    cmd = RemotingCommand(RC.REGISTER_BROKER)
    if credentials is not None:
        sign(cmd, credentials)
    return Acl(path).check("127.0.0.1", cmd, admin=True)


def denied(cmd: RemotingCommand, why: str) -> RemotingCommand:
    """RocketMQ 4.x's answer to a request its ACL refused: SYSTEM_ERROR, the
    exception's text as remark, JSON (createResponseCommand)."""
    reply = cmd.reply(R.SYSTEM_ERROR, f"{EXCEPTION}: {why}")
    reply.serialize_type = JSON
    return reply
