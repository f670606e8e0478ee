"""A push consumer's batch listener (client/batch.py ``MessageBatch``): each
pull's messages as columns over their records.

What the listener sees is what the broker stored, read directly from the
store or over the socket, for plain, compressed, tagged, batched and IPv4
messages; every message once, in queue order; direct reads honour
``pull_batch_size`` past the broker's count cap while socket pulls keep
it; ``ack_index`` and RECONSUME_LATER send back exactly the messages not
acknowledged, which come back from the retry topic with their own topic
and count; a send-back the broker refuses keeps the rest held (the commit
offset waits for it) and consumes it again; broadcasting consumers each
get every message, drop what fails and keep their offsets in their files;
the blocking consumer takes a plain function. The process queue's arithmetic and the records' walk are
unit-tested here; the walk's kernel against its Python twin is in
test_kernels.py.
"""
from __future__ import annotations

import asyncio
import os
import time
import zlib

import numpy as np
import pytest
from brokerproc import routed_topic, start_broker, stored_records, topic_for, until_async
from shmq.client import (AsyncProducer, AsyncPushConsumer, ClientConfig,
                         ConsumeConcurrentlyStatus, Message, MessageQueue, PushConsumer)
from shmq.client.batch import MessageBatch, build_batch
from shmq.client.walk import warm_up_decoding
from shmq.client.consumer import ProcessQueue
from shmq.client.direct import warm_up_reads
from shmq.client.message import CorruptMessage, decode_messages

OK = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
LATER = ConsumeConcurrentlyStatus.RECONSUME_LATER
FAST = dict(pull_time_delay_millis_when_exception=300, persist_consumer_offset_interval=1.0)
WAIT = 30.0


def _records(n: int, first_offset: int = 0, body=lambda i: b"m%03d" % i, sysflag: int = 0) -> bytes:
    import naive
    return b"".join(naive.encode_record("T", body(i), b"UNIQ_KEY\x01id%d" % i, queue_id=1,
                                        sysflag=sysflag, born_timestamp=1000 + i,
                                        store_timestamp=2000 + i, reconsume_times=i % 3,
                                        queue_offset=first_offset + i, phy_offset=100 * i)
                    for i in range(n))


MQ = MessageQueue("T", "b", 1)


# ---------------------------------------------------------------- units
def test_a_batch_reads_every_field_a_message_view_reads():
    """Columns and per-message views of the same records: what
    ``decode_messages`` gives, whether the kernel or the Python walk built
    them; a compressed body comes out inflated."""
    data = _records(5) + _records(1, 5, body=lambda i: zlib.compress(b"z" * 300), sysflag=1)
    warm_up_decoding()
    batch = build_batch(data, MQ, ("0", "9"))
    from shmq.client import walk
    here, stop = walk._rows_here(data, True)
    assert (batch.rows == here).all() and stop == len(data)
    msgs = decode_messages(data, "b", ("0", "9"))
    assert len(batch) == 6 and batch.queue_offsets.tolist() == [m.queue_offset for m in msgs]
    assert batch.bodies() == [m.body for m in msgs] and batch.body(5) == b"z" * 300
    assert batch.store_timestamps.tolist() == [m.store_timestamp for m in msgs]
    assert batch.born_timestamps.tolist() == [m.born_timestamp for m in msgs]
    assert batch.commit_log_offsets.tolist() == [m.commit_log_offset for m in msgs]
    assert batch.reconsume_times.tolist() == [m.reconsume_times for m in msgs]
    assert [(m.msg_id, m.body, m.queue_id, m.properties["MAX_OFFSET"]) for m in batch.messages()] \
        == [(m.msg_id, m.body, m.queue_id, "9") for m in msgs]
    raw = np.frombuffer(batch.data, np.uint8)
    first = [raw[o:o + n].tobytes() for o, n in zip(batch.body_offsets, batch.body_lengths)]
    assert first[:5] == [b"m%03d" % i for i in range(5)]
    part = batch.take([1, 3])
    assert part.queue_offsets.tolist() == [1, 3] and part.bodies() == [b"m001", b"m003"]
    assert "2 messages, queue offsets 1..3" in repr(part)


