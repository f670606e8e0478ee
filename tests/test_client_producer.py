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


def test_a_half_message_the_added_transaction_properties_take_over_the_limit_is_refused(
        broker, request):
    """The properties a transaction send adds (TRAN_MSG, PGROUP) count
    toward the 32767-byte limit: a message that fits it alone is refused
    as a half message with MESSAGE_ILLEGAL naming the limit, before anything
    is sent or the local transaction runs; sent plain it is stored."""
    topic = topic_of(request)
    make_topic(broker, topic)
    # 64 bytes to spare (the broker adds CLUSTER); TRAN_MSG and PGROUP add 130
    fits = 32767 - 64 - len(Message(topic, b"x", properties={"p": ""}).properties_string("0" * 32))
    group = "pg-tx-wide-" + "g" * 100
    ran = []

    class Runs(Listener):
        def execute_local_transaction(self, msg, arg):
            ran.append(msg)
            return LocalTransactionState.COMMIT_MESSAGE

    with TransactionProducer(group, Runs(), namesrv_addr=broker.namesrv) as p:
        with pytest.raises(MQClientError) as e:
            p.send_message_in_transaction(Message(topic, b"half", properties={"p": "v" * fits}))
        # the client's refusal (the broker's answer to a sent one would name no limit of 32KB)
        assert e.value.code == 13 and "properties length limit 32KB" in str(e.value), str(e.value)
        assert p.send(Message(topic, b"plain", properties={"p": "v" * fits})).status is \
            SendStatus.SEND_OK
    assert ran == [] and [m.body for m in stored(broker, topic)] == [b"plain"]


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


def test_a_child_forked_with_sends_in_flight_and_batched_neither_waits_for_nor_repeats_them(
        broker, request):
    """A producer forked while its window is full (sends in flight to a
    broker that is stopped, one message waiting in a batch) and a put is
    buffered: the child sends and puts its own messages at once — it does
    not wait for the parent's slots, nor send the parent's batch or put —
    and counts only its own; the parent's all arrive, each stored once."""
    import os
    import signal
    from brokerproc import until
    topic = topic_of(request)
    make_topic(broker, topic)
    cfg = ClientConfig(namesrv_addr=broker.namesrv, direct_append=False)   # all over its socket
    with Producer("pg-fork-pending", client=cfg, linger_ms=60_000, send_msg_timeout=120,
                  max_in_flight=4, batch_max_bytes=100, put_linger_ms=60_000) as p:
        alone = [b"alone %d" % i + b"." * 100 for i in range(3)]      # over batch_max_bytes
        p.send(Message(topic, alone[0]))                                # route and connection
        os.killpg(broker.proc.pid, signal.SIGSTOP)
        try:
            in_flight = [p.send_async(Message(topic, b)) for b in alone]
            batched = p.send_async(Message(topic, b"batched"))
            p.put(topic, b"put by the parent")
            until(lambda: p._p.window.used == 4 and p._p.accumulator.lingering == 1,
                  "three sends in flight and one in a batch")
            pid = os.fork()
            if pid == 0:                                       # the child: its exit code says
                code = 1
                try:
                    signal.alarm(60)                           # never outlive a failed test
                    p.put(topic, b"put by the child")
                    counts = p.flush()                         # not the parent's batch or put
                    mine = p.send(Message(topic, b"child" + b"." * 100))     # a slot of its own
                    code = 2 if (counts.put, counts.stored) != (1, 1) else \
                        0 if mine.status is SendStatus.SEND_OK else 3
                finally:
                    os._exit(code)
        finally:
            os.killpg(broker.proc.pid, signal.SIGCONT)
        status = []
        try:
            until(lambda: status.append(os.waitpid(pid, os.WNOHANG)) or status[-1][0] == pid,
                  "the child's sends", timeout=30)
        finally:
            if status[-1][0] != pid:                          # it hangs: the test failed
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status[-1][1]) == 0
        assert all(f.result(30).status is SendStatus.SEND_OK for f in in_flight)
        counts = p.flush()
        assert batched.result(30).status is SendStatus.SEND_OK and (counts.put, counts.stored) == (1, 1)
    assert sorted(m.body for m in stored(broker, topic)) == sorted(
        [alone[0], *alone, b"batched", b"put by the parent", b"child" + b"." * 100,
         b"put by the child"])


def test_pipelined_sends_keep_their_order_when_the_store_attached_meanwhile_takes_over(
        broker, request, monkeypatch):
    """A producer on the broker's host whose process has not loaded what
    direct appends need sends over the broker's socket while the store is
    attached in a thread (numba and the kernels load there, not on the
    event loop); the switch to appending waits for the sends in flight over
    the socket: a queue holds pipelined sends in call order, the first ones
    sent over the socket, the later ones appended. (The attaching thread is
    held until sends are in flight, as a cold process's import holds it.)"""
    import collections
    import threading
    from shmq.client import direct
    topic = topic_of(request)
    make_topic(broker, topic)
    loaded, load, go = direct.appends_loaded, direct.load_appends, threading.Event()
    monkeypatch.setattr(direct, "appends_loaded", lambda: False)       # a cold process
    monkeypatch.setattr(direct, "load_appends", lambda: go.wait(30) and load())

    async def main():
        async with AsyncProducer("pg-switch", namesrv_addr=broker.namesrv) as p:
            q = (await p.publish_queues(topic))[0]
            await p.instance.broker(q.broker_name)          # the store is being attached

            def appended():
                ds = p.instance.direct_now(q.broker_name)
                return 0 if ds is None else ds.appended
            sends, outstanding, after = [], collections.deque(), 0
            deadline = time.monotonic() + 60                # a hang guard, not a timing
            while after < 8 and time.monotonic() < deadline:
                for _ in range(16):
                    sends.append(asyncio.ensure_future(
                        p.send(Message(topic, b"%d" % len(sends)), queue=q)))
                    outstanding.append(sends[-1])
                await asyncio.sleep(0)                       # they are written
                if len(sends) == 96:
                    assert p.instance.direct_now(q.broker_name) is None
                    go.set()                                 # 64 in flight, 32 waiting
                while len(outstanding) > 128:               # the window's 64 and as many waiting
                    await outstanding.popleft()
                after += appended() > 0
            return await asyncio.wait_for(asyncio.gather(*sends), 60), appended()
    results, appended = asyncio.run(main())
    n = len(results)
    assert 0 < appended < n, (appended, n)                  # both paths were taken
    first = results[0].queue_offset
    assert [r.queue_offset for r in results] == list(range(first, first + n))
    assert [m.body for m in stored(broker, topic) if m.queue_id == results[0].queue.queue_id] == \
        [b"%d" % i for i in range(n)]


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


