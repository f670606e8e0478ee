"""``shmq store inspect``: what it reports about stores a real broker and the
store itself wrote, damaged stores (torn tails, flipped bytes, wrong units),
a store being written while it looks (then killed), and that looking never
writes."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from brokerproc import routed_topic, start_broker, until
from conftest import SMALL_SEGMENT, keeps_every_page, small_config
from shmq.client.remoting import RemotingClient
from shmq.client.requests import properties, send_batch, send_message
from shmq.core.layout import CQ_UNIT_BYTES, java_string_hash, offset_to_file_name
from shmq.core.records import encode, properties_bytes
from shmq.core.store import close_clean, open_local
from shmq.ipc.codes import ResponseCode as R
from shmq.tools.cli import main

BODY_OFFSET = 88   # body of a record with IPv4 hosts: after BODYLENGTH at 84


def inspect(capsys, *args):
    code = main(["store", "inspect", *map(str, args)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def inspect_json(capsys, *args):
    code, out, err = inspect(capsys, *args, "--json")
    return code, (json.loads(out) if out.strip() else None), err


def files_state(root) -> dict:
    """Every file under ``root``: size, mtime and content hash."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = (os.stat(p).st_size, os.stat(p).st_mtime_ns,
                                                 hashlib.sha1(f.read()).hexdigest())
    return out


# ------------------------------------------------------- a broker's store
@pytest.fixture(scope="module")
def broker_store(tmp_path_factory):
    """A store a real broker wrote and shut down cleanly: 24 single sends over
    4 queues, a batch of 10 to queue 2, a binary body to queue 3."""
    with start_broker(tmp_path_factory.mktemp("inspect")) as b:
        topic = routed_topic(b, "InspectT", 4)
        sent = []
        with RemotingClient(b.addr) as c:
            for i in range(24):
                body, tags, keys = b"body-%d" % i, f"Tag{i % 3}", [f"key-{i}", "common"]
                r = c.invoke(send_message(topic, body, tags=tags, keys=keys, queue_id=i % 4))
                assert r.code == R.SUCCESS, r.remark
                sent.append({"msg_id": r.ext["msgId"], "queue_id": i % 4, "body": body,
                             "queue_offset": int(r.ext["queueOffset"]), "tags": tags, "keys": keys})
            batch = [(b"batch-%d" % i, properties(tags="TagB", keys=f"bk-{i}")) for i in range(10)]
            r = c.invoke(send_batch(topic, batch, queue_id=2))
            assert r.code == R.SUCCESS, r.remark
            binary = bytes(range(256)) * 4
            r = c.invoke(send_message(topic, binary, tags="Bin", queue_id=3))
            assert r.code == R.SUCCESS, r.remark
            sent.append({"msg_id": r.ext["msgId"], "queue_id": 3, "body": binary,
                         "queue_offset": int(r.ext["queueOffset"]), "tags": "Bin", "keys": []})
        # the next segment, which the flusher makes once the writers are in
        # the first (the summary must not take it for records that stop)
        until(lambda: os.path.exists(os.path.join(b.store, "commitlog",
                                                  offset_to_file_name(16 << 20))),
              "the next segment made ahead")
        assert b.stop() == 0
        return b.store, topic, sent


