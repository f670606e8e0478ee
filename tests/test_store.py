"""The store in one process, on real files: what an appender and a reader see."""
from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import SMALL_CQ_UNITS, SMALL_SEGMENT, small_config
from shmq.core import layout as L
from shmq.core.checkpoint import (Checkpoint, ConfigFileError, abort_path, config_path, load_table,
                                  save_table)
from shmq.core.files import REAL_FILES
from shmq.core.records import decode, encode, properties_bytes
from shmq.core.state import StoreFullError
from shmq.core.store import GetMessageStatus as S
from shmq.core.store import close_clean, open_local


def put(store, topic, bodies, qid=0, tags=None, keys=None, **kw):
    return store.append(encode(topic, bodies, queue_ids=qid,
                               properties=properties_bytes({"a": "1"}, tags=tags, keys=keys), **kw))


def codes(*tags):
    return np.array(sorted(L.tags_code(t) for t in tags), dtype=np.int64)


def test_append_then_read_back_every_field(store_dir):
    store, report = open_local(small_config(store_dir))
    assert report.mode == "new"
    r = put(store, "TopicA", [b"first", b"second"], qid=2, tags="TagA", keys=["k1", "k2"],
            flag=7, born_timestamp=1700000000000, born_host=("10.0.0.9", 5555),
            store_host=("127.0.0.1", 10911))
    assert (r.phy_offset, r.queue_offset, r.count) == (0, 0, 2)
    msgs = store.read_queue("TopicA", 2)
    assert [m.body for m in msgs] == [b"first", b"second"]
    m = msgs[1]
    assert (m.topic, m.queue_id, m.queue_offset, m.flag) == ("TopicA", 2, 1, 7)
    assert m.phy_offset == int(r.rec_phy[1])
    assert m.born_timestamp == 1700000000000 and m.born_host == ("10.0.0.9", 5555)
    assert m.store_host == ("127.0.0.1", 10911) and m.store_timestamp == r.store_timestamp
    assert m.tags == "TagA" and m.keys == ["k1", "k2"] and m.properties["a"] == "1"
    assert m.offset_msg_id() == "7F00000100002A9F" + f"{m.phy_offset:016X}"
    assert store.max_offset("TopicA", 2) == 2 and store.min_offset("TopicA", 2) == 0
    close_clean(store)


