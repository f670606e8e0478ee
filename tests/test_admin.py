"""``shmq admin`` as a user runs it, against one real broker and its embedded NameServer.

Most commands run in-process (``admin(...)``: the same parser and code as the
command line, without a Python start-up each); a few run as real
subprocesses (``shmq(...)``), the help, the error cases and sendMessage
among them. Every assertion is on what the user sees: the parsed ``--json``
document, the exit status, the line on stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
from brokerproc import free_port, start_broker
from shmq.client import ConsumeConcurrentlyStatus, Message, Producer, PushConsumer
from shmq.client.remoting import RemotingClient
from shmq.client.requests import heartbeat, send_message
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand
from shmq.tools import admin as admin_cli
from shmq.tools.admin_client import AdminClient

BROKER = "broker-a"
CLUSTER = "DefaultCluster"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    # retention's deleteWhen hour far from now: only deleteExpiredCommitLog deletes here
    far_hour = f"{(time.localtime().tm_hour + 12) % 24:02d}"
    b = start_broker(tmp_path_factory.mktemp("admin"), deleteWhen=far_hour)
    assert until(b, "clusterList")[1]["brokers"], "the broker never registered"
    yield b
    assert b.stop() == 0, b.log()[-3000:]


def admin(broker, *argv, json_out=True, namesrv=None):
    """``shmq admin <argv> -n <NameServer> [--json]`` in this process:
    (exit status, stdout — parsed if --json and it succeeded —, stderr).
    ``namesrv``: the -n value (default: the broker's NameServer)."""
    ap = argparse.ArgumentParser(prog="shmq")
    admin_cli.add_parser(ap.add_subparsers(dest="command", required=True))
    out, err = io.StringIO(), io.StringIO()
    argv = ["admin", *argv, "-n", namesrv or broker.namesrv] + (["--json"] if json_out else [])
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args = ap.parse_args(argv)
            rc = args.func(args)
        except SystemExit as e:                  # argparse: usage errors
            rc = e.code
    text = out.getvalue()
    return rc, (json.loads(text) if json_out and rc == 0 else text), err.getvalue()


def ok(broker, *argv):
    rc, data, err = admin(broker, *argv)
    assert rc == 0, err
    return data


def shmq(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "shmq.tools", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def eventually(fn, timeout=10.0):
    """fn() until it returns something truthy (the NameServer and the index
    catch up within a tick)."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(0.05)


def until(broker, *argv, rc=0):
    """admin(...) again until it exits with ``rc``; that last result."""
    last = []

    def attempt():
        last[:] = [admin(broker, *argv)]
        return last[0][0] == rc and (rc != 0 or last[0][1].get("brokers", True))
    eventually(attempt)
    return last[0]


def routed(broker, topic):
    return eventually(lambda: admin(broker, "topicRoute", "-t", topic)[0] == 0)


def create(broker, topic, queues=2, perm=6):
    ok(broker, "updateTopic", "-b", broker.addr, "-t", topic, "-r", str(queues),
       "-w", str(queues), "-p", str(perm))
    assert routed(broker, topic)


def send(c, topic, body, qid, **kw):
    r = c.invoke(send_message(topic, body, queue_id=qid, **kw))
    assert r.code == R.SUCCESS, r.remark
    return r


# ------------------------------------------------------------------ help and usage
def test_help_lists_every_command_and_each_commands_flags():
    r = shmq("admin", "--help")
    assert r.returncode == 0, r.stderr
    for name, desc, _, _ in admin_cli.COMMANDS:
        assert name in r.stdout
    assert "Query consumers's progress" in r.stdout
    r = shmq("admin", "updateTopic", "--help")
    assert r.returncode == 0
    for flag in ("--brokerAddr", "--clusterName", "--topic", "--readQueueNums",
                 "--writeQueueNums", "--perm", "--order", "--namesrvAddr", "--timeout", "--json"):
        assert flag in r.stdout


def test_an_unknown_flag_is_the_commands_usage_error_and_no_command_lists_them():
    r = shmq("admin", "topicList", "--bogus")
    assert r.returncode == 2 and not r.stdout
    assert r.stderr.startswith("usage: shmq admin topicList ")
    assert "shmq admin topicList: error: unrecognized arguments: --bogus" in r.stderr
    assert "usage: shmq [" not in r.stderr                # not the top-level usage
    r = shmq("admin", "--bogus")
    assert r.returncode == 2 and "shmq admin: error: unrecognized arguments: --bogus" in r.stderr
    r = shmq("admin")
    assert r.returncode == 2 and not r.stdout
    lines = r.stderr.splitlines()
    for name, desc, _, _ in admin_cli.COMMANDS:           # one line each: name, description
        assert any(line.split() == [name, *desc.split()] for line in lines), name


def test_bad_flag_values_are_usage_errors_naming_the_flag():
    r = shmq("admin", "updateTopic", "-b", "127.0.0.1:1", "-t", "T", "-r", "abc")
    assert r.returncode == 2 and "-r/--readQueueNums" in r.stderr and "'abc'" in r.stderr
    for argv, flag in ((["updateTopic", "-c", "C", "-t", "T", "-p", "5"], "-p/--perm"),
                       (["updateTopic", "-c", "C", "-t", "bad topic!"], "-t/--topic"),
                       (["resetOffsetByTime", "-g", "G", "-t", "T", "-s", "yesterday"], "-s/--timestamp"),
                       (["topicList", "-n", "nowhere"], "-n/--namesrvAddr"),
                       (["topicList", "--timeout", "0"], "--timeout"),
                       # past what a socket's poll takes: a traceback (OverflowError) before
                       (["brokerConsumeStats", "-b", "127.0.0.1:1", "-t", "99999999999"],
                        "-t/--timeoutMillis"),
                       (["updateSubGroup", "-b", "127.0.0.1:1", "-g", "G", "-r", "99999999999"],
                        "-r/--retryMaxTimes"),
                       (["topicList", "-n", "127.0.0.1:9876,127.0.0.1:9877"], "-n/--namesrvAddr"),
                       (["sendMessage", "-t", "T", "-p", "x", "-i", "1"], "-i/--qid"),
                       (["updateTopic", "-t", "T"], "-b/--brokerAddr -c/--clusterName")):
        rc, _, err = admin(argparse.Namespace(namesrv="127.0.0.1:1"), *argv)
        assert rc == 2 and flag in err, (argv, err)


def test_timestamps_are_read_as_mqadmin_reads_them():
    assert admin_cli.parse_timestamp("1700000000123") == 1700000000123
    assert admin_cli.parse_timestamp("now", allow_now=True) == -1
    local = time.mktime((2024, 3, 5, 6, 7, 8, 0, 0, -1))
    assert admin_cli.parse_timestamp("2024-03-05#06:07:08:009") == int(local * 1000) + 9


# ------------------------------------------------------------------ failures
def test_a_bad_namesrv_addr_variable_is_named_as_the_variable():
    """$NAMESRV_ADDR stands in for -n; a bad value is the variable's usage
    error (admin and console alike), not one of a flag never given."""
    bad = "127.0.0.1:9876,127.0.0.1:9877"
    for argv in (["admin", "topicList"], ["console", "--port", "0"]):
        r = subprocess.run([sys.executable, "-m", "shmq.tools", *argv], capture_output=True,
                           text=True, timeout=60, check=False,
                           env=dict(os.environ, NAMESRV_ADDR=bad))
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 2 and f"$NAMESRV_ADDR={bad!r}" in last, r.stderr
        assert "separate NameServer addresses with ';'" in last and "--namesrvAddr" not in last


def test_an_unreachable_namesrv_is_named_and_does_not_hang():
    port = free_port()                                   # nothing listens: refused at once
    t0 = time.monotonic()
    r = shmq("admin", "topicList", "-n", f"127.0.0.1:{port}", "--timeout", "1")
    assert r.returncode == 1 and f"127.0.0.1:{port}" in r.stderr and not r.stdout
    assert time.monotonic() - t0 < 10
    with socket.socket() as silent:                      # accepts, never answers: the timeout
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        addr = f"127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.monotonic()
        rc, _, err = admin(argparse.Namespace(namesrv=addr), "topicList", "--timeout", "0.5")
        assert rc == 1 and addr in err and "0.5 s" in err
        assert time.monotonic() - t0 < 2
    with socket.socket() as web:             # -n naming a web server (the console's port)
        web.bind(("127.0.0.1", 0))
        web.listen()
        addr = f"127.0.0.1:{web.getsockname()[1]}"

        def answer_http():
            conn, _ = web.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        threading.Thread(target=answer_http, daemon=True).start()
        rc, _, err = admin(argparse.Namespace(namesrv=addr), "topicList", "--timeout", "2")
        # it said "cannot reach the NameServer …: frame length 1213486160 exceeds the limit"
        assert rc == 1 and err.startswith(f"shmq admin topicList: {addr} is not a NameServer: it "
                                          f"does not speak RocketMQ's remoting protocol ("), err


def test_unknown_topic_group_and_a_refusal_are_named(broker):
    rc, _, err = admin(broker, "topicStatus", "-t", "NoSuchTopic")
    assert rc == 1 and "NoSuchTopic" in err and "does not exist" in err
    rc, _, err = admin(broker, "consumerProgress", "-g", "NoSuchGroup")
    assert rc == 1 and "NoSuchGroup" in err
    rc, _, err = admin(broker, "consumerConnection", "-g", "NoSuchGroup")
    assert rc == 1 and "NoSuchGroup" in err
    rc, _, err = admin(broker, "updateBrokerConfig", "-b", broker.addr, "-k", "noSuchSetting", "-v", "1")
    assert rc == 1 and "SYSTEM_ERROR (1)" in err and "noSuchSetting" in err and broker.addr in err
    rc, _, err = admin(broker, "updateTopic", "-c", "NoSuchCluster", "-t", "T")
    assert rc == 1 and "NoSuchCluster" in err and CLUSTER in err


# ------------------------------------------------------------------ topics
def test_update_topic_shows_in_topic_list_and_route_and_delete_removes_it(broker):
    r = shmq("admin", "updateTopic", "-c", CLUSTER, "-t", "AdmTopicA", "-r", "3", "-w", "5",
             "-n", broker.namesrv, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["brokers"] == [broker.addr] and d["topicConfig"]["writeQueueNums"] == 5
    create(broker, "AdmTopicRO", 1, perm=4)
    assert routed(broker, "AdmTopicA")
    assert {"AdmTopicA", "AdmTopicRO"} <= set(ok(broker, "topicList")["topicList"])
    route = ok(broker, "topicRoute", "-t", "AdmTopicA")
    assert [(q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q["perm"])
            for q in route["queueDatas"]] == [(BROKER, 3, 5, 6)]
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": broker.addr}
    assert ok(broker, "topicRoute", "-t", "AdmTopicRO")["queueDatas"][0]["perm"] == 4
    rc, table, _ = admin(broker, "topicRoute", "-t", "AdmTopicA", "-l", json_out=False)
    assert rc == 0 and "#ReadQueue" in table and BROKER in table

    d = ok(broker, "deleteTopic", "-t", "AdmTopicA", "-c", CLUSTER)
    assert d["brokers"] == [broker.addr]
    rc, _, err = admin(broker, "topicRoute", "-t", "AdmTopicA")
    assert rc == 1 and "AdmTopicA" in err
    assert "AdmTopicA" not in ok(broker, "topicList")["topicList"]


def test_topic_status_counts_what_was_sent(broker):
    create(broker, "AdmStatus", 2)
    with RemotingClient(broker.addr) as c:
        for i in range(7):
            send(c, "AdmStatus", b"m%d" % i, i % 2)
    t_after = int(time.time() * 1000)
    d = ok(broker, "topicStatus", "-t", "AdmStatus")
    assert [(q["brokerName"], q["queueId"], q["minOffset"], q["maxOffset"]) for q in d["queues"]] \
        == [(BROKER, 0, 0, 4), (BROKER, 1, 0, 3)]
    assert all(0 < q["lastUpdateTimestamp"] <= t_after for q in d["queues"])
    rc, table, _ = admin(broker, "topicStatus", "-t", "AdmStatus", json_out=False)
    assert rc == 0 and "#Max Offset" in table and table.count(BROKER) == 2


# ------------------------------------------------------------------ brokers
def test_cluster_list_and_broker_status(broker):
    d = ok(broker, "clusterList")
    [b] = d["brokers"]
    assert (b["cluster"], b["brokerName"], b["brokerId"], b["addr"]) == (CLUSTER, BROKER, 0, broker.addr)
    assert b["runtime"]["brokerVersionDesc"] == "V4_9_7"
    d = ok(broker, "brokerStatus", "-b", broker.addr)
    assert int(d["brokers"][broker.addr]["commitLogMaxOffset"]) >= 0
    assert list(ok(broker, "brokerStatus", "-c", CLUSTER)["brokers"]) == [broker.addr]
    rc, table, _ = admin(broker, "clusterList", json_out=False)
    assert rc == 0 and "#Cluster Name" in table and broker.addr in table


def test_cluster_list_shows_message_rates_and_disk_use(broker):
    create(broker, "AdmRates", 2)
    with RemotingClient(broker.addr) as c:
        for i in range(20):
            send(c, "AdmRates", b"r%d" % i, i % 2)
    assert len(ok(broker, "consumeMessage", "-t", "AdmRates")["messages"]) == 20
    [b] = ok(broker, "clusterList")["brokers"]
    t = b["runtime"]
    # RocketMQ's "10 s, 1 min, 10 min" rates, messages per second
    for key in ("putTps", "getTransferedTps"):
        assert re.fullmatch(r"\d+\.\d\d \d+\.\d\d \d+\.\d\d", t[key]), t[key]
    assert float(t["putTps"].split()[0]) > 0
    assert int(t["msgPutTotal"]) >= 20
    assert 0 < float(t["commitLogDiskRatio"]) <= 1
    # the pulls may have been served by another worker: it adds them within a second
    assert eventually(lambda: float(ok(broker, "brokerStatus", "-b", broker.addr)
                                    ["brokers"][broker.addr]["getTransferedTps"].split()[0]) > 0)
    rc, table, _ = admin(broker, "clusterList", json_out=False)
    assert rc == 0
    [row] = [line.split() for line in table.splitlines() if broker.addr in line]
    in_tps, out_tps, hour, space = (float(x) for x in row[-4:])
    assert in_tps > 0 and space > 0
    rc, text, _ = admin(broker, "brokerStatus", "-b", broker.addr, json_out=False)
    assert re.search(r"^putTps +: \d+\.\d\d \d+\.\d\d \d+\.\d\d$", text, re.M), text
    assert re.search(r"^commitLogDiskRatio +: 0\.\d+$", text, re.M), text


def test_booleans_print_as_mqadmin_prints_them(broker):
    conf = ok(broker, "getBrokerConfig", "-b", broker.addr)["brokers"][broker.addr]
    assert (conf["autoCreateTopicEnable"], conf["enablePropertyFilter"]) == ("true", "false")
    rc, text, _ = admin(broker, "getBrokerConfig", "-b", broker.addr, json_out=False)
    assert rc == 0 and re.search(r"^autoCreateTopicEnable +=  true$", text, re.M), text
    assert "True" not in text and "False" not in text
    create(broker, "AdmBool", 1)
    for argv in (["topicRoute", "-t", "AdmBool"], ["topicRoute", "-t", "AdmBool", "-l"],
                 ["brokerStatus", "-b", broker.addr], ["clusterList"]):
        rc, text, _ = admin(broker, *argv, json_out=False)
        assert rc == 0 and "True" not in text and "False" not in text, (argv, text)


def test_get_and_update_broker_config_round_trip(broker):
    before = ok(broker, "getBrokerConfig", "-b", broker.addr)["brokers"][broker.addr]
    assert before["brokerName"] == BROKER and before["fileReservedTime"] == "72"
    assert before["brokerPermission"] == "6"
    try:
        d = ok(broker, "updateBrokerConfig", "-c", CLUSTER, "-k", "brokerPermission", "-v", "4")
        assert d["brokers"] == [broker.addr]
        after = ok(broker, "getBrokerConfig", "-c", CLUSTER)["brokers"][broker.addr]
        assert after["brokerPermission"] == "4"
    finally:
        ok(broker, "updateBrokerConfig", "-b", broker.addr, "-k", "brokerPermission", "-v", "6")
    # a setting read at start is refused, named, and left as it is
    rc, _, err = admin(broker, "updateBrokerConfig", "-b", broker.addr, "-k", "fileReservedTime",
                       "-v", "48")
    assert rc == 1 and "NO_PERMISSION (16)" in err and "fileReservedTime needs a restart" in err
    after = ok(broker, "getBrokerConfig", "-b", broker.addr)["brokers"][broker.addr]
    assert after["fileReservedTime"] == "72" and after["brokerPermission"] == "6"
    # its value in effect is no change: accepted
    ok(broker, "updateBrokerConfig", "-b", broker.addr, "-k", "fileReservedTime", "-v", "72")
    # a permission that is none is refused, named (it was taken: 99)
    rc, _, err = admin(broker, "updateBrokerConfig", "-b", broker.addr, "-k", "brokerPermission",
                       "-v", "99")
    assert rc == 1 and "brokerPermission=99: a permission, 0..15" in err
    assert ok(broker, "getBrokerConfig", "-b", broker.addr)["brokers"][broker.addr][
        "brokerPermission"] == "6"


# ------------------------------------------------------------------ messages
def test_send_message_prints_a_msg_id_that_the_queries_find(broker):
    create(broker, "AdmMsg", 2)
    r = shmq("admin", "sendMessage", "-t", "AdmMsg", "-p", "héllo admin", "-k", "order-7",
             "-c", "TagA", "-b", BROKER, "-i", "1", "-n", broker.namesrv, "--json")
    assert r.returncode == 0, r.stderr
    sent = json.loads(r.stdout)
    assert (sent["sendStatus"], sent["brokerName"], sent["queueId"]) == ("SEND_OK", BROKER, 1)

    [m] = ok(broker, "queryMsgById", "-i", sent["offsetMsgId"])["messages"]
    assert (m["body"], m["keys"], m["tags"], m["msgId"]) == ("héllo admin", "order-7", "TagA", sent["msgId"])
    rc, d, err = until(broker, "queryMsgById", "-i", sent["msgId"], "-t", "AdmMsg")
    assert rc == 0 and d["messages"][0]["body"] == "héllo admin", err
    rc, _, err = admin(broker, "queryMsgById", "-i", sent["msgId"])       # a client id needs -t
    assert rc == 1 and "-t" in err

    rc, d, err = until(broker, "queryMsgByKey", "-t", "AdmMsg", "-k", "order-7")
    assert rc == 0, err
    assert [(x["msgId"], x["queueId"], x["body"]) for x in d["messages"]] == [(sent["msgId"], 1, "héllo admin")]

    [m] = ok(broker, "queryMsgByOffset", "-t", "AdmMsg", "-b", BROKER, "-i", "1",
             "-o", str(sent["queueOffset"]))["messages"]
    assert m["body"] == "héllo admin" and m["offsetMsgId"] == sent["offsetMsgId"]
    rc, _, err = admin(broker, "queryMsgByOffset", "-t", "AdmMsg", "-b", BROKER, "-q", "1", "-o", "99")
    assert rc == 1 and "offset 99" in err
    rc, text, _ = admin(broker, "queryMsgById", "-i", sent["offsetMsgId"], json_out=False)
    assert "Message Body:        héllo admin" in text and "Keys:                [order-7]" in text


def test_consume_message_prints_the_messages(broker):
    create(broker, "AdmConsume", 2)
    with RemotingClient(broker.addr) as c:
        for i in range(6):
            send(c, "AdmConsume", b"c%d" % i, i % 2, keys=f"k{i}")
    d = ok(broker, "consumeMessage", "-t", "AdmConsume")
    assert sorted(m["body"] for m in d["messages"]) == [f"c{i}" for i in range(6)]
    assert len(ok(broker, "consumeMessage", "-t", "AdmConsume", "-c", "4")["messages"]) == 4
    d = ok(broker, "consumeMessage", "-t", "AdmConsume", "-b", BROKER, "-i", "1", "-o", "1")
    assert [m["body"] for m in d["messages"]] == ["c3", "c5"]
    rc, text, _ = admin(broker, "consumeMessage", "-t", "AdmConsume", "-c", "1", json_out=False)
    assert rc == 0 and "MSGID: " in text and "BODY: c0" in text
    # nothing was committed for the tools group
    assert admin(broker, "consumerProgress", "-g", "TOOLS_CONSUMER")[0] == 1


def test_wipe_write_perm_makes_the_route_read_only_and_sends_fail(broker):
    create(broker, "AdmWipe", 1)
    d = ok(broker, "wipeWritePerm", "-b", BROKER)
    assert d["namesrvs"][0]["namesrv"] == broker.namesrv and d["namesrvs"][0]["wipeTopicCount"] > 0
    try:
        assert ok(broker, "topicRoute", "-t", "AdmWipe")["queueDatas"][0]["perm"] == 4
        r = shmq("admin", "sendMessage", "-t", "AdmWipe", "-p", "x", "-n", broker.namesrv)
        assert r.returncode == 1 and "AdmWipe" in r.stderr and "not writable" in r.stderr
    finally:
        ok(broker, "addWritePerm", "-b", BROKER)
    assert ok(broker, "topicRoute", "-t", "AdmWipe")["queueDatas"][0]["perm"] == 6
    assert ok(broker, "sendMessage", "-t", "AdmWipe", "-p", "x")["sendStatus"] == "SEND_OK"


# ------------------------------------------------------------------ consumers
def consumer_data(group, topic):
    return {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
            "subscriptionDataSet": [{"topic": topic, "subString": "*", "subVersion": 1,
                                     "expressionType": "TAG"}]}


def commit(c, group, topic, qid, offset):
    r = c.invoke(RemotingCommand(RC.UPDATE_CONSUMER_OFFSET, ext={
        "consumerGroup": group, "topic": topic, "queueId": str(qid), "commitOffset": str(offset)}))
    assert r.code == R.SUCCESS


def test_consumer_progress_lag_and_reset_offset_by_time(broker):
    topic, group = "AdmLag", "AdmLagGroup"
    create(broker, topic, 2)
    with RemotingClient(broker.addr) as c, RemotingClient(broker.addr) as member:
        for i in range(4):
            send(c, topic, b"early", i % 2)
        time.sleep(0.05)
        cut = int(time.time() * 1000)
        time.sleep(0.05)
        for i in range(6):
            send(c, topic, b"late", 0)          # queue 0: 2 early + 6 late; queue 1: 2 early
        # a member that never pulls: its heartbeat makes %RETRY%group, its offsets are ours
        assert member.invoke(heartbeat("adm-lag-client", consumers=[consumer_data(group, topic)])).code == 0
        commit(c, group, topic, 0, 3)
        commit(c, group, topic, 1, 2)
        rc, d, err = until(broker, "consumerProgress", "-g", group)
        assert rc == 0, err
        lag = {q["queueId"]: (q["brokerOffset"], q["consumerOffset"], q["diff"])
               for q in d["queues"] if q["topic"] == topic}
        assert lag == {0: (8, 3, 5), 1: (2, 2, 0)}
        assert d["diffTotal"] == 5
        assert next(q for q in d["queues"] if q["topic"] == topic and q["queueId"] == 0)["lastTimestamp"] > 0
        rc, table, _ = admin(broker, "consumerProgress", "-g", group, json_out=False)
        assert "Diff Total: 5" in table

        d = ok(broker, "resetOffsetByTime", "-g", group, "-t", topic, "-s", str(cut))
        assert {r["queueId"]: r["offset"] for r in d["offsets"]} == {0: 2, 1: 2}
        d = ok(broker, "consumerProgress", "-g", group)
        assert {q["queueId"]: q["consumerOffset"] for q in d["queues"] if q["topic"] == topic} == {0: 2, 1: 2}
        local = time.strftime("%Y-%m-%d#%H:%M:%S", time.localtime(0))   # long ago: the start
        ok(broker, "resetOffsetByTime", "-g", group, "-t", topic, "-s", local + ":000")
        ok(broker, "resetOffsetByTime", "-g", group, "-t", topic, "-s", "now")
        d = ok(broker, "consumerProgress", "-g", group)
        assert {q["queueId"]: q["diff"] for q in d["queues"] if q["topic"] == topic} == {0: 0, 1: 0}


def test_consumer_connection_lists_a_live_push_consumer(broker):
    topic, group = "AdmLive", "AdmLiveGroup"
    create(broker, topic, 2)
    got = []

    def listener(msgs, context):
        got.extend(msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(group, namesrv_addr=broker.namesrv)
    consumer.subscribe(topic, "TagA || TagB")
    consumer.register_message_listener(listener)
    consumer.start()
    try:
        with Producer("AdmLiveProducer", namesrv_addr=broker.namesrv) as p:
            p.send(Message(topic, b"live", tags="TagA"))
        rc, d, err = until(broker, "consumerConnection", "-g", group)
        assert rc == 0, err
        [conn] = d["connectionSet"]
        assert conn["clientId"] == consumer._p.instance.client_id and conn["version"] > 0
        assert d["subscriptionTable"][topic]["subString"] == "TagA || TagB"
        assert d["subscriptionTable"][topic]["tagsSet"] == ["TagA", "TagB"]
        assert (d["consumeType"], d["messageModel"]) == ("CONSUME_PASSIVELY", "CLUSTERING")
        [summary] = [g for g in ok(broker, "consumerProgress")["groups"] if g["group"] == group]
        assert (summary["count"], summary["consumeType"]) == (1, "CONSUME_PASSIVELY")
        assert eventually(lambda: got)
        rc, table, _ = admin(broker, "consumerConnection", "-g", group, json_out=False)
        assert "#ClientId" in table and "TagA || TagB" in table and "MessageModel: CLUSTERING" in table
    finally:
        consumer.shutdown()
    rc, _, err = until(broker, "consumerConnection", "-g", group, rc=1)
    assert rc == 1 and "not online" in err



def test_consumer_status_shows_each_members_running_info(broker):
    topic, group = "AdmStatus2", "AdmStatusGroup"
    create(broker, topic, 2)
    consumer = PushConsumer(group, namesrv_addr=broker.namesrv)
    consumer.subscribe(topic, "TagA")
    def listener(msgs, context):            # raises on the message consumed directly
        if any(m.body == b"direct" for m in msgs):
            raise RuntimeError(f"refused {msgs[0].topic}/{msgs[0].tags}")
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    consumer.register_message_listener(listener)
    consumer.start()
    try:
        cid = consumer._p.instance.client_id
        rc, d, err = until(broker, "consumerStatus", "-g", group)
        assert rc == 0, err
        [c] = d["clients"]
        assert c["clientId"] == cid and "error" not in c
        info = c["runningInfo"]
        assert info["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
        assert [(s["topic"], s["subString"]) for s in info["subscriptionSet"]
                if s["topic"] == topic] == [(topic, "TagA")]
        assert (d["subscriptionSame"], d["rebalanceOK"]) == (True, True)
        rc, text, _ = admin(broker, "consumerStatus", "-g", group, json_out=False)
        assert rc == 0 and re.search(rf"^1 +{re.escape(cid)} +V4_9_7 +ok$", text, re.M), text
        assert "Same subscription in the same group of consumer" in text and "Rebalance OK" in text
        rc, text, _ = admin(broker, "consumerStatus", "-g", group, "-i", cid, json_out=False)
        assert rc == 0 and text.startswith("#Consumer Properties#\n")
        assert re.search(r"^PROP_CONSUME_TYPE +: CONSUME_PASSIVELY$", text, re.M), text
        assert re.search(rf"^\d{{3}} Topic: {topic} +ClassFilter: false +SubExpression: TagA$", text, re.M)
        rc, _, err = admin(broker, "consumerStatus", "-g", group, "-i", "no-such-client")
        assert rc == 1 and "no-such-client is not a member" in err
        # consume directly: the broker hands the message to the client, whose
        # listener runs on it and whose ConsumeMessageDirectlyResult comes back
        sent = ok(broker, "sendMessage", "-t", topic, "-p", "direct", "-c", "TagA")
        def consumed_directly():                # once the index has the message
            r = admin(broker, "queryMsgByUniqueKey", "-i", sent["msgId"], "-t", topic,
                      "-g", group, "-d", cid)
            return r[0] == 0 and r
        rc, d, err = eventually(consumed_directly)
        [res] = d["consumeResults"]      # the listener's exception, named, is the answer
        assert (res["consumeResult"], res["order"], res["autoCommit"]) == \
            ("CR_THROW_EXCEPTION", False, True), res
        assert res["remark"] == f"RuntimeError: refused {topic}/TagA"
        rc, _, err = admin(broker, "queryMsgById", "-i", sent["offsetMsgId"], "-g", group)
        assert rc == 2 and "-g/--consumerGroup and -d/--clientId go together" in err
    finally:
        consumer.shutdown()


# ------------------------------------------------------------------ groups, perms, offsets
def subscription_groups(broker) -> dict:
    with RemotingClient(broker.addr) as c:
        r = c.invoke(RemotingCommand(RC.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
    assert r.code == R.SUCCESS
    return json.loads(r.body)["subscriptionGroupTable"]


def committed(broker, group, topic=None) -> dict:
    """The group's committed offsets as consume stats show them: {(topic, qid): offset}."""
    with AdminClient(broker.namesrv) as a:
        rows, _ = a.consume_stats(broker.addr, group, topic)
    return {(r["topic"], r["queueId"]): r["consumerOffset"] for r in rows}


def test_update_sub_group_and_delete_sub_group_with_its_offsets_and_topics(broker):
    topic, group = "AdmSubTopic", "AdmSubGroup"
    create(broker, topic, 1)
    d = ok(broker, "updateSubGroup", "-c", CLUSTER, "-g", group, "-r", "3", "-d", "true")
    assert d["brokers"] == [broker.addr]
    g = subscription_groups(broker)[group]
    assert (g["retryMaxTimes"], g["consumeBroadcastEnable"], g["consumeFromMinEnable"]) == (3, True, False)
    rc, text, _ = admin(broker, "updateSubGroup", "-b", broker.addr, "-g", group, "-r", "5", json_out=False)
    assert rc == 0 and f"create subscription group to {broker.addr} success." in text
    assert "SubscriptionGroupConfig [groupName=AdmSubGroup, consumeEnable=true" in text
    assert subscription_groups(broker)[group]["retryMaxTimes"] == 5
    with RemotingClient(broker.addr) as c:       # a member makes %RETRY%group; an offset
        assert c.invoke(heartbeat("adm-sub-client", consumers=[consumer_data(group, topic)])).code == 0
        commit(c, group, topic, 0, 1)
    assert routed(broker, "%RETRY%" + group)
    assert committed(broker, group) == {(topic, 0): 1}

    d = ok(broker, "deleteSubGroup", "-c", CLUSTER, "-g", group, "-r", "true")
    assert (d["brokers"], d["deletedTopics"]) == ([broker.addr], ["%RETRY%" + group])
    assert group not in subscription_groups(broker)
    assert committed(broker, group) == {}
    assert admin(broker, "topicRoute", "-t", "%RETRY%" + group)[0] == 1
    rc, _, err = admin(broker, "deleteSubGroup", "-g", group)
    assert rc == 2 and "-b/--brokerAddr" in err and "-c/--clusterName" in err


def test_update_topic_perm_and_topic_cluster_list(broker):
    topic = "AdmPerm"
    create(broker, topic, 2)
    assert ok(broker, "topicClusterList", "-t", topic) == {"topic": topic, "clusters": [CLUSTER]}
    assert admin(broker, "topicClusterList", "-t", topic, json_out=False)[1] == CLUSTER + "\n"
    d = ok(broker, "updateTopicPerm", "-c", CLUSTER, "-t", topic, "-p", "4")
    assert [(r["addr"], r["oldPerm"], r["perm"], r["changed"]) for r in d["brokers"]] \
        == [(broker.addr, 6, 4, True)]
    try:
        assert eventually(lambda: ok(broker, "topicRoute", "-t", topic)["queueDatas"][0]["perm"] == 4)
        [qd] = ok(broker, "topicRoute", "-t", topic)["queueDatas"]
        assert (qd["readQueueNums"], qd["writeQueueNums"]) == (2, 2)
        rc, _, err = admin(broker, "sendMessage", "-t", topic, "-p", "x")
        assert rc == 1 and "not writable" in err
        rc, text, _ = admin(broker, "updateTopicPerm", "-b", broker.addr, "-t", topic, "-p", "4",
                            json_out=False)
        assert rc == 0 and "new perm equals to the old one!" in text
    finally:
        rc, text, _ = admin(broker, "updateTopicPerm", "-b", broker.addr, "-t", topic, "-p", "6",
                            json_out=False)
    assert rc == 0 and f"update topic perm from 4 to 6 in {broker.addr} success." in text
    assert "TopicConfig [topicName=AdmPerm, readQueueNums=2, writeQueueNums=2, perm=RW-" in text
    assert eventually(lambda: ok(broker, "topicRoute", "-t", topic)["queueDatas"][0]["perm"] == 6)
    rc, _, err = admin(broker, "updateTopicPerm", "-b", broker.addr, "-t", topic, "-p", "5")
    assert rc == 2 and "-p/--perm" in err
    rc, _, err = admin(broker, "updateTopicPerm", "-b", "127.0.0.1:1", "-t", topic, "-p", "4")
    assert rc == 1 and "127.0.0.1:1 is not a master serving topic AdmPerm" in err
    rc, _, err = admin(broker, "topicClusterList", "-t", "NoSuchTopic")
    assert rc == 1 and "NoSuchTopic" in err


def test_clone_group_offset_and_skip_accumulated_message(broker):
    topic = "AdmClone"
    create(broker, topic, 2)
    with RemotingClient(broker.addr) as c:
        for i in range(5):
            send(c, topic, b"c%d" % i, i % 2)          # queue 0: 3, queue 1: 2
        commit(c, "AdmSrcGroup", topic, 0, 2)
        commit(c, "AdmSrcGroup", topic, 1, 1)
    d = ok(broker, "cloneGroupOffset", "-s", "AdmSrcGroup", "-d", "AdmDestGroup", "-t", topic)
    assert [(r["queueId"], r["offset"]) for r in d["offsets"]] == [(0, 2), (1, 1)]
    assert committed(broker, "AdmDestGroup", topic) == {(topic, 0): 2, (topic, 1): 1}
    rc, text, _ = admin(broker, "cloneGroupOffset", "-s", "AdmSrcGroup", "-d", "AdmDestGroup",
                        "-t", topic, json_out=False)
    assert text.startswith("clone group offset success. srcGroup[AdmSrcGroup], destGroup=[AdmDestGroup]")
    rc, _, err = admin(broker, "cloneGroupOffset", "-s", "AdmNoSuchGroup", "-d", "AdmDestGroup",
                       "-t", topic)                    # a mistyped source: no "success"
    assert (rc, err) == (1, "shmq admin cloneGroupOffset: consumer group AdmNoSuchGroup has no "
                            "committed offset in topic AdmClone: nothing to clone\n")
    assert committed(broker, "AdmDestGroup", topic) == {(topic, 0): 2, (topic, 1): 1}

    d = ok(broker, "skipAccumulatedMessage", "-g", "AdmDestGroup", "-t", topic)
    assert [(r["queueId"], r["offset"]) for r in d["offsets"]] == [(0, 3), (1, 2)]
    assert committed(broker, "AdmDestGroup", topic) == {(topic, 0): 3, (topic, 1): 2}
    assert committed(broker, "AdmSrcGroup", topic) == {(topic, 0): 2, (topic, 1): 1}
    rc, text, _ = admin(broker, "skipAccumulatedMessage", "-g", "AdmSrcGroup", "-t", topic, json_out=False)
    assert rc == 0 and re.search(r"^broker-a +1 +2 *$", text, re.M), text
    assert committed(broker, "AdmSrcGroup", topic) == {(topic, 0): 3, (topic, 1): 2}


# ------------------------------------------------------------------ messages
def test_query_msg_by_unique_key(broker):
    create(broker, "AdmUniq", 1)
    sent = ok(broker, "sendMessage", "-t", "AdmUniq", "-p", "uniq body", "-k", "uk")
    rc, d, err = until(broker, "queryMsgByUniqueKey", "-i", sent["msgId"], "-t", "AdmUniq")
    assert rc == 0, err
    [m] = d["messages"]
    assert (m["msgId"], m["offsetMsgId"], m["body"]) == (sent["msgId"], sent["offsetMsgId"], "uniq body")
    rc, text, _ = admin(broker, "queryMsgByUniqueKey", "-i", sent["msgId"], "-t", "AdmUniq", "-a",
                        json_out=False)
    assert rc == 0 and "Topic:               AdmUniq" in text and "Keys:                [uk]" in text
    assert "OffsetID:" not in text                  # mqadmin's queryMsgByUniqueKey lines
    rc, _, err = admin(broker, "queryMsgByUniqueKey", "-i", "0" * 32, "-t", "AdmUniq")
    assert rc == 1 and "no message with unique key " + "0" * 32 in err


def test_print_msg_prints_each_queue_with_progress_on_stderr(broker):
    topic = "AdmPrint"
    create(broker, topic, 2)
    with RemotingClient(broker.addr) as c:
        for i in range(6):
            send(c, topic, b"p%d" % i, i % 2, tags="TagA" if i < 4 else "TagB")
        send(c, topic, "中文".encode("gbk"), 0, tags="TagC")
    rc, d, err = admin(broker, "printMsg", "-t", topic)
    assert rc == 0, err
    assert d["messageCount"] == 7
    assert [(q["queueId"], q["minOffset"], q["maxOffset"], q["messageCount"]) for q in d["queues"]] \
        == [(0, 0, 4, 4), (1, 0, 3, 3)]
    assert sorted(m["body"] for q in d["queues"] for m in q["messages"] if m["body"]) \
        == [f"p{i}" for i in range(6)]
    assert "printMsg: 1/2 queues" in err and "printMsg: 2/2 queues, 7 messages" in err
    d = admin(broker, "printMsg", "-t", topic, "-s", "TagB || TagC", "-c", "GBK")[1]
    assert sorted(m["body"] for q in d["queues"] for m in q["messages"]) == ["p4", "p5", "中文"]
    d = admin(broker, "printMsg", "-t", topic, "-d", "false")[1]
    assert d["messageCount"] == 7 and not any("body" in m for q in d["queues"] for m in q["messages"])
    rc, text, _ = admin(broker, "printMsg", "-t", topic, "-s", "TagA", json_out=False)
    assert rc == 0
    assert f"minOffset=0, maxOffset=4, MessageQueue [topic={topic}, brokerName={BROKER}, queueId=0]" in text
    assert text.count("MSGID: ") == 4 and "BODY: p0" in text and "BODY: p3" in text
    rc, _, err = admin(broker, "printMsg", "-t", topic, "-c", "NoSuchCharset")
    assert rc == 2 and "-c/--charsetName" in err and "not a charset" in err


def test_producer_connection_trace_stats_all_and_broker_consume_stats(broker):
    topic, pg, group = "AdmStats", "AdmStatsProducer", "AdmStatsGroup"
    create(broker, topic, 1)
    with Producer(pg, namesrv_addr=broker.namesrv, enable_msg_trace=True) as p:
        sent = [p.send(Message(topic, b"s%d" % i, tags="T")) for i in range(3)]
        rc, d, err = until(broker, "producerConnection", "-g", pg, "-t", topic)
        assert rc == 0, err
        [conn] = d["connectionSet"]
        assert "@" in conn["clientId"] and conn["version"] > 0
        rc, text, _ = admin(broker, "producerConnection", "-g", pg, "-t", topic, json_out=False)
        assert rc == 0 and text.startswith(f"0001  {conn['clientId']}")
        rc, d, err = until(broker, "queryMsgTraceById", "-i", sent[0].msg_id)
        assert rc == 0, err
        [pub] = [t for t in d["traces"] if t["traceType"] == "Pub"]
        assert (pub["groupName"], pub["topic"], pub["status"]) == (pg, topic, "success")
        rc, text, _ = admin(broker, "queryMsgTraceById", "-i", sent[0].msg_id, json_out=False)
        assert rc == 0 and "#ProducerGroup" in text and re.search(rf"^Pub +{pg} ", text, re.M), text
    rc, _, err = admin(broker, "producerConnection", "-g", "NoSuchProducer", "-t", topic)
    assert rc == 1 and "NoSuchProducer" in err
    rc, _, err = admin(broker, "queryMsgTraceById", "-i", "0" * 32)
    assert rc == 1 and "no trace of message" in err

    ok(broker, "updateSubGroup", "-b", broker.addr, "-g", group)    # brokerConsumeStats lists configured groups
    with RemotingClient(broker.addr) as c:
        commit(c, group, topic, 0, 1)

    def row():
        rows = [r for r in ok(broker, "statsAll", "-t", topic)["stats"] if r["group"] == group]
        return rows and rows[0]["inMsg24Hour"] == 3 and rows[0]
    r = eventually(row)
    assert r and r["accumulation"] == 2 and r["inTps"] > 0, r
    rc, text, err = admin(broker, "statsAll", "-t", topic, json_out=False)
    assert rc == 0 and re.search(rf"^{topic} +{group} +2 ", text, re.M), text
    assert "statsAll: 1/1 topics" in err

    d = ok(broker, "brokerConsumeStats", "-b", broker.addr)
    [q] = [q for q in d["queues"] if q["group"] == group]
    assert (q["topic"], q["brokerOffset"], q["consumerOffset"], q["diff"]) == (topic, 3, 1, 2)
    assert d["totalDiff"] >= 2
    assert not [q for q in ok(broker, "brokerConsumeStats", "-b", broker.addr, "-l", "3")["queues"]
                if q["group"] == group]
    rc, text, _ = admin(broker, "brokerConsumeStats", "-b", broker.addr, json_out=False)
    assert rc == 0 and re.search(rf"^{topic} +{group} +{BROKER} +0 +3 +1 +2 ", text, re.M), text
    assert f"Diff Total: {d['totalDiff']}" in text


# ------------------------------------------------------------------ NameServer settings
def test_get_and_update_namesrv_config(broker):
    ns = broker.namesrv
    conf = ok(broker, "getNamesrvConfig")["namesrvs"][ns]
    # orderMessageEnable: false by default, as RocketMQ's NamesrvConfig
    assert (conf["listenPort"], conf["orderMessageEnable"]) == (ns.rpartition(":")[2], "false")
    rc, text, _ = admin(broker, "getNamesrvConfig", json_out=False)
    assert f"============{ns}============" in text
    assert re.search(r"^orderMessageEnable +=  false$", text, re.M), text
    ok(broker, "updateTopic", "-b", broker.addr, "-t", "AdmOrderConf", "-w", "2", "-o", "true")
    assert routed(broker, "AdmOrderConf")
    assert "orderTopicConf" not in ok(broker, "topicRoute", "-t", "AdmOrderConf")
    try:
        rc, text, _ = admin(broker, "updateNamesrvConfig", "-k", "orderMessageEnable", "-v", "true",
                            json_out=False)
        assert rc == 0 and text == f"update name server config success![{ns}]\norderMessageEnable : true\n"
        assert ok(broker, "getNamesrvConfig")["namesrvs"][ns]["orderMessageEnable"] == "true"
        assert ok(broker, "topicRoute", "-t", "AdmOrderConf")["orderTopicConf"] == f"{BROKER}:2"
    finally:
        ok(broker, "updateNamesrvConfig", "-k", "orderMessageEnable", "-v", "false")
    assert "orderTopicConf" not in ok(broker, "topicRoute", "-t", "AdmOrderConf")
    rc, _, err = admin(broker, "updateNamesrvConfig", "-k", "listenPort", "-v", "1")
    assert rc == 1 and "NO_PERMISSION (16)" in err and "listenPort needs a restart" in err
    rc, _, err = admin(broker, "updateNamesrvConfig", "-k", "noSuchSetting", "-v", "1")
    assert rc == 1 and "SYSTEM_ERROR (1)" in err and "unknown settings noSuchSetting" in err
    rc, _, err = admin(broker, "updateNamesrvConfig", "-k", "orderMessageEnable", "-v", "maybe")
    assert rc == 1 and "want true or false" in err
    assert ok(broker, "getNamesrvConfig")["namesrvs"][ns]["orderMessageEnable"] == "false"
    # a change made on some NameServers and not others says so, naming each
    dead = f"127.0.0.1:{free_port()}"
    try:
        rc, _, err = admin(broker, "updateNamesrvConfig", "-k", "orderMessageEnable", "-v", "true",
                           namesrv=f"{ns};{dead}")
        assert rc == 1 and "failed on 1 of 2" in err and dead in err and f"done on {ns}" in err, err
        assert ok(broker, "getNamesrvConfig")["namesrvs"][ns]["orderMessageEnable"] == "true"
    finally:
        ok(broker, "updateNamesrvConfig", "-k", "orderMessageEnable", "-v", "false")


# ------------------------------------------------------------------ store cleanup (last: it deletes)
def test_delete_expired_commit_log_and_clean_expired_cq(broker):
    segment = 16 << 20                                # brokerproc.SMALL's mappedFileSizeCommitLog
    create(broker, "AdmFill", 1)
    with RemotingClient(broker.addr) as c:
        for _ in range(34):                            # past the first segment
            send(c, "AdmFill", b"f" * (512 << 10), 0)
    status = ok(broker, "brokerStatus", "-b", broker.addr)["brokers"][broker.addr]
    assert int(status["commitLogMaxOffset"]) > segment and int(status["commitLogMinOffset"]) == 0
    first = os.path.join(broker.store, "commitlog", "0" * 20)
    long_ago = time.time() - 100 * 3600                # past fileReservedTime (72 h)
    os.utime(first, (long_ago, long_ago))

    rc, text, err = admin(broker, "deleteExpiredCommitLog", "-b", broker.addr, json_out=False)
    assert (rc, text) == (0, "success\n"), err
    # the flusher publishes the new minimum, then each queue's, then unlinks
    # the segment (core/retention.py): the file gone means all three hold
    assert eventually(lambda: not os.path.exists(first))
    status = ok(broker, "brokerStatus", "-b", broker.addr)["brokers"][broker.addr]
    assert int(status["commitLogMinOffset"]) == segment
    # the queue that lived in the first segment starts after it
    [q] = ok(broker, "topicStatus", "-t", "AdmFill")["queues"]
    assert 0 < q["minOffset"] < q["maxOffset"] == 34

    rc, d, err = admin(broker, "cleanExpiredCQ")
    assert rc == 0 and d == {"result": True, "brokers": [{"brokerAddr": broker.addr}]}, err
    assert "cleanExpiredCQ: 1/1 brokers" in err
    assert ok(broker, "cleanExpiredCQ", "-c", CLUSTER)["result"]
    rc, _, err = admin(broker, "deleteExpiredCommitLog", "-c", "NoSuchCluster")
    assert rc == 1 and "NoSuchCluster" in err