def test_decode_messages_from_the_walks_rows_is_its_loop(monkeypatch):
    """Once the walk's kernel is loaded, ``decode_messages`` makes the
    ``MessageExt``s of a body past LOOP_BYTES_MAX (here: any) from the
    rows: the same messages (IPv4 and IPv6 hosts, compressed and not zlib
    bodies, damage left out) as its Python loop."""
    import naive
    from shmq.client import message
    from shmq.client.message import _decode_loop
    monkeypatch.setattr(message, "LOOP_BYTES_MAX", 0)
    recs = [naive.encode_record("Tópic", body, b"UNIQ_KEY\x01u%d\x02TAGS\x01t" % i,
                                queue_id=i, sysflag=flag, born_host=born, store_host=store,
                                reconsume_times=i, queue_offset=10 + i, phy_offset=64 * i)
            for i, (body, flag, born, store) in enumerate([
                (b"plain", 0, ("10.1.2.3", 5), ("127.0.0.1", 10911)),
                (zlib.compress(b"z" * 900), 0x1 | 0x10, ("::1", 7), ("127.0.0.1", 1)),
                (b"not zlib", 0x1 | 0x20, ("10.0.0.9", 1), ("fe80::2", 2)),
                (b"v6 both", 0x30, ("::ffff:1.2.3.4", 2), ("2001:db8::1", 3))])]
    flipped = bytearray(recs[0])
    flipped[recs[0].index(b"plain")] ^= 1
    warm_up_decoding()
    for body in (b"".join(recs), bytes(flipped) + b"".join(recs[1:]), b"".join(recs) + b"\x00" * 9):
        got, want = [], []
        rows = decode_messages(body, "b", ("1", "2"), skipped=got)
        loop = _decode_loop(body, "b", ("1", "2"), True, want)
        assert got == want
        assert [(m.queue_offset, m.msg_id, m.body, m.topic, m.born_host, m.store_host,
                 m.reconsume_times, m.properties) for m in rows] == \
            [(m.queue_offset, m.msg_id, m.body, m.topic, m.born_host, m.store_host,
              m.reconsume_times, m.properties) for m in loop]


def test_a_damaged_record_is_left_out_and_described():
    data = bytearray(_records(4))
    size = len(data) // 4
    data[size + 90] ^= 1                                   # the second record's body
    skipped = []
    batch = build_batch(bytes(data), MQ, skipped=skipped)
    assert batch.queue_offsets.tolist() == [0, 2, 3]
    assert [(q, framed) for q, _, framed in skipped] == [(1, True)] and "CRC" in skipped[0][1]
    with pytest.raises(CorruptMessage, match="CRC"):
        build_batch(bytes(data), MQ)
    skipped = []
    cut = build_batch(_records(4)[:-10], MQ, skipped=skipped)
    assert len(cut) == 3 and [(q, framed) for q, _, framed in skipped] == [(3, False)]
    skipped = []
    assert len(build_batch(_records(2) + b"\x00" * 20, MQ, skipped=skipped)) == 2
    assert skipped[0][0] is None and "too few" in skipped[0][1]


def test_the_process_queue_holds_batches_and_commits_the_smallest_unconsumed_offset():
    pq = ProcessQueue()
    a = build_batch(_records(4, 10), MQ)
    b = build_batch(_records(4, 14), MQ)
    assert pq.put_batch(a) and pq.put_batch(b) and not pq.put_batch(a)
    assert pq.msg_count == 8 and pq.max_span() == 7 and pq.msg_size == 32
    assert pq.remove_batch(b) == 10                        # 10..13 are not done yet
    rest = a.take([2, 3])                                  # two to consume again
    assert pq.remove_batch(a, keep=rest) == 12 and pq.msg_count == 2
    assert pq.remove_batch(rest) == 18 and pq.msg_count == 0 and pq.msg_size == 0
    assert pq.remove_batch(rest) == -1                     # not held (the queue was cleared)
    late = build_batch(_records(2, 30), MQ)
    pq.put_batch(late)
    pq.put_batch(build_batch(_records(2, 20), MQ))        # an earlier one arriving later
    assert list(pq.batches) == [20, 30] and pq.has_temp_message()
    pq.clear()
    assert pq.msg_count == 0 and not pq.has_temp_message()


# ---------------------------------------------------------------- against a broker
@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("batch-listener"),
                     messageDelayLevel=" ".join(["1s"] * 18))
    warm_up_reads()
    warm_up_decoding()
    yield b
    assert b.stop() == 0, b.log()[-3000:]


async def until(pred, timeout=WAIT, what="condition"):
    return await until_async(pred, what, timeout)


def consumer(broker, group: str, direct: bool, **kw) -> AsyncPushConsumer:
    cfg = ClientConfig(namesrv_addr=broker.namesrv, direct_append=direct, instance_name=group)
    return AsyncPushConsumer(group, client=cfg, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                             **FAST, **kw)