# ---------------------------------------------------------------- pipelining, window, accumulator
def _spy_requests(monkeypatch) -> list[tuple[int, bytes]]:
    """(request code, frame) of every request a Connection sends, in order."""
    from shmq.client.connection import Connection
    sent = []
    real = Connection.send_frame

    def send_frame(self, opaque, frame, timeout, code=0):
        sent.append((code, frame))
        return real(self, opaque, frame, timeout, code)
    monkeypatch.setattr(Connection, "send_frame", send_frame)
    return sent


def _by_position(broker, topic, queues=4):
    """Every stored record of ``topic`` by (queue, offset), pulled page by page."""
    from shmq.client.remoting import RemotingClient
    from shmq.client.requests import decode_records, pull_message
    from shmq.ipc.codes import ResponseCode
    held = {}
    with RemotingClient(broker.addr) as c:
        for q in range(queues):
            while True:
                r = c.invoke(pull_message(topic, q, sum(k[0] == q for k in held), max_msgs=32))
                page = decode_records(r.body) if r.code == ResponseCode.SUCCESS else []
                if not page:
                    break
                held.update({(m.queue_id, m.queue_offset): m for m in page})
    return held


def _check_results(broker, topic, sent_bodies, results, queues=4):
    """Each caller's SendResult names its own stored message: UNIQ_KEY, offsetMsgId,
    queue and offset, and that message holds what this caller sent."""
    held = _by_position(broker, topic, queues)
    assert len(held) == len(sent_bodies)
    for body, r in zip(sent_bodies, results):
        m = held[(r.queue.queue_id, r.queue_offset)]
        assert (m.body, m.properties["UNIQ_KEY"], m.offset_msg_id()) == (body, r.msg_id, r.offset_msg_id)
        assert r.status is SendStatus.SEND_OK and r.queue.topic == topic


def test_sends_pipeline_on_one_connection_without_a_task_each(broker, request, monkeypatch):
    """64 callers sending 20 messages each through one producer: one broker
    connection, never more than max_in_flight requests waiting, tasks only
    for the callers (none per send), every caller its own result, and on one
    queue the stored order is the order of the calls."""
    topic = topic_of(request)
    make_topic(broker, topic)
    sent = _spy_requests(monkeypatch)
    bodies = {w: [b"w%d-%d" % (w, i) for i in range(20)] for w in range(64)}

    async def main():
        loop = asyncio.get_running_loop()
        created = []
        factory = loop.get_task_factory()

        def count(loop, coro, **kw):
            created.append(coro)
            return factory(loop, coro, **kw) if factory else asyncio.Task(coro, loop=loop, **kw)
        async with AsyncProducer("pg-pipe", namesrv_addr=broker.namesrv, max_in_flight=8,
                                 client=ClientConfig(direct_append=False)) as p:   # the socket path
            q = (await p.publish_queues(topic))[1]
            conn = await p.instance.broker(q.broker_name)
            most = []
            real = conn.send_frame

            def watched(*a, **kw):
                fut = real(*a, **kw)
                most.append(len(conn.pending))
                return fut
            conn.send_frame = watched
            loop.set_task_factory(count)

            async def caller(w):
                return [await p.send(Message(topic, b), queue=q) for b in bodies[w]]
            tasks = [loop.create_task(caller(w)) for w in range(64)]
            results = await asyncio.gather(*tasks)
            loop.set_task_factory(factory)
            conns = [c for a, c in p.instance.conns.items() if a != broker.namesrv and not c.closed]
            return results, max(most), len(created), len(conns)

    results, most, tasks, conns = asyncio.run(main())
    assert conns == 1 and most <= 8 and tasks <= 64 + 4, (conns, most, tasks)
    assert sum(code == 310 for code, _ in sent) == 64 * 20        # SEND_MESSAGE_V2, one each
    flat_bodies = [b for w in range(64) for b in bodies[w]]
    flat_results = [r for rs in results for r in rs]
    _check_results(broker, topic, flat_bodies, flat_results)
    for rs in results:                                  # one caller's sends: in its order
        assert [r.queue_offset for r in rs] == sorted(r.queue_offset for r in rs)


def test_a_closed_connection_fails_every_pending_send_at_once(tmp_path):
    """Sends waiting on a broker that stops answering (SIGSTOP) and then dies
    (SIGKILL) fail as soon as the connection closes, with an error naming
    it, not after their 60 s timeout; later sends fail at once too."""
    import os
    import signal
    from shmq.client.connection import RemotingError
    b = start_broker(tmp_path)
    try:
        topic = make_topic(b, "C_closed")

        async def main():
            async with AsyncProducer("pg-closed", namesrv_addr=b.namesrv,      # the socket path
                                     client=ClientConfig(direct_append=False)) as p:
                q = (await p.publish_queues(topic))[0]
                assert (await p.send(Message(topic, b"first"), queue=q)).status is SendStatus.SEND_OK
                conn = await p.instance.broker(q.broker_name)
                os.killpg(b.proc.pid, signal.SIGSTOP)
                sends = [asyncio.ensure_future(p.send(Message(topic, b"x%d" % i), queue=q, timeout=60))
                         for i in range(40)]
                while len(conn.pending) < 40:
                    await asyncio.sleep(0.01)
                os.killpg(b.proc.pid, signal.SIGKILL)
                async with asyncio.timeout(30):                # a hang guard, not a timing
                    errors = await asyncio.gather(*sends, return_exceptions=True)
                with pytest.raises(RemotingError):
                    conn.send_frame(1, b"", 1.0)
                return errors, conn.closed
        errors, closed = asyncio.run(main())
        assert closed
        assert all(isinstance(e, RemotingError) and "closed" in str(e) and "within" not in str(e)
                   for e in errors), errors[:3]
    finally:
        b.kill9()


