"""``put`` and ``flush`` (client/producer.py, client/blocking.py): one message
a call gathered into ~1 MiB claims (Kafka's batch.size / linger.ms), with
``flush()`` as the acknowledgement.

Against one SYNC_FLUSH broker: every message put is stored exactly once and
in call order within each queue, read back over the protocol — appended
directly and over the Unix socket (``direct_append=False``), from a
coroutine and from the blocking facade's threads; each message's tags and
keys are stored (a tag-filtered pull and QUERY_MESSAGE by key find them);
``flush`` returns once the records are durable, ``shutdown`` flushes; a chunk the store refuses
makes the next put and ``flush`` raise, with the counts, and the producer
goes on; a tight loop of puts that never yields to the event loop still
stores as it goes (direct appends need no loop turn), and over the socket
is refused, nothing taken, once ``put_buffer_bytes`` wait for the loop.
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from brokerproc import routed_topic, start_broker, stored_records, topic_for
from shmq.client import AsyncProducer, ClientConfig, FlushResult, MQClientError, Producer, PutFailed
from shmq.client.direct import warm_up_appends
from shmq.client.remoting import RemotingClient
from shmq.client.requests import decode_records, pull_message
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("put"), flushDiskType="SYNC_FLUSH")
    warm_up_appends()    # else a producer's first puts go over the socket until appends are
    yield b
    assert b.stop() == 0, b.log()[-3000:]


def direct_of(p):
    inst = p.instance if isinstance(p, AsyncProducer) else p._p.instance
    return next((d for d in inst.direct.values() if d is not None), None)


def tagged(i: int) -> dict:
    """Every 7th message carries tags and keys, the others none."""
    return {"tags": "Seven", "keys": [f"k{i}", "sevens"]} if i % 7 == 0 else {}


def assert_stored_in_order(stored: list, sent: list[bytes]) -> None:
    """Each message once; within each queue, in call order."""
    assert sorted(m.body for m in stored) == sorted(sent)
    index = {b: i for i, b in enumerate(sent)}
    for q in {m.queue_id for m in stored}:
        seq = [index[m.body] for m in stored if m.queue_id == q]
        assert seq == sorted(seq), f"queue {q} out of call order"


@pytest.mark.parametrize("direct", [True, False])
def test_every_put_is_stored_once_in_order_per_queue_and_durable_at_flush(broker, request, direct):
    topic = routed_topic(broker, topic_for(request, "P_"), queues=3)
    sent = [b"put-%d-" % i + b"x" * (i % 50) for i in range(3000)]

    async def main():
        cfg = ClientConfig(namesrv_addr=broker.namesrv, direct_append=direct,
                           instance_name=f"put-{direct}")
        async with AsyncProducer("put-order", client=cfg, put_batch_bytes=16 << 10) as p:
            for i, body in enumerate(sent):
                p.put(topic, body, **tagged(i))
                if i % 500 == 0:
                    await asyncio.sleep(0)             # lingering and chunks interleave
            r = await p.flush()
            ds = direct_of(p)
            return r, ds and ds.appended, ds and ds.state.flushed_pos

    r, appended, flushed = asyncio.run(main())
    assert r == FlushResult(put=3000, stored=3000)
    stored = stored_records(broker, topic, 3)
    assert_stored_in_order(stored, sent)
    assert len({m.queue_id for m in stored}) == 3           # chunks went round robin
    for m in stored:
        i = int(m.body.split(b"-")[1])
        assert (m.tags, m.keys) == (("Seven", [f"k{i}", "sevens"]) if i % 7 == 0 else (None, []))
    if direct:
        assert appended == 3000                             # none went over the socket
        assert flushed >= max(m.phy_offset + m.total_size for m in stored)   # durable


def test_the_blocking_producer_puts_from_threads(broker, request):
    topic = routed_topic(broker, topic_for(request, "P_"), queues=2)
    per_thread = {t: [b"t%d-%d" % (t, i) for i in range(2000)] for t in range(3)}
    with Producer("put-threads", namesrv_addr=broker.namesrv, put_batch_bytes=8 << 10) as p:
        threads = [threading.Thread(target=lambda t=t: [p.put(topic, b, **tagged(i))
                                                         for i, b in enumerate(per_thread[t])])
                   for t in per_thread]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        r = p.flush()
        assert direct_of(p).appended == 6000
    assert r == FlushResult(put=6000, stored=6000)
    stored = stored_records(broker, topic, 2)
    for t, sent in per_thread.items():
        assert_stored_in_order([m for m in stored if m.body.startswith(b"t%d-" % t)], sent)


def test_a_put_lingers_at_most_put_linger_ms(broker, request):
    """A lone put is stored without a flush, after the linger."""
    topic = routed_topic(broker, topic_for(request, "P_"), queues=1)
    with Producer("put-linger", namesrv_addr=broker.namesrv, put_linger_ms=5) as p:
        p.put(topic, b"alone")
        deadline = time.monotonic() + 10
        while p._p.stored < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p._p.stored == 1
    assert [m.body for m in stored_records(broker, topic, 1)] == [b"alone"]


@pytest.mark.parametrize("direct", [True, False])
def test_shutdown_stores_what_put_holds(broker, request, direct):
    """Over the socket too: the chunks shutdown's flush sends are not new
    sends refused because the producer is closing."""
    topic = routed_topic(broker, topic_for(request, "P_"), queues=1)
    cfg = ClientConfig(namesrv_addr=broker.namesrv, direct_append=direct)
    with Producer("put-close", client=cfg, put_linger_ms=60_000) as p:
        for i in range(5):
            p.put(topic, b"c%d" % i)
        assert p._p.stored == 0                         # still lingering
    assert (p._p.puts, p._p.stored) == (5, 5)
    assert [m.body for m in stored_records(broker, topic, 1)] == [b"c%d" % i for i in range(5)]


def test_tag_filters_and_queries_by_key_find_what_was_put(broker, request):
    topic = routed_topic(broker, topic_for(request, "P_"), queues=1)
    with Producer("put-tags", namesrv_addr=broker.namesrv) as p:
        for i in range(70):
            p.put(topic, b"m%d" % i, **tagged(i))
        p.flush()
    with RemotingClient(broker.addr) as c:
        r = c.invoke(pull_message(topic, 0, 0, max_msgs=100, subscription="Seven"))
        assert r.code == R.SUCCESS
        assert [m.body for m in decode_records(r.body)] == [b"m%d" % i for i in range(0, 70, 7)]
        deadline = time.monotonic() + 10                # indexed by the services process
        while True:
            q = c.invoke(RemotingCommand(RC.QUERY_MESSAGE, ext={
                "topic": topic, "key": "k42", "maxNum": "32", "beginTimestamp": "0",
                "endTimestamp": str(int(time.time() * 1000) + 60_000)}))
            if q.code == R.SUCCESS or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert q.code == R.SUCCESS, q.remark
        assert [m.body for m in decode_records(q.body)] == [b"m42"]


def test_a_refused_chunk_is_raised_by_the_next_put_and_by_flush(broker, request):
    """The store refuses a body over the broker's maxMessageSize (4 MiB);
    this producer lets it through (max_message_size 8 MiB)."""
    topic = routed_topic(broker, topic_for(request, "P_"), queues=1)

    async def main():
        async with AsyncProducer("put-fail", namesrv_addr=broker.namesrv,
                                 max_message_size=8 << 20) as p:
            p.put(topic, b"before")
            await p.flush()
            p.put(topic, b"y" * ((4 << 20) + 1))
            with pytest.raises(MQClientError, match="1..8388608"):
                p.put(topic, b"")                      # refused at once, nothing taken
            with pytest.raises(MQClientError, match="bytes"):
                p.put(topic, bytearray(b"mutable"))
            deadline = time.monotonic() + 10           # the linger hands the big one on
            while p._put_error is None and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            with pytest.raises(PutFailed) as put_raised:
                p.put(topic, b"lost?")
            with pytest.raises(PutFailed) as flush_raised:
                await p.flush()
            p.put(topic, b"after")                     # reported: the producer goes on
            return put_raised.value, flush_raised.value, await p.flush()

    put_raised, flush_raised, after = asyncio.run(main())
    assert put_raised.code == R.MESSAGE_ILLEGAL and "maxMessageSize" in str(put_raised)
    assert (flush_raised.put, flush_raised.stored) == (2, 1)
    assert after == FlushResult(put=3, stored=2)
    assert [m.body for m in stored_records(broker, topic, 1)] == [b"before", b"after"]


def test_a_tight_loop_of_puts_stores_without_the_event_loop(broker, request):
    topic = routed_topic(broker, topic_for(request, "P_"), queues=2)

    async def main():
        async with AsyncProducer("put-tight", namesrv_addr=broker.namesrv,
                                 put_batch_bytes=64 << 10) as p:    # ~700 of these a chunk
            p.put(topic, b"warm")
            await p.flush()                           # the route and the store attached
            ds = direct_of(p)
            for i in range(20_000):                   # never yields to the loop
                p.put(topic, b"%d" % i)
            appended_before_flush = ds.appended
            r = await p.flush()
            return appended_before_flush, r, ds.appended

    before, r, appended = asyncio.run(main())
    assert before >= 19_000 and r == FlushResult(put=20_001, stored=20_001)
    assert appended == 20_001
    stored = stored_records(broker, topic, 2)
    assert_stored_in_order(stored, [b"warm"] + [b"%d" % i for i in range(20_000)])


def test_over_the_socket_a_loop_that_never_yields_is_refused_at_put_buffer_bytes(broker, request):
    topic = routed_topic(broker, topic_for(request, "P_"), queues=1)

    async def main():
        cfg = ClientConfig(namesrv_addr=broker.namesrv, direct_append=False,
                           instance_name="put-busy")
        async with AsyncProducer("put-busy", client=cfg, put_batch_bytes=4 << 10,
                                 put_buffer_bytes=32 << 10) as p:
            taken = []
            for i in range(10_000):                   # bounded; refused long before
                try:
                    p.put(topic, b"b%d" % i)
                except MQClientError as e:
                    assert e.code == R.SYSTEM_BUSY and "put_buffer_bytes" in str(e)
                    break
                taken.append(b"b%d" % i)
            r = await p.flush()                       # the loop's turn: the chunks leave
            p.put(topic, b"then")
            return taken, r, await p.flush()

    taken, r, after = asyncio.run(main())
    assert 0 < len(taken) < 10_000 and r == FlushResult(put=len(taken), stored=len(taken))
    assert after.stored == len(taken) + 1
    assert [m.body for m in stored_records(broker, topic, 1)] == taken + [b"then"]
