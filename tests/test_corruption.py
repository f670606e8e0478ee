"""Damaged records in a running broker's store: a pull never serves one.

A flipped bit in a record that recovery does not rescan (an older segment,
or any record while the broker runs) used to be served as is; shmq's own
consumer then failed on it at every retry and stopped that queue. Pulls now
check each record read from outside the page-cache window
(``checkCRCOnRead``, ``accessMessageInMemoryMaxRatio``; 0 here, so every
record is checked) and move the queue past a damaged one.
"""
from __future__ import annotations

import os

import orjson
import pytest

from brokerproc import routed_topic, start_broker
from shmq.client.remoting import RemotingClient
from shmq.client.requests import create_topic, decode_records, pull_message, send_message
from shmq.core import layout as L
from shmq.core.records import record_fault
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand


def _flip_body_byte(store: str, phy: int, size: int) -> None:
    """Flip a bit 20 bytes into the body (IPv4 hosts: the body starts at 88)."""
    at = phy + 88 + 20
    assert at < phy + size
    path = os.path.join(store, "commitlog", L.offset_to_file_name(0))
    with open(path, "r+b") as f:          # through the page cache, as the broker maps it
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ 0x10]))


def test_a_damaged_record_is_never_served_and_the_queue_moves_past_it(tmp_path):
    topic = "Damaged"
    with start_broker(tmp_path, accessMessageInMemoryMaxRatio="0") as b, \
            RemotingClient(b.addr) as c:
        assert c.invoke(create_topic(topic, 1)).code == R.SUCCESS
        bodies = [b"message-%02d:" % i + bytes([i]) * 200 for i in range(30)]
        for body in bodies:
            assert c.invoke(send_message(topic, body, queue_id=0)).code == R.SUCCESS
        r = c.invoke(pull_message(topic, 0, 0, max_msgs=32))
        recs = decode_records(r.body)
        assert [m.body for m in recs] == bodies
        bad = recs[10]
        _flip_body_byte(b.store, bad.phy_offset, bad.total_size)

        r = c.invoke(pull_message(topic, 0, 0, max_msgs=32))        # the good ones before it
        assert r.code == R.SUCCESS and r.ext["nextBeginOffset"] == "10"
        assert [m.body for m in decode_records(r.body)] == bodies[:10]
        r = c.invoke(pull_message(topic, 0, 10, max_msgs=32))       # at it: move past it
        assert (r.code, r.ext["nextBeginOffset"]) == (R.PULL_RETRY_IMMEDIATELY, "11")
        r = c.invoke(pull_message(topic, 0, 11, max_msgs=32))       # and everything after it
        assert [m.body for m in decode_records(r.body)] == bodies[11:]

        info = c.invoke(RemotingCommand(RC.GET_BROKER_RUNTIME_INFO))
        table = orjson.loads(info.body)["table"]
        assert int(table["corruptSkipped"]) >= 1
        log = b.log()
        assert "ERROR" in log and f"record at {bad.phy_offset}: body CRC mismatch" in log
        assert "queue offset 10 is skipped" in log


def test_record_fault_names_each_kind_of_damage():
    from shmq.core.records import encode
    batch = encode("T", [b"x" * 100], properties=b"")
    rec = bytearray(batch.buf.tobytes())
    size = len(rec)
    rec[28:36] = (0).to_bytes(8, "big")          # its own offset: 0
    assert record_fault(memoryview(bytes(rec)), 0) is None
    for at, why in ((4, "magic"), (28, "PHYSICALOFFSET"), (size - 20, "body CRC mismatch"),
                    (0, "TOTALSIZE")):
        bad = bytearray(rec)
        bad[at] ^= 0x40
        assert why in record_fault(memoryview(bytes(bad)), 0), at