def reads_of(c):
    ds = [d for d in c.instance.direct.values() if d is not None]
    return ds[0].reads if ds else None


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "socket"])
def test_a_batch_listener_gets_every_message_as_stored(broker, request, direct):
    topic = routed_topic(broker, topic_for(request, "BL_"), 2)
    big = bytes(range(256)) * 40                       # compressed on the way in

    async def main():
        got: list[MessageBatch] = []

        async def on_batch(batch, context):
            got.append(batch)
            return OK
        c = consumer(broker, f"cg-batch-{direct}", direct)
        c.subscribe(topic)
        c.register_batch_listener(on_batch)
        async with c:
            if direct:                  # the broker answers each queue's first pull
                await until(lambda: sum(k[1] == topic for k in reads_of(c)._answered) == 2,
                            what="both queues read here")
            async with AsyncProducer("pg-batch", namesrv_addr=broker.namesrv) as p:
                await p.send(Message(topic, b"one", tags="A", keys=["k1", "k2"], flag=3))
                await p.send(Message(topic, big, tags="B"))
                await p.send_batch([Message(topic, b"b%d" % i, keys="bk") for i in range(40)])
            await until(lambda: sum(len(b) for b in got) >= 42, what="42 messages")
            here = reads_of(c).messages if direct else 0
        return got, here
    got, here = asyncio.run(main())
    assert here == (42 if direct else 0)
    held = {(m.queue_id, m.queue_offset): m for m in stored_records(broker, topic, 2)}
    seen = [(b.queue.queue_id, int(o)) for b in got for o in b.queue_offsets]
    assert sorted(seen) == sorted(held) and len(seen) == len(held) == 42
    for q in range(2):                                     # in queue order
        offs = [o for qid, o in seen if qid == q]
        assert offs == sorted(offs)
    for b in got:
        assert b.queue.topic == topic and len(b) <= 32
        for i, (body, m) in enumerate(zip(b.bodies(), b.messages())):
            want = held[(b.queue.queue_id, int(b.queue_offsets[i]))]
            assert body == (big if want.sysflag & 1 else want.body) == m.body
            assert (m.msg_id, m.tags, m.keys, m.flag, m.topic) == (
                want.properties["UNIQ_KEY"], want.properties.get("TAGS"),
                want.properties.get("KEYS"), want.flag, topic)
            assert (int(b.store_timestamps[i]), int(b.commit_log_offsets[i])) == (
                want.store_timestamp, want.phy_offset)


def test_direct_reads_take_pull_batch_size_past_the_brokers_count_cap(broker, request):
    """pull_batch_size 256: a direct reader's batches reach it (the bytes cap
    aside), a socket consumer's stop at the broker's 32 (its
    maxTransferCountOnMessageInMemory); both see every message once."""
    topic = routed_topic(broker, topic_for(request, "BL_"), 1)

    async def main():
        async with AsyncProducer("pg-batch-cap", namesrv_addr=broker.namesrv) as p:
            for _ in range(3):
                await p.send_batch([Message(topic, b"x" * 50) for _ in range(200)])
        sizes = {}
        for direct in (True, False):
            got: list[MessageBatch] = []

            async def on_batch(batch, context):
                got.append(batch)
                return OK
            c = consumer(broker, f"cg-cap-{direct}", direct, pull_batch_size=256)
            c.subscribe(topic)
            c.register_batch_listener(on_batch)
            async with c:
                await until(lambda: sum(len(b) for b in got) >= 600, what="600 messages")
            offs = np.concatenate([b.queue_offsets for b in got])
            assert (np.sort(offs) == np.arange(600)).all()
            sizes[direct] = max(len(b) for b in got)
        return sizes
    sizes = asyncio.run(main())
    assert sizes[True] > 32 and sizes[False] == 32


def test_unacknowledged_messages_of_a_batch_come_back_from_the_retry_topic(broker, request):
    """ack_index 1 on the first delivery of 4 messages, RECONSUME_LATER on a
    batch that holds a first redelivery: the two after the acknowledged ones
    come back, then again, each time with their own topic and count. (The
    two may come back in one batch or in two, as the schedule moves them.)"""
    topic = routed_topic(broker, topic_for(request, "BL_"), 1)
    seen = []
    want = {(b"r2", 1), (b"r2", 2), (b"r3", 1), (b"r3", 2)}

    async def on_batch(batch, context):
        msgs = batch.messages()
        seen.append([(m.body, m.reconsume_times, m.topic) for m in msgs])
        if len(seen) == 1:
            context.ack_index = 1
            return OK
        return OK if all(m.reconsume_times >= 2 for m in msgs) else LATER

    def again() -> set:
        return {(b, t) for batch in seen[1:] for b, t, _ in batch}

    async def main():
        async with AsyncProducer("pg-batch-retry", namesrv_addr=broker.namesrv) as p:
            await p.send_batch([Message(topic, b"r%d" % i) for i in range(4)])
        c = consumer(broker, "cg-batch-retry", True, max_reconsume_times=5)
        c.subscribe(topic)
        c.register_batch_listener(on_batch)
        async with c:
            await until(lambda: again() >= want, what="two redeliveries of each")
    asyncio.run(main())
    assert seen[0] == [(b"r%d" % i, 0, topic) for i in range(4)]
    assert want <= again() and {b for b, _ in again()} == {b"r2", b"r3"}
    assert all(t == topic for batch in seen for _, _, t in batch)