def test_summary_counts_what_the_broker_stored(capsys, broker_store):
    root, topic, sent = broker_store
    code, doc, _ = inspect_json(capsys, root)
    assert code == 0
    assert not doc["live"] and not doc["abort"] and not doc["unclean_shutdown"]
    counts = {q["queue_id"]: q["count"] for q in doc["queues"] if q["topic"] == topic}
    assert counts == {0: 6, 1: 6, 2: 16, 3: 7}
    seg, ahead = doc["segments"]        # the flusher prepares the next one at once
    assert seg["file"] == offset_to_file_name(0) and seg["size"] == 16 << 20
    assert ahead["file"] == offset_to_file_name(16 << 20) and ahead["records"] == 0
    assert seg["records"] == 35 and seg["first_offset"] == 0 and seg["end_offset"] == doc["max_offset"]
    last = int(sent[-1]["msg_id"][-16:], 16)
    assert seg["last_offset"] == last and doc["min_offset"] == 0
    assert doc["checkpoint"]["commitlog_flushed"] == doc["max_offset"]
    assert seg["first_store_ts"] <= seg["last_store_ts"] == doc["checkpoint"]["physic_msg_timestamp"]
    assert doc["bytes_after_end"] == 0 and sum(f["entries"] for f in doc["index_files"]) >= 35
    code, doc, _ = inspect_json(capsys, root, "--scan-max", "0")    # no walking: no counts
    assert code == 0 and doc["segments"][0]["records"] is None
    assert doc["segments"][0]["first_store_ts"] == seg["first_store_ts"]
    code, out, _ = inspect(capsys, root)
    assert code == 0 and "offline, clean shutdown" in out and "35 messages" in out
    assert f"{topic}  2      0    16   16" in out


def test_decode_at_an_offset_gives_what_was_sent(capsys, broker_store):
    root, topic, sent = broker_store
    for s in (sent[5], sent[-1]):
        phy = int(s["msg_id"][-16:], 16)
        code, m, _ = inspect_json(capsys, root, "--offset", phy, "--body", -1)
        assert code == 0
        assert (m["topic"], m["queue_id"], m["queue_offset"]) == (topic, s["queue_id"], s["queue_offset"])
        assert m["msg_id"] == s["msg_id"] and m["tags"] == s["tags"] and m["keys"] == s["keys"]
        assert m["body_crc_ok"] and m["body_bytes"] == len(s["body"]) and not m["body_truncated"]
        body = m["body"].encode() if m["body_encoding"] == "utf-8" else bytes.fromhex(m["body"])
        assert body == s["body"]
    # by message id, as text
    code, out, _ = inspect(capsys, root, "--offset", sent[5]["msg_id"])
    assert code == 0 and "body-5" in out and sent[5]["msg_id"] in out and "key-5 common" in out


def test_a_queue_range_is_read_through_its_consume_queue(capsys, broker_store):
    root, topic, _ = broker_store
    code, doc, _ = inspect_json(capsys, root, "-t", topic, "-q", 2, "--from", 6, "--count", 4)
    assert code == 0 and (doc["min_offset"], doc["max_offset"], doc["from"]) == (0, 16, 6)
    msgs = doc["messages"]
    assert [m["queue_offset"] for m in msgs] == [6, 7, 8, 9]
    assert [m["body"] for m in msgs] == ["batch-0", "batch-1", "batch-2", "batch-3"]
    assert all(m["tags"] == "TagB" and "problem" not in m and m["body_crc_ok"] for m in msgs)
    assert msgs[1]["keys"] == ["bk-1"]
    code, out, _ = inspect(capsys, root, "-t", topic, "-q", 2, "--from", 14)
    assert code == 0 and "batch-8" in out and "batch-9" in out and ": 2 records" in out
    code, doc, _ = inspect_json(capsys, root, "--queues", "-t", topic)
    assert code == 0 and [q["queue_id"] for q in doc["queues"]] == [0, 1, 2, 3]
    assert all(q["first_store_ts"] <= q["last_store_ts"] for q in doc["queues"])


