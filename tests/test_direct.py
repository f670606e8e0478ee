"""Direct appends (client/direct.py): a producer on the broker's host writes
the store itself, and nothing anyone else sees is different.

Against real broker processes: the producer's SendResult, the stored
records a socket pull returns, parked pulls woken by a direct append, what
still goes over the socket (a delay level, a topic the broker must create),
SYNC_FLUSH durability, the switch, the broker's refusals, and a direct
producer killed (SIGKILL) at random points of its appends: every
acknowledged message is stored exactly once, the boss repairs what it left,
and the broker serves on.
"""
from __future__ import annotations

import array
import asyncio
import contextlib
import glob
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import orjson
import pytest
from brokerproc import (broker_conf, BrokerProc, routed_topic, shared_memory, start_broker,
                        stored_records, topic_for, until)
from shmq.client import (AsyncProducer, ClientConfig, Message, MessageQueue, MQClientError,
                         Producer, SendStatus)
from shmq.client.direct import warm_up_appends
from shmq.client.remoting import RemotingClient
from shmq.client.requests import pull_message
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("direct"))
    warm_up_appends()   # each producer appends from its first send (else: the socket meanwhile)
    assert len(shared_memory(b.store)) == 2             # the store's control block and lock
    assert len(glob.glob(os.path.join(b.tmp, "pymp-*"))) == 1   # its fork server's socket
    yield b
    assert b.stop() == 0, b.log()[-3000:]
    assert shared_memory(b.store) == []                 # a clean stop unlinks both
    assert glob.glob(os.path.join(b.tmp, "pymp-*")) == []       # and removes that


def direct_of(p) -> object:
    """The producer's attached store (None: it sends over the socket)."""
    inst = p.instance if isinstance(p, AsyncProducer) else p._p.instance
    [ds] = [d for d in inst.direct.values()] or [None]
    return ds


@contextlib.asynccontextmanager
async def attached(b, topic: str, group: str):
    """An AsyncProducer of ``group`` whose first send (b"attach" to ``topic``)
    attached ``b``'s store: (the producer, its DirectStore)."""
    async with AsyncProducer(group, namesrv_addr=b.namesrv) as p:
        await p.send(Message(topic, b"attach"))
        yield p, direct_of(p)