def test_the_accumulator_turns_single_sends_into_batches(broker, request, monkeypatch):
    """linger_ms: 100 concurrent single sends leave as a few SEND_BATCH_MESSAGE
    requests; every caller still gets the SendResult of its own message, and
    the broker holds each message once with what its caller sent."""
    topic = topic_of(request)
    make_topic(broker, topic)
    sent = _spy_requests(monkeypatch)
    msgs = [Message(topic, b"acc-%d" % i, tags="T%d" % (i % 3), keys=["k%d" % i, "x"],
                    properties={"n": str(i), "uni": "é日"}) for i in range(100)]

    async def main():
        async with AsyncProducer("pg-acc", namesrv_addr=broker.namesrv, linger_ms=200) as p:
            return await asyncio.gather(*[p.send(m) for m in msgs]), p.accumulator.requests
    results, batches = asyncio.run(main())
    codes = [code for code, _ in sent]
    assert 1 <= codes.count(320) == batches < 100 and codes.count(310) <= 1, codes   # SEND_BATCH
    _check_results(broker, topic, [m.body for m in msgs], results)
    held = _by_position(broker, topic)
    for m, r in zip(msgs, results):
        s = held[(r.queue.queue_id, r.queue_offset)]
        assert (s.tags, s.keys, s.properties["n"], s.properties["uni"]) == (m.tags, m.keys, m.properties["n"], "é日")


def test_the_accumulator_keeps_a_chosen_queues_order(broker, request):
    topic = topic_of(request)
    make_topic(broker, topic)
    bodies = [b"ord-%d" % i for i in range(60)]

    async def main():
        async with AsyncProducer("pg-acc-ord", namesrv_addr=broker.namesrv, linger_ms=50,
                                 batch_max_bytes=1000) as p:        # several batches of the queue
            return await asyncio.gather(*[p.send(Message(topic, b), selector=select_by_hash, arg="o")
                                          for b in bodies])
    results = asyncio.run(main())
    assert len({r.queue for r in results}) == 1
    assert [r.queue_offset for r in results] == list(range(results[0].queue_offset, results[0].queue_offset + 60))
    _check_results(broker, topic, bodies, results)


def test_a_callers_short_timeout_in_a_batch_is_its_own(broker, request):
    """Each caller of a batch has its own send timeout: a caller whose
    timeout is shorter than linger_ms, opening the batch, makes it leave in
    time and every caller of it is stored and answered (it failed them all);
    while the broker does not answer, a caller's short timeout fails that
    caller alone and the one beside it is answered once the broker is back."""
    import os
    import signal
    from shmq.client.connection import RemotingError
    topic = topic_of(request)
    make_topic(broker, topic)

    async def main():
        # the short caller's batch leaves by half its timeout (2.5 s), 17.5 s
        # before the linger would send it: the broker has seconds to answer
        async with AsyncProducer("pg-acc-timeouts", namesrv_addr=broker.namesrv, linger_ms=20000,
                                 send_msg_timeout=60) as p:
            await p.publish_queues(topic)
            p._template(topic)                           # the fast lane takes the topic's sends
            both = await asyncio.gather(p.send(Message(topic, b"short"), timeout=5),
                                        p.send(Message(topic, b"long"), timeout=60))
            os.killpg(broker.proc.pid, signal.SIGSTOP)
            try:
                waits = asyncio.ensure_future(p.send(Message(topic, b"waits"), timeout=60))
                gives_up = asyncio.ensure_future(p.send(Message(topic, b"gives up"), timeout=0.3))
                async with asyncio.timeout(30):                # a hang guard, not a timing
                    with pytest.raises(RemotingError, match="within its timeout"):
                        await gives_up
                assert not waits.done()
            finally:
                os.killpg(broker.proc.pid, signal.SIGCONT)
            return both, await asyncio.wait_for(waits, 30)
    both, waited = asyncio.run(main())
    assert both[0].queue == both[1].queue and both[1].queue_offset == both[0].queue_offset + 1
    held = _by_position(broker, topic)
    for body, r in ((b"short", both[0]), (b"long", both[1]), (b"waits", waited)):
        assert held[(r.queue.queue_id, r.queue_offset)].body == body
    # the one that gave up was in the batch that was sent: stored all the same
    assert sorted(m.body for m in held.values()) == [b"gives up", b"long", b"short", b"waits"]


def test_a_caller_joining_a_batch_late_has_its_whole_timeout(broker, request):
    """A caller's send timeout counts from its own call, not from when the
    batch it joins was opened: a send with a 0.2 s timeout joining a batch
    that has lingered 0.3 s already is sent and answered (or, on a very
    slow machine, times out no sooner than 0.2 s after it was called); it
    failed at once, its time spent before it existed."""
    topic = topic_of(request)
    make_topic(broker, topic)

    async def main():
        async with AsyncProducer("pg-acc-late", namesrv_addr=broker.namesrv, linger_ms=5000,
                                 send_msg_timeout=30) as p:
            await p.publish_queues(topic)
            p._template(topic)
            first = asyncio.ensure_future(p.send(Message(topic, b"first"), timeout=30))
            await _lingering(p, 1)
            await asyncio.sleep(0.3)                     # the batch's age, what the test is about
            t0 = time.monotonic()
            try:
                late = await p.send(Message(topic, b"late"), timeout=0.2)
            except Exception as e:                       # noqa: BLE001 (asserted below)
                late = e
            took = time.monotonic() - t0
            return await asyncio.wait_for(first, 30), late, took
    first, late, took = asyncio.run(main())
    if isinstance(late, BaseException):
        assert took >= 0.2, f"the late caller failed after {took * 1000:.0f} ms: {late!r}"
    else:
        assert (late.queue, late.queue_offset) == (first.queue, first.queue_offset + 1)
        held = _by_position(broker, topic)
        assert held[(late.queue.queue_id, late.queue_offset)].body == b"late"