def test_short_writes_are_completed_whatever_the_buffer(store_dir, monkeypatch):
    """The file layer finishes a write the kernel took in part (a signal, a
    disk nearly full): records of single sends (a bytearray each), batches
    (a uint8 array), the blank at a segment's end (bytes) and ConsumeQueue
    units all land whole when every pwrite takes at most 7 bytes."""
    import shmq.core.files as files
    from shmq.core.records import encode_record, host_raw
    store, _ = open_local(small_config(store_dir))
    real = os.pwrite
    monkeypatch.setattr(files.os, "pwrite",
                        lambda fd, data, off: real(fd, memoryview(data).cast("B")[:7], off))
    host = host_raw("127.0.0.1", 10911)
    bodies = [bytes([65 + i % 26]) * (100 + 37 * i) for i in range(80)]   # past a segment's end
    for i, body in enumerate(bodies):
        if i % 2:
            put(store, "Short", [body], tags="T")
        else:
            rec = encode_record(b"Short", body, b"TAGS\x01T", 0, 0, 0, 1, host, host, 2, 0, 0, 1 << 20)
            store.append_record("Short", 0, rec, L.tags_code("T"), 2)
    monkeypatch.setattr(files.os, "pwrite", real)
    msgs = store.read_queue("Short", 0)
    assert [m.body for m in msgs] == bodies and [m.queue_offset for m in msgs] == list(range(80))
    assert len({m.phy_offset // SMALL_SEGMENT for m in msgs}) > 1
    close_clean(store)
    store, report = open_local(small_config(store_dir))     # and recovery finds them whole
    assert [m.body for m in store.read_queue("Short", 0)] == bodies
    close_clean(store)


def test_segments_roll_with_a_blank_record_and_never_split_a_record(store_dir):
    store, _ = open_local(small_config(store_dir))
    body = b"x" * 1000
    for i in range(200):   # ~220 KB: four 64 KiB segments
        put(store, "Roll", [body], tags=f"t{i}")
    names = sorted(os.listdir(os.path.join(store_dir, "commitlog")))
    assert names[:4] == [f"{i * SMALL_SEGMENT:020d}" for i in range(4)]
    assert all(os.path.getsize(os.path.join(store_dir, "commitlog", n)) == SMALL_SEGMENT
               for n in names)
    msgs = store.read_queue("Roll", 0)
    assert len(msgs) == 200 and [m.queue_offset for m in msgs] == list(range(200))
    for seg in range(3):
        start = seg * SMALL_SEGMENT
        last = max((m for m in msgs if start <= m.phy_offset < start + SMALL_SEGMENT),
                   key=lambda m: m.phy_offset)
        assert last.phy_offset + last.total_size <= start + SMALL_SEGMENT  # never straddles
        blank_at = last.phy_offset + last.total_size
        raw = store.cl.read(blank_at, 8)
        size, magic = np.frombuffer(raw, ">i4")
        assert magic == L.BLANK_MAGIC_I32 and blank_at + size == start + SMALL_SEGMENT
    close_clean(store)


def test_get_message_answers_each_rocketmq_status(store_dir):
    store, _ = open_local(small_config(store_dir))
    assert store.get_message("Nope", 0, 0, 32).status is S.NO_MATCHED_LOGIC_QUEUE
    # a queue that only ever saw a prepared (half) transaction message has no units
    put(store, "Half", [b"h"], sysflag=L.SYSFLAG_TRANSACTION_PREPARED)
    assert store.get_message("Half", 0, 0, 32).status is S.NO_MESSAGE_IN_QUEUE
    for i in range(10):
        put(store, "Q", [b"m%d" % i], tags="A" if i % 2 else "B")
    r = store.get_message("Q", 0, 0, 4)
    assert (r.status, r.count, r.next_offset, r.min_offset, r.max_offset) == (S.FOUND, 4, 4, 0, 10)
    assert store.get_message("Q", 0, 10, 4).status is S.OFFSET_OVERFLOW_ONE
    r = store.get_message("Q", 0, 11, 4)
    assert (r.status, r.next_offset) == (S.OFFSET_OVERFLOW_BADLY, 0)  # minOffset 0: back to it
    # tag filter: only A (odd), next offset past everything scanned
    r = store.get_message("Q", 0, 0, 32, codes("A"))
    assert r.status is S.FOUND and r.next_offset == 10
    assert [store.read_message(int(p)).body for p in r.phys] == [b"m1", b"m3", b"m5", b"m7", b"m9"]
    r = store.get_message("Q", 0, 0, 32, codes("C"))
    assert (r.status, r.next_offset) == (S.NO_MATCHED_MESSAGE, 10)
    # byte limit: the first message always, then stop before the limit
    r = store.get_message("Q", 0, 0, 32, max_bytes=1)
    assert (r.status, r.count, r.next_offset) == (S.FOUND, 1, 1)


def test_untagged_messages_do_not_match_a_tag_subscription(store_dir):
    store, _ = open_local(small_config(store_dir))
    put(store, "T", [b"untagged"])
    put(store, "T", [b"tagged"], tags="A")
    r = store.get_message("T", 0, 0, 32, codes("A"))
    assert [store.read_message(int(p)).body for p in r.phys] == [b"tagged"]
    assert store.get_message("T", 0, 0, 32).count == 2


def test_transaction_half_and_rollback_records_get_no_queue_offset(store_dir):
    store, _ = open_local(small_config(store_dir))
    r = store.append(encode("Tx", [b"half", b"plain", b"rollback", b"commit"], properties=b"",
                            sysflag=[L.SYSFLAG_TRANSACTION_PREPARED, 0,
                                     L.SYSFLAG_TRANSACTION_ROLLBACK, L.SYSFLAG_TRANSACTION_COMMIT]))
    assert [m.body for m in store.read_queue("Tx", 0)] == [b"plain", b"commit"]
    half = store.read_message(int(r.rec_phy[0]))
    assert half.queue_offset == 0 and half.body == b"half"
    assert store.max_offset("Tx", 0) == 2


def test_restart_after_clean_shutdown_continues_offsets(store_dir):
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    for i in range(300):
        put(store, "R", [b"before-%d" % i], qid=i % 3)
    end = store.state.write_pos
    close_clean(store)
    assert not os.path.exists(abort_path(store_dir))
    store, report = open_local(cfg)
    assert report.mode == "normal" and report.end == end
    assert (report.bytes_truncated, report.units_rebuilt, report.units_dropped) == (0, 0, 0)
    r = put(store, "R", [b"after"], qid=1)
    assert r.queue_offset == 100 and r.phy_offset == end
    assert [m.body for m in store.read_queue("R", 1)][-2:] == [b"before-298", b"after"]
    close_clean(store)


def test_without_clean_shutdown_the_next_open_is_abnormal(store_dir):
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    put(store, "A", [b"x"])
    store.close()   # no close_clean: abort stays
    store, report = open_local(cfg)
    assert report.mode == "abnormal"
    assert [m.body for m in store.read_queue("A", 0)] == [b"x"]


def test_ten_thousand_queues(store_dir):
    cfg = small_config(store_dir, mappedFileSizeCommitLog=1 << 20)
    store, _ = open_local(cfg)
    for q in range(10_000):
        put(store, f"T{q % 10}", [b"a", b"b"], qid=q)
    close_clean(store)
    store, report = open_local(cfg)
    assert report.units_rebuilt == 0
    assert all(store.max_offset(f"T{q % 10}", q) == 2 for q in range(10_000))
    assert store.read_queue("T7", 9997)[1].body == b"b"
    close_clean(store)


def test_queue_table_full_is_a_clear_error(store_dir):
    store, _ = open_local(small_config(store_dir, maxQueueSlots=4))
    for q in range(4):
        put(store, "F", [b"x"], qid=q)
    with pytest.raises(StoreFullError, match="maxQueueSlots"):
        put(store, "F", [b"x"], qid=4)
    assert store.max_offset("F", 3) == 1   # nothing else disturbed


def test_a_queue_made_by_another_process_is_found_after_a_lookup_missed_it(store_dir):
    """A lookup of a queue with no slot is remembered (a consumer looks at
    its empty retry queue every wake-up) only until a slot is made: a
    second view of the same shared state — another process — makes it,
    and the first view finds it at once."""
    from shmq.core.state import StoreState
    store, _ = open_local(small_config(store_dir))
    put(store, "Made", [b"x"])
    st = store.state
    other = StoreState.over(st._buf, st.lock_impl)
    assert st.queue_slot("Late", 0) == -1 and st.queue_slot("Late", 0) == -1
    slot = other.queue_slot_create("Late", 0)
    assert st.queue_slot("Late", 0) == slot >= 0
    assert store.max_offset("Late", 0) == 0


def test_consumequeue_files_roll_at_units_per_file(store_dir):
    store, _ = open_local(small_config(store_dir))
    for i in range(250):
        put(store, "C", [b"%d" % i])
    qdir = os.path.join(store_dir, "consumequeue", "C", "0")
    assert sorted(os.listdir(qdir)) == [f"{i * SMALL_CQ_UNITS * 20:020d}" for i in range(3)]
    assert [m.body for m in store.read_queue("C", 0, 95, 10)] == [b"%d" % i for i in range(95, 105)]


def test_batch_rules(store_dir):
    store, _ = open_local(small_config(store_dir))
    with pytest.raises(ValueError, match="one queue"):
        store.append(encode("M", [b"a", b"b"], queue_ids=[0, 1]))
    with pytest.raises(ValueError, match="does not fit"):
        store.append(encode("M", [b"x" * 8000] * 9))


def test_config_tables_are_replaced_atomically_with_a_bak(store_dir):
    save_table(REAL_FILES, store_dir, "consumerOffset.json", {"offsetTable": {"T@g": {"0": 1}}})
    save_table(REAL_FILES, store_dir, "consumerOffset.json", {"offsetTable": {"T@g": {"0": 2}}})
    path = config_path(store_dir, "consumerOffset.json")
    assert load_table(REAL_FILES, store_dir, "consumerOffset.json")["offsetTable"]["T@g"]["0"] == 2
    with open(path, "w") as f:
        f.write('{"offsetTable": {"T@g": {0: ')   # torn write of the main file
    assert load_table(REAL_FILES, store_dir, "consumerOffset.json")["offsetTable"]["T@g"]["0"] == 1
    with open(path, "w") as f:   # fastjson's unquoted numeric keys (a RocketMQ store)
        f.write('{"offsetTable":{"T@g":{0:5280,1:5312}}}')
    assert load_table(REAL_FILES, store_dir, "consumerOffset.json")["offsetTable"]["T@g"] == \
        {"0": 5280, "1": 5312}
    with open(path + ".bak", "w") as f:
        f.write("garbage")
    with open(path, "w") as f:
        f.write("garbage")
    with pytest.raises(ConfigFileError, match="consumerOffset.json"):
        load_table(REAL_FILES, store_dir, "consumerOffset.json")
    assert load_table(REAL_FILES, store_dir, "topics.json") == {"topicConfigTable": {}}


def test_checkpoint_layout_is_rocketmq_compatible(store_dir):
    Checkpoint(physic_ts=1700000000001, logics_ts=1700000000002, index_ts=3,
               cl_flushed=4096, cq_flushed=2048).save(REAL_FILES, store_dir)
    raw = open(os.path.join(store_dir, "checkpoint"), "rb").read()
    assert len(raw) == 4096
    longs = np.frombuffer(raw[:64], ">i8")
    assert list(longs[:3]) == [1700000000001, 1700000000002, 3]
    assert list(longs[6:8]) == [4096, 2048]
    ck = Checkpoint.load(REAL_FILES, store_dir)
    assert (ck.cl_flushed, ck.cq_flushed) == (4096, 2048)


def test_records_on_disk_decode_as_rocketmq_records(store_dir):
    """The bytes in the segment file are the record format, nothing else."""
    store, _ = open_local(small_config(store_dir))
    r = put(store, "Disk", [b"payload"], tags="T")
    close_clean(store)
    raw = open(os.path.join(store_dir, "commitlog", f"{0:020d}"), "rb").read()
    m = decode(raw, int(r.rec_phy[0]))
    assert (m.magic, m.body, m.topic, m.tags) == (L.MESSAGE_MAGIC_I32, b"payload", "Disk", "T")
    cq = open(os.path.join(store_dir, "consumequeue", "Disk", "0", f"{0:020d}"), "rb").read()
    unit = np.frombuffer(cq[:20], L.CQ_UNIT_DTYPE)[0]
    assert (int(unit["phy_offset"]), int(unit["size"]), int(unit["tags_code"])) == \
        (m.phy_offset, m.total_size, L.tags_code("T"))


def test_an_append_that_fails_midway_leaves_nothing_behind(store_dir):
    """A write error after part of the batch reached the file (say ENOSPC on
    a new ConsumeQueue file): the caller sees the error and no byte of the
    failed batch survives for recovery to mistake for records."""
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    put(store, "E", [b"before"])
    end = store.state.write_pos
    real_put = store.cqs.put
    calls = []

    def failing_put(*a, **kw):   # the append's unit write fails; the roll-back's works
        calls.append(a)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real_put(*a, **kw)

    store.cqs.put = failing_put
    with pytest.raises(OSError, match="No space"):
        put(store, "E", [b"lost-1", b"lost-2"])
    store.cqs.put = real_put
    assert store.state.write_pos == end and store.max_offset("E", 0) == 1
    assert not store.cl.map(0)[end:end + 4096].any()
    r = put(store, "E", [b"after"])
    assert (r.phy_offset, r.queue_offset) == (end, 1)
    store.close()
    store, report = open_local(cfg)   # abnormal recovery finds exactly two records
    assert [m.body for m in store.read_queue("E", 0)] == [b"before", b"after"]
    assert report.bytes_truncated == 0