def test_blocking_sends_append_in_their_own_threads_each_once_and_in_order(broker, request,
                                                                          monkeypatch):
    """``Producer.send`` appends in the calling thread (``send_here``), not
    through the client's loop thread: four threads sending at once get
    every message stored once, each thread's in its call order per queue,
    round robin over the queues; a ``send_async`` not answered yet keeps
    the next ``send`` behind it (stored after it, through the loop)."""
    import threading
    topic = routed_topic(broker, topic_for(request, "D_"), queues=4)
    here = []
    with Producer("dp-threads", namesrv_addr=broker.namesrv) as p:
        p.send(Message(topic, b"warm"))                  # route, store attached, switched to it
        real = p._p.send_here

        def counted(*args):
            r = real(*args)
            here.append(r[0] is not None)
            return r
        monkeypatch.setattr(p._p, "send_here", counted)
        sent: dict[int, list] = {}

        def sender(t: int) -> None:
            sent[t] = [p.send(Message(topic, b"t%d-%d" % (t, i))) for i in range(200)]
        threads = [threading.Thread(target=sender, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert len(here) == 800 and all(here)           # none took the loop's path
        assert direct_of(p).appended == 801
        # a send_async still on its way: the send after it is stored after it
        q = MessageQueue(topic, sent[0][0].queue.broker_name, 3)
        for _ in range(20):
            first = p.send_async(Message(topic, b"async"), queue=q)
            after = p.send(Message(topic, b"after"), queue=q)
            assert first.result(30).queue_offset < after.queue_offset
    results = [r for rs in sent.values() for r in rs]
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len({(r.queue.queue_id, r.queue_offset) for r in results}) == 800
    for rs in sent.values():                            # one thread's: in call order per queue
        for qid in range(4):
            offs = [r.queue_offset for r in rs if r.queue.queue_id == qid]
            assert offs == sorted(offs)
    counts = [sum(r.queue.queue_id == qid for r in results) for qid in range(4)]
    assert max(counts) - min(counts) <= 4, counts       # round robin (threads interleave)
    stored = {m.properties["UNIQ_KEY"]: m for m in stored_records(broker, topic, 4)}
    assert len(stored) == 801 + 40
    for t, rs in sent.items():
        for i, r in enumerate(rs):
            m = stored[r.msg_id]
            assert m.body == b"t%d-%d" % (t, i) and m.offset_msg_id() == r.offset_msg_id
            assert (m.queue_id, m.queue_offset) == (r.queue.queue_id, r.queue_offset)


def test_a_shutdown_while_threads_send_stores_each_answered_message_once(broker, request):
    """Threads sending with the blocking Producer (each appending in its own
    thread) while another shuts the producer down: the store is let go only
    between appends (one lock for the process's uses of it), so a send is
    answered SEND_OK with its message stored, or refused, and no message is
    stored twice (one failed after its append was published was sent again
    over the socket under a new UNIQ_KEY)."""
    import threading
    from shmq.client.errors import RemotingError
    topic = routed_topic(broker, topic_for(request, "D_"), queues=2)
    ok, refused = [], []
    p = Producer("dp-shutdown-threads", namesrv_addr=broker.namesrv).start()
    p.send(Message(topic, b"warm"))
    go = threading.Event()

    def sender(t: int) -> None:
        go.wait()
        for i in range(100_000):
            try:
                ok.append((t, i, p.send(Message(topic, b"s%d-%d" % (t, i)))))
            except (MQClientError, RemotingError) as e:
                refused.append(e)
                return
    threads = [threading.Thread(target=sender, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    go.set()
    time.sleep(0.3)
    p.shutdown()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads)
    assert len(refused) == 3 and len(ok) > 30, (len(ok), refused[:1])
    assert all("shut down" in str(e) for e in refused), refused
    stored = [m.properties["UNIQ_KEY"] for m in stored_records(broker, topic, 2)]
    assert len(stored) == len(set(stored))                 # none twice
    assert {r.msg_id for _, _, r in ok} <= set(stored)     # every answered one


def test_a_blocking_producer_shut_down_in_the_main_thread_puts_the_sigint_handler_back(
        broker, request):
    """Blocking sends append in the main thread, where the SIGINT guard wraps
    the application's handler (Ctrl-C waits for the append); the store is
    closed in the client's loop thread, which cannot put it back, so the
    shutdown does it (a later asyncio.run skipped its Ctrl-C handler)."""
    import signal
    import threading
    assert threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT)
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    with Producer("dp-sigint-back", namesrv_addr=broker.namesrv) as p:
        p.send(Message(topic, b"warm"))
        p.send(Message(topic, b"here"))                 # appended in this, the main thread
        assert direct_of(p).appended >= 1
        assert signal.getsignal(signal.SIGINT) is not before      # wrapped
    assert signal.getsignal(signal.SIGINT) is before


def test_a_local_producer_appends_itself_and_a_socket_pull_reads_the_same_records(broker, request):
    topic = routed_topic(broker, topic_for(request, "D_"), queues=2)
    with Producer("dp-1", namesrv_addr=broker.namesrv) as p:
        results = [p.send(Message(topic, b"m%d" % i, tags="T", keys=["k%d" % i],
                                  properties={"n": str(i)})) for i in range(40)]
        ds = direct_of(p)
        assert ds is not None and ds.appended == 40          # none went over the socket
    assert all(r.status is SendStatus.SEND_OK for r in results)
    by_q: dict[int, list] = {}
    for r in results:
        by_q.setdefault(r.queue.queue_id, []).append(r.queue_offset)
    assert all(offs == list(range(len(offs))) for offs in by_q.values())   # in order per queue
    stored = {m.properties["UNIQ_KEY"]: m for m in stored_records(broker, topic, 2)}
    assert len(stored) == 40
    for i, r in enumerate(results):
        m = stored[r.msg_id]
        assert (m.body, m.tags, m.keys, m.properties["n"]) == (b"m%d" % i, "T", ["k%d" % i], str(i))
        assert (m.queue_id, m.queue_offset) == (r.queue.queue_id, r.queue_offset)
        assert m.offset_msg_id() == r.offset_msg_id            # the broker's own msgId
        assert m.properties["CLUSTER"] == "DefaultCluster"      # as the broker adds it


def test_direct_append_off_as_a_keyword_of_the_producer_as_of_a_consumer(broker, request):
    """ClientConfig's settings are keywords of a producer too (they were of
    the consumers only, and Producer(direct_append=False) a TypeError)."""
    topic = routed_topic(broker, topic_for(request, "D_"))
    with Producer("dp-kw", namesrv_addr=broker.namesrv, direct_append=False) as p:
        assert p.send(Message(topic, b"over the socket")).status is SendStatus.SEND_OK
        assert direct_of(p) is None
    with pytest.raises(TypeError, match="unknown settings: no_such_setting"):
        Producer("dp-kw", namesrv_addr=broker.namesrv, no_such_setting=1)


def test_a_direct_producer_leaves_shared_memory_as_it_found_it(broker, request):
    """It maps the broker's block and takes a slot in it; it creates and
    unlinks nothing: closed, /dev/shm is as before and its slot is free."""
    topic = routed_topic(broker, topic_for(request, "D_"))
    before = set(os.listdir("/dev/shm"))
    ours = {n: os.stat(f"/dev/shm/{n}").st_ino for n in shared_memory(broker.store)}
    with Producer("dp-shm", namesrv_addr=broker.namesrv) as p:
        p.send(Message(topic, b"x"))
        ds = direct_of(p)
        assert ds is not None and ds.appended == 1
        slot, procs = ds.cb.slot, ds.cb.procs
        assert int(procs["pid"][slot]) == os.getpid()
        # what this process maps of /dev/shm while attached: the broker's
        # block and semaphore, no store block of its own making
        with open("/proc/self/maps") as f:
            mapped = {line.split()[-1][len("/dev/shm/"):] for line in f
                      if line.split()[-1].startswith("/dev/shm/")}
        assert {n for n in mapped if n.startswith(("shmq-", "sem.shmq-"))} == set(ours)
    assert int(procs["pid"][slot]) == 0
    # what other processes make meanwhile: stores' blocks, multiprocessing's
    # semaphores (unlinked as soon as made), the headless Chromium of
    # test_console in another xdist worker
    made = {n for n in set(os.listdir("/dev/shm")) - before if not n.startswith(
        ("shmq-", "sem.shmq-", "sem.mp-", ".org.chromium."))}
    assert made == set()
    # the broker's block and semaphore, the very ones: not unlinked, not made again
    assert {n: os.stat(f"/dev/shm/{n}").st_ino for n in shared_memory(broker.store)} == ours
    assert len(ours) == 2


def test_a_parked_pull_is_answered_by_a_direct_append(broker, request):
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    with RemotingClient(broker.addr) as c, Producer("dp-park", namesrv_addr=broker.namesrv) as p:
        p.send(Message(topic, b"warm"))                        # attach before the pull parks
        opaque = c.send(pull_message(topic, 0, 1, max_msgs=8, suspend_ms=20_000))
        time.sleep(0.2)                                        # let it park
        t0 = time.monotonic()
        r = p.send(Message(topic, b"wake"))
        reply = c.recv(timeout=10)
        assert direct_of(p).appended == 2
    assert reply.opaque == opaque and reply.code == R.SUCCESS
    assert time.monotonic() - t0 < 10        # woken by the append, not by the 20 s hold
    assert r.queue_offset == 1


def test_pulls_parked_on_every_queue_are_answered_by_a_burst_of_direct_sends(broker, request):
    """Sends in one loop turn share their wake-ups (client/direct.py
    ``Wakes``): the turn's end pays what its later sends owe, so no parked
    pull waits for its hold. (A worker also looks at its parked pulls once
    a second, so this cannot tell a wake-up owed and never paid from one
    paid: the unit test of ``Wakes`` below does.)"""
    topic = routed_topic(broker, topic_for(request, "D_"), queues=4)

    async def burst() -> list:
        async with AsyncProducer("dp-burst", namesrv_addr=broker.namesrv) as p:
            queues = await p.publish_queues(topic)
            await asyncio.gather(*[p.send(Message(topic, b"warm"), queue=q) for q in queues])
            with RemotingClient(broker.addr) as c:
                opaques = {c.send(pull_message(topic, q.queue_id, 1, max_msgs=8, suspend_ms=20_000))
                           for q in queues}
                gauges = direct_of(p).tally.c                  # the workers' (once a second)
                until(lambda: gauges.gauge("parked_pulls") >= len(queues), "the pulls parked")
                t0 = time.monotonic()
                rs = await asyncio.gather(*[p.send(Message(topic, b"wake"), queue=q) for q in queues])
                replies = [c.recv(timeout=10) for _ in queues]
                assert time.monotonic() - t0 < 10     # woken by the appends, not by the 20 s hold
            assert direct_of(p).appended == 8
        assert {r.opaque for r in replies} == opaques
        assert all(r.code == R.SUCCESS for r in replies)
        return rs

    assert [r.queue_offset for r in asyncio.run(burst())] == [1, 1, 1, 1]


def test_sends_of_one_loop_turn_are_appended_together_each_as_if_alone(broker, request):
    """Sends in flight together (``gather``): the loop turn's first appends
    at once, the rest join one claim per queue when the turn ends
    (client/direct.py ``AppendTurn``). Each answer is what a lone send's
    would be — SEND_OK, its own msgId and queue offset, stored in call order
    per queue; a retry of a key sent in the same turn gets the first one's
    answer and is stored once; a delayed message still goes to the broker;
    a body over the broker's maxMessageSize is refused alone; a send
    cancelled before its turn ends is not stored."""
    topic = routed_topic(broker, topic_for(request, "D_"), queues=2)
    illegal, delayed, cancelled, twin = 4, 8, 22, 17       # queue 0's three, queue 1's one

    def message(i: int) -> Message:
        if i == illegal:
            return Message(topic, b"x" * (1 << 20) + b"x")      # the broker's limit: 1 MiB
        m = Message(topic, b"m%d" % i, tags="T%d" % (i % 3), keys=["k%d" % i],
                    properties={"n": str(i)}, delay_level=1 if i == delayed else 0)
        if i == twin:                                        # a retry of message 3
            m.properties["UNIQ_KEY"] = "TWIN3"
        if i == 3:
            m.properties["UNIQ_KEY"] = "TWIN3"
        return m

    async def sends():
        async with AsyncProducer("dp-turn", namesrv_addr=broker.namesrv,
                                 compress_msg_body_over_howmuch=8 << 20) as p:
            queues = await p.publish_queues(topic)
            await p.send(Message(topic, b"warm"), queue=queues[0])
            await p.send(Message(topic, b"warm"), queue=queues[1])
            ds = direct_of(p)
            claims = []
            append = ds.store.append

            def counted(batch, *args):      # the claims made (None: none, nothing stored)
                n = len(batch.sizes)
                r = append(batch, *args)
                if r is not None:
                    claims.append(n)
                return r
            ds.store.append = counted
            msgs = [message(i) for i in range(32)]
            tasks = [asyncio.ensure_future(p.send(m, queue=queues[i % 2]))
                     for i, m in enumerate(msgs)]
            await asyncio.sleep(0)           # every send ran to its append or its turn's group
            tasks[cancelled].cancel()
            out = await asyncio.gather(*tasks, return_exceptions=True)
            ds.store.append = append
            return out, claims, ds.appended

    out, claims, appended = asyncio.run(sends())
    assert isinstance(out[cancelled], asyncio.CancelledError)
    assert isinstance(out[illegal], MQClientError) and out[illegal].code == R.MESSAGE_ILLEGAL
    # the first appended alone (append_record), queue 0's rest in one claim (12: the
    # illegal, delayed and cancelled ones left out); queue 1's one by one, each on its
    # own, as a key is there twice (the twin is answered from the window, not stored)
    assert claims == [12]
    assert appended == 2 + 1 + 12 + 15
    ok = {i: r for i, r in enumerate(out) if i not in (illegal, cancelled)}
    assert all(r.status is SendStatus.SEND_OK for r in ok.values())
    assert (ok[twin].msg_id, ok[twin].offset_msg_id, ok[twin].queue_offset) == (
        ok[3].msg_id, ok[3].offset_msg_id, ok[3].queue_offset)
    stored = stored_records(broker, topic, 2)
    by_id = {m.offset_msg_id(): m for m in stored}
    for q in (0, 1):                     # call order per queue, offsets from 1 (after the warm)
        mine = [i for i in sorted(ok) if i % 2 == q and i not in (delayed, twin)]
        assert [ok[i].queue_offset for i in mine] == list(range(1, len(mine) + 1))
        assert [m.body for m in stored if m.queue_id == q][1:] == [b"m%d" % i for i in mine]
    for i, r in ok.items():
        if i == delayed:
            continue
        m = by_id[r.offset_msg_id]
        assert (m.body, m.tags, m.keys, m.properties["n"]) == (
            b"m%d" % (3 if i == twin else i), "T%d" % ((3 if i == twin else i) % 3),
            ["k%d" % (3 if i == twin else i)], str(3 if i == twin else i))
        assert (m.queue_id, m.queue_offset, m.properties["UNIQ_KEY"]) == (
            r.queue.queue_id, r.queue_offset, r.msg_id)
    deadline = time.monotonic() + 20     # the delayed one, routed by the broker: in its queue later
    while b"m%d" % delayed not in [m.body for m in stored_records(broker, topic, 2)]:
        assert time.monotonic() < deadline, "the delayed message never arrived"
        time.sleep(0.2)


def test_a_turn_group_larger_than_a_segment_and_an_unencodable_message_in_it(broker, request):
    """A turn's sends to one queue are cut into claims of at most a quarter
    segment (1 MiB): 18 sends of ~1 MB, more than the test broker's 16 MiB
    segment, are all stored, in call order (as one claim they would not
    fit a segment, and all were refused). A message whose properties are
    not UTF-8 is refused alone, MESSAGE_ILLEGAL, as when sent alone; the
    others of its group are stored."""
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    big = b"b" * 1_000_000

    async def sends():
        async with AsyncProducer("dp-big", namesrv_addr=broker.namesrv,
                                 compress_msg_body_over_howmuch=8 << 20) as p:
            [q] = await p.publish_queues(topic)
            await p.send(Message(topic, b"warm"), queue=q)
            assert direct_of(p) is not None
            large = await asyncio.gather(*[p.send(Message(topic, b"%02d" % i + big), queue=q)
                                           for i in range(18)])
            msgs = [Message(topic, b"u%d" % i, tags="T") for i in range(4)]
            msgs[2].properties["bad"] = "\ud800"                 # a lone surrogate
            mixed = await asyncio.gather(*[p.send(m, queue=q) for m in msgs],
                                         return_exceptions=True)
            return large, mixed, direct_of(p).appended

    large, mixed, appended = asyncio.run(sends())
    assert [r.status for r in large] == [SendStatus.SEND_OK] * 18
    assert [r.queue_offset for r in large] == list(range(1, 19))
    assert isinstance(mixed[2], MQClientError) and mixed[2].code == R.MESSAGE_ILLEGAL
    assert [r.queue_offset for r in mixed[:2] + mixed[3:]] == [19, 20, 21]
    assert appended == 1 + 18 + 3
    bodies = [m.body for m in stored_records(broker, topic, 1)]
    assert [b[:2] for b in bodies[1:19]] == [b"%02d" % i for i in range(18)]
    assert bodies[19:] == [b"u0", b"u1", b"u3"]


@pytest.mark.parametrize("cancel", [False, True])
def test_a_turn_group_the_store_leaves_to_the_broker_is_not_overtaken(broker, request, cancel):
    """When the store leaves a turn's group to the broker (busy, full, a
    table it does not hold yet: here it says so once), the group's sends
    are written over the socket when the turn ends, in their place: a send
    called after them, which runs before they resume, waits for their
    answers (as at the switch) and is stored after them. One cancelled
    once written (before it awaits its answer) is stored, and counts no
    more when answered: the sends after it append."""
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)

    async def sends():
        async with AsyncProducer("dp-left", namesrv_addr=broker.namesrv) as p:
            [q] = await p.publish_queues(topic)
            await p.send(Message(topic, b"warm"), queue=q)
            ds = direct_of(p)
            assert ds is not None
            group = ds._append_group

            def refuse_once(topic, queue_id, sends):
                ds._append_group = group
                return [None] * len(sends)
            ds._append_group = refuse_once
            first = [asyncio.ensure_future(p.send(Message(topic, body), queue=q))
                     for body in (b"A", b"B", b"C")]
            await asyncio.sleep(0)        # A appended, B and C joined the turn's group
            later = asyncio.ensure_future(p.send(Message(topic, b"D"), queue=q))
            if cancel:                    # B, once written for it, cancelled before it resumes
                asyncio.get_running_loop().call_soon(first[1].cancel)
            rs = await asyncio.gather(*first, later, return_exceptions=True)
            # a send after them all appends (nothing left counted over the socket)
            rs.append(await asyncio.wait_for(p.send(Message(topic, b"E"), queue=q), 10))
            return rs, ds.appended

    rs, appended = asyncio.run(sends())
    if cancel:
        assert isinstance(rs[1], asyncio.CancelledError)
        rs[1] = None
    assert [r and r.queue_offset for r in rs] == [1, None if cancel else 2, 3, 4, 5]
    assert appended == 1 + 1 + 2                  # warm, A, D and E appended; B and C sent
    assert [m.body for m in stored_records(broker, topic, 1)] == [
        b"warm", b"A", b"B", b"C", b"D", b"E"]


def test_a_send_many_chunk_is_stored_after_the_sends_called_before_it(broker, request):
    """Sends waiting for their turn's end and a ``send_many`` called after
    them in the same turn: its chunk, appended at once, first appends the
    turn's group (``AppendTurn.flush``), so a queue keeps call order."""
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)

    async def sends():
        async with AsyncProducer("dp-many", namesrv_addr=broker.namesrv) as p:
            [q] = await p.publish_queues(topic)
            await p.send(Message(topic, b"warm"), queue=q)
            assert direct_of(p) is not None
            tasks = [asyncio.ensure_future(p.send(Message(topic, body), queue=q))
                     for body in (b"A", b"B", b"C")]
            tasks.append(asyncio.ensure_future(p.send_many(topic, [b"X", b"Y"], queue=q)))
            return await asyncio.gather(*tasks)

    *rs, many = asyncio.run(sends())
    assert [r.queue_offset for r in rs] + [many[0].queue_offset] == [1, 2, 3, 4]
    assert [m.body for m in stored_records(broker, topic, 1)] == [
        b"warm", b"A", b"B", b"C", b"X", b"Y"]