def test_a_short_timeout_holds_while_its_batch_is_retried(broker, request):
    """A batch whose connection broke is retried (here its reconnection is
    held at the broker's heartbeat): a caller of it whose timeout is short
    gets its timeout when that passes, while the one beside it waits on
    and is answered once the broker is back; the short one waited out the
    long one's retries."""
    import os
    import signal
    from shmq.client.connection import RemotingError
    topic = topic_of(request)
    make_topic(broker, topic)

    async def main():
        cfg = ClientConfig(namesrv_addr=broker.namesrv, direct_append=False,
                           instance_name=f"acc-retry-{time.time_ns()}")
        async with AsyncProducer("pg-acc-retry", client=cfg, linger_ms=5000,
                                 send_msg_timeout=30) as p:
            inst = p.instance
            queues = await p.publish_queues(topic)
            conn = await inst.broker(queues[0].broker_name)     # the connection the batch takes
            p._template(topic)
            entered, gate = asyncio.Event(), asyncio.Event()
            heartbeat = inst._heartbeat_to

            async def held(addr, conn, body):        # the reconnection's real heartbeat, held
                entered.set()
                await gate.wait()
                await heartbeat(addr, conn, body)
            os.killpg(broker.proc.pid, signal.SIGSTOP)
            try:
                waits = asyncio.ensure_future(p.send(Message(topic, b"waits"), timeout=30))
                short = asyncio.ensure_future(p.send(Message(topic, b"short"), timeout=0.5))
                await _lingering(p, 2)
                inst._heartbeat_to = held
                p.accumulator.flush()                    # written to the stopped broker ...
                await conn.close()                       # ... whose connection breaks: a retry
                async with asyncio.timeout(20):          # a hang guard, not a timing
                    await entered.wait()
                    with pytest.raises(RemotingError, match="within its timeout"):
                        await short
                assert not waits.done() and not gate.is_set()
            finally:
                os.killpg(broker.proc.pid, signal.SIGCONT)
                gate.set()
            return await asyncio.wait_for(waits, 30)
    waited = asyncio.run(main())
    assert _by_position(broker, topic)[(waited.queue.queue_id, waited.queue_offset)].body == b"waits"


def test_sends_past_a_full_window_get_their_slots_in_call_order():
    """max_in_flight 2, two sends in flight and C waiting: when both answers
    come at once, C and then D (issued meanwhile) go, and E, issued after
    them, waits for the next free slot; E took the free slot ahead of D,
    which sat waiting while a slot was free. A waiter cancelled leaves
    the order to the others."""
    from shmq.client.accumulator import Window

    async def main():
        w = Window(2)
        went = []

        async def send(name):                        # a send's window step (AsyncProducer._send)
            if not w.try_take():
                await w.wait()
            went.append(name)

        async def turns():                           # a bounded number of loop turns
            for _ in range(20):
                await asyncio.sleep(0)
        assert w.try_take() and w.try_take()         # A and B in flight
        c = asyncio.ensure_future(send("C"))
        await turns()                                # C waits for a slot
        d = asyncio.ensure_future(send("D"))         # D's first step still to run ...
        w.release(2)                                 # ... when A's and B's answers come together
        e = asyncio.ensure_future(send("E"))
        await turns()
        assert went == ["C", "D"] and not e.done() and w.used == 2
        f = asyncio.ensure_future(send("F"))
        await turns()
        f.cancel()
        await turns()
        w.release()                                  # C's answer: E's turn
        await turns()
        assert went == ["C", "D", "E"] and c.done() and d.done() and f.cancelled()
        w.release(2)
        assert w.try_take() and w.used == 1          # nobody waits: a free slot is taken at once
        # a waiter cancelled in the same turn as a release: cancelled, the slot passed on
        assert w.try_take() and w.used == 2
        g, h = asyncio.ensure_future(send("G")), asyncio.ensure_future(send("H"))
        await turns()
        g.cancel()
        w.release()
        await turns()
        assert g.cancelled() and went[-1] == "H" and w.used == 2
    asyncio.run(main())


def test_a_linger_not_shorter_than_the_send_timeout_is_refused_when_the_producer_is_made():
    """A batch leaves linger_ms after its first message and fails once that
    message's send timeout passed: linger_ms >= send_msg_timeout would fail
    every batched send, so the producer is refused at once, naming both."""
    for make, settings in ((AsyncProducer, {"linger_ms": 5000}),
                           (Producer, {"linger_ms": 3000}),
                           (AsyncProducer, {"linger_ms": 100, "send_msg_timeout": 0.05})):
        with pytest.raises(ValueError, match="linger_ms .* must be less than send_msg_timeout"):
            make("pg-acc-linger", **settings)
    assert AsyncProducer("pg-acc-linger", linger_ms=2999).accumulator is not None


async def _lingering(p, n: int) -> None:
    """Until ``n`` messages wait in the accumulator's batches (a hang guard, not a timing)."""
    deadline = time.monotonic() + 15
    while p.accumulator.lingering < n:
        assert time.monotonic() < deadline, f"{p.accumulator.lingering} of {n} sends in a batch"
        await asyncio.sleep(0.005)


