"""Access control, RocketMQ 4.x's way (broker/acl.py, ipc/signing.py).

The rules and the signature on their own first (RocketMQ's own test vector,
the address patterns, the file's errors, the order of the checks, a rules
file changed under a running check), then one real broker with
``aclEnable`` and its embedded NameServer: requests signed by shmq's
RemotingClient, client and ``shmq admin``, and by the real C++ core
(rocketmq==0.4.4, ``set_session_credentials``: a producer and a push
consumer) and ali-ons, each right key accepted and each wrong or missing
one refused as RocketMQ refuses it; a
forged broker registration refused by the NameServer. Every wait is bounded
and nothing is timed.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import orjson
import pytest

from brokerproc import start_broker
from shmq.broker.acl import PUB, SUB, Acl, AclFileError, address_matcher, load_rules, needed
from shmq.client import Message, Producer
from shmq.client.remoting import RemotingClient
from shmq.client.requests import SendTemplate, create_topic, pull_message, send_message
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import FrameDecoder, RemotingCommand
from shmq.ipc.signing import Credentials, sign, signature

ADMIN = Credentials("rocketmq2", "12345678")
PRODUCER = Credentials("producer1", "prodsecret1")
WHITE_AK = "whitelisted"
COMPAT = Path(__file__).resolve().parent / "compat"

RULES = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: rocketmq2
    secretKey: 12345678
    admin: true
  - accessKey: producer1
    secretKey: prodsecret1
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
    topicPerms: [Denied=DENY, ReadOnly=SUB]
    groupPerms: [BadGroup=DENY]
  - accessKey: whitelisted
    secretKey: whitesecret
    whiteRemoteAddress: 127.0.0.1
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def signed(cmd: RemotingCommand, creds: Credentials) -> RemotingCommand:
    sign(cmd, creds)
    return cmd


# ------------------------------------------------------------------ signature and rules
def test_signature_is_rocketmqs_hmac_sha1_of_the_sorted_values_and_body():
    ext = {"AccessKey": "RocketMQ", "consumerGroup": "g1", "topic": "T", "queueId": "0"}
    assert signature("12345678", ext, b"") == "X12le0wioj0Piv/aSb0QGxbk77E="   # JDK HmacSHA1 + Base64
    cmd = RemotingCommand(RC.HEART_BEAT, ext={"x": "1"}, body=b"{}")
    sign(cmd, Credentials("RocketMQ", "12345678"))
    assert cmd.ext["AccessKey"] == "RocketMQ"
    assert cmd.ext["Signature"] == signature("12345678", {"AccessKey": "RocketMQ", "x": "1"}, b"{}")


def test_the_producers_prebuilt_send_frames_carry_the_signature_sign_would_add():
    for batch in (False, True):
        t = SendTemplate("grp", "Topic%1", "TBW102", 4, PRODUCER)
        frame = t.frame(7, 3, 0, 1700000000123, 0, "" if batch else "TAGS\x01a\x02", b"body", batch)
        d = FrameDecoder()
        d.receive_data(frame)
        cmd = d.next_command()
        given = cmd.ext["Signature"]
        again = RemotingCommand(cmd.code, ext={k: v for k, v in cmd.ext.items() if k != "Signature"},
                                body=cmd.body)
        sign(again, PRODUCER)
        assert given == again.ext["Signature"] and cmd.ext["AccessKey"] == PRODUCER.access_key


@pytest.mark.parametrize("pattern, yes, no", [
    ("192.168.1.7", ["192.168.1.7"], ["192.168.1.8"]),
    ("*", ["1.2.3.4", "::1"], []),
    ("192.168.1.*", ["192.168.1.0", "192.168.1.255"], ["192.168.2.1", "::1"]),
    ("192.168.*.*", ["192.168.9.9"], ["192.169.0.1"]),
    ("192.168.1.10-20", ["192.168.1.10", "192.168.1.20"], ["192.168.1.9", "192.168.1.21"]),
    ("192.168.1.{1,2}", ["192.168.1.2"], ["192.168.1.3"]),
    ("10.0.0.1,10.0.0.2", ["10.0.0.2"], ["10.0.0.3"]),
    ("::1", ["::1", "0:0:0:0:0:0:0:1"], ["127.0.0.1"]),
    ("", [], ["127.0.0.1"]),
])
def test_white_remote_address_patterns(pattern, yes, no):
    m = address_matcher(pattern)
    assert all(m(ip) for ip in yes) and not any(m(ip) for ip in no)


@pytest.mark.parametrize("pattern", ["192.168.1", "300.1.1.1", "192.168.1.20-10", "1.2.*.4", "fe80::*"])
def test_bad_address_patterns_are_errors(pattern):
    with pytest.raises(ValueError):
        address_matcher(pattern)


@pytest.mark.parametrize("text, words", [
    ("accounts:\n  - accessKey: short\n    secretKey: 12345678\n", ["accounts[0].accessKey"]),
    ("accounts:\n  - accessKey: rocketmq2\n    secretKey: 12345678\n    topicPerms: [A=ALL]\n",
     ["'rocketmq2'", "topicPerms", "A=ALL"]),
    ("accounts:\n  - accessKey: rocketmq2\n    secretKey: 12345678\n    admin: yes please\n",
     ["admin"]),
    ("globalWhiteRemoteAddresses: [1.2.3]\n", ["globalWhiteRemoteAddresses", "1.2.3"]),
    ("accounts: [\n", ["not YAML"]),
    (b"accounts: [\xff]\n", ["not UTF-8"]),
    ("accounts:\n  - {accessKey: rocketmq2, secretKey: 12345678}\n"
     "  - {accessKey: rocketmq2, secretKey: 87654321}\n", ["listed twice"]),
])
def test_rules_file_errors_name_the_file_and_the_key(tmp_path, text, words):
    path = tmp_path / "plain_acl.yml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        write(path, text)
    with pytest.raises(AclFileError) as e:
        load_rules(str(path))
    assert str(path) in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_a_missing_rules_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(AclFileError, match="plain_acl.yml"):
        load_rules(str(tmp_path / "plain_acl.yml"))


def test_a_broker_whose_rules_do_not_load_does_not_start(tmp_path):
    write(tmp_path / "conf" / "plain_acl.yml", "accounts:\n  - accessKey: rocketmq2\n    secretKey: 1234\n")
    conf = write(tmp_path / "broker.conf", f"aclEnable=true\nrocketmqHome={tmp_path}\n"
                                           f"storePathRootDir={tmp_path / 'store'}\n")
    r = subprocess.run([sys.executable, "-m", "shmq.tools", "broker", "-c", str(conf)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == (f"shmq broker: aclEnable: {tmp_path}/conf/plain_acl.yml: accounts[0].secretKey: "
                                f"must be text longer than 6 characters")
    # with the embedded NameServer, the broker's own account must be an admin one
    write(tmp_path / "conf" / "plain_acl.yml", RULES)
    with open(conf, "a") as f:
        f.write(f"accessKey={PRODUCER.access_key}\nsecretKey={PRODUCER.secret_key}\n")
    r = subprocess.run([sys.executable, "-m", "shmq.tools", "broker", "-c", str(conf)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "would refuse this broker's registration (Need admin permission for " \
        "request code=103, but accessKey=producer1 is not)" in r.stderr, r.stderr


def test_checks_run_in_rocketmqs_order_with_its_messages(tmp_path):
    acl = Acl(str(write(tmp_path / "plain_acl.yml", RULES)))
    ip = "192.168.7.7"

    def check(cmd, creds=None, at=ip, **kw):
        return acl.check(at, signed(cmd, creds) if creds else cmd, **kw)
    assert check(send_message("T", b"x"), at="10.10.103.9") is None          # global white list
    assert check(send_message("T", b"x")) == "No accessKey is configured"
    assert check(send_message("T", b"x"), Credentials("nobody!!", "whatever")) == "No acl config for nobody!!"
    assert check(send_message("T", b"x"), Credentials(PRODUCER.access_key, "wrong-secret")) == \
        "Check signature failed for accessKey=producer1"
    assert check(send_message("T", b"x"), PRODUCER) is None
    assert check(send_message("Denied", b"x"), PRODUCER) == "No default permission for topic:Denied"
    assert check(send_message("ReadOnly", b"x"), PRODUCER) == "No default permission for topic:ReadOnly"
    assert check(pull_message("ReadOnly", 0, 0, group="g"), PRODUCER) is None
    assert check(pull_message("T", 0, 0, group="BadGroup"), PRODUCER) == "No default permission for group:BadGroup"
    assert check(create_topic("T"), PRODUCER) == \
        "Need admin permission for request code=17, but accessKey=producer1 is not"
    assert check(create_topic("T"), ADMIN) is None
    odd = signed(send_message("T", b"x"), PRODUCER)
    odd.ext["Signature"] = "\u00e9t\u00e9"                   # not ASCII: refused, not an exception
    assert check(odd) == "Check signature failed for accessKey=producer1"
    # the account's own white address: no signature needed, but the NameServer's admin check stays
    white = RemotingCommand(RC.REGISTER_BROKER, ext={"AccessKey": WHITE_AK})
    assert check(white, at="127.0.0.1") is None
    assert check(white, at="127.0.0.1", admin=True).startswith("Need admin permission")
    # a 4.9.4+ Java client signs _UNIQUE_KEY_QUERY, an older one does not: both pass
    for java_494 in (True, False):
        q = RemotingCommand(RC.QUERY_MESSAGE, ext={"topic": "T", "key": "k", "maxNum": "32",
                                                   "beginTimestamp": "0", "endTimestamp": "1"})
        if java_494:
            q.ext["_UNIQUE_KEY_QUERY"] = "true"
        sign(q, PRODUCER)
        if not java_494:
            q.ext["_UNIQUE_KEY_QUERY"] = "true"
        assert check(q) is None


def test_a_heartbeat_needs_sub_on_its_groups_and_their_topics():
    body = orjson.dumps({"clientID": "c", "producerDataSet": [{"groupName": "P"}],
                         "consumerDataSet": [{"groupName": "G", "subscriptionDataSet": [
                             {"topic": "T1"}, {"topic": "T2"}]}]})
    assert needed(RemotingCommand(RC.HEART_BEAT, body=body)) == {"%RETRY%G": SUB, "T1": SUB, "T2": SUB}
    assert needed(send_message("%RETRY%G", b"x", group="G")) == {"%RETRY%G": SUB}
    assert needed(send_message("T", b"x")) == {"T": PUB}
    batch = send_message("T", b"x")
    batch.code = RC.SEND_BATCH_MESSAGE
    assert needed(batch) == {"T": PUB}              # RocketMQ 4.9.7 checks a batch's signature only


def test_a_changed_rules_file_is_reloaded_and_a_broken_one_keeps_the_old_rules(tmp_path):
    now = [0.0]
    path = write(tmp_path / "plain_acl.yml", RULES)
    acl = Acl(str(path), clock=lambda: now[0])
    cmd = send_message("T", b"x")
    assert acl.check("127.0.0.2", cmd) == "No accessKey is configured"
    write(path, RULES.replace("10.10.103.*", "127.0.0.*") + "\n")
    assert acl.check("127.0.0.2", cmd) == "No accessKey is configured"     # looked at most once a second
    now[0] += 2
    assert acl.check("127.0.0.2", cmd) is None
    write(path, "accounts: [\n")
    now[0] += 2
    assert acl.check("127.0.0.2", cmd) is None
    restarted = Acl(str(path), clock=lambda: now[0])     # a worker started while it is broken
    assert restarted.check("127.0.0.2", signed(send_message("T", b"x"), ADMIN)) == "No acl config for rocketmq2"
    write(path, RULES)
    now[0] += 2
    assert restarted.check("127.0.0.2", signed(send_message("T", b"x"), ADMIN)) is None


# ------------------------------------------------------------------ a broker with aclEnable
@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    h = tmp_path_factory.mktemp("rocketmq-home")
    write(h / "conf" / "plain_acl.yml", RULES)
    return h


@pytest.fixture(scope="module")
def broker(tmp_path_factory, home):
    b = start_broker(tmp_path_factory.mktemp("acl-broker"), aclEnable="true", rocketmqHome=str(home),
                     accessKey=ADMIN.access_key, secretKey=ADMIN.secret_key,
                     autoCreateTopicEnable="true", defaultTopicQueueNums=4)
    try:
        yield b
    finally:
        b.stop()


def topic(prefix: str = "Acl") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def made_topic(broker, name: str | None = None) -> str:
    """A topic created by the admin account and routed by the NameServer."""
    name = name or topic()
    with RemotingClient(broker.addr, credentials=ADMIN) as c:
        r = c.invoke(create_topic(name, 4))
        assert r.code == R.SUCCESS, r.remark
    route = RemotingCommand(RC.GET_ROUTEINFO_BY_TOPIC, ext={"topic": name})
    deadline = time.monotonic() + 10
    with RemotingClient(broker.namesrv) as ns:
        while ns.invoke(route).code != R.SUCCESS:
            assert time.monotonic() < deadline, f"{name} never reached the NameServer"
            time.sleep(0.05)
    return name


def refused(reply: RemotingCommand, why: str) -> bool:
    return reply.code == R.SYSTEM_ERROR and reply.remark == f"org.apache.rocketmq.acl.common.AclException: {why}"


def test_the_right_key_is_accepted_a_wrong_or_missing_one_refused(broker):
    t = made_topic(broker)
    for addr in (broker.addr, "unix:" + broker.unix):
        with RemotingClient(addr, credentials=PRODUCER) as c:
            assert c.invoke(send_message(t, b"ok")).code == R.SUCCESS
        with RemotingClient(addr, credentials=Credentials(PRODUCER.access_key, "not-the-secret")) as c:
            assert refused(c.invoke(send_message(t, b"x")), "Check signature failed for accessKey=producer1")
        with RemotingClient(addr) as c:
            assert refused(c.invoke(send_message(t, b"x")), "No accessKey is configured")
            forged = signed(send_message(t, b"x"), PRODUCER)
            forged.body = b"something else"
            assert refused(c.invoke(forged), "Check signature failed for accessKey=producer1")
    with RemotingClient(broker.addr, credentials=PRODUCER) as c:
        r = c.invoke(pull_message(t, 0, 0, group="readers"))
        assert r.code != R.SYSTEM_ERROR, r.remark           # past the ACL: the pull's own answer


def test_topic_perms_deny_and_sub_only_refuse_sends(broker):
    for name in ("Denied", "ReadOnly"):
        made_topic(broker, name)
        with RemotingClient(broker.addr, credentials=PRODUCER) as c:
            assert refused(c.invoke(send_message(name, b"x")), f"No default permission for topic:{name}")
    with RemotingClient(broker.addr, credentials=PRODUCER) as c:
        assert c.invoke(pull_message("ReadOnly", 0, 0, group="readers")).code != R.SYSTEM_ERROR


def test_admin_requests_need_an_admin_account(broker):
    update = RemotingCommand(RC.UPDATE_BROKER_CONFIG, body=b"brokerPermission=6\n")
    for cmd in (create_topic(topic()), update, RemotingCommand(RC.DELETE_TOPIC_IN_BROKER, ext={"topic": "x"})):
        with RemotingClient(broker.addr, credentials=PRODUCER) as c:
            r = c.invoke(RemotingCommand(cmd.code, ext=dict(cmd.ext), body=cmd.body))
            assert refused(r, f"Need admin permission for request code={cmd.code}, "
                              f"but accessKey=producer1 is not")
        with RemotingClient(broker.addr, credentials=ADMIN) as c:
            assert c.invoke(cmd).code == R.SUCCESS
    with RemotingClient(broker.addr, credentials=ADMIN) as c:
        conf = c.invoke(RemotingCommand(RC.GET_BROKER_CONFIG)).body.decode()
    assert "secretKey=******" in conf.splitlines() and ADMIN.secret_key not in conf


def test_an_accounts_white_address_needs_no_signature(broker):
    t = made_topic(broker)
    with RemotingClient(broker.addr) as c:
        r = c.invoke(RemotingCommand(RC.SEND_MESSAGE_V2, ext={**send_message(t, b"x").ext,
                                                              "AccessKey": WHITE_AK}, body=b"x"))
        assert r.code == R.SUCCESS, r.remark


def test_the_namesrv_refuses_forged_registrations_and_admin_requests(broker):
    from shmq.broker.namesrv import register_broker_request, unregister_broker_request
    made_topic(broker)              # the broker itself registers: signed with its admin account

    def forged():
        return register_broker_request(cluster="DefaultCluster", broker_name="broker-forged",
                                       broker_addr="127.0.0.1:1", broker_id=0,
                                       topic_configs={"Hijacked": {}}, data_version={"timestamp": 1, "counter": 1})
    with RemotingClient(broker.namesrv) as ns:
        assert refused(ns.invoke(forged()), "No accessKey is configured")
        assert refused(ns.invoke(signed(forged(), PRODUCER)),
                       "Need admin permission for request code=103, but accessKey=producer1 is not")
        assert refused(ns.invoke(signed(forged(), Credentials(ADMIN.access_key, "guessed-secret"))),
                       "Check signature failed for accessKey=rocketmq2")
        unreg = unregister_broker_request(cluster="DefaultCluster", broker_name="broker-a",
                                          broker_addr=broker.addr, broker_id=0)
        assert refused(ns.invoke(unreg), "No accessKey is configured")
        wipe = RemotingCommand(RC.WIPE_WRITE_PERM_OF_BROKER, ext={"brokerName": "broker-a"})
        assert refused(ns.invoke(wipe), "No accessKey is configured")
        info = orjson.loads(ns.invoke(RemotingCommand(RC.GET_BROKER_CLUSTER_INFO)).body)
        assert "broker-forged" not in info["brokerAddrTable"]
        route = ns.invoke(RemotingCommand(RC.GET_ROUTEINFO_BY_TOPIC, ext={"topic": "Hijacked"}))
        assert route.code == R.TOPIC_NOT_EXIST


def test_a_standalone_namesrv_with_acl_takes_only_signed_brokers(tmp_path, home):
    from brokerproc import BrokerProc, broker_conf, free_port, ready_line
    from shmq.broker.namesrv import register_broker_request
    port = free_port()
    ns = subprocess.Popen([sys.executable, "-m", "shmq.tools", "namesrv", "-p", str(port), "--acl",
                           str(home / "conf" / "plain_acl.yml")], stdout=subprocess.PIPE, text=True)
    try:
        assert ready_line(ns, 60).startswith("shmq namesrv ready")
        addr = f"127.0.0.1:{port}"
        info = RemotingCommand(RC.GET_BROKER_CLUSTER_INFO)
        with RemotingClient(addr) as c:
            forged = register_broker_request(cluster="DefaultCluster", broker_name="broker-forged",
                                             broker_addr="127.0.0.1:1", broker_id=0, topic_configs={},
                                             data_version={"timestamp": 1, "counter": 1})
            assert refused(c.invoke(forged), "No accessKey is configured")
            conf = broker_conf(tmp_path, namesrvAddr=addr, accessKey=ADMIN.access_key,
                               secretKey=ADMIN.secret_key)
            with BrokerProc(tmp_path, conf).start():       # ready: it has registered
                assert b"broker-a" in c.invoke(info).body
            assert b"broker-forged" not in c.invoke(info).body
    finally:
        ns.terminate()
        ns.wait(30)


def test_shmq_clients_sign_with_their_credentials(broker):
    t = made_topic(broker)
    with Producer("acl-producer", namesrv_addr=broker.namesrv, access_key=PRODUCER.access_key,
                  secret_key=PRODUCER.secret_key, retry_times_when_send_failed=0) as p:
        for i in range(3):
            assert p.send(Message(t, b"signed %d" % i, tags="A")).status.value == "SEND_OK"
        with pytest.raises(Exception, match="No default permission for topic:Denied"):
            p.send(Message("Denied", b"x"))
    batches = []

    async def batched() -> list:                   # the accumulator's SEND_BATCH_MESSAGE frames
        from shmq.client import AsyncProducer
        async with AsyncProducer("acl-batcher", namesrv_addr=broker.namesrv, linger_ms=20,
                                 access_key=PRODUCER.access_key, secret_key=PRODUCER.secret_key) as p:
            write_batch = p.write_batch
            p.write_batch = lambda *a: batches.append(len(a[2])) or write_batch(*a)
            return await asyncio.gather(*[p.send(Message(t, b"batched %d" % i)) for i in range(20)])
    assert all(r.status.value == "SEND_OK" for r in asyncio.run(batched()))
    assert sum(batches) > len(batches) > 0, batches
    from shmq.client import LitePullConsumer
    c = LitePullConsumer("acl-readers", namesrv_addr=broker.namesrv, access_key=PRODUCER.access_key,
                         secret_key=PRODUCER.secret_key, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe(t)
    got = []
    with c:
        deadline = time.monotonic() + 20
        while len(got) < 23 and time.monotonic() < deadline:
            got += c.poll(1.0)
    assert sorted(m.body for m in got) == sorted([b"signed %d" % i for i in range(3)] +
                                                 [b"batched %d" % i for i in range(20)])
    with Producer("acl-anonymous", namesrv_addr=broker.namesrv, retry_times_when_send_failed=0) as p:
        with pytest.raises(Exception, match="No accessKey is configured"):
            p.send(Message(t, b"unsigned"))
    with pytest.raises(ValueError, match="both"):
        Producer("half", namesrv_addr=broker.namesrv, access_key="only-a-key")


def admin(broker, *args, env=None):
    """``shmq admin`` with only the credentials the test gives it."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("SHMQ_ACCESS_KEY", "SHMQ_SECRET_KEY", "ROCKETMQ_HOME")}
    return subprocess.run([sys.executable, "-m", "shmq.tools", "admin", *args, "-n", broker.namesrv],
                          capture_output=True, text=True, timeout=60, env={**full, **(env or {})})