def test_warming_up_appends_loads_the_encoding_kernels_a_turns_group_uses():
    """A turn's group is encoded by the batch kernel (as send_many's chunks
    are): the warm-up thread loads it with the append's, so its first use
    neither compiles nor loads it inside the event loop (on a cold cache
    that held every send of the process for seconds)."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from shmq.client.direct import warm_up_appends
        from shmq.core import jit
        assert warm_up_appends()
        print(sorted(jit.compile_counts(("encode", "batch")).items()))
    """)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    counts = dict(eval(r.stdout))
    assert counts["encode_uniform"] == 1 and counts["stamp_batch"] == 1, counts


def test_a_task_sending_in_a_loop_lets_the_others_send_meanwhile(broker, request):
    """A direct send does not yield, so a task sending in a loop held the
    event loop until it stopped: a second task's sends all came after the
    first's. Now a task's sends yield every ``AT_ONCE_MAX`` (the rest of
    the turn's sends join its group): the two interleave, each in its own
    call order, and every message is stored once."""
    from shmq.client.direct import AT_ONCE_MAX
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    n = 40
    assert AT_ONCE_MAX < n

    async def sends():
        async with AsyncProducer("dp-loop", namesrv_addr=broker.namesrv) as p:
            [q] = await p.publish_queues(topic)
            await p.send(Message(topic, b"warm"), queue=q)
            assert direct_of(p) is not None

            async def loop(name: bytes) -> None:
                for i in range(n):
                    await p.send(Message(topic, b"%s%03d" % (name, i)), queue=q)
            await asyncio.gather(loop(b"a"), loop(b"b"))
            return direct_of(p).appended

    assert asyncio.run(sends()) == 1 + 2 * n
    bodies = [m.body for m in stored_records(broker, topic, 1)][1:]
    assert sorted(bodies) == sorted([b"a%03d" % i for i in range(n)] + [b"b%03d" % i for i in range(n)])
    for name in (b"a", b"b"):
        assert [b for b in bodies if b[:1] == name] == [b"%s%03d" % (name, i) for i in range(n)]
    assert bodies.index(b"b000") < bodies.index(b"a%03d" % (n - 1))     # interleaved