def test_a_batch_the_broker_refuses_fails_each_of_its_callers_and_frees_their_slots(broker, request):
    """A batch the broker refuses (one of its messages is over the broker's
    maxMessageSize, 1 MiB) fails every caller of the batch with the broker's
    error, and nothing of it is stored; their window slots are free again:
    more sends than max_in_flight go through after it."""
    topic = topic_of(request)
    make_topic(broker, topic)

    async def main():
        async with AsyncProducer("pg-acc-refused", namesrv_addr=broker.namesrv, linger_ms=60_000,
                                 send_msg_timeout=120, max_in_flight=8, batch_max_bytes=4 << 20,
                                 compress_msg_body_over_howmuch=4 << 20) as p:
            refused = [asyncio.ensure_future(p.send(Message(topic, b)))
                       for b in (b"small", b"B" * (3 << 19), b"small too")]
            await _lingering(p, 3)
            await p.flush()
            errors = await asyncio.gather(*refused, return_exceptions=True)
            later = await asyncio.gather(*[p.send(Message(topic, b"later %d" % i)) for i in range(20)])
            return errors, later, p.window.used
    errors, later, used = asyncio.run(main())
    assert all(isinstance(e, MQClientError) for e in errors), errors
    assert len({e.code for e in errors}) == 1 and used == 0
    _check_results(broker, topic, [b"later %d" % i for i in range(20)], later)


def test_a_body_that_is_not_bytes_is_refused_and_its_batch_goes_on(broker, request):
    """A message whose body is a str is refused with MESSAGE_ILLEGAL, saying
    so; the messages sent beside it, into the same batch, are stored."""
    topic = topic_of(request)
    make_topic(broker, topic)
    bodies = [b"before", b"after"]

    async def main():
        async with AsyncProducer("pg-acc-str", namesrv_addr=broker.namesrv, linger_ms=50) as p:
            return await asyncio.gather(p.send(Message(topic, bodies[0])), p.send(Message(topic, "text")),
                                        p.send(Message(topic, bodies[1])), return_exceptions=True)
    before, refused, after = asyncio.run(main())
    assert isinstance(refused, MQClientError) and "str, not bytes" in str(refused), refused
    _check_results(broker, topic, bodies, [before, after])


def test_a_cancelled_caller_leaves_its_batch_to_the_others(broker, request):
    """A caller cancelled while its message waits in a batch gets
    CancelledError; the message was handed over and is sent with its batch,
    every other caller gets its own result, and the window is whole again."""
    topic = topic_of(request)
    make_topic(broker, topic)
    bodies = [b"c%d" % i for i in range(5)]

    async def main():
        async with AsyncProducer("pg-acc-cancel", namesrv_addr=broker.namesrv, linger_ms=60_000,
                                 send_msg_timeout=120) as p:
            sends = [asyncio.ensure_future(p.send(Message(topic, b))) for b in bodies]
            await _lingering(p, 5)
            sends[2].cancel()
            await p.flush()
            return await asyncio.gather(*sends, return_exceptions=True), p.window.used
    results, used = asyncio.run(main())
    assert isinstance(results[2], asyncio.CancelledError) and used == 0
    held = _by_position(broker, topic)
    assert sorted(m.body for m in held.values()) == sorted(bodies)
    for body, r in zip(bodies[:2] + bodies[3:], results[:2] + results[3:]):
        assert held[(r.queue.queue_id, r.queue_offset)].body == body and r.status is SendStatus.SEND_OK


def test_too_big_and_delayed_messages_go_alone(broker, request, monkeypatch):
    """A message whose batch entry is over batch_max_bytes, a delayed one and
    one sent in a transaction are never batched; the rest still are."""
    topic = topic_of(request)
    make_topic(broker, topic)
    sent = _spy_requests(monkeypatch)
    small = [Message(topic, b"s%d" % i) for i in range(20)]
    big = Message(topic, b"B" * 600)                       # < compress threshold, > batch_max_bytes
    delayed = Message(topic, b"later", delay_level=1)

    async def main():
        async with AsyncProducer("pg-alone", namesrv_addr=broker.namesrv, linger_ms=200,
                                 batch_max_bytes=500) as p:
            return await asyncio.gather(*[p.send(m) for m in [*small[:10], big, delayed, *small[10:]]])
    results = asyncio.run(main())
    assert all(r.status is SendStatus.SEND_OK for r in results)
    alone = [frame for code, frame in sent if code == 310]
    assert sum(b"B" * 600 in f for f in alone) == 1 and sum(b"later" in f for f in alone) == 1
    batched = [frame for code, frame in sent if code == 320]
    assert batched and not any(b"B" * 600 in f or b"later" in f for f in batched)
    assert sum(f.count(b"UNIQ_KEY") for f in batched) + len(alone) == 22
    held = _by_position(broker, topic)
    r_big = results[10]
    assert held[(r_big.queue.queue_id, r_big.queue_offset)].body == big.body
    assert not any(m.body == b"later" for m in held.values())      # in the delay queue for now


def test_the_send_frame_template_writes_what_encode_writes():
    """SendTemplate's frames are byte for byte ipc.remoting.encode's."""
    from shmq.client.connection import LANGUAGE
    from shmq.client.requests import SendTemplate
    from shmq.ipc.codes import RequestCode as RC
    from shmq.ipc.remoting import RemotingCommand, encode
    t = SendTemplate('g"r\\oup', "Topic_1", "TBW102", 8)
    for batch, props, body in ((False, "TAGS\x01a\x02UNIQ_KEY\x01AB\x02u\x01é日", b"x" * 33), (True, "", b"\x00\x01")):
        cmd = RemotingCommand(RC.SEND_BATCH_MESSAGE if batch else RC.SEND_MESSAGE_V2, opaque=991, body=body,
                              ext={"a": 'g"r\\oup', "b": "Topic_1", "c": "TBW102", "d": "8", "e": "3",
                                   "f": "1", "g": "1700000000123", "h": "7", "i": props, "j": "0",
                                   "k": "false", "m": "true" if batch else "false"},
                              language=LANGUAGE)
        assert t.frame(991, 3, 1, 1700000000123, 7, props, body, batch) == encode(cmd)


def test_the_broker_lists_the_clients_connections_in_language_python(broker, request):
    """The remoting header's language is PYTHON (RocketMQ's LanguageCode 3),
    not JAVA: a producer group's connections on the broker say so."""
    from shmq.tools.admin_client import AdminClient
    topic = topic_of(request)
    make_topic(broker, topic)
    with Producer("pg-language", namesrv_addr=broker.namesrv) as p:
        assert p.send(Message(topic, b"from python")).status is SendStatus.SEND_OK
        with AdminClient(broker.namesrv) as a:
            conns = a.producer_connection(broker.addr, "pg-language")
    assert [c["language"] for c in conns] == ["PYTHON"]