def test_shmq_admin_signs_with_flags_variables_or_mqadmins_tools_yml(broker, tmp_path):
    t = topic()
    r = admin(broker, "updateTopic", "-b", broker.addr, "-t", t,
              "--access-key", PRODUCER.access_key, "--secret-key", PRODUCER.secret_key)
    assert r.returncode == 1 and "SYSTEM_ERROR (1)" in r.stderr and "Need admin permission" in r.stderr, r.stderr
    r = admin(broker, "updateTopic", "-b", broker.addr, "-t", t,
              env={"SHMQ_ACCESS_KEY": ADMIN.access_key, "SHMQ_SECRET_KEY": ADMIN.secret_key})
    assert r.returncode == 0, r.stderr
    tools_home = tmp_path / "tools-home"
    write(tools_home / "conf" / "tools.yml", f"accessKey: {ADMIN.access_key}\nsecretKey: '{ADMIN.secret_key}'\n")
    r = admin(broker, "updateBrokerConfig", "-b", broker.addr, "-k", "brokerPermission", "-v", "6",
              env={"ROCKETMQ_HOME": str(tools_home)})
    assert r.returncode == 0, r.stderr
    r = admin(broker, "updateTopic", "-b", broker.addr, "-t", t, "--access-key", "lonely-key")
    assert r.returncode == 2 and "secret key" in r.stderr


