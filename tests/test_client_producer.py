"""shmq's Python producer against a real broker: what an application sees."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from brokerproc import routed_topic as make_topic
from brokerproc import start_broker, stored_records, topic_for
from shmq.client import (
    AsyncProducer,
    ClientConfig,
    LocalTransactionState,
    Message,
    MQClientError,
    Producer,
    SendStatus,
    TransactionListener,
    TransactionProducer,
    select_by_hash,
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("client"), transactionTimeOut=300,
                     transactionCheckInterval=300)
    yield b
    assert b.stop() == 0, b.log()[-3000:]


def topic_of(request) -> str:
    return topic_for(request, "C_")


def stored(broker, topic, queues=4):
    return stored_records(broker, topic, queues)


def test_sync_send_returns_a_full_send_result(broker, request):
    topic = topic_of(request)
    make_topic(broker, topic)
    with Producer("pg-sync", namesrv_addr=broker.namesrv) as p:
        r = p.send(Message(topic, b"hello", tags="TagA", keys=["k1", "k2"],
                           properties={"color": "red"}))
    assert r.status is SendStatus.SEND_OK
    assert len(r.msg_id) == 32 and len(r.offset_msg_id) == 32 and r.queue_offset == 0
    assert r.queue.topic == topic and r.queue.broker_name == "broker-a"
    [m] = stored(broker, topic)
    assert (m.body, m.tags, m.keys) == (b"hello", "TagA", ["k1", "k2"])
    assert m.properties["UNIQ_KEY"] == r.msg_id and m.properties["color"] == "red"
    assert m.offset_msg_id() == r.offset_msg_id


def test_async_oneway_batch_and_ordered_sends(broker, request):
    topic = topic_of(request)
    make_topic(broker, topic)

    async def main():
        async with AsyncProducer("pg-async", namesrv_addr=broker.namesrv) as p:
            results = await asyncio.gather(*[p.send_async(Message(topic, b"a%d" % i))
                                             for i in range(50)])
            assert all(r.status is SendStatus.SEND_OK for r in results)
            await p.send_oneway(Message(topic, b"oneway"))
            b = await p.send_batch([Message(topic, b"b%d" % i, tags="B") for i in range(10)])
            assert len(b.msg_id.split(",")) == 10
            ordered = [await p.send(Message(topic, b"ord%d" % i), selector=select_by_hash, arg=42)
                       for i in range(5)]
            assert len({r.queue for r in ordered}) == 1
            return ordered[0].queue.queue_id
    qid = asyncio.run(main())
    time.sleep(0.2)
    msgs = stored(broker, topic)
    bodies = [m.body for m in msgs]
    assert sorted(b for b in bodies if b.startswith(b"a")) == sorted(b"a%d" % i for i in range(50))
    assert b"oneway" in bodies and sum(b.startswith(b"b") for b in bodies) == 10
    in_q = [m.body for m in msgs if m.queue_id == qid and m.body.startswith(b"ord")]
    assert in_q == [b"ord%d" % i for i in range(5)]                 # in order, one queue


def test_callback_compression_size_limit_and_new_topic(broker, request):
    topic = topic_of(request)
    make_topic(broker, topic)
    done = threading.Event()
    got = []
    with Producer("pg-misc", namesrv_addr=broker.namesrv, max_message_size=100_000) as p:
        p.send_async(Message(topic, b"cb"), callback=lambda r, e: (got.append((r, e)), done.set()))
        assert done.wait(5) and got[0][1] is None and got[0][0].status is SendStatus.SEND_OK
        big = bytes(range(256)) * 200                              # 51 KB, compressible
        p.send(Message(topic, big))
        with pytest.raises(MQClientError, match="max value"):
            p.send(Message(topic, b"x" * 100_001))
        fresh = topic + "_new"                                      # created through TBW102
        assert p.send(Message(fresh, b"first")).status is SendStatus.SEND_OK
    stored_big = [m for m in stored(broker, topic) if m.sysflag & 1]
    assert len(stored_big) == 1 and len(stored_big[0].body) < len(big)


class Listener(TransactionListener):
    def __init__(self):
        self.checked = threading.Event()

    def execute_local_transaction(self, msg, arg):
        return {"commit": LocalTransactionState.COMMIT_MESSAGE,
                "rollback": LocalTransactionState.ROLLBACK_MESSAGE}.get(arg, LocalTransactionState.UNKNOW)

    def check_local_transaction(self, msg):
        self.checked.set()
        return LocalTransactionState.COMMIT_MESSAGE


def test_transaction_producer_commits_rolls_back_and_answers_checks(broker, request):
    topic = topic_of(request)
    make_topic(broker, topic)
    listener = Listener()
    with TransactionProducer("pg-tx", listener, namesrv_addr=broker.namesrv) as p:
        r1 = p.send_message_in_transaction(Message(topic, b"yes"), "commit")
        p.send_message_in_transaction(Message(topic, b"no"), "rollback")
        p.send_message_in_transaction(Message(topic, b"later"), "unknown")
        assert r1.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
        assert listener.checked.wait(15), "the broker never asked about the unknown one"
        deadline = time.monotonic() + 5
        while len(stored(broker, topic)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert sorted(m.body for m in stored(broker, topic)) == [b"later", b"yes"]


def test_a_producer_started_before_fork_sends_from_the_child(broker, request):
    """The native client breaks under fork; this one re-registers in the child."""
    import os
    topic = topic_of(request)
    make_topic(broker, topic)
    with Producer("pg-fork", namesrv_addr=broker.namesrv) as p:
        assert p.send(Message(topic, b"parent")).status is SendStatus.SEND_OK
        pid = os.fork()
        if pid == 0:                                       # the child: exit code says it all
            try:
                ok = p.send(Message(topic, b"child")).status is SendStatus.SEND_OK
            except BaseException:
                ok = False
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert p.send(Message(topic, b"parent again")).status is SendStatus.SEND_OK
    assert sorted(m.body for m in stored(broker, topic)) == [b"child", b"parent", b"parent again"]


def test_a_broker_on_this_host_is_reached_over_its_unix_socket(broker, request):
    topic = topic_of(request)
    make_topic(broker, topic)
    for unix in (True, False):
        cfg = ClientConfig(namesrv_addr=broker.namesrv, use_unix_socket=unix)
        with Producer("pg-unix", client=cfg) as p:
            assert p.send(Message(topic, b"x")).status is SendStatus.SEND_OK
            addrs = {c.addr for c in p._p.instance.conns.values()}
        assert any(a == f"unix:{broker.unix}" for a in addrs) is unix, addrs


def test_select_by_hash_picks_the_queue_java_picks_in_every_process():
    """SelectMessageQueueByHash is abs(arg.hashCode() % n) with Java's
    hashCode: the same order key lands on the same queue in every producer
    process, after restarts, and in a Java producer (Python's str hash is
    salted per process)."""
    import subprocess
    import sys
    from shmq.client.producer import java_hash_code
    # values Java gives: String, Integer and Long hashCodes
    assert [java_hash_code(s) for s in ("hello", "Aa", "BB", "", "polygenelubricants", "日本", "😀")] \
        == [99162322, 2112, 2112, 0, -2**31, 835047, 1772899]
    assert [java_hash_code(v) for v in (7, -5, 2**40, -(2**40))] == [7, -5, 256, -256]
    queues = list(range(8))
    picks = {key: select_by_hash(queues, None, key) for key in ("order-1", "order-2", "日本", 12345)}
    assert select_by_hash(queues, None, "polygenelubricants") == 0          # abs(MIN_VALUE % 8)
    code = ("from shmq.client import select_by_hash; "
            "print([select_by_hash(list(range(8)), None, k) for k in ('order-1', 'order-2', '日本', 12345)])")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env={**__import__("os").environ, "PYTHONHASHSEED": seed})
        assert out.stdout.strip() == str(list(picks.values())), out.stderr
