"""Direct reads (client/direct.py ``DirectReads``, client/pull.py): a consumer
on the broker's host answers its pulls from the store's mapping, and what it
delivers, commits and leaves on the broker is what a socket consumer's is.

Against real broker processes: a push consumer reading directly beside a
socket consumer (``direct_append=False``) of the same topic (same messages,
once each, in order per queue, same fields); tag filtering; what goes to
the broker instead (a read that fails, the scrub's damage list, records
older than the page-cache window, a topic made unreadable); a caught-up
consumer woken by a new message (parked in its own process, not in the
broker), and one that waits past its suspend time; its
committed offsets as the broker reports them (GET_CONSUME_STATS, what
``shmq admin consumerProgress`` shows); a direct consumer SIGKILLed
mid-consumption resumes at its committed offset in a new process; and mixed
traffic (a direct and a socket producer) consumed by the real RocketMQ C++
client and by a direct consumer: every message seen.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import orjson
import pytest
from brokerproc import routed_topic, start_broker, topic_for, until_async
from shmq.client import AsyncProducer, AsyncPushConsumer, ClientConfig, ConsumeConcurrentlyStatus, Message
from shmq.client import MessageQueue, MQClientError
from shmq.client import pull as pull_mod
from shmq.client.consumer import SubscriptionData, pull_kernel
from shmq.client.direct import CAUGHT_UP, warm_up_appends, warm_up_reads
from shmq.client.requests import create_topic
from shmq.ipc.codes import ResponseCode
from shmq.client.remoting import RemotingClient
from shmq.core.files import REAL_FILES
from shmq.core.recovery import DamageLog
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.remoting import RemotingCommand

OK = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
FAST = dict(pull_time_delay_millis_when_exception=300, persist_consumer_offset_interval=1.0)
WAIT = 30.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("direct-read"))
    warm_up_reads()      # else the first pulls go to the broker until the scan kernel is loaded
    warm_up_appends()    # else a producer's first sends go over the socket until appends are
    yield b
    assert b.stop() == 0, b.log()[-3000:]


def reads_of(c) -> object | None:
    """The consumer's direct reads (None: it has no attached store)."""
    ds = [d for d in c.instance.direct.values() if d is not None]
    return ds[0].reads if ds else None


@contextlib.contextmanager
def reads_logged(reads, events: list):
    """Each direct read of ``reads`` noted in ``events`` as it returns: "read
    found", "read caught up" (parks next), or what else it answered."""
    read = reads.pull

    def logged(*a):
        got = read(*a)
        events.append("read caught up" if got is CAUGHT_UP else "read found"
                      if got is not None and got[0] else f"read {got!r}")
        return got
    reads.pull = logged
    try:
        yield
    finally:
        del reads.pull


async def until(pred, timeout=WAIT, what="condition"):
    return await until_async(pred, what, timeout)


def recorder(into: list):
    async def listener(msgs, context):
        into.extend(msgs)
        return OK
    return listener


async def consumer(broker, group, topic, got, expr="*", **kw):
    c = AsyncPushConsumer(group, namesrv_addr=broker.namesrv, **FAST, **kw)
    c.subscribe(topic, expr)
    c.register_message_listener(recorder(got))
    await c.start()
    await until(lambda: any(mq.topic == topic for mq in c.assigned_queues()), what="queues")
    return c


def fields(m) -> tuple:
    props = {k: v for k, v in m.properties.items() if k not in ("MIN_OFFSET", "MAX_OFFSET")}
    return (m.queue_id, m.queue_offset, m.msg_id, m.offset_msg_id, m.body, m.tags, m.keys, props,
            m.sysflag, m.flag, m.born_timestamp, m.store_timestamp, m.born_host, m.store_host,
            m.commit_log_offset, m.body_crc, m.reconsume_times, m.store_size)


def per_queue(msgs) -> dict[int, list]:
    out: dict[int, list] = collections.defaultdict(list)
    for m in msgs:
        out[m.queue_id].append(m)
    return out


