"""Retention: which segments go, when, and what readers see afterwards."""
from __future__ import annotations

import os
import time

from conftest import SMALL_CQ_UNITS, SMALL_SEGMENT, small_config
from shmq.core.records import encode
from shmq.core.retention import clean_expired
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
