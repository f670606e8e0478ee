"""IndexFile and IndexService against a twin of RocketMQ 4.9.7's IndexFile.java.

``TwinIndexFile`` is written from the Java source (IndexFile, IndexHeader,
IndexService.queryOffset/buildIndex), with ``struct`` on a bytearray and
nothing of shmq: the kernels must write the same bytes and answer the same
queries, and files on disk must read back through it.
"""
from __future__ import annotations

import os
import shutil
import struct
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import naive
from conftest import small_config
from shmq.core import _kernels as K
from shmq.core import index as I
from shmq.core.config import StoreConfig
from shmq.core.files import REAL_FILES
from shmq.core.records import encode, properties_bytes
from shmq.core.store import close_clean, open_local

HEADER = struct.Struct(">qqqqii")    # begin/end timestamp, begin/end phy, hashSlotCount, indexCount
ENTRY = struct.Struct(">iqii")       # keyHash, phyOffset, timeDiff, prevIndex
ROLLBACK = 0xC
PREPARED = 0x4
T0 = 1_700_000_000_000
MIN_HASH_KEY = "k49900坝丞丙"        # ("T#" + it).hashCode() == Integer.MIN_VALUE
EVER = (0, 2**62)


def budget(n: int):
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------- twin
def java_div(a: int, b: int) -> int:
    """Java's long division: truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def twin_key_hash(topic: bytes, key: bytes) -> int:
    """indexKeyHashMethod(topic + "#" + key): Math.abs(hashCode()), and 0
    where Math.abs stays negative (Integer.MIN_VALUE)."""
    h = naive.java_hash_of_utf8(topic + b"#" + key)
    return 0 if h == -2**31 else abs(h)


class TwinIndexFile:
    """IndexFile + IndexHeader: the header in fields (Java's atomics), the
    slots and entries in ``buf``; ``flushed()`` is the file after flush()."""

    def __init__(self, slot_num: int, index_num: int, end_phy: int = 0, end_ts: int = 0,
                 data: bytes | None = None):
        self.slot_num, self.index_num = slot_num, index_num
        self.buf = bytearray(40 + slot_num * 4 + index_num * 20) if data is None else bytearray(data)
        self.begin_ts = self.end_ts = self.begin_phy = self.end_phy = self.slot_count = 0
        self.index_count = 1
        if data is not None:      # IndexHeader.load
            (self.begin_ts, self.end_ts, self.begin_phy, self.end_phy, self.slot_count,
             self.index_count) = HEADER.unpack_from(self.buf, 0)
            self.index_count = max(self.index_count, 1)
        if end_phy > 0:
            self.begin_phy = self.end_phy = end_phy
        if end_ts > 0:
            self.begin_ts = self.end_ts = end_ts

    def flushed(self) -> bytes:
        HEADER.pack_into(self.buf, 0, self.begin_ts, self.end_ts, self.begin_phy, self.end_phy,
                         self.slot_count, self.index_count)
        return bytes(self.buf)

    def slot_at(self, key_hash: int) -> int:
        return 40 + (key_hash % self.slot_num) * 4

    def entry_at(self, i: int) -> int:
        return 40 + self.slot_num * 4 + i * 20

    def is_write_full(self) -> bool:
        return self.index_count >= self.index_num

    def put_key(self, key_hash: int, phy: int, store_ts: int) -> bool:
        if self.index_count >= self.index_num:
            return False
        slot = self.slot_at(key_hash)
        slot_value = struct.unpack_from(">i", self.buf, slot)[0]
        if slot_value <= 0 or slot_value > self.index_count:
            slot_value = 0
        time_diff = java_div(store_ts - self.begin_ts, 1000)
        if self.begin_ts <= 0:
            time_diff = 0
        elif time_diff > 2**31 - 1:
            time_diff = 2**31 - 1
        elif time_diff < 0:
            time_diff = 0
        ENTRY.pack_into(self.buf, self.entry_at(self.index_count), key_hash, phy, time_diff,
                        slot_value)
        struct.pack_into(">i", self.buf, slot, self.index_count)
        if self.index_count <= 1:
            self.begin_phy, self.begin_ts = phy, store_ts
        if slot_value == 0:
            self.slot_count += 1
        self.index_count += 1
        self.end_phy, self.end_ts = phy, store_ts
        return True

    def is_time_matched(self, begin: int, end: int) -> bool:
        return ((begin < self.begin_ts and end > self.end_ts)
                or self.begin_ts <= begin <= self.end_ts or self.begin_ts <= end <= self.end_ts)

    def select(self, out: list, key_hash: int, max_num: int, begin: int, end: int) -> None:
        slot_value = struct.unpack_from(">i", self.buf, self.slot_at(key_hash))[0]
        if slot_value <= 0 or slot_value > self.index_count or self.index_count <= 1:
            return
        nxt = slot_value
        while len(out) < max_num:
            hash_read, phy, time_diff, prev = ENTRY.unpack_from(self.buf, self.entry_at(nxt))
            if time_diff < 0:
                break
            time_read = self.begin_ts + time_diff * 1000
            if key_hash == hash_read and begin <= time_read <= end:
                out.append(phy)
            if prev <= 0 or prev > self.index_count or prev == nxt or time_read < begin:
                break
            nxt = prev


def twin_query(files: list[TwinIndexFile], key_hash: int, max_num: int, begin: int,
               end: int) -> list[int]:
    """IndexService.queryOffset."""
    max_num = min(max_num, 64)    # maxMsgsNumBatch
    out: list[int] = []
    for f in reversed(files):
        if f.is_time_matched(begin, end):
            f.select(out, key_hash, max_num, begin, end)
        if f.begin_ts < begin or len(out) >= max_num:
            break
    return out


def twin_records(root: str, end: int):
    """(phy, fields) of every record of the CommitLog below ``end``, read
    from the segment files; blank records end a segment."""
    cl = os.path.join(root, "commitlog")
    for name in sorted(os.listdir(cl)):
        base = int(name)
        with open(os.path.join(cl, name), "rb") as fh:
            data = fh.read()
        pos = 0
        while base + pos < end:
            size, magic = struct.unpack_from(">iI", data, pos)
            if magic == naive.BLANK_MAGIC:
                break
            yield base + pos, naive.parse_record(data[pos:pos + size])
            pos += size


def twin_keys(f: dict) -> list[bytes]:
    """IndexService.buildIndex: UNIQ_KEY, then every non-empty KEYS token."""
    props = naive.parse_properties(f["properties"])
    keys = [props["UNIQ_KEY"]] if "UNIQ_KEY" in props else []
    keys += [k for k in props.get("KEYS", "").split(" ") if k]
    return [k.encode("utf-8", "surrogateescape") for k in keys]


def twin_build(root: str, end: int, slot_num: int, index_num: int) -> list[TwinIndexFile]:
    files: list[TwinIndexFile] = []
    for phy, f in twin_records(root, end):
        if f["sysflag"] & 0xC == ROLLBACK:
            continue
        for key in twin_keys(f):
            h = twin_key_hash(f["topic"], key)
            while not files or not files[-1].put_key(h, phy, f["store_timestamp"]):
                last = files[-1] if files else None
                files.append(TwinIndexFile(slot_num, index_num, last.end_phy if last else 0,
                                           last.end_ts if last else 0))
    return files


def index_files(root: str) -> list[bytes]:
    d = os.path.join(root, "index")
    out = []
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as fh:
            out.append(fh.read())
    return out


# -------------------------------------------------------------------- helpers
def config(root: str, slots: int = 13, entries: int = 40, **kw) -> StoreConfig:
    return small_config(root, maxHashSlotNum=slots, maxIndexNum=entries, **kw)


def fill(store, n: int, first: int = 0, topics=("TopicA", "TopicB")):
    """n batches with every kind of key: UNIQ_KEY only, KEYS only (extra
    spaces, repeats, non-ASCII), none, both; a rollback and a prepared
    transaction record now and then. Deterministic bytes."""
    for i in range(first, first + n):
        props = [properties_bytes({"UNIQ_KEY": f"U{i:05d}{j}"}, keys=f"order-{i} shared") if j == 0
                 else properties_bytes(keys=f" k{i}  ключ{j % 3} ") if j == 1
                 else properties_bytes({"UNIQ_KEY": f"U{i:05d}{j}"}) if j == 2
                 else properties_bytes(tags="t")
                 for j in range(4)]
        sysflag = ROLLBACK if i % 7 == 3 else PREPARED if i % 7 == 5 else 0
        store.append(encode(topics[i % len(topics)], [b"b" * (600 + i % 50)] * 4,
                            properties=props, queue_ids=i % 2, sysflag=sysflag,
                            born_timestamp=T0, store_timestamp=T0 + i * 700))


def same_as_twin(root: str, store, cfg: StoreConfig) -> list[TwinIndexFile]:
    twin = twin_build(root, store.state.write_pos, cfg.maxHashSlotNum, cfg.maxIndexNum)
    assert index_files(root) == [t.flushed() for t in twin]
    return twin


@pytest.fixture
def store_and_cfg(store_dir):
    cfg = config(store_dir)
    store, _ = open_local(cfg)
    yield store, cfg
    close_clean(store)


# ----------------------------------------------------------------- byte format
def test_header_slots_and_entries_sit_where_rocketmq_puts_them(tmp_path):
    path = str(tmp_path / "20240101000000000")
    f = I.IndexFile.create(REAL_FILES, path, 8, 5, end_phy=4096, end_ts=T0)
    assert os.path.getsize(path) == 40 + 8 * 4 + 5 * 20
    # a new file starts where the previous ended; indexCount starts at 1
    assert HEADER.unpack(f.buf[:40].tobytes()) == (T0, T0, 4096, 4096, 0, 1)
    assert K.index_put(f.buf, 8, 5, 17, 5000, T0 + 2500)      # slot 17 % 8 = 1
    assert K.index_put(f.buf, 8, 5, 9, 5100, T0 + 4000)       # slot 1 again: a chain
    assert K.index_put(f.buf, 8, 5, 3, 5200, T0 + 9999)       # slot 3
    assert K.index_put(f.buf, 8, 5, 3, 5300, T0 + 9999)       # entries 1..4: full
    assert not K.index_put(f.buf, 8, 5, 4, 5400, T0)
    with open(path, "rb") as fh:
        data = fh.read()
    # the first key replaces the inherited begin; its own timeDiff was
    # taken from the inherited one first (2.5 s → 2), as RocketMQ does
    assert HEADER.unpack(data[:40]) == (T0 + 2500, T0 + 9999, 5000, 5300, 2, 5)
    slots = struct.unpack(">8i", data[40:72])
    assert slots == (0, 2, 0, 4, 0, 0, 0, 0)
    entries = [ENTRY.unpack_from(data, 72 + i * 20) for i in range(5)]
    assert entries[0] == (0, 0, 0, 0)                          # index 0 is never used
    assert entries[1] == (17, 5000, 2, 0)
    assert entries[2] == (9, 5100, 1, 1)                       # (4000 - 2500) / 1000
    assert entries[3] == (3, 5200, 7, 0)
    assert entries[4] == (3, 5300, 7, 3)
    twin = TwinIndexFile(8, 5, 4096, T0)
    for args in ((17, 5000, T0 + 2500), (9, 5100, T0 + 4000), (3, 5200, T0 + 9999),
                 (3, 5300, T0 + 9999)):
        twin.put_key(*args)
    assert data == twin.flushed()
    f.close()


def test_file_names_are_rocketmq_times_and_sort_in_creation_order(store_dir):
    cfg = config(store_dir, slots=3, entries=3)
    store, _ = open_local(cfg)
    before = int(time.time() * 1000)
    fill(store, 4)
    svc = I.IndexService(cfg)
    svc.build(store)
    names = svc.file_names
    assert len(names) > 3 and names == sorted(names) and len(set(names)) == len(names)
    assert all(len(n) == 17 and n.isdigit() for n in names)
    assert I.time_millis_to_human(before)[:12] <= names[0][:12]  # yyyyMMddHHmm, local time
    assert time.strftime("%Y%m%d%H%M%S", time.localtime(before / 1000)) == \
        I.time_millis_to_human(before)[:14]
    svc.close()
    close_clean(store)


def test_a_default_size_file_is_sparse_past_its_slots_and_entries_written(store_dir):
    """420 MB by the default geometry: blocks only for the header and the
    hash slots (written at random, given blocks when the file is made, so a
    full disk is ENOSPC, not a SIGBUS) and a page of entries ahead."""
    I.warm_up()
    cfg = StoreConfig(storePathRootDir=store_dir, mappedFileSizeCommitLog=1 << 20,
                      maxMessageSize=8192)
    store, _ = open_local(cfg)
    fill(store, 3)
    svc = I.IndexService(cfg)
    svc.build(store)
    svc.flush()
    (name,) = svc.file_names
    st = os.stat(os.path.join(store_dir, "index", name))
    assert st.st_size == 420_000_040
    slots_end = 40 + 5_000_000 * 4
    assert slots_end <= st.st_blocks * 512 < slots_end + 4 * 4096
    assert svc.query("TopicA", "shared", 64, *EVER)
    svc.close()
    close_clean(store)


def test_index_settings_must_be_positive():
    for name in ("maxHashSlotNum", "maxIndexNum"):
        with pytest.raises(ValueError, match=name):
            StoreConfig(**{name: 0})
    cfg = StoreConfig()
    assert (cfg.messageIndexEnable, cfg.maxHashSlotNum, cfg.maxIndexNum) == (True, 5_000_000,
                                                                            20_000_000)


# ---------------------------------------------------------------- kernel twin
HASHES = st.integers(0, 5) | st.integers(0, 40)
STORE_TS = (st.integers(-3000, 60_000).map(lambda d: T0 + d) | st.integers(-3000, 3000)
            | st.integers(2**40, 2**62))     # store times out of order, before 1970, far off
OPS = st.lists(st.tuples(HASHES, st.integers(0, 2**30), STORE_TS), max_size=30)
WINDOWS = (st.tuples(st.integers(-5000, 70_000), st.integers(0, 30_000)).map(
    lambda w: (T0 + w[0], T0 + w[0] + w[1])) | st.just(EVER))


@budget(200)
@given(slots=st.integers(1, 7), entries=st.integers(1, 12), end_phy=st.integers(0, 9),
       end_ts=st.sampled_from([0, -5, T0 - 7000]), ops=OPS,
       queries=st.lists(st.tuples(HASHES, st.integers(0, 5), WINDOWS), max_size=10))
def test_put_and_select_match_the_twin(slots, entries, end_phy, end_ts, ops, queries):
    twin = TwinIndexFile(slots, entries, end_phy, end_ts)
    idx = np.frombuffer(twin.flushed(), np.uint8).copy()
    phy = 0
    for h, step, ts in ops:
        phy += step         # records are indexed in CommitLog order
        assert K.index_put(idx, slots, entries, h, phy, ts) == twin.put_key(h, phy, ts)
    assert idx.tobytes() == twin.flushed()
    assert K.index_check(idx, slots, twin.index_count) == (K.IX_OK, twin.slot_count)
    out = np.zeros(8, np.int64)
    for h, max_num, (begin, end) in queries:
        want: list[int] = []
        twin.select(want, h, max_num, begin, end)
        n = K.index_select(idx, slots, entries, h, max_num, begin, end, out, 0)
        assert out[:n].tolist() == want


TEXT = st.text(st.characters(blacklist_categories=("Cs",),
                             blacklist_characters="\x00\x01\x02 "), min_size=1, max_size=12)


@budget(100)
@given(topic=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x2FF,
                                   blacklist_characters="\x7f"), min_size=1, max_size=20),
       uniq=st.one_of(st.none(), TEXT), keys=st.lists(TEXT, max_size=4),
       spaces=st.lists(st.integers(1, 3), min_size=5, max_size=5), sysflag=st.sampled_from(
           [0, PREPARED, 0x8, ROLLBACK]), skip=st.integers(0, 6))
def test_index_records_takes_the_keys_rocketmq_takes(topic, uniq, keys, spaces, sysflag, skip):
    """UNIQ_KEY, then KEYS split on single spaces without the empty tokens;
    ROLLBACK records skipped; the first ``skip`` keys left out."""
    props = {"UNIQ_KEY": uniq} if uniq else {}
    keys_value = "".join(" " * s + k for s, k in zip(spaces, keys)) + " " * spaces[-1]
    batch = encode(topic, [b"x"], properties=properties_bytes(props, keys=keys_value),
                   sysflag=sysflag, store_timestamp=T0)
    rows = np.zeros((1, K.N_SCAN), np.int64)
    n, _, _ = K.scan_records(batch.buf, 0, batch.nbytes, 0, False, K.CRC_TABLES,
                             np.frombuffer(b"TAGS", np.uint8), rows)
    assert n == 1
    idx = np.zeros(I.file_bytes(7, 16), np.uint8)
    assert K.index_records(batch.buf, rows, 0, 1, skip, idx, 7, 16,
                           np.frombuffer(b"UNIQ_KEY", np.uint8),
                           np.frombuffer(b"KEYS", np.uint8)) == (1, 0, K.IX_DONE)
    record = naive.parse_record(batch.buf.tobytes())
    want = [] if sysflag == ROLLBACK else [twin_key_hash(topic.encode(), k)
                                           for k in twin_keys(record)][skip:]
    count = HEADER.unpack_from(idx.tobytes(), 0)[5]
    got = [ENTRY.unpack_from(idx.tobytes(), 40 + 7 * 4 + i * 20)[0] for i in range(1, count)]
    assert got == want
    assert [I.key_hash(topic, k) for k in ([uniq] if uniq else []) + keys] == \
        [twin_key_hash(topic.encode(), k) for k in twin_keys(record)]


@budget(150)
@given(topic=st.binary(max_size=12), key=st.binary(max_size=20))
def test_the_key_hash_continues_java_hash_utf8_over_any_bytes(topic, key):
    """hash(topic), then '#', then the key: the hash of the whole (a
    malformed sequence cannot run past the ASCII '#')."""
    buf = np.frombuffer(topic + b"#" + key, np.uint8).copy()
    h = K._java_hash_more(np.int64(0), buf, 0, len(topic))
    h = K._java_hash_more((31 * h + 35) & 0xFFFFFFFF, buf, len(topic) + 1, len(buf))
    assert naive.to_signed(h, 32) == K.java_hash_utf8(buf, 0, len(buf))
    want = naive.to_signed(h, 32)
    assert K._index_key_hash(h) == (0 if want == -2**31 else abs(want))


def test_the_min_value_hash_indexes_as_zero(store_and_cfg):
    store, cfg = store_and_cfg
    assert naive.java_string_hash("T#" + MIN_HASH_KEY) == -2**31
    assert I.key_hash("T", MIN_HASH_KEY) == 0
    store.append(encode("T", [b"x"], properties=properties_bytes(keys=MIN_HASH_KEY),
                        store_timestamp=T0))
    svc = I.IndexService(cfg)
    svc.build(store)
    assert svc.query("T", MIN_HASH_KEY, 8, *EVER) == [0]
    assert struct.unpack_from(">i", index_files(cfg.storePathRootDir)[0], 40)[0] == 1  # slot 0
    svc.close()


# ------------------------------------------------------------- queries
def test_colliding_keys_share_a_slot_and_equal_hashes_both_answer(tmp_path):
    f = I.IndexFile.create(REAL_FILES, str(tmp_path / "i"), 4, 10, 0, 0)
    a = I.key_hash("T", "k0")
    b = next(h for h in (I.key_hash("T", f"k{i}") for i in range(1, 99)) if h % 4 == a % 4)
    c = I.key_hash("T", "Aa")
    assert a != b                                      # one slot, two hashes
    assert c == I.key_hash("T", "BB")                  # "Aa".hashCode() == "BB".hashCode()
    for phy, h in enumerate((a, b, c, a, c)):
        K.index_put(f.buf, 4, 10, h, phy * 100, T0)
    out = np.zeros(8, np.int64)
    assert out[:f.select(a, 8, *EVER, out, 0)].tolist() == [300, 0]
    assert out[:f.select(b, 8, *EVER, out, 0)].tolist() == [100]
    # the index cannot tell "Aa" from "BB": the caller re-checks the key
    assert out[:f.select(I.key_hash("T", "BB"), 8, *EVER, out, 0)].tolist() == [400, 200]
    f.close()


def test_time_window_and_max_num(store_dir):
    cfg = config(store_dir, slots=11, entries=1000)
    store, _ = open_local(cfg)
    for i in range(20):     # one message a second, all with key "k"
        store.append(encode("T", [b"x"], properties=properties_bytes(keys="k"),
                            store_timestamp=T0 + i * 1000))
    svc = I.IndexService(cfg)
    svc.build(store)
    phys = [m.phy_offset for m in store.read_queue("T", 0)]
    assert svc.query("T", "k", 64, *EVER) == phys[::-1]
    assert svc.query("T", "k", 64, T0 + 5000, T0 + 7000) == phys[7:4:-1]
    assert svc.query("T", "k", 64, T0 + 4500, T0 + 7999) == phys[7:4:-1]   # seconds
    assert svc.query("T", "k", 2, *EVER) == phys[:-3:-1]
    assert svc.query("T", "k", 1000, *EVER) == phys[::-1]      # under maxMsgsNumBatch
    assert svc.query("T", "k", 0, *EVER) == []
    assert svc.query("T", "k", 64, T0 + 20_000, 2**62) == []
    assert svc.query("Other", "k", 64, *EVER) == []
    assert (svc.last_update_timestamp, svc.last_update_phy_offset) == (T0 + 19_000, phys[-1])
    svc.close()
    close_clean(store)


def test_a_chain_stops_at_its_first_entry_before_the_window(tmp_path):
    """selectPhyOffset walks a slot's chain newest first and stops at the
    first entry stored before ``begin``, even if store times went backwards
    and an older entry lies inside the window."""
    f = I.IndexFile.create(REAL_FILES, str(tmp_path / "i"), 3, 10, 0, 0)
    for phy, ts in ((0, T0 + 10_000), (10, T0 + 20_000), (20, T0)):
        K.index_put(f.buf, 3, 10, 1, phy, ts)
    out = np.zeros(8, np.int64)
    assert out[:f.select(1, 8, T0 + 15_000, T0 + 45_000, out, 0)].tolist() == []
    assert out[:f.select(1, 8, T0, T0 + 45_000, out, 0)].tolist() == [20, 10, 0]
    f.close()


def test_max_num_is_capped_at_max_msgs_num_batch(store_and_cfg):
    store, cfg = store_and_cfg
    cfg = config(cfg.storePathRootDir, slots=11, entries=500)
    store.append(encode("T", [b"x"] * 100, properties=properties_bytes(keys="k"),
                        store_timestamp=T0))
    svc = I.IndexService(cfg)
    svc.build(store)
    assert len(svc.query("T", "k", 100, *EVER)) == 64
    svc.close()


# -------------------------------------------------------------- build
def test_build_from_a_store_matches_the_twin_and_finds_every_key(store_and_cfg):
    store, cfg = store_and_cfg
    fill(store, 60)
    svc = I.IndexService(cfg)
    assert svc.build(store) == store.state.write_pos
    twin = same_as_twin(cfg.storePathRootDir, store, cfg)
    assert len(twin) > 5                                  # rolled many times
    assert store.state.write_pos > 2 * cfg.mappedFileSizeCommitLog  # over blank records
    records = list(twin_records(cfg.storePathRootDir, store.state.write_pos))
    for phy, f in records[::7]:
        for key in twin_keys(f):
            topic, k = f["topic"].decode(), key.decode()
            got = svc.query(topic, k, 64, *EVER)
            assert got == twin_query(twin, twin_key_hash(f["topic"], key), 64, *EVER)
            if f["sysflag"] & 0xC == ROLLBACK:
                assert phy not in got
            else:
                assert phy in got
    by_uniq = svc.query("TopicB", "U000052", 64, *EVER)
    assert [store.read_message(p).properties["UNIQ_KEY"] for p in by_uniq] == ["U000052"]
    assert svc.query("TopicA", "U000052", 64, *EVER) == []  # another topic
    shared = svc.query("TopicA", "shared", 64, *EVER)
    assert len(shared) == len([i for i in range(0, 60, 2) if i % 7 != 3])
    assert svc.query("TopicB", "U000050", 64, *EVER)       # prepared records are indexed
    assert svc.last_update_phy_offset == twin[-1].end_phy
    assert svc.last_update_timestamp == twin[-1].end_ts
    svc.close()


def test_small_steps_build_the_same_files(store_and_cfg, monkeypatch):
    store, cfg = store_and_cfg
    monkeypatch.setattr(I, "SCAN_ROWS", 5)               # scan 5 records at a time
    fill(store, 30)
    svc = I.IndexService(cfg)
    steps = 0
    while svc.build(store, limit_bytes=1):
        steps += 1
    assert steps > 20
    fill(store, 10, first=30)                            # and more later
    assert svc.build(store) > 0
    assert svc.build(store) == 0
    same_as_twin(cfg.storePathRootDir, store, cfg)
    svc.close()


def test_a_restart_resumes_after_the_last_key(store_and_cfg):
    """Also when the last record's keys were split over two files."""
    store, cfg = store_and_cfg
    for n in range(1, 12):
        fill(store, 3, first=3 * n)
        svc = I.IndexService(cfg)
        svc.build(store)
        svc.close()
    same_as_twin(cfg.storePathRootDir, store, cfg)


def test_a_record_whose_keys_span_three_files_resumes_exactly(store_dir):
    cfg = config(store_dir, slots=5, entries=4)          # 3 keys a file
    store, _ = open_local(cfg)
    store.append(encode("T", [b"a"], properties=properties_bytes(keys="a1 a2"),
                        store_timestamp=T0))
    r = store.append(encode("T", [b"b"], properties=properties_bytes(
        {"UNIQ_KEY": "u"}, keys="b1 b2 b3 b4 b5 b6"), store_timestamp=T0 + 1000))
    svc = I.IndexService(cfg)
    svc.build(store)
    assert len(svc.file_names) == 3                      # a1 a2 u | b1 b2 b3 | b4 b5 b6
    svc.close()
    svc = I.IndexService(cfg)
    rep = svc.recover(store)
    assert (rep.discarded, rep.resume_phy, rep.resume_keys) == ([], r.phy_offset, 7)
    assert svc.build(store) == store.state.write_pos - r.phy_offset
    store.append(encode("T", [b"c"], properties=properties_bytes(keys="c1"),
                        store_timestamp=T0 + 2000))
    svc.build(store)
    same_as_twin(store_dir, store, cfg)
    assert svc.query("T", "b1", 64, *EVER) == [r.phy_offset]
    svc.close()
    close_clean(store)


def test_message_index_disabled_builds_nothing(store_dir):
    cfg = config(store_dir, messageIndexEnable=False)
    store, _ = open_local(cfg)
    fill(store, 3)
    svc = I.IndexService(cfg)
    assert svc.build(store) == 0 and svc.file_names == []
    svc.close()
    close_clean(store)


# ------------------------------------------------------------ crash safety
def copy_index(src_root: str, dst_root: str) -> None:
    shutil.rmtree(os.path.join(dst_root, "index"), ignore_errors=True)
    shutil.copytree(os.path.join(src_root, "index"), os.path.join(dst_root, "index"))


def test_files_past_the_commitlog_end_are_rebuilt(tmp_path):
    """The index of a longer CommitLog (as after a crash that lost its
    tail) loses the files the CommitLog does not back; the rest resumes."""
    long_cfg, short_cfg = config(str(tmp_path / "long")), config(str(tmp_path / "short"))
    long_store, _ = open_local(long_cfg)
    short_store, _ = open_local(short_cfg)
    fill(long_store, 60)
    fill(short_store, 31)
    svc = I.IndexService(long_cfg)
    svc.build(long_store)
    svc.close()
    copy_index(long_cfg.storePathRootDir, short_cfg.storePathRootDir)
    before = len(index_files(short_cfg.storePathRootDir))
    svc = I.IndexService(short_cfg)
    rep = svc.recover(short_store)
    assert rep.discarded and all("past the CommitLog end" in d for d in rep.discarded)
    assert 0 < len(svc.file_names) < before
    svc.build(short_store)
    same_as_twin(short_cfg.storePathRootDir, short_store, short_cfg)
    svc.close()
    close_clean(long_store)
    close_clean(short_store)


def _zero_a_page_of_entries(f: I.IndexFile) -> None:
    # power loss: a page of entries never reached the disk
    first = 40 + f.slot_num * 4 + 20
    page = (first + 4095) // 4096 * 4096
    assert page < first + (f.count - 1) * 20
    f.buf[page:page + 4096] = 0


def _slot_names_the_next_entry(f: I.IndexFile) -> None:
    # died after writing entry and slot, before indexCount
    h = int(f.entries[1]["key_hash"])
    f.buf[40 + (h % f.slot_num) * 4:][:4] = np.frombuffer(struct.pack(">i", f.count), np.uint8)


def _count_too_big(f: I.IndexFile) -> None:
    f.header["index_count"] = f.index_num + 1


def _slot_count_off(f: I.IndexFile) -> None:
    f.header["slot_count"] = f.slot_count - 1


@pytest.mark.parametrize("tear, why", [
    (_zero_a_page_of_entries, "torn"),
    (_slot_names_the_next_entry, "hash slot"),
    (_count_too_big, "indexCount"),
    (_slot_count_off, "hashSlotCount"),
])
def test_a_torn_newest_file_is_rebuilt(store_dir, tear, why):
    cfg = config(store_dir, slots=97, entries=400)
    store, _ = open_local(cfg)
    fill(store, 120)
    svc = I.IndexService(cfg)
    svc.build(store)
    assert len(svc.file_names) == 2
    newest = os.path.join(store_dir, "index", svc.file_names[-1])
    svc.close()
    f = I.IndexFile(REAL_FILES, newest, 97, 400, writable=True)
    tear(f)
    f.close()
    svc = I.IndexService(cfg)
    rep = svc.recover(store)
    assert len(rep.discarded) == 1 and why in rep.discarded[0]
    svc.build(store)
    same_as_twin(store_dir, store, cfg)
    svc.close()
    close_clean(store)


def test_files_of_another_geometry_are_rebuilt(store_and_cfg):
    store, cfg = store_and_cfg
    fill(store, 20)
    svc = I.IndexService(cfg)
    svc.build(store)
    svc.close()
    bigger = config(cfg.storePathRootDir, slots=31, entries=200)
    svc = I.IndexService(bigger)
    assert svc.file_names == [] and svc.query("TopicA", "shared", 64, *EVER) == []
    rep = svc.recover(store)
    assert rep.discarded and (rep.resume_phy, rep.resume_keys) == (0, 0)
    svc.build(store)
    same_as_twin(cfg.storePathRootDir, store, bigger)
    svc.close()


def test_delete_below_keeps_the_newest_file(store_and_cfg):
    store, cfg = store_and_cfg
    fill(store, 40)
    svc = I.IndexService(cfg)
    svc.build(store)
    twin = twin_build(cfg.storePathRootDir, store.state.write_pos, 13, 40)
    ends = [t.end_phy for t in twin]
    assert svc.delete_below(ends[0]) == 0
    assert svc.delete_below(ends[2] + 1) == 3
    assert index_files(cfg.storePathRootDir) == [t.flushed() for t in twin[3:]]
    assert svc.delete_below(2**62) == len(twin) - 4
    assert len(svc.file_names) == 1
    svc.close()


# -------------------------------------------------------------- concurrency
def test_a_reader_sees_new_files_and_forgets_deleted_ones(store_and_cfg):
    store, cfg = store_and_cfg
    reader = I.IndexService(cfg, read_only=True)
    assert reader.query("TopicA", "shared", 64, *EVER) == []
    with pytest.raises(RuntimeError, match="read-only"):
        reader.build(store)
    fill(store, 40)
    writer = I.IndexService(cfg)
    writer.build(store)
    assert len(reader.query("TopicA", "shared", 64, *EVER)) == 17
    assert reader.file_names == writer.file_names
    assert reader.last_update_phy_offset == writer.last_update_phy_offset > 0
    writer.delete_below(2**62)
    reader.query("TopicA", "shared", 64, *EVER)
    assert reader.file_names == writer.file_names
    # the files read back through the twin
    twin = [TwinIndexFile(13, 40, data=d) for d in index_files(cfg.storePathRootDir)]
    h = I.key_hash("TopicA", "shared")
    assert reader.query("TopicA", "shared", 64, *EVER) == twin_query(twin, h, 64, *EVER)
    reader.close()
    writer.close()


def test_queries_racing_inserts_see_only_complete_entries(tmp_path):
    """A writer appends keys through one mapping while a reader queries
    through another (read-only) mapping of the same file: every answer holds
    exactly the entries of that key published before the query began."""
    slots, entries, n = 61, 20_001, 20_000
    path = str(tmp_path / "i")
    w = I.IndexFile.create(REAL_FILES, path, slots, entries, 0, 0)
    r = I.IndexFile(REAL_FILES, path, slots, entries, writable=False)
    hashes = np.arange(n, dtype=np.int64) % 997          # 20 entries per hash
    published = [0]
    stop = threading.Event()
    bad = []
    reads = [0]

    def read():
        out = np.zeros(64, np.int64)
        rng = np.random.default_rng(1)
        while not stop.is_set():
            reads[0] += 1
            done = published[0]
            h = int(rng.integers(0, 997))
            got = out[:r.select(h, 64, *EVER, out, 0)].tolist()
            before = set(np.flatnonzero(hashes[:done] == h).tolist())
            # newest first, complete (phy i is entry i's), nothing published
            # before the query missing
            if (got != sorted(got, reverse=True) or any(hashes[p] != h for p in got)
                    or not before <= set(got)):
                bad.append((h, done, got))

    t = threading.Thread(target=read)
    t.start()
    for i in range(n):
        K.index_put(w.buf, slots, entries, int(hashes[i]), i, T0)
        published[0] = i + 1
    stop.set()
    t.join()
    assert reads[0] > 10 and not bad
    r.close()
    w.close()


def test_a_damaged_record_is_skipped_and_reported_and_later_records_are_indexed(store_and_cfg,
                                                                               caplog):
    """A bad record header below the write position used to raise
    IndexBuildError, crash-looping the services process (12 restarts in
    25 s) until the topic's route went from the NameServer."""
    store, cfg = store_and_cfg
    rs = [store.append(encode("T", [b"x" * 50], properties=properties_bytes(keys=f"k{i}"),
                              store_timestamp=T0)) for i in range(10)]
    bad = rs[4]
    store.cl.write(bad.phy_offset + 4, b"\0\0\0\0")           # its MAGIC
    svc = I.IndexService(cfg)
    with caplog.at_level("ERROR", logger="shmq.store"):
        assert svc.build(store) == rs[-1].end
    assert svc.damaged_skipped == 1
    assert any(f"no valid record at CommitLog offset {bad.phy_offset}" in r.getMessage()
               for r in caplog.records)
    assert svc.query("T", "k4", 8, *EVER) == []
    assert [svc.query("T", f"k{i}", 8, *EVER) for i in (3, 5, 9)] == \
        [[rs[3].phy_offset], [rs[5].phy_offset], [rs[9].phy_offset]]
    svc.close()