def test_a_send_racing_shutdown_is_refused_and_the_producer_starts_again(broker, request):
    """A send made while ``shutdown()`` unregisters is refused at once
    (RocketMQ's "The producer service state not OK"), never left waiting in
    a batch no flush would send; the same producer started again sends."""
    topic = topic_of(request)
    make_topic(broker, topic)

    async def main():
        p = AsyncProducer("pg-acc-shutdown", namesrv_addr=broker.namesrv, linger_ms=50)
        await p.start()
        warm = await asyncio.wait_for(p.send(Message(topic, b"warm")), 10)
        closing = asyncio.ensure_future(p.shutdown())
        await asyncio.sleep(0)                          # shutdown() under way: it unregisters
        racing = asyncio.ensure_future(p.send(Message(topic, b"racing")))
        await asyncio.wait_for(closing, 10)
        with pytest.raises(MQClientError, match="shut down"):
            await asyncio.wait_for(racing, 5)
        await p.start()
        try:
            return warm, await asyncio.wait_for(p.send(Message(topic, b"after")), 5), p.window.used
        finally:
            await p.shutdown()
    warm, after, used = asyncio.run(main())
    assert used == 0
    _check_results(broker, topic, [b"warm", b"after"], [warm, after])


def test_a_chosen_queues_message_in_a_sticky_batch_is_never_retried_elsewhere(broker, request,
                                                                               monkeypatch):
    """A message sent to a chosen queue that joins the batch a message with no
    queue opened there makes that batch its queue's for good: when it fails
    (retryably) it is not retried on another queue, so the chosen message is
    never stored out of its queue."""
    from shmq.client.connection import RemotingError
    topic = topic_of(request)
    make_topic(broker, topic)

    async def main():
        async with AsyncProducer("pg-acc-fixed", namesrv_addr=broker.namesrv,
                                 linger_ms=60_000, send_msg_timeout=120) as p:
            free = asyncio.ensure_future(p.send(Message(topic, b"free")))
            await _lingering(p, 1)
            q = p.accumulator.sticky[topic].queue
            ordered = asyncio.ensure_future(p.send(Message(topic, b"ordered"), queue=q))
            await _lingering(p, 2)
            real, failed = p.write_batch, []

            def fails_once(conn, q, batch, timeout):     # the connection closed under the batch
                if failed:
                    return real(conn, q, batch, timeout)
                failed.append(q)
                fut = asyncio.get_running_loop().create_future()
                fut.set_exception(RemotingError("connection closed"))
                return fut
            monkeypatch.setattr(p, "write_batch", fails_once)
            await asyncio.wait_for(p.flush(), 10)
            got = await asyncio.wait_for(asyncio.gather(free, ordered, return_exceptions=True), 10)
            return q, failed, got
    q, failed, (free, ordered) = asyncio.run(main())
    assert failed == [q]
    assert isinstance(ordered, RemotingError), ordered               # failed where it was sent
    assert not any(m.body == b"ordered" for m in _by_position(broker, topic).values())


def test_a_flag_over_int32_is_refused_and_the_next_message_is_sent_as_itself(broker, request):
    """A message whose flag does not fit an int32 is refused with
    MESSAGE_ILLEGAL naming the flag, before it opens a batch; the message
    sent next is stored as itself (its body, its UNIQ_KEY)."""
    topic = topic_of(request)
    make_topic(broker, topic)

    async def main():
        async with AsyncProducer("pg-acc-flag", namesrv_addr=broker.namesrv, linger_ms=20) as p:
            await p.publish_queues(topic)
            p._template(topic)                           # the fast lane takes the topic's sends
            with pytest.raises(MQClientError) as e:
                await asyncio.wait_for(p.send(Message(topic, b"refused", flag=1 << 31)), 5)
            with pytest.raises(MQClientError) as chosen:
                await asyncio.wait_for(p.send(Message(topic, b"refused", flag=-1 - (1 << 31)),
                                              queue=(await p.publish_queues(topic))[0]), 5)
            return e.value, chosen.value, await asyncio.wait_for(p.send(Message(topic, b"good")), 5)
    refused, chosen, good = asyncio.run(main())
    for e in (refused, chosen):
        assert e.code == 13 and "flag" in str(e), e
    _check_results(broker, topic, [b"good"], [good])


def test_properties_over_32767_bytes_are_refused_in_every_send_path(broker, request):
    """A message whose properties encode to more than 32767 bytes (the
    record's int16 length; RocketMQ's broker answers MESSAGE_ILLEGAL) is
    refused with MESSAGE_ILLEGAL naming the limit by every send path —
    direct, socket, send_async, send_batch, oneway, send_many, put (at
    once), the accumulator's fast lane and general path — before anything
    is sent; the messages sent beside it are stored as themselves."""
    topic = topic_of(request)
    make_topic(broker, topic)
    wide = "é" * 16384            # 16384 characters, 32768 bytes in UTF-8

    def too_big():
        return [Message(topic, b"props", properties={"p": wide}), Message(topic, b"tags", tags=wide),
                Message(topic, b"keys", keys=["k", wide])]

    async def main():
        refused, good = [], []
        for cfg, settings in ((ClientConfig(namesrv_addr=broker.namesrv), {}),
                              (ClientConfig(namesrv_addr=broker.namesrv, direct_append=False), {}),
                              (ClientConfig(namesrv_addr=broker.namesrv, direct_append=False),
                               {"linger_ms": 20, "batch_max_bytes": 1 << 20})):
            async with AsyncProducer("pg-wide", client=cfg, **settings) as p:
                await p.publish_queues(topic)
                p._template(topic)                     # the accumulator's fast lane takes sends
                for m in too_big():
                    sends = [p.send(m), p.send_async(m), p.send_batch([m]), p.send_oneway(m)]
                    refused += await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 10)
                refused += await asyncio.gather(p.send_many(topic, [b"many"], tags=wide),
                                                return_exceptions=True)
                for tags, keys in ((wide, None), ("t", [wide])):
                    with pytest.raises(MQClientError) as put:
                        p.put(topic, b"put", tags=tags, keys=keys)      # at once, not at flush
                    refused.append(put.value)
                batch = [Message(topic, b"beside %d" % len(good)), *too_big(),
                         Message(topic, b"beside %d" % (len(good) + 1))]
                got = await asyncio.wait_for(asyncio.gather(*map(p.send, batch),
                                                            return_exceptions=True), 10)
                refused += got[1:-1]
                good += [(batch[0].body, got[0]), (batch[-1].body, got[-1])]
        return refused, good
    refused, good = asyncio.run(main())
    assert len(refused) == 3 * (3 * 4 + 3 + 3)
    for e in refused:
        assert isinstance(e, MQClientError) and e.code == 13 and "32767" in str(e), repr(e)
    _check_results(broker, topic, *zip(*good))