def progress(broker, group, topic) -> dict[int, tuple[int, int]]:
    """queue id → (broker offset, consumer offset), as ``shmq admin consumerProgress`` shows them."""
    r = subprocess.run([sys.executable, "-m", "shmq.tools", "admin", "consumerProgress", "-g", group,
                        "-n", broker.namesrv, "--json"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return {}
    return {q["queueId"]: (q["brokerOffset"], q["consumerOffset"])
            for q in json.loads(r.stdout)["queues"] if q["topic"] == topic}


def committed(broker, group, topic, queues) -> dict[int, int]:
    with RemotingClient(broker.addr) as c:
        out = {}
        for q in range(queues):
            r = c.invoke(RemotingCommand(RC.QUERY_CONSUMER_OFFSET, ext={
                "consumerGroup": group, "topic": topic, "queueId": str(q)}))
            out[q] = int(r.ext["offset"]) if r.code == 0 else -1
    return out


def get_total(broker) -> int:
    """The broker's msgGetTotal (GET_BROKER_RUNTIME_INFO)."""
    with RemotingClient(broker.addr) as c:
        r = c.invoke(RemotingCommand(RC.GET_BROKER_RUNTIME_INFO))
    return int(orjson.loads(r.body)["table"]["msgGetTotal"])


def test_a_local_consumer_reads_directly_what_a_socket_consumer_reads(broker, request):
    topic = routed_topic(broker, topic_for(request, "DR_"), queues=2)
    direct, socket = [], []

    got0 = get_total(broker)

    async def main():
        cd = await consumer(broker, "drg-direct", topic, direct, instance_name="dr-direct")
        cs = await consumer(broker, "drg-socket", topic, socket, instance_name="dr-socket",
                            direct_append=False)
        assert reads_of(cd) is not None and reads_of(cs) is None
        async with AsyncProducer("drp-1", namesrv_addr=broker.namesrv) as p:
            for i in range(300):
                await p.send(Message(topic, b"m%d" % i, tags="T%d" % (i % 3), keys=["k%d" % i],
                                     properties={"n": str(i)}))
        await until(lambda: len(direct) >= 300 and len(socket) >= 300, what="300 each")
        assert reads_of(cd).count > 0 and reads_of(cd).messages > 0      # pulls answered here
        # caught up: parked here (on its own wake-up socket), woken by the next message
        t0 = time.monotonic()
        async with AsyncProducer("drp-2", namesrv_addr=broker.namesrv) as p:
            await p.send(Message(topic, b"wake", tags="W"))
        await until(lambda: len(direct) == 301 and len(socket) == 301, timeout=10,
                    what="the wake-up message")
        assert time.monotonic() - t0 < 10       # not the 15 s hold
        assert reads_of(cd).woken > 0
        # the broker holds the direct consumer's offsets, as consumerProgress shows them
        deadline = time.monotonic() + WAIT
        while True:
            shown = await asyncio.to_thread(progress, broker, "drg-direct", topic)
            if len(shown) == 2 and all(b == c for b, c in shown.values()):
                break
            assert time.monotonic() < deadline, f"consumerProgress shows {shown}"
            await asyncio.sleep(0.2)
        assert sum(b for b, _ in shown.values()) == 301
        # the broker's get total counts what was read here too (msgGetTotal:
        # each group's 301, read here or through the broker; the workers
        # publish theirs once a second)
        deadline = time.monotonic() + WAIT
        while (got := await asyncio.to_thread(get_total, broker)) - got0 < 2 * 301:
            assert time.monotonic() < deadline, f"msgGetTotal moved {got - got0}"
            await asyncio.sleep(0.3)
        await cd.shutdown()
        await cs.shutdown()
    asyncio.run(main())
    assert collections.Counter(m.body for m in direct).most_common(1)[0][1] == 1      # once each
    d, s = per_queue(direct), per_queue(socket)
    assert d.keys() == s.keys() == {0, 1}
    for q in d:
        assert [m.queue_offset for m in d[q]] == list(range(len(d[q])))               # in order
        assert [fields(m) for m in d[q]] == [fields(m) for m in s[q]]


def test_a_caught_up_direct_consumer_waits_in_its_own_process(broker, request):
    """Caught up, a direct consumer's pull waits in its process for the next
    append (its own wake-up socket, which every publish writes to while it
    waits), not in the broker: each of 30 messages sent one at a time, each
    consumed before the next is sent, releases a pull waiting here. With
    nothing to read for longer than its suspend time, the wait ends and the
    broker is asked once (no second wait there), then it waits here again:
    a handful of waits, not a loop."""
    topic = routed_topic(broker, topic_for(request, "DR_"), queues=1)
    got = []

    async def main():
        c = await consumer(broker, "drg-park", topic, got, instance_name="dr-park",
                           broker_suspend_max_time_millis=400)
        async with AsyncProducer("drp-park", namesrv_addr=broker.namesrv) as p:
            await p.send(Message(topic, b"first"))          # the broker serves the queue once
            await until(lambda: len(got) == 1, what="the first")
            reads = reads_of(c)
            await until(lambda: reads.parked > 0, what="a pull waiting here")
            woken = reads.woken
            for i in range(30):
                await p.send(Message(topic, b"%d" % i))
                await until(lambda: len(got) == i + 2, what=f"message {i}")
            assert reads.woken - woken >= 30, (reads.woken, woken)
            parked = reads.parked
            await asyncio.sleep(2.0)                         # 5 suspend times with nothing
            assert 2 <= reads.parked - parked <= 12, reads.parked - parked
            await p.send(Message(topic, b"after"))
            await until(lambda: len(got) == 32, what="the message after the quiet")
        await c.shutdown()
    asyncio.run(main())
    assert [m.body for m in got] == [b"first"] + [b"%d" % i for i in range(30)] + [b"after"]


def test_a_commit_held_back_is_dropped_when_the_consumer_lets_the_queue_go(broker, request):
    """A caught-up direct pull's commit inside COMMIT_EVERY_S of the last is
    held back and sent at the window's end. If the consumer lets the queue
    go meanwhile (a rebalance gives it to another consumer, an offset reset
    takes it back), that commit is stale: sent late, it moved the group's
    offset back over the one committed after (the next owner's, the
    reset's), and that queue was consumed again from there."""
    topic = routed_topic(broker, topic_for(request, "DR_"), queues=1)
    got = []
    group = "drg-held-back"

    async def main():
        c = await consumer(broker, group, topic, got, instance_name="dr-held-back")
        async with AsyncProducer("drp-held-back", namesrv_addr=broker.namesrv) as p:
            for i in range(10):
                await p.send(Message(topic, b"%d" % i))
        await until(lambda: len(got) == 10, what="10 messages")
        c.suspend()                                   # no rebalance takes the queue back
        reads = reads_of(c)
        mq = next(q for q in c.assigned_queues() if q.topic == topic)
        key = (group, topic, 0)
        reads._committed[key] = (10, time.monotonic())    # a commit just sent, and
        reads._commit(key, 3, time.monotonic(), waiting=True)     # one held back after it
        assert key in reads._owed
        await c._drop(mq)                             # let go: persists its offset (10)
        with RemotingClient(broker.addr) as admin:    # the queue's next owner commits 12
            admin.invoke(RemotingCommand(RC.UPDATE_CONSUMER_OFFSET, ext={
                "consumerGroup": group, "topic": topic, "queueId": "0", "commitOffset": "12"}))
        await until(lambda: committed(broker, group, topic, 1)[0] == 12, what="offset 12")
        await asyncio.sleep(0.2 + 0.3)                # past the held-back commit's window
        at = committed(broker, group, topic, 1)[0]
        c.resume()
        await c.shutdown()
        return at
    assert asyncio.run(main()) == 12


def test_a_message_read_here_reaches_the_listener_before_the_next_read(broker, request):
    """A pull read in the consumer's process overlaps nothing (no request
    in flight to the broker), so the messages it found go to the listener
    before the queue is read again: caught up, each message sent wakes the
    parked pull, its read finds it, the listener gets it, and only then
    does the next read find the queue caught up and park (before, that read
    and park came first: a third of the produce → consume latency)."""
    topic = routed_topic(broker, topic_for(request, "DR_"), queues=1)
    events: list[str] = []

    async def listener(msgs, context):
        events.extend(f"listener {m.body.decode()}" for m in msgs)
        return OK

    async def main():
        c = AsyncPushConsumer("drg-order", namesrv_addr=broker.namesrv, instance_name="dr-order",
                              **FAST)
        c.subscribe(topic, "*")
        c.register_message_listener(listener)
        await c.start()
        await until(lambda: any(mq.topic == topic for mq in c.assigned_queues()), what="queues")
        async with AsyncProducer("drp-order", namesrv_addr=broker.namesrv) as p:
            await p.send(Message(topic, b"first"))          # the broker serves the queue once
            await until(lambda: "listener first" in events, what="the first")
            reads = reads_of(c)
            await until(lambda: reads.parked > 0, what="a pull waiting here")
            with reads_logged(reads, events):
                for i in range(5):
                    del events[:]
                    await p.send(Message(topic, b"%d" % i))
                    await until(lambda: "read caught up" in events, what=f"message {i}'s park")
                    assert events[:3] == ["read found", f"listener {i}", "read caught up"], events
        await c.shutdown()
    asyncio.run(main())


def test_a_message_read_here_reaches_a_waiting_poll_before_the_next_read(broker, request):
    """The same for the lite pull consumer: a ``poll`` waiting when a read
    here finds a message returns it before the queue is read again."""
    from shmq.client.lite_pull import AsyncLitePullConsumer
    topic = routed_topic(broker, topic_for(request, "DR_"), queues=1)
    events: list[str] = []

    async def main():
        c = AsyncLitePullConsumer("drg-lite-order", namesrv_addr=broker.namesrv,
                                  instance_name="dr-lite-order", **FAST)
        await c.start()
        c.assign([MessageQueue(topic, "broker-a", 0)])
        async with AsyncProducer("drp-lite-order", namesrv_addr=broker.namesrv) as p:
            await p.send(Message(topic, b"first"))          # the broker serves the queue once
            deadline = time.monotonic() + WAIT
            while not await c.poll(0.5):
                assert time.monotonic() < deadline, "the first message never came"
            reads = reads_of(c)
            await until(lambda: reads.parked > 0, what="a pull waiting here")
            with reads_logged(reads, events):
                async def polling():
                    msgs = await c.poll(WAIT)
                    events.extend(f"poll {m.body.decode()}" for m in msgs)   # as it returns

                for i in range(5):
                    polled = asyncio.ensure_future(polling())
                    await asyncio.sleep(0.05)                # the poll waits
                    del events[:]
                    await p.send(Message(topic, b"%d" % i))
                    await polled
                    await until(lambda: "read caught up" in events, what=f"message {i}'s park")
                    assert events[:3] == ["read found", f"poll {i}", "read caught up"], events
        await c.shutdown()
    asyncio.run(main())


def test_tag_filtering_reads_only_the_subscribed_tags(broker, request):
    topic = routed_topic(broker, topic_for(request, "DR_"), queues=1)
    got = []

    async def main():
        c = await consumer(broker, "drg-tags", topic, got, expr="A || C", instance_name="dr-tags")
        async with AsyncProducer("drp-tags", namesrv_addr=broker.namesrv) as p:
            await p.send(Message(topic, b"first", tags="A"))       # the broker serves the queue once
            await until(lambda: len(got) == 1, what="the first")
            for i in range(200):
                await p.send(Message(topic, b"%d" % i, tags="ABCD"[i % 4]))
        await until(lambda: len(got) == 101, what="the A and C messages")
        await asyncio.sleep(0.3)
        reads = reads_of(c)
        await c.shutdown()
        return reads
    reads = asyncio.run(main())
    assert reads.count > 0
    assert [m.body for m in got[1:]] == [b"%d" % i for i in range(200) if i % 4 in (0, 2)]
    assert {m.tags for m in got} == {"A", "C"}


def test_a_failed_read_and_a_damage_list_send_the_pull_to_the_broker(broker, request):
    topic = routed_topic(broker, topic_for(request, "DR_"), queues=1)
    got = []

    async def main():
        c = await consumer(broker, "drg-fail", topic, got, instance_name="dr-fail")
        reads = reads_of(c)
        async with AsyncProducer("drp-fail", namesrv_addr=broker.namesrv) as p:
            await p.send(Message(topic, b"first"))
            await until(lambda: len(got) == 1, what="the first")
            store, calls = reads.ds.store, []

            def failing(*a, **kw):                 # the read raises as a vanished file would
                calls.append(a)
                raise OSError(5, "Input/output error")
            store.get_message = failing
            try:
                before = reads.count
                for i in range(100):
                    await p.send(Message(topic, b"%d" % i))
                await until(lambda: len(got) == 101, what="the 100 over the socket")
                assert calls and reads.count == before
            finally:
                del store.get_message
            # the scrub lists a damaged range: every pull goes to the broker, which checks
            log = DamageLog(REAL_FILES, broker.conf["storePathRootDir"])
            log.add(1 << 50, (1 << 50) + 100, "test: a range no record is in")
            try:
                reads._damage_due = 0.0            # look now, not within the second
                before = reads.count
                for i in range(50):
                    await p.send(Message(topic, b"x%d" % i))
                await until(lambda: len(got) == 151, what="the 50 over the socket")
                assert reads.count == before
            finally:
                log.clear()
            reads._damage_due = 0.0
            for i in range(50):
                await p.send(Message(topic, b"y%d" % i))
            await until(lambda: len(got) == 201, what="the last 50")
            assert reads.count > before                  # direct again
        await c.shutdown()
    asyncio.run(main())
    assert [m.queue_offset for m in got] == list(range(201))


def test_a_topic_made_unreadable_is_refused_by_the_broker_not_read_directly(broker, request):
    topic = routed_topic(broker, topic_for(request, "DR_"), queues=1)
    got = []

    async def main():
        c = await consumer(broker, "drg-perm", topic, got, instance_name="dr-perm")
        reads = reads_of(c)
        async with AsyncProducer("drp-perm", namesrv_addr=broker.namesrv) as p:
            for i in range(40):
                await p.send(Message(topic, b"%d" % i))
            await until(lambda: len(got) == 40 and reads.count > 0, what="40, some read directly")
            with RemotingClient(broker.addr) as admin:       # write only: no more pulls
                assert admin.invoke(create_topic(topic, 1, perm=2)).code == 0
            await p.send(Message(topic, b"unreadable"))
        sub = SubscriptionData.build(topic, "*")
        mq = MessageQueue(topic, reads.ds.broker_name, 0)
        # the tables moved: not read here, but asked of the broker, which refuses
        assert reads.pull("drg-perm", topic, 0, 40, 32, pull_mod._tag_codes(sub), None) is None
        with pytest.raises(MQClientError) as refused:
            await pull_kernel(c.instance, "drg-perm", mq, sub, 40, 32, 0, 0, 0, 5.0)
        assert refused.value.code == ResponseCode.NO_PERMISSION
        assert reads.pull("drg-perm", topic, 0, 40, 32, pull_mod._tag_codes(sub), None) is None
        await c.shutdown()
    asyncio.run(main())
    assert b"unreadable" not in {m.body for m in got}


def test_records_older_than_the_page_cache_window_go_through_the_broker(tmp_path_factory, request):
    b = start_broker(tmp_path_factory.mktemp("direct-read-cold"), accessMessageInMemoryMaxRatio="0")
    try:
        topic = routed_topic(b, topic_for(request, "DR_"), queues=1)
        got = []

        async def main():
            c = await consumer(b, "drg-cold", topic, got, instance_name="dr-cold")
            async with AsyncProducer("drp-cold", namesrv_addr=b.namesrv) as p:
                for i in range(100):
                    await p.send(Message(topic, b"%d" % i))
            await until(lambda: len(got) == 100, what="100 over the socket")
            reads = reads_of(c)
            await c.shutdown()
            return reads
        reads = asyncio.run(main())
        assert reads is not None and reads.count == 0          # every record counts as cold
        assert [m.body for m in got] == [b"%d" % i for i in range(100)]
    finally:
        assert b.stop() == 0, b.log()[-3000:]


CHILD = textwrap.dedent("""
    import asyncio, json, sys, time
    from shmq.client import AsyncPushConsumer, ConsumeConcurrentlyStatus
    from shmq.client.direct import warm_up_appends, warm_up_reads

    async def main(namesrv, group, topic):
        c = AsyncPushConsumer(group, namesrv_addr=namesrv, persist_consumer_offset_interval=0.5,
                              consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        c.subscribe(topic, "*")

        async def listener(msgs, context):
            ds = [d for d in c.instance.direct.values() if d is not None]
            for m in msgs:
                print(json.dumps({"q": m.queue_id, "o": m.queue_offset, "b": m.body.decode(),
                                  "direct": ds[0].reads.count if ds else -1}), flush=True)
            await asyncio.sleep(0.002)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        c.register_message_listener(listener)
        warm_up_appends()              # the store attached at the first connection
        warm_up_reads()                # and read from the first pull (it is killed early)
        await c.start()
        print(json.dumps({"started": True}), flush=True)
        await asyncio.sleep(120)
    asyncio.run(main(*sys.argv[1:4]))
""")


def test_a_killed_direct_consumer_resumes_at_its_committed_offset(broker, request, tmp_path):
    topic = routed_topic(broker, topic_for(request, "DR_"), queues=2)
    group, n = "drg-kill", 2000
    script = tmp_path / "child.py"
    script.write_text(CHILD)

    async def produce():
        async with AsyncProducer("drp-kill", namesrv_addr=broker.namesrv) as p:
            for i in range(n):
                await p.send(Message(topic, b"%d" % i))

    def run_child(stop_after: int | None) -> list[dict]:
        """The child's deliveries until it has delivered ``stop_after`` and the
        broker holds an offset it committed (then SIGKILL, mid-consumption),
        or, None, until every message was seen."""
        proc = subprocess.Popen([sys.executable, str(script), broker.namesrv, group, topic],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        lines: list[dict] = []
        looked = 0.0
        try:
            for line in proc.stdout:
                ev = json.loads(line)
                if "b" not in ev:
                    continue
                lines.append(ev)
                if stop_after is not None and len(lines) >= n:
                    break                                  # all of them before a commit showed
                if stop_after is not None and len(lines) >= stop_after \
                        and time.monotonic() - looked > 0.1:
                    looked = time.monotonic()             # commits go out a few times a second
                    if sum(committed(broker, group, topic, 2).values()) > 0:
                        os.kill(proc.pid, signal.SIGKILL)
                        break
                if stop_after is None and len({e["b"] for e in lines} | seen) >= n:
                    break
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        return lines

    asyncio.run(produce())
    seen: set[str] = set()
    first = run_child(stop_after=n // 4)
    assert len(first) >= n // 4
    assert max(e["direct"] for e in first) > 0                  # it read directly
    after_kill = committed(broker, group, topic, 2)
    assert sum(after_kill.values()) > 0                         # it committed while reading directly
    seen = {e["b"] for e in first}
    second = run_child(stop_after=None) if len(seen) < n else []
    got = seen | {e["b"] for e in second}
    assert got == {str(i) for i in range(n)}                    # none lost
    for q in range(2):
        offs = [e["o"] for e in second if e["q"] == q]
        if after_kill[q] >= 0 and offs:
            assert min(offs) == after_kill[q]                   # resumes at its committed offset


try:
    from test_compat_clients import ClientProc, _cpp_missing
    _why = _cpp_missing()
    needs_cpp = pytest.mark.skipif(_why is not None, reason=_why or "")
except ImportError as e:      # the compat tests' helpers moved
    needs_cpp = pytest.mark.skipif(True, reason=f"tests/test_compat_clients.py: {e}")


@needs_cpp
def test_mixed_producers_are_consumed_by_the_cpp_client_and_a_direct_consumer(broker, request,
                                                                              tmp_path):
    topic = routed_topic(broker, topic_for(request, "DR_"), queues=4)
    cpp = ClientProc("cpp", "consume", broker, tmp_path, topic, "drg-cpp", "--max-seconds", "150")
    got = []
    try:
        cpp.started()

        async def main():
            c = await consumer(broker, "drg-mixed", topic, got, instance_name="dr-mixed")
            async with AsyncProducer("drp-direct", namesrv_addr=broker.namesrv) as pd, \
                    AsyncProducer("drp-socket", namesrv_addr=broker.namesrv, client=ClientConfig(
                        instance_name="drp-s", direct_append=False)) as ps:
                for i in range(200):
                    await pd.send(Message(topic, b"d%d" % i, tags="D"))
                    await ps.send(Message(topic, b"s%d" % i, tags="S"))
                assert [d for d in pd.instance.direct.values() if d is not None][0].appended == 200
                assert not [d for d in ps.instance.direct.values() if d is not None]
            await until(lambda: len(got) >= 400, what="the direct consumer's 400")
            reads = reads_of(c)
            await c.shutdown()
            return reads
        reads = asyncio.run(main())
        want = {f"d{i}" for i in range(200)} | {f"s{i}" for i in range(200)}
        assert reads.count > 0 and {m.body.decode() for m in got} == want
        ok = cpp.wait(lambda: {e["body"] for e in cpp.of("recv")} >= want, WAIT)
        assert ok, f"the C++ consumer saw {len(cpp.of('recv'))} of 400: {cpp.diag()}"
    finally:
        cpp.stop()