def test_wakes_in_one_loop_turn_are_one_at_once_and_one_owed_paid_when_the_turn_ends(monkeypatch):
    from shmq.client import direct
    # no two due() calls here are WAKE_EVERY_S apart by the clock, however slow the machine:
    # the test sets how long ago the last wake-up was where it matters
    monkeypatch.setattr(direct, "WAKE_EVERY_S", 3600.0)
    woken = []
    w = direct.Wakes(woken.append)      # called with the queues (a mask) the wake-up is for
    for _ in range(3):                  # no running loop: every one at once
        w.due()
    assert woken == [-1, -1, -1] and not w.owed

    async def turns():
        woken.clear()
        for q in range(5):              # one turn: the first at once, the rest owed
            w.due(1 << q)
        assert woken == [1] and w.owed
        await asyncio.sleep(0)          # the turn ends: the owed one is paid, for their queues
        assert woken == [1, 0b11110] and not w.owed
        await asyncio.sleep(0)          # nothing owed, nothing paid
        assert len(woken) == 2
        w.due()                         # a new turn's first: at once
        w.due()                         # owed
        assert len(woken) == 3 and w.owed
        w.woke_at -= 2 * direct.WAKE_EVERY_S
        w.due()                         # WAKE_EVERY_S after the last wake-up: at once, owes none
        assert len(woken) == 4 and not w.owed
        await asyncio.sleep(0)
        assert len(woken) == 4

    asyncio.run(turns())


def test_what_needs_the_broker_still_goes_over_the_socket(broker, request):
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    new_topic = topic_for(request, "Dnew_")
    with Producer("dp-route", namesrv_addr=broker.namesrv) as p:
        p.send(Message(topic, b"plain"))
        ds = direct_of(p)
        delayed = p.send(Message(topic, b"later", delay_level=1))     # 1 s: the broker routes it
        created = p.send(Message(new_topic, b"first"))                # the broker creates it
        assert ds.appended == 1
    assert delayed.status is SendStatus.SEND_OK and created.status is SendStatus.SEND_OK
    deadline = time.monotonic() + 20
    while len(stored_records(broker, topic, 1)) < 2:
        assert time.monotonic() < deadline, "the delayed message never arrived"
        time.sleep(0.2)
    assert [m.body for m in stored_records(broker, new_topic, 4)] == [b"first"]


def test_a_send_the_store_leaves_to_the_broker_is_not_overtaken_by_the_next_append(broker, request):
    """The store leaves a send to the broker (busy, a topic its tables do
    not hold yet: here its first append says so once): while that send is
    over the socket, the next send to the queue waits for its answer before
    appending, so the queue keeps call order."""
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)

    async def main():
        async with attached(broker, topic, "dp-fallback") as (p, ds):
            append, left = ds.append, [1]

            def once_to_the_broker(*args, **kw):
                if left[0]:
                    left[0] = 0
                    return None
                return append(*args, **kw)
            ds.append = once_to_the_broker
            rs = await asyncio.gather(*(p.send(Message(topic, b"m%d" % i)) for i in range(4)))
            return rs, ds.appended
    rs, appended = asyncio.run(main())
    assert [r.queue_offset for r in rs] == [1, 2, 3, 4]        # m0 over the socket, first
    assert appended == 4                                       # the attach's and m1..m3
    assert [m.body for m in stored_records(broker, topic, 1)] == [b"attach", b"m0", b"m1", b"m2", b"m3"]


def test_a_send_waiting_for_one_brokers_socket_holds_up_no_send_to_another(broker, tmp_path,
                                                                           request):
    """While a send to broker A waits for A's socket sends to be answered
    before it appends (A is stopped), a send to broker B, both stores
    attached, appends and is answered at once: it waited on A's switch
    (one switch for every broker), until A answered."""
    name = topic_for(request, "D_")
    with BrokerProc(tmp_path, broker_conf(tmp_path, brokerName="broker-b",
                                          namesrvAddr=broker.namesrv)).start() as b:
        topic = routed_topic(b, routed_topic(broker, name, queues=1), queues=1)

        async def main():
            async with AsyncProducer("dp-switch-each", namesrv_addr=broker.namesrv) as p:
                inst = p.instance
                qs = {}
                deadline = time.monotonic() + 15        # both brokers in the route
                while len(qs) < 2:
                    assert time.monotonic() < deadline, f"route of {topic}: {qs}"
                    qs = {q.broker_name: q for q in await p.publish_queues(topic)}
                    await inst.route(topic, refresh=True)
                [qa] = [q for n, q in qs.items() if n != "broker-b"]
                qb = qs["broker-b"]
                for q in (qa, qb):
                    await p.send(Message(topic, b"attach"), q)
                ds = inst.direct_now(qa.broker_name)
                assert ds is not None and inst.direct_now("broker-b") not in (None, ds)
                append = ds.append

                def to_the_broker_once(*args, **kw):   # A's store leaves the next send to A
                    ds.append = append
                    return None
                ds.append = to_the_broker_once
                os.killpg(broker.proc.pid, signal.SIGSTOP)
                try:
                    over = asyncio.ensure_future(p.send(Message(topic, b"a1"), qa, timeout=60))
                    waits = asyncio.ensure_future(p.send(Message(topic, b"a2"), qa, timeout=60))
                    for _ in range(20):                  # a2 in A's switch, waiting for a1
                        await asyncio.sleep(0)
                    assert not over.done() and not waits.done()
                    other = await asyncio.wait_for(p.send(Message(topic, b"b1"), qb), 30)
                    assert not over.done() and not waits.done()
                finally:
                    os.killpg(broker.proc.pid, signal.SIGCONT)
                return await over, await waits, other
        a1, a2, b1 = asyncio.run(main())
        assert (a1.queue_offset, a2.queue_offset, b1.queue_offset) == (1, 2, 1)
        assert [m.body for m in stored_records(broker, topic, 1)] == [b"attach", b"a1", b"a2"]
        assert [m.body for m in stored_records(b, topic, 1)] == [b"attach", b"b1"]