def test_a_refused_send_back_keeps_the_rest_held_and_consumes_it_again(broker, request,
                                                                       monkeypatch):
    """The broker and the retry topic both refuse: the unacknowledged
    messages stay held (the committed offset stops before them) and come
    back to the listener, counted, without a round trip through the broker."""
    import shmq.client.consume_concurrently as cc
    calls = []

    async def refused(*a, **kw):
        calls.append(a[2].queue_offset)
        return False
    monkeypatch.setattr(cc, "send_message_back", refused)
    monkeypatch.setattr(cc, "SEND_BACK_RETRY_DELAY", 0.2)
    topic = routed_topic(broker, topic_for(request, "BL_"), 1)
    seen = []

    async def on_batch(batch, context):
        seen.append((batch.queue_offsets.tolist(), batch.reconsume_times.tolist()))
        if len(seen) == 1:
            context.ack_index = 0
        return OK

    async def main():
        async with AsyncProducer("pg-batch-kept", namesrv_addr=broker.namesrv) as p:
            await p.send_batch([Message(topic, b"k%d" % i) for i in range(3)])
        c = consumer(broker, "cg-batch-kept", True)
        c.subscribe(topic)
        c.register_batch_listener(on_batch)
        async with c:
            await until(lambda: len(seen) >= 2, what="the kept messages again")
            mq = next(q for q in c.assigned_queues() if q.topic == topic)
            await until(lambda: c.offset_store.table.get(mq) == 3, what="the commit offset 3")
        return seen
    asyncio.run(main())
    assert calls == [1, 2]
    assert seen[:2] == [([0, 1, 2], [0, 0, 0]), ([1, 2], [1, 1])]


def test_the_blocking_consumer_takes_a_plain_batch_function(broker, request):
    topic = routed_topic(broker, topic_for(request, "BL_"), 1)
    got = []
    c = PushConsumer("cg-batch-blocking", namesrv_addr=broker.namesrv,
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
    c.subscribe(topic)
    c.register_batch_listener(lambda batch, context: (got.extend(batch.bodies()), OK)[1])
    with pytest.raises(TypeError, match="callable"):
        c.register_batch_listener("not a function")
    c.start()
    try:
        from shmq.client import Producer
        with Producer("pg-batch-blocking", namesrv_addr=broker.namesrv) as p:
            for i in range(5):
                p.send(Message(topic, b"p%d" % i))
        deadline = time.monotonic() + WAIT
        while len(got) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        c.shutdown()
    assert got == [b"p%d" % i for i in range(5)]


def test_broadcasting_batch_listeners_each_get_every_message_and_drop_what_fails(
        broker, request, tmp_path, caplog):
    """Two broadcasting consumers each get every message in batches; one
    answers RECONSUME_LATER to its first batch, which is dropped with a
    warning (RocketMQ's broadcasting sends nothing back), and both offset
    files end at the queues' ends."""
    topic = routed_topic(broker, topic_for(request, "BL_"), 2)
    group = "cg-batch-broadcast"
    got = {"b1": [], "b2": []}

    async def main():
        cs = []
        for name in got:
            async def on_batch(batch, context, into=got[name], name=name):
                into.append(batch.bodies())
                return LATER if name == "b2" and len(into) == 1 else OK
            cfg = ClientConfig(namesrv_addr=broker.namesrv, instance_name=name)
            c = AsyncPushConsumer(group, client=cfg, message_model="BROADCASTING",
                                  local_offset_store_dir=str(tmp_path),
                                  consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
            c.subscribe(topic)
            c.register_batch_listener(on_batch)
            await c.start()
            cs.append(c)
        async with AsyncProducer("pg-batch-broadcast", namesrv_addr=broker.namesrv) as p:
            for i in range(20):
                await p.send(Message(topic, b"m%d" % i))
        await until(lambda: all(sum(map(len, v)) >= 20 for v in got.values()), what="20 each")
        await asyncio.sleep(0.3)                       # nothing more comes (nothing was sent back)
        for c in cs:
            await c.shutdown()
    with caplog.at_level("WARNING", logger="shmq.client"):
        asyncio.run(main())
    for name, batches in got.items():
        assert sorted(b for batch in batches for b in batch) == sorted(b"m%d" % i for i in range(20))
    assert any("broadcasting cg-batch-broadcast" in r.getMessage() and "dropped" in r.getMessage()
               for r in caplog.records)
    from shmq.client.offsets import parse_offset_table
    for name in got:
        [client_dir] = [d for d in os.listdir(tmp_path) if d.endswith("@" + name)]
        with open(tmp_path / client_dir / group / "offsets.json") as f:
            assert sum(parse_offset_table(f.read()).values()) == 20