def test_a_reserved_separator_in_tags_keys_or_properties_is_one_error_on_every_path(broker,
                                                                                 request):
    """\\u0001 or \\u0002 in tags, keys, a property's name or value (they
    separate the properties string) is refused with MESSAGE_ILLEGAL naming
    the property by send, send_batch, oneway, send_many and put alike (direct
    appends and the accumulator), before anything is sent; nothing of it is
    stored."""
    topic = topic_of(request)
    make_topic(broker, topic)
    bad = [Message(topic, b"t", tags="a\x01b"), Message(topic, b"k", keys=["k", "x\x02y"]),
           Message(topic, b"p", properties={"p": "v\x01"}),
           Message(topic, b"n", properties={"n\x02": "v"})]

    async def main():
        refused, good = [], []
        for settings in ({}, {"linger_ms": 20}):
            async with AsyncProducer("pg-sep", namesrv_addr=broker.namesrv, **settings) as p:
                await p.publish_queues(topic)
                p._template(topic)                     # the accumulator's fast lane takes sends
                for m in bad:
                    sends = [p.send(m), p.send_batch([m]), p.send_oneway(m)]
                    refused += await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 10)
                refused += await asyncio.gather(p.send_many(topic, [b"many"], tags="a\x02"),
                                                return_exceptions=True)
                for tags, keys in (("a\x01", None), (None, ["k", "x\x02"])):
                    with pytest.raises(MQClientError) as put:
                        p.put(topic, b"put", tags=tags, keys=keys)
                    refused.append(put.value)
                good.append(await p.send(Message(topic, b"good %d" % len(good))))
        return refused, good
    refused, good = asyncio.run(main())
    assert len(refused) == 2 * (4 * 3 + 1 + 2)
    for e in refused:
        assert isinstance(e, MQClientError) and e.code == 13, repr(e)
        assert "illegal character" in str(e) and "\\u0001 or \\u0002" in str(e), str(e)
    _check_results(broker, topic, [b"good 0", b"good 1"], good)


def test_a_route_refresh_the_nameserver_answers_topic_not_exist_keeps_the_last_route(
        broker, request, caplog):
    """A NameServer that knows no such topic for a while (restarted before
    its brokers registered again; here the topic deleted there only)
    answers a route refresh TOPIC_NOT_EXIST: the client keeps the route it
    had, with a warning, as RocketMQ's MQClientInstance does, and sends go
    on to the topic's own queues, not to queues made up from TBW102's."""
    from shmq.client.remoting import RemotingClient
    from shmq.ipc.codes import RequestCode as RC
    from shmq.ipc.remoting import RemotingCommand
    topic = topic_of(request)
    make_topic(broker, topic, 2)

    async def main():
        async with AsyncProducer("pg-route-kept", namesrv_addr=broker.namesrv) as p:
            await p.send(Message(topic, b"before"))
            inst = p.instance

            def nameserver(code: int) -> int:
                with RemotingClient(broker.namesrv) as ns:
                    return ns.invoke(RemotingCommand(code, ext={"topic": topic})).code

            # The broker registers its topics again every 30 s: one that lands
            # between the delete and the refresh gives the refresh a route, so
            # the round goes again (a round misses only if the registration
            # falls in its few milliseconds)
            for _ in range(3):
                route = inst.routes[topic]
                assert nameserver(RC.DELETE_TOPIC_IN_NAMESRV) == 0
                if nameserver(RC.GET_ROUTEINFO_BY_TOPIC) != 17:
                    continue                               # registered again meanwhile
                await inst.refresh_routes()                # the periodic refresh, now
                if nameserver(RC.GET_ROUTEINFO_BY_TOPIC) == 17:
                    break                                  # still unknown: the refresh saw that
            else:
                raise AssertionError("the broker registered the topic again in every round")
            after = [await p.send(Message(topic, b"after %d" % i)) for i in range(4)]
            return route, inst.routes.get(topic), after
    with caplog.at_level("WARNING", logger="shmq.client"):
        route, held, after = asyncio.run(main())
    assert held is route
    assert sorted(r.queue.queue_id for r in after) == [0, 0, 1, 1]
    assert f"route of {topic}: the NameServers know no such topic now" in caplog.text
    assert sorted(m.body for m in stored(broker, topic, 2)) == [b"after %d" % i for i in range(4)] + [b"before"]