def test_a_send_waiting_for_the_socket_sends_gives_up_alone_and_at_its_own_deadline():
    """The wait before a direct append (sends to the broker still in flight
    over its socket): a waiter cancelled leaves the others waiting, and a
    waiter whose deadline passes fails without appending, while the others
    go on once the socket sends are answered. No broker: the producer's
    switch state alone."""
    import types

    from shmq.client.errors import RemotingError

    async def main():
        p = types.SimpleNamespace()
        AsyncProducer._direct_init(p)
        p._over_socket["A"] = 1                          # a send in flight over A's socket
        now = time.monotonic()
        first = asyncio.ensure_future(AsyncProducer._switch(p, "A", "ds", now + 30))
        second = asyncio.ensure_future(AsyncProducer._switch(p, "A", "ds", now + 30))
        hurried = asyncio.ensure_future(AsyncProducer._switch(p, "A", "ds", now + 0.05))
        for _ in range(5):
            await asyncio.sleep(0)
        first.cancel()                                   # its caller gave up
        with pytest.raises(RemotingError, match="timed out waiting for the sends in flight"):
            await hurried                                # its own deadline, not the others'
        assert first.cancelled() and not second.done() and "A" not in p._direct_of
        AsyncProducer._socket_answered(p, "A")           # the socket send is answered
        await asyncio.wait_for(second, 30)
        assert p._direct_of["A"] == "ds" and not p._switching
    asyncio.run(main())


def test_the_switch_off_sends_over_the_socket(broker, request):
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    with Producer("dp-off", namesrv_addr=broker.namesrv,
                  client=ClientConfig(direct_append=False)) as p:
        r = p.send(Message(topic, b"x"))
        assert direct_of(p) is None
    assert r.status is SendStatus.SEND_OK and r.queue_offset == 0


def test_the_broker_offers_direct_appends_only_over_its_unix_socket(broker):
    with RemotingClient(broker.addr) as tcp:                   # TCP: not on this host, as far as it knows
        r = tcp.invoke(RemotingCommand(RC.SHMQ_DIRECT_INFO))
    assert r.code == R.NO_PERMISSION and "Unix socket" in r.remark
    with RemotingClient(f"unix:{broker.unix}") as unix:
        r = unix.invoke(RemotingCommand(RC.SHMQ_DIRECT_INFO))
    info = orjson.loads(r.body)
    assert r.code == R.SUCCESS and info["store"]["storePathRootDir"] == broker.conf["storePathRootDir"]


def test_refused_by_the_broker_means_the_socket(tmp_path, request):
    with BrokerProc(tmp_path, broker_conf(tmp_path, directAppendEnable="false")).start() as b:
        topic = routed_topic(b, topic_for(request, "D_"), queues=1)
        with Producer("dp-refused", namesrv_addr=b.namesrv) as p:
            assert p.send(Message(topic, b"x")).status is SendStatus.SEND_OK
            assert direct_of(p) is None
        assert [m.body for m in stored_records(b, topic, 1)] == [b"x"]


def test_sync_flush_direct_sends_are_durable_when_answered(tmp_path, request):
    with BrokerProc(tmp_path, broker_conf(tmp_path, flushDiskType="SYNC_FLUSH")).start() as b:
        topic = routed_topic(b, topic_for(request, "D_"), queues=2)

        async def main():
            async with attached(b, topic, "dp-sync") as (p, ds):
                rs = await asyncio.gather(*(p.send(Message(topic, b"s%d" % i)) for i in range(200)))
                return ds, rs, ds.state.flushed_pos

        ds, rs, flushed = asyncio.run(main())
        assert ds.appended == 201 and all(r.status is SendStatus.SEND_OK for r in rs)
        ends = [int(r.offset_msg_id[16:], 16) for r in rs]
        assert flushed > max(ends)                 # every answered send is on disk
        assert len(stored_records(b, topic, 2)) == 201


def _flusher_stopped_unlocked(b):
    """SIGSTOP the broker's flusher between its rounds (not holding the
    flush lock: a stopped holder would stop every flush); its pid."""
    from shmq.core.files import FlushLock
    pid = b.children()["shmq-flusher"]
    lock = FlushLock(os.path.join(b.conf["storePathRootDir"], "commitlog"))
    try:
        for _ in range(200):
            os.kill(pid, signal.SIGSTOP)
            if lock.acquire(block=False):
                lock.release()
                return pid
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.01)
        raise AssertionError("the flusher held the flush lock at every look")
    finally:
        lock.close()


def test_a_lone_direct_sync_send_is_made_durable_by_its_own_process(tmp_path, request):
    """One SYNC_FLUSH send at a time: the producer's flush thread leads the
    group commit itself (client/direct.py ``FlushWaiter``), so each send is
    answered SEND_OK, durable, while the broker's flusher is stopped; before,
    each waited for the flusher's round and timed out (FLUSH_DISK_TIMEOUT)."""
    conf = broker_conf(tmp_path, flushDiskType="SYNC_FLUSH", syncFlushTimeout="10000")
    with BrokerProc(tmp_path, conf).start() as b:
        topic = routed_topic(b, topic_for(request, "D_"), queues=1)

        async def main():
            async with attached(b, topic, "dp-lone-sync") as (p, ds):
                seq0 = ds.state.get("flush_seq")
                pid = _flusher_stopped_unlocked(b)
                try:
                    out = []
                    for i in range(5):
                        r = await p.send(Message(topic, b"lone%d" % i))
                        out.append((r.status, ds.state.flushed_pos
                                    > int(r.offset_msg_id[16:], 16)))
                finally:
                    os.kill(pid, signal.SIGCONT)
                rounds = getattr(ds.flush_waiter, "rounds", 0)
                return out, ds.state.get("flush_seq") - seq0, rounds

        out, flushes, rounds = asyncio.run(main())
        assert out == [(SendStatus.SEND_OK, True)] * 5
        assert flushes >= 5 and rounds >= 5
        assert [m.body for m in stored_records(b, topic, 1)][1:] == [b"lone%d" % i for i in range(5)]