# ------------------------------------------------------------------ real clients
def cpp_missing() -> str | None:
    from test_compat_clients import MISSING
    return MISSING["cpp"]


def ons_missing() -> str | None:
    from test_compat_clients import MISSING
    return MISSING["ons"]


CPP_SEND = textwrap.dedent("""\
    import json, sys
    from rocketmq.client import Message, Producer
    namesrv, topic, ak, sk = sys.argv[1:5]
    p = Producer("PID_acl_cpp", timeout=3000)
    p.set_namesrv_addr(namesrv)
    p.set_session_credentials(ak, sk, "ALIYUN")
    p.start()
    for i in range(2):
        m = Message(topic)
        m.set_tags("TagA")
        m.set_keys("k%d" % i)
        m.set_body("cpp-acl-%d" % i)
        try:
            r = p.send_sync(m)
            print(json.dumps({"status": int(r.status), "msgId": r.msg_id}), flush=True)
        except Exception as e:
            print(json.dumps({"error": str(e)[:300]}), flush=True)
    p.shutdown()
""")

ONS_SEND = textwrap.dedent("""\
    'use strict';
    const { Producer, Message } = require('ali-ons');
    const [namesrv, topic, accessKey, secretKey] = process.argv.slice(2);
    const quiet = { info() {}, warn() {}, debug() {}, error() {} };
    const httpclient = { async request(url) { throw new Error('no address server: ' + url); } };
    (async () => {
      const p = new Producer({ httpclient, nameSrv: namesrv, logger: quiet, accessKey, secretKey,
                               producerGroup: 'PID_acl_ons', sendMsgTimeout: 3000, retryTimesWhenSendFailed: 0 });
      p.on('error', () => {});
      await p.ready();
      for (let i = 0; i < 2; i++) {
        try {
          const r = await p.send(new Message(topic, 'TagA', 'ons-acl-' + i));
          console.log(JSON.stringify({ status: r.sendStatus, msgId: r.msgId }));
        } catch (e) {
          console.log(JSON.stringify({ error: String(e.message).slice(0, 300) }));
        }
      }
      try { await p.close(); } catch (e) { /* unregistering with a wrong key is refused too */ }
      process.exit(0);
    })().catch(e => { console.log(JSON.stringify({ error: String(e.message) })); process.exit(0); });
""")


