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

from brokerproc import start_broker
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


def test_shmq_consumer_skips_a_damaged_record_it_is_served_and_goes_on(tmp_path, caplog):
    """With the broker's check off (RocketMQ's behaviour) the damaged record
    reaches the consumer: it is left out like a poison message, with an
    ERROR, and the queue goes on; it used to stop that queue for good."""
    import time

    from shmq.client import ConsumeConcurrentlyStatus, Message, Producer, PushConsumer
    topic = "DamagedForClient"
    with start_broker(tmp_path, checkCRCOnRead="false") as b:
        with RemotingClient(b.addr) as c:
            assert c.invoke(create_topic(topic, 1)).code == R.SUCCESS
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