def test_a_direct_flush_that_fails_is_left_to_the_flusher(tmp_path, request, caplog):
    """The producer's own fdatasync fails (EIO, injected at the store's
    flush): the error is logged, the flusher is woken and makes the send
    durable, and it is answered SEND_OK."""
    with BrokerProc(tmp_path, broker_conf(tmp_path, flushDiskType="SYNC_FLUSH")).start() as b:
        topic = routed_topic(b, topic_for(request, "D_"), queues=1)

        async def main():
            async with attached(b, topic, "dp-sync-eio") as (p, ds):
                failed = []

                def flush_commitlog(block=True):
                    failed.append(block)
                    raise OSError(5, "Input/output error")
                ds.store.flush_commitlog = flush_commitlog
                r = await p.send(Message(topic, b"after-eio"))
                return r, ds.state.flushed_pos > int(r.offset_msg_id[16:], 16), failed

        with caplog.at_level("ERROR", logger="shmq.client.direct"):
            r, durable, failed = asyncio.run(main())
        # (tried without waiting for the lock; again past LEAD_AGAIN_S on a slow machine)
        assert r.status is SendStatus.SEND_OK and durable and failed and not any(failed)
        assert "the CommitLog flush failed ([Errno 5] Input/output error); the flusher takes " \
               "over" in caplog.text