@pytest.mark.parametrize("listener", ["messages", "batch"])
def test_shmq_consumer_skips_a_damaged_record_it_is_served_and_goes_on(tmp_path, caplog, listener):
    """With the broker's check off (RocketMQ's behaviour) the damaged record
    reaches the consumer: it is left out like a poison message, with an
    ERROR, and the queue goes on; it used to stop that queue for good. A
    batch listener's batch leaves it out the same way."""
    import time

    from shmq.client import ConsumeConcurrentlyStatus, Message, Producer, PushConsumer
    topic = "DamagedForClient"
    with start_broker(tmp_path, checkCRCOnRead="false") as b:
        routed_topic(b, topic, 1)           # the producer must find its one queue, not TBW102's
        bodies = [b"client-%02d:" % i + bytes([i]) * 200 for i in range(20)]
        with Producer("pg-damaged", namesrv_addr=b.namesrv) as p:
            for body in bodies:
                p.send(Message(topic, body))
        with RemotingClient(b.addr) as c:
            recs = decode_records(c.invoke(pull_message(topic, 0, 0, max_msgs=32)).body)
        bad = recs[7]
        _flip_body_byte(b.store, bad.phy_offset, bad.total_size)
        got = []
        consumer = PushConsumer("cg-damaged", namesrv_addr=b.namesrv,
                                consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        consumer.subscribe(topic)
        if listener == "batch":
            consumer.register_batch_listener(
                lambda batch, ctx: (got.extend(batch.bodies()),
                                    ConsumeConcurrentlyStatus.CONSUME_SUCCESS)[1])
        else:
            consumer.register_message_listener(
                lambda msgs, ctx: (got.extend(m.body for m in msgs),
                                   ConsumeConcurrentlyStatus.CONSUME_SUCCESS)[1])
        with caplog.at_level("ERROR", logger="shmq.client"):
            consumer.start()
            deadline = time.monotonic() + 30
            while len(got) < 19 and time.monotonic() < deadline:
                time.sleep(0.05)
            consumer.shutdown()
        assert sorted(got) == sorted(bodies[:7] + bodies[8:])
        assert any("body CRC mismatch" in r.getMessage() and "queue offset 7" in r.getMessage()
                   for r in caplog.records)


def test_the_scrub_finds_damage_in_a_sealed_segment_and_the_next_start_quarantines_it(store_dir,
                                                                                       caplog):
    """Damage in an old segment that no pull reads and recovery does not
    rescan: the scrub finds it, lists it for the workers, and the next start
    sets exactly that record aside (its queue offset never reused)."""
    from conftest import SMALL_SEGMENT, small_config
    from shmq.core.records import encode
    from shmq.core.recovery import DamageLog
    from shmq.core.scrub import Scrubber
    from shmq.core.store import close_clean, open_local
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    recs = []
    for i in range(200):                                   # ~3 segments of 64 KiB
        r = store.append(encode("S", [b"%04d:" % i + bytes([i % 251]) * 900], queue_ids=i % 2,
                                properties=b""))
        recs.append((int(r.phy_offset), int(r.end), i % 2, int(r.queue_offset)))
    bad = next(r for r in recs if r[0] > 1000 and r[1] < SMALL_SEGMENT)   # in the first segment
    seg0 = os.path.join(store_dir, "commitlog", L.offset_to_file_name(0))
    with open(seg0, "r+b") as f:
        f.seek(bad[0] + 88 + 30)
        f.write(b"\xff")
    clock = [0.0]
    scrub = Scrubber(store, cfg, clock=lambda: clock[0])
    with caplog.at_level("ERROR", logger="shmq.store"):
        for _ in range(200):                                # a bounded pass
            clock[0] += 1.0
            scrub.step(0)
            if scrub.pos < 0 and scrub.checked:
                break
    assert scrub.found == 1
    assert [(b_, e_) for b_, e_, _ in DamageLog(store.files, store.root).load()] == [(bad[0], bad[1])]
    assert any(f"no valid record at CommitLog offset {bad[0]}" in r.getMessage()
               for r in caplog.records)
    close_clean(store)
    store, report = open_local(cfg)                         # the scan starts in the last segment
    assert [q.phy for q in report.quarantined] == [bad[0]]
    assert report.quarantined[0].records == [("S", bad[2], bad[3])]
    assert DamageLog(store.files, store.root).load() == []
    for qid in range(2):
        got = [m.queue_offset for m in store.read_queue("S", qid)]
        assert got == [r[3] for r in recs if r[2] == qid and r is not bad]
        assert store.append(encode("S", [b"new"], queue_ids=qid, properties=b"")).queue_offset == \
            len([r for r in recs if r[2] == qid])
    store.close()


def test_a_running_broker_scrubs_and_stops_serving_damage_it_found(tmp_path):
    """Inside the page-cache window pulls do not check records; damage the
    scrub finds there is still never served once the workers read its list."""
    import time
    topic = "Scrubbed"
    with start_broker(tmp_path, mappedFileSizeCommitLog=str(64 * 1024), maxMessageSize="16384",
                      scrubBytesPerSecond=str(1 << 30), scrubPassIntervalHours="0") as b, \
            RemotingClient(b.addr) as c:
        assert c.invoke(create_topic(topic, 1)).code == R.SUCCESS
        bodies = [b"scrub-%03d:" % i + bytes([i % 251]) * 900 for i in range(150)]
        for body in bodies:
            assert c.invoke(send_message(topic, body, queue_id=0)).code == R.SUCCESS
        recs = decode_records(c.invoke(pull_message(topic, 0, 0, max_msgs=32)).body)
        bad = recs[5]                                 # in the first, sealed, segment
        _flip_body_byte(b.store, bad.phy_offset, bad.total_size)
        deadline = time.monotonic() + 60              # the scrub's next pass, then a worker tick
        while True:
            r = c.invoke(pull_message(topic, 0, 5, max_msgs=32))
            if r.code == R.PULL_RETRY_IMMEDIATELY:
                break
            assert time.monotonic() < deadline, b.log()[-3000:]
            time.sleep(0.1)
        assert r.ext["nextBeginOffset"] == "6"
        assert f"scrub: no valid record at CommitLog offset {bad.phy_offset}" in b.log()
        r = c.invoke(pull_message(topic, 0, 0, max_msgs=32))
        assert [m.body for m in decode_records(r.body)] == bodies[:5]
