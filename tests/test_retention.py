"""Retention: which segments go, when, and what readers see afterwards."""
from __future__ import annotations

import os
import time

from conftest import SMALL_CQ_UNITS, SMALL_SEGMENT, small_config
from shmq.core.checkpoint import save_table
from shmq.core.files import REAL_FILES
from shmq.core.records import encode
from shmq.core.retention import clean_consume_queues, clean_expired
from shmq.core.store import GetMessageStatus, close_clean, open_local


def at_hour(hour: int) -> int:
    """A wall-clock time (ms) today at ``hour`` local time."""
    t = time.localtime()
    return int(time.mktime((t.tm_year, t.tm_mon, t.tm_mday, hour, 30, 0, 0, 0, -1)) * 1000)


def filled(store_dir, segments=5, **kw):
    store, _ = open_local(small_config(store_dir, **kw))
    n = 0
    while store.state.write_pos < (segments - 1) * SMALL_SEGMENT + 100:
        store.append(encode("Ret", [b"r" * 900], queue_ids=n % 2, properties=b""))
        n += 1
    return store, n


def age_segments(store_dir, hours, now_ms):
    """Make every segment's last write ``hours`` before ``now_ms``."""
    seg_dir = os.path.join(store_dir, "commitlog")
    old = now_ms / 1000 - hours * 3600
    for name in os.listdir(seg_dir):
        os.utime(os.path.join(seg_dir, name), (old, old))


def test_nothing_is_deleted_outside_delete_when_hours(store_dir):
    store, _ = filled(store_dir)
    age_segments(store_dir, 100, at_hour(13))
    rep = clean_expired(store, at_hour(13), disk_ratio=0.10)
    assert not rep.ran and len(os.listdir(os.path.join(store_dir, "commitlog"))) >= 5