def test_errors_are_one_line_and_an_exit_code(capsys, broker_store, tmp_path):
    root, topic, sent = broker_store
    phy = int(sent[3]["msg_id"][-16:], 16)
    cases = [
        ((tmp_path,), 2, "not a store"),
        ((root, "--offset", phy + 7), 1, f"inside the record at {phy}"),
        ((root, "--offset", 1 << 40), 1, "outside the CommitLog"),
        ((root, "--offset", "xyz"), 2, "not an offset"),
        # a producer's msgId (UNIQ_KEY: 32 hex digits, as an offset msgId)
        ((root, "--offset", "7F000001392474F96E9005DDF9F60000"), 1,
         "if a producer printed it, it is its UNIQ_KEY: shmq admin queryMsgByUniqueKey"),
        (("",), 2, "STORE_DIR is empty"),
        ((root, "-t", "NoSuchTopic"), 1, "no topic 'NoSuchTopic'"),
        ((root, "-t", topic, "-q", 9), 1, "has no queue 9"),
        ((root, "-t", topic, "-q", 0, "--from", 99), 1, "holds queue offsets [0, 6)"),
        ((root, "-q", 0), 2, "-q needs -t"),
        ((root, "--count", 3), 2, "go with -t TOPIC -q QID"),
    ]
    for args, want_code, text in cases:
        code, out, err = inspect(capsys, *args)
        assert (code, out) == (want_code, ""), (args, err)
        assert text in err and err.count("\n") == 1, (args, err)


def test_inspecting_never_writes_a_byte(capsys, broker_store):
    root, topic, _sent = broker_store
    before = files_state(root)
    time.sleep(0.01)   # an mtime written now would differ
    for args in ([], ["--queues"], ["--offset", 0], ["-t", topic, "-q", 1, "-v"], ["--verify"],
                 ["--json"], ["--verify", "--json"]):
        assert inspect(capsys, root, *args)[0] == 0
    assert files_state(root) == before