# ------------------------------------------------------------ kill -9 of a direct producer
SENDER = textwrap.dedent("""
    import sys
    from shmq.client import Message, Producer
    from shmq.client.direct import warm_up_appends
    warm_up_appends()                      # every send appended, the first one too
    with Producer("dp-kill", namesrv_addr=sys.argv[1]) as p:
        i = 0
        while True:
            r = p.send(Message(sys.argv[2], b"b%d" % i, keys=["n%d" % i]))
            d = [d for d in p._p.instance.direct.values() if d is not None]
            print(f"{r.msg_id} {r.queue.queue_id} {r.queue_offset} {1 if d and d[0].appended else 0}",
                  flush=True)
            i += 1
""")


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
@pytest.mark.parametrize("trials", [int(os.environ.get("SHMQ_DIRECT_KILL_TRIALS", "4"))])
def test_a_direct_producer_killed_mid_append_loses_no_acknowledged_message(tmp_path, request,
                                                                            trials, flush):
    """Under SYNC_FLUSH each send waits for its flush, which the producer
    leads itself one send at a time (``FlushWaiter``): a kill inside that
    round leaves the flush lock to the kernel, and the socket sends after
    it are answered."""
    rng = random.Random(trials)
    with BrokerProc(tmp_path, broker_conf(tmp_path, flushDiskType=flush)).start() as b:
        topic = routed_topic(b, topic_for(request, "D_"), queues=2)
        acked: dict[str, tuple[int, int]] = {}
        for t in range(trials):
            proc = subprocess.Popen([sys.executable, "-c", SENDER, b.namesrv, topic],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            lines = []
            while len(lines) < 50 + rng.randrange(300):        # mid-stream, at a random point
                line = proc.stdout.readline()
                assert line, proc.stderr.read()[-3000:]
                lines.append(line.split())
            proc.send_signal(signal.SIGKILL)
            rest, _ = proc.communicate(timeout=30)
            lines += [ln.split() for ln in rest.splitlines() if len(ln.split()) == 4]
            assert all(direct == "1" for *_, direct in lines[1:]), "it did not append directly"
            for uniq, qid, off, _ in lines:
                acked[uniq] = (int(qid), int(off))
            # the broker serves a socket client at once, the dead claim repaired or not
            with Producer("dp-after", namesrv_addr=b.namesrv,
                          client=ClientConfig(direct_append=False)) as p:
                assert p.send(Message(topic, b"after%d" % t)).status is SendStatus.SEND_OK
        # the boss's supervise tick repairs the dead claim, later on a busy
        # machine: read until every acknowledged send and every "after" is
        # there, or 30 s have passed (a fixed 1.5 s wait did before)
        deadline = time.monotonic() + 30
        while True:
            stored = stored_records(b, topic, 2)
            seen = {m.properties.get("UNIQ_KEY") for m in stored}
            afters = sum(1 for m in stored if m.body.startswith(b"after"))
            if (seen >= acked.keys() and afters >= trials) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        uniqs = [m.properties.get("UNIQ_KEY") for m in stored]
        assert len(uniqs) == len(set(uniqs))                            # none twice
        where = {m.properties["UNIQ_KEY"]: (m.queue_id, m.queue_offset) for m in stored}
        missing = [u for u in acked if u not in where]
        assert not missing, f"{len(missing)} acknowledged messages lost: {missing[:5]}"
        assert all(where[u] == acked[u] for u in acked)                 # where they were acked
        assert sum(1 for m in stored if m.body.startswith(b"after")) == trials
    # a clean stop happened (BrokerProc's exit); the store verifies offline
    r = subprocess.run([sys.executable, "-m", "shmq.tools", "store", "inspect",
                        os.path.join(str(tmp_path), "store"), "--verify"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


# Each Ctrl-C script first takes Python's own SIGINT handler, as a program
# started at a terminal has it: a suite started in the background of a
# script (`cmd &`: the shell ignores SIGINT for it) passes SIGINT on ignored,
# and Python then leaves it ignored, so no KeyboardInterrupt would come.
INTERRUPTED = textwrap.dedent("""
    import asyncio, os, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from shmq.client import AsyncProducer, Message
    from shmq.client.direct import warm_up_appends
    warm_up_appends()                      # every send appended, the first one too

    async def main():
        async with AsyncProducer("dp-int", namesrv_addr=sys.argv[1]) as p:
            first = await p.send(Message(sys.argv[2], b"first"))
            [ds] = [d for d in p.instance.direct.values() if d is not None]
            claims = [0 if sys.argv[3] == "lone" else 1]    # grouped: not the opener's

            def ctrl_c(stage, seq):            # Ctrl-C between claim and publish
                if stage == "claimed":
                    claims[0] -= 1
                    if claims[0] < 0:
                        ds.store.hook = None
                        os.kill(os.getpid(), signal.SIGINT)
            ds.store.hook = ctrl_c
            if sys.argv[3] == "lone":
                try:
                    await p.send(Message(sys.argv[2], b"interrupted"))
                    print("not interrupted")
                except KeyboardInterrupt:
                    print("interrupted")
            else:      # another task's send joins the loop turn's group, appended at its end
                try:
                    await asyncio.gather(p.send(Message(sys.argv[2], b"opener")),
                                         p.send(Message(sys.argv[2], b"interrupted")))
                    print("not interrupted")
                except KeyboardInterrupt:         # (its task's: out of the loop, then here)
                    print("interrupted")
            last = await p.send(Message(sys.argv[2], b"last"))   # the lock and the claim let go
            print(first.queue_offset, last.queue_offset, flush=True)

    # not asyncio.run: its SIGINT handler cancels the main task instead of raising
    loop = asyncio.new_event_loop()
    task = loop.create_task(main())
    try:
        loop.run_until_complete(task)
    except KeyboardInterrupt:     # a task's leaves the loop; the main task goes on
        loop.run_until_complete(task)
""")


@pytest.mark.parametrize("how", ["lone", "grouped"])
def test_ctrl_c_in_a_direct_append_raises_once_the_append_is_published(broker, request, how):
    """A KeyboardInterrupt between claim and publish would hold the append
    lock or a claim while the process lives (its own next append hangs,
    the broker's too): it is raised right after the append instead — by
    the sender, or, for a send appended with its loop turn's group, by the
    sender's task when the turn ends (client/direct.py ``AppendTurn``)."""
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    r = subprocess.run([sys.executable, "-c", INTERRUPTED, broker.namesrv, topic, how],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    bodies = [b"first", b"interrupted", b"last"]
    if how == "grouped":
        bodies.insert(1, b"opener")
    assert r.stdout.split() == ["interrupted", "0", str(len(bodies) - 1)]
    assert [m.body for m in stored_records(broker, topic, 1)] == bodies


STALLER = textwrap.dedent("""
    import os, signal, sys
    from shmq.client import Message, Producer
    from shmq.client.direct import warm_up_appends
    warm_up_appends()
    with Producer("dp-staller", namesrv_addr=sys.argv[1]) as p:
        p.send(Message(sys.argv[2], b"a-first"))
        [ds] = list(p._p.instance.direct.values())
        def stall(stage, seq):                 # alive, holding a claim: stopped
            if stage == "claimed":
                ds.store.hook = None
                print("stalled", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
        ds.store.hook = stall
        p.send(Message(sys.argv[2], b"stalled"))
        print("published", flush=True)
""")

BEHIND = textwrap.dedent("""
    import os, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from shmq.client import Message, Producer
    from shmq.client.direct import warm_up_appends
    warm_up_appends()
    with Producer("dp-behind", namesrv_addr=sys.argv[1]) as p:
        p.send(Message(sys.argv[2], b"b-first"))
        [ds] = list(p._p.instance.direct.values())
        ds.busy_ms = 10 ** 9     # past osPageCacheBusyTimeOutMills it would go over the socket
        print("ready", flush=True)
        sys.stdin.readline()
        def claimed(stage, seq):
            if stage == "claimed":
                ds.store.hook = None
                print("claimed", flush=True)
        ds.store.hook = claimed
        try:
            p.send(Message(sys.argv[2], b"behind"))
            print("not interrupted", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
""")


def _line(proc, timeout: float = 60.0) -> str:
    """The next line ``proc`` prints (a bounded wait: it is killed, and what
    it said on stderr shown, if none comes)."""
    import select
    if not select.select([proc.stdout], [], [], timeout)[0]:
        proc.kill()
        raise AssertionError(f"no line within {timeout} s: {proc.stderr.read()[-3000:]}")
    return proc.stdout.readline().strip()


def test_ctrl_c_reaches_a_direct_append_waiting_behind_a_stalled_claim(broker, request):
    """A direct append whose turn to publish waits on a claim ahead whose
    owner lives but does not go on (stopped, swapped out, stuck on a disk)
    would keep a Ctrl-C until that owner moved, maybe never: the wait
    delivers it. The append it interrupted was written and is published by
    whoever publishes next; nothing is lost or stored twice."""
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    run = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    behind = subprocess.Popen([sys.executable, "-c", BEHIND, broker.namesrv, topic],
                              stdin=subprocess.PIPE, **run)
    staller = None
    try:
        assert _line(behind) == "ready"
        staller = subprocess.Popen([sys.executable, "-c", STALLER, broker.namesrv, topic], **run)
        assert _line(staller) == "stalled"
        behind.stdin.write("go\n")
        behind.stdin.flush()
        assert _line(behind) == "claimed"                   # behind the stalled claim
        behind.send_signal(signal.SIGINT)
        out, err = behind.communicate(timeout=60)           # hung here before: no end to the wait
        assert behind.returncode == 0 and out.split() == ["interrupted"], err[-3000:]
    finally:
        if staller is not None:
            staller.send_signal(signal.SIGCONT)
        behind.kill()
    out, err = staller.communicate(timeout=60)
    assert staller.returncode == 0 and out.split() == ["published"], err[-3000:]
    with RemotingClient(broker.addr) as c:                  # the next append publishes "behind"
        r = c.invoke(RemotingCommand(RC.SEND_MESSAGE_V2, body=b"last", ext={
            "a": "dp-last", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0",
            "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0", "k": "false",
            "m": "false"}))
        assert r.code == R.SUCCESS, r.remark
    assert [m.body for m in stored_records(broker, topic, 1)] == \
        [b"b-first", b"a-first", b"stalled", b"behind", b"last"]


TWO_RUNS = textwrap.dedent("""
    import asyncio, os, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from shmq.client import AsyncProducer, Message
    from shmq.client.direct import warm_up_appends
    warm_up_appends()                      # every send appended, the first one too

    async def main(interrupt):
        async with AsyncProducer("dp-runs", namesrv_addr=sys.argv[1]) as p:
            await p.send(Message(sys.argv[2], b"x"))
            [ds] = [d for d in p.instance.direct.values() if d is not None]
            assert ds.appended == 1                      # appended directly
            if interrupt:
                try:
                    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
                    await asyncio.sleep(20)
                    print("not interrupted")
                except asyncio.CancelledError:
                    print("cancelled", flush=True)
                    raise

    asyncio.run(main(False))
    try:
        asyncio.run(main(True))
    except KeyboardInterrupt:
        print("KeyboardInterrupt")
""")


def test_ctrl_c_cancels_the_main_task_of_a_later_asyncio_run(broker, request):
    """asyncio.run cancels its main task on Ctrl-C only when it installed
    its own SIGINT handler, which it does only over Python's default: the
    guard's wrapper (around the first run's handler) is taken out when the
    producer closes, not left to raise from a finished run."""
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    r = subprocess.run([sys.executable, "-c", TWO_RUNS, broker.namesrv, topic],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["cancelled", "KeyboardInterrupt"]
    assert [m.body for m in stored_records(broker, topic, 1)] == [b"x", b"x"]


def test_a_store_closed_in_another_thread_raises_nothing_and_ctrl_c_still_reaches_the_app(
        broker, request):
    """signal.signal works only in the main thread, so a store closed in
    another thread cannot take the SIGINT guard's wrapper out: the close
    raises nothing, Ctrl-C still reaches the application's handler, and
    the application's handler is put back in the main thread — by that
    Ctrl-C, or else by the producer's shutdown (which closes it again)."""
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    caught = []

    def app(signum, frame):                  # not Python's default: asyncio.run leaves it
        caught.append(signum)

    async def main(ctrl_c: bool) -> list[bool]:
        installed = []
        async with AsyncProducer("dp-thread-close", namesrv_addr=broker.namesrv) as p:
            await p.send(Message(topic, b"x"))
            ds = direct_of(p)
            assert ds.appended == 1 and signal.getsignal(signal.SIGINT) is not app   # wrapped
            await asyncio.to_thread(ds.close)
            installed.append(signal.getsignal(signal.SIGINT) is app)
            if ctrl_c:
                signal.raise_signal(signal.SIGINT)              # its handler runs before it returns
                installed.append(signal.getsignal(signal.SIGINT) is app)
        installed.append(signal.getsignal(signal.SIGINT) is app)
        return installed

    before = signal.signal(signal.SIGINT, app)
    try:
        assert asyncio.run(main(True)) == [False, True, True]
        assert asyncio.run(main(False)) == [False, True]
    finally:
        signal.signal(signal.SIGINT, before)
    assert caught == [signal.SIGINT]


def test_send_many_appends_bodies_as_one_claim_and_over_the_socket_the_same(broker, request):
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    bodies = [b"many-%d" % i + b"x" * (i % 600) for i in range(5000)]     # ~1.6 MB
    results = {}
    for direct in (True, False):
        with Producer("dp-many-%s" % direct, namesrv_addr=broker.namesrv,
                      client=ClientConfig(direct_append=direct)) as p:
            results[direct] = p.send_many(topic, bodies, tags="Bulk")
            assert (direct_of(p) is not None) == direct
            limit = p._p.config.max_message_size
            for bad in ([b"ok", b""], [b"ok", b"x" * (limit + 1)]):     # refused whole, at once
                with pytest.raises(MQClientError) as e:
                    p.send_many(topic, bad)
                assert e.value.code == R.MESSAGE_ILLEGAL
    stored = stored_records(broker, topic, 1)
    assert [m.body for m in stored] == bodies + bodies                   # in order, once each
    assert all(m.tags == "Bulk" for m in stored)
    for direct, part in ((True, stored[:5000]), (False, stored[5000:])):
        rs = results[direct]
        assert all(r.status is SendStatus.SEND_OK for r in rs) and sum(r.count for r in rs) == 5000
        assert [i for r in rs for i in r.offset_msg_ids] == [m.offset_msg_id() for m in part]
        first = rs[0].queue_offset
        assert [r.queue_offset for r in rs] == [first + sum(x.count for x in rs[:k])
                                                for k in range(len(rs))]
    assert len(results[True]) > 1                       # ~1 MiB a claim


def test_send_many_takes_arrays_of_bodies_direct_and_over_the_socket_the_same(broker, request):
    """A 2-D array (a body a row, any dtype: its bytes; strided too) and one
    buffer with lengths= (read-only ones too) store what the same bodies as
    a list store, as a 1-D array of bytes objects still does; a shape it
    does not take is refused at once, naming what it takes, and nothing is
    stored."""
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    rows = np.arange(3000 * 50, dtype=np.int32).reshape(3000, 50)[:, ::2]   # 100 B a body, ~0.3 MB
    lens = np.array([1 + i % 300 for i in range(4000)])                # ~0.6 MB
    lens.flags.writeable = False
    packed = bytes(range(256)) * (int(lens.sum()) // 256 + 1)
    packed = bytearray(packed[:int(lens.sum())])
    ends = np.cumsum(lens)
    objects = np.array([b"obj-%d" % i for i in range(50)], dtype=object)
    square = memoryview(b"abcdef").cast("B", (2, 3))                 # a 2-D view: its 6 bytes
    expected = ([r.tobytes() for r in rows] + [bytes(packed[e - n:e]) for e, n in zip(ends, lens)]
                + list(objects) + [b"abcdef", b"gen-0", b"gen-1"])
    for direct in (True, False):
        with Producer("dp-arrays-%s" % direct, namesrv_addr=broker.namesrv,
                      client=ClientConfig(direct_append=direct)) as p:
            limit = 1 << 20                   # the broker's maxMessageSize (brokerproc.SMALL)
            rs = (p.send_many(topic, rows) + p.send_many(topic, packed, lengths=lens)
                  + p.send_many(topic, objects) + p.send_many(topic, [square])
                  + p.send_many(topic, (b"gen-%d" % i for i in range(2)))
                  + p.send_many(topic, [b"m" * limit]))     # the largest body, on either path
            assert (direct_of(p) is not None) == direct
            assert all(r.status is SendStatus.SEND_OK for r in rs)
            assert sum(r.count for r in rs) == 7054
            for bad, kw, error, says in (
                    (packed, dict(lengths=lens[:, None]), ValueError, "one integer per body"),
                    (packed, dict(lengths=lens.astype(float)), ValueError, "of integers"),
                    ([b"x"], dict(queue=MessageQueue("Other", "broker-a", 0)), ValueError,
                     "queue= is a queue of Other"),
                    (packed, dict(lengths=lens[:-1]), ValueError, "lengths sum to"),
                    ([b"a", b"b"], dict(lengths=[1, 1]), TypeError, "one buffer of bodies"),
                    (b"ab", {}, TypeError, "lengths="),
                    (np.zeros(8, np.uint8), {}, TypeError, "2-D array"),
                    (np.zeros((2, 0), np.uint8), {}, MQClientError, "a body of 0 bytes"),
                    (packed, dict(lengths=np.append(lens[:-1], [0, lens[-1]])), MQClientError,
                     "a body of 0 bytes")):
                with pytest.raises(error, match=says):
                    p.send_many(topic, bad, **kw)
    stored = stored_records(broker, topic, 1)
    big = [m.body for m in stored if len(m.body) > 1000]
    assert len(big) == 2 and all(b == b"m" * len(big[0]) for b in big)
    assert [m.body for m in stored if len(m.body) <= 1000] == expected + expected   # in order, once each


ENDS_WHILE_ATTACHING = textwrap.dedent("""
    import asyncio, os, sys
    from shmq.client import AsyncProducer

    async def main():     # a new process: the store attaches in a thread meanwhile
        async with AsyncProducer("dp-ends", namesrv_addr=sys.argv[1]) as p:
            await p.send_many(sys.argv[2], [b"x"] * 10)
    asyncio.run(main())
    print(os.getpid())
""")

DIES_ATTACHED = textwrap.dedent("""
    import os, sys
    from shmq.client import Producer
    from shmq.client.direct import warm_up_appends
    warm_up_appends()     # attached at the first connection
    with Producer("dp-dies", namesrv_addr=sys.argv[1]) as p:
        p.send_many(sys.argv[2], [b"y"])
        print(os.getpid(), flush=True)
        os._exit(0)
""")


def test_a_process_that_ends_while_its_store_attaches_leaves_no_slot_to_the_broker(broker,
                                                                                   request):
    """asyncio.run's end cancelled the task waiting for the attaching thread,
    which then attached anyway: the process slot stayed taken until the
    process exited, and the broker logged a normal exit as a death ("pid
    ... is gone"). A process that does die attached is logged so, which
    also says the broker has looked since the first one ended."""
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    pids = []
    for script in (ENDS_WHILE_ATTACHING, DIES_ATTACHED):
        r = subprocess.run([sys.executable, "-c", script, broker.namesrv, topic],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr[-3000:]
        pids.append(int(r.stdout.split()[-1]))
    until(lambda: f"pid {pids[1]} (slot" in broker.log(), "the broker to see the second die")
    assert f"pid {pids[0]} (slot" not in broker.log()
    assert len(stored_records(broker, topic, 1)) == 11


def test_the_topics_no_producer_may_send_to_are_the_brokers():
    """client/direct.py keeps its own copy (the client cannot import the broker)."""
    from shmq.broker.topics import NOT_ALLOWED_SEND_TOPICS
    from shmq.client.direct import NOT_ALLOWED_SEND_TOPICS as CLIENT_COPY
    assert CLIENT_COPY == NOT_ALLOWED_SEND_TOPICS


def test_send_many_refuses_a_body_that_is_not_bytes_alike_direct_and_over_the_socket(broker, request):
    """A str body is refused with MESSAGE_ILLEGAL before anything is stored,
    on the direct path as over the socket; a memoryview of ints is its bytes."""
    topic = routed_topic(broker, topic_for(request, "D_"), queues=1)
    ints = memoryview(array.array("i", [1, 2, 3]))
    for direct in (True, False):
        with Producer("dp-many-type-%s" % direct, namesrv_addr=broker.namesrv,
                      client=ClientConfig(direct_append=direct)) as p:
            for bad in (["text"], [b"ok", "text"]):
                with pytest.raises(MQClientError) as e:
                    p.send_many(topic, bad)
                assert e.value.code == R.MESSAGE_ILLEGAL and "str" in str(e.value), e.value
            [r] = p.send_many(topic, [ints])
            assert r.status is SendStatus.SEND_OK and (direct_of(p) is not None) == direct
    assert [m.body for m in stored_records(broker, topic, 1)] == [ints.tobytes()] * 2