def test_expired_segments_go_at_delete_when_but_never_the_one_being_written(store_dir):
    store, n = filled(store_dir)
    age_segments(store_dir, 73, at_hour(4))         # fileReservedTime is 72 h
    rep = clean_expired(store, at_hour(4), disk_ratio=0.10)
    assert rep.ran and rep.reason == "deleteWhen hour 04"
    writing = store.cl.segment_start(store.state.write_pos)
    assert rep.segments_deleted == [f"{s:020d}" for s in range(0, writing, SMALL_SEGMENT)]
    left = sorted(int(x) for x in os.listdir(os.path.join(store_dir, "commitlog")))
    assert left[0] == writing == store.state.get("cl_min_offset")
    # readers: the queue now starts later, old offsets are answered as too small
    mn = store.min_offset("Ret", 0)
    assert mn > 0 and store.read_message(int(store.get_message("Ret", 0, mn, 1).phys[0])).phy_offset >= writing
    r = store.get_message("Ret", 0, 0, 1)
    assert (r.status, r.next_offset) == (GetMessageStatus.OFFSET_TOO_SMALL, mn)
    cq_files = os.listdir(os.path.join(store_dir, "consumequeue", "Ret", "0"))
    assert all(int(f) // 20 + SMALL_CQ_UNITS > mn for f in cq_files)   # none wholly below min
    close_clean(store)
    store, report = open_local(small_config(store_dir))   # and after a restart
    assert report.min_offset == writing and store.min_offset("Ret", 0) == mn


def test_unexpired_segments_stay_unless_the_disk_is_nearly_full(store_dir):
    store, _ = filled(store_dir)
    age_segments(store_dir, 1, at_hour(4))
    rep = clean_expired(store, at_hour(4), disk_ratio=0.10)
    assert rep.ran and rep.segments_deleted == []
    age_segments(store_dir, 1, at_hour(13))
    rep = clean_expired(store, at_hour(13), disk_ratio=0.80)    # > 75%: runs, but not expired
    assert rep.ran and "diskMaxUsedSpaceRatio" in rep.reason and rep.segments_deleted == []
    rep = clean_expired(store, at_hour(13), disk_ratio=0.90)    # > 85%: the oldest go anyway
    assert len(rep.segments_deleted) == 4


def test_at_most_delete_file_batch_max_per_pass(store_dir):
    store, _ = filled(store_dir, segments=6, deleteFileBatchMax=2)
    now = int(time.time() * 1000)
    age_segments(store_dir, 80, now)
    assert len(clean_expired(store, now, manual=True, disk_ratio=0.1).segments_deleted) == 2
    assert len(clean_expired(store, now, manual=True, disk_ratio=0.1).segments_deleted) == 2
    assert store.state.get("cl_min_offset") == 4 * SMALL_SEGMENT


def test_expired_by_file_age_uses_file_reserved_time(store_dir):
    store, _ = filled(store_dir, fileReservedTime=1)
    now = int(time.time() * 1000)
    age_segments(store_dir, 2, now)
    assert clean_expired(store, now, manual=True, disk_ratio=0.1).segments_deleted
    store2, _ = filled(store_dir + "2", fileReservedTime=1)   # younger than fileReservedTime
    age_segments(store_dir + "2", 0.5, now)
    assert clean_expired(store2, now, manual=True, disk_ratio=0.1).segments_deleted == []


# ---------------------------------------------------- forced cleanup and groups
def offset_in_segment(store, topic, qid, segment):
    """The first queue offset of (topic, qid) whose message lies in ``segment``."""
    for off in range(store.min_offset(topic, qid), store.max_offset(topic, qid)):
        if store.cqs.unit(topic, qid, off)[0] >= segment * SMALL_SEGMENT:
            return off
    raise AssertionError("no message there")


def commit(store_dir, table):
    save_table(REAL_FILES, store_dir, "consumerOffset.json", {"offsetTable": table})


def test_forced_cleanup_keeps_segments_with_messages_a_group_has_not_consumed(store_dir):
    store, _ = filled(store_dir)
    age_segments(store_dir, 1, at_hour(13))                    # none expired
    g0 = offset_in_segment(store, "Ret", 0, 2)                 # G is reading segment 2
    commit(store_dir, {"Ret@G": {"0": g0, "1": store.max_offset("Ret", 1)},
                       "Ret@Done": {"0": store.max_offset("Ret", 0)}})
    rep = clean_expired(store, at_hour(13), disk_ratio=0.90)   # > 85%: forced
    assert rep.segments_deleted == [f"{s * SMALL_SEGMENT:020d}" for s in (0, 1)]
    assert rep.held_back == [f"{s * SMALL_SEGMENT:020d}" for s in (2, 3)]
    assert rep.held_for and rep.held_for[0].startswith("G (Ret:0")
    assert rep.lost == {} and store.min_offset("Ret", 0) <= g0
    r = store.get_message("Ret", 0, g0, 1)
    assert r.status == GetMessageStatus.FOUND                  # G can still read it
    # a group caught up everywhere holds nothing back
    commit(store_dir, {"Ret@G": {"0": store.max_offset("Ret", 0), "1": store.max_offset("Ret", 1)}})
    rep = clean_expired(store, at_hour(13), disk_ratio=0.90)
    assert len(rep.segments_deleted) == 2 and rep.held_back == [] and rep.lost == {}


def test_forced_cleanup_deletes_unconsumed_messages_only_when_enabled_and_says_per_group(store_dir):
    store, _ = filled(store_dir, cleanFileForciblyEnable=True)
    age_segments(store_dir, 1, at_hour(13))
    g0 = offset_in_segment(store, "Ret", 0, 2)
    offsets = {("Ret", 0): {"G": g0, "H": 0}, ("Ret", 1): {"G": store.max_offset("Ret", 1)}}
    rep = clean_expired(store, at_hour(13), disk_ratio=0.90, consumer_offsets=lambda: offsets)
    assert len(rep.segments_deleted) == 4 and rep.forced and rep.held_back == []
    mn = store.min_offset("Ret", 0)
    assert rep.lost == {"G": {("Ret", 0): mn - g0}, "H": {("Ret", 0): mn}}


def test_forced_cleanup_keeps_everything_unexpired_if_the_offsets_cannot_be_read(store_dir):
    store, _ = filled(store_dir)
    age_segments(store_dir, 1, at_hour(13))
    os.makedirs(os.path.join(store_dir, "config"), exist_ok=True)
    with open(os.path.join(store_dir, "config", "consumerOffset.json"), "w") as f:
        f.write("not json")
    rep = clean_expired(store, at_hour(13), disk_ratio=0.90)
    assert rep.segments_deleted == [] and len(rep.held_back) == 4


def test_expired_segments_go_whatever_groups_have_read_and_the_loss_is_reported(store_dir):
    store, _ = filled(store_dir)
    age_segments(store_dir, 73, at_hour(4))
    rep = clean_expired(store, at_hour(4), disk_ratio=0.10,
                        consumer_offsets=lambda: {("Ret", 1): {"G": 0}})
    assert len(rep.segments_deleted) == 4 and not rep.forced
    assert rep.lost == {"G": {("Ret", 1): store.min_offset("Ret", 1)}}


def test_clean_consume_queues_finishes_a_pass_cut_short_after_the_commitlog_min_moved(store_dir):
    """admin's cleanExpiredCQ: a pass that published the CommitLog's new first
    byte and stopped there left each queue's first offset and files behind."""
    store, _ = filled(store_dir)
    writing = store.cl.segment_start(store.state.write_pos)
    store.state.set("cl_min_offset", writing)
    cq_dir = os.path.join(store_dir, "consumequeue", "Ret", "0")
    before = len(os.listdir(cq_dir))
    assert store.min_offset("Ret", 0) == 0
    deleted = clean_consume_queues(store)
    mn = store.min_offset("Ret", 0)
    assert mn > 0 and store.read_message(int(store.get_message("Ret", 0, mn, 1).phys[0])).phy_offset >= writing
    left = os.listdir(cq_dir)
    assert deleted > 0 and len(left) < before
    assert all(int(f) // 20 + SMALL_CQ_UNITS > mn for f in left)       # none wholly below min
    assert clean_consume_queues(store) == 0                            # nothing left to do