def test_the_command_is_installed_and_verifies_the_broker_store(broker_store):
    root, _, _ = broker_store
    r = subprocess.run([sys.executable, "-m", "shmq.tools", "store", "inspect", root, "--verify"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert "35 records" in r.stdout and "4 queues, 35 units" in r.stdout and r.stdout.endswith("OK\n")


# --------------------------------------------------- stores written directly
def write_store(root: str, n: int = 150, body_bytes: int = 900):
    """``n`` records over 2 queues in 64 KiB segments (3 segments); returns
    each record's (phy, queue_id, queue_offset, body)."""
    store, _ = open_local(small_config(root))
    out = []
    for i in range(n):
        body = (b"%05d" % i) * (body_bytes // 5)
        r = store.append(encode("TopicS", [body], queue_ids=i % 2,
                                properties=properties_bytes(tags=f"t{i % 3}", keys=f"k{i}")))
        out.append((int(r.rec_phy[0]), i % 2, r.queue_offset, body))
    end = store.state.write_pos
    close_clean(store)
    return out, end


def patch(root: str, phy: int, data: bytes) -> None:
    seg = phy - phy % SMALL_SEGMENT
    with open(os.path.join(root, "commitlog", offset_to_file_name(seg)), "r+b") as f:
        f.seek(phy - seg)
        f.write(data)


def recovered_end(root: str) -> int:
    store, rep = open_local(small_config(root))
    close_clean(store)
    return rep.end


@pytest.mark.parametrize("tail", ["garbage", "half_record"])
def test_a_torn_tail_is_the_end_not_an_error(capsys, store_dir, tail):
    recs, end = write_store(store_dir)
    if tail == "garbage":
        junk = np.random.default_rng(7).integers(1, 256, 300, dtype=np.uint8).tobytes()
    else:
        rec = encode("TopicS", [b"y" * 900], properties=properties_bytes(tags="t"))
        junk = rec.buf.tobytes()[:rec.nbytes // 2]
    patch(store_dir, end, junk)
    code, doc, _ = inspect_json(capsys, store_dir)
    assert code == 0 and doc["max_offset"] == end and doc["bytes_after_end"] == len(junk)
    assert sum(s["records"] for s in doc["segments"]) == len(recs)
    code, out, _ = inspect(capsys, store_dir)
    assert code == 0 and f"past the end: {len(junk)} nonzero bytes" in out
    code, doc, _ = inspect_json(capsys, store_dir, "--verify")
    c = doc["commitlog"]
    assert code == 0 and doc["ok"] and c["end"] == end and c["records"] == len(recs)
    assert c["bytes_after_end"] == len(junk) and "valid_records_after_end" not in c
    code, out, _ = inspect(capsys, store_dir, "--verify")
    assert code == 0 and f"data ends at {end}: " in out and f"{len(junk)} bytes of a torn write" in out
    assert recovered_end(store_dir) == end     # and recovery agrees on where the data ends


def test_a_flipped_body_byte_is_named_with_its_offset_and_segment(capsys, store_dir):
    recs, end = write_store(store_dir)
    phy = recs[40][0]                               # in the first of three segments
    assert phy < SMALL_SEGMENT < end - SMALL_SEGMENT
    patch(store_dir, phy + BODY_OFFSET + 3, b"\xff")
    assert inspect(capsys, store_dir)[0] == 0       # the summary walks no CRCs
    code, doc, _ = inspect_json(capsys, store_dir, "--verify")
    bad = doc["commitlog"]["first_bad"]
    assert code == 1 and not doc["ok"]
    assert (bad["offset"], bad["segment"]) == (phy, offset_to_file_name(0))
    assert "body CRC mismatch" in bad["problem"] and bad["queue_offset"] == recs[40][2]
    assert doc["commitlog"]["records"] == 40 and doc["consumequeue"]["first_bad"] is None
    code, out, _ = inspect(capsys, store_dir, "--verify")
    assert code == 1 and f"BAD RECORD    at offset {phy} (segment {offset_to_file_name(0)}" in out
    assert out.endswith("FAILED\n")
    code, m, _ = inspect_json(capsys, store_dir, "--offset", phy)   # still decodable, CRC flagged
    assert code == 0 and not m["body_crc_ok"]


def test_a_broken_record_below_the_flushed_position_is_an_error_and_not_the_end(capsys, store_dir):
    """Recovery quarantines it and keeps the 9 records after it: the data
    ends where it will, and --verify names the broken record."""
    recs, end = write_store(store_dir)              # closed clean: everything flushed
    phy = recs[-10][0]                              # in the last segment, 9 records follow
    patch(store_dir, phy + 4, b"\0\0\0\0")          # its magic
    code, doc, _ = inspect_json(capsys, store_dir)
    assert code == 0 and doc["max_offset"] == end and doc["bytes_after_end"] == 0
    code, doc, _ = inspect_json(capsys, store_dir, "--verify")
    c = doc["commitlog"]
    assert code == 1 and c["first_bad"]["offset"] == phy


def test_valid_records_after_a_broken_one_past_the_flushed_position_are_an_error(capsys, store_dir):
    recs, _end = write_store(store_dir)
    os.unlink(os.path.join(store_dir, "checkpoint"))   # nothing known flushed: a torn write
    phy = recs[-10][0]                              # in the last segment, 9 records follow
    patch(store_dir, phy + 4, b"\0\0\0\0")          # its magic
    code, doc, _ = inspect_json(capsys, store_dir)
    assert code == 0 and doc["max_offset"] == phy and doc["bytes_after_end"] > 0
    code, doc, _ = inspect_json(capsys, store_dir, "--verify")
    c = doc["commitlog"]
    assert code == 1 and c["first_bad"]["offset"] == phy
    assert c["valid_records_after_end"] == {"offset": recs[-9][0], "records": 9}
    assert "recovery would cut them off" in c["first_bad"]["problem"]


def test_a_wrong_consume_queue_unit_is_named(capsys, store_dir):
    recs, _end = write_store(store_dir)
    cq = os.path.join(store_dir, "consumequeue", "TopicS", "1", offset_to_file_name(0))
    with open(cq, "r+b") as f:                       # unit 7 of queue 1: one byte into its record
        f.seek(7 * CQ_UNIT_BYTES)
        f.write((recs[15][0] + 1).to_bytes(8, "big"))
    code, doc, _ = inspect_json(capsys, store_dir, "--verify")
    bad = doc["consumequeue"]["first_bad"]
    assert code == 1 and doc["commitlog"]["first_bad"] is None
    assert (bad["topic"], bad["queue_id"], bad["queue_offset"]) == ("TopicS", 1, 7)
    assert bad["unit"]["offset"] == recs[15][0] + 1 and f"is at {recs[15][0]}" in bad["problem"]
    code, doc, _ = inspect_json(capsys, store_dir, "-t", "TopicS", "-q", 1, "--from", 7, "--count", 1)
    assert code == 0 and "inside the record at" in doc["messages"][0]["problem"]


def test_tags_codes_are_checked_and_delivery_times_must_be_times(capsys, store_dir):
    store, _ = open_local(small_config(store_dir))
    store.append(encode("TopicS", [b"a"], properties=properties_bytes(tags="t1")))
    delayed = encode("SCHEDULE_TOPIC_XXXX", [b"later"], queue_ids=2,
                     properties=properties_bytes({"DELAY": "3", "REAL_TOPIC": "TopicS"}))
    delayed.tags_codes[:] = int(time.time() * 1000) + 10_000     # as the broker routes it
    store.append(delayed)
    close_clean(store)
    assert inspect(capsys, store_dir, "--verify")[0] == 0

    def set_tags_code(topic, qid, code):
        path = os.path.join(store_dir, "consumequeue", topic, str(qid), offset_to_file_name(0))
        with open(path, "r+b") as f:
            f.seek(12)
            f.write(code.to_bytes(8, "big", signed=True))

    set_tags_code("TopicS", 0, 12345)
    code, doc, _ = inspect_json(capsys, store_dir, "--verify")
    assert code == 1 and "TAGS hash to" in doc["consumequeue"]["first_bad"]["problem"]
    set_tags_code("TopicS", 0, java_string_hash("t1"))   # right again
    set_tags_code("SCHEDULE_TOPIC_XXXX", 2, 0)       # a delay unit whose time was lost
    code, doc, _ = inspect_json(capsys, store_dir, "--verify")
    bad = doc["consumequeue"]["first_bad"]
    assert code == 1 and (bad["topic"], bad["queue_id"]) == ("SCHEDULE_TOPIC_XXXX", 2)
    assert "not a delivery time" in bad["problem"]


def test_an_empty_preallocated_next_segment_is_not_data(capsys, store_dir):
    _recs, end = write_store(store_dir, n=40)        # about 36 KiB of one 64 KiB segment
    with open(os.path.join(store_dir, "commitlog", offset_to_file_name(SMALL_SEGMENT)), "wb") as f:
        f.truncate(SMALL_SEGMENT)                   # what the flusher makes past half a segment
    code, doc, _ = inspect_json(capsys, store_dir)
    assert code == 0 and doc["max_offset"] == end and len(doc["segments"]) == 2
    assert doc["segments"][1]["records"] == 0
    code, doc, _ = inspect_json(capsys, store_dir, "--verify")
    assert code == 0 and doc["commitlog"]["records"] == 40 and doc["consumequeue"]["units"] == 40


def test_the_summary_calls_the_preallocated_segment_empty_not_records_stopping_short(capsys,
                                                                                     store_dir):
    _recs, end = write_store(store_dir, n=40)
    with open(os.path.join(store_dir, "commitlog", offset_to_file_name(SMALL_SEGMENT)), "wb") as f:
        f.truncate(SMALL_SEGMENT)
    code, out, _ = inspect(capsys, store_dir)
    assert code == 0 and "records stop" not in out and "before the end of the data" not in out
    assert f"{offset_to_file_name(SMALL_SEGMENT)}: empty, made ahead for the records to come" in out
    code, doc, _ = inspect_json(capsys, store_dir)
    assert "problem" not in doc["segments"][1] and doc["segments"][1]["records"] == 0


# ----------------------------------------------------------- a live broker
def test_beside_a_live_broker_it_sees_only_whole_records(capsys, tmp_path):
    with start_broker(tmp_path, mappedFileSizeCommitLog=1 << 20, maxMessageSize=65536) as b:
        topic = routed_topic(b, "LiveT", 2)
        sent, stop, errors = [0], threading.Event(), []

        def produce():
            batch = [(b"m" * 700 + b"%04d" % i, properties(tags="L")) for i in range(32)]
            with RemotingClient(b.addr) as c:
                while not stop.is_set():
                    r = c.invoke(send_batch(topic, batch, queue_id=sent[0] % 2), timeout=60)
                    if r.code != R.SUCCESS:
                        errors.append(r.remark)
                        return
                    time.sleep(0.002)
                    sent[0] += 32

        t = threading.Thread(target=produce)
        t.start()
        try:
            seen, deadline, rounds = 0, time.monotonic() + 3, 0
            while time.monotonic() < deadline or rounds < 3:
                code, v, _ = inspect_json(capsys, b.store, "--verify")
                assert code == 0 and v["live"] and v["ok"], v
                assert v["commitlog"]["records"] >= seen
                seen = v["commitlog"]["records"]
                code, s, _ = inspect_json(capsys, b.store)
                assert code == 0 and s["live"] and s["lock_holder_pid"] == b.proc.pid
                q0 = next((q for q in s["queues"] if (q["topic"], q["queue_id"]) == (topic, 0)), None)
                if q0 is not None and q0["count"]:
                    code, r, _ = inspect_json(capsys, b.store, "-t", topic, "-q", 0,
                                              "--from", max(0, q0["max_offset"] - 40))
                    assert code == 0 and all("problem" not in m and m["body_crc_ok"]
                                             for m in r["messages"])
                rounds += 1
        finally:
            stop.set()
            t.join()
        assert not errors and seen > 0, (errors, b.log()[-3000:])
        code, s, _ = inspect_json(capsys, b.store)
        assert sum(q["count"] for q in s["queues"] if q["topic"] == topic) == sent[0]
        assert len(s["segments"]) > 2                 # it rolled segments while we looked
        b.kill9()
    code, s, _ = inspect_json(capsys, b.store)
    assert code == 0 and not s["live"] and s["unclean_shutdown"]
    code, v, _ = inspect_json(capsys, b.store, "--verify")
    assert code == 0 and not v["live"] and v["commitlog"]["records"] == sent[0]


@pytest.mark.parametrize("made_ahead", [False, True], ids=["alone", "next-made-ahead"])
def test_a_truncated_last_segment_is_reported_as_what_the_next_start_repairs(capsys, tmp_path,
                                                                             made_ahead):
    """Also when the flusher had made the next segment (empty) ahead of the
    writers: the cut one is still where they were, losing only its tail."""
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from conftest import SMALL_SEGMENT, small_config
    from shmq.core.records import encode
    from shmq.core.store import close_clean, open_local
    root = str(tmp_path / "cut")
    store, _ = open_local(small_config(root))
    phys = [int(store.append(encode("Cut", [b"m" * 500], properties=b"")).phy_offset) for _ in range(20)]
    close_clean(store)
    if made_ahead:
        with open(os.path.join(root, "commitlog", f"{SMALL_SEGMENT:020d}"), "wb") as f:
            f.truncate(SMALL_SEGMENT)
    seg = os.path.join(root, "commitlog", f"{0:020d}")
    os.truncate(seg, phys[12] + 77)
    before = (os.path.getsize(seg), os.stat(seg).st_mtime_ns)
    code, out, err = inspect(capsys, root)
    assert code == 0, err
    assert f"short: {phys[12] + 77} bytes of" in out and "next start repairs it" in out
    assert "its records past the cut are truncated" in out
    assert "differs from the store's" not in out + err
    assert (os.path.getsize(seg), os.stat(seg).st_mtime_ns) == before   # read-only
    store, report = open_local(small_config(root))
    assert report.segments_repaired and len(store.read_queue("Cut", 0)) == 12
    assert SMALL_SEGMENT == os.path.getsize(seg)


def test_a_store_whose_only_segment_is_cut_to_a_few_bytes_is_inspected_not_a_hang(capsys,
                                                                                  tmp_path):
    """The segment size of a store with one segment is read from its file:
    cut to 3 bytes, that made a 3-byte segment, and the read-ahead of the
    scan for the end walked its 32 MiB in 3-byte segments (11 M steps, each
    a file lookup): the inspector never finished. A segment size is whole
    pages (StoreConfig), and the scan reads ahead within its segment."""
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from conftest import small_config
    from shmq.core.records import encode
    from shmq.core.store import close_clean, open_local
    root = str(tmp_path / "cut3")
    store, _ = open_local(small_config(root))
    for _ in range(5):
        store.append(encode("Cut", [b"m" * 100], properties=b""))
    close_clean(store)
    seg = os.path.join(root, "commitlog", f"{0:020d}")
    os.truncate(seg, 3)
    code, out, err = inspect(capsys, root)
    assert code == 0, err
    assert "short: 3 bytes of 4096" in out and "next start repairs it" in out


def test_verify_names_a_short_middle_segment_as_what_the_next_start_repairs(capsys, tmp_path):
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from conftest import small_config
    from shmq.core.records import encode
    from shmq.core.store import close_clean, open_local
    root = str(tmp_path / "cutmid")
    store, _ = open_local(small_config(root))
    for _ in range(300):                              # > 2 segments of 64 KiB
        store.append(encode("Cut", [b"m" * 500], properties=b""))
    close_clean(store)
    first = os.path.join(root, "commitlog", f"{0:020d}")
    os.truncate(first, 30_000)
    code, out, _ = inspect(capsys, root, "--verify")
    assert code == 1
    assert f"segment {0:020d}: short: 30000 bytes of" in out and "next start repairs it" in out
    assert os.path.getsize(first) == 30_000                              # read-only


def test_looking_past_the_end_leaves_the_rest_of_the_segment_out_of_the_page_cache(capsys, tmp_path):
    """The summary and --verify look for a torn tail as recovery does,
    reading only what may hold data: the preallocated zeros of the rest of
    the segment stay out of the page cache, where they would count as data
    and the broker's next start would read them all (a 1 GiB segment after
    an inspect: 1 GiB read past the end, 2.5 s of a start)."""
    import mmap
    from shmq.core.files import REAL_FILES
    if keeps_every_page(tmp_path):                    # tmpfs: its pages are the file
        pytest.skip("the store's file system keeps every page in memory (tmpfs): no page cache "
                    "to leave the preallocated zeros out of")
    seg = 64 << 20                                    # beyond any read-around (8 MiB here)
    root = str(tmp_path / "store")
    store, _ = open_local(small_config(root, mappedFileSizeCommitLog=seg))
    for i in range(20):
        store.append(encode("TopicS", [b"%05d" % i * 20], queue_ids=i % 2, properties=b""))
    end = store.state.write_pos
    close_clean(store)
    path = os.path.join(root, "commitlog", offset_to_file_name(0))

    def cached_far() -> np.ndarray:                   # pages well past the records' read-around
        h = REAL_FILES.open(path, writable=False)
        try:
            return REAL_FILES.cached(h, 0, h.size)[(end + (16 << 20)) // mmap.PAGESIZE:].copy()
        finally:
            REAL_FILES.close(h)

    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    for args in ((), ("--verify",)):
        code, out, _ = inspect(capsys, root, *args)
        assert code == 0 and "past the end" not in out, out
        assert not cached_far().any(), args