def run_client(argv: list[str], tmp_path: Path, env: dict) -> list[dict]:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **env},
                       cwd=str(tmp_path))
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 2, f"exit {r.returncode}; stdout {r.stdout[-1000:]}; stderr {r.stderr[-2000:]}"
    return lines


@pytest.mark.parametrize("secret, accepted", [(PRODUCER.secret_key, True), ("a-wrong-secret", False)])
def test_the_real_cpp_client_with_session_credentials(broker, tmp_path, secret, accepted):
    if cpp_missing():
        pytest.skip(cpp_missing())
    t = made_topic(broker)
    script = write(tmp_path / "cpp_send.py", CPP_SEND)
    home = tmp_path / "home"                     # librocketmq writes logs under $HOME
    home.mkdir()
    out = run_client([sys.executable, str(script), broker.namesrv, t, PRODUCER.access_key, secret],
                     tmp_path, {"HOME": str(home)})
    if accepted:
        assert [o.get("status") for o in out] == [0, 0], out
    else:
        assert all("error" in o for o in out), out
        assert "Check signature failed for accessKey=producer1" in broker.log()


CPP_CONSUME = textwrap.dedent("""\
    import json, sys, time
    from rocketmq.client import PushConsumer
    namesrv, topic, ak, sk = sys.argv[1:5]
    c = PushConsumer("GID_acl_cpp")
    c.set_namesrv_addr(namesrv)
    c.set_session_credentials(ak, sk, "ALIYUN")
    got = []
    c.subscribe(topic, lambda msg: got.append(msg.body.decode()))
    c.start()
    deadline = time.time() + 30
    while len(got) < 2 and time.time() < deadline:
        time.sleep(0.1)
    c.shutdown()
    for body in sorted(got):
        print(json.dumps({"body": body}), flush=True)
""")


