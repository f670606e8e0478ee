"""Retention: delete expired CommitLog segments and the ConsumeQueue files that
point only into them (RocketMQ's CleanCommitLogService / CleanConsumeQueueService).

When it runs — at an hour listed in ``deleteWhen``, or at any hour once the disk
holding the store is fuller than ``diskMaxUsedSpaceRatio`` percent — it deletes,
oldest first, segments whose last write is older than ``fileReservedTime``
hours; above ``diskSpaceCleanForciblyRatio`` percent it deletes the oldest
segments even if they have not expired. It never deletes the segment holding
the write position or any later one, and deletes at most ``deleteFileBatchMax``
per pass.

Forced deletion (an unexpired segment, disk above
``diskSpaceCleanForciblyRatio``) stops before the first segment holding a
message that a group with a consumer offset (``config/consumerOffset.json``,
or the broker's live table) has not consumed, unless
``cleanFileForciblyEnable`` is true (RocketMQ's default; shmq's is false).
Every pass that deletes messages a group had not consumed — forced, or
expired after ``fileReservedTime`` — says per group and queue how many
(``CleanReport.lost``); the caller logs it.

Disk full (``disk_full_ratio``): above ``diskSpaceWarningLevelRatio`` percent
the flusher publishes ``disk_full`` in the shared state and sends are refused
with SERVICE_NOT_AVAILABLE (RocketMQ's RunningFlags DISK_FULL).

``clean_consume_queues`` (admin's cleanExpiredCQ, RocketMQ's
cleanExpiredConsumerQueue) moves each queue's first offset past the units
that point below ``cl_min_offset`` and deletes the ConsumeQueue files wholly
below it: what a pass does after deleting segments, so it finds work only
where a pass was cut short or a queue's file outlived its segments.

Order, so that no reader is handed a deleted position: first publish the new
``cl_min_offset`` and each queue's new ``min_offset``, then delete files.
Readers check ``cl_min_offset`` (``MESSAGE_WAS_REMOVING``); a process that
still maps a deleted segment keeps a valid mapping until it drops it.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .checkpoint import ConfigFileError, load_table
from .layout import offset_to_file_name
from .store import MessageStore

# (topic, queueId) → {group: committed queue offset}
ConsumerOffsets = Mapping[tuple[str, int], Mapping[str, int]]

HOUR_MS = 3600 * 1000


@dataclass
class CleanReport:
    ran: bool = False
    reason: str = ""
    segments_deleted: list[str] = field(default_factory=list)
    cq_files_deleted: int = 0
    cl_min_offset: int = 0
    forced: bool = False          # an unexpired segment was deleted
    # group → {(topic, queueId): messages deleted that the group had not consumed}
    lost: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)
    # unexpired segments forced cleanup wanted but kept (cleanFileForciblyEnable
    # is false), and the groups whose unconsumed messages they hold
    held_back: list[str] = field(default_factory=list)
    held_for: list[str] = field(default_factory=list)


def disk_full_ratio(store: MessageStore, ratio: float) -> int:
    """What the flusher publishes as ``disk_full``: 0 while ``ratio`` (the
    used fraction of the disk) is at most diskSpaceWarningLevelRatio percent,
    else the ratio in 1/10000 (at least 1)."""
    if ratio * 100 <= store.config.diskSpaceWarningLevelRatio:
        return 0
    return max(1, round(ratio * 10_000))


def publish_disk_full(store: MessageStore, ratio: float) -> str | None:
    """Set the shared ``disk_full`` from ``ratio`` (the disk's used fraction);
    returns the line to log when it changed (refused from now on, or
    accepted again), else None."""
    st, pct = store.state, store.config.diskSpaceWarningLevelRatio
    full = disk_full_ratio(store, ratio)
    was = st.get("disk_full")
    st.set("disk_full", full)
    if full and not was:
        return (f"disk under {store.root} is {ratio * 100:.1f}% used > diskSpaceWarningLevelRatio "
                f"{pct}%: sends are refused (SERVICE_NOT_AVAILABLE) until it is below; pulls go on")
    if was and not full:
        return (f"disk under {store.root} is {ratio * 100:.1f}% used, at most "
                f"diskSpaceWarningLevelRatio {pct}%: sends are accepted again")
    return None


def disk_full_remark(ratio: float) -> str:
    """The remark of a send refused while the disk is full: RocketMQ's
    (SendMessageProcessor, SERVICE_NOT_AVAILABLE) with its diskUtil() — one
    store root here, so CL, CQ and INDEX are the same disk."""
    util = f"CL: {ratio:5.2f} CQ: {ratio:5.2f} INDEX: {ratio:5.2f}"
    return ("service not available now. It may be caused by one of the following reasons: "
            f"the broker's disk is full [{util}], messages are put to the slave, message store "
            "has been shut down, etc.")


def offsets_from_file(store: MessageStore) -> ConsumerOffsets | None:
    """The consumer offsets the broker last saved (``config/consumerOffset.json``),
    or None if the file cannot be read (then nothing counts as consumed)."""
    try:
        table = load_table(store.files, store.root, "consumerOffset.json").get("offsetTable", {})
    except (ConfigFileError, OSError):
        return None
    out: dict[tuple[str, int], dict[str, int]] = {}
    for tg, queues in table.items():
        topic, _, group = tg.partition("@")
        for qid, off in queues.items():
            out.setdefault((topic, int(qid)), {})[group] = int(off)
    return out


def _first_unconsumed_phy(store: MessageStore, offsets: ConsumerOffsets | None,
                          ) -> tuple[int, list[str]]:
    """The lowest CommitLog offset of a message some group has not consumed
    (``write_pos`` if none), and those groups with the message's queue."""
    st = store.state
    if offsets is None:
        return st.get("cl_min_offset"), ["(consumer offsets unreadable)"]
    limit, who = st.write_pos, {}
    for (topic, qid), groups in offsets.items():
        slot = st.queue_slot(topic, qid)
        if slot < 0:
            continue
        mn, mx = int(st.queue_min[slot]), int(st.queue_next[slot])
        for group, committed in groups.items():
            first = max(committed, mn)
            if first >= mx:
                continue
            unit = store.cqs.unit(topic, qid, first)
            phy = unit[0] if unit is not None else st.get("cl_min_offset")
            if phy < limit:
                limit = phy
            who.setdefault(phy, []).append(f"{group} ({topic}:{qid} from offset {first})")
    return limit, [g for phy in sorted(who) for g in who[phy]]


def clean_expired(store: MessageStore, now_ms: int | None = None, *, manual: bool = False,
                  disk_ratio: float | None = None,
                  consumer_offsets: Callable[[], ConsumerOffsets | None] | None = None,
                  ) -> CleanReport:
    """One retention pass. ``manual`` runs it whatever the hour (admin's
    deleteExpiredCommitLog); ``disk_ratio`` is the disk use (0..1), measured
    here if not given; ``consumer_offsets`` returns the groups' committed
    offsets (default: ``offsets_from_file``), called only when something
    is to be deleted."""
    cfg = store.config
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    ratio = store.disk_usage_ratio() if disk_ratio is None else disk_ratio
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
    doomed, unexpired = [], 0
    for s in cl.list_segments():
        if s >= writing or len(doomed) >= cfg.deleteFileBatchMax:
            break
        expired = cl.files.mtime_ms(cl.path(s)) + reserved_ms <= now_ms
        if not (expired or forcibly):
            break  # segments are in write order: later ones are younger
        if not expired and not unexpired:
            unexpired = len(doomed) + 1     # 1 + index of the first forced one
        doomed.append(s)
    if not doomed:
        return rep
    offsets = (consumer_offsets or (lambda: offsets_from_file(store)))()
    if unexpired and not cfg.cleanFileForciblyEnable:
        limit, groups = _first_unconsumed_phy(store, offsets)
        keep_from = unexpired - 1
        while keep_from < len(doomed) and doomed[keep_from] + cl.segment_bytes <= limit:
            keep_from += 1
        if keep_from < len(doomed):
            rep.held_back = [offset_to_file_name(s) for s in doomed[keep_from:]]
            rep.held_for = groups
            del doomed[keep_from:]
        if not doomed:
            return rep
    rep.forced = bool(unexpired) and len(doomed) >= unexpired
    new_min = doomed[-1] + cl.segment_bytes
    st.set("cl_min_offset", new_min)
    rep.cl_min_offset = new_min
    new_mins = []
    for slot, topic, qid in st.iter_queues():
        mx = int(st.queue_next[slot])
        old = int(st.queue_min[slot])
        mn = store.cqs.min_offset_from(topic, qid, old, mx, new_min)
        st.queue_min[slot] = mn
        new_mins.append((topic, qid, mn))
        for group, committed in ((offsets or {}).get((topic, qid)) or {}).items():
            n = mn - max(committed, old)
            if n > 0:
                rep.lost.setdefault(group, {})[(topic, qid)] = n
    # Segments first: a crash in between leaves ConsumeQueue units pointing
    # below the CommitLog, which recovery drops; the other order would leave
    # a queue without its first file, which recovery must rebuild.
    for s in doomed:
        cl.delete_segment(s)
        rep.segments_deleted.append(offset_to_file_name(s))
    for topic, qid, mn in new_mins:
        rep.cq_files_deleted += store.cqs.delete_files_below(topic, qid, mn)
    return rep


def clean_consume_queues(store: MessageStore) -> int:
    """Each queue's ``min_offset`` past its units below ``cl_min_offset``
    (published first), then its files wholly below deleted; how many files."""
    st = store.state
    cl_min = st.get("cl_min_offset")
    n = 0
    for slot, topic, qid in st.iter_queues():
        old = int(st.queue_min[slot])
        mn = store.cqs.min_offset_from(topic, qid, old, int(st.queue_next[slot]), cl_min)
        if mn > old:
            st.queue_min[slot] = mn
        n += store.cqs.delete_files_below(topic, qid, max(mn, old))
    return n