def test_sends_to_a_queue_while_its_broker_connection_opens_keep_call_order(broker, request):
    """A send issued while the first send's connection to the broker is
    still opening (its heartbeat on the way) is written after it: each
    waits for the connection, in the order they came. So is a send that
    comes in the very loop turn the connection is ready (here issued as
    the heartbeat's answer is taken, as a timer or I/O could wake one),
    while the second still waits for its turn: it found the connection
    published and was stored second."""
    topic = topic_of(request)
    make_topic(broker, topic, 1)

    async def main():
        cfg = ClientConfig(namesrv_addr=broker.namesrv, direct_append=False,
                           instance_name=f"order-open-{time.time_ns()}")
        async with AsyncProducer("pg-order-open", client=cfg) as p:
            inst = p.instance
            [q] = await p.publish_queues(topic)      # the route: no broker connection yet
            assert inst.broker_now(q.broker_name) is None
            entered, gate, sends = asyncio.Event(), asyncio.Event(), []
            heartbeat = inst._heartbeat_to

            async def held(addr, conn, body):        # the real heartbeat, held until the gate
                entered.set()
                await gate.wait()
                await heartbeat(addr, conn, body)
                sends.append(asyncio.ensure_future(p.send(Message(topic, b"third"), q)))
            inst._heartbeat_to = held
            sends.append(asyncio.ensure_future(p.send(Message(topic, b"first"), q)))
            await asyncio.wait_for(entered.wait(), 30)
            sends.append(asyncio.ensure_future(p.send(Message(topic, b"second"), q)))
            for _ in range(20):                       # turns of the loop the second could take
                await asyncio.sleep(0)
            gate.set()
            first, second = await sends[0], await sends[1]
            return first, second, await asyncio.wait_for(sends[2], 30)
    results = asyncio.run(main())
    assert [r.queue_offset for r in results] == [0, 1, 2]
    assert [m.body for m in stored(broker, topic, 1)] == [b"first", b"second", b"third"]


def test_members_made_from_one_client_config_are_one_client_and_keywords_change_a_copy():
    """RocketMQ's rule: one ClientConfig, one client instance (one clientId,
    one set of connections, one heartbeat). A ClientConfig setting given as a
    keyword applies to that member only: the caller's config is not changed."""
    from shmq.client import AsyncProducer, AsyncPushConsumer, ClientConfig
    cfg = ClientConfig(namesrv_addr="127.0.0.1:1")
    p1, p2 = AsyncProducer("share-a", client=cfg), AsyncProducer("share-b", client=cfg)
    c = AsyncPushConsumer("share-g", client=cfg)
    assert p1.client_config is cfg and p2.client_config is cfg and c.client_config is cfg
    off = AsyncProducer("share-c", client=cfg, direct_append=False)
    assert off.client_config.direct_append is False and cfg.direct_append is True
    assert off.client_config.client_id() == cfg.client_id()       # still the same client


def test_a_connection_opening_while_the_client_shuts_down_is_closed_not_leaked(broker,
                                                                               monkeypatch):
    """close() while a connection to a broker is still being opened (its
    connect, the Unix-socket switch and first heartbeat under way): the
    opener gets an error and every connection it opened is closed, not
    published into a client that is gone with its socket left open (and
    heartbeating); a caller that comes after close() opens none."""
    from shmq.client.connection import Connection
    from shmq.client.errors import RemotingError
    from shmq.client.instance import ClientInstance
    opened = []
    real_open = Connection.open.__func__

    async def watched_open(cls, *args, **kw):          # the real open; each one noted
        conn = await real_open(cls, *args, **kw)
        opened.append(conn)
        return conn
    monkeypatch.setattr(Connection, "open", classmethod(watched_open))

    async def main():
        inst = ClientInstance(ClientConfig(namesrv_addr=broker.namesrv, direct_append=False,
                                           instance_name="closing-while-opening"))
        opening = [asyncio.create_task(inst.connection(broker.addr)) for _ in range(2)]
        await asyncio.sleep(0)                      # both in connection(): one opening
        await inst.close()
        got = await asyncio.gather(*opening, return_exceptions=True)
        assert all(isinstance(g, RemotingError) and "shut down" in str(g) for g in got), got
        assert opened and all(c.closed for c in opened), opened      # opened, then closed
        assert not inst.conns and not inst._opening
        before = len(opened)
        with pytest.raises(RemotingError, match="shut down"):
            await inst.connection(broker.addr)
        assert len(opened) == before                # nothing dialled for a closed client

    asyncio.run(main())


def test_batched_sends_waiting_for_their_brokers_connection_time_out_at_their_own_deadline(
        broker, request):
    """With linger_ms, the first sends to a broker wait in their batch while
    its connection opens (one connect, then the client's first requests,
    each up to request_timeout). A caller's send timeout held only once a
    request was written: here a broker that accepts and never answers kept
    every caller waiting for the whole connection attempt (over 20 s with
    this client's settings) past its 0.3 s. Now each gets its timeout at its
    own deadline, while the connection is still opening."""
    import socket
    from shmq.broker.namesrv.bodies import register_broker_request
    from shmq.client.errors import RemotingError
    from shmq.client.remoting import RemotingClient
    topic = topic_of(request)
    with socket.socket() as silent, RemotingClient(broker.namesrv) as ns:   # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        addr = f"127.0.0.1:{silent.getsockname()[1]}"
        # the route names it as the topic's broker (while this connection, its
        # registration's channel, stays open: the NameServer drops it after)
        r = ns.invoke(register_broker_request(
            cluster="SilentCluster", broker_name="broker-silent", broker_addr=addr, broker_id=0,
            topic_configs={topic: {"readQueueNums": 1, "writeQueueNums": 1, "perm": 6}},
            data_version={"timestamp": 1700000000000, "counter": 1}))
        assert r.code == 0, r.remark

        async def main():
            cfg = ClientConfig(namesrv_addr=broker.namesrv, request_timeout=10.0,
                               instance_name="silent-broker")
            p = AsyncProducer("pg-silent", client=cfg, linger_ms=5)
            await p.start()
            sends = [asyncio.create_task(p.send(Message(topic, b"x%d" % i), timeout=0.3))
                     for i in range(3)]
            await asyncio.wait(sends)
            errors = [t.exception() for t in sends]
            assert all(isinstance(e, RemotingError) and "waiting for the connection to "
                       "broker-silent" in str(e) for e in errors), errors
            # ... while the connection was still opening: its batch still waits for it
            assert p.accumulator._unconnected.get("broker-silent"), p.accumulator._unconnected
            silent.close()          # the queued connection is reset: the attempt ends at once
            await p.shutdown()
        asyncio.run(main())