def test_the_real_cpp_consumer_signs_its_heartbeats_pulls_and_offsets(broker, tmp_path):
    if cpp_missing():
        pytest.skip(cpp_missing())
    t = made_topic(broker)
    with RemotingClient(broker.addr, credentials=PRODUCER) as c:
        for i in range(2):
            assert c.invoke(send_message(t, b"cpp-pull-%d" % i)).code == R.SUCCESS
    script = write(tmp_path / "cpp_consume.py", CPP_CONSUME)
    home = tmp_path / "home"
    home.mkdir()
    out = run_client([sys.executable, str(script), broker.namesrv, t, PRODUCER.access_key,
                      PRODUCER.secret_key], tmp_path, {"HOME": str(home)})
    assert [o["body"] for o in out] == ["cpp-pull-0", "cpp-pull-1"]


@pytest.mark.parametrize("secret, accepted", [(PRODUCER.secret_key, True), ("a-wrong-secret", False)])
def test_the_real_ali_ons_client_with_access_keys(broker, tmp_path, secret, accepted):
    if ons_missing():
        pytest.skip(ons_missing())
    t = made_topic(broker)
    script = write(tmp_path / "ons_send.js", ONS_SEND)
    out = run_client([shutil.which("node"), str(script), broker.namesrv, t, PRODUCER.access_key, secret],
                     tmp_path, {"NODE_PATH": str(COMPAT / "node_modules")})
    if accepted:
        assert [o.get("status") for o in out] == ["SEND_OK", "SEND_OK"], out
    else:
        assert all("error" in o for o in out), out


def test_a_rules_file_changed_under_the_broker_applies_without_a_restart(broker, home):
    t = made_topic(broker)
    path = home / "conf" / "plain_acl.yml"
    write(path, RULES.replace("10.10.103.*", "127.0.0.1"))
    try:
        with RemotingClient(broker.addr) as c:
            deadline = time.monotonic() + 20
            while (r := c.invoke(send_message(t, b"x"))).code != R.SUCCESS:
                assert time.monotonic() < deadline, r.remark
                time.sleep(0.1)
    finally:
        write(path, RULES)
