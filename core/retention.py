"""Retention: delete expired CommitLog segments and the ConsumeQueue files that
point only into them (RocketMQ's CleanCommitLogService / CleanConsumeQueueService).

When it runs — at an hour listed in ``deleteWhen``, or at any hour once the disk
holding the store is fuller than ``diskMaxUsedSpaceRatio`` percent — it deletes,
oldest first, segments whose last write is older than ``fileReservedTime``
hours; above ``diskSpaceCleanForciblyRatio`` percent it deletes the oldest
segments even if they have not expired. It never deletes the segment holding
the write position or any later one, and deletes at most ``deleteFileBatchMax``
per pass.

Order, so that no reader is handed a deleted position: first publish the new
``cl_min_offset`` and each queue's new ``min_offset``, then delete files.
Readers check ``cl_min_offset`` (``MESSAGE_WAS_REMOVING``); a process that
still maps a deleted segment keeps a valid mapping until it drops it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .layout import offset_to_file_name
from .store import MessageStore

HOUR_MS = 3600 * 1000


@dataclass
class CleanReport:
    ran: bool = False
    reason: str = ""
    segments_deleted: list[str] = field(default_factory=list)
    cq_files_deleted: int = 0
    cl_min_offset: int = 0


def clean_expired(store: MessageStore, now_ms: int | None = None, *, manual: bool = False,
                  disk_ratio: float | None = None) -> CleanReport:
    """One retention pass. ``manual`` runs it whatever the hour (admin's
    deleteExpiredCommitLog); ``disk_ratio`` overrides the measured disk use
    (0..1) for tests."""
    cfg = store.config
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    ratio = store.files.disk_usage_ratio(store.root) if disk_ratio is None else disk_ratio
    hour = time.localtime(now_ms / 1000).tm_hour
    rep = CleanReport(cl_min_offset=store.state.get("cl_min_offset"))
    forcibly = ratio * 100 > cfg.diskSpaceCleanForciblyRatio
    if manual:
        rep.reason = "manual"
    elif hour in cfg.delete_hours():
        rep.reason = f"deleteWhen hour {hour:02d}"
    elif ratio * 100 > cfg.diskMaxUsedSpaceRatio:
        rep.reason = f"disk {ratio:.0%} used > diskMaxUsedSpaceRatio {cfg.diskMaxUsedSpaceRatio}%"
    else:
        return rep
    rep.ran = True
    cl = store.cl
    st = store.state
    writing = cl.segment_start(st.write_pos)
    reserved_ms = cfg.fileReservedTime * HOUR_MS
    doomed = []
    for s in cl.list_segments():
        if s >= writing or len(doomed) >= cfg.deleteFileBatchMax:
            break
        expired = cl.files.mtime_ms(cl.path(s)) + reserved_ms <= now_ms
        if not (expired or forcibly):
            break  # segments are in write order: later ones are younger
        doomed.append(s)
    if not doomed:
        return rep
    new_min = doomed[-1] + cl.segment_bytes
    st.set("cl_min_offset", new_min)
    rep.cl_min_offset = new_min
    new_mins = []
    for slot, topic, qid in st.iter_queues():
        mx = int(st.queue_next[slot])
        mn = store.cqs.min_offset_from(topic, qid, int(st.queue_min[slot]), mx, new_min)
        st.queue_min[slot] = mn
        new_mins.append((topic, qid, mn))
    # Segments first: a crash in between leaves ConsumeQueue units pointing
    # below the CommitLog, which recovery drops; the other order would leave
    # a queue without its first file, which recovery must rebuild.
    for s in doomed:
        cl.delete_segment(s)
        rep.segments_deleted.append(offset_to_file_name(s))
    for topic, qid, mn in new_mins:
        rep.cq_files_deleted += store.cqs.delete_files_below(topic, qid, mn)
    return rep
